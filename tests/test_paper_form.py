"""The paper's PoM form as settings: the gate's width (``sel_heads``), its function (``gate``) and the aggregation
(``reduction``) are fields of every family's config that reach every PoM layer through ``--set``; bad values stop the
command in one line; each family has the paper's form as a preset (``tiny-*-paper``, or its PoM preset where that
already is the paper's form) that builds, runs and keeps attention's parameter budget."""

from __future__ import annotations

import pytest
import torch

from polymixer import PoM
from polymixer.blocks import PoMSettings
from polymixer.experiments.cli import main
from polymixer.experiments.tasks.common import config_overrides
from polymixer.models import count_parameters, create_model, list_models
from polymixer.models.registry import family_config

# PoM presets of every family (the value PoM's too), and each family's attention
POM_PRESETS = [("lm", "tiny-pom"), ("lm", "tiny-vpom"), ("image", "tiny-sipom"), ("ocr", "tiny-htr-vpom"),
               ("eo", "tiny-tsvipom"), ("points", "tiny-ppomv3"), ("recall", "mqar-pom"), ("recall", "mqar-vpom")]
ATTENTION = {"lm": "tiny-attention", "image": "tiny-sit", "ocr": "tiny-htr-vt", "eo": "tiny-tsvit",
             "points": "tiny-ptv3"}
# the paper's form in every family: its PoM and (where the paper has one) its hybrid
PAPER = {"lm": ("tiny-pom-paper", "tiny-hybrid-paper"), "ocr": ("tiny-htr-vpom-paper", "tiny-htr-vpom-hybrid-paper"),
         "eo": ("tiny-tsvipom-paper", "tiny-tsvipom-hybrid-paper"), "image": ("tiny-sipom",),
         "points": ("tiny-ppomv3", "tiny-ppomv3-hybrid")}


def _poms(model: torch.nn.Module):
    layers = [m for m in model.modules() if isinstance(m, PoM)]
    assert layers
    return layers


def test_every_family_config_has_the_pom_settings_among_its_mixer_options():
    for family in ("lm", "image", "ocr", "eo", "points", "recall"):
        cls = family_config(family)
        assert issubclass(cls, PoMSettings), family
        assert {"sel_heads", "gate", "reduction"} <= set(cls.MIXER_OPTIONS), family


@pytest.mark.parametrize("family, preset", POM_PRESETS)
def test_set_reaches_every_pom_layer(family, preset):
    """``--set gate=sigmoid --set reduction=sum --set sel_heads=2`` as the command line parses it: every PoM layer of
    the model built from those overrides has them (2 gate scalars, the sigmoid, the sum)."""
    overrides = config_overrides(family, preset, ["gate=sigmoid", "reduction=sum", "sel_heads=2"])
    assert overrides == {"gate": "sigmoid", "reduction": "sum", "sel_heads": 2}
    model = create_model(preset, device="meta", **overrides)
    for layer in _poms(model):
        assert (layer.gate, layer.reduction, layer.sel_heads, layer.gate_dim) == ("sigmoid", "sum", 2, 2)
    # and the presets' own values where nothing is set: the reference's hard sigmoid and mean
    for layer in _poms(create_model(preset, device="meta")):
        assert (layer.gate, layer.reduction) == ("hardsigmoid", "mean")


def test_the_settings_change_what_the_model_computes():
    """The gate function and the aggregation reach the op: the same weights give another output under each."""
    small = dict(n_layer=2, n_embd=64, n_head=2, block_size=32, vocab_size=50)
    idx = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    outs = {}
    for form in ({}, {"gate": "sigmoid"}, {"reduction": "sum"}):
        torch.manual_seed(0)
        model = create_model("tiny-pom-paper", **small, **form).double().eval()
        for layer in _poms(model):  # O(1) coefficients and gate biases: every term and the gate matter
            with torch.no_grad():
                layer.coeff.uniform_(-1.0, 1.0)
                layer.gate_bias.normal_()
        outs[tuple(form)] = model(idx)[0]
    assert not torch.allclose(outs[()], outs[("gate",)]) and not torch.allclose(outs[()], outs[("reduction",)])


@pytest.mark.parametrize("family, preset, sets, message", [
    ("lm", "tiny-pom", ["gate=relu"], "gate must be 'hardsigmoid' or 'sigmoid', got 'relu'"),
    ("image", "tiny-sipom", ["reduction=max"], "reduction must be 'mean' or 'sum', got 'max'"),
    ("ocr", "tiny-htr-vpom", ["sel_heads=0"], "sel_heads must be ≥ 1, got 0"),
    ("eo", "tiny-tsvipom", ["sel_heads=3"], "expand·dim = 128 is not divisible by sel_heads = 3"),
    ("points", "tiny-ptv3", ["gate=sigmoid"], "gate='sigmoid' is taken by no mixer of this model (attention A); it "
                                              "is taken by pom, value_pom, gated_value_pom"),
    ("lm", "tiny-attention", ["reduction=sum"], "reduction='sum' is taken by no mixer of this model (attention A); "
                                                "it is taken by pom, value_pom, gated_value_pom"),
])
def test_a_bad_setting_is_one_line(family, preset, sets, message):
    """A value the setting does not take, or a setting no layer of the model takes, is refused where the command
    line is parsed; a gate width that does not divide the PoM's width, where the model is built."""
    with pytest.raises(ValueError) as refused:
        create_model(preset, device="meta", **config_overrides(family, preset, sets))
    assert str(refused.value) == message


@pytest.mark.parametrize("family", ["lm", "ocr", "image", "eo", "points"])
def test_a_bad_gate_stops_the_command_before_any_data(family, tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("POLYMIXER_CACHE", str(cache))
    assert main(["train", family, "--set", "gate=tanh", "--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "error: gate must be 'hardsigmoid' or 'sigmoid', got 'tanh'")
    assert not (tmp_path / "run").exists() and not (cache.exists() and any(cache.iterdir()))


@pytest.mark.parametrize("family", sorted(PAPER))
def test_the_papers_form_is_a_preset_of_every_family(family):
    """Each paper-form preset gates every channel (gate_dim = D) with the reference's hard sigmoid and mean and has the
    paper model's positions; the new ones (D ≈ 4d/3) stay within 1% of attention's parameters (the LM's attention
    with the same learned positions: the paper's GPT-2). Image and points keep their presets' own budget rules."""
    assert set(PAPER[family]) <= set(list_models(family=family))
    base = create_model(ATTENTION[family], device="meta", **({"position": "learned"} if family == "lm" else {}))
    for name in PAPER[family]:
        model = create_model(name, device="meta")
        for layer in _poms(model):
            assert (layer.sel_heads, layer.gate_dim, layer.gate, layer.reduction) == (
                1, layer.poly_dim, "hardsigmoid", "mean"), name
        c = model.config
        assert {"lm": getattr(c, "position", None) == "learned", "image": getattr(c, "position", None) == "sincos",
                "ocr": getattr(c, "position", None) == "grid", "eo": getattr(c, "spatial_position", None) == "learned",
                "points": getattr(c, "cpe_kernel", 0) == 3}[family], name
        if name.endswith("-paper"):
            assert abs(count_parameters(model) / count_parameters(base) - 1) < 0.01, name


def test_the_papers_form_presets_run_a_forward_in_every_family():
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    logits, _ = create_model("tiny-pom-paper", n_layer=2).eval()(torch.randint(0, 257, (2, 16), generator=g))
    assert logits.shape == (2, 16, 257) and torch.isfinite(logits).all()
    for name in PAPER["ocr"]:
        out = create_model(name, depth=2).eval()(torch.randn(2, 1, 32, 64, generator=g))
        out = out[0] if isinstance(out, tuple) else out
        assert torch.isfinite(out).all()
    for name in PAPER["eo"]:
        model = create_model(name, image_size=8, num_classes=5).eval()
        y = model(torch.randn(2, 3, 8, 8, 10, generator=g), torch.tensor([[10, 50, 200]] * 2))
        assert y.shape[:2] == (2, 5) and torch.isfinite(y).all()
    image = create_model("tiny-sipom", depth=2).eval()
    y = image(torch.randn(2, 1, 16, 16, generator=g), torch.rand(2, generator=g), torch.tensor([1, 2]))
    assert y.shape == (2, 1, 16, 16) and torch.isfinite(y).all()
