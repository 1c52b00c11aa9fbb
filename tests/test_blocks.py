"""PolyMorpher: one residual block for every mixer; masks and streaming state pass through."""

from __future__ import annotations

import pytest
import torch

from polymixer import Attention, PoM, PolyMorpher

from conftest import assert_close


def _block(mixer, **kw):
    torch.manual_seed(1)
    b = PolyMorpher(16, mixer=mixer, **kw).double().eval()
    if isinstance(b.mixer, PoM):
        with torch.no_grad():
            b.mixer.coeff.uniform_(-1, 1)
    return b


@pytest.mark.parametrize("mixer", ["pom", "attention", "local_attention"])
def test_pre_norm_residual_structure(mixer):
    b = _block(mixer, heads=4) if mixer != "pom" else _block(mixer)
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    h = x + b.mixer(b.norm1(x), causal=True)
    assert_close(b(x, causal=True), h + b.mlp(b.norm2(h)))


def test_post_norm_residual_structure():
    b = _block("pom", norm_first=False)
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    h = b.norm1(x + b.mixer(x))
    assert_close(b(x), b.norm2(h + b.mlp(h)))


def test_mixer_kwargs_and_modules():
    assert isinstance(PolyMorpher(16, "pom", degree=3, expand=1).mixer, PoM)
    la = PolyMorpher(16, "local_attention", heads=2).mixer
    assert isinstance(la, Attention) and la.window == 128 and la.causal
    custom = PoM(16, degree=4)
    assert PolyMorpher(16, mixer=custom).mixer is custom
    assert PolyMorpher(16, mlp_ratio=2.0).mlp.fc1.out_features == 32


@pytest.mark.parametrize("mixer", ["pom", "attention", "local_attention"])
@pytest.mark.parametrize("norm_first", [True, False])
def test_block_streaming_equals_forward(mixer, norm_first):
    kw = dict(heads=4, window=5) if mixer == "local_attention" else dict(heads=4) if mixer == "attention" else {}
    b = _block(mixer, norm_first=norm_first, **kw)
    x = torch.randn(2, 23, 16, dtype=torch.float64)
    full = b(x, causal=True)
    st = b.init_state(2)
    ys = []
    for a in range(0, 23, 4):
        y, st = b.step(x[:, a:a + 4], st)
        ys.append(y)
    assert_close(torch.cat(ys, 1), full)


def test_hybrid_stack_streams_with_mask():
    """A P/L/A pattern stack (the LM hybrid) streamed over a left-padded batch matches its parallel forward."""
    blocks = [_block("pom"), _block("local_attention", heads=4, window=6), _block("attention", heads=4)]
    x = torch.randn(2, 30, 16, dtype=torch.float64)
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[0, :7] = False
    h = x
    for blk in blocks:
        h = blk(h, causal=True, mask=mask)
    states = [blk.init_state(2) for blk in blocks]
    outs = []
    for a in range(0, 30, 11):
        g = x[:, a:a + 11]
        for i, blk in enumerate(blocks):
            g, states[i] = blk.step(g, states[i], mask=mask[:, a:a + 11])
        outs.append(g)
    assert_close(torch.cat(outs, 1)[mask], h[mask])


def test_dropout_only_in_training():
    b = PolyMorpher(16, "attention", heads=4, dropout=0.5)
    assert b.mixer.dropout == 0.5
    x = torch.randn(2, 8, 16)
    b.eval()
    torch.testing.assert_close(b(x), b(x))
    b.train()
    assert not torch.allclose(b(x), b(x))


def test_gradients_reach_every_parameter():
    for mixer in ("pom", "attention", "local_attention"):
        b = PolyMorpher(16, mixer, **({} if mixer == "pom" else {"heads": 4}))
        b(torch.randn(2, 9, 16), causal=True).square().sum().backward()
        missing = [n for n, p in b.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
        assert not missing, missing


# -- the mixer table -------------------------------------------------------------------------------------------

def test_the_mixer_table_builds_every_mixer_by_name_and_letter_and_filters_model_options():
    from polymixer.layers.attention import Attention
    from polymixer.blocks import LETTERS, MIXER_TABLE, mixer_spec
    from polymixer.layers.linear_attention import LinearAttention

    options = dict(heads=4, causal=True, window=8, dropout=0.0, degree=3, expand=1, sel_heads=2, value_dim=16,
                   value_heads=2, feature_dim=4, rope=None, bias=True)  # a model's whole set
    kinds = {"P": PoM, "V": PoM, "G": PoM, "A": Attention, "L": Attention, "I": LinearAttention,
             "B": LinearAttention}
    assert set(LETTERS) == set(kinds) and len({m.name for m in MIXER_TABLE}) == len(MIXER_TABLE)
    x = torch.randn(2, 9, 16)
    for spec in MIXER_TABLE:
        assert mixer_spec(spec.name) is mixer_spec(spec.letter) is spec
        m = spec.make(16, **options)
        assert isinstance(m, kinds[spec.letter]), spec.name
        assert m(x, causal=True).shape == x.shape if spec.causal else True
    assert mixer_spec("V").make(16, **options).value_dim == 16 and mixer_spec("P").make(16, **options).degree == 3
    assert mixer_spec("G").make(16, **options).decay == "head" and mixer_spec("V").make(16, **options).decay is None
    assert mixer_spec("L").make(16, **options).window == 8 and mixer_spec("A").make(16, **options).window is None
    with pytest.raises(ValueError, match=r"unknown mixer 'X'; the mixers are pom \(P\), value_pom \(V\)"):
        mixer_spec("X")


def test_layer_patterns_read_the_table():
    from polymixer.blocks import layer_pattern

    assert layer_pattern("value_pom", 4, "AP", allowed="APV") == "VVVV"
    assert layer_pattern("attention", 3, "AP", "PAL") == "AAA" and layer_pattern("hybrid", 4, "AP", "PAL") == "APAP"
    with pytest.raises(ValueError, match=r"pattern over P \(PoM\), A \(attention\), V \(value-carrying PoM\)"):
        layer_pattern("PQ", 2, "AP", allowed="PAV")


# what each family took before its letters came from the table (kept: a change here changes what users may build)
FAMILY_LETTERS = {"lm": "PALVG", "image": "APVLG", "ocr": "PALVG", "eo": "PAVGL", "points": "APV",
                  "recall": "ALPVIBG"}


@pytest.mark.parametrize("family", sorted(FAMILY_LETTERS))
def test_each_family_takes_the_letters_the_table_derives_from_what_it_needs(family):
    """A family's letters are the mixers of the table that do what it needs: a decoder LM decodes token by token
    (no recall baseline has a step), an encoder mixes both ways, points need weights that do not fall with the
    distance along a shuffled serialization (no window, no decay), recall compares every mixer, baselines included.
    Its config refuses the others and builds every one it takes."""
    from polymixer.blocks import MIXER_TABLE, mixer_spec
    from polymixer.models import list_models, model_config
    from polymixer.models.registry import family_config

    config_cls = family_config(family)
    assert sorted(config_cls.MIXER_LETTERS) == sorted(FAMILY_LETTERS[family])
    for spec in MIXER_TABLE:
        takes = spec.letter in config_cls.MIXER_LETTERS
        assert takes == ((spec.causal if family in ("lm", "recall") else spec.full)
                         and (spec.streaming is not None or family != "lm")
                         and (spec.distance_free or family != "points") and (not spec.baseline or family == "recall"))
    preset = list_models(family=family)[0]
    outside = [m.letter for m in MIXER_TABLE if m.letter not in config_cls.MIXER_LETTERS]
    for letter in outside:
        with pytest.raises(ValueError, match=f"unknown letters \\['{letter}'\\]"):
            model_config(preset, mixer=letter)
    for letter in config_cls.MIXER_LETTERS:
        if family == "eo" and letter == "L":
            continue  # local attention mixes frames within days: the temporal blocks only (eo's own rule)
        assert set(model_config(preset, mixer=mixer_spec(letter).name).layer_pattern()) == {letter}


@pytest.mark.parametrize("family", sorted(FAMILY_LETTERS))
def test_each_config_names_real_mixer_options(family):
    """The fields a config gives every mixer by their own names are its fields and options of some mixer of the
    table (so the refusal of an option no layer takes cannot miss one by a typo)."""
    import dataclasses

    from polymixer.blocks import MIXER_TABLE
    from polymixer.models.registry import family_config

    config_cls = family_config(family)
    fields = {f.name for f in dataclasses.fields(config_cls)}
    for name in config_cls.MIXER_OPTIONS:
        assert name in fields and any(name in m.options for m in MIXER_TABLE), name


def test_an_option_no_layer_takes_is_refused_in_one_line():
    """Over a preset, a mixer option set away from the preset's value that no layer of the model takes changes
    nothing: a ValueError naming it, the model's mixers and the mixers that take it. One some layer takes, one at
    the preset's value, and the config itself (which also holds the options of layers pomify may add) pass."""
    from polymixer.blocks import check_mixer_options
    from polymixer.models import check_overrides, model_config

    line = ("token_shift=4 is taken by no mixer of this model (attention A); it is taken by value_pom, "
            "gated_value_pom, linear_attention, based")
    with pytest.raises(ValueError) as refused:
        check_overrides("tiny-attention", {"token_shift": 4})
    assert str(refused.value) == line
    with pytest.raises(ValueError, match=r"^token_shift=4 is taken by no mixer"):
        check_overrides("tiny-attention", {"shift_width": 4})  # the field's earlier name
    with pytest.raises(ValueError, match=r"^window=32 is taken by no mixer of this model \(pom P\); it is taken by "
                                         r"local_attention$"):
        check_overrides("tiny-pom", {"window": 32})
    with pytest.raises(ValueError, match=r"^qkv_bias=False .*\(pom P, value_pom V\)"):
        check_overrides("tiny-ppomv3", {"mixer": "PV", "qkv_bias": False})
    with pytest.raises(ValueError, match=r"^feature_dim=8 .*\(value_pom V\); it is taken by linear_attention, based"):
        check_overrides("mqar-vpom", {"feature_dim": 8})
    assert check_overrides("tiny-attention", {"window": 64}).window == 64  # the preset's own value
    assert check_overrides("tiny-hybrid", {"window": 32, "token_shift": 2}).window == 32  # L takes it (2: default)
    assert check_overrides("tiny-attention", {"mixer": "V", "token_shift": 4}).token_shift == 4
    assert model_config("tiny-attention", token_shift=4).token_shift == 4  # a config may hold it (checkpoints)
    check_mixer_options("LP", {"window": 8, "degree": 3, "attention_shift": 2})
    with pytest.raises(ValueError, match=r"^value_heads=2 .*\(local_attention L, pom P\)"):
        check_mixer_options("LPLP", {"window": 8, "value_heads": 2})


VALUE_PRESETS = [("tiny-vpom", "tiny-attention"), ("tiny-sipom-value", "tiny-sit"),
                 ("tiny-htr-vpom-value", "tiny-htr-vt"), ("tiny-tsvipom-value", "tiny-tsvit"),
                 ("tiny-ppomv3-value", "tiny-ptv3"), ("gppom2-small-value", "gpt2-small"),
                 ("sipom-value-xl/2", "sit-xl/2"), ("dipom-value-l/2", "dit-l/2"), ("htr-vpom-value", "htr-vt"),
                 ("tsvipom-value", "tsvit"), ("ppomv3-value", "ptv3")]


@pytest.mark.parametrize("value, attention", VALUE_PRESETS)
def test_every_family_has_value_pom_presets_within_one_percent_of_attention(value, attention):
    from polymixer.models import count_parameters, create_model

    v, a = create_model(value, device="meta"), create_model(attention, device="meta")
    assert set(v.config.layer_pattern()) == {"V"} and v.family == a.family
    assert abs(count_parameters(v) / count_parameters(a) - 1) < 0.01, (count_parameters(v), count_parameters(a))


def test_a_mixer_only_block_has_no_feed_forward_and_streams():
    """mlp_ratio=0: x + mixer(norm(x)) and nothing else (Zoology's MQAR models), in parallel and streaming."""
    torch.manual_seed(0)
    blk = PolyMorpher(16, mixer="value_pom", mlp_ratio=0)
    assert blk.mlp is None and blk.norm2 is None
    x = torch.randn(2, 7, 16)
    torch.testing.assert_close(blk(x, causal=True), x + blk.mixer(blk.norm1(x), causal=True))
    y, _ = blk.step(x, blk.init_state(2))
    torch.testing.assert_close(y, blk(x, causal=True), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="mlp_ratio must be ≥ 0"):
        PolyMorpher(16, mlp_ratio=-1)
