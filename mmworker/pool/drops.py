"""Releases that garbage collection makes: a reply's memory goes back once nothing sees its arrays.

`Reply.release_on_drop()` is for consumers that wrap the reply's views and let go of them later,
somewhere else (SGLang: `torch.from_numpy`, which keeps a reference to the numpy array it wraps,
and tensors dropped on another thread). Every view a pool reply holds stands on an anchor of its
own (ipc.ring.RingReader), which every array derived from it keeps alive: slices, reshapes, a
tensor's reference. A weak-reference finalizer on each anchor of the reply counts down, and the
last one posts the reply's token.

A finalizer runs wherever the last reference goes: on any thread, inside a garbage collection,
while the pool's own thread is in the middle of something. So it does the least that can be done
anywhere: it appends the token to a deque (atomic), and on another thread than the pool's it also
bumps an eventfd that the pool's wake-up set watches (so a loop sleeping on `WorkerPool.fileno()`
wakes). The pool takes the tokens on its own thread at its next turn and releases those replies as
`Reply.release()` would.

    another thread                              the pool's thread (poll / process / the asyncio driver)
    last anchor of reply r gone
      -> posted.append(r); eventfd += 1  --->  fileno() readable -> take() -> release r's allocations
    the pool's thread, between turns
      -> posted.append(r)                ...   next turn (a submit, a result, a tick, stats) -> take()

On the pool's own thread a wake-up would buy nothing and cost the most: that thread is awake, and
an event loop's extra sleep and wake-up per drop would cost it, per request, as much as the
wake-up for the request's own result. Its next turn comes soon wherever the memory is wanted: a job waiting
for ring room is a request in flight, and the asyncio driver turns every 50 ms while there are any.

After the pool closes, a finalizer finds the eventfd gone and posts nothing (the views that are
still alive keep the ring mapped by themselves). In a forked child (a copy of this object, the
eventfd shared with the parent) it posts nothing either: the memory is the parent's to release.
"""

import collections
import contextlib
import os
import threading
import weakref
from collections.abc import Iterable

import numpy as np


class Drops:
    """The hand-over of releases from finalizers (any thread) to the pool's thread; owns one eventfd."""

    def __init__(self) -> None:
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._pid = os.getpid()
        self.owner = threading.get_ident()  # the pool's thread: the one that last turned its engine
        # Taken by a finalizer's write and by close(): a closed descriptor's number may be reused at
        # once by anything else in the process, which a late write must never reach. Reentrant: a
        # finalizer may run on a thread that holds it already (a collection triggered inside).
        self._lock = threading.RLock()
        self.posted: collections.deque[int] = collections.deque()  # tokens whose anchors are all gone

    def fileno(self) -> int:
        """Readable (level-triggered) while tokens may be waiting."""
        return self._fd

    def watch(self, views: Iterable[np.ndarray], token: int) -> None:
        """Post `token` once every view in `views` and everything derived from them is gone.

        Call it on the pool's thread while the views are alive (the caller holds them).
        """
        anchors = {}
        for view in views:
            anchor = view.base if isinstance(view.base, np.ndarray) else view
            anchors[id(anchor)] = anchor  # views that share an anchor count once
        if not anchors:
            self.post(token)
            return
        # list.pop is atomic: of the finalizers, exactly one finds the list empty, whichever
        # threads they run on and in whatever order.
        countdown = [None] * (len(anchors) - 1)
        for anchor in anchors.values():
            weakref.finalize(anchor, _anchor_gone, self, token, countdown).atexit = False

    def post(self, token: int) -> None:
        """Hand `token` to the pool's thread and wake it (any thread)."""
        if os.getpid() != self._pid:  # a forked child's copy
            return
        with self._lock:
            if self._fd < 0:  # the pool is closed: nothing to give back to
                return
            self.posted.append(token)
            if threading.get_ident() == self.owner:  # awake, and it takes what is posted at its next turn
                return
            with contextlib.suppress(BlockingIOError):  # the counter is at its maximum: readable anyway
                os.eventfd_write(self._fd, 1)

    def take(self) -> list[int]:
        """The tokens posted so far (the pool's thread). The eventfd is reset first, so a token
        posted while this runs is either taken here or wakes the pool again."""
        if self._fd < 0:
            return []
        with contextlib.suppress(BlockingIOError):  # nothing posted since the last take
            os.eventfd_read(self._fd)
        posted, taken = self.posted, []
        while posted:
            taken.append(posted.popleft())
        return taken

    def close(self) -> None:
        """Close the eventfd; later posts are dropped without error."""
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
        self.posted.clear()


def _anchor_gone(drops: Drops, token: int, countdown: list[None]) -> None:
    try:
        countdown.pop()
    except IndexError:  # the last of the reply's anchors
        drops.post(token)
