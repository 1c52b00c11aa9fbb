"""The ``reference`` backend of the value-carrying PoM: the float64 oracle
(:func:`polymixer.ops.reference.reference_value_pom`) with the visibility matrix and token-shift validity of the
call's mode. O(M·N): for tests and checks, never chosen automatically."""

from __future__ import annotations

from typing import Any, Optional

from torch import Tensor

from ..common import packed_local_positions
from ..reference import reference_value_pom, shift_validity, visibility

__all__ = ["supports", "forward"]


def supports(call: Any) -> Optional[str]:
    """Every call."""
    return None


def forward(call: Any) -> Tensor:
    """Run a validated :class:`polymixer.ops.value_pom.call.ValueCall` on the oracle, in float64, cast back."""
    x, m = call.x, call.mixing
    vis = visibility(call.B, call.M, call.N, causal=m.causal, block_size=m.block_size, key_mask=call.key_mask,
                     mask=call.mask, cu_seqlens_q=call.cu_q, cu_seqlens_k=call.cu_k).to(x.device)
    shift = call.shift_weight
    lags = max(shift.shape[0] - 1, 1) if shift is not None else 1
    has_prev = shift_validity(call.B, call.N, call.key_mask, call.cu_k, lags=lags).to(x.device)
    pos, cpos = m.positions, m.context_positions
    if m.rope is not None:
        if cpos is None and call.self_mix:
            cpos = pos
        if cpos is None:
            cpos = packed_local_positions(call.cu_k, call.N, x.device, m.two_d, "context_positions")
        if pos is None:
            cu = call.cu_q if call.cu_q is not None else call.cu_k
            pos = packed_local_positions(cu, call.M, x.device, m.two_d, "positions")
    y = reference_value_pom(x, call.context, *call.weights(), vis, heads=call.heads, has_prev=has_prev,
                            activation=m.activation, gate=m.gate, reduction=m.reduction, rope=m.rope,
                            rope_base=m.rope_base, positions=pos, context_positions=cpos)
    y = y.to(x.dtype)
    return y.squeeze(0) if call.squeeze else y
