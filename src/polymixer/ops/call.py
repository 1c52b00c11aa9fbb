"""A call of an op as its backends receive it — validated once by the op's front end — and the state of a stream.

Every op (``pom``, ``value_pom``, ``gated_value_pom``) takes ``(x, weights, context=None, *, state=None, **modes)``:
``weights`` one object of the op's own type (``PomWeights``, ``ValuePomWeights``, ``GatedValuePomWeights``; a layer
builds it: ``layer.weights``), ``modes`` the keywords of :class:`~polymixer.ops.common.Mixing`, and ``state`` the
:class:`PoMState` of everything a stream saw before ``x`` — then the op mixes ``x`` after it and returns
``(y, the state after x)``, the one signature for training and decoding. :func:`make_call` checks what every op
checks and builds the :class:`Call`; each op's ``call.py`` adds its weights' layout and its state's shape.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, TypeVar, Union

import torch
from torch import Tensor
from torch.utils import _pytree

from .common import STEP_MODES, Mixing, batch_packed, check_mix_inputs, check_positions, packed_local_positions
from .features import CHUNK

__all__ = ["Call", "make_call", "check_weights", "validated", "refuse_split", "every_call", "BatchState", "PoMState",
           "Index", "batch_index"]

Index = Union[int, slice, Sequence[int], Tensor]


def batch_index(index: Index, device: torch.device) -> Union[slice, Tensor]:
    """Normalise a batch index so that the batch dimension is always kept."""
    if isinstance(index, int):
        return slice(index, index + 1) if index != -1 else slice(-1, None)
    if isinstance(index, slice):
        return index
    return torch.as_tensor(index, device=device)


S = TypeVar("S", bound="BatchState")


class BatchState:
    """What every stream state shares (:class:`PoMState`, attention's ``AttentionState``): a dataclass whose tensors
    hold one row per sequence, selected, reordered and measured row-wise (beam search, batch compaction, the memory a
    decoder keeps). Its other fields (None, plain numbers) are carried over as they are."""

    def tensors(self) -> Dict[str, Tensor]:
        """The state's tensors by field name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), Tensor)}

    @property
    def batch_size(self) -> int:
        return next(iter(self.tensors().values())).shape[0]

    def __len__(self) -> int:
        return self.batch_size

    def __getitem__(self: S, index: Index) -> S:
        """Select / reorder sequences along the batch (beam search, batch compaction); the batch dim is kept."""
        i = batch_index(index, next(iter(self.tensors().values())).device)
        return self._map(lambda t: t[i])

    def index_select(self: S, index: Tensor) -> S:
        return self[index]

    def _map(self: S, fn: Callable[[Tensor], Tensor]) -> S:
        return replace(self, **{name: fn(t) for name, t in self.tensors().items()})

    @property
    def memory_bytes(self) -> int:
        """Bytes the state's tensors hold."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())


@dataclass
class PoMState(BatchState):
    """Everything a causal PoM needs to continue a stream, whatever its length: O(D) per sequence, or
    O(D·dv/heads + D + dv) for the value-carrying PoM.

    Attributes:
        sum: (B, D) running sum of the (rotated) polynomial features, fp32 (fp64 for fp64 streams); for the
            value-carrying PoM (B, heads, D/heads, dv/heads), the running sum of key features ⊗ values.
        count: (B,) number of tokens that took part so far (masked tokens are not counted).
        offset: (B,) int64 index of the next token in the stream (its default rotary position).
        prev: (B, W − 1, D + dv) the last tokens' key / value projections (the memory of a token shift of width W;
            one token without a shift) for the value-carrying PoM; (B, W − 1, D) for a PoM with a token shift, else
            None.
    """

    sum: Tensor
    count: Tensor
    offset: Tensor
    prev: Optional[Tensor] = None

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


@dataclass(eq=False)
class Call:
    """A validated call: (B, M, d) queries ``x`` (a 2-D packed input (T, d) batched as (1, T, d); ``squeeze``: give
    the output back 2-D), (B, N, d) ``context`` (None: self-mixing), the op's ``weights``, the mode as given
    (``mixing``) with its masks and offsets normalised, the stream's ``state`` (None: no stream), and the value PoM's
    ``heads`` and ``chunk``."""

    x: Tensor
    context: Optional[Tensor]
    weights: Any  # the op's weights type, read by field name
    mixing: Mixing
    key_mask: Optional[Tensor]  # (B, N) bool
    mask: Optional[Tensor]  # (B, M, N) bool, general visibility
    cu_q: Optional[Tensor]  # packed queries of cross-mixing (None: self-mixing packed, or no packing)
    cu_k: Optional[Tensor]  # packed context offsets
    B: int
    M: int
    N: int
    squeeze: bool = False
    state: Optional[PoMState] = None
    heads: int = 1
    chunk: int = CHUNK

    # the mode, read from ``mixing``
    causal = property(lambda self: self.mixing.causal)
    block_size = property(lambda self: self.mixing.block_size)
    positions = property(lambda self: self.mixing.positions)
    context_positions = property(lambda self: self.mixing.context_positions)
    activation = property(lambda self: self.mixing.activation)
    gate = property(lambda self: self.mixing.gate)
    reduction = property(lambda self: self.mixing.reduction)
    rope = property(lambda self: self.mixing.rope)
    rope_base = property(lambda self: self.mixing.rope_base)
    rope_convention = property(lambda self: self.mixing.rope_convention)

    @property
    def self_mix(self) -> bool:
        return self.context is None

    @property
    def D(self) -> int:
        """The polynomial (key) width."""
        return self.weights.coeff.shape[0]

    @property
    def Ds(self) -> int:
        """The gate width."""
        return self.weights.gate_bias.shape[0]

    @property
    def dv(self) -> int:
        """The width the output projection reads (the value PoM's value width; PoM's D)."""
        return self.weights.out_weight.shape[1]

    def tensors(self) -> Tuple[Optional[Tensor], ...]:
        """Every tensor of the call (inputs, weights, masks, positions): e.g. to ask whether any needs a gradient."""
        m = self.mixing
        return (self.x, self.context, *self.weights, m.mask, m.positions, m.context_positions)

    def rope_positions(self, default: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """(query positions, context positions) of a rotary call, checked: the call's own, else ``default`` (1-D: a
        stream's or a slice's global index), else each token's index in its sequence; the context's default to the
        queries' when self-mixing."""
        m, device = self.mixing, self.x.device
        pos = m.positions if m.positions is not None or m.two_d else default
        cpos = pos if self.self_mix and m.context_positions is None else m.context_positions
        kname = "positions" if self.self_mix else "context_positions"
        if cpos is None:
            cpos = packed_local_positions(self.cu_k, self.N, device, m.two_d, kname)
        if pos is None:
            cu = self.cu_q if self.cu_q is not None else self.cu_k
            pos = packed_local_positions(cu, self.M, device, m.two_d, "positions")
        check_positions(cpos, self.B, self.N, m.two_d, kname)
        check_positions(pos, self.B, self.M, m.two_d, "positions")
        return pos, cpos

    def result(self, out: Any) -> Any:
        """What the op returns of its backend's ``out``: (y, state) of a stream as it is, y 2-D again for a 2-D packed
        input."""
        return out if self.state is not None or not self.squeeze else out.squeeze(0)


def check_weights(op: str, weights: Any, kind: type) -> None:
    """``weights`` must be one object of the op's weights type ``kind`` (a layer builds it: ``layer.weights``)."""
    if not isinstance(weights, kind):
        raise TypeError(f"{op} takes its weights as one {kind.__name__} (a layer's .weights), got "
                        f"{type(weights).__name__}")


def make_call(op: str, x: Tensor, context: Optional[Tensor], weights: Any, modes: Dict[str, Any],
              state: Optional[PoMState] = None, **extra: Any) -> Call:
    """Check what every op checks — the mode keywords of ``op``, the inputs against the mode, a stream's state and
    modes — and build the :class:`Call` (``extra``: its heads and chunk). A ValueError / TypeError with the one-line
    reason otherwise; the op checks its weights (:func:`check_weights`) and their layout first."""
    mixing = Mixing.of(op, modes)
    mixing.check()
    if state is not None:
        if not isinstance(state, PoMState):
            raise TypeError(f"state must be a PoMState (from the layer's init_state), got {type(state).__name__}")
        given = [k for k in ("block_size", "cu_seqlens", "context_positions") if getattr(mixing, k) is not None]
        if given or context is not None:
            raise ValueError(f"a stream (state=…) mixes x after its past, with the modes {', '.join(STEP_MODES)}: "
                             f"{given[0] if given else 'context'} is not one of them")
        if mixing.rope == "2d" and mixing.positions is None:
            raise ValueError("2-D rotary streaming needs explicit positions of shape (B, T, 2) or (T, 2)")
    x, context, squeeze = batch_packed(x, context, mixing.cu_seqlens)
    m = mixing
    B, M, N, key_mask, general, cu_q, cu_k = check_mix_inputs(x, context, weights.out_weight.shape[0], m.mask,
                                                              m.causal, m.block_size, m.cu_seqlens)
    if state is not None and general is not None:
        raise ValueError(f"a stream takes a (B, T) mask of its chunk's tokens, got {tuple(general.shape)}")
    return Call(x, context, weights, mixing, key_mask, general, cu_q, cu_k, B, M, N, squeeze, state, **extra)


def every_call(call: Call) -> Optional[str]:
    """``supports`` of a backend that takes every call (the torch forms): None."""
    return None


def validated(make: Callable[..., Call], *args: Any) -> Tuple[Optional[Call], Optional[str]]:
    """(``make(*args)``, None), or (None, the one-line reason it refused the call): under context parallelism a bad
    call is refused on every rank at their agreement (a rank that raised alone would leave the others waiting)."""
    try:
        return make(*args), None
    except (ValueError, TypeError) as e:
        return None, str(e)


def refuse_split(call: Call) -> Optional[str]:
    """Why a validated call cannot be split across ranks by :func:`polymixer.context_parallel` (None: it can)."""
    if not call.self_mix:
        return "cross-mixing cannot be split: pass the whole context on every rank (or mix outside the context)"
    if call.cu_k is not None:
        return "packed sequences (cu_seqlens) cannot be split across ranks: give each rank a padded batch slice"
    if call.mask is not None:
        return "an explicit (B, M, N) mask cannot be split: use key padding, causal or block-causal masking"
    if call.rope == "2d" and call.positions is None:
        return "2-D rotary needs this slice's explicit (row, col) positions"
    if call.state is not None and not call.causal:
        return "a stream under context_parallel is causal only (frames are not split)"
    return None
