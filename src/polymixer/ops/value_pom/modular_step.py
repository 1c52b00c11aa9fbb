"""The ``torch`` backend of the streaming value-carrying PoM step: a chunk (B, T, d) after the (B, H, D_h, dv_h) state
of everything before it, mixed by the torch form's chunked mixing from that state (see
:mod:`polymixer.ops.value_pom.modular`)."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from torch import Tensor

from .features import heads_view, positions_or_default, rotate_heads, value_features, value_output
from .modular import value_mix

__all__ = ["supports", "forward"]


def supports(call: Any) -> Optional[str]:
    """Every call."""
    return None


def forward(call: Any) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Run a validated :class:`polymixer.ops.value_pom.call.StepCall`: (y, state, count, offset, prev) after the
    chunk. ``mixing.causal`` False makes the chunk one block (block-causal streaming)."""
    x, m, H = call.x, call.mixing, call.heads
    in_weight, gate_bias, coeff, coeff_q, shift_weight, norm_weight, out_weight, out_bias = call.weights
    B, T, _ = x.shape
    acc = call.state.dtype
    phi, v, psi, zs, last = value_features(x, x, in_weight, coeff, coeff_q, call.dv, shift_weight, m.mask,
                                           call.prev, True, m.activation)
    phi, v, psi = phi.to(acc), v.to(acc), psi.to(acc)
    w = m.mask.to(acc) if m.mask is not None else phi.new_ones(B, T)
    k, q, vh = heads_view(phi * w.unsqueeze(-1), H), heads_view(psi, H), heads_view(v, H)
    if m.rope is not None:
        pos = positions_or_default(m.positions, B, T, m.two_d, "positions", x.device, call.offset)
        k, q = rotate_heads(k, pos, m.rope_base, m.two_d), rotate_heads(q, pos, m.rope_base, m.two_d)
    o, cnt, new_state, new_count = value_mix(q, k, vh, w, causal=True, block_size=None if m.causal else T,
                                             chunk=call.chunk, state=call.state, count=call.count)
    y = value_output(o, cnt, zs, gate_bias, norm_weight, out_weight, out_bias, m.reduction, m.gate)
    return y, new_state, new_count, call.offset + T, last.to(call.prev.dtype)
