"""The ``triton`` backend of the value-carrying PoM: its chunked causal mixing in Triton kernels.

The features (projections, token shift, polynomials, rotary) are the torch form's; the mixing
``o_i = Σ_{j visible to i} (q_i · k_j) v_j`` of causal, block-causal and packed causal calls runs here, per head, in
chunks of 32 tokens (16 with 128-channel key heads): inside a chunk the (CHUNK × CHUNK) products masked to what each
query sees (the same sequence; j ≤ i, or j's block ≤ i's), plus the carried D_h × dv_h state of the earlier chunks
for the queries of the sequence it belongs to; the state restarts where a sequence starts. One program per (batch,
head, block of 16–32 value channels) walks the chunks; the backward walks them forwards for dq and backwards (a
carried state gradient) for dk and dv, in two kernels. Products run on tensor cores in tf32 with fp32 accumulation
(fp32 "ieee" products spill registers at these tile sizes; the interpreter computes them exactly); nothing is atomic,
so results are deterministic. Full mixing (two matrix products) stays on cuBLAS through torch.

Not here (the torch form runs them, or an explicit ``backend("triton")`` raises): cross-mixing, an explicit
(B, M, N) mask, a block size that does not divide the chunk, heads wider than 128 channels, float64, streaming steps.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError as e:  # pragma: no cover - depends on the environment (the [gpu] extra)
    raise ImportError("the triton backend needs Triton: pip install 'polymixer[gpu]'") from e

from ..common import is_compiling
from . import modular

__all__ = ["supports", "forward", "self_check", "KERNELS", "launch_tiles", "CHUNK", "chunked_mix",
           "packed_chunked_mix", "default_tiles"]

CHUNK = 32
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _pow2(x: int) -> int:
    return 1 << max(4, (x - 1).bit_length())  # tl.dot needs at least 16


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def _visible(t, seg_ptr, start_ptr, row, N, K: tl.constexpr, C: tl.constexpr):
    """Within a chunk: (C queries × C keys) visibility, each token's start flag and its "open" flag (no start in
    [chunk start, token]: it reads the carried state)."""
    tm = t < N
    seg = tl.load(seg_ptr + row * N + t, mask=tm, other=-1)
    st = tl.load(start_ptr + row * N + t, mask=tm, other=0).to(tl.int32)
    blk = t // K
    vis = (seg[:, None] == seg[None, :]) & (blk[:, None] >= blk[None, :]) & tm[:, None] & tm[None, :]
    opened = tl.associative_scan(st, 0, _or) == 0
    return vis, st, opened


@triton.jit
def _vmix_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, seg_ptr, start_ptr, N, DK, DV, H,
                     K: tl.constexpr, CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
                     PREC: tl.constexpr):
    """One program per (batch·head, block of value channels): walk the chunks, carrying the state."""
    bh = tl.program_id(0)
    vb = tl.program_id(1)
    row = bh // H
    dk = tl.arange(0, BLOCK_K)
    dv = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    S = tl.zeros((BLOCK_K, BLOCK_V), dtype=tl.float32)
    for c in range(0, tl.cdiv(N, CHUNK)):
        t = c * CHUNK + tl.arange(0, CHUNK)
        tm = t < N
        km = tm[:, None] & (dk < DK)[None, :]
        vm = tm[:, None] & (dv < DV)[None, :]
        q = tl.load(q_ptr + bh * N * DK + t[:, None] * DK + dk[None, :], mask=km, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + bh * N * DK + t[:, None] * DK + dk[None, :], mask=km, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + bh * N * DV + t[:, None] * DV + dv[None, :], mask=vm, other=0.0).to(tl.float32)
        vis, st, opened = _visible(t, seg_ptr, start_ptr, row, N, K, CHUNK)
        a = tl.where(vis, tl.dot(q, tl.trans(k), input_precision=PREC), 0.0)
        o = tl.dot(a, v, input_precision=PREC)
        o += tl.where(opened[:, None], tl.dot(q, S, input_precision=PREC), 0.0)
        tl.store(o_ptr + bh * N * DV + t[:, None] * DV + dv[None, :], o, mask=vm)
        last = tl.max(tl.where(st != 0, tl.arange(0, CHUNK), -1), axis=0)
        tail = (tl.arange(0, CHUNK) >= last)[:, None]
        S = tl.where(last >= 0, 0.0, S) + tl.dot(tl.trans(tl.where(tail, k, 0.0)), v, input_precision=PREC)


@triton.jit
def _vmix_bwd_dq_kernel(k_ptr, v_ptr, do_ptr, dq_ptr, seg_ptr, start_ptr, N, DK, DV, H, NBH,
                        K: tl.constexpr, CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
                        PREC: tl.constexpr):
    """dq, walking the chunks forwards with the state recomputed; this value block's partial sum."""
    bh = tl.program_id(0)
    vb = tl.program_id(1)
    row = bh // H
    part = (vb * NBH + bh) * N * DK
    dk_ = tl.arange(0, BLOCK_K)
    dv_ = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    S = tl.zeros((BLOCK_K, BLOCK_V), dtype=tl.float32)
    for c in range(0, tl.cdiv(N, CHUNK)):
        t = c * CHUNK + tl.arange(0, CHUNK)
        tm = t < N
        km = tm[:, None] & (dk_ < DK)[None, :]
        vm = tm[:, None] & (dv_ < DV)[None, :]
        k = tl.load(k_ptr + bh * N * DK + t[:, None] * DK + dk_[None, :], mask=km, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + bh * N * DV + t[:, None] * DV + dv_[None, :], mask=vm, other=0.0).to(tl.float32)
        do = tl.load(do_ptr + bh * N * DV + t[:, None] * DV + dv_[None, :], mask=vm, other=0.0).to(tl.float32)
        vis, st, opened = _visible(t, seg_ptr, start_ptr, row, N, K, CHUNK)
        da = tl.where(vis, tl.dot(do, tl.trans(v), input_precision=PREC), 0.0)
        dq = tl.dot(da, k, input_precision=PREC)
        dq += tl.where(opened[:, None], tl.dot(do, tl.trans(S), input_precision=PREC), 0.0)
        tl.store(dq_ptr + part + t[:, None] * DK + dk_[None, :], dq, mask=km)
        last = tl.max(tl.where(st != 0, tl.arange(0, CHUNK), -1), axis=0)
        tail = (tl.arange(0, CHUNK) >= last)[:, None]
        S = tl.where(last >= 0, 0.0, S) + tl.dot(tl.trans(tl.where(tail, k, 0.0)), v, input_precision=PREC)


@triton.jit
def _vmix_bwd_dkv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, dk_ptr, dv_ptr, seg_ptr, start_ptr, N, DK, DV, H, NBH,
                         K: tl.constexpr, CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
                         PREC: tl.constexpr):
    """dk (this value block's partial sum) and dv, walking the chunks backwards with the state's gradient."""
    bh = tl.program_id(0)
    vb = tl.program_id(1)
    row = bh // H
    part = (vb * NBH + bh) * N * DK
    dk_ = tl.arange(0, BLOCK_K)
    dv_ = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    nc = tl.cdiv(N, CHUNK)
    dS = tl.zeros((BLOCK_K, BLOCK_V), dtype=tl.float32)
    for r in range(0, nc):
        c = nc - 1 - r
        t = c * CHUNK + tl.arange(0, CHUNK)
        tm = t < N
        km = tm[:, None] & (dk_ < DK)[None, :]
        vm = tm[:, None] & (dv_ < DV)[None, :]
        q = tl.load(q_ptr + bh * N * DK + t[:, None] * DK + dk_[None, :], mask=km, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + bh * N * DK + t[:, None] * DK + dk_[None, :], mask=km, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + bh * N * DV + t[:, None] * DV + dv_[None, :], mask=vm, other=0.0).to(tl.float32)
        do = tl.load(do_ptr + bh * N * DV + t[:, None] * DV + dv_[None, :], mask=vm, other=0.0).to(tl.float32)
        vis, st, opened = _visible(t, seg_ptr, start_ptr, row, N, K, CHUNK)
        last = tl.max(tl.where(st != 0, tl.arange(0, CHUNK), -1), axis=0)
        tail = (tl.arange(0, CHUNK) >= last)[:, None]
        a = tl.where(vis, tl.dot(q, tl.trans(k), input_precision=PREC), 0.0)
        dvv = tl.dot(tl.trans(a), do, input_precision=PREC)
        dvv += tl.where(tail, tl.dot(k, dS, input_precision=PREC), 0.0)
        tl.store(dv_ptr + bh * N * DV + t[:, None] * DV + dv_[None, :], dvv, mask=vm)
        da = tl.where(vis, tl.dot(do, tl.trans(v), input_precision=PREC), 0.0)
        dkk = tl.dot(tl.trans(da), q, input_precision=PREC)
        dkk += tl.where(tail, tl.dot(v, tl.trans(dS), input_precision=PREC), 0.0)
        tl.store(dk_ptr + part + t[:, None] * DK + dk_[None, :], dkk, mask=km)
        dS = tl.where(last >= 0, 0.0, dS) + tl.dot(tl.trans(tl.where(opened[:, None], q, 0.0)), do,
                                                   input_precision=PREC)


KERNELS = {"value_mix_forward": _vmix_fwd_kernel, "value_mix_backward_dq": _vmix_bwd_dq_kernel,
           "value_mix_backward_dkv": _vmix_bwd_dkv_kernel}


def launch_tiles() -> List[Tuple[int, int, int, int]]:
    """Every (CHUNK, BLOCK_K, BLOCK_V, warps) the launches can take (:func:`_tiles` of every head width)."""
    return sorted({_tiles(dk, dv) for dk in (16, 32, 64, 128) for dv in (16, 32, 64, 128)})


def default_tiles() -> Tuple[int, int, int, int]:
    """The tiles of the most common head: 64 key × 64 value channels."""
    return _tiles(64, 64)


def _warps(bk: int, bv: int) -> int:
    return 8


def _precision(t: Tensor) -> str:
    """The products' precision: tf32 tensor cores on a GPU (fp32 accumulation, ~1e-3 relative, as PyTorch's
    ``allow_tf32`` matmuls; "ieee" fp32 does not fit the registers), exact fp32 in the interpreter."""
    return "tf32" if t.device.type == "cuda" else "ieee"


def _tiles(DK: int, DV: int) -> Tuple[int, int, int, int]:
    """(CHUNK, BLOCK_K, BLOCK_V, warps) of a launch: key channels whole (a power of two ≥ 16), value channels in blocks
    of 32 (16 with 64 or more key channels), chunks of 32 tokens (16 with 128 key channels) — the sizes that build
    for sm_80 and sm_90 without register spills (``polymixer kernels``)."""
    bk = _pow2(DK)
    bv = min(16 if bk >= 64 else 32, _pow2(DV))
    return (CHUNK if bk <= 64 else CHUNK // 2), bk, bv, _warps(bk, bv)


class _ChunkedMix(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, seg: Tensor, start: Tensor, K: int) -> Tensor:  # type: ignore[override]
        B, H, N, DK = q.shape
        DV = v.shape[-1]
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        o = torch.empty(B, H, N, DV, dtype=torch.float32, device=q.device)
        chunk, bk, bv, nw = _tiles(DK, DV)
        _vmix_fwd_kernel[(B * H, -(-DV // bv))](q, k, v, o, seg, start, N, DK, DV, H, K=K, CHUNK=chunk, BLOCK_K=bk,
                                                BLOCK_V=bv, PREC=_precision(q), num_warps=nw)
        ctx.save_for_backward(q, k, v, seg, start)
        ctx.K = K
        return o.to(q.dtype)

    @staticmethod
    def backward(ctx, do: Tensor):  # type: ignore[override]
        q, k, v, seg, start = ctx.saved_tensors
        B, H, N, DK = q.shape
        DV = v.shape[-1]
        chunk, bk, bv, nw = _tiles(DK, DV)
        nv = -(-DV // bv)
        dq = torch.empty(nv, B, H, N, DK, dtype=torch.float32, device=q.device)
        dk = torch.empty_like(dq)
        dv = torch.empty(B, H, N, DV, dtype=torch.float32, device=q.device)
        do = do.contiguous()
        kw = dict(K=ctx.K, CHUNK=chunk, BLOCK_K=bk, BLOCK_V=bv, PREC=_precision(q), num_warps=nw)
        _vmix_bwd_dq_kernel[(B * H, nv)](k, v, do, dq, seg, start, N, DK, DV, H, B * H, **kw)
        _vmix_bwd_dkv_kernel[(B * H, nv)](q, k, v, do, dk, dv, seg, start, N, DK, DV, H, B * H, **kw)
        return dq.sum(0).to(q.dtype), dk.sum(0).to(k.dtype), dv.to(v.dtype), None, None, None


def chunked_mix(q: Tensor, k: Tensor, v: Tensor, w: Tensor, *, causal: bool = False,
                block_size: Optional[int] = None, mask: Optional[Tensor] = None, chunk: int = CHUNK,
                state: Optional[Tensor] = None, count: Optional[Tensor] = None
                ) -> Tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
    """:func:`polymixer.ops.value_pom.modular.value_mix` with the (block-)causal mixing in the kernels (full mixing,
    a general mask and streaming state stay in torch). The final state is not formed (None): parallel calls do not
    use it."""
    if mask is not None or not causal or state is not None:
        return modular.value_mix(q, k, v, w, causal=causal, block_size=block_size, mask=mask, chunk=chunk,
                                 state=state, count=count)
    B, H, M, _ = q.shape
    N = k.shape[2]
    K = 1 if block_size is None else block_size
    seg = torch.zeros(B, N, dtype=torch.int32, device=q.device)
    start = torch.zeros(B, N, dtype=torch.int32, device=q.device)
    start[:, 0] = 1
    o = _ChunkedMix.apply(q, k, v, seg, start, K)
    L = -(-N // K) * K
    wp = torch.nn.functional.pad(w, (0, L - N))
    cnt = torch.cumsum(wp.view(B, L // K, K).sum(-1), dim=1).repeat_interleave(K, dim=1)[:, :M]
    return o[:, :, :M], cnt.to(q.dtype), None, None


def packed_chunked_mix(q: Tensor, k: Tensor, v: Tensor, w: Tensor, first: Tensor, chunk: int = CHUNK
                       ) -> Tuple[Tensor, Tensor]:
    """:func:`polymixer.ops.value_pom.modular.packed_causal_mix` in the kernels: the sequences of the packed stream
    mix in place, the state restarting at each one's first token."""
    T = q.shape[2]
    seg = first.to(torch.int32).unsqueeze(0).contiguous()
    start = (first == torch.arange(T, device=q.device)).to(torch.int32).unsqueeze(0).contiguous()
    o = _ChunkedMix.apply(q, k, v, seg, start, 1)
    cw = torch.cumsum(w[0].to(torch.float64), dim=0)
    cnt = cw - (cw - w[0].to(torch.float64))[first]
    return o, cnt.to(q.dtype).unsqueeze(0)


def supports(call: Any) -> Optional[str]:
    """Causal, block-causal (a block size dividing the chunk: 32 tokens, 16 with 128-channel key heads) and packed
    causal self-mixing, key padding and
    rotary included, heads up to 128 key and value channels, fp32 / bf16 / fp16; full mixing as two matrix
    products. CUDA tensors (CPU tensors under TRITON_INTERPRET=1 with ``backend("triton")``)."""
    x = call.x
    if x.dtype not in DTYPES:
        return f"{x.dtype} is not a kernel dtype (fp32, bf16, fp16)"
    if not call.self_mix:
        return "cross-mixing is not in the kernels"
    mask = call.get("mask")
    if mask is not None and mask.dim() == 3:
        return "an explicit (B, M, N) mask is not in the kernels (quadratic)"
    bs = call.get("block_size")
    if call.get("cu_seqlens") is not None and not (call.get("causal") and bs is None):
        return "packed sequences mix in the kernels causally only"
    args = dict(zip(("x", "context", "in_weight", "gate_bias", "coeff", "coeff_q", "shift_weight", "norm_weight",
                     "out_weight"), call.args))
    args.update({k: v for k, v in call.kwargs.items() if k in args})
    heads = call.get("heads", 1)
    D, dv = args["coeff"].shape[0], args["out_weight"].shape[1]
    if D // heads > 128 or dv // heads > 128:
        return f"heads of {D // heads} key and {dv // heads} value channels (the kernels take ≤ 128)"
    chunk = _tiles(D // heads, dv // heads)[0]
    if bs is not None and chunk % bs:
        return f"block size {bs} does not divide the chunk of {chunk} tokens"
    if is_compiling():
        return "torch.compile traces the torch form"
    if x.device.type == "cuda":
        return self_check(x.device)
    return None


_CHECKED: Dict[Any, Optional[str]] = {}


def self_check(device: torch.device) -> Optional[str]:
    """At first use on a GPU: a small value-carrying PoM (causal, block-causal, packed) forward and backward on the
    kernels against the torch form on that GPU, once per device per process; None when they agree within the tf32
    tolerance, else the reason (the automatic choice then falls back to the torch form, with a warning)."""
    key = (device.type, device.index)
    if key in _CHECKED:
        return _CHECKED[key]
    _CHECKED[key] = None  # while checking, the kernels are taken (the check calls them)
    import warnings

    from .. import dispatch
    from . import value_pom

    try:
        gen = torch.Generator(device="cpu").manual_seed(0)
        d, D, dv, H, N = 32, 64, 32, 2, 100
        rnd = lambda *s: torch.randn(*s, generator=gen).to(device)  # noqa: E731
        weights = [rnd(2 * D + dv + dv, d) / d ** 0.5, rnd(dv), rnd(D, 2).clamp(-1, 1), rnd(D, 2).clamp(-1, 1),
                   torch.full((2, D + dv), 0.5, device=device), torch.ones(dv, device=device), rnd(d, dv) / dv ** 0.5]
        x = rnd(1, N, d)
        cu = torch.tensor([0, 30, 31, 100], dtype=torch.int32, device=device)
        worst = 0.0
        for kw in (dict(causal=True), dict(causal=True, block_size=4), dict(causal=True, cu_seqlens=cu)):
            outs = []
            for name in ("triton", "torch"):
                xs = x.clone().requires_grad_()
                ws = [w.clone().requires_grad_() for w in weights]
                with dispatch.backend(name):
                    y = value_pom(xs, None, *ws, heads=H, **kw)
                y.square().sum().backward()
                outs.append([y.detach(), xs.grad] + [w.grad for w in ws])
            for a, b in zip(*outs):
                worst = max(worst, float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)))
        if not worst <= 5e-3:
            raise AssertionError(f"relative difference {worst:.2e} > 5e-3")
    except Exception as e:  # a failed launch or a wrong result: the torch form runs instead
        _CHECKED[key] = f"the kernels failed their first-use check on {device}: {type(e).__name__}: {e}"
        warnings.warn(f"polymixer: {_CHECKED[key]}; the value PoM runs on the torch form", RuntimeWarning,
                      stacklevel=2)
    return _CHECKED[key]


def forward(call: Any) -> Tensor:
    """The torch form's value-carrying PoM with its chunked mixing in the kernels."""
    return modular.value_pom(*call.args, **call.kwargs, mix=chunked_mix, packed_mix=packed_chunked_mix)

