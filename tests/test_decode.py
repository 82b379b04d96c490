"""image_decode_rgb: PIL-equal RGB8 for the accepted formats, clear refusals for everything else."""

import hashlib
import io
import os
import re
import resource
import zlib

import numpy as np
import pytest
from conftest import GOLDEN, load_golden
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from pngbuild import SIGNATURE, chunk, ihdr

from mmworker import MmError
from mmworker.common import image_decode_rgb
from mmworker.common.decode import MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE, decode_image

CASES = load_golden("decode_cases.json")["cases"]


def fixture_bytes(name: str) -> bytes:
    return (GOLDEN / "decode" / name).read_bytes()


def png_claiming(width: int, height: int, idat: bytes) -> bytes:
    return SIGNATURE + ihdr(width, height, 8, 2) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["file"])
def test_golden_decode_case(case):
    data = fixture_bytes(case["file"])
    if case["expected"] == "ok":
        h, w, rgb = image_decode_rgb(data)
        assert (h, w) == (case["h"], case["w"])
        assert rgb.shape == (h, w, 3) and rgb.dtype == np.uint8 and rgb.flags.c_contiguous
        assert hashlib.sha256(rgb.tobytes()).hexdigest() == case["sha256"]
    else:
        with pytest.raises(MmError, match=r"^image decode: "):
            image_decode_rgb(data)


@pytest.mark.parametrize(
    ("name", "color"), [("png_grey16.png", "L16"), ("png_rgb16.png", "Rgb16"), ("png_rgba16.png", "Rgba16")]
)
def test_sixteen_bit_png_is_refused_not_truncated(name, color):
    # PIL opens the 16-bit RGB(A) files as 8-bit RGB(A) by dropping low bytes; we must refuse.
    assert Image.open(io.BytesIO(fixture_bytes(name))).mode in ("I;16", "RGB", "RGBA")
    with pytest.raises(MmError, match=rf"^image decode: unsupported color {color}$"):
        image_decode_rgb(fixture_bytes(name))


@pytest.mark.parametrize(("name", "fmt"), [("tiff_rgb.tif", "TIFF"), ("ico_32.ico", "ICO"), ("ppm_rgb.ppm", "PNM")])
def test_formats_pil_reads_but_we_refuse(name, fmt):
    with pytest.raises(MmError, match=f"unsupported image format {fmt}"):
        image_decode_rgb(fixture_bytes(name))


def test_unknown_bytes():
    with pytest.raises(MmError, match=r"^image decode: The image format could not be determined$"):
        image_decode_rgb(b"definitely not an image")


def test_empty_input():
    with pytest.raises(MmError, match="image decode"):
        image_decode_rgb(b"")


def test_huge_claimed_size_is_refused_from_the_header():
    # A small PNG whose IHDR claims 40000 x 40000 (1.6 Gpx, 6.4 GB as RGBX) is refused before
    # any pixel buffer exists: peak RSS must not move by more than a few MB.
    data = png_claiming(40000, 40000, zlib.compress(bytes(50_000)))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(MmError, match="40000x40000 image has 1600000000 pixels, above the limit of 178956970"):
        image_decode_rgb(data)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 20_000  # KiB


@pytest.mark.parametrize(("w", "h"), [(70000, 10), (10, 70000)])
def test_side_limit(w, h):
    with pytest.raises(MmError, match=f"{w}x{h} image exceeds the side limit of 65535"):
        image_decode_rgb(png_claiming(w, h, zlib.compress(bytes(100))))
    assert MAX_IMAGE_SIDE == 65535


def test_pixel_limit_is_checked_before_decoding():
    data = fixture_bytes("png_rgb.png")  # 53 x 37 = 1961 px
    with pytest.raises(MmError, match=r"53x37 image has 1961 pixels, above the limit of 1960"):
        decode_image(data, max_pixels=1960)
    assert decode_image(data, max_pixels=1961).width == 53
    assert MAX_IMAGE_PIXELS == 178_956_970


def test_truncated_jpeg_is_refused():
    data = fixture_bytes("jpeg_rgb_q90_420.jpg")
    with pytest.raises(MmError, match=r"^image decode: image file is truncated \(\d+ bytes not processed\)$"):
        image_decode_rgb(data[: len(data) // 2])


def test_colour_jpeg_is_decoded_into_a_buffer_of_its_own():
    # What a consumer may overwrite and cut (mmworker.common.resize.horizontal_resize).
    data = fixture_bytes("jpeg_rgb_q90_420.jpg")
    image = decode_image(data)
    assert image.buffer is not None and image.buffer.flags.owndata and image.pil is None
    assert image.pixels.shape[2] == 4 and np.shares_memory(image.pixels, image.buffer)
    np.testing.assert_array_equal(image.pixels[:, :, :3], np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))


def test_error_messages_carry_no_object_addresses():
    # Pillow's "cannot identify image file <_io.BytesIO object at 0x7f...>" leaks a heap address
    # (the ASLR bypass of CVE-2026-22778); our messages must not.
    for data in (
        b"\x89PNG\r\n\x1a\n" + b"\x00" * 40,
        b"GIF89a" + b"\x01" * 30,
        b"BM" + b"\xff" * 60,
        b"RIFF\x10\x00\x00\x00WEBPVP8 " + b"\x00" * 20,
        b"\xff\xd8\xff" + b"\x00" * 30,
    ):
        with pytest.raises(MmError) as info:
            image_decode_rgb(data)
        assert "0x" not in str(info.value), str(info.value)


def test_alpha_is_dropped_not_composited():
    rgba = np.zeros((4, 5, 4), np.uint8)
    rgba[..., 0], rgba[..., 1], rgba[..., 2], rgba[..., 3] = 200, 100, 50, 0  # fully transparent
    buf = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buf, "PNG")
    _, _, rgb = image_decode_rgb(buf.getvalue())
    assert (rgb == [200, 100, 50]).all()


def test_exif_orientation_is_not_applied():
    _, _, stored = image_decode_rgb(fixture_bytes("jpeg_rgb_q90_420.jpg"))
    _h, _w, rotated_tag = image_decode_rgb(fixture_bytes("jpeg_exif_orient6.jpg"))
    np.testing.assert_array_equal(stored, rotated_tag)


def test_animated_gif_gives_the_first_frame():
    data = fixture_bytes("gif_anim3.gif")
    with Image.open(io.BytesIO(data)) as im:
        im.seek(0)
        first = np.asarray(im.convert("RGB"))
    np.testing.assert_array_equal(image_decode_rgb(data)[2], first)


def test_large_decode_is_viewed_in_place_or_copied_identically():
    # Above Pillow's 16 MB block size an image is split over several blocks: the pixels must be
    # the same whichever path hands them over.
    rng = np.random.default_rng(0)
    big = rng.integers(0, 256, (1500, 3000, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(big).save(buf, "PNG", compress_level=1)
    _h, _w, rgb = image_decode_rgb(buf.getvalue())
    np.testing.assert_array_equal(rgb, big)


def test_bad_inputs_leave_nothing_behind():
    # Repeated refusals must not grow memory or open files.
    fd_dir = f"/proc/{os.getpid()}/fd"
    fds = len(os.listdir(fd_dir))
    jpeg = fixture_bytes("jpeg_rgb_q90_420.jpg")
    bad = [
        jpeg[: len(jpeg) // 2],  # decoded into a buffer of our own until the data runs out
        fixture_bytes("png_truncated.png"),
        fixture_bytes("png_rgb16.png"),
        b"\x89PNG\r\n\x1a\n" * 4,
        png_claiming(40000, 40000, b"x"),
    ]
    for data in bad:  # warm-up: first-use allocations are not leaks
        with pytest.raises(MmError):
            image_decode_rgb(data)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(300):
        for data in bad:
            with pytest.raises(MmError):
                image_decode_rgb(data)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 10_000  # KiB
    assert len(os.listdir(fd_dir)) == fds


OK_FILES = [c["file"] for c in CASES if c["expected"] == "ok"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(OK_FILES), data=st.data())
def test_mutated_images_decode_or_fail_cleanly(name, data):
    raw = bytearray(fixture_bytes(name))
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(raw)))
    try:
        h, w, rgb = image_decode_rgb(bytes(raw[:cut]))
    except MmError as exc:
        assert str(exc).startswith("image decode: ") and not re.search(r"at 0x[0-9a-fA-F]", str(exc))
    else:
        assert rgb.shape == (h, w, 3)


@pytest.mark.parametrize("name", [c["file"] for c in CASES if c["expected"] == "ok" and c["format"] != "JPEG"])
def test_lossless_decode_parity_with_rust_extension(rust_ext, name):
    data = fixture_bytes(name)
    h, w, flat = rust_ext.common.image_decode_rgb(data)
    np.testing.assert_array_equal(image_decode_rgb(data)[2], np.asarray(flat).reshape(h, w, 3))
