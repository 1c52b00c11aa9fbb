"""Handwriting recognition: the task the shared loop trains (CTC on lines or multi-line pages), evaluation (CER,
WER, lines/s, a PNG of sample lines), and the ``polymixer train ocr`` / ``eval ocr`` / ``read`` commands."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn

from ..data.faults import SampleFaults
from .data import AugmentConfig, Charset, LineSet, augment, collate, compose_page, load_line_image, load_split
from .synth import resolve_data
from ..metrics import ErrorRates, edit_distance
from ...models import create_model, model_config
from ...models.ocr import ctc_greedy_decode, ctc_loss
from ...checkpoint import load_model, read_config, resolve_checkpoint
from ..train.loop import (
    TRAIN_FLAGS, TrainConfig, add_train_config_arguments, model_device, train, train_config_from_args,
)
from ..tasks.common import (
    add_preset_argument, add_set_argument, check_dataset, check_preset, config_overrides, int_at_least,
)

__all__ = ["OCRTask", "PageSpec", "examples_of", "make_example", "evaluate_ocr", "transcribe", "train_ocr",
           "load_recognizer"]


@dataclass
class PageSpec:
    """How examples are formed: single lines, or the lines of a page side by side (the paper's LAM-Mul.)."""

    multiline: bool = False
    max_lines: int = 16
    gap: Optional[int] = None  # white pixels between the lines of a page (default: height / 4)

    def gap_for(self, height: int) -> int:
        return height // 4 if self.gap is None else self.gap


def examples_of(lines: LineSet, spec: PageSpec) -> List[List[int]]:
    """Each example's line indices: one line each, or the (chunks of) pages."""
    return lines.pages(spec.max_lines) if spec.multiline else [[i] for i in range(len(lines))]


def make_example(lines: LineSet, idx: Sequence[int], spec: PageSpec, rng: Optional[np.random.Generator] = None,
                 aug: Optional[AugmentConfig] = None) -> Tuple[np.ndarray, str]:
    """(image, text) of one example: the lines ``idx`` (one line, or a page of lines side by side per ``spec``),
    augmented with ``rng`` and ``aug`` when given."""
    imgs = [lines.images[i] for i in idx]
    if rng is not None:
        imgs = [augment(im, rng, aug) for im in imgs]
    image = imgs[0] if len(imgs) == 1 else compose_page(imgs, spec.gap_for(imgs[0].shape[0]))
    return image, " ".join(lines.records[i].text for i in idx)


def _targets(texts: Sequence[str], charset: Charset) -> Tuple[torch.Tensor, torch.Tensor]:
    ids = [charset.encode(t) for t in texts]
    return (torch.tensor([i for s in ids for i in s], dtype=torch.int64),
            torch.tensor([len(s) for s in ids], dtype=torch.int64))


class OCRTask:
    """CTC training on random lines (or pages) with HTR-VT's augmentations; batches are a pure function of the step
    (indices from (seed, step), augmentations from (seed, step, example)), so resume and sharding are exact.

    ``bucket`` > 0 draws each batch from a window of ``bucket × batch_size`` examples of neighbouring widths (pages
    of 4 and 16 lines in one batch would otherwise be mostly padding); 0 draws uniformly. Default: 4 for pages, 0
    for single lines."""

    unit = "line"

    def __init__(self, train_set: LineSet, val_set: LineSet, charset: Charset, batch_size: int, seed: int,
                 spec: Optional[PageSpec] = None, aug: Optional[AugmentConfig] = None, eval_limit: Optional[int] = None,
                 eval_batch: int = 16, bucket: Optional[int] = None, faults: Optional[SampleFaults] = None) -> None:
        self.train_set, self.val_set, self.charset, self.faults = train_set, val_set, charset, faults
        self.spec = spec or PageSpec()
        self.aug = aug
        self.batch_size, self.seed = batch_size, seed
        self.examples = examples_of(train_set, self.spec)
        self.eval_limit, self.eval_batch = eval_limit, eval_batch
        self.bucket = (4 if self.spec.multiline else 0) if bucket is None else bucket
        if self.bucket:
            gap = self.spec.gap_for(train_set.images[0].shape[0])
            width = [sum(train_set.images[i].shape[1] for i in idx) + gap * (len(idx) - 1) for idx in self.examples]
            self.by_width = np.argsort(np.asarray(width), kind="stable")

    def batch(self, step: int, share: int, shares: int, device: torch.device) -> Dict[str, Any]:
        g = np.random.default_rng([self.seed, step])
        n_ex = len(self.examples)
        if self.bucket and n_ex > self.bucket * self.batch_size:
            window = self.bucket * self.batch_size
            start = int(g.integers(0, n_ex - window + 1))
            picks = self.by_width[start + g.integers(0, window, self.batch_size)]
        else:
            picks = g.integers(0, n_ex, self.batch_size)
        n = self.batch_size // shares
        images, texts, lines = [], [], 0
        for k in range(share * n, (share + 1) * n):
            rng = np.random.default_rng([self.seed, step, k]) if self.aug is not None else None
            idx = self.examples[picks[k]]
            image, text = make_example(self.train_set, idx, self.spec, rng, self.aug)
            images.append(image)
            texts.append(text)
            lines += len(idx)
        x, widths = collate(images)
        targets, target_lengths = _targets(texts, self.charset)
        return {"images": x.to(device), "widths": widths.to(device), "targets": targets.to(device),
                "target_lengths": target_lengths.to(device), "lines": lines}

    def count(self, batch: Dict[str, Any]) -> int:
        return batch["lines"]

    def loss(self, model: nn.Module, batch: Dict[str, Any]) -> torch.Tensor:
        log_probs, lengths = model(batch["images"], batch["widths"])
        return ctc_loss(log_probs, lengths, batch["targets"], batch["target_lengths"])

    def evaluate(self, model: nn.Module, step: int, out_dir: Path) -> Dict[str, float]:
        m = evaluate_ocr(model, self.val_set, self.charset, self.spec, batch=self.eval_batch, limit=self.eval_limit)
        return {"loss": m["loss"], "cer": m["cer"], "wer": m["wer"]}


@torch.no_grad()
def transcribe(model: nn.Module, images: Sequence[np.ndarray], charset: Charset,
               batch: int = 16) -> Tuple[List[str], float]:
    """Greedy CTC transcriptions of uint8 line images (in the given order) and the seconds the model took; lines
    of similar width are batched together (less padding), which never changes a result."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(images)), key=lambda i: images[i].shape[1])  # similar widths together: less padding
    out: List[str] = [""] * len(images)
    seconds = 0.0
    for s in range(0, len(order), batch):
        chunk = order[s:s + batch]
        x, widths = collate([images[i] for i in chunk])
        t0 = time.perf_counter()
        log_probs, lengths = model(x.to(device), widths.to(device))
        ids = ctc_greedy_decode(log_probs, lengths)
        seconds += time.perf_counter() - t0
        for i, seq in zip(chunk, ids):
            out[i] = charset.decode(seq)
    model.train(was)
    return out, seconds


@torch.no_grad()
def evaluate_ocr(model: nn.Module, lines: LineSet, charset: Charset, spec: Optional[PageSpec] = None, batch: int = 16,
                 limit: Optional[int] = None, progress: bool = False) -> Dict[str, Any]:
    """CER, WER (HTR-VT's word split), mean CTC loss, lines/s of the model, characters the charset cannot write,
    and every (reference, prediction) pair, over the examples of ``lines`` (the first ``limit`` when given)."""
    from tqdm.auto import tqdm

    spec = spec or PageSpec()
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    examples = examples_of(lines, spec)[:limit]
    made = [make_example(lines, idx, spec) for idx in examples]
    order = sorted(range(len(made)), key=lambda i: made[i][0].shape[1])
    preds: List[str] = [""] * len(made)
    loss_sum, seconds = 0.0, 0.0
    for s in tqdm(range(0, len(order), batch), desc="eval ocr", disable=not progress, unit="batch"):
        chunk = order[s:s + batch]
        x, widths = collate([made[i][0] for i in chunk])
        targets, target_lengths = _targets([made[i][1] for i in chunk], charset)
        t0 = time.perf_counter()
        log_probs, lengths = model(x.to(device), widths.to(device))
        ids = ctc_greedy_decode(log_probs, lengths)
        seconds += time.perf_counter() - t0
        loss_sum += float(ctc_loss(log_probs, lengths, targets.to(device), target_lengths.to(device))) * len(chunk)
        for i, seq in zip(chunk, ids):
            preds[i] = charset.decode(seq)
    rates = ErrorRates()
    refs = [t for _, t in made]
    for p, r in zip(preds, refs):
        rates.add(p, r)
    model.train(was)
    n_lines = sum(len(idx) for idx in examples)
    return {**rates.as_dict(), "loss": loss_sum / max(len(made), 1), "examples": len(made), "lines": n_lines,
            "lines_per_s": n_lines / max(seconds, 1e-9), "unknown_chars": sum(charset.unknown(r) for r in refs),
            "references": refs, "predictions": preds}


# ----------------------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------------------


def train_ocr(preset: str, train_cfg: TrainConfig, data: Optional[str] = None, spec: Optional[PageSpec] = None,
              augmentations: bool = True, eval_limit: Optional[int] = None, progress: bool = True,
              **overrides: Any) -> Dict[str, Any]:
    """Load a dataset (default: the offline synthetic lines), build the charset from its training transcriptions,
    build ``preset`` with one class per character + the blank, and train with the shared loop."""
    check_preset("ocr", preset)
    spec = spec or PageSpec()
    root = resolve_data(data, progress=progress)
    cfg = model_config(preset, **overrides)
    if train_cfg.check_data:  # with the model's line height: a line too narrow for one token is bad (as load_split)
        check_dataset("ocr", root, progress=progress, skip_bad_samples=train_cfg.skip_bad_samples, height=cfg.height,
                      max_width=cfg.max_width)
    faults = SampleFaults.training(train_cfg.skip_bad_samples)
    train_set = load_split(root, "train", cfg.height, cfg.max_width, progress, faults)
    val_set = load_split(root, "val", cfg.height, cfg.max_width, progress, faults)
    charset = Charset.from_texts(train_set.texts)
    if "num_classes" in overrides and overrides["num_classes"] != charset.num_classes:
        raise ValueError(f"the training transcriptions hold {len(charset)} characters (+ blank = "
                         f"{charset.num_classes} classes), but num_classes={overrides['num_classes']}")
    overrides["num_classes"] = charset.num_classes
    cfg = model_config(preset, **overrides)
    out = Path(train_cfg.out)
    if train_cfg.resume and (out / "checkpoints").exists():
        try:
            saved = read_config(out).get("charset")
        except FileNotFoundError:
            saved = None
        if saved is not None and saved != charset.chars:
            raise ValueError(f"cannot resume {out}: its charset {saved!r} differs from this data's {charset.chars!r}")
    torch.manual_seed(train_cfg.seed)
    model = create_model(preset, device=model_device(train_cfg), **overrides)
    task = OCRTask(train_set, val_set, charset, train_cfg.batch_size, train_cfg.seed, spec,
                   AugmentConfig() if augmentations else None, eval_limit, faults=faults)
    meta = {"family": "ocr", "preset": preset, "model": asdict(cfg), "charset": charset.chars,
            "data": {"path": str(root), "name": data or "synthetic", "train_lines": len(train_set),
                     "val_lines": len(val_set), "examples": len(task.examples)},
            "pages": asdict(spec), "augment": augmentations}
    return {**train(model, task, train_cfg, meta), "model": model, "charset": charset}


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------


def train_defaults() -> TrainConfig:
    """HTR-VT's recipe (AdamW β = (0.9, 0.99), weight decay 0.5, SAM ρ = 0.05, EMA), at 2-core CPU scale."""
    return TrainConfig(steps=3000, batch_size=32, lr=1e-3, min_lr=1e-5, warmup=150, weight_decay=0.5, beta2=0.99,
                       grad_clip=0.0, ema=0.999, sam_rho=0.05, eval_every=500, ckpt_every=500)


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    t = train_defaults()
    add_preset_argument(p, "ocr")
    p.add_argument("--data", default=None, help="dataset folder (HTR-VT layout or IAM's), or 'synthetic' (default) / "
                                                "'digits' — the offline sets, generated on first use")
    p.add_argument("--multiline", action="store_true", help="train on pages: the lines of a page side by side")
    p.add_argument("--max-lines", type=int_at_least(1), default=16, help="lines per page example (--multiline)")
    p.add_argument("--mixer", default=None, help="override the preset's layer pattern (attention, pom, hybrid, AP…)")
    p.add_argument("--no-augment", action="store_true", help="turn HTR-VT's augmentations off")
    p.add_argument("--eval-limit", type=int_at_least(1), default=None, help="validate on the first N examples only")
    add_set_argument(p, "ocr")
    add_train_config_arguments(p, t, "run folder (default: runs/ocr/<preset>[-multiline])",
                               TRAIN_FLAGS + ("sam_rho",))


def main_train(args: argparse.Namespace) -> int:
    overrides: Dict[str, Any] = {}
    if args.mixer is not None:
        overrides["mixer"] = args.mixer
    overrides = config_overrides("ocr", args.preset, args.set_fields, overrides)
    tcfg = train_config_from_args(args, train_defaults(),
                                  f"runs/ocr/{args.preset}{'-multiline' if args.multiline else ''}")
    spec = PageSpec(multiline=args.multiline, max_lines=args.max_lines)
    res = train_ocr(args.preset, tcfg, args.data, spec, augmentations=not args.no_augment,
                    eval_limit=args.eval_limit, progress=not args.quiet, **overrides)
    if res["rank"] == 0:
        print(json.dumps({"run": tcfg.out, **res["metrics"]}, indent=2))
    return 0


def load_recognizer(ckpt: Union[str, Path], ema: Optional[bool] = None,
                    dtype: str = "fp32") -> Tuple[nn.Module, Charset, Dict[str, Any]]:
    """(model ready for inference, its charset, the checkpoint's config) — the EMA weights when the checkpoint has
    them; ``dtype="bf16"`` runs in bf16 with channels-last convolutions (AMX on CPUs that have it)."""
    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"dtype must be 'fp32' or 'bf16', got {dtype!r}")
    cfg = read_config(ckpt)
    if cfg.get("family") != "ocr":
        raise ValueError(f"{ckpt} holds a {cfg.get('family')!r} model, not a text recogniser")
    if "charset" not in cfg:
        raise ValueError(f"{ckpt} has no charset in its config.json")
    model = load_model(ckpt, family="ocr", ema=ema)
    model.optimize_for_inference(torch.bfloat16 if dtype == "bf16" else None)
    charset = Charset(cfg["charset"])
    if charset.num_classes != model.config.num_classes:
        raise ValueError(f"{ckpt}: charset of {len(charset)} characters does not match the model's "
                         f"{model.config.num_classes} classes")
    return model, charset, cfg


def add_eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ckpt", required=True, help="run folder or checkpoint folder")
    p.add_argument("--data", default=None, help="dataset folder (default: the one the model was trained on)")
    p.add_argument("--split", default="test", help="train, val or test")
    p.add_argument("--multiline", default=None, choices=["yes", "no"],
                   help="evaluate pages instead of lines (default: as trained)")
    p.add_argument("--max-lines", type=int_at_least(1), default=None)
    p.add_argument("--limit", type=int_at_least(1), default=None, help="the first N examples only")
    p.add_argument("--batch", type=int_at_least(1), default=16)
    p.add_argument("--samples", type=int_at_least(0), default=8, help="lines drawn in the PNG (0: none)")
    p.add_argument("--png", default=None, help="PNG of sample lines (default: <run>/eval_<split>.png)")
    p.add_argument("--json", default=None, help="also write the metrics (and every prediction) to this file")
    p.add_argument("--no-ema", action="store_true")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="bf16: AMX on CPUs that have it")


def main_eval(args: argparse.Namespace) -> int:
    model, charset, cfg = load_recognizer(args.ckpt, ema=False if args.no_ema else None, dtype=args.dtype)
    pages = PageSpec(**cfg.get("pages", {}))
    if args.multiline is not None:
        pages.multiline = args.multiline == "yes"
    if args.max_lines is not None:
        pages.max_lines = args.max_lines
    root = resolve_data(args.data or cfg["data"]["path"])
    lines = load_split(root, args.split, model.config.height, model.config.max_width, progress=True)
    m = evaluate_ocr(model, lines, charset, pages, batch=args.batch, limit=args.limit, progress=True)
    summary = {k: m[k] for k in ("cer", "wer", "loss", "lines_per_s", "examples", "lines", "chars", "words",
                                 "unknown_chars")}
    print(json.dumps({"ckpt": str(args.ckpt), "preset": cfg.get("preset"), "step": cfg.get("step"),
                      "data": str(root), "split": args.split, "multiline": pages.multiline, **summary}, indent=2))
    if args.samples > 0:
        png = Path(args.png) if args.png else resolve_checkpoint(args.ckpt).parent.parent / f"eval_{args.split}.png"
        examples = examples_of(lines, pages)[:args.limit]
        k = min(args.samples, len(examples))
        pick = np.linspace(0, len(examples) - 1, k).round().astype(int) if k else []
        images = [make_example(lines, examples[i], pages)[0] for i in pick]
        draw_samples(images, [m["references"][i] for i in pick], [m["predictions"][i] for i in pick], png,
                     title=f"{cfg.get('preset')} — {root.name}/{args.split}: CER {100 * m['cer']:.2f}%, "
                           f"WER {100 * m['wer']:.2f}%")
        print(f"wrote {png}")
    if args.json:
        Path(args.json).write_text(json.dumps({**summary, "references": m["references"],
                                               "predictions": m["predictions"]}, indent=1))
    return 0


def draw_samples(images: Sequence[np.ndarray], references: Sequence[str], predictions: Sequence[str],
                 path: Union[str, Path], title: str = "", max_width: int = 1536) -> Path:
    """A PNG: each line image (wide pages cut at ``max_width`` pixels), its reference and the prediction, with the
    line's character errors."""
    from ..report import new_figure, save_figure

    if not images:
        raise ValueError("no sample lines to draw")
    fig, axes = new_figure(1, width=12.0, height=1.9, nrows=len(images))
    for ax, im, ref, pred in zip(axes, images, references, predictions):
        ax.imshow(im[:, :max_width], cmap="gray", vmin=0, vmax=255, aspect="equal")
        ax.set_xticks([])
        ax.set_yticks([])
        errs = edit_distance(pred, ref)
        cut = "…" if im.shape[1] > max_width else ""
        short = lambda s: s if len(s) <= 110 else s[:107] + "…"  # noqa: E731
        ax.set_title(f"ref:  {short(ref)}\npred: {short(pred)}   ({errs} char error{'s' if errs != 1 else ''}){cut}",
                     loc="left", fontsize=8, family="monospace", color="black" if errs == 0 else "darkred")
    if title:
        fig.suptitle(title, fontsize=10)
    save_figure(fig, Path(path))
    return Path(path)


def add_read_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("images", nargs="+", help="line images (PNG / JPEG; any height, resized like the training data)")
    p.add_argument("--ckpt", required=True, help="run folder or checkpoint folder")
    p.add_argument("--max-width", type=int_at_least(0), default=None,
                   help="width cap after resizing (default: the model's; 0 = none, e.g. for a whole page's lines "
                        "concatenated)")
    p.add_argument("--batch", type=int_at_least(1), default=16)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")


def main_read(args: argparse.Namespace) -> int:
    model, charset, _ = load_recognizer(args.ckpt, dtype=args.dtype)
    cap = model.config.max_width if args.max_width is None else (args.max_width or None)
    images = [load_line_image(path, model.config.height, cap) for path in args.images]
    texts, _ = transcribe(model, images, charset, args.batch)
    for path, text in zip(args.images, texts):
        print(f"{path}\t{text}")
    return 0
