"""Offline, seeded text-line datasets for handwriting recognition, written in HTR-VT's layout::

    <root>/lines/<name>.png   <root>/lines/<name>.txt   <root>/train.ln   <root>/val.ln   <root>/test.ln

* :func:`render_synthetic_lines` — English sentences (the docstrings of the Python standard library) rendered
  from the TrueType fonts matplotlib ships, then distorted to look written: slant, baseline wobble, elastic warp,
  keystone, stroke weight, ink and paper noise. One page = one "writer" (font, size, slant, ink fixed per page).
* :func:`render_digit_lines` — real handwriting: lines of scikit-learn's bundled 8×8 handwritten digits, the
  source images split into disjoint train / val / test pools so that test lines use only unseen digits.

Names are ``<prefix>-<page:05d>-<line:02d>``; a page never spans two splits. Every page draws its randomness from
``numpy.random.default_rng([seed, page])`` so any page is reproducible on its own. The dataset is written into a
temporary sibling folder and moved to ``root`` at the end: an interrupted run never leaves half a dataset.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import sysconfig
import zlib
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..data.cache import build_folder, cached_default, resolve_folder
from .data import DEFAULTS, IAM_CHARSET

__all__ = ["IAM_CHARSET", "SPLITS", "fonts", "sentences", "digit_pools", "render_synthetic_lines",
           "render_digit_lines", "default_data", "resolve_data"]

SPLITS = ("train", "val", "test")
SYNTHETIC_COUNTS = {"train": 12000, "val": 600, "test": 1000}
DIGIT_COUNTS = {"train": 3000, "val": 300, "test": 600}

Line = Tuple[np.ndarray, str]  # (uint8 grayscale image, transcription)


# ----------------------------------------------------------------------------------------------------------------
# Writing a dataset
# ----------------------------------------------------------------------------------------------------------------


def _check_counts(counts: Optional[Dict[str, int]], default: Dict[str, int]) -> Dict[str, int]:
    counts = dict(default if counts is None else counts)
    unknown = sorted(set(counts) - set(SPLITS))
    if unknown:
        raise ValueError(f"unknown split(s) {unknown}; expected some of {', '.join(SPLITS)}")
    for split, n in counts.items():
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"counts[{split!r}] must be a non-negative integer, got {n!r}")
    return {s: int(counts[s]) for s in SPLITS if s in counts}


def _save_png(path: Path, image: np.ndarray) -> None:
    from PIL import Image

    Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8)).save(path, compress_level=1)


def _write_dataset(root: Union[str, Path], counts: Dict[str, int], prefix: str, progress: bool, desc: str,
                   make_page: Callable[[str, int, int], List[Line]]) -> Path:
    """Write pages from ``make_page(split, page, max_lines)`` until every split has its count of lines, into a
    temporary sibling folder that is renamed to ``root`` at the end."""
    root = Path(root)
    with build_folder(root) as tmp:
        (tmp / "lines").mkdir()
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=sum(counts.values()), desc=desc, unit="line")
        try:
            page = 0
            for split, n in counts.items():
                names: List[str] = []
                while len(names) < n:
                    lines = make_page(split, page, n - len(names))
                    for k, (image, text) in enumerate(lines):
                        name = f"{prefix}-{page:05d}-{k:02d}"
                        _save_png(tmp / "lines" / f"{name}.png", image)
                        (tmp / "lines" / f"{name}.txt").write_text(text, encoding="utf-8")
                        names.append(f"{name}.png")
                    if bar is not None:
                        bar.update(len(lines))
                    page += 1
                (tmp / f"{split}.ln").write_text("".join(f"{x}\n" for x in names), encoding="utf-8")
        finally:
            if bar is not None:
                bar.close()
    return root


def _page_rng(seed: int, page: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), int(page)])


# ----------------------------------------------------------------------------------------------------------------
# Fonts
# ----------------------------------------------------------------------------------------------------------------

# PostScript glyph names of the ASCII punctuation: a font whose charmap sends "!" to "omega" (matplotlib's
# Computer Modern fonts use their own encodings) covers the code points but does not draw the characters.
_GLYPH_NAMES = {
    " ": "space", "!": "exclam", '"': "quotedbl", "#": "numbersign", "$": "dollar", "%": "percent",
    "&": "ampersand", "'": "quotesingle", "(": "parenleft", ")": "parenright", "*": "asterisk", "+": "plus",
    ",": "comma", "-": "hyphen", ".": "period", "/": "slash", ":": "colon", ";": "semicolon", "<": "less",
    "=": "equal", ">": "greater", "?": "question", "@": "at", "[": "bracketleft", "\\": "backslash",
    "]": "bracketright", "^": "asciicircum", "_": "underscore", "`": "grave", "{": "braceleft", "|": "bar",
    "}": "braceright", "~": "asciitilde", "0": "zero", "1": "one", "2": "two", "3": "three", "4": "four",
    "5": "five", "6": "six", "7": "seven", "8": "eight", "9": "nine",
}


def _expected_glyph_name(c: str) -> Optional[str]:
    if c in _GLYPH_NAMES:
        return _GLYPH_NAMES[c]
    if c.isascii() and c.isalpha():
        return c
    return None  # no opinion about other characters


def _font_covers(path: Path, charset: str) -> bool:
    """True if the font maps every character to its own glyph and, where the font names its glyphs, to the
    glyph of that name (so symbol fonts with a Latin charmap, and one-glyph fallback fonts, are rejected)."""
    from matplotlib.ft2font import FT2Font

    try:
        font = FT2Font(str(path))
        cmap = font.get_charmap()
    except Exception:  # unreadable font file
        return False
    chars = sorted(set(charset))
    glyphs = [cmap.get(ord(c), 0) for c in chars]
    if any(g == 0 for g in glyphs) or len(set(glyphs)) != len(glyphs):
        return False
    names = [font.get_glyph_name(g) for g in glyphs]
    if not any(names):  # a font without glyph names: the charmap is all there is to check
        return True
    for c, name in zip(chars, names):
        want = _expected_glyph_name(c)
        if want is not None and name not in (want, f"uni{ord(c):04X}"):
            return False
    return True


@functools.lru_cache(maxsize=None)
def _fonts(charset: str) -> Tuple[Path, ...]:
    import matplotlib

    folder = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    return tuple(p for p in sorted(folder.glob("*.ttf")) if _font_covers(p, charset))


def fonts(charset: str = IAM_CHARSET) -> List[Path]:
    """matplotlib's bundled TrueType fonts (sorted) that draw every character of ``charset``."""
    return list(_fonts(charset))


@functools.lru_cache(maxsize=64)
def _truetype(path: str, size: int):
    from PIL import ImageFont

    return ImageFont.truetype(path, size)


# ----------------------------------------------------------------------------------------------------------------
# Sentences: the standard library's docstrings
# ----------------------------------------------------------------------------------------------------------------

_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "__pycache__"}
_ASCII_PUNCT = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
                              "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u2033": '"', "\u2010": "-",
                              "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\u2015": "-",
                              "\u2212": "-", "\u00a0": " ", "\u2009": " ", "\u202f": " "})
_SENTENCE_END = re.compile(r"(?<=[.?!])\s+(?=[\"'(]?[A-Z])")
_ABBREVIATION = re.compile(r"(?:\b(?:e\.g|i\.e|etc|vs|cf|Mr|Mrs|Dr|St|No)\.|\b[A-Z]\.)$")
# code-like: a call or empty parentheses, comparisons, prompts, identifiers with underscores, reST roles and
# literals, dotted names (os.path), options (--x), file names, Python constants and keywords used as words
_CODE = re.compile(r"\w\(|\(\s*\)|==|!=|<|>|>>>|\.\.\.|_|::|`|\$|%|@|\\|[{}\[\]|~^=]|[a-z]\.[a-zA-Z]{2,}|"
                   r"\w:\S|--|\s[-+*/]\s|[*#]|\w/\w+/|\b(?:self|cls|None|True|False|args|kwargs|def|elif|"
                   r"lambda|str|int|bool|dict|tuple)\b|\.py\b|\bx\d|\d[a-z]")


def _stdlib_files() -> List[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out: List[Path] = []
    for folder, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        out.extend(Path(folder) / f for f in sorted(files) if f.endswith(".py"))
    return out


def _docstrings(path: Path) -> List[str]:
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, OSError, UnicodeDecodeError, RecursionError, MemoryError):
        return []
    docs = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                docs.append(doc)
    return docs


def _prose_paragraphs(doc: str) -> List[str]:
    """The paragraphs of a docstring that are running text: indented blocks (code, argument lists), doctests
    and bullet lists are dropped."""
    blocks: List[List[str]] = [[]]
    for line in doc.translate(_ASCII_PUNCT).splitlines():
        if line.strip():
            blocks[-1].append(line)
        elif blocks[-1]:
            blocks.append([])
    out = []
    for block in blocks:
        if not block or any(ln[:1] in (" ", "\t") for ln in block):
            continue
        if any(ln.lstrip().startswith((">>>", "...", "-", "*", "|", "+", "=", "#", ":", "..")) for ln in block):
            continue
        out.append(" ".join(ln.strip() for ln in block))
    return out


def _split_sentences(paragraph: str) -> List[str]:
    parts = _SENTENCE_END.split(re.sub(r"\s+", " ", paragraph).strip())
    merged: List[str] = []
    for part in parts:
        if merged and _ABBREVIATION.search(merged[-1]):
            merged[-1] += " " + part
        else:
            merged.append(part)
    return merged


def _is_prose(s: str) -> bool:
    """Mostly lower-case words and letters, few symbols, nothing that looks like code."""
    if not 20 <= len(s) <= 250 or not s[0].isupper() or s[-1] not in ".?!":
        return False
    if not s.isascii() or _CODE.search(s):
        return False
    words = s.split()
    if len(words) < 4 or max(len(w) for w in words) > 20:
        return False
    ink = s.replace(" ", "")
    if sum(c.isalpha() for c in ink) < 0.85 * len(ink):
        return False
    if sum(not c.isalnum() for c in ink) > max(3, 0.08 * len(ink)):
        return False
    return sum(w.isalpha() and w.islower() for w in words) >= 0.6 * len(words)


@functools.lru_cache(maxsize=1)
def _paragraphs() -> Tuple[Tuple[str, ...], ...]:
    """Prose sentences of the standard library's docstrings grouped by paragraph, in a fixed order (files walked
    sorted), each sentence kept once (its first occurrence)."""
    seen = set()
    out = []
    for path in _stdlib_files():
        for doc in _docstrings(path):
            for paragraph in _prose_paragraphs(doc):
                kept = []
                for s in _split_sentences(paragraph):
                    if s not in seen and _is_prose(s):
                        seen.add(s)
                        kept.append(s)
                if kept:
                    out.append(tuple(kept))
    return tuple(out)


@functools.lru_cache(maxsize=8)
def _sentences(charset: str) -> Tuple[str, ...]:
    allowed = set(charset)
    return tuple(sorted({s for p in _paragraphs() for s in p if set(s) <= allowed}))


def sentences(charset: str = IAM_CHARSET) -> List[str]:
    """English prose sentences from the Python standard library's docstrings that use only ``charset``, sorted
    (the same list on any machine with the same Python)."""
    return list(_sentences(charset))


def _text_split(paragraph: Tuple[str, ...]) -> str:
    """A paragraph's split, fixed by a hash of its text (independent of the seed): the three splits read
    different text, as IAM's do, so a model cannot pass the test by remembering training sentences."""
    h = zlib.crc32(paragraph[0].encode("utf-8")) % 100
    return "train" if h < 80 else "val" if h < 87 else "test"


@functools.lru_cache(maxsize=8)
def _text_streams(charset: str) -> Dict[str, Tuple[str, ...]]:
    """Per split, its sentences in reading order (paragraphs one after another)."""
    allowed = set(charset)
    streams: Dict[str, List[str]] = {s: [] for s in SPLITS}
    for p in _paragraphs():
        streams[_text_split(p)].extend(s for s in p if set(s) <= allowed)
    if not all(streams.values()):
        raise RuntimeError("not enough prose sentences found in the standard library's docstrings")
    return {k: tuple(v) for k, v in streams.items()}


def _wrap(words: Sequence[str], widths: Sequence[int]) -> List[str]:
    """Greedy word wrap, line i at most ``widths[i]`` characters; a word longer than its line is broken."""
    lines: List[str] = []
    cur = ""
    words = list(words)
    i = 0
    while i < len(words) and len(lines) < len(widths):
        width = widths[len(lines)]
        w = words[i]
        if not cur:
            if len(w) > width:
                lines.append(w[:width])
                words[i] = w[width:]
                continue
            cur = w
        elif len(cur) + 1 + len(w) <= width:
            cur += " " + w
        else:
            lines.append(cur)
            cur = ""
            continue
        i += 1
    if cur and len(lines) < len(widths):
        lines.append(cur)
    return lines


def _page_text(rng: np.random.Generator, stream: Sequence[str], n_lines: int) -> List[str]:
    """``n_lines`` lines of a run of consecutive sentences wrapped to this page's line length."""
    width = int(rng.integers(22, 51))
    widths = [int(np.clip(width + rng.integers(-4, 5), 12, 60)) for _ in range(n_lines)]
    start = int(rng.integers(len(stream)))
    words: List[str] = []
    k = 0
    while True:
        words.extend(stream[(start + k) % len(stream)].split())
        k += 1
        lines = _wrap(words, widths)
        # the last line may be incomplete until more words follow
        if len(lines) == n_lines and sum(len(x) + 1 for x in lines) < sum(len(w) + 1 for w in words):
            return lines


# ----------------------------------------------------------------------------------------------------------------
# Rendering text lines
# ----------------------------------------------------------------------------------------------------------------


def _smooth_noise(rng: np.random.Generator, shape: Tuple[int, ...], sigma: Union[float, Sequence[float]]) -> np.ndarray:
    """Gaussian-filtered white noise, each field (along the first axis) scaled to unit standard deviation;
    ``sigma`` per axis (0 along the first: independent fields drawn in one call)."""
    from scipy import ndimage

    field = ndimage.gaussian_filter(rng.standard_normal(shape, dtype=np.float32), sigma, mode="reflect")
    std = field.reshape(shape[0], -1).std(axis=1).reshape((-1,) + (1,) * (len(shape) - 1))
    return field / np.maximum(std, 1e-6)


def _writer(rng: np.random.Generator, font_list: Sequence[Path], height: int) -> dict:
    """A page's hand: everything that stays (roughly) fixed from line to line."""
    return {
        "font": str(font_list[int(rng.integers(len(font_list)))]),
        "size": height * rng.uniform(0.85, 1.3),
        "slant": rng.uniform(-0.15, 0.35),
        "stretch": rng.uniform(0.85, 1.15),
        "space": rng.uniform(0.7, 1.6),
        "ink": rng.uniform(0, 80),
        "weight": int(rng.choice([-1, 0, 0, 1, 1, 2], p=[0.15, 0.3, 0.15, 0.15, 0.15, 0.1])),
        "elastic": rng.uniform(0.025, 0.06),
        "elastic_scale": rng.uniform(0.2, 0.4),
        "wobble": rng.uniform(0.01, 0.045),
        "keystone": rng.uniform() < 0.25,
        "paper": rng.uniform(242, 255),
        "shade": rng.uniform(0, 10),
        "noise": rng.uniform(1, 3) if rng.uniform() < 0.4 else 0.0,
        "ink_noise": rng.uniform(0, 15),
        "blur": rng.uniform() < 0.25,
        "grain": rng.standard_normal((4 * height, 8 * height), dtype=np.float32),
    }


def _draw_words(text: str, w: dict, rng: np.random.Generator) -> Tuple[np.ndarray, float]:
    """The line as ink coverage (uint8, 255 = ink), words placed with irregular gaps and small vertical offsets;
    returns the image and its baseline row."""
    from PIL import Image, ImageDraw

    size = max(8, int(round(w["size"] * rng.uniform(0.96, 1.04))))
    font = _truetype(w["font"], size)
    ascent, descent = font.getmetrics()
    space = font.getlength(" ") * w["space"]
    words = text.split(" ")
    xs, x, end = [], 0.0, 0.0
    for word in words:
        xs.append(x)
        end = x + font.getlength(word)
        x = end + space * rng.uniform(0.8, 1.25)
    pad = int(np.ceil(0.15 * size)) + 2
    canvas = Image.new("L", (int(np.ceil(end)) + 2 * pad, ascent + descent + 2 * pad), 0)
    draw = ImageDraw.Draw(canvas)
    for word, x0 in zip(words, xs):
        draw.text((pad + x0, pad + ascent + rng.normal(0, 0.015 * size)), word, fill=255, font=font, anchor="ls")
    return np.asarray(canvas), pad + ascent


def _warp(ink: np.ndarray, baseline: float, w: dict, rng: np.random.Generator) -> np.ndarray:
    """Slant (drifting along the line), stretch, tilt, baseline wobble, elastic warp and an occasional keystone,
    composed into one output→input coordinate map on a coarse grid of cells (bilinear inside a cell) and applied
    in one ``map_coordinates`` pass over the cells that can receive ink."""
    from PIL import Image
    from scipy import ndimage

    h, wd = ink.shape
    size = w["size"]
    slant = float(np.clip(w["slant"] + rng.normal(0, 0.04), -0.4, 0.45))
    stretch = w["stretch"] * rng.uniform(0.96, 1.04)
    tilt = rng.normal(0, 0.006)
    amp_e, amp_w = w["elastic"] * size, w["wobble"] * size
    # output canvas: generous room for all of it (empty cells cost nothing; the line is cropped to its ink later)
    margin = int(np.ceil(3 * amp_e + 2 * amp_w + 0.1 * size)) + 2
    out_w = int(np.ceil(1.15 * wd * stretch + abs(slant) * h)) + 2 * margin
    out_h = int(np.ceil(1.25 * h + abs(tilt) * out_w)) + 2 * margin
    cw, ch = int(max(8, round(size / 5))), int(max(8, round(size / 4)))  # cells of ~14 × 18 pixels
    nx, ny = out_w // cw + 2, out_h // ch + 2
    v, u = np.mgrid[0:ny, 0:nx].astype(np.float32)
    u, v = u * cw, v * ch
    cu, cv = out_w / 2, out_h / 2
    if w["keystone"] and rng.uniform() < 0.5:  # a mild projective warp: the text grows towards one end
        f = 1 + rng.uniform(-0.2, 0.2) / out_w * (u - cu)
        u, v = cu + (u - cu) / f, cv + (v - cv) / f
    s_e = w["elastic_scale"] * size
    du, dv = amp_e * _smooth_noise(rng, (2, ny, nx), (0, max(s_e / ch, 0.5), max(s_e / cw, 0.5)))
    s_w = rng.uniform(0.8, 2.5) * size / cw
    wobble, drift = _smooth_noise(rng, (2, nx), (0, max(s_w, 0.5)))
    y = (v - cv) + h / 2 - tilt * (u - cu) - amp_w * wobble + dv
    x = ((u - cu) + (slant + 0.06 * drift) * (y - baseline)) / stretch + wd / 2 + du
    # cells whose source footprint touches ink (4×4-block occupancy summed into an integral image)
    b = 4
    hb, wb = -(-h // b), -(-wd // b)

    def footprint(a: np.ndarray, n: int) -> Tuple[np.ndarray, np.ndarray]:
        quad = (a[:-1, :-1], a[:-1, 1:], a[1:, :-1], a[1:, 1:])
        lo = np.floor(np.minimum.reduce(quad)).astype(np.int64) // b
        hi = (np.floor(np.maximum.reduce(quad)).astype(np.int64) + 1) // b + 1  # bilinear reads one pixel on
        return lo.clip(0, n), hi.clip(0, n)

    (lo_x, hi_x), (lo_y, hi_y) = footprint(x, wb), footprint(y, hb)
    blocks = np.asarray(Image.fromarray(ink).reduce(b)) > 0  # (hb, wb) block means
    integral = np.zeros((hb + 1, wb + 1), dtype=np.int32)
    integral[1:, 1:] = blocks.cumsum(0, dtype=np.int32).cumsum(1, dtype=np.int32)
    count = integral[hi_y, hi_x] - integral[lo_y, hi_x] - integral[hi_y, lo_x] + integral[lo_y, lo_x]
    rows, cols = np.nonzero(count > 0)
    # per-pixel source coordinates inside those cells: bilinear in the four corners
    fx = (np.arange(cw, dtype=np.float32) / cw)[None, None, :]
    fy = (np.arange(ch, dtype=np.float32) / ch)[None, :, None]

    def inside(a: np.ndarray) -> np.ndarray:
        a00, a01 = a[rows, cols][:, None, None], a[rows, cols + 1][:, None, None]
        a10, a11 = a[rows + 1, cols][:, None, None], a[rows + 1, cols + 1][:, None, None]
        top, bottom = a00 + (a01 - a00) * fx, a10 + (a11 - a10) * fx
        return top + (bottom - top) * fy

    out = np.zeros((ny - 1, ch, nx - 1, cw), dtype=np.uint8)
    if rows.size:
        vals = ndimage.map_coordinates(ink, [inside(y).ravel(), inside(x).ravel()], order=1, prefilter=False,
                                       mode="constant", cval=0)
        out[rows, :, cols, :] = vals.reshape(rows.size, ch, cw)
    return out.reshape((ny - 1) * ch, (nx - 1) * cw)


def _crop(ink: np.ndarray, rng: np.random.Generator, size: float) -> np.ndarray:
    """The ink's bounding box plus a small random margin on each side."""
    rows = np.flatnonzero((ink > 64).any(1))
    cols = np.flatnonzero((ink > 64).any(0))
    if rows.size == 0:
        return ink
    m = [int(rng.integers(1, max(2, int(0.12 * size)))) for _ in range(4)]
    top, bottom, left, right = rows[0] - m[0], rows[-1] + 1 + m[1], cols[0] - m[2], cols[-1] + 1 + m[3]
    pad = ((max(0, -top), max(0, bottom - ink.shape[0])), (max(0, -left), max(0, right - ink.shape[1])))
    ink = np.pad(ink, pad)
    top, left = top + pad[0][0], left + pad[1][0]
    bottom, right = bottom + pad[0][0], right + pad[1][0]
    return ink[top:bottom, left:right]


def _upsample(field: np.ndarray, shape: Tuple[int, int], cell: int) -> np.ndarray:
    from PIL import Image

    big = Image.fromarray(field.astype(np.float32)).resize((field.shape[1] * cell, field.shape[0] * cell),
                                                                        Image.BILINEAR)
    return np.asarray(big)[:shape[0], :shape[1]]


def _ink_on_paper(ink: np.ndarray, w: dict, rng: np.random.Generator) -> np.ndarray:
    """Stroke weight, blur, uneven ink and paper: the final uint8 image (white paper, dark ink)."""
    from PIL import Image, ImageFilter
    from scipy import ndimage

    weight = w["weight"]
    if weight > 0:
        k = weight + 1 if rng.uniform() < 0.7 else weight
        if k > 1:
            ink = ndimage.grey_dilation(ink, size=(k, k))
    elif weight < 0 and w["size"] > 50:
        ink = ndimage.grey_erosion(ink, size=(2, 2))
    if w["blur"]:
        ink = np.asarray(Image.fromarray(ink).filter(ImageFilter.GaussianBlur(rng.uniform(0.4, 0.9))))
    h, wd = ink.shape
    alpha = ink.astype(np.float32) * np.float32(1 / 255)
    # slowly varying paper shading and ink pressure: coarse random fields, upsampled
    cell = 16
    shade, pressure = _smooth_noise(rng, (2, h // cell + 2, wd // cell + 2), (0, 1.5, 1.5))
    paper = _upsample(w["paper"] - w["shade"] * (1 + np.tanh(shade)) / 2, (h, wd), cell)
    ink_level = _upsample(w["ink"] + 12 * pressure, (h, wd), cell)
    image = paper - alpha * (paper - ink_level)
    if w["noise"] > 0 or w["ink_noise"] > 0:  # grain: the paper's where there is no ink, the ink's where there is
        sigma = np.float32(w["noise"]) + np.float32(w["ink_noise"] - w["noise"]) * alpha
        grain = w["grain"]  # the page's noise texture, read from a random offset (wrapping around)
        rows = (int(rng.integers(grain.shape[0])) + np.arange(h)) % grain.shape[0]
        cols = (int(rng.integers(grain.shape[1])) + np.arange(wd)) % grain.shape[1]
        image += sigma * grain[rows[:, None], cols[None, :]]
    image += 0.5
    return np.clip(image, 0, 255, out=image).astype(np.uint8)


def _render_line(text: str, w: dict, rng: np.random.Generator) -> np.ndarray:
    ink, baseline = _draw_words(text, w, rng)
    ink = _warp(ink, baseline, w, rng)
    ink = _crop(ink, rng, w["size"])
    return _ink_on_paper(ink, w, rng)


def render_synthetic_lines(root: Union[str, Path], counts: Optional[Dict[str, int]] = None, seed: int = 0,
                           height: int = 64, progress: bool = True) -> Path:
    """Write a dataset of synthetic handwriting-like text lines (HTR-VT layout) to ``root`` and return it.

    ``counts``: lines per split (default 12,000 / 600 / 1,000). Text comes from the standard library's docstrings,
    each split from its own paragraphs; lines are rendered about ``height``–``1.6·height`` pixels tall.
    """
    counts = _check_counts(counts, SYNTHETIC_COUNTS)
    font_list = fonts(IAM_CHARSET)
    if not font_list:
        raise RuntimeError("no font in matplotlib's data folder covers the charset")
    streams = _text_streams(IAM_CHARSET)

    def make_page(split: str, page: int, max_lines: int) -> List[Line]:
        rng = _page_rng(seed, page)
        n_lines = int(rng.integers(4, 17))
        w = _writer(rng, font_list, height)
        texts = _page_text(rng, streams[split], n_lines)[:max_lines]  # a page cut short keeps its first lines
        return [(_render_line(t, w, rng), t) for t in texts]

    return _write_dataset(root, counts, "syn", progress, "synthetic lines", make_page)


# ----------------------------------------------------------------------------------------------------------------
# Lines of real handwritten digits
# ----------------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _digits() -> Tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images.astype(np.float32) / 16.0, d.target.astype(np.int64)


def digit_pools(seed: int = 0) -> Dict[str, np.ndarray]:
    """Disjoint pools of scikit-learn digit indices for train / val / test (about 60 / 15 / 25 %, stratified by
    digit, seeded): a split's lines are drawn from its own pool only."""
    _, target = _digits()
    rng = np.random.default_rng([int(seed), 0x6469676974])
    pools: Dict[str, List[np.ndarray]] = {s: [] for s in SPLITS}
    for digit in range(10):
        idx = rng.permutation(np.flatnonzero(target == digit))
        n_val, n_test = int(round(0.15 * len(idx))), int(round(0.25 * len(idx)))
        pools["test"].append(idx[:n_test])
        pools["val"].append(idx[n_test:n_test + n_val])
        pools["train"].append(idx[n_test + n_val:])
    return {s: np.sort(np.concatenate(v)) for s, v in pools.items()}


def _digit_line(rng: np.random.Generator, w: dict, by_digit: List[np.ndarray], height: int) -> Line:
    from PIL import Image

    images, target = _digits()
    groups = [rng.integers(0, 10, size=int(rng.integers(2, 7))) for _ in range(int(rng.integers(1, 5)))]
    text = " ".join("".join(str(int(d)) for d in g) for g in groups)
    pieces = []  # (x, y, alpha)
    x = int(rng.integers(2, max(3, height // 6)))
    for gi, group in enumerate(groups):
        if gi:
            x += int(w["word_gap"] * rng.uniform(0.8, 1.25))
        for di, d in enumerate(group):
            src = images[int(rng.choice(by_digit[int(d)]))]
            dh = int(np.clip(round(w["digit"] * rng.uniform(0.9, 1.1)), 6, height - 2))
            dw = max(4, int(round(dh * w["aspect"] * rng.uniform(0.9, 1.1))))
            up = Image.fromarray(np.rint(src * 255).astype(np.uint8)).resize((dw, dh), Image.BICUBIC)
            alpha = np.asarray(up, dtype=np.float32) / 255
            alpha = np.clip((alpha - 0.12) / w["contrast"], 0, 1)  # firmer strokes than the blurred upsample
            cols = np.flatnonzero(alpha.max(0) > 0.05)
            if cols.size:
                alpha = alpha[:, cols[0]:cols[-1] + 1]
            if di:
                x += int(round(w["gap"] * dh * rng.uniform(0.5, 1.5)))
            slack = height - dh
            y = int(np.clip(round(slack / 2 + rng.normal(0, 0.06 * height)), 0, slack))
            pieces.append((x, y, alpha))
            x += alpha.shape[1]
    x += int(rng.integers(2, max(3, height // 6)))
    canvas = np.zeros((height, x), dtype=np.float32)
    for px, py, a in pieces:
        region = canvas[py:py + a.shape[0], px:px + a.shape[1]]
        np.maximum(region, a, out=region)
    paper = w["paper"]
    image = paper - canvas * (paper - w["ink"])
    if w["noise"] > 0:
        image = image + rng.normal(0, w["noise"], size=image.shape)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8), text


def render_digit_lines(root: Union[str, Path], counts: Optional[Dict[str, int]] = None, seed: int = 0,
                       height: int = 64, progress: bool = True) -> Path:
    """Write a dataset of lines of real handwritten digits (HTR-VT layout) to ``root`` and return it.

    ``counts``: lines per split (default 3,000 / 300 / 600). Each line is 1–4 groups of 2–6 digits composed from
    scikit-learn's 8×8 digits of the split's own pool (:func:`digit_pools`), ``height`` pixels tall.
    """
    counts = _check_counts(counts, DIGIT_COUNTS)
    pools = digit_pools(seed)
    _, target = _digits()
    by_split = {s: [p[target[p] == d] for d in range(10)] for s, p in pools.items()}

    def make_page(split: str, page: int, max_lines: int) -> List[Line]:
        rng = _page_rng(seed, page)
        n_lines = min(int(rng.integers(4, 13)), max_lines)
        digit = height * rng.uniform(0.6, 0.8)
        # a space must read as a space: word gaps are several times the gaps between digits
        w = {"digit": digit, "aspect": rng.uniform(0.75, 1.1), "gap": rng.uniform(0.0, 0.1),
             "word_gap": digit * rng.uniform(0.6, 0.9), "contrast": rng.uniform(0.5, 0.8),
             "ink": rng.uniform(0, 60), "paper": rng.uniform(240, 255),
             "noise": rng.choice([0.0, rng.uniform(1, 4)])}
        return [_digit_line(rng, w, by_split[split], height) for _ in range(n_lines)]

    return _write_dataset(root, counts, "dig", progress, "digit lines", make_page)


def default_data(name: str = "synthetic", seed: int = 0, counts: Optional[Dict[str, int]] = None,
                 progress: bool = True) -> Path:
    """The folder of an offline default (generated on first use into the cache, then reused): ``synthetic``
    lines rendered from fonts, or ``digits`` lines of real handwritten digits."""
    if name not in DEFAULTS:
        raise ValueError(f"unknown default dataset {name!r}; expected one of {', '.join(DEFAULTS)} or a folder")
    render = render_synthetic_lines if name == "synthetic" else render_digit_lines
    return cached_default("ocr", name, 1, render, seed=seed, progress=progress, counts=counts)


def resolve_data(data: Optional[str], seed: int = 0, progress: bool = True) -> Path:
    """``None`` or ``synthetic`` / ``digits`` → the offline default's folder; anything else is a dataset folder."""
    return resolve_folder(data, DEFAULTS, lambda name: default_data(name, seed=seed, progress=progress))
