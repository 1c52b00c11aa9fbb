"""``polymixer bench image``: SiT vs SiPoM at CPU scale.

1. speed: seconds per image of a forward pass against the image side (tokens from 256 to 16k for both, and beyond
   for SiPoM alone), same width and depth, and images/s at a fixed batch — the paper's SiPoM-speed figure;
2. quality: tiny SiT, SiPoM and value-carrying SiPoM trained with equal steps on the digits default, with both
   objectives (flow matching and DDPM), scored by class-conditional accuracy and a Fréchet distance in a small
   classifier's feature space (``polymixer eval image``), with a sample grid of each model. Flow matching is trained
   at every rate of a learning-rate sweep (0.5×, 1×, 2× the recipe's rate) and each model reported at its best rate;
   DDPM runs use each model's best flow rate.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

from ...models import count_parameters, create_model
from ..report import format_table, new_figure, save_figure
from ..bench.parity import verdict_lines
from ..bench.common import (
    BRACKET, edge_note, FamilyBench, add_sweep_arguments, bench_main, run_bench, LR_FACTORS, best_rows, QualitySweep,
    Stage, SweepRun, mark_best, parse_variant, quality_rows, render_report, stale_rate_notes, sweep_table,
    synchronized, time_interleaved,
)
from ...ranges import Range
from ..tasks.common import float_in, int_at_least

__all__ = ["ImageBenchConfig", "run_speed", "run_quality", "report", "main", "add_arguments"]

# SiT, SiPoM, SiPoM with the value PoM, and local attention + value PoM (no full-attention block)
QUALITY = ("tiny-sit", "tiny-sipom", "tiny-sipom-value", "tiny-sipom-vhybrid")
BASELINE = "tiny-sit"  # the attention model every ratio is taken against
SWEPT = "flow"  # the objective trained at every rate of the sweep; the others at each model's best rate of it
RECIPE_LR = 1e-3  # the rate of the runs made before sweeps existed (rows without an "lr")
HELDOUT_SEED = 20  # the held-out split of the digits (--heldout): fixed, whatever the training seed


@dataclass
class ImageBenchConfig:
    hidden: int = 384
    depth: int = 4
    heads: int = 6
    patch: int = 2
    channels: int = 4
    sides: Tuple[int, ...] = (32, 64, 128, 256)  # 256 → 16,384 tokens at patch 2
    pom_sides: Tuple[int, ...] = (362, 512)  # 32,761 and 65,536 tokens, SiPoM only
    # quality presets in a compared form (tiny-sipom-value+position=sincos_rope) timed at every side of ``sides``
    # beside SiT and SiPoM: their mixer and options at the bench's width and depth
    forms: Tuple[str, ...] = ()
    tokens: int = 16384  # per forward call: batch = tokens / tokens-per-image
    repeats: int = 3
    throughput_batch: int = 64
    quality_steps: int = 1200  # ~11 min per model at batch 128 on 2 cores
    quality_batch: int = 128
    quality_presets: Tuple[str, ...] = QUALITY
    quality_lr: float = RECIPE_LR  # the recipe's rate: the middle of each sweep (cosine to lr / 10)
    lr_factors: Tuple[float, ...] = LR_FACTORS
    sweep: Tuple[str, ...] = QUALITY  # presets trained at every rate of the grid (flow objective)
    lrs: Tuple[float, ...] = ()  # run only these rates (several processes side by side); () = all
    bracket: int = BRACKET  # rates added past an end of the grid where a swept model is best there
    model_overrides: Dict[str, Any] = field(default_factory=dict)  # applied to every quality preset (tests: toy sizes)
    quality_samples: int = 500
    guidance: float = 2.0
    sample_steps: int = 30
    objectives: Tuple[str, ...] = ("flow", "ddpm")
    parts: Tuple[str, ...] = ("speed", "quality")
    device: str = "cpu"  # "cuda": the speed part on the GPU in bf16 (SiPoM on the Triton kernels, SiT on SDPA)
    seed: int = 0
    # > 0: this fraction of the digits (stratified, fixed) is held out of training, and every run also gets a
    # validation FD (independent samples against the held-out digits) that rates and options are chosen on; 0: the
    # recipe of the committed results (trained on every digit, chosen on the reported FD)
    heldout: float = 0.0
    out: str = "runs/bench/image"
    extra: Dict[str, Any] = field(default_factory=dict)


QUICK = dict(sides=(32, 64), pom_sides=(128,), tokens=4096, repeats=2, throughput_batch=16, quality_steps=100,
             quality_samples=200, sample_steps=10)


def _backbone(cfg: ImageBenchConfig, model: str, side: int) -> torch.nn.Module:
    """The speed part's model at the bench's width, depth, heads and patch: "attention" (SiT), "pom" (SiPoM) or a
    preset in a compared form, whose mixer and options it keeps (its own size fields are the bench's)."""
    preset, overrides = ("sipom-s/2", {}) if model == "pom" else ("sit-s/2", {}) if model == "attention" else \
        parse_variant(model)
    m = create_model(preset, **{**overrides, "input_size": side, "hidden_size": cfg.hidden, "depth": cfg.depth,
                                "num_heads": cfg.heads, "patch_size": cfg.patch, "in_channels": cfg.channels,
                                "num_classes": 10}).eval()
    dev = torch.device(cfg.device)
    return m.to(dev, torch.bfloat16) if dev.type == "cuda" else m


def _inputs(cfg: ImageBenchConfig, b: int, side: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dev = torch.device(cfg.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    return (torch.randn(b, cfg.channels, side, side, device=dev, dtype=dtype), torch.rand(b, device=dev) * 1000,
            torch.randint(0, 10, (b,), device=dev))


@torch.no_grad()
def run_speed(cfg: ImageBenchConfig, progress: bool = True) -> Dict[str, Any]:
    from tqdm.auto import tqdm

    torch.manual_seed(cfg.seed)
    dev = torch.device(cfg.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but PyTorch sees no CUDA device here")
    sides = sorted(set(cfg.sides) | set(cfg.pom_sides))
    per_side = 2 + len(cfg.forms)
    bar = tqdm(total=sum((per_side if s in cfg.sides else 1) * (cfg.repeats + 1) for s in sides), disable=not progress,
               desc="bench image speed", unit="call")
    rows = []
    for side in sides:
        tokens = (side // cfg.patch) ** 2
        b = max(1, cfg.tokens // tokens)
        mixers = ["attention", "pom", *cfg.forms] if side in cfg.sides else ["pom"]
        models = {m: _backbone(cfg, m, side) for m in mixers}
        x, t, y = _inputs(cfg, b, side)
        timing = time_interleaved({m: synchronized(lambda mod=mod: mod(x, t, y), dev) for m, mod in models.items()},
                                  warmup=1, repeats=cfg.repeats, on_sample=lambda name: bar.update(1))
        bar.update(len(models))
        for m in mixers:
            name = {"pom": "SiPoM", "attention": "SiT"}.get(m, m)
            rows.append({"side": side, "tokens": tokens, "batch": b, "model": name, "spec": name,
                         "s_per_image": timing[m].median / b})
    bar.close()
    for side in cfg.sides:
        sit = next(r for r in rows if r["side"] == side and r["model"] == "SiT")
        pom = next(r for r in rows if r["side"] == side and r["model"] == "SiPoM")
        pom["sit_over_sipom"] = sit["s_per_image"] / pom["s_per_image"]
    # images/s at a fixed batch, at the smallest side
    side = min(cfg.sides)
    models = {m: _backbone(cfg, m, side) for m in ("attention", "pom")}
    x, t, y = _inputs(cfg, cfg.throughput_batch, side)
    tp = time_interleaved({m: synchronized(lambda mod=mod: mod(x, t, y), dev) for m, mod in models.items()}, warmup=1,
                          repeats=cfg.repeats)
    throughput = {("SiPoM" if m == "pom" else "SiT"): cfg.throughput_batch / tp[m].median for m in models}
    params = {("SiPoM" if m == "pom" else "SiT"): count_parameters(mod) for m, mod in models.items()}
    return {"rows": rows, "images_per_s": throughput, "throughput_side": side, "params": params}


def _select(rows: List[Dict[str, Any]], cfg: ImageBenchConfig) -> List[Dict[str, Any]]:
    """Order the rows (objective, preset, rate), mark each model's best rate per objective (the lowest FD) and give
    each row its FD ÷ SiT's at SiT's best rate."""
    objectives = list(dict.fromkeys(["flow", "ddpm"] + list(cfg.objectives)))
    presets = list(dict.fromkeys(QUALITY + tuple(cfg.quality_presets) + tuple(sorted({r["model"] for r in rows}))))
    rows = sorted(rows, key=lambda r: (objectives.index(r["objective"]) if r["objective"] in objectives else 99,
                                       presets.index(r["model"]), r["lr"]))
    for obj in dict.fromkeys(r["objective"] for r in rows):
        mine = [r for r in rows if r["objective"] == obj]
        mark_best(mine, _selection(mine), higher=False, key="model")
        sit = next((r for r in best_rows(mine) if r["model"] == BASELINE), None)
        for r in mine:
            r["fd_vs_sit"] = r["fd"] / sit["fd"] if sit and sit["fd"] > 0 else None
    return rows


def _selection(rows: List[Dict[str, Any]]) -> str:
    """What rates are chosen on: the validation FD where every run has one (--heldout), else the reported FD."""
    return "fd_val" if rows and all(isinstance(r.get("fd_val"), (int, float)) for r in rows) else "fd"


def run_quality(cfg: ImageBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Train the quality presets for the same steps on the digits: with flow matching, each swept preset at every rate
    of the grid; with the other objectives, each preset at its best flow rate (the recipe's where it has no flow run
    yet). Finished runs are only evaluated again; runs of an earlier image.json not redone keep their rows."""
    from .data import digits, save_grid
    from .task import evaluate_generator, sample_images, train_image, validation_fd
    from ...checkpoint import load_weights
    from ..train.loop import TrainConfig

    data = digits(16)
    train_set, heldout = data.split(cfg.heldout, seed=HELDOUT_SEED) if cfg.heldout else (data, None)
    held = f"-heldout{cfg.heldout:g}" if cfg.heldout else ""  # trained on other images: its own folder

    def recipe(cfg: ImageBenchConfig, job: SweepRun, stage: Stage) -> Any:
        return TrainConfig(steps=cfg.quality_steps, batch_size=cfg.quality_batch, lr=job.lr, min_lr=job.lr / 10,
                           weight_decay=0.0, warmup=max(1, cfg.quality_steps // 20), ema=0.999,
                           eval_every=cfg.quality_steps, ckpt_every=cfg.quality_steps, out=str(job.out),
                           progress=progress, seed=cfg.seed + 7)

    def evaluate(cfg: ImageBenchConfig, job: SweepRun, stage: Stage,
                 tcfg: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        objective = stage.name
        # a preset, or a variant "preset+field=value…" of its config
        res = train_image(job.preset, tcfg, objective, eval_samples=0, images=train_set, **job.overrides)
        model = res["model"]
        load_weights(model, job.out, ema=True)
        m = evaluate_generator(model, objective, data, cfg.quality_samples, cfg.guidance, cfg.sample_steps,
                               progress=progress)
        if heldout is not None:
            m["fd_val"] = validation_fd(model, objective, data, heldout, cfg.quality_samples, cfg.guidance,
                                        cfg.sample_steps, progress=progress)
            m["heldout"] = cfg.heldout
        x, _ = sample_images(model, objective, list(range(10)), 6, 4.0, cfg.sample_steps, seed=1)
        suffix = job.out.name[len(f"{job.slug}-{objective}"):].replace("-", "_")  # "" at the recipe's rate
        grid = Path(cfg.out) / f"samples_{job.slug}_{objective}{suffix}.png"
        save_grid(x.view(10, 6, *x.shape[1:]).transpose(0, 1).reshape(-1, *x.shape[1:]), grid, nrow=10)
        return res, {"model": job.spec, "objective": objective, "params": count_parameters(model),
                     "pattern": model.config.layer_pattern(), "steps": cfg.quality_steps, "grid": grid.name, **m}

    def best_flow_rates(rows: List[Dict[str, Any]]) -> Dict[str, float]:
        """Each preset's best rate of the swept objective among the runs known now."""
        return {r["model"]: r["lr"] for r in rows if r["objective"] == SWEPT and r.get("best_lr")}

    # with flow matching, the swept presets at every rate; the other objectives at each preset's best flow rate
    stages = [Stage(tuple(cfg.quality_presets), name=o, suffix=f"-{o}{held}",
                    rates=None if o == SWEPT else best_flow_rates, rates_label=lambda p: f"best {SWEPT}")
              for o in cfg.objectives]
    sweep = QualitySweep("image", RECIPE_LR, ("model", "objective"), recipe, evaluate, _select,
                         lambda rows: _selection([r for r in rows if r["objective"] == SWEPT]), base="quality_lr",
                         stage_key="objective")
    return {**sweep.run(cfg, stages), "swept": SWEPT, "heldout": cfg.heldout, "guidance": cfg.guidance,
            "sample_steps": cfg.sample_steps}


def verdicts(payload: Dict[str, Any], seeds: Optional[List[Dict[str, Any]]] = None,
             main_json: Optional[Dict[str, Any]] = None) -> List[str]:
    """The issue's targets, each said met or MISSED with the measured figure, judged at each model's best rate; the
    parity targets as ``polymixer bench parity`` judges them, over the other seeds' JSONs in ``seeds``
    (:func:`~polymixer.experiments.bench.common.seed_payloads`)."""
    out: List[str] = []
    if "quality" not in payload:
        return out
    q = payload["quality"]
    rows = best_rows(quality_rows(q, RECIPE_LR))
    swept = q.get("swept", SWEPT)
    for obj in dict.fromkeys(r["objective"] for r in rows):
        mine = {r["model"]: r for r in rows if r["objective"] == obj}
        sit = mine.get(BASELINE)
        if sit is None:
            continue
        for name, label in (("tiny-sipom", "SiPoM"), ("tiny-sipom-value", "SiPoM value")):
            pom = mine.get(name)
            if pom is None:
                continue
            acc_ok = pom["cond_accuracy"] >= 0.9 and sit["cond_accuracy"] - pom["cond_accuracy"] <= 0.05
            fd_ok = pom["fd"] <= 1.5 * sit["fd"]
            out.append(f"{obj}: {label} accuracy {100 * pom['cond_accuracy']:.1f}% vs SiT "
                       f"{100 * sit['cond_accuracy']:.1f}% ({'met' if acc_ok else 'MISSED'}: ≥ 90% and within "
                       f"5 points); FD {pom['fd']:.3g} vs {sit['fd']:.3g} ({pom['fd'] / sit['fd']:.2f}×, "
                       f"{'met' if fd_ok else 'MISSED'}: ≤ 1.5×)")
    out += verdict_lines("image", payload, seeds, main_json)
    flow = {r["model"]: r for r in rows if r["objective"] == swept}  # the other objectives take its best rates
    out += stale_rate_notes(rows, lambda r: flow.get(r["model"]) if r["objective"] != swept else None,
                            lambda r: f"--objectives {r['objective']} --presets {r['model']}",
                            lambda r: f"{r['objective']} {r['model']}", lambda p: f"{swept} {p['model']}")
    return out


def _speed_report(payload: Dict[str, Any]) -> List[str]:
    p = payload["speed"]
    lines = ["forward seconds per image (equal width and depth)",
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
    return lines


def _quality_report(payload: Dict[str, Any]) -> List[str]:
    q = payload["quality"]
    all_rows = quality_rows(q, RECIPE_LR)
    swept = q.get("swept", SWEPT)
    held = q.get("heldout") or 0
    chosen = (f"the lowest validation FD (fd_val: independent samples against the {100 * held:g}% of the digits "
              f"held out of training)" if q.get("selected_by") == "fd_val" else
              "the lowest Fréchet distance (the digits have no held-out split — they are both the training data "
              "and the FD reference — so the rate is chosen on the reported FD itself; --heldout gives one)")
    lines = [f"digits, equal steps; {q['sample_steps']} sampling steps, guidance {q['guidance']}; each model at "
             f"its best learning rate: {chosen}; "
             f"{swept} is swept, the other objectives are trained at each model's best {swept} rate "
             f"(lr from: best {swept}) and not swept",
             format_table(best_rows(all_rows), ["model", "objective", "params", "lr", "rates", "lr_from", "steps",
                                                "cond_accuracy", "classifier_accuracy", "fd", "fd_vs_sit",
                                                "fd_real_floor"] + (["fd_val"] if held else []) + ["train_min"],
                          ["model", "objective", "params", "best lr", "rates tried", "lr from", "steps",
                           "cond. accuracy", "classifier acc.", "Fréchet dist.", "÷ SiT", "real-vs-real"]
                          + (["validation FD"] if held else []) + ["train min"]),
             "", "every rate (AdamW, warm-up then cosine to lr / 10; * = best)"]
    for obj in dict.fromkeys(r["objective"] for r in all_rows):
        mine = [r for r in all_rows if r["objective"] == obj]
        lines += [sweep_table(mine, "fd", f"{obj} FD", key="model")] + [
            note for note in [edge_note(mine, key="model")] if note]
    return lines


def report(payload: Dict[str, Any], seeds: Optional[List[Dict[str, Any]]] = None,
           main_json: Optional[Dict[str, Any]] = None) -> str:
    """The image bench's text: seconds per image, then the quality sweep with its verdicts (``seeds``: the other
    seeds' JSONs; ``main_json``: the family's main JSON where ``payload`` is a seed folder's)."""
    tail = [""] + verdicts(payload, seeds, main_json) if "quality" in payload else []
    return render_report(payload, {"speed": _speed_report, "quality": _quality_report}, tail)


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


BENCH = FamilyBench("image", {"speed": run_speed, "quality": run_quality}, plot, report,
                    recipes=(("heldout", 0.0, "--heldout"),))


def run(cfg: ImageBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Run the parts asked for, keeping the other part of an earlier run in the same folder."""
    return run_bench(BENCH, cfg, progress)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = ImageBenchConfig()
    p.add_argument("--quick", action="store_true", help="a few-minute version of both parts")
    p.add_argument("--parts", nargs="+", choices=["speed", "quality"], default=list(d.parts))
    p.add_argument("--device", default=d.device,
                   help="cuda: the speed part on the GPU in bf16 (SiPoM on the Triton kernels, SiT on SDPA)")
    p.add_argument("--sides", type=int_at_least(1), nargs="+", default=None)
    p.add_argument("--pom-sides", type=int_at_least(1), nargs="*", default=None)
    p.add_argument("--forms", nargs="*", default=None,
                   help="quality presets in a compared form (e.g. tiny-sipom-value+position=sincos_rope) timed at "
                        "every --sides beside SiT and SiPoM, with their mixer and options at the bench's size")
    p.add_argument("--quality-steps", type=int_at_least(1), default=None)
    p.add_argument("--objectives", nargs="+", choices=["flow", "ddpm"], default=list(d.objectives),
                   help="objectives of the quality part (ddpm runs take each preset's best flow rate)")
    p.add_argument("--presets", nargs="+", default=None,
                   help=f"presets of the quality part, ratios taken against {BASELINE} (default: "
                        f"{' '.join(d.quality_presets)}; runs not redone keep their earlier rows); a variant "
                        f"overrides fields of its preset's config: tiny-sipom-value+value_heads=4+shift_width=4")
    p.add_argument("--heldout", type=float_in(Range(0, 1, high_open=True)), default=None,
                   help="hold this fraction of the digits out of training (e.g. 0.15) and choose rates and options "
                        "on a validation FD against them (independent samples); default 0: the committed results' "
                        "recipe, chosen on the reported FD; one --out per value")
    add_sweep_arguments(p, "image", d.quality_lr, d.lr_factors, d.out, sweep_note="with flow matching",
                        lrs_note="a ddpm run's rate is its preset's best flow rate")


def main(args: argparse.Namespace) -> int:
    cfg = ImageBenchConfig(parts=tuple(args.parts), out=args.out, objectives=tuple(args.objectives),
                           device=args.device)
    return bench_main(BENCH, args, cfg, QUICK, {**{name: name for name in ("sides", "pom_sides", "forms",
                                                                          "quality_steps", "heldout")},
                                                "presets": "quality_presets"})
