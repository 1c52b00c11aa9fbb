"""Checkpoints: weights as safetensors, configuration as JSON, optimizer / RNG / step in a small torch file.

Layout of a run folder::

    <run>/checkpoints/step_00000500/{model.safetensors, [ema.safetensors], config.json, trainer.pt}
    <run>/checkpoints/latest          name of the newest complete checkpoint

A checkpoint is written into a temporary folder and renamed into place only when complete, then ``latest`` is
replaced atomically: a crash at any moment leaves the previous checkpoint intact and pointed to. Its last file is
``manifest.json`` (every other file's size and SHA-256): its presence means the checkpoint is complete, and loading
verifies it. A run folder resolves to its newest checkpoint that verifies — a damaged newer one is skipped with a
warning saying why — and retention counts only intact checkpoints. A failed write (disk full, permissions) leaves
every earlier checkpoint and ``latest`` as they were and raises :class:`CheckpointError` naming the path and the
OS error. Checkpoints from before manifests existed load unverified.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import torch
from torch import nn

from .families import FAMILIES, canonical_family
from .files import file_mode

__all__ = ["save_checkpoint", "resolve_checkpoint", "checkpoint_folder", "checkpoint_step", "read_config",
           "load_weights", "load_model", "load_trainer_state", "rng_state", "set_rng_state", "config_diff",
           "verify_checkpoint", "CheckpointError", "CheckpointWarning"]

MANIFEST = "manifest.json"
_WARNED: set = set()
_VERIFIED: Dict[tuple, Optional[str]] = {}


def checkpoint_folder(run_dir: Union[str, Path], step: int) -> Path:
    """The folder the checkpoint of ``step`` has in a run folder (whether or not it exists)."""
    return Path(run_dir) / "checkpoints" / f"step_{step:08d}"


def checkpoint_step(ck: Union[str, Path]) -> int:
    """The step a checkpoint folder holds, read from its name; ValueError for a folder that is not a checkpoint's."""
    name = Path(ck).name
    head, _, digits = name.partition("_")
    if head != "step" or not digits.isdigit():
        raise ValueError(f"{ck} is not a checkpoint folder (expected step_<step>)")
    return int(digits)


class CheckpointError(ValueError):
    """A checkpoint that is damaged, incomplete or could not be written; the message names the file and the cause."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_manifest(folder: Path) -> None:
    files = {f.name: {"bytes": f.stat().st_size, "sha256": _sha256(f)} for f in sorted(folder.iterdir())
             if f.is_file() and f.name != MANIFEST}
    tmp = folder / (MANIFEST + ".tmp")
    with open(tmp, "w") as fh:
        json.dump({"files": files}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, folder / MANIFEST)


def verify_checkpoint(ck: Union[str, Path]) -> Optional[str]:
    """None if the checkpoint folder is complete and every file matches its manifest, else what is wrong.
    A folder without a manifest but with weights (written before manifests existed) passes unverified.

    Checksums are computed once per state of the folder (names, sizes, modification times): loading a model
    resolves the same checkpoint several times, and every save re-checks the ones it keeps."""
    ck = Path(ck)
    try:
        key = (ck.resolve(), tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in ck.iterdir())))
    except OSError:
        key = None
    if key is not None and key in _VERIFIED:
        return _VERIFIED[key]
    problem = _verify(ck)
    if key is not None:
        _VERIFIED[key] = problem
    return problem


def _verify(ck: Path) -> Optional[str]:
    m = ck / MANIFEST
    if not m.is_file():
        return None if (ck / "model.safetensors").is_file() and (ck / "config.json").is_file() else \
            f"{ck}: incomplete (no {MANIFEST})"
    try:
        files = json.loads(m.read_text())["files"]
    except (ValueError, KeyError, OSError) as e:
        return f"{m}: unreadable manifest ({e})"
    for name, info in files.items():
        f = ck / name
        if not f.is_file():
            return f"{f}: missing"
        size = f.stat().st_size
        if size != info["bytes"]:
            return f"{f}: {size} bytes, the manifest says {info['bytes']} (truncated or overwritten)"
        if _sha256(f) != info["sha256"]:
            return f"{f}: checksum mismatch (corrupted)"
    return None


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


class CheckpointWarning(UserWarning):
    """A damaged checkpoint was skipped (the command line prints the message alone)."""


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
                    keep: int = 3, model_state: Optional[Dict[str, torch.Tensor]] = None) -> Path:
    """Write a complete checkpoint atomically and point ``latest`` at it; keep the newest ``keep``.

    ``model_state``: the model's whole weights already gathered (sharded training), written in place of
    ``model.state_dict()`` (tied parameters under one name, as safetensors writes a module)."""
    from safetensors.torch import save_file, save_model

    final = checkpoint_folder(run_dir, step)
    root, name = final.parent, final.name
    tmp = root / f".{name}.tmp-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        if model_state is None:
            save_model(model, str(tmp / "model.safetensors"))
        else:
            save_file({k: v.contiguous() for k, v in model_state.items()}, str(tmp / "model.safetensors"),
                      metadata={"format": "pt"})
        if ema is not None:
            save_model(ema, str(tmp / "ema.safetensors"))
        (tmp / "config.json").write_text(json.dumps({**config, "step": step}, indent=2, default=str))
        if trainer_state is not None:
            torch.save(trainer_state, tmp / "trainer.pt")
        mode = file_mode()  # safetensors writes 0600: others on a shared machine could not read a model
        for f in tmp.iterdir():
            os.chmod(f, mode)
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        _write_manifest(tmp)  # last: its presence means the checkpoint is complete
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
    except Exception as e:  # OSError (disk full, permissions) or a writer's own error wrapping one
        shutil.rmtree(tmp, ignore_errors=True)
        why = getattr(e, "strerror", None) or str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"could not write checkpoint {final}: {why} ({type(e).__name__}); the earlier "
                              f"checkpoints and 'latest' are unchanged") from e
    _prune(root, keep, final)
    return final


def _prune(root: Path, keep: int, newest: Path) -> None:
    """Keep the newest ``keep`` intact checkpoints; remove older intact ones and damaged ones older than those kept
    (a damaged checkpoint newer than every intact one stays, for inspection), and the temporary folders and files of
    writes that a killed process left behind (a run has one writer, and its own write has just finished)."""
    for p in root.glob(".*"):
        if ".tmp-" in p.name or ".old-" in p.name:
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    steps = sorted((p for p in root.glob("step_*") if p.is_dir()), reverse=True)
    intact = [p for p in steps if p == newest or verify_checkpoint(p) is None]
    kept = set(intact[:max(keep, 1)])
    oldest_kept = min(kept) if kept else None
    for p in steps:
        if p in kept:
            continue
        if p in intact or (oldest_kept is not None and p < oldest_kept):
            shutil.rmtree(p, ignore_errors=True)


def _candidates(p: Path) -> List[Path]:
    """Checkpoint folders of a run (or its checkpoints folder), newest first, the one ``latest`` names leading."""
    for root in (p / "checkpoints", p):
        steps = sorted((q for q in root.glob("step_*") if q.is_dir()), reverse=True)
        latest = root / "latest"
        if latest.is_file():
            named = root / latest.read_text().strip()
            if named in steps:
                steps.remove(named)
                steps.insert(0, named)
        if steps:
            return steps
    return []


def resolve_checkpoint(path: Union[str, Path]) -> Path:
    """Accept a run folder, its ``checkpoints`` folder, or one checkpoint folder; return the checkpoint folder.

    A run folder gives its newest checkpoint that verifies: damaged ones are skipped with a warning saying which and
    why. A checkpoint folder named directly must verify, else :class:`CheckpointError`."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"checkpoint {p} does not exist")
    if (p / "model.safetensors").is_file() or (p / MANIFEST).is_file():
        problem = verify_checkpoint(p)
        if problem:
            raise CheckpointError(f"checkpoint {problem}")
        return p
    skipped: List[Tuple[Path, str]] = []
    for ck in _candidates(p):
        problem = verify_checkpoint(ck)
        if problem is None:
            for bad, why in skipped:
                if (bad, why) not in _WARNED:  # once per process, however often the run is resolved
                    _WARNED.add((bad, why))
                    warnings.warn(f"skipping checkpoint {bad.name}: {why}; using {ck.name}", CheckpointWarning,
                                  stacklevel=2)
            return ck
        skipped.append((ck, problem))
    if skipped:
        raise CheckpointError(f"no intact checkpoint in {p}: " + "; ".join(why for _, why in skipped))
    raise FileNotFoundError(f"no checkpoint found in {p} (expected model.safetensors or checkpoints/latest)")


def read_config(path: Union[str, Path]) -> Dict[str, Any]:
    """A checkpoint's ``config.json``, its ``family`` and model fields under their current names (a checkpoint
    written when the image family was called ``dit`` reads as ``image``, its ``shift_width`` as ``token_shift``)."""
    ck = resolve_checkpoint(path)
    try:
        cfg = json.loads((ck / "config.json").read_text())
    except (ValueError, OSError) as e:
        raise CheckpointError(f"{ck / 'config.json'}: unreadable ({e})") from e
    if isinstance(cfg, dict) and isinstance(cfg.get("family"), str):
        cfg["family"] = canonical_family(cfg["family"])
        # fields saved under an earlier name read under today's (a distillation stage's config is its own)
        if isinstance(cfg.get("model"), dict) and cfg["family"] in FAMILIES:
            from .models.registry import current_fields, family_config

            cfg["model"] = current_fields(family_config(cfg["family"]), cfg["model"])
    return cfg


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
    except Exception as e:  # safetensors' own errors on a damaged file
        raise CheckpointError(f"{f}: unreadable ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from e
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
    from .models import build_from_config

    cfg = read_config(path)
    family = cfg.get("family")
    if "family" in expect and family != canonical_family(expect["family"]):
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
    try:
        return torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"{f}: unreadable ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from e
