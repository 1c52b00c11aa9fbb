"""``polymixer bench distill``: converting a trained attention LM into a hybrid / all-PoM one, against training
those from scratch on the same token budget.

1. The teacher: the ``tiny-attention`` preset trained on the default corpus with the recipe of the README's LM
   quality table (1,500 steps of 32 × 256 tokens, AdamW 2e-3 → 2e-4).
2. For each student pattern (hybrid = local attention + PoM pairs, and all-PoM): ``distill lm`` — stage 1 (attention
   transfer) then stage 2 (fine-tuning) — within ``budget`` × the teacher's training tokens in all; and the same
   architecture trained from scratch for that many tokens (the README recipe, scaled to the budget).
3. Validation loss / bits per byte on the same held-out windows, against tokens spent (``distill.png``), the table
   (``distill.txt``) and everything in ``distill.json``.

Runs live in ``<out>/quality/distill-*`` and ``<out>/quality/scratch-*``; an interrupted bench continues them.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ...models import count_parameters, create_model, model_config
from ..report import format_table, new_figure, save_figure
from ..bench.common import apply_overrides, read_json, resume_point, run_parts, training_claim, training_minutes
from ...ranges import Range
from ..tasks.common import float_in, int_at_least

__all__ = ["DistillBenchConfig", "run_quality", "report", "plot", "run", "main", "add_arguments"]

PATTERNS = {"hybrid": "tiny-hybrid", "pom": "tiny-pom"}  # student pattern → the from-scratch preset of that shape


@dataclass
class DistillBenchConfig:
    teacher_preset: str = "tiny-attention"
    teacher_steps: int = 1500
    batch: int = 32
    budget: float = 0.25  # of the teacher's training tokens, for each student (both stages together)
    stage1_steps: int = 50
    stage1_lr: float = 1e-3
    finetune_lr: float = 4e-3  # measured on the hybrid: 1e-3 → +4.2%, 2e-3 → +2.9%, 4e-3 → +2.6% vs the teacher
    kl: float = 1.0  # at 4e-3: without KL +4.6%; at 1e-3: KL weight 4 worse than 1
    students: Tuple[str, ...] = ("hybrid", "pom")
    ablate_stage1: bool = True  # also distil the hybrid with fine-tuning alone (the whole budget in stage 2)
    eval_every: int = 50
    eval_windows: int = 1024
    data: Optional[Tuple[str, ...]] = None  # default corpus
    model_overrides: Dict[str, Any] = field(default_factory=dict)  # for the teacher and the scratch students
    parts: Tuple[str, ...] = ("quality",)
    seed: int = 0  # runs use seed + 1337, as bench lm and the train commands do
    out: str = "runs/bench/distill"

    @property
    def budget_steps(self) -> int:
        return max(1, int(round(self.budget * self.teacher_steps)))


QUICK = dict(teacher_steps=120, stage1_steps=10, eval_every=10, eval_windows=64)


def _history(run: Path) -> List[Dict[str, Any]]:
    f = run / "history.json"
    return read_json(f) if f.is_file() else []


def _evals(history: List[Dict[str, Any]], tokens_per_step: int, offset: int = 0) -> List[Dict[str, float]]:
    return [{"tokens": offset + r["step"] * tokens_per_step, "val_loss": r["eval_val_loss"],
             "val_bpb": r["eval_val_bpb"], **({"transfer": r["eval_transfer"]} if "eval_transfer" in r else {})}
            for r in history if "eval_val_loss" in r]


def _train_scratch(cfg: DistillBenchConfig, preset: str, steps: int, out: Path, progress: bool,
                   eval_every: int) -> Dict[str, Any]:
    from ..lm.task import train_lm
    from ..train.loop import TrainConfig

    tcfg = TrainConfig(steps=steps, batch_size=cfg.batch, lr=2e-3, min_lr=2e-4, warmup=max(1, steps // 20),
                       eval_every=eval_every, ckpt_every=min(500, steps), out=str(out), progress=progress,
                       seed=cfg.seed + 1337)
    with training_claim(out, wait=True):  # a bench beside this one (other students) needs the same teacher
        finished = resume_point(out, tcfg)
        t0 = time.perf_counter()
        train_lm(preset, tcfg, data=list(cfg.data) if cfg.data else None, eval_windows=cfg.eval_windows,
                 **cfg.model_overrides)
    history = _history(out)
    units = cfg.batch * model_config(preset, **cfg.model_overrides).block_size  # the loop counts tokens
    return {"minutes": training_minutes(out, t0, finished, history, cfg.batch, units_per_step=units),
            "history": history}


def run_quality(cfg: DistillBenchConfig, progress: bool = True) -> Dict[str, Any]:
    from .task import DistillConfig, distill_lm
    from ..train.loop import TrainConfig

    root = Path(cfg.out) / "quality"
    block = model_config(cfg.teacher_preset, **cfg.model_overrides).block_size
    per_step = cfg.batch * block
    teacher_dir = root / "distill-teacher"
    teacher = _train_scratch(cfg, cfg.teacher_preset, cfg.teacher_steps, teacher_dir, progress, cfg.teacher_steps)
    t_eval = _evals(teacher["history"], per_step)[-1]
    rows: List[Dict[str, Any]] = [{"model": "teacher (attention)", "method": "trained", "steps": cfg.teacher_steps,
                                   "tokens": cfg.teacher_steps * per_step, "val_loss": t_eval["val_loss"],
                                   "val_bpb": t_eval["val_bpb"], "train_min": teacher["minutes"],
                                   "params": count_parameters(create_model(cfg.teacher_preset, device="meta",
                                                                           **cfg.model_overrides))}]
    curves: Dict[str, List[Dict[str, float]]] = {}

    def distil(pattern: str, stage1: int, name: str, label: str) -> None:
        """Stage 1 + stage 2 within the budget; a row and a curve."""
        out = root / name
        s2_steps = cfg.budget_steps - stage1
        if s2_steps < 1:
            raise ValueError(f"stage 1 ({stage1} steps) leaves nothing of a {cfg.budget_steps}-step budget")
        dcfg = DistillConfig(pattern=pattern, stage1_steps=stage1, stage1_lr=cfg.stage1_lr, kl=cfg.kl)
        tcfg = TrainConfig(steps=s2_steps, batch_size=cfg.batch, lr=cfg.finetune_lr, min_lr=cfg.finetune_lr / 10,
                           warmup=max(1, s2_steps // 10), eval_every=cfg.eval_every, ckpt_every=s2_steps,
                           out=str(out), progress=progress, seed=cfg.seed + 1337)
        finished = resume_point(out, tcfg)
        t0 = time.perf_counter()
        res = distill_lm(str(teacher_dir), dcfg, tcfg, list(cfg.data) if cfg.data else None,
                         eval_windows=cfg.eval_windows)
        s1 = _evals(_history(out / "stage1"), per_step) if stage1 else []
        s2 = _evals(_history(out), per_step, offset=stage1 * per_step)
        curves[f"{label} {pattern}"] = s1 + s2
        rows.append({"model": pattern, "method": label, "steps": cfg.budget_steps,
                     "tokens": cfg.budget_steps * per_step, "val_loss": s2[-1]["val_loss"],
                     "val_bpb": s2[-1]["val_bpb"], "after_stage1": s1[-1]["val_loss"] if s1 else None,
                     "transfer": s1[-1].get("transfer") if s1 else None,
                     "train_min": training_minutes(out, t0, finished, [], cfg.batch),
                     "params": count_parameters(res["student"])})

    for pattern in cfg.students:
        distil(pattern, cfg.stage1_steps, f"distill-{pattern}", "distilled")
        if cfg.ablate_stage1 and pattern == "hybrid" and cfg.stage1_steps:
            distil(pattern, 0, f"distill-{pattern}-finetune-only", "fine-tuned only")
        sc = _train_scratch(cfg, PATTERNS[pattern], cfg.budget_steps, root / f"scratch-{pattern}", progress,
                            cfg.eval_every)
        ev = _evals(sc["history"], per_step)
        curves[f"scratch {pattern}"] = ev
        rows.append({"model": pattern, "method": "from scratch", "steps": cfg.budget_steps,
                     "tokens": cfg.budget_steps * per_step, "val_loss": ev[-1]["val_loss"],
                     "val_bpb": ev[-1]["val_bpb"], "train_min": sc["minutes"],
                     "params": count_parameters(create_model(PATTERNS[pattern], device="meta",
                                                             **cfg.model_overrides))})
    for r in rows:
        r["vs_teacher"] = r["val_loss"] / rows[0]["val_loss"]
    return {"rows": rows, "curves": curves, "teacher_tokens": cfg.teacher_steps * per_step}


def verdicts(payload: Dict[str, Any]) -> List[str]:
    rows = payload["quality"]["rows"]
    by = {(r["model"], r["method"]): r for r in rows}
    lines = []
    d, s = by.get(("hybrid", "distilled")), by.get(("hybrid", "from scratch"))
    if d:
        gap = d["vs_teacher"] - 1
        lines.append(f"distilled hybrid vs teacher val loss: {100 * gap:+.2f}% (target within 2%: "
                     f"{'met' if gap <= 0.02 else 'MISSED'})")
    if d and s:
        lines.append(f"distilled hybrid vs from-scratch hybrid at equal budget: {d['val_loss']:.4f} vs "
                     f"{s['val_loss']:.4f} (target ahead: {'met' if d['val_loss'] < s['val_loss'] else 'MISSED'})")
    f = by.get(("hybrid", "fine-tuned only"))
    if d and f:
        lines.append(f"hybrid fine-tuned alone (no attention transfer) on the same budget: {f['val_loss']:.4f} "
                     f"({100 * (f['vs_teacher'] - 1):+.2f}% vs the teacher)")
    p, ps = by.get(("pom", "distilled")), by.get(("pom", "from scratch"))
    if p:
        lines.append(f"distilled all-PoM: val loss {p['val_loss']:.4f} ({100 * (p['vs_teacher'] - 1):+.1f}% vs the "
                     f"teacher" + (f"; from scratch {ps['val_loss']:.4f}" if ps else "") + ")")
    return lines


def report(payload: Dict[str, Any]) -> str:
    if "quality" not in payload:
        return ""
    q = payload["quality"]
    c = payload["config"]
    head = (f"distillation at {100 * c['budget']:.0f}% of the teacher's {q['teacher_tokens']:,} training tokens "
            f"(stage 1: {c['stage1_steps']} steps of attention transfer; the rest fine-tuning)")
    precise = {"after_stage1": 4, "val_loss": 4, "val_bpb": 4, "vs_teacher": 4, "train_min": 1}
    shown = [{k: f"{v:.{precise[k]}f}" if k in precise and isinstance(v, float) else v for k, v in r.items()}
             for r in q["rows"]]
    table = format_table(shown, ["model", "method", "params", "steps", "tokens", "after_stage1", "val_loss",
                                     "val_bpb", "vs_teacher", "train_min"],
                         ["student", "method", "params", "steps", "tokens", "loss after stage 1", "val loss",
                          "val bpb", "÷ teacher", "train min"])
    return "\n".join([head, table, "", *verdicts(payload)])


def plot(payload: Dict[str, Any], path: Path) -> None:
    if "quality" not in payload:
        return
    q = payload["quality"]
    fig, (ax, ax2) = new_figure(2)
    styles = {"distilled": "-", "fine-tuned only": ":", "scratch": "--"}
    colours = {"hybrid": "tab:green", "pom": "tab:orange"}
    for name, pts in q["curves"].items():
        method, pattern = name.rsplit(" ", 1)
        if pts:
            ax.plot([p["tokens"] / 1e6 for p in pts], [p["val_loss"] for p in pts], styles[method], marker="o",
                    ms=3, color=colours.get(pattern), label=name)
    teacher = q["rows"][0]
    ax.axhline(teacher["val_loss"], color="k", lw=1, label=f"teacher ({teacher['tokens'] / 1e6:.1f}M tokens)")
    ax.axhline(teacher["val_loss"] * 1.02, color="k", lw=0.6, ls=":", label="teacher + 2%")
    ax.axvline(payload["config"]["stage1_steps"] * teacher["tokens"] / teacher["steps"] / 1e6, color="grey",
               lw=0.6, ls="-.")
    ax.set_xlabel("tokens spent by the student (M)")
    ax.set_ylabel("val loss (nats / token)")
    ax.set_title("val loss vs tokens (stage 1 | stage 2)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    rows = [r for r in q["rows"]]
    labels = [f"{r['model']}\n{r['method'].replace(' only', '')}" if r["method"] != "trained" else "teacher"
              for r in rows]
    bars = ax2.bar(range(len(rows)), [r["val_bpb"] for r in rows],
                   color=[colours.get(r["model"], "grey") for r in rows])
    for b, r in zip(bars, rows):
        b.set_hatch("" if r["method"] != "from scratch" else "//")
        b.set_alpha(0.6 if r["method"] == "fine-tuned only" else 1.0)
        ax2.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{r['val_bpb']:.3f}", ha="center", va="bottom",
                 fontsize=7)
    ax2.set_xticks(range(len(rows)))
    ax2.set_xticklabels(labels, fontsize=7)
    ax2.set_ylabel("val bits per byte")
    ax2.set_title("at the end of the budget")
    fig.suptitle(f"distilling {payload['config']['teacher_preset']} — {payload['machine']['cpu']}", fontsize=9)
    save_figure(fig, path)


def run(cfg: DistillBenchConfig, progress: bool = True) -> Dict[str, Any]:
    out = Path(cfg.out)
    payload = run_parts(cfg, out / "distill.json", {"quality": run_quality}, progress)
    plot(payload, out / "distill.png")
    (out / "distill.txt").write_text(report(payload) + "\n")
    return payload


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = DistillBenchConfig()
    p.add_argument("--quick", action="store_true", help="a few-minute version (short teacher, short budget)")
    p.add_argument("--teacher-steps", type=int_at_least(1), default=None)
    p.add_argument("--budget", type=float_in(Range(0, low_open=True)), default=None,
                   help="student tokens as a fraction of the teacher's")
    p.add_argument("--stage1-steps", type=int_at_least(0), default=None)
    p.add_argument("--finetune-lr", type=float_in(Range(0, low_open=True)), default=None)
    p.add_argument("--kl", type=float_in(Range(0)), default=None,
                   help="weight of KL to the teacher's logits in stage 2")
    p.add_argument("--students", nargs="+", choices=list(PATTERNS), default=list(d.students))
    p.add_argument("--seed", type=int_at_least(0), default=d.seed)
    p.add_argument("--out", default=d.out)


def main(args: argparse.Namespace) -> int:
    cfg = DistillBenchConfig(students=tuple(args.students), seed=args.seed, out=args.out)
    apply_overrides(cfg, QUICK if args.quick else None, args,
                    {"teacher_steps": "teacher_steps", "budget": "budget", "stage1_steps": "stage1_steps",
                     "finetune_lr": "finetune_lr", "kl": "kl"})
    payload = run(cfg)
    print(report(payload))
    print(f"\nwrote {Path(cfg.out) / 'distill.json'}, distill.txt and distill.png")
    return 0
