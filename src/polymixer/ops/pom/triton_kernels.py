"""The ``triton`` backend of PoM: the mixing between the two matrix products in Triton kernels, as PyTorch custom ops.

The projections ``z = [W_h x; W_s x]`` and ``y = W_o g`` are cuBLAS matrix products (torch); everything between —
activation, Horner's polynomial, rotary rotation, key weights, the aggregation over the visible tokens, the gate —
runs in kernels that write ``g = gate(z_s + b) ⊙ H``. (The ``triton_gemm`` backend, :mod:`polymixer.ops.pom.
triton_gemm`, runs the same kernels with the input projection inside them, so that z is never written at all.)

**Chunk-parallel passes** (docs/gpu.md, "The PoM kernels", for the design and its counted HBM passes). The
aggregation is a segmented prefix sum over the tokens, computed the way current scan kernels (flash-linear-attention's
cumsum and chunk kernels) compute one: the tokens are cut into chunks of ``BLOCK_N``, and every pass is parallel over
(row, chunk, block of channels) — enough programs to fill the GPU at any batch, whatever the length:

1. *chunk sums*: each chunk's sum of the features of its last sequence (the tokens from the chunk's last sequence
   start on; the whole chunk when none starts in it) and its visible weight. In the end-token modes the same pass
   also writes each end token's prefix sum within its chunk to the end table;
2. *scan*: a segmented exclusive scan over the chunk sums (float64 in registers, blocks of chunks at a time) gives the
   carry entering every chunk — the sum of the earlier tokens of the sequence open at the chunk's start;
3. *apply*: causal mixing recomputes the features, scans them within the chunk, adds the carry, gates and writes g;
   the end-token modes (full, block-causal, packed full / block-causal) read each query's end-token sum (its end
   table row plus the carry of the end's chunk) and never touch z_h again.

The backward has the same shape, reversed: chunk sums of the gated gradient ``R(pos)(gate ⊙ dg) / W``, a reverse
scan, then a parallel apply that forms every feature's gradient and writes dz_h, dz_s and the parameter-gradient
partials — stored per program and summed by torch: nothing is atomic, results are deterministic.

**Host side.** The kernels run inside the custom ops ``polymixer::pom_mix`` / ``pom_mix_backward``
(:func:`polymixer.ops.triton_common.kernel_op`): ``torch.compile(fullgraph=True)`` and ``torch.export`` keep them.
No host synchronisation anywhere: table sizes come from shapes (a bound where packing makes the count
data-dependent). Offsets that can pass 2³¹ elements are 64-bit. The modes, shapes and non-linearities the kernels
take: :func:`kernel_limits`; the rest (cross-mixing, an explicit (B, M, N) mask, float64, ...) runs on the torch form,
or raises under an explicit ``backend("triton")``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..call import Call
from ..common import check_positions
from .tiles import ROLES, TILES, head_class
from ..triton_common import (
    ACT_CODES,
    DTYPES,
    GATE_CODES,
    MAX_DEGREE,
    TWO_PI,
    act_fn,
    act_grad,
    check_runs,
    first_use,
    gate_fn,
    gate_grad,
    interpreted,
    kernel_op,
    last_row,
    launch,
    offset64,
    pow2,
    dot_precision,
    mma,
    seg_add,
    sequence_of,
    end_of,
    sm_count,
    judge_check,
)

import triton  # noqa: E402  (triton_common raised a clear ImportError already if it is missing)
import triton.language as tl  # noqa: E402

__all__ = ["supports", "forward", "self_check", "KERNELS", "LaunchConfig", "ROLES", "TILES", "role_tile",
           "head_class", "use_config", "interpreted", "ACT_CODES", "GATE_CODES", "MODES",
           "mix_layout", "MixLayout", "mix", "mix_backward", "Saved", "bench_kernels",
           "needs_check", "kernel_limits", "mix_args", "CHECK_SHAPE", "CHECK_MODES", "call_layout",
           "will_differentiate", "run_check", "pom_mix_op", "pom_gemm_op"]

MODES = {"causal": 0, "full": 1, "block": 2}
ROPE_CODES = {None: 0, "1d": 1, "2d": 2}
SCAN_CHUNKS = 64  # chunks per step of the scan kernel
SCAN_CHANNELS = 32  # channels per program of the scan kernel
# software pipelining of the loop over a program's chunks (the next chunk's loads in flight while one is computed),
# per kernel: the backward's apply keeps so many tiles alive that a second stage of buffers would spill registers
STAGES = {"sums": 2, "apply": 2, "grad_sums": 2, "grad_apply": 1}


# ----------------------------------------------------------------------------------------------------------------
# pieces of a tile
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _program(NC, CPP, half, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Where a program of the parallel passes works — one per (row · group of CPP chunks, channel block): (its id,
    its row, its first chunk, its channel block, the block's channels and their mask, a chunk's token offsets)."""
    NPB = tl.cdiv(NC, CPP)
    pid = tl.program_id(0)
    b = pid // NPB
    dblk = tl.program_id(1)
    ch = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    return pid, b, (pid - b * NPB) * CPP, dblk, ch, ch < half, tl.arange(0, BLOCK_N)


@triton.jit
def _coeffs(coeff_ptr, ch, cmask, K: tl.constexpr):
    """α_1 … α_5 of channels ``ch`` (zeros past the degree): loaded once per program, outside its loop."""
    a1 = tl.load(coeff_ptr + ch * K, mask=cmask, other=0.0).to(tl.float32)
    a2 = a1 * 0.0
    a3 = a2
    a4 = a2
    a5 = a2
    if K > 1:
        a2 = tl.load(coeff_ptr + ch * K + 1, mask=cmask, other=0.0).to(tl.float32)
    if K > 2:
        a3 = tl.load(coeff_ptr + ch * K + 2, mask=cmask, other=0.0).to(tl.float32)
    if K > 3:
        a4 = tl.load(coeff_ptr + ch * K + 3, mask=cmask, other=0.0).to(tl.float32)
    if K > 4:
        a5 = tl.load(coeff_ptr + ch * K + 4, mask=cmask, other=0.0).to(tl.float32)
    return a1, a2, a3, a4, a5


@triton.jit
def _coef(a1, a2, a3, a4, a5, q: tl.constexpr):
    """α_q as a row of a tile."""
    if q == 1:
        r = a1
    elif q == 2:
        r = a2
    elif q == 3:
        r = a3
    elif q == 4:
        r = a4
    else:
        r = a5
    return r[None, :]


@triton.jit
def _poly(h, a1, a2, a3, a4, a5, K: tl.constexpr):
    """Σ_{q=1..K} α_q ⊙ h^q by Horner's scheme."""
    acc = _coef(a1, a2, a3, a4, a5, K) * h
    for t in tl.static_range(1, K):
        acc = (acc + _coef(a1, a2, a3, a4, a5, K - t)) * h
    return acc


@triton.jit
def _poly_grad(h, a1, a2, a3, a4, a5, K: tl.constexpr):
    """d/dh Σ_q α_q h^q = Σ_q q·α_q h^(q−1)."""
    acc = K * _coef(a1, a2, a3, a4, a5, K) + h * 0.0
    for t in tl.static_range(1, K):
        acc = acc * h + (K - t) * _coef(a1, a2, a3, a4, a5, K - t)
    return acc


@triton.jit
def _rope_freqs(ch, half, log2base, ROPE: tl.constexpr):
    """The inverse frequencies of channel pairs ``ch`` (float64), once per program: base^(−k/pairs) — 1-D (and,
    unread, without rotary) — or, 2-D, the first half of the pairs turning with the row and the second with the
    column (``col``)."""
    if ROPE == 2:
        q = half // 2
        col = ch >= q
        k = tl.where(col, ch - q, ch)
        inv = tl.exp2(-(k.to(tl.float64) / q) * log2base)
    else:
        col = ch < 0
        inv = tl.exp2(-(ch.to(tl.float64) / half) * log2base)
    return inv, col


@triton.jit
def _rope_cos_sin(pos_ptr, n, nmask, s0, inv, col, like, ROPE: tl.constexpr, HAS_POS: tl.constexpr):
    """cos / sin (tokens, channel pairs) of the rotary angles, as :func:`polymixer.ops.common.rope_angles` computes
    them: position × inverse frequency in float64, reduced modulo 2π, then cos / sin in fp32. Without positions a
    token's position is its index in its sequence (``n − s0``); 2-D positions are (row, col) pairs, row-major.
    Without rotary: ``like`` twice (placeholders no one reads)."""
    cs = like
    sn = like
    if ROPE:
        if ROPE == 1:
            if HAS_POS:
                p = tl.load(pos_ptr + n, mask=nmask, other=0.0).to(tl.float64)
            else:
                p = (n - s0).to(tl.float64)
            th = p[:, None] * inv[None, :]
        else:
            prow = tl.load(pos_ptr + 2 * n, mask=nmask, other=0.0).to(tl.float64)
            pcol = tl.load(pos_ptr + 2 * n + 1, mask=nmask, other=0.0).to(tl.float64)
            th = tl.where(col[None, :], pcol[:, None], prow[:, None]) * inv[None, :]
        red = (th - TWO_PI * tl.floor(th / TWO_PI)).to(tl.float32)
        cs = tl.cos(red)
        sn = tl.sin(red)
    return cs, sn


@triton.jit
def _tile_z(zc, xc, win_ptr, rows, nmask, ch, cmask, dblk, half, D, d, s_zn, s_xn, s_w,
            NEED_H: tl.constexpr, NEED_S: tl.constexpr, ROPE: tl.constexpr, FUSED: tl.constexpr, GB: tl.constexpr,
            NSP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
            PREC: tl.constexpr):
    """A chunk's pre-activations, fp32 (BLOCK_N, BLOCK_D): z_h of its channels (``lo``) and of their rotary partners
    (``hi`` = channel + D/2), and the gate's z_s of each channel's head (lo, hi), bias not added. From z (loads), or —
    FUSED — from x and W_in (matrix products over the d input features: z never exists in memory)."""
    m2 = nmask[:, None] & cmask[None, :]
    zlo = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    zhi = zlo
    ulo = zlo
    uhi = zlo
    NS: tl.constexpr = BLOCK_D // GB
    if FUSED:
        slot = tl.arange(0, NSP)
        slo = dblk * NS + slot  # the heads of this program's channels
        shi = (half + dblk * BLOCK_D) // GB + slot
        smask = (slot < NS) & (slo * GB < half)
        ulo_s = tl.zeros((BLOCK_N, NSP), tl.float32)
        uhi_s = ulo_s
        for k0 in range(0, d, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            km = kk < d
            xt = tl.load(xc + rows[:, None] * s_xn + kk[None, :], mask=nmask[:, None] & km[None, :], other=0.0)
            if NEED_H:
                wt = tl.load(win_ptr + ch[None, :] * s_w + kk[:, None], mask=cmask[None, :] & km[:, None], other=0.0)
                zlo += mma(xt, wt, PREC)
                if ROPE:
                    wt = tl.load(win_ptr + (ch + half)[None, :] * s_w + kk[:, None], mask=cmask[None, :] & km[:, None],
                                 other=0.0)
                    zhi += mma(xt, wt, PREC)
            if NEED_S:
                if GB == 1:  # a gate per channel: one more product of the tile's width
                    wt = tl.load(win_ptr + (D + slo)[None, :] * s_w + kk[:, None], mask=smask[None, :] & km[:, None],
                                 other=0.0)
                    ulo_s += mma(xt, wt, PREC)
                    if ROPE:
                        wt = tl.load(win_ptr + (D + shi)[None, :] * s_w + kk[:, None],
                                     mask=smask[None, :] & km[:, None], other=0.0)
                        uhi_s += mma(xt, wt, PREC)
                else:  # a gate per head of GB channels: BLOCK_D / GB dot products per token, on CUDA cores
                    xf = xt.to(tl.float32)
                    for j in tl.static_range(NS):
                        wl = tl.load(win_ptr + (D + dblk * NS + j) * s_w + kk, mask=km, other=0.0).to(tl.float32)
                        ulo_s += tl.where((slot == j)[None, :], tl.sum(xf * wl[None, :], axis=1)[:, None], 0.0)
                        if ROPE:
                            wh = tl.load(win_ptr + (D + (half + dblk * BLOCK_D) // GB + j) * s_w + kk, mask=km,
                                         other=0.0).to(tl.float32)
                            uhi_s += tl.where((slot == j)[None, :], tl.sum(xf * wh[None, :], axis=1)[:, None], 0.0)
        if NEED_S:
            if (GB == 1) and (NSP == BLOCK_D):
                ulo = ulo_s
                uhi = uhi_s
            else:  # every channel reads its head's gate
                head = tl.arange(0, BLOCK_D) // GB
                for j in tl.static_range(NS):
                    pick = (head == j)[None, :]
                    ulo = tl.where(pick, tl.sum(tl.where((slot == j)[None, :], ulo_s, 0.0), axis=1)[:, None], ulo)
                    if ROPE:
                        uhi = tl.where(pick, tl.sum(tl.where((slot == j)[None, :], uhi_s, 0.0), axis=1)[:, None], uhi)
    else:
        loc = rows[:, None] * s_zn + ch[None, :]
        if NEED_H:
            zlo = tl.load(zc + loc, mask=m2, other=0.0).to(tl.float32)
            if ROPE:
                zhi = tl.load(zc + loc + half, mask=m2, other=0.0).to(tl.float32)
        if NEED_S:
            ulo = tl.load(zc + rows[:, None] * s_zn + D + (ch // GB)[None, :], mask=m2, other=0.0).to(tl.float32)
            if ROPE:
                uhi = tl.load(zc + rows[:, None] * s_zn + D + ((ch + half) // GB)[None, :], mask=m2,
                              other=0.0).to(tl.float32)
    return zlo, zhi, ulo, uhi


@triton.jit
def _features(zlo, zhi, alo, ahi, cs, sn, w, m2, K: tl.constexpr, ACT: tl.constexpr, ROPE: tl.constexpr,
              HAS_W: tl.constexpr):
    """The features of a tile, rotated by position and weighted: (lo, hi) halves (hi = lo without rotary). ``alo`` /
    ``ahi``: the coefficient vectors of :func:`_coeffs`."""
    a1, a2, a3, a4, a5 = alo
    plo = _poly(act_fn(zlo, ACT), a1, a2, a3, a4, a5, K)
    phi = plo
    if ROPE:
        b1, b2, b3, b4, b5 = ahi
        phi = _poly(act_fn(zhi, ACT), b1, b2, b3, b4, b5, K)
    plo, phi = _from_query_frame(plo, phi, cs, sn, ROPE)  # R(pos)
    if HAS_W:
        plo = plo * w[:, None]
        phi = phi * w[:, None]
    return tl.where(m2, plo, 0.0), tl.where(m2, phi, 0.0)


@triton.jit
def _weights(w_ptr, n, nmask, HAS_W: tl.constexpr):
    """Each token's key weight (1 or 0 with key padding; 1 otherwise, 0 past the row)."""
    if HAS_W:
        w = tl.load(w_ptr + n, mask=nmask, other=0).to(tl.float32)
    else:
        w = tl.where(nmask, 1.0, 0.0)
    return w


@triton.jit
def _inverse(W, nmask, MEAN: tl.constexpr):
    """1 / the visible weight (0 where nothing is visible) for a mean; 1 for a sum."""
    if MEAN:
        inv = tl.where(W > 0, 1.0 / tl.maximum(W, 1.0e-30), 0.0)
    else:
        inv = tl.where(nmask, 1.0, 0.0)
    return inv


@triton.jit
def _to_query_frame(hlo, hhi, cs, sn, ROPE: tl.constexpr):
    """R(−pos) of an aggregate: read it in the query's own frame."""
    if ROPE:
        rlo = hlo * cs + hhi * sn
        hhi = hhi * cs - hlo * sn
        hlo = rlo
    return hlo, hhi


@triton.jit
def _from_query_frame(glo, ghi, cs, sn, ROPE: tl.constexpr):
    """R(pos): the transpose of :func:`_to_query_frame` (a feature's rotation, a gradient's way back)."""
    if ROPE:
        rlo = glo * cs - ghi * sn
        ghi = ghi * cs + glo * sn
        glo = rlo
    return glo, ghi


@triton.jit
def _unrotate_weight(dlo, dhi, cs, sn, w, ROPE: tl.constexpr, HAS_W: tl.constexpr):
    """dL/d(rotated, weighted feature) → dL/d(feature): R(−pos), times the key weight."""
    dlo, dhi = _to_query_frame(dlo, dhi, cs, sn, ROPE)
    if HAS_W:
        dlo = dlo * w[:, None]
        dhi = dhi * w[:, None]
    return dlo, dhi


@triton.jit
def _store_g(hlo, hhi, ulo, uhi, gc, rows, s_gn, ch, half, m2, GATE: tl.constexpr, ROPE: tl.constexpr):
    """g = gate(z_s + b) ⊙ H (H already in the query's frame)."""
    loc = rows[:, None] * s_gn + ch[None, :]
    tl.store(gc + loc, (gate_fn(ulo, GATE) * hlo).to(gc.dtype.element_ty), mask=m2)
    if ROPE:
        tl.store(gc + loc + half, (gate_fn(uhi, GATE) * hhi).to(gc.dtype.element_ty), mask=m2)


@triton.jit
def _gate_back(hq, u, dg, dzc, dspc, rows, nmask, m2, c0, nslots, D, s_zn, s_dn, GATE: tl.constexpr,
               GB: tl.constexpr, NS: tl.constexpr, HP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """The gate's gradients for one half of a tile whose first channel is ``c0``: dL/dz_s of its heads, their column
    sums (for dL/db), and gate(u) ⊙ dg, the gradient that flows into H (``hq``: H in the query's frame). A tile of
    NS whole heads stores dL/dz_s itself; a head split over HP programs (wider than the tile) stores this part's
    share at ``dspc`` (the host sums the parts, and dL/db from them)."""
    if HP == 1:
        slot = c0 // GB + tl.arange(0, NS)
        smask = tl.arange(0, NS) < nslots
        ds = tl.sum(tl.reshape(tl.where(m2, dg * hq, 0.0), (BLOCK_N, NS, GB)), axis=2)
        us = tl.max(tl.reshape(u, (BLOCK_N, NS, GB)), axis=2)  # a head's channels share one u
        sm2 = nmask[:, None] & smask[None, :]
        du = tl.where(sm2, ds * gate_grad(us, GATE), 0.0)
        tl.store(dzc + rows[:, None] * s_zn + D + slot[None, :], du.to(dzc.dtype.element_ty), mask=sm2)
        dbias = tl.sum(du, axis=0)
    else:
        first = (tl.arange(0, BLOCK_D) == 0)[None, :]  # every channel of the tile belongs to one head
        us = tl.sum(tl.where(first, u, 0.0), axis=1)
        du = tl.where(nmask, tl.sum(tl.where(m2, dg * hq, 0.0), axis=1) * gate_grad(us, GATE), 0.0)
        tl.store(dspc + rows * s_dn + (c0 // GB) * HP + (c0 % GB) // BLOCK_D, du, mask=nmask)
        dbias = tl.zeros((NS,), tl.float32)
    return tl.where(m2, gate_fn(u, GATE) * dg, 0.0), dbias


@triton.jit
def _poly_back(z, dp, a, m2, K: tl.constexpr, ACT: tl.constexpr, KP: tl.constexpr):
    """From dL/d(feature before rotation and weights) of one half: dL/dz_h, and the tile's dL/dα as (KP, channels)."""
    a1, a2, a3, a4, a5 = a
    h = act_fn(z, ACT)
    dz = tl.where(m2, dp * _poly_grad(h, a1, a2, a3, a4, a5, K) * act_grad(z, ACT), 0.0)
    kk = tl.arange(0, KP)
    dc = tl.zeros((KP, dz.shape[1]), tl.float32)
    hp = h
    for q in tl.static_range(K):
        dc += tl.where(kk[:, None] == q, tl.sum(tl.where(m2, dp * hp, 0.0), axis=0)[None, :], 0.0)
        hp = hp * h
    return dz, dc


@triton.jit
def _row_sum(x, pick):
    """Σ over the tokens where ``pick`` of a (tokens, channels) tile."""
    return tl.sum(tl.where(pick[:, None], x, 0.0), axis=0)


@triton.jit
def _store_row(ptr, ch, cmask, half, vlo, vhi, ROPE: tl.constexpr):
    """A table row: the lo channels at ``ch``, the hi ones at ``ch + half``."""
    tl.store(ptr + ch, vlo, mask=cmask)
    if ROPE:
        tl.store(ptr + half + ch, vhi, mask=cmask)


@triton.jit
def _load_rows(ptr, idx, half, ch, m2, ROPE: tl.constexpr):
    """Rows ``idx`` (one per token; the offsets of its row — int64 for a table's rows of width D) of a table or of a
    per-token tensor: (lo, hi), fp32."""
    off = idx[:, None] + ch[None, :]
    lo = tl.load(ptr + off, mask=m2, other=0.0).to(tl.float32)
    hi = lo
    if ROPE:
        hi = tl.load(ptr + off + half, mask=m2, other=0.0).to(tl.float32)
    return lo, hi


@triton.jit
def _store_rows(ptr, idx, half, ch, m2, vlo, vhi, ROPE: tl.constexpr):
    """Rows ``idx`` of a table where ``m2``: the inverse of :func:`_load_rows`."""
    off = idx[:, None] + ch[None, :]
    tl.store(ptr + off, vlo, mask=m2)
    if ROPE:
        tl.store(ptr + off + half, vhi, mask=m2)


@triton.jit
def _scan_tokens(f, n, s0, s1, PACKED: tl.constexpr, REVERSE: tl.constexpr):
    """The running sum of a (tokens, channels) tile within each sequence, from the chunk's first token (REVERSE: to
    its last). Unpacked rows hold one sequence, whose only start is the row's first token: a plain cumsum."""
    if PACKED:
        if REVERSE:
            flag = (n == s1 - 1).to(tl.int32)
        else:
            flag = (n == s0).to(tl.int32)
        out, _ = tl.associative_scan((f, flag[:, None] + tl.zeros(f.shape, tl.int32)), 0, seg_add, reverse=REVERSE)
    else:
        out = tl.cumsum(f, 0, reverse=REVERSE)
    return out


@triton.jit
def _scan_weights(w, n, s0, PACKED: tl.constexpr):
    """The running visible weight of a chunk's tokens within each sequence (from the chunk's first token)."""
    if PACKED:
        out, _ = tl.associative_scan((w, (n == s0).to(tl.int32)), 0, seg_add)
    else:
        out = tl.cumsum(w, 0)
    return out


@triton.jit
def _holds_start(c, valid, seqid_ptr, cu_ptr, N, BN, PACKED: tl.constexpr):
    """Whether chunks ``c`` hold a sequence start: the sequence of a chunk's last token starts inside it."""
    if PACKED:
        last = tl.minimum(c * BN + BN, N) - 1
        sid = tl.load(seqid_ptr + last, mask=valid, other=0)
        s0 = tl.load(cu_ptr + sid, mask=valid, other=0).to(tl.int32)
        has = (s0 >= c * BN) & valid
    else:
        has = (c == 0) & valid
    return has.to(tl.int32)


# ----------------------------------------------------------------------------------------------------------------
# the three passes of the forward
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _sums_kernel(z_ptr, x_ptr, win_ptr, coeff_ptr, w_ptr, pos_ptr, seqid_ptr, cu_ptr, sums_ptr, sumsw_ptr, end_ptr,
                 endw_ptr, N, D, half, d, BS, NC, CPP, log2base: tl.float64, s_zb, s_zn, s_xb, s_xn, s_w, s_wb, s_pb,
                 s_tb, s_twb, s_eb, s_ewb,
                 K: tl.constexpr, ACT: tl.constexpr, ROPE: tl.constexpr, HAS_W: tl.constexpr, HAS_POS: tl.constexpr,
                 PACKED: tl.constexpr, MODE: tl.constexpr, FUSED: tl.constexpr, GB: tl.constexpr, NSP: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, PREC: tl.constexpr,
                 STAGES: tl.constexpr):
    """Forward pass 1, one program per (row · group of CPP chunks, channel block), each chunk independent: the sum
    of the features of the chunk's last sequence and of their weights (what the chunk carries into the next); in the
    end-token modes also every end token's prefix sum within its chunk, at its row of the end table."""
    TOTAL: tl.constexpr = (MODE == 1) and (not PACKED)
    pid, b, c0, dblk, ch, cmask, rows = _program(NC, CPP, half, BLOCK_N, BLOCK_D)
    freqs = _rope_freqs(ch, half, log2base, ROPE)
    zrow = z_ptr + offset64(b, s_zb)
    xrow = x_ptr + offset64(b, s_xb)
    wrow = w_ptr + offset64(b, s_wb)
    prow = pos_ptr + offset64(b, s_pb)
    trow = sums_ptr + offset64(b, s_tb)
    erow = end_ptr + offset64(b, s_eb)
    ewrow = endw_ptr + offset64(b, s_ewb)
    for c in tl.range(c0, tl.minimum(c0 + CPP, NC), num_stages=STAGES):
        n = c * BLOCK_N + rows
        nmask = n < N
        m2 = nmask[:, None] & cmask[None, :]
        alo = _coeffs(coeff_ptr, ch, cmask, K)  # in the loop: hoisted, their broadcasts would hold registers
        ahi = alo
        if ROPE:
            ahi = _coeffs(coeff_ptr, ch + half, cmask, K)
        zlo, zhi, _, _ = _tile_z(zrow + offset64(c * BLOCK_N, s_zn), xrow + offset64(c * BLOCK_N, s_xn), win_ptr,
                                 rows, nmask, ch, cmask, dblk, half, D, d, s_zn, s_xn, s_w, True, False, ROPE, FUSED,
                                 GB, NSP, BLOCK_N, BLOCK_D, BLOCK_K, PREC)
        sid, s0, s1 = sequence_of(n, nmask, seqid_ptr, cu_ptr, N, PACKED)
        w = _weights(wrow, n, nmask, HAS_W)
        cs, sn = _rope_cos_sin(prow, n, nmask, s0, freqs[0], freqs[1], zlo, ROPE, HAS_POS)
        flo, fhi = _features(zlo, zhi, alo, ahi, cs, sn, w, m2, K, ACT, ROPE, HAS_W)
        tail = (s1 > tl.minimum(c * BLOCK_N + BLOCK_N, N) - 1) & nmask  # the sequence of the chunk's last token
        _store_row(trow + offset64(c, D), ch, cmask, half, _row_sum(flo, tail), _row_sum(fhi, tail), ROPE)
        if dblk == 0:
            tl.store(sumsw_ptr + offset64(b, s_twb) + c, tl.sum(tl.where(tail, w, 0.0), axis=0))
        if TOTAL:  # the row's one end is its last token: the last chunk's prefix there is the chunk's sum
            if c == NC - 1:
                _store_row(erow, ch, cmask, half, _row_sum(flo, nmask), _row_sum(fhi, nmask), ROPE)
                if dblk == 0:
                    tl.store(ewrow, tl.sum(w, axis=0))
        elif MODE != 0:
            e, eid = end_of(n, sid, s0, s1, BS, MODE)
            isend = (n == e) & nmask
            plo = _scan_tokens(flo, n, s0, s1, PACKED, False)
            phi = plo
            if ROPE:
                phi = _scan_tokens(fhi, n, s0, s1, PACKED, False)
            _store_rows(erow, eid.to(tl.int64) * D, half, ch, isend[:, None] & cmask[None, :], plo, phi, ROPE)
            if dblk == 0:
                tl.store(ewrow + eid, _scan_weights(w, n, s0, PACKED), mask=isend)


@triton.jit
def _scan_kernel(src_ptr, srcw_ptr, dst_ptr, dstw_ptr, seqid_ptr, cu_ptr, N, NC, W, BN, s_tb, s_twb,
                 PACKED: tl.constexpr, REVERSE: tl.constexpr, HAS_WT: tl.constexpr, CB: tl.constexpr,
                 BLOCK_S: tl.constexpr):
    """Pass 2, one program per (row, block of BLOCK_S table columns): the carry entering every chunk, a segmented
    scan over the chunks' sums in float64, CB chunks per step. Forwards dst[c] = src[c − 1] + dst[c − 1], restarted
    after a chunk that holds a sequence start; REVERSE dst[c] = src[c + 1] + dst[c + 1], restarted before one. With
    HAS_WT the first program scans the weights too."""
    b = tl.program_id(0)
    sblk = tl.program_id(1)
    ch = sblk * BLOCK_S + tl.arange(0, BLOCK_S)
    cmask = ch < W
    k = tl.arange(0, CB)
    srow = src_ptr + offset64(b, s_tb)
    drow = dst_ptr + offset64(b, s_tb)
    carry = tl.zeros((BLOCK_S,), tl.float64)
    cw = tl.zeros((1,), tl.float64)
    nblocks = tl.cdiv(NC, CB)
    for i in range(0, nblocks):
        if REVERSE:
            cc = (nblocks - 1 - i) * CB + k
            src = cc + 1
            edge = 0
        else:
            cc = i * CB + k
            src = cc - 1
            edge = CB - 1
        valid = (src >= 0) & (src < NC)
        has = _holds_start(src, valid, seqid_ptr, cu_ptr, N, BN, PACKED)
        opened = tl.cumsum(has, 0, reverse=REVERSE) == 0  # no restart between the block's edge and the chunk
        y = tl.load(srow + src.to(tl.int64)[:, None] * W + ch[None, :], mask=valid[:, None] & cmask[None, :],
                    other=0.0).to(tl.float64)
        acc, _flags = tl.associative_scan((y, has[:, None] + tl.zeros((CB, BLOCK_S), tl.int32)), 0, seg_add,
                                     reverse=REVERSE)
        acc = acc + tl.where(opened[:, None], carry[None, :], 0.0)
        tl.store(drow + cc.to(tl.int64)[:, None] * W + ch[None, :], acc.to(tl.float32),
                 mask=(cc < NC)[:, None] & cmask[None, :])
        carry = last_row(acc, k, edge)
        if HAS_WT:
            if sblk == 0:
                yw = tl.load(srcw_ptr + offset64(b, s_twb) + src, mask=valid, other=0.0).to(tl.float64)
                aw, _flags_w = tl.associative_scan((yw, has), 0, seg_add, reverse=REVERSE)
                aw = aw + tl.where(opened, tl.sum(cw, axis=0), 0.0)
                tl.store(dstw_ptr + offset64(b, s_twb) + cc, aw.to(tl.float32), mask=cc < NC)
                cw = tl.zeros((1,), tl.float64) + tl.sum(tl.where(k == edge, aw, 0.0), axis=0)


@triton.jit
def _apply_kernel(z_ptr, x_ptr, win_ptr, coeff_ptr, bias_ptr, w_ptr, pos_ptr, seqid_ptr, cu_ptr, carry_ptr,
                  carryw_ptr, end_ptr, endw_ptr, g_ptr, N, D, half, d, BS, NC, CPP, log2base: tl.float64, s_zb, s_zn,
                  s_xb, s_xn, s_w, s_wb, s_pb, s_tb, s_twb, s_eb, s_ewb, s_gb, s_gn,
                  K: tl.constexpr, ACT: tl.constexpr, GATE: tl.constexpr, ROPE: tl.constexpr, HAS_W: tl.constexpr,
                  HAS_POS: tl.constexpr, PACKED: tl.constexpr, MEAN: tl.constexpr, MODE: tl.constexpr,
                  FUSED: tl.constexpr, GB: tl.constexpr, NSP: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, PREC: tl.constexpr, STAGES: tl.constexpr):
    """Forward pass 3, in parallel over chunks: each query's aggregate H, gated — causal: the features' running sum
    within the chunk plus the carry of the sequence open at the chunk's start; end-token modes: the query's end-token
    sum (its end table row, plus the carry of the end's chunk when the sequence began before it). Writes g."""
    pid, b, c0, dblk, ch, cmask, rows = _program(NC, CPP, half, BLOCK_N, BLOCK_D)
    freqs = _rope_freqs(ch, half, log2base, ROPE)
    blo = tl.load(bias_ptr + ch // GB, mask=cmask, other=0.0).to(tl.float32)[None, :]
    bhi = blo
    if ROPE:
        bhi = tl.load(bias_ptr + (ch + half) // GB, mask=cmask, other=0.0).to(tl.float32)[None, :]
    zrow = z_ptr + offset64(b, s_zb)
    xrow = x_ptr + offset64(b, s_xb)
    wrow = w_ptr + offset64(b, s_wb)
    prow = pos_ptr + offset64(b, s_pb)
    crow = carry_ptr + offset64(b, s_tb)
    cwrow = carryw_ptr + offset64(b, s_twb)
    for c in tl.range(c0, tl.minimum(c0 + CPP, NC), num_stages=STAGES):
        n = c * BLOCK_N + rows
        nmask = n < N
        m2 = nmask[:, None] & cmask[None, :]
        alo = _coeffs(coeff_ptr, ch, cmask, K)  # in the loop: hoisted, their broadcasts would hold registers
        ahi = alo
        if ROPE:
            ahi = _coeffs(coeff_ptr, ch + half, cmask, K)
        sid, s0, s1 = sequence_of(n, nmask, seqid_ptr, cu_ptr, N, PACKED)
        zlo, zhi, ulo, uhi = _tile_z(zrow + offset64(c * BLOCK_N, s_zn), xrow + offset64(c * BLOCK_N, s_xn),
                                     win_ptr, rows, nmask, ch, cmask, dblk, half, D, d, s_zn, s_xn, s_w, MODE == 0,
                                     True, ROPE, FUSED, GB, NSP, BLOCK_N, BLOCK_D, BLOCK_K, PREC)
        cs, sn = _rope_cos_sin(prow, n, nmask, s0, freqs[0], freqs[1], ulo, ROPE, HAS_POS)
        if MODE == 0:
            w = _weights(wrow, n, nmask, HAS_W)
            flo, fhi = _features(zlo, zhi, alo, ahi, cs, sn, w, m2, K, ACT, ROPE, HAS_W)
            opened = (s0 < c * BLOCK_N) & nmask  # the sequence open at the chunk's start: its tokens read the carry
            om = opened[:, None] & cmask[None, :]
            clo, chi = _load_rows(crow, (c + rows * 0).to(tl.int64) * D, half, ch, om, ROPE)
            plo = _scan_tokens(flo, n, s0, s1, PACKED, False) + clo
            phi = plo
            if ROPE:
                phi = _scan_tokens(fhi, n, s0, s1, PACKED, False) + chi
            W = _scan_weights(w, n, s0, PACKED) + tl.load(cwrow + c + rows * 0, mask=opened, other=0.0)
        else:
            e, eid = end_of(n, sid, s0, s1, BS, MODE)
            ce = e // BLOCK_N
            open_e = (s0 < ce * BLOCK_N) & nmask  # the sequence began before the end's chunk: add its carry
            plo, phi = _load_rows(end_ptr + offset64(b, s_eb), eid.to(tl.int64) * D, half, ch, m2, ROPE)
            clo, chi = _load_rows(crow, ce.to(tl.int64) * D, half, ch, open_e[:, None] & cmask[None, :], ROPE)
            plo = plo + clo
            phi = phi + chi
            W = tl.load(endw_ptr + offset64(b, s_ewb) + eid, mask=nmask, other=0.0) + \
                tl.load(cwrow + ce, mask=open_e, other=0.0)
        inv = _inverse(W, nmask, MEAN)
        hlo, hhi = _to_query_frame(plo * inv[:, None], phi * inv[:, None], cs, sn, ROPE)
        _store_g(hlo, hhi, ulo + blo, uhi + bhi, g_ptr + offset64(b, s_gb) + offset64(c * BLOCK_N, s_gn), rows,
                 s_gn, ch, half, m2, GATE, ROPE)


# ----------------------------------------------------------------------------------------------------------------
# the three passes of the backward
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _grad_sums_kernel(z_ptr, x_ptr, win_ptr, bias_ptr, w_ptr, pos_ptr, seqid_ptr, cu_ptr, dg_ptr, dz_ptr, carry_ptr,
                      carryw_ptr, end_ptr, endw_ptr, hsum_ptr, start_ptr, dbias_ptr, dsp_ptr, N, D, half, d, BS, NC,
                      CPP, log2base: tl.float64, s_zb, s_zn, s_xb, s_xn, s_w, s_wb, s_pb, s_tb, s_twb, s_eb, s_ewb,
                      s_gb, s_gn, s_db, s_dn,
                      GATE: tl.constexpr, NS: tl.constexpr, HP: tl.constexpr, ROPE: tl.constexpr,
                      HAS_W: tl.constexpr, HAS_POS: tl.constexpr,
                      PACKED: tl.constexpr, MEAN: tl.constexpr, MODE: tl.constexpr, FUSED: tl.constexpr,
                      GB: tl.constexpr, NSP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                      BLOCK_K: tl.constexpr, PREC: tl.constexpr, STAGES: tl.constexpr):
    """Backward pass 1, in parallel over chunks: the gated gradient G = R(pos)(gate ⊙ dg) / W of every query, and the
    sum of G over the chunk's tokens before its first sequence start (what flows back into the chunk before). In the
    end-token modes also the gate's gradients (dz_s stored, dL/db partials) and, at each block's first token, the
    reverse running sum of G within the chunk, at the block's row of the start table."""
    TOTAL: tl.constexpr = (MODE == 1) and (not PACKED)
    pid, b, c0, dblk, ch, cmask, rows = _program(NC, CPP, half, BLOCK_N, BLOCK_D)
    nslots = tl.minimum(NS, (half - dblk * BLOCK_D + GB - 1) // GB)
    freqs = _rope_freqs(ch, half, log2base, ROPE)
    blo = tl.load(bias_ptr + ch // GB, mask=cmask, other=0.0).to(tl.float32)[None, :]
    bhi = blo
    if ROPE:
        bhi = tl.load(bias_ptr + (ch + half) // GB, mask=cmask, other=0.0).to(tl.float32)[None, :]
    zrow = z_ptr + offset64(b, s_zb)
    xrow = x_ptr + offset64(b, s_xb)
    dzrow = dz_ptr + offset64(b, s_zb)
    dsrow = dsp_ptr + offset64(b, s_db)
    dgrow = dg_ptr + offset64(b, s_gb)
    wrow = w_ptr + offset64(b, s_wb)
    prow = pos_ptr + offset64(b, s_pb)
    crow = carry_ptr + offset64(b, s_tb)
    cwrow = carryw_ptr + offset64(b, s_twb)
    srow = start_ptr + offset64(b, s_eb)
    dblo = tl.zeros((NS,), tl.float32)
    dbhi = dblo
    for c in tl.range(c0, tl.minimum(c0 + CPP, NC), num_stages=STAGES):
        n = c * BLOCK_N + rows
        nmask = n < N
        m2 = nmask[:, None] & cmask[None, :]
        sid, s0, s1 = sequence_of(n, nmask, seqid_ptr, cu_ptr, N, PACKED)
        _, _, ulo, uhi = _tile_z(zrow + offset64(c * BLOCK_N, s_zn), xrow + offset64(c * BLOCK_N, s_xn), win_ptr,
                                 rows, nmask, ch, cmask, dblk, half, D, d, s_zn, s_xn, s_w, False, True, ROPE, FUSED,
                                 GB, NSP, BLOCK_N, BLOCK_D, BLOCK_K, PREC)
        ulo = ulo + blo
        uhi = uhi + bhi
        dglo, dghi = _load_rows(dgrow + offset64(c * BLOCK_N, s_gn), rows * s_gn, half, ch, m2, ROPE)
        cs, sn = _rope_cos_sin(prow, n, nmask, s0, freqs[0], freqs[1], ulo, ROPE, HAS_POS)
        opened = (s0 < c * BLOCK_N) & nmask  # the tokens before the chunk's first sequence start
        if MODE == 0:
            w = _weights(wrow, n, nmask, HAS_W)
            W = _scan_weights(w, n, s0, PACKED) + tl.load(cwrow + c + rows * 0, mask=opened, other=0.0)
            glo = tl.where(m2, gate_fn(ulo, GATE) * dglo, 0.0)
            ghi = tl.where(m2, gate_fn(uhi, GATE) * dghi, 0.0)
        else:
            e, eid = end_of(n, sid, s0, s1, BS, MODE)
            ce = e // BLOCK_N
            open_e = (s0 < ce * BLOCK_N) & nmask
            hlo, hhi = _load_rows(end_ptr + offset64(b, s_eb), eid.to(tl.int64) * D, half, ch, m2, ROPE)
            clo, chi = _load_rows(crow, ce.to(tl.int64) * D, half, ch, open_e[:, None] & cmask[None, :], ROPE)
            W = tl.load(endw_ptr + offset64(b, s_ewb) + eid, mask=nmask, other=0.0) + \
                tl.load(cwrow + ce, mask=open_e, other=0.0)
            inv = _inverse(W, nmask, MEAN)
            hlo, hhi = _to_query_frame((hlo + clo) * inv[:, None], (hhi + chi) * inv[:, None], cs, sn, ROPE)
            dzc = dzrow + offset64(c * BLOCK_N, s_zn)
            dspc = dsrow + offset64(c * BLOCK_N, s_dn)
            glo, dbl = _gate_back(hlo, ulo, dglo, dzc, dspc, rows, nmask, m2, dblk * BLOCK_D, nslots, D, s_zn,
                                  s_dn, GATE, GB, NS, HP, BLOCK_N, BLOCK_D)
            dblo += dbl
            ghi = glo
            if ROPE:
                ghi, dbh = _gate_back(hhi, uhi, dghi, dzc, dspc, rows, nmask, m2, half + dblk * BLOCK_D, nslots,
                                      D, s_zn, s_dn, GATE, GB, NS, HP, BLOCK_N, BLOCK_D)
                dbhi += dbh
        inv = _inverse(W, nmask, MEAN)
        glo, ghi = _from_query_frame(glo, ghi, cs, sn, ROPE)
        glo = tl.where(m2, glo * inv[:, None], 0.0)
        ghi = tl.where(m2, ghi * inv[:, None], 0.0)
        _store_row(hsum_ptr + offset64(b, s_tb) + offset64(c, D), ch, cmask, half, _row_sum(glo, opened),
                   _row_sum(ghi, opened), ROPE)
        if TOTAL:  # the row's one block starts at its first token: its sum within chunk 0 is the chunk's sum
            if c == 0:
                _store_row(srow, ch, cmask, half, _row_sum(glo, nmask), _row_sum(ghi, nmask), ROPE)
        elif MODE != 0:
            first = (n == s0) if MODE == 1 else ((n - s0) % BS == 0)
            _, eid = end_of(n, sid, s0, s1, BS, MODE)
            slo = _scan_tokens(glo, n, s0, s1, PACKED, True)
            shi = slo
            if ROPE:
                shi = _scan_tokens(ghi, n, s0, s1, PACKED, True)
            _store_rows(srow, eid.to(tl.int64) * D, half, ch, (first & nmask)[:, None] & cmask[None, :], slo, shi,
                        ROPE)
    if (MODE != 0) and (HP == 1):
        _store_bias_partials(dbias_ptr, pid, dblo, dbhi, dblk, nslots, half, D, ROPE, GB, NS, BLOCK_D)


@triton.jit
def _store_bias_partials(dbias_ptr, pid, dblo, dbhi, dblk, nslots, half, D, ROPE: tl.constexpr, GB: tl.constexpr,
                         NS: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's share of dL/db (its NS whole heads) in row ``pid`` of the partials."""
    slot = tl.arange(0, NS)
    sm = slot < nslots
    brow = dbias_ptr + offset64(pid, D // GB)
    tl.store(brow + dblk * NS + slot, dblo, mask=sm)
    if ROPE:
        tl.store(brow + (half + dblk * BLOCK_D) // GB + slot, dbhi, mask=sm)


@triton.jit
def _store_coeff_partials(dcoeff_ptr, pid, dclo, dchi, ch, cmask, half, D, K: tl.constexpr, KP: tl.constexpr,
                          ROPE: tl.constexpr):
    """This program's share of dL/dα (its channels × K) in row ``pid`` of the partials."""
    kk = tl.arange(0, KP)
    km = (kk[:, None] < K) & cmask[None, :]
    crow = dcoeff_ptr + offset64(pid, D * K)
    tl.store(crow + ch[None, :] * K + kk[:, None], dclo, mask=km)
    if ROPE:
        tl.store(crow + (ch + half)[None, :] * K + kk[:, None], dchi, mask=km)


@triton.jit
def _grad_apply_kernel(z_ptr, x_ptr, win_ptr, coeff_ptr, bias_ptr, w_ptr, pos_ptr, seqid_ptr, cu_ptr, dg_ptr, dz_ptr,
                       carry_ptr, carryw_ptr, rc_ptr, start_ptr, dcoeff_ptr, dbias_ptr, dsp_ptr, N, D, half, d, BS, NC,
                       CPP, log2base: tl.float64, s_zb, s_zn, s_xb, s_xn, s_w, s_wb, s_pb, s_tb, s_twb, s_eb, s_gb,
                       s_gn, s_db, s_dn,
                       NS: tl.constexpr, HP: tl.constexpr, K: tl.constexpr, ACT: tl.constexpr, GATE: tl.constexpr,
                       ROPE: tl.constexpr,
                       HAS_W: tl.constexpr, HAS_POS: tl.constexpr, PACKED: tl.constexpr, MEAN: tl.constexpr,
                       MODE: tl.constexpr, FUSED: tl.constexpr, GB: tl.constexpr, NSP: tl.constexpr,
                       KP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
                       PREC: tl.constexpr, STAGES: tl.constexpr):
    """Backward pass 3, in parallel over chunks: every feature's gradient, then dz_h and the dL/dα partials.
    Causal: recompute H (for the gate's gradients: dz_s, dL/db partials) and G; a feature's gradient is the reverse
    running sum of G within the chunk plus, for the sequence going on past the chunk, the reverse carry. End-token
    modes: the sum of G from the token's block start on — the start table's row plus the reverse carry of that
    start's chunk when the sequence goes on past it."""
    pid, b, c0, dblk, ch, cmask, rows = _program(NC, CPP, half, BLOCK_N, BLOCK_D)
    nslots = tl.minimum(NS, (half - dblk * BLOCK_D + GB - 1) // GB)
    freqs = _rope_freqs(ch, half, log2base, ROPE)
    blo = tl.load(bias_ptr + ch // GB, mask=cmask, other=0.0).to(tl.float32)[None, :]
    bhi = blo
    if ROPE:
        bhi = tl.load(bias_ptr + (ch + half) // GB, mask=cmask, other=0.0).to(tl.float32)[None, :]
    zrow = z_ptr + offset64(b, s_zb)
    xrow = x_ptr + offset64(b, s_xb)
    dzrow = dz_ptr + offset64(b, s_zb)
    dsrow = dsp_ptr + offset64(b, s_db)
    dgrow = dg_ptr + offset64(b, s_gb)
    wrow = w_ptr + offset64(b, s_wb)
    prow = pos_ptr + offset64(b, s_pb)
    crow = carry_ptr + offset64(b, s_tb)
    rcrow = rc_ptr + offset64(b, s_tb)
    dclo = tl.zeros((KP, BLOCK_D), tl.float32)
    dchi = dclo
    dblo = tl.zeros((NS,), tl.float32)
    dbhi = dblo
    for c in tl.range(c0, tl.minimum(c0 + CPP, NC), num_stages=STAGES):
        n = c * BLOCK_N + rows
        nmask = n < N
        m2 = nmask[:, None] & cmask[None, :]
        sid, s0, s1 = sequence_of(n, nmask, seqid_ptr, cu_ptr, N, PACKED)
        dzc = dzrow + offset64(c * BLOCK_N, s_zn)
        dspc = dsrow + offset64(c * BLOCK_N, s_dn)
        alo = _coeffs(coeff_ptr, ch, cmask, K)  # in the loop: hoisted, their broadcasts would hold registers
        ahi = alo
        if ROPE:
            ahi = _coeffs(coeff_ptr, ch + half, cmask, K)
        zlo, zhi, ulo, uhi = _tile_z(zrow + offset64(c * BLOCK_N, s_zn), xrow + offset64(c * BLOCK_N, s_xn),
                                     win_ptr, rows, nmask, ch, cmask, dblk, half, D, d, s_zn, s_xn, s_w, True,
                                     MODE == 0, ROPE, FUSED, GB, NSP, BLOCK_N, BLOCK_D, BLOCK_K, PREC)
        w = _weights(wrow, n, nmask, HAS_W)
        cs, sn = _rope_cos_sin(prow, n, nmask, s0, freqs[0], freqs[1], zlo, ROPE, HAS_POS)
        if MODE == 0:
            ulo = ulo + blo
            uhi = uhi + bhi
            flo, fhi = _features(zlo, zhi, alo, ahi, cs, sn, w, m2, K, ACT, ROPE, HAS_W)
            opened = (s0 < c * BLOCK_N) & nmask
            om = opened[:, None] & cmask[None, :]
            clo, chi = _load_rows(crow, (c + rows * 0).to(tl.int64) * D, half, ch, om, ROPE)
            plo = _scan_tokens(flo, n, s0, s1, PACKED, False) + clo
            phi = plo
            if ROPE:
                phi = _scan_tokens(fhi, n, s0, s1, PACKED, False) + chi
            W = _scan_weights(w, n, s0, PACKED) + tl.load(carryw_ptr + offset64(b, s_twb) + c + rows * 0,
                                                          mask=opened, other=0.0)
            inv = _inverse(W, nmask, MEAN)
            hlo, hhi = _to_query_frame(plo * inv[:, None], phi * inv[:, None], cs, sn, ROPE)
            gloc = rows[:, None] * s_gn + ch[None, :]
            dgc = dgrow + offset64(c * BLOCK_N, s_gn)
            dglo = tl.load(dgc + gloc, mask=m2, other=0.0).to(tl.float32)
            glo, dbl = _gate_back(hlo, ulo, dglo, dzc, dspc, rows, nmask, m2, dblk * BLOCK_D, nslots, D, s_zn,
                                  s_dn, GATE, GB, NS, HP, BLOCK_N, BLOCK_D)
            dblo += dbl
            ghi = glo
            if ROPE:
                dghi = tl.load(dgc + gloc + half, mask=m2, other=0.0).to(tl.float32)
                ghi, dbh = _gate_back(hhi, uhi, dghi, dzc, dspc, rows, nmask, m2, half + dblk * BLOCK_D, nslots,
                                      D, s_zn, s_dn, GATE, GB, NS, HP, BLOCK_N, BLOCK_D)
                dbhi += dbh
            glo, ghi = _from_query_frame(glo, ghi, cs, sn, ROPE)
            glo = tl.where(m2, glo * inv[:, None], 0.0)
            ghi = tl.where(m2, ghi * inv[:, None], 0.0)
            goes_on = (s1 > c * BLOCK_N + BLOCK_N) & nmask  # the sequence goes on past the chunk
            rlo, rhi = _load_rows(rcrow, (c + rows * 0).to(tl.int64) * D, half, ch,
                                  goes_on[:, None] & cmask[None, :], ROPE)
            dlo = _scan_tokens(glo, n, s0, s1, PACKED, True) + rlo
            dhi = dlo
            if ROPE:
                dhi = _scan_tokens(ghi, n, s0, s1, PACKED, True) + rhi
        else:
            _, eid = end_of(n, sid, s0, s1, BS, MODE)
            t = s0 if MODE == 1 else s0 + ((n - s0) // BS) * BS  # the first token of its block
            ct = t // BLOCK_N
            goes_on = (s1 > ct * BLOCK_N + BLOCK_N) & nmask  # the sequence goes on past the chunk of t
            dlo, dhi = _load_rows(start_ptr + offset64(b, s_eb), eid.to(tl.int64) * D, half, ch, m2, ROPE)
            rlo, rhi = _load_rows(rcrow, ct.to(tl.int64) * D, half, ch, goes_on[:, None] & cmask[None, :], ROPE)
            dlo = dlo + rlo
            dhi = dhi + rhi
        dlo, dhi = _unrotate_weight(dlo, dhi, cs, sn, w, ROPE, HAS_W)
        if (MODE == 0) and (not FUSED):  # z_h again (in cache): fewer registers than keeping it alive
            zlo, zhi, _, _ = _tile_z(zrow + offset64(c * BLOCK_N, s_zn), xrow, win_ptr, rows, nmask, ch, cmask, dblk,
                                     half, D, d, s_zn, s_xn, s_w, True, False, ROPE, FUSED, GB, NSP, BLOCK_N,
                                     BLOCK_D, BLOCK_K, PREC)
        dzl, dcl = _poly_back(zlo, dlo, alo, m2, K, ACT, KP)
        tl.store(dzc + rows[:, None] * s_zn + ch[None, :], dzl.to(dz_ptr.dtype.element_ty), mask=m2)
        dclo += dcl
        if ROPE:
            dzh, dch = _poly_back(zhi, dhi, ahi, m2, K, ACT, KP)
            tl.store(dzc + rows[:, None] * s_zn + half + ch[None, :], dzh.to(dz_ptr.dtype.element_ty), mask=m2)
            dchi += dch
    _store_coeff_partials(dcoeff_ptr, pid, dclo, dchi, ch, cmask, half, D, K, KP, ROPE)
    if (MODE == 0) and (HP == 1):
        _store_bias_partials(dbias_ptr, pid, dblo, dbhi, dblk, nslots, half, D, ROPE, GB, NS, BLOCK_D)


KERNELS = {"sums": _sums_kernel, "scan": _scan_kernel, "apply": _apply_kernel, "grad_sums": _grad_sums_kernel,
           "grad_apply": _grad_apply_kernel}


# ----------------------------------------------------------------------------------------------------------------
# launch configurations
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchConfig:
    """A forced configuration (tests): BLOCK_N tokens per chunk × BLOCK_D channels (pairs with rotary) for every
    kernel of a call (block_n None: the tiles of :data:`TILES`), the warps, the input features per step of the fused
    route's products, the chunks each program handles (None: automatic), the chunks per step of the scan, and the
    launches' register bound."""

    block_n: Optional[int] = 64
    block_d: int = 32
    num_warps: int = 4
    block_k: int = 32
    chunks_per_program: Optional[int] = None
    scan_chunks: int = SCAN_CHUNKS
    maxnreg: int = 255  # ptxas may use every register a 4-warp block can have (≥ 2 blocks per SM), not spill first


_OVERRIDE: List[Optional[LaunchConfig]] = [None]


def use_config(config: Optional[LaunchConfig]) -> None:
    """Force a launch configuration (tests run several chunks, channel blocks and scan steps on tiny shapes); None:
    the automatic choice (:data:`TILES`)."""
    _OVERRIDE[0] = config


def role_tile(fused: bool, rope: bool, G: int, role: str) -> Optional[Tuple[int, int]]:
    """(BLOCK_N, BLOCK_D) of a role's kernel for a call (forced tiles first), None when none fits. The unfused
    kernels take a gate head of any width in any tile (a head wider than the tile is split over programs); the fused
    route's tiles hold whole heads (its gate is a product per head)."""
    forced = _OVERRIDE[0]
    if forced is not None and forced.block_n is not None:
        return forced.block_n, max(forced.block_d, pow2(G)) if fused else forced.block_d
    return TILES[(fused, rope, head_class(G) if fused else 16)][role]


# ----------------------------------------------------------------------------------------------------------------
# the layout of a call (everything but the tensors), shared by the forward, the backward and the fake kernels
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MixLayout:
    """Sizes, mode and tiles of one mixing call. Everything here comes from shapes (no tensor is read)."""

    B: int
    N: int
    D: int
    Ds: int
    K: int
    mode: int  # MODES: 0 causal, 1 full, 2 block-causal
    block_size: int
    nseq: int  # sequences per row (packed: the number of cu_seqlens entries − 1)
    rope: int  # 0 none, 1 1-D, 2 2-D
    fused: bool
    sms: int  # streaming multiprocessors to fill

    @property
    def G(self) -> int:
        return self.D // self.Ds

    @property
    def half(self) -> int:
        return self.D // 2 if self.rope else self.D

    def tile(self, role: str) -> Optional[Tuple[int, int]]:
        return role_tile(self.fused, bool(self.rope), self.G, role)

    @property
    def chunk(self) -> int:
        """Tokens per chunk, one length for every kernel of a call (the tables hold one row per chunk)."""
        return self.tile("sums")[0]  # type: ignore[index]

    def block_d(self, role: str) -> int:
        return self.tile(role)[1]  # type: ignore[index]

    def head_parts(self, role: str) -> int:
        """Programs a gate head is split over in a role's kernel (1: the tile holds whole heads)."""
        return max(1, self.G // self.block_d(role))

    @property
    def nc(self) -> int:
        return -(-self.N // self.chunk)

    def nd(self, role: str) -> int:
        return -(-self.half // self.block_d(role))

    @property
    def chunks_per_program(self) -> int:
        """Chunks each program of the parallel passes handles, in order: enough programs to fill every SM four times
        over (one chunk each when there are not more), at most 8 (fewer partial rows of the parameter gradients,
        and the next chunk's loads in flight while one is computed)."""
        forced = _OVERRIDE[0]
        if forced is not None and forced.chunks_per_program is not None:
            return max(1, min(forced.chunks_per_program, self.nc))
        widest = max(self.block_d(r) for r in self.roles(True) if self.tile(r) is not None)
        programs = self.B * self.nc * -(-self.half // widest)
        return max(1, min(8, programs // (4 * self.sms), self.nc))

    @property
    def npb(self) -> int:
        """Programs per row along the tokens."""
        return -(-self.nc // self.chunks_per_program)

    @property
    def end_rows(self) -> int:
        """Rows of the end (and start) table: sequences (full), a bound on the blocks (block-causal), none (causal)."""
        if self.mode == 0:
            return 0
        if self.mode == 1:
            return self.nseq
        return (self.N - 1) // self.block_size + self.nseq

    def roles(self, backward: bool) -> List[str]:
        return ["sums", "apply"] + (["grad_sums", "grad_apply"] if backward else [])

    def missing(self, backward: bool) -> Optional[str]:
        """Why no tile fits the registers for a kernel this call needs (None when every one fits)."""
        bad = [r for r in self.roles(backward) if self.tile(r) is None]
        if not bad:
            return None
        kind = (f"{'the fused route' if self.fused else 'the kernels'}, {'rotary, ' if self.rope else ''}"
                f"a gate head of {self.G} channels")
        return f"no tile of the {' and '.join(bad)} kernel(s) fits the registers ({kind})"


def mix_layout(B: int, N: int, D: int, Ds: int, K: int, mode: int, block_size: int, nseq: int, rope: int,
               device: torch.device, fused: bool = False) -> MixLayout:
    """The layout of a call."""
    return MixLayout(B, N, D, Ds, K, mode, block_size, nseq, rope, fused, sm_count(device))


# ----------------------------------------------------------------------------------------------------------------
# the op bodies
# ----------------------------------------------------------------------------------------------------------------


def _layout_of(src: Tensor, coeff: Tensor, bias: Tensor, cu: Optional[Tensor], mode: int, block_size: int,
               rope: int, fused: bool) -> MixLayout:
    D, K = coeff.shape
    return mix_layout(src.shape[0], src.shape[1], D, bias.shape[0], K, mode, block_size,
                      1 if cu is None else cu.shape[0] - 1, rope, src.device, fused)


def _pos_stride(pos: Optional[Tensor], two_d: bool) -> int:
    """The row stride of the positions ((B, N[, 2]) or one row broadcast to every batch row)."""
    if pos is None or pos.dim() == (2 if two_d else 1):
        return 0
    return pos.stride(0)


def _inputs(L: MixLayout, z: Optional[Tensor], x: Optional[Tensor], w_in: Optional[Tensor], coeff: Tensor,
            bias: Tensor, mask: Optional[Tensor], pos: Optional[Tensor], cu: Optional[Tensor],
            seqid: Optional[Tensor], block_size: int, log2base: float, zlike: Tensor) -> Dict[str, Any]:
    """The arguments every kernel of a call shares, by name: the activations' pointers and strides (``zlike``: a
    tensor with z's layout — z itself, or dz for the fused route's backward), the parameters, the mode's tensors
    (harmless pointers for the absent ones) and the sizes."""
    dummy = coeff
    return dict(z_ptr=z if z is not None else zlike, x_ptr=x if x is not None else zlike,
                win_ptr=w_in if w_in is not None else dummy, coeff_ptr=coeff, bias_ptr=bias,
                w_ptr=mask if mask is not None else dummy, pos_ptr=pos if pos is not None else dummy,
                seqid_ptr=seqid if seqid is not None else dummy, cu_ptr=cu if cu is not None else dummy,
                N=L.N, D=L.D, half=L.half, d=0 if x is None else x.shape[2], BS=block_size, NC=L.nc,
                CPP=L.chunks_per_program, log2base=log2base, s_zb=zlike.stride(0), s_zn=zlike.stride(1),
                s_xb=0 if x is None else x.stride(0), s_xn=0 if x is None else x.stride(1),
                s_w=0 if w_in is None else w_in.stride(0), s_wb=0 if mask is None else mask.stride(0),
                s_pb=_pos_stride(pos, L.rope == 2), s_tb=L.nc * L.D, s_twb=L.nc, s_eb=L.end_rows * L.D,
                s_ewb=L.end_rows)


def _constexprs(L: MixLayout, role: str, act: int, gate: int, mean: bool, flags: Dict[str, Any],
                fused_dtype: Optional[Tensor]) -> Dict[str, Any]:
    """The constexprs and launch options of a role's kernel."""
    tile = L.tile(role)
    if tile is None:
        raise NotImplementedError(L.missing(True) or f"no tile fits the {role} kernel")
    forced = _OVERRIDE[0]
    warps, maxnreg = (forced.num_warps, forced.maxnreg) if forced is not None and forced.block_n else (4, 255)
    block_k = forced.block_k if forced is not None else 32
    return dict(K=L.K, KP=pow2(L.K), ACT=act, GATE=gate, MEAN=mean, MODE=L.mode, GB=L.G,
                FUSED=fused_dtype is not None, NS=max(1, tile[1] // L.G), HP=max(1, L.G // tile[1]),
                NSP=max(16, tile[1] // L.G), BLOCK_N=tile[0], BLOCK_D=tile[1],
                BLOCK_K=block_k if fused_dtype is not None else 16,
                PREC=dot_precision(fused_dtype) if fused_dtype is not None else "ieee",
                STAGES=1 if interpreted() else STAGES[role], num_warps=warps, maxnreg=maxnreg, **flags)


def _runner(L: MixLayout, available: Dict[str, Any], act: int, gate: int, mean: bool, flags: Dict[str, Any],
            fused_dtype: Optional[Tensor]) -> Callable[..., None]:
    """``run(role, **extra)``: launch a role's kernel of the call over (row · chunk groups, channel blocks) with the
    arguments it takes out of ``available``, its constexprs and ``extra`` (by name; launch options pass through)."""

    def run(role: str, **extra: Any) -> None:
        kernel = KERNELS[role]
        kwargs = {**available, **_constexprs(L, role, act, gate, mean, flags, fused_dtype), **extra}
        launch(kernel, (L.B * L.npb, L.nd(role)),
               **{k: v for k, v in kwargs.items() if k in kernel.arg_names or k in ("num_warps", "maxnreg")})
    return run


def _scan(L: MixLayout, src: Tensor, srcw: Optional[Tensor], reverse: bool, seqid: Optional[Tensor],
          cu: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
    """Pass 2: the carries entering every chunk (``reverse``: from the chunks after it) of a table of chunk sums."""
    dst = torch.empty_like(src)
    dstw = torch.empty_like(srcw) if srcw is not None else None
    forced = _OVERRIDE[0]
    cb = forced.scan_chunks if forced is not None else SCAN_CHUNKS
    dummy = src
    launch(_scan_kernel, (L.B, -(-L.D // SCAN_CHANNELS)), src, srcw if srcw is not None else dummy, dst,
           dstw if dstw is not None else dummy, seqid if seqid is not None else dummy,
           cu if cu is not None else dummy, L.N, L.nc, L.D, L.chunk, L.nc * L.D, L.nc, PACKED=cu is not None,
           REVERSE=reverse, HAS_WT=srcw is not None, CB=cb, BLOCK_S=SCAN_CHANNELS, num_warps=4)
    return dst, dstw


@dataclass
class Saved:
    """What the forward keeps for the backward (fp32, O(N·D / chunk)): the carry entering every chunk and its
    weight, and in the end-token modes each end's prefix sum within its chunk and its weight."""

    carry: Tensor  # (B, chunks, D)
    carryw: Tensor  # (B, chunks)
    end: Tensor  # (B, end rows, D)
    endw: Tensor  # (B, end rows)


def _flags(rope: int, mask: Optional[Tensor], pos: Optional[Tensor], cu: Optional[Tensor]) -> Dict[str, Any]:
    return dict(ROPE=rope, HAS_W=mask is not None, HAS_POS=pos is not None, PACKED=cu is not None)


def mix(z: Optional[Tensor], x: Optional[Tensor], w_in: Optional[Tensor], coeff: Tensor, bias: Tensor,
        mask: Optional[Tensor], pos: Optional[Tensor], cu: Optional[Tensor], seqid: Optional[Tensor], mode: int,
        block_size: int, act: int, gate: int, rope: int, log2base: float, mean: bool
        ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The mixing forward: g (B, N, D) in the activations' dtype, and what the backward needs (:class:`Saved`, fp32).
    From z (B, N, D + Ds), or — the fused route — from x (B, N, d) and W_in (D + Ds, d)."""
    src = z if z is not None else x
    L = _layout_of(src, coeff, bias, cu, mode, block_size, rope, x is not None)
    B, N, D, dev = L.B, L.N, L.D, src.device
    f32 = dict(dtype=torch.float32, device=dev)
    a = _inputs(L, z, x, w_in, coeff, bias, mask, pos, cu, seqid, block_size, log2base, src)
    run = _runner(L, a, act, gate, mean, _flags(rope, mask, pos, cu), src if x is not None else None)
    sums, sumsw = torch.empty(B, L.nc, D, **f32), torch.empty(B, L.nc, **f32)
    end, endw = torch.empty(B, L.end_rows, D, **f32), torch.empty(B, L.end_rows, **f32)
    run("sums", sums_ptr=sums, sumsw_ptr=sumsw, end_ptr=end, endw_ptr=endw)
    carry, carryw = _scan(L, sums, sumsw, False, seqid, cu)
    g = torch.empty(B, N, D, dtype=src.dtype, device=dev)
    run("apply", carry_ptr=carry, carryw_ptr=carryw, end_ptr=end, endw_ptr=endw, g_ptr=g, s_gb=g.stride(0),
        s_gn=g.stride(1))
    return g, carry, carryw, end, endw


def mix_backward(dg: Tensor, z: Optional[Tensor], x: Optional[Tensor], w_in: Optional[Tensor], coeff: Tensor,
                 bias: Tensor, mask: Optional[Tensor], pos: Optional[Tensor], cu: Optional[Tensor],
                 seqid: Optional[Tensor], saved: Saved, mode: int, block_size: int, act: int, gate: int, rope: int,
                 log2base: float, mean: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """The mixing backward: (dz (B, N, D + Ds) in the activations' dtype, dL/dα (D, K) and dL/db (Ds,) in fp32)."""
    src = z if z is not None else x
    L = _layout_of(src, coeff, bias, cu, mode, block_size, rope, x is not None)
    B, N, D, K, Ds, dev = L.B, L.N, L.D, L.K, L.Ds, src.device
    f32 = dict(dtype=torch.float32, device=dev)
    dg = dg.contiguous()
    dz = torch.empty(B, N, D + Ds, dtype=src.dtype, device=dev)
    a = _inputs(L, z, x, w_in, coeff, bias, mask, pos, cu, seqid, block_size, log2base, dz if z is None else z)
    a.update(dg_ptr=dg, dz_ptr=dz, s_gb=dg.stride(0), s_gn=dg.stride(1), carry_ptr=saved.carry,
             carryw_ptr=saved.carryw, end_ptr=saved.end, endw_ptr=saved.endw)
    hsum, start = torch.empty(B, L.nc, D, **f32), torch.empty(B, L.end_rows, D, **f32)
    dbias = torch.empty(B * L.npb, Ds, **f32)
    parts = L.head_parts("grad_apply" if mode == 0 else "grad_sums")  # of the kernel that takes the gate's gradient
    dsp = torch.empty(B, N, Ds, parts, **f32) if parts > 1 else dbias
    a.update(dsp_ptr=dsp, s_db=N * Ds * parts, s_dn=Ds * parts)
    run = _runner(L, a, act, gate, mean, _flags(rope, mask, pos, cu), src if x is not None else None)
    run("grad_sums", hsum_ptr=hsum, start_ptr=start, dbias_ptr=dbias)
    rc, _ = _scan(L, hsum, None, True, seqid, cu)
    dcoeff = torch.empty(B * L.npb, D * K, **f32)
    run("grad_apply", rc_ptr=rc, start_ptr=start, dcoeff_ptr=dcoeff, dbias_ptr=dbias)
    if parts > 1:  # gate heads wider than a tile: their parts' sums
        du = dsp.sum(-1)
        dz[..., D:] = du.to(dz.dtype)
        return dz, dcoeff.sum(0).view(D, K), du.sum((0, 1))
    return dz, dcoeff.sum(0).view(D, K), dbias.sum(0)


# ----------------------------------------------------------------------------------------------------------------
# custom ops and their autograd: the unfused route (z in memory) and the fused one (x and W_in in)
# ----------------------------------------------------------------------------------------------------------------


def _fake_outputs(src: Tensor, coeff: Tensor, bias: Tensor, cu: Optional[Tensor], mode: int, block_size: int,
                  rope: int, fused: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Empty tensors of the forward's outputs (shapes only: the fake implementations)."""
    L = _layout_of(src, coeff, bias, cu, mode, block_size, rope, fused)
    f32 = dict(dtype=torch.float32)
    return (src.new_empty(L.B, L.N, L.D), src.new_empty(L.B, L.nc, L.D, **f32), src.new_empty(L.B, L.nc, **f32),
            src.new_empty(L.B, L.end_rows, L.D, **f32), src.new_empty(L.B, L.end_rows, **f32))


def _pom_mix(z: Tensor, coeff: Tensor, bias: Tensor, mask: Optional[Tensor], pos: Optional[Tensor],
             cu: Optional[Tensor], seqid: Optional[Tensor], mode: int, block_size: int, act: int, gate: int, rope: int,
             log2base: float, mean: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return mix(z, None, None, coeff, bias, mask, pos, cu, seqid, mode, block_size, act, gate, rope, log2base, mean)


def _pom_mix_fake(z: Tensor, coeff: Tensor, bias: Tensor, mask: Any, pos: Any, cu: Optional[Tensor], seqid: Any,
                  mode: int, block_size: int, act: int, gate: int, rope: int, *_: Any) -> Tuple[Tensor, ...]:
    return _fake_outputs(z, coeff, bias, cu, mode, block_size, rope, False)


def _pom_mix_backward(dg: Tensor, z: Tensor, coeff: Tensor, bias: Tensor, mask: Optional[Tensor],
                      pos: Optional[Tensor], cu: Optional[Tensor], seqid: Optional[Tensor], carry: Tensor,
                      carryw: Tensor, end: Tensor, endw: Tensor, mode: int, block_size: int, act: int, gate: int,
                      rope: int, log2base: float, mean: bool) -> Tuple[Tensor, Tensor, Tensor]:
    return mix_backward(dg, z, None, None, coeff, bias, mask, pos, cu, seqid, Saved(carry, carryw, end, endw), mode,
                        block_size, act, gate, rope, log2base, mean)


def _pom_mix_backward_fake(dg: Tensor, z: Tensor, coeff: Tensor, bias: Tensor, *_: Any) -> Tuple[Tensor, ...]:
    return (torch.empty_like(z, memory_format=torch.contiguous_format),
            coeff.new_empty(coeff.shape, dtype=torch.float32), bias.new_empty(bias.shape, dtype=torch.float32))


pom_mix_op = kernel_op("pom_mix", _pom_mix, _pom_mix_fake)
pom_mix_backward_op = kernel_op("pom_mix_backward", _pom_mix_backward, _pom_mix_backward_fake)

_NOT_DIFFERENTIABLE = (None,) * 11  # the mode's tensors and attributes


def _setup(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[Tensor, ...]) -> None:
    z, coeff, bias, mask, pos, cu, seqid = inputs[:7]
    ctx.attrs = inputs[7:]
    ctx.save_for_backward(z, coeff, bias, mask, pos, cu, seqid, *output[1:])
    ctx.mark_non_differentiable(*output[1:])


def _backward(ctx: Any, dg: Tensor, *_: Any) -> Tuple[Optional[Tensor], ...]:
    z, coeff, bias, mask, pos, cu, seqid, *saved = ctx.saved_tensors
    dz, dcoeff, dbias = pom_mix_backward_op(dg, z, coeff, bias, mask, pos, cu, seqid, *saved, *ctx.attrs)
    return (dz, dcoeff.to(coeff.dtype), dbias.to(bias.dtype)) + _NOT_DIFFERENTIABLE


pom_mix_op.register_autograd(_backward, setup_context=_setup)


def _pom_gemm(x: Tensor, w_in: Tensor, coeff: Tensor, bias: Tensor, mask: Optional[Tensor], pos: Optional[Tensor],
              cu: Optional[Tensor], seqid: Optional[Tensor], mode: int, block_size: int, act: int, gate: int,
              rope: int, log2base: float, mean: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return mix(None, x, w_in, coeff, bias, mask, pos, cu, seqid, mode, block_size, act, gate, rope, log2base, mean)


def _pom_gemm_fake(x: Tensor, w_in: Tensor, coeff: Tensor, bias: Tensor, mask: Any, pos: Any, cu: Optional[Tensor],
                   seqid: Any, mode: int, block_size: int, act: int, gate: int, rope: int, *_: Any
                   ) -> Tuple[Tensor, ...]:
    return _fake_outputs(x, coeff, bias, cu, mode, block_size, rope, True)


def _pom_gemm_backward(dg: Tensor, x: Tensor, w_in: Tensor, coeff: Tensor, bias: Tensor, mask: Optional[Tensor],
                       pos: Optional[Tensor], cu: Optional[Tensor], seqid: Optional[Tensor], carry: Tensor,
                       carryw: Tensor, end: Tensor, endw: Tensor, mode: int, block_size: int, act: int, gate: int,
                       rope: int, log2base: float, mean: bool) -> Tuple[Tensor, Tensor, Tensor]:
    return mix_backward(dg, None, x, w_in, coeff, bias, mask, pos, cu, seqid, Saved(carry, carryw, end, endw), mode,
                        block_size, act, gate, rope, log2base, mean)


def _pom_gemm_backward_fake(dg: Tensor, x: Tensor, w_in: Tensor, coeff: Tensor, bias: Tensor, *_: Any
                            ) -> Tuple[Tensor, ...]:
    return (x.new_empty(x.shape[0], x.shape[1], w_in.shape[0]), coeff.new_empty(coeff.shape, dtype=torch.float32),
            bias.new_empty(bias.shape, dtype=torch.float32))


pom_gemm_op = kernel_op("pom_gemm", _pom_gemm, _pom_gemm_fake)
pom_gemm_backward_op = kernel_op("pom_gemm_backward", _pom_gemm_backward, _pom_gemm_backward_fake)


def _gemm_setup(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[Tensor, ...]) -> None:
    x, w_in, coeff, bias, mask, pos, cu, seqid = inputs[:8]
    ctx.attrs = inputs[8:]
    ctx.save_for_backward(x, w_in, coeff, bias, mask, pos, cu, seqid, *output[1:])
    ctx.mark_non_differentiable(*output[1:])


def _gemm_backward(ctx: Any, dg: Tensor, *_: Any) -> Tuple[Optional[Tensor], ...]:
    x, w_in, coeff, bias, mask, pos, cu, seqid, *saved = ctx.saved_tensors
    dz, dcoeff, dbias = pom_gemm_backward_op(dg, x, w_in, coeff, bias, mask, pos, cu, seqid, *saved, *ctx.attrs)
    dx = dz @ w_in  # (B, N, d): the input projection's backward, on cuBLAS
    dw = dz.flatten(0, 1).t() @ x.flatten(0, 1)
    return (dx, dw, dcoeff.to(coeff.dtype), dbias.to(bias.dtype)) + _NOT_DIFFERENTIABLE


pom_gemm_op.register_autograd(_gemm_backward, setup_context=_gemm_setup)


# ----------------------------------------------------------------------------------------------------------------
# every kernel alone, for the GPU script's bandwidth table
# ----------------------------------------------------------------------------------------------------------------


def bench_kernels(B: int, N: int, D: int, Ds: int, degree: int, mode: str, dtype: torch.dtype,
                  device: torch.device) -> List[Tuple[str, Callable[[], None], int]]:
    """Each kernel of one unfused forward and backward call in ``mode`` ("causal", "full" or "block"), alone:
    (name, a closure that launches just that kernel on prepared inputs, the bytes it must move at the least — its
    reads and writes of per-token tensors and of the tables, O(N·D / chunk)). For ``scripts/gpu-check``, which times
    each closure and divides."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    z = torch.randn(B, N, D + Ds, generator=gen).to(device, dtype)
    coeff = (torch.rand(D, degree, generator=gen) * 2e-3 - 1e-3).to(device)
    bias = torch.zeros(Ds, device=device)
    m, bs = {"causal": (0, 1), "full": (1, 1), "block": (2, 64)}[mode]
    L = _layout_of(z, coeff, bias, None, m, bs, 0, False)
    saved = Saved(*mix(z, None, None, coeff, bias, None, None, None, None, m, bs, 0, 0, 0, 0.0, True)[1:])
    dg = torch.randn(B, N, D, generator=gen).to(device, dtype)
    e = z.element_size()
    nd, gate = B * N * D * e, B * N * Ds * e  # a pass over z_h (g, dg, dz_h) and over z_s (dz_s)
    table, ends = B * L.nc * (D + 1) * 4, B * L.end_rows * (D + 1) * 4  # chunk tables, end / start tables
    causal = m == 0
    nbytes = {"sums": nd + table + (0 if causal else ends), "scan": 2 * table,
              "apply": 2 * nd + gate + table if causal else nd + gate + ends + table,
              "grad_sums": nd + gate + table if causal else nd + 2 * gate + 2 * ends + 2 * table,
              "grad_apply": 3 * nd + 2 * gate + 2 * table if causal else 2 * nd + ends + table}
    return _bench_closures(L, z, coeff, bias, saved, dg, bs, nbytes)


def _bench_closures(L: MixLayout, z: Tensor, coeff: Tensor, bias: Tensor, saved: Saved, dg: Tensor, bs: int,
                    nbytes: Dict[str, int]) -> List[Tuple[str, Callable[[], None], int]]:
    """The closures of :func:`bench_kernels`: each launches one kernel with the arguments a real call gives it."""
    B, N, D, Ds, K = L.B, L.N, L.D, L.Ds, L.K
    f32 = dict(dtype=torch.float32, device=z.device)
    a = _inputs(L, z, None, None, coeff, bias, None, None, None, None, bs, 0.0, z)
    out = dict(sums_ptr=torch.empty(B, L.nc, D, **f32), sumsw_ptr=torch.empty(B, L.nc, **f32),
               end_ptr=saved.end.clone(), endw_ptr=saved.endw.clone(), carry_ptr=saved.carry, carryw_ptr=saved.carryw,
               g_ptr=torch.empty(B, N, D, dtype=z.dtype, device=z.device), s_gb=N * D, s_gn=D)
    grads = dict(dg_ptr=dg, dz_ptr=torch.empty(B, N, D + Ds, dtype=z.dtype, device=z.device), s_gb=N * D, s_gn=D,
                 carry_ptr=saved.carry, carryw_ptr=saved.carryw, end_ptr=saved.end, endw_ptr=saved.endw,
                 hsum_ptr=torch.empty(B, L.nc, D, **f32), start_ptr=torch.empty(B, L.end_rows, D, **f32),
                 rc_ptr=torch.zeros(B, L.nc, D, **f32), dbias_ptr=torch.empty(B * L.npb, Ds, **f32),
                 dcoeff_ptr=torch.empty(B * L.npb, D * K, **f32))
    parts = L.head_parts("grad_apply" if L.mode == 0 else "grad_sums")
    grads.update(dsp_ptr=torch.empty(B, N, Ds, parts, **f32), s_db=N * Ds * parts, s_dn=Ds * parts)

    def run(name: str, extra: Dict[str, Any]) -> Callable[[], None]:  # the arguments prepared once, as _runner's
        kernel = KERNELS[name]
        kwargs = {**a, **_constexprs(L, name, 0, 0, True, _flags(0, None, None, None), None), **extra}
        kwargs = {k: v for k, v in kwargs.items() if k in kernel.arg_names or k in ("num_warps", "maxnreg")}
        return lambda: launch(kernel, (B * L.npb, L.nd(name)), **kwargs)

    sums = out["sums_ptr"]
    return [("sums", run("sums", out), nbytes["sums"]),
            ("scan", lambda: _scan(L, sums, out["sumsw_ptr"], False, None, None), nbytes["scan"]),
            ("apply", run("apply", out), nbytes["apply"]),
            ("grad_sums", run("grad_sums", grads), nbytes["grad_sums"]),
            ("grad_apply", run("grad_apply", grads), nbytes["grad_apply"])]


# ----------------------------------------------------------------------------------------------------------------
# the backend: supports, the first-use check, forward
# ----------------------------------------------------------------------------------------------------------------


def kernel_limits(call: Any) -> Optional[str]:
    """Why the kernels cannot take this call's mode, shapes or non-linearities (None: they can). Shared by both
    Triton routes; the device and the first-use check come after."""
    x = call.x
    if call.state is not None:
        return "a stream (state=…) runs on the torch form"
    if x.dtype not in DTYPES:
        return f"{x.dtype} is not a kernel dtype (fp32, bf16, fp16)"
    if not call.self_mix:
        return "cross-mixing is not in the kernels"
    if call.weights.shift_weight is not None:
        return "a token shift is not in the kernels"
    if call.mask is not None:
        return "an explicit (B, M, N) mask is not in the kernels (quadratic)"
    if call.context_positions is not None:
        return "context_positions belong to cross-mixing"
    if not isinstance(call.activation, str) or call.activation not in ACT_CODES:
        return f"activation {call.activation!r} is not in the kernels ({', '.join(ACT_CODES)})"
    if not isinstance(call.gate, str) or call.gate not in GATE_CODES:
        return f"gate {call.gate!r} is not in the kernels ({', '.join(GATE_CODES)})"
    k = call.weights.coeff.shape[1]
    if not 1 <= k <= MAX_DEGREE:
        return f"degree {k} (the kernels take 1–{MAX_DEGREE})"
    D, G = call.D, call.D // call.Ds  # G: the channels of a gate head
    if G > 128 or G & (G - 1):
        return f"a gate head of {G} channels (the kernels take a power of two ≤ 128)"
    if call.rope:
        if call.rope_convention != "relative":
            return "rope_convention='reference' (PoMRoPE's turned gate) is not in the kernels"
        if D % (4 if call.rope == "2d" else 2):
            return f"{call.rope} rotary needs a width divisible by {4 if call.rope == '2d' else 2}, got {D}"
        if (D // 2) % G:
            return f"rotary with a gate head of {G} channels straddling the halves of D = {D}"
    return None


def supports(call: Call, fused: bool = False) -> Optional[str]:
    """Self-mixing, every mask but an explicit (B, M, N) one, packed sequences, rotary, degree 1–5, mean / sum, named
    non-linearities, fp32 / bf16 / fp16, on CUDA tensors (or CPU tensors under TRITON_INTERPRET=1); also while
    ``torch.compile`` traces (the kernels are custom ops). ``fused``: where the ``triton_gemm`` route's tiles fit
    (that route runs its own first-use check)."""
    x = call.x
    if x.device.type != "cuda" and not (interpreted() and x.device.type == "cpu"):
        return f"CUDA tensors only (got {x.device.type}; CPU tensors run the kernels under TRITON_INTERPRET=1)"
    why = kernel_limits(call)
    if why is None:
        why = call_layout(call, fused).missing(backward=will_differentiate(call))
    if why is not None or fused or not needs_check(x.device):
        return why
    return self_check(x.device, x.dtype)


def will_differentiate(call: Any) -> bool:
    """Whether this call will be differentiated (then its backward kernels must fit too, and the backward counts in
    the choice of route)."""
    if not torch.is_grad_enabled():
        return False
    w = call.weights
    return any(t is not None and t.requires_grad for t in (call.x, w.in_weight, w.coeff, w.gate_bias))


def needs_check(device: torch.device) -> bool:
    """Whether calls on ``device`` wait for the first-use check (GPUs: where the kernels first run compiled; the
    interpreter's tests call :func:`self_check` themselves)."""
    return device.type == "cuda"


# (d, D, N) of the first-use check: several chunks, channel blocks and sequences at the GPU's tiles
CHECK_SHAPE = (32, 64, 150)
CHECK_MODES = ("causal", "full", "block", "padding", "rotary", "packed_causal", "packed_full")


def run_check(device: torch.device, dtype: torch.dtype, name: str = "triton") -> None:
    """A small PoM — causal, full, block-causal, key padding, packed, rotary — forward and backward on backend
    ``name`` in ``dtype``, against the torch form in float32 on the same device; raises when they disagree."""
    from .. import dispatch
    from . import PomWeights, pom

    gen = torch.Generator(device="cpu").manual_seed(0)
    d, D, N = CHECK_SHAPE
    w_in = (torch.randn(D + 4, d, generator=gen) / d ** 0.5).to(device)
    coeff = (torch.rand(D, 3, generator=gen) * 2 - 1).to(device)
    bias, w_out = torch.randn(4, generator=gen).to(device), (torch.randn(d, D, generator=gen) / D ** 0.5).to(device)
    x = torch.randn(2, N, d, generator=gen).to(device)
    mask = (torch.rand(2, N, generator=gen) > 0.2).to(device)
    cu = torch.tensor([0, N // 4, N // 4 + 1, N], dtype=torch.int32, device=device)
    every = dict(causal=dict(causal=True), full={}, block=dict(causal=True, block_size=17),
                 padding=dict(causal=True, mask=mask), rotary=dict(rope="1d", causal=True),
                 packed_causal=dict(causal=True, cu_seqlens=cu), packed_full=dict(cu_seqlens=cu))
    ran = 0
    for kw in (every[m] for m in CHECK_MODES):
        xs = x[:1] if "cu_seqlens" in kw else x
        outs = []
        for backend, dt in check_runs(name, dtype):
            xx = xs.clone().requires_grad_()
            params = [t.clone().requires_grad_() for t in (w_in, bias, coeff, w_out)]
            try:
                with dispatch.backend(backend), torch.autocast(device.type, dtype=dtype,
                                                               enabled=dt != torch.float32):
                    y = pom(xx, PomWeights(*params), **kw)
            except NotImplementedError as e:  # a call this route refuses (e.g. no fused tile fits a rotary gate
                if backend != name or "cannot take" not in str(e):  # head): it never runs one, nothing to check
                    raise
                break
            y.float().square().sum().backward()
            outs.append([y.detach(), xx.grad] + [p.grad for p in params])
        if len(outs) < 2:
            continue
        ran += 1
        judge_check(outs, dtype, kw)
    if not ran:
        raise AssertionError(f"backend {name!r} took none of the check's calls")


def self_check(device: torch.device, dtype: torch.dtype = torch.float32) -> Optional[str]:
    """The first-use check of the kernels on ``device`` (float32 and ``dtype``), once per process: None when they
    agree with the torch form, else the reason (the automatic choice then runs the torch form and
    :func:`polymixer.backend_for` says why; an explicit ``backend("triton")`` raises it)."""
    return first_use("pom", device, dtype, run_check)


def _mode(call: Call) -> Tuple[int, int]:
    """(the kernels' mode, block size) of a call."""
    if call.block_size is not None:
        return MODES["block"], int(call.block_size)
    return MODES["causal" if call.causal else "full"], 1


def call_layout(call: Any, fused: bool) -> MixLayout:
    """The layout the kernels would run ``call`` with."""
    nseq = 1 if call.cu_k is None else call.cu_k.shape[0] - 1
    return mix_layout(call.B, call.N, call.D, call.Ds, call.weights.coeff.shape[1], *_mode(call), nseq,
                      ROPE_CODES[call.rope], call.x.device, fused)


def mix_args(call: Any, N: int) -> Tuple[Any, ...]:
    """The op arguments after the activations and weights: (key mask as uint8, positions as fp64, cu_seqlens, each
    token's sequence id, mode, block size, activation, gate, rotary, log2(base), mean)."""
    mask = None if call.key_mask is None else call.key_mask.contiguous().view(torch.uint8)
    pos = None
    if call.rope is not None and call.positions is not None:
        check_positions(call.positions, call.B, N, call.rope == "2d", "positions")
        pos = call.positions.to(torch.float64).contiguous()
    elif call.rope == "2d":
        raise ValueError("2-D rotary needs explicit positions of shape (N, 2) holding (row, col)")
    seqid = None
    if call.cu_k is not None:  # each token's sequence: a search over the offsets, on the device
        ar = torch.arange(N, device=call.x.device, dtype=call.cu_k.dtype)
        seqid = torch.searchsorted(call.cu_k, ar, right=True, out_int32=True) - 1
    return (mask, pos, call.cu_k, seqid, *_mode(call), ACT_CODES[call.activation], GATE_CODES[call.gate],
            ROPE_CODES[call.rope], math.log2(call.rope_base), call.reduction == "mean")


def forward(call: Call) -> Tensor:
    """The whole PoM of ``call``: the input projection (torch), the mixing (the kernels, one custom op), W_o (torch)."""
    w = call.weights
    z = F.linear(call.x, w.in_weight).contiguous()
    g = pom_mix_op(z, w.coeff, w.gate_bias, *mix_args(call, call.N))[0]
    return F.linear(g, w.out_weight, w.out_bias)
