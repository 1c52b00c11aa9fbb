"""The PoM module: parameters, forward in every masking mode, streaming state, reference checkpoint loading."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn
from torch.utils import _pytree

from . import functional as Fn

__all__ = ["PoM", "PoMState"]

Index = Union[int, slice, Sequence[int], Tensor]


def _batch_index(index: Index, device: torch.device) -> Union[slice, Tensor]:
    """Normalise a batch index so that the batch dimension is always kept."""
    if isinstance(index, int):
        return slice(index, index + 1) if index != -1 else slice(-1, None)
    if isinstance(index, slice):
        return index
    return torch.as_tensor(index, device=device)


@dataclass
class PoMState:
    """Everything a causal PoM needs to continue a stream: O(D) per sequence, whatever its length.

    Attributes:
        sum: (B, D) running sum of the (rotated) polynomial features, fp32 (fp64 for fp64 streams).
        count: (B,) number of tokens that took part so far (masked tokens are not counted).
        offset: (B,) int64 index of the next token in the stream (its default rotary position).
    """

    sum: Tensor
    count: Tensor
    offset: Tensor

    @property
    def batch_size(self) -> int:
        return self.sum.shape[0]

    def __len__(self) -> int:
        return self.batch_size

    def __getitem__(self, index: Index) -> "PoMState":
        """Select / reorder sequences along the batch (beam search, batch compaction); the batch dim is kept."""
        i = _batch_index(index, self.sum.device)
        return PoMState(self.sum[i], self.count[i], self.offset[i])

    def index_select(self, index: Tensor) -> "PoMState":
        return PoMState(self.sum.index_select(0, index), self.count.index_select(0, index), self.offset.index_select(0, index))

    @staticmethod
    def cat(states: Sequence["PoMState"]) -> "PoMState":
        """Concatenate states along the batch (e.g. to add new requests to a running batch)."""
        return PoMState(*(torch.cat([getattr(s, f.name) for s in states]) for f in fields(PoMState)))

    def to(self, *args: Any, **kwargs: Any) -> "PoMState":
        """Move to a device; the accumulation dtype is kept (the state never drops below fp32)."""
        kwargs.pop("dtype", None)
        args = tuple(a for a in args if not isinstance(a, torch.dtype))
        return PoMState(self.sum.to(*args, **kwargs), self.count.to(*args, **kwargs), self.offset.to(*args, **kwargs))

    def detach(self) -> "PoMState":
        return PoMState(self.sum.detach(), self.count.detach(), self.offset)


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
    """

    def __init__(
        self,
        dim: int,
        degree: int = 2,
        expand: Union[int, float] = 2,
        sel_heads: int = 1,
        gate: Fn.ActivationLike = "hardsigmoid",
        activation: Fn.ActivationLike = "leaky_clamp",
        reduction: str = "mean",
        bias: bool = False,
        rope: Optional[str] = None,
        rope_base: float = 10000.0,
        device: Optional[torch.device] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        for name, value in (("dim", dim), ("degree", degree), ("sel_heads", sel_heads)):
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
        if D % sel_heads != 0:
            raise ValueError(f"expand·dim = {D} is not divisible by sel_heads = {sel_heads}")
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
        if rope not in (None, "1d", "2d"):
            raise ValueError(f"rope must be None, '1d' or '2d', got {rope!r}")
        if rope == "1d" and D % 2:
            raise ValueError(f"1-D rotary needs an even expand·dim, got {D}")
        if rope == "2d" and D % 4:
            raise ValueError(f"2-D rotary needs expand·dim divisible by 4, got {D}")
        Fn._resolve(Fn.GATES, gate, "gate")
        Fn._resolve(Fn.ACTIVATIONS, activation, "activation")

        self.dim = dim
        self.degree = degree
        self.expand = expand
        self.sel_heads = sel_heads
        self.poly_dim = D
        self.gate_dim = D if sel_heads == 1 else sel_heads
        self.gate = gate
        self.activation = activation
        self.reduction = reduction
        self.rope = rope
        self.rope_base = float(rope_base)

        fk = {"device": device, "dtype": dtype}
        self.in_proj = nn.Linear(dim, D + self.gate_dim, bias=False, **fk)  # W_h stacked over W_s
        self.gate_bias = nn.Parameter(torch.zeros(self.gate_dim, **fk))
        self.coeff = nn.Parameter(torch.empty(D, degree, **fk))
        self.coeff.no_weight_decay = True  # polynomial coefficients are gains, not a matrix: never decayed
        self.out_proj = nn.Linear(D, dim, bias=bias, **fk)
        self._reset_coeff()

    def _reset_coeff(self) -> None:
        with torch.no_grad():
            if self.coeff.device.type != "meta":
                self.coeff.uniform_(-1e-3, 1e-3)

    def reset_parameters(self) -> None:
        self.in_proj.reset_parameters()
        self.out_proj.reset_parameters()
        nn.init.zeros_(self.gate_bias)
        self._reset_coeff()

    def extra_repr(self) -> str:
        s = f"dim={self.dim}, degree={self.degree}, expand={self.expand}, D={self.poly_dim}, gate_dim={self.gate_dim}"
        s += f", gate={self.gate!r}, activation={self.activation!r}, reduction={self.reduction!r}"
        return s + (f", rope={self.rope!r}" if self.rope else "")

    def _op_kwargs(self) -> dict:
        return dict(
            activation=self.activation, gate=self.gate, reduction=self.reduction, rope=self.rope, rope_base=self.rope_base
        )

    def forward(
        self,
        x: Tensor,
        context: Optional[Tensor] = None,
        *,
        mask: Optional[Tensor] = None,
        causal: bool = False,
        block_size: Optional[int] = None,
        cu_seqlens: Optional[Fn.CuSeqlens] = None,
        positions: Optional[Tensor] = None,
        context_positions: Optional[Tensor] = None,
    ) -> Tensor:
        """Mix tokens. See :func:`polymixer.functional.pom` for every argument.

        x: (B, M, dim); context: (B, N, dim) for cross-mixing; mask: (B, N) key padding or (B, M, N) bool
        (True = takes part); causal / block_size: (block-)causal; cu_seqlens: packed int32 offsets (B = 1).
        Cost O((M + N)·dim·D) — except a (B, M, N) mask, O(M·N·D).
        """
        return Fn.pom(
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
        acc = Fn._compute_dtype(self.coeff.dtype if dtype is None else dtype)
        return PoMState(
            sum=torch.zeros(batch_size, self.poly_dim, dtype=acc, device=device),
            count=torch.zeros(batch_size, dtype=acc, device=device),
            offset=torch.zeros(batch_size, dtype=torch.int64, device=device),
        )

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
        y, s, c, o = Fn.pom_step(
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
