"""Satellite image time series: TSViT (a temporal then a spatial transformer) and TSViPoM, where its blocks are PoM.

TSViT (Tarasiou et al., CVPR 2023), exactly as its public code builds it for PASTIS: a Sentinel-2 series
(B, T, H, W, 10 bands) is cut per frame into patches of 2×2 pixels, each patch's 2·2·10 values embedded by a Linear to
d = 128, and the day of year of each frame — a one-hot of 366 through a Linear(366, d) — added to every patch of the
frame. The *temporal encoder* reads, for each patch location, K = 19 learned class tokens followed by its T frames
(4 pre-norm blocks, 4 heads × 32, MLP 512, GELU, final LayerNorm) and keeps the K class-token outputs. The *spatial
encoder* then reads, for each class k separately, the sequence of that class's token at every patch location plus a
learned spatial position table (4 blocks of the same shape, final LayerNorm) — classes never mix. A head (LayerNorm →
Linear(d, 2·2)) turns class k's token at patch (i, j) into the class-k logits of the patch's 2×2 pixels: logits
(B, K, H, W).

Each block is the core's :class:`~polymixer.PolyMorpher` holding the mixer its pattern letter names (one letter per
block, temporal blocks first):

    A = attention (TSViT: q/k/v projection without bias, output projection with bias)       P = full PoM (TSViPoM)

Beyond the original:

* series of different lengths are padded and a frame mask ``(B, T)`` goes to every temporal mixer as a key-padding
  mask (the class tokens always take part): a padded frame changes nothing, for attention and for PoM's mean alike;
* any T, and any H × W that the patch divides: the learned spatial table (trained at ``image_size``) is bilinearly
  interpolated to the patch grid at hand (unchanged at the training size), or, with ``spatial_position="rope"``, the
  spatial mixers use 2-D rotary positions (row, column of the patch) and no table — so a whole 128 × 128 PASTIS tile
  is segmented in one call; the spatial encoder of TSViPoM is linear in H·W where attention is quadratic;
* with ``date_rope=True`` the temporal mixers also turn their queries / keys (PoM: its polynomial features) by 1-D
  rotary angles of the day of year, the class tokens at day 0: a class token's read then weights frames by their
  date multiplicatively, not only through the date embedding added to each frame (``date_rope_base`` and
  ``date_rope_speed`` set the pairs' frequencies: the language models' 10000 and one radian a day by default);
* the day of year is an integer 0–365 (the original stores it as a float and truncates, which moves 18 days of the
  year to their neighbour's embedding); :func:`unpack_dates` reads the original's packed input exactly;
* un-patchifying puts patch (i, j)'s outputs on pixels [p·i, p·i + p) × [p·j, p·j + p) (the public code's last
  reshape scattered them in raster order, fixed upstream later).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar, Dict, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..blocks import PoMSettings, PolyMorpher, allowed_letters, layer_pattern, mixer_options, mixer_spec
from ..layers.pom import shift_width
from ..ops import parallel
from ..layers.positions import grid_positions
from ..ranges import Range, check_ranges

__all__ = ["TSViTConfig", "TSViT", "DAYS_PER_YEAR", "unpack_dates", "patchify", "unpatchify"]

DAYS_PER_YEAR = 366  # day-of-year classes 0 … 365 (the one-hot width of the date embedding)
_POSITIONS = ("learned", "rope")
_HYBRID_POM = ("temporal", "spatial")


@dataclass
class TSViTConfig(PoMSettings):
    RENAMED: ClassVar[Dict[str, str]] = {"shift_width": "token_shift"}  # earlier names (checkpoints load)
    MIXER_LETTERS: ClassVar[str] = allowed_letters(full=True)  # every block mixes its sequence both ways
    RANGES: ClassVar[Dict[str, Range]] = {"date_rope_base": Range(1, low_open=True),  # (polymixer.ranges) the
                                          "date_rope_speed": Range(0, low_open=True)}  # pairs turn slower in turn
    MIXER_OPTIONS: ClassVar[Tuple[str, ...]] = ("degree", "expand", "sel_heads", "gate", "reduction", "value_dim",
                                                "value_heads", "token_shift", "attention_shift")
    image_size: int = 24  # training crop side in pixels: the learned spatial table covers (image_size / patch)² patches
    patch_size: int = 2
    max_frames: int = 60  # frames per series the data pipeline keeps (the original cuts / pads to this); the model
    #                       itself runs any number of frames
    num_bands: int = 10  # Sentinel-2 bands (PASTIS: B2, B3, B4, B5, B6, B7, B8, B8A, B11, B12)
    num_classes: int = 19  # PASTIS: background + 18 crop types (the void label 19 is not a class)
    dim: int = 128
    temporal_depth: int = 4
    spatial_depth: int = 4
    heads: int = 4
    mlp_ratio: float = 4.0
    # "attention" (TSViT) | "pom" (TSViPoM) | "value_pom" | "hybrid" | a pattern over A / P / V / G tiled over the
    # blocks, temporal first (e.g. "AAVV": attention in time, the value PoM in space); L (local attention in time,
    # temporal blocks only): attention within local_days of each frame
    mixer: str = "attention"
    hybrid_pom: str = "spatial"  # mixer="hybrid": the encoder whose blocks are PoM (the other one keeps attention)
    spatial_position: str = "learned"  # "learned": TSViT's table, interpolated to any grid | "rope": 2-D rotary
    date_rope: bool = False  # True: every temporal mixer also turns its queries / keys (PoM: its polynomial
    #                          features) by 1-D rotary angles of the day of year (the class tokens at day 0), on top of
    #                          the additive date embedding, so that a read can select frames by date multiplicatively
    date_rope_base: float = 10000.0  # date_rope: pair i of a head of width w turns speed · base^(−2i/w) radians a day
    date_rope_speed: float = 1.0  # date_rope: radians a day of the fastest pair (1: the day of year as the position)
    degree: int = 2  # PoM degree
    expand: float = 2  # PoM expansion D = expand·dim
    sel_heads: int = 4  # PoM gate width: 1 = a gate per channel (the paper's), h = one gate scalar per head
    value_dim: Optional[int] = None  # V blocks (value-carrying PoM): value width dv (None: dim)
    value_heads: int = 1  # V blocks: heads splitting D and dv
    token_shift: int = 2  # V blocks: tokens the key / value shift reads along each sequence (2: each and the previous)
    attention_shift: int = 0  # A / L layers: tokens their key / value shift reads (0: none; the value PoM's shift,
    #                           offered to attention alike)
    local_days: int = 30  # L blocks: the days a frame's attention reaches on either side (frames further apart in
    #                       the season are masked; the class tokens see, and are seen by, every frame)
    norm_eps: float = 1e-5
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("image_size", "patch_size", "max_frames", "num_bands", "num_classes", "dim", "temporal_depth",
                     "spatial_depth", "heads", "degree", "sel_heads", "local_days"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        check_ranges(self)  # the shared settings' (expand, mlp_ratio, dropout, …) and the date rotation's
        shift_width(self.token_shift, "token_shift", off=False)
        shift_width(self.attention_shift, "attention_shift")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size = {self.image_size} is not a multiple of patch_size = {self.patch_size}")
        if self.dim % self.heads:
            raise ValueError(f"dim = {self.dim} is not divisible by heads = {self.heads}")
        if self.spatial_position not in _POSITIONS:
            raise ValueError(f"spatial_position must be one of {', '.join(_POSITIONS)}, got {self.spatial_position!r}")
        if not isinstance(self.date_rope, bool):
            raise ValueError(f"date_rope must be True or False, got {self.date_rope!r}")
        if self.hybrid_pom not in _HYBRID_POM:
            raise ValueError(f"hybrid_pom must be 'temporal' or 'spatial', got {self.hybrid_pom!r}")
        if self.spatial_position == "rope":
            if (self.dim // self.heads) % 4:
                raise ValueError(f"2-D rotary positions need a head width divisible by 4, got {self.dim // self.heads}")
            if round(self.expand * self.dim) % 4:
                raise ValueError(f"2-D rotary positions need expand·dim divisible by 4, got {self.expand * self.dim}")
        if "L" in self.layer_pattern()[self.temporal_depth:]:
            raise ValueError(f"local attention (L) mixes frames within local_days: put it in the temporal blocks only "
                             f"(the first {self.temporal_depth} letters), got {self.layer_pattern()!r}")

    @property
    def grid_size(self) -> int:
        """Patches per side of a training crop (the learned spatial table is grid_size × grid_size)."""
        return self.image_size // self.patch_size

    def layer_pattern(self) -> str:
        """One letter per block, the temporal encoder's blocks first, then the spatial encoder's."""
        t, s = self.temporal_depth, self.spatial_depth
        if self.mixer == "hybrid":
            return "P" * t + "A" * s if self.hybrid_pom == "temporal" else "A" * t + "P" * s
        return layer_pattern(self.mixer, t + s, hybrid="PA", allowed=self.MIXER_LETTERS)


def unpack_dates(inputs: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """Split the original TSViT's packed input (B, T, H, W, bands + 1) — whose last channel holds the frame's day of
    year (1–366) divided by 365.0001, and 0 on the zero-padded frames — into (bands (B, T, H, W, bands), day of year
    (B, T) int64 in 0–365, frame mask (B, T) bool). The day is recovered exactly by rounding (the original truncates,
    which shifts 18 days of the year by one)."""
    if not isinstance(inputs, Tensor) or inputs.dim() != 5 or inputs.shape[-1] < 2:
        raise ValueError(f"packed inputs must have shape (batch, frames, height, width, bands + 1), got "
                         f"{tuple(getattr(inputs, 'shape', ()))}")
    day = torch.round(inputs[:, :, 0, 0, -1].double() * 365.0001).long()  # 1-based day of year, 0 on padding
    if day.numel() and (int(day.min()) < 0 or int(day.max()) > DAYS_PER_YEAR):
        raise ValueError(f"the date channel holds day {int(day.min()) if int(day.min()) < 0 else int(day.max())}, "
                         f"outside 1 … {DAYS_PER_YEAR} (expected day_of_year / 365.0001)")
    mask = day > 0
    return inputs[..., :-1], (day - 1).clamp(min=0), mask


def patchify(x: Tensor, patch: int) -> Tensor:
    """(B, T, H, W, C) → (B, H/p · W/p, T, p·p·C): each patch's values in the original's (row, column, band) order,
    patches in row-major order."""
    B, T, H, W, C = x.shape
    h, w = H // patch, W // patch
    x = x.reshape(B, T, h, patch, w, patch, C).permute(0, 2, 4, 1, 3, 5, 6)
    return x.reshape(B, h * w, T, patch * patch * C)


def unpatchify(y: Tensor, h: int, w: int, patch: int) -> Tensor:
    """(B, K, h·w, p·p) per-patch outputs → (B, K, h·p, w·p): patch (i, j)'s value a·p + b lands on pixel
    (p·i + a, p·j + b)."""
    B, K = y.shape[:2]
    y = y.reshape(B, K, h, w, patch, patch).permute(0, 1, 2, 4, 3, 5)
    return y.reshape(B, K, h * patch, w * patch)


@functools.lru_cache(maxsize=16)
def _grid(h: int, w: int) -> Tensor:
    return grid_positions(h, w)


class TSViT(nn.Module):
    """TSViT / TSViPoM: ``model(x, doy, mask)`` → class logits (B, num_classes, H, W).

    ``x``: (B, T, H, W, num_bands) float, normalised bands, H and W multiples of the patch size (any size: the spatial
    positions follow the grid); ``doy``: (B, T) integer day of year 0–365 of each frame; ``mask``: (B, T) bool, True
    for a real frame, False for padding (None: every frame is real). Frames may come in any order, though the data
    pipeline sorts them by date.
    """

    family = "eo"

    def __init__(self, config: TSViTConfig) -> None:
        super().__init__()
        self.config = c = config
        self.pattern = c.layer_pattern()
        rope = "2d" if c.spatial_position == "rope" else None
        self.patch_embed = nn.Linear(c.patch_size ** 2 * c.num_bands, c.dim)
        self.date_embed = nn.Linear(DAYS_PER_YEAR, c.dim)  # a one-hot of the day of year, applied as a lookup
        self.class_tokens = nn.Parameter(torch.randn(1, c.num_classes, c.dim))
        self.temporal = nn.ModuleList(self._block(letter, "1d" if c.date_rope else None, c.date_rope_base)
                                      for letter in self.pattern[:c.temporal_depth])
        self.temporal_norm = nn.LayerNorm(c.dim, eps=c.norm_eps)
        self.spatial_pos = (nn.Parameter(torch.randn(1, c.grid_size ** 2, c.dim)) if c.spatial_position == "learned"
                            else None)
        self.spatial = nn.ModuleList(self._block(letter, rope) for letter in self.pattern[c.temporal_depth:])
        self.spatial_norm = nn.LayerNorm(c.dim, eps=c.norm_eps)
        self.head_norm = nn.LayerNorm(c.dim, eps=c.norm_eps)
        self.head = nn.Linear(c.dim, c.patch_size ** 2)

    def initialize_weights(self) -> None:
        """N(0, 1) class tokens and learned positions, drawn again (the constructor draws them in its order)."""
        for p in (self.class_tokens, self.spatial_pos):
            if p is not None:
                nn.init.normal_(p)

    def _block(self, letter: str, rope: Optional[str], rope_base: Optional[float] = None) -> PolyMorpher:
        c = self.config
        # TSViT's attention: q / k / v without bias, the output projection with one; PoMs with a bias on W_o. Local
        # attention in time is attention under a band of local_days (irregular frames: the band is in days, given
        # as a mask by the temporal encoder)
        spec = mixer_spec("A" if letter == "L" else letter)
        mixer = spec.make(c.dim, heads=c.heads, qkv_bias=False, bias=True, rope=rope, rope_base=rope_base,
                          **mixer_options(c))
        return PolyMorpher(c.dim, mixer=mixer, mlp_ratio=c.mlp_ratio, dropout=c.dropout, norm_eps=c.norm_eps)

    # -- inputs ---------------------------------------------------------------------------------------------------

    def _check(self, x: Tensor, doy: Tensor, mask: Optional[Tensor]) -> Optional[Tensor]:
        c = self.config
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError(f"x must be a float tensor (B, T, H, W, {c.num_bands}), got "
                            f"{getattr(x, 'dtype', type(x).__name__)}")
        if x.dim() != 5 or x.shape[-1] != c.num_bands:
            raise ValueError(f"x must have shape (batch, frames, height, width, {c.num_bands}), got {tuple(x.shape)}")
        B, T, H, W, _ = x.shape
        if T < 1 or H < 1 or W < 1 or H % c.patch_size or W % c.patch_size:
            raise ValueError(f"x of shape {tuple(x.shape)}: need ≥ 1 frame and height, width multiples of the patch "
                             f"size {c.patch_size}")
        if not isinstance(doy, Tensor) or doy.dtype not in (torch.int32, torch.int64) or tuple(doy.shape) != (B, T):
            raise ValueError(f"doy must be an integer tensor of shape ({B}, {T}) (day of year 0–365 of each frame), "
                             f"got {getattr(doy, 'dtype', type(doy).__name__)} {tuple(getattr(doy, 'shape', ()))}")
        if not torch.compiler.is_compiling() and doy.numel():
            lo, hi = int(doy.min()), int(doy.max())
            if lo < 0 or hi >= DAYS_PER_YEAR:
                raise ValueError(f"day of year {lo if lo < 0 else hi} is outside 0 … {DAYS_PER_YEAR - 1}")
        if mask is None:
            return None
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (B, T):
            raise ValueError(f"mask must be a bool tensor of shape ({B}, {T}) (True = a real frame), got "
                             f"{getattr(mask, 'dtype', type(mask).__name__)} {tuple(getattr(mask, 'shape', ()))}")
        if not torch.compiler.is_compiling() and bool(mask.all()):
            return None  # nothing is padded: the unmasked fast paths
        return mask

    def spatial_positions(self, h: int, w: int, dtype: torch.dtype) -> Optional[Tensor]:
        """(h·w, dim) learned spatial table for a grid of h × w patches: the trained table itself at the training
        grid, bilinearly interpolated otherwise (half-pixel centres, ``align_corners=False``: the table keeps covering
        the whole grid); None for rotary positions."""
        if self.spatial_pos is None:
            return None
        g = self.config.grid_size
        table = self.spatial_pos.to(dtype)
        if (h, w) == (g, g):
            return table[0]
        grid = table.reshape(1, g, g, -1).permute(0, 3, 1, 2)
        grid = F.interpolate(grid.float(), size=(h, w), mode="bilinear", align_corners=False).to(dtype)
        return grid.permute(0, 2, 3, 1).reshape(h * w, -1)

    # -- forward --------------------------------------------------------------------------------------------------

    def encode_time(self, x: Tensor, doy: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        """The temporal encoder: (B, h·w, K, dim) class-token outputs per patch location (after its final norm)."""
        return self._encode_time(x, doy, self._check(x, doy, mask))

    def _time_sequence(self, x: Tensor, doy: Tensor, mask: Optional[Tensor], K: int
                       ) -> Tuple[Tensor, Dict[str, Tensor]]:
        """The temporal encoder's input — each patch location's frames (B·N, K + T, dim), patch and date embeddings
        with ``K`` class tokens in front — and its mode keywords: the key padding, the days as rotary positions."""
        c = self.config
        B, T = x.shape[:2]
        dtype = self.patch_embed.weight.dtype
        tokens = self.patch_embed(patchify(x.to(dtype), c.patch_size))  # (B, N, T, d)
        N = tokens.shape[1]
        dates = F.embedding(doy.long(), self.date_embed.weight.t()) + self.date_embed.bias  # one-hot @ W + b
        seq = (tokens + dates[:, None]).reshape(B * N, T, c.dim)
        if K:
            seq = torch.cat([self.class_tokens.to(dtype).expand(B * N, -1, -1), seq], dim=1)  # (B·N, K + T, d)
        kw: Dict[str, Tensor] = {}
        if mask is not None:
            kw["mask"] = torch.cat([mask.new_ones(B, K), mask], dim=1).repeat_interleave(N, dim=0)
        if c.date_rope:  # the class tokens at day 0, each frame at its day of year
            days = torch.cat([doy.new_zeros(B, K), doy], dim=1).repeat_interleave(N, dim=0)
            kw["positions"] = days if c.date_rope_speed == 1 else days.double() * c.date_rope_speed
        return seq, kw

    def _encode_time(self, x: Tensor, doy: Tensor, mask: Optional[Tensor]) -> Tensor:
        cp = parallel.active()
        if cp is not None:
            return self._encode_time_split(x, doy, mask, cp)
        c = self.config
        B = x.shape[0]
        seq, kw = self._time_sequence(x, doy, mask, c.num_classes)
        N = seq.shape[0] // B
        band = self.local_band(doy, kw.get("mask"), N) if "L" in self.pattern[:c.temporal_depth] else None
        for letter, blk in zip(self.pattern, self.temporal):
            seq = blk(seq, **({**kw, "mask": band} if letter == "L" else kw))
        return self.temporal_norm(seq[:, :c.num_classes]).reshape(B, N, c.num_classes, c.dim)

    def local_band(self, doy: Tensor, key_mask: Optional[Tensor], patches: int) -> Tensor:
        """(B·N, K + T, K + T) which tokens an L block's queries see: frames within ``local_days`` of each other,
        the class tokens every token and every token the class tokens; padded frames (``key_mask`` False) none."""
        K = self.config.num_classes
        d = doy.long()
        near = (d[:, :, None] - d[:, None, :]).abs() <= self.config.local_days  # (B, T, T)
        B, T = d.shape
        vis = near.new_ones(B, K + T, K + T)
        vis[:, K:, K:] = near
        vis = vis.repeat_interleave(patches, dim=0)
        return vis if key_mask is None else vis & key_mask[:, None, :]

    def _encode_time_split(self, x: Tensor, doy: Tensor, mask: Optional[Tensor], cp: "parallel.ContextParallel"
                           ) -> Tensor:
        """The temporal encoder under context parallelism: each rank holds an equal share of the frames, the first
        rank the class tokens in front of its share; the class tokens' outputs are then sent to every rank (the
        spatial encoder and the head run on each, alike)."""
        c = self.config
        if "L" in self.pattern[:c.temporal_depth]:
            raise ValueError("local attention in time (L) cannot split the frames across ranks (its band in days "
                             "spans the slices): run it without context parallelism")
        B, T = x.shape[:2]
        a, b = parallel.even_slice(T, cp, "the frames")
        first = cp.rank == 0
        seq, kw = self._time_sequence(x[:, a:b], doy[:, a:b], None if mask is None else mask[:, a:b],
                                      c.num_classes if first else 0)
        N, dtype = seq.shape[0] // B, self.patch_embed.weight.dtype
        for blk in self.temporal:
            seq = blk(seq, **kw)
        # every rank's copy of the class tokens' outputs; the others send zeros that stay in the graph (the
        # all-gather's backward is a collective every rank must reach, and DDP wants a gradient of every parameter,
        # the class tokens' included)
        mine = seq[:, :c.num_classes] if first else \
            seq[:, :1].mul(0).expand(-1, c.num_classes, -1) + self.class_tokens.to(dtype).mul(0)
        cls = parallel.gather(mine.contiguous(), cp, "class tokens")[0]
        return self.temporal_norm(cls).reshape(B, N, c.num_classes, c.dim)

    def encode_space(self, z: Tensor, h: int, w: int) -> Tensor:
        """The spatial encoder on (B, h·w, K, dim): each class's h·w tokens mixed apart from the other classes →
        (B·K, h·w, dim) after its final norm."""
        B, N, K, d = z.shape
        z = z.permute(0, 2, 1, 3).reshape(B * K, N, d)
        table = self.spatial_positions(h, w, z.dtype)
        if table is not None:
            z = z + table
            for blk in self.spatial:
                z = blk(z)
        else:
            pos = _grid(h, w).to(z.device)
            for blk in self.spatial:
                z = blk(z, positions=pos)
        return self.spatial_norm(z)

    def forward(self, x: Tensor, doy: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        c = self.config
        mask = self._check(x, doy, mask)
        B, _, H, W, _ = x.shape
        h, w = H // c.patch_size, W // c.patch_size
        z = self._encode_time(x, doy, mask)
        with parallel.local():  # under context parallelism every rank holds all the class tokens' outputs now
            z = self.encode_space(z, h, w)
        y = self.head(self.head_norm(z))  # (B·K, h·w, p·p)
        return unpatchify(y.reshape(B, c.num_classes, h * w, -1), h, w, c.patch_size)

    # -- the original's checkpoints -------------------------------------------------------------------------------

    def load_reference_state_dict(self, state_dict: Mapping[str, Tensor], strict: bool = True) -> None:
        """Load weights saved by the public TSViT code (class ``TSViT`` of ``TSViTdense.py``) into an attention model
        with learned spatial positions and the same sizes. The date embedding's columns are shifted by one: the
        original indexes its one-hot with the 1-based day of year (its column 0 serves the zero-padded frames, which
        are masked here)."""
        if "P" in self.pattern or self.spatial_pos is None:
            raise ValueError("TSViT's weights fit an attention model with learned spatial positions "
                             f"(this one: pattern {self.pattern!r}, spatial_position "
                             f"{self.config.spatial_position!r})")
        fixed = {"to_patch_embedding.1.": "patch_embed.", "to_temporal_embedding_input.": "date_embed.",
                 "temporal_token": "class_tokens", "space_pos_embedding": "spatial_pos",
                 "temporal_transformer.norm.": "temporal_norm.", "space_transformer.norm.": "spatial_norm.",
                 "mlp_head.0.": "head_norm.", "mlp_head.1.": "head."}
        inner = {".0.norm.": ".norm1.", ".0.fn.to_qkv.": ".mixer.qkv.", ".0.fn.to_out.0.": ".mixer.proj.",
                 ".1.norm.": ".norm2.", ".1.fn.net.0.": ".mlp.fc1.", ".1.fn.net.3.": ".mlp.fc2."}
        renamed: Dict[str, Tensor] = {}
        for key, value in state_dict.items():
            k = key[len("module."):] if key.startswith("module.") else key
            for old, new in fixed.items():
                if k.startswith(old):
                    k = new + k[len(old):]
                    break
            else:
                for enc, mine in (("temporal_transformer.layers.", "temporal."),
                                  ("space_transformer.layers.", "spatial.")):
                    if k.startswith(enc):
                        index, _, rest = k[len(enc):].partition(".")
                        rest = "." + rest  # ".0.norm.weight": sub-layer 0 (attention) or 1 (feed-forward)
                        for old, new in inner.items():
                            if rest.startswith(old):
                                rest = new + rest[len(old):]
                                break
                        k = f"{mine}{int(index)}{rest}"
                        break
            if k == "date_embed.weight":
                value = torch.cat([value[:, 1:], value[:, :1]], dim=1)  # column d + 1 → d; the padding column last
            renamed[k] = value
        missing, unexpected = self.load_state_dict(renamed, strict=False)
        if strict and (missing or unexpected):
            raise ValueError(f"TSViT state dict does not fit this model: missing {sorted(missing)}, unexpected "
                             f"{sorted(unexpected)}")


def _register() -> None:
    from .registry import register_model

    # TSViPoM: PoM of degree 2 and expand 2 with one gate scalar per head (sel_heads = heads = 4) and a bias on W_o.
    # A PoM layer then holds d·(D + 4) + 4 + 2·D + D·d + d = 66,692 parameters against TSViT attention's
    # 3·d² + d² + d = 65,664, so the all-PoM model is +0.50% (1,665,700) and the hybrid +0.25% (1,661,588) over
    # TSViT's 1,657,476 (counts in docs/eo.md).
    pom = dict(degree=2, expand=2, sel_heads=4)
    register_model("tsvit", "eo", TSViTConfig, TSViT,
                   "TSViT (PASTIS: 4 temporal + 4 spatial attention blocks × 128, 19 class tokens), 1.66M",
                   mixer="attention")
    register_model("tsvipom", "eo", TSViTConfig, TSViT, "TSViPoM: every block full PoM", mixer="pom", **pom)
    # The hybrid keeps attention where the class tokens read the series (temporal) and puts PoM where attention is
    # quadratic (spatial): at equal budget it beats TSViT, while PoM in the temporal encoder falls behind (docs/eo.md).
    register_model("tsvipom-hybrid", "eo", TSViTConfig, TSViT,
                   "TSViPoM Hybrid: attention in the temporal encoder, PoM in the spatial one", mixer="hybrid",
                   hybrid_pom="spatial", **pom)
    # 2-core CPU scale: width 64, 2 + 2 blocks of 2 heads × 32, one gate per head
    tiny = dict(dim=64, heads=2, temporal_depth=2, spatial_depth=2, sel_heads=2)
    register_model("tiny-tsvit", "eo", TSViTConfig, TSViT, "tiny TSViT for 2 CPU cores", mixer="attention",
                   **tiny)
    register_model("tiny-tsvipom", "eo", TSViTConfig, TSViT, "tiny TSViPoM", mixer="pom", **tiny)
    register_model("tiny-tsvipom-hybrid", "eo", TSViTConfig, TSViT, "tiny TSViPoM Hybrid (PoM spatial)",
                   mixer="hybrid", hybrid_pom="spatial", **tiny)
    # the paper's form (a gate per channel, its code's gate and mean, TSViT's learned spatial table): D = 84 ≈ 4d/3
    paper = {**tiny, "sel_heads": 1, "gate": "hardsigmoid", "reduction": "mean", "spatial_position": "learned",
             "expand": 1.3125}
    for mixer, name in (("pom", "tiny-tsvipom"), ("hybrid", "tiny-tsvipom-hybrid")):
        register_model(f"{name}-paper", "eo", TSViTConfig, TSViT, f"{name} in the paper's form", mixer=mixer, **paper)
    # the value-carrying PoM in every block: D = dv = 128 with a gate scalar and a value head per attention head
    # (+0.81% of TSViT); the tiny one D = 60, dv = 64 in 2 value heads (like tiny TSViT's 2 heads) with a key / value
    # shift over the last 4 tokens (+0.71% of tiny TSViT). One head and the 2-token shift scored 36.6 test mIoU at
    # 2e-3 (seed 0), 2 heads 37.0, 2 heads and the 4-token shift 42.1 (docs/eo.md).
    register_model("tsvipom-value", "eo", TSViTConfig, TSViT, "TSViPoM with the value-carrying PoM in every block",
                   mixer="value_pom", degree=2, expand=1, sel_heads=4, value_heads=4)
    # the same at TSViT's size: the first temporal block local attention, the value PoM in the other seven
    register_model("tsvipom-local", "eo", TSViTConfig, TSViT,
                   "TSViPoM: local attention (30 days) then the value PoM in time, the value PoM in space",
                   mixer="LVVVVVVV", degree=2, expand=1, sel_heads=4, value_heads=4)
    register_model("tiny-tsvipom-value", "eo", TSViTConfig, TSViT, "tiny TSViPoM with the value-carrying PoM",
                   **{**tiny, "mixer": "value_pom", "expand": 0.9375, "value_heads": 2, "token_shift": 4})
    # local attention beside the value PoM where the gap is (time): the first temporal block attends within 30 days
    # (the short window of the season that decides some crops), the value PoM everywhere else (+0.53% of tiny TSViT)
    register_model("tiny-tsvipom-local", "eo", TSViTConfig, TSViT,
                   "tiny TSViPoM: local attention (30 days) then the value PoM in time, the value PoM in space",
                   **{**tiny, "mixer": "LVVV", "expand": 0.9375, "value_heads": 2, "token_shift": 4})


_register()
