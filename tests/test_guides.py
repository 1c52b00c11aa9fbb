"""The guides' result tables are what ``python -m polymixer.experiments.guides`` generates from docs/bench's JSON:
a figure typed by hand, or a bench rerun without regenerating, fails here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from polymixer.experiments import guides

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BENCH = DOCS / "bench"


def test_every_generated_table_in_the_guides_is_current():
    stale = guides.update_guides(DOCS, BENCH, check=True)
    assert not stale, f"stale tables (run {guides.COMMAND}): {stale}"


def test_every_registered_table_is_marked_in_exactly_one_guide():
    used = [m.name for g in guides.guides_in(DOCS) for m in guides.find_markers(g.read_text(), g.name)]
    assert sorted(used) == sorted(guides.TABLES), "each name in TABLES is used by exactly one marker in docs/*.md"
    assert set(guides.SOURCES) == set(guides.TABLES)
    for name, files in guides.SOURCES.items():
        assert all((BENCH / f).exists() for f in files), name


def _copy_guide(tmp_path: Path, name: str) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    return Path(shutil.copy(DOCS / name, docs / name))


def test_a_number_edited_by_hand_is_stale_and_the_generator_writes_it_back(tmp_path, capsys):
    guide = _copy_guide(tmp_path, "lm.md")
    original = guide.read_text()
    begin = original.index("<!-- table:lm.throughput")
    table = original[begin:original.index(guides.END, begin)]
    edited = table.replace("|    13.4 |", "|    31.4 |", 1)
    assert edited != table
    guide.write_text(original.replace(table, edited))

    assert guides.update_guides(guide.parent, BENCH, check=True) == [("lm.md", "lm.throughput")]
    assert guide.read_text() != original, "--check rewrites nothing"
    assert guides.main(["--docs", str(guide.parent), "--bench", str(BENCH), "--check"]) == 1
    assert "lm.md: table lm.throughput is stale" in capsys.readouterr().out

    assert guides.main(["--docs", str(guide.parent), "--bench", str(BENCH)]) == 0
    assert guide.read_text() == original
    assert guides.main(["--docs", str(guide.parent), "--bench", str(BENCH), "--check"]) == 0


def test_a_table_follows_its_json(tmp_path):
    """A rerun bench (here one figure of lm.json changed) makes the guide stale until it is regenerated."""
    bench = tmp_path / "bench"
    shutil.copytree(BENCH, bench, ignore=shutil.ignore_patterns("*.png"))
    lm = bench / "lm.json"
    payload = json.loads(lm.read_text())
    payload["throughput"]["rows"][0]["ktok_s"] = 99.5
    lm.write_text(json.dumps(payload))
    guide = _copy_guide(tmp_path, "lm.md")
    assert guides.update_guides(guide.parent, bench, check=True) == [("lm.md", "lm.throughput")]
    guides.update_guides(guide.parent, bench)
    assert "|    99.5 |" in guide.read_text()


def test_an_unknown_table_name_is_a_one_line_error(tmp_path, capsys):
    guide = tmp_path / "docs" / "odd.md"
    guide.parent.mkdir()
    guide.write_text(f"<!-- table:lm.nonesuch (generated from docs/bench/lm.json: {guides.COMMAND}) -->\n"
                     f"| a |\n|---|\n{guides.END}\n")
    with pytest.raises(ValueError, match=r"^odd\.md: unknown table 'lm\.nonesuch'"):
        guides.update_guides(guide.parent, BENCH, check=True)
    assert guides.main(["--docs", str(guide.parent), "--bench", str(BENCH), "--check"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "odd.md" in err and "lm.nonesuch" in err


def test_a_marker_without_its_end_is_an_error(tmp_path):
    guide = tmp_path / "docs" / "open.md"
    guide.parent.mkdir()
    guide.write_text(guides.marker("lm.throughput") + "\n| a |\n")
    with pytest.raises(ValueError, match="open.md: table 'lm.throughput' has no"):
        guides.update_guides(guide.parent, BENCH, check=True)


def test_markdown_table_writes_numbers_as_format_table_does():
    text = guides.markdown_table([[1024, 0.00641, 51054.2, None, ""]], ["a", "b", "c", "d", "e"])
    assert text.splitlines() == ["| a | b | c | d | e |", "|---|---|---|---|---|", "| 1024 | 0.00641 | 51,054 | — | |"]
