"""The ``triton`` backend of the value-carrying PoM: its mixing ``o_i = Σ_{j visible to i} (q_i · k_j) v_j`` per head
in the chunked form of current linear-attention kernels (flash-linear-attention's ``chunk``), as PyTorch custom ops.

The features (projections, token shift, polynomials, rotary) and the readout (mean, norm, gate, W_o) are those every
backend shares (:mod:`polymixer.ops.features`): without a GPU to measure it, nothing says fusing them into
the kernels pays. This backend never calls the torch backend: only the mixing differs. The mixing cuts the tokens into
chunks of C tokens (``CHUNK`` = 64 on sm_90, ``SM80_CHUNK`` = 32 before) and the channels of a head into blocks of up
to 64 (32 where the states are fp32; :func:`launch_tiles` lists every tile), and every pass is parallel over chunks:

* **local sums** (``_states_kernel``): each chunk's contribution kᵀv to the D_h × dv_h state it hands on — its tokens
  from its last sequence start on; in the end-token modes also the part its first tokens hand back to the chunk
  before —, one program per (row · head, chunk, key block × value block);
* **a segmented scan over the chunks** (``_scan_kernel``) turns them, in place, into the state entering every chunk,
  restarting where a sequence (for the part handed backwards, a block) starts. A program owns ``SCAN_WIDTH`` state
  elements of one row · head and scans ``SCAN_CHUNKS`` chunks per step with ``tl.associative_scan``, carrying
  between steps: N / (C · SCAN_CHUNKS) dependent steps, every row, head and element block at once;
* **outputs** (``_output_kernel``), one program per (row · head, chunk): ``(q kᵀ ⊙ M) v`` with the score tile
  computed once for every value block, plus ``q·h`` for the queries of the carried sequence (and ``q·r`` in the
  end-token modes).

The backward recomputes the states (nothing of O(N·D_h·dv_h / C) is saved), forms the local sums of qᵀ·do
(``_dstates_kernel``), scans all of them in one launch (the states forwards, their gradients backwards), then gives
dv (``_dv_kernel``: q kᵀ once per chunk) and dq with dk (``_dqk_kernel``: do vᵀ once per chunk): five launches, no
score product formed twice. Forward three launches.

**Traffic.** Per token and head, the forward reads q once, k and v twice and writes o; the backward reads q, k and do
three times, v twice, and writes dq, dk, dv. The states (D_h·dv_h / C elements per token, twice that in the end-token
modes) are written by the local sums, read and written by the scan and read by the outputs: 4 passes forward, 9
backward.

**Precision and layouts** (docs/gpu.md, "The value-carrying PoM kernels"). Products accumulate in fp32; bf16
features keep bf16 states (:func:`state_dtype`: half the state traffic), fp16 ones fp32 states (an unnormalised
state of a long sequence passes fp16's 65,504). q, k, v and the incoming gradient are read with their own strides
(only a channel stride other than 1 is copied); outputs are written in (B, N, H, D) memory order, so that merging
the heads costs no copy.

Modes: causal (j ≤ i), and the end-token modes — block-causal and full — as the causal part plus a strictly-later
part within i's group (block or sequence), carried by a second state scanned backwards; every mode also packed
(``cu_seqlens``: the states restart at each sequence). Nothing is atomic: results are deterministic. No value is
read back to the host. What the kernels take: :func:`supports`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch import Tensor

from ..triton_common import (
    DTYPES,
    check_runs,
    dot_precision,
    first_use,
    judge_check,
    kernel_op,
    last_row,
    launch,
    offset64,
    or_,
    pow2,
    seg_add,
    sequence_of,
)
from ..call import Call
from ..common import operand_dtype
from ..features import call_features, full_mix, packed_features, value_output

import triton  # noqa: E402  (triton_common raised a clear ImportError already if it is missing)
import triton.language as tl  # noqa: E402

__all__ = ["supports", "forward", "self_check", "run_check", "KERNELS", "CHUNK", "BLOCK", "BLOCK_F32", "SCAN_CHUNKS",
           "SCAN_WIDTH", "chunked_mix", "packed_chunked_mix", "launch_tiles", "default_tiles", "use_tiles",
           "aot_builds", "value_mix_op", "value_mix_backward_op", "bench_kernels", "state_dtype"]

CHUNK = 64  # tokens per chunk
SM80_CHUNK = 32  # tokens per chunk before sm_90, whose ptxas spills the end-token modes' backward at 64
BLOCK = 64  # the widest key / value channel block of bf16 tiles (128-channel heads loop over two)
BLOCK_F32 = 32  # the widest with fp32 states (fp32 and fp16 features): 64-wide fp32 tiles spill registers
SCAN_CHUNKS = 16  # chunks per step of the scan
SCAN_WIDTH = 128  # state elements per program of the scan (256 doubles its registers: 2 CTAs per SM, not 4)
MAXNREG = 255  # ptxas may use every register a 4-warp block can have (≥ 2 blocks per SM) before it spills
STAGES = 2  # software pipelining of the loops (3 stages take more shared memory than fits)


# ----------------------------------------------------------------------------------------------------------------
# pieces inlined into the kernels
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
def _edges(start, gstart, rows, nmask, C: tl.constexpr):
    """(tail: the rows a chunk hands to the next chunk's state — from its last sequence start on —, head: the rows
    it hands back to the previous chunk's group state — before its first group start)."""
    last = tl.max(tl.where(start, rows, -1), axis=0)
    first = tl.min(tl.where(gstart, rows, C), axis=0)
    return (rows >= last) & nmask, rows < first


@triton.jit
def _chunk_program(N, H, C: tl.constexpr):
    """A program's (row · head, chunk, row, head, the chunk's token offsets, its tokens, which of them are < N): one
    program per (row · head, chunk[, channel blocks])."""
    bh = tl.program_id(0)
    c = tl.program_id(1)
    rows = tl.arange(0, C)
    n = c * C + rows
    return bh, c, bh // H, bh % H, rows, n, n < N


@triton.jit
def _chunk_ptr(ptr, b, h, c, s_b, s_h, s_n, C: tl.constexpr):
    """The first token of chunk c of row b, head h (64-bit offsets: they may pass 2³¹ elements)."""
    return ptr + offset64(b, s_b) + offset64(h, s_h) + offset64(c * C, s_n)


@triton.jit
def _tile(base, s_n, rows, nmask, ch, W):
    """A (tokens × channels) tile of the chunk at ``base``: tokens past N and channels past W read as zero."""
    return tl.load(base + rows[:, None] * s_n + ch[None, :], mask=nmask[:, None] & (ch < W)[None, :], other=0.0)


@triton.jit
def _state_ptr(h_ptr, j, bh, c, BH, NC, E):
    """Slot c of state buffer j of row · head bh in the (buffers, BH, NC, D_h, dv_h) table of states."""
    return h_ptr + offset64(j * BH + bh, NC) * E + offset64(c, E)


@triton.jit
def _state_tile(ptr, ck, cv, DK, DV, slot, NC):
    """The (key block × value block) tile of the state at ``ptr``, of chunk slot ``slot``: zero outside [0, NC)."""
    ok = (cv < DV) & (cv * 0 + slot >= 0) & (cv * 0 + slot < NC)  # a vector: the interpreter masks no scalars
    return tl.load(ptr + ck[:, None] * DV + cv[None, :], mask=(ck < DK)[:, None] & ok[None, :], other=0.0)


@triton.jit
def _dot(a, b, acc, PREC: tl.constexpr):
    """acc + a @ b in fp32. Operands of one dtype: tensor cores (fp32 ones in tf32, or exact as PREC says); 16-bit
    activations against fp32 states (fp16 runs): both in tf32, which keeps fp32's range; PREC "f32x": exact fp32
    (the interpreter, whose 16-bit dot is wrong in Triton 3.9)."""
    if PREC == "f32x":
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif a.dtype == b.dtype:
        out = tl.dot(a, b, acc, input_precision=PREC)
    else:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="tf32")
    return out


# ----------------------------------------------------------------------------------------------------------------
# kernels. Their loops over channel blocks have runtime bounds (tl.cdiv(DK, BK)): with constexpr bounds the compiler
# unrolls them, keeps every block's tiles alive at once and spills registers.
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _local_sums(x_ptr, y_ptr, h_ptr, seqid_ptr, cu_ptr, s_xb, s_xh, s_xn, s_yb, s_yh, s_yn, N, H, DK, DV, NC, BS, BH,
                PACKED: tl.constexpr, MODE: tl.constexpr, GRAD: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                BV: tl.constexpr, PREC: tl.constexpr):
    """One chunk's sums xᵀy over a (key block × value block), in the slots the scan reads them from.

    States (x = k, y = v): the tail (handed to h_{c+1}) into slot c + 1 of buffer 0, the head (handed to r_{c−1},
    end modes) into slot c − 1 of buffer 1; the slots no chunk feeds (h_0, r_{NC−1}) get zeros. Gradients (x = q,
    y = do): the queries that read h_c (and r_c) into slot c of the gradient buffers."""
    bh, c, b, hh, rows, n, nmask = _chunk_program(N, H, C)
    kv = tl.program_id(2)
    nv = tl.cdiv(DV, BV)
    ck = (kv // nv) * BK + tl.arange(0, BK)
    cv = (kv % nv) * BV + tl.arange(0, BV)
    x = _tile(_chunk_ptr(x_ptr, b, hh, c, s_xb, s_xh, s_xn, C), s_xn, rows, nmask, ck, DK)
    y = _tile(_chunk_ptr(y_ptr, b, hh, c, s_yb, s_yh, s_yn, C), s_yn, rows, nmask, cv, DV)
    _, start, gstart, _ = _flags(n, nmask, seqid_ptr, cu_ptr, N, BS, PACKED, MODE)
    E = DK * DV
    loc = ck[:, None] * DV + cv[None, :]
    sm = (ck < DK)[:, None] & (cv < DV)[None, :]
    zero = tl.zeros((BK, BV), tl.float32)
    st = h_ptr.dtype.element_ty
    if GRAD:
        left, right = _open_rows(start, gstart, rows, C)
        j0 = 1 if MODE == 0 else 2
        u = _dot(tl.trans(tl.where(left[:, None], x, 0.0)), y, zero, PREC)
        tl.store(_state_ptr(h_ptr, j0, bh, c, BH, NC, E) + loc, u.to(st), mask=sm)
        if MODE != 0:
            u = _dot(tl.trans(tl.where(right[:, None], x, 0.0)), y, zero, PREC)
            tl.store(_state_ptr(h_ptr, j0 + 1, bh, c, BH, NC, E) + loc, u.to(st), mask=sm)
    else:
        tail, head = _edges(start, gstart, rows, nmask, C)
        u = _dot(tl.trans(tl.where(tail[:, None], x, 0.0)), y, zero, PREC)
        tl.store(_state_ptr(h_ptr, 0, bh, (c + 1) % NC, BH, NC, E) + loc, tl.where(c + 1 < NC, u, 0.0).to(st),
                 mask=sm)
        if MODE != 0:
            u = _dot(tl.trans(tl.where(head[:, None], x, 0.0)), y, zero, PREC)
            tl.store(_state_ptr(h_ptr, 1, bh, (c + NC - 1) % NC, BH, NC, E) + loc, tl.where(c > 0, u, 0.0).to(st),
                     mask=sm)


@triton.jit
def _states_kernel(k_ptr, v_ptr, h_ptr, seqid_ptr, cu_ptr, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, N, H, DK, DV, NC, BS,
                   BH, PACKED: tl.constexpr, MODE: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                   BV: tl.constexpr, PREC: tl.constexpr):
    """Every chunk's contribution kᵀv to the states (:func:`_local_sums`), all chunks in parallel."""
    _local_sums(k_ptr, v_ptr, h_ptr, seqid_ptr, cu_ptr, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, N, H, DK, DV, NC, BS, BH,
                PACKED, MODE, False, C, BK, BV, PREC)


@triton.jit
def _dstates_kernel(q_ptr, do_ptr, h_ptr, seqid_ptr, cu_ptr, s_qb, s_qh, s_qn, s_ob, s_oh, s_on, N, H, DK, DV, NC,
                    BS, BH, PACKED: tl.constexpr, MODE: tl.constexpr, C: tl.constexpr, BK: tl.constexpr,
                    BV: tl.constexpr, PREC: tl.constexpr):
    """Every chunk's contribution qᵀ·do to the states' gradients (:func:`_local_sums`), all chunks in parallel."""
    _local_sums(q_ptr, do_ptr, h_ptr, seqid_ptr, cu_ptr, s_qb, s_qh, s_qn, s_ob, s_oh, s_on, N, H, DK, DV, NC, BS,
                BH, PACKED, MODE, True, C, BK, BV, PREC)


@triton.jit
def _chunk_starts(cc, NC, N, BS, seqid_ptr, cu_ptr, PACKED: tl.constexpr, MODE: tl.constexpr, C: tl.constexpr):
    """Per chunk index ``cc`` (a vector): (a sequence starts in the chunk, a group starts in it); both True for an
    index outside [0, NC) — the slots no chunk feeds."""
    valid = (cc >= 0) & (cc < NC)
    n0 = cc * C
    n1 = tl.minimum(n0 + C, N) - 1
    if PACKED:
        sid0 = tl.load(seqid_ptr + n0, mask=valid, other=0)
        sid1 = tl.load(seqid_ptr + n1, mask=valid, other=0)
        s0 = tl.load(cu_ptr + sid0, mask=valid, other=0)
        seq = (sid0 != sid1) | (s0 == n0)
    else:
        s0 = cc * 0
        seq = cc == 0
    # within one sequence, a block starts at a multiple of BS from the sequence's start
    grp = seq | ((n0 - s0) % BS == 0) | ((n0 - s0) // BS != (n1 - s0) // BS) if MODE == 2 else seq
    out = (cc < 0) | (cc >= NC)
    return seq | out, grp | out


@triton.jit
def _scan_kernel(h_ptr, seqid_ptr, cu_ptr, N, NC, E, BS, BH, PACKED: tl.constexpr, MODE: tl.constexpr,
                 C: tl.constexpr, NCB: tl.constexpr, BE: tl.constexpr):
    """The segmented scan over the chunks, in place: one program per (row · head, block of BE state elements, state
    buffer), NCB chunks per step, the carry between steps in registers.

    Buffer j holds (MODE 0: h, then dh; end modes: h, r, then dh, dr). h scans forwards and restarts after chunks
    with a sequence start; r backwards, restarting before chunks with a group start; the gradients the other way
    round (dh backwards, dr forwards), restarting at such chunks themselves."""
    bh = tl.program_id(0)
    eb = tl.program_id(1)
    j = tl.program_id(2)
    kind = j * 2 if MODE == 0 else j
    grad = kind >= 2
    group = (kind % 2) == 1
    rev = (kind == 1) | (kind == 2)
    shift = tl.where(grad, 0, tl.where(kind == 0, -1, 1))  # the chunk a state slot's sum comes from
    base = h_ptr + offset64(j * BH + bh, NC) * E
    e = eb * BE + tl.arange(0, BE)
    em = e < E
    steps = tl.arange(0, NCB)
    carry = tl.zeros((BE,), tl.float32)
    for i0 in range(0, NC, NCB):
        i = i0 + steps
        im = i < NC
        slot = tl.where(rev, NC - 1 - i, i)
        seq, grp = _chunk_starts(slot + shift, NC, N, BS, seqid_ptr, cu_ptr, PACKED, MODE, C)
        f = (tl.where(group, grp, seq) & im).to(tl.int32)
        ptrs = base + slot.to(tl.int64)[:, None] * E + e[None, :]
        m = im[:, None] & em[None, :]
        u = tl.load(ptrs, mask=m, other=0.0).to(tl.float32)
        s, _ = tl.associative_scan((u, f[:, None] + tl.zeros((NCB, BE), tl.int32)), 0, seg_add)
        opened = tl.associative_scan(f, 0, or_) == 0  # no restart yet in this step: the carry flows in
        s += tl.where(opened[:, None], carry[None, :], 0.0)
        tl.store(ptrs, s.to(h_ptr.dtype.element_ty), mask=m)
        carry = last_row(s, steps, NCB - 1)


@triton.jit
def _output_kernel(q_ptr, k_ptr, v_ptr, h_ptr, o_ptr, seqid_ptr, cu_ptr, s_qb, s_qh, s_qn, s_kb, s_kh, s_kn, s_vb,
                   s_vh, s_vn, s_ob, s_oh, s_on, N, H, DK, DV, NC, BS, BH, PACKED: tl.constexpr, MODE: tl.constexpr,
                   C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                   PREC: tl.constexpr):
    """One program per (row · head, chunk): o = (q kᵀ ⊙ M) v + q·h_c (queries of the carried sequence) + q·r_c (end
    modes: queries whose group goes on after the chunk); the score tile formed once for every value block."""
    bh, c, b, hh, rows, n, nmask = _chunk_program(N, H, C)
    qc = _chunk_ptr(q_ptr, b, hh, c, s_qb, s_qh, s_qn, C)
    kc = _chunk_ptr(k_ptr, b, hh, c, s_kb, s_kh, s_kn, C)
    vc = _chunk_ptr(v_ptr, b, hh, c, s_vb, s_vh, s_vn, C)
    oc = _chunk_ptr(o_ptr, b, hh, c, s_ob, s_oh, s_on, C)
    sid, start, gstart, gid = _flags(n, nmask, seqid_ptr, cu_ptr, N, BS, PACKED, MODE)
    left, right = _open_rows(start, gstart, rows, C)
    E = DK * DV
    hs = _state_ptr(h_ptr, 0, bh, c, BH, NC, E)
    rs = _state_ptr(h_ptr, 1, bh, c, BH, NC, E)
    a = tl.zeros((C, C), tl.float32)
    for kb in range(tl.cdiv(DK, BK)):
        ck = kb * BK + tl.arange(0, BK)
        a = _dot(_tile(qc, s_qn, rows, nmask, ck, DK), tl.trans(_tile(kc, s_kn, rows, nmask, ck, DK)), a, PREC)
    a = tl.where(_visible(rows, nmask, sid, gid, MODE), a, 0.0).to(v_ptr.dtype.element_ty)
    for vb in range(tl.cdiv(DV, BV)):
        cv = vb * BV + tl.arange(0, BV)
        o = _dot(a, _tile(vc, s_vn, rows, nmask, cv, DV), tl.zeros((C, BV), tl.float32), PREC)
        for kb in range(tl.cdiv(DK, BK)):
            ck = kb * BK + tl.arange(0, BK)
            q = _tile(qc, s_qn, rows, nmask, ck, DK)
            o = _dot(tl.where(left[:, None], q, 0.0), _state_tile(hs, ck, cv, DK, DV, c, NC), o, PREC)
            if MODE != 0:
                o = _dot(tl.where(right[:, None], q, 0.0), _state_tile(rs, ck, cv, DK, DV, c, NC), o, PREC)
        tl.store(oc + rows[:, None] * s_on + cv[None, :], o.to(o_ptr.dtype.element_ty),
                 mask=nmask[:, None] & (cv < DV)[None, :])


@triton.jit
def _dv_kernel(q_ptr, k_ptr, do_ptr, h_ptr, dv_ptr, seqid_ptr, cu_ptr, s_qb, s_qh, s_qn, s_kb, s_kh, s_kn, s_ob, s_oh,
               s_on, s_gb, s_gh, s_gn, N, H, DK, DV, NC, BS, BH, PACKED: tl.constexpr, MODE: tl.constexpr,
               C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
               PREC: tl.constexpr):
    """One program per (row · head, chunk): dv = (q kᵀ ⊙ M)ᵀ do + k·dh_{c+1} for the tokens handed to the next
    chunk + k·dr_{c−1} (end modes) for those handed back to the previous one; the scores formed once."""
    bh, c, b, hh, rows, n, nmask = _chunk_program(N, H, C)
    qc = _chunk_ptr(q_ptr, b, hh, c, s_qb, s_qh, s_qn, C)
    kc = _chunk_ptr(k_ptr, b, hh, c, s_kb, s_kh, s_kn, C)
    doc = _chunk_ptr(do_ptr, b, hh, c, s_ob, s_oh, s_on, C)
    gc = _chunk_ptr(dv_ptr, b, hh, c, s_gb, s_gh, s_gn, C)
    sid, start, gstart, gid = _flags(n, nmask, seqid_ptr, cu_ptr, N, BS, PACKED, MODE)
    tail, head = _edges(start, gstart, rows, nmask, C)
    E = DK * DV
    jd = 1 if MODE == 0 else 2  # the first gradient buffer
    dhs = _state_ptr(h_ptr, jd, bh, c + 1, BH, NC, E)
    drs = _state_ptr(h_ptr, jd + 1, bh, c - 1, BH, NC, E)
    a = tl.zeros((C, C), tl.float32)
    for kb in range(tl.cdiv(DK, BK)):
        ck = kb * BK + tl.arange(0, BK)
        a = _dot(_tile(qc, s_qn, rows, nmask, ck, DK), tl.trans(_tile(kc, s_kn, rows, nmask, ck, DK)), a, PREC)
    at = tl.trans(tl.where(_visible(rows, nmask, sid, gid, MODE), a, 0.0).to(do_ptr.dtype.element_ty))
    for vb in range(tl.cdiv(DV, BV)):
        cv = vb * BV + tl.arange(0, BV)
        acc = _dot(at, _tile(doc, s_on, rows, nmask, cv, DV), tl.zeros((C, BV), tl.float32), PREC)
        for kb in range(tl.cdiv(DK, BK)):
            ck = kb * BK + tl.arange(0, BK)
            k = _tile(kc, s_kn, rows, nmask, ck, DK)
            acc = _dot(tl.where(tail[:, None], k, 0.0), _state_tile(dhs, ck, cv, DK, DV, c + 1, NC), acc, PREC)
            if MODE != 0:
                acc = _dot(tl.where(head[:, None], k, 0.0), _state_tile(drs, ck, cv, DK, DV, c - 1, NC), acc, PREC)
        tl.store(gc + rows[:, None] * s_gn + cv[None, :], acc.to(dv_ptr.dtype.element_ty),
                 mask=nmask[:, None] & (cv < DV)[None, :])


@triton.jit
def _dqk_kernel(q_ptr, k_ptr, v_ptr, do_ptr, h_ptr, dq_ptr, dk_ptr, seqid_ptr, cu_ptr, s_qb, s_qh, s_qn, s_kb, s_kh,
                s_kn, s_vb, s_vh, s_vn, s_ob, s_oh, s_on, s_gb, s_gh, s_gn, N, H, DK, DV, NC, BS, BH,
                PACKED: tl.constexpr, MODE: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                PREC: tl.constexpr):
    """One program per (row · head, chunk), dq and dk together: dA = (do vᵀ) ⊙ M formed once, then per key block
    dq = dA k + do hᵀ (+ do rᵀ) and dk = dAᵀ q + v dh_{c+1}ᵀ (+ v dr_{c−1}ᵀ). dq and dk share strides (s_g*)."""
    bh, c, b, hh, rows, n, nmask = _chunk_program(N, H, C)
    qc = _chunk_ptr(q_ptr, b, hh, c, s_qb, s_qh, s_qn, C)
    kc = _chunk_ptr(k_ptr, b, hh, c, s_kb, s_kh, s_kn, C)
    vc = _chunk_ptr(v_ptr, b, hh, c, s_vb, s_vh, s_vn, C)
    doc = _chunk_ptr(do_ptr, b, hh, c, s_ob, s_oh, s_on, C)
    sid, start, gstart, gid = _flags(n, nmask, seqid_ptr, cu_ptr, N, BS, PACKED, MODE)
    left, right = _open_rows(start, gstart, rows, C)
    tail, head = _edges(start, gstart, rows, nmask, C)
    E = DK * DV
    jd = 1 if MODE == 0 else 2  # the first gradient buffer
    hs = _state_ptr(h_ptr, 0, bh, c, BH, NC, E)
    rs = _state_ptr(h_ptr, 1, bh, c, BH, NC, E)
    dhs = _state_ptr(h_ptr, jd, bh, c + 1, BH, NC, E)
    drs = _state_ptr(h_ptr, jd + 1, bh, c - 1, BH, NC, E)
    da = tl.zeros((C, C), tl.float32)
    for vb in range(tl.cdiv(DV, BV)):
        cv = vb * BV + tl.arange(0, BV)
        da = _dot(_tile(doc, s_on, rows, nmask, cv, DV), tl.trans(_tile(vc, s_vn, rows, nmask, cv, DV)), da, PREC)
    da = tl.where(_visible(rows, nmask, sid, gid, MODE), da, 0.0).to(q_ptr.dtype.element_ty)
    dat = tl.trans(da)
    for kb in range(tl.cdiv(DK, BK)):  # dq, then dk: one accumulator alive at a time
        ck = kb * BK + tl.arange(0, BK)
        out = rows[:, None] * s_gn + ck[None, :]
        om = nmask[:, None] & (ck < DK)[None, :]
        dq = _dot(da, _tile(kc, s_kn, rows, nmask, ck, DK), tl.zeros((C, BK), tl.float32), PREC)
        for vb in range(tl.cdiv(DV, BV)):  # the queries read h (and r): do hᵀ
            cv = vb * BV + tl.arange(0, BV)
            do = _tile(doc, s_on, rows, nmask, cv, DV)
            dq = _dot(tl.where(left[:, None], do, 0.0), tl.trans(_state_tile(hs, ck, cv, DK, DV, c, NC)), dq, PREC)
            if MODE != 0:
                dq = _dot(tl.where(right[:, None], do, 0.0), tl.trans(_state_tile(rs, ck, cv, DK, DV, c, NC)), dq,
                          PREC)
        tl.store(_chunk_ptr(dq_ptr, b, hh, c, s_gb, s_gh, s_gn, C) + out, dq.to(dq_ptr.dtype.element_ty), mask=om)
        dk = _dot(dat, _tile(qc, s_qn, rows, nmask, ck, DK), tl.zeros((C, BK), tl.float32), PREC)
        for vb in range(tl.cdiv(DV, BV)):  # the keys feed h_{c+1} (and r_{c−1}): v dhᵀ
            cv = vb * BV + tl.arange(0, BV)
            v = _tile(vc, s_vn, rows, nmask, cv, DV)
            dk = _dot(tl.where(tail[:, None], v, 0.0), tl.trans(_state_tile(dhs, ck, cv, DK, DV, c + 1, NC)), dk,
                      PREC)
            if MODE != 0:
                dk = _dot(tl.where(head[:, None], v, 0.0), tl.trans(_state_tile(drs, ck, cv, DK, DV, c - 1, NC)), dk,
                          PREC)
        tl.store(_chunk_ptr(dk_ptr, b, hh, c, s_gb, s_gh, s_gn, C) + out, dk.to(dk_ptr.dtype.element_ty), mask=om)


KERNELS = {"value_states": _states_kernel, "value_dstates": _dstates_kernel, "value_scan": _scan_kernel,
           "value_output": _output_kernel, "value_dv": _dv_kernel, "value_dqk": _dqk_kernel}


# ----------------------------------------------------------------------------------------------------------------
# tiles and launches
# ----------------------------------------------------------------------------------------------------------------


def _chunk(device: Optional[torch.device]) -> int:
    """Tokens per chunk on ``device``: ``CHUNK``, at most ``SM80_CHUNK`` before sm_90."""
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        if torch.cuda.get_device_capability(device)[0] < 9:
            return min(CHUNK, SM80_CHUNK)
    return CHUNK


def _tiles(DK: int, DV: int, device: Optional[torch.device] = None, dtype: torch.dtype = torch.bfloat16
           ) -> Tuple[int, int, int, int]:
    """(CHUNK, BLOCK_K, BLOCK_V, warps) of a head of DK key and DV value channels in ``dtype``: blocks of at most
    ``BLOCK`` channels for bf16, ``BLOCK_F32`` for the dtypes with fp32 states (fp32, fp16); tl.dot needs 16; 4
    warps."""
    block = BLOCK if state_dtype(dtype) == torch.bfloat16 else min(BLOCK, BLOCK_F32)
    return _chunk(device), min(block, pow2(DK, 16)), min(block, pow2(DV, 16)), 4


def launch_tiles(dtype: torch.dtype = torch.bfloat16) -> List[Tuple[int, int, int, int]]:
    """Every (CHUNK, BLOCK_K, BLOCK_V, warps) the launches can take in ``dtype`` (fp32 and fp16 share theirs)."""
    return sorted({(c, *_tiles(dk, dv, None, dtype)[1:]) for dk in (16, 32, 64, 128) for dv in (16, 32, 64, 128)
                   for c in (CHUNK, min(CHUNK, SM80_CHUNK))})


def default_tiles(dtype: torch.dtype = torch.bfloat16) -> Tuple[int, int, int, int]:
    """The tiles of the most common head, 64 key × 64 value channels, in ``dtype``."""
    return _tiles(64, 64, None, dtype)


@contextlib.contextmanager
def use_tiles(chunk: Optional[int] = None, block: Optional[int] = None, scan_chunks: Optional[int] = None,
              scan_width: Optional[int] = None) -> Iterator[None]:
    """Smaller tiles inside the block (tests: tiny inputs then cross chunks, channel blocks and scan steps); the
    chunk and the blocks must be ≥ 16 (``tl.dot``), the scan's sizes powers of two."""
    global CHUNK, SM80_CHUNK, BLOCK, BLOCK_F32, SCAN_CHUNKS, SCAN_WIDTH
    saved = (CHUNK, SM80_CHUNK, BLOCK, BLOCK_F32, SCAN_CHUNKS, SCAN_WIDTH)
    CHUNK = chunk or CHUNK
    SM80_CHUNK = chunk or SM80_CHUNK
    BLOCK = block or BLOCK
    BLOCK_F32 = block or BLOCK_F32
    SCAN_CHUNKS = scan_chunks or SCAN_CHUNKS
    SCAN_WIDTH = scan_width or SCAN_WIDTH
    try:
        yield
    finally:
        CHUNK, SM80_CHUNK, BLOCK, BLOCK_F32, SCAN_CHUNKS, SCAN_WIDTH = saved


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the states are stored in for features of ``dtype``: bf16 for bf16 (accumulated in fp32), fp32 for
    fp16 (fp16's range is passed by an unnormalised state of a long sequence) and fp32."""
    return torch.bfloat16 if dtype == torch.bfloat16 else torch.float32


@dataclass(frozen=True)
class _Geometry:
    """One call's sizes and tiles: B rows of N tokens, H heads of DK key and DV value channels, chunks of C tokens,
    blocks of BK / BV channels; ``mode`` 0 causal, 1 full, 2 block-causal (blocks of ``bs``); ``packed``: the
    sequences come from cu_seqlens."""

    B: int
    H: int
    N: int
    DK: int
    DV: int
    mode: int
    bs: int
    packed: bool
    C: int
    BK: int
    BV: int
    warps: int

    @property
    def NC(self) -> int:
        return -(-self.N // self.C)

    @property
    def BH(self) -> int:
        return self.B * self.H

    @property
    def NK(self) -> int:
        return -(-self.DK // self.BK)

    @property
    def NV(self) -> int:
        return -(-self.DV // self.BV)

    def buffers(self, grad: bool) -> int:
        """State buffers: h (and r in the end modes), and their gradients in the backward."""
        return (1 + (self.mode != 0)) * (1 + grad)


def _geometry(q: Tensor, v: Tensor, mode: int, bs: int, packed: bool) -> _Geometry:
    B, H, N, DK = q.shape
    C, BK, BV, warps = _tiles(DK, v.shape[-1], q.device, q.dtype)
    return _Geometry(B, H, N, DK, v.shape[-1], mode, bs, packed, C, BK, BV, warps)


def _opts(warps: int) -> Dict[str, int]:
    """The launch options of every value kernel."""
    return dict(num_warps=warps, num_stages=STAGES, maxnreg=MAXNREG)


def _strides(t: Tensor) -> Tuple[int, int, int]:
    """(row, head, token) strides of a (B, H, N, D) tensor whose channel stride is 1."""
    return t.stride(0), t.stride(1), t.stride(2)


def _unit_channels(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` in ``dtype`` as it is, unless its channels are not adjacent in memory (then a copy)."""
    t = t.to(dtype)
    return t if t.stride(-1) == 1 else t.contiguous()


def _heads_empty(B: int, H: int, N: int, D: int, like: Tensor) -> Tensor:
    """An uninitialised (B, H, N, D) tensor in (B, N, H, D) memory order: merging its heads is a view."""
    return like.new_empty_strided((B, H, N, D), (N * H * D, D, H * D, 1))


def _state_table(g: _Geometry, grad: bool, like: Tensor) -> Tensor:
    """The (buffers, B·H, NC, DK, DV) table of states (and gradients), in :func:`state_dtype`."""
    return torch.empty(g.buffers(grad), g.BH, g.NC, g.DK, g.DV, dtype=state_dtype(like.dtype), device=like.device)


def _launch(kernel: Any, g: _Geometry, ins: Tuple[Tensor, ...], S: Tensor, outs: Tuple[Tensor, ...], seqid: Tensor,
            cu: Tensor) -> None:
    """Launch a value kernel with its (B, H, N, ·) inputs, the state table, its (B, H, N, ·) outputs, the sequence ids
    and offsets, the strides of the inputs and of the outputs (which share theirs), the sizes and the tiles. A
    local-sums kernel (no outputs: it writes the states) runs a program per (row · head, chunk, key block × value
    block), the others one per (row · head, chunk)."""
    grid = (g.BH, g.NC) if outs else (g.BH, g.NC, g.NK * g.NV)
    strides = [st for t in ins + outs[:1] for st in _strides(t)]
    launch(kernel, grid, *ins, S, *outs, seqid, cu, *strides, g.N, g.H, g.DK, g.DV, g.NC, g.bs, g.BH, PACKED=g.packed,
           MODE=g.mode, C=g.C, BK=g.BK, BV=g.BV, PREC=dot_precision(ins[0]), **_opts(g.warps))


def _launch_scan(g: _Geometry, S: Tensor, seqid: Tensor, cu: Tensor) -> None:
    E = g.DK * g.DV
    be = min(SCAN_WIDTH, pow2(E))
    launch(_scan_kernel, (g.BH, -(-E // be), S.shape[0]), S, seqid, cu, g.N, g.NC, E, g.bs, g.BH, PACKED=g.packed,
           MODE=g.mode, C=g.C, NCB=SCAN_CHUNKS, BE=be, **_opts(4))


# ----------------------------------------------------------------------------------------------------------------
# the op bodies
# ----------------------------------------------------------------------------------------------------------------


def _mix(q: Tensor, k: Tensor, v: Tensor, cu: Optional[Tensor], seqid: Optional[Tensor], mode: int,
         block_size: int) -> Tensor:
    """o (B, H, N, DV) of (B, H, N, ·) features: local sums, the scan, the outputs."""
    q = _unit_channels(q, q.dtype)
    k, v = _unit_channels(k, q.dtype), _unit_channels(v, q.dtype)
    g = _geometry(q, v, mode, block_size, cu is not None)
    sid, cut = (seqid, cu) if cu is not None else (q, q)  # unused pointers when not packed
    S = _state_table(g, False, q)
    _launch(_states_kernel, g, (k, v), S, (), sid, cut)
    _launch_scan(g, S, sid, cut)
    o = _heads_empty(g.B, g.H, g.N, g.DV, q)
    _launch(_output_kernel, g, (q, k, v), S, (o,), sid, cut)
    return o


def _mix_fake(q: Tensor, k: Tensor, v: Tensor, *_: Any) -> Tensor:
    return _heads_empty(q.shape[0], q.shape[1], q.shape[2], v.shape[-1], q)


def _mix_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, cu: Optional[Tensor], seqid: Optional[Tensor],
                  mode: int, block_size: int) -> Tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv): the states recomputed, the local sums of both, one scan, then dv and (dq, dk)."""
    q = _unit_channels(q, q.dtype)
    k, v, do = (_unit_channels(t, q.dtype) for t in (k, v, do))
    g = _geometry(q, v, mode, block_size, cu is not None)
    sid, cut = (seqid, cu) if cu is not None else (q, q)
    S = _state_table(g, True, q)
    _launch(_states_kernel, g, (k, v), S, (), sid, cut)
    _launch(_dstates_kernel, g, (q, do), S, (), sid, cut)
    _launch_scan(g, S, sid, cut)
    dq, dk = _heads_empty(g.B, g.H, g.N, g.DK, q), _heads_empty(g.B, g.H, g.N, g.DK, q)
    dv = _heads_empty(g.B, g.H, g.N, g.DV, q)
    _launch(_dv_kernel, g, (q, k, do), S, (dv,), sid, cut)
    _launch(_dqk_kernel, g, (q, k, v, do), S, (dq, dk), sid, cut)
    return dq, dk, dv


def _mix_backward_fake(do: Tensor, q: Tensor, k: Tensor, v: Tensor, *_: Any) -> Tuple[Tensor, Tensor, Tensor]:
    B, H, N, DK = q.shape
    return _heads_empty(B, H, N, DK, q), _heads_empty(B, H, N, DK, q), _heads_empty(B, H, N, v.shape[-1], q)


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


# ----------------------------------------------------------------------------------------------------------------
# the backend: the torch form with its mixing in the kernels
# ----------------------------------------------------------------------------------------------------------------


def _mode(causal: bool, block_size: Optional[int]) -> Tuple[int, int]:
    if block_size is not None:
        return 2, int(block_size)
    return (0, 1) if causal else (1, 1)


def chunked_mix(q: Tensor, k: Tensor, v: Tensor, w: Tensor, *, causal: bool = False,
                block_size: Optional[int] = None, mask: Optional[Tensor] = None, chunk: int = CHUNK,
                state: Optional[Tensor] = None, count: Optional[Tensor] = None,
                operands: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
    """:func:`polymixer.ops.value_pom.modular.value_mix` of parallel calls, with the (block-)causal mixing in the
    kernels and full mixing of whole rows as two cuBLAS products (:func:`polymixer.ops.features.full_mix`).
    A general mask or a streaming state is not for the kernels (:func:`supports` refuses those calls): ValueError.
    The kernels take q, k, v with their strides, in ``operands`` (default: q's dtype; the layer's activation dtype,
    so that a bf16 layer's products run in bf16 with bf16 states although its features are computed in fp32), and
    choose their own chunk (``chunk`` is the torch form's). The final state is not formed (None): parallel calls do
    not use it."""
    if mask is not None or state is not None or count is not None:
        raise ValueError("the value PoM's kernels take neither an explicit (B, M, N) mask nor a streaming state")
    if not causal:
        o, cnt, _, _ = full_mix(q, k, v, w)
        return o, cnt, None, None
    B, H, M, _ = q.shape
    N = k.shape[2]
    mode, bs = _mode(causal, block_size)
    dt = operands or q.dtype
    o = value_mix_op(q.to(dt), k.to(dt), v.to(dt), None, None, mode, bs)
    K = bs
    L = -(-N // K) * K
    wp = torch.nn.functional.pad(w, (0, L - N))
    cnt = torch.cumsum(wp.view(B, L // K, K).sum(-1), dim=1).repeat_interleave(K, dim=1)[:, :M]
    return o[:, :, :M], cnt.to(q.dtype), None, None


def packed_chunked_mix(q: Tensor, k: Tensor, v: Tensor, w: Tensor, first: Tensor, chunk: int = CHUNK, *,
                       cu_seqlens: Optional[Tensor] = None, causal: bool = True, block_size: Optional[int] = None,
                       operands: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
    """:func:`polymixer.ops.value_pom.modular.packed_causal_mix` in the kernels, in every mode: the sequences of the
    packed stream mix in place, the states restarting at each one's first token; q, k, v in ``operands`` (as
    :func:`chunked_mix`). Returns (o, counts (1, T))."""
    T = q.shape[2]
    dev = q.device
    ar = torch.arange(T, device=dev)
    if cu_seqlens is None:
        raise ValueError("the kernels mix packed sequences from their cu_seqlens offsets")
    cu = cu_seqlens
    seqid = torch.searchsorted(cu, ar.to(cu.dtype), right=True, out_int32=True) - 1
    mode, bs = _mode(causal, block_size)
    dt = operands or q.dtype
    o = value_mix_op(q.to(dt), k.to(dt), v.to(dt), cu.to(torch.int32), seqid.to(torch.int32), mode, bs)
    cw = torch.cumsum(w[0].to(torch.float64), dim=0)
    before = (cw - w[0].to(torch.float64))[first]  # the weight before each token's sequence
    if mode == 0:
        end = ar
    else:  # each query sees up to its end token: its block's last (block-causal) or its sequence's last token
        last = cu.to(torch.int64)[1:][seqid.long()] - 1
        end = last if mode == 1 else torch.minimum(first + ((ar - first) // bs + 1) * bs - 1, last)
    cnt = cw[end] - before
    return o, cnt.to(q.dtype).unsqueeze(0)


def supports(call: Call) -> Optional[str]:
    """Every self-mixing mode — causal, block-causal of any block size, full, each packed too — with key padding and
    rotary, heads up to 128 key and value channels, fp32 / bf16 / fp16 (full mixing of whole rows as two cuBLAS
    products). CUDA tensors (CPU tensors under TRITON_INTERPRET=1 with ``backend("triton")``); also while
    ``torch.compile`` traces (the kernels are custom ops). fp32 features on CUDA need tf32 allowed: under
    ``torch.get_float32_matmul_precision() == "highest"`` the products would be full-fp32 CUDA-core products.
    Not a stream (a call with a state): streams run on the torch form."""
    x = call.x
    if call.state is not None:
        return "a stream (state=…) runs on the torch form"
    if x.dtype not in DTYPES:
        return f"{x.dtype} is not a kernel dtype (fp32, bf16, fp16)"
    if not call.self_mix:
        return "cross-mixing is not in the kernels"
    if call.mask is not None:
        return "an explicit (B, M, N) mask is not in the kernels (quadratic)"
    heads = call.heads
    if call.D // heads > 128 or call.dv // heads > 128:
        return f"heads of {call.D // heads} key and {call.dv // heads} value channels (the kernels take ≤ 128)"
    if x.device.type == "cuda":
        if operand_dtype(x) == torch.float32 and torch.get_float32_matmul_precision() == "highest":
            return ("the features reach the kernels in fp32 and torch.get_float32_matmul_precision() is 'highest': "
                    "their products would run as full-fp32 products on CUDA cores, slower than the torch form "
                    "(allow tf32 with torch.set_float32_matmul_precision('high'))")
        return self_check(x.device, x.dtype)
    return None


# (d, D, dv, heads, N) of the first-use check: several chunks and sequences at the GPU's tiles
CHECK_SHAPE = (32, 64, 32, 2, 100)


def run_check(device: torch.device, dtype: torch.dtype) -> None:
    """A small value-carrying PoM — causal, block-causal, packed causal and packed full — forward and backward on the
    kernels in ``dtype`` against the torch form in float32 on the same device; raises when they disagree."""
    from .. import dispatch
    from . import ValuePomWeights, value_pom

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
                y = value_pom(xs, ValuePomWeights(*ws), heads=H, **kw)
            y.float().square().sum().backward()
            outs.append([y.detach(), xs.grad] + [w.grad for w in ws])
        judge_check(outs, dtype, kw, floor=5e-3)


def self_check(device: torch.device, dtype: torch.dtype = torch.float32) -> Optional[str]:
    """The first-use check of the kernels on ``device`` (float32 and ``dtype``), once per process: None when they
    agree with the torch form, else the reason (the automatic choice then runs the torch form)."""
    return first_use("value_pom", device, dtype, run_check)


def forward(call: Call) -> Tensor:
    """Run a validated call (one :func:`supports` takes): the shared features (:mod:`polymixer.ops.features`), the
    mixing in the kernels — packed sequences in place, every mode — and the shared readout."""
    dt = operand_dtype(call.x)
    m = call.mixing
    if call.cu_k is not None:  # packed self-mixing (supports refuses cross-mixing)
        (q, k, vh, w, zs), first = packed_features(call)
        o, cnt = packed_chunked_mix(q, k, vh, w, first, call.chunk, cu_seqlens=call.cu_k, causal=m.causal,
                                    block_size=m.block_size, operands=dt)
    else:
        (q, k, vh, w, zs), _ = call_features(call)
        o, cnt, _, _ = chunked_mix(q, k, vh, w, causal=m.causal, block_size=m.block_size, chunk=call.chunk,
                                   operands=dt)
    return value_output(o, cnt, zs, call.weights, m)


# ----------------------------------------------------------------------------------------------------------------
# ahead-of-time builds and the kernel bench
# ----------------------------------------------------------------------------------------------------------------


def aot_builds(build: Any) -> List[Any]:
    """The value PoM's builds for ``polymixer kernels``: every kernel at every tile the launches pick in bf16 and in
    fp32 (fp32 states take narrower blocks), at the default tile in fp16, causal and block-causal (the heaviest
    end-token mode), packed; the scan over bf16 and fp32 states — each with the chunk of its architecture."""
    out: List[Any] = []
    for chunk, archs in ((CHUNK, (90,)), (min(CHUNK, SM80_CHUNK), (80,))):
        for mode in (2, 0):  # the heaviest mode first: ``polymixer kernels --representative`` builds it
            for states in ("bf16", "fp32"):  # the states' dtype (fp16 features keep fp32 states)
                scan = dict(PACKED=1, MODE=mode, C=chunk, NCB=SCAN_CHUNKS, BE=SCAN_WIDTH)
                out.append(build("value_pom", "value_scan", tuple(scan.items()), states, 4, MAXNREG, STAGES, archs))
        for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32), ("fp16", torch.float16)):
            default = default_tiles(dtype)[1:]
            every = sorted({t[1:] for t in launch_tiles(dtype)}, key=lambda t: (t != default, t))  # default first
            tiles = [default] if name == "fp16" else every
            for bk, bv, nw in tiles:
                for mode in (2, 0):
                    c = dict(PACKED=1, MODE=mode, C=chunk, BK=bk, BV=bv, PREC="tf32")
                    out += [build("value_pom", k, tuple(c.items()), name, nw, MAXNREG, STAGES, archs)
                            for k in ("value_states", "value_dstates", "value_output", "value_dv", "value_dqk")]
    return out


_BENCH_MODES = {"causal": (0, 1), "full": (1, 1), "block": (2, 256)}


def _bench_inputs(B: int, N: int, H: int, DK: int, DV: int, dtype: torch.dtype, device: torch.device
                  ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """q, k, v, do laid out as the torch form makes them: heads views of (B, N, H·D) projections, v a slice of the
    fused key / value projection."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    rnd = lambda *s: (torch.randn(*s, generator=gen) / s[-1] ** 0.5).to(device, dtype)  # noqa: E731
    heads = lambda t, d: t.view(B, N, H, d).transpose(1, 2)  # noqa: E731
    kv = rnd(B, N, H * (DK + DV))
    k, v = kv.split([H * DK, H * DV], dim=-1)
    return heads(rnd(B, N, H * DK), DK), heads(k, DK), heads(v, DV), heads(rnd(B, N, H * DV), DV)


def bench_kernels(B: int, N: int, H: int, DK: int, DV: int, mode: str, dtype: torch.dtype, device: torch.device
                  ) -> List[Tuple[str, Callable[[], None], int]]:
    """(name, a closure that launches just that kernel on prepared inputs, the bytes it must move to and from HBM at
    the least) for every kernel of one forward and one backward call of B rows of N tokens, H heads of DK key and
    DV value channels, ``mode`` "causal", "full" (each row one sequence) or "block" (blocks of 256 tokens). The bytes
    count the reads and writes of the per-token tensors and of the states, once each."""
    if mode not in _BENCH_MODES:
        raise ValueError(f"mode must be one of {', '.join(_BENCH_MODES)}, got {mode!r}")
    m, bs = _BENCH_MODES[mode]
    q, k, v, do = _bench_inputs(B, N, H, DK, DV, dtype, device)
    g = _geometry(q, v, m, bs, False)
    fwd, bwd = _state_table(g, False, q), _state_table(g, True, q)
    _launch(_states_kernel, g, (k, v), bwd, (), q, q)  # real states and gradients for the kernels that read them
    _launch(_dstates_kernel, g, (q, do), bwd, (), q, q)
    _launch_scan(g, bwd, q, q)
    fwd.copy_(bwd[: fwd.shape[0]])
    sums_f, sums_b = torch.empty_like(fwd), torch.empty_like(bwd)  # what the local sums write: the states stay
    scan_f, scan_b = torch.zeros_like(fwd), torch.zeros_like(bwd)  # the scans run on zeros: repeats stay finite
    o, dv = _heads_empty(B, H, N, DV, q), _heads_empty(B, H, N, DV, q)
    dq, dk = _heads_empty(B, H, N, DK, q), _heads_empty(B, H, N, DK, q)
    tok = B * H * N * q.element_size()  # bytes per channel of a per-token tensor
    state = fwd[0].numel() * fwd.element_size()  # bytes of one state buffer
    nf = fwd.shape[0]
    return [
        ("value_states (forward)", lambda: _launch(_states_kernel, g, (k, v), sums_f, (), q, q),
         tok * (DK + DV) + nf * state),
        ("value_scan (forward)", lambda: _launch_scan(g, scan_f, q, q), 2 * nf * state),
        ("value_output", lambda: _launch(_output_kernel, g, (q, k, v), fwd, (o,), q, q),
         tok * (2 * DK + 2 * DV) + nf * state),
        ("value_states (backward)", lambda: _launch(_states_kernel, g, (k, v), sums_b, (), q, q),
         tok * (DK + DV) + nf * state),
        ("value_dstates", lambda: _launch(_dstates_kernel, g, (q, do), sums_b, (), q, q), tok * (DK + DV) + nf * state),
        ("value_scan (backward)", lambda: _launch_scan(g, scan_b, q, q), 4 * nf * state),
        ("value_dv", lambda: _launch(_dv_kernel, g, (q, k, do), bwd, (dv,), q, q),
         tok * (2 * DK + 2 * DV) + nf * state),
        ("value_dqk", lambda: _launch(_dqk_kernel, g, (q, k, v, do), bwd, (dq, dk), q, q),
         tok * (4 * DK + 2 * DV) + 2 * nf * state),
    ]
