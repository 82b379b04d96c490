"""What the pool hands back per request: `Reply` (accept or reject, zero-copy views) and `to_sglang`."""

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from mmworker.errors import Outcome, UsageError
from mmworker.pipeline import IMAGE, Family


class Lease(Protocol):
    """An accepted reply's hold on its worker's ring (the pool's side of `release`)."""

    handed_out: float  # time.monotonic() when the caller got the reply (0 until then)

    def release(self) -> None: ...

    def release_on_drop(self, views: list[np.ndarray]) -> None: ...


@dataclass(frozen=True, eq=False)
class ReplyItem:
    """One item (an image or a video) of an accepted request: its feature view, aux tensors, content
    hash and modality ("IMAGE" or "VIDEO", SGLang's names)."""

    feature: np.ndarray  # read-only view into the worker's shared-memory ring
    aux: dict[str, np.ndarray]
    hash: int
    modality: str = IMAGE


@dataclass(eq=False)
class Reply:
    """Exactly one per submitted request.

    `kind` says what became of it (mmworker.errors.Outcome): ACCEPTED exactly when `ok`, else the
    kind of rejection, beside `error`, the message that names the cause.

    Accepted (`ok`): `input_ids` (int64, expanded), `items` (the images, then the videos, each in
    request order), `offsets` (per item its inclusive span: its first placeholder token to its
    last), `runs` (per item its inclusive placeholder runs: one for an image, one per temporal
    patch for a Qwen3 video, whose timestamp text lies between), `positions` (int64 [3, L] M-RoPE)
    and `delta`, both None for a family with plain 1-D positions, and `family`, which produced it
    (what `to_sglang` asks). Every array is a read-only view into shared
    memory that stays valid until `release()` (or the end of a `with reply:` block); after that the
    worker may reuse the memory, so copy anything you keep. Or, for views handed on to code that
    drops them later, `release_on_drop()`: the memory goes back once nothing sees it any more.
    """

    request_id: Any
    ok: bool
    error: str | None = None
    kind: Outcome = Outcome.ACCEPTED
    input_ids: np.ndarray | None = None
    offsets: list[tuple[int, int]] = field(default_factory=list)
    items: list[ReplyItem] = field(default_factory=list)
    runs: list[tuple[tuple[int, int], ...]] = field(default_factory=list)
    positions: np.ndarray | None = None
    delta: int | None = None
    # Where an accepted request's time went; latency_ms = queued + to_worker + busy + returned.
    latency_ms: float = 0.0  # submit -> reply ready
    queued_ms: float = 0.0  # submit -> handed to a worker (waiting for I/O or an idle worker)
    to_worker_ms: float = 0.0  # handed over -> the worker began (its inbox, the worker waking up)
    busy_ms: float = 0.0  # time the worker spent on it
    worker: int | None = None  # which worker produced it
    nbytes: int = 0  # shared memory of its worker's ring the reply holds until released
    cache_hits: int = 0  # images whose features came from the feature cache (computed for an earlier request)
    family: Family | None = field(default=None, repr=False)
    _lease: Lease | None = field(default=None, repr=False)

    @property
    def token_ids(self) -> dict[str, int]:
        """SGLang's im_token_id, im_start_id, ...: those the family's spec names (none without a family)."""
        return self.family.token_ids() if self.family is not None else {}

    @property
    def returned_ms(self) -> float:
        """The worker finished -> reply ready here (results channel, waking up, building the reply);
        0 for a rejection."""
        return self.latency_ms - self.queued_ms - self.to_worker_ms - self.busy_ms if self.ok else 0.0

    @property
    def features(self) -> list[np.ndarray]:
        return [item.feature for item in self.items]

    @property
    def hashes(self) -> list[int]:
        return [item.hash for item in self.items]

    def views(self) -> list[np.ndarray]:
        """Every array of an accepted reply that views shared memory: input_ids, positions, each
        item's feature and aux arrays (none for a rejection)."""
        if not self.ok:
            return []
        views = [self.input_ids]
        if self.positions is not None:
            views.append(self.positions)
        for item in self.items:
            views.append(item.feature)
            views.extend(item.aux.values())
        return views

    def release(self) -> None:
        """Give the shared memory back (idempotent). Views must not be used afterwards."""
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()

    def release_on_drop(self) -> None:
        """Give the shared memory back once nothing sees it any more, instead of at `release()`.

        From now on the memory goes back to its worker once every array of this reply (`views()`)
        and everything still viewing them is gone: slices, reshapes, tensors of `torch.from_numpy`
        (which keep a reference to the array they wrap), and this Reply itself, which holds its
        arrays (drop it, or keep only what you hand on). The last reference may go on any thread:
        the pool gives the memory back at its next `poll()` (or `process()`, or the asyncio
        driver's next turn), woken through `fileno()`. Until then nothing overwrites the bytes.
        `release()` after this is a no-op, and so is this on a rejected or released reply. After
        the pool is closed nothing is given back (there is nobody to give it to), and views still
        alive keep the memory mapped as long as they live.
        """
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release_on_drop(self.views())

    def __enter__(self) -> "Reply":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def to_sglang(reply: Reply) -> dict[str, Any]:
    """SGLang's processor-output dict for an accepted reply, built from views (no copy, no torch).

    `mm_items` entries are what `MultimodalDataItem.from_dict` accepts, one per item (image or
    video) in the reply's order: the item's `modality`, its `offsets` (its placeholder runs: one for
    an image, one per temporal patch for a Qwen3 video), and the family's `model_data` of its aux
    views as `model_specific_data` (Qwen: `image_grid_thw`, or `video_grid_thw` and, for Qwen2.5-VL,
    `second_per_grid_ts`); how SGLang groups a request's videos is its caller's business. Each
    `feature` is the reply's view as is, in the family's dtype: for bfloat16 features (Inkling's, a qwen_vl spec's
    `feature_dtype = "bfloat16"`) uint16 holding the bf16 bits, since numpy has no bfloat16 (a torch
    consumer views them with `torch.from_numpy(f).view(torch.bfloat16)`, zero-copy); the family's `token_ids`
    (`im_token_id`, `im_start_id`, ... those its spec names) sit beside them. For an M-RoPE family
    `mrope_positions` is the int64 [3, L] view and `mrope_position_delta` an int64 [[delta]] array
    (SGLang's scheduler-side code wraps them with torch.from_numpy, which is zero-copy too); a family
    with 1-D positions has neither. Hashes are plain Python ints: SGLang calls `.to_bytes` on them.
    UsageError for a rejected reply, or one the pool did not make (it names no family).
    """
    if not reply.ok:
        raise UsageError(f"to_sglang: request {reply.request_id!r} was rejected: {reply.error}")
    family = reply.family
    if family is None:
        raise UsageError(f"to_sglang: reply {reply.request_id!r} names no family (not a pool's reply)")
    model_data = family.model_data
    items = []
    for item, runs in zip(reply.items, reply.runs, strict=True):
        items.append(
            {
                "modality": item.modality,
                "feature": item.feature,
                "model_specific_data": model_data(item.aux),
                "hash": int(item.hash),
                "offsets": [(int(start), int(end)) for start, end in runs],
            }
        )
    # The token ids let SGLang's scheduler find and pad the items' tokens (pad_mm_tokens skips a
    # modality whose token id is unknown).
    out: dict[str, Any] = {"input_ids": reply.input_ids, "mm_items": items, **family.token_ids()}
    if reply.positions is not None:
        out["mrope_positions"] = reply.positions
        out["mrope_position_delta"] = np.array([[reply.delta]], np.int64)
    return out
