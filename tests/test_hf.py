"""transformers integration: Auto classes, generate() with polymixer's streaming states, pipeline, tokenizers,
export / import. Skipped when transformers (the [hf] extra) is not installed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, pipeline  # noqa: E402

from polymixer.experiments.cli import main  # noqa: E402
from polymixer.tokenizer import ByteTokenizer, GPT2BPE, bytes_to_unicode  # noqa: E402
from polymixer.hf import (PolymixerCache, PolymixerConfig, PolymixerForCausalLM, hf_tokenizer, output_cache,  # noqa: E402
                          to_hf)
from polymixer.models import create_model  # noqa: E402
from polymixer.models.lm import pad_left  # noqa: E402
from polymixer.checkpoint import load_model, save_checkpoint  # noqa: E402

TOY = dict(n_layer=4, n_embd=32, n_head=2, window=4, sel_heads=2, block_size=64)
PATTERNS = ["attention", "pom", "hybrid", "PAL", "VL"]


def _model(mixer: str, **kw) -> PolymixerForCausalLM:
    cfg = {**TOY, **kw, "mixer": mixer}
    if mixer == "PAL":
        cfg["n_layer"] = 3
    return PolymixerForCausalLM(PolymixerConfig(**cfg)).eval()


def _prompts():
    return pad_left([[1, 2, 3, 4, 5, 6, 7], [8, 9], [10, 11, 12, 13]], pad_id=256)


def test_config_covers_every_lm_config_field():
    from dataclasses import fields

    from polymixer.models.lm import LMConfig

    missing = [f.name for f in fields(LMConfig) if f.name not in PolymixerConfig.__dataclass_fields__]
    assert not missing
    with pytest.raises(ValueError, match="position"):
        PolymixerConfig(position="alibi")


@pytest.mark.parametrize("mixer", PATTERNS)
def test_auto_class_round_trip_same_tensors_and_logits(tmp_path, mixer):
    m = _model(mixer)
    m.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(again) is PolymixerForCausalLM and again.config.mixer == mixer
    assert again.model.lm_head.weight is again.model.wte.weight  # still tied
    for k, v in m.model.state_dict().items():
        assert torch.equal(v, again.model.state_dict()[k]), k
    x = torch.randint(0, 257, (2, 20))
    assert torch.equal(m(x).logits, again(x).logits)


def test_polymixer_model_weights_are_the_hf_model_weights():
    gpt = create_model("tiny-hybrid", **TOY).eval()
    hf = to_hf(gpt)
    assert set(hf.state_dict()) == {"model." + k for k in gpt.state_dict()}
    x = torch.randint(0, 257, (2, 16))
    assert torch.equal(gpt(x)[0], hf(x).logits)
    # labels: transformers' convention (shifted inside, -100 ignored) = polymixer's loss on next tokens
    labels = x.clone()
    labels[0, :3] = -100
    targets = torch.cat([x[:, 1:], torch.full((2, 1), -1)], 1)
    targets[0, :2] = -1
    assert torch.allclose(hf(x, labels=labels).loss, gpt(x, targets)[1])


@pytest.mark.parametrize("mixer", PATTERNS)
def test_generate_equals_polymixer_generate_batched_left_padded(mixer):
    m = _model(mixer)
    idx, mask = _prompts()
    ref = m.model.generate(idx, 16, temperature=0, mask=mask)
    out = m.generate(idx, attention_mask=mask.long(), max_new_tokens=16, do_sample=False, eos_token_id=None)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("mixer", PATTERNS)
def test_beam_search_reorders_states_like_decoding_without_cache(mixer):
    m = _model(mixer)
    idx, mask = _prompts()
    kw = dict(attention_mask=mask.long(), max_new_tokens=10, num_beams=4, num_return_sequences=2, do_sample=False,
              eos_token_id=None)
    cached = m.generate(idx, **kw)
    reference = m.generate(idx, use_cache=False, **kw)  # every step re-reads the whole beam: no state to reorder
    assert torch.equal(cached, reference)


def test_sampling_top_k_top_p_reproducible():
    m = _model("hybrid")
    idx, mask = _prompts()
    outs = []
    for _ in range(2):
        torch.manual_seed(3)
        outs.append(m.generate(idx, attention_mask=mask.long(), max_new_tokens=12, do_sample=True, top_k=20,
                               top_p=0.9, temperature=0.8))
    assert torch.equal(*outs) and outs[0].shape == (3, idx.shape[1] + 12)


def test_pom_cache_stays_the_same_size():
    sizes = {}
    for mixer in ("pom", "hybrid", "attention"):
        m = _model(mixer)
        x = torch.randint(0, 256, (1, 8))
        out = m(x, use_cache=True)
        cache = output_cache(out)
        assert isinstance(cache, PolymixerCache)
        first = cache.memory_bytes
        nxt = out.logits[:, -1:].argmax(-1)
        for _ in range(40):
            out = m(nxt, cache=cache, use_cache=True)
            nxt = out.logits[:, -1:].argmax(-1)
        sizes[mixer] = (first, cache.memory_bytes, cache.get_seq_length())
    assert sizes["pom"][0] == sizes["pom"][1] and sizes["pom"][2] == 48
    assert sizes["hybrid"][0] == sizes["hybrid"][1]  # ring buffers of the window, PoM sums
    assert sizes["attention"][1] > sizes["attention"][0]  # the KV cache grows


def test_cache_errors_and_unsupported_inputs():
    m = _model("pom")
    x = torch.randint(0, 256, (1, 4))
    filled = DynamicCache()
    filled.update(torch.zeros(1, 2, 3, 16), torch.zeros(1, 2, 3, 16), 0)
    with pytest.raises(TypeError, match="PolymixerCache"):
        m(x, past_key_values=filled)
    with pytest.raises(ValueError, match="inputs_embeds"):
        m(inputs_embeds=torch.zeros(1, 4, 32))
    with pytest.raises(NotImplementedError, match="cropped"):
        output_cache(m(x, use_cache=True)).crop(2)
    cache = output_cache(m(x, use_cache=True))
    with pytest.raises(ValueError, match="batch"):
        m(torch.randint(0, 256, (2, 1)), past_key_values=cache)
    with pytest.raises(ValueError, match="not both"):
        m(x, cache=cache, past_key_values=cache)


def test_the_state_goes_in_under_either_name():
    # transformers 5.24 renamed past_key_values to cache; generate() of either side of the rename must decode
    m = _model("hybrid")
    x, nxt = torch.randint(0, 256, (2, 6)), torch.randint(0, 256, (2, 1))
    full = m(torch.cat([x, nxt], 1), use_cache=False).logits[:, -1]
    for name in ("cache", "past_key_values"):
        cache = output_cache(m(x, use_cache=True))
        assert isinstance(cache, PolymixerCache)
        step = m(nxt, use_cache=True, **{name: cache})
        assert output_cache(step) is cache and cache.get_seq_length() == 7
        torch.testing.assert_close(step.logits[:, -1], full, atol=1e-4, rtol=1e-4)


def test_byte_tokenizer_same_ids_and_pipeline(tmp_path):
    tok = hf_tokenizer()
    text = "déf f(x):\n\treturn x → ∞"
    assert tok(text)["input_ids"] == ByteTokenizer().encode(text)
    assert tok.decode(ByteTokenizer().encode(text)) == text
    assert tok.eos_token_id == tok.pad_token_id == 256
    m = _model("hybrid")
    m.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    pipe = pipeline("text-generation", model=str(tmp_path))
    out = pipe("def f", max_new_tokens=6, do_sample=False)[0]["generated_text"]
    ids = m.model.generate(torch.tensor([ByteTokenizer().encode("def f")]), 6, temperature=0)[0, 5:].tolist()
    assert out == "def f" + ByteTokenizer().decode([i for i in ids if i != 256])
    assert AutoTokenizer.from_pretrained(tmp_path)("ab")["input_ids"] == [97, 98]


def test_gpt2_bpe_tokenizer_converts_with_the_same_ids():
    pytest.importorskip("regex")
    b2u = bytes_to_unicode()
    encoder = {b2u[b]: b for b in range(256)}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n")]
    for a, b in merges:
        encoder[a + b] = len(encoder)
    encoder["<|endoftext|>"] = len(encoder)
    ours = GPT2BPE(encoder, merges)
    tok = hf_tokenizer(ours)
    text = "in the theme, then in 12 ways"
    assert tok(text)["input_ids"] == ours.encode(text)
    assert tok.eos_token_id == ours.eot_id


def test_export_import_round_trip(tmp_path, capsys):
    gpt = create_model("tiny-hybrid", **TOY).eval()
    meta = {"family": "lm", "preset": "tiny-hybrid", "model": {**vars(gpt.config)}, "data": {"tokenizer": "bytes"}}
    save_checkpoint(tmp_path / "run", 5, gpt, meta)
    assert main(["export", "hf", "--ckpt", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    files = {p.name for p in (tmp_path / "hf").iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= files
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    x = torch.randint(0, 257, (2, 12))
    assert torch.equal(hf(x).logits, gpt(x)[0])
    assert main(["import", "hf", "--src", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 0
    back = load_model(tmp_path / "back")
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in gpt.state_dict().items())
    assert main(["generate", "--ckpt", str(tmp_path / "back"), "--prompt", "ab", "--max-new-tokens", "3"]) == 0
    # a non-language model is refused with a one-line error
    save_checkpoint(tmp_path / "img", 1, torch.nn.Linear(2, 2), {"family": "image", "model": {}})
    assert main(["export", "hf", "--ckpt", str(tmp_path / "img"), "--out", str(tmp_path / "x")]) == 2
    assert "only language models" in capsys.readouterr().err


@pytest.mark.parametrize("wrapt", ["wrapt hidden", "wrapt importable"])
def test_auto_classes_know_polymixer_after_import_in_either_order(tmp_path, wrapt):
    """Registration needs nothing beyond transformers: a fresh process, either import order, with wrapt importable
    or made unimportable, and the exported folder loads through the Auto classes."""
    _model("pom").save_pretrained(tmp_path)
    hide = "import sys; sys.modules['wrapt'] = None\n" if wrapt == "wrapt hidden" else ""
    for first, second in (("polymixer", "transformers"), ("transformers", "polymixer")):
        code = (f"{hide}import {first}, {second}\nfrom transformers import AutoModelForCausalLM\n"
                f"m = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r})\nprint(type(m).__name__)")
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip().endswith("PolymixerForCausalLM")
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "polymixer"


def test_import_polymixer_does_not_import_transformers_and_the_hook_leaves_nothing_behind():
    code = ("import sys, polymixer\nassert 'transformers' not in sys.modules and 'polymixer.hf' not in sys.modules\n"
            "hooks = [f for f in sys.meta_path if type(f).__module__ == 'polymixer.import_hooks']\n"
            "assert len(hooks) == 1, sys.meta_path\n"
            "import transformers\nassert 'polymixer.hf' in sys.modules\n"
            "assert transformers.__spec__.loader.__module__ != 'polymixer.import_hooks'\n"
            "assert not [f for f in sys.meta_path if type(f).__module__ == 'polymixer.import_hooks']\nprint('ok')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_bench_lm_decoding_through_transformers(tmp_path):
    from polymixer.experiments.lm.bench import LMBenchConfig, report, run

    cfg = LMBenchConfig(n_layer=2, n_embd=32, n_head=2, window=8, hf_decode_contexts=(16, 48), decode_steps=3,
                        parts=("hf_decode",), out=str(tmp_path))
    rows = run(cfg, progress=False)["hf_decode"]["rows"]
    pom = [r for r in rows if r["model"] == "pom"]
    att = [r for r in rows if r["model"] == "attention"]
    assert pom[0]["state_mb"] == pom[1]["state_mb"] and att[1]["state_mb"] > att[0]["state_mb"]
    assert "decoding through transformers" in report(run(cfg, progress=False))


def test_export_import_with_a_gpt2_bpe_tokenizer(tmp_path):
    pytest.importorskip("regex")
    from polymixer.tokenizer import load_tokenizer

    b2u = bytes_to_unicode()
    encoder = {b2u[b]: b for b in range(256)}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
    for a, b in merges:
        encoder[a + b] = len(encoder)
    encoder["<|endoftext|>"] = len(encoder)
    tdir = tmp_path / "bpe"
    tdir.mkdir()
    (tdir / "encoder.json").write_text(json.dumps(encoder))
    (tdir / "vocab.bpe").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    gpt = create_model("tiny-pom", **{**TOY, "vocab_size": len(encoder)}).eval()
    meta = {"family": "lm", "preset": "tiny-pom", "model": {**vars(gpt.config)}, "data": {"tokenizer": str(tdir)}}
    save_checkpoint(tmp_path / "run", 1, gpt, meta)
    assert main(["export", "hf", "--ckpt", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "the theme then"
    assert hf_tok(text)["input_ids"] == load_tokenizer(str(tdir)).encode(text)
    assert main(["import", "hf", "--src", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 0
    cfg = json.loads((tmp_path / "back" / "checkpoints" / "step_00000000" / "config.json").read_text())
    back_tok = load_tokenizer(cfg["data"]["tokenizer"])
    assert back_tok.encode(text) == load_tokenizer(str(tdir)).encode(text) and back_tok.eot_id == 259
