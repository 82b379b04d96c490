"""mmworker.common.float_bilinear against torchvision itself, the way SGLang's Qwen video path calls it.

SGLang (qwen_vl.py `preprocess_video`) decodes NHWC uint8 frames, permutes them to TCHW and calls
torchvision's v1 `resize(video, [h, w], BILINEAR)`; every byte of ours must equal its output, on
many seeded random sizes (narrowing, widening, mixed, 1-pixel), the 1080p -> 560x1008 case and the
targets of SGLang's own smart_resize (factor 28). Also pinned here: what the docs say about torch's
side (1 or 2 threads and a contiguous copy give the same bytes except in one ATen quirk; ATen's
AVX2 build sums as its AVX-512 one, its build without AVX2 does not).
"""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from llvmlite import binding
from sglang.srt.multimodal.processors.qwen_vl import (
    FRAME_FACTOR,
    VIDEO_MAX_PIXELS,
    VIDEO_MIN_PIXELS,
    VIDEO_TOTAL_PIXELS,
    smart_resize,
)
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as F

from mmworker.common.float_bilinear import resize_frames
from mmworker.corpus import photo_like


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def torchvision_resize(frames: np.ndarray, out_h: int, out_w: int, contiguous: bool = False) -> np.ndarray:
    """SGLang's call on NHWC frames: permute to TCHW (a channels-last view), resize, permute back."""
    video = torch.from_numpy(frames).permute(0, 3, 1, 2)
    if contiguous:
        video = video.contiguous()
    resized = F.resize(video, [out_h, out_w], interpolation=InterpolationMode.BILINEAR)
    return resized.permute(0, 2, 3, 1).numpy()


def mismatches(frames: np.ndarray, out_h: int, out_w: int) -> int:
    ours = resize_frames(frames, out_h, out_w)
    return int(np.count_nonzero(ours != torchvision_resize(frames, out_h, out_w)))


def random_cases(seed: int, n: int, largest_in: int, largest_out: int) -> list[tuple[int, int, int, int, int]]:
    rng = np.random.default_rng(seed)
    return [
        (int(rng.integers(1, 4)), *(int(v) for v in rng.integers(1, largest_in + 1, 2)),
         *(int(v) for v in rng.integers(1, largest_out + 1, 2)))
        for _ in range(n)
    ]  # fmt: skip


def test_many_random_sizes_every_byte_equal():
    cases = random_cases(48, 400, 100, 140)
    cases += [(t, h, w, oh, ow) for t in (1, 2) for h, w, oh, ow in
              [(1, 1, 1, 9), (1, 1, 9, 1), (1, 1, 5, 5), (9, 9, 1, 1), (1, 30, 1, 7), (30, 1, 7, 1), (20, 5, 15, 1),
               (5, 20, 1, 15), (37, 53, 37, 29), (37, 53, 19, 53), (16, 16, 32, 8), (2, 2, 1, 1)]]  # fmt: skip
    failed, checked = [], 0
    for i, (t, in_h, in_w, out_h, out_w) in enumerate(cases):
        frames = np.random.default_rng(i).integers(0, 256, (t, in_h, in_w, 3), dtype=np.uint8)
        bad = mismatches(frames, out_h, out_w)
        checked += t * out_h * out_w * 3
        if bad:
            failed.append(((t, in_h, in_w, out_h, out_w), bad))
    assert not failed, f"bytes differ in {len(failed)} of {len(cases)} cases ({checked} bytes): {failed[:10]}"


def test_larger_random_sizes_every_byte_equal():
    failed = []
    for i, (t, in_h, in_w, out_h, out_w) in enumerate(random_cases(49, 24, 700, 700)):
        frames = np.random.default_rng(1000 + i).integers(0, 256, (min(t, 2), in_h, in_w, 3), dtype=np.uint8)
        bad = mismatches(frames, out_h, out_w)
        if bad:
            failed.append(((min(t, 2), in_h, in_w, out_h, out_w), bad))
    assert not failed, failed


def test_1080p_to_560x1008_every_byte_equal():
    # SGLang's own target for a 1920x1080 video (smart_resize, factor 28), on a photo and on noise.
    assert smart_resize(1080, 1920, factor=28, min_pixels=VIDEO_MIN_PIXELS, max_pixels=VIDEO_MAX_PIXELS) == (560, 1008)
    frames = np.stack([photo_like(1920, 1080, seed=7), np.random.default_rng(7).integers(0, 256, (1080, 1920, 3))])
    assert mismatches(frames.astype(np.uint8), 560, 1008) == 0


@pytest.mark.parametrize(
    ("width", "height", "nframes"),
    [(640, 360, 8), (854, 480, 60), (1280, 720, 60), (720, 1280, 60), (1366, 768, 60), (480, 640, 768),
     (1920, 1080, 768), (352, 288, 4), (3840, 2160, 2), (200, 100, 2)],
)  # fmt: skip
def test_smart_resize_targets_every_byte_equal(width, height, nframes):
    # SGLang's preprocess_video: max_pixels from the frame count, then smart_resize with factor 28.
    max_pixels = max(min(VIDEO_MAX_PIXELS, VIDEO_TOTAL_PIXELS / nframes * FRAME_FACTOR), int(VIDEO_MIN_PIXELS * 1.05))
    out_h, out_w = smart_resize(height, width, factor=28, min_pixels=VIDEO_MIN_PIXELS, max_pixels=max_pixels)
    frames = np.stack(
        [photo_like(width, height, seed=nframes), np.random.default_rng(nframes).integers(0, 256, (height, width, 3))]
    )
    assert mismatches(frames.astype(np.uint8), out_h, out_w) == 0, (out_h, out_w)


def test_torch_gives_the_same_bytes_on_two_threads_and_from_a_contiguous_copy():
    for i, (t, in_h, in_w, out_h, out_w) in enumerate(random_cases(50, 60, 300, 300)):
        frames = np.random.default_rng(i).integers(0, 256, (t, in_h, in_w, 3), dtype=np.uint8)
        one = torchvision_resize(frames, out_h, out_w)
        torch.set_num_threads(2)
        two = torchvision_resize(frames, out_h, out_w)
        torch.set_num_threads(1)
        np.testing.assert_array_equal(one, two)
        if out_w > 1:  # see the next test
            np.testing.assert_array_equal(one, torchvision_resize(frames, out_h, out_w, contiguous=True))


def test_a_contiguous_input_narrowed_to_one_column_repeats_its_first_row():
    # ATen's quirk, out of SGLang's reach (its input is the channels-last view, and factor 28 keeps
    # widths >= 28): from a contiguous NCHW tensor with the width going to 1 and the height changing,
    # the vertical pass runs along H with every output row computed with row 0's window and weights.
    frames = np.random.default_rng(3).integers(0, 256, (2, 20, 5, 3), dtype=np.uint8)
    contiguous = torchvision_resize(frames, 15, 1, contiguous=True)
    assert (contiguous == contiguous[:, :1]).all()
    channels_last = torchvision_resize(frames, 15, 1)
    assert not (channels_last == channels_last[:, :1]).all()
    np.testing.assert_array_equal(resize_frames(frames, 15, 1), channels_last)


CAPABILITY_RUN = textwrap.dedent("""
    import sys, numpy as np, torch
    from torchvision.transforms import InterpolationMode, functional as F
    torch.set_num_threads(1)
    frames = np.load(sys.argv[1])
    out = F.resize(torch.from_numpy(frames).permute(0, 3, 1, 2), [int(sys.argv[2]), int(sys.argv[3])],
                   interpolation=InterpolationMode.BILINEAR)
    np.save(sys.argv[4], out.permute(0, 2, 3, 1).numpy())
    print(torch.backends.cpu.get_cpu_capability())
""")


def torch_under(capability: str, frames: np.ndarray, out_h: int, out_w: int, tmp_path) -> np.ndarray:
    src, dst = tmp_path / f"{capability}_in.npy", tmp_path / f"{capability}_out.npy"
    np.save(src, frames)
    run = subprocess.run(
        [sys.executable, "-c", CAPABILITY_RUN, str(src), str(out_h), str(out_w), str(dst)],
        capture_output=True, text=True, timeout=300, env={"ATEN_CPU_CAPABILITY": capability, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-1].lower() == capability, run.stdout
    return np.load(dst)


@pytest.mark.skipif(not binding.get_host_cpu_features().get("avx2"), reason="the host has no AVX2")
def test_atens_avx2_build_gives_these_bytes_and_its_plain_build_does_not(tmp_path):
    # One 1080p frame (the FMA tail shows in a handful of bytes) and a narrowing by ~7 (windows of ~29 taps).
    frames = np.stack([photo_like(1920, 1080, seed=5)])
    small = np.random.default_rng(8).integers(0, 256, (1, 300, 700, 3), dtype=np.uint8)
    for batch, out_h, out_w in ((frames, 560, 1008), (small, 300, 100)):
        ours = resize_frames(batch, out_h, out_w)
        np.testing.assert_array_equal(torch_under("avx2", batch, out_h, out_w, tmp_path), ours)
    plain = [np.count_nonzero(torch_under("default", b, h, w, tmp_path) != resize_frames(b, h, w))
             for b, h, w in ((frames, 560, 1008), (small, 300, 100))]  # fmt: skip
    assert sum(plain) > 0, "ATen's build without AVX2 summed like its AVX2 one"
