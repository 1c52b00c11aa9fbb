"""The recall family's registration (:class:`~polymixer.experiments.registry.LabFamily`): its bench (MQAR, no
train command: the bench trains its own 2-layer models), what ``bench parity`` compares and its guides' tables."""

from __future__ import annotations

from ...families import family
from ..registry import Command, LabFamily
from .tables import TABLES
from .targets import RECALL, RECALL_ZOOLOGY

__all__ = ["FAMILY"]

FAMILY = LabFamily(
    family("recall"),
    commands={
        ("bench", "recall"): Command(
            "MQAR recall: accuracy vs state size for PoM, value-carrying PoM, attention, Based, …",
            "polymixer.experiments.recall.bench",
            "Zoology's multi-query associative recall: 2-layer models of many mixers trained on MQAR, accuracy "
            "against state floats per layer (L = 64, K = 16) and against sequence length, several seeds."),
    },
    comparisons=(RECALL, RECALL_ZOOLOGY),
    tables=TABLES,
    untimed=("recall",),
)
