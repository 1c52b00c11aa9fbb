"""Images for class-conditional generation: any image folder (class = sub-folder) and the offline default, the
8×8 handwritten digits bundled inside scikit-learn (1,797 images, 10 classes), upsampled."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F

from ..data.faults import SampleFaults, check_files
from ...files import atomic_path

__all__ = ["ImageDataset", "digits", "image_folder", "load_images", "save_grid", "IMAGE_SUFFIXES", "verify_image",
           "check_data"]

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


@dataclass
class ImageDataset:
    """Images in [-1, 1], shape (N, C, S, S), integer labels (N,), and the class names."""

    images: torch.Tensor
    labels: torch.Tensor
    classes: List[str]
    name: str

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def split(self, test_fraction: float, seed: int = 0) -> tuple:
        """A deterministic (train, test) split, stratified by class."""
        g = torch.Generator().manual_seed(seed)
        train_idx, test_idx = [], []
        for c in range(self.num_classes):
            idx = torch.nonzero(self.labels == c).squeeze(1)
            idx = idx[torch.randperm(len(idx), generator=g)]
            k = int(round(len(idx) * test_fraction))
            test_idx.append(idx[:k])
            train_idx.append(idx[k:])
        tr, te = torch.cat(train_idx), torch.cat(test_idx)
        return (ImageDataset(self.images[tr], self.labels[tr], self.classes, self.name + ":train"),
                ImageDataset(self.images[te], self.labels[te], self.classes, self.name + ":test"))


def digits(size: int = 16) -> ImageDataset:
    """scikit-learn's bundled 8×8 digits (no download), bilinearly upsampled to ``size`` × ``size``, in [-1, 1]."""
    from sklearn.datasets import load_digits  # the [lab] extra (the command line names it when missing)

    d = load_digits()
    x = torch.from_numpy(d.images.astype(np.float32) / 16.0).unsqueeze(1)  # (1797, 1, 8, 8) in [0, 1]
    if size != 8:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return ImageDataset((x * 2 - 1).clamp(-1, 1), torch.from_numpy(d.target.astype(np.int64)),
                        [str(i) for i in range(10)], f"digits{size}")


def _read_image(path: Path, size: int, mode: str) -> np.ndarray:
    """(size, size[, 3]) float32 in [0, 1]: the short side resized to ``size``, centre-cropped."""
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert(mode)
        w, h = im.size
        s = size / min(w, h)
        im = im.resize((max(size, round(w * s)), max(size, round(h * s))), Image.BICUBIC)
        w, h = im.size
        left, top = (w - size) // 2, (h - size) // 2
        return np.asarray(im.crop((left, top, left + size, top + size)), dtype=np.float32) / 255.0


def _list_images(root: Path) -> Tuple[List[str], List[Tuple[Path, int]]]:
    """The class names (sub-folders) of an image folder and its (image, class index) pairs; none is an error."""
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {root} does not exist")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    files = [(f, i) for i, c in enumerate(classes) for f in sorted((root / c).rglob("*"))
             if f.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        raise ValueError(f"no images found in {root}{'' if classes else ', which has no class folders'} (expected "
                         f"{root}/<class>/<image> with suffixes {', '.join(sorted(IMAGE_SUFFIXES))})")
    return classes, files


def verify_image(path: Union[str, Path]) -> Tuple[int, int]:
    """(width, height) of an image file from its header, after Pillow's ``verify`` (a PNG's chunks and checksums are
    read, no pixel is decoded): the upfront check of a file a loader will decode. A missing, empty, unreadable or
    0-pixel image is an OSError / ValueError naming the file. ``verify`` is stricter than decoding (a PNG cut short
    after its pixel data still decodes), so a file it rejects is decoded before it is called bad: bad means the
    loaders cannot read it. (A JPEG whose scan data is cut short passes: Pillow reads that only when decoding.)"""
    from PIL import Image

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    if path.stat().st_size == 0:
        raise ValueError(f"{path} is an empty file (0 bytes)")
    try:
        with Image.open(path) as im:
            w, h = im.size
            im.verify()
    except Exception:  # Pillow raises several types on malformed files (OSError, SyntaxError, struct.error)
        try:
            with Image.open(path) as im:
                w, h = im.size
                im.load()
        except Exception as e:
            raise ValueError(f"cannot read image {path}: {e}") from e
    if w < 1 or h < 1:
        raise ValueError(f"image {path} is empty ({w}×{h})")
    return w, h


def check_data(data: Union[str, Path], progress: bool = True) -> List[Tuple[str, str]]:
    """Every bad file of an image folder with its reason, in one pass over the headers (``polymixer check-data
    image`` and the scan before ``train``): a missing folder or one without images, and each image the loader would
    read that Pillow cannot open and verify, or that has no pixels."""
    root = Path(data)
    try:
        _, files = _list_images(root)
    except (OSError, ValueError) as e:
        return [(str(root), str(e))]

    def check(item: Tuple[Path, int]) -> None:
        verify_image(item[0])

    return check_files(files, check, lambda item: str(item[0]), progress, desc=f"check {root.name}")


def image_folder(root: Union[str, Path], size: int, channels: int = 3,
                 faults: Optional[SampleFaults] = None) -> ImageDataset:
    """Every image under ``root/<class>/`` (Pillow), resized so the short side is ``size`` and centre-cropped. An
    unreadable image stops with its name, or is left out when ``faults`` skips bad samples."""

    root = Path(root)
    classes, files = _list_images(root)
    mode = {1: "L", 3: "RGB"}.get(channels)
    if mode is None:
        raise ValueError(f"image folders load 1 or 3 channels, got {channels}")
    faults = faults if faults is not None else SampleFaults()
    arrays, labels = [], []
    for f, c in files:
        a = faults.call(f, _read_image, f, size, mode)
        if a is not None:
            arrays.append(a[None] if channels == 1 else a.transpose(2, 0, 1))
            labels.append(c)
    if not arrays:
        raise ValueError(f"none of the {len(files)} images in {root} is readable")
    return ImageDataset(torch.from_numpy(np.stack(arrays)) * 2 - 1, torch.tensor(labels), classes, str(root))


def load_images(path: Optional[Union[str, Path]], size: int, channels: int,
                faults: Optional[SampleFaults] = None) -> ImageDataset:
    """An image folder, or the digits default when ``path`` is None (single channel)."""
    if path is None:
        if channels != 1:
            raise ValueError(f"the digits default is single-channel, but the model expects {channels} channels")
        return digits(size)
    return image_folder(path, size, channels, faults)


def save_grid(images: torch.Tensor, path: Union[str, Path], nrow: int, upscale: int = 4) -> Path:
    """Save (N, C, H, W) images in [-1, 1] as a PNG grid (``nrow`` per row), nearest-neighbour upscaled."""
    from PIL import Image

    x = ((images.detach().float().clamp(-1, 1) + 1) * 127.5).round().byte().cpu()
    N, C, H, W = x.shape
    rows = -(-N // nrow)
    pad = 2
    grid = torch.full((C, rows * (H + pad) + pad, nrow * (W + pad) + pad), 255, dtype=torch.uint8)
    for i in range(N):
        r, c = divmod(i, nrow)
        grid[:, pad + r * (H + pad):pad + r * (H + pad) + H, pad + c * (W + pad):pad + c * (W + pad) + W] = x[i]
    arr = grid.permute(1, 2, 0).numpy()
    img = Image.fromarray(arr[..., 0] if C == 1 else arr, mode="L" if C == 1 else "RGB")
    if upscale > 1:
        img = img.resize((img.width * upscale, img.height * upscale), Image.NEAREST)
    path = Path(path)
    with atomic_path(path) as tmp:
        img.save(tmp, format="PNG")
    return path
