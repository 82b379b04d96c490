"""The float antialiased bilinear kernel (video frames) against a plain numpy transcription of ATen's arithmetic,
and both against torch's bytes in tests/golden/float_bilinear.npz.

The oracle is docs/behaviour.md §5.5 written out differently from the kernel: per axis a dense
float32 weight matrix built with numpy scalars one C++ step at a time, then a pass over tap
positions on whole arrays, the fused multiply-adds emulated exactly in float64 (round to odd,
then to float32). The golden file (tests/golden/generate_float_bilinear.py, torch 2.14.1's AVX-512
build) holds torch's uint8 outputs and, before the rounding, the SHA-256 of its float32 values: the
oracle must reproduce those to the last bit, so the suite is anchored to torch without torch.
torch itself is compared on many more sizes in tests/sglang_env/test_float_bilinear_torch.py.
"""

import hashlib

import numpy as np
import pytest
from conftest import GOLDEN
from hypothesis import given, settings
from hypothesis import strategies as st

from mmworker.common.float_bilinear import axis_plan, resize_frame, resize_frames
from mmworker.corpus import photo_like
from mmworker.errors import MmError

f32, f64 = np.float32, np.float64


def oracle_weights(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dense float32 [out_size, in_size] weights, first tap, tap count) as ATen's
    `_compute_indices_min_size_weights_aa` with float32 scalars and HelperInterpLinear's triangle."""
    scale = f32(in_size) / f32(out_size)  # area_pixel_compute_scale: float(in) / out, also for out == 1
    support = f32(1.0 * f64(scale)) if scale >= 1.0 else f32(1.0)  # (interp_size * 0.5) * scale
    max_taps = int(np.ceil(support)) * 2 + 1
    invscale = f32(1.0 / f64(scale)) if scale >= 1.0 else f32(1.0)
    matrix = np.zeros((out_size, in_size), f32)
    first = np.zeros(out_size, int)
    count = np.zeros(out_size, int)
    for i in range(out_size):
        center = f32(f64(scale) * (i + 0.5))
        xmin = max(int(f64(f32(center - support)) + 0.5), 0)
        xsize = min(max(min(int(f64(f32(center + support)) + 0.5), in_size) - xmin, 0), max_taps)
        ws = []
        for j in range(xsize):
            arg = f32((f64(f32(f32(j + xmin) - center)) + 0.5) * f64(invscale))  # the filter takes a float
            arg = abs(arg)
            ws.append(f32(1.0 - f64(arg)) if arg < 1.0 else f32(0.0))
        total = f32(0.0)
        for w in ws:  # left to right, in float32
            total = f32(total + w)
        if total != 0.0:
            ws = [f32(w / total) for w in ws]
        matrix[i, xmin : xmin + xsize] = ws
        first[i], count[i] = xmin, xsize
    return matrix, first, count


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 a * b + c rounded once: the float64 product is exact, the float64 sum is rounded to odd
    (TwoSum's error tells which way), and rounding that to float32 is then the correct rounding."""
    a, b, c = (np.asarray(v, f32).astype(f64) for v in (a, b, c))
    p = a * b
    s = p + c
    bv = s - p
    err = (p - (s - bv)) + (c - bv)
    odd_fix = (err != 0) & ((s.view(np.int64) & 1) == 0)
    s = np.where(odd_fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(f32)


def oracle_pass(x: np.ndarray, axis: int, out_size: int, fused: str = "tail") -> np.ndarray:
    """One pass along `axis` of float32 x. Each output's taps are summed in order from the first
    product; `fused` says which later taps are fused multiply-adds: "tail" (ATen's AVX2/AVX-512
    build: the last (count - 1) % 4), "none" or "all" (wrong models, to show the golden data tells)."""
    moved = np.moveaxis(x, axis, 0)
    in_size = moved.shape[0]
    matrix, first, count = oracle_weights(in_size, out_size)
    rows = np.arange(out_size)
    shape = (out_size,) + (1,) * (moved.ndim - 1)
    rest = count - 1
    plain_until = rest - rest % 4  # taps 1..plain_until are a rounded product then a rounded sum
    acc = None
    for j in range(int(count.max())):
        index = np.minimum(first + j, in_size - 1)
        taken = (j < count).reshape(shape)
        w = matrix[rows, index].reshape(shape)
        t = moved[index]
        if acc is None:
            acc = t * w
            continue
        fuse = (j > plain_until).reshape(shape) if fused == "tail" else np.full(shape, fused == "all")
        summed = np.where(fuse, fma32(t, w, acc), (acc + t * w).astype(f32))
        acc = np.where(taken, summed, acc)
    return np.moveaxis(acc, 0, axis)


def oracle_float(frame: np.ndarray, out_h: int, out_w: int, fused: str = "tail") -> np.ndarray:
    """The float32 result before the rounding, width pass first, each pass only if its axis changes."""
    x = frame.astype(f32)
    if out_w != frame.shape[1]:
        x = oracle_pass(x, 1, out_w, fused)
    if out_h != frame.shape[0]:
        x = oracle_pass(x, 0, out_h, fused)
    return x


def oracle(frame: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    if frame.shape[:2] == (out_h, out_w):
        return frame.copy()
    return np.rint(oracle_float(frame, out_h, out_w)).astype(np.uint8)  # half to even, as torch.round


def frames_of(seed: int, t: int, h: int, w: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (t, h, w, 3), dtype=np.uint8)


def assert_frames_equal(ours: np.ndarray, expected: np.ndarray, what: str) -> None:
    differ = np.argwhere(ours != expected)
    assert not differ.size, f"{what}: {len(differ)} bytes differ, first at {differ[:3].tolist()}"


# --- the weights ---


@pytest.mark.parametrize(
    ("in_size", "out_size"),
    [(1920, 1008), (1080, 560), (53, 29), (37, 19), (7, 100), (83, 1), (1, 5), (5, 3), (100, 7), (3, 2), (2, 3)],
)
def test_axis_plan_equals_the_oracles_weights(in_size, out_size):
    first, count, weights = axis_plan(in_size, out_size)
    matrix, o_first, o_count = oracle_weights(in_size, out_size)
    np.testing.assert_array_equal(first, o_first)
    np.testing.assert_array_equal(count, o_count)
    dense = np.zeros_like(matrix)
    for i in range(out_size):
        dense[i, first[i] : first[i] + count[i]] = weights[i, : count[i]]
        assert not weights[i, count[i] :].any()
    np.testing.assert_array_equal(dense, matrix)


# --- the kernel against the oracle ---


@settings(max_examples=120, deadline=None)
@given(
    t=st.integers(1, 3),
    in_h=st.integers(1, 90),
    in_w=st.integers(1, 90),
    out_h=st.integers(1, 120),
    out_w=st.integers(1, 120),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_frames_and_sizes_equal_the_oracle(t, in_h, in_w, out_h, out_w, seed):
    frames = frames_of(seed, t, in_h, in_w)
    ours = resize_frames(frames, out_h, out_w)
    assert ours.shape == (t, out_h, out_w, 3) and ours.dtype == np.uint8
    for i in range(t):
        assert_frames_equal(ours[i], oracle(frames[i], out_h, out_w), f"frame {i} {in_h}x{in_w} -> {out_h}x{out_w}")


@pytest.mark.parametrize(
    ("in_h", "in_w", "out_h", "out_w"),
    [
        (1, 1, 1, 5), (1, 1, 7, 1), (1, 1, 9, 13), (13, 9, 1, 1), (1, 40, 1, 17), (40, 1, 17, 1), (2, 2, 1, 1),
        (33, 47, 33, 20), (33, 47, 15, 47), (33, 47, 95, 47), (33, 47, 33, 130),  # one axis only
        (17, 300, 16, 3), (300, 17, 2, 17), (250, 250, 1, 1), (3, 4, 31, 61),  # windows of 100-500 taps; x10
        (35, 48, 34, 47), (16, 16, 17, 17), (31, 33, 32, 16),  # near 1:1, bands of exactly 16 rows, odd
    ],
)  # fmt: skip
def test_edge_sizes_equal_the_oracle(in_h, in_w, out_h, out_w):
    frames = frames_of(in_h * 1000 + in_w, 2, in_h, in_w)
    ours = resize_frames(frames, out_h, out_w)
    for i in range(2):
        assert_frames_equal(ours[i], oracle(frames[i], out_h, out_w), f"{in_h}x{in_w} -> {out_h}x{out_w}")


@pytest.mark.parametrize("content", ["photo", "noise"])
def test_1080p_to_560x1008_equals_the_oracle(content):
    # The resize SGLang spends most of its video preprocessing in (1920x1080 -> smart_resize's 1008x560).
    frame = photo_like(1920, 1080, seed=3) if content == "photo" else frames_of(11, 1, 1080, 1920)[0]
    ours = resize_frame(frame, 560, 1008)
    assert_frames_equal(ours, oracle(frame, 560, 1008), f"1080p {content}")


def test_a_batch_equals_its_frames_one_by_one():
    # The scratch (bands, ring) is reused across frames: nothing of one frame may reach the next.
    frames = frames_of(5, 4, 45, 70)
    frames[1] = 255
    frames[2] = 0
    batch = resize_frames(frames, 23, 33)
    for i in range(4):
        np.testing.assert_array_equal(batch[i], resize_frame(frames[i].copy(), 23, 33))
    np.testing.assert_array_equal(batch[1], 255)
    np.testing.assert_array_equal(batch[2], 0)


# --- torch's golden bytes ---


@pytest.fixture(scope="module")
def golden():
    with np.load(GOLDEN / "float_bilinear.npz") as npz:
        data = {name: npz[name] for name in npz.files}
    cases = [(int(h), int(w)) for h, w in data["cases"]]
    return data, cases


def sha256(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def test_kernel_equals_torchs_golden_bytes(golden):
    data, cases = golden
    frame = data["frame"]
    assert frame.shape == (37, 53, 3) and len(cases) >= 10
    whole = 0
    for i, (h, w) in enumerate(cases):
        ours = resize_frame(frame, h, w)
        if f"u8_{h}x{w}" in data:
            assert_frames_equal(ours, data[f"u8_{h}x{w}"], f"golden {h}x{w}")
            whole += 1
        assert sha256(ours) == data["u8_sha256"][i].decode(), f"golden {h}x{w}"
    assert whole >= 4


def test_oracle_equals_torchs_float_values_to_the_last_bit(golden):
    data, cases = golden
    for i, (h, w) in enumerate(cases):
        values = oracle_float(data["frame"], h, w).astype("<f4")
        assert sha256(values) == data["f32_sha256"][i].decode(), f"golden float values {h}x{w}"
        assert sha256(np.rint(values).astype(np.uint8)) == data["u8_sha256"][i].decode()


@pytest.mark.parametrize("fused", ["none", "all"])
def test_the_golden_values_tell_which_taps_are_fused(golden, fused):
    # Summing with no fused multiply-add (ATen's build without AVX2) or fusing every tap gives other
    # float values: the golden hashes pin the split the kernel reproduces.
    data, cases = golden
    differ = [
        (h, w)
        for i, (h, w) in enumerate(cases)
        if sha256(oracle_float(data["frame"], h, w, fused).astype("<f4")) != data["f32_sha256"][i].decode()
    ]
    assert len(differ) >= 3, differ


# --- the API ---


def test_output_is_written_in_place_and_returned():
    frames = frames_of(1, 2, 20, 30)
    out = np.full((2, 9, 14, 3), 7, np.uint8)
    assert resize_frames(frames, 9, 14, out) is out
    np.testing.assert_array_equal(out, resize_frames(frames, 9, 14))
    single = np.zeros((9, 14, 3), np.uint8)
    assert resize_frame(frames[1], 9, 14, single) is single
    np.testing.assert_array_equal(single, out[1])


def test_the_target_size_is_a_copy_and_no_frames_are_no_work():
    frames = frames_of(2, 2, 12, 13)
    same = resize_frames(frames, 12, 13)
    assert same is not frames and not np.shares_memory(same, frames)
    np.testing.assert_array_equal(same, frames)
    assert resize_frames(np.zeros((0, 12, 13, 3), np.uint8), 5, 6).shape == (0, 5, 6, 3)


@pytest.mark.parametrize(
    ("frames", "out_h", "out_w", "out", "message"),
    [
        (np.zeros((1, 4, 4, 3), np.uint8), 0, 2, None, "out_h must be a positive integer, got 0"),
        (np.zeros((1, 4, 4, 3), np.uint8), 2, True, None, "out_w must be a positive integer, got True"),
        (np.zeros((1, 4, 4, 3), np.uint8), 2.0, 2, None, "out_h must be a positive integer, got 2.0"),
        (np.zeros((1, 4, 4, 3), np.float32), 2, 2, None, r"expected uint8 frames \[T, H, W, 3\], got ndarray"),
        (np.zeros((1, 4, 4, 4), np.uint8), 2, 2, None, r"expected uint8 frames \[T, H, W, 3\].*\(1, 4, 4, 4\)"),
        (np.zeros((4, 4, 3), np.uint8), 2, 2, None, r"expected uint8 frames \[T, H, W, 3\].*\(4, 4, 3\)"),
        (np.zeros((1, 4, 8, 3), np.uint8)[:, :, ::2], 2, 2, None, "frames must be C-contiguous"),
        (np.zeros((1, 0, 4, 3), np.uint8), 2, 2, None, "frames of 0x4 pixels"),
        (np.zeros((1, 4, 4, 3), np.uint8), 2, 2, np.zeros((1, 2, 3, 3), np.uint8), r"out must be .*\(1, 2, 2, 3\)"),
        (np.zeros((1, 4, 4, 3), np.uint8), 2, 2, np.zeros((1, 2, 2, 3), np.int16), "out must be a C-contiguous uint8"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused_with_their_cause(frames, out_h, out_w, out, message):
    with pytest.raises(MmError, match=message):
        resize_frames(frames, out_h, out_w, out)


def test_an_overlapping_output_and_a_batch_given_as_one_frame_are_refused():
    frames = np.zeros((1, 8, 8, 3), np.uint8)
    inside = frames.reshape(-1)[:48].reshape(1, 4, 4, 3)  # the frames' own first bytes
    with pytest.raises(MmError, match="out overlaps frames"):
        resize_frames(frames, 4, 4, inside)
    with pytest.raises(MmError, match=r"expected a uint8 frame \[H, W, 3\]"):
        resize_frame(frames, 2, 2)
