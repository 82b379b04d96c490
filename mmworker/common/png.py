"""PNG decoding to RGB8 pixels, equal to `PIL.Image.open(b).convert("RGB")` for the PNGs it accepts.

`decode_png` returns the same pixels Pillow would, or None when it is not sure it would; the caller
then decodes with Pillow, which gives Pillow's answer (pixels or error) by definition. It never
raises for bad input. What it reads and why that is Pillow's behaviour (PngImagePlugin and
ZipDecode.c, Pillow 12):

- Chunks before the first IDAT: Pillow reads each one fully and checks its CRC (any chunk,
  critical or not, known or not). We do the same and give up (None) on a short chunk, a bad CRC or
  a chunk type that is not four word characters. Unknown chunks, even critical ones, are skipped,
  as Pillow skips them. The known chunks whose handler can raise, or whose contents change what
  Pillow decodes, are checked the way the handler would read them (`_chunk_ok`).
- Image data: the consecutive IDAT chunks starting at the first one, concatenated; IDAT CRCs are
  never checked (Pillow does not check them either). Pillow inflates until it has `height` rows
  and then stops, without looking at what follows (the Adler-32, extra rows, trailing bytes).
  We accept exactly that case: at least height * (1 + row bytes) inflated bytes, every row's
  filter byte 0..4. A stream that ends early, or that zlib rejects before the last row, is None
  (Pillow returns a partly black image in one case and raises in the other).
- Chunks after the image data: Pillow walks them without checking CRCs until IEND, the end of
  the file or a chunk type it cannot parse, and raises if a chunk is cut short. Text chunks there
  still count against its text-memory limit and can still set `info["transparency"]`, which
  `convert` reads. We mirror the walk and give up where Pillow could raise.
- Never handled here (None): Adam7 interlacing, 16-bit samples, APNG (acTL/fcTL/fdAT), a palette
  image without a usable PLTE or with an index beyond it, a tRNS value outside the sample range,
  text chunks named like the `info` keys Pillow's decoder reads (`interlace`, `bbox`,
  `transparency`), and anything else unusual (see the code: every early `return None`).

Output: (h, w, 3) RGB, except RGBA sources, which keep their alpha as a fourth byte (h, w, 4);
it is ignored downstream, never composited. Grey is replicated, grey+alpha loses its alpha,
palette indices become palette colours. Three bytes per pixel rather than RGBX because an RGB8 row
then unfilters straight into its output row (None and Up become vectorised copies/adds) and the
downstream consumers (numba resamplers, `RgbImage.to_pil`) take either layout at the same speed
(bench/bench_png.py).

Inflate: ISA-L (`isal`) when the zlib header is the ordinary one (32 KiB window, no preset
dictionary) and the stream decodes completely to exactly the expected size with a valid Adler-32;
zlib (Pillow's own library, with Pillow's stop-at-the-last-row semantics) otherwise. Inflating a
valid stream has one correct answer, so both give the same bytes; ISA-L is several times faster. The one
difference is in what they refuse: ISA-L accepts some malformed Huffman tables that zlib rejects
(incomplete codes, more than 286/30 codes). A stream like that which still decodes to the right
length with a matching Adler-32 does not come out of any real encoder, but it can be built by
hand; `zlib_only=True` gives Pillow's verdict on such streams as well.

Buffers: the inflated stream (one `bytes` of exactly height * (1 + row bytes)) and the output
pixels are the only image-sized buffers; the unfilter kernel (`png_rows.decode_rows`) reads the
first and writes the second directly (through a two-row scratch for the layouts that need
expanding). The compressed data is joined into one buffer when it spans several IDAT chunks (it
usually does: Pillow writes 64 KiB chunks, libpng 8 KiB), and viewed in place when it does not.
"""

import re
import struct
import zlib
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
from isal import isal_zlib
from PIL import Image, PngImagePlugin

from mmworker.common.pixels import RgbImage
from mmworker.common.png_rows import (
    KIND_DIRECT,
    KIND_GREY,
    KIND_GREY_ALPHA,
    KIND_PALETTE,
    ROWS_OK,
    decode_rows,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# PngImagePlugin.is_cid: Pillow stops (or, before the image data, fails) on any other chunk type.
_IS_CID = re.compile(rb"\w\w\w\w").match
_U32 = struct.Struct(">I")

# (bit depth, colour type) -> (Pillow mode, kind, bytes per complete pixel (the filter unit),
# samples per pixel)
_LAYOUTS = MappingProxyType(
    {
        (1, 0): ("1", KIND_GREY, 1, 1),
        (2, 0): ("L", KIND_GREY, 1, 1),
        (4, 0): ("L", KIND_GREY, 1, 1),
        (8, 0): ("L", KIND_GREY, 1, 1),
        (8, 2): ("RGB", KIND_DIRECT, 3, 3),
        (1, 3): ("P", KIND_PALETTE, 1, 1),
        (2, 3): ("P", KIND_PALETTE, 1, 1),
        (4, 3): ("P", KIND_PALETTE, 1, 1),
        (8, 3): ("P", KIND_PALETTE, 1, 1),
        (8, 4): ("LA", KIND_GREY_ALPHA, 2, 2),
        (8, 6): ("RGBA", KIND_DIRECT, 4, 4),
    }
)

# info keys that Pillow's PNG loading or `convert` reads back. A text chunk with one of these
# names overwrites the value (with a str): "interlace" makes Pillow decode as Adam7, "bbox" becomes
# the decode extent, "transparency" goes into convert's transparency handling.
_INFO_KEYS_PILLOW_READS = frozenset({b"interlace", b"bbox", b"transparency"})

# Chunks whose handlers we do not mirror: APNG frames (Pillow composites and crops them) and
# Pillow's second kind of image-data chunk (load_read continues the image data into DDAT/fdAT).
_UNHANDLED = frozenset({b"acTL", b"fcTL", b"fdAT", b"DDAT"})


@dataclass(eq=False)
class _Header:
    """What the chunk walk found: IHDR fields, the palette, the image data chunks, the text-memory count."""

    width: int
    height: int
    depth: int
    colour: int
    mode: str
    palette: bytes | None = None
    text_memory: int = 0
    idat: list[memoryview] = field(default_factory=list)


def decode_png(data: bytes | memoryview, max_pixels: int, *, zlib_only: bool = False) -> RgbImage | None:
    """RGB8 pixels of a PNG exactly as Pillow's `convert("RGB")` gives them, or None to leave it to Pillow.

    None means: not a PNG we handle (interlaced, 16-bit, APNG, ...), a file Pillow might treat
    differently (corrupt, truncated, odd chunks), or more than `max_pixels` pixels (checked from
    IHDR before anything image-sized is allocated; Pillow's path then reports the limit).
    `zlib_only` inflates with zlib alone, so that even malformed deflate streams get Pillow's
    verdict (see the module docstring).
    """
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        if not view.c_contiguous:
            return None
        view = view.cast("B")
    header = _read_chunks(view, max_pixels)
    if header is None:
        return None
    _, kind, bpp, samples = _LAYOUTS[(header.depth, header.colour)]
    w, h = header.width, header.height
    rowbytes = (w * samples * header.depth + 7) // 8
    raw = _inflate(header.idat, h * (rowbytes + 1), zlib_only)
    if raw is None:
        return None
    palette = np.zeros(256 * 3, np.uint8)
    entries = 0
    if header.palette is not None:
        entries = len(header.palette) // 3
        palette[: len(header.palette)] = np.frombuffer(header.palette, np.uint8)
    channels = 4 if header.colour == 6 else 3  # RGBA keeps its alpha byte: it costs nothing to keep
    out = np.empty((h, w, channels), np.uint8)
    scratch = np.empty(0 if kind == KIND_DIRECT else 2 * rowbytes, np.uint8)
    status = decode_rows(
        np.frombuffer(raw, np.uint8), h, w, rowbytes, bpp, kind, header.depth, palette, entries,
        out.reshape(-1), channels, scratch,
    )  # fmt: skip
    if status != ROWS_OK:
        return None
    return RgbImage(pixels=out, pil=None)


def _read_chunks(view: memoryview, max_pixels: int) -> _Header | None:
    """Walk the chunks the way PngImageFile.open and .load do; None wherever Pillow might not succeed."""
    size = len(view)
    if size < 8 or view[:8] != PNG_SIGNATURE:
        return None
    header = _read_ihdr(view, max_pixels)
    if header is None:
        return None
    pos = 8 + 8 + _U32.unpack_from(view, 8)[0] + 4
    # Chunks before the image data: complete, CRC-checked, handler-checked (PngImageFile._open).
    while True:
        if pos + 8 > size:
            return None
        length = _U32.unpack_from(view, pos)[0]
        cid = bytes(view[pos + 4 : pos + 8])
        if not _IS_CID(cid):
            return None
        body, end = pos + 8, pos + 8 + length
        if cid == b"IDAT":
            break
        if cid in (b"IEND", b"IHDR") or end + 4 > size:
            return None
        chunk = view[body:end]
        if zlib.crc32(chunk, zlib.crc32(cid)) != _U32.unpack_from(view, end)[0]:
            return None
        if cid == b"PLTE":
            if header.mode == "P":  # Pillow keeps the last PLTE, and only for palette images
                header.palette = bytes(chunk)
        elif not _chunk_ok(cid, chunk, header):
            return None
        pos = end + 4
    if header.mode == "P":
        pal = header.palette
        if pal is None or len(pal) % 3 or not 3 <= len(pal) <= 768:
            return None
    # The image data: the IDAT chunks that follow one another from the first (PngImageFile.load_read).
    # A cut-short chunk here is None: whether Pillow then raises depends on where zlib stopped.
    while True:
        if end + 4 > size:
            return None
        header.idat.append(view[body:end])
        pos = end + 4
        if pos + 8 > size:
            return header
        length = _U32.unpack_from(view, pos)[0]
        if bytes(view[pos + 4 : pos + 8]) != b"IDAT":
            break
        body, end = pos + 8, pos + 8 + length
    # Chunks after the image data (PngImageFile.load_end): no CRC checks; stop at IEND, at the end of
    # the file or at an unparseable chunk type; a cut-short chunk makes Pillow raise.
    while pos + 8 <= size:
        length = _U32.unpack_from(view, pos)[0]
        cid = bytes(view[pos + 4 : pos + 8])
        if not _IS_CID(cid) or cid == b"IEND":
            break
        body, end = pos + 8, pos + 8 + length
        if end > size or cid in (b"IHDR", b"PLTE"):
            return None
        if cid != b"IDAT" and not _chunk_ok(cid, view[body:end], header):
            return None
        pos = end + 4
    return header


def _read_ihdr(view: memoryview, max_pixels: int) -> _Header | None:
    # Pillow accepts IHDR anywhere before the image data and a longer-than-13-byte one; we want it
    # first, and exactly as Pillow reads it: width, height, depth, colour, then filter method 0 and
    # interlace 0 (any non-zero byte means Adam7 to Pillow). The compression method byte is not
    # read by Pillow, so neither is it here.
    if len(view) < 8 + 8 + 13 + 4 or bytes(view[12:16]) != b"IHDR":
        return None
    length = _U32.unpack_from(view, 8)[0]
    if length < 13 or 16 + length + 4 > len(view):
        return None
    chunk = view[16 : 16 + length]
    if zlib.crc32(chunk, zlib.crc32(b"IHDR")) != _U32.unpack_from(view, 16 + length)[0]:
        return None
    width, height = _U32.unpack_from(chunk, 0)[0], _U32.unpack_from(chunk, 4)[0]
    depth, colour, filter_method, interlace = chunk[8], chunk[9], chunk[11], chunk[12]
    layout = _LAYOUTS.get((depth, colour))
    if layout is None or filter_method != 0 or interlace != 0:
        return None
    if width == 0 or height == 0 or width * height > max_pixels:
        return None
    bomb = Image.MAX_IMAGE_PIXELS  # Image.open refuses more than twice this (DecompressionBombError)
    if bomb is not None and width * height > 2 * bomb:
        return None
    return _Header(width=width, height=height, depth=depth, colour=colour, mode=layout[0])


def _chunk_ok(cid: bytes, chunk: memoryview, header: _Header) -> bool:
    """Whether Pillow's handler for this chunk (PngStream.chunk_*) neither raises nor alters the decode."""
    n = len(chunk)
    if cid == b"tRNS":
        return _transparency_ok(bytes(chunk), header.mode)
    if cid == b"gAMA":
        return n >= 4
    if cid == b"cHRM":
        return n % 4 == 0
    if cid == b"sRGB":
        return n >= 1
    if cid == b"pHYs":
        return n >= 9
    if cid in (b"tEXt", b"zTXt", b"iTXt"):
        return _text_ok(cid, bytes(chunk), header)
    if cid == b"iCCP":
        s = bytes(chunk)
        i = s.find(b"\0")
        if i + 1 >= n or s[i + 1] != 0:  # IndexError / "Unknown compression method" in Pillow
            return False
        try:
            return _inflate_text(s[i + 2 :]) is not None
        except zlib.error:
            return True  # Pillow drops a profile zlib cannot read, and goes on
    return cid not in _UNHANDLED and cid not in (b"IHDR", b"PLTE", b"IEND", b"IDAT")


def _transparency_ok(s: bytes, mode: str) -> bool:
    # Pillow stores tRNS for P (bytes or an index: always fine), "1" and L (one 16-bit value) and
    # RGB (three); it ignores it for LA and RGBA. Short values make its struct unpacking raise; values
    # outside the 8-bit range go through convert's putpixel, which we do not want to second-guess.
    if mode in ("1", "L"):
        return len(s) >= 2 and (mode == "1" or _U32.unpack(b"\0\0" + s[:2])[0] <= 255)
    if mode == "RGB":
        return len(s) >= 6 and all(s[i] == 0 for i in (0, 2, 4))
    return True


def _text_ok(cid: bytes, s: bytes, header: _Header) -> bool:
    """Mirror PngStream.chunk_tEXt / zTXt / iTXt: their errors and their text-memory count."""
    key, sep, value = s.partition(b"\0")
    if cid == b"tEXt":
        text = len(value)  # latin-1: one character per byte
    elif cid == b"zTXt":
        if value and value[0] != 0:
            return False  # "Unknown compression method in zTXt chunk"
        try:
            plain = _inflate_text(value[1:])
        except zlib.error:
            plain = b""
        if plain is None:
            return False
        text = len(plain)
    else:
        if not sep or len(value) < 2:
            return True  # Pillow returns without storing anything
        flag, method, rest = value[0], value[1], value[2:]
        parts = rest.split(b"\0", 2)
        if len(parts) < 3:
            return True
        itxt = parts[2]
        if flag != 0:
            if method != 0:
                return True
            try:
                inflated = _inflate_text(itxt)
            except zlib.error:
                return True
            if inflated is None:
                return False
            itxt = inflated
        try:
            parts[0].decode("utf-8")
            parts[1].decode("utf-8")
            text = len(itxt.decode("utf-8"))
        except UnicodeError:
            return True
    if not key:
        return True
    if key in _INFO_KEYS_PILLOW_READS:
        return False
    header.text_memory += text
    return header.text_memory <= PngImagePlugin.MAX_TEXT_MEMORY


def _inflate_text(s: bytes) -> bytes | None:
    # PngImagePlugin._safe_zlib_decompress, with its ValueError ("too large") as None.
    inflater = zlib.decompressobj()
    plain = inflater.decompress(s, PngImagePlugin.MAX_TEXT_CHUNK)
    return None if inflater.unconsumed_tail else plain


def _inflate(parts: list[memoryview], size: int, zlib_only: bool) -> bytes | None:
    """The first `size` bytes of the zlib stream in `parts`, or None where Pillow would not get them."""
    stream = parts[0] if len(parts) == 1 else b"".join(parts)
    # ISA-L only for the standard header: deflate, 32 KiB window (so "distance too far back" means
    # the same to both libraries), no preset dictionary. It must reach the end of the stream,
    # Adler-32 checked, with exactly `size` bytes out; asking for one byte more than that both
    # detects longer streams and bounds the work a hostile stream can cause. Anything else goes
    # to zlib, which decides.
    if not zlib_only and len(stream) >= 2 and stream[0] == 0x78 and not stream[1] & 0x20:
        inflater = isal_zlib.decompressobj()
        try:
            raw = inflater.decompress(stream, size + 1)
        except isal_zlib.error:
            raw = b""
        if inflater.eof and len(raw) == size:
            return raw
    # Pillow's semantics: inflate until the image is full; ignore whatever follows.
    try:
        raw = zlib.decompressobj().decompress(stream, size)
    except zlib.error:
        return None
    return raw if len(raw) == size else None
