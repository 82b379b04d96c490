"""The load test's images: a built-in deterministic corpus of real-world sizes, or a user's directory.

The built-in corpus is generated once per seed into the user's cache directory. The load test runs
the generator in a process of its own (`python -m mmworker.loadtest.corpus DIRECTORY SEED`): the
memory that generating full-size photos takes then never shows in the load test's own memory
figures, which are about the pool's client, not about the corpus's making.
"""

import os
import sys
from collections.abc import Callable
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


_COMPLETE = ".complete"  # written last: a directory without it is a build that did not finish


def default_dir(seed: int) -> Path:
    """Where the built-in corpus for `seed` lives (complete once `is_complete` says so)."""
    return cache_dir() / f"loadtest-corpus-v{CORPUS_VERSION}-seed{seed}"


def is_complete(directory: Path) -> bool:
    return (directory / _COMPLETE).exists()


def default_images() -> list[tuple[str, int, int, str]]:
    """(file name, width, height, format) of each image of the built-in corpus, in the order built."""
    images = []
    for kind, w, h, fmt, count in DEFAULT_MIX:
        for _ in range(count):
            images.append((f"{kind}_{w}x{h}_{len(images) + 1:02d}.{_EXT[fmt]}", w, h, fmt))
    return images


def build(directory: Path, seed: int) -> Path:
    """Write the built-in corpus for `seed` into `directory` (files already there are kept, so an
    interrupted build resumes) and mark it complete; returns `directory`."""
    files = [(name, lambda w=w, h=h, fmt=fmt, k=k: encode(photo_like(w, h, seed=seed * 1000 + k), fmt))
             for k, (name, w, h, fmt) in enumerate(default_images(), start=1)]  # fmt: skip
    return write_complete(directory, files)


def write_complete(directory: Path, files: list[tuple[str, Callable[[], bytes]]]) -> Path:
    """Write each (name, make) of `files` into `directory` unless it is there (each atomically, so an
    interrupted build resumes and never sees half a file), then the marker that says the directory is
    complete; returns `directory`, at once if it was complete already."""
    if is_complete(directory):
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    for name, make in files:
        path = directory / name
        if not path.exists():
            tmp = path.with_suffix(".part")
            tmp.write_bytes(make())
            tmp.rename(path)
    (directory / _COMPLETE).write_text("ok\n")
    return directory


def load(directory: Path) -> list[CorpusImage]:
    """Every image in `directory` that mmworker accepts (by content, not extension), sorted by name."""
    if not Path(directory).is_dir():
        raise MmError(f"loadtest: --corpus {directory}: no such directory")
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


def main(argv: list[str]) -> int:
    """`python -m mmworker.loadtest.corpus DIRECTORY SEED`: build the corpus there."""
    build(Path(argv[1]), int(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
