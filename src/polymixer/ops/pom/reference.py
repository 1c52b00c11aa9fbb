"""PoM's float64 oracle — :func:`reference_pom`, the formula literally — and the ``reference`` backend that runs a
call on it with the visibility matrix of the call's mode. O(M·N) and float64: for tests and for checking other
backends, never chosen automatically."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from ..call import Call
from ..reference import (float64_inputs, gate_of, no_stream, oracle_view, own_frame, polynomial, rotated_pairs,
                         shift_validity, shifted, visible_mean)
from .call import PomWeights

__all__ = ["reference_pom", "supports", "forward"]


def reference_pom(x: Tensor, weights: PomWeights, context: Optional[Tensor] = None, *, vis: Optional[Tensor] = None,
                  has_prev: Optional[Tensor] = None, **modes: Any) -> Tensor:
    """y_i = W_o (s_i ⊙ H_i), H_i = Σ_j vis_ij R(p_j − p_i) poly(act(h_j)) [/ Σ_j vis_ij], all in float64, with
    h_j = W_h c_j, or with a token shift (``shift_weight`` (W, D)) h_j = Σ_t shift_t ⊙ W_h c_{j−t}; with
    ``rope_convention="reference"`` (PoMRoPE) y_i = W_o (R_{p_i} s_i ⊙ Σ_j vis_ij R_{p_j} poly(act(h_j)) [/ …]).

    ``vis`` (B, M, N) bool: which context tokens each query sees (:func:`polymixer.ops.reference.visibility`; None:
    all); ``has_prev``: which earlier tokens the shift reads (:func:`polymixer.ops.reference.shifted`); ``modes``:
    activation, gate, reduction, rope, rope_base, rope_convention, positions, context_positions."""
    m, x, c, visf = float64_inputs("reference_pom", modes, x, context, vis)
    D = weights.coeff.shape[0]
    W = weights.in_weight.to(torch.float64)
    poly = polynomial(shifted(c @ W[:D].T, weights.shift_weight, has_prev), weights.coeff, m.activation)
    s = gate_of(x, W[D:], weights.gate_bias, m.gate, W.shape[0] - D)  # (B, M, Ds)
    if m.rope is None:
        H = torch.einsum("bmn,bnd->bmd", visf, poly)
    elif m.rope_convention == "relative":
        rot = rotated_pairs(poly, m.rope, m.rope_base, m.positions, m.context_positions)  # (B, M, N, D)
        H = (visf.unsqueeze(-1) * rot).sum(2)
    else:
        cpos = m.positions if m.context_positions is None else m.context_positions
        H = torch.einsum("bmn,bnd->bmd", visf, own_frame(poly, m.rope, m.rope_base, cpos, D))
        s = own_frame(s, m.rope, m.rope_base, m.positions, D)
    if m.reduction == "mean":
        H = visible_mean(H, visf)
    y = (s.repeat_interleave(D // s.shape[-1], dim=-1) * H) @ weights.out_weight.to(torch.float64).T
    if weights.out_bias is not None:
        y = y + weights.out_bias.to(torch.float64)
    return y


supports = no_stream


def forward(call: Call) -> Tensor:
    """Run a validated call on the oracle, in float64, cast back."""
    vis, pos, cpos = oracle_view(call)
    shift = call.weights.shift_weight
    has_prev = None if shift is None else shift_validity(call.B, call.N, call.key_mask, call.cu_k,
                                                         lags=max(shift.shape[0] - 1, 1)).to(call.x.device)
    y = reference_pom(call.x, call.weights, call.context, vis=vis, has_prev=has_prev, activation=call.activation,
                      gate=call.gate, reduction=call.reduction, rope=call.rope, rope_base=call.rope_base,
                      rope_convention=call.rope_convention, positions=pos, context_positions=cpos)
    return y.to(call.x.dtype)
