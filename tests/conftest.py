"""Shared helpers: the device the tests run on, random mixers with non-trivial coefficients and the float64 oracle.

``POLYMIXER_TEST_DEVICE=cuda python -m pytest`` runs the device-aware tests on a GPU; by default they run on the CPU,
and the Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set here before Triton is imported).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

DEVICE = os.environ.get("POLYMIXER_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from polymixer import PoM
from polymixer import functional as Fn
from polymixer.reference import reference_pom

if os.environ.get("PYTEST_XDIST_WORKER"):
    # the suite runs as one worker per core (pyproject's `-n 2`): one thread each (and each process a test starts),
    # or the workers fight for the cores
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The device of the device-aware tests: ``POLYMIXER_TEST_DEVICE`` (default cpu)."""
    dev = torch.device(DEVICE)
    if dev.type == "cuda" and not torch.cuda.is_available():
        pytest.exit("POLYMIXER_TEST_DEVICE=cuda but no CUDA device is available", returncode=2)
    return dev


@pytest.fixture(scope="session")
def traced_kernels(device: torch.device) -> None:
    """Skips a test that runs the Triton kernels, which always go through ``torch.library.wrap_triton`` (they are
    custom ops), on a CPU whose torch refuses Triton's interpreted kernels there (torch 2.11 does: "wrap_triton only
    works on functions annotated with triton.jit"; torch 2.13 takes them; on a GPU they are compiled, never refused).
    """
    if device.type == "cpu":
        triton = pytest.importorskip("triton")

        @triton.jit
        def probe(x_ptr):  # noqa: ANN001 - a Triton kernel's pointer
            pass

        try:
            torch.library.wrap_triton(probe)
        except RuntimeError as e:
            pytest.skip(f"torch {torch.__version__} cannot trace Triton's interpreted kernels: {e}")


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """A small text corpus (Python-like lines) for language-model training tests."""
    import random

    d = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    words = ["def", "return", "self", "import", "class", "for", "in", "if", "else", "None", "x", "y", "(", ")", ":"]
    for i in range(12):
        (d / f"doc{i}.py").write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(40)))
    return d


@pytest.fixture
def polymixer_cache(tmp_path, monkeypatch):
    """Tokenised corpora go to the test's own folder."""
    monkeypatch.setenv("POLYMIXER_CACHE", str(tmp_path / "cache"))


@pytest.fixture(params=[True, False], ids=["fused", "modular"])
def fused(request):
    """Run a test on both the fused CPU path and the modular path."""
    with Fn.fused_kernels(request.param):
        yield request.param


def random_pom(dim: int = 8, degree: int = 3, expand: float = 2, dtype=torch.float64, bias: bool = True,
               **kw) -> PoM:
    """A PoM whose coefficients and gate bias are O(1), so that every term of the polynomial matters."""
    m = PoM(dim, degree=degree, expand=expand, bias=bias, **kw).to(dtype)
    with torch.no_grad():
        m.coeff.uniform_(-1.0, 1.0)
        m.gate_bias.normal_()
    return m


def oracle(m: PoM, x: torch.Tensor, vis: torch.Tensor, context: Optional[torch.Tensor] = None,
           positions=None, context_positions=None) -> torch.Tensor:
    weights = type(m.weights)(*(None if t is None else t.detach() for t in m.weights))
    return reference_pom(x, weights, context, vis=vis, activation=m.activation, gate=m.gate, reduction=m.reduction,
                         rope=m.rope, rope_base=m.rope_base, positions=positions, context_positions=context_positions)


class ToyRegression:
    """The training loop's smallest task: 8 random (x, y) pairs of a linear regression per step (split over the
    data-parallel shares); its evaluation reports two figures of the model (``mse`` on a fixed input, ``norm`` of the
    weights). ``fail_at``: the step whose evaluation raises; ``evaluated``: the steps evaluated so far."""

    unit = "ex"

    def __init__(self, fail_at: Optional[int] = None) -> None:
        self.fail_at, self.evaluated = fail_at, []

    def batch(self, step, share, shares, device):
        g = torch.Generator().manual_seed(step * 100 + share)
        return torch.randn(8 // shares, 4, generator=g), torch.randn(8 // shares, 1, generator=g)

    def count(self, batch):
        return batch[0].shape[0]

    def loss(self, model, batch):
        return torch.nn.functional.mse_loss(model(batch[0]), batch[1])

    def evaluate(self, model, step, out_dir):
        self.evaluated.append(step)
        if step == self.fail_at:
            raise RuntimeError(f"evaluation of step {step} failed")
        with torch.no_grad():
            x = torch.linspace(-1, 1, 32).view(8, 4)
            return {"mse": float(model(x).square().mean()),
                    "norm": float(sum(p.square().sum() for p in model.parameters()))}


def assert_close(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-10, atol: float = 1e-10) -> None:
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.isfinite(a).all(), "non-finite values"
    torch.testing.assert_close(a.to(b.dtype), b, rtol=rtol, atol=atol)


# Put before every torchrun script: ``report(result)`` writes this rank's results (JSON) where ``rank_results`` reads
# them back (the folder the test gave ``torchrun``).
_REPORT = """import json as _json, os as _os


def report(result):
    \"\"\"This rank's results, to rank{RANK}.json in the test's folder (conftest.rank_results reads them).\"\"\"
    rank = _os.environ.get("RANK", "0")
    with open(_os.path.join(_os.environ["POLYMIXER_TEST_RESULTS"], f"rank{rank}.json"), "w") as f:
        _json.dump(result, f)


"""

# Appended to every torchrun script: it leaves its process group if it did not (the lab's training loop leaves it
# joined), then exits without the interpreter's teardown. In an FSDP2 script torch 2.13 keeps the default group past
# destroy_process_group (in DeviceMesh._pg_registry, even after the script dropped its model), and a gloo worker
# thread of a group still alive at the teardown, releasing the last transfer, can abort a finished rank (SIGABRT,
# "terminate called without an active exception"). polymixer's own objects keep no group: test_context_parallel
# runs a user's script as written, without this. A script that raises never gets here and keeps its error status.
_LEAVE = """
import os as _os, sys as _sys
_dist = _sys.modules.get("torch.distributed")
if _dist is not None and _dist.is_available() and _dist.is_initialized():
    _dist.destroy_process_group()  # (no barrier: a rank that raised is not waited for)
_sys.stdout.flush()
_sys.stderr.flush()
_os._exit(0)
"""


def torchrun(script_text: str, args: Sequence, tmp: Path, procs: int, env: Optional[Dict[str, str]] = None,
             status: int = 0, name: str = "script.py", timeout: int = 600, launch: Sequence[str] = (),
             as_written: bool = False) -> subprocess.CompletedProcess:
    """Writes ``script_text`` to ``tmp / name`` and runs it on ``procs`` CPU processes under torchrun (a free port, one
    thread each), or as one plain process where ``procs`` is 1; asserts the exit status (stderr's tail on failure).
    The one launcher of the multi-process tests (context parallelism, DDP, FSDP2, sharded checkpoints, collectives).

    The script may call ``report(result)`` (its rank's results, read back by :func:`rank_results` from ``tmp``); it
    ends as ``_LEAVE`` says. ``launch``: more torchrun options (``--log-dir`` …). ``as_written``: the script exactly
    as given (no ``report``, nothing appended: a user's own script, through the interpreter's teardown)."""
    from polymixer.experiments.bench.parallel import free_port

    script = tmp / name
    script.write_text(script_text if as_written else _REPORT + script_text + _LEAVE)
    run = [sys.executable] if procs == 1 else [sys.executable, "-m", "torch.distributed.run",
                                               f"--nproc-per-node={procs}", f"--master-port={free_port()}", *launch]
    res = subprocess.run(run + [str(script)] + [str(a) for a in args], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "POLYMIXER_TEST_RESULTS": str(tmp),
                              **(env or {})}, timeout=timeout)
    assert res.returncode == status, res.stderr[-4000:]
    return res


def rank_results(folder: Path, world: int) -> List[dict]:
    """The ``rank{r}.json`` each of ``world`` processes wrote to ``folder``, in rank order."""
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world)]
