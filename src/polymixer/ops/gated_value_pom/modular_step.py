"""The ``torch`` backend of the gated value PoM's streaming step: a chunk (B, T, d) after the decayed state of
everything before it, by the torch form's chunked scan (:func:`polymixer.ops.gated_value_pom.modular.gated_scan`).
O(1) state per sequence; causal only (checked by the front end)."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from torch import Tensor

from ..value_pom.features import decay_logs, heads_view, positions_or_default, readout, rotate_heads, value_features
from .modular import gated_scan

__all__ = ["supports", "forward"]


def supports(call: Any) -> Optional[str]:
    """Every call."""
    return None


def forward(call: Any) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Run a validated gated :class:`polymixer.ops.value_pom.call.StepCall`: (y, state, count, offset, prev)."""
    x, m, H = call.x, call.mixing, call.heads
    in_weight, gate_bias, coeff, coeff_q, shift_weight, norm_weight, out_weight, out_bias = call.weights
    B, T, _ = x.shape
    acc = call.state.dtype
    mask = m.mask
    phi, v, psi, zs, last = value_features(x, x, in_weight, coeff, coeff_q, call.dv, shift_weight, mask, call.prev,
                                           True, m.activation)
    phi, v, psi = phi.to(acc), v.to(acc), psi.to(acc)
    k = heads_view(phi if mask is None else phi * mask.unsqueeze(-1).to(acc), H)
    q, vh = heads_view(psi, H), heads_view(v, H)
    if m.rope is not None:
        pos = positions_or_default(m.positions, B, T, m.two_d, "positions", x.device, call.offset)
        k, q = rotate_heads(k, pos, m.rope_base, m.two_d), rotate_heads(q, pos, m.rope_base, m.two_d)
    g = decay_logs(x, call.decay_weight, call.decay_bias, mask).to(acc)
    o, new_state = gated_scan(q, k, vh, g, None, call.chunk, call.state)
    y = readout(o, zs, gate_bias, norm_weight, out_weight, out_bias, m.gate)
    seen = T if mask is None else mask.to(call.count.dtype).sum(1)
    return y, new_state, call.count + seen, call.offset + T, last.to(call.prev.dtype)
