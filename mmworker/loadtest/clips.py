"""The load test's videos: a small built-in corpus of short clips, encoded with PyAV and cached like the images.

The clips are made with PyAV's bundled FFmpeg (the `video` extra), so the load test needs no ffmpeg
command line. Each is a photo-like still panned over (mmworker.corpus.encode_clip).
Together they vary what a video worker's time depends on: the codec (H.264 with B-frames, VP9,
MPEG-4 part 2, MJPEG), the container (MP4, WebM, AVI), the frame size (portrait, 720p, small) and
the length, hence how many frames are sampled. A codec the installed FFmpeg lacks falls back to the
next of its recipe (MPEG-4 part 2 and MJPEG are FFmpeg's own, always there): the file name says
which codec a clip has.

Like the image corpus (mmworker.loadtest.corpus) the clips are generated once per seed into the
user's cache directory, in a process of their own (`python -m mmworker.loadtest.clips DIRECTORY
SEED`), and a directory is complete once its marker file is written.

MP4 clips keep their index (the `moov` box) at the end, as FFmpeg's muxer writes it by default:
the load test's truncated videos are their first third, which can never be read (`truncatable`).
"""

import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from mmworker.corpus import CLIP_CONTAINERS, encode_clip
from mmworker.errors import MmError
from mmworker.loadtest.corpus import cache_dir, write_complete
from mmworker.loadtest.corpus import is_complete as is_complete  # the app asks either corpus module

CLIPS_VERSION = 1  # bump when DEFAULT_CLIPS or the encoder changes: cached corpora are keyed on it


@dataclass(frozen=True)
class ClipRecipe:
    """One built-in clip: a label, its (codec, container extension) choices in order of preference,
    its size, frame rate and length."""

    label: str
    codecs: tuple[tuple[str, str], ...]
    width: int
    height: int
    fps: int
    seconds: float


# Sizes are even (4:2:0); lengths 2-6 s, so 4-12 frames are sampled at SGLang's 2 per second.
DEFAULT_CLIPS = (
    ClipRecipe("phone", (("libx264", "mp4"), ("mpeg4", "mp4")), 360, 640, 30, 3.0),
    ClipRecipe("screen", (("libx264", "mp4"), ("mpeg4", "mp4")), 1280, 720, 24, 2.0),
    ClipRecipe("clip", (("libvpx-vp9", "webm"), ("libvpx", "webm"), ("mpeg4", "mkv")), 480, 270, 25, 4.0),
    ClipRecipe("clip", (("mpeg4", "avi"),), 320, 240, 30, 2.0),
    ClipRecipe("cam", (("mjpeg", "avi"),), 256, 144, 15, 6.0),
)


@dataclass(frozen=True)
class CorpusClip:
    path: Path
    data: bytes

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def truncatable(self) -> bool:
        """Whether its first third is unreadable for certain: an MP4 whose index is at its end."""
        return self.path.suffix == ".mp4"


def default_dir(seed: int) -> Path:
    """Where the built-in clips for `seed` live (complete once `is_complete` says so)."""
    return cache_dir() / f"loadtest-videos-v{CLIPS_VERSION}-seed{seed}"


def available_codec(recipe: ClipRecipe) -> tuple[str, str]:
    """The first (codec, extension) of `recipe` whose encoder the installed FFmpeg has."""
    import av

    for codec, ext in recipe.codecs:
        try:
            av.codec.Codec(codec, "w")
        except av.codec.codec.UnknownCodecError:
            continue
        return codec, ext
    raise MmError(f"loadtest: PyAV's FFmpeg has none of the encoders {[c for c, _ in recipe.codecs]}")


def default_clips() -> list[tuple[str, ClipRecipe, str, str]]:
    """(file name, recipe, codec, extension) of each built-in clip, in the order built, with the codec
    the installed FFmpeg encodes."""
    clips = []
    for k, recipe in enumerate(DEFAULT_CLIPS, start=1):
        codec, ext = available_codec(recipe)
        name = f"{recipe.label}_{codec.removeprefix('lib')}_{recipe.width}x{recipe.height}_{recipe.seconds:g}s_{k:02d}"
        clips.append((f"{name}.{ext}", recipe, codec, ext))
    return clips


def build(directory: Path, seed: int) -> Path:
    """Write the built-in clips for `seed` into `directory` (files already there are kept, so an
    interrupted build resumes) and mark it complete; returns `directory`."""
    files = [(name, partial(encode_clip, codec, ext, r.width, r.height, r.fps, r.seconds, seed * 1000 + k))
             for k, (name, r, codec, ext) in enumerate(default_clips(), start=1)]  # fmt: skip
    return write_complete(directory, files)


def load(directory: Path) -> list[CorpusClip]:
    """Every clip in `directory` (the files the built-in corpus names), sorted by name."""
    clips = [CorpusClip(path.resolve(), path.read_bytes()) for path in sorted(Path(directory).iterdir())
             if path.is_file() and path.suffix[1:] in CLIP_CONTAINERS]  # fmt: skip
    if not clips:
        raise MmError(f"loadtest: no video clips in {directory}")
    return clips


def main(argv: list[str]) -> int:
    """`python -m mmworker.loadtest.clips DIRECTORY SEED`: build the clips there."""
    build(Path(argv[1]), int(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
