"""The `mmworker` command line: argument parsing and dispatch to the subcommands."""

import argparse
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmworker", description="Qwen-VL image preprocessing for SGLang.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="decode, hash and resize one image, with timings")
    demo.add_argument("source", nargs="?", help="image path, file:// or http(s) URL, data: URL or base64")
    demo.add_argument("--size", type=int, nargs=2, metavar=("W", "H"), help="resize target (default ~2x)")
    demo.set_defaults(run=_demo)
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
