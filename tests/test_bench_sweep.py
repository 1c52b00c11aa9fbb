"""The one quality-sweep runner every family's bench declares itself to (bench.common.QualitySweep): the plan (the
swept models at every rate, a later stage at an earlier stage's best rates), the earlier file's rows kept, each
model's best rate marked on the family's selection figure, the rows of runs already trained kept by a second
process sharing the sweep, a run another process is training now skipped."""

import dataclasses
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Tuple

import pytest

from polymixer.experiments.bench.common import (
    QualitySweep, Stage, SweepRun, edge_note, mark_best, quality_rows, rate_beyond, round_rate, stale_rate_notes,
    sweep_model, training_curve, training_minutes,
)
from polymixer.experiments.locks import claimed

A, B = "tiny-vpom", "tiny-attention+attention_shift=4"  # a preset and a variant (its overrides parsed)


@dataclass
class _Recipe:  # the fields resume_point and the runner read of a TrainConfig
    lr: float
    batch_size: int = 4
    steps: int = 10
    resume: bool = True
    extra: Dict[str, Any] = field(default_factory=dict)


def _cfg(tmp_path: Path, **kw: Any) -> SimpleNamespace:
    return SimpleNamespace(**{"out": str(tmp_path), "lr": 1e-3, "sweep": (A,), "lr_factors": (0.5, 1.0, 2.0),
                              "lrs": (), "bracket": 2, "seed": 0, "model_overrides": {}, **kw})


def _sweep(trained: List[Tuple[str, str, float]], score: Dict[Tuple[str, float], float]) -> QualitySweep:
    def evaluate(cfg: Any, job: SweepRun, stage: Stage, tcfg: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        trained.append((stage.name, job.spec, job.lr))
        job.out.mkdir(parents=True, exist_ok=True)  # as training would (each run its own folder)
        assert tcfg.lr == job.lr and job.out.parent == Path(cfg.out) / "quality"
        history = [{"step": 5, "loss": 4.0}, {"step": 10, "loss": 2.0}, {"step": 10, "eval_val": 1.0}]
        return {"history": history}, {"task": stage.name, "spec": job.spec, "val": score[(job.spec, job.lr)],
                                 "test": 2 * score[(job.spec, job.lr)], "steps": tcfg.steps}

    def select(rows: List[Dict[str, Any]], cfg: Any) -> List[Dict[str, Any]]:
        for task in {r["task"] for r in rows}:
            mark_best([r for r in rows if r["task"] == task], "val", higher=False)
        return rows

    return QualitySweep("fam", 1e-3, ("task", "spec"), lambda cfg, job, stage: _Recipe(job.lr), evaluate, select,
                        lambda rows: "val", model="spec", stage_key="task")


def test_stages_sweep_then_reuse_the_best_rate_chosen_on_validation(tmp_path):
    score = {(A, 5e-4): 3.0, (A, 1e-3): 1.0, (A, 2e-3): 2.0, (B, 1e-3): 5.0}
    score.update({(B, lr): 9.0 for lr in (5e-4, 2e-3)})
    trained: List[Tuple[str, str, float]] = []
    sweep = _sweep(trained, score)
    best = lambda rows: {r["spec"]: r["lr"] for r in rows if r["task"] == "one" and r.get("best_lr")}  # noqa: E731
    stages = [Stage((A, B), name="one", prefix="one-"),
              Stage((A, B), name="two", prefix="two-", rates=best, rates_label=lambda m: "best one")]
    out = sweep.run(_cfg(tmp_path), stages)
    # A swept at the three rates, B (not swept) at the recipe's; stage two at stage one's best rates
    assert trained == [("one", A, 5e-4), ("one", A, 1e-3), ("one", A, 2e-3), ("one", B, 1e-3),
                       ("two", A, 1e-3), ("two", B, 1e-3)]
    rows = out["rows"]
    assert out["selected_by"] == "val" and out["grid"] == [5e-4, 1e-3, 2e-3]
    assert [(r["spec"], r["lr"]) for r in rows if r["task"] == "one" and r["best_lr"]] == [(A, 1e-3), (B, 1e-3)]
    assert {r["lr_from"] for r in rows if r["task"] == "two"} == {"best one"}
    assert {r["lr_from"] for r in rows if r["task"] == "one"} == {"sweep", "recipe"}
    assert all(isinstance(r["train_min"], float) for r in rows)
    assert all(r["train_curve"] == [[5, 4.0], [10, 2.0]] for r in rows)  # the training loss, not the evaluation
    # the run folders: the recipe's rate without a suffix (the folders of runs made before sweeps)
    folders = {Path(p).name for p in (tmp_path / "quality").iterdir()}
    assert folders >= {"one-tiny-vpom", "one-tiny-vpom-lr0.0005", "two-tiny-vpom"}


def test_a_second_process_keeps_the_first_ones_rows_and_redoes_none(tmp_path):
    score = {(A, 5e-4): 3.0, (A, 1e-3): 1.0, (A, 2e-3): 0.5}
    trained: List[Tuple[str, str, float]] = []
    first = _sweep(trained, score).run(_cfg(tmp_path, lrs=(1e-3,)), [Stage((A,), name="one")])
    (tmp_path / "fam.json").write_text(json.dumps({"quality": first}))
    second = _sweep(trained, score).run(_cfg(tmp_path, lrs=(2e-3,)), [Stage((A,), name="one")])
    assert trained == [("one", A, 1e-3), ("one", A, 2e-3)]
    rows = second["rows"]
    assert sorted(r["lr"] for r in rows) == [1e-3, 2e-3]
    assert [r["lr"] for r in rows if r["best_lr"]] == [2e-3]  # chosen on "val" over both processes' runs
    assert all(r["rates"] == 2 for r in rows)


def test_a_run_another_process_is_training_is_skipped_not_trained_twice(tmp_path):
    score = {(A, 5e-4): 3.0, (A, 1e-3): 1.0, (A, 2e-3): 0.5, (A, 4e-3): 0.9}
    trained: List[Tuple[str, str, float]] = []
    busy = tmp_path / "quality" / "tiny-vpom-lr0.002"
    with claimed(busy) as mine:  # as another process training that run holds its folder's claim
        assert mine
        with pytest.warns(UserWarning, match=r"tiny-vpom-lr0\.002: another process is training this run now"):
            out = _sweep(trained, score).run(_cfg(tmp_path), [Stage((A,), name="one")])
    assert trained == [("one", A, 5e-4), ("one", A, 1e-3)]
    assert sorted(r["lr"] for r in out["rows"]) == [5e-4, 1e-3]
    # the claim ends with its holder: the bench run again takes the run that was skipped (the others, trained to
    # the end, are only scored again: resume_point); best at the grid's top, the sweep tries one rate past it
    again = _sweep(trained, score).run(_cfg(tmp_path), [Stage((A,), name="one")])
    assert ("one", A, 2e-3) in trained[2:] and trained[-1] == ("one", A, 4e-3)
    assert [r["lr"] for r in again["rows"] if r["best_lr"]] == [2e-3]


def test_a_run_on_file_whose_folder_is_gone_is_kept_not_trained_again(tmp_path):
    # a fresh checkout holds the bench JSON, not the (ignored) run folders: the recorded runs stand; a row of
    # another stage or of another length of training is not this run's
    score = {(A, 5e-4): 3.0, (A, 1e-3): 1.0, (A, 2e-3): 2.0}
    trained: List[Tuple[str, str, float]] = []
    first = _sweep(trained, score).run(_cfg(tmp_path), [Stage((A,), name="one")])
    shutil.rmtree(tmp_path / "quality")
    trained.clear()
    again = _sweep(trained, {k: 7.0 for k in score}).run(_cfg(tmp_path), [Stage((A,), name="one")])
    assert trained == []
    assert [(r["lr"], r["val"], r["best_lr"]) for r in again["rows"]] == [
        (r["lr"], r["val"], r["best_lr"]) for r in first["rows"]]
    _sweep(trained, score).run(_cfg(tmp_path, lrs=(1e-3,)), [Stage((A,), name="two")])
    assert trained == [("two", A, 1e-3)]
    longer = dataclasses.replace(_sweep(trained, score), recipe=lambda cfg, job, stage: _Recipe(job.lr, steps=20))
    longer.run(_cfg(tmp_path, lrs=(2e-3,)), [Stage((A,), name="one")])
    assert trained[1:] == [("one", A, 2e-3)]


def test_each_finished_run_is_on_file_before_the_next_one_starts(tmp_path):
    """A sweep stopped between runs (killed, or its machine given back) leaves the rows of the runs it finished in
    ``<bench>.json``, selected, with the family's own fields of the part as the file held them and the other parts
    untouched: a rerun or the report starts from them, and scoring them again is not needed."""
    score = {(A, 5e-4): 3.0, (A, 1e-3): 1.0, (A, 2e-3): 0.5}
    trained: List[Tuple[str, str, float]] = []
    sweep = _sweep(trained, score)
    path = tmp_path / "fam.json"
    path.write_text(json.dumps({"speed": {"rows": [1]}, "quality": {"rows": [], "pictures": {"x": "y.png"}}}))
    evaluate = sweep.evaluate

    def stopped(cfg: Any, job: SweepRun, stage: Stage, tcfg: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        if len(trained) == 2:
            raise KeyboardInterrupt
        return evaluate(cfg, job, stage, tcfg)

    with pytest.raises(KeyboardInterrupt):
        dataclasses.replace(sweep, evaluate=stopped).run(_cfg(tmp_path), [Stage((A,), name="one")])
    saved = json.loads(path.read_text())
    assert saved["speed"] == {"rows": [1]} and saved["quality"]["pictures"] == {"x": "y.png"}
    rows = saved["quality"]["rows"]
    assert sorted(r["lr"] for r in rows) == [5e-4, 1e-3] and [r["lr"] for r in rows if r["best_lr"]] == [1e-3]
    assert saved["quality"]["config"]["lr"] == 1e-3 and saved["quality"]["selected_by"] == "val"


def test_rate_beyond_steps_past_the_end_the_best_rate_lies_at():
    assert rate_beyond([5e-4, 1e-3, 2e-3], 2e-3) == 4e-3  # the grid's own step at that end
    assert rate_beyond([2e-3, 1e-3, 5e-4], 5e-4) == 2.5e-4
    assert rate_beyond([5e-4, 1e-3, 2e-3], 1e-3) is None  # inside: the sweep shows the best
    assert rate_beyond([1e-3], 1e-3) is None and rate_beyond([1e-3, 1.0000001e-3], 1e-3) is None
    assert rate_beyond([3e-4, 1e-3, 3e-3, 1e-2], 1e-2) == 3e-2  # 3.33e-2, written as a person would
    assert rate_beyond([1e-3, 2e-3, 4e-3, 8e-3], 8e-3) == 1.6e-2  # 2e-2 would be 25 % off the step
    assert round_rate(3.333e-2) == 3e-2 and round_rate(1.6e-2) == 1.6e-2 and round_rate(9e-5) == 9e-5
    # a grid of uneven steps (Zoology's 0.3x 1x 3x 10x) goes on to its own next rate, not 3e-3 * 3e-3 / 1e-3
    ladder = [3e-4, 1e-3, 3e-3, 1e-2]
    assert rate_beyond([3e-4, 1e-3, 3e-3], 3e-3) == 9e-3
    assert rate_beyond([3e-4, 1e-3, 3e-3], 3e-3, ladder) == 1e-2
    assert rate_beyond([1e-3, 3e-3], 1e-3, ladder) == 3e-4
    assert rate_beyond(ladder, 1e-2, ladder) == 3e-2  # past the grid's top: its last step
    assert rate_beyond([3e-4, 1e-3, 3e-3], 1e-3, ladder) is None


def test_a_model_best_at_an_end_of_the_grid_is_trained_past_it_until_a_rate_does_worse(tmp_path):
    """The bracket: a swept model best at the grid's top trains one step higher, again while the new rate is best,
    up to ``bracket`` rates; one best at the bottom goes lower; a model best inside, a model not swept, a later
    stage (its rates taken from the first), a share of the sweep (``--lrs``) and another seed's run add none."""
    C = "tiny-pom"
    score = {(A, 5e-4): 3.0, (A, 1e-3): 2.0, (A, 2e-3): 1.0, (A, 4e-3): 0.5, (A, 8e-3): 0.7, (A, 1.6e-2): 0.1}
    score.update({(B, 2.5e-4): 1.5, (B, 5e-4): 1.0, (B, 1e-3): 2.0, (B, 2e-3): 3.0, (C, 1e-3): 1.0})
    trained: List[Tuple[str, str, float]] = []
    best = lambda rows: {r["spec"]: r["lr"] for r in rows if r["task"] == "one" and r.get("best_lr")}  # noqa: E731
    stages = [Stage((A, B, C), name="one"), Stage((A,), name="two", prefix="two-", rates=best)]
    out = _sweep(trained, score).run(_cfg(tmp_path, sweep=(A, B)), stages)
    # one model after another, each bracketed before the next starts (a sweep stopped between models leaves each
    # model it reached at a rate shown to be its best)
    assert trained == [("one", A, 5e-4), ("one", A, 1e-3), ("one", A, 2e-3),
                       ("one", A, 4e-3), ("one", A, 8e-3),  # 4e-3 best again: one more; 8e-3 worse: stop
                       ("one", B, 5e-4), ("one", B, 1e-3), ("one", B, 2e-3),
                       ("one", B, 2.5e-4),  # B best at the bottom: one step lower, which does worse
                       ("one", C, 1e-3),
                       ("two", A, 4e-3)]  # the later stage at the bracketed best
    rows = {(r["task"], r["spec"], r["lr"]): r for r in out["rows"]}
    assert rows[("one", A, 4e-3)]["best_lr"] and rows[("one", A, 4e-3)]["lr_from"] == "bracket"
    assert rows[("one", B, 5e-4)]["best_lr"] and rows[("one", A, 8e-3)]["rates"] == 5
    assert out["grid"] == [2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3, 8e-3]
    assert (tmp_path / "quality" / "tiny-vpom-lr0.008").is_dir()
    # at most `bracket` rates per model and run; a later run of the bench goes on from where the bracket stopped
    score[(A, 8e-3)] = 0.2
    trained.clear()
    fresh = tmp_path / "fresh"
    first = _sweep(trained, score).run(_cfg(fresh, sweep=(A,), bracket=1), [Stage((A,), name="one")])
    assert trained[3:] == [("one", A, 4e-3)]
    (fresh / "fam.json").write_text(json.dumps({"quality": first}))
    trained.clear()
    _sweep(trained, score).run(_cfg(fresh, sweep=(A,), bracket=1), [Stage((A,), name="one")])
    assert trained[3:] == [("one", A, 8e-3)]
    trained.clear()
    _sweep(trained, score).run(_cfg(tmp_path / "share", sweep=(A,), lrs=(2e-3,)), [Stage((A,), name="one")])
    assert trained == [("one", A, 2e-3)]  # a share of the sweep: its rate only
    trained.clear()
    _sweep(trained, score).run(_cfg(tmp_path / "seed1", sweep=(A,), seed=1), [Stage((A,), name="one")])
    assert [lr for _, _, lr in trained] == [5e-4, 1e-3, 2e-3]  # another seed's folder: never past the grid


def test_one_models_sweep_is_its_rates_then_the_bracket_then_the_other_seeds_at_its_best():
    """The rule both runners follow (QualitySweep, and the recall bench with its seeds in one file): every rate,
    then past the end while ``past`` names a rate (at most ``bracket``), then ``then`` at the best rate, if any."""
    done: List[Tuple[str, float]] = []
    steps = iter([4e-3, 8e-3, None])
    sweep_model([1e-3, 2e-3], lambda lr: done.append(("sweep", lr)), lambda: next(steps), 5,
                lambda: 4e-3, lambda lr: done.append(("seeds", lr)))
    assert done == [("sweep", 1e-3), ("sweep", 2e-3), ("sweep", 4e-3), ("sweep", 8e-3), ("seeds", 4e-3)]
    done.clear()
    sweep_model([1e-3], lambda lr: done.append(("sweep", lr)), lambda: 2e-3, 1)  # one bracket rate at most
    assert done == [("sweep", 1e-3), ("sweep", 2e-3)]
    done.clear()
    sweep_model([1e-3], lambda lr: done.append(("sweep", lr)), lambda: 2e-3, 0, lambda: None,
                lambda lr: done.append(("seeds", lr)))  # no bracket; no best known (a share): no other seeds
    assert done == [("sweep", 1e-3)]


def test_a_stage_at_other_models_rates_adds_only_the_one_rate_its_past_names(tmp_path):
    """A stage taking its rates from other runs (the LM's larger models, at their smaller ones' rates) trains each
    model at the rate given, then the one rate ``past`` names, never more; none without ``past``, in another seed's
    folder or with --bracket 0."""
    score = {(A, 5e-4): 3.0, (A, 1e-3): 2.0, (A, 2e-3): 1.0, (A, 4e-3): 2.0, (B, 1e-3): 1.0, (B, 5e-4): 0.5,
             (B, 2.5e-4): 0.1}
    given = lambda rows: {B: 1e-3}  # noqa: E731
    asked: List[Tuple[str, float]] = []

    def past(spec: str, rows: List[Dict[str, Any]]) -> float:
        lr = min(r["lr"] for r in rows if r["spec"] == spec) / 2  # always one lower: only the first is taken
        asked.append((spec, lr))
        return lr

    trained: List[Tuple[str, str, float]] = []
    stages = [Stage((A,), name="one"), Stage((B,), name="one", prefix="big-", rates=given, past=past)]
    out = _sweep(trained, score).run(_cfg(tmp_path, bracket=2), stages)
    assert trained[-2:] == [("one", B, 1e-3), ("one", B, 5e-4)] and asked == [(B, 5e-4)]
    assert {r["lr"]: r["lr_from"] for r in out["rows"] if r["spec"] == B} == {1e-3: B, 5e-4: "bracket"}
    for kw in ({"seed": 1}, {"bracket": 0}):
        trained.clear()
        _sweep(trained, score).run(_cfg(tmp_path / str(kw), **kw), stages)
        assert [lr for _, spec, lr in trained if spec == B] == [1e-3], kw
    trained.clear()
    _sweep(trained, score).run(_cfg(tmp_path / "no-past"), [stages[0], Stage((B,), name="one", rates=given)])
    assert [lr for _, spec, lr in trained if spec == B] == [1e-3]


def test_a_row_at_an_earlier_stages_best_rate_is_noted_once_that_best_has_moved():
    """A later stage trained at an earlier stage's best rate, whose sweep has since found another best: one note
    naming both rates and the flags that train it again; none where the rate still agrees (1e-3 written 0.001000001)
    or the row takes no other run's rate; a file from before sweeps reads at the recipe's rate."""
    rows = quality_rows({"rows": [{"task": "one", "spec": A, "lr": 4e-3}, {"task": "two", "spec": A, "lr": 1e-3},
                                  {"task": "one", "spec": B, "lr": 1e-3}, {"task": "two", "spec": B},
                                  {"task": "three", "spec": A, "lr": 1e-3}]}, 1.000001e-3)
    assert rows[3]["lr"] == 1.000001e-3 and rows[3]["lr_from"] == "recipe"
    first = {r["spec"]: r for r in rows if r["task"] == "one"}
    notes = stale_rate_notes(rows, lambda r: first.get(r["spec"]) if r["task"] == "two" else None,
                             lambda r: f"--tasks two --models {r['spec']}", lambda r: f"two {r['spec']}",
                             lambda p: f"one {p['spec']}")
    assert notes == [f"note: two {A} was trained at lr 0.001, the best rate of one {A} is now 0.004: run --tasks two "
                     f"--models {A} again"]


def test_edge_note_names_the_models_best_at_an_end_of_their_rates():
    rows = [{"spec": A, "model": "vpom", "lr": lr, "best_lr": lr == 2e-3, "val": v}
            for lr, v in ((5e-4, 3.0), (1e-3, 2.0), (2e-3, 1.0))]
    rows += [{"spec": B, "model": "attention", "lr": lr, "best_lr": lr == 1e-3, "val": 1.0}
             for lr in (5e-4, 1e-3, 2e-3)]
    rows += [{"spec": "one-rate", "lr": 1e-3, "best_lr": True}]
    assert edge_note(rows) == ("best at an end of the rates tried (a rate beyond may do better; the sweep's --bracket "
                               "trains it): vpom at 0.002 (0.004 not run)")
    assert edge_note(rows[3:]) == ""
    assert edge_note(rows, score="val", ceiling=0.5) == ""  # at its ceiling: no rate can beat it


@pytest.mark.parametrize("bench, config", [("lm", "LMBenchConfig"), ("image", "ImageBenchConfig"),
                                           ("ocr", "OCRBenchConfig"), ("eo", "EOBenchConfig"),
                                           ("points", "PointBenchConfig")])
def test_every_family_bench_takes_bracket_from_the_command_line(bench, config):
    import argparse
    import importlib

    from polymixer.experiments.bench.common import BRACKET, SWEEP_FIELDS, apply_overrides

    module = importlib.import_module(f"polymixer.experiments.{bench}.bench")
    p = argparse.ArgumentParser()
    module.add_arguments(p)  # the family's own command line, as `polymixer bench <family>` builds it
    fields = {k: k for k in SWEEP_FIELDS}
    cfg = getattr(module, config)
    assert apply_overrides(cfg(), None, p.parse_args([]), fields).bracket == BRACKET
    assert apply_overrides(cfg(), None, p.parse_args(["--bracket", "0"]), fields).bracket == 0


def test_a_part_kept_from_an_earlier_run_keeps_the_machine_it_was_measured_on(tmp_path):
    """A part written before parts recorded their own machine takes the file's, which a later run of another part
    replaces: a speed measured on one CPU is never credited to the machine a later quality run used."""
    import json
    from dataclasses import dataclass

    from polymixer.experiments.bench.common import run_parts

    @dataclass
    class Cfg:
        parts: tuple = ("quality",)

    path = tmp_path / "x.json"
    path.write_text(json.dumps({"config": {}, "machine": {"cpu": "the earlier CPU"}, "speed": {"rows": [1]}}))
    payload = run_parts(Cfg(), path, {"speed": lambda c, p: {}, "quality": lambda c, p: {"rows": [2]}}, False)
    assert payload["speed"]["machine"] == {"cpu": "the earlier CPU"}
    assert json.loads(path.read_text())["speed"]["machine"] == {"cpu": "the earlier CPU"}
    assert payload["quality"]["machine"]["cpu"] != "the earlier CPU"


def test_a_training_curve_keeps_evenly_spread_logged_losses_with_the_first_and_last():
    history = [{"step": 10 * i, "loss": 1 / i, "lr": 1e-3} for i in range(1, 101)] + [{"step": 1000, "eval_x": 0.5}]
    curve = training_curve(history, points=5)
    assert [s for s, _ in curve] == [10, 260, 510, 750, 1000]  # records 0, 25, 50, 74, 99 of 100
    assert curve[0] == [10, 1.0] and curve[-1] == [1000, 0.01]
    assert training_curve(history[:3], points=5) == [[10, 1.0], [20, 0.5], [30, 0.3333]]  # fewer: every one
    assert training_curve([]) == []


def test_training_minutes_count_a_resumed_runs_earlier_part_and_keep_a_finished_runs_record(tmp_path):
    import time

    # resumed after an interruption: the history's seconds (both invocations), not this process's few
    history = [{"step": 10, "loss": 2.0, "tok_s": 1.0, "train_s": 600.0}, {"step": 20, "loss": 1.0, "train_s": 1800.0}]
    assert training_minutes(tmp_path, time.perf_counter(), False, history, 4) == pytest.approx(30.0)
    # a finished run only evaluated again: the minutes recorded when it finished
    assert training_minutes(tmp_path, time.perf_counter() - 600, True, [], 4) == pytest.approx(30.0)
    # a history without the seconds (older runs): this process's time
    assert training_minutes(tmp_path / "old", time.perf_counter() - 120, False, [], 4) == pytest.approx(2.0, abs=0.1)
    # an older run finished, no record: estimated from its logged rate, in the rate's own unit or not at all
    images = [{"step": 10, "loss": 2.0, "img_s": 2.0}, {"step": 30, "loss": 1.0, "img_s": 4.0}]
    assert training_minutes(tmp_path / "a", 0.0, True, images, 12) == pytest.approx((10 * 12 / 2 + 20 * 12 / 4) / 60)
    tokens = [{"step": 60, "loss": 2.0, "tok_s": 1024.0}]
    assert training_minutes(tmp_path / "b", 0.0, True, tokens, 4) is None  # 4 sequences are not 4 tokens
    assert training_minutes(tmp_path / "b", 0.0, True, tokens, 4, units_per_step=4 * 256) == pytest.approx(1.0)
