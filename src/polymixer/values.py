"""The value-carrying PoM — the public names of :mod:`polymixer.ops.value_pom`, kept here.

:func:`value_pom` / :func:`value_pom_step` dispatch to a backend; :func:`value_mix` and :func:`packed_causal_mix` are
the mixing of its torch form (:mod:`polymixer.ops.value_pom.modular`, which explains the math), :func:`token_shift`
and :func:`pad_packed` pieces every backend shares (:mod:`polymixer.ops.value_pom.features`).
"""

from __future__ import annotations

from .ops.value_pom import value_pom, value_pom_step
from .ops.value_pom.features import CHUNK, EPS, pad_packed, token_shift
from .ops.value_pom.modular import packed_causal_mix, value_mix

__all__ = ["value_pom", "value_pom_step", "value_mix", "packed_causal_mix", "token_shift", "pad_packed", "CHUNK",
           "EPS"]
