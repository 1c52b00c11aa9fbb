"""The code style the project keeps (pyproject's ruff rules: pycodestyle errors, pyflakes, 120 columns)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    """Unused imports, undefined names and long lines fail the suite, not a later reader."""
    pytest.importorskip("ruff", reason="ruff is not installed (pip install -e '.[dev]')")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "src",
                           "tests"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
