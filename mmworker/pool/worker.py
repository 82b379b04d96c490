"""A CPU worker process: pinned to one core, one compute thread, runs driver.process into its own ring.

Started by the pool as `python -m mmworker.pool.worker '<json>'` (a fresh interpreter: never a fork
of the client, which may have initialised CUDA; nothing is pickled, the arguments are JSON, every
setting given: the defaults live in PoolConfig only):

    {"inbox_fd": fd, "results_fd": fd, "requests_fd": fd, "worker": k, "incarnation": n,
     "ring": name, "cores": [c] | null, "nice": n, "sched": "idle" | "normal",
     "spec": {..., "family": "module:Class"}, "parent": pid, "image_cpu_s": s, "video_cpu_s": s,
     "memory_wait_s": s, "probe": [address, hex] | null,
     "cache": {"fd": fd, "ring": id, "claims_fd": fd | null} | null}

Jobs and releases arrive in its inbox (`inbox_fd`, ipc.inbox); Hello and each job's answer
go back through `results_fd` (ipc.results). Neither uses ZeroMQ, so the process has exactly one
thread. A job's input bytes are copied straight out of the client's own memory (ipc.peer_memory),
if the client asked for that with a probe (its address and bytes) and the probe read back, which
its Hello reports; else they are read in place from the client's request ring (`requests_fd`,
read-only), or, when they did not fit there, from the one-off descriptor that came with the Job.

Life: die with the parent -> pin -> load the family (the spec names its class's import path, so a
family registered in the client at run time loads here too) and its kernels (cached numba machine
code) on its warm-up images -> map the ring -> try the probe -> Hello -> then one job at a time:

    Job(rid, inputs = places of [input_ids int64, image 0, ..., video 0, ...],
        args={"kinds": "bs..", "videos": n (absent: 0)}, released)
      -> free the piggybacked releases (allocations the client gave back while this worker was idle)
      -> driver.process(family, MmInput(ids, images, videos), alloc=ring allocator)
      -> Done(tensors and meta named as mmworker.pool.naming says: input_ids, positions (M-RoPE
              families only), each item's feature and aux tensors; offsets, runs, modalities,
              hashes, grids, delta; busy_ms and started: when the job began on this host's
              monotonic clock)
      or Failed(reason, kind), on the results channel; the job's allocations are freed on every failure path.

A video is an item like an image: its feature goes into the ring, its runs (a Qwen3 video has one
per temporal patch) and modality into the meta. A job's CPU budget is image_cpu_s per image plus
video_cpu_s per video. A feature larger than the whole ring fails the job at once (UNSUPPORTED),
naming the item, its size and ring_mib.

While waiting for ring space it applies Release messages (the only way space comes back), for at
most memory_wait_s per allocation: a ring that stays full that long means its client holds
replies too long, and the job fails at once with kind MEMORY_FULL rather than at its deadline.

The feature cache (mmworker.pool.cache): with `cache`, the worker also maps its slot's cache
partition (an inherited descriptor, the same memory for every incarnation) and allocates there
(ipc.heap) the features of the items a Job lists under "cache"; first it marks taken the live
entries `claims_fd` lists (int64 offset, nbytes, seq triples), which a previous incarnation
made. A feature that finds no room there, even after the evictions waiting in its inbox, goes into
the ring as usual: the reply is the same, the image just is not cached. Items a Job lists under
"known" are cached already: the Job carries their grid and hash instead of their bytes, and the
Done no tensor for them. Both name images only: videos are never cached. Releases name the ring or
the partition by its ring id.
"""

import json
import logging
import os
import sys
import time
import traceback

import numpy as np

from ipc.errors import AllocationTooLarge, ChannelClosed, IpcError, RingFull
from ipc.heap import HeapWriter
from ipc.inbox import InboxReader
from ipc.peer_memory import PeerMemory
from ipc.results import ResultSender
from ipc.ring import Allocation, RingReader, RingWriter
from ipc.segment import Segment
from ipc.wire import WIRE_VERSION, Done, Failed, Hello, Job, Release, TensorDesc
from mmworker.common import jpeg_planes
from mmworker.corpus import encode, encode_clip, photo_like
from mmworker.driver import KnownItem, MmInput, item_name, process
from mmworker.errors import BudgetExceeded, MmError, Outcome
from mmworker.pipeline import Grid, MRope
from mmworker.pool import naming
from mmworker.pool.child import run_child
from mmworker.pool.cpu_budget import CpuBudget
from mmworker.pool.protocol import ARG_CACHE, ARG_HASHES, ARG_KNOWN, ARG_VIDEOS, KIND_BYTES, REQUEST_RING
from mmworker.registry import pipeline_from_spec

log = logging.getLogger("mmworker.worker")


class Worker:
    """One worker's state: its family, ring, channel; `serve` runs until its inbox closes, SIGTERM or parent death."""

    def __init__(self, args: dict) -> None:
        self.started = time.monotonic()
        self.id = int(args["worker"])
        self.image_cpu_s = float(args["image_cpu_s"])
        self.video_cpu_s = float(args["video_cpu_s"])
        self.memory_wait_s = float(args["memory_wait_s"])
        self.budget = CpuBudget()
        self.family = pipeline_from_spec(args["spec"])
        self._warm_up()
        self.segment = Segment.attach(args["ring"], writable=True)
        self.ring = RingWriter(self.segment, self.id)
        self.requests_segment = Segment.map_fd(int(args["requests_fd"]))
        os.close(int(args["requests_fd"]))  # the mapping keeps the memory
        self.requests = RingReader(self.requests_segment, REQUEST_RING)
        identity = f"w{self.id}.{args['incarnation']}".encode()
        self.results = ResultSender(int(args["results_fd"]), identity)
        self.inbox = InboxReader(int(args["inbox_fd"]))
        self.client_memory = self._client_memory(int(args["parent"]), args["probe"])
        self.cache = self._cache_partition(args["cache"])
        ready_ms = (time.monotonic() - self.started) * 1e3
        hello = Hello(WIRE_VERSION, self.id, os.getpid(), self.id, args["ring"], self.segment.size, ready_ms,
                      reads_in_place=self.client_memory is not None)  # fmt: skip
        self.results.send(hello)

    def _client_memory(self, parent: int, probe: list | None) -> PeerMemory | None:
        """A reader of the client's memory if it asked for one and the probe reads back (else None:
        its jobs' inputs then come in the request ring)."""
        if probe is None:
            return None
        memory = PeerMemory(parent)
        why = memory.check(int(probe[0]), bytes.fromhex(probe[1]))
        if why is not None:
            log.warning("worker %d cannot read the client's memory, so inputs are copied for it: %s", self.id, why)
            return None
        return memory

    def _cache_partition(self, cache: dict | None) -> HeapWriter | None:
        """This slot's cache partition, its previous worker's live entries marked taken; None without a cache."""
        if cache is None:
            return None
        fd = int(cache["fd"])
        self.cache_segment = Segment.map_fd(fd, writable=True)
        heap = HeapWriter(self.cache_segment, int(cache["ring"]))
        os.close(fd)  # the mapping keeps the memory
        claims_fd = cache["claims_fd"]
        if claims_fd is not None:
            claims = Segment.map_fd(int(claims_fd))
            os.close(int(claims_fd))
            for offset, nbytes, seq in np.frombuffer(claims.buffer, np.int64).reshape(-1, 3).tolist():
                heap.claim(offset, nbytes, seq)
            claims.close()
        return heap

    def _warm_up(self) -> None:
        # Loads every kernel a request touches (from numba's on-disk cache after the first run), so
        # the first real request does not pay for it: one request of the family's warm-up images,
        # each standing in the prompt as the family's image prompt.
        family = self.family
        images = [encode(photo_like(width, height, seed=0), fmt) for width, height, fmt in family.warm_up_images()]
        process(family, MmInput([token for _ in images for token in family.image_prompt()], images))
        # Large 4:2:0 JPEGs go through TurboJPEG's planes, which no image this small reaches.
        jpeg_planes.load()
        if family.capabilities().video:
            # A video's kernels (the float resize, a Qwen3 video's second resize, the frames'
            # patchify) are others than an image's; without this the first video pays their loading
            # (and, after an install, their compilation: seconds). MPEG-4 part 2 is FFmpeg's own
            # encoder, always in PyAV's build; the kernels do not depend on the codec.
            clip = encode_clip("mpeg4", "mp4", 64, 48, 4, 2.0)
            process(family, MmInput(list(family.video_prompt()), [], [clip]))

    def serve(self) -> None:
        while True:
            try:
                got = self.inbox.recv(-1)
            except ChannelClosed:  # the client closed its end: nothing more will come
                return
            if got is None:
                continue
            message, fd = got
            if isinstance(message, Job):
                self._free_released(message.released)
                self._run(message, fd)
            else:
                self._control(message)

    def _free_released(self, allocations: list[tuple[int, int]]) -> None:
        for offset, seq in allocations:
            self.ring.release(offset, seq)

    def _writer(self, ring: int) -> RingWriter | HeapWriter:
        """The allocator a ring id names: the cache partition's, else this worker's ring."""
        return self.cache if self.cache is not None and ring == self.cache.ring else self.ring

    def _control(self, message) -> None:
        if isinstance(message, Release):
            writer = self._writer(message.ring)
            for offset, seq in message.allocations:
                writer.release(offset, seq)

    def _take_control(self) -> None:
        """Apply the releases already waiting in the inbox (a busy worker is sent nothing else)."""
        while (got := self.inbox.recv(0)) is not None:
            message, fd = got
            if fd is not None:
                os.close(fd)
            self._control(message)

    def _wait_for_space(self, seconds: float) -> None:
        got = self.inbox.recv(int(min(seconds, 0.1) * 1000))
        if got is not None:  # a busy worker is sent no Job, so no descriptor either
            message, fd = got
            if fd is not None:
                os.close(fd)
            self._control(message)

    def _run(self, job: Job, fd: int | None) -> None:
        """Run `job` and answer it; `fd` is the one-off memory holding its inputs, if they came so."""
        inputs = self.requests
        if fd is not None:
            try:
                inputs = RingReader(Segment.map_fd(fd), REQUEST_RING)
            except IpcError as exc:
                self.results.send(Failed(job.rid, f"internal error: job inputs not mapped: {exc}", kind=_INTERNAL))
                return
            finally:
                os.close(fd)  # the mapping keeps the memory
        try:
            self._answer(job, inputs)
        finally:
            if inputs is not self.requests:  # unmapped now, or when the last view of it is gone
                segment = inputs.segment
                del inputs
                segment.close()

    def _answer(self, job: Job, inputs: RingReader) -> None:
        t0 = time.monotonic()
        deadline = t0 + max(job.deadline_ms, 1) / 1000
        allocations = []  # (array, allocation) of this job, freed if it fails
        images = 0  # the job's images, once its args are read (for naming an item whose feature cannot fit)

        def allocator(cache: bool, item: int | None = None):
            def alloc(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
                dt = np.dtype(dtype)
                nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
                with self.budget.held():  # an allocation made is recorded, so a failure frees it
                    # In the cache partition if it has room (a feature to cache), else in the ring.
                    allocation = self._cache_room(nbytes) if cache else None
                    writer = self.ring if allocation is None else self.cache
                    if allocation is None:
                        try:
                            allocation = self.ring.try_allocate(nbytes) or self._wait_for_room(nbytes, deadline)
                        except AllocationTooLarge:
                            raise self._too_large(nbytes, item, images) from None
                    array = writer.array(allocation, dt, shape)
                    allocations.append((array, allocation))
                return array

            return alloc

        alloc = allocator(False)

        # CPU budget: image_cpu_s of CPU per image and video_cpu_s per video, then BudgetExceeded
        # strikes between two bytecodes of the computation (a long C call finishes first; the pool's
        # wall-clock deadline covers hangs). Never outside it (mmworker.pool.cpu_budget), so never in
        # a send, which could deliver a Done whose memory the failure path then frees. Getting the
        # input bytes is not part of it (copying them is bounded work, as it was on the client's side).
        try:
            images, videos = _item_counts(job)
            cached = _cached(job.args.get(ARG_CACHE), images) if self.cache is not None else set()

            def item_alloc(item: int):  # each item's own, so that a feature too large for the ring is named
                return allocator(item in cached, item)

            buffers = self._inputs(job, inputs)
            seconds = self.image_cpu_s * images + self.video_cpu_s * videos
            answer = self.budget.run(
                seconds or self.image_cpu_s,  # a job without items: its driver rejects it at once
                lambda: self._compute(job, buffers, videos, alloc, item_alloc, allocations, t0),
            )
        except (BudgetExceeded, MmError, IpcError) as exc:
            answer = Failed(job.rid, str(exc), (time.monotonic() - t0) * 1e3, _kind_of(exc))
        except Exception as exc:  # a bug must still answer the request, and be visible in the log
            traceback.print_exc(file=sys.stderr)
            answer = Failed(job.rid, f"internal error: {type(exc).__name__}: {exc}", kind=_INTERNAL)
        if isinstance(answer, Failed):
            self._free(allocations)
        try:
            self.results.send(answer)
        except ChannelClosed:
            raise  # the client is gone: nothing to answer to (the lifeline ends this process)
        except IpcError as exc:  # e.g. a result too large for one record: still answer, as a rejection
            self._free(allocations)
            self.results.send(Failed(job.rid, f"internal error: result not sent: {exc}", kind=_INTERNAL))

    def _too_large(self, nbytes: int, item: int | None, images: int) -> AllocationTooLarge:
        """The error for a result no release can make room for: it names the item and the setting to raise."""
        what = "a result" if item is None else f"{item_name(item, images)}: its feature"
        capacity = self.ring.capacity
        return AllocationTooLarge(
            f"{what} of {nbytes} bytes is larger than the ring (worker {self.id}'s: {capacity} bytes, "
            f"ring_mib {capacity >> 20}); no release can make room: raise ring_mib"
        )

    def _cache_room(self, nbytes: int) -> Allocation | None:
        """Room in the cache partition, after applying the evictions waiting in the inbox if need
        be; None if there is none (the feature goes to the ring, uncached)."""
        try:
            allocation = self.cache.try_allocate(nbytes)
            if allocation is None:
                self._take_control()
                allocation = self.cache.try_allocate(nbytes)
        except AllocationTooLarge:  # larger than the whole partition
            return None
        return allocation

    def _wait_for_room(self, nbytes: int, deadline: float) -> Allocation:
        """An allocation once releases make room: RingFull after memory_wait_s (or at the job's deadline)."""
        started = time.monotonic()
        try:
            return self.ring.allocate(nbytes, min(deadline, started + self.memory_wait_s), self._wait_for_space)
        except RingFull as exc:
            raise RingFull(f"{exc}, after waiting {time.monotonic() - started:.1f} s for releases") from None

    def _inputs(self, job: Job, inputs: RingReader) -> list[memoryview]:
        """The job's input bytes: views of the request ring (or of its one-off segment), or read
        out of the client's memory."""
        if not job.inputs_in_sender:
            return [inputs.view(offset, nbytes, "|u1", (nbytes,)).data for offset, nbytes in job.inputs]
        if self.client_memory is None:
            raise MmError(
                "malformed job: its inputs are in the client's memory, which this worker does not read",
                kind=Outcome.INTERNAL,
            )
        try:
            return self.client_memory.read(job.inputs)
        except IpcError as exc:
            raise IpcError(f"internal error: job inputs not read from the client: {exc}") from exc

    def _compute(
        self, job: Job, buffers: list[memoryview], videos: int, alloc, item_alloc, allocations, t0: float
    ) -> Done:
        if not buffers or len(buffers[0]) % 8:
            raise MmError(
                f"malformed job: no input_ids, or {len(buffers[0]) if buffers else 0} bytes of them",
                kind=Outcome.INTERNAL,
            )
        ids = np.frombuffer(buffers[0], dtype="<i8")
        kinds = job.args.get("kinds", "")
        if not isinstance(kinds, str) or len(kinds) != len(buffers) - 1:
            why = f"malformed job: {len(buffers) - 1} source frame(s) but kinds {kinds!r}"
            raise MmError(why, kind=Outcome.INTERNAL)
        sources = [
            buffer if kind == KIND_BYTES else str(buffer, "utf-8")
            for kind, buffer in zip(kinds, buffers[1:], strict=True)
        ]
        images = len(sources) - videos
        known = _known(job.args.get(ARG_KNOWN), images)
        hashes = {int(item): int(value) for item, value in job.args.get(ARG_HASHES) or ()}
        request = MmInput(ids, sources[:images], sources[images:])
        out = process(self.family, request, alloc=alloc, item_alloc=item_alloc, known=known, hashes=hashes)
        tensors = {naming.INPUT_IDS: self._store(out.input_ids, alloc, allocations)}
        meta: dict = {naming.OFFSETS: [list(o) for o in out.offsets], naming.RUNS: naming.pack_runs(out.runs),
                      naming.MODALITIES: [i.modality for i in out.items], naming.HASHES: [i.hash for i in out.items],
                      naming.GRIDS: [[i.geometry.t, i.geometry.h, i.geometry.w] for i in out.items]}  # fmt: skip
        if isinstance(out.positions, MRope):  # 1-D positions: nothing to send, the scheduler uses an arange
            tensors[naming.POSITIONS] = self._store(out.positions.positions, alloc, allocations)
            meta[naming.DELTA] = out.positions.delta
        for i, item in enumerate(out.items):
            if isinstance(item, KnownItem):  # the client has its feature and aux tensors
                continue
            tensors[naming.feature_name(i)] = self._desc(item.feature, allocations)
            for name, value in item.aux.items():  # small tensors (a grid, a size): views on the client too
                tensors[naming.aux_name(i, name)] = self._store(np.ascontiguousarray(value), alloc, allocations)
        return Done(job.rid, tensors, meta, (time.monotonic() - t0) * 1e3, started=t0)

    def _store(self, array: np.ndarray, alloc, allocations) -> TensorDesc:
        target = alloc(array.shape, array.dtype)
        target[...] = array
        return self._desc(target, allocations)

    def _desc(self, array: np.ndarray, allocations) -> TensorDesc:
        for candidate, allocation in allocations:
            if candidate is array:
                dtype = array.dtype.str  # the reader refuses any dtype outside ipc.ring.DTYPES
                return TensorDesc(allocation.ring, allocation.offset, allocation.seq, array.nbytes, dtype, array.shape)
        raise IpcError("a result tensor is not in the ring (the family did not use its allocator)")

    def _free(self, allocations) -> None:
        for _, allocation in allocations:
            self._writer(allocation.ring).release(allocation.offset, allocation.seq)
        allocations.clear()

    def close(self) -> None:
        self.results.close()
        self.inbox.close()
        del self.ring, self.requests
        self.segment.close()
        self.requests_segment.close()
        if self.cache is not None:
            del self.cache
            self.cache_segment.close()
        self.budget.close()


_INTERNAL = Outcome.INTERNAL.value


def _item_counts(job: Job) -> tuple[int, int]:
    """(images, videos) of a Job: its source frames (after the input_ids), the last "videos" of them
    videos; MmError (internal) if "videos" is not a count of them."""
    sources = max(0, len(job.inputs) - 1)
    videos = job.args.get(ARG_VIDEOS, 0)
    if type(videos) is not int or not 0 <= videos <= sources:
        raise MmError(f"malformed job: videos {videos!r} of {sources} source frame(s)", kind=Outcome.INTERNAL)
    return sources - videos, videos


def _cached(rows, images: int) -> set[int]:
    """A Job's "cache" items (images only: videos are never cached); MmError (internal) if malformed."""
    if rows is None:
        return set()
    if not isinstance(rows, list) or not all(type(item) is int and 0 <= item < images for item in rows):
        raise MmError(f"malformed job: cache items {rows!r} of {images} image(s)", kind=Outcome.INTERNAL)
    return set(rows)


def _known(rows, images: int) -> dict[int, KnownItem]:
    """A Job's "known" items ([[item, t, h, w, hash], ...], images only) by item; MmError (internal) if malformed."""
    known = {}
    try:
        for item, t, h, w, content_hash in rows or ():
            if not 0 <= item < images:
                raise ValueError(f"no image {item}")
            known[int(item)] = KnownItem(int(content_hash), Grid(int(t), int(h), int(w)))
    except (TypeError, ValueError) as exc:
        raise MmError(f"malformed job: known items {rows!r}: {exc}", kind=Outcome.INTERNAL) from None
    return known


def _kind_of(exc: BaseException) -> str:
    """The Outcome (its wire value) of a job's failure."""
    if isinstance(exc, MmError):
        return exc.kind.value
    if isinstance(exc, RingFull):  # the client holds its replies too long
        return Outcome.MEMORY_FULL.value
    if isinstance(exc, AllocationTooLarge):  # a result larger than the whole ring: no wait can make room
        return Outcome.UNSUPPORTED.value
    if isinstance(exc, BudgetExceeded):  # an image or video over the job's CPU budget
        return Outcome.BAD_INPUT.value
    return _INTERNAL  # an IpcError of this worker's own machinery


def main(argv: list[str]) -> int:
    return run_child(argv, f"worker {json.loads(argv[1])['worker']}", Worker)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
