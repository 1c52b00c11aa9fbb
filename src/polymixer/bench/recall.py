"""``polymixer bench recall``: multi-query associative recall (MQAR) across mixers and state sizes.

Zoology's probe, which separates sub-quadratic mixers by how much they can recall. 2-layer models of width 64 over
a vocabulary of 2,048 are trained by the shared loop on MQAR batches generated on the fly (2,000 steps of 64
sequences, AdamW 1e-3 with warm-up and cosine decay), then scored on 1,000 held-out examples. The score is the
fraction of queries whose value is the argmax. Every point runs with several seeds and reports the median and the
spread.

Mixers: attention, sliding-window attention, PoM, the value-carrying PoM, a hybrid (sliding window + value PoM), and
two baselines, linear attention with the identity feature map and Based (the Taylor map). The sub-quadratic mixers
come at about 1k, 4k and 16k floats of state per layer. Two parts:

- ``state``: accuracy against state floats per layer at (L, K) = (64, 16), the plot people expect from Zoology.
- ``length``: the 16k-state mixers and attention as the sequence and the number of pairs grow, up to (512, 64).

Runs live in ``<out>/quality/recall/<variant>-L<L>-K<K>-s<seed>``, and each finished run leaves ``result.json``,
so an interrupted bench continues where it stopped. Outputs: ``recall.txt``, ``recall.json``, ``recall.png``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..report import format_table, new_figure, save_figure
from .common import apply_overrides, run_parts

__all__ = ["RecallBenchConfig", "VARIANTS", "run", "report", "plot", "main", "add_arguments"]

# name → (preset, RecallConfig overrides, mixer family for the plot)
VARIANTS: Dict[str, Tuple[str, Dict[str, Any], str]] = {
    "attention": ("mqar-attention", {}, "attention"),
    "attention-rope": ("mqar-attention", {"rope": True}, "attention (rotary)"),
    "attention-shift": ("mqar-attention", {"token_shift": True}, "attention + shift"),
    "swa-8": ("mqar-swa", {"window": 8}, "sliding window"),
    "swa-32": ("mqar-swa", {"window": 32}, "sliding window"),
    "pom": ("mqar-pom", {"expand": 4}, "PoM"),
    "vpom-1k": ("mqar-vpom", {"expand": 1, "value_dim": 16}, "value PoM"),
    "vpom-4k": ("mqar-vpom", {"expand": 2, "value_dim": 32}, "value PoM"),
    "vpom-16k": ("mqar-vpom", {"expand": 4, "value_dim": 64}, "value PoM"),
    "hybrid-LV": ("mqar-vpom", {"mixer": "LV", "expand": 4, "value_dim": 64, "window": 16}, "hybrid (L + value PoM)"),
    # Based and linear attention with the value PoM's token shift (Based's short convolution): a comparison of the
    # feature map and the state, all else equal
    "based-1k": ("mqar-based", {"feature_dim": 4, "value_dim": 48, "token_shift": True}, "Based"),
    "based-4k": ("mqar-based", {"feature_dim": 8, "value_dim": 56, "token_shift": True}, "Based"),
    "based-16k": ("mqar-based", {"feature_dim": 16, "value_dim": 60, "token_shift": True}, "Based"),
    "based-noshift-16k": ("mqar-based", {"feature_dim": 16, "value_dim": 60}, "Based, no shift"),
    "linear-1k": ("mqar-linear", {"feature_dim": 16, "value_dim": 64, "token_shift": True}, "linear attention"),
    "linear-4k": ("mqar-linear", {"feature_dim": 64, "value_dim": 64, "token_shift": True}, "linear attention"),
    "linear-16k": ("mqar-linear", {"feature_dim": 256, "value_dim": 64, "token_shift": True}, "linear attention"),
}


@dataclass
class RecallBenchConfig:
    vocab_size: int = 2048
    d_model: int = 64
    steps: int = 2000
    batch: int = 64
    lr: float = 1e-3
    seeds: Tuple[int, ...] = (0, 1, 2)
    state_point: Tuple[int, int] = (64, 16)  # (seq_len, num_kv_pairs) of the state sweep
    state_variants: Tuple[str, ...] = tuple(VARIANTS)
    length_points: Tuple[Tuple[int, int], ...] = ((64, 8), (128, 32), (256, 64), (512, 64))
    length_variants: Tuple[str, ...] = ("attention", "vpom-16k", "based-16k")
    test_examples: int = 1000
    parts: Tuple[str, ...] = ("state", "length")
    train: bool = True  # False (--collect): report the runs that have finished, train nothing
    compile: bool = False  # torch.compile the models (the same runs, faster on CPU)
    out: str = "runs/bench/recall"


QUICK = dict(steps=150, seeds=(0,), state_point=(32, 4), state_variants=("attention", "pom", "vpom-4k", "based-4k"),
             length_points=((32, 4), (64, 8)), length_variants=("vpom-4k",), test_examples=200)


def _run(cfg: RecallBenchConfig, variant: str, seq_len: int, pairs: int, seed: int, progress: bool
         ) -> Optional[Dict[str, Any]]:
    """Train one (variant, point, seed), or read the result a finished earlier run left (None: not run yet and
    ``cfg.train`` is off)."""
    from ..tasks.recall import train_recall
    from ..train.loop import TrainConfig

    preset, overrides, family = VARIANTS[variant]
    budget = "" if (cfg.steps, cfg.lr) == (2000, 1e-3) else f"-{cfg.steps}steps-lr{cfg.lr:g}"
    out = Path(cfg.out) / "quality" / "recall" / f"{variant}-L{seq_len}-K{pairs}-s{seed}{budget}"
    tcfg = TrainConfig(steps=cfg.steps, batch_size=cfg.batch, lr=cfg.lr, min_lr=cfg.lr / 10,
                       warmup=max(1, cfg.steps // 20), weight_decay=0.1, beta2=0.98, eval_every=cfg.steps,
                       ckpt_every=max(1, cfg.steps // 4), log_every=50, seed=1337 + seed, out=str(out),
                       progress=progress, compile=cfg.compile)
    key = {"tcfg": asdict(tcfg), "overrides": overrides, "preset": preset, "pairs": pairs, "seq_len": seq_len,
           "vocab": cfg.vocab_size, "d_model": cfg.d_model, "test": cfg.test_examples}
    record = out / "result.json"
    if record.is_file():  # where the run folder sits and whether it showed progress change nothing
        saved = json.loads(record.read_text())
        if _comparable(saved.get("key", {})) == _comparable(json.loads(json.dumps(key))):
            return saved["result"]
    if not cfg.train:
        return None
    t0 = time.perf_counter()
    res = train_recall(preset, tcfg, num_kv_pairs=pairs, test_examples=cfg.test_examples, seq_len=seq_len,
                       vocab_size=cfg.vocab_size, d_model=cfg.d_model, **overrides)
    model = res["model"]
    result = {"variant": variant, "family": family, "seq_len": seq_len, "pairs": pairs, "seed": seed,
              "steps": cfg.steps, "lr": cfg.lr,
              "accuracy": res["metrics"]["accuracy"], "loss": res["metrics"]["loss"],
              "state_floats": model.state_floats(), "params": sum(p.numel() for p in model.parameters()),
              "minutes": (time.perf_counter() - t0) / 60}
    record.write_text(json.dumps({"key": key, "result": result}, indent=1))
    return result


def _comparable(key: Dict[str, Any]) -> Dict[str, Any]:
    tcfg = {k: v for k, v in key.get("tcfg", {}).items() if k not in ("out", "progress", "compile")}
    return {**key, "tcfg": tcfg}


def _summarise(results: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    rows: Dict[Tuple[str, int, int], Dict[str, Any]] = {}
    for r in results:
        r = {"steps": 2000, "lr": 1e-3, **r}  # runs recorded before the budget was
        row = rows.setdefault((r["variant"], r["seq_len"], r["pairs"], r["steps"], r["lr"]),
                              {k: r[k] for k in ("variant", "family", "seq_len", "pairs", "state_floats", "params",
                                                 "steps", "lr")} | {"accuracies": []})
        row["accuracies"].append(r["accuracy"])
    for row in rows.values():
        a = row["accuracies"]
        row.update(median=statistics.median(a), low=min(a), high=max(a), seeds=len(a))
    return list(rows.values())


def _part(points: List[Tuple[int, int]], variants: Tuple[str, ...]):
    def part(cfg: RecallBenchConfig, progress: bool) -> Dict[str, Any]:
        results = [_run(cfg, v, L, K, s, progress) for (L, K) in points for v in variants for s in cfg.seeds]
        results = [r for r in results if r is not None]
        return {"runs": results, "rows": _summarise(results)}
    return part


def run(cfg: RecallBenchConfig, progress: bool = True) -> Dict[str, Any]:
    unknown = [v for v in list(cfg.state_variants) + list(cfg.length_variants) if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    parts = {"state": lambda c, p: _part([tuple(c.state_point)], c.state_variants)(c, p),
             "length": lambda c, p: _part([tuple(x) for x in c.length_points], c.length_variants)(c, p)}
    payload = run_parts(cfg, Path(cfg.out) / "recall.json", parts, progress)
    out = Path(cfg.out)
    (out / "recall.txt").write_text(report(payload) + "\n")
    plot(payload, out / "recall.png")
    return payload


def report(payload: Dict[str, Any]) -> str:
    cols = ["variant", "family", "seq_len", "pairs", "state_floats", "steps", "lr", "median", "low", "high", "seeds"]
    heads = ["variant", "mixer", "L", "K", "state floats / layer", "steps", "lr", "accuracy (median)", "min", "max",
             "seeds"]
    out = []
    for name in ("state", "length"):
        if name in payload:
            rows = sorted(payload[name]["rows"], key=lambda r: (r["seq_len"], r["pairs"], r["family"],
                                                                  r["state_floats"]))
            shown = [{**r, "lr": f"{r['lr']:g}", **{k: f"{r[k]:.4f}" for k in ("median", "low", "high")}}
                     for r in rows]
            out.append(f"{name}:\n" + format_table(shown, cols, heads))
    out += _targets(payload)
    return "\n\n".join(out)


def _targets(payload: Dict[str, Any]) -> List[str]:
    """The issue's targets, each judged on the rows trained with the same budget (steps, lr)."""
    rows = [r for name in ("state", "length") for r in payload.get(name, {}).get("rows", [])]
    by = {(r["variant"], r["seq_len"], r["pairs"], r["steps"], r["lr"]): r for r in rows}
    lines = []
    for steps, lr in sorted({(r["steps"], r["lr"]) for r in rows}):
        budget = f"{steps} steps, lr {lr:g}"
        v = by.get(("vpom-16k", 64, 16, steps, lr))
        if v:
            ok = v["seeds"] >= 3 and v["low"] >= 0.99
            lines.append(f"value PoM, 16k state, K = 16, L = 64 ({budget}): "
                         f"{', '.join(f'{a:.4f}' for a in v['accuracies'])} "
                         f"(target ≥ 0.99 on 3 of 3 seeds: {'met' if ok else 'MISSED'})")
        v = by.get(("vpom-16k", 256, 64, steps, lr))
        if v:
            lines.append(f"value PoM, 16k state, K = 64, L = 256 ({budget}): median {v['median']:.3f} over "
                         f"{v['seeds']} seed(s) (target ≥ 0.9: {'met' if v['median'] >= 0.9 else 'MISSED'})")
        for size in ("1k", "4k", "16k"):
            a, b = by.get((f"vpom-{size}", 64, 16, steps, lr)), by.get((f"based-{size}", 64, 16, steps, lr))
            if a and b:
                ok = a["median"] >= b["median"] - 0.01
                lines.append(f"{size} state at K = 16, L = 64 ({budget}): value PoM {a['median']:.4f} "
                             f"({a['seeds']} seeds) vs Based {b['median']:.4f} ({b['seeds']} seeds) "
                             f"(target at least level: {'met' if ok else 'MISSED'})")
    return ["\n".join(lines)] if lines else []


def plot(payload: Dict[str, Any], path: Path) -> None:
    """Accuracy against state floats per layer (state sweep) and against sequence length (length sweep)."""
    fig, axes = new_figure(2, width=5.4, height=4.0)
    markers = {"attention": "*", "attention (rotary)": "P", "attention + shift": "X", "sliding window": "s",
               "PoM": "v", "value PoM": "o", "hybrid (L + value PoM)": "D", "Based": "^", "Based, no shift": "<",
               "linear attention": "x"}
    ax = axes[0]
    for k, fam in enumerate(markers):
        rows = sorted((r for r in payload.get("state", {}).get("rows", []) if r["family"] == fam),
                      key=lambda r: r["state_floats"])
        if not rows:
            continue
        x = [r["state_floats"] for r in rows]
        y = [r["median"] for r in rows]
        err = [[r["median"] - r["low"] for r in rows], [r["high"] - r["median"] for r in rows]]
        ax.errorbar(x, y, yerr=err, marker=markers[fam], color=f"C{k}", label=fam, capsize=3)
    if payload.get("state", {}).get("rows"):
        L, K = payload["state"]["rows"][0]["seq_len"], payload["state"]["rows"][0]["pairs"]
        ax.set_title(f"MQAR, L = {L}, K = {K} (median and range over seeds)", fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("state floats per layer")
    ax.set_ylabel("accuracy")
    ax2 = axes[1]
    length = payload.get("length", {}).get("rows", [])
    for k, variant in enumerate(dict.fromkeys(r["variant"] for r in length)):
        rows = sorted((r for r in length if r["variant"] == variant), key=lambda r: r["seq_len"])
        ax2.errorbar([r["seq_len"] for r in rows], [r["median"] for r in rows],
                     yerr=[[r["median"] - r["low"] for r in rows], [r["high"] - r["median"] for r in rows]],
                     marker="o", capsize=3, label=variant, color=f"C{k}")
        for r in rows:
            ax2.annotate(f"K={r['pairs']}", (r["seq_len"], r["median"]), fontsize=6, xytext=(3, -8),
                         textcoords="offset points")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("sequence length L (K pairs annotated)")
    ax2.set_title("longer sequences, more pairs", fontsize=9)
    if not length:
        ax2.text(0.5, 0.5, "not measured yet", ha="center", va="center", transform=ax2.transAxes)
    for a in (ax, ax2):
        a.set_ylim(-0.02, 1.02)
        a.grid(True, which="both", alpha=0.3)
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7)
    save_figure(fig, path)


def _point(text: str) -> Tuple[int, int]:
    """``"L:K"`` → (L, K)."""
    try:
        L, K = (int(t) for t in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a length point is L:K (e.g. 256:64), got {text!r}") from None
    return L, K


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = RecallBenchConfig()
    p.add_argument("--quick", action="store_true", help="a few-minute version (150 steps, 1 seed, 4 mixers)")
    p.add_argument("--parts", nargs="+", choices=["state", "length"], default=list(d.parts))
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--seeds", type=int, nargs="+", default=None)
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=None,
                   help="mixers of the state sweep (default: all)")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--length-points", nargs="+", type=_point, default=None, metavar="L:K",
                   help="(sequence length, pairs) of the length sweep, e.g. 64:8 512:64")
    p.add_argument("--length-variants", nargs="+", choices=list(VARIANTS), default=None,
                   help="mixers of the length sweep (default: attention, vpom-16k, based-16k)")
    p.add_argument("--compile", action="store_true", help="torch.compile the models (same runs, same results key)")
    p.add_argument("--collect", action="store_true",
                   help="report the runs that have finished (e.g. trained elsewhere and copied in); train nothing")
    p.add_argument("--out", default=d.out)


def main(args: argparse.Namespace) -> int:
    cfg = RecallBenchConfig(parts=tuple(args.parts), train=not args.collect, compile=args.compile, out=args.out)
    apply_overrides(cfg, QUICK if args.quick else None, args,
                    {"steps": "steps", "seeds": "seeds", "variants": "state_variants", "lr": "lr",
                     "length_points": "length_points", "length_variants": "length_variants"})
    payload = run(cfg)
    print(report(payload))
    print(f"\nwrote {Path(cfg.out) / 'recall.json'}, recall.txt and recall.png")
    return 0
