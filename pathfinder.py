"""
PathFinder and Path-X images (Linsley et al. 2018, "snakes"; the data of the Long Range Arena tasks),
generated with numpy alone. This file imports nothing else from this project: copy it and call

    images, info = pathfinder_batch(np.random.default_rng(0), labels=[0, 1, 1], contour_length=14)

It follows the original generator (github.com/drewlinsley/pathfinder: `snakes.py` for one contour,
`snakes2.py` for the two targets and the markers) run with the arguments LRA published for its data
(google-research/long-range-arena, `lra_benchmarks/data/pathfinder.py`, the Pathfinder32 and
Pathfinder128 docstrings). Everything happens on the pixel grid, as there:

- A paddle is a line of `paddle_length` px drawn at `antialias` x resolution, one (blown-up) pixel wide at
  32 px, and shrunk with a Lanczos filter (as Pillow's resize, which scipy.misc.imresize called). Its "mask"
  is the same line dilated by `margin` before shrinking: soft values in [0, 1].
- Images keep a soft occupancy mask: the sum of the masks already drawn. A new paddle is refused when mask +
  its own mask reaches COLLISION (1.8) anywhere, so two dilated paddles may overlap partly: contours can
  touch.
- A contour grows from a joint ("pivot", a whole pixel) L + 2 margin past the last one. The next paddle's
  far end is drawn among the whole pixels (truncated) on the circle of radius L + margin around the joint,
  weighted by cos^2(min(continuity |turn|, pi/2)) times (1 - mask dilated by margin) at that pixel; up to
  PADDLE_TRIES draws pass the collision test or the contour fails. A contour's own newest paddle is not yet
  in the mask (it joins at the next step), so consecutive paddles may overlap.
- Two targets: the first starts on a free pixel of the central square (2 seed_distance from every border),
  the second seed_distance away in a random direction; they grow one paddle each in turn, and an attempt
  that fails is drawn again from scratch.
- Distractors: 20 // (L // 3) contours of contour_length // 3 paddles at 32 px (35 at 128), each seeded on a
  pixel where its first paddle is free, SNAKE_TRIES tries each; what does not fit is left out.
- Targets are drawn at paddle_contrast x snake_contrast (0.75 x 2 = 1.5 at 32 px), distractors at
  snake_contrast (2.0): distractors are brighter. Markers are discs of marker_radius at 1.0, one on the
  first target's origin tip (a target drawn at random) and one on the far tip of the same target (label 1)
  or of the other (label 0); the label is drawn at random and nothing controls the marker distance.
- The image (the maximum of all of it) is saved by dividing by its own maximum (scipy.misc.imsave's byte
  scaling): the brightest pixel is 255.

Quirks of the original, kept as options whose default is the original's behaviour (the behaviour LRA's
released images carry):
- `border_quirk` [True]: a seed is placed by dilating the occupancy (with its one-pixel frame) by the
  paddle's footprint with OpenCV, whose floating-point border is -DBL_MAX. For most orientations some frame
  pixel then comes out negative and the seed fails: at 32 px only -150..-121 degrees pass (real OpenCV 4.10
  agrees). So the first target always starts in that direction and most distractors are never placed (the
  original: 3.3 of 10 asked at length 6, 1.7 of 6 at 9, 1.15 of 5 at 14; so here too). False: every
  orientation may seed (distractors placed close to the count asked).
- `all_pairs` [False]: the original checks a target's new paddle against a mask that lacks the other
  target's newest paddle, and hands the distractors a mask without the first target's last paddle. True:
  those paddles are checked too.
- `normalise` [True]: divide each image by its maximum. False: intensity 1.0 = 255, clipped (markers always
  255, distractors saturate).
Also an option: `match_distance` [False]: positives and negatives drawn from the same distribution of
marker distance (the original does not control it).

Departure: lines wider than one blown-up pixel (Path-X, 128 px) are rasterised as the pixels within half the
width of the segment; Pillow draws them as polygons.
"""

import functools

import numpy as np

VERSION = 4  # bump whenever the images for a given seed change: caches are keyed on it

# LRA's arguments to snakes2 (lra_benchmarks/data/pathfinder.py), per resolution; the rest
# are the wrapper's defaults. A margin is drawn per image from `margins`.
PARAMS = {
    32: dict(padding=1, antialias=2, margins=(1,), seed_distance=7, marker_radius=1.5, paddle_length=2,
             paddle_thickness=0.5, continuity=1.0, distractor_paddles=20, snake_contrast=2.0, paddle_contrast=0.75),
    128: dict(padding=1, antialias=2, margins=(2, 3), seed_distance=20, marker_radius=3, paddle_length=5,
              paddle_thickness=1.5, continuity=1.8, distractor_paddles=35, snake_contrast=0.9, paddle_contrast=1.0),
}
SNAKE_TRIES = 5  # max_distractor_contour_retrial = 4: five tries per distractor
PADDLE_TRIES = 3  # max_paddle_retrial = 2: three draws per paddle (and per seed)
COLLISION = 1.8  # mask + new mask at or above this: the paddles collide
FREE = 0.3  # a pixel whose (dilated) mask is at most this is free for a seed
MIN_FREE_SHARE = 0.01  # stop_with_availability: no distractor once fewer pixels are free
CANVAS_BYTES = 2 ** 27  # target pairs are grown in batches whose canvases stay under this


def params(resolution):
    if resolution not in PARAMS:
        raise ValueError(f"PathFinder resolution must be one of {list(PARAMS)}, got {resolution}")
    return PARAMS[resolution]


def distractors_asked(contour_length, resolution=32):
    """-> (number of distractor contours, paddles in each): contour_length // 3 paddles,
    distractor_paddles // that many contours."""
    d_len = max(contour_length // 3, 1)
    return params(resolution)["distractor_paddles"] // d_len, d_len


# -----------------------------------------------------------------------------
# drawing at antialias x resolution, then shrinking as Pillow's Lanczos resize


def lanczos_weights(n_in, n_out):
    """Pillow's resampling weights for a Lanczos (a = 3) resize from n_in to n_out
    pixels, in its fixed point (22 fraction bits). -> int64 (n_out, n_in)."""
    scale = n_in / n_out
    support = 3 * max(scale, 1.0)
    K = np.zeros((n_out, n_in))
    for i in range(n_out):
        centre = (i + 0.5) * scale
        lo, hi = max(int(centre - support + 0.5), 0), min(int(centre + support + 0.5), n_in)
        x = (np.arange(lo, hi) - centre + 0.5) / max(scale, 1.0)
        w = np.where(np.abs(x) < 3, np.sinc(x) * np.sinc(x / 3), 0.0)
        K[i, lo:hi] = w / w.sum()
    K *= 1 << 22
    return np.where(K < 0, np.trunc(K - 0.5), np.trunc(K + 0.5)).astype(np.int64)


def shrink(images, n_out):
    """uint8 images (..., n, n) -> (..., n_out, n_out): rows then columns, each pass
    rounded and clipped to 8 bits, as Pillow does."""
    K = lanczos_weights(images.shape[-1], n_out)
    h = np.clip((images.astype(np.int64) @ K.T + (1 << 21)) >> 22, 0, 255)
    v = np.clip((np.swapaxes(h, -1, -2) @ K.T + (1 << 21)) >> 22, 0, 255)
    return np.swapaxes(v, -1, -2).astype(np.uint8)


def line_pixels(size, centre, dy, dx, width):
    """A line from (centre, centre) to (centre + dy, centre + dx) on a size x size grid:
    one pixel wide, both ends included, minor axis rounded half away from zero (as
    Pillow draws it); wider: the pixels within width / 2 of the segment."""
    out = np.zeros((size, size), bool)
    if width <= 1:
        n = max(abs(dy), abs(dx))
        t = np.arange(n + 1)
        step = lambda d: np.sign(d) * np.floor(np.abs(t * d / max(n, 1)) + 0.5)
        out[(centre + step(dy)).astype(int), (centre + step(dx)).astype(int)] = True
        return out
    yy, xx = np.mgrid[0:size, 0:size] - centre
    length2 = max(dy * dy + dx * dx, 1e-12)
    t = (yy * dy + xx * dx) / length2
    across = np.abs(yy * dx - xx * dy) / np.sqrt(length2)
    out[(t >= 0) & (t <= 1) & (across <= width / 2)] = True
    return out


def disk(radius):
    """Offsets (k, 2) of the pixels within radius of the centre (generate_dilation_struct)."""
    r = int(np.ceil(radius))
    dy, dx = np.mgrid[-r:r + 1, -r:r + 1]
    keep = dy ** 2 + dx ** 2 <= radius ** 2
    return np.stack([dy[keep], dx[keep]], 1)


def dilate(grid, offsets, outside=0.0):
    """Grey dilation: out(p) = max over offsets o of grid(p + o), with `outside` beyond the
    edge (OpenCV's dilate: -DBL_MAX for a float image). grid (..., H, W)."""
    H, W = grid.shape[-2:]
    r = int(np.abs(offsets).max()) if len(offsets) else 0
    pad = np.pad(grid, [(0, 0)] * (grid.ndim - 2) + [(r, r), (r, r)], constant_values=outside)
    out = np.full(grid.shape, -np.inf)
    for oy, ox in offsets:
        out = np.maximum(out, pad[..., r + oy: r + oy + H, r + ox: r + ox + W])
    return out


class Sprites:
    """Every paddle the original can draw at one resolution and margin, by the offset
    (dy, dx) of its end at antialias x scale: its shrunk line (values in [0, 1]) and mask,
    on a (2h + 1)^2 patch centred on its start pixel, h = L + ceil(thickness) + margin.
    Also, per offset, the footprint with which a seed of that orientation is placed."""

    def __init__(self, p, margin):
        L, aa = p["paddle_length"], p["antialias"]
        self.h = h = L + int(np.ceil(p["paddle_thickness"])) + margin
        big, self.centre = 2 * h * aa + 1, h * aa
        self.reach = reach = L * aa
        width = int(np.round(p["paddle_thickness"] * aa))
        dilation = disk(margin * aa)
        side = 2 * reach + 1
        self.line = np.zeros((side * side, 2 * h + 1, 2 * h + 1))  # by flat index (dy + reach) * side + dx + reach
        self.mask = np.zeros_like(self.line)
        for k in range(side * side):
            dy, dx = k // side - reach, k % side - reach
            drawn = line_pixels(big, self.centre, dy, dx, width).astype(np.uint8) * 255
            # rounded to float32: the original draws each paddle on a float32 ('F') PIL layer
            # (snakes.py), and float64 would round .5 ties to another grey level in finish()
            self.line[k] = (shrink(drawn, 2 * h + 1) / 255).astype(np.float32)
            self.mask[k] = shrink(dilate(drawn.astype(float), dilation).astype(np.uint8), 2 * h + 1) / 255
        self.seed_footprints(L, margin)

    def seed_footprints(self, L, margin):
        """seed_snake dilates the occupancy by the mask of a paddle started at pixel
        (L + margin + 1)^2 of a (2 (L + margin) + 1)^2 patch (so cropped), keeping only the
        pixels where that mask is exactly 1, anchored at the patch centre. -> per offset:
        the dilation offsets (k, 2) and whether no pixel of a 32-px image sees only border."""
        s, start = 2 * (L + margin) + 1, L + margin + 1
        self.seed_offsets, self.seed_ok = [], np.zeros(len(self.mask), bool)
        for key in range(len(self.mask)):
            patch = np.zeros((s + 2 * self.h, s + 2 * self.h))
            patch[start: start + 2 * self.h + 1, start: start + 2 * self.h + 1] = self.mask[key]
            kernel = patch[self.h: self.h + s, self.h: self.h + s] == 1.0
            offsets = np.argwhere(kernel) - (L + margin)
            self.seed_offsets.append(offsets)
            # a 32-px frame pixel sees only border unless some offset points into each quadrant
            self.seed_ok[key] = all(((sy * offsets[:, 0] >= 0) & (sx * offsets[:, 1] >= 0)).any()
                                    for sy in (-1, 1) for sx in (-1, 1))

    def key(self, angle):
        """Which sprite a paddle drawn from its start pixel at `angle` (rows down) is: the
        original rounds its end at antialias scale up (ceil) from the patch centre.
        angle (k,) -> flat sprite index (k,)."""
        r = self.reach
        dy = np.ceil(self.centre + r * np.sin(angle)) - self.centre
        dx = np.ceil(self.centre + r * np.cos(angle)) - self.centre
        return ((dy + r) * (2 * r + 1) + dx + r).astype(np.int64)

@functools.lru_cache(maxsize=None)
def sprites(resolution, margin):
    """The Sprites of a resolution and margin, built once per process."""
    return Sprites(params(resolution), margin)


# -----------------------------------------------------------------------------
# canvases: a batch of images, padded by the sprite half-size so every patch fits


def _patch_index(canvas, rows, y, x, h):
    """Flat indices into canvas (n, P, P) (padded by h) of the (2h + 1)^2 patches centred
    on pixels (y, x) of images rows (k,) -> (k, 2h + 1, 2h + 1)."""
    P = canvas.shape[-1]
    d = np.arange(2 * h + 1)
    corner = (rows * P + y) * P + x  # pixel (y, x) sits at (y + h, x + h); its patch starts at (y, x)
    return corner[:, None, None] + d[None, :, None] * P + d[None, None, :]


def paste(canvas, rows, y, x, patches, R, h):
    """canvas[rows] = max(canvas, patch) around pixels (y, x), only inside the R x R image
    (the padding stays 0, so the collision test never sees it). rows distinct."""
    if len(rows) == 0:
        return
    d = np.arange(-h, h + 1)
    yy, xx = y[:, None] + d, x[:, None] + d
    inside = ((yy >= 0) & (yy < R))[:, :, None] & ((xx >= 0) & (xx < R))[:, None, :]
    flat, index = canvas.reshape(-1), _patch_index(canvas, rows, y, x, h)
    flat[index] = np.maximum(flat[index], patches * inside)


def translate(point, angle, distance):
    """snakes.translate_coord: step from whole pixel(s) (k, 2) as (y, x), rounding up."""
    return np.ceil(point + distance * np.stack([np.sin(angle), np.cos(angle)], -1)).astype(np.int64)


def reverse(angle):
    """The original's flip by pi, into (-pi, pi]."""
    return np.where(angle < 0, angle + np.pi, angle - np.pi)


def _draw(rng, weights):
    """One index per row drawn with probability proportional to weights (k, K) >= 0."""
    c = np.cumsum(weights, 1)
    return np.minimum((c < rng.random(len(c))[:, None] * c[:, -1:]).sum(1), weights.shape[1] - 1)


# -----------------------------------------------------------------------------
# growing a contour by one paddle (snakes.extend_snake)


def extend(rng, p, sp, margin, R, mask, rows, pivot, angle):
    """The next paddle of k contours, on the padded masks mask[rows] (k, P, P) (the
    contour's newest paddle not in them). -> ok (k,), head (k, 2) (the new paddle's far
    end, where it is drawn from), new angle (k,), sprite key (k,), next pivot (k, 2)."""
    L, h = p["paddle_length"], sp.h
    k = len(pivot)
    joint = translate(pivot, angle, L + 2 * margin)
    # candidates: one per pixel of arc on the circle of radius L + margin, truncated to whole pixels
    step = L + margin
    turns = np.arange(0, 360, 360.0 / (2 * step * np.pi)) * np.pi / 180
    exact = joint[:, None, :] + step * np.stack([np.sin(turns), np.cos(turns)], -1)[None]  # (k, J, 2)
    valid = ((exact >= 0) & (exact < R)).all(-1)
    cand = exact.astype(np.int64)
    flat = np.where(valid, cand[..., 0] * R + cand[..., 1], -1)
    same = (flat[:, :, None] == flat[:, None, :]) & valid[:, None, :]
    valid &= ~np.tril(same, -1).any(2)  # unique pixels: drop a repeat of an earlier candidate
    d = cand - joint[:, None, :]
    heading = np.arctan2(d[..., 0], d[..., 1])
    turn = np.abs(heading - angle[:, None])
    turn = np.minimum(np.minimum(turn, 2 * np.pi - turn) * p["continuity"], np.pi / 2)
    prior = np.maximum(np.cos(turn), 0) ** 2
    near = disk(margin) @ [mask.shape[-1], 1]  # (1 - mask dilated by margin) at the candidate
    c = np.clip(cand, 0, R - 1) + h
    at = (rows[:, None] * mask.shape[-1] + c[..., 0]) * mask.shape[-1] + c[..., 1]
    taken = mask.reshape(-1)[at[..., None] + near].max(-1)
    weights = np.where(valid, (1 - taken) * prior, 0.0)
    ok = weights.sum(1) >= 1e-4
    found = np.zeros(k, bool)
    pick = np.zeros(k, np.int64)
    for _ in range(PADDLE_TRIES):  # draw, then test the paddle's mask against the occupancy
        r = np.nonzero(ok & ~found)[0]
        if len(r) == 0:
            break
        j = _draw(rng, weights[r])
        head = cand[r, j]
        key = sp.key(reverse(heading[r, j]))
        around = mask.reshape(-1)[_patch_index(mask, rows[r], head[:, 0], head[:, 1], h)]
        clear = (around + sp.mask[key]).max((1, 2)) < COLLISION
        found[r[clear]], pick[r[clear]] = True, j[clear]
    each = np.arange(k)
    new_angle = heading[each, pick]
    return found, cand[each, pick], new_angle, sp.key(reverse(new_angle)), joint


# -----------------------------------------------------------------------------
# seeds (snakes.seed_snake, snakes2.initialize_two_seeds)


def _seed_free(sp, occupied, keys, border_quirk):
    """Where a seed of each row's orientation may start: the occupancy (k, R, R) dilated by
    the seed footprint of its orientation is at most FREE. Beyond the image: OpenCV's
    -DBL_MAX with border_quirk (the orientations that fit never see only that), else taken."""
    free = np.zeros(occupied.shape, bool)
    for key in np.unique(keys):
        rows = np.nonzero(keys == key)[0]
        free[rows] = dilate(occupied[rows], sp.seed_offsets[key], 0.0 if border_quirk else 1.0) <= FREE
    return free


def seed(rng, p, sp, margin, R, n, where):
    """First paddle of n contours (snakes.seed_snake): an orientation in whole degrees, a
    start pixel drawn among the free ones for it; where = (fits(rows, keys) -> (k,) bool,
    pick(rng, rows, keys) -> start (k, 2), any free (k,)); the original gives up at once
    when the orientation does not fit or no pixel is free, and draws again (up to
    PADDLE_TRIES) when the paddle's end or pivot falls off the image.
    -> ok, tail (n, 2), angle, key, pivot."""
    fits_for, pick = where
    L = p["paddle_length"]
    tail, angle, pivot = np.zeros((n, 2), np.int64), np.zeros(n), np.zeros((n, 2), np.int64)
    ok, todo = np.zeros(n, bool), np.arange(n)
    for _ in range(PADDLE_TRIES):
        if len(todo) == 0:
            break
        a = rng.integers(-180, 180, len(todo)) * np.pi / 180
        fits = fits_for(todo, sp.key(a))
        todo, a = todo[fits], a[fits]
        start, anywhere = pick(rng, todo, sp.key(a))
        todo, a, start = todo[anywhere], a[anywhere], start[anywhere]
        head = translate(start, a, L)
        behind = translate(head, reverse(a), L + margin)
        good = ((head >= 0) & (head < R) & (behind >= 0) & (behind < R)).all(-1)
        tail[todo[good]], angle[todo[good]], pivot[todo[good]], ok[todo[good]] = start[good], a[good], behind[good], True
        todo = todo[~good]
    return ok, tail, angle, sp.key(angle), pivot


def occupancy_seeds(sp, occupied, border_quirk):
    """`where` of a distractor's seed: its images' occupancy (k, R, R) framed by one pixel,
    dilated by the footprint of each orientation; with border_quirk only the orientations
    whose footprint leaves no frame pixel seeing only OpenCV's -DBL_MAX border fit; none once
    fewer than MIN_FREE_SHARE of the unframed pixels are free (stop_with_availability)."""
    R = occupied.shape[-1]
    room = (occupied <= FREE).sum((1, 2)) >= MIN_FREE_SHARE * R * R
    framed = occupied.copy()
    framed[:, [0, -1], :], framed[:, :, [0, -1]] = 1, 1

    def pick(rng, rows, keys):  # a pixel drawn uniformly among the free ones of each row
        free = _seed_free(sp, framed[rows], keys, border_quirk).reshape(len(rows), R * R)
        j = _draw(rng, free.astype(float))
        return np.stack([j // R, j % R], -1), free.any(1)
    return lambda rows, keys: room[rows] & (sp.seed_ok[keys] | (not border_quirk)), pick


@functools.lru_cache(maxsize=None)
def central_seeds(R, sp, margin, border_quirk):
    """`where` of the first target's seed: the occupancy is the same for every image (a frame of
    2 seed_distance), so the free pixels of each orientation are listed once, with their count."""
    p = params(R)
    central = np.maximum(_frame(R, p["padding"]), _frame(R, min(2 * p["seed_distance"], R // 2)))
    keys = np.arange(len(sp.mask))
    free = _seed_free(sp, np.broadcast_to(central, (len(keys), R, R)), keys, border_quirk)
    count = free.sum((1, 2))
    listed = np.zeros((len(keys), max(count.max(), 1), 2), np.int64)
    for k in keys:
        listed[k, :count[k]] = np.argwhere(free[k])

    def pick(rng, rows, keys):
        j = np.floor(rng.random(len(keys)) * count[keys]).astype(np.int64)
        return listed[keys, np.minimum(j, listed.shape[1] - 1)], count[keys] > 0
    return lambda rows, keys: sp.seed_ok[keys] | (not border_quirk), pick


# -----------------------------------------------------------------------------
# the two targets (snakes2.two_snakes)


def _frame(R, width):
    grid = np.zeros((R, R))
    grid[:width], grid[R - width:], grid[:, :width], grid[:, R - width:] = 1, 1, 1, 1
    return grid


def _grow(ctx, contrast, contour, mask, image, occupancy=None):
    """One paddle more (extend) for each live contour; contour = (alive, newest paddle (y, x, sprite key),
    pivot, angle), updated in place. The new paddle goes into image at contrast, the one before it into
    mask; occupancy: the live rows' mask to test against, if not mask. -> the rows that grew."""
    rng, p, sp, margin, R = ctx
    alive, newest, pivot, angle = contour
    r = np.nonzero(alive)[0]
    occupancy, at = (mask, r) if occupancy is None else (occupancy, np.arange(len(r)))
    good, head, a, key, joint = extend(rng, p, sp, margin, R, occupancy, at, pivot[r], angle[r])
    alive[r[~good]] = False
    r, head, a, key, joint = r[good], head[good], a[good], key[good], joint[good]
    paste(image, r, head[:, 0], head[:, 1], sp.line[key] * contrast, R, sp.h)
    paste(mask, r, *newest[r].T[:2], sp.mask[newest[r, 2]], R, sp.h)  # the previous paddle joins the mask
    newest[r] = np.concatenate([head, key[:, None]], 1)
    pivot[r], angle[r] = joint, a
    return r


def _grow_targets(rng, n, R, p, sp, length, margin, all_pairs, border_quirk):
    """n attempts at once, one paddle of each target in turn. -> the finished pairs' padded
    mask and image (k, P, P), paddles (k, 2, length, 3) as (y, x, sprite key), each target's
    first paddle starting on its origin tip and its last one on its far tip."""
    sd, h = p["seed_distance"], sp.h
    contrast = p["paddle_contrast"] * p["snake_contrast"]
    ok, tail1, angle1, key1, pivot1 = seed(rng, p, sp, margin, R, n, central_seeds(R, sp, margin, border_quirk))
    first = np.nonzero(ok)[0]

    def near_first(rng, rows, keys):  # the second seed: seed_distance from the first, any direction
        where = rng.integers(0, 360, len(rows)) * np.pi / 180
        start = np.round(tail1[first[rows]] + sd * np.stack([np.sin(where), np.cos(where)], -1))
        return start.astype(np.int64), rows >= 0
    anywhere = lambda rows, keys: keys >= 0
    placed, tail2, angle2, key2, pivot2 = seed(rng, p, sp, margin, R, len(first), (anywhere, near_first))
    keep = first[placed]  # canvases only for the seeded pairs
    n = len(keep)
    alive = np.ones(n, bool)
    mask, image = np.zeros((n, R + 2 * h, R + 2 * h)), np.zeros((n, R + 2 * h, R + 2 * h))
    mask[:, h:h + R, h:h + R] = _frame(R, p["padding"])
    paddles = np.zeros((n, 2, length, 3), np.int64)
    newest = [np.concatenate([tail1[keep], key1[keep, None]], 1), np.concatenate([tail2[placed], key2[placed, None]], 1)]
    pivot, angle = [pivot1[keep], pivot2[placed]], [angle1[keep], angle2[placed]]
    for i in (0, 1):
        paste(image, np.arange(n), *newest[i].T[:2], sp.line[newest[i][:, 2]] * contrast, R, h)
        paddles[:, i, 0] = newest[i]
    for s in range(1, length):
        for i in (0, 1):
            occupancy = None
            if all_pairs:  # the other target's newest paddle, which the original leaves out
                occupancy, other = mask[alive], newest[1 - i][alive]
                paste(occupancy, np.arange(len(other)), *other.T[:2], sp.mask[other[:, 2]], R, h)
            r = _grow((rng, p, sp, margin, R), contrast, (alive, newest[i], pivot[i], angle[i]), mask, image, occupancy)
            paddles[r, i, s] = newest[i][r]
    for i in [1, 0] if all_pairs else [1]:  # the original adds only the second target's last paddle
        r = np.nonzero(alive)[0]
        paste(mask, r, *newest[i][r].T[:2], sp.mask[newest[i][r, 2]], R, h)
    return mask[alive], image[alive], paddles[alive]


def _target_pairs(rng, n, R, p, sp, length, margin, all_pairs, border_quirk):
    """n finished pairs of targets, grown in bulk: most attempts fail (a contour runs into the
    border or the other one, or the first seed's orientation is refused) and are drawn again,
    as in the original. -> padded mask, image, paddles of the n pairs."""
    found, have, tried = [], 0, 0
    while have < n:
        if tried > 5000 * (n + 50):
            raise RuntimeError(f"PathFinder{R}: contours of length {length} hardly ever fit")
        rate = (have + 1) / (tried + 20)  # running estimate of pairs per attempt
        attempts = int(min(CANVAS_BYTES // (8 * (R + 2 * sp.h) ** 2), max(64, 1.3 * (n - have) / rate)))
        pairs = _grow_targets(rng, attempts, R, p, sp, length, margin, all_pairs, border_quirk)
        tried += attempts
        found.append(pairs)
        have += len(pairs[0])
    return tuple(np.concatenate([f[i] for f in found])[:n] for i in range(3))


# -----------------------------------------------------------------------------
# distractors (snakes.make_many_snakes) and markers


def _distractors(rng, p, sp, margin, R, mask, image, n_contours, length, border_quirk):
    """Up to n_contours short contours per image, SNAKE_TRIES tries each, drawn into mask and
    image (padded, in place); a contour that does not fit whole is left out.
    -> per image a list of (length, 3) paddles as (y, x, sprite key)."""
    h, contrast = sp.h, p["snake_contrast"]
    out = [[] for _ in range(len(mask))]
    for _ in range(n_contours):
        todo = np.arange(len(mask))
        for _ in range(SNAKE_TRIES):
            if len(todo) == 0:
                break
            m, img, rows = mask[todo], image[todo], np.arange(len(todo))
            free_for = occupancy_seeds(sp, m[:, h:h + R, h:h + R], border_quirk)
            ok, tail, angle, key, pivot = seed(rng, p, sp, margin, R, len(todo), free_for)
            paste(img, rows[ok], tail[ok, 0], tail[ok, 1], sp.line[key[ok]] * contrast, R, h)
            newest = np.concatenate([tail, key[:, None]], 1)
            drawn = [newest.copy()]
            for _ in range(length - 1):
                _grow((rng, p, sp, margin, R), contrast, (ok, newest, pivot, angle), m, img)
                drawn.append(newest.copy())
            r = np.nonzero(ok)[0]
            paste(m, r, *newest[r].T[:2], sp.mask[newest[r, 2]], R, h)  # a finished contour's last paddle
            mask[todo[r]], image[todo[r]] = m[r], img[r]
            drawn = np.stack(drawn, 1)
            for j in r:
                out[todo[j]].append(drawn[j])
            todo = todo[~ok]
    return out


def marker_layer(p, R, points):
    """Discs of marker_radius around pixels points (n, 2, 2) as (y, x), drawn at antialias
    scale centred on the pixel's top-left sub-pixel (snakes2.draw_circle) and shrunk.
    -> (n, R, R) in [0, 1], the brighter of the two discs."""
    aa, r = p["antialias"], p["marker_radius"]
    yy, xx = np.mgrid[0:R * aa, 0:R * aa]
    c = points[..., None, None] * aa
    discs = ((yy - c[..., 0, :, :]) ** 2 + (xx - c[..., 1, :, :]) ** 2 <= (r * aa) ** 2).astype(np.uint8) * 255
    return shrink(discs, R).max(1) / 255


def finish(image, normalise=True):
    """Float image(s) (n, R, R) -> uint8: divided by each image's own range (scipy.misc's
    byte scaling in imsave), or, normalise=False, 1.0 = 255 and clipped."""
    if not normalise:
        return (np.clip(image, 0, 1) * 255 + 0.5).astype(np.uint8)
    lo, hi = image.min((1, 2), keepdims=True), image.max((1, 2), keepdims=True)
    scale = 255 / np.where(hi > lo, hi - lo, 1)
    return (np.clip((image - lo) * scale, 0, 255) + 0.5).astype(np.uint8)


# -----------------------------------------------------------------------------
# a batch of images


def pathfinder_batch(rng, labels, resolution=32, contour_length=14, border_quirk=True, all_pairs=False,
                     normalise=True, match_distance=False):
    """Images for the given labels (0 = markers on different contours, 1 = on one).
    -> uint8 images (n, R, R), info: a dict of the geometry per image,
       markers (n, 2, 2) as x, y; margin (n,); paddles: list of (P_i, 4) as x0 y0 x1 y1, drawn
       from (x0, y0); contour: list of (P_i,) contour ids (0 and 1 the targets, each from its
       origin tip to its far tip, 2.. the distractors); marked (n, 2) the contour ids under
       the two markers; distractors_asked; distractors_placed (n,)."""
    p = params(resolution)
    R = resolution
    labels = np.asarray(labels, dtype=np.int64)
    n = len(labels)
    n_contours, d_len = distractors_asked(contour_length, resolution)
    choices = p["margins"]
    margins = np.asarray(choices)[rng.integers(len(choices), size=n)] if len(choices) > 1 else np.full(n, choices[0])
    images = np.zeros((n, R, R), np.uint8)
    markers, marked = np.zeros((n, 2, 2)), np.zeros((n, 2), np.int64)
    paddles, contour, placed = [None] * n, [None] * n, np.zeros(n, np.int64)
    for margin in np.unique(margins):
        sel = np.nonzero(margins == margin)[0]
        sp = sprites(R, int(margin))
        args = (R, p, sp, contour_length, int(margin), all_pairs, border_quirk)
        if match_distance:
            mask, image, targets, which = _distance_matched(rng, labels[sel], *args)
        else:
            mask, image, targets = _target_pairs(rng, len(sel), *args)
            which = rng.integers(2, size=len(sel))  # which target carries the origin marker
        rows = np.arange(len(sel))
        other = np.where(labels[sel] == 1, which, 1 - which)
        points = np.stack([targets[rows, which, 0, :2], targets[rows, other, -1, :2]], 1)  # (y, x)
        extra = _distractors(rng, p, sp, int(margin), R, mask, image, n_contours, d_len, border_quirk)
        h = sp.h
        images[sel] = finish(np.maximum(image[:, h:h + R, h:h + R], marker_layer(p, R, points)), normalise)
        markers[sel], marked[sel] = points[..., ::-1], np.stack([which, other], 1)
        for j, t, d in zip(sel, targets, extra):
            y, x, key = (np.concatenate([t.reshape(-1, 3)] + d) if d else t.reshape(-1, 3)).T
            side = 2 * sp.reach + 1  # the sprite key's end (dy, dx) at antialias scale, in pixels
            dy, dx = (key // side - sp.reach) / p["antialias"], (key % side - sp.reach) / p["antialias"]
            paddles[j] = np.stack([x, y, x + dx, y + dy], -1).astype(float)
            contour[j] = np.concatenate([np.repeat([0, 1], contour_length), np.repeat(np.arange(len(d)) + 2, d_len)])
            placed[j] = len(d)
    info = dict(markers=markers.astype(float), margin=margins, paddles=paddles, contour=contour, marked=marked,
                distractors_asked=n_contours, distractors_placed=placed)
    return images, info


def _distance_matched(rng, labels, R, p, sp, length, margin, all_pairs, border_quirk):
    """Option match_distance: pairs of targets offered as a positive or a negative, kept so
    that both labels see the same distribution of marker distance (bins of R/32 px).
    -> padded mask, image, paddles, which (the target under the origin marker)."""
    n_pos, n_neg = int((labels == 1).sum()), int((labels == 0).sum())
    pool = []
    while True:
        mask, image, targets = _target_pairs(rng, max(64, 2 * len(labels)), R, p, sp, length, margin, all_pairs,
                                             border_quirk)
        k = len(targets)
        pool.append((mask, image, targets, rng.integers(2, size=k), rng.integers(2, size=k)))
        g = [np.concatenate([q[i] for q in pool]) for i in range(5)]
        targets, which, positive = g[2], g[3], g[4]
        rows = np.arange(len(targets))
        end = np.where(positive == 1, which, 1 - which)
        dist = np.linalg.norm(targets[rows, which, 0, :2] - targets[rows, end, -1, :2], axis=1)
        bins = np.floor(dist / (R / 32)).astype(int)
        pos_idx, neg_idx = [], []
        for b in np.unique(bins):
            pos = np.nonzero((bins == b) & (positive == 1))[0]
            neg = np.nonzero((bins == b) & (positive == 0))[0]
            m = min(len(pos), len(neg))
            pos_idx.append(pos[:m]), neg_idx.append(neg[:m])
        pairs = np.stack([np.concatenate(pos_idx), np.concatenate(neg_idx)], 1)
        if len(pairs) >= max(n_pos, n_neg):
            break
    pairs = pairs[rng.permutation(len(pairs))]
    chosen = np.empty(len(labels), np.int64)
    chosen[labels == 1], chosen[labels == 0] = pairs[:n_pos, 0], pairs[:n_neg, 1]
    return g[0][chosen], g[1][chosen], g[2][chosen], g[3][chosen]


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
