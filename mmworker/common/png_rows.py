"""PNG image data to pixels: every row's filter undone and each layout expanded to RGB, in numba,
straight from the inflated stream into the output buffer (mmworker.common.png reads the file)."""

import numpy as np
from numba import njit

# How the unfiltered rows become output pixels.
KIND_DIRECT = 0  # the unfiltered row is the output row: RGB8 -> (h, w, 3), RGBA8 -> (h, w, 4)
KIND_GREY = 1  # grey at 1, 2, 4 or 8 bits -> replicated (Pillow's "1" and "L;n" unpackers)
KIND_GREY_ALPHA = 2  # grey+alpha 8-bit -> grey replicated, alpha dropped
KIND_PALETTE = 3  # palette index at 1, 2, 4 or 8 bits -> palette colour

# What `decode_rows` returns.
ROWS_OK = 0
BAD_FILTER = 1  # a row's filter type is not 0..4
BAD_INDEX = 2  # a palette index beyond the palette's entries


@njit(cache=True, inline="always")
def _paeth(a: int, b: int, c: int) -> int:
    """The PNG Paeth predictor (spec 9.4, ties to a, then b, then c) in stb_image's branch-free form.

    Equal to the spec's |p - a|, |p - b|, |p - c| comparison for all 2^24 inputs (checked in
    tests/test_png.py); it compiles to conditional moves and keeps the serial dependency on `a`
    (the pixel just decoded) short, which is what bounds Paeth rows.
    """
    thresh = c * 3 - (a + b)
    lo = min(a, b)
    hi = max(a, b)
    t0 = lo if hi <= thresh else c
    return hi if thresh <= lo else t0


# Row unfilters. Each takes the filter type, the filtered row `src` (filter byte excluded), the
# unfiltered row above `prv` (zeros for the first row, which turns Up into None, Average into
# left / 2 and Paeth into Sub exactly as the spec and Pillow's zeroed previous row do) and writes
# `dst`; False for an unknown filter type. The left neighbours are carried in registers: going
# through memory (dst[i - bpp]) puts a store-to-load round trip on the serial dependency.


@njit(cache=True, inline="always")
def _row3(f: int, src: np.ndarray, prv: np.ndarray, dst: np.ndarray, w: int) -> bool:
    """RGB8: 3 bytes per pixel, the output row laid out like the raw row."""
    n = 3 * w
    a0 = a1 = a2 = np.int32(0)
    c0 = c1 = c2 = np.int32(0)
    if f == 0:
        for i in range(n):
            dst[i] = src[i]
    elif f == 1:
        for p in range(w):
            x = 3 * p
            a0 = (np.int32(src[x]) + a0) & 255
            a1 = (np.int32(src[x + 1]) + a1) & 255
            a2 = (np.int32(src[x + 2]) + a2) & 255
            dst[x] = a0
            dst[x + 1] = a1
            dst[x + 2] = a2
    elif f == 2:
        for i in range(n):
            dst[i] = src[i] + prv[i]
    elif f == 3:
        for p in range(w):
            x = 3 * p
            a0 = (np.int32(src[x]) + ((a0 + np.int32(prv[x])) >> 1)) & 255
            a1 = (np.int32(src[x + 1]) + ((a1 + np.int32(prv[x + 1])) >> 1)) & 255
            a2 = (np.int32(src[x + 2]) + ((a2 + np.int32(prv[x + 2])) >> 1)) & 255
            dst[x] = a0
            dst[x + 1] = a1
            dst[x + 2] = a2
    elif f == 4:
        for p in range(w):
            x = 3 * p
            b0 = np.int32(prv[x])
            b1 = np.int32(prv[x + 1])
            b2 = np.int32(prv[x + 2])
            a0 = (np.int32(src[x]) + _paeth(a0, b0, c0)) & 255
            a1 = (np.int32(src[x + 1]) + _paeth(a1, b1, c1)) & 255
            a2 = (np.int32(src[x + 2]) + _paeth(a2, b2, c2)) & 255
            dst[x] = a0
            dst[x + 1] = a1
            dst[x + 2] = a2
            c0, c1, c2 = b0, b1, b2
    else:
        return False
    return True


@njit(cache=True, inline="always")
def _row4(f: int, src: np.ndarray, prv: np.ndarray, dst: np.ndarray, w: int) -> bool:
    """RGBA8: 4 bytes per pixel, the output row laid out like the raw row."""
    n = 4 * w
    a0 = a1 = a2 = a3 = np.int32(0)
    c0 = c1 = c2 = c3 = np.int32(0)
    if f == 0:
        for i in range(n):
            dst[i] = src[i]
    elif f == 1:
        for p in range(w):
            x = 4 * p
            a0 = (np.int32(src[x]) + a0) & 255
            a1 = (np.int32(src[x + 1]) + a1) & 255
            a2 = (np.int32(src[x + 2]) + a2) & 255
            a3 = (np.int32(src[x + 3]) + a3) & 255
            dst[x] = a0
            dst[x + 1] = a1
            dst[x + 2] = a2
            dst[x + 3] = a3
    elif f == 2:
        for i in range(n):
            dst[i] = src[i] + prv[i]
    elif f == 3:
        for p in range(w):
            x = 4 * p
            a0 = (np.int32(src[x]) + ((a0 + np.int32(prv[x])) >> 1)) & 255
            a1 = (np.int32(src[x + 1]) + ((a1 + np.int32(prv[x + 1])) >> 1)) & 255
            a2 = (np.int32(src[x + 2]) + ((a2 + np.int32(prv[x + 2])) >> 1)) & 255
            a3 = (np.int32(src[x + 3]) + ((a3 + np.int32(prv[x + 3])) >> 1)) & 255
            dst[x] = a0
            dst[x + 1] = a1
            dst[x + 2] = a2
            dst[x + 3] = a3
    elif f == 4:
        for p in range(w):
            x = 4 * p
            b0 = np.int32(prv[x])
            b1 = np.int32(prv[x + 1])
            b2 = np.int32(prv[x + 2])
            b3 = np.int32(prv[x + 3])
            a0 = (np.int32(src[x]) + _paeth(a0, b0, c0)) & 255
            a1 = (np.int32(src[x + 1]) + _paeth(a1, b1, c1)) & 255
            a2 = (np.int32(src[x + 2]) + _paeth(a2, b2, c2)) & 255
            a3 = (np.int32(src[x + 3]) + _paeth(a3, b3, c3)) & 255
            dst[x] = a0
            dst[x + 1] = a1
            dst[x + 2] = a2
            dst[x + 3] = a3
            c0, c1, c2, c3 = b0, b1, b2, b3
    else:
        return False
    return True


@njit(cache=True, inline="always")
def _row_bytes(f: int, src: np.ndarray, prv: np.ndarray, dst: np.ndarray, n: int, bpp: int) -> bool:
    """Any bytes-per-pixel (1 or 2 here: grey, palette, grey+alpha), byte by byte."""
    if f > 4:
        return False
    if f == 0:
        for i in range(n):
            dst[i] = src[i]
    elif f == 2:
        for i in range(n):
            dst[i] = src[i] + prv[i]
    elif bpp == 1:  # the serial filters with the left neighbour in a register
        a = c = np.int32(0)
        for i in range(n):
            b = np.int32(prv[i])
            if f == 1:
                a = (np.int32(src[i]) + a) & 255
            elif f == 3:
                a = (np.int32(src[i]) + ((a + b) >> 1)) & 255
            else:
                a = (np.int32(src[i]) + _paeth(a, b, c)) & 255
            dst[i] = a
            c = b
    else:
        for i in range(n):
            a = np.int32(dst[i - bpp]) if i >= bpp else np.int32(0)
            b = np.int32(prv[i])
            if f == 1:
                dst[i] = (np.int32(src[i]) + a) & 255
            elif f == 3:
                dst[i] = (np.int32(src[i]) + ((a + b) >> 1)) & 255
            else:
                c = np.int32(prv[i - bpp]) if i >= bpp else np.int32(0)
                dst[i] = (np.int32(src[i]) + _paeth(a, b, c)) & 255
    return True


@njit(cache=True)
def decode_rows(
    raw: np.ndarray, h: int, w: int, rowbytes: int, bpp: int, kind: int, depth: int, palette: np.ndarray,
    entries: int, out: np.ndarray, channels: int, scratch: np.ndarray,
) -> int:  # fmt: skip
    """Unfilter every row of `raw` and write the pixels into `out` (flat, `channels` bytes per pixel).

    `channels` is 3, or 4 for RGBA (which is `KIND_DIRECT`); every other kind expands to RGB.
    """
    stride = rowbytes + 1
    out_row = w * channels
    zero = np.zeros(max(out_row, rowbytes), np.uint8)
    mask = (1 << depth) - 1
    scale = 255 // mask  # 1-bit: 255, 2-bit: 85, 4-bit: 17, 8-bit: 1 (Pillow's "1"/"L;n" unpackers)
    for y in range(h):
        f = raw[y * stride]
        src = raw[y * stride + 1 : (y + 1) * stride]
        dst = out[y * out_row : (y + 1) * out_row]
        if kind == KIND_DIRECT:
            prv = zero[:out_row] if y == 0 else out[(y - 1) * out_row : y * out_row]
            ok = _row4(f, src, prv, dst, w) if bpp == 4 else _row3(f, src, prv, dst, w)
            if not ok:
                return BAD_FILTER
            continue
        cur = scratch[(y & 1) * rowbytes : ((y & 1) + 1) * rowbytes]
        prv = zero[:rowbytes] if y == 0 else scratch[(1 - (y & 1)) * rowbytes : (2 - (y & 1)) * rowbytes]
        if not _row_bytes(f, src, prv, cur, rowbytes, bpp):
            return BAD_FILTER
        # Expand to RGB; one loop per layout so that each is branch-free and vectorisable.
        if kind == KIND_GREY_ALPHA or (kind == KIND_GREY and depth == 8):
            step = 2 if kind == KIND_GREY_ALPHA else 1
            for x in range(w):
                v = cur[step * x]
                dst[3 * x] = v
                dst[3 * x + 1] = v
                dst[3 * x + 2] = v
        elif kind == KIND_PALETTE and depth == 8:
            top = np.uint8(0)
            for x in range(w):
                top = max(top, cur[x])
            if top >= entries:
                return BAD_INDEX
            for x in range(w):
                i = 3 * np.intp(cur[x])
                dst[3 * x] = palette[i]
                dst[3 * x + 1] = palette[i + 1]
                dst[3 * x + 2] = palette[i + 2]
        else:  # 1, 2 or 4 bits per sample, most significant first
            for x in range(w):
                bit = x * depth
                v = (np.intp(cur[bit >> 3]) >> (8 - depth - (bit & 7))) & mask
                if kind == KIND_PALETTE:
                    if v >= entries:
                        return BAD_INDEX
                    dst[3 * x] = palette[3 * v]
                    dst[3 * x + 1] = palette[3 * v + 1]
                    dst[3 * x + 2] = palette[3 * v + 2]
                else:
                    dst[3 * x] = dst[3 * x + 1] = dst[3 * x + 2] = v * scale
    return ROWS_OK
