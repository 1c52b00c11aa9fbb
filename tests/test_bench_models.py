"""``polymixer bench models``: the paper's models on a GPU — here its CPU dry run, which takes the same code path at
tiny sizes; out-of-memory configurations recorded, not raised; a spent budget listing the rest as not run."""

from __future__ import annotations

import json

import torch

from polymixer.experiments.bench import models as bench
from polymixer.experiments.cli import main


def _dry(tmp_path, **kw) -> bench.ModelsBenchConfig:
    cfg = bench.ModelsBenchConfig(out=str(tmp_path), **kw)
    for k, v in bench.DRY_RUN.items():
        setattr(cfg, k, v)
    return cfg


def test_the_dry_run_measures_every_part_for_every_model(tmp_path):
    """Every preset at every shape of every part has a row, nothing failed, and the report says it is a dry run."""
    payload = bench.run(_dry(tmp_path), progress=False)
    lm, shapes = bench.LM_PRESETS, bench.DRY_RUN["lm_shapes"]
    fwd = {(r["model"], r["N"]) for r in payload["lm_forward"]["rows"]}
    assert fwd == {(p, n) for p in lm for _, n in shapes}
    assert {(r["model"], r["N"]) for r in payload["lm_train"]["rows"]} == fwd
    assert {(r["model"], r["context"]) for r in payload["lm_decode"]["rows"]} == {
        (p, n) for p in lm for n in bench.DRY_RUN["decode_contexts"]}
    assert {(r["model"], r["latent"]) for r in payload["image"]["rows"]} == {
        (p, s) for p in bench.IMAGE_PRESETS for s in bench.DRY_RUN["image_latents"]}
    for part in bench.PARTS:
        assert payload[part]["failed"] == [], payload[part]["failed"]
    for r in payload["lm_forward"]["rows"]:
        assert r["ktok_s"] > 0 and r["batch"] == dict((n, b) for b, n in shapes)[r["N"]]
        assert r["vs_base"] is not None and r["paper_vs_base"] is None  # the paper has no 32- or 64-token row
    base = [r for r in payload["lm_forward"]["rows"] if r["model"] == "gpt2-small"]
    assert all(r["vs_base"] == 1 for r in base)
    assert all(r["peak_mb"] is not None and r["peak_mb"] > 0 for r in payload["lm_train"]["rows"])
    assert all(r["state_mb"] > 0 and r["ms_per_token"] > 0 for r in payload["lm_decode"]["rows"])
    pom_state = {r["context"]: r["state_mb"] for r in payload["lm_decode"]["rows"] if r["model"] == "gppom2-small"}
    kv = {r["context"]: r["state_mb"] for r in payload["lm_decode"]["rows"] if r["model"] == "gpt2-small"}
    assert len(set(pom_state.values())) == 1 and kv[48] > kv[16]  # PoM's state is O(1), the KV cache grows
    text = (tmp_path / "models.txt").read_text()
    assert text.startswith("DRY RUN on the CPU") and "GPPoM2-S hybrid" in text and "value-PoM LM" in text
    assert (tmp_path / "models.png").stat().st_size > 10_000
    saved = json.loads((tmp_path / "models.json").read_text())
    assert saved["config"]["dry_run"] and set(bench.PARTS) <= set(saved)


def test_an_out_of_memory_configuration_is_listed_and_the_others_run(tmp_path, monkeypatch):
    """A model that runs out of memory at one length is recorded as such; every other configuration is timed."""
    real = bench.create_model

    def create(name, **kw):
        m = real(name, **kw)
        if name == "gppom2-small":
            forward = m.forward

            def failing(idx, *a, **k):
                if idx.shape[1] == 64:
                    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
                return forward(idx, *a, **k)
            m.forward = failing
        return m

    monkeypatch.setattr(bench, "create_model", create)
    payload = bench.run(_dry(tmp_path, parts=("lm_forward",)), progress=False)
    timed = {(r["model"], r["N"]) for r in payload["lm_forward"]["rows"]}
    assert ("gppom2-small", 64) not in timed and ("gppom2-small", 32) in timed and ("gpt2-small", 64) in timed
    assert payload["lm_forward"]["failed"] == [{"model": "gppom2-small", "N": 64, "batch": 2,
                                                "reason": "out of memory"}]
    assert "GPPoM2-S (N 64, batch 2): out of memory" in (tmp_path / "models.txt").read_text()


def test_a_spent_budget_lists_every_configuration_as_not_run(tmp_path):
    payload = bench.run(_dry(tmp_path, parts=("lm_forward", "lm_decode"), budget_s=0.0), progress=False)
    for part in ("lm_forward", "lm_decode"):
        assert payload[part]["rows"] == []
        assert payload[part]["failed"] and all(f["reason"] == bench.NOT_RUN for f in payload[part]["failed"])
    assert "not run: the time budget" in (tmp_path / "models.txt").read_text()


def test_ratios_are_judged_against_the_paper_only_on_a_gpu():
    """On a GPU's payload each ratio is met or MISSED against the paper's; on a dry run "not measured (no GPU)"."""
    paper = {n: bench.PAPER_LM["gppom2-small"][n] / bench.PAPER_LM["gpt2-small"][n] for n in (1024, 4096)}
    rows = [{"model": "gpt2-small", "N": n, "batch": 1, "ms": 1.0, "ktok_s": 1.0, "vs_base": 1.0,
             "paper_vs_base": 1.0} for n in (1024, 4096)]
    rows += [{"model": "gppom2-small", "N": n, "batch": 1, "ms": 1.0, "ktok_s": 2.0, "vs_base": 2.0,
              "paper_vs_base": paper[n]} for n in (1024, 4096)]
    payload = {"config": {"dry_run": False, "dtype": "bf16", "compile": True}, "machine": {"torch": "2.11"},
               "lm_forward": {"rows": rows, "failed": [], "params": {}, "gpu": None}}
    text = bench.report(payload)
    assert "ratio at least the paper's at every point: MISSED" in text  # 2.0× at 4k against the paper's 3.03×
    assert "GPPoM2-S @ 1024: 2.00× vs 1.74×" in text
    payload["config"]["dry_run"] = True
    assert "not measured (no GPU: a dry run)" in bench.report(payload)


def test_the_command_refuses_a_cpu_run_that_is_not_a_dry_run(tmp_path, capsys):
    assert main(["bench", "models", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "--dry-run" in capsys.readouterr().err
    assert main(["bench", "models", "--dry-run", "--parts", "image", "--latents", "8", "--out", str(tmp_path)]) == 0
    assert "SiPoM-XL/2" in capsys.readouterr().out
    assert main(["bench", "models", "--report", "--out", str(tmp_path)]) == 0
