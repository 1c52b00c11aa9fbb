"""The commands as a new user types them: a bad option is one line naming it and its allowed range, before any data
is read; a folder that is not a dataset says so (no hint to skip bad samples, which cannot help); text that is not
UTF-8 is named with its file and byte; the README's `polymixer` is on the PATH once the venv is activated."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from polymixer.experiments.cli import main
from polymixer.experiments.lm import data as lm_data
from polymixer.experiments.data.faults import SampleError, merge_bad

ROOT = Path(__file__).resolve().parents[1]


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    return err[-1] if err else ""


@pytest.mark.parametrize("family", ["lm", "ocr", "image", "eo", "points"])
@pytest.mark.parametrize("option, value, message", [
    ("--steps", "-1", "steps (--steps) must be ≥ 1, got -1"),
    ("--batch-size", "0", "batch_size (--batch-size) must be ≥ 1, got 0"),
    ("--batch-size", "-4", "batch_size (--batch-size) must be ≥ 1, got -4"),
    ("--lr", "-0.1", "lr (--lr) must be > 0, got -0.1"),
    ("--ema", "1", "ema (--ema) must be in [0, 1), got 1.0"),
])
def test_a_training_option_out_of_range_stops_before_any_data(family, option, value, message, tmp_path, capsys,
                                                              monkeypatch):
    """Every family: exit 2 with one line naming the option and its range, and nothing read or generated (the
    offline default's cache stays empty) — not a NaN run that writes an untrained checkpoint, nor a traceback."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("POLYMIXER_CACHE", str(cache))
    assert main(["train", family, option, value, "--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert _error_line(capsys) == f"polymixer train {family}: error: {message}"
    assert not (tmp_path / "run").exists() and not (cache.exists() and any(cache.iterdir()))


@pytest.mark.parametrize("argv, message", [
    (["train", "image", "--image-size", "0"], "argument --image-size: must be ≥ 1, got 0"),
    (["train", "image", "--set", "depth=0"], "depth must be ≥ 1, got 0"),
    (["train", "lm", "--dropout", "1.5"], "dropout must be in [0, 1), got 1.5"),
    (["train", "lm", "--n-embd", "-3"], "n_embd must be ≥ 1, got -3"),
    (["train", "ocr", "--set", "depth=0"], "depth must be ≥ 1, got 0"),
    (["train", "eo", "--max-frames", "0"], "argument --max-frames: must be ≥ 1, got 0"),
    (["train", "eo", "--set", "dim=0"], "dim must be a positive integer, got 0"),
    (["train", "points", "--set", "drop_path=1.5"], "drop_path must be in [0, 1), got 1.5"),
    (["train", "points", "--set", "enc_channels=32,0,64,96,128"], "enc_channels[1] must be ≥ 1, got 0"),
])
def test_a_model_option_out_of_range_stops_before_any_data(argv, message, tmp_path, capsys, monkeypatch):
    """A model config's field (a family flag or --set) is checked against the range its config declares when the
    command starts: one line naming it, exit 2, no data generated — not a run that trains a 0-layer model."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("POLYMIXER_CACHE", str(cache))
    try:
        status = main(argv + ["--out", str(tmp_path / "run"), "--quiet"])
    except SystemExit as stop:  # the parser's own refusal
        status = stop.code
    assert status == 2
    assert _error_line(capsys).endswith(f"error: {message}")
    assert not (tmp_path / "run").exists() and not (cache.exists() and any(cache.iterdir()))


@pytest.mark.parametrize("argv, option, message", [
    (["train", "ocr", "--max-lines", "0"], "--max-lines", "must be ≥ 1, got 0"),
    (["train", "ocr", "--eval-limit", "-5"], "--eval-limit", "must be ≥ 1, got -5"),
    (["train", "points", "--lovasz", "-1"], "--lovasz", "must be ≥ 0, got -1"),
    (["train", "points", "--max-points", "-1"], "--max-points", "must be ≥ 0, got -1"),
    (["train", "image", "--eval-samples", "-1"], "--eval-samples", "must be ≥ 0, got -1"),
    (["train", "eo", "--eval-limit", "0"], "--eval-limit", "must be ≥ 1, got 0"),

    (["eval", "lm", "--ckpt", "nowhere", "--windows", "0"], "--windows", "must be ≥ 1, got 0"),
    (["eval", "lm", "--ckpt", "nowhere", "--lengths", "0"], "--lengths", "must be > 0, got 0"),
    (["generate", "--ckpt", "nowhere", "--top-p", "1.5"], "--top-p", "must be in (0, 1], got 1.5"),
    (["generate", "--ckpt", "nowhere", "--max-new-tokens", "x"], "--max-new-tokens",
     "must be an integer ≥ 1, got 'x'"),
    (["train", "lm", "--val-fraction", "1"], "--val-fraction", "must be in (0, 1), got 1"),
    (["generate", "--ckpt", "nowhere", "--seed", "-1"], "--seed", "must be ≥ 0, got -1"),
    (["sample", "--ckpt", "nowhere", "--steps", "0"], "--steps", "must be ≥ 1, got 0"),
    (["sample", "--ckpt", "nowhere", "--cfg", "-1"], "--cfg", "must be ≥ 0, got -1"),
    (["eval", "image", "--ckpt", "nowhere", "--n", "0"], "--n", "must be ≥ 1, got 0"),
    (["eval", "eo", "--ckpt", "nowhere", "--fold", "7"], "--fold", "invalid choice: 7 (choose from 1, 2, 3, 4, 5)"),
    (["eval", "eo", "--ckpt", "nowhere", "--batch", "0"], "--batch", "must be ≥ 1, got 0"),
    (["eval", "ocr", "--ckpt", "nowhere", "--samples", "-1"], "--samples", "must be ≥ 0, got -1"),
    (["eval", "points", "--ckpt", "nowhere", "--limit", "0"], "--limit", "must be ≥ 1, got 0"),
    (["read", "--ckpt", "nowhere", "x.png", "--batch", "0"], "--batch", "must be ≥ 1, got 0"),
    (["distill", "lm", "--teacher", "nowhere", "--kl-temperature", "0"], "--kl-temperature", "must be > 0, got 0"),
    (["distill", "lm", "--teacher", "nowhere", "--stage1-steps", "-1"], "--stage1-steps", "must be ≥ 0, got -1"),
    (["bench", "lm", "--quality-steps", "0"], "--quality-steps", "must be ≥ 1, got 0"),
    (["bench", "image", "--heldout", "1"], "--heldout", "must be in [0, 1), got 1"),
    (["bench", "ocr", "--sam-rho", "-1"], "--sam-rho", "must be ≥ 0, got -1"),
    (["bench", "eo", "--lrs", "0"], "--lrs", "must be > 0, got 0"),
    (["bench", "points", "--seed", "-1"], "--seed", "must be ≥ 0, got -1"),
    (["bench", "recall", "--lr", "0"], "--lr", "must be > 0, got 0"),
    (["bench", "distill", "--budget", "0"], "--budget", "must be > 0, got 0"),
])
def test_an_evaluation_option_out_of_range_is_the_parsers_one_line_error(argv, option, message, capsys):
    """Options outside the training config (evaluation, generation, sampling, distillation, the benches) are the
    parser's one-line errors naming the option and its range."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert _error_line(capsys).endswith(f"error: argument {option}: {message}")


def test_a_folder_that_is_no_dataset_says_so_in_words(tmp_path, capsys):
    """An empty --data folder (language model) and a folder without the line-dataset layout (OCR): the folder and
    what it lacks, whole — no path cut out of the sentence, and no hint to skip bad samples."""
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["train", "lm", "--data", str(empty), "--steps", "1", "--out", str(tmp_path / "a"), "--quiet"]) == 2
    line = _error_line(capsys)
    assert line == (f"polymixer train lm: error: {empty}: no text files here (binary and hidden files are skipped): "
                    f"give --data text files, or folders that hold some")
    assert main(["train", "ocr", "--data", str(empty), "--steps", "1", "--out", str(tmp_path / "b"), "--quiet"]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"polymixer train ocr: error: {empty}: is not a line dataset: it needs a lines/ folder")
    assert "--skip-bad-samples" not in line


def test_a_path_inside_a_reason_is_kept_whole():
    """merge_bad drops a file's own name from its reasons (the line shows it first) — only as a word of its own."""
    root = "/data/set"
    assert merge_bad([(root, f"{root} has no lines: expected {root}/lines/ here")]) == \
        [(root, f"has no lines: expected {root}/lines/ here")]
    assert merge_bad([(root, f"{root}: unreadable")]) == [(root, "unreadable")]


def test_text_that_is_not_utf8_is_named_with_its_byte(tmp_path, capsys, monkeypatch):
    """Latin-1 text and UTF-16 text (a byte-order mark, or NUL bytes without one) are refused before training with
    the file and the byte — never tokenised silently into replacement characters."""
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("def café():\n".encode("latin-1"))
    utf16 = tmp_path / "utf16.txt"
    utf16.write_bytes("def f():\n".encode("utf-16"))
    bare16 = tmp_path / "bare16.txt"
    bare16.write_bytes("def f():\n".encode("utf-16-le"))
    good = tmp_path / "good.txt"
    good.write_text("def café():\n    return 1\n", encoding="utf-8")
    assert lm_data.text_problem(good.read_bytes()) is None
    assert lm_data.text_problem(latin1.read_bytes()).startswith("not UTF-8 text: byte 7 (invalid continuation byte)")
    assert lm_data.text_problem(utf16.read_bytes()).startswith("not UTF-8 text: byte 0")
    assert lm_data.text_problem(bare16.read_bytes()).startswith("a NUL byte at byte 1: binary, or UTF-16")
    bad = lm_data.check_data([latin1, utf16, good], progress=False)
    assert [Path(p).name for p, _ in bad] == ["latin1.txt", "utf16.txt"]
    with pytest.raises(SampleError, match="latin1.txt: not UTF-8 text: byte 7"):  # the loader, without the check
        lm_data.prepare_corpus([latin1, good], cache_dir=tmp_path / "cache", progress=False)
    args = ["train", "lm", "--data", str(latin1), str(good), "--steps", "1", "--out", str(tmp_path / "r"), "--quiet"]
    assert main(args) == 2
    assert "latin1.txt: not UTF-8 text: byte 7" in capsys.readouterr().err


def test_a_character_split_across_decoded_slices_is_text(monkeypatch):
    """The check decodes in slices: a multi-byte character across a slice boundary is fine, and a bad byte after
    one is found at its offset in the file."""
    monkeypatch.setattr(lm_data, "TEXT_SLICE", 4)
    data = "abcé€x".encode("utf-8")  # é spans bytes 3-4, € bytes 5-7
    assert lm_data.text_problem(data) is None
    assert lm_data.text_problem(data + b"\xff").startswith(f"not UTF-8 text: byte {len(data)} ")


def test_the_readme_activates_the_venv_before_its_bare_commands():
    """After the two set-up commands (which call .venv/bin/…), the README's command-line examples use a bare
    `polymixer`: it says to activate the venv first."""
    text = (ROOT / "README.md").read_text()
    first_bare = re.search(r"^polymixer ", text, flags=re.M)
    assert first_bare is not None
    assert "source .venv/bin/activate" in text[:first_bare.start()]


def test_the_quick_speed_figure_shows_what_was_measured_and_its_threads(tmp_path, monkeypatch):
    """`bench mixer --quick` times the forward only: its figure has that one panel (no empty forward + backward or
    memory panels), and its title, wrapped to that panel's width, says the threads the timings ran with (one on a
    busy machine)."""
    import json

    from polymixer.experiments.bench import mixer as bench_mixer

    payload = json.loads((ROOT / "docs" / "bench" / "quick" / "mixer.json").read_text())
    payload["threads"] = 1
    figures = []
    monkeypatch.setattr(bench_mixer, "save_figure", lambda fig, path: figures.append(fig))
    bench_mixer.plot(payload, tmp_path / "mixer.png")
    (fig,) = figures
    assert [ax.get_title() for ax in fig.axes] == ["forward"]
    title = fig._suptitle.get_text()
    assert ", 1 thread, torch 2.13" in " ".join(title.split())
    # wrapped to the one panel's width: no line of the title wider than the figure
    assert max(map(len, title.splitlines())) * 0.55 * fig._suptitle.get_fontsize() <= fig.get_figwidth() * 72


def test_every_declared_range_of_every_model_config_is_checked():
    """Each field a family config declares in RANGES refuses a value below its range with one line naming it
    (tuples per entry), at the config's construction."""
    from polymixer.families import FAMILIES
    from polymixer.models.registry import family_config, model_config
    from polymixer.ranges import Range

    checked = 0
    for name, fam in FAMILIES.items():
        cls = family_config(name)
        base = vars(model_config(fam.tiny)) if fam.tiny else {}
        for field, allowed in getattr(cls, "RANGES", {}).items():
            assert isinstance(allowed, Range) and allowed.low is not None, (cls.__name__, field)
            bad = allowed.low if allowed.low_open else allowed.low - 1
            value = base.get(field)
            value = tuple(bad for _ in value) if isinstance(value, tuple) else bad
            with pytest.raises(ValueError, match=rf"^{field}(\[0\])? must be "):
                cls(**{**base, field: value})
            checked += 1
    assert checked >= 40  # image, lm and points declare theirs


def test_version_prints_the_one_version(capsys):
    """`polymixer --version` prints the installed version, which pyproject.toml reads from polymixer.__version__."""
    import tomllib

    import polymixer

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out == f"polymixer {polymixer.__version__}\n"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "polymixer.__version__"}


def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv + ["--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def test_help_shows_examples_where_outputs_go_and_the_docs(capsys, monkeypatch):
    """`polymixer --help` ends with example commands, where runs, benches and the cache go, and the guides; each
    family's train command with an example run and its guide. Every file named there exists."""
    monkeypatch.setenv("COLUMNS", "120")
    text = _help([], capsys)
    for part in ("examples:", "polymixer bench mixer --quick", "polymixer train lm --preset tiny-pom",
                 "polymixer eval lm --ckpt", "polymixer plot", "where outputs go", "runs/<family>/<preset>/",
                 "runs/bench/<bench>/", "~/.cache/polymixer/", "POLYMIXER_CACHE", "README.md", "docs/<family>.md"):
        assert part in text, part
    for doc in re.findall(r"docs/[a-z]+\.md", text):
        assert (ROOT / doc).is_file(), doc
    from polymixer.experiments.registry import trainable
    from polymixer.families import FAMILIES

    for family in trainable():
        text = _help(["train", family], capsys)
        assert f"example:\n  polymixer train {family} --preset {FAMILIES[family].tiny} --steps 200" in text
        assert f"guide: docs/{family}.md" in text and (ROOT / "docs" / f"{family}.md").is_file()


@pytest.mark.parametrize("family, preset, field", [
    ("lm", "tiny-hybrid", "mixer"), ("lm", "tiny-vpom", "mixer"), ("ocr", "tiny-htr-vt", "mixer"),
    ("eo", "tiny-tsvit", "mixer"), ("points", "tiny-ptv3", "mixer"), ("image", "tiny-sit", "mixer"),
])
def test_help_shows_the_values_of_the_preset_named_before_it(family, preset, field, capsys):
    """`train <family> --preset P --help` shows P's values (the model fields' flags, --set's list), not the tiny
    preset's; a preset of another family falls back to the family's own (the command refuses it when run)."""
    from polymixer.experiments.tasks.common import format_field
    from polymixer.families import FAMILIES
    from polymixer.models import model_config

    tiny = FAMILIES[family].tiny
    mine, theirs = (format_field(getattr(model_config(p), field)) for p in (preset, tiny))
    assert mine != theirs  # the case tells the presets apart
    text = " ".join(_help(["train", family, "--preset", preset], capsys).split())
    assert f"this help shows {preset}'s values" in text
    assert f"with {preset}'s values:" in text and f" {field}={mine}," in text
    if family == "lm":
        assert f"{preset}: {mine})" in text and f"{tiny}: " not in text
    other = "tiny-sit" if family != "image" else "tiny-pom"
    assert f"this help shows {tiny}'s values" in " ".join(_help(["train", family, "--preset", other], capsys).split())


@pytest.mark.parametrize("argv, message", [
    # every rate and count of the shared loop, at and past its bound
    (["train", "lm", "--lr", "0"], "lr (--lr) must be > 0, got 0.0"),
    (["train", "ocr", "--lr", "nan"], "lr (--lr) must be a finite number > 0, got nan"),
    (["train", "eo", "--lr", "inf"], "lr (--lr) must be a finite number > 0, got inf"),
    (["train", "lm", "--min-lr", "-0.00001"], "min_lr (--min-lr) must be ≥ 0, got -1e-05"),
    (["train", "image", "--lr", "1e-4", "--min-lr", "1e-3"], "min_lr (--min-lr) must be ≤ lr (--lr) = 0.0001, "
     "got 0.001: the rate decays from lr down to min_lr; give a lower --min-lr with it"),
    (["train", "points", "--warmup", "-1"], "warmup (--warmup) must be ≥ 0, got -1"),
    (["train", "lm", "--weight-decay", "-0.1"], "weight_decay (--weight-decay) must be ≥ 0, got -0.1"),
    (["train", "lm", "--beta2", "1"], "beta2 (--beta2) must be in [0, 1), got 1.0"),
    (["train", "ocr", "--grad-clip", "-1"], "grad_clip (--grad-clip) must be ≥ 0, got -1.0"),
    (["train", "image", "--ema", "-0.5"], "ema (--ema) must be in [0, 1), got -0.5"),
    (["train", "ocr", "--sam-rho", "-0.05"], "sam_rho (--sam-rho) must be ≥ 0, got -0.05"),
    (["train", "lm", "--grad-accum", "0"], "grad_accum (--grad-accum) must be ≥ 1, got 0"),
    (["train", "lm", "--eval-every", "0"], "eval_every (--eval-every) must be ≥ 1, got 0"),
    (["train", "lm", "--ckpt-every", "0"], "ckpt_every (--ckpt-every) must be ≥ 1, got 0"),
    (["train", "lm", "--keep", "0"], "keep (--keep) must be ≥ 1, got 0"),
    (["train", "lm", "--log-every", "0"], "log_every (--log-every) must be ≥ 1, got 0"),
    (["train", "lm", "--seed", "-1"], "seed (--seed) must be ≥ 0, got -1"),
    (["train", "lm", "--max-nonfinite", "0"], "max_nonfinite (--max-nonfinite) must be ≥ 1, got 0"),
    (["train", "lm", "--stop-after", "0"], "stop_after (--stop-after) must be ≥ 1, got 0"),
    (["train", "lm", "--context-parallel", "0"], "context_parallel (--context-parallel) must be ≥ 1, got 0"),
    (["train", "lm", "--dist-timeout", "0"], "dist_timeout (--dist-timeout) must be > 0, got 0.0"),
    # the model fields every family shares, through flags and --set
    (["train", "lm", "--dropout", "-0.1"], "dropout must be in [0, 1), got -0.1"),
    (["train", "ocr", "--set", "dropout=1"], "dropout must be in [0, 1), got 1.0"),
    (["train", "eo", "--set", "dropout=nan"], "dropout must be a finite number in [0, 1), got nan"),
    (["train", "points", "--set", "drop_path=-0.1"], "drop_path must be in [0, 1), got -0.1"),
    (["train", "ocr", "--set", "expand=0"], "expand must be > 0, got 0.0"),
    (["train", "eo", "--set", "mlp_ratio=-4"], "mlp_ratio must be ≥ 0, got -4.0"),
    (["train", "ocr", "--set", "degree=0"], "degree must be ≥ 1, got 0"),
    (["train", "eo", "--set", "value_heads=0"], "value_heads must be ≥ 1, got 0"),
    (["train", "ocr", "--set", "norm_eps=0"], "norm_eps must be > 0, got 0.0"),
    (["train", "ocr", "--set", "stem_channels=64,0,128"], "stem_channels[1] must be ≥ 1, got 0"),
    (["train", "ocr", "--set", "mask_ratio=1"], "mask_ratio must be in [0, 1), got 1.0"),
    (["train", "image", "--set", "class_dropout_prob=1"], "class_dropout_prob must be in [0, 1), got 1.0"),
    (["train", "points", "--set", "bn_momentum=2"], "bn_momentum must be in [0, 1], got 2.0"),
])
def test_every_rate_and_count_out_of_range_is_one_line_before_anything_is_written(argv, message, tmp_path, capsys,
                                                                                 monkeypatch):
    """A table of bad values, each through the command line: exit status 2, one line `polymixer train <family>:
    error: <option> must be <range>, got <value>`, and nothing written — no run folder, no dataset generated."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("POLYMIXER_CACHE", str(cache))
    assert main(argv + ["--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"polymixer {argv[0]} {argv[1]}: error: {message}"]
    assert not (tmp_path / "run").exists() and not (cache.exists() and any(cache.iterdir()))


def test_every_numeric_setting_has_a_range():
    """Every number of the shared loop's TrainConfig is in TRAIN_RANGES, and every number of every family's model
    config (ints, floats, their optional and tuple forms) refuses -1 and NaN with one line naming it."""
    import dataclasses
    import math
    import typing

    from polymixer.experiments.train.loop import TRAIN_RANGES, TrainConfig
    from polymixer.families import FAMILIES
    from polymixer.models import list_models
    from polymixer.models.registry import family_config, model_config

    def numeric(hint) -> bool:
        args = typing.get_args(hint)
        return hint in (int, float) or any(a in (int, float) for a in args)

    hints = typing.get_type_hints(TrainConfig)
    assert {f.name for f in dataclasses.fields(TrainConfig) if numeric(hints[f.name])} == set(TRAIN_RANGES)
    checked = 0
    for name, fam in FAMILIES.items():
        cls = family_config(name)
        base = vars(model_config(fam.tiny or list_models(family=name)[0]))
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if not numeric(hints[f.name]):
                continue
            for bad in (-1, math.nan):
                value = tuple(bad for _ in base[f.name]) if isinstance(base[f.name], tuple) else bad
                with pytest.raises(ValueError, match=rf"^{f.name}\b"):
                    cls(**{**base, f.name: value})
            checked += 1
    assert checked >= 90
