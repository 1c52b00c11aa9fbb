"""The paper's formula, literally: the oracle every fast path is tested against.

Nothing here is fast. Visibility is an explicit boolean matrix ``M`` (B, M, N) built from the mode's definition,
powers are computed one by one, the aggregation is ``H_i = Σ_j M_ij poly(h_j) / Σ_j M_ij`` (or the plain sum),
and rotary positions rotate every (query, context) pair by the angle of their *relative* position — the property
the fast path must reproduce by rotating before and after aggregation. Everything runs in float64.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor

from .common import activation as activation_fn
from .common import REFERENCE_MODES, Mixing, gate_fn

__all__ = ["visibility", "reference_pom", "reference_value_pom", "shift_validity", "reference_attention"]


def visibility(
    batch: int,
    num_queries: int,
    num_keys: int,
    *,
    causal: bool = False,
    block_size: Optional[int] = None,
    key_mask: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k: Optional[Tensor] = None,
    window: Optional[int] = None,
) -> Tensor:
    """Explicit (B, M, N) visibility: True where query i may see context token j.

    causal: j ≤ i (top-left aligned). block_size K (with causal): j // K ≤ i // K. Packed: i and j in the same
    sequence, indices local to it. window W: causal j > i − W, bidirectional |i − j| < W.
    """
    qi = torch.arange(num_queries)
    kj = torch.arange(num_keys)
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        cq = (cu_seqlens_q if cu_seqlens_q is not None else cu_seqlens_k).tolist()
        ck = (cu_seqlens_k if cu_seqlens_k is not None else cu_seqlens_q).tolist()
        seg_q = torch.tensor([s for s in range(len(cq) - 1) for _ in range(cq[s], cq[s + 1])])
        seg_k = torch.tensor([s for s in range(len(ck) - 1) for _ in range(ck[s], ck[s + 1])])
        qi = qi - torch.tensor(cq)[seg_q]
        kj = kj - torch.tensor(ck)[seg_k]
        same = seg_q[:, None] == seg_k[None, :]
    else:
        same = torch.ones(num_queries, num_keys, dtype=torch.bool)
    vis = same.clone()
    if causal:
        if block_size is None:
            vis &= kj[None, :] <= qi[:, None]
        else:
            vis &= (kj[None, :] // block_size) <= (qi[:, None] // block_size)
    if window is not None:
        if causal:
            vis &= kj[None, :] > qi[:, None] - window
        else:
            vis &= (kj[None, :] - qi[:, None]).abs() < window
    vis = vis.unsqueeze(0).expand(batch, -1, -1).clone()
    if key_mask is not None:
        vis &= key_mask[:, None, :].cpu()
    if mask is not None:
        vis &= mask.cpu()
    return vis


def _rotation_angles(rel: Tensor, D: int, base: float, two_d: bool) -> Tensor:
    """Angle of every channel pair for relative positions rel (..., ) or (..., 2); returns (..., D/2)."""
    if two_d:
        q = D // 4
        inv = base ** (-torch.arange(q, dtype=torch.float64) / q)
        return torch.cat([rel[..., 0:1] * inv, rel[..., 1:2] * inv], dim=-1)
    half = D // 2
    inv = base ** (-torch.arange(half, dtype=torch.float64) / half)
    return rel.unsqueeze(-1) * inv


def _poly(z: Tensor, coeff: Tensor, activation: str) -> Tensor:
    """Σ_p α_p act(z)^p, one power at a time, in float64."""
    h = activation_fn(z.to(torch.float64), activation)
    return sum(coeff[:, p - 1].to(torch.float64) * h**p for p in range(1, coeff.shape[1] + 1))


def _gate(x: Tensor, weight: Tensor, bias: Tensor, gate: str, width: int) -> Tensor:
    """gate(W_s x + b), one scalar per head repeated over its channels when the gate is narrower than ``width``."""
    s = gate_fn(x @ weight.to(torch.float64).T + bias.to(torch.float64), gate)
    return s if s.shape[-1] == width else s.repeat_interleave(width // s.shape[-1], dim=-1)


def _rotated_pairs(feat: Tensor, rope: str, base: float, positions: Tensor,
                   context_positions: Optional[Tensor]) -> Tensor:
    """R(p_j − p_i) feat_j for every (query i, context token j): (B, M, N, C) from (B, N, C) context features."""
    f64 = torch.float64
    B, C = feat.shape[0], feat.shape[-1]
    two_d = rope == "2d"
    qp = positions.to(f64)
    kp = (positions if context_positions is None else context_positions).to(f64)
    if qp.dim() == (2 if two_d else 1):
        qp = qp.unsqueeze(0).expand(B, *qp.shape)
    if kp.dim() == (2 if two_d else 1):
        kp = kp.unsqueeze(0).expand(B, *kp.shape)
    ang = _rotation_angles(kp.unsqueeze(1) - qp.unsqueeze(2), C, base, two_d)  # (B, M, N, C/2)
    cos, sin = ang.cos(), ang.sin()
    half = C // 2
    p1, p2 = feat[..., :half].unsqueeze(1), feat[..., half:].unsqueeze(1)
    return torch.cat([p1 * cos - p2 * sin, p2 * cos + p1 * sin], dim=-1)


def _float64_inputs(op: str, modes: Dict[str, Any], x: Tensor, context: Optional[Tensor]
                    ) -> Tuple[Mixing, Tensor, Tensor]:
    """An oracle's modes (:data:`~polymixer.ops.common.REFERENCE_MODES`) and its tokens and context in float64."""
    x = x.to(torch.float64)
    return Mixing.of(op, modes, REFERENCE_MODES), x, x if context is None else context.to(torch.float64)


def reference_pom(x: Tensor, context: Optional[Tensor], in_weight: Tensor, gate_bias: Tensor, coeff: Tensor,
                  out_weight: Tensor, out_bias: Optional[Tensor], vis: Tensor, **modes: Any) -> Tensor:
    """y_i = W_o (s_i ⊙ H_i), H_i = Σ_j vis_ij R(p_j − p_i) poly(act(W_h c_j)) [/ Σ_j vis_ij], all in float64."""
    m, x, c = _float64_inputs("reference_pom", modes, x, context)
    D = coeff.shape[0]
    W = in_weight.to(torch.float64)
    poly = _poly(c @ W[:D].T, coeff, m.activation)
    s = _gate(x, W[D:], gate_bias, m.gate, D)
    visf = vis.to(torch.float64)
    if m.rope is None:
        H = torch.einsum("bmn,bnd->bmd", visf, poly)
    else:
        rot = _rotated_pairs(poly, m.rope, m.rope_base, m.positions, m.context_positions)  # (B, M, N, D)
        H = (visf.unsqueeze(-1) * rot).sum(2)
    if m.reduction == "mean":
        count = visf.sum(-1, keepdim=True)
        H = torch.where(count > 0, H / count.clamp_min(1.0), torch.zeros_like(H))
    y = (s * H) @ out_weight.to(torch.float64).T
    if out_bias is not None:
        y = y + out_bias.to(torch.float64)
    return y


def shift_validity(batch: int, num_tokens: int, key_mask: Optional[Tensor] = None,
                   cu_seqlens: Optional[Tensor] = None, lags: Optional[int] = None) -> Tensor:
    """Whether token j's token shift reads token j − t: j − t ≥ 0, token j − t takes part, and both are in the same
    sequence (no sequence starts in (j − t, j]). (B, N) bool for t = 1; with ``lags`` = L, (B, N, L) for t = 1 … L
    (a shift of width L + 1)."""
    seq = torch.zeros(num_tokens, dtype=torch.long)  # each token's sequence index
    if cu_seqlens is not None:
        for start in cu_seqlens[1:-1].long().tolist():
            if start < num_tokens:
                seq[start:] += 1
    keep = torch.ones(batch, num_tokens, dtype=torch.bool) if key_mask is None else key_mask.cpu()
    out = torch.zeros(batch, num_tokens, lags or 1, dtype=torch.bool)
    for t in range(1, (lags or 1) + 1):
        for j in range(t, num_tokens):
            out[:, j, t - 1] = keep[:, j - t] & (seq[j - t] == seq[j])
    return out if lags is not None else out[..., 0]


def reference_value_pom(x: Tensor, context: Optional[Tensor], in_weight: Tensor, gate_bias: Tensor, coeff: Tensor,
                        coeff_q: Tensor, shift_weight: Optional[Tensor], norm_weight: Tensor, out_weight: Tensor,
                        out_bias: Optional[Tensor], vis: Tensor, *, heads: int = 1, has_prev: Optional[Tensor] = None,
                        eps: float = 1e-6, **modes: Any) -> Tensor:
    """The value-carrying PoM, literally, in float64: per head h,
    o_i = Σ_j vis_ij (ψ_i · R(p_j − p_i) φ_j) v_j [/ Σ_j vis_ij], y_i = W_o (s_i ⊙ g ⊙ o_i / rms(o_i)).

    ``has_prev`` (B, N) or (B, N, W − 1): whether token j's shift (of width W, ``shift_weight`` (W, D + dv)) sees
    token j − 1, or each token j − t (:func:`shift_validity`); default: every j ≥ t.
    """
    m, x, c = _float64_inputs("reference_value_pom", modes, x, context)
    D = coeff.shape[0]
    dv = out_weight.shape[1]
    W = in_weight.to(torch.float64)
    B, N = c.shape[:2]
    zkv = c @ W[:D + dv].T
    if shift_weight is not None:
        taps = shift_weight.to(torch.float64)
        lags = taps.shape[0] - 1
        if has_prev is None:
            has_prev = shift_validity(B, N, lags=lags)
        if has_prev.dim() == 2:
            has_prev = has_prev.unsqueeze(-1)
        if has_prev.shape[-1] < lags:
            raise ValueError(f"a token shift of width {lags + 1} needs has_prev (B, N, {lags})")
        shifted = taps[0] * zkv
        for t in range(1, lags + 1):
            before = torch.zeros_like(zkv)
            for j in range(t, N):
                before[:, j] = zkv[:, j - t] * has_prev[:, j, t - 1, None].to(torch.float64)
            shifted = shifted + taps[t] * before
        zkv = shifted
    phi = _poly(zkv[..., :D], coeff, m.activation)
    v = zkv[..., D:]
    psi = _poly(x @ W[D + dv:2 * D + dv].T, coeff_q, m.activation)
    s = _gate(x, W[2 * D + dv:], gate_bias, m.gate, dv)
    visf = vis.to(torch.float64)
    M = x.shape[1]
    H, Dh, e = heads, D // heads, dv // heads
    out = torch.zeros(B, M, dv, dtype=torch.float64)
    for h in range(H):
        ph, qh, vh = phi[..., h * Dh:(h + 1) * Dh], psi[..., h * Dh:(h + 1) * Dh], v[..., h * e:(h + 1) * e]
        if m.rope is None:
            score = torch.einsum("bmd,bnd->bmn", qh, ph)
        else:
            rot = _rotated_pairs(ph, m.rope, m.rope_base, m.positions, m.context_positions)  # R(p_j − p_i) φ_j
            score = torch.einsum("bmd,bmnd->bmn", qh, rot)
        o = torch.einsum("bmn,bne->bme", visf * score, vh)
        if m.reduction == "mean":
            count = visf.sum(-1, keepdim=True)
            o = torch.where(count > 0, o / count.clamp_min(1.0), torch.zeros_like(o))
        o = o / torch.sqrt((o**2).mean(-1, keepdim=True) + eps)
        out[..., h * e:(h + 1) * e] = o
    y = (s * out * norm_weight.to(torch.float64)) @ out_weight.to(torch.float64).T
    if out_bias is not None:
        y = y + out_bias.to(torch.float64)
    return y


def reference_attention(q: Tensor, k: Tensor, v: Tensor, vis: Tensor) -> Tensor:
    """softmax(q kᵀ/√d + mask) v per head in float64; a query that sees nothing gets 0. q: (B, H, M, dh)."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    vis4 = vis.unsqueeze(1)
    scores = scores.masked_fill(~vis4, float("-inf"))
    any_vis = vis4.any(-1, keepdim=True)
    probs = torch.softmax(torch.where(any_vis, scores, torch.zeros_like(scores)), dim=-1)
    probs = torch.where(any_vis, probs, torch.zeros_like(probs))
    return probs @ v
