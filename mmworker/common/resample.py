"""Fixed-point resampling (BICUBIC, LANCZOS): the coefficients, and Pillow 12.x's passes as numba kernels.

Pillow's `Resample.c` (12.x) resizes separably: per axis it computes float64 filter weights for
every output sample, normalises them, quantises them to 22 fractional bits, then runs the
horizontal pass first (into a uint8 intermediate, rounded and clipped) and the vertical pass
second. Each output sample is `clip8((1 << 21) + sum(src * weight))`. Everything here follows
that recipe operation for operation (behaviour.md §5); pillow-simd and Pillow 13 do not, which is
why this module exists. ATen (and pillow-simd, which equals it) uses the same weights quantised
with fewer bits, chosen per axis from the largest weight (`axis_coefficients(..., aten=True)`).

Speed comes from the data layout, not from the arithmetic:
- The vertical pass applies one set of weights to whole rows, so the inner loop runs along a
  contiguous row and vectorises (uint8 -> int32 multiply-add).
- The horizontal pass has different weights per output column. It is run on bands of
  `BAND_ROWS` rows gathered into a column-major scratch (`(w, BAND_ROWS * 3)`), where it becomes
  the same contiguous multiply-add as the vertical pass, then scattered back. The scratch is a few
  tens of KB and stays in cache.
All accumulation is int32 exactly as in C; no reductions are reordered, so results never depend on
the layout.
"""

import math

import numpy as np
from numba import int32, njit, uint64

BICUBIC = 0
LANCZOS = 1
_SUPPORT = (2.0, 3.0)

PRECISION_BITS = 32 - 8 - 2
_HALF = 1 << (PRECISION_BITS - 1)
_CLIP_HIGH = 1 << (PRECISION_BITS + 8)

# Rows per band of the horizontal pass: 16 rows x 3 channels = 48 int32 lanes per output column,
# a whole number of AVX2/AVX-512 vectors; the band scratch for a 4032-wide image is ~190 KB.
BAND_ROWS = 16


@njit(cache=True)
def _filter(x: float, kind: int) -> float:
    if kind == BICUBIC:
        a = -0.5
        if x < 0.0:
            x = -x
        if x < 1.0:
            return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
        if x < 2.0:
            return (((x - 5) * x + 8) * x - 4) * a
        return 0.0
    # LANCZOS: sinc(x) * sinc(x / 3) on [-3, 3)
    if -3.0 <= x < 3.0:
        return _sinc(x) * _sinc(x / 3)
    return 0.0


@njit(cache=True)
def _sinc(x: float) -> float:
    if x == 0.0:
        return 1.0
    x = x * math.pi
    return math.sin(x) / x


@njit(cache=True)
def axis_weights(in_size: int, out_size: int, kind: int) -> tuple[np.ndarray, np.ndarray]:
    """Per output sample: (first source index, tap count) and the normalised float64 weights.

    Returns `bounds` int32 [out_size, 2] and `weights` float64 [out_size, ksize] (zero-padded),
    the exact values of Pillow's `precompute_coeffs` with the default box (behaviour.md §5.2).
    """
    scale = in_size / out_size
    filterscale = scale if scale >= 1.0 else 1.0
    support = _SUPPORT[kind] * filterscale
    ksize = math.ceil(support) * 2 + 1
    bounds = np.zeros((out_size, 2), np.int32)
    weights = np.zeros((out_size, ksize), np.float64)
    ss = 1.0 / filterscale
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = int(center - support + 0.5)
        if xmin < 0:
            xmin = 0
        xmax = int(center + support + 0.5)
        if xmax > in_size:
            xmax = in_size
        count = xmax - xmin
        total = 0.0
        for x in range(count):
            w = _filter((x + xmin - center + 0.5) * ss, kind)
            weights[xx, x] = w
            total += w
        if total != 0.0:
            for x in range(count):
                weights[xx, x] /= total
        bounds[xx, 0] = xmin
        bounds[xx, 1] = count
    return bounds, weights


@njit(cache=True)
def quantise(weights: np.ndarray, precision: int) -> np.ndarray:
    """int32 fixed-point weights with `precision` fractional bits, rounded half away from zero."""
    out = np.empty(weights.shape, np.int32)
    unit = float(1 << precision)
    for i in range(weights.shape[0]):
        for k in range(weights.shape[1]):
            w = weights[i, k]
            out[i, k] = int(-0.5 + w * unit) if w < 0 else int(0.5 + w * unit)
    return out


@njit(cache=True)
def aten_precision(weights: np.ndarray) -> int:
    """ATen's `_compute_weights_precision` for one axis: the most fractional bits (at most 22) with
    which its largest weight still fits an int16 after rounding (pillow-simd does the same)."""
    largest = 0.0
    for w in weights.flat:
        largest = max(largest, abs(w))
    precision = 0
    while precision < PRECISION_BITS and int(0.5 + largest * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    return precision


@njit(cache=True)
def _axis_coefficients(in_size: int, out_size: int, kind: int, aten: bool) -> tuple[np.ndarray, np.ndarray, int]:
    bounds, weights = axis_weights(in_size, out_size, kind)
    precision = aten_precision(weights) if aten else PRECISION_BITS
    return bounds, quantise(weights, precision), precision


def axis_coefficients(
    in_size: int, out_size: int, kind: int, *, aten: bool = False
) -> tuple[np.ndarray, np.ndarray, int]:
    """(bounds, fixed-point weights, precision) for one axis: Pillow 12's 22 bits, or ATen's.

    One compiled call: computed per image and per axis, where three calls from Python (and the
    precision's numpy reductions) cost ~18 us at 640 -> 644.
    """
    return _axis_coefficients(in_size, out_size, kind, aten)


@njit(cache=True, inline="always")
def _clip8(acc: int) -> int:
    if acc >= _CLIP_HIGH:
        return 255
    if acc <= 0:
        return 0
    return acc >> PRECISION_BITS


@njit(cache=True, inline="always")
def _convolve_rows(src: np.ndarray, first: int, count: int, weights: np.ndarray, acc: np.ndarray) -> None:
    """acc[:] = half + sum_k src[first + k, :] * weights[k]; the contiguous, vectorised inner loop."""
    n = acc.shape[0]
    for i in range(n):
        acc[i] = _HALF
    for k in range(count):
        w = weights[k]
        row = src[first + k]
        for i in range(n):
            acc[i] = int32(acc[i] + int32(int32(row[i]) * w))


@njit(cache=True)
def vertical_pass(src: np.ndarray, bounds: np.ndarray, weights: np.ndarray, out: np.ndarray) -> None:
    """out[yo, :] from rows of src; both 2-D uint8 with the same row length (width * 3)."""
    acc = np.empty(out.shape[1], np.int32)
    for yo in range(out.shape[0]):
        _convolve_rows(src, bounds[yo, 0], bounds[yo, 1], weights[yo], acc)
        row = out[yo]
        for i in range(acc.shape[0]):
            row[i] = _clip8(acc[i])


@njit(cache=True)
def horizontal_pass(src: np.ndarray, row0: int, bounds: np.ndarray, weights: np.ndarray, out: np.ndarray) -> None:
    """out[r, xo, :3] from src[row0 + r, :, :3]; src is (h, w, C >= 3), out (rows, ow, C' >= 3), both
    C-contiguous; bytes of out beyond the first three per pixel are left as they are.

    Indices are unsigned and arrays flat on purpose: numba wraps negative signed indices, and that
    per-access branch keeps LLVM from vectorising the gather, the multiply-add and the scatter
    (measured: 20-30% of this pass).
    """
    rows, out_w = out.shape[0], out.shape[1]
    in_w, channels = src.shape[1], src.shape[2]
    lanes = uint64(BAND_ROWS * 3)
    band = np.zeros(in_w * BAND_ROWS * 3, np.uint8)
    result = np.empty(out_w * BAND_ROWS * 3, np.uint8)
    acc = np.empty(BAND_ROWS * 3, np.int32)
    flat_src = src.reshape(-1)
    flat_out = out.reshape(-1)
    flat_weights = weights.reshape(-1)
    n_channels, out_channels = uint64(channels), uint64(out.shape[2])
    src_row, out_row, ksize = uint64(in_w) * n_channels, uint64(out_w) * out_channels, uint64(weights.shape[1])
    one, two = uint64(1), uint64(2)
    for r0 in range(0, rows, BAND_ROWS):
        n = min(BAND_ROWS, rows - r0)
        for r in range(n):
            s = uint64(row0 + r0 + r) * src_row
            lane = uint64(r * 3)
            for x in range(uint64(in_w)):
                q, d = s + x * n_channels, x * lanes + lane
                band[d] = flat_src[q]
                band[d + one] = flat_src[q + one]
                band[d + two] = flat_src[q + two]
        for xo in range(out_w):
            first, count = uint64(bounds[xo, 0]), uint64(bounds[xo, 1])
            for i in range(lanes):
                acc[i] = _HALF
            w0 = uint64(xo) * ksize
            for k in range(count):
                w = flat_weights[w0 + k]
                b = (first + k) * lanes
                for i in range(lanes):
                    acc[i] = int32(acc[i] + int32(int32(band[b + i]) * w))
            d = uint64(xo) * lanes
            for i in range(lanes):
                result[d + i] = _clip8(acc[i])
        for r in range(n):
            o = uint64(r0 + r) * out_row
            lane = uint64(r * 3)
            for xo in range(uint64(out_w)):
                q, d = xo * lanes + lane, o + xo * out_channels
                flat_out[d] = result[q]
                flat_out[d + one] = result[q + one]
                flat_out[d + two] = result[q + two]


@njit(cache=True)
def vertical_pass_strided(src: np.ndarray, bounds: np.ndarray, weights: np.ndarray, out: np.ndarray) -> None:
    """vertical_pass for a source with C > 3 channels (RGBX views): only the first 3 are read."""
    out_h, width = out.shape[0], out.shape[1]
    for yo in range(out_h):
        first, count = bounds[yo, 0], bounds[yo, 1]
        for x in range(width):
            for c in range(3):
                acc = int32(_HALF)
                for k in range(count):
                    acc = int32(acc + int32(int32(src[first + k, x, c]) * weights[yo, k]))
                out[yo, x, c] = _clip8(acc)


def resize_fixed_point(src: np.ndarray, out_w: int, out_h: int, kind: int, out: np.ndarray) -> None:
    """Resize src (h, w, C >= 3 uint8, C-contiguous) into out (out_h, out_w, 3) the way Pillow 12 does."""
    src = np.ascontiguousarray(src)  # the kernels index flat buffers; a no-op for every caller today
    in_h, in_w = src.shape[0], src.shape[1]
    need_h, need_v = out_w != in_w, out_h != in_h
    if not need_h and not need_v:
        out[...] = src[:, :, :3]
        return
    vb, vw, _ = axis_coefficients(in_h, out_h, kind) if need_v else (None, None, None)
    if need_h:
        hb, hw, _ = axis_coefficients(in_w, out_w, kind)
        if not need_v:
            horizontal_pass(src, 0, hb, hw, out)
            return
        # Like Pillow, run the horizontal pass only over the source rows the vertical pass reads.
        first = int(vb[0, 0])
        last = int(vb[-1, 0] + vb[-1, 1])
        vb[:, 0] -= first
        mid = np.empty((last - first, out_w, 3), np.uint8)
        horizontal_pass(src, first, hb, hw, mid)
        src = mid
    if src.shape[2] == 3:
        vertical_pass(src.reshape(src.shape[0], -1), vb, vw, out.reshape(out_h, -1))
    else:
        vertical_pass_strided(src, vb, vw, out)
