"""The aten_u8 horizontal-pass kernel: every byte pillow-simd's, and used only where it should be."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from mmworker.common import aten_horizontal as kernel_module
from mmworker.common import resample
from mmworker.common import resize as resize_module
from mmworker.common.aten_horizontal import FAST_HERE, aten_horizontal
from mmworker.corpus import encode, photo_like
from mmworker.errors import MmError
from mmworker.qwen_vl import preprocess
from mmworker.registry import named_spec

needs_kernel = pytest.mark.skipif(not FAST_HERE, reason="the kernel is used only with AVX-512 BW")


def pillow_simd(rows: np.ndarray, out_w: int) -> np.ndarray:
    n, w = rows.shape[:2]
    band = Image.frombuffer("RGBX", (w, n), rows, "raw", "RGBX", 0, 1)
    return np.asarray(band.resize((out_w, n), Image.Resampling.BICUBIC).convert("RGB"))


@needs_kernel
@settings(max_examples=200, deadline=None)
@given(
    in_w=st.integers(4, 4200),
    ratio=st.one_of(st.floats(0.12, 0.999), st.floats(1.001, 4.0)),
    n=st.integers(1, 5),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_byte_equals_pillow_simd(in_w, ratio, n, seed):
    out_w = min(max(1, int(in_w * ratio)), 16000)
    kernel = aten_horizontal(in_w, out_w)
    if kernel is None:  # the same width, over 32 taps, or a row narrower than a window: pillow-simd's job
        bounds = resample.axis_coefficients(in_w, out_w, resample.BICUBIC, aten=True)[0]
        taps = int(bounds[:, 1].max())
        window = 4 if taps <= 4 else -(-taps // 8) * 8
        assert out_w == in_w or window > 32 or in_w < window or (out_w > in_w and taps > 4)
        return
    rows = np.random.default_rng(seed).integers(0, 256, (n, in_w, 4), np.uint8)
    out = np.full((n, out_w, 4), 77, np.uint8)
    kernel(rows, out)
    assert np.array_equal(out[..., :3], pillow_simd(rows, out_w))


@needs_kernel
@pytest.mark.parametrize(
    ("in_w", "out_w"),
    [(4032, 1148), (1920, 1316), (1000, 999), (37, 28), (8, 7), (8000, 1000), (640, 644), (1280, 1288), (4, 9), (5, 7)],
)
def test_the_sizes_that_matter_and_the_edges(in_w, out_w):
    # Widths whose last quad is partial (1148 = 4 * 287, 1316 = 4 * 329, 644, 1288: whole; 999, 7,
    # 9: not), the narrowest rows one window fits (8 pixels for a group, 4 for a half group), 4
    # groups of taps, and half groups (widening).
    rows = np.random.default_rng(in_w).integers(0, 256, (3, in_w, 4), np.uint8)
    rows[1] = 255  # flat extremes: clipping on both sides
    rows[2, :, :3] = 0
    out = np.empty((3, out_w, 4), np.uint8)
    aten_horizontal(in_w, out_w)(rows, out)
    assert np.array_equal(out[..., :3], pillow_simd(rows, out_w))


def test_where_pillow_simd_runs_instead(monkeypatch):
    if FAST_HERE:
        assert aten_horizontal(640, 644).groups == kernel_module._HALF_GROUP  # widening: 4 taps at most
        assert aten_horizontal(1000, 999).groups == kernel_module._HALF_GROUP  # narrowing, still 4 taps
        assert aten_horizontal(1000, 900).groups == 1
    assert aten_horizontal(640, 640) is None
    assert aten_horizontal(3, 9) is None  # narrower than a window of 4
    assert aten_horizontal(9000, 100) is None  # 90 x 4 taps + 1 per output: more than 32
    monkeypatch.setattr(kernel_module, "FAST_HERE", False)
    assert aten_horizontal(4032, 1148) is None


def test_bad_arguments_are_refused():
    kernel = aten_horizontal(64, 40) if FAST_HERE else None
    if kernel is None:
        pytest.skip("the kernel is used only with AVX-512 BW")
    with pytest.raises(MmError, match="64 -> 40"):
        kernel(np.zeros((2, 63, 4), np.uint8), np.zeros((2, 40, 4), np.uint8))
    with pytest.raises(MmError, match="C-contiguous uint8"):
        kernel(np.zeros((2, 64, 4), np.uint8), np.zeros((2, 40, 4), np.uint8, order="F"))


@needs_kernel
@pytest.mark.parametrize(
    ("width", "height", "fmt", "max_pixels"),
    [
        (1920, 1080, "JPEG", 1003520),  # whole decode, narrowed in place in bands
        (2048, 1536, "JPEG", 401408),  # streamed: decoded pixels outweigh the feature
        (1920, 1080, "PNG", 1003520),  # 3-byte pixels: pillow-simd either way
        (1290, 730, "JPEG", 1003520),  # widening (1290 -> 1316): half groups
        (640, 480, "JPEG", 1003520),  # widening both ways (640 -> 644)
        (1289, 730, "JPEG", 1003520),  # narrowing by one pixel (1289 -> 1288): half groups, in place
    ],
)
def test_pixel_values_are_the_same_with_and_without_the_kernel(monkeypatch, width, height, fmt, max_pixels):
    spec = {**named_spec("qwen2_vl"), "max_pixels": max_pixels}
    data = encode(photo_like(width, height, seed=3), fmt)
    with_kernel, grid = preprocess(data, spec)
    monkeypatch.setattr(resize_module, "aten_horizontal", lambda in_w, out_w: None)
    without, grid_without = preprocess(data, spec)
    assert grid == grid_without and np.array_equal(with_kernel, without)
