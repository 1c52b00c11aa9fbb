"""Diffusion transformers: presets, adaLN-Zero, guidance, objectives, samplers, data, evaluation, commands."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from conftest import rank_results, torchrun

from polymixer.experiments.image.data import digits, image_folder, save_grid
from polymixer.experiments.image.diffusion import FlowMatching, GaussianDiffusion, make_objective
from polymixer.models import count_parameters, create_model
from polymixer.models.image import AdaLNPolyMorpher, DiT, DiTConfig
from polymixer.experiments.image.task import frechet_distance


def _tiny(mixer="pom", **kw):
    torch.manual_seed(0)
    cfg = dict(input_size=8, patch_size=2, in_channels=1, hidden_size=32, depth=2, num_heads=4, num_classes=10,
               learn_sigma=False, mixer=mixer)
    cfg.update(kw)
    return DiT(DiTConfig(**cfg))


@pytest.mark.parametrize("name, target, tol", [("sit-l/2", 458.1e6, 0.005), ("sit-xl/2", 675.1e6, 0.005),
                                               ("sipom-l/2", 414e6, 0.02), ("sipom-xl/2", 609e6, 0.02)])
def test_paper_parameter_counts_on_meta_device(name, target, tol):
    m = create_model(name, device="meta")
    assert all(p.is_meta for p in m.parameters())
    n = count_parameters(m)
    assert abs(n / target - 1) < tol, (name, n)


def test_preset_names():
    for fam in ("sit", "sipom", "dit", "dipom"):
        for size in ("s", "b", "l", "xl"):
            for p in (2, 4, 8):
                create_model(f"{fam}-{size}/{p}", device="meta")
    assert create_model("dit-s/2", device="meta").config.learn_sigma
    assert not create_model("sit-s/2", device="meta").config.learn_sigma


def test_fresh_adaln_zero_block_is_identity_and_model_outputs_zero():
    blk = AdaLNPolyMorpher(32, "pom")
    x, c = torch.randn(2, 10, 32), torch.randn(2, 32)
    torch.testing.assert_close(blk(x, c), x)
    m = _tiny()
    out = m(torch.randn(3, 1, 8, 8), torch.rand(3) * 1000, torch.tensor([0, 5, 10]))
    assert out.shape == (3, 1, 8, 8) and out.abs().max() == 0


def _trained_a_bit(mixer="pom", **kw):
    m = _tiny(mixer, **kw)
    with torch.no_grad():  # leave the identity: random adaLN and output layers
        for p in m.parameters():
            if p.abs().sum() == 0 and p.dim() > 0:
                p.normal_(0, 0.05)
    return m


@pytest.mark.parametrize("mixer", ["attention", "pom", "value_pom"])
def test_cfg_scale_one_is_the_conditional_prediction(mixer):
    m = _trained_a_bit(mixer, learn_sigma=True).eval()
    x, t, y = torch.randn(4, 1, 8, 8), torch.rand(4) * 1000, torch.tensor([1, 2, 3, 4])
    torch.testing.assert_close(m.forward_with_cfg(x, t, y, 1.0), m(x, t, y))
    g = m.forward_with_cfg(x, t, y, 3.0)
    cond, unc = m(x, t, y), m(x, t, torch.full_like(y, 10))
    torch.testing.assert_close(g[:, :1], unc[:, :1] + 3.0 * (cond[:, :1] - unc[:, :1]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g[:, 1:], cond[:, 1:])  # learned variance from the conditional pass


def test_local_attention_blocks_see_only_their_window_both_ways():
    """An L block attends to the patches within ``window`` in row-major order, before and after it (not causally);
    an A block of the same model stays global."""
    m = _tiny("L", depth=1, window=2).eval()  # 4 × 4 patches, each sees itself and its row-major neighbours
    torch.manual_seed(1)
    for p in m.parameters():  # off the adaLN-Zero start, where the output is zero whatever the input
        torch.nn.init.normal_(p, std=0.2)
    x, t, y = torch.randn(1, 1, 8, 8), torch.rand(1), torch.tensor([3])
    x2 = x.clone()
    x2[..., 2:4, 2:4] += 1.0  # patch (1, 1): token 5
    changed = (m(x2, t, y) - m(x, t, y)).abs().reshape(4, 2, 4, 2).sum((1, 3)).flatten() > 1e-6
    assert changed.nonzero().flatten().tolist() == [4, 5, 6]
    mixer = m.blocks[0].mixer
    assert mixer.window == 2 and not mixer.causal
    assert _tiny("AL", window=2).blocks[0].mixer.window is None


def test_local_conv_adds_a_depthwise_convolution_of_the_mixer_input():
    """With ``local_conv = 3`` a block's mixer branch is mixer(u) + the depthwise 3 × 3 convolution of u over the patch
    grid, zero-padded at the borders: checked against a float64 sum written out tap by tap, and a patch's change
    reaches only its 3 × 3 neighbourhood through it when the mixer's output is silenced."""
    torch.manual_seed(0)
    blk = AdaLNPolyMorpher(8, "value_pom", local_conv=3, value_dim=8, expand=1).double()
    for p in blk.parameters():
        torch.nn.init.normal_(p, std=0.3)
    gh, gw = 3, 4
    x, c = torch.randn(2, gh * gw, 8, dtype=torch.float64), torch.randn(2, 8, dtype=torch.float64)
    shift_m, scale_m, gate_m, shift_f, scale_f, gate_f = blk.adaLN_modulation(c).chunk(6, dim=1)
    u = blk.norm1(x) * (1 + scale_m[:, None]) + shift_m[:, None]
    w, b = blk.local_conv.weight[:, 0], blk.local_conv.bias
    grid = u.reshape(2, gh, gw, 8)
    conv = torch.zeros_like(grid)
    for i in range(gh):
        for j in range(gw):
            conv[:, i, j] = b
            for a in range(3):
                for e in range(3):
                    if 0 <= i + a - 1 < gh and 0 <= j + e - 1 < gw:
                        conv[:, i, j] += w[:, a, e] * grid[:, i + a - 1, j + e - 1]
    h = x + gate_m[:, None] * (blk.mixer(u) + conv.reshape(2, gh * gw, 8))
    want = h + gate_f[:, None] * blk.mlp(blk.norm2(h) * (1 + scale_f[:, None]) + shift_f[:, None])
    torch.testing.assert_close(blk(x, c, grid=(gh, gw)), want)
    with pytest.raises(ValueError, match="local_conv needs the patch grid"):
        blk(x, c)

    m = _trained_a_bit("value_pom", depth=1, local_conv=3).eval()  # 4 × 4 patches
    with torch.no_grad():
        m.blocks[0].mixer.out_proj.weight.zero_()
        m.blocks[0].mixer.out_proj.bias.zero_()
    x, t, y = torch.randn(1, 1, 8, 8), torch.rand(1), torch.tensor([3])
    x2 = x.clone()
    x2[..., 2:4, 2:4] += 1.0  # patch (1, 1)
    changed = (m(x2, t, y) - m(x, t, y)).abs().reshape(4, 2, 4, 2).sum((1, 3)) > 1e-6
    assert changed.nonzero().tolist() == [[r, q] for r in range(3) for q in range(3)]


@pytest.mark.parametrize("bad", [2, -1, True, 1.0])
def test_local_conv_must_be_an_odd_kernel(bad):
    with pytest.raises(ValueError, match="local_conv must be 0"):
        DiTConfig(local_conv=bad)


def test_local_conv_keeps_the_value_preset_within_one_percent():
    sit = count_parameters(create_model("tiny-sit", device="meta"))
    conv = create_model("tiny-sipom-value", local_conv=3, device="meta")
    assert conv.blocks[0].local_conv.weight.shape == (128, 1, 3, 3)
    assert abs(count_parameters(conv) / sit - 1) < 0.01


def test_tiny_local_hybrid_preset_has_no_full_attention():
    sit, hyb = create_model("tiny-sit", device="meta"), create_model("tiny-sipom-vhybrid", device="meta")
    assert hyb.pattern == "LVLVLV" and "A" not in hyb.pattern
    assert abs(count_parameters(hyb) / count_parameters(sit) - 1) < 0.01
    assert hyb.blocks[0].mixer.window == 10  # each patch's 3 × 3 neighbourhood on the 8-wide grid


def test_label_dropout_only_in_training():
    m = _trained_a_bit()
    y = torch.arange(10)
    m.eval()
    assert torch.equal(m.y_embedder(y), m.y_embedder.table(y))
    m.train()
    torch.manual_seed(0)
    dropped = (m.y_embedder(y.repeat(100)) == m.y_embedder.table.weight[10]).all(-1).float().mean()
    assert 0.05 < dropped < 0.2


@pytest.mark.parametrize("objective, learn_sigma", [("flow", False), ("ddpm", False), ("ddpm", True)])
@pytest.mark.parametrize("mixer", ["attention", "pom", "value_pom", "LV"])
def test_training_step_lowers_loss(objective, learn_sigma, mixer):
    m = _tiny(mixer, learn_sigma=learn_sigma).train()
    obj = make_objective(objective, learn_sigma)
    x = digits(8).images[:32]
    y = digits(8).labels[:32]
    g = torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(m.parameters(), lr=2e-3)

    def loss():
        with torch.no_grad():
            return float(obj.loss(m, x, y, generator=torch.Generator().manual_seed(1)))

    before = loss()
    for _ in range(15):
        lo = obj.loss(m, x, y, generator=g)
        opt.zero_grad()
        lo.backward()
        opt.step()
    assert loss() < before


class _GaussianVelocity(torch.nn.Module):
    """The exact velocity of the linear interpolant for data ~ N(μ, σ²) per pixel (the analytic case)."""

    def __init__(self, mu: float, sigma: float) -> None:
        super().__init__()
        self.mu, self.s2 = mu, sigma**2
        self.config = DiTConfig(input_size=4, patch_size=2, in_channels=1, num_classes=2, learn_sigma=False,
                                hidden_size=4, num_heads=1)

    def forward(self, x, t, y):
        t = (t / 1000.0).view(-1, 1, 1, 1).double()
        var = t**2 * self.s2 + (1 - t) ** 2
        dev = x.double() - t * self.mu
        e1 = self.mu + t * self.s2 / var * dev  # E[x_data | x_t]
        e0 = (1 - t) / var * dev  # E[noise | x_t]
        return (e1 - e0).float()


class _GaussianEps(_GaussianVelocity):
    """The exact ε-prediction for data ~ N(μ, σ²) under the DDPM schedule."""

    def __init__(self, mu, sigma, diffusion):
        super().__init__(mu, sigma)
        self.ac = diffusion.alphas_cumprod

    def forward(self, x, t, y):
        a = self.ac[t.long()].view(-1, 1, 1, 1)
        x = x.double()
        return (torch.sqrt(1 - a) / (a * self.s2 + 1 - a) * (x - torch.sqrt(a) * self.mu)).float()


def test_flow_ode_recovers_gaussian_data():
    model = _GaussianVelocity(mu=1.5, sigma=0.5)
    y = torch.zeros(4000, dtype=torch.long)
    for sampler, steps in (("heun", 50), ("euler", 400)):
        x = FlowMatching().sample(model, y, (4000, 1, 4, 4), steps=steps, sampler=sampler,
                                  generator=torch.Generator().manual_seed(0))
        assert abs(float(x.mean()) - 1.5) < 0.02 and abs(float(x.std()) - 0.5) < 0.02, (sampler, x.mean(), x.std())
    x = FlowMatching().sample(model, y, (4000, 1, 4, 4), steps=400, sampler="sde",
                              generator=torch.Generator().manual_seed(0))
    assert abs(float(x.mean()) - 1.5) < 0.03 and abs(float(x.std()) - 0.5) < 0.05


def test_ddim_and_ddpm_recover_gaussian_data():
    diff = GaussianDiffusion()
    model = _GaussianEps(-0.7, 0.3, diff)
    y = torch.zeros(4000, dtype=torch.long)
    for sampler, steps in (("ddim", 200), ("ddpm", 1000)):
        x = diff.sample(model, y, (4000, 1, 4, 4), steps=steps, sampler=sampler,
                        generator=torch.Generator().manual_seed(0))
        assert abs(float(x.mean()) + 0.7) < 0.03 and abs(float(x.std()) - 0.3) < 0.03, (sampler, x.mean(), x.std())


@pytest.mark.parametrize("objective, sampler", [("flow", "heun"), ("flow", "sde"), ("ddpm", "ddpm"),
                                                ("ddpm", "ddim")])
def test_samplers_are_deterministic_under_a_seed(objective, sampler):
    m = _trained_a_bit(learn_sigma=objective == "ddpm").eval()
    obj = make_objective(objective, m.config.learn_sigma)
    y = torch.tensor([0, 3, 7])

    def run(seed):
        return obj.sample(m, y, (3, 1, 8, 8), steps=6, sampler=sampler, guidance=2.0,
                          generator=torch.Generator().manual_seed(seed))

    assert torch.equal(run(5), run(5)) and not torch.equal(run(5), run(6))


def test_rope_model_runs_at_other_resolutions():
    m = _trained_a_bit(position="rope")
    for side in (8, 12, 16):
        assert m(torch.randn(2, 1, side, side), torch.rand(2) * 1000, torch.tensor([1, 2])).shape == (2, 1, side, side)
    s = _trained_a_bit(position="sincos")
    assert s(torch.randn(1, 1, 12, 12), torch.rand(1), torch.tensor([0])).shape == (1, 1, 12, 12)


@pytest.mark.parametrize("mixer", ["attention", "value_pom"])
def test_sincos_and_rope_together(mixer):
    """position="sincos_rope": the rotary model fed patches with the sin-cos table added — and not the sin-cos model."""
    both = _trained_a_bit(mixer, position="sincos_rope").double()
    rope = _trained_a_bit(mixer, position="rope").double()
    sincos = _trained_a_bit(mixer, position="sincos").double()
    rope.load_state_dict(both.state_dict())
    sincos.load_state_dict(both.state_dict())
    assert all(b.mixer.rope == "2d" for b in both.blocks) and all(b.mixer.rope is None for b in sincos.blocks)
    table = both.pos_embed.double().transpose(1, 2).reshape(1, 32, 4, 4)  # (1, hidden, gh, gw)
    rope.patch.register_forward_hook(lambda mod, inp, out: out + table)
    x, t, y = torch.randn(2, 1, 8, 8, dtype=torch.float64), torch.rand(2, dtype=torch.float64), torch.tensor([1, 5])
    with torch.no_grad():
        out = both(x, t, y)
        torch.testing.assert_close(out, rope(x, t, y), rtol=1e-10, atol=1e-10)
        assert (out - sincos(x, t, y)).abs().max() > 1e-4
        assert both(torch.randn(1, 1, 12, 12, dtype=torch.float64), t[:1], y[:1]).shape == (1, 1, 12, 12)


def test_bad_inputs():
    m = _tiny()
    with pytest.raises(ValueError, match="position must be 'sincos', 'rope' or 'sincos_rope'"):
        DiTConfig(position="learned")
    with pytest.raises(ValueError, match="not divisible by the patch size"):
        m(torch.randn(1, 1, 9, 9), torch.rand(1), torch.tensor([0]))
    with pytest.raises(ValueError, match="class id 11 is out of range"):
        m(torch.randn(1, 1, 8, 8), torch.rand(1), torch.tensor([11]))
    with pytest.raises(ValueError, match="class id -1"):
        m(torch.randn(1, 1, 8, 8), torch.rand(1), torch.tensor([-1]))
    with pytest.raises(ValueError, match="shape"):
        m(torch.randn(1, 3, 8, 8), torch.rand(1), torch.tensor([0]))
    with pytest.raises(ValueError, match="not divisible by patch_size"):
        DiTConfig(input_size=10, patch_size=4)
    with pytest.raises(ValueError, match="objective"):
        make_objective("edm")
    with pytest.raises(ValueError, match="velocity"):
        make_objective("flow", learn_sigma=True)


def test_digits_and_image_folder(tmp_path):
    d = digits(16)
    assert d.images.shape == (1797, 1, 16, 16) and d.num_classes == 10
    assert -1.0 <= float(d.images.min()) and float(d.images.max()) <= 1.0
    tr, te = d.split(0.2)
    assert len(tr.labels) + len(te.labels) == 1797 and abs(len(te.labels) - 359) < 10
    from PIL import Image

    for c in ("cat", "dog"):
        (tmp_path / "imgs" / c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.random.randint(0, 255, (20, 30, 3), dtype=np.uint8)).save(tmp_path / "imgs" / c /
                                                                                         f"{i}.png")
    f = image_folder(tmp_path / "imgs", 8, channels=3)
    assert f.images.shape == (6, 3, 8, 8) and f.classes == ["cat", "dog"] and f.labels.tolist() == [0] * 3 + [1] * 3
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(ValueError, match="no images found"):
        image_folder(tmp_path / "empty", 8)
    with pytest.raises(FileNotFoundError):
        image_folder(tmp_path / "nope", 8)
    p = save_grid(d.images[:20], tmp_path / "g.png", nrow=10)
    assert Image.open(p).size[0] > 100


def test_frechet_distance_of_known_gaussians():
    rng = np.random.default_rng(0)
    a = rng.normal(0, 1, (20000, 3))
    b = rng.normal(0, 2, (20000, 3)) + np.array([1.0, 0, 0])
    # closed form: |Δμ|² + Σ (1 + 4 − 2·2) = 1 + 3
    assert abs(frechet_distance(a, b) - 4.0) < 0.15
    assert frechet_distance(a, a) < 1e-6


def test_classifier_and_generator_evaluation(tmp_path, monkeypatch):
    """The judge is accurate on held-out digits, and real digits score like real digits."""
    monkeypatch.setenv("POLYMIXER_CACHE", str(tmp_path / "cache"))
    from polymixer.experiments.image.task import get_classifier

    d = digits(16)
    clf, acc, test = get_classifier(d)
    assert acc > 0.95
    again, acc2, _ = get_classifier(d)  # cached
    assert acc2 == acc
    with torch.no_grad():
        f_test = clf.embed(test.images).numpy()
        f_noise = clf.embed(torch.rand_like(test.images) * 2 - 1).numpy()
        f_train = clf.embed(d.images[:len(test.labels)]).numpy()
    assert frechet_distance(f_test, f_train) < 0.2 * frechet_distance(f_noise, f_train)


def test_train_sample_eval_commands(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("POLYMIXER_CACHE", str(tmp_path / "cache"))
    from polymixer.experiments.cli import main
    from polymixer.checkpoint import load_model

    out = tmp_path / "run"
    rc = main(["train", "image", "--preset", "tiny-sipom", "--objective", "ddpm", "--learn-sigma", "--steps", "3",
               "--batch-size", "8", "--eval-every", "3", "--ckpt-every", "3", "--eval-samples", "0", "--image-size",
               "8", "--out", str(out), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    assert (out / "samples" / "step_00000003.png").is_file()
    m = load_model(out, ema=True)
    assert m.config.learn_sigma and m.config.mixer == "pom" and m.config.input_size == 8
    rc = main(["sample", "--ckpt", str(out), "--classes", "0,1,2", "--n-per-class", "2", "--steps", "4", "--out",
               str(tmp_path / "grid.png")])
    assert rc == 0 and (tmp_path / "grid.png").is_file()
    rc = main(["sample", "--ckpt", str(out), "--classes", "3,12", "--steps", "2", "--out", str(tmp_path / "x.png")])
    assert rc == 2 and "class id 12 is out of range" in capsys.readouterr().err
    rc = main(["eval", "image", "--ckpt", str(out), "--n", "40", "--steps", "3"])
    text = capsys.readouterr().out
    assert rc == 0 and '"fd_real_floor"' in text and '"cond_accuracy"' in text
    # a checkpoint of another preset does not load into this one, naming the tensors
    from polymixer.checkpoint import load_weights

    other = create_model("tiny-sit", input_size=8)
    with pytest.raises(ValueError, match="does not fit this model"):
        load_weights(other, out)
    empty = tmp_path / "empty" / "cls"
    empty.mkdir(parents=True)
    rc = main(["train", "image", "--preset", "tiny-sit", "--data", str(tmp_path / "empty"), "--steps", "1",
               "--out", str(tmp_path / "run2"), "--quiet"])
    assert rc == 2 and "no images found" in capsys.readouterr().err


CP_SCRIPT = r'''
import torch
import torch.distributed as dist
import polymixer
from polymixer.models.image import DiT, DiTConfig
from polymixer.ops import parallel

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
out = {}
torch.manual_seed(0)
x = torch.randn(2, 3, 16, 8, dtype=torch.float64)  # 8 patch rows of 4: the grid of a non-square image
t, y = torch.rand(2, dtype=torch.float64) * 1000, torch.tensor([1, 10])
variants = {"pom sincos": dict(mixer="pom"), "pom rope": dict(mixer="pom", position="rope"),
            "attention + pom sincos_rope": dict(mixer="AP", position="sincos_rope"),
            "local + value pom sincos": dict(mixer="LV", window=3, expand=1, sel_heads=4, value_heads=2)}
for name, kw in variants.items():
    torch.manual_seed(1)
    m = DiT(DiTConfig(input_size=16, patch_size=2, in_channels=3, hidden_size=32, depth=2, num_heads=4,
                      num_classes=10, learn_sigma=True, **kw)).double()
    with torch.no_grad():  # leave the identity: random adaLN and output layers
        for p in m.parameters():
            if p.abs().sum() == 0 and p.dim() > 0:
                p.normal_(0, 0.05)
    m.eval()  # no label dropout: the two calls see the same classes
    xs = x.clone().requires_grad_()
    ref = m(xs, t, y)
    g = torch.randn_like(ref)
    (ref * g).sum().backward()
    ref_grads = [p.grad.clone() for p in m.parameters()] + [xs.grad.clone()]
    m.zero_grad()
    xs.grad = None
    embedded, logged = [], []
    hooks = [m.patch.register_forward_pre_hook(lambda mod, inp: embedded.append(list(inp[0].shape))),
             m.blocks[0].register_forward_pre_hook(lambda mod, inp: logged.append(len(cp.log)))]
    total = parallel.TOTAL["bytes_sent"]
    with polymixer.context_parallel() as cp:
        o = m(xs, t, y)
        (o * g).sum().backward()
    for h in hooks:
        h.remove()
    grads = [p.grad.clone() for p in m.parameters()] + [xs.grad.clone()]
    band = xs.grad.abs().sum(dim=(0, 1, 3)).nonzero().flatten()  # image rows this rank's gradient reaches
    for u in grads:
        dist.all_reduce(u)
    rel = lambda u, v: ((u - v).abs().max() / v.abs().max()).item()
    out[name] = {"y": rel(o, ref), "grads": max(rel(u / world, v) for u, v in zip(grads, ref_grads)),
                 "embedded": embedded, "log_before_blocks": logged, "log": cp.log,
                 "band": [int(band.min()), int(band.max())], "total": parallel.TOTAL["bytes_sent"] - total}
errors = {}
bad = {"rows": ((1, 3, 3 * world, 8), {}), "local_conv": ((1, 3, 16, 8), dict(local_conv=3))}
for name, (image, kw) in bad.items():
    m = DiT(DiTConfig(input_size=16, patch_size=2, in_channels=3, hidden_size=32, depth=1, num_heads=4,
                      num_classes=10, **kw))
    try:
        with polymixer.context_parallel():
            m(torch.randn(image), torch.rand(1), torch.tensor([0]))
        errors[name] = None
    except ValueError as e:
        errors[name] = str(e)
out["errors"] = errors
report(out)
dist.destroy_process_group()
'''


@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_ranks_embed_only_their_band_of_patch_rows(tmp_path, world):
    """Under context parallelism each rank patch-embeds its own band of H / P image rows (never the whole image),
    nothing is gathered before the blocks, the one token-sized gather is the predicted patches (B, N / P, p²·C) at
    the end, and outputs and gradients equal the single-process model's (fp64; every position form, hybrids)."""
    torchrun(CP_SCRIPT, [], tmp_path, world, name="cp_image.py")
    results = rank_results(tmp_path, world)
    B, C, H, W, p, hidden = 2, 3, 16, 8, 2, 32
    tokens = (H // p) * (W // p) // world  # this rank's patches
    for rank, out in enumerate(results):
        errors = out.pop("errors")
        assert errors["rows"] == (f"context_parallel over {world} ranks needs the patch rows (image height / patch "
                                  f"size) divisible by {world}, got {3 * world // p}"), errors["rows"]
        assert "local convolution" in errors["local_conv"]
        for name, r in out.items():
            assert r["y"] < 1e-10 and r["grads"] < 1e-10, (rank, name, r["y"], r["grads"])
            assert r["embedded"] == [[B, C, H // world, W]], (rank, name)  # the band, not the image
            rows = H // world
            assert r["band"] == [rank * rows, (rank + 1) * rows - 1], (rank, name)
            assert r["log_before_blocks"] == [0], (rank, name)  # nothing gathered before the blocks
            outputs = [n for what, n in r["log"] if what == "image output tokens"]
            assert outputs == [(world - 1) * B * tokens * p * p * 2 * C * 8], (rank, name)
            hidden_tokens = (world - 1) * B * tokens * hidden * 8
            if name.startswith("pom"):  # PoM sends its (B, D + 1) sums: nothing else is token-sized
                assert all(n < hidden_tokens for what, n in r["log"] if not what.startswith("image output")), r["log"]
            assert r["total"] == sum(n for _, n in r["log"])
