"""The values a numeric setting allows, declared beside the setting and checked where a config is made.

A config dataclass lists its numeric fields' ranges in ``RANGES`` and calls :func:`check_ranges` in its
``__post_init__``: a command line builds its configs before it reads any data, so a bad option is one line naming
the setting and what it allows (``depth must be ≥ 1, got 0``), never a traceback minutes later or a run that trains
nonsense. A setting that means the same in every config (one name per setting: ``dropout``, ``expand``, …) has its
range here once, in ``SHARED`` (a named setting its values, in ``CHOICES``), checked in every config that has it.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple

__all__ = ["Range", "SHARED", "CHOICES", "check_range", "check_ranges"]


class Range(NamedTuple):
    """The values a numeric setting allows: ``low`` … ``high`` (None: unbounded), each end included unless open."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '≥'} {self.low:g}"
        return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"

    def admits(self, value: float) -> bool:
        if not math.isfinite(value):  # NaN or an infinity is no setting's value
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)


# the settings every config that has them shares (a config's own RANGES entry wins): checked by check_ranges
SHARED: Dict[str, Range] = {
    **{n: Range(1) for n in ("degree", "sel_heads", "value_dim", "value_heads")},
    "expand": Range(0, low_open=True), "mlp_ratio": Range(0), "norm_eps": Range(0, low_open=True),
    "dropout": Range(0, 1, high_open=True), "drop_path": Range(0, 1, high_open=True),
}
# the named settings every config that has them shares, and the values each takes (PoM's: polymixer.blocks.PoMSettings)
CHOICES: Dict[str, Tuple[str, ...]] = {"gate": ("hardsigmoid", "sigmoid"), "reduction": ("mean", "sum")}


def check_range(name: str, value: Any, allowed: Range, option: Optional[str] = None) -> None:
    """A one-line ValueError naming the setting (and its command-line ``option``, where it has one) when ``value``
    is outside ``allowed`` or not a number (None passes: an unset optional setting)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not allowed.admits(value):
        shown = f"{name} ({option})" if option else name
        finite = "" if isinstance(value, (int, float)) and math.isfinite(value) else "a finite number "
        raise ValueError(f"{shown} must be {finite}{allowed}, got {value!r}")


def check_ranges(config: Any, ranges: Optional[Mapping[str, Range]] = None) -> None:
    """Check every field of ``config`` that ``ranges`` declares (default: the config's own ``RANGES``, ``SHARED``
    and ``CHOICES`` for its fields of those names); a tuple field (one entry per stage) has each entry checked."""
    if ranges is None:
        for name in [n for n, values in CHOICES.items() if getattr(config, n, values[0]) not in values]:
            raise ValueError(f"{name} must be {' or '.join(map(repr, CHOICES[name]))}, got {getattr(config, name)!r}")
        ranges = {**{n: r for n, r in SHARED.items() if hasattr(config, n)}, **getattr(config, "RANGES", {})}
    for name, allowed in ranges.items():
        value = getattr(config, name)
        if isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                check_range(f"{name}[{i}]", v, allowed)
        else:
            check_range(name, value, allowed)
