"""The statistics a parity verdict settles on: the mean of the per-seed paired gaps between a model and attention and
its 95% Student-t interval, and what that interval says against a target's bound.

For n paired gaps g_1 … g_n (each seed's gap, both models trained on that seed at their own chosen rates), the mean
is ḡ = Σ g_i / n, the sample deviation s = √(Σ (g_i − ḡ)² / (n − 1)), and the 95% interval ḡ ± t_{0.975, n−1} · s / √n
(Student's t with n − 1 degrees of freedom). The quantile comes from scipy (the lab extra) where it is installed, else
from the table below (1 to 10 degrees of freedom: a verdict runs at most :data:`MAX_SEEDS` seeds).
"""

from __future__ import annotations

import math
from statistics import mean, stdev
from typing import Optional, Sequence, Tuple

__all__ = ["MAX_SEEDS", "T975", "t975", "paired_interval", "settle"]

MAX_SEEDS = 5  # seeds a verdict adds, one at a time, while its interval straddles the bound

# Student's t, two-sided 95% (the 0.975 quantile), by degrees of freedom
T975 = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 6: 2.4469, 7: 2.3646, 8: 2.3060, 9: 2.2622,
        10: 2.2281}


def t975(dof: int) -> float:
    """The 0.975 quantile of Student's t with ``dof`` degrees of freedom (scipy's where installed, else the table,
    which covers 1 to 10)."""
    if dof < 1:
        raise ValueError(f"Student's t needs at least 1 degree of freedom, got {dof}")
    try:
        from scipy.stats import t
    except ImportError:
        if dof not in T975:
            raise ValueError(f"Student's t at {dof} degrees of freedom needs scipy (pip install polymixer[lab]); "
                             f"the built-in table covers 1 to {max(T975)}") from None
        return T975[dof]
    return float(t.ppf(0.975, dof))


def paired_interval(gaps: Sequence[float]) -> Optional[Tuple[float, float, float]]:
    """(mean, low, high): the mean of the paired gaps and its 95% Student-t interval; None under 2 gaps (no
    interval)."""
    if len(gaps) < 2:
        return None
    if not all(math.isfinite(g) for g in gaps):
        raise ValueError(f"paired gaps must be finite numbers, got {list(gaps)}")
    centre = mean(gaps)
    half = t975(len(gaps) - 1) * stdev(gaps) / math.sqrt(len(gaps))
    return centre, centre - half, centre + half


def settle(low: float, high: float, bound: float, at_least: bool) -> str:
    """"met" where the whole interval [low, high] lies inside the target (a gap at most ``bound``, or at least it
    where ``at_least``: accuracy points), "MISSED" where it lies wholly outside, else "unsettled". An interval that
    touches the bound is inside it (the target allows the bound itself)."""
    if at_least:
        return "met" if low >= bound else "MISSED" if high < bound else "unsettled"
    return "met" if high <= bound else "MISSED" if low > bound else "unsettled"
