"""The value-carrying PoM — the public names of :mod:`polymixer.ops.value_pom` and
:mod:`polymixer.ops.gated_value_pom`, kept here.

:func:`value_pom` (``value_pom(x, ValuePomWeights(...), heads=…)``; a layer's ``ValuePoM.weights``) and
:func:`gated_value_pom` (with :class:`GatedValuePomWeights`) dispatch to a backend, and with ``state=`` mix the next
chunk of a stream; :func:`value_mix` and :func:`packed_causal_mix` are the mixing of the value PoM's torch form
(:mod:`polymixer.ops.value_pom.modular`, which explains the math), :func:`token_shift` and :func:`pad_packed` pieces
every backend shares (:mod:`polymixer.ops.features`).
"""

from __future__ import annotations

from .ops.features import CHUNK, EPS, pad_packed, token_shift
from .ops.gated_value_pom import GatedValuePomWeights, gated_value_pom
from .ops.value_pom import ValuePomWeights, value_pom
from .ops.value_pom.modular import packed_causal_mix, value_mix

__all__ = ["value_pom", "ValuePomWeights", "gated_value_pom", "GatedValuePomWeights", "value_mix",
           "packed_causal_mix", "token_shift", "pad_packed", "CHUNK", "EPS"]
