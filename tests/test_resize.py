"""resize_rgb: bit-exact with stock Pillow (pil_*, any version's order of passes) and torchvision
(aten_u8) at zero tolerance, whichever PIL is installed."""

import hashlib
import importlib.metadata
import weakref

import numpy as np
import PIL
import pytest
import reference_resize
from conftest import load_golden
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from PIL import Image
from sources import make_source, tv_r1_source, tv_r4_source

from mmworker import MmError
from mmworker.common import pillow as pillow_module
from mmworker.common import resize as resize_module
from mmworker.common import resize_rgb
from mmworker.common.pillow import IS_PILLOW_SIMD, check_version, vertical_first
from mmworker.common.pixels import RgbImage, image_from_rgb, storage_view, unpack_rgb
from mmworker.common.resize import RESAMPLERS, horizontal_resize, resize_image, vertical_resize

stock_pillow_only = pytest.mark.skipif(
    IS_PILLOW_SIMD, reason="compares with the installed Pillow's resize, and the installed PIL is pillow-simd"
)
# The pil_* modes against the installed Pillow (or its rule), and the Pillow versions whose rules
# differ: 12.1 (horizontal first), 12.2/12.3 (Python: tall images), 13 (C).
PIL_FILTERS = {"pil_bicubic": Image.Resampling.BICUBIC, "pil_lanczos": Image.Resampling.LANCZOS}
RULES = ("12.1.1", "12.3.0", "13.0.0")

GOLDEN = load_golden("resize_cases.json")
SLOW_PIXELS = 1_500_000  # cases whose source or output is bigger are marked slow


def sha(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def _case_params():
    for case in GOLDEN["cases"]:
        src = case["source"]
        big = max(src.get("h", 1) * src.get("w", 1), case["th"] * case["tw"]) > SLOW_PIXELS
        marks = [pytest.mark.slow] if big else []
        yield pytest.param(case, id=case["name"], marks=marks)


@pytest.mark.parametrize("case", list(_case_params()))
def test_golden_case_all_resamplers(case):
    src = make_source(case["source"])
    for resample in RESAMPLERS:
        expected = case["sha256"][resample]
        assert expected is not None
        out = resize_rgb(src, case["tw"], case["th"], resample)
        assert out.shape == (case["th"], case["tw"], 3) and out.dtype == np.uint8
        assert sha(out) == expected, f"{resample} differs from its reference"


# docs/behaviour.md §12, verbatim.
TV_R2 = [173, 45, 116, 139, 174, 116, 132, 171, 116, 180, 144, 189, 101, 149, 136, 134, 119, 145, 168, 150,
         90, 41, 181, 107, 94, 164, 148, 54, 95, 108, 115, 72, 74, 144, 180, 77, 129, 115, 98, 129, 81, 76,
         143, 95, 102, 74, 92, 129, 69, 132, 154, 91, 98, 157, 125, 106, 106, 94, 118, 110]  # fmt: skip
TV_R3 = [178, 39, 122, 130, 177, 119, 135, 168, 116, 189, 141, 196, 96, 154, 137, 138, 115, 146, 172, 148,
         81, 34, 187, 111, 100, 157, 146, 50, 88, 101, 116, 67, 71, 152, 183, 78, 128, 123, 90, 121, 80, 78,
         147, 100, 105, 73, 90, 126, 63, 136, 166, 92, 92, 163, 129, 103, 98, 93, 124, 120]  # fmt: skip
TV_R3B = [*TV_R2[:33], 143, *TV_R2[34:]]
TV_R4 = [130, 131, 123, 127, 128, 128, 126, 128, 128, 128, 124, 131]


@pytest.mark.parametrize(
    ("resample", "expected"), [("pil_bicubic", TV_R2), ("pil_lanczos", TV_R3), ("aten_u8", TV_R3B)]
)
def test_vectors_tv_r2_r3(resample, expected):
    assert resize_rgb(tv_r1_source(), 5, 4, resample).ravel().tolist() == expected


def test_vector_tv_r4_extreme_aten_downscale():
    assert resize_rgb(tv_r4_source(), 4, 1, "aten_u8").ravel().tolist() == TV_R4


@pytest.mark.parametrize(
    "case", [c for c in GOLDEN["cases"] if c["th"] * c["tw"] <= 40_000][:60], ids=lambda c: c["name"]
)
def test_reference_oracle_matches_goldens(case):
    # The hypothesis sweep below trusts reference_resize; anchor it to Pillow 12 and torchvision first.
    src = make_source(case["source"])
    for resample in RESAMPLERS:
        assert sha(reference_resize.resize(src, case["tw"], case["th"], resample)) == case["sha256"][resample]


sizes = st.integers(1, 200)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(h=sizes, w=sizes, th=sizes, tw=sizes, seed=st.integers(0, 2**32 - 1), resample=st.sampled_from(RESAMPLERS))
def test_random_sizes_match_reference(h, w, th, tw, seed, resample):
    src = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    expected = reference_resize.resize(src, tw, th, resample)
    np.testing.assert_array_equal(resize_rgb(src, tw, th, resample), expected)


def no_pil_resize(monkeypatch):
    """Our kernels alone: no pillow-simd, and any PIL resize fails the test."""

    def refused(*args, **kwargs):
        raise AssertionError("PIL's resize was called")

    monkeypatch.setattr(resize_module, "IS_PILLOW_SIMD", False)
    monkeypatch.setattr(Image.Image, "resize", refused)


@pytest.mark.parametrize("kernel", ["aten_horizontal where it is used", "no aten_horizontal"])
def test_aten_u8_goldens_without_pillow_simd(kernel, monkeypatch):
    # What runs with stock Pillow, here whatever PIL is installed: the aten_u8 kernel on 4-byte rows
    # (every host), our fixed-point passes for the rest; and those passes alone.
    no_pil_resize(monkeypatch)
    if kernel == "no aten_horizontal":
        monkeypatch.setattr(resize_module, "aten_horizontal", lambda in_w, out_w, pillow_simd: None)
    for case in GOLDEN["cases"]:
        if max(case["source"].get("h", 1) * case["source"].get("w", 1), case["th"] * case["tw"]) > SLOW_PIXELS:
            continue
        src = make_source(case["source"])
        assert sha(resize_rgb(src, case["tw"], case["th"], "aten_u8")) == case["sha256"]["aten_u8"], case["name"]
        # The pipeline's way: the horizontal pass on 4-byte rows (the kernel's), then the vertical pass alone.
        rows = horizontal_resize(RgbImage(pixels=image_rgbx(src)), case["tw"], "aten_u8").pixels
        full = resize_rgb(np.ascontiguousarray(rows[..., :3]), case["tw"], case["th"], "aten_u8")
        assert sha(full) == case["sha256"]["aten_u8"], case["name"]


def image_rgbx(src: np.ndarray) -> np.ndarray:
    buffer = np.empty(src.shape[0] * src.shape[1] * 4, np.uint8)
    unpack_rgb(src.reshape(-1), buffer)
    return buffer.reshape(src.shape[0], src.shape[1], 4)


def test_the_installed_pil_is_told_apart():
    # pillow-simd's resize is used only when the PIL package imported is the one pillow-simd installed.
    owners = []
    for name in ("pillow", "pillow-simd"):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if dist.version == PIL.__version__ and "PIL/__init__.py" in {str(f) for f in dist.files or ()}:
            owners.append(name)
    assert owners == (["pillow-simd"] if IS_PILLOW_SIMD else ["pillow"])
    assert pillow_module.pil_mode_default() == ("12.1.1" if IS_PILLOW_SIMD else PIL.__version__)


@pytest.mark.parametrize(
    ("version", "size", "expected"),
    [
        ("12.1.1", (19, 2000, 28, 1988), False),
        ("12.0.0", (19, 2000, 28, 1988), False),
        ("12.2.0", (19, 2000, 28, 1988), True),  # h > 100 w, height shrinks
        ("12.3.0", (20, 2000, 28, 1988), False),  # h = 100 w
        ("12.3.0", (19, 2000, 28, 2016), False),  # height grows
        ("13.0.0", (19, 2000, 28, 1988), True),
        ("13.0.0", (512, 512, 644, 476), True),  # the width grows, the height shrinks
        ("13.0.0", (1024, 768, 1036, 756), True),  # Qwen's smart_resize of 1024x768
        ("12.3.0", (1024, 768, 1036, 756), False),
        ("13.0.0", (1920, 1080, 1316, 728), False),  # 352 < 2 * 604
        ("13.0.0", (100, 100, 90, 79), True),  # 21 > 2 * 10
        ("13.0.0", (100, 100, 90, 80), False),  # 20 = 2 * 10
        ("13.0.0", (100, 100, 110, 99), True),  # 1 > 2 * -10
        ("13.0.0", (100, 100, 110, 100), False),  # the height does not shrink
        ("13.2.1", (100, 100, 90, 79), True),
    ],
)
def test_pass_order_rules(version, size, expected):
    assert vertical_first(version, *size) is expected
    assert reference_resize.pillow_vertical_first(version, *size) is expected


@pytest.mark.parametrize("version", ["11.3.0", "14.0.0", "13", "", "pillow", None, 13.0])
def test_unsupported_pillow_versions_are_refused(version):
    with pytest.raises(MmError, match=r"is not supported: the pil resize reproduces stock Pillow 12\.0 to 13\.x"):
        check_version(version)
    with pytest.raises(MmError, match="is not supported"):
        resize_rgb(np.zeros((4, 4, 3), np.uint8), 3, 2, "pil_bicubic", pillow=version or "x")


# (w, h, out_w, out_h): sizes 1..200 every way, and the shapes whose order differs between versions:
# the width growing while the height shrinks (Pillow 13), and images over 100 times taller than wide
# (12.2, 12.3), 2 or 3 pixels wide (at width 1 both orders give the same bytes), so up to 420 tall.
general = st.tuples(sizes, sizes, sizes, sizes)
widening_and_shortening = st.tuples(st.integers(1, 150), st.integers(2, 200)).flatmap(
    lambda wh: st.tuples(st.just(wh[0]), st.just(wh[1]), st.integers(wh[0], 200), st.integers(1, wh[1] - 1))
)
tall = st.integers(2, 3).flatmap(
    lambda w: st.integers(100 * w + 1, 100 * w + 120).flatmap(
        lambda h: st.tuples(st.just(w), st.just(h), st.integers(1, 40), st.integers(1, h - 1))
    )
)
shapes = st.one_of(general, widening_and_shortening, tall)


@stock_pillow_only
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes, seed=st.integers(0, 2**32 - 1), resample=st.sampled_from(sorted(PIL_FILTERS)))
@example(shape=(512 // 4, 512 // 4, 644 // 4, 476 // 4), seed=1, resample="pil_bicubic")
@example(shape=(2, 250, 5, 40), seed=2, resample="pil_bicubic")
@example(shape=(3, 320, 1, 300), seed=3, resample="pil_lanczos")
def test_pil_modes_equal_the_installed_pillow(shape, seed, resample):
    w, h, tw, th = shape
    src = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    expected = np.asarray(Image.fromarray(src).resize((tw, th), PIL_FILTERS[resample]))
    np.testing.assert_array_equal(resize_rgb(src, tw, th, resample, pillow=PIL.__version__), expected)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=shapes,
    seed=st.integers(0, 2**32 - 1),
    resample=st.sampled_from(sorted(PIL_FILTERS)),
    version=st.sampled_from(RULES),
)
def test_every_pillow_rule_equals_the_reference_in_its_order(shape, seed, resample, version):
    w, h, tw, th = shape
    src = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    first = reference_resize.pillow_vertical_first(version, w, h, tw, th)
    expected = reference_resize.resize(src, tw, th, resample, vertical_first=first)
    np.testing.assert_array_equal(resize_rgb(src, tw, th, resample, pillow=version), expected)
    # The same passes apart, as the qwen_vl family runs a vertical-first resize (4-byte rows).
    if first:
        rows = vertical_resize(RgbImage(pixels=image_rgbx(src)), th, resample, consume=True)
        assert rows.pixels.shape == (th, w, 4) and rows.buffer is not None
        out = horizontal_resize(rows, tw, resample, consume=True).pixels
        np.testing.assert_array_equal(out[..., :3], expected)


def test_the_default_order_is_pillow_12_1s():
    # resize_rgb keeps the crate's semantics; 13.0 differs on this shape (vertical first).
    src = np.random.default_rng(4).integers(0, 256, (60, 60, 3), dtype=np.uint8)
    ours = resize_rgb(src, 70, 40, "pil_bicubic")
    np.testing.assert_array_equal(ours, reference_resize.resize(src, 70, 40, "pil_bicubic"))
    np.testing.assert_array_equal(ours, resize_rgb(src, 70, 40, "pil_bicubic", pillow="12.3.0"))
    assert not np.array_equal(ours, resize_rgb(src, 70, 40, "pil_bicubic", pillow="13.0.0"))


@pytest.mark.parametrize("resample", RESAMPLERS)
def test_pillow_storage_view_input_gives_the_same_pixels(resample):
    # Decoded images reach the kernels as (h, w, 4) views of Pillow's RGBX storage.
    src = np.random.default_rng(5).integers(0, 256, (45, 77, 3), dtype=np.uint8)
    view = storage_view(image_from_rgb(src))
    assert view is not None and view.shape == (45, 77, 4)
    from_view = resize_image(RgbImage(pixels=view, pil=None), 50, 33, resample).pixels[:, :, :3]
    np.testing.assert_array_equal(from_view, resize_rgb(src, 50, 33, resample))


@pytest.mark.parametrize("resample", RESAMPLERS)
@pytest.mark.parametrize("size", [(50, 33), (77, 33), (50, 45), (160, 90)])  # both passes, one each, upscale
def test_consume_frees_the_source_mid_resize_and_changes_no_pixel(resample, size):
    # A decoded image as the pipeline gets it: a view of a Pillow image's storage, plus that image.
    src = np.random.default_rng(7).integers(0, 256, (45, 77, 3), dtype=np.uint8)
    owner = image_from_rgb(src)
    image = RgbImage(pixels=storage_view(owner), pil=owner)
    gone = weakref.ref(owner)
    del owner
    out = resize_image(image, *size, resample, consume=True)
    assert gone() is None  # the decoded image's memory was free before the call returned
    assert image.height == image.width == 0
    np.testing.assert_array_equal(out.pixels[:, :, :3], resize_rgb(src, *size, resample))


@pytest.mark.parametrize("resample", RESAMPLERS)
@pytest.mark.parametrize("out_w", [50, 77, 160])  # downscale, unchanged, upscale
@pytest.mark.parametrize("source", ["3-byte array", "storage view"])
def test_horizontal_resize_is_the_first_pass_of_resize(resample, out_w, source):
    # Its result followed by a vertical-only resize is the whole resize (what patchify relies on).
    src = np.random.default_rng(9).integers(0, 256, (45, 77, 3), dtype=np.uint8)
    owner = image_from_rgb(src) if source == "storage view" else None
    image = RgbImage(pixels=storage_view(owner) if owner else src.copy(), pil=owner)
    out = horizontal_resize(image, out_w, resample, consume=True).pixels
    assert out.shape == (45, out_w, 4)
    np.testing.assert_array_equal(out[:, :, :3], resize_rgb(src, out_w, 45, resample))
    rest = resize_rgb(np.ascontiguousarray(out[:, :, :3]), out_w, 33, resample)
    np.testing.assert_array_equal(rest, resize_rgb(src, out_w, 33, resample))


@pytest.mark.parametrize("resample", RESAMPLERS)
@pytest.mark.parametrize("band_rows", [1, 7, 45])  # several pillow-simd bands, a partial last one, one
def test_a_buffer_the_image_owns_is_narrowed_in_place(resample, band_rows, monkeypatch):
    # A decoder's fresh buffer (RgbImage.buffer): the pass writes over what it has read, then the
    # buffer is cut to the result (its tail is free for what comes next).
    monkeypatch.setattr(resize_module, "_BAND_BYTES", band_rows * 50 * 4)
    src = np.random.default_rng(13).integers(0, 256, (45, 77, 3), dtype=np.uint8)
    buffer = np.empty(45 * 77 * 4, np.uint8)
    unpack_rgb(src.reshape(-1), buffer)
    image = RgbImage(pixels=buffer.reshape(45, 77, 4), buffer=buffer)
    del buffer
    out = horizontal_resize(image, 50, resample, consume=True)
    assert image.height == image.width == 0 and image.buffer is None
    assert out.buffer is not None and out.buffer.nbytes == 45 * 50 * 4 and np.shares_memory(out.pixels, out.buffer)
    np.testing.assert_array_equal(out.pixels[:, :, :3], resize_rgb(src, 50, 45, resample))


@pytest.mark.parametrize("pixels_kind", ["storage view", "copied out"])
def test_an_rgba_owner_is_resized_as_its_colour_alone(pixels_kind):
    # Alpha is dropped, never composited; Pillow would resize an RGBA image premultiplied.
    rgba = np.random.default_rng(11).integers(0, 256, (45, 77, 4), dtype=np.uint8)
    owner = Image.fromarray(rgba, "RGBA").copy()  # fromarray maps the array; copy() owns its storage
    pixels = storage_view(owner) if pixels_kind == "storage view" else np.ascontiguousarray(rgba[:, :, :3])
    image = RgbImage(pixels=pixels, pil=owner)
    assert image.to_pil().mode != "RGBA"
    out = resize_image(image, 50, 33, "aten_u8")
    np.testing.assert_array_equal(
        out.pixels[:, :, :3], resize_rgb(np.ascontiguousarray(rgba[:, :, :3]), 50, 33, "aten_u8")
    )


@pytest.mark.parametrize("resample", RESAMPLERS)
def test_same_size_is_a_copy(resample):
    src = np.random.default_rng(1).integers(0, 256, (9, 7, 3), dtype=np.uint8)
    out = resize_rgb(src, 7, 9, resample)
    np.testing.assert_array_equal(out, src)
    assert not np.shares_memory(out, src)


def test_unknown_resample():
    with pytest.raises(MmError, match="unknown resample 'nearest'"):
        resize_rgb(np.zeros((2, 2, 3), np.uint8), 4, 4, "nearest")


@pytest.mark.parametrize(("w", "h"), [(0, 4), (4, 0), (-1, 3)])
def test_output_size_must_be_positive(w, h):
    with pytest.raises(MmError, match="output size must be positive"):
        resize_rgb(np.zeros((2, 2, 3), np.uint8), w, h)


def test_output_size_limit():
    with pytest.raises(MmError, match="above the limit"):
        resize_rgb(np.zeros((2, 2, 3), np.uint8), 100_000, 100_000)


def test_channels_must_be_three():
    with pytest.raises(MmError, match="expected HWC RGB array with 3 channels, got 4"):
        resize_rgb(np.zeros((2, 2, 4), np.uint8), 4, 4)


def test_array_must_be_contiguous():
    with pytest.raises(MmError, match="array must be C-contiguous"):
        resize_rgb(np.zeros((4, 4, 3), np.uint8)[:, ::2], 4, 4)


@pytest.mark.parametrize("bad", [np.zeros((2, 2, 3), np.float32), np.zeros((2, 6), np.uint8), [[1, 2, 3]]])
def test_rejects_non_uint8_hwc(bad):
    with pytest.raises(MmError, match="expected a uint8 HWC RGB array"):
        resize_rgb(bad, 4, 4)


def test_empty_input():
    with pytest.raises(MmError, match="input image is empty"):
        resize_rgb(np.zeros((0, 3, 3), np.uint8), 4, 4)


def test_resize_parity_with_rust_extension(rust_ext):
    # The shipped crate agrees with Pillow 12 for pil_*; for aten_u8 it has a precision bug at
    # extreme downscales (TV-R4), so only ordinary sizes are compared there.
    src = np.random.default_rng(3).integers(0, 256, (120, 160, 3), dtype=np.uint8)
    for resample in RESAMPLERS:
        theirs = np.asarray(rust_ext.common.resize_rgb(src, 97, 131, resample)).reshape(131, 97, 3)
        np.testing.assert_array_equal(resize_rgb(src, 97, 131, resample), theirs)
