"""``polymixer bench recall``: multi-query associative recall (MQAR) across mixers and state sizes.

Zoology's probe, which separates sub-quadratic mixers by how much they can recall. 2-layer models of width 64 over
a vocabulary of 2,048 are trained by the shared loop on MQAR batches generated on the fly (2,000 steps of 64
sequences, AdamW with warm-up and cosine decay), then scored on 1,000 held-out examples. The score is the fraction of
queries whose value is the argmax. Every point runs with several seeds and reports the median and the spread.

Mixers: attention, sliding-window attention, PoM, the value-carrying PoM, a hybrid (sliding window + value PoM), and
two baselines, linear attention with the identity feature map and Based (the Taylor map). The sub-quadratic mixers
come at about 1k, 4k and 16k floats of state per layer. Two parts:

- ``state``: accuracy against state floats per layer at (L, K) = (64, 16), the plot people expect from Zoology.
- ``length``: the 16k-state mixers and attention as the sequence and the number of pairs grow, up to (512, 64).
- ``zoology`` (under ``--zoology``, Zoology's recipe): Zoology's figure 2 — the value PoM, Based and linear
  attention at three state sizes, each with and without the short convolution, PoM, and attention with and without
  it as the ceiling, at L = 64 / 128 / 256 (K = L / 4), every variant swept; ``recall_zoology.png``.
- ``speed``: each state variant's forward sequences/s at the state point and the recipe's batch, round-robin beside
  attention — the speed of the very models the state part scores (run it alone: it is timed).

Learning rates: in the state part, attention (with and without the token shift), the value PoM and Based at each
state size (``SWEPT``) train at every rate of a grid around the recipe's 1e-3 (0.5×, 1×, 2× by default): the first
seed at every rate, the other seeds at the variant's best rate (by the first seed's accuracy on the *validation*
draw: 1,000 examples drawn independently of the test set, so the reported accuracy picks nothing). The report shows
each variant at its best rate and every rate's score; the other variants, and the length part, train at the recipe's
rate. A run recorded before the validation draw existed is scored on it from its final checkpoint; where that is
gone, its variant's rate is chosen on the test accuracy, and the report says so.

Runs live in ``<out>/quality/recall/<variant>-L<L>-K<K>-s<seed>[-<steps>steps][-lr<rate>]`` (the recipe's budget,
2,000 steps at 1e-3, names neither, so runs made before sweeps keep their folders), and each finished run leaves
``result.json``, so an interrupted bench continues where it stopped. The runs recorded in an earlier ``recall.json``
stay in it when their folders are not here (trained elsewhere). Outputs: ``recall.txt``, ``recall.json``,
``recall.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from .data import ZOOLOGY_MIXTURE
from ..report import format_table, new_figure, save_figure
from ..bench.common import (
    ACCURACY_CEILING, BRACKET, LR_FACTORS, add_bracket_argument, add_report_argument, check_rates, apply_overrides,
    best_rows, beyond, edge_note, lr_grid, mark_best, read_json, record_part, report_again, resume_point, run_parts,
    same_rate, sweep_folder, sweep_model, sweep_table, time_interleaved, training_claim, write_json, write_report,
    written,
)
from ...ranges import Range
from ..tasks.common import float_in, int_at_least

__all__ = ["RecallBenchConfig", "VARIANTS", "SWEPT", "ZOOLOGY_POINTS", "ZOOLOGY_VARIANTS", "zoology_form", "run",
           "report", "plot", "plots", "plot_zoology", "versus_based", "STATE_SIZES", "LEVEL", "LEARNED", "CHANCES",
           "learned_floor", "main", "add_arguments"]

# name → (preset, RecallConfig overrides, mixer family for the plot)
VARIANTS: Dict[str, Tuple[str, Dict[str, Any], str]] = {
    "attention": ("mqar-attention", {}, "attention"),
    "attention-rope": ("mqar-attention", {"rope": True}, "attention (rotary)"),
    "attention-shift": ("mqar-attention", {"token_shift": True}, "attention + shift"),
    # the plateau's diagnosis: one head of 64 or four of 16 instead of two of 32 (docs/recall.md)
    "attention-1head": ("mqar-attention", {"heads": 1}, "attention (1 head)"),
    "attention-4heads": ("mqar-attention", {"heads": 4}, "attention (4 heads)"),
    "swa-8": ("mqar-swa", {"window": 8}, "sliding window"),
    "swa-32": ("mqar-swa", {"window": 32}, "sliding window"),
    "pom": ("mqar-pom", {"expand": 4}, "PoM"),
    "pom-shift": ("mqar-pom", {"expand": 4, "token_shift": True}, "PoM + shift"),
    "vpom-1k": ("mqar-vpom", {"expand": 1, "value_dim": 16}, "value PoM"),
    "vpom-4k": ("mqar-vpom", {"expand": 2, "value_dim": 32}, "value PoM"),
    "vpom-16k": ("mqar-vpom", {"expand": 4, "value_dim": 64}, "value PoM"),
    "hybrid-LV": ("mqar-vpom", {"mixer": "LV", "expand": 4, "value_dim": 64, "window": 16}, "hybrid (L + value PoM)"),
    "hybrid-LV-shift": ("mqar-vpom", {"mixer": "LV", "expand": 4, "value_dim": 64, "window": 16, "token_shift": True},
                        "hybrid (L + value PoM) + shift"),
    # Based and linear attention with the value PoM's token shift (Based's short convolution): a comparison of the
    # feature map and the state, all else equal
    "based-1k": ("mqar-based", {"feature_dim": 4, "value_dim": 48, "token_shift": True}, "Based"),
    "based-4k": ("mqar-based", {"feature_dim": 8, "value_dim": 56, "token_shift": True}, "Based"),
    "based-16k": ("mqar-based", {"feature_dim": 16, "value_dim": 60, "token_shift": True}, "Based"),
    "based-noshift-16k": ("mqar-based", {"feature_dim": 16, "value_dim": 60}, "Based, no shift"),
    "linear-1k": ("mqar-linear", {"feature_dim": 16, "value_dim": 64, "token_shift": True}, "linear attention"),
    "linear-4k": ("mqar-linear", {"feature_dim": 64, "value_dim": 64, "token_shift": True}, "linear attention"),
    "linear-16k": ("mqar-linear", {"feature_dim": 256, "value_dim": 64, "token_shift": True}, "linear attention"),
    # every mixer without the short convolution (Zoology's figure 2 shows both)
    "vpom-noshift-1k": ("mqar-vpom", {"expand": 1, "value_dim": 16, "value_shift": False}, "value PoM, no shift"),
    "vpom-noshift-4k": ("mqar-vpom", {"expand": 2, "value_dim": 32, "value_shift": False}, "value PoM, no shift"),
    "vpom-noshift-16k": ("mqar-vpom", {"expand": 4, "value_dim": 64, "value_shift": False}, "value PoM, no shift"),
    "based-noshift-1k": ("mqar-based", {"feature_dim": 4, "value_dim": 48}, "Based, no shift"),
    "based-noshift-4k": ("mqar-based", {"feature_dim": 8, "value_dim": 56}, "Based, no shift"),
    "linear-noshift-1k": ("mqar-linear", {"feature_dim": 16, "value_dim": 64}, "linear attention, no shift"),
    "linear-noshift-4k": ("mqar-linear", {"feature_dim": 64, "value_dim": 64}, "linear attention, no shift"),
    "linear-noshift-16k": ("mqar-linear", {"feature_dim": 256, "value_dim": 64}, "linear attention, no shift"),
}
# Zoology's figure 2 at this bench's budget (the ``zoology`` part, under Zoology's recipe): every sub-quadratic mixer
# at three state sizes with and without the short convolution, PoM, and attention with and without it as the
# ceiling, at L = 64, 128, 256 with K = L / 4 pairs; every variant swept over the rate grid
ZOOLOGY_POINTS = ((64, 16), (128, 32), (256, 64))
ZOOLOGY_VARIANTS = ("attention", "attention-shift", "pom", "pom-shift", "vpom-1k", "vpom-4k", "vpom-16k",
                    "vpom-noshift-1k", "vpom-noshift-4k", "vpom-noshift-16k", "based-1k", "based-4k", "based-16k",
                    "based-noshift-1k", "based-noshift-4k", "based-noshift-16k", "linear-1k", "linear-4k",
                    "linear-16k", "linear-noshift-1k", "linear-noshift-4k", "linear-noshift-16k")


# the recipe every run had before sweeps existed: runs at this budget keep their folders (no budget in the name)
RECIPE_STEPS = 2000
RECIPE_LR = 1e-3
# the variants trained at every rate of the grid in the state part: attention (the baseline), the value PoM and
# Based (the linear-time models whose parity the targets claim) at each state size; the others at the recipe rate
SWEPT = ("attention", "attention-shift", "vpom-1k", "vpom-4k", "vpom-16k", "based-1k", "based-4k", "based-16k")
STATE_SIZES = ("1k", "4k", "16k")  # the nominal state floats per layer of the value PoM, Based, linear attention
LEVEL = 0.01  # "at least level": the value PoM within one point of accuracy of Based, or above
# A mixer below both LEARNED and CHANCES × chance (1/K) has not learned MQAR: it knows which tokens are values, not
# whose (the failed runs end at 1-2× chance; 0.43 at K 64 is 27× chance: a partial recall, not a failure).
LEARNED = 0.5
CHANCES = 4.0


def learned_floor(pairs: int) -> float:
    """The accuracy below which a mixer has not learned MQAR with ``pairs`` key-value pairs: 0.5, or 4× chance
    where that is lower (0.25 at K 16, 0.0625 at K 64)."""
    return min(LEARNED, CHANCES / pairs)


@dataclass
class RecallBenchConfig:
    vocab_size: int = 2048
    d_model: int = 64
    steps: int = RECIPE_STEPS
    batch: int = 64
    mlp_ratio: float = 4.0  # 0: mixer-only blocks (Zoology's MQAR models; --zoology)
    lr: float = RECIPE_LR  # the recipe's rate: the middle of each sweep, and the rate of every variant not swept
    lr_factors: Tuple[float, ...] = LR_FACTORS  # the grid: lr × these
    sweep: Tuple[str, ...] = SWEPT  # state-part variants trained at every rate of the grid
    sweep_seeds: int = 1  # the first seeds train at every rate; the others only at the variant's best rate
    lrs: Tuple[float, ...] = ()  # train only these rates of the grid (several processes side by side); () = all
    bracket: int = BRACKET  # rates added past an end of the grid where a swept model is best there
    seeds: Tuple[int, ...] = (0, 1, 2)
    state_point: Tuple[int, int] = (64, 16)  # (seq_len, num_kv_pairs) of the state sweep
    state_variants: Tuple[str, ...] = tuple(VARIANTS)
    length_points: Tuple[Tuple[int, int], ...] = ((64, 8), (128, 32), (256, 64), (512, 64))
    length_variants: Tuple[str, ...] = ("attention", "vpom-16k", "based-16k")
    zoology_points: Tuple[Tuple[int, int], ...] = ZOOLOGY_POINTS
    zoology_variants: Tuple[str, ...] = ZOOLOGY_VARIANTS
    test_examples: int = 1000
    speed_repeats: int = 20  # timed forward passes of each variant (the speed part)
    parts: Tuple[str, ...] = ("state", "length")
    train: bool = True  # False (--collect): report the runs that have finished, train nothing
    mixture: Tuple[Tuple[int, int, int], ...] = ()  # train on these (L, K, weight) points, test at each point
    #                                                 (--mixture: Zoology's training set, ZOOLOGY_MIXTURE)
    compile: bool = False  # torch.compile the models (the same runs, faster on CPU)
    curves: bool = True  # each run draws its curves.png (loss, learning rate, accuracy); the same runs without
    out: str = "runs/bench/recall"


QUICK = dict(steps=150, seeds=(0,), state_point=(32, 4), state_variants=("attention", "pom", "vpom-4k", "based-4k"),
             length_points=((32, 4), (64, 8)), length_variants=("vpom-4k",), test_examples=200, sweep=())

# what makes runs of two invocations comparable (runs recorded in recall.json are kept when these agree)
_SAME = ("vocab_size", "d_model", "batch", "test_examples", "mlp_ratio", "mixture")
# Zoology's MQAR recipe at this bench's budget: mixer-only blocks, larger batches, a wider rate sweep for every mixer
ZOOLOGY = dict(mlp_ratio=0.0, batch=128, lr_factors=(0.3, 1.0, 3.0, 10.0))


def _folder(cfg: RecallBenchConfig, variant: str, seq_len: int, pairs: int, seed: int, lr: float) -> Path:
    """``<out>/quality/recall/<variant>-L<L>-K<K>-s<seed>[-<steps>steps][-lr<rate>]``: the steps when they are not
    the recipe's, the rate when it is not the recipe's 1e-3 (so the runs made before sweeps keep their folders).
    A run trained on a mixture (``-mix`` in place of the point) is one run for every point it is tested at."""
    slug = f"{variant}-" + ("mix" if cfg.mixture else f"L{seq_len}-K{pairs}") + f"-s{seed}"
    slug += "" if cfg.steps == RECIPE_STEPS else f"-{cfg.steps}steps"
    slug += "" if cfg.mlp_ratio == 4.0 else f"-mlp{cfg.mlp_ratio:g}-b{cfg.batch}"  # another recipe (--zoology)
    return sweep_folder(Path(cfg.out) / "quality" / "recall", slug, lr, RECIPE_LR)


def _variant(cfg: RecallBenchConfig, variant: str) -> Tuple[str, Dict[str, Any], str]:
    """(preset, RecallConfig overrides, mixer family) of a variant under the bench's recipe: mixer-only blocks
    under --zoology (the runs at the old recipe keep their results key: no mlp_ratio there)."""
    preset, overrides, family = VARIANTS[variant]
    if cfg.mlp_ratio != 4.0:
        overrides = {**overrides, "mlp_ratio": cfg.mlp_ratio}
    return preset, overrides, family


def run_speed(cfg: RecallBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Sequences/s of each state variant's forward pass at the state point (L, K) and the recipe's batch, the
    variants timed round-robin (:func:`time_interleaved`; medians): each compared mixer's speed beside attention's,
    the very model (sizes, recipe: mixer-only blocks under --zoology) whose accuracy the state part reports."""
    from tqdm.auto import tqdm
    from .data import mqar
    from ...models import count_parameters, create_model

    L, K = cfg.state_point
    x, _ = mqar(cfg.batch, L, K, cfg.vocab_size, seed=(0, 0))
    models = {}
    for v in cfg.state_variants:
        preset, overrides, _ = _variant(cfg, v)
        models[v] = create_model(preset, vocab_size=cfg.vocab_size, d_model=cfg.d_model, seq_len=L,
                                 **overrides).eval()
    bar = tqdm(total=len(models) * cfg.speed_repeats, disable=not progress, desc="bench recall speed", unit="call")
    with torch.inference_mode():
        timing = time_interleaved({v: (lambda m=m: m(x)) for v, m in models.items()}, warmup=2,
                                  repeats=cfg.speed_repeats, on_sample=lambda name: bar.update(1))
    bar.close()
    base = timing["attention"].median if "attention" in timing else None
    rows = [{"variant": v, "model": v, "N": L, "pairs": K, "batch": cfg.batch, "ms": 1e3 * t.median,
             "spread": t.spread, "seq_s": cfg.batch / t.median, "vs_attention": base / t.median if base else None,
             "params": count_parameters(models[v]), "state_floats": models[v].state_floats(L)}
            for v, t in timing.items()]
    return {"rows": rows, "repeats": cfg.speed_repeats, "threads": torch.get_num_threads()}


def _run(cfg: RecallBenchConfig, variant: str, seq_len: int, pairs: int, seed: int, lr: float, progress: bool,
         train: bool = True) -> Optional[Dict[str, Any]]:
    """Train one (variant, point, seed, rate), or read the result a finished earlier run left (None: not run yet
    and ``train`` is off)."""
    from .task import train_recall
    from ..train.loop import TrainConfig

    preset, overrides, family = _variant(cfg, variant)
    out = _folder(cfg, variant, seq_len, pairs, seed, lr)
    tcfg = TrainConfig(steps=cfg.steps, batch_size=cfg.batch, lr=lr, min_lr=lr / 10,
                       warmup=max(1, cfg.steps // 20), weight_decay=0.1, beta2=0.98, eval_every=cfg.steps,
                       ckpt_every=max(1, cfg.steps // 4), log_every=50, seed=1337 + seed, out=str(out),
                       progress=progress, compile=cfg.compile, curves=cfg.curves)
    key = {"tcfg": asdict(tcfg), "overrides": overrides, "preset": preset, "vocab": cfg.vocab_size,
           "d_model": cfg.d_model, "test": cfg.test_examples}
    # a run on a mixture is the same training whatever point it is tested at; its record holds a result per point
    key.update({"mixture": [list(p) for p in cfg.mixture]} if cfg.mixture else {"pairs": pairs, "seq_len": seq_len})
    record, point = out / "result.json", f"{seq_len}:{pairs}"

    def recorded(score: bool = False) -> Optional[Dict[str, Any]]:
        """The result a finished run with these settings left (where the run folder sits and whether it showed
        progress change nothing); a run on a mixture not yet tested at this point is tested now where ``score``
        (from its final checkpoint)."""
        if not record.is_file():
            return None
        saved = read_json(record)
        if _comparable(saved.get("key", {})) != _comparable(json.loads(json.dumps(key))):
            return None
        if cfg.mixture:
            done = saved.get("points", {})
            return done.get(point) or (_score_point(cfg, tcfg, out, saved, seq_len, pairs) if score else None)
        result = saved["result"]
        return result if "val_accuracy" in result else _rescore(cfg, tcfg, out, saved, seq_len, pairs)

    result = recorded()
    if result is not None or (not train and not (cfg.mixture and record.is_file())):
        return result  # (a mixture run on record, not yet tested at this point, is scored below)
    with training_claim(out) as mine:
        # finished by another process between the look above and the claim, or trained on the mixture already
        result = recorded(score=True) if mine else None
        if not mine or result is not None or not train:
            return result
        resume_point(out, tcfg)  # an interrupted run continues; one made with other settings starts over
        t0 = time.perf_counter()
        res = train_recall(preset, tcfg, num_kv_pairs=pairs, test_examples=cfg.test_examples, seq_len=seq_len,
                           mixture=cfg.mixture, vocab_size=cfg.vocab_size, d_model=cfg.d_model, **overrides)
        model = res["model"]
        result = {"variant": variant, "family": family, "seq_len": seq_len, "pairs": pairs, "seed": seed,
                  "steps": cfg.steps, "lr": lr,
                  "accuracy": res["metrics"]["accuracy"], "loss": res["metrics"]["loss"],
                  "val_accuracy": res["metrics"]["val_accuracy"], "val_loss": res["metrics"]["val_loss"],
                  "state_floats": model.state_floats(seq_len), "params": sum(p.numel() for p in model.parameters()),
                  "minutes": (time.perf_counter() - t0) / 60}
        write_json(record, {"key": key, "points": {point: result}} if cfg.mixture else {"key": key, "result": result})
        return result


def _score_point(cfg: RecallBenchConfig, tcfg: Any, out: Path, saved: Dict[str, Any], seq_len: int,
                 pairs: int) -> Optional[Dict[str, Any]]:
    """A run trained on a mixture, tested at one more point (L, K) from its final checkpoint: the test and
    validation draws of that point, the state a decoder keeps there; recorded beside its other points. None
    where the run has no checkpoint trained to the end."""
    from .task import RecallTask, recall_accuracy
    from ...checkpoint import load_model

    done = saved.get("points", {})
    if not done or not resume_point(out, tcfg):
        return None
    model = load_model(out, family="recall")
    if seq_len > model.config.seq_len:
        raise ValueError(f"{out}: its model spans {model.config.seq_len} tokens; it cannot be tested at L {seq_len}")
    task = RecallTask(seq_len, pairs, cfg.vocab_size, cfg.batch, tcfg.seed, cfg.test_examples)
    (acc, loss), (val, val_loss) = recall_accuracy(model, *task.test), recall_accuracy(model, *task.valid)
    result = {**next(iter(done.values())), "seq_len": seq_len, "pairs": pairs, "accuracy": acc, "loss": loss,
              "val_accuracy": val, "val_loss": val_loss, "state_floats": model.state_floats(seq_len), "minutes": 0.0}
    write_json(out / "result.json", {**saved, "points": {**done, f"{seq_len}:{pairs}": result}})
    return result


def _rescore(cfg: RecallBenchConfig, tcfg: Any, out: Path, saved: Dict[str, Any], seq_len: int,
             pairs: int) -> Dict[str, Any]:
    """A run recorded before the validation draw existed, scored on it from its final checkpoint (its record
    rewritten). The checkpoint must give back the recorded test accuracy (else it is not the recorded model);
    without such a checkpoint the result comes back as it was."""
    from .task import RecallTask, recall_accuracy
    from ...checkpoint import load_model

    result = saved["result"]
    if not resume_point(out, tcfg):  # no checkpoint of this run trained to the end
        return result
    model = load_model(out, family="recall")
    task = RecallTask(seq_len, pairs, cfg.vocab_size, cfg.batch, tcfg.seed, cfg.test_examples)
    test, _ = recall_accuracy(model, *task.test)
    if abs(test - result["accuracy"]) > 1e-6:
        warnings.warn(f"{out}: its checkpoint scores {test:.4f} on the test draw, not the recorded "
                      f"{result['accuracy']:.4f}; not scored on the validation draw", stacklevel=2)
        return result
    val, val_loss = recall_accuracy(model, *task.valid)
    result = {**result, "val_accuracy": val, "val_loss": val_loss}
    write_json(out / "result.json", {**saved, "result": result})
    return result


def _comparable(key: Dict[str, Any]) -> Dict[str, Any]:
    tcfg = {k: v for k, v in key.get("tcfg", {}).items() if k not in ("out", "progress", "compile", "curves")}
    return {**key, "tcfg": tcfg}


def _with_budget(r: Dict[str, Any]) -> Dict[str, Any]:
    return {"steps": RECIPE_STEPS, "lr": RECIPE_LR, **r}  # runs recorded before the budget was


def _key(r: Dict[str, Any]) -> Tuple[Any, ...]:
    """A run's identity: (variant, L, K, seed, steps, lr)."""
    r = _with_budget(r)
    return r["variant"], r["seq_len"], r["pairs"], r["seed"], r["steps"], float(f"{r['lr']:.6g}")


def _spec(r: Dict[str, Any]) -> Tuple[Any, ...]:
    """What a rate is chosen for: (variant, L, K, steps) — a run's or a row's."""
    return r["variant"], r["seq_len"], r["pairs"], r["steps"]


def sweep_seeds(results: List[Dict[str, Any]], swept_only: bool = False) -> Dict[Tuple[Any, ...], set]:
    """Per (variant, L, K, steps), the seeds (as strings) that ran at every rate of it: the seeds a sweep trained
    at every rate, on which its rate is chosen (the others train at the chosen rate only). Read from the runs, so a
    process adding one seed (``--seeds 2``) does not change which seeds pick the rate. ``swept_only``: only the
    (variant, L, K, steps) run at more than one rate."""
    rates: Dict[Tuple[Any, ...], Dict[float, set]] = {}
    for r in map(_with_budget, results):
        rates.setdefault(_spec(r), {}).setdefault(_key(r)[5], set()).add(str(r["seed"]))
    return {spec: set.intersection(*by_rate.values()) for spec, by_rate in rates.items()
            if len(by_rate) > 1 or not swept_only}


def _summarise(results: List[Dict[str, Any]], cfg: RecallBenchConfig) -> List[Dict[str, Any]]:
    """One row per (variant, L, K, steps, lr): the median, min and max over seeds, and the selection score (the
    median validation accuracy of the sweep seeds — :func:`sweep_seeds`: those that ran at every rate of the
    variant at the point, read from the runs, not from the flags of the process that writes the file — so that every
    rate is judged on the same seeds; ``val_accuracy``, None where it is not on validation); each (variant, L, K,
    steps) marked at its best rate (``best_lr``), ties going to the rate with more seeds, then to the one nearer the
    recipe's. A variant any of whose rates lacks the validation score of a sweep seed (recorded before the draw
    existed, its checkpoint gone) is judged on test accuracy at every rate, ``selected_on`` saying so."""
    rows: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
    for r in map(_with_budget, results):
        row = rows.setdefault(_key(r)[:3] + _key(r)[4:],
                              {k: r[k] for k in ("variant", "family", "seq_len", "pairs", "state_floats", "params",
                                                 "steps", "lr")} | {"accuracies": [], "by_seed": {}, "val_by_seed": {}})
        row["accuracies"].append(r["accuracy"])
        row["by_seed"][str(r["seed"])] = r["accuracy"]
        if r.get("val_accuracy") is not None:
            row["val_by_seed"][str(r["seed"])] = r["val_accuracy"]
    chosen = sweep_seeds(results)

    def judged_on(row: Dict[str, Any]) -> List[str]:  # the seeds a rate is judged on: the sweep seeds it ran
        picked = chosen.get(_spec(row), set())
        return [s for s in row["by_seed"] if s in picked] or list(row["by_seed"])

    scored: Dict[str, bool] = {}  # spec → every rate's judged seeds have a validation score
    for row in rows.values():
        a = row["accuracies"]
        budget = "" if row["steps"] == RECIPE_STEPS else f", {row['steps']} steps"
        row.update(median=statistics.median(a), low=min(a), high=max(a), seeds=len(a),
                   spec=f"{row['variant']}-L{row['seq_len']}-K{row['pairs']}-{row['steps']}steps",
                   label=f"{row['variant']} (L {row['seq_len']}, K {row['pairs']}{budget})")
        scored[row["spec"]] = scored.get(row["spec"], True) and all(s in row["val_by_seed"]
                                                                    for s in judged_on(row))
    for row in rows.values():
        on_val = scored[row["spec"]]
        scores = row["val_by_seed"] if on_val else row["by_seed"]
        row.update(select=statistics.median([scores[s] for s in judged_on(row)]),
                   selected_on="validation" if on_val else "test")
        row["val_accuracy"] = row["select"] if on_val else None
    out = sorted(rows.values(), key=lambda r: (r["spec"], -r["seeds"], abs(math.log(r["lr"] / cfg.lr)), r["lr"]))
    return mark_best(out, "select", higher=True)


def _best_lr(rows: List[Dict[str, Any]], variant: str, seq_len: int, pairs: int, steps: int) -> Optional[float]:
    return next((r["lr"] for r in rows if _spec(r) == (variant, seq_len, pairs, steps) and r["best_lr"]), None)


def _beyond(rows: List[Dict[str, Any]], variant: str, seq_len: int, pairs: int, steps: int,
            grid: Sequence[float]) -> Optional[float]:
    """The rate a sweep adds for the variant at the point (:func:`~polymixer.experiments.bench.common.beyond`: past
    the end
    of its rates where its best rate lies there, below :data:`~polymixer.experiments.bench.common.ACCURACY_CEILING`,
    once its
    ``grid`` has run)."""
    best = next((r for r in rows if r["best_lr"] and _spec(r) == (variant, seq_len, pairs, steps)), None)
    return beyond(rows, best, "variant", ("seq_len", "pairs", "steps"), "select", ACCURACY_CEILING, grid)


def _earlier_runs(cfg: RecallBenchConfig, name: str) -> List[Dict[str, Any]]:
    """The runs of part ``name`` recorded in an earlier ``recall.json`` in the same folder, when made with the same
    data and model settings: a run trained elsewhere (its folder not copied here) keeps its row, and a slice of
    the bench (``--variants``, ``--lrs``) leaves the other variants' rows alone."""
    path = Path(cfg.out) / "recall.json"
    if not path.is_file():
        return []
    part = read_json(path).get(name, {})
    old = part.get("config", {})
    # the fields files written before them lack: the 4× feed-forward, one point's training data
    before = {"mlp_ratio": RecallBenchConfig.mlp_ratio, "mixture": []}
    if any(old.get(k, before.get(k)) != json.loads(json.dumps(getattr(cfg, k))) for k in _SAME):
        return []
    return [_with_budget(r) for r in part.get("runs", [])]


def _with_earlier_rates(rates: Sequence[float], runs: Iterable[Dict[str, Any]], spec: Tuple[str, int, int, int],
                        seeds: Sequence[int]) -> Tuple[float, ...]:
    """``rates`` and the other rates a sweep seed of ``spec`` (variant, L, K, steps) ran at before, in ascending
    order: a rate an earlier ``--bracket`` tried is part of the sweep the best rate is chosen from."""
    out = list(rates)
    for r in runs:
        if (r["variant"], r["seq_len"], r["pairs"], r["steps"]) == spec and r["seed"] in seeds \
                and not any(same_rate(r["lr"], x) for x in out):
            out.append(r["lr"])
    return tuple(sorted(out))


def _part(name: str, points: List[Tuple[int, int]], variants: Tuple[str, ...], swept: Tuple[str, ...],
          shares: Tuple[str, ...] = ()):
    """A part of the bench: every variant at every point, the ``swept`` ones at every rate of the grid (the sweep
    seeds first; the other seeds at the best rate), the others at the recipe rate. The recorded runs of the parts
    in ``shares`` (same recipe, same run folders) count as this part's where they match its points, variants and
    steps."""
    def part(cfg: RecallBenchConfig, progress: bool) -> Dict[str, Any]:
        grid = lr_grid(cfg.lr, cfg.lr_factors)

        def recorded() -> Dict[tuple, Dict[str, Any]]:
            """The runs ``recall.json`` holds for this part now (read again at the end: a process sharing the part
            may have recorded its slice meanwhile, which this one's write must keep)."""
            known = {_key(r): r for r in _earlier_runs(cfg, name)
                     if name != "state" or (r["seq_len"], r["pairs"]) in points}
            for other in shares:
                known.update({_key(r): r for r in _earlier_runs(cfg, other) if (r["seq_len"], r["pairs"]) in points
                              and r["variant"] in variants and r["steps"] == cfg.steps and _key(r) not in known})
            return known

        runs = recorded()
        mine: set = set()  # the keys this process trained or read back fresh: only these override the file

        def on_file() -> Dict[tuple, Dict[str, Any]]:
            """The runs on file now with this process's own fresh ones over them: its start-time copy of the
            other rows must not override what another process recorded since (a stale row re-trained there)."""
            return {**recorded(), **{k: runs[k] for k in mine}}

        def summary(known: Dict[tuple, Dict[str, Any]]) -> Dict[str, Any]:
            results = sorted(known.values(), key=lambda r: _key(r))
            return {"runs": results, "rows": _summarise(results, cfg), "grid": list(grid), "swept": list(swept),
                    "selected_by": "validation accuracy of the sweep seeds (median); test accuracy where a run of the "
                                   "variant has no validation score (row: selected_on)",
                    "sweep_seeds": sorted({int(s) for seeds in sweep_seeds(results, True).values() for s in seeds})}

        def one(variant: str, L: int, K: int, seed: int, lr: float, train: bool, picks: bool = False) -> None:
            """``picks``: the run is one the rate is chosen on, so an earlier record of it without a validation
            score (made before the validation draw, its checkpoint gone) is trained again."""
            key = _key({"variant": variant, "seq_len": L, "pairs": K, "seed": seed, "steps": cfg.steps, "lr": lr})
            wanted = not cfg.lrs or any(same_rate(lr, x) for x in cfg.lrs)
            stale = picks and key in runs and runs[key].get("val_accuracy") is None
            r = _run(cfg, variant, L, K, seed, lr, progress,
                     train and cfg.train and wanted and (key not in runs or stale))
            if r is not None:
                fresh = runs.get(key) != r
                runs[key] = r
                if fresh:
                    mine.add(key)
                if fresh and cfg.train:  # a run just finished (or read back from its folder): on file at once
                    record_part(Path(cfg.out) / "recall.json", name, cfg, lambda part: summary(on_file()))

        for (L, K) in points:
            for v in variants:
                rates = grid if v in swept else (cfg.lr,)
                n = max(1, cfg.sweep_seeds) if len(rates) > 1 else len(cfg.seeds)
                if len(rates) > 1:  # the rates an earlier bracket added count as the grid's (a stale one re-trains)
                    rates = _with_earlier_rates(rates, runs.values(), (v, L, K, cfg.steps), cfg.seeds[:n])

                # (the closures below run within the iteration that makes them)
                def train(lr: float) -> None:  # the sweep seeds at one rate
                    for s in cfg.seeds[:n]:
                        one(v, L, K, s, lr, train=True, picks=len(rates) > 1)

                def then(lr: float) -> None:  # the other seeds, at the chosen rate
                    for s in cfg.seeds[n:]:
                        one(v, L, K, s, lr, train=True)

                chosen = sweep_model(
                    rates, train, lambda: _beyond(_summarise(list(runs.values()), cfg), v, L, K, cfg.steps, rates),
                    max(0, cfg.bracket) if len(rates) > 1 and cfg.train and not cfg.lrs else 0,
                    lambda: _best_lr(_summarise(list(runs.values()), cfg), v, L, K, cfg.steps), then)
                for lr in rates:  # the other seeds' runs at the other rates (finished elsewhere): read back
                    if chosen is None or not same_rate(lr, chosen):
                        for s in cfg.seeds[n:]:
                            one(v, L, K, s, lr, train=False)
        return summary(on_file())
    return part


def run(cfg: RecallBenchConfig, progress: bool = True) -> Dict[str, Any]:
    unknown = [v for v in list(cfg.state_variants) + list(cfg.length_variants) + list(cfg.sweep)
               + list(cfg.zoology_variants) if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    if cfg.sweep_seeds < 1:
        raise ValueError(f"sweep_seeds must be ≥ 1, got {cfg.sweep_seeds}")
    check_rates(cfg.lrs, lr_grid(cfg.lr, cfg.lr_factors))
    if "zoology" in cfg.parts and (cfg.mlp_ratio, cfg.batch) != (ZOOLOGY["mlp_ratio"], ZOOLOGY["batch"]):
        raise ValueError("the zoology part follows Zoology's MQAR recipe (mixer-only blocks, batch 128): add --zoology")
    parts = {"state": lambda c, p: _part("state", [tuple(c.state_point)], c.state_variants, c.sweep)(c, p),
             "length": lambda c, p: _part("length", [tuple(x) for x in c.length_points], c.length_variants, ())(c, p),
             "zoology": lambda c, p: _part("zoology", [tuple(x) for x in c.zoology_points], c.zoology_variants,
                                           c.zoology_variants, shares=("state",))(c, p),
             "speed": run_speed}
    payload = run_parts(cfg, Path(cfg.out) / "recall.json", parts, progress)
    write_report(Path(cfg.out), "recall", payload, plots, report)
    return payload


def plots(payload: Dict[str, Any], path: Path) -> None:
    """``recall.png`` at ``path`` when the payload has the state or length part, and ``recall_zoology.png`` beside it
    when it has the zoology part (a zoology-only folder gets no empty recall.png)."""
    if "state" in payload or "length" in payload or "zoology" not in payload:
        plot(payload, path)
    if "zoology" in payload:
        plot_zoology(payload, path.with_name("recall_zoology.png"))


def report(payload: Dict[str, Any], *seed_payloads: Any) -> str:
    """The bench's text report. Its seeds live in the one recall.json, so the seed folders the shared report writer
    passes (``seed_payloads``) are not read."""
    cols = ["variant", "family", "seq_len", "pairs", "state_floats", "steps", "lr", "rates", "median", "low", "high",
            "seeds"]
    heads = ["variant", "mixer", "L", "K", "state floats / layer", "steps", "best lr", "rates tried",
             "accuracy (median)", "min", "max", "seeds"]
    out = []
    for name in ("state", "length", "zoology"):
        if name not in payload:
            continue
        part = payload[name]
        all_rows = part["rows"]
        rows = sorted(best_rows(all_rows), key=lambda r: (r["seq_len"], r["pairs"], r["family"], r["state_floats"],
                                                          r["steps"]))
        shown = [{**r, "lr": f"{r['lr']:g}", **{k: f"{r[k]:.4f}" for k in ("median", "low", "high")}}
                 for r in rows]
        mixture = part.get("config", {}).get("mixture")
        trained = ("" if not mixture else " — trained on a mixture of (L, K, examples) "
                   + ", ".join(f"({L}, {K}, {n:,})" for L, K, n in mixture) + ", tested at each point")
        text = f"{name}: each variant at its best learning rate{trained}\n" + format_table(shown, cols, heads)
        swept = [r for r in all_rows if r.get("rates", 1) > 1]
        if swept:
            seeds = part.get("sweep_seeds") or [0]
            who = f"seed {seeds[0]}" if len(seeds) == 1 else f"median of seeds {', '.join(map(str, seeds))}"
            grid = ", ".join(f"{x:g}" for x in sorted({r["lr"] for r in swept}))  # the grid, and any rate added
            on_test = [{**r, "label": r["label"] + " [test]"} if r.get("selected_on") == "test" else r for r in swept]
            text += (f"\n\nevery rate of the sweep (grid {grid}; validation accuracy of {who}, which picks the best "
                     f"rate, * ; [test]: the test accuracy, where a run of the variant has no validation score; the "
                     f"other seeds train at the best rate; — = not run)\n"
                     + sweep_table(on_test, "select", "accuracy", digits=4, key="spec", name="label"))
            note = edge_note(swept, key="spec", name="label", score="select", ceiling=ACCURACY_CEILING,
                             ladder=part.get("grid", ()))
            text += f"\n{note}" if note else ""
            others = sorted({r["variant"] for r in all_rows if r.get("rates", 1) == 1})
            if others:
                text += f"\none rate only (not swept, or not yet): {', '.join(others)}"
        out.append(text)
    if "speed" in payload:
        out.append(_speed_report(payload["speed"]))
    out += _targets(payload)
    return "\n\n".join(out)


def _speed_report(part: Dict[str, Any]) -> str:
    """The speed part's table: each variant's forward time and sequences/s, fastest first, ÷ attention's."""
    rows = sorted(part["rows"], key=lambda r: r["ms"])
    first = rows[0] if rows else {}
    shown = [{**r, "params": f"{r['params']:,}", "state_floats": f"{r['state_floats']:,}", "ms": f"{r['ms']:.2f}",
              "seq_s": f"{r['seq_s']:,.0f}", "spread": f"{100 * r['spread']:.0f}%",
              "vs_attention": "—" if r.get("vs_attention") is None else f"{r['vs_attention']:.2f}×"} for r in rows]
    machine = part.get("machine", {})
    return (f"speed: forward pass at L {first.get('N')}, batch {first.get('batch')} (median of {part.get('repeats')} "
            f"interleaved calls; {machine.get('cpu', '?')}, {part.get('threads', '?')} threads)\n"
            + format_table(shown, ["variant", "params", "state_floats", "ms", "seq_s", "vs_attention", "spread"],
                           ["variant", "params", "state floats / layer", "ms", "seq/s", "speed ÷ attention",
                            "spread"]))


def _targets(payload: Dict[str, Any]) -> List[str]:
    """The issue's targets, each judged on each variant at its best rate, among rows of the same steps."""
    rows = [r for name in ("state", "length") for r in best_rows(payload.get(name, {}).get("rows", []))]
    by = {(r["variant"], r["seq_len"], r["pairs"], r["steps"]): r for r in rows}

    def at(r: Dict[str, Any]) -> str:
        return f"lr {r['lr']:g}, best of {r.get('rates', 1)}"

    lines = []
    for steps in sorted({r["steps"] for r in rows}):
        budget = f"{steps} steps"
        a = by.get(("attention", 64, 16, steps))
        if a:
            ok = a["median"] >= 0.99
            lines.append(f"attention (no shift), K = 16, L = 64 ({budget}, {at(a)}): median {a['median']:.4f} over "
                         f"{a['seeds']} seed(s) (target ≥ 0.99: {'met' if ok else 'MISSED'})")
        v = by.get(("vpom-16k", 64, 16, steps))
        if v:
            ok = v["seeds"] >= 3 and v["low"] >= 0.99
            lines.append(f"value PoM, 16k state, K = 16, L = 64 ({budget}, {at(v)}): "
                         f"{', '.join(f'{x:.4f}' for x in v['accuracies'])} "
                         f"(target ≥ 0.99 on 3 of 3 seeds: {'met' if ok else 'MISSED'})")
        v = by.get(("vpom-16k", 256, 64, steps))
        if v:
            lines.append(f"value PoM, 16k state, K = 64, L = 256 ({budget}, {at(v)}): median {v['median']:.3f} over "
                         f"{v['seeds']} seed(s) (target ≥ 0.9: {'met' if v['median'] >= 0.9 else 'MISSED'})")
        at_point = [r for r in rows if (r["seq_len"], r["pairs"], r["steps"]) == (64, 16, steps)]
        for c in versus_based(at_point):
            if c["shift"]:
                a, b = c["value"], c["based"]
                lines.append(f"{c['size']} state at K = 16, L = 64 ({budget}): value PoM {a['median']:.4f} "
                             f"({at(a)}, {a['seeds']} seeds) vs Based {b['median']:.4f} ({at(b)}, {b['seeds']} "
                             f"seeds) (target at least level: {'met' if c['met'] else 'MISSED'})")
    z = best_rows(payload.get("zoology", {}).get("rows", []))
    zb = {(r["variant"], r["seq_len"], r["pairs"]): r for r in z}
    for L, K in sorted({(r["seq_len"], r["pairs"]) for r in z}):
        a = zb.get(("attention", L, K))
        if a:
            judged = (f"target ≥ 0.99: {'met' if a['median'] >= 0.99 else 'MISSED'}"
                      f"{'' if a['seeds'] >= 3 else ', unsettled: needs 3 seeds'}")
            lines.append(f"zoology recipe, attention without the shift, L = {L}, K = {K} ({at(a)}): median "
                         f"{a['median']:.4f} over {a['seeds']} seed(s) ("
                         f"{judged if (L, K) == (64, 16) else 'the ceiling, shown: the target is at L = 64'})")
    for c in versus_based(z):
        v, b = c["value"], c["based"]
        lines.append(f"zoology recipe, L = {c['seq_len']}, K = {c['pairs']}, {c['size']} state"
                     f"{'' if c['shift'] else ', no shift'}: value PoM {v['median']:.4f} ({v['state_floats']:,} "
                     f"floats, {v['seeds']} seeds) vs Based {b['median']:.4f} ({b['state_floats']:,} floats, "
                     f"{b['seeds']} seeds) (target at least level: {'met' if c['met'] else 'MISSED'}"
                     f"{'' if c['seeds'] >= 3 else ', unsettled: needs 3 seeds'})"
                     + (f"; neither learns the task (both below {learned_floor(c['pairs']):.3g})"
                        if c["neither"] else ""))
    return ["\n".join(lines)] if lines else []


def versus_based(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The value PoM against Based at each state size of the zoology part (issue 39's target: its accuracy per state
    float at least Based's), from rows at their best rate: one entry per (L, K, shift, size) where both ran, with
    both rows, whether it is met (at most :data:`LEVEL` below), whether neither learned the task (both below
    :func:`learned_floor`: a level comparison of two failures says nothing of the mixers) and the fewer seeds of the
    two."""
    by = {(r["variant"], r["seq_len"], r["pairs"]): r for r in rows if r.get("best_lr", True)}
    out = []
    for L, K in sorted({(r["seq_len"], r["pairs"]) for r in rows}):
        for shift in (True, False):
            for size in STATE_SIZES:
                tag = "" if shift else "noshift-"
                v, b = by.get((f"vpom-{tag}{size}", L, K)), by.get((f"based-{tag}{size}", L, K))
                if v and b:
                    out.append({"seq_len": L, "pairs": K, "shift": shift, "size": size, "value": v, "based": b,
                                "met": v["median"] >= b["median"] - LEVEL, "seeds": min(v["seeds"], b["seeds"]),
                                "neither": max(v["median"], b["median"]) < learned_floor(K)})
    return out


def _shown(payload: Dict[str, Any], name: str) -> List[Dict[str, Any]]:
    """The rows a figure shows: each variant at its best rate, of the configured steps where there are such."""
    rows = best_rows(payload.get(name, {}).get("rows", []))
    steps = payload.get("config", {}).get("steps")
    return [r for r in rows if r["steps"] == steps] or rows


def plot(payload: Dict[str, Any], path: Path) -> None:
    """Accuracy against state floats per layer (state sweep) and against sequence length (length sweep)."""
    fig, axes = new_figure(2, width=5.4, height=4.0)
    markers = {"attention": "*", "attention (rotary)": "P", "attention + shift": "X", "sliding window": "s",
               "PoM": "v", "value PoM": "o", "hybrid (L + value PoM)": "D", "Based": "^", "Based, no shift": "<",
               "linear attention": "x"}
    state, length = _shown(payload, "state"), _shown(payload, "length")
    ax = axes[0]
    for k, fam in enumerate(markers):
        rows = sorted((r for r in state if r["family"] == fam), key=lambda r: r["state_floats"])
        if not rows:
            continue
        x = [r["state_floats"] for r in rows]
        y = [r["median"] for r in rows]
        err = [[r["median"] - r["low"] for r in rows], [r["high"] - r["median"] for r in rows]]
        ax.errorbar(x, y, yerr=err, marker=markers[fam], color=f"C{k}", label=fam, capsize=3)
    if state:
        L, K = state[0]["seq_len"], state[0]["pairs"]
        ax.set_title(f"MQAR, L = {L}, K = {K}, each at its best rate (median, range over seeds)", fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("state floats per layer")
    ax.set_ylabel("accuracy")
    ax2 = axes[1]
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


def zoology_form(variant: str) -> Tuple[str, bool]:
    """A variant's mixer (``"value PoM"``, ``"Based"``, ``"linear attention"``, ``"PoM"``, ``"attention"``, …) and
    whether it reads the short causal token shift, from its configuration: the value PoM has its own unless
    ``value_shift`` is off, every other mixer only with ``token_shift``."""
    model, kwargs, label = VARIANTS[variant]
    shifted = kwargs.get("value_shift", True) if model == "mqar-vpom" else kwargs.get("token_shift", False)
    return label.replace(", no shift", "").replace(" + shift", ""), bool(shifted)


def plot_zoology(payload: Dict[str, Any], path: Path) -> None:
    """Zoology's figure 2: one panel per (L, K) of the zoology part, accuracy against state floats per layer, each
    mixer with the short convolution (solid) and without it (dashed, same colour), each variant at its best rate
    (median, range over seeds; open markers without the shift); attention with the shift (solid) and without it
    (dashed) as the ceiling (its KV cache: 2·L·d floats)."""
    rows = best_rows(payload.get("zoology", {}).get("rows", []))
    points = sorted({(r["seq_len"], r["pairs"]) for r in rows})
    fig, axes = new_figure(max(1, len(points)), width=4.2, height=3.8)
    mixers = ("value PoM", "Based", "linear attention", "PoM")
    forms = {r["variant"]: zoology_form(r["variant"]) for r in rows if r["variant"] in VARIANTS}
    floats = [r["state_floats"] for r in rows if r["variant"] in forms and forms[r["variant"]][0] != "attention"]
    span = (min(floats), max(floats)) if floats else None
    for ax, (L, K) in zip(axes, points or [(0, 0)]):
        here = [r for r in rows if (r["seq_len"], r["pairs"]) == (L, K)]
        for k, mixer in enumerate(mixers):
            for shifted, style in ((True, "-"), (False, "--")):
                mine = sorted((r for r in here if forms.get(r["variant"]) == (mixer, shifted)),
                              key=lambda r: r["state_floats"])
                if not mine:
                    continue
                ax.errorbar([r["state_floats"] for r in mine], [r["median"] for r in mine],
                            yerr=[[r["median"] - r["low"] for r in mine], [r["high"] - r["median"] for r in mine]],
                            linestyle=style, marker="o", color=f"C{k}", capsize=3,
                            label=mixer + ("" if shifted else ", no shift"),
                            markerfacecolor=f"C{k}" if style == "-" else "none")
        for shifted, style in ((True, "-"), (False, "--")):  # the mixers' convention: solid with the shift
            a = next((r for r in here if forms.get(r["variant"]) == ("attention", shifted)), None)
            if a is not None:
                ax.axhline(a["median"], color="k", linestyle=style, linewidth=1,
                           label=f"{a['family']} ({a['state_floats']:,} floats)")
        ax.set_xscale("log", base=2)
        if span:  # one state axis for every panel, so that a length with few variants run reads like the others
            ax.set_xlim(span[0] / 1.4, span[1] * 1.4)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xlabel("state floats per layer")
        ax.set_title(f"MQAR, L = {L}, K = {K}" if L else "zoology part: not measured yet", fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    axes[0].set_ylabel("accuracy (each at its best rate)")
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
    p.add_argument("--parts", nargs="+", choices=["state", "length", "zoology", "speed"], default=list(d.parts),
                   help="zoology (with --zoology): Zoology's figure 2 — every mixer with and without the shift at 3 "
                        "state sizes, L 64 / 128 / 256, every variant swept (hundreds of runs; share them with "
                        "--zoology-variants / --lrs / --seeds, finished runs are read back); speed: each state "
                        "variant's forward sequences/s at the state point, beside attention's (run it alone)")
    p.add_argument("--steps", type=int_at_least(1), default=None)
    p.add_argument("--seeds", type=int_at_least(0), nargs="+", default=None)
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=None,
                   help="mixers of the state sweep (default: all)")
    p.add_argument("--lr", type=float_in(Range(0, low_open=True)), default=None,
                   help=f"the recipe's rate: the middle of each sweep and the rate of the others (default {d.lr:g})")
    p.add_argument("--sweep", nargs="*", choices=list(VARIANTS), default=None,
                   help="state-part variants trained at every rate of the grid (default: "
                        f"{' '.join(d.sweep)}; none: the recipe's rate only)")
    p.add_argument("--lr-factors", type=float_in(Range(0, low_open=True)), nargs="+", default=None,
                   help=f"the grid: the recipe's rate times these (default: {' '.join(map(str, d.lr_factors))})")
    p.add_argument("--lrs", type=float_in(Range(0, low_open=True)), nargs="+", default=None,
                   help="train only these rates of the grid (to share a sweep among processes); the others' "
                        "finished runs are still read")
    add_bracket_argument(p)
    p.add_argument("--sweep-seeds", type=int_at_least(0), default=None,
                   help=f"how many of the seeds train at every rate (default {d.sweep_seeds}); the other seeds "
                        "train only at each variant's best rate")
    p.add_argument("--length-points", nargs="+", type=_point, default=None, metavar="L:K",
                   help="(sequence length, pairs) of the length sweep, e.g. 64:8 512:64")
    p.add_argument("--length-variants", nargs="+", choices=list(VARIANTS), default=None,
                   help="mixers of the length sweep (default: attention, vpom-16k, based-16k)")
    p.add_argument("--zoology-variants", nargs="+", choices=list(VARIANTS), default=None,
                   help=f"mixers of the zoology part (default: the {len(ZOOLOGY_VARIANTS)} of Zoology's figure 2)")
    p.add_argument("--zoology-points", nargs="+", type=_point, default=None, metavar="L:K",
                   help="(sequence length, pairs) of the zoology part (default: 64:16 128:32 256:64)")
    p.add_argument("--zoology", action="store_true",
                   help="Zoology's MQAR recipe at this budget: mixer-only blocks (mlp_ratio 0), batch 128, rates "
                        "0.3× to 10× the recipe's for every swept mixer")
    p.add_argument("--mixture", action="store_true",
                   help="train on Zoology's training set instead of the test point alone: 100k examples of L 64 / "
                        "K 4 and 20k each of 128/8, 256/16, 256/32, 256/64, shuffled, right-padded to 256 "
                        "tokens; each point tested as before (give it its own --out)")
    p.add_argument("--compile", action="store_true", help="torch.compile the models (same runs, same results key)")
    p.add_argument("--collect", action="store_true",
                   help="report the runs that have finished (e.g. trained elsewhere and copied in); train nothing")
    add_report_argument(p, "recall", seed_folders=False)
    p.add_argument("--out", default=d.out)


def main(args: argparse.Namespace) -> int:
    if args.report:
        print(report_again(Path(args.out), "recall", plots, report))
        return 0
    cfg = RecallBenchConfig(parts=tuple(args.parts), train=not args.collect, compile=args.compile, out=args.out,
                            mixture=ZOOLOGY_MIXTURE if args.mixture else ())
    if args.zoology:
        for k, v in ZOOLOGY.items():
            setattr(cfg, k, v)
    apply_overrides(cfg, QUICK if args.quick else None, args,
                    {"steps": "steps", "seeds": "seeds", "variants": "state_variants", "lr": "lr",
                     "sweep": "sweep", "lr_factors": "lr_factors", "lrs": "lrs", "bracket": "bracket",
                     "sweep_seeds": "sweep_seeds",
                     "length_points": "length_points", "length_variants": "length_variants",
                     "zoology_variants": "zoology_variants", "zoology_points": "zoology_points"})
    started = time.time()
    payload = run(cfg)
    print(report(payload))
    pngs = written([Path(cfg.out) / p for p in ("recall.png", "recall_zoology.png")], since=started)
    print(f"\nwrote {Path(cfg.out) / 'recall.json'}, recall.txt" + "".join(f", {p.name}" for p in pngs))
    return 0
