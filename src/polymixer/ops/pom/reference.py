"""The ``reference`` backend of PoM: the float64 oracle (:func:`polymixer.ops.reference.reference_pom`) with the
visibility matrix of the call's mode. O(M·N) and float64: for tests and for checking other backends, never chosen
automatically."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from ..common import packed_local_positions
from ..reference import reference_pom, visibility

__all__ = ["supports", "forward"]


def supports(call: object) -> Optional[str]:
    """Every call."""
    return None


def forward(call) -> Tensor:  # call: polymixer.ops.pom.PomCall
    x = call.x
    vis = visibility(call.B, call.M, call.N, causal=call.causal, block_size=call.block_size, key_mask=call.key_mask,
                     mask=call.mask, cu_seqlens_q=call.cu_q, cu_seqlens_k=call.cu_k).to(x.device)
    positions, context_positions = call.positions, call.context_positions
    if call.rope is not None:
        two_d = call.rope == "2d"
        if context_positions is None and call.self_mix:
            context_positions = positions
        if context_positions is None:
            context_positions = packed_local_positions(call.cu_k, call.N, x.device, two_d, "context_positions")
        if positions is None:
            cu = call.cu_q if call.cu_q is not None else call.cu_k
            positions = packed_local_positions(cu, call.M, x.device, two_d, "positions")
    y = reference_pom(x, call.context, call.in_weight, call.gate_bias, call.coeff, call.out_weight, call.out_bias, vis,
                      activation=call.activation, gate=call.gate, reduction=call.reduction, rope=call.rope,
                      rope_base=call.rope_base, positions=positions, context_positions=context_positions)
    return y.to(x.dtype)
