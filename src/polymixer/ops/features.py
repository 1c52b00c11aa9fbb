"""The math every op shares, in one place: polynomial features by Horner's scheme with a backward that recomputes,
chunked prefix sums, aggregation over the visible tokens for every masking mode, the gated selection — and the value
PoM's pieces around its mixing (the token shift, the feature maps, the heads view, the readout) and the gated form's
decay. Each is a differentiable function on tensors (or on a validated :class:`~polymixer.ops.call.Call`), reused by
every backend of every op and by the baselines; no backend calls another one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from .common import (
    ACTIVATIONS,
    GATES,
    GATES_INPLACE,
    ActivationLike,
    Mixing,
    cast_output,
    check_positions,
    compute_dtype,
    default_positions,
    elementwise_backward,
    is_compiling,
    resolve,
    rope_angles,
    rotate,
    segments,
)

__all__ = ["poly_features", "horner", "horner_derivative", "cumsum", "chunked_cumsum", "segment_prefix_sum",
           "aggregate", "last_visible", "safe_inverse", "pattern_mask", "gate_mix", "expand_heads", "reverse_logs",
           "rotate_features", "select",
           "CHUNK", "EPS", "Features", "token_shift", "heads_view", "rotate_heads", "pad_tokens", "pad_packed",
           "unpack_positions", "positions_or_default", "value_features", "readout", "value_output", "full_mix",
           "call_features", "packed_starts", "packed_features", "padded_rows", "decay_logs",
           "gated_features", "Scan", "mix_both_ways"]

# ----------------------------------------------------------------------------------------------------------------
# Polynomial features
# ----------------------------------------------------------------------------------------------------------------


def horner(h: Tensor, rows: Tensor) -> Tensor:
    """Σ_{p=1..k} α_p ⊙ h^p = h ⊙ (α_1 + h ⊙ (α_2 + … + h ⊙ α_k)), in place on a fresh buffer.

    ``rows`` is the (k, D) transposed, contiguous coefficient table (contiguous rows keep the loops vectorised).
    """
    k = rows.shape[0]
    if k == 1:
        return h * rows[0]
    acc = torch.addcmul(rows[k - 2], h, rows[k - 1])
    if is_compiling():  # compiled code fuses the loop anyway; see common.cast_output for why nothing in place here
        for p in range(k - 3, -1, -1):
            acc = acc * h + rows[p]
        return acc * h
    for p in range(k - 3, -1, -1):
        acc.mul_(h).add_(rows[p])
    return acc.mul_(h)


def horner_derivative(h: Tensor, rows: Tensor) -> Tensor:
    """d/dh Σ_p α_p h^p = Σ_p p·α_p h^(p-1)."""
    k = rows.shape[0]
    if k == 1:
        return rows[0].expand_as(h)
    acc = torch.addcmul(rows[k - 2] * (k - 1), h, rows[k - 1] * k)
    for p in range(k - 3, -1, -1):
        acc.mul_(h).add_(rows[p] * (p + 1))
    return acc


class _PolyFeatures(torch.autograd.Function):
    """poly(act(z)) with a backward that recomputes act(z) instead of saving powers."""

    @staticmethod
    def forward(ctx, z: Tensor, coeff: Tensor, act: ActivationLike) -> Tensor:  # type: ignore[override]
        cd = compute_dtype(z.dtype)
        fn, _ = resolve(ACTIVATIONS, act, "activation")
        h = fn(z.to(cd))
        out = horner(h, coeff.to(cd).t().contiguous())
        ctx.act = act
        ctx.save_for_backward(z, coeff)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        z, coeff = ctx.saved_tensors
        cd = compute_dtype(z.dtype)
        fn, dfn = resolve(ACTIVATIONS, ctx.act, "activation")
        zc = z.to(cd)
        rows = coeff.to(cd).t().contiguous()
        # a permuted gradient (from a heads split) makes every elementwise loop ~10× slower
        g = grad.to(cd).contiguous()
        h = fn(zc)
        grad_z = grad_coeff = None
        wanted = ctx.needs_input_grad
        if wanted[1]:
            lead = tuple(range(h.dim() - 1))
            cols = []
            hp = h
            for p in range(rows.shape[0]):
                cols.append((g * hp).sum(lead))
                if p + 1 < rows.shape[0]:
                    hp = hp * h
            grad_coeff = torch.stack(cols, dim=-1).to(coeff.dtype)
        if wanted[0]:
            grad_h = g * horner_derivative(h, rows)
            grad_z = elementwise_backward(fn, dfn, zc, grad_h).to(z.dtype)
        return grad_z, grad_coeff, None


def poly_features(z: Tensor, coeff: Tensor, act: ActivationLike = "leaky_clamp") -> Tensor:
    """Per-token polynomial features ``Σ_{p=1..k} α_p ⊙ act(z)^p``.

    Args:
        z: (..., D) pre-activation (may be a strided view, e.g. a slice of the fused input projection).
        coeff: (D, k) coefficients, column ``p-1`` multiplies the p-th power.
        act: activation name from :data:`ACTIVATIONS` or a callable.

    Returns:
        (..., D) in at least fp32 (bf16/fp16 inputs are expanded in fp32).
    """
    if coeff.dim() != 2 or coeff.shape[0] != z.shape[-1]:
        raise ValueError(f"coeff must have shape (D, degree) with D={z.shape[-1]}, got {tuple(coeff.shape)}")
    return _PolyFeatures.apply(z, coeff, act)


# ----------------------------------------------------------------------------------------------------------------
# Prefix sums along the token axis
# ----------------------------------------------------------------------------------------------------------------

_CHUNK = 32


def chunked_cumsum(x: Tensor, reverse: bool, initial: Optional[Tensor] = None) -> Tensor:
    """Inclusive (or reverse-inclusive) prefix sum along dim 1 of a (B, N, D) tensor, plus ``initial`` (B, D) — a
    sum carried in from outside — at every token (added with the chunks' own carries: no extra pass over x).

    Within chunks of 32 tokens the sum is a (32×32) triangular matrix product; chunk totals are carried by a
    recursive call on the (B, N/32, D) totals. O(N·D·32) flops, but BLAS-fast and accurate (short fp32 sums).
    """
    B, N, D = x.shape
    if N <= 2 * _CHUNK:
        out = x.flip(1).cumsum(1).flip(1) if reverse else x.cumsum(1)
        return out if initial is None else out.add_(initial.unsqueeze(1))
    C = _CHUNK
    pad = (-N) % C
    xp = F.pad(x, (0, 0, 0, pad)) if pad else x.contiguous()
    nb = (N + pad) // C
    tri = torch.ones(C, C, dtype=x.dtype, device=x.device)
    tri = tri.triu() if reverse else tri.tril()
    w = torch.matmul(tri, xp.view(B, nb, C, D))  # (B, nb, C, D): sums within each chunk
    if reverse:
        tot = w[:, :, 0]
        carry = F.pad(chunked_cumsum(tot[:, 1:], True), (0, 0, 0, 1))  # sum of all later chunks
    else:
        tot = w[:, :, -1]
        carry = F.pad(chunked_cumsum(tot[:, :-1], False), (0, 0, 1, 0))  # sum of all earlier chunks
    if initial is not None:
        carry = carry + initial.unsqueeze(1)
    w.add_(carry.unsqueeze(2))
    out = w.view(B, nb * C, D)
    return out[:, :N] if pad else out


class _CumSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[override]
        return chunked_cumsum(x, reverse=False)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        return chunked_cumsum(grad, reverse=True)


def cumsum(x: Tensor) -> Tensor:
    """Inclusive prefix sum along dim 1 of a (B, N) or (B, N, D) tensor (chunked, differentiable)."""
    if x.dim() == 2:
        return _CumSum.apply(x.unsqueeze(-1)).squeeze(-1)
    if x.dim() != 3:
        raise ValueError(f"cumsum expects a (B, N) or (B, N, D) tensor, got shape {tuple(x.shape)}")
    return _CumSum.apply(x)


def segment_prefix_sum(x: Tensor, seg: Tensor, starts: Tensor, nseg: int) -> Tensor:
    """Inclusive prefix sum of a (1, T, D) tensor that restarts at every segment.

    Before one global prefix sum, each segment's first token is offset by minus the previous segment's total, so
    the running sum returns to (almost exactly) zero at every boundary: no long-range cancellation, no T×T work.
    """
    seg_sum = torch.zeros(x.shape[0], nseg, x.shape[-1], dtype=x.dtype, device=x.device).index_add(1, seg, x)
    if nseg > 1:
        x = x.index_add(1, starts[1:], -seg_sum[:, :-1])
    return cumsum(x)


# ----------------------------------------------------------------------------------------------------------------
# Aggregation
# ----------------------------------------------------------------------------------------------------------------


def last_visible(
    num_queries: int,
    num_keys: int,
    block_size: Optional[int],
    device: torch.device,
    q_local: Optional[Tensor] = None,
    k_len: Optional[Tensor] = None,
    k_start: Optional[Tensor] = None,
) -> Tensor:
    """Index of the last context token each query may see under (block-)causal masking, top-left aligned.

    Unpacked: query i sees context j ≤ i (causal) or j < (i//K + 1)·K (block-causal), clipped to the context.
    Packed: the same with local indices inside each query's sequence, offset to global context indices.
    """
    if q_local is None:
        q_local = torch.arange(num_queries, device=device)
        k_len_v: Union[int, Tensor] = num_keys
    else:
        k_len_v = k_len  # type: ignore[assignment]
    if block_size is None:
        last = q_local
    else:
        last = (torch.div(q_local, block_size, rounding_mode="floor") + 1) * block_size - 1
    last = torch.minimum(last, torch.as_tensor(k_len_v, device=device) - 1)
    if k_start is not None:
        last = last + k_start
    return last


def aggregate(
    p: Tensor,
    *,
    num_queries: Optional[int] = None,
    key_mask: Optional[Tensor] = None,
    mask: Optional[Tensor] = None,
    causal: bool = False,
    block_size: Optional[int] = None,
    cu_seqlens: Optional[Tensor] = None,
    cu_seqlens_q: Optional[Tensor] = None,
    reduction: str = "mean",
) -> Tensor:
    """Aggregate per-token features over the context tokens each query may see.

    Args:
        p: (B, N, D) per-context-token features (already in the accumulation dtype).
        num_queries: M, the number of queries (defaults to N: self-mixing).
        key_mask: (B, N) bool, True = the context token takes part.
        mask: (B, M, N) bool, general visibility (cost O(M·N·D), the only quadratic mode).
        causal: query i sees context j ≤ i (top-left aligned when M ≠ N, as ``scaled_dot_product_attention``).
        block_size: with ``causal``, query i sees every context token of its block of ``block_size`` and earlier.
        cu_seqlens: (S+1,) offsets of packed context sequences (B must be 1); nothing crosses a boundary.
        cu_seqlens_q: offsets of the packed queries for cross-mixing (defaults to ``cu_seqlens``).
        reduction: "mean" divides by the number of visible tokens (0 visible → 0), "sum" does not.

    Returns:
        (B, 1, D) when every query sees the same tokens (full mode), else (B, M, D). Same dtype as ``p``.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    _, N, _ = p.shape  # (B, N, D)
    M = N if num_queries is None else num_queries
    mean = reduction == "mean"
    if block_size is not None and not causal:
        raise ValueError("block_size requires causal=True (block-causal masking)")

    w = None
    if key_mask is not None:
        w = key_mask.to(p.dtype)
        p = p * w.unsqueeze(-1)

    if mask is not None:
        if cu_seqlens is not None:
            raise ValueError("mask of shape (B, M, N) and cu_seqlens cannot be combined; fold one into the other")
        return _aggregate_masked(p, mask, key_mask, M, causal, block_size, mean)
    if cu_seqlens is not None:
        return _aggregate_packed(p, w, M, causal, block_size, cu_seqlens, cu_seqlens_q, mean)
    if not causal:
        return _aggregate_full(p, w, mean)
    return _aggregate_causal(p, w, M, block_size, mean)


def _aggregate_masked(p: Tensor, mask: Tensor, key_mask: Optional[Tensor], M: int, causal: bool,
                      block_size: Optional[int], mean: bool) -> Tensor:
    """:func:`aggregate` under an explicit (B, M, N) visibility ``mask`` (with the causal pattern and the key padding
    folded in): one (M × N) matrix product per batch row, the only quadratic mode."""
    N = p.shape[1]
    vis = mask
    if causal:
        vis = vis & pattern_mask(M, N, block_size, p.device)
    if key_mask is not None:
        vis = vis & key_mask.unsqueeze(1)
    vf = vis.to(p.dtype)
    h = torch.bmm(vf, p)
    if mean:
        count = vf.sum(-1, keepdim=True)
        h = h * safe_inverse(count)
    return h


def _aggregate_full(p: Tensor, w: Optional[Tensor], mean: bool) -> Tensor:
    """:func:`aggregate` when every query sees every (unpadded) token: one (B, 1, D) sum or mean. ``p`` is already
    zero where the key weights ``w`` (B, N) are."""
    if not mean:
        return p.sum(1, keepdim=True)
    if w is None:
        return p.mean(1, keepdim=True)
    return p.sum(1, keepdim=True) * safe_inverse(w.sum(1)).view(p.shape[0], 1, 1)


def _aggregate_causal(p: Tensor, w: Optional[Tensor], M: int, block_size: Optional[int], mean: bool) -> Tensor:
    """:func:`aggregate` under (block-)causal masking, top-left aligned: one prefix sum over the context, read at
    each query's last visible token (every token itself when M = N and there are no blocks)."""
    B, N, _ = p.shape
    # (M,) ≥ 0 because N ≥ 1; None: every query reads its own token
    last = None if M == N and block_size is None else last_visible(M, N, block_size, p.device)
    h = cumsum(p) if last is None else cumsum(p).index_select(1, last)
    if not mean:
        return h
    if w is not None:
        count = cumsum(w) if last is None else cumsum(w).index_select(1, last)
    elif last is None:
        count = torch.arange(1, N + 1, device=p.device, dtype=p.dtype).expand(B, N)
    else:
        count = (last + 1).to(p.dtype).expand(B, M)
    return h * safe_inverse(count).unsqueeze(-1)


def safe_inverse(count: Tensor) -> Tensor:
    """1 / count, and 0 where nothing is visible (a query that sees no token gets H = 0, never NaN)."""
    return torch.where(count > 0, 1.0 / count.clamp_min(1.0), torch.zeros((), dtype=count.dtype, device=count.device))


def pattern_mask(M: int, N: int, block_size: Optional[int], device: torch.device) -> Tensor:
    """(M, N) causal / block-causal visibility (only used together with an explicit (B, M, N) mask)."""
    last = last_visible(M, N, block_size, device)
    return torch.arange(N, device=device).unsqueeze(0) <= last.unsqueeze(1)


def _aggregate_packed(
    p: Tensor,
    w: Optional[Tensor],
    M: int,
    causal: bool,
    block_size: Optional[int],
    cu_k: Tensor,
    cu_q: Optional[Tensor],
    mean: bool,
) -> Tensor:
    B, N, D = p.shape
    if B != 1:
        raise ValueError(f"packed sequences (cu_seqlens) need batch size 1, got {B}")
    self_mix = cu_q is None
    cu_q = cu_k if cu_q is None else cu_q
    nseg = cu_k.numel() - 1
    seg_k, start_k_tok, starts_k = segments(cu_k, N)
    seg_q, start_q_tok, _ = (seg_k, start_k_tok, starts_k) if self_mix else segments(cu_q, M)
    weights = w if w is not None else torch.ones(1, N, dtype=p.dtype, device=p.device)

    if not causal:
        h = torch.zeros(1, nseg, D, dtype=p.dtype, device=p.device).index_add(1, seg_k, p)
        h = h.index_select(1, seg_q)
        if mean:
            count = torch.zeros(1, nseg, dtype=p.dtype, device=p.device).index_add(1, seg_k, weights)
            count = count.index_select(1, seg_q)
            h = h * safe_inverse(count).unsqueeze(-1)
        return h

    s = segment_prefix_sum(p, seg_k, starts_k, nseg)
    if self_mix and block_size is None:
        last = None
        h = s
    else:
        cu64 = cu_k.to(torch.int64)
        k_len = (cu64[1:] - cu64[:-1])[seg_q]
        q_local = torch.arange(M, device=p.device) - start_q_tok
        last = last_visible(M, N, block_size, p.device, q_local, k_len, cu64[:-1][seg_q])
        h = s.index_select(1, last)
    if not mean:
        return h
    if w is not None:
        count = segment_prefix_sum(w.unsqueeze(-1), seg_k, starts_k, nseg).squeeze(-1)
        count = count if last is None else count.index_select(1, last)
    else:
        pos = torch.arange(N, device=p.device) if last is None else last
        count = (pos - start_k_tok[pos] + 1).to(p.dtype).unsqueeze(0)
    return h * safe_inverse(count).unsqueeze(-1)


# ----------------------------------------------------------------------------------------------------------------
# Selection
# ----------------------------------------------------------------------------------------------------------------


def expand_heads(s: Tensor, D: int) -> Tensor:
    """(…, Ds) gate → broadcastable against (…, D): Ds == D elementwise, else one scalar per head."""
    Ds = s.shape[-1]
    if Ds == D:
        return s
    return s.unsqueeze(-1).expand(*s.shape, D // Ds).reshape(*s.shape[:-1], D)


class _GateMix(torch.autograd.Function):
    """gate(z_s + b) ⊙ H with a backward that saves z_s (a view of the fused projection) and H only."""

    @staticmethod
    def forward(ctx, zs: Tensor, bias: Tensor, h: Tensor, gate: ActivationLike, out_dtype: torch.dtype):  # type: ignore[override]
        fn, _ = resolve(GATES, gate, "gate")
        cd = h.dtype
        s = zs.to(cd) + bias.to(cd)  # fresh buffer
        eager = not is_compiling()  # in place saves a buffer in eager; compiled code fuses it anyway
        s = GATES_INPLACE[gate](s) if isinstance(gate, str) and eager else fn(s)
        if eager and s.shape[-1] == h.shape[-1] and h.shape[1] in (1, s.shape[1]) and h.shape[0] == s.shape[0]:
            out = s.mul_(h)
        else:
            out = expand_heads(s, h.shape[-1]) * h
        ctx.gate = gate
        ctx.save_for_backward(zs, bias, h)
        return cast_output(out, out_dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        zs, bias, h = ctx.saved_tensors
        fn, dfn = resolve(GATES, ctx.gate, "gate")
        cd = h.dtype
        g = grad.to(cd)
        u = zs.to(cd) + bias.to(cd)
        D, Ds = h.shape[-1], zs.shape[-1]
        grad_zs = grad_bias = grad_h = None
        wanted = ctx.needs_input_grad
        if wanted[2]:
            grad_h = g * expand_heads(fn(u), D)
            if h.shape[1] == 1 and grad_h.shape[1] != 1:
                grad_h = grad_h.sum(1, keepdim=True)
        if wanted[0] or wanted[1]:
            gs = g * h
            if Ds != D:
                gs = gs.view(*gs.shape[:-1], Ds, D // Ds).sum(-1)
            gu = elementwise_backward(fn, dfn, u, gs)
            if wanted[0]:
                grad_zs = gu.to(zs.dtype)
            if wanted[1]:
                grad_bias = gu.sum(tuple(range(gu.dim() - 1))).to(bias.dtype)
        return grad_zs, grad_bias, grad_h, None, None


def gate_mix(zs: Tensor, bias: Tensor, h: Tensor, gate: ActivationLike = "hardsigmoid", out_dtype=None) -> Tensor:
    """Selection ``gate(z_s + b) ⊙ H``.

    Args:
        zs: (B, M, Ds) gate pre-activations; Ds == D (one gate per channel) or Ds | D (one per head).
        bias: (Ds,) gate bias.
        h: (B, 1 or M, D) aggregated features (accumulation dtype).
        out_dtype: dtype of the result (defaults to ``zs.dtype``: the dtype the output projection runs in).
    """
    D, Ds = h.shape[-1], zs.shape[-1]
    if D % Ds != 0:
        raise ValueError(f"gate width {Ds} must divide the polynomial width {D}")
    return _GateMix.apply(zs, bias, h, gate, zs.dtype if out_dtype is None else out_dtype)


def rotate_features(p: Tensor, positions: Optional[Tensor], mixing: Mixing) -> Tensor:
    """R_j p_j: each context token's (B, N, D) features turned by its rotary position, in the pairing of
    ``mixing.rope_convention`` (unchanged without rotary)."""
    if mixing.rope is None:
        return p
    cos, sin = rope_angles(positions, p.shape[-1], mixing.rope_base, mixing.two_d, p.dtype)
    return rotate(p, cos, sin, halves=mixing.two_d and mixing.rope_convention == "reference")


def select(zs: Tensor, bias: Tensor, h: Tensor, mixing: Mixing, positions: Optional[Tensor] = None) -> Tensor:
    """The gated selection of queries at rotary ``positions`` from the aggregate ``h`` (B, 1 or M, D) of turned
    features: "relative" reads it in each query's frame, ``gate(z_s + b) ⊙ R_i⁻¹ H_i``; "reference" (PoMRoPE) turns
    the gate, ``R_i gate(z_s + b) ⊙ H_i`` — a gate of Ds < D heads in pairs (k, k + Ds/2), pair k at head k's
    leading frequency (2-D: Ds/4 row pairs, then Ds/4 column pairs). Without rotary, :func:`gate_mix`."""
    if mixing.rope is None:
        return gate_mix(zs, bias, h, mixing.gate)
    two_d, (B, M, Ds), D = mixing.two_d, zs.shape, h.shape[-1]
    cos, sin = rope_angles(positions, D, mixing.rope_base, two_d, h.dtype)
    if mixing.rope_convention == "relative":
        return gate_mix(zs, bias, rotate(h.expand(B, M, D), cos, sin, inverse=True), mixing.gate)
    if Ds != D:  # PoMRoPE's tables strided by (D/Ds)//2 (1-D) or D/Ds (2-D)
        k = torch.arange(Ds // 4, device=h.device) * (D // Ds)
        idx = torch.cat([k, D // 4 + k]) if two_d else torch.arange(Ds // 2, device=h.device) * (D // Ds // 2)
        cos, sin = cos[..., idx], sin[..., idx]
    s = resolve(GATES, mixing.gate, "gate")[0](zs.to(h.dtype) + bias.to(h.dtype))
    return (expand_heads(rotate(s, cos, sin, halves=two_d), D) * h).to(zs.dtype)


def reverse_logs(g: Tensor) -> Tensor:
    """Log-decays of the backward scan run as a forward scan on the flipped sequence: step r of the flipped scan
    decays by the original token N − r's g (token i + 1 carries the weight of the pair (i, i + 1))."""
    f = g.flip(-1)
    return torch.cat([torch.zeros_like(f[..., :1]), f[..., :-1]], dim=-1)

# ----------------------------------------------------------------------------------------------------------------
# The value PoM around its mixing: token shift, feature maps, heads, readout (every backend of value_pom and of
# gated_value_pom; the calls are validated :class:`~polymixer.ops.call.Call` objects)
# ----------------------------------------------------------------------------------------------------------------

CHUNK = 64  # tokens per chunk of the causal form: the quadratic part is C / (dv/H) of the state part's work
EPS = 1e-6

# (q (B, H, M, D_h), k (B, H, N, D_h) zero at padding, v (B, H, N, dv_h), key weights w (B, N), z_s (B, M, Ds))
Features = Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]


def token_shift(z: Tensor, weight: Tensor, key_mask: Optional[Tensor] = None, prev: Optional[Tensor] = None,
                starts: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """``Σ_t weight[t] ⊙ z_{j−t}`` (t = 0 … W−1, ``weight`` (W, C)) along the tokens of (B, N, C) ``z``: a causal
    depthwise convolution of width W; W = 2 is the token shift ``weight[0] ⊙ z_j + weight[1] ⊙ z_{j−1}``.

    The W − 1 tokens before the first are ``prev`` (B, W − 1, C) (a stream's last tokens, oldest first) or zero; a
    masked token (``key_mask`` False) counts as zero, and so does every token before a sequence's first (``starts``
    (B, N) True, packed sequences). Returns the mixed tensor and the last W − 1 (masked) projections, the stream
    state (B, W − 1, C) (one token, unused, when W = 1).
    """
    W = weight.shape[0]
    lags = max(W - 1, 1)
    zm = z if key_mask is None else z * key_mask.unsqueeze(-1).to(z.dtype)
    if prev is None:
        prev = zm.new_zeros(zm.shape[0], lags, zm.shape[2])
    elif prev.dim() != 3 or prev.shape[1] != lags:
        raise ValueError(f"the token shift of width {W} keeps the last {lags} tokens: prev must be (B, {lags}, C), "
                         f"got {tuple(prev.shape)}")
    padded = torch.cat([prev.to(zm.dtype), zm], dim=1)  # (B, lags + N, C): token j sits at j + lags
    N = z.shape[1]
    out = weight[0] * z
    if starts is not None:  # starts in (j − t, j] cut token j off from token j − t
        seen = F.pad(torch.cumsum(starts.to(torch.int32), dim=1), (lags, 0))
    for t in range(1, W):
        before = padded[:, lags - t:lags - t + N]
        if starts is not None:
            before = before * (seen[:, lags:] == seen[:, lags - t:lags - t + N]).unsqueeze(-1).to(before.dtype)
        out = out + weight[t] * before
    return out, padded[:, -lags:]


def heads_view(t: Tensor, H: int) -> Tensor:
    """(B, N, C) → (B, H, N, C/H)."""
    B, N, C = t.shape
    return t.view(B, N, H, C // H).transpose(1, 2)


def rotate_heads(t: Tensor, positions: Tensor, base: float, two_d: bool) -> Tensor:
    """Rotate every head of (B, H, N, D_h) by its token's position ((N,) / (B, N), or (…, N, 2) for 2-D)."""
    cos, sin = rope_angles(positions, t.shape[-1], base, two_d, t.dtype)
    if cos.dim() == 3:  # (B, N, D_h/2) → (B, 1, N, D_h/2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return rotate(t, cos, sin)


def pad_tokens(t: Tensor, n: int, dim: int) -> Tensor:
    """``t`` with zeros appended along ``dim`` up to ``n`` entries (unchanged when it has that many)."""
    extra = n - t.shape[dim]
    if extra <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t, t.new_zeros(shape)], dim=dim)


def pad_packed(t: Tensor, cu: Tensor) -> Tuple[Tensor, Tensor]:
    """(1, T, …) packed → (S, L_max, …) one row per sequence (zero padding on the right), and the (S, L_max)
    validity mask."""
    cu64 = cu.to(torch.int64)
    lens = cu64[1:] - cu64[:-1]
    L = int(lens.max()) if lens.numel() else 0
    ar = torch.arange(max(L, 1), device=t.device)
    valid = ar.unsqueeze(0) < lens.unsqueeze(1)
    idx = (cu64[:-1].unsqueeze(1) + ar.unsqueeze(0)).clamp(max=t.shape[1] - 1)
    rows = t[0][idx]
    return rows * valid.view(*valid.shape, *([1] * (rows.dim() - 2))).to(rows.dtype), valid


def unpack_positions(pos: Tensor, n: int, cu: Tensor, two_d: bool) -> Tensor:
    """Positions of packed tokens ((T,) / (1, T), or (…, T, 2)) → (S, L_max[, 2]) like :func:`pad_packed`."""
    rows = pad_packed(pos.reshape(1, n, -1), cu)[0]
    return rows if two_d else rows.squeeze(-1)


def positions_or_default(pos: Optional[Tensor], B: int, n: int, two_d: bool, name: str, device: torch.device
                         ) -> Tensor:
    """``pos`` checked against (B, n), or the default: each token's index."""
    if pos is None:
        return default_positions(n, device, two_d, name)
    check_positions(pos, B, n, two_d, name)
    return pos


def value_features(ctx: Tensor, x: Tensor, weights: Any, key_mask: Optional[Tensor], prev: Optional[Tensor],
                   self_mix: bool, activation: ActivationLike, starts: Optional[Tensor] = None
                   ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(φ (B, N, D), v (B, N, dv), ψ (B, M, D), z_s (B, M, Ds), the last key/value projections (B, W − 1, D + dv)
    that the token shift of width W keeps (the last one without a shift)) — ``weights``: the value PoM's (or its
    gated form's), read by name.

    Self-mixing does one matrix product for all four projections."""
    in_weight, coeff, shift = weights.in_weight, weights.coeff, weights.shift_weight
    D, dv = coeff.shape[0], weights.out_weight.shape[1]
    Ds = in_weight.shape[0] - 2 * D - dv
    # split, not slices: the backward of a split is one concatenation, that of each slice a zero-filled full copy
    if self_mix:  # in_weight stacks [W_k (D); W_v (dv); W_q (D); W_s (Ds)]: context rows, then query rows
        zkv, zq = F.linear(x, in_weight).split([D + dv, D + Ds], dim=-1)
    else:
        zkv, zq = F.linear(ctx, in_weight[:D + dv]), F.linear(x, in_weight[D + dv:])
    if shift is not None:
        zkv, last = token_shift(zkv, shift, key_mask, prev, starts)
    else:
        last = zkv[:, -1:] if key_mask is None else zkv[:, -1:] * key_mask[:, -1:, None].to(zkv.dtype)
    zk, zv = zkv.split([D, dv], dim=-1)
    zqq, zs = zq.split([D, Ds], dim=-1)
    phi = poly_features(zk, coeff, activation)
    psi = poly_features(zqq, weights.coeff_q, activation)
    return phi, zv.to(phi.dtype), psi, zs, last


def readout(o: Tensor, zs: Tensor, weights: Any, gate: ActivationLike) -> Tensor:
    """(B, H, M, dv_h) mixed values → RMSNorm per head with gain → gate → W_o: (B, M, d)."""
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + EPS)
    B, H, M, e = o.shape
    h = o.transpose(1, 2).reshape(B, M, H * e) * weights.norm_weight.to(o.dtype)
    return F.linear(gate_mix(zs, weights.gate_bias, h, gate), weights.out_weight, weights.out_bias)


def value_output(o: Tensor, cnt: Tensor, zs: Tensor, weights: Any, mixing: Mixing) -> Tensor:
    """(B, H, M, dv_h) sums → mean (or sum, as ``mixing.reduction`` says) over the ``cnt`` (B, M) visible tokens →
    :func:`readout`: (B, M, d)."""
    if mixing.reduction == "mean":
        o = o * safe_inverse(cnt).unsqueeze(1).unsqueeze(-1)
    return readout(o, zs, weights, mixing.gate)


def full_mix(q: Tensor, k: Tensor, v: Tensor, w: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Full mixing (every query sees every weighted key): two matrix products through the (B, H, D_h, dv_h) state.
    Returns (o, counts (B, M), the state, the total weight (B,)), as
    :func:`polymixer.ops.value_pom.modular.value_mix` does."""
    state = torch.einsum("bhnd,bhne->bhde", k, v)
    total = w.sum(1)
    o = torch.einsum("bhmd,bhde->bhme", q, state)
    return o, total.unsqueeze(1).expand(q.shape[0], q.shape[2]), state, total


def call_features(call: Any, positions: Optional[Tensor] = None, starts: Optional[Tensor] = None,
                  prev: Optional[Tensor] = None, dtype: Optional[torch.dtype] = None) -> Tuple[Features, Tensor]:
    """The features of a call — (q, k, v, w, z_s), and the last W − 1 key / value projections: projections, token
    shift (after ``prev``, a stream's last tokens; restarting where ``starts`` (B, N) marks a sequence's first
    token), polynomials (in ``dtype``, a stream's state's, when given), heads and rotary positions
    (:meth:`~polymixer.ops.call.Call.rope_positions`: the call's own, else ``positions``, else each token's index in
    its sequence)."""
    m, x, self_mix = call.mixing, call.x, call.context is None
    phi, v, psi, zs, last = value_features(x if self_mix else call.context, x, call.weights, call.key_mask, prev,
                                           self_mix, m.activation, starts)
    if dtype is not None:
        phi, v, psi = phi.to(dtype), v.to(dtype), psi.to(dtype)
    w = call.key_mask.to(phi.dtype) if call.key_mask is not None else phi.new_ones(call.B, call.N)
    H = call.heads
    k, q, vh = heads_view(phi * w.unsqueeze(-1), H), heads_view(psi, H), heads_view(v, H)
    if m.rope is not None:
        pos, cpos = call.rope_positions(positions)
        k, q = rotate_heads(k, cpos, m.rope_base, m.two_d), rotate_heads(q, pos, m.rope_base, m.two_d)
    return (q, k, vh, w, zs), last


def packed_starts(cu: Tensor, T: int, device: torch.device) -> Tuple[Tensor, Tensor]:
    """(starts (T,) bool: a sequence's first token, first (T,) int64: the index of each token's sequence's first
    token) of packed offsets ``cu`` (no empty sequence)."""
    # index_fill_, not an indexed assignment, which synchronises with the host on a GPU
    starts = torch.zeros(T, dtype=torch.bool, device=device).index_fill_(0, cu.to(torch.int64)[:-1], True)
    ar = torch.arange(T, device=device)
    return starts, torch.cummax(torch.where(starts, ar, 0), dim=0).values


def packed_features(call: Any) -> Tuple[Features, Tensor]:
    """The features of packed self-mixing (1, T, d) in place — the token shift restarts at each sequence's first
    token and default rotary positions count within each sequence — and ``first`` (T,), each token's sequence's
    first token."""
    starts, first = packed_starts(call.cu_k, call.N, call.x.device)
    return call_features(call, starts=starts.unsqueeze(0))[0], first


def padded_rows(call: Any) -> Tuple[Any, Tensor]:
    """A packed call laid out one batch row per sequence (zero padding on the right, masked out): (the call of the
    rows, the (S, L_max) validity of the queries, to pick the packed outputs back with ``y[valid]``)."""
    m = call.mixing
    self_mix, cu_k = call.context is None, call.cu_k
    cq = cu_k if call.cu_q is None else call.cu_q
    xs, valid_q = pad_packed(call.x, cq)
    cs, valid_k = (xs, valid_q) if self_mix else pad_packed(call.context, cu_k)
    if call.key_mask is not None:  # a (1, T) key padding mask of the packed stream applies as well
        valid_k = valid_k & pad_packed(call.key_mask.unsqueeze(-1), cu_k)[0].squeeze(-1)
    pos = cpos = None
    if m.rope is not None:
        if m.positions is not None:
            check_positions(m.positions, call.B, call.M, m.two_d, "positions")
            pos = unpack_positions(m.positions, call.M, cq, m.two_d)
        if m.context_positions is not None:
            check_positions(m.context_positions, call.B, call.N, m.two_d, "context_positions")
            cpos = unpack_positions(m.context_positions, call.N, cu_k, m.two_d)
        elif self_mix:
            cpos = pos
    rows = replace(call, x=xs, context=None if self_mix else cs, key_mask=valid_k, mask=None, cu_q=None, cu_k=None,
                   B=xs.shape[0], M=xs.shape[1], N=cs.shape[1], squeeze=False,
                   mixing=m.with_(mask=valid_k, cu_seqlens=None, positions=pos, context_positions=cpos))
    return rows, valid_q


# ----------------------------------------------------------------------------------------------------------------
# the gated form's decay
# ----------------------------------------------------------------------------------------------------------------


def decay_logs(x: Tensor, weight: Tensor, bias: Tensor, key_mask: Optional[Tensor]) -> Tensor:
    """(B, H, N) log-decays g = −softplus(W_a x + b) ≤ 0; 0 (no decay) at padding tokens."""
    g = -F.softplus(F.linear(x, weight, bias).float() if x.dtype in (torch.float16, torch.bfloat16) else
                    F.linear(x, weight, bias))
    if key_mask is not None:
        g = g * key_mask.unsqueeze(-1).to(g.dtype)
    return g.transpose(1, 2)


def gated_features(call: Any) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Optional[Tensor]]:
    """The gated call's (q, k, v, log-decays g (B, H, N), z_s, packed sequence ids (1, T) or None): self-mixing
    only, packed sequences in place (:func:`packed_features`)."""
    seq = None
    if call.cu_k is not None:
        (q, k, vh, _, zs), _ = packed_features(call)
        seq = segments(call.cu_k, call.N)[0].unsqueeze(0)  # each token's sequence index
    else:
        (q, k, vh, _, zs), _ = call_features(call)
    g = decay_logs(call.x, call.weights.decay_weight, call.weights.decay_bias, call.key_mask).to(k.dtype)
    return q, k, vh, g, zs, seq


# a gated scan: (q, k, v, g, segment ids or None, chunk, carried-in state or None) → (o, final state or None)
Scan = Callable[..., Tuple[Tensor, Optional[Tensor]]]


def mix_both_ways(scan: Scan, q: Tensor, k: Tensor, v: Tensor, g: Tensor, *, causal: bool,
                  block_size: Optional[int], seq: Optional[Tensor] = None, chunk: int = CHUNK,
                  state: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """The gated mixing of every mode with a backend's own ``scan``: (o (B, H, N, E), the forward state after the
    last token). Causal: the forward scan. Full and block-causal: plus a backward scan over the later tokens of each
    query's sequence (full) or block (block-causal), less the diagonal both count.

    ``seq`` (B, N): sequence ids of packed tokens (the scans restart between sequences), or None."""
    N = q.shape[2]
    o, final = scan(q, k, v, g, seq, chunk, state)
    if causal and block_size is None:
        return o, final
    # the backward scan: the later tokens of each query's block (block-causal) or sequence (full), exclusive
    seg = seq if seq is not None else torch.zeros(q.shape[0], N, dtype=torch.long, device=q.device)
    if causal:
        pos = torch.arange(N, device=q.device)
        if seq is not None:  # blocks count from each packed sequence's first token
            starts = torch.cat([torch.ones_like(seg[:, :1], dtype=torch.bool), seg[:, 1:] != seg[:, :-1]], 1)
            first = torch.cummax(torch.where(starts, pos, 0), dim=1).values
            pos = pos - first
        seg = seg * (N + 1) + torch.div(pos, block_size, rounding_mode="floor")
    ob, _ = scan(q.flip(2), k.flip(2), v.flip(2), reverse_logs(g), seg.flip(1), chunk, None)
    diag = (q * k).sum(-1, keepdim=True) * v  # the scans both count j = i
    return o + ob.flip(2) - diag, final
