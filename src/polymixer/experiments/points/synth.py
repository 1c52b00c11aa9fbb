"""An offline, seeded dataset of indoor rooms as scanned point clouds, written in exactly Pointcept's ScanNet layout
(so :func:`polymixer.experiments.points.data.load_scannet_scene` reads it) with the ScanNet-20 class ids.

What makes the task geometric rather than a colour lookup:

* **Rooms** — a box room of 3–8 m a side (bathrooms 2.6–4.5 m), 2.4–3 m high, sometimes L-shaped; a floor and
  walls (no ceiling). Doors and windows are labelled rectangles embedded in the walls: doors recessed a few cm with
  a frame and a handle, windows recessed 10–25 cm with a sill and reveals, their glass partly missing as in scans.
* **Furniture** — built from boxes, cylinders, discs, ellipsoids and wavy sheets at random sizes and poses: beds
  (base, mattress, blanket, headboard, pillows), chairs (four-legged or office), sofas, tables (rectangular or round)
  with chairs around them, desks with drawers and a chair, cabinets and wardrobes, bookshelves full of books,
  kitchen counters over base cabinets with a sink and wall cabinets, refrigerators, toilets, sinks, bathtubs with a
  shower curtain, curtains by the windows, pictures on the walls, nightstands / ottomans / stools
  (otherfurniture). Objects stand against walls (facing the room) or free at a random yaw without overlapping.
  Room types (bedroom, living room, office, kitchen, bathroom) decide which objects appear.
* **Clutter** — things outside the 20 classes (books, pillows, monitors, cups, bins, lamps, boxes, mirrors, plants)
  are labelled −1, like ScanNet's unmapped categories.
* **Scanning** — surfaces are sampled with a density proportional to their area (like the vertices of a scanned
  mesh), with their normals (pointing out of objects, into the room for walls, up for the floor); nothing is
  sampled under or behind what stands on the floor or against a wall, nor under objects on tables; a few random
  spherical holes; Gaussian noise of 5 mm on the coordinates.
* **Colours** — drawn per object part (not per class: two chairs have different colours, floors and walls change
  from room to room), shaded by the surface orientation and a room light, with per-point noise and textures on
  pictures, floors and fabrics.

Room k of the dataset draws its randomness from ``numpy.random.default_rng([seed, k])`` (k runs over train, then
val, then test) and its type cycles through the five room types. Files::

    <root>/meta.json
    <root>/{train,val,test}/scene<k:04d>_00/coord.npy (float32 N × 3), color.npy (uint8 N × 3),
                                            normal.npy (float32 N × 3), segment20.npy (int64 N, −1 ignore)

Unlike ScanNet, the test scenes are labelled too (the loader reads them either way).
"""

from __future__ import annotations

import colorsys
import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..data.cache import build_folder, cached_default, resolve_folder
from .data import IGNORE, SCANNET20_CLASSES

__all__ = ["VERSION", "ROOM_KINDS", "make_room", "write_synthetic_rooms", "default_data", "resolve_data",
           "DEFAULTS"]

VERSION = 1
ROOM_KINDS = ("bedroom", "living", "office", "kitchen", "bathroom")
DEFAULTS = ("rooms",)
_C = {name: i for i, name in enumerate(SCANNET20_CLASSES)}  # ScanNet-20 class ids
NOISE = 0.005  # sensor noise (m)


def _rz(yaw: float) -> np.ndarray:
    c, s = math.cos(yaw), math.sin(yaw)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


class _Pose:
    """A rigid placement: rotation about z then translation; local points map to R p + t."""

    def __init__(self, yaw: float = 0.0, x: float = 0.0, y: float = 0.0, z: float = 0.0) -> None:
        self.yaw = yaw
        self.R = _rz(yaw)
        self.t = np.array([x, y, z], float)

    def then(self, yaw: float = 0.0, x: float = 0.0, y: float = 0.0, z: float = 0.0) -> "_Pose":
        """The pose of something placed at (x, y, z, yaw) in this pose's frame."""
        p = _Pose(self.yaw + yaw)
        p.t = self.R @ np.array([x, y, z], float) + self.t
        return p

    def point(self, p: Sequence[float]) -> np.ndarray:
        return self.R @ np.asarray(p, float) + self.t

    def vec(self, v: Sequence[float]) -> np.ndarray:
        return self.R @ np.asarray(v, float)


def _random_color(rng: np.random.Generator, light: bool = False) -> np.ndarray:
    """A colour drawn over the whole range (some greys, some saturated), independent of what it paints."""
    h = rng.random()
    s = rng.uniform(0.0, 0.25) if rng.random() < 0.5 else rng.uniform(0.25, 0.85)
    v = rng.uniform(0.6, 0.97) if light else rng.uniform(0.15, 0.95)
    return np.array(colorsys.hsv_to_rgb(h, s, v)) * 255.0


def _rect_corners(cx: float, cy: float, hx: float, hy: float, yaw: float) -> np.ndarray:
    c, s = math.cos(yaw), math.sin(yaw)
    loc = np.array([[-hx, -hy], [hx, -hy], [hx, hy], [-hx, hy]])
    return loc @ np.array([[c, s], [-s, c]]) + np.array([cx, cy])


def _separated(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two convex quadrilaterals (4, 2) are disjoint (separating-axis test)."""
    for poly in (a, b):
        for k in range(4):
            e = poly[(k + 1) % 4] - poly[k]
            ax = np.array([-e[1], e[0]])
            pa, pb = a @ ax, b @ ax
            if pa.max() <= pb.min() or pb.max() <= pa.min():
                return True
    return False


class _Wall:
    def __init__(self, p0: np.ndarray, p1: np.ndarray, height: float, part: int) -> None:
        self.p0, self.p1 = p0, p1
        self.length = float(np.linalg.norm(p1 - p0))
        self.d = (p1 - p0) / self.length
        self.n = np.array([-self.d[1], self.d[0]])  # inward for a counter-clockwise outline
        self.height = height
        self.part = part
        self.reach = height  # the scan thins out above this height
        self.openings: List[Tuple[float, float, float, float, str]] = []  # s0, s1, z0, z1, kind
        self.items: List[Tuple[float, float, float, float]] = []  # s0, s1, z0, z1 of what hangs / stands there

    @property
    def yaw(self) -> float:
        """The yaw that turns an object's local +y (its front) to face into the room from this wall."""
        return math.atan2(-self.n[0], self.n[1])

    def free(self, s0: float, s1: float, z0: float, z1: float) -> bool:
        """Whether [s0, s1] × [z0, z1] on the wall is clear of openings (and their surroundings) and items."""
        if s0 < 0.03 or s1 > self.length - 0.03:
            return False
        for a, b, oz0, oz1, kind in self.openings:
            if s1 > a - 0.1 and s0 < b + 0.1 and (kind == "door" or (z1 > oz0 - 0.05 and z0 < oz1 + 0.1)):
                return False
        for a, b, iz0, iz1 in self.items:
            if s1 > a and s0 < b and z1 > iz0 and z0 < iz1:
                return False
        return True


class _Room:
    """Accumulates the surfaces of one room (in world coordinates), its object parts (label and colour each), what
    hides what, and the floor plan used to place furniture."""

    def __init__(self, rng: np.random.Generator, kind: str) -> None:
        self.rng = rng
        self.kind = kind
        # quads: origin, edge u, edge v, normal, part, wave (amplitude, cycles along u, phase)
        self.quads: List[Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, Tuple[float, float, float]]] = []
        self.cylinders: List[Tuple[float, float, float, float, float, int]] = []  # cx, cy, z0, z1, r, part
        self.discs: List[Tuple[float, float, float, float, float, int]] = []  # cx, cy, z, r, ±1 (normal z), part
        self.ellipsoids: List[Tuple[np.ndarray, np.ndarray, np.ndarray, int]] = []  # centre, R, radii, part
        self.part_label: List[int] = []
        self.part_color: List[np.ndarray] = []
        self.part_texture: List[float] = []
        self.occluders: List[Tuple[np.ndarray, np.ndarray, float, Optional[int]]] = []  # centre, half, yaw, target
        self.footprints: List[Tuple[np.ndarray, int]] = []  # corners (4, 2), group
        self.openings: List[Tuple[_Wall, float, float, float, float, int, float, float]] = []
        self.structure: List[int] = []  # floor and wall parts
        self.walls: List[_Wall] = []
        self.rects: List[Tuple[float, float, float, float]] = []  # the floor as axis-aligned rectangles
        self._group = 0

    # --- parts and surfaces -------------------------------------------------------------------------------------

    def part(self, label: int, color: Optional[np.ndarray] = None, texture: float = 0.0, light: bool = False) -> int:
        self.part_label.append(label)
        self.part_color.append(_random_color(self.rng, light) if color is None else np.asarray(color, float))
        self.part_texture.append(texture)
        return len(self.part_label) - 1

    def group(self) -> int:
        self._group += 1
        return self._group

    def quad(self, pose: _Pose, o: Sequence[float], u: Sequence[float], v: Sequence[float], out: Sequence[float],
             part: int, wave: Tuple[float, float, float] = (0.0, 0.0, 0.0)) -> None:
        """A parallelogram o + s u + t v (local coordinates), normal on the side of ``out``."""
        o, u, v = pose.point(o), pose.vec(u), pose.vec(v)
        n = np.cross(u, v)
        a = np.linalg.norm(n)
        if a < 1e-9:
            return
        n = n / a
        if n @ pose.vec(out) < 0:
            n = -n
        self.quads.append((o, u, v, n, part, wave))

    def box(self, pose: _Pose, x: float, y: float, z0: float, sx: float, sy: float, sz: float, part: int,
            skip: Sequence[str] = ()) -> None:
        """An axis-aligned box (in the pose's frame) centred on (x, y) from height z0; faces named ±x, ±y, ±z can be
        skipped (the bottom of a box on the floor always is)."""
        h = np.array([sx, sy, sz]) / 2
        c = np.array([x, y, z0 + h[2]])
        on_floor = pose.t[2] + z0 < 0.005
        for axis in range(3):
            for sign, name in ((1, "+"), (-1, "-")):
                fname = name + "xyz"[axis]
                if fname in skip or (fname == "-z" and on_floor):
                    continue
                b, d = (axis + 1) % 3, (axis + 2) % 3
                e = np.eye(3)
                u, v = 2 * h[b] * e[b], 2 * h[d] * e[d]
                o = c + sign * h[axis] * e[axis] - u / 2 - v / 2
                self.quad(pose, o, u, v, sign * e[axis], part)

    def open_box(self, pose: _Pose, x: float, y: float, z0: float, sx: float, sy: float, sz: float, wall: float,
                 part: int, outer: bool = True, skip: Sequence[str] = ()) -> None:
        """A basin / tub: outer sides (unless ``outer`` is False), a rim, inner sides facing in and an inner floor."""
        if outer:
            self.box(pose, x, y, z0, sx, sy, sz, part, skip=tuple(skip) + ("+z",))
        ix, iy, top = sx / 2 - wall, sy / 2 - wall, z0 + sz
        bottom = z0 + min(wall, sz / 2)
        depth = top - bottom
        # rim: four strips
        for (ox, oy, ux, vy) in ((-sx / 2, -sy / 2, sx, wall), (-sx / 2, sy / 2 - wall, sx, wall),
                                 (-sx / 2, -iy, wall, 2 * iy), (sx / 2 - wall, -iy, wall, 2 * iy)):
            self.quad(pose, (x + ox, y + oy, top), (ux, 0, 0), (0, vy, 0), (0, 0, 1), part)
        self.quad(pose, (x - ix, y - iy, bottom), (2 * ix, 0, 0), (0, 2 * iy, 0), (0, 0, 1), part)
        self.quad(pose, (x - ix, y - iy, bottom), (2 * ix, 0, 0), (0, 0, depth), (0, 1, 0), part)
        self.quad(pose, (x - ix, y + iy, bottom), (2 * ix, 0, 0), (0, 0, depth), (0, -1, 0), part)
        self.quad(pose, (x - ix, y - iy, bottom), (0, 2 * iy, 0), (0, 0, depth), (1, 0, 0), part)
        self.quad(pose, (x + ix, y - iy, bottom), (0, 2 * iy, 0), (0, 0, depth), (-1, 0, 0), part)

    def cylinder(self, pose: _Pose, x: float, y: float, z0: float, z1: float, r: float, part: int, top: bool = True,
                 bottom: bool = False) -> None:
        """A vertical cylinder with its top (and bottom) disc."""
        c = pose.point((x, y, z0))
        self.cylinders.append((c[0], c[1], c[2], c[2] + z1 - z0, r, part))
        if top:
            self.discs.append((c[0], c[1], c[2] + z1 - z0, r, 1.0, part))
        if bottom and c[2] > 0.005:
            self.discs.append((c[0], c[1], c[2], r, -1.0, part))

    def disc(self, pose: _Pose, x: float, y: float, z: float, r: float, part: int, up: bool = True) -> None:
        c = pose.point((x, y, z))
        self.discs.append((c[0], c[1], c[2], r, 1.0 if up else -1.0, part))

    def ellipsoid(self, pose: _Pose, c: Sequence[float], radii: Sequence[float], part: int) -> None:
        self.ellipsoids.append((pose.point(c), pose.R.copy(), np.asarray(radii, float), part))

    def occlude(self, pose: _Pose, x: float, y: float, z0: float, sx: float, sy: float, sz: float,
                target: Optional[int] = None, pad: float = 0.03) -> None:
        """Remove the points of ``target`` (a part; None → floor and walls) inside this box, grown by ``pad``."""
        c = pose.point((x, y, z0 + sz / 2))
        self.occluders.append((c, np.array([sx / 2 + pad, sy / 2 + pad, sz / 2 + pad]), pose.yaw, target))

    # --- floor plan ---------------------------------------------------------------------------------------------

    def inside(self, pts: np.ndarray, margin: float = 0.0) -> bool:
        ok = np.zeros(len(pts), bool)
        for x0, y0, x1, y1 in self.rects:
            ok |= (pts[:, 0] >= x0 + margin - 1e-6) & (pts[:, 0] <= x1 - margin + 1e-6) \
                & (pts[:, 1] >= y0 + margin - 1e-6) & (pts[:, 1] <= y1 - margin + 1e-6)
        return bool(ok.all())

    def fits(self, corners: np.ndarray, ignore: Sequence[int] = (), margin: float = 0.05) -> bool:
        """Whether a footprint lies in the room and clear (by ``margin``) of the footprints not in ``ignore``."""
        probe = np.concatenate([corners, (corners + np.roll(corners, -1, 0)) / 2, corners.mean(0, keepdims=True)])
        if not self.inside(probe):
            return False
        c = corners.mean(0)
        grown = c + (corners - c) * (1 + margin / max(np.linalg.norm(corners - c, axis=1).min(), 1e-3))
        return all(g in ignore or _separated(grown, fp) for fp, g in self.footprints)

    def register(self, pose: _Pose, hx: float, hy: float, group: int, x: float = 0.0, y: float = 0.0) -> None:
        c = pose.point((x, y, 0))
        self.footprints.append((_rect_corners(c[0], c[1], hx, hy, pose.yaw), group))

    def on_wall(self, width: float, depth: float, height: float, z0: float = 0.0, gap: float = 0.02,
                wall: Optional[_Wall] = None, s: Optional[float] = None, tries: int = 40,
                ignore: Sequence[int] = ()) -> Optional[Tuple[_Pose, _Wall, float]]:
        """A pose against a wall (back to the wall, local +y into the room, origin at the footprint centre on the
        floor), clear of openings, other wall items and footprints; None if nothing fits."""
        walls = [wall] if wall is not None else self.walls
        lengths = np.array([w.length for w in walls])
        for _ in range(tries):
            w = walls[int(self.rng.choice(len(walls), p=lengths / lengths.sum()))]
            if w.length < width + 0.1:
                continue
            sc = s if s is not None else self.rng.uniform(width / 2 + 0.05, w.length - width / 2 - 0.05)
            if not w.free(sc - width / 2, sc + width / 2, z0, z0 + height):
                if s is not None:
                    return None
                continue
            c = w.p0 + w.d * sc + w.n * (gap + depth / 2)
            pose = _Pose(w.yaw, c[0], c[1], 0.0)
            corners = _rect_corners(c[0], c[1], width / 2, depth / 2, w.yaw)
            if z0 > 0.3:  # hung on the wall: only the wall interval matters
                w.items.append((sc - width / 2, sc + width / 2, z0, z0 + height))
                return pose, w, sc
            if self.fits(corners, ignore=ignore):
                w.items.append((sc - width / 2, sc + width / 2, z0, z0 + height))
                return pose, w, sc
            if s is not None:
                return None
        return None

    def free_spot(self, hx: float, hy: float, margin: float = 0.1, yaw: Optional[float] = None, tries: int = 40,
                  ignore: Sequence[int] = ()) -> Optional[_Pose]:
        """A pose anywhere on the floor at a random yaw, clear of walls (by ``margin``) and other footprints."""
        areas = np.array([(x1 - x0) * (y1 - y0) for x0, y0, x1, y1 in self.rects])
        for _ in range(tries):
            x0, y0, x1, y1 = self.rects[int(self.rng.choice(len(self.rects), p=areas / areas.sum()))]
            cx, cy = self.rng.uniform(x0, x1), self.rng.uniform(y0, y1)
            a = self.rng.uniform(-math.pi, math.pi) if yaw is None else yaw
            corners = _rect_corners(cx, cy, hx + margin, hy + margin, a)
            if self.fits(corners, ignore=ignore, margin=0.0):
                return _Pose(a, cx, cy, 0.0)
        return None

    # --- sampling -----------------------------------------------------------------------------------------------

    def _areas(self) -> np.ndarray:
        # a wavy sheet d = A sin(k x) is longer than its flat outline by ≈ 1 + (A k)² / 4
        qa = [np.linalg.norm(np.cross(u, v)) * (1 + (w[0] * 2 * math.pi * w[1] / max(np.linalg.norm(u), 1e-6)) ** 2 / 4)
              for _, u, v, _, _, w in self.quads]
        ca = [2 * math.pi * r * (z1 - z0) for _, _, z0, z1, r, _ in self.cylinders]
        da = [math.pi * r * r for _, _, _, r, _, _ in self.discs]
        p = 1.6075
        ea = [4 * math.pi * ((a ** p * b ** p + a ** p * c ** p + b ** p * c ** p) / 3) ** (1 / p)
              for _, _, (a, b, c), _ in self.ellipsoids]
        return np.array(qa + ca + da + ea, float)

    def sample(self, n: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``n`` points spread over all surfaces in proportion to their areas: (points, normals, parts)."""
        rng = self.rng
        areas = self._areas()
        counts = rng.multinomial(n, areas / areas.sum())
        nq, nc, nd = len(self.quads), len(self.cylinders), len(self.discs)
        cq, cc, cd, ce = counts[:nq], counts[nq:nq + nc], counts[nq + nc:nq + nc + nd], counts[nq + nc + nd:]
        pts, nrm, part = [], [], []
        if nq:
            Q0, U, V, N = (np.array([q[k] for q in self.quads]) for k in range(4))
            P = np.array([q[4] for q in self.quads])
            W = np.array([q[5] for q in self.quads])
            idx = np.repeat(np.arange(nq), cq)
            s, t = rng.random(idx.size), rng.random(idx.size)
            p = Q0[idx] + s[:, None] * U[idx] + t[:, None] * V[idx]
            nn = N[idx]
            amp, cyc, ph = W[idx, 0], W[idx, 1], W[idx, 2]
            if (amp > 0).any():  # a wavy sheet (curtains): displaced along its normal, the normal tilted to match
                ang = 2 * math.pi * cyc * s + ph
                p = p + (amp * np.sin(ang))[:, None] * nn
                ulen = np.linalg.norm(U[idx], axis=1)
                slope = amp * 2 * math.pi * cyc * np.cos(ang) / np.maximum(ulen, 1e-6)
                nn = nn - slope[:, None] * U[idx] / np.maximum(ulen, 1e-6)[:, None]
                nn = nn / np.linalg.norm(nn, axis=1, keepdims=True)
            pts.append(p)
            nrm.append(nn)
            part.append(P[idx])
        if nc:
            C = np.array(self.cylinders)
            idx = np.repeat(np.arange(nc), cc)
            th = rng.uniform(0, 2 * math.pi, idx.size)
            h = rng.random(idx.size)
            d = np.stack([np.cos(th), np.sin(th), np.zeros_like(th)], 1)
            p = np.stack([C[idx, 0], C[idx, 1], C[idx, 2] + h * (C[idx, 3] - C[idx, 2])], 1) + C[idx, 4, None] * d
            pts.append(p)
            nrm.append(d)
            part.append(C[idx, 5].astype(int))
        if nd:
            D = np.array(self.discs)
            idx = np.repeat(np.arange(nd), cd)
            th = rng.uniform(0, 2 * math.pi, idx.size)
            r = D[idx, 3] * np.sqrt(rng.random(idx.size))
            p = np.stack([D[idx, 0] + r * np.cos(th), D[idx, 1] + r * np.sin(th), D[idx, 2]], 1)
            nn = np.zeros_like(p)
            nn[:, 2] = D[idx, 4]
            pts.append(p)
            nrm.append(nn)
            part.append(D[idx, 5].astype(int))
        for k, (c, R, radii, pid) in enumerate(self.ellipsoids):
            m = int(ce[k])
            if not m:
                continue
            d = rng.standard_normal((m, 3))
            d /= np.linalg.norm(d, axis=1, keepdims=True)
            nn = d / radii
            nn /= np.linalg.norm(nn, axis=1, keepdims=True)
            pts.append(c + (d * radii) @ R.T)
            nrm.append(nn @ R.T)
            part.append(np.full(m, pid))
        return np.concatenate(pts), np.concatenate(nrm), np.concatenate(part).astype(np.int64)

    def carve(self, pts: np.ndarray, nrm: np.ndarray, part: np.ndarray, holes: Sequence[Tuple[np.ndarray, float]]
              ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Turn wall points inside openings into door / window points (recessed, glass thinned), then drop what is
        hidden (occluders) and what the scan missed (holes)."""
        keep = np.ones(len(pts), bool)
        for w, s0, s1, z0, z1, pid, recess, density in self.openings:
            on = (part == w.part) & (np.abs((pts[:, :2] - w.p0) @ w.n) < 1e-6)  # the wall plane, not its reveals
            s = (pts[:, :2] - w.p0) @ w.d
            m = on & (s >= s0) & (s <= s1) & (pts[:, 2] >= z0) & (pts[:, 2] <= z1)
            part[m] = pid
            pts[m, :2] -= recess * w.n
            if density < 1:
                keep &= ~(m & (self.rng.random(len(pts)) > density))
        for w in self.walls:  # the upper walls are often missed by the scanner
            if w.reach < w.height:
                keep &= ~((part == w.part) & (pts[:, 2] > w.reach) & (self.rng.random(len(pts)) < 0.85))
        structure = np.isin(part, self.structure)
        for c, half, yaw, target in self.occluders:
            sel = structure if target is None else part == target
            sel = sel & keep
            if not sel.any():
                continue
            loc = (pts[sel] - c) @ _rz(yaw)  # world → box frame (R^T p as a row vector)
            inside = (np.abs(loc) <= half).all(1)
            idx = np.flatnonzero(sel)[inside]
            keep[idx] = False
        for c, r in holes:
            keep &= np.square(pts - c).sum(1) > r * r
        return pts[keep], nrm[keep], part[keep]

    def colors(self, pts: np.ndarray, nrm: np.ndarray, part: np.ndarray) -> np.ndarray:
        """Per-part colour × shading (orientation, a room light) + textures + per-point noise, as uint8."""
        rng = self.rng
        base = np.array(self.part_color)[part]
        shade = 0.8 + 0.2 * nrm[:, 2]
        light = np.array([*rng.uniform(np.min(self.rects, 0)[:2], np.max(self.rects, 0)[2:]), 2.6])
        shade = shade * (1.08 - 0.05 * np.minimum(np.linalg.norm(pts - light, axis=1), 6.0))
        col = base * shade[:, None]
        tex = np.array(self.part_texture)
        if (tex > 0).any():
            P = len(self.part_label)
            freq = rng.uniform(4, 25, (P, 3, 3)) * rng.choice([-1, 1], (P, 3, 3))
            phase = rng.uniform(0, 2 * math.pi, (P, 3))
            wave = np.sin(np.einsum("nd,ncd->nc", pts, freq[part]) + phase[part])
            col = col + tex[part, None] * wave
        col = col + rng.normal(0, 4.0, col.shape) + rng.normal(0, 3.0, (len(col), 1))
        return np.clip(np.rint(col), 0, 255).astype(np.uint8)


# ----------------------------------------------------------------------------------------------------------------
# Structure
# ----------------------------------------------------------------------------------------------------------------


def _shell(R: _Room) -> float:
    """Floor, walls, doors and windows; returns the wall height."""
    rng = R.rng
    lo, hi = (2.6, 4.5) if R.kind == "bathroom" else (3.0, 8.0)
    W, D = rng.uniform(lo, hi, 2)
    H = rng.uniform(2.4, 3.0)
    if R.kind != "bathroom" and min(W, D) > 4.0 and rng.random() < 0.3:  # an L: one corner cut away
        a, b = rng.uniform(1.2, 0.45 * W), rng.uniform(1.2, 0.45 * D)
        outline = [(0, 0), (W, 0), (W, D - b), (W - a, D - b), (W - a, D), (0, D)]
        R.rects = [(0, 0, W, D - b), (0, D - b, W - a, D)]
    else:
        outline = [(0, 0), (W, 0), (W, D), (0, D)]
        R.rects = [(0, 0, W, D)]
    floor = R.part(_C["floor"], texture=rng.uniform(0, 15))
    R.structure.append(floor)
    ident = _Pose()
    for x0, y0, x1, y1 in R.rects:
        R.quad(ident, (x0, y0, 0), (x1 - x0, 0, 0), (0, y1 - y0, 0), (0, 0, 1), floor)
    wall_color = _random_color(rng, light=True)
    for k in range(len(outline)):
        p0, p1 = np.array(outline[k], float), np.array(outline[(k + 1) % len(outline)], float)
        color = _random_color(rng) if rng.random() < 0.15 else wall_color  # now and then an accent wall
        pid = R.part(_C["wall"], color, texture=rng.uniform(0, 4))
        R.structure.append(pid)
        w = _Wall(p0, p1, H, pid)
        w.reach = H if rng.random() < 0.3 else rng.uniform(1.8, H)
        R.walls.append(w)
        R.quad(ident, (*p0, 0), (*(p1 - p0), 0), (0, 0, H), (*w.n, 0), pid)

    # doors: a recessed leaf in a frame, with a handle; the floor in front stays free
    n_doors = 1 + int(rng.random() < (0.1 if R.kind == "bathroom" else 0.3))
    for _ in range(n_doors):
        _door(R, H)
    # windows: recessed, glass thinned, a sill and reveals; sometimes curtains
    n_win = int(rng.integers(0, 2)) if R.kind == "bathroom" else int(rng.integers(1, 4))
    for _ in range(n_win):
        _window(R, H)
    return H


def _door(R: _Room, H: float) -> None:
    """One door in a wall of the room (walls of height ``H``): a recessed leaf in a frame, with a handle, the floor
    in front kept free; up to 20 tries at a wall and a place where it fits, else none."""
    rng = R.rng
    for _ in range(20):
        w = R.walls[int(rng.integers(len(R.walls)))]
        width, height = rng.uniform(0.75, 1.0), min(rng.uniform(1.98, 2.15), H - 0.15)
        if w.length < width + 0.5:
            continue
        s0 = rng.uniform(0.15, w.length - width - 0.15)
        if not w.free(s0, s0 + width, 0, height):
            continue
        leaf, frame = R.part(_C["door"]), R.part(_C["door"])
        recess = rng.uniform(0.02, 0.06)
        R.openings.append((w, s0, s0 + width, 0.0, height, leaf, recess, 1.0))
        w.openings.append((s0, s0 + width, 0.0, height, "door"))
        pose = _Pose(w.yaw, *(w.p0 + w.d * (s0 + width / 2)), 0.0)
        t, dz = rng.uniform(0.04, 0.08), rng.uniform(0.01, 0.025)
        R.box(pose, -width / 2 - t / 2, dz / 2, 0, t, dz, height + t, frame, skip=("-y",))
        R.box(pose, width / 2 + t / 2, dz / 2, 0, t, dz, height + t, frame, skip=("-y",))
        R.box(pose, 0, dz / 2, height, width, dz, t, frame, skip=("-y",))
        hx = (width / 2 - 0.08) * rng.choice([-1, 1])
        R.box(pose, hx, -recess + 0.03, rng.uniform(0.95, 1.1), 0.12, 0.06, 0.025, R.part(_C["door"]),
              skip=("-y",))
        R.register(pose, width / 2 + 0.1, 0.45, group=-1, y=0.45)
        return


def _window(R: _Room, H: float) -> None:
    """One window in a wall of the room (walls of height ``H``): recessed, its glass thinned, a sill, reveals and a
    transom bar, sometimes curtains; up to 20 tries at a wall and a place where it fits, else none."""
    rng = R.rng
    for _ in range(20):
        w = R.walls[int(rng.integers(len(R.walls)))]
        width = rng.uniform(0.6, min(2.2, w.length - 0.5)) if w.length > 1.2 else 0.0
        z0 = rng.uniform(0.75, 1.1)
        z1 = min(z0 + rng.uniform(0.9, 1.5), H - 0.15)
        if width < 0.6 or z1 - z0 < 0.5:
            continue
        s0 = rng.uniform(0.2, w.length - width - 0.2)
        if not w.free(s0, s0 + width, 0.0, H):
            continue
        glass = R.part(_C["window"], light=True)
        frame = R.part(_C["window"])
        recess = rng.uniform(0.1, 0.25)
        R.openings.append((w, s0, s0 + width, z0, z1, glass, recess, rng.uniform(0.35, 0.8)))
        w.openings.append((s0, s0 + width, z0, z1, "window"))
        pose = _Pose(w.yaw, *(w.p0 + w.d * (s0 + width / 2)), 0.0)
        # reveals (wall) at the sides and top, the sill (window) at the bottom
        R.quad(pose, (-width / 2, -recess, z0), (0, recess, 0), (0, 0, z1 - z0), (1, 0, 0), w.part)
        R.quad(pose, (width / 2, -recess, z0), (0, recess, 0), (0, 0, z1 - z0), (-1, 0, 0), w.part)
        R.quad(pose, (-width / 2, -recess, z1), (width, 0, 0), (0, recess, 0), (0, 0, -1), w.part)
        sill = rng.uniform(0.03, 0.12)
        R.box(pose, 0, (sill - recess) / 2, z0 - 0.03, width + 0.1, recess + sill, 0.03, frame, skip=("-y",))
        R.box(pose, 0, -recess + 0.02, (z0 + z1) / 2 - 0.02, width, 0.04, 0.04, frame)  # a transom bar
        if R.kind in ("bedroom", "living", "office") and rng.random() < 0.55:
            _curtains(R, w, s0, width, z0, z1, H)
        return


def _curtains(R: _Room, w: _Wall, s0: float, width: float, z0: float, z1: float, H: float) -> None:
    """One or two wavy curtain panels hanging in front of a window; what they hide is not scanned."""
    rng = R.rng
    top = min(z1 + rng.uniform(0.05, 0.25), H - 0.03)
    bottom = rng.uniform(0.02, 0.15) if rng.random() < 0.7 else max(z0 - 0.15, 0.3)
    off = rng.uniform(0.08, 0.16)
    color = _random_color(rng)
    texture = rng.uniform(0, 25)
    sides = [-1, 1] if rng.random() < 0.7 else [int(rng.choice([-1, 1]))]
    pose = _Pose(w.yaw, *(w.p0 + w.d * (s0 + width / 2)), 0.0)
    for side in sides:
        pw = rng.uniform(0.3, 0.6) * width + 0.15
        x0 = side * (width / 2 + 0.15) - (pw if side > 0 else 0)  # panel spans [x0, x0 + pw]
        part = R.part(_C["curtain"], color + rng.normal(0, 5, 3), texture)
        amp, cycles = rng.uniform(0.02, 0.05), pw / rng.uniform(0.12, 0.2)
        R.quad(pose, (x0, off, bottom), (pw, 0, 0), (0, 0, top - bottom), (0, 1, 0), part,
               wave=(amp, cycles, rng.uniform(0, 2 * math.pi)))
        hidden = [None] + [op[5] for op in R.openings if op[0] is w]  # the wall and this wall's windows
        for target in hidden:
            R.occlude(pose, x0 + pw / 2, off / 2 - 0.2, bottom, pw, off + 0.4, top - bottom, target=target, pad=0.0)
        if bottom < 0.3:
            R.register(pose, pw / 2, 0.08, group=-1, x=x0 + pw / 2, y=off)


# ----------------------------------------------------------------------------------------------------------------
# Furniture (local frame: origin at the footprint centre on the floor, +y the front)
# ----------------------------------------------------------------------------------------------------------------


def _clutter_item(R: _Room, pose: _Pose, x: float, y: float, z: float, support: Optional[int],
                  scale: float = 1.0) -> None:
    """One small unlabelled thing (a box, a cup / bottle / bin, a blob) standing at (x, y, z)."""
    rng = R.rng
    part = R.part(IGNORE, texture=rng.uniform(0, 30) if rng.random() < 0.3 else 0.0)
    kind = rng.random()
    if kind < 0.45:
        sx, sy, sz = rng.uniform(0.05, 0.35, 3) * scale
        sub = pose.then(rng.uniform(-math.pi, math.pi), x, y, z)
        R.box(sub, 0, 0, 0, sx, sy, sz, part)
        if support is not None:
            R.occlude(sub, 0, 0, -0.02, sx, sy, 0.04, target=support, pad=0.0)
    elif kind < 0.8:
        r, h = rng.uniform(0.03, 0.12) * scale, rng.uniform(0.06, 0.35) * scale
        R.cylinder(pose, x, y, z, z + h, r, part)
        if support is not None:
            R.occlude(pose, x, y, z - 0.02, 1.4 * r, 1.4 * r, 0.04, target=support, pad=0.0)
    else:
        rad = rng.uniform(0.04, 0.15, 3) * scale
        R.ellipsoid(pose.then(rng.uniform(-math.pi, math.pi)), (x, y, z + rad[2] * 0.8), rad, part)


def _scatter_on(R: _Room, pose: _Pose, top: float, hx: float, hy: float, n: int, support: int) -> None:
    for _ in range(n):
        _clutter_item(R, pose, R.rng.uniform(-0.8, 0.8) * hx, R.rng.uniform(-0.8, 0.8) * hy, top, support, 0.7)


def _legs(R: _Room, pose: _Pose, hx: float, hy: float, inset: float, t: float, height: float, part: int) -> None:
    for sx in (-1, 1):
        for sy in (-1, 1):
            R.box(pose, sx * (hx - inset - t / 2), sy * (hy - inset - t / 2), 0, t, t, height, part)


def _chair(R: _Room, pose: _Pose) -> None:
    """A four-legged chair or an office chair (seat, back, legs; optional arms); its back towards local −y."""
    rng = R.rng
    seat, frame = R.part(_C["chair"]), R.part(_C["chair"]) if rng.random() < 0.6 else None
    frame = seat if frame is None else frame
    w, d = rng.uniform(0.4, 0.52), rng.uniform(0.4, 0.5)
    h, t = rng.uniform(0.42, 0.5), rng.uniform(0.03, 0.07)
    back_top = h + rng.uniform(0.3, 0.5)
    if rng.random() < 0.65:
        lt = rng.uniform(0.025, 0.045)
        _legs(R, pose, w / 2, d / 2, 0.01, lt, h - t, frame)
    else:  # a column on a five-spoke base
        R.cylinder(pose, 0, 0, 0.08, h - t, rng.uniform(0.02, 0.035), frame, top=False)
        for k in range(5):
            spoke = pose.then(2 * math.pi * k / 5 + rng.uniform(0, 0.2))
            R.box(spoke, 0, 0.15, 0.04, 0.04, 0.3, 0.04, frame)
            R.ellipsoid(spoke, (0, 0.29, 0.025), (0.025, 0.025, 0.025), frame)
    R.box(pose, 0, 0, h - t, w, d, t, seat)
    bt = rng.uniform(0.02, 0.06)
    if rng.random() < 0.75:
        R.box(pose, 0, -d / 2 + bt / 2, h, w, bt, back_top - h, seat)
    else:  # two posts and a rail
        for sx in (-1, 1):
            R.box(pose, sx * (w / 2 - 0.02), -d / 2 + bt / 2, h, 0.04, bt, back_top - h, frame)
        R.box(pose, 0, -d / 2 + bt / 2, back_top - 0.12, w, bt, 0.12, seat)
    if rng.random() < 0.25:
        for sx in (-1, 1):
            R.box(pose, sx * (w / 2 - 0.02), 0, h + 0.18, 0.05, d * 0.8, 0.04, frame)
            R.box(pose, sx * (w / 2 - 0.02), d * 0.3, h, 0.03, 0.03, 0.18, frame)


def _table(R: _Room, kind: str = "dining", chairs: bool = True) -> bool:
    """A free-standing table (rectangular on legs or round on a pedestal) with chairs around it and things on it."""
    rng = R.rng
    round_top = kind != "coffee" and rng.random() < 0.25
    if kind == "coffee":
        w, d, h = rng.uniform(0.8, 1.3), rng.uniform(0.45, 0.7), rng.uniform(0.35, 0.48)
    elif kind == "meeting":
        w, d, h = rng.uniform(1.6, 2.6), rng.uniform(0.8, 1.2), rng.uniform(0.72, 0.77)
    else:
        w, d, h = rng.uniform(0.9, 1.8), rng.uniform(0.7, 1.0), rng.uniform(0.72, 0.78)
    if round_top:
        w = d = 2 * rng.uniform(0.4, 0.6)
    pose = None
    for reach in ((0.55, 0.2) if chairs else (0.0,)):  # room for chairs around it if possible
        pose = R.free_spot(w / 2 + reach, d / 2 + reach, margin=0.05)
        if pose is not None:
            break
    if pose is None:
        return False
    g = R.group()
    top, legs = R.part(_C["table"], texture=rng.uniform(0, 10)), R.part(_C["table"])
    legs = top if rng.random() < 0.5 else legs
    t = rng.uniform(0.025, 0.05)
    if round_top:
        r = w / 2
        R.cylinder(pose, 0, 0, h - t, h, r, top, bottom=True)
        R.cylinder(pose, 0, 0, 0.03, h - t, rng.uniform(0.04, 0.08), legs, top=False)
        R.cylinder(pose, 0, 0, 0, 0.03, rng.uniform(0.2, 0.3), legs)
    else:
        R.box(pose, 0, 0, h - t, w, d, t, top)
        _legs(R, pose, w / 2, d / 2, rng.uniform(0.02, 0.1), rng.uniform(0.04, 0.08), h - t, legs)
    R.register(pose, w / 2, d / 2, g)
    _scatter_on(R, pose, h, w / 2, d / 2, int(rng.integers(0, 4)), top)
    if not chairs:
        return True
    seats: List[Tuple[float, float, float]] = []  # x, y, yaw in the table frame (chairs face the table)
    if round_top:
        k = int(rng.integers(2, 5))
        a0 = rng.uniform(0, 2 * math.pi)
        for j in range(k):
            a = a0 + 2 * math.pi * j / k
            seats.append((math.cos(a) * (w / 2 + 0.15), math.sin(a) * (w / 2 + 0.15), a + math.pi / 2))
    else:
        per_side = max(1, int(w / 0.62))
        for sgn in (-1, 1):
            for j in range(per_side):
                if rng.random() < 0.75:
                    x = (j + 0.5) * w / per_side - w / 2
                    seats.append((x, sgn * (d / 2 + 0.1), 0.0 if sgn < 0 else math.pi))
            if w > 1.3 and rng.random() < 0.3:
                seats.append((sgn * (w / 2 + 0.1), 0.0, sgn * math.pi / 2))
    for x, y, a in seats:
        out = rng.uniform(0.0, 0.3)
        dx, dy = (x / max(math.hypot(x, y), 1e-6)) * out, (y / max(math.hypot(x, y), 1e-6)) * out
        cp = pose.then(a + rng.uniform(-0.3, 0.3), x + dx, y + dy, 0)
        corners = _rect_corners(cp.t[0], cp.t[1], 0.27, 0.27, cp.yaw)
        if R.fits(corners, ignore=(g,), margin=0.02):
            _chair(R, cp)
            R.footprints.append((corners, g))
    return True


def _desk(R: _Room, free: bool = False) -> bool:
    """A desk against a wall (or free-standing): top, a drawer pedestal or panels, things on it, usually a chair in
    front."""
    rng = R.rng
    w, d, h = rng.uniform(1.0, 1.8), rng.uniform(0.55, 0.8), rng.uniform(0.72, 0.77)
    spot = R.free_spot(w / 2, d / 2 + 0.3, margin=0.1) if free else R.on_wall(w, d + 0.6, h)
    if spot is None:
        return False
    pose = (spot if isinstance(spot, _Pose) else spot[0]).then(0, 0, -0.3, 0)
    g = R.group()
    top, body = R.part(_C["desk"], texture=rng.uniform(0, 10)), R.part(_C["desk"])
    t = rng.uniform(0.025, 0.04)
    R.box(pose, 0, 0, h - t, w, d, t, top)
    side = rng.choice([-1, 1])
    if rng.random() < 0.7:  # a drawer pedestal on one side, a panel on the other
        pw = rng.uniform(0.35, 0.45)
        R.box(pose, side * (w / 2 - pw / 2), 0, 0, pw, d - 0.02, h - t, body, skip=("-y",))
        for k in range(3):
            R.box(pose, side * (w / 2 - pw / 2), d / 2 - 0.01, (k + 0.6) * (h - t) / 3, 0.1, 0.02, 0.015, body)
        R.box(pose, -side * (w / 2 - 0.015), 0, 0, 0.03, d - 0.02, h - t, body)
        R.occlude(pose, side * (w / 2 - pw / 2), 0, 0, pw, d, h - t)
    else:
        _legs(R, pose, w / 2, d / 2, 0.02, 0.05, h - t, body)
    if rng.random() < 0.5:
        R.box(pose, 0, -d / 2 + 0.05, 0.3, w - 0.1, 0.02, h - t - 0.3, body)
    R.register(pose, w / 2, d / 2, g)
    # a monitor and a few things
    if rng.random() < 0.6:
        mon = R.part(IGNORE, _random_color(rng) * 0.3)
        mw = rng.uniform(0.45, 0.7)
        R.box(pose, 0, -d / 4, h, 0.2, 0.15, 0.015, mon)
        R.box(pose, 0, -d / 4, h + 0.015, 0.04, 0.03, 0.12, mon)
        R.box(pose, 0, -d / 4 + 0.02, h + 0.12, mw, 0.03, mw * 0.6, mon)
    _scatter_on(R, pose, h, w / 2, d / 2, int(rng.integers(0, 4)), top)
    if rng.random() < 0.85:
        cp = pose.then(math.pi + rng.uniform(-0.4, 0.4), rng.uniform(-0.2, 0.2) * w, d / 2 + rng.uniform(0, 0.25), 0)
        corners = _rect_corners(cp.t[0], cp.t[1], 0.26, 0.26, cp.yaw)
        if R.fits(corners, ignore=(g,), margin=0.02):
            _chair(R, cp)
            R.footprints.append((corners, g))
    return True


def _cabinet(R: _Room, tall: Optional[bool] = None, wall: Optional[_Wall] = None, s: Optional[float] = None,
             width: Optional[float] = None) -> Optional[Tuple[_Pose, float, float]]:
    """A cabinet / wardrobe / chest against a wall: a closed box with door seams and handles; things on low ones."""
    rng = R.rng
    tall = rng.random() < 0.4 if tall is None else tall
    w = rng.uniform(0.4, 1.4) if width is None else width
    d = rng.uniform(0.5, 0.65) if tall else rng.uniform(0.35, 0.55)
    h = rng.uniform(1.6, 2.2) if tall else rng.uniform(0.5, 1.1)
    spot = R.on_wall(w, d, h, wall=wall, s=s)
    if spot is None:
        return None
    pose = spot[0]
    body, knobs = R.part(_C["cabinet"], texture=rng.uniform(0, 8)), R.part(_C["cabinet"])
    R.box(pose, 0, 0, 0, w, d, h, body, skip=("-y",))
    n_doors = max(1, int(round(w / rng.uniform(0.4, 0.6))))
    for k in range(n_doors):
        x = -w / 2 + (k + 0.5) * w / n_doors
        if k:
            R.box(pose, -w / 2 + k * w / n_doors, d / 2, 0.05, 0.006, 0.004, h - 0.1, knobs)
        R.box(pose, x + (0.4 if k % 2 else -0.4) * w / n_doors * 0.7, d / 2, h * rng.uniform(0.45, 0.6) if tall
              else h - 0.12, 0.02, 0.025, 0.1, knobs)
    R.occlude(pose, 0, 0, 0, w, d, h)
    R.register(pose, w / 2, d / 2, R.group())
    if not tall and rng.random() < 0.5:
        _scatter_on(R, pose, h, w / 2, d / 2, int(rng.integers(1, 4)), body)
    return pose, w, d


def _bed(R: _Room) -> bool:
    """A bed with its head against a wall: frame, mattress, blanket, headboard, pillows; nightstands beside."""
    rng = R.rng
    w = rng.choice([rng.uniform(0.9, 1.1), rng.uniform(1.35, 1.9)])
    L = rng.uniform(1.95, 2.15)
    spot = R.on_wall(w + 0.06, L, 1.2)
    if spot is None:
        return False
    pose, wall, sc = spot
    frame, mattress = R.part(_C["bed"]), R.part(_C["bed"], light=True)
    blanket = R.part(_C["bed"], texture=rng.uniform(0, 35))
    base = rng.uniform(0.2, 0.35)
    mh = rng.uniform(0.15, 0.25)
    R.box(pose, 0, 0, 0, w, L, base, frame)
    R.box(pose, 0, 0.02, base, w - 0.04, L - 0.08, mh, mattress)
    bl = rng.uniform(0.5, 0.75) * L
    R.box(pose, 0, L / 2 - bl / 2 - 0.02, base + mh, w + 0.02, bl, 0.03, blanket, skip=("-z",))
    R.occlude(pose, 0, L / 2 - bl / 2 - 0.02, base + mh - 0.05, w, bl, 0.06, target=mattress, pad=0.0)
    hb = rng.uniform(0.8, 1.2)
    R.box(pose, 0, -L / 2 + 0.04, 0, w + 0.06, 0.08, hb, frame, skip=("-y",))
    R.occlude(pose, 0, 0, 0, w + 0.06, L, hb)
    R.register(pose, w / 2 + 0.03, L / 2, R.group())
    n_p = 1 if w < 1.2 else int(rng.integers(1, 3))
    for k in range(n_p):
        px = 0.0 if n_p == 1 else (k - 0.5) * w / 2
        R.ellipsoid(pose, (px, -L / 2 + 0.3, base + mh + 0.05), (min(0.3, w / 2 - 0.1), 0.18, 0.07),
                    R.part(IGNORE, texture=rng.uniform(0, 20)))
    for side in (-1, 1):  # nightstands
        if rng.random() < 0.6:
            nw = rng.uniform(0.35, 0.55)
            s_ns = sc + side * ((w + 0.06) / 2 + 0.1 + nw / 2)
            _nightstand(R, wall, s_ns, nw)
    return True


def _nightstand(R: _Room, wall: Optional[_Wall] = None, s: Optional[float] = None, w: Optional[float] = None
                ) -> bool:
    """A nightstand / small chest (otherfurniture) with drawer knobs and maybe a lamp."""
    rng = R.rng
    w = rng.uniform(0.35, 0.55) if w is None else w
    d, h = rng.uniform(0.3, 0.45), rng.uniform(0.4, 0.65)
    spot = R.on_wall(w, d, h, wall=wall, s=s)
    if spot is None:
        return False
    pose = spot[0]
    body = R.part(_C["otherfurniture"])
    R.box(pose, 0, 0, 0, w, d, h, body, skip=("-y",))
    for k in range(int(rng.integers(1, 4))):
        R.box(pose, 0, d / 2, h - 0.1 - k * 0.15, 0.05, 0.02, 0.02, body)
    R.occlude(pose, 0, 0, 0, w, d, h)
    R.register(pose, w / 2, d / 2, R.group())
    if rng.random() < 0.6:  # a lamp
        lamp = R.part(IGNORE, light=True)
        R.cylinder(pose, 0, 0, h, h + 0.25, 0.015, lamp, top=False)
        R.cylinder(pose, 0, 0, h + 0.2, h + 0.4, rng.uniform(0.1, 0.16), lamp)
    return True


def _lone_chair(R: _Room) -> bool:
    """A chair standing somewhere on its own, at a random yaw."""
    pose = R.free_spot(0.27, 0.27, margin=0.03)
    if pose is None:
        return False
    _chair(R, pose)
    R.register(pose, 0.27, 0.27, R.group())
    return True


def _otherfurniture(R: _Room) -> bool:
    """An ottoman, a stool or a rolling cart: small free-standing furniture outside the named classes."""
    rng = R.rng
    kind = rng.random()
    part = R.part(_C["otherfurniture"], texture=rng.uniform(0, 10))
    if kind < 0.35:  # ottoman
        w, d, h = rng.uniform(0.4, 0.9), rng.uniform(0.4, 0.7), rng.uniform(0.35, 0.45)
        pose = R.free_spot(w / 2, d / 2)
        if pose is None:
            return False
        if rng.random() < 0.5:
            R.box(pose, 0, 0, 0, w, d, h, part)
        else:
            R.cylinder(pose, 0, 0, 0, h, w / 2, part)
            d = w
        R.occlude(pose, 0, 0, 0, w, d, h)
    elif kind < 0.7:  # stool
        r, h = rng.uniform(0.15, 0.2), rng.uniform(0.45, 0.75)
        pose = R.free_spot(r, r)
        if pose is None:
            return False
        R.cylinder(pose, 0, 0, h - 0.04, h, r, part, bottom=True)
        for k in range(4):
            a = k * math.pi / 2 + math.pi / 4
            R.box(pose, 0.7 * r * math.cos(a), 0.7 * r * math.sin(a), 0, 0.03, 0.03, h - 0.04, part)
        w = d = 2 * r
    else:  # a cart: two shelves on four posts
        w, d, h = rng.uniform(0.5, 0.8), rng.uniform(0.35, 0.5), rng.uniform(0.6, 0.9)
        pose = R.free_spot(w / 2, d / 2)
        if pose is None:
            return False
        R.box(pose, 0, 0, 0.12, w, d, 0.02, part)
        R.box(pose, 0, 0, h - 0.02, w, d, 0.02, part)
        _legs(R, pose, w / 2, d / 2, 0, 0.025, h, part)
        _scatter_on(R, pose, h, w / 2, d / 2, int(rng.integers(0, 3)), part)
    R.register(pose, w / 2, d / 2, R.group())
    return True


def _sofa(R: _Room) -> bool:
    """A sofa against a wall (or free-standing): base, seat cushions, back, arms; pillows (unlabelled)."""
    rng = R.rng
    w, d, h = rng.uniform(1.4, 2.5), rng.uniform(0.8, 1.0), rng.uniform(0.75, 0.95)
    if rng.random() < 0.75:
        spot = R.on_wall(w, d, h)
        pose = None if spot is None else spot[0]
    else:
        pose = R.free_spot(w / 2, d / 2, margin=0.3)
    if pose is None:
        return False
    body = R.part(_C["sofa"], texture=rng.uniform(0, 12))
    cushion = body if rng.random() < 0.6 else R.part(_C["sofa"], texture=rng.uniform(0, 12))
    arm, seat, back = rng.uniform(0.1, 0.22), rng.uniform(0.38, 0.46), rng.uniform(0.15, 0.25)
    base = seat - 0.12
    R.box(pose, 0, 0, 0, w - 2 * arm, d, base, body)
    n = max(1, int(round((w - 2 * arm) / 0.65)))
    cw = (w - 2 * arm) / n
    for k in range(n):
        R.box(pose, -w / 2 + arm + (k + 0.5) * cw, back / 2, base, cw - 0.01, d - back, 0.12, cushion)
    R.box(pose, 0, -d / 2 + back / 2, base, w - 2 * arm, back, h - base, body)
    ah = rng.uniform(0.55, 0.68)
    for sx in (-1, 1):
        R.box(pose, sx * (w / 2 - arm / 2), 0, 0, arm, d, ah, body)
    R.occlude(pose, 0, 0, 0, w, d, h)
    R.register(pose, w / 2, d / 2, R.group())
    for _ in range(int(rng.integers(0, 3))):
        R.ellipsoid(pose.then(rng.uniform(-0.3, 0.3)), (rng.uniform(-0.35, 0.35) * w, -d / 2 + back + 0.1,
                                                         seat + 0.18), (0.2, 0.08, 0.18),
                    R.part(IGNORE, texture=rng.uniform(0, 30)))
    return True


def _bookshelf(R: _Room) -> bool:
    """An open bookshelf against a wall: sides, top, plinth, back panel, shelves, and rows of books (unlabelled)."""
    rng = R.rng
    w, d, h = rng.uniform(0.6, 1.6), rng.uniform(0.25, 0.42), rng.uniform(1.0, 2.2)
    spot = R.on_wall(w, d, h)
    if spot is None:
        return False
    pose = spot[0]
    part = R.part(_C["bookshelf"], texture=rng.uniform(0, 8))
    t = rng.uniform(0.018, 0.03)
    R.box(pose, -w / 2 + t / 2, 0, 0, t, d, h, part, skip=("-y",))
    R.box(pose, w / 2 - t / 2, 0, 0, t, d, h, part, skip=("-y",))
    R.box(pose, 0, 0, h - t, w - 2 * t, d, t, part, skip=("-y",))
    R.box(pose, 0, 0, 0, w - 2 * t, d, 0.08, part, skip=("-y",))
    R.quad(pose, (-w / 2 + t, -d / 2 + 0.01, 0.08), (w - 2 * t, 0, 0), (0, 0, h - 0.08 - t), (0, 1, 0), part)
    levels = max(1, int((h - 0.1) / rng.uniform(0.3, 0.4)))
    gap = (h - 0.08 - t) / levels
    inner = w - 2 * t
    for k in range(levels):
        z = 0.08 + k * gap
        if k:
            R.box(pose, 0, 0, z - t / 2, inner, d - 0.01, t, part, skip=("-y",))
        x = -inner / 2 + rng.uniform(0, 0.1)
        while x < inner / 2 - 0.05:  # runs of books, some gaps
            bw = rng.uniform(0.015, 0.06)
            if rng.random() < 0.2:
                x += rng.uniform(0.05, 0.25)
                continue
            bh = min(rng.uniform(0.15, 0.3), gap - t - 0.02)
            bd = min(rng.uniform(0.14, 0.25), d - 0.03)
            if x + bw > inner / 2:
                break
            R.box(pose, x + bw / 2, -d / 2 + 0.015 + bd / 2, z + t / 2, bw, bd, bh, R.part(IGNORE), skip=("-y",))
            x += bw + 0.002
    R.occlude(pose, 0, 0, 0, w, d, h)
    R.register(pose, w / 2, d / 2, R.group())
    return True


def _picture(R: _Room, mirror: bool = False, above: Optional[Tuple[_Wall, float]] = None) -> bool:
    """A picture (textured) or a mirror (unlabelled) hung flat on a wall, clear of openings and tall furniture."""
    rng = R.rng
    w, h = rng.uniform(0.3, 1.2), rng.uniform(0.3, 0.9)
    if mirror:
        w, h = rng.uniform(0.4, 0.8), rng.uniform(0.5, 0.9)
    for _ in range(30):
        wall = above[0] if above else R.walls[int(rng.choice(len(R.walls), p=np.array([x.length for x in R.walls])
                                                                           / sum(x.length for x in R.walls)))]
        zc = rng.uniform(1.3, 1.8)
        z0, z1 = zc - h / 2, zc + h / 2
        if z1 > wall.height - 0.1:
            continue
        s = above[1] + rng.uniform(-0.1, 0.1) if above else rng.uniform(w / 2 + 0.1, wall.length - w / 2 - 0.1)
        if not wall.free(s - w / 2, s + w / 2, z0, z1):
            continue
        wall.items.append((s - w / 2, s + w / 2, z0, z1))
        c = wall.p0 + wall.d * s
        pose = _Pose(wall.yaw, c[0], c[1], 0.0)
        t = rng.uniform(0.01, 0.04)
        part = R.part(IGNORE, _random_color(rng, light=True) * 0.85, texture=3.0) if mirror else \
            R.part(_C["picture"], texture=rng.uniform(35, 80))
        R.box(pose, 0, t / 2, z0, w, t, h, part, skip=("-y",))
        R.occlude(pose, 0, t / 2, z0, w, t, h)
        return True
    return False


def _counter(R: _Room) -> bool:
    """A kitchen counter along a wall: base cabinets, a worktop (counter) with a sink basin, wall cabinets above."""
    rng = R.rng
    wall = max(R.walls, key=lambda x: x.length * rng.uniform(0.6, 1.0))
    L = min(rng.uniform(1.4, 3.2), wall.length - 0.3)
    d, h = rng.uniform(0.58, 0.66), rng.uniform(0.86, 0.93)
    spot = R.on_wall(L, d, h, wall=wall) or R.on_wall(L * 0.6, d, h)
    if spot is None:
        return False
    pose, wall, sc = spot
    L = wall.items[-1][1] - wall.items[-1][0]
    cab, top = R.part(_C["cabinet"]), R.part(_C["counter"], texture=rng.uniform(0, 15))
    t = rng.uniform(0.03, 0.045)
    R.box(pose, 0, -0.02, 0.1, L, d - 0.04, h - t - 0.1, cab, skip=("-y",))
    R.box(pose, 0, -0.07, 0, L, d - 0.14, 0.1, cab, skip=("-y",))  # the toe kick
    n = max(1, int(round(L / 0.6)))
    for k in range(n):
        R.box(pose, -L / 2 + (k + 0.5) * L / n, d / 2 - 0.04, h - t - 0.15, 0.12, 0.02, 0.02, cab)
    R.box(pose, 0, 0, h - t, L, d, t, top, skip=("-y",))
    R.occlude(pose, 0, 0, 0, L, d, h)
    R.register(pose, L / 2, d / 2, R.group())
    if rng.random() < 0.8 and L > 0.9:  # a sink basin let into the worktop, a tap behind it
        sink = R.part(_C["sink"], light=True)
        bw, bd, bh = rng.uniform(0.45, 0.8), rng.uniform(0.35, 0.42), rng.uniform(0.15, 0.22)
        x = rng.uniform(-L / 2 + bw / 2 + 0.05, L / 2 - bw / 2 - 0.05)
        R.open_box(pose, x, 0.02, h - bh, bw, bd, bh, 0.015, sink, outer=False)
        R.occlude(pose, x, 0.02, h - t - 0.01, bw - 0.02, bd - 0.02, t + 0.02, target=top, pad=0.0)
        R.cylinder(pose, x, 0.02 - bd / 2 - 0.06, h, h + rng.uniform(0.2, 0.35), 0.015, sink)
    _scatter_on(R, pose, h, L / 2, d / 2, int(rng.integers(1, 5)), top)
    if rng.random() < 0.7:  # wall cabinets
        uz = h + rng.uniform(0.5, 0.65)
        uh = min(rng.uniform(0.6, 0.8), wall.height - uz - 0.05)
        if uh > 0.3:
            upper = R.part(_C["cabinet"])
            ud = rng.uniform(0.3, 0.36)
            R.box(pose, 0, -d / 2 + 0.02 + ud / 2, uz, L, ud, uh, upper, skip=("-y",))
            R.occlude(pose, 0, -d / 2 + 0.02 + ud / 2, uz, L, ud, uh)
            wall.items.append((sc - L / 2, sc + L / 2, uz, uz + uh))
    return True


def _refrigerator(R: _Room) -> bool:
    rng = R.rng
    w, d, h = rng.uniform(0.6, 0.9), rng.uniform(0.62, 0.75), rng.uniform(1.45, 1.95)
    spot = R.on_wall(w, d, h)
    if spot is None:
        return False
    pose = spot[0]
    body, handle = R.part(_C["refrigerator"], light=rng.random() < 0.6), R.part(_C["refrigerator"])
    R.box(pose, 0, 0, 0, w, d, h, body, skip=("-y",))
    split = h * rng.uniform(0.3, 0.4)
    R.box(pose, 0, d / 2, split, w, 0.006, 0.01, handle)  # the seam between the doors
    hx = (w / 2 - 0.06) * rng.choice([-1, 1])
    R.box(pose, hx, d / 2 + 0.02, split + 0.1, 0.025, 0.04, rng.uniform(0.3, 0.6), handle)
    R.box(pose, hx, d / 2 + 0.02, split - 0.3, 0.025, 0.04, 0.2, handle)
    R.occlude(pose, 0, 0, 0, w, d, h)
    R.register(pose, w / 2, d / 2, R.group())
    return True


def _toilet(R: _Room) -> bool:
    rng = R.rng
    tw, td = rng.uniform(0.38, 0.5), rng.uniform(0.16, 0.22)
    bowl_r = rng.uniform(0.17, 0.21)
    depth = td + 2 * bowl_r + 0.1
    spot = R.on_wall(max(tw, 2 * bowl_r) + 0.1, depth, 0.85)
    if spot is None:
        return False
    pose = spot[0]
    body = R.part(_C["toilet"], light=rng.random() < 0.7)
    seat = body if rng.random() < 0.6 else R.part(_C["toilet"])
    y0 = -depth / 2
    R.box(pose, 0, y0 + td / 2, 0.42, tw, td, rng.uniform(0.3, 0.38), body, skip=("-y",))
    by = y0 + td + bowl_r
    R.ellipsoid(pose, (0, by, 0.2), (bowl_r, bowl_r * 1.25, 0.2), body)
    R.ellipsoid(pose, (0, by, 0.41), (bowl_r + 0.02, bowl_r * 1.25 + 0.02, 0.025), seat)
    R.occlude(pose, 0, y0 + td / 2, 0, tw, td, 0.8)
    R.register(pose, max(tw, 2 * bowl_r) / 2, depth / 2, R.group())
    return True


def _sink(R: _Room) -> bool:
    """A bathroom sink: a basin on a pedestal or on a vanity cabinet, a tap, often a mirror above."""
    rng = R.rng
    bw, bd, bh = rng.uniform(0.45, 0.65), rng.uniform(0.38, 0.48), rng.uniform(0.12, 0.2)
    top = rng.uniform(0.8, 0.9)
    spot = R.on_wall(bw, bd, top)
    if spot is None:
        return False
    pose, wall, sc = spot
    sink = R.part(_C["sink"], light=rng.random() < 0.7)
    R.open_box(pose, 0, 0, top - bh, bw, bd, bh, 0.02, sink, skip=("-y",))
    if rng.random() < 0.5:
        R.cylinder(pose, 0, -0.05, 0, top - bh, rng.uniform(0.06, 0.1), sink, top=False)
    else:  # vanity cabinet below (cabinet)
        cab = R.part(_C["cabinet"])
        R.box(pose, 0, 0, 0, bw - 0.02, bd - 0.02, top - bh, cab, skip=("-y",))
        R.occlude(pose, 0, 0, 0, bw, bd, top - bh)
    R.cylinder(pose, 0, -bd / 2 + 0.012, top, top + rng.uniform(0.1, 0.2), 0.012, sink)
    R.occlude(pose, 0, 0, 0, bw, bd, top)
    R.register(pose, bw / 2, bd / 2, R.group())
    if rng.random() < 0.7:
        _picture(R, mirror=True, above=(wall, sc))
    return True


def _bathtub(R: _Room) -> bool:
    """A bathtub with its long side against a wall; usually a wavy shower curtain along its front edge."""
    rng = R.rng
    L, w, h = rng.uniform(1.4, 1.8), rng.uniform(0.65, 0.82), rng.uniform(0.45, 0.6)
    spot = R.on_wall(L, w, h)
    if spot is None:
        return False
    pose, wall, sc = spot
    tub = R.part(_C["bathtub"], light=rng.random() < 0.7)
    R.open_box(pose, 0, 0, 0, L, w, h, rng.uniform(0.05, 0.1), tub, skip=("-y",))
    R.occlude(pose, 0, 0, 0, L, w, h)
    R.register(pose, L / 2, w / 2, R.group())
    if rng.random() < 0.75:
        part = R.part(_C["shower curtain"], texture=rng.uniform(0, 30))
        top = min(rng.uniform(1.85, 2.05), wall.height - 0.05)
        cl = L * rng.uniform(0.4, 1.0)
        x0 = -L / 2 if rng.random() < 0.5 else L / 2 - cl
        R.quad(pose, (x0, w / 2 - 0.03, h + rng.uniform(0.05, 0.25)), (cl, 0, 0), (0, 0, top - h - 0.1), (0, 1, 0),
               part, wave=(rng.uniform(0.015, 0.04), cl / rng.uniform(0.1, 0.18), rng.uniform(0, 2 * math.pi)))
        R.box(pose, 0, w / 2 - 0.03, top, L, 0.02, 0.02, R.part(IGNORE))  # the rod
        wall.items.append((sc - L / 2, sc + L / 2, h, top))
    return True


def _floor_clutter(R: _Room) -> bool:
    """Bins, boxes, bags, a floor lamp or a plant: unlabelled things on the floor."""
    rng = R.rng
    kind = rng.random()
    if kind < 0.15:  # floor lamp
        pose = R.free_spot(0.2, 0.2)
        if pose is None:
            return False
        p = R.part(IGNORE, light=True)
        R.cylinder(pose, 0, 0, 0, 0.03, 0.15, p)
        R.cylinder(pose, 0, 0, 0.03, 1.4, 0.015, p, top=False)
        R.cylinder(pose, 0, 0, 1.35, 1.65, rng.uniform(0.15, 0.25), p)
    elif kind < 0.3:  # plant
        pose = R.free_spot(0.25, 0.25)
        if pose is None:
            return False
        ph = rng.uniform(0.2, 0.4)
        R.cylinder(pose, 0, 0, 0, ph, rng.uniform(0.1, 0.18), R.part(IGNORE))
        R.ellipsoid(pose, (0, 0, ph + 0.3), rng.uniform(0.2, 0.35, 3), R.part(IGNORE, texture=20))
    else:
        r = 0.25
        pose = R.free_spot(r, r, margin=0.02)
        if pose is None:
            return False
        _clutter_item(R, pose, 0, 0, 0, None, scale=rng.uniform(1.0, 2.0))
        R.occlude(pose, 0, 0, 0, 0.3, 0.3, 0.05)
    R.register(pose, 0.25, 0.25, R.group())
    return True


def _repeat(fn: Any, n: int, *args: Any) -> None:
    for _ in range(n):
        fn(*args)


def _furnish(R: _Room) -> None:
    rng = R.rng
    r = lambda a, b: int(rng.integers(a, b + 1))  # noqa: E731
    if R.kind == "bedroom":
        _bed(R)
        _repeat(_cabinet, r(0, 2), R, True)
        _repeat(_cabinet, r(0, 1), R, False)
        if rng.random() < 0.5:
            _desk(R)
        _repeat(_bookshelf, r(0, 1), R)
        _repeat(_otherfurniture, r(0, 1), R)
        _repeat(_lone_chair, r(0, 1), R)
        _repeat(_picture, r(1, 3), R)
        _repeat(_floor_clutter, r(2, 5), R)
    elif R.kind == "living":
        _repeat(_sofa, r(1, 2), R)
        if rng.random() < 0.8:
            _table(R, "coffee", False)
        if rng.random() < 0.6:
            _table(R, "dining")
        _repeat(_bookshelf, r(0, 2), R)
        _repeat(_cabinet, r(0, 2), R, False)
        _repeat(_otherfurniture, r(0, 2), R)
        _repeat(_lone_chair, r(0, 2), R)
        _repeat(_picture, r(1, 4), R)
        _repeat(_floor_clutter, r(2, 5), R)
    elif R.kind == "office":
        if rng.random() < 0.4:
            _table(R, "meeting")
        for _ in range(r(2, 5)):
            _desk(R, free=rng.random() < 0.4)
        _repeat(_bookshelf, r(1, 2), R)
        _repeat(_cabinet, r(1, 3), R)
        _repeat(_otherfurniture, r(0, 1), R)
        _repeat(_lone_chair, r(1, 3), R)
        _repeat(_picture, r(0, 2), R)
        _repeat(_floor_clutter, r(2, 6), R)
    elif R.kind == "kitchen":
        _repeat(_counter, r(1, 2), R)
        _refrigerator(R)
        if rng.random() < 0.9:
            _table(R, "dining")
        _repeat(_cabinet, r(0, 1), R, True)
        _repeat(_otherfurniture, r(0, 2), R)
        _repeat(_lone_chair, r(0, 1), R)
        _repeat(_picture, r(0, 1), R)
        _repeat(_floor_clutter, r(1, 4), R)
    else:
        if rng.random() < 0.75:
            _bathtub(R)
        _toilet(R)
        _repeat(_sink, r(1, 2), R)
        _repeat(_cabinet, r(0, 1), R, False)
        _repeat(_picture, r(0, 1), R)
        _repeat(_floor_clutter, r(1, 3), R)


# ----------------------------------------------------------------------------------------------------------------
# Rooms and the dataset
# ----------------------------------------------------------------------------------------------------------------


def make_room(rng: np.random.Generator, points: int = 40_000, kind: Optional[str] = None
              ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One scanned room of exactly ``points`` points: (coord float32 (N, 3) metres, z up from the floor; colour
    uint8 (N, 3); unit normals float32 (N, 3); ScanNet-20 labels int64 (N,), −1 for clutter). ``kind`` is one of
    :data:`ROOM_KINDS` (None → drawn from ``rng``)."""
    if points < 100:
        raise ValueError(f"a room needs at least 100 points, got {points}")
    kind = ROOM_KINDS[int(rng.integers(len(ROOM_KINDS)))] if kind is None else kind
    if kind not in ROOM_KINDS:
        raise ValueError(f"room kind must be one of {', '.join(ROOM_KINDS)}, got {kind!r}")
    R = _Room(rng, kind)
    _shell(R)
    _furnish(R)
    holes: List[Tuple[np.ndarray, float]] = []
    chunks: List[Tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    have, draw = 0, int(points * 1.6)
    while have < points:
        pts, nrm, part = R.carve(*R.sample(draw), holes=holes)
        if not holes:  # the scan's holes: a few balls around random surface points (fixed for the room)
            for c in pts[rng.choice(len(pts), int(rng.integers(2, 6)), replace=False)]:
                holes.append((c, float(rng.uniform(0.12, 0.45))))
            pts, nrm, part = R.carve(pts, nrm, part, holes=holes)
        chunks.append((pts, nrm, part))
        have += len(pts)
        draw = 2 * (points - have) + 256
    pts, nrm, part = (np.concatenate([c[k] for c in chunks]) for k in range(3))
    keep = np.sort(rng.choice(len(pts), points, replace=False))
    pts, nrm, part = pts[keep], nrm[keep], part[keep]
    color = R.colors(pts, nrm, part)
    pts = pts + rng.normal(0, NOISE, pts.shape)
    label = np.array(R.part_label, np.int64)[part]
    return pts.astype(np.float32), color, nrm.astype(np.float32), label


def _splits(train: int, val: int, test: int) -> List[Tuple[str, int]]:
    return [(s, n) for s, n in (("train", train), ("val", val), ("test", test))]


def write_synthetic_rooms(root: Union[str, Path], train: int = 48, val: int = 8, test: int = 8,
                          points: int = 40_000, seed: int = 0, progress: bool = True) -> Path:
    """Write ``train + val + test`` synthetic rooms of ``points`` points in Pointcept's ScanNet layout into ``root``
    (which must not exist; written to a temporary sibling and renamed at the end), plus ``meta.json``."""
    root = Path(root)
    if min(train, val, test) < 0 or train + val + test < 1 or points < 100:
        raise ValueError(f"need non-negative room counts (at least one room) and points ≥ 100; got train={train}, "
                         f"val={val}, test={test}, points={points}")
    from tqdm.auto import tqdm

    with build_folder(root) as tmp:
        jobs = []
        k = 0
        for split, n in _splits(train, val, test):
            (tmp / split).mkdir()
            for _ in range(n):
                jobs.append((split, k))
                k += 1
        counts = np.zeros(len(SCANNET20_CLASSES) + 1, np.int64)  # last: ignored
        scenes: Dict[str, List[Dict[str, Any]]] = {s: [] for s, _ in _splits(train, val, test)}
        for split, k in tqdm(jobs, desc="synthetic rooms", unit="room", disable=not progress):
            kind = ROOM_KINDS[(k + seed) % len(ROOM_KINDS)]
            coord, color, normal, segment = make_room(np.random.default_rng([seed, k]), points, kind)
            name = f"scene{k:04d}_00"
            d = tmp / split / name
            d.mkdir()
            np.save(d / "coord.npy", coord)
            np.save(d / "color.npy", color)
            np.save(d / "normal.npy", normal)
            np.save(d / "segment20.npy", segment)
            counts += np.bincount(np.where(segment < 0, len(SCANNET20_CLASSES), segment),
                                  minlength=len(SCANNET20_CLASSES) + 1)
            scenes[split].append({"name": name, "kind": kind})
        meta = {"generator": "polymixer.experiments.points.synth", "version": VERSION, "format": "scannet",
                "seed": seed,
                "points": points, "rooms": {s: n for s, n in _splits(train, val, test)},
                "class_names": list(SCANNET20_CLASSES),
                "point_counts": {**{c: int(counts[i]) for i, c in enumerate(SCANNET20_CLASSES)},
                                 "ignored": int(counts[-1])},
                "scenes": scenes}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    return root


def default_data(name: str = "rooms", seed: int = 0, progress: bool = True, **sizes: int) -> Path:
    """The offline default's folder (generated on first use into the cache, then reused): synthetic rooms in the
    ScanNet layout; ``sizes`` are keyword arguments of :func:`write_synthetic_rooms` (train, val, test, points —
    each combination is its own folder)."""
    if name not in DEFAULTS:
        raise ValueError(f"unknown default dataset {name!r}; expected one of {', '.join(DEFAULTS)} or a folder")
    unknown = set(sizes) - {"train", "val", "test", "points"}
    if unknown:
        raise ValueError(f"unknown sizes {sorted(unknown)}; expected train, val, test, points")
    return cached_default("points", name, VERSION, write_synthetic_rooms, seed=seed, progress=progress, **sizes)


def resolve_data(data: Optional[str], seed: int = 0, progress: bool = True) -> Path:
    """``None`` or ``rooms`` → the offline default's folder; anything else must be an existing dataset folder."""
    return resolve_folder(data, DEFAULTS, lambda name: default_data(name, seed=seed, progress=progress))
