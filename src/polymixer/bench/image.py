"""``polymixer bench image``: SiT vs SiPoM at CPU scale.

1. speed: seconds per image of a forward pass against the image side (tokens from 256 to 16k for both, and beyond
   for SiPoM alone), same width and depth, and images/s at a fixed batch — the paper's SiPoM-speed figure;
2. quality: tiny SiT and SiPoM trained with equal steps on the digits default, with both objectives (flow matching
   and DDPM), scored by class-conditional accuracy and a Fréchet distance in a small classifier's feature space
   (``polymixer eval image``), with a sample grid of each model.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Tuple

import torch

from ..models import count_parameters, create_model
from ..report import format_table, new_figure, save_figure
from .common import apply_overrides, run_parts, time_interleaved

__all__ = ["ImageBenchConfig", "run_speed", "run_quality", "main", "add_arguments"]


@dataclass
class ImageBenchConfig:
    hidden: int = 384
    depth: int = 4
    heads: int = 6
    patch: int = 2
    channels: int = 4
    sides: Tuple[int, ...] = (32, 64, 128, 256)  # 256 → 16,384 tokens at patch 2
    pom_sides: Tuple[int, ...] = (362, 512)  # 32,761 and 65,536 tokens, SiPoM only
    tokens: int = 16384  # per forward call: batch = tokens / tokens-per-image
    repeats: int = 3
    throughput_batch: int = 64
    quality_steps: int = 1200  # ~11 min per model at batch 128 on 2 cores
    quality_batch: int = 128
    quality_samples: int = 500
    guidance: float = 2.0
    sample_steps: int = 30
    objectives: Tuple[str, ...] = ("flow", "ddpm")
    parts: Tuple[str, ...] = ("speed", "quality")
    seed: int = 0
    out: str = "runs/bench/image"
    extra: Dict[str, Any] = field(default_factory=dict)


QUICK = dict(sides=(32, 64), pom_sides=(128,), tokens=4096, repeats=2, throughput_batch=16, quality_steps=100,
             quality_samples=200, sample_steps=10)


def _backbone(cfg: ImageBenchConfig, mixer: str, side: int) -> torch.nn.Module:
    preset = "sipom-s/2" if mixer == "pom" else "sit-s/2"
    return create_model(preset, input_size=side, hidden_size=cfg.hidden, depth=cfg.depth, num_heads=cfg.heads,
                        patch_size=cfg.patch, in_channels=cfg.channels, num_classes=10).eval()


@torch.no_grad()
def run_speed(cfg: ImageBenchConfig, progress: bool = True) -> Dict[str, Any]:
    from tqdm.auto import tqdm

    torch.manual_seed(cfg.seed)
    sides = sorted(set(cfg.sides) | set(cfg.pom_sides))
    bar = tqdm(total=sum((2 if s in cfg.sides else 1) * (cfg.repeats + 1) for s in sides), disable=not progress,
               desc="bench image speed", unit="call")
    rows = []
    for side in sides:
        tokens = (side // cfg.patch) ** 2
        b = max(1, cfg.tokens // tokens)
        mixers = ["attention", "pom"] if side in cfg.sides else ["pom"]
        models = {m: _backbone(cfg, m, side) for m in mixers}
        x = torch.randn(b, cfg.channels, side, side)
        t = torch.rand(b) * 1000
        y = torch.randint(0, 10, (b,))
        timing = time_interleaved({m: (lambda mod=mod: mod(x, t, y)) for m, mod in models.items()}, warmup=1,
                                  repeats=cfg.repeats, on_sample=lambda name: bar.update(1))
        bar.update(len(models))
        for m in mixers:
            rows.append({"side": side, "tokens": tokens, "batch": b, "model": "SiPoM" if m == "pom" else "SiT",
                         "s_per_image": timing[m].median / b})
    bar.close()
    for side in cfg.sides:
        sit = next(r for r in rows if r["side"] == side and r["model"] == "SiT")
        pom = next(r for r in rows if r["side"] == side and r["model"] == "SiPoM")
        pom["sit_over_sipom"] = sit["s_per_image"] / pom["s_per_image"]
    # images/s at a fixed batch, at the smallest side
    side = min(cfg.sides)
    models = {m: _backbone(cfg, m, side) for m in ("attention", "pom")}
    x = torch.randn(cfg.throughput_batch, cfg.channels, side, side)
    t = torch.rand(cfg.throughput_batch) * 1000
    y = torch.randint(0, 10, (cfg.throughput_batch,))
    tp = time_interleaved({m: (lambda mod=mod: mod(x, t, y)) for m, mod in models.items()}, warmup=1,
                          repeats=cfg.repeats)
    throughput = {("SiPoM" if m == "pom" else "SiT"): cfg.throughput_batch / tp[m].median for m in models}
    params = {("SiPoM" if m == "pom" else "SiT"): count_parameters(mod) for m, mod in models.items()}
    return {"rows": rows, "images_per_s": throughput, "throughput_side": side, "params": params}


def run_quality(cfg: ImageBenchConfig, progress: bool = True) -> Dict[str, Any]:
    from ..data.image import digits, save_grid
    from ..tasks.image import evaluate_generator, sample_images, train_image
    from ..train.checkpoint import load_weights
    from ..train.loop import TrainConfig

    data = digits(16)
    rows = []
    for objective in cfg.objectives:
        for preset in ("tiny-sit", "tiny-sipom"):
            out = Path(cfg.out) / "quality" / f"{preset}-{objective}"
            tcfg = TrainConfig(steps=cfg.quality_steps, batch_size=cfg.quality_batch, lr=1e-3, min_lr=1e-4,
                               weight_decay=0.0, warmup=max(1, cfg.quality_steps // 20), ema=0.999,
                               eval_every=cfg.quality_steps, ckpt_every=cfg.quality_steps, out=str(out),
                               resume=False, progress=progress, seed=cfg.seed + 7)
            t0 = time.perf_counter()
            res = train_image(preset, tcfg, objective, eval_samples=0)
            minutes = (time.perf_counter() - t0) / 60
            model = res["model"]
            load_weights(model, out, ema=True)
            m = evaluate_generator(model, objective, data, cfg.quality_samples, cfg.guidance, cfg.sample_steps,
                                   progress=progress)
            x, _ = sample_images(model, objective, list(range(10)), 6, 4.0, cfg.sample_steps, seed=1)
            grid = Path(cfg.out) / f"samples_{preset}_{objective}.png"
            save_grid(x.view(10, 6, *x.shape[1:]).transpose(0, 1).reshape(-1, *x.shape[1:]), grid, nrow=10)
            rows.append({"model": preset, "objective": objective, "params": count_parameters(model),
                         "steps": cfg.quality_steps, "train_min": minutes, "grid": grid.name, **m})
    return {"rows": rows, "guidance": cfg.guidance, "sample_steps": cfg.sample_steps}


def report(payload: Dict[str, Any]) -> str:
    lines = []
    if "speed" in payload:
        p = payload["speed"]
        lines += ["forward seconds per image (equal width and depth)",
                  format_table(p["rows"], ["side", "tokens", "batch", "model", "s_per_image", "sit_over_sipom"],
                               ["side", "tokens", "batch", "model", "s / image", "SiT ÷ SiPoM"]),
                  f"images/s at batch {p.get('config', payload['config'])['throughput_batch']} and side "
                  f"{p['throughput_side']}: " +
                  ", ".join(f"{k} {v:.1f}" for k, v in p["images_per_s"].items()),
                  "params: " + ", ".join(f"{k} {v:,}" for k, v in p["params"].items())]
        faster = [r for r in p["rows"] if r.get("sit_over_sipom") is not None and r["tokens"] >= 1024]
        if faster:
            ok = all(r["sit_over_sipom"] > 1 for r in faster)
            lines.append(f"SiPoM faster than SiT from 1,024 tokens up: {'met' if ok else 'MISSED'}\n")
    if "quality" in payload:
        rows = payload["quality"]["rows"]
        lines += [f"digits, equal steps; {payload['quality']['sample_steps']} sampling steps, guidance "
                  f"{payload['quality']['guidance']}",
                  format_table(rows, ["model", "objective", "params", "steps", "cond_accuracy", "classifier_accuracy",
                                      "fd", "fd_real_floor", "train_min"],
                               ["model", "objective", "params", "steps", "cond. accuracy", "classifier acc.",
                                "Fréchet dist.", "real-vs-real", "train min"])]
        for obj in ("flow", "ddpm"):
            sit = next((r for r in rows if r["model"] == "tiny-sit" and r["objective"] == obj), None)
            pom = next((r for r in rows if r["model"] == "tiny-sipom" and r["objective"] == obj), None)
            if sit and pom:
                acc_ok = pom["cond_accuracy"] >= 0.9 and sit["cond_accuracy"] - pom["cond_accuracy"] <= 0.05
                fd_ok = pom["fd"] <= 1.5 * sit["fd"]
                lines.append(f"{obj}: SiPoM accuracy {100 * pom['cond_accuracy']:.1f}% vs SiT "
                             f"{100 * sit['cond_accuracy']:.1f}% ({'met' if acc_ok else 'MISSED'}: ≥ 90% and within "
                             f"5 points); FD {pom['fd']:.3g} vs {sit['fd']:.3g} ({pom['fd'] / sit['fd']:.2f}×, "
                             f"{'met' if fd_ok else 'MISSED'}: ≤ 1.5×)")
    return "\n".join(lines)


def plot(payload: Dict[str, Any], path: Path) -> None:
    if "speed" not in payload:
        return
    fig, (ax,) = new_figure(1, width=6.0)
    for m in ("SiT", "SiPoM"):
        pts = [(r["tokens"], r["s_per_image"]) for r in payload["speed"]["rows"] if r["model"] == m]
        ax.plot(*zip(*pts), marker="o", label=m)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens per image (side / patch)²")
    ax.set_ylabel("seconds per image (forward)")
    c = payload["config"]
    ax.set_title(f"{c['depth']} blocks × {c['hidden']}, patch {c['patch']} — {payload['machine']['cpu']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    save_figure(fig, path)


def run(cfg: ImageBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Run the parts asked for, keeping the other part of an earlier run in the same folder."""
    out = Path(cfg.out)
    payload = run_parts(cfg, out / "image.json", {"speed": run_speed, "quality": run_quality}, progress)
    plot(payload, out / "image.png")
    return payload


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = ImageBenchConfig()
    p.add_argument("--quick", action="store_true", help="a few-minute version of both parts")
    p.add_argument("--parts", nargs="+", choices=["speed", "quality"], default=list(d.parts))
    p.add_argument("--sides", type=int, nargs="+", default=None)
    p.add_argument("--pom-sides", type=int, nargs="*", default=None)
    p.add_argument("--quality-steps", type=int, default=None)
    p.add_argument("--objectives", nargs="+", choices=["flow", "ddpm"], default=list(d.objectives),
                   help="objectives of the quality part")
    p.add_argument("--out", default=d.out)


def main(args: argparse.Namespace) -> int:
    cfg = ImageBenchConfig(parts=tuple(args.parts), out=args.out, objectives=tuple(args.objectives))
    apply_overrides(cfg, QUICK if args.quick else None, args,
                    {name: name for name in ("sides", "pom_sides", "quality_steps")})
    payload = run(cfg)
    print(report(payload))
    print(f"\nwrote {Path(cfg.out) / 'image.json'}")
    return 0
