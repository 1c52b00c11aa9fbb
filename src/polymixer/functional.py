"""The Polynomial Mixer as pure functions on tensors.

Everything the :class:`polymixer.PoM` module does lives here, reusable on its own:

* :func:`activation` / :func:`gate_fn` — elementwise non-linearities by name;
* :func:`poly_features` — ``Σ_p α_p ⊙ act(z)^p`` by Horner's scheme (never a ``(…, D, k)`` power tensor),
  with a custom backward that saves only its input;
* :func:`cumsum` — an inclusive prefix sum along the token axis computed chunk-wise with small triangular matrix
  products (fp32 accumulation; about 6× faster than ``torch.cumsum`` along a non-contiguous axis on CPU);
* :func:`aggregate` — H for every masking mode (full, causal, block-causal, key padding, general mask, packed
  ``cu_seqlens``, cross), always O(N·D) except for an explicit (B, M, N) mask;
* :func:`gate_mix` — the selection ``gate(z_s + b) ⊙ H`` with one gate scalar per head;
* :func:`rope_angles` / :func:`rotate` — rotary positions (1-D and 2-D);
* :func:`pom` / :func:`pom_step` — the whole operator, parallel and streaming.

Shapes: ``B`` batch, ``N`` context tokens, ``M`` query tokens, ``d`` model width, ``D = expand·d`` polynomial width,
``Ds`` gate width (``D`` when ``sel_heads == 1``, else ``sel_heads``), ``k`` degree.
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

ActivationLike = Union[str, Callable[[Tensor], Tensor]]
CuSeqlens = Union[Tensor, Tuple[Tensor, Tensor]]

__all__ = [
    "ACTIVATIONS",
    "GATES",
    "activation",
    "gate_fn",
    "poly_features",
    "cumsum",
    "aggregate",
    "gate_mix",
    "rope_angles",
    "rotate",
    "pom",
    "pom_step",
    "check_cu_seqlens",
    "fused_kernels",
    "check_mix_inputs",
    "documents_cu_seqlens",
]

# ----------------------------------------------------------------------------------------------------------------
# Elementwise non-linearities: forward and closed-form derivative, so that custom backwards can recompute cheaply.
# ----------------------------------------------------------------------------------------------------------------

_SQRT_2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _leaky_clamp(x: Tensor) -> Tensor:
    # clamping the fresh leaky_relu output in place is autograd-safe: leaky_relu's backward reads its input
    return F.leaky_relu(x, 0.01).clamp_(-0.1, 6.0)


def _leaky_clamp_grad(x: Tensor) -> Tensor:
    # leaky_relu(x) lies in [-0.1, 6] exactly when -10 <= x <= 6 (PyTorch's clamp passes gradients at the bounds)
    slope = torch.where(x > 0, 1.0, 0.01).to(x.dtype)
    return slope.mul_(((x >= -10.0) & (x <= 6.0)).to(x.dtype))


def _gelu_grad(x: Tensor) -> Tensor:
    cdf = 0.5 * (1.0 + torch.erf(x / _SQRT_2))
    return cdf + x * torch.exp(-0.5 * x * x) * _INV_SQRT_2PI


def _silu_grad(x: Tensor) -> Tensor:
    s = torch.sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


ACTIVATIONS: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]] = {
    # the reference implementation's default: leaky ReLU (slope 0.01) clamped to [-0.1, 6]
    "leaky_clamp": (_leaky_clamp, _leaky_clamp_grad),
    "relu": (F.relu, lambda x: (x > 0).to(x.dtype)),
    "gelu": (F.gelu, _gelu_grad),
    "silu": (F.silu, _silu_grad),
    "tanh": (torch.tanh, lambda x: 1.0 - torch.tanh(x) ** 2),
    "identity": (lambda x: x, torch.ones_like),
}

GATES: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]] = {
    # the reference implementation's default
    "hardsigmoid": (F.hardsigmoid, lambda u: ((u > -3.0) & (u < 3.0)).to(u.dtype) / 6.0),
    # the paper's σ
    "sigmoid": (torch.sigmoid, lambda u: torch.sigmoid(u) * (1.0 - torch.sigmoid(u))),
    # no selection at all (ablation)
    "identity": (lambda u: u, torch.ones_like),
}


# in-place forms used on fresh buffers inside the fused functions
_GATES_INPLACE: dict[str, Callable[[Tensor], Tensor]] = {
    "hardsigmoid": lambda u: F.hardsigmoid(u, inplace=True),
    "sigmoid": torch.sigmoid_,
    "identity": lambda u: u,
}


def _resolve(table: dict, name: ActivationLike, what: str):
    if callable(name) and not isinstance(name, str):
        return name, None
    if not isinstance(name, str) or name not in table:
        raise ValueError(f"unknown {what} {name!r}; expected one of {sorted(table)} or a callable")
    return table[name]


def activation(x: Tensor, name: ActivationLike = "leaky_clamp") -> Tensor:
    """Apply the polynomial activation ``act`` by name (or a callable)."""
    fn, _ = _resolve(ACTIVATIONS, name, "activation")
    return fn(x)


def gate_fn(u: Tensor, name: ActivationLike = "hardsigmoid") -> Tensor:
    """Apply the selection gate by name (or a callable)."""
    fn, _ = _resolve(GATES, name, "gate")
    return fn(u)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: at least fp32 (bf16/fp16 inputs are mixed in fp32, fp64 stays fp64)."""
    return torch.promote_types(dtype, torch.float32)


def _leaky_clamp_backward(x: Tensor, grad: Tensor) -> Tensor:
    # two fused ATen kernels instead of five masks (≈ 10× faster on CPU); at the exact bounds x = −10 and x = 6 the
    # gradient is 0 here where the masks passed it: both are subgradients at a kink
    return torch.ops.aten.hardtanh_backward(torch.ops.aten.leaky_relu_backward(grad, x, 0.01, False), x, -10.0, 6.0)


# fused backward kernels, keyed by the forward function: grad_in = bwd(u, grad_out)
_FUSED_BACKWARD: dict = {_leaky_clamp: _leaky_clamp_backward,
                         F.hardsigmoid: lambda u, g: torch.ops.aten.hardsigmoid_backward(g, u)}


def _elementwise_backward(fn, grad_fn, u: Tensor, grad_out: Tensor) -> Tensor:
    """d(fn)/du · grad_out: by a fused kernel or a closed form when known, else by autograd on a recomputation."""
    fused = _FUSED_BACKWARD.get(fn)
    if fused is not None:
        return fused(u, grad_out.to(u.dtype))
    if grad_fn is not None:
        return grad_out * grad_fn(u)
    with torch.enable_grad():
        leaf = u.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(fn(leaf), leaf, grad_out)
    return g


# ----------------------------------------------------------------------------------------------------------------
# Polynomial features
# ----------------------------------------------------------------------------------------------------------------


def _horner(h: Tensor, rows: Tensor) -> Tensor:
    """Σ_{p=1..k} α_p ⊙ h^p = h ⊙ (α_1 + h ⊙ (α_2 + … + h ⊙ α_k)), in place on a fresh buffer.

    ``rows`` is the (k, D) transposed, contiguous coefficient table (contiguous rows keep the loops vectorised).
    """
    k = rows.shape[0]
    if k == 1:
        return h * rows[0]
    acc = torch.addcmul(rows[k - 2], h, rows[k - 1])
    for p in range(k - 3, -1, -1):
        acc.mul_(h).add_(rows[p])
    return acc.mul_(h)


def _horner_derivative(h: Tensor, rows: Tensor) -> Tensor:
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
        cd = _compute_dtype(z.dtype)
        fn, _ = _resolve(ACTIVATIONS, act, "activation")
        h = fn(z.to(cd))
        out = _horner(h, coeff.to(cd).t().contiguous())
        ctx.act = act
        ctx.save_for_backward(z, coeff)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        z, coeff = ctx.saved_tensors
        cd = _compute_dtype(z.dtype)
        fn, dfn = _resolve(ACTIVATIONS, ctx.act, "activation")
        zc = z.to(cd)
        rows = coeff.to(cd).t().contiguous()
        g = grad.to(cd).contiguous()  # a permuted gradient (from a heads split) makes every elementwise loop ~10× slower
        h = fn(zc)
        grad_z = grad_coeff = None
        if ctx.needs_input_grad[1]:
            lead = tuple(range(h.dim() - 1))
            cols = []
            hp = h
            for p in range(rows.shape[0]):
                cols.append((g * hp).sum(lead))
                if p + 1 < rows.shape[0]:
                    hp = hp * h
            grad_coeff = torch.stack(cols, dim=-1).to(coeff.dtype)
        if ctx.needs_input_grad[0]:
            grad_h = g * _horner_derivative(h, rows)
            grad_z = _elementwise_backward(fn, dfn, zc, grad_h).to(z.dtype)
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


def _chunked_cumsum(x: Tensor, reverse: bool) -> Tensor:
    """Inclusive (or reverse-inclusive) prefix sum along dim 1 of a (B, N, D) tensor.

    Within chunks of 32 tokens the sum is a (32×32) triangular matrix product; chunk totals are carried by a
    recursive call on the (B, N/32, D) totals. O(N·D·32) flops, but BLAS-fast and accurate (short fp32 sums).
    """
    B, N, D = x.shape
    if N <= 2 * _CHUNK:
        return x.flip(1).cumsum(1).flip(1) if reverse else x.cumsum(1)
    C = _CHUNK
    pad = (-N) % C
    xp = F.pad(x, (0, 0, 0, pad)) if pad else x.contiguous()
    nb = (N + pad) // C
    tri = torch.ones(C, C, dtype=x.dtype, device=x.device)
    tri = tri.triu() if reverse else tri.tril()
    w = torch.matmul(tri, xp.view(B, nb, C, D))  # (B, nb, C, D): sums within each chunk
    if reverse:
        tot = w[:, :, 0]
        carry = F.pad(_chunked_cumsum(tot[:, 1:], True), (0, 0, 0, 1))  # sum of all later chunks
    else:
        tot = w[:, :, -1]
        carry = F.pad(_chunked_cumsum(tot[:, :-1], False), (0, 0, 1, 0))  # sum of all earlier chunks
    w.add_(carry.unsqueeze(2))
    out = w.view(B, nb * C, D)
    return out[:, :N] if pad else out


class _CumSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[override]
        return _chunked_cumsum(x, reverse=False)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        return _chunked_cumsum(grad, reverse=True)


def cumsum(x: Tensor) -> Tensor:
    """Inclusive prefix sum along dim 1 of a (B, N) or (B, N, D) tensor (chunked, differentiable)."""
    if x.dim() == 2:
        return _CumSum.apply(x.unsqueeze(-1)).squeeze(-1)
    if x.dim() != 3:
        raise ValueError(f"cumsum expects a (B, N) or (B, N, D) tensor, got shape {tuple(x.shape)}")
    return _CumSum.apply(x)


# ----------------------------------------------------------------------------------------------------------------
# Packed sequences
# ----------------------------------------------------------------------------------------------------------------


def _is_compiling() -> bool:
    return torch.compiler.is_compiling()


def check_cu_seqlens(cu_seqlens: Tensor, total: int, name: str = "cu_seqlens") -> None:
    """Validate FlashAttention-style offsets: 1-D integer, starts at 0, strictly increasing, ends at ``total``.

    Value checks need the data, so they run in eager mode only (under ``torch.compile`` only shapes are checked).
    """
    if not isinstance(cu_seqlens, Tensor):
        raise TypeError(f"{name} must be a tensor of int32 offsets, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 (or int64) offsets, got dtype {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{name} must be 1-D with at least 2 offsets, got shape {tuple(cu_seqlens.shape)}")
    if _is_compiling():
        return
    cu = cu_seqlens.tolist()
    if cu[0] != 0:
        raise ValueError(f"{name} must start at 0, got {cu[0]}")
    if cu[-1] != total:
        raise ValueError(f"{name} must end at the number of tokens {total}, got {cu[-1]}")
    bad = [i for i in range(len(cu) - 1) if cu[i + 1] <= cu[i]]
    if bad:
        i = bad[0]
        raise ValueError(
            f"{name} must be strictly increasing (no empty sequence), but offsets {i} and {i + 1} are "
            f"{cu[i]} and {cu[i + 1]}"
        )


def _segments(cu: Tensor, total: int) -> Tuple[Tensor, Tensor, Tensor]:
    """(segment id per token, start offset per token, starts per segment) for packed offsets."""
    cu = cu.to(torch.int64)
    idx = torch.arange(total, device=cu.device)
    seg = torch.bucketize(idx, cu[1:], right=True)
    starts = cu[:-1]
    return seg, starts[seg], starts


def documents_cu_seqlens(idx: Tensor, sep_token: int) -> Tuple[Tensor, Tensor]:
    """Pack a (B, T) batch of token windows into one sequence of documents.

    Documents end after every ``sep_token`` (end-of-text) and at every row end. Returns (cu_seqlens int32 (S+1,),
    positions (B·T,) — the index of each token inside its document) for a forward on ``idx.reshape(1, -1)``.
    """
    B, T = idx.shape
    flat = idx.reshape(-1)
    ends = flat == sep_token
    ends[T - 1::T] = True
    stops = torch.nonzero(ends).squeeze(1) + 1
    cu = torch.cat([torch.zeros(1, dtype=torch.long, device=idx.device), stops])
    starts = torch.repeat_interleave(cu[:-1], cu[1:] - cu[:-1])
    return cu.to(torch.int32), torch.arange(B * T, device=idx.device) - starts


def _segment_prefix_sum(x: Tensor, seg: Tensor, starts: Tensor, nseg: int) -> Tensor:
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


def _last_visible(
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
    B, N, D = p.shape
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
        vis = mask
        if causal:
            vis = vis & _pattern_mask(M, N, block_size, p.device)
        if key_mask is not None:
            vis = vis & key_mask.unsqueeze(1)
        vf = vis.to(p.dtype)
        h = torch.bmm(vf, p)
        if mean:
            count = vf.sum(-1, keepdim=True)
            h = h * _safe_inverse(count)
        return h

    if cu_seqlens is not None:
        return _aggregate_packed(p, w, M, causal, block_size, cu_seqlens, cu_seqlens_q, mean)

    if not causal:
        if not mean:
            return p.sum(1, keepdim=True)
        if w is None:
            return p.mean(1, keepdim=True)
        return p.sum(1, keepdim=True) * _safe_inverse(w.sum(1)).view(B, 1, 1)

    s = cumsum(p)
    if M == N and block_size is None:
        if not mean:
            return s
        if w is not None:
            count = cumsum(w)
        else:
            count = torch.arange(1, N + 1, device=p.device, dtype=p.dtype).expand(B, N)
        return s * _safe_inverse(count).unsqueeze(-1)

    last = _last_visible(M, N, block_size, p.device)  # (M,), ≥ 0 because N ≥ 1
    h = s.index_select(1, last)
    if not mean:
        return h
    if w is not None:
        count = cumsum(w).index_select(1, last)
    else:
        count = (last + 1).to(p.dtype).expand(B, M)
    return h * _safe_inverse(count).unsqueeze(-1)


def _safe_inverse(count: Tensor) -> Tensor:
    """1 / count, and 0 where nothing is visible (a query that sees no token gets H = 0, never NaN)."""
    return torch.where(count > 0, 1.0 / count.clamp_min(1.0), torch.zeros((), dtype=count.dtype, device=count.device))


def _pattern_mask(M: int, N: int, block_size: Optional[int], device: torch.device) -> Tensor:
    """(M, N) causal / block-causal visibility (only used together with an explicit (B, M, N) mask)."""
    last = _last_visible(M, N, block_size, device)
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
    seg_k, start_k_tok, starts_k = _segments(cu_k, N)
    seg_q, start_q_tok, _ = (seg_k, start_k_tok, starts_k) if self_mix else _segments(cu_q, M)
    ones = None if w is not None else torch.ones(1, N, dtype=p.dtype, device=p.device)
    weights = w if w is not None else ones

    if not causal:
        h = torch.zeros(1, nseg, D, dtype=p.dtype, device=p.device).index_add(1, seg_k, p)
        h = h.index_select(1, seg_q)
        if mean:
            count = torch.zeros(1, nseg, dtype=p.dtype, device=p.device).index_add(1, seg_k, weights)
            count = count.index_select(1, seg_q)
            h = h * _safe_inverse(count).unsqueeze(-1)
        return h

    s = _segment_prefix_sum(p, seg_k, starts_k, nseg)
    if self_mix and block_size is None:
        last = None
        h = s
    else:
        cu64 = cu_k.to(torch.int64)
        k_len = (cu64[1:] - cu64[:-1])[seg_q]
        q_local = torch.arange(M, device=p.device) - start_q_tok
        last = _last_visible(M, N, block_size, p.device, q_local, k_len, cu64[:-1][seg_q])
        h = s.index_select(1, last)
    if not mean:
        return h
    if w is not None:
        count = _segment_prefix_sum(w.unsqueeze(-1), seg_k, starts_k, nseg).squeeze(-1)
        count = count if last is None else count.index_select(1, last)
    else:
        pos = torch.arange(N, device=p.device) if last is None else last
        count = (pos - start_k_tok[pos] + 1).to(p.dtype).unsqueeze(0)
    return h * _safe_inverse(count).unsqueeze(-1)


# ----------------------------------------------------------------------------------------------------------------
# Selection
# ----------------------------------------------------------------------------------------------------------------


def _expand_heads(s: Tensor, D: int) -> Tensor:
    """(…, Ds) gate → broadcastable against (…, D): Ds == D elementwise, else one scalar per head."""
    Ds = s.shape[-1]
    if Ds == D:
        return s
    return s.unsqueeze(-1).expand(*s.shape, D // Ds).reshape(*s.shape[:-1], D)


class _GateMix(torch.autograd.Function):
    """gate(z_s + b) ⊙ H with a backward that saves z_s (a view of the fused projection) and H only."""

    @staticmethod
    def forward(ctx, zs: Tensor, bias: Tensor, h: Tensor, gate: ActivationLike, out_dtype: torch.dtype):  # type: ignore[override]
        fn, _ = _resolve(GATES, gate, "gate")
        cd = h.dtype
        s = zs.to(cd) + bias.to(cd)  # fresh buffer
        s = _GATES_INPLACE[gate](s) if isinstance(gate, str) else fn(s)
        if s.shape[-1] == h.shape[-1] and h.shape[1] in (1, s.shape[1]) and h.shape[0] == s.shape[0]:
            out = s.mul_(h)
        else:
            out = _expand_heads(s, h.shape[-1]) * h
        ctx.gate = gate
        ctx.save_for_backward(zs, bias, h)
        return out.to(out_dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        zs, bias, h = ctx.saved_tensors
        fn, dfn = _resolve(GATES, ctx.gate, "gate")
        cd = h.dtype
        g = grad.to(cd)
        u = zs.to(cd) + bias.to(cd)
        D, Ds = h.shape[-1], zs.shape[-1]
        grad_zs = grad_bias = grad_h = None
        if ctx.needs_input_grad[2]:
            grad_h = g * _expand_heads(fn(u), D)
            if h.shape[1] == 1 and grad_h.shape[1] != 1:
                grad_h = grad_h.sum(1, keepdim=True)
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            gs = g * h
            if Ds != D:
                gs = gs.view(*gs.shape[:-1], Ds, D // Ds).sum(-1)
            gu = _elementwise_backward(fn, dfn, u, gs)
            if ctx.needs_input_grad[0]:
                grad_zs = gu.to(zs.dtype)
            if ctx.needs_input_grad[1]:
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


# ----------------------------------------------------------------------------------------------------------------
# Fused CPU path for the two hot modes (self-mixing, full or causal, no mask / rope / packing)
# ----------------------------------------------------------------------------------------------------------------
#
# On CPU the modular path's cost above the matrix products is not arithmetic but memory: every fresh (B, N, D)
# buffer is a new mapping that page-faults on first touch. The fused path walks the fused projection z in tiles of
# ~512 tokens that stay in cache, never materialises per-token features, and — like FlashAttention — saves only z
# (plus a (B, N/512, D) table of running sums) for a backward that recomputes everything else tile by tile. Without
# autograd it even writes its result into z's own polynomial half, so inference allocates nothing of size (B, N, D).

_TILE = 512
_FUSED_ENABLED = True


class fused_kernels:
    """Context manager to switch the fused CPU path off (``with fused_kernels(False): ...``), e.g. to test the
    modular path on the same inputs. The fused path is never used under ``torch.compile`` or off CPU."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __enter__(self) -> "fused_kernels":
        global _FUSED_ENABLED
        self._prev, _FUSED_ENABLED = _FUSED_ENABLED, self.enabled
        return self

    def __exit__(self, *exc: object) -> None:
        global _FUSED_ENABLED
        _FUSED_ENABLED = self._prev


def _tiles(B: int, N: int):
    """(b0, b1, n0, n1, j): row-range × token-range tiles of about _TILE tokens; j is the tile's index in its row."""
    if N >= _TILE:
        for b in range(B):
            for j, n0 in enumerate(range(0, N, _TILE)):
                yield b, b + 1, n0, min(N, n0 + _TILE), j
    else:
        bt = max(1, _TILE // N)
        for b0 in range(0, B, bt):
            yield b0, min(B, b0 + bt), 0, N, 0


def _gate_times(s: Tensor, h: Tensor) -> Tensor:
    """s ⊙ h with s of width Ds (one scalar per head when Ds < D)."""
    D, Ds = h.shape[-1], s.shape[-1]
    if Ds == D:
        return s * h
    hv = h.reshape(*h.shape[:-1], Ds, D // Ds)
    return (s.unsqueeze(-1) * hv).flatten(-2)


def _head_sum(g: Tensor, Ds: int) -> Tensor:
    D = g.shape[-1]
    return g if Ds == D else g.view(*g.shape[:-1], Ds, D // Ds).sum(-1)


class _ProjectedTiles:
    """Tiles of the fused projection z = [W_h x; W_s x] from a materialised z (training: autograd keeps z)."""

    def __init__(self, z: Tensor, D: int) -> None:
        self.z, self.D = z, D

    def poly_part(self, t: Tuple[int, int, int, int]) -> Tensor:
        return self.z[t[0]:t[1], t[2]:t[3], : self.D]

    def gate_part(self, t: Tuple[int, int, int, int]) -> Tensor:
        return self.z[t[0]:t[1], t[2]:t[3], self.D:]

    def both(self, t: Tuple[int, int, int, int]) -> Tuple[Tensor, Tensor]:
        return self.poly_part(t), self.gate_part(t)


class _InputTiles(_ProjectedTiles):
    """Tiles of z computed on the fly from x (inference): the projections run per tile and z never hits memory."""

    def __init__(self, x: Tensor, weight: Tensor, D: int) -> None:
        self.x, self.w, self.D = x, weight, D

    def poly_part(self, t: Tuple[int, int, int, int]) -> Tensor:
        return F.linear(self.x[t[0]:t[1], t[2]:t[3]], self.w[: self.D])

    def gate_part(self, t: Tuple[int, int, int, int]) -> Tensor:
        return F.linear(self.x[t[0]:t[1], t[2]:t[3]], self.w[self.D:])

    def both(self, t: Tuple[int, int, int, int]) -> Tuple[Tensor, Tensor]:
        z = F.linear(self.x[t[0]:t[1], t[2]:t[3]], self.w)  # ONE matrix product for W_h and W_s
        return z[..., : self.D], z[..., self.D:]


Tile = Tuple[int, int, int, int]
Rot = Optional[Tuple[Tensor, Tensor]]


class _Plan:
    """Everything the fused tiles share: coefficients, gate bias, non-linearities, mode, and rotary tables."""

    def __init__(self, coeff: Tensor, bias: Tensor, causal: bool, act: str, gate: str, mean: bool, rot: Rot,
                 cd: torch.dtype) -> None:
        self.D = coeff.shape[0]
        self.rows = coeff.to(cd).t().contiguous()
        self.bias = bias.to(cd)
        self.causal, self.mean, self.cd = causal, mean, cd
        self.act_fn, self.act_d = ACTIVATIONS[act]
        self.gate_fn, self.gate_d = GATES[gate]
        self.gate_ip = _GATES_INPLACE[gate]
        self.rot = rot  # (cos, sin) of shape (N, D/2) or (B, N, D/2), or None

    def _cs(self, t: Tile) -> Tuple[Tensor, Tensor]:
        cos, sin = self.rot  # type: ignore[misc]
        if cos.dim() == 3:
            return cos[t[0]:t[1], t[2]:t[3]], sin[t[0]:t[1], t[2]:t[3]]
        return cos[t[2]:t[3]], sin[t[2]:t[3]]

    def rotate(self, x: Tensor, t: Tile) -> Tensor:
        """R(pos) x for the tokens of tile t (identity without rotary)."""
        return x if self.rot is None else rotate(x, *self._cs(t))

    def unrotate(self, x: Tensor, t: Tile) -> Tensor:
        """R(pos)ᵀ x = R(−pos) x."""
        return x if self.rot is None else rotate(x, *self._cs(t), inverse=True)


def _fused_forward(src: _ProjectedTiles, B: int, N: int, plan: _Plan, put: Callable[[Tile, Tensor], None]) -> Tensor:
    """Hand gate ⊙ H to ``put`` tile by tile; returns what the backward needs besides z:
    H (B, D) in full mode, the running sum at the start of every tile (B, tiles, D) in causal mode."""
    D, cd, dev = plan.D, plan.cd, plan.rows.device
    if not plan.causal:
        H = torch.zeros(B, D, dtype=cd, device=dev)
        for b0, b1, n0, n1, _ in _tiles(B, N):
            t = (b0, b1, n0, n1)
            H[b0:b1] += plan.rotate(_horner(plan.act_fn(src.poly_part(t).to(cd)), plan.rows), t).sum(1)
        if plan.mean:
            H /= N
        for b0, b1, n0, n1, _ in _tiles(B, N):
            t = (b0, b1, n0, n1)
            s = plan.gate_ip(src.gate_part(t).to(cd) + plan.bias)
            h = H[b0:b1, None] if plan.rot is None else plan.unrotate(H[b0:b1, None].expand(b1 - b0, n1 - n0, D), t)
            put(t, _gate_times(s, h))
        return H
    ntiles = -(-N // _TILE) if N >= _TILE else 1
    carries = torch.zeros(B, ntiles, D, dtype=cd, device=dev)
    inv = 1.0 / torch.arange(1, N + 1, dtype=cd, device=dev).unsqueeze(-1)
    for b0, b1, n0, n1, j in _tiles(B, N):
        t = (b0, b1, n0, n1)
        zh, zs = src.both(t)
        c = _chunked_cumsum(plan.rotate(_horner(plan.act_fn(zh.to(cd)), plan.rows), t), reverse=False)
        if j:
            c += carries[b0:b1, j].unsqueeze(1)
        if j + 1 < ntiles:
            carries[b0:b1, j + 1] = c[:, -1]
        if plan.mean:
            c *= inv[n0:n1]
        s = plan.gate_ip(zs.to(cd) + plan.bias)
        put(t, _gate_times(s, plan.unrotate(c, t)))
    return carries


class _FusedSelfMix(torch.autograd.Function):
    """z = [W_h x; W_s x] → gate(z_s + b) ⊙ H(poly(act(z_h))), full or causal, saving only z (and rotary tables)."""

    @staticmethod
    def forward(ctx, z: Tensor, coeff: Tensor, bias: Tensor, cos: Optional[Tensor], sin: Optional[Tensor],  # type: ignore[override]
                causal: bool, act: str, gate: str, mean: bool):
        B, N, _ = z.shape
        plan = _Plan(coeff, bias, causal, act, gate, mean, None if cos is None else (cos, sin),
                     _compute_dtype(z.dtype))
        out = torch.empty(B, N, plan.D, dtype=z.dtype, device=z.device)

        def put(t: Tile, g: Tensor) -> None:
            out[t[0]:t[1], t[2]:t[3]] = g

        aux = _fused_forward(_ProjectedTiles(z, plan.D), B, N, plan, put)
        ctx.save_for_backward(z, coeff, bias, aux, cos, sin)
        ctx.cfg = (causal, act, gate, mean)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        z, coeff, bias, aux, cos, sin = ctx.saved_tensors
        causal, act, gate, mean = ctx.cfg
        B, N, _ = z.shape
        cd = _compute_dtype(z.dtype)
        plan = _Plan(coeff, bias, causal, act, gate, mean, None if cos is None else (cos, sin), cd)
        D, k = coeff.shape
        Ds = z.shape[-1] - D
        rows = plan.rows
        grad_z = torch.empty_like(z)
        grad_bias = torch.zeros(Ds, dtype=cd, device=z.device)
        grad_rows = torch.zeros(k, D, dtype=cd, device=z.device)

        def poly_grads(zh: Tensor, h: Tensor, gp: Tensor) -> Tensor:
            """Accumulate dL/dα from dL/dp and return dL/dz_h for one tile."""
            hp = h
            for p in range(k):
                grad_rows[p] += (gp * hp).sum((0, 1))
                if p + 1 < k:
                    hp = hp * h
            return _elementwise_backward(plan.act_fn, plan.act_d, zh, gp * _horner_derivative(h, rows))

        if not causal:
            H = aux  # (B, D), rotated frame
            gH = torch.zeros(B, D, dtype=cd, device=z.device)
            for b0, b1, n0, n1, _ in _tiles(B, N):
                t = (b0, b1, n0, n1)
                u = z[b0:b1, n0:n1, D:].to(cd) + plan.bias
                g = grad[b0:b1, n0:n1].to(cd)
                Hq = H[b0:b1, None] if plan.rot is None else plan.unrotate(H[b0:b1, None].expand(b1 - b0, n1 - n0, D),
                                                                          t)
                gH[b0:b1] += plan.rotate(_gate_times(plan.gate_fn(u), g), t).sum(1)
                gu = _elementwise_backward(plan.gate_fn, plan.gate_d, u, _head_sum(g * Hq, Ds))
                grad_bias += gu.sum((0, 1))
                grad_z[b0:b1, n0:n1, D:] = gu
            if mean:
                gH /= N
            for b0, b1, n0, n1, _ in _tiles(B, N):
                t = (b0, b1, n0, n1)
                zh = z[b0:b1, n0:n1, :D].to(cd)
                gp = plan.unrotate(gH[b0:b1, None].expand(b1 - b0, n1 - n0, D), t)
                grad_z[b0:b1, n0:n1, :D] = poly_grads(zh, plan.act_fn(zh), gp)
        else:
            carries = aux
            inv = 1.0 / torch.arange(1, N + 1, dtype=cd, device=z.device).unsqueeze(-1)
            suffix = torch.zeros(B, D, dtype=cd, device=z.device)
            for b0, b1, n0, n1, j in reversed(list(_tiles(B, N))):
                t = (b0, b1, n0, n1)
                zh = z[b0:b1, n0:n1, :D].to(cd)
                h = plan.act_fn(zh)
                c = _chunked_cumsum(plan.rotate(_horner(h, rows), t), reverse=False)
                if j:
                    c += carries[b0:b1, j].unsqueeze(1)
                if mean:
                    c *= inv[n0:n1]
                u = z[b0:b1, n0:n1, D:].to(cd) + plan.bias
                g = grad[b0:b1, n0:n1].to(cd)
                gu = _elementwise_backward(plan.gate_fn, plan.gate_d, u, _head_sum(g * plan.unrotate(c, t), Ds))
                grad_bias += gu.sum((0, 1))
                grad_z[b0:b1, n0:n1, D:] = gu
                gc = plan.rotate(_gate_times(plan.gate_fn(u), g), t)
                if mean:
                    gc *= inv[n0:n1]
                gp = _chunked_cumsum(gc, reverse=True)
                gp += suffix[b0:b1, None]
                suffix[b0:b1] = gp[:, 0]
                grad_z[b0:b1, n0:n1, :D] = poly_grads(zh, h, plan.unrotate(gp, t))
        return (grad_z, grad_rows.t().to(coeff.dtype), grad_bias.to(bias.dtype), None, None, None, None, None,
                None)


def _fused_eligible(x: Tensor, activation: ActivationLike, gate: ActivationLike) -> bool:
    return (
        _FUSED_ENABLED
        and x.device.type == "cpu"
        and isinstance(activation, str)
        and isinstance(gate, str)
        and not _is_compiling()
    )


def _fused_self_mix(x: Tensor, in_weight: Tensor, coeff: Tensor, bias: Tensor, out_weight: Tensor,
                    out_bias: Optional[Tensor], causal: bool, act: str, gate: str, mean: bool, rot: Rot) -> Tensor:
    """The whole self-mixing PoM on the fused CPU path (``rot``: rotary cos / sin tables of the tokens, or None)."""
    params = (in_weight, coeff, bias, out_weight) + (() if out_bias is None else (out_bias,))
    if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params)):
        z = F.linear(x, in_weight)
        cos, sin = rot if rot is not None else (None, None)
        g = _FusedSelfMix.apply(z, coeff, bias, cos, sin, causal, act, gate, mean)
        return F.linear(g, out_weight, out_bias)
    # inference: per tile, project, mix and project out while the tile is in cache. (In full mode H must be complete
    # before any gate is applied, so the W_h rows run in the first pass and the W_s rows in the second: the same
    # flops as one stacked product, and re-reading x (d wide) costs less than storing z_s (Ds wide).)
    B, N, _ = x.shape
    x = x.contiguous()
    out: List[Tensor] = []

    def put(t: Tile, g: Tensor) -> None:
        yt = F.linear(g.to(x.dtype), out_weight, out_bias)  # dtype as F.linear decides (autocast included)
        if not out:
            out.append(torch.empty(B, N, yt.shape[-1], dtype=yt.dtype, device=x.device))
        out[0][t[0]:t[1], t[2]:t[3]] = yt

    plan = _Plan(coeff, bias, causal, act, gate, mean, rot, _compute_dtype(x.dtype))
    _fused_forward(_InputTiles(x, in_weight, plan.D), B, N, plan, put)
    return out[0]


# ----------------------------------------------------------------------------------------------------------------
# Rotary positions
# ----------------------------------------------------------------------------------------------------------------


def rope_angles(
    positions: Tensor, dim: int, base: float = 10000.0, two_d: bool = False, dtype: torch.dtype = torch.float32
) -> Tuple[Tensor, Tensor]:
    """cos / sin of the rotation angles for ``dim`` channels paired (k, k + dim/2).

    Args:
        positions: (..., N) for 1-D rotary, or (..., N, 2) (row, col) with ``two_d=True``, where the first dim/4
            pairs turn with the row and the last dim/4 with the column. Integer or fractional.
    Returns:
        cos, sin of shape (..., N, dim/2) in ``dtype`` (angles are reduced modulo 2π in fp64 first, so fp32 tables
        stay exact at long range).
    """
    pos = positions.to(torch.float64)
    if two_d:
        if dim % 4 != 0:
            raise ValueError(f"2-D rotary positions need a width divisible by 4, got {dim}")
        q = dim // 4
        inv = base ** (-torch.arange(q, dtype=torch.float64, device=pos.device) / q)
        ang = torch.cat([pos[..., 0:1] * inv, pos[..., 1:2] * inv], dim=-1)
    else:
        if dim % 2 != 0:
            raise ValueError(f"1-D rotary positions need an even width, got {dim}")
        half = dim // 2
        inv = base ** (-torch.arange(half, dtype=torch.float64, device=pos.device) / half)
        ang = pos.unsqueeze(-1) * inv
    ang = torch.remainder(ang, 2.0 * math.pi).to(dtype)
    return ang.cos(), ang.sin()


def rotate(x: Tensor, cos: Tensor, sin: Tensor, inverse: bool = False) -> Tensor:
    """Rotate channel pairs (k, k + D/2) of ``x`` (…, D) by the angles whose cos/sin are given (…, D/2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos = cos.to(x.dtype)
    sin = sin.to(x.dtype)
    if inverse:
        sin = -sin
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


# ----------------------------------------------------------------------------------------------------------------
# Input checks
# ----------------------------------------------------------------------------------------------------------------


def _check_tokens(x: Tensor, dim: int, name: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() != 3:
        raise ValueError(f"{name} must have shape (batch, tokens, {dim}), got rank {x.dim()} shape {tuple(x.shape)}")
    if x.shape[-1] != dim:
        raise ValueError(f"{name} has {x.shape[-1]} features but the mixer was built for dim={dim}")
    if x.shape[1] == 0:
        raise ValueError(f"{name} is an empty sequence (shape {tuple(x.shape)}); at least one token is needed")


def _check_bool_mask(mask: Tensor, shapes: Sequence[Tuple[int, ...]], what: str) -> None:
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a bool tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor (True = the token takes part), got dtype {mask.dtype}")
    if tuple(mask.shape) not in [tuple(s) for s in shapes]:
        expected = " or ".join(str(tuple(s)) for s in shapes)
        raise ValueError(f"mask for {what} must have shape {expected}, got {tuple(mask.shape)}")


def _check_positions(pos: Tensor, B: int, N: int, two_d: bool, name: str) -> None:
    if not isinstance(pos, Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(pos).__name__}")
    tail = (N, 2) if two_d else (N,)
    ok = tuple(pos.shape) in (tail, (B,) + tail)
    if not ok:
        raise ValueError(
            f"{name} must have shape {tail} or {(B,) + tail} for {'2-D' if two_d else '1-D'} rotary, "
            f"got {tuple(pos.shape)}"
        )


def _default_positions(n: int, device: torch.device, two_d: bool, name: str) -> Tensor:
    if two_d:
        raise ValueError(f"2-D rotary needs explicit {name} of shape (N, 2) holding (row, col)")
    return torch.arange(n, device=device)


def batch_packed(x: Tensor, context: Optional[Tensor], cu_seqlens: Optional[CuSeqlens]
                 ) -> Tuple[Tensor, Optional[Tensor], bool]:
    """Packed tokens may come as (T, d): give them the batch dimension of one; the flag says to take it off again."""
    if cu_seqlens is None or not isinstance(x, Tensor) or x.dim() != 2:
        return x, context, False
    context = context.unsqueeze(0) if isinstance(context, Tensor) and context.dim() == 2 else context
    return x.unsqueeze(0), context, True


def check_mix_inputs(
    x: Tensor,
    context: Optional[Tensor],
    dim: int,
    mask: Optional[Tensor],
    causal: bool,
    block_size: Optional[int],
    cu_seqlens: Optional[CuSeqlens],
) -> Tuple[int, int, int, Optional[Tensor], Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """Validate a mixer call (shared by PoM and the attention baseline, so both reject the same inputs alike).

    Returns (B, M, N, key_mask (B, N) or None, general mask (B, M, N) or None, cu_seqlens_q or None,
    cu_seqlens_k or None); for packed self-mixing cu_seqlens_q is None and cu_seqlens_k holds the offsets.
    """
    _check_tokens(x, dim, "x")
    if context is not None:
        _check_tokens(context, dim, "context")
        if context.shape[0] != x.shape[0]:
            raise ValueError(f"context batch {context.shape[0]} does not match x batch {x.shape[0]}")
    B, M, _ = x.shape
    N = M if context is None else context.shape[1]
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if block_size is not None:
        if isinstance(block_size, bool) or not isinstance(block_size, int):
            raise TypeError(f"block_size must be an int, got {type(block_size).__name__}")
        if block_size <= 0:
            raise ValueError(f"block_size must be a positive number of tokens, got {block_size}")
        if not causal:
            raise ValueError("block_size requires causal=True (block-causal masking)")
    key_mask = general = None
    if mask is not None:
        _check_bool_mask(mask, [(B, N), (B, M, N)], f"batch {B}, {M} queries, {N} context tokens")
        key_mask, general = (mask, None) if mask.dim() == 2 else (None, mask)
    cu_q = cu_k = None
    if cu_seqlens is not None:
        if isinstance(cu_seqlens, (tuple, list)):
            if len(cu_seqlens) != 2:
                raise ValueError("cu_seqlens for cross-mixing must be a pair (cu_seqlens_q, cu_seqlens_k)")
            cu_q, cu_k = cu_seqlens
            check_cu_seqlens(cu_q, M, "cu_seqlens_q")
            check_cu_seqlens(cu_k, N, "cu_seqlens_k")
            if cu_q.numel() != cu_k.numel():
                raise ValueError(
                    f"cu_seqlens_q holds {cu_q.numel() - 1} sequences but cu_seqlens_k holds {cu_k.numel() - 1}"
                )
        else:
            if context is not None:
                raise ValueError("packed cross-mixing needs cu_seqlens=(cu_seqlens_q, cu_seqlens_k)")
            check_cu_seqlens(cu_seqlens, N)
            cu_k = cu_seqlens
        if B != 1:
            raise ValueError(f"packed sequences (cu_seqlens) need batch size 1, got {B}")
        if general is not None:
            raise ValueError("a (B, M, N) mask and cu_seqlens cannot be combined")
    return B, M, N, key_mask, general, cu_q, cu_k


# ----------------------------------------------------------------------------------------------------------------
# The whole operator
# ----------------------------------------------------------------------------------------------------------------


def pom(
    x: Tensor,
    context: Optional[Tensor],
    in_weight: Tensor,
    gate_bias: Tensor,
    coeff: Tensor,
    out_weight: Tensor,
    out_bias: Optional[Tensor] = None,
    *,
    mask: Optional[Tensor] = None,
    causal: bool = False,
    block_size: Optional[int] = None,
    cu_seqlens: Optional[CuSeqlens] = None,
    positions: Optional[Tensor] = None,
    context_positions: Optional[Tensor] = None,
    activation: ActivationLike = "leaky_clamp",
    gate: ActivationLike = "hardsigmoid",
    reduction: str = "mean",
    rope: Optional[str] = None,
    rope_base: float = 10000.0,
) -> Tensor:
    """The Polynomial Mixer: ``y = W_o (gate(W_s x + b) ⊙ agg_visible(poly(act(W_h c))))``.

    Args:
        x: (B, M, d) queries (and context when ``context`` is None). With ``cu_seqlens`` also (T, d).
        context: (B, N, d) context for cross-mixing, or None for self-mixing.
        in_weight: (D + Ds, d) — W_h stacked over W_s; self-mixing does one matrix product for both.
        gate_bias: (Ds,); coeff: (D, k); out_weight: (d, D); out_bias: (d,) or None.
        mask: (B, N) key padding or (B, M, N) general, bool, True = takes part.
        causal / block_size: causal or block-causal masking (see :func:`aggregate`).
        cu_seqlens: int32 offsets of packed sequences; a pair (cu_q, cu_k) for packed cross-mixing.
        positions / context_positions: rotary positions of queries / context tokens
            ((N,) or (B, N) for rope="1d"; (N, 2) or (B, N, 2) for rope="2d"). Default: token index (in its sequence).
        rope: None, "1d" or "2d": rotate each context token's features by its position before aggregation and
            read the aggregate in each query's own frame, so interactions depend on relative position only.

    Returns:
        (B, M, d) — or (T, d) when a 2-D packed input was given.
    """
    d = out_weight.shape[0]
    D = coeff.shape[0]
    Ds = in_weight.shape[0] - D
    if Ds <= 0 or D % Ds != 0:
        raise ValueError(f"in_weight of shape {tuple(in_weight.shape)} does not stack W_h ({D} rows) over W_s")
    x, context, squeeze = batch_packed(x, context, cu_seqlens)
    self_mix = context is None
    ctx = x if self_mix else context
    B, M, N, key_mask, general, cu_q, cu_k = check_mix_inputs(x, context, d, mask, causal, block_size, cu_seqlens)
    if rope not in (None, "1d", "2d"):
        raise ValueError(f"rope must be None, '1d' or '2d', got {rope!r}")

    # --- the fused CPU path: self-mixing, full or causal, no mask / packing (rotary allowed)
    two_d = rope == "2d"
    if (
        self_mix
        and key_mask is None
        and general is None
        and cu_k is None
        and block_size is None
        and context_positions is None
        and _fused_eligible(x, activation, gate)
    ):
        rot = None
        if rope is not None:
            if positions is None:
                positions = _default_positions(N, x.device, two_d, "positions")
            _check_positions(positions, B, N, two_d, "positions")
            rot = rope_angles(positions, D, rope_base, two_d, _compute_dtype(x.dtype))
        y = _fused_self_mix(x, in_weight, coeff, gate_bias, out_weight, out_bias, causal, activation, gate,
                            reduction == "mean", rot)
        return y.squeeze(0) if squeeze else y

    # --- projections: ONE matrix product for W_h and W_s when self-mixing
    if self_mix:
        z = F.linear(x, in_weight)
        zh, zs = z[..., :D], z[..., D:]
    else:
        zs = F.linear(x, in_weight[D:])
        zh = F.linear(ctx, in_weight[:D])

    p = poly_features(zh, coeff, activation)  # (B, N, D), accumulation dtype

    if rope is not None:
        if context_positions is None:
            context_positions = positions if (self_mix and positions is not None) else None
        kname = "positions" if self_mix else "context_positions"
        if context_positions is None:
            context_positions = _packed_local_positions(cu_k, N, x.device, two_d, kname)
        _check_positions(context_positions, B, N, two_d, kname)
        if positions is None:
            positions = _packed_local_positions(cu_q if cu_q is not None else cu_k, M, x.device, two_d, "positions")
        _check_positions(positions, B, M, two_d, "positions")
        cos_k, sin_k = rope_angles(context_positions, D, rope_base, two_d, p.dtype)
        p = rotate(p, cos_k, sin_k)

    h = aggregate(
        p,
        num_queries=M,
        key_mask=key_mask,
        mask=general,
        causal=causal,
        block_size=block_size,
        cu_seqlens=cu_k,
        cu_seqlens_q=cu_q,
        reduction=reduction,
    )
    if rope is not None:
        cos_q, sin_q = rope_angles(positions, D, rope_base, two_d, p.dtype)
        h = rotate(h.expand(B, M, D), cos_q, sin_q, inverse=True)

    g = gate_mix(zs, gate_bias, h, gate)
    y = F.linear(g, out_weight, out_bias)
    return y.squeeze(0) if squeeze else y


def _packed_local_positions(cu: Optional[Tensor], n: int, device: torch.device, two_d: bool, name: str) -> Tensor:
    pos = _default_positions(n, device, two_d, name)
    if cu is None:
        return pos
    _, start, _ = _segments(cu, n)
    return pos - start


def pom_step(
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
    rope_base: float = 10000.0,
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
    d = out_weight.shape[0]
    D = coeff.shape[0]
    _check_tokens(x, d, "x")
    B, T, _ = x.shape
    if state_sum.shape != (B, D):
        raise ValueError(
            f"state holds batch {state_sum.shape[0]} × {state_sum.shape[-1]} features but x has batch {B} and the "
            f"mixer has D={D}; index or re-initialise the state"
        )
    if mask is not None:
        _check_bool_mask(mask, [(B, T)], f"a chunk of batch {B} × {T} tokens")
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
        _check_positions(positions, B, T, two_d, "positions")
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
        h = s * _safe_inverse(cnt).unsqueeze(-1)
    if rope is not None:
        h = rotate(h.expand(B, T, D), cos, sin, inverse=True)
    g = gate_mix(zs, gate_bias, h, gate)
    y = F.linear(g, out_weight, out_bias)
    return y, new_sum, new_count, state_offset + T
