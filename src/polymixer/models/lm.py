"""GPT-2 language models whose layers are chosen by a pattern: attention (GPT-2), PoM (GPPoM2), or both (hybrid).

nanoGPT's architecture — token embedding tied to the output head, learned absolute positions (or rotary, or none),
pre-norm blocks, GELU MLP, GPT-2 initialisation with residual projections scaled by 1/√(2·layers) — where every block
is the core's :class:`~polymixer.PolyMorpher` holding the mixer its pattern letter names:

    P = causal PoM       A = causal attention       L = causal local attention (sliding window)

Decoding prefills the prompt in parallel, then steps one token at a time with per-layer state: PoM layers keep their
O(D) running sums, local attention a ring buffer of ``window`` keys/values, global attention a growing KV cache. A
model without global attention therefore decodes in constant time and memory per token, whatever the context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..blocks import PoMSettings, PolyMorpher, allowed_letters, layer_pattern, mixer_options, mixer_spec
from ..layers.pom import Index, batch_index, shift_width
from ..ranges import Range, check_ranges
from ..ops import parallel
from ..ops.common import documents_cu_seqlens, is_compiling, segments

__all__ = ["LMConfig", "GPT", "LMState", "pad_left"]

@dataclass
class LMConfig(PoMSettings):
    RENAMED: ClassVar[Dict[str, str]] = {"shift_width": "token_shift"}  # earlier names (checkpoints load)
    RANGES: ClassVar[Dict[str, Range]] = {  # checked when a config is made (polymixer.ranges; the shared ones too)
        **{n: Range(1) for n in ("vocab_size", "block_size", "n_layer", "n_embd", "n_head", "window")},
        "rope_base": Range(0, low_open=True)}
    MIXER_LETTERS: ClassVar[str] = allowed_letters(causal=True, streaming=True)  # every layer decodes token by token
    MIXER_OPTIONS: ClassVar[Tuple[str, ...]] = ("window", "rope_base", "degree", "expand", "sel_heads", "gate",
                                                "reduction", "value_dim", "value_heads", "token_shift",
                                                "attention_shift", "pom_shift")
    vocab_size: int = 50304
    block_size: int = 1024
    n_layer: int = 12
    n_embd: int = 768
    n_head: int = 12
    mixer: str = "attention"  # "attention" | "pom" | "hybrid" (= "LPLP…") | a pattern over P/A/L/V such as "PLPL"
    window: int = 128  # local-attention window (L layers)
    degree: int = 2  # PoM degree
    expand: float = 2  # PoM expansion D = expand·n_embd
    value_dim: Optional[int] = None  # V layers (value-carrying PoM): value width dv (None: n_embd)
    value_heads: int = 1  # V layers: heads splitting D and dv; state D·dv/value_heads floats per layer
    token_shift: int = 2  # V layers: tokens the key / value shift reads (2: each and the previous; more: a short conv)
    pom_shift: int = 0  # P layers: tokens the shift of W_h c reads (0: none; the value PoM's shift, offered to PoM)
    attention_shift: int = 0  # A / L layers: tokens their key / value shift reads (0: none; the value PoM's shift,
    #                           offered to attention alike)
    position: str = "learned"  # "learned" | "rope" | "none"
    dropout: float = 0.0
    bias: bool = True
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        if self.position not in ("learned", "rope", "none"):
            raise ValueError(f"position must be 'learned', 'rope' or 'none', got {self.position!r}")
        check_ranges(self)
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd = {self.n_embd} is not divisible by n_head = {self.n_head}")
        shift_width(self.token_shift, "token_shift", off=False)
        shift_width(self.attention_shift, "attention_shift")
        shift_width(self.pom_shift, "pom_shift")
        self.layer_pattern()

    def layer_pattern(self) -> str:
        """One letter per layer: the mixer preset name or an explicit pattern over P / A / L, tiled to n_layer.

        The hybrid puts local attention first in every pair: each PoM layer then aggregates local n-gram features
        rather than raw token embeddings (measured on the tiny presets: +1.0% val loss over attention vs +5.1% for
        "PL")."""
        return layer_pattern(self.mixer, self.n_layer, hybrid="LP", allowed=self.MIXER_LETTERS)


@dataclass
class LMState:
    """Decoding state of a whole model: one state per layer and each row's next position."""

    layers: list
    pos: Tensor  # (B,) int64: number of real (unpadded) tokens seen

    @property
    def batch_size(self) -> int:
        return self.pos.shape[0]

    def __getitem__(self, index: Index) -> "LMState":
        i = batch_index(index, self.pos.device)
        return LMState([s[i] for s in self.layers], self.pos[i])

    @property
    def memory_bytes(self) -> int:
        """Bytes held by the state (what decoding keeps between tokens)."""
        return self.pos.numel() * self.pos.element_size() + sum(s.memory_bytes for s in self.layers)


def pad_left(prompts: Sequence[Sequence[int]], pad_id: int = 0) -> Tuple[Tensor, Tensor]:
    """Left-pad token lists into (idx (B, T) int64, mask (B, T) bool — True for real tokens)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    T = max(len(p) for p in prompts)
    idx = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), T, dtype=torch.bool)
    for i, p in enumerate(prompts):
        idx[i, T - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
        mask[i, T - len(p):] = True
    return idx, mask


class GPT(nn.Module):
    """nanoGPT's GPT-2 with a mixer per layer; see :class:`LMConfig`."""

    family = "lm"

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.pattern = c.layer_pattern()
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.block_size, c.n_embd) if c.position == "learned" else None
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(PolyMorpher(c.n_embd, mixer=self.build_mixer(letter), mlp_ratio=4.0,
                                                dropout=c.dropout, bias=c.bias) for letter in self.pattern)
        self.ln_f = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self.initialize_weights()

    def initialize_weights(self) -> None:
        """GPT-2's: N(0, 0.02) linears and embeddings, zero biases, residual projections at 0.02 / √(2 · n_layer)."""
        self.apply(self._init_weights)
        scaled = 0.02 / math.sqrt(2 * self.config.n_layer)
        for blk in self.blocks:  # residual projections
            for p in (getattr(blk.mixer, "proj", None), getattr(blk.mixer, "out_proj", None),
                      None if blk.mlp is None else blk.mlp.fc2):
                if p is not None:
                    nn.init.normal_(p.weight, mean=0.0, std=scaled)

    def build_mixer(self, letter: str) -> nn.Module:
        """A fresh mixer for a layer of pattern ``letter`` (one of the config's MIXER_LETTERS), as its config says."""
        c = self.config
        if letter not in c.MIXER_LETTERS:
            raise ValueError(f"unknown layer letter {letter!r}: use {', '.join(c.MIXER_LETTERS)}")
        return mixer_spec(letter).make(c.n_embd, heads=c.n_head, causal=True, dropout=c.dropout, bias=c.bias,
                                       rope="1d" if c.position == "rope" else None, **mixer_options(c))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    # -- forward --------------------------------------------------------------------------------------------------

    def _check_tokens(self, idx: Tensor) -> None:
        if not isinstance(idx, Tensor) or idx.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"idx must be an int64 tensor of token ids, got {getattr(idx, 'dtype', type(idx))}")
        if idx.dim() != 2 or idx.shape[1] == 0:
            raise ValueError(f"idx must have shape (batch, tokens) with at least one token, got {tuple(idx.shape)}")
        if not is_compiling() and idx.numel():
            lo, hi = int(idx.min()), int(idx.max())
            if lo < 0 or hi >= self.config.vocab_size:
                raise ValueError(f"token id {hi if hi >= self.config.vocab_size else lo} is outside the vocabulary "
                                 f"of {self.config.vocab_size}")

    def _embed(self, idx: Tensor, positions: Tensor) -> Tensor:
        x = self.wte(idx)
        if self.wpe is not None:
            if not is_compiling() and int(positions.max()) >= self.config.block_size:
                raise ValueError(
                    f"position {int(positions.max())} is beyond this model's context of {self.config.block_size} "
                    f"tokens (learned positions); use a shorter input, or a model with position='rope' or 'none'")
            x = x + self.wpe(positions)
        return self.drop(x)

    def _mixer_positions(self, positions: Tensor) -> Optional[Tensor]:
        return positions if self.config.position == "rope" else None

    def forward(self, idx: Tensor, targets: Optional[Tensor] = None, *, mask: Optional[Tensor] = None,
                cu_seqlens: Optional[Tensor] = None, positions: Optional[Tensor] = None,
                sep_token: Optional[int] = None) -> Tuple[Tensor, Optional[Tensor]]:
        """Logits at every position and, with ``targets``, the mean cross-entropy (targets of -1 are ignored).

        Args:
            idx: (B, T) token ids.
            mask: (B, T) bool, False for padding (left padding for batched prompts).
            cu_seqlens: int32 offsets of packed documents in a (1, T) batch: no document sees another.
            positions: (B, T) or (T,) token positions; by default the index of each token among the real tokens of
                its row (or of its document when packed).
            sep_token: documents end after this token (end-of-text): rows that hold several documents are packed
                with ``cu_seqlens`` so that no document attends into another; other rows run as a plain batch.
        """
        self._check_tokens(idx)
        B, T = idx.shape
        if sep_token is not None:
            if cu_seqlens is not None or mask is not None:
                raise ValueError("sep_token packs documents itself: do not pass mask or cu_seqlens with it")
            return self._forward_documents(idx, targets, sep_token)
        if positions is None:
            if cu_seqlens is not None:
                _, start, _ = segments(cu_seqlens, T)
                positions = torch.arange(T, device=idx.device) - start
            elif mask is not None:
                if parallel.active() is not None:
                    raise ValueError("under context_parallel a padded row's positions depend on the other slices: "
                                     "pass positions with the mask")
                positions = (mask.long().cumsum(1) - 1).clamp_min(0)
            else:
                cp = parallel.active()  # under context parallelism this row is a slice: its global positions
                positions = torch.arange(T, device=idx.device) + (0 if cp is None else cp.start_of(T))
        x = self._embed(idx, positions)
        mpos = self._mixer_positions(positions)
        for blk in self.blocks:
            x = blk(x, causal=True, mask=mask, cu_seqlens=cu_seqlens, positions=mpos)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def _forward_documents(self, idx: Tensor, targets: Optional[Tensor], sep: int) -> Tuple[Tensor, Optional[Tensor]]:
        B, T = idx.shape
        multi = (idx[:, :-1] == sep).any(1)  # a separator as the last token starts nothing inside the window
        if not bool(multi.any()):
            return self.forward(idx, targets)
        rows_p = torch.nonzero(multi).squeeze(1)
        rows_b = torch.nonzero(~multi).squeeze(1)
        cu, pos = documents_cu_seqlens(idx[rows_p], sep)
        lp, _ = self.forward(idx[rows_p].reshape(1, -1), cu_seqlens=cu, positions=pos)
        logits = lp.new_empty(B, T, lp.shape[-1])
        logits[rows_p] = lp.view(len(rows_p), T, -1)
        if rows_b.numel():
            lb, _ = self.forward(idx[rows_b])
            logits[rows_b] = lb
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    # -- decoding -------------------------------------------------------------------------------------------------

    def init_state(self, batch_size: int, device: Optional[torch.device] = None) -> LMState:
        device = self.wte.weight.device if device is None else device
        return LMState([blk.init_state(batch_size, device=device) for blk in self.blocks],
                       torch.zeros(batch_size, dtype=torch.long, device=device))

    def step(self, idx: Tensor, state: LMState, mask: Optional[Tensor] = None) -> Tuple[Tensor, LMState]:
        """Feed a chunk (the whole prompt at once, then one token at a time): (logits (B, T, vocab), state)."""
        self._check_tokens(idx)
        B, T = idx.shape
        if state.batch_size != B:
            raise ValueError(f"state holds batch {state.batch_size} but idx has batch {B}")
        m = torch.ones(B, T, dtype=torch.bool, device=idx.device) if mask is None else mask
        positions = state.pos[:, None] + (m.long().cumsum(1) - 1).clamp_min(0)
        x = self._embed(idx, positions)
        mpos = self._mixer_positions(positions)
        layers = []
        for blk, s in zip(self.blocks, state.layers):
            x, s = blk.step(x, s, causal=True, positions=mpos, mask=mask)
            layers.append(s)
        logits = self.lm_head(self.ln_f(x))
        return logits, LMState(layers, state.pos + m.long().sum(1))

    @torch.no_grad()
    def generate(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: Optional[int] = None,
                 top_p: Optional[float] = None, *, mask: Optional[Tensor] = None, stop_token: Optional[int] = None,
                 seed: Optional[int] = None) -> Tensor:
        """Continue each prompt by ``max_new_tokens`` tokens: (B, T + max_new_tokens).

        The prompt is prefilled in parallel, then every new token costs one step per layer. ``temperature=0`` is
        greedy; ``top_k`` / ``top_p`` truncate the distribution; rows that produce ``stop_token`` are finished and
        padded with it. With ``seed``, row i draws from its own generator seeded ``seed + i``, so a batch of prompts
        (left-padded, ``mask`` False on padding) gives the same tokens as one prompt at a time.
        """
        self._check_tokens(idx)
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be ≥ 0, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must be ≥ 0, got {temperature}")
        if top_p is not None and not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        B, T = idx.shape
        if mask is not None and (mask.shape != idx.shape or mask.dtype != torch.bool):
            raise ValueError(f"mask must be a bool tensor of shape {tuple(idx.shape)}")
        lengths = mask.long().sum(1) if mask is not None else torch.full((B,), T)
        if self.config.position == "learned":
            longest = int(lengths.max())
            if longest > self.config.block_size:
                raise ValueError(f"the prompt has {longest} tokens but this model's context is "
                                 f"{self.config.block_size} tokens (learned positions)")
            if longest + max_new_tokens > self.config.block_size:
                raise ValueError(f"{longest} prompt tokens + {max_new_tokens} new tokens exceed the context of "
                                 f"{self.config.block_size} tokens (learned positions); generate fewer tokens or use "
                                 f"a model with position='rope' or 'none'")
        was_training = self.training
        self.eval()
        gens = None if seed is None else [torch.Generator(device=idx.device).manual_seed(seed + i) for i in range(B)]
        state = self.init_state(B, device=idx.device)
        logits, state = self.step(idx, state, mask=mask)
        last = logits[:, -1]
        out = [idx]
        done = torch.zeros(B, dtype=torch.bool, device=idx.device)
        for t in range(max_new_tokens):
            nxt = _sample(last, temperature, top_k, top_p, gens)
            if stop_token is not None:
                nxt = torch.where(done, torch.full_like(nxt, stop_token), nxt)
                done |= nxt == stop_token
            out.append(nxt[:, None])
            if t + 1 == max_new_tokens or (stop_token is not None and bool(done.all())):
                break
            logits, state = self.step(nxt[:, None], state)
            last = logits[:, -1]
        self.train(was_training)
        res = torch.cat(out, 1)
        if res.shape[1] < T + max_new_tokens:  # every row stopped early
            res = F.pad(res, (0, T + max_new_tokens - res.shape[1]), value=stop_token if stop_token is not None else 0)
        return res


def _sample(logits: Tensor, temperature: float, top_k: Optional[int], top_p: Optional[float],
            gens: Optional[List[torch.Generator]]) -> Tensor:
    """Next token per row from (B, vocab) logits."""
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits / temperature
    if top_k is not None:
        k = min(top_k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None and top_p < 1:
        sp, si = probs.sort(dim=-1, descending=True)
        keep = sp.cumsum(-1) - sp < top_p  # the smallest prefix whose mass reaches top_p (always ≥ 1 token)
        probs = torch.zeros_like(probs).scatter(-1, si, sp * keep)
        probs = probs / probs.sum(-1, keepdim=True)
    if gens is None:
        return torch.multinomial(probs, 1).squeeze(1)
    return torch.stack([torch.multinomial(probs[i], 1, generator=g)[0] for i, g in enumerate(gens)])


def _register() -> None:
    from .registry import register_model

    small = dict(vocab_size=50304, block_size=1024, n_layer=12, n_embd=768, n_head=12, position="learned")
    register_model("gpt2-small", "lm", LMConfig, GPT, "GPT-2 124M (nanoGPT)", mixer="attention", **small)
    # PoM degree 2, expand 2, one gate per head (sel_heads = n_head): a PoM layer then has 2·d·D + D + k·D + d
    # parameters, within 0.5% of attention's 4·d² + 4·d, so GPPoM2 stays within 0.1% of GPT-2's count.
    register_model("gppom2-small", "lm", LMConfig, GPT, "GPPoM2: every attention layer a causal PoM", mixer="pom",
                   degree=2, expand=2, sel_heads=12, **small)
    register_model("gppom2-small-hybrid", "lm", LMConfig, GPT, "GPPoM2 Hyb: pairs of 128-token local attention + PoM",
                   mixer="hybrid", window=128, degree=2, expand=2, sel_heads=12, **small)
    # the value-carrying PoM in every layer: D = dv = 768, a gate scalar and a value head (64 × 64 state) per
    # attention head: +0.13% of GPT-2's count; decoding keeps 12 · 64 · 64 floats per layer
    register_model("gppom2-small-value", "lm", LMConfig, GPT, "GPPoM2 with the value-carrying PoM in every layer",
                   mixer="V", degree=2, expand=1, sel_heads=12, value_heads=12, **small)
    # CPU-scale models that train on 2 cores in minutes: byte-level vocabulary, 4 × 128, rotary positions (so they
    # run at any length: length generalisation and long-context benchmarks), local window = 1/4 of the context
    tiny = dict(vocab_size=257, block_size=256, n_layer=4, n_embd=128, n_head=4, position="rope", window=64,
                degree=2, expand=2, sel_heads=4)
    register_model("tiny-attention", "lm", LMConfig, GPT, "tiny GPT-2 (attention)", mixer="attention", **tiny)
    register_model("tiny-pom", "lm", LMConfig, GPT, "tiny GPPoM2 (all PoM)", mixer="pom", **tiny)
    register_model("tiny-hybrid", "lm", LMConfig, GPT, "tiny GPPoM2 Hyb (PoM + local attention)", mixer="hybrid",
                   **tiny)
    # the paper's form (a gate per channel, its code's gate and mean, GPT-2's learned positions): D = 170 ≈ 4d/3
    # keeps a PoM layer (3·d·D) at attention's 4·d², -0.06% of tiny-attention with learned positions (+4.0%)
    paper = {**tiny, "position": "learned", "sel_heads": 1, "gate": "hardsigmoid", "reduction": "mean",
             "expand": 1.328125}
    for mixer, name in (("pom", "tiny-pom"), ("hybrid", "tiny-hybrid")):
        register_model(f"{name}-paper", "lm", LMConfig, GPT, f"{name} in the paper's form", mixer=mixer, **paper)
    # value-carrying PoM layers: D = d (expand 1), dv = d in 4 heads (a gate scalar per head, like attention's 4
    # heads) — 4 · 32 × 32 state floats per layer — and a key / value shift over the last 4 tokens (a short
    # convolution, chosen on validation: docs/lm.md): the whole model +0.87% of tiny-attention.
    tiny_v = {**tiny, "expand": 1, "value_dim": 128, "value_heads": 4, "token_shift": 4}
    register_model("tiny-vpom", "lm", LMConfig, GPT, "tiny LM, every layer a value-carrying PoM", mixer="V", **tiny_v)
    register_model("tiny-vhybrid", "lm", LMConfig, GPT, "tiny LM, local attention + value-carrying PoM pairs",
                   mixer="LV", **tiny_v)


_register()
