"""Point clouds: Point Transformer V3 (PTv3) and PPoMv3, where its serialized attention is PoM — on a CPU, in PyTorch.

PTv3 (Wu et al., CVPR 2024), exactly as its public code builds it for ScanNet (PT-v3m1): points voxelised on a grid
(one point per voxel) are ordered along space-filling curves — z-order (Morton) and Hilbert codes of the integer grid
coordinates, and both with x and y swapped: 4 orders, the scene index in the high bits so scenes never mix — and the
mixer of every block runs inside *patches* of K = 1,024 consecutive points of one order (the order cycles through the
4 from block to block; in training the 4 are shuffled per forward pass and per pooling level). A scene whose length
does not divide is padded by repeating points of its previous patch (their outputs dropped on the way back); a scene
shorter than a patch is one patch. The network is a 5-stage U-Net:

    stem     submanifold sparse conv 5×5×5 (6 → 32, no bias) → BatchNorm (eps 1e-3, momentum 0.01) → GELU
    encoder  depths (2, 2, 2, 6, 2), channels (32, 64, 128, 256, 512), heads (2, 4, 8, 16, 32)
    decoder  depths (2, 2, 2, 2), channels (64, 64, 128, 256), heads (4, 4, 8, 16)
    block    x += LN(Linear(SubMConv3d 3×3×3 (x)))                 conditional positional encoding (CPE)
             x += DropPath(mixer(LN(x))); x += DropPath(MLP(LN(x)))  the core's PolyMorpher (pre-norm, MLP ratio 4)
    pooling  clusters = unique(code >> 3) (a coarser grid is a 3-bit shift of every curve code), Linear → segment
             max → BN → GELU;  unpooling: Linear+BN+GELU of the skip + Linear+BN+GELU of the coarse features gathered
    head     Linear(64, classes)

46,167,572 parameters (`ptv3`), 30.8M of them in the CPE convolutions. Drop-path rises linearly to 0.3 (per point, as
PTv3's timm DropPath on packed (N, C) features does).

The mixer of each block is one letter: A = attention in patches (PTv3), P = PoM (PPoMv3). Because PoM is linear in
its context, a PoM layer's patch may be far larger than attention's, or ``None``: the whole scene — PoM then
aggregates over all points of the scene (packed with ``cu_seqlens``; nothing crosses scenes; the order does not
matter to a mean).

Sparse convolution is pure PyTorch (no spconv / torch_scatter): a neighbour map per level and kernel (voxel keys
sorted once, the k³ offsets looked up with ``searchsorted``, a missing neighbour pointing to a zero row), forward =
gathered neighbours (N, k³·C) @ W (k³·C, C'), computed in row chunks; the backward is the same gather-GEMM with the
flipped, transposed kernel, because on a submanifold the map is symmetric (j is i's neighbour at offset o exactly
when i is j's at −o) — no scatter-add (see ``polymixer bench points --parts conv``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..blocks import PoMSettings, PolyMorpher, allowed_letters, layer_pattern, mixer_options, mixer_spec
from ..layers.pom import PoM, shift_width
from ..ranges import Range, check_ranges

__all__ = ["PTv3Config", "PTv3", "ORDERS", "MAX_DEPTH", "z_order_encode", "hilbert_encode", "encode",
           "kernel_offsets", "neighbour_map", "submconv3d", "SubMConv3d", "PointLevel", "SerializedMixer",
           "offsets_to_batch"]

ORDERS = ("z", "z-trans", "hilbert", "hilbert-trans")
MAX_DEPTH = 16  # bits per axis of the curve codes (PTv3's limit: 3·16 bits + the scene index in an int64)
_KEY_BITS = 17  # bits per axis of the neighbour-map keys (16 bits of grid + room for the kernel's reach)
_CHUNK = 1 << 24  # elements of gathered neighbours per GEMM chunk (64 MB in fp32)

PatchSize = Optional[int]


# ---------------------------------------------------------------------------------------------------------------
# serialization: space-filling curve codes of integer grid coordinates
# ---------------------------------------------------------------------------------------------------------------

def z_order_encode(grid: Tensor, depth: int) -> Tensor:
    """Morton code: bit b of x, y, z goes to bit 3b+2, 3b+1, 3b of the code (PTv3's layout). grid: (N, 3) ≥ 0."""
    g = grid.long()
    code = torch.zeros(g.shape[0], dtype=torch.long, device=g.device)
    for b in range(depth):
        for axis in range(3):
            code |= ((g[:, axis] >> b) & 1) << (3 * b + 2 - axis)
    return code


def hilbert_encode(grid: Tensor, depth: int) -> Tensor:
    """Hilbert index of (N, 3) grid coordinates < 2^depth (Skilling, "Programming the Hilbert curve", 2004: axes to
    transpose, then the transposed bits interleaved x-major like the z-order). The first 3(depth−1) bits of a code
    are the code of the cell on the grid halved (tested), which is what makes pooling a shift."""
    X = [grid[:, axis].long().clone() for axis in range(3)]
    if depth == 0:
        return torch.zeros_like(X[0])
    top = 1 << (depth - 1)
    q = top
    while q > 1:  # inverse undo
        p = q - 1
        for i in range(3):
            hit = (X[i] & q) != 0
            if i == 0:
                X[0] = torch.where(hit, X[0] ^ p, X[0])
            else:
                t = (X[0] ^ X[i]) & p
                X[0] = torch.where(hit, X[0] ^ p, X[0] ^ t)
                X[i] = torch.where(hit, X[i], X[i] ^ t)
        q >>= 1
    X[1] = X[1] ^ X[0]  # Gray encode
    X[2] = X[2] ^ X[1]
    t = torch.zeros_like(X[0])
    q = top
    while q > 1:
        t = torch.where((X[2] & q) != 0, t ^ (q - 1), t)
        q >>= 1
    code = torch.zeros_like(X[0])
    for b in range(depth):
        for axis in range(3):
            code |= (((X[axis] ^ t) >> b) & 1) << (3 * b + 2 - axis)
    return code


def encode(grid: Tensor, batch: Optional[Tensor], depth: int, order: str = "z") -> Tensor:
    """The curve code of each point, with the scene index above the 3·depth code bits (scenes stay contiguous)."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; expected one of {ORDERS}")
    g = grid[:, [1, 0, 2]] if order.endswith("-trans") else grid
    code = z_order_encode(g, depth) if order.startswith("z") else hilbert_encode(g, depth)
    if batch is not None:
        code = (batch.long() << (3 * depth)) | code
    return code


def offsets_to_batch(offset: Tensor) -> Tensor:
    """Scene index of every point from the running counts ``offset`` (B,) (PTv3's batch layout)."""
    counts = torch.diff(offset, prepend=offset.new_zeros(1))
    return torch.repeat_interleave(torch.arange(len(counts), device=offset.device), counts)


# ---------------------------------------------------------------------------------------------------------------
# submanifold sparse convolution in pure PyTorch
# ---------------------------------------------------------------------------------------------------------------

def kernel_offsets(kernel: int, device: Optional[torch.device] = None) -> Tensor:
    """The kernel³ offsets (dx, dy, dz), x-major — offset k and offset kernel³−1−k are opposite."""
    if kernel < 1 or kernel % 2 == 0:
        raise ValueError(f"kernel size must be odd and positive, got {kernel}")
    r = kernel // 2
    return torch.tensor(list(itertools.product(range(-r, r + 1), repeat=3)), dtype=torch.long, device=device)


def _voxel_keys(grid: Tensor, batch: Tensor, margin: int) -> Tensor:
    g = grid.long() + margin
    return (batch.long() << (3 * _KEY_BITS)) | (g[:, 0] << (2 * _KEY_BITS)) | (g[:, 1] << _KEY_BITS) | g[:, 2]


def neighbour_map(grid: Tensor, batch: Tensor, kernel: int) -> Tensor:
    """(N, kernel³) index of the active voxel at each offset of each voxel (same scene), N where there is none.

    Raises a ValueError if two points share a voxel of the same scene (voxelise first: one point per voxel)."""
    n = grid.shape[0]
    r = kernel // 2
    keys = _voxel_keys(grid, batch, r)
    sorted_keys, perm = torch.sort(keys)
    if n > 1 and bool((sorted_keys[1:] == sorted_keys[:-1]).any()):
        i = int(torch.nonzero(sorted_keys[1:] == sorted_keys[:-1])[0])
        a, b = int(perm[i]), int(perm[i + 1])
        raise ValueError(f"points {a} and {b} share the voxel {grid[a].tolist()} of scene {int(batch[a])}: a sparse "
                         f"convolution needs one point per voxel (voxelise the scene first)")
    off = kernel_offsets(kernel, grid.device)
    deltas = (off[:, 0] << (2 * _KEY_BITS)) + (off[:, 1] << _KEY_BITS) + off[:, 2]  # no carries: margin r per axis
    out = torch.empty(n, len(off), dtype=torch.long, device=grid.device)
    step = max(1, (1 << 22) // max(n, 1))
    for s in range(0, len(off), step):
        q = keys[:, None] + deltas[None, s:s + step]
        pos = torch.searchsorted(sorted_keys, q).clamp_(max=max(n - 1, 0))
        found = sorted_keys[pos] == q if n else torch.zeros_like(q, dtype=torch.bool)
        out[:, s:s + step] = torch.where(found, perm[pos], n)
    return out


def _gather_matmul(x: Tensor, nbr: Tensor, w: Tensor) -> Tensor:
    """Σ_k x[nbr[:, k]] @ W_k as one GEMM per row chunk: (N, C) gathered to (n, K·C) @ w (K·C, C')."""
    n, K = nbr.shape
    xp = torch.cat([x, x.new_zeros(1, x.shape[1])])
    out = x.new_empty(n, w.shape[1])
    rows = max(1, _CHUNK // max(K * x.shape[1], 1))
    for s in range(0, n, rows):
        out[s:s + rows] = xp.index_select(0, nbr[s:s + rows].reshape(-1)).view(-1, K * x.shape[1]) @ w
    return out


class _SubMConv(torch.autograd.Function):
    """Gather-GEMM forward; backward by the map's symmetry (no scatter-add)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, nbr: Tensor) -> Tensor:  # type: ignore[override]
        K, cin, cout = weight.shape
        ctx.save_for_backward(x, weight, nbr)
        return _gather_matmul(x, nbr, weight.reshape(K * cin, cout))

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Tuple[Optional[Tensor], Optional[Tensor], None]:  # type: ignore[override]
        x, weight, nbr = ctx.saved_tensors
        K, cin, cout = weight.shape
        g = g.contiguous()
        gx = gw = None
        wanted = ctx.needs_input_grad
        if wanted[0]:
            # i is j's neighbour at offset K−1−k exactly when j is i's at k: the transposed conv is a conv
            gx = _gather_matmul(g, nbr, weight.flip(0).transpose(1, 2).reshape(K * cout, cin))
        if wanted[1]:
            n = nbr.shape[0]
            xp = torch.cat([x, x.new_zeros(1, cin)])
            gw = weight.new_zeros(K * cin, cout)
            rows = max(1, _CHUNK // max(K * cin, 1))
            for s in range(0, n, rows):
                gw += xp.index_select(0, nbr[s:s + rows].reshape(-1)).view(-1, K * cin).t() @ g[s:s + rows]
            gw = gw.view(K, cin, cout)
        return gx, gw, None


def submconv3d(x: Tensor, weight: Tensor, nbr: Tensor, bias: Optional[Tensor] = None,
               backward: str = "symmetric") -> Tensor:
    """Submanifold sparse convolution: out[i] = Σ_k x[nbr[i, k]] @ weight[k] (+ bias) at the active voxels only.

    x: (N, C); weight: (kernel³, C, C'); nbr: (N, kernel³) from :func:`neighbour_map`. ``backward="symmetric"``
    uses the custom backward, ``"autograd"`` plain autograd through the gather (index scatter-adds; the baseline)."""
    if weight.dim() != 3 or weight.shape[1] != x.shape[-1] or nbr.shape != (x.shape[0], weight.shape[0]):
        raise ValueError(f"submconv3d: x {tuple(x.shape)}, weight {tuple(weight.shape)} (kernel³, C, C') and "
                         f"neighbour map {tuple(nbr.shape)} (N, kernel³) do not match")
    w = weight.to(x.dtype)
    if backward == "symmetric":
        out = _SubMConv.apply(x, w, nbr)
    elif backward == "autograd":
        xp = torch.cat([x, x.new_zeros(1, x.shape[1])])
        out = xp[nbr].reshape(x.shape[0], -1) @ w.reshape(-1, w.shape[-1])
    else:
        raise ValueError(f"backward must be 'symmetric' or 'autograd', got {backward!r}")
    return out if bias is None else out + bias.to(out.dtype)


class SubMConv3d(nn.Module):
    """Submanifold sparse 3-D convolution (spconv's ``SubMConv3d``): outputs only at the input's active voxels."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, bias: bool = True) -> None:
        super().__init__()
        kernel_offsets(kernel_size)  # validates
        self.kernel_size = kernel_size
        K = kernel_size ** 3
        self.weight = nn.Parameter(torch.empty(K, in_channels, out_channels))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        fan_in = self.weight.shape[0] * self.weight.shape[1]
        bound = 1.0 / math.sqrt(fan_in)
        if self.weight.device.type != "meta":
            nn.init.uniform_(self.weight, -bound, bound)
            if self.bias is not None:
                nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor, level: Union["PointLevel", Tensor]) -> Tensor:
        """x: (N, C) features of ``level``'s voxels (or an explicit (N, kernel³) neighbour map)."""
        nbr = level.neighbours(self.kernel_size) if isinstance(level, PointLevel) else level
        return submconv3d(x, self.weight, nbr, self.bias)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[1]}, {self.weight.shape[2]}, kernel_size={self.kernel_size}, " \
               f"bias={self.bias is not None}"


# ---------------------------------------------------------------------------------------------------------------
# a serialized level: voxels, their curve orders, neighbour maps and patch plans (built once, shared by blocks)
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class PatchPlan:
    """How a level's points go into patches of one order: ``full`` (P, K) point indices of full patches with
    ``keep`` (P, K) False on the repeated padding points; ``short`` (S, L) indices of the scenes shorter than a patch
    with their ``short_mask`` (S, L); ``inverse`` (N,) the row of each point in cat(full[keep], short[mask])."""

    full: Optional[Tensor]
    keep: Optional[Tensor]
    short: Optional[Tensor]
    short_mask: Optional[Tensor]
    inverse: Tensor


class PointLevel:
    """One resolution of the U-Net: voxel grid coordinates, scene index, curve codes and orders; caches the neighbour
    maps (per kernel size) and the patch plans (per order and patch size) its blocks share."""

    def __init__(self, grid: Tensor, batch: Tensor, depth: int, codes: Tensor, order_names: Sequence[str]) -> None:
        self.grid, self.batch, self.depth = grid, batch, depth
        self.codes = codes  # (4, N), rows in ``order_names`` order
        self.order_names = tuple(order_names)
        self.orders = torch.argsort(codes, dim=1)
        self.counts = torch.bincount(batch, minlength=int(batch.max()) + 1 if batch.numel() else 0)
        self.starts = torch.cumsum(self.counts, 0) - self.counts
        self._maps: Dict[int, Tensor] = {}
        self._plans: Dict[Tuple[int, PatchSize], PatchPlan] = {}

    @classmethod
    def build(cls, grid: Tensor, batch: Tensor, orders: Sequence[str], shuffle: bool) -> "PointLevel":
        grid_max = int(grid.max()) if grid.numel() else 0
        depth = grid_max.bit_length()
        if depth > MAX_DEPTH:
            raise ValueError(f"the scene is too large for the curve codes: grid coordinates reach {grid_max} "
                             f"({depth} bits per axis, at most {MAX_DEPTH}: 65,535 cells per axis); use a coarser "
                             f"grid or crop the scene")
        scenes = int(batch.max()) + 1 if batch.numel() else 1
        if 3 * depth + scenes.bit_length() > 63:
            raise ValueError(f"{scenes} scenes at depth {depth} do not fit the 63-bit curve codes")
        names = list(orders)
        if shuffle:
            names = [names[i] for i in torch.randperm(len(names)).tolist()]
        codes = torch.stack([encode(grid, batch, depth, o) for o in names])
        return cls(grid, batch, depth, codes, names)

    @property
    def cu_seqlens(self) -> Tensor:
        """int32 scene offsets (the points of each scene are contiguous at every level)."""
        return F.pad(torch.cumsum(self.counts, 0), (1, 0)).to(torch.int32)

    def neighbours(self, kernel: int) -> Tensor:
        if kernel not in self._maps:
            self._maps[kernel] = neighbour_map(self.grid, self.batch, kernel)
        return self._maps[kernel]

    def pool(self, shuffle: bool) -> Tuple["PointLevel", Tensor]:
        """The level of the grid halved and the cluster of each point (PTv3's serialized pooling)."""
        shift = 1 if self.depth > 0 else 0
        code = self.codes[0] >> (3 * shift)
        _, cluster, counts = torch.unique(code, sorted=True, return_inverse=True, return_counts=True)
        first = torch.sort(cluster, stable=True).indices[torch.cumsum(counts, 0) - counts]
        codes = self.codes[:, first] >> (3 * shift)
        names = list(self.order_names)
        if shuffle:
            perm = torch.randperm(len(names)).tolist()
            codes, names = codes[perm], [names[i] for i in perm]
        return PointLevel(self.grid[first] >> shift, self.batch[first], self.depth - shift, codes, names), cluster

    def patches(self, order_index: int, size: PatchSize) -> PatchPlan:
        key = (order_index, size)
        if key not in self._plans:
            self._plans[key] = self._plan(self.orders[order_index % len(self.orders)], size)
        return self._plans[key]

    def _plan(self, order: Tensor, size: PatchSize) -> PatchPlan:
        dev = order.device
        counts, starts = self.counts, self.starts
        present = counts > 0
        long = present & (counts > size) if size is not None else torch.zeros_like(present)
        short = present & ~long
        rows: List[Tensor] = []
        full, keep, sidx, smask = None, None, None, None
        if bool(long.any()):
            n, s0 = counts[long], starts[long]
            npad = (n + size - 1) // size * size
            scene = torch.repeat_interleave(torch.arange(len(n), device=dev), npad)
            j = torch.arange(int(npad.sum()), device=dev) - torch.repeat_interleave(torch.cumsum(npad, 0) - npad, npad)
            real = j < n[scene]
            src = torch.where(real, j, j - size)  # the padding repeats the previous patch's points
            full = order[s0[scene] + src].view(-1, size)
            keep = real.view(-1, size)
            rows.append(full[keep])
        if bool(short.any()):
            n, s0 = counts[short], starts[short]
            L = int(n.max())
            j = torch.arange(L, device=dev)
            smask = j[None, :] < n[:, None]
            sidx = order[s0[:, None] + torch.minimum(j[None, :], n[:, None] - 1)]
            rows.append(sidx[smask])
        src_rows = torch.cat(rows) if rows else order.new_zeros(0)
        inverse = torch.empty_like(src_rows)
        inverse[src_rows] = torch.arange(len(src_rows), device=dev)
        return PatchPlan(full, keep, sidx, smask, inverse)


class SerializedMixer(nn.Module):
    """A token mixer (attention or PoM) applied inside patches of ``patch_size`` consecutive points of one curve
    order; ``patch_size=None`` is the whole scene (for PoM: one packed call with the scenes' ``cu_seqlens``)."""

    def __init__(self, mixer: nn.Module, patch_size: PatchSize) -> None:
        super().__init__()
        if patch_size is not None and (isinstance(patch_size, bool) or not isinstance(patch_size, int)
                                       or patch_size < 1):
            raise ValueError(f"patch_size must be a positive int or None (the whole scene), got {patch_size!r}")
        self.inner = mixer
        self.patch_size = patch_size

    def forward(self, x: Tensor, context: Optional[Tensor] = None, *, level: PointLevel, order_index: int) -> Tensor:
        if context is not None:
            raise ValueError("a serialized mixer mixes the points of its own level: no context")
        if self.patch_size is None and isinstance(self.inner, PoM):
            return self.inner(x.unsqueeze(0), cu_seqlens=level.cu_seqlens).squeeze(0)
        plan = level.patches(order_index, self.patch_size)
        rows = []
        if plan.full is not None:
            rows.append(self.inner(x[plan.full])[plan.keep])
        if plan.short is not None:
            rows.append(self.inner(x[plan.short], mask=plan.short_mask)[plan.short_mask])
        return torch.cat(rows)[plan.inverse]

    def extra_repr(self) -> str:
        return f"patch_size={self.patch_size}"


# ---------------------------------------------------------------------------------------------------------------
# the network
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class PTv3Config(PoMSettings):
    RANGES: ClassVar[Dict[str, Range]] = {  # checked when a config is made (polymixer.ranges); tuples per entry
        **{n: Range(1) for n in ("in_channels", "num_classes", "enc_depths", "enc_channels", "enc_heads", "dec_depths",
                                 "dec_channels", "dec_heads", "patch_size", "stem_kernel", "cpe_kernel")},
        "bn_eps": Range(0, low_open=True), "bn_momentum": Range(0, 1), "block_lr_scale": Range(0)}
    # the serialized orders are shuffled and jump at the curves' folds: a block mixes its patch whatever the distance
    # along the order (no window, no decay)
    MIXER_LETTERS: ClassVar[str] = allowed_letters(full=True, distance_free=True)
    MIXER_OPTIONS: ClassVar[Tuple[str, ...]] = ("qkv_bias", "degree", "expand", "sel_heads", "gate", "reduction",
                                                "value_dim", "value_heads", "attention_shift")
    in_channels: int = 6  # ScanNet: colour/255 and normal
    num_classes: int = 20
    enc_depths: Tuple[int, ...] = (2, 2, 2, 6, 2)
    enc_channels: Tuple[int, ...] = (32, 64, 128, 256, 512)
    enc_heads: Tuple[int, ...] = (2, 4, 8, 16, 32)
    dec_depths: Tuple[int, ...] = (2, 2, 2, 2)
    dec_channels: Tuple[int, ...] = (64, 64, 128, 256)
    dec_heads: Tuple[int, ...] = (4, 4, 8, 16)
    orders: Tuple[str, ...] = ORDERS
    shuffle_orders: bool = True
    patch_size: PatchSize = 1024  # attention patches (None: whole scene — quadratic)
    # PoM patches per stage (decoder stage s uses stage s's): "patch" = patch_size, an int, or None = whole scene;
    # a single value applies to every stage
    pom_patch_size: Any = "patch"
    mixer: str = "attention"  # "attention" | "pom" | "value_pom" | "hybrid" | a pattern over A / P / V, tiled over
    #                           the blocks in order (PoM and value-PoM blocks read pom_patch_size points)
    hybrid: str = "AP"
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    drop_path: float = 0.3
    stem_kernel: int = 5
    cpe_kernel: int = 3
    bn_eps: float = 1e-3
    bn_momentum: float = 0.01
    block_lr_scale: float = 0.1  # PTv3 trains the transformer blocks at a 10× smaller learning rate
    degree: int = 2  # PoM
    expand: float = 2
    pom_bias: bool = True
    value_dim: Optional[int] = None  # V blocks (value-carrying PoM): value width dv (None: the stage's width)
    value_heads: int = 1  # V blocks: heads splitting D and dv
    attention_shift: int = 0  # A / L layers: tokens their key / value shift reads (0: none; the value PoM's shift,
    #                           offered to attention alike)

    def __post_init__(self) -> None:
        check_ranges(self)
        shift_width(self.attention_shift, "attention_shift")
        for name in ("enc_depths", "enc_channels", "enc_heads", "dec_depths", "dec_channels", "dec_heads", "orders"):
            setattr(self, name, tuple(getattr(self, name)))
        stages = len(self.enc_depths)
        if not (len(self.enc_channels) == len(self.enc_heads) == stages):
            raise ValueError(f"enc_depths, enc_channels and enc_heads need one entry per stage: {self.enc_depths}, "
                             f"{self.enc_channels}, {self.enc_heads}")
        if not (len(self.dec_depths) == len(self.dec_channels) == len(self.dec_heads) == stages - 1):
            raise ValueError(f"the decoder needs {stages - 1} stages (one fewer than the encoder): dec_depths "
                             f"{self.dec_depths}, dec_channels {self.dec_channels}, dec_heads {self.dec_heads}")
        bad = [o for o in self.orders if o not in ORDERS]
        if bad or not self.orders:
            raise ValueError(f"orders must be a non-empty subset of {ORDERS}, got {self.orders}")
        if isinstance(self.pom_patch_size, list):
            self.pom_patch_size = tuple(self.pom_patch_size)
        if isinstance(self.pom_patch_size, tuple) and len(self.pom_patch_size) != stages:
            raise ValueError(f"pom_patch_size needs one entry per stage ({stages}), got {self.pom_patch_size}")
        self.layer_pattern()  # a mixer the family does not take is refused with the config

    def pom_patch(self, stage: int) -> PatchSize:
        v = self.pom_patch_size[stage] if isinstance(self.pom_patch_size, tuple) else self.pom_patch_size
        return self.patch_size if v == "patch" else v

    def layer_pattern(self) -> str:
        """One letter per block: the encoder's blocks (stage 0 first), then the decoder's in execution order."""
        n = sum(self.enc_depths) + sum(self.dec_depths)
        return layer_pattern(self.mixer, n, self.hybrid, allowed=self.MIXER_LETTERS)

    @property
    def pattern(self) -> str:
        return self.layer_pattern()


class PTv3Block(nn.Module):
    """CPE (sparse conv → Linear → LayerNorm, residual) then the core's PolyMorpher around a serialized mixer."""

    def __init__(self, cfg: PTv3Config, dim: int, heads: int, letter: str, patch_size: PatchSize, order_index: int,
                 drop_path: float) -> None:
        super().__init__()
        self.cpe = SubMConv3d(dim, dim, cfg.cpe_kernel, bias=True)
        self.cpe_proj = nn.Linear(dim, dim)
        self.cpe_norm = nn.LayerNorm(dim)
        inner = mixer_spec(letter).make(dim, heads=heads, bias=True if letter == "A" else cfg.pom_bias,
                                        **mixer_options(cfg))
        self.letter = letter
        self.order_index = order_index
        self.body = PolyMorpher(dim, mixer=SerializedMixer(inner, patch_size), mlp_ratio=cfg.mlp_ratio,
                                drop_path=drop_path)

    def forward(self, x: Tensor, level: PointLevel) -> Tensor:
        x = x + self.cpe_norm(self.cpe_proj(self.cpe(x, level)))
        return self.body(x, level=level, order_index=self.order_index)


def _linspace(end: float, n: int) -> List[float]:
    return [end * i / (n - 1) if n > 1 else 0.0 for i in range(n)]


def _bn(cfg: PTv3Config, c: int) -> nn.BatchNorm1d:
    return nn.BatchNorm1d(c, eps=cfg.bn_eps, momentum=cfg.bn_momentum)


class SerializedPooling(nn.Module):
    """Halve the grid: Linear, max over each cluster of points sharing a coarse cell, BN, GELU."""

    def __init__(self, cfg: PTv3Config, cin: int, cout: int) -> None:
        super().__init__()
        self.proj = nn.Linear(cin, cout)
        self.norm = _bn(cfg, cout)
        self.act = nn.GELU()

    def forward(self, x: Tensor, level: PointLevel, shuffle: bool) -> Tuple[Tensor, PointLevel, Tensor]:
        coarse, cluster = level.pool(shuffle)
        y = self.proj(x)
        m = len(coarse.batch)
        pooled = y.new_zeros(m, y.shape[1]).scatter_reduce(0, cluster[:, None].expand_as(y), y, "amax",
                                                            include_self=False)
        return self.act(self.norm(pooled)), coarse, cluster


class SerializedUnpooling(nn.Module):
    """Back to the finer level: Linear+BN+GELU of the skip + Linear+BN+GELU of the coarse features gathered back."""

    def __init__(self, cfg: PTv3Config, cin: int, cskip: int, cout: int) -> None:
        super().__init__()
        self.proj = nn.Sequential(nn.Linear(cin, cout), _bn(cfg, cout), nn.GELU())
        self.proj_skip = nn.Sequential(nn.Linear(cskip, cout), _bn(cfg, cout), nn.GELU())

    def forward(self, x: Tensor, skip: Tensor, cluster: Tensor) -> Tensor:
        return self.proj_skip(skip) + self.proj(x)[cluster]


def _blocks(cfg: PTv3Config, pattern: Iterator[str], stage: int, dim: int, heads: int, dps: List[float]
            ) -> List[PTv3Block]:
    """A stage's blocks: the pattern's next letters (PoM's patch that of the stage), one drop-path rate each, the
    orders in turn."""
    blocks = []
    for i, dp in enumerate(dps):
        letter = next(pattern)
        size = cfg.patch_size if letter == "A" else cfg.pom_patch(stage)
        blocks.append(PTv3Block(cfg, dim, heads, letter, size, i % len(cfg.orders), dp))
    return blocks


class _Stage(nn.Module):
    def __init__(self, blocks: List[PTv3Block], down: Optional[nn.Module] = None,
                 up: Optional[nn.Module] = None) -> None:
        super().__init__()
        if down is not None:
            self.down = down
        if up is not None:
            self.up = up
        self.blocks = nn.ModuleList(blocks)


class PTv3(nn.Module):
    """PTv3 / PPoMv3 semantic segmentation: ``model(feat, grid, offset)`` → per-voxel logits (N, num_classes).

    feat: (N, in_channels) float; grid: (N, 3) integer voxel coordinates ≥ 0 (one point per voxel per scene);
    offset: (B,) running point counts of the B scenes concatenated along N (PTv3's batch layout)."""

    family = "points"

    def __init__(self, config: PTv3Config) -> None:
        super().__init__()
        cfg = self.config = config
        pattern = iter(cfg.pattern)
        self.stem_conv = SubMConv3d(cfg.in_channels, cfg.enc_channels[0], cfg.stem_kernel, bias=False)
        self.stem_norm = _bn(cfg, cfg.enc_channels[0])
        self.stem_act = nn.GELU()
        enc_dp = _linspace(cfg.drop_path, sum(cfg.enc_depths))
        self.enc = nn.ModuleList()
        for s in range(len(cfg.enc_depths)):
            dps = enc_dp[sum(cfg.enc_depths[:s]):sum(cfg.enc_depths[:s + 1])]
            blocks = _blocks(cfg, pattern, s, cfg.enc_channels[s], cfg.enc_heads[s], dps)
            down = SerializedPooling(cfg, cfg.enc_channels[s - 1], cfg.enc_channels[s]) if s > 0 else None
            self.enc.append(_Stage(blocks, down=down))
        dec_dp = _linspace(cfg.drop_path, sum(cfg.dec_depths))
        dec_channels = list(cfg.dec_channels) + [cfg.enc_channels[-1]]
        self.dec = nn.ModuleList()
        for s in reversed(range(len(cfg.dec_depths))):  # deepest decoder stage first (execution order)
            dps = dec_dp[sum(cfg.dec_depths[:s]):sum(cfg.dec_depths[:s + 1])][::-1]
            blocks = _blocks(cfg, pattern, s, cfg.dec_channels[s], cfg.dec_heads[s], dps)
            up = SerializedUnpooling(cfg, dec_channels[s + 1], cfg.enc_channels[s], cfg.dec_channels[s])
            self.dec.append(_Stage(blocks, up=up))
        self.head = nn.Linear(cfg.dec_channels[0], cfg.num_classes)

    def lr_scale(self, name: str) -> float:
        """PTv3's parameter groups: the transformer blocks at ``block_lr_scale`` × the learning rate."""
        return self.config.block_lr_scale if ".blocks." in name else 1.0

    def _check(self, feat: Tensor, grid: Tensor, offset: Tensor) -> None:
        cfg = self.config
        if feat.dim() != 2 or feat.shape[1] != cfg.in_channels:
            raise ValueError(f"feat must be (N, {cfg.in_channels}), got {tuple(feat.shape)}")
        if grid.dim() != 2 or grid.shape != (feat.shape[0], 3):
            raise ValueError(f"grid must be (N, 3) with N = {feat.shape[0]} like feat, got {tuple(grid.shape)}")
        if grid.is_floating_point():
            raise TypeError(f"grid must hold integer voxel coordinates, got {grid.dtype}")
        if offset.dim() != 1 or offset.numel() == 0 or offset.is_floating_point():
            raise ValueError(f"offset must be a non-empty 1-D integer tensor of running counts, got "
                             f"{tuple(offset.shape)} {offset.dtype}")
        if int(offset[-1]) != feat.shape[0] or bool((torch.diff(offset, prepend=offset.new_zeros(1)) <= 0).any()):
            raise ValueError(f"offset must be increasing running counts ending at N = {feat.shape[0]} (no empty "
                             f"scene), got {offset.tolist()[:8]}")
        if feat.shape[0] and int(grid.min()) < 0:
            raise ValueError("grid coordinates must be ≥ 0 (subtract the scene's minimum before voxelising)")

    def forward(self, feat: Tensor, grid: Tensor, offset: Tensor) -> Tensor:
        self._check(feat, grid, offset)
        cfg = self.config
        shuffle = self.training and cfg.shuffle_orders
        batch = offsets_to_batch(offset.long())
        with torch.no_grad():
            level = PointLevel.build(grid.long(), batch, cfg.orders, shuffle)
        x = self.stem_act(self.stem_norm(self.stem_conv(feat, level)))
        skips: List[Tuple[Tensor, PointLevel, Optional[Tensor]]] = []
        cluster: Optional[Tensor] = None
        for stage in self.enc:
            if hasattr(stage, "down"):
                skips.append((x, level, cluster))
                x, level, cluster = stage.down(x, level, shuffle)
            for block in stage.blocks:
                x = block(x, level)
        for stage in self.dec:
            skip, parent, parent_cluster = skips.pop()
            x = stage.up(x, skip, cluster)
            level, cluster = parent, parent_cluster
            for block in stage.blocks:
                x = block(x, level)
        return self.head(x)


def _register() -> None:
    from .registry import register_model

    # PPoMv3's PoM (the paper gives the counts, not the configuration): degree 2, one gate per channel, bias on W_o,
    # expand 1.75 — D = 1.75·C is an integer at every width (56 … 896), and it is the configuration that puts both
    # published counts within reach: all-PoM 47,602,564 (paper 47.9M: −0.6%), hybrid 46,885,068 (46.8M: +0.2%).
    # (expand 2 gives 48.46M / 47.31M: +1.2% / +1.1%; one gate per head 46.18M / 46.17M.)
    pom = dict(degree=2, expand=1.75, sel_heads=1, pom_bias=True)
    register_model("ptv3", "points", PTv3Config, PTv3,
                   "Point Transformer V3 (ScanNet, PT-v3m1): 5-stage U-Net, attention in patches of 1,024, 46.2M",
                   mixer="attention", **pom)
    register_model("ppomv3", "points", PTv3Config, PTv3, "PPoMv3: every block PoM in the same patches of 1,024, 47.6M",
                   mixer="pom", **pom)
    # The hybrid as the paper describes it: attention and PoM alternating (A first in every stage of the paper's
    # even depths), PoM reading 4,096 points in the two highest-resolution stages (encoder and decoder stages 0, 1)
    # and the usual 1,024 below.
    register_model("ppomv3-hybrid", "points", PTv3Config, PTv3,
                   "PPoMv3 Hybrid: attention / PoM alternating, PoM context 4,096 in the two finest stages, 46.9M",
                   mixer="hybrid", pom_patch_size=(4096, 4096, 1024, 1024, 1024), **pom)
    # 2-core CPU scale: channels and depths cut, patches of 256 (PoM 1,024 in the finest two stages of the hybrid)
    tiny = dict(enc_depths=(1, 1, 1, 2, 1), enc_channels=(16, 32, 64, 96, 128), enc_heads=(1, 2, 4, 6, 8),
                dec_depths=(1, 1, 1, 1), dec_channels=(32, 32, 64, 96), dec_heads=(2, 2, 4, 6), patch_size=256,
                drop_path=0.1, **pom)
    register_model("tiny-ptv3", "points", PTv3Config, PTv3, "tiny PTv3 for 2 CPU cores (patches of 256)",
                   mixer="attention", **tiny)
    register_model("tiny-ppomv3", "points", PTv3Config, PTv3, "tiny PPoMv3 (every block PoM, patches of 256)",
                   mixer="pom", **tiny)
    # the value-carrying PoM in every block, in the same patches: D = dv = the stage's width, a gate scalar per two
    # halves (sel_heads 2 divides every width), one value head: +0.07% of PTv3, +0.23% of tiny PTv3
    value = dict(mixer="value_pom", degree=2, expand=1, sel_heads=2, value_heads=1, pom_bias=True)
    register_model("ppomv3-value", "points", PTv3Config, PTv3, "PPoMv3 with the value-carrying PoM in every block",
                   **value)
    register_model("tiny-ppomv3-value", "points", PTv3Config, PTv3,
                   "tiny PPoMv3 with the value-carrying PoM (every block, patches of 256)", **{**tiny, **value})
    register_model("tiny-ppomv3-hybrid", "points", PTv3Config, PTv3,
                   "tiny PPoMv3 Hybrid (alternating; PoM context 1,024 in the two finest stages)", mixer="hybrid",
                   pom_patch_size=(1024, 1024, 256, 256, 256), **tiny)


_register()
