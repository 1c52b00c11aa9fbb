"""The ``triton`` backend of the value-carrying PoM: its mixing ``o_i = Σ_{j visible to i} (q_i · k_j) v_j`` in the
chunked form of current linear-attention kernels (flash-linear-attention's ``chunk``), as PyTorch custom ops.

The features (projections, token shift, polynomials, rotary) are the torch form's. The mixing runs in chunks of
``CHUNK`` = 64 tokens:

* an inter-chunk pass walks the chunks of each (row, head) and stores the D_h × dv_h state entering every chunk
  (fp32), restarting where a sequence starts; one program per (row · head, key block, value block);
* a parallel intra-chunk pass gives every chunk's outputs: ``q·h`` for the queries of the carried sequence, plus the
  (C × C) products ``(q kᵀ ⊙ M) v`` masked to what each query sees; bf16 / fp16 operands with fp32 accumulation;
* the backward recomputes the states, walks backwards for the states' gradients, and gives dv and (dq, dk) in two
  parallel passes whose loops over value (key) blocks run inside the kernel: no partial copies to sum.

Modes: causal (j ≤ i), and the end-token modes — block-causal (j up to the end of i's block) and full — as the
causal part plus a strictly-later part within i's group (block or sequence), carried by a second state walked
backwards; every mode also packed (``cu_seqlens``: the states restart at each sequence). Full mixing of unpacked
rows stays two cuBLAS products. Nothing is atomic: results are deterministic.

Not here (the torch form runs them, or an explicit ``backend("triton")`` raises): cross-mixing, an explicit
(B, M, N) mask, heads wider than 128 key or value channels, float64, streaming steps.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from ..triton_common import (
    DTYPES,
    check_runs,
    dot_precision,
    first_use,
    kernel_op,
    launch,
    mma,
    offset64,
    or_,
    pow2,
    sequence_of,
    judge_check,
)
from . import modular

import triton  # noqa: E402  (triton_common raised a clear ImportError already if it is missing)
import triton.language as tl  # noqa: E402

__all__ = ["supports", "forward", "self_check", "KERNELS", "CHUNK", "chunked_mix", "packed_chunked_mix",
           "launch_tiles", "default_tiles", "aot_builds", "value_mix_op"]

CHUNK = 64
MAXNREG = 255  # ptxas may use every register a 4-warp block can have (≥ 2 blocks per SM) before it spills
STAGES = 2  # software pipelining of the loops over key / value blocks (3 stages take more shared memory than fits)


# ----------------------------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _flags(n, nmask, seqid_ptr, cu_ptr, N, BS, PACKED: tl.constexpr, MODE: tl.constexpr):
    """Per token: its sequence id, sequence start flag, group start flag and group index (groups: blocks of BS
    tokens of its sequence for MODE 2, the sequence for MODE 1)."""
    sid, s0, s1 = sequence_of(n, nmask, seqid_ptr, cu_ptr, N, PACKED)
    start = (n == s0) & nmask
    if MODE == 2:
        gid = (n - s0) // BS
        gstart = ((n - s0) % BS == 0) & nmask
    else:
        gid = n * 0
        gstart = start
    return sid, start, gstart, gid


@triton.jit
def _visible(rows, nmask, sid, gid, MODE: tl.constexpr):
    """(queries × keys) within a chunk: the same sequence, and j ≤ i — or, in the end-token modes, j in i's group."""
    same = (sid[:, None] == sid[None, :]) & nmask[:, None] & nmask[None, :]
    before = rows[None, :] <= rows[:, None]
    if MODE == 0:
        vis = same & before
    elif MODE == 1:
        vis = same
    else:
        vis = same & (before | (gid[:, None] == gid[None, :]))
    return vis


@triton.jit
def _open_rows(start, gstart, rows, C: tl.constexpr):
    """(rows that read the state carried in from the left — no sequence start at or before them in the chunk —,
    rows that read the state carried in from the right — no group start after them in the chunk)."""
    left = tl.associative_scan(start.to(tl.int32), 0, or_) == 0
    lastg = tl.max(tl.where(gstart, rows, -1), axis=0)
    return left, rows >= lastg


@triton.jit
def _states_kernel(k_ptr, v_ptr, seqid_ptr, cu_ptr, h_ptr, N, H, DK, DV, NC, BS,
                   PACKED: tl.constexpr, MODE: tl.constexpr, REV: tl.constexpr, C: tl.constexpr,
                   BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    """The inter-chunk pass: the state entering every chunk, h_c = Σ kᵀ v over the earlier tokens of the sequence
    the chunk starts in (REV: the later tokens of the group the chunk ends in), fp32 (BH, NC, DK, DV)."""
    bh = tl.program_id(0)
    kb = tl.program_id(1)
    vb = tl.program_id(2)
    dk = kb * BK + tl.arange(0, BK)
    dv = vb * BV + tl.arange(0, BV)
    rows = tl.arange(0, C)
    krow = k_ptr + offset64(bh, N * DK)
    vrow = v_ptr + offset64(bh, N * DV)
    hrow = h_ptr + offset64(bh, NC * DK * DV)
    hm = (dk < DK)[:, None] & (dv < DV)[None, :]
    h = tl.zeros((BK, BV), tl.float32)
    for i in range(0, NC):
        if REV:
            c = NC - 1 - i
        else:
            c = i
        tl.store(hrow + offset64(c, DK * DV) + dk[:, None] * DV + dv[None, :], h, mask=hm)
        n = c * C + rows
        nmask = n < N
        k = tl.load(krow + offset64(c * C, DK) + rows[:, None] * DK + dk[None, :],
                    mask=nmask[:, None] & (dk < DK)[None, :], other=0.0)
        v = tl.load(vrow + offset64(c * C, DV) + rows[:, None] * DV + dv[None, :],
                    mask=nmask[:, None] & (dv < DV)[None, :], other=0.0)
        _, start, gstart, _ = _flags(n, nmask, seqid_ptr, cu_ptr, N, BS, PACKED, MODE)
        if REV:  # the chunk's tokens before its first group start continue the group of the chunk before
            first = tl.min(tl.where(gstart, rows, C), axis=0)
            part = rows < first
            h = tl.where(first < C, 0.0, h) + mma(tl.trans(tl.where(part[:, None], k, 0.0)), v, PREC)
        else:  # its tokens from its last sequence start on are carried into the next chunk
            last = tl.max(tl.where(start, rows, -1), axis=0)
            part = (rows >= last) & nmask
            h = tl.where(last >= 0, 0.0, h) + mma(tl.trans(tl.where(part[:, None], k, 0.0)), v, PREC)


@triton.jit
def _output_kernel(q_ptr, k_ptr, v_ptr, h_ptr, r_ptr, o_ptr, seqid_ptr, cu_ptr, N, H, DK, DV, NC, BS,
                   PACKED: tl.constexpr, MODE: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                   NK: tl.constexpr, PREC: tl.constexpr):
    """The intra-chunk pass, one program per (row · head, chunk, value block): o = (q kᵀ ⊙ M) v + q·h (queries of
    the carried sequence) + q·r (end modes: queries whose group goes on after the chunk)."""
    bh = tl.program_id(0)
    c = tl.program_id(1)
    vb = tl.program_id(2)
    rows = tl.arange(0, C)
    n = c * C + rows
    nmask = n < N
    dv = vb * BV + tl.arange(0, BV)
    vmask = dv < DV
    qc = q_ptr + offset64(bh, N * DK) + offset64(c * C, DK)
    kc = k_ptr + offset64(bh, N * DK) + offset64(c * C, DK)
    hc = h_ptr + offset64(bh, NC * DK * DV) + offset64(c, DK * DV)
    rc = r_ptr + offset64(bh, NC * DK * DV) + offset64(c, DK * DV)
    sid, start, gstart, gid = _flags(n, nmask, seqid_ptr, cu_ptr, N, BS, PACKED, MODE)
    left, right = _open_rows(start, gstart, rows, C)
    a = tl.zeros((C, C), tl.float32)
    for kb in range(NK):  # the scores first, then the states: fewer tiles alive at once
        dk = kb * BK + tl.arange(0, BK)
        km = nmask[:, None] & (dk < DK)[None, :]
        q = tl.load(qc + rows[:, None] * DK + dk[None, :], mask=km, other=0.0)
        k = tl.load(kc + rows[:, None] * DK + dk[None, :], mask=km, other=0.0)
        a += mma(q, tl.trans(k), PREC)
    v = tl.load(v_ptr + offset64(bh, N * DV) + offset64(c * C, DV) + rows[:, None] * DV + dv[None, :],
                mask=nmask[:, None] & vmask[None, :], other=0.0)
    a = tl.where(_visible(rows, nmask, sid, gid, MODE), a, 0.0)
    o = mma(a.to(v.dtype), v, PREC)
    for kb in range(NK):
        dk = kb * BK + tl.arange(0, BK)
        km = nmask[:, None] & (dk < DK)[None, :]
        q = tl.load(qc + rows[:, None] * DK + dk[None, :], mask=km, other=0.0)
        hm = (dk < DK)[:, None] & vmask[None, :]
        h = tl.load(hc + dk[:, None] * DV + dv[None, :], mask=hm, other=0.0).to(q.dtype)
        o += tl.where(left[:, None], mma(q, h, PREC), 0.0)
        if MODE != 0:
            r = tl.load(rc + dk[:, None] * DV + dv[None, :], mask=hm, other=0.0).to(q.dtype)
            o += tl.where(right[:, None], mma(q, r, PREC), 0.0)
    tl.store(o_ptr + offset64(bh, N * DV) + offset64(c * C, DV) + rows[:, None] * DV + dv[None, :],
             o.to(o_ptr.dtype.element_ty), mask=nmask[:, None] & vmask[None, :])


@triton.jit
def _dstates_kernel(q_ptr, do_ptr, seqid_ptr, cu_ptr, dh_ptr, N, H, DK, DV, NC, BS,
                    PACKED: tl.constexpr, MODE: tl.constexpr, REV: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                    BV: tl.constexpr, PREC: tl.constexpr):
    """The states' gradients, walking the other way: dh_c = Σ qᵀ do over the chunk's queries that read h_c, plus
    dh_{c+1} when no sequence starts in chunk c (REV: the group states, dr_c, walking forwards)."""
    bh = tl.program_id(0)
    kb = tl.program_id(1)
    vb = tl.program_id(2)
    dk = kb * BK + tl.arange(0, BK)
    dv = vb * BV + tl.arange(0, BV)
    rows = tl.arange(0, C)
    qrow = q_ptr + offset64(bh, N * DK)
    dorow = do_ptr + offset64(bh, N * DV)
    hrow = dh_ptr + offset64(bh, NC * DK * DV)
    hm = (dk < DK)[:, None] & (dv < DV)[None, :]
    g = tl.zeros((BK, BV), tl.float32)
    for i in range(0, NC):
        if REV:
            c = i
        else:
            c = NC - 1 - i
        n = c * C + rows
        nmask = n < N
        q = tl.load(qrow + offset64(c * C, DK) + rows[:, None] * DK + dk[None, :],
                    mask=nmask[:, None] & (dk < DK)[None, :], other=0.0)
        do = tl.load(dorow + offset64(c * C, DV) + rows[:, None] * DV + dv[None, :],
                     mask=nmask[:, None] & (dv < DV)[None, :], other=0.0)
        _, start, gstart, _ = _flags(n, nmask, seqid_ptr, cu_ptr, N, BS, PACKED, MODE)
        left, right = _open_rows(start, gstart, rows, C)
        if REV:
            flow = tl.max(gstart.to(tl.int32), axis=0) == 0  # no group start in the chunk: dr_{c-1} reaches r_c
            g = tl.where(flow, g, 0.0) + mma(tl.trans(tl.where(right[:, None], q, 0.0)), do, PREC)
        else:
            flow = tl.max(start.to(tl.int32), axis=0) == 0  # no sequence start in the chunk: h_c reaches h_{c+1}
            g = tl.where(flow, g, 0.0) + mma(tl.trans(tl.where(left[:, None], q, 0.0)), do, PREC)
        tl.store(hrow + offset64(c, DK * DV) + dk[:, None] * DV + dv[None, :], g, mask=hm)


@triton.jit
def _dv_kernel(q_ptr, k_ptr, do_ptr, dh_ptr, dr_ptr, dv_ptr, seqid_ptr, cu_ptr, N, H, DK, DV, NC, BS,
               PACKED: tl.constexpr, MODE: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
               NK: tl.constexpr, PREC: tl.constexpr):
    """dv of a chunk's value block: (q kᵀ ⊙ M)ᵀ do, plus k·dh_{c+1} for the tokens carried into the next chunk, plus
    k·dr_{c−1} (end modes) for those carried into the previous one; the loop over key blocks inside."""
    bh = tl.program_id(0)
    c = tl.program_id(1)
    vb = tl.program_id(2)
    rows = tl.arange(0, C)
    n = c * C + rows
    nmask = n < N
    dv = vb * BV + tl.arange(0, BV)
    vmask = dv < DV
    qc = q_ptr + offset64(bh, N * DK) + offset64(c * C, DK)
    kc = k_ptr + offset64(bh, N * DK) + offset64(c * C, DK)
    sid, start, gstart, gid = _flags(n, nmask, seqid_ptr, cu_ptr, N, BS, PACKED, MODE)
    last = tl.max(tl.where(start, rows, -1), axis=0)
    tail = (rows >= last) & nmask & (rows * 0 + c + 1 < NC)
    first = tl.min(tl.where(gstart, rows, C), axis=0)
    head = (rows < first) & (rows * 0 + c > 0)
    a = tl.zeros((C, C), tl.float32)
    for kb in range(NK):  # the scores first, then the states: fewer tiles alive at once
        dk = kb * BK + tl.arange(0, BK)
        km = nmask[:, None] & (dk < DK)[None, :]
        q = tl.load(qc + rows[:, None] * DK + dk[None, :], mask=km, other=0.0)
        k = tl.load(kc + rows[:, None] * DK + dk[None, :], mask=km, other=0.0)
        a += mma(q, tl.trans(k), PREC)
    do = tl.load(do_ptr + offset64(bh, N * DV) + offset64(c * C, DV) + rows[:, None] * DV + dv[None, :],
                 mask=nmask[:, None] & vmask[None, :], other=0.0)
    a = tl.where(_visible(rows, nmask, sid, gid, MODE), a, 0.0)
    acc = mma(tl.trans(a.to(do.dtype)), do, PREC)
    for kb in range(NK):
        dk = kb * BK + tl.arange(0, BK)
        km = nmask[:, None] & (dk < DK)[None, :]
        k = tl.load(kc + rows[:, None] * DK + dk[None, :], mask=km, other=0.0)
        hm = (dk < DK)[:, None] & vmask[None, :] & (dk * 0 + c + 1 < NC)[:, None]
        dh = tl.load(dh_ptr + offset64(bh, NC * DK * DV) + offset64(c + 1, DK * DV) + dk[:, None] * DV + dv[None, :],
                     mask=hm, other=0.0).to(k.dtype)
        acc += tl.where(tail[:, None], mma(k, dh, PREC), 0.0)
        if MODE != 0:
            rm = (dk < DK)[:, None] & vmask[None, :] & (dk * 0 + c > 0)[:, None]
            dr = tl.load(dr_ptr + offset64(bh, NC * DK * DV) + offset64(c - 1, DK * DV) + dk[:, None] * DV
                         + dv[None, :], mask=rm, other=0.0).to(k.dtype)
            acc += tl.where(head[:, None], mma(k, dr, PREC), 0.0)
    tl.store(dv_ptr + offset64(bh, N * DV) + offset64(c * C, DV) + rows[:, None] * DV + dv[None, :],
             acc.to(dv_ptr.dtype.element_ty), mask=nmask[:, None] & vmask[None, :])


@triton.jit
def _dqk_kernel(q_ptr, k_ptr, v_ptr, do_ptr, h_ptr, r_ptr, dh_ptr, dr_ptr, out_ptr, seqid_ptr, cu_ptr,
                N, H, DK, DV, NC, BS, PACKED: tl.constexpr, MODE: tl.constexpr, DQ: tl.constexpr, C: tl.constexpr,
                BK: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr, PREC: tl.constexpr):
    """dq (DQ) or dk of a chunk's key block, the loop over value blocks inside: dA = (do vᵀ) ⊙ M, then dq = dA k +
    do hᵀ (+ do rᵀ) or dk = dAᵀ q + v dh_{c+1}ᵀ (+ v dr_{c−1}ᵀ). One launch each: fewer tiles alive at once."""
    bh = tl.program_id(0)
    c = tl.program_id(1)
    kb = tl.program_id(2)
    rows = tl.arange(0, C)
    n = c * C + rows
    nmask = n < N
    dk = kb * BK + tl.arange(0, BK)
    kmask = dk < DK
    km = nmask[:, None] & kmask[None, :]
    sid, start, gstart, gid = _flags(n, nmask, seqid_ptr, cu_ptr, N, BS, PACKED, MODE)
    left, right = _open_rows(start, gstart, rows, C)
    last = tl.max(tl.where(start, rows, -1), axis=0)
    tail = (rows >= last) & nmask & (rows * 0 + c + 1 < NC)
    first = tl.min(tl.where(gstart, rows, C), axis=0)
    head = (rows < first) & (rows * 0 + c > 0)
    srow = offset64(bh, NC * DK * DV)
    dorow = do_ptr + offset64(bh, N * DV) + offset64(c * C, DV)
    vrow = v_ptr + offset64(bh, N * DV) + offset64(c * C, DV)
    da = tl.zeros((C, C), tl.float32)
    for vb in range(NV):  # dA first, then the states
        dv = vb * BV + tl.arange(0, BV)
        vm = nmask[:, None] & (dv < DV)[None, :]
        do = tl.load(dorow + rows[:, None] * DV + dv[None, :], mask=vm, other=0.0)
        v = tl.load(vrow + rows[:, None] * DV + dv[None, :], mask=vm, other=0.0)
        da += mma(do, tl.trans(v), PREC)
    loc = offset64(bh, N * DK) + offset64(c * C, DK) + rows[:, None] * DK + dk[None, :]
    if DQ:
        k = tl.load(k_ptr + loc, mask=km, other=0.0)
        da = tl.where(_visible(rows, nmask, sid, gid, MODE), da, 0.0).to(k.dtype)
        acc = mma(da, k, PREC)
    else:
        q = tl.load(q_ptr + loc, mask=km, other=0.0)
        da = tl.where(_visible(rows, nmask, sid, gid, MODE), da, 0.0).to(q.dtype)
        acc = mma(tl.trans(da), q, PREC)
    for vb in range(NV):
        dv = vb * BV + tl.arange(0, BV)
        vm = nmask[:, None] & (dv < DV)[None, :]
        hm = kmask[:, None] & (dv < DV)[None, :]
        sloc = dk[:, None] * DV + dv[None, :]
        if DQ:  # the queries read h (and r): their gradient is do hᵀ
            do = tl.load(dorow + rows[:, None] * DV + dv[None, :], mask=vm, other=0.0)
            h = tl.load(h_ptr + srow + offset64(c, DK * DV) + sloc, mask=hm, other=0.0).to(do.dtype)
            acc += tl.where(left[:, None], mma(do, tl.trans(h), PREC), 0.0)
            if MODE != 0:
                r = tl.load(r_ptr + srow + offset64(c, DK * DV) + sloc, mask=hm, other=0.0).to(do.dtype)
                acc += tl.where(right[:, None], mma(do, tl.trans(r), PREC), 0.0)
        else:  # the keys feed h_{c+1} (and r_{c−1}): their gradient is v dhᵀ
            v = tl.load(vrow + rows[:, None] * DV + dv[None, :], mask=vm, other=0.0)
            dh = tl.load(dh_ptr + srow + offset64(c + 1, DK * DV) + sloc,
                         mask=hm & (dk * 0 + c + 1 < NC)[:, None], other=0.0).to(v.dtype)
            acc += tl.where(tail[:, None], mma(v, tl.trans(dh), PREC), 0.0)
            if MODE != 0:
                dr = tl.load(dr_ptr + srow + offset64(c - 1, DK * DV) + sloc,
                             mask=hm & (dk * 0 + c > 0)[:, None], other=0.0).to(v.dtype)
                acc += tl.where(head[:, None], mma(v, tl.trans(dr), PREC), 0.0)
    tl.store(out_ptr + loc, acc.to(out_ptr.dtype.element_ty), mask=km)


KERNELS = {"value_states": _states_kernel, "value_output": _output_kernel, "value_dstates": _dstates_kernel,
           "value_dv": _dv_kernel, "value_dqk": _dqk_kernel}


# ----------------------------------------------------------------------------------------------------------------
# tiles and the op bodies
# ----------------------------------------------------------------------------------------------------------------


def _tiles(DK: int, DV: int, device: Optional[torch.device] = None) -> Tuple[int, int, int, int]:
    """(CHUNK, BLOCK_K, BLOCK_V, warps) of a head of DK key and DV value channels: blocks of at most 64 channels
    (tl.dot needs 16), 4 warps, and chunks of ``CHUNK`` = 64 tokens — 32 on GPUs before sm_90, where the chunk's
    (C × C) products of the end-token modes spill registers at 64 (``polymixer kernels``)."""
    chunk = CHUNK
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        if torch.cuda.get_device_capability(device)[0] < 9:
            chunk = min(chunk, 32)
    return chunk, min(64, pow2(DK, 16)), min(64, pow2(DV, 16)), 4


def launch_tiles() -> List[Tuple[int, int, int, int]]:
    """Every (CHUNK, BLOCK_K, BLOCK_V, warps) the launches can take."""
    return sorted({(c, *_tiles(dk, dv)[1:]) for dk in (16, 32, 64, 128) for dv in (16, 32, 64, 128)
                   for c in (CHUNK, 32)})


def default_tiles() -> Tuple[int, int, int, int]:
    """The tiles of the most common head: 64 key × 64 value channels."""
    return _tiles(64, 64)


def _prec(t: Tensor) -> str:
    return dot_precision(t)


def _opts(warps: int) -> Dict[str, int]:
    """The launch options of every value kernel."""
    return dict(num_warps=warps, num_stages=STAGES, maxnreg=MAXNREG)


def _meta(q: Tensor, v: Tensor) -> Tuple[int, int, int, int, int, int, int, int, int, int]:
    B, H, N, DK = q.shape
    DV = v.shape[-1]
    C, BK, BV, nw = _tiles(DK, DV, q.device)
    NC = -(-N // C)
    return B * H, H, N, DK, DV, NC, C, BK, BV, nw


def _states(k: Tensor, v: Tensor, seqid: Optional[Tensor], cu: Optional[Tensor], mode: int, bs: int,
            rev: bool) -> Tensor:
    BH, H, N, DK, DV, NC, C, BK, BV, nw = _meta(k, v)
    h = torch.empty(BH, NC, DK, DV, dtype=torch.float32, device=k.device)
    dummy = k
    launch(_states_kernel, (BH, -(-DK // BK), -(-DV // BV)), k, v, seqid if seqid is not None else dummy,
           cu if cu is not None else dummy, h, N, H, DK, DV, NC, bs, PACKED=cu is not None, MODE=mode, REV=rev, C=C,
           BK=BK, BV=BV, PREC=_prec(k), **_opts(nw))
    return h


def _mix(q: Tensor, k: Tensor, v: Tensor, cu: Optional[Tensor], seqid: Optional[Tensor], mode: int,
         block_size: int) -> Tensor:
    BH, H, N, DK, DV, NC, C, BK, BV, nw = _meta(q, v)
    h = _states(k, v, seqid, cu, mode, block_size, False)
    r = _states(k, v, seqid, cu, mode, block_size, True) if mode != 0 else h
    o = torch.empty(q.shape[0], H, N, DV, dtype=q.dtype, device=q.device)
    launch(_output_kernel, (BH, NC, -(-DV // BV)), q, k, v, h, r, o, seqid if seqid is not None else q,
           cu if cu is not None else q, N, H, DK, DV, NC, block_size, PACKED=cu is not None, MODE=mode, C=C, BK=BK,
           BV=BV, NK=-(-DK // BK), PREC=_prec(q), **_opts(nw))
    return o


def _mix_fake(q: Tensor, k: Tensor, v: Tensor, cu: Optional[Tensor], seqid: Optional[Tensor], mode: int,
              block_size: int) -> Tensor:
    return q.new_empty(q.shape[0], q.shape[1], q.shape[2], v.shape[-1])


def _mix_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, cu: Optional[Tensor], seqid: Optional[Tensor],
                  mode: int, block_size: int) -> Tuple[Tensor, Tensor, Tensor]:
    BH, H, N, DK, DV, NC, C, BK, BV, nw = _meta(q, v)
    do = do.contiguous()
    sid = seqid if seqid is not None else q
    cu_t = cu if cu is not None else q
    packed = cu is not None
    h = _states(k, v, seqid, cu, mode, block_size, False)  # recomputed: nothing of O(N·D_h·dv_h / C) is saved
    r = _states(k, v, seqid, cu, mode, block_size, True) if mode != 0 else h
    dh = torch.empty_like(h)
    launch(_dstates_kernel, (BH, -(-DK // BK), -(-DV // BV)), q, do, sid, cu_t, dh, N, H, DK, DV, NC, block_size,
           PACKED=packed, MODE=mode, REV=False, C=C, BK=BK, BV=BV, PREC=_prec(q), **_opts(nw))
    dr = dh
    if mode != 0:
        dr = torch.empty_like(h)
        launch(_dstates_kernel, (BH, -(-DK // BK), -(-DV // BV)), q, do, sid, cu_t, dr, N, H, DK, DV, NC,
               block_size, PACKED=packed, MODE=mode, REV=True, C=C, BK=BK, BV=BV, PREC=_prec(q), **_opts(nw))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    prec = _prec(q)
    launch(_dv_kernel, (BH, NC, -(-DV // BV)), q, k, do, dh, dr, dv, sid, cu_t, N, H, DK, DV, NC, block_size,
           PACKED=packed, MODE=mode, C=C, BK=BK, BV=BV, NK=-(-DK // BK), PREC=prec, **_opts(nw))
    for out, which in ((dq, True), (dk, False)):
        launch(_dqk_kernel, (BH, NC, -(-DK // BK)), q, k, v, do, h, r, dh, dr, out, sid, cu_t, N, H, DK, DV, NC,
               block_size, PACKED=packed, MODE=mode, DQ=which, C=C, BK=BK, BV=BV, NV=-(-DV // BV), PREC=prec,
               **_opts(nw))
    return dq, dk, dv


def _mix_backward_fake(do: Tensor, q: Tensor, k: Tensor, v: Tensor, cu: Optional[Tensor], seqid: Optional[Tensor],
                       mode: int, block_size: int) -> Tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


value_mix_op = kernel_op("value_mix", _mix, _mix_fake)
value_mix_backward_op = kernel_op("value_mix_backward", _mix_backward, _mix_backward_fake)


def _setup(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
    q, k, v, cu, seqid, mode, bs = inputs
    ctx.save_for_backward(q, k, v, cu, seqid)
    ctx.attrs = (mode, bs)


def _backward(ctx: Any, do: Tensor) -> Tuple[Optional[Tensor], ...]:
    q, k, v, cu, seqid = ctx.saved_tensors
    dq, dk, dv = value_mix_backward_op(do, q, k, v, cu, seqid, *ctx.attrs)
    return dq, dk, dv, None, None, None, None


value_mix_op.register_autograd(_backward, setup_context=_setup)


def _mode(causal: bool, block_size: Optional[int]) -> Tuple[int, int]:
    if block_size is not None:
        return 2, int(block_size)
    return (0, 1) if causal else (1, 1)


def _contiguous(*ts: Tensor) -> Tuple[Tensor, ...]:
    dtype = ts[0].dtype
    return tuple(t.to(dtype).contiguous() for t in ts)


def chunked_mix(q: Tensor, k: Tensor, v: Tensor, w: Tensor, *, causal: bool = False,
                block_size: Optional[int] = None, mask: Optional[Tensor] = None, chunk: int = CHUNK,
                state: Optional[Tensor] = None, count: Optional[Tensor] = None
                ) -> Tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
    """:func:`polymixer.ops.value_pom.modular.value_mix` with the (block-)causal mixing in the kernels (full mixing of
    whole rows is two cuBLAS products, a general mask and streaming state stay in torch). The final state is not
    formed (None): parallel calls do not use it."""
    if mask is not None or not causal or state is not None:
        return modular.value_mix(q, k, v, w, causal=causal, block_size=block_size, mask=mask, chunk=chunk,
                                 state=state, count=count)
    B, H, M, _ = q.shape
    N = k.shape[2]
    mode, bs = _mode(causal, block_size)
    o = value_mix_op(*_contiguous(q, k, v), None, None, mode, bs)
    K = bs
    L = -(-N // K) * K
    wp = torch.nn.functional.pad(w, (0, L - N))
    cnt = torch.cumsum(wp.view(B, L // K, K).sum(-1), dim=1).repeat_interleave(K, dim=1)[:, :M]
    return o[:, :, :M], cnt.to(q.dtype), None, None


def packed_chunked_mix(q: Tensor, k: Tensor, v: Tensor, w: Tensor, first: Tensor, chunk: int = CHUNK, *,
                       cu_seqlens: Optional[Tensor] = None, causal: bool = True, block_size: Optional[int] = None
                       ) -> Tuple[Tensor, Tensor]:
    """:func:`polymixer.ops.value_pom.modular.packed_causal_mix` in the kernels, in every mode: the sequences of the
    packed stream mix in place, the states restarting at each one's first token. Returns (o, counts (1, T))."""
    T = q.shape[2]
    dev = q.device
    ar = torch.arange(T, device=dev)
    if cu_seqlens is None:
        raise ValueError("the kernels mix packed sequences from their cu_seqlens offsets")
    cu = cu_seqlens
    seqid = torch.searchsorted(cu, ar.to(cu.dtype), right=True, out_int32=True) - 1
    mode, bs = _mode(causal, block_size)
    o = value_mix_op(*_contiguous(q, k, v), cu.to(torch.int32), seqid.to(torch.int32), mode, bs)
    cw = torch.cumsum(w[0].to(torch.float64), dim=0)
    before = (cw - w[0].to(torch.float64))[first]  # the weight before each token's sequence
    if mode == 0:
        end = ar
    else:  # each query sees up to its end token: its block's last (block-causal) or its sequence's last token
        last = cu.to(torch.int64)[1:][seqid.long()] - 1
        end = last if mode == 1 else torch.minimum(first + ((ar - first) // bs + 1) * bs - 1, last)
    cnt = cw[end] - before
    return o, cnt.to(q.dtype).unsqueeze(0)


def supports(call: Any) -> Optional[str]:
    """Every self-mixing mode — causal, block-causal of any block size, full, each packed too — with key padding and
    rotary, heads up to 128 key and value channels, fp32 / bf16 / fp16 (full mixing of whole rows as two cuBLAS
    products). CUDA tensors (CPU tensors under TRITON_INTERPRET=1 with ``backend("triton")``); also while
    ``torch.compile`` traces (the kernels are custom ops)."""
    x = call.x
    if x.dtype not in DTYPES:
        return f"{x.dtype} is not a kernel dtype (fp32, bf16, fp16)"
    if not call.self_mix:
        return "cross-mixing is not in the kernels"
    mask = call.get("mask")
    if mask is not None and mask.dim() == 3:
        return "an explicit (B, M, N) mask is not in the kernels (quadratic)"
    args = dict(zip(("x", "context", "in_weight", "gate_bias", "coeff", "coeff_q", "shift_weight", "norm_weight",
                     "out_weight"), call.args))
    args.update({k: v for k, v in call.kwargs.items() if k in args})
    heads = call.get("heads", 1)
    D, dv = args["coeff"].shape[0], args["out_weight"].shape[1]
    if D // heads > 128 or dv // heads > 128:
        return f"heads of {D // heads} key and {dv // heads} value channels (the kernels take ≤ 128)"
    if x.device.type == "cuda":
        return self_check(x.device, x.dtype)
    return None


# (d, D, dv, heads, N) of the first-use check: several chunks and sequences at the GPU's tiles
CHECK_SHAPE = (32, 64, 32, 2, 100)


def run_check(device: torch.device, dtype: torch.dtype) -> None:
    """A small value-carrying PoM — causal, block-causal, packed causal and packed full — forward and backward on the
    kernels in ``dtype`` against the torch form in float32 on the same device; raises when they disagree."""
    from .. import dispatch
    from . import value_pom

    gen = torch.Generator(device="cpu").manual_seed(0)
    d, D, dv, H, N = CHECK_SHAPE
    rnd: Callable[..., Tensor] = lambda *s: torch.randn(*s, generator=gen).to(device)  # noqa: E731
    weights = [rnd(2 * D + dv + dv, d) / d ** 0.5, rnd(dv), rnd(D, 2).clamp(-1, 1), rnd(D, 2).clamp(-1, 1),
               torch.full((2, D + dv), 0.5, device=device), torch.ones(dv, device=device), rnd(d, dv) / dv ** 0.5]
    x = rnd(1, N, d)
    cu = torch.tensor([0, N // 3, N // 3 + 1, N], dtype=torch.int32, device=device)
    for kw in (dict(causal=True), dict(causal=True, block_size=4), dict(causal=True, cu_seqlens=cu),
               dict(cu_seqlens=cu)):
        outs = []
        for name, dt in check_runs("triton", dtype):
            xs = x.clone().requires_grad_()
            ws = [w.clone().requires_grad_() for w in weights]
            with dispatch.backend(name), torch.autocast(device.type, dtype=dtype, enabled=dt != torch.float32):
                y = value_pom(xs, None, *ws, heads=H, **kw)
            y.float().square().sum().backward()
            outs.append([y.detach(), xs.grad] + [w.grad for w in ws])
        judge_check(outs, dtype, kw, floor=5e-3)


def self_check(device: torch.device, dtype: torch.dtype = torch.float32) -> Optional[str]:
    """The first-use check of the kernels on ``device`` (float32 and ``dtype``), once per process: None when they
    agree with the torch form, else the reason (the automatic choice then runs the torch form)."""
    return first_use("value_pom", device, dtype, run_check)


def forward(call: Any) -> Tensor:
    """The torch form's value-carrying PoM with its mixing in the kernels (packed sequences in place, every mode)."""
    return modular.value_pom(*call.args, **call.kwargs, mix=chunked_mix, packed_mix=packed_chunked_mix,
                             packed_all_modes=True)


def aot_builds(build: Any) -> List[Any]:
    """The value PoM's builds for ``polymixer kernels``: every kernel at every tile, causal and block-causal (and
    the reverse walks of the end modes) in bf16, and the default tile in fp32 and fp16 — chunks of 64 for sm_90,
    of 32 for sm_80 (:func:`_tiles`)."""
    out: List[Any] = []
    default = default_tiles()
    for bk, bv, nw in sorted({t[1:] for t in launch_tiles()}, key=lambda t: t != default[1:]):
        nk = 2 if bk == 64 else 1  # the widest head of this tile: 128 channels in two blocks
        nv = 2 if bv == 64 else 1
        for chunk, archs in ((CHUNK, (90,)), (32, (80,))):
            dtypes = ("bf16", "fp32", "fp16") if (bk, bv) == default[1:3] else ("bf16",)
            for dtype in dtypes:
                for mode in (0, 2):
                    base = dict(PACKED=1, MODE=mode, C=chunk, BK=bk, BV=bv, PREC="tf32")
                    rows = []
                    for rev in ((0, 1) if mode else (0,)):
                        rows.append(("value_states", {**base, "REV": rev}))
                        rows.append(("value_dstates", {**base, "REV": rev}))
                    rows.append(("value_output", {**base, "NK": nk}))
                    rows.append(("value_dv", {**base, "NK": nk}))
                    rows.append(("value_dqk", {**base, "NV": nv, "DQ": 1}))
                    rows.append(("value_dqk", {**base, "NV": nv, "DQ": 0}))
                    out += [build("value_pom", k, tuple(c.items()), dtype, nw, MAXNREG, STAGES, archs)
                            for k, c in rows]
    return out
