"""The worker pool: pinned single-threaded workers, an I/O process, and the client embedded in the scheduler.

| module | owns |
|---|---|
| `client` | `WorkerPool`: processes, rings (workers', its request ring), queue, dispatch, ordered replies, restarts |
| `worker` | the CPU worker process (driver.process into its shared-memory ring) |
| `iostage` | the I/O process (pycurl multi: URLs and files before a request reaches a worker) |
| `reply` | `Reply` (zero-copy views, release) and `to_sglang` |
| `config` | `PoolConfig` (TOML or dict) and the core plan |
"""

from mmworker.pool.client import PoolStats, WorkerPool
from mmworker.pool.config import CorePlan, PoolConfig
from mmworker.pool.reply import Reply, ReplyItem, to_sglang

__all__ = ["CorePlan", "PoolConfig", "PoolStats", "Reply", "ReplyItem", "WorkerPool", "to_sglang"]
