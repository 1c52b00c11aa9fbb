"""The dispatcher's cost model of PoM's unfused GPU kernels — a prediction, not a measurement — from measured
bandwidth: where the measured table has no entry for a call, :func:`pom_kernels_vs_torch` weighs PoM's mixing kernels
(their HBM passes, :func:`hbm_passes`, counted by ``polymixer kernels --traffic``) against the torch form's elementwise
work (its passes, :data:`TORCH_FORM_PASSES`, counted on its aten ops), each at the bandwidth a GPU *measured* it at
(:mod:`polymixer.ops.measured`; not an assumed 80%: the H200 measured PoM's old walks at 7–8% of its datasheet
bandwidth). The projections are the same cuBLAS products on both sides and cancel. The roofline model of whole layers
and routes (the fused ``triton_gemm`` route against cuBLAS + the unfused kernels) is the bench's,
:mod:`polymixer.experiments.bench.roofline`: the fused route is not chosen automatically from a model — it was measured
slower everywhere it was timed, so only a measurement can put it back in the automatic choice.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from .. import measured

__all__ = ["hbm_passes", "PASS_FLOOR", "TORCH_FORM_PASSES", "torch_form_passes", "kernel_passes",
           "pom_kernels_vs_torch"]


# the floor: the mixing must read z_h, z_s and write g (forward), read z_h, z_s, dg and write dz_h, dz_s (backward)
PASS_FLOOR = {"forward": 3.0, "backward": 5.0}


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
