"""The ``triton`` backend of PoM: the mixing between the two matrix products in Triton kernels, as PyTorch custom ops.

The projections ``z = [W_h x; W_s x]`` and ``y = W_o g`` are cuBLAS matrix products (torch); everything between —
activation, Horner's polynomial, rotary rotation, key weights, the aggregation over the visible tokens, the gate —
runs in kernels that read ``z`` once and write ``g = gate(z_s + b) ⊙ H`` once. (The ``triton_gemm`` backend,
:mod:`polymixer.ops.pom.triton_gemm`, runs the same kernels with the input projection inside them, so that z is
never written at all.)

**Walks.** Aggregation is a segmented prefix sum over the tokens. One program per (row, block of channels) walks the
row's chunks of ``BLOCK_N`` tokens in order, carrying the running sums (float64) in registers: every element is read
once, and no carry is computed outside the kernels. When rows × channel blocks are too few to fill the GPU, each row
is cut into splits: a summary walk sums each split, a one-program-per-row kernel turns the sums into each split's
carry, and the walks start from it (one more pass over the input). Every mode is a choice of what a query reads:

* causal (plain or packed): its own running sum — the walk gates and writes ``g`` directly; it saves the carry
  entering each chunk (O(N·D / BLOCK_N)) for the backward;
* full, block-causal, packed full / block-causal: the running sum at its "end" token (its sequence's or its block's
  last token) — the walk writes the sums at end tokens to a table, a parallel kernel gates every query from it.

**Backward.** Recomputes the features from z (or x). Causal: one reverse walk carries the gradient flowing back from
later tokens; it writes dz_h, dz_s. End modes: a forward walk sums each end's queries' gradients (and writes dz_s),
a reverse walk carries them back over the ends (and writes dz_h). The coefficients' and the gate bias's gradients
are accumulated in registers over a walk and stored once per (row, split) program: partials of O(B·D·K). HBM passes
per N·D element: forward 3 (read z_h, z_s, write g), backward 5 (read z_h, z_s, dg, write dz_h, dz_s); one more
each way with splits. Nothing is atomic: results are deterministic.

**Host side.** The kernels run inside the custom ops ``polymixer::pom_mix`` / ``pom_mix_backward``
(:func:`polymixer.ops.triton_common.kernel_op`): ``torch.compile(fullgraph=True)`` and ``torch.export`` keep them.
No host synchronisation anywhere: table sizes come from shapes (a bound where packing makes the count data-dependent).
Offsets that can pass 2³¹ elements are 64-bit. Rotary angles are computed in the kernels (float64 angles reduced
modulo 2π, like :func:`polymixer.ops.common.rope_angles`).

Not here (the dispatcher falls back to the torch form, or raises under an explicit ``backend("triton")``): cross-
mixing, an explicit (B, M, N) mask, float64, callable non-linearities, a gate head wider than 128 channels or not a
power of two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common import check_positions
from .tiles import ROLES, TILES, head_class
from ..triton_common import (
    ACT_CODES,
    DTYPES,
    GATE_CODES,
    MAX_DEGREE,
    act_fn,
    act_grad,
    check_runs,
    first_use,
    gate_fn,
    gate_grad,
    horner,
    horner_grad,
    interpreted,
    kernel_op,
    launch,
    offset64,
    or_,
    pow2,
    dot_precision,
    mma,
    rope_cos_sin,
    seg_add,
    sequence_of,
    end_of,
    sm_count,
    judge_check,
)

import triton  # noqa: E402  (triton_common raised a clear ImportError already if it is missing)
import triton.language as tl  # noqa: E402

__all__ = ["supports", "forward", "self_check", "KERNELS", "LaunchConfig", "ROLES", "TILES", "role_tile",
           "head_class", "default_tiles", "use_config", "interpreted", "ACT_CODES", "GATE_CODES", "MODES",
           "mix_layout", "MixLayout", "mix",
           "needs_check", "kernel_limits", "mix_args", "CHECK_SHAPE", "CHECK_MODES", "call_layout",
           "will_differentiate", "run_check", "pom_mix_op", "pom_gemm_op"]

MODES = {"causal": 0, "full": 1, "block": 2}


# ----------------------------------------------------------------------------------------------------------------
# pieces of a tile
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _tile_z(zc, xc, win_ptr, bias_ptr, rows, nmask, ch, cmask, dblk, half, D, d, s_zn, s_xn, s_w,
            NEED_H: tl.constexpr, NEED_S: tl.constexpr, ROPE: tl.constexpr, FUSED: tl.constexpr, GB: tl.constexpr,
            NSP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
            PREC: tl.constexpr):
    """A tile's pre-activations, fp32 (BLOCK_N, BLOCK_D): z_h of its channels (``lo``) and of their rotary partners
    (``hi`` = channel + D/2), and the gate's z_s + b of each channel's head (lo, hi). From z (loads), or — FUSED —
    from x and W_in (matrix products over the d input features: z never exists in memory)."""
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
    if NEED_S:
        ulo += tl.load(bias_ptr + ch // GB, mask=cmask, other=0.0).to(tl.float32)[None, :]
        if ROPE:
            uhi += tl.load(bias_ptr + (ch + half) // GB, mask=cmask, other=0.0).to(tl.float32)[None, :]
    return zlo, zhi, ulo, uhi


@triton.jit
def _features(zlo, zhi, coeff_ptr, ch, cmask, half, cs, sn, w, m2, K: tl.constexpr, ACT: tl.constexpr,
              ROPE: tl.constexpr, HAS_W: tl.constexpr):
    """The features of a tile, rotated by position and weighted: (lo, hi) halves (hi = lo without rotary)."""
    plo = horner(act_fn(zlo, ACT), coeff_ptr, ch, cmask, K)
    phi = plo
    if ROPE:
        phi = horner(act_fn(zhi, ACT), coeff_ptr, ch + half, cmask, K)
        rlo = plo * cs - phi * sn
        phi = phi * cs + plo * sn
        plo = rlo
    if HAS_W:
        plo = plo * w[:, None]
        phi = phi * w[:, None]
    return tl.where(m2, plo, 0.0), tl.where(m2, phi, 0.0)


@triton.jit
def _weights(w_ptr, n, nmask, HAS_W: tl.constexpr):
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
    """R(pos): the transpose of :func:`_to_query_frame`, applied to a gradient."""
    if ROPE:
        rlo = glo * cs - ghi * sn
        ghi = ghi * cs + glo * sn
        glo = rlo
    return glo, ghi


@triton.jit
def _store_g(hlo, hhi, ulo, uhi, gc, rows, s_gn, ch, half, m2, GATE: tl.constexpr, ROPE: tl.constexpr):
    """g = gate(z_s + b) ⊙ H (H already in the query's frame)."""
    loc = rows[:, None] * s_gn + ch[None, :]
    tl.store(gc + loc, (gate_fn(ulo, GATE) * hlo).to(gc.dtype.element_ty), mask=m2)
    if ROPE:
        tl.store(gc + loc + half, (gate_fn(uhi, GATE) * hhi).to(gc.dtype.element_ty), mask=m2)


@triton.jit
def _gate_back(hq, u, dg, dzc, rows, nmask, m2, slot0, nslots, D, s_zn, GATE: tl.constexpr, GB: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """The gate's gradients for one half of a tile: dL/dz_s of its heads (stored), their column sums (for dL/db),
    and gate(u) ⊙ dg, the gradient that flows into H (``hq``: H in the query's frame)."""
    NS: tl.constexpr = BLOCK_D // GB
    slot = slot0 + tl.arange(0, NS)
    smask = tl.arange(0, NS) < nslots
    ds = tl.sum(tl.reshape(tl.where(m2, dg * hq, 0.0), (BLOCK_N, NS, GB)), axis=2)
    us = tl.max(tl.reshape(u, (BLOCK_N, NS, GB)), axis=2)  # a head's channels share one u
    sm2 = nmask[:, None] & smask[None, :]
    du = tl.where(sm2, ds * gate_grad(us, GATE), 0.0)
    tl.store(dzc + rows[:, None] * s_zn + D + slot[None, :], du.to(dzc.dtype.element_ty), mask=sm2)
    return tl.where(m2, gate_fn(u, GATE) * dg, 0.0), tl.sum(du, axis=0)


@triton.jit
def _poly_back(z, dp, coeff_ptr, ch, cmask, m2, K: tl.constexpr, ACT: tl.constexpr, KP: tl.constexpr):
    """From dL/d(feature before rotation and weights) of one half: dL/dz_h, and the tile's dL/dα as (KP, channels)."""
    h = act_fn(z, ACT)
    dz = tl.where(m2, dp * horner_grad(h, coeff_ptr, ch, cmask, K) * act_grad(z, ACT), 0.0)
    kk = tl.arange(0, KP)
    dc = tl.zeros((KP, dz.shape[1]), tl.float32)
    hp = h
    for q in tl.static_range(K):
        dc += tl.where(kk[:, None] == q, tl.sum(tl.where(m2, dp * hp, 0.0), axis=0)[None, :], 0.0)
        hp = hp * h
    return dz, dc


@triton.jit
def _unrotate_weight(dlo, dhi, cs, sn, w, ROPE: tl.constexpr, HAS_W: tl.constexpr):
    """dL/d(rotated, weighted feature) → dL/d(feature): R(−pos), times the key weight."""
    if ROPE:
        rlo = dlo * cs + dhi * sn
        dhi = dhi * cs - dlo * sn
        dlo = rlo
    if HAS_W:
        dlo = dlo * w[:, None]
        dhi = dhi * w[:, None]
    return dlo, dhi


# ----------------------------------------------------------------------------------------------------------------
# forward kernels
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _walk_kernel(z_ptr, x_ptr, win_ptr, coeff_ptr, bias_ptr, w_ptr, pos_ptr, seqid_ptr, cu_ptr, g_ptr, sav_ptr,
                 savw_ptr, cin_ptr, cinw_ptr, summ_ptr, summw_ptr, has_ptr,
                 N, D, half, d, BS, CPS, NC, log2base: tl.float64, s_zb, s_zn, s_xb, s_xn, s_w, s_gb, s_gn, s_wb, s_pb,
                 s_sb, s_swb,
                 K: tl.constexpr, ACT: tl.constexpr, GATE: tl.constexpr, ROPE: tl.constexpr, HAS_W: tl.constexpr,
                 HAS_POS: tl.constexpr, PACKED: tl.constexpr, MEAN: tl.constexpr, MODE: tl.constexpr,
                 HAS_CARRY: tl.constexpr, SUMMARY: tl.constexpr, FUSED: tl.constexpr, GB: tl.constexpr,
                 NSP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
                 PREC: tl.constexpr):
    """One program per (row · split, channel block): walk the split's chunks in order with the running sums.
    Causal: gate and write g, save each chunk's entering carry. End modes: write the sums at end tokens (full mixing
    of whole rows: no scan, the row's sum alone). SUMMARY: write only the split's final carry and whether it holds a
    sequence start."""
    TOTAL: tl.constexpr = (MODE == 1) and (not PACKED)
    pid = tl.program_id(0)
    S = tl.cdiv(NC, CPS)
    b = pid // S
    split = pid - b * S
    dblk = tl.program_id(1)
    ch = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = ch < half
    rows = tl.arange(0, BLOCK_N)
    zrow = z_ptr + offset64(b, s_zb)
    xrow = x_ptr + offset64(b, s_xb)
    grow = g_ptr + offset64(b, s_gb)
    srow = sav_ptr + offset64(b, s_sb)
    swrow = savw_ptr + offset64(b, s_swb)
    wrow = w_ptr + offset64(b, s_wb)
    prow = pos_ptr + offset64(b, s_pb)
    clo = tl.zeros((BLOCK_D,), tl.float64)
    chi = clo
    cw = tl.zeros((), tl.float64)
    has = tl.zeros((), tl.int32)
    if HAS_CARRY:
        clo = tl.load(cin_ptr + offset64(pid, D) + ch, mask=cmask, other=0.0).to(tl.float64)
        if ROPE:
            chi = tl.load(cin_ptr + offset64(pid, D) + half + ch, mask=cmask, other=0.0).to(tl.float64)
        cw = tl.load(cinw_ptr + pid).to(tl.float64)
    c0 = split * CPS
    c1 = tl.minimum(c0 + CPS, NC)
    for c in range(c0, c1):
        n = c * BLOCK_N + rows
        nmask = n < N
        m2 = nmask[:, None] & cmask[None, :]
        zlo, zhi, ulo, uhi = _tile_z(zrow + offset64(c * BLOCK_N, s_zn), xrow + offset64(c * BLOCK_N, s_xn),
                                     win_ptr, bias_ptr, rows, nmask, ch, cmask, dblk, half, D, d, s_zn, s_xn, s_w,
                                     True, (MODE == 0) and (not SUMMARY), ROPE, FUSED, GB, NSP, BLOCK_N, BLOCK_D,
                                     BLOCK_K, PREC)
        sid, s0, s1 = sequence_of(n, nmask, seqid_ptr, cu_ptr, N, PACKED)
        st = ((n == s0) & nmask).to(tl.int32)
        w = _weights(wrow, n, nmask, HAS_W)
        cs = zlo
        sn = zlo
        if ROPE:
            cs, sn = rope_cos_sin(prow, n, nmask, s0, ch, half, log2base, ROPE, HAS_POS)
        flo, fhi = _features(zlo, zhi, coeff_ptr, ch, cmask, half, cs, sn, w, m2, K, ACT, ROPE, HAS_W)
        if not TOTAL:  # every query reads a running sum: scan the chunk
            st2 = st[:, None] + tl.zeros((BLOCK_N, BLOCK_D), tl.int32)
            plo, _ = tl.associative_scan((flo, st2), 0, seg_add)
            phi = plo
            if ROPE:
                phi, _ = tl.associative_scan((fhi, st2), 0, seg_add)
            sw, _ = tl.associative_scan((w, st), 0, seg_add)
            opened = tl.associative_scan(st, 0, or_) == 0  # no start in [chunk start, token]: the carried sequence
            clo32 = clo.to(tl.float32)
            chi32 = chi.to(tl.float32)
            cw32 = cw.to(tl.float32)
            plo = plo + tl.where(opened[:, None], clo32[None, :], 0.0)
            if ROPE:
                phi = phi + tl.where(opened[:, None], chi32[None, :], 0.0)
            W = sw + tl.where(opened, cw32, 0.0)
        if (not SUMMARY) and (not TOTAL):
            if MODE == 0:
                sc = srow + offset64(c, D)
                tl.store(sc + ch, clo32, mask=cmask)
                if ROPE:
                    tl.store(sc + half + ch, chi32, mask=cmask)
                if dblk == 0:
                    tl.store(swrow + c, cw32)
                inv = _inverse(W, nmask, MEAN)
                hlo, hhi = _to_query_frame(plo * inv[:, None], phi * inv[:, None], cs, sn, ROPE)
                _store_g(hlo, hhi, ulo, uhi, grow + offset64(c * BLOCK_N, s_gn), rows, s_gn, ch, half, m2, GATE,
                         ROPE)
            else:
                e, eid = end_of(n, sid, s0, s1, BS, MODE)
                isend = (n == e) & nmask
                em = isend[:, None] & cmask[None, :]
                eoff = eid.to(tl.int64)[:, None] * D + ch[None, :]
                tl.store(srow + eoff, plo, mask=em)
                if ROPE:
                    tl.store(srow + eoff + half, phi, mask=em)
                if dblk == 0:
                    tl.store(swrow + eid, W, mask=isend)
        # what the next chunk carries in: the sums of this chunk's last sequence (float64 across chunks)
        laststart = tl.max(tl.where(st != 0, rows, -1), axis=0)
        tail = (rows >= laststart) & nmask
        hs = laststart >= 0
        clo = tl.where(hs, 0.0, clo) + tl.sum(tl.where(tail[:, None], flo, 0.0), axis=0).to(tl.float64)
        if ROPE:
            chi = tl.where(hs, 0.0, chi) + tl.sum(tl.where(tail[:, None], fhi, 0.0), axis=0).to(tl.float64)
        cw = tl.where(hs, 0.0, cw) + tl.sum(tl.where(tail, w, 0.0), axis=0).to(tl.float64)
        has = has | hs.to(tl.int32)
    if SUMMARY:
        tl.store(summ_ptr + offset64(pid, D) + ch, clo.to(tl.float32), mask=cmask)
        if ROPE:
            tl.store(summ_ptr + offset64(pid, D) + half + ch, chi.to(tl.float32), mask=cmask)
        if dblk == 0:
            tl.store(summw_ptr + pid, cw.to(tl.float32))
            tl.store(has_ptr + pid, has)
    elif TOTAL:  # full mixing of whole rows: the split that ends the row stores the row's sum, its only end
        if c1 == NC:
            tl.store(srow + ch, clo.to(tl.float32), mask=cmask)
            if ROPE:
                tl.store(srow + half + ch, chi.to(tl.float32), mask=cmask)
            if dblk == 0:
                tl.store(swrow, cw.to(tl.float32))


@triton.jit
def _gate_kernel(z_ptr, x_ptr, win_ptr, bias_ptr, pos_ptr, seqid_ptr, cu_ptr, end_ptr, endw_ptr, g_ptr,
                 N, D, half, d, BS, log2base: tl.float64, s_zb, s_zn, s_xb, s_xn, s_w, s_gb, s_gn, s_pb, s_eb, s_ewb,
                 GATE: tl.constexpr, ROPE: tl.constexpr, HAS_POS: tl.constexpr, PACKED: tl.constexpr,
                 MEAN: tl.constexpr, MODE: tl.constexpr, FUSED: tl.constexpr, GB: tl.constexpr, NSP: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, PREC: tl.constexpr):
    """End-token modes, in parallel over chunks: g = gate(z_s + b) ⊙ R(−pos) H, H the sum at each query's end token
    (÷ its weight)."""
    b = tl.program_id(0)
    c = tl.program_id(1)
    dblk = tl.program_id(2)
    rows = tl.arange(0, BLOCK_N)
    n = c * BLOCK_N + rows
    nmask = n < N
    ch = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = ch < half
    m2 = nmask[:, None] & cmask[None, :]
    _, _, ulo, uhi = _tile_z(z_ptr + offset64(b, s_zb) + offset64(c * BLOCK_N, s_zn),
                             x_ptr + offset64(b, s_xb) + offset64(c * BLOCK_N, s_xn), win_ptr, bias_ptr, rows, nmask,
                             ch, cmask, dblk, half, D, d, s_zn, s_xn, s_w, False, True, ROPE, FUSED, GB, NSP, BLOCK_N,
                             BLOCK_D, BLOCK_K, PREC)
    sid, s0, s1 = sequence_of(n, nmask, seqid_ptr, cu_ptr, N, PACKED)
    e, eid = end_of(n, sid, s0, s1, BS, MODE)
    erow = end_ptr + offset64(b, s_eb)
    eoff = eid.to(tl.int64)[:, None] * D + ch[None, :]
    hlo = tl.load(erow + eoff, mask=m2, other=0.0)
    hhi = hlo
    if ROPE:
        hhi = tl.load(erow + eoff + half, mask=m2, other=0.0)
    inv = _inverse(tl.load(endw_ptr + offset64(b, s_ewb) + eid, mask=nmask, other=0.0), nmask, MEAN)
    cs = hlo
    sn = hlo
    if ROPE:
        cs, sn = rope_cos_sin(pos_ptr + offset64(b, s_pb), n, nmask, s0, ch, half, log2base, ROPE, HAS_POS)
    hlo, hhi = _to_query_frame(hlo * inv[:, None], hhi * inv[:, None], cs, sn, ROPE)
    _store_g(hlo, hhi, ulo, uhi, g_ptr + offset64(b, s_gb) + offset64(c * BLOCK_N, s_gn), rows, s_gn, ch, half, m2,
             GATE, ROPE)


@triton.jit
def _carry_kernel(summ_ptr, summw_ptr, has_ptr, cin_ptr, cinw_ptr, S, W, REVERSE: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    """Splits → carries: what enters each split of a row from the splits before it (after it when REVERSE): the
    running sum of their summaries, restarted at every split that holds a sequence start. float64."""
    b = tl.program_id(0)
    dblk = tl.program_id(1)
    ch = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = ch < W
    carry = tl.zeros((BLOCK_D,), tl.float64)
    cw = tl.zeros((), tl.float64)
    for i in range(0, S):
        if REVERSE:
            s = S - 1 - i
        else:
            s = i
        row = offset64(b, S) + s
        tl.store(cin_ptr + row * W + ch, carry.to(tl.float32), mask=cmask)
        if dblk == 0:
            tl.store(cinw_ptr + row, cw.to(tl.float32))
        h = tl.load(has_ptr + row) != 0
        carry = tl.where(h, 0.0, carry) + tl.load(summ_ptr + row * W + ch, mask=cmask, other=0.0).to(tl.float64)
        cw = tl.where(h, 0.0, cw) + tl.load(summw_ptr + row).to(tl.float64)


# ----------------------------------------------------------------------------------------------------------------
# backward kernels
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _causal_backward_kernel(z_ptr, x_ptr, win_ptr, coeff_ptr, bias_ptr, w_ptr, pos_ptr, seqid_ptr, cu_ptr, dg_ptr,
                            dz_ptr, sav_ptr, savw_ptr, cin_ptr, summ_ptr, has_ptr, dcoeff_ptr, dbias_ptr,
                            N, D, half, d, CPS, NC, log2base: tl.float64, s_zb, s_zn, s_xb, s_xn, s_w, s_gb, s_gn, s_wb,
                            s_pb, s_sb, s_swb,
                            K: tl.constexpr, ACT: tl.constexpr, GATE: tl.constexpr, ROPE: tl.constexpr,
                            HAS_W: tl.constexpr, HAS_POS: tl.constexpr, PACKED: tl.constexpr, MEAN: tl.constexpr,
                            HAS_CARRY: tl.constexpr, SUMMARY: tl.constexpr, FUSED: tl.constexpr, GB: tl.constexpr,
                            NSP: tl.constexpr, KP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                            BLOCK_K: tl.constexpr, PREC: tl.constexpr):
    """Causal backward, one program per (row · split, channel block), walking the chunks backwards: recompute the
    features and running sums (from the saved carries), the gate's gradients, then the reverse segmented sum of the
    gradient of H plus what flows back from later chunks (carried) gives every feature's gradient. SUMMARY: only
    the gradient flowing out of the split's first sequence, and whether the split holds a start."""
    pid = tl.program_id(0)
    S = tl.cdiv(NC, CPS)
    b = pid // S
    split = pid - b * S
    dblk = tl.program_id(1)
    ch = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = ch < half
    rows = tl.arange(0, BLOCK_N)
    NS: tl.constexpr = BLOCK_D // GB
    nslots = tl.minimum(NS, (half - dblk * BLOCK_D + GB - 1) // GB)
    zrow = z_ptr + offset64(b, s_zb)
    xrow = x_ptr + offset64(b, s_xb)
    dzrow = dz_ptr + offset64(b, s_zb)
    dgrow = dg_ptr + offset64(b, s_gb)
    srow = sav_ptr + offset64(b, s_sb)
    swrow = savw_ptr + offset64(b, s_swb)
    wrow = w_ptr + offset64(b, s_wb)
    prow = pos_ptr + offset64(b, s_pb)
    rlo = tl.zeros((BLOCK_D,), tl.float64)
    rhi = rlo
    has = tl.zeros((), tl.int32)
    if HAS_CARRY:
        rlo = tl.load(cin_ptr + offset64(pid, D) + ch, mask=cmask, other=0.0).to(tl.float64)
        if ROPE:
            rhi = tl.load(cin_ptr + offset64(pid, D) + half + ch, mask=cmask, other=0.0).to(tl.float64)
    dclo = tl.zeros((KP, BLOCK_D), tl.float32)
    dchi = dclo
    dblo = tl.zeros((NS,), tl.float32)
    dbhi = dblo
    c0 = split * CPS
    c1 = tl.minimum(c0 + CPS, NC)
    for r in range(0, c1 - c0):
        c = c1 - 1 - r
        n = c * BLOCK_N + rows
        nmask = n < N
        m2 = nmask[:, None] & cmask[None, :]
        zc = zrow + offset64(c * BLOCK_N, s_zn)
        dzc = dzrow + offset64(c * BLOCK_N, s_zn)
        zlo, zhi, ulo, uhi = _tile_z(zc, xrow + offset64(c * BLOCK_N, s_xn), win_ptr, bias_ptr, rows, nmask, ch,
                                     cmask, dblk, half, D, d, s_zn, s_xn, s_w, not SUMMARY, True, ROPE, FUSED, GB,
                                     NSP, BLOCK_N, BLOCK_D, BLOCK_K, PREC)
        sid, s0, s1 = sequence_of(n, nmask, seqid_ptr, cu_ptr, N, PACKED)
        st = ((n == s0) & nmask).to(tl.int32)
        w = _weights(wrow, n, nmask, HAS_W)
        cs = zlo
        sn = zlo
        if ROPE:
            cs, sn = rope_cos_sin(prow, n, nmask, s0, ch, half, log2base, ROPE, HAS_POS)
        sw, _ = tl.associative_scan((w, st), 0, seg_add)
        opened = tl.associative_scan(st, 0, or_) == 0
        W = sw + tl.where(opened, tl.load(swrow + c), 0.0)
        inv = _inverse(W, nmask, MEAN)
        gloc = rows[:, None] * s_gn + ch[None, :]
        dglo = tl.load(dgrow + offset64(c * BLOCK_N, s_gn) + gloc, mask=m2, other=0.0).to(tl.float32)
        dghi = dglo
        if ROPE:
            dghi = tl.load(dgrow + offset64(c * BLOCK_N, s_gn) + gloc + half, mask=m2, other=0.0).to(tl.float32)
        if SUMMARY:
            glo = tl.where(m2, gate_fn(ulo, GATE) * dglo, 0.0)
            ghi = tl.where(m2, gate_fn(uhi, GATE) * dghi, 0.0)
        else:
            flo, fhi = _features(zlo, zhi, coeff_ptr, ch, cmask, half, cs, sn, w, m2, K, ACT, ROPE, HAS_W)
            st2 = st[:, None] + tl.zeros((BLOCK_N, BLOCK_D), tl.int32)
            plo, _ = tl.associative_scan((flo, st2), 0, seg_add)
            sc = srow + offset64(c, D)
            plo = plo + tl.where(opened[:, None], tl.load(sc + ch, mask=cmask, other=0.0)[None, :], 0.0)
            phi = plo
            if ROPE:
                phi, _ = tl.associative_scan((fhi, st2), 0, seg_add)
                phi = phi + tl.where(opened[:, None], tl.load(sc + half + ch, mask=cmask, other=0.0)[None, :], 0.0)
            hlo, hhi = _to_query_frame(plo * inv[:, None], phi * inv[:, None], cs, sn, ROPE)
            glo, dbl = _gate_back(hlo, ulo, dglo, dzc, rows, nmask, m2, dblk * NS, nslots, D, s_zn, GATE, GB,
                                  BLOCK_N, BLOCK_D)
            dblo += dbl
            ghi = glo
            if ROPE:
                ghi, dbh = _gate_back(hhi, uhi, dghi, dzc, rows, nmask, m2, (half + dblk * BLOCK_D) // GB, nslots, D,
                                      s_zn, GATE, GB, BLOCK_N, BLOCK_D)
                dbhi += dbh
        glo, ghi = _from_query_frame(glo, ghi, cs, sn, ROPE)
        glo = tl.where(m2, glo * inv[:, None], 0.0)
        ghi = tl.where(m2, ghi * inv[:, None], 0.0)
        # the reverse running sum of a sequence: token j collects the gradients of every later query of its sequence
        sl = ((n == s1 - 1) & nmask).to(tl.int32)
        sl2 = sl[:, None] + tl.zeros((BLOCK_N, BLOCK_D), tl.int32)
        dlo, _ = tl.associative_scan((glo, sl2), 0, seg_add, reverse=True)
        dhi = dlo
        if ROPE:
            dhi, _ = tl.associative_scan((ghi, sl2), 0, seg_add, reverse=True)
        laststart = tl.max(tl.where(st != 0, rows, -1), axis=0)
        tail = rows >= laststart  # the chunk's last sequence: it also collects what flows back from later chunks
        dlo = dlo + tl.where(tail[:, None], rlo.to(tl.float32)[None, :], 0.0)
        if ROPE:
            dhi = dhi + tl.where(tail[:, None], rhi.to(tl.float32)[None, :], 0.0)
        firststart = tl.min(tl.where(st != 0, rows, BLOCK_N), axis=0)
        head = rows < firststart
        hs = firststart < BLOCK_N
        rlo = tl.where(hs, 0.0, rlo) + tl.sum(tl.where(head[:, None], glo, 0.0), axis=0).to(tl.float64)
        if ROPE:
            rhi = tl.where(hs, 0.0, rhi) + tl.sum(tl.where(head[:, None], ghi, 0.0), axis=0).to(tl.float64)
        has = has | hs.to(tl.int32)
        if not SUMMARY:
            dlo, dhi = _unrotate_weight(dlo, dhi, cs, sn, w, ROPE, HAS_W)
            if not FUSED:  # z_h again (in cache): fewer registers than keeping it alive through the walk step
                zlo = tl.load(zc + rows[:, None] * s_zn + ch[None, :], mask=m2, other=0.0).to(tl.float32)
                if ROPE:
                    zhi = tl.load(zc + rows[:, None] * s_zn + half + ch[None, :], mask=m2, other=0.0).to(tl.float32)
            dzl, dcl = _poly_back(zlo, dlo, coeff_ptr, ch, cmask, m2, K, ACT, KP)
            tl.store(dzc + rows[:, None] * s_zn + ch[None, :], dzl.to(dz_ptr.dtype.element_ty), mask=m2)
            dclo += dcl
            if ROPE:
                dzh, dch = _poly_back(zhi, dhi, coeff_ptr, ch + half, cmask, m2, K, ACT, KP)
                tl.store(dzc + rows[:, None] * s_zn + half + ch[None, :], dzh.to(dz_ptr.dtype.element_ty), mask=m2)
                dchi += dch
    if SUMMARY:
        tl.store(summ_ptr + offset64(pid, D) + ch, rlo.to(tl.float32), mask=cmask)
        if ROPE:
            tl.store(summ_ptr + offset64(pid, D) + half + ch, rhi.to(tl.float32), mask=cmask)
        if dblk == 0:
            tl.store(has_ptr + pid, has)
    else:
        _store_partials(dcoeff_ptr, dbias_ptr, pid, dclo, dchi, dblo, dbhi, ch, cmask, half, D, dblk, nslots, K, KP,
                        ROPE, GB, BLOCK_D)


@triton.jit
def _store_partials(dcoeff_ptr, dbias_ptr, pid, dclo, dchi, dblo, dbhi, ch, cmask, half, D, dblk, nslots,
                    K: tl.constexpr, KP: tl.constexpr, ROPE: tl.constexpr, GB: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's share of dL/dα (its channels × K) and dL/db (its heads) in row ``pid`` of the partials."""
    kk = tl.arange(0, KP)
    km = (kk[:, None] < K) & cmask[None, :]
    crow = dcoeff_ptr + offset64(pid, D * K)
    tl.store(crow + ch[None, :] * K + kk[:, None], dclo, mask=km)
    if ROPE:
        tl.store(crow + (ch + half)[None, :] * K + kk[:, None], dchi, mask=km)
    NS: tl.constexpr = BLOCK_D // GB
    slot = tl.arange(0, NS)
    sm = slot < nslots
    brow = dbias_ptr + offset64(pid, D // GB)
    tl.store(brow + dblk * NS + slot, dblo, mask=sm)
    if ROPE:
        tl.store(brow + (half + dblk * BLOCK_D) // GB + slot, dbhi, mask=sm)


@triton.jit
def _group_backward_kernel(z_ptr, x_ptr, win_ptr, bias_ptr, pos_ptr, seqid_ptr, cu_ptr, dg_ptr, dz_ptr, end_ptr,
                           endw_ptr, dend_ptr, cin_ptr, summ_ptr, has_ptr, dbias_ptr,
                           N, D, half, d, BS, CPS, NC, log2base: tl.float64, s_zb, s_zn, s_xb, s_xn, s_w, s_gb, s_gn,
                           s_pb, s_eb, s_ewb,
                           GATE: tl.constexpr, ROPE: tl.constexpr, HAS_POS: tl.constexpr, PACKED: tl.constexpr,
                           MEAN: tl.constexpr, MODE: tl.constexpr, HAS_CARRY: tl.constexpr, SUMMARY: tl.constexpr,
                           FUSED: tl.constexpr, GB: tl.constexpr, NSP: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, PREC: tl.constexpr):
    """End-token modes, backward part 1, walking forwards: the gate's gradients (dz_s stored), and the gradient of
    each end's sum — the sum over its queries (a run of tokens ending at the end token) of R(pos)(s ⊙ dg) / weight —
    stored at the end's row of ``dend`` (full mixing of whole rows: no scan, the row's sum)."""
    TOTAL: tl.constexpr = (MODE == 1) and (not PACKED)
    pid = tl.program_id(0)
    S = tl.cdiv(NC, CPS)
    b = pid // S
    split = pid - b * S
    dblk = tl.program_id(1)
    ch = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = ch < half
    rows = tl.arange(0, BLOCK_N)
    NS: tl.constexpr = BLOCK_D // GB
    nslots = tl.minimum(NS, (half - dblk * BLOCK_D + GB - 1) // GB)
    zrow = z_ptr + offset64(b, s_zb)
    xrow = x_ptr + offset64(b, s_xb)
    dzrow = dz_ptr + offset64(b, s_zb)
    dgrow = dg_ptr + offset64(b, s_gb)
    erow = end_ptr + offset64(b, s_eb)
    derow = dend_ptr + offset64(b, s_eb)
    ewrow = endw_ptr + offset64(b, s_ewb)
    prow = pos_ptr + offset64(b, s_pb)
    clo = tl.zeros((BLOCK_D,), tl.float64)
    chi = clo
    has = tl.zeros((), tl.int32)
    if HAS_CARRY:
        clo = tl.load(cin_ptr + offset64(pid, D) + ch, mask=cmask, other=0.0).to(tl.float64)
        if ROPE:
            chi = tl.load(cin_ptr + offset64(pid, D) + half + ch, mask=cmask, other=0.0).to(tl.float64)
    dblo = tl.zeros((NS,), tl.float32)
    dbhi = dblo
    c0 = split * CPS
    c1 = tl.minimum(c0 + CPS, NC)
    for c in range(c0, c1):
        n = c * BLOCK_N + rows
        nmask = n < N
        m2 = nmask[:, None] & cmask[None, :]
        dzc = dzrow + offset64(c * BLOCK_N, s_zn)
        _, _, ulo, uhi = _tile_z(zrow + offset64(c * BLOCK_N, s_zn), xrow + offset64(c * BLOCK_N, s_xn), win_ptr,
                                 bias_ptr, rows, nmask, ch, cmask, dblk, half, D, d, s_zn, s_xn, s_w, False, True, ROPE,
                                 FUSED, GB, NSP, BLOCK_N, BLOCK_D, BLOCK_K, PREC)
        sid, s0, s1 = sequence_of(n, nmask, seqid_ptr, cu_ptr, N, PACKED)
        e, eid = end_of(n, sid, s0, s1, BS, MODE)
        isend = (n == e) & nmask
        if MODE == 1:
            gst = ((n == s0) & nmask).to(tl.int32)
        else:
            gst = (((n - s0) % BS == 0) & nmask).to(tl.int32)
        inv = _inverse(tl.load(ewrow + eid, mask=nmask, other=0.0), nmask, MEAN)
        cs = ulo
        sn = ulo
        if ROPE:
            cs, sn = rope_cos_sin(prow, n, nmask, s0, ch, half, log2base, ROPE, HAS_POS)
        gloc = rows[:, None] * s_gn + ch[None, :]
        dglo = tl.load(dgrow + offset64(c * BLOCK_N, s_gn) + gloc, mask=m2, other=0.0).to(tl.float32)
        dghi = dglo
        if ROPE:
            dghi = tl.load(dgrow + offset64(c * BLOCK_N, s_gn) + gloc + half, mask=m2, other=0.0).to(tl.float32)
        if SUMMARY:
            glo = tl.where(m2, gate_fn(ulo, GATE) * dglo, 0.0)
            ghi = tl.where(m2, gate_fn(uhi, GATE) * dghi, 0.0)
        else:
            eoff = eid.to(tl.int64)[:, None] * D + ch[None, :]
            hlo = tl.load(erow + eoff, mask=m2, other=0.0)
            hhi = hlo
            if ROPE:
                hhi = tl.load(erow + eoff + half, mask=m2, other=0.0)
            hlo, hhi = _to_query_frame(hlo * inv[:, None], hhi * inv[:, None], cs, sn, ROPE)
            glo, dbl = _gate_back(hlo, ulo, dglo, dzc, rows, nmask, m2, dblk * NS, nslots, D, s_zn, GATE, GB,
                                  BLOCK_N, BLOCK_D)
            dblo += dbl
            ghi = glo
            if ROPE:
                ghi, dbh = _gate_back(hhi, uhi, dghi, dzc, rows, nmask, m2, (half + dblk * BLOCK_D) // GB, nslots, D,
                                      s_zn, GATE, GB, BLOCK_N, BLOCK_D)
                dbhi += dbh
        glo, ghi = _from_query_frame(glo, ghi, cs, sn, ROPE)
        glo = tl.where(m2, glo * inv[:, None], 0.0)
        ghi = tl.where(m2, ghi * inv[:, None], 0.0)
        if not TOTAL:  # each end's sum: a segmented scan of its queries' gradients, read at the end token
            gst2 = gst[:, None] + tl.zeros((BLOCK_N, BLOCK_D), tl.int32)
            slo, _ = tl.associative_scan((glo, gst2), 0, seg_add)
            shi = slo
            if ROPE:
                shi, _ = tl.associative_scan((ghi, gst2), 0, seg_add)
            opened = tl.associative_scan(gst, 0, or_) == 0
        if (not SUMMARY) and (not TOTAL):
            em = isend[:, None] & cmask[None, :]
            eoff = eid.to(tl.int64)[:, None] * D + ch[None, :]
            tl.store(derow + eoff, slo + tl.where(opened[:, None], clo.to(tl.float32)[None, :], 0.0), mask=em)
            if ROPE:
                tl.store(derow + eoff + half, shi + tl.where(opened[:, None], chi.to(tl.float32)[None, :], 0.0),
                         mask=em)
        laststart = tl.max(tl.where(gst != 0, rows, -1), axis=0)
        tail = (rows >= laststart) & nmask
        hs = laststart >= 0
        clo = tl.where(hs, 0.0, clo) + tl.sum(tl.where(tail[:, None], glo, 0.0), axis=0).to(tl.float64)
        if ROPE:
            chi = tl.where(hs, 0.0, chi) + tl.sum(tl.where(tail[:, None], ghi, 0.0), axis=0).to(tl.float64)
        has = has | hs.to(tl.int32)
    if SUMMARY:
        tl.store(summ_ptr + offset64(pid, D) + ch, clo.to(tl.float32), mask=cmask)
        if ROPE:
            tl.store(summ_ptr + offset64(pid, D) + half + ch, chi.to(tl.float32), mask=cmask)
        if dblk == 0:
            tl.store(has_ptr + pid, has)
    else:
        if TOTAL and (c1 == NC):  # full mixing of whole rows: the row's only end gets the whole row's gradient
            tl.store(derow + ch, clo.to(tl.float32), mask=cmask)
            if ROPE:
                tl.store(derow + half + ch, chi.to(tl.float32), mask=cmask)
        NSB: tl.constexpr = BLOCK_D // GB
        slot = tl.arange(0, NSB)
        sm = slot < nslots
        brow = dbias_ptr + offset64(pid, D // GB)
        tl.store(brow + dblk * NSB + slot, dblo, mask=sm)
        if ROPE:
            tl.store(brow + (half + dblk * BLOCK_D) // GB + slot, dbhi, mask=sm)


@triton.jit
def _end_backward_kernel(z_ptr, x_ptr, win_ptr, coeff_ptr, w_ptr, pos_ptr, seqid_ptr, cu_ptr, dz_ptr, dend_ptr,
                         cin_ptr, summ_ptr, has_ptr, dcoeff_ptr,
                         N, D, half, d, BS, CPS, NC, log2base: tl.float64, s_zb, s_zn, s_xb, s_xn, s_w, s_wb, s_pb,
                         s_eb,
                         K: tl.constexpr, ACT: tl.constexpr, ROPE: tl.constexpr, HAS_W: tl.constexpr,
                         HAS_POS: tl.constexpr, PACKED: tl.constexpr, MODE: tl.constexpr, HAS_CARRY: tl.constexpr,
                         SUMMARY: tl.constexpr, FUSED: tl.constexpr, KP: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, PREC: tl.constexpr):
    """End-token modes, backward part 2, walking backwards: a token's feature feeds the sums at its own end and
    every later end of its sequence, so its gradient is the reverse running sum of the end gradients (full mixing of
    whole rows: the row's one end gradient, no scan); then dz_h and the partial dL/dα."""
    TOTAL: tl.constexpr = (MODE == 1) and (not PACKED)
    pid = tl.program_id(0)
    S = tl.cdiv(NC, CPS)
    b = pid // S
    split = pid - b * S
    dblk = tl.program_id(1)
    ch = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = ch < half
    rows = tl.arange(0, BLOCK_N)
    zrow = z_ptr + offset64(b, s_zb)
    xrow = x_ptr + offset64(b, s_xb)
    dzrow = dz_ptr + offset64(b, s_zb)
    derow = dend_ptr + offset64(b, s_eb)
    wrow = w_ptr + offset64(b, s_wb)
    prow = pos_ptr + offset64(b, s_pb)
    rlo = tl.zeros((BLOCK_D,), tl.float64)
    rhi = rlo
    has = tl.zeros((), tl.int32)
    if HAS_CARRY:
        rlo = tl.load(cin_ptr + offset64(pid, D) + ch, mask=cmask, other=0.0).to(tl.float64)
        if ROPE:
            rhi = tl.load(cin_ptr + offset64(pid, D) + half + ch, mask=cmask, other=0.0).to(tl.float64)
    dclo = tl.zeros((KP, BLOCK_D), tl.float32)
    dchi = dclo
    c0 = split * CPS
    c1 = tl.minimum(c0 + CPS, NC)
    for r in range(0, c1 - c0):
        c = c1 - 1 - r
        n = c * BLOCK_N + rows
        nmask = n < N
        m2 = nmask[:, None] & cmask[None, :]
        sid, s0, s1 = sequence_of(n, nmask, seqid_ptr, cu_ptr, N, PACKED)
        if TOTAL:  # every token of the row feeds its one end: the end's gradient, as it is
            dlo = tl.zeros((BLOCK_N, BLOCK_D), tl.float32) + tl.load(derow + ch, mask=cmask, other=0.0)[None, :]
            dhi = dlo
            if ROPE:
                dhi = tl.zeros((BLOCK_N, BLOCK_D), tl.float32) + tl.load(derow + half + ch, mask=cmask,
                                                                         other=0.0)[None, :]
        else:
            e, eid = end_of(n, sid, s0, s1, BS, MODE)
            isend = (n == e) & nmask
            st = ((n == s0) & nmask).to(tl.int32)
            em = isend[:, None] & cmask[None, :]
            eoff = eid.to(tl.int64)[:, None] * D + ch[None, :]
            elo = tl.load(derow + eoff, mask=em, other=0.0)
            ehi = elo
            if ROPE:
                ehi = tl.load(derow + eoff + half, mask=em, other=0.0)
            sl = ((n == s1 - 1) & nmask).to(tl.int32)
            sl2 = sl[:, None] + tl.zeros((BLOCK_N, BLOCK_D), tl.int32)
            dlo, _ = tl.associative_scan((elo, sl2), 0, seg_add, reverse=True)
            dhi = dlo
            if ROPE:
                dhi, _ = tl.associative_scan((ehi, sl2), 0, seg_add, reverse=True)
            laststart = tl.max(tl.where(st != 0, rows, -1), axis=0)
            tail = rows >= laststart
            dlo = dlo + tl.where(tail[:, None], rlo.to(tl.float32)[None, :], 0.0)
            if ROPE:
                dhi = dhi + tl.where(tail[:, None], rhi.to(tl.float32)[None, :], 0.0)
            firststart = tl.min(tl.where(st != 0, rows, BLOCK_N), axis=0)
            head = rows < firststart
            hs = firststart < BLOCK_N
            rlo = tl.where(hs, 0.0, rlo) + tl.sum(tl.where(head[:, None], elo, 0.0), axis=0).to(tl.float64)
            if ROPE:
                rhi = tl.where(hs, 0.0, rhi) + tl.sum(tl.where(head[:, None], ehi, 0.0), axis=0).to(tl.float64)
            has = has | hs.to(tl.int32)
        if not SUMMARY:
            zlo, zhi, _, _ = _tile_z(zrow + offset64(c * BLOCK_N, s_zn), xrow + offset64(c * BLOCK_N, s_xn), win_ptr,
                                     win_ptr, rows, nmask, ch, cmask, dblk, half, D, d, s_zn, s_xn, s_w, True, False,
                                     ROPE, FUSED, 1, 16, BLOCK_N, BLOCK_D, BLOCK_K, PREC)
            w = _weights(wrow, n, nmask, HAS_W)
            cs = zlo
            sn = zlo
            if ROPE:
                cs, sn = rope_cos_sin(prow, n, nmask, s0, ch, half, log2base, ROPE, HAS_POS)
            dlo, dhi = _unrotate_weight(dlo, dhi, cs, sn, w, ROPE, HAS_W)
            dzc = dzrow + offset64(c * BLOCK_N, s_zn)
            dzl, dcl = _poly_back(zlo, dlo, coeff_ptr, ch, cmask, m2, K, ACT, KP)
            tl.store(dzc + rows[:, None] * s_zn + ch[None, :], dzl.to(dz_ptr.dtype.element_ty), mask=m2)
            dclo += dcl
            if ROPE:
                dzh, dch = _poly_back(zhi, dhi, coeff_ptr, ch + half, cmask, m2, K, ACT, KP)
                tl.store(dzc + rows[:, None] * s_zn + half + ch[None, :], dzh.to(dz_ptr.dtype.element_ty), mask=m2)
                dchi += dch
    if SUMMARY:
        tl.store(summ_ptr + offset64(pid, D) + ch, rlo.to(tl.float32), mask=cmask)
        if ROPE:
            tl.store(summ_ptr + offset64(pid, D) + half + ch, rhi.to(tl.float32), mask=cmask)
        if dblk == 0:
            tl.store(has_ptr + pid, has)
    else:
        kk = tl.arange(0, KP)
        km = (kk[:, None] < K) & cmask[None, :]
        crow = dcoeff_ptr + offset64(pid, D * K)
        tl.store(crow + ch[None, :] * K + kk[:, None], dclo, mask=km)
        if ROPE:
            tl.store(crow + (ch + half)[None, :] * K + kk[:, None], dchi, mask=km)


KERNELS = {"walk": _walk_kernel, "gate": _gate_kernel, "carry": _carry_kernel,
           "causal_backward": _causal_backward_kernel, "group_backward": _group_backward_kernel,
           "end_backward": _end_backward_kernel}


# ----------------------------------------------------------------------------------------------------------------
# launch configurations
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchConfig:
    """A forced configuration (tests): BLOCK_N tokens per chunk × BLOCK_D channels (pairs with rotary) for every
    kernel of a call (block_n None: the tiles of :data:`TILES`), the warps, the input features per step of the fused
    route's products, the splits per row (None: automatic), and the launches' register bound."""

    block_n: Optional[int] = 64
    block_d: int = 32
    num_warps: int = 4
    block_k: int = 32
    splits: Optional[int] = None
    maxnreg: int = 255  # ptxas may use every register a 4-warp block can have (≥ 2 blocks per SM), not spill first


_OVERRIDE: List[Optional[LaunchConfig]] = [None]


def use_config(config: Optional[LaunchConfig]) -> None:
    """Force a launch configuration (tests run several chunks, channel blocks and splits on tiny shapes); None: the
    automatic choice (:data:`TILES`)."""
    _OVERRIDE[0] = config


def role_tile(fused: bool, rope: bool, G: int, role: str) -> Optional[Tuple[int, int]]:
    """(BLOCK_N, BLOCK_D) of a role's kernel for a call (forced tiles first), None when none fits."""
    forced = _OVERRIDE[0]
    if forced is not None and forced.block_n is not None:  # a forced tile still holds whole gate heads
        return forced.block_n, max(forced.block_d, pow2(G))
    return TILES[(fused, rope, head_class(G))][role]


def default_tiles() -> Dict[str, Optional[Tuple[int, int]]]:
    """The tiles of the most common case: the unfused route, one gate per channel, no rotary."""
    return TILES[(False, False, 16)]


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

    def block_n(self, role: str) -> int:
        return self.tile(role)[0]  # type: ignore[index]

    def block_d(self, role: str) -> int:
        return self.tile(role)[1]  # type: ignore[index]

    def nc(self, role: str) -> int:
        return -(-self.N // self.block_n(role))

    def nd(self, role: str) -> int:
        return -(-self.half // self.block_d(role))

    def splits(self, role: str) -> int:
        """Splits per row of a role's walk: enough that rows × splits × channel blocks fill the GPU twice (one when
        they already do; forced in tests), at most one per chunk, every split holding a chunk."""
        forced = _OVERRIDE[0]
        if forced is not None and forced.splits is not None:
            want = forced.splits
        else:
            target = 2 * self.sms
            programs = self.B * self.nd(role)
            want = 1 if programs >= target else -(-target // programs)
        nc = self.nc(role)
        s = max(1, min(want, nc))
        return -(-nc // -(-nc // s))

    def cps(self, role: str) -> int:
        """Chunks per split of a role's walk."""
        return -(-self.nc(role) // self.splits(role))

    @property
    def nend(self) -> int:
        """Rows of the end table: sequences (full), or a bound on the blocks (block-causal)."""
        if self.mode == 1:
            return self.nseq
        return (self.N - 1) // self.block_size + self.nseq

    @property
    def saved_rows(self) -> int:
        return self.nc("causal_walk") if self.mode == 0 else self.nend

    def roles(self, backward: bool) -> List[str]:
        fwd = ["causal_walk"] if self.mode == 0 else ["walk", "gate"]
        bwd = (["causal_backward"] if self.mode == 0 else ["group", "end"]) if backward else []
        return fwd + bwd

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


def _common(L: MixLayout, act: int, rope: int, has_w: bool, has_pos: bool, packed: bool, role: str
            ) -> Dict[str, Any]:
    tile = L.tile(role)
    if tile is None:
        raise NotImplementedError(L.missing(True) or f"no tile fits the {role} kernel")
    forced = _OVERRIDE[0]
    warps, maxnreg = (forced.num_warps, forced.maxnreg) if forced is not None and forced.block_n else (4, 255)
    return dict(K=L.K, ACT=act, ROPE=rope, HAS_W=has_w, HAS_POS=has_pos, PACKED=packed, BLOCK_N=tile[0],
                BLOCK_D=tile[1], num_warps=warps, maxnreg=maxnreg)


def _gemm_args(L: MixLayout, x: Optional[Tensor], z: Tensor, role: str) -> Dict[str, Any]:
    """The fused route's constexprs (harmless ones for the unfused route)."""
    fused = x is not None
    NS = L.block_d(role) // L.G
    forced = _OVERRIDE[0]
    block_k = forced.block_k if forced is not None else 32
    return dict(FUSED=fused, GB=L.G, NSP=max(16, NS), BLOCK_K=block_k if fused else 16,
                PREC=dot_precision(z) if fused else "ieee")


def _kw(L: MixLayout, flags: Tuple[Any, ...], x: Optional[Tensor], z: Tensor, role: str,
        drop: Tuple[str, ...] = ()) -> Dict[str, Any]:
    """Every constexpr and launch option of a role's kernel, less those it does not take."""
    kw = {**_common(L, *flags, role), **_gemm_args(L, x, z, role)}
    return {k: v for k, v in kw.items() if k not in drop}


def _pos_strides(pos: Optional[Tensor], two_d: bool) -> int:
    """The row stride of the positions ((B, N[, 2]) or one row broadcast to every batch row)."""
    if pos is None or pos.dim() == (2 if two_d else 1):
        return 0
    return pos.stride(0)


def _carries(B: int, splits: int, dev: torch.device, reverse: bool, width: int, summarise: Any
             ) -> Tuple[Tensor, Tensor]:
    """``summarise(summ, summw, has)`` runs a walk in SUMMARY mode over every split; then the carry kernel gives each
    split's entering carries."""
    rows = B * splits
    summ = torch.empty(rows, width, dtype=torch.float32, device=dev)
    summw = torch.empty(rows, dtype=torch.float32, device=dev)
    has = torch.empty(rows, dtype=torch.int32, device=dev)
    summarise(summ, summw, has)
    cin = torch.empty_like(summ)
    cinw = torch.empty_like(summw)
    launch(_carry_kernel, (B, -(-width // 64)), summ, summw, has, cin, cinw, splits, width, REVERSE=reverse,
           BLOCK_D=64, num_warps=2)
    return cin, cinw


def _layout_of(src: Tensor, coeff: Tensor, bias: Tensor, cu: Optional[Tensor], mode: int, block_size: int,
               rope: int, fused: bool) -> MixLayout:
    D, K = coeff.shape
    return mix_layout(src.shape[0], src.shape[1], D, bias.shape[0], K, mode, block_size,
                      1 if cu is None else cu.shape[0] - 1, rope, src.device, fused)


def mix(z: Optional[Tensor], x: Optional[Tensor], w_in: Optional[Tensor], coeff: Tensor, bias: Tensor,
        mask: Optional[Tensor], pos: Optional[Tensor], cu: Optional[Tensor], seqid: Optional[Tensor], mode: int,
        block_size: int, act: int, gate: int, rope: int, log2base: float, mean: bool
        ) -> Tuple[Tensor, Tensor, Tensor]:
    """The mixing forward: (g (B, N, D) in the activations' dtype, and what the backward needs: the carries
    entering every chunk (causal, (B, nc, D) and (B, nc)) or the end table (end modes, (B, nend, D) and (B, nend)),
    fp32). From z (B, N, D + Ds), or — the fused route — from x (B, N, d) and W_in (D + Ds, d)."""
    src = z if z is not None else x
    L = _layout_of(src, coeff, bias, cu, mode, block_size, rope, x is not None)
    B, N, D, dev = L.B, L.N, L.D, src.device
    g = torch.empty(B, N, D, dtype=src.dtype, device=dev)
    sav = torch.empty(B, L.saved_rows, D, dtype=torch.float32, device=dev)
    savw = torch.empty(B, L.saved_rows, dtype=torch.float32, device=dev)
    zz, xx, ww = src, src, (w_in if w_in is not None else coeff)  # harmless pointers for the unused ones
    d = 0 if x is None else x.shape[2]
    s_zb, s_zn = (z.stride(0), z.stride(1)) if z is not None else (0, 0)
    s_xb, s_xn = (x.stride(0), x.stride(1)) if x is not None else (0, 0)
    s_w = 0 if w_in is None else w_in.stride(0)
    wt, pt, cu_t, sid = (t if t is not None else coeff for t in (mask, pos, cu, seqid))
    s_wb = 0 if mask is None else mask.stride(0)
    s_pb = _pos_strides(pos, rope == 2)
    flags = (act, rope, mask is not None, pos is not None, cu is not None)
    role = "causal_walk" if mode == 0 else "walk"
    kw = _kw(L, flags, x, src, role)
    splits = L.splits(role)
    base = (N, D, L.half, d, block_size, L.cps(role), L.nc(role), log2base, s_zb, s_zn, s_xb, s_xn, s_w,
            g.stride(0), g.stride(1), s_wb, s_pb, sav.stride(0), savw.stride(0))

    def walk(cin: Tensor, cinw: Tensor, summ: Tensor, summw: Tensor, has: Tensor, has_carry: bool,
             summary: bool) -> None:
        launch(_walk_kernel, (B * splits, L.nd(role)), zz, xx, ww, coeff, bias, wt, pt, sid, cu_t, g, sav, savw, cin,
               cinw, summ, summw, has, *base, GATE=gate, MEAN=mean, MODE=mode, HAS_CARRY=has_carry, SUMMARY=summary,
               **kw)

    if splits > 1:
        cin, cinw = _carries(B, splits, dev, False, D, lambda s, sw, h: walk(s, sw, s, sw, h, False, True))
        walk(cin, cinw, cin, cinw, savw, True, False)
    else:
        walk(sav, savw, sav, savw, savw, False, False)
    if mode != 0:
        gkw = _kw(L, flags, x, src, "gate", ("K", "ACT", "HAS_W"))
        launch(_gate_kernel, (B, L.nc("gate"), L.nd("gate")), zz, xx, ww, bias, pt, sid, cu_t, sav, savw, g, N, D,
               L.half, d, block_size, log2base, s_zb, s_zn, s_xb, s_xn, s_w, g.stride(0), g.stride(1), s_pb,
               sav.stride(0), savw.stride(0), GATE=gate, MEAN=mean, MODE=mode, **gkw)
    return g, sav, savw


def mix_backward(dg: Tensor, z: Optional[Tensor], x: Optional[Tensor], w_in: Optional[Tensor], coeff: Tensor,
                 bias: Tensor, mask: Optional[Tensor], pos: Optional[Tensor], cu: Optional[Tensor],
                 seqid: Optional[Tensor], sav: Tensor, savw: Tensor, mode: int, block_size: int, act: int, gate: int,
                 rope: int, log2base: float, mean: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """The mixing backward: (dz (B, N, D + Ds) in the activations' dtype, dL/dα (D, K) and dL/db (Ds,) in fp32)."""
    src = z if z is not None else x
    L = _layout_of(src, coeff, bias, cu, mode, block_size, rope, x is not None)
    B, N, D, K, Ds, dev = L.B, L.N, L.D, L.K, L.Ds, src.device
    dg = dg.contiguous()
    dz = torch.empty(B, N, D + Ds, dtype=src.dtype, device=dev)
    zz = z if z is not None else dz  # the fused route reads x; dz has z's strides
    xx = x if x is not None else dz
    ww = w_in if w_in is not None else coeff
    d = 0 if x is None else x.shape[2]
    s_zb, s_zn = dz.stride(0), dz.stride(1)
    s_xb, s_xn = (x.stride(0), x.stride(1)) if x is not None else (0, 0)
    s_w = 0 if w_in is None else w_in.stride(0)
    wt, pt, cu_t, sid = (t if t is not None else coeff for t in (mask, pos, cu, seqid))
    s_wb = 0 if mask is None else mask.stride(0)
    s_pb = _pos_strides(pos, rope == 2)
    flags = (act, rope, mask is not None, pos is not None, cu is not None)
    if mode == 0:
        kw = _kw(L, flags, x, zz, "causal_backward")
        splits = L.splits("causal_backward")
        dcoeff = torch.empty(B * splits, D * K, dtype=torch.float32, device=dev)
        dbias = torch.empty(B * splits, Ds, dtype=torch.float32, device=dev)
        base = (N, D, L.half, d, L.cps("causal_backward"), L.nc("causal_backward"), log2base, s_zb, s_zn, s_xb,
                s_xn, s_w, dg.stride(0), dg.stride(1), s_wb, s_pb, sav.stride(0), savw.stride(0))

        def walk(cin: Tensor, summ: Tensor, has: Tensor, has_carry: bool, summary: bool) -> None:
            launch(_causal_backward_kernel, (B * splits, L.nd("causal_backward")), zz, xx, ww, coeff, bias, wt, pt,
                   sid, cu_t, dg, dz, sav, savw, cin, summ, has, dcoeff, dbias, *base, GATE=gate, MEAN=mean,
                   HAS_CARRY=has_carry, SUMMARY=summary, KP=pow2(K), **kw)

        if splits > 1:
            cin, _ = _carries(B, splits, dev, True, D, lambda s, sw, h: walk(s, s, h, False, True))
            walk(cin, cin, dbias, True, False)
        else:
            walk(sav, sav, dbias, False, False)
    else:
        dend = torch.empty_like(sav)
        gkw = _kw(L, flags, x, zz, "group", ("K", "ACT", "HAS_W"))
        gsplits = L.splits("group")
        dbias = torch.empty(B * gsplits, Ds, dtype=torch.float32, device=dev)
        gbase = (N, D, L.half, d, block_size, L.cps("group"), L.nc("group"), log2base, s_zb, s_zn, s_xb, s_xn, s_w,
                 dg.stride(0), dg.stride(1), s_pb, sav.stride(0), savw.stride(0))

        def group(cin: Tensor, summ: Tensor, has: Tensor, has_carry: bool, summary: bool) -> None:
            launch(_group_backward_kernel, (B * gsplits, L.nd("group")), zz, xx, ww, bias, pt, sid, cu_t, dg, dz,
                   sav, savw, dend, cin, summ, has, dbias, *gbase, GATE=gate, MEAN=mean, MODE=mode, HAS_CARRY=has_carry,
                   SUMMARY=summary, **gkw)

        ekw = _kw(L, flags, x, zz, "end", ("GB", "NSP"))
        esplits = L.splits("end")
        dcoeff = torch.empty(B * esplits, D * K, dtype=torch.float32, device=dev)
        ebase = (N, D, L.half, d, block_size, L.cps("end"), L.nc("end"), log2base, s_zb, s_zn, s_xb, s_xn, s_w, s_wb,
                 s_pb, sav.stride(0))

        def reverse(cin: Tensor, summ: Tensor, has: Tensor, has_carry: bool, summary: bool) -> None:
            launch(_end_backward_kernel, (B * esplits, L.nd("end")), zz, xx, ww, coeff, wt, pt, sid, cu_t, dz, dend,
                   cin, summ, has, dcoeff, *ebase, MODE=mode, HAS_CARRY=has_carry, SUMMARY=summary, KP=pow2(K), **ekw)

        if gsplits > 1:
            cin, _ = _carries(B, gsplits, dev, False, D, lambda s, sw, h: group(s, s, h, False, True))
            group(cin, cin, dbias, True, False)
        else:
            group(sav, sav, dbias, False, False)
        if esplits > 1 and (mode != 1 or cu is not None):  # whole-row full mixing carries nothing back
            cin, _ = _carries(B, esplits, dev, True, D, lambda s, sw, h: reverse(s, s, h, False, True))
            reverse(cin, cin, dcoeff, True, False)
        else:
            reverse(sav, sav, dcoeff, False, False)
    return dz, dcoeff.sum(0).view(D, K), dbias.sum(0)


# ----------------------------------------------------------------------------------------------------------------
# custom ops and their autograd
# ----------------------------------------------------------------------------------------------------------------


def _pom_mix(z: Tensor, coeff: Tensor, bias: Tensor, mask: Optional[Tensor], pos: Optional[Tensor],
             cu: Optional[Tensor], seqid: Optional[Tensor], mode: int, block_size: int, act: int, gate: int, rope: int,
             log2base: float, mean: bool) -> Tuple[Tensor, Tensor, Tensor]:
    return mix(z, None, None, coeff, bias, mask, pos, cu, seqid, mode, block_size, act, gate, rope, log2base, mean)


def _pom_mix_fake(z: Tensor, coeff: Tensor, bias: Tensor, mask: Optional[Tensor], pos: Optional[Tensor],
                  cu: Optional[Tensor], seqid: Optional[Tensor], mode: int, block_size: int, act: int, gate: int,
                  rope: int, log2base: float, mean: bool) -> Tuple[Tensor, Tensor, Tensor]:
    B, N, D = z.shape[0], z.shape[1], coeff.shape[0]
    L = _layout_of(z, coeff, bias, cu, mode, block_size, rope, False)
    return (z.new_empty(B, N, D), z.new_empty(B, L.saved_rows, D, dtype=torch.float32),
            z.new_empty(B, L.saved_rows, dtype=torch.float32))


def _pom_mix_backward(dg: Tensor, z: Tensor, coeff: Tensor, bias: Tensor, mask: Optional[Tensor],
                      pos: Optional[Tensor], cu: Optional[Tensor], seqid: Optional[Tensor], sav: Tensor, savw: Tensor,
                      mode: int, block_size: int, act: int, gate: int, rope: int, log2base: float, mean: bool
                      ) -> Tuple[Tensor, Tensor, Tensor]:
    return mix_backward(dg, z, None, None, coeff, bias, mask, pos, cu, seqid, sav, savw, mode, block_size, act, gate,
                        rope, log2base, mean)


def _pom_mix_backward_fake(dg: Tensor, z: Tensor, coeff: Tensor, bias: Tensor, mask: Optional[Tensor],
                           pos: Optional[Tensor], cu: Optional[Tensor], seqid: Optional[Tensor], sav: Tensor,
                           savw: Tensor, mode: int, block_size: int, act: int, gate: int, rope: int, log2base: float,
                           mean: bool) -> Tuple[Tensor, Tensor, Tensor]:
    return (torch.empty_like(z, memory_format=torch.contiguous_format),
            coeff.new_empty(coeff.shape, dtype=torch.float32), bias.new_empty(bias.shape, dtype=torch.float32))


pom_mix_op = kernel_op("pom_mix", _pom_mix, _pom_mix_fake)
pom_mix_backward_op = kernel_op("pom_mix_backward", _pom_mix_backward, _pom_mix_backward_fake)


def _setup(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[Tensor, ...]) -> None:
    z, coeff, bias, mask, pos, cu, seqid = inputs[:7]
    ctx.attrs = inputs[7:]
    ctx.save_for_backward(z, coeff, bias, mask, pos, cu, seqid, output[1], output[2])
    ctx.mark_non_differentiable(output[1], output[2])


def _backward(ctx: Any, dg: Tensor, _dsav: Any, _dsavw: Any) -> Tuple[Optional[Tensor], ...]:
    z, coeff, bias, mask, pos, cu, seqid, sav, savw = ctx.saved_tensors
    dz, dcoeff, dbias = pom_mix_backward_op(dg, z, coeff, bias, mask, pos, cu, seqid, sav, savw, *ctx.attrs)
    return (dz, dcoeff.to(coeff.dtype), dbias.to(bias.dtype)) + (None,) * 11


pom_mix_op.register_autograd(_backward, setup_context=_setup)


# ----------------------------------------------------------------------------------------------------------------
# the backend: supports, the first-use check, forward
# ----------------------------------------------------------------------------------------------------------------


def _gate_head(D: int, Ds: int) -> int:
    return D // Ds


def kernel_limits(call: Any) -> Optional[str]:
    """Why the kernels cannot take this call's mode, shapes or non-linearities (None: they can). Shared by both
    Triton routes; the device and the first-use check come after."""
    x = call.x
    if x.dtype not in DTYPES:
        return f"{x.dtype} is not a kernel dtype (fp32, bf16, fp16)"
    if not call.self_mix:
        return "cross-mixing is not in the kernels"
    if call.mask is not None:
        return "an explicit (B, M, N) mask is not in the kernels (quadratic)"
    if call.context_positions is not None:
        return "context_positions belong to cross-mixing"
    if not isinstance(call.activation, str) or call.activation not in ACT_CODES:
        return f"activation {call.activation!r} is not in the kernels ({', '.join(ACT_CODES)})"
    if not isinstance(call.gate, str) or call.gate not in GATE_CODES:
        return f"gate {call.gate!r} is not in the kernels ({', '.join(GATE_CODES)})"
    k = call.coeff.shape[1]
    if not 1 <= k <= MAX_DEGREE:
        return f"degree {k} (the kernels take 1–{MAX_DEGREE})"
    D, Ds = call.D, call.Ds
    G = _gate_head(D, Ds)
    if G > 128 or G & (G - 1):
        return f"a gate head of {G} channels (the kernels take a power of two ≤ 128)"
    if call.rope:
        if D % (4 if call.rope == "2d" else 2):
            return f"{call.rope} rotary needs a width divisible by {4 if call.rope == '2d' else 2}, got {D}"
        if (D // 2) % G:
            return f"rotary with a gate head of {G} channels straddling the halves of D = {D}"
    return None


def supports(call) -> Optional[str]:  # call: polymixer.ops.pom.PomCall
    """Self-mixing, every mask but an explicit (B, M, N) one, packed sequences, rotary, degree 1–5, mean / sum, named
    non-linearities, fp32 / bf16 / fp16, on CUDA tensors (or CPU tensors under TRITON_INTERPRET=1); also while
    ``torch.compile`` traces (the kernels are custom ops)."""
    x = call.x
    if x.device.type != "cuda" and not (interpreted() and x.device.type == "cpu"):
        return f"CUDA tensors only (got {x.device.type}; CPU tensors run the kernels under TRITON_INTERPRET=1)"
    why = kernel_limits(call)
    if why is None:
        why = call_layout(call, fused=False).missing(backward=will_differentiate(call))
    if why is not None:
        return why
    if needs_check(x.device):
        return self_check(x.device, x.dtype)
    return None


def will_differentiate(call: Any) -> bool:
    """Whether this call will be differentiated (then its backward kernels must fit too, and the backward counts in
    the choice of route)."""
    if not torch.is_grad_enabled():
        return False
    return any(t is not None and t.requires_grad for t in (call.x, call.in_weight, call.coeff, call.gate_bias))


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
    from . import pom

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
                    y = pom(xx, None, params[0], params[1], params[2], params[3], **kw)
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


def _call_tensors(call: Any, N: int) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor], int, int]:
    """(key mask as uint8, positions as fp64, each token's sequence id, mode, block size) of a call."""
    dev = call.x.device
    mask = None if call.key_mask is None else call.key_mask.contiguous().view(torch.uint8)
    pos = None
    if call.rope is not None and call.positions is not None:
        check_positions(call.positions, call.B, N, call.rope == "2d", "positions")
        pos = call.positions.to(torch.float64).contiguous()
    elif call.rope == "2d":
        raise ValueError("2-D rotary needs explicit positions of shape (N, 2) holding (row, col)")
    seqid = None
    if call.cu_k is not None:  # each token's sequence: a search over the offsets, on the device
        ar = torch.arange(N, device=dev, dtype=call.cu_k.dtype)
        seqid = torch.searchsorted(call.cu_k, ar, right=True, out_int32=True) - 1
    if call.block_size is not None:
        mode, bs = MODES["block"], int(call.block_size)
    else:
        mode, bs = (MODES["causal"], 1) if call.causal else (MODES["full"], 1)
    return mask, pos, seqid, mode, bs


def call_layout(call: Any, fused: bool) -> MixLayout:
    """The layout the kernels would run ``call`` with."""
    if call.block_size is not None:
        mode, bs = MODES["block"], int(call.block_size)
    else:
        mode, bs = (MODES["causal"], 1) if call.causal else (MODES["full"], 1)
    rope = {None: 0, "1d": 1, "2d": 2}[call.rope]
    nseq = 1 if call.cu_k is None else call.cu_k.shape[0] - 1
    return mix_layout(call.B, call.N, call.D, call.Ds, call.coeff.shape[1], mode, bs, nseq, rope, call.x.device,
                      fused)


def mix_args(call: Any, N: int) -> Tuple[Any, ...]:
    """The op arguments after the activations and weights: (mask, positions, cu_seqlens, sequence ids, mode,
    block size, activation, gate, rotary, log2(base), mean)."""
    mask, pos, seqid, mode, bs = _call_tensors(call, N)
    rope = {None: 0, "1d": 1, "2d": 2}[call.rope]
    return (mask, pos, call.cu_k, seqid, mode, bs, ACT_CODES[call.activation], GATE_CODES[call.gate], rope,
            math.log2(call.rope_base), call.reduction == "mean")


def forward(call) -> Tensor:  # call: polymixer.ops.pom.PomCall
    """The whole PoM of ``call``: the input projection (torch), the mixing (the kernels, one custom op), W_o (torch)."""
    z = F.linear(call.x, call.in_weight).contiguous()
    g, _, _ = pom_mix_op(z, call.coeff, call.gate_bias, *mix_args(call, call.N))
    return F.linear(g, call.out_weight, call.out_bias)


# ----------------------------------------------------------------------------------------------------------------
# the fused route's ops (the ``triton_gemm`` backend): x and W_in in, z never in memory
# ----------------------------------------------------------------------------------------------------------------


def _pom_gemm(x: Tensor, w_in: Tensor, coeff: Tensor, bias: Tensor, mask: Optional[Tensor], pos: Optional[Tensor],
              cu: Optional[Tensor], seqid: Optional[Tensor], mode: int, block_size: int, act: int, gate: int,
              rope: int, log2base: float, mean: bool) -> Tuple[Tensor, Tensor, Tensor]:
    return mix(None, x, w_in, coeff, bias, mask, pos, cu, seqid, mode, block_size, act, gate, rope, log2base, mean)


def _pom_gemm_fake(x: Tensor, w_in: Tensor, coeff: Tensor, bias: Tensor, mask: Optional[Tensor],
                   pos: Optional[Tensor], cu: Optional[Tensor], seqid: Optional[Tensor], mode: int, block_size: int,
                   act: int, gate: int, rope: int, log2base: float, mean: bool) -> Tuple[Tensor, Tensor, Tensor]:
    B, N, D = x.shape[0], x.shape[1], coeff.shape[0]
    L = _layout_of(x, coeff, bias, cu, mode, block_size, rope, True)
    return (x.new_empty(B, N, D), x.new_empty(B, L.saved_rows, D, dtype=torch.float32),
            x.new_empty(B, L.saved_rows, dtype=torch.float32))


def _pom_gemm_backward(dg: Tensor, x: Tensor, w_in: Tensor, coeff: Tensor, bias: Tensor, mask: Optional[Tensor],
                       pos: Optional[Tensor], cu: Optional[Tensor], seqid: Optional[Tensor], sav: Tensor,
                       savw: Tensor, mode: int, block_size: int, act: int, gate: int, rope: int, log2base: float,
                       mean: bool) -> Tuple[Tensor, Tensor, Tensor]:
    return mix_backward(dg, None, x, w_in, coeff, bias, mask, pos, cu, seqid, sav, savw, mode, block_size, act, gate,
                        rope, log2base, mean)


def _pom_gemm_backward_fake(dg: Tensor, x: Tensor, w_in: Tensor, coeff: Tensor, bias: Tensor,
                            mask: Optional[Tensor], pos: Optional[Tensor], cu: Optional[Tensor],
                            seqid: Optional[Tensor], sav: Tensor, savw: Tensor, mode: int, block_size: int, act: int,
                            gate: int, rope: int, log2base: float, mean: bool) -> Tuple[Tensor, Tensor, Tensor]:
    return (x.new_empty(x.shape[0], x.shape[1], w_in.shape[0]), coeff.new_empty(coeff.shape, dtype=torch.float32),
            bias.new_empty(bias.shape, dtype=torch.float32))


pom_gemm_op = kernel_op("pom_gemm", _pom_gemm, _pom_gemm_fake)
pom_gemm_backward_op = kernel_op("pom_gemm_backward", _pom_gemm_backward, _pom_gemm_backward_fake)


def _gemm_setup(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[Tensor, ...]) -> None:
    x, w_in, coeff, bias, mask, pos, cu, seqid = inputs[:8]
    ctx.attrs = inputs[8:]
    ctx.save_for_backward(x, w_in, coeff, bias, mask, pos, cu, seqid, output[1], output[2])
    ctx.mark_non_differentiable(output[1], output[2])


def _gemm_backward(ctx: Any, dg: Tensor, _dsav: Any, _dsavw: Any) -> Tuple[Optional[Tensor], ...]:
    x, w_in, coeff, bias, mask, pos, cu, seqid, sav, savw = ctx.saved_tensors
    dz, dcoeff, dbias = pom_gemm_backward_op(dg, x, w_in, coeff, bias, mask, pos, cu, seqid, sav, savw, *ctx.attrs)
    dx = dz @ w_in  # (B, N, d): the input projection's backward, on cuBLAS
    dw = dz.flatten(0, 1).t() @ x.flatten(0, 1)
    return (dx, dw, dcoeff.to(coeff.dtype), dbias.to(bias.dtype)) + (None,) * 11


pom_gemm_op.register_autograd(_gemm_backward, setup_context=_gemm_setup)
