"""Checkpoints: weights as safetensors, configuration as JSON, optimizer / RNG / step in a small torch file.

Layout of a run folder::

    <run>/checkpoints/step_00000500/{model.safetensors, [ema.safetensors], config.json, trainer.pt}
    <run>/checkpoints/latest          name of the newest complete checkpoint

A checkpoint is written into a temporary folder and renamed into place only when complete, then ``latest`` is
replaced atomically: a crash at any moment leaves the previous checkpoint intact and pointed to.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Dict, Optional, Union

import numpy as np
import torch
from torch import nn

__all__ = ["save_checkpoint", "resolve_checkpoint", "read_config", "load_weights", "load_model", "load_trainer_state",
           "rng_state", "set_rng_state", "config_diff"]


def rng_state() -> Dict[str, Any]:
    """Every random generator's state, as tensors and plain numbers (loadable with ``weights_only=True``)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "gauss": float(gauss)},
            "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_checkpoint(run_dir: Union[str, Path], step: int, model: nn.Module, config: Dict[str, Any],
                    trainer_state: Optional[Dict[str, Any]] = None, ema: Optional[nn.Module] = None,
                    keep: int = 3) -> Path:
    """Write a complete checkpoint atomically and point ``latest`` at it; keep the newest ``keep``."""
    from safetensors.torch import save_model

    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:08d}"
    final = root / name
    tmp = root / f".{name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_model(model, str(tmp / "model.safetensors"))
    if ema is not None:
        save_model(ema, str(tmp / "ema.safetensors"))
    (tmp / "config.json").write_text(json.dumps({**config, "step": step}, indent=2, default=str))
    if trainer_state is not None:
        torch.save(trainer_state, tmp / "trainer.pt")
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():  # re-saving the same step (e.g. the last step after a resume): replace it
        old = root / f".{name}.old-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
    _fsync_dir(root)
    latest_tmp = root / f".latest.tmp-{os.getpid()}"
    latest_tmp.write_text(name)
    os.replace(latest_tmp, root / "latest")
    _fsync_dir(root)
    steps = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in steps[: max(0, len(steps) - keep)]:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def resolve_checkpoint(path: Union[str, Path]) -> Path:
    """Accept a run folder, its ``checkpoints`` folder, or one checkpoint folder; return the checkpoint folder."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"checkpoint {p} does not exist")
    if (p / "model.safetensors").is_file():
        return p
    for root in (p / "checkpoints", p):
        latest = root / "latest"
        if latest.is_file():
            ck = root / latest.read_text().strip()
            if (ck / "model.safetensors").is_file():
                return ck
        steps = sorted(q for q in root.glob("step_*") if (q / "model.safetensors").is_file())
        if steps:
            return steps[-1]
    raise FileNotFoundError(f"no checkpoint found in {p} (expected model.safetensors or checkpoints/latest)")


def read_config(path: Union[str, Path]) -> Dict[str, Any]:
    ck = resolve_checkpoint(path)
    return json.loads((ck / "config.json").read_text())


def config_diff(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, tuple]:
    """Keys whose values differ between two flat config dicts: {key: (a, b)}. Values are compared as JSON stores
    them, so a tuple in a config equals the list its checkpoint read back."""
    keys = set(a) | set(b)
    norm = lambda v: json.loads(json.dumps(v, default=str))  # noqa: E731
    return {k: (a.get(k), b.get(k)) for k in sorted(keys) if norm(a.get(k)) != norm(b.get(k))}


def load_weights(model: nn.Module, path: Union[str, Path], ema: bool = False) -> None:
    """Load a checkpoint's weights into ``model``; a mismatch raises a ValueError naming the tensors."""
    from safetensors.torch import load_model

    ck = resolve_checkpoint(path)
    f = ck / ("ema.safetensors" if ema else "model.safetensors")
    if not f.is_file():
        raise FileNotFoundError(f"{f} not found")
    try:
        missing, unexpected = load_model(model, str(f), strict=False)
    except RuntimeError as e:  # shape mismatch
        raise ValueError(f"checkpoint {ck} does not fit this model: {e}") from e
    if missing or unexpected:
        raise ValueError(f"checkpoint {ck} does not fit this model: missing {sorted(missing)}, unexpected "
                         f"{sorted(unexpected)}")


def load_model(path: Union[str, Path], device: Optional[Union[str, torch.device]] = None,
               ema: Optional[bool] = False, **expect: Any) -> nn.Module:
    """Rebuild the model a checkpoint was trained with and load its weights (the EMA weights with ``ema=True``;
    ``ema=None``: the EMA weights when the checkpoint has them).

    ``expect`` lists config values the caller relies on (e.g. ``family="lm"``); any difference raises a ValueError
    that lists the differing keys.
    """
    from ..models import build_from_config

    cfg = read_config(path)
    family = cfg.get("family")
    if "family" in expect and family != expect["family"]:
        raise ValueError(f"checkpoint {path} holds a {family!r} model, not {expect['family']!r}")
    model = build_from_config(family, cfg["model"], device)
    model.preset = cfg.get("preset")
    if ema is None:
        ema = (resolve_checkpoint(path) / "ema.safetensors").is_file()
    load_weights(model, path, ema=ema)
    return model


def load_trainer_state(path: Union[str, Path]) -> Dict[str, Any]:
    ck = resolve_checkpoint(path)
    f = ck / "trainer.pt"
    if not f.is_file():
        raise FileNotFoundError(f"{f} not found: this checkpoint holds weights only and cannot resume training")
    return torch.load(f, map_location="cpu", weights_only=True)
