"""Every Python example in the README and the family guides (docs/*.md) runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_python_blocks_run(page):
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    if page.name == "README.md":
        assert blocks, "the README shows the API with examples"
    for code in blocks:
        if re.search(r"^\s*(from|import) transformers", code, flags=re.M):
            pytest.importorskip("transformers")  # the [hf] extra's examples
        exec(compile(code, str(page), "exec"), {})


def test_links_to_local_files_resolve():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#]+)\)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_the_readme_family_table_is_generated_from_the_parity_json(tmp_path):
    """The family table is what `python -m polymixer.experiments.bench.readme` writes from docs/bench/parity.json:
    a hand edit or a parity rerun without regenerating fails here; the generator itself rewrites a stale table."""
    from polymixer.experiments.bench import readme

    parity = ROOT / "docs" / "bench" / "parity.json"
    assert readme.update_readme(ROOT / "README.md", parity, check=True), \
        "README.md's family table is stale: run python -m polymixer.experiments.bench.readme"
    stale = tmp_path / "README.md"
    stale.write_text((ROOT / "README.md").read_text().replace("(lower is better)", "(lower)", 1))
    assert not readme.update_readme(stale, parity, check=True)
    assert not readme.update_readme(stale, parity) and readme.update_readme(stale, parity, check=True)
    assert stale.read_text() == (ROOT / "README.md").read_text()


def test_the_readme_is_short_and_its_cells_readable():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200, "the README stays under 200 lines"
    for page in PAGES:
        for line in page.read_text().splitlines():
            if line.startswith("|") and not set(line) <= set("|-: "):
                long = [c.strip() for c in line.strip("|").split(" | ") if len(c.strip()) > 160]
                assert not long, f"{page.name}: a table cell over 160 characters: {long[0][:80]}…"


def test_guides_are_short_and_say_nothing_of_how_the_project_was_worked_on():
    """Guides say what a user can do, how, what it costs and how good it is; the history of the work is in git."""
    history = re.compile(r"\b(session \d+|earlier session|previous session|this session|we tried|an earlier attempt|"
                         r"used to be|was fixed|landed in|commit [0-9a-f]{7})\b", re.I)
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text()
        assert len(text.splitlines()) <= 300, f"{page.name} is over 300 lines"
        hits = [m.group(0) for m in history.finditer(text)]
        assert not hits, f"{page.name} narrates the work: {hits[:3]}"
