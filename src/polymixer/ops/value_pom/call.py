"""The value-carrying PoM's calls as its backends receive them: typed, validated once by their front end.

:func:`make_value_call` (``value_pom``), :func:`make_gated_call` (the gated form) and :func:`make_step_call` (their
streaming steps) check the weights' layout, the mode and the inputs, raise the one-line ValueError / TypeError a user
sees, and normalise the call (packed 2-D input batched, masks split into key padding and general visibility, packed
offsets checked) — so every backend takes a call that is known to be well formed and only says whether it can run it
(``supports``). The front ends are :mod:`polymixer.ops.value_pom` and :mod:`polymixer.ops.gated_value_pom`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Tuple

from torch import Tensor

from ..common import Mixing, batch_packed, check_bool_mask, check_mix_inputs, check_tokens
from .features import CHUNK

__all__ = ["ValueCall", "StepCall", "ValueWeights", "make_value_call", "make_gated_call", "make_step_call",
           "check_layout", "check_rope", "check_chunk"]

# in_weight (2D + dv + Ds, d), gate_bias (Ds,), coeff (D, k), coeff_q (D, k), shift_weight (W, D + dv) or None,
# norm_weight (dv,), out_weight (d, dv), out_bias (d,) or None — the order of value_pom's positional arguments
ValueWeights = Tuple[Tensor, Tensor, Tensor, Tensor, Optional[Tensor], Tensor, Tensor, Optional[Tensor]]


@dataclass(eq=False)
class ValueCall:
    """A validated value-PoM call (also the gated form's, with its decay): (B, M, d) queries, (B, N, d) context
    (None: self-mixing), the weights, the mode as given (``mixing``) and its normalised masks and offsets."""

    x: Tensor  # (B, M, d); a 2-D packed input (T, d) batched as (1, T, d) (``squeeze``: give the output back 2-D)
    context: Optional[Tensor]
    in_weight: Tensor  # (2D + dv + Ds, d): W_k over W_v over W_q over W_s
    gate_bias: Tensor
    coeff: Tensor
    coeff_q: Tensor
    shift_weight: Optional[Tensor]
    norm_weight: Tensor
    out_weight: Tensor
    out_bias: Optional[Tensor]
    mixing: Mixing
    heads: int
    chunk: int
    key_mask: Optional[Tensor]  # (B, N) bool
    mask: Optional[Tensor]  # (B, M, N) bool, general visibility
    cu_q: Optional[Tensor]  # packed queries of cross-mixing (None: self-mixing packed, or no packing)
    cu_k: Optional[Tensor]  # packed context offsets
    B: int
    M: int
    N: int
    D: int
    dv: int
    squeeze: bool
    decay_weight: Optional[Tensor] = None  # (H, d) and (H,): the gated form's decay (None: the value PoM)
    decay_bias: Optional[Tensor] = None

    @property
    def self_mix(self) -> bool:
        return self.context is None

    def weights(self) -> ValueWeights:
        """The weights in the order of value_pom's positional arguments."""
        return (self.in_weight, self.gate_bias, self.coeff, self.coeff_q, self.shift_weight, self.norm_weight,
                self.out_weight, self.out_bias)

    def tensors(self) -> Tuple[Optional[Tensor], ...]:
        """Every tensor of the call (inputs, weights, masks, positions): e.g. to ask whether any needs a gradient."""
        m = self.mixing
        return (self.x, self.context, *self.weights(), self.decay_weight, self.decay_bias, m.mask, m.positions,
                m.context_positions)

    def describe(self) -> str:
        """The call in words, for messages: mode, packing, masks, rotary, dtype and device."""
        return self.mixing.describe(self.x, self.self_mix, self.cu_k is not None, self.key_mask is not None,
                                    self.mask is not None)


@dataclass(eq=False)
class StepCall:
    """A validated streaming step (value PoM or, with a decay, its gated form): a chunk (B, T, d) after the state of
    everything before it — ``state`` (B, H, D_h, dv_h), ``count`` (B,), ``offset`` (B,) the stream index of the next
    token, ``prev`` (B, W − 1, D + dv) the last tokens' key / value projections. ``mixing.causal`` False: the chunk
    is one block."""

    x: Tensor
    state: Tensor
    count: Tensor
    offset: Tensor
    prev: Tensor
    weights: ValueWeights
    mixing: Mixing
    heads: int
    chunk: int
    D: int
    dv: int
    decay_weight: Optional[Tensor] = None
    decay_bias: Optional[Tensor] = None


def check_layout(in_weight: Tensor, coeff: Tensor, coeff_q: Tensor, out_weight: Tensor, heads: int
                 ) -> Tuple[int, int]:
    """(D, dv) of weights that stack W_k, W_v, W_q and W_s and split into ``heads`` heads, else a ValueError."""
    D, dv = coeff.shape[0], out_weight.shape[1]
    Ds = in_weight.shape[0] - 2 * D - dv
    if coeff_q.shape != coeff.shape:
        raise ValueError(f"coeff_q has shape {tuple(coeff_q.shape)}, coeff {tuple(coeff.shape)}: they must match")
    if Ds <= 0 or dv % Ds != 0:
        raise ValueError(f"in_weight of shape {tuple(in_weight.shape)} does not stack W_k ({D}), W_v ({dv}), "
                         f"W_q ({D}) and a gate whose width divides {dv}")
    if D % heads or dv % heads:
        raise ValueError(f"heads = {heads} must divide D = {D} and value_dim = {dv}")
    return D, dv


def check_rope(rope: Optional[str], D: int, heads: int) -> None:
    """A rotary kind that the key width per head can take (1-D: even; 2-D: divisible by 4), else a ValueError."""
    if rope not in (None, "1d", "2d"):
        raise ValueError(f"rope must be None, '1d' or '2d', got {rope!r}")
    Dh = D // heads
    if (rope == "1d" and Dh % 2) or (rope == "2d" and Dh % 4):
        raise ValueError(f"{rope} rotary needs a key width per head (D/heads = {Dh}) divisible by "
                         f"{2 if rope == '1d' else 4}")


def check_chunk(chunk: int) -> None:
    """A positive int number of tokens per chunk, else a ValueError."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive int, got {chunk!r}")


def make_value_call(x: Tensor, context: Optional[Tensor], weights: ValueWeights, mixing: Mixing, heads: int = 1,
                    chunk: int = CHUNK) -> ValueCall:
    """Validate a value-PoM call once and normalise it (see :class:`ValueCall`); ValueError / TypeError with the
    one-line reason otherwise."""
    in_weight, _, coeff, coeff_q, _, _, out_weight, _ = weights
    D, dv = check_layout(in_weight, coeff, coeff_q, out_weight, heads)
    mixing.check()
    check_rope(mixing.rope, D, heads)
    check_chunk(chunk)
    m = mixing
    x, context, squeeze = batch_packed(x, context, m.cu_seqlens)
    B, M, N, key_mask, general, cu_q, cu_k = check_mix_inputs(x, context, out_weight.shape[0], m.mask, m.causal,
                                                              m.block_size, m.cu_seqlens)
    return ValueCall(x, context, *weights, mixing, heads, chunk, key_mask, general, cu_q, cu_k, B, M, N, D, dv,
                     squeeze)


def make_gated_call(x: Tensor, context: Optional[Tensor], weights: ValueWeights, decay_weight: Tensor,
                    decay_bias: Tensor, mixing: Mixing, heads: int = 1, chunk: int = CHUNK) -> ValueCall:
    """Validate a call of the gated value PoM once: the value PoM's checks, plus self-mixing only (a decay needs the
    tokens' order), the decay's shapes, and no explicit (B, M, N) mask."""
    in_weight, _, coeff, coeff_q, _, _, out_weight, _ = weights
    D, _ = check_layout(in_weight, coeff, coeff_q, out_weight, heads)
    check_rope(mixing.rope, D, heads)
    if context is not None or mixing.context_positions is not None:
        raise ValueError("the gated value PoM mixes a sequence with itself: its decay needs the tokens' order "
                         "(cross-mixing is not supported)")
    d = out_weight.shape[0]
    if decay_weight.shape != (heads, d) or decay_bias.shape != (heads,):
        raise ValueError(f"decay_weight must be ({heads}, {d}) and decay_bias ({heads},), got "
                         f"{tuple(decay_weight.shape)} and {tuple(decay_bias.shape)}")
    call = make_value_call(x, None, weights, mixing, heads, chunk)
    if call.mask is not None:
        raise ValueError("the gated value PoM takes key padding, causal, block-causal and packed masking; an "
                         "explicit (B, M, N) mask is not supported")
    return replace(call, decay_weight=decay_weight, decay_bias=decay_bias)


def make_step_call(x: Tensor, state: Tensor, count: Tensor, offset: Tensor, prev: Tensor, weights: ValueWeights,
                   mixing: Mixing, heads: int = 1, chunk: int = CHUNK, decay: Optional[Tuple[Tensor, Tensor]] = None
                   ) -> StepCall:
    """Validate a streaming step once: the layout, the chunk's tokens, the state's shape for this batch, the chunk's
    key padding and the rotary kind (a gated step, ``decay`` = (weight, bias), streams causally only)."""
    in_weight, _, coeff, coeff_q, _, _, out_weight, _ = weights
    if decay is not None and not mixing.causal:
        raise ValueError("the gated value PoM streams causally (a block would need its later tokens)")
    D, dv = check_layout(in_weight, coeff, coeff_q, out_weight, heads)
    check_tokens(x, out_weight.shape[0], "x")
    B, T, _ = x.shape
    H = heads
    if state.shape != (B, H, D // H, dv // H):
        raise ValueError(f"state has shape {tuple(state.shape)} but x has batch {B} and the mixer keeps "
                         f"{(B, H, D // H, dv // H)}; index or re-initialise the state")
    if mixing.mask is not None:
        check_bool_mask(mixing.mask, [(B, T)], f"a chunk of batch {B} × {T} tokens")
    check_rope(mixing.rope, D, heads)
    if mixing.rope == "2d" and mixing.positions is None:
        raise ValueError("2-D rotary streaming needs explicit positions of shape (B, T, 2) or (T, 2)")
    weight, bias = decay if decay is not None else (None, None)
    return StepCall(x, state, count, offset, prev, weights, mixing, heads, chunk, D, dv, weight, bias)
