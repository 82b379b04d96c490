"""TurboJPEG's planes in lent memory: libjpeg's upsampling and colour conversion, exactly, and never a plane byte overwritten before it is read."""

import logging

import numpy as np
import pytest
import simplejpeg
from jpegcases import Collect, count_pillow_decodes, encoded, jpeg

from mmworker import MmError
from mmworker.common import jpeg_planes
from mmworker.common.decode import decode_image, open_image
from mmworker.common.jpeg_planes import LentMemory, decode_planes, hand_on_planes, plane_layout, turbojpeg
from mmworker.common.jpeg_rows import band_rows
from mmworker.corpus import photo_like
from mmworker.qwen_vl import QwenVL, as_spec
from mmworker.qwen_vl.patchify import PatchifyRows
from mmworker.registry import named_spec

needs_turbojpeg = pytest.mark.skipif(
    turbojpeg() is None,
    reason="libturbojpeg.so.0 is not installed (Debian's libturbojpeg0): large JPEGs take Pillow's ring",
)


def nothing_written(rows: np.ndarray) -> np.ndarray:
    return np.zeros_like(rows)


def lent(nbytes: int, written=nothing_written) -> LentMemory:
    return LentMemory(np.full(nbytes, 0xA5, np.uint8), written)


def planes_bytes(width: int, height: int) -> int:
    return 3 * (width + width % 2) * ((height + 1) // 2)


def reference_rgbx(y: np.ndarray, cb: np.ndarray, cr: np.ndarray, width: int, height: int) -> np.ndarray:
    """libjpeg's h2v2 fancy upsampling and YCbCr -> RGB (jdsample.c, jdcolor.c), in plain numpy."""
    chroma_rows = cb.shape[0]
    rows = np.arange(height)
    near = rows // 2
    far = np.where(rows % 2 == 1, np.minimum(near + 1, chroma_rows - 1), np.maximum(near - 1, 0))

    def upsampled(plane: np.ndarray) -> np.ndarray:
        sums = 3 * plane[near].astype(np.int64) + plane[far]
        left = np.concatenate([sums[:, :1], sums[:, :-1]], axis=1)
        right = np.concatenate([sums[:, 1:], sums[:, -1:]], axis=1)
        out = np.empty((height, 2 * sums.shape[1]), np.int64)
        out[:, 0::2] = (3 * sums + left + 8) >> 4
        out[:, 1::2] = (3 * sums + right + 7) >> 4
        return out[:, :width] - 128

    b, r, luma = upsampled(cb), upsampled(cr), y[:height, :width].astype(np.int64)
    rgbx = np.full((height, width, 4), 255, np.uint8)
    rgbx[..., 0] = np.clip(luma + ((91881 * r + 32768) >> 16), 0, 255)
    rgbx[..., 1] = np.clip(luma + ((-22554 * b - 46802 * r + 32768) >> 16), 0, 255)
    rgbx[..., 2] = np.clip(luma + ((116130 * b + 32768) >> 16), 0, 255)
    return rgbx


def converted(y: np.ndarray, cb: np.ndarray, cr: np.ndarray, width: int, height: int) -> np.ndarray:
    """Our conversion of planes (TurboJPEG's shapes for 4:2:0) placed as `plane_layout` places them."""
    band = band_rows(width, height)
    memory = lent(planes_bytes(width, height) + 64)
    layout = plane_layout(width, height, memory, band)
    buffer = memory.buffer
    for row in range(y.shape[0]):
        buffer[layout.y_at + row * layout.y_stride :][: y.shape[1]] = y[row]
    for row in range(cb.shape[0]):
        buffer[layout.cb_at + row * layout.c_stride :][: cb.shape[1]] = cb[row]
        buffer[layout.cr_at + row * layout.c_stride :][: cr.shape[1]] = cr[row]
    sink = Collect(width, height)
    hand_on_planes(buffer, layout, width, height, band, sink)
    return sink.rows


def test_every_ycbcr_triple_converts_as_libjpeg_converts_it():
    # Cb constant over three chroma columns and Cr over three chroma rows: the middle ones
    # upsample to themselves, 2 x 2 pixels each, and 64 Y planes give those every Y value.
    values = np.repeat(np.arange(256, dtype=np.uint8), 3)
    cb = np.tile(values, (768, 1))
    cr = np.tile(values[:, None], (1, 768))
    middle = np.arange(1, 768, 3)
    rows = (2 * middle[:, None] + np.arange(2)).reshape(-1)  # pixel rows of the middle chroma rows
    cols = (2 * middle[:, None] + np.arange(2)).reshape(-1)
    offset = (2 * (np.arange(512) % 2))[:, None] + np.arange(512) % 2  # 0..3 within each 2 x 2
    seen = np.zeros(1 << 24, np.bool_)
    rng = np.random.default_rng(0)
    for i in range(64):
        y = rng.integers(0, 256, (1536, 1536), dtype=np.uint8)
        y[np.ix_(rows, cols)] = 4 * i + offset
        got = converted(y, cb, cr, 1536, 1536)[np.ix_(rows, cols)]
        luma = y[np.ix_(rows, cols)].astype(np.int64)
        b = np.repeat(np.arange(256), 2)[None, :] - 128
        r = np.repeat(np.arange(256), 2)[:, None] - 128
        np.testing.assert_array_equal(got[..., 0], np.clip(luma + ((91881 * r + 32768) >> 16), 0, 255))
        np.testing.assert_array_equal(got[..., 1], np.clip(luma + ((-22554 * b - 46802 * r + 32768) >> 16), 0, 255))
        np.testing.assert_array_equal(got[..., 2], np.clip(luma + ((116130 * b + 32768) >> 16), 0, 255))
        assert (got[..., 3] == 255).all()
        seen[(luma << 16) | ((b + 128) << 8) | (r + 128)] = True
    assert seen.all()


@pytest.mark.parametrize("size", [(5, 1), (5, 2), (6, 3), (5, 7), (17, 9), (130, 65), (641, 479)])
def test_upsampling_is_libjpegs_at_every_edge(size):
    width, height = size
    padded, chroma_rows = width + width % 2, (height + 1) // 2
    rng = np.random.default_rng(width * height)
    y = rng.integers(0, 256, (2 * chroma_rows, padded), dtype=np.uint8)
    cb, cr = (rng.integers(0, 256, (chroma_rows, padded // 2), dtype=np.uint8) for _ in range(2))
    np.testing.assert_array_equal(converted(y, cb, cr, width, height), reference_rgbx(y, cb, cr, width, height))


@needs_turbojpeg
@pytest.mark.parametrize("size", [(5, 1), (6, 3), (5, 7), (17, 9), (64, 48), (641, 479), (1283, 722), (2048, 1538)])
def test_a_420_file_decodes_into_planes_with_turbojpegs_pixels(size, monkeypatch):
    width, height = size
    data = jpeg(width, height)
    memory = lent(planes_bytes(width, height) + 1000)
    pillow_decodes = count_pillow_decodes(monkeypatch)
    image = open_image(data)
    sink = Collect(width, height)
    image.stream(sink, memory)
    assert pillow_decodes == [] and image.started
    np.testing.assert_array_equal(sink.rows, simplejpeg.decode_jpeg(data, "RGBX", fastdct=False, fastupsample=False))
    layout = plane_layout(width, height, memory, band_rows(width, height))
    assert (memory.buffer[: layout.y_at] == 0xA5).all(), "TurboJPEG wrote outside the planes"


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_images_with_two_chroma_columns_or_fewer_are_left_to_pillow(width):
    # libjpeg replicates such chroma instead of filtering it (jdsample.c): Pillow decodes them.
    data = jpeg(width, 9)
    memory = lent(1 << 16)
    assert decode_planes(data, width, 9, memory, 16) is None
    sink = Collect(width, 9)
    open_image(data).stream(sink, memory)
    np.testing.assert_array_equal(sink.rows[..., :3], decode_image(data).pixels[..., :3])


def test_planes_that_do_not_fit_or_would_be_overwritten_first_leave_the_file_to_pillow(monkeypatch):
    width, height = 517, 2000
    data = jpeg(width, height)
    band = band_rows(width, height)
    need = planes_bytes(width, height) + 63
    assert plane_layout(width, height, lent(need), band) is not None
    assert plane_layout(width, height, lent(need - 64), band) is None

    def ahead(rows: np.ndarray) -> np.ndarray:  # a consumer writing ahead of the rows it has
        return (rows + band) * (need // height)

    for memory in (lent(need - 64), lent(need, ahead)):
        assert decode_planes(data, width, height, memory, band) is None
        assert (memory.buffer == 0xA5).all(), "nothing may be decoded into memory that is not used"
        pillow_decodes = count_pillow_decodes(monkeypatch)
        sink = Collect(width, height)
        open_image(data).stream(sink, memory)
        assert len(pillow_decodes) == 1
        np.testing.assert_array_equal(sink.rows[..., :3], decode_image(data).pixels[..., :3])


@pytest.mark.parametrize(
    "options",
    [{"subsampling": 1}, {"subsampling": 0}, {"keep_rgb": True}, {"subsampling": 2, "progressive": True}],
    ids=str,
)
@needs_turbojpeg
def test_only_420_ycbcr_files_take_the_planes(options, monkeypatch):
    data = encoded(photo_like(300, 200, seed=3), quality=90, **options)
    memory = lent(planes_bytes(300, 200) * 2)
    expected_planes = options.get("progressive", False)  # TurboJPEG decodes a progressive file's planes too
    assert (decode_planes(data, 300, 200, memory, band_rows(300, 200)) is not None) == expected_planes
    sink = Collect(300, 200)
    open_image(data).stream(sink, memory)
    np.testing.assert_array_equal(sink.rows[..., :3], decode_image(data).pixels[..., :3])


def test_a_file_libjpeg_warns_about_is_left_to_pillow_and_fails_as_it_does():
    data = jpeg(640, 480)[:-3000]
    memory = lent(planes_bytes(640, 480) * 2)
    assert decode_planes(data, 640, 480, memory, band_rows(640, 480)) is None
    with pytest.raises(MmError, match="image decode: image file is truncated"):
        open_image(data).stream(Collect(640, 480), memory)


@pytest.fixture
def no_turbojpeg(monkeypatch):
    """libturbojpeg missing, as in an environment without Debian's libturbojpeg0."""
    jpeg_planes.turbojpeg.cache_clear()
    monkeypatch.setattr(jpeg_planes, "_LIBRARY", "libturbojpeg-absent.so.0")
    yield
    jpeg_planes.turbojpeg.cache_clear()


def test_a_missing_library_is_logged_once_and_large_jpegs_stream_through_pillow(no_turbojpeg, monkeypatch, caplog):
    with caplog.at_level(logging.WARNING, logger="mmworker.common.jpeg_planes"):
        jpeg_planes.load()  # a worker's start: no exception
        jpeg_planes.load()
        assert jpeg_planes.turbojpeg() is None
    [record] = caplog.records
    assert "libturbojpeg-absent.so.0" in record.getMessage() and "\n" not in record.getMessage()
    assert "stream through Pillow's decoder" in record.getMessage() and "libturbojpeg0" in record.getMessage()
    data = jpeg(641, 479)
    memory = lent(planes_bytes(641, 479) * 2)
    assert decode_planes(data, 641, 479, memory, band_rows(641, 479)) is None
    assert (memory.buffer == 0xA5).all()
    pillow_decodes = count_pillow_decodes(monkeypatch)
    sink = Collect(641, 479)
    open_image(data).stream(sink, memory)
    assert len(pillow_decodes) == 1
    np.testing.assert_array_equal(sink.rows, simplejpeg.decode_jpeg(data, "RGBX", fastdct=False, fastupsample=False))


@pytest.mark.parametrize("resample", ["aten_u8", "pil"])
def test_without_the_library_pixel_values_are_those_of_the_whole_image(no_turbojpeg, resample, monkeypatch):
    spec = {**named_spec("qwen2_vl"), "max_pixels": 401408, "resample": resample}
    family = QwenVL(as_spec(spec))
    data = jpeg(1999, 1333)  # streamed at this budget (its planes would fit: test below)
    whole = family.process_item(decode_image(data))
    pillow_decodes = count_pillow_decodes(monkeypatch)
    item = family.process_item(open_image(data))
    assert len(pillow_decodes) == 1
    np.testing.assert_array_equal(item.feature, whole.feature)


@needs_turbojpeg
@pytest.mark.parametrize("resample", ["aten_u8", "pil"])
@pytest.mark.parametrize(
    "size, max_pixels, planes",
    [
        ((1500, 2048), 401408, True),
        ((3001, 1003), 401408, True),
        ((1999, 1333), 401408, True),
        ((3000, 1400), 1003520, True),
        ((2048, 1500), 200704, False),  # planes (4.6 MB) a little larger than the feature (4.4 MB)
        ((4000, 3000), 50176, False),
    ],
)
def test_pixel_values_through_the_planes_equal_those_of_the_whole_image(
    size, max_pixels, planes, resample, monkeypatch
):
    spec = {**named_spec("qwen2_vl"), "max_pixels": max_pixels, "resample": resample}
    family = QwenVL(as_spec(spec))
    data = jpeg(*size)
    whole = family.process_item(decode_image(data))
    # The consumer's promise, checked as it writes: no more of the feature than `written` says.
    checked = []
    call = PatchifyRows.__call__

    def keeping_its_word(self, first_row, pixels):
        call(self, first_row, pixels)
        done_bytes = self._done * self._out_per_block_row * self._out.shape[1] * 4
        assert done_bytes <= self.lent().written(np.array([first_row + pixels.shape[0]]))[0]
        checked.append(first_row)

    monkeypatch.setattr(PatchifyRows, "__call__", keeping_its_word)
    pillow_decodes = count_pillow_decodes(monkeypatch)
    item = family.process_item(open_image(data))
    assert (pillow_decodes == []) == planes and len(checked) > 1
    np.testing.assert_array_equal(item.feature, whole.feature)


def test_the_lent_memory_must_be_writable_bytes():
    data = jpeg(64, 48)
    memory = LentMemory(np.zeros(1 << 16, np.float32), nothing_written)
    with pytest.raises(MmError, match="lent memory must be writable contiguous uint8"):
        decode_planes(data, 64, 48, memory, 16)
