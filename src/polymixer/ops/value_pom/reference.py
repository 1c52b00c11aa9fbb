"""The value-carrying PoM's float64 oracle — :func:`reference_value_pom`, the formula literally — and the
``reference`` backend that runs a call on it with the visibility matrix and token-shift validity of the call's mode.
O(M·N): for tests and checks, never chosen automatically."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from ..call import Call
from ..reference import (float64_inputs, gate_of, no_stream, oracle_view, polynomial, rotated_pairs, shift_validity,
                         shifted, visible_mean)
from .call import ValuePomWeights

__all__ = ["reference_value_pom", "supports", "forward"]


def reference_value_pom(x: Tensor, weights: ValuePomWeights, context: Optional[Tensor] = None, *,
                        vis: Optional[Tensor] = None, heads: int = 1, has_prev: Optional[Tensor] = None,
                        eps: float = 1e-6, **modes: Any) -> Tensor:
    """The value-carrying PoM, literally, in float64: per head h,
    o_i = Σ_j vis_ij (ψ_i · R(p_j − p_i) φ_j) v_j [/ Σ_j vis_ij], y_i = W_o (s_i ⊙ g ⊙ o_i / rms(o_i)).

    ``vis`` (B, M, N) bool: which context tokens each query sees (None: all); ``has_prev`` (B, N) or (B, N, W − 1):
    whether token j's shift (of width W, ``shift_weight`` (W, D + dv)) sees token j − 1, or each token j − t
    (:func:`~polymixer.ops.reference.shift_validity`); default: every j ≥ t.
    """
    m, x, c, visf = float64_inputs("reference_value_pom", modes, x, context, vis)
    coeff, shift_weight, out_weight = weights.coeff, weights.shift_weight, weights.out_weight
    D = coeff.shape[0]
    dv = out_weight.shape[1]
    W = weights.in_weight.to(torch.float64)
    B, N = c.shape[:2]
    zkv = shifted(c @ W[:D + dv].T, shift_weight, has_prev)
    phi = polynomial(zkv[..., :D], coeff, m.activation)
    v = zkv[..., D:]
    psi = polynomial(x @ W[D + dv:2 * D + dv].T, weights.coeff_q, m.activation)
    s = gate_of(x, W[2 * D + dv:], weights.gate_bias, m.gate, dv)
    M = x.shape[1]
    H, Dh, e = heads, D // heads, dv // heads
    out = torch.zeros(B, M, dv, dtype=torch.float64)
    for h in range(H):
        ph, qh, vh = phi[..., h * Dh:(h + 1) * Dh], psi[..., h * Dh:(h + 1) * Dh], v[..., h * e:(h + 1) * e]
        if m.rope is None:
            score = torch.einsum("bmd,bnd->bmn", qh, ph)
        else:
            rot = rotated_pairs(ph, m.rope, m.rope_base, m.positions, m.context_positions)  # R(p_j − p_i) φ_j
            score = torch.einsum("bmd,bmnd->bmn", qh, rot)
        o = torch.einsum("bmn,bne->bme", visf * score, vh)
        if m.reduction == "mean":
            o = visible_mean(o, visf)
        o = o / torch.sqrt((o**2).mean(-1, keepdim=True) + eps)
        out[..., h * e:(h + 1) * e] = o
    y = (s * out * weights.norm_weight.to(torch.float64)) @ out_weight.to(torch.float64).T
    if weights.out_bias is not None:
        y = y + weights.out_bias.to(torch.float64)
    return y


supports = no_stream


def forward(call: Call) -> Tensor:
    """Run a validated call on the oracle, in float64, cast back."""
    x, m = call.x, call.mixing
    vis, pos, cpos = oracle_view(call)
    shift = call.weights.shift_weight
    lags = max(shift.shape[0] - 1, 1) if shift is not None else 1
    has_prev = shift_validity(call.B, call.N, call.key_mask, call.cu_k, lags=lags).to(x.device)
    y = reference_value_pom(x, call.weights, call.context, vis=vis, heads=call.heads, has_prev=has_prev,
                            activation=m.activation, gate=m.gate, reduction=m.reduction, rope=m.rope,
                            rope_base=m.rope_base, positions=pos, context_positions=cpos)
    return y.to(x.dtype)
