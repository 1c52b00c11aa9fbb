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
