"""Checkpoints: weights as safetensors, configuration as JSON, optimizer / RNG / step in a small torch file.

Layout of a run folder::

    <run>/checkpoints/step_00000500/{model.safetensors, [ema.safetensors], config.json, trainer.pt}
    <run>/checkpoints/latest          name of the newest complete checkpoint

A sharded checkpoint (a run trained with ``--fsdp``) holds ``sharded/`` in place of the weight files: the model and
optimizer state as ``torch.distributed.checkpoint`` writes it, one file per rank, written by every rank in parallel;
``trainer.pt`` then holds the step, RNG, history and bad samples only. Its manifest lists every file, the shards
included, so a truncated or missing shard is named and the run falls back to the previous checkpoint;
:func:`load_weights` reads its weights on one process (no process group) whatever the world size that wrote it.

A checkpoint is written into a temporary folder and renamed into place only when complete, then ``latest`` is
replaced atomically: a crash at any moment leaves the previous checkpoint intact and pointed to. Its last file is
``manifest.json`` (every other file's size and SHA-256), which loading verifies. What that guarantees — a damaged
checkpoint skipped with a warning, retention of intact ones, a failed write that changes nothing and raises
:class:`CheckpointError` — is docs/faults.md's "Verified checkpoints".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn

from .families import FAMILIES, canonical_family
from .files import file_mode

__all__ = ["save_checkpoint", "resolve_checkpoint", "checkpoint_folder", "checkpoint_step", "read_config",
           "load_weights", "load_model", "load_trainer_state", "rng_state", "set_rng_state", "config_diff",
           "verify_checkpoint", "CheckpointError", "CheckpointWarning", "SHARDED", "is_sharded", "begin_checkpoint",
           "publish_checkpoint", "file_entries", "save_weights_folder"]

MANIFEST = "manifest.json"
SHARDED = "sharded"  # the subfolder of a sharded checkpoint: torch.distributed.checkpoint's files
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


def is_sharded(ck: Union[str, Path]) -> bool:
    """Whether a checkpoint folder is a sharded one (``sharded/`` written by torch.distributed.checkpoint)."""
    return (Path(ck) / SHARDED).is_dir()


def _files(folder: Path) -> List[str]:
    """Every file under ``folder`` (subfolders included) but the manifest, as sorted relative POSIX paths."""
    return sorted(f.relative_to(folder).as_posix() for f in folder.rglob("*")
                  if f.is_file() and f.name not in (MANIFEST, MANIFEST + ".tmp"))


def file_entries(folder: Union[str, Path], names: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """{name: {"bytes", "sha256"}} of the files ``names`` (paths relative to ``folder``): what a manifest records.
    Each rank of a sharded save computes those of its own shard files, in parallel, and the writer of the manifest
    takes them (:func:`publish_checkpoint`'s ``entries``) instead of reading every shard again."""
    folder = Path(folder)
    return {n: {"bytes": (folder / n).stat().st_size, "sha256": _sha256(folder / n)} for n in names}


def _write_manifest(folder: Path, entries: Optional[Dict[str, Dict[str, Any]]] = None) -> None:
    """manifest.json of every file under ``folder``: the ``entries`` given (when the file still has that size),
    the others hashed here."""
    known = entries or {}
    files = {n: known[n] if n in known and known[n]["bytes"] == (folder / n).stat().st_size
             else file_entries(folder, [n])[n] for n in _files(folder)}
    tmp = folder / (MANIFEST + ".tmp")
    with open(tmp, "w") as fh:
        json.dump({"files": files}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, folder / MANIFEST)


Share = Tuple[int, int]  # (this process, of that many): the part of a checkpoint's files a process checks
Agree = Callable[[Optional[str]], Optional[str]]  # every process's finding → the group's (the first problem)


def verify_checkpoint(ck: Union[str, Path], share: Share = (0, 1), agree: Optional[Agree] = None) -> Optional[str]:
    """None if the checkpoint folder is complete and every file matches its manifest, else what is wrong.
    A folder without a manifest but with weights (written before manifests existed) passes unverified.

    ``share=(i, n)`` with ``agree``: n processes verify one folder together, each hashing every n-th file of the
    manifest (sizes all), and ``agree`` combines their findings (a collective; e.g. the first problem any process
    found) — a sharded checkpoint's files are then read once, in parallel, not once per rank. The agreed result
    counts as this process's verification of the whole folder.

    Checksums are computed once per state of the folder (names, sizes, modification times): loading a model
    resolves the same checkpoint several times, and every save re-checks the ones it keeps."""
    ck = Path(ck)
    try:
        key: Any = (ck.resolve(), tuple((n, (ck / n).stat().st_size, (ck / n).stat().st_mtime_ns)
                                        for n in _files(ck)))
    except OSError:
        key = None
    if key is not None and key in _VERIFIED:
        found = _VERIFIED[key]
        return agree(found) if agree is not None else found
    problem = _verify(ck, share)
    if agree is not None:
        problem = agree(problem)
    elif share[1] > 1:
        return problem  # a part of the folder checked: not the folder's verdict
    if key is not None:
        _VERIFIED[key] = problem
    return problem


def _verify(ck: Path, share: Share = (0, 1)) -> Optional[str]:
    m = ck / MANIFEST
    if not m.is_file():
        return None if (ck / "model.safetensors").is_file() and (ck / "config.json").is_file() else \
            f"{ck}: incomplete (no {MANIFEST})"
    try:
        files = json.loads(m.read_text())["files"]
    except (ValueError, KeyError, OSError) as e:
        return f"{m}: unreadable manifest ({e})"
    for i, (name, info) in enumerate(sorted(files.items())):
        f = ck / name
        if not f.is_file():
            return f"{f}: missing"
        size = f.stat().st_size
        if size != info["bytes"]:
            return f"{f}: {size} bytes, the manifest says {info['bytes']} (truncated or overwritten)"
        if i % share[1] == share[0] and _sha256(f) != info["sha256"]:
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
    """Flush a folder's entries to disk, where the file system allows it (not every one opens a folder)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_error(final: Path, e: BaseException) -> CheckpointError:
    why = getattr(e, "strerror", None) or str(e).splitlines()[0] if str(e) else type(e).__name__
    return CheckpointError(f"could not write checkpoint {final}: {why} ({type(e).__name__}); the earlier "
                           f"checkpoints and 'latest' are unchanged")


def begin_checkpoint(run_dir: Union[str, Path], step: int) -> Path:
    """The empty temporary folder the checkpoint of ``step`` is written into (by one process, or by every rank of a
    sharded save once this one has made it); :func:`publish_checkpoint` completes it."""
    final = checkpoint_folder(run_dir, step)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    except OSError as e:
        raise _write_error(final, e) from e
    return tmp


def _seal(tmp: Path, final: Path, entries: Optional[Dict[str, Dict[str, Any]]] = None) -> None:
    """Make every file of ``tmp`` readable as the others' files are and flush it to disk, write the manifest last
    (its presence means the folder is complete), and rename ``tmp`` to ``final`` (replacing an older one)."""
    mode = file_mode()  # safetensors writes 0600: others on a shared machine could not read a model
    for name in _files(tmp):
        f = tmp / name
        os.chmod(f, mode)
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    _write_manifest(tmp, entries)
    if final.exists():  # re-saving the same step (e.g. the last step after a resume): replace it
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
    _fsync_dir(final.parent)


def publish_checkpoint(tmp: Path, run_dir: Union[str, Path], step: int, config: Dict[str, Any],
                       trainer_state: Optional[Dict[str, Any]] = None, keep: int = 3,
                       entries: Optional[Dict[str, Dict[str, Any]]] = None) -> Path:
    """Complete a checkpoint whose weights are already in ``tmp`` (from :func:`begin_checkpoint`): write its
    config and trainer state, its manifest (``entries``: sizes and checksums already computed, e.g. by each rank for
    its shards), rename it into place, point ``latest`` at it and keep the newest ``keep``. A failure removes
    ``tmp`` and raises :class:`CheckpointError`; the earlier checkpoints and ``latest`` are then unchanged."""
    final = checkpoint_folder(run_dir, step)
    root = final.parent
    try:
        (tmp / "config.json").write_text(json.dumps({**config, "step": step}, indent=2, default=str))
        if trainer_state is not None:
            torch.save(trainer_state, tmp / "trainer.pt")
        _seal(tmp, final, entries)
        latest_tmp = root / f".latest.tmp-{os.getpid()}"
        latest_tmp.write_text(final.name)
        os.replace(latest_tmp, root / "latest")
        _fsync_dir(root)
    except Exception as e:  # OSError (disk full, permissions) or a writer's own error wrapping one
        shutil.rmtree(tmp, ignore_errors=True)
        raise _write_error(final, e) from e
    _prune(root, keep, final)
    return final


def save_checkpoint(run_dir: Union[str, Path], step: int, model: nn.Module, config: Dict[str, Any],
                    trainer_state: Optional[Dict[str, Any]] = None, ema: Optional[nn.Module] = None,
                    keep: int = 3, model_state: Optional[Dict[str, torch.Tensor]] = None) -> Path:
    """Write a complete checkpoint atomically and point ``latest`` at it; keep the newest ``keep``.

    ``model_state``: the model's whole weights already gathered, written in place of ``model.state_dict()`` (tied
    parameters under one name, as safetensors writes a module)."""
    tmp = begin_checkpoint(run_dir, step)
    try:
        _write_weights(tmp, model, model_state, ema)
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _write_error(checkpoint_folder(run_dir, step), e) from e
    return publish_checkpoint(tmp, run_dir, step, config, trainer_state, keep)


def _write_weights(folder: Path, model: nn.Module, model_state: Optional[Dict[str, torch.Tensor]] = None,
                   ema: Optional[nn.Module] = None) -> None:
    from safetensors.torch import save_file, save_model

    if model_state is None:
        save_model(model, str(folder / "model.safetensors"))
    else:
        save_file({k: v.contiguous() for k, v in model_state.items()}, str(folder / "model.safetensors"),
                  metadata={"format": "pt"})
    if ema is not None:
        save_model(ema, str(folder / "ema.safetensors"))


def save_weights_folder(dest: Union[str, Path], model: nn.Module, config: Dict[str, Any]) -> Path:
    """A checkpoint folder of weights alone at ``dest`` (model.safetensors, config.json, manifest), written into a
    temporary sibling and renamed into place: what :func:`load_model` and the transformers integration read (e.g. a
    sharded checkpoint exported to one file). ``dest`` must not exist or be empty."""
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ValueError(f"{dest} exists and is not an empty folder: choose another --out")
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        _write_weights(tmp, model)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, default=str))
        if dest.exists():
            dest.rmdir()
        _seal(tmp, dest)
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _write_error(dest, e) from e
    return dest


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


def resolve_checkpoint(path: Union[str, Path], share: Share = (0, 1), agree: Optional[Agree] = None) -> Path:
    """Accept a run folder, its ``checkpoints`` folder, or one checkpoint folder; return the checkpoint folder.

    A run folder gives its newest checkpoint that verifies: damaged ones are skipped with a warning saying which and
    why. A checkpoint folder named directly must verify, else :class:`CheckpointError`. ``share`` and ``agree``:
    several processes verify together, each a part of the files (:func:`verify_checkpoint`); every one of them
    must call this alike."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"checkpoint {p} does not exist")
    if (p / "model.safetensors").is_file() or (p / MANIFEST).is_file():
        problem = verify_checkpoint(p, share, agree)
        if problem:
            raise CheckpointError(f"checkpoint {problem}")
        return p
    skipped: List[Tuple[Path, str]] = []
    for ck in _candidates(p):
        problem = verify_checkpoint(ck, share, agree)
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
    if is_sharded(ck) and not ema:
        _load_sharded_weights(model, ck)
        return
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


def _load_sharded_weights(model: nn.Module, ck: Path) -> None:
    """The model's part of a sharded checkpoint, read in place into ``model``'s tensors on this process alone
    (torch.distributed.checkpoint without a process group; the shards of any number of ranks)."""
    import torch.distributed.checkpoint as dcp

    folder = ck / SHARDED
    try:
        saved = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    except Exception as e:
        raise CheckpointError(f"{folder}: unreadable ({str(e).splitlines()[0] if str(e) else type(e).__name__})") \
            from e
    saved_names = {k[len("model."):] for k in saved if k.startswith("model.")}
    state = model.state_dict()
    missing, unexpected = sorted(set(state) - saved_names), sorted(saved_names - set(state))
    if missing or unexpected:
        raise ValueError(f"checkpoint {ck} does not fit this model: missing {missing}, unexpected {unexpected}")
    try:
        with warnings.catch_warnings():  # (DCP says it assumes one process: that is what no_dist asks)
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load({"model": state}, checkpoint_id=str(folder), no_dist=True)
    except Exception as e:  # a shape that differs, or a shard that cannot be read
        raise ValueError(f"checkpoint {ck} does not fit this model or cannot be read: "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e


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
