"""4:2:0 colour JPEGs decoded by TurboJPEG into Y, Cb and Cr planes in lent memory, handed on as RGBX rows.

A streamed decode (`JpegRows.stream`) exists so that no whole decoded image is ever in memory at
once: at 12 MP 4-byte pixels are 48.8 MB, twice Qwen's pixel_values. TurboJPEG decodes much faster
than Pillow's row-at-a-time decoder but has no call that hands rows on as they decode; what it can
do is decode into planes at their sampled sizes (4:2:0: 1.5 bytes per pixel, 18.3 MB at 12 MP),
without upsampling or colour conversion. Those are redone here, in numba, exactly as libjpeg does
them after such a decode (fancy upsampling: the triangle filter of jdsample.c's
h2v2_fancy_upsample; then jdcolor.c's ycc_rgb_convert), band by band as the consumer takes rows.

The planes need memory, and memory fresh from the kernel costs a page fault per page the decoder
touches: with planes of their own the whole 12 MP preprocess was slower than with Pillow's stream,
and planes kept from call to call would stay resident beyond the memory bound. So the planes go
where the consumer writes its output anyway (`LentMemory`: Qwen's pixel_values, a shared-memory
slot in a worker): at the end of it, one group of two Y rows, a Cb row and a Cr row after another,
so that the planes are read front to back at the pace the output is written front to back. There
the 12 MP preprocess is faster than with Pillow's stream (bench/HISTORY.md has the runs). Before
anything is decoded the layout is checked against what the consumer says it will have written
after each band (`LentMemory.written`): no plane byte is overwritten before its last read, or the
planes are not used and Pillow streams the file as before.

The pixels equal libjpeg's own decode (Pillow's, TurboJPEG's RGB): the same library decodes the
planes (Debian's libturbojpeg0 is the libjpeg-turbo that Pillow-SIMD links), with Pillow's settings
(accurate integer IDCT), and the upsampling and conversion below are libjpeg's integer arithmetic
(tests compare every (Y, Cb, Cr) triple and whole files of odd sizes). A file about which libjpeg
has anything to say, warning or error, is left to Pillow, which says what it says about it.

libturbojpeg is optional: it is a system library (apt's libturbojpeg0, which scripts/setup.sh
installs), not a Python dependency, and an environment mmworker is pip-installed into may lack it.
Then `turbojpeg()` is None, `load()` logs one warning saying so, and every streamed decode goes
through Pillow's row ring (mmworker.common.jpeg_rows): the same pixels and the same memory bound,
only slower on large 4:2:0 files.
"""

import ctypes
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simplejpeg
from numba import float32, int32, njit, uint16, uint32

from mmworker.errors import MmError

log = logging.getLogger(__name__)

# libturbojpeg's flag (turbojpeg.h of libjpeg-turbo 2.x): a warning fails the call.
_TJFLAG_STOPONWARNING = 8192
_LIBRARY = "libturbojpeg.so.0"
# The planes start on a cache-line boundary.
_ALIGN = 64
# libjpeg upsamples chroma rows of 2 samples or fewer by replication, not the triangle filter
# (jdsample.c, jinit_upsampler); nothing that narrow is ever large enough to be streamed.
_MIN_WIDTH = 5


@dataclass(frozen=True)
class LentMemory:
    """Memory a streamed decode's consumer lends it: `buffer` (uint8, C-contiguous), of which the
    consumer will have written only the first `written(rows)` bytes once rows [0, rows) have been
    handed to it (`written` takes and returns int64 arrays)."""

    buffer: np.ndarray
    written: Callable[[np.ndarray], np.ndarray]


@functools.cache
def turbojpeg() -> ctypes.CDLL | None:
    """libturbojpeg, its functions typed, or None where it is missing (logged once); loaded once per
    process, at a worker's start (`load`) or on the first streamed decode."""
    try:
        lib = ctypes.CDLL(_LIBRARY)
    except OSError as exc:
        log.warning(
            "%s is not loadable (%s): large JPEGs stream through Pillow's decoder instead of TurboJPEG's "
            "planes; Debian's libturbojpeg0 (apt-get install libturbojpeg0) enables the faster path",
            _LIBRARY,
            exc,
        )
        return None
    handle, size = ctypes.c_void_p, ctypes.c_ulong
    lib.tjInitDecompress.restype = handle
    lib.tjInitDecompress.argtypes = []
    lib.tjDestroy.argtypes = [handle]
    lib.tjDecompressToYUVPlanes.argtypes = [
        handle, ctypes.c_void_p, size, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.POINTER(ctypes.c_int),
        ctypes.c_int, ctypes.c_int,
    ]  # fmt: skip
    return lib


@dataclass(frozen=True)
class PlaneLayout:
    """Where the planes of a width x height 4:2:0 image lie in the lent buffer (byte offsets)."""

    y_at: int  # Y row r at y_at + r * y_stride
    y_stride: int
    cb_at: int  # Cb row c at cb_at + c * c_stride; Cr likewise
    cr_at: int
    c_stride: int
    chroma_rows: int

    def array(self) -> np.ndarray:
        return np.array([self.y_at, self.y_stride, self.cb_at, self.cr_at, self.c_stride, self.chroma_rows], np.int64)


def plane_layout(width: int, height: int, lent: LentMemory, band: int) -> PlaneLayout | None:
    """The planes' place at the end of `lent.buffer`, or None if they do not fit there for a
    consumer that takes `band` rows at a time (some plane byte would be overwritten before its last read)."""
    if width < _MIN_WIDTH or height < 1:
        return None
    padded = width + (width & 1)  # TurboJPEG's plane width for 4:2:0 (tjPlaneWidth)
    chroma_rows = (height + 1) // 2
    group = 3 * padded  # Y row 2j, Cb row j, Y row 2j + 1, Cr row j
    base = (lent.buffer.size - group * chroma_rows) // _ALIGN * _ALIGN
    if base < 0:
        return None
    layout = PlaneLayout(base, group // 2, base + padded, base + padded + padded // 2 + padded, group, chroma_rows)
    # After each band but the last, the next rows read are Y row `end` and, one row back for the
    # upsampler's triangle filter at an even row, Cb row end // 2 - 1 (Cr lies after it).
    ends = np.arange(band, height, band, dtype=np.int64)
    first_chroma = np.maximum((ends >> 1) - 1 + (ends & 1), 0)
    first_read = np.minimum(layout.y_at + ends * layout.y_stride, layout.cb_at + first_chroma * group)
    if np.any(lent.written(ends) > first_read):
        return None
    return layout


def decode_planes(data: bytes | memoryview, width: int, height: int, lent: LentMemory, band: int) -> PlaneLayout | None:
    """TurboJPEG's decode of a 4:2:0 YCbCr file into the planes of `plane_layout`; None (nothing
    decoded) for any other file, one whose planes do not fit, one about which libjpeg warns or errs,
    or any file where libturbojpeg is missing."""
    buffer = lent.buffer
    if buffer.dtype != np.uint8 or buffer.ndim != 1 or not buffer.flags.c_contiguous or not buffer.flags.writeable:
        raise MmError(f"image decode: lent memory must be writable contiguous uint8, got {buffer.dtype} {buffer.shape}")
    lib = turbojpeg()
    if lib is None:
        return None
    # The header as mmworker.common.jpeg_rows.colour_jpeg_size reads it (TurboJPEG, ~2 us).
    try:
        h, w, colour_space, subsampling = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None
    if (w, h, colour_space, subsampling) != (width, height, "YCbCr", "420"):
        return None
    layout = plane_layout(width, height, lent, band)
    if layout is None:
        return None
    source = np.frombuffer(data, np.uint8)
    at = buffer.ctypes.data
    planes = (ctypes.c_void_p * 3)(at + layout.y_at, at + layout.cb_at, at + layout.cr_at)
    strides = (ctypes.c_int * 3)(layout.y_stride, layout.c_stride, layout.c_stride)
    handle = lib.tjInitDecompress()
    if not handle:
        raise MmError("image decode: TurboJPEG could not create a decompressor")
    try:
        status = lib.tjDecompressToYUVPlanes(
            handle, source.ctypes.data, source.size, planes, width, strides, height, _TJFLAG_STOPONWARNING
        )
    finally:
        lib.tjDestroy(handle)
    return layout if status == 0 else None


def load() -> None:
    """Load libturbojpeg and the conversion kernel (numba's cached machine code) now, so that a
    worker's first large JPEG does not pay for it. A missing library is logged (once), not raised:
    large JPEGs then stream through Pillow's decoder, and the kernel is never needed."""
    if turbojpeg() is None:
        return
    width = _MIN_WIDTH + 1
    memory = np.zeros(3 * width, np.uint8)
    layout = plane_layout(width, 2, LentMemory(memory, np.zeros_like), 2)
    hand_on_planes(memory, layout, width, 2, 2, lambda first, rows: None)


def hand_on_planes(
    buffer: np.ndarray, layout: PlaneLayout, width: int, height: int, band: int, sink: Callable[[int, np.ndarray], None]
) -> None:
    """Upsample and convert the decoded planes into RGBX rows, `band` at a time, each handed to
    `sink(first_row, rows)` (rows valid only during the call, as with JpegRows.stream)."""
    rows = np.empty((min(band, height), width, 4), np.uint8)
    words = rows.view(np.uint32).reshape(rows.shape[:2])
    where = layout.array()
    for first in range(0, height, band):
        n = min(band, height - first)
        _h2v2_to_rgbx(buffer, where, width, first, first + n, words)
        sink(first, rows[:n])


_ALPHA = np.uint32(0xFF000000)
# jdcolor.c's fixed-point factors (FIX(1.40200) etc., 16 fraction bits) as float32: with the Y
# term biased by 256.5 and the sum clamped to [256, 511], truncation gives libjpeg's
# (y + ((factor * c + ONE_HALF) >> 16)) clamped to [0, 255] exactly for every (Y, Cb, Cr), and
# float arithmetic vectorises where the 32-bit integer form does not (tests check all 2^24 triples).
_CR_R = np.float32(91881 / 65536)
_CB_G = np.float32(-22554 / 65536)
_CR_G = np.float32(-46802 / 65536)
_CB_B = np.float32(116130 / 65536)
_Y_BIAS = np.float32(256.5)
_LOW, _HIGH, _CENTRE = np.float32(256), np.float32(511), np.float32(128)
_U3, _U4, _U7, _U8 = np.uint16(3), np.uint16(4), np.uint16(7), np.uint16(8)


@njit(cache=True, inline="always")
def _channel(value):
    return uint32(int32(min(max(value, _LOW), _HIGH))) & uint32(255)


@njit(cache=True, inline="always")
def _upsample_row(near, far, sums, out):
    """jdsample.c's h2v2_fancy_upsample for one output row from chroma rows `near` (3/4) and `far`
    (1/4): 2 * len(near) samples, packed in pairs as the words of `out`. Every sum fits 16 bits
    (at most 16 * 255 + 8), and each step is cast back to them: numba widens integer arithmetic
    to 64 bits, 4 lanes of a 256-bit vector where uint16 takes 16."""
    columns = near.shape[0]
    for c in range(columns):
        sums[c] = uint16(uint16(_U3 * uint16(near[c])) + uint16(far[c]))
    out[0] = _pair(_U4 * sums[0], sums[0] * _U3 + sums[1])
    for c in range(1, columns - 1):
        middle = uint16(sums[c] * _U3)
        out[c] = _pair(middle + sums[c - 1], middle + sums[c + 1])
    last = columns - 1
    out[last] = _pair(sums[last] * _U3 + sums[last - 1], _U4 * sums[last])


@njit(cache=True, inline="always")
def _pair(left, right):
    """The two output samples of one chroma sample from its weighted sums: (s + 8) >> 4 for the
    left one, (s + 7) >> 4 for the right (libjpeg's alternating rounding), packed in a word."""
    low = uint16(uint16(uint16(left) + _U8) >> _U4)
    high = uint16(uint16(uint16(right) + _U7) >> _U4)
    return uint32(low) | (uint32(high) << uint32(16))


@njit(cache=True)
def _h2v2_to_rgbx(planes, where, width, first, stop, out):
    """Rows [first, stop) of a 4:2:0 image as RGBX words (R in the low byte, 255 in the high) into
    out[0 : stop - first]; `where` is `PlaneLayout.array()` into `planes`."""
    y_at, y_stride, cb_at, cr_at, c_stride, chroma_rows = where[0], where[1], where[2], where[3], where[4], where[5]
    columns = (width + 1) >> 1
    sums = np.empty(columns, np.uint16)
    cb = np.empty(2 * columns, np.uint16)
    cr = np.empty(2 * columns, np.uint16)
    cb_words, cr_words = cb.view(np.uint32), cr.view(np.uint32)
    for row in range(first, stop):
        near = row >> 1
        # libjpeg's context rows: the chroma row above for an even row, below for an odd one,
        # the edge rows repeated at the top and bottom.
        far = (near + 1 if near + 1 < chroma_rows else near) if row & 1 else (near - 1 if near > 0 else 0)
        near_at, far_at = near * c_stride, far * c_stride
        _upsample_row(
            planes[cb_at + near_at : cb_at + near_at + columns], planes[cb_at + far_at : cb_at + far_at + columns],
            sums, cb_words,
        )  # fmt: skip
        _upsample_row(
            planes[cr_at + near_at : cr_at + near_at + columns], planes[cr_at + far_at : cr_at + far_at + columns],
            sums, cr_words,
        )  # fmt: skip
        luma = planes[y_at + row * y_stride : y_at + row * y_stride + width]
        target = out[row - first]
        for x in range(width):
            y = float32(luma[x]) + _Y_BIAS
            b = float32(cb[x]) - _CENTRE
            r = float32(cr[x]) - _CENTRE
            target[x] = (
                _channel(_CR_R * r + y) | (_channel(_CB_G * b + (_CR_G * r + y)) << uint32(8))
                | (_channel(_CB_B * b + y) << uint32(16)) | _ALPHA
            )  # fmt: skip
