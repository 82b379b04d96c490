"""The load test's images: a built-in deterministic corpus of real-world sizes, or a user's directory."""

import os
from dataclasses import dataclass
from pathlib import Path

from mmworker.common.decode import sniff_format
from mmworker.corpus import encode, photo_like
from mmworker.errors import MmError

# (kind, width, height, format, how many): phone photos, video frames, screenshots, photos, icons.
DEFAULT_MIX = (
    ("phone", 4032, 3024, "JPEG", 2),
    ("phone", 3024, 4032, "JPEG", 1),
    ("frame", 1920, 1080, "JPEG", 3),
    ("frame", 1280, 720, "JPEG", 4),
    ("frame", 1280, 720, "WEBP", 2),
    ("screenshot", 1920, 1080, "PNG", 1),
    ("screenshot", 1440, 900, "PNG", 2),
    ("photo", 640, 480, "JPEG", 4),
    ("photo", 800, 600, "WEBP", 2),
    ("icon", 128, 128, "PNG", 3),
    ("icon", 64, 64, "WEBP", 2),
)
_EXT = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp", "GIF": "gif", "BMP": "bmp"}
CORPUS_VERSION = 1  # bump when DEFAULT_MIX or the generator changes: cached corpora are keyed on it


@dataclass(frozen=True)
class CorpusImage:
    path: Path
    data: bytes
    fmt: str

    @property
    def name(self) -> str:
        return self.path.name


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mmworker"


def build_default(seed: int) -> Path:
    """Write the default corpus for `seed` (once; later calls reuse the files) and return its directory."""
    directory = cache_dir() / f"loadtest-corpus-v{CORPUS_VERSION}-seed{seed}"
    done = directory / ".complete"
    if done.exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    k = 0
    for kind, w, h, fmt, count in DEFAULT_MIX:
        for _ in range(count):
            k += 1
            path = directory / f"{kind}_{w}x{h}_{k:02d}.{_EXT[fmt]}"
            if not path.exists():
                data = encode(photo_like(w, h, seed=seed * 1000 + k), fmt)
                tmp = path.with_suffix(".part")
                tmp.write_bytes(data)
                tmp.rename(path)
    done.write_text("ok\n")
    return directory


def load(directory: Path) -> list[CorpusImage]:
    """Every image in `directory` that mmworker accepts (by content, not extension), sorted by name."""
    images = []
    for path in sorted(Path(directory).iterdir()):
        if not path.is_file() or path.name.startswith("."):
            continue
        data = path.read_bytes()
        try:
            fmt = sniff_format(data)
        except MmError:
            continue
        images.append(CorpusImage(path=path.resolve(), data=data, fmt=fmt))
    if not images:
        raise MmError(f"loadtest: no JPEG/PNG/WebP/GIF/BMP images in {directory}")
    return images
