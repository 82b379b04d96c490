"""The worker pool: pinned single-threaded workers, an I/O process, and the client embedded in the scheduler.

| module | owns |
|---|---|
| `client` | `WorkerPool`, the public face: submit, poll, process, aprocess, cancel, stats, close; wires the parts |
| `inflight` | the requests in flight: each one's `State`, and the table that gives each exactly one reply |
| `dispatch` | the queue of requests waiting for a worker, the idle workers, and the hand-over of one to the other |
| `supervisor` | the child processes: start, Hello, ended or overdue, restart |
| `engine` | one turn of the pool: wait, receive, check the children, dispatch; a worker's Done into a `Reply` |
| `slots` | the worker slots and the memory replies hold in their rings (leases, releases owed to each worker) |
| `cache` | the feature cache: finished images in shared memory by content, their pins, LRU eviction, dedupe |
| `naming` | the names inside a worker's Done (tensors, meta keys): built by the worker, read by the client |
| `resources` | `PoolResources`: the OS resources of one pool (processes, sockets, segments) and their teardown |
| `inputs` | a request's inputs: checked at submit, staged where its worker reads them, freed after |
| `answers` | the replies owed, one per request, handed out in submission (or completion) order, or each to its future |
| `aio` | `PoolDriver`: `aprocess`'s one reader per pool per event loop, one future per request |
| `drops` | releases made by garbage collection (`Reply.release_on_drop`), handed from any thread to the pool's |
| `worker` | the CPU worker process (driver.process into its shared-memory ring) |
| `cpu_budget` | a worker's CPU budget per job (a CPU-time timer whose signal raises inside the job) |
| `iostage` | the I/O process (pycurl multi: URLs and files before a request reaches a worker) |
| `reply` | `Reply` (zero-copy views, release, its kind, its family) and `to_sglang` |
| `config` | `PoolConfig` (TOML or dict), the one place the pool's defaults live, and the core plan |
| `child` | how every child process starts and stops (lifeline, pinning, scheduling class) |
| `protocol` | what the pool's processes agree on beyond the ipc schema (identities, source kinds) |
"""

from mmworker.errors import Outcome, UsageError
from mmworker.pool.client import PoolStats, WorkerPool
from mmworker.pool.config import CorePlan, PoolConfig
from mmworker.pool.reply import Reply, ReplyItem, to_sglang

__all__ = [
    "CorePlan",
    "Outcome",
    "PoolConfig",
    "PoolStats",
    "Reply",
    "ReplyItem",
    "UsageError",
    "WorkerPool",
    "to_sglang",
]
