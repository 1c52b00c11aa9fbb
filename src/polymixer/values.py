"""The value-carrying PoM — the public names of :mod:`polymixer.ops.value_pom`, kept here.

:func:`value_pom` / :func:`value_pom_step` dispatch to a backend; :func:`value_mix`, :func:`packed_causal_mix`,
:func:`token_shift` and :func:`pad_packed` are the pieces of its torch form (:mod:`polymixer.ops.value_pom.modular`,
which explains the math).
"""

from __future__ import annotations

from .ops.value_pom import value_pom, value_pom_step
from .ops.value_pom.modular import CHUNK, EPS, packed_causal_mix, pad_packed, token_shift, value_mix

__all__ = ["value_pom", "value_pom_step", "value_mix", "packed_causal_mix", "token_shift", "pad_packed", "CHUNK",
           "EPS"]
