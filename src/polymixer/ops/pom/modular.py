"""The ``torch`` backend of PoM: the modular, device-agnostic form — every mode, every device, ``torch.compile``, and
the streams (a call with a state).

One matrix product for W_h and W_s when self-mixing, per-token polynomial features (Horner, fp32 accumulation, a
backward that recomputes), rotary rotation of the features, aggregation over the visible tokens of the mode (a
chunked prefix sum for causal modes; O(N·D) except for an explicit (B, M, N) mask), the gated selection and W_o.
A stream's chunk adds its features to the state's running (sum, count): O(D) state, O(1) per decoded token.
"""

from __future__ import annotations

from typing import Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ..call import Call, PoMState, every_call as supports  # the torch form takes every call
from ..features import (aggregate, cumsum, packed_starts, poly_features, rotate_features, safe_inverse, select,
                        token_shift)

__all__ = ["supports", "forward"]


def forward(call: Call) -> Union[Tensor, Tuple[Tensor, PoMState]]:
    """The PoM of a validated call: y, or (y, the state after the chunk) of a stream."""
    if call.state is not None:
        return _stream(call)
    x, D, w, m = call.x, call.D, call.weights, call.mixing
    if call.self_mix:  # ONE matrix product for W_h and W_s
        z = F.linear(x, w.in_weight)
        zh, zs = z[..., :D], z[..., D:]
    else:
        zs = F.linear(x, w.in_weight[D:])
        zh = F.linear(call.context, w.in_weight[:D])
    if w.shift_weight is not None:  # along the context tokens, restarting at each packed sequence's first
        starts = None if call.cu_k is None else packed_starts(call.cu_k, call.N, zh.device)[0].unsqueeze(0)
        zh = token_shift(zh, w.shift_weight, call.key_mask, starts=starts)[0]
    positions, context_positions = call.rope_positions() if call.rope is not None else (None, None)
    # (B, N, D) features in the accumulation dtype, turned by their positions (rotary)
    p = rotate_features(poly_features(zh, w.coeff, call.activation), context_positions, m)
    h = aggregate(p, num_queries=call.M, key_mask=call.key_mask, mask=call.mask, causal=call.causal,
                  block_size=call.block_size, cu_seqlens=call.cu_k, cu_seqlens_q=call.cu_q, reduction=call.reduction)
    return F.linear(select(zs, w.gate_bias, h, m, positions), w.out_weight, w.out_bias)


def _stream(call: Call) -> Tuple[Tensor, PoMState]:
    """The next chunk (B, T, d) of a stream after ``call.state``: token t sees the state's past and — causal — the
    chunk's tokens ≤ t, or — ``causal=False`` — the whole chunk (one block of block-causal mode); a masked token
    adds nothing; a token shift continues from the state's last projections. Returns (y, the state after the chunk)."""
    x, D, w, state = call.x, call.D, call.weights, call.state
    B, T = call.B, call.N
    z = F.linear(x, w.in_weight)
    zh, zs = z[..., :D], z[..., D:]
    last = state.prev
    if w.shift_weight is not None:
        zh, last = token_shift(zh, w.shift_weight, call.key_mask, state.prev)
        last = last.to(state.prev.dtype)
    acc = state.sum.dtype
    positions = None
    if call.rope is not None:  # the stream index by default
        positions, _ = call.rope_positions(state.offset.unsqueeze(1) + torch.arange(T, device=x.device))
    p = rotate_features(poly_features(zh, w.coeff, call.activation).to(acc), positions, call.mixing)
    wt = torch.ones(B, T, dtype=acc, device=x.device) if call.key_mask is None else call.key_mask.to(acc)
    if call.key_mask is not None:
        p = p * wt.unsqueeze(-1)
    s, cnt = (cumsum(p), cumsum(wt)) if call.causal else (p.sum(1, keepdim=True), wt.sum(1, keepdim=True))
    s, cnt = state.sum.unsqueeze(1) + s, state.count.unsqueeze(1) + cnt
    h = s * safe_inverse(cnt).unsqueeze(-1) if call.reduction == "mean" else s
    y = F.linear(select(zs, w.gate_bias, h, call.mixing, positions), w.out_weight, w.out_bias)
    return y, PoMState(s[:, -1], cnt[:, -1], state.offset + T, last)
