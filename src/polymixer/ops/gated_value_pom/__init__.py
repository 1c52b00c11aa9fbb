"""The gated value-carrying PoM as an op with backends: :func:`gated_value_pom` mixes a sequence in every
self-mixing mode and, given a stream's state, the next chunk of that (causal) stream. The math is
:mod:`.modular`.

The front end validates a call once (:func:`~polymixer.ops.gated_value_pom.call.make_gated_call`: the value PoM's
checks, self-mixing only, the decay's shapes, no explicit (B, M, N) mask) into a :class:`~polymixer.ops.call.Call`
and hands it to the backend the dispatcher picks: ``triton`` (:mod:`.triton_kernels`, the scan in Triton kernels:
CUDA tensors, or CPU tensors under TRITON_INTERPRET=1 with ``backend("triton")``), else ``torch`` (:mod:`.modular`,
the streams too); ``reference`` (:mod:`.reference`, the float64 oracle) by an explicit choice only. It has no
``cpu`` backend (the torch form's chunked scan is the CPU path: no per-token walk to fuse) and no context-parallel
form (a decayed state would need a decayed prefix across ranks). ``backend_for`` says which backend a call gets and
why the others were passed over.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Union

from torch import Tensor

from .. import dispatch
from ..call import Call, PoMState
from ..common import triton_possible, triton_precheck
from ..features import CHUNK
from ..parallel import active
from . import modular, reference
from .call import GatedValuePomWeights, make_gated_call, retnet_bias

__all__ = ["GatedValuePomWeights", "gated_value_pom", "backend_for", "retnet_bias"]


def gated_value_pom(x: Tensor, weights: GatedValuePomWeights, context: Optional[Tensor] = None, *, heads: int = 1,
                    chunk: int = CHUNK, state: Optional[PoMState] = None, **modes: Any
                    ) -> Union[Tensor, Tuple[Tensor, PoMState]]:
    """The gated value-carrying PoM (:mod:`polymixer.ops.gated_value_pom.modular`): the value PoM's arguments
    (:func:`polymixer.ops.value_pom.value_pom`) with the layer's :class:`GatedValuePomWeights` (its decay too), on
    the backend the dispatcher picks; a stream (``state``) is causal. ``reduction`` is accepted for the common
    signature (the readout's RMSNorm makes it moot)."""
    call = _call(x, weights, context, state, modes, heads, chunk)
    return call.result(dispatch.choose("gated_value_pom", call).forward(call))


def _call(x: Tensor, weights: GatedValuePomWeights, context: Optional[Tensor], state: Optional[PoMState],
          modes: Dict[str, Any], heads: int, chunk: int) -> Call:
    """The validated call; under ``polymixer.context_parallel`` a NotImplementedError."""
    if active() is not None:
        raise NotImplementedError("the gated value PoM has no context-parallel form yet (its decayed states would "
                                  "need a decayed prefix across ranks): mix it outside polymixer.context_parallel")
    return make_gated_call(x, weights, context, modes, state, heads, chunk)


def backend_for(x: Tensor, weights: GatedValuePomWeights, context: Optional[Tensor] = None, *, heads: int = 1,
                chunk: int = CHUNK, state: Optional[PoMState] = None, **modes: Any) -> Dict[str, Any]:
    """Which backend :func:`gated_value_pom` would run these arguments on, and why the others were passed over."""
    return dispatch.backend_for("gated_value_pom", _call(x, weights, context, state, modes, heads, chunk))


# the backends: the Triton scan imported with this module wherever it could run (a GPU or the interpreter), so that
# torch.compile finds it imported; taken wherever its device allows (no measurement decides: it replaces a Python
# loop over chunks)
dispatch.register("gated_value_pom", "reference", reference)
dispatch.register("gated_value_pom", "torch", modular)
dispatch.register("gated_value_pom", "triton", "polymixer.ops.gated_value_pom.triton_kernels",
                  precheck=triton_precheck, eager=triton_possible())
dispatch.absent("gated_value_pom", "cpu", "no fused CPU form: the torch form's chunked scan is the CPU path")
dispatch.absent("gated_value_pom", "triton_gemm", "no fused-projection kernels: the input projection is cuBLAS's")
