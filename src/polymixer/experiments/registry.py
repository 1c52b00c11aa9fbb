"""The lab's registry of families: what a family registers (:class:`LabFamily`) and where the lab finds it.

A family of the lab is its folder plus one registration, a :class:`LabFamily`: its library entry (name, tiny preset,
earlier names: :mod:`polymixer.families`), its commands, its data loaders and offline default, what ``bench parity``
compares and judges, its fault-tolerance recipe, its guides' result tables. The lab finds each registration through
the families table: a built-in family's (:data:`polymixer.families.BUILT_IN`) is ``FAMILY`` in
``polymixer.experiments.<name>.family``; a family from another package is the object an entry point of the group
:data:`ENTRY_POINTS` names (``toy = toy_family.family:FAMILY`` in the package's ``entry_points.txt``), found wherever
that package is on the path, in every process. Loading a registration adds its family to the library's table.

The shared modules (the command line, the data check, ``bench parity``, ``bench faults``, the README's family table,
the guides' tables) read the families from here and name none of them.
"""

from __future__ import annotations

import argparse
import functools
import importlib
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from ..families import BUILT_IN, Family, add_family, canonical_family

__all__ = ["ENTRY_POINTS", "Command", "Table", "FaultRecipe", "LabFamily", "families", "lab_family", "trainable",
           "comparisons", "guide_tables"]

ENTRY_POINTS = "polymixer.families"  # the entry-point group of families from other packages


class Command(NamedTuple):
    """One ``polymixer <verb> <noun>`` command: its help line, its target (``module``: functions ``add_arguments`` /
    ``main``; ``module:name``: ``add_<name>_arguments`` / ``main_<name>``, imported when the command is built) and
    its description."""

    short: str
    target: str
    description: str


@dataclass(frozen=True)
class Table:
    """A generated table of a guide: its generator (the docs/bench folder → the table's Markdown) and the JSON files
    under docs/bench it reads, named in its marker."""

    make: Callable[[Path], str]
    sources: Tuple[str, ...]


@dataclass(frozen=True)
class FaultRecipe:
    """How ``bench faults`` trains the family: its tiny preset with these ``train`` arguments (sizes a run of a few
    dozen steps affords; the family's own EMA, SAM and dropout where it has them) and, where its offline default is
    too large for that, ``data``: a function that writes small data once under the folder it is given and returns the
    ``train`` arguments that read it."""

    args: Tuple[str, ...] = ()
    data: Optional[Callable[[Path], List[str]]] = None


@dataclass(frozen=True)
class LabFamily:
    """One family's registration.

    ``commands``: (verb, noun) → :class:`Command`; the noun is the family's name for ``train`` / ``eval`` / ``bench``
    ``<family>``, "" for a verb of the family's own (``generate``), or another noun (``export hf``). A family's
    ``train`` command runs the shared loop through its module's global ``train`` (``bench faults`` wraps it there).
    ``loaders``: the module with ``check_data(data, progress=…)`` (every bad file and its reason in one pass; None:
    no dataset to check). ``offline_default``: the module with ``resolve_data(data, progress=…)`` (None or the
    default's name → the offline default, made once into the cache; a folder → checked to exist); None: the data
    is checked as given. ``check``: what ``check-data`` scans, from its options — (the data ``check_data`` takes,
    its keyword arguments), or None where there is nothing to scan (it says why); None: the one folder given, or
    the offline default. ``comparisons``: what ``bench parity`` compares and judges
    (:class:`~polymixer.experiments.bench.comparison.Comparison`, in the table's order). ``tables``: the guides'
    tables it generates, by name. ``untimed``: its ``bench`` nouns that time nothing (no warning about a busy
    machine)."""

    family: Family
    commands: Dict[Tuple[str, str], Command]
    loaders: Optional[str] = None
    offline_default: Optional[str] = None
    default_data: Optional[str] = None  # the offline default's name for --data
    check: Optional[Callable[[argparse.Namespace], Optional[Tuple[Any, Dict[str, Any]]]]] = None
    comparisons: Tuple[Any, ...] = ()
    faults: Optional[FaultRecipe] = None
    tables: Dict[str, Table] = field(default_factory=dict)
    untimed: Tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.family.name

    def command(self, verb: str) -> Command:
        """The family's ``polymixer <verb> <family>``; a ValueError naming the verbs it has otherwise."""
        found = self.commands.get((verb, self.name))
        if found is None:
            verbs = [v for v, noun in self.commands if noun == self.name]
            raise ValueError(f"the {self.name} family has no command `polymixer {verb} {self.name}` "
                             f"(its commands: {', '.join(verbs) or 'none'})")
        return found


def _load(target: str, where: str) -> LabFamily:
    """The registration ``module:NAME`` names, its family added to the library's table."""
    module, _, name = target.partition(":")
    try:
        found = getattr(importlib.import_module(module), name or "FAMILY")
    except (ImportError, AttributeError) as e:
        raise ImportError(f"the family registration {target} ({where}) does not load: {e}") from e
    if not isinstance(found, LabFamily):
        raise TypeError(f"{target} ({where}) is a {type(found).__name__}, not a polymixer.experiments.registry."
                        f"LabFamily")
    add_family(found.family)
    return found


@functools.lru_cache(maxsize=None)
def families() -> Dict[str, LabFamily]:
    """Every registered family by name: the built-in ones in the table's order, then those of other packages (their
    entry points, by name). Loaded once per process."""
    found = {name: _load(f"polymixer.experiments.{name}.family:FAMILY", "built in") for name in BUILT_IN}
    for point in sorted(entry_points(group=ENTRY_POINTS), key=lambda p: p.name):
        fam = _load(point.value, f"entry point {point.name!r} of {ENTRY_POINTS}")
        if fam.name != point.name or fam.name in found:
            raise ValueError(f"entry point {point.name!r} of {ENTRY_POINTS} registers the family {fam.name!r}: "
                             + ("a family of that name is registered already" if fam.name in found
                                else "the entry point must carry the family's name"))
        found[fam.name] = fam
    return found


def lab_family(name: str) -> LabFamily:
    """A registered family by its name or an earlier one; a ValueError listing them otherwise."""
    found = families().get(canonical_family(name))
    if found is None:
        raise ValueError(f"unknown model family {name!r}; the families are {', '.join(families())}")
    return found


def trainable() -> Tuple[str, ...]:
    """The families ``polymixer train`` trains (those with a train command), in the table's order."""
    return tuple(name for name, fam in families().items() if ("train", name) in fam.commands)


def comparisons() -> Tuple[Any, ...]:
    """Every family's comparisons, in the table's order (each family's in its own order)."""
    return tuple(c for fam in families().values() for c in fam.comparisons)


def guide_tables() -> Dict[str, Table]:
    """Every family's guide tables by name; a name two families register is a ValueError."""
    out: Dict[str, Table] = {}
    for fam in families().values():
        twice = sorted(set(out) & set(fam.tables))
        if twice:
            raise ValueError(f"the {fam.name} family registers the guide table {twice[0]!r} another family does")
        out.update(fam.tables)
    return out
