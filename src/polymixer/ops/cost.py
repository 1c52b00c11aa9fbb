"""A roofline cost model of PoM's GPU routes — predicted times, not measurements.

Each kernel takes ``max(FLOPs / (peak · efficiency), bytes / (bandwidth · efficiency))``. The dispatcher asks
:func:`pom_routes` whether the fused route (the input projection inside the mixing kernels, ``triton_gemm``) or
cuBLAS + the unfused kernels (``triton``) should run a call; :mod:`polymixer.bench.roofline` uses the same numbers for
its model of GPT-2 and GPPoM2. The efficiencies are assumptions stated in :class:`GPU`: until a GPU measures the
kernels, every answer here is a prediction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

__all__ = ["GPU", "GPUS", "pom_routes", "kernel_time", "MIX_PASSES", "hbm_passes", "PASS_FLOOR", "fused_efficiency",
           "fused_tiles"]


@dataclass(frozen=True)
class GPU:
    """Peak dense bf16 tensor throughput (FLOP/s), HBM and L2 bandwidth (bytes/s), and the fractions of them kernels
    reach: cuBLAS GEMMs, and memory-bound kernels. A Triton GEMM with PoM fused in reaches at most cuBLAS's fraction,
    and less where its tile is small: its operands stream from L2 at ``l2_bandwidth`` for ``tile intensity`` FLOPs per
    byte (:func:`fused_efficiency`). L2 figures are estimates, not datasheet values."""

    peak: float
    bandwidth: float
    l2_bandwidth: float
    gemm_eff: float = 0.70
    bw_eff: float = 0.80


GPUS: Dict[str, GPU] = {"h100": GPU(989e12, 3.35e12, 11e12), "h200": GPU(989e12, 4.8e12, 11e12),
                        "a100": GPU(312e12, 2.0e12, 5.5e12)}


def fused_efficiency(tile: Tuple[int, int], gpu: GPU) -> float:
    """The fraction of the peak a fused GEMM of (tokens × output columns) tile reaches when its bf16 operands stream
    from L2: tile intensity BN·W / (BN + W) FLOPs per byte, capped at cuBLAS's fraction."""
    bn, w = tile
    return min(gpu.gemm_eff, gpu.l2_bandwidth * bn * w / (bn + w) / gpu.peak)


# the floor: the mixing must read z_h, z_s and write g (forward), read z_h, z_s, dg and write dz_h, dz_s (backward)
PASS_FLOOR = {"forward": 3.0, "backward": 5.0}
# HBM passes per N·D element of the unfused mixing kernels (read z_h, z_s, dg; write g, dz), one split per row; z_s
# and dz_s count 1 / G of a pass (a gate per head of G channels)
MIX_PASSES = {"forward": 2.0, "forward_gate": 1.0, "backward": 3.0, "backward_gate": 2.0}


def kernel_time(flops: float, nbytes: float, gpu: GPU, eff: float) -> float:
    """Predicted seconds of one kernel: compute-bound or memory-bound, whichever is slower."""
    return max(flops / (gpu.peak * eff), nbytes / (gpu.bandwidth * gpu.bw_eff))


Tile = Optional[Tuple[int, int]]


def fused_tiles(G: int, causal: bool, rope: bool = False) -> Tuple[Tile, Tile]:
    """(forward, backward) GEMM tiles (tokens, output columns) of the fused route's kernels for a gate head of G
    channels: the kernel's chunk × its z_h columns (both halves with rotary), plus the gate's columns where they are
    matrix products (one gate per channel); the smaller tile of each pass's kernels. None where no tile fits."""
    from .pom.tiles import TILES, head_class

    t = TILES[(True, rope, head_class(G))]

    def width(tile: Tile, gate: bool) -> Tile:
        if tile is None:
            return None
        bn, bd = tile
        return bn, bd * (2 if rope else 1) * (2 if gate and G == 1 else 1)

    if causal:
        return width(t["causal_walk"], True), width(t["causal_backward"], True)
    fwd = [width(t["walk"], False), width(t["gate"], True)]
    bwd = [width(t["group"], True), width(t["end"], False)]
    def pick(ts: list) -> Tile:  # the kernel whose tile streams the least work per byte
        return None if any(x is None for x in ts) else min(ts, key=lambda x: x[0] * x[1] / (x[0] + x[1]))

    return pick(fwd), pick(bwd)


def pom_routes(tokens: int, d: int, D: int, Ds: int, degree: int = 2, causal: bool = True, gpu: str = "h100",
               bytes_per_el: int = 2, rope: bool = False) -> Dict[str, float]:
    """Predicted seconds of one PoM layer's input projection + mixing, forward + backward, on each route (W_o and
    its gradients are the same cuBLAS products on both, and left out): {"unfused", "fused", and the parts}; inf where
    the fused route has no tile."""
    g = GPUS[gpu]
    T, e = float(tokens), bytes_per_el
    G = max(1, D // Ds)
    w_flops = 2 * T * d * (D + Ds)  # one product of x with W_in
    gemm_in = kernel_time(w_flops, e * (T * d + d * (D + Ds) + T * (D + Ds)), g, g.gemm_eff)
    # the backward's two products of dz: dL/dx (T × (D + Ds) by (D + Ds) × d) and dL/dW_in
    gemm_back = 2 * kernel_time(w_flops, e * (T * (D + Ds) + d * (D + Ds) + T * d), g, g.gemm_eff)
    mix_flops = T * D * (2 * degree + 12)
    passes = hbm_passes("causal" if causal else "end", G=G)
    mix_fwd = kernel_time(mix_flops, e * T * D * passes["forward"], g, 1.0)
    mix_bwd = kernel_time(3 * mix_flops, e * T * D * passes["backward"], g, 1.0)
    fwd_tile, bwd_tile = fused_tiles(G, causal, rope)
    fpasses = hbm_passes("causal" if causal else "end", fused=True, G=G, d_over_D=d / D)
    inf = float("inf")
    fused_fwd = inf if fwd_tile is None else kernel_time(w_flops + mix_flops, e * T * D * fpasses["forward"], g,
                                                         fused_efficiency(fwd_tile, g))
    fused_bwd = inf if bwd_tile is None else kernel_time(w_flops + 3 * mix_flops, e * T * D * fpasses["backward"],
                                                         g, fused_efficiency(bwd_tile, g))
    return {"unfused": gemm_in + mix_fwd + mix_bwd + gemm_back, "fused": fused_fwd + fused_bwd + gemm_back,
            "unfused_forward": gemm_in + mix_fwd, "fused_forward": fused_fwd, "gemm_in": gemm_in,
            "mix_forward": mix_fwd,
            "fused_forward_efficiency": 0.0 if fwd_tile is None else fused_efficiency(fwd_tile, g),
            "fused_backward_efficiency": 0.0 if bwd_tile is None else fused_efficiency(bwd_tile, g)}


def hbm_passes(mode: str, fused: bool = False, G: int = 1, splits: bool = False, d_over_D: float = 0.5
               ) -> Dict[str, float]:
    """HBM passes per N·D element of the mixing kernels, forward and backward — the per-token tensors each kernel
    reads and writes, over N·D (tables of O(N·D / chunk), weights and masks left out): z_h, g, dg and dz_h count 1,
    z_s and dz_s 1 / G (a gate per head of G channels), x of the fused route d / D per kernel that reads it."""
    s = 1.0 / G
    x = d_over_D
    causal = mode == "causal"
    if fused:  # z never in memory: the kernels read x (and W_in)
        fwd = 1.0 + (x if causal else 2 * x)  # write g; read x in the walk (and the gate kernel)
        bwd = 1.0 + 1.0 + s + (x if causal else 2 * x)  # read dg, write dz_h, dz_s; read x
        if splits:
            fwd += x  # the summary walk reads x
            bwd += 1.0 + x if causal else 1.0 + 2 * x  # the summary walks read dg (and x)
        return {"forward": fwd, "backward": bwd}
    fwd = 1.0 + s + 1.0  # read z_h (the walk), z_s, write g (the walk, or the gate kernel)
    bwd = 1.0 + s + 1.0 + 1.0 + s  # read z_h, z_s, dg, write dz_h, dz_s
    if splits:
        fwd += 1.0  # the summary walk reads z_h
        bwd += s + 1.0  # the summary walk reads z_s and dg
    return {"forward": fwd, "backward": bwd}
