"""The PoM module: parameters, forward in every masking mode, streaming state, reference checkpoint loading."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn
from torch.utils import _pytree

from ..ops.common import ACTIVATIONS, GATES, ActivationLike, CuSeqlens, compute_dtype, resolve
from ..ops.pom import pom, pom_step
from ..ops.value_pom import value_pom, value_pom_step
from ..ops.value_pom.gated import gated_value_pom, gated_value_pom_step, retnet_bias
from ..ops.value_pom.modular import CHUNK

__all__ = ["PoM", "PoMState", "Index", "batch_index"]

Index = Union[int, slice, Sequence[int], Tensor]


def batch_index(index: Index, device: torch.device) -> Union[slice, Tensor]:
    """Normalise a batch index so that the batch dimension is always kept."""
    if isinstance(index, int):
        return slice(index, index + 1) if index != -1 else slice(-1, None)
    if isinstance(index, slice):
        return index
    return torch.as_tensor(index, device=device)


@dataclass
class PoMState:
    """Everything a causal PoM needs to continue a stream, whatever its length: O(D) per sequence, or
    O(D·dv/heads + D + dv) for the value-carrying PoM.

    Attributes:
        sum: (B, D) running sum of the (rotated) polynomial features, fp32 (fp64 for fp64 streams); for the
            value-carrying PoM (B, heads, D/heads, dv/heads), the running sum of key features ⊗ values.
        count: (B,) number of tokens that took part so far (masked tokens are not counted).
        offset: (B,) int64 index of the next token in the stream (its default rotary position).
        prev: (B, W − 1, D + dv) the last tokens' key / value projections (the memory of a token shift of width W;
            one token without a shift) for the value-carrying PoM, None for PoM.
    """

    sum: Tensor
    count: Tensor
    offset: Tensor
    prev: Optional[Tensor] = None

    @property
    def batch_size(self) -> int:
        return self.sum.shape[0]

    def __len__(self) -> int:
        return self.batch_size

    def __getitem__(self, index: Index) -> "PoMState":
        """Select / reorder sequences along the batch (beam search, batch compaction); the batch dim is kept."""
        i = batch_index(index, self.sum.device)
        return self._map(lambda t: t[i])

    def index_select(self, index: Tensor) -> "PoMState":
        return self._map(lambda t: t.index_select(0, index))

    def _map(self, fn: Any) -> "PoMState":
        return PoMState(*(None if t is None else fn(t) for t in (getattr(self, f.name) for f in fields(PoMState))))

    @staticmethod
    def cat(states: Sequence["PoMState"]) -> "PoMState":
        """Concatenate states along the batch (e.g. to add new requests to a running batch)."""
        parts = [[getattr(s, f.name) for s in states] for f in fields(PoMState)]
        return PoMState(*(None if p[0] is None else torch.cat(p) for p in parts))

    def to(self, *args: Any, **kwargs: Any) -> "PoMState":
        """Move to a device; the accumulation dtype is kept (the state never drops below fp32)."""
        kwargs.pop("dtype", None)
        args = tuple(a for a in args if not isinstance(a, torch.dtype))
        return self._map(lambda t: t.to(*args, **kwargs))

    def detach(self) -> "PoMState":
        return self._map(lambda t: t.detach())


_pytree.register_dataclass(PoMState)


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
        value_dim: None (PoM) or dv: the value-carrying PoM (:mod:`polymixer.values`). Its state binds each token's
            value to its key features, S = mean_j φ_j ⊗ v_j, read by the query's own polynomial features ψ_i and
            normalised per head: y = W_o (gate ⊙ RMSNorm(ψᵀ S)). The gate then has dv channels.
        heads: with value_dim, the heads that split D and dv. The state is D·dv/heads floats per sequence.
        token_shift: with value_dim (default on), keys and values mix each token's projection with the previous
            token's (learned weights per channel), so that a value can bind to the key before it. An int W ≥ 2
            widens it to a causal depthwise convolution over the last W tokens (True = 2; the taps beyond the
            previous token start at 0, so any width starts as the token shift).
        chunk_size: tokens per chunk of the value-carrying PoM's causal form.
        decay: with value_dim, "head" makes the value PoM gated: its state decays by a data-dependent factor per
            head and token, a = exp(−softplus(w_h · x + b_h)) (as gated linear attention / Mamba-2; initialised at
            RetNet's rates), bidirectional in full mode — :mod:`polymixer.ops.value_pom.gated`.
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
        rope_base: float = 10000.0,
        value_dim: Optional[int] = None,
        heads: int = 1,
        token_shift: Union[bool, int, None] = None,
        chunk_size: int = CHUNK,
        decay: Optional[str] = None,
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        ints = {"dim": dim, "degree": degree, "sel_heads": sel_heads, "heads": heads, "chunk_size": chunk_size}
        if value_dim is not None:
            ints["value_dim"] = value_dim
        for name, value in ints.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if dim < 1:
            raise ValueError(f"dim must be ≥ 1, got {dim}")
        if degree < 1:
            raise ValueError(f"degree must be ≥ 1, got {degree}")
        if sel_heads < 1:
            raise ValueError(f"sel_heads must be ≥ 1, got {sel_heads}")
        if not isinstance(expand, (int, float)) or isinstance(expand, bool) or expand <= 0:
            raise ValueError(f"expand must be a positive number, got {expand!r}")
        D = round(expand * dim)
        if abs(D - expand * dim) > 1e-9 or D < 1:
            raise ValueError(f"expand·dim must be a positive integer, got {expand}·{dim} = {expand * dim}")
        if token_shift is not None and not isinstance(token_shift, bool) and (
                not isinstance(token_shift, int) or token_shift < 2):
            raise ValueError(f"token_shift must be a bool or a width ≥ 2 (tokens the convolution reads), got "
                             f"{token_shift!r}")
        if decay not in (None, "head"):
            raise ValueError(f"decay must be None or 'head', got {decay!r}")
        if value_dim is None:
            if heads != 1 or token_shift or decay:
                raise ValueError("heads, token_shift and decay belong to the value-carrying PoM: pass value_dim as "
                                 "well")
        else:
            if value_dim < 1:
                raise ValueError(f"value_dim must be ≥ 1, got {value_dim}")
            if heads < 1 or D % heads or value_dim % heads:
                raise ValueError(f"heads = {heads} must divide expand·dim = {D} and value_dim = {value_dim}")
            if chunk_size < 1:
                raise ValueError(f"chunk_size must be ≥ 1, got {chunk_size}")
        width = D if value_dim is None else value_dim  # the channels the gate selects
        if width % sel_heads != 0:
            raise ValueError(f"{'expand·dim' if value_dim is None else 'value_dim'} = {width} is not divisible by "
                             f"sel_heads = {sel_heads}")
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
        if rope not in (None, "1d", "2d"):
            raise ValueError(f"rope must be None, '1d' or '2d', got {rope!r}")
        rot = D // heads
        if rope == "1d" and rot % 2:
            raise ValueError(f"1-D rotary needs an even expand·dim{' / heads' if heads > 1 else ''}, got {rot}")
        if rope == "2d" and rot % 4:
            raise ValueError(f"2-D rotary needs expand·dim{' / heads' if heads > 1 else ''} divisible by 4, got {rot}")
        resolve(GATES, gate, "gate")
        resolve(ACTIVATIONS, activation, "activation")

        self.dim = dim
        self.degree = degree
        self.expand = expand
        self.sel_heads = sel_heads
        self.poly_dim = D
        self.value_dim = value_dim
        self.heads = heads
        self.token_shift = value_dim is not None and token_shift is not False
        # tokens the shift reads (the current one included): 2 by default, 0 without a shift
        self.shift_width = 0 if not self.token_shift else 2 if token_shift in (None, True) else int(token_shift)
        self.chunk_size = chunk_size
        self.decay = decay
        self.gate_dim = width if sel_heads == 1 else sel_heads
        self.gate = gate
        self.activation = activation
        self.reduction = reduction
        self.rope = rope
        self.rope_base = float(rope_base)

        fk = {"device": device, "dtype": dtype}
        # PoM: W_h over W_s. Value-carrying: W_k over W_v over W_q over W_s (one matrix product when self-mixing)
        rows = D + self.gate_dim if value_dim is None else 2 * D + value_dim + self.gate_dim
        self.in_proj = nn.Linear(dim, rows, bias=False, **fk)
        self.gate_bias = nn.Parameter(torch.zeros(self.gate_dim, **fk))
        self.coeff = nn.Parameter(torch.empty(D, degree, **fk))
        self.coeff.no_weight_decay = True  # polynomial coefficients are gains, not a matrix: never decayed
        if value_dim is not None:
            self.coeff_q = nn.Parameter(torch.empty(D, degree, **fk))
            self.coeff_q.no_weight_decay = True
            self.norm_weight = nn.Parameter(torch.ones(value_dim, **fk))
            if self.token_shift:
                self.shift = nn.Parameter(torch.empty(self.shift_width, D + value_dim, **fk))
                self.shift.no_weight_decay = True
        self.out_proj = nn.Linear(width, dim, bias=bias, **fk)
        if decay is not None:  # one log-decay per head and token
            self.decay_proj = nn.Linear(dim, heads, **fk)
        self._reset_coeff()

    def _reset_coeff(self) -> None:
        with torch.no_grad():
            if self.coeff.device.type == "meta":
                return
            if self.value_dim is None:
                self.coeff.uniform_(-1e-3, 1e-3)
                return
            for c in (self.coeff, self.coeff_q):  # features start near act(z): the readout's scale is O(1)
                c.uniform_(-1e-3, 1e-3)
                c[:, 0] = 1.0
            if self.token_shift:
                self.shift.zero_()
                self.shift[:2] = 0.5
            if self.decay is not None:
                self.decay_proj.weight.zero_()
                self.decay_proj.bias.copy_(retnet_bias(self.heads))

    def reset_parameters(self) -> None:
        self.in_proj.reset_parameters()
        self.out_proj.reset_parameters()
        nn.init.zeros_(self.gate_bias)
        if self.value_dim is not None:
            nn.init.ones_(self.norm_weight)
        self._reset_coeff()

    @property
    def state_floats(self) -> int:
        """Floats of streaming state per sequence (besides the count and offset)."""
        if self.value_dim is None:
            return self.poly_dim
        return self.poly_dim * self.value_dim // self.heads + (self.poly_dim + self.value_dim) * max(
            self.shift_width - 1, 0)

    def extra_repr(self) -> str:
        s = f"dim={self.dim}, degree={self.degree}, expand={self.expand}, D={self.poly_dim}, gate_dim={self.gate_dim}"
        if self.value_dim is not None:
            s += f", value_dim={self.value_dim}, heads={self.heads}, token_shift={self.token_shift}"
            if self.shift_width > 2:
                s += f", shift_width={self.shift_width}"
            if self.decay is not None:
                s += f", decay={self.decay!r}"
        s += f", gate={self.gate!r}, activation={self.activation!r}, reduction={self.reduction!r}"
        return s + (f", rope={self.rope!r}" if self.rope else "")

    def _op_kwargs(self) -> dict:
        kw = dict(activation=self.activation, gate=self.gate, reduction=self.reduction, rope=self.rope,
                  rope_base=self.rope_base)
        if self.value_dim is not None:
            kw.update(heads=self.heads, chunk=self.chunk_size)
        return kw

    def value_weights(self) -> tuple:
        """The value-carrying PoM's weights in the order :func:`polymixer.ops.value_pom.value_pom` takes them."""
        return (self.in_proj.weight, self.gate_bias, self.coeff, self.coeff_q,
                self.shift if self.token_shift else None, self.norm_weight, self.out_proj.weight, self.out_proj.bias)

    def forward(
        self,
        x: Tensor,
        context: Optional[Tensor] = None,
        *,
        mask: Optional[Tensor] = None,
        causal: bool = False,
        block_size: Optional[int] = None,
        cu_seqlens: Optional[CuSeqlens] = None,
        positions: Optional[Tensor] = None,
        context_positions: Optional[Tensor] = None,
    ) -> Tensor:
        """Mix tokens. See :func:`polymixer.functional.pom` for every argument.

        x: (B, M, dim); context: (B, N, dim) for cross-mixing; mask: (B, N) key padding or (B, M, N) bool
        (True = takes part); causal / block_size: (block-)causal; cu_seqlens: packed int32 offsets (B = 1).
        Cost O((M + N)·dim·D) — except a (B, M, N) mask, O(M·N·D). The value-carrying PoM: O(N·D·dv/heads) in full
        mode, O(N·chunk·D + N·D·dv/heads) causal.
        """
        if self.decay is not None:
            return gated_value_pom(x, context, *self.value_weights(), self.decay_proj.weight, self.decay_proj.bias,
                                   mask=mask, causal=causal, block_size=block_size, cu_seqlens=cu_seqlens,
                                   positions=positions, context_positions=context_positions, **self._op_kwargs())
        if self.value_dim is not None:
            return value_pom(x, context, *self.value_weights(), mask=mask, causal=causal, block_size=block_size,
                                cu_seqlens=cu_seqlens, positions=positions, context_positions=context_positions,
                                **self._op_kwargs())
        return pom(
            x,
            context,
            self.in_proj.weight,
            self.gate_bias,
            self.coeff,
            self.out_proj.weight,
            self.out_proj.bias,
            mask=mask,
            causal=causal,
            block_size=block_size,
            cu_seqlens=cu_seqlens,
            positions=positions,
            context_positions=context_positions,
            **self._op_kwargs(),
        )

    def init_state(
        self, batch_size: int, device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None
    ) -> PoMState:
        """An empty stream state; ``dtype`` is the stream's dtype (the sum is kept in at least fp32)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        device = self.coeff.device if device is None else device
        acc = compute_dtype(self.coeff.dtype if dtype is None else dtype)
        B, D = batch_size, self.poly_dim
        count = torch.zeros(B, dtype=acc, device=device)
        offset = torch.zeros(B, dtype=torch.int64, device=device)
        if self.value_dim is None:
            return PoMState(torch.zeros(B, D, dtype=acc, device=device), count, offset)
        H, dv = self.heads, self.value_dim
        return PoMState(torch.zeros(B, H, D // H, dv // H, dtype=acc, device=device), count, offset,
                        torch.zeros(B, max(self.shift_width - 1, 1), D + dv, dtype=acc, device=device))

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
        that take part (False for left padding). ``positions`` default to the stream index of each token.
        """
        if not isinstance(state, PoMState):
            raise TypeError(f"state must be a PoMState (from init_state), got {type(state).__name__}")
        if self.value_dim is not None:
            if state.prev is None:
                raise ValueError("this state belongs to a plain PoM; the value-carrying PoM needs its own init_state")
            step = value_pom_step if self.decay is None else gated_value_pom_step
            extra = () if self.decay is None else (self.decay_proj.weight, self.decay_proj.bias)
            y, s, c, o, p = step(x, state.sum, state.count, state.offset, state.prev, *self.value_weights(), *extra,
                                 causal=causal, mask=mask, positions=positions, **self._op_kwargs())
            return y, PoMState(s, c, o, p)
        y, s, c, o = pom_step(
            x,
            state.sum,
            state.count,
            state.offset,
            self.in_proj.weight,
            self.gate_bias,
            self.coeff,
            self.out_proj.weight,
            self.out_proj.bias,
            causal=causal,
            mask=mask,
            positions=positions,
            **self._op_kwargs(),
        )
        return y, PoMState(s, c, o)

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
        """Load weights saved by the reference implementation (``n_groups=1``).

        Names: ``qc_proj.weight`` (D+Ds, d) — polynomial rows first, then gate rows —, ``se_bias`` (Ds,),
        ``po_coeff`` (D, k), ``ag_proj.weight`` (d, D) and optionally ``ag_proj.bias`` (d,). ``prefix`` selects one
        layer inside a whole model's state dict. Any missing, unexpected or mis-shaped tensor raises a ValueError
        that names it; nothing is loaded in that case.
        """
        if self.value_dim is not None:
            raise ValueError("the reference implementation has no value-carrying PoM; load into PoM(value_dim=None)")
        own = self.state_dict()
        keys = {k[len(prefix):]: k for k in state_dict if k.startswith(prefix)}
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

    def reference_state_dict(self) -> dict:
        """The inverse of :meth:`load_reference_state_dict`: this module's weights under the reference's names."""
        own = self.state_dict()
        return {ref: own[ours] for ref, ours in self._REFERENCE_NAMES.items() if ours in own}
