"""JpegRows: a colour JPEG streamed through a ring of rows hands on exactly the rows of a whole decode, once each."""

import gc
import io
import mmap

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jpegcases import Collect, count_pillow_decodes, encoded, jpeg
from PIL import Image

from mmworker import MmError
from mmworker.common import jpeg_rows
from mmworker.common.decode import decode_image, image_decode_rgb, open_image, with_image
from mmworker.common.jpeg_rows import JpegRows
from mmworker.common.pixels import RgbImage
from mmworker.corpus import encode, photo_like
from mmworker.driver import MmInput, process
from mmworker.qwen_vl import QwenVL, as_spec
from mmworker.registry import named_spec


def mappings_of(nbytes: int) -> int:
    """How many of this process's shared anonymous mappings are `nbytes` long (page-rounded): a
    stream's reserve is one. Only those: the heap or a file mapping can reach any size (the heap
    once grew to exactly a 2048x1500 reserve's 12288000 bytes, and was counted)."""
    size = -(-nbytes // 4096) * 4096
    count = 0
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            start, end = fields[0].split("-")
            shared_anonymous = (
                fields[1].endswith("s") and len(fields) == 6 and fields[5].strip() == "/dev/zero (deleted)"
            )
            count += shared_anonymous and int(end, 16) - int(start, 16) == size
    return count


def streamed(data: bytes) -> Collect:
    image = open_image(data)
    assert isinstance(image, JpegRows)
    sink = Collect(image.width, image.height)
    image.stream(sink)
    return sink


@pytest.mark.parametrize("size", [(1, 1), (33, 17), (640, 480), (517, 2000), (2048, 1500), (4000, 257)])
def test_stream_hands_on_every_row_once_with_the_pixels_of_a_whole_decode(size):
    data = jpeg(*size)
    sink = streamed(data)
    assert sum(n for _, n, _ in sink.bands) == size[1]
    whole = decode_image(data).pixels
    np.testing.assert_array_equal(sink.rows[..., :3], whole[..., :3])


def test_a_large_image_goes_through_a_ring_of_two_bands_not_a_whole_buffer():
    width, height = 2048, 1500
    sink = streamed(jpeg(width, height))
    band = jpeg_rows.band_rows(width, height)
    assert 2 * band < height
    assert max(n for _, n, _ in sink.bands) <= band
    assert len({address for _, _, address in sink.bands}) == 2  # the ring's two halves, again and again


def test_rows_decoded_beyond_the_ring_spill_and_are_still_handed_on_in_order(monkeypatch):
    # Chunks of 1 MB of a mostly flat file decode to far more rows than the ring holds.
    monkeypatch.setattr(jpeg_rows, "_READ_MIN", 1 << 20)
    width, height = 2048, 1500
    data = jpeg(width, height, flat_from=200)
    sink = streamed(data)
    # Spilled rows are handed on from a third place: neither half of the ring.
    assert len({address for _, _, address in sink.bands}) > 2, "no rows spilled"
    np.testing.assert_array_equal(sink.rows[..., :3], decode_image(data).pixels[..., :3])


def test_an_image_struct_not_as_expected_is_decoded_whole_and_handed_on_as_one_band(monkeypatch):
    monkeypatch.setattr(jpeg_rows, "_row_pointers", lambda *args: None)
    data = jpeg(2048, 1500)
    sink = streamed(data)
    assert [(first, n) for first, n, _ in sink.bands] == [(0, 1500)]
    np.testing.assert_array_equal(sink.rows[..., :3], decode_image(data).pixels[..., :3])


def test_a_truncated_file_fails_as_a_whole_decode_does_and_leaves_no_mapping():
    data = jpeg(2048, 1500)
    data = data[: len(data) // 2]
    with pytest.raises(MmError, match=r"^image decode: image file is truncated \(\d+ bytes not processed\)$"):
        decode_image(data)
    seen = []

    def sink(first, rows):
        seen.append(mappings_of(2048 * 1500 * 4))

    with pytest.raises(MmError, match=r"^image decode: image file is truncated \(\d+ bytes not processed\)$"):
        open_image(data).stream(sink)
    assert seen and seen[0] == 1, "the reserve was not found while streaming"
    assert mappings_of(2048 * 1500 * 4) == 0


@pytest.mark.parametrize("error", [RuntimeError, ValueError, MmError])
def test_a_failing_sink_stops_the_decode_unchanged_and_leaves_no_mapping(error):
    # Its error is the consumer's, never dressed up as the file's (a ValueError or an MmError
    # passes through Pillow's load as it was raised).
    image = open_image(jpeg(2048, 1500))
    calls = []

    def sink(first, rows):
        calls.append(mappings_of(2048 * 1500 * 4))
        if len(calls) == 2:
            raise error("consumer failed")

    with pytest.raises(error, match=r"^consumer failed$"):
        image.stream(sink)
    assert calls == [1, 1] and mappings_of(2048 * 1500 * 4) == 0


def test_a_stream_leaves_no_reference_cycle_behind():
    # A cycle would keep the ring and everything the sink holds until a gc pass: at 480p that
    # grew the heap by ~350 MB over 100 images before it was found.
    data = jpeg(2048, 1500)
    gc.collect()
    gc.disable()
    try:
        streamed(data)
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_only_colour_jpegs_are_left_to_decode():
    grey = encoded(photo_like(64, 48)[..., 0])
    assert isinstance(open_image(grey), RgbImage)
    assert isinstance(open_image(encode(photo_like(64, 48), "PNG")), RgbImage)
    assert isinstance(open_image(jpeg(64, 48)), JpegRows)
    assert isinstance(open_image(encoded(photo_like(64, 48), keep_rgb=True)), JpegRows)  # coded as RGB


def test_a_progressive_file_streams_as_one_band_of_the_whole_decode():
    # No row before its last scan: a ring would only spill, so it is decoded whole.
    data = encoded(photo_like(300, 200, seed=4), progressive=True)
    sink = streamed(data)
    assert [(first, n) for first, n, _ in sink.bands] == [(0, 200)]
    np.testing.assert_array_equal(sink.rows[..., :3], np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))


def test_a_clean_colour_jpeg_is_never_opened_by_pillow(monkeypatch):
    # TurboJPEG reads its header and decodes it; Pillow's open (~25 us) is for what it leaves.
    opened = []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda *a, **k: opened.append(1) or real_open(*a, **k))
    data = jpeg(96, 64)
    decoded = decode_image(data)
    assert opened == []
    monkeypatch.undo()
    np.testing.assert_array_equal(decoded.pixels[..., :3], np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))


@pytest.mark.parametrize("progressive", [False, True])
def test_a_header_turbojpeg_cannot_read_is_opened_by_pillow(progressive, monkeypatch):
    # As for a sampling layout TurboJPEG has no name for ("Could not determine subsampling level").
    def refuse(data):
        raise ValueError("tjDecompressHeader3(): Could not determine subsampling level of JPEG image")

    monkeypatch.setattr(jpeg_rows.simplejpeg, "decode_jpeg_header", refuse)
    data = encoded(photo_like(96, 64, seed=2), progressive=progressive)
    image = open_image(data)
    assert isinstance(image, RgbImage if progressive else JpegRows)
    pixels = image.pixels if progressive else image.load().pixels
    np.testing.assert_array_equal(pixels[..., :3], np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))


@pytest.mark.parametrize("resample", ["aten_u8", "pil"])
@pytest.mark.parametrize(
    "size, max_pixels, flat_from",
    [
        ((2048, 1500), 200704, None),
        ((1500, 2048), 401408, None),
        ((3000, 1000), 100352, 300),
        ((3000, 1400), 1003520, None),
    ],
)
def test_streamed_pixel_values_equal_those_of_the_whole_image(size, max_pixels, flat_from, resample, monkeypatch):
    spec = {**named_spec("qwen2_vl"), "max_pixels": max_pixels, "resample": resample}
    family = QwenVL(as_spec(spec))
    data = jpeg(*size, flat_from=flat_from)
    grid = family.grid_for(size[1], size[0])
    feature_bytes = np.prod(family.feature_shape(grid)) * 4
    assert size[0] * size[1] * 4 > feature_bytes / 2, "this case would not stream"
    whole = family.process_item(decode_image(data))
    # Pillow's ring, not TurboJPEG's planes in the feature (tests/test_jpeg_planes.py has those).
    monkeypatch.setattr(jpeg_rows, "decode_planes", lambda *args: None)
    if flat_from is not None:
        monkeypatch.setattr(jpeg_rows, "_READ_MIN", 1 << 20)  # spill, too
    item = family.process_item(open_image(data))
    np.testing.assert_array_equal(item.aux["image_grid_thw"], whole.aux["image_grid_thw"])
    np.testing.assert_array_equal(item.feature, whole.feature)


def test_a_broken_file_is_rejected_for_the_file_even_where_its_size_is_refused_first():
    # 4020 x 19 is beyond Qwen's aspect-ratio limit, which the family can tell before decoding.
    data = encode(photo_like(4020, 19), "JPEG")
    family = QwenVL(as_spec(named_spec("qwen2_vl")))
    with pytest.raises(MmError, match="aspect ratio"):
        with_image(data, family.process_item)
    with pytest.raises(MmError, match=r"^image 0: image decode: image file is truncated"):
        process(family, MmInput(input_ids=[1, family.spec.image_token_id, 2], images=[data[: len(data) // 2]]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    width=st.integers(1, 300),
    height=st.integers(1, 400),
    flat=st.one_of(st.none(), st.floats(0, 1)),
    band_bytes=st.sampled_from([1, 4096, 1 << 16]),
    read_bytes=st.sampled_from([1, 4096, 1 << 20]),
)
def test_any_band_and_chunk_size_hands_on_the_pixels_of_a_whole_decode(
    width, height, flat, band_bytes, read_bytes, monkeypatch
):
    # Tiny bands wrap the ring many times; tiny reads call the hook often; huge ones spill.
    monkeypatch.setattr(jpeg_rows, "_BAND_BYTES", band_bytes)
    monkeypatch.setattr(jpeg_rows, "_READ_MIN", read_bytes)
    monkeypatch.setattr(jpeg_rows, "_READ_MAX", max(read_bytes, jpeg_rows._READ_MAX))
    data = jpeg(width, height, None if flat is None else int(flat * height))
    sink = streamed(data)
    np.testing.assert_array_equal(sink.rows[..., :3], decode_image(data).pixels[..., :3])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    width=st.integers(56, 400),
    height=st.integers(56, 400),
    max_pixels=st.sampled_from([3136, 12544, 50176]),
    resample=st.sampled_from(["aten_u8", "pil"]),
    band_bytes=st.sampled_from([1, 8192]),
    planes=st.booleans(),
)
def test_pixel_values_from_any_bands_equal_those_of_the_whole_image(
    width, height, max_pixels, resample, band_bytes, planes, monkeypatch
):
    # Bands far smaller than what one merge-block row reads exercise the overlap rows, of
    # Pillow's ring or (where they fit) of TurboJPEG's planes in the feature.
    monkeypatch.setattr(jpeg_rows, "_BAND_BYTES", band_bytes)
    if not planes:
        monkeypatch.setattr(jpeg_rows, "decode_planes", lambda *args: None)
    spec = {**named_spec("qwen2_vl"), "min_pixels": 3136, "max_pixels": max_pixels, "resample": resample}
    family = QwenVL(as_spec(spec))
    try:
        grid = family.grid_for(height, width)
    except MmError:  # too thin for this pixel budget
        assume(False)
    assume(width * height * 2 > np.prod(family.feature_shape(grid)))  # else it would not stream
    data = jpeg(width, height)
    whole = family.process_item(decode_image(data))
    np.testing.assert_array_equal(family.process_item(open_image(data)).feature, whole.feature)


@pytest.mark.parametrize(
    "options",
    [
        {"subsampling": 2},  # 4:2:0
        {"subsampling": 1},  # 4:2:2
        {"subsampling": 0},  # 4:4:4
        {"subsampling": 2, "progressive": True},
        {"subsampling": 2, "restart_marker_rows": 1},
        {"keep_rgb": True},  # coded as RGB (Adobe transform 0), not YCbCr
    ],
    ids=str,
)
@pytest.mark.parametrize("size", [(1, 1), (67, 33), (640, 480)])
def test_a_whole_decode_is_turbojpegs_one_call_with_pillows_pixels(size, options, monkeypatch):
    data = encoded(photo_like(*size, seed=7), quality=90, **options)
    pillow_decodes = count_pillow_decodes(monkeypatch)
    image = decode_image(data)
    h, w, rgb = image_decode_rgb(data)  # 3-byte pixels, straight from the decoder
    assert pillow_decodes == [], "a clean file should not need Pillow's decoder"
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    np.testing.assert_array_equal(image.pixels[..., :3], expected)
    assert (image.pixels[..., 3] == 255).all()
    assert (h, w) == expected.shape[:2] and rgb.flags.writeable and rgb.flags.c_contiguous
    np.testing.assert_array_equal(rgb, expected)


def test_a_file_libjpeg_warns_about_is_decoded_by_pillow(monkeypatch):
    # Two stray bytes before the scan: libjpeg warns ("extraneous bytes before marker") and decodes
    # on; Pillow ignores the warning, and so must we, with Pillow's pixels.
    data = encode(photo_like(96, 64, seed=3), "JPEG")
    sos = data.index(b"\xff\xda")
    warned = data[:sos] + b"\x00\x00" + data[sos:]
    pillow_decodes = count_pillow_decodes(monkeypatch)
    image = decode_image(warned)
    _, _, rgb = image_decode_rgb(warned)
    assert pillow_decodes == [None, None]
    expected = np.asarray(Image.open(io.BytesIO(warned)).convert("RGB"))
    np.testing.assert_array_equal(image.pixels[..., :3], expected)
    np.testing.assert_array_equal(rgb, expected)


def test_a_whole_decode_lets_go_of_the_callers_bytes():
    # The bytes may be a view of a request ring's memory, which cannot be unmapped while any
    # view of it lives: the opened image must not keep one once it is decoded.
    data = encode(photo_like(64, 48, seed=5), "JPEG")
    memory = mmap.mmap(-1, len(data))
    memory[:] = data
    view = memoryview(memory)
    image = open_image(view)
    assert isinstance(image, JpegRows)
    decoded = image.load()
    del view
    memory.close()  # BufferError while a view of it lives
    np.testing.assert_array_equal(decoded.pixels[..., :3], np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
    assert image.started
