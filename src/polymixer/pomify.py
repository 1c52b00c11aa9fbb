"""pomify: turn a trained attention transformer into a PoM or hybrid one, keeping every weight it can.

    student = pomify(teacher_copy, pattern="LPLP")   # L = causal local attention, P = PoM, A = keep attention

Works on polymixer's own language models (:class:`~polymixer.models.lm.GPT`, the pattern is written into its
config) and on transformers' GPT-2 and Llama-family models (rotary positions, grouped-query attention, RMSNorm:
Llama, Mistral, Qwen2 …), whose attention modules are replaced by a :class:`ConvertedMixer` that keeps transformers'
calling convention and cache. Everything but the replaced attention modules is kept as is.

Initialisation of a new PoM from the attention it replaces: attention with uniform weights is the mean of the
values, ``W_o · mean_j(W_v x_j)``. PoM reproduces exactly that at the start — in the linear range of its activation,
with ``D ≥ 2·d_v``: ``W_h = [W_v; −W_v]``, ``W_o' = [W_o, −W_o]`` (the pair recovers ``v`` through the leaky
activation: ``act(v) − act(−v) = 1.01·v``), degree-1 coefficients set so the open gate (bias 2.4, weights 0: 0.9
everywhere, still trainable) and the activation's slope give a gain of 1, higher degrees 0, and the value bias folded
into the output bias. Rotary PoM layers (polymixer models with ``position="rope"``) start from the same weights and
rotate the features by relative position. Local attention (L) reuses the layer's own query / key / value / output
projections (grouped key-value heads repeated), so it is exact for every query within its window. Distillation
(``polymixer distill lm``) then fits the new mixers to the teacher's layers and fine-tunes the whole model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from .layers.attention import Attention
from .blocks import layer_pattern, mixer_spec
from .layers.pom import PoM
from .ops.common import ACTIVATIONS, GATES, resolve

__all__ = ["pomify", "ConvertedMixer", "init_pom_from_attention", "replaced_layers", "load_pomified"]

GATE_LOGIT = 2.4  # hardsigmoid(2.4) = 0.9: the gate starts open with a gradient


@torch.no_grad()
def init_pom_from_attention(pom: PoM, w_v: Tensor, b_v: Optional[Tensor], w_o: Tensor, b_o: Optional[Tensor]) -> None:
    """Initialise ``pom`` to reproduce uniform attention ``W_o·mean(W_v x + b_v) + b_o`` (see the module doc).

    w_v: (Dv, d) value projection (grouped heads already repeated); b_v: (Dv,) or None; w_o: (d, Dv); b_o: (d,) or
    None. Feature pairs beyond ``min(Dv, D/2)`` keep their random init with zero output weights.
    """
    D, d = pom.poly_dim, pom.dim
    Dv = w_v.shape[0]
    if w_v.shape != (Dv, d) or w_o.shape != (d, Dv):
        raise ValueError(f"value / output projections of shapes {tuple(w_v.shape)} / {tuple(w_o.shape)} do not "
                         f"match a PoM of width {d}")
    n = min(Dv, D // 2)
    act = resolve(ACTIVATIONS, pom.activation, "activation")[0]
    gate = resolve(GATES, pom.gate, "gate")[0]
    one = torch.ones((), dtype=torch.float64)
    slope = float(act(one) - act(-one))  # act(x) − act(−x) = slope·x in the activation's linear range
    s = float(gate(torch.tensor(GATE_LOGIT, dtype=torch.float64)))
    if slope == 0 or s == 0:
        raise ValueError(f"cannot initialise from attention with activation {pom.activation!r} / gate {pom.gate!r}")
    w = pom.in_proj.weight
    dt = w.dtype
    w[:n] = w_v[:n].to(dt)
    w[n:2 * n] = -w_v[:n].to(dt)
    if 2 * n < D:
        nn.init.normal_(w[2 * n:D], std=0.02)
    w[D:] = 0
    pom.gate_bias.fill_(GATE_LOGIT)
    pom.coeff[:2 * n] = 0
    pom.coeff[:2 * n, 0] = 1.0 / (slope * s)
    pom.out_proj.weight.zero_()
    pom.out_proj.weight[:, :n] = w_o[:, :n].to(dt)
    pom.out_proj.weight[:, n:2 * n] = -w_o[:, :n].to(dt)
    if pom.out_proj.bias is not None:
        bias = torch.zeros(d, dtype=dt) if b_o is None else b_o.to(dt).clone()
        if b_v is not None:
            bias += w_o.to(dt) @ b_v.to(dt)
        pom.out_proj.bias.copy_(bias)


# ----------------------------------------------------------------------------------------------------------------
# Attention projections of the supported model kinds, as (w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o) with grouped
# key-value heads repeated to the query heads
# ----------------------------------------------------------------------------------------------------------------


def _from_polymixer(attn: Attention) -> Tuple[Optional[Tensor], ...]:
    (wq, wk, wv), b = attn.qkv.weight.chunk(3), attn.qkv.bias
    bq, bk, bv = (None,) * 3 if b is None else b.chunk(3)
    return (wq, bq, wk, bk, wv, bv, attn.proj.weight, attn.proj.bias)


def _from_gpt2(attn: nn.Module) -> Tuple[Optional[Tensor], ...]:
    w = attn.c_attn.weight.t()  # Conv1D stores (in, out)
    b = attn.c_attn.bias
    d = attn.embed_dim
    return (w[:d], b[:d], w[d:2 * d], b[d:2 * d], w[2 * d:], b[2 * d:], attn.c_proj.weight.t(), attn.c_proj.bias)


def _repeat_kv(t: Optional[Tensor], groups: int, head_dim: int) -> Optional[Tensor]:
    if t is None or groups == 1:
        return t
    return t.view(-1, head_dim, *t.shape[1:]).repeat_interleave(groups, 0).reshape(-1, *t.shape[1:])


def _from_llama(attn: nn.Module) -> Tuple[Optional[Tensor], ...]:
    hd = attn.head_dim
    g = attn.num_key_value_groups
    return (attn.q_proj.weight, attn.q_proj.bias,
            _repeat_kv(attn.k_proj.weight, g, hd), _repeat_kv(attn.k_proj.bias, g, hd),
            _repeat_kv(attn.v_proj.weight, g, hd), _repeat_kv(attn.v_proj.bias, g, hd),
            attn.o_proj.weight, attn.o_proj.bias)


@torch.no_grad()
def _local_from(proj: Tuple[Optional[Tensor], ...], dim: int, heads: int, window: int, rope: Optional[str],
                rope_base: float, dropout: float) -> Attention:
    wq, bq, wk, bk, wv, bv, wo, bo = proj
    if wq.shape[0] != dim:
        raise ValueError(f"local attention needs heads·head_dim = hidden size; this layer has {wq.shape[0]} vs {dim}")
    qkv_bias = bq is not None
    att = mixer_spec("L").make(dim, heads=heads, causal=True, window=window, bias=bo is not None, qkv_bias=qkv_bias,
                               rope=rope, rope_base=rope_base, dropout=dropout).to(device=wq.device, dtype=wq.dtype)
    att.qkv.weight.copy_(torch.cat([wq, wk, wv]))
    if qkv_bias:
        zero = torch.zeros_like(bq)
        att.qkv.bias.copy_(torch.cat([bq, zero if bk is None else bk, zero if bv is None else bv]))
    att.proj.weight.copy_(wo)
    if bo is not None:
        att.proj.bias.copy_(bo)
    return att


# ----------------------------------------------------------------------------------------------------------------
# transformers models: the replacement module and the padding of the current call
# ----------------------------------------------------------------------------------------------------------------


class _CallContext:
    """The 2-D attention mask of the base model's current forward call, shared by its converted layers (the
    layers themselves only get transformers' 4-D mask, or none)."""

    def __init__(self) -> None:
        self.mask: Optional[Tensor] = None

    def pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        m = kwargs.get("attention_mask")
        self.mask = m if isinstance(m, Tensor) and m.dim() == 2 else None

    def post_hook(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        self.mask = None


class ConvertedMixer(nn.Module):
    """A polymixer mixer (PoM or causal local attention) in place of a transformers attention module.

    Same call as the module it replaces (hidden states in, ``(output, None)`` out); with a transformers cache it
    keeps its streaming state in that cache as a :class:`~polymixer.hf.MixerCacheLayer` (so beam search reorders
    it like every other layer); padding comes from the model call's 2-D attention mask.
    """

    def __init__(self, mixer: nn.Module, layer_idx: int, context: _CallContext, rotary: bool) -> None:
        super().__init__()
        self.mixer = mixer
        self.layer_idx = layer_idx
        self.rotary = rotary
        self._context = context  # plain attribute: not a submodule, not in the state dict

    def extra_repr(self) -> str:
        return f"layer_idx={self.layer_idx}"

    def forward(self, hidden_states: Tensor, *args: Any, past_key_values: Any = None, cache: Any = None,
                position_ids: Optional[Tensor] = None, **kwargs: Any) -> Tuple[Tensor, None]:
        # transformers ≥ 5.24 hands the layer its cache as ``cache`` (earlier: ``past_key_values``)
        past_key_values = cache if cache is not None else past_key_values
        B, T, _ = hidden_states.shape
        mask = self._context.mask
        if mask is not None:
            if mask.shape[0] != B or mask.shape[1] < T:
                raise ValueError(f"attention_mask of shape {tuple(mask.shape)} does not cover {B} × {T} tokens")
            mask = mask[:, -T:].bool()
            mask = None if bool(mask.all()) else mask
        positions = None
        if self.rotary:
            if position_ids is None:
                raise ValueError("a rotary local-attention layer needs position_ids")
            positions = position_ids.expand(B, T) if position_ids.shape[0] == 1 else position_ids
        if past_key_values is None:
            return self.mixer(hidden_states, causal=True, mask=mask, positions=positions), None
        from .hf import MixerCacheLayer

        layers = past_key_values.layers
        while len(layers) <= self.layer_idx:
            layers.append(MixerCacheLayer())
        slot = layers[self.layer_idx]
        if not isinstance(slot, MixerCacheLayer):
            if slot.get_seq_length() != 0:
                raise ValueError(f"layer {self.layer_idx} of the cache already holds keys / values")
            slot = layers[self.layer_idx] = MixerCacheLayer()
        if slot.state is None:
            slot.state = self.mixer.init_state(B, device=hidden_states.device, dtype=hidden_states.dtype)
        y, state = self.mixer.step(hidden_states, slot.state, causal=True, positions=positions, mask=mask)
        slot.set(state, T)
        return y, None


def _hf_kind(model: nn.Module) -> Tuple[str, nn.Module, List[nn.Module], str]:
    """(kind, base model, decoder layers, attention attribute) of a transformers causal LM."""
    cfg = getattr(model, "config", None)
    mt = getattr(cfg, "model_type", None)
    base = getattr(model, getattr(model, "base_model_prefix", ""), model)
    if mt == "gpt2":
        return "gpt2", base, list(base.h), "attn"
    layers = getattr(base, "layers", None)
    def llama_attention(m: Any) -> bool:
        return isinstance(m, ConvertedMixer) or all(hasattr(m, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))

    if layers is not None and len(layers) and all(llama_attention(getattr(la, "self_attn", None)) for la in layers):
        return "llama", base, list(layers), "self_attn"
    raise TypeError(f"pomify supports polymixer's GPT, transformers' GPT-2 and Llama-family models; got "
                    f"{type(model).__name__} (model_type {mt!r})")


def _pattern(pattern: str, n_layers: int) -> str:
    """Attention layers become PoM or local attention (from attention's weights) or stay: P, A and L only."""
    return layer_pattern(pattern, n_layers, hybrid="LP", allowed="PAL")


# ----------------------------------------------------------------------------------------------------------------
# pomify
# ----------------------------------------------------------------------------------------------------------------


def pomify(model: nn.Module, pattern: str = "hybrid", *, window: Optional[int] = None, degree: Optional[int] = None,
           expand: Optional[float] = None, sel_heads: Optional[int] = None, init: bool = True) -> nn.Module:
    """Replace the self-attention of the layers that ``pattern`` marks P (PoM) or L (causal local attention).

    Args:
        model: polymixer's :class:`~polymixer.models.lm.GPT`, or a transformers GPT-2 / Llama-family causal LM.
            Converted in place and returned.
        pattern: one letter per layer over P / L / A (A = keep the attention), tiled to the depth; "pom" = all P,
            "hybrid" = "LP" tiled (local attention first in each pair).
        window: local-attention window (default: the polymixer model's own, else 128).
        degree, expand, sel_heads: the new PoM layers' (defaults: the polymixer model's own; else 2, 2 and one gate
            per attention head).
        init: initialise the new mixers from the attention they replace (see the module doc); False leaves them
            as built (random), e.g. before loading converted weights.
    """
    from .models.lm import GPT

    if isinstance(model, GPT):
        return _pomify_polymixer(model, pattern, window, degree, expand, sel_heads, init)
    return _pomify_hf(model, pattern, window, degree, expand, sel_heads, init)


def _pomify_polymixer(model: nn.Module, pattern: str, window: Optional[int], degree: Optional[int],
                      expand: Optional[float], sel_heads: Optional[int], init: bool) -> nn.Module:
    c = model.config
    new = _pattern(pattern, c.n_layer)
    old = model.pattern
    changes = dict(window=window, degree=degree, expand=expand, sel_heads=sel_heads)
    changes = {k: v for k, v in changes.items() if v is not None and v != getattr(c, k)}
    if "P" in old and {"degree", "expand", "sel_heads"} & set(changes):
        raise ValueError(f"the model already has PoM layers: new ones must share its degree / expand / sel_heads "
                         f"({c.degree} / {c.expand} / {c.sel_heads}), got {changes}")
    if "L" in old and "window" in changes and any(a == "L" and b == "L" for a, b in zip(old, new)):
        raise ValueError(f"the model already has local attention with window {c.window}; got window={window}")
    for i, (a, b) in enumerate(zip(old, new)):
        if a == "P" and b != "P" or a == "L" and b == "A":
            raise ValueError(f"layer {i} is {a} and cannot become {b}: pomify only replaces attention")
    for k, v in changes.items():
        setattr(c, k, v)
    c.mixer = new
    c.__post_init__()
    model.pattern = new
    for blk, a, b in zip(model.blocks, old, new):
        if a == b:
            continue
        mixer = model.build_mixer(b).to(device=blk.mixer.qkv.weight.device, dtype=blk.mixer.qkv.weight.dtype)
        if init and b == "P":
            init_pom_from_attention(mixer, *_from_polymixer(blk.mixer)[4:])
        elif init:
            mixer.load_state_dict(blk.mixer.state_dict())
        blk.mixer = mixer
    return model


def _pomify_hf(model: nn.Module, pattern: str, window: Optional[int], degree: Optional[int],
               expand: Optional[float], sel_heads: Optional[int], init: bool) -> nn.Module:
    kind, base, layers, attr = _hf_kind(model)
    cfg = model.config
    heads = cfg.num_attention_heads
    dim = cfg.hidden_size
    new = _pattern(pattern, len(layers))
    spec = dict(pattern=new, window=window or 128, degree=degree or 2, expand=expand or 2.0,
                sel_heads=sel_heads or heads)
    previous = getattr(cfg, "polymixer_pomify", None)
    if previous is not None:
        raise ValueError(f"this model was already converted (pattern {previous['pattern']!r})")
    rope_base = 10000.0
    if kind == "llama":
        rp = getattr(cfg, "rope_parameters", None) or {}
        if "L" in new and rp.get("rope_type", "default") != "default":
            raise ValueError(f"local attention supports default rotary positions; this model uses "
                             f"{rp.get('rope_type')!r} scaling")
        rope_base = float(rp.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
    elif "L" in new and (not cfg.scale_attn_weights or cfg.scale_attn_by_inverse_layer_idx
                         or cfg.reorder_and_upcast_attn):
        raise ValueError("local attention needs GPT-2's standard 1/√head_dim attention scaling")
    bias = kind == "gpt2" or bool(getattr(cfg, "attention_bias", False))
    context = _CallContext()
    for i, (layer, letter) in enumerate(zip(layers, new)):
        if letter == "A":
            continue
        attn = getattr(layer, attr)
        w = next(attn.parameters())
        proj = _from_gpt2(attn) if kind == "gpt2" else _from_llama(attn)
        if letter == "P":
            mixer = mixer_spec("P").make(dim, degree=spec["degree"], expand=spec["expand"],
                                         sel_heads=spec["sel_heads"], bias=bias).to(device=w.device, dtype=w.dtype)
            if init:
                init_pom_from_attention(mixer, *proj[4:])
        else:
            dropout = getattr(cfg, "attn_pdrop", getattr(cfg, "attention_dropout", 0.0))
            mixer = _local_from(proj, dim, heads, spec["window"], "1d" if kind == "llama" else None, rope_base,
                                float(dropout))
        setattr(layer, attr, ConvertedMixer(mixer, i, context, rotary=letter == "L" and kind == "llama"))
    base.register_forward_pre_hook(context.pre_hook, with_kwargs=True)
    base.register_forward_hook(context.post_hook, with_kwargs=True)
    cfg.polymixer_pomify = spec
    return model


def replaced_layers(student: nn.Module, teacher: nn.Module) -> Dict[int, Tuple[nn.Module, nn.Module]]:
    """Layer index → (the student's new mixer, the teacher's attention it replaced), for distillation."""
    from .models.lm import GPT

    if isinstance(student, GPT):
        if not isinstance(teacher, GPT) or len(teacher.blocks) != len(student.blocks):
            raise TypeError("a polymixer student needs its polymixer teacher (the same depth)")
        return {i: (s.mixer, t.mixer) for i, (s, t, a, b) in
                enumerate(zip(student.blocks, teacher.blocks, teacher.pattern, student.pattern)) if a != b}
    _, _, layers, attr = _hf_kind(student)
    _, _, tlayers, tattr = _hf_kind(teacher)
    if len(layers) != len(tlayers):
        raise ValueError(f"the student has {len(layers)} layers, the teacher {len(tlayers)}")
    return {i: (getattr(layer, attr), getattr(t, tattr)) for i, (layer, t) in enumerate(zip(layers, tlayers))
            if isinstance(getattr(layer, attr), ConvertedMixer) and not isinstance(getattr(t, tattr), ConvertedMixer)}


def load_pomified(path: Union[str, Path], **kwargs: Any) -> nn.Module:
    """Load a converted transformers model written by ``save_pretrained``: the base architecture from its config,
    converted again with the recorded pattern (no init), then every saved tensor."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    cfg = AutoConfig.from_pretrained(path)
    spec = getattr(cfg, "polymixer_pomify", None)
    if spec is None:
        raise ValueError(f"{path} is not a pomified model (its config has no polymixer_pomify entry)")
    del cfg.polymixer_pomify
    model = AutoModelForCausalLM.from_config(cfg, **kwargs)
    pomify(model, init=False, **spec)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {path}")
    state: Dict[str, Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or {})
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise ValueError(f"{path}: weights do not match the converted model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    model.tie_weights()
    return model.eval()
