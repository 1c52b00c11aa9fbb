"""The ``torch`` backend of the streaming PoM step: consume a chunk of tokens given the running (sum, count, offset)
of everything seen before — O(D) state per sequence, O(1) per decoded token."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common import (ROPE_BASE, ActivationLike, Mixing, check_bool_mask, check_positions, check_tokens, rope_angles,
                      rotate)
from ..features import cumsum, gate_mix, poly_features, safe_inverse

__all__ = ["supports", "forward", "step", "run"]


def supports(call: Any) -> Optional[str]:
    """Every call."""
    return None


def forward(call: Any) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Run a :class:`polymixer.ops.pom.PomStepCall`."""
    return run(call.x, call.state_sum, call.state_count, call.state_offset, call.weights, call.mixing)


def step(
    x: Tensor,
    state_sum: Tensor,
    state_count: Tensor,
    state_offset: Tensor,
    in_weight: Tensor,
    gate_bias: Tensor,
    coeff: Tensor,
    out_weight: Tensor,
    out_bias: Optional[Tensor] = None,
    *,
    causal: bool = True,
    mask: Optional[Tensor] = None,
    positions: Optional[Tensor] = None,
    activation: ActivationLike = "leaky_clamp",
    gate: ActivationLike = "hardsigmoid",
    reduction: str = "mean",
    rope: Optional[str] = None,
    rope_base: float = ROPE_BASE,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Streaming PoM: consume a chunk given the running (sum, count, offset) of everything seen before.

    Args:
        x: (B, T, d) chunk. ``causal=True``: token t of the chunk sees the past and chunk tokens ≤ t;
            ``causal=False``: every chunk token sees the whole chunk and the past (one block of block-causal mode).
        state_sum: (B, D) running (rotated) feature sum, fp32 or wider; state_count: (B,) visible tokens so far;
        state_offset: (B,) int64 stream index of the next token (its default rotary position).
        mask: (B, T) bool — False tokens add nothing (left padding of a batch of prompts).

    Returns:
        (y (B, T, d), new_sum, new_count, new_offset).
    """
    mixing = Mixing(causal=causal, mask=mask, positions=positions, activation=activation, gate=gate,
                    reduction=reduction, rope=rope, rope_base=float(rope_base))
    return run(x, state_sum, state_count, state_offset, (in_weight, gate_bias, coeff, out_weight, out_bias), mixing)


def run(x: Tensor, state_sum: Tensor, state_count: Tensor, state_offset: Tensor,
        weights: Tuple[Tensor, Tensor, Tensor, Tensor, Optional[Tensor]], mixing: Mixing
        ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`step` with the weights (in_weight, gate_bias, coeff, out_weight, out_bias) as one tuple and the mode
    as one :class:`~polymixer.ops.common.Mixing`."""
    in_weight, gate_bias, coeff, out_weight, out_bias = weights
    causal, mask, positions, rope = mixing.causal, mixing.mask, mixing.positions, mixing.rope
    activation, gate, reduction, rope_base = mixing.activation, mixing.gate, mixing.reduction, mixing.rope_base
    d = out_weight.shape[0]
    D = coeff.shape[0]
    check_tokens(x, d, "x")
    B, T, _ = x.shape
    if state_sum.shape != (B, D):
        raise ValueError(
            f"state holds batch {state_sum.shape[0]} × {state_sum.shape[-1]} features but x has batch {B} and the "
            f"mixer has D={D}; index or re-initialise the state"
        )
    if mask is not None:
        check_bool_mask(mask, [(B, T)], f"a chunk of batch {B} × {T} tokens")
    two_d = rope == "2d"

    z = F.linear(x, in_weight)
    zh, zs = z[..., :D], z[..., D:]
    acc = state_sum.dtype
    p = poly_features(zh, coeff, activation).to(acc)
    if rope is not None:
        if positions is None:
            if two_d:
                raise ValueError("2-D rotary streaming needs explicit positions of shape (B, T, 2) or (T, 2)")
            positions = state_offset.unsqueeze(1) + torch.arange(T, device=x.device)
        check_positions(positions, B, T, two_d, "positions")
        cos, sin = rope_angles(positions, D, rope_base, two_d, acc)
        p = rotate(p, cos, sin)
    if mask is not None:
        wt = mask.to(acc)
        p = p * wt.unsqueeze(-1)
    else:
        wt = torch.ones(B, T, dtype=acc, device=x.device)
    if causal:
        s = state_sum.unsqueeze(1) + cumsum(p)
        cnt = state_count.unsqueeze(1) + cumsum(wt)
    else:
        s = state_sum.unsqueeze(1) + p.sum(1, keepdim=True)
        cnt = state_count.unsqueeze(1) + wt.sum(1, keepdim=True)
    new_sum = s[:, -1]
    new_count = cnt[:, -1]
    h = s
    if reduction == "mean":
        h = s * safe_inverse(cnt).unsqueeze(-1)
    if rope is not None:
        h = rotate(h.expand(B, T, D), cos, sin, inverse=True)
    g = gate_mix(zs, gate_bias, h, gate)
    y = F.linear(g, out_weight, out_bias)
    return y, new_sum, new_count, state_offset + T
