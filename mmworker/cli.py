"""The `mmworker` command line: argument parsing and dispatch to the subcommands."""

import argparse
import os
import sys
import time
from importlib import resources

from mmworker.errors import MmError

SAMPLE_IMAGE = "sample.jpg"


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
        data = fetch_bytes(args.source)
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


def _process(args: argparse.Namespace) -> int:
    """Run one request through the driver and describe what the scheduler would receive."""
    from pathlib import Path

    from mmworker.driver import MmInput, process
    from mmworker.registry import pipeline_from_spec

    family = pipeline_from_spec(Path(args.spec).read_text() if args.spec else args.family)
    token = family.spec.image_token_id
    ids = args.prompt_ids if args.prompt_ids is not None else [token] * len(args.sources)
    # The library treats anything that is not a URL or an absolute path as base64 (the crate's
    # rule); on a command line a relative path to an existing file is what the user means.
    sources = [os.path.abspath(s) if os.path.isfile(s) else s for s in args.sources]
    t0 = time.perf_counter()
    out = process(family, MmInput(ids, sources))
    elapsed = (time.perf_counter() - t0) * 1e3
    spec = family.spec
    pillow = f" (stock Pillow {spec.pillow}'s BICUBIC)" if spec.resample == "pil" else ""
    print(f"family {family.name} ({args.spec or args.family}), resample {spec.resample}{pillow}")
    for i, (item, offsets) in enumerate(zip(out.items, out.offsets, strict=True)):
        g = item.geometry
        print(f"image {i}: grid {g.t}x{g.h}x{g.w}, {offsets[1] - offsets[0] + 1} tokens at {offsets}, "
              f"hash {item.hash:#018x}, feature {item.feature.dtype}{list(item.feature.shape)}")  # fmt: skip
    delta = getattr(out.positions, "delta", None)
    print(f"prompt {len(ids)} -> {len(out.input_ids)} token(s), mrope delta {delta}, {elapsed:.1f} ms")
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
    from mmworker.loadtest.app import run
    from mmworker.runtime import reexec_tuned

    reexec_tuned()  # the in-process comparisons must run under the workers' allocator settings
    return run(args)


def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.replace(",", " ").split()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas or spaces: {exc}") from exc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmworker", description="Qwen-VL image preprocessing for SGLang.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="decode, hash and resize one image, with timings")
    demo.add_argument("source", nargs="?", help="image path, file:// or http(s) URL, data: URL or base64")
    demo.add_argument("--size", type=int, nargs=2, metavar=("W", "H"), help="resize target (default ~2x)")
    demo.set_defaults(run=_demo)

    proc = sub.add_parser("process", help="preprocess one request (images + prompt ids) and describe it")
    proc.add_argument("sources", nargs="+", metavar="IMAGE_OR_URL", help="path, URL, data: URL or base64")
    which = proc.add_mutually_exclusive_group()
    which.add_argument("--family", default="qwen2_vl", help="bundled spec name (default qwen2_vl)")
    which.add_argument("--spec", help="JSON spec file (keys of SGLang's qwen_vl spec)")
    proc.add_argument("--prompt-ids", type=_int_list, help="prompt token ids (default: one placeholder per image)")
    proc.set_defaults(run=_process)

    load = sub.add_parser(
        "loadtest",
        help="drive a worker pool with a realistic request mix and report throughput, latency and correctness",
        description="Start a WorkerPool, a built-in corpus and a local media server, drive the pool, and report.",
    )
    from mmworker.loadtest.app import add_arguments

    add_arguments(load)
    load.set_defaults(run=_loadtest)

    plan = sub.add_parser("plan", help="print the core map a pool configuration would use on this machine")
    plan.add_argument("--config", help="pool configuration (TOML); default: all defaults")
    plan.set_defaults(run=_plan)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except MmError as exc:
        print(f"mmworker: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
