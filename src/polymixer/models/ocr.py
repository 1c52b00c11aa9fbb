"""Handwritten text recognition: HTR-VT (a ViT encoder with CTC) and HTR-VPoM, where the encoder's blocks are PoM.

HTR-VT (Li et al., Pattern Recognition 2025), exactly as its public code builds it: a grayscale line image
(height 64, values in [0, 1], white = 1) is layer-normalised per image, then a ResNet-18-style stem (3×3 convolutions
without bias + BatchNorm + ReLU; conv 1→C/4 stride (2,1), max-pool 3×3 stride (2,1), three stages of two BasicBlocks
at C/4, C/2, C channels with first strides (2,1), 2, 2, the max-pool again) turns it into one token per 4 pixels of
width — 64×512 → 128 tokens of 768. Fixed 2-D sin-cos positions are added (HTR-VT lays the tokens on a grid 8 wide:
token i sits at row i // 8, column i % 8), then pre-norm blocks, a final LayerNorm and a linear head whose class 0 is
the CTC blank. In training, 40% of the tokens, in spans of 8, are replaced by a learned mask token.

Each block is the core's :class:`~polymixer.PolyMorpher` holding the mixer its pattern letter names:

    A = attention (HTR-VT)       P = full PoM (HTR-VPoM)       L = bidirectional local attention

Beyond the original: lines of a batch are padded on the right and every operation is masked so that padding never
changes a prediction — the image norm and the training BatchNorm statistics count only real pixels, every stem
layer zeroes the padded columns (as the zero padding of a lone image would), the mixers get a key-padding mask (PoM's
mean does not count padded tokens) and CTC gets the true output lengths; positions extend to any width.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..blocks import PoMSettings, PolyMorpher, allowed_letters, layer_pattern, mixer_options, mixer_spec
from ..layers.pom import shift_width
from ..layers.positions import sincos_1d, sincos_2d
from ..ranges import Range, check_ranges

__all__ = ["HTRConfig", "HTR", "ResNetStem", "MaskedBatchNorm2d", "ctc_greedy_decode", "ctc_loss", "span_mask",
           "token_lengths", "PIXELS_PER_TOKEN"]

PIXELS_PER_TOKEN = 4  # line pixels per token: the recognisers' stems halve the width twice


@dataclass
class HTRConfig(PoMSettings):
    MIXER_LETTERS: ClassVar[str] = allowed_letters(full=True)  # every block mixes the line both ways
    MIXER_OPTIONS: ClassVar[Tuple[str, ...]] = ("window", "degree", "expand", "sel_heads", "gate", "reduction",
                                                "value_dim", "value_heads", "attention_shift")
    RANGES: ClassVar[Dict[str, Range]] = {  # checked when a config is made (polymixer.ranges); tuples per entry
        **{n: Range(1) for n in ("num_classes", "max_width", "dim", "depth", "heads", "window", "grid_width",
                                 "mask_span", "stem_channels")}, "mask_ratio": Range(0, 1, high_open=True)}
    num_classes: int = 80  # CTC blank (class 0) + the charset (IAM: 79 characters)
    height: int = 64  # line images are resized to this height (32 or 64: the stem reduces either to one row)
    max_width: int = 512  # width cap of a single line (the data pipeline's; pages concatenate capped lines)
    dim: int = 768
    depth: int = 4
    heads: int = 6
    mlp_ratio: float = 4.0
    stem_channels: Tuple[int, int, int] = (192, 384, 768)  # the three ResNet stages; a Linear maps the last to dim
    mixer: str = "attention"  # "attention" (HTR-VT) | "pom" (HTR-VPoM) | "hybrid" (= "AP" repeated) | a pattern
    window: int = 64  # bidirectional local-attention window (L layers)
    degree: int = 2  # PoM degree
    expand: float = 2  # PoM expansion D = expand·dim
    sel_heads: int = 6  # PoM gate width: 1 = a gate per channel (the paper's), h = one gate scalar per head
    value_dim: Optional[int] = None  # V blocks (value-carrying PoM): value width dv (None: dim)
    value_heads: int = 1  # V blocks: heads splitting D and dv
    attention_shift: int = 0  # A / L layers: tokens their key / value shift reads (0: none; the value PoM's shift,
    #                           offered to attention alike)
    position: str = "grid"  # "grid": HTR-VT's 2-D sin-cos on a grid grid_width wide | "sincos": 1-D sin-cos
    grid_width: int = 8
    mask_ratio: float = 0.4  # training-time span masking: this fraction of each line's tokens …
    mask_span: int = 8  # … in spans of this many tokens
    norm_eps: float = 1e-6
    dropout: float = 0.0

    def __post_init__(self) -> None:
        check_ranges(self)
        self.stem_channels = tuple(int(c) for c in self.stem_channels)
        if len(self.stem_channels) != 3:
            raise ValueError(f"stem_channels must hold three stage widths, got {self.stem_channels}")
        if self.height not in (32, 64):
            raise ValueError(f"height must be 32 or 64 (the stem reduces either to one row of tokens), got "
                             f"{self.height}")
        shift_width(self.attention_shift, "attention_shift")
        if self.num_classes < 2:
            raise ValueError(f"num_classes counts the CTC blank and at least one character, got {self.num_classes}")
        if self.dim % self.heads:
            raise ValueError(f"dim = {self.dim} is not divisible by heads = {self.heads}")
        if self.position not in ("grid", "sincos"):
            raise ValueError(f"position must be 'grid' or 'sincos', got {self.position!r}")
        if self.position == "grid" and self.dim % 4:
            raise ValueError(f"2-D sin-cos positions need dim divisible by 4, got {self.dim}")
        self.layer_pattern()

    def layer_pattern(self) -> str:
        """One letter per block; the hybrid alternates attention and PoM, attention first (the paper's)."""
        return layer_pattern(self.mixer, self.depth, hybrid="AP", allowed=self.MIXER_LETTERS)


def token_lengths(widths: Tensor) -> Tensor:
    """Tokens the stem makes of lines ``widths`` pixels wide: ⌈⌈w / 2⌉ / 2⌉ = ⌈w / 4⌉."""
    return (widths + PIXELS_PER_TOKEN - 1) // PIXELS_PER_TOKEN


def _columns(widths: Optional[Tensor], width: int) -> Optional[Tensor]:
    """(B, 1, 1, width) float mask of the real columns, None when nothing is padded."""
    if widths is None:
        return None
    return (torch.arange(width, device=widths.device) < widths[:, None]).to(torch.float32)[:, None, None, :]


def _masked(x: Tensor, cols: Optional[Tensor]) -> Tensor:
    if cols is None:
        return x
    cols = cols.to(x.dtype)
    return x.mul_(cols) if not torch.is_grad_enabled() else x * cols


def _conv_bn(conv: nn.Conv2d, bn: "MaskedBatchNorm2d", x: Tensor, cols: Optional[Tensor]) -> Tensor:
    """conv → BatchNorm, padded columns zeroed. In evaluation the BatchNorm is folded into the convolution's weights
    and bias (one pass over the activations instead of two — the stem is most of HTR-VT's inference time)."""
    if bn.training or not bn.track_running_stats:
        return bn(conv(x), cols)
    scale = torch.rsqrt(bn.running_var + bn.eps)
    if bn.affine:
        scale = scale * bn.weight
    shift = -bn.running_mean * scale + (bn.bias if bn.affine else 0)
    y = F.conv2d(x, conv.weight * scale.to(conv.weight.dtype)[:, None, None, None], shift.to(conv.weight.dtype),
                 conv.stride, conv.padding)
    return _masked(y, cols)


def _max_pool(x: Tensor) -> Tensor:
    """HTR-VT's 3×3 max-pool with stride (2, 1) and padding 1, computed as a 3×1 then a 1×3 pool (max is separable:
    the same values with 6 comparisons per output instead of 9)."""
    x = F.max_pool2d(x, (3, 1), stride=(2, 1), padding=(1, 0))
    return F.max_pool2d(x, (1, 3), stride=1, padding=(0, 1))


class MaskedBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm for padded lines: its training statistics count only the real columns (padding would otherwise pull
    the batch mean and variance towards zero and make evaluation disagree with training), and given the column mask
    it returns the padded columns as zeros. Without a mask it is the ordinary BatchNorm."""

    def forward(self, x: Tensor, cols: Optional[Tensor] = None) -> Tensor:  # type: ignore[override]
        if cols is None:
            return super().forward(x)
        if not self.training or not self.track_running_stats:
            return _masked(super().forward(x), cols)
        m = cols.to(x.dtype)
        n = m.sum() * x.shape[2]
        # reduce over the height first, then weight the (B, C, 1, W) column sums by the mask
        mean = (x.sum(2, keepdim=True) * m).sum((0, 2, 3)) / n
        centred = x - mean[:, None, None]
        var = (centred.square().sum(2, keepdim=True) * m).sum((0, 2, 3)) / n
        with torch.no_grad():
            self.num_batches_tracked.add_(1)
            mom = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
            self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), mom)
            unbiased = var.detach() * (n / (n - 1).clamp(min=1))
            self.running_var.lerp_(unbiased.to(self.running_var.dtype), mom)
        scale = torch.rsqrt(var + self.eps)
        shift = torch.zeros_like(scale)
        if self.affine:
            scale, shift = scale * self.weight, self.bias
        # (x − μ)·scale + shift on the real columns, 0 on the padding, in one pass
        return torch.addcmul(shift[:, None, None] * m, centred, scale[:, None, None] * m)


class BasicBlock(nn.Module):
    """ResNet's basic block (two 3×3 convolutions, BatchNorm, ReLU, a 1×1 shortcut where the shape changes); every
    BatchNorm returns the padded columns as zeros, so each convolution sees what a lone line's zero padding gives."""

    def __init__(self, cin: int, cout: int, stride) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = MaskedBatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = MaskedBatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), MaskedBatchNorm2d(cout))

    def forward(self, x: Tensor, cols: Optional[Tensor]) -> Tensor:
        out = F.relu(_conv_bn(self.conv1, self.bn1, x, cols), inplace=True)  # zero padding stays zero
        out = _conv_bn(self.conv2, self.bn2, out, cols)
        res = x if self.downsample is None else _conv_bn(self.downsample[0], self.downsample[1], x, cols)
        return F.relu(out.add_(res), inplace=True)


class ResNetStem(nn.Module):
    """HTR-VT's ResNet-18-style stem: (B, 1, H, W) → (B, C, 1, ⌈W/4⌉) for H = 64 (or 32)."""

    def __init__(self, channels: Sequence[int]) -> None:
        super().__init__()
        c1, c2, c3 = channels
        self.conv1 = nn.Conv2d(1, c1, 3, stride=(2, 1), padding=1, bias=False)
        self.bn1 = MaskedBatchNorm2d(c1)
        self.layer1 = nn.ModuleList([BasicBlock(c1, c1, (2, 1)), BasicBlock(c1, c1, 1)])
        self.layer2 = nn.ModuleList([BasicBlock(c1, c2, 2), BasicBlock(c2, c2, 1)])
        self.layer3 = nn.ModuleList([BasicBlock(c2, c3, 2), BasicBlock(c3, c3, 1)])

    def forward(self, x: Tensor, widths: Optional[Tensor] = None) -> Tensor:
        """``widths``: (B,) real widths in pixels (None: no padding). Padded columns come out as zeros."""
        cols = _columns(widths, x.shape[-1])
        x = F.relu(_conv_bn(self.conv1, self.bn1, x, cols), inplace=True)
        x = _masked(_max_pool(x), cols)  # inputs are ≥ 0 after ReLU, so zeroed columns never win the max
        for stage in (self.layer1, self.layer2, self.layer3):
            for i, blk in enumerate(stage):
                if i == 0 and blk.conv1.stride[1] == 2:
                    widths = None if widths is None else (widths + 1) // 2
                    cols = _columns(widths, (x.shape[-1] + 1) // 2)
                x = blk(x, cols)
        return _masked(_max_pool(x), cols)


def _masked_image_norm(images: Tensor, widths: Optional[Tensor], eps: float = 1e-5) -> Tensor:
    """HTR-VT's first operation, a non-affine layer norm of each image over all its pixels — over the real pixels
    only when lines are padded (padding then becomes zeros, what a convolution sees beyond a lone image's edge)."""
    if widths is None:
        return F.layer_norm(images, images.shape[1:], eps=eps)
    cols = _columns(widths, images.shape[-1]).to(images.dtype)
    n = cols.sum((1, 2, 3), keepdim=True) * images.shape[1] * images.shape[2]
    mean = (images * cols).sum((1, 2, 3), keepdim=True) / n
    centred = images - mean
    var = (centred.square() * cols).sum((1, 2, 3), keepdim=True) / n
    return centred * torch.rsqrt(var + eps) * cols


def span_mask(lengths: Tensor, total: int, ratio: float, span: int,
              generator: Optional[torch.Generator] = None) -> Optional[Tensor]:
    """(B, total) bool, True = replaced by the mask token: per line, ⌊⌊ratio·L⌋ / span⌋ spans of ``span``
    tokens starting uniformly in [0, L − span] (HTR-VT's rule, drawn per line over its own L real tokens; spans may
    overlap). None when no line is long enough to get a span."""
    n_spans = torch.div((lengths.double() * ratio).floor().long(), span, rounding_mode="floor")
    most = int(n_spans.max()) if n_spans.numel() else 0
    if most == 0:
        return None
    room = (lengths - span + 1).clamp(min=1)
    u = torch.rand(lengths.shape[0], most, generator=generator, device=lengths.device)
    starts = (u * room[:, None]).long()  # (B, most)
    active = torch.arange(most, device=lengths.device)[None, :] < n_spans[:, None]
    pos = torch.arange(total, device=lengths.device)
    inside = (pos[None, None, :] >= starts[..., None]) & (pos[None, None, :] < starts[..., None] + span)
    return (inside & active[..., None]).any(1) & (pos[None, :] < lengths[:, None])


@functools.lru_cache(maxsize=32)
def _position_table(kind: str, tokens: int, dim: int, grid_width: int) -> Tensor:
    if kind == "sincos":
        return sincos_1d(torch.arange(tokens), dim)
    rows = -(-tokens // grid_width)
    return sincos_2d(rows, grid_width, dim)[:tokens]


class HTR(nn.Module):
    """HTR-VT / HTR-VPoM: ``model(images, widths)`` → (log-probabilities (B, T, classes) in float32, lengths (B,)).

    ``images``: (B, 1, height, W) in [0, 1] (white = 1), lines padded on the right to the batch width W;
    ``widths``: (B,) real widths in pixels, or None when no line is padded. Line b's prediction is
    ``log_probs[b, :lengths[b]]``, with lengths = ⌈widths / 4⌉; class 0 is the CTC blank.
    """

    family = "ocr"

    def __init__(self, config: HTRConfig) -> None:
        super().__init__()
        self.config = c = config
        self.pattern = c.layer_pattern()
        self.stem = ResNetStem(c.stem_channels)
        self.proj = nn.Linear(c.stem_channels[-1], c.dim) if c.stem_channels[-1] != c.dim else None
        self.mask_token = nn.Parameter(torch.zeros(1, 1, c.dim))
        self.blocks = nn.ModuleList()
        for letter in self.pattern:  # full (non-causal) mixers from the mixer table, a bias on their output
            mixer = mixer_spec(letter).make(c.dim, heads=c.heads, causal=False, dropout=c.dropout, bias=True,
                                            **mixer_options(c))
            self.blocks.append(PolyMorpher(c.dim, mixer=mixer, mlp_ratio=c.mlp_ratio, dropout=c.dropout,
                                           norm_eps=c.norm_eps))
        self.norm = nn.LayerNorm(c.dim, eps=c.norm_eps)
        self.head = nn.Linear(c.dim, c.num_classes)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        """HTR-VT's: Xavier-uniform linears with zero bias, mask token N(0, 0.02); convolutions and norms keep
        PyTorch's defaults; PoM's polynomial coefficients keep the reference's ±1e-3."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        nn.init.normal_(self.mask_token, std=0.02)

    def optimize_for_inference(self, dtype: Optional[torch.dtype] = None) -> "HTR":
        """Evaluation mode, the convolutions in channels-last layout (what oneDNN's fastest CPU kernels want) and,
        with ``dtype=torch.bfloat16``, bf16 weights — on CPUs with AMX that is ≈ 5× the fp32 speed. Inputs stay
        float images in [0, 1]; log-probabilities come out in float32."""
        self.eval()
        if dtype is not None:
            self.to(dtype)
        self.stem.to(memory_format=torch.channels_last)
        return self

    # -- forward --------------------------------------------------------------------------------------------------

    def _check(self, images: Tensor, widths: Optional[Tensor]) -> Optional[Tensor]:
        c = self.config
        if not isinstance(images, Tensor) or not images.is_floating_point():
            raise TypeError(f"images must be a float tensor in [0, 1], got {getattr(images, 'dtype', type(images))}")
        if images.dim() != 4 or images.shape[1] != 1 or images.shape[2] != c.height:
            raise ValueError(f"images must have shape (batch, 1, {c.height}, width), got {tuple(images.shape)}")
        B, W = images.shape[0], images.shape[-1]
        if W < 1:
            raise ValueError("images have zero width")
        if widths is None:
            return None
        if not isinstance(widths, Tensor) or widths.dtype not in (torch.int32, torch.int64) or widths.shape != (B,):
            raise ValueError(f"widths must be an integer tensor of shape ({B},), got "
                             f"{getattr(widths, 'dtype', type(widths))} {tuple(getattr(widths, 'shape', ()))}")
        widths = widths.to(device=images.device, dtype=torch.int64)
        if not torch.compiler.is_compiling() and B:
            lo, hi = int(widths.min()), int(widths.max())
            if lo < 1 or hi > W:
                raise ValueError(f"line width {lo if lo < 1 else hi} is outside 1 … {W} (the batch width)")
            if lo == W:
                return None  # nothing is padded
        return widths

    def positions(self, tokens: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """(tokens, dim) fixed position table for a line of ``tokens`` tokens (any length)."""
        c = self.config
        return _position_table(c.position, tokens, c.dim, c.grid_width).to(device=device, dtype=dtype)

    def features(self, images: Tensor, widths: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """Encoder output (B, T, dim) after the final norm, and the real lengths (B,)."""
        widths = self._check(images, widths)
        c = self.config
        if images.dtype not in (torch.float32, torch.float64):
            images = images.float()  # the image norm in at least fp32, then the stem's dtype
        x = _masked_image_norm(images, widths).to(self.stem.conv1.weight.dtype)
        x = self.stem(x, widths)  # (B, C, 1, T)
        x = x.flatten(2).transpose(1, 2)  # (B, T, C)
        if self.proj is not None:
            x = self.proj(x)
        B, T, _ = x.shape
        lengths = torch.full((B,), T, dtype=torch.int64, device=x.device) if widths is None else token_lengths(widths)
        keep = None if widths is None else torch.arange(T, device=x.device)[None, :] < lengths[:, None]
        if self.training and c.mask_ratio > 0:
            masked = span_mask(lengths, T, c.mask_ratio, c.mask_span)
            if masked is not None:
                x = torch.where(masked[..., None], self.mask_token.to(x.dtype), x)
        x = x + self.positions(T, x.device, x.dtype)
        for blk in self.blocks:
            x = blk(x, mask=keep) if keep is not None else blk(x)
        return self.norm(x), lengths

    def forward(self, images: Tensor, widths: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        x, lengths = self.features(images, widths)
        return self.head(x).float().log_softmax(-1), lengths

    # -- the original's checkpoints -------------------------------------------------------------------------------

    def load_reference_state_dict(self, state_dict: Mapping[str, Tensor], strict: bool = True) -> None:
        """Load weights saved by the public HTR-VT code (its ``model`` or ``state_dict_ema``; an attention model of
        the same size and class count). Its frozen ``pos_embed`` table is checked against ours and dropped."""
        renamed: Dict[str, Tensor] = {}
        for key, value in state_dict.items():
            k = key[len("module."):] if key.startswith("module.") else key
            if k == "pos_embed":
                mine = self.positions(value.shape[1], value.device, value.dtype)
                if value.shape[-1] != self.config.dim or not torch.allclose(value[0], mine, atol=1e-5):
                    raise ValueError("the checkpoint's position table differs from this model's "
                                     f"({self.config.position!r} positions, dim {self.config.dim})")
                continue
            renamed[k.replace("patch_embed.", "stem.").replace(".attn.", ".mixer.")] = value
        missing, unexpected = self.load_state_dict(renamed, strict=False)
        missing = [k for k in missing if not k.endswith("num_batches_tracked")]
        if strict and (missing or unexpected):
            raise ValueError(f"HTR-VT state dict does not fit this model: missing {sorted(missing)}, unexpected "
                             f"{sorted(unexpected)}")


def ctc_loss(log_probs: Tensor, lengths: Tensor, targets: Tensor, target_lengths: Tensor) -> Tensor:
    """HTR-VT's CTC loss: per line, −log p(transcription) summed over its characters, then the mean over lines;
    blank = 0, and an impossible alignment (a line too short for its text) counts zero instead of infinity."""
    loss = F.ctc_loss(log_probs.transpose(0, 1), targets, lengths, target_lengths, blank=0, reduction="none",
                      zero_infinity=True)
    return loss.mean()


def ctc_greedy_decode(log_probs: Tensor, lengths: Optional[Tensor] = None, blank: int = 0) -> List[List[int]]:
    """Best path: the argmax class of every real token, repeats collapsed, blanks dropped → class ids per line."""
    best = log_probs.argmax(-1)  # (B, T)
    B, T = best.shape
    prev = F.pad(best[:, :-1], (1, 0), value=-1)
    keep = (best != prev) & (best != blank)
    if lengths is not None:
        keep &= torch.arange(T, device=best.device)[None, :] < lengths.to(best.device)[:, None]
    best, keep = best.cpu(), keep.cpu()
    return [best[b][keep[b]].tolist() for b in range(B)]


def _register() -> None:
    from .registry import register_model

    # HTR-VPoM: PoM of degree 2 and expand 2 with one gate scalar per head (sel_heads = heads = 6). A PoM layer then
    # holds 2·d·D + D + 2·D + 6 + 6 + d = 2,367,750 parameters against attention's 4·d² + 4·d = 2,362,368, so the
    # all-PoM model is +0.04% and the hybrid +0.02% over HTR-VT (counts in docs/ocr.md).
    pom = dict(degree=2, expand=2, sel_heads=6)
    register_model("htr-vt", "ocr", HTRConfig, HTR, "HTR-VT (ResNet stem + 4 attention blocks, CTC), 53.4M",
                   mixer="attention")
    register_model("htr-vpom", "ocr", HTRConfig, HTR, "HTR-VPoM: every block full PoM", mixer="pom", **pom)
    register_model("htr-vpom-hybrid", "ocr", HTRConfig, HTR, "HTR-VPoM Hybrid: attention, PoM, attention, PoM",
                   mixer="hybrid", **pom)
    # 2-core CPU scale: height 32, stem 32/64/128 channels, 4 blocks × 128, 4 heads; one gate per head again
    tiny = dict(height=32, dim=128, heads=4, stem_channels=(32, 64, 128), sel_heads=4)
    register_model("tiny-htr-vt", "ocr", HTRConfig, HTR, "tiny HTR-VT for 2 CPU cores", mixer="attention", **tiny)
    register_model("tiny-htr-vpom", "ocr", HTRConfig, HTR, "tiny HTR-VPoM", mixer="pom", **tiny)
    register_model("tiny-htr-vpom-hybrid", "ocr", HTRConfig, HTR, "tiny HTR-VPoM Hybrid", mixer="hybrid", **tiny)
    # the paper's form (a gate per channel, its code's gate and mean, HTR-VT's 2-D sin-cos grid): D = 170 ≈ 4d/3
    paper = {**tiny, "sel_heads": 1, "gate": "hardsigmoid", "reduction": "mean", "position": "grid", "expand": 1.328125}
    for mixer, name in (("pom", "tiny-htr-vpom"), ("hybrid", "tiny-htr-vpom-hybrid")):
        register_model(f"{name}-paper", "ocr", HTRConfig, HTR, f"{name} in the paper's form", mixer=mixer, **paper)
    # the value-carrying PoM: D = dv = dim, one gate scalar per attention head; +0.07% of HTR-VT (value heads of 128
    # channels, as attention's), the tiny one +0.34% of tiny HTR-VT (one value head: a 128 × 128 state)
    register_model("htr-vpom-value", "ocr", HTRConfig, HTR, "HTR-VPoM with the value-carrying PoM in every block",
                   mixer="value_pom", degree=2, expand=1, sel_heads=6, value_heads=6)
    register_model("tiny-htr-vpom-value", "ocr", HTRConfig, HTR, "tiny HTR-VPoM with the value-carrying PoM",
                   **{**tiny, "sel_heads": 4}, mixer="value_pom", degree=2, expand=1, value_heads=1)


_register()
