"""A family from another package: a toy family written under a temporary folder (its models, its task, its
comparison, its fault recipe, its guide table and its README cell, one registration found through its entry point)
is trained, evaluated, judged by ``bench parity``, shown in the README's table and a guide, and put through ``bench
faults`` by the command line, in processes of their own, without a file of the repository edited."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List

import pytest

import polymixer

SRC = Path(polymixer.__file__).resolve().parents[1]

MODEL = '''
"""The toy family's models: a linear regressor, registered under the family the package adds to the table."""
from dataclasses import dataclass

from torch import nn

from polymixer.families import Family, add_family
from polymixer.models import register_model

TOY = add_family(Family("toy", "a toy regressor", "tiny-toy", aliases=("toy-earlier",)))


@dataclass
class ToyConfig:
    width: int = 4


class Toy(nn.Module):
    def __init__(self, config: ToyConfig) -> None:
        super().__init__()
        self.config = config
        self.net = nn.Linear(config.width, 1)

    def forward(self, x):
        return self.net(x)


register_model("tiny-toy", "toy", ToyConfig, Toy, "a linear regressor", width=4)
'''

TASK = '''
"""The toy family's commands: train (the shared loop, through this module's global ``train``) and eval."""
import json

import torch

from polymixer.checkpoint import load_model
from polymixer.experiments.tasks.common import add_preset_argument
from polymixer.experiments.train.loop import (TRAIN_FLAGS, TrainConfig, add_train_config_arguments, train,
                                              train_config_from_args)
from polymixer.models import create_model, preset_of

DEFAULTS = TrainConfig(steps=20, batch_size=8, lr=1e-2, warmup=0, curves=False)


def examples(seed, n=8):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return x, x.sum(1, keepdim=True)


def mse(model):
    x, y = examples(10_000, 64)
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), y))


class ToyTask:
    unit = "ex"

    def batch(self, step, share, shares, device):
        x, y = examples(step)
        n = len(x) // shares
        return x[share * n:(share + 1) * n].to(device), y[share * n:(share + 1) * n].to(device)

    def count(self, batch):
        return len(batch[0])

    def loss(self, model, batch):
        return torch.nn.functional.mse_loss(model(batch[0]), batch[1])

    def evaluate(self, model, step, out_dir):
        return {"mse": mse(model)}


def add_train_arguments(p):
    add_preset_argument(p, "toy")
    add_train_config_arguments(p, DEFAULTS, "run folder (default: runs/toy)", TRAIN_FLAGS)


def main_train(args):
    preset = preset_of("toy", args.preset)  # another family's preset: one line
    cfg = train_config_from_args(args, DEFAULTS, "runs/toy")
    torch.manual_seed(cfg.seed)
    model = create_model(preset)
    result = train(model, ToyTask(), cfg, {"family": "toy", "preset": preset, "model": vars(model.config)})
    print(json.dumps({"run": cfg.out, **result["metrics"]}))
    return 0


def add_eval_arguments(p):
    p.add_argument("--ckpt", required=True)


def main_eval(args):
    print(json.dumps({"mse": mse(load_model(args.ckpt, family="toy").eval())}))
    return 0
'''

FAMILY = '''
"""The toy family's registration: the one object the lab finds through the package's entry point."""
from polymixer.experiments.bench.comparison import Comparison
from polymixer.experiments.guides import bench_json, markdown_table
from polymixer.experiments.registry import Command, FaultRecipe, LabFamily, Table

from .model import TOY


def quality(bench):
    rows = bench_json(bench, "toy.json")["quality"]["rows"]
    return markdown_table([[r["spec"], r["lr"], r["mse"]] for r in rows], ["model", "rate", "mse"])


FAMILY = LabFamily(
    TOY,
    commands={
        ("train", "toy"): Command("train a toy regressor", "toy_family.task:train", "Train the toy."),
        ("eval", "toy"): Command("the toy's mean squared error", "toy_family.task:eval", "Evaluate the toy."),
    },
    comparisons=(Comparison("toy regression", "toy", "val mse", "mse", False, "relative", "toy-attention",
                            "toy-pom", None, best_target=0.05, guide="docs/toy.md", trained_on="random sums",
                            paper=(("the toy paper's mse",), {"toy-attention": (1.0,), "toy-pom": (1.02,)}),
                            digits=3),),
    faults=FaultRecipe(("--batch-size", "8")),
    tables={"toy.quality": Table(quality, ("toy.json",))},
)
'''


def _toy_package(root: Path, entry: str = "toy = toy_family.family:FAMILY") -> Path:
    """The toy family's package under ``root``, installed the way pip leaves one: a folder and a dist-info with its
    entry point."""
    pkg = root / "toy_family"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""A toy family of polymixer\'s lab, from another package."""\n')
    for name, text in (("model", MODEL), ("task", TASK), ("family", FAMILY)):
        (pkg / f"{name}.py").write_text(textwrap.dedent(text).lstrip())
    info = root / "toy_family-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-family\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[polymixer.families]\n{entry}\n")
    return root


def _python(root: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python args…`` in a process whose path holds the toy's package (as an installed one is) and this source."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(SRC), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=root)


def _polymixer(root: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return _python(root, "-m", "polymixer", *args, timeout=timeout)


def _repository_files() -> Dict[str, int]:
    """Every file of the package and the docs with its modification time: what the test must leave alone."""
    top = SRC.parent
    return {str(p): p.stat().st_mtime_ns for folder in (SRC / "polymixer", top / "docs") if folder.is_dir()
            for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def _cells(table: str, model: str) -> List[str]:
    """The cells of the table's row whose second cell is ``model``."""
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in table.splitlines() if line.startswith("|")]
    return next(r for r in rows if len(r) > 1 and r[1] == model)


def _rows(metric: List[float], names=("toy-attention", "toy-pom")) -> List[dict]:
    return [{"spec": n, "lr": 0.01, "mse": m, "best_lr": True, "rates": 1} for n, m in zip(names, metric)]


def test_a_family_of_another_package_trains_evaluates_and_is_judged_through_its_registration(tmp_path):
    before = _repository_files()
    root = _toy_package(tmp_path / "site")
    res = _polymixer(root, "train", "toy", "--steps", "6", "--out", str(tmp_path / "run"), "--quiet")
    assert res.returncode == 0, res.stderr
    trained = json.loads(res.stdout.strip().splitlines()[-1])
    assert trained["run"] == str(tmp_path / "run") and trained["mse"] >= 0
    res = _polymixer(root, "eval", "toy-earlier", "--ckpt", str(tmp_path / "run"))  # an earlier name: the same noun
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1])["mse"] == pytest.approx(trained["mse"])
    res = _polymixer(root, "train", "toy", "--preset", "tiny-pom", "--steps", "1", "--out", str(tmp_path / "no"))
    assert res.returncode == 2 and res.stderr.strip().endswith(
        "tiny-pom is a language model (family lm); `polymixer train toy` takes: tiny-toy"), res.stderr

    # bench parity judges it beside the built-in families (their JSON absent here), the README's table and a guide
    # show it
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "toy.json").write_text(json.dumps({"config": {"seed": 0, "lr": 0.01},
                                                "quality": {"rows": _rows([1.0, 1.04])}}))
    res = _polymixer(root, "bench", "parity", "--out", str(bench))
    assert res.returncode == 0, res.stderr
    toy = next(f for f in json.loads((bench / "parity.json").read_text())["families"] if f["bench"] == "toy")
    assert toy["found"] and toy["pom"]["gap"] == pytest.approx(0.04)
    assert [t["what"] for t in toy["targets"]] == ["best without full attention within +5.0%"]
    assert toy["targets"][0]["reads"] == "met"  # one seed: no interval, so the verdict is unsettled
    assert toy["targets"][0]["verdict"].startswith("unsettled: 1 paired seed (an interval needs 2)")
    pom = _cells((bench / "parity.txt").read_text(), "toy-pom (PoM)")  # its decimals, its gap, the paper's figure
    assert pom[:5] == ["toy regression", "toy-pom (PoM)", "val mse ↓", "1.040 (1 seed)", "+4.0% (1 seed)"]
    assert pom[7] == "1.02, +2.0% (the toy paper's mse)"
    readme = tmp_path / "README.md"
    readme.write_text("# toy\n<!-- families:begin (generated by python -m polymixer.experiments.bench.readme from "
                      "docs/bench/parity.json) -->\n<!-- families:end -->\n")
    res = _python(root, "-m", "polymixer.experiments.bench.readme", "--readme", str(readme), "--parity",
                  str(bench / "parity.json"))
    assert res.returncode == 0, res.stderr
    assert "| toy regression — random sums | val mse (lower is better) | `toy-attention` 1.000" in readme.read_text()
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "toy.md").write_text("# Toy\n\n<!-- table:toy.quality (generated from docs/bench/toy.json: python -m "
                                 "polymixer.experiments.guides) -->\n<!-- /table -->\n")
    res = _python(root, "-m", "polymixer.experiments.guides", "--docs", str(docs), "--bench", str(bench))
    assert res.returncode == 0 and "toy.md: table toy.quality rewritten" in res.stdout, res.stderr
    assert "| toy-pom | 0.01 | 1.04 |" in (docs / "toy.md").read_text()
    assert _repository_files() == before


def test_bench_faults_kills_and_resumes_a_family_of_another_package(tmp_path):
    """The fault bench trains the toy with its recipe through the probe, which wraps the toy's own train command:
    killed (once inside a checkpoint write), stopped by SIGTERM, its newest checkpoint truncated, a NaN loss —
    every fault survived and the final weights identical to the uninterrupted run's."""
    root = _toy_package(tmp_path / "site")
    res = _polymixer(root, "bench", "faults", "--families", "toy", "--steps", "4", "--ckpt-every", "1", "--kills",
                     "1", "--write-kills", "1", "--out", str(tmp_path / "faults"), timeout=900)
    assert res.returncode == 0, res.stderr
    payload = json.loads((tmp_path / "faults" / "faults.json").read_text())
    rows = {r["row"]: r for r in payload["families"]["toy"]["rows"]}
    assert set(rows) == {"sigkill", "sigterm", "truncated", "nan"}
    assert all(r["survived"] == r["injected"] >= 1 and r["identical"] for r in rows.values()), rows
    assert rows["sigkill"]["events"][0]["moment"].startswith("writing checkpoint")
    assert "target (every row survived, final weights identical): met" in res.stdout


def test_an_entry_point_that_names_no_registration_is_one_clear_error(tmp_path):
    root = _toy_package(tmp_path / "site", entry="toy = toy_family.model:TOY")
    res = _polymixer(root, "--help", timeout=300)
    assert res.returncode != 0
    assert res.stderr.strip().splitlines()[-1].endswith(
        "toy_family.model:TOY (entry point 'toy' of polymixer.families) is a Family, not a "
        "polymixer.experiments.registry.LabFamily"), res.stderr
