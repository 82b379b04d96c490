"""The `mmworker` command line: argument parsing, the checks every subcommand shares, and dispatch.

A mistake on the command line (a missing file, a value that is not a number, an output directory
that does not exist) ends in one line on stderr, "mmworker: error: ...", and exit status 2, found
before any work starts; Ctrl-C ends a command with status 130 (the load test first prints what it
measured). Errors in the requests themselves are reported the same way (one line, status 2).
"""

import argparse
import json
import os
import sys
import time
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from mmworker.errors import MmError

if TYPE_CHECKING:  # the families pull in numba: `mmworker --version` need not wait for it
    from mmworker.pipeline import Family

SAMPLE_IMAGE = "sample.jpg"
# The exit status of a command stopped by SIGINT (128 + 2), as shells report it.
EXIT_INTERRUPTED = 130
# Sources the media layer reads as they are; anything else on a command line may be a relative path.
_AS_GIVEN = ("http://", "https://", "file://", "data:", "/")


def media_source(index: int, text: str, what: str = "image") -> str:
    """A command-line image argument (or, with `what` "video", a video's) as a source the media layer takes.

    The library reads anything that is not a URL or an absolute path as base64 (sglang-mm's rule),
    so a relative path would fail as "base64 decode: Invalid symbol ..." On a command line a
    relative path is what a user means: an existing file becomes its absolute path, and an argument
    that is neither a file nor valid base64 is reported as the missing file it names.
    """
    if text.startswith(_AS_GIVEN):
        return text
    if os.path.exists(text):
        return os.path.abspath(text)
    from mmworker.common.inline import base64_decode

    try:
        base64_decode(text.strip())
    except MmError:
        raise MmError(f"{what} {index}: media fetch: {text}: No such file or directory") from None
    return text


def video_refusal(family: "Family", name: str) -> str | None:
    """Why `family` (of the spec `name`) cannot be sent videos, for a message; None if it can.

    A spec that lacks a key for videos, or an install without PyAV, says which (its capabilities'
    note); the Qwen3 specs are bundled without the timestamp table, which only the checkpoint's
    tokenizer gives: the message says how to add it.
    """
    capabilities = family.capabilities()
    if capabilities.video:
        return None
    refusal = f"spec {name} serves no videos"
    if "timestamp_table" in capabilities.note:
        return (f"{refusal}: {capabilities.note}; write the spec to a JSON file with that key added (a list of "
                f"token ids per piece) and pass it with --spec FILE")  # fmt: skip
    return f"{refusal}: {capabilities.note}" if capabilities.note else f"{refusal} ({family.describe()})"


def read_spec_file(path: str) -> dict:
    """The JSON object in a `--spec` file. A missing file, or one that holds no JSON object, is the
    user's mistake, named as such (never read as a bundled spec's name)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise MmError(f"--spec {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MmError(f"--spec {path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MmError(f"--spec {path}: not a JSON spec ({exc})") from None
    if not isinstance(spec, dict):
        raise MmError(f"--spec {path}: not a JSON spec (a JSON object is expected, not {type(spec).__name__})")
    return spec


def family_from_args(args: argparse.Namespace) -> "Family":
    """The family `--spec FILE` or `--family NAME` asks for."""
    from mmworker.registry import pipeline_from_spec

    if not args.spec:
        return pipeline_from_spec(args.family)
    spec = read_spec_file(args.spec)
    try:
        return pipeline_from_spec(spec)
    except MmError as exc:
        raise MmError(f"--spec {args.spec}: {exc}") from exc


def writable_file(option: str, path: str) -> None:
    """Refuse an output path the run could not write at its end: checked before the run, so that a
    typo does not cost the run's report."""
    target = Path(path)
    parent = target.parent
    if target.is_dir():
        raise MmError(f"{option} {path}: is a directory; give a file name")
    if not parent.is_dir():
        raise MmError(f"{option} {path}: no such directory: {parent}")
    if not os.access(parent, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise MmError(f"{option} {path}: not writable")


def _demo(args: argparse.Namespace) -> int:
    """Run the media primitives on one image (the bundled sample by default) and report each step."""
    from mmworker.common import content_hash, fetch_bytes, resize_rgb
    from mmworker.common.decode import decode_image, sniff_format
    from mmworker.common.pixels import copy_rgb
    from mmworker.common.resize import RESAMPLERS

    if args.source is None:
        label = f"bundled sample ({SAMPLE_IMAGE})"
        data = resources.files("mmworker").joinpath("data", SAMPLE_IMAGE).read_bytes()
    else:
        label = args.source
        t0 = time.perf_counter()
        data = fetch_bytes(media_source(0, args.source))
        print(f"fetched {len(data)} bytes in {(time.perf_counter() - t0) * 1e3:.2f} ms")

    def timed(fn):
        fn()  # first call compiles or loads the numba kernels; report the steady state
        t0 = time.perf_counter()
        result = fn()
        return result, (time.perf_counter() - t0) * 1e3

    print(f"source      {label}: {sniff_format(data)}, {len(data)} bytes")
    digest, ms = timed(lambda: content_hash(data))
    print(f"hash        {digest:#018x} (blake3 u64)           {ms:8.3f} ms")
    image, ms = timed(lambda: decode_image(data))
    print(f"decode      {image.width}x{image.height} RGB                       {ms:8.3f} ms")
    rgb = copy_rgb(image.pixels)
    out_w, out_h = args.size if args.size else (image.width * 2 + 3, image.height * 2 - 5)
    for resample in RESAMPLERS:
        out, ms = timed(lambda r=resample: resize_rgb(rgb, out_w, out_h, r))
        print(f"resize      {resample:<12} -> {out_w}x{out_h}  blake3 {content_hash(out):#018x} {ms:8.3f} ms")
    return 0


class _ItemClock:
    """When the driver reaches each item and then the prompt, for the time each item took (its hash,
    decode and the family's work): the driver asks for item k's allocator just before item k's hash,
    and lays out the prompt after the last item, so item k's time runs from its allocator to the
    next item's, or to the layout. A stand-in for the family that passes everything on."""

    def __init__(self, family: "Family") -> None:
        self._family = family
        self.marks: list[float] = []  # per item, then the layout: time.perf_counter() on arrival

    def __getattr__(self, name: str):
        return getattr(self._family, name)

    def alloc(self, index: int):
        from mmworker.pipeline import numpy_allocator

        self.marks.append(time.perf_counter())
        return numpy_allocator

    def layout(self, input_ids, geometries):
        self.marks.append(time.perf_counter())
        return self._family.layout(input_ids, geometries)

    def item_ms(self, index: int) -> float:
        return (self.marks[index + 1] - self.marks[index]) * 1e3


def _runs_text(runs) -> str:
    """An item's placeholder runs: "at (s, e)" for one, else their count, first and last."""
    if len(runs) == 1:
        return f"at {tuple(runs[0])}"
    return f"in {len(runs)} runs, first {tuple(runs[0])}, last {tuple(runs[-1])}"


def _timing_text(geometry) -> str:
    """A video's timing as its family's prompt uses it: Qwen2.5-VL's seconds per temporal patch,
    Qwen3's timestamps."""
    parts = []
    if geometry.second_per_grid is not None:
        parts.append(f"second_per_grid {geometry.second_per_grid:.6g} s")
    stamps = geometry.timestamps
    if stamps:
        shown = ", ".join(f"{t:.1f}" for t in stamps) if len(stamps) <= 6 else (
            f"{', '.join(f'{t:.1f}' for t in stamps[:3])}, ..., {stamps[-1]:.1f}")  # fmt: skip
        parts.append(f"timestamps {shown} s ({len(stamps)}, one per temporal patch)")
    return "; ".join(parts) or "no timing (this model's positions do not use it)"


def _process(args: argparse.Namespace) -> int:
    """Run one request through the driver and describe what the scheduler would receive."""
    from mmworker.common.fetch import fetch_bytes
    from mmworker.driver import MmInput, item_name, process
    from mmworker.pipeline import MRope, VideoGrid

    if not args.sources and not args.videos:
        raise MmError("process: give at least one image, or a video with --video")
    family = family_from_args(args)
    if args.videos:
        refusal = video_refusal(family, args.spec or args.family)
        if refusal:
            raise MmError(f"--video: {refusal}")
    sources = [media_source(i, s) for i, s in enumerate(args.sources)]
    videos = [media_source(i, s, "video") for i, s in enumerate(args.videos)]
    # By default the prompt is the family's tokens for one image, once per image, then for one video, once per video.
    ids = args.prompt_ids
    if ids is None:
        ids = list(family.image_prompt()) * len(sources) + (list(family.video_prompt()) * len(videos) if videos else [])
    fetched = [0.0]

    def timed_fetch(*fetch_args, **kwargs):
        t = time.perf_counter()
        try:
            return fetch_bytes(*fetch_args, **kwargs)
        finally:
            fetched[0] += time.perf_counter() - t

    clock = _ItemClock(family)
    t0 = time.perf_counter()
    out = process(clock, MmInput(ids, sources, videos), item_alloc=clock.alloc, fetch=timed_fetch)
    elapsed = (time.perf_counter() - t0) * 1e3
    print(f"spec {args.spec or args.family}: {family.describe()}")
    for i, (item, runs) in enumerate(zip(out.items, out.runs, strict=True)):
        g = item.geometry
        grid = f"grid {g.t}x{g.h}x{g.w}, " if g is not None else ""
        tokens = sum(end - start + 1 for start, end in runs)
        print(f"{item_name(i, len(sources))}: {grid}{tokens} tokens {_runs_text(runs)}, hash {item.hash:#018x}, "
              f"feature {item.feature.dtype}{list(item.feature.shape)}, {clock.item_ms(i):.1f} ms")  # fmt: skip
        if isinstance(g, VideoGrid):
            print(f"  {_timing_text(g)}")
    positions = f"M-RoPE delta {out.positions.delta}" if isinstance(out.positions, MRope) else "1-D positions"
    fetch = f" (fetching {fetched[0] * 1e3:.1f} ms)" if fetched[0] else ""
    print(f"prompt {len(ids)} -> {len(out.input_ids)} token(s), {positions}, {elapsed:.1f} ms{fetch}")
    return 0


def _plan(args: argparse.Namespace) -> int:
    """Print the core map a pool with this configuration would use here."""
    from mmworker.pool.config import PoolConfig

    config = PoolConfig.from_any(args.config)
    allowed = sorted(os.sched_getaffinity(0))
    print(f"this process may run on {len(allowed)} CPU(s): {allowed}")
    plan = config.plan()
    print(plan.describe())
    if plan.worker_sched == "idle":
        how = "SCHED_IDLE (they run only while no ordinary task wants their core)"
    else:
        how = f"ordinary tasks, {config.worker_nice} nicer than this process"
    if config.worker_sched == "auto":
        why = "this process has CPUs without a worker" if plan.own_cpus else "workers are on every CPU of this process"
        how += f'; worker_sched "auto" chose this: {why}'
    print(f"workers: {how}")
    print(f"ring per worker: {config.ring_mib} MiB; queue depth {config.queue_depth}; deadline {config.deadline_s:g} s")
    return 0


def _loadtest(args: argparse.Namespace) -> int:
    from mmworker.loadtest.app import check, run
    from mmworker.runtime import reexec_tuned

    options = check(args)  # a mistake is reported before the re-execution below costs a second start
    reexec_tuned()  # the in-process comparisons must run under the workers' allocator settings
    return run(args, options)


def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.replace(",", " ").split()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas or spaces: {exc}") from exc


def family_help() -> str:
    """The --family option's help: the bundled spec names."""
    from mmworker.registry import NAMED_SPECS

    return f"bundled spec: {', '.join(NAMED_SPECS)} (default %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    from mmworker import __version__

    parser = argparse.ArgumentParser(prog="mmworker", description="Image preprocessing for SGLang, as a worker pool.")
    parser.add_argument("--version", action="version", version=f"mmworker {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="decode, hash and resize one image, with timings")
    demo.add_argument("source", nargs="?", help="image path, file:// or http(s) URL, data: URL or base64")
    demo.add_argument("--size", type=int, nargs=2, metavar=("W", "H"), help="resize target (default ~2x)")
    demo.set_defaults(run=_demo)

    proc = sub.add_parser("process", help="preprocess one request (images, videos, prompt ids) and describe it")
    proc.add_argument("sources", nargs="*", metavar="IMAGE_OR_URL", help="path, URL, data: URL or base64")
    proc.add_argument("--video", dest="videos", action="append", default=[], metavar="VIDEO_OR_URL",
                      help="a video: path, URL, data: URL or base64 (repeatable; needs a spec that serves videos, "
                           "e.g. qwen2_vl or qwen2_5_vl)")  # fmt: skip
    which = proc.add_mutually_exclusive_group()
    which.add_argument("--family", default="qwen2_vl", help=family_help())
    which.add_argument("--spec", help='JSON spec file (a spec object, with its "family")')
    proc.add_argument("--prompt-ids", type=_int_list,
                      help="prompt token ids (default: the family's tokens for one image, once per image, then "
                           "for one video, once per video)")  # fmt: skip
    proc.set_defaults(run=_process)

    load = sub.add_parser(
        "loadtest",
        help="drive a worker pool with a realistic request mix and report throughput, latency and correctness",
        description="Start a WorkerPool, a built-in corpus and a local media server, drive the pool, and report.",
        epilog="Exit status: 0 PASS, 1 FAIL (something lost, duplicated, corrupted or wrongly judged), 2 a mistake "
        "in the options (found before anything starts), 130 Ctrl-C (after the report of what ran).",
    )
    from mmworker.loadtest.app import add_arguments

    add_arguments(load)
    load.set_defaults(run=_loadtest)

    plan = sub.add_parser("plan", help="print the core map a pool configuration would use on this machine")
    plan.add_argument("--config", help="pool configuration (TOML); default: all defaults")
    plan.set_defaults(run=_plan)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command `argv` (default: sys.argv) asks for; returns its exit status: 0 done, 1 a
    load test whose verdict is FAIL, 2 a mistake in the command or a rejected request, 130 Ctrl-C."""
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except MmError as exc:
        print(f"mmworker: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Commands without work to report (demo, process, plan) just stop; the load test handles
        # SIGINT itself and reports what it measured.
        print("mmworker: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
