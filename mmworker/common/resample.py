"""Fixed-point resampling (BICUBIC, LANCZOS): the coefficients, and the two passes as numba kernels.

Pillow's `Resample.c` resizes separably: per axis it computes float64 filter weights for
every output sample, normalises them, quantises them to 22 fractional bits, then runs one pass
(into a uint8 intermediate, rounded and clipped) and the other pass second. Each output sample is
`clip8((1 << 21) + sum(src * weight))`. Everything here follows that recipe operation for
operation (docs/behaviour.md §5). ATen (torchvision's uint8 antialiased resize, and pillow-simd, which
equals it) uses the same weights quantised with fewer bits, chosen per axis from the largest weight
(`axis_coefficients(..., aten=True)`), and the same passes with that precision: so both passes take
the precision as an argument, and serve the `pil_*` modes and aten_u8 alike. Which pass runs first
is the caller's choice (mmworker.common.resize, after mmworker.common.pillow's rule for each stock
Pillow version): the intermediate is rounded to uint8, so the order changes the bytes.

Speed comes from the data layout, not from the arithmetic:
- The vertical pass applies one set of weights to whole rows, so the inner loop runs along a
  contiguous row and vectorises (uint8 -> int32 multiply-add).
- The horizontal pass has different weights per output column. It is run on bands of
  `BAND_ROWS` rows gathered into a column-major scratch (`(w, BAND_ROWS * 3)`), where it becomes
  the same contiguous multiply-add as the vertical pass, then scattered back. The scratch is a few
  tens of KB and stays in cache.
All accumulation is int32 exactly as in C; no reductions are reordered, so results never depend on
the layout. The precision is a run-time argument, loop-invariant: LLVM hoists the rounding term and
shifts by one uniform count, and the passes take as long as they did with Pillow's 22 bits built in.
"""

import math

import numpy as np
from numba import int32, njit, types, uint64
from numba.extending import intrinsic

BICUBIC = 0
LANCZOS = 1
_SUPPORT = (2.0, 3.0)

# Pillow's fractional bits (Resample.c's PRECISION_BITS); ATen's are at most as many.
PRECISION_BITS = 32 - 8 - 2

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
    the exact values of Pillow's `precompute_coeffs` with the default box (docs/behaviour.md §5.2).
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
    precision's numpy reductions) would cost a noticeable part of a small image's resize.
    """
    return _axis_coefficients(in_size, out_size, kind, aten)


# numba widens integer arithmetic to 64 bits. With Pillow's constant 22 LLVM narrowed the clip's
# shift back to 32-bit lanes; with a run-time precision it cannot (it cannot tell the amount is
# below 32), and widening every lane around the shift made the horizontal pass ~1.4x as long.
@intrinsic
def _shift32(typingctx, value, amount):
    """value >> amount as a 32-bit arithmetic shift (amount < 32)."""
    sig = types.int32(value, amount)

    def codegen(context, builder, signature, args):
        value32 = context.cast(builder, args[0], signature.args[0], types.int32)
        amount32 = context.cast(builder, args[1], signature.args[1], types.int32)
        return builder.ashr(value32, amount32)

    return sig, codegen


@njit(cache=True, inline="always")
def _clip8(acc: int, precision: int, high: int) -> int:
    """Pillow's clip8 (a table of acc >> 22 clamped to 0..255) and ATen's clamp of acc >> precision: the same.
    `high` is 256 << precision."""
    if acc >= high:
        return 255
    if acc <= 0:
        return 0
    return _shift32(acc, precision)


@njit(cache=True, inline="always")
def _convolve_rows(src: np.ndarray, first: int, count: int, weights: np.ndarray, half: int, acc: np.ndarray) -> None:
    """acc[:] = half + sum_k src[first + k, :] * weights[k] (count >= 1); the contiguous, vectorised inner loop."""
    # The first tap sets the sums, `half` included: one sweep fewer than setting them first (a
    # run-time `half` stored on a sweep of its own made the pass ~10% slower than Pillow's constant).
    n = acc.shape[0]
    w = weights[0]
    row = src[first]
    for i in range(n):
        acc[i] = int32(half + int32(int32(row[i]) * w))
    for k in range(1, count):
        w = weights[k]
        row = src[first + k]
        for i in range(n):
            acc[i] = int32(acc[i] + int32(int32(row[i]) * w))


@njit(cache=True)
def vertical_pass(src: np.ndarray, bounds: np.ndarray, weights: np.ndarray, precision: int, out: np.ndarray) -> None:
    """out[yo, :] from rows of src; both 2-D uint8 with the same row length (width * bytes per pixel).

    Every byte of a row is resampled, a 4-byte pixel's pad byte too: contiguous rows vectorise,
    where skipping one byte in four would not, and nobody reads the pad.
    """
    acc = np.empty(out.shape[1], np.int32)
    half, shift, high = int32(1 << (precision - 1)), int32(precision), int32(1 << (precision + 8))
    for yo in range(out.shape[0]):
        _convolve_rows(src, bounds[yo, 0], bounds[yo, 1], weights[yo], half, acc)
        row = out[yo]
        for i in range(acc.shape[0]):
            row[i] = _clip8(acc[i], shift, high)


@njit(cache=True)
def horizontal_pass(
    src: np.ndarray, row0: int, bounds: np.ndarray, weights: np.ndarray, precision: int, out: np.ndarray
) -> None:
    """out[r, xo, :3] from src[row0 + r, :, :3]; src is (h, w, C >= 3), out (rows, ow, C' >= 3), both
    C-contiguous; bytes of out beyond the first three per pixel are left as they are.

    Indices are unsigned and arrays flat on purpose: numba wraps negative signed indices, and that
    per-access branch keeps LLVM from vectorising the gather, the multiply-add and the scatter.
    """
    rows, out_w = out.shape[0], out.shape[1]
    in_w, channels = src.shape[1], src.shape[2]
    half, shift, high = int32(1 << (precision - 1)), int32(precision), int32(1 << (precision + 8))
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
            # The sums start at 0 and `half` joins at the clip (int32 sums wrap: the same bits). A
            # run-time `half` stored here made this pass ~1.4x as long as with Pillow's constant.
            for i in range(lanes):
                acc[i] = 0
            w0 = uint64(xo) * ksize
            for k in range(count):
                w = flat_weights[w0 + k]
                b = (first + k) * lanes
                for i in range(lanes):
                    acc[i] = int32(acc[i] + int32(int32(band[b + i]) * w))
            d = uint64(xo) * lanes
            for i in range(lanes):
                result[d + i] = _clip8(int32(acc[i] + half), shift, high)
        for r in range(n):
            o = uint64(r0 + r) * out_row
            lane = uint64(r * 3)
            for xo in range(uint64(out_w)):
                q, d = xo * lanes + lane, o + xo * out_channels
                flat_out[d] = result[q]
                flat_out[d + one] = result[q + one]
                flat_out[d + two] = result[q + two]
