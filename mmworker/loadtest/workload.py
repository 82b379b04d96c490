"""The load test's request stream: how many images and videos, from which kind of source, with which
prompt, which requests are deliberately bad (and how they must be rejected), and which images repeat
earlier ones.

Prompts are random text ids around the family's tokens for each image (`Family.image_prompt`) and
video (`Family.video_prompt`), so the stream fits any family; a "placeholder" request leaves one
image's tokens out.

With a video fraction F, a share F of the requests carry one video (a clip of
mmworker.loadtest.clips) and 0 or 1 image, the video's tokens at a random place among the image's
and the text: mixed prompts. Of the deliberately bad requests, the same share F are bad for their
video: a corrupt one (an MP4 signature followed by random bytes) or a truncated one (the first third
of an MP4 clip, whose index is at its end), the image bad kinds the rest. With F = 0 (the default)
the stream is the image-only stream of before, draw for draw. Videos are sent as they are, from
the same kinds of source as images (the media server serves the clips under /videos/; a path source
is the clip's own file): the pool never caches videos, so a clip sent again costs its worker as much
as the first time and needs no variants.

Every image is a variant of a corpus image (mmworker.loadtest.variants): the same pixels, bytes of
its own, so that the pool's feature cache, which keys images by their bytes, finds nothing it has
seen unless the stream means it to. With a repeat fraction F, each image of a good request repeats,
with probability F, one of the last REPEAT_WINDOW images of good requests accepted so far (as a
user sends an image again in the next turn, once the last one was answered; an image still being
computed would make the request wait for it, and a closed loop would then idle workers): the same
variant from the same kind of source, hence the same bytes (or text) and the same cache key. Bad
requests' images are always fresh, and never repeated: a request that fails caches nothing. Which
image a repeat takes depends on when requests are answered; everything else in the stream is
deterministic per seed (repeats have a random generator of their own, and a fresh image is drawn
for every image, repeat or not).

A request is kept as what it is made of (`Ref`s: corpus image, variant tag, source kind), not as its
sources, which are made when needed (`acquire`): the runner keeps thousands of requests for
--compare-inline and --verify, and their images' bytes would take gigabytes. A variant as bytes or
base64 text costs one copy of the image (variants.Variants); one from a file path is a file written
into the run's scratch directory, deleted once no request in flight reads it and no later request
may repeat it; one from an http URL is made by the media server.
"""

import base64
import collections
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from mmworker.errors import MmError, Outcome
from mmworker.loadtest.clips import CorpusClip
from mmworker.loadtest.corpus import CorpusImage
from mmworker.loadtest.variants import Variants

SOURCE_KINDS = ("bytes", "data", "base64", "path", "http")
BAD_KINDS = ("corrupt", "truncated", "too_many", "placeholder", "http_404")
VIDEO_BAD_KINDS = ("video_corrupt", "video_truncated")  # of requests with a video, when videos are on
# How each kind of bad request must be rejected: its outcome, and what the message must name (the
# cause, so that a request rejected as bad input for another reason is caught too).
EXPECTED_REJECTION = {
    "corrupt": (Outcome.BAD_INPUT, "image decode"),
    "truncated": (Outcome.BAD_INPUT, "image decode"),
    "too_many": (Outcome.BAD_INPUT, "exceeds 64 media items"),
    "placeholder": (Outcome.BAD_INPUT, "media placeholder"),
    "http_404": (Outcome.BAD_INPUT, "status code 404"),
    "video_corrupt": (Outcome.BAD_INPUT, "video decode: cannot read the container"),
    "video_truncated": (Outcome.BAD_INPUT, "video decode: cannot read the container"),
}
# What a corrupt video starts with: an MP4 file type box, so that FFmpeg opens it as an MP4 (one of
# the accepted containers) and fails on what follows; bare random bytes are sometimes refused as an
# unsupported container instead, and the load test wants one reason per bad kind.
MP4_SIGNATURE = b"\x00\x00\x00\x18ftypisom\x00\x00\x02\x00isomiso2"
_VIDEO_TYPES = {".mp4": "video/mp4", ".webm": "video/webm", ".avi": "video/x-msvideo", ".mkv": "video/x-matroska"}
# How many of the latest answered images a repeat chooses from. Recent enough that the default
# cache (512 MiB) holds them all with the built-in corpus at the default max_pixels (~15 MB of
# features per image): a repeat measures a hit, not the cache's size, unless the images are larger.
REPEAT_WINDOW = 8


@dataclass(frozen=True)
class Ref:
    """One image of a request as the workload makes it: corpus image `image`, its variant `tag` (None:
    the corpus file as it is), from a source of `kind`; `cut`: the first third of it (a truncated file)."""

    image: int
    tag: int | None
    kind: str
    cut: bool = False


@dataclass(frozen=True)
class ClipRef:
    """One video of a request: clip `clip` of the video corpus, as it is, from a source of `kind`;
    `cut`: the first third of it (a truncated file)."""

    clip: int
    kind: str
    cut: bool = False


@dataclass(frozen=True)
class RequestSpec:
    index: int
    input_ids: list[int]
    refs: list  # per image a Ref, or the source itself (a bad request's random bytes, its missing URL)
    kind: str  # "good" or one of BAD_KINDS or VIDEO_BAD_KINDS
    images: int
    repeats: int = 0  # images that repeat one of an earlier request (the same bytes)
    videos: tuple = ()  # per video a ClipRef, or the source itself (a corrupt video's bytes)

    @property
    def expected(self) -> tuple[Outcome, str] | None:
        """How this request must be rejected (None: it must be accepted)."""
        return EXPECTED_REJECTION.get(self.kind)


def parse_distribution(text: str) -> dict[int, float]:
    """'1:60,2:25,3:10,4:5' -> {1: 60, 2: 25, ...}: images per request and their weights."""
    weights: dict[int, float] = {}
    try:
        for part in text.split(","):
            n, w = part.split(":")
            weights[int(n)] = float(w)
    except ValueError:
        raise MmError(f"loadtest: --images-per-request {text!r}: expected 'N:weight,...' e.g. '1:60,2:25'") from None
    if not weights or min(weights) < 1 or max(weights) > 64 or min(weights.values()) < 0 or sum(weights.values()) <= 0:
        raise MmError(f"loadtest: --images-per-request {text!r}: counts must be 1..64 with non-negative weights")
    return weights


def parse_sources(text: str) -> tuple[str, ...]:
    """'bytes,http' -> ('bytes', 'http'): the source kinds mixed in, each one of SOURCE_KINDS."""
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    if not kinds or any(k not in SOURCE_KINDS for k in kinds):
        raise MmError(f"loadtest: --sources {text}: choose from {', '.join(SOURCE_KINDS)}")
    return kinds


def check_fraction(option: str, value: float) -> float:
    """`value` if it is within 0..1; MmError naming `option` (e.g. "--bad-fraction") otherwise."""
    if not 0.0 <= value <= 1.0:
        raise MmError(f"loadtest: {option} must be within 0..1, got {value}")
    return value


class Workload:
    """An endless, deterministic (per seed) stream of RequestSpecs over a corpus (see the module
    docstring); `scratch` is the directory for the files of path sources (needed with "path");
    `clips`, `video_prompt` and `video_fraction` the videos' (needed when the fraction is not 0)."""

    def __init__(
        self,
        corpus: list[CorpusImage],
        image_prompt: tuple[int, ...],
        images_per_request: dict[int, float],
        source_kinds: tuple[str, ...],
        bad_fraction: float,
        base_url: str,
        seed: int,
        repeat_fraction: float = 0.0,
        scratch: Path | None = None,
        *,
        clips: Sequence[CorpusClip] = (),
        video_prompt: tuple[int, ...] = (),
        video_fraction: float = 0.0,
    ) -> None:
        check_fraction("--bad-fraction", bad_fraction)
        check_fraction("--repeat-fraction", repeat_fraction)
        check_fraction("--video-fraction", video_fraction)
        parse_sources(",".join(source_kinds))
        if not image_prompt:
            raise MmError("loadtest: the family's image prompt is empty")
        if video_fraction and (not clips or not video_prompt):
            raise MmError("loadtest: a video fraction needs video clips and the family's video prompt")
        if "path" in source_kinds and scratch is None:
            raise MmError("loadtest: path sources need a scratch directory for their files")
        self.corpus, self.image_prompt = corpus, list(image_prompt)
        self.clips, self.video_prompt, self.video_fraction = list(clips), list(video_prompt), video_fraction
        self._special = set(self.image_prompt) | set(self.video_prompt)  # ids the random text never uses
        self._truncatable = [k for k, clip in enumerate(self.clips) if clip.truncatable]
        self._clip_b64: dict[int, str] = {}  # base64 text of the clips sent as text, made on first use
        self.variants = []
        for image in corpus:
            try:
                self.variants.append(Variants(image.data, image.fmt))
            except ValueError as exc:
                raise MmError(f"loadtest: {image.path}: cannot make distinct copies of it: {exc}") from None
        self._jpegs = [k for k, i in enumerate(corpus) if i.fmt == "JPEG"] or list(range(len(corpus)))
        self._smallest = min(range(len(corpus)), key=lambda k: len(corpus[k].data))  # "too_many" sends it 65 times
        self.counts, self.weights = list(images_per_request), list(images_per_request.values())
        self.kinds, self.bad_fraction, self.base_url = source_kinds, bad_fraction, base_url.rstrip("/")
        self.repeat_fraction, self.scratch = repeat_fraction, scratch
        self.rng = random.Random(seed)
        self._repeat_rng = random.Random(seed + 1)  # which image a repeat takes: timing decides what it chooses from
        self._tags = 0  # the next fresh variant
        self._recent: collections.deque[Ref] = collections.deque()  # what repeats choose from, newest last
        self._recent_paths: collections.Counter[Path] = collections.Counter()  # their files
        self._readers: collections.Counter[Path] = collections.Counter()  # files -> acquired requests reading them
        self._written: set[Path] = set()

    def _fresh(self, image: int | None = None, cut: bool = False) -> Ref:
        image = self.rng.randrange(len(self.corpus)) if image is None else image
        kind = "bytes" if cut else self.rng.choice(self.kinds)
        if kind == "base64" and base64.b64encode(self.corpus[image].data[:3]).startswith(b"/"):
            kind = "data"  # bare base64 of a JPEG starts with '/' and would be read as a path (crate rule)
        self._tags += 1
        return Ref(image, self._tags - 1, kind, cut)

    def _fresh_clip(self, cut: bool = False) -> ClipRef:
        clip = self.rng.choice(self._truncatable) if cut else self.rng.randrange(len(self.clips))
        kind = "bytes" if cut else self.rng.choice(self.kinds)
        if kind == "base64" and base64.b64encode(self.clips[clip].data[:3]).startswith(b"/"):
            kind = "data"  # (as for images: bare base64 starting with '/' would be read as a path)
        return ClipRef(clip, kind, cut)

    def _text(self, low: int, high: int) -> list[int]:
        """Between `low` and `high` random text ids, none of them one of the image or video prompt's."""
        ids = []
        for _ in range(self.rng.randint(low, high)):
            token = self.rng.randrange(1000, 30000)
            while token in self._special:
                token = self.rng.randrange(1000, 30000)
            ids.append(token)
        return ids

    def _prompt(self, n: int, placeholders: int, videos: int = 0) -> list[int]:
        """Text, then per image its tokens (the first `placeholders` images) and more text; each of
        `videos` videos' tokens go in at a random place among the images'."""
        slots = [self.image_prompt if k < placeholders else [] for k in range(n)]
        for _ in range(videos):
            slots.insert(self.rng.randint(0, len(slots)), self.video_prompt)
        ids = self._text(2, 12)
        for tokens in slots:
            ids += tokens
            ids += self._text(0, 6)
        return ids

    def __iter__(self) -> Iterator[RequestSpec]:
        index = 0
        while True:
            yield self.make(index)
            index += 1

    def make(self, index: int) -> RequestSpec:
        rng = self.rng
        n = rng.choices(self.counts, self.weights)[0]
        # (No draw at all without videos: the image-only stream stays what it was.)
        if self.video_fraction and rng.random() < self.video_fraction:
            return self._with_video(index, rng.randint(0, 1))
        if rng.random() >= self.bad_fraction:
            refs, repeats = self._good(n)
            return RequestSpec(index, self._prompt(n, n), refs, "good", n, repeats)
        kind = rng.choice(BAD_KINDS)
        refs: list = [self._fresh() for _ in range(n)]
        ids = self._prompt(n, n)
        if kind == "corrupt":
            refs[rng.randrange(n)] = bytes(rng.getrandbits(8) for _ in range(rng.randint(16, 4096)))
        elif kind == "truncated":
            refs[rng.randrange(n)] = self._fresh(rng.choice(self._jpegs), cut=True)
        elif kind == "too_many":  # refused before anything is read: the corpus file itself will do
            refs, n = [Ref(self._smallest, None, "bytes")] * 65, 65
            ids = self._prompt(65, 65)
        elif kind == "placeholder":
            ids = self._prompt(n, n - 1)
        else:
            refs[rng.randrange(n)] = f"{self.base_url}/missing-{index}.jpg"
        return RequestSpec(index, ids, refs, kind, n)

    def _with_video(self, index: int, n: int) -> RequestSpec:
        """A request with one video and `n` images: good, or bad for its video."""
        rng = self.rng
        if rng.random() >= self.bad_fraction:
            refs, repeats = self._good(n)
            return RequestSpec(index, self._prompt(n, n, 1), refs, "good", n, repeats, (self._fresh_clip(),))
        kind = rng.choice(VIDEO_BAD_KINDS) if self._truncatable else "video_corrupt"
        refs = [self._fresh() for _ in range(n)]
        if kind == "video_corrupt":
            video: ClipRef | bytes = MP4_SIGNATURE + bytes(rng.getrandbits(8) for _ in range(rng.randint(16, 4096)))
        else:
            video = self._fresh_clip(cut=True)
        return RequestSpec(index, self._prompt(n, n, 1), refs, kind, n, 0, (video,))

    def _good(self, n: int) -> tuple[list[Ref], int]:
        """A good request's images: each a repeat with probability repeat_fraction (of an image of
        an answered request, none twice), else fresh."""
        refs: list[Ref] = []
        repeats = 0
        for _ in range(n):
            fresh = self._fresh()
            if self.repeat_fraction and self.rng.random() < self.repeat_fraction:
                choices = [ref for ref in self._recent if ref not in refs]
                if choices:
                    refs.append(self._repeat_rng.choice(choices))
                    repeats += 1
                    continue
            refs.append(fresh)
        return refs, repeats

    def _remember(self, ref: Ref) -> None:
        """`ref` was answered: later requests may repeat it."""
        if ref in self._recent:
            return
        self._recent.append(ref)
        if ref.kind == "path":
            self._recent_paths[self._path(ref)] += 1
        if len(self._recent) > REPEAT_WINDOW:
            old = self._recent.popleft()
            if old.kind == "path":
                path = self._path(old)
                self._recent_paths[path] -= 1
                self._maybe_delete(path)

    def _path(self, ref: Ref) -> Path:
        return self.scratch / f"{ref.tag}-{self.corpus[ref.image].name}"

    def source(self, ref: "Ref | bytes | str") -> object:
        """What a request sends for `ref` (a path source's file must exist: `acquire`)."""
        if not isinstance(ref, Ref):
            return ref
        image, variants, kind = self.corpus[ref.image], self.variants[ref.image], ref.kind
        if ref.tag is None:
            return image.data if kind == "bytes" else str(image.path)
        if kind == "bytes":
            data = variants.bytes(ref.tag)
            return data[: len(data) // 3] if ref.cut else data
        if kind == "data":
            return variants.b64(ref.tag, f"data:image/{image.fmt.lower()};base64,")
        if kind == "base64":
            return variants.b64(ref.tag)
        if kind == "path":
            return str(self._path(ref))
        return f"{self.base_url}/v/{ref.tag}/{quote(image.name)}"  # the media server makes it (mediaserver)

    def video_source(self, ref: "ClipRef | bytes") -> object:
        """What a request sends for its video `ref`: the clip as it is (no files to write)."""
        if not isinstance(ref, ClipRef):
            return ref
        clip, kind = self.clips[ref.clip], ref.kind
        if kind == "bytes":
            return clip.data[: len(clip.data) // 3] if ref.cut else clip.data
        if kind in ("data", "base64"):
            if ref.clip not in self._clip_b64:
                self._clip_b64[ref.clip] = base64.b64encode(clip.data).decode("ascii")
            text = self._clip_b64[ref.clip]
            if kind == "base64":
                return text
            return f"data:{_VIDEO_TYPES.get(clip.path.suffix, 'application/octet-stream')};base64,{text}"
        if kind == "path":
            return str(clip.path)
        return f"{self.base_url}/videos/{quote(clip.name)}"  # the media server serves the clips' directory

    def video_sources(self, spec: RequestSpec) -> list:
        """`spec`'s video sources, to submit or to run."""
        return [self.video_source(ref) for ref in spec.videos]

    def acquire(self, spec: RequestSpec) -> list:
        """`spec`'s sources, to submit or to run: its path sources' files are written if need be and
        kept until `release(spec)`."""
        for ref in spec.refs:
            if isinstance(ref, Ref) and ref.kind == "path" and ref.tag is not None:
                path = self._path(ref)
                if path not in self._written:
                    path.write_bytes(self.variants[ref.image].bytes(ref.tag))
                    self._written.add(path)
                self._readers[path] += 1
        return [self.source(ref) for ref in spec.refs]

    def release(self, spec: RequestSpec, accepted: bool = False) -> None:
        """`spec` was answered (or run): its files may go once nothing else needs them. `accepted`:
        the pool accepted it, so its images are cached now, and later requests may repeat them."""
        if accepted and self.repeat_fraction and spec.kind == "good":
            for ref in spec.refs:
                self._remember(ref)
        for ref in spec.refs:
            if isinstance(ref, Ref) and ref.kind == "path" and ref.tag is not None:
                path = self._path(ref)
                self._readers[path] -= 1
                self._maybe_delete(path)

    def _maybe_delete(self, path: Path) -> None:
        if self._readers[path] <= 0 and self._recent_paths[path] <= 0 and path in self._written:
            path.unlink(missing_ok=True)
            self._written.discard(path)
            del self._readers[path], self._recent_paths[path]

    @property
    def files(self) -> int:
        """Files of path sources on disk now."""
        return len(self._written)
