"""Class-conditional diffusion transformers: DiT / SiT with attention, DiPoM / SiPoM with PoM.

The backbone of DiT (Peebles & Xie) and SiT (Ma et al.): patch embedding by a strided convolution, fixed 2-D sin-cos
positions (or 2-D rotary positions inside the mixer, which lets one model run at other resolutions), a timestep
embedder (sinusoidal features + MLP), a label embedder with an extra "no class" row for classifier-free guidance,
blocks with adaLN-Zero modulation, a final adaLN layer and unpatchify. The blocks are the core's
:class:`~polymixer.PolyMorpher` extended with adaLN modulation; the mixer is full (non-causal) attention or PoM.

Names: ``{sit,sipom,dit,dipom}-{s,b,l,xl}/{2,4,8}`` (SiT/SiPoM train with flow matching and predict the velocity;
DiT/DiPoM with DDPM and learn the variance), and ``tiny-sit`` / ``tiny-sipom`` for 2 CPU cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from ..blocks import PoMSettings, PolyMorpher, allowed_letters, layer_pattern, mixer_options, mixer_spec
from ..layers.pom import shift_width
from ..ranges import Range, check_ranges
from ..ops import parallel
from ..layers.positions import grid_positions, sincos_2d

__all__ = ["DiTConfig", "DiT", "AdaLNPolyMorpher", "modulate", "timestep_features"]


@dataclass
class DiTConfig(PoMSettings):
    RENAMED: ClassVar[Dict[str, str]] = {"shift_width": "token_shift"}  # earlier names (checkpoints load)
    RANGES: ClassVar[Dict[str, Range]] = {  # checked when a config is made (polymixer.ranges)
        **{n: Range(1) for n in ("input_size", "patch_size", "in_channels", "hidden_size", "depth", "num_heads",
                                 "num_classes", "window")},  # (and the shared ones: polymixer.ranges.SHARED)
        "mlp_ratio": Range(0, low_open=True), "class_dropout_prob": Range(0, 1, high_open=True)}
    MIXER_LETTERS: ClassVar[str] = allowed_letters(full=True)  # every block mixes the patches both ways
    MIXER_OPTIONS: ClassVar[Tuple[str, ...]] = ("window", "degree", "expand", "sel_heads", "gate", "reduction",
                                                "value_dim", "value_heads", "token_shift", "attention_shift")
    input_size: int = 32  # latent side (DiT's 256-pixel images through the SD VAE)
    patch_size: int = 2
    in_channels: int = 4
    hidden_size: int = 1152
    depth: int = 28
    num_heads: int = 16
    mlp_ratio: float = 4.0
    num_classes: int = 1000
    class_dropout_prob: float = 0.1  # labels dropped to the "no class" row in training (classifier-free guidance)
    learn_sigma: bool = True
    mixer: str = "attention"  # "attention" (DiT / SiT) | "pom" (DiPoM / SiPoM) | "value_pom" | "hybrid" | a pattern
    #                           over A / P / V / L (the mixer table's letters), tiled over the blocks
    window: int = 10  # L blocks (local attention): bidirectional band |i − j| < window over the row-major patches;
    #                   10 on an 8-wide grid covers each patch's 3 × 3 neighbourhood
    degree: int = 2
    expand: float = 2
    value_dim: Optional[int] = None  # V blocks (value-carrying PoM): value width dv (None: hidden_size)
    value_heads: int = 1  # V blocks: heads splitting D and dv
    token_shift: int = 2  # V blocks: patches the key / value shift reads in row-major order (2: each and the previous)
    attention_shift: int = 0  # A / L layers: tokens their key / value shift reads (0: none; the value PoM's shift,
    #                           offered to attention alike)
    position: str = "sincos"  # "sincos" (fixed 2-D sin-cos added to the patches) | "rope" (2-D rotary in the mixer)
    #                           | "sincos_rope" (both: absolute positions added, relative ones turning the mixer)
    local_conv: int = 0  # k > 0: every block's mixer branch adds a depthwise k × k convolution of its input over the
    #                      patch grid (the local term of linear-attention vision models); 0: none

    def __post_init__(self) -> None:
        check_ranges(self)
        self.layer_pattern()
        shift_width(self.token_shift, "token_shift", off=False)
        shift_width(self.attention_shift, "attention_shift")
        if isinstance(self.local_conv, bool) or not isinstance(self.local_conv, int) or self.local_conv < 0 or (
                self.local_conv and self.local_conv % 2 == 0):
            raise ValueError(f"local_conv must be 0 (none) or an odd kernel size, got {self.local_conv!r}")
        if self.position not in ("sincos", "rope", "sincos_rope"):
            raise ValueError(f"position must be 'sincos', 'rope' or 'sincos_rope', got {self.position!r}")
        if self.input_size % self.patch_size:
            raise ValueError(f"input_size {self.input_size} is not divisible by patch_size {self.patch_size}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")

    def layer_pattern(self) -> str:
        """One letter per block; the hybrid alternates attention and PoM."""
        return layer_pattern(self.mixer, self.depth, hybrid="AP", allowed=self.MIXER_LETTERS)

    @property
    def out_channels(self) -> int:
        return self.in_channels * 2 if self.learn_sigma else self.in_channels


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """adaLN: x · (1 + scale) + shift, per sample (shift / scale are (B, C))."""
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


def timestep_features(t: Tensor, dim: int, max_period: float = 10000.0) -> Tensor:
    """Sinusoidal features of (possibly fractional) timesteps: (B,) → (B, dim), [cos, sin] as in DiT."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
    return emb


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden: int, freq_dim: int = 256) -> None:
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t: Tensor) -> Tensor:
        return self.mlp(timestep_features(t, self.freq_dim).to(self.mlp[0].weight.dtype))


class LabelEmbedder(nn.Module):
    """Class embeddings with one extra row, the "no class" label used for classifier-free guidance."""

    def __init__(self, num_classes: int, hidden: int, dropout_prob: float) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.dropout_prob = dropout_prob
        self.table = nn.Embedding(num_classes + 1, hidden)

    def forward(self, y: Tensor, force_drop: Optional[Tensor] = None) -> Tensor:
        if self.training and self.dropout_prob > 0 and force_drop is None:
            drop = torch.rand(y.shape[0], device=y.device) < self.dropout_prob
            y = torch.where(drop, torch.full_like(y, self.num_classes), y)
        elif force_drop is not None:
            y = torch.where(force_drop, torch.full_like(y, self.num_classes), y)
        return self.table(y)


class AdaLNPolyMorpher(PolyMorpher):
    """PolyMorpher conditioned by adaLN-Zero: shift / scale / gate for the mixer and the MLP regressed from the
    conditioning vector; the regression is zero-initialised, so a fresh block is the identity.

    ``local_conv`` = k > 0 adds a depthwise k × k convolution of the mixer's input over the patch grid to the mixer's
    output (as the depthwise term of focused linear attention and SANA's convolutions): a global linear-time mixer
    then keeps each patch's neighbourhood exact. ``forward`` needs the grid (gh, gw) for it.
    """

    def __init__(self, dim: int, mixer: Union[str, nn.Module], mlp_ratio: float = 4.0, local_conv: int = 0,
                 **mixer_kwargs: Any) -> None:
        super().__init__(dim, mixer=mixer, mlp_ratio=mlp_ratio, norm_affine=False, norm_eps=1e-6,
                         mlp_activation=lambda: nn.GELU(approximate="tanh"), **mixer_kwargs)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        nn.init.zeros_(self.adaLN_modulation[1].weight)
        nn.init.zeros_(self.adaLN_modulation[1].bias)
        self.local_conv = nn.Conv2d(dim, dim, local_conv, padding=local_conv // 2, groups=dim) if local_conv else None

    def forward(self, x: Tensor, c: Tensor, positions: Optional[Tensor] = None,  # type: ignore[override]
                grid: Optional[Tuple[int, int]] = None) -> Tensor:
        shift_m, scale_m, gate_m, shift_f, scale_f, gate_f = self.adaLN_modulation(c).chunk(6, dim=1)
        kw = {} if positions is None else {"positions": positions}
        u = modulate(self.norm1(x), shift_m, scale_m)
        y = self.mixer(u, **kw)
        if self.local_conv is not None:
            if grid is None or grid[0] * grid[1] != u.shape[1]:
                raise ValueError(f"local_conv needs the patch grid (gh, gw) of the {u.shape[1]} tokens, got {grid}")
            img = u.transpose(1, 2).reshape(u.shape[0], u.shape[2], *grid)
            y = y + self.local_conv(img).flatten(2).transpose(1, 2)
        x = x + gate_m.unsqueeze(1) * y
        return x + gate_f.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_f, scale_f))


class FinalLayer(nn.Module):
    def __init__(self, hidden: int, patch: int, out_channels: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden, patch * patch * out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm(x), shift, scale))


class DiT(nn.Module):
    """Diffusion transformer: ``model(x, t, y)`` with x (B, C, H, W), t (B,) in the objective's time units, y (B,)
    class ids (``num_classes`` = no class) → (B, out_channels, H, W)."""

    family = "image"

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.config = c = config
        self.patch = nn.Conv2d(c.in_channels, c.hidden_size, kernel_size=c.patch_size, stride=c.patch_size)
        self.t_embedder = TimestepEmbedder(c.hidden_size)
        self.y_embedder = LabelEmbedder(c.num_classes, c.hidden_size, c.class_dropout_prob)
        grid = c.input_size // c.patch_size
        self.register_buffer("pos_embed", sincos_2d(grid, grid, c.hidden_size).unsqueeze(0), persistent=False)
        self.pattern = c.layer_pattern()
        self.blocks = nn.ModuleList([AdaLNPolyMorpher(c.hidden_size, self.build_mixer(letter), c.mlp_ratio,
                                                      local_conv=c.local_conv) for letter in self.pattern])
        self.final_layer = FinalLayer(c.hidden_size, c.patch_size, c.out_channels)
        self.initialize_weights()

    def build_mixer(self, letter: str) -> nn.Module:
        """A block's bidirectional mixer from the mixer table, with a bias on its output projection."""
        c = self.config
        return mixer_spec(letter).make(c.hidden_size, heads=c.num_heads, bias=True, causal=False,
                                       rope="2d" if "rope" in c.position else None, **mixer_options(c))

    def initialize_weights(self) -> None:
        """DiT's initialisation: Xavier-uniform linears, N(0, 0.02) embeddings, adaLN-Zero and a zero output layer
        (PoM's polynomial coefficients keep the reference's ±1e-3); the 2-D sin-cos positions (a buffer)."""
        grid = self.config.input_size // self.config.patch_size
        self.pos_embed.copy_(sincos_2d(grid, grid, self.config.hidden_size).unsqueeze(0))

        def xavier(m: nn.Module) -> None:
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

        self.apply(xavier)
        w = self.patch.weight.data
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        nn.init.zeros_(self.patch.bias)
        nn.init.normal_(self.y_embedder.table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        for blk in self.blocks:
            nn.init.zeros_(blk.adaLN_modulation[1].weight)
            nn.init.zeros_(blk.adaLN_modulation[1].bias)
        for m in (self.final_layer.adaLN_modulation[1], self.final_layer.linear):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)

    def _check(self, x: Tensor, t: Tensor, y: Tensor) -> Tuple[int, int]:
        c = self.config
        if x.dim() != 4 or x.shape[1] != c.in_channels:
            raise ValueError(f"x must have shape (batch, {c.in_channels}, H, W), got {tuple(x.shape)}")
        H, W = x.shape[-2:]
        if H % c.patch_size or W % c.patch_size:
            raise ValueError(f"image size {H}×{W} is not divisible by the patch size {c.patch_size}")
        if t.shape != (x.shape[0],) or y.shape != (x.shape[0],):
            raise ValueError(f"t and y must have shape ({x.shape[0]},), got {tuple(t.shape)} and {tuple(y.shape)}")
        if y.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"y must hold integer class ids, got dtype {y.dtype}")
        if not torch.compiler.is_compiling() and y.numel():
            lo, hi = int(y.min()), int(y.max())
            if lo < 0 or hi > c.num_classes:
                raise ValueError(f"class id {hi if hi > c.num_classes else lo} is out of range: 0 … "
                                 f"{c.num_classes - 1}, or {c.num_classes} for no class")
        return H // c.patch_size, W // c.patch_size

    def unpatchify(self, x: Tensor, gh: int, gw: int) -> Tensor:
        """(B, gh·gw, p²·C) → (B, C, gh·p, gw·p)."""
        p, C = self.config.patch_size, self.config.out_channels
        x = x.reshape(x.shape[0], gh, gw, p, p, C)
        return torch.einsum("bhwpqc->bchpwq", x).reshape(x.shape[0], C, gh * p, gw * p)

    def embed(self, x: Tensor, rows: Tuple[int, int]) -> Tuple[Tensor, Optional[Tensor]]:
        """The patch tokens of the patch rows [r0, r1) of ``x`` (B, C, H, W), positions added: (B, (r1 − r0)·gw,
        hidden) and their 2-D rotary coordinates (or None).

        The patch embedding is a stride-p convolution, so embedding only the image rows [r0·p, r1·p) gives exactly
        those patches: under context parallelism each rank embeds its own band of the image, never the whole. The
        positions (sin-cos added, rotary passed on) are the band's global ones."""
        c = self.config
        p, (r0, r1) = c.patch_size, rows
        gh, gw = x.shape[-2] // p, x.shape[-1] // p
        h = self.patch(x[:, :, r0 * p:r1 * p]).flatten(2).transpose(1, 2)
        a, b = r0 * gw, r1 * gw  # the band's tokens in the row-major patch sequence
        if "sincos" in c.position:
            pe = self.pos_embed if (gh, gw) == (c.input_size // p,) * 2 else \
                sincos_2d(gh, gw, c.hidden_size).to(h.device).unsqueeze(0)
            h = h + pe[:, a:b].to(h.dtype)
        positions = grid_positions(gh, gw, device=x.device)[a:b] if "rope" in c.position else None
        return h, positions

    def forward(self, x: Tensor, t: Tensor, y: Tensor, force_drop: Optional[Tensor] = None) -> Tensor:
        """The prediction (B, out_channels, H, W).

        Under an active :func:`polymixer.context_parallel` every rank still takes the whole ``x`` and returns the
        whole prediction, but embeds only its own equal band of patch rows (the number of patch rows must be
        divisible by the group), runs the blocks on that band (the mixers' collectives mix across ranks), applies
        the final layer to it, and gathers the predicted patches (B, N/P, p²·out_channels) once at the end: no
        (B, N, hidden) tokens on any rank."""
        gh, gw = self._check(x, t, y)
        rows = (0, gh)
        cp = parallel.active()
        if cp is not None:  # context parallelism: this rank's equal band of patch rows
            if self.config.local_conv:
                raise ValueError("context_parallel: the local convolution over the patch grid would need its "
                                 "neighbours from other ranks; train without local_conv or without the context")
            rows = parallel.even_slice(gh, cp, "the patch rows (image height / patch size)")
        h, positions = self.embed(x, rows)
        c = self.t_embedder(t) + self.y_embedder(y, force_drop)
        for blk in self.blocks:
            h = blk(h, c, positions=positions, grid=(gh, gw))
        out = self.final_layer(h, c)
        if cp is not None:
            out = parallel.gather_tokens(out, cp, "image output tokens")
        return self.unpatchify(out, gh, gw)

    def forward_with_cfg(self, x: Tensor, t: Tensor, y: Tensor, scale: float) -> Tensor:
        """Classifier-free guidance on every predicted channel: uncond + scale · (cond − uncond). The learned
        variance channels (``learn_sigma``) are taken from the conditional pass."""
        if scale == 1.0:
            return self.forward(x, t, y)
        n = x.shape[0]
        out = self.forward(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, torch.full_like(y,
                           self.config.num_classes)]))
        cond, uncond = out[:n], out[n:]
        C = self.config.in_channels
        guided = uncond[:, :C] + scale * (cond[:, :C] - uncond[:, :C])
        return torch.cat([guided, cond[:, C:]], dim=1)


def _register() -> None:
    from .registry import register_model

    sizes = {"s": (12, 384, 6), "b": (12, 768, 12), "l": (24, 1024, 16), "xl": (28, 1152, 16)}
    # SiPoM / DiPoM: PoM of degree 2 and expand 0.75 with the reference's per-channel gates. A PoM layer then holds
    # 3·h·D + 3·D + h = 2.25·h² + … parameters instead of attention's 4·h² + 4·h, which reproduces the paper's
    # SiPoM-L/2 (414M) and SiPoM-XL/2 (609M) counts.
    pom = dict(mixer="pom", degree=2, expand=0.75, sel_heads=1)
    for size, (depth, hidden, heads) in sizes.items():
        for patch in (2, 4, 8):
            arch = dict(depth=depth, hidden_size=hidden, num_heads=heads, patch_size=patch)
            tag = f"{size}/{patch}"
            register_model(f"sit-{tag}", "image", DiTConfig, DiT, "SiT (flow matching, attention)", learn_sigma=False,
                           mixer="attention", **arch)
            register_model(f"dit-{tag}", "image", DiTConfig, DiT, "DiT (DDPM, attention)", learn_sigma=True,
                           mixer="attention", **arch)
            register_model(f"sipom-{tag}", "image", DiTConfig, DiT, "SiPoM (flow matching, PoM)", learn_sigma=False,
                           **pom, **arch)
            register_model(f"dipom-{tag}", "image", DiTConfig, DiT, "DiPoM (DDPM, PoM)", learn_sigma=True, **pom,
                           **arch)
            # the value-carrying PoM: D = dv = hidden, one gate scalar and one value head per attention head (head
            # width 64, as attention's): +0.11–0.17% of SiT / DiT's parameters at every size
            value = dict(mixer="value_pom", degree=2, expand=1, sel_heads=heads, value_heads=heads)
            register_model(f"sipom-value-{tag}", "image", DiTConfig, DiT, "SiPoM with the value-carrying PoM",
                           learn_sigma=False, **value, **arch)
            register_model(f"dipom-value-{tag}", "image", DiTConfig, DiT, "DiPoM with the value-carrying PoM",
                           learn_sigma=True, **value, **arch)
    # 2-core CPU scale: 16×16 single-channel digits, 64 tokens of 128 channels, 6 blocks; SiPoM keeps the
    # paper-scale PoM settings, so it is the smaller model here too
    tiny = dict(input_size=16, patch_size=2, in_channels=1, hidden_size=128, depth=6, num_heads=4, num_classes=10,
                learn_sigma=False)
    register_model("tiny-sit", "image", DiTConfig, DiT, "tiny SiT for the digits", mixer="attention", **tiny)
    register_model("tiny-sipom", "image", DiTConfig, DiT, "tiny SiPoM for the digits", **pom, **tiny)
    # D = dv = 128, one gate scalar per attention head, one value head (a 128 × 128 state): tiny SiT's count +0.41%
    register_model("tiny-sipom-value", "image", DiTConfig, DiT, "tiny SiPoM with the value-carrying PoM",
                   mixer="value_pom", degree=2, expand=1, sel_heads=4, value_heads=1, **tiny)
    # no full-attention block: local attention over each patch's 3 × 3 neighbourhood (window 10 in row-major order,
    # 19 of the 64 patches) then the value-carrying PoM of tiny-sipom-value, three pairs: tiny SiT's count +0.20%
    register_model("tiny-sipom-vhybrid", "image", DiTConfig, DiT,
                   "tiny SiPoM, local attention + value-carrying PoM pairs", mixer="LV", window=10, degree=2,
                   expand=1, sel_heads=4, value_heads=1, **tiny)


_register()
