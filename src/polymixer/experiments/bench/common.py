"""What every benchmark command shares: interleaved timing with warm-up and medians, peak memory, machine facts,
tables, JSON and plots."""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import platform
import re
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from ...files import write_text_atomic
from ..locks import claimed, locked
from ..report import format_table
from ...ranges import Range
from ..tasks.common import float_in, int_at_least


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


def synchronized(fn: Callable[[], Any], device: torch.device) -> Callable[[], Any]:
    """``fn`` followed by a device synchronisation on CUDA (kernels launch asynchronously: without it a timer measures
    the launches, not the work); ``fn`` itself elsewhere."""
    if device.type != "cuda":
        return fn

    def call() -> Any:
        out = fn()
        torch.cuda.synchronize(device)
        return out

    return call


def peak_memory_mb(fn: Callable[[], Any], device: Optional[torch.device] = None, collect: bool = True
                   ) -> Optional[float]:
    """Peak of the tensor memory allocated during one call of ``fn`` (MB): every allocation and free that PyTorch's
    allocator reports to the profiler, replayed in time order. Tensors alive before the call (inputs, weights) are
    not counted; neither are BLAS scratch buffers. Works for eager and compiled code alike, on any OS. On CUDA: the
    caching allocator's peak above what was allocated before the call. ``collect``: run the garbage collector first
    (so that no earlier garbage is freed during the call); a caller measuring many calls in a row collects once
    before them instead (a full collection costs ~0.2 s in a large process)."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    from torch.profiler import ProfilerActivity, profile

    if collect:
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


def _cpu_jiffies() -> Optional[Tuple[float, float]]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat (None where there is none)."""
    try:
        with open("/proc/stat") as f:
            fields = [float(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest time is inside user)
    return (total - idle) / hz, total / hz


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class MachineLoad:
    """How busy the machine was with *other* work while a benchmark ran: the share of all cores' time used by other
    processes (the machine's busy time from /proc/stat minus this process's and its children's), and the load average
    before. Two heavy jobs at once make timings 5–20× slower, so a bench on a busy machine says so."""

    BUSY_SHARE = 0.10  # others used more than this share of the machine's cores
    BUSY_LOAD = 0.5  # or the 1-minute load average per core was above this when the bench started

    def __enter__(self) -> "MachineLoad":
        self.load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        self._start = (_cpu_jiffies(), _own_cpu_seconds())
        return self

    def __exit__(self, *exc: Any) -> None:
        self.load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        end = _cpu_jiffies()
        self.other_share: Optional[float] = None
        if end is not None and self._start[0] is not None:
            busy, total = end[0] - self._start[0][0], end[1] - self._start[0][1]
            own = _own_cpu_seconds() - self._start[1]
            self.other_share = max(0.0, busy - own) / total if total > 0 else None

    def warning(self) -> Optional[str]:
        """A sentence when the machine was busy with other work (None when it was quiet)."""
        cores = os.cpu_count() or 1
        busy_before = self.load_before is not None and self.load_before / cores > self.BUSY_LOAD
        busy_during = self.other_share is not None and self.other_share > self.BUSY_SHARE
        if not (busy_before or busy_during):
            return None
        parts = []
        if busy_before:
            parts.append(f"the load average was {self.load_before:.1f} on {cores} cores when it started")
        if busy_during:
            parts.append(f"other processes used {100 * self.other_share:.0f}% of the machine's CPU time while it ran")
        return ("the machine was busy — " + "; ".join(parts) + ". Timings and speed ratios measured now are not "
                "trustworthy: run benchmarks alone")


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
    facts = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # a bench that ran on the GPU names the card
        gpu = gpu_facts()
        facts["gpu"], facts["capability"] = gpu["name"], gpu["arch"]  # "NVIDIA H100 80GB HBM3", "sm_90"
    return facts


_DRIVER: Dict[str, Optional[str]] = {}


def _driver_version() -> Optional[str]:
    """The NVIDIA driver's version from ``nvidia-smi`` (None where there is none), read once per process."""
    if "v" not in _DRIVER:
        import subprocess

        try:
            done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=20)
            _DRIVER["v"] = done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() \
                else None
        except (OSError, subprocess.SubprocessError):
            _DRIVER["v"] = None
    return _DRIVER["v"]


def gpu_facts(device: Optional[torch.device] = None) -> Optional[Dict[str, Any]]:
    """The GPU a figure was measured on: its name, its architecture as a compiler target (``"sm_90"``) and compute
    capability, SMs, memory, and the CUDA, Triton and driver versions — what a reader needs to compare two runs, and
    what a dispatch table is keyed by. None where PyTorch sees no CUDA device."""
    if not torch.cuda.is_available():
        return None
    dev = torch.device("cuda") if device is None else torch.device(device)
    props = torch.cuda.get_device_properties(dev)
    try:
        import triton

        triton_version: Optional[str] = triton.__version__
    except ImportError:
        triton_version = None
    return {"name": props.name, "arch": f"sm_{props.major}{props.minor}", "capability": f"{props.major}.{props.minor}",
            "sms": props.multi_processor_count, "memory_gib": round(props.total_memory / 2**30, 1),
            "cuda": torch.version.cuda, "triton": triton_version, "driver": _driver_version()}


def kernel_ms(fn: Callable[[], Any], device: torch.device, repeats: int = 5) -> float:
    """Median milliseconds of one call of ``fn``: on CUDA ``triton.testing.do_bench`` (CUDA events, the L2 flushed
    between calls), elsewhere the median of ``repeats`` synchronous wall-clock calls after a warm-up
    (:func:`time_interleaved`) — the CPU timing exists for dry runs of GPU benches, never for a GPU figure."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, return_mode="median"))
    return 1e3 * time_interleaved({"fn": fn}, warmup=1, repeats=repeats)["fn"].median


def recompile_limit(limit: int = 64) -> Any:
    """A context raising dynamo's limit of graphs per function (8 by default): a bench compiles one static graph per
    shape, mode and grad mode on purpose, and layers of one class (PoM, the value PoM) or repeated blocks share one
    ``forward``, so the default limit is reached and ``fullgraph=True`` turns it into an error."""
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"  # torch < 2.6: the latter
    return cfg.patch(**{name: limit})


def failure(e: BaseException) -> Optional[str]:
    """"out of memory" where ``e`` is a failed allocation (CUDA or CPU, also when torch.compile wraps it) — a
    configuration too large for the device, which a bench records and goes on from — else None (another error)."""
    text = str(e)
    if isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in text.lower() or (
            "DefaultCPUAllocator: can't allocate memory" in text):
        return "out of memory"
    return None


def release_memory(device: torch.device) -> None:
    """Give the memory of dropped tensors back between configurations (an out-of-memory configuration leaves its
    activations in the caching allocator until collected)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


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


def render_report(payload: Dict[str, Any], sections: Dict[str, Callable[[Dict[str, Any]], List[str]]],
                  tail: Sequence[str] = ()) -> str:
    """A family bench's text: each part the payload holds (``speed``, ``quality``, …), in the order of ``sections``,
    rendered by its section function from the whole payload, then ``tail`` (the verdicts)."""
    return "\n".join(section_lines(payload, sections) + list(tail))


def section_lines(payload: Dict[str, Any], sections: Dict[str, Callable[[Dict[str, Any]], List[str]]]) -> List[str]:
    """The lines of each part the payload holds, rendered by its section function in the order of ``sections``
    (a family bench's tables, or its verdicts)."""
    lines: List[str] = []
    for part, render in sections.items():
        if part in payload:
            lines += render(payload)
    return lines


def write_json(path: Path, payload: Dict[str, Any]) -> None:
    """Write JSON atomically (a crash never leaves half a file)."""
    write_text_atomic(path, json.dumps(payload, indent=2, default=lambda o: asdict(o)
                                       if hasattr(o, "__dataclass_fields__") else str(o)))


def run_parts(cfg: Any, path: Path, parts: Dict[str, Callable[[Any, bool], Dict[str, Any]]],
              progress: bool = True) -> Dict[str, Any]:
    """Run the parts of a bench named in ``cfg.parts`` in order and return the payload written to ``path``.

    Parts of an earlier run in the same file that this run does not redo are kept, so a one-hour quality part and a
    ten-minute speed part can be measured (and re-measured) separately; each part carries the machine and the
    configuration it was measured with. The file is rewritten after every part, so a finished part survives a later one
    being interrupted, and the other parts are read again under a lock just before, so a part another process wrote
    meanwhile (a learning-curve run beside a quality sweep) is kept, not overwritten with what the file held at start.
    A part's own rows are merged with the earlier ones by the part itself, read at its end."""
    if path.is_file():
        read_json(path)  # a file that is not JSON stops the bench now, naming it, not after an hour of training
    payload: Dict[str, Any] = {"config": asdict(cfg), "machine": machine()}
    mine: List[str] = []
    for name, fn in parts.items():
        if name in cfg.parts:
            result = {**fn(cfg, progress), "machine": machine(), "config": asdict(cfg)}
            payload[name] = json.loads(json.dumps(result, default=str))  # exactly as it reads back from the file
            mine.append(name)
            with locked(path):
                # every other part as the file holds it now: another process may have written one during this part
                old = read_json(path) if path.is_file() else {}
                payload.update({n: _with_machine(old, n) for n in parts if n in old and n not in mine})
                write_json(path, payload)
    if not mine and path.is_file():
        old = read_json(path)
        payload.update({n: _with_machine(old, n) for n in parts if n in old})
    return payload


def _with_machine(old: Dict[str, Any], name: str) -> Dict[str, Any]:
    """Part ``name`` of an earlier file, carrying the machine it was measured on: a part written before parts
    recorded their own takes the file's (which this run's machine is about to replace)."""
    part = old[name]
    if isinstance(part, dict) and "machine" not in part and "machine" in old:
        return {**part, "machine": old["machine"]}
    return part


def record_part(path: Path, name: str, cfg: Any, update: Callable[[Dict[str, Any]], Dict[str, Any]]) -> None:
    """Write part ``name`` of the bench file at ``path`` now, in the middle of the part: ``update(part)`` builds it
    under the file's lock from the part as the file holds it (so it can merge what another process recorded
    meanwhile), the other parts stay as they are. A part made of many runs records each one as it finishes, so a
    process stopped between runs, or a machine given back with its run folders, loses no finished run; ``run_parts``
    still writes the whole part at its end."""
    config = asdict(cfg) if is_dataclass(cfg) else dict(vars(cfg))
    with locked(path):
        payload = read_json(path) if path.is_file() else {"config": config, "machine": machine()}
        part = update(payload.get(name, {}))
        payload[name] = json.loads(json.dumps({**part, "machine": machine(), "config": config}, default=str))
        write_json(path, payload)


def resume_point(out: Path, train_cfg: Any) -> bool:
    """Prepare a quality bench's training run in ``out`` to continue an interrupted bench, and say whether it was
    already trained to the end (then it is only evaluated again). A run there made with other training settings
    (steps, batch, learning rate, seed…) is not continued: ``train_cfg.resume`` is switched off and it starts over."""
    from ...checkpoint import checkpoint_step, read_config, resolve_checkpoint

    try:
        ck = resolve_checkpoint(out)
        saved = read_config(ck).get("train", {})
        step = checkpoint_step(ck)
    except (FileNotFoundError, ValueError, KeyError):
        train_cfg.resume = False
        return False
    keys = ("steps", "batch_size", "lr", "min_lr", "warmup", "weight_decay", "seed", "sam_rho", "ema", "init_from")
    train_cfg.resume = all(saved.get(k) == getattr(train_cfg, k) for k in keys)
    return train_cfg.resume and step >= train_cfg.steps


@contextlib.contextmanager
def training_claim(out: Path, wait: bool = False) -> Iterator[bool]:
    """Claim a bench's run folder for training it (:func:`claimed`): False, with a warning, when
    another process is training that run now — two processes given the same rate of a sweep would otherwise both
    train it into one folder. The caller skips the run; the bench run again once the other has finished reads its
    result back. ``wait`` (a run the rest of the bench needs, such as a distillation's teacher): say so and wait
    for the other process, then continue — the run is then finished, and only read back."""
    with claimed(out) as mine:
        if mine:
            yield True
            return
    if not wait:
        warnings.warn(f"{out}: another process is training this run now; skipped here (run the bench again once it "
                      f"has finished to read its result)", stacklevel=3)
        yield False
        return
    warnings.warn(f"{out}: another process is training this run now; waiting for it to finish", stacklevel=3)
    with claimed(out, wait=True):
        yield True


_PER_SAMPLE_RATES = ("img_s", "line_s", "seq_s", "ex_s")  # logged rates whose unit is one batch element


def training_minutes(out: Path, started: float, resumed_finished: bool, history: List[Dict[str, Any]],
                     batch: int, units_per_step: Optional[float] = None) -> Optional[float]:
    """Minutes a bench's training run trained, over every invocation of it: the seconds its history logs
    (``train_s``, evaluation excluded), so that a run interrupted and resumed counts its earlier part too. A run
    that an interrupted bench had already finished is only evaluated again (``resumed_finished``): its time is then
    the one recorded in ``out/train_time.json``; a run older than the logged seconds takes this process's time, or,
    finished, an estimate from the throughput in its history: steps × ``units_per_step`` ÷ the logged rate, where
    ``units_per_step`` (in the rate's unit: tokens, pixels …) defaults to ``batch`` only for a rate per sample
    (images, lines, sequences) — else None, never a figure in the wrong unit."""
    record = Path(out) / "train_time.json"
    if resumed_finished and record.is_file():
        return read_json(record)["minutes"]
    logged = next((r["train_s"] for r in reversed(history) if "train_s" in r), None)
    if not resumed_finished:
        minutes = logged / 60 if logged else (time.perf_counter() - started) / 60
        write_json(record, {"minutes": minutes})
        return minutes
    if logged:
        return logged / 60
    seconds, last = 0.0, 0
    for rec in history:
        key = next((k for k, v in rec.items() if k.endswith("_s") and v), None)
        if key is None or "loss" not in rec:
            continue
        per_step = units_per_step if units_per_step is not None else batch if key in _PER_SAMPLE_RATES else None
        if per_step is None:
            return None
        seconds += (rec["step"] - last) * per_step / rec[key]
        last = rec["step"]
    return seconds / 60 if seconds else None


def training_curve(history: List[Dict[str, Any]], points: int = 16) -> List[List[float]]:
    """[step, training loss] at up to ``points`` of the steps a run logged, evenly spread, its first and last
    included: how its loss fell, small enough to keep in a bench row — two models that end apart may have been
    apart from the start or may be drifting apart, and only the curve tells which."""
    logged = [(r["step"], r["loss"]) for r in history if "loss" in r]
    if len(logged) > points:
        logged = [logged[round(i * (len(logged) - 1) / (points - 1))] for i in range(points)]
    return [[step, round(float(loss), 4)] for step, loss in logged]


def parse_variant(spec: str) -> Tuple[str, Dict[str, Any]]:
    """``"tiny-tsvipom+spatial_position=rope+sel_heads=1"`` → ("tiny-tsvipom", {"spatial_position": "rope",
    "sel_heads": 1}): a preset and overrides of its config, each value converted to the type of the field by the
    converter of ``polymixer train``'s ``--set`` (:func:`polymixer.experiments.tasks.common.convert_field`: an
    untyped field takes an int when the value is one; "none" / "scene" is None where the field allows it)."""
    from ...models import model_config
    from ..tasks.common import convert_field

    preset, *parts = spec.split("+")
    config = type(model_config(preset))
    overrides: Dict[str, Any] = {}
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq:
            raise ValueError(f"variant {spec!r}: {part!r} is not field=value with a field of {preset}'s config")
        try:
            overrides[key] = convert_field(config, key, value)
        except ValueError as e:
            raise ValueError(f"variant {spec!r}: {e}") from None
    return preset, overrides


def variant_model(spec: str, **defaults: Any) -> Any:
    """The model a variant names: its preset with ``defaults`` (e.g. a bench's toy sizes) under the variant's own
    overrides — what every family's speed part builds, so a compared form is timed as itself."""
    from ...models import create_model

    preset, overrides = parse_variant(spec)
    return create_model(preset, **{**defaults, **overrides})


def variant_slug(spec: str) -> str:
    """A variant's folder name: ``"tiny-vpom+value_heads=1"`` → ``"tiny-vpom_value_heads-1"``."""
    return spec.replace("+", "_").replace("=", "-")


def describe_variant(spec: str, names: Dict[str, str]) -> str:
    """A variant's display name: the preset's (from ``names``) and its overrides in brackets."""
    preset, overrides = parse_variant(spec)
    extra = ", ".join(f"{k}={'whole scene' if v is None else v}" for k, v in overrides.items())
    return names.get(preset, preset) + (f" ({extra})" if extra else "")


# ----------------------------------------------------------------------------------------------------------------
# learning-rate sweeps: every model of a quality comparison at its own best rate
# ----------------------------------------------------------------------------------------------------------------

LR_FACTORS = (0.5, 1.0, 2.0)  # a sweep's rates: ×2 around a family's recipe rate


def lr_grid(base: float, factors: Sequence[float] = LR_FACTORS) -> Tuple[float, ...]:
    """The rates of a sweep around ``base`` (3 significant digits, ascending)."""
    return tuple(sorted({float(f"{base * f:.3g}") for f in factors}))


def same_rate(a: float, b: float) -> bool:
    """Whether two learning rates are the same rate (as read back from JSON or computed from a grid)."""
    return math.isclose(a, b, rel_tol=1e-6)


BRACKET = 2  # rates a sweep adds past the end of the rates tried, where a model is best at that end
ACCURACY_CEILING = 0.999  # recall: no other rate can gain a point at this accuracy, so its sweep is not bracketed


def round_rate(x: float) -> float:
    """A computed rate as a person would write it: one significant digit where that moves it by at most 15 %
    (3.33e-2 → 3e-2), else two (1.6e-2 stays)."""
    one = float(f"{x:.1g}")
    return one if abs(one / x - 1) <= 0.15 else float(f"{x:.2g}")


def rate_beyond(rates: Sequence[float], best: float, ladder: Sequence[float] = ()) -> Optional[float]:
    """The rate one step past the end of ``rates`` where the best rate ``best`` lies at that end — the sweep has
    then not shown it to be the model's best, a rate beyond may do better — else None (``best`` inside the rates
    tried, or fewer than 2 rates). The step: the next rate of the sweep's grid ``ladder`` past that end where it
    has one (a grid of uneven steps, 0.3× 1× 3× 10×, goes on to its own next rate), else the ratio of the two
    rates at that end."""
    tried: List[float] = []
    for r in sorted(rates):
        if not any(same_rate(r, t) for t in tried):
            tried.append(r)
    if len(tried) < 2:
        return None
    if same_rate(best, tried[-1]):
        up = [g for g in ladder if g > tried[-1] and not same_rate(g, tried[-1])]
        return min(up) if up else round_rate(tried[-1] * tried[-1] / tried[-2])
    if same_rate(best, tried[0]):
        down = [g for g in ladder if g < tried[0] and not same_rate(g, tried[0])]
        return max(down) if down else round_rate(tried[0] * tried[0] / tried[1])
    return None


def beyond(rows: Sequence[Dict[str, Any]], row: Optional[Dict[str, Any]], key: str, same: Sequence[str] = (),
           score: Optional[str] = None, ceiling: Optional[float] = None, grid: Sequence[float] = (),
           ladder: Sequence[float] = ()) -> Optional[float]:
    """The rate one grid step past the end of the rates ``row``'s model (``row[key]``; the rows agreeing on the
    fields ``same``: its task, budget) was tried at, where ``row``'s rate — the one chosen for it — lies at that
    end: a rate beyond may do better (:func:`rate_beyond`, the next rate of ``grid`` or ``ladder`` past the end
    where there is one). None where the chosen rate lies inside, where its ``score`` has reached ``ceiling`` (no
    rate can beat it), and while a rate of ``grid`` has no row yet (another process is training it); ``ladder``:
    the sweep's grid, for a reader that waits on no process (a report)."""
    if row is None or not isinstance(row.get("lr"), (int, float)):
        return None
    if ceiling is not None and isinstance(row.get(score), (int, float)) and row[score] >= ceiling:
        return None
    tried = [r["lr"] for r in rows if r.get(key) == row.get(key) and isinstance(r.get("lr"), (int, float))
             and all(r.get(k) == row.get(k) for k in same)]
    if not all(any(same_rate(g, x) for x in tried) for g in grid):
        return None
    return rate_beyond(tried, row["lr"], tuple(grid) + tuple(ladder))


def earlier_part(path: Path, part: str = "quality") -> Dict[str, Any]:
    """``part`` of an earlier bench JSON at ``path`` (empty if the file is not there)."""
    return read_json(path).get(part, {}) if path.is_file() else {}


def check_seed(path: Path, seed: int, parts: Sequence[str]) -> None:
    """Refuse to train ``parts`` with ``seed`` where the bench JSON at ``path`` holds runs of another seed: a run
    folder of the other seed would be overwritten and its rows replaced by this seed's (one ``--out`` per seed)."""
    for part in parts:
        old = earlier_part(path, part).get("config", {}).get("seed")
        if old is not None and old != seed:
            raise ValueError(f"{path} holds the {part} part of seed {old}, not {seed}: give seed {seed} its own --out")


def check_recipe(path: Path, parts: Sequence[str], name: str, value: Any, unrecorded: Any, flag: str) -> None:
    """Refuse to train ``parts`` with the configuration field ``name`` = ``value`` where the bench JSON at ``path``
    holds runs made with another value (``unrecorded``: the value of runs that recorded none): their rows would be
    merged with this run's as if comparable (one ``--out`` per value of ``flag``)."""
    for part in parts:
        earlier = earlier_part(path, part)
        old = earlier.get("config", {}).get(name, unrecorded) if earlier else value
        if old != value:
            raise ValueError(f"{path} holds the {part} part made with {flag} {old}, not {value}: give these runs "
                             f"their own --out")


def read_json(path: Path) -> Any:
    """A bench's JSON; a file that is not JSON is an error naming it."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def payload_seed(data: Dict[str, Any], part: str = "quality") -> Optional[int]:
    """The seed a bench JSON was run with: its ``part``'s configuration's, else the top-level one's (None where
    neither names one)."""
    seed = (data.get(part, {}).get("config") or data.get("config") or {}).get("seed")
    return None if seed is None else int(seed)


def seed_payloads(out: Path, bench: str, part: str = "quality") -> List[Dict[str, Any]]:
    """The bench JSONs of the other seeds beside ``out/<bench>.json`` (``out/<bench>_seed<N>/<bench>.json``, written
    by ``polymixer bench <bench> --seed N --out out/<bench>_seed<N>``), in seed order. A file that is not JSON, or
    whose ``part`` names no seed (its runs could not count as another seed), is an error naming it."""
    found = []
    for path in sorted(out.glob(f"{bench}_seed*/{bench}.json")):
        data = read_json(path)
        seed = payload_seed(data, part)
        if seed is None:
            raise ValueError(f"{path}: its configuration names no seed, so its runs cannot count as another seed")
        found.append((seed, data))
    return [data for _, data in sorted(found, key=lambda x: x[0])]


def write_report(out: Path, bench: str, payload: Dict[str, Any], plot: Callable[[Dict[str, Any], Path], None],
                 report: Callable[..., str]) -> str:
    """Write ``out/<bench>.png`` and ``out/<bench>.txt`` from ``payload`` and the seed folders beside it (the
    bench's ``plot`` and ``report(payload, seeds)``); in a seed folder the verdicts are judged on the main JSON and
    all seed folders (``report(payload, seeds, main)``). Return the report."""
    plot(payload, out / f"{bench}.png")
    main = main_payload(out, bench)
    text = report(payload, seed_payloads(out if main is None else out.parent, bench), main)
    write_text_atomic(out / f"{bench}.txt", text + "\n")
    return text


def main_payload(out: Path, bench: str) -> Optional[Dict[str, Any]]:
    """The family's main JSON (``out/../<bench>.json``) where ``out`` is one of its seed folders
    (``<bench>_seed<N>``), else None: a seed folder's report judges the family as ``polymixer bench parity`` does."""
    path = out.parent / f"{bench}.json"
    if not re.fullmatch(rf"{re.escape(bench)}_seed\d+", out.name) or not path.is_file():
        return None
    return read_json(path)


def report_again(out: Path, bench: str, plot: Callable[[Dict[str, Any], Path], None],
                 report: Callable[..., str]) -> str:
    """``--report``: train and time nothing, write the bench's text and plot again from ``out/<bench>.json`` (after
    the report code, seed folders or another process's rows changed)."""
    path = out / f"{bench}.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no bench results to report (run a part with --out {out})")
    return write_report(out, bench, read_json(path), plot, report)


def written(paths: Sequence[Path], since: Optional[float] = None) -> List[Path]:
    """The ``paths`` that exist and, with ``since`` (a run's start, ``time.time()``), were written by that run — a
    plot an earlier run left in the folder is not the run's."""
    return [f for f in paths if f.is_file() and (since is None or f.stat().st_mtime >= since)]


def print_written(out: Path, bench: str, since: Optional[float] = None) -> None:
    """Print the report a bench's run wrote (``out/<bench>.txt``) and the files it wrote, without building it again;
    the plot is named only where there is one (a quality-only OCR run draws none) and, with ``since`` (the run's
    start, ``time.time()``), only where this run wrote it — a plot an earlier run left is not named as new."""
    print((out / f"{bench}.txt").read_text(), end="")
    files = [out / f"{bench}.{ext}" for ext in ("json", "txt", "png")]
    print(f"\nwrote {', '.join(str(f) for f in written(files, since))}")


@dataclass(frozen=True)
class FamilyBench:
    """What a family's bench declares — its parts, plot and report, the config field naming its quality models, the
    parts whose runs belong to one seed, and the recipe fields that need their own folder. :func:`run_bench`,
    :func:`bench_main` and :func:`add_sweep_arguments` do the rest alike for every family (the seed and recipe
    checks, resumable parts, the report and plot, ``--report``, the sweep flags), so a rule is written once."""

    name: str  # <out>/<name>.json, .txt, .png
    parts: Dict[str, Callable[[Any, bool], Dict[str, Any]]]
    plot: Callable[[Dict[str, Any], Path], None]
    report: Callable[..., str]
    models: Tuple[str, ...] = ("quality_presets",)  # config fields naming models (variants checked before any part)
    trained: Tuple[str, ...] = ("quality",)  # parts whose runs belong to one seed: one --out per seed
    recipes: Tuple[Tuple[str, Any, str], ...] = ()  # (config field, its value in files that record none, flag)


def run_bench(bench: FamilyBench, cfg: Any, progress: bool = True) -> Dict[str, Any]:
    """Run the parts ``cfg.parts`` names, keeping the other parts of an earlier run in the same folder: refuse a
    folder holding another seed's or another recipe's runs, run the parts (:func:`run_parts`), write the report and
    the plot the guide quotes."""
    out = Path(cfg.out)
    path = out / f"{bench.name}.json"
    trained = [p for p in bench.trained if p in cfg.parts]
    check_seed(path, cfg.seed, trained)
    for name, unrecorded, flag in bench.recipes:
        check_recipe(path, trained, name, getattr(cfg, name), unrecorded, flag)
    payload = run_parts(cfg, path, bench.parts, progress)
    write_report(out, bench.name, payload, bench.plot, bench.report)
    return payload


def bench_main(bench: FamilyBench, args: Any, cfg: Any, quick: Optional[Dict[str, Any]],
               fields: Dict[str, str]) -> int:
    """A family bench's command: ``--report`` writes the report again and trains nothing; otherwise ``cfg`` with
    ``--quick`` and the options given (:func:`apply_overrides`), every model name checked before the first part
    starts (not an hour later), the parts run and the report printed."""
    if args.report:
        print(report_again(Path(args.out), bench.name, bench.plot, bench.report))
        return 0
    apply_overrides(cfg, quick if args.quick else None, args, {**fields, **{k: k for k in SWEEP_FIELDS}})
    for field_name in bench.models:
        for spec in getattr(cfg, field_name):
            parse_variant(spec)
    started = time.time()
    run_bench(bench, cfg)
    print_written(Path(cfg.out), bench.name, since=started)
    return 0


# the options add_sweep_arguments adds, as config fields
SWEEP_FIELDS = ("sweep", "lr_factors", "lrs", "seed", "bracket")


def add_sweep_arguments(p: Any, bench: str, recipe_lr: float, factors: Sequence[float], out: str,
                        models: str = "presets", sweep_note: str = "", lrs_note: str = "", seed_note: str = "") -> None:
    """The options every family's quality sweep takes: ``--sweep``, ``--lr-factors``, ``--lrs``, ``--seed``,
    ``--report`` and ``--out`` (default ``out``)."""
    p.add_argument("--sweep", nargs="*", default=None,
                   help=f"{models} trained at every rate of the grid (default: all; none: the recipe's rate only)"
                        + (f"; {sweep_note}" if sweep_note else ""))
    p.add_argument("--lr-factors", type=float_in(Range(0, low_open=True)), nargs="+", default=None,
                   help=f"the grid: the recipe's rate ({recipe_lr:g}) times these (default: "
                        f"{' '.join(map(str, factors))})")
    p.add_argument("--lrs", type=float_in(Range(0, low_open=True)), nargs="+", default=None,
                   help="run only these rates of the grid (to share a sweep among processes)"
                        + (f"; {lrs_note}" if lrs_note else ""))
    add_bracket_argument(p)
    p.add_argument("--seed", type=int_at_least(0), default=None,
                   help=f"seed of the quality runs (their init and batches); one --out per seed, e.g. --out "
                        f"docs/bench/{bench}_seed1, which `polymixer bench parity` reads"
                        + (f"; {seed_note}" if seed_note else ""))
    add_report_argument(p, bench)
    p.add_argument("--out", default=out)


def add_bracket_argument(p: Any) -> None:
    """``--bracket N``: how many rates past the end of the rates tried a sweep adds for a model best at that end."""
    p.add_argument("--bracket", type=int_at_least(0), default=None,
                   help=f"a swept model best at the highest (lowest) rate tried is trained one grid step higher "
                        f"(lower), again while it stays best at the end, up to this many rates (default {BRACKET}; "
                        f"0: the grid only); a share of a sweep (--lrs) and another seed's run (--seed) add none")


def add_report_argument(p: Any, bench: str, seed_folders: bool = True) -> None:
    """The ``--report`` flag of every family's bench (``seed_folders``: whether its report reads seed folders too)."""
    source = f"--out's {bench}.json" + (" and its seed folders" if seed_folders else "")
    p.add_argument("--report", action="store_true",
                   help=f"train nothing: write {bench}.txt and its pictures again from {source}")


def earlier_rows(path: Path, recipe_lr: float, part: str = "quality") -> List[Dict[str, Any]]:
    """The rows of ``part`` in an earlier bench JSON at ``path`` (none if it is not there); rows of runs made before
    sweeps existed carry no rate and get the recipe's."""
    rows = earlier_part(path, part).get("rows", [])
    for r in rows:
        r.setdefault("lr", recipe_lr)
    return rows


def merge_rows(earlier: Sequence[Dict[str, Any]], rows: List[Dict[str, Any]], keys: Sequence[str]
               ) -> List[Dict[str, Any]]:
    """``rows`` and the ``earlier`` rows of the runs they do not redo (same ``keys`` and the same rate), so that
    processes sharing a sweep keep each other's rows."""
    def redone(e: Dict[str, Any]) -> bool:
        return any(all(r[k] == e[k] for k in keys) and same_rate(r["lr"], e["lr"]) for r in rows)
    return [e for e in earlier if not redone(e)] + rows


def rates_tried(rows: Sequence[Dict[str, Any]], base: float, factors: Sequence[float] = LR_FACTORS) -> List[float]:
    """The sweep's grid as reported: this run's grid and every rate an earlier process tried (``--lr-factors`` may
    have reached beyond it, e.g. a ×4 point for a model best at the grid's top)."""
    rates = list(lr_grid(base, factors))
    for r in rows:
        if "lr" in r and not any(same_rate(r["lr"], x) for x in rates):
            rates.append(float(r["lr"]))
    return sorted(rates)


def check_rates(lrs: Sequence[float], grid: Sequence[float]) -> None:
    """``--lrs`` must name rates of the ``grid``: a rate off it would train nothing and look like a finished share."""
    off = [x for x in lrs if not any(same_rate(x, g) for g in grid)]
    if off:
        raise ValueError(f"--lrs {' '.join(f'{x:g}' for x in off)}: not a rate of the grid "
                         f"({', '.join(f'{g:g}' for g in grid)}); widen it with --lr-factors "
                         f"(e.g. 0.5 1 2 4 adds 4× the recipe's rate)")


def only_rates(plan: Sequence[Tuple[str, float]], lrs: Sequence[float],
               grid: Sequence[float]) -> List[Tuple[str, float]]:
    """The runs of ``plan`` at one of the rates ``lrs`` (``--lrs``: one process's share of a sweep); all if none.
    A rate of ``lrs`` off the ``grid``, or rates that select none of the planned runs, is an error: it would train
    nothing and look like a finished share."""
    if not lrs:
        return list(plan)
    check_rates(lrs, grid)
    mine = [(m, lr) for m, lr in plan if any(same_rate(lr, x) for x in lrs)]
    if plan and not mine:
        runs = ", ".join(f"{m} at {lr:g}" for m, lr in plan)
        raise ValueError(f"--lrs {' '.join(f'{x:g}' for x in lrs)}: none of the planned runs is at these rates "
                         f"({runs}); a model outside --sweep trains at its recipe's rate only")
    return mine


def sweep_folder(root: Path, slug: str, lr: float, base: float) -> Path:
    """A sweep run's folder: ``root/slug`` at the recipe rate ``base`` (the folder of the runs made before sweeps
    existed, so they are reused), ``root/slug-lr<rate>`` at the others."""
    return root / slug if same_rate(lr, base) else root / f"{slug}-lr{lr:g}"


def sweep_plan(models: Sequence[str], swept: Sequence[str], base: float,
               factors: Sequence[float] = LR_FACTORS) -> List[Tuple[str, float]]:
    """(model, rate) of every run: the ``swept`` models at every rate of the grid, the others at ``base``."""
    grid = lr_grid(base, factors)
    return [(m, lr) for m in models for lr in (grid if m in swept else (base,))]


@dataclass(frozen=True)
class SweepRun:
    """One training run of a family's quality sweep: a model (a preset, or a variant ``preset+field=value…``), the
    config fields it overrides (the variant's over the bench's own), its rate and its folder."""

    spec: str
    preset: str
    overrides: Dict[str, Any]
    slug: str
    lr: float
    out: Path
    source: str  # where the rate comes from: "sweep", "recipe" or "best <run>"


def sweep_runs(plan: Sequence[Tuple[str, float]], root: Path, base: float, model_overrides: Dict[str, Any],
               lrs: Sequence[float] = (), factors: Sequence[float] = LR_FACTORS, prefix: str = "", suffix: str = "",
               sources: Optional[Dict[str, str]] = None) -> List[SweepRun]:
    """The runs of ``plan`` ((spec, rate) pairs: :func:`sweep_plan`, or each spec at a rate chosen earlier) that this
    process trains (``lrs``: its share of the grid, :func:`only_rates`), each with its folder under ``root``
    (``<prefix><slug><suffix>``, the rate appended off the recipe's ``base``: :func:`sweep_folder`) and its
    variant's overrides parsed — the one place every family's bench turns a model name into a run, so a variant
    (an option such as ``+attention_shift=4``) is accepted by every family alike."""
    runs = []
    for spec, lr in only_rates(plan, lrs, lr_grid(base, factors)):
        preset, overrides = parse_variant(spec)
        slug = variant_slug(spec)
        runs.append(SweepRun(spec, preset, {**model_overrides, **overrides}, slug, lr,
                             sweep_folder(root, f"{prefix}{slug}{suffix}", lr, base),
                             (sources or {}).get(spec, "recipe")))
    return runs


@dataclass(frozen=True)
class Stage:
    """One stage of a family's quality sweep (the family's only stage, or one per task / objective): its models run
    at every rate of the grid where ``cfg.sweep`` names them, else at the recipe's rate — or, where ``rates`` is
    given, each at the rate it picks from the runs known so far (a later stage reusing an earlier one's best rates;
    ``rates_label(model)`` says where that rate came from). Such a stage brackets a model only where ``past`` is
    given: ``past(model, rows)`` is the one rate it adds (None: none; e.g. where the rate it was given came from a
    pick at an edge of another model's grid)."""

    models: Tuple[str, ...]
    name: str = ""  # the task / objective, for the family's hooks
    prefix: str = ""  # run folders: <prefix><slug><suffix>
    suffix: str = ""
    rates: Optional[Callable[[List[Dict[str, Any]]], Dict[str, float]]] = None
    rates_label: Callable[[str], str] = str
    past: Optional[Callable[[str, List[Dict[str, Any]]], Optional[float]]] = None


@dataclass(frozen=True)
class QualitySweep:
    """What a family's quality part declares — its file, what names one run in a row besides its rate, its recipe
    (``recipe(cfg, job, stage) -> TrainConfig``), how one run is trained and scored (``evaluate(cfg, job, stage,
    train_cfg) -> (result, row)``: the result's ``history`` gives the resumed runs' minutes) and how the rows are
    ordered and each model's best rate marked (``select(rows, cfg)``, on the validation figure). :meth:`run` does
    the rest alike for every family: the plan (sweep or earlier stage's best rates), resuming finished and
    interrupted runs, the training minutes, the earlier file's rows not redone, the grid reported."""

    bench: str
    recipe_lr: float  # the rate of rows from before sweeps
    keys: Tuple[str, ...]  # with the rate, what names one run (rows of another process sharing the sweep are kept)
    recipe: Callable[[Any, "SweepRun", Stage], Any]
    evaluate: Callable[[Any, "SweepRun", Stage, Any], Tuple[Dict[str, Any], Dict[str, Any]]]
    select: Callable[[List[Dict[str, Any]], Any], List[Dict[str, Any]]]
    selected_by: Callable[[List[Dict[str, Any]]], str]
    base: str = "lr"  # the config field holding the recipe's rate
    model: str = "model"  # the row field naming the model (its spec: the preset or variant swept)
    stage_key: Optional[str] = None  # the row field holding the stage's name (task, objective), where there are several
    earlier_defaults: Callable[[Dict[str, Any]], Dict[str, Any]] = lambda r: {}

    def known(self, cfg: Any, rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """This process's rows and those of the earlier ``<out>/<bench>.json`` it does not redo — read each time,
        since a process sharing the sweep may have finished its runs in the meantime."""
        earlier = earlier_rows(Path(cfg.out) / f"{self.bench}.json", self.recipe_lr)
        for r in earlier:
            for k, v in self.earlier_defaults(r).items():
                r.setdefault(k, v)
        return merge_rows(earlier, rows, self.keys)

    def run(self, cfg: Any, stages: Sequence[Stage]) -> Dict[str, Any]:
        """Train and score every stage's runs in order, one model after another, each swept model bracketed
        (:func:`sweep_model`); the rows (this process's and the earlier file's, selected), the grid of rates tried
        and the figure rates were chosen on."""
        base = getattr(cfg, self.base)
        grid = lr_grid(base, cfg.lr_factors)
        rows: List[Dict[str, Any]] = []
        for stage in stages:
            if stage.rates is None:
                plan = sweep_plan(stage.models, cfg.sweep, base, cfg.lr_factors)
                source = {m: "sweep" if m in cfg.sweep else "recipe" for m in stage.models}
            else:
                best = stage.rates(self.select(self.known(cfg, rows), cfg))
                plan = [(m, best.get(m, base)) for m in stage.models]
                source = {m: stage.rates_label(m) if m in best else "recipe" for m in stage.models}
            plan = only_rates(plan, cfg.lrs, grid)  # this process's share (an error where it names none)
            brackets = stage.rates is None and not cfg.lrs and not cfg.seed  # (never in another seed's folder)
            for spec in stage.models:  # (the closures below run within the iteration that makes them)
                rates = [lr for m, lr in plan if m == spec]

                def train(lr: float) -> None:
                    job, = sweep_runs([(spec, lr)], Path(cfg.out) / "quality", base,
                                      getattr(cfg, "model_overrides", {}), (), cfg.lr_factors, prefix=stage.prefix,
                                      suffix=stage.suffix, sources={spec: source[spec] if any(
                                          same_rate(lr, x) for x in rates) else "bracket"})
                    self._train(cfg, job, stage, rows)

                if stage.rates is None:
                    sweep_model(rates, train, lambda: self.past(cfg, stage, spec, rows),
                                cfg.bracket if brackets and spec in cfg.sweep else 0)
                else:  # at most one rate past the one it was given, and only where the stage names it
                    given = stage.past is not None and not cfg.lrs and not cfg.seed
                    sweep_model(rates, train, lambda: stage.past(spec, self.select(self.known(cfg, rows), cfg)),
                                min(1, cfg.bracket) if given else 0)
        return self.summary(cfg, rows)

    def summary(self, cfg: Any, rows: List[Dict[str, Any]]) -> Dict[str, Any]:
        """The part as it stands: this process's rows and the earlier file's not redone, selected; the grid of rates
        tried; the figure rates were chosen on."""
        rows = self.select(self.known(cfg, rows), cfg)
        return {"rows": rows, "grid": rates_tried(rows, getattr(cfg, self.base), cfg.lr_factors),
                "selected_by": self.selected_by(rows)}

    def _train(self, cfg: Any, job: SweepRun, stage: Stage, rows: List[Dict[str, Any]]) -> None:
        """Train and score one run (resumed, or only scored where it finished) unless another process holds it;
        its row appended to ``rows``."""
        tcfg = self.recipe(cfg, job, stage)
        kept = self.on_file(cfg, job, stage, tcfg)
        if kept is not None:
            rows.append(kept)
            return
        with training_claim(job.out) as mine:
            if not mine:
                return
            finished = resume_point(job.out, tcfg)  # a run trained to the end (here or copied in): scored
            t0 = time.perf_counter()
            res, row = self.evaluate(cfg, job, stage, tcfg)
            history = res.get("history", [])
            minutes = training_minutes(job.out, t0, finished, history, tcfg.batch_size)
        rows.append({**row, "lr": job.lr, "lr_from": job.source, "train_min": minutes,
                     "train_curve": training_curve(history)})
        record_part(Path(cfg.out) / f"{self.bench}.json", "quality", cfg,  # on file at once, the family's other
                    lambda part: {**part, **self.summary(cfg, rows)})  # fields of the part as the file has them

    def on_file(self, cfg: Any, job: SweepRun, stage: Stage, tcfg: Any) -> Optional[Dict[str, Any]]:
        """The earlier file's row of this run where its folder is gone (a fresh checkout of committed bench JSON,
        or run folders deleted to free disk): the recorded result stands and is not trained again — remove the row
        to retrain it. A row of another length of training (its ``steps``) does not count; a folder that is there
        is resumed or scored as usual."""
        if Path(job.out).exists():
            return None
        for r in self.known(cfg, []):  # the earlier file's rows, as the sweep reads them
            if (r.get(self.model) == job.spec and same_rate(r["lr"], job.lr)
                    and (self.stage_key is None or r.get(self.stage_key) == stage.name)
                    and r.get("steps", tcfg.steps) == tcfg.steps):
                print(f"{job.spec} at lr {job.lr:g}: kept from {cfg.out}/{self.bench}.json (its run folder is gone)")
                return r
        return None

    def past(self, cfg: Any, stage: Stage, spec: str, rows: List[Dict[str, Any]]) -> Optional[float]:
        """The rate the bracket adds for ``spec`` in ``stage``: one grid step past the highest or lowest rate it
        was tried at, by any process, where it is best there on the selection figure (:func:`beyond`); None while
        a rate inside is best, or while a rate of the grid has no row yet (another process is training it)."""
        mine = [r for r in self.select(self.known(cfg, rows), cfg) if r.get(self.model) == spec
                and (self.stage_key is None or r.get(self.stage_key) == stage.name)]
        return beyond(mine, next((r for r in mine if r.get("best_lr")), None), self.model,
                      grid=lr_grid(getattr(cfg, self.base), cfg.lr_factors))


def sweep_model(rates: Sequence[float], train: Callable[[float], None], past: Callable[[], Optional[float]],
                bracket: int, best: Callable[[], Optional[float]] = lambda: None,
                then: Callable[[float], None] = lambda lr: None) -> Optional[float]:
    """One model's sweep, the rule every family's bench follows (:class:`QualitySweep`, and the recall bench's
    seeds in one file): ``train`` at each of its ``rates``; then, while it is best at the highest or lowest rate
    tried (``past()``: the rate one grid step beyond, :func:`beyond`; None once a rate inside is best), at that
    rate, up to ``bracket`` rates — so that it is compared at a rate shown to be its best, not at the edge of a
    grid; then ``then`` at its best rate (``best()``, where known): the seeds that train at the chosen rate only.
    Returns that rate (None where ``best()`` knows none)."""
    for lr in rates:
        train(lr)
    for _ in range(max(0, bracket)):
        lr = past()
        if lr is None:
            break
        train(lr)
    chosen = best()
    if chosen is not None:
        then(chosen)
    return chosen


def mark_best(rows: List[Dict[str, Any]], metric: str, higher: bool, key: str = "spec") -> List[Dict[str, Any]]:
    """Mark each model's run at its best rate (``best_lr`` True), chosen by ``metric`` (the selection metric: the
    validation score where the family has a validation split), and give every row the model's number of rates."""
    groups: Dict[Any, List[Dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r[key], []).append(r)
    for runs in groups.values():
        scored = [r for r in runs if isinstance(r.get(metric), (int, float)) and math.isfinite(r[metric])]
        best = (max if higher else min)(scored, key=lambda r: r[metric]) if scored else None
        if best is None and len(runs) == 1:  # one run only (e.g. from before sweeps, without the metric): itself
            best = runs[0]
        for r in runs:
            r["best_lr"] = r is best
            r["rates"] = len(runs)
    return rows


def quality_rows(part: Dict[str, Any], recipe_lr: float) -> List[Dict[str, Any]]:
    """A quality part's rows as the report reads them: those of a file from before sweeps given the recipe's rate
    (``recipe_lr``) and ``lr_from`` "recipe"."""
    return [{"lr": recipe_lr, "lr_from": "recipe", **r} for r in part["rows"]]


def stale_rate_notes(rows: Sequence[Dict[str, Any]], parent: Callable[[Dict[str, Any]], Optional[Dict[str, Any]]],
                     rerun: Callable[[Dict[str, Any]], str], what: Callable[[Dict[str, Any]], str],
                     source: Callable[[Dict[str, Any]], str]) -> List[str]:
    """One note per row trained at another run's best rate that has moved since (a later stage run before the
    earlier stage's sweep grew): ``parent(row)`` is that run at its best now (None: the row takes no other run's
    rate), ``what`` / ``source`` name the two, ``rerun`` the flags that train the row again at the new rate."""
    notes = []
    for r in rows:
        p = parent(r)
        if p is not None and not same_rate(r["lr"], p["lr"]):
            notes.append(f"note: {what(r)} was trained at lr {r['lr']:g}, the best rate of {source(p)} is now "
                         f"{p['lr']:g}: run {rerun(r)} again")
    return notes


def best_rows(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Each model once: its run at its best rate."""
    return [r for r in rows if r.get("best_lr", True)]


def picture_owner(preferred: str, models: Sequence[str], drawn_before: bool) -> Optional[str]:
    """Whose pictures a quality run draws: the family's picture model when this process trains it; else its last
    model, but only where no picture was drawn before — a process running part of a sweep (``--lrs``, one model)
    must not replace the guide's picture with another model's under the same file name."""
    if preferred in models:
        return preferred
    return None if drawn_before or not models else models[-1]


def edge_note(rows: Sequence[Dict[str, Any]], key: str = "spec", name: str = "model", score: Optional[str] = None,
              ceiling: Optional[float] = None, ladder: Sequence[float] = ()) -> str:
    """A line naming each model of a sweep best at the highest or lowest of the rates it was tried at — a rate
    beyond may do better — and that rate (the next of the sweep's grid ``ladder`` where it has one; ``--bracket``
    trains it); none for a ``score`` at its ``ceiling``; "" where every best rate lies inside its rates."""
    groups: Dict[Any, List[Dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r[key], []).append(r)
    ends = []
    for runs in groups.values():
        best = next((r for r in runs if r.get("best_lr")), None)
        past = beyond(runs, best, key, score=score, ceiling=ceiling, ladder=ladder)
        if past is not None:
            ends.append(f"{best.get(name, best[key])} at {best['lr']:g} ({past:g} not run)")
    return ("best at an end of the rates tried (a rate beyond may do better; the sweep's --bracket trains it): "
            + ", ".join(ends)) if ends else ""


def sweep_table(rows: Sequence[Dict[str, Any]], metric: str, label: str, scale: float = 1.0, digits: int = 3,
                key: str = "spec", name: str = "model") -> str:
    """One line per model: every rate's ``metric`` (× ``scale``), the best marked with *, so the reader sees how
    much the choice of rate moved each model."""
    rates = sorted({r["lr"] for r in rows})
    table: Dict[Any, Dict[str, Any]] = {}
    for r in rows:
        line = table.setdefault(r[key], {"model": r.get(name, r[key])})
        v = r.get(metric)
        cell = "—" if not isinstance(v, (int, float)) else f"{v * scale:.{digits}g}"
        line[f"{r['lr']:g}"] = cell + ("*" if r.get("best_lr") and r.get("rates", 1) > 1 else "")
    cols = ["model"] + [f"{lr:g}" for lr in rates]
    return format_table(list(table.values()), cols, [f"{label} at lr →"] + [f"{lr:g}" for lr in rates])
