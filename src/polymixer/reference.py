"""The float64 oracles every fast path is tested against — the public names of each op's ``reference.py`` and of
:mod:`polymixer.ops.reference`, kept here."""

from __future__ import annotations

from .ops.gated_value_pom.reference import reference_gated
from .ops.pom.reference import reference_pom
from .ops.reference import reference_attention, shift_validity, visibility
from .ops.value_pom.reference import reference_value_pom

__all__ = ["visibility", "reference_pom", "reference_value_pom", "reference_gated", "shift_validity",
           "reference_attention"]
