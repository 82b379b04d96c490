"""Benchmark of mmworker's PNG decoder against Pillow and the Rust extension.

Side by side in one process, one thread each, allocator tuned (mmworker.runtime), medians of
alternating rounds. Every case is first checked to decode to exactly Pillow's pixels. Columns:
`decode_png` (mmworker.common.png), Pillow (`np.asarray(Image.open(b).convert("RGB"))`) and the
Rust extension's `common.image_decode_rgb` from the sglang 0.5.23 wheel (a yardstick only, skipped
when scripts/get_reference_ext.sh has not fetched it).

    .venv/bin/python bench/bench_png.py [--rounds 5] [--budget 0.15]
"""

import argparse
import io
import os
import sys
import zlib
from functools import partial

import numpy as np
from yardstick import alternating_medians, load_reference_extension


def paeth_png(rgb: np.ndarray) -> bytes:
    """An RGB PNG whose rows all use the Paeth filter (libpng picks it for most photo rows; Pillow's
    encoder rarely does), zlib level 6: the slowest filter for any decoder."""
    h, w, _ = rgb.shape
    x = rgb.reshape(h, w * 3).astype(np.int16)
    b = np.zeros_like(x)
    b[1:] = x[:-1]
    a = np.zeros_like(x)
    a[:, 3:] = x[:, :-3]
    c = np.zeros_like(x)
    c[1:, 3:] = x[:-1, :-3]
    pa, pb, pc = np.abs(b - c), np.abs(a - c), np.abs(a + b - 2 * c)
    pred = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
    rows = np.empty((h, w * 3 + 1), np.uint8)
    rows[:, 0] = 4
    rows[:, 1:] = ((x - pred) & 255).astype(np.uint8)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")

    ihdr = w.to_bytes(4, "big") + h.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    idat = zlib.compress(rows.tobytes(), 6)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def cases() -> list[tuple[str, bytes]]:
    from PIL import Image

    from mmworker.corpus import photo_like

    def save(image: Image.Image) -> bytes:
        buf = io.BytesIO()
        image.save(buf, "PNG")  # Pillow's default compression (zlib level 6)
        return buf.getvalue()

    photo = photo_like(1280, 720, seed=1)
    ramp = np.linspace(0, 255, 1280, dtype=np.float32)[None, :].repeat(720, axis=0)
    alpha = (ramp * 0.5 + 64 + np.random.default_rng(1).normal(0, 4, ramp.shape)).clip(0, 255)
    rgba = np.dstack([photo, alpha.astype(np.uint8)])
    return [
        ("640x480 RGB", save(Image.fromarray(photo_like(640, 480, seed=1)))),
        ("1280x720 RGB", save(Image.fromarray(photo))),
        ("1920x1080 RGB", save(Image.fromarray(photo_like(1920, 1080, seed=1)))),
        ("1280x720 RGBA", save(Image.fromarray(rgba, "RGBA"))),
        ("1280x720 RGB all-Paeth", paeth_png(photo)),
        ("1280x720 L", save(Image.fromarray(photo).convert("L"))),
        ("1280x720 P (256 colours)", save(Image.fromarray(photo).quantize(256))),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per measurement")
    parser.add_argument("--budget", type=float, default=0.15, help="seconds per round and side")
    args = parser.parse_args()

    from mmworker.runtime import reexec_tuned

    reexec_tuned()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    from isal import isal_zlib
    from PIL import Image

    from mmworker.common import png, png_rows
    from mmworker.common.decode import MAX_IMAGE_PIXELS

    rust = load_reference_extension()

    def pillow(data: bytes) -> np.ndarray:
        return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))

    print(f"decode_png vs Pillow {Image.__version__} vs {'Rust extension' if rust else 'no Rust extension'}")
    print(f"pinned to CPU {min(os.sched_getaffinity(0))}, allocator tuned, {args.rounds} rounds\n")
    columns = (
        ("bytes", 9),
        ("ours ms", 8),
        ("Pillow ms", 10),
        ("Rust ms", 8),
        ("vs Pillow", 10),
        ("vs Rust", 8),
    )
    print(f"{'image':<26} " + " ".join(f"{name:>{width}}" for name, width in columns))
    for label, data in cases():
        ours = png.decode_png(data, MAX_IMAGE_PIXELS)
        assert ours is not None and np.array_equal(ours.pixels[:, :, :3], pillow(data)), label
        fns = {"ours": partial(png.decode_png, data, MAX_IMAGE_PIXELS), "pillow": partial(pillow, data)}
        if rust:
            fns["rust"] = partial(rust.common.image_decode_rgb, data)
        ms = alternating_medians(fns, args.rounds, args.budget)
        rust_ms = f"{ms['rust']:.2f}" if rust else "-"
        vs_rust = f"{ms['rust'] / ms['ours']:.2f}x" if rust else "-"
        print(
            f"{label:<26} {len(data):>9} {ms['ours']:>8.2f} {ms['pillow']:>10.2f} {rust_ms:>8} "
            f"{ms['pillow'] / ms['ours']:>9.2f}x {vs_rust:>8}"
        )

    # Where the time goes for the hot case: inflating (ISA-L vs zlib) and unfiltering.
    from mmworker.corpus import photo_like

    buf = io.BytesIO()
    Image.fromarray(photo_like(1280, 720, seed=1)).save(buf, "PNG")
    view = memoryview(buf.getvalue())
    header = png._read_chunks(view, MAX_IMAGE_PIXELS)
    stream = b"".join(header.idat)
    size = 720 * (1 + 1280 * 3)
    raw = np.frombuffer(png._inflate(header.idat, size, False), np.uint8)
    out = np.empty(720 * 1280 * 3, np.uint8)
    scratch = np.empty(0, np.uint8)
    palette = np.zeros(768, np.uint8)
    parts = {
        "chunk walk": partial(png._read_chunks, view, MAX_IMAGE_PIXELS),
        "inflate ISA-L": partial(lambda: isal_zlib.decompressobj().decompress(stream, size + 1)),
        "inflate zlib": partial(lambda: zlib.decompressobj().decompress(stream, size)),
        "unfilter": partial(png_rows.decode_rows, raw, 720, 1280, 3840, 3, 0, 8, palette, 0, out, 3, scratch),
    }
    print("\n1280x720 RGB, by stage:")
    for name, value in alternating_medians(parts, args.rounds, args.budget).items():
        print(f"  {name:<14} {value:7.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
