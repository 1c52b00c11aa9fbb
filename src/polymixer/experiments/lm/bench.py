"""``polymixer bench lm``: attention vs PoM vs hybrid language models, at CPU scale.

1. forward throughput (tokens/s) at 1k, 4k, 16k and 32k tokens per sequence for a fixed token budget, same width
   and depth for the three models (the paper's efficiency table);
2. time and memory per generated token after a context of 1k … 64k tokens (prefill, then one token at a time with
   per-layer state: PoM's running sums, local attention's ring buffer, global attention's KV cache);
3. quality at an equal budget: the tiny presets trained for the same steps on the default corpus, validation loss
   and bits per byte side by side (the paper's performance table); ``--tokenizer prose-bpe-4096``: token-level;
4. ngram: the count-based baseline of the same corpus (:mod:`.ngram`, orders 0–5, for bytes and BPE tokens),
   validation and test bits per byte.

Each part prints a table and writes ``lm_<part>.json``; ``lm.png`` plots parts 1 and 2.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ...models import count_parameters, create_model
from ..report import format_table, new_figure, save_figure
from ..bench.parity import verdict_lines
from ..bench.common import (
    BRACKET, edge_note, FamilyBench, add_sweep_arguments, bench_main, run_bench, LR_FACTORS, best_rows, QualitySweep,
    Stage, SweepRun, beyond, mark_best, parse_variant, render_report, same_rate, sweep_table, time_interleaved,
    read_json, main_payload, payload_seed, seed_payloads,
)
from ..tasks.common import int_at_least
from .bpe import tokenizer_argument

__all__ = ["LMBenchConfig", "run_throughput", "run_decode", "run_hf_decode", "run_quality", "main", "add_arguments",
           "larger_models", "width_ratio", "chosen_rows", "scaled_rates", "scaled_past", "two_scale_lines",
           "two_scale_points", "kind_argument", "run_ngram"]

KINDS = ("attention", "pom", "hybrid", "vpom", "vhybrid")  # the tiny-<kind> presets


@dataclass
class LMBenchConfig:
    # the benchmark model: same width and depth for the three mixers, rotary positions (any context length)
    n_layer: int = 4
    n_embd: int = 256
    n_head: int = 4
    window: int = 128
    throughput_lengths: Tuple[int, ...] = (1024, 4096, 16384, 32768)
    tokens: int = 32768
    repeats: int = 3
    decode_contexts: Tuple[int, ...] = (1024, 4096, 16384, 32768, 65536)
    decode_steps: int = 64
    hf_decode_contexts: Tuple[int, ...] = (1024, 4096, 16384)
    kinds: Tuple[str, ...] = KINDS  # models of the throughput and decoding parts
    quality_presets: Tuple[str, ...] = tuple(f"tiny-{k}" for k in KINDS)
    quality_lr: float = 2e-3  # the recipe's rate: the middle of each sweep
    lr_factors: Tuple[float, ...] = LR_FACTORS
    sweep: Tuple[str, ...] = tuple(f"tiny-{k}" for k in KINDS)  # presets trained at every rate of the grid
    # overrides that make each quality preset larger ("+n_embd=256"): the larger model trains after it, at its best
    # rate carried over by the width rule (:func:`scaled_rates`); "" = none
    larger: str = ""
    lrs: Tuple[float, ...] = ()  # run only these rates of the grid (several processes side by side); () = all
    bracket: int = BRACKET  # rates added past an end of the grid where a swept model is best there
    quality_steps: int = 1500
    quality_batch: int = 32
    quality_eval_windows: int = 1024
    corpus: str = "stdlib"  # the quality part's text: "stdlib" (Python sources, the quick check) or "prose"
    tokenizer: str = "bytes"  # the quality part's tokens (--tokenizer of train lm: prose-bpe-4096 for token-level)
    ngram_tokenizers: Tuple[str, ...] = ("bytes", "prose-bpe-4096")  # the n-gram part's tokens, each its own rows
    ngram_order: int = 5  # the n-gram part's orders: 0 to this many tokens of context
    parts: Tuple[str, ...] = ("throughput", "decode", "quality")  # and "hf_decode" (the [hf] extra), "ngram"
    # "cuda": the throughput part on the GPU with the paper's models (GPT-2 small, GPPoM2-S, its hybrid and the value
    # PoM; rotary positions so every length runs) in bf16, PoM on the Triton kernels, attention on FlashAttention
    device: str = "cpu"
    gpu_presets: Tuple[str, ...] = ("gpt2-small", "gppom2-small", "gppom2-small-hybrid", "gppom2-small-value")
    seed: int = 0
    out: str = "runs/bench/lm"
    extra: Dict[str, Any] = field(default_factory=dict)


QUICK = dict(throughput_lengths=(1024, 4096), tokens=8192, repeats=2, decode_contexts=(1024, 8192), decode_steps=8,
             hf_decode_contexts=(1024, 8192), quality_steps=60, quality_eval_windows=64)


def _model(cfg: LMBenchConfig, kind: str) -> torch.nn.Module:
    """The ``tiny-<kind>`` preset at the bench's width and depth, rotary positions; a kind with options
    (``hybrid+attention_shift=4``) is that form of it, so the speed of a compared form is its own."""
    preset, options = parse_variant("tiny-" + kind)
    size = dict(n_layer=cfg.n_layer, n_embd=cfg.n_embd, n_head=cfg.n_head, window=cfg.window, sel_heads=cfg.n_head,
                position="rope", block_size=max(cfg.decode_contexts + cfg.throughput_lengths))
    return create_model(preset, **{**size, **options}).eval()


def kind_argument(text: str) -> str:
    """``--kinds``' type: one of :data:`KINDS`, optionally with config overrides (``attention+attention_shift=4``),
    each override checked by :func:`parse_variant` before anything runs; anything else is a one-line error."""
    if text.split("+")[0] not in KINDS:
        raise argparse.ArgumentTypeError(f"{text!r}: a kind is one of {', '.join(KINDS)}, optionally with "
                                         "+field=value overrides (attention+attention_shift=4)")
    try:
        parse_variant("tiny-" + text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _earlier(cfg: LMBenchConfig, part: str, run: Tuple[str, ...]) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """The rows of ``part`` in the earlier lm.json whose model this run does not measure again (kept), and that
    part as a whole."""
    path = Path(cfg.out) / "lm.json"
    earlier = read_json(path).get(part, {}) if path.is_file() else {}
    return [r for r in earlier.get("rows", []) if r["model"] not in run], earlier


def run_throughput(cfg: LMBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Forward tokens/s at each length for a fixed token budget (batch = budget / length). Attention, the
    baseline of the ratios, is always timed in the same run; other kinds not given keep their earlier rows."""
    from tqdm.auto import tqdm

    from ..bench.common import synchronized

    torch.manual_seed(cfg.seed)
    dev = torch.device(cfg.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device cuda, but PyTorch sees no CUDA device here")
        longest = max(cfg.throughput_lengths)
        kinds = tuple(cfg.gpu_presets)  # the first (GPT-2) is the baseline of the ratios
        models = {p: create_model(p, position="rope", block_size=longest, vocab_size=50304).to(dev, torch.bfloat16)
                  .eval() for p in kinds}
    else:
        kinds = tuple(dict.fromkeys(("attention",) + tuple(cfg.kinds)))
        models = {k: _model(cfg, k) for k in kinds}
    rows = []
    bar = tqdm(total=len(cfg.throughput_lengths) * len(models) * (cfg.repeats + 1), disable=not progress,
               desc="bench lm throughput", unit="call")
    for n in cfg.throughput_lengths:
        b = max(1, cfg.tokens // n)
        idx = torch.randint(0, 257, (b, n), device=dev)
        with torch.no_grad():
            t = time_interleaved({k: synchronized(lambda m=m: m(idx), dev) for k, m in models.items()}, warmup=1,
                                 repeats=cfg.repeats, on_sample=lambda name: bar.update(1))
        bar.update(len(models))
        for k in models:
            rows.append({"N": n, "batch": b, "model": k, "ms": 1e3 * t[k].median, "ktok_s": b * n / t[k].median / 1e3,
                         "spread": t[k].spread})
    bar.close()
    base = kinds[0]
    for n in cfg.throughput_lengths:
        att = next(r for r in rows if r["N"] == n and r["model"] == base)
        for r in rows:
            if r["N"] == n:
                r["vs_attention"] = r["ktok_s"] / att["ktok_s"]
    kept, earlier = _earlier(cfg, "throughput", kinds)
    kept = [r for r in kept if r["N"] in cfg.throughput_lengths]
    params = {k: count_parameters(m) for k, m in models.items()}
    if kept:
        params = {**earlier.get("params", {}), **params}
    return {"rows": sorted(kept + rows, key=lambda r: r["N"]), "params": params}


def _decode_rows(cfg: LMBenchConfig, models: Dict[str, Any], contexts: Tuple[int, ...], prefill: Any, step: Any,
                 memory: Any, progress: bool, desc: str) -> List[Dict[str, Any]]:
    """Per-token decoding time (median over ``decode_steps`` after two warm-up steps) and state memory after a
    prefilled context of each length (batch 1); ``prefill(model, prompt) → state``, ``step(model, token, state) →
    state``, ``memory(state) → bytes``."""
    from tqdm.auto import tqdm

    rows = []
    bar = tqdm(total=len(contexts) * len(models), disable=not progress, desc=desc, unit="context")
    for n in contexts:
        prompt = torch.randint(0, 257, (1, n))
        for k, m in models.items():
            bar.set_postfix_str(f"{k} @ {n}")
            t0 = time.perf_counter()
            state = prefill(m, prompt)
            elapsed = time.perf_counter() - t0
            tok = torch.randint(0, 257, (1, 1))
            times = []
            for i in range(cfg.decode_steps + 2):
                t0 = time.perf_counter()
                state = step(m, tok, state)
                if i >= 2:  # two warm-up steps (first growth of caches, allocator)
                    times.append(time.perf_counter() - t0)
            times.sort()
            rows.append({"context": n, "model": k, "ms_per_token": 1e3 * times[len(times) // 2],
                         "state_mb": memory(state) / 2**20, "prefill_s": elapsed})
            del state
            bar.update(1)
    bar.close()
    for k in models:
        mine = [r for r in rows if r["model"] == k]
        for r in mine:
            r["vs_first_context"] = r["ms_per_token"] / mine[0]["ms_per_token"]
    return rows


@torch.no_grad()
def run_decode(cfg: LMBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Per-token decoding time and state memory after a prefilled context of each length (batch 1)."""
    torch.manual_seed(cfg.seed)
    models = {k: _model(cfg, k) for k in cfg.kinds}
    rows = _decode_rows(cfg, models, cfg.decode_contexts, lambda m, p: m.step(p, m.init_state(1))[1],
                        lambda m, t, s: m.step(t, s)[1], lambda s: s.memory_bytes, progress, "bench lm decode")
    kept = [r for r in _earlier(cfg, "decode", tuple(cfg.kinds))[0] if r["context"] in cfg.decode_contexts]
    return {"rows": sorted(kept + rows, key=lambda r: r["context"])}


@torch.no_grad()
def run_hf_decode(cfg: LMBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """The same through transformers: the models as ``PolymixerForCausalLM``, one forward per token with the
    ``PolymixerCache`` — the loop ``generate()`` runs (needs the [hf] extra)."""
    from ...hf import output_cache, to_hf

    torch.manual_seed(cfg.seed)
    models = {k: to_hf(_model(cfg, k)).eval() for k in cfg.kinds}

    def step(m: Any, tok: torch.Tensor, cache: Any) -> Any:
        m(tok, cache=cache, use_cache=True)
        return cache

    rows = _decode_rows(cfg, models, cfg.hf_decode_contexts, lambda m, p: output_cache(m(p, use_cache=True)),
                        step, lambda c: c.memory_bytes, progress, "bench lm hf_decode")
    return {"rows": rows}


def run_quality(cfg: LMBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Train the tiny presets for the same steps on the default corpus, each swept preset at every rate of the
    grid; validation loss and bits per byte, and each preset at its best rate (the lowest validation loss). With
    ``larger``, each preset made larger then trains at its best rate carried over by the width rule: every gap to
    attention at two sizes."""
    from .task import train_lm
    from ..train.loop import TrainConfig

    smaller = larger_models(cfg)

    def recipe(cfg: LMBenchConfig, job: SweepRun, stage: Stage) -> Any:
        return TrainConfig(steps=cfg.quality_steps, batch_size=cfg.quality_batch, lr=job.lr, min_lr=job.lr / 10,
                           warmup=max(1, cfg.quality_steps // 20), eval_every=cfg.quality_steps,
                           ckpt_every=cfg.quality_steps, out=str(job.out), progress=progress, seed=cfg.seed + 1337)

    def evaluate(cfg: LMBenchConfig, job: SweepRun, stage: Stage,
                 tcfg: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        # a preset, or a variant of one: "tiny-vpom+value_heads=1+shift_width=2"
        res = train_lm(job.preset, tcfg, tokenizer=cfg.tokenizer, eval_windows=cfg.quality_eval_windows,
                       corpus=None if cfg.corpus == "stdlib" else cfg.corpus, **job.overrides)
        model = res["model"]  # (its vocabulary: the tokenizer's, where the preset's is smaller)
        size = {"smaller": smaller[job.spec]} if job.spec in smaller else {}
        return res, {"model": job.spec, "spec": job.spec, **size, "params": count_parameters(model),
                     "steps": cfg.quality_steps,
                     "tokens": cfg.quality_steps * cfg.quality_batch * model.config.block_size, **res["metrics"],
                     **heldout(cfg, job)}

    # rows from before sweeps carry no spec and no rate: the preset's name and the recipe's rate then (2e-3)
    sweep = QualitySweep("lm", 2e-3, ("model",), recipe, evaluate, _select, lambda rows: "val_loss",
                         base="quality_lr", earlier_defaults=lambda r: {"spec": r["model"]})
    stages = [Stage(tuple(cfg.quality_presets))]
    if smaller:  # after the smaller models: their best rates, carried over
        stages.append(Stage(tuple(smaller), rates=lambda rows: scaled_rates(*chosen_rows(cfg, rows), smaller),
                            rates_label=lambda s: f"best {smaller[s]} × {width_ratio(smaller[s], s):g}",
                            past=lambda s, rows: scaled_past(s, smaller[s], rows)))
    return sweep.run(cfg, stages)


def heldout(cfg: LMBenchConfig, job: SweepRun) -> Dict[str, Any]:
    """The trained run's held-out figures (``test_loss``, ``test_bpb``: the final checkpoint on the corpus's test
    split, with the windows validation reads) — reported, never chosen on; none for a corpus without a test split
    (the standard library's sources)."""
    if cfg.corpus == "stdlib":
        return {}
    from .task import evaluate_checkpoint

    res = evaluate_checkpoint(str(job.out), windows=cfg.quality_eval_windows, lengths=(1,), split="test")
    return {k: v for k, v in res["lengths"][0].items() if k.startswith("test_")}


def run_ngram(cfg: LMBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """The n-gram baseline of the quality part's corpus (:func:`.ngram.ngram_rows`: counts on train, discounts
    chosen on validation, scored on validation and test) for each of ``ngram_tokenizers``; the rows of tokenizers
    not run again are kept from the earlier file."""
    import numpy as np

    from .bpe import lab_tokenizer
    from .data import load_corpus
    from .ngram import SMOOTHING, ngram_rows

    rows, seconds = [], {}
    for name in cfg.ngram_tokenizers:
        tok = lab_tokenizer(name)
        corpus = load_corpus(None, cfg.corpus, tok, progress=progress)
        test = np.asarray(corpus.test()) if corpus.open_test is not None else None
        t0 = time.perf_counter()
        rows += [{"tokenizer": name, **r} for r in ngram_rows(np.asarray(corpus.train), np.asarray(corpus.val), test,
                                                              tok.vocab_size, tok.token_bytes(), cfg.ngram_order)]
        seconds[name] = time.perf_counter() - t0
    path = Path(cfg.out) / "lm.json"
    earlier = read_json(path).get("ngram", {}) if path.is_file() else {}
    kept = [r for r in earlier.get("rows", []) if r["tokenizer"] not in cfg.ngram_tokenizers]
    return {"rows": kept + rows, "smoothing": SMOOTHING, "corpus": cfg.corpus,
            "seconds": {**earlier.get("seconds", {}), **seconds}}


def larger_models(cfg: LMBenchConfig) -> Dict[str, str]:
    """Each quality preset made larger by ``cfg.larger``, to its smaller preset; a malformed ``--larger`` (not
    "+field=value…", or a field the preset lacks) is a one-line error naming it, before any part runs."""
    if not cfg.larger:
        return {}
    if not cfg.larger.startswith("+"):
        raise ValueError(f"--larger {cfg.larger!r}: config overrides after '+', e.g. +n_embd=256")
    smaller = {spec + cfg.larger: spec for spec in cfg.quality_presets}
    for spec in smaller:
        try:
            parse_variant(spec)
        except ValueError as e:
            raise ValueError(f"--larger {cfg.larger!r}: {e}") from None
    return smaller


def width_ratio(small: str, large: str) -> float:
    """The width rule's factor from ``small``'s rate to ``large``'s: its width ÷ the larger one's — Adam's best rate
    for the hidden weights falls as 1 / width (μP, Yang et al. 2021), so doubling the width halves the rate."""
    def width(spec: str) -> int:
        preset, overrides = parse_variant(spec)
        return create_model(preset, device="meta", **overrides).config.n_embd

    return width(small) / width(large)


def chosen_rows(cfg: LMBenchConfig, rows: List[Dict[str, Any]]) -> Tuple[List[Dict[str, Any]], Path]:
    """The rows whose best rates the larger models carry over, and their file: this folder's — or, in a seed folder
    (``<out>/lm_seed<N>``), the selection seed's (``<out>/lm.json``): seed 0's sweep chose each smaller model's
    rate, and every seed trains the larger model at that same rate, never at the rate its own seed would pick."""
    out = Path(cfg.out)
    main = main_payload(out, "lm")
    if main is None:
        return rows, out / "lm.json"
    return main.get("quality", {}).get("rows", []), out.parent / "lm.json"  # (as selected when written)


def scaled_rates(rows: List[Dict[str, Any]], path: Path, smaller: Dict[str, str]) -> Dict[str, float]:
    """Each larger model's rate: its smaller model's (``smaller[large]``) best rate among ``rows`` (of ``path``),
    chosen on validation, × the width rule's factor. A smaller model with no run is an error, not a run at the
    recipe's rate."""
    best = {r["model"]: r["lr"] for r in rows if r.get("best_lr")}
    missing = sorted({small for small in smaller.values() if small not in best})
    if missing:
        raise ValueError(f"--larger: {', '.join(missing)} has no run in {path} to carry a rate over from")
    return {large: best[small] * width_ratio(small, large) for large, small in smaller.items()}


def scaled_past(large: str, small: str, rows: List[Dict[str, Any]]) -> Optional[float]:
    """The one rate a larger model adds: where its smaller model's pick sat at an edge of the rates that model was
    tried at, the rate one grid step past that edge, carried over by the width rule; None where the pick lies
    inside, or where the larger model already ran at that rate."""
    mine = [r for r in rows if r.get("model") == small]
    past = beyond(mine, next((r for r in mine if r.get("best_lr")), None), "model")
    if past is None:
        return None
    lr = past * width_ratio(small, large)
    return None if any(r.get("model") == large and same_rate(r["lr"], lr) for r in rows) else lr


def _select(rows: List[Dict[str, Any]], cfg: LMBenchConfig) -> List[Dict[str, Any]]:
    """Each preset's best rate marked (the lowest validation loss), each row's loss ÷ attention's at its best —
    attention at the row's size: a larger model (its row names its ``smaller`` one) against the larger attention."""
    mark_best(rows, "val_loss", higher=False)
    # attention's plainest form ("tiny-attention", or "tiny-attention+block_size=1024" when every preset is a variant)
    atts: Dict[bool, List[Dict[str, Any]]] = {}
    for r in best_rows(rows):
        if r["model"].split("+")[0].endswith("attention"):
            atts.setdefault("smaller" in r, []).append(r)
    for r in rows:
        same = atts.get("smaller" in r)
        att = min(same, key=lambda a: a["model"].count("+")) if same else None
        r["loss_vs_attention"] = r["val_loss"] / att["val_loss"] if att else None
    return rows


def _seed_losses(payload: Dict[str, Any], seeds: Sequence[Dict[str, Any]], row: Dict[str, Any]
                 ) -> Dict[int, float]:
    """``row``'s validation loss on each seed run at its model and rate: the main folder's (its own seed) and each
    seed folder's (``seeds``: their payloads)."""
    out = {payload_seed(payload) or 0: row["val_loss"]}
    for p in seeds:
        seed = payload_seed(p) or 0
        out.update({seed: r["val_loss"] for r in p.get("quality", {}).get("rows", [])
                    if r["model"] == row["model"] and same_rate(r["lr"], row["lr"])})
    return out


def _two_scale_losses(payload: Dict[str, Any], seeds: Sequence[Dict[str, Any]] = ()
                      ) -> Dict[str, List[Tuple[int, Dict[int, float]]]]:
    """Each model made larger, keyed by its smaller model: at each size its parameters and its validation loss per
    seed — the smaller model at its chosen rate, the larger at its carried rate, each seed at that same rate."""
    best = {r["model"]: r for r in best_rows(payload["quality"]["rows"])}
    return {best[big["smaller"]]["model"]: [(row["params"], _seed_losses(payload, seeds, row))
                                            for row in (best[big["smaller"]], big)]
            for big in best.values() if big.get("smaller") in best}


def two_scale_points(payload: Dict[str, Any], seeds: Sequence[Dict[str, Any]] = ()
                     ) -> Dict[str, List[Tuple[int, float, float, float, int]]]:
    """The two-scale curve of each model made larger, keyed by its smaller model: at each size (parameters) the
    validation loss's median, lowest and highest over the seeds and how many — the smaller model at its chosen
    rate, the larger at its carried rate, each seed (``seeds``: the seed folders' payloads) at that same rate."""
    return {name: [(params, statistics.median(v.values()), min(v.values()), max(v.values()), len(v))
                   for params, v in pts] for name, pts in _two_scale_losses(payload, seeds).items()}


def two_scale_lines(payload: Dict[str, Any], seeds: Sequence[Dict[str, Any]] = ()) -> List[str]:
    """Each model's gap to attention at the smaller size and at the larger one, with the direction (does the
    model gain on attention with size?) — the two-scale curve in words, one line per model made larger, attention
    being the attention model made larger too. Each gap pairs seeds as ``bench parity`` does: the model's median
    over the seeds both it and attention ran there against attention's median over the same seeds."""
    curves = _two_scale_losses(payload, seeds)
    atts = [name for name in curves if name.split("+")[0].endswith("attention")]
    if not atts:
        return []
    att = min(atts, key=lambda a: a.count("+"))
    lines = []
    for name, pts in curves.items():
        paired = [sorted(set(m) & set(base)) for (_, m), (_, base) in zip(pts, curves[att])]
        if name == att or not all(paired):
            continue
        a, b = (100 * (statistics.median(m[s] for s in both) / statistics.median(base[s] for s in both) - 1)
                for (_, m), (_, base), both in zip(pts, curves[att], paired))
        trend = (f"it gains {a - b:.1f} points on attention" if b < a else
                 f"it loses {b - a:.1f} points to attention" if b > a else "the gap holds")
        seeds_run = " / ".join(", ".join(map(str, both)) for both in paired)
        lines.append(f"two scales: {name} against {att}: {a:+.1f}% ({pts[0][0]:,} params) → {b:+.1f}% "
                     f"({pts[1][0]:,} params), medians over the seeds both ran (seeds {seeds_run}): with size {trend}")
    return lines


def _plot_two_scales(ax: Any, curves: Dict[str, List[Tuple[int, float, float, float, int]]]) -> None:
    for name, pts in curves.items():
        params, med, low, high, n = zip(*pts)
        ax.errorbar(params, med, yerr=[[m - lo for m, lo in zip(med, low)], [hi - m for m, hi in zip(med, high)]],
                    marker="o", capsize=3, label=f"{name} (seeds: {' / '.join(map(str, n))})")
    ax.set_xscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("validation loss (nats / byte)")
    ax.set_title("quality at two sizes (median, range over seeds)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2))  # below: the curves fill the panel


def _throughput_report(payload: Dict[str, Any]) -> List[str]:
    lines: List[str] = []
    p = payload["throughput"]
    lines += ["forward throughput (k tokens/s; batch = budget / N)",
              format_table(p["rows"], ["N", "batch", "model", "ms", "ktok_s", "vs_attention"],
                           ["N", "B", "model", "ms", "k tok/s", "÷ attention"]),
              "params: " + ", ".join(f"{k} {v:,}" for k, v in p["params"].items()), ""]
    pom = {r["N"]: r["vs_attention"] for r in p["rows"] if r["model"] == "pom"}
    ahead = [n for n in pom if n >= 4096]
    if ahead:
        ok = all(pom[n] > 1 for n in ahead)
        lines.append(f"pom ahead of attention from 4k tokens on: {'met' if ok else 'MISSED'} "
                     f"({', '.join(f'{n}: {pom[n]:.2f}×' for n in sorted(pom))})\n")
    paper = {1024: 1.74, 4096: 3.03, 16384: 6.30, 32768: 8.62}  # GPPoM2-S ÷ GPT-2 forward, the paper's H100
    gppom = {r["N"]: r["vs_attention"] for r in p["rows"] if r["model"] == "gppom2-small"}
    shared = [n for n in sorted(gppom) if n in paper]
    if shared:
        ok = all(gppom[n] >= paper[n] for n in shared)
        lines.append(f"GPPoM2-S ÷ GPT-2 tokens/s at least the paper's ratios: {'met' if ok else 'MISSED'} ("
                     + ", ".join(f"{n}: {gppom[n]:.2f}× vs {paper[n]:.2f}×" for n in shared) + ")\n")
    return lines


def _decode_report(payload: Dict[str, Any]) -> List[str]:
    lines: List[str] = []
    rows = payload["decode"]["rows"]
    lines += ["decoding after a context of N tokens (batch 1)",
              format_table(rows, ["context", "model", "ms_per_token", "vs_first_context", "state_mb",
                                  "prefill_s"],
                           ["context", "model", "ms / token", "÷ first context", "state MB", "prefill s"]), ""]
    by = {(r["model"], r["context"]): r for r in rows}
    ctxs = sorted({r["context"] for r in rows})
    target = 32768 if 32768 in ctxs else ctxs[-1]
    base = ctxs[0]
    pom_growth = by[("pom", target)]["ms_per_token"] / by[("pom", base)]["ms_per_token"]
    att_ratio = by[("attention", target)]["ms_per_token"] / by[("pom", target)]["ms_per_token"]
    lines.append(f"pom per-token time at {target} vs {base}: {pom_growth:.2f}× "
                 f"(target ≤ 1.2: {'met' if pom_growth <= 1.2 else 'MISSED'})")
    lines.append(f"attention per-token time ÷ pom at {target}: {att_ratio:.2f}× "
                 f"(target ≥ 5: {'met' if att_ratio >= 5 else 'MISSED'})")
    for k in ("vpom", "vhybrid"):
        if (k, target) in by and (k, base) in by:
            a, b = by[(k, base)], by[(k, target)]
            g = b["ms_per_token"] / a["ms_per_token"]
            lines.append(f"{k} per-token time at {target} vs {base}: {g:.2f}× (flat: "
                         f"{'yes' if g <= 1.2 else 'NO'}), state {b['state_mb']:.3g} MB at every context: "
                         f"{'yes' if b['state_mb'] == a['state_mb'] else 'NO'}")
    lines.append("")
    return lines


def _hf_decode_report(payload: Dict[str, Any]) -> List[str]:
    lines: List[str] = []
    rows = payload["hf_decode"]["rows"]
    lines += ["decoding through transformers (PolymixerForCausalLM + PolymixerCache, the loop of generate())",
              format_table(rows, ["context", "model", "ms_per_token", "vs_first_context", "state_mb"],
                           ["context", "model", "ms / token", "÷ first context", "state MB"])]
    pom = [r for r in rows if r["model"] == "pom"]
    growth = pom[-1]["ms_per_token"] / pom[0]["ms_per_token"]
    lines.append(f"pom per-token time at {pom[-1]['context']} vs {pom[0]['context']}: {growth:.2f}× "
                 f"(flat: {'met' if growth <= 1.2 else 'MISSED'})\n")
    return lines


def _quality_report(payload: Dict[str, Any], seeds: Optional[Any], main_json: Optional[Any]) -> List[str]:
    lines: List[str] = []
    q = payload["quality"]
    all_rows = q["rows"]
    rows = best_rows(all_rows)
    prose = (payload.get("config") or {}).get("corpus", "stdlib") == "prose"
    corpus = "English prose: Wikipedia's vital articles" if prose else "the Python standard library's sources"
    tokens = (payload.get("config") or {}).get("tokenizer") or "bytes"
    lines += [f"quality at equal steps (corpus: {corpus}, tokenizer: {tokens}), each model at its best learning rate "
              "(lowest validation loss)",
              format_table(rows, ["model", "params", "lr", "rates", "steps", "tokens", "val_loss", "val_bpb",
                                  "loss_vs_attention", "train_min"],
                           ["model", "params", "best lr", "rates tried", "steps", "tokens", "val loss", "val bpb",
                            "÷ attention", "train min"]),
              "", "every rate (AdamW, warm-up then cosine to lr / 10; * = best)",
              sweep_table(all_rows, "val_loss", "val loss")]
    # (a larger model runs at its smaller one's rate carried over, not swept: no edge to note)
    lines += [note for note in [edge_note([r for r in all_rows if "smaller" not in r], key="model")] if note]
    lines += two_scale_lines(payload, seeds or []) + [""]
    # judged as the comparison of its corpus and tokens (the prose LM in bytes: both sizes); tokens of another
    # vocabulary are no comparison's
    bench = "lm" if not prose else {"bytes": "lm_prose", "prose-bpe-4096": "lm_tokens"}.get(tokens)
    lines += verdict_lines(bench, payload, seeds, main_json) if bench else []
    return lines


def _ngram_report(payload: Dict[str, Any]) -> List[str]:
    p = payload["ngram"]
    cols = [c for c in ("tokenizer", "order", "discount", "contexts", "val_loss", "val_bpb", "test_loss", "test_bpb",
                        "test_nats_per_byte") if any(c in r for r in p["rows"])]
    shown = [{k: f"{v:.4f}" if k.endswith(("loss", "bpb", "byte")) and isinstance(v, float) else v
              for k, v in r.items()} for r in p["rows"]]
    return [f"n-gram baseline (corpus {p['corpus']}; {p['smoothing']}); loss in nats per token",
            format_table(shown, cols, [c.replace("_", " ") for c in cols]),
            "seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in p.get("seconds", {}).items()), ""]


def report(payload: Dict[str, Any], seeds: Optional[List[Dict[str, Any]]] = None,
           main_json: Optional[Dict[str, Any]] = None) -> str:
    """The LM bench's text: throughput, decoding cost against context (own loop and transformers'), the quality
    sweep with its verdicts (``seeds``, ``main_json``: for the parity targets, as in the other families)."""
    return render_report(payload, {"throughput": _throughput_report, "decode": _decode_report,
                                   "hf_decode": _hf_decode_report,
                                   "quality": lambda p: _quality_report(p, seeds, main_json),
                                   "ngram": _ngram_report})


def plot(payload: Dict[str, Any], path: Path) -> None:
    """Throughput and decoding against length; with a larger model in the quality part, its two-scale curve (over
    the seed folders beside ``path`` where it is the main folder)."""
    parts = [p for p in ("throughput", "decode") if p in payload]
    seeds = seed_payloads(path.parent, "lm") if main_payload(path.parent, "lm") is None else []
    curves = two_scale_points(payload, seeds) if "quality" in payload else {}
    if not parts and not curves:
        return
    fig, axes = new_figure(len(parts) + (1 if "decode" in payload else 0) + (1 if curves else 0),
                           height=5.0 if curves else 4.0)
    i = 0
    if curves:
        _plot_two_scales(axes[i], curves)
        i += 1
    if "throughput" in payload:
        ax = axes[i]
        i += 1
        for k in dict.fromkeys(r["model"] for r in payload["throughput"]["rows"]):
            pts = [(r["N"], r["ktok_s"]) for r in payload["throughput"]["rows"] if r["model"] == k]
            ax.plot(*zip(*pts), marker="o", label=k)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens per sequence")
        ax.set_ylabel("forward k tokens/s")
        ax.set_title("forward throughput")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    if "decode" in payload:
        for key, label, title in (("ms_per_token", "ms per generated token", "decoding time"),
                                  ("state_mb", "state MB", "decoding state memory")):
            ax = axes[i]
            i += 1
            for k in dict.fromkeys(r["model"] for r in payload["decode"]["rows"]):
                pts = [(r["context"], r[key]) for r in payload["decode"]["rows"] if r["model"] == k]
                ax.plot(*zip(*pts), marker="o", label=k)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("context tokens")
            ax.set_ylabel(label)
            ax.set_title(title)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
    if parts:  # (timings: the machine matters)
        c, m = payload["config"], payload["machine"]
        title = (f"language models: {c['n_layer']} layers × {c['n_embd']}, local window {c['window']} — "
                 f"{m['cpu']} ({m['torch_threads']} threads)")
    else:
        q = payload["quality"]["config"]
        title = f"language models, corpus {q.get('corpus', 'stdlib')}, {q['quality_steps']} steps each"
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path)


BENCH = FamilyBench("lm", {"throughput": run_throughput, "decode": run_decode, "hf_decode": run_hf_decode,
                            "quality": run_quality, "ngram": run_ngram}, plot, report,
                    recipes=(("corpus", "stdlib", "--corpus"), ("tokenizer", "bytes", "--tokenizer")))


def run(cfg: LMBenchConfig, progress: bool = True) -> Dict[str, Any]:
    """Run the parts asked for, keeping the other parts of an earlier run in the same folder."""
    return run_bench(BENCH, cfg, progress)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = LMBenchConfig()
    p.add_argument("--quick", action="store_true", help="a few-minute version of every part")
    p.add_argument("--parts", nargs="+", choices=["throughput", "decode", "hf_decode", "quality", "ngram"],
                   default=list(d.parts))
    p.add_argument("--n-layer", type=int_at_least(1), default=d.n_layer)
    p.add_argument("--n-embd", type=int_at_least(1), default=d.n_embd)
    p.add_argument("--n-head", type=int_at_least(1), default=d.n_head)
    p.add_argument("--window", type=int_at_least(1), default=d.window)
    p.add_argument("--tokens", type=int_at_least(1), default=None, help="token budget per forward call")
    p.add_argument("--lengths", type=int_at_least(1), nargs="+", default=None, help="throughput sequence lengths")
    p.add_argument("--contexts", type=int_at_least(1), nargs="+", default=None, help="decoding contexts")
    p.add_argument("--quality-steps", type=int_at_least(1), default=None)
    p.add_argument("--quality-batch", type=int_at_least(1), default=None,
                   help=f"windows per step of the quality part (default {d.quality_batch})")
    p.add_argument("--tokenizer", type=tokenizer_argument, default=d.tokenizer,
                   help="the quality part's tokens, as train lm's --tokenizer: bytes, prose-bpe-<N> (token-level "
                        "models; their vocabulary is the tokenizer's), a tokenizers JSON file")
    p.add_argument("--ngram-tokenizers", nargs="+", type=tokenizer_argument, default=None,
                   help=f"the ngram part's tokens, each its own rows (default: {' '.join(d.ngram_tokenizers)})")
    p.add_argument("--kinds", nargs="+", type=kind_argument, default=None,
                   help=f"models of the throughput and decoding parts (tiny-<kind>: {', '.join(KINDS)}), a form with "
                        "options as kind+field=value (hybrid+attention_shift=4)")
    p.add_argument("--presets", nargs="+", default=None,
                   help="presets of the quality part (those not given keep their earlier rows); a variant overrides "
                        "config fields: tiny-vpom+value_heads=1+shift_width=2")
    p.add_argument("--larger", default=None,
                   help="overrides that make each preset larger (e.g. +n_embd=256): the larger model trains after "
                        "it at its best rate times the width rule's factor (smaller width ÷ larger), one rate more "
                        "where that pick sat at an edge of its grid; the report shows each gap at both sizes")
    p.add_argument("--corpus", choices=["stdlib", "prose"], default=d.corpus,
                   help="the quality part's text: the Python standard library's sources (the quick check) or English "
                        "prose (the [prose] extra; the paper's setting with +block_size=1024 presets)")
    p.add_argument("--device", default=d.device,
                   help="cuda: the throughput part on the GPU with the paper's models in bf16 (GPT-2 small vs "
                        "GPPoM2-S on the Triton kernels), the paper's protocol")
    add_sweep_arguments(p, "lm", d.quality_lr, d.lr_factors, d.out)


def main(args: argparse.Namespace) -> int:
    cfg = LMBenchConfig(n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head, window=args.window,
                        parts=tuple(args.parts), device=args.device, corpus=args.corpus, tokenizer=args.tokenizer,
                        out=args.out)
    larger_models(replace(cfg, larger=args.larger or "", quality_presets=tuple(args.presets or cfg.quality_presets)))
    return bench_main(BENCH, args, cfg, QUICK,
                      {"tokens": "tokens", "lengths": "throughput_lengths", "contexts": "decode_contexts",
                       "quality_steps": "quality_steps", "quality_batch": "quality_batch",
                       "ngram_tokenizers": "ngram_tokenizers", "kinds": "kinds", "presets": "quality_presets",
                       "larger": "larger"})
