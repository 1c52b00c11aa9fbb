"""What the float64 oracles share — the paper's formula, literally: the oracle every fast path is tested against.

Nothing here is fast. Visibility is an explicit boolean matrix ``M`` (B, M, N) built from the mode's definition,
powers are computed one by one, the aggregation is ``H_i = Σ_j M_ij poly(h_j) / Σ_j M_ij`` (or the plain sum),
and rotary positions rotate every (query, context) pair by the angle of their *relative* position — the property
the fast path must reproduce by rotating before and after aggregation (PoMRoPE's convention: each context token and
each query's gate by its own position, :func:`own_frame`). Everything runs in float64. Each op's own
oracle is in its folder's ``reference.py`` (``reference_pom``, ``reference_value_pom``, ``reference_gated``), built
from these pieces; attention's (the baselines') is here.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor

from .common import activation as activation_fn
from .common import REFERENCE_MODES, Mixing, gate_fn

__all__ = ["visibility", "shift_validity", "shifted", "reference_attention", "rotation_angles", "polynomial", "gate_of",
           "rotated_pairs", "own_frame", "turn_pairs", "float64_inputs", "oracle_view", "visible_mean", "no_stream"]


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


def rotation_angles(rel: Tensor, D: int, base: float, two_d: bool) -> Tensor:
    """Angle of every channel pair for relative positions rel (..., ) or (..., 2); returns (..., D/2)."""
    pairs = D // 4 if two_d else D // 2  # per position axis
    inv = base ** (-torch.arange(pairs, dtype=torch.float64) / pairs)
    return torch.cat([rel[..., 0:1] * inv, rel[..., 1:2] * inv], dim=-1) if two_d else rel.unsqueeze(-1) * inv


def polynomial(z: Tensor, coeff: Tensor, activation: str) -> Tensor:
    """Σ_p α_p act(z)^p, one power at a time, in float64."""
    h = activation_fn(z.to(torch.float64), activation)
    return sum(coeff[:, p - 1].to(torch.float64) * h**p for p in range(1, coeff.shape[1] + 1))


def gate_of(x: Tensor, weight: Tensor, bias: Tensor, gate: str, width: int) -> Tensor:
    """gate(W_s x + b), one scalar per head repeated over its channels when the gate is narrower than ``width``."""
    s = gate_fn(x @ weight.to(torch.float64).T + bias.to(torch.float64), gate)
    return s if s.shape[-1] == width else s.repeat_interleave(width // s.shape[-1], dim=-1)


def rotated_pairs(feat: Tensor, rope: str, base: float, positions: Tensor,
                  context_positions: Optional[Tensor]) -> Tensor:
    """R(p_j − p_i) feat_j for every (query i, context token j): (B, M, N, C) from (B, N, C) context features."""
    f64 = torch.float64
    B, C, two_d = feat.shape[0], feat.shape[-1], rope == "2d"
    qp = positions.to(f64)
    kp = (positions if context_positions is None else context_positions).to(f64)
    if qp.dim() == (2 if two_d else 1):
        qp = qp.unsqueeze(0).expand(B, *qp.shape)
    if kp.dim() == (2 if two_d else 1):
        kp = kp.unsqueeze(0).expand(B, *kp.shape)
    ang = rotation_angles(kp.unsqueeze(1) - qp.unsqueeze(2), C, base, two_d)  # (B, M, N, C/2)
    return turn_pairs(feat.unsqueeze(1), ang)


def own_frame(feat: Tensor, rope: str, base: float, positions: Tensor, D: int) -> Tensor:
    """R_{p_j} feat_j as PoMRoPE turns every token's (B, N, W) channels: pairs (k, k + W/2) (1-D) or (k, k + W/4)
    within each half (2-D, the first by the row); W < D (a gate per head): pair k at head k's leading frequency."""
    B, W, two_d = feat.shape[0], feat.shape[-1], rope == "2d"
    pos = positions.to(torch.float64)
    if pos.dim() == (2 if two_d else 1):
        pos = pos.unsqueeze(0).expand(B, *pos.shape)
    ang = rotation_angles(pos, D, base, two_d)  # (B, N, D/2): 2-D, the row's D/4 angles then the column's
    if W != D:
        hd = D // W
        rows = [k * hd for k in range(W // 4)]
        ang = ang[..., rows + [D // 4 + k for k in rows]] if two_d else ang[..., [k * (hd // 2) for k in range(W // 2)]]
    if two_d:
        return turn_pairs(feat.unflatten(-1, (2, W // 2)), ang.unflatten(-1, (2, W // 4))).flatten(-2)
    return turn_pairs(feat, ang)


def turn_pairs(feat: Tensor, ang: Tensor) -> Tensor:
    """Channels (k, k + C/2) of ``feat`` (…, C) turned by ``ang`` (…, C/2)."""
    cos, sin = ang.cos(), ang.sin()
    half = feat.shape[-1] // 2
    f1, f2 = feat[..., :half], feat[..., half:]
    return torch.cat([f1 * cos - f2 * sin, f2 * cos + f1 * sin], dim=-1)


def float64_inputs(op: str, modes: Dict[str, Any], x: Tensor, context: Optional[Tensor], vis: Optional[Tensor]
                   ) -> Tuple[Mixing, Tensor, Tensor, Tensor]:
    """An oracle's modes (:data:`~polymixer.ops.common.REFERENCE_MODES`), its tokens and context in float64, and its
    visibility as float64 (None: every query sees every context token)."""
    x = x.to(torch.float64)
    c = x if context is None else context.to(torch.float64)
    if vis is None:
        vis = visibility(x.shape[0], x.shape[1], c.shape[1]).to(x.device)
    m = Mixing.of(op, modes, REFERENCE_MODES)
    if m.rope_convention != "relative" and op != "reference_pom":
        raise ValueError(f"{op} has one rotary convention, 'relative'; rope_convention='reference' is a plain PoM's")
    return m, x, c, vis.to(torch.float64)


def oracle_view(call: Any) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """A validated call as an oracle reads it: (its explicit (B, M, N) visibility, its rotary positions, its context
    positions) — with rotary, each token's index in its sequence where the call gives none (the context's the
    queries' when self-mixing)."""
    x, m = call.x, call.mixing
    vis = visibility(call.B, call.M, call.N, causal=m.causal, block_size=m.block_size, key_mask=call.key_mask,
                     mask=call.mask, cu_seqlens_q=call.cu_q, cu_seqlens_k=call.cu_k).to(x.device)
    pos, cpos = call.rope_positions() if m.rope is not None else (None, None)
    return vis, pos, cpos


def visible_mean(total: Tensor, visf: Tensor) -> Tensor:
    """``total`` (Σ_j vis_ij f_j) ÷ Σ_j vis_ij: the mean over what each query sees, 0 where it sees nothing."""
    count = visf.sum(-1, keepdim=True)
    return torch.where(count > 0, total / count.clamp_min(1.0), torch.zeros_like(total))


def no_stream(call: Any) -> Optional[str]:
    """The oracles' ``supports``: every call but a stream's (streams run on the torch form)."""
    return "a stream (state=…) runs on the torch form" if call.state is not None else None


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


def shifted(z: Tensor, taps: Optional[Tensor], has_prev: Optional[Tensor] = None) -> Tensor:
    """The token shift literally, in float64: Σ_t taps[t] ⊙ z_{j−t} over the taps (W, C) of (B, N, C) ``z``, token
    j − t read where ``has_prev`` (B, N) or (B, N, W − 1) says (:func:`shift_validity`; default: every j ≥ t).
    ``taps`` None: ``z`` as it is."""
    if taps is None:
        return z
    taps, lags = taps.to(torch.float64), taps.shape[0] - 1
    B, N = z.shape[:2]
    has_prev = shift_validity(B, N, lags=lags) if has_prev is None else has_prev
    has_prev = has_prev.unsqueeze(-1) if has_prev.dim() == 2 else has_prev
    if has_prev.shape[-1] < lags:
        raise ValueError(f"a token shift of width {lags + 1} needs has_prev (B, N, {lags})")
    out = taps[0] * z
    for t in range(1, lags + 1):
        before = torch.zeros_like(z)
        for j in range(t, N):
            before[:, j] = z[:, j - t] * has_prev[:, j, t - 1, None].to(torch.float64)
        out = out + taps[t] * before
    return out


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
