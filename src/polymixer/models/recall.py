"""The small language models of the recall benchmark (Zoology's MQAR setting): token and learned position
embeddings, a stack of pre-norm ``PolyMorpher`` blocks whose mixers a pattern names, a final norm and a tied head.

Pattern letters: ``A`` causal attention, ``L`` sliding-window attention, ``P`` PoM, ``V`` the value-carrying PoM,
``I`` linear attention (identity feature map), ``B`` Based (linear attention with the 2nd-order Taylor map).
``token_shift`` gives the A, L, P, I and B layers the value-carrying PoM's short causal token shift on their keys
and values (PoM's aggregated features), so that a comparison isolates the mixer. Each mixer's recurrent state per
layer and sequence (:meth:`RecallLM.state_floats`) is the x-axis of the benchmark: ``2·L·d`` for attention's KV
cache, ``2·window·d`` for a sliding window, D for PoM (+ d with the shift), D·dv/H (+ D + dv for the token shift)
for the value-carrying PoM, f·dv for linear attention, and (1 + f + f²)·(dv + H) for Based (+ H·f + dv with
``token_shift``, the previous token's keys and values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..blocks import PoMSettings, PolyMorpher, allowed_letters, layer_pattern, mixer_options, mixer_spec
from ..ranges import check_ranges
from ..values import token_shift

__all__ = ["RecallConfig", "RecallLM", "IGNORE"]

IGNORE = -100  # the label of a position that is not scored (cross_entropy's ignore_index)


@dataclass
class RecallConfig(PoMSettings):
    MIXER_LETTERS: ClassVar[str] = allowed_letters(causal=True, baselines=True)  # the comparison takes every mixer
    # (the token shifts are the model's own: token_shift, value_shift)
    MIXER_OPTIONS: ClassVar[Tuple[str, ...]] = ("heads", "window", "degree", "expand", "sel_heads", "gate",
                                                "reduction", "value_dim", "value_heads", "feature_dim")
    vocab_size: int = 2048
    seq_len: int = 64
    n_layer: int = 2
    d_model: int = 64
    mixer: str = "VV"  # a pattern over A / L / P / V / I / B, tiled to n_layer
    heads: int = 2  # attention heads
    window: int = 16  # L layers
    degree: int = 2  # P and V layers
    expand: float = 4  # P and V layers: D = expand·d_model
    value_dim: int = 64  # V, I and B layers: dv
    value_heads: int = 1  # V, I and B layers: the heads splitting D (or f) and dv
    feature_dim: int = 16  # I and B layers: f per head
    token_shift: bool = False  # A, L, P, I and B layers: the value PoM's causal token shift on keys and values
    value_shift: bool = True  # V and G layers: the value PoM's own token shift (False: without it, Zoology's figure
    #                          2 "with and without the shift" for every mixer)
    rope: bool = False  # A and L layers: rotary positions on queries and keys (on top of the learned positions)
    mlp_ratio: float = 4.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "n_layer", "d_model", "heads", "window", "degree", "value_dim",
                     "value_heads", "feature_dim"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        check_ranges(self)  # the shared settings' (expand, mlp_ratio)
        for name in ("token_shift", "rope", "value_shift"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        self.layer_pattern()

    def layer_pattern(self) -> str:
        return layer_pattern(self.mixer, self.n_layer, hybrid="LV", allowed=self.MIXER_LETTERS)


class RecallLM(nn.Module):
    """A causal LM over a pattern of mixers (see the module docstring)."""

    family = "recall"

    def __init__(self, config: RecallConfig) -> None:
        super().__init__()
        self.config = c = config
        self.wte = nn.Embedding(c.vocab_size, c.d_model)
        self.wpe = nn.Embedding(c.seq_len, c.d_model)
        self.blocks = nn.ModuleList(PolyMorpher(c.d_model, self.build_mixer(letter), mlp_ratio=c.mlp_ratio)
                                    for letter in c.layer_pattern())
        self.ln_f = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.head.weight = self.wte.weight
        self.initialize_weights()

    def initialize_weights(self) -> None:
        """N(0, 0.02) matrices (PoM's coefficients and the token shifts keep their modules' values)."""
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2 and "coeff" not in name and "shift" not in name:
                nn.init.normal_(p, std=0.02)

    def build_mixer(self, letter: str) -> nn.Module:
        c, spec = self.config, mixer_spec(letter)
        # the baselines' token shift (Based's short convolution) is a recall option; the value PoMs keep their own
        # unless value_shift is off; the mixers that have none (A, L, P) read the model's shifted keys and values
        shift = c.token_shift if spec.baseline else None if c.value_shift else False
        mixer = spec.make(c.d_model, causal=True, rope="1d" if c.rope else None, token_shift=shift, **mixer_options(c))
        return _ShiftedKeysValues(mixer) if c.token_shift and "token_shift" not in spec.options else mixer

    def state_floats(self, seq_len: Optional[int] = None) -> int:
        """Recurrent state per sequence of the largest layer: what a decoder keeps per layer at ``seq_len`` tokens
        (default: the model's; attention's cache grows with it)."""
        c = self.config
        n = c.seq_len if seq_len is None else seq_len
        sizes = []
        for letter, block in zip(c.layer_pattern(), self.blocks):
            m = block.mixer
            if letter in "AL":
                kv = 2 * (n if letter == "A" else min(c.window, n)) * c.d_model
                sizes.append(kv + c.d_model * c.token_shift)  # + the previous token, with the shift
            elif isinstance(m, _ShiftedKeysValues):  # PoM reading the shifted tokens: + the previous token
                sizes.append(m.mixer.state_floats + c.d_model)
            else:
                sizes.append(m.state_floats)
        return max(sizes)

    def forward(self, idx: Tensor, targets: Optional[Tensor] = None, *, labelled_only: bool = False
                ) -> Tuple[Tensor, Optional[Tensor]]:
        """Logits (B, N, vocab) and, given targets (−100 = ignored), the mean cross-entropy over the rest.

        ``labelled_only`` (with targets): the head runs only at the labelled positions, and the logits returned are
        theirs, (labelled, vocab) in row-major order. The loss and its gradients are the same; training needs
        nothing else, and at L = 64, K = 16 the head (most of the model's work) does a quarter of it."""
        if idx.dim() != 2 or idx.shape[1] > self.config.seq_len:
            raise ValueError(f"idx must be (batch, ≤ {self.config.seq_len}) token ids, got {tuple(idx.shape)}")
        if labelled_only and targets is None:
            raise ValueError("labelled_only needs the targets that say which positions are labelled")
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x, causal=True)
        x = self.ln_f(x)
        if labelled_only:
            keep = targets != IGNORE
            x, targets = x[keep], targets[keep]
        logits = self.head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)
        return logits, loss


class _ShiftedKeysValues(nn.Module):
    """An attention layer (or PoM, whose aggregated features play the keys) whose keys and values read the value
    PoM's learned causal token shift of its input, t₀ ⊙ x_j + t₁ ⊙ x_{j−1} (initialised 0.5 / 0.5), while its
    queries read x_i: the short convolution the other recall mixers have, so that a comparison isolates the mixer."""

    def __init__(self, mixer: nn.Module) -> None:
        super().__init__()
        self.mixer = mixer
        self.shift = nn.Parameter(torch.empty(2, mixer.dim))
        self.shift.no_weight_decay = True
        self.reset_parameters()
        self.register_load_state_dict_pre_hook(_renamed_mixer)

    def reset_parameters(self) -> None:
        """The shift's 0.5 / 0.5 (the mixer resets itself)."""
        with torch.no_grad():
            self.shift.fill_(0.5)

    def forward(self, x: Tensor, context: Optional[Tensor] = None, *, causal: Optional[bool] = None,
                **kwargs: Optional[Tensor]) -> Tensor:
        if context is not None:
            raise ValueError("the shifted attention of the recall models mixes a sequence with itself")
        return self.mixer(x, token_shift(x, self.shift)[0], causal=causal, **kwargs)


def _renamed_mixer(module: nn.Module, state_dict: Dict[str, Tensor], prefix: str, *args: Any) -> None:
    """Checkpoints written before the wrapped mixer was named ``mixer`` hold it as ``attention`` (PoM too)."""
    old = prefix + "attention."
    for key in [k for k in state_dict if k.startswith(old)]:
        state_dict[prefix + "mixer." + key[len(old):]] = state_dict.pop(key)


def _register() -> None:
    from .registry import register_model

    for letter, name in (("A", "attention"), ("L", "swa"), ("P", "pom"), ("V", "vpom"), ("I", "linear"),
                         ("B", "based")):
        register_model(f"mqar-{name}", "recall", RecallConfig, RecallLM,
                       f"2-layer MQAR model, {mixer_spec(letter).title}", mixer=letter * 2)


_register()
