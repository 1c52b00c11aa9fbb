"""Hugging Face transformers integration: polymixer language models as first-class transformers models.

* :class:`PolymixerConfig` / :class:`PolymixerForCausalLM` — registered with ``AutoConfig`` /
  ``AutoModelForCausalLM`` as soon as both polymixer and transformers are imported (in either order), so a folder
  written by ``save_pretrained`` loads with ``AutoModelForCausalLM.from_pretrained(dir)`` — no remote code. The
  model *is* polymixer's :class:`~polymixer.models.lm.GPT` (held as ``.model``): the same modules, the same tensors.
* :class:`MixerCacheLayer` / :class:`PolymixerCache` — a transformers ``Cache`` whose layers hold polymixer's
  streaming states (PoM's O(D) running sums, local attention's ring buffer, global attention's KV cache), reordered
  for beam search. ``generate()`` (greedy, sampling, top-k / top-p, beams, left-padded batches) and
  ``pipeline("text-generation")`` work through it; decoding a PoM layer costs the same at every context length.
* :func:`hf_tokenizer` — polymixer's byte-level tokenizer (or GPT-2's BPE) as a transformers tokenizer.
* :func:`export_hf` / :func:`import_hf` — a polymixer checkpoint to a transformers folder (safetensors, config,
  tokenizer) and back (``polymixer export hf`` / ``polymixer import hf``).

Needs the optional extra: ``pip install "polymixer[hf]"`` (transformers ≥ 5).
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, List, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor

try:
    from huggingface_hub.dataclasses import strict
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PreTrainedConfig, PreTrainedModel
    from transformers.cache_utils import Cache, CacheLayerMixin
    from transformers.modeling_outputs import CausalLMOutputWithPast
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("polymixer.hf needs transformers ≥ 5: pip install 'polymixer[hf]'") from e

from .tokenizer import EOT_TEXT, GPT2BPE, ByteTokenizer, Tokenizer, bytes_to_unicode, load_tokenizer
from .models.lm import GPT, LMConfig, LMState

__all__ = ["PolymixerConfig", "PolymixerForCausalLM", "MixerCacheLayer", "PolymixerCache", "hf_tokenizer",
           "export_hf", "import_hf", "register", "CACHE_FIELD", "output_cache"]

# transformers 5.24 renamed a model's decoding state from ``past_key_values`` to ``cache`` (inputs and outputs; the old
# name is deprecated): the model takes either, and writes the field its transformers declares
CACHE_FIELD = "cache" if "cache" in {f.name for f in fields(CausalLMOutputWithPast)} else "past_key_values"


def output_cache(output: Any) -> Optional[Cache]:
    """The decoding state a forward returned, under either name (``cache`` from transformers 5.24 on)."""
    return getattr(output, CACHE_FIELD)


# ----------------------------------------------------------------------------------------------------------------
# Config and model
# ----------------------------------------------------------------------------------------------------------------


@strict(accept_kwargs=True)
class PolymixerConfig(PreTrainedConfig):
    """:class:`~polymixer.models.lm.LMConfig` as a transformers config (the same fields, plus token ids)."""

    model_type = "polymixer"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]
    attribute_map = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
                     "max_position_embeddings": "block_size"}

    vocab_size: int = 257
    block_size: int = 256
    n_layer: int = 4
    n_embd: int = 128
    n_head: int = 4
    mixer: str = "pom"
    window: int = 128
    degree: int = 2
    expand: float | int = 2
    sel_heads: int = 1
    gate: str = "hardsigmoid"
    reduction: str = "mean"
    value_dim: int | None = None
    value_heads: int = 1
    token_shift: int = 2
    pom_shift: int = 0
    attention_shift: int = 0
    position: str = "rope"
    dropout: float | int = 0.0
    bias: bool = True
    rope_base: float | int = 10000.0
    tokenizer: str = "bytes"  # what polymixer trained it with: "bytes" or "gpt2" (BPE)
    use_cache: bool = True
    bos_token_id: int | None = 256
    eos_token_id: int | list[int] | None = 256
    pad_token_id: int | None = 256
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs: Any) -> None:
        for old, new in LMConfig.RENAMED.items():  # folders written with a field's earlier name
            if old in kwargs:
                setattr(self, new, kwargs.pop(old))
        super().__post_init__(**kwargs)
        self.lm_config()  # validates every field with polymixer's own checks

    def lm_config(self) -> LMConfig:
        """The polymixer config this transformers config stands for."""
        return LMConfig(**{f.name: getattr(self, f.name) for f in fields(LMConfig)})

    @classmethod
    def from_lm_config(cls, cfg: LMConfig, tokenizer: Optional[Tokenizer] = None) -> "PolymixerConfig":
        tok = tokenizer or ByteTokenizer()
        eot = tok.eot_id
        return cls(**asdict(cfg), tokenizer="gpt2" if isinstance(tok, GPT2BPE) else "bytes", bos_token_id=eot,
                   eos_token_id=eot, pad_token_id=eot)


class PolymixerPreTrainedModel(PreTrainedModel):
    config_class = PolymixerConfig
    base_model_prefix = "model"
    _no_split_modules = ["PolyMorpher"]
    supports_gradient_checkpointing = False

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Nothing to do: :class:`GPT` initialises itself (GPT-2's scheme, residual projections scaled); loading
        replaces every tensor."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model makes its own PolymixerCache on the first forward


class PolymixerForCausalLM(PolymixerPreTrainedModel, GenerationMixin):
    """A polymixer language model (any layer pattern over P / A / L) behind transformers' causal-LM interface.

    ``self.model`` is polymixer's :class:`GPT`: the state dict is GPT's under the prefix ``model.``.
    """

    _tied_weights_keys = {"model.lm_head.weight": "model.wte.weight"}

    def __init__(self, config: PolymixerConfig) -> None:
        super().__init__(config)
        self.model = GPT(config.lm_config())
        self.post_init()

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.model.wte

    def set_input_embeddings(self, value: torch.nn.Embedding) -> None:
        self.model.wte = value

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.model.lm_head

    def set_output_embeddings(self, value: torch.nn.Linear) -> None:
        self.model.lm_head = value

    def forward(
        self,
        input_ids: Optional[Tensor] = None,
        attention_mask: Optional[Tensor] = None,
        past_key_values: Optional[Cache] = None,
        cache: Optional[Cache] = None,
        labels: Optional[Tensor] = None,
        use_cache: Optional[bool] = None,
        inputs_embeds: Optional[Tensor] = None,
        output_hidden_states: Optional[bool] = None,
        output_attentions: Optional[bool] = None,
        return_dict: Optional[bool] = None,
        logits_to_keep: Union[int, Tensor] = 0,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """Logits of every position (``labels`` → the shifted cross-entropy, -100 ignored).

        With a cache (``use_cache``, the default outside training) the chunk is streamed through the per-layer
        states: the prompt is prefilled in parallel, then each call costs one step per layer. ``attention_mask``
        (B, past + T) marks real tokens (0 = left padding), as ``generate`` passes it.
        """
        if cache is not None and past_key_values is not None:
            raise ValueError("give the decoding state as cache or as past_key_values (its name before transformers "
                             "5.24), not both")
        past_key_values = cache if cache is not None else past_key_values
        if inputs_embeds is not None:
            raise ValueError("PolymixerForCausalLM takes input_ids, not inputs_embeds")
        if input_ids is None:
            raise ValueError("input_ids is required")
        if output_hidden_states or output_attentions:
            raise ValueError("PolymixerForCausalLM does not return hidden states or attention weights")
        unused = sorted(k for k, v in kwargs.items() if v is not None and k not in ("position_ids", "cache_position"))
        if unused:
            raise TypeError(f"PolymixerForCausalLM.forward got unexpected arguments {unused}")
        B, T = input_ids.shape
        mask = None
        if attention_mask is not None:
            if attention_mask.dim() != 2 or attention_mask.shape[0] != B or attention_mask.shape[1] < T:
                raise ValueError(f"attention_mask must be (batch, past + tokens) = ({B}, ≥ {T}), got "
                                 f"{tuple(attention_mask.shape)}")
            chunk = attention_mask[:, -T:].bool()
            mask = None if bool(chunk.all()) else chunk
        use_cache = (self.config.use_cache and not self.training) if use_cache is None else use_cache
        if use_cache or past_key_values is not None:
            state_cache = self._cache_for(past_key_values, B, input_ids.device)
            logits, state = self.model.step(input_ids, LMState(state_cache.states(), state_cache.pos), mask=mask)
            state_cache.store(state, T)
        else:
            state_cache = None
            logits, _ = self.model(input_ids, mask=mask)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                   ignore_index=-100)
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            logits = logits[:, -logits_to_keep:]
        elif isinstance(logits_to_keep, Tensor):
            logits = logits[:, logits_to_keep]
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: state_cache})

    def _cache_for(self, past: Optional[Cache], batch: int, device: torch.device) -> "PolymixerCache":
        if isinstance(past, PolymixerCache):
            if past.pos.shape[0] != batch:
                raise ValueError(f"the cache holds batch {past.pos.shape[0]} but input_ids has batch {batch}")
            return past
        if past is None or (isinstance(past, Cache) and past.get_seq_length() == 0):
            return PolymixerCache(self.model, batch, device)
        raise TypeError(f"PolymixerForCausalLM decodes with a PolymixerCache (it keeps PoM's running sums), got a "
                        f"filled {type(past).__name__}")


# ----------------------------------------------------------------------------------------------------------------
# Cache: polymixer's streaming states inside transformers' Cache
# ----------------------------------------------------------------------------------------------------------------


class MixerCacheLayer(CacheLayerMixin):
    """One layer's polymixer streaming state (a ``PoMState`` or an ``AttentionState``) as a transformers cache layer.

    ``seen`` counts every token fed (padding included), which is what transformers' masks expect of a layer.
    A PoM state cannot forget a token, so the layer cannot be cropped (no assisted decoding).
    """

    is_compileable = False
    is_sliding = False

    def __init__(self, state: Any = None) -> None:
        super().__init__()
        self.state = state
        self.seen = 0
        self.is_initialized = state is not None

    def __repr__(self) -> str:
        return f"MixerCacheLayer({type(self.state).__name__}, seen={self.seen})"

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        return None

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple:
        raise TypeError("this layer holds a polymixer mixer state, not keys / values")

    def set(self, state: Any, tokens: int) -> None:
        self.state, self.seen, self.is_initialized = state, self.seen + tokens, True

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple:
        return self.seen + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.state, self.seen, self.is_initialized = None, 0, False

    def reorder_cache(self, beam_idx: Tensor) -> None:
        self.batch_select_indices(beam_idx)

    def batch_select_indices(self, indices: Tensor) -> None:
        if self.state is not None:
            self.state = self.state[indices]  # (moved to the state's device by its indexing)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.state is not None:
            n = self.state.batch_size
            self.batch_select_indices(torch.arange(n).repeat_interleave(repeats))

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("a PoM state is a running sum: it cannot be cropped (no assisted decoding)")

    @property
    def memory_bytes(self) -> int:
        """Bytes the state holds (constant for PoM, the window for local attention, growing for attention)."""
        return 0 if self.state is None else self.state.memory_bytes


class PolymixerCache(Cache):
    """The decoding state of a whole :class:`PolymixerForCausalLM`: one :class:`MixerCacheLayer` per block and each
    row's count of real tokens (its next position)."""

    def __init__(self, model: GPT, batch_size: int, device: Optional[torch.device] = None) -> None:
        state = model.init_state(batch_size, device=device)
        super().__init__(layers=[MixerCacheLayer(s) for s in state.layers])
        self.pos = state.pos

    def states(self) -> List[Any]:
        return [layer.state for layer in self.layers]

    def store(self, state: LMState, tokens: int) -> None:
        for layer, s in zip(self.layers, state.layers):
            layer.set(s, tokens)
        self.pos = state.pos

    def reorder_cache(self, beam_idx: Tensor) -> None:
        self.batch_select_indices(beam_idx)

    def batch_select_indices(self, indices: Tensor) -> None:
        for layer in self.layers:
            layer.batch_select_indices(indices)
        self.pos = self.pos[indices.to(self.pos.device)]

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.batch_select_indices(torch.arange(self.pos.shape[0]).repeat_interleave(repeats))

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("a PoM state is a running sum: it cannot be cropped (no assisted decoding)")

    @property
    def memory_bytes(self) -> int:
        return sum(layer.memory_bytes for layer in self.layers) + self.pos.numel() * self.pos.element_size()


# ----------------------------------------------------------------------------------------------------------------
# Tokenizers
# ----------------------------------------------------------------------------------------------------------------


def hf_tokenizer(tok: Union[Tokenizer, str, None] = None) -> Any:
    """polymixer's tokenizer as a transformers fast tokenizer with the same ids (end-of-text is bos, eos and pad).

    The byte-level tokenizer becomes a byte-level BPE with no merges (token b = byte b, 256 = end-of-text); GPT-2's
    BPE keeps its vocabulary, merges and pre-tokenisation.
    """
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if tok is None or isinstance(tok, str):
        tok = load_tokenizer(tok)
    b2u = bytes_to_unicode()
    if isinstance(tok, ByteTokenizer):
        raw = RawTokenizer(models.BPE(vocab={b2u[b]: b for b in range(256)}, merges=[]))
        raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    elif isinstance(tok, GPT2BPE):
        merges = sorted(tok.ranks, key=tok.ranks.get)
        vocab = {k: v for k, v in tok.encoder.items() if k != EOT_TEXT}
        raw = RawTokenizer(models.BPE(vocab=vocab, merges=merges))
        raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        raise TypeError(f"cannot convert a {type(tok).__name__} tokenizer (bytes or GPT-2 BPE only)")
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens([EOT_TEXT])
    if raw.token_to_id(EOT_TEXT) != tok.eot_id:
        raise ValueError(f"end-of-text got id {raw.token_to_id(EOT_TEXT)}, expected {tok.eot_id}")
    return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token=EOT_TEXT, eos_token=EOT_TEXT, pad_token=EOT_TEXT,
                                   padding_side="left", clean_up_tokenization_spaces=False)


# ----------------------------------------------------------------------------------------------------------------
# Export / import
# ----------------------------------------------------------------------------------------------------------------


def to_hf(model: GPT, tokenizer: Union[Tokenizer, str, None] = None) -> PolymixerForCausalLM:
    """Wrap a polymixer :class:`GPT`'s weights in a :class:`PolymixerForCausalLM` (copied, same values)."""
    tok = load_tokenizer(tokenizer) if tokenizer is None or isinstance(tokenizer, str) else tokenizer
    hf = PolymixerForCausalLM(PolymixerConfig.from_lm_config(model.config, tok))
    hf.model.load_state_dict(model.state_dict())
    return hf.to(next(model.parameters()).device).train(model.training)


def export_hf(ckpt: Union[str, Path], out: Union[str, Path], ema: Optional[bool] = None) -> Path:
    """Write a polymixer language-model checkpoint as a transformers folder: model.safetensors, config.json,
    generation_config.json and the tokenizer files. ``ema``: None = the EMA weights when the run kept them."""
    from .checkpoint import load_model, read_config

    cfg = read_config(ckpt)
    if cfg.get("family") != "lm":
        raise ValueError(f"{ckpt} holds a {cfg.get('family')!r} model; only language models export to transformers")
    tok = load_tokenizer(cfg.get("data", {}).get("tokenizer", "bytes"))
    hf = to_hf(load_model(ckpt, ema=ema, family="lm"), tok)
    out = Path(out)
    hf.save_pretrained(out)
    hf_tokenizer(tok).save_pretrained(out)
    (out / "polymixer.json").write_text(json.dumps({"exported_from": str(ckpt), "preset": cfg.get("preset"),
                                                    "step": cfg.get("step")}, indent=2))
    return out


def import_hf(src: Union[str, Path], run: Union[str, Path]) -> Path:
    """Turn a transformers folder of a :class:`PolymixerForCausalLM` into a polymixer run (a checkpoint that
    ``generate``, ``eval lm``, ``train lm --init-from`` and ``distill lm`` take). A GPT-2 BPE tokenizer is written
    into the run as encoder.json / vocab.bpe."""
    from .checkpoint import save_checkpoint

    src = Path(src)
    hf = AutoModelForCausalLM.from_pretrained(src)
    if not isinstance(hf, PolymixerForCausalLM):
        raise ValueError(f"{src} holds a {type(hf).__name__}, not a polymixer language model; convert it with "
                         f"polymixer.pomify and distill it instead")
    tokenizer = "bytes"
    if hf.config.tokenizer == "gpt2":
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(src)
        raw = json.loads(tok.backend_tokenizer.to_str())["model"]
        tdir = Path(run) / "tokenizer"
        tdir.mkdir(parents=True, exist_ok=True)
        (tdir / "encoder.json").write_text(json.dumps({**raw["vocab"], EOT_TEXT: tok.eos_token_id}))
        merges = [" ".join(m) if isinstance(m, list) else m for m in raw["merges"]]
        (tdir / "vocab.bpe").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
        tokenizer = str(tdir.resolve())
    meta = {"family": "lm", "preset": None, "model": asdict(hf.config.lm_config()),
            "data": {"paths": None, "tokenizer": tokenizer}, "imported_from": str(src)}
    return save_checkpoint(run, 0, hf.model, meta)


# ----------------------------------------------------------------------------------------------------------------
# Registration
# ----------------------------------------------------------------------------------------------------------------


def register() -> None:
    """Make ``AutoConfig`` / ``AutoModelForCausalLM`` know polymixer (idempotent)."""
    AutoConfig.register("polymixer", PolymixerConfig, exist_ok=True)
    AutoModelForCausalLM.register(PolymixerConfig, PolymixerForCausalLM, exist_ok=True)


register()
