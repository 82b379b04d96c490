#!/usr/bin/env python3
"""Regenerate tests/golden/float_bilinear.npz: torchvision's float antialiased BILINEAR resize of one frame.

Run in SGLang's environment (torch and torchvision, as SGLang runs them):

    .venv-sglang/bin/python tests/golden/generate_float_bilinear.py

A seeded 37x53 RGB frame (`frame`, uint8 HWC) resized with SGLang's call,
`torchvision.transforms.functional.resize(frame as TCHW, [h, w], BILINEAR)` (antialias on), one
thread. `cases` holds the (h, w) targets; for each, `u8_sha256[i]` is the SHA-256 (hex) of the uint8
HWC C-order output, and `f32_sha256[i]` that of `interpolate(float32 frame, mode="bilinear",
antialias=True)` before the rounding, as float32 little-endian HWC C-order bytes, which pins the
float arithmetic to the last bit (the uint8 output hides most of it). The small outputs are also
stored whole, as `u8_{h}x{w}`. `versions` records torch, torchvision and ATen's CPU capability (the bytes are
those of its AVX2/AVX-512 builds). Fixed zip timestamps: a re-run with the same versions writes the
same file.
"""

import hashlib
import io
import zipfile
from pathlib import Path

import numpy as np
import torch
import torchvision
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as F

OUT = Path(__file__).resolve().parent / "float_bilinear.npz"
SEED = 48
# Narrowing both axes, one axis only, 1-pixel targets, widening, mixed, a factor-28 target.
CASES = [(19, 29), (37, 20), (12, 53), (1, 1), (1, 7), (37, 1), (5, 90), (28, 28), (45, 61), (80, 100), (3, 2)]
FULL_BYTES = 1400  # uint8 outputs up to this size are stored whole, larger ones by hash only


def write_npz(path: Path, arrays: dict) -> None:
    """np.savez_compressed with fixed zip timestamps (np.savez stamps the current time)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())


def main() -> None:
    torch.set_num_threads(1)
    capability = torch.backends.cpu.get_cpu_capability()
    assert capability in ("AVX2", "AVX512"), f"ATen's {capability} build sums differently; run on an AVX2 host"
    frame = np.random.default_rng(SEED).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    video = torch.from_numpy(frame[None]).permute(0, 3, 1, 2)
    arrays: dict[str, np.ndarray] = {"frame": frame, "cases": np.array(CASES, np.int32)}
    u8_hashes, f32_hashes = [], []
    for h, w in CASES:
        u8 = F.resize(video, [h, w], InterpolationMode.BILINEAR).permute(0, 2, 3, 1)[0].numpy()
        f32 = torch.nn.functional.interpolate(
            video.to(torch.float32), size=[h, w], mode="bilinear", align_corners=False, antialias=True
        )
        f32 = np.ascontiguousarray(f32.permute(0, 2, 3, 1)[0].numpy()).astype("<f4")
        assert np.array_equal(np.round(f32).astype(np.uint8), u8)  # the rounding torchvision applies
        u8_hashes.append(hashlib.sha256(np.ascontiguousarray(u8).tobytes()).hexdigest())
        f32_hashes.append(hashlib.sha256(f32.tobytes()).hexdigest())
        if u8.nbytes <= FULL_BYTES:
            arrays[f"u8_{h}x{w}"] = np.ascontiguousarray(u8)
    arrays["u8_sha256"], arrays["f32_sha256"] = np.array(u8_hashes, "S64"), np.array(f32_hashes, "S64")
    arrays["versions"] = np.bytes_(f"torch {torch.__version__}, torchvision {torchvision.__version__}, {capability}")
    write_npz(OUT, arrays)
    print(f"{OUT}: {OUT.stat().st_size} bytes, {len(CASES)} cases ({arrays['versions'].decode()})")


if __name__ == "__main__":
    main()
