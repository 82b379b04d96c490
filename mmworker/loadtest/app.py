"""The `mmworker loadtest` command: its options, the run sequence, and the exit status.

Sequence: check every option -> corpus (generated on first use, in a process of its own; the video
clips too with --video-fraction) -> media server (127.0.0.1, own process) and a scratch directory
(the files of path sources: see mmworker.loadtest.workload) -> for each worker count (one, or the
--sweep-workers list): pool -> load -> verify K sampled replies in process -> report; then the JSON
report and the plot; the scratch directory goes.

Every option is checked before anything starts (output paths writable, corpus present, list values
valid, the spec readable): a mistake costs no run. Exit 0 only if nothing was lost, duplicated or
corrupted and every deliberately bad request was rejected for its reason; 1 otherwise; 2 for bad
options; 130 when Ctrl-C stopped the run, after the report of what ran.

Nothing here knows a family: prompts come from `Family.image_prompt` and `Family.video_prompt`,
whether videos may be sent from `Family.capabilities`, the description from `Family.describe`, and a
spec's `max_pixels` is overridden only for specs that have one.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from mmworker.cli import EXIT_INTERRUPTED, family_help, read_spec_file, video_refusal, writable_file
from mmworker.driver import MmInput, process
from mmworker.errors import MmError
from mmworker.loadtest import clips as clips_mod
from mmworker.loadtest import corpus as corpus_mod
from mmworker.loadtest.report import build_report, plot, plural, print_report
from mmworker.loadtest.runner import Interrupt, Runner, digest_parts
from mmworker.loadtest.workload import (
    SOURCE_KINDS,
    Workload,
    check_fraction,
    parse_distribution,
    parse_sources,
)
from mmworker.pipeline import Family
from mmworker.pool import PoolConfig, WorkerPool
from mmworker.registry import named_spec, pipeline_from_spec

# The Hugging Face processors' default max_pixels, which serving uses unless a checkpoint sets one;
# the bundled specs carry the checkpoints' own (larger) limits.
DEFAULT_MAX_PIXELS = 1003520


def add_arguments(p: argparse.ArgumentParser) -> None:
    load = p.add_argument_group("load")
    load.add_argument("--duration", type=float, help="seconds of measured load (default 10)")
    load.add_argument("--requests", type=int, help="stop after this many requests (after the warm-up) instead")
    load.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up left out of the figures")
    load.add_argument("--concurrency", type=int, help="closed loop: requests in flight (default 2 per worker)")
    load.add_argument("--rate", type=float, help="open loop: Poisson arrivals per second")
    work = p.add_argument_group("workload")
    work.add_argument("--corpus", help="directory of images to use instead of the built-in corpus")
    work.add_argument("--images-per-request", default="1:60,2:25,3:10,4:5", help="N:weight,... (default %(default)s)")
    work.add_argument("--sources", default=",".join(SOURCE_KINDS), help="source kinds mixed in (default %(default)s)")
    work.add_argument("--bad-fraction", type=float, default=0.05, help="deliberately bad requests (default 0.05)")
    work.add_argument("--repeat-fraction", type=float, default=0.0,
                      help="share of images that repeat one sent earlier, byte for byte (default 0: every image "
                           "is distinct)")  # fmt: skip
    work.add_argument("--video-fraction", type=float, default=0.0,
                      help="share of requests that carry one video (and 0-1 image), from built-in clips; needs a "
                           "spec that serves videos, e.g. qwen2_vl (default 0: images only)")  # fmt: skip
    work.add_argument("--seed", type=int, default=0)
    pool = p.add_argument_group("pool")
    which = pool.add_mutually_exclusive_group()
    which.add_argument("--family", default="qwen2_vl", help=family_help())
    which.add_argument("--spec", help="JSON spec file instead of --family")
    pool.add_argument(
        "--max-pixels", type=int,
        help=f"override the spec's max_pixels, for specs that have one (default {DEFAULT_MAX_PIXELS}, the HF "
             "processors' default); 0 keeps the spec's",
    )  # fmt: skip
    pool.add_argument("--config", help="pool configuration TOML (workers, cores, rings, ...)")
    pool.add_argument("--workers", type=int, help="worker count (overrides --config)")
    pool.add_argument("--sweep-workers", help="comma-separated worker counts (each 1 or more): one run each, then "
                                              "the knee")  # fmt: skip
    pool.add_argument("--kill-worker-every", type=float, help="chaos: SIGKILL a random worker every N seconds")
    out = p.add_argument_group("output")
    out.add_argument(
        "--verify", type=int, default=20, help="re-run K sampled accepted requests in process (default 20)"
    )
    out.add_argument("--compare-inline", action="store_true",
                     help="also run the requests in process on one core (closed loop only)")  # fmt: skip
    out.add_argument("--json", help="write the report here")
    out.add_argument("--plot", help="write a PNG here: latency over time and the latency CDF")
    out.add_argument("--no-progress", action="store_true", help="no live progress display")
    out.add_argument("--corrupt-sample", action="store_true", help=argparse.SUPPRESS)  # tests: prove --verify bites


@dataclass(frozen=True)
class Options:
    """The load test's options, checked and parsed."""

    spec: dict
    spec_name: str
    family: Family
    base_config: PoolConfig
    counts: list[int | None]  # worker counts, one run each (None: the configuration's)
    images_per_request: dict[int, float]
    kinds: tuple[str, ...]
    duration: float | None


def _worker_counts(text: str) -> list[int]:
    try:
        counts = [int(v) for v in text.replace(",", " ").split()]
    except ValueError:
        raise MmError(f"loadtest: --sweep-workers {text!r}: expected worker counts separated by commas, "
                      "e.g. 1,2,4") from None  # fmt: skip
    if not counts or min(counts) < 1:
        raise MmError(f"loadtest: --sweep-workers {text!r}: every worker count must be 1 or more")
    return counts


def _exclusive(args: argparse.Namespace) -> None:
    pairs = (("duration", "requests", "--duration and --requests are exclusive"),
             ("concurrency", "rate", "--concurrency (closed loop) and --rate (open loop) are exclusive"),
             ("workers", "sweep_workers", "--workers and --sweep-workers are exclusive"),
             ("compare_inline", "rate", "--compare-inline compares the pool's throughput with one core's; with "
                                        "--rate the pool's is capped by the rate: leave one of them out"),
             ("plot", "sweep_workers", "--plot draws one run: leave out --sweep-workers, or run one worker count "
                                       "with --workers"))  # fmt: skip
    for a, b, message in pairs:
        if getattr(args, a) not in (None, False) and getattr(args, b) not in (None, False):
            raise MmError(f"loadtest: {message}")


def check(args: argparse.Namespace) -> Options:
    """Every option checked and parsed, before anything starts: raises MmError naming the first
    mistake."""
    _exclusive(args)
    for name in ("duration", "rate", "kill_worker_every"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise MmError(f"loadtest: --{name.replace('_', '-')} must be positive, got {value}")
    for name in ("requests", "concurrency", "workers"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise MmError(f"loadtest: --{name} must be positive, got {value}")
    if args.warmup < 0 or args.verify < 0:
        raise MmError("loadtest: --warmup and --verify must not be negative")
    if args.max_pixels is not None and args.max_pixels < 0:
        raise MmError(f"loadtest: --max-pixels must not be negative, got {args.max_pixels}")
    counts: list[int | None] = _worker_counts(args.sweep_workers) if args.sweep_workers else [args.workers]
    images_per_request = parse_distribution(args.images_per_request)
    kinds = parse_sources(args.sources)
    check_fraction("--bad-fraction", args.bad_fraction)
    check_fraction("--repeat-fraction", args.repeat_fraction)
    check_fraction("--video-fraction", args.video_fraction)
    for option in ("json", "plot"):
        if getattr(args, option):
            writable_file(f"--{option}", getattr(args, option))
    if args.corpus and not Path(args.corpus).is_dir():
        what = "not a directory" if Path(args.corpus).exists() else "no such directory"
        raise MmError(f"loadtest: --corpus {args.corpus}: {what}")
    spec, spec_name = _spec(args)
    try:
        family = pipeline_from_spec(spec)
    except MmError as exc:
        raise MmError(f"loadtest: {'--spec ' + args.spec if args.spec else 'spec ' + spec_name}: {exc}") from exc
    if args.video_fraction:
        refusal = video_refusal(family, args.spec or args.family)
        if refusal:
            raise MmError(f"loadtest: --video-fraction: {refusal}")
    base_config = PoolConfig.from_any(args.config)
    for count in counts:  # a worker count this machine cannot place fails now, not after earlier runs
        _pool_config(base_config, count, {}).plan()
    duration = args.duration if args.duration is not None or args.requests is not None else 10.0
    return Options(spec, spec_name, family, base_config, counts, images_per_request, kinds, duration)


def _spec(args: argparse.Namespace) -> tuple[dict, str]:
    spec, name = (read_spec_file(args.spec), args.spec) if args.spec else (named_spec(args.family), args.family)
    if args.max_pixels is None:  # the default applies to specs that have the field
        if "max_pixels" in spec:
            spec["max_pixels"] = DEFAULT_MAX_PIXELS
            name += f" (max_pixels {DEFAULT_MAX_PIXELS})"
    elif args.max_pixels:
        if "max_pixels" not in spec:
            raise MmError(f"loadtest: --max-pixels: spec {name} has no max_pixels to override")
        spec["max_pixels"] = args.max_pixels
        name += f" (max_pixels {args.max_pixels})"
    return spec, name


def _pool_config(base: PoolConfig, count: int | None, media: dict) -> PoolConfig:
    overrides = {**({"media": media} if media else {}), **({"workers": count} if count else {})}
    return PoolConfig.from_mapping({**vars(base), **overrides})


def _tilde(path: Path) -> str:
    home = os.path.expanduser("~")
    text = str(path)
    return "~" + text[len(home) :] if home != "/" and text.startswith(home + os.sep) else text


def _default_corpus(seed: int, interrupt: Interrupt, module: ModuleType = corpus_mod,
                    what: str = "image corpus") -> Path | None:  # fmt: skip
    """The built-in corpus's directory (`module`'s: the images', or the video clips' with
    mmworker.loadtest.clips), generated first if need be (None: Ctrl-C stopped that)."""
    directory = module.default_dir(seed)
    if module.is_complete(directory):
        return directory
    print(f"generating the {what} in {_tilde(directory)} (first run only)", flush=True)
    # Its own process group: a terminal's Ctrl-C reaches this process only, which stops it.
    proc = subprocess.Popen([sys.executable, "-m", module.__name__, str(directory), str(seed)],
                            process_group=0)  # fmt: skip
    try:
        while True:
            try:
                status = proc.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                if interrupt.requested:
                    return None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if status != 0:
        raise MmError(f"loadtest: generating the {what} in {directory} failed (exit status {status})")
    return directory


def _start_media_server(directory: Path, videos: Path | None) -> tuple[subprocess.Popen, str]:
    # Its own process group: a terminal's Ctrl-C reaches the load test, which stops the server.
    extra = [str(videos)] if videos else []
    proc = subprocess.Popen([sys.executable, "-m", "mmworker.loadtest.mediaserver", str(directory), str(os.getpid()),
                             *extra], stdout=subprocess.PIPE, text=True, process_group=0)  # fmt: skip
    port = proc.stdout.readline().strip()
    if not port.isdigit():
        proc.kill()
        proc.wait()
        proc.stdout.close()
        raise MmError("loadtest: the media server did not start")
    return proc, f"http://127.0.0.1:{port}"


def _in_process(family: Family, workload: Workload, spec):
    """`spec` run in this process, with the same sources as it was submitted with."""
    try:
        return process(family, MmInput(spec.input_ids, workload.acquire(spec), workload.video_sources(spec)))
    finally:
        workload.release(spec)


def _verify(result, family: Family, workload: Workload, interrupt: Interrupt) -> tuple[int, list[int]]:
    """Re-run the sampled requests in process: (how many were checked, the indices that differ)."""
    checked, mismatches = 0, []
    for index, digest in sorted(result.verify.items()):
        if interrupt.requested:
            break
        spec = result.specs[index]
        out = _in_process(family, workload, spec)
        delta = getattr(out.positions, "delta", None)
        positions = getattr(out.positions, "positions", None)
        if digest_parts(out.input_ids, out.offsets, positions, delta, out.items, out.runs) != digest:
            mismatches.append(index)
        checked += 1
    return checked, mismatches


def _inline(result, family: Family, workload: Workload, budget_s: float, pool_rps: float,
            interrupt: Interrupt) -> dict:  # fmt: skip
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})  # one core, like one worker
    try:
        done, t0 = 0, time.monotonic()
        for spec in result.inline_specs:
            if interrupt.requested:
                break
            _in_process(family, workload, spec)
            done += 1
            if time.monotonic() - t0 > budget_s:
                break
        rps = done / max(1e-9, time.monotonic() - t0)
    finally:
        os.sched_setaffinity(0, allowed)  # the next pool of a sweep plans its cores from this set
    return {"requests": done, "requests_per_s": rps, "pool_speedup": pool_rps / rps if rps else float("nan")}


def run(args: argparse.Namespace, options: Options | None = None) -> int:
    """The load test: options checked (unless `options` are those of `check(args)`), then the runs
    and their reports; returns the exit status."""
    options = options or check(args)
    with Interrupt() as interrupt:
        reports, plotted = _runs(args, options, interrupt)
    if not reports:
        print("mmworker: interrupted before the load started", file=sys.stderr)
        return EXIT_INTERRUPTED
    if len(reports) > 1:
        _print_sweep(reports)
    if args.json:
        document = reports[0] if len(options.counts) == 1 else {"version": reports[0]["version"], "sweep": reports}
        _write(args.json, lambda path: Path(path).write_text(json.dumps(document, indent=2, default=float)))
        print(f"wrote report to {args.json}")
    if args.plot and plotted is not None:
        _write(args.plot, lambda path: plot(plotted, reports[0], path))
        print(f"wrote plot to {args.plot}")
    if interrupt.requested:
        return EXIT_INTERRUPTED
    return 0 if all(r["ok"] for r in reports) else 1


def _write(path: str, write) -> None:
    try:
        write(path)
    except OSError as exc:  # checked before the run; the file system may still fail now
        raise MmError(f"loadtest: could not write {path}: {exc.strerror or exc}") from exc


def _runs(args: argparse.Namespace, options: Options, interrupt: Interrupt) -> tuple[list[dict], object]:
    """One run per worker count, each reported as it ends; stops after a run Ctrl-C cut short.
    Returns the reports and the single run's result (for the plot; None for a sweep)."""
    if args.corpus:
        directory = Path(args.corpus)
    else:
        directory = _default_corpus(args.seed, interrupt)
        if directory is None:
            return [], None
    images = corpus_mod.load(directory)
    clips: list[clips_mod.CorpusClip] = []
    clip_dir = None
    if args.video_fraction:
        clip_dir = _default_corpus(args.seed, interrupt, clips_mod, "video clips")
        if clip_dir is None:
            return [], None
        clips = clips_mod.load(clip_dir)
    family = options.family
    scratch = Path(tempfile.mkdtemp(prefix=f"mmworker-loadtest-{os.getpid()}-")).resolve()
    try:
        server, base_url = _start_media_server(directory, clip_dir)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    reports: list[dict] = []
    result = None
    try:
        # The load test's own media server, corpus and scratch files are the only private sources it allows.
        media = dict(options.base_config.media or {})
        media["allowed_networks"] = [*media.get("allowed_networks", []), "127.0.0.1/32"]
        media["allowed_local_roots"] = [*media.get("allowed_local_roots", []), str(directory.resolve()),
                                        str(scratch), *([str(clip_dir.resolve())] if clip_dir else [])]  # fmt: skip
        for count in options.counts:
            if interrupt.requested:
                break
            config = _pool_config(options.base_config, count, media)
            with WorkerPool(options.spec, config) as pool:
                if interrupt.requested:  # during the pool's start-up: nothing ran
                    break
                workers = len(pool.worker_pids())
                workload = Workload(images, family.image_prompt(), options.images_per_request, options.kinds,
                                    args.bad_fraction, base_url, args.seed, args.repeat_fraction, scratch,
                                    clips=clips, video_prompt=family.video_prompt() if clips else (),
                                    video_fraction=args.video_fraction)  # fmt: skip
                runner = Runner(pool, workload, verify=args.verify, seed=args.seed, corrupt_sample=args.corrupt_sample)
                concurrency = None if args.rate else (args.concurrency or 2 * workers)
                result = runner.run(concurrency=concurrency, rate=args.rate, duration=options.duration,
                                    requests=args.requests, warmup_s=args.warmup, progress=not args.no_progress,
                                    kill_every=args.kill_worker_every, interrupt=interrupt)  # fmt: skip
                stats, pids = pool.stats(), pool.worker_pids()
            checked, mismatches = _verify(result, family, workload, interrupt)
            pool_rps = result.tally.measured.accepted / max(1e-9, result.ended - result.measured_from)
            inline = None
            if args.compare_inline and not interrupt.requested:
                inline = _inline(result, family, workload, min(30.0, options.duration or 10.0), pool_rps,
                                 interrupt)  # fmt: skip
            result.interrupted = interrupt.requested  # also by a Ctrl-C during the checks after the load
            config_doc = {
                "mode": f"open loop {args.rate:g}/s" if args.rate else f"closed loop, {concurrency} in flight",
                "workers": workers, "spec_name": options.spec_name, "family": family.describe(),
                "spec": options.spec, "duration_s": options.duration, "requests": args.requests,
                "warmup_s": args.warmup, "images_per_request": args.images_per_request, "sources": list(options.kinds),
                "bad_fraction": args.bad_fraction, "repeat_fraction": args.repeat_fraction, "seed": args.seed,
                "corpus": str(directory), "corpus_images": len(images), "video_fraction": args.video_fraction,
                "video_corpus": str(clip_dir) if clip_dir else None, "video_clips": len(clips), "pool": vars(config),
            }  # fmt: skip
            report = build_report(result, config=config_doc, pool_stats=stats, worker_pids=pids,
                                  ring_mib=config.ring_mib, verified=checked, mismatches=mismatches,
                                  inline=inline)  # fmt: skip
            print_report(report)
            reports.append(report)
    finally:
        server.kill()
        server.wait()
        server.stdout.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return reports, (result if len(options.counts) == 1 and reports else None)


def _print_sweep(reports: list[dict]) -> None:
    best = max(r["throughput"]["requests_per_s"] for r in reports)
    print("\nworkers  requests/s  images/s  p99 ms")
    for r in reports:
        print(f"{r['config']['workers']:7d}  {r['throughput']['requests_per_s']:10.1f}  "
              f"{r['throughput']['images_per_s']:8.1f}  {r['latency_ms']['p99']:6.1f}")  # fmt: skip
    knee = next(r for r in reports if r["throughput"]["requests_per_s"] >= 0.9 * best)
    workers = plural(knee["config"]["workers"], "worker")
    print(f"knee: 90% of the best throughput ({best:.1f} requests/s) from {workers} on")
