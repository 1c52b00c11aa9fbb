"""What every family's task commands share: the ``--preset`` option, the one-line refusal of another family's preset,
and the upfront check of a dataset's files (``polymixer check-data`` and the scan at the start of ``train``)."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any, Callable, List, Sequence, Tuple, Union

from ..data.faults import DataCheckError, merge_bad
from ...families import family as family_entry
from ..commands import loader_module
from ...models import list_models, preset_of
from ..train.loop import Range

__all__ = ["add_preset_argument", "check_preset", "add_data_check_argument", "check_dataset", "scan_dataset",
           "int_at_least", "float_in"]


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer ≥ ``low`` — anything else is the parser's one-line error naming the option
    and the range, before any data is read."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer ≥ {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be ≥ {low}, got {value}")
        return value

    return parse


def float_in(allowed: Range) -> Callable[[str], float]:
    """An argparse ``type``: a number in ``allowed`` (:class:`polymixer.experiments.train.loop.Range`)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number {allowed}, got {text!r}") from None
        if value != value or not allowed.admits(value):
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {value:g}")
        return value

    return parse


def add_preset_argument(p: argparse.ArgumentParser, family: str) -> None:
    """``--preset``, defaulting to the family's tiny preset and listing the family's tiny presets."""
    fam = family_entry(family)
    names = list_models(family=fam.name)
    tiny = [n for n in names if n.startswith("tiny-")]
    p.add_argument("--preset", default=fam.tiny, metavar="NAME",
                   help=f"the model: {', '.join(tiny)} (CPU scale), or one of the {len(names) - len(tiny)} paper-size "
                        f"presets (polymixer.models.list_models(family={fam.name!r}))")


def check_preset(family: str, preset: str) -> str:
    """``preset`` if it belongs to ``family``; a one-line ValueError naming its family and the family's presets."""
    return preset_of(family, preset)


def add_data_check_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-data-check", action="store_true",
                   help="skip the scan of every data file's header and length before training (a bad file then "
                        "stops the run when it is drawn, or is skipped with --skip-bad-samples)")


def scan_dataset(family: str, data: Any, progress: bool = True, **kw: Any) -> List[Tuple[str, str]]:
    """Every bad file of a dataset of ``family`` with its reason, in one pass over headers and lengths
    (``polymixer.experiments.<family>.data.check_data``); ``data`` is what the family's loaders take (a folder, or the
    text
    files of a language model)."""
    fam = family_entry(family)
    module = importlib.import_module(loader_module(fam))
    return merge_bad(module.check_data(data, progress=progress, **kw))  # each bad file once, all its reasons


def check_dataset(family: str, data: Any, progress: bool = True, skip_bad_samples: bool = False,
                  **kw: Any) -> List[Tuple[str, str]]:
    """The scan at the start of ``train``: a :class:`~polymixer.experiments.data.faults.DataCheckError` listing every
    bad file
    (unless bad samples are to be skipped: then the list is returned, and the loaders skip them as they meet
    them)."""
    bad = scan_dataset(family, data, progress=progress, **kw)
    if bad and not skip_bad_samples:
        raise DataCheckError(_where(data), bad)
    return bad


def _where(data: Union[str, Path, Sequence[Any], None]) -> str:
    if isinstance(data, (list, tuple)):
        return ", ".join(map(str, data[:3])) + (" …" if len(data) > 3 else "")
    return str(data)
