"""One class per mixer in polymixer.layers: PoM, ValuePoM, GatedValuePoM, Attention and LocalAttention.

Each class builds from its own arguments and only from them (``PoM(value_dim=…)`` and ``Attention(window=…)`` are
refused: ValuePoM and LocalAttention are the way); the mixer table builds the right class per letter; and the state
dicts keep the names and shapes of the checkpoints saved before the split.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import polymixer
from polymixer import Attention, GatedValuePoM, LocalAttention, PoM, PoMState, ValuePoM
from polymixer.blocks import mixer_spec

from conftest import assert_close

# the state dicts of today's checkpoints (names and shapes, saved by the single PoM / Attention classes before the
# split): PoM(8, degree=3, sel_heads=2, bias=True), PoM(8, value_dim=8, heads=2, token_shift=4),
# PoM(8, value_dim=8, heads=2, decay="head", degree=3) and Attention(8, heads=2, window=3, token_shift=2)
SAVED_LAYOUTS = {
    "pom": {"in_proj.weight": (18, 8), "gate_bias": (2,), "coeff": (16, 3), "out_proj.weight": (8, 16),
            "out_proj.bias": (8,)},
    "value": {"in_proj.weight": (48, 8), "gate_bias": (8,), "coeff": (16, 2), "coeff_q": (16, 2),
              "norm_weight": (8,), "shift": (4, 24), "out_proj.weight": (8, 8)},
    "gated": {"in_proj.weight": (48, 8), "gate_bias": (8,), "coeff": (16, 3), "coeff_q": (16, 3),
              "norm_weight": (8,), "shift": (2, 24), "out_proj.weight": (8, 8), "decay_proj.weight": (2, 8),
              "decay_proj.bias": (2,)},
    "local": {"qkv.weight": (24, 8), "qkv.bias": (24,), "proj.weight": (8, 8), "proj.bias": (8,), "shift": (2, 16)},
}
OWN = {  # name: the mixer of that checkpoint, built by its own class
    "pom": lambda: PoM(8, degree=3, sel_heads=2, bias=True),
    "value": lambda: ValuePoM(8, heads=2, token_shift=4),
    "gated": lambda: GatedValuePoM(8, degree=3, value_dim=8, heads=2),
    "local": lambda: LocalAttention(8, 3, heads=2, token_shift=2),
}
CLASSES = {"pom": PoM, "value": ValuePoM, "gated": GatedValuePoM, "local": LocalAttention}


def _seeded(make, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return make().double()


def _outputs(m: torch.nn.Module) -> list:
    """Outputs in full, causal and streaming (two chunks) modes on a fixed input."""
    x = torch.randn(2, 9, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    state = m.init_state(2, dtype=torch.float64)
    y1, state = m.step(x[:, :4], state)
    y2, _ = m.step(x[:, 4:], state)
    return [m(x), m(x, causal=True), y1, y2]


def test_each_class_builds_from_its_own_arguments():
    assert type(PoM(16, degree=3, expand=1)) is PoM and PoM(16).value_dim is None
    v = ValuePoM(16, heads=2)
    assert type(v) is ValuePoM and (v.value_dim, v.heads, v.shift_width, v.decay) == (16, 2, 2, None)
    assert ValuePoM(16, value_dim=8, token_shift=False).state_floats == 32 * 8
    g = GatedValuePoM(16, heads=4)
    assert type(g) is GatedValuePoM and g.decay == "head" and g.decay_proj.weight.shape == (4, 16)
    la = LocalAttention(16, 4, heads=2)
    assert type(la) is LocalAttention and la.window == 4 and not la.causal
    assert type(Attention(16, heads=2)) is Attention and Attention(16, heads=2).window is None
    for m in (v, g):
        assert isinstance(m, PoM)  # every PoM class is a PoM
    assert isinstance(la, Attention)


def test_one_way_to_build_each_class():
    """The short forms are gone: a plain PoM takes no value keyword (its token shift is its own, on W_h c:
    tests/test_pom_shift.py), Attention no window (its 4th argument on is keyword-only, so a window by position is
    no bias either)."""
    for kw in (dict(value_dim=8), dict(value_dim=8, decay="head"), dict(heads=2), dict(decay="head")):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{next(iter(kw))}'"):
            PoM(8, **kw)
    with pytest.raises(TypeError, match="unexpected keyword argument 'window'"):
        Attention(8, heads=2, window=4)
    with pytest.raises(TypeError, match="positional argument"):
        Attention(8, 2, False, 4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'decay'"):
        GatedValuePoM(8, decay="head")


@pytest.mark.parametrize("name", sorted(OWN))
def test_saved_checkpoints_load_into_the_new_classes(name):
    saved = _seeded(OWN[name], seed=1)
    assert type(saved) is CLASSES[name]
    assert {k: tuple(t.shape) for k, t in saved.state_dict().items()} == SAVED_LAYOUTS[name]
    fresh = _seeded(OWN[name], seed=2)
    assert not all(torch.equal(a, b) for a, b in zip(_outputs(fresh), _outputs(saved)))
    fresh.load_state_dict(saved.state_dict(), strict=True)
    for a, b in zip(_outputs(fresh), _outputs(saved)):
        assert torch.equal(a, b)


def test_copies_and_pickles_keep_the_class():
    for m in (PoM(8), ValuePoM(8, heads=2), GatedValuePoM(8, heads=2), LocalAttention(8, 3, heads=2)):
        for c in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
            assert type(c) is type(m)
            assert all(torch.equal(c.state_dict()[k], t) for k, t in m.state_dict().items())


def test_mixer_table_builds_one_class_per_mixer():
    options = dict(heads=4, causal=True, window=8, degree=3, expand=1, value_dim=16, value_heads=2)
    kinds = {"P": PoM, "V": ValuePoM, "G": GatedValuePoM, "A": Attention, "L": LocalAttention}
    for letter, cls in kinds.items():
        assert type(mixer_spec(letter).make(16, **options)) is cls, letter
    assert type(polymixer.build_mixer("local_attention", 16, heads=2, window=4)) is LocalAttention
    with pytest.raises(TypeError, match="'window'"):
        polymixer.build_mixer("attention", 16, heads=2, window=4)


def test_each_class_refuses_what_is_not_its_own():
    with pytest.raises(TypeError, match="unexpected keyword"):
        PoM(8, n_head=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'decay'"):
        ValuePoM(8, decay="head")
    for window in (None, 0, True):
        with pytest.raises(ValueError, match="window must be a positive int"):
            LocalAttention(8, window)
    with pytest.raises(ValueError, match="needs its own init_state"):
        ValuePoM(8).step(torch.randn(1, 2, 8), PoM(8).init_state(1))
    with pytest.raises(ValueError, match="no value-carrying PoM"):
        GatedValuePoM(8).load_reference_state_dict(PoM(8).reference_state_dict())


def test_value_classes_stream_with_pom_state():
    for m in (ValuePoM(8, heads=2).double(), GatedValuePoM(8, heads=2).double()):
        s = m.init_state(3, dtype=torch.float64)
        assert isinstance(s, PoMState) and s.prev is not None and s.sum.shape == (3, 2, 8, 4)
        x = torch.randn(3, 7, 8, dtype=torch.float64)
        y, _ = m.step(x, s)
        assert_close(y, m(x, causal=True), 1e-9, 1e-9)


# ---------------------------------------------------------------------------------------------------------------
# one name per setting: the token shift
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, width", [(None, 7), (False, 0), (0, 0), (True, 2), (2, 2), (5, 5)])
def test_one_validator_reads_every_token_shift_setting(value, width):
    from polymixer.layers.pom import shift_width

    assert shift_width(value, default=7) == width


@pytest.mark.parametrize("value", [1, -2, 2.0, "2"])
def test_a_bad_token_shift_is_one_line_naming_its_setting(value):
    from polymixer.layers.pom import shift_width
    from polymixer.models.lm import LMConfig

    with pytest.raises(ValueError, match=r"^attention_shift must be a bool or a width ≥ 2 \(0: none\)"):
        shift_width(value, "attention_shift")
    for build in (lambda: ValuePoM(8, value_dim=8, token_shift=value), lambda: Attention(8, token_shift=value),
                  lambda: LMConfig(token_shift=value), lambda: LMConfig(attention_shift=value)):
        with pytest.raises(ValueError, match="(token|attention)_shift must be a bool or a width ≥ 2"):
            build()
    with pytest.raises(ValueError, match=r"^token_shift must be a bool or a width ≥ 2 —"):
        LMConfig(token_shift=0)  # a value PoM layer of a family config always shifts


def test_a_config_field_is_named_as_the_keyword_it_feeds_and_earlier_names_still_load(tmp_path):
    """LMConfig.token_shift feeds ValuePoM(token_shift=…); a checkpoint, a bench variant or a transformers folder
    written with the earlier name ``shift_width`` loads with the same meaning."""
    from polymixer.checkpoint import load_model, read_config, save_checkpoint
    from polymixer.models import create_model, model_config
    from polymixer.models.registry import build_from_config

    m = create_model("tiny-vpom", n_layer=1, n_embd=32, value_dim=32, value_heads=2, shift_width=3)
    assert m.config.token_shift == 3 and m.blocks[0].mixer.shift_width == 3
    assert model_config("tiny-vpom", token_shift=3).token_shift == 3
    with pytest.raises(ValueError, match="shift_width is the earlier name of LMConfig.token_shift"):
        model_config("tiny-vpom", token_shift=3, shift_width=3)
    old = {k: v for k, v in vars(m.config).items() if k != "token_shift"} | {"shift_width": 3}
    assert build_from_config("lm", old).config == m.config
    save_checkpoint(tmp_path / "run", 1, m, {"family": "lm", "preset": "tiny-vpom", "model": old})
    assert read_config(tmp_path / "run")["model"]["token_shift"] == 3
    back = load_model(tmp_path / "run", family="lm")
    assert back.config == m.config
    pytest.importorskip("transformers")
    from polymixer.hf import PolymixerConfig

    assert PolymixerConfig(**{**old, "vocab_size": m.config.vocab_size}).token_shift == 3


def test_every_layer_takes_the_same_mode_keywords_and_names_a_misspelt_one():
    """The layers' forward reads one list of modes (ops.common.LAYER_MODES): no layer spells them out again, and a
    misspelt one is the TypeError a misspelt keyword argument is, naming the layer and its modes."""
    import inspect

    from polymixer import PolyMorpher
    from polymixer.ops.common import LAYER_MODES

    x = torch.randn(1, 6, 8)
    for m in (PoM(8), ValuePoM(8, heads=2), GatedValuePoM(8, heads=2), Attention(8, heads=2),
              LocalAttention(8, 3, heads=2)):
        assert list(inspect.signature(m.forward).parameters) == ["x", "context", "modes"]
        assert m(x, causal=True, mask=torch.ones(1, 6, dtype=torch.bool)).shape == x.shape
        with pytest.raises(TypeError, match=rf"{type(m).__name__}.forward\(\) got an unexpected keyword argument "
                                            rf"'casual'; its mode keywords: {', '.join(LAYER_MODES)}"):
            m(x, casual=True)
    assert PolyMorpher(8, "pom")(x, causal=True, block_size=None).shape == x.shape
