"""``polymixer bench faults``: fault injection into real training processes of every family.

For each family, a tiny preset is trained by its own ``polymixer train`` command in a subprocess, once uninterrupted
(the reference) and then under faults:

- **SIGKILL** at ``kills`` random moments, each followed by the same command (resume). The moments are random steps
  plus a random delay within the step, and ``write_kills`` of them land while a checkpoint is being written: the
  process is held just after writing ``model.safetensors`` into the temporary folder, and killed there.
- **SIGTERM** once, at a random step: the process must finish the step, checkpoint and exit with status 75.
- **a truncated newest checkpoint**: a run stopped with ``--stop-after``, its newest ``model.safetensors`` cut in
  half, then resumed. It must fall back to the previous checkpoint.
- **a NaN loss** injected at one step. That step must be skipped (the checkpoints before and after it hold the same
  weights, EMA and optimizer state), and the run, stopped just before and just after it and resumed, must end like
  the same injection done uninterrupted.

For every row the table gives the faults injected and survived, the steps lost (steps executed beyond the run's
length, counting a step in flight when killed), and whether the final weights (EMA and optimizer state included)
are bit-identical to the uninterrupted run. The NaN row is compared with an uninterrupted run that has the same
injection, since its skipped step makes it differ from the plain reference by design. Outputs: ``faults.txt``,
``faults.json`` and ``faults.png`` (progress against wall time, one panel per family, with the kills marked).

The injection uses a wrapper process (``python -m polymixer.experiments.bench.faults SPEC -- <train args>``). It
records the
step in flight in ``<run>/.bench-progress``, multiplies the loss by NaN at the chosen step, and holds a checkpoint
write when asked. Training itself is the unmodified command.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..commands import run_family_command
from ..registry import lab_family, trainable
from ..report import format_table, new_figure, save_figure
from .common import apply_overrides, machine, read_json, write_json
from ..tasks.common import int_at_least

__all__ = ["FaultsBenchConfig", "train_args", "run", "report", "plot", "main", "add_arguments"]


def train_args(family: str) -> List[str]:
    """``polymixer train`` arguments of a family's fault runs: its noun, its tiny preset and its recipe's arguments
    (:class:`~polymixer.experiments.registry.FaultRecipe`: sizes a run of a few dozen steps affords)."""
    fam = lab_family(family)
    recipe = fam.faults
    return [fam.name, "--preset", str(fam.family.tiny), *(recipe.args if recipe else ())]


PROGRESS, WRITING = ".bench-progress", ".bench-writing"


@dataclass
class FaultsBenchConfig:
    families: Tuple[str, ...] = field(default_factory=trainable)  # every family that trains
    steps: int = 40
    ckpt_every: int = 4
    kills: int = 10
    write_kills: int = 2  # of the kills, this many while a checkpoint is being written
    seed: int = 0
    threads: int = 1  # OMP_NUM_THREADS of the training processes (results are bit-exact for a fixed count)
    timeout: float = 900.0  # seconds any one training process may take
    extra: Dict[str, List[str]] = field(default_factory=dict)  # family → more train arguments (tests: tiny data)
    out: str = "runs/bench/faults"


QUICK = dict(steps=16, ckpt_every=4, kills=3, write_kills=1)


# ----------------------------------------------------------------------------------------------------------------
# The wrapper process
# ----------------------------------------------------------------------------------------------------------------


class _Probe:
    """The family's task, recording the step in flight and multiplying the loss by NaN at ``nan_step``."""

    def __init__(self, task: Any, out: Path, nan_step: Optional[int]) -> None:
        self._task, self._file, self._nan = task, out / PROGRESS, nan_step
        self._first: Optional[int] = None
        self._step: Optional[int] = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)

    def batch(self, step: int, share: int, shares: int, device: Any) -> Any:
        if step != self._step:
            self._first = step if self._first is None else self._first
            self._step = step
            self._file.write_text(f"{self._first} {step} {time.time()}")
        return self._task.batch(step, share, shares, device)

    def loss(self, model: Any, batch: Any) -> Any:
        loss = self._task.loss(model, batch)
        return loss * float("nan") if self._step == self._nan else loss


def _worker(argv: Sequence[str]) -> None:
    """``SPEC -- polymixer args``: run the polymixer command with the probe around its task and, when the spec says
    ``hold_from``, hold the first checkpoint write of a step ≥ that inside its temporary folder (to be killed)."""
    spec = json.loads(argv[0])
    args = list(argv[2:] if argv[1:2] == ["--"] else argv[1:])
    out = Path(spec["out"])
    from ..train import loop

    real_train = loop.train

    def train(model: Any, task: Any, cfg: Any, model_config: Any, on_log: Any = None) -> Any:
        return real_train(model, _Probe(task, Path(cfg.out), spec.get("nan_step")), cfg, model_config, on_log)

    if args[:1] != ["train"] or len(args) < 2:
        raise SystemExit(f"the fault probe runs `polymixer train <family> …`, got {' '.join(args)!r}")
    # the family's train command runs the loop through its module's global ``train``: wrapped there
    importlib.import_module(lab_family(args[1]).command("train").target.partition(":")[0]).train = train
    if spec.get("hold_from") is not None:
        import safetensors.torch as st

        real_save = st.save_model

        def save_model(model: Any, filename: str, *a: Any, **k: Any) -> Any:
            result = real_save(model, filename, *a, **k)
            folder = Path(filename).parent
            if Path(filename).name == "model.safetensors" and folder.name.startswith(".step_"):
                step = int(folder.name[len(".step_"):].split(".")[0])
                if step >= spec["hold_from"]:
                    (out / WRITING).write_text(str(step))
                    time.sleep(3600)
            return result

        st.save_model = save_model
    sys.exit(run_family_command("train", args[1], args[2:]))


# ----------------------------------------------------------------------------------------------------------------
# The controller
# ----------------------------------------------------------------------------------------------------------------


class _Job:
    """One training process of a run folder: started, watched, signalled, and what it did."""

    def __init__(self, cfg: FaultsBenchConfig, family: str, out: Path, t0: float, *, steps: Optional[int] = None,
                 stop_after: Optional[int] = None, nan_step: Optional[int] = None,
                 hold_from: Optional[int] = None) -> None:
        out.mkdir(parents=True, exist_ok=True)
        for name in (PROGRESS, WRITING):
            (out / name).unlink(missing_ok=True)
        args = ["train", *train_args(family), *cfg.extra.get(family, []), "--steps", str(steps or cfg.steps),
                "--ckpt-every", str(cfg.ckpt_every), "--eval-every", "1000000", "--log-every", "1", "--keep", "3",
                "--seed", str(1337 + cfg.seed), "--out", str(out), "--quiet"]
        if stop_after is not None:
            args += ["--stop-after", str(stop_after)]
        spec = {"out": str(out), "nan_step": nan_step, "hold_from": hold_from}
        env = {**os.environ, "OMP_NUM_THREADS": str(cfg.threads), "PYTHONWARNINGS": "default"}
        self.out, self.t0, self.timeout = out, t0, cfg.timeout
        self.start = time.time()
        cmd = [sys.executable, "-m", "polymixer.experiments.bench.faults", json.dumps(spec), "--", *args]
        self.proc = subprocess.Popen(cmd,
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.signal: Optional[str] = None
        self.stdout = self.stderr = ""

    def progress(self) -> Optional[Tuple[int, int]]:
        """(first step, step in flight) of this process, 0-based; None before its first batch."""
        try:
            first, step, _ = (self.out / PROGRESS).read_text().split()
            return int(first), int(step)
        except (OSError, ValueError):
            return None

    def strike(self, target: int, sig: signal.Signals, rng: random.Random) -> bool:
        """Send ``sig`` at a random moment of the step after (0-based) ``target``: forward, backward, update or
        checkpoint. The delay is drawn within the duration of that step's predecessor, measured here."""
        if not self.wait_for(lambda: (self.progress() or (0, -1))[1] >= target):
            return False
        step, t = (self.progress() or (0, target))[1], time.time()
        if not self.wait_for(lambda: (self.progress() or (0, -1))[1] > step):
            return False
        time.sleep(rng.uniform(0.0, time.time() - t))
        if self.proc.poll() is not None:
            return False
        self.send(sig)
        return True

    def wait_for(self, ready: Any) -> bool:
        """Poll until ``ready()`` or the process ends (False) or times out (killed, False)."""
        deadline = self.start + self.timeout
        while self.proc.poll() is None:
            if ready():
                return True
            if time.time() > deadline:
                self.proc.kill()
                break
            time.sleep(0.005)
        return False

    def send(self, sig: signal.Signals) -> None:
        self.signal = sig.name
        self.proc.send_signal(sig)

    def finish(self) -> Dict[str, Any]:
        try:
            self.stdout, self.stderr = self.proc.communicate(timeout=max(1.0, self.start + self.timeout - time.time()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.stdout, self.stderr = self.proc.communicate()
        p = self.progress()
        return {"t_start": self.start - self.t0, "t_end": time.time() - self.t0, "first": p[0] if p else None,
                "last": p[1] if p else None, "returncode": self.proc.returncode, "signal": self.signal,
                "error": self.stderr.strip().splitlines()[-1] if self.proc.returncode not in (0, 75) and
                self.stderr.strip() else None}


def _newest(out: Path) -> Optional[int]:
    from ...checkpoint import checkpoint_step, resolve_checkpoint

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return checkpoint_step(resolve_checkpoint(out))
        except (FileNotFoundError, ValueError):
            return None


def _state(out: Path, step: Optional[int] = None) -> Dict[str, Any]:
    """Every tensor a checkpoint holds: weights, EMA weights, optimizer state (the newest, or that of ``step``)."""
    import torch
    from safetensors.torch import load_file

    from ...checkpoint import checkpoint_folder, resolve_checkpoint

    ck = checkpoint_folder(out, step) if step is not None else resolve_checkpoint(out)
    tensors: Dict[str, Any] = {f"model.{k}": v for k, v in load_file(str(ck / "model.safetensors")).items()}
    if (ck / "ema.safetensors").is_file():
        tensors.update({f"ema.{k}": v for k, v in load_file(str(ck / "ema.safetensors")).items()})
    opt = torch.load(ck / "trainer.pt", map_location="cpu", weights_only=False)["optimizer"]["state"]
    tensors.update({f"adam.{p}.{n}": t for p, s in opt.items() for n, t in s.items() if torch.is_tensor(t)})
    return tensors


def _identical(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _finite(a: Dict[str, Any]) -> bool:
    import torch

    return all(bool(torch.isfinite(t).all()) for t in a.values() if t.is_floating_point())


def _complete(cfg: FaultsBenchConfig, family: str, out: Path, t0: float, jobs: List[Dict[str, Any]],
              **kw: Any) -> bool:
    """Run the same command to the end (resuming); True when it finished cleanly with a verified last checkpoint."""
    job = _Job(cfg, family, out, t0, **kw)
    jobs.append(job.finish())
    return jobs[-1]["returncode"] == 0 and _newest(out) == kw.get("steps", cfg.steps)


def _steps_lost(jobs: List[Dict[str, Any]], steps: int) -> int:
    """Steps executed beyond the run's length: redone after a kill, the step in flight included."""
    executed = sum(j["last"] - j["first"] + 1 for j in jobs if j["first"] is not None)
    return executed - steps


def _leftovers(out: Path) -> int:
    root = out / "checkpoints"
    return sum(1 for p in root.glob(".*") if ".tmp-" in p.name or ".old-" in p.name) if root.is_dir() else 0


def _kill_row(cfg: FaultsBenchConfig, family: str, base: Path, ref: Dict[str, Any], rng: random.Random,
              t0: float) -> Dict[str, Any]:
    out = base / "sigkill"
    shutil.rmtree(out, ignore_errors=True)
    kills = min(cfg.kills, cfg.steps - 3)
    targets = sorted(rng.sample(range(1, cfg.steps - 2), kills))
    in_write = set(rng.sample(range(kills), min(cfg.write_kills, kills)))
    jobs: List[Dict[str, Any]] = []
    events: List[Dict[str, Any]] = []
    for i, target in enumerate(targets):
        resumed = _newest(out) or 0
        target = max(target, resumed)
        if i in in_write:  # hold the first checkpoint write at or after the target, then kill it there
            hold = min(cfg.steps, (target // cfg.ckpt_every + 1) * cfg.ckpt_every)
            job = _Job(cfg, family, out, t0, hold_from=hold)
            if job.wait_for(lambda: (out / WRITING).is_file()):
                job.send(signal.SIGKILL)
            moment = f"writing checkpoint {hold}"
        else:
            job = _Job(cfg, family, out, t0)
            job.strike(target, signal.SIGKILL, rng)
            moment = None
        rec = job.finish()
        jobs.append(rec)
        injected = rec["signal"] == "SIGKILL"
        events.append({"moment": moment or (f"step {rec['last'] + 1}" if rec["last"] is not None else "start-up"),
                       "resumed_from": resumed, "injected": injected, "checkpoint_after": _newest(out),
                       "leftover_temp": _leftovers(out), "returncode": rec["returncode"]})
        if not injected:
            break
    finished = _complete(cfg, family, out, t0, jobs)
    final = _state(out) if finished else None
    injected = sum(e["injected"] for e in events)
    return {"fault": f"SIGKILL ({len(in_write)} while writing a checkpoint)", "injected": injected,
            "survived": injected if finished else 0, "steps_lost": _steps_lost(jobs, cfg.steps),
            "identical": bool(final is not None and _identical(final, ref)), "leftover_temp": _leftovers(out),
            "events": events, "jobs": jobs}


def _term_row(cfg: FaultsBenchConfig, family: str, base: Path, ref: Dict[str, Any], rng: random.Random,
              t0: float) -> Dict[str, Any]:
    out = base / "sigterm"
    shutil.rmtree(out, ignore_errors=True)
    job = _Job(cfg, family, out, t0)
    job.strike(rng.randrange(1, cfg.steps - 2), signal.SIGTERM, rng)
    rec = job.finish()
    jobs = [rec]
    from ..train.loop import EXIT_PREEMPTED

    # the step in flight finished and was checkpointed: nothing is lost
    clean_stop = rec["returncode"] == EXIT_PREEMPTED and _newest(out) == rec["last"] + 1
    finished = _complete(cfg, family, out, t0, jobs)
    return {"fault": "SIGTERM (preemption)", "injected": int(rec["signal"] == "SIGTERM"),
            "survived": int(clean_stop and finished), "steps_lost": _steps_lost(jobs, cfg.steps),
            "identical": bool(finished and _identical(_state(out), ref)), "stopped_after": rec["last"] + 1,
            "exit_status": rec["returncode"], "jobs": jobs}


def _truncate_row(cfg: FaultsBenchConfig, family: str, base: Path, ref: Dict[str, Any], rng: random.Random,
                  t0: float) -> Dict[str, Any]:
    from ...checkpoint import checkpoint_folder

    out = base / "truncated"
    shutil.rmtree(out, ignore_errors=True)
    stop = max(2, rng.randrange(2, cfg.steps // cfg.ckpt_every)) * cfg.ckpt_every
    jobs = [_Job(cfg, family, out, t0, stop_after=stop).finish()]
    damaged = checkpoint_folder(out, stop)
    f = damaged / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    job = _Job(cfg, family, out, t0)
    jobs.append(job.finish())
    finished = jobs[-1]["returncode"] == 0 and _newest(out) == cfg.steps
    warned = f"skipping checkpoint {damaged.name}" in job.stderr  # said which one it skipped, and why
    resumed = jobs[-1]["first"]
    return {"fault": f"newest checkpoint truncated (step {stop})", "injected": 1,
            "survived": int(finished and warned and resumed == stop - cfg.ckpt_every),
            "steps_lost": _steps_lost(jobs, cfg.steps),
            "identical": bool(finished and _identical(_state(out), ref)), "resumed_from": resumed,
            "warned": warned, "jobs": jobs}


def _nan_row(cfg: FaultsBenchConfig, family: str, base: Path, rng: random.Random, t0: float) -> Dict[str, Any]:
    step = rng.randrange(2, cfg.steps - 1)  # 1-based: the step whose loss becomes NaN
    ref_out, out = base / "nan-uninterrupted", base / "nan"
    for p in (ref_out, out):
        shutil.rmtree(p, ignore_errors=True)
    ref_jobs: List[Dict[str, Any]] = []
    ref_ok = _complete(cfg, family, ref_out, t0, ref_jobs, nan_step=step - 1)
    jobs = [_Job(cfg, family, out, t0, stop_after=step - 1).finish(),
            _Job(cfg, family, out, t0, stop_after=step, nan_step=step - 1).finish()]
    before, after = _state(out, step - 1), _state(out, step)
    no_op = _identical(before, after)  # the skipped step changed no weight, EMA weight or Adam moment
    finished = _complete(cfg, family, out, t0, jobs)
    final = _state(out) if finished else None
    from ...checkpoint import load_trainer_state

    history = load_trainer_state(out)["history"] if finished else []
    skipped = next((r["skipped"] for r in reversed(history) if "skipped" in r), None)
    return {"fault": f"NaN loss at step {step}", "injected": 1,
            "survived": int(finished and no_op and skipped == 1 and _finite(final)),
            "steps_lost": _steps_lost(jobs, cfg.steps), "skipped_step_no_op": no_op, "skipped": skipped,
            "identical": bool(final is not None and ref_ok and _identical(final, _state(ref_out))),
            "compared_with": "the same injection, uninterrupted", "jobs": jobs + ref_jobs}


def _small_data(cfg: FaultsBenchConfig, family: str) -> None:
    """The family's small data where its recipe has some (its offline default too large for a run of a few dozen
    steps), made once under ``<out>/faults``, unless ``extra`` names data."""
    recipe = lab_family(family).faults
    if recipe is None or recipe.data is None or "--data" in cfg.extra.get(family, []):
        return
    cfg.extra = {**cfg.extra, family: [*cfg.extra.get(family, []), *recipe.data(Path(cfg.out) / "faults")]}


def run_family(cfg: FaultsBenchConfig, family: str, progress: bool = True) -> Dict[str, Any]:
    base = Path(cfg.out) / "faults" / family  # the training runs; gitignored under docs/bench
    _small_data(cfg, family)
    rng = random.Random(f"{cfg.seed}-{family}")
    t0 = time.time()
    ref_out = base / "uninterrupted"
    shutil.rmtree(ref_out, ignore_errors=True)
    ref_jobs: List[Dict[str, Any]] = []
    if not _complete(cfg, family, ref_out, t0, ref_jobs):
        raise RuntimeError(f"the uninterrupted {family} run failed: {ref_jobs[-1]['error']}")
    ref = _state(ref_out)
    rows = []
    for name, fn in (("sigkill", _kill_row), ("sigterm", _term_row), ("truncated", _truncate_row)):
        rows.append({"family": family, "row": name, **fn(cfg, family, base, ref, rng, t0)})
        if progress:
            print(_line(rows[-1]), flush=True)
    rows.append({"family": family, "row": "nan", **_nan_row(cfg, family, base, rng, t0)})
    if progress:
        print(_line(rows[-1]), flush=True)
    return {"rows": rows, "reference": ref_jobs, "seconds": time.time() - t0}


def _line(r: Dict[str, Any]) -> str:
    return (f"{r['family']:>6} {r['fault']}: {r['survived']}/{r['injected']} survived, {r['steps_lost']} steps lost, "
            f"final weights {'identical' if r['identical'] else 'DIFFER'}")


def run(cfg: FaultsBenchConfig, progress: bool = True) -> Dict[str, Any]:
    unknown = [f for f in cfg.families if f not in trainable()]
    if unknown:
        raise ValueError(f"unknown families {unknown}; choose from {', '.join(trainable())}")
    if cfg.steps < 2 * cfg.ckpt_every + 2:
        raise ValueError(f"steps ({cfg.steps}) must be ≥ 2 × ckpt_every + 2 = {2 * cfg.ckpt_every + 2}")
    path = Path(cfg.out) / "faults.json"
    payload: Dict[str, Any] = {"families": {}}
    for family in cfg.families:
        result = {**run_family(cfg, family, progress), "machine": machine(), "config": dict(vars(cfg))}
        if path.is_file():  # families measured earlier (or by another run meanwhile) and not redone now are kept
            payload["families"] = read_json(path).get("families", {})
        payload["families"][family] = result
        write_json(path, payload)
    out = Path(cfg.out)
    (out / "faults.txt").write_text(report(payload) + "\n")
    plot(payload, out / "faults.png")
    return payload


def report(payload: Dict[str, Any]) -> str:
    rows = [r for fam in payload["families"].values() for r in fam["rows"]]
    table = format_table([{**r, "identical": "yes" if r["identical"] else "NO"} for r in rows],
                         ["family", "fault", "injected", "survived", "steps_lost", "identical"],
                         ["family", "fault", "injected", "survived", "steps lost", "final weights identical"])
    ok = all(r["survived"] == r["injected"] and r["identical"] for r in rows)
    cfg = next(iter(payload["families"].values()))["config"]
    return (f"{table}\n\n{cfg['steps']} steps, a checkpoint every {cfg['ckpt_every']}; weights = model, EMA and "
            f"optimizer state; the NaN row is compared with the same injection uninterrupted (its skipped step "
            f"is checked to change nothing).\ntarget (every row survived, final weights identical): "
            f"{'met' if ok else 'MISSED'}")


def plot(payload: Dict[str, Any], path: Path) -> None:
    """Step in flight against wall time for the SIGKILL runs (one panel per family): each process a segment, a
    cross where it was killed, the uninterrupted run dashed."""
    fams = list(payload["families"])
    fig, axes = new_figure(len(fams), width=4.2, height=3.4)
    for ax, fam in zip(axes, fams):
        data = payload["families"][fam]
        kill = next(r for r in data["rows"] if r["row"] == "sigkill")
        t_ref = [j for j in data["reference"] if j["first"] is not None]
        for j in t_ref:
            ax.plot([0, j["t_end"] - j["t_start"]], [j["first"], j["last"] + 1], "--", color="gray", lw=1,
                    label="uninterrupted")
        start = next((j["t_start"] for j in kill["jobs"]), 0.0)
        for k, j in enumerate(kill["jobs"]):
            if j["first"] is None:
                continue
            x = [j["t_start"] - start, j["t_end"] - start]
            ax.plot(x, [j["first"], j["last"] + 1], "-", color="C0", lw=1.5,
                    label="killed and resumed" if k == 0 else None)
            if j["signal"] == "SIGKILL":
                ax.plot(x[1], j["last"] + 1, "x", color="C3", ms=7)
        ax.set_title(f"{fam}: {kill['survived']}/{kill['injected']} kills survived", fontsize=9)
        ax.set_xlabel("seconds (start-up included)")
        ax.set_ylabel("step")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    save_figure(fig, path)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = FaultsBenchConfig()
    p.add_argument("--quick", action="store_true", help="16 steps and 3 kills per family (a few minutes)")
    p.add_argument("--families", nargs="+", choices=list(trainable()), default=list(d.families))
    p.add_argument("--steps", type=int_at_least(1), default=None)
    p.add_argument("--ckpt-every", type=int_at_least(1), default=None)
    p.add_argument("--kills", type=int_at_least(0), default=None)
    p.add_argument("--write-kills", type=int_at_least(0), default=None,
                   help="kills while a checkpoint is being written")
    p.add_argument("--threads", type=int_at_least(1), default=d.threads)
    p.add_argument("--seed", type=int_at_least(0), default=d.seed)
    p.add_argument("--out", default=d.out)


def main(args: argparse.Namespace) -> int:
    cfg = FaultsBenchConfig(families=tuple(args.families), threads=args.threads, seed=args.seed, out=args.out)
    apply_overrides(cfg, QUICK if args.quick else None, args,
                    {"steps": "steps", "ckpt_every": "ckpt_every", "kills": "kills", "write_kills": "write_kills"})
    payload = run(cfg)
    print(report(payload))
    print(f"\nwrote {Path(cfg.out) / 'faults.json'}, faults.txt and faults.png")
    return 0


if __name__ == "__main__":
    _worker(sys.argv[1:])
