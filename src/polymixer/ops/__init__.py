"""The operations of polymixer, each with its backends side by side (the oracle, the device-agnostic torch form, the
fused CPU form, the Triton kernels) behind one dispatcher.

    ops.pom: pom / pom_step                   the Polynomial Mixer, parallel (every mode) and streaming
    ops.value_pom: value_pom / value_pom_step the value-carrying PoM
    ops.gated_value_pom: gated_value_pom(_step)  the value PoM with a decay per head
    backend("triton") / backend_for(...)      choose a backend explicitly / ask which one a call gets

(``polymixer.functional.pom`` and ``polymixer.values.value_pom`` are the same functions; ``ops.pom`` and
``ops.value_pom`` are the packages of the two ops, each with its backends.)

The building blocks (non-linearities, checks, packing, rotary positions, polynomial features, prefix sums,
aggregation, gating) are public in :mod:`polymixer.ops.common` and :mod:`polymixer.ops.features`, and the float64
oracles in :mod:`polymixer.ops.reference`.
"""

from .common import ROPE_BASE, Mixing
from .dispatch import BACKENDS, backend, current_backend, disabled_backends
from . import gated_value_pom, pom, value_pom  # the ops' packages (registering their backends)

__all__ = ["pom", "value_pom", "backend", "backend_for", "current_backend", "disabled_backends", "BACKENDS", "Mixing",
           "ROPE_BASE"]


def backend_for(op: str, *args: object, **kwargs: object) -> dict:
    """Which backend ``op`` ("pom", "value_pom" or "gated_value_pom") would run these arguments on, and why the
    others were passed over: {"backend", "explicit", "passed_over": {backend: reason}, and for a Triton route taken
    automatically the speed rule that decided — "rule" ("table entry", "model" or "no measurement",
    :mod:`polymixer.ops.measured`) and "reason"}."""
    if op == "pom":
        return pom.backend_for(*args, **kwargs)
    if op == "value_pom":
        return value_pom.backend_for(*args, **kwargs)
    if op == "gated_value_pom":
        return gated_value_pom.backend_for(*args, **kwargs)
    raise ValueError(f"unknown op {op!r}; backend_for knows 'pom', 'value_pom' and 'gated_value_pom'")
