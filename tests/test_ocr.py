"""Handwriting recognition: dataset layouts and their errors, charset, pages, augmentations, metrics, the task on
the shared loop (one step, SAM, checkpoint round-trip) and the commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from polymixer.experiments.cli import main as cli
from polymixer.experiments.ocr.data import (
    AugmentConfig, Charset, augment, collate, compose_page, list_split, load_line_image, load_split, page_of,
)
from polymixer.experiments.metrics import error_rates, wer_words
from polymixer.experiments.ocr.task import OCRTask, PageSpec, make_example, evaluate_ocr, load_recognizer, train_ocr
from polymixer.experiments.train.loop import TrainConfig

SMALL = dict(dim=32, heads=2, stem_channels=(8, 16, 32), depth=2, sel_heads=2)
TEXTS = ["the cat", "a dog ran", "Hello, world!", "sat on it", "12 apples", "no (way)", "end.", "go home"]


def _line(text: str, height: int = 40, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    im = Image.new("L", (8 + 7 * len(text), height), 255)
    ImageDraw.Draw(im).text((4, int(rng.integers(2, 10))), text, fill=int(rng.integers(0, 60)))
    return im


def write_dataset(root: Path, pages: Dict[str, List[str]], splits: Dict[str, List[str]], suffix: str = ".png") -> Path:
    """HTR-VT's layout: lines/<page>-<nn>.png + .txt, and <split>.ln listing image names."""
    (root / "lines").mkdir(parents=True)
    names: Dict[str, List[str]] = {}
    k = 0
    for page, texts in pages.items():
        names[page] = []
        for i, text in enumerate(texts):
            name = f"{page}-{i:02d}"
            _line(text, seed=k).save(root / "lines" / f"{name}{suffix}")
            (root / "lines" / f"{name}.txt").write_text(text + "\n")
            names[page].append(name + suffix)
            k += 1
    for split, split_pages in splits.items():
        (root / f"{split}.ln").write_text("\n".join(n for p in split_pages for n in names[p]) + "\n")
    return root


@pytest.fixture
def dataset(tmp_path):
    pages = {f"p{j:02d}": TEXTS[(j % 4) * 2:(j % 4) * 2 + 2] + TEXTS[j % 3:j % 3 + 1] for j in range(6)}
    return write_dataset(tmp_path / "data", pages, {"train": ["p00", "p01", "p02", "p03"], "val": ["p04"],
                                                    "test": ["p05"]})


# -- layouts --------------------------------------------------------------------------------------------------------


def test_htr_vt_layout(dataset):
    recs = list_split(dataset, "train")
    assert len(recs) == 12 and recs[0].name == "p00-00" and recs[0].page == "p00" and recs[0].line == 0
    assert recs[0].text == TEXTS[0]
    lines = load_split(dataset, "train", height=32, max_width=512)
    assert all(im.shape[0] == 32 and im.dtype == np.uint8 for im in lines.images)
    # names listed without their extension resolve too
    (dataset / "val.ln").write_text("p04-00\np04-01\n")
    assert [r.name for r in list_split(dataset, "val")] == ["p04-00", "p04-01"]


def test_iam_distribution_layout(tmp_path):
    root = tmp_path / "iam"
    rows = ["#--- lines.txt ---", "a01-000u-00 ok 154 19 408 746 1661 89 A|MOVE|to|stop",
            "a01-000u-01 ok 156 19 395 932 1850 105 Mr.|Gaitskell|from"]
    for row in rows[1:]:
        name = row.split()[0]
        folder = root / "lines" / "a01" / "a01-000u"
        folder.mkdir(parents=True, exist_ok=True)
        _line(name).save(folder / f"{name}.png")
    (root / "lines.txt").write_text("\n".join(rows) + "\n")
    (root / "trainset.txt").write_text("a01-000u-00\na01-000u-01\n")
    recs = list_split(root, "train")
    assert [r.text for r in recs] == ["A MOVE to stop", "Mr. Gaitskell from"]
    assert recs[1].page == "a01-000u" and recs[1].line == 1
    (root / "test.ln").write_text("a01-000u-01.png\n")  # a split list beside lines.txt wins
    assert [r.name for r in list_split(root, "test")] == ["a01-000u-01"]
    with pytest.raises(FileNotFoundError, match="validationset1.txt"):
        list_split(root, "val")


def test_bad_inputs_name_the_file(dataset):
    lines = dataset / "lines"
    (lines / "p00-01.txt").unlink()
    with pytest.raises(ValueError, match="missing transcription .*p00-01.txt"):
        list_split(dataset, "train")
    (lines / "p00-01.txt").write_text("  \n ")
    with pytest.raises(ValueError, match="empty transcription .*p00-01.txt"):
        list_split(dataset, "train")
    (lines / "p00-01.txt").write_text("ok")
    (lines / "p00-02.png").write_bytes(b"not an image")
    with pytest.raises(ValueError, match="cannot read image .*p00-02.png"):
        load_split(dataset, "train", 32, 512)
    (dataset / "test.ln").write_text("p05-00.png\nghost-07.png\n")
    with pytest.raises(FileNotFoundError, match="test.ln names ghost-07.png"):
        list_split(dataset, "test")
    Image.new("L", (3, 200), 255).save(lines / "thin.png")
    with pytest.raises(ValueError, match="thin.png .*too narrow for one token"):
        load_line_image(lines / "thin.png", 32, 512)
    with pytest.raises(FileNotFoundError, match="split list .*nope.ln"):
        list_split(dataset, "nope")
    with pytest.raises(FileNotFoundError, match="not a line dataset"):
        list_split(dataset / "lines", "train")


def test_resize_keeps_aspect_and_caps_width(tmp_path):
    Image.new("L", (400, 100), 255).save(tmp_path / "a.png")
    assert load_line_image(tmp_path / "a.png", 32, 512).shape == (32, 128)
    assert load_line_image(tmp_path / "a.png", 64, 200).shape == (64, 200)  # squeezed like HTR-VT
    Image.new("RGB", (50, 25), (255, 0, 0)).save(tmp_path / "b.jpg")
    assert load_line_image(tmp_path / "b.jpg", 32, None).shape == (32, 64)


# -- charset, pages, augmentations ----------------------------------------------------------------------------------


def test_charset():
    cs = Charset.from_texts(["ba", "ca b"])
    assert cs.chars == " abc" and cs.num_classes == 5
    assert cs.encode("cab") == [4, 2, 3] and cs.decode([4, 2, 3]) == "cab"
    assert cs.encode("caz!") == [4, 2] and cs.unknown("caz!") == 2  # unknown characters are dropped, counted
    with pytest.raises(ValueError, match="repeated"):
        Charset("aab")


def test_pages_and_multiline_examples(dataset):
    lines = load_split(dataset, "train", 32, 512)
    pages = lines.pages(max_lines=16)
    assert [[lines.records[i].name for i in p] for p in pages][0] == ["p00-00", "p00-01", "p00-02"]
    assert len(lines.pages(max_lines=2)) == 8  # pages of 3 lines → chunks of 2 + 1
    assert page_of("002_02_00") == ("002_02", 0) and page_of("train_7") == ("train", 7) and page_of("x") == (None, None)
    spec = PageSpec(multiline=True, gap=5)
    image, text = make_example(lines, pages[0], spec)
    parts = [lines.images[i] for i in pages[0]]
    assert text == " ".join(lines.records[i].text for i in pages[0])
    assert image.shape == (32, sum(p.shape[1] for p in parts) + 2 * 5)
    np.testing.assert_array_equal(image[:, :parts[0].shape[1]], parts[0])
    assert (image[:, parts[0].shape[1]:parts[0].shape[1] + 5] == 255).all()
    np.testing.assert_array_equal(image[:, -parts[2].shape[1]:], parts[2])
    np.testing.assert_array_equal(compose_page(parts[:1], 9), parts[0])


def test_augment_keeps_shape_and_is_seeded():
    rng = np.random.default_rng(0)
    img = np.full((32, 100), 255, np.uint8)
    img[10:20, 20:80] = 0
    outs = [augment(img, np.random.default_rng(s), AugmentConfig(p=1.0)) for s in (1, 1, 2)]
    assert all(o.shape == img.shape and o.dtype == np.uint8 for o in outs)
    np.testing.assert_array_equal(outs[0], outs[1])
    assert not np.array_equal(outs[0], outs[2]) and not np.array_equal(outs[0], img)
    np.testing.assert_array_equal(augment(img, rng, AugmentConfig(p=0.0)), img)


def test_collate_pads_white():
    x, w = collate([np.zeros((4, 3), np.uint8), np.zeros((4, 5), np.uint8)])
    assert x.shape == (2, 1, 4, 5) and w.tolist() == [3, 5]
    assert (x[0, 0, :, 3:] == 1).all() and (x[0, 0, :, :3] == 0).all()


# -- metrics --------------------------------------------------------------------------------------------------------


def test_cer_wer_known_strings():
    assert wer_words("Hello, world!  It's (fine).") == ["Hello", ",", "world", "!", "It", "'", "s", "(", "fine", ")",
                                                         "."]
    r = error_rates(["kitten sat", "the end."], ["sitting sat", "the end"])
    assert r.char_errors == 3 + 1 and r.chars == len("sitting sat") + len("the end")
    assert r.word_errors == 1 + 1 and r.words == 2 + 2  # "end." is two words under HTR-VT's rule: one insertion
    assert r.cer == pytest.approx(4 / 18) and r.wer == pytest.approx(0.5)
    assert error_rates([""], ["ab cd"]).wer == 1.0 and error_rates(["ab cd"], ["ab cd"]).cer == 0.0
    with pytest.raises(ValueError):
        error_rates(["a"], [])


# -- the task on the shared loop ------------------------------------------------------------------------------------


def _tcfg(tmp_path, **kw) -> TrainConfig:
    base = dict(steps=2, batch_size=4, lr=3e-3, warmup=1, eval_every=2, ckpt_every=2, out=str(tmp_path / "run"),
                progress=False, weight_decay=0.5, beta2=0.99, grad_clip=0.0)
    return TrainConfig(**{**base, **kw})


@pytest.mark.parametrize("multiline", [False, True])
def test_batches_are_a_pure_function_of_step_and_shard(dataset, multiline):
    lines = load_split(dataset, "train", 32, 512)
    cs = Charset.from_texts(lines.texts)
    task = OCRTask(lines, lines, cs, 4, seed=3, spec=PageSpec(multiline=multiline), aug=AugmentConfig())
    a, b = task.batch(5, 0, 1, torch.device("cpu")), task.batch(5, 0, 1, torch.device("cpu"))
    assert torch.equal(a["images"], b["images"]) and torch.equal(a["targets"], b["targets"])
    halves = [task.batch(5, s, 2, torch.device("cpu")) for s in (0, 1)]
    assert halves[0]["lines"] + halves[1]["lines"] == a["lines"]
    assert torch.equal(torch.cat([h["target_lengths"] for h in halves]), a["target_lengths"])
    if multiline:
        assert a["lines"] > 4  # pages hold several lines


def test_width_buckets(dataset):
    lines = load_split(dataset, "train", 32, 512)
    task = OCRTask(lines, lines, Charset.from_texts(lines.texts), 2, seed=0, bucket=1)
    ranks = {int(i): r for r, i in enumerate(np.argsort([im.shape[1] for im in lines.images], kind="stable"))}
    for step in range(20):
        g = np.random.default_rng([0, step])
        start = int(g.integers(0, len(lines) - 2 + 1))
        picks = task.by_width[start + g.integers(0, 2, 2)]
        assert max(ranks[int(i)] for i in picks) - min(ranks[int(i)] for i in picks) <= 1
        b = task.batch(step, 0, 1, torch.device("cpu"))
        assert sorted(b["widths"].tolist()) == sorted(lines.images[int(i)].shape[1] for i in picks)


def test_one_step_lowers_the_loss(dataset):
    torch.manual_seed(0)
    lines = load_split(dataset, "train", 32, 512)
    cs = Charset.from_texts(lines.texts)
    from polymixer.models import create_model

    model = create_model("tiny-htr-vpom-hybrid", num_classes=cs.num_classes, **SMALL)
    task = OCRTask(lines, lines, cs, 8, seed=0)
    batch = task.batch(0, 0, 1, torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    first = task.loss(model, batch)
    for _ in range(3):
        opt.zero_grad()
        task.loss(model, batch).backward()
        opt.step()
    assert task.loss(model, batch) < first


def test_sam_takes_the_gradient_at_the_climbed_point():
    """SAM on f(w) = ½ Σ a_i w_i²: the step must use ∇f(w + ρ g/‖g‖) — checked against the closed form."""
    from polymixer.experiments.train.loop import train

    class Quad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))

    class T:
        unit = "x"
        a = torch.tensor([1.0, 3.0, 0.5])

        def batch(self, step, share, shares, device):
            return None

        def count(self, batch):
            return 1

        def loss(self, model, batch):
            return 0.5 * (self.a * model.w ** 2).sum()

        def evaluate(self, model, step, out_dir):
            return {}

    import tempfile

    rho, lr = 0.1, 0.5
    model = Quad()
    w0 = model.w.detach().clone()
    with tempfile.TemporaryDirectory() as d:
        cfg = TrainConfig(steps=1, batch_size=1, lr=lr, min_lr=lr, warmup=0, weight_decay=0.0, grad_clip=0.0,
                          sam_rho=rho, out=d, progress=False, beta1=0.0, beta2=0.0)
        train(model, T(), cfg, {"family": "none", "model": {}})
    g = T.a * w0
    g_sam = T.a * (w0 + rho * g / g.norm())
    # AdamW with β1 = β2 = 0 moves each weight by lr · g / (|g| + eps): the sign of the SAM gradient
    expected = w0 - lr * g_sam / (g_sam.abs() + 1e-8)
    torch.testing.assert_close(model.w.detach(), expected)


def test_train_checkpoint_charset_round_trip_and_commands(dataset, tmp_path, capsys):
    torch.manual_seed(0)
    res = train_ocr("tiny-htr-vpom", _tcfg(tmp_path, sam_rho=0.05, ema=0.9), str(dataset), progress=False, **SMALL)
    assert {"loss", "cer", "wer"} <= set(res["metrics"])
    run = tmp_path / "run"
    model, charset, cfg = load_recognizer(run)
    assert charset == res["charset"] and charset.chars == Charset.from_texts(load_split(dataset, "train", 32, 512)
                                                                             .texts).chars
    assert model.config.num_classes == charset.num_classes and not model.training
    # evaluation counts a character the charset cannot write as an error, never a crash
    test = load_split(dataset, "test", 32, 512)
    test.records[0] = test.records[0].__class__(**{**test.records[0].__dict__, "text": test.records[0].text + "§"})
    m = evaluate_ocr(model, test, charset)
    assert m["unknown_chars"] == 1 and m["chars"] == sum(len(t) for t in test.texts) and 0 <= m["cer"]
    # the commands
    capsys.readouterr()
    assert cli(["eval", "ocr", "--ckpt", str(run), "--samples", "2", "--png", str(tmp_path / "s.png"),
                "--json", str(tmp_path / "m.json")]) == 0
    out = json.loads(capsys.readouterr().out.split("wrote")[0])
    assert out["split"] == "test" and 0 <= out["cer"] and out["lines"] == 3
    assert (tmp_path / "s.png").stat().st_size > 1000
    img = dataset / "lines" / "p05-00.png"
    assert cli(["read", "--ckpt", str(run), str(img), str(img)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 2 and printed[0].startswith(str(img) + "\t") and printed[0] == printed[1]
    # resume refuses data with another charset
    (dataset / "lines" / "p00-00.txt").write_text("zzz Q")
    with pytest.raises(ValueError, match="charset"):
        train_ocr("tiny-htr-vpom", _tcfg(tmp_path, steps=3), str(dataset), progress=False, **SMALL)


def test_multiline_training_and_cli_errors(dataset, tmp_path, capsys):
    res = train_ocr("tiny-htr-vt", _tcfg(tmp_path, steps=1), str(dataset), PageSpec(multiline=True, max_lines=3),
                    progress=False, **SMALL)
    assert res["metrics"]["cer"] >= 0
    cfg = json.loads((tmp_path / "run" / "checkpoints" / "latest").read_text() and
                     (tmp_path / "run" / "checkpoints" / "step_00000001" / "config.json").read_text())
    assert cfg["pages"]["multiline"] is True and cfg["family"] == "ocr"
    assert cli(["read", "--ckpt", str(tmp_path / "nothing"), "x.png"]) == 2
    assert "does not exist" in capsys.readouterr().err
