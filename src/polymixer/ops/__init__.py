"""The operations of polymixer, each with its backends side by side (the oracle, the device-agnostic torch form, the
fused CPU form, the Triton kernels) behind one dispatcher.

    ops.pom: pom(x, PomWeights, …)                         the Polynomial Mixer
    ops.value_pom: value_pom(x, ValuePomWeights, …)        the value-carrying PoM
    ops.gated_value_pom: gated_value_pom(x, GatedValuePomWeights, …)  the value PoM with a decay per head
    backend("triton") / backend_for(...)                   choose a backend explicitly / ask which one a call gets

Every op has one signature for training and decoding: ``op(x, weights, context=None, *, state=None, **modes)`` — the
weights one object (a layer builds it: ``layer.weights``), the mode keywords of :class:`Mixing`, and a stream's
:class:`PoMState` (then the op returns ``(y, the state after x)``; :mod:`polymixer.ops.call`).
(``polymixer.functional.pom`` and ``polymixer.values.value_pom`` are the same functions.)

The building blocks (non-linearities, checks, packing, rotary positions in :mod:`polymixer.ops.common`; polynomial
features, prefix sums, aggregation, gating, the value PoM's feature maps in :mod:`polymixer.ops.features`) are
public, and so are the float64 oracles (each op's ``reference.py``, their shared pieces in
:mod:`polymixer.ops.reference`).
"""

from typing import Any, Dict

from .call import PoMState
from .common import ROPE_BASE, Mixing
from .dispatch import BACKENDS, backend, current_backend, disabled_backends
from . import gated_value_pom, pom, value_pom  # the ops' packages (registering their backends)
from .gated_value_pom import GatedValuePomWeights
from .pom import PomWeights
from .value_pom import ValuePomWeights

__all__ = ["pom", "value_pom", "gated_value_pom", "PomWeights", "ValuePomWeights", "GatedValuePomWeights",
           "PoMState", "backend", "backend_for", "current_backend", "disabled_backends", "BACKENDS", "Mixing",
           "ROPE_BASE"]

_OPS = {"pom": pom, "value_pom": value_pom, "gated_value_pom": gated_value_pom}


def backend_for(op: str, *args: Any, **kwargs: Any) -> Dict[str, Any]:
    """Which backend ``op`` ("pom", "value_pom" or "gated_value_pom") would run these arguments on, and why the
    others were passed over: {"backend", "explicit", "passed_over": {backend: reason}, and for a Triton route taken
    automatically the speed rule that decided — "rule" ("table entry", "model" or "no measurement",
    :mod:`polymixer.ops.measured`) and "reason"}."""
    if op not in _OPS:
        raise ValueError(f"unknown op {op!r}; backend_for knows 'pom', 'value_pom' and 'gated_value_pom'")
    return _OPS[op].backend_for(*args, **kwargs)
