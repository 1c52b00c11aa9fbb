"""A roofline cost model of PoM's GPU routes — predicted times, not measurements — with its efficiencies measured.

Each kernel takes ``max(FLOPs / (peak · efficiency), bytes / (bandwidth · efficiency))``. The memory-bound mixing
kernels run at the bandwidth a GPU *measured* them at (the slowest fraction in :mod:`polymixer.ops.measured`, not an
assumed 80%: the H200 measured PoM's old walks at 7–8% of its datasheet bandwidth, their time less their matrix
products over their counted passes), the fused route's in-kernel GEMM at most at the fraction of the peak it was
measured at (5%); only cuBLAS and the datasheet figures of :class:`GPU` are assumptions.

Two uses:

* :func:`pom_kernels_vs_torch` — the dispatcher's model where the measured table has no entry for a call: PoM's
  mixing kernels (their HBM passes, :func:`hbm_passes`, counted by ``polymixer kernels --traffic``) against the torch
  form's elementwise work (its passes, :data:`TORCH_FORM_PASSES`, counted on its aten ops), each at the bandwidth it
  was measured at; the projections are the same cuBLAS products on both and cancel.
* :func:`pom_routes` — the fused route (``triton_gemm``) against cuBLAS + the unfused kernels, and
  :mod:`polymixer.experiments.bench.roofline`'s model of GPT-2 and GPPoM2. The fused route is not chosen automatically
  from it:
  it was measured slower everywhere it was timed, so only a measurement can put it back in the automatic choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from .. import measured

__all__ = ["GPU", "GPUS", "pom_routes", "kernel_time", "hbm_passes", "PASS_FLOOR", "fused_efficiency",
           "fused_tiles", "TORCH_FORM_PASSES", "torch_form_passes", "kernel_passes", "mix_efficiency",
           "measured_fused_efficiency", "pom_kernels_vs_torch", "gpu_of"]


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


def kernel_time(flops: float, nbytes: float, gpu: GPU, eff: float, bw_eff: Optional[float] = None) -> float:
    """Predicted seconds of one kernel: compute-bound or memory-bound, whichever is slower (bytes at ``bw_eff`` of
    the bandwidth, by default the GPU's assumed fraction for memory-bound kernels)."""
    return max(flops / (gpu.peak * eff), nbytes / (gpu.bandwidth * (gpu.bw_eff if bw_eff is None else bw_eff)))


# HBM passes per N·D element (in elements of the call's dtype) of the torch form's elementwise work — every aten op
# but the GEMMs and views, its per-token tensors of at least N·16 elements (z_s of a gate per head left out, so the
# figures are lower bounds) — counted at B 2, N 512, d 64, D 128, a gate per 16 channels
# (tests/test_dispatch.py::test_the_torch_forms_passes_are_counted recounts them). The torch form computes in at
# least fp32, so its passes in bf16 elements are about twice its passes in fp32 ones.
TORCH_FORM_PASSES: Dict[Tuple[str, int], Tuple[float, float]] = {
    # (mode class, bytes per element): (forward, backward)
    ("causal", 2): (53, 101), ("full", 2): (41, 93), ("block-causal", 2): (57, 111),
    ("packed causal", 2): (59, 112), ("packed full", 2): (49, 100), ("packed block-causal", 2): (63, 122),
    ("causal", 4): (25, 49), ("full", 4): (19, 45), ("block-causal", 4): (27, 54),
    ("packed causal", 4): (28, 55), ("packed full", 4): (23, 49), ("packed block-causal", 4): (30, 60),
}


def _base_mode(mode: str) -> str:
    """A mode class without its rotary suffix (the counts leave rotary out: it adds torch-form passes only)."""
    return mode.split(" 1d")[0].split(" 2d")[0]


def torch_form_passes(mode: str, bytes_per_el: int, train: bool) -> float:
    """The torch form's counted passes per N·D element (:data:`TORCH_FORM_PASSES`): forward, plus backward when
    ``train``; a 1-byte or 8-byte dtype takes the nearest count."""
    fwd, bwd = TORCH_FORM_PASSES[(_base_mode(mode), 2 if bytes_per_el <= 2 else 4)]
    return fwd + (bwd if train else 0.0)


def kernel_passes(mode: str, G: int, train: bool) -> float:
    """The unfused mixing kernels' passes per N·D element (:func:`hbm_passes`) for a mode class, forward plus
    backward when ``train``."""
    p = hbm_passes("causal" if _base_mode(mode) in ("causal", "packed causal") else "end", G=G)
    return p["forward"] + (p["backward"] if train else 0.0)


def mix_efficiency(train: bool = False, gpu: Optional[GPU] = None) -> Tuple[float, str]:
    """The fraction of HBM bandwidth PoM's mixing kernels run at: the slowest a GPU measured
    (:func:`polymixer.ops.measured.efficiency`), else ``gpu.bw_eff`` (an assumption, said so); with where it came
    from."""
    e = measured.efficiency("pom", measured.PASSES[1] if train else measured.PASSES[0])
    if e and e.get("kernels_fraction"):
        return e["kernels_fraction"], "measured"
    return (gpu or GPUS["h100"]).bw_eff, "assumed (no measurement in the table)"


def measured_fused_efficiency() -> Optional[float]:
    """The fraction of the tensor-core peak the fused route's kernels reached where a GPU timed them (their GEMM and
    mixing FLOPs over their time), None where none did."""
    e = measured.efficiency("pom", measured.PASSES[0])
    return e.get("fused_flops_fraction") if e else None


def pom_kernels_vs_torch(case: "measured.Case") -> Optional[Tuple[bool, str]]:
    """The model's verdict on PoM's unfused kernels against the torch form for a call (:class:`measured.Case`):
    (faster, why), or None without a measured bandwidth. Both sides run the same cuBLAS projections; what differs is
    the elementwise traffic — the kernels' counted passes at the lowest bandwidth measured for kernels of this op
    (on whatever kernel code was measured: until the kernels in use are, the old walks' 7–8% of the H200's bandwidth
    stands for them) against the torch form's counted passes at the highest measured for it, on the same card: the
    model leans against the kernels."""
    train = case.passes == measured.PASSES[1]
    measured_bw = measured.bandwidth_ratio("pom", case.passes)
    if measured_bw is None:
        return None
    _, src = measured_bw
    e = {"bf16": 2, "fp16": 2, "fp32": 4}.get(case.dtype, 4)
    k = kernel_passes(case.mode, case.gate_head, train)
    t = torch_form_passes(case.mode, e, train)
    predicted = (k / src["kernels_bytes_per_s"]) / (t / src["torch_bytes_per_s"])
    why = (f"the kernels' {k:g} passes per N·D element at {src['kernels_bytes_per_s'] / 1e12:.2f} TB/s against the "
           f"torch form's {t:g} at {src['torch_bytes_per_s'] / 1e12:.2f} TB/s (the slowest and fastest measured, "
           f"{src['arch']} {src['gpu']}, kernels {src['kernels']}): predicted at {predicted:.2f}× the torch form's "
           f"elementwise time, {case.mode}, {case.passes}, {case.dtype}")
    return predicted < 1.0, why


def gpu_of(name: str) -> Optional[str]:
    """The key of :data:`GPUS` for a device name ("NVIDIA H200" → "h200"), None for a card the model does not know."""
    low = name.lower()
    return next((key for key in GPUS if key in low), None)


Tile = Optional[Tuple[int, int]]


def fused_tiles(G: int, causal: bool, rope: bool = False) -> Tuple[Tile, Tile]:
    """(forward, backward) GEMM tiles (tokens, output columns) of the fused route's kernels for a gate head of G
    channels: the kernel's chunk × its z_h columns (both halves with rotary), plus the gate's columns where they are
    matrix products (one gate per channel) in the kernels that need the gate (the apply and both gradient passes; the
    chunk sums need z_h alone); the smaller tile of each pass's kernels. None where no tile fits. Every mode runs the
    same kernels (``causal`` is kept for the callers)."""
    from .tiles import TILES, head_class

    t = TILES[(True, rope, head_class(G))]

    def width(tile: Tile, gate: bool) -> Tile:
        if tile is None:
            return None
        bn, bd = tile
        return bn, bd * (2 if rope else 1) * (2 if gate and G == 1 else 1)

    def pick(ts: list) -> Tile:  # the kernel whose tile streams the least work per byte
        return None if any(x is None for x in ts) else min(ts, key=lambda x: x[0] * x[1] / (x[0] + x[1]))

    return (pick([width(t["sums"], False), width(t["apply"], True)]),
            pick([width(t["grad_sums"], True), width(t["grad_apply"], True)]))


def pom_routes(tokens: int, d: int, D: int, Ds: int, degree: int = 2, causal: bool = True, gpu: str = "h100",
               bytes_per_el: int = 2, rope: bool = False, mix_eff: Optional[float] = None,
               fused_eff: Optional[float] = None) -> Dict[str, float]:
    """Predicted seconds of one PoM layer's input projection + mixing, forward + backward, on each route (W_o and
    its gradients are the same cuBLAS products on both, and left out): {"unfused", "fused", and the parts}; inf where
    the fused route has no tile. The mixing kernels' bytes move at ``mix_eff`` of the bandwidth (default: the
    measured fraction, :func:`mix_efficiency`), the fused GEMM at its tile's efficiency capped by ``fused_eff``
    (default: the measured fraction, :func:`measured_fused_efficiency`)."""
    g = GPUS[gpu]
    bw = mix_efficiency(train=True, gpu=g)[0] if mix_eff is None else mix_eff
    cap = measured_fused_efficiency() if fused_eff is None else fused_eff
    T, e = float(tokens), bytes_per_el
    G = max(1, D // Ds)
    w_flops = 2 * T * d * (D + Ds)  # one product of x with W_in
    gemm_in = kernel_time(w_flops, e * (T * d + d * (D + Ds) + T * (D + Ds)), g, g.gemm_eff)
    # the backward's two products of dz: dL/dx (T × (D + Ds) by (D + Ds) × d) and dL/dW_in
    gemm_back = 2 * kernel_time(w_flops, e * (T * (D + Ds) + d * (D + Ds) + T * d), g, g.gemm_eff)
    mix_flops = T * D * (2 * degree + 12)
    passes = hbm_passes("causal" if causal else "end", G=G)
    mix_fwd = kernel_time(mix_flops, e * T * D * passes["forward"], g, 1.0, bw)
    mix_bwd = kernel_time(3 * mix_flops, e * T * D * passes["backward"], g, 1.0, bw)
    fwd_tile, bwd_tile = fused_tiles(G, causal, rope)
    fpasses = hbm_passes("causal" if causal else "end", fused=True, G=G, d_over_D=d / D)
    inf = float("inf")

    def eff(tile: Tile) -> float:
        tiled = fused_efficiency(tile, g) if tile is not None else 0.0
        return tiled if cap is None else min(tiled, cap)

    fused_fwd = inf if fwd_tile is None else kernel_time(w_flops + mix_flops, e * T * D * fpasses["forward"], g,
                                                         eff(fwd_tile), bw)
    fused_bwd = inf if bwd_tile is None else kernel_time(w_flops + 3 * mix_flops, e * T * D * fpasses["backward"],
                                                         g, eff(bwd_tile), bw)
    return {"unfused": gemm_in + mix_fwd + mix_bwd + gemm_back, "fused": fused_fwd + fused_bwd + gemm_back,
            "unfused_forward": gemm_in + mix_fwd, "fused_forward": fused_fwd, "gemm_in": gemm_in,
            "mix_forward": mix_fwd, "mix_efficiency": bw,
            "fused_forward_efficiency": 0.0 if fwd_tile is None else eff(fwd_tile),
            "fused_backward_efficiency": 0.0 if bwd_tile is None else eff(bwd_tile)}


def hbm_passes(mode: str, fused: bool = False, G: int = 1, d_over_D: float = 0.5) -> Dict[str, float]:
    """HBM passes per N·D element of the mixing kernels, forward and backward — the per-token tensors each kernel
    reads and writes, over N·D (tables of O(N·D / chunk), weights and masks left out): z_h, g, dg and dz_h count 1,
    z_s and dz_s 1 / G (a gate per head of G channels), x of the fused route d / D per kernel that reads it. As
    ``polymixer kernels --traffic`` counts the chunk-parallel kernels (chunk sums, a scan of the sums, an apply; the
    backward the same over the gated gradient): ``mode`` "causal" (each query reads its own chunk's tokens again in
    the apply) or "end" (full and block-causal: the apply reads the end sums)."""
    s = 1.0 / G
    x = d_over_D
    causal = mode == "causal"
    if fused:  # z never in memory: the chunk sums and the apply each recompute z from x
        fwd = 1.0 + 2 * x  # write g; x in the sums and in the apply
        # read dg (twice when causal: the gradient sums and the apply), write dz_h, dz_s; x in both passes
        bwd = (3.0 if causal else 2.0) + s + 2 * x
        return {"forward": fwd, "backward": bwd}
    fwd = (3.0 if causal else 2.0) + s  # read z_h (sums; again in the causal apply), z_s, write g
    # gradient sums: read dg, z_s (and write dz_s when the gate is of the end sums); apply: read z_h, write dz_h
    # (and read dg, z_s, write dz_s when causal)
    bwd = (4.0 + 3 * s) if causal else (3.0 + 2 * s)
    return {"forward": fwd, "backward": bwd}
