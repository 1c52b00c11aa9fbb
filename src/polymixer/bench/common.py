"""What every benchmark command shares: interleaved timing with warm-up and medians, peak memory, machine facts,
tables, JSON and plots."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch


@dataclass
class Timing:
    """Wall-clock seconds of repeated calls: the median is the figure, the spread says how much to trust it."""

    samples: List[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """(max − min) / median over the repeats."""
        return (max(self.samples) - min(self.samples)) / self.median if self.samples else float("nan")


def time_interleaved(fns: Dict[str, Callable[[], Any]], warmup: int = 1, repeats: int = 5,
                     on_sample: Optional[Callable[[str], None]] = None) -> Dict[str, Timing]:
    """Time several callables round-robin (warm-up rounds first), so that slow drift of the machine affects all of
    them alike and ratios measured in one run stay honest. Returns one :class:`Timing` per name."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    out = {name: Timing() for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            out[name].samples.append(time.perf_counter() - t0)
            if on_sample is not None:
                on_sample(name)
    return out


@contextlib.contextmanager
def _silent_fd(fd: int):
    """Silence a file descriptor (the profiler's C++ side logs to stderr at every start and stop)."""
    sys.stderr.flush()
    saved = os.dup(fd)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), fd)
            yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


def peak_memory_mb(fn: Callable[[], Any]) -> Optional[float]:
    """Peak of the tensor memory allocated during one call of ``fn`` (MB): every allocation and free that PyTorch's
    allocator reports to the profiler, replayed in time order. Tensors alive before the call (inputs, weights) are
    not counted; neither are BLAS scratch buffers. Works for eager and compiled code alike, on any OS."""
    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    with _silent_fd(2), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak / 2**20


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse instead of handing it back to the OS (``mallopt``:
    M_MMAP_MAX = 0, M_TRIM_THRESHOLD = 2 GiB), so that large activations are recycled rather than page-faulted in
    afresh at every call — what jemalloc / tcmalloc do, as PyTorch's CPU performance guide recommends. It affects
    the whole process and every model alike; returns False where glibc is not the allocator."""
    import ctypes
    import ctypes.util

    if sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


def machine() -> Dict[str, Any]:
    """Facts that make a benchmark figure reproducible."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def format_table(rows: Sequence[Dict[str, Any]], columns: Sequence[str], headers: Optional[Sequence[str]] = None) -> str:
    """A plain aligned text table (also valid Markdown)."""
    headers = list(headers or columns)

    def cell(v: Any) -> str:
        if v is None:
            return "—"
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"
        return str(v)

    body = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep] + [line(b) for b in body])


def per_class_table(scores: Dict[str, Any], unit: str) -> str:
    """The per-class table of a segmentation evaluation (``ConfusionMatrix.as_dict()``): IoU and recall in %,
    support and predictions counted in ``unit`` (pixels, points)."""
    rows = [{**r, "iou": None if r["iou"] is None else 100 * r["iou"],
             "recall": None if r["recall"] is None else 100 * r["recall"]} for r in scores["per_class"]]
    return format_table(rows, ["class", "name", "iou", "recall", "support", "predicted"],
                        ["class", "name", "IoU %", "recall %", unit, "predicted"])


def apply_overrides(cfg: Any, quick: Optional[Dict[str, Any]], args: Any, fields: Dict[str, str]) -> Any:
    """Set ``quick``'s values on the config (``--quick``), then every command-line option that was given
    (``fields`` maps argument names to config fields; lists become tuples)."""
    for k, v in (quick or {}).items():
        setattr(cfg, k, v)
    for arg, name in fields.items():
        v = getattr(args, arg)
        if v is not None:
            setattr(cfg, name, tuple(v) if isinstance(v, list) else v)
    return cfg


def write_json(path: Path, payload: Dict[str, Any]) -> None:
    """Write JSON atomically (a crash never leaves half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__")
                              else str(o)))
    os.replace(tmp, path)


def run_parts(cfg: Any, path: Path, parts: Dict[str, Callable[[Any, bool], Dict[str, Any]]],
              progress: bool = True) -> Dict[str, Any]:
    """Run the parts of a bench named in ``cfg.parts`` in order and return the payload written to ``path``.

    Parts of an earlier run in the same file that this run does not redo are kept, so a one-hour quality part and a
    ten-minute speed part can be measured (and re-measured) separately; each part carries the machine and the
    configuration it was measured with. The file is rewritten after every part, so a finished part survives a later one
    being interrupted."""
    payload: Dict[str, Any] = {"config": asdict(cfg), "machine": machine()}
    if path.is_file():
        old = json.loads(path.read_text())
        # every earlier part stays until this run replaces it (a part may read its own earlier rows to keep some)
        payload.update({name: old[name] for name in parts if name in old})
    for name, fn in parts.items():
        if name in cfg.parts:
            result = {**fn(cfg, progress), "machine": machine(), "config": asdict(cfg)}
            payload[name] = json.loads(json.dumps(result, default=str))  # exactly as it reads back from the file
            write_json(path, payload)
    return payload


def resume_point(out: Path, train_cfg: Any) -> bool:
    """Prepare a quality bench's training run in ``out`` to continue an interrupted bench, and say whether it was
    already trained to the end (then it is only evaluated again). A run there made with other training settings
    (steps, batch, learning rate, seed…) is not continued: ``train_cfg.resume`` is switched off and it starts over."""
    from ..train.checkpoint import read_config, resolve_checkpoint

    try:
        ck = resolve_checkpoint(out)
        saved = read_config(ck).get("train", {})
        step = int(ck.name.split("_")[-1])
    except (FileNotFoundError, ValueError, KeyError):
        train_cfg.resume = False
        return False
    keys = ("steps", "batch_size", "lr", "min_lr", "warmup", "weight_decay", "seed", "sam_rho", "ema", "init_from")
    train_cfg.resume = all(saved.get(k) == getattr(train_cfg, k) for k in keys)
    return train_cfg.resume and step >= train_cfg.steps


def training_minutes(out: Path, started: float, resumed_finished: bool, history: List[Dict[str, Any]],
                     batch: int) -> Optional[float]:
    """Minutes a bench's training run took. Quality benches train with ``resume=True``, so a run that an interrupted
    bench had already finished is only evaluated again (``resumed_finished``): its time is then the one recorded in
    ``out/train_time.json``, or for a run older than that record, estimated from the throughput in its history."""
    record = Path(out) / "train_time.json"
    if not resumed_finished:
        minutes = (time.perf_counter() - started) / 60
        record.write_text(json.dumps({"minutes": minutes}))
        return minutes
    if record.is_file():
        return json.loads(record.read_text())["minutes"]
    seconds, last = 0.0, 0
    for rec in history:
        rate = next((v for k, v in rec.items() if k.endswith("_s") and v), None)
        if rate and "loss" in rec:
            seconds += (rec["step"] - last) * batch / rate
            last = rec["step"]
    return seconds / 60 if seconds else None


def new_figure(ncols: int, width: float = 5.2, height: float = 4.0, nrows: int = 1):
    """A matplotlib figure on the non-interactive backend (benchmarks run headless) and its axes, row by row;
    ``width`` and ``height`` are per panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return fig, [ax for row in axes for ax in row]


def plot_speed_vs_baseline(ax, ax2, rows: Sequence[Dict[str, Any]], x: str, y: str, names: Dict[str, str],
                           xlabel: str, ylabel: str, baseline: str) -> None:
    """Throughput (``ax``, log-log) and ratio to the baseline (``ax2``) of each preset, one line per preset and dtype
    (fp32 solid, bf16 dashed): the speed panel of the model-family benches."""
    styles = {"fp32": "-", "bf16": "--"}
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        for k, preset in enumerate(dict.fromkeys(r["preset"] for r in rows)):
            pts = [r for r in rows if r["preset"] == preset and r["dtype"] == dtype]
            kw = dict(marker="o", ls=styles.get(dtype, ":"), color=f"C{k}",
                      label=f"{names.get(preset, preset)} {dtype}")
            ax.plot([r[x] for r in pts], [r[y] for r in pts], **kw)
            ax2.plot([r[x] for r in pts], [r["speedup"] for r in pts], **kw)
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xlabel(xlabel)
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax2.set_ylabel(f"speed ÷ {baseline} (same dtype)")
    ax2.axhline(1.0, color="gray", lw=0.8)


def save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


_NONE = ("none", "None", "scene")


def parse_variant(spec: str) -> Tuple[str, Dict[str, Any]]:
    """``"tiny-tsvipom+spatial_position=rope+sel_heads=1"`` → ("tiny-tsvipom", {"spatial_position": "rope",
    "sel_heads": 1}): a preset and overrides of its config, each value converted to the type of the field (an
    untyped field takes an int when the value is one; "none" / "scene" is None where the field allows it)."""
    import typing

    from ..models import model_config

    preset, *parts = spec.split("+")
    config = model_config(preset)
    defaults, hints = asdict(config), typing.get_type_hints(type(config))
    overrides: Dict[str, Any] = {}
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq or key not in defaults:
            raise ValueError(f"variant {spec!r}: {part!r} is not field=value with a field of {preset}'s config")
        hint = hints.get(key)
        nullable = hint is Any or type(None) in typing.get_args(hint)
        if value in _NONE and nullable:
            overrides[key] = None
            continue
        base = [a for a in typing.get_args(hint) if a is not type(None)]
        kind = hint if hint in (bool, int, float, str) else base[0] if len(base) == 1 else type(defaults[key])
        if hint is Any:
            kind = int if value.lstrip("-").isdigit() else str
        try:
            overrides[key] = (value.lower() in ("1", "true", "yes")) if kind is bool else kind(value)
        except ValueError as e:
            raise ValueError(f"variant {spec!r}: {key} must be a {kind.__name__}, got {value!r}") from e
    return preset, overrides


def describe_variant(spec: str, names: Dict[str, str]) -> str:
    """A variant's display name: the preset's (from ``names``) and its overrides in brackets."""
    preset, overrides = parse_variant(spec)
    extra = ", ".join(f"{k}={'whole scene' if v is None else v}" for k, v in overrides.items())
    return names.get(preset, preset) + (f" ({extra})" if extra else "")
