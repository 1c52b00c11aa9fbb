"""Experiment tracking (``--log``): the CSV file's columns and rows are the loop's history (a resumed run's too);
TensorBoard's event files hold every figure at its step; a W&B run (a stand-in module recording the calls, and the
real package offline where installed) starts offline without a key, gets every figure, resumes under the same id and
is finished; a missing package is one line naming the extra; only the main rank of a torchrun job logs."""

from __future__ import annotations

import csv
import json
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import ToyRegression, torchrun

from polymixer.experiments.train import tracking
from polymixer.experiments.train.loop import TrainConfig, train


def _cfg(out: Path, **kw) -> TrainConfig:
    base = dict(steps=6, batch_size=8, lr=1e-2, warmup=1, eval_every=3, ckpt_every=2, log_every=1, out=str(out),
                progress=False, curves=False, seed=0)
    return TrainConfig(**{**base, **kw})


def _train(cfg: TrainConfig) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return train(model, ToyRegression(), cfg, {"family": "toy", "preset": "mlp", "model": {}})


def _history(out: Path) -> list:
    return json.loads((out / "history.json").read_text())


def _csv_matches_history(out: Path) -> None:
    history = _history(out)
    with open(out / "history.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
        columns = reader.fieldnames
    keys = list(dict.fromkeys(k for r in history for k in r))  # every key, in the order it first appears
    assert columns == keys
    assert len(rows) == len(history)
    for row, rec in zip(rows, history):
        assert {k for k, v in row.items() if v != ""} == set(rec)
        for k, v in rec.items():
            assert float(row[k]) == pytest.approx(float(v), rel=1e-12), (k, row, rec)


def test_csv_columns_and_rows_are_the_history_and_a_resumed_run_continues_it(tmp_path):
    res = _train(_cfg(tmp_path / "run", log="csv"))
    _csv_matches_history(tmp_path / "run")
    assert res["history"] == _history(tmp_path / "run")
    evals = [r for r in res["history"] if "eval_mse" in r]
    assert [r["step"] for r in evals] == [3, 6]  # both kinds of record are rows
    assert {"loss", "lr", "ex_s", "grad_norm", "peak_rss_mb", "train_s"} <= set(res["history"][0])
    # stopped after step 4, then resumed: the file is the resumed history (rows past the checkpoint dropped)
    _train(_cfg(tmp_path / "stop", log="csv", stop_after=4))
    _csv_matches_history(tmp_path / "stop")
    _train(_cfg(tmp_path / "stop", log="csv"))
    _csv_matches_history(tmp_path / "stop")
    assert [r["step"] for r in _history(tmp_path / "stop") if "loss" in r] == [1, 2, 3, 4, 5, 6]


def test_tensorboard_event_files_hold_every_figure_at_its_step(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    res = _train(_cfg(tmp_path / "run", log="tensorboard"))
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/grad_norm", "train/ex_s", "train/peak_rss_mb", "eval/mse"} <= tags
    for rec in res["history"]:
        for key, value in rec.items():
            if key == "step":
                continue
            tag = f"eval/{key[5:]}" if key.startswith("eval_") else f"train/{key}"
            logged = {e.step: e.value for e in acc.Scalars(tag)}
            assert logged[rec["step"]] == pytest.approx(value, rel=1e-6), (tag, rec["step"])


class _FakeWandb(types.ModuleType):
    """Records ``init`` / ``log`` / ``finish`` as the real module would receive them."""

    def __init__(self):
        super().__init__("wandb")
        self.calls = []
        self.next_id = "fake-id-1"
        fake = self

        class Run:
            def __init__(self, run_id):
                self.id = run_id or fake.next_id

            def log(self, data, step=None):
                fake.calls.append(("log", dict(data), step))

            def finish(self):
                fake.calls.append(("finish",))

        self._run = Run

    def init(self, **kw):
        self.calls.append(("init", kw))
        return self._run(kw.get("id"))


@pytest.fixture
def fake_wandb(monkeypatch, tmp_path):
    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setattr(tracking, "check_tracker", lambda kind: kind)  # (no real package needed)
    return fake


def test_wandb_starts_offline_without_a_key_logs_every_figure_and_resumes_its_run(tmp_path, fake_wandb):
    out = tmp_path / "run"
    res = _train(_cfg(out, log="wandb", stop_after=4))
    (_, init), *logs, finish = fake_wandb.calls
    assert init["mode"] == "offline" and init["id"] is None and init["resume"] == "allow"
    assert init["dir"] == str(out) and init["config"]["train"]["log"] == "wandb"
    assert init["config"]["family"] == "toy" and finish == ("finish",)
    assert [c[2] for c in logs] == [r["step"] for r in res["history"]]
    for (_, data, _), rec in zip(logs, res["history"]):
        expect = {(f"eval/{k[5:]}" if k.startswith("eval_") else f"train/{k}"): v for k, v in rec.items()
                  if k != "step"}
        assert data == pytest.approx(expect)
    fake_wandb.calls.clear()
    fake_wandb.next_id = "another-id"
    _train(_cfg(out, log="wandb"))
    assert fake_wandb.calls[0][1]["id"] == "fake-id-1"  # the same W&B run, resumed
    assert [c[2] for c in fake_wandb.calls if c[0] == "log"] == [5, 6, 6]


def test_wandb_mode_follows_the_environment_and_a_configured_key(tmp_path):
    none = tmp_path / "none"
    assert tracking.wandb_mode({}, none) == "offline"
    assert tracking.wandb_mode({"WANDB_MODE": "disabled", "WANDB_API_KEY": "k"}, none) == "disabled"
    assert tracking.wandb_mode({"WANDB_API_KEY": "k"}, none) == "online"
    rc = tmp_path / "netrc"
    rc.write_text("machine api.wandb.ai\n  login user\n  password k\n")
    rc.chmod(0o600)
    assert tracking.wandb_mode({}, rc) == "online"
    rc.write_text("machine example.org\n  login user\n  password k\n")
    assert tracking.wandb_mode({}, rc) == "offline"


def test_an_online_start_that_fails_goes_on_offline(tmp_path, fake_wandb, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "k")
    real_init = fake_wandb.init

    def init(**kw):
        if kw["mode"] == "online":
            raise ConnectionError("network unreachable")
        return real_init(**kw)

    fake_wandb.init = init
    with pytest.warns(UserWarning, match="could not start an online run .network unreachable.; logging offline"):
        _train(_cfg(tmp_path / "run", log="wandb", steps=2))
    assert fake_wandb.calls[0][1]["mode"] == "offline"


def test_a_real_offline_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for var in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    _train(_cfg(tmp_path / "run", log="wandb", steps=3))
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), "no offline run written"


@pytest.mark.parametrize("kind, extra", [("tensorboard", "tensorboard"), ("wandb", "wandb")])
def test_a_missing_package_is_one_line_naming_the_extra(kind, extra, monkeypatch, capsys):
    import importlib.util

    from polymixer.experiments.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == kind else real(name, *a))
    line = rf"^--log {kind} needs the {kind} package: pip install 'polymixer\[{extra}\]'$"
    with pytest.raises(ValueError, match=line):
        TrainConfig(log=kind)
    assert main(["train", "lm", "--log", kind, "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"polymixer train lm: error: --log {kind} needs the {kind} package: pip install 'polymixer[{extra}]'"
    with pytest.raises(ValueError, match="log .--log. must be one of none, csv, tensorboard, wandb, got 'mlflow'"):
        TrainConfig(log="mlflow")


RANKS = r"""
import json, os, sys, types
import torch
sys.path.insert(0, sys.argv[2])
from test_tracking import _FakeWandb, _cfg, _train
from polymixer.experiments.train import tracking

fake = _FakeWandb()
sys.modules["wandb"] = fake
tracking.check_tracker = lambda kind: kind
out = sys.argv[1]
_train(_cfg(__import__("pathlib").Path(out), log="wandb", steps=3))
json.dump([c[0] for c in fake.calls], open(f"{out}/calls{os.environ['RANK']}.json", "w"))
"""


def test_only_the_main_rank_logs(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    torchrun(RANKS, [out, Path(__file__).parent], tmp_path, 2, env={"WANDB_MODE": "offline"}, name="ranks.py")
    assert json.loads((out / "calls0.json").read_text()) == ["init", "log", "log", "log", "log", "finish"]
    assert json.loads((out / "calls1.json").read_text()) == []


def test_every_family_takes_the_log_flag():
    """The flag comes with the loop's options: every train command (and distill's) has it."""
    import argparse
    import importlib

    from polymixer.experiments.commands import load_command
    from polymixer.experiments.registry import lab_family, trainable

    adders = [load_command(lab_family(name).commands[("train", name)].target)[0] for name in trainable()]
    adders.append(importlib.import_module("polymixer.experiments.distill.task").add_lm_arguments)
    for add in adders:
        p = argparse.ArgumentParser()
        add(p)
        needs = ["--teacher", "gpt2"] if add.__name__ == "add_lm_arguments" else []  # (distill's one required option)
        assert p.parse_args(needs + ["--log", "csv"]).log == "csv", add.__module__
        assert p.parse_args(needs).log == "none", add.__module__
    assert replace(TrainConfig(), log="csv").log == "csv"
