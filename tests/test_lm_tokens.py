"""Token-level language models: the prose BPE (trained on the train split alone, deterministic, cached), --tokenizer
values, a token-level training run reporting bits per byte, and the n-gram baseline's probabilities and scores."""

import argparse
import json
import math
import random

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from polymixer.experiments.lm.bpe import (  # noqa: E402
    BPETokenizer, lab_tokenizer, prose_bpe_path, run_tokenizer, tokenizer_argument, train_bpe)
from polymixer.experiments.lm.data import PROSE_SPLIT, document_split  # noqa: E402
from polymixer.experiments.lm.ngram import choose_discounts, fit_ngram, ngram_rows  # noqa: E402

SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "vi", "so", "pe", "du", "xa", "ji", "qu", "ze", "bo", "fy"]


def _words(rng: random.Random, n: int) -> str:
    vocab = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(400)]
    weights = [1 / (i + 1) for i in range(len(vocab))]  # Zipf-like, as words are
    return " ".join(rng.choices(vocab, weights, k=n))


@pytest.fixture(scope="module")
def articles(tmp_path_factory):
    """A file in the prose package's format (title → {title, extract}) of 60 generated articles (~60 KB)."""
    rng = random.Random(0)
    items = {f"Article {i}": {"title": f"Article {i}", "extract": _words(rng, 200) + "."} for i in range(60)}
    path = tmp_path_factory.mktemp("prose") / "summaries.json"
    path.write_text(json.dumps(items))
    return path


@pytest.fixture(scope="module")
def bpe(articles, tmp_path_factory):
    return BPETokenizer(prose_bpe_path(512, source=articles, cache_dir=tmp_path_factory.mktemp("tok")))


def test_bpe_trains_on_the_train_split_alone_deterministically_and_is_cached(articles, tmp_path):
    a = prose_bpe_path(512, source=articles, cache_dir=tmp_path / "a")
    stamp = a.stat().st_mtime_ns
    assert prose_bpe_path(512, source=articles, cache_dir=tmp_path / "a") == a and a.stat().st_mtime_ns == stamp
    b = prose_bpe_path(512, source=articles, cache_dir=tmp_path / "b")
    assert a.read_text() == b.read_text()  # trained again from scratch: the same file
    meta = json.loads(a.with_suffix(".meta.json").read_text())
    titles = json.loads(articles.read_text())
    train = [k for k in titles if document_split(k, *PROSE_SPLIT) == "train"]
    assert 0 < meta["documents"] == len(train) < len(titles)
    # another size is another file
    assert prose_bpe_path(600, source=articles, cache_dir=tmp_path / "a") != a


def test_bpe_size_is_respected_and_every_token_has_its_bytes(bpe):
    assert bpe.vocab_size == 512
    tb = bpe.token_bytes()
    assert tb[bpe.eot_id] == 0 and (np.delete(tb, bpe.eot_id) >= 1).all() and tb.max() > 1


@pytest.mark.parametrize("text", ["plain ascii", "naïve café — 日本語 🙂 Ωmega", "\x00\x01\t\n\r\x7f", "  spaces  ",
                                  "<|endoftext|> is text here", "".join(map(chr, range(32, 600)))])
def test_bpe_round_trips_any_text_and_counts_its_bytes(bpe, text):
    ids = bpe.encode(text)
    assert bpe.decode(ids) == text
    assert int(bpe.token_bytes()[ids].sum()) == len(text.encode("utf-8"))
    assert bpe.eot_id not in ids  # the end-of-text's text inside a document stays text
    assert bpe.encode_bytes(text.encode("utf-8")).tolist() == ids


def test_bpe_round_trips_random_unicode(bpe):
    rng = random.Random(1)
    for _ in range(20):
        text = "".join(chr(rng.choice([rng.randint(0, 0xD7FF), rng.randint(0xE000, 0x10FFFF)])) for _ in range(50))
        assert bpe.decode(bpe.encode(text)) == text
    assert bpe.decode([*bpe.encode("a"), bpe.eot_id, *bpe.encode("b")]) == "a<|endoftext|>b"


def test_train_bpe_is_deterministic():
    rng = random.Random(2)
    texts = [_words(rng, 300) for _ in range(10)]
    assert train_bpe(texts, 400).to_str() == train_bpe(texts, 400).to_str()


def test_a_bpe_that_is_not_byte_level_is_refused(tmp_path):
    import tokenizers as tk

    tok = tk.Tokenizer(tk.models.BPE(unk_token="?"))
    tok.pre_tokenizer = tk.pre_tokenizers.Whitespace()
    tok.train_from_iterator(["some words here"] * 5, tk.trainers.BpeTrainer(vocab_size=60, special_tokens=["?"]))
    (tmp_path / "words.json").write_text(tok.to_str())
    with pytest.raises(ValueError, match="not a byte-level BPE"):
        lab_tokenizer(str(tmp_path / "words.json"))


def test_unknown_tokenizer_is_one_line_listing_the_choices():
    with pytest.raises(ValueError, match=r"unknown tokenizer 'nope': use 'bytes', 'prose-bpe-<N>'.*tokenizers JSON"):
        lab_tokenizer("nope")
    with pytest.raises(ValueError, match="prose-bpe-100: the size must be from 512 to 65536"):
        lab_tokenizer("prose-bpe-100")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown tokenizer 'bpe:4096'"):
        tokenizer_argument("bpe:4096")
    with pytest.raises(argparse.ArgumentTypeError, match="'prose-bpe-9': the size must be from 512"):
        tokenizer_argument("prose-bpe-9")
    assert tokenizer_argument("prose-bpe-4096") == "prose-bpe-4096" and lab_tokenizer("bytes").name == "bytes"


def test_token_level_training_reports_bits_per_byte_and_its_checkpoint_finds_the_tokenizer(
        bpe, tmp_path, polymixer_cache, capsys):
    from polymixer.checkpoint import read_config
    from polymixer.experiments.lm.task import evaluate_checkpoint, train_lm
    from polymixer.experiments.train.loop import TrainConfig

    rng = random.Random(3)
    data = tmp_path / "text"
    data.mkdir()
    for i in range(6):
        (data / f"doc{i}.txt").write_text(_words(rng, 400))
    tcfg = TrainConfig(steps=3, batch_size=4, lr=3e-3, warmup=1, eval_every=3, ckpt_every=3, log_every=1,
                       out=str(tmp_path / "run"), progress=False, seed=0)
    res = train_lm("tiny-attention", tcfg, [str(data)], tokenizer=str(bpe.path), eval_windows=4, n_layer=1,
                   n_embd=32, n_head=2, block_size=32)
    assert res["model"].config.vocab_size == bpe.vocab_size == 512  # the byte preset's 257 grew to the tokenizer's
    m = res["metrics"]
    assert math.isfinite(m["val_bpb"]) and 0 < m["val_bpb"] < m["val_loss"] / math.log(2)  # > 1 byte per token
    assert read_config(tmp_path / "run")["data"]["tokenizer"] == str(bpe.path)
    ev = evaluate_checkpoint(str(tmp_path / "run"), windows=4, lengths=[1])["lengths"][0]
    assert math.isfinite(ev["val_bpb"]) and ev["val_loss"] > ev["val_bpb"] * math.log(2)
    data_meta = read_config(tmp_path / "run")["data"]
    assert data_meta["tokenizer_digest"] == bpe.digest and run_tokenizer(data_meta).digest == bpe.digest
    with pytest.raises(ValueError, match="trained with the .* digest 0123"):  # another BPE of the same name
        run_tokenizer({**data_meta, "tokenizer_digest": "0123"})
    from polymixer.experiments.cli import main

    main(["generate", "--ckpt", str(tmp_path / "run"), "--prompt", "kalo mi", "--max-new-tokens", "8", "--no-stop"])
    sample = capsys.readouterr().out.split("--- sample 0 ---\n")[1]
    assert sample.startswith("kalo mi") and len(sample) > len("kalo mi\n")  # decoded through the same BPE
    with pytest.raises(ValueError, match="vocabulary of 300"):  # an explicit smaller --vocab-size is still refused
        train_lm("tiny-attention", tcfg, [str(data)], tokenizer=str(bpe.path), vocab_size=300, n_layer=1)


# ------------------------------------------------------------------------------------------------------------------
# the n-gram baseline
# ------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def byte_text():
    rng = random.Random(4)
    data = np.frombuffer(_words(rng, 3000).encode(), dtype=np.uint8).astype(np.int64)
    n = len(data)
    return data[: n * 8 // 10], data[n * 8 // 10: n * 9 // 10], data[n * 9 // 10:]


@pytest.mark.parametrize("order", [0, 1, 3, 5])
def test_ngram_distributions_sum_to_one(byte_text, order):
    train, val, _ = byte_text
    model = fit_ngram(train, 257, 5)
    discounts = choose_discounts(model, val)[: order + 1]
    for context in ([], list(train[100:105]), list(b"kalo "), list(b"\xff\xfe\x00zz"), [256, 256]):
        p = model.distribution(context, discounts)
        assert p.shape == (257,) and (p > 0).all() and abs(p.sum() - 1) < 1e-12


def test_ngram_order_zero_is_the_unigram_entropy_and_orders_never_hurt_on_train(byte_text):
    train = byte_text[0]
    model = fit_ngram(train, 257, 5)
    p = model.probabilities(model.context_ids(train), train, [0.0] * 6)  # no discount: maximum likelihood
    freq = np.bincount(train, minlength=257) / len(train)
    entropy = -(freq[freq > 0] * np.log(freq[freq > 0])).sum()
    losses = -np.log(p).mean(axis=1)
    assert abs(losses[0] - entropy) < 1e-12
    assert (np.diff(losses) <= 1e-12).all() and losses[-1] < losses[0] / 2


def test_ngram_rows_choose_on_validation_and_beat_the_unigram(byte_text):
    train, val, test = byte_text
    rows = ngram_rows(train, val, test, 257, np.ones(257, dtype=np.int64))
    assert [r["order"] for r in rows] == list(range(6))
    assert all(0 < r["discount"] <= 1 for r in rows)
    assert rows[3]["test_bpb"] < rows[1]["test_bpb"] < rows[0]["test_bpb"]
    for r in rows:  # one byte per token: bits per byte are the loss in bits
        assert r["test_bpb"] == pytest.approx(r["test_loss"] / math.log(2))
        assert r["val_nats_per_byte"] == pytest.approx(r["val_loss"])


def test_ngram_bits_per_byte_of_tokens_by_hand():
    # order 0, discount 0.5 over a vocabulary of 3: train counts 2, 1, 1 of 4 → P = (c − 0.5 + 0.5·3·⅓) / 4
    # = ½, ¼, ¼; test tokens 0, 1, 2 of 1, 2 and 0 bytes: ln 2 + 2 ln 2 + 2 ln 2 nats over 3 bytes = 5/3 bits per byte
    train, test = np.array([0, 0, 1, 2]), np.array([0, 1, 2])
    (row,) = ngram_rows(train, test, test, 3, np.array([1, 2, 0]), order=0, grid=[0.5])
    assert row["test_bpb"] == pytest.approx(5 / 3, abs=1e-12)
    assert row["test_loss"] == pytest.approx(5 * math.log(2) / 3, abs=1e-12)


def test_ngram_refuses_tokens_outside_the_vocabulary_and_empty_splits():
    with pytest.raises(ValueError, match=r"tokens in \[0, 3\)"):
        fit_ngram(np.array([0, 3]), 3)
    with pytest.raises(ValueError, match="validation split holds no tokens"):
        ngram_rows(np.array([0, 1]), np.array([], dtype=np.int64), None, 3, np.ones(3, dtype=np.int64))


def test_bench_lm_trains_token_level_and_writes_the_ngram_part(articles, tmp_path, polymixer_cache, monkeypatch):
    """bench lm's quality part with --tokenizer prose-bpe-<N> and its ngram part, on generated articles standing in
    for the prose package's."""
    from polymixer.experiments.lm import bench, bpe, data

    monkeypatch.setattr(data, "prose_source", lambda: articles)
    monkeypatch.setattr(bpe, "prose_source", lambda: articles)
    spec = "tiny-attention+n_layer=1+n_embd=32+n_head=2+block_size=32"
    cfg = bench.LMBenchConfig(parts=("quality", "ngram"), corpus="prose", tokenizer="prose-bpe-512",
                              quality_presets=(spec,), sweep=(), quality_steps=2, quality_batch=4,
                              quality_eval_windows=4, ngram_tokenizers=("bytes", "prose-bpe-512"), ngram_order=3,
                              out=str(tmp_path / "out"))
    payload = bench.run(cfg, progress=False)
    (row,) = payload["quality"]["rows"]
    from polymixer.models import count_parameters, create_model

    grown = create_model("tiny-attention", device="meta", n_layer=1, n_embd=32, n_head=2, block_size=32, vocab_size=512)
    assert row["params"] == count_parameters(grown) and math.isfinite(row["val_bpb"])  # the tokenizer's vocabulary
    rows = payload["ngram"]["rows"]
    names = ("bytes", "prose-bpe-512")
    assert [(r["tokenizer"], r["order"]) for r in rows] == [(t, k) for t in names for k in range(4)]
    assert all(math.isfinite(r["test_bpb"]) and math.isfinite(r["val_bpb"]) for r in rows)
    text = (tmp_path / "out" / "lm.txt").read_text()
    assert "tokenizer: prose-bpe-512" in text and "n-gram baseline" in text
    from polymixer.experiments.lm.task import evaluate_checkpoint

    (run_dir,) = {p.parent for p in (tmp_path / "out").rglob("checkpoints") if p.is_dir()}
    test = evaluate_checkpoint(str(run_dir), windows=4, lengths=[1], split="test")["lengths"][0]
    assert math.isfinite(test["test_bpb"]) and test["test_loss"] > test["test_bpb"] * math.log(2)
    # the quality row reports the same held-out figures beside the validation ones it was chosen on
    assert (row["test_loss"], row["test_bpb"]) == (test["test_loss"], test["test_bpb"])
    again = bench.run(bench.LMBenchConfig(parts=("ngram",), corpus="prose", ngram_tokenizers=("bytes",), ngram_order=1,
                                          out=str(tmp_path / "out")), progress=False)["ngram"]["rows"]
    assert [(r["tokenizer"], r["order"]) for r in again] == [(names[1], k) for k in range(4)] + [("bytes", 0),
                                                                                             ("bytes", 1)]
    with pytest.raises(ValueError, match="--tokenizer"):  # one folder, one tokenizer
        bench.run(bench.LMBenchConfig(parts=("quality",), corpus="prose", quality_presets=(spec,), sweep=(),
                                      quality_steps=2, quality_batch=4, out=str(tmp_path / "out")), progress=False)


def test_the_token_bench_report_judges_its_rows_as_the_token_comparison_beside_its_n_gram():
    """bench lm's report of a prose run in the 4,096-entry BPE gives the per-token comparison's verdicts (its test
    loss reported), with the n-gram part of the same JSON as the bar each model's bits per byte must beat; a run in
    another vocabulary is no comparison's and gets no verdicts."""
    from polymixer.experiments.lm import bench
    from polymixer.experiments.lm.targets import PROSE_TOKENS as T

    def row(spec, test, bpb):
        return {"model": spec, "spec": spec, "params": 1000, "steps": 235, "tokens": 1, "val_loss": test,
                "val_bpb": bpb, "test_loss": test, "test_bpb": bpb, "lr": 0.004, "best_lr": True, "rates": 3,
                "loss_vs_attention": 1.0, "train_min": 1.0}

    ngram = [{"tokenizer": "prose-bpe-4096", "order": k, "discount": 0.5, "contexts": 1, "val_loss": 1.0,
              "val_bpb": v, "test_loss": 1.0, "test_bpb": v} for k, v in enumerate((2.8, 1.9, 1.7))]
    payload = {"config": {"corpus": "prose", "tokenizer": "prose-bpe-4096"},
               "quality": {"rows": [row(T.attention, 4.0, 1.6), row(T.pom, 4.8, 1.9)], "config": {"seed": 0}},
               "ngram": {"rows": ngram, "smoothing": "s", "corpus": "prose", "seconds": {}}}
    text = bench.report(payload)
    assert (f"{T.name}: n-gram baseline (prose-bpe-4096, lm_tokens/lm.json), bits per byte on test "
            "2.800 / 1.900 / 1.700") in text
    assert f"undertrained: {T.pom} 1.90 bits per byte against the n-gram's 1.70 (test, prose-bpe-4096, order 2)" in text
    payload["config"]["tokenizer"] = "prose-bpe-2048"
    assert "parity (as `polymixer bench parity` judges)" not in bench.report(payload)
