"""TSViT / TSViPoM: parameter counts against the original architecture, shapes, un-patchifying, padding invariance,
the day-of-year encoding, spatial positions at any size, the original's weights, bad inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from polymixer import PoM
from polymixer.models import count_parameters, create_model
from polymixer.models.eo import TSViT, TSViTConfig, patchify, unpack_dates, unpatchify

TOY = dict(dim=16, heads=2, temporal_depth=1, spatial_depth=1, sel_heads=2, image_size=8, num_classes=5)


def toy(mixer: str = "attention", **kw) -> TSViT:
    return create_model("tiny-tsvit", mixer=mixer, **{**TOY, **kw})


def pom_coefficients_of_order_one(model: nn.Module) -> nn.Module:
    """PoM's coefficients start within ±1e-3; O(1) ones make every term of the polynomial matter in a test."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, PoM):
                m.coeff.uniform_(-1.0, 1.0)
                m.gate_bias.normal_()
    return model


def series(B: int = 2, T: int = 4, H: int = 8, W: int = 8, C: int = 10, dtype=torch.float32):
    return torch.randn(B, T, H, W, C, dtype=dtype), torch.randint(0, 366, (B, T))


# -- the original architecture, written from its description, for counting and as an oracle -------------------------


class _PreNorm(nn.Module):
    def __init__(self, dim: int, fn: nn.Module) -> None:
        super().__init__()
        self.norm, self.fn = nn.LayerNorm(dim), fn


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_qkv = nn.Linear(dim, 3 * heads * dim_head, bias=False)
        self.to_out = nn.Sequential(nn.Linear(heads * dim_head, dim), nn.Dropout(0.0))

    def forward(self, x):
        B, N, _ = x.shape
        q, k, v = (t.reshape(B, N, self.heads, -1).transpose(1, 2) for t in self.to_qkv(x).chunk(3, dim=-1))
        attn = (torch.einsum("bhid,bhjd->bhij", q, k) * q.shape[-1] ** -0.5).softmax(-1)
        return self.to_out(torch.einsum("bhij,bhjd->bhid", attn, v).transpose(1, 2).reshape(B, N, -1))


class _FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(0.0), nn.Linear(hidden, dim),
                                 nn.Dropout(0.0))


class _Transformer(nn.Module):
    def __init__(self, dim: int, depth: int, heads: int, dim_head: int, mlp: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.ModuleList([_PreNorm(dim, _Attention(dim, heads, dim_head)),
                                                   _PreNorm(dim, _FeedForward(dim, mlp))]) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        for attn, ff in self.layers:
            x = attn.fn(attn.norm(x)) + x
            x = ff.fn.net(ff.norm(x)) + x
        return self.norm(x)


class _OriginalTSViT(nn.Module):
    """The public TSViT (TSViTdense.TSViT) module tree and forward, with a correct un-patchify and the day index of
    its one-hot = the 1-based day of year."""

    def __init__(self, img=24, patch=2, bands=10, K=19, dim=128, depth=4, heads=4, dim_head=32, scale=4):
        super().__init__()
        self.p, self.K, self.dim, self.n = patch, K, dim, img // patch
        self.to_patch_embedding = nn.Sequential(nn.Identity(), nn.Linear(patch * patch * bands, dim))
        self.to_temporal_embedding_input = nn.Linear(366, dim)
        self.temporal_token = nn.Parameter(torch.randn(1, K, dim))
        self.temporal_transformer = _Transformer(dim, depth, heads, dim_head, dim * scale)
        self.space_pos_embedding = nn.Parameter(torch.randn(1, self.n ** 2, dim))
        self.space_transformer = _Transformer(dim, depth, heads, dim_head, dim * scale)
        self.mlp_head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, patch ** 2))

    def forward(self, x, day1):
        B, T, H, W, C = x.shape
        p, n, K, d = self.p, self.n, self.K, self.dim
        xt = F.one_hot(day1, 366).to(x.dtype)
        temporal = self.to_temporal_embedding_input(xt)  # (B, T, d)
        # '(b h w) t (p1 p2 c)'
        patches = x.reshape(B, T, n, p, n, p, C).permute(0, 2, 4, 1, 3, 5, 6).reshape(B * n * n, T, p * p * C)
        z = self.to_patch_embedding(patches).reshape(B, n * n, T, d) + temporal[:, None]
        z = torch.cat([self.temporal_token.expand(B * n * n, -1, -1), z.reshape(B * n * n, T, d)], dim=1)
        z = self.temporal_transformer(z)[:, :K]
        z = z.reshape(B, n * n, K, d).permute(0, 2, 1, 3).reshape(B * K, n * n, d) + self.space_pos_embedding
        z = self.space_transformer(z)
        y = self.mlp_head(z).reshape(B, K, n, n, p, p)
        return y.permute(0, 1, 2, 4, 3, 5).reshape(B, K, H, W)


def test_parameter_counts():
    with torch.device("meta"):
        original = count_parameters(_OriginalTSViT())
    assert original == 1_657_476  # the public code's TSViT for PASTIS (config TSViT_fold1.yaml)
    counts = {n: count_parameters(create_model(n, device="meta")) for n in
              ("tsvit", "tsvipom", "tsvipom-hybrid", "tiny-tsvit", "tiny-tsvipom", "tiny-tsvipom-hybrid")}
    assert counts["tsvit"] == original
    assert counts["tsvipom"] == 1_665_700 and counts["tsvipom-hybrid"] == 1_661_588  # +0.50%, +0.25%
    assert abs(counts["tsvipom"] / original - 1) < 0.01
    tiny = [counts[n] for n in ("tiny-tsvit", "tiny-tsvipom", "tiny-tsvipom-hybrid")]
    assert max(tiny) / min(tiny) < 1.01, tiny
    assert create_model("tsvipom-hybrid", device="meta").pattern == "AAAAPPPP"
    assert create_model("tsvipom-hybrid", hybrid_pom="temporal", device="meta").pattern == "PPPPAAAA"
    assert create_model("tsvit", mixer="PA", device="meta").pattern == "PAPAPAPA"
    # rotary spatial positions replace the learned (144, 128) table
    assert count_parameters(create_model("tsvit", spatial_position="rope", device="meta")) == original - 144 * 128


def test_reference_weights_give_the_original_outputs():
    torch.manual_seed(0)
    ref = _OriginalTSViT(img=8, K=5, dim=16, depth=2, heads=2, dim_head=8).double().eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.3)
    model = create_model("tiny-tsvit", **{**TOY, "temporal_depth": 2, "spatial_depth": 2}).double().eval()
    model.load_reference_state_dict({"module." + k: v for k, v in ref.state_dict().items()})
    x, doy = series(2, 5, dtype=torch.float64)
    torch.testing.assert_close(model(x, doy), ref(x, doy + 1), rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="attention model"):
        toy("pom").load_reference_state_dict(ref.state_dict())


@pytest.mark.parametrize("mixer", ["attention", "pom", "hybrid", "value_pom", "AV"])
@pytest.mark.parametrize("position", ["learned", "rope"])
def test_shapes_for_any_frames_and_size(mixer, position):
    model = toy(mixer, spatial_position=position)
    for T, H, W in ((1, 8, 8), (7, 8, 8), (3, 12, 20), (2, 2, 4)):
        x, doy = series(2, T, H, W)
        assert model(x, doy).shape == (2, 5, H, W)


def test_unpatchify_puts_each_patch_on_its_own_pixels():
    B, K, h, w, p = 2, 3, 4, 5, 2
    y = torch.randn(B, K, h * w, p * p)
    img = unpatchify(y, h, w, p)
    for i in range(h):
        for j in range(w):
            for a in range(p):
                for b in range(p):
                    torch.testing.assert_close(img[:, :, p * i + a, p * j + b], y[:, :, i * w + j, a * p + b])
    # patchify is its inverse on a single frame and band
    x = torch.randn(B, 1, h * p, w * p, 1)
    back = unpatchify(patchify(x, p)[:, :, 0].unsqueeze(1), h, w, p)
    torch.testing.assert_close(back[:, 0], x[:, 0, :, :, 0])
    # end to end: the head's output for patch (i, j) lands on that patch's pixels
    model = toy().eval()
    seen = {}
    model.head.register_forward_hook(lambda m, inp, out: seen.setdefault("y", out))
    x, doy = series(1, 3, 8, 12)
    logits = model(x, doy)
    y = seen["y"].reshape(1, 5, 4, 6, 2, 2)  # (B, K, h, w, p, p)
    for i, j, k in ((0, 0, 0), (1, 4, 2), (3, 5, 4)):
        torch.testing.assert_close(logits[0, k, 2 * i:2 * i + 2, 2 * j:2 * j + 2], y[0, k, i, j])


@pytest.mark.parametrize("mixer", ["attention", "pom", "hybrid", "value_pom", "AV", "value_pom+shift4",
                                   "value_pom+rope", "pom+rope", "attention+rope", "value_pom+yearrope",
                                   "attention+yearrope"])
def test_padded_series_in_a_batch_equal_the_series_alone(mixer):
    torch.manual_seed(0)
    mixer, _, option = mixer.partition("+")  # a value PoM whose shift reads the last 4 frames; rotary dates
    kw = {"shift_width": int(option[5:])} if option.startswith("shift") else {"date_rope": option.endswith("rope")}
    if option == "yearrope":  # rotary dates at fractional positions: periods of 12 days and slower
        kw.update(date_rope_base=80.0, date_rope_speed=0.5)
    model = pom_coefficients_of_order_one(toy(mixer, **kw))
    model = model.double().eval()
    with torch.no_grad():  # every tap of the shift non-zero, so that a padded frame leaking in would show
        for m in model.modules():
            if isinstance(m, PoM) and m.token_shift:
                m.shift.uniform_(-1, 1)
    lengths = [6, 3, 1]
    alone = [series(1, n, dtype=torch.float64) for n in lengths]
    T = max(lengths)
    x = torch.randn(len(lengths), T, 8, 8, 10, dtype=torch.float64) * 5  # garbage in the padding
    doy = torch.randint(0, 366, (len(lengths), T))
    mask = torch.zeros(len(lengths), T, dtype=torch.bool)
    for b, (xs, ds) in enumerate(alone):
        x[b, :lengths[b]], doy[b, :lengths[b]], mask[b, :lengths[b]] = xs[0], ds[0], True
    out = model(x, doy, mask)
    for b, (xs, ds) in enumerate(alone):
        torch.testing.assert_close(out[b], model(xs, ds)[0], rtol=1e-10, atol=1e-10)
    # the mask is what makes this hold
    assert (model(x, doy)[1] - out[1]).abs().max() > 1e-3


def test_day_of_year_encoding():
    torch.manual_seed(0)
    model = toy().eval()
    # the date embedding is a one-hot of 366 days through Linear(366, dim), added to every patch of the frame
    doy = torch.tensor([[0, 180, 365]])
    emb = F.embedding(doy, model.date_embed.weight.t()) + model.date_embed.bias
    torch.testing.assert_close(emb, model.date_embed(F.one_hot(doy, 366).float()))
    x, _ = series(1, 3)
    a = model(x, doy)
    assert not torch.allclose(a, model(x, torch.tensor([[0, 181, 365]])))
    # the original packs day / 365.0001 into a float32 channel and truncates it back: 18 days move by one
    day = torch.arange(1, 366)
    packed = (day.float() / 365.0001)
    assert int(((packed * 365.0001).long() != day).sum()) == 18
    inputs = torch.cat([torch.randn(1, 366, 2, 2, 10), torch.zeros(1, 366, 2, 2, 1)], dim=-1)
    inputs[0, :365, :, :, -1] = packed[:, None, None]  # the last frame is padding (date 0)
    bands, doy0, mask = unpack_dates(inputs)
    assert bands.shape == (1, 366, 2, 2, 10)
    assert doy0[0, :365].tolist() == list(range(365)) and mask[0, :365].all() and not mask[0, 365]
    with pytest.raises(ValueError, match="outside 0 … 365"):
        model(x, torch.tensor([[0, 1, 366]]))


@pytest.mark.parametrize("mixer", ["attention", "pom", "value_pom"])
def test_date_rope_turns_the_temporal_mixers_by_the_day_of_year(mixer):
    torch.manual_seed(0)
    plain = pom_coefficients_of_order_one(toy(mixer)).double().eval()
    turned = toy(mixer, date_rope=True).double().eval()
    assert turned.state_dict().keys() == plain.state_dict().keys()  # no parameter of its own
    turned.load_state_dict(plain.state_dict())
    assert all(b.mixer.rope == "1d" for b in turned.temporal) and all(b.mixer.rope is None for b in turned.spatial)
    x, doy = series(2, 5, dtype=torch.float64)
    with torch.no_grad():
        # every frame on day 0 (the class tokens' day): no rotation, the plain model's output
        zero = torch.zeros_like(doy)
        torch.testing.assert_close(turned(x, zero), plain(x, zero), rtol=1e-10, atol=1e-10)
        # without the additive date embedding the plain model cannot see the dates; the rotary one still does
        for m in (plain, turned):
            m.date_embed.weight.zero_()
            m.date_embed.bias.zero_()
        later = (doy + 40) % 366
        torch.testing.assert_close(plain(x, doy), plain(x, later), rtol=1e-10, atol=1e-10)
        assert (turned(x, doy) - turned(x, later)).abs().max() > 1e-4


@pytest.mark.parametrize("mixer", ["attention", "value_pom"])
def test_date_rope_base_and_speed_set_the_frequencies(mixer):
    """Pair i of a head turns speed · base^(−2i/w) radians a day: the temporal mixers get the base, and their
    positions are the days times the speed (the class tokens at 0)."""
    torch.manual_seed(0)
    model = toy(mixer, date_rope=True, date_rope_base=80.0, date_rope_speed=0.5).double().eval()
    assert all(b.mixer.rope_base == 80.0 for b in model.temporal)
    seen = []
    model.temporal[0].register_forward_pre_hook(lambda m, a, kw: seen.append(kw["positions"]), with_kwargs=True)
    x, doy = series(2, 5, dtype=torch.float64)
    with torch.no_grad():
        out = model(x, doy)
    N = seen[0].shape[0] // 2  # patch series per sample
    want = torch.cat([torch.zeros(2, model.config.num_classes), doy.double() * 0.5], 1).repeat_interleave(N, 0)
    torch.testing.assert_close(seen[0], want, rtol=0, atol=0)
    # the same weights with the default frequencies read the dates differently
    plain = toy(mixer, date_rope=True).double().eval()
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert (plain(x, doy) - out).abs().max() > 1e-4


def test_spatial_positions_at_any_size():
    model = toy()
    g = model.config.grid_size
    table = model.spatial_pos[0]
    assert torch.equal(model.spatial_positions(g, g, torch.float32), table)  # the trained table itself
    big = model.spatial_positions(3 * g, 2 * g, torch.float32)
    assert big.shape == (6 * g * g, 16)
    with torch.no_grad():
        model.spatial_pos.fill_(0.25)
    torch.testing.assert_close(model.spatial_positions(7, 5, torch.float32), torch.full((35, 16), 0.25))
    rope = toy("pom", spatial_position="rope")
    assert rope.spatial_pos is None and rope.spatial_positions(4, 4, torch.float32) is None
    # rotary positions depend only on offsets: a whole grid of 32 × 32 patches runs
    x, doy = series(1, 2, 64, 64)
    assert rope.eval()(x, doy).shape == (1, 5, 64, 64)


def test_bad_inputs():
    model = toy()
    x, doy = series(2, 3)
    with pytest.raises(ValueError, match=r"\(batch, frames, height, width, 10\)"):
        model(x[..., :9], doy)
    with pytest.raises(ValueError, match="multiples of the patch size 2"):
        model(x[:, :, :7], doy)
    with pytest.raises(TypeError, match="float"):
        model(x.long(), doy)
    with pytest.raises(ValueError, match=r"doy must be an integer tensor of shape \(2, 3\)"):
        model(x, doy.float())
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        model(x, doy, torch.ones(2, 3))
    with pytest.raises(ValueError, match="not a multiple of patch_size"):
        TSViTConfig(image_size=25)
    with pytest.raises(ValueError, match="spatial_position"):
        TSViTConfig(spatial_position="sincos")
    with pytest.raises(ValueError, match="date_rope must be True or False"):
        TSViTConfig(date_rope="yes")
    with pytest.raises(ValueError, match="date_rope_speed must be > 0, got 0"):
        TSViTConfig(date_rope_speed=0)
    with pytest.raises(ValueError, match="date_rope_base must be > 1, got 1"):
        TSViTConfig(date_rope_base=1)
    with pytest.raises(ValueError, match="unknown letters"):
        TSViTConfig(mixer="PI")  # linear attention: not a TSViT mixer
    with pytest.raises(ValueError, match="divisible by 4"):
        TSViTConfig(dim=24, heads=4, spatial_position="rope")


def test_local_attention_in_time_reaches_local_days_and_the_class_tokens():
    """L blocks (temporal only): a frame attends to the frames within local_days of it and to the class tokens; the
    class tokens see every frame; padded frames are seen by none — so the short window of the season a crop is
    decided in can be read apart from the rest."""
    torch.manual_seed(0)
    m = create_model("tiny-tsvipom-local", image_size=8, local_days=20).eval()
    assert m.pattern == "LVVV"
    K = m.config.num_classes
    doy = torch.tensor([[10, 20, 100, 200, 215]])
    band = m.local_band(doy, None, 3)
    assert band.shape == (3, K + 5, K + 5) and band[:, :K].all() and band[:, :, :K].all()
    assert torch.equal(band[0, K:, K:], (doy[0, :, None] - doy[0, None, :]).abs() <= 20)
    key = torch.ones(3, K + 5, dtype=torch.bool)
    key[:, -1] = False
    assert not m.local_band(doy, key, 3)[:, :, -1].any()
    seq = torch.randn(1, K + 5, m.config.dim)
    far = seq.clone()
    far[0, K + 2] += 1  # day 100: 80 days from day 20, 90 from day 10
    with torch.no_grad():
        y, y2 = m.temporal[0](seq, mask=band[:1]), m.temporal[0](far, mask=band[:1])
    assert torch.equal(y[0, K:K + 2], y2[0, K:K + 2]) and not torch.allclose(y[0, :K], y2[0, :K])
    x = torch.randn(2, 5, 8, 8, m.config.num_bands)
    assert m(x, doy.expand(2, -1)).shape == (2, K, 8, 8)
    with pytest.raises(ValueError, match="temporal blocks only"):
        create_model("tiny-tsvit", mixer="AALL")
    params = sum(p.numel() for p in m.parameters())
    base = sum(p.numel() for p in create_model("tiny-tsvit", image_size=8).parameters())
    assert abs(params / base - 1) < 0.01
