"""The value-carrying PoMs, one class per mixer: :class:`ValuePoM` and its gated form :class:`GatedValuePoM`.

Both are subclasses of :class:`~polymixer.layers.pom.PoM` (``isinstance(m, PoM)`` holds for every PoM) that build
their own parameters and run their own op.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Union

import torch
from torch import nn

from ..ops.common import ROPE_BASE, ActivationLike, Mixing
from ..ops.features import CHUNK
from ..ops.gated_value_pom import GatedValuePomWeights, gated_value_pom, retnet_bias
from ..ops.value_pom import ValuePomWeights, value_pom
from .pom import PoM, PoMState, check_counts, check_gate_width, check_pom_shape, check_rotary, shift_width

__all__ = ["ValuePoM", "GatedValuePoM"]


class ValuePoM(PoM):
    """The value-carrying PoM (:mod:`polymixer.values`): PoM whose state binds each token's value to its key
    features, S = mean_j φ_j ⊗ v_j, read by the query's own polynomial features ψ_i and normalised per head:
    y = W_o (gate ⊙ RMSNorm(ψᵀ S)). The gate has dv channels.
    Parameters: ``in_proj`` stacks W_k over W_v over W_q over W_s (one matrix product when self-mixing),
    ``coeff`` / ``coeff_q`` the key / query polynomials, ``norm_weight`` the RMSNorm, ``shift`` the token shift.

    Args:
        dim, degree, expand, sel_heads, gate, activation, reduction, bias, rope, rope_base: as :class:`PoM`
            (``sel_heads`` splits dv; rotary turns D / heads channels per head).
        value_dim: dv (default: dim).
        heads: the heads that split D and dv. The state is D·dv/heads floats per sequence.
        token_shift: keys and values mix each token's projection with the previous token's (learned weights per
            channel; default on), so that a value can bind to the key before it. An int W ≥ 2 widens it to a causal
            depthwise convolution over the last W tokens (True = 2; the taps beyond the previous token start at 0,
            so any width starts as the token shift); False: none.
        chunk_size: tokens per chunk of the causal form.
        rope_convention: "relative" only (accepted so that a model's options reach every PoM alike).

    Its state never decays: :class:`GatedValuePoM` is the decaying one.
    """

    def __init__(
        self,
        dim: int,
        degree: int = 2,
        expand: Union[int, float] = 2,
        sel_heads: int = 1,
        gate: ActivationLike = "hardsigmoid",
        activation: ActivationLike = "leaky_clamp",
        reduction: str = "mean",
        bias: bool = False,
        rope: Optional[str] = None,
        rope_base: float = ROPE_BASE,
        value_dim: Optional[int] = None,
        heads: int = 1,
        token_shift: Union[bool, int, None] = None,
        chunk_size: int = CHUNK,
        rope_convention: str = "relative",
        *,
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super(PoM, self).__init__()  # nn.Module's: PoM.__init__ builds the plain PoM's parameters, not these
        if rope_convention != "relative":
            raise ValueError(f"the value-carrying PoMs have one rotary convention, 'relative', got rope_convention="
                             f"{rope_convention!r} (the reference implementation's PoMRoPE is a plain PoM)")
        value_dim = dim if value_dim is None else value_dim
        D = check_pom_shape(dim, degree, expand, sel_heads)
        check_counts(value_dim=value_dim, heads=heads, chunk_size=chunk_size)
        if D % heads or value_dim % heads:
            raise ValueError(f"heads = {heads} must divide expand·dim = {D} and value_dim = {value_dim}")
        check_gate_width(value_dim, sel_heads, "value_dim")
        Mixing(activation=activation, gate=gate, reduction=reduction).check()
        check_rotary(rope, D // heads, "expand·dim / heads" if heads > 1 else "expand·dim")
        self._set_options(dim, degree, expand, sel_heads, gate, activation, reduction, rope, rope_base, D, value_dim)
        self.value_dim, self.heads, self.chunk_size = value_dim, heads, chunk_size
        self.shift_width = shift_width(token_shift, default=2)  # on by default
        self.token_shift = self.shift_width > 0
        self._add_parameters({"device": device, "dtype": dtype}, bias)
        self._reset_coeff()

    def _add_parameters(self, fk: Dict[str, Any], bias: bool) -> None:
        """Every parameter, in the order (and so the random draws) of the original single PoM class."""
        D, dv = self.poly_dim, self.value_dim
        self._add_input_parameters(2 * D + dv + self.gate_dim, fk)  # W_k over W_v over W_q over W_s
        self.coeff_q = nn.Parameter(torch.empty(D, self.degree, **fk))
        self.coeff_q.no_weight_decay = True
        self.norm_weight = nn.Parameter(torch.ones(dv, **fk))
        if self.token_shift:
            self.shift = nn.Parameter(torch.empty(self.shift_width, D + dv, **fk))
            self.shift.no_weight_decay = True
        self.out_proj = nn.Linear(dv, self.dim, bias=bias, **fk)

    def _reset_coeff(self) -> None:
        with torch.no_grad():
            if self.coeff.device.type == "meta":
                return
            for c in (self.coeff, self.coeff_q):  # features start near act(z): the readout's scale is O(1)
                c.uniform_(-1e-3, 1e-3)
                c[:, 0] = 1.0
            if self.token_shift:
                self.shift.zero_()
                self.shift[:2] = 0.5

    def reset_parameters(self) -> None:
        super().reset_parameters()
        nn.init.ones_(self.norm_weight)

    @property
    def state_floats(self) -> int:
        """Floats of streaming state per sequence (besides the count and offset)."""
        return self.poly_dim * self.value_dim // self.heads + (self.poly_dim + self.value_dim) * max(
            self.shift_width - 1, 0)

    def _extra_repr_fields(self) -> str:
        s = f", value_dim={self.value_dim}, heads={self.heads}, token_shift={self.token_shift}"
        return s + (f", shift_width={self.shift_width}" if self.shift_width > 2 else "")

    def _op_kwargs(self) -> dict:
        return dict(super()._op_kwargs(), heads=self.heads, chunk=self.chunk_size)

    op = staticmethod(value_pom)

    @property
    def weights(self) -> ValuePomWeights:
        """The weights as :attr:`op` takes them: one object, made at each call from the parameters."""
        return ValuePomWeights(**self._named_weights())

    def _named_weights(self) -> Dict[str, Any]:
        """The value PoM's weights by their names in :class:`ValuePomWeights` (the gated form adds its decay's)."""
        return dict(in_weight=self.in_proj.weight, gate_bias=self.gate_bias, coeff=self.coeff, coeff_q=self.coeff_q,
                    shift_weight=self.shift if self.token_shift else None, norm_weight=self.norm_weight,
                    out_weight=self.out_proj.weight, out_bias=self.out_proj.bias)

    def init_state(
        self, batch_size: int, device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None
    ) -> PoMState:
        """An empty stream state: the (B, heads, D/heads, dv/heads) sum and the token shift's memory."""
        device, acc, count, offset = self._state_start(batch_size, device, dtype)
        B, D, H, dv = batch_size, self.poly_dim, self.heads, self.value_dim
        return PoMState(torch.zeros(B, H, D // H, dv // H, dtype=acc, device=device), count, offset,
                        torch.zeros(B, max(self.shift_width - 1, 1), D + dv, dtype=acc, device=device))

    def load_reference_state_dict(self, state_dict: Any, prefix: str = "") -> None:
        """Refused: the reference implementation has only the plain PoM."""
        raise ValueError("the reference implementation has no value-carrying PoM; load into a plain PoM")


class GatedValuePoM(ValuePoM):
    """The gated value-carrying PoM: :class:`ValuePoM` whose state decays by a data-dependent factor per head and
    token, a = exp(−softplus(w_h · x + b_h)) (as gated linear attention / Mamba-2; initialised at RetNet's rates),
    bidirectional in full mode — :mod:`polymixer.ops.gated_value_pom`. ``decay_proj`` (dim → heads) holds w and b.

    Args: those of :class:`ValuePoM`.
    """

    decay: Optional[str] = "head"  # one rate per head and token

    def _add_parameters(self, fk: Dict[str, Any], bias: bool) -> None:
        super()._add_parameters(fk, bias)
        self.decay_proj = nn.Linear(self.dim, self.heads, **fk)  # one log-decay per head and token

    def _reset_coeff(self) -> None:
        super()._reset_coeff()
        if self.coeff.device.type == "meta":
            return
        with torch.no_grad():
            self.decay_proj.weight.zero_()
            self.decay_proj.bias.copy_(retnet_bias(self.heads))

    def _extra_repr_fields(self) -> str:
        return super()._extra_repr_fields() + f", decay={self.decay!r}"

    op = staticmethod(gated_value_pom)  # no cross-mixing, no (B, M, N) mask; streams are causal

    @property
    def weights(self) -> GatedValuePomWeights:
        """The weights as :attr:`op` takes them: the value PoM's and the decay's."""
        return GatedValuePomWeights(**self._named_weights(), decay_weight=self.decay_proj.weight,
                                    decay_bias=self.decay_proj.bias)
