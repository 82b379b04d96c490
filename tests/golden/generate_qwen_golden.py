#!/usr/bin/env python3
"""Regenerate the committed Qwen-VL and Inkling golden fixtures under tests/golden/qwen/.

Run ONLY in the reference environment (stock Pillow 12.x, torch/torchvision, transformers 5.24; see
scripts/setup_reference.sh):

    .venv-ref/bin/python tests/golden/generate_qwen_golden.py

The script runs one helper step in the main environment (``.venv/bin/python`` with
``PYTHONPATH=.cache/ref_ext``) to record what the sglang 0.5.23 Rust extension ``_multimodal``
returns for every case. That helper is this same file, run as ``generate_qwen_golden.py
--rust-helper``; it reads a JSON job list on stdin and writes JSON results on stdout, and it imports
only numpy and ``_multimodal``.

Writes (all under tests/golden/qwen/)
  inputs/*.png, *.jpg  photo-like images (sources.photo_like), PNG and JPEG (quality 90). The JPEG
                       bytes are committed because encoders differ between library versions.
  qwen_cases.json      per (config, image, mode): the HF processor's pixel_values (shape, dtype,
                       SHA-256 of float32 LE C-order bytes) and image_grid_thw, or its error; the
                       grid of the crate's smart_resize (docs/behaviour.md §7.2); the Rust extension's
                       output; and whether they agree. mode "aten_u8" = transformers
                       Qwen2VLImageProcessor (torchvision backend), "pil" = Qwen2VLImageProcessorPil.
  inkling_cases.json   Inkling bf16 patchify (docs/behaviour.md §8, patch 40) for 4 plain cases and 3
                       rescale cases (scaled_dims + stock-Pillow LANCZOS): output size, bits SHA-256,
                       the bf16 LUT and pad values, the Rust extension's decode_patchify result.
  inkling_bits.npz     the full expected uint16 bits of the small Inkling cases (37x53, 40x40).

Everything is seeded, so a re-run with the same library versions reproduces identical files.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
OUT = HERE / "qwen"
INPUTS = OUT / "inputs"
MAIN_PY = REPO / ".venv" / "bin" / "python"
REF_EXT = REPO / ".cache" / "ref_ext"

IMAGE_TOKEN_ID = 151655
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
HALF = [0.5, 0.5, 0.5]


def _spec(ps, merge, tps, min_px, max_px, mean, std) -> dict:
    return {
        "family": "qwen_vl",
        "image_token_id": IMAGE_TOKEN_ID,
        "patch_size": ps,
        "merge_size": merge,
        "temporal_patch_size": tps,
        "min_pixels": min_px,
        "max_pixels": max_px,
        "image_mean": list(mean),
        "image_std": list(std),
    }


# docs/behaviour.md §7.1 PROCESSOR_CONFIGS plus the checkpoint values.
CONFIGS: dict[str, dict] = {
    "qwen2_vl_hf_default": _spec(14, 2, 2, 3136, 1003520, CLIP_MEAN, CLIP_STD),
    "qwen2_vl": _spec(14, 2, 2, 3136, 12845056, CLIP_MEAN, CLIP_STD),
    "qwen2_5_vl_fixture": _spec(14, 2, 2, 3136, 1003520, HALF, HALF),
    "qwen3_vl": _spec(16, 2, 2, 65536, 16777216, HALF, HALF),
    "qwen3_5": _spec(16, 2, 2, 65536, 16777216, HALF, HALF),
}
MODES = ("aten_u8", "pil")

# Input images: (group, W, H, seed, formats). Content = sources.photo_like(H, W, seed).
# The 640x480 image uses seed 10 so that its PNG is also the Inkling 480x640 (seed 10) fixture; the
# other Inkling sources (seeds 11..14) double as extra Qwen PNG cases.
IMAGES: list[tuple[str, int, int, int, tuple[str, ...]]] = [
    ("normal", 640, 480, 10, ("png", "jpg")),
    ("normal", 1024, 683, 20, ("jpg",)),
    ("normal", 50, 40, 21, ("png", "jpg")),
    ("normal", 300, 301, 22, ("png", "jpg")),
    ("normal", 1024, 768, 23, ("jpg",)),  # TV-Q4
    ("normal", 1280, 720, 24, ("jpg",)),
    ("normal", 1200, 900, 25, ("jpg",)),  # > 1003520 pixels: the max_pixels (beta) branch
    ("inkling", 320, 200, 11, ("png",)),
    ("inkling", 53, 37, 12, ("png",)),
    ("inkling", 40, 40, 13, ("png",)),
    ("inkling", 480, 270, 14, ("png",)),
    ("tiny", 10, 10, 30, ("png",)),
    ("tiny", 27, 13, 31, ("png",)),
    ("tiny", 1, 1, 32, ("png",)),
    ("tiny", 3, 40, 33, ("png",)),
    ("aspect", 5572, 28, 40, ("png",)),  # 199:1
    ("aspect", 28, 5572, 41, ("png",)),
    ("aspect", 5600, 28, 42, ("png",)),  # 200:1 (passes)
    ("aspect", 28, 5600, 43, ("png",)),
    ("aspect", 2814, 14, 44, ("png",)),  # 201:1 (rejected; the check is on the raw ratio)
    ("aspect", 2, 402, 45, ("png",)),  # 1:201 with a side far below the factor
    # h > 100*w and the height shrinks: stock Pillow 12.3.0 resizes such images vertically first
    # (Pillow PR #9524, Python side of Image.resize); pillow-simd and the crate go horizontal first.
    ("tall", 19, 2000, 48, ("png",)),
    ("thin", 2800, 14, 46, ("png",)),  # 200:1; HF smart_resize != crate (docs/behaviour.md §7.2 item 7)
    ("thin", 14, 2800, 47, ("png",)),
]

# Inkling: docs/behaviour.md §12 "Inkling golden fixtures" (h x w, seed) and rescale cases.
INKLING_PS = 40
INKLING_PLAIN = [
    ("480x640", 480, 640, 10),
    ("200x320", 200, 320, 11),
    ("37x53", 37, 53, 12),
    ("40x40", 40, 40, 13),
]
# (name, h, w, seed, rescale_frac, rescale_cap)
INKLING_RESCALE = [
    ("270x480_frac2_cap2048", 270, 480, 14, 2.0, 2048),  # -> 540x960 (cap does not bind)
    ("270x480_frac2_cap840", 270, 480, 14, 2.0, 840),  # cap binds: ratio 1.75, h 472.5 -> 473 (half up)
    ("270x480_frac0.7", 270, 480, 14, 0.7, None),  # downscale
]
INKLING_BITS_IN_NPZ = ("37x53", "40x40")
INKLING_MEAN = (0.48145466, 0.4578275, 0.40821073)
INKLING_STD = (0.26862954, 0.2613026, 0.2757771)


def image_name(w: int, h: int, seed: int, ext: str) -> str:
    return f"photo_w{w}_h{h}_s{seed}.{ext}"


def sha256_bytes(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# --------------------------------------------------------------------------------------------
# Crate formulas (docs/behaviour.md §6, §7.2), written out here so the fixture records them
# --------------------------------------------------------------------------------------------


def rust_f64(x: float) -> str:
    """Rust's `{}` Display of an f64 for the values that occur here (no exponent, no trailing .0)."""
    s = repr(float(x))
    assert "e" not in s and "inf" not in s and "nan" not in s, s
    return s[:-2] if s.endswith(".0") else s


def crate_smart_resize(h: int, w: int, factor: int, min_px: int, max_px: int) -> tuple[int, int]:
    """docs/behaviour.md §7.2, in f64 with Python round() (banker's rounding). Raises ValueError(text)."""
    if h == 0 or w == 0:
        raise ValueError("empty image")
    ratio = max(h, w) / min(h, w)
    if ratio > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {rust_f64(ratio)}")
    h_bar = max(factor, round(h / factor) * factor)
    w_bar = max(factor, round(w / factor) * factor)
    if h_bar * w_bar > max_px:
        beta = math.sqrt((h * w) / max_px)
        h_bar = math.floor(h / beta / factor) * factor
        w_bar = math.floor(w / beta / factor) * factor
    elif h_bar * w_bar < min_px:
        beta = math.sqrt(min_px / (h * w))
        h_bar = math.ceil(h * beta / factor) * factor
        w_bar = math.ceil(w * beta / factor) * factor
    if h_bar == 0 or w_bar == 0:
        raise ValueError(
            f"smart_resize: {h}x{w} degenerates to {h_bar}x{w_bar} at max_pixels={max_px}; "
            "image is too thin for this pixel budget"
        )
    return h_bar, w_bar


def crate_grid(spec: dict, h: int, w: int) -> dict:
    ps, m = spec["patch_size"], spec["merge_size"]
    try:
        th, tw = crate_smart_resize(h, w, ps * m, spec["min_pixels"], spec["max_pixels"])
    except ValueError as e:
        return {"error": str(e)}
    gh, gw = th // ps, tw // ps
    if gh == 0 or gw == 0 or gh % m or gw % m:
        return {"error": f"qwen_vl: patch grid {gh}x{gw} is empty or not a multiple of merge_size {m}"}
    return {"resized_hw": [th, tw], "grid_thw": [1, gh, gw]}


def scaled_dims(w: int, h: int, frac: float | None, cap: int | None) -> tuple[int, int]:
    """docs/behaviour.md §6 (returns (w', h'), width first)."""
    if frac is None:
        return w, h
    long = max(w, h)
    if long == 0:
        return w, h
    target = long * frac
    if cap is not None:
        target = min(target, max(cap, long))
    ratio = target / long
    if ratio == 1.0:
        return w, h
    return max(1, math.floor(w * ratio + 0.5)), max(1, math.floor(h * ratio + 0.5))


# --------------------------------------------------------------------------------------------
# Rust helper (runs in the MAIN env: numpy + _multimodal only)
# --------------------------------------------------------------------------------------------


def rust_helper() -> None:
    import _multimodal
    import numpy as np

    jobs = json.load(sys.stdin)
    out = {"qwen": [], "inkling": [], "numpy": np.__version__, "ext_file": _multimodal.__file__}
    for job in jobs["qwen"]:
        data = (INPUTS / job["file"]).read_bytes()
        try:
            flat, thw = _multimodal.qwen_vl.preprocess(data, job["spec_json"])
        except Exception as e:  # record, do not guess
            out["qwen"].append({"error_type": type(e).__name__, "error": str(e)})
            continue
        flat = np.asarray(flat)
        arr = np.ascontiguousarray(flat, dtype="<f4")
        t, gh, gw = (int(x) for x in thw)
        out["qwen"].append(
            {
                "dtype": str(flat.dtype),
                "numel": int(arr.size),
                "grid_thw": [t, gh, gw],
                "sha256": sha256_bytes(arr.tobytes()),
            }
        )
    for job in jobs["inkling"]:
        data = (INPUTS / job["file"]).read_bytes()
        try:
            h, w, bits = _multimodal.inkling.decode_patchify(data, job["ps"], job["frac"], job["cap"])
        except Exception as e:
            out["inkling"].append({"error_type": type(e).__name__, "error": str(e)})
            continue
        bits = np.ascontiguousarray(np.asarray(bits), dtype="<u2")
        out["inkling"].append(
            {"h": int(h), "w": int(w), "numel": int(bits.size), "bits_sha256": sha256_bytes(bits.tobytes())}
        )
    json.dump(out, sys.stdout)


def run_rust_helper(jobs: dict) -> dict:
    if not MAIN_PY.exists():
        sys.exit(f"main env interpreter not found: {MAIN_PY}")
    if not any(REF_EXT.glob("_multimodal*.so")):
        sys.exit(f"Rust reference extension not found in {REF_EXT} (scripts/get_reference_ext.sh)")
    env = dict(os.environ, PYTHONPATH=str(REF_EXT))
    proc = subprocess.run(
        [str(MAIN_PY), str(Path(__file__).resolve()), "--rust-helper"],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        env=env,
        cwd=str(REPO),
    )
    if proc.returncode != 0:
        sys.exit(f"rust helper failed ({proc.returncode}):\n{proc.stderr}")
    return json.loads(proc.stdout)


# --------------------------------------------------------------------------------------------
# Reference-env part
# --------------------------------------------------------------------------------------------


def main() -> None:
    import warnings

    import numpy as np
    import torch
    import transformers
    from PIL import Image
    from transformers import Qwen2VLImageProcessor, Qwen2VLImageProcessorPil

    sys.path.insert(0, str(HERE))
    import sources
    from shared import reference_versions, require_reference_env, sha256_array, write_json

    require_reference_env()

    ext_so = sorted(REF_EXT.glob("_multimodal*.so"))
    versions = {
        **reference_versions(("libjpeg_turbo", "zlib")),
        "rust_ext": {
            "file": ext_so[0].name if ext_so else None,
            "bytes": ext_so[0].stat().st_size if ext_so else None,
            "sha256": sha256_bytes(ext_so[0].read_bytes()) if ext_so else None,
            "from": "sglang 0.5.23 wheel, sglang/srt/rust_extensions/",
        },
    }
    print("[qwen-golden] versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if k != "rust_ext"))

    # ---------------------------------------------------------------- input files
    INPUTS.mkdir(parents=True, exist_ok=True)
    images: list[dict] = []
    for group, w, h, seed, fmts in IMAGES:
        arr = sources.photo_like(h, w, seed)
        for ext in fmts:
            buf = io.BytesIO()
            if ext == "png":
                Image.fromarray(arr).save(buf, format="PNG")
            else:
                Image.fromarray(arr).save(buf, format="JPEG", quality=90)
            data = buf.getvalue()
            name = image_name(w, h, seed, ext)
            (INPUTS / name).write_bytes(data)
            dec = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
            assert dec.shape == (h, w, 3)
            if ext == "png":
                assert np.array_equal(dec, arr), name
            images.append(
                {
                    "name": name,
                    "group": group,
                    "format": {"png": "PNG", "jpg": "JPEG"}[ext],
                    "w": w,
                    "h": h,
                    "source": {"kind": "photo_like", "h": h, "w": w, "seed": seed},
                    "bytes": len(data),
                    "file_sha256": sha256_bytes(data),
                    "decoded_rgb_sha256": sha256_array(dec),
                }
            )
    wanted = {im["name"] for im in images}
    for p in INPUTS.iterdir():  # drop stale inputs from older generator versions
        if p.name not in wanted:
            p.unlink()

    # ---------------------------------------------------------------- HF processors
    def hf_kwargs(spec: dict) -> dict:
        return {
            "patch_size": spec["patch_size"],
            "merge_size": spec["merge_size"],
            "temporal_patch_size": spec["temporal_patch_size"],
            "image_mean": list(spec["image_mean"]),
            "image_std": list(spec["image_std"]),
            "size": {"shortest_edge": spec["min_pixels"], "longest_edge": spec["max_pixels"]},
        }

    procs = {}
    for cname, spec in CONFIGS.items():
        kw = hf_kwargs(spec)
        for mode, cls in (("aten_u8", Qwen2VLImageProcessor), ("pil", Qwen2VLImageProcessorPil)):
            p = cls(**kw)
            assert type(p) is cls, (cls, type(p))  # no silent fallback to the Pil class
            # The constructor kwargs must be what the processor uses.
            assert p.size.shortest_edge == spec["min_pixels"] and p.size.longest_edge == spec["max_pixels"], p.size
            assert (p.patch_size, p.merge_size, p.temporal_patch_size) == (
                spec["patch_size"],
                spec["merge_size"],
                spec["temporal_patch_size"],
            )
            assert list(p.image_mean) == spec["image_mean"] and list(p.image_std) == spec["image_std"]
            assert p.do_resize and p.do_rescale and p.do_normalize and p.rescale_factor == 1 / 255
            # The min_pixels/max_pixels constructor kwargs are the legacy spelling of the same thing.
            alt = cls(
                **{k: v for k, v in kw.items() if k != "size"},
                min_pixels=spec["min_pixels"],
                max_pixels=spec["max_pixels"],
            )
            assert (alt.size.shortest_edge, alt.size.longest_edge) == (spec["min_pixels"], spec["max_pixels"])
            procs[(cname, mode)] = p

    def run_hf(cname: str, mode: str, data: bytes) -> dict:
        img = Image.open(io.BytesIO(data)).convert("RGB")  # as HF/sglang load it; no exif_transpose
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a warning here would mean a kwarg was not honoured
            try:
                out = procs[(cname, mode)](images=img, return_tensors="pt" if mode == "aten_u8" else "np")
            except Exception as e:  # record, do not guess
                return {"error_type": type(e).__name__, "error": str(e)}
        pv = out["pixel_values"]
        grid = out["image_grid_thw"]
        if isinstance(pv, torch.Tensor):
            pv = pv.numpy()
            grid = grid.numpy()
        dtype = str(pv.dtype)
        arr = np.ascontiguousarray(pv, dtype="<f4")
        g = np.asarray(grid).astype(np.int64).reshape(-1).tolist()
        return {
            "shape": list(arr.shape),
            "dtype": dtype,
            "grid_thw": g,
            "sha256": sha256_bytes(arr.tobytes()),
            "sum": float(arr.astype(np.float64).sum()),  # diagnostics only
            "min": float(arr.min()),
            "max": float(arr.max()),
        }

    # ---------------------------------------------------------------- Qwen cases
    cases: list[dict] = []
    for cname, spec in CONFIGS.items():
        for im in images:
            data = (INPUTS / im["name"]).read_bytes()
            cg = crate_grid(spec, im["h"], im["w"])
            for mode in MODES:
                hf = run_hf(cname, mode, data)
                if "error" in hf or "error" in cg:
                    match = "error" in hf and "error" in cg
                else:
                    match = hf["grid_thw"] == cg["grid_thw"]
                case = {
                    "name": f"{cname}/{im['name']}/{mode}",
                    "config": cname,
                    "image": im["name"],
                    "format": im["format"],
                    "group": im["group"],
                    "w": im["w"],
                    "h": im["h"],
                    "mode": mode,
                    "hf": hf,
                    "crate_formula": cg,
                    "hf_grid_matches_crate": match,
                }
                tall = False
                if "error" not in hf:
                    ps, tps = spec["patch_size"], spec["temporal_patch_size"]
                    t, gh, gw = hf["grid_thw"]
                    assert hf["shape"] == [t * gh * gw, 3 * tps * ps * ps], case
                    assert hf["dtype"] == "float32", case
                    th, tw = gh * ps, gw * ps
                    # stock Pillow 12.3 Image.resize (PR #9524): `if h > w * 100 and th < h` -> vertical pass first.
                    tall = mode == "pil" and (th, tw) != (im["h"], im["w"]) and im["h"] > 100 * im["w"] and th < im["h"]
                case["pillow_tall_vertical_first"] = tall
                cases.append(case)

    # Verification that the constructor kwargs are honoured: every non-thin image must give the
    # crate formula's grid (this covers min_pixels via the tiny and qwen3 cases, max_pixels via the
    # 1200x900 image under the 1003520 configs, and patch 16 via qwen3).
    for c in cases:
        if c["group"] != "thin":
            assert c["hf_grid_matches_crate"], c
    # TV-Q4 (docs/behaviour.md §12).
    tvq4 = next(
        c for c in cases if c["config"] == "qwen2_vl_hf_default" and c["image"] == image_name(1024, 768, 23, "jpg")
    )
    assert tvq4["hf"]["shape"] == [3996, 1176] and tvq4["hf"]["grid_thw"] == [1, 54, 74], tvq4
    # The defaults of the HF classes are exactly qwen2_vl_hf_default.
    probe = (INPUTS / image_name(300, 301, 22, "png")).read_bytes()
    for mode, cls in (("aten_u8", Qwen2VLImageProcessor), ("pil", Qwen2VLImageProcessorPil)):
        saved = procs[("qwen2_vl_hf_default", mode)]
        procs[("qwen2_vl_hf_default", mode)] = cls()
        default_out = run_hf("qwen2_vl_hf_default", mode, probe)
        procs[("qwen2_vl_hf_default", mode)] = saved
        assert default_out == run_hf("qwen2_vl_hf_default", mode, probe), mode

    # ---------------------------------------------------------------- Inkling
    mean32 = np.array(INKLING_MEAN, dtype=np.float32)
    std32 = np.array(INKLING_STD, dtype=np.float32)
    inv255 = np.float32(1.0 / 255.0)
    pad_raw = np.float32(-1.0 / 255.0)

    def bf16_bits_torch(x32: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(x32, dtype=np.float32)).to(torch.bfloat16)
        return t.view(torch.int16).numpy().view(np.uint16)

    def bf16_bits_numpy(x32: np.ndarray) -> np.ndarray:  # RNE by bit arithmetic (no NaNs here)
        u = np.ascontiguousarray(x32, dtype=np.float32).view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

    v = np.arange(256, dtype=np.float32)
    lut_f32 = (v[None, :] * inv255 - mean32[:, None]) / std32[:, None]  # (3, 256), all float32
    assert lut_f32.dtype == np.float32
    lut_bits = bf16_bits_torch(lut_f32)
    assert np.array_equal(lut_bits, bf16_bits_numpy(lut_f32))
    pad_f32 = (pad_raw - mean32) / std32
    assert pad_f32.dtype == np.float32
    pad_bits = bf16_bits_torch(pad_f32)
    assert np.array_equal(pad_bits, bf16_bits_numpy(pad_f32))

    def inkling_patchify(rgb: np.ndarray, ps: int) -> np.ndarray:
        """Direct (non-LUT) reference: elementwise f32 normalise in torch, bf16 RNE, pad, HWC patches."""
        h, w, _ = rgb.shape
        nph, npw = -(-h // ps), w // ps + 1
        t = torch.from_numpy(np.array(rgb)).to(torch.float32)
        x = (t * torch.tensor(inv255) - torch.from_numpy(mean32)) / torch.from_numpy(std32)
        bits = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        canvas = np.empty((nph * ps, npw * ps, 3), dtype=np.uint16)
        canvas[...] = pad_bits
        canvas[:h, :w] = bits
        out = canvas.reshape(nph, ps, npw, ps, 3).transpose(0, 2, 1, 3, 4)
        out = np.ascontiguousarray(out).reshape(-1)
        # Cross-check against the LUT formulation.
        lut_canvas = np.empty_like(canvas)
        lut_canvas[...] = pad_bits
        lut_canvas[:h, :w] = lut_bits[np.arange(3), rgb]
        assert np.array_equal(canvas, lut_canvas)
        # Spot-check the layout formula of docs/behaviour.md §8 at a few indices.
        for k, y, xx, c in ((0, 0, 0, 0), (npw - 1, ps - 1, ps - 1, 2), (nph * npw - 1, 3, 5, 1)):
            i, j = divmod(k, npw)
            py, px = i * ps + y, j * ps + xx
            want = lut_bits[c, rgb[py, px, c]] if (py < h and px < w) else pad_bits[c]
            assert out[k * ps * ps * 3 + (y * ps + xx) * 3 + c] == want
        return out

    inkling_cases: list[dict] = []
    npz_bits: dict[str, np.ndarray] = {}
    for name, h, w, seed, frac, cap in [(n, h, w, s, None, None) for n, h, w, s in INKLING_PLAIN] + INKLING_RESCALE:
        fname = image_name(w, h, seed, "png")
        assert fname in wanted, fname
        data = (INPUTS / fname).read_bytes()
        rgb = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        assert np.array_equal(rgb, sources.photo_like(h, w, seed)), name
        tw, th = scaled_dims(w, h, frac, cap)
        if (th, tw) != (h, w):
            rgb = np.asarray(Image.fromarray(rgb).resize((tw, th), Image.Resampling.LANCZOS))
        bits = inkling_patchify(rgb, INKLING_PS)
        nph, npw = -(-th // INKLING_PS), tw // INKLING_PS + 1
        assert bits.size == nph * npw * INKLING_PS * INKLING_PS * 3
        if name in INKLING_BITS_IN_NPZ:
            npz_bits[name] = bits
        inkling_cases.append(
            {
                "name": name,
                "png": fname,
                "source": {"kind": "photo_like", "h": h, "w": w, "seed": seed},
                "h": h,
                "w": w,
                "patch_size": INKLING_PS,
                "rescale_frac": frac,
                "rescale_cap": cap,
                "out_h": th,
                "out_w": tw,
                "nph": nph,
                "npw": npw,
                "bits_numel": int(bits.size),
                "bits_sha256": sha256_array(bits.astype("<u2")),
                "rgb_sha256": sha256_array(rgb),
                "bits_in_npz": name in npz_bits,
            }
        )

    # ---------------------------------------------------------------- Rust extension (main env)
    jobs = {
        "qwen": [
            {"file": c["image"], "spec_json": json.dumps({**CONFIGS[c["config"]], "resample": c["mode"]})}
            for c in cases
        ],
        "inkling": [
            {"file": c["png"], "ps": c["patch_size"], "frac": c["rescale_frac"], "cap": c["rescale_cap"]}
            for c in inkling_cases
        ],
    }
    rust = run_rust_helper(jobs)
    versions["rust_helper_numpy"] = rust["numpy"]
    for c, r in zip(cases, rust["qwen"], strict=True):
        if "error" not in r:
            t, gh, gw = r["grid_thw"]
            r["shape"] = [t * gh * gw, r["numel"] // (t * gh * gw)]
            del r["numel"]
        c["rust"] = r
        hf = c["hf"]
        if "error" in hf and "error" in r:
            c["rust_vs_hf"] = "both_error"
        elif "error" in hf or "error" in r:
            c["rust_vs_hf"] = "one_error"
        elif hf["sha256"] == r["sha256"] and hf["grid_thw"] == r["grid_thw"]:
            c["rust_vs_hf"] = "equal"
        elif hf["grid_thw"] == r["grid_thw"]:
            c["rust_vs_hf"] = "values_differ"
        else:
            c["rust_vs_hf"] = "grid_differs"
        c["rust_equals_hf"] = c["rust_vs_hf"] == "equal"
        # The formula is the crate's: the extension must agree with it on grid and error text.
        cg = c["crate_formula"]
        if "error" in cg:
            assert r.get("error") == cg["error"], (c["name"], r, cg)
        else:
            assert r.get("grid_thw") == cg["grid_thw"], (c["name"], r, cg)
    for c, r in zip(inkling_cases, rust["inkling"], strict=True):
        c["rust"] = r
        c["rust_equals_ref"] = r.get("bits_sha256") == c["bits_sha256"] and (r.get("h"), r.get("w")) == (
            c["out_h"],
            c["out_w"],
        )

    # ---------------------------------------------------------------- write
    write_json(
        OUT / "qwen_cases.json",
        {
            "about": "Qwen-VL parity goldens. Per case: hf = transformers "
            + transformers.__version__
            + " output for Image.open(BytesIO(file)).convert('RGB') (no exif_transpose): "
            "mode aten_u8 = Qwen2VLImageProcessor (torchvision backend, return_tensors='pt', 1 torch "
            "thread), mode pil = Qwen2VLImageProcessorPil (return_tensors='np'); sha256 of "
            "pixel_values as float32 little-endian C-order bytes; or error_type/error if HF raised. "
            "crate_formula = docs/behaviour.md §7.2 smart_resize grid (or the crate's error text). "
            "rust = sglang 0.5.23 _multimodal.qwen_vl.preprocess(file bytes, json(spec + resample=mode)). "
            "rust_vs_hf: equal | values_differ (JPEG: zune-jpeg decode) | grid_differs | one_error | "
            "both_error. Where hf_grid_matches_crate is false, HF's own smart_resize disagrees with the "
            "crate (docs/behaviour.md §7.2 item 7); the target is the crate (rust). "
            "pillow_tall_vertical_first: pil mode on stock Pillow 12.3's tall-image path (h > 100*w "
            "and the height shrinks: Image.resize runs the vertical pass first, Pillow PR #9524); "
            "the crate and pillow-simd 12.1.1 (checked) run the horizontal pass first, so there "
            "hf (Pillow 12.3) and rust differ by a few uint8 levels after resize.",
            "configs": CONFIGS,
            "hf_constructor_kwargs": "cls(patch_size=, merge_size=, temporal_patch_size=, image_mean=, "
            "image_std=, size={'shortest_edge': min_pixels, 'longest_edge': max_pixels}); "
            "min_pixels=/max_pixels= constructor kwargs are equivalent",
            "images": images,
            "versions": versions,
        },
        "cases",
        cases,
    )
    write_json(
        OUT / "inkling_cases.json",
        {
            "about": "Inkling bf16 patchify goldens (docs/behaviour.md §8, §12). bits = u16[nph*npw*ps*ps*3], "
            "nph = ceil(h'/ps), npw = floor(w'/ps) + 1, patch k = i*npw + j, HWC inside a patch, pad "
            "outside the image; value = bf16 RNE of (f32(v)*f32(1/255) - MEAN_c)/STD_c in f32 (torch "
            ".to(bfloat16)). Rescale cases: scaled_dims(w, h, frac, cap) then stock Pillow 12 "
            "LANCZOS. bits_sha256 = SHA-256 of the u16 little-endian bytes; the full bits of the "
            "small cases are in inkling_bits.npz. png = file in inputs/ (PIL PNG encoding of "
            "sources.photo_like(h, w, seed)). rust = sglang 0.5.23 "
            "_multimodal.inkling.decode_patchify(png, ps, frac, cap).",
            "lut_bits": [[int(x) for x in row] for row in lut_bits],
            "pad_bits": [int(x) for x in pad_bits],
            "mean_f32": [float(x) for x in mean32],
            "std_f32": [float(x) for x in std32],
            "versions": versions,
        },
        "cases",
        inkling_cases,
    )
    write_npz(OUT / "inkling_bits.npz", npz_bits)

    # ---------------------------------------------------------------- summary
    print(f"[qwen-golden] {len(images)} input files, {len(cases)} qwen cases, {len(inkling_cases)} inkling cases")
    print(
        f"[qwen-golden] {'mode':8} {'format':6} {'cases':>5} {'equal':>6} {'values_differ':>13} "
        f"{'grid_differs':>12} {'one_error':>9} {'both_error':>10}"
    )
    for mode in MODES:
        for fmt in ("PNG", "JPEG"):
            sel = [c for c in cases if c["mode"] == mode and c["format"] == fmt]
            cnt = {
                k: sum(c["rust_vs_hf"] == k for c in sel)
                for k in ("equal", "values_differ", "grid_differs", "one_error", "both_error")
            }
            print(
                f"[qwen-golden] {mode:8} {fmt:6} {len(sel):5} {cnt['equal']:6} {cnt['values_differ']:13} "
                f"{cnt['grid_differs']:12} {cnt['one_error']:9} {cnt['both_error']:10}"
            )
    mism = [c for c in cases if not c["hf_grid_matches_crate"]]
    print(f"[qwen-golden] HF grid != crate formula: {len(mism)} cases")
    for c in mism:
        print(
            f"[qwen-golden]   {c['name']}: hf {c['hf'].get('grid_thw', c['hf'].get('error'))} "
            f"crate {c['crate_formula'].get('grid_thw', c['crate_formula'].get('error'))}"
        )
    errs = sorted(
        {(c["hf"]["error_type"], c["hf"]["error"], c["rust"].get("error")) for c in cases if "error" in c["hf"]}
    )
    for e in errs:
        print(f"[qwen-golden] HF error: {e[0]}: {e[1]}  | rust: {e[2]}")
    odd = [c for c in cases if c["format"] == "PNG" and c["rust_vs_hf"] not in ("equal", "both_error")]
    print(f"[qwen-golden] PNG cases where rust != HF: {len(odd)}")
    for c in odd:
        if not c["hf_grid_matches_crate"]:
            why = "HF smart_resize != crate"
        elif c["pillow_tall_vertical_first"]:
            why = "Pillow tall-image vertical-first resize"
        else:
            why = "UNEXPLAINED"
        print(f"[qwen-golden]   {c['name']}: {c['rust_vs_hf']} ({why})")
        assert why != "UNEXPLAINED", c["name"]
    tall = [c["name"] for c in cases if c["pillow_tall_vertical_first"]]
    print(f"[qwen-golden] pil cases on Pillow's tall-image resize path: {len(tall)}: {tall}")
    for c in inkling_cases:
        print(
            f"[qwen-golden] inkling {c['name']}: out {c['out_h']}x{c['out_w']} grid {c['nph']}x{c['npw']} "
            f"rust_equals_ref={c['rust_equals_ref']}"
        )
    size = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"[qwen-golden] tests/golden/qwen total size: {size} bytes")
    print("QWEN_GOLDEN_OK")


def write_npz(path: Path, arrays: dict) -> None:
    """np.savez_compressed equivalent with fixed zip timestamps (np.savez stamps the current time)."""
    import numpy as np

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())


if __name__ == "__main__":
    if sys.argv[1:] == ["--rust-helper"]:
        rust_helper()
    else:
        main()
