"""Offline OCR datasets: HTR-VT layout, determinism, disjoint digit pools, fonts, sentences, safe writing."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from polymixer.experiments.ocr import synth as ocr_synth
from polymixer.experiments.ocr.synth import (
    IAM_CHARSET, digit_pools, fonts, render_digit_lines, render_synthetic_lines, sentences,
)

TINY = {"train": 6, "val": 2, "test": 2}
NAME = re.compile(r"^(?P<prefix>[a-z]+)-(?P<page>\d{5})-(?P<line>\d{2})\.png$")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    return render_synthetic_lines(tmp_path_factory.mktemp("syn") / "data", counts=TINY, seed=0, progress=False)


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    return render_digit_lines(tmp_path_factory.mktemp("dig") / "data", counts=TINY, seed=0, progress=False)


def _splits(root: Path) -> dict:
    return {s: (root / f"{s}.ln").read_text(encoding="utf-8").split() for s in ("train", "val", "test")}


def _check_layout(root: Path, prefix: str, height_range: tuple) -> dict:
    splits = _splits(root)
    assert {s: len(v) for s, v in splits.items()} == TINY
    page_splits, page_lines = defaultdict(set), defaultdict(list)
    texts = {}
    for split, names in splits.items():
        for name in names:
            m = NAME.match(name)
            assert m and m["prefix"] == prefix, name
            page_splits[m["page"]].add(split)
            page_lines[m["page"]].append(int(m["line"]))
            png, txt = root / "lines" / name, root / "lines" / name.replace(".png", ".txt")
            assert png.is_file() and txt.is_file(), name
            with Image.open(png) as im:
                assert im.format == "PNG" and im.mode == "L", (name, im.mode)
                a = np.asarray(im)
            assert a.dtype == np.uint8 and height_range[0] <= a.shape[0] <= height_range[1], (name, a.shape)
            border = np.concatenate([a[0], a[-1], a[:, 0], a[:, -1]])
            assert np.median(border) >= 200 and np.median(a) >= 200, name  # white paper ...
            assert a.min() < 128, name  # ... and dark ink
            text = txt.read_text(encoding="utf-8")
            assert text and text == text.strip() and "  " not in text and set(text) <= set(IAM_CHARSET), text
            texts[name] = text
    assert all(len(s) == 1 for s in page_splits.values()), "a page spans two splits"
    assert all(sorted(v) == list(range(len(v))) for v in page_lines.values()), "line numbers not consecutive"
    assert not [p for p in root.parent.iterdir() if p != root], "temporary folder left behind"
    return texts


def _contents(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_synthetic_layout(synthetic):
    texts = _check_layout(synthetic, "syn", (40, 160))
    assert all(len(t) <= 60 for t in texts.values())
    assert sum(len(t.split()) for t in texts.values()) >= 2 * len(texts)  # wrapped prose, not single characters


def test_digit_layout(digits):
    texts = _check_layout(digits, "dig", (64, 64))
    assert all(re.fullmatch(r"[0-9]+( [0-9]+)*", t) for t in texts.values()), texts


def test_synthetic_is_deterministic(synthetic, tmp_path):
    again = render_synthetic_lines(tmp_path / "a", counts=TINY, seed=0, progress=False)
    assert _contents(again) == _contents(synthetic)
    other = render_synthetic_lines(tmp_path / "b", counts=TINY, seed=1, progress=False)
    assert _contents(other) != _contents(synthetic)
    # a page depends only on the seed and its number, not on how many lines the other splits have
    first = render_synthetic_lines(tmp_path / "c", counts={"train": 4}, seed=0, progress=False)
    page0 = {k: v for k, v in _contents(first).items() if k.startswith("lines/syn-00000-")}
    assert len(page0) == 8 and {k: v for k, v in _contents(synthetic).items() if k in page0} == page0


def test_digits_are_deterministic(digits, tmp_path):
    again = render_digit_lines(tmp_path / "a", counts=TINY, seed=0, progress=False)
    assert _contents(again) == _contents(digits)
    other = render_digit_lines(tmp_path / "b", counts=TINY, seed=1, progress=False)
    assert _contents(other) != _contents(digits)


def test_digit_pools_are_disjoint_and_stratified():
    pools = digit_pools(0)
    _, target = ocr_synth._digits()
    sets = {k: set(v.tolist()) for k, v in pools.items()}
    assert not sets["train"] & sets["test"] and not sets["train"] & sets["val"] and not sets["val"] & sets["test"]
    assert set().union(*sets.values()) == set(range(len(target)))
    for split, share in (("train", 0.6), ("val", 0.15), ("test", 0.25)):
        assert abs(len(pools[split]) / len(target) - share) < 0.02
        assert set(target[pools[split]].tolist()) == set(range(10))
    assert all(np.array_equal(pools[k], digit_pools(0)[k]) for k in pools)
    assert not np.array_equal(pools["test"], digit_pools(1)["test"])


def test_fonts_cover_the_charset():
    found = fonts()
    assert found and all(p.suffix == ".ttf" and p.is_file() for p in found)
    names = {p.name for p in found}
    assert "DejaVuSans.ttf" in names
    # symbol fonts whose charmap maps ASCII to other glyphs, one-glyph fallbacks, and glyph-less display fonts
    assert not {n for n in names if n.startswith(("cm", "LastResort", "STIXSiz", "STIXNonUni")) or "Display" in n}
    assert fonts(IAM_CHARSET + "\ue000") == []  # a private-use character no bundled font draws
    assert set(fonts("0123456789")) >= set(found)


def test_sentences_are_prose_in_the_charset():
    found = sentences()
    assert len(found) > 1000 and found == sorted(found) and len(set(found)) == len(found)
    allowed = set(IAM_CHARSET)
    assert all(set(s) <= allowed for s in found)
    assert not [s for s in found if re.search(r"\w\(|==|>>>|_", s)]
    assert sentences("abc") == []


def test_wrap_never_breaks_words_that_fit():
    words = "a quick brown fox jumps over the extraordinarily_long_word dog".split()
    lines = ocr_synth._wrap(words, [12] * 10)
    assert all(len(x) <= 12 for x in lines)
    assert " ".join(lines).replace(" ", "") == "".join(words)
    assert [x for x in lines if x in ("a quick", "brown fox", "jumps over")] == ["a quick", "brown fox", "jumps over"]


def test_existing_root_is_refused(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    with pytest.raises(FileExistsError):
        render_synthetic_lines(root, counts=TINY, progress=False)
    with pytest.raises(FileExistsError):
        render_digit_lines(root, counts=TINY, progress=False)
    assert list(tmp_path.iterdir()) == [root] and not list(root.iterdir())


def test_interrupted_run_leaves_nothing(tmp_path, monkeypatch):
    calls = []

    def failing_save(path, image):
        calls.append(path)
        if len(calls) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(ocr_synth, "_save_png", failing_save)
    with pytest.raises(KeyboardInterrupt):
        render_digit_lines(tmp_path / "data", counts=TINY, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_bad_counts():
    with pytest.raises(ValueError):
        render_digit_lines("/nonexistent/never", counts={"training": 3}, progress=False)
    with pytest.raises(ValueError):
        render_digit_lines("/nonexistent/never", counts={"train": -1}, progress=False)
