"""PolyMorpher: the one residual block every model is built from, generic over its token mixer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from .layers.attention import Attention, AttentionState, LocalAttention
from .layers.linear_attention import LinearAttention
from .layers.pom import PoM, PoMState
from .layers.value_pom import GatedValuePoM, ValuePoM

__all__ = ["MLP", "DropPath", "PolyMorpher", "MixerSpec", "MIXER_TABLE", "MIXER_SPECS", "LETTERS", "mixer_spec",
           "allowed_letters", "build_mixer", "layer_pattern", "mixer_options", "check_mixer_options", "PoMSettings"]

MixerState = Union[PoMState, AttentionState]


@dataclass(frozen=True)
class MixerSpec:
    """One token mixer of the table: its name, its letter in a model's layer pattern, how to build it, which of a
    model's mixer options it takes, and what it can do — each model family takes the mixers that do what it needs
    (:func:`allowed_letters`)."""

    name: str  # "pom"
    letter: str  # "P": one letter per layer in a model's mixer pattern
    title: str  # "PoM", for messages and tables
    build: Callable[..., nn.Module]  # (dim, **options) → the module
    options: Tuple[str, ...]  # the model options it takes (a model passes all of its own; the rest are left out)
    causal: bool = True  # can mix causally (decoders)
    full: bool = True  # can mix bidirectionally (encoders)
    streaming: Optional[str] = "constant"  # a decoding step keeps "constant" state, a "window", a cache that "grows"
    distance_free: bool = True  # a token's weight does not fall with its distance along the order (no window, decay)
    baseline: bool = False  # a recall baseline: no rotary positions, packing, step or context parallelism

    def make(self, dim: int, **options: Any) -> nn.Module:
        """Build with the options this mixer takes out of ``options`` (a model's whole set: heads, window, degree,
        expand, value_dim, rope, …); None means the mixer's own default."""
        return self.build(dim, **{k: v for k, v in options.items() if k in self.options and v is not None})


_ATTENTION_OPTIONS = ("heads", "causal", "dropout", "rope", "rope_base", "bias", "qkv_bias", "attention_shift")
_POM_OPTIONS = ("degree", "expand", "sel_heads", "rope", "rope_base", "rope_convention", "bias", "gate", "activation",
                "reduction")
_VALUE_OPTIONS = _POM_OPTIONS + ("value_dim", "value_heads", "token_shift", "chunk_size")
_LINEAR_OPTIONS = ("value_heads", "feature_dim", "value_dim", "causal", "bias", "token_shift", "chunk_size")


def _attention(cls: type, **defaults: Any) -> Callable[..., nn.Module]:
    """Builds ``cls`` with a head per 64 channels and ``defaults`` where not given, a model's attention_shift its
    token shift."""
    def build(dim: int, attention_shift: int = 0, **kw: Any) -> nn.Module:
        return cls(dim, token_shift=attention_shift or None, **{"heads": max(1, dim // 64), **defaults, **kw})
    return build


def _pom(dim: int, pom_shift: int = 0, **kw: Any) -> nn.Module:
    """Builds a PoM, a model's pom_shift its token shift (a model's token_shift is its value PoMs')."""
    return PoM(dim, **({"token_shift": pom_shift} if pom_shift else {}), **kw)


def _value_heads(cls: type, **fixed: Any) -> Callable[..., nn.Module]:
    """Builds ``cls`` with a model's value_heads as its heads (attention's are a model's heads)."""
    def build(dim: int, value_heads: int = 1, **kw: Any) -> nn.Module:
        return cls(dim, heads=value_heads, **fixed, **kw)
    return build


# The one table of token mixers: every family's layer pattern, pomify and the recall benchmark read it. Adding a
# mixer is one entry here (and its module).
MIXER_TABLE: Tuple[MixerSpec, ...] = (
    MixerSpec("pom", "P", "PoM", _pom, _POM_OPTIONS + ("pom_shift",)),
    MixerSpec("value_pom", "V", "value-carrying PoM", _value_heads(ValuePoM), _VALUE_OPTIONS),
    MixerSpec("gated_value_pom", "G", "gated value-carrying PoM", _value_heads(GatedValuePoM), _VALUE_OPTIONS,
              distance_free=False),
    MixerSpec("attention", "A", "attention", _attention(Attention), _ATTENTION_OPTIONS, streaming="grows"),
    MixerSpec("local_attention", "L", "local (sliding-window) attention", _attention(LocalAttention, window=128,
              causal=True), _ATTENTION_OPTIONS + ("window",), streaming="window", distance_free=False),
    MixerSpec("linear_attention", "I", "linear attention (identity map)",
              _value_heads(LinearAttention, feature_map="identity"), _LINEAR_OPTIONS, streaming=None, baseline=True),
    MixerSpec("based", "B", "Based (Taylor map)", _value_heads(LinearAttention, feature_map="taylor"), _LINEAR_OPTIONS,
              streaming=None, baseline=True),
)
MIXER_SPECS: Dict[str, MixerSpec] = {m.name: m for m in MIXER_TABLE}
# one letter per layer in a model's mixer pattern
LETTERS: Dict[str, str] = {m.letter: m.name for m in MIXER_TABLE}


def mixer_spec(kind: str) -> MixerSpec:
    """The table entry of a mixer by name ("pom") or pattern letter ("P")."""
    spec = MIXER_SPECS.get(LETTERS.get(kind, kind))
    if spec is None:
        raise ValueError(f"unknown mixer {kind!r}; the mixers are "
                         f"{', '.join(f'{m.name} ({m.letter})' for m in MIXER_TABLE)}")
    return spec


def allowed_letters(*, causal: bool = False, full: bool = False, streaming: bool = False,
                    distance_free: bool = False, baselines: bool = False) -> str:
    """The letters, in table order, of the mixers that do what a model family needs: mix causally (``causal``) or
    bidirectionally (``full``), decode step by step (``streaming``), weigh tokens whatever their distance along the
    order (``distance_free``); the comparison baselines only with ``baselines``."""
    return "".join(m.letter for m in MIXER_TABLE if (m.causal or not causal) and (m.full or not full)
                   and (m.streaming or not streaming) and (m.distance_free or not distance_free)
                   and (baselines or not m.baseline))


def layer_pattern(mixer: str, n_layers: int, hybrid: str, allowed: str) -> str:
    """One letter per layer of the mixer table (P = PoM, A = attention, L = local attention, V = value-carrying
    PoM, G = gated value PoM, I = linear attention, B = Based) for a model of ``n_layers`` blocks.

    ``mixer`` is a mixer's name ("attention", "pom", "value_pom", …), "hybrid" (the family's ``hybrid`` unit, tiled)
    or an explicit pattern such as "PPA", tiled to ``n_layers``; ``allowed``: the family's letters
    (:func:`allowed_letters`).
    """
    if mixer in MIXER_SPECS and MIXER_SPECS[mixer].letter in allowed:
        return MIXER_SPECS[mixer].letter * n_layers
    if mixer == "hybrid":
        if n_layers % len(hybrid):
            raise ValueError(f"the hybrid repeats {hybrid!r}: the number of layers must be a multiple of "
                             f"{len(hybrid)}, got {n_layers}")
        return hybrid * (n_layers // len(hybrid))
    bad = sorted(set(mixer) - set(allowed))
    if not mixer or bad:
        names = ", ".join(f"{c} ({mixer_spec(c).title})" for c in allowed)
        words = ", ".join(f"'{mixer_spec(c).name}'" for c in allowed)
        raise ValueError(f"unknown mixer {mixer!r}: use {words}, 'hybrid' or a pattern over {names}"
                         + (f"; unknown letters {bad}" if bad else ""))
    if n_layers % len(mixer):
        raise ValueError(f"pattern {mixer!r} ({len(mixer)} letters) does not tile {n_layers} layers")
    return mixer * (n_layers // len(mixer))


def mixer_options(config: Any) -> Dict[str, Any]:
    """The options a model config gives every mixer under the names of its fields (its ``MIXER_OPTIONS``; one set
    over a preset must be taken by some layer: :func:`polymixer.models.check_overrides`)."""
    return {name: getattr(config, name) for name in config.MIXER_OPTIONS}


@dataclass
class PoMSettings:
    """The PoM settings every family's model config shares (its own default: the field declared again)."""
    sel_heads: int = 1  # the gate's width: 1 = a gate per channel (the paper's), h = one gate scalar per head
    gate: str = "hardsigmoid"  # the gate function: "hardsigmoid" (the reference code's) | "sigmoid" (the paper's text)
    reduction: str = "mean"  # the aggregation over the tokens: "mean" (the reference code's) | "sum" (the paper's)


def check_mixer_options(pattern: str, given: Dict[str, Any]) -> None:
    """Refuse each mixer option of ``given`` (option name → the value a user set) that no mixer of ``pattern`` (a
    model's layer letters) takes: a setting that changes nothing is a ValueError naming it, the model's mixers and
    those that take it."""
    mine = [mixer_spec(c) for c in dict.fromkeys(pattern)]
    for name, value in given.items():
        if not any(name in m.options for m in mine):
            takers = ", ".join(m.name for m in MIXER_TABLE if name in m.options)
            raise ValueError(f"{name}={value!r} is taken by no mixer of this model "
                             f"({', '.join(f'{m.name} {m.letter}' for m in mine)}); it is taken by {takers}")


def build_mixer(kind: Union[str, nn.Module], dim: int, **kwargs: Any) -> nn.Module:
    """A token mixer by name ("pom", "attention", "local_attention", "value_pom", "linear_attention", "based") or
    pattern letter, with exactly these keyword arguments; or an already-built module."""
    if isinstance(kind, nn.Module):
        if kwargs:
            raise ValueError(f"mixer keyword arguments {sorted(kwargs)} given with an already-built mixer module")
        return kind
    return mixer_spec(kind).build(dim, **kwargs)


class MLP(nn.Module):
    """Position-wise feed-forward: Linear → GELU → Linear → dropout."""

    def __init__(self, dim: int, hidden: int, bias: bool = True, dropout: float = 0.0,
                 activation: Callable[[], nn.Module] = nn.GELU) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, bias=bias)
        self.act = activation()
        self.fc2 = nn.Linear(hidden, dim, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.act(self.fc1(x))))


class DropPath(nn.Module):
    """Stochastic depth: in training, zero a residual branch for a random subset of the rows of its first axis (rate
    ``p``; samples of a (B, N, C) batch, points of a packed (N, C) cloud as in PTv3) and scale the rest by 1/(1-p)."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"drop-path rate must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"p={self.p}"


class PolyMorpher(nn.Module):
    """Residual token mixer + residual feed-forward.

    Pre-norm (``norm_first=True``): ``x = x + dp(drop(mixer(norm1(x))))``, ``x = x + dp(mlp(norm2(x)))``.
    Post-norm: ``x = norm1(x + drop(mixer(x)))``, ``x = norm2(x + mlp(x))``. ``dp`` is stochastic depth
    (:class:`DropPath`, off unless ``drop_path`` > 0).

    Every keyword of the mixer's forward (mask, causal, block_size, cu_seqlens, positions, … and any keyword a
    custom mixer module takes) is passed through, and ``init_state`` / ``step`` stream through whatever mixer the
    block holds.

    Args:
        dim: model width.
        mixer: "pom", "attention", "local_attention" or a module with the PoM / Attention contract.
        mlp_ratio: hidden width of the feed-forward as a multiple of dim; 0 = no feed-forward (a mixer-only block,
            as Zoology's MQAR models).
        norm_first: pre-norm (GPT-2, DiT) or post-norm.
        dropout: residual dropout (also the attention-probability dropout of attention mixers unless given).
        bias: biases of the feed-forward and norms.
        mixer_bias: biases of the mixer's projections (default: the mixer's own default).
        norm_affine: learned scale / shift in the norms (off when a conditioning supplies them, as adaLN).
        mlp_activation: the feed-forward's non-linearity (a module factory; GELU by default).
        drop_path: stochastic-depth rate of both residual branches (PTv3, Swin).
        **mixer_kwargs: passed to the mixer's constructor (e.g. degree, expand, heads, window, rope).
    """

    def __init__(
        self,
        dim: int,
        mixer: Union[str, nn.Module] = "pom",
        mlp_ratio: float = 4.0,
        norm_first: bool = True,
        dropout: float = 0.0,
        bias: bool = True,
        norm_eps: float = 1e-5,
        mixer_bias: Optional[bool] = None,
        norm_affine: bool = True,
        mlp_activation: Callable[[], nn.Module] = nn.GELU,
        drop_path: float = 0.0,
        **mixer_kwargs: Any,
    ) -> None:
        super().__init__()
        if mlp_ratio < 0:
            raise ValueError(f"mlp_ratio must be ≥ 0 (0: no feed-forward), got {mlp_ratio}")
        if mixer_bias is not None:
            mixer_kwargs["bias"] = mixer_bias
        if isinstance(mixer, str) and "dropout" in mixer_spec(mixer).options:
            mixer_kwargs.setdefault("dropout", dropout)
        self.kind = mixer if isinstance(mixer, str) else type(mixer).__name__
        self.norm_first = norm_first
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps, elementwise_affine=norm_affine, bias=bias)
        self.mixer = build_mixer(mixer, dim, **mixer_kwargs)
        self.drop = nn.Dropout(dropout)
        self.norm2: Optional[nn.Module] = None
        self.mlp: Optional[nn.Module] = None
        if mlp_ratio > 0:
            self.norm2 = nn.LayerNorm(dim, eps=norm_eps, elementwise_affine=norm_affine, bias=bias)
            self.mlp = MLP(dim, int(round(mlp_ratio * dim)), bias=bias, dropout=dropout, activation=mlp_activation)
        self.drop_path = DropPath(drop_path)

    def forward(self, x: Tensor, context: Optional[Tensor] = None, **modes: Any) -> Tensor:
        """The block over ``x`` (and ``context`` for cross-mixing); ``modes``: the mixer's forward keywords
        (:meth:`polymixer.PoM.forward`), those given as None left to the mixer's defaults."""
        kw = {k: v for k, v in modes.items() if v is not None}
        dp = self.drop_path
        if self.norm_first:
            x = x + dp(self.drop(self.mixer(self.norm1(x), context, **kw)))
            return x if self.mlp is None else x + dp(self.mlp(self.norm2(x)))
        x = self.norm1(x + dp(self.drop(self.mixer(x, context, **kw))))
        return x if self.mlp is None else self.norm2(x + dp(self.mlp(x)))

    def init_state(self, batch_size: int, device: Optional[torch.device] = None,
                   dtype: Optional[torch.dtype] = None) -> MixerState:
        return self.mixer.init_state(batch_size, device=device, dtype=dtype)

    def step(self, x: Tensor, state: MixerState, causal: bool = True, positions: Optional[Tensor] = None,
             mask: Optional[Tensor] = None) -> Tuple[Tensor, MixerState]:
        """Stream a chunk through the block: (y, new_state). The feed-forward is per token: only the mixer has
        state."""
        if self.norm_first:
            m, state = self.mixer.step(self.norm1(x), state, causal=causal, positions=positions, mask=mask)
            x = x + self.drop(m)
            return (x if self.mlp is None else x + self.mlp(self.norm2(x))), state
        m, state = self.mixer.step(x, state, causal=causal, positions=positions, mask=mask)
        x = self.norm1(x + self.drop(m))
        return (x if self.mlp is None else self.norm2(x + self.mlp(x))), state
