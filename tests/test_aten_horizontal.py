"""The aten_u8 horizontal-pass kernel: pillow-simd's bytes and our fixed-point pass's, used only where it should be."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from mmworker.common import aten_horizontal as kernel_module
from mmworker.common import resample
from mmworker.common import resize as resize_module
from mmworker.common.aten_horizontal import FAST_HERE, aten_horizontal
from mmworker.common.pillow import IS_PILLOW_SIMD
from mmworker.corpus import encode, photo_like
from mmworker.errors import MmError
from mmworker.qwen_vl import preprocess
from mmworker.registry import named_spec

needs_pillow_simd = pytest.mark.skipif(
    not IS_PILLOW_SIMD, reason="compares with pillow-simd's resize, and the installed PIL is stock Pillow"
)


def pillow_simd(rows: np.ndarray, out_w: int) -> np.ndarray:
    n, w = rows.shape[:2]
    band = Image.frombuffer("RGBX", (w, n), rows, "raw", "RGBX", 0, 1)
    return np.asarray(band.resize((out_w, n), Image.Resampling.BICUBIC).convert("RGB"))


def fixed_point(rows: np.ndarray, out_w: int) -> np.ndarray:
    """Our generic pass with ATen's coefficients: what runs with stock Pillow where the kernel does not."""
    out = np.zeros((rows.shape[0], out_w, 3), np.uint8)
    coefficients = resample.axis_coefficients(rows.shape[1], out_w, resample.BICUBIC, aten=True)
    resample.horizontal_pass(rows, 0, *coefficients, out)
    return out


def kernel_for(in_w: int, out_w: int) -> kernel_module.AtenHorizontal | None:
    # The kernel is generic LLVM IR: against our fixed-point pass it is used on every host.
    return aten_horizontal(in_w, out_w, pillow_simd=False)


@pytest.mark.parametrize("oracle", [pytest.param(pillow_simd, marks=needs_pillow_simd), fixed_point])
@settings(max_examples=200, deadline=None)
@given(
    in_w=st.integers(4, 4200),
    ratio=st.one_of(st.floats(0.12, 0.999), st.floats(1.001, 4.0)),
    n=st.integers(1, 5),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_byte_equals_pillow_simds_and_our_fixed_point_pass(oracle, in_w, ratio, n, seed):
    out_w = min(max(1, int(in_w * ratio)), 16000)
    kernel = kernel_for(in_w, out_w)
    if kernel is None:  # the same width, over 32 taps, or a row narrower than a window: another pass's job
        bounds = resample.axis_coefficients(in_w, out_w, resample.BICUBIC, aten=True)[0]
        taps = int(bounds[:, 1].max())
        window = 4 if taps <= 4 else -(-taps // 8) * 8
        assert out_w == in_w or window > 32 or in_w < window
        return
    rows = np.random.default_rng(seed).integers(0, 256, (n, in_w, 4), np.uint8)
    out = np.full((n, out_w, 4), 77, np.uint8)
    kernel(rows, out)
    assert np.array_equal(out[..., :3], oracle(rows, out_w))


@pytest.mark.parametrize("oracle", [pytest.param(pillow_simd, marks=needs_pillow_simd), fixed_point])
@pytest.mark.parametrize(
    ("in_w", "out_w"),
    [(4032, 1148), (1920, 1316), (1000, 999), (37, 28), (8, 7), (8000, 1000), (640, 644), (1280, 1288), (4, 9), (5, 7)],
)
def test_the_sizes_that_matter_and_the_edges(in_w, out_w, oracle):
    # Widths whose last quad is partial (1148 = 4 * 287, 1316 = 4 * 329, 644, 1288: whole; 999, 7,
    # 9: not), the narrowest rows one window fits (8 pixels for a group, 4 for a half group), 4
    # groups of taps, and half groups (widening).
    rows = np.random.default_rng(in_w).integers(0, 256, (3, in_w, 4), np.uint8)
    rows[1] = 255  # flat extremes: clipping on both sides
    rows[2, :, :3] = 0
    out = np.empty((3, out_w, 4), np.uint8)
    kernel_for(in_w, out_w)(rows, out)
    assert np.array_equal(out[..., :3], oracle(rows, out_w))


@pytest.mark.parametrize("pillow_simd", [True, False], ids=["against pillow-simd", "against our pass"])
def test_where_others_run_instead(pillow_simd, monkeypatch):
    # pillow-simd where it is the installed PIL (only AVX-512 BW hosts take the kernel), else our
    # fixed-point pass (every host takes the kernel): mmworker.common.resize.
    for fast in (True, False):
        monkeypatch.setattr(kernel_module, "FAST_HERE", fast)
        if fast or not pillow_simd:
            assert aten_horizontal(640, 644, pillow_simd=pillow_simd).groups == kernel_module._HALF_GROUP  # widening
            assert aten_horizontal(1000, 999, pillow_simd=pillow_simd).groups == kernel_module._HALF_GROUP  # 4 taps
            assert aten_horizontal(1000, 900, pillow_simd=pillow_simd).groups == 1
            assert aten_horizontal(4032, 1148, pillow_simd=pillow_simd).groups == 2
        else:
            assert aten_horizontal(4032, 1148, pillow_simd=pillow_simd) is None
        assert aten_horizontal(640, 640, pillow_simd=pillow_simd) is None
        assert aten_horizontal(3, 9, pillow_simd=pillow_simd) is None  # narrower than a window of 4
        assert aten_horizontal(9000, 100, pillow_simd=pillow_simd) is None  # 90 x 4 taps + 1 per output: over 32


def test_bad_arguments_are_refused():
    kernel = kernel_for(64, 40)
    with pytest.raises(MmError, match="64 -> 40"):
        kernel(np.zeros((2, 63, 4), np.uint8), np.zeros((2, 40, 4), np.uint8))
    with pytest.raises(MmError, match="C-contiguous uint8"):
        kernel(np.zeros((2, 64, 4), np.uint8), np.zeros((2, 40, 4), np.uint8, order="F"))


@pytest.mark.skipif(
    IS_PILLOW_SIMD and not FAST_HERE, reason="with pillow-simd installed the kernel is used only with AVX-512 BW"
)
@pytest.mark.parametrize(
    ("width", "height", "fmt", "max_pixels"),
    [
        (1920, 1080, "JPEG", 1003520),  # whole decode, narrowed in place in bands
        (2048, 1536, "JPEG", 401408),  # streamed: decoded pixels outweigh the feature
        (1920, 1080, "PNG", 1003520),  # 3-byte pixels: pillow-simd or our fixed-point pass either way
        (1290, 730, "JPEG", 1003520),  # widening (1290 -> 1316): half groups
        (640, 480, "JPEG", 1003520),  # widening both ways (640 -> 644)
        (1289, 730, "JPEG", 1003520),  # narrowing by one pixel (1289 -> 1288): half groups, in place
    ],
)
def test_pixel_values_are_the_same_with_and_without_the_kernel(monkeypatch, width, height, fmt, max_pixels):
    spec = {**named_spec("qwen2_vl"), "max_pixels": max_pixels}
    data = encode(photo_like(width, height, seed=3), fmt)
    with_kernel, grid = preprocess(data, spec)
    # Without it: pillow-simd where it is the installed PIL, else our fixed-point pass.
    monkeypatch.setattr(resize_module, "aten_horizontal", lambda in_w, out_w, pillow_simd: None)
    without, grid_without = preprocess(data, spec)
    assert grid == grid_without and np.array_equal(with_kernel, without)
