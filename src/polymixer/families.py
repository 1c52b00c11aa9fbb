"""The table of model families: each family's name, what one model of it is, its tiny preset and its earlier names.

A family has one name everywhere: the registry's and a checkpoint's ``family``, its model file, its experiment
folder, its guide ``docs/<name>.md`` and its command-line noun (``polymixer train <name>``). Earlier names stay as
``aliases``: older checkpoints (``"family": "ptv3"``) load and older commands (``polymixer train 3d``) run. The
families shipped here (:data:`BUILT_IN`) live in ``polymixer.models.<name>`` and ``polymixer.experiments.<name>``;
another package's family joins with :func:`add_family` before it registers its presets. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

__all__ = ["Family", "FAMILIES", "BUILT_IN", "add_family", "family", "canonical_family"]


@dataclass(frozen=True)
class Family:
    name: str  # the one name: registry, checkpoints, modules, CLI noun, docs/<name>.md
    title: str  # what one model of the family is, with its article ("a language model")
    tiny: Optional[str]  # the tiny preset `polymixer train <name>` starts from (None: no train command)
    aliases: Tuple[str, ...] = ()  # earlier names of the family: checkpoints and commands that still work


# every known family by name, in the order tables list them: the built-in ones, then those added (add_family)
FAMILIES: Dict[str, Family] = {f.name: f for f in (
    Family("lm", "a language model", "tiny-pom"),
    Family("recall", "a multi-query associative recall model", None),
    Family("image", "an image generator", "tiny-sipom", aliases=("dit",)),
    Family("ocr", "a handwriting recogniser", "tiny-htr-vpom", aliases=("htr",)),
    Family("eo", "a crop-type segmenter of satellite time series", "tiny-tsvipom", aliases=("tsvit",)),
    Family("points", "a point-cloud segmenter", "tiny-ppomv3", aliases=("3d", "ptv3")),
)}
BUILT_IN: Tuple[str, ...] = tuple(FAMILIES)

_ALIASES: Dict[str, str] = {a: f.name for f in FAMILIES.values() for a in (f.name, *f.aliases)}


def add_family(fam: Family) -> Family:
    """Add a family from another package to the table (its presets can then be registered under its name); adding
    the same entry again does nothing. A name or earlier name another family holds is a ValueError."""
    if FAMILIES.get(fam.name) == fam:
        return fam
    if fam.name in FAMILIES:
        raise ValueError(f"another family named {fam.name!r} is in the table already")
    taken = [a for a in fam.aliases if a in _ALIASES]
    if taken:
        raise ValueError(f"family {fam.name!r}: {taken[0]!r} already names the family {_ALIASES[taken[0]]!r}")
    FAMILIES[fam.name] = fam
    _ALIASES.update({a: fam.name for a in (fam.name, *fam.aliases)})
    return fam


def canonical_family(name: str) -> str:
    """The family's current name for ``name`` or one of its earlier names; other names pass through unchanged
    (tasks that are not model families, e.g. a distillation stage, keep their own)."""
    return _ALIASES.get(name, name)


def family(name: str) -> Family:
    """The table entry of a family by its name or an earlier one; a ValueError listing the families otherwise."""
    key = _ALIASES.get(name)
    if key is None:
        raise ValueError(f"unknown model family {name!r}; the families are {', '.join(FAMILIES)}")
    return FAMILIES[key]
