"""The load test's request stream: how many images, from which kind of source, with which prompt, and
which requests are deliberately bad (and how they must be rejected).

Prompts are random text ids around the family's tokens for each image (`Family.image_prompt`), so
the stream fits any family; a "placeholder" request leaves one image's tokens out.
"""

import base64
import random
from collections.abc import Iterator
from dataclasses import dataclass

from mmworker.errors import MmError, Outcome
from mmworker.loadtest.corpus import CorpusImage

SOURCE_KINDS = ("bytes", "data", "base64", "path", "http")
BAD_KINDS = ("corrupt", "truncated", "too_many", "placeholder", "http_404")
# How each kind of bad request must be rejected: its outcome, and what the message must name (the
# cause, so that a request rejected as bad input for another reason is caught too).
EXPECTED_REJECTION = {
    "corrupt": (Outcome.BAD_INPUT, "image decode"),
    "truncated": (Outcome.BAD_INPUT, "image decode"),
    "too_many": (Outcome.BAD_INPUT, "exceeds 64 media items"),
    "placeholder": (Outcome.BAD_INPUT, "media placeholder"),
    "http_404": (Outcome.BAD_INPUT, "status code 404"),
}


@dataclass(frozen=True)
class RequestSpec:
    index: int
    input_ids: list[int]
    sources: list
    kind: str  # "good" or one of BAD_KINDS
    images: int

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


def check_bad_fraction(value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise MmError(f"loadtest: --bad-fraction must be within 0..1, got {value}")
    return value


class Workload:
    """An endless, deterministic (per seed) stream of RequestSpecs over a corpus."""

    def __init__(
        self,
        corpus: list[CorpusImage],
        image_prompt: tuple[int, ...],
        images_per_request: dict[int, float],
        source_kinds: tuple[str, ...],
        bad_fraction: float,
        base_url: str,
        seed: int,
    ) -> None:
        check_bad_fraction(bad_fraction)
        parse_sources(",".join(source_kinds))
        if not image_prompt:
            raise MmError("loadtest: the family's image prompt is empty")
        self.corpus, self.image_prompt = corpus, list(image_prompt)
        self._jpegs = [i for i in corpus if i.fmt == "JPEG"] or corpus  # what "truncated" cuts short
        self._smallest = min(corpus, key=lambda i: len(i.data))  # what "too_many" repeats 65 times
        self.counts, self.weights = list(images_per_request), list(images_per_request.values())
        self.kinds, self.bad_fraction, self.base_url = source_kinds, bad_fraction, base_url.rstrip("/")
        self.rng = random.Random(seed)
        self._encoded: dict[tuple[str, str], str] = {}

    def _b64(self, image: CorpusImage) -> str:
        key = (image.name, "b64")
        if key not in self._encoded:
            self._encoded[key] = base64.b64encode(image.data).decode("ascii")
        return self._encoded[key]

    def _source(self, image: CorpusImage) -> object:
        kind = self.rng.choice(self.kinds)
        if kind == "base64" and self._b64(image).startswith("/"):
            kind = "data"  # bare base64 of a JPEG starts with '/' and would be read as a path (crate rule)
        if kind == "bytes":
            return image.data
        if kind == "data":  # cached: records keep their specs, so equal strings must be one object
            key = (image.name, "data")
            if key not in self._encoded:
                self._encoded[key] = f"data:image/{image.fmt.lower()};base64,{self._b64(image)}"
            return self._encoded[key]
        if kind == "base64":
            return self._b64(image)
        if kind == "path":
            return str(image.path)
        return f"{self.base_url}/{image.name}"

    def _text(self, low: int, high: int) -> list[int]:
        """Between `low` and `high` random text ids, none of them one of the image prompt's."""
        ids = []
        for _ in range(self.rng.randint(low, high)):
            token = self.rng.randrange(1000, 30000)
            while token in self.image_prompt:
                token = self.rng.randrange(1000, 30000)
            ids.append(token)
        return ids

    def _prompt(self, n: int, placeholders: int) -> list[int]:
        ids = self._text(2, 12)
        for k in range(n):
            if k < placeholders:
                ids += self.image_prompt
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
        images = [rng.choice(self.corpus) for _ in range(n)]
        if rng.random() >= self.bad_fraction:
            return RequestSpec(index, self._prompt(n, n), [self._source(i) for i in images], "good", n)
        kind = rng.choice(BAD_KINDS)
        sources = [self._source(i) for i in images]
        ids = self._prompt(n, n)
        if kind == "corrupt":
            sources[rng.randrange(n)] = bytes(rng.getrandbits(8) for _ in range(rng.randint(16, 4096)))
        elif kind == "truncated":
            victim = rng.choice(self._jpegs)
            sources[rng.randrange(n)] = victim.data[: len(victim.data) // 3]
        elif kind == "too_many":
            sources, n = [self._smallest.data] * 65, 65
            ids = self._prompt(65, 65)
        elif kind == "placeholder":
            ids = self._prompt(n, n - 1)
        else:
            sources[rng.randrange(n)] = f"{self.base_url}/missing-{index}.jpg"
        return RequestSpec(index, ids, sources, kind, n)
