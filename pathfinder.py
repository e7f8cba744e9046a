"""
PathFinder and Path-X images (Linsley et al. 2018, "snakes"; the data of the Long
Range Arena tasks), generated with numpy alone. This file imports nothing else
from this project: copy it and call

    images, info = pathfinder_batch(np.random.default_rng(0), labels=[0, 1, 1], contour_length=14)

The rules are those of the original generator (github.com/drewlinsley/pathfinder,
`snakes.py` for one contour, `snakes2.py` for the two targets and the markers,
`snakes2_wrapper.py` for the settings per difficulty):

- A contour is a chain of `contour_length` short dashes ("paddles"). From the end
  of a paddle the chain steps on by `margin`, turns, and the next paddle starts
  after another `margin`: the gap between two paddles of one contour is 2 margin.
- The turn is drawn among the candidates one pixel of arc apart on the circle of
  radius paddle_length + margin, weighted cos^2(min(continuity |turn|, pi/2)),
  among those whose paddle is free.
- Free means: the paddle dilated by `margin` overlaps no dilated paddle already
  drawn, except the newest one of its own contour. Between contours nothing else
  is forbidden, so two contours may pass as close as two dashes of one contour.
  That ambiguity is what makes the task hard; no extra spacing is kept.
- Two target contours start seed_distance apart near the centre and grow one
  paddle each in turn; an attempt that cannot finish is drawn again.
- Distractors: num = distractor_paddles // (contour_length // 3) contours of
  contour_length // 3 paddles (20 paddles at 32 px, 35 at 128 px). Each starts at
  a pixel drawn uniformly among the free ones (for a drawn orientation, the seed
  paddle must fit there) and gets 5 tries; what does not fit is left out.
- The label is drawn at random (1/2). Two circle markers: one on the origin tip
  of a target drawn at random, the other on the far tip of the same target
  (label 1) or of the other one (label 0). Nothing controls the marker distance.
- Drawing: anti-aliased paddles at `contrast`, full-white markers.

Departures from the original, each a named option (defaults in brackets):
- `spacing` [0]: extra distance kept between contours on top of the dilation
  (the earlier version here used 1.5 px at 32, 3 px at 128; that made a local
  gap-bridging flood fill solve the task).
- `match_distance` [False]: draw positives and negatives from the same
  distribution of marker distance (the original does not).
- `all_pairs` [True]: every pair of paddles of different contours is checked.
  The original checks a new paddle against a mask that still lacks the other
  target's newest paddle, and hands the distractors a mask without the first
  target's last paddle, so targets can cross at their growing ends and a
  distractor can lie on a marked tip; with False those pairs go unchecked here too.
- `cells` (3 at 32 px, 2 at 128): the dilation test is done on a grid `cells`
  times finer than the pixels, from three points per paddle (ends and middle);
  the original tests the anti-aliased masks pixel by pixel.
Not kept as options: coordinates are continuous (the original rounds each joint
to a whole pixel), a turn is drawn among the free candidates (the original draws
up to 3 times among candidates whose end pixel is free, then gives up), and the
32 px settings are this project's (LRA's own 32 px arguments are not public; the
public wrapper draws 300 px images, see PARAMS_ORIGINAL_WRAPPER).
"""

import numpy as np

VERSION = 2  # bump whenever the images for a given seed change: caches are keyed on it

# per resolution: paddle length/thickness, margins (one drawn per image), marker radius,
# seed distance, continuity, padding, distractor paddles, contrast, anti-aliasing, cells
PARAMS = {
    32: dict(paddle_length=2, paddle_thickness=0.5, margins=(1,), marker_radius=1.5, seed_distance=7,
             continuity=1.0, padding=1, distractor_paddles=20, contrast=1.5, aa=4, cells=3),
    128: dict(paddle_length=5, paddle_thickness=1.5, margins=(2, 3), marker_radius=3, seed_distance=20,
              continuity=1.8, padding=1, distractor_paddles=35, contrast=0.9, aa=2, cells=2),
}
# snakes2_wrapper.py as published (300 x 300 images), for comparison
PARAMS_ORIGINAL_WRAPPER = dict(window=300, paddle_length=5, paddle_thickness=2, margins=(3,), marker_radius=5,
                               seed_distance=27, continuity=1.8, padding=22, distractor_paddles=30, contrast=1.0,
                               aa=2, distractor_tries=5, paddle_tries=3)
DISTRACTOR_TRIES = 5  # max_distractor_contour_retrial = 4, i.e. 5 tries per distractor


def distractors_asked(contour_length, resolution=32):
    """-> (number of distractor contours, paddles in each), as the wrapper: length // 3 paddles,
    distractor_paddles // that many contours."""
    d_len = max(contour_length // 3, 1)
    return params(resolution)["distractor_paddles"] // d_len, d_len


def params(resolution):
    if resolution not in PARAMS:
        raise ValueError(f"PathFinder resolution must be one of {list(PARAMS)}, got {resolution}")
    return PARAMS[resolution]


# -----------------------------------------------------------------------------
# geometry helpers


def segment_distance(points, segs):
    """Distance from points (..., 2) to segments (..., 4) as x0 y0 x1 y1, broadcast."""
    px, py = points[..., 0], points[..., 1]
    ax, ay, bx, by = segs[..., 0], segs[..., 1], segs[..., 2], segs[..., 3]
    dx, dy = bx - ax, by - ay
    t = np.clip(((px - ax) * dx + (py - ay) * dy) / np.maximum(dx * dx + dy * dy, 1e-12), 0, 1)
    ex, ey = px - ax - t * dx, py - ay - t * dy
    return np.sqrt(ex * ex + ey * ey)


def segments_distance(a, b):
    """Exact distance between segments a (..., 4) and b (..., 4) that do not cross:
    the least of the four end-to-segment distances (0 where they cross)."""
    d = np.minimum(np.minimum(segment_distance(a[..., :2], b), segment_distance(a[..., 2:], b)),
                   np.minimum(segment_distance(b[..., :2], a), segment_distance(b[..., 2:], a)))
    cross = lambda p, q, r: (q[..., 0] - p[..., 0]) * (r[..., 1] - p[..., 1]) - (q[..., 1] - p[..., 1]) * (r[..., 0] - p[..., 0])
    a0, a1, b0, b1 = a[..., :2], a[..., 2:], b[..., :2], b[..., 2:]
    crossing = (cross(a0, a1, b0) * cross(a0, a1, b1) < 0) & (cross(b0, b1, a0) * cross(b0, b1, a1) < 0)
    return np.where(crossing, 0.0, d)


def _three_points(segs):
    """Ends and middle of segments (..., 4) -> (..., 3, 2)."""
    a, b = segs[..., :2], segs[..., 2:]
    return np.stack([a, (a + b) / 2, b], -2)


def _unit(angle):
    return np.stack([np.cos(angle), np.sin(angle)], -1)


_DISKS = {}


def _disk_offsets(radius, width):
    """Flat offsets of the cells within radius (in cells) of a cell, in rows of width."""
    if (radius, width) not in _DISKS:
        r = int(np.ceil(radius))
        dy, dx = np.mgrid[-r:r + 1, -r:r + 1]
        keep = dx ** 2 + dy ** 2 <= radius ** 2
        _DISKS[radius, width] = (dy[keep] * width + dx[keep]).astype(np.int64)
    return _DISKS[radius, width]


class _Occupancy:
    """For a batch of images, where a new paddle may not go: a boolean map per image on a
    grid `cells` times finer than the pixels (with a border, so stamps near the edge need
    no bounds checks). Stamping a paddle forbids every cell within `radius` of its ends
    and middle; a candidate is free if its ends and middle are allowed and inside [lo, hi]."""

    def __init__(self, n, R, cells, lo, hi, radius, reach=0):
        self.g, self.lo, self.hi, self.radius = cells, lo, hi, radius
        self.b = int(np.ceil((radius + reach) * cells)) + 2  # reach: how far seed_free looks past a pixel
        self.W = R * cells + 2 * self.b
        self.map = np.zeros(n * self.W * self.W, bool)  # flat (n, W, W)

    def _flat(self, img, pts):
        c = np.floor(pts * self.g).astype(np.int64) + self.b
        return (img * self.W + c[..., 1]) * self.W + c[..., 0]

    def stamp(self, img, segs):
        """Forbid the cells near segs (k, 4) in images img (k,)."""
        if len(img):
            base = self._flat(img[:, None], _three_points(segs))  # (k, 3)
            self.map[base[:, :, None] + _disk_offsets(self.radius * self.g, self.W)[None, None]] = True

    def free(self, img, segs):
        """segs (k, K, 4) candidates in images img (k,) -> (k, K) free."""
        pts = _three_points(segs)  # (k, K, 3, 2)
        inside = ((pts >= self.lo) & (pts <= self.hi)).all((-1, -2))
        hit = self.map[self._flat(img[:, None, None], np.clip(pts, self.lo, self.hi))]
        return inside & ~hit.any(-1)

    def seed_free(self, img, pixels, offsets):
        """Paddles from every pixel (P, 2) (whole numbers) to pixel + offsets (k, 2), for images
        img (k,) -> (k, P) free. As the pixel is whole, its cells shift by whole cells."""
        pts = np.stack([np.zeros_like(offsets), offsets / 2, offsets], 1)  # (k, 3, 2)
        c = np.floor(pts * self.g).astype(np.int64)
        shift = c[..., 1] * self.W + c[..., 0]  # (k, 3)
        base = (pixels[:, 1].astype(np.int64) * self.g + self.b) * self.W + pixels[:, 0].astype(np.int64) * self.g + self.b
        hit = self.map[(img * self.W * self.W)[:, None, None] + base[None, :, None] + shift[:, None, :]].any(-1)
        lo_xy = np.minimum(0, offsets)[:, None]  # the paddle's extent beyond the pixel
        hi_xy = np.maximum(0, offsets)[:, None]
        inside = ((pixels[None] + lo_xy >= self.lo) & (pixels[None] + hi_xy <= self.hi)).all(-1)
        return inside & ~hit


def _turns(p, margin):
    """Candidate turns at a joint, one per pixel of arc on the circle of radius
    paddle_length + margin, and their weights cos^2(min(continuity |turn|, pi/2))."""
    n = int(round(2 * np.pi * (p["paddle_length"] + margin)))
    turns = np.linspace(-np.pi, np.pi, n, endpoint=False)
    weights = np.cos(np.minimum(p["continuity"] * np.abs(turns), np.pi / 2)) ** 2
    return turns[weights > 1e-6], weights[weights > 1e-6]


class _Contours:
    """A batch of growing contours: each one's joint (where the next step starts), direction,
    newest paddle, and origin tip."""

    def __init__(self, tail, angle, L, m):
        self.L, self.m = L, m
        u = _unit(angle)
        self.first = np.concatenate([tail, tail + L * u], -1)  # the seed paddle (k, 4)
        self.joint, self.angle, self.last, self.origin = tail + (L + m) * u, angle.copy(), self.first.copy(), tail

    def candidates(self, turns, rows):
        """The paddles after each turn, for the given rows -> (k, K, 4), their angles (k, K)."""
        angles = self.angle[rows, None] + turns[None]
        u = _unit(angles)
        j = self.joint[rows, None]
        return np.concatenate([j + self.m * u, j + (self.m + self.L) * u], -1), angles

    def step(self, rng, rows, cands, angles, ok, weights):
        """Draw one free turn per row (continuity prior); rows without one fail. -> success (k,)."""
        w = weights[None] * ok
        total = w.sum(1)
        alive = total > 0
        pick = (np.cumsum(w, 1) < (rng.random(len(w)) * total)[:, None]).sum(1).clip(max=w.shape[1] - 1)
        r = np.nonzero(alive)[0]
        seg = cands[r, pick[r]]
        self.last[rows[r]] = seg
        self.angle[rows[r]] = angles[r, pick[r]]
        self.joint[rows[r]] = seg[:, 2:] + self.m * _unit(self.angle[rows[r]])
        return alive


def _bounds(R, p, margin):
    """Paddle centre lines stay inside [lo, hi]: the dilated paddle keeps off the padding border."""
    edge = p["padding"] + margin + p["paddle_thickness"] / 2
    return edge, R - 1 - edge


def _clearance(p, margin, spacing):
    """Centre lines of paddles of different contours stay this far apart: the two
    dilated dashes (half-width margin + thickness/2 each) do not overlap, plus `spacing`."""
    return 2 * margin + p["paddle_thickness"] + spacing


# -----------------------------------------------------------------------------
# the two target contours


def _targets(rng, n, R, p, length, margin, spacing, all_pairs):
    """Grow pairs of target contours for n attempts at once, one paddle of each in turn.
    -> alive (n,), paddles (n, 2, length, 4)."""
    L, sd = p["paddle_length"], p["seed_distance"]
    lo, hi = _bounds(R, p, margin)
    clear = _clearance(p, margin, spacing)
    turns, weights = _turns(p, margin)
    box = (2 * sd, R - 1 - 2 * sd) if R - 1 > 4 * sd else ((R - 1) / 2, (R - 1) / 2)
    tail1 = rng.uniform(*box, (n, 2))  # the original: a free pixel at least 2 seed_distance from the border
    tail2 = tail1 + sd * _unit(rng.uniform(0, 2 * np.pi, n))
    snakes = [_Contours(tail1, rng.uniform(-np.pi, np.pi, n), L, margin),
              _Contours(tail2, rng.uniform(-np.pi, np.pi, n), L, margin)]
    occupied = _Occupancy(n, R, p["cells"], lo, hi, clear)  # every paddle but each contour's newest
    alive = np.ones(n, bool)
    for s in snakes:
        alive &= ((s.first.reshape(n, 2, 2) >= lo) & (s.first.reshape(n, 2, 2) <= hi)).all((1, 2))
    if all_pairs:
        alive &= segments_distance(snakes[0].first, snakes[1].first) >= clear
    paddles = [[s.first.copy()] for s in snakes]
    for _ in range(length - 1):
        for i, s in enumerate(snakes):
            r = np.nonzero(alive)[0]
            cands, angles = s.candidates(turns, r)
            ok = occupied.free(r, cands)
            if all_pairs:  # the other target's newest paddle, which the original leaves out
                ok &= segments_distance(cands, snakes[1 - i].last[r, None]) >= clear
            previous = s.last[r].copy()
            alive[r] &= s.step(rng, r, cands, angles, ok, weights)
            keep = alive[r]
            occupied.stamp(r[keep], previous[keep])  # this contour's previous paddle now counts
            paddles[i].append(s.last.copy())
    return alive, np.stack([np.stack(paddles[0], 1), np.stack(paddles[1], 1)], 1)


# -----------------------------------------------------------------------------
# distractors


def _distractors(rng, R, p, margin, targets, n_contours, length, spacing, all_pairs):
    """Short contours seeded on free pixels, DISTRACTOR_TRIES tries each; what does not fit
    is left out. targets (n, 2, T, 4). -> list of (k_i, length, 4) per image."""
    n = len(targets)
    L = p["paddle_length"]
    lo, hi = _bounds(R, p, margin)
    clear = _clearance(p, margin, spacing)
    turns, weights = _turns(p, margin)
    occ = _Occupancy(n, R, p["cells"], lo, hi, clear, reach=L)
    rows = np.arange(n)
    if all_pairs:
        flat = targets.reshape(n, -1, 4)
    else:  # the original's mask lacks the first target's last paddle
        flat = np.concatenate([targets[:, 0, :-1], targets[:, 1]], 1)
    occ.stamp(np.repeat(rows, flat.shape[1]), flat.reshape(-1, 4))
    pixels = np.stack(np.meshgrid(np.arange(R), np.arange(R), indexing="xy"), -1).reshape(-1, 2).astype(float)
    out = [[] for _ in range(n)]
    for _ in range(n_contours):
        todo = rows.copy()
        for _ in range(DISTRACTOR_TRIES):
            if len(todo) == 0:
                break
            k = len(todo)
            # seed: an orientation, then a pixel drawn uniformly among those where that paddle is free
            angle = rng.uniform(-np.pi, np.pi, k)
            fits = occ.seed_free(todo, pixels, L * _unit(angle))
            ok = fits.any(1)
            pick = (np.cumsum(fits, 1) <= (rng.random(k) * fits.sum(1))[:, None]).sum(1).clip(max=R * R - 1)
            s = _Contours(pixels[pick], angle, L, margin)
            own = _Occupancy(k, R, p["cells"], lo, hi, clear)  # this distractor's own paddles, one step late
            placed, pending, idx = [s.first.copy()], s.first.copy(), np.arange(k)
            for _ in range(length - 1):
                r = np.nonzero(ok)[0]
                cands, angles = s.candidates(turns, r)
                free = occ.free(todo[r], cands) & own.free(r, cands)
                ok[r] &= s.step(rng, r, cands, angles, free, weights)
                r = np.nonzero(ok)[0]
                own.stamp(idx[r], pending[r])
                pending = s.last.copy()
                placed.append(s.last.copy())
            placed = np.stack(placed, 1)  # (k, length, 4)
            done = np.nonzero(ok)[0]
            occ.stamp(np.repeat(todo[done], length), placed[done].reshape(-1, 4))
            for j in done:
                out[todo[j]].append(placed[j])
            todo = todo[~ok]
    return [np.stack(o) if o else np.zeros((0, length, 4)) for o in out]


# -----------------------------------------------------------------------------
# drawing


def render(R, p, paddles_per_image, markers):
    """Anti-aliased drawing of a batch: coverage on an aa-times finer grid, averaged down.
    Paddles (list of (k_i, 4)) at `contrast`, the markers (n, 2, 2) full white."""
    aa, t, r = p["aa"], p["paddle_thickness"], p["marker_radius"]
    n, H = len(paddles_per_image), R * aa

    def cover(img, segs, radius):
        fine = np.zeros((n, H, H), bool)
        if len(img) == 0:
            return fine
        w = int(np.ceil((np.abs(segs[:, 2:] - segs[:, :2]).max() + 2 * radius) * aa)) + 2
        corner = np.floor((np.minimum(segs[:, :2], segs[:, 2:]) - radius) * aa).astype(int)
        off = np.stack(np.meshgrid(np.arange(w), np.arange(w), indexing="xy"), -1).reshape(-1, 2)
        cell = corner[:, None, :] + off[None]
        centre = (cell + 0.5) / aa - 0.5  # fine cell centres in pixel coordinates (pixel i covers i-0.5..i+0.5)
        on = (segment_distance(centre, segs[:, None, :]) <= radius) & (cell >= 0).all(-1) & (cell < H).all(-1)
        k = np.broadcast_to(img[:, None], on.shape)[on]
        c = cell[on]
        fine[k, c[:, 1], c[:, 0]] = True
        return fine

    img = np.repeat(np.arange(n), [len(s) for s in paddles_per_image])
    lines = cover(img, np.concatenate(paddles_per_image).reshape(-1, 4), t / 2)
    dots = cover(np.repeat(np.arange(n), 2), np.concatenate([markers, markers], -1).reshape(-1, 4), r)
    mean = lambda fine: fine.reshape(n, R, aa, R, aa).mean((2, 4))
    image = np.maximum(mean(lines) * p["contrast"], mean(dots))
    return np.clip(np.rint(image * 255), 0, 255).astype(np.uint8)


# -----------------------------------------------------------------------------
# a batch of images


def _target_pairs(rng, n, R, p, length, spacing, all_pairs):
    """n finished pairs of targets, each image's margin drawn from p["margins"] as the original.
    -> margins (n,), paddles (n, 2, length, 4)."""
    choices = p["margins"]
    margins = np.asarray(choices)[rng.integers(len(choices), size=n)] if len(choices) > 1 else np.full(n, choices[0])
    targets = np.zeros((n, 2, length, 4))
    for margin in np.unique(margins):
        sel = np.nonzero(margins == margin)[0]
        targets[sel] = _grow_targets(rng, len(sel), R, p, length, margin, spacing, all_pairs)
    return margins, targets


def _grow_targets(rng, n, R, p, length, margin, spacing, all_pairs):
    """Grown in bulk: most attempts fail (a contour hits the border or the other one and is
    drawn again, as in the original). -> paddles (n, 2, length, 4)."""
    found, have, tried = [], 0, 0
    while have < n:
        if tried > 2000 * (n + 50):
            raise RuntimeError(f"PathFinder{R}: contours of length {length} hardly ever fit")
        rate = (have + 1) / (tried + 20)  # running estimate of pairs per attempt
        attempts = int(min(4000, max(64, 1.3 * (n - have) / rate)))
        alive, segs = _targets(rng, attempts, R, p, length, margin, spacing, all_pairs)
        tried += attempts
        found.append(segs[alive])
        have += int(alive.sum())
    return np.concatenate(found)[:n]


def pathfinder_batch(rng, labels, resolution=32, contour_length=14, spacing=0.0, match_distance=False,
                     all_pairs=True):
    """Images for the given labels (0 = markers on different contours, 1 = on one).
    -> uint8 images (n, R, R), info: a dict of the geometry per image,
       markers (n, 2, 2) as x, y; margin (n,); paddles: list of (P_i, 4); contour: list of
       (P_i,) contour ids (0 and 1 the targets, 2.. the distractors); marked (n, 2) the
       contour ids under the two markers; distractors_asked; distractors_placed (n,)."""
    p = params(resolution)
    labels = np.asarray(labels, dtype=np.int64)
    n = len(labels)
    n_contours, d_len = distractors_asked(contour_length, resolution)
    if match_distance:
        margins, targets, which = _distance_matched(rng, labels, resolution, p, contour_length, spacing, all_pairs)
    else:
        margins, targets = _target_pairs(rng, n, resolution, p, contour_length, spacing, all_pairs)
        which = rng.integers(2, size=n)  # which target carries the origin marker
    rows = np.arange(n)
    other = np.where(labels == 1, which, 1 - which)
    markers = np.stack([targets[rows, which, 0, :2], targets[rows, other, -1, 2:]], 1) if n else np.zeros((0, 2, 2))
    images = np.zeros((n, resolution, resolution), np.uint8)
    paddles, contour, placed = [None] * n, [None] * n, np.zeros(n, np.int64)
    for margin in np.unique(margins):
        sel = np.nonzero(margins == margin)[0]
        extra = _distractors(rng, resolution, p, margin, targets[sel], n_contours, d_len, spacing, all_pairs)
        for j, d in zip(sel, extra):
            paddles[j] = np.concatenate([targets[j].reshape(-1, 4), d.reshape(-1, 4)])
            contour[j] = np.concatenate([np.repeat([0, 1], contour_length), np.repeat(np.arange(len(d)) + 2, d_len)])
            placed[j] = len(d)
        images[sel] = render(resolution, p, [paddles[j] for j in sel], markers[sel])
    info = dict(markers=markers, margin=margins, paddles=paddles, contour=contour,
                marked=np.stack([which, other], 1), distractors_asked=n_contours, distractors_placed=placed)
    return images, info


def _distance_matched(rng, labels, R, p, length, spacing, all_pairs):
    """Option match_distance: pairs of targets offered as a positive or a negative, kept so
    that both labels see the same distribution of marker distance (bins of R/32 px).
    -> margins, targets, which (the target under the origin marker)."""
    n_pos, n_neg = int((labels == 1).sum()), int((labels == 0).sum())
    pool = dict(margins=[], targets=[], which=[], positive=[])
    while True:
        margins, targets = _target_pairs(rng, max(64, 2 * len(labels)), R, p, length, spacing, all_pairs)
        k = len(targets)
        for key, value in zip(pool, (margins, targets, rng.integers(2, size=k), rng.integers(2, size=k))):
            pool[key].append(value)
        g = {key: np.concatenate(v) for key, v in pool.items()}
        rows = np.arange(len(g["targets"]))
        end = np.where(g["positive"] == 1, g["which"], 1 - g["which"])
        dist = np.linalg.norm(g["targets"][rows, g["which"], 0, :2] - g["targets"][rows, end, -1, 2:], axis=1)
        bins = np.floor(dist / (R / 32)).astype(int)
        pos_idx, neg_idx = [], []
        for b in np.unique(bins):
            pos = np.nonzero((bins == b) & (g["positive"] == 1))[0]
            neg = np.nonzero((bins == b) & (g["positive"] == 0))[0]
            m = min(len(pos), len(neg))
            pos_idx.append(pos[:m]), neg_idx.append(neg[:m])
        pairs = np.stack([np.concatenate(pos_idx), np.concatenate(neg_idx)], 1)
        if len(pairs) >= max(n_pos, n_neg):
            break
    pairs = pairs[rng.permutation(len(pairs))]
    chosen = np.empty(len(labels), np.int64)
    chosen[labels == 1], chosen[labels == 0] = pairs[:n_pos, 0], pairs[:n_neg, 1]
    return g["margins"][chosen], g["targets"][chosen], g["which"][chosen]


def generate(n, seed=0, contour_length=14, resolution=32, chunk=250, **options):
    """n images with labels drawn at random, in independently seeded chunks (so the data do not
    depend on how the chunks are shared among processes). -> images, labels, margins."""
    parts = [generate_chunk(seed, c, min(chunk, n - c * chunk), contour_length, resolution, **options)
             for c in range((n + chunk - 1) // chunk)]
    if not parts:
        return np.zeros((0, resolution, resolution), np.uint8), np.zeros(0, np.int64), np.zeros(0, np.int64)
    return tuple(np.concatenate([q[i] for q in parts]) for i in range(3))


def generate_chunk(seed, chunk, size, contour_length=14, resolution=32, **options):
    """One chunk of `generate`: -> images, labels, margins."""
    rng = np.random.default_rng([seed, chunk, VERSION])
    labels = rng.integers(0, 2, size)  # as the original: each image's label drawn at random
    images, info = pathfinder_batch(rng, labels, resolution, contour_length, **options)
    return images, labels.astype(np.int64), info["margin"].astype(np.int64)
