"""Text-line images for handwriting recognition: the real dataset layouts, the charset, multi-line pages,
HTR-VT's augmentations, batching, and the offline defaults.

Layouts read:

* **HTR-VT's** (IAM, READ2016 and LAM as HTR-VT prepares them)::

      <root>/lines/<name>.{png,jpg,jpeg}   <root>/lines/<name>.txt   <root>/{train,val,test}.ln

  where each split list names one image per line (``a01-000u-00.png``; the extension may be omitted).
* **IAM's own distribution**: ``<root>/lines.txt`` (``a01-000u-00 ok 154 19 408 746 1661 89 A|MOVE|to|stop``, ``|``
  between words) and the ``<root>/lines/a01/a01-000u/a01-000u-00.png`` tree; the split lists are ``<split>.ln`` in
  the root, or IAM's task files (``trainset.txt``, ``validationset1.txt``, ``testset.txt``).

Offline defaults (no download), generated once, seeded, into the HTR-VT layout so the one loader reads them too:
``synthetic`` (text lines rendered from matplotlib's fonts with handwriting-like distortions, sentences from the
Python standard library's docstrings) and ``digits`` (lines of real handwritten digits from scikit-learn).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..data.faults import READ_ERRORS, SampleError, SampleFaults, check_files, reading
from ...models.ocr import PIXELS_PER_TOKEN
from ..image.data import verify_image

__all__ = ["IAM_CHARSET", "Charset", "LineRecord", "LineSet", "AugmentConfig", "list_split", "read_transcription",
           "load_line_image", "load_split", "compose_page", "augment", "collate", "check_data", "page_of",
           "IMAGE_SUFFIXES", "DEFAULTS", "PIXELS_PER_TOKEN"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
IAM_CHARSET = " !\"#&'()*+,-./0123456789:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
DEFAULTS = ("synthetic", "digits")
# a line's page: everything before its last "-" or "_" followed by digits (IAM a01-000u-00, LAM 002_02_00)
PAGE_PATTERN = re.compile(r"^(?P<page>.+)[-_](?P<line>\d+)$")
_SPACES = re.compile(r"\s+")
_IAM_TASK_FILES = {"train": ("trainset.txt",), "val": ("validationset1.txt", "validationset2.txt"),
                   "test": ("testset.txt",)}


class Charset:
    """The characters a model can write: class 0 is the CTC blank, character i is class i + 1.

    Built from the training transcriptions (sorted, like HTR-VT) and saved with every checkpoint. A character
    outside it cannot be predicted: ``encode`` drops it (and ``unknown`` counts it), so evaluation scores it as an
    error instead of crashing.
    """

    def __init__(self, chars: str) -> None:
        if not isinstance(chars, str) or not chars:
            raise ValueError("a charset needs at least one character")
        if len(set(chars)) != len(chars):
            dup = sorted({c for c in chars if chars.count(c) > 1})
            raise ValueError(f"charset has repeated characters {dup}")
        self.chars = chars
        self._index = {c: i + 1 for i, c in enumerate(chars)}

    @classmethod
    def from_texts(cls, texts: Sequence[str]) -> "Charset":
        return cls("".join(sorted(set("".join(texts)))))

    @property
    def num_classes(self) -> int:
        return len(self.chars) + 1

    def __len__(self) -> int:
        return len(self.chars)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Charset) and other.chars == self.chars

    def __repr__(self) -> str:
        return f"Charset({self.chars!r})"

    def encode(self, text: str) -> List[int]:
        """Class ids of the known characters of ``text``."""
        return [self._index[c] for c in text if c in self._index]

    def unknown(self, text: str) -> int:
        """How many characters of ``text`` the charset cannot write."""
        return sum(c not in self._index for c in text)

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.chars[i - 1] for i in ids if 0 < i <= len(self.chars))


@dataclass(frozen=True)
class LineRecord:
    """One line of a dataset: its name, image file, transcription and (when the name says) page and line."""

    name: str
    image: Path
    text: str
    page: Optional[str] = None
    line: Optional[int] = None


def page_of(name: str) -> Tuple[Optional[str], Optional[int]]:
    """(page id, line number) from a line name (``a01-000u-00`` → ``("a01-000u", 0)``), or (None, None)."""
    m = PAGE_PATTERN.match(name)
    return (m.group("page"), int(m.group("line"))) if m else (None, None)


def _clean(text: str) -> str:
    return _SPACES.sub(" ", text).strip()


def read_transcription(path: Union[str, Path]) -> str:
    """A line's transcription with line breaks and repeated spaces collapsed (HTR-VT's rule); a missing or empty
    file is a ValueError naming it."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"missing transcription {path}")
    try:
        text = _clean(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"transcription {path} is not UTF-8 text: {e}") from e
    if not text:
        raise ValueError(f"empty transcription {path}")
    return text


def _read_list(path: Path) -> List[str]:
    return [s.strip() for s in path.read_text(encoding="utf-8").splitlines() if s.strip() and not s.startswith("#")]


def _layout(root: Path) -> str:
    if (root / "lines.txt").is_file():
        return "iam"
    if (root / "lines").is_dir():
        return "htrvt"
    raise FileNotFoundError(f"{root} is not a line dataset: it needs a lines/ folder of <name>.png + <name>.txt "
                            f"beside train.ln / val.ln / test.ln (HTR-VT's layout), or IAM's lines.txt and lines/ tree")


def _image_in(folder: Path, entry: str, listing: Path) -> Path:
    p = folder / entry
    if p.suffix.lower() in IMAGE_SUFFIXES:
        if not p.is_file():
            raise FileNotFoundError(f"{listing} names {entry}, but {p} does not exist")
        return p
    for suffix in IMAGE_SUFFIXES:
        if (folder / (entry + suffix)).is_file():
            return folder / (entry + suffix)
    raise FileNotFoundError(f"{listing} names {entry}, but no {entry}.png/.jpg/.jpeg exists in {folder}")


def _iam_lines(root: Path) -> Dict[str, str]:
    out: Dict[str, str] = {}
    lines_txt = root / "lines.txt"
    for n, raw in enumerate(lines_txt.read_text(encoding="utf-8").splitlines(), 1):
        if not raw.strip() or raw.startswith("#"):
            continue
        parts = raw.split(" ")
        if len(parts) < 9:
            raise ValueError(f"{lines_txt}:{n}: expected 'id status graylevel components x y w h transcription', "
                             f"got {raw!r}")
        out[parts[0]] = _clean(" ".join(parts[8:]).replace("|", " "))
    return out


def _split_sources(root: Path, layout: str, split: str) -> List[Path]:
    """The split list(s) of ``split``: ``<split>.ln``, or in IAM's layout its task files; [] when there is none."""
    listing = root / f"{split}.ln"
    if listing.is_file():
        return [listing]
    if layout == "iam":
        return [root / f for f in _IAM_TASK_FILES.get(split, ()) if (root / f).is_file()]
    return []


def _split_lines(root: Path, layout: str, split: str
                 ) -> Tuple[List[LineRecord], List[Tuple[Path, Exception]], List[Path]]:
    """The lines of a split whose image file and transcription were found; (file, error) for every missing image or
    transcription, in the order of the split list (a line may have both); and every image file found."""
    sources = _split_sources(root, layout, split)
    if not sources:
        if layout == "htrvt":
            raise FileNotFoundError(f"split list {root / f'{split}.ln'} does not exist (one image name per line)")
        raise FileNotFoundError(f"no split list for {split!r} in {root}: expected {split}.ln or IAM's "
                                f"{' / '.join(_IAM_TASK_FILES.get(split, ()))}")
    records: List[LineRecord] = []
    problems: List[Tuple[Path, Exception]] = []
    found: List[Path] = []
    if layout == "htrvt":
        lines = root / "lines"
        for entry in _read_list(sources[0]):
            image: Optional[Path] = None
            try:
                image = _image_in(lines, entry, sources[0])
                found.append(image)
            except FileNotFoundError as e:
                problems.append((lines / entry, e))
            base = entry[:-len(Path(entry).suffix)] if Path(entry).suffix.lower() in IMAGE_SUFFIXES else entry
            txt = image.with_suffix(".txt") if image is not None else lines / (base + ".txt")
            if image is None and not txt.exists():  # an entry with no file at all: reported once, as the entry
                continue
            try:
                text = read_transcription(txt)
            except ValueError as e:
                problems.append((txt, e))
                continue
            if image is not None:
                page, line = page_of(image.stem)
                records.append(LineRecord(image.stem, image, text, page, line))
    else:
        texts = _iam_lines(root)
        lines_txt = root / "lines.txt"
        if sources[0].suffix == ".ln":
            names = [Path(e).stem if Path(e).suffix.lower() in IMAGE_SUFFIXES else e for e in _read_list(sources[0])]
        else:
            names = [e for s in sources for e in _read_list(s)]
        for name in names:
            ok = True
            if name not in texts:
                problems.append((lines_txt, ValueError(f"{sources[0]} names {name}, which {lines_txt} does not "
                                                       f"transcribe")))
                ok = False
            elif not texts[name]:
                problems.append((lines_txt, ValueError(f"empty transcription for {name} in {lines_txt}")))
                ok = False
            parts = name.split("-")
            folder = root / "lines" / parts[0] / "-".join(parts[:2])
            try:
                image = _image_in(folder, name, sources[0])
                found.append(image)
            except FileNotFoundError as e:
                problems.append((folder / name, e))
                continue
            if ok:
                page, line = page_of(name)
                records.append(LineRecord(name, image, texts[name], page, line))
    return records, problems, found


def list_split(root: Union[str, Path], split: str) -> List[LineRecord]:
    """The lines of one split (``train``, ``val`` or ``test``) of a dataset in either layout; the first missing image
    or transcription is an error naming it."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"dataset folder {root} does not exist")
    records, problems, _ = _split_lines(root, _layout(root), split)
    if problems:
        raise problems[0][1]
    if not records:
        raise ValueError(f"split {split!r} of {root} is empty")
    return records


def load_line_image(path: Union[str, Path], height: int, max_width: Optional[int]) -> np.ndarray:
    """Grayscale uint8 (height, w): resized to ``height`` keeping the aspect ratio, the width capped at
    ``max_width`` (HTR-VT squeezes a longer line); a file that cannot be read, or a line narrower than one token
    (4 pixels) after resizing, is a ValueError naming the file."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    try:
        with Image.open(path) as im:
            im.load()
            gray = im.convert("L")
    except FileNotFoundError:
        raise
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise ValueError(f"cannot read image {path}: {e}") from e
    nw = _line_width(path, gray.size, height, max_width)
    return np.asarray(gray.resize((nw, height), Image.BICUBIC), dtype=np.uint8)


def _line_width(path: Path, size: Tuple[int, int], height: int, max_width: Optional[int]) -> int:
    """The width of a line image of ``size`` (w, h) resized to ``height`` and capped at ``max_width``; an empty image
    or one narrower than one token is a ValueError naming the file."""
    w, h = size
    if w < 1 or h < 1:
        raise ValueError(f"image {path} is empty ({w}×{h})")
    nw = int(round(w * height / h))
    if max_width is not None:
        nw = min(nw, max_width)
    if nw < PIXELS_PER_TOKEN:
        raise ValueError(f"image {path} ({w}×{h}) is {nw} pixels wide at height {height}: too narrow for one "
                         f"token ({PIXELS_PER_TOKEN} pixels)")
    return nw


@dataclass
class LineSet:
    """One split in memory: the records and their images, already resized (uint8, white = 255)."""

    records: List[LineRecord]
    images: List[np.ndarray]
    name: str = ""

    def __len__(self) -> int:
        return len(self.records)

    @property
    def texts(self) -> List[str]:
        return [r.text for r in self.records]

    def pages(self, max_lines: int = 16) -> List[List[int]]:
        """Indices of the lines of each page in reading order, in chunks of at most ``max_lines`` consecutive lines
        (a page of 20 lines gives 16 + 4). Lines whose names carry no page id are a ValueError naming one."""
        if max_lines < 1:
            raise ValueError(f"max_lines must be ≥ 1, got {max_lines}")
        groups: Dict[str, List[int]] = {}
        for i, r in enumerate(self.records):
            if r.page is None:
                raise ValueError(f"line {r.name} has no page id in its name (expected <page>-<line> or "
                                 f"<page>_<line>, as IAM and LAM name lines): multi-line pages cannot be formed")
            groups.setdefault(r.page, []).append(i)
        out = []
        for page in sorted(groups):
            idx = sorted(groups[page], key=lambda i: self.records[i].line)
            out += [idx[k:k + max_lines] for k in range(0, len(idx), max_lines)]
        return out

    def subset(self, indices: Sequence[int]) -> "LineSet":
        return LineSet([self.records[i] for i in indices], [self.images[i] for i in indices], self.name)


def load_split(root: Union[str, Path], split: str, height: int, max_width: Optional[int],
               progress: bool = False, faults: Optional[SampleFaults] = None) -> LineSet:
    """Read and resize every line of a split, on every core (Pillow decodes without the GIL), with a progress bar.
    An unreadable line image stops with its name, or is left out when ``faults`` skips bad samples."""
    from concurrent.futures import ThreadPoolExecutor

    from tqdm.auto import tqdm

    def read(r: LineRecord) -> Union[np.ndarray, SampleError]:
        try:
            with reading(r.image):
                return load_line_image(r.image, height, max_width)
        except SampleError as e:  # kept, so that the first bad line in order is the one reported
            return e

    faults = faults if faults is not None else SampleFaults()
    records = list_split(root, split)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        jobs = pool.map(read, records)
        loaded = list(tqdm(jobs, total=len(records), desc=f"load {Path(root).name}/{split}", disable=not progress,
                           unit="line"))
    kept, images = [], []
    for r, im in zip(records, loaded):  # in order, so that the first bad line is the one reported
        if isinstance(im, SampleError):
            faults.record(im)
        else:
            kept.append(r)
            images.append(im)
    if not kept:
        raise ValueError(f"none of the {len(records)} line images of split {split!r} of {root} is readable")
    return LineSet(kept, images, f"{Path(root).name}/{split}")


def check_data(data: Union[str, Path], progress: bool = True, height: Optional[int] = None,
               max_width: Optional[int] = None) -> List[Tuple[str, str]]:
    """Every bad file of a line dataset (either layout) with its reason, in one pass over every split present
    (``polymixer check-data ocr`` and the scan before ``train``): a split list naming a line whose image or
    transcription is missing, a transcription that is empty or not UTF-8, and a line image that Pillow cannot open
    and verify from its header or that has no pixels. With the model's ``height`` (and ``max_width``), a line too
    narrow for one token at that height is bad too, as :func:`load_line_image` would find."""
    root = Path(data)
    if not root.is_dir():
        return [(str(root), f"dataset folder {root} does not exist")]
    try:
        layout = _layout(root)
        if layout == "iam":
            _iam_lines(root)
    except READ_ERRORS as e:
        return [(str(root / "lines.txt") if (root / "lines.txt").is_file() else str(root), str(e))]
    splits = [s for s in ("train", "val", "test") if _split_sources(root, layout, s)]
    if not splits:
        return [(str(root), f"{root} has no split list (train.ln / val.ln / test.ln"
                            f"{', or IAM task files' if layout == 'iam' else ''})")]
    bad: List[Tuple[str, str]] = []
    images: Dict[Path, None] = {}
    for split in splits:
        sources = _split_sources(root, layout, split)
        try:
            records, problems, found = _split_lines(root, layout, split)
        except READ_ERRORS as e:
            bad.append((str(sources[0]), str(e)))
            continue
        bad += [(str(path), str(e)) for path, e in problems]
        if not records and not problems:
            bad.append((str(sources[0]), f"split {split!r} of {root} is empty"))
        images.update((f, None) for f in found)

    def check(path: Path) -> None:
        size = verify_image(path)
        if height is not None:
            _line_width(path, size, height, max_width)

    bad += check_files(list(images), check, str, progress, desc=f"check {root.name}")
    return list(dict.fromkeys(bad))  # a line listed in two splits is reported once


def compose_page(images: Sequence[np.ndarray], gap: int) -> np.ndarray:
    """The lines of a page side by side, left to right, ``gap`` white pixels between them (LAM-Mul.'s layout)."""
    if not images:
        raise ValueError("a page needs at least one line")
    h = images[0].shape[0]
    if any(im.shape[0] != h for im in images):
        raise ValueError(f"lines of a page must share a height, got {sorted({im.shape[0] for im in images})}")
    white = np.full((h, gap), 255, dtype=np.uint8)
    parts: List[np.ndarray] = []
    for k, im in enumerate(images):
        if k and gap:
            parts.append(white)
        parts.append(im)
    return np.concatenate(parts, axis=1)


@dataclass
class AugmentConfig:
    """HTR-VT's training augmentations (its LAM settings), each applied with probability ``p``."""

    p: float = 0.5
    projective: float = 8.0  # corner displacement, pixels at height 64 (scaled with the height)
    morph_kernel: int = 2  # erosion / dilation kernels of 1 … this size
    brightness: float = 0.4
    contrast: float = 0.4


def _perspective_coeffs(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Pillow's 8 PERSPECTIVE coefficients mapping output points ``dst`` to input points ``src``."""
    a = []
    b = []
    for (x, y), (u, v) in zip(dst, src):
        a.append([x, y, 1, 0, 0, 0, -u * x, -u * y])
        a.append([0, 0, 0, x, y, 1, -v * x, -v * y])
        b += [u, v]
    return np.linalg.solve(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))


def augment(image: np.ndarray, rng: np.random.Generator, cfg: Optional[AugmentConfig] = None) -> np.ndarray:
    """HTR-VT's augmentations on one uint8 line (white = 255): a random projective warp of the corners (all
    horizontal or all vertical), erosion or dilation (thicker or thinner strokes), brightness and contrast jitter.
    The output has the input's shape."""
    from PIL import Image
    from scipy import ndimage

    cfg = cfg or AugmentConfig()
    h, w = image.shape
    out = image
    if rng.random() < cfg.p and cfg.projective > 0:
        d = cfg.projective * h / 64.0
        corners = np.array([[0, 0], [0, h - 1], [w - 1, h - 1], [w - 1, 0]], dtype=np.float64)
        axis = int(rng.integers(0, 2))
        shift = np.zeros_like(corners)
        shift[:, axis] = rng.uniform(-d, d, size=4)
        coeffs = _perspective_coeffs(corners + shift, corners)
        out = np.asarray(Image.fromarray(out).transform((w, h), Image.PERSPECTIVE, tuple(coeffs), Image.BICUBIC,
                                                         fillcolor=255))
    if rng.random() < cfg.p and cfg.morph_kernel > 1:
        size = (int(rng.integers(1, cfg.morph_kernel + 1)), int(rng.integers(1, cfg.morph_kernel + 1)))
        op = ndimage.grey_erosion if rng.random() < 0.5 else ndimage.grey_dilation  # erosion thickens dark ink
        out = op(out, size=size)
    if rng.random() < cfg.p and (cfg.brightness > 0 or cfg.contrast > 0):
        x = out.astype(np.float32)
        b = rng.uniform(max(0.0, 1 - cfg.brightness), 1 + cfg.brightness)
        c = rng.uniform(max(0.0, 1 - cfg.contrast), 1 + cfg.contrast)
        for op in rng.permutation(2):
            if op == 0:
                x = np.clip(x * b, 0, 255)
            else:
                x = np.clip(x.mean() + c * (x - x.mean()), 0, 255)
        out = x.round().astype(np.uint8)
    return np.ascontiguousarray(out)


def collate(images: Sequence[np.ndarray]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(B, 1, H, W) float32 in [0, 1], right-padded with white to the widest line, and the real widths (B,)."""
    if not images:
        raise ValueError("an empty batch")
    h = images[0].shape[0]
    widths = torch.tensor([im.shape[1] for im in images], dtype=torch.int64)
    out = np.full((len(images), 1, h, int(widths.max())), 255, dtype=np.uint8)
    for b, im in enumerate(images):
        if im.shape[0] != h:
            raise ValueError(f"lines of a batch must share a height, got {h} and {im.shape[0]}")
        out[b, 0, :, :im.shape[1]] = im
    return torch.from_numpy(out).float().div_(255.0), widths
