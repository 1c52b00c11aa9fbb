"""The library without the lab: ``pip install polymixer`` (no extras) installs torch, numpy and safetensors, and
PoM, the value PoM, PolyMorpher, a registry model and the transformers integration all work there; the lab's packages
(plots, images, point clouds, edit distances, progress bars, file locks) are the [lab] extra, and a command that needs
a missing one says which extra to install, in one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import tomllib
import venv
from pathlib import Path

import pytest

from polymixer.experiments.extras import EXTRAS

ROOT = Path(__file__).resolve().parents[1]
# the lab's packages by import name: none of them may be needed by `import polymixer` or the library's classes
LAB = ("matplotlib", "sklearn", "scipy", "PIL", "rapidfuzz", "plyfile", "tqdm", "filelock")
# makes the named top-level packages unimportable, as if not installed (`import x` raises ModuleNotFoundError and
# importlib.util.find_spec("x") is None): Python's own meaning of None in sys.modules
BLOCK = "import sys\nfor _n in {names!r}:\n    sys.modules[_n] = None\n"

# what a library user does: the mixers forward and backward, a registry model, pomify, then the transformers
# integration (transformers itself needs tqdm and filelock: they are importable from there on)
LIBRARY_USE = '''
import importlib.util
import sys

import torch
import polymixer
from polymixer import PoM, PolyMorpher, ValuePoM, pomify
from polymixer.models import create_model

torch.manual_seed(0)
x = torch.randn(2, 12, 16, requires_grad=True)
for layer in (PoM(16, degree=2, expand=2), ValuePoM(16, degree=2, expand=2), PolyMorpher(16, mixer="pom")):
    x.grad = None
    y = layer(x, causal=True)
    assert y.shape == x.shape and torch.isfinite(y).all()
    y.square().mean().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert all(p.grad is not None for p in layer.parameters() if p.requires_grad)

toy = dict(n_layer=2, n_embd=32, n_head=2, sel_heads=2, block_size=32)
gpt = create_model("tiny-hybrid", **toy).eval()
ids = torch.randint(0, 256, (1, 6))
logits = gpt(ids)[0]
assert logits.shape[:2] == (1, 6) and torch.isfinite(logits).all()
pomify(create_model("tiny-attention", **toy), "PP")  # attention -> PoM in a trained model

for name in ("tqdm", "filelock"):  # transformers' own dependencies (not the library's): unblocked for it alone
    sys.modules.pop(name, None)
from transformers import AutoModelForCausalLM
from polymixer.hf import to_hf

hf = to_hf(gpt).eval()
assert torch.equal(hf(ids).logits, logits)
out = hf.generate(ids, max_new_tokens=4, do_sample=False)
assert out.shape == (1, 10) and torch.equal(out[:, :6], ids)
hf.save_pretrained(SAVE)
again = AutoModelForCausalLM.from_pretrained(SAVE).eval()
assert torch.equal(again(ids).logits, logits)
present = [n for n in LAB if n not in ("tqdm", "filelock") and importlib.util.find_spec(n) is not None]
assert not present, f"lab packages importable: {present}"
print("library ok")
'''


def _script(tmp_path: Path) -> str:
    return f"LAB = {LAB!r}\nSAVE = {str(tmp_path / 'hf')!r}\n" + LIBRARY_USE


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}


def test_the_library_works_with_none_of_the_labs_packages(tmp_path):
    pytest.importorskip("transformers")
    code = BLOCK.format(names=LAB) + _script(tmp_path)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("library ok")


def test_the_command_line_starts_without_the_labs_packages_and_names_the_extra_a_command_needs(tmp_path):
    (tmp_path / "history.json").write_text('[{"step": 1, "loss": 2.0, "lr": 0.001}]')
    plot = ["plot", str(tmp_path), "--out", str(tmp_path / "curves.png")]
    cli = ("from polymixer.experiments.cli import main\n"
           "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
           f"sys.exit(main({plot!r}))\n")
    done = subprocess.run([sys.executable, "-c", BLOCK.format(names=LAB) + cli], capture_output=True, text=True,
                          env=_env(), timeout=300)
    assert "bench" in done.stdout and done.returncode == 2, done.stderr[-3000:]  # --help, then plot's one line
    assert done.stderr.strip().splitlines() == [
        'polymixer plot: error: this command needs the [lab] extra (matplotlib is not installed): '
        'pip install "polymixer[lab]"'], done.stderr


def test_a_missing_module_that_is_no_extras_is_a_bug_and_still_raises():
    from polymixer.experiments.extras import missing_extra

    assert missing_extra(ModuleNotFoundError("No module named 'polymixer.nothing'", name="polymixer.nothing")) is None
    assert missing_extra(ModuleNotFoundError("No module named 'rapidfuzz'", name="rapidfuzz")) == (
        'this command needs the [lab] extra (rapidfuzz is not installed): pip install "polymixer[lab]"')
    assert missing_extra(ModuleNotFoundError("", name="scipy.ndimage")).startswith("this command needs the [lab]")
    try:  # a library's own ImportError that names the extra, raised from the missing module
        try:
            raise ModuleNotFoundError("No module named 'transformers'", name="transformers")
        except ModuleNotFoundError as e:
            raise ImportError("polymixer.hf needs transformers") from e
    except ImportError as e:
        assert missing_extra(e) == ('this command needs the [hf] extra (transformers is not installed): '
                                    'pip install "polymixer[hf]"')


def test_extras_table_matches_pyproject():
    """Every package of an extra that the CLI names is in that extra of pyproject.toml, and the library's own
    dependencies are torch, numpy and safetensors alone; `dev` includes the lab."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("=")[0].split("[")[0].strip().lower() for d in project["dependencies"]}
    assert names == {"torch", "numpy", "safetensors"}
    extras = project["optional-dependencies"]
    for module, (package, extra) in EXTRAS.items():
        assert any(d.lower().startswith(package.lower()) for d in extras[extra]), (module, package, extra)
    assert any(d.startswith("polymixer[") and "lab" in d[10:].strip("]").split(",") for d in extras["dev"])


def test_the_readmes_commands_install_what_they_run_and_ci_runs_the_second():
    """Command 1 runs a `polymixer` command, so it installs the lab; command 2 runs the tests, so it installs dev
    (the lab and the test tools); .ci/run is command 2 in a fresh .venv."""
    commands = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("python3 -m venv")]
    assert len(commands) == 2
    assert '-e ".[lab]"' in commands[0] and "polymixer bench" in commands[0]
    assert '-e ".[dev]"' in commands[1] and commands[1].endswith("-m pytest")
    assert commands[1] in (ROOT / ".ci" / "run").read_text().splitlines()


@pytest.mark.slow
def test_pip_install_without_extras_in_a_fresh_venv_installs_the_library_alone(tmp_path):
    """The real thing: a fresh virtual environment, torch 2.13.0 first (as the README says), then `pip install .`
    with no extras: none of the lab's packages is installed (tqdm and filelock may come with torch and transformers,
    the library imports neither), and the library works there, transformers (the [hf] extra) installed after."""
    started = time.monotonic()
    venv.create(tmp_path / "venv", with_pip=True)
    py = str(tmp_path / "venv" / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    def run(*args: str) -> str:
        done = subprocess.run([py, *args], capture_output=True, text=True, env={**env, "OMP_NUM_THREADS": "1"},
                              cwd=tmp_path, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    run("-m", "pip", "install", "-q", "torch==2.13.0")
    source = tmp_path / "polymixer"  # a copy: pip's build leaves nothing in the checkout
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    run("-m", "pip", "install", "-q", str(source))
    installed = run("-m", "pip", "list", "--format=freeze")
    print("pip install . gives:", " ".join(sorted(installed.split())))
    absent = [n for n in LAB if n not in ("tqdm", "filelock")]  # torch needs filelock
    run("-c", f"import importlib.util\nassert not [n for n in {absent!r} if importlib.util.find_spec(n)]")
    run("-m", "pip", "install", "-q", "transformers>=5.0")
    assert run("-c", _script(tmp_path)).strip().endswith("library ok")
    print(f"fresh venv: {time.monotonic() - started:.0f} s")
