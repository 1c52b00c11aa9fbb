"""PTv3 / PPoMv3: curve codes, patches, the pure-PyTorch sparse convolution, the network's batch invariance and
bad inputs (the data loaders are in test_points_data.py, the task and commands in test_points_task.py)."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from polymixer import PoM
from polymixer.layers.attention import Attention
from polymixer.models import count_parameters, create_model
from polymixer.models.points import ORDERS, PointLevel, SerializedMixer, encode, hilbert_encode, kernel_offsets, \
    neighbour_map, submconv3d, z_order_encode
from polymixer.experiments.train.loop import TrainConfig, configure_optimizer

SMALL = dict(enc_depths=(1, 1, 2), enc_channels=(8, 16, 16), enc_heads=(1, 2, 2), dec_depths=(1, 1),
             dec_channels=(8, 16), dec_heads=(1, 2), patch_size=24, drop_path=0.0, in_channels=6, num_classes=5)


def surface_scene(n: int, side: int, seed: int) -> torch.Tensor:
    """Unique voxels on a few axis-aligned planes (a scanned room is a 2-D manifold)."""
    g = torch.Generator().manual_seed(seed)
    pts = []
    for axis in range(3):
        p = torch.randint(0, side, (n // 3, 3), generator=g)
        p[:, axis] = int(torch.randint(0, side, (1,), generator=g))
        pts.append(p)
    grid = torch.unique(torch.cat(pts), dim=0)
    return grid[torch.randperm(len(grid), generator=g)]


def batch_of(grids, channels=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    grid = torch.cat(grids)
    feat = torch.randn(len(grid), channels, generator=g, dtype=torch.float64)
    offset = torch.tensor([len(x) for x in grids]).cumsum(0)
    return feat, grid, offset


# -- parameter counts --------------------------------------------------------------------------------------------

def test_paper_parameter_counts():
    assert count_parameters(create_model("ptv3", device="meta")) == 46_167_572
    pom = count_parameters(create_model("ppomv3", device="meta"))
    hyb = count_parameters(create_model("ppomv3-hybrid", device="meta"))
    assert abs(pom / 47.9e6 - 1) < 0.01, pom
    assert abs(hyb / 46.8e6 - 1) < 0.02, hyb
    pattern = create_model("ppomv3-hybrid", device="meta").config.pattern
    assert pattern == "AP" * 11 and create_model("ppomv3", device="meta").config.pattern == "P" * 22


def test_block_learning_rate_groups():
    model = create_model("tiny-ptv3")
    opt = configure_optimizer(model, TrainConfig(lr=1.0))
    scales = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for g in opt.param_groups:
        for p in g["params"]:
            scales[names[id(p)]] = g["lr_scale"]
    assert scales["enc.0.blocks.0.cpe.weight"] == pytest.approx(0.1)
    assert scales["enc.3.blocks.1.body.mixer.inner.qkv.weight"] == pytest.approx(0.1)
    assert scales["stem_conv.weight"] == scales["head.weight"] == scales["enc.1.down.proj.weight"] == 1.0
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))


# -- serialization -----------------------------------------------------------------------------------------------

def test_z_order_bit_by_bit():
    g = torch.randint(0, 2 ** 10, (300, 3))
    codes = z_order_encode(g, 10).tolist()
    for (x, y, z), c in zip(g.tolist(), codes):
        expect = 0
        for b in range(10):
            expect |= ((x >> b) & 1) << (3 * b + 2) | ((y >> b) & 1) << (3 * b + 1) | ((z >> b) & 1) << (3 * b)
        assert c == expect


def test_codes_match_ptv3_reference_values():
    """Values computed with the public PTv3 serialization code (z_order.py / hilbert.py), depth 4."""
    g = torch.tensor([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [3, 5, 7], [15, 0, 9], [8, 8, 8], [12, 3, 14]])
    assert encode(g, None, 4, "z").tolist() == [0, 4, 2, 1, 239, 2853, 3584, 2906]
    assert encode(g, None, 4, "hilbert").tolist() == [0, 7, 3, 1, 391, 3580, 2560, 3475]
    assert encode(g, None, 4, "hilbert-trans").tolist() == encode(g[:, [1, 0, 2]], None, 4, "hilbert").tolist()


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_hilbert_is_a_continuous_bijection(depth):
    side = 2 ** depth
    cells = torch.tensor(list(itertools.product(range(side), repeat=3)))
    code = hilbert_encode(cells, depth)
    assert sorted(code.tolist()) == list(range(side ** 3))
    path = cells[torch.argsort(code)]
    steps = (path[1:] - path[:-1]).abs().sum(1)
    assert bool((steps == 1).all())  # every step of the curve moves to a face neighbour
    assert path[0].tolist() == [0, 0, 0]


@pytest.mark.parametrize("order", ORDERS)
def test_pooling_is_a_three_bit_shift(order):
    g = torch.randint(0, 2 ** 9, (2000, 3))
    batch = torch.randint(0, 3, (2000,))
    fine = encode(g, batch, 9, order)
    coarse = encode(g >> 1, batch, 8, order)
    assert torch.equal(fine >> 3, coarse)


def test_batch_index_keeps_scenes_contiguous():
    g = torch.randint(0, 64, (500, 3))
    batch = torch.arange(500) % 4
    code = encode(g, batch, 6, "hilbert")
    assert bool((torch.diff(batch[torch.argsort(code)]) >= 0).all())


# -- patches -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [8, 24, 100])
def test_patches_cover_every_point_once(size):
    counts = [5, 24, 50, 81, 1]
    batch = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    grid = torch.cat([surface_scene(n * 4, 16, i)[:n] for i, n in enumerate(counts)])
    level = PointLevel.build(grid, batch, ORDERS, shuffle=False)
    for o in range(4):
        plan = level.patches(o, size)
        rows = []
        if plan.full is not None:
            assert plan.full.shape[1] == size
            # a full patch never mixes scenes, and its padding repeats points of the same scene
            assert bool((batch[plan.full] == batch[plan.full][:, :1]).all())
            rows.append(plan.full[plan.keep])
        if plan.short is not None:
            assert bool((torch.as_tensor(counts)[batch[plan.short[:, 0]]] <= size).all())
            rows.append(plan.short[plan.short_mask])
        rows = torch.cat(rows)
        assert sorted(rows.tolist()) == list(range(len(grid)))
        assert torch.equal(rows[plan.inverse], torch.arange(len(grid)))
        if plan.full is not None:  # patches are consecutive points of the order
            ranks = torch.empty_like(level.orders[o])
            ranks[level.orders[o]] = torch.arange(len(grid))
            r = ranks[plan.full]
            kept_runs = torch.where(plan.keep, r, r + size)  # padding points repeat the previous patch's tail
            assert bool((torch.diff(kept_runs, dim=1) == 1).all())


def test_serialized_attention_matches_per_patch_reference():
    torch.manual_seed(0)
    grid = torch.cat([surface_scene(160, 12, 0), surface_scene(60, 12, 1)])
    counts = [len(surface_scene(160, 12, 0)), len(surface_scene(60, 12, 1))]
    batch = torch.repeat_interleave(torch.arange(2), torch.tensor(counts))
    level = PointLevel.build(grid, batch, ORDERS, shuffle=False)
    attn = Attention(8, heads=2).double()
    mixer = SerializedMixer(attn, 32)
    x = torch.randn(len(grid), 8, dtype=torch.float64)
    y = mixer(x, level=level, order_index=2)
    order = level.orders[2]
    expect = torch.empty_like(x)
    start = 0
    for n in counts:
        idx = order[start:start + n]
        if n <= 32:
            expect[idx] = attn(x[idx][None])[0]
        else:
            for p in range(0, n, 32):
                if p + 32 <= n:
                    patch = idx[p:p + 32]
                    expect[patch] = attn(x[patch][None])[0]
                else:  # PTv3's padding: the last patch is completed with the tail of the previous one
                    r = n - p
                    patch = torch.cat([idx[p:], idx[p - (32 - r):p]])
                    expect[idx[p:]] = attn(x[patch][None])[0, :r]
        start += n
    torch.testing.assert_close(y, expect)


def test_whole_scene_pom_is_per_scene():
    torch.manual_seed(0)
    grids = [surface_scene(300, 16, 0), surface_scene(120, 16, 1)]
    feat, grid, offset = batch_of(grids, 8)
    batch = torch.repeat_interleave(torch.arange(2), torch.tensor([len(g) for g in grids]))
    level = PointLevel.build(grid, batch, ORDERS, shuffle=False)
    pom = PoM(8).double()
    with torch.no_grad():
        pom.coeff.uniform_(-1, 1)  # far from the ±1e-3 initialisation, so that the mean matters
    y = SerializedMixer(pom, None)(feat, level=level, order_index=0)
    a = len(grids[0])
    torch.testing.assert_close(y[:a], pom(feat[:a][None])[0])
    torch.testing.assert_close(y[a:], pom(feat[a:][None])[0])


# -- sparse convolution ------------------------------------------------------------------------------------------

def _dense_weight(weight, k):
    # (k³, Cin, Cout) x-major offsets → conv3d's (Cout, Cin, kx, ky, kz)
    return weight.view(k, k, k, weight.shape[1], weight.shape[2]).permute(4, 3, 0, 1, 2)


@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("density", [1.0, 0.3])
def test_submconv_matches_dense_conv3d(k, density):
    torch.manual_seed(k)
    side, cin, cout = 7, 3, 4
    cells = torch.tensor(list(itertools.product(range(side), repeat=3)))
    active = cells[torch.rand(len(cells)) < density]
    x = torch.randn(len(active), cin, dtype=torch.float64)
    w = torch.randn(k ** 3, cin, cout, dtype=torch.float64)
    nbr = neighbour_map(active, torch.zeros(len(active), dtype=torch.long), k)
    y = submconv3d(x, w, nbr)
    dense = torch.zeros(1, cin, side, side, side, dtype=torch.float64)
    dense[0, :, active[:, 0], active[:, 1], active[:, 2]] = x.t()
    ref = F.conv3d(dense, _dense_weight(w, k), padding=k // 2)[0]
    torch.testing.assert_close(y, ref[:, active[:, 0], active[:, 1], active[:, 2]].t())


def test_submconv_never_crosses_scenes():
    g = surface_scene(90, 6, 3)
    grid = torch.cat([g, g])
    batch = torch.repeat_interleave(torch.arange(2), len(g))
    nbr = neighbour_map(grid, batch, 3)
    n = len(g)
    valid = nbr < len(grid)
    assert bool(((nbr[:n] < n) | ~valid[:n]).all()) and bool(((nbr[n:] >= n) | ~valid[n:]).all())
    assert torch.equal(nbr[:n], neighbour_map(g, torch.zeros(n, dtype=torch.long), 3).masked_fill(~valid[:n], 2 * n))


def test_submconv_gradcheck_and_autograd_agree():
    torch.manual_seed(0)
    grid = surface_scene(40, 4, 0)
    nbr = neighbour_map(grid, torch.zeros(len(grid), dtype=torch.long), 3)
    x = torch.randn(len(grid), 2, dtype=torch.float64, requires_grad=True)
    w = torch.randn(27, 2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: submconv3d(a, b, nbr), (x, w))
    g = torch.randn(len(grid), 3, dtype=torch.float64)
    ours = torch.autograd.grad(submconv3d(x, w, nbr), (x, w), g)
    plain = torch.autograd.grad(submconv3d(x, w, nbr, backward="autograd"), (x, w), g)
    for a, b in zip(ours, plain):
        torch.testing.assert_close(a, b)


def test_kernel_offsets_are_symmetric():
    off = kernel_offsets(5)
    assert torch.equal(off.flip(0), -off)


def test_duplicate_voxels_are_refused():
    grid = torch.tensor([[0, 0, 0], [1, 2, 3], [1, 2, 3]])
    with pytest.raises(ValueError, match="share the voxel"):
        neighbour_map(grid, torch.zeros(3, dtype=torch.long), 3)


# -- the network -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mixer", ["attention", "pom", "hybrid", "value_pom", "value_pom-scene", "AV"])
def test_scene_in_a_batch_equals_the_scene_alone(mixer):
    torch.manual_seed(0)
    pom_patch = (None, 48, 24) if mixer in ("hybrid", "AV") else None if mixer.endswith("-scene") else "patch"
    model = create_model("tiny-ptv3", **{**SMALL, "mixer": mixer.removesuffix("-scene"), "pom_patch_size": pom_patch,
                                         "sel_heads": 2})
    model = model.double().eval()
    grids = [surface_scene(700, 20, 0), surface_scene(150, 20, 1), surface_scene(40, 20, 2)]
    feat, grid, offset = batch_of(grids)
    with torch.no_grad():
        together = model(feat, grid, offset)
        start = 0
        for g in grids:
            alone = model(feat[start:start + len(g)], g, torch.tensor([len(g)]))
            torch.testing.assert_close(together[start:start + len(g)], alone)
            start += len(g)
    assert together.shape == (len(grid), 5)


def test_training_forward_shuffles_orders_and_backprops():
    torch.manual_seed(0)
    model = create_model("tiny-ppomv3", **{**SMALL, "drop_path": 0.2}).train()
    feat, grid, offset = batch_of([surface_scene(400, 16, 0), surface_scene(300, 16, 1)])
    out = model(feat.float(), grid, offset)
    out.square().mean().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("bad, match", [
    (lambda f, g, o: (f[:, :4], g, o), "feat must be"),
    (lambda f, g, o: (f, g[:, :2], o), "grid must be"),
    (lambda f, g, o: (f, g.float(), o), "integer voxel"),
    (lambda f, g, o: (f, g - 5, o), "≥ 0"),
    (lambda f, g, o: (f, g, o + 1), "running counts"),
    (lambda f, g, o: (f, g * 2 ** 13, o), "too large for the curve codes"),
])
def test_bad_inputs_name_the_problem(bad, match):
    model = create_model("tiny-ptv3", **SMALL).eval()
    feat, grid, offset = batch_of([surface_scene(100, 12, 0)])
    with pytest.raises((ValueError, TypeError), match=match):
        model(*bad(feat.float(), grid, offset))
