"""Experiment tracking (``--log``): every record of the training loop's history, as it is made, to a CSV file,
TensorBoard or Weights & Biases — the main rank only.

A record is one of the loop's history entries: a training record (step, loss, learning rate, throughput, gradient
norm, steps skipped, peak memory, seconds trained, bad samples) or an evaluation (step and ``eval_<metric>``). Every
tracker receives every record, so each shows every figure the loop logs; ``history.json``, which ``polymixer plot``
reads, is written whatever ``--log`` says.

- ``csv``: ``<out>/history.csv``, one column per key of the history (in the order they first appear), one row per
  record — the rows of ``history.json``. Rows are appended as they come; a record with a new key (the first
  evaluation) rewrites the file with the wider header.
- ``tensorboard``: event files in ``<out>/tensorboard`` (``torch.utils.tensorboard``; the ``tensorboard`` extra):
  training figures as ``train/<key>``, evaluations as ``eval/<metric>``. A resumed run purges what the earlier
  invocation logged after its checkpoint.
- ``wandb``: a Weights & Biases run (the ``wandb`` extra) under ``<out>/wandb``, with the run's config, resumed by
  the id kept in ``<out>/wandb-id.txt``. It runs **offline** unless ``WANDB_MODE`` says otherwise or a W&B API key
  is configured (``WANDB_API_KEY`` or a ``wandb login`` in ``~/.netrc``): a run on a machine without network never
  waits on one. ``wandb sync <out>/wandb/offline-run-*`` uploads an offline run later. An online start that fails
  (no network, a bad key) goes on offline, with a one-line warning.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import netrc
import os
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol, Sequence

from ...files import write_text_atomic
from ..extras import EXTRAS

__all__ = ["TRACKERS", "Tracker", "check_tracker", "open_tracker", "CsvTracker", "TensorBoardTracker",
           "WandbTracker", "wandb_mode"]

TRACKERS = ("none", "csv", "tensorboard", "wandb")


def check_tracker(kind: str) -> str:
    """``kind`` if it is one of :data:`TRACKERS` and its package is installed, else a one-line ValueError naming the
    choices or the extra to install (checked when the config is made, before any data is read)."""
    if kind not in TRACKERS:
        raise ValueError(f"log (--log) must be one of {', '.join(TRACKERS)}, got {kind!r}")
    if kind in EXTRAS and importlib.util.find_spec(kind) is None:  # the choice is the name of the module it imports
        package, extra = EXTRAS[kind]
        raise ValueError(f"--log {kind} needs the {package} package: pip install 'polymixer[{extra}]'")
    return kind


class Tracker(Protocol):
    """Where the main rank sends each history record as the loop makes it."""

    def log(self, record: Dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class _NoTracker:
    def log(self, record: Dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def _numbers(record: Dict[str, Any]) -> Dict[str, float]:
    """The record's figures (numbers, the step excepted)."""
    return {k: float(v) for k, v in record.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _tag(key: str) -> str:
    """``eval_val_loss`` → ``eval/val_loss``; a training figure ``loss`` → ``train/loss``."""
    return f"eval/{key[5:]}" if key.startswith("eval_") else f"train/{key}"


class CsvTracker:
    """``history.csv``: the history as a table (see the module's docstring)."""

    def __init__(self, path: Path, history: Sequence[Dict[str, Any]]) -> None:
        self.path = path
        self.rows: List[Dict[str, Any]] = [dict(r) for r in history]  # a resumed run: its history so far
        self.columns: List[str] = []
        self._rewrite()

    def _widen(self, record: Dict[str, Any]) -> bool:
        new = [k for k in record if k not in self.columns]
        self.columns += new
        return bool(new)

    def _rewrite(self) -> None:
        for r in self.rows:
            self._widen(r)
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=self.columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        write_text_atomic(self.path, text.getvalue())

    def log(self, record: Dict[str, Any]) -> None:
        self.rows.append(dict(record))
        if self._widen(record):
            self._rewrite()
            return
        with open(self.path, "a", newline="") as fh:
            csv.DictWriter(fh, fieldnames=self.columns, lineterminator="\n").writerow(record)

    def close(self) -> None:
        pass


class TensorBoardTracker:
    """Event files of ``torch.utils.tensorboard`` (see the module's docstring)."""

    def __init__(self, folder: Path, start: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # a resumed run starts after its checkpoint's step: what an earlier invocation logged past it is dropped
        self.writer = SummaryWriter(log_dir=str(folder), purge_step=start + 1 if start else None)

    def log(self, record: Dict[str, Any]) -> None:
        for key, value in _numbers(record).items():
            self.writer.add_scalar(_tag(key), value, global_step=int(record["step"]))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def wandb_mode(environ: Optional[Dict[str, str]] = None, netrc_path: Optional[Path] = None) -> str:
    """The mode a ``--log wandb`` run starts in: ``WANDB_MODE`` when set; else online when an API key is configured
    (``WANDB_API_KEY``, or ``wandb login``'s entry in ``~/.netrc``); else offline."""
    env = os.environ if environ is None else environ
    if env.get("WANDB_MODE"):
        return env["WANDB_MODE"]
    if env.get("WANDB_API_KEY"):
        return "online"
    path = netrc_path or Path(env.get("NETRC", Path.home() / ".netrc"))
    try:
        known = netrc.netrc(str(path)).authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        known = False
    return "online" if known else "offline"


class WandbTracker:
    """A Weights & Biases run (see the module's docstring)."""

    def __init__(self, out: Path, config: Dict[str, Any], name: str) -> None:
        import wandb

        self.wandb = wandb
        id_file = out / "wandb-id.txt"  # the W&B run of this run folder: a resumed run continues it
        run_id = id_file.read_text().strip() if id_file.is_file() else None
        kw = dict(project=os.environ.get("WANDB_PROJECT") or "polymixer", dir=str(out), id=run_id, name=name,
                  config=config, resume="allow")
        mode = wandb_mode()
        try:
            self.run = wandb.init(mode=mode, **kw)
        except Exception as e:  # no network, a bad key: the run's figures are kept offline all the same
            if mode != "online":
                raise
            warnings.warn(f"--log wandb: could not start an online run ({str(e).splitlines()[0] if str(e) else e}); "
                          f"logging offline under {out / 'wandb'} (wandb sync uploads it)")
            self.run = wandb.init(mode="offline", **kw)
        if run_id is None:
            write_text_atomic(id_file, f"{self.run.id}\n")

    def log(self, record: Dict[str, Any]) -> None:
        self.run.log({_tag(k): v for k, v in _numbers(record).items()}, step=int(record["step"]))

    def close(self) -> None:
        self.run.finish()


def open_tracker(kind: str, out: Path, history: Sequence[Dict[str, Any]], start: int, config: Dict[str, Any],
                 name: str) -> Tracker:
    """The tracker ``--log`` names, for the run in ``out`` whose ``history`` so far (a resumed run's) ends at step
    ``start``; ``config`` is what a W&B run records, ``name`` its display name."""
    check_tracker(kind)
    out.mkdir(parents=True, exist_ok=True)
    if kind == "csv":
        return CsvTracker(out / "history.csv", history)
    if kind == "tensorboard":
        return TensorBoardTracker(out / "tensorboard", start)
    if kind == "wandb":
        return WandbTracker(out, config, name)
    return _NoTracker()
