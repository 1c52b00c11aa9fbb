"""PoM as an op with several backends: :func:`pom` mixes a sequence in every mode and, given a stream's state, the
next chunk of that stream.

The front end validates a call once (:func:`~polymixer.ops.pom.call.make_pom_call`) into a
:class:`~polymixer.ops.call.Call` and hands it to the backend the dispatcher picks (:mod:`polymixer.ops.dispatch`):
``reference`` (:mod:`.reference`, the float64 oracle), ``torch`` (:mod:`.modular`: every device and mode, and the
streams), ``cpu`` (:mod:`.fused_cpu`, fused tiles), ``triton`` and ``triton_gemm`` (:mod:`.triton_kernels`,
:mod:`.triton_gemm`: GPU kernels, their tiles in :mod:`.tiles` and their cost model in :mod:`.cost`). Under
:func:`polymixer.context_parallel`, :mod:`.context_parallel` mixes this rank's slice.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Union

from torch import Tensor

from .. import dispatch, measured, parallel
from ..call import PoMState, validated
from ..common import triton_possible, triton_precheck
from . import context_parallel, cost, fused_cpu, modular, reference
from .call import PomWeights, make_pom_call

__all__ = ["PomWeights", "pom", "backend_for"]


def pom(x: Tensor, weights: PomWeights, context: Optional[Tensor] = None, *, state: Optional[PoMState] = None,
        **modes: Any) -> Union[Tensor, Tuple[Tensor, PoMState]]:
    """The Polynomial Mixer: ``y = W_o (gate(W_s x + b) ⊙ agg_visible(poly(act(W_h c))))``, on the backend the
    dispatcher picks (see :mod:`polymixer.ops.dispatch`).

    Args:
        x: (B, M, d) queries (and context when ``context`` is None). With ``cu_seqlens`` also (T, d).
        weights: the layer's :class:`PomWeights` (``PoM.weights``).
        context: (B, N, d) context for cross-mixing, or None for self-mixing.
        state: a stream's :class:`~polymixer.ops.call.PoMState` (``PoM.init_state``): ``x`` (B, T, d) is its next
            chunk, every token sees the state's past too; ``causal=False`` makes the chunk one block (block-causal
            streaming). The modes of a stream: causal, mask ((B, T) key padding), positions (default: the stream
            index), activation, gate, reduction, rope, rope_base.
        mask: (B, N) key padding or (B, M, N) general, bool, True = takes part.
        causal / block_size: causal or block-causal masking (see :func:`polymixer.ops.features.aggregate`).
        cu_seqlens: int32 offsets of packed sequences; a pair (cu_q, cu_k) for packed cross-mixing.
        positions / context_positions: rotary positions of queries / context tokens
            ((N,) or (B, N) for rope="1d"; (N, 2) or (B, N, 2) for rope="2d"). Default: token index (in its sequence).
        rope: None, "1d" or "2d": rotate each context token's features by its position before aggregation and
            read the aggregate in each query's own frame, so interactions depend on relative position only.

    Returns:
        (B, M, d) — or (T, d) when a 2-D packed input was given; with ``state``, (y, the state after ``x``).
    """
    cp = parallel.active()
    if cp is not None:  # this rank's slice of every sequence; a stream's: a causal prefill (polymixer.context_parallel)
        call, problem = validated(make_pom_call, x, weights, context, modes, state)
        y, after = context_parallel.forward(call, problem, cp)
        return y if state is None else (y, after)
    call = make_pom_call(x, weights, context, modes, state)
    return call.result(dispatch.choose("pom", call).forward(call))


def backend_for(x: Tensor, weights: PomWeights, context: Optional[Tensor] = None, *,
                state: Optional[PoMState] = None, **modes: Any) -> Dict[str, Any]:
    """Which backend :func:`pom` would run these arguments on, and why the others were passed over."""
    return dispatch.backend_for("pom", make_pom_call(x, weights, context, modes, state))


# the backends (the Triton ones imported only where they could run, and taken automatically only where measured —
# or, for the unfused kernels without a measurement, modelled — faster: polymixer.ops.measured)
dispatch.register("pom", "reference", reference)
dispatch.register("pom", "torch", modular)
dispatch.register("pom", "cpu", fused_cpu)
dispatch.register("pom", "triton", "polymixer.ops.pom.triton_kernels", precheck=triton_precheck,
                  eager=triton_possible(), speed=measured.rule("pom", "triton", model=cost.pom_kernels_vs_torch))
dispatch.register("pom", "triton_gemm", "polymixer.ops.pom.triton_gemm", precheck=triton_precheck,
                  eager=triton_possible(), speed=measured.rule("pom", "triton_gemm"))
