"""pomify (attention → PoM / local attention) on polymixer's GPT and on transformers' GPT-2 and Llama, and the
distillation stages. The transformers cases are skipped without the [hf] extra."""

from __future__ import annotations

import copy
from dataclasses import asdict

import pytest
import torch

from polymixer import PoM
from polymixer.models import build_from_config, create_model
from polymixer.pomify import init_pom_from_attention, pomify, replaced_layers

TOY = dict(n_layer=4, n_embd=32, n_head=2, block_size=64, window=8, sel_heads=2)


def _unchanged(teacher: torch.nn.Module, student: torch.nn.Module, replaced_prefixes) -> None:
    s = student.state_dict()
    for k, v in teacher.state_dict().items():
        if not any(k.startswith(p) for p in replaced_prefixes):
            assert torch.equal(v, s[k]), k


# ----------------------------------------------------------------------------------------------------------------
# polymixer's own models
# ----------------------------------------------------------------------------------------------------------------


def test_pom_init_reproduces_uniform_attention_exactly():
    teacher = create_model("tiny-attention", **{**TOY, "position": "learned"}).eval()
    student = pomify(copy.deepcopy(teacher), "PA")
    att, pom = teacher.blocks[0].mixer, student.blocks[0].mixer
    h = torch.randn(2, 24, 32) * 0.3
    q, k, v, _ = att._project(h, None)
    mean_v = v.cumsum(2) / torch.arange(1, 25)[None, None, :, None]
    torch.testing.assert_close(pom(h, causal=True), att._merge(mean_v), atol=1e-6, rtol=1e-5)


def test_pomify_polymixer_keeps_weights_and_runs():
    teacher = create_model("tiny-attention", **TOY).eval()
    student = pomify(copy.deepcopy(teacher), "ALPL").eval()
    assert student.pattern == "ALPL" and student.config.mixer == "ALPL"
    assert [type(b.mixer).__name__ for b in student.blocks] == ["Attention", "LocalAttention", "PoM", "LocalAttention"]
    assert student.blocks[1].mixer.window == 8
    _unchanged(teacher, student, ["blocks.2.mixer"])
    x = torch.randint(0, 256, (2, 40))
    assert student(x)[0].shape == (2, 40, 257)
    assert student.generate(x[:, :5], 6, temperature=0).shape == (2, 11)
    # the converted model is what its config describes: it rebuilds and loads strictly
    rebuilt = build_from_config("lm", asdict(student.config))
    rebuilt.load_state_dict(student.state_dict())
    assert torch.equal(rebuilt.eval()(x)[0], student(x)[0])
    pairs = replaced_layers(student, teacher)
    assert sorted(pairs) == [1, 2, 3] and pairs[2][1] is teacher.blocks[2].mixer


def test_local_attention_from_attention_is_exact_within_the_window():
    teacher = create_model("tiny-attention", **TOY).eval()
    student = pomify(copy.deepcopy(teacher), "LLLL", window=64).eval()
    x = torch.randint(0, 256, (2, 40))
    torch.testing.assert_close(student(x)[0], teacher(x)[0], atol=1e-5, rtol=1e-5)


def test_pomify_polymixer_refusals():
    pom = create_model("tiny-pom", **TOY)
    with pytest.raises(ValueError, match="cannot become"):
        pomify(pom, "AAAA")
    hybrid = create_model("tiny-hybrid", **TOY)
    with pytest.raises(ValueError, match="share its degree"):
        pomify(hybrid, "pom", degree=3)
    with pytest.raises(ValueError, match="unknown mixer"):
        pomify(create_model("tiny-attention", **TOY), "PXPX")
    with pytest.raises(TypeError, match="pomify supports"):
        pomify(torch.nn.Linear(2, 2), "P")


def test_init_pom_checks_shapes():
    with pytest.raises(ValueError, match="do not match"):
        init_pom_from_attention(PoM(8), torch.zeros(8, 4), None, torch.zeros(8, 8), None)


# ----------------------------------------------------------------------------------------------------------------
# transformers GPT-2 and Llama
# ----------------------------------------------------------------------------------------------------------------


def _hf_models():
    tf = pytest.importorskip("transformers")
    gpt2 = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=4, n_embd=32, n_head=4, vocab_size=100, n_positions=64,
                                            bos_token_id=0, eos_token_id=0, pad_token_id=0))
    llama = tf.LlamaForCausalLM(tf.LlamaConfig(num_hidden_layers=4, hidden_size=32, num_attention_heads=4,
                                               num_key_value_heads=2, intermediate_size=64, vocab_size=100,
                                               max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
                                               pad_token_id=0))
    return {"gpt2": (gpt2.eval(), "transformer.h.{}.attn"), "llama": (llama.eval(), "model.layers.{}.self_attn")}


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_pomify_transformers(kind, tmp_path):
    from polymixer.pomify import ConvertedMixer, load_pomified

    teacher, attn = _hf_models()[kind]
    student = pomify(copy.deepcopy(teacher), "AALP", window=4).eval()
    assert isinstance(student.get_submodule(attn.format(3)).mixer, PoM)
    assert student.get_submodule(attn.format(2)).mixer.window == 4
    assert isinstance(student.get_submodule(attn.format(2)), ConvertedMixer)
    _unchanged(teacher, student, [attn.format(2) + ".", attn.format(3) + "."])
    x = torch.randint(1, 100, (2, 12))
    am = torch.ones(2, 12, dtype=torch.long)
    am[1, :4] = 0  # left padding
    # layers before the first replaced one see exactly what the teacher's did
    hs_t = teacher(x, attention_mask=am, output_hidden_states=True).hidden_states
    hs_s = student(x, attention_mask=am, output_hidden_states=True).hidden_states
    for i in range(3):
        assert torch.equal(hs_t[i], hs_s[i]), i
    assert not torch.allclose(hs_t[3], hs_s[3])
    # generate with transformers' cache (PoM sums and the ring buffer live in it) = decoding without any cache
    for kw in (dict(), dict(num_beams=3)):
        cached = student.generate(x, attention_mask=am, max_new_tokens=8, do_sample=False, eos_token_id=None, **kw)
        plain = student.generate(x, attention_mask=am, max_new_tokens=8, do_sample=False, eos_token_id=None,
                                 use_cache=False, **kw)
        assert torch.equal(cached, plain), kw
    student.save_pretrained(tmp_path)
    again = load_pomified(tmp_path)
    assert torch.equal(again(x, attention_mask=am).logits, student(x, attention_mask=am).logits)
    pairs = replaced_layers(student, teacher)
    assert sorted(pairs) == [2, 3]
    with pytest.raises(ValueError, match="already converted"):
        pomify(student, "P")


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_transformers_local_attention_is_exact_within_the_window(kind):
    teacher, _ = _hf_models()[kind]
    student = pomify(copy.deepcopy(teacher), "LLLL", window=64).eval()
    x = torch.randint(1, 100, (2, 12))
    am = torch.ones(2, 12, dtype=torch.long)
    am[1, :4] = 0
    a, b = student(x, attention_mask=am).logits, teacher(x, attention_mask=am).logits
    torch.testing.assert_close(a[0], b[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a[1, 4:], b[1, 4:], atol=1e-5, rtol=1e-5)  # real tokens of the padded row
