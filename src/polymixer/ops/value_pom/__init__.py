"""The value-carrying PoM as an op with several backends: :func:`value_pom` (parallel, every mode) and
:func:`value_pom_step` (streaming); the gated form (a decay per head) is :mod:`polymixer.ops.gated_value_pom`.

The front end validates a call once (:func:`make_value_call`, :mod:`polymixer.ops.value_pom.call`), normalises it
into a :class:`ValueCall` and hands it to the backend the dispatcher picks (:mod:`polymixer.ops.dispatch`):
``reference`` (float64 oracle), ``torch`` (:mod:`~polymixer.ops.value_pom.modular`, every device and mode),
``triton`` (:mod:`~polymixer.ops.value_pom.triton_kernels`, GPU kernels of the mixing). The backends share the
feature maps and the readout (:mod:`polymixer.ops.value_pom.features`) and differ only in the mixing.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from torch import Tensor

from .. import dispatch, parallel
from ..common import STEP_MODES, Mixing
from .call import StepCall, ValueCall, make_step_call, make_value_call
from .features import CHUNK

__all__ = ["ValueCall", "StepCall", "make_value_call", "value_call", "value_pom", "value_pom_step", "backend_for",
           ]


def value_call(x: Tensor, context: Optional[Tensor], in_weight: Tensor, gate_bias: Tensor, coeff: Tensor,
               coeff_q: Tensor, shift_weight: Optional[Tensor], norm_weight: Tensor, out_weight: Tensor,
               out_bias: Optional[Tensor] = None, *, heads: int = 1, chunk: int = CHUNK, **modes: Any) -> ValueCall:
    """The validated :class:`ValueCall` of :func:`value_pom`'s arguments (what its backends receive)."""
    mixing = Mixing.of("value_call", modes)
    weights = (in_weight, gate_bias, coeff, coeff_q, shift_weight, norm_weight, out_weight, out_bias)
    return make_value_call(x, context, weights, mixing, heads, chunk)


def value_pom(x: Tensor, context: Optional[Tensor], in_weight: Tensor, gate_bias: Tensor, coeff: Tensor,
              coeff_q: Tensor, shift_weight: Optional[Tensor], norm_weight: Tensor, out_weight: Tensor,
              out_bias: Optional[Tensor] = None, *, heads: int = 1, chunk: int = CHUNK, **modes: Any) -> Tensor:
    """The value-carrying PoM (see :mod:`polymixer.ops.value_pom.modular`) with every mode keyword of
    :func:`polymixer.functional.pom`, on the backend the dispatcher picks.

    Args:
        in_weight: (2D + dv + Ds, d), W_k over W_v over W_q over W_s. Self-mixing does one matrix product.
        coeff / coeff_q: (D, k) polynomial coefficients of the keys / queries.
        shift_weight: (W, D + dv) weights of the current and the W − 1 previous tokens in the key / value
            projections (a causal depthwise convolution; W = 2: the token shift), or None (no token shift).
        norm_weight: (dv,) gain of the per-head RMSNorm of the readout.
        out_weight: (d, dv); heads: H, which splits D and dv (state D·dv/H floats per sequence).
        chunk: tokens per chunk of the (block-)causal form.

    Returns:
        (B, M, d), or (T, d) for a 2-D packed input.
    """
    mixing = Mixing.of("value_pom", modes)
    weights = (in_weight, gate_bias, coeff, coeff_q, shift_weight, norm_weight, out_weight, out_bias)
    cp = parallel.active()
    if cp is not None:  # this rank's slice of every sequence (polymixer.context_parallel)
        from .context_parallel import forward as split_forward

        return split_forward(x, context, weights, mixing, heads, chunk, cp)
    call = make_value_call(x, context, weights, mixing, heads, chunk)
    return dispatch.choose("value_pom", call).forward(call)


def value_pom_step(x: Tensor, state: Tensor, count: Tensor, offset: Tensor, prev: Tensor, in_weight: Tensor,
                   gate_bias: Tensor, coeff: Tensor, coeff_q: Tensor, shift_weight: Optional[Tensor],
                   norm_weight: Tensor, out_weight: Tensor, out_bias: Optional[Tensor] = None, *, heads: int = 1,
                   chunk: int = CHUNK, **modes: Any) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Streaming: consume a chunk (B, T, d) given the state of everything before it.

    ``state`` (B, H, D_h, dv_h) and ``count`` (B,) are the running sums, ``offset`` (B,) the stream index of the next
    token, ``prev`` (B, W − 1, D + dv) the last tokens' key / value projections (for the token shift of width W).
    ``causal=False`` makes the chunk one block (block-causal streaming). Returns (y, state, count, offset, prev).
    """
    mixing = Mixing.of("value_pom_step", modes, STEP_MODES, causal=True)
    weights = (in_weight, gate_bias, coeff, coeff_q, shift_weight, norm_weight, out_weight, out_bias)
    cp = parallel.active()
    if cp is not None:  # a context-parallel prefill: the state after each rank's slice (the last rank: all)
        from .context_parallel import step as split_step

        return split_step(x, (state, count, offset, prev), weights, mixing, heads, chunk, cp)
    call = make_step_call(x, state, count, offset, prev, weights, mixing, heads, chunk)
    return dispatch.choose("value_pom_step", call).forward(call)


def backend_for(*args: Any, **kwargs: Any) -> Dict[str, Any]:
    """Which backend :func:`value_pom` would run these arguments on, and why the others were passed over."""
    return dispatch.backend_for("value_pom", value_call(*args, **kwargs))


# the backends of value_pom and value_pom_step: the kernels imported with the package wherever they could run (a GPU
# or the interpreter), so that a strict backend("triton") works inside torch.compile from the first call (dynamo
# cannot trace an import), and taken automatically only where a GPU measured them faster (polymixer.ops.measured)
from .. import measured  # noqa: E402
from ..common import triton_possible, triton_precheck  # noqa: E402
from . import modular, modular_step, reference  # noqa: E402

dispatch.register("value_pom", "reference", reference)
dispatch.register("value_pom", "torch", modular)
dispatch.register("value_pom", "triton", "polymixer.ops.value_pom.triton_kernels", precheck=triton_precheck,
                  eager=triton_possible(), speed=measured.rule("value_pom", "triton"))
dispatch.register("value_pom_step", "torch", modular_step)
