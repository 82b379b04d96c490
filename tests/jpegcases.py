"""JPEG cases shared by the tests of the streamed decodes (mmworker.common.jpeg_rows, jpeg_planes)."""

import io

import numpy as np
from PIL import Image

from mmworker.common.jpeg_rows import JpegRows
from mmworker.corpus import encode, photo_like


def jpeg(width: int, height: int, flat_from: int | None = None) -> bytes:
    pixels = photo_like(width, height, seed=width + height)
    if flat_from is not None:  # flat rows compress to a few bytes each: many rows per chunk
        pixels[flat_from:] = 250
    return encode(pixels, "JPEG")


def encoded(pixels: np.ndarray, **options) -> bytes:
    """A JPEG saved with Pillow's options (corpus.encode fixes quality 90 and 4:2:0)."""
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", **options)
    return out.getvalue()


class Collect:
    """A sink that checks the bands' order and keeps a copy of every row."""

    def __init__(self, width: int, height: int) -> None:
        self.rows = np.zeros((height, width, 4), np.uint8)
        self.bands: list[tuple[int, int, int]] = []  # first row, rows, address

    def __call__(self, first: int, rows: np.ndarray) -> None:
        expected = sum(n for _, n, _ in self.bands)
        assert first == expected, "bands must be consecutive"
        assert rows.dtype == np.uint8 and rows.shape[1:] == self.rows.shape[1:] and rows.flags.c_contiguous
        self.rows[first : first + rows.shape[0]] = rows
        self.bands.append((first, rows.shape[0], rows.ctypes.data))


def count_pillow_decodes(monkeypatch) -> list:
    """The list that each of Pillow's decodes (JpegRows._decode) appends its hook to, from now on."""
    calls = []
    pillow_decode = JpegRows._decode

    def counted(self, before_read):
        calls.append(before_read)
        return pillow_decode(self, before_read)

    monkeypatch.setattr(JpegRows, "_decode", counted)
    return calls
