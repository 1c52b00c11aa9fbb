"""``polymixer check-data <family> [--data DIR]``: every bad file of a dataset with its reason, in one pass.

The loaders read lazily, so without a check a truncated array or an unreadable image is found only when the sampler
draws it, possibly hours into a run. The check reads headers and lengths (not the data), the same scan ``polymixer
train`` runs before its first step unless given ``--no-data-check``. What it scans is the family's to say
(:attr:`~polymixer.experiments.registry.LabFamily.check`): by default the one folder given, or the offline default.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from typing import Any

from ..registry import LabFamily, lab_family
from .common import scan_dataset

__all__ = ["add_arguments", "main", "dataset_folder"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", nargs="*", default=None, metavar="PATH",
                   help="the dataset: a folder (or, for lm, text files and folders); default: the family's offline "
                        "default")
    p.add_argument("--format", default=None, help="points: the dataset format (default: detected)")
    p.add_argument("--preset", default=None, metavar="NAME",
                   help="ocr: the model whose line height decides which lines are too narrow for one token (default: "
                        "the family's tiny preset, as train)")
    p.add_argument("--json", default=None, help="also write the bad files and their reasons to this file")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def dataset_folder(args: argparse.Namespace, fam: LabFamily) -> Any:
    """The one dataset folder ``--data`` names, resolved by the family's offline default where it has one (no folder
    given: the default, made once into the cache; a folder: checked to exist); as given otherwise."""
    if args.data and len(args.data) > 1:
        raise ValueError(f"check-data {fam.name} takes one dataset folder, got {len(args.data)}")
    given = args.data[0] if args.data else None
    if fam.offline_default is None:
        return given
    return importlib.import_module(fam.offline_default).resolve_data(given, progress=not args.quiet)


def main(args: argparse.Namespace) -> int:
    fam = lab_family(args.noun)
    found = fam.check(args) if fam.check is not None else (dataset_folder(args, fam), {})
    if found is None:  # nothing to scan (the family said why)
        return 0
    data, kw = found
    t0 = time.perf_counter()
    bad = scan_dataset(fam.name, data, progress=not args.quiet, **kw)
    where = "the default corpus" if data is None else ", ".join(map(str, data)) if isinstance(data, list) else data
    seconds = time.perf_counter() - t0
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"family": fam.name, "data": str(where), "bad": [{"file": p, "reason": r} for p, r in bad]},
                      f, indent=1)
    if not bad:
        print(f"{fam.name}: {where}: no bad file ({seconds:.1f} s)")
        return 0
    print(f"{fam.name}: {where}: {len(bad)} bad file{'s' if len(bad) != 1 else ''} ({seconds:.1f} s)")
    for path, reason in bad:
        print(f"  {path}: {reason}")
    return 1
