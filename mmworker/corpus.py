"""Deterministic photo-like test images: the inputs of benchmarks, tests and the load test's corpus.

Flat colours and pure noise both mislead: codecs and resamplers behave differently on them than on
photos. These images mix what photos have: smooth global gradients, texture at three scales (random
fields upsampled bicubically), hard edges (translucent discs) and sensor-like noise. The same
(size, seed) always gives the same pixels.
"""

import io

import numpy as np
from PIL import Image

# Real-world sizes the benchmarks and the load test draw from (width, height).
STANDARD_SIZES = {
    "640x480": (640, 480),
    "1280x720": (1280, 720),
    "1920x1080": (1920, 1080),
    "4032x3024": (4032, 3024),
}


def photo_like(width: int, height: int, seed: int = 0) -> np.ndarray:
    """uint8 (height, width, 3) photo-like pixels."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :, None]
    corners = rng.uniform(40, 215, (4, 3)).astype(np.float32)
    img = (corners[0] * (1 - x) * (1 - y) + corners[1] * x * (1 - y) + corners[2] * (1 - x) * y
           + corners[3] * x * y)  # fmt: skip
    for cells, amplitude in ((4, 40.0), (24, 18.0), (160, 8.0)):
        gw, gh = max(2, cells * width // max(width, height)), max(2, cells * height // max(width, height))
        field = rng.integers(0, 256, (gh, gw, 3), dtype=np.uint8)
        smooth = np.asarray(Image.fromarray(field).resize((width, height), Image.Resampling.BICUBIC))
        img += (smooth.astype(np.float32) - 127.5) * (amplitude / 127.5)
    for _ in range(12):
        cy, cx = rng.uniform(0, height), rng.uniform(0, width)
        radius = rng.uniform(0.03, 0.2) * min(width, height)
        alpha = np.float32(rng.uniform(0.2, 0.6))
        colour = rng.uniform(0, 255, 3).astype(np.float32)
        y0, y1 = max(0, int(cy - radius)), min(height, int(cy + radius) + 1)
        x0, x1 = max(0, int(cx - radius)), min(width, int(cx + radius) + 1)
        yy, xx = np.ogrid[y0:y1, x0:x1]
        inside = (yy - cy) ** 2 + (xx - cx) ** 2 < radius**2
        patch = img[y0:y1, x0:x1]
        patch[inside] = patch[inside] * (1 - alpha) + colour * alpha
    img += rng.normal(0.0, 3.0, img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def encode(pixels: np.ndarray, fmt: str, quality: int = 90) -> bytes:
    """Encode RGB pixels as JPEG (quality, 4:2:0), PNG (default zlib level) or WebP (quality)."""
    buf = io.BytesIO()
    image = Image.fromarray(pixels)
    if fmt == "JPEG":
        image.save(buf, "JPEG", quality=quality, subsampling=2)
    elif fmt == "WEBP":
        image.save(buf, "WEBP", quality=quality)
    else:
        image.save(buf, fmt)
    return buf.getvalue()
