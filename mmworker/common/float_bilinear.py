"""torchvision's float32 antialiased BILINEAR resize of uint8 frames (SGLang's Qwen video resize) as our own kernel.

SGLang resizes every sampled video frame with torchvision's v1 `resize(uint8 TCHW, [h, w], BILINEAR)`:
the frames are cast to float32, ATen's CPU `_upsample_bilinear2d_aa` resamples them (separable, the
width first, the intermediate kept in float32), and the result is rounded half to even and cast
back to uint8. This module computes the same bytes; docs/behaviour.md §5.5 has the arithmetic:

- Weights per axis (`axis_plan`): ATen's float32 recipe, with float64 at the steps where its C++
  promotes (scale = f32(in) / f32(out), a triangle stretched by the scale when narrowing, each
  output's weights divided by their float32 sum).
- Each output sample sums its taps in their order, starting from the first product. ATen's
  compiled loop (its AVX2 and AVX-512 builds alike) adds the next taps in runs of 4 as a rounded
  product then a rounded sum, and the 0-3 taps left over at the end as fused multiply-adds; so
  does this kernel, the fused ones through LLVM's fma intrinsic (numba never contracts the
  others). Nothing is reordered: every output's sum is the same sequence of float32 operations;
  vectorisation only runs many outputs side by side. (ATen's build for CPUs without AVX2 fuses no
  tap, and its bytes differ now and then: that build is not reproduced.)

Layout, for speed (bytes first):
- The horizontal pass runs on bands of `BAND_ROWS` rows gathered into a pixel-major scratch: per
  source pixel, 4 lanes per band row (its 3 channels and the next byte along, computed and never
  stored), so that one weight applies to 64 contiguous lanes. Each output pixel's sums are stored
  into a ring of float32 rows.
- The vertical pass makes an output row as soon as the ring holds its source rows: whole rows
  times one weight, contiguous, then rounded to uint8. The ring holds what a window can still need
  (the widest window plus a band), so that a frame's float32 intermediate exists whole only when a
  window spans the whole frame.
- An axis that keeps its size has no pass (ATen runs none either); frames already of the target
  size are copied.
"""

import math

import numpy as np
from numba import float32, njit, types, uint64
from numba.extending import intrinsic

from mmworker.errors import MmError

# Rows per band of the horizontal pass: 16 rows x 4 lanes (3 channels and a passenger) = 64 float32
# lanes per source pixel, 4 AVX-512 or 8 AVX2 vectors.
BAND_ROWS = 16
_LANES = BAND_ROWS * 4
# Columns per block of the vertical pass (4 KB of float32 sums).
_VERTICAL_BLOCK = 1024
# ATen's tap loop as GCC compiled it: runs of this many taps as product-then-sum, the rest fused.
_UNFUSED_RUN = 4


@intrinsic
def _fma(typingctx, a, b, c):
    """a * b + c in float32 with one rounding (LLVM's llvm.fma; a call to fmaf where the CPU has no FMA)."""
    sig = types.float32(a, b, c)

    def codegen(context, builder, signature, args):
        a32, b32, c32 = (context.cast(builder, v, t, types.float32) for v, t in zip(args, signature.args, strict=True))
        return builder.fma(a32, b32, c32)

    return sig, codegen


@njit(cache=True)
def axis_plan(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ATen's antialiased bilinear weights for one axis: (first, count) int64 [out_size] and float32
    weights [out_size, max taps], zero-padded. The float32/float64 steps are ATen's, in its order."""
    scale = np.float32(in_size) / np.float32(out_size)
    wide = scale >= 1.0
    support = scale if wide else np.float32(1.0)
    max_taps = math.ceil(support) * 2 + 1
    invscale = np.float32(1.0 / np.float64(scale)) if wide else np.float32(1.0)
    first = np.zeros(out_size, np.int64)
    count = np.zeros(out_size, np.int64)
    weights = np.zeros((out_size, max_taps), np.float32)
    for i in range(out_size):
        center = np.float32(np.float64(scale) * (i + 0.5))
        lo = max(int(np.float64(center - support) + 0.5), 0)
        n = min(int(np.float64(center + support) + 0.5), in_size) - lo
        n = min(max(n, 0), max_taps)
        total = np.float32(0.0)
        for j in range(n):
            x = np.float32((np.float64(np.float32(j + lo) - center) + 0.5) * np.float64(invscale))
            x = abs(x)
            w = np.float32(1.0 - np.float64(x)) if x < 1.0 else np.float32(0.0)
            weights[i, j] = w
            total = np.float32(total + w)
        if total != 0.0:
            for j in range(n):
                weights[i, j] = np.float32(weights[i, j] / total)
        first[i] = lo
        count[i] = n
    return first, count, weights


@njit(cache=True, inline="always")
def _unfused(count: int) -> int:
    """Taps after the first that ATen adds as a rounded product then a rounded sum; the rest are fused."""
    rest = count - 1
    return rest - rest % _UNFUSED_RUN


@njit(cache=True, inline="always")
def _round8(v: float) -> int:
    """torch.round (half to even) then the cast to uint8; v is in [0, 255.5)."""
    return np.uint8(np.rint(v))


@njit(cache=True, inline="always")
def _gather_rows(src, r0, rows, band):
    in_w = src.shape[1] // 3
    lanes = uint64(_LANES)
    row_len = uint64(src.shape[1])
    flat = src.reshape(-1)
    base = uint64(r0) * row_len
    for x in range(uint64(in_w - 1)):
        q0, d0 = base + x * uint64(3), x * lanes
        for r in range(uint64(rows)):
            q, d = q0 + r * row_len, d0 + r * uint64(4)
            a0, a1, a2, a3 = flat[q], flat[q + uint64(1)], flat[q + uint64(2)], flat[q + uint64(3)]
            band[d], band[d + uint64(1)], band[d + uint64(2)], band[d + uint64(3)] = a0, a1, a2, a3
    q0, d0 = base + uint64(in_w - 1) * uint64(3), uint64(in_w - 1) * lanes
    for r in range(uint64(rows)):
        q, d = q0 + r * row_len, d0 + r * uint64(4)
        band[d], band[d + uint64(1)], band[d + uint64(2)] = flat[q], flat[q + uint64(1)], flat[q + uint64(2)]


@njit(cache=True)
def _gather_band(src, r0, n, band):
    """band[x * _LANES + r * 4 + c] = src[r0 + r, x * 3 + c] for the band's n rows: per source pixel,
    its channels of all the rows side by side, 4 lanes per row (lanes of rows past n keep what they held).

    The 4th lane of a row is the next pixel's first byte, copied along so that a pixel is one 4-byte
    move; it is resampled with the rest and never stored. The last pixel copies 3, not to read past
    the frame."""
    # A whole band with the row count a constant: LLVM unrolls the row loop (~1.5x as fast).
    if n == BAND_ROWS:
        _gather_rows(src, r0, BAND_ROWS, band)
    else:
        _gather_rows(src, r0, n, band)


@njit(cache=True, inline="always")
def _horizontal_rows(band, r0, n, first, count, weights, acc, ring):
    out_w = first.shape[0]
    # A run-time count, so that LLVM vectorises the loops (4 AVX-512 or 8 AVX2 vectors of lanes)
    # where with the constant it unrolled them into scalar code.
    lanes = uint64(acc.shape[0])
    cap = ring.shape[0]
    row_len = uint64(ring.shape[1])
    flat = ring.reshape(-1)
    row_at = np.empty(BAND_ROWS, np.uint64)
    for r in range(n):
        row_at[r] = uint64((r0 + r) % cap) * row_len
    rows = uint64(n)
    last = uint64(out_w - 1)
    for xo in range(uint64(out_w)):
        lo, taps = uint64(first[xo]), count[xo]
        plain = _unfused(taps)
        w = weights[xo, 0]
        b = lo * lanes
        for i in range(lanes):
            acc[i] = float32(band[b + i]) * w
        for k in range(1, plain + 1):
            w = weights[xo, k]
            b = (lo + uint64(k)) * lanes
            for i in range(lanes):
                acc[i] = acc[i] + float32(band[b + i]) * w
        for k in range(plain + 1, taps):
            w = weights[xo, k]
            b = (lo + uint64(k)) * lanes
            for i in range(lanes):
                acc[i] = _fma(float32(band[b + i]), w, acc[i])
        # 4 floats per row stored as one (the 4th is overwritten by the next pixel's); the last pixel 3.
        d0 = xo * uint64(3)
        if xo < last:
            for r in range(rows):
                q, d = r * uint64(4), row_at[r] + d0
                a0, a1, a2, a3 = acc[q], acc[q + uint64(1)], acc[q + uint64(2)], acc[q + uint64(3)]
                flat[d], flat[d + uint64(1)], flat[d + uint64(2)], flat[d + uint64(3)] = a0, a1, a2, a3
        else:
            for r in range(rows):
                q, d = r * uint64(4), row_at[r] + d0
                flat[d], flat[d + uint64(1)], flat[d + uint64(2)] = acc[q], acc[q + uint64(1)], acc[q + uint64(2)]


@njit(cache=True)
def _horizontal_band(band, r0, n, first, count, weights, acc, ring):
    """The horizontal pass of the gathered band into ring rows (r0 + r) % ring rows, r < n.

    Per output pixel, the `_LANES` sums (n rows x 4 lanes) in acc, then stored row by row."""
    if n == BAND_ROWS:  # as in _gather_band
        _horizontal_rows(band, r0, BAND_ROWS, first, count, weights, acc, ring)
    else:
        _horizontal_rows(band, r0, n, first, count, weights, acc, ring)


@njit(cache=True)
def _round_row(row, out_row):
    for i in range(out_row.shape[0]):
        out_row[i] = _round8(row[i])


@njit(cache=True)
def _vertical_row(rows, cap, lo, taps, w_row, acc, out_row):
    """out_row = the vertical pass over rows[(lo + k) % cap] (float32 ring rows or uint8 source rows).

    In blocks of `_VERTICAL_BLOCK` columns, every tap of a block then its rounding: the sums stay
    in L1 while the ring rows stream past."""
    n = out_row.shape[0]
    plain = _unfused(taps)
    for i0 in range(0, n, _VERTICAL_BLOCK):
        m = min(_VERTICAL_BLOCK, n - i0)
        src = rows[lo % cap, i0:]
        w = w_row[0]
        for i in range(m):
            acc[i] = float32(src[i]) * w
        for k in range(1, plain + 1):
            src = rows[(lo + k) % cap, i0:]
            w = w_row[k]
            for i in range(m):
                acc[i] = acc[i] + float32(src[i]) * w
        for k in range(plain + 1, taps):
            src = rows[(lo + k) % cap, i0:]
            w = w_row[k]
            for i in range(m):
                acc[i] = _fma(float32(src[i]), w, acc[i])
        dst = out_row[i0:]
        for i in range(m):
            dst[i] = _round8(acc[i])


@njit(cache=True)
def _resize_frame(src, out, h_first, h_count, h_weights, v_first, v_count, v_weights, band, sums, ring, acc):
    """One frame: src (in_h, in_w * 3) -> out (out_h, out_w * 3), uint8; the passes its axes need."""
    in_h, out_h = src.shape[0], out.shape[0]
    if h_first.shape[0] == 0:  # the width keeps its size: the vertical pass alone, from the source rows
        for y in range(out_h):
            _vertical_row(src, in_h, v_first[y], v_count[y], v_weights[y], acc, out[y])
        return
    cap = ring.shape[0]
    y = 0
    for r0 in range(0, in_h, BAND_ROWS):
        n = min(BAND_ROWS, in_h - r0)
        _gather_band(src, r0, n, band)
        _horizontal_band(band, r0, n, h_first, h_count, h_weights, sums, ring)
        if v_first.shape[0] == 0:  # the height keeps its size: round the band's rows
            for r in range(r0, r0 + n):
                _round_row(ring[r % cap], out[r])
            continue
        done = r0 + n
        while y < out_h and v_first[y] + v_count[y] <= done:
            _vertical_row(ring, cap, v_first[y], v_count[y], v_weights[y], acc, out[y])
            y += 1


def _aligned(shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """Zeros on a 64-byte boundary. The horizontal pass's sums were measured 1.8x as slow when
    they started 16 bytes into a cache line (the loads and stores of their vectors split)."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(size + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start : start + size].view(dtype).reshape(shape)


def _check_size(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise MmError(f"float bilinear resize: {name} must be a positive integer, got {value!r}")
    return int(value)


class _Plan:
    """Weights and scratch for one (in_h, in_w) -> (out_h, out_w); reused for every frame of a call."""

    def __init__(self, in_h: int, in_w: int, out_h: int, out_w: int):
        empty_i, empty_w = np.zeros(0, np.int64), np.zeros((0, 1), np.float32)
        if out_w != in_w:
            self.h_first, self.h_count, self.h_weights = axis_plan(in_w, out_w)
        else:
            self.h_first, self.h_count, self.h_weights = empty_i, empty_i, empty_w
        if out_h != in_h:
            self.v_first, self.v_count, self.v_weights = axis_plan(in_h, out_h)
            # A window never spans more than the frame: an extreme narrowing holds the whole
            # intermediate, as ATen does, and no more.
            ring_rows = min(self.v_weights.shape[1], in_h) + BAND_ROWS
        else:
            self.v_first, self.v_count, self.v_weights = empty_i, empty_i, empty_w
            ring_rows = BAND_ROWS
        widen = out_w != in_w
        self.band = _aligned((in_w * _LANES if widen else 1,), np.uint8)
        self.ring = _aligned((ring_rows if widen else 1, out_w * 3), np.float32)
        self.sums = _aligned((_LANES,), np.float32)
        self.acc = _aligned((min(out_w * 3, _VERTICAL_BLOCK),), np.float32)

    def run(self, src: np.ndarray, out: np.ndarray) -> None:
        _resize_frame(
            src, out, self.h_first, self.h_count, self.h_weights, self.v_first, self.v_count, self.v_weights,
            self.band, self.sums, self.ring, self.acc,
        )  # fmt: skip


def resize_frames(frames: np.ndarray, out_h: int, out_w: int, out: np.ndarray | None = None) -> np.ndarray:
    """uint8 [T, H, W, 3] -> uint8 [T, out_h, out_w, 3], equal byte for byte to torchvision's
    `resize(torch.from_numpy(frames).permute(0, 3, 1, 2), [out_h, out_w], BILINEAR)` permuted back
    (antialias on; ATen's AVX2/AVX-512 CPU build). Written into `out` when given (C-contiguous,
    not overlapping `frames`), else into a new array; frames already of the target size are copied.
    Sizes from 1 pixel up, narrowing and widening; one thread."""
    out_h, out_w = _check_size("out_h", out_h), _check_size("out_w", out_w)
    if not isinstance(frames, np.ndarray) or frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
        shape = getattr(frames, "shape", None)
        raise MmError(f"float bilinear resize: expected uint8 frames [T, H, W, 3], got {type(frames).__name__} {shape}")
    if not frames.flags.c_contiguous:
        raise MmError("float bilinear resize: frames must be C-contiguous (np.ascontiguousarray copies them so)")
    t, in_h, in_w = frames.shape[:3]
    if in_h < 1 or in_w < 1:
        raise MmError(f"float bilinear resize: frames of {in_h}x{in_w} pixels")
    want = (t, out_h, out_w, 3)
    if out is None:
        out = np.empty(want, np.uint8)
    elif not isinstance(out, np.ndarray) or out.dtype != np.uint8 or out.shape != want or not out.flags.c_contiguous:
        shape = getattr(out, "shape", None)
        raise MmError(f"float bilinear resize: out must be a C-contiguous uint8 array {want}, got {shape}")
    elif np.may_share_memory(out, frames):
        raise MmError("float bilinear resize: out overlaps frames")
    if (in_h, in_w) == (out_h, out_w):
        np.copyto(out, frames)
        return out
    plan = _Plan(in_h, in_w, out_h, out_w)
    for i in range(t):
        plan.run(frames[i].reshape(in_h, in_w * 3), out[i].reshape(out_h, out_w * 3))
    return out


def resize_frame(frame: np.ndarray, out_h: int, out_w: int, out: np.ndarray | None = None) -> np.ndarray:
    """One uint8 [H, W, 3] frame -> [out_h, out_w, 3]: `resize_frames` on a batch of one."""
    if not isinstance(frame, np.ndarray) or frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        shape = getattr(frame, "shape", None)
        raise MmError(f"float bilinear resize: expected a uint8 frame [H, W, 3], got {type(frame).__name__} {shape}")
    if out is None:
        return resize_frames(frame[None], out_h, out_w)[0]
    resize_frames(frame[None], out_h, out_w, out[None] if isinstance(out, np.ndarray) else out)
    return out
