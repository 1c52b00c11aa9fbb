"""The GPU check: the kernel harness (with fake kernel modules), the check's summary, docs/gpu.md's section
generated from a check's folder, the layer bench's configurations, and ``scripts/gpu-check --dry-run`` (slow)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from polymixer.experiments.bench import gpu
from polymixer.experiments.bench.mixer import MixerBenchConfig, attention_sized_value_pom, run as run_mixer
from polymixer.layers.attention import Attention
from polymixer.experiments.cli import main

ROOT = Path(__file__).resolve().parents[1]
H100 = {"name": "NVIDIA H100 80GB HBM3", "arch": "sm_90", "capability": "9.0", "sms": 132, "memory_gib": 79.2,
        "cuda": "13.0", "triton": "3.6.0", "driver": "580.159.04"}


def _fake_kernel_module(monkeypatch, calls):
    """``fake_pom_kernels``: a copy kernel with its bytes, and one that fails."""
    def bench_kernels(B, N, D, Ds, degree, mode, dtype, device):
        calls.append((B, N, D, Ds, degree, mode, dtype, device))
        x = torch.randn(B, N, D, dtype=dtype, device=device)
        y = torch.empty_like(x)

        def broken():
            raise RuntimeError("launch failed")
        return [("copy", lambda: y.copy_(x), 2 * x.numel() * x.element_size()), ("broken", broken, 10)]

    module = types.ModuleType("fake_pom_kernels")
    module.bench_kernels = bench_kernels
    monkeypatch.setitem(sys.modules, "fake_pom_kernels", module)
    monkeypatch.setitem(sys.modules, "fake_value_kernels", types.ModuleType("fake_value_kernels"))  # no hook yet


def test_the_kernel_harness_times_each_kernel_against_a_clone(tmp_path, monkeypatch):
    """Every kernel a hook returns is timed alone, its TB/s and ratio to the clone's; a failing kernel is its row's
    error, a module without the hook or that cannot be imported is said and the rest goes on."""
    calls = []
    _fake_kernel_module(monkeypatch, calls)
    modules = {"pom": "fake_pom_kernels", "value_pom": "fake_value_kernels", "other": "no_such_module_here"}
    cfg = gpu.KernelBenchConfig(out=str(tmp_path), modules=modules)
    for k, v in gpu.DRY_RUN.items():
        setattr(cfg, k, v)
    payload = gpu.run_kernels(cfg, progress=False)
    assert [c[:6] for c in calls] == [(2, 64, 32, 32, 2, "causal"), (2, 64, 32, 32, 2, "full")]
    copies = [r for r in payload["rows"] if r["kernel"] == "copy"]
    assert [r["mode"] for r in copies] == ["causal", "full"]
    for r in copies:
        assert r["ms"] > 0 and r["bytes"] == 2 * 2 * 64 * 32 * 4
        assert r["tb_s"] == pytest.approx(r["bytes"] / r["ms"] / 1e9)
        assert r["vs_clone"] == pytest.approx(r["tb_s"] / payload["clone"]["tb_s"])
    assert all(r["error"] == "RuntimeError: launch failed" for r in payload["rows"] if r["kernel"] == "broken")
    notes = " ".join(payload["notes"])
    assert "fake_value_kernels has no bench_kernels yet" in notes
    assert "no_such_module_here could not be imported" in notes
    text = (tmp_path / "kernels.txt").read_text()
    assert "bandwidth reference: clone of 4 MB" in text and "DRY RUN" in text
    assert json.loads((tmp_path / "kernels.json").read_text())["rows"] == payload["rows"]
    assert (tmp_path / "kernels.png").stat().st_size > 5_000


def test_a_gpu_run_of_the_kernels_needs_a_gpu(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert main(["bench", "gpu", "--kernels", "--out", str(tmp_path)]) == 2
    assert "--dry-run" in capsys.readouterr().err


def test_card_slugs():
    assert gpu.card_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu.card_slug("NVIDIA H200") == "h200"
    assert gpu.card_slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert gpu.card_slug("NVIDIA GeForce RTX 4090") == "nvidia_geforce_rtx_4090"


def _fake_check(out: Path) -> None:
    """A scripts/gpu-check folder as an H100 would leave it: steps, a junit file with one failure, the kernels',
    layer bench's and model bench's JSON and a dispatch table."""
    (out / "tests").mkdir(parents=True)
    (out / "steps.tsv").write_text("tests\tpassed\t0\t98\tpytest …\nkernels\tpassed\t0\t41\tbench gpu --kernels\n"
                                   "mixer\ttimed out\t124\t150\tbench mixer\nmodels\tpassed\t0\t140\tbench models\n"
                                   "dispatch\tskipped\t0\t0\tnot importable\n")
    (out / "tests" / "junit.xml").write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="3" failures="1" errors="0" skipped="1">'
        '<testcase classname="tests.test_triton" name="test_a"/>'
        '<testcase classname="tests.test_triton" name="test_b"><failure message="x"/></testcase>'
        '<testcase classname="tests.test_dispatch" name="test_c"><skipped/></testcase></testsuite></testsuites>')
    summary = gpu.summarize_check(out)
    summary["gpu"] = H100
    summary["machine"]["torch"] = "2.11.0+cu130"
    (out / "summary.json").write_text(json.dumps(summary))
    (out / "kernels").mkdir()
    (out / "kernels" / "kernels.json").write_text(json.dumps({
        "config": {**gpu.KernelBenchConfig().__dict__}, "gpu": H100, "notes": ["value_pom: no hook yet"],
        "clone": {"mb": 1024, "bytes": 2**31, "ms": 0.7, "tb_s": 3.07},
        "rows": [{"op": "pom", "mode": "causal", "kernel": "sums", "bytes": 10**9, "ms": 0.5, "gb": 1.0,
                  "tb_s": 2.0, "vs_clone": 0.65}]}))
    (out / "mixer").mkdir()
    rows = [{"N": n, "batch": 65536 // n, "mixer": m, "fwd_ms": t, "fwdbwd_ms": 3 * t}
            for n in (1024, 65536) for m, t in (("pom causal triton", 1.25), ("sdpa causal", 0.5))]
    (out / "mixer" / "mixer.json").write_text(json.dumps({
        "config": {"dim": 512, "expand": 2, "degree": 2, "dtype": "auto", "device": "cuda", "tokens": 65536},
        "rows": rows, "repeats": 3, "params": {"pom": 1575936, "attention": 1050624}, "gpu": H100,
        "skipped": {"value pom full triton": "refused"}}))
    (out / "models").mkdir()
    (out / "models" / "models.json").write_text(json.dumps({
        "config": {"dry_run": False, "dtype": "bf16", "compile": True, "train_tokens": 32768},
        "machine": {"torch": "2.11.0+cu130"},
        "lm_forward": {"gpu": H100, "params": {"gpt2-small": 124}, "rows": [
            {"model": "gpt2-small", "N": 1024, "batch": 128, "ms": 100.0, "ktok_s": 1310.7, "paper_ktok_s": 572.3,
             "vs_base": 1.0, "paper_vs_base": 1.0}],
            "failed": [{"model": "gppom2-small", "N": 32768, "batch": 4, "reason": "out of memory"}]}}))


def _between_markers(text: str) -> str:
    return text.split(gpu.BEGIN, 1)[1].split(gpu.END, 1)[0]


def test_the_report_writes_docs_section_from_a_check_folder(tmp_path):
    """The section between the markers names the card, the versions and the date and holds tables made from the
    JSON; the rest of the document is untouched; the files land in gpu_<card>/; a second report replaces the first."""
    out = tmp_path / "out"
    _fake_check(out)
    doc = tmp_path / "gpu.md"
    original = (ROOT / "docs" / "gpu.md").read_text()
    doc.write_text(original)
    bench_dir = tmp_path / "bench"
    args = ["bench", "gpu", "--report", str(out), "--doc", str(doc), "--bench-dir", str(bench_dir)]
    assert main(args) == 0
    text = doc.read_text()
    section = _between_markers(text)
    flat = re.sub(r" +", " ", section)  # table cells without their padding
    for needle in ("on NVIDIA H100 80GB HBM3", "sm_90", "torch 2.11.0+cu130", "Triton 3.6.0", "driver 580.159.04",
                   "CUDA 13.0", summary_date(out), "NOT passed; timed out: mixer",
                   "1 passed, 1 failed, 0 errors, 1 skipped", "`tests.test_triton::test_b`",
                   "a clone of 1,024 MB moves 3.07 TB/s", "| pom | causal | sums | 0.5 | 1 | 2 | 0.65 |",
                   "| pom causal triton | 1.25 | 1.25 |", "| sdpa causal | 1.5 | 1.5 |",
                   "not timed: value pom full triton — refused",
                   "GPPoM2-S (N 32768, batch 4): out of memory", "**Dispatch table**: not built"):
        assert needle in flat, needle
    assert ".png" not in section  # no picture where the check drew none (the dry run below has them)
    assert text.replace(section, "") == original.replace(_between_markers(original), "")  # nothing else changed
    copied = sorted(p.name for p in (bench_dir / "gpu_h100").iterdir())
    assert copied == ["kernels.json", "mixer.json", "models.json", "summary.json", "summary.txt"]
    assert main(args) == 0 and doc.read_text() == text  # the same output, the same document
    assert doc.read_text().count(gpu.BEGIN) == 1


def summary_date(out: Path) -> str:
    return json.loads((out / "summary.json").read_text())["date"]


def test_the_summary_counts_steps_and_tests(tmp_path):
    out = tmp_path / "out"
    _fake_check(out)
    s = json.loads((out / "summary.json").read_text())
    assert s["timed_out"] == ["mixer"] and s["skipped"] == ["dispatch"] and s["failed"] == [] and not s["passed"]
    assert s["tests"]["failed"] == ["tests.test_triton::test_b"] and s["tests"]["passed"] == 1
    assert s["seconds"] == 98 + 41 + 150 + 140
    assert "NOT passed" in (out / "summary.txt").read_text()


def test_a_dry_runs_report_never_goes_to_docs_gpu_md(tmp_path, capsys):
    out = tmp_path / "out"
    _fake_check(out)
    summary = json.loads((out / "summary.json").read_text())
    (out / "summary.json").write_text(json.dumps({**summary, "dry_run": True, "gpu": None}))
    assert main(["bench", "gpu", "--report", str(out)]) == 2
    assert "dry run" in capsys.readouterr().err


def test_the_layer_bench_covers_every_mixer_mode_and_records_the_machine(tmp_path):
    """bench mixer: PoM, both value PoMs and SDPA, full and causal, forward and forward + backward; the value PoM at
    attention's size costs what attention's projections do; the JSON names the GPU (none here) and is complete."""
    d, heads = 32, 4
    cfg = MixerBenchConfig(dim=d, heads=heads, tokens=128, lengths=(64,), pom_lengths=(), repeats=1, warmup=0,
                           compile=False, naive=False, value_dim=32, value_heads=2, packed_layouts=(),
                           out=str(tmp_path))
    payload = run_mixer(cfg, progress=False)
    names = {r["mixer"] for r in payload["rows"]}
    for prefix in ("pom", "value pom", "value pom att-sized", "sdpa"):
        for mode in ("full", "causal"):
            assert f"{prefix} {mode}" in names
    assert {"value pom matmuls full (floor)", "value pom att-sized matmuls (floor)"} <= names
    assert all(r["fwdbwd_ms"] is not None for r in payload["rows"])
    att = attention_sized_value_pom(512, 8)
    proj = att.in_proj.weight.numel() + att.out_proj.weight.numel()
    a = Attention(512, heads=8)
    assert abs(proj / (a.qkv.weight.numel() + a.proj.weight.numel()) - 1) < 0.005  # +0.4%: 8 gate rows
    saved = json.loads((tmp_path / "mixer.json").read_text())
    assert "partial" not in saved and saved["gpu"] is None and "params" in saved
    assert saved["params"]["value_pom_att"] < 1.1 * saved["params"]["attention"]
    assert "value pom att-sized causal ÷ its matrix-product floor" in (tmp_path / "mixer.txt").read_text()


@pytest.mark.slow
def test_the_gpu_check_dry_run_runs_every_step_and_reports(tmp_path):
    """``scripts/gpu-check --dry-run --pack`` on the CPU (about 3 minutes): every step passes (the tests are
    collected), the folder is packed, and its report goes into a copy of docs/gpu.md."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "BUDGET_S": "1200", "T_KERNELS": "600"}
    done = subprocess.run([str(ROOT / "scripts" / "gpu-check"), "--dry-run", "--pack"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu-check.tar.gz", "summary.json", "summary.txt"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] and summary["passed"]
    assert {s["name"]: s["status"] for s in summary["steps"]} == {
        "tests": "passed", "kernels": "passed", "mixer": "passed", "models": "passed", "dispatch": "passed"}
    doc = tmp_path / "gpu.md"
    doc.write_text((ROOT / "docs" / "gpu.md").read_text())
    assert main(["bench", "gpu", "--report", str(out), "--doc", str(doc), "--bench-dir", str(tmp_path / "b")]) == 0
    section = re.sub(r" +", " ", _between_markers(doc.read_text()))
    assert "DRY RUN" in section and "| pom causal |" in section and "| GPPoM2-S hybrid |" in section
    print({s["name"]: s["seconds"] for s in summary["steps"]})  # the steps' times, with -s
    files = tmp_path / "b" / "gpu_cpu_dry_run"
    assert (files / "mixer.json").is_file() and (files / "mixer.png").is_file()
    assert "![mixer](b/gpu_cpu_dry_run/mixer.png)" in section and "![models](b/gpu_cpu_dry_run/models.png)" in section
