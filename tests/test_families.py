"""One table of families read by the command line, the registry and ``bench faults``; what a new user meets: one-line
refusals of another family's preset, --help with defaults, training curves, readable weight files, plain warnings,
benches that say when the machine was busy."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys

import pytest
import torch

from polymixer.experiments.cli import COMMANDS, build_parser, main
from polymixer.families import BUILT_IN, FAMILIES, canonical_family, family
from polymixer.models import create_model, list_models
from polymixer.models.registry import preset_of
from polymixer.checkpoint import load_model, read_config, save_checkpoint


def test_the_table_is_what_the_command_line_and_the_registry_offer():
    for name, fam in FAMILIES.items():
        assert list_models(family=name), name  # every family registers presets under its one name
        if fam.tiny is not None:
            assert fam.tiny in list_models(family=name)
            assert name in COMMANDS["train"] and name in COMMANDS["eval"] and name in COMMANDS["check-data"]
            assert COMMANDS["train"][name][1] == f"polymixer.experiments.{name}.task:train"
        assert name in COMMANDS["bench"] and COMMANDS["bench"][name][1] == f"polymixer.experiments.{name}.bench"
        for alias in fam.aliases:  # earlier names: the registry, checkpoints and the command line accept them
            assert canonical_family(alias) == name and family(alias) is fam
            assert list_models(family=alias) == list_models(family=name)
    from polymixer.experiments.bench.faults import FaultsBenchConfig
    from polymixer.experiments.registry import families, lab_family, trainable

    assert list(families()) == list(BUILT_IN) == list(FAMILIES)  # each built-in family's registration, in order
    assert all(lab_family(name).family is fam for name, fam in FAMILIES.items())
    assert set(trainable()) == {n for n, f in FAMILIES.items() if f.tiny is not None}
    assert FaultsBenchConfig().families == trainable()  # bench faults probes every family that trains
    with pytest.raises(ValueError, match="unknown model family 'nope'; the families are lm, recall, image"):
        family("nope")
    with pytest.raises(ValueError, match="the recall family has no command `polymixer train recall`"):
        lab_family("recall").command("train")


def test_a_family_from_another_package_joins_the_table_once():
    """add_family: a new family's name and earlier names join the table (the registry then takes its presets); the
    same entry again is no change; a name another family holds is refused. In a process of its own: the table of
    this one stays as the other tests find it."""
    code = """
from polymixer.families import BUILT_IN, FAMILIES, Family, add_family, canonical_family, family
toy = Family("toy", "a toy", None, aliases=("toy-earlier",))
assert add_family(toy) is toy and add_family(toy) is toy and list(FAMILIES) == [*BUILT_IN, "toy"]
assert family("toy-earlier") is toy and canonical_family("toy-earlier") == "toy"
for other in (Family("other", "another", None, aliases=("lm",)), Family("toy", "a different toy", None)):
    try:
        add_family(other)
    except ValueError as e:
        print(e)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["family 'other': 'lm' already names the family 'lm'",
                                       "another family named 'toy' is in the table already"]


def test_an_earlier_noun_still_runs_the_command():
    args = build_parser().parse_args(["train", "3d", "--steps", "1"])
    assert args.noun == "points" and args._module == "polymixer.experiments.points.task:train"
    assert build_parser().parse_args(["eval", "ptv3", "--ckpt", "x"]).noun == "points"


def test_a_checkpoint_written_under_an_earlier_family_name_loads(tmp_path):
    """A run saved when the point-cloud family was called ``ptv3`` reads, resumes and loads as ``points``."""
    model = create_model("tiny-ptv3", enc_depths=(1, 1, 1), enc_channels=(8, 16, 16), enc_heads=(1, 2, 2),
                         dec_depths=(1, 1), dec_channels=(8, 16), dec_heads=(1, 2), patch_size=64)
    save_checkpoint(tmp_path / "run", 1, model, {"family": "ptv3", "preset": "tiny-ptv3",
                                                "model": vars(model.config)})
    assert read_config(tmp_path / "run")["family"] == "points"
    back = load_model(tmp_path / "run", family="points")
    assert type(back).family == "points"
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), model.state_dict().values()))
    assert load_model(tmp_path / "run", family="3d") is not None  # an earlier name as the expectation, too


@pytest.mark.parametrize("noun, preset, what", [
    ("image", "tiny-pom", "tiny-pom is a language model (family lm); `polymixer train image` takes: tiny-sipom, "
                          "tiny-sipom-value, tiny-sipom-vhybrid, tiny-sit"),
    ("eo", "tiny-ppomv3", "tiny-ppomv3 is a point-cloud segmenter (family points); `polymixer train eo` takes: "
                          "tiny-tsvipom"),
    ("ocr", "tiny-sit", "tiny-sit is an image generator (family image); `polymixer train ocr` takes: tiny-htr-vpom"),
    ("points", "tiny-hybrid", "tiny-hybrid is a language model (family lm); `polymixer train points` takes: "
                              "tiny-ppomv3"),
    ("lm", "tiny-ppomv", "unknown preset 'tiny-ppomv'; did you mean"),
])
def test_a_preset_of_another_family_is_one_line(noun, preset, what, tmp_path, capsys):
    assert main(["train", noun, "--preset", preset, "--steps", "1", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"polymixer train {noun}: error: "), err
    assert what in err, err
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="is a language model"):
        preset_of("image", "tiny-pom")


@pytest.mark.parametrize("noun", [n for n, f in FAMILIES.items() if f.tiny is not None])
def test_help_shows_every_default_and_no_empty_default(noun, capsys):
    with pytest.raises(SystemExit):
        main(["train", noun, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text and "(default: False)" not in text and not re.search(r"\bM_[A-Z]", text)
    for flag in ("--steps", "--lr", "--warmup", "--batch-size", "--seed"):
        assert flag in text
    assert "peak learning rate, reached after the warm-up (default:" in text
    assert f"(default: {FAMILIES[noun].tiny})" in text and "--no-data-check" in text


def test_the_loop_draws_training_curves_and_says_when_the_run_is_all_warm_up(tmp_path, capsys):
    from polymixer.experiments.train import loop

    class Toy:
        unit = "ex"

        def batch(self, step, share, shares, device):
            g = torch.Generator().manual_seed(step)
            return torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)

        def count(self, batch):
            return 8

        def loss(self, model, batch):
            return torch.nn.functional.mse_loss(model(batch[0]), batch[1])

        def evaluate(self, model, step, out_dir):
            return {"mse": float(step)}

    cfg = loop.TrainConfig(steps=6, batch_size=8, warmup=10, eval_every=3, ckpt_every=100, log_every=1,
                           out=str(tmp_path / "run"))
    loop.train(torch.nn.Linear(4, 1), Toy(), cfg, {"family": "toy", "model": {}})
    out = capsys.readouterr().out
    assert "steps (6) ≤ warmup (10)" in out and "step 3: evaluating" in out
    png = tmp_path / "run" / "curves.png"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert [r["eval_mse"] for r in history if "eval_mse" in r] == [3.0, 6.0]
    for name in ("history.json", "curves.png"):  # every file the project writes follows the umask (mkstemp: 0600)
        assert stat.S_IMODE(os.stat(tmp_path / "run" / name).st_mode) == 0o666 & ~_umask(), name
    # polymixer plot overlays runs
    loop.train(torch.nn.Linear(4, 1), Toy(), loop.TrainConfig(**{**vars(cfg), "out": str(tmp_path / "run2"),
                                                                 "curves": False}), {"family": "toy", "model": {}})
    assert not (tmp_path / "run2" / "curves.png").exists()
    assert main(["plot", str(tmp_path / "run"), str(tmp_path / "run2"), "--out", str(tmp_path / "both.png")]) == 0
    assert (tmp_path / "both.png").stat().st_size > 10_000
    assert main(["plot", str(tmp_path / "nothing")]) == 2
    assert "history.json" in capsys.readouterr().err


def test_weight_files_are_readable_by_others_and_a_skipped_checkpoint_warns_in_one_line(tmp_path):
    model = torch.nn.Linear(2, 2)
    for step in (1, 2):
        ck = save_checkpoint(tmp_path / "run", step, model, {"family": "toy", "model": {}})
    mode = 0o666 & ~_umask()
    for f in ck.iterdir():
        assert stat.S_IMODE(os.stat(f).st_mode) == mode, f
    (ck / "model.safetensors").write_bytes(b"garbage")
    code = ("from polymixer.experiments.cli import install_warning_format\ninstall_warning_format()\n"
            "from polymixer.checkpoint import resolve_checkpoint\n"
            f"print(resolve_checkpoint({str(tmp_path / 'run')!r}).name)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    warning = [line for line in res.stderr.splitlines() if "skipping checkpoint" in line]
    assert res.stdout.strip() == "step_00000001", res.stderr
    assert warning == [warning[0]] and warning[0].startswith("polymixer: warning: skipping checkpoint step_00000002")
    assert "resolve_checkpoint" not in res.stderr.replace(code, "")  # no source line of polymixer's


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_a_bench_on_a_busy_machine_says_so():
    from polymixer.experiments.bench.common import MachineLoad

    with MachineLoad() as load:
        sum(i * i for i in range(200_000))
    load.load_before, load.other_share = 0.0, 0.02
    assert load.warning() is None
    load.other_share = 0.6
    assert "other processes used 60% of the machine's CPU time" in load.warning()
    load.other_share, load.load_before = 0.0, 4.0 * (os.cpu_count() or 1)
    assert "load average was" in load.warning() and "not trustworthy" in load.warning()
