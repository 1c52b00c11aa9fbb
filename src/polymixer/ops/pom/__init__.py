"""PoM as an op with several backends: :func:`pom` (parallel, every mode) and :func:`pom_step` (streaming).

The front end validates a call once, normalises it into a :class:`PomCall` and hands it to the backend the dispatcher
picks (:mod:`polymixer.ops.dispatch`): ``reference`` (float64 oracle), ``torch`` (modular, every device and mode),
``cpu`` (fused tiles), ``triton`` (GPU kernels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, NamedTuple, Optional, Tuple

from torch import Tensor

from .. import dispatch, parallel
from ..common import STEP_MODES, Mixing, batch_packed, check_mix_inputs

__all__ = ["PomCall", "make_call", "make_pom_call", "PomStepCall", "pom", "pom_step", "backend_for"]


@dataclass
class PomCall:
    """A validated PoM call: (B, M, d) queries, (B, N, d) context (None: self-mixing), weights, and the mode."""

    x: Tensor
    context: Optional[Tensor]
    in_weight: Tensor  # (D + Ds, d): W_h over W_s
    gate_bias: Tensor  # (Ds,)
    coeff: Tensor  # (D, k)
    out_weight: Tensor  # (d, D)
    out_bias: Optional[Tensor]
    mixing: Mixing  # the mode keywords as given (the masks and offsets normalised below)
    key_mask: Optional[Tensor]  # (B, N) bool
    mask: Optional[Tensor]  # (B, M, N) bool, general visibility
    cu_q: Optional[Tensor]  # packed queries of cross-mixing (None: self-mixing packed, or no packing)
    cu_k: Optional[Tensor]  # packed context offsets
    B: int
    M: int
    N: int

    # the mode, read from ``mixing`` (the backends read these names)
    causal = property(lambda self: self.mixing.causal)
    block_size = property(lambda self: self.mixing.block_size)
    positions = property(lambda self: self.mixing.positions)
    context_positions = property(lambda self: self.mixing.context_positions)
    activation = property(lambda self: self.mixing.activation)
    gate = property(lambda self: self.mixing.gate)
    reduction = property(lambda self: self.mixing.reduction)
    rope = property(lambda self: self.mixing.rope)
    rope_base = property(lambda self: self.mixing.rope_base)

    @property
    def self_mix(self) -> bool:
        return self.context is None

    @property
    def D(self) -> int:
        return self.coeff.shape[0]

    @property
    def Ds(self) -> int:
        return self.in_weight.shape[0] - self.D

    def describe(self) -> str:
        """The call in words, for messages: mode, packing, masks, rotary, dtype and device."""
        return self.mixing.describe(self.x, self.self_mix, self.cu_k is not None, self.key_mask is not None,
                                    self.mask is not None)


def make_call(x: Tensor, context: Optional[Tensor], in_weight: Tensor, gate_bias: Tensor, coeff: Tensor,
              out_weight: Tensor, out_bias: Optional[Tensor] = None, **modes: Any) -> Tuple[PomCall, bool]:
    """Validate a call of :func:`pom` and normalise it: (call, whether a 2-D packed input must lose its batch dim)."""
    mixing = Mixing.of("make_call", modes)
    return make_pom_call(x, context, (in_weight, gate_bias, coeff, out_weight, out_bias), mixing)


def make_pom_call(x: Tensor, context: Optional[Tensor], weights: Tuple[Tensor, Tensor, Tensor, Tensor,
                  Optional[Tensor]], mixing: Mixing) -> Tuple[PomCall, bool]:
    """:func:`make_call` with the mode as one :class:`~polymixer.ops.common.Mixing` and the weights (in_weight,
    gate_bias, coeff, out_weight, out_bias) as one tuple."""
    in_weight, gate_bias, coeff, out_weight, out_bias = weights
    d = out_weight.shape[0]
    D = coeff.shape[0]
    Ds = in_weight.shape[0] - D
    if Ds <= 0 or D % Ds != 0:
        raise ValueError(f"in_weight of shape {tuple(in_weight.shape)} does not stack W_h ({D} rows) over W_s")
    mixing.check()
    m = mixing
    x, context, squeeze = batch_packed(x, context, m.cu_seqlens)
    B, M, N, key_mask, general, cu_q, cu_k = check_mix_inputs(x, context, d, m.mask, m.causal, m.block_size,
                                                              m.cu_seqlens)
    call = PomCall(x, context, in_weight, gate_bias, coeff, out_weight, out_bias, mixing, key_mask, general, cu_q,
                   cu_k, B, M, N)
    return call, squeeze


def pom(x: Tensor, context: Optional[Tensor], in_weight: Tensor, gate_bias: Tensor, coeff: Tensor, out_weight: Tensor,
        out_bias: Optional[Tensor] = None, **modes: Any) -> Tensor:
    """The Polynomial Mixer: ``y = W_o (gate(W_s x + b) ⊙ agg_visible(poly(act(W_h c))))``, on the backend the
    dispatcher picks (see :mod:`polymixer.ops.dispatch`).

    Args:
        x: (B, M, d) queries (and context when ``context`` is None). With ``cu_seqlens`` also (T, d).
        context: (B, N, d) context for cross-mixing, or None for self-mixing.
        in_weight: (D + Ds, d) — W_h stacked over W_s; self-mixing does one matrix product for both.
        gate_bias: (Ds,); coeff: (D, k); out_weight: (d, D); out_bias: (d,) or None.
        mask: (B, N) key padding or (B, M, N) general, bool, True = takes part.
        causal / block_size: causal or block-causal masking (see :func:`polymixer.ops.features.aggregate`).
        cu_seqlens: int32 offsets of packed sequences; a pair (cu_q, cu_k) for packed cross-mixing.
        positions / context_positions: rotary positions of queries / context tokens
            ((N,) or (B, N) for rope="1d"; (N, 2) or (B, N, 2) for rope="2d"). Default: token index (in its sequence).
        rope: None, "1d" or "2d": rotate each context token's features by its position before aggregation and
            read the aggregate in each query's own frame, so interactions depend on relative position only.

    Returns:
        (B, M, d) — or (T, d) when a 2-D packed input was given.
    """
    mixing = Mixing.of("pom", modes)
    weights = (in_weight, gate_bias, coeff, out_weight, out_bias)
    cp = parallel.active()
    if cp is not None:  # this rank's slice of every sequence (polymixer.context_parallel)
        return _split_call(cp, x, context, weights, mixing)[0]
    call, squeeze = make_pom_call(x, context, weights, mixing)
    y = dispatch.choose("pom", call).forward(call)
    return y.squeeze(0) if squeeze else y


def pom_step(x: Tensor, state_sum: Tensor, state_count: Tensor, state_offset: Tensor, in_weight: Tensor,
             gate_bias: Tensor, coeff: Tensor, out_weight: Tensor, out_bias: Optional[Tensor] = None,
             **modes: Any) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Streaming PoM: consume a chunk given the running (sum, count, offset) of everything seen before; see
    :func:`polymixer.ops.pom.modular_step.step`. Returns (y, new_sum, new_count, new_offset)."""
    mixing = Mixing.of("pom_step", modes, STEP_MODES, causal=True)
    weights = (in_weight, gate_bias, coeff, out_weight, out_bias)
    cp = parallel.active()
    if cp is not None:  # a context-parallel prefill: each rank's slice, the state after it (the last rank: all)
        if not mixing.causal:
            raise ValueError("pom_step under context_parallel streams causally only (frames are not split)")
        y, (s, c), n_total = _split_call(cp, x, None, weights, mixing, (state_sum, state_count, state_offset))
        return y, s.to(state_sum.dtype), c.to(state_count.dtype), state_offset + n_total
    call = PomStepCall(x, state_sum, state_count, state_offset, weights, mixing)
    return dispatch.choose("pom_step", call).forward(call)


class PomStepCall(NamedTuple):
    """A streaming PoM call as its backend receives it: the chunk, the running state, the weights (in_weight,
    gate_bias, coeff, out_weight, out_bias) and the mode (checked by the backend against the state's shapes)."""

    x: Tensor
    state_sum: Tensor
    state_count: Tensor
    state_offset: Tensor
    weights: Tuple[Tensor, Tensor, Tensor, Tensor, Optional[Tensor]]
    mixing: Mixing


def _split_call(cp: "parallel.ContextParallel", x: Tensor, context: Optional[Tensor],
                weights: Tuple[Tensor, Tensor, Tensor, Tensor, Optional[Tensor]], mixing: Mixing,
                state: Optional[Tuple[Tensor, Tensor, Tensor]] = None) -> Tuple[Tensor, Tuple[Tensor, Tensor], int]:
    """A call under context parallelism: validated here, refused alike on every rank (never a hang), mixed by
    :mod:`polymixer.ops.pom.context_parallel`. Returns (y, the (sum, count) after this slice, the global length)."""
    from . import context_parallel as pom_parallel

    problem, call = None, None
    try:
        call, squeeze = make_pom_call(x, context, weights, mixing)
        if squeeze:
            problem = "packed sequences (cu_seqlens) cannot be split across ranks"
    except (ValueError, TypeError) as e:
        problem = str(e)
    if call is None:  # the agreement still has to take place, so that the other ranks raise too
        parallel.agree(cp, "pom", {"length": 0}, problem)
    return pom_parallel.forward(call, cp, problem, state)


def backend_for(*args: Any, **kwargs: Any) -> Dict[str, Any]:
    """Which backend :func:`pom` would run these arguments on, and why the others were passed over."""
    call, _ = make_call(*args, **kwargs)
    return dispatch.backend_for("pom", call)


# the backends of pom and pom_step (the Triton ones are imported only where they could run, and taken automatically
# only where measured — or, for the unfused kernels without a measurement, modelled — faster: polymixer.ops.measured)
from .. import measured  # noqa: E402
from ..common import triton_possible, triton_precheck  # noqa: E402
from . import cost, fused_cpu, modular, modular_step, reference  # noqa: E402

dispatch.register("pom", "reference", reference)
dispatch.register("pom", "torch", modular)
dispatch.register("pom", "cpu", fused_cpu)
dispatch.register("pom", "triton", "polymixer.ops.pom.triton_kernels", precheck=triton_precheck,
                  eager=triton_possible(), speed=measured.rule("pom", "triton", model=cost.pom_kernels_vs_torch))
dispatch.register("pom", "triton_gemm", "polymixer.ops.pom.triton_gemm", precheck=triton_precheck,
                  eager=triton_possible(), speed=measured.rule("pom", "triton_gemm"))
dispatch.register("pom_step", "torch", modular_step)
