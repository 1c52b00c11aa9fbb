"""The one training loop every model family uses.

A *task* supplies batches, a loss and an evaluation; the loop supplies everything else: AdamW with weight decay on
≥ 2-D weights only, linear warm-up then cosine decay, gradient clipping and accumulation, bf16 autocast where
supported, optional ``torch.compile``, an EMA of the weights, a progress bar, periodic evaluation, atomic
checkpoints with exact resume (weights, optimizer, RNG, step — batches are a pure function of the step),
sharpness-aware minimisation around AdamW as an option (HTR-VT trains with it), and data-parallel training through
``torchrun`` (DistributedDataParallel; gloo on CPU, nccl on GPU).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import json
import math
import os
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Protocol, Sequence, Set, Tuple

import torch
import torch.distributed as dist
from torch import nn

if TYPE_CHECKING:
    import argparse

from . import agreement, memory, parallel, tracking
from ..data.faults import SampleError
from ...files import write_text_atomic
from ...ranges import Range, check_range
from ..report import plot_history
from ...checkpoint import (
    SHARDED, CheckpointError, CheckpointWarning, begin_checkpoint, checkpoint_folder, config_diff, file_entries,
    is_sharded, load_trainer_state, load_weights, publish_checkpoint, read_config, resolve_checkpoint, rng_state,
    save_checkpoint, set_rng_state,
)

__all__ = ["TrainConfig", "Task", "train", "configure_optimizer", "lr_at", "distributed_context", "TRAIN_FLAGS",
           "model_device",
           "TRAIN_HELP", "TRAIN_RANGES",
           "EXIT_PREEMPTED", "Preempted", "add_train_config_arguments", "train_config_from_args"]


@dataclass
class TrainConfig:
    steps: int = 1000
    batch_size: int = 32  # global: per optimizer step, over all processes and accumulation steps
    grad_accum: int = 1
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 250
    ckpt_every: int = 500
    keep: int = 3
    log_every: int = 10
    seed: int = 1337
    dtype: str = "auto"  # "auto" (bf16 on GPUs that support it, fp32 on CPU) | "fp32" | "bf16"
    compile: bool = False
    ema: float = 0.0  # EMA decay of the weights (0: off)
    sam_rho: float = 0.0  # sharpness-aware minimisation radius (0: off; HTR-VT uses 0.05): two passes per step
    out: str = "runs/train"
    resume: bool = True  # continue from <out>/checkpoints/latest when it exists
    init_from: Optional[str] = None  # a new run starts from these weights (a run or checkpoint folder; its EMA
    #                                  weights when it has them): fine-tuning, curricula. Ignored when resuming.
    stop_after: Optional[int] = None  # end this invocation after that step (with a checkpoint): time-limited jobs
    progress: bool = True
    max_nonfinite: int = 10  # a step whose loss or gradient norm is not finite is skipped; this many in a row stop
    curves: bool = True  # <out>/curves.png at each evaluation and at the end (loss, learning rate, evaluations)
    skip_bad_samples: bool = False  # unreadable / malformed samples: stop naming the file (False), or skip and count
    check_data: bool = True  # the task scans every data file's header and length before training (--no-data-check)
    context_parallel: int = 1  # ranks that share each example, each holding a slice of its sequence (torchrun)
    fsdp: bool = False  # shard parameters, gradients and optimizer state over the ranks (FSDP2) instead of DDP
    async_checkpoint: bool = False  # --fsdp: write each sharded checkpoint in the background while training goes on
    activation_checkpointing: str = "none"  # none | block | selective: recompute activations in the backward
    dist_timeout: float = 5.0  # minutes a collective waits for the other ranks before failing (torchrun)
    extra: Dict[str, Any] = field(default_factory=dict)
    log: str = "none"  # where the main rank also sends every history record: none | csv | tensorboard | wandb
    meta_init: bool = False  # build on the meta device, initialise block by block (always with --fsdp): model_device

    def __post_init__(self) -> None:
        for name, allowed in TRAIN_RANGES.items():
            check_range(name, getattr(self, name), allowed, f"--{name.replace('_', '-')}")
        if self.min_lr > self.lr:  # the cosine decays from lr to min_lr: above lr it would climb instead
            raise ValueError(f"min_lr (--min-lr) must be ≤ lr (--lr) = {self.lr:g}, got {self.min_lr:g}: the rate "
                             f"decays from lr down to min_lr; give a lower --min-lr with it")
        if self.dtype not in ("auto", "fp32", "bf16"):
            raise ValueError(f"dtype (--dtype) must be auto, fp32 or bf16, got {self.dtype!r}")
        memory.check_mode(self.activation_checkpointing)
        if self.async_checkpoint and not self.fsdp:
            raise ValueError("--async-checkpoint writes sharded checkpoints in the background: it needs --fsdp")
        tracking.check_tracker(self.log)


# what each numeric TrainConfig field allows: checked when a config is made (a command checks its options before it
# reads any data), one line naming the option and the range
TRAIN_RANGES: Dict[str, Range] = {
    "steps": Range(1), "batch_size": Range(1), "grad_accum": Range(1), "lr": Range(0, low_open=True),
    "min_lr": Range(0), "warmup": Range(0), "weight_decay": Range(0), "beta1": Range(0, 1, high_open=True),
    "beta2": Range(0, 1, high_open=True), "grad_clip": Range(0), "eval_every": Range(1), "ckpt_every": Range(1),
    "keep": Range(1), "log_every": Range(1), "seed": Range(0), "ema": Range(0, 1, high_open=True),
    "sam_rho": Range(0), "max_nonfinite": Range(1), "context_parallel": Range(1), "stop_after": Range(1),
    "dist_timeout": Range(0, low_open=True),
}


# the TrainConfig fields every `polymixer train <family>` command exposes as --flags
TRAIN_FLAGS = ("steps", "batch_size", "grad_accum", "lr", "min_lr", "warmup", "weight_decay", "beta2", "grad_clip",
               "eval_every", "ckpt_every", "keep", "log_every", "seed", "ema", "max_nonfinite")


# what each of those flags means, for --help (the default shown is the family's recipe)
TRAIN_HELP = {
    "steps": "optimizer steps of the whole run (a resumed run continues to this count)",
    "batch_size": "examples per optimizer step, over all processes and accumulation steps",
    "grad_accum": "micro-batches accumulated per step (the batch is split into this many)",
    "lr": "peak learning rate, reached after the warm-up",
    "min_lr": "learning rate at the last step (cosine decay from lr)",
    "warmup": "steps of linear warm-up from 0 to lr",
    "weight_decay": "AdamW weight decay of matrices and embeddings (none on biases, norms, PoM coefficients)",
    "beta2": "AdamW's second-moment decay",
    "grad_clip": "clip the gradient norm to this (0: no clipping)",
    "eval_every": "evaluate every N steps (and at the last)",
    "ckpt_every": "write a checkpoint every N steps (and at the last)",
    "keep": "intact checkpoints kept",
    "log_every": "log loss, learning rate and throughput every N steps",
    "seed": "seed of the initial weights and of every batch (batches are a pure function of seed and step)",
    "ema": "EMA decay of the weights, evaluated and saved beside them (0: off)",
    "max_nonfinite": "stop after this many consecutive steps with a non-finite loss or gradient",
    "sam_rho": "sharpness-aware minimisation radius (0: off; two forward/backward passes per step)",
}


def add_train_config_arguments(p: "argparse.ArgumentParser", defaults: TrainConfig, out_help: str,
                               names: Sequence[str] = TRAIN_FLAGS) -> None:
    """The shared-loop options of a train command: ``names`` as --flags defaulting to the family's recipe
    ``defaults``, then --skip-bad-samples, --stop-after, --init-from, --dtype, --compile, the parallelism options,
    --log, --out, --no-resume, --quiet."""
    for name in names:
        default = getattr(defaults, name)
        p.add_argument("--" + name.replace("_", "-"), type=type(default), default=default,
                       help=TRAIN_HELP.get(name, name.replace("_", " ")))
    p.add_argument("--skip-bad-samples", action="store_true",
                   help="skip unreadable or malformed samples (listed in <out>/bad_samples.json) instead of stopping")
    p.add_argument("--no-data-check", action="store_true",
                   help="skip the scan of every data file's header and length before training (a bad file then stops "
                        "the run only when it is drawn)")
    p.add_argument("--stop-after", type=int, default=None, help="end this invocation after that step (resumable)")
    p.add_argument("--init-from", default=None, metavar="RUN",
                   help="start from the weights of this run or checkpoint (fine-tuning; not when resuming)")
    p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16"],
                   help="autocast dtype: auto = bf16 on GPUs that support it, fp32 on CPU")
    p.add_argument("--compile", action="store_true", help="torch.compile the model's forward")
    p.add_argument("--context-parallel", type=int, default=1, metavar="C",
                   help="under torchrun: C consecutive ranks share each example, each holding a contiguous slice of "
                        "its sequence (PoM sends O(D) per layer); the other factor of the processes is data parallel")
    p.add_argument("--fsdp", action="store_true",
                   help="under torchrun: shard parameters, gradients and optimizer state (FSDP2) instead of DDP; "
                        "every rank writes its own shard of each checkpoint")
    p.add_argument("--async-checkpoint", action="store_true",
                   help="with --fsdp: write each checkpoint in the background while training goes on (published "
                        "once complete, at the latest by the next checkpoint or the end)")
    p.add_argument("--activation-checkpointing", default=defaults.activation_checkpointing, choices=memory.MODES,
                   help="recompute activations in the backward instead of keeping them: block = each block keeps only "
                        "its input; selective = keep the matrix products' outputs, recompute the elementwise ops")
    p.add_argument("--dist-timeout", type=float, default=defaults.dist_timeout, metavar="MINUTES",
                   help="under torchrun: minutes a collective waits for the other ranks before failing")
    p.add_argument("--log", default=defaults.log, choices=tracking.TRACKERS,
                   help="also send every logged figure (loss, learning rate, gradient norm, throughput, memory, "
                        "evaluations) to <out>/history.csv, TensorBoard (<out>/tensorboard) or Weights & Biases "
                        "(offline unless WANDB_MODE or a W&B key says otherwise), from the main rank")
    p.add_argument("--out", default=None, help=out_help)
    p.add_argument("--no-resume", action="store_true", help="start over even if the run folder has a checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def train_config_from_args(args: "argparse.Namespace", defaults: TrainConfig, out: str) -> TrainConfig:
    """The TrainConfig of a train command parsed with :func:`add_train_config_arguments` (``out``: the default run
    folder)."""
    from dataclasses import fields, replace

    values = {f.name: getattr(args, f.name) for f in fields(TrainConfig)
              if hasattr(args, f.name) and f.name not in ("out", "resume", "progress")}
    return replace(defaults, **values, out=args.out or out, resume=not args.no_resume, progress=not args.quiet,
                   check_data=not getattr(args, "no_data_check", False))


class Task(Protocol):
    """What a model family brings to the loop. A task may also carry ``faults``, the
    :class:`~polymixer.experiments.data.faults.SampleFaults` its data was read with: the loop then reports the bad
    samples skipped
    (progress bar, history, ``<out>/bad_samples.json``) and keeps them in its checkpoints."""

    unit: str  # what a batch counts, for throughput ("tok", "img")

    def batch(self, step: int, share: int, shares: int, device: torch.device) -> Any:
        """Share ``share`` of ``shares`` equal parts of the global batch of ``step`` (a pure function of both)."""
        ...

    # optional: ``split(batch, part, parts)`` → this rank's contiguous slice of every sequence of a batch share
    # (context parallelism; a task without it refuses --context-parallel)
    # optional: ``split_evaluation = True`` → ``evaluate`` runs inside the training's context-parallel group, each
    # rank evaluating its slice of every example as ``split`` cuts them (no rank holds a whole one), and its
    # ``eval_batch`` (examples per evaluation forward) is lowered to the training micro-batch of a rank: evaluation
    # then stays within the training step's memory. Without it every rank evaluates whole examples.

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor: ...

    def count(self, batch: Any) -> int:
        """Number of units (tokens, images) in a batch share."""
        ...

    def evaluate(self, model: nn.Module, step: int, out_dir: Path) -> Dict[str, float]: ...


def model_device(cfg: TrainConfig) -> Optional[str]:
    """Where a family builds its model for ``cfg``: ``"meta"`` for ``--fsdp`` (and ``meta_init``) — nothing is
    allocated, and the loop materialises and initialises the model block by block, each rank only its shards
    (:func:`polymixer.experiments.train.parallel.init_blockwise`: the same weights for a seed on any number of
    ranks, sharded or not, though not the draws of building the model whole); None (the default device)
    otherwise."""
    return "meta" if cfg.fsdp or cfg.meta_init else None


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``min_lr`` at the last step."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    progress = min(1.0, (step - cfg.warmup) / span)
    return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def configure_optimizer(model: nn.Module, cfg: TrainConfig, no_decay: Optional[set] = None) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices and embeddings (≥ 2-D), none on biases, norms, gate biases, and parameters
    marked ``no_weight_decay`` (PoM's polynomial coefficients).

    A model may scale the learning rate of some parameters: ``model.lr_scale(name) -> float`` (e.g. PTv3 trains
    its transformer blocks at 0.1× the rate of the stem, pooling and head). Each parameter group then carries its
    ``lr_scale`` and the loop sets ``lr = schedule · lr_scale``. ``no_decay``: names of parameters never decayed
    besides those marked (a sharded model's parameters lost their marks).
    """
    scale_of = getattr(model, "lr_scale", None)
    seen = set()
    groups: Dict[tuple, List[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        decay = p.dim() >= 2 and not getattr(p, "no_weight_decay", False) and name not in (no_decay or ())
        scale = float(scale_of(name)) if scale_of is not None else 1.0
        if not scale > 0:
            raise ValueError(f"lr_scale of parameter {name!r} must be positive, got {scale}")
        groups.setdefault((scale, decay), []).append(p)
    # the two full-rate groups always exist, first (the layout of every checkpoint before lr scales existed)
    order = [(1.0, True), (1.0, False)] + sorted(k for k in groups if k[0] != 1.0)
    param_groups = [{"params": groups.get(k, []), "weight_decay": cfg.weight_decay if k[1] else 0.0,
                     "lr_scale": k[0]} for k in order]
    return torch.optim.AdamW(param_groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


@dataclass
class DistContext:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0


def distributed_context(timeout_minutes: Optional[float] = None) -> DistContext:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK); a plain run is rank 0 of 1.

    ``timeout_minutes`` (``--dist-timeout``; None: PyTorch's 30 min gloo / 10 min NCCL) bounds how long a
    collective waits for the other ranks before it fails instead of hanging: given to ``init_process_group`` and
    made the default of the groups created later (the context-parallel mesh's, the checkpoint writers')."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device, backend = torch.device("cuda", local), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        timeout = None if timeout_minutes is None else datetime.timedelta(minutes=timeout_minutes)
        if timeout is not None:  # (new_group's default is these module constants, not the world group's timeout)
            dist.distributed_c10d.default_pg_timeout = timeout
            dist.distributed_c10d.default_pg_nccl_timeout = timeout
        dist.init_process_group(backend=backend, timeout=timeout)
    return DistContext(rank, world, local, device)


def _autocast_dtype(cfg: TrainConfig, device: torch.device) -> Optional[torch.dtype]:
    if cfg.dtype == "fp32":
        return None
    if cfg.dtype == "bf16":
        return torch.bfloat16
    if cfg.dtype != "auto":
        raise ValueError(f"dtype must be 'auto', 'fp32' or 'bf16', got {cfg.dtype!r}")
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


class _Ema:
    """EMA of the weights with the usual warm-up: after n updates the decay is min(decay, (1 + n) / (10 + n)).

    Without the warm-up a short run keeps decay^steps of its random initialisation in the average (0.999 over
    1,500 steps: 22%), and the averaged model is worse than either end point.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.model = copy.deepcopy(model).eval().requires_grad_(False)

    def decay_at(self, updates: int) -> float:
        return min(self.decay, (1.0 + updates) / (10.0 + updates))

    @torch.no_grad()
    def update(self, model: nn.Module, updates: int) -> None:
        """Fold in ``model`` after ``updates`` earlier updates (the step count, so that resume is exact)."""
        d = self.decay_at(updates)
        for e, p in zip(self.model.parameters(), model.parameters()):
            e.lerp_(p.detach(), 1.0 - d)
        for e, b in zip(self.model.buffers(), model.buffers()):
            e.copy_(b)


def _forward_backward(model: nn.Module, task: Task, batch: Any, last: bool, cfg: TrainConfig, ctx: DistContext,
                      amp: Optional[torch.dtype], cp_mesh: Any = None) -> torch.Tensor:
    """Loss and backward of one micro-batch; under DDP / FSDP gradients are reduced on the last micro-batch only;
    under context parallelism inside :func:`polymixer.context_parallel` of this rank's group."""
    from ...ops.parallel import context_parallel

    sync = ctx.world == 1 or last
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(sync)
        quiet: Any = contextlib.nullcontext()
    else:
        quiet = model.no_sync() if not sync else contextlib.nullcontext()
    with quiet, (context_parallel(cp_mesh) if cp_mesh is not None else contextlib.nullcontext()):
        with torch.autocast(ctx.device.type, dtype=amp, enabled=amp is not None):
            loss = task.loss(model, batch) / cfg.grad_accum
        loss.backward()
    return loss.detach()


def _sam_second_pass(raw: nn.Module, model: nn.Module, task: Task, batches: List[Any],
                     optimizer: torch.optim.Optimizer, cfg: TrainConfig, ctx: DistContext,
                     amp: Optional[torch.dtype], cp_mesh: Any = None) -> None:
    """Sharpness-aware minimisation (Foret et al. 2021): climb to w + ρ·g/‖g‖ along the (all-reduced) gradient,
    take the gradient there on the same batches, come back to w; the optimizer then steps with that gradient.

    The weights w are kept and copied back, not recomputed as (w + e) − e: in floating point that round trip is not
    exact, so every step would start from slightly wrong weights and a step skipped for a non-finite second pass
    would change the weights it promises to leave alone."""
    params = [p for p in raw.parameters() if p.grad is not None]
    if not params:
        return
    with torch.no_grad():
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
        if not bool(torch.isfinite(norm)):  # climbing along a NaN gradient would poison the weights; the loop
            return                           # skips this step as non-finite (the gradient is all-reduced: every rank)
        scale = cfg.sam_rho / (norm + 1e-12)
        origin = [p.detach().clone() for p in params]
        for p in params:
            p.add_(p.grad * scale)
    optimizer.zero_grad(set_to_none=True)
    try:
        for micro, batch in enumerate(batches):
            _forward_backward(model, task, batch, micro == len(batches) - 1, cfg, ctx, amp, cp_mesh)
    finally:  # an exception in the second pass (a bad sample, an interrupt) leaves w, not w + e
        with torch.no_grad():
            for p, w in zip(params, origin):
                p.copy_(w)


def _running_stats(model: nn.Module) -> List[torch.Tensor]:
    """The buffers a training forward changes: BatchNorm-style running statistics (a skipped step restores them)."""
    from torch.nn.modules.batchnorm import _NormBase

    return [b for m in model.modules() if isinstance(m, _NormBase) and m.track_running_stats
            for b in (m.running_mean, m.running_var, m.num_batches_tracked) if b is not None]


def _model_diff(ck: Path, model_config: Dict[str, Any], model: Optional[nn.Module] = None) -> Dict[str, Any]:
    """{key: (checkpoint's value, this run's)} where the model (family included) saved in ``ck`` differs. A field
    the checkpoint does not know (added to the model's config class since) agrees when this run keeps its default,
    which is the model the checkpoint was trained as."""
    saved = read_config(ck)
    old = saved.get("model", {})
    diff = config_diff(old, model_config.get("model", {}))
    config = getattr(model, "config", None)
    if dataclasses.is_dataclass(config):
        defaults = {f.name: f.default for f in dataclasses.fields(config) if f.default is not dataclasses.MISSING}
        diff = {k: v for k, v in diff.items() if not (k not in old and k in defaults and v[1] == defaults[k])}
    if saved.get("family") != model_config.get("family"):
        diff["family"] = (saved.get("family"), model_config.get("family"))
    return diff


def _init_weights(model: nn.Module, ema: Optional["_Ema"], source: str, model_config: Dict[str, Any]) -> None:
    """Start a new run from the weights of another one (its EMA weights when saved), after checking that the model
    configurations agree."""
    ck = resolve_checkpoint(source)
    diff = _model_diff(ck, model_config, model)
    if diff:
        listing = "; ".join(f"{k}: {ck} has {a!r}, this run {b!r}" for k, (a, b) in diff.items())
        raise ValueError(f"cannot start from {ck}: the model configurations differ — {listing}")
    load_weights(model, ck, ema=(ck / "ema.safetensors").is_file())
    if ema is not None:
        ema.model.load_state_dict(model.state_dict())


def _write_json(path: Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=1))


EXIT_PREEMPTED = 75  # sysexits' EX_TEMPFAIL, "try again later": requeue and run the same command; it resumes


class Preempted(SystemExit):
    """Raised by :func:`train` after SIGTERM / SIGUSR1: the step in flight finished, a checkpoint was written, and
    the process exits with :data:`EXIT_PREEMPTED` unless the caller catches it."""

    def __init__(self, step: int, signal_name: str) -> None:
        super().__init__(EXIT_PREEMPTED)
        self.step, self.signal_name = step, signal_name


@contextlib.contextmanager
def _preemption_signals():
    """While training, SIGTERM and SIGUSR1 (what schedulers such as SLURM send before killing a job) only set a
    flag; the previous handlers come back afterwards. Only the main thread can install handlers."""
    import signal
    import threading

    flag: Dict[str, Any] = {"signal": None}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    sigs = [signal.SIGTERM] + ([signal.SIGUSR1] if hasattr(signal, "SIGUSR1") else [])
    previous = {s: signal.getsignal(s) for s in sigs}

    def handler(signum: int, frame: Any) -> None:
        flag["signal"] = signal.Signals(signum).name

    for s in sigs:
        signal.signal(s, handler)
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def train(model: nn.Module, task: Task, cfg: TrainConfig, model_config: Dict[str, Any],
          on_log: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
    """Train ``model`` on ``task``; returns the final evaluation and the logged history.

    ``model_config`` is what a checkpoint must reproduce the model from (``{"family", "preset", "model": {...}}``);
    resuming from a checkpoint whose model config differs raises a ValueError listing the differing keys.

    On SIGTERM or SIGUSR1 the step in flight finishes, every rank agrees to stop after that same step (an all-reduce
    of the flag each step), a checkpoint is written, and :class:`Preempted` is raised: the process exits with status
    :data:`EXIT_PREEMPTED` (75) and the same command resumes.
    """
    with _preemption_signals() as flag:
        return _train(model, task, cfg, model_config, on_log, flag)


@dataclass
class _Run:
    """What the pieces of one training run share: the model and its optimizer, where the run writes, and the
    counters the loop advances. :func:`_prepare` builds it, :func:`_resume` and :func:`_parallelise` complete it,
    and every later piece reads and updates these fields, so that each sees the values the others left."""

    cfg: TrainConfig
    task: Task
    model_config: Dict[str, Any]
    meta: Dict[str, Any]  # what each checkpoint's config.json records besides the metrics
    ctx: DistContext
    lay: parallel.Layout
    out: Path
    raw: nn.Module  # the model itself (under FSDP its parameters are sharded)
    fwd_model: nn.Module  # what the forward runs: raw, compiled and / or wrapped in DDP
    ema: Optional[_Ema]
    no_decay: Set[str]
    optimizer: torch.optim.AdamW
    faults: Any  # the task's SampleFaults (the policy for bad samples and those skipped), or None
    amp: Optional[torch.dtype] = None
    resumed: Optional[Path] = None  # the checkpoint this run resumed from (a sharded one loads in _parallelise)
    pending: Any = None  # --async-checkpoint: the sharded save in flight (_Pending), published by _settle
    ckpt_group: Any = None  # --async-checkpoint: the gloo group the background saves talk on
    bar: Any = None  # the progress bar
    start: int = 0  # the step this invocation starts from
    saved: int = 0  # the step of the latest checkpoint written
    history: List[Dict[str, Any]] = field(default_factory=list)
    metrics: Dict[str, float] = field(default_factory=dict)  # the latest evaluation (a resumed run: its checkpoint's)
    skipped: int = 0  # non-finite steps so far
    nonfinite_run: int = 0  # non-finite steps in a row
    units: int = 0  # units trained on since the last log
    t_last: float = 0.0  # when the throughput was last measured
    train_s: float = 0.0  # seconds spent training so far, a resumed run's earlier invocations included
    stats: List[torch.Tensor] = field(default_factory=list)  # running statistics a skipped step restores
    tracker: Any = None  # --log: where the main rank sends each history record (tracking.Tracker)
    eval_pending: bool = False  # resumed from a checkpoint published before its step's evaluation ended


def _train(model: nn.Module, task: Task, cfg: TrainConfig, model_config: Dict[str, Any],
           on_log: Optional[Callable[[Dict[str, Any]], None]], flag: Dict[str, Any]) -> Dict[str, Any]:
    """The loop itself: set up (or resume) the run, then per step draw, step, log, evaluate and checkpoint."""
    run = _prepare(model, task, cfg, model_config)
    trainer_state = _resume(run)
    if run.start == 0 and cfg.init_from:
        _materialise(run)
        _init_weights(run.raw, run.ema, cfg.init_from, model_config)
    _parallelise(run, trainer_state)
    _begin(run)
    if run.eval_pending:  # the checkpoint resumed from was published, its step's evaluation never ended
        _evaluate(run, run.start)
    done, preempted = run.start, False
    for step in range(run.start, cfg.steps):
        lr = _set_lr(run, step)
        loss_sum, grad_norm = _step(run, step, _draw(run, step))
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps:
            _log(run, done, lr, loss_sum, grad_norm, on_log)
        run.bar.update(1)
        evaluate = _evaluates(cfg, done)
        saved = done % cfg.ckpt_every == 0 or done == cfg.steps
        if saved:  # published before the step's evaluation: an evaluation that fails costs the run no training
            _checkpoint(run, done)
            if evaluate:
                _settle(run)  # (--async-checkpoint: published now, not at the next checkpoint)
        if evaluate:
            _evaluate(run, done)
        preempted = _agree_preempted(run, flag)
        stop = preempted or (cfg.stop_after is not None and done >= cfg.stop_after)
        if stop and not saved:
            _checkpoint(run, done)
        if stop:
            break
    return _finish(run, done, preempted, flag)


def _evaluates(cfg: TrainConfig, done: int) -> bool:
    """Whether the run evaluates after ``done`` steps (every ``eval_every`` and at the last)."""
    return done % cfg.eval_every == 0 or done == cfg.steps


def _prepare(model: nn.Module, task: Task, cfg: TrainConfig, model_config: Dict[str, Any]) -> _Run:
    """Check the settings against the process layout, seed, move the model to its device, and make the EMA and the
    optimizer: a fresh run, before any checkpoint is read. Under torchrun the ranks first agree that they build the
    same model with the same settings (one collective; a difference is the same one-line error on every rank)."""
    ctx = distributed_context(cfg.dist_timeout)
    if ctx.world > 1:
        agreement.check_same_model(model, model_config, cfg, _autocast_dtype(cfg, ctx.device), ctx.device)
    unsupported = parallel.check_supported(cfg.fsdp, cfg.ema, cfg.sam_rho)
    if unsupported:
        raise ValueError(f"--fsdp with {unsupported[0]}: {unsupported[1]}")
    lay = parallel.layout(ctx.rank, ctx.world, cfg.context_parallel, ctx.device)
    if lay.cp_size > 1 and getattr(task, "split", None) is None:
        raise ValueError(f"--context-parallel: the {model_config.get('family', 'this')} family cannot split its "
                         f"examples across ranks yet")
    shares = lay.dp_world * cfg.grad_accum
    if cfg.batch_size % shares:
        raise ValueError(f"batch_size {cfg.batch_size} must be divisible by data-parallel processes × grad_accum = "
                         f"{shares}")
    if cfg.steps < 1:
        raise ValueError(f"steps must be ≥ 1, got {cfg.steps}")
    if getattr(task, "split_evaluation", False):  # evaluation forwards no more examples than a training one
        task.eval_batch = max(1, min(task.eval_batch, cfg.batch_size // shares))
    torch.manual_seed(cfg.seed + lay.dp_rank)  # the ranks sharing an example draw the same noise and dropout
    no_decay = parallel.no_decay_names(model)  # (by name: materialising or sharding drops the marks)
    if not parallel.is_meta(model):
        model.to(ctx.device)
    elif not cfg.fsdp:  # (a sharded run materialises its shards alone, in _parallelise)
        parallel.init_blockwise(model, copy.deepcopy(model), cfg.seed, ctx.device)
    memory.apply_activation_checkpointing(model, cfg.activation_checkpointing)  # (names unchanged; before FSDP)
    ema = _Ema(model, cfg.ema) if cfg.ema > 0 else None
    optimizer = configure_optimizer(model, cfg, no_decay)
    return _Run(cfg=cfg, task=task, model_config=model_config, meta={**model_config, "train": asdict(cfg)}, ctx=ctx,
                lay=lay, out=Path(cfg.out), raw=model, fwd_model=model, ema=ema, no_decay=no_decay,
                optimizer=optimizer, faults=getattr(task, "faults", None))


def _resolve(run: _Run) -> Path:
    """The run folder's newest intact checkpoint. Under torchrun the ranks verify it together, each checksumming
    every P-th file (the shards are read once, in parallel, not once per rank), and agree on the first problem any
    rank found; the main rank alone warns about a checkpoint it skips."""
    ctx = run.ctx
    if ctx.world == 1:
        return resolve_checkpoint(run.out)

    def agree(problem: Optional[str]) -> Optional[str]:
        found: List[Optional[str]] = [None] * ctx.world
        dist.all_gather_object(found, problem)
        return next((p for p in found if p), None)

    with warnings.catch_warnings():
        if not ctx.main:
            warnings.simplefilter("ignore", CheckpointWarning)
        return resolve_checkpoint(run.out, share=(ctx.rank, ctx.world), agree=agree)


def _resume(run: _Run) -> Optional[Dict[str, Any]]:
    """Continue from the run folder's newest intact checkpoint when resuming and there is one: weights, optimizer
    (unsharded runs; a sharded one loads it in :func:`_parallelise`), EMA, this rank's RNG, step, history, metrics
    and bad samples. Returns the checkpoint's trainer state (None: a fresh run)."""
    cfg, out = run.cfg, run.out
    if not (cfg.resume and (out / "checkpoints").exists()):
        return None
    try:
        ck = _resolve(run)
    except FileNotFoundError:
        return None
    diff = _model_diff(ck, run.model_config, run.raw)
    if diff:
        listing = "; ".join(f"{k}: checkpoint {a!r} vs now {b!r}" for k, (a, b) in diff.items())
        raise ValueError(f"cannot resume from {ck}: its model config differs — {listing}")
    run.resumed = ck
    sharded = is_sharded(ck)
    if not (sharded and cfg.fsdp):  # (a sharded checkpoint into a sharded model: in _parallelise, from meta)
        _materialise(run)
        load_weights(run.raw, ck)
    state = load_trainer_state(ck)
    if sharded and not cfg.fsdp:  # a plain run (one process, DDP) reads every shard itself
        parallel.load_sharded(run.raw, run.optimizer, ck / SHARDED)
    elif not cfg.fsdp:  # (sharded: once the parameters are sharded, in _parallelise)
        parallel.load_optimizer_state(run.raw, run.optimizer, state["optimizer"], state.get("optimizer_format"))
    if run.ema is not None and (ck / "ema.safetensors").is_file():
        load_weights(run.ema.model, ck, ema=True)
    rngs = state["rng"]  # per rank (a run resumed on more ranks than it was saved with reuses them in turn)
    set_rng_state(rngs[run.ctx.rank % len(rngs)] if isinstance(rngs, list) else rngs)
    run.start = int(state["step"])
    run.history = state.get("history", [])
    run.metrics = read_config(ck).get("metrics", {})  # a run resumed at its end reports its final evaluation
    if run.faults is not None:
        run.faults.restore(state.get("bad_samples", {}))
    _restore_evaluation(run, ck)
    return state


def _materialise(run: _Run) -> None:
    """Before whole weights are loaded (a checkpoint of whole tensors, ``--init-from``): a model still on the meta
    device made whole on this rank, initialised block-wise, with its optimizer (it is sharded afterwards as a model
    built whole is)."""
    if parallel.is_meta(run.raw):
        parallel.init_blockwise(run.raw, copy.deepcopy(run.raw), run.cfg.seed, run.ctx.device)
        run.optimizer = configure_optimizer(run.raw, run.cfg, run.no_decay)


def _parallelise(run: _Run, trainer_state: Optional[Dict[str, Any]]) -> None:
    """Choose the autocast dtype, then shard the model (FSDP: a new optimizer over the shards, given the resumed
    state), compile its forward, or wrap it in DDP, as the settings ask."""
    cfg, ctx, raw = run.cfg, run.ctx, run.raw
    run.amp = _autocast_dtype(cfg, ctx.device)
    if cfg.fsdp:
        from_shards = run.resumed is not None and is_sharded(run.resumed)
        if from_shards or parallel.is_meta(raw):
            run.optimizer.param_groups.clear()  # (it held the whole parameters)
        if parallel.is_meta(raw):  # built on the meta device: each rank initialises its shards, block by block
            template = copy.deepcopy(raw)
            parallel.shard(raw, run.amp == torch.bfloat16)
            parallel.init_blockwise(raw, template, cfg.seed, ctx.device)
        elif from_shards:  # never the whole weights again: meta → sharded → this rank's shards → loaded
            buffers = parallel.to_meta(raw)
            parallel.shard(raw, run.amp == torch.bfloat16)
            parallel.materialise(raw, ctx.device, buffers)
        else:  # a fresh run shards the weights the family built (each rank keeps its shard, the rest is freed)
            parallel.shard(raw, run.amp == torch.bfloat16)
        run.optimizer = configure_optimizer(raw, cfg, run.no_decay)  # over the sharded parameters
        if from_shards:
            parallel.load_sharded(raw, run.optimizer, run.resumed / SHARDED)
        elif trainer_state is not None:  # a checkpoint of whole tensors (one process, DDP, earlier FSDP runs)
            parallel.load_optimizer_state(raw, run.optimizer, trainer_state["optimizer"],
                                          trainer_state.get("optimizer_format"))
        if cfg.async_checkpoint:  # the background writes talk on their own group, never on training's
            run.ckpt_group = dist.new_group(backend="gloo")
    fwd_model: nn.Module = raw
    if cfg.compile:
        fwd_model = torch.compile(raw)
    if ctx.world > 1 and not cfg.fsdp:
        from torch.nn.parallel import DistributedDataParallel as DDP

        fwd_model = DDP(fwd_model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
    run.fwd_model = fwd_model


def _begin(run: _Run) -> None:
    """Open the progress bar (none for a run already complete), say where a resumed run stands ("resumed from step
    N of M", "already complete at step N"), start the counters there, warn of a run too short to leave its warm-up,
    and put the model in training mode."""
    from tqdm.auto import tqdm

    cfg, ctx = run.cfg, run.ctx
    complete = run.start >= cfg.steps  # nothing to train: no bar that pretends to
    run.bar = tqdm(total=cfg.steps, initial=run.start, disable=complete or not (cfg.progress and ctx.main),
                   desc=f"train {run.out.name}", dynamic_ncols=True)
    if ctx.main and run.resumed is not None:
        of = f"of {cfg.steps}" if run.start <= cfg.steps else f"past --steps {cfg.steps}"
        run.bar.write(f"{run.out}: already complete at step {run.start} {of}: nothing to train, its last evaluation "
                      f"stands (--steps to go further, --no-resume to start over)" if complete
                      else f"{run.out}: resumed from step {run.start} {of} ({run.resumed})")
    run.t_last, run.units = time.perf_counter(), 0
    run.skipped = next((r["skipped"] for r in reversed(run.history) if "skipped" in r), 0)
    run.train_s = next((r["train_s"] for r in reversed(run.history) if "train_s" in r), 0.0)
    run.nonfinite_run = 0
    run.saved = run.start
    run.stats = _running_stats(run.raw)
    if ctx.main:
        name = " ".join(str(v) for v in (run.model_config.get("family"), run.model_config.get("preset")) if v)
        run.tracker = tracking.open_tracker(cfg.log, run.out, run.history, run.start, run.meta,
                                            f"{name} {run.out.name}".strip())
    if ctx.main and run.start == 0 and cfg.steps <= cfg.warmup:
        run.bar.write(f"note: steps ({cfg.steps}) ≤ warmup ({cfg.warmup}): the learning rate only climbs towards lr "
                      f"({cfg.lr:g}) and never decays — a run this short tests the plumbing, not the model (expect "
                      f"untrained outputs); pass --warmup to shorten the warm-up")
    run.fwd_model.train()


def _set_lr(run: _Run, step: int) -> float:
    """Set the scheduled learning rate of ``step`` on every parameter group (times its ``lr_scale``); returns it."""
    lr = lr_at(step, run.cfg)
    for g in run.optimizer.param_groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)
    return lr


def _draw(run: _Run, step: int) -> List[Any]:
    """This rank's micro-batches of ``step``, every one drawn before the step changes anything: a bad sample then
    stops the run (with a checkpoint of the steps done, single-process) naming the file and how to go on."""
    lay, ctx = run.lay, run.ctx
    shares = lay.dp_world * run.cfg.grad_accum
    try:
        batches = [run.task.batch(step, micro * lay.dp_world + lay.dp_rank, shares, ctx.device)
                   for micro in range(run.cfg.grad_accum)]
        if lay.cp_size > 1:
            split = getattr(run.task, "split", None)
            batches = [split(b, lay.cp_rank, lay.cp_size) for b in batches]
    except SampleError as e:
        run.bar.close()
        if ctx.world == 1 and step > run.saved:  # under torchrun the other ranks are elsewhere: no collective save
            _checkpoint(run, step)
        resume = (f"the checkpoint of step {run.saved} in {run.out / 'checkpoints'} resumes" if run.saved
                  else "nothing to lose")
        raise SampleError(e.path, e.reason, f"stopped before step {step + 1}; {resume}: fix or remove the file, or "
                          f"run with --skip-bad-samples") from e
    if run.faults is not None:
        for path, reason in run.faults.unreported():
            run.bar.write(f"step {step + 1}: skipped bad sample {path} — {reason} ({len(run.faults)} so far)")
    return batches


def _step(run: _Run, step: int, batches: List[Any]) -> Tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step over ``batches`` (forward / backward of each, SAM's second pass, clipping); a step whose
    loss or gradient norm is not finite changes nothing and is counted, and too many in a row stop the run.
    Returns (this rank's summed loss, the gradient norm)."""
    cfg, ctx, task = run.cfg, run.ctx, run.task
    loss_sum = torch.zeros((), device=ctx.device)
    stats_before = [b.clone() for b in run.stats]
    for micro, batch in enumerate(batches):
        run.units += task.count(batch)
        loss_sum += _forward_backward(run.fwd_model, task, batch, micro == cfg.grad_accum - 1, cfg, ctx, run.amp,
                                      run.lay.cp_mesh)
    if cfg.sam_rho > 0:
        _sam_second_pass(run.raw, run.fwd_model, task, batches, run.optimizer, cfg, ctx, run.amp, run.lay.cp_mesh)
    grad_norm = torch.nn.utils.clip_grad_norm_(run.raw.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else
                                               float("inf"))
    # gradients are all-reduced, so every rank sees the same norm and takes the same decision
    finite = bool(torch.isfinite(grad_norm)) and (ctx.world > 1 or bool(torch.isfinite(loss_sum)))
    if finite:
        run.optimizer.step()
        run.nonfinite_run = 0
    else:  # weights, optimizer state, EMA and running statistics untouched
        with torch.no_grad():
            for b, before in zip(run.stats, stats_before):
                b.copy_(before)
        run.skipped += 1
        run.nonfinite_run += 1
        run.bar.write(f"step {step + 1}: non-finite loss or gradient norm — step skipped ({run.skipped} so far)")
    run.optimizer.zero_grad(set_to_none=True)
    if run.ema is not None and finite:
        run.ema.update(run.raw, step)
    if run.nonfinite_run >= cfg.max_nonfinite:
        run.bar.close()
        raise FloatingPointError(
            f"{run.nonfinite_run} consecutive steps (up to step {step + 1}) had a non-finite loss or gradient norm; "
            f"stopping. The last checkpoint in {run.out / 'checkpoints'} is intact: resume with a lower learning "
            f"rate, fp32, or raise max_nonfinite")
    return loss_sum, grad_norm


def _peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB (the host's; 0 where the platform does not say)."""
    try:
        import resource
    except ImportError:  # Windows
        return 0.0
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 / (1024 if sys.platform == "darwin" else 1)  # bytes on macOS, KiB on Linux


def _log(run: _Run, done: int, lr: float, loss_sum: torch.Tensor, grad_norm: torch.Tensor,
         on_log: Optional[Callable[[Dict[str, Any]], None]]) -> None:
    """Append a history record after ``done`` steps (loss averaged over the ranks, learning rate, throughput since
    the last record, gradient norm, steps skipped, bad samples, the peak resident memory of the busiest rank, the
    seconds trained so far over every invocation of the run) and show it on the main rank."""
    ctx, lay, faults = run.ctx, run.lay, run.faults
    rss = torch.tensor([_peak_rss_mb()], dtype=torch.float64, device=ctx.device)
    if ctx.world > 1:
        dist.all_reduce(loss_sum)
        loss_sum /= ctx.world
        dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    now = time.perf_counter()
    rate = run.units * lay.dp_world * lay.cp_size / max(now - run.t_last, 1e-9)
    run.train_s += now - run.t_last
    run.t_last, run.units = now, 0
    rec = {"step": done, "loss": float(loss_sum), "lr": lr, f"{run.task.unit}_s": rate,
           "grad_norm": float(grad_norm), "skipped": run.skipped, "peak_rss_mb": float(rss),
           "train_s": run.train_s}
    if faults:
        rec["bad_samples"] = len(faults)
    _record(run, rec)
    if ctx.main:
        run.bar.set_postfix(loss=f"{rec['loss']:.4f}", lr=f"{lr:.2e}", **{f"{run.task.unit}/s": f"{rate:,.0f}"},
                            **({"skipped": run.skipped} if run.skipped else {}),
                            **({"bad": len(faults)} if faults else {}))
        if on_log:
            on_log(rec)


def _record(run: _Run, rec: Dict[str, Any]) -> None:
    """Append ``rec`` to the history and, on the main rank, send it to the ``--log`` tracker."""
    run.history.append(rec)
    if run.tracker is not None:
        run.tracker.log(rec)


def _evaluate(run: _Run, done: int) -> None:
    """Evaluate after ``done`` steps on the main rank (the EMA weights when kept): record the metrics, rewrite
    history and curves. Evaluation time is not training time.

    Under torchrun every rank runs the same evaluation, so that none waits in a collective (past ``--dist-timeout``)
    while the first evaluates; the others' results and files go to a scratch folder. Under FSDP it runs on the
    sharded model (each block's parameters gathered for its forward, then freed: no rank holds a whole copy). Under
    context parallelism a task whose evaluation splits its examples as training does (``split_evaluation``)
    evaluates inside the training's context-parallel group, each rank its slice of every example.

    The checkpoint of step ``done``, when there is one, was published before: the metrics then go beside it
    (:data:`EVALUATION`), so that a run resumed from it knows them — and, without that file, evaluates again."""
    ctx, ema = run.ctx, run.ema
    model = ema.model if ema is not None else run.raw
    if ctx.world > 1 and not ctx.main:
        with tempfile.TemporaryDirectory(prefix="polymixer-eval-") as scratch, _evaluation_context(run):
            run.task.evaluate(model, done, Path(scratch))
        _after_evaluation(run)
        return
    if run.cfg.progress:
        run.bar.write(f"step {done}: evaluating{' the EMA weights' if ema is not None else ''} …")
    t_eval = time.perf_counter()
    with _evaluation_context(run):
        run.metrics = run.task.evaluate(model, done, run.out)
    _after_evaluation(run)
    took = time.perf_counter() - t_eval
    run.t_last += took  # throughput counts training time only
    if run.metrics:  # a task may only save artefacts (e.g. a sample grid) and report nothing
        _record(run, {"step": done, **{f"eval_{k}": v for k, v in run.metrics.items()}})
        run.bar.write(f"step {done}: " + ", ".join(f"{k} {v:.4f}" for k, v in run.metrics.items()) +
                      f" ({took:.0f} s)")
    if run.saved == done:
        _write_json(checkpoint_folder(run.out, done) / EVALUATION, {"step": done, "metrics": run.metrics})
    _write_history(run)


# beside a checkpoint published before its step's evaluation ended: that evaluation's metrics
EVALUATION = "evaluation.json"


def _evaluation_context(run: _Run) -> Any:
    """Where the task evaluates: in the training's context-parallel group for a task that splits its evaluation
    (``split_evaluation``) under ``--context-parallel``; as one process otherwise."""
    if run.lay.cp_size > 1 and getattr(run.task, "split_evaluation", False):
        from ...ops.parallel import context_parallel

        return context_parallel(run.lay.cp_mesh)
    return contextlib.nullcontext()


def _after_evaluation(run: _Run) -> None:
    """Back to training: a sharded model frees what its evaluation gathered, and the model trains again."""
    if run.cfg.fsdp:
        parallel.reshard(run.raw)
    run.raw.train()


def _restore_evaluation(run: _Run, ck: Path) -> None:
    """A run resumed from ``ck``: the evaluation of its step, when the checkpoint was published before it — its
    metrics from beside the checkpoint (:data:`EVALUATION`), or, where that evaluation never ended (the step
    evaluates and the history holds no evaluation of it), an evaluation before training goes on."""
    done = run.start
    try:
        saved = json.loads((ck / EVALUATION).read_text())
    except (OSError, ValueError):
        saved = None
    if any(r.get("step") == done and any(k.startswith("eval_") for k in r) for r in run.history):
        return  # (a checkpoint written after its step's evaluation)
    if isinstance(saved, dict) and saved.get("step") == done:
        run.metrics = dict(saved.get("metrics") or {})
        if run.metrics:
            run.history.append({"step": done, **{f"eval_{k}": v for k, v in run.metrics.items()}})
    elif _evaluates(run.cfg, done):
        run.eval_pending = True


def _agree_preempted(run: _Run, flag: Dict[str, Any]) -> bool:
    """Whether a preemption signal arrived here or, under torchrun, on any rank: all stop after the same step."""
    preempted = flag["signal"] is not None
    if run.ctx.world > 1:
        f = torch.tensor([float(preempted)], device=run.ctx.device)
        dist.all_reduce(f, op=dist.ReduceOp.MAX)
        preempted = bool(f.item())
    return preempted


def _rank_states(run: _Run) -> Tuple[Any, Dict[str, str]]:
    """Every rank's RNG states (a list under torchrun, so that dropout resumes exactly everywhere) and the bad
    samples any rank skipped (a collective under torchrun)."""
    rngs: Any = rng_state()
    bad = dict(run.faults.bad) if run.faults is not None else {}
    if run.ctx.world > 1:
        gathered: List[Any] = [None] * run.ctx.world
        dist.all_gather_object(gathered, (rngs, bad))
        rngs = [g[0] for g in gathered]
        for _, b in gathered:
            for path, reason in b.items():
                bad.setdefault(path, reason)
    return rngs, bad


def _checkpoint(run: _Run, done: int) -> None:
    """A checkpoint of the state after ``done`` steps (every rank calls it): weights, optimizer, every rank's RNG,
    history, bad samples of every rank, EMA; the main rank writes it. Under FSDP every rank writes its own shards
    (:func:`_checkpoint_sharded`)."""
    if run.cfg.fsdp:
        _checkpoint_sharded(run, done)
        return
    ctx = run.ctx
    rngs, bad = _rank_states(run)
    if ctx.main:
        trainer_state = {"optimizer": run.optimizer.state_dict(), "step": done, "rng": rngs, "history": run.history,
                         "bad_samples": bad}
        save_checkpoint(run.out, done, run.raw, {**run.meta, "metrics": run.metrics}, trainer_state,
                        run.ema.model if run.ema is not None else None, keep=run.cfg.keep)
        if bad:
            _write_json(run.out / "bad_samples.json", bad)
    if ctx.world > 1:
        dist.barrier()
    run.saved = done


@dataclass
class _Pending:
    """A sharded checkpoint being written: its temporary folder, what its main rank adds, and the background save
    (None once written)."""

    tmp: Path
    step: int
    config: Dict[str, Any]
    trainer_state: Dict[str, Any]
    future: Any = None


def _agreed(run: _Run, value: Any) -> Any:
    """The main rank's ``value`` on every rank (a broadcast)."""
    box = [value]
    if run.ctx.world > 1:
        dist.broadcast_object_list(box, src=0)
    return box[0]


def _checkpoint_sharded(run: _Run, done: int) -> None:
    """Every rank writes its shards of the model and optimizer into the checkpoint's temporary folder (``sharded/``,
    torch.distributed.checkpoint), then the folder is published (:func:`_publish`) — at once, or with
    ``--async-checkpoint`` once the background write completes (the next checkpoint, or the end, waits for it)."""
    _settle(run)  # one save in flight at most
    rngs, bad = _rank_states(run)
    try:
        tmp = begin_checkpoint(run.out, done) if run.ctx.main else None
        failure = None
    except CheckpointError as e:
        tmp, failure = None, str(e)
    tmp, failure = _agreed(run, (tmp, failure))
    if failure:
        raise CheckpointError(failure)
    state = parallel.sharded_state(run.raw, run.optimizer)
    pending = _Pending(tmp, done, {**run.meta, "metrics": dict(run.metrics)},
                       {"step": done, "rng": rngs, "history": list(run.history), "bad_samples": bad,
                        "optimizer_format": parallel.OPTIMIZER_DCP})
    try:
        pending.future = parallel.save_sharded(state, tmp / SHARDED, run.ckpt_group, run.cfg.async_checkpoint)
    except Exception as e:  # every rank raises alike: DCP gathers the ranks' failures
        raise CheckpointError(f"could not write checkpoint {checkpoint_folder(run.out, done)}: {e}; the earlier "
                              f"checkpoints and 'latest' are unchanged") from e
    run.pending = pending
    run.saved = done
    if pending.future is None:
        _settle(run)


def _settle(run: _Run) -> None:
    """Publish the sharded checkpoint in flight, if any (every rank calls it): wait for its background write, each
    rank checksums the shard files it wrote (in parallel), and the main rank writes the config, trainer state and
    manifest, renames the folder into place and points ``latest`` at it. Any rank's failure raises on every rank."""
    pending, ctx = run.pending, run.ctx
    if pending is None:
        return
    run.pending = None
    failure = None
    try:
        if pending.future is not None:
            pending.future.result()
        folder = pending.tmp / SHARDED
        entries = file_entries(pending.tmp, [f"{SHARDED}/{n}" for n in parallel.own_shard_files(folder, ctx.rank)])
    except Exception as e:
        entries, failure = {}, f"could not write checkpoint {checkpoint_folder(run.out, pending.step)}: {e}"
    gathered: List[Any] = [(entries, failure)]
    if ctx.world > 1:
        gathered = [None] * ctx.world
        dist.all_gather_object(gathered, (entries, failure))
    failure = next((f for _, f in gathered if f), None)
    if ctx.main and failure is None:
        try:
            publish_checkpoint(pending.tmp, run.out, pending.step, pending.config, pending.trainer_state,
                               keep=run.cfg.keep, entries={k: v for e, _ in gathered for k, v in e.items()})
            if pending.trainer_state["bad_samples"]:
                _write_json(run.out / "bad_samples.json", pending.trainer_state["bad_samples"])
        except CheckpointError as e:
            failure = str(e)
    failure = _agreed(run, failure)
    if failure:
        raise CheckpointError(failure)


def _write_history(run: _Run) -> None:
    """history.json and curves.png (loss, learning rate, evaluations) of the run so far."""
    out, model_config = run.out, run.model_config
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "history.json", run.history)
    if run.cfg.curves and run.history:
        try:
            name = " ".join(str(v) for v in (model_config.get("family"), model_config.get("preset")) if v)
            plot_history([(str(out), run.history)], out / "curves.png", title=f"{name} — {out}" if name else str(out),
                         warmup=run.cfg.warmup)
        except Exception as e:  # a plot must never stop a run
            run.bar.write(f"could not draw {out / 'curves.png'}: {e}")


def _finish(run: _Run, done: int, preempted: bool, flag: Dict[str, Any]) -> Dict[str, Any]:
    """Close the bar, write the final history, and either raise :class:`Preempted` (after a signal) or return the
    run's result."""
    ctx, out, faults = run.ctx, run.out, run.faults
    _settle(run)  # a checkpoint still being written in the background is waited for and published
    run.bar.close()
    if run.tracker is not None:
        run.tracker.close()
    if ctx.main:
        _write_history(run)
        if faults:
            print(f"skipped {len(faults)} unreadable or malformed sample file(s), listed in "
                  f"{out / 'bad_samples.json'}", flush=True)
    if ctx.world > 1:
        dist.barrier()
    if preempted:
        if ctx.main:
            print(f"{flag['signal'] or 'a signal on another rank'}: stopped after step {done} with a checkpoint in "
                  f"{out / 'checkpoints'}; exit status {EXIT_PREEMPTED} — run the same command to resume", flush=True)
        raise Preempted(done, flag["signal"] or "")
    return {"metrics": run.metrics, "history": run.history, "rank": ctx.rank, "world": ctx.world}
