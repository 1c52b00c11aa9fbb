"""The plain PoM: parameters, forward in every masking mode, streaming state (PoMState, shared by every PoM class),
reference checkpoint loading, and the argument checks the value-carrying PoMs (:mod:`.value_pom`) share."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from ..ops.call import Index, PoMState, batch_index
from ..ops.common import (ROPE_BASE, ActivationLike, Mixing, check_reference_gate, compute_dtype, layer_modes,
                          rope_angles)
from ..ops.features import CHUNK
from ..ops.pom import PomWeights, pom

__all__ = ["PoM", "PoMState", "Index", "batch_index", "shift_width"]

# ---------------------------------------------------------------------------------------------------------------
# Argument checks every PoM class shares (the value-carrying classes in .value_pom call them too)
# ---------------------------------------------------------------------------------------------------------------


def shift_width(token_shift: Union[bool, int, None], name: str = "token_shift", default: int = 0,
                off: bool = True) -> int:
    """The tokens a key / value token shift reads, the current one included, from a layer's ``token_shift`` or the
    config field ``name`` that feeds it: True → 2 (each token and the previous one), False or 0 → 0 (no shift, where
    ``off`` allows it), None → ``default``, an int W ≥ 2 → W (a causal depthwise convolution over the last W tokens).
    The one check of every token-shift setting (value PoM, attention, the family configs): anything else is a
    one-line ValueError naming ``name``."""
    if token_shift is None:
        return default
    if isinstance(token_shift, bool):
        width = 2 if token_shift else 0
    elif isinstance(token_shift, int) and (token_shift == 0 or token_shift >= 2):
        width = token_shift
    else:
        width = -1
    if width < 0 or (width == 0 and not off):
        allowed = "a bool or a width ≥ 2" + (" (0: none)" if off else "")
        raise ValueError(f"{name} must be {allowed} — the tokens the key / value shift reads, the current one "
                         f"included — got {token_shift!r}")
    return width


def check_counts(**values: Any) -> None:
    """Every value a positive int: a TypeError naming the first that is not an int (a bool is not), then a
    ValueError naming the first below 1."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be ≥ 1, got {value}")


def check_pom_shape(dim: int, degree: int, expand: Union[int, float], sel_heads: int) -> int:
    """Check the sizes every PoM has and return its polynomial width D = expand·dim."""
    check_counts(dim=dim, degree=degree, sel_heads=sel_heads)
    if not isinstance(expand, (int, float)) or isinstance(expand, bool) or expand <= 0:
        raise ValueError(f"expand must be a positive number, got {expand!r}")
    D = round(expand * dim)
    if abs(D - expand * dim) > 1e-9 or D < 1:
        raise ValueError(f"expand·dim must be a positive integer, got {expand}·{dim} = {expand * dim}")
    return D


def check_gate_width(width: int, sel_heads: int, name: str) -> None:
    """The channels the gate selects (``name`` = ``width``) split into ``sel_heads`` gate heads."""
    if width % sel_heads != 0:
        raise ValueError(f"{name} = {width} is not divisible by sel_heads = {sel_heads}")


def check_rotary(rope: Optional[str], width: int, what: str) -> None:
    """The rotary kind, and the ``width`` channels (named ``what``) it turns: in pairs (1-D) or pairs of pairs (2-D).
    The one check of every mixer's ``rope`` (PoM's, the value PoMs', attention's)."""
    if rope not in (None, "1d", "2d"):
        raise ValueError(f"rope must be None, '1d' or '2d', got {rope!r}")
    if rope == "1d" and width % 2:
        raise ValueError(f"1-D rotary needs an even {what}, got {width}")
    if rope == "2d" and width % 4:
        raise ValueError(f"2-D rotary needs {what} divisible by 4, got {width}")


def check_batch_size(batch_size: int) -> None:
    """``init_state``'s batch size: a positive int."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")


class PoM(nn.Module):
    """Polynomial Mixer: a linear-time, drop-in replacement for self-attention.

    ``h = act(W_h x)`` (D = expand·dim channels), ``poly(h) = Σ_{p=1..degree} α_p ⊙ h^p``, ``H`` = mean (or sum) of
    ``poly(h)`` over the tokens each query may see, ``s = gate(W_s x + b)``, ``y = W_o (s ⊙ H)``.

    Defaults follow the reference implementation (its checkpoints load with :meth:`load_reference_state_dict`):
    leaky-ReLU(0.01) clamped to [-0.1, 6], hard-sigmoid gate, mean aggregation, W_h and W_s stacked in one bias-free
    projection plus a separate gate bias, coefficients (D, degree) initialised in ±1e-3.

    Args:
        dim: model width d.
        degree: polynomial degree k ≥ 1.
        expand: D = expand·dim (may be fractional if expand·dim is an integer).
        sel_heads: 1 = one gate per channel (Ds = D); > 1 = one gate scalar per head of D/sel_heads channels.
        gate: "hardsigmoid" (reference), "sigmoid" (paper), "identity", or a callable.
        activation: "leaky_clamp" (reference), "relu", "gelu", "silu", "tanh", "identity", or a callable.
        reduction: "mean" over visible tokens (reference) or "sum" (the paper's formula).
        bias: bias of the output projection W_o.
        rope: None, "1d" (sequences) or "2d" (grids, positions (row, col)).
        rope_base: rotary frequency base.
        rope_convention: "relative" (the aggregate read in each query's frame) or "reference" (the query's gate
            turned instead, as the reference implementation's PoMRoPE): docs/mixer.md.
        token_shift: W_h c_j becomes Σ_t shift_t ⊙ W_h c_{j−t} over the last W context tokens (a causal depthwise
            convolution with learned weights per channel, :func:`shift_width`: True → 2, an int W ≥ 2, None / False /
            0 → none, the default). It starts as no shift (shift_0 = 1, the rest 0), so a PoM with a shift starts
            as the one without; the gate rows are not shifted.
        device, dtype: where and in which dtype the parameters are made.

    The value-carrying PoMs are their own classes, :class:`~polymixer.layers.value_pom.ValuePoM` and
    :class:`~polymixer.layers.value_pom.GatedValuePoM` (subclasses of PoM: ``isinstance(m, PoM)`` holds for every
    PoM); a plain PoM takes none of their other keywords (value_dim, heads, chunk_size, decay).
    """

    # a plain PoM's answers to what the value-carrying PoMs have (read by models, benches and tests alike)
    value_dim: Optional[int] = None
    heads: int = 1
    token_shift: bool = False
    shift_width: int = 0
    chunk_size: int = CHUNK
    decay: Optional[str] = None
    rope_convention: str = "relative"

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
        rope_convention: str = "relative",
        token_shift: Union[bool, int, None] = None,
        *,
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        D = check_pom_shape(dim, degree, expand, sel_heads)
        check_gate_width(D, sel_heads, "expand·dim")
        Mixing(activation=activation, gate=gate, reduction=reduction, rope_convention=rope_convention).check()
        check_rotary(rope, D, "expand·dim")
        if rope_convention == "reference":
            check_reference_gate(rope, D, D if sel_heads == 1 else sel_heads)
        self._set_options(dim, degree, expand, sel_heads, gate, activation, reduction, rope, rope_base, D, D)
        self.rope_convention = rope_convention
        self.shift_width = shift_width(token_shift)
        self.token_shift = self.shift_width > 0
        fk = {"device": device, "dtype": dtype}
        self._add_input_parameters(D + self.gate_dim, fk)  # W_h over W_s
        self.out_proj = nn.Linear(D, dim, bias=bias, **fk)
        if self.token_shift:  # after every other parameter: a PoM without a shift draws what it always drew
            self.shift = nn.Parameter(torch.empty(self.shift_width, D, **fk))
            self.shift.no_weight_decay = True
        self._reset_coeff()

    # -- what every PoM class shares ------------------------------------------------------------------------------

    def _set_options(self, dim: int, degree: int, expand: Union[int, float], sel_heads: int, gate: ActivationLike,
                     activation: ActivationLike, reduction: str, rope: Optional[str], rope_base: float, D: int,
                     width: int) -> None:
        """Record the (checked) options; ``width``: the channels the gate selects (D, or the value PoMs' dv)."""
        self.dim = dim
        self.degree = degree
        self.expand = expand
        self.sel_heads = sel_heads
        self.poly_dim = D
        self.gate_dim = width if sel_heads == 1 else sel_heads
        self.gate = gate
        self.activation = activation
        self.reduction = reduction
        self.rope = rope
        self.rope_base = float(rope_base)

    def _add_input_parameters(self, rows: int, fk: Dict[str, Any]) -> None:
        """The stacked bias-free input projection (``rows`` outputs), the gate bias and the coefficients (D, k)."""
        self.in_proj = nn.Linear(self.dim, rows, bias=False, **fk)
        self.gate_bias = nn.Parameter(torch.zeros(self.gate_dim, **fk))
        self.coeff = nn.Parameter(torch.empty(self.poly_dim, self.degree, **fk))
        self.coeff.no_weight_decay = True  # polynomial coefficients are gains, not a matrix: never decayed

    def _reset_coeff(self) -> None:
        with torch.no_grad():
            if self.coeff.device.type != "meta":
                self.coeff.uniform_(-1e-3, 1e-3)
                if self.token_shift:  # the identity: the shift starts as none
                    self.shift.zero_()[0] = 1.0

    def reset_parameters(self) -> None:
        self.in_proj.reset_parameters()
        self.out_proj.reset_parameters()
        nn.init.zeros_(self.gate_bias)
        self._reset_coeff()

    def _state_start(self, batch_size: int, device: Optional[torch.device], dtype: Optional[torch.dtype]
                     ) -> Tuple[torch.device, torch.dtype, Tensor, Tensor]:
        """init_state's shared part: (device, accumulation dtype, zero count (B,), zero offset (B,))."""
        check_batch_size(batch_size)
        device = self.coeff.device if device is None else device
        acc = compute_dtype(self.coeff.dtype if dtype is None else dtype)
        count = torch.zeros(batch_size, dtype=acc, device=device)
        return device, acc, count, torch.zeros(batch_size, dtype=torch.int64, device=device)

    @property
    def state_floats(self) -> int:
        """Floats of streaming state per sequence (besides the count and offset)."""
        return self.poly_dim * max(self.shift_width, 1)

    def _extra_repr_fields(self) -> str:
        """What a subclass adds to the printed options (after gate_dim)."""
        return ""

    def extra_repr(self) -> str:
        s = f"dim={self.dim}, degree={self.degree}, expand={self.expand}, D={self.poly_dim}, gate_dim={self.gate_dim}"
        s += self._extra_repr_fields()
        s += f", gate={self.gate!r}, activation={self.activation!r}, reduction={self.reduction!r}"
        s += f", rope={self.rope!r}" if self.rope else ""
        s += f", shift_width={self.shift_width}" if self.shift_width and self.value_dim is None else ""
        return s + (f", rope_convention={self.rope_convention!r}" if self.rope_convention != "relative" else "")

    def _op_kwargs(self) -> dict:
        return dict(activation=self.activation, gate=self.gate, reduction=self.reduction, rope=self.rope,
                    rope_base=self.rope_base, rope_convention=self.rope_convention)

    # -- the op: one call for training and for streaming ---------------------------------------------------------

    op = staticmethod(pom)  # the functional op this class runs (the value-carrying classes run theirs)

    @property
    def weights(self) -> PomWeights:
        """The weights as :attr:`op` takes them: one object, made at each call from the parameters."""
        return PomWeights(in_weight=self.in_proj.weight, gate_bias=self.gate_bias, coeff=self.coeff,
                          out_weight=self.out_proj.weight, out_bias=self.out_proj.bias,
                          shift_weight=self.shift if self.token_shift else None)

    def forward(self, x: Tensor, context: Optional[Tensor] = None, **modes: Any) -> Tensor:
        """Mix tokens. x: (B, M, dim); context: (B, N, dim) for cross-mixing; ``modes`` (:data:`LAYER_MODES`, see
        :func:`polymixer.functional.pom`): mask (B, N) key padding or (B, M, N) bool (True = takes part), causal /
        block_size ((block-)causal), cu_seqlens (packed int32 offsets, B = 1), positions / context_positions
        (rotary). Cost O((M + N)·dim·D) — except a (B, M, N) mask, O(M·N·D); the value-carrying PoMs'
        O(N·D·dv/heads) in full mode, O(N·chunk·D + N·D·dv/heads) causal."""
        layer_modes(self, modes)
        return self.op(x, self.weights, context, **modes, **self._op_kwargs())

    def init_state(
        self, batch_size: int, device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None
    ) -> PoMState:
        """An empty stream state (with a token shift, its memory of the last W − 1 projections); ``dtype`` is the
        stream's dtype (the sum is kept in at least fp32)."""
        device, acc, count, offset = self._state_start(batch_size, device, dtype)
        B, D = batch_size, self.poly_dim
        prev = torch.zeros(B, self.shift_width - 1, D, dtype=acc, device=device) if self.token_shift else None
        return PoMState(torch.zeros(B, D, dtype=acc, device=device), count, offset, prev)

    def step(
        self,
        x: Tensor,
        state: PoMState,
        causal: bool = True,
        positions: Optional[Tensor] = None,
        mask: Optional[Tensor] = None,
    ) -> Tuple[Tensor, PoMState]:
        """Consume a chunk of a stream: (y, new_state).

        Chunks of any sizes with ``causal=True`` reproduce the parallel causal forward; frames of K tokens with
        ``causal=False`` reproduce the block-causal forward with ``block_size=K``. ``mask`` (B, T) marks the tokens
        that take part (False for left padding). ``positions`` default to the stream index of each token. The same
        op as :meth:`forward`, given the state.
        """
        return self.op(x, self.weights, state=state, causal=causal, mask=mask, positions=positions,
                       **self._op_kwargs())

    # ---------------------------------------------------------------------------------------------------------
    # Reference checkpoints
    # ---------------------------------------------------------------------------------------------------------

    _REFERENCE_NAMES = {
        "qc_proj.weight": "in_proj.weight",
        "se_bias": "gate_bias",
        "po_coeff": "coeff",
        "ag_proj.weight": "out_proj.weight",
        "ag_proj.bias": "out_proj.bias",
    }

    def load_reference_state_dict(self, state_dict: Mapping[str, Tensor], prefix: str = "") -> None:
        """Load weights saved by the reference implementation (``n_groups=1``): its ``PoM`` or its ``PoMRoPE``.

        Names: ``qc_proj.weight`` (D+Ds, d) — polynomial rows first, then gate rows —, ``se_bias`` (Ds,),
        ``po_coeff`` (D, k), ``ag_proj.weight`` (d, D) and optionally ``ag_proj.bias`` (d,). ``prefix`` selects one
        layer inside a whole model's state dict. Any missing, unexpected or mis-shaped tensor raises a ValueError
        that names it; nothing is loaded in that case. PoMRoPE's frequency tables load into a PoM of its ``rope`` and
        ``rope_convention="reference"``: checked against this PoM's, then dropped.
        """
        own = self.state_dict()
        keys = {k[len(prefix):]: k for k in state_dict if k.startswith(prefix)}
        for name in self._rope_tables(state_dict, keys, prefix):
            del keys[name]  # checked against this PoM's tables; the tables are no parameters
        if self.token_shift:
            raise ValueError("the reference implementation's PoM has no token shift: load into a PoM without one")
        if "po_proj.weight" in keys or "se_proj.weight" in keys:
            raise ValueError("this checkpoint uses separate po_proj/se_proj (n_groups > 1 or an older release); "
                             "only the fused qc_proj layout (n_groups=1) is supported")
        mapped = {}
        problems = []
        for ref, ours in self._REFERENCE_NAMES.items():
            if ours not in own:
                if ref in keys:
                    problems.append(f"{prefix}{ref} is present but this PoM has bias=False")
                continue
            if ref not in keys:
                problems.append(f"missing {prefix}{ref}")
                continue
            t = state_dict[keys[ref]]
            if tuple(t.shape) != tuple(own[ours].shape):
                problems.append(f"{prefix}{ref} has shape {tuple(t.shape)}, expected {tuple(own[ours].shape)}")
            mapped[ours] = t
        unexpected = sorted(set(keys) - set(self._REFERENCE_NAMES))
        problems += [f"unexpected {prefix}{k}" for k in unexpected]
        if problems:
            raise ValueError("cannot load reference PoM weights: " + "; ".join(problems))
        self.load_state_dict(mapped, strict=True)

    _ROPE_TABLES = {"1d": ("freqs_cos", "freqs_sin"), "2d": ("row_cos", "row_sin", "col_cos", "col_sin")}

    def _rope_tables(self, state_dict: Mapping[str, Tensor], keys: Dict[str, str], prefix: str) -> Tuple[str, ...]:
        """The names of PoMRoPE's frequency tables among ``keys`` (cos / sin of t·base^(−k/w), t < L, k < w), each
        checked against this PoM's rope_base and width. The reference computes them in float32: angles of up to L
        radians rounded to a few units of 2⁻²⁴ (measured ≤ 1.9·2⁻²⁴·L up to w = 2,048 and L = 65,536); the
        tolerance 8·2⁻²⁴·L + 10⁻⁶ is four times that, while a base 1% off differs by 2.0 at L = 16,384 (tested)."""
        kinds = [k for k, names in self._ROPE_TABLES.items() if any(n in keys for n in names)]
        if not kinds:
            return ()
        kind, names = kinds[-1], self._ROPE_TABLES[kinds[-1]]
        if len(kinds) > 1 or self.rope != kind or self.rope_convention != "reference":
            raise ValueError(f"{prefix}{names[0]}: a checkpoint of the reference implementation's PoMRoPE with {kind} "
                             f"rotary loads into PoM(..., rope={kind!r}, rope_convention='reference'); this PoM has "
                             f"rope={self.rope!r}, rope_convention={self.rope_convention!r}")
        w = self.poly_dim // (4 if kind == "2d" else 2)
        for name in names:
            t = state_dict[keys[name]] if name in keys else None
            if t is None or t.dim() != 2 or t.shape[1] != w:
                got = "missing" if t is None else f"of shape {tuple(t.shape)}"
                raise ValueError(f"{prefix}{name} is {got}: PoMRoPE's {kind} tables {', '.join(names)} are (L, {w})")
            cos_sin = rope_angles(torch.arange(t.shape[0]), 2 * w, self.rope_base, dtype=torch.float64)
            err = (t.detach().cpu().double() - cos_sin[name.endswith("sin")]).abs().max().item()
            tol = 8 * 2.0**-24 * t.shape[0] + 1e-6
            if not err <= tol:
                raise ValueError(f"{prefix}{name} differs from the table of rope_base={self.rope_base} by {err:.3g} "
                                 f"(float32 rounding: ≤ {tol:.3g})")
        return names

    def reference_state_dict(self) -> dict:
        """The inverse of :meth:`load_reference_state_dict`: this module's weights under the reference's names."""
        own = self.state_dict()
        return {ref: own[ours] for ref, ours in self._REFERENCE_NAMES.items() if ours in own}
