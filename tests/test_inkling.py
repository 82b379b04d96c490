"""inkling: bf16 patch bits, the extra padding column, the Lanczos rescale, and the content hash."""

import io

import numpy as np
import pytest
from PIL import Image

from mmworker import MmError
from mmworker.common.hashing import content_hash
from mmworker.inkling import (
    bf16_bits,
    decode_patchify,
    decode_patchify_batch,
    grid,
    patchify_rgb,
    preprocess_images,
    rescale_patchify_hash,
)
from mmworker.inkling.patches import MEAN, PAD_RAW, STD


def reference_bits(arr, ps):
    """docs/behaviour.md §8 spelled out with numpy: pad to the grid, then reorder into HWC patches."""
    h, w, _ = arr.shape
    rows, cols = -(-h // ps), w // ps + 1
    values = (arr.astype(np.float32) * np.float32(1 / 255) - MEAN) / STD
    canvas = np.broadcast_to((PAD_RAW - MEAN) / STD, (rows * ps, cols * ps, 3)).copy()
    canvas[:h, :w] = values
    patches = canvas.reshape(rows, ps, cols, ps, 3).transpose(0, 2, 1, 3, 4)
    return bf16_bits(patches.reshape(-1))


def test_bf16_rounding_is_nearest_even():
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5, 3.0e38], np.float32)  # ties go to even
    assert bf16_bits(x).tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F62]


@pytest.mark.parametrize(("h", "w", "ps"), [(37, 53, 40), (40, 40, 40), (80, 120, 40), (5, 7, 2), (1, 1, 3)])
def test_patchify_matches_reference(h, w, ps):
    arr = np.random.default_rng(h * w).integers(0, 256, (h, w, 3), dtype=np.uint8)
    bits = patchify_rgb(arr, ps)
    rows, cols = grid(h, w, ps)
    assert bits.dtype == np.uint16 and bits.size == rows * cols * ps * ps * 3
    np.testing.assert_array_equal(bits, reference_bits(arr, ps))


def test_extra_column_even_when_width_divides():
    assert grid(40, 40, 40) == (1, 2)
    bits = patchify_rgb(np.zeros((40, 40, 3), np.uint8), 40).reshape(1, 2, 40, 40, 3)
    pad = bf16_bits((PAD_RAW - MEAN) / STD)
    assert (bits[0, 1] == pad).all()


def test_decode_rescale_hash():
    arr = np.random.default_rng(0).integers(0, 256, (30, 50, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    data = buf.getvalue()
    h, w, bits = decode_patchify(data, 16)
    assert (h, w) == (30, 50)
    np.testing.assert_array_equal(bits, patchify_rgb(arr, 16))
    h2, w2, bits2 = decode_patchify(data, 16, 2.0, 80)  # long edge 50 -> 100, capped at 80
    assert (h2, w2) == (48, 80)
    [(h3, w3, bits3, digest)] = preprocess_images([data], 16, 2.0, 80)
    assert (h3, w3) == (48, 80) and digest == content_hash(data)
    np.testing.assert_array_equal(bits3, bits2)
    assert [b[:2] for b in decode_patchify_batch([data, data], 16)] == [(30, 50), (30, 50)]
    h4, w4, bits4, digest4 = rescale_patchify_hash(arr, data, 16, 2.0, 80)
    assert (h4, w4, digest4) == (48, 80, digest)
    np.testing.assert_array_equal(bits4, bits2)


def test_errors():
    with pytest.raises(MmError, match=r"^patch_size must be greater than zero$"):
        patchify_rgb(np.zeros((4, 4, 3), np.uint8), 0)
    with pytest.raises(MmError, match=r"^expected a uint8 HWC RGB array with 3 channels$"):
        patchify_rgb(np.zeros((4, 4, 4), np.uint8), 2)
    with pytest.raises(MmError, match="image decode"):
        decode_patchify(b"nope", 40)


def test_parity_with_rust_extension(rust_ext):
    rng = np.random.default_rng(9)
    for h, w in ((37, 53), (40, 40), (200, 320), (1, 1)):
        arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        np.testing.assert_array_equal(patchify_rgb(arr, 40), np.asarray(rust_ext.inkling.patchify_rgb(arr, 40)))
    arr = rng.integers(0, 256, (108, 192, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    ours = decode_patchify(buf.getvalue(), 40, 2.0, 2048)
    theirs = rust_ext.inkling.decode_patchify(buf.getvalue(), 40, 2.0, 2048)
    assert ours[:2] == tuple(theirs[:2])
    np.testing.assert_array_equal(ours[2], np.asarray(theirs[2]))
