"""The gated value-carrying PoM as an op with backends: :func:`gated_value_pom` (parallel, every self-mixing mode)
and :func:`gated_value_pom_step` (streaming). The math is :mod:`polymixer.ops.gated_value_pom.modular`.

The front end validates a call once (:func:`polymixer.ops.value_pom.call.make_gated_call`: the value PoM's checks,
self-mixing only, the decay's shapes, no explicit (B, M, N) mask) and hands the typed call — a
:class:`~polymixer.ops.value_pom.call.ValueCall` with its decay — to the backend the dispatcher picks for
``"gated_value_pom"``: ``triton`` (:mod:`~polymixer.ops.gated_value_pom.triton_kernels`, the scan in Triton kernels:
CUDA tensors, or CPU tensors under TRITON_INTERPRET=1 with ``backend("triton")``), else ``torch``
(:mod:`~polymixer.ops.gated_value_pom.modular`); ``reference`` (the float64 oracle) by an explicit choice only.
Streaming steps (``"gated_value_pom_step"``) run the torch form.
``backend_for`` says which backend a call gets and why the others were passed over.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from torch import Tensor

from .. import dispatch
from ..common import STEP_MODES, Mixing, triton_possible, triton_precheck
from ..parallel import active
from ..value_pom.call import ValueCall, make_gated_call, make_step_call
from ..value_pom.features import CHUNK, decay_logs
from . import modular as gated_modular, modular_step as gated_modular_step, reference as gated_reference
from .modular import gated_mix, gated_scan, reference_gated, retnet_bias

__all__ = ["gated_value_pom", "gated_value_pom_step", "gated_call", "backend_for", "retnet_bias", "decay_logs",
           "gated_scan", "gated_mix", "reference_gated"]


def gated_call(x: Tensor, context: Optional[Tensor], in_weight: Tensor, gate_bias: Tensor, coeff: Tensor,
               coeff_q: Tensor, shift_weight: Optional[Tensor], norm_weight: Tensor, out_weight: Tensor,
               out_bias: Optional[Tensor], decay_weight: Tensor, decay_bias: Tensor, *, heads: int = 1,
               chunk: int = CHUNK, **modes: Any) -> ValueCall:
    """The validated call of :func:`gated_value_pom`'s arguments (what its backends receive). Under
    ``polymixer.context_parallel``: NotImplementedError (a decayed state would need a decayed prefix across ranks)."""
    if active() is not None:
        raise NotImplementedError("the gated value PoM has no context-parallel form yet (its decayed states would "
                                  "need a decayed prefix across ranks): mix it outside polymixer.context_parallel")
    mixing = Mixing.of("gated_call", modes)
    weights = (in_weight, gate_bias, coeff, coeff_q, shift_weight, norm_weight, out_weight, out_bias)
    return make_gated_call(x, context, weights, decay_weight, decay_bias, mixing, heads, chunk)


def gated_value_pom(x: Tensor, context: Optional[Tensor], in_weight: Tensor, gate_bias: Tensor, coeff: Tensor,
                    coeff_q: Tensor, shift_weight: Optional[Tensor], norm_weight: Tensor, out_weight: Tensor,
                    out_bias: Optional[Tensor], decay_weight: Tensor, decay_bias: Tensor, *, heads: int = 1,
                    chunk: int = CHUNK, **modes: Any) -> Tensor:
    """The gated value-carrying PoM (:mod:`polymixer.ops.gated_value_pom.modular`): the value PoM's arguments plus
    ``decay_weight`` (H, d) and ``decay_bias`` (H,), on the backend the dispatcher picks. ``reduction`` is accepted
    for the common signature (the readout's RMSNorm makes it moot)."""
    call = gated_call(x, context, in_weight, gate_bias, coeff, coeff_q, shift_weight, norm_weight, out_weight,
                      out_bias, decay_weight, decay_bias, heads=heads, chunk=chunk, **modes)
    return dispatch.choose("gated_value_pom", call).forward(call)


def gated_value_pom_step(x: Tensor, state: Tensor, count: Tensor, offset: Tensor, prev: Tensor, in_weight: Tensor,
                         gate_bias: Tensor, coeff: Tensor, coeff_q: Tensor, shift_weight: Optional[Tensor],
                         norm_weight: Tensor, out_weight: Tensor, out_bias: Optional[Tensor], decay_weight: Tensor,
                         decay_bias: Tensor, *, heads: int = 1, chunk: int = CHUNK,
                         **modes: Any) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Streaming (causal): a chunk (B, T, d) after ``state``; returns (y, state, count, offset, prev). O(1) state."""
    mixing = Mixing.of("gated_value_pom_step", modes, STEP_MODES, causal=True)
    weights = (in_weight, gate_bias, coeff, coeff_q, shift_weight, norm_weight, out_weight, out_bias)
    call = make_step_call(x, state, count, offset, prev, weights, mixing, heads, chunk, (decay_weight, decay_bias))
    return dispatch.choose("gated_value_pom_step", call).forward(call)


def backend_for(*args: Any, **kwargs: Any) -> Dict[str, Any]:
    """Which backend :func:`gated_value_pom` would run these arguments on, and why the others were passed over."""
    return dispatch.backend_for("gated_value_pom", gated_call(*args, **kwargs))


# the backends: the Triton scan imported with this module wherever it could run (a GPU or the interpreter), so that
# torch.compile finds it imported; taken wherever its device allows (no measurement decides: it replaces a Python
# loop over chunks)
dispatch.register("gated_value_pom", "reference", gated_reference)
dispatch.register("gated_value_pom", "torch", gated_modular)
dispatch.register("gated_value_pom", "triton", "polymixer.ops.gated_value_pom.triton_kernels", precheck=triton_precheck,
                  eager=triton_possible())
dispatch.register("gated_value_pom_step", "torch", gated_modular_step)
