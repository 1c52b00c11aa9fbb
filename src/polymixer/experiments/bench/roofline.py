"""``polymixer bench roofline``: a roofline MODEL of PoM and attention on a GPU — predicted, not measured.

For every kernel of one forward pass the model counts the FLOPs and the bytes moved through HBM, and predicts its time
as ``max(FLOPs / (peak · efficiency), bytes / (bandwidth · efficiency))`` (:func:`kernel_time`; the mixing's passes
are those the dispatcher's model counts, :mod:`polymixer.ops.pom.cost`). Summed over GPT-2 small (12 layers × 768)
and GPPoM2-S (the same with PoM, D = 2·768, a gate per head) at 1k, 4k, 16k and 32k tokens per sequence, it predicts
the forward tokens/s of both and their ratio, beside the paper's H100 measurements, and PoM's forward time over its
own matrix products (the target "≤ 1.2× the GEMM floor").

The kernels: cuBLAS GEMMs (projections, MLP, logits) at a fraction of the tensor-core peak; attention as
FlashAttention-2 (``4·N²·d`` FLOPs, half of them when causal, reading q, k, v once and writing o once) at its published
fraction of the peak; PoM on its two routes — ``triton``: cuBLAS writes z, the mixing kernels read z_h, z_s and write
g (3 passes over N·D, counted by ``polymixer kernels --traffic``), cuBLAS reads g; ``triton_gemm``: one kernel
computes z tile by tile from x and W_in and writes only g (its GEMM at an assumed lower efficiency than cuBLAS, for a
tile that scans), cuBLAS reads g. Efficiencies are parameters; the defaults are typical figures for H100 SXM (GEMM
70% of 989 TFLOP/s bf16, fused GEMM 50%, FlashAttention-2 forward 35%, memory-bound kernels 80% of 3.35 TB/s). Every
row of the table is a prediction: ``bench mixer --device cuda`` / ``bench lm --device cuda`` on a GPU measure the real
figures.

It also holds the roofline model of one PoM layer on each GPU route (:func:`pom_routes`: the fused ``triton_gemm``
route against cuBLAS + the unfused kernels, the mixing at the bandwidth a GPU measured, :mod:`polymixer.ops.measured`)
and its verdict on a call (:func:`predicted_win`) — predictions for reports: the dispatcher takes the fused route
only where a GPU measured it faster.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import torch

from ...ops import measured
from ...ops.call import Call
from ...ops.common import operand_dtype
from ...ops.pom.cost import PASS_FLOOR, hbm_passes
from ...ops.pom.tiles import TILES, head_class
from ..report import format_table, new_figure, save_figure
from .common import write_json
from ...ranges import Range
from ..tasks.common import float_in

__all__ = ["GPU", "GPUS", "gpu_of", "kernel_time", "fused_efficiency", "fused_tiles", "mix_efficiency",
           "measured_fused_efficiency", "pom_routes", "predicted_win", "RooflineConfig", "predict", "run", "report",
           "add_arguments", "main"]
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


def kernel_time(flops: float, nbytes: float, gpu: GPU, eff: float, bw_eff: Optional[float] = None) -> float:
    """Predicted seconds of one kernel: compute-bound or memory-bound, whichever is slower (bytes at ``bw_eff`` of
    the bandwidth, by default the GPU's assumed fraction for memory-bound kernels)."""
    return max(flops / (gpu.peak * eff), nbytes / (gpu.bandwidth * (gpu.bw_eff if bw_eff is None else bw_eff)))


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



def predicted_win(call: Call) -> Optional[str]:
    """None when the roofline model (:func:`pom_routes`, at the measured efficiencies) predicts
    the fused route faster than cuBLAS + the unfused kernels for this call (forward + backward when it will be
    differentiated, else forward), else why not. A prediction for reports and benches: the dispatcher takes the fused
    route automatically only on a measurement (:mod:`polymixer.ops.measured`)."""
    from ...ops.pom.triton_kernels import will_differentiate  # (imports Triton)

    dtype = operand_dtype(call.x)
    if dtype == torch.float32 and (call.x.device.type != "cuda" or torch.get_float32_matmul_precision() == "highest"):
        return "fp32 products without tf32 run on CUDA cores in the fused kernels: cuBLAS is faster"
    d = call.x.shape[-1]
    t = pom_routes(call.B * call.N, d, call.D, call.Ds, call.weights.coeff.shape[1],
                   causal=call.causal and call.block_size is None, rope=call.rope is not None)
    train = will_differentiate(call)
    fused, unfused = (t["fused"], t["unfused"]) if train else (t["fused_forward"], t["unfused_forward"])
    if fused < unfused:
        return None
    if fused == float("inf"):
        return "the fused route has no tile for this call's kernels (see polymixer.ops.pom.tiles)"
    return (f"the roofline model predicts the unfused route faster here ({1e6 * unfused:.0f} µs against "
            f"{1e6 * fused:.0f} µs for the {'forward + backward' if train else 'forward'})")



# the paper's GPT-2 / GPPoM2-S forward k tokens/s on H100 (PoM's Triton kernels) at 1k / 4k / 16k / 32k tokens
PAPER = {1024: (572, 996), 4096: (295, 893), 16384: (99, 624), 32768: (52, 448)}


@dataclass
class RooflineConfig:
    gpu: str = "h100"
    layers: int = 12
    dim: int = 768
    heads: int = 12
    expand: float = 2.0
    sel_heads: int = 12
    degree: int = 2
    vocab: int = 50304
    lengths: Tuple[int, ...] = (1024, 4096, 16384, 32768)
    tokens: int = 32768  # per forward call (batch = tokens / N), the paper's fixed budget
    bytes_per_el: int = 2  # bf16 activations
    gemm_eff: float = 0.70
    fused_gemm_eff: Optional[float] = None  # None: from the fused kernel's tile and L2 bandwidth
    flash_eff: float = 0.35
    bw_eff: float = 0.80
    causal: bool = True
    out: str = "runs/bench/roofline"


def _t(flops: float, nbytes: float, cfg: RooflineConfig, eff: float) -> float:
    g = GPUS[cfg.gpu]
    return max(flops / (g.peak * eff), nbytes / (g.bandwidth * cfg.bw_eff))


def _gemm(m: float, k: float, n: float, cfg: RooflineConfig) -> float:
    """(m × k) @ (k × n): reads both, writes the product."""
    e = cfg.bytes_per_el
    return _t(2 * m * k * n, e * (m * k + k * n + m * n), cfg, cfg.gemm_eff)


def _fused_eff(cfg: RooflineConfig) -> float:
    """The fused GEMM's fraction of the peak: given, or from its forward tile
    (:func:`fused_efficiency`)."""
    if cfg.fused_gemm_eff is not None:
        return cfg.fused_gemm_eff
    D = int(round(cfg.expand * cfg.dim))
    G = D // cfg.sel_heads if cfg.sel_heads > 1 else 1
    tile = fused_tiles(G, cfg.causal)[0]
    return 0.0 if tile is None else fused_efficiency(tile, GPUS[cfg.gpu])


def predict(cfg: RooflineConfig, N: int) -> Dict[str, Any]:
    """Predicted seconds per forward call of each model, and their parts, at N tokens per sequence."""
    B = max(1, cfg.tokens // N)
    T = B * N  # tokens per call
    d, e = cfg.dim, cfg.bytes_per_el
    D = int(round(cfg.expand * d))
    Ds = cfg.sel_heads if cfg.sel_heads > 1 else D
    mlp = _gemm(T, d, 4 * d, cfg) + _gemm(T, 4 * d, d, cfg)
    norms = 2 * _t(0, 2 * e * T * d, cfg, 1.0)  # two LayerNorms per block: read and write (B, N, d)
    # attention: QKV, FlashAttention-2, output projection
    flash_flops = 4 * B * N * N * d * (0.5 if cfg.causal else 1.0)
    att_core = _t(flash_flops, e * 4 * T * d, cfg, cfg.flash_eff)
    att = _gemm(T, d, 3 * d, cfg) + att_core + _gemm(T, d, d, cfg)
    # PoM, route "triton": the stacked input projection, the mixing kernels (passes counted by
    # ``polymixer kernels --traffic``), W_o
    pom_in, pom_out = _gemm(T, d, D + Ds, cfg), _gemm(T, D, d, cfg)
    G = D / Ds
    passes = hbm_passes("causal" if cfg.causal else "end", G=max(1, round(G)))["forward"]
    mix_flops = T * D * (2 * cfg.degree + 12)  # activation, Horner, scan, gate: O(1) per element
    pom_mix = _t(mix_flops, e * T * D * passes, cfg, cfg.gemm_eff)
    pom = pom_in + pom_mix + pom_out
    # PoM, route "triton_gemm": the input projection and the mixing in one kernel (reads x once — twice in the end
    # modes —, writes g), W_o
    fused_passes = hbm_passes("causal" if cfg.causal else "end", fused=True, G=max(1, round(G)), d_over_D=d / D)
    eff = _fused_eff(cfg)
    pom_fused_mix = _t(2 * T * d * (D + Ds) + mix_flops, e * (T * D * fused_passes["forward"] + d * (D + Ds)), cfg,
                       eff)
    pom_fused = pom_fused_mix + pom_out
    head = _gemm(T, d, cfg.vocab, cfg)
    gpt2 = cfg.layers * (att + mlp + norms) + head
    gppom = cfg.layers * (pom + mlp + norms) + head
    gppom_fused = cfg.layers * (pom_fused + mlp + norms) + head
    return {"N": N, "batch": B, "gpt2_s": gpt2, "gppom2_s": gppom, "gpt2_ktok_s": T / gpt2 / 1e3,
            "gppom2_ktok_s": T / gppom / 1e3, "gppom2_fused_ktok_s": T / gppom_fused / 1e3, "ratio": gpt2 / gppom,
            "ratio_fused": gpt2 / gppom_fused, "pom_vs_floor": pom / (pom_in + pom_out),
            "pom_fused_vs_floor": pom_fused / (pom_in + pom_out), "attention_layer_ms": 1e3 * att,
            "pom_layer_ms": 1e3 * pom, "pom_fused_layer_ms": 1e3 * pom_fused, "flash_ms": 1e3 * att_core,
            "pom_mix_ms": 1e3 * pom_mix,
            "paper_gpt2_ktok_s": PAPER.get(N, (None, None))[0], "paper_gppom2_ktok_s": PAPER.get(N, (None, None))[1],
            "paper_ratio": (PAPER[N][1] / PAPER[N][0]) if N in PAPER else None}


def run(cfg: RooflineConfig, progress: bool = True) -> Dict[str, Any]:
    if cfg.gpu not in GPUS:
        raise ValueError(f"unknown gpu {cfg.gpu!r}; the model knows {', '.join(GPUS)}")
    rows = [predict(cfg, N) for N in cfg.lengths]
    D = int(round(cfg.expand * cfg.dim))
    G = D // cfg.sel_heads if cfg.sel_heads > 1 else 1
    mode = "causal" if cfg.causal else "end"
    passes = {"triton": hbm_passes(mode, G=G)["forward"],
              "fused": hbm_passes(mode, fused=True, G=G, d_over_D=1 / cfg.expand)["forward"]}
    payload = {"config": asdict(cfg), "kind": "model (predicted, not measured)", "rows": rows,
               "fused_gemm_eff": _fused_eff(cfg), "passes": passes}
    out = Path(cfg.out)
    write_json(out / "roofline.json", payload)
    (out / "roofline.txt").write_text(report(payload) + "\n")
    plot(payload, out / "roofline.png")
    return payload


def report(payload: Dict[str, Any]) -> str:
    c = payload["config"]
    lines = [f"ROOFLINE MODEL — predicted, not measured: {c['gpu'].upper()}, GPT-2 small vs GPPoM2-S forward, "
             f"{c['tokens']:,} tokens per call, bf16; GEMMs at {100 * c['gemm_eff']:.0f}% of the tensor-core peak, "
             f"PoM's fused GEMM at {100 * payload['fused_gemm_eff']:.0f}% (its tile), FlashAttention-2 at "
             f"{100 * c['flash_eff']:.0f}%, memory-bound kernels at {100 * c['bw_eff']:.0f}% of HBM bandwidth",
             format_table(payload["rows"], ["N", "batch", "gpt2_ktok_s", "gppom2_ktok_s", "gppom2_fused_ktok_s",
                                            "ratio", "ratio_fused", "paper_ratio", "pom_vs_floor",
                                            "pom_fused_vs_floor"],
                          ["N", "batch", "GPT-2 k tok/s", "GPPoM2-S k tok/s (triton)", "GPPoM2-S k tok/s (fused)",
                           "ratio (triton)", "ratio (fused)", "paper ratio", "PoM ÷ its GEMMs (triton)",
                           "PoM ÷ its GEMMs (fused)"]),
             "",
             "paper (H100, measured): GPT-2 " + ", ".join(f"{r['paper_gpt2_ktok_s']:,}" for r in payload["rows"]
                                                         if r["paper_gpt2_ktok_s"])
             + " k tok/s; GPPoM2-S " + ", ".join(f"{r['paper_gppom2_ktok_s']:,}" for r in payload["rows"]
                                                  if r["paper_gppom2_ktok_s"]) + " k tok/s",
             f"mixing passes per N·D element (model; floor {PASS_FLOOR['forward']:g} forward): triton "
             f"{payload['passes']['triton']:.2f}, fused {payload['passes']['fused']:.2f}"]
    return "\n".join(lines)


def plot(payload: Dict[str, Any], path: Path) -> None:
    rows = payload["rows"]
    fig, axes = new_figure(2, width=4.6, height=3.6)
    ns = [r["N"] for r in rows]
    ax = axes[0]
    ax.plot(ns, [r["gpt2_ktok_s"] for r in rows], "o--", color="C0", label="GPT-2 (model)")
    ax.plot(ns, [r["gppom2_ktok_s"] for r in rows], "o--", color="C1", label="GPPoM2-S, triton (model)")
    ax.plot(ns, [r["gppom2_fused_ktok_s"] for r in rows], "^:", color="C2", label="GPPoM2-S, fused (model)")
    paper = [r for r in rows if r["paper_gpt2_ktok_s"]]
    ax.plot([r["N"] for r in paper], [r["paper_gpt2_ktok_s"] for r in paper], "s-", color="C0", label="GPT-2 (paper)")
    ax.plot([r["N"] for r in paper], [r["paper_gppom2_ktok_s"] for r in paper], "s-", color="C1",
            label="GPPoM2-S (paper)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens per sequence")
    ax.set_ylabel("forward k tokens / s")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    ax = axes[1]
    ax.plot(ns, [r["ratio"] for r in rows], "o--", label="model, triton")
    ax.plot(ns, [r["ratio_fused"] for r in rows], "^:", label="model, fused")
    ax.plot([r["N"] for r in paper], [r["paper_ratio"] for r in paper], "s-", label="paper (H100)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per sequence")
    ax.set_ylabel("GPPoM2-S ÷ GPT-2 tokens/s")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"roofline MODEL ({payload['config']['gpu'].upper()}): predicted, not measured", fontsize=9)
    save_figure(fig, path)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = RooflineConfig()
    p.add_argument("--gpu", choices=sorted(GPUS), default=d.gpu)
    p.add_argument("--gemm-eff", type=float_in(Range(0, 1, low_open=True)), default=d.gemm_eff,
                   help="fraction of the tensor-core peak of a GEMM")
    p.add_argument("--fused-gemm-eff", type=float_in(Range(0, 1, low_open=True)), default=d.fused_gemm_eff,
                   help="fraction of the peak of PoM's fused GEMM (default: from its tile's intensity and L2 "
                        "bandwidth)")
    p.add_argument("--flash-eff", type=float_in(Range(0, 1, low_open=True)), default=d.flash_eff,
                   help="fraction of the tensor-core peak FlashAttention-2's forward reaches")
    p.add_argument("--bw-eff", type=float_in(Range(0, 1, low_open=True)), default=d.bw_eff,
                   help="fraction of HBM bandwidth of memory-bound kernels")
    p.add_argument("--full", action="store_true", help="bidirectional attention (default: causal, as GPT-2)")
    p.add_argument("--out", default=d.out)


def main(args: argparse.Namespace) -> int:
    cfg = RooflineConfig(gpu=args.gpu, gemm_eff=args.gemm_eff, fused_gemm_eff=args.fused_gemm_eff,
                         flash_eff=args.flash_eff, bw_eff=args.bw_eff, causal=not args.full, out=args.out)
    payload = run(cfg)
    print(report(payload))
    print(f"\nwrote {Path(cfg.out) / 'roofline.json'}, {Path(cfg.out) / 'roofline.txt'}, "
          f"{Path(cfg.out) / 'roofline.png'}")
    return 0

