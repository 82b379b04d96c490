"""Resizing RGB pixels with the three resamplers the parity targets need, bit-exact with each.

| resample      | equals                                                   | implemented by              |
|---------------|----------------------------------------------------------|-----------------------------|
| `pil_lanczos` | stock Pillow `Image.resize(..., LANCZOS)`                | our numba kernels           |
| `pil_bicubic` | stock Pillow `Image.resize(..., BICUBIC)`                | our numba kernels           |
| `aten_u8`     | torchvision `resize(uint8, BICUBIC, antialias=True)`     | our kernels (*)             |

The `pil_*` modes follow stock Pillow 12.0-12.1 unless `pillow` names another stock Pillow version:
12.2 and 13.0 run the vertical pass first for some sizes, and the uint8 intermediate between the
passes makes the order show in the bytes (mmworker.common.pillow.vertical_first). No installed PIL
is asked: pillow-simd's BICUBIC is ATen's, not Pillow's, and every stock version's is the same
arithmetic as ours in its own order.

(*) aten_u8 is the same two passes, horizontal first, with ATen's fixed-point coefficients
(`resample.axis_coefficients(..., aten=True)`: fewer fractional bits, chosen per axis). Its
horizontal pass over 4-byte rows is mmworker.common.aten_horizontal's kernel where that is used;
everything else runs on resample.horizontal_pass / vertical_pass. pillow-simd's BICUBIC is exactly
ATen's, so where the installed PIL really is pillow-simd (mmworker.common.pillow.IS_PILLOW_SIMD:
the project's .venv) it takes the passes that kernel does not (it is used there only where it
beats pillow-simd: AVX-512 BW hosts), as before; with stock Pillow it never does, and the kernel
runs on any host.

Horizontal first, every resampler rounds to uint8, then runs the vertical pass, each with
coefficients from its own axis alone. So a kernel may take the two apart (`horizontal_resize`, then
`vertical_coefficients` applied in its own loop, as the Qwen patchify does) and get the same bytes
without the vertically resized image ever existing; and since the horizontal pass treats each row
alone, it can run band by band as a JPEG decodes (`horizontal_rows`), so that neither the decoded
nor the resized image exists whole. A resize that runs the vertical pass first (a `pil` mode
reproducing Pillow 12.2+ on some sizes) is `vertical_resize` then `horizontal_resize`, and its
consumer applies the identity `vertical_coefficients(h, h)`.
"""

import numpy as np
from PIL import Image

from mmworker.common import resample
from mmworker.common.aten_horizontal import AtenHorizontal, aten_horizontal
from mmworker.common.decode import MAX_IMAGE_PIXELS
from mmworker.common.jpeg_planes import LentMemory
from mmworker.common.jpeg_rows import JpegRows, RowSink
from mmworker.common.pillow import IS_PILLOW_SIMD, vertical_first
from mmworker.common.pixels import RgbImage, copy_rgb, from_pil, rgbx_copy
from mmworker.errors import MmError

RESAMPLERS = ("pil_lanczos", "pil_bicubic", "aten_u8")
# Output bytes per pillow-simd call of an in-place horizontal pass. Each call computes the pass's
# coefficients again (~75 us at 4032 -> 1148), and the band's result is held beside the image
# until it is copied into place: 12 bands of 256 rows cost 0.9 ms more than one call at 12 MP.
_BAND_BYTES = 4 << 20
# The same for the aten_u8 kernel (mmworker.common.aten_horizontal), which sets nothing up per
# call: a band's result stays in L2 until it is copied into place.
_KERNEL_BAND_BYTES = 256 << 10
_KIND = {"pil_lanczos": resample.LANCZOS, "pil_bicubic": resample.BICUBIC, "aten_u8": resample.BICUBIC}


def check_resample(name: str) -> str:
    if name not in RESAMPLERS:
        raise MmError(f"unknown resample {name!r}; expected one of {', '.join(RESAMPLERS)}")
    return name


def check_output_size(out_w: int, out_h: int) -> None:
    if out_w <= 0 or out_h <= 0:
        raise MmError(f"output size must be positive, got {out_w}x{out_h}")
    if out_w * out_h > MAX_IMAGE_PIXELS:
        raise MmError(f"output size {out_w}x{out_h} is above the limit of {MAX_IMAGE_PIXELS} pixels")


def resize_image(
    image: RgbImage,
    out_w: int,
    out_h: int,
    resample_name: str,
    *,
    consume: bool = False,
    pillow: str | None = None,
) -> RgbImage:
    """Resize to out_w x out_h; the result may view Pillow memory (aten_u8 under pillow-simd) or be a new array.

    `consume` releases `image` (RgbImage.release) as soon as it has been read, so that its memory
    can hold what comes next; the caller must not use it afterwards. `pillow`: for the `pil_*`
    modes, the stock Pillow version whose order of passes to follow (mmworker.common.pillow;
    None: 12.1's, horizontal first); aten_u8 has one order.
    """
    check_resample(resample_name)
    check_output_size(out_w, out_h)
    if resample_name == "aten_u8":
        if (out_w, out_h) == (image.width, image.height):
            return image
        if IS_PILLOW_SIMD:
            return _resize_pillow_simd(image, out_w, out_h, consume)
        return _resize_passes(image, out_w, out_h, resample_name, False, consume)
    first = pillow is not None and vertical_first(pillow, image.width, image.height, out_w, out_h)
    return _resize_passes(image, out_w, out_h, resample_name, first, consume)


def _resize_passes(
    image: RgbImage, out_w: int, out_h: int, resample_name: str, vertical_pass_first: bool, consume: bool
) -> RgbImage:
    """Both passes with our kernels, in the order given, the source released (`consume`) once the first has read it.

    Horizontal first, the horizontal pass covers only the source rows the vertical pass reads (as
    Pillow's does); vertical first, the vertical pass covers every row at the source width.
    """
    src = np.ascontiguousarray(image.pixels)  # the kernels index flat buffers; a no-op for every caller today
    in_h, in_w = src.shape[0], src.shape[1]
    kind, aten = _KIND[resample_name], resample_name == "aten_u8"
    if (out_w, out_h) == (in_w, in_h):
        out = copy_rgb(src)
        if consume:
            image.release()
        return RgbImage(pixels=out)
    if vertical_pass_first or out_w == in_w:
        del src
        shrunk = vertical_resize(image, out_h, resample_name, consume=consume).pixels
        if out_w == in_w:
            return RgbImage(pixels=shrunk)
        out = np.empty((out_h, out_w, 3), np.uint8)
        resample.horizontal_pass(shrunk, 0, *resample.axis_coefficients(in_w, out_w, kind, aten=aten), out)
        return RgbImage(pixels=out)
    row0, rows, vertical = 0, in_h, None
    if out_h != in_h:
        # Like Pillow, run the horizontal pass only over the source rows the vertical pass reads;
        # those rows are then counted from the first.
        bounds, weights, precision = vertical = resample.axis_coefficients(in_h, out_h, kind, aten=aten)
        row0, rows = int(bounds[0, 0]), int(bounds[-1, 0] + bounds[-1, 1] - bounds[0, 0])
        bounds[:, 0] -= row0
    mid = np.empty((rows, out_w, 3), np.uint8)
    resample.horizontal_pass(src, row0, *resample.axis_coefficients(in_w, out_w, kind, aten=aten), mid)
    del src
    if consume:
        image.release()
    if vertical is None:
        return RgbImage(pixels=mid)
    out = np.empty((out_h, out_w, 3), np.uint8)
    resample.vertical_pass(mid.reshape(rows, -1), bounds, weights, precision, out.reshape(out_h, -1))
    return RgbImage(pixels=out)


def _resize_pillow_simd(image: RgbImage, out_w: int, out_h: int, consume: bool) -> RgbImage:
    """aten_u8 by pillow-simd's BICUBIC (ATen's arithmetic); only where the installed PIL is pillow-simd."""
    # pillow-simd resizes horizontally, then vertically, each pass with its own coefficients
    # (from the input size, output size and box only), rounding to uint8 in between. Two calls
    # make the same passes with the same coefficients, so the result is the same bytes; but
    # between them the source can go, and the vertical pass's output can take its memory (peak
    # RSS at 1920x1080 -> 1316x728: 1.77x -> 1.17x the pixel_values size).
    pil = image.to_pil()
    if consume:
        image.release()
    del image
    w, h = pil.size
    if out_w != w:
        pil = pil.resize((out_w, h), Image.Resampling.BICUBIC)
    if out_h != h:
        pil = pil.resize((out_w, out_h), Image.Resampling.BICUBIC)
    return from_pil(pil)


def vertical_resize(image: RgbImage, out_h: int, resample_name: str, *, consume: bool = False) -> RgbImage:
    """The vertical pass of `resample_name` alone: image.width x out_h, pixels laid out as the source's
    (3 or 4 bytes; a 4-byte pixel's pad byte is resampled too, and means nothing), in a buffer the
    result owns (RgbImage.buffer), so that a narrowing `horizontal_resize` after it can work in place.

    For a resize that runs this pass first (mmworker.common.pillow.vertical_first); an unchanged
    height returns the image itself. `consume` releases `image` once it has been read.
    """
    check_resample(resample_name)
    check_output_size(image.width, out_h)
    if out_h == image.height:
        return image
    bounds, weights, precision = vertical_coefficients(image.height, out_h, resample_name)
    src = np.ascontiguousarray(image.pixels)
    w, channels = src.shape[1], src.shape[2]
    buffer = np.empty(out_h * w * channels, np.uint8)
    resample.vertical_pass(src.reshape(src.shape[0], -1), bounds, weights, precision, buffer.reshape(out_h, -1))
    del src
    if consume:
        image.release()
    return RgbImage(pixels=buffer.reshape(out_h, w, channels), buffer=buffer)


def horizontal_resize(image: RgbImage, out_w: int, resample_name: str, *, consume: bool = False) -> RgbImage:
    """The horizontal pass of `resample_name` alone: out_w x image.height, with 4-byte pixels (R, G, B, pad).

    An unchanged width returns the image itself when its pixels are 4-byte, else a 4-byte copy.
    `consume` releases `image` once it has been read, as in `resize_image`.
    """
    check_resample(resample_name)
    check_output_size(out_w, image.height)
    if out_w == image.width:
        return image if image.pixels.shape[2] == 4 else RgbImage(pixels=rgbx_copy(image.pixels))
    if consume and out_w < image.width and image.buffer is not None and image.pixels.shape[2] == 4:
        return _horizontal_in_place(image, out_w, resample_name)
    coefficients = _coefficients(image.width, out_w, resample_name, rgbx=image.pixels.shape[2] == 4)
    if coefficients is None:
        resized = _resize_pillow_simd(image, out_w, image.height, consume)  # its horizontal pass only
        if resized.pixels.shape[2] != 4:  # Pillow kept it in several blocks (an untuned process)
            resized = RgbImage(pixels=rgbx_copy(resized.pixels))
        return resized
    out = np.empty((image.height, out_w, 4), np.uint8)
    _horizontal_band(np.ascontiguousarray(image.pixels), out, coefficients)
    if consume:
        image.release()
    return RgbImage(pixels=out)


def _horizontal_in_place(image: RgbImage, out_w: int, resample_name: str) -> RgbImage:
    """A narrowing horizontal pass written over the rows it has read, then the buffer cut to the result.

    Output row r ends at (r + 1) * out_w * 4 <= (r + 1) * w * 4 bytes, so rows are written only
    where the pass has read everything already; cutting the buffer (realloc) frees its tail for
    what the consumer allocates next. The memory of the decoded and the resized image is one,
    which lowers an item's peak memory (at 12 MP pixel_values fits in the freed tail).
    pillow-simd and the aten_u8 kernel write
    elsewhere first, so their pass runs on bands of rows whose results are copied into place; our
    fixed-point pass (the pil modes, and aten_u8 where neither runs) writes in place directly.
    """
    buffer, h, w = image.buffer, image.height, image.width
    image.release()
    source, target = buffer[: h * w * 4].reshape(h, w, 4), buffer[: h * out_w * 4].reshape(h, out_w, 4)
    coefficients = _coefficients(w, out_w, resample_name)
    # Our fixed-point pass reads band by band before it writes; the others' results are copied into place
    # only after the band has been read: pillow-simd's (one block each: < 16 MB) by
    # _horizontal_band, the aten_u8 kernel's from one scratch band here.
    scratch = None
    if coefficients is None:
        rows = max(1, _BAND_BYTES // (out_w * 4))
    elif isinstance(coefficients, AtenHorizontal):
        rows = min(h, max(1, _KERNEL_BAND_BYTES // (out_w * 4)))
        scratch = np.empty((rows, out_w, 4), np.uint8)
    else:
        rows = h
    for r0 in range(0, h, rows):
        band = source[r0 : r0 + rows]
        if scratch is None:
            _horizontal_band(band, target[r0 : r0 + rows], coefficients)
        else:
            resized = scratch[: band.shape[0]]
            _horizontal_band(band, resized, coefficients)
            target[r0 : r0 + band.shape[0]] = resized
    del source, target, band
    buffer.resize(h * out_w * 4)  # refcheck: raises if any view of the old extent were still alive
    return RgbImage(pixels=buffer.reshape(h, out_w, 4), buffer=buffer)


_Coefficients = tuple[np.ndarray, np.ndarray, int] | AtenHorizontal | None


def _coefficients(in_w: int, out_w: int, resample_name: str, *, rgbx: bool = True) -> _Coefficients:
    """How to run the horizontal pass on rows of 4-byte (`rgbx`) or 3-byte pixels: our fixed-point
    pass's (bounds, weights, precision); for aten_u8 its kernel where it is used
    (mmworker.common.aten_horizontal, 4-byte rows), else None for pillow-simd where the installed
    PIL is pillow-simd, else our pass with ATen's coefficients."""
    if resample_name == "aten_u8":
        kernel = aten_horizontal(in_w, out_w, pillow_simd=IS_PILLOW_SIMD) if rgbx else None
        if kernel is not None:
            return kernel
        if IS_PILLOW_SIMD:
            return None
    return resample.axis_coefficients(in_w, out_w, _KIND[resample_name], aten=resample_name == "aten_u8")


def _horizontal_band(rows: np.ndarray, target: np.ndarray, coefficients: _Coefficients) -> None:
    """The horizontal pass of `rows` (n, w, C >= 3) into `target` (n, out_w, 4), as `coefficients`
    (`_coefficients`) says: our fixed-point pass; the aten_u8 kernel (4-byte rows, a target apart
    from them); or pillow-simd when they are None (4-byte rows, mapped; its result is copied into place)."""
    if isinstance(coefficients, AtenHorizontal):
        coefficients(rows, target)
        return
    if coefficients is not None:
        resample.horizontal_pass(rows, 0, *coefficients, target)
        return
    n, w = rows.shape[:2]
    band = Image.frombuffer("RGBX", (w, n), rows, "raw", "RGBX", 0, 1)
    resized = from_pil(band.resize((target.shape[1], n), Image.Resampling.BICUBIC)).pixels
    del band
    target[..., : resized.shape[2]] = resized  # 3 channels if Pillow kept it in several blocks (untuned)


def horizontal_rows(
    image: JpegRows, out_w: int, resample_name: str, overlap: int, sink: RowSink, lent: LentMemory | None = None
) -> None:
    """The horizontal pass of `resample_name` over a JPEG as it decodes, handed to `sink(first_row, rows)` in bands.

    Each band after the first repeats the last `overlap` rows of the one before, so a vertical
    pass whose taps for one output row span at most `overlap + 1` rows always finds them in one
    band. Neither the decoded nor the resized image ever exists whole (`JpegRows.stream`, which
    may decode into memory the sink lends: `lent`, whose promise holds here too, as rows are
    handed on as soon as they are resized).
    """
    check_resample(resample_name)
    check_output_size(out_w, image.height)
    image.stream(_HorizontalBands(image.width, out_w, resample_name, overlap, sink), lent)


class _HorizontalBands:
    """A row sink that resizes each band it gets horizontally and hands it on behind the overlap rows."""

    def __init__(self, in_w: int, out_w: int, resample_name: str, overlap: int, sink: RowSink) -> None:
        self.in_w, self.out_w, self.overlap, self.sink = in_w, out_w, overlap, sink
        self.window = np.empty((0, out_w, 4), np.uint8)  # overlap rows, then the band
        self.kept = 0
        self.coefficients = _coefficients(in_w, out_w, resample_name) if in_w != out_w else None

    def __call__(self, first: int, rows: np.ndarray) -> None:
        n, kept = rows.shape[0], self.kept
        if self.window.shape[0] < kept + n:
            grown = np.empty((kept + n, self.out_w, 4), np.uint8)
            grown[:kept] = self.window[:kept]
            self.window = grown
        target = self.window[kept : kept + n]
        if self.in_w == self.out_w:
            target[...] = rows
        else:
            _horizontal_band(rows, target, self.coefficients)
        self.sink(first - kept, self.window[: kept + n])
        self.kept = min(self.overlap, kept + n)
        self.window[: self.kept] = self.window[kept + n - self.kept : kept + n]


def vertical_coefficients(in_h: int, out_h: int, resample_name: str) -> tuple[np.ndarray, np.ndarray, int]:
    """The vertical pass of `resample_name` from in_h to out_h rows, for a kernel to apply itself:
    (bounds int32 [out_h, 2] = first row and tap count, weights int32 [out_h, k], precision).

    Each output row is clip8((1 << (precision - 1) + sum(row * weight)) >> precision)
    (docs/behaviour.md §5.3); an unchanged height is the identity, one tap per row.
    """
    check_resample(resample_name)
    check_output_size(1, out_h)
    if out_h == in_h:
        bounds = np.empty((in_h, 2), np.int32)
        bounds[:, 0] = np.arange(in_h)
        bounds[:, 1] = 1
        return bounds, np.full((in_h, 1), 2, np.int32), 1
    return resample.axis_coefficients(in_h, out_h, _KIND[resample_name], aten=resample_name == "aten_u8")


def resize_rgb(
    arr: np.ndarray, out_w: int, out_h: int, resample: str = "pil_lanczos", *, pillow: str | None = None
) -> np.ndarray:
    """Resize uint8[h, w, 3] to uint8[out_h, out_w, 3] (the crate's `common.resize_rgb`).

    `pillow` (not the crate's): for the `pil_*` modes, the stock Pillow version to equal, e.g.
    "13.0.0" (mmworker.common.pillow); None keeps the crate's semantics, Pillow 12.1's.
    """
    check_resample(resample)
    if not isinstance(arr, np.ndarray) or arr.dtype != np.uint8 or arr.ndim != 3:
        raise MmError(f"expected a uint8 HWC RGB array, got {_describe(arr)}")
    if arr.shape[2] != 3:
        raise MmError(f"expected HWC RGB array with 3 channels, got {arr.shape[2]}")
    if not arr.flags.c_contiguous:
        raise MmError("array must be C-contiguous")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise MmError(f"input image is empty ({arr.shape[1]}x{arr.shape[0]})")
    result = resize_image(RgbImage(pixels=arr), int(out_w), int(out_h), resample, pillow=pillow)
    return copy_rgb(result.pixels) if result.pixels is arr or result.pixels.shape[2] != 3 else result.pixels


def _describe(arr: object) -> str:
    if isinstance(arr, np.ndarray):
        return f"{arr.dtype} array of shape {arr.shape}"
    return type(arr).__name__
