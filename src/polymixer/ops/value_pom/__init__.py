"""The value-carrying PoM as an op with several backends: :func:`value_pom` mixes a sequence in every mode and, given
a stream's state, the next chunk of that stream; the gated form (a decay per head) is
:mod:`polymixer.ops.gated_value_pom`.

The front end validates a call once (:func:`~polymixer.ops.value_pom.call.make_value_call`) into a
:class:`~polymixer.ops.call.Call` and hands it to the backend the dispatcher picks (:mod:`polymixer.ops.dispatch`):
``reference`` (:mod:`.reference`, the float64 oracle), ``torch`` (:mod:`.modular`: every device and mode, and the
streams), ``triton`` (:mod:`.triton_kernels`, GPU kernels of the mixing). It has no ``cpu`` backend: the torch form's
chunked matrix products are already the fused CPU path's kind of work (no per-token (B, N, D) walk to fuse). The
backends share the feature maps and the readout (:mod:`polymixer.ops.features`) and differ only in the mixing.
Under :func:`polymixer.context_parallel`, :mod:`.context_parallel` mixes this rank's slice.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Union

from torch import Tensor

from .. import dispatch, measured, parallel
from ..call import PoMState, validated
from ..common import triton_possible, triton_precheck
from ..features import CHUNK
from . import context_parallel, modular, reference
from .call import ValuePomWeights, make_value_call

__all__ = ["ValuePomWeights", "value_pom", "backend_for"]


def value_pom(x: Tensor, weights: ValuePomWeights, context: Optional[Tensor] = None, *, heads: int = 1,
              chunk: int = CHUNK, state: Optional[PoMState] = None, **modes: Any
              ) -> Union[Tensor, Tuple[Tensor, PoMState]]:
    """The value-carrying PoM (see :mod:`polymixer.ops.value_pom.modular`) with every mode keyword of
    :func:`polymixer.ops.pom.pom`, on the backend the dispatcher picks.

    Args:
        weights: the layer's :class:`ValuePomWeights` (``ValuePoM.weights``).
        heads: H, which splits D and dv (state D·dv/H floats per sequence).
        chunk: tokens per chunk of the (block-)causal form.
        state: a stream's :class:`~polymixer.ops.call.PoMState` (``ValuePoM.init_state``): ``x`` (B, T, d) is its
            next chunk, as :func:`polymixer.ops.pom.pom` streams (``causal=False``: the chunk is one block).

    Returns:
        (B, M, d), or (T, d) for a 2-D packed input; with ``state``, (y, the state after ``x``).
    """
    cp = parallel.active()
    if cp is not None:  # this rank's slice of every sequence; a stream's: a causal prefill (polymixer.context_parallel)
        call, problem = validated(make_value_call, x, weights, context, modes, state, heads, chunk)
        y, after = context_parallel.forward(call, problem, cp)
        return y if state is None else (y, after)
    call = make_value_call(x, weights, context, modes, state, heads, chunk)
    return call.result(dispatch.choose("value_pom", call).forward(call))


def backend_for(x: Tensor, weights: ValuePomWeights, context: Optional[Tensor] = None, *, heads: int = 1,
                chunk: int = CHUNK, state: Optional[PoMState] = None, **modes: Any) -> Dict[str, Any]:
    """Which backend :func:`value_pom` would run these arguments on, and why the others were passed over."""
    return dispatch.backend_for("value_pom", make_value_call(x, weights, context, modes, state, heads, chunk))


# the backends: the kernels imported with the package wherever they could run (a GPU or the interpreter), so that a
# strict backend("triton") works inside torch.compile from the first call (dynamo cannot trace an import), and taken
# automatically only where a GPU measured them faster (polymixer.ops.measured)
dispatch.register("value_pom", "reference", reference)
dispatch.register("value_pom", "torch", modular)
dispatch.register("value_pom", "triton", "polymixer.ops.value_pom.triton_kernels", precheck=triton_precheck,
                  eager=triton_possible(), speed=measured.rule("value_pom", "triton"))
dispatch.absent("value_pom", "cpu", "no fused CPU form: the torch form's chunked products are the CPU path")
dispatch.absent("value_pom", "triton_gemm", "no fused-projection kernels: the input projection is cuBLAS's")
