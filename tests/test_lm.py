"""Language models: presets, patterns, decoding with per-layer state, packing, generation, errors."""

from __future__ import annotations

import pytest
import torch

from polymixer.models import count_parameters, create_model, list_models
from polymixer.models.lm import GPT, LMConfig, pad_left

SEP = 256


def _tiny(mixer="hybrid", position="rope", **kw):
    torch.manual_seed(0)
    cfg = dict(n_layer=4, n_embd=32, n_head=4, block_size=64, window=5, vocab_size=257, sel_heads=4, mixer=mixer,
               position=position)
    cfg.update(kw)
    m = GPT(LMConfig(**cfg)).eval()
    with torch.no_grad():  # make PoM's polynomial matter (its reference init is ±1e-3)
        for blk in m.blocks:
            if hasattr(blk.mixer, "coeff"):
                blk.mixer.coeff.uniform_(-0.5, 0.5)
    return m


def test_paper_scale_parameter_counts_on_meta_device():
    gpt2 = create_model("gpt2-small", device="meta")
    assert all(p.is_meta for p in gpt2.parameters())
    assert count_parameters(gpt2) == 124_475_904  # exactly nanoGPT's GPT-2 124M with vocab 50,304
    for name in ("gppom2-small", "gppom2-small-hybrid"):
        n = count_parameters(create_model(name, device="meta"))
        assert abs(n / 124_475_904 - 1) < 0.03, (name, n)
    assert {"gpt2-small", "gppom2-small", "gppom2-small-hybrid", "tiny-attention", "tiny-pom",
            "tiny-hybrid"} <= set(list_models(family="lm"))


def test_tiny_presets_have_equal_parameter_counts():
    counts = [count_parameters(create_model(n, device="meta")) for n in ("tiny-attention", "tiny-pom", "tiny-hybrid")]
    assert max(counts) / min(counts) < 1.01, counts


def test_patterns():
    assert LMConfig(n_layer=4, mixer="hybrid").layer_pattern() == "LPLP"
    assert LMConfig(n_layer=4, mixer="PL").layer_pattern() == "PLPL"
    assert LMConfig(n_layer=6, mixer="PPA").layer_pattern() == "PPAPPA"
    assert GPT(LMConfig(n_layer=3, n_embd=32, n_head=4, vocab_size=300, mixer="PAL")).pattern == "PAL"
    with pytest.raises(ValueError, match="unknown letters"):
        LMConfig(n_layer=2, mixer="PX")
    with pytest.raises(ValueError, match="multiple of 2"):
        LMConfig(n_layer=3, mixer="hybrid")
    with pytest.raises(ValueError, match="tile"):
        LMConfig(n_layer=4, mixer="PAL")
    with pytest.raises(ValueError, match="unknown model"):
        create_model("gpt3-small")
    with pytest.raises(TypeError, match="n_layers is not a field"):
        create_model("tiny-pom", n_layers=2)


def _assert_decode_reproduces_forward(m, n: int, prefix: int) -> None:
    """A prefill of ``prefix`` tokens then token-by-token decoding gives the full forward's logits (≤ 1e-5)."""
    idx = torch.randint(0, 256, (2, n))
    with torch.no_grad():
        full, _ = m(idx)
        state = m.init_state(2)
        first, state = m.step(idx[:, :prefix], state)
        outs = [first]
        for t in range(prefix, n):
            logit, state = m.step(idx[:, t:t + 1], state)
            outs.append(logit)
    rel = (torch.cat(outs, 1) - full).norm() / full.norm()
    assert rel <= 1e-5, rel


@pytest.mark.parametrize("mixer", ["attention", "pom", "hybrid", "PALP", "LLPA", "VLPV"])
@pytest.mark.parametrize("position", ["learned", "rope", "none"])
def test_prefill_then_decode_reproduces_forward(mixer, position):
    _assert_decode_reproduces_forward(_tiny(mixer, position), 40, 13)


def test_attention_shift_decodes_like_forward_and_leaves_other_layers_alone():
    m = _tiny("ALPV", "rope", attention_shift=3)
    assert [hasattr(b.mixer, "shift") and b.mixer.shift.shape[0] for b in m.blocks] == [3, 3, False, 2]
    with torch.no_grad():
        for blk in m.blocks[:2]:
            blk.mixer.shift.normal_()
    _assert_decode_reproduces_forward(m, 30, 11)
    with pytest.raises(ValueError, match=r"attention_shift must be a bool or a width ≥ 2 \(0: none\)"):
        LMConfig(attention_shift=1)


def test_pom_shift_decodes_like_forward_and_reaches_only_p_layers():
    """A model's pom_shift is its P layers' token shift (token_shift stays the V layers', attention_shift A / L's)."""
    m = _tiny("PLPV", "rope", pom_shift=3)
    assert [hasattr(b.mixer, "shift") and b.mixer.shift.shape[0] for b in m.blocks] == [3, False, 3, 2]
    with torch.no_grad():
        for blk in m.blocks[0], m.blocks[2]:
            blk.mixer.shift.normal_()
    _assert_decode_reproduces_forward(m, 30, 11)
    with pytest.raises(ValueError, match=r"pom_shift must be a bool or a width ≥ 2 \(0: none\)"):
        LMConfig(pom_shift=1)


@pytest.mark.parametrize("mixer, shift", [("attention", 0), ("pom", 0), ("hybrid", 0), ("VL", 0), ("pom", 3)])
@pytest.mark.parametrize("position", ["learned", "rope"])
def test_left_padded_batch_decodes_like_single_prompts(mixer, shift, position):
    m = _tiny(mixer, position, pom_shift=shift)
    if shift:
        with torch.no_grad():
            for blk in m.blocks:
                blk.mixer.shift.normal_()
    prompts = [torch.randint(0, 256, (n,)).tolist() for n in (7, 19, 12)]
    idx, mask = pad_left(prompts, pad_id=SEP)
    with torch.no_grad():
        state = m.init_state(3)
        logits, state = m.step(idx, state, mask=mask)
        nxt = torch.randint(0, 256, (3, 5))
        batched = [logits[:, -1]]
        for t in range(5):
            lg, state = m.step(nxt[:, t:t + 1], state)
            batched.append(lg[:, -1])
        for i, p in enumerate(prompts):
            full, _ = m(torch.tensor([p + nxt[i].tolist()]))
            ref = full[0, len(p) - 1:]
            got = torch.stack([b[i] for b in batched])
            assert (got - ref).norm() / ref.norm() <= 1e-5
        # the parallel forward with a padding mask agrees too
        full_b, _ = m(idx, mask=mask)
        for i, p in enumerate(prompts):
            ref, _ = m(torch.tensor([p]))
            assert (full_b[i, -len(p):] - ref[0]).norm() / ref.norm() <= 1e-5


@pytest.mark.parametrize("mixer", ["attention", "pom", "hybrid", "VL"])
def test_packed_documents_do_not_see_each_other(mixer):
    m = _tiny(mixer, "learned")
    docs = [torch.randint(0, 256, (n,)).tolist() + [SEP] for n in (9, 20, 14, 30)]
    flat = sum(docs, [])[:64]
    x = torch.tensor([flat[:32], flat[32:64]])
    y = torch.randint(0, 257, x.shape)
    logits, loss = m(x, y, sep_token=SEP)
    # each document (cut at row ends) alone
    rows = x.tolist()
    for r, row in enumerate(rows):
        start = 0
        for i, t in enumerate(row):
            if t == SEP or i == len(row) - 1:
                seg = row[start:i + 1]
                ref, _ = m(torch.tensor([seg]))
                torch.testing.assert_close(logits[r, start:i + 1], ref[0], rtol=1e-4, atol=1e-5)
                start = i + 1
    ref_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 257), y.reshape(-1))
    torch.testing.assert_close(loss, ref_loss)
    # without sep_token, documents would leak into each other
    leaky, _ = m(x)
    assert (leaky - logits).abs().max() > 1e-3


def test_training_step_lowers_loss():
    for mixer in ("attention", "pom", "hybrid", "VL"):
        m = _tiny(mixer).train()
        x = torch.randint(0, 256, (4, 32))
        opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
        _, before = m(x[:, :-1], x[:, 1:])
        for _ in range(5):
            _, loss = m(x[:, :-1], x[:, 1:])
            opt.zero_grad()
            loss.backward()
            opt.step()
        _, after = m(x[:, :-1], x[:, 1:])
        assert after < before - 0.05, (mixer, before, after)


def test_generate_greedy_and_seeded_batches_match_single_prompts():
    m = _tiny("hybrid")
    prompts = [[1, 2, 3], [10, 20, 30, 40, 50, 60], [7]]
    idx, mask = pad_left(prompts, pad_id=SEP)
    for kw in (dict(temperature=0.0), dict(temperature=1.0, top_k=50, seed=3), dict(temperature=0.9, top_p=0.9,
                                                                                     seed=11)):
        out = m.generate(idx, 12, mask=mask, **kw)
        assert out.shape == (3, idx.shape[1] + 12)
        for i, p in enumerate(prompts):
            kw1 = dict(kw)
            if "seed" in kw1:
                kw1["seed"] += i  # row i of a batch draws from seed + i
            single = m.generate(torch.tensor([p]), 12, **kw1)
            assert out[i, idx.shape[1]:].tolist() == single[0, len(p):].tolist(), (kw, i)


def test_generate_stops_at_end_of_text_and_validates():
    m = _tiny("pom")
    with torch.no_grad():  # make the end-of-text token the most likely next token everywhere
        m.lm_head.weight[SEP] = 0
        m.wte.weight.data[SEP] = 0
    first = m.generate(torch.tensor([[1, 2]]), 4, temperature=0.0)
    stop = int(first[0, 2])
    out = m.generate(torch.tensor([[1, 2]]), 6, temperature=0.0, stop_token=stop)
    assert out[0, 2:].tolist() == [stop] * 6
    with pytest.raises(ValueError, match="top_p"):
        m.generate(torch.tensor([[1]]), 2, top_p=1.5)
    learned = _tiny("attention", "learned", block_size=16)
    with pytest.raises(ValueError, match="prompt has 20 tokens but this model's context is 16"):
        learned.generate(torch.randint(0, 256, (1, 20)), 1)
    with pytest.raises(ValueError, match="exceed the context"):
        learned.generate(torch.randint(0, 256, (1, 10)), 10)
    with pytest.raises(ValueError, match="beyond this model's context"):
        learned(torch.randint(0, 256, (1, 17)))
    rope = _tiny("attention", "rope", block_size=16)
    assert rope.generate(torch.randint(0, 256, (1, 20)), 10, temperature=0).shape == (1, 30)


def test_bad_token_ids():
    m = _tiny()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        m(torch.tensor([[1, 300]]))
    with pytest.raises(TypeError, match="int64"):
        m(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="at least one token"):
        m(torch.zeros(1, 0, dtype=torch.long))
