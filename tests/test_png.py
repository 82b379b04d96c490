"""decode_png: Pillow's pixels exactly, or None; never a different answer, never an exception.

Every positive check compares with `np.asarray(Image.open(b).convert("RGB"))` from the Pillow in
this environment, with zero tolerance, and runs both inflate paths (ISA-L first, and zlib only).
Images come from Pillow's encoder and from hand-built chunk streams whose rows use a chosen
filter type each, so that every filter meets the first row and the first column.
"""

import hashlib
import io
import struct
import tracemalloc
import warnings
import zlib

import numpy as np
import pytest
from conftest import GOLDEN, load_golden
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba import njit
from PIL import Image
from pngbuild import SIGNATURE, chunk, ihdr

from mmworker.common import png, png_rows
from mmworker.common.decode import MAX_IMAGE_PIXELS
from mmworker.common.png import decode_png
from mmworker.corpus import photo_like

# (bit depth, colour type) pairs decode_png handles, and the samples per pixel of each.
SUPPORTED = {
    (1, 0): 1, (2, 0): 1, (4, 0): 1, (8, 0): 1, (8, 2): 3,
    (1, 3): 1, (2, 3): 1, (4, 3): 1, (8, 3): 1, (8, 4): 2, (8, 6): 4,
}  # fmt: skip
PNG_CASES = [c for c in load_golden("decode_cases.json")["cases"] if c["format"] == "PNG"]


# --- building PNGs by hand -------------------------------------------------------------------


def pack_samples(samples: np.ndarray, depth: int) -> np.ndarray:
    """(h, n) samples of `depth` bits -> (h, ceil(n * depth / 8)) bytes, MSB first, zero-padded."""
    if depth == 8:
        return samples.astype(np.uint8)
    h, n = samples.shape
    per = 8 // depth
    padded = np.zeros((h, -(-n // per) * per), np.uint16)
    padded[:, :n] = samples
    groups = padded.reshape(h, -1, per)
    shifts = np.array([8 - depth * (k + 1) for k in range(per)], np.uint16)
    return (groups << shifts).sum(axis=2).astype(np.uint8)


def filter_rows(rows: np.ndarray, bpp: int, filters: list[int]) -> bytes:
    """Unfiltered byte rows (h, n) -> the filtered stream (filter byte + row) with filters[y] on row y."""
    h, n = rows.shape
    x = rows.astype(np.int16)
    up = np.zeros_like(x)
    up[1:] = x[:-1]
    left = np.zeros_like(x)
    left[:, bpp:] = x[:, :-bpp]
    upleft = np.zeros_like(x)
    upleft[1:, bpp:] = x[:-1, :-bpp]
    out = np.empty((h, n + 1), np.uint8)
    for y, f in enumerate(filters):
        a, b, c = left[y], up[y], upleft[y]
        if f == 0:
            pred = np.zeros_like(a)
        elif f == 1:
            pred = a
        elif f == 2:
            pred = b
        elif f == 3:
            pred = (a + b) >> 1
        else:
            pa, pb, pc = np.abs(b - c), np.abs(a - c), np.abs(a + b - 2 * c)
            pred = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
        out[y, 0] = f
        out[y, 1:] = ((x[y] - pred) & 255).astype(np.uint8)
    return out.tobytes()


def build_png(
    w: int, h: int, depth: int, colour: int, filtered: bytes, *, pre: bytes = b"", post: bytes = b"",
    level: int = 6, split: int | None = None, iend: bool = True,
) -> bytes:  # fmt: skip
    stream = zlib.compress(filtered, level)
    step = split or max(1, len(stream))
    idat = b"".join(chunk(b"IDAT", stream[i : i + step]) for i in range(0, len(stream), step))
    return SIGNATURE + ihdr(w, h, depth, colour) + pre + idat + post + (chunk(b"IEND", b"") if iend else b"")


def random_image(
    rng: np.random.Generator, w: int, h: int, depth: int, colour: int, filters: list[int] | None = None, **kw
) -> bytes:
    """A hand-built PNG of random samples (palette images get a random PLTE covering every index)."""
    samples = SUPPORTED[(depth, colour)]
    top = (1 << depth) - 1
    pre = kw.pop("pre", b"")
    if colour == 3:
        entries = int(rng.integers(1, top + 2))
        top = entries - 1
        pre = chunk(b"PLTE", rng.integers(0, 256, entries * 3, dtype=np.uint8).tobytes()) + pre
    values = rng.integers(0, top + 1, (h, w * samples), dtype=np.uint16)
    rows = pack_samples(values, depth)
    if filters is None:
        filters = rng.integers(0, 5, h).tolist()
    bpp = max(1, samples * depth // 8)
    return build_png(w, h, depth, colour, filter_rows(rows, bpp, filters), pre=pre, **kw)


# --- comparing with Pillow -------------------------------------------------------------------


def pillow_rgb(data: bytes) -> np.ndarray | None:
    """Pillow's answer: the RGB pixels, or None if it raised (any exception)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    except Exception:
        return None


def check(data: bytes, expect: str | None = None) -> None:
    """Ours equals Pillow's pixels or is None (always None where Pillow raised); on both inflate paths.

    expect: "decoded" (ours must not be None) or "none" (ours must be None).
    """
    want = pillow_rgb(data)
    for zlib_only in (False, True):
        got = decode_png(data, MAX_IMAGE_PIXELS, zlib_only=zlib_only)
        if expect == "decoded":
            assert got is not None, f"not decoded (zlib_only={zlib_only})"
        if expect == "none":
            assert got is None, f"decoded (zlib_only={zlib_only}) what we must leave to Pillow"
        if got is None:
            continue
        assert want is not None, "decoded a file Pillow refuses"
        pixels = got.pixels
        assert got.pil is None
        assert pixels.dtype == np.uint8 and pixels.flags.c_contiguous and pixels.shape[2] in (3, 4)
        assert pixels.shape[:2] == want.shape[:2]
        assert np.array_equal(pixels[:, :, :3], want), f"pixels differ from Pillow (zlib_only={zlib_only})"


def pil_png(image: Image.Image, **save) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG", **save)
    return buf.getvalue()


# --- the Paeth predictor ---------------------------------------------------------------------


@njit(cache=False)
def _paeth_table(out: np.ndarray) -> None:
    for a in range(256):
        for b in range(256):
            for c in range(256):
                out[(a * 256 + b) * 256 + c] = png_rows._paeth(np.int32(a), np.int32(b), np.int32(c))


def test_paeth_equals_the_spec_predictor_for_every_input():
    got = np.empty(1 << 24, np.int32)
    _paeth_table(got)
    a = np.arange(256, dtype=np.int32)[:, None, None]
    b = np.arange(256, dtype=np.int32)[None, :, None]
    c = np.arange(256, dtype=np.int32)[None, None, :]
    pa, pb, pc = np.abs(b - c), np.abs(a - c), np.abs(a + b - 2 * c)
    spec = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
    assert np.array_equal(got.reshape(256, 256, 256), np.broadcast_to(spec, (256, 256, 256)))


# --- Pillow-encoded images of every supported kind ---------------------------------------------

PHOTO = photo_like(97, 61, seed=5)
ALPHA = np.random.default_rng(2).integers(0, 256, PHOTO.shape[:2], dtype=np.uint8)


def pillow_encoded(kind: str, **save) -> bytes:
    rgb = Image.fromarray(PHOTO)
    if kind == "RGBA":
        return pil_png(Image.fromarray(np.dstack([PHOTO, ALPHA]), "RGBA"), **save)
    if kind == "LA":
        return pil_png(Image.fromarray(np.dstack([PHOTO[:, :, 0], ALPHA]), "LA"), **save)
    if kind.startswith("P"):
        bits = int(kind[1:])
        return pil_png(rgb.quantize(1 << bits), bits=bits, **save)
    return pil_png(rgb.convert(kind), **save)


@pytest.mark.parametrize("kind", ["RGB", "RGBA", "L", "LA", "1", "P8", "P4", "P2", "P1"])
@pytest.mark.parametrize("level", [0, 1, 6, 9])
def test_pillow_encoded_images(kind, level):
    check(pillow_encoded(kind, compress_level=level), expect="decoded")


def test_output_layouts():
    rgb = decode_png(pillow_encoded("RGB"), MAX_IMAGE_PIXELS)
    rgba = decode_png(pillow_encoded("RGBA"), MAX_IMAGE_PIXELS)
    grey = decode_png(pillow_encoded("L"), MAX_IMAGE_PIXELS)
    assert rgb.pixels.shape == (61, 97, 3) and np.array_equal(rgb.pixels, PHOTO)
    assert rgba.pixels.shape == (61, 97, 4) and np.array_equal(rgba.pixels[:, :, 3], ALPHA)
    assert grey.pixels.shape == (61, 97, 3)
    assert rgb.pil is None and rgb.width == 97 and rgb.height == 61


def test_photo_sized_rgb_png():
    data = pil_png(Image.fromarray(photo_like(1280, 720, seed=1)))
    check(data, expect="decoded")


def test_accepts_bytes_bytearray_and_memoryview():
    data = pillow_encoded("RGB")
    want = decode_png(data, MAX_IMAGE_PIXELS).pixels
    for form in (bytearray(data), memoryview(data), memoryview(b"xx" + data)[2:]):
        assert np.array_equal(decode_png(form, MAX_IMAGE_PIXELS).pixels, want)


# --- hand-built rows: each filter type, each layout --------------------------------------------


@pytest.mark.parametrize("layout", sorted(SUPPORTED), ids=lambda k: f"{k[0]}bit-ct{k[1]}")
@pytest.mark.parametrize("filter_type", [0, 1, 2, 3, 4])
@pytest.mark.parametrize(("w", "h"), [(1, 1), (1, 5), (5, 1), (2, 3), (13, 7)])
def test_every_filter_on_every_layout(layout, filter_type, w, h):
    rng = np.random.default_rng(hash((layout, filter_type, w, h)) & 0xFFFF)
    check(random_image(rng, w, h, *layout, filters=[filter_type] * h), expect="decoded")


@pytest.mark.parametrize("layout", sorted(SUPPORTED), ids=lambda k: f"{k[0]}bit-ct{k[1]}")
def test_mixed_filters_extreme_values(layout):
    # Rows of 0 and 255 next to each other make every predictor wrap around and tie.
    depth, colour = layout
    samples = SUPPORTED[layout]
    top = 1 if colour == 3 else (1 << depth) - 1
    w, h = 17, 25
    values = np.zeros((h, w * samples), np.uint16)
    values[::2, ::3] = top
    values[1::3, 1::2] = top
    pre = chunk(b"PLTE", bytes([0, 0, 0, 255, 255, 255])) if colour == 3 else b""
    rows = pack_samples(values, depth)
    filtered = filter_rows(rows, max(1, samples * depth // 8), [y % 5 for y in range(h)])
    check(build_png(w, h, depth, colour, filtered, pre=pre), expect="decoded")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=st.sampled_from(sorted(SUPPORTED)),
    w=st.integers(1, 300),
    h=st.integers(1, 300),
    level=st.integers(0, 9),
    split=st.one_of(st.none(), st.integers(1, 4096)),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_images_random_filters(layout, w, h, level, split, seed):
    rng = np.random.default_rng(seed)
    check(random_image(rng, w, h, *layout, level=level, split=split), expect="decoded")


def test_idat_in_one_byte_chunks_and_empty_chunks():
    rng = np.random.default_rng(3)
    data = random_image(rng, 40, 30, 8, 2, split=1)
    check(data, expect="decoded")
    # Empty IDAT chunks inside the run are allowed (Pillow skips them).
    head, _, _ = data.partition(b"IDAT")
    start = len(head) - 4
    empty = chunk(b"IDAT", b"")
    check(data[:start] + empty + data[start:], expect="decoded")


def test_small_window_streams_take_the_zlib_path():
    rng = np.random.default_rng(4)
    rows = rng.integers(0, 256, (20, 60), dtype=np.uint8)
    filtered = filter_rows(rows, 3, [4] * 20)
    compressor = zlib.compressobj(6, zlib.DEFLATED, 9)  # 512-byte window: CINFO = 1
    stream = compressor.compress(filtered) + compressor.flush()
    assert stream[0] != 0x78
    data = SIGNATURE + ihdr(20, 20, 8, 2) + chunk(b"IDAT", stream) + chunk(b"IEND", b"")
    check(data, expect="decoded")


# --- the golden fixtures -----------------------------------------------------------------------


@pytest.mark.parametrize("case", PNG_CASES, ids=lambda c: c["file"])
def test_golden_png_fixtures(case):
    data = (GOLDEN / "decode" / case["file"]).read_bytes()
    got = decode_png(data, MAX_IMAGE_PIXELS)
    # Ours: every 8-bit-or-less non-interlaced PNG. Adam7, 16-bit and the truncated file go to Pillow.
    leave_to_pillow = case["expected"] == "reject" or "adam7" in case["file"]
    if leave_to_pillow:
        assert got is None
        return
    assert got is not None
    assert (got.height, got.width) == (case["h"], case["w"])
    rgb = np.ascontiguousarray(got.pixels[:, :, :3])
    assert hashlib.sha256(rgb.tobytes()).hexdigest() == case["sha256"]


# --- chunks around the image data ---------------------------------------------------------------


def small_png(**kw) -> bytes:
    return random_image(np.random.default_rng(11), 9, 7, 8, 2, **kw)


@pytest.mark.parametrize(
    "pre",
    [
        chunk(b"gAMA", struct.pack(">I", 45455)),
        chunk(b"sRGB", b"\x00"),
        chunk(b"pHYs", struct.pack(">IIB", 3780, 3780, 1)),
        chunk(b"cHRM", bytes(32)),
        chunk(b"tEXt", b"Software\x00test"),
        chunk(b"tEXt", b"no separator"),
        chunk(b"zTXt", b"Comment\x00\x00" + zlib.compress(b"hello")),
        chunk(b"zTXt", b"Comment\x00\x00not zlib"),
        chunk(b"iTXt", b"XML:com.adobe.xmp\x00\x00\x00\x00\x00<x/>"),
        chunk(b"iTXt", b"Title\x00\x01\x00en\x00\x00" + zlib.compress("caf\u00e9".encode())),
        chunk(b"iCCP", b"sRGB\x00\x00" + zlib.compress(b"profile bytes")),
        chunk(b"eXIf", b"MM\x00*\x00\x00\x00\x08\x00\x00"),
        chunk(b"PLTE", bytes(range(30))),  # a suggested palette on an RGB image: ignored
        chunk(b"tRNS", b"\x00\x01\x00\x02\x00\x03"),
        chunk(b"prVt", b"private ancillary"),
        chunk(b"ABCD", b"unknown critical chunk: Pillow skips it"),
    ],
    ids=lambda c: c[4:8].decode(),
)
def test_ancillary_chunks_before_the_data_are_decoded_like_pillow(pre):
    check(small_png(pre=pre), expect="decoded")


@pytest.mark.parametrize(
    "pre",
    [
        chunk(b"gAMA", b"\x00\x01"),  # short: struct.error in Pillow
        chunk(b"sRGB", b""),
        chunk(b"pHYs", b"\x00" * 8),
        chunk(b"cHRM", bytes(7)),
        chunk(b"tRNS", b"\x00\x01"),  # RGB needs three values
        chunk(b"tRNS", b"\x01\x00\x00\x00\x00\x00"),  # outside the 8-bit range
        chunk(b"zTXt", b"Comment\x00\x01xx"),  # unknown compression method
        chunk(b"iCCP", b"name\x00\x01xx"),
        chunk(b"iCCP", b"no separator"),
        chunk(b"zTXt", b"Bomb\x00\x00" + zlib.compress(bytes(2 << 20))),  # over MAX_TEXT_CHUNK
        chunk(b"tEXt", b"interlace\x00yes"),  # Pillow would then decode as Adam7 and fail
        chunk(b"tEXt", b"transparency\x00x"),
        chunk(b"iTXt", b"bbox\x00\x00\x00\x00\x00x"),
        chunk(b"acTL", struct.pack(">II", 1, 0)),  # APNG
        chunk(b"fcTL", bytes(26)),
        chunk(b"gAMA", b"\x00\x00\xb1\x8f", crc=0),  # bad CRC on an ancillary chunk
        chunk(b"abcD", b"", crc=1),  # bad CRC on an unknown chunk
        b"\x00\x00\x00\x04ab!d\x00\x00\x00\x00\x00\x00\x00\x00",  # not a chunk type
        chunk(b"IHDR", struct.pack(">IIBBBBB", 9, 7, 8, 2, 0, 0, 0)),  # a second IHDR
        chunk(b"IEND", b""),  # IEND before the data
    ],
    ids=lambda c: c[4:8].decode(errors="replace"),
)
def test_chunks_before_the_data_we_leave_to_pillow(pre):
    check(small_png(pre=pre), expect="none")


@pytest.mark.parametrize(
    ("post", "expect"),
    [
        (chunk(b"tEXt", b"Comment\x00after the data"), "decoded"),
        (chunk(b"tEXt", b"Comment\x00bad crc", crc=0), "decoded"),  # CRCs are not checked after IDAT
        (chunk(b"IDAT", b"a stray IDAT after another chunk is skipped"), "decoded"),
        (b"garbage that is not a chunk", "decoded"),
        (b"\x00\x00", "decoded"),
        (struct.pack(">I", 1000) + b"tEXt" + b"cut short", "none"),  # Pillow: truncated read
        (chunk(b"tEXt", b"transparency\x001"), "none"),
        (chunk(b"zTXt", b"Comment\x00\x05x"), "none"),
        (chunk(b"PLTE", bytes(6)), "none"),
        (chunk(b"fcTL", bytes(26)), "none"),
    ],
    ids=lambda v: v[4:8].decode(errors="replace") if isinstance(v, bytes) else v,
)
def test_chunks_after_the_data(post, expect):
    # `post` goes between the image data and IEND; with garbage, Pillow stops reading there.
    check(small_png(post=chunk(b"tEXt", b"k\x00v") + post), expect=expect)


def test_missing_iend_and_trailing_bytes():
    check(small_png(iend=False), expect="decoded")
    check(small_png() + b"anything after IEND", expect="decoded")


def test_palette_rules():
    rng = np.random.default_rng(5)
    rows = np.array([[0, 1, 2, 1]] * 3, np.uint8)
    filtered = filter_rows(rows, 1, [0, 1, 4])
    plte = chunk(b"PLTE", bytes([10, 20, 30, 40, 50, 60, 70, 80, 90]))
    check(build_png(4, 3, 8, 3, filtered, pre=plte), expect="decoded")
    # tRNS keeps the palette colours (alpha is dropped, never composited).
    for trns in (b"\x00", b"\xff\x00", b"\x10\x80\xff", rng.integers(0, 256, 3, dtype=np.uint8).tobytes()):
        check(build_png(4, 3, 8, 3, filtered, pre=plte + chunk(b"tRNS", trns)), expect="decoded")
    # The last PLTE before the data counts (Pillow keeps the last one).
    other = chunk(b"PLTE", bytes(range(100, 109)))
    check(build_png(4, 3, 8, 3, filtered, pre=plte + other), expect="decoded")
    # Index beyond the palette (Pillow paints it black), no palette, or a malformed one: Pillow's call.
    short = chunk(b"PLTE", bytes([1, 2, 3, 4, 5, 6]))
    check(build_png(4, 3, 8, 3, filtered, pre=short), expect="none")
    check(build_png(4, 3, 8, 3, filtered), expect="none")
    check(build_png(4, 3, 8, 3, filtered, pre=chunk(b"PLTE", bytes(10))), expect="none")
    check(build_png(4, 3, 8, 3, filtered, pre=chunk(b"PLTE", bytes(771))), expect="none")


@pytest.mark.parametrize(("trns", "expect"), [(b"\x00\x07", "decoded"), (b"\x01\x07", "none"), (b"\x07", "none")])
def test_grey_transparency(trns, expect):
    rng = np.random.default_rng(6)
    check(random_image(rng, 8, 8, 8, 0, pre=chunk(b"tRNS", trns)), expect=expect)
    check(random_image(rng, 8, 8, 1, 0, pre=chunk(b"tRNS", trns)), expect="none" if len(trns) < 2 else "decoded")


# --- what we never decode ----------------------------------------------------------------------


def test_interlaced_and_sixteen_bit_are_left_to_pillow():
    rng = np.random.default_rng(7)
    data = random_image(rng, 8, 8, 8, 2)
    interlaced = SIGNATURE + ihdr(8, 8, 8, 2, interlace=1) + data[8 + 25 :]
    assert decode_png(interlaced, MAX_IMAGE_PIXELS) is None
    sixteen = pil_png(Image.fromarray(np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000))
    assert sixteen[24] == 16
    assert decode_png(sixteen, MAX_IMAGE_PIXELS) is None


def test_pixel_limit_is_checked_from_the_header_before_any_work(monkeypatch):
    data = pillow_encoded("RGB")  # 97 x 61 = 5917 pixels
    assert decode_png(data, 97 * 61) is not None

    def no_inflate(*args):
        raise AssertionError("inflated past the pixel limit")

    monkeypatch.setattr(png, "_inflate", no_inflate)
    assert decode_png(data, 97 * 61 - 1) is None
    # A tiny file claiming 40000 x 40000 (1.6 Gpx): refused without allocating anything image-sized.
    huge = SIGNATURE + ihdr(40000, 40000, 8, 2) + chunk(b"IDAT", zlib.compress(bytes(50_000))) + chunk(b"IEND", b"")
    tracemalloc.start()
    try:
        assert decode_png(huge, MAX_IMAGE_PIXELS) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_pillow_bomb_limit_is_respected(monkeypatch):
    data = pillow_encoded("RGB")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 2000)  # 97 x 61 > 2 x 2000: Image.open raises
    assert decode_png(data, MAX_IMAGE_PIXELS) is None


# --- corrupt data: never a crash or a hang, never an answer Pillow would not give ----------------


def test_bad_crcs():
    data = bytearray(small_png())
    check(bytes(data), expect="decoded")
    ihdr_crc = 8 + 8 + 13
    bad = bytearray(data)
    bad[ihdr_crc] ^= 1
    check(bytes(bad), expect="none")  # Pillow: "broken PNG file (bad header checksum in b'IHDR')"
    # Pillow never checks IDAT CRCs; neither do we.
    idat = data.index(b"IDAT")
    length = struct.unpack(">I", data[idat - 4 : idat])[0]
    bad = bytearray(data)
    bad[idat + 4 + length] ^= 0xFF
    check(bytes(bad), expect="decoded")


def test_bad_filter_type_and_short_streams():
    rng = np.random.default_rng(8)
    rows = rng.integers(0, 256, (6, 12), dtype=np.uint8)
    filtered = bytearray(filter_rows(rows, 3, [1] * 6))
    filtered[13 * 3] = 5
    check(build_png(4, 6, 8, 2, bytes(filtered)), expect="none")
    good = filter_rows(rows, 3, [1] * 6)
    # Ends early on a row boundary: Pillow returns black rows without an error; we leave it.
    assert pillow_rgb(build_png(4, 7, 8, 2, good)) is not None
    check(build_png(4, 7, 8, 2, good), expect="none")
    check(build_png(4, 6, 8, 2, good[:-5]), expect="none")  # ends mid-row: Pillow raises
    # More data than the image needs: Pillow stops at the last row, and so do we.
    check(build_png(4, 5, 8, 2, good), expect="decoded")
    # A stream whose Adler-32 is wrong: ISA-L refuses it; zlib (Pillow's library) decides.
    stream = bytearray(zlib.compress(good))
    stream[-1] ^= 1
    check(SIGNATURE + ihdr(4, 6, 8, 2) + chunk(b"IDAT", bytes(stream)) + chunk(b"IEND", b""))
    # Junk after the end of the zlib stream inside the IDAT data.
    check(SIGNATURE + ihdr(4, 6, 8, 2) + chunk(b"IDAT", zlib.compress(good) + b"junk") + chunk(b"IEND", b""))


def test_every_truncation_point():
    data = random_image(np.random.default_rng(9), 20, 15, 8, 6, split=200)
    for cut in range(len(data) + 1):
        check(data[:cut])


@pytest.mark.parametrize("field", ["ihdr_length", "idat_length", "width", "height"])
def test_wrong_length_and_size_fields(field):
    data = bytearray(random_image(np.random.default_rng(10), 20, 15, 8, 2, split=300))
    idat = data.index(b"IDAT")
    offsets = {"ihdr_length": 8, "idat_length": idat - 4, "width": 16, "height": 20}
    for value in (0, 1, 12, 14, 19, 21, 300, 0x7FFFFFFF, 0xFFFFFFFF):
        bad = bytearray(data)
        bad[offsets[field] : offsets[field] + 4] = struct.pack(">I", value)
        if field in ("width", "height"):  # keep the CRC right so the size itself is what is tested
            bad[29:33] = struct.pack(">I", zlib.crc32(bytes(bad[12:29])))
        check(bytes(bad))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), flips=st.integers(1, 4))
def test_random_corruption(seed, flips):
    rng = np.random.default_rng(seed)
    layout = sorted(SUPPORTED)[seed % len(SUPPORTED)]
    data = bytearray(random_image(rng, int(rng.integers(1, 40)), int(rng.integers(1, 40)), *layout, split=64))
    for _ in range(flips):
        data[int(rng.integers(8, len(data)))] ^= 1 << int(rng.integers(0, 8))
    check(bytes(data))


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=200))
def test_garbage_after_the_signature(body):
    check(SIGNATURE + body)
    check(SIGNATURE + ihdr(3, 2, 8, 2) + body)


def test_ihdr_fields_pillow_does_not_read():
    # Pillow reads a longer IHDR's first 13 bytes and never looks at the compression method byte.
    rng = np.random.default_rng(12)
    data = random_image(rng, 6, 5, 8, 2)
    body = bytearray(data[16:29])
    longer = SIGNATURE + chunk(b"IHDR", bytes(body) + b"\x00") + data[33:]
    check(longer, expect="decoded")
    body[10] = 1
    check(SIGNATURE + chunk(b"IHDR", bytes(body)) + data[33:], expect="decoded")
    body[10], body[11] = 0, 1  # filter method 1: Pillow raises "unknown filter category"
    check(SIGNATURE + chunk(b"IHDR", bytes(body)) + data[33:], expect="none")
    check(SIGNATURE + chunk(b"IHDR", bytes(body[:12])) + data[33:], expect="none")  # short IHDR
