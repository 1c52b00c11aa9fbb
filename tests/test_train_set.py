"""``polymixer train <family> --set FIELD=VALUE``: every field of every family's model config is reachable from the
command line (a test walks the dataclasses' fields), converted by the field's type with the one converter the benches'
``preset+field=value`` variants share; an unknown field or a value that does not convert is one line and exit status
2; a real tiny run saves the fields it was given, and a resumed run takes ``--set`` as it takes the flags."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from polymixer.checkpoint import read_config
from polymixer.experiments.bench.common import parse_variant
from polymixer.experiments.cli import build_parser, main
from polymixer.experiments.tasks.common import config_overrides, convert_field, format_field
from polymixer.families import FAMILIES
from polymixer.models import list_models, model_config
from polymixer.models.registry import family_config

TRAIN_FAMILIES = [name for name, fam in FAMILIES.items() if fam.tiny is not None]


@pytest.fixture(scope="module")
def parser():
    return build_parser()


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("family", TRAIN_FAMILIES)
def test_every_field_of_every_preset_is_settable(family, parser):
    """Each preset of the family, each field of its config: ``--set field=<the preset's value, as text>`` parses
    through ``polymixer train <family>``'s own parser into a config holding that value, of the field's type."""
    presets = list_models(family=family)
    assert presets and TRAIN_FAMILIES == ["lm", "image", "ocr", "eo", "points"]
    for preset in presets:
        config = model_config(preset)
        for field in dataclasses.fields(config):
            value = getattr(config, field.name)
            text = f"{field.name}={format_field(value)}"
            args = parser.parse_args(["train", family, "--preset", preset, "--set", text])
            overrides = config_overrides(family, args.preset, args.set_fields)
            assert overrides == {field.name: value}, (preset, text)
            assert getattr(model_config(preset, **overrides), field.name) == value, (preset, text)


@pytest.mark.parametrize("family, sets, expected", [
    ("lm", ["n_layer=1", "expand=1.5", "bias=false", "mixer=PV", "value_dim=16", "position=none", "n_layer=2"],
     dict(n_layer=2, expand=1.5, bias=False, mixer="PV", value_dim=16, position="none")),
    ("image", ["learn_sigma=1", "input_size=16", "value_dim=none"], dict(learn_sigma=True, input_size=16,
                                                                         value_dim=None)),
    ("ocr", ["stem_channels=8,16,32", "norm_eps=1e-5"], dict(stem_channels=(8, 16, 32), norm_eps=1e-5)),
    ("eo", ["date_rope=yes", "hybrid_pom=temporal", "local_days=7"], dict(date_rope=True, hybrid_pom="temporal",
                                                                           local_days=7)),
    ("points", ["enc_depths=1,1", "enc_channels=8,16", "enc_heads=1,2", "dec_depths=1", "dec_channels=8",
                "dec_heads=1", "orders=z,hilbert", "pom_patch_size=64,scene", "patch_size=none"],
     dict(enc_depths=(1, 1), enc_channels=(8, 16), enc_heads=(1, 2), dec_depths=(1,), dec_channels=(8,),
          dec_heads=(1,), orders=("z", "hilbert"), pom_patch_size=(64, None), patch_size=None)),
])
def test_set_changes_the_config(family, sets, expected, parser):
    """Values other than the preset's, of every kind: ints, floats, bools, strings, none, tuples (fixed and
    variable length, of ints and of strings; the untyped pom_patch_size's tuple with a whole-scene stage); the last
    assignment of a field wins."""
    argv = ["train", family]
    for s in sets:
        argv += ["--set", s]
    args = parser.parse_args(argv)
    overrides = config_overrides(family, args.preset, args.set_fields)
    assert overrides == expected
    config = model_config(args.preset, **overrides)
    assert {k: getattr(config, k) for k in expected} == expected


@pytest.mark.parametrize("family, old_flags, field, value, other", [
    ("lm", ["--n-layer", "2"], "n_layer", 3, "dropout"),
    ("image", ["--learn-sigma"], "learn_sigma", False, "class_dropout_prob"),
    ("ocr", ["--mixer", "attention"], "mixer", "pom", "dropout"),
    ("eo", ["--mixer", "attention"], "mixer", "pom", "dropout"),
    ("points", ["--patch-size", "scene"], "patch_size", 64, "drop_path"),
])
def test_every_train_command_passes_set_over_its_flags(family, old_flags, field, value, other, monkeypatch, tmp_path):
    """Each ``polymixer train <family>`` hands ``--set``'s fields to its training function, over the flags that set
    the same field, and the other fields it was given besides."""
    task = importlib.import_module(f"polymixer.experiments.{family}.task")
    seen = {}

    def fake_train(*args, **kw):
        seen.update(kw)
        return {"rank": 1}  # not rank 0: nothing printed

    monkeypatch.setattr(task, f"train_{family}", fake_train)
    assert main(["train", family, *old_flags, "--set", f"{field}={format_field(value)}", "--set", f"{other}=0.25",
                 "--out", str(tmp_path / "run")]) == 0
    assert seen[field] == value and seen[other] == 0.25


@pytest.mark.parametrize("family, text, message", [
    ("lm", "n_layers=4", "unknown field 'n_layers' of LMConfig; did you mean n_layer?"),
    ("lm", "n_layer=four", "n_layer of LMConfig must be an integer, got 'four'"),
    ("lm", "bias=maybe", "bias of LMConfig must be true or false, got 'maybe'"),
    ("lm", "value_dim=wide", "value_dim of LMConfig must be an integer or none, got 'wide'"),
    ("image", "hiden_size=64", "unknown field 'hiden_size' of DiTConfig; did you mean hidden_size?"),
    ("ocr", "stem_channels=8,16", "stem_channels of HTRConfig must be 3 comma-separated integers, got '8,16'"),
    ("eo", "expand=big", "expand of TSViTConfig must be a number, got 'big'"),
    ("points", "enc_depths=2,x", "enc_depths of PTv3Config must be comma-separated integers, got '2,x'"),
])
def test_a_bad_set_is_one_line_and_exit_status_2(family, text, message, tmp_path, capsys, monkeypatch):
    """Through the command line: one line naming the field (and the closest ones, or the value and the type
    expected), status 2, and nothing read or written."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("POLYMIXER_CACHE", str(cache))
    assert main(["train", family, "--set", text, "--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert _error_line(capsys) == f"polymixer train {family}: error: {message}"
    assert not (tmp_path / "run").exists() and not (cache.exists() and any(cache.iterdir()))


@pytest.mark.parametrize("family, argv, message", [
    ("lm", ["--preset", "tiny-attention", "--set", "token_shift=4"],
     "token_shift=4 is taken by no mixer of this model (attention A); it is taken by value_pom, gated_value_pom, "
     "linear_attention, based"),
    ("lm", ["--window", "32"], "window=32 is taken by no mixer of this model (pom P); it is taken by local_attention"),
    ("image", ["--preset", "tiny-sit", "--set", "degree=3"], "degree=3 is taken by no mixer of this model "
     "(attention A); it is taken by pom, value_pom, gated_value_pom"),
])
def test_a_mixer_option_no_layer_takes_is_one_line_and_exit_status_2(family, argv, message, tmp_path, capsys):
    """A setting that would change nothing (no layer of the model takes it) stops the command before it reads or
    writes anything, as any bad setting does; given at the preset's own value, or to a model with a layer that
    takes it, it passes."""
    assert main(["train", family, *argv, "--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert _error_line(capsys) == f"polymixer train {family}: error: {message}"
    assert not (tmp_path / "run").exists()
    assert config_overrides("lm", "tiny-attention", ["window=64", "mixer=LV", "token_shift=4"]) == dict(
        window=64, mixer="LV", token_shift=4)


@pytest.mark.parametrize("argv, message", [
    (["--set", "n_layer"], "argument --set: expected FIELD=VALUE (e.g. n_layer=4), got 'n_layer'"),
    (["--n-layer", "four"], "argument --n-layer: n_layer of LMConfig must be an integer, got 'four'"),
    (["--bias", "maybe"], "argument --bias: bias of LMConfig must be true or false, got 'maybe'"),
])
def test_set_without_a_value_and_a_bad_flag_are_the_parsers_errors(argv, message, capsys):
    """The form of ``--set`` and the value of a field's flag are checked by the parser: its usage, then one line."""
    with pytest.raises(SystemExit) as stop:
        main(["train", "lm", *argv])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"polymixer train lm: error: {message}"


def test_an_unknown_field_far_from_any_lists_the_fields():
    fields = "sel_heads, gate, reduction, num_classes, "  # the shared PoM settings first, then HTRConfig's own
    with pytest.raises(ValueError, match=rf"^unknown field 'zzz' of HTRConfig; its fields: {fields}"):
        config_overrides("ocr", "tiny-htr-vpom", ["zzz=1"])


@pytest.mark.parametrize("family", TRAIN_FAMILIES)
def test_help_names_every_field(family, capsys, monkeypatch):
    """``--help`` lists every field ``--set`` takes with the tiny preset's value; the language model's also has a
    flag per LMConfig field, showing that value too."""
    monkeypatch.setenv("COLUMNS", "10000")  # one line per option: no value broken at a hyphen (z-trans)
    with pytest.raises(SystemExit):
        main(["train", family, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    tiny = model_config(FAMILIES[family].tiny)
    names = [f.name for f in dataclasses.fields(family_config(family))]
    listed = ", ".join(f"{n}={format_field(getattr(tiny, n))}" for n in names)
    assert "--set FIELD=VALUE" in text and f"Its fields, with {FAMILIES[family].tiny}'s values: {listed}" in text
    if family == "lm":
        for name in names:
            assert f"--{name.replace('_', '-')} {name.upper()} override the preset's {name} (LMConfig.{name}," in text
        assert "(LMConfig.value_dim, an integer or none; tiny-pom: none)" in text
        assert "(LMConfig.bias, true or false; tiny-pom: true)" in text


def test_bench_variants_share_the_converter():
    """``preset+field=value`` converts as ``--set`` does: tuples of strings, whole scenes, and the same errors."""
    assert parse_variant("tiny-ppomv3+orders=z,hilbert+pom_patch_size=scene") == (
        "tiny-ppomv3", {"orders": ("z", "hilbert"), "pom_patch_size": None})
    with pytest.raises(ValueError, match=r"^variant 'tiny-pom\+n_layr=2': unknown field 'n_layr' of LMConfig; did "
                                         r"you mean n_layer\?$"):
        parse_variant("tiny-pom+n_layr=2")
    with pytest.raises(ValueError, match="bias of LMConfig must be true or false, got 'maybe'"):
        parse_variant("tiny-pom+bias=maybe")
    assert convert_field(family_config("points"), "pom_patch_size", "patch") == "patch"


@pytest.mark.usefixtures("polymixer_cache")
def test_a_tiny_run_saves_the_set_fields_and_resumes_by_them(tmp_path, corpus_dir, capsys):
    """A real run through the command line: the checkpoint's config holds the fields ``--set`` gave. On resume
    ``--set`` is a model override like any flag: the same values continue the run, other ones are refused with the
    differences listed."""
    out = tmp_path / "run"
    sets = ["--set", "n_layer=1", "--set", "n_embd=32", "--set", "n_head=2", "--set", "sel_heads=2",
            "--set", "block_size=32", "--set", "bias=false"]
    common = ["train", "lm", "--preset", "tiny-pom", "--data", str(corpus_dir), "--batch-size", "2",
              "--eval-every", "100", "--ckpt-every", "2", "--eval-windows", "4", "--out", str(out), "--quiet"]
    assert main([*common, "--steps", "2", *sets]) == 0
    model = read_config(out)["model"]
    assert (model["n_layer"], model["n_embd"], model["n_head"], model["block_size"], model["bias"]) == (
        1, 32, 2, 32, False)
    capsys.readouterr()
    assert main([*common, "--steps", "4", *sets, "--set", "n_layer=2"]) == 2
    err = _error_line(capsys)
    assert "cannot resume from" in err and "n_layer: checkpoint 1 vs now 2" in err, err
    assert main([*common, "--steps", "4", *sets]) == 0
    assert read_config(out)["step"] == 4 and read_config(out)["model"]["n_layer"] == 1
