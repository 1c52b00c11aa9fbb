"""The ``triton`` backend of PoM: the mixing between the two matrix products, fused in Triton kernels.

The projections ``z = [W_h x; W_s x]`` and ``y = W_o g`` are cuBLAS matrix products (torch); everything between —
activation, Horner's polynomial, rotary rotation, key weights, aggregation over the visible tokens, the gate — runs in
kernels that read ``z`` and write ``g = gate(z_s + b) ⊙ H`` once, in tiles of ``BLOCK_N`` tokens × ``BLOCK_D``
channels, accumulating in fp32 (fp32, bf16 and fp16 inputs).

Aggregation is a segmented prefix sum over the tokens, computed chunk-wise: each chunk's sum (of the tokens after
its last sequence start) is one kernel, the carries between chunks a float64 prefix sum over chunks in torch, and a
second kernel scans each chunk again with its carry. Every mode is a choice of what a query reads from those sums:

* causal (plain or packed): its own running sum — read in the scan kernel, which gates and writes ``g`` directly;
* full, block-causal, packed full: the running sum at its "end" token (its sequence's last token, its block's last
  token) — the scan kernel writes the sums at end tokens, a third kernel gates every query from them.

Key padding weights the tokens (mean divides by the visible weight; 0 visible → 0). The backward recomputes the
features from ``z`` (nothing of size (B, N, D) is saved): causal modes in two fused kernels (a reverse segmented
scan of the gradient), the end-token modes through one (B, N, D) fp32 buffer of per-query gradients. Reductions
over tokens (the coefficients' and the gate bias's gradients) go through per-program partial sums added in torch:
every result is deterministic (no atomics).

Not here (the dispatcher falls back to the torch form, or raises under an explicit ``backend("triton")``): cross-
mixing, an explicit (B, M, N) mask, float64, callable non-linearities, a gate head wider than 128 channels or not a
power of two, ``torch.compile`` tracing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError as e:  # pragma: no cover - depends on the environment (the [gpu] extra)
    raise ImportError("the triton backend needs Triton: pip install 'polymixer[gpu]'") from e

from ..common import check_positions, default_positions, is_compiling, rope_angles, segments

__all__ = ["supports", "forward", "self_check", "KERNELS", "LaunchConfig", "launch_configs", "all_launch_configs",
           "TILES", "default_launch_config", "use_config", "interpreted", "ACT_CODES", "GATE_CODES"]

ACT_CODES = {"leaky_clamp": 0, "relu": 1, "identity": 2, "silu": 3, "gelu": 4, "tanh": 5}
GATE_CODES = {"hardsigmoid": 0, "sigmoid": 1, "identity": 2}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_DEGREE = 5


def interpreted() -> bool:
    """Whether Triton runs its interpreter on CPU tensors (``TRITON_INTERPRET=1``: tests without a GPU)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# ----------------------------------------------------------------------------------------------------------------
# elementwise pieces (inlined into every kernel)
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _sigmoid(u):
    return 1.0 / (1.0 + tl.exp(-u))


@triton.jit
def _act(z, ACT: tl.constexpr):
    if ACT == 0:  # leaky ReLU (0.01) clamped to [-0.1, 6]
        y = tl.minimum(tl.maximum(tl.where(z > 0, z, 0.01 * z), -0.1), 6.0)
    elif ACT == 1:
        y = tl.maximum(z, 0.0)
    elif ACT == 2:
        y = z
    elif ACT == 3:
        y = z * _sigmoid(z)
    elif ACT == 4:
        y = 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476))
    else:
        y = 2.0 * _sigmoid(2.0 * z) - 1.0
    return y


@triton.jit
def _act_grad(z, ACT: tl.constexpr):
    if ACT == 0:  # 0 at the kinks x = −10 and x = 6, like the torch form's fused backward
        g = tl.where(z > 0, 1.0, 0.01) * tl.where((z > -10.0) & (z < 6.0), 1.0, 0.0)
    elif ACT == 1:
        g = tl.where(z > 0, 1.0, 0.0)
    elif ACT == 2:
        g = z * 0.0 + 1.0
    elif ACT == 3:
        s = _sigmoid(z)
        g = s * (1.0 + z * (1.0 - s))
    elif ACT == 4:
        g = 0.5 * (1.0 + tl.erf(z * 0.7071067811865476)) + z * tl.exp(-0.5 * z * z) * 0.3989422804014327
    else:
        t = 2.0 * _sigmoid(2.0 * z) - 1.0
        g = 1.0 - t * t
    return g


@triton.jit
def _gate(u, GATE: tl.constexpr):
    if GATE == 0:
        s = tl.minimum(tl.maximum(u / 6.0 + 0.5, 0.0), 1.0)
    elif GATE == 1:
        s = _sigmoid(u)
    else:
        s = u
    return s


@triton.jit
def _gate_grad(u, GATE: tl.constexpr):
    if GATE == 0:
        g = tl.where((u > -3.0) & (u < 3.0), 1.0 / 6.0, 0.0)
    elif GATE == 1:
        s = _sigmoid(u)
        g = s * (1.0 - s)
    else:
        g = u * 0.0 + 1.0
    return g


@triton.jit
def _horner(h, coeff_ptr, ch, cmask, K: tl.constexpr):
    """Σ_{q=1..K} α_q ⊙ h^q, α of channel ``ch`` (the (D, K) coefficient table, row-major)."""
    acc = tl.load(coeff_ptr + ch * K + (K - 1), mask=cmask, other=0.0).to(tl.float32)[None, :] + h * 0.0
    for t in tl.static_range(1, K):
        a = tl.load(coeff_ptr + ch * K + (K - 1 - t), mask=cmask, other=0.0).to(tl.float32)
        acc = acc * h + a[None, :]
    return acc * h


@triton.jit
def _horner_grad(h, coeff_ptr, ch, cmask, K: tl.constexpr):
    """d/dh Σ_q α_q h^q = Σ_q q·α_q h^(q−1)."""
    acc = K * tl.load(coeff_ptr + ch * K + (K - 1), mask=cmask, other=0.0).to(tl.float32)[None, :] + h * 0.0
    for t in tl.static_range(1, K):
        a = tl.load(coeff_ptr + ch * K + (K - 1 - t), mask=cmask, other=0.0).to(tl.float32)
        acc = acc * h + (K - t) * a[None, :]
    return acc


@triton.jit
def _seg_add(a, fa, b, fb):
    """The combine of a segmented inclusive sum: b restarts the sum where it starts a segment."""
    return tl.where(fb != 0, b, a + b), fa | fb


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def _features(z_ptr, coeff_ptr, cos_ptr, sin_ptr, w_ptr, b, n, nmask, ch, cmask, stride_zb, stride_zn, half,
              stride_cb, stride_cn, stride_wb, K: tl.constexpr, ACT: tl.constexpr, ROPE: tl.constexpr,
              HAS_W: tl.constexpr):
    """The rotated, weighted features of a tile: (lo, hi) halves (hi unused without rotary), fp32."""
    m2 = nmask[:, None] & cmask[None, :]
    zlo = tl.load(z_ptr + b * stride_zb + n[:, None] * stride_zn + ch[None, :], mask=m2, other=0.0).to(tl.float32)
    plo = _horner(_act(zlo, ACT), coeff_ptr, ch, cmask, K)
    phi = plo
    if ROPE:
        zhi = tl.load(z_ptr + b * stride_zb + n[:, None] * stride_zn + (ch + half)[None, :], mask=m2,
                      other=0.0).to(tl.float32)
        phi = _horner(_act(zhi, ACT), coeff_ptr, ch + half, cmask, K)
        c = tl.load(cos_ptr + b * stride_cb + n[:, None] * stride_cn + ch[None, :], mask=m2, other=1.0)
        s = tl.load(sin_ptr + b * stride_cb + n[:, None] * stride_cn + ch[None, :], mask=m2, other=0.0)
        rlo = plo * c - phi * s
        phi = phi * c + plo * s
        plo = rlo
    if HAS_W:
        w = tl.load(w_ptr + b * stride_wb + n, mask=nmask, other=0.0).to(tl.float32)
        plo = plo * w[:, None]
        phi = phi * w[:, None]
    plo = tl.where(m2, plo, 0.0)
    phi = tl.where(m2, phi, 0.0)
    return plo, phi


@triton.jit
def _given(f_ptr, b, n, nmask, ch, cmask, stride_fb, stride_fn, half, ROPE: tl.constexpr):
    """A tile of given fp32 features (the (lo, hi) halves)."""
    m2 = nmask[:, None] & cmask[None, :]
    plo = tl.load(f_ptr + b * stride_fb + n[:, None] * stride_fn + ch[None, :], mask=m2, other=0.0)
    phi = plo
    if ROPE:
        phi = tl.load(f_ptr + b * stride_fb + n[:, None] * stride_fn + (ch + half)[None, :], mask=m2, other=0.0)
    return plo, phi


# ----------------------------------------------------------------------------------------------------------------
# forward kernels
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _tail_kernel(z_ptr, coeff_ptr, cos_ptr, sin_ptr, w_ptr, start_ptr, tail_ptr, tailw_ptr,
                 N, half, stride_zb, stride_zn, stride_cb, stride_cn, stride_wb, stride_sb,
                 stride_tb, stride_tc, stride_twb,
                 K: tl.constexpr, ACT: tl.constexpr, ROPE: tl.constexpr, HAS_W: tl.constexpr,
                 GIVEN: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Per chunk: the sum of the (rotated, weighted) features of its tokens from its last sequence start on (all of
    them without a start), and their weight."""
    b = tl.program_id(0)
    c = tl.program_id(1)
    dblk = tl.program_id(2)
    n = c * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    ch = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = ch < half
    if GIVEN:
        plo, phi = _given(z_ptr, b, n, nmask, ch, cmask, stride_zb, stride_zn, half, ROPE)
    else:
        plo, phi = _features(z_ptr, coeff_ptr, cos_ptr, sin_ptr, w_ptr, b, n, nmask, ch, cmask, stride_zb,
                             stride_zn, half, stride_cb, stride_cn, stride_wb, K, ACT, ROPE, HAS_W)
    st = tl.load(start_ptr + b * stride_sb + n, mask=nmask, other=0).to(tl.int32)
    last = tl.max(tl.where(st != 0, tl.arange(0, BLOCK_N), -1), axis=0)
    tail = (tl.arange(0, BLOCK_N) >= last)[:, None]
    tl.store(tail_ptr + b * stride_tb + c * stride_tc + ch, tl.sum(tl.where(tail, plo, 0.0), axis=0), mask=cmask)
    if ROPE:
        tl.store(tail_ptr + b * stride_tb + c * stride_tc + half + ch, tl.sum(tl.where(tail, phi, 0.0), axis=0),
                 mask=cmask)
    if dblk == 0:
        if HAS_W:
            w = tl.load(w_ptr + b * stride_wb + n, mask=nmask, other=0.0).to(tl.float32)
        else:
            w = tl.where(nmask, 1.0, 0.0)
        tl.store(tailw_ptr + b * stride_twb + c, tl.sum(tl.where(tl.arange(0, BLOCK_N) >= last, w, 0.0), axis=0))


@triton.jit
def _running(plo, phi, w, st, carry_ptr, carryw_ptr, b, c, ch, cmask, half, stride_cyb, stride_cyc, stride_cwb,
             ROPE: tl.constexpr):
    """Segmented inclusive running sums of a chunk's features and weights, the carry from earlier chunks added to
    the tokens before the chunk's first sequence start."""
    st2 = st[:, None] + tl.zeros_like(plo).to(tl.int32)
    slo, _ = tl.associative_scan((plo, st2), 0, _seg_add)
    shi = slo
    if ROPE:
        shi, _ = tl.associative_scan((phi, st2), 0, _seg_add)
    sw, _ = tl.associative_scan((w, st), 0, _seg_add)
    opened = tl.associative_scan(st, 0, _or) == 0  # no start in [chunk start, token]: the carried sequence
    clo = tl.load(carry_ptr + b * stride_cyb + c * stride_cyc + ch, mask=cmask, other=0.0)
    slo = slo + tl.where(opened[:, None], clo[None, :], 0.0)
    if ROPE:
        chi = tl.load(carry_ptr + b * stride_cyb + c * stride_cyc + half + ch, mask=cmask, other=0.0)
        shi = shi + tl.where(opened[:, None], chi[None, :], 0.0)
    cw = tl.load(carryw_ptr + b * stride_cwb + c)
    sw = sw + tl.where(opened, cw, 0.0)
    return slo, shi, sw


@triton.jit
def _gated_store(hlo, hhi, z_ptr, bias_ptr, g_ptr, cos_ptr, sin_ptr, b, n, m2, ch, cmask, half, D, G, stride_zb,
                 stride_zn, stride_gb, stride_gn, stride_cb, stride_cn, GATE: tl.constexpr, ROPE: tl.constexpr):
    """``g = gate(z_s + b) ⊙ H`` at tokens ``n``: H (both halves of each channel pair with rotary) read in the query's
    own frame R(−pos), the gate of each channel's head from ``z``'s gate columns."""
    if ROPE:
        cs = tl.load(cos_ptr + b * stride_cb + n[:, None] * stride_cn + ch[None, :], mask=m2, other=1.0)
        sn = tl.load(sin_ptr + b * stride_cb + n[:, None] * stride_cn + ch[None, :], mask=m2, other=0.0)
        rlo = hlo * cs + hhi * sn
        hhi = hhi * cs - hlo * sn
        hlo = rlo
    ulo = tl.load(z_ptr + b * stride_zb + n[:, None] * stride_zn + D + (ch // G)[None, :], mask=m2,
                  other=0.0).to(tl.float32)
    ulo = ulo + tl.load(bias_ptr + ch // G, mask=cmask, other=0.0).to(tl.float32)[None, :]
    tl.store(g_ptr + b * stride_gb + n[:, None] * stride_gn + ch[None, :],
             (_gate(ulo, GATE) * hlo).to(g_ptr.dtype.element_ty), mask=m2)
    if ROPE:
        uhi = tl.load(z_ptr + b * stride_zb + n[:, None] * stride_zn + D + ((ch + half) // G)[None, :], mask=m2,
                      other=0.0).to(tl.float32)
        uhi = uhi + tl.load(bias_ptr + (ch + half) // G, mask=cmask, other=0.0).to(tl.float32)[None, :]
        tl.store(g_ptr + b * stride_gb + n[:, None] * stride_gn + (ch + half)[None, :],
                 (_gate(uhi, GATE) * hhi).to(g_ptr.dtype.element_ty), mask=m2)


@triton.jit
def _scan_kernel(z_ptr, coeff_ptr, cos_ptr, sin_ptr, w_ptr, start_ptr, carry_ptr, carryw_ptr, bias_ptr, g_ptr,
                 end_ptr, endw_ptr, isend_ptr, endid_ptr,
                 N, D, half, G, stride_zb, stride_zn, stride_cb, stride_cn, stride_wb, stride_sb,
                 stride_cyb, stride_cyc, stride_cwb, stride_gb, stride_gn, stride_eb, stride_ee, stride_ewb,
                 K: tl.constexpr, ACT: tl.constexpr, GATE: tl.constexpr, ROPE: tl.constexpr, HAS_W: tl.constexpr,
                 MEAN: tl.constexpr, DIRECT: tl.constexpr, GIVEN: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr):
    """Scan each chunk with its carry. DIRECT (causal): every token reads its own running sum, gated into g. Else:
    the running sums at end tokens go to the end table (and their weights)."""
    b = tl.program_id(0)
    c = tl.program_id(1)
    dblk = tl.program_id(2)
    n = c * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    ch = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = ch < half
    m2 = nmask[:, None] & cmask[None, :]
    if GIVEN:
        plo, phi = _given(z_ptr, b, n, nmask, ch, cmask, stride_zb, stride_zn, half, ROPE)
    else:
        plo, phi = _features(z_ptr, coeff_ptr, cos_ptr, sin_ptr, w_ptr, b, n, nmask, ch, cmask, stride_zb,
                             stride_zn, half, stride_cb, stride_cn, stride_wb, K, ACT, ROPE, HAS_W)
    st = tl.load(start_ptr + b * stride_sb + n, mask=nmask, other=0).to(tl.int32)
    if HAS_W:
        w = tl.load(w_ptr + b * stride_wb + n, mask=nmask, other=0.0).to(tl.float32)
    else:
        w = tl.where(nmask, 1.0, 0.0)
    slo, shi, sw = _running(plo, phi, w, st, carry_ptr, carryw_ptr, b, c, ch, cmask, half, stride_cyb, stride_cyc,
                            stride_cwb, ROPE)
    if DIRECT:
        if MEAN:
            inv = tl.where(sw > 0, 1.0 / tl.maximum(sw, 1.0e-30), 0.0)
            slo = slo * inv[:, None]
            shi = shi * inv[:, None]
        _gated_store(slo, shi, z_ptr, bias_ptr, g_ptr, cos_ptr, sin_ptr, b, n, m2, ch, cmask, half, D, G, stride_zb,
                     stride_zn, stride_gb, stride_gn, stride_cb, stride_cn, GATE, ROPE)
    else:
        isend = tl.load(isend_ptr + b * stride_sb + n, mask=nmask, other=0) != 0
        eid = tl.load(endid_ptr + b * stride_sb + n, mask=nmask, other=0)
        em = isend[:, None] & m2
        tl.store(end_ptr + b * stride_eb + eid[:, None] * stride_ee + ch[None, :], slo, mask=em)
        if ROPE:
            tl.store(end_ptr + b * stride_eb + eid[:, None] * stride_ee + (ch + half)[None, :], shi, mask=em)
        if dblk == 0:
            tl.store(endw_ptr + b * stride_ewb + eid, sw, mask=isend & nmask)


@triton.jit
def _gate_kernel(z_ptr, cos_ptr, sin_ptr, bias_ptr, end_ptr, endw_ptr, endid_ptr, g_ptr,
                 N, D, half, G, stride_zb, stride_zn, stride_cb, stride_cn, stride_sb, stride_eb, stride_ee,
                 stride_ewb, stride_gb, stride_gn,
                 GATE: tl.constexpr, ROPE: tl.constexpr, MEAN: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr):
    """g = gate(z_s + b) ⊙ R(−pos) H, H the running sum at each query's end token (÷ its weight)."""
    b = tl.program_id(0)
    nb = tl.program_id(1)
    dblk = tl.program_id(2)
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    ch = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = ch < half
    m2 = nmask[:, None] & cmask[None, :]
    eid = tl.load(endid_ptr + b * stride_sb + n, mask=nmask, other=0)
    hlo = tl.load(end_ptr + b * stride_eb + eid[:, None] * stride_ee + ch[None, :], mask=m2, other=0.0)
    hhi = hlo
    if ROPE:
        hhi = tl.load(end_ptr + b * stride_eb + eid[:, None] * stride_ee + (ch + half)[None, :], mask=m2, other=0.0)
    if MEAN:
        sw = tl.load(endw_ptr + b * stride_ewb + eid, mask=nmask, other=0.0)
        inv = tl.where(sw > 0, 1.0 / tl.maximum(sw, 1.0e-30), 0.0)
        hlo = hlo * inv[:, None]
        hhi = hhi * inv[:, None]
    _gated_store(hlo, hhi, z_ptr, bias_ptr, g_ptr, cos_ptr, sin_ptr, b, n, m2, ch, cmask, half, D, G, stride_zb,
                 stride_zn, stride_gb, stride_gn, stride_cb, stride_cn, GATE, ROPE)


# ----------------------------------------------------------------------------------------------------------------
# backward kernels
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _gate_backward(z_ptr, dz_ptr, bias_ptr, dg_ptr, dbias_ptr, hq, b, n, nmask, ch, cmask, part, D, G,
                   stride_zb, stride_zn, stride_gb, stride_gn, stride_dbp, GATE: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, GBLOCK: tl.constexpr):
    """The gate's gradients for the channels ``ch`` of a tile: dL/dz_s of its gate slots (each gate's G = GBLOCK
    channels lie in the tile: G divides BLOCK_D) and their partial dL/db (stored); returns s ⊙ dg, the gradient
    flowing into the gated H (``hq`` is H in the query's frame)."""
    m2 = nmask[:, None] & cmask[None, :]
    u = tl.load(z_ptr + b * stride_zb + n[:, None] * stride_zn + D + (ch // G)[None, :], mask=m2,
                other=0.0).to(tl.float32)
    u = u + tl.load(bias_ptr + ch // G, mask=cmask, other=0.0).to(tl.float32)[None, :]
    dg = tl.load(dg_ptr + b * stride_gb + n[:, None] * stride_gn + ch[None, :], mask=m2, other=0.0).to(tl.float32)
    NS: tl.constexpr = BLOCK_D // GBLOCK
    ds = tl.sum(tl.reshape(tl.where(m2, dg * hq, 0.0), (BLOCK_N, NS, GBLOCK)), axis=2)  # (BLOCK_N, NS)
    slot = tl.min(ch, axis=0) // G + tl.arange(0, NS)
    smask = (slot * G < D) & (slot * G <= tl.max(tl.where(cmask, ch, -1), axis=0))
    sm2 = nmask[:, None] & smask[None, :]
    us = tl.load(z_ptr + b * stride_zb + n[:, None] * stride_zn + D + slot[None, :], mask=sm2, other=0.0).to(tl.float32)
    us = us + tl.load(bias_ptr + slot, mask=smask, other=0.0).to(tl.float32)[None, :]
    du = tl.where(nmask[:, None] & smask[None, :], ds * _gate_grad(us, GATE), 0.0)
    tl.store(dz_ptr + b * stride_zb + n[:, None] * stride_zn + D + slot[None, :], du.to(dz_ptr.dtype.element_ty),
             mask=nmask[:, None] & smask[None, :])
    tl.store(dbias_ptr + part * stride_dbp + slot, tl.sum(du, axis=0), mask=smask)
    return tl.where(m2, _gate(u, GATE) * dg, 0.0)


@triton.jit
def _grad_h_tile(z_ptr, dz_ptr, bias_ptr, dg_ptr, dbias_ptr, cos_ptr, sin_ptr, hlo, hhi, b, n, nmask, ch, cmask,
                 part, D, half, G, stride_zb, stride_zn, stride_gb, stride_gn, stride_cb, stride_cn, stride_dbp,
                 GATE: tl.constexpr, ROPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 GBLOCK: tl.constexpr):
    """From the queries' H in the rotated frame (hlo, hhi; already ÷ weight): the gate's gradients (stored), and the
    gradient of H in the rotated frame, R(pos)(s ⊙ dg), not yet ÷ weight."""
    m2 = nmask[:, None] & cmask[None, :]
    if ROPE:
        cs = tl.load(cos_ptr + b * stride_cb + n[:, None] * stride_cn + ch[None, :], mask=m2, other=1.0)
        sn = tl.load(sin_ptr + b * stride_cb + n[:, None] * stride_cn + ch[None, :], mask=m2, other=0.0)
        qlo = hlo * cs + hhi * sn
        qhi = hhi * cs - hlo * sn
    else:
        qlo = hlo
        qhi = hhi
    glo = _gate_backward(z_ptr, dz_ptr, bias_ptr, dg_ptr, dbias_ptr, qlo, b, n, nmask, ch, cmask, part, D, G,
                         stride_zb, stride_zn, stride_gb, stride_gn, stride_dbp, GATE, BLOCK_N, BLOCK_D, GBLOCK)
    ghi = glo
    if ROPE:
        ghi = _gate_backward(z_ptr, dz_ptr, bias_ptr, dg_ptr, dbias_ptr, qhi, b, n, nmask, ch + half, cmask, part, D,
                             G, stride_zb, stride_zn, stride_gb, stride_gn, stride_dbp, GATE, BLOCK_N, BLOCK_D,
                             GBLOCK)
        rlo = glo * cs - ghi * sn  # R(pos) applied to the gradient of R(−pos) H
        ghi = ghi * cs + glo * sn
        glo = rlo
    return glo, ghi


@triton.jit
def _poly_backward(z_ptr, dz_ptr, coeff_ptr, cos_ptr, sin_ptr, w_ptr, dcoeff_ptr, dplo, dphi, b, n, nmask, ch,
                   cmask, part, half, stride_zb, stride_zn, stride_cb, stride_cn, stride_wb, stride_dcp,
                   K: tl.constexpr, ACT: tl.constexpr, ROPE: tl.constexpr, HAS_W: tl.constexpr):
    """From dL/d(rotated, weighted features): dL/dz_h (stored) and the partial dL/dα of the tile."""
    m2 = nmask[:, None] & cmask[None, :]
    if ROPE:  # the features were R(pos) p: their gradient is R(−pos) of it
        cs = tl.load(cos_ptr + b * stride_cb + n[:, None] * stride_cn + ch[None, :], mask=m2, other=1.0)
        sn = tl.load(sin_ptr + b * stride_cb + n[:, None] * stride_cn + ch[None, :], mask=m2, other=0.0)
        rlo = dplo * cs + dphi * sn
        dphi = dphi * cs - dplo * sn
        dplo = rlo
    if HAS_W:
        w = tl.load(w_ptr + b * stride_wb + n, mask=nmask, other=0.0).to(tl.float32)
        dplo = dplo * w[:, None]
        dphi = dphi * w[:, None]
    _poly_backward_half(z_ptr, dz_ptr, coeff_ptr, dcoeff_ptr, dplo, b, n, m2, ch, cmask, part, stride_zb, stride_zn,
                        stride_dcp, K, ACT)
    if ROPE:
        _poly_backward_half(z_ptr, dz_ptr, coeff_ptr, dcoeff_ptr, dphi, b, n, m2, ch + half, cmask, part, stride_zb,
                            stride_zn, stride_dcp, K, ACT)


@triton.jit
def _poly_backward_half(z_ptr, dz_ptr, coeff_ptr, dcoeff_ptr, dp, b, n, m2, ch, cmask, part, stride_zb, stride_zn,
                        stride_dcp, K: tl.constexpr, ACT: tl.constexpr):
    z = tl.load(z_ptr + b * stride_zb + n[:, None] * stride_zn + ch[None, :], mask=m2, other=0.0).to(tl.float32)
    h = _act(z, ACT)
    dz = dp * _horner_grad(h, coeff_ptr, ch, cmask, K) * _act_grad(z, ACT)
    tl.store(dz_ptr + b * stride_zb + n[:, None] * stride_zn + ch[None, :], dz.to(dz_ptr.dtype.element_ty), mask=m2)
    hp = h
    for q in tl.static_range(K):
        tl.store(dcoeff_ptr + part * stride_dcp + ch * K + q, tl.sum(tl.where(m2, dp * hp, 0.0), axis=0), mask=cmask)
        hp = hp * h


@triton.jit
def _causal_head_kernel(z_ptr, cos_ptr, sin_ptr, w_ptr, start_ptr, carryw_ptr, bias_ptr, dg_ptr, head_ptr,
                        N, D, half, G, stride_zb, stride_zn, stride_cb, stride_cn, stride_wb, stride_sb, stride_cwb,
                        stride_gb, stride_gn, stride_hb, stride_hc,
                        GATE: tl.constexpr, ROPE: tl.constexpr, HAS_W: tl.constexpr, MEAN: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Per chunk: Σ of R(pos)(s ⊙ dg) / weight over its tokens before its first sequence start (all of them without
    one): the gradient that flows back into the sequence the previous chunk ends with."""
    b = tl.program_id(0)
    c = tl.program_id(1)
    dblk = tl.program_id(2)
    n = c * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    ch = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = ch < half
    m2 = nmask[:, None] & cmask[None, :]
    st = tl.load(start_ptr + b * stride_sb + n, mask=nmask, other=0).to(tl.int32)
    if HAS_W:
        w = tl.load(w_ptr + b * stride_wb + n, mask=nmask, other=0.0).to(tl.float32)
    else:
        w = tl.where(nmask, 1.0, 0.0)
    sw, _ = tl.associative_scan((w, st), 0, _seg_add)
    opened = tl.associative_scan(st, 0, _or) == 0  # no start in [chunk start, token]
    sw = sw + tl.where(opened, tl.load(carryw_ptr + b * stride_cwb + c), 0.0)
    if MEAN:
        inv = tl.where(sw > 0, 1.0 / tl.maximum(sw, 1.0e-30), 0.0)
    else:
        inv = tl.where(nmask, 1.0, 0.0)
    glo = _sg(z_ptr, bias_ptr, dg_ptr, b, n, m2, ch, cmask, D, G, stride_zb, stride_zn, stride_gb, stride_gn, GATE)
    ghi = glo
    if ROPE:
        ghi = _sg(z_ptr, bias_ptr, dg_ptr, b, n, m2, ch + half, cmask, D, G, stride_zb, stride_zn, stride_gb,
                  stride_gn, GATE)
        cs = tl.load(cos_ptr + b * stride_cb + n[:, None] * stride_cn + ch[None, :], mask=m2, other=1.0)
        sn = tl.load(sin_ptr + b * stride_cb + n[:, None] * stride_cn + ch[None, :], mask=m2, other=0.0)
        rlo = glo * cs - ghi * sn
        ghi = ghi * cs + glo * sn
        glo = rlo
    sel = opened[:, None] & m2
    tl.store(head_ptr + b * stride_hb + c * stride_hc + ch, tl.sum(tl.where(sel, glo * inv[:, None], 0.0), axis=0),
             mask=cmask)
    if ROPE:
        tl.store(head_ptr + b * stride_hb + c * stride_hc + half + ch,
                 tl.sum(tl.where(sel, ghi * inv[:, None], 0.0), axis=0), mask=cmask)


@triton.jit
def _sg(z_ptr, bias_ptr, dg_ptr, b, n, m2, ch, cmask, D, G, stride_zb, stride_zn, stride_gb, stride_gn,
        GATE: tl.constexpr):
    """gate(z_s + b) ⊙ dg for channels ``ch`` of a tile."""
    u = tl.load(z_ptr + b * stride_zb + n[:, None] * stride_zn + D + (ch // G)[None, :], mask=m2,
                other=0.0).to(tl.float32)
    u = u + tl.load(bias_ptr + ch // G, mask=cmask, other=0.0).to(tl.float32)[None, :]
    dg = tl.load(dg_ptr + b * stride_gb + n[:, None] * stride_gn + ch[None, :], mask=m2, other=0.0).to(tl.float32)
    return tl.where(m2, _gate(u, GATE) * dg, 0.0)


@triton.jit
def _causal_backward_kernel(z_ptr, dz_ptr, coeff_ptr, cos_ptr, sin_ptr, w_ptr, start_ptr, carry_ptr, carryw_ptr,
                            rcarry_ptr, bias_ptr, dg_ptr, dcoeff_ptr, dbias_ptr,
                            N, D, half, G, NC, ND, stride_zb, stride_zn, stride_cb, stride_cn, stride_wb, stride_sb,
                            stride_cyb, stride_cyc, stride_cwb, stride_gb, stride_gn, stride_dcp, stride_dbp,
                            K: tl.constexpr, ACT: tl.constexpr, GATE: tl.constexpr, ROPE: tl.constexpr,
                            HAS_W: tl.constexpr, MEAN: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                            GBLOCK: tl.constexpr):
    """The causal backward of a chunk: recompute the features and running sums, the gate's gradients, then a reverse
    segmented scan of the gradient of H (plus what flows back from later chunks) gives that of every feature."""
    b = tl.program_id(0)
    c = tl.program_id(1)
    dblk = tl.program_id(2)
    part = (b * NC + c) * ND + dblk
    n = c * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    ch = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = ch < half
    plo, phi = _features(z_ptr, coeff_ptr, cos_ptr, sin_ptr, w_ptr, b, n, nmask, ch, cmask, stride_zb, stride_zn,
                         half, stride_cb, stride_cn, stride_wb, K, ACT, ROPE, HAS_W)
    st = tl.load(start_ptr + b * stride_sb + n, mask=nmask, other=0).to(tl.int32)
    if HAS_W:
        w = tl.load(w_ptr + b * stride_wb + n, mask=nmask, other=0.0).to(tl.float32)
    else:
        w = tl.where(nmask, 1.0, 0.0)
    slo, shi, sw = _running(plo, phi, w, st, carry_ptr, carryw_ptr, b, c, ch, cmask, half, stride_cyb, stride_cyc,
                            stride_cwb, ROPE)
    if MEAN:
        inv = tl.where(sw > 0, 1.0 / tl.maximum(sw, 1.0e-30), 0.0)
    else:
        inv = tl.where(nmask, 1.0, 0.0)
    glo, ghi = _grad_h_tile(z_ptr, dz_ptr, bias_ptr, dg_ptr, dbias_ptr, cos_ptr, sin_ptr, slo * inv[:, None],
                            shi * inv[:, None], b, n, nmask, ch, cmask, part, D, half, G, stride_zb, stride_zn,
                            stride_gb, stride_gn, stride_cb, stride_cn, stride_dbp, GATE, ROPE, BLOCK_N, BLOCK_D,
                            GBLOCK)
    glo = tl.where(nmask[:, None] & cmask[None, :], glo * inv[:, None], 0.0)
    ghi = tl.where(nmask[:, None] & cmask[None, :], ghi * inv[:, None], 0.0)
    # reverse segmented scan: token j collects the gradients of every later query of its sequence in the chunk
    nxt = tl.load(start_ptr + b * stride_sb + n + 1, mask=(n + 1) < N, other=1).to(tl.int32)  # j is its seq's last
    nx2 = nxt[:, None] + tl.zeros_like(glo).to(tl.int32)
    dlo, _ = tl.associative_scan((glo, nx2), 0, _seg_add, reverse=True)
    dhi = dlo
    if ROPE:
        dhi, _ = tl.associative_scan((ghi, nx2), 0, _seg_add, reverse=True)
    # the tokens of the chunk's last sequence also collect what flows back from later chunks: no sequence ends
    # in [token, the chunk's last token)
    inner = tl.where(tl.arange(0, BLOCK_N) < BLOCK_N - 1, nxt, 0)
    tail = tl.associative_scan(inner, 0, _or, reverse=True) == 0
    rlo = tl.load(rcarry_ptr + b * stride_cyb + c * stride_cyc + ch, mask=cmask, other=0.0)
    dlo = dlo + tl.where(tail[:, None], rlo[None, :], 0.0)
    if ROPE:
        rhi = tl.load(rcarry_ptr + b * stride_cyb + c * stride_cyc + half + ch, mask=cmask, other=0.0)
        dhi = dhi + tl.where(tail[:, None], rhi[None, :], 0.0)
    _poly_backward(z_ptr, dz_ptr, coeff_ptr, cos_ptr, sin_ptr, w_ptr, dcoeff_ptr, dlo, dhi, b, n, nmask, ch, cmask,
                   part, half, stride_zb, stride_zn, stride_cb, stride_cn, stride_wb, stride_dcp, K, ACT, ROPE, HAS_W)


@triton.jit
def _end_backward_kernel(z_ptr, dz_ptr, cos_ptr, sin_ptr, bias_ptr, dg_ptr, end_ptr, endw_ptr, endid_ptr, c_ptr,
                         dbias_ptr, N, D, half, G, NB, ND, stride_zb, stride_zn, stride_cb, stride_cn, stride_sb,
                         stride_eb, stride_ee, stride_ewb, stride_gb, stride_gn, stride_fb, stride_fn, stride_dbp,
                         GATE: tl.constexpr, ROPE: tl.constexpr, MEAN: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_D: tl.constexpr, GBLOCK: tl.constexpr):
    """End-token modes: the gate's gradients, and each query's contribution R(pos)(s ⊙ dg) / weight to the gradient
    of its end token's running sum (a (B, N, D) fp32 buffer)."""
    b = tl.program_id(0)
    nb = tl.program_id(1)
    dblk = tl.program_id(2)
    part = (b * NB + nb) * ND + dblk
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    ch = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = ch < half
    m2 = nmask[:, None] & cmask[None, :]
    eid = tl.load(endid_ptr + b * stride_sb + n, mask=nmask, other=0)
    hlo = tl.load(end_ptr + b * stride_eb + eid[:, None] * stride_ee + ch[None, :], mask=m2, other=0.0)
    hhi = hlo
    if ROPE:
        hhi = tl.load(end_ptr + b * stride_eb + eid[:, None] * stride_ee + (ch + half)[None, :], mask=m2, other=0.0)
    if MEAN:
        sw = tl.load(endw_ptr + b * stride_ewb + eid, mask=nmask, other=0.0)
        inv = tl.where(sw > 0, 1.0 / tl.maximum(sw, 1.0e-30), 0.0)
    else:
        inv = tl.where(nmask, 1.0, 0.0)
    glo, ghi = _grad_h_tile(z_ptr, dz_ptr, bias_ptr, dg_ptr, dbias_ptr, cos_ptr, sin_ptr, hlo * inv[:, None],
                            hhi * inv[:, None], b, n, nmask, ch, cmask, part, D, half, G, stride_zb, stride_zn,
                            stride_gb, stride_gn, stride_cb, stride_cn, stride_dbp, GATE, ROPE, BLOCK_N, BLOCK_D,
                            GBLOCK)
    tl.store(c_ptr + b * stride_fb + n[:, None] * stride_fn + ch[None, :], glo * inv[:, None], mask=m2)
    if ROPE:
        tl.store(c_ptr + b * stride_fb + n[:, None] * stride_fn + (ch + half)[None, :], ghi * inv[:, None], mask=m2)


@triton.jit
def _end_poly_kernel(z_ptr, dz_ptr, coeff_ptr, cos_ptr, sin_ptr, w_ptr, rend_ptr, endid_ptr, dcoeff_ptr,
                     N, half, NB, ND, stride_zb, stride_zn, stride_cb, stride_cn, stride_wb, stride_sb, stride_eb,
                     stride_ee, stride_dcp,
                     K: tl.constexpr, ACT: tl.constexpr, ROPE: tl.constexpr, HAS_W: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """End-token modes: every token's feature gradient is the reverse running sum of the end gradients at its own
    end token; then dL/dz_h and the partial dL/dα."""
    b = tl.program_id(0)
    nb = tl.program_id(1)
    dblk = tl.program_id(2)
    part = (b * NB + nb) * ND + dblk
    n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    ch = dblk * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = ch < half
    m2 = nmask[:, None] & cmask[None, :]
    eid = tl.load(endid_ptr + b * stride_sb + n, mask=nmask, other=0)
    dlo = tl.load(rend_ptr + b * stride_eb + eid[:, None] * stride_ee + ch[None, :], mask=m2, other=0.0)
    dhi = dlo
    if ROPE:
        dhi = tl.load(rend_ptr + b * stride_eb + eid[:, None] * stride_ee + (ch + half)[None, :], mask=m2, other=0.0)
    _poly_backward(z_ptr, dz_ptr, coeff_ptr, cos_ptr, sin_ptr, w_ptr, dcoeff_ptr, dlo, dhi, b, n, nmask, ch, cmask,
                   part, half, stride_zb, stride_zn, stride_cb, stride_cn, stride_wb, stride_dcp, K, ACT, ROPE, HAS_W)


# ----------------------------------------------------------------------------------------------------------------
# host side: launch configurations, the layout of a call, the autograd function
# ----------------------------------------------------------------------------------------------------------------

KERNELS = {"tail": _tail_kernel, "scan": _scan_kernel, "gate": _gate_kernel, "causal_head": _causal_head_kernel,
           "causal_backward": _causal_backward_kernel, "end_backward": _end_backward_kernel,
           "end_poly": _end_poly_kernel}


@dataclass(frozen=True)
class LaunchConfig:
    """Tile sizes and warps of one launch: BLOCK_N tokens per chunk × BLOCK_D channels (pairs with rotary)."""

    block_n: int = 64
    block_d: int = 64
    num_warps: int = 4


_OVERRIDE: List[Optional[LaunchConfig]] = [None]


def use_config(config: Optional[LaunchConfig]) -> None:
    """Force a launch configuration (tests run several chunks on tiny shapes); None: the automatic choice."""
    _OVERRIDE[0] = config


def _pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


# (BLOCK_D, rotary) → (BLOCK_N, warps): the largest token chunk whose backward kernels fit the registers without
# spilling on sm_80 and sm_90 (``polymixer kernels`` checks every entry). Wider channel tiles, and rotary tiles (which
# hold both halves of each pair), take shorter chunks or more warps.
TILES: Dict[Tuple[int, bool], Tuple[int, int]] = {
    (16, False): (64, 4), (32, False): (64, 4), (64, False): (64, 8), (128, False): (32, 8),
    (16, True): (64, 4), (32, True): (32, 4), (64, True): (32, 8), (128, True): (16, 8),
}


def launch_configs(D: int, G: int, rope: Optional[str]) -> LaunchConfig:
    """The configuration the dispatcher picks for a width (D, gate head G): 64 channels (32 channel pairs with
    rotary), widened to a whole gate head, and the token chunk and warps of :data:`TILES` for that tile."""
    forced = _OVERRIDE[0]
    if forced is not None:  # a forced tile still holds whole gate heads (a gate's sum cannot span channel blocks)
        return forced if forced.block_d >= G else LaunchConfig(forced.block_n, _pow2(G), forced.num_warps)
    half = D // 2 if rope else D
    block_d = max(16, min(32 if rope else 64, _pow2(half)), G)
    block_n, warps = TILES[(block_d, bool(rope))]
    return LaunchConfig(block_n, block_d, warps)


def all_launch_configs() -> List[Tuple[LaunchConfig, bool]]:
    """Every (configuration, rotary) :func:`launch_configs` can return."""
    return [(LaunchConfig(bn, bd, nw), rope) for (bd, rope), (bn, nw) in TILES.items()]


def default_launch_config() -> LaunchConfig:
    """The configuration of the most common case: a wide mixer, one gate per channel, no rotary."""
    return launch_configs(1024, 1, None)


def _gate_head(D: int, Ds: int) -> int:
    return D // Ds


def supports(call) -> Optional[str]:
    """Self-mixing, every mask but an explicit (B, M, N) one, packed sequences, rotary, degree 1–5, mean / sum, named
    non-linearities, fp32 / bf16 / fp16, on CUDA tensors (or CPU tensors under TRITON_INTERPRET=1)."""
    x = call.x
    if x.device.type != "cuda" and not (interpreted() and x.device.type == "cpu"):
        return f"CUDA tensors only (got {x.device.type}; CPU tensors run the kernels under TRITON_INTERPRET=1)"
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
    half = D // 2 if call.rope else D
    if call.rope and half % G:
        return f"rotary with a gate head of {G} channels straddling the halves of D = {D}"
    if is_compiling():
        return "torch.compile traces the torch form"
    if x.device.type == "cuda":
        return self_check(x.device)
    return None


_CHECKED: Dict[Any, Optional[str]] = {}


def self_check(device: torch.device) -> Optional[str]:
    """At first use on a GPU, the kernels run a small PoM — causal, full, block-causal, key padding, rotary, forward and
    backward — against the torch form on that GPU (milliseconds, once per device per process). None when they agree;
    else the reason, the automatic choice falls back to the torch form and an explicit ``backend("triton")`` raises
    it, with a warning: kernels verified in the interpreter and compiled ahead of time are still checked where they
    first run compiled."""
    key = (device.type, device.index)
    if key in _CHECKED:
        return _CHECKED[key]
    _CHECKED[key] = None  # while checking, the kernels are taken (the check calls them)
    import warnings

    from .. import dispatch
    from . import pom

    try:
        gen = torch.Generator(device="cpu").manual_seed(0)
        d, D, N = 32, 64, 150
        w_in = (torch.randn(D + 4, d, generator=gen) / d ** 0.5).to(device)
        coeff = (torch.rand(D, 3, generator=gen) * 2 - 1).to(device)
        bias, w_out = torch.randn(4, generator=gen).to(device), (torch.randn(d, D, generator=gen) / D ** 0.5).to(device)
        x = torch.randn(2, N, d, generator=gen).to(device)
        mask = (torch.rand(2, N, generator=gen) > 0.2).to(device)
        worst = 0.0
        for kw in (dict(causal=True), {}, dict(causal=True, block_size=17), dict(causal=True, mask=mask),
                   dict(rope="1d", causal=True)):
            outs = []
            for name in ("triton", "torch"):
                xs = x.clone().requires_grad_()
                params = [t.clone().requires_grad_() for t in (w_in, bias, coeff, w_out)]
                with dispatch.backend(name):
                    y = pom(xs, None, params[0], params[1], params[2], params[3], **kw)
                y.square().sum().backward()
                outs.append([y.detach(), xs.grad] + [p.grad for p in params])
            for a, b in zip(*outs):
                worst = max(worst, float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)))
        if not worst <= 1e-3:
            raise AssertionError(f"relative difference {worst:.2e} > 1e-3")
    except Exception as e:  # a failed launch or a wrong result: the torch form runs instead
        _CHECKED[key] = f"the kernels failed their first-use check on {device}: {type(e).__name__}: {e}"
        warnings.warn(f"polymixer: {_CHECKED[key]}; PoM runs on the torch form", RuntimeWarning, stacklevel=2)
    return _CHECKED[key]


@dataclass
class _Layout:
    """Everything the kernels of one call share besides z: sizes, mode, token flags, weights, rotary tables."""

    B: int
    N: int
    D: int
    Ds: int
    G: int
    K: int
    act: int
    gate: int
    rope: bool
    mean: bool
    direct: bool  # causal: each token reads its own running sum
    starts: Tensor  # (B, N) int32: 1 at every sequence's first token
    w: Optional[Tensor]  # (B, N) fp32 key weights
    cos: Optional[Tensor]  # (B' ∈ {1, B}, N, D/2) fp32
    sin: Optional[Tensor]
    is_end: Optional[Tensor]  # (B, N) int32, end-token modes
    end_id: Optional[Tensor]  # (B, N) int32
    nend: int
    end_seq_last: Optional[Tensor]  # (B, nend) int64: the last end id of each end's sequence
    cfg: LaunchConfig

    @property
    def half(self) -> int:
        return self.D // 2 if self.rope else self.D

    @property
    def nc(self) -> int:
        return -(-self.N // self.cfg.block_n)

    @property
    def nd(self) -> int:
        return -(-self.half // self.cfg.block_d)

    def chunk_has_start(self, starts: Optional[Tensor] = None) -> Tensor:
        st = self.starts if starts is None else starts
        pad = self.nc * self.cfg.block_n - self.N
        return F.pad(st, (0, pad)).view(self.B, self.nc, self.cfg.block_n).amax(-1) > 0


def _layout(call, z: Tensor) -> _Layout:
    B, N, D, Ds = call.B, call.N, call.D, call.Ds
    dev = z.device
    cfg = launch_configs(D, _gate_head(D, Ds), call.rope)
    starts = torch.zeros(B, N, dtype=torch.int32, device=dev)
    seg = None
    if call.cu_k is not None:
        seg, _, first = segments(call.cu_k, N)
        starts[0, first] = 1
    else:
        starts[:, 0] = 1
    w = None if call.key_mask is None else call.key_mask.to(torch.float32).contiguous()
    cos = sin = None
    if call.rope is not None:
        two_d = call.rope == "2d"
        positions = call.positions
        if positions is None:
            positions = default_positions(N, dev, two_d, "positions")
            if call.cu_k is not None:
                positions = positions - segments(call.cu_k, N)[1]
        check_positions(positions, B, N, two_d, "positions")
        cos, sin = rope_angles(positions, D, call.rope_base, two_d, torch.float32)
        cos, sin = cos.reshape(-1, N, D // 2).contiguous(), sin.reshape(-1, N, D // 2).contiguous()
    direct = call.causal and call.block_size is None
    is_end = end_id = end_seq_last = None
    nend = 0
    if not direct:
        idx = torch.arange(N, device=dev)
        if call.cu_k is not None:
            local = idx - segments(call.cu_k, N)[1]
            last_of_seq = torch.zeros(N, dtype=torch.bool, device=dev)
            last_of_seq[call.cu_k[1:].long() - 1] = True
        else:
            local = idx
            last_of_seq = idx == N - 1
        ends = last_of_seq if not call.causal else (((local + 1) % call.block_size) == 0) | last_of_seq
        ends = ends.unsqueeze(0).expand(B, N)
        csum = torch.cumsum(ends.to(torch.int64), dim=1)
        end_id = (csum - ends.to(torch.int64)).to(torch.int32).contiguous()
        is_end = ends.to(torch.int32).contiguous()
        # the number of ends, from shapes where the mode fixes it (no host sync), else read back
        if not call.causal:
            nend = 1 if call.cu_k is None else call.cu_k.numel() - 1
        elif call.cu_k is None:
            nend = -(-N // call.block_size)
        else:
            nend = int(csum[0, -1])
        # the last end id of each end's sequence (for the reverse sums over ends)
        # each token's end lies in its own sequence (every sequence's last token is an end): scatter the tokens'
        # sequences to their end ids — all writes to one id agree, and nothing is read back to the host
        seg_t = seg if seg is not None else torch.zeros(N, dtype=torch.int64, device=dev)
        seq_of_end = torch.zeros(max(nend, 1), dtype=torch.int64, device=dev).scatter_(0, end_id[0].long(), seg_t)
        nseq = 1 if call.cu_k is None else call.cu_k.numel() - 1
        last_end = torch.zeros(nseq, dtype=torch.int64, device=dev)
        last_end.scatter_reduce_(0, seq_of_end, torch.arange(nend, device=dev), "amax", include_self=False)
        end_seq_last = last_end[seq_of_end].unsqueeze(0).expand(B, nend).contiguous()
    return _Layout(B, N, D, Ds, _gate_head(D, Ds), call.coeff.shape[1], ACT_CODES[call.activation],
                   GATE_CODES[call.gate], call.rope is not None, call.reduction == "mean", direct,
                   starts.contiguous(), w, cos, sin, is_end, end_id, nend, end_seq_last, cfg)


def _carry(tail: Tensor, has_start: Tensor) -> Tensor:
    """What enters each chunk from the sequence the previous chunks end with: the sum of the tails of the chunks
    since that sequence's last restart (float64 prefix sums, so that no long range cancels)."""
    shape = tail.shape
    t = tail.reshape(shape[0], shape[1], -1).to(torch.float64)
    P = torch.cumsum(t, dim=1)
    nc = shape[1]
    idx = torch.arange(nc, device=tail.device)
    restart = torch.cummax(torch.where(has_start, idx, 0), dim=1).values  # (B, nc): last chunk ≤ c with a start
    before = torch.cat([torch.zeros_like(P[:, :1]), P[:, :-1]], dim=1)
    after = P - torch.gather(before, 1, restart.unsqueeze(-1).expand_as(P))
    carry = torch.cat([torch.zeros_like(after[:, :1]), after[:, :-1]], dim=1)
    return carry.to(torch.float32).reshape(shape).contiguous()


def _rcarry(head: Tensor, has_start: Tensor) -> Tensor:
    """What flows back into each chunk's last sequence from the following chunks: the heads of the chunks after it,
    up to the first one that starts a sequence (its head is empty of that sequence: the flow stops there)."""
    shape = head.shape
    h = head.reshape(shape[0], shape[1], -1).to(torch.float64)
    nc = shape[1]
    Q = torch.flip(torch.cumsum(torch.flip(h, [1]), dim=1), [1])  # Q[j] = Σ_{j' ≥ j}
    Q = torch.cat([Q, torch.zeros_like(Q[:, :1])], dim=1)
    idx = torch.arange(nc, device=head.device)
    first = torch.where(has_start, idx, nc - 1)
    first = torch.flip(torch.cummin(torch.flip(first, [1]), dim=1).values, [1])  # first chunk ≥ j with a start
    nxt = torch.cat([first[:, 1:], torch.full_like(first[:, :1], nc - 1)], dim=1)  # from chunk c + 1 on
    upto = torch.gather(Q, 1, (nxt + 1).unsqueeze(-1).expand(-1, -1, Q.shape[-1]))
    rc = Q[:, 1:] - upto
    rc[:, -1] = 0
    return rc.to(torch.float32).reshape(shape).contiguous()


def _strides(t: Optional[Tensor], dims: int) -> Tuple[int, ...]:
    return (0,) * dims if t is None else tuple(t.stride()[:dims])


def _common(L: _Layout) -> Dict[str, Any]:
    return dict(K=L.K, ACT=L.act, ROPE=L.rope, HAS_W=L.w is not None, BLOCK_N=L.cfg.block_n, BLOCK_D=L.cfg.block_d)


def _tables(L: _Layout, dev: torch.device) -> Tuple[Tensor, Tensor, Tensor, int, int]:
    dummy = torch.zeros(1, dtype=torch.float32, device=dev)
    cos = L.cos if L.cos is not None else dummy
    sin = L.sin if L.sin is not None else dummy
    w = L.w if L.w is not None else dummy
    scb = 0 if L.cos is None or L.cos.shape[0] == 1 else L.cos.stride(0)
    scn = 0 if L.cos is None else L.cos.stride(1)
    return cos, sin, w, scb, scn


def _tails(L: _Layout, src: Tensor, coeff: Tensor, starts: Tensor, given: bool) -> Tuple[Tensor, Tensor]:
    """Per-chunk tail sums (B, nc, D) and weights (B, nc) of the features of ``src`` (z, or given fp32 features)."""
    dev = src.device
    cos, sin, w, scb, scn = _tables(L, dev)
    half = L.D if given else L.half
    nd = -(-half // L.cfg.block_d)
    tail = torch.zeros(L.B, L.nc, L.D, dtype=torch.float32, device=dev)
    tailw = torch.zeros(L.B, L.nc, dtype=torch.float32, device=dev)
    kw = _common(L)
    if given:
        kw.update(ROPE=False, HAS_W=False)
    _tail_kernel[(L.B, L.nc, nd)](
        src, coeff, cos, sin, w, starts, tail, tailw, L.N, half, src.stride(0), src.stride(1), scb, scn,
        0 if L.w is None else L.w.stride(0), starts.stride(0), tail.stride(0), tail.stride(1), tailw.stride(0),
        GIVEN=given, num_warps=L.cfg.num_warps, **kw)
    return tail, tailw


def _end_table(L: _Layout, src: Tensor, coeff: Tensor, starts: Tensor, is_end: Tensor, end_id: Tensor,
               given: bool) -> Tuple[Tensor, Tensor]:
    """The running sums (B, nend, D) and weights (B, nend) at the end tokens."""
    dev = src.device
    has_start = L.chunk_has_start(starts)
    tail, tailw = _tails(L, src, coeff, starts, given)
    carry, carryw = _carry(tail, has_start), _carry(tailw, has_start)
    end = torch.zeros(L.B, max(L.nend, 1), L.D, dtype=torch.float32, device=dev)
    endw = torch.zeros(L.B, max(L.nend, 1), dtype=torch.float32, device=dev)
    cos, sin, w, scb, scn = _tables(L, dev)
    half = L.D if given else L.half
    nd = -(-half // L.cfg.block_d)
    kw = _common(L)
    if given:
        kw.update(ROPE=False, HAS_W=False)
    dummy = torch.zeros(1, dtype=torch.float32, device=dev)
    _scan_kernel[(L.B, L.nc, nd)](
        src, coeff, cos, sin, w, starts, carry, carryw, dummy, dummy, end, endw, is_end, end_id,
        L.N, L.D, half, L.G, src.stride(0), src.stride(1), scb, scn, 0 if L.w is None else L.w.stride(0),
        starts.stride(0), carry.stride(0), carry.stride(1), carryw.stride(0), 0, 0, end.stride(0), end.stride(1),
        endw.stride(0), GATE=L.gate, MEAN=L.mean, DIRECT=False, GIVEN=given, num_warps=L.cfg.num_warps, **kw)
    return end, endw


def _mix_forward(L: _Layout, z: Tensor, coeff: Tensor, bias: Tensor, out_dtype: torch.dtype
                 ) -> Tuple[Tensor, Tuple[Tensor, ...]]:
    dev = z.device
    g = torch.empty(L.B, L.N, L.D, dtype=out_dtype, device=dev)
    cos, sin, w, scb, scn = _tables(L, dev)
    kw = _common(L)
    has_start = L.chunk_has_start()
    if L.direct:
        tail, tailw = _tails(L, z, coeff, L.starts, False)
        carry, carryw = _carry(tail, has_start), _carry(tailw, has_start)
        dummy = torch.zeros(1, dtype=torch.float32, device=dev)
        idummy = torch.zeros(1, dtype=torch.int32, device=dev)
        _scan_kernel[(L.B, L.nc, L.nd)](
            z, coeff, cos, sin, w, L.starts, carry, carryw, bias, g, dummy, dummy, idummy, idummy,
            L.N, L.D, L.half, L.G, z.stride(0), z.stride(1), scb, scn, 0 if L.w is None else L.w.stride(0),
            L.starts.stride(0), carry.stride(0), carry.stride(1), carryw.stride(0), g.stride(0), g.stride(1), 0, 0, 0,
            GATE=L.gate, MEAN=L.mean, DIRECT=True, GIVEN=False, num_warps=L.cfg.num_warps, **kw)
        return g, (carry, carryw)
    end, endw = _end_table(L, z, coeff, L.starts, L.is_end, L.end_id, False)
    grid = (L.B, L.nc, L.nd)
    _gate_kernel[grid](z, cos, sin, bias, end, endw, L.end_id, g, L.N, L.D, L.half, L.G, z.stride(0), z.stride(1),
                       scb, scn, L.end_id.stride(0), end.stride(0), end.stride(1), endw.stride(0), g.stride(0),
                       g.stride(1), GATE=L.gate, ROPE=L.rope, MEAN=L.mean, BLOCK_N=L.cfg.block_n,
                       BLOCK_D=L.cfg.block_d, num_warps=L.cfg.num_warps)
    return g, (end, endw)


def _mix_backward(L: _Layout, z: Tensor, coeff: Tensor, bias: Tensor, dg: Tensor, saved: Tuple[Tensor, ...]
                  ) -> Tuple[Tensor, Tensor, Tensor]:
    dev = z.device
    dg = dg.contiguous()
    dz = torch.empty_like(z)
    cos, sin, w, scb, scn = _tables(L, dev)
    kw = _common(L)
    nparts = L.B * L.nc * L.nd
    dcoeff = torch.zeros(nparts, L.D * L.K, dtype=torch.float32, device=dev)
    dbias = torch.zeros(nparts, L.Ds, dtype=torch.float32, device=dev)
    has_start = L.chunk_has_start()
    sw_b = 0 if L.w is None else L.w.stride(0)
    if L.direct:
        carry, carryw = saved
        head = torch.zeros(L.B, L.nc, L.D, dtype=torch.float32, device=dev)
        _causal_head_kernel[(L.B, L.nc, L.nd)](
            z, cos, sin, w, L.starts, carryw, bias, dg, head, L.N, L.D, L.half, L.G, z.stride(0), z.stride(1), scb,
            scn, sw_b, L.starts.stride(0), carryw.stride(0), dg.stride(0), dg.stride(1), head.stride(0),
            head.stride(1), GATE=L.gate, ROPE=L.rope, HAS_W=L.w is not None, MEAN=L.mean, BLOCK_N=L.cfg.block_n,
            BLOCK_D=L.cfg.block_d, num_warps=L.cfg.num_warps)
        rcarry = _rcarry(head, has_start)
        _causal_backward_kernel[(L.B, L.nc, L.nd)](
            z, dz, coeff, cos, sin, w, L.starts, carry, carryw, rcarry, bias, dg, dcoeff, dbias,
            L.N, L.D, L.half, L.G, L.nc, L.nd, z.stride(0), z.stride(1), scb, scn, sw_b, L.starts.stride(0),
            carry.stride(0), carry.stride(1), carryw.stride(0), dg.stride(0), dg.stride(1), dcoeff.stride(0),
            dbias.stride(0), GATE=L.gate, MEAN=L.mean, GBLOCK=L.G, num_warps=L.cfg.num_warps, **kw)
    else:
        end, endw = saved
        cq = torch.empty(L.B, L.N, L.D, dtype=torch.float32, device=dev)  # each query's share of its end's gradient
        _end_backward_kernel[(L.B, L.nc, L.nd)](
            z, dz, cos, sin, bias, dg, end, endw, L.end_id, cq, dbias, L.N, L.D, L.half, L.G, L.nc, L.nd,
            z.stride(0), z.stride(1), scb, scn, L.end_id.stride(0), end.stride(0), end.stride(1), endw.stride(0),
            dg.stride(0), dg.stride(1), cq.stride(0), cq.stride(1), dbias.stride(0), GATE=L.gate, ROPE=L.rope,
            MEAN=L.mean, BLOCK_N=L.cfg.block_n, BLOCK_D=L.cfg.block_d, GBLOCK=L.G, num_warps=L.cfg.num_warps)
        # the queries of one end are a run of tokens: group them (each group starts after an end) and sum
        group_start = torch.zeros_like(L.starts)
        group_start[:, 0] = 1
        group_start[:, 1:] = L.is_end[:, :-1]
        dend, _ = _end_table(L, cq, coeff, group_start.contiguous(), L.is_end, L.end_id, True)
        # every token's features feed the running sums of its own end and every later end of its sequence
        Q = torch.flip(torch.cumsum(torch.flip(dend.to(torch.float64), [1]), dim=1), [1])
        Q = torch.cat([Q, torch.zeros_like(Q[:, :1])], dim=1)
        upto = torch.gather(Q, 1, (L.end_seq_last + 1).unsqueeze(-1).expand(-1, -1, L.D))
        rend = (Q[:, :-1] - upto).to(torch.float32).contiguous()
        _end_poly_kernel[(L.B, L.nc, L.nd)](
            z, dz, coeff, cos, sin, w, rend, L.end_id, dcoeff, L.N, L.half, L.nc, L.nd, z.stride(0), z.stride(1), scb,
            scn, sw_b, L.end_id.stride(0), rend.stride(0), rend.stride(1), dcoeff.stride(0),
            num_warps=L.cfg.num_warps, **kw)
    return dz, dcoeff.sum(0).view(L.D, L.K), dbias.sum(0)


class _PomMix(torch.autograd.Function):
    """z = [W_h x; W_s x] → g = gate(z_s + b) ⊙ H(poly(act(z_h))) in the Triton kernels; saves z (and the chunk carries
    or the end table, O(N·D / BLOCK_N)) for a backward that recomputes the features."""

    @staticmethod
    def forward(ctx, z: Tensor, coeff: Tensor, bias: Tensor, layout: _Layout) -> Tensor:  # type: ignore[override]
        z = z.contiguous()
        coeff_c, bias_c = coeff.detach().contiguous(), bias.detach().contiguous()
        g, saved = _mix_forward(layout, z, coeff_c, bias_c, z.dtype)
        ctx.layout = layout
        ctx.save_for_backward(z, coeff_c, bias_c, *saved)
        return g

    @staticmethod
    def backward(ctx, dg: Tensor):  # type: ignore[override]
        z, coeff, bias, *saved = ctx.saved_tensors
        dz, dcoeff, dbias = _mix_backward(ctx.layout, z, coeff, bias, dg, tuple(saved))
        return dz, dcoeff.to(coeff.dtype), dbias.to(bias.dtype), None


def forward(call) -> Tensor:  # call: polymixer.ops.pom.PomCall
    """The whole PoM of ``call``: the input projection (torch), the fused mixing (Triton), W_o (torch)."""
    z = F.linear(call.x, call.in_weight)
    layout = _layout(call, z)
    g = _PomMix.apply(z, call.coeff, call.gate_bias, layout)
    return F.linear(g, call.out_weight, call.out_bias)
