"""Tokenizers, the cached corpus, windows and document packing."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from polymixer.experiments.lm.data import TokenWindows, default_corpus_files, prepare_corpus
from polymixer.tokenizer import GPT2BPE, ByteTokenizer, bytes_to_unicode, load_tokenizer
from polymixer.functional import documents_cu_seqlens


def test_byte_tokenizer_roundtrip():
    tok = ByteTokenizer()
    text = "déjà vu — 東京 🙂\n"
    ids = tok.encode(text)
    assert max(ids) < 256 and tok.decode(ids) == text
    assert tok.decode(ids + [tok.eot_id] + ids) == text + "<|endoftext|>" + text
    assert tok.token_bytes()[tok.eot_id] == 0 and tok.token_bytes()[65] == 1
    with pytest.raises(ValueError, match="outside"):
        tok.decode([300])


def _tiny_bpe(tmp_path):
    """A GPT-2-format vocabulary: the 256 byte symbols, a few merges, and end-of-text."""
    b2u = bytes_to_unicode()
    symbols = [b2u[b] for b in range(256)]
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "w"), ("o", "r")]
    vocab = symbols + ["".join(m) for m in merges] + ["<|endoftext|>"]
    (tmp_path / "encoder.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
    (tmp_path / "vocab.bpe").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    return tmp_path


def test_gpt2_bpe_from_local_files(tmp_path):
    pytest.importorskip("regex")
    tok = load_tokenizer(str(_tiny_bpe(tmp_path)))
    assert isinstance(tok, GPT2BPE)
    text = "hello world, 東京!"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.encoder["hell"] in ids and tok.encoder["Ġw"] in ids  # merges applied in rank order
    assert tok.vocab_size == 262 and tok.eot_id == 261
    assert tok.token_bytes()[tok.encoder["hell"]] == 4


def test_tokenizer_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown tokenizer"):
        load_tokenizer("sentencepiece")
    with pytest.raises(FileNotFoundError, match="encoder.json"):
        GPT2BPE.from_dir(tmp_path)


def test_default_corpus_is_the_standard_library():
    files = default_corpus_files()
    assert len(files) > 100 and all(f.suffix == ".py" for f in files)
    assert not any("test" in f.parts for f in files)


def test_corpus_cache_split_and_errors(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(30):
        (docs / f"f{i:02d}.txt").write_text(f"document {i} " * (20 + i))
    (docs / "blob.bin").write_bytes(b"\x00\x01binary")
    cache = tmp_path / "cache"
    c = prepare_corpus([docs], ByteTokenizer(), cache_dir=cache, val_fraction=0.2, progress=False)
    assert c.meta["files"] == 30 and c.meta["files_per_split"]["val"] >= 1 and c.meta["files_per_split"]["train"] >= 1
    assert c.train.dtype == np.uint16
    assert int((np.asarray(c.train) == 256).sum()) == c.meta["files_per_split"]["train"]  # one end-of-text per file
    assert c.meta["val_bytes"] == int((np.asarray(c.val) != 256).sum())
    again = prepare_corpus([docs], ByteTokenizer(), cache_dir=cache, val_fraction=0.2, progress=False)
    assert again.path == c.path and len(list(cache.iterdir())) == 1  # tokenised once, reused
    (docs / "f00.txt").write_text("changed")
    changed = prepare_corpus([docs], ByteTokenizer(), cache_dir=cache, val_fraction=0.2, progress=False)
    assert changed.path != c.path
    single = tmp_path / "one.txt"
    single.write_text("x" * 1000)
    one = prepare_corpus([single], ByteTokenizer(), cache_dir=cache, val_fraction=0.1, progress=False)
    assert len(one.val) > 0 and len(one.train) > len(one.val)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        prepare_corpus([tmp_path / "missing"], ByteTokenizer(), cache_dir=cache, progress=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no text files"):
        prepare_corpus([empty], ByteTokenizer(), cache_dir=cache, progress=False)


def test_windows_are_a_function_of_step_and_share():
    data = np.arange(10_000, dtype=np.uint16) % 257
    w = TokenWindows(data, 16)
    x, y = w.random(5, 8, seed=1)
    assert torch.equal(x[:, 1:], y[:, :-1])
    x2, _ = w.random(5, 8, seed=1)
    assert torch.equal(x, x2)
    parts = [w.random(5, 8, seed=1, share=s, shares=4)[0] for s in range(4)]
    assert torch.equal(torch.cat(parts), x)
    assert not torch.equal(w.random(6, 8, seed=1)[0], x)
    fixed = list(w.fixed(10, 4))
    assert [len(b[0]) for b in fixed] == [4, 4, 2]
    with pytest.raises(ValueError, match="too small"):
        TokenWindows(data[:10], 16)
    with pytest.raises(ValueError, match="divisible"):
        w.random(0, 6, seed=0, shares=4)


def test_documents_cu_seqlens():
    x = torch.tensor([[1, 2, 9, 3, 4], [9, 5, 6, 7, 9]])
    cu, pos = documents_cu_seqlens(x, 9)
    assert cu.tolist() == [0, 3, 5, 6, 10] and cu.dtype == torch.int32
    assert pos.tolist() == [0, 1, 2, 0, 1, 0, 0, 1, 2, 3]
