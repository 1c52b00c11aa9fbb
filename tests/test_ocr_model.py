"""HTR-VT / HTR-VPoM: geometry, parameter counts, positions, padding invariance, masking, CTC decoding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from polymixer.models import count_parameters, create_model
from polymixer.models.ocr import HTR, HTRConfig, MaskedBatchNorm2d, ResNetStem, ctc_greedy_decode, ctc_loss, \
    span_mask, token_lengths

SMALL = dict(dim=32, heads=2, stem_channels=(8, 16, 32), depth=2, sel_heads=2)


def small(mixer: str = "attention", **kw) -> HTR:
    return create_model("tiny-htr-vt", mixer=mixer, **{**SMALL, **kw})


@pytest.mark.parametrize("height", [32, 64])
@pytest.mark.parametrize("width", [1, 3, 4, 5, 127, 512, 1000])
def test_stem_output_shape(height, width):
    stem = ResNetStem((4, 8, 16)).eval()
    y = stem(torch.randn(2, 1, height, width))
    assert y.shape == (2, 16, 1, -(-width // 4))
    assert token_lengths(torch.tensor([width])).item() == y.shape[-1]


def test_paper_stem_makes_128_tokens_of_768():
    model = create_model("htr-vt", device="meta")
    y = model.stem(torch.empty(1, 1, 64, 512, device="meta"))
    assert y.shape == (1, 768, 1, 128)


def test_parameter_counts():
    counts = {n: count_parameters(create_model(n, device="meta")) for n in
              ("htr-vt", "htr-vpom", "htr-vpom-hybrid", "tiny-htr-vt", "tiny-htr-vpom", "tiny-htr-vpom-hybrid")}
    table = 128 * 768  # the original's frozen position table (a buffer here)
    assert counts["htr-vt"] == 53_387_792  # the public HTR-VT code, trainable parameters
    assert counts["htr-vt"] + table == 53_486_096  # … and with its frozen position table
    assert abs((counts["htr-vpom"] + table) / 53.7e6 - 1) < 0.01  # the paper's HTR-VPoM, 53.7M
    assert abs((counts["htr-vpom-hybrid"] + table) / 53.5e6 - 1) < 0.01  # the paper's hybrid, 53.5M
    tiny = [counts[n] for n in ("tiny-htr-vt", "tiny-htr-vpom", "tiny-htr-vpom-hybrid")]
    assert max(tiny) / min(tiny) < 1.01, tiny
    assert create_model("htr-vpom-hybrid", device="meta").pattern == "APAP"
    assert create_model("htr-vpom", device="meta").pattern == "PPPP"


def _htr_vt_table(dim: int, grid_h: int, grid_w: int) -> np.ndarray:
    """HTR-VT's get_2d_sincos_pos_embed, rewritten from its formula: meshgrid(w, h), the first half of the channels
    encodes grid[0] (the column), the second half grid[1] (the row); [sin, cos] with ω_i = 10000^(−2i/(dim/2))."""
    gw, gh = np.meshgrid(np.arange(grid_w, dtype=np.float64), np.arange(grid_h, dtype=np.float64))

    def one(d, pos):
        omega = 1.0 / 10000 ** (np.arange(d // 2, dtype=np.float64) / (d / 2.0))
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    return np.concatenate([one(dim // 2, gw), one(dim // 2, gh)], axis=1)


def test_positions_match_htr_vt_and_extend_to_any_width():
    model = create_model("htr-vt", device="meta")
    table = model.positions(128, torch.device("cpu"), torch.float64)
    np.testing.assert_allclose(table.numpy(), _htr_vt_table(768, 16, 8), atol=1e-6)
    # any length: token i keeps its place (row i // 8, column i % 8), so a line's positions never depend on the
    # width of the batch it is padded into
    long = model.positions(2108, torch.device("cpu"), torch.float64)
    assert long.shape == (2108, 768)
    torch.testing.assert_close(long[:128], table)
    np.testing.assert_allclose(long.numpy(), _htr_vt_table(768, 264, 8)[:2108], atol=1e-6)
    one_d = create_model("tiny-htr-vt", position="sincos", device="meta").positions(7, torch.device("cpu"),
                                                                                    torch.float32)
    assert one_d.shape == (7, 128)


def _train_a_little(model: HTR) -> None:
    """A few training-mode forwards so that BatchNorm's running statistics are far from (0, 1)."""
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.rand(4, 1, model.config.height, 120, dtype=torch.float64), torch.tensor([120, 90, 61, 33]))
    model.eval()


@pytest.mark.parametrize("mixer", ["attention", "pom", "hybrid", "LP", "value_pom", "AV"])
def test_padded_in_batch_equals_alone(mixer):
    torch.manual_seed(0)
    model = small(mixer).double()
    _train_a_little(model)
    widths = [37, 120, 61, 5, 4]
    lines = [torch.rand(1, 1, 32, w, dtype=torch.float64) for w in widths]
    batch = torch.ones(len(lines), 1, 32, max(widths), dtype=torch.float64)  # white padding
    for b, line in enumerate(lines):
        batch[b, ..., :widths[b]] = line
    log_probs, lengths = model(batch, torch.tensor(widths))
    for b, line in enumerate(lines):
        alone, n = model(line)
        assert n.item() == lengths[b].item() == -(-widths[b] // 4)
        torch.testing.assert_close(log_probs[b, :lengths[b]], alone[0], rtol=1e-9, atol=1e-9)
    # the masks are what makes this hold: without the widths, the short lines' predictions change
    unmasked, _ = model(batch)
    assert (unmasked[2, :lengths[2]] - log_probs[2, :lengths[2]]).abs().max() > 1e-3


def test_masked_batchnorm_counts_only_real_columns():
    torch.manual_seed(0)
    bn = MaskedBatchNorm2d(3, momentum=1.0).double().train()
    x = torch.randn(2, 3, 4, 10, dtype=torch.float64)
    widths = torch.tensor([10, 6])
    cols = (torch.arange(10)[None] < widths[:, None]).double()[:, None, None, :]
    y = bn(x * cols + 100 * (1 - cols), cols)  # garbage in the padding must not matter
    real = torch.cat([x[0].reshape(3, -1), x[1, :, :, :6].reshape(3, -1)], dim=1)
    mean, var = real.mean(1), real.var(1, unbiased=False)
    torch.testing.assert_close(bn.running_mean, mean)
    torch.testing.assert_close(bn.running_var, real.var(1, unbiased=True))
    torch.testing.assert_close(y[1, :, :, :6], ((x[1, :, :, :6] - mean[:, None, None]) /
                                                torch.sqrt(var[:, None, None] + bn.eps)))
    # without padding it is the ordinary BatchNorm
    ref = torch.nn.BatchNorm2d(3).double().train()
    torch.testing.assert_close(MaskedBatchNorm2d(3).double().train()(x, torch.ones(2, 1, 1, 10).double()), ref(x))


def test_span_mask():
    torch.manual_seed(0)
    lengths = torch.tensor([128, 40, 7, 100])
    m = span_mask(lengths, 128, 0.4, 8)
    assert m.shape == (4, 128)
    for b, n in enumerate(lengths.tolist()):
        assert not m[b, n:].any()  # padding is never masked
        spans = int(n * 0.4) // 8
        assert spans * 8 >= m[b].sum() >= (8 if spans else 0)  # overlapping spans can cover less
    assert not m[2].any()  # 7 tokens: no span of 8 fits the 40% rule
    assert span_mask(torch.tensor([10, 12]), 12, 0.4, 8) is None
    # a training forward replaces masked tokens: two training forwards differ, evaluation forwards do not
    model = small("pom")
    x = torch.rand(2, 1, 32, 512)
    model.train()
    a, _ = model(x)
    b, _ = model(x)
    assert not torch.allclose(a, b)


def test_ctc_greedy_decode_hand_made():
    # classes: 0 blank, 1 'a', 2 'b'; best path per step below
    paths = [[1, 1, 0, 1, 2, 2, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0], [2, 0, 2, 2, 1, 0, 1, 1]]
    lp = torch.full((3, 8, 3), -10.0)
    for b, path in enumerate(paths):
        for t, c in enumerate(path):
            lp[b, t, c] = 0.0
    assert ctc_greedy_decode(lp) == [[1, 1, 2], [], [2, 2, 1, 1]]
    # tokens past a line's length are ignored
    assert ctc_greedy_decode(lp, torch.tensor([3, 8, 4])) == [[1], [], [2, 2]]


def test_ctc_loss_is_htr_vt_sum_per_line_then_mean():
    torch.manual_seed(0)
    lp = torch.randn(2, 10, 5).log_softmax(-1)
    targets, tl = torch.tensor([1, 2, 3, 4, 4]), torch.tensor([3, 2])
    per = torch.nn.functional.ctc_loss(lp.transpose(0, 1), targets, torch.tensor([10, 7]), tl, reduction="none")
    torch.testing.assert_close(ctc_loss(lp, torch.tensor([10, 7]), targets, tl), per.mean())
    # an impossible alignment counts zero, not infinity
    assert torch.isfinite(ctc_loss(lp[:1, :2], torch.tensor([2]), torch.tensor([1, 1, 1]), torch.tensor([3])))


def test_bad_inputs():
    model = small()
    with pytest.raises(ValueError, match=r"shape \(batch, 1, 32, width\)"):
        model(torch.rand(1, 1, 64, 100))
    with pytest.raises(TypeError, match="float"):
        model(torch.zeros(1, 1, 32, 100, dtype=torch.uint8))
    with pytest.raises(ValueError, match="line width 101"):
        model(torch.rand(2, 1, 32, 100), torch.tensor([100, 101]))
    with pytest.raises(ValueError, match="widths must be an integer tensor"):
        model(torch.rand(2, 1, 32, 100), torch.tensor([100.0, 50.0]))
    with pytest.raises(ValueError, match="height must be 32 or 64"):
        HTRConfig(height=48)
    with pytest.raises(ValueError, match="unknown letters"):
        HTRConfig(mixer="PX")


def test_reference_state_dict_loads_htr_vt_names():
    torch.manual_seed(0)
    src = small()
    theirs = {}
    for k, v in src.state_dict().items():
        k = k.replace("stem.", "patch_embed.").replace(".mixer.", ".attn.")
        theirs["module." + k] = v
    theirs["pos_embed"] = src.positions(128, torch.device("cpu"), torch.float32)[None]
    dst = small()
    dst.load_reference_state_dict(theirs)
    x = torch.rand(2, 1, 32, 200)
    torch.testing.assert_close(dst.eval()(x)[0], src.eval()(x)[0])
    theirs["pos_embed"] = theirs["pos_embed"] + 1
    with pytest.raises(ValueError, match="position table"):
        dst.load_reference_state_dict(theirs)


def test_eval_fast_paths_equal_the_plain_layers():
    """Evaluation folds BatchNorm into the convolution and splits the 3×3 max-pool into 3×1 and 1×3."""
    from polymixer.models.ocr import _conv_bn, _max_pool

    torch.manual_seed(0)
    x = torch.randn(2, 4, 9, 13, dtype=torch.float64)
    torch.testing.assert_close(_max_pool(x), torch.nn.MaxPool2d(3, stride=(2, 1), padding=1)(x))
    conv = torch.nn.Conv2d(4, 6, 3, stride=2, padding=1, bias=False).double()
    bn = MaskedBatchNorm2d(6).double()
    with torch.no_grad():
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.normal_()
        bn.bias.normal_()
    bn.eval()
    torch.testing.assert_close(_conv_bn(conv, bn, x, None), bn(conv(x)))
