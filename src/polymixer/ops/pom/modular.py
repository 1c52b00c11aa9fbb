"""The ``torch`` backend of PoM: the modular, device-agnostic form — every mode, every device, ``torch.compile``.

One matrix product for W_h and W_s when self-mixing, per-token polynomial features (Horner, fp32 accumulation, a
backward that recomputes), rotary rotation of the features, aggregation over the visible tokens of the mode (a
chunked prefix sum for causal modes; O(N·D) except for an explicit (B, M, N) mask), the gated selection and W_o.
"""

from __future__ import annotations

from typing import Optional

import torch.nn.functional as F
from torch import Tensor

from ..common import check_positions, packed_local_positions, rope_angles, rotate
from ..features import aggregate, gate_mix, poly_features

__all__ = ["supports", "forward"]


def supports(call: object) -> Optional[str]:
    """Every call."""
    return None


def forward(call) -> Tensor:  # call: polymixer.ops.pom.PomCall
    x, D = call.x, call.D
    B, M, N = call.B, call.M, call.N
    two_d = call.rope == "2d"
    in_weight = call.in_weight
    if call.self_mix:  # ONE matrix product for W_h and W_s
        z = F.linear(x, in_weight)
        zh, zs = z[..., :D], z[..., D:]
    else:
        zs = F.linear(x, in_weight[D:])
        zh = F.linear(call.context, in_weight[:D])

    p = poly_features(zh, call.coeff, call.activation)  # (B, N, D), accumulation dtype

    positions = call.positions
    if call.rope is not None:
        context_positions = call.context_positions
        if context_positions is None and call.self_mix and positions is not None:
            context_positions = positions
        kname = "positions" if call.self_mix else "context_positions"
        if context_positions is None:
            context_positions = packed_local_positions(call.cu_k, N, x.device, two_d, kname)
        check_positions(context_positions, B, N, two_d, kname)
        if positions is None:
            cu = call.cu_q if call.cu_q is not None else call.cu_k
            positions = packed_local_positions(cu, M, x.device, two_d, "positions")
        check_positions(positions, B, M, two_d, "positions")
        cos_k, sin_k = rope_angles(context_positions, D, call.rope_base, two_d, p.dtype)
        p = rotate(p, cos_k, sin_k)

    h = aggregate(p, num_queries=M, key_mask=call.key_mask, mask=call.mask, causal=call.causal,
                  block_size=call.block_size, cu_seqlens=call.cu_k, cu_seqlens_q=call.cu_q, reduction=call.reduction)
    if call.rope is not None:
        cos_q, sin_q = rope_angles(positions, D, call.rope_base, two_d, p.dtype)
        h = rotate(h.expand(B, M, D), cos_q, sin_q, inverse=True)

    g = gate_mix(zs, call.gate_bias, h, call.gate)
    return F.linear(g, call.out_weight, call.out_bias)
