"""Deterministic photo-like test images and clips: the inputs of benchmarks, tests, the load test and warm-ups.

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


# Clip containers (PyAV format names) by file extension.
CLIP_CONTAINERS = {"mp4": "mp4", "webm": "webm", "avi": "avi", "mkv": "matroska"}
# Encoder options per codec: fast, single-threaded (deterministic), modest quality.
_CLIP_OPTIONS = {
    "libx264": {"preset": "veryfast", "crf": "26"},
    "libvpx-vp9": {"deadline": "realtime", "cpu-used": "8", "crf": "40", "b": "0"},
    "libvpx": {"deadline": "realtime", "cpu-used": "8", "crf": "30", "b": "1M"},
    "mpeg4": {"qscale": "5"},
    "mjpeg": {"qscale": "5"},
}
_CLIP_PIXEL_FORMATS = {"mjpeg": "yuvj420p"}  # FFmpeg's MJPEG encoder takes full-range formats only


def encode_clip(codec: str, ext: str, width: int, height: int, fps: int, seconds: float, seed: int = 0) -> bytes:
    """A clip of `seconds` at `fps` and width x height, encoded with `codec` into the container of
    `ext` (mp4, webm, avi, mkv) with PyAV (the `video` extra): a photo-like still, panned over, the
    crop moving along two sines, so that motion estimation and residuals look like a camera's pan
    rather than a test pattern. The same arguments always give the same bytes."""
    import math

    import av

    still = photo_like(width * 5 // 4 + 2, height * 5 // 4 + 2, seed=seed)
    span_x, span_y = still.shape[1] - width, still.shape[0] - height
    out = io.BytesIO()
    with av.open(out, "w", format=CLIP_CONTAINERS[ext]) as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = width, height
        stream.pix_fmt = _CLIP_PIXEL_FORMATS.get(codec, "yuv420p")
        stream.codec_context.thread_count = 1
        stream.codec_context.options = dict(_CLIP_OPTIONS.get(codec, {}))
        for k in range(max(2, round(fps * seconds))):
            t = k / fps
            x = round(span_x * (0.5 + 0.5 * math.sin(t / 1.5)))
            y = round(span_y * (0.5 + 0.5 * math.cos(t / 2.0)))
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(still[y : y + height, x : x + width]), "rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()
