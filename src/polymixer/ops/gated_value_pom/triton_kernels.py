"""Triton kernels of the gated value PoM's scan (:func:`polymixer.ops.gated_value_pom.modular.gated_scan`).

``o_i = Σ_{j ≤ i, same segment} exp(Σ_{t=j+1..i} g_t) (q_i · k_j) v_j`` in chunks of C tokens, as the torch form:

* a states pass walks the chunks of each (row · head, key block, value block) and stores the D_h × dv_h state
  entering every chunk (fp32) — decayed by the chunk's total log-decay, restarted where a segment starts;
* an output pass gives every chunk's outputs in parallel: the state read by the queries of the segment it carries,
  decayed to each query, plus the (C × C) products ``(q kᵀ ⊙ D) v`` with D the decays within the chunk.

The backward is three more scans of the same kernels — for a scalar decay per head the gradients are scans
themselves: dq = scan(do, v, k), and dk, dv the same scan run backwards (the flipped sequence, the log-decays shifted
by one); the log-decays' gradient follows from dΛ_i = q_i · dq_i − k_i · dk_i (Λ = Σ g enters only as
exp(Λ_i) on query i and exp(−Λ_j) on key j) by a reverse cumulative sum. bf16 / fp16 operands with fp32
accumulation; exact in Triton's interpreter against the torch form (tests/test_gated_value_pom.py).

As the ``triton`` backend of ``gated_value_pom`` (:func:`supports`, :func:`forward`) it runs the features and the
readout every backend shares (:mod:`polymixer.ops.features`) around its own scan; streams (a call with a state)
keep the torch form (the kernels take no carried-in state).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
from torch import Tensor

from ..call import Call
from ..features import gated_features, mix_both_ways, readout, reverse_logs
from ..triton_common import DTYPES, dot_precision, launch, mma, offset64, pow2

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

__all__ = ["triton_gated_scan", "CHUNK", "KERNELS", "aot_builds", "supports", "forward"]

CHUNK = 64


@triton.jit
def _mma32(a, b, PREC: tl.constexpr):
    """a @ b of fp32 operands: exact in the interpreter and where PREC asks it, tf32 otherwise."""
    if PREC == "f32x" or PREC == "ieee":
        out = tl.dot(a, b, input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision="tf32")
    return out


@triton.jit
def _gstates_kernel(k_ptr, v_ptr, lg_ptr, seg_ptr, st_ptr, final_ptr, N, H, DK, DV, NC, L,
                    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    """The state entering every chunk, h (BH, NC, DK, DV) fp32, and the state after the last token."""
    bh = tl.program_id(0)
    kb = tl.program_id(1)
    vb = tl.program_id(2)
    b = bh // H
    dk = kb * BK + tl.arange(0, BK)
    dv = vb * BV + tl.arange(0, BV)
    rows = tl.arange(0, C)
    krow = k_ptr + offset64(bh, N * DK)
    vrow = v_ptr + offset64(bh, N * DV)
    grow = lg_ptr + offset64(bh, N)
    srow = seg_ptr + offset64(b, L)
    hrow = st_ptr + offset64(bh, NC * DK * DV)
    hm = (dk < DK)[:, None] & (dv < DV)[None, :]
    h = tl.zeros((BK, BV), tl.float32)
    prev = tl.full((), -2, tl.int32)
    for c in range(0, NC):
        tl.store(hrow + offset64(c, DK * DV) + dk[:, None] * DV + dv[None, :], h, mask=hm)
        n = c * C + rows
        nmask = n < N
        k = tl.load(krow + offset64(c * C, DK) + rows[:, None] * DK + dk[None, :],
                    mask=nmask[:, None] & (dk < DK)[None, :], other=0.0)
        v = tl.load(vrow + offset64(c * C, DV) + rows[:, None] * DV + dv[None, :],
                    mask=nmask[:, None] & (dv < DV)[None, :], other=0.0)
        g = tl.load(grow + c * C + rows, mask=nmask, other=0.0).to(tl.float32)
        sg = tl.load(srow + c * C + rows)
        ell = tl.cumsum(g, 0)
        total = tl.sum(g, 0)
        last = tl.load(srow + c * C + C - 1)
        first = tl.load(srow + c * C)
        w = tl.where(sg == last, tl.exp(total - ell), 0.0)
        u = mma(tl.trans((k.to(tl.float32) * w[:, None]).to(k.dtype)), v, PREC)
        keep = (first == prev) & (last == prev)
        h = h * tl.where(keep, tl.exp(total), 0.0) + u
        prev = last
    tl.store(final_ptr + offset64(bh, DK * DV) + dk[:, None] * DV + dv[None, :], h, mask=hm)


@triton.jit
def _goutput_kernel(q_ptr, k_ptr, v_ptr, lg_ptr, seg_ptr, st_ptr, o_ptr, N, H, DK, DV, NC, L,
                    C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    """Every chunk's outputs: the carried state read by the queries of its segment, decayed to each, plus the
    decayed (C × C) products within the chunk."""
    bh = tl.program_id(0)
    c = tl.program_id(1)
    vb = tl.program_id(2)
    b = bh // H
    dv = vb * BV + tl.arange(0, BV)
    rows = tl.arange(0, C)
    n = c * C + rows
    nmask = n < N
    grow = lg_ptr + offset64(bh, N)
    srow = seg_ptr + offset64(b, L)
    g = tl.load(grow + n, mask=nmask, other=0.0).to(tl.float32)
    sg = tl.load(srow + n)
    ell = tl.cumsum(g, 0)
    prev = tl.load(srow + tl.maximum(c * C - 1, 0))
    prev = tl.where(c > 0, prev, -2)
    reach = tl.where(sg == prev, tl.exp(ell), 0.0)
    qrow = q_ptr + offset64(bh, N * DK) + offset64(c * C, DK)
    krow = k_ptr + offset64(bh, N * DK) + offset64(c * C, DK)
    hrow = st_ptr + offset64(bh, NC * DK * DV) + offset64(c, DK * DV)
    scores = tl.zeros((C, C), tl.float32)
    inter = tl.zeros((C, BV), tl.float32)
    for k0 in range(0, DK, BK):
        dk = k0 + tl.arange(0, BK)
        km = nmask[:, None] & (dk < DK)[None, :]
        q = tl.load(qrow + rows[:, None] * DK + dk[None, :], mask=km, other=0.0)
        k = tl.load(krow + rows[:, None] * DK + dk[None, :], mask=km, other=0.0)
        scores += mma(q, tl.trans(k), PREC)
        s = tl.load(hrow + dk[:, None] * DV + dv[None, :], mask=(dk < DK)[:, None] & (dv < DV)[None, :], other=0.0)
        inter += _mma32(q.to(tl.float32) * reach[:, None], s, PREC)
    vis = (rows[None, :] <= rows[:, None]) & (sg[:, None] == sg[None, :])
    decay = tl.exp(tl.where(vis, ell[:, None] - ell[None, :], float("-inf")))
    v = tl.load(v_ptr + offset64(bh, N * DV) + offset64(c * C, DV) + rows[:, None] * DV + dv[None, :],
                mask=nmask[:, None] & (dv < DV)[None, :], other=0.0)
    out = mma((scores * decay).to(v.dtype), v, PREC) + inter
    tl.store(o_ptr + offset64(bh, N * DV) + offset64(c * C, DV) + rows[:, None] * DV + dv[None, :],
             out.to(o_ptr.dtype.element_ty), mask=nmask[:, None] & (dv < DV)[None, :])


def _scan(q: Tensor, k: Tensor, v: Tensor, g: Tensor, seg: Tensor, chunk: int) -> Tuple[Tensor, Tensor]:
    """(o, final state) of the forward scan on (B, H, N, ·) tensors; ``seg`` (B, N) int."""
    B, H, N, DK = q.shape
    DV = v.shape[-1]
    C = chunk
    NC = max(1, -(-N // C))
    L = NC * C
    segp = torch.cat([seg, seg[:, -1:].expand(B, L - N)], dim=1).to(torch.int32).contiguous()
    q, k, v = (t.contiguous() for t in (q, k, v))
    g = g.contiguous()
    cap = 32 if q.dtype == torch.float32 else 64  # fp32 tiles of 64 spill the states pass (polymixer kernels)
    BK, BV = min(cap, pow2(DK, 16)), min(cap, pow2(DV, 16))
    prec = dot_precision(q)
    h = torch.empty(B * H, NC, DK, DV, dtype=torch.float32, device=q.device)
    final = torch.empty(B, H, DK, DV, dtype=torch.float32, device=q.device)
    launch(_gstates_kernel, (B * H, triton.cdiv(DK, BK), triton.cdiv(DV, BV)), k, v, g, segp, h, final, N, H, DK, DV,
           NC, L, C=C, BK=BK, BV=BV, PREC=prec)
    o = torch.empty(B, H, N, DV, dtype=q.dtype, device=q.device)
    launch(_goutput_kernel, (B * H, NC, triton.cdiv(DV, BV)), q, k, v, g, segp, h, o, N, H, DK, DV, NC, L, C=C, BK=BK,
           BV=BV, PREC=prec)
    return o, final


class _GatedScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, g: Tensor, seg: Tensor, chunk: int  # type: ignore[override]
                ) -> Tensor:
        o, _ = _scan(q, k, v, g, seg, chunk)
        ctx.save_for_backward(q, k, v, g, seg)
        ctx.chunk = chunk
        return o

    @staticmethod
    def backward(ctx: Any, do: Tensor) -> Tuple[Optional[Tensor], ...]:  # type: ignore[override]
        q, k, v, g, seg = ctx.saved_tensors
        C = ctx.chunk
        do = do.contiguous()
        dq, _ = _scan(do, v, k, g, seg, C)  # Σ_{j ≤ i} D_ij (do_i · v_j) k_j
        rev = lambda t: t.flip(2)  # noqa: E731
        gr, sr = reverse_logs(g), seg.flip(1)
        dk = rev(_scan(rev(v), rev(do), rev(q), gr, sr, C)[0])  # Σ_{i ≥ j} D_ij (v_j · do_i) q_i
        dv = rev(_scan(rev(k), rev(q), rev(do), gr, sr, C)[0])  # Σ_{i ≥ j} D_ij (k_j · q_i) do_i
        dlam = (q.float() * dq.float()).sum(-1) - (k.float() * dk.float()).sum(-1)
        dg = dlam.flip(-1).cumsum(-1).flip(-1)  # Λ_i = Σ_{t ≤ i} g_t
        return dq, dk, dv, dg.to(g.dtype), None, None


def triton_gated_scan(q: Tensor, k: Tensor, v: Tensor, g: Tensor, seg: Optional[Tensor] = None,
                      chunk: int = CHUNK, state: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """:func:`~polymixer.ops.gated_value_pom.modular.gated_scan` on the Triton kernels (no carried-in state: streams
    run the torch form). Returns (o, None): the final state is not tracked for autograd here."""
    if state is not None:
        raise ValueError("the Triton gated scan takes no carried-in state (streams run the torch form)")
    if seg is None:
        seg = torch.zeros(q.shape[0], q.shape[2], dtype=torch.long, device=q.device)
    if q.is_cuda:  # the chunk does not change the result: the one the kernels were built for (polymixer kernels)
        chunk = 64 if torch.cuda.get_device_capability(q.device)[0] >= 9 else 32
    return _GatedScan.apply(q, k, v, g.float(), seg, chunk), None


def supports(call: Call) -> Optional[str]:
    """fp32 / bf16 / fp16 tensors, a power-of-two chunk of at least 16 tokens, heads of at most 128 key channels, not
    a stream (the device is checked before this module is imported: CUDA tensors, or CPU tensors under
    TRITON_INTERPRET=1 with ``backend("triton")``)."""
    if call.state is not None:
        return "a stream (state=…) runs on the torch form"
    if call.x.dtype not in DTYPES:
        return f"{call.x.dtype} is not a kernel dtype (fp32, bf16, fp16)"
    if call.chunk < 16 or call.chunk & (call.chunk - 1):
        return f"a chunk of {call.chunk} tokens (the kernels take a power of two ≥ 16)"
    if call.D // call.heads > 128:
        return f"heads of {call.D // call.heads} key channels (the kernels take ≤ 128)"
    return None


def forward(call: Call) -> Tensor:
    """Run a validated gated call: the shared features, both scans in the kernels, the shared readout."""
    q, k, vh, g, zs, seq = gated_features(call)
    o, _ = mix_both_ways(triton_gated_scan, q, k, vh, g, causal=call.causal, block_size=call.block_size, seq=seq,
                         chunk=call.chunk)
    return readout(o, zs, call.weights, call.gate)


KERNELS = {"gated_states": _gstates_kernel, "gated_output": _goutput_kernel}


def aot_builds(build: Any) -> list:
    """The gated scan's builds for ``polymixer kernels``: both kernels at their widest tile (64 × 64 in bf16 and
    fp16, 32 × 32 in fp32) — chunks of 64 for sm_90 and of 32 for sm_80, as the value PoM's kernels."""
    out = []
    for chunk, archs in ((64, (90,)), (32, (80,))):
        for dtype in ("bf16", "fp32", "fp16"):
            for kernel in KERNELS:
                tile = 32 if dtype == "fp32" else 64
                c = dict(C=chunk, BK=tile, BV=tile, PREC="tf32")
                out.append(build("gated", kernel, tuple(c.items()), dtype, 4, 255, 0, archs))
    return out
