#!/usr/bin/env python3
"""Regenerate the committed golden fixtures under tests/golden/.

Run ONLY in the reference environment (stock Pillow 12.x + torch/torchvision; see
scripts/setup_reference.sh):

    bash scripts/setup_reference.sh
    .venv-ref/bin/python tests/golden/generate_golden.py

Writes
  resize_cases.json   per case: source spec (rebuilt by sources.make_source), target size, and the
                      SHA-256 of the expected uint8 HWC output for pil_lanczos / pil_bicubic /
                      aten_u8; plus the TV-R* vectors of docs/behaviour.md §12 (checked here).
  decode/*            small image files (PNG/GIF/BMP/WebP/JPEG accepted; TIFF/ICO/PPM/... rejected)
  decode_cases.json   per file: expected outcome ("ok" + h, w, SHA-256 of stock-Pillow
                      Image.open(b).convert("RGB") bytes, no exif_transpose) or "reject" + reason.

Everything is seeded, so a re-run with the same library versions reproduces identical files.
"""

from __future__ import annotations

import hashlib
import io
import re
import struct
import sys
import warnings
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import sources  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from shared import reference_versions, require_reference_env, sha256_array, write_json  # noqa: E402
from torchvision.transforms import InterpolationMode  # noqa: E402
from torchvision.transforms.v2 import functional as TF  # noqa: E402

require_reference_env()

RESAMPLERS = ("pil_lanczos", "pil_bicubic", "aten_u8")
DECODE_DIR = HERE / "decode"


# --------------------------------------------------------------------------------------------
# Resize
# --------------------------------------------------------------------------------------------


def resize_ref(src: np.ndarray, th: int, tw: int, resampler: str) -> np.ndarray:
    if resampler == "pil_lanczos":
        return np.asarray(Image.fromarray(src).resize((tw, th), Image.Resampling.LANCZOS))
    if resampler == "pil_bicubic":
        return np.asarray(Image.fromarray(src).resize((tw, th), Image.Resampling.BICUBIC))
    if resampler == "aten_u8":
        t = torch.from_numpy(src).permute(2, 0, 1)
        out = TF.resize(t, [th, tw], interpolation=InterpolationMode.BICUBIC, antialias=True)
        assert out.dtype == torch.uint8
        return out.permute(1, 2, 0).contiguous().numpy()
    raise ValueError(resampler)


# docs/behaviour.md §12 expected outputs.
# fmt: off
TV_R2 = [
    173, 45, 116, 139, 174, 116, 132, 171, 116, 180, 144, 189, 101, 149, 136, 134, 119, 145, 168,
    150, 90, 41, 181, 107, 94, 164, 148, 54, 95, 108, 115, 72, 74, 144, 180, 77, 129, 115, 98, 129,
    81, 76, 143, 95, 102, 74, 92, 129, 69, 132, 154, 91, 98, 157, 125, 106, 106, 94, 118, 110
]
# fmt: on
# fmt: off
TV_R3 = [
    178, 39, 122, 130, 177, 119, 135, 168, 116, 189, 141, 196, 96, 154, 137, 138, 115, 146, 172,
    148, 81, 34, 187, 111, 100, 157, 146, 50, 88, 101, 116, 67, 71, 152, 183, 78, 128, 123, 90, 121,
    80, 78, 147, 100, 105, 73, 90, 126, 63, 136, 166, 92, 92, 163, 129, 103, 98, 93, 124, 120
]
# fmt: on
TV_R3B = list(TV_R2)
TV_R3B[33] = 143
# fmt: off
TV_R4 = [
    130, 131, 123, 127, 128, 128, 126, 128, 128, 128, 124, 131
]
# fmt: on


def check_vectors() -> dict:
    r1 = sources.tv_r1_source()
    r4 = sources.tv_r4_source()
    checks = {
        "TV-R2": (resize_ref(r1, 4, 5, "pil_bicubic"), TV_R2),
        "TV-R3": (resize_ref(r1, 4, 5, "pil_lanczos"), TV_R3),
        "TV-R3b": (resize_ref(r1, 4, 5, "aten_u8"), TV_R3B),
        "TV-R4": (resize_ref(r4, 1, 4, "aten_u8"), TV_R4),
    }
    failed = []
    for name, (got, want) in checks.items():
        ok = got.reshape(-1).tolist() == want
        print(f"[golden] {name}: {'PASS' if ok else 'FAIL'}")
        if not ok:
            failed.append(name)
    assert not failed, f"reference libraries do not reproduce {failed}"
    return {
        "TV-R1": {"source": {"kind": "tv_r1"}, "h": 6, "w": 8, "bytes": list(sources.TV_R1_SOURCE)},
        "TV-R2": {"source": {"kind": "tv_r1"}, "resampler": "pil_bicubic", "th": 4, "tw": 5, "bytes": TV_R2},
        "TV-R3": {"source": {"kind": "tv_r1"}, "resampler": "pil_lanczos", "th": 4, "tw": 5, "bytes": TV_R3},
        "TV-R3b": {"source": {"kind": "tv_r1"}, "resampler": "aten_u8", "th": 4, "tw": 5, "bytes": TV_R3B},
        "TV-R4": {"source": {"kind": "tv_r4"}, "resampler": "aten_u8", "th": 1, "tw": 4, "bytes": TV_R4},
    }


def resize_case_specs() -> list[dict]:
    cases: list[dict] = []

    def add(group, src, th, tw):
        cases.append({"group": group, "source": src, "th": int(th), "tw": int(tw)})

    def rnd(h, w, seed):
        return {"kind": "random_rgb", "h": int(h), "w": int(w), "seed": int(seed)}

    # docs/behaviour.md §12 fixed resize cases (seed h*10000+w).
    for h, w, th, tw in [
        (1080, 1920, 1152, 2048),
        (896, 896, 1792, 1792),
        (360, 640, 720, 1280),
        (37, 53, 74, 106),
        (100, 100, 173, 173),
        (1, 1, 2, 2),
        (256, 256, 100, 100),
        (720, 1280, 720, 1280),
        (3, 500, 6, 1000),
    ]:
        add("fixed", rnd(h, w, h * 10000 + w), th, tw)

    # 40-case random sweep, sizes 1..199, rng seed 7; each source has its own seed.
    dims = np.random.default_rng(7).integers(1, 200, size=(40, 4))
    for i, (h, w, th, tw) in enumerate(dims.tolist()):
        add("sweep40", rnd(h, w, 7_000_000 + i), th, tw)

    # ~200 extra random cases, sizes 1..200, by category.
    rng = np.random.default_rng(20261129)

    def up(n):  # n -> [n, 200]
        return int(rng.integers(n, 201))

    def down(n):  # n -> [1, n]
        return int(rng.integers(1, n + 1))

    seed = 8_000_000
    plan = [
        ("up", 32),
        ("down", 32),
        ("up_w_down_h", 28),
        ("down_w_up_h", 28),
        ("width_only", 32),
        ("height_only", 32),
        ("identity", 8),
    ]
    for cat, n in plan:
        for _ in range(n):
            h, w = (int(x) for x in rng.integers(1, 201, size=2))
            if cat == "up":
                th, tw = up(h), up(w)
            elif cat == "down":
                th, tw = down(h), down(w)
            elif cat == "up_w_down_h":
                th, tw = down(h), up(w)
            elif cat == "down_w_up_h":
                th, tw = up(h), down(w)
            elif cat == "width_only":
                th, tw = h, int(rng.integers(1, 201))
            elif cat == "height_only":
                th, tw = int(rng.integers(1, 201)), w
            else:  # identity
                th, tw = h, w
            add(f"extra_{cat}", rnd(h, w, seed), th, tw)
            seed += 1
    # Explicit edges: 1-pixel sources/targets, extreme ratios.
    for h, w, th, tw in [
        (1, 1, 1, 1),
        (1, 1, 200, 200),
        (1, 1, 1, 200),
        (200, 200, 1, 1),
        (1, 200, 200, 1),
        (200, 1, 1, 200),
        (2, 3, 1, 1),
        (1, 2, 1, 1),
        (2, 2, 3, 3),
        (199, 7, 3, 200),
        (5, 200, 5, 1),
        (200, 5, 1, 5),
    ]:
        add("extra_edge", rnd(h, w, seed), th, tw)
        seed += 1

    # Photo-like sources at real Qwen smart_resize targets (TV-Q1).
    for i, (h, w, th, tw) in enumerate(
        [
            (720, 1280, 728, 1288),
            (768, 1024, 756, 1036),
            (480, 640, 476, 644),
            (3024, 4032, 840, 1148),
            (1080, 1920, 728, 1316),
        ]
    ):
        add("photo", {"kind": "photo_like", "h": h, "w": w, "seed": 100 + i}, th, tw)

    # The resize test vectors as hashed cases too.
    add("vector", {"kind": "tv_r1"}, 4, 5)
    add("vector", {"kind": "tv_r4"}, 1, 4)

    for i, c in enumerate(cases):
        s = c["source"]
        dims_txt = f"{s['h']}x{s['w']}" if "h" in s else s["kind"]
        c["name"] = f"{i:03d}_{c['group']}_{dims_txt}_to_{c['th']}x{c['tw']}"
    return cases


def build_resize_cases() -> tuple[list[dict], list[str], dict]:
    cases = resize_case_specs()
    refused: list[str] = []
    stats = {"bicubic_eq_aten": 0, "bicubic_ne_aten": 0, "lanczos_eq_bicubic": 0}
    for c in cases:
        src = sources.make_source(c["source"])
        digests = {}
        outs = {}
        for r in RESAMPLERS:
            try:
                out = resize_ref(src, c["th"], c["tw"], r)
            except Exception as e:  # record, do not guess
                refused.append(f"{c['name']} {r}: {type(e).__name__}: {e}")
                digests[r] = None
                continue
            assert out.shape == (c["th"], c["tw"], 3) and out.dtype == np.uint8, (c["name"], r, out.shape)
            outs[r] = out
            digests[r] = sha256_array(out)
        c["sha256"] = digests
        if digests["pil_bicubic"] and digests["aten_u8"]:
            stats["bicubic_eq_aten" if digests["pil_bicubic"] == digests["aten_u8"] else "bicubic_ne_aten"] += 1
        if digests["pil_bicubic"] == digests["pil_lanczos"]:
            stats["lanczos_eq_bicubic"] += 1
    return cases, refused, stats


# --------------------------------------------------------------------------------------------
# Decode fixtures
# --------------------------------------------------------------------------------------------

H, W = 37, 53  # odd sizes: partial JPEG MCUs, partial Adam7 passes, BMP row padding


def pattern(h: int, w: int, seed: int) -> np.ndarray:
    """Ramps + checker + a random patch: structured enough to exercise every codec path."""
    y = np.arange(h)[:, None]
    x = np.arange(w)[None, :]
    img = np.empty((h, w, 3), dtype=np.uint8)
    img[..., 0] = (x * 255 // max(w - 1, 1)).astype(np.uint8)
    img[..., 1] = (y * 255 // max(h - 1, 1)).astype(np.uint8)
    img[..., 2] = (((x // 4 + y // 4) % 2) * 180 + 40).astype(np.uint8)
    rng = np.random.default_rng(seed)
    ph, pw = h // 3, w // 3
    img[ph : 2 * ph, pw : 2 * pw] = rng.integers(0, 256, (ph, pw, 3), dtype=np.uint8)
    return img


def alpha_plane(h: int, w: int) -> np.ndarray:
    """Alpha with fully transparent, partial and opaque regions (colour kept under alpha 0)."""
    y = np.arange(h)[:, None]
    x = np.arange(w)[None, :]
    a = ((x + 2 * y) * 7) % 256
    a[:, : w // 4] = 0
    a[:, -w // 4 :] = 255
    return a.astype(np.uint8)


def png_chunk(typ: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + typ + data + struct.pack(">I", zlib.crc32(typ + data) & 0xFFFFFFFF)


def png_hand(w: int, h: int, bit_depth: int, color_type: int, raw: bytes, interlace: int = 0) -> bytes:
    ihdr = struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, interlace)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", zlib.compress(raw, 9))
        + png_chunk(b"IEND", b"")
    )


def pack_rows(vals: np.ndarray, bits: int) -> list[bytes]:
    """Pack a (h, w) array of `bits`-bit samples (1/2/4) MSB first, one bytes object per row."""
    per = 8 // bits
    rows = []
    for row in vals:
        pad = (-len(row)) % per
        v = np.concatenate([row, np.zeros(pad, np.uint8)]).reshape(-1, per).astype(np.uint16)
        shifts = (np.arange(per - 1, -1, -1) * bits).astype(np.uint16)
        rows.append((v << shifts).sum(axis=1).astype(np.uint8).tobytes())
    return rows


def filtered(rows: list[bytes]) -> bytes:
    return b"".join(b"\x00" + r for r in rows)


def adam7_raw(img: np.ndarray) -> bytes:
    """Adam7-interlaced scanlines (filter 0) for an 8-bit (h, w, c) image."""
    out = []
    for x0, y0, dx, dy in (
        (0, 0, 8, 8),
        (4, 0, 8, 8),
        (0, 4, 4, 8),
        (2, 0, 4, 4),
        (0, 2, 2, 4),
        (1, 0, 2, 2),
        (0, 1, 1, 2),
    ):
        sub = img[y0::dy, x0::dx]
        if sub.size == 0:
            continue
        out.append(filtered([r.tobytes() for r in sub]))
    return b"".join(out)


def pil_save(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()


def make_decode_files() -> list[tuple[str, str, bytes, str | None, str]]:
    """(file name, container format, bytes, reject reason or None, description)."""
    rgb = pattern(H, W, 1)
    a = alpha_plane(H, W)
    grey = np.asarray(Image.fromarray(rgb).convert("L"))
    rgba = np.dstack([rgb, a])
    pal_im = Image.fromarray(rgb).quantize(colors=64, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    rng = np.random.default_rng(42)
    files: list[tuple[str, str, bytes, str | None, str]] = []

    def add(name, fmt, data, reject=None, desc=""):
        files.append((name, fmt, data, reject, desc))

    # ---- PNG
    add("png_rgb.png", "PNG", pil_save(Image.fromarray(rgb), "PNG"), desc="8-bit RGB")
    add(
        "png_rgba.png",
        "PNG",
        pil_save(Image.fromarray(rgba, "RGBA"), "PNG"),
        desc="8-bit RGBA; alpha dropped, not composited",
    )
    add("png_l.png", "PNG", pil_save(Image.fromarray(grey, "L"), "PNG"), desc="8-bit greyscale")
    add(
        "png_la.png",
        "PNG",
        pil_save(Image.fromarray(np.dstack([grey, a]), "LA"), "PNG"),
        desc="8-bit grey+alpha; alpha dropped",
    )
    add("png_p.png", "PNG", pil_save(pal_im, "PNG"), desc="8-bit palette, 64 colours")
    p_trns = pal_im.copy()
    p_trns.info["transparency"] = 0
    add(
        "png_p_trns.png",
        "PNG",
        pil_save(p_trns, "PNG", transparency=0),
        desc="palette with tRNS (index 0 transparent); palette colour kept",
    )
    p_trns_bytes = pal_im.copy()
    trns = bytes(int(v) for v in rng.integers(0, 256, 64))
    add(
        "png_p_trns_table.png",
        "PNG",
        pil_save(p_trns_bytes, "PNG", transparency=trns),
        desc="palette with a full tRNS alpha table; alpha dropped",
    )
    p4 = Image.fromarray(rgb).quantize(colors=16, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    add("png_p4.png", "PNG", pil_save(p4, "PNG", bits=4), desc="4-bit palette")
    for bits in (1, 2, 4):
        vals = (grey >> (8 - bits)).astype(np.uint8)
        add(
            f"png_grey{bits}.png",
            "PNG",
            png_hand(W, H, bits, 0, filtered(pack_rows(vals, bits))),
            desc=f"{bits}-bit greyscale (hand-made IHDR)",
        )
    add(
        "png_rgb_adam7.png",
        "PNG",
        png_hand(W, H, 8, 2, adam7_raw(rgb), interlace=1),
        desc="8-bit RGB, Adam7 interlaced (hand-made)",
    )
    g16 = grey.astype(np.uint16) * 257 + rng.integers(0, 256, grey.shape).astype(np.uint16)
    add(
        "png_grey16.png",
        "PNG",
        png_hand(W, H, 16, 0, filtered([r.astype(">u2").tobytes() for r in g16])),
        "bit-depth",
        "16-bit greyscale (PIL mode I;16) -> reject",
    )
    rgb16 = rgb.astype(np.uint16) * 257 + rng.integers(0, 256, rgb.shape).astype(np.uint16)
    add(
        "png_rgb16.png",
        "PNG",
        png_hand(W, H, 16, 2, filtered([r.astype(">u2").tobytes() for r in rgb16])),
        "bit-depth",
        "16-bit RGB (PIL opens as RGB high byte) -> reject via IHDR bit depth",
    )
    rgba16 = np.dstack([rgb16, a.astype(np.uint16) * 257])
    add(
        "png_rgba16.png",
        "PNG",
        png_hand(W, H, 16, 6, filtered([r.astype(">u2").tobytes() for r in rgba16])),
        "bit-depth",
        "16-bit RGBA -> reject",
    )
    good = pil_save(Image.fromarray(rgb), "PNG")
    add("png_truncated.png", "PNG", good[: len(good) // 2], "corrupt", "PNG cut in half (IDAT truncated)")

    # ---- GIF
    add("gif_single.gif", "GIF", pil_save(pal_im, "GIF"), desc="single frame")
    frames = [Image.fromarray(pattern(H, W, s)).quantize(colors=32, dither=Image.Dither.NONE) for s in (2, 3, 4)]
    add(
        "gif_anim3.gif",
        "GIF",
        pil_save(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0),
        desc="animated, 3 frames; first frame expected",
    )
    add(
        "gif_transparent.gif",
        "GIF",
        pil_save(pal_im, "GIF", transparency=0),
        desc="palette index 0 transparent; palette colour kept (Rust crate may differ here)",
    )

    # ---- BMP
    add("bmp_24.bmp", "BMP", pil_save(Image.fromarray(rgb), "BMP"), desc="24-bit")
    add("bmp_32.bmp", "BMP", pil_save(Image.fromarray(rgba, "RGBA"), "BMP"), desc="32-bit BGRA/BGRX")
    add("bmp_p8.bmp", "BMP", pil_save(pal_im, "BMP"), desc="8-bit palette")
    add("bmp_1bit.bmp", "BMP", pil_save(Image.fromarray(grey).convert("1"), "BMP"), desc="1-bit")

    # ---- WebP
    add(
        "webp_lossless_rgb.webp",
        "WEBP",
        pil_save(Image.fromarray(rgb), "WEBP", lossless=True),
        desc="lossless RGB",
    )
    add(
        "webp_lossless_rgba.webp",
        "WEBP",
        pil_save(Image.fromarray(rgba, "RGBA"), "WEBP", lossless=True, exact=True),
        desc="lossless RGBA, exact (colour under alpha 0 kept); alpha dropped",
    )
    add("webp_lossy.webp", "WEBP", pil_save(Image.fromarray(rgb), "WEBP", quality=75), desc="lossy q75")

    # ---- JPEG
    add(
        "jpeg_rgb_q90_420.jpg",
        "JPEG",
        pil_save(Image.fromarray(rgb), "JPEG", quality=90, subsampling="4:2:0"),
        desc="RGB q90 4:2:0",
    )
    add(
        "jpeg_rgb_q90_444.jpg",
        "JPEG",
        pil_save(Image.fromarray(rgb), "JPEG", quality=90, subsampling="4:4:4"),
        desc="RGB q90 4:4:4",
    )
    add("jpeg_grey.jpg", "JPEG", pil_save(Image.fromarray(grey, "L"), "JPEG", quality=90), desc="greyscale")
    add(
        "jpeg_cmyk.jpg",
        "JPEG",
        pil_save(Image.fromarray(rgb).convert("CMYK"), "JPEG", quality=90),
        desc="CMYK (Adobe)",
    )
    add(
        "jpeg_progressive.jpg",
        "JPEG",
        pil_save(Image.fromarray(rgb), "JPEG", quality=90, progressive=True),
        desc="progressive",
    )
    exif = Image.Exif()
    exif[0x0112] = 6
    add(
        "jpeg_exif_orient6.jpg",
        "JPEG",
        pil_save(Image.fromarray(rgb), "JPEG", quality=90, exif=exif.tobytes()),
        desc="EXIF orientation 6; NOT applied (stored orientation)",
    )

    # ---- formats PIL reads but we must reject
    add("tiff_rgb.tif", "TIFF", pil_save(Image.fromarray(rgb), "TIFF"), "format", "TIFF")
    add(
        "ico_32.ico",
        "ICO",
        pil_save(Image.fromarray(rgb[:32, :32].copy()), "ICO", sizes=[(32, 32)]),
        "format",
        "ICO",
    )
    add("ppm_rgb.ppm", "PPM", pil_save(Image.fromarray(rgb), "PPM"), "format", "PPM (binary P6)")
    add(
        "not_an_image.bin",
        "none",
        rng.integers(0, 256, 512, dtype=np.uint8).tobytes(),
        "format",
        "random bytes",
    )
    return files


def build_decode_cases() -> list[dict]:
    DECODE_DIR.mkdir(exist_ok=True)
    wanted = set()
    cases = []
    for name, fmt, data, reject, desc in make_decode_files():
        (DECODE_DIR / name).write_bytes(data)
        wanted.add(name)
        entry = {
            "file": name,
            "format": fmt,
            "desc": desc,
            "bytes": len(data),
            "file_sha256": hashlib.sha256(data).hexdigest(),
        }
        if data[:8] == b"\x89PNG\r\n\x1a\n":
            entry["png_bit_depth"], entry["png_color_type"] = data[24], data[25]
        # What stock Pillow does with it.
        pil_error = None
        try:
            im = Image.open(io.BytesIO(data))
            entry["pil_format"], entry["pil_mode"] = im.format, im.mode
            with warnings.catch_warnings():  # P + bytes transparency warns; convert("RGB") is still defined
                warnings.simplefilter("ignore")
                arr = np.asarray(im.convert("RGB"))
        except Exception as e:
            pil_error = type(e).__name__ + ": " + re.sub(r" at 0x[0-9a-f]+", "", str(e))
            arr = None
        if reject is None:
            assert pil_error is None, (name, pil_error)
            assert entry["pil_format"] == fmt, (name, entry["pil_format"])
            assert arr.dtype == np.uint8 and arr.ndim == 3 and arr.shape[2] == 3
            entry.update(expected="ok", h=int(arr.shape[0]), w=int(arr.shape[1]), sha256=sha256_array(arr))
        else:
            entry.update(expected="reject", reason=reject)
            if pil_error:
                entry["pil_error"] = pil_error
            if reject == "corrupt":
                assert pil_error is not None, name
        cases.append(entry)
    for p in DECODE_DIR.iterdir():  # drop stale fixtures from older generator versions
        if p.name not in wanted:
            p.unlink()
    return cases


# --------------------------------------------------------------------------------------------


def main() -> None:
    v = reference_versions(("libjpeg_turbo", "zlib", "webp"))
    print("[golden] versions: " + ", ".join(f"{k} {val}" for k, val in v.items()))
    vectors = check_vectors()

    cases, refused, stats = build_resize_cases()
    write_json(
        HERE / "resize_cases.json",
        {
            "about": "Expected SHA-256 of uint8 HWC (C order) resize outputs; sources rebuilt by "
            "tests/golden/sources.py make_source(source). pil_* = stock Pillow 12 "
            "Image.resize((tw, th), LANCZOS|BICUBIC); aten_u8 = torchvision v2 "
            "F.resize(uint8 CHW, [th, tw], BICUBIC, antialias=True), 1 thread. "
            "null = the reference refused the case.",
            "resamplers": list(RESAMPLERS),
            "versions": v,
            "vectors": vectors,
            "refused": refused,
        },
        "cases",
        cases,
    )
    print(
        f"[golden] resize: {len(cases)} cases x {len(RESAMPLERS)} resamplers; "
        f"groups: "
        + ", ".join(f"{g} {sum(c['group'] == g for c in cases)}" for g in dict.fromkeys(c["group"] for c in cases))
    )
    print(
        f"[golden] resize: Pillow-12 BICUBIC == aten_u8 on {stats['bicubic_eq_aten']} cases, "
        f"differs on {stats['bicubic_ne_aten']}; refused: {len(refused)}"
    )
    for r in refused:
        print(f"[golden]   refused: {r}")

    dcases = build_decode_cases()
    write_json(
        HERE / "decode_cases.json",
        {
            "about": "Decode fixtures in decode/. expected 'ok': h, w and SHA-256 of stock Pillow 12 "
            "Image.open(BytesIO(b)).convert('RGB') bytes (no exif_transpose; alpha dropped). "
            "'reject': reason category (format | bit-depth | corrupt).",
            "versions": v,
        },
        "cases",
        dcases,
    )
    n_ok = sum(c["expected"] == "ok" for c in dcases)
    total = sum(c["bytes"] for c in dcases)
    print(f"[golden] decode: {len(dcases)} files ({n_ok} ok, {len(dcases) - n_ok} reject), {total} bytes")
    size = sum(p.stat().st_size for p in HERE.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    print(f"[golden] tests/golden total size: {size} bytes")
    print("GOLDEN_OK")


if __name__ == "__main__":
    main()
