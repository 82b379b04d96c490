"""Qwen's pixel_values from horizontally resized pixels: the vertical pass, normalisation and patch order in one kernel.

pixel_values is float32 [gh * gw, 3 * tps * ps * ps] in Hugging Face's order (docs/behaviour.md §7.3),
or the same as bfloat16 (uint16 storage of bf16 bits: the spec's `feature_dtype`):
patches ordered (gh/m, gw/m, m, m) so each merge block of m x m patches is contiguous, and inside
a patch (channel, temporal copy, row, column). A still image is repeated `tps` times along the
temporal axis; a video's temporal patch holds `tps` distinct frames instead (`patchify_frames_into`,
the same kernel given the frames side by side).

The resize's vertical pass happens here, not before: every resampler runs it after the
horizontal one, on uint8 rows, with coefficients of its own axis (mmworker.common.resize), so
applying it in this loop gives the same bytes while the vertically resized image never exists
(one image-sized write and read fewer, and less memory per item). Per band of m * ps output
rows: each row is the vertical pass's fixed-point sum of source rows, clipped to uint8 and
normalised with the exact float32 operations of the processor being reproduced, into an L2-sized
band of channel planes; then every merge block is streamed out with non-temporal stores
(mmworker.common.stream): for patches of 14 or 16 pixels (every Qwen model) into a line-aligned
output, as whole lines shuffled from its patch rows in registers (each float loaded and stored
once); otherwise assembled in an L1 stage from 16-float copies first. Output is written in
order, one merge-block row at a time, so the source rows can arrive in bands (`PatchifyRows`) as
a JPEG decodes: each band of merge-block rows is written as soon as the rows it reads are in.

A bfloat16 output goes the same way: the band holds the exact float32 values, and each is
rounded to nearest even bf16 as it is streamed out (mmworker.common.stream), so it equals the
float32 output narrowed (torch's `.to(torch.bfloat16)`) bit for bit, with half the bytes written and
no float32 copy of the image. That rounding is exact for finite values only, and these are: a
clipped byte minus a finite offset, divided by a finite non-zero scale (the spec checks both).
"""

from dataclasses import dataclass

import numpy as np
from numba import float32, int32, int64, njit, uint32, uint64

from mmworker.common.jpeg_planes import LentMemory
from mmworker.common.stream import LINE_BYTES, LINE_FLOATS, copy_line, runs_to_lines, stream_fence, stream_out
from mmworker.errors import MmError


@dataclass(frozen=True)
class Normalisation:
    """Per channel: value = (v / divisor - offset) / scale, every operation in float32 (no divisor: none).

    `normalisation` builds it from a spec's mean and std the way each HF processor computes.
    """

    offset: np.ndarray  # float32 [3]
    scale: np.ndarray  # float32 [3]
    divisor: np.ndarray | None = None  # float32 [3]


def normalisation(mean: tuple[float, ...], std: tuple[float, ...], resample: str) -> Normalisation:
    """The normalisation each HF processor applies to a byte v of channel c:

    - "pil" (Qwen2VLImageProcessorPil): (v / 255 - mean) / std;
    - "aten_u8" (torchvision Qwen2VLImageProcessor, `_fuse_mean_std_and_rescale_factor`):
      (v - mean * 255) / (std * 255), the fused constants being float32 products.
    """
    mean32, std32 = np.asarray(mean, np.float32), np.asarray(std, np.float32)
    if resample == "pil":
        return Normalisation(offset=mean32, scale=std32, divisor=np.full(3, 255, np.float32))
    f255 = np.float32(255)
    return Normalisation(offset=mean32 * f255, scale=std32 * f255)


def patchify_into(
    pixels: np.ndarray,
    vertical: tuple[np.ndarray, np.ndarray, int],
    norm: Normalisation,
    patch: int,
    merge: int,
    temporal: int,
    out: np.ndarray,
) -> None:
    """Write pixel_values into out (float32 [gh * gw, 3 * temporal * patch^2], C-contiguous; or uint16
    of that shape, which receives bf16 bits: module docstring).

    `pixels`: (h, w, 4) uint8, C-contiguous, R, G, B and a byte that is ignored; w must be a
    multiple of patch * merge. `vertical`: (bounds, weights, precision) of the vertical pass from h
    rows to the output's height (mmworker.common.resize.vertical_coefficients), a multiple of
    patch * merge.
    """
    rows = PatchifyRows(vertical, norm, patch, merge, temporal, pixels.shape[:2], out)
    rows(0, pixels)
    rows.finish()


def patchify_frames_into(
    frames: np.ndarray,
    vertical: tuple[np.ndarray, np.ndarray, int],
    norm: Normalisation,
    patch: int,
    merge: int,
    out: np.ndarray,
) -> None:
    """The rows of one temporal patch of a video's pixel_values, into out (as `patchify_into`'s out, with
    temporal = len(frames)): temporal copy t is frames[t], where a still image repeats itself.

    `frames`: (temporal, h, w, 4) uint8, C-contiguous, each frame's pixels as `patchify_into` takes them;
    `vertical` the vertical pass from h rows to the output's height, applied to every frame alike.
    """
    if (
        not isinstance(frames, np.ndarray)
        or frames.dtype != np.uint8
        or frames.ndim != 4
        or frames.shape[3] != 4
        or not frames.flags.c_contiguous
    ):
        raise MmError(f"patchify: expected C-contiguous (t, h, w, 4) uint8 frames, got "
                      f"{getattr(frames, 'dtype', type(frames).__name__)} {getattr(frames, 'shape', '')}")  # fmt: skip
    if frames.ctypes.data % 4:
        raise MmError("patchify: frames must be 4-byte aligned")
    temporal, h, w = frames.shape[:3]
    # The checks of sizes, coefficients (every row they read lies in the frame) and out.
    rows = PatchifyRows(vertical, norm, patch, merge, temporal, (h, w), out)
    words = frames.reshape(temporal, h, w * 4).view(np.uint32)
    words.flags.writeable = False  # one numba specialisation, as in PatchifyRows
    _patchify(
        words, rows._bounds, 0, rows._weights, rows._precision, norm.divisor is not None, rows._divisor,
        norm.offset, norm.scale, patch, merge, temporal, out,
    )  # fmt: skip


def _check_pixels(pixels: np.ndarray) -> None:
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 4 or not pixels.flags.c_contiguous:
        raise MmError(f"patchify: expected C-contiguous (h, w, 4) uint8 pixels, got {pixels.dtype} {pixels.shape}")
    if pixels.ctypes.data % 4:
        raise MmError("patchify: pixels must be 4-byte aligned")


class PatchifyRows:
    """`patchify_into` for pixels that arrive in bands of rows: each merge-block row is written once its rows are in.

    A row sink (mmworker.common.jpeg_rows.RowSink): call it with consecutive bands `(first_row,
    rows)` of the (height, width) source, each repeating the last `overlap` rows of the one before
    (mmworker.common.resize.horizontal_rows hands them on so), then `finish()`. Output is written
    in order, so the bands may be all the memory the source ever has.
    """

    def __init__(
        self,
        vertical: tuple[np.ndarray, np.ndarray, int],
        norm: Normalisation,
        patch: int,
        merge: int,
        temporal: int,
        size: tuple[int, int],
        out: np.ndarray,
    ) -> None:
        bounds, weights, precision = vertical
        h, w = size
        block = patch * merge
        out_h = bounds.shape[0]
        if w % block or out_h % block or out_h == 0 or w == 0:
            raise MmError(f"patchify: {w}x{out_h} is not a positive multiple of {block} in both sides")
        if not 1 <= precision <= 22 or weights.shape[0] != out_h or bounds.shape != (out_h, 2):
            raise MmError(f"patchify: bad vertical pass coefficients (precision {precision})")
        expected = ((out_h // patch) * (w // patch), 3 * temporal * patch * patch)
        if out.dtype not in (np.float32, np.uint16) or out.shape != expected or not out.flags.c_contiguous:
            raise MmError(
                f"patchify: out must be C-contiguous float32 or uint16 (bf16) {expected}, got {out.dtype} {out.shape}"
            )
        self._bounds = np.ascontiguousarray(bounds, np.int32)
        self._weights = np.ascontiguousarray(weights, np.int32)
        # Source rows [start, end) each merge-block row reads; a block row is written in order,
        # once a band reaches its end (the running maximum, so that readiness is monotonic).
        self._starts, self._ends = np.empty(out_h // block, np.int64), np.empty(out_h // block, np.int64)
        self.overlap = _row_plan(self._bounds, self._weights.shape[1], h, block, self._starts, self._ends)
        if self.overlap < 0:
            raise MmError(f"patchify: vertical pass coefficients do not fit {h} source rows read in order")
        self._precision, self._norm, self._shape = precision, norm, (patch, merge, temporal)
        self._divisor = norm.divisor if norm.divisor is not None else np.ones(3, np.float32)
        self._width, self._block, self._out = w, block, out
        self._out_per_block_row = merge * (w // patch)  # rows of out one merge-block row fills
        self._done = 0  # merge-block rows written

    def __call__(self, first_row: int, pixels: np.ndarray) -> None:
        _check_pixels(pixels)
        n, w = pixels.shape[:2]
        if w != self._width:
            raise MmError(f"patchify: rows of {w} pixels, expected {self._width}")
        b0 = self._done
        b1 = int(np.searchsorted(self._ends, first_row + n, side="right"))
        if b1 <= b0:
            return
        if self._starts[b0] < first_row:  # (starts grow with the block row: bounds are in order)
            raise MmError(f"patchify: rows from {first_row} on do not hold every row merge-block row {b0} reads")
        norm, (patch, merge, temporal) = self._norm, self._shape
        # Always a read-only view: decoded and resized pixels come both ways, and numba compiles (and
        # caches) one specialisation per array type, which a worker's warm-up would have to cover.
        words = pixels.reshape(1, n, w * 4).view(np.uint32)
        words.flags.writeable = False
        step = self._out_per_block_row
        rows = slice(b0 * self._block, b1 * self._block)
        _patchify(
            words, self._bounds[rows], first_row, self._weights[rows], self._precision,
            norm.divisor is not None, self._divisor, norm.offset, norm.scale, patch, merge, temporal,
            self._out[b0 * step : b1 * step],
        )  # fmt: skip
        self._done = b1

    def lent(self) -> LentMemory:
        """`out` lent to the decode: how much of it is written once rows [0, r) have arrived."""
        block_row_bytes = self._out_per_block_row * self._out.shape[1] * self._out.itemsize

        def written(rows: np.ndarray) -> np.ndarray:
            return np.searchsorted(self._ends, rows, side="right") * block_row_bytes

        return LentMemory(self._out.reshape(-1).view(np.uint8), written)

    def finish(self) -> None:
        """Check that every merge-block row was written (every source row arrived)."""
        if self._done != self._starts.shape[0]:
            raise MmError(f"patchify: only {self._done} of {self._starts.shape[0]} merge-block rows had their rows")


# Patch rows of Qwen's sizes (14: Qwen2-VL, 2.5-VL; 16: Qwen3-VL, 3.5) streamed with no stage.
_ROWS_OF_14, _GROUP_OF_14 = runs_to_lines(14)
_ROWS_OF_16, _GROUP_OF_16 = runs_to_lines(16)


@njit(cache=True)
def _row_plan(bounds, taps, height, block, starts, ends):
    """Per merge-block row (`block` output rows): the first source row it reads into starts and
    the running maximum of its end into ends; returns the most rows one block row spans, or -1 if
    an output row reads rows outside [0, height), none, or more than `taps`, or the block rows'
    first rows go down (each band is checked against its first block row's start alone)."""
    overlap = 0
    for b in range(starts.shape[0]):
        start, end = height, 0
        for y in range(b * block, (b + 1) * block):
            first, count = bounds[y, 0], bounds[y, 1]
            if first < 0 or count < 1 or count > taps or first + count > height:
                return -1
            start, end = min(start, first), max(end, first + count)
        if b > 0 and start < starts[b - 1]:
            return -1
        overlap = max(overlap, end - start)
        starts[b], ends[b] = start, max(end, ends[b - 1]) if b > 0 else end
    return overlap


@njit(cache=True, error_model="numpy")
def _patchify(src, bounds, row0, weights, precision, pre_divide, divisor, offset, scale, patch, merge, temporal, out):
    """The kernel behind `patchify_into` and `patchify_frames_into`; src is F frames' pixels as uint32
    [F, h, w] (one word per pixel), from source row `row0` on (bounds count rows from 0, the same for
    every frame). F = 1: a still image, repeated over the `temporal` copies; F = temporal: temporal
    copy t is frame t (a video's frames of one temporal patch). out is float32, or uint16 for bf16
    bits: numba compiles one of each; they differ only in the streaming stores, which narrow the
    float32 band's values as they write them (mmworker.common.stream).

    Indices are unsigned on purpose: numba wraps negative signed indices, and that per-access
    branch keeps LLVM from vectorising. error_model="numpy": a float division may divide by zero
    without a check per element, which is what lets the normalisation vectorise.
    """
    n_frames = uint64(src.shape[0])
    n_w = uint64(src.shape[2])
    frame_rows = uint64(src.shape[1])
    pixels = src.reshape(-1)
    flat = out.reshape(-1)
    band_rows = merge * patch
    n_patch = uint64(patch)
    plane_floats = uint64(band_rows) * n_w  # one channel of a band
    # Rows are copied 16 floats at a time, up to 15 past a row's end: room for the last one.
    band = np.empty(n_frames * uint64(3) * plane_floats + uint64(LINE_FLOATS), np.float32)
    acc = np.empty(uint64(3) * n_w, np.int32)
    half, shift = int32(1 << (precision - 1)), int32(precision)
    ksize = uint64(weights.shape[1])
    taps = weights.reshape(-1)
    block = uint64(merge * merge * 3 * temporal) * n_patch * n_patch  # values of one merge block
    address = out.ctypes.data
    # A merge block of patch rows of 14 or 16 values goes straight from the band to out as whole
    # lines when out is line-aligned (a group is whole lines in float32 and bf16 alike, so every
    # block then starts on a line); otherwise it is assembled in an L1 stage and streamed.
    group = uint64(_GROUP_OF_14 if patch == 14 else _GROUP_OF_16 if patch == 16 else 0)
    direct = group > 0 and block % group == 0 and address % LINE_BYTES == 0
    # Where each patch row of a merge block starts in the band (frame f's channel c is plane f * 3 + c),
    # from the block's first column, in output order: sub-row, sub-column, channel, temporal copy, row.
    n_runs = block // n_patch
    runs = np.empty(n_runs, np.int64)
    k = 0
    for mh in range(merge):
        for mw in range(merge):
            for c in range(3):
                for t in range(temporal):
                    plane = uint64(t if n_frames > uint64(1) else 0) * uint64(3) + uint64(c)
                    corner = plane * plane_floats + uint64(mh) * n_patch * n_w + uint64(mw) * n_patch
                    for py in range(n_patch):
                        runs[k] = corner + py * n_w
                        k += 1
    stage = np.empty(uint64(0) if direct else block + uint64(LINE_FLOATS), np.float32)
    lines_per_row = uint64((patch + LINE_FLOATS - 1) // LINE_FLOATS)
    byte, g_shift, b_shift = uint32(255), uint32(8), uint32(16)
    two_w = n_w + n_w
    at = uint64(0)
    for b in range(bounds.shape[0] // band_rows):
        for fr in range(int64(n_frames) * band_rows):  # frame by frame, the band's rows of each
            f = fr // band_rows
            r = fr - f * band_rows
            y = uint64(b * band_rows + r)
            first, count = uint64(bounds[y, 0] - row0) + uint64(f) * frame_rows, uint64(bounds[y, 1])
            # The vertical pass, per channel plane, straight from the packed pixels.
            for i in range(uint64(3) * n_w):
                acc[i] = half
            k = uint64(0)
            while k + uint64(1) < count:  # two taps per sweep: half the accumulator traffic
                tap, tap2 = taps[y * ksize + k], taps[y * ksize + k + uint64(1)]
                row = (first + k) * n_w
                row2 = row + n_w
                for x in range(n_w):
                    p, q = pixels[row + x], pixels[row2 + x]
                    acc[x] = int32(acc[x] + int32(p & byte) * tap + int32(q & byte) * tap2)
                    acc[n_w + x] = int32(
                        acc[n_w + x] + int32((p >> g_shift) & byte) * tap + int32((q >> g_shift) & byte) * tap2
                    )
                    acc[two_w + x] = int32(
                        acc[two_w + x] + int32((p >> b_shift) & byte) * tap + int32((q >> b_shift) & byte) * tap2
                    )
                k += uint64(2)
            if k < count:
                tap = taps[y * ksize + k]
                row = (first + k) * n_w
                for x in range(n_w):
                    p = pixels[row + x]
                    acc[x] = int32(acc[x] + int32(p & byte) * tap)
                    acc[n_w + x] = int32(acc[n_w + x] + int32((p >> g_shift) & byte) * tap)
                    acc[two_w + x] = int32(acc[two_w + x] + int32((p >> b_shift) & byte) * tap)
            for c in range(3):
                d, o, s = divisor[c], offset[c], scale[c]
                a0, o0 = uint64(c) * n_w, (uint64(f) * uint64(3) + uint64(c)) * plane_floats + uint64(r) * n_w
                if pre_divide:
                    for x in range(n_w):
                        v = min(max(acc[a0 + x] >> shift, 0), 255)
                        band[o0 + x] = (float32(v) / d - o) / s
                else:
                    for x in range(n_w):
                        v = min(max(acc[a0 + x] >> shift, 0), 255)
                        band[o0 + x] = (float32(v) - o) / s
        for j in range(src.shape[2] // band_rows):
            x0 = uint64(j * merge) * n_patch  # the block's first column in the band
            if direct:
                if patch == 14:
                    _ROWS_OF_14(flat, at, band, x0, runs, block // group)
                else:
                    _ROWS_OF_16(flat, at, band, x0, runs, block // group)
                at += block
                continue
            # One merge block staged in output order: each run of `patch` floats is copied as whole
            # lines; what a line writes past the run's end is overwritten by the next run, and the
            # last one lands in the padding.
            for k in range(n_runs):
                q, staged = x0 + uint64(runs[k]), uint64(k) * n_patch
                for line in range(lines_per_row):
                    step = line * uint64(LINE_FLOATS)
                    copy_line(stage, staged + step, band, q + step)
            stream_out(flat, at, stage, block, address)
            at += block
    stream_fence()
