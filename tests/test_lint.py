"""The code style the project keeps (pyproject's ruff rules: pycodestyle errors, pyflakes, 120 columns)."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    """Unused imports, undefined names and long lines fail the suite, not a later reader."""
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    done = subprocess.run([ruff, "check", "--no-cache", "--output-format", "concise", "src", "tests"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
