"""The `mmworker loadtest` command: its options, the run sequence, and the exit status.

Sequence: corpus -> media server (127.0.0.1, own process) -> for each worker count (one, or the
--sweep-workers list): pool -> load -> verify K sampled replies in process -> report. Exit 0 only
if nothing was lost, duplicated or corrupted and every deliberately bad request was rejected for
its reason; 1 otherwise; 2 for bad options.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mmworker.driver import MmInput, process
from mmworker.errors import MmError
from mmworker.loadtest import corpus as corpus_mod
from mmworker.loadtest.report import build_report, plot, print_report
from mmworker.loadtest.runner import Runner, digest_parts
from mmworker.loadtest.workload import DEFAULT_VISION_TOKENS, SOURCE_KINDS, Workload, parse_distribution
from mmworker.pool import PoolConfig, WorkerPool
from mmworker.registry import named_spec, pipeline_from_spec


def add_arguments(p: argparse.ArgumentParser) -> None:
    load = p.add_argument_group("load")
    load.add_argument("--duration", type=float, help="seconds of measured load (default 10)")
    load.add_argument("--requests", type=int, help="stop after this many requests instead")
    load.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up left out of the figures")
    load.add_argument("--concurrency", type=int, help="closed loop: requests in flight (default 2 per worker)")
    load.add_argument("--rate", type=float, help="open loop: Poisson arrivals per second")
    work = p.add_argument_group("workload")
    work.add_argument("--corpus", help="directory of images to use instead of the built-in corpus")
    work.add_argument("--images-per-request", default="1:60,2:25,3:10,4:5", help="N:weight,... (default %(default)s)")
    work.add_argument("--sources", default=",".join(SOURCE_KINDS), help="source kinds mixed in (default %(default)s)")
    work.add_argument("--bad-fraction", type=float, default=0.05, help="deliberately bad requests (default 0.05)")
    work.add_argument("--seed", type=int, default=0)
    pool = p.add_argument_group("pool")
    pool.add_argument("--family", default="qwen2_vl", help="bundled spec (default qwen2_vl)")
    pool.add_argument("--spec", help="JSON spec file instead of --family")
    pool.add_argument(
        "--max-pixels", type=int, default=1003520,
        help="override the spec's max_pixels (default 1003520, the HF processor default); 0 keeps it",
    )  # fmt: skip
    pool.add_argument("--config", help="pool configuration TOML (workers, cores, rings, ...)")
    pool.add_argument("--workers", type=int, help="worker count (overrides --config)")
    pool.add_argument("--sweep-workers", help="comma-separated worker counts: one run each, then the knee")
    pool.add_argument("--kill-worker-every", type=float, help="chaos: SIGKILL a random worker every N seconds")
    out = p.add_argument_group("output")
    out.add_argument(
        "--verify", type=int, default=20, help="re-run K sampled accepted requests in process (default 20)"
    )
    out.add_argument("--compare-inline", action="store_true", help="also run the requests in process on one core")
    out.add_argument("--json", help="write the report here")
    out.add_argument("--plot", help="write latency-over-time and histogram PNG here")
    out.add_argument("--no-progress", action="store_true", help="no live progress display")
    out.add_argument("--corrupt-sample", action="store_true", help=argparse.SUPPRESS)  # tests: prove --verify bites


def _check(args: argparse.Namespace) -> None:
    if args.duration is not None and args.requests is not None:
        raise MmError("loadtest: --duration and --requests are exclusive")
    if args.concurrency is not None and args.rate is not None:
        raise MmError("loadtest: --concurrency (closed loop) and --rate (open loop) are exclusive")
    for name in ("duration", "rate", "kill_worker_every"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise MmError(f"loadtest: --{name} must be positive, got {value}")
    for name in ("requests", "concurrency", "workers"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise MmError(f"loadtest: --{name} must be positive, got {value}")
    if args.warmup < 0 or args.verify < 0:
        raise MmError("loadtest: --warmup and --verify must not be negative")


def _spec(args: argparse.Namespace) -> tuple[dict, str]:
    if args.spec:
        try:
            spec, name = json.loads(Path(args.spec).read_text()), args.spec
        except (OSError, json.JSONDecodeError) as exc:
            raise MmError(f"loadtest: --spec {args.spec}: {exc}") from exc
    else:
        spec, name = named_spec(args.family), args.family
    if args.max_pixels:
        spec["max_pixels"] = args.max_pixels
        name += f" (max_pixels {args.max_pixels})"
    return spec, name


def _start_media_server(directory: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "mmworker.loadtest.mediaserver", str(directory), str(os.getpid())],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    port = proc.stdout.readline().strip()
    if not port.isdigit():
        proc.kill()
        raise MmError("loadtest: the media server did not start")
    return proc, f"http://127.0.0.1:{port}"


def _verify(result, family) -> list[int]:
    mismatches = []
    for index, digest in sorted(result.verify.items()):
        spec = result.specs[index]
        out = process(family, MmInput(spec.input_ids, spec.sources))
        delta = getattr(out.positions, "delta", None)
        positions = getattr(out.positions, "positions", None)
        if digest_parts(out.input_ids, out.offsets, positions, delta, out.items) != digest:
            mismatches.append(index)
    return mismatches


def _inline(result, family, budget_s: float, pool_rps: float) -> dict:
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})  # one core, like one worker
    try:
        done, t0 = 0, time.monotonic()
        for spec in result.inline_specs:
            process(family, MmInput(spec.input_ids, spec.sources))
            done += 1
            if time.monotonic() - t0 > budget_s:
                break
        rps = done / max(1e-9, time.monotonic() - t0)
    finally:
        os.sched_setaffinity(0, allowed)  # the next pool of a sweep plans its cores from this set
    return {"requests": done, "requests_per_s": rps, "pool_speedup": pool_rps / rps if rps else float("nan")}


def run(args: argparse.Namespace) -> int:
    _check(args)
    spec, spec_name = _spec(args)
    family = pipeline_from_spec(spec)
    vision_tokens = (family.spec.vision_start_token_id or DEFAULT_VISION_TOKENS[0],
                     family.spec.vision_end_token_id or DEFAULT_VISION_TOKENS[1])  # fmt: skip
    images_per_request = parse_distribution(args.images_per_request)
    kinds = tuple(k.strip() for k in args.sources.split(",") if k.strip())
    directory = Path(args.corpus) if args.corpus else corpus_mod.build_default(args.seed)
    images = corpus_mod.load(directory)
    base_config = PoolConfig.from_any(args.config)
    counts = [int(v) for v in args.sweep_workers.split(",")] if args.sweep_workers else [args.workers]
    duration = args.duration if args.duration is not None or args.requests is not None else 10.0
    server, base_url = _start_media_server(directory)
    reports = []
    try:
        # The load test's own media server and corpus are the only private sources it allows.
        media = dict(base_config.media or {})
        media["allowed_networks"] = [*media.get("allowed_networks", []), "127.0.0.1/32"]
        media["allowed_local_roots"] = [*media.get("allowed_local_roots", []), str(directory.resolve())]
        for count in counts:
            overrides = {"media": media, **({"workers": count} if count else {})}
            config = PoolConfig.from_mapping({**vars(base_config), **overrides})
            with WorkerPool(spec, config) as pool:
                workers = len(pool.worker_pids())
                workload = Workload(images, family.spec.image_token_id, images_per_request, kinds, args.bad_fraction,
                                    base_url, args.seed, vision_tokens)  # fmt: skip
                runner = Runner(pool, workload, verify=args.verify, seed=args.seed, corrupt_sample=args.corrupt_sample)
                concurrency = None if args.rate else (args.concurrency or 2 * workers)
                result = runner.run(concurrency=concurrency, rate=args.rate, duration=duration, requests=args.requests,
                                    warmup_s=args.warmup, progress=not args.no_progress,
                                    kill_every=args.kill_worker_every)  # fmt: skip
                stats, pids = pool.stats(), pool.worker_pids()
            mismatches = _verify(result, family)
            pool_rps = result.tally.measured_accepted / max(1e-9, result.ended - result.measured_from)
            inline = _inline(result, family, min(30.0, duration or 10.0), pool_rps) if args.compare_inline else None
            config_doc = {
                "mode": f"open loop {args.rate:g}/s" if args.rate else f"closed loop, {concurrency} in flight",
                "workers": workers, "spec_name": spec_name, "spec": spec, "duration_s": duration,
                "requests": args.requests, "warmup_s": args.warmup, "images_per_request": args.images_per_request,
                "sources": list(kinds), "bad_fraction": args.bad_fraction, "seed": args.seed,
                "corpus": str(directory), "corpus_images": len(images), "pool": vars(config),
            }  # fmt: skip
            report = build_report(result, config=config_doc, pool_stats=stats, worker_pids=pids,
                                  ring_mib=config.ring_mib, mismatches=mismatches, inline=inline)  # fmt: skip
            print_report(report)
            if args.plot and len(counts) == 1:
                plot(result, args.plot)
            reports.append(report)
    finally:
        server.kill()
        server.wait()
        server.stdout.close()
    if len(counts) > 1:
        _print_sweep(reports)
    if args.json:
        document = reports[0] if len(reports) == 1 else {"version": reports[0]["version"], "sweep": reports}
        Path(args.json).write_text(json.dumps(document, indent=2, default=float))
    return 0 if all(r["ok"] for r in reports) else 1


def _print_sweep(reports: list[dict]) -> None:
    best = max(r["throughput"]["requests_per_s"] for r in reports)
    print("\nworkers  requests/s  images/s  p99 ms")
    for r in reports:
        print(f"{r['config']['workers']:7d}  {r['throughput']['requests_per_s']:10.1f}  "
              f"{r['throughput']['images_per_s']:8.1f}  {r['latency_ms']['p99']:6.1f}")  # fmt: skip
    knee = next(r for r in reports if r["throughput"]["requests_per_s"] >= 0.9 * best)
    print(f"knee: {knee['config']['workers']} worker(s) reach 90% of the best throughput ({best:.1f} requests/s)")
