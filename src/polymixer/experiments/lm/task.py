"""Language modelling: the task the shared training loop runs, evaluation (loss, bits per byte, length
generalisation), and the ``polymixer train lm`` / ``generate`` / ``eval lm`` commands."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

import numpy as np
import torch
from torch import nn

from ..data.faults import SampleFaults
from .bpe import TOKENIZER_CHOICES, lab_tokenizer, run_tokenizer, tokenizer_argument
from .data import CORPORA, Corpus, TokenWindows, check_vocabulary, load_corpus, shard_files
from ...models import create_model, model_config
from ...models.lm import pad_left
from ...ops import parallel
from ...checkpoint import load_model, read_config
from ...ranges import Range
from ..train.loop import TrainConfig, add_train_config_arguments, model_device, train, train_config_from_args
from ..tasks.common import (
    add_field_flags,
    add_preset_argument,
    add_set_argument,
    check_dataset,
    check_preset,
    config_overrides,
    field_overrides,
    float_in,
    int_at_least,
)

__all__ = ["LMTask", "evaluate_lm", "train_lm"]

LN2 = math.log(2.0)


class LMTask:
    """Next-token prediction on random windows; documents never attend into one another (``sep_token``).
    Evaluation splits its windows as training does under context parallelism (``split_evaluation``)."""

    unit = "tok"
    split_evaluation = True

    def __init__(self, corpus: Corpus, token_bytes: Optional[np.ndarray], block_size: int, batch_size: int, seed: int,
                 pack: bool = True, eval_windows: int = 256, eval_batch: int = 32,
                 faults: Optional[SampleFaults] = None) -> None:
        self.corpus, self.faults = corpus, faults
        self.train_windows = TokenWindows(corpus.train, block_size)
        self.val_windows = TokenWindows(corpus.val, block_size)
        self.batch_size, self.seed, self.pack = batch_size, seed, pack
        self.eot = corpus.eot_id
        self.token_bytes = None if token_bytes is None else torch.from_numpy(token_bytes)  # None: loss only
        self.eval_windows, self.eval_batch = eval_windows, eval_batch

    def batch(self, step: int, share: int, shares: int, device: torch.device) -> tuple:
        x, y = self.train_windows.random(step, self.batch_size, self.seed, share, shares)
        return x.to(device), y.to(device)

    def split(self, batch: tuple, part: int, parts: int) -> tuple:
        """Context parallelism: this rank's contiguous slice of every window (inputs and targets alike)."""
        if self.pack:
            raise ValueError("--context-parallel trains on plain windows: packed documents (cu_seqlens) cannot be "
                             "split across ranks; add --no-pack")
        return split_windows(batch, part, parts)

    def count(self, batch: tuple) -> int:
        return batch[0].numel()

    def loss(self, model: nn.Module, batch: tuple) -> torch.Tensor:
        x, y = batch
        _, loss = model(x, y, sep_token=self.eot if self.pack else None)
        return loss

    def evaluate(self, model: nn.Module, step: int, out_dir: Path) -> Dict[str, float]:
        return evaluate_lm(model, self.val_windows, self.token_bytes, self.eot if self.pack else None,
                           self.eval_windows, self.eval_batch)


# a long context's evaluation reads at most this many times the split: past that, more windows of it only shift
# over the same tokens (256 windows of 2^20 tokens over a 1.4 M-token split: 190 times over)
MAX_COVERAGE = 4


def window_count(windows: TokenWindows, count: int) -> int:
    """The windows an evaluation of ``count`` reads: ``count``, or fewer where they would read the split more than
    :data:`MAX_COVERAGE` times over."""
    return max(1, min(count, -(-MAX_COVERAGE * len(windows.data) // windows.block_size)))


def split_windows(batch: tuple, part: int, parts: int) -> tuple:
    """Context parallelism's cut of a batch of windows (training's and evaluation's): ``part``'s contiguous slice of
    every window, inputs and targets alike, in ``parts`` equal slices."""
    x, y = batch
    T = x.shape[1]
    if T % parts:
        raise ValueError(f"--context-parallel {parts} must divide the context length {T} (equal slices keep "
                         f"the mean of the slices' losses the loss of the whole window)")
    n = T // parts
    return x[:, part * n:(part + 1) * n], y[:, part * n:(part + 1) * n]


@torch.no_grad()
def evaluate_lm(model: nn.Module, windows: TokenWindows, token_bytes: Optional[torch.Tensor],
                sep_token: Optional[int], count: int = 256, batch: int = 32, progress: bool = False,
                desc: str = "eval") -> Dict[str, float]:
    """Mean loss (nats per token) and bits per byte over ``count`` evenly spaced windows of a split (fewer for a
    context so long that they would read the split more than :data:`MAX_COVERAGE` times over).

    Bits per byte = total nats / ln 2 / the number of UTF-8 bytes the predicted tokens stand for (end-of-text counts
    zero bytes): comparable across tokenizers. ``token_bytes`` None (token shards whose tokenizer is not known): the
    loss alone.

    Under :func:`polymixer.context_parallel` (the training loop's evaluation of a context-parallel run) each rank of
    the group runs its contiguous slice of every window, as training does — no rank holds a whole window — and the
    sums are added over the group: every rank returns the figures of the whole windows.
    """
    from tqdm.auto import tqdm

    cp = parallel.active()
    if cp is not None and sep_token is not None:
        raise ValueError("--context-parallel evaluates plain windows: packed documents cannot be split across ranks; "
                         "add --no-pack")
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    sums = torch.zeros(3, dtype=torch.float64)  # nats, tokens, bytes
    count = window_count(windows, count)
    for x, y in tqdm(windows.fixed(count, batch), total=-(-count // batch), desc=desc,
                     disable=not progress, dynamic_ncols=True, leave=False):
        if cp is not None:
            x, y = split_windows((x, y), cp.rank, cp.world)
        x, y = x.to(device), y.to(device)
        logits, _ = model(x, sep_token=sep_token)
        ce = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                                               reduction="sum")
        del logits
        sums += torch.tensor([float(ce), y.numel(), 0 if token_bytes is None else int(token_bytes[y.cpu()].sum())],
                             dtype=torch.float64)
    model.train(was)
    if cp is not None:
        import torch.distributed as dist

        total = sums.to(cp.comm_device())
        dist.all_reduce(total, group=cp.group)
        sums = total.cpu()
    nats, tokens, nbytes = float(sums[0]), int(sums[1]), int(sums[2])
    if token_bytes is None:
        return {"val_loss": nats / tokens}
    return {"val_loss": nats / tokens, "val_bpb": nats / LN2 / max(nbytes, 1)}


# ----------------------------------------------------------------------------------------------------------------
# polymixer train lm
# ----------------------------------------------------------------------------------------------------------------



def add_train_arguments(p: argparse.ArgumentParser) -> None:
    t = TrainConfig()
    add_preset_argument(p, "lm")
    g = p.add_argument_group("model overrides (every field of LMConfig, as a flag or --set FIELD=VALUE)")
    add_field_flags(g, "lm")
    add_set_argument(g, "lm")
    d = p.add_argument_group("data")
    d.add_argument("--data", nargs="*", default=None,
                   help="text files or folders; or pre-tokenised .bin files (modded-nanogpt's shards: header + "
                        "uint16 tokens; nanoGPT's raw train.bin / val.bin), or folders holding them, trained on as "
                        "they are (GPT-2's vocabulary: --vocab-size 50304) (default: --corpus)")
    d.add_argument("--corpus", choices=list(CORPORA), default=None,
                   help="a named corpus: " + "; ".join(f"{k}: {v}" for k, v in CORPORA.items()) +
                        " (default: stdlib)")
    d.add_argument("--tokenizer", type=tokenizer_argument, default="bytes",
                   help=TOKENIZER_CHOICES + " (token shards: the tokenizer that wrote them, for bits per byte; "
                        "'bytes' there means not known: the loss alone). A model whose vocabulary is smaller than "
                        "the tokenizer's takes the tokenizer's unless --vocab-size is given")
    d.add_argument("--val-fraction", type=float_in(Range(0, 1, True, True)), default=None,
                   help="the share of the files held out for validation (a single file: of its tokens; default "
                        "0.1), or of the prose articles (default 0.05, and 0.05 for test)")
    d.add_argument("--no-pack", action="store_true", help="let windows attend across end-of-text")
    d.add_argument("--eval-windows", type=int_at_least(1), default=256,
                   help="validation windows per evaluation (fewer at a context so long that they would read the "
                        "validation split more than 4 times over)")
    add_train_config_arguments(p.add_argument_group("optimisation"), t, "run folder (default: runs/lm/<preset>)")


def train_lm(preset: str, train_cfg: TrainConfig, data: Optional[List[str]] = None, tokenizer: str = "bytes",
             val_fraction: Optional[float] = None, pack: bool = True, eval_windows: int = 256,
             corpus: Optional[str] = None, **overrides: Any) -> Dict[str, Any]:
    """Build ``preset`` (with overrides), prepare the corpus (``data``: text or token shards; ``corpus``: a named
    one, e.g. ``"prose"``; neither: the standard library's sources), and train it with the shared loop. A test split
    is never read here."""
    check_preset("lm", preset)
    tok = lab_tokenizer(tokenizer)
    shards = bool(data) and shard_files(data) is not None
    if "vocab_size" not in overrides and not shards and model_config(preset).vocab_size < tok.vocab_size:
        overrides = {**overrides, "vocab_size": tok.vocab_size}  # a token-level model of a byte preset
    cfg = model_config(preset, **overrides)
    if cfg.vocab_size < tok.vocab_size and not shards:  # (shards: checked against their largest token below)
        raise ValueError(f"{preset} has a vocabulary of {cfg.vocab_size} but the {tok.name!r} tokenizer needs "
                         f"{tok.vocab_size}; pass --vocab-size {tok.vocab_size}")
    faults = SampleFaults.training(train_cfg.skip_bad_samples)
    if data and train_cfg.check_data:  # (the standard library's sources, the default, are known good)
        check_dataset("lm", list(data), progress=train_cfg.progress, skip_bad_samples=train_cfg.skip_bad_samples)
    texts = load_corpus(data, corpus, tok, val_fraction, progress=train_cfg.progress, faults=faults)
    check_vocabulary(texts, cfg.vocab_size, preset)
    torch.manual_seed(train_cfg.seed)  # the initial weights are part of the run's reproducible state
    model = create_model(preset, device=model_device(train_cfg), **overrides)
    task = LMTask(texts, tok.token_bytes() if texts.token_bytes_known else None, cfg.block_size,
                  train_cfg.batch_size, train_cfg.seed, pack, eval_windows, faults=faults)
    meta = {"family": "lm", "preset": preset, "model": asdict(cfg),
            "data": {"paths": data, "named": corpus, "corpus": texts.meta["name"], "tokenizer": tokenizer,
                     "tokenizer_digest": getattr(tok, "digest", None),
                     "val_fraction": texts.meta.get("val_fraction"), "tokens": texts.meta["tokens"], "pack": pack}}
    return {**train(model, task, train_cfg, meta), "model": model}


def main_train(args: argparse.Namespace) -> int:
    overrides = config_overrides("lm", args.preset, args.set_fields, field_overrides(args))
    tcfg = train_config_from_args(args, TrainConfig(), f"runs/lm/{args.preset}")
    res = train_lm(args.preset, tcfg, args.data, args.tokenizer, args.val_fraction, not args.no_pack,
                   args.eval_windows, corpus=args.corpus, **overrides)
    if res["rank"] == 0:
        print(json.dumps({"run": tcfg.out, **res["metrics"]}, indent=2))
    return 0


# ----------------------------------------------------------------------------------------------------------------
# polymixer generate
# ----------------------------------------------------------------------------------------------------------------


def add_generate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ckpt", required=True, help="run folder or checkpoint folder")
    p.add_argument("--prompt", action="append", default=None,
                   help="prompt text (repeat for a batch; default: end-of-text, i.e. unconditional)")
    p.add_argument("--max-new-tokens", type=int_at_least(1), default=256, help="tokens to generate after each prompt")
    p.add_argument("--temperature", type=float_in(Range(0)), default=0.8,
                   help="softmax temperature of the sampling (lower: more deterministic; 0: greedy)")
    p.add_argument("--top-k", type=int_at_least(1), default=None,
                   help="sample among the k most likely tokens only (default: all)")
    p.add_argument("--top-p", type=float_in(Range(0, 1, low_open=True)), default=None,
                   help="sample among the most likely tokens whose probabilities sum to p (nucleus; default: off)")
    p.add_argument("--seed", type=int_at_least(0), default=0,
                   help="random seed of the sampling (the same seed, the same text)")
    p.add_argument("--num-samples", type=int_at_least(1), default=1, help="samples per prompt")
    p.add_argument("--no-stop", action="store_true", help="do not stop at end-of-text")


def main_generate(args: argparse.Namespace) -> int:
    cfg = read_config(args.ckpt)
    if cfg.get("family") != "lm":
        raise ValueError(f"{args.ckpt} holds a {cfg.get('family')!r} model; generate needs a language model")
    model = load_model(args.ckpt, family="lm")
    tok = run_tokenizer(cfg.get("data", {}))
    texts = args.prompt or [None]
    prompts = [[tok.eot_id] if t is None else tok.encode(t) for t in texts for _ in range(args.num_samples)]
    if any(len(p) == 0 for p in prompts):
        raise ValueError("a prompt is empty; omit --prompt for unconditional samples")
    idx, mask = pad_left(prompts, pad_id=tok.eot_id)
    out = model.generate(idx, args.max_new_tokens, args.temperature, args.top_k, args.top_p, mask=mask,
                         stop_token=None if args.no_stop else tok.eot_id, seed=args.seed)
    for i, row in enumerate(out[:, idx.shape[1]:].tolist()):
        if not args.no_stop and tok.eot_id in row:
            row = row[: row.index(tok.eot_id)]
        prompt_text = texts[i // args.num_samples] or ""
        print(f"--- sample {i} ---")
        print(prompt_text + tok.decode(row))
    return 0


# ----------------------------------------------------------------------------------------------------------------
# polymixer eval lm
# ----------------------------------------------------------------------------------------------------------------


def add_eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ckpt", required=True, help="run folder or checkpoint folder")
    p.add_argument("--data", nargs="*", default=None, help="corpus (default: the one the model was trained on)")
    p.add_argument("--split", choices=["val", "test"], default="val",
                   help="the split evaluated: test is the held-out split of the prose corpus or of *test*.bin shards, "
                        "for the final figure only (no choice may be made on it)")
    p.add_argument("--windows", type=int_at_least(1), default=512, help="windows per context length")
    p.add_argument("--lengths", type=float_in(Range(0, low_open=True)), nargs="+", default=[1, 2, 4],
                   help="context lengths as multiples of the training context")
    p.add_argument("--json", default=None, help="also write the results to this file")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def evaluate_checkpoint(ckpt: str, data: Optional[List[str]] = None, windows: int = 512,
                        lengths: Iterable[float] = (1, 2, 4), progress: bool = False,
                        split: str = "val") -> Dict[str, Any]:
    """Loss and bits per byte on a split (``"val"``, or ``"test"`` — the final figure, read nowhere else) at the
    training context and at multiples of it (length generalisation; learned positions cannot go beyond the training
    context and report None there). Keys ``<split>_loss`` / ``<split>_bpb`` (no bpb: shards of an unknown
    tokenizer)."""
    if split not in ("val", "test"):
        raise ValueError(f"split must be 'val' or 'test', got {split!r}")
    cfg = read_config(ckpt)
    model = load_model(ckpt, family="lm")
    d = cfg.get("data", {})
    tok = run_tokenizer(d)
    pack = d.get("pack", True)
    corpus = load_corpus(data or d.get("paths"), None if data else d.get("named"), tok,
                         val_fraction=d.get("val_fraction"), progress=progress)
    tokens = corpus.val if split == "val" else corpus.test()
    token_bytes = torch.from_numpy(tok.token_bytes()) if corpus.token_bytes_known else None
    T = model.config.block_size
    rows = []
    for mult in lengths:
        n = int(round(T * mult))
        if model.config.position == "learned" and n > T:
            rows.append({"context": n, "x_train": mult, f"{split}_loss": None, f"{split}_bpb": None})
            continue
        m = evaluate_lm(model, TokenWindows(tokens, n), token_bytes, corpus.eot_id if pack else None, windows,
                        max(1, 32 * T // n), progress=progress, desc=f"eval lm ({split}), context {n}")
        rows.append({"context": n, "x_train": mult, **{f"{split}_{k[4:]}": v for k, v in m.items()}})
    return {"ckpt": str(ckpt), "preset": cfg.get("preset"), "step": cfg.get("step"), "split": split, "lengths": rows}


def main_eval(args: argparse.Namespace) -> int:
    res = evaluate_checkpoint(args.ckpt, args.data, args.windows, args.lengths, progress=not args.quiet,
                              split=args.split)
    s = res["split"]
    print(f"{res['preset']} at step {res['step']} ({res['ckpt']}), {s} split")
    print(f"| context | × train | {s} loss | {s} bpb |\n|---|---|---|---|")
    for r in res["lengths"]:
        bpb = r.get(f"{s}_bpb")
        if r[f"{s}_loss"] is None:
            print(f"| {r['context']} | {r['x_train']:g} | n/a (learned positions) | — |")
        else:
            print(f"| {r['context']} | {r['x_train']:g} | {r[f'{s}_loss']:.4f} | "
                  f"{'—' if bpb is None else f'{bpb:.4f}'} |")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


# ----------------------------------------------------------------------------------------------------------------
# polymixer export hf / import hf (transformers is imported only when these run)
# ----------------------------------------------------------------------------------------------------------------


def add_export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ckpt", required=True, help="polymixer run or checkpoint folder (a language model)")
    p.add_argument("--out", required=True, help="transformers folder to write")
    p.add_argument("--no-ema", action="store_true", help="export the raw weights even if the run kept an EMA")


def main_export(args: argparse.Namespace) -> int:
    from ...hf import export_hf

    out = export_hf(args.ckpt, args.out, ema=False if args.no_ema else None)
    print(f"wrote {out} (load it with: import polymixer; AutoModelForCausalLM.from_pretrained({str(out)!r}))")
    return 0


def add_import_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--src", required=True, help="transformers folder written by export hf or save_pretrained")
    p.add_argument("--out", required=True, help="polymixer run folder to write")


def main_import(args: argparse.Namespace) -> int:
    from ...hf import import_hf

    print(f"wrote {import_hf(args.src, args.out)}")
    return 0
