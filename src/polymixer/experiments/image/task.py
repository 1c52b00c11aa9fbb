"""Class-conditional image generation: the task the shared loop trains, sampling, an honest CPU-scale evaluation,
and the ``polymixer train image`` / ``sample`` / ``eval image`` commands.

Evaluation: a small CNN classifier is trained once (fixed seed, on a held-out split of the real data, independently
of any generator) and cached. Generated samples are scored by (a) class-conditional accuracy — the fraction the
classifier assigns to the class they were generated for — next to the classifier's own held-out accuracy, and (b) a
Fréchet distance between generated and real images in the classifier's 128-d feature space, with equal numbers of
each, next to the real-vs-real distance as the floor. On the digits default this is a *digits* metric, not
comparable with ImageNet FID.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data.cache import cache_dir
from ..data.faults import SampleFaults
from .data import ImageDataset, load_images, save_grid
from .diffusion import make_objective
from ...files import atomic_path
from ...models import create_model, model_config
from ...checkpoint import load_model, read_config
from ..train.loop import (
    TRAIN_FLAGS, TrainConfig, add_train_config_arguments, model_device, train, train_config_from_args,
)
from ...ranges import Range
from ..tasks.common import (
    add_preset_argument, add_set_argument, check_dataset, check_preset, config_overrides, float_in, int_at_least,
)

__all__ = ["ImageTask", "Classifier", "get_classifier", "frechet_distance", "sample_images", "evaluate_generator",
           "train_image"]


# ----------------------------------------------------------------------------------------------------------------
# The judge: a small classifier and its feature space
# ----------------------------------------------------------------------------------------------------------------


class Classifier(nn.Module):
    """Two conv blocks and a 128-d feature layer."""

    def __init__(self, channels: int, size: int, num_classes: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        self.features = nn.Sequential(nn.Linear(64 * (size // 4) ** 2, 128), nn.ReLU())
        self.head = nn.Linear(128, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(self.conv(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


def _cache_dir() -> Path:
    return cache_dir("classifiers")


def get_classifier(data: ImageDataset, seed: int = 0, epochs: int = 30, progress: bool = False) -> tuple:
    """(classifier, held-out accuracy, held-out split). Trained once on 80% of the real data and cached."""
    from safetensors.torch import load_model as load_st
    from safetensors.torch import save_model as save_st

    C, S = data.images.shape[1], data.images.shape[-1]
    train_set, test_set = data.split(0.2, seed=seed)
    digest = hashlib.sha256(data.images.numpy().tobytes() + data.labels.numpy().tobytes()).hexdigest()[:16]
    stem = _cache_dir() / f"{data.name.replace('/', '_')}-{C}x{S}-{digest}-s{seed}-e{epochs}"
    clf = Classifier(C, S, data.num_classes)
    if (stem.with_suffix(".json")).is_file():
        load_st(clf, str(stem.with_suffix(".safetensors")))
        acc = json.loads(stem.with_suffix(".json").read_text())["heldout_accuracy"]
        return clf.eval(), acc, test_set
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    opt = torch.optim.Adam(clf.parameters(), lr=1e-3)
    from tqdm.auto import trange

    n = len(train_set.labels)
    for _ in trange(epochs, disable=not progress, desc="classifier"):
        perm = torch.randperm(n, generator=g)
        for i in range(0, n, 64):
            b = perm[i:i + 64]
            x = train_set.images[b]
            shift = torch.randint(-1, 2, (2,), generator=g).tolist()  # ±1 pixel shifts
            x = torch.roll(x, shifts=shift, dims=(2, 3))
            loss = F.cross_entropy(clf(x), train_set.labels[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
    clf.eval()
    with torch.no_grad():
        acc = float((clf(test_set.images).argmax(1) == test_set.labels).float().mean())
    stem.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(stem.with_suffix(".safetensors")) as tmp:
        save_st(clf, str(tmp))
    stem.with_suffix(".json").write_text(json.dumps({"heldout_accuracy": acc, "epochs": epochs, "seed": seed}))
    return clf, acc, test_set


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """‖μa − μb‖² + Tr(Σa + Σb − 2 (Σa Σb)^½) between two sets of feature vectors (rows)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    mu_a, mu_b = a.mean(0), b.mean(0)
    ca, cb = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    w, v = np.linalg.eigh(ca)
    sa = (v * np.sqrt(np.clip(w, 0, None))) @ v.T  # Σa^½
    m = sa @ cb @ sa  # symmetric PSD with the eigenvalues of Σa Σb
    tr_sqrt = float(np.sqrt(np.clip(np.linalg.eigvalsh((m + m.T) / 2), 0, None)).sum())
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(ca) + np.trace(cb) - 2 * tr_sqrt)


# ----------------------------------------------------------------------------------------------------------------
# Sampling and evaluation
# ----------------------------------------------------------------------------------------------------------------


def default_sampler(objective: str) -> str:
    return "heun" if objective == "flow" else "ddpm"


@torch.no_grad()
def sample_images(model: nn.Module, objective: str, classes: Sequence[int], n_per_class: int = 1,
                  guidance: float = 4.0, steps: int = 50, sampler: Optional[str] = None, seed: int = 0,
                  batch: int = 500, progress: bool = False) -> tuple:
    """(images (N, C, H, W) in [-1, 1], labels (N,)) — ``n_per_class`` samples of each class, class-major."""
    cfg = model.config
    bad = [c for c in classes if not 0 <= c < cfg.num_classes]
    if bad:
        raise ValueError(f"class id {bad[0]} is out of range: the model has {cfg.num_classes} classes")
    obj = make_objective(objective, cfg.learn_sigma)
    was = model.training
    model.eval()
    labels = torch.tensor([c for c in classes for _ in range(n_per_class)], dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    shape = (cfg.in_channels, cfg.input_size, cfg.input_size)
    noise = torch.randn((len(labels),) + shape, generator=g)  # fixed per sample: batching does not change them
    outs = []
    for i in range(0, len(labels), batch):
        y = labels[i:i + batch]
        outs.append(obj.sample(model, y, (len(y),) + shape, steps=steps, sampler=sampler or default_sampler(objective),
                               guidance=guidance, generator=g, progress=progress, noise=noise[i:i + batch]))
    model.train(was)
    return torch.cat(outs).clamp(-1, 1), labels


def evaluate_generator(model: nn.Module, objective: str, data: ImageDataset, n: int = 800, guidance: float = 2.0,
                       steps: int = 50, sampler: Optional[str] = None, seed: int = 0,
                       progress: bool = False) -> Dict[str, float]:
    """Class-conditional accuracy and Fréchet distance (with its real-vs-real floor) on ``n`` samples."""
    clf, clf_acc, _ = get_classifier(data, progress=progress)
    k = data.num_classes
    per = max(1, n // k)
    x, y = sample_images(model, objective, list(range(k)), per, guidance, steps, sampler, seed, progress=progress)
    n = len(y)
    g = torch.Generator().manual_seed(seed + 1)
    perm = torch.randperm(len(data.labels), generator=g)
    if 2 * n > len(perm):
        raise ValueError(f"{n} samples need {2 * n} real images for the real-vs-real floor; the data has "
                         f"{len(perm)}: lower n")
    real_a, real_b = data.images[perm[:n]], data.images[perm[n:2 * n]]
    with torch.no_grad():
        fa, fb, fg = clf.embed(real_a).numpy(), clf.embed(real_b).numpy(), clf.embed(x).numpy()
        acc = float((clf(x).argmax(1) == y).float().mean())
    return {"cond_accuracy": acc, "classifier_accuracy": clf_acc, "fd": frechet_distance(fg, fa),
            "fd_real_floor": frechet_distance(fb, fa), "samples": n}


def validation_fd(model: nn.Module, objective: str, data: ImageDataset, heldout: ImageDataset, n: int = 500,
                  guidance: float = 2.0, steps: int = 50, sampler: Optional[str] = None, seed: int = 1,
                  progress: bool = False) -> float:
    """The Fréchet distance a model is *chosen* on, distinct from the one it is reported with: ``n`` samples drawn
    with their own ``seed`` (independent of the reported figure's) against the features of every image of
    ``heldout`` — real images the model never trained on — in the feature space of ``data``'s classifier (the
    reported figure's)."""
    clf, _, _ = get_classifier(data, progress=progress)
    k = data.num_classes
    x, _ = sample_images(model, objective, list(range(k)), max(1, n // k), guidance, steps, sampler, seed,
                         progress=progress)
    with torch.no_grad():
        return frechet_distance(clf.embed(x).numpy(), clf.embed(heldout.images).numpy())


# ----------------------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------------------


class ImageTask:
    """Diffusion / flow training on an image dataset; evaluation saves a sample grid and scores a few samples."""

    unit = "img"

    def __init__(self, data: ImageDataset, objective: str, learn_sigma: bool, batch_size: int, seed: int,
                 eval_samples: int = 100, guidance: float = 2.0, steps: int = 25,
                 faults: Optional[SampleFaults] = None, progress: bool = False) -> None:
        self.data, self.objective_name, self.faults, self.progress = data, objective, faults, progress
        self.objective = make_objective(objective, learn_sigma)
        self.batch_size, self.seed = batch_size, seed
        self.eval_samples, self.guidance, self.steps = eval_samples, guidance, steps

    def batch(self, step: int, share: int, shares: int, device: torch.device) -> tuple:
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + step) % (2**63))
        idx = torch.randint(0, len(self.data.labels), (self.batch_size,), generator=g)
        n = self.batch_size // shares
        idx = idx[share * n:(share + 1) * n]
        return self.data.images[idx].to(device), self.data.labels[idx].to(device)

    def count(self, batch: tuple) -> int:
        return batch[0].shape[0]

    def split(self, batch: Any, part: int, parts: int) -> Any:
        """Context parallelism: every rank of a group takes the whole batch share (the objective draws the
        timesteps and the noise of whole images, alike on every rank of the group); the model embeds only its own
        equal band of patch rows, runs its blocks on it and gathers the predicted patches once at the end, so the
        loss (the mean over every pixel) is the whole batch's on every rank, and DDP's average of the gradients,
        which flow back through that gather to the rank that computed each band, is the single-process one."""
        return batch

    def loss(self, model: nn.Module, batch: tuple) -> torch.Tensor:
        x, y = batch
        return self.objective.loss(model, x, y)

    def evaluate(self, model: nn.Module, step: int, out_dir: Path) -> Dict[str, float]:
        k = self.data.num_classes
        x, _ = sample_images(model, self.objective_name, list(range(k)), 8, self.guidance, self.steps, seed=0,
                             progress=self.progress)
        save_grid(x.view(k, 8, *x.shape[1:]).transpose(0, 1).reshape(-1, *x.shape[1:]),
                  out_dir / "samples" / f"step_{step:08d}.png", nrow=k)
        if self.eval_samples <= 0:
            return {}
        m = evaluate_generator(model, self.objective_name, self.data, self.eval_samples, self.guidance, self.steps,
                               progress=self.progress)
        return {"cond_accuracy": m["cond_accuracy"], "fd": m["fd"]}


def train_image(preset: str, train_cfg: TrainConfig, objective: str = "flow", data: Optional[str] = None,
                eval_samples: int = 100, images: Optional[ImageDataset] = None, **overrides: Any) -> Dict[str, Any]:
    """Build ``preset`` (with overrides), load the images (default: digits; ``images``: already loaded ones, e.g. a
    bench's training split), and train with the shared loop."""
    check_preset("image", preset)
    cfg = model_config(preset, **overrides)
    if objective == "flow" and cfg.learn_sigma:
        raise ValueError(f"{preset} learns σ (a DDPM model): train it with --objective ddpm, or pass learn_sigma=False")
    faults = SampleFaults.training(train_cfg.skip_bad_samples)
    if data is not None and train_cfg.check_data:
        check_dataset("image", data, progress=train_cfg.progress, skip_bad_samples=train_cfg.skip_bad_samples)
    if images is None:
        images = load_images(data, cfg.input_size, cfg.in_channels, faults)
    if images.num_classes != cfg.num_classes:
        if "num_classes" in overrides:
            raise ValueError(f"the data has {images.num_classes} classes but num_classes={cfg.num_classes}")
        overrides["num_classes"] = images.num_classes
        cfg = model_config(preset, **overrides)
    torch.manual_seed(train_cfg.seed)
    model = create_model(preset, device=model_device(train_cfg), **overrides)
    task = ImageTask(images, objective, cfg.learn_sigma, train_cfg.batch_size, train_cfg.seed, eval_samples,
                     faults=faults, progress=train_cfg.progress)
    meta = {"family": "image", "preset": preset, "model": asdict(cfg), "objective": objective,
            "data": {"path": data, "name": images.name, "images": len(images.labels)}}
    return {**train(model, task, train_cfg, meta), "model": model}


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    t = TrainConfig(lr=3e-4, min_lr=3e-5, weight_decay=0.0, warmup=200, ema=0.999, batch_size=128, steps=4000,
                    eval_every=1000, ckpt_every=1000)
    add_preset_argument(p, "image")
    p.add_argument("--mixer", choices=["attention", "pom"], default=None, help="override the preset's mixer")
    p.add_argument("--objective", choices=["flow", "ddpm"], default="flow")
    p.add_argument("--data", default=None, help="image folder (class = sub-folder); default: scikit-learn's digits")
    p.add_argument("--image-size", type=int_at_least(1), default=None, help="override input_size")
    p.add_argument("--learn-sigma", action="store_true", help="learn the DDPM variance (DiT)")
    p.add_argument("--position", choices=["sincos", "rope"], default=None)
    p.add_argument("--eval-samples", type=int_at_least(0), default=100, help="samples scored at each evaluation")
    add_set_argument(p, "image")
    add_train_config_arguments(p, t, "run folder (default: runs/image/<preset>-<objective>)",
                               tuple(n for n in TRAIN_FLAGS if n != "beta2"))


def main_train(args: argparse.Namespace) -> int:
    overrides: Dict[str, Any] = {}
    for flag, name in (("mixer", "mixer"), ("image_size", "input_size"), ("position", "position")):
        if getattr(args, flag) is not None:
            overrides[name] = getattr(args, flag)
    if args.learn_sigma:
        overrides["learn_sigma"] = True
    overrides = config_overrides("image", args.preset, args.set_fields, overrides)
    tag = args.preset.replace("/", "_")
    tcfg = train_config_from_args(args, TrainConfig(), f"runs/image/{tag}-{args.objective}")
    res = train_image(args.preset, tcfg, args.objective, args.data, args.eval_samples, **overrides)
    if res["rank"] == 0:
        print(json.dumps({"run": tcfg.out, **res["metrics"]}, indent=2))
    return 0


def _parse_classes(text: Optional[str], k: int) -> List[int]:
    if text is None:
        return list(range(k))
    try:
        return [int(c) for c in text.split(",") if c.strip()]
    except ValueError as e:
        raise ValueError(f"--classes must be comma-separated integers, got {text!r}") from e


def add_sample_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ckpt", required=True, help="run folder or checkpoint folder")
    p.add_argument("--classes", default=None, help="comma-separated class ids (default: all)")
    p.add_argument("--n-per-class", type=int_at_least(1), default=8)
    p.add_argument("--cfg", type=float_in(Range(0)), default=4.0, help="classifier-free guidance scale (1 = none)")
    p.add_argument("--steps", type=int_at_least(1), default=50)
    p.add_argument("--sampler", default=None, help="flow: heun | euler | sde; ddpm: ddpm | ddim")
    p.add_argument("--seed", type=int_at_least(0), default=0)
    p.add_argument("--no-ema", action="store_true", help="use the raw weights instead of the EMA")
    p.add_argument("--out", default="grid.png")


def _load_generator(ckpt: str, no_ema: bool = False) -> tuple:
    cfg = read_config(ckpt)
    if cfg.get("family") != "image":
        raise ValueError(f"{ckpt} holds a {cfg.get('family')!r} model, not an image generator")
    from ...checkpoint import resolve_checkpoint

    ema = not no_ema and (resolve_checkpoint(ckpt) / "ema.safetensors").is_file()
    return load_model(ckpt, family="image", ema=ema), cfg


def main_sample(args: argparse.Namespace) -> int:
    model, cfg = _load_generator(args.ckpt, args.no_ema)
    classes = _parse_classes(args.classes, model.config.num_classes)
    x, _ = sample_images(model, cfg["objective"], classes, args.n_per_class, args.cfg, args.steps, args.sampler,
                         args.seed, progress=True)
    grid = x.view(len(classes), args.n_per_class, *x.shape[1:]).transpose(0, 1).reshape(-1, *x.shape[1:])
    print(f"wrote {save_grid(grid, args.out, nrow=len(classes))} ({len(classes)} classes × {args.n_per_class})")
    return 0


def add_eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ckpt", required=True, help="run folder or checkpoint folder")
    p.add_argument("--n", type=int_at_least(1), default=800, help="generated samples (and real samples) to compare")
    p.add_argument("--cfg", type=float_in(Range(0)), default=2.0)
    p.add_argument("--steps", type=int_at_least(1), default=50)
    p.add_argument("--sampler", default=None)
    p.add_argument("--seed", type=int_at_least(0), default=0)
    p.add_argument("--data", default=None, help="image folder (default: the data the model was trained on)")
    p.add_argument("--json", default=None)


def main_eval(args: argparse.Namespace) -> int:
    model, cfg = _load_generator(args.ckpt)
    data = load_images(args.data or cfg["data"].get("path"), model.config.input_size, model.config.in_channels)
    m = evaluate_generator(model, cfg["objective"], data, args.n, args.cfg, args.steps, args.sampler, args.seed,
                           progress=True)
    print(json.dumps({"ckpt": args.ckpt, "preset": cfg.get("preset"), "objective": cfg["objective"],
                      "step": cfg.get("step"), **m}, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(m, indent=2))
    return 0
