"""The pool's configuration: worker count, core pinning, rings, queue depth and deadlines, validated once.

The one place the pool's defaults live: the client passes every setting to its child processes,
which read them without defaults of their own. From a dict or a TOML file (every key optional):

    workers = "auto"          # or an int; "auto" = one per core left after the reserved ones
    cores = "2-13,16"         # CPUs the pool may use; default: this process's affinity set
    reserved_cores = 2        # first N of those kept for the scheduler (SGLang's default:
                              # min(2, len // 4) when there are >= 4 cores, else 0)
    io_core = 1               # where the I/O process runs; default: floats over the non-worker cores
    ring_mib = 256            # shared-memory ring per worker (features of in-flight + unreleased replies)
    cache_mib = 512           # the feature cache (finished images by content, mmworker.pool.cache), split
                              # evenly across the workers; 0 turns it off
    trust_content_hashes = false  # a caller's content hashes (submit's `content_hashes`) key the cache
                              # without hashing the bytes (as SGLang's --trust-mm-content-hashes); only
                              # for callers whose hashes are right: a wrong one serves another image
    inputs_in_place = true    # workers copy a job's input bytes straight out of this process's memory
                              # (process_vm_readv: no per-byte work here) where the kernel allows it (same
                              # user; Yama ptrace_scope 0), checked at start-up; else, or with false:
    request_ring_mib = 64     # the client's ring they are copied into (a job that does not fit gets a
                              # one-off segment instead)
    queue_depth = 256         # requests in flight (fetching + queued + running); beyond: "queue full"
    deadline_s = 60           # per request, from dispatch to a worker; past it: "deadline exceeded"
    memory_wait_s = 5         # how long a worker whose ring is full waits for replies to be released
                              # before it rejects the job (kind MEMORY_FULL: the caller holds replies
                              # too long; the message says how many and since when)
    image_cpu_s = 30          # CPU seconds per image a worker may spend on a request (then it rejects it)
    video_cpu_s = 40          # and per video: a request's budget is image_cpu_s * images + video_cpu_s * videos;
                              # below deadline_s, so that a video over it is rejected by the budget (the worker
                              # stays) before the deadline replaces the worker: raise both for long videos
    start_timeout_s = 120     # all workers ready within this, or start-up fails
    io_concurrency = 32       # simultaneous downloads in the I/O process
    ordered = true            # poll() returns replies in submission order (false: completion order)
    worker_sched = "auto"     # "idle": SCHED_IDLE workers run only while no ordinary task wants their core,
                              # so the embedding process preempts one the moment it wakes; "normal": ordinary
                              # tasks, worker_nice nicer; "auto": idle where this process keeps a CPU no worker
                              # is pinned to (e.g. reserved cores), else normal (a process that spins on a
                              # worker's core would starve an idle worker)
    worker_nice = 10          # with "normal": workers run this much nicer than the embedding process (0-19)

    [media]                   # where images may come from (mmworker.common.policy); default: safe
    allowed_domains = []      # empty: any domain
    allow_private = false     # loopback, RFC 1918, link-local/metadata, CGNAT, ... refused
    allowed_networks = []     # re-allowed despite that, e.g. ["127.0.0.1/32"] for a local media server
    allowed_local_roots = []  # file paths accepted only under these directories (none by default)
    max_redirects = 5
"""

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from mmworker.common.policy import MediaPolicy
from mmworker.errors import MmError

WORKER_SCHED_POLICIES = ("auto", "idle", "normal")


@dataclass(frozen=True)
class CorePlan:
    """Which CPU each process gets: one core per worker, the I/O process's set, the scheduler's reserve."""

    workers: tuple[int, ...]
    io: tuple[int, ...]
    reserved: tuple[int, ...]
    own_cpus: tuple[int, ...]  # CPUs this process may use that no worker is pinned to
    worker_sched: str  # "idle" or "normal": PoolConfig.worker_sched, with "auto" decided from own_cpus

    def describe(self) -> str:
        lines = [f"reserved for the scheduler: {_ranges(self.reserved) or 'none'}"]
        lines += [f"worker {k}: core {core}" for k, core in enumerate(self.workers)]
        lines.append(f"I/O process: {_ranges(self.io)}")
        lines.append(f"CPUs of this process without a worker: {_ranges(self.own_cpus) or 'none'}")
        return "\n".join(lines)


def parse_cores(text: str) -> tuple[int, ...]:
    """'2-5,8' -> (2, 3, 4, 5, 8)."""
    cores: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = (int(v) for v in part.split("-", 1))
                if lo > hi:
                    raise ValueError
                cores.extend(range(lo, hi + 1))
            else:
                cores.append(int(part))
        except ValueError:
            raise MmError(f"pool config: cores: cannot parse {part!r} (use e.g. '2-13,16')") from None
    if not cores:
        raise MmError(f"pool config: cores: {text!r} names no CPU")
    return tuple(sorted(set(cores)))


def _ranges(cores: tuple[int, ...]) -> str:
    out, start, prev = [], None, None
    for c in cores:
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            out.append(f"{start}-{prev}" if start != prev else f"{start}")
            start = prev = c
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else f"{start}")
    return ",".join(out)


@dataclass(frozen=True)
class PoolConfig:
    workers: int | str = "auto"
    cores: str | None = None
    reserved_cores: int | None = None
    io_core: int | None = None
    ring_mib: int = 256
    cache_mib: int = 512
    trust_content_hashes: bool = False
    inputs_in_place: bool = True
    request_ring_mib: int = 64
    queue_depth: int = 256
    deadline_s: float = 60.0
    memory_wait_s: float = 5.0
    image_cpu_s: float = 30.0
    video_cpu_s: float = 40.0
    start_timeout_s: float = 120.0
    io_concurrency: int = 32
    ordered: bool = True
    worker_sched: str = "auto"
    worker_nice: int = 10
    media: Mapping[str, Any] | None = None

    @classmethod
    def from_any(cls, config: "PoolConfig | Mapping[str, Any] | str | Path | None") -> "PoolConfig":
        """A config from itself, a mapping, a TOML file path, or None (all defaults)."""
        if config is None:
            return cls()
        if isinstance(config, PoolConfig):
            return config
        if isinstance(config, (str, Path)):
            try:
                data = tomllib.loads(Path(config).read_text())
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise MmError(f"pool config: {config}: {exc}") from exc
            return cls.from_mapping(data)
        return cls.from_mapping(config)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "PoolConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise MmError(f"pool config: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        config = cls(**data)
        config.validate()
        return config

    def validate(self) -> None:
        def positive(name: str, value: Any, kind: type = int) -> None:
            if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or value <= 0:
                raise MmError(f"pool config: {name} must be a positive {kind.__name__}, got {value!r}")

        if self.workers != "auto":
            positive("workers", self.workers)
        if self.reserved_cores is not None and (not isinstance(self.reserved_cores, int) or self.reserved_cores < 0):
            raise MmError(f"pool config: reserved_cores must be a non-negative int, got {self.reserved_cores!r}")
        positive("ring_mib", self.ring_mib)
        if isinstance(self.cache_mib, bool) or not isinstance(self.cache_mib, int) or self.cache_mib < 0:
            raise MmError(f"pool config: cache_mib must be a non-negative int (0: no cache), got {self.cache_mib!r}")
        positive("request_ring_mib", self.request_ring_mib)
        positive("queue_depth", self.queue_depth)
        positive("deadline_s", self.deadline_s, float)
        positive("memory_wait_s", self.memory_wait_s, float)
        positive("image_cpu_s", self.image_cpu_s, float)
        positive("video_cpu_s", self.video_cpu_s, float)
        positive("start_timeout_s", self.start_timeout_s, float)
        positive("io_concurrency", self.io_concurrency)
        if self.worker_sched not in WORKER_SCHED_POLICIES:
            raise MmError(f'pool config: worker_sched must be "auto", "idle" or "normal", got {self.worker_sched!r}')
        nice = self.worker_nice
        if isinstance(nice, bool) or not isinstance(nice, int) or not 0 <= nice <= 19:
            raise MmError(f"pool config: worker_nice must be an int from 0 to 19, got {self.worker_nice!r}")
        for name in ("ordered", "inputs_in_place", "trust_content_hashes"):
            if not isinstance(getattr(self, name), bool):
                raise MmError(f"pool config: {name} must be true or false, got {getattr(self, name)!r}")
        self.media_policy()  # raises on a bad [media] table

    def media_policy(self) -> MediaPolicy:
        return MediaPolicy.from_mapping(self.media)

    def plan(self, allowed: set[int] | None = None) -> CorePlan:
        """The core map, checked against this process's CPU affinity (or `allowed`)."""
        allowed_set = set(os.sched_getaffinity(0) if allowed is None else allowed)
        candidates = parse_cores(self.cores) if self.cores is not None else tuple(sorted(allowed_set))
        outside = [c for c in candidates if c not in allowed_set]
        if outside:
            raise MmError(
                f"pool config: cores {_ranges(tuple(outside))} are not in this process's CPU set "
                f"({_ranges(tuple(sorted(allowed_set)))})"
            )
        reserve = self.reserved_cores
        if reserve is None:
            reserve = min(2, len(candidates) // 4) if len(candidates) >= 4 else 0
        if reserve >= len(candidates):
            raise MmError(f"pool config: reserving {reserve} of {len(candidates)} core(s) leaves none for workers")
        reserved, available = candidates[:reserve], candidates[reserve:]
        count = len(available) if self.workers == "auto" else self.workers
        if count > len(available):
            raise MmError(
                f"pool config: {count} workers need {count} cores, but only {len(available)} are available "
                f"({_ranges(available)}; {reserve} reserved)"
            )
        workers = available[:count]
        if self.io_core is not None:
            if self.io_core not in allowed_set:
                raise MmError(f"pool config: io_core {self.io_core} is not in this process's CPU set")
            io = (self.io_core,)
        else:
            io = tuple(c for c in candidates if c not in workers) or candidates
        own = tuple(sorted(allowed_set - set(workers)))  # where this process can run without a worker
        sched = self.worker_sched if self.worker_sched != "auto" else ("idle" if own else "normal")
        return CorePlan(workers=tuple(workers), io=io, reserved=tuple(reserved), worker_sched=sched, own_cpus=own)
