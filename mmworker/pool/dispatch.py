"""The queue of requests waiting for a worker, the idle workers, and the hand-over of one to the other.

A request is handed to the worker idle the longest: its inputs are staged where that worker reads
them (mmworker.pool.inputs), and its Job goes into the worker's inbox with the releases owed to it
(mmworker.pool.slots). A worker whose inbox is full keeps its turn, and the request its place at the
head of the queue, until the worker has read its inbox.
"""

import collections
import os
import time
from typing import TYPE_CHECKING

from ipc.errors import ChannelClosed, IpcError
from ipc.wire import Job
from mmworker.errors import Outcome
from mmworker.pool.inflight import InFlight, Request, State
from mmworker.pool.inputs import InputStaging
from mmworker.pool.protocol import ARG_VIDEOS
from mmworker.pool.slots import RELEASES_PER_RECORD, Leases, Slot

if TYPE_CHECKING:
    from mmworker.pool.cache import FeatureCache
    from mmworker.pool.config import PoolConfig
    from mmworker.pool.resources import PoolResources


class Dispatcher:
    """Owns the queue and the idle set; hands queued requests to idle workers."""

    def __init__(self, resources: "PoolResources", config: "PoolConfig", inflight: InFlight, staging: InputStaging,
                 leases: Leases, cache: "FeatureCache | None") -> None:  # fmt: skip
        self._res = resources
        self._cache = cache
        self._inflight = inflight
        self._staging = staging
        self._leases = leases
        self._deadline_s = config.deadline_s
        self._deadline_ms = int(config.deadline_s * 1000)
        self.queue: collections.deque[Request] = collections.deque()
        self.idle: collections.OrderedDict[int, Slot] = collections.OrderedDict()  # longest idle first

    def enqueue(self, req: Request) -> None:
        """`req`'s inputs are all here: it waits for a worker (the next `dispatch`)."""
        req.state = State.QUEUED
        self.queue.append(req)

    def unqueue(self, req: Request) -> None:
        """Take a queued request out of the line (cancelled)."""
        self.queue.remove(req)

    def dispatch(self) -> None:
        """Hand queued requests to idle workers, the longest idle first, while there are both."""
        queue, idle = self.queue, self.idle
        while queue and idle:
            req = queue[0]
            index = next(iter(idle))
            slot = idle[index]
            handed_over = time.monotonic()  # before the send: the worker may begin before it returns
            inputs, plan = req.inputs, req.cache
            frames, args = inputs.frames, {"kinds": "".join(inputs.kinds)}
            if plan is not None:  # cached images go as their grid and hash: their bytes stay here
                frames, args = plan.frames(frames), {"kinds": plan.kinds(inputs.kinds), **plan.job_args()}
                if plan.produce:
                    self._cache.prepare(slot, plan)
            if inputs.videos:  # the last frames are videos (absent: an image-only job, as before videos)
                args[ARG_VIDEOS] = inputs.videos
            try:
                staged, fd, places = self._staging.stage(slot.in_place, (inputs.ids, *frames))
            except IpcError as exc:  # not even a one-off segment could be had
                queue.popleft()
                self._inflight.reject(req, f"request inputs not staged: {exc}", Outcome.INTERNAL)
                continue
            del idle[index]
            released = slot.pending[:RELEASES_PER_RECORD]
            job = Job(req.rid, 0, self._deadline_ms, args, released, places, slot.in_place)
            try:
                sent = self._res.inboxes[index].send(job, fd)
            except ChannelClosed:  # it died after its last answer; its process handle tells the rest
                sent = None
            finally:
                if fd is not None:
                    os.close(fd)  # the worker has its own copy now (or none is needed)
            if not sent:
                self._staging.free(staged)
                if sent is None:
                    continue
                # Its inbox is full: it has not read the releases sent while it was busy yet (it
                # is about to). The request and the worker stay first in line for the next turn.
                idle[index] = slot
                idle.move_to_end(index, last=False)
                return
            del slot.pending[: len(released)]
            queue.popleft()
            slot.rid, slot.inputs = req.rid, staged
            req.state = State.RUNNING
            req.dispatched = handed_over
            req.deadline = handed_over + self._deadline_s
            self._leases.flush(slot)  # any the Job had no room for

    def job_over(self, slot: Slot) -> None:
        """`slot`'s worker answered its job: its inputs are free, and it is idle again."""
        self._staging.free(slot.inputs)
        slot.inputs = None
        slot.rid = None
        self.idle[slot.index] = slot

    def worker_ready(self, slot: Slot) -> None:
        """`slot`'s new worker said Hello: it takes jobs from now on."""
        self.idle[slot.index] = slot

    def worker_gone(self, slot: Slot) -> None:
        """`slot`'s process has ended (or was killed and reaped): no job for it, and nothing reads its inputs."""
        self.idle.pop(slot.index, None)
        self._staging.free(slot.inputs)
        slot.inputs = None
