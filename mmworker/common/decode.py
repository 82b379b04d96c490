"""Image decoding: format allowlist, header checks before allocation, and RGB8 output equal to PIL's.

Rules (docs/behaviour.md §4): JPEG, PNG, WebP, GIF and BMP only; samples deeper than 8 bits are
refused (PIL would silently truncate a 16-bit PNG); alpha is dropped, never composited; no EXIF
transpose; GIF and WebP give their first frame. The result equals
`Image.open(b).convert("RGB")` bit for bit, because the decoding is done by the libraries Pillow
uses (libjpeg-turbo, zlib, libwebp), with its settings: mostly through Pillow itself; a whole
colour JPEG through libjpeg-turbo's own whole-image call (mmworker.common.jpeg_rows), a PNG
through our own unfiltering of zlib's output (mmworker.common.png). We decide what to accept and
how to hand pixels on.

Everything that can be rejected from the header is rejected before any pixel buffer exists: the
format (from magic bytes), the PNG bit depth and the pixel count. `open_image` stops there for a
colour JPEG (its header read by TurboJPEG, not Pillow) and leaves the decode to its consumer
(mmworker.common.jpeg_rows), which may take the rows in bands as they decode; `with_image` keeps
the order of errors that decoding first would give.
"""

import re
import warnings
from collections.abc import Callable
from typing import TypeVar

import numpy as np
from PIL import Image

from mmworker.common.jpeg_rows import JpegRows, colour_jpeg_size, open_with_pillow
from mmworker.common.pixels import RGB_STORAGE_MODES, RgbImage, copy_rgb, from_pil
from mmworker.common.png import PNG_SIGNATURE, decode_png
from mmworker.errors import MmError, UnsupportedInput, image_decode_error

T = TypeVar("T")

# Largest decoded image, in pixels. Equal to Pillow's DecompressionBombError threshold and to the
# Rust crate's 512 MiB allocation ceiling for an RGB8 buffer (512 MiB / 3); ~13400 x 13400. Far
# above any model's max_pixels (Qwen: 12.8 MP), yet a hostile header cannot make us allocate
# more than ~700 MB of RGBX before it is refused.
MAX_IMAGE_PIXELS = 178_956_970
# Longest side accepted (JPEG's own format limit). Together with the pixel limit it stops shapes
# like 1 x 100,000,000 that no model accepts (Qwen refuses aspect ratios > 200) before they decode.
MAX_IMAGE_SIDE = 65535

# Pillow plugin names of the formats we accept, keyed by how their files begin.
_FORMATS_BY_MAGIC = (
    (b"\xff\xd8\xff", "JPEG"),
    (PNG_SIGNATURE, "PNG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
)
# Recognised but refused, so the error can name them (PIL itself would read several of these).
_REFUSED_BY_MAGIC = (
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"\x00\x00\x01\x00", "ICO"),
    (b"\x00\x00\x02\x00", "CUR"),
    (b"\x00\x00\x00\x0cjP  ", "JPEG 2000"),
    (b"\xff\x4f\xff\x51", "JPEG 2000"),
    (b"qoif", "QOI"),
    (b"8BPS", "PSD"),
    (b"DDS ", "DDS"),
    (b"#?RADIANCE", "HDR"),
    (b"\x76\x2f\x31\x01", "OpenEXR"),
    (b"SIMPLE  =", "FITS"),
)
_PNM_MAGIC = re.compile(rb"P[1-7]\s")

# PNG IHDR colour types, named as the Rust `image` crate names their 16-bit layouts.
_PNG_16BIT_NAMES = {0: "L16", 2: "Rgb16", 3: "Rgb16", 4: "La16", 6: "Rgba16"}


def sniff_format(data: bytes | memoryview) -> str:
    """The Pillow format name of an accepted image, from its first bytes; MmError otherwise."""
    head = bytes(data[:16])
    for magic, name in _FORMATS_BY_MAGIC:
        if head.startswith(magic):
            return name
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    for magic, name in _REFUSED_BY_MAGIC:
        if head.startswith(magic):
            raise UnsupportedInput(f"image decode: unsupported image format {name}")
    if _PNM_MAGIC.match(head):
        raise UnsupportedInput("image decode: unsupported image format PNM")
    if head[4:8] == b"ftyp":
        raise UnsupportedInput(f"image decode: unsupported image format {head[8:12].decode('latin-1')!r}")
    raise MmError("image decode: The image format could not be determined")


def _check_png_bit_depth(data: bytes | memoryview) -> None:
    # IHDR is always the first chunk: bit depth at byte 24, colour type at byte 25. PIL opens a
    # 16-bit RGB(A) PNG as 8-bit RGB(A) by dropping the low byte, so the mode cannot tell us.
    if len(data) >= 26 and data[24] == 16:
        raise UnsupportedInput(f"image decode: unsupported color {_PNG_16BIT_NAMES.get(data[25], 'L16')}")


def _check_dimensions(w: int, h: int, max_pixels: int) -> None:
    if max(w, h) > MAX_IMAGE_SIDE:
        raise UnsupportedInput(f"image decode: {w}x{h} image exceeds the side limit of {MAX_IMAGE_SIDE}")
    if w * h > max_pixels:
        raise UnsupportedInput(f"image decode: {w}x{h} image has {w * h} pixels, above the limit of {max_pixels}")


def _open_checked(data: bytes | memoryview, fmt: str, max_pixels: int) -> Image.Image:
    try:
        image = open_with_pillow(data, fmt)
    except MmError as exc:
        # Pillow's bomb error (past twice its limit, which is ours) refuses a size before we see
        # it: the same refusal as ours below, so of the same kind, with Pillow's message.
        if isinstance(exc.__cause__, Image.DecompressionBombError):
            raise UnsupportedInput(str(exc)) from exc
        raise
    w, h = image.size
    try:
        _check_dimensions(w, h, max_pixels)
    except MmError:
        image.close()
        raise
    if w == 0 or h == 0:
        image.close()
        raise MmError(f"image decode: empty {w}x{h} image")
    return image


def decode_image(data: bytes | memoryview, max_pixels: int = MAX_IMAGE_PIXELS) -> RgbImage:
    """Decode an accepted image to RGB8 pixels (see the module docstring for the rules)."""
    image = open_image(data, max_pixels)
    return image.load() if isinstance(image, JpegRows) else image


def open_image(data: bytes | memoryview, max_pixels: int = MAX_IMAGE_PIXELS) -> RgbImage | JpegRows:
    """`decode_image`, except that a colour JPEG comes back opened, not decoded yet.

    Its consumer decodes it (`JpegRows.load`, or `stream` to take its rows in bands without ever
    holding the whole image); every other image comes back decoded. PNGs go through our own
    decoder first (mmworker.common.png: faster than Pillow's, same pixels); whatever it is
    not sure about, Pillow decodes, which also produces Pillow's errors.
    """
    fmt = sniff_format(data)
    if fmt == "PNG":
        _check_png_bit_depth(data)
        if len(data) >= 24:  # IHDR width and height, before anything is inflated
            _check_dimensions(int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big"), max_pixels)
        fast = decode_png(data, max_pixels)
        if fast is not None:
            return fast
    if fmt == "JPEG" and (size := colour_jpeg_size(data)) is not None:
        w, h = size
        _check_dimensions(w, h, max_pixels)  # (libjpeg refuses an empty image's header)
        return JpegRows(data, w, h)
    image = _open_checked(data, fmt, max_pixels)
    if fmt == "JPEG" and image.mode == "RGB":
        # Progressive files give no row before their last scan: nothing to stream.
        jpeg = JpegRows(data, *image.size, image)
        return jpeg.load() if image.info.get("progressive") else jpeg
    try:
        if image.mode in RGB_STORAGE_MODES:
            # Decode straight into one memory block so the pixels can be viewed in place.
            image.im = Image.core.new_block(image.mode, image.size)
        image.load()
        mode = image.mode
        if mode not in RGB_STORAGE_MODES:
            if mode not in ("L", "LA", "P", "PA", "1", "CMYK", "YCbCr", "LAB"):
                raise UnsupportedInput(f"image decode: unsupported color {mode}")
            with warnings.catch_warnings():
                # "Palette images with Transparency expressed in bytes should be converted to
                # RGBA": we drop alpha by rule, so the advice does not apply.
                warnings.simplefilter("ignore", UserWarning)
                image = image.convert("RGB")
    except MmError:
        raise
    except (OSError, SyntaxError, ValueError, EOFError, MemoryError) as exc:
        raise image_decode_error(exc) from exc
    return from_pil(image)


def with_image(
    data: bytes | memoryview, use: Callable[[RgbImage | JpegRows], T], max_pixels: int = MAX_IMAGE_PIXELS
) -> T:
    """`use(open_image(data))`, failing as if the image had been decoded before `use` ran.

    `use` may reject an opened JPEG from its size before decoding it (Qwen's aspect-ratio limit);
    a file that would not have decoded is then what the caller is told about, as when every image
    was decoded first. That costs a decode on this error path only.
    """
    image = open_image(data, max_pixels)
    try:
        return use(image)
    except MmError:
        if isinstance(image, JpegRows) and not image.started:
            image.load()  # raises the file's own error, if it has one
        raise


def image_decode_rgb(data: bytes | memoryview) -> tuple[int, int, np.ndarray]:
    """Decode to `(height, width, uint8[height, width, 3])` (the crate's `common.image_decode_rgb`)."""
    image = open_image(data)
    if isinstance(image, JpegRows):
        return image.height, image.width, image.load_rgb()
    pixels = image.pixels
    # A fresh writable 3-channel array (our PNG decoder's output) is already what callers get.
    if pixels.shape[2] != 3 or not pixels.flags.writeable:
        pixels = copy_rgb(pixels)
    return image.height, image.width, pixels
