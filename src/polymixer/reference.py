"""The float64 oracles every fast path is tested against — the public names of :mod:`polymixer.ops.reference`,
kept here."""

from __future__ import annotations

from .ops.reference import reference_attention, reference_pom, reference_value_pom, shift_validity, visibility

__all__ = ["visibility", "reference_pom", "reference_value_pom", "shift_validity", "reference_attention"]
