"""Benchmark of the media primitives (decode, the three resamplers, hash) against the Rust crate.

Side by side in one process, one thread each, allocator tuned (mmworker.runtime), medians of
alternating rounds; the Rust extension from the sglang 0.5.23 wheel (scripts/get_reference_ext.sh)
is a yardstick only and its column is skipped when it is absent.

    .venv/bin/python bench/bench_primitives.py [--rounds 5] [--json out.json]
"""

import argparse
import json
import os
import platform
import sys
from functools import partial
from pathlib import Path

from yardstick import GET_REF_EXT, alternating_medians, load_reference_extension

# Qwen2-VL smart_resize targets (factor 28, min 3136, max 1003520) of each source size: the
# resizes the preprocessing really does (docs/benchmarks.md, "Images").
CASES = [
    ("640x480 JPEG", (640, 480), "JPEG", (644, 476)),
    ("1280x720 JPEG", (1280, 720), "JPEG", (1288, 728)),
    ("1920x1080 JPEG", (1920, 1080), "JPEG", (1316, 728)),
    ("4032x3024 JPEG", (4032, 3024), "JPEG", (1148, 840)),
    ("1280x720 PNG", (1280, 720), "PNG", (1288, 728)),
]
RESAMPLERS = ("pil_lanczos", "pil_bicubic", "aten_u8")
TARGETS = [  # (operation, case, minimum speed-up over the Rust extension)
    ("resize pil_bicubic", "1280x720 JPEG", 2.0),
    ("resize aten_u8", "1280x720 JPEG", 5.0),
]


def measure(pairs, rounds: int, budget_s: float) -> dict:
    """pairs: {name: (ours, theirs|None)} -> {name: (ours ms, theirs ms|None)}; rounds alternate."""
    fns = {}
    for name, (ours, theirs) in pairs.items():
        fns[name, "ours"] = ours
        if theirs is not None:
            fns[name, "theirs"] = theirs
    ms = alternating_medians(fns, rounds, budget_s)
    return {name: (ms[name, "ours"], ms.get((name, "theirs"))) for name in pairs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per measurement")
    parser.add_argument("--budget", type=float, default=0.15, help="seconds per round and side")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--default-alloc", action="store_true", help="keep glibc/Pillow defaults")
    args = parser.parse_args()

    if not args.default_alloc:
        from mmworker.runtime import reexec_tuned

        reexec_tuned()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    from mmworker.common import content_hash, image_decode_rgb, resize_rgb
    from mmworker.common.decode import decode_image
    from mmworker.common.float_bilinear import resize_frames
    from mmworker.corpus import encode, photo_like

    rust = load_reference_extension()
    yardstick = (
        "Rust extension (sglang 0.5.23, SGL_MM_RS_THREADS=1)"
        if rust
        else f"no Rust extension (get it with {GET_REF_EXT}; its targets count as MISS)"
    )
    print(f"mmworker vs {yardstick}")
    print(
        f"{platform.processor() or platform.machine()}, pinned to CPU {min(os.sched_getaffinity(0))}, "
        f"allocator {'default' if args.default_alloc else 'tuned'}, {args.rounds} rounds\n"
    )

    results = []
    for label, (w, h), fmt, (tw, th) in CASES:
        data = encode(photo_like(w, h, seed=1), fmt)
        _, _, rgb = image_decode_rgb(data)
        theirs = rust.common if rust else None
        pairs = {
            "decode": (partial(image_decode_rgb, data), theirs and partial(theirs.image_decode_rgb, data)),
            "decode (in place)": (partial(decode_image, data), None),
            "hash": (partial(content_hash, data), theirs and partial(theirs.content_hash, data)),
        }
        for r in RESAMPLERS:
            pairs[f"resize {r}"] = (
                partial(resize_rgb, rgb, tw, th, r),
                theirs and partial(theirs.resize_rgb, rgb, tw, th, r),
            )
        for op, (ours, theirs) in measure(pairs, args.rounds, args.budget).items():
            results.append(
                {
                    "case": f"{label} -> {tw}x{th}" if op.startswith("resize") else label,
                    "image": label,
                    "op": op,
                    "mmworker_ms": ours,
                    "rust_ms": theirs,
                    "speedup": theirs / ours if theirs else None,
                    "bytes": len(data),
                }
            )

    # The first resize of SGLang's Qwen video path (docs/behaviour.md §5.5), one 1080p frame to
    # smart_resize's 1008x560; the crate has no counterpart (SGLang runs torchvision for it).
    frame = photo_like(1920, 1080, seed=1)[None]
    out = frame[:, :560, :1008].copy()
    op = "resize f32_bilinear"
    ms = measure({op: (partial(resize_frames, frame, 560, 1008, out), None)}, args.rounds, args.budget)[op][0]
    results.append({"case": "1920x1080 frame -> 1008x560", "image": "1920x1080 frame", "op": op,
                    "mmworker_ms": ms, "rust_ms": None, "speedup": None, "bytes": frame.nbytes})  # fmt: skip

    print(f"{'operation':<20} {'image':<30} {'mmworker ms':>12} {'Rust ms':>10} {'speed-up':>9}")
    for row in results:
        rust_ms = f"{row['rust_ms']:.2f}" if row["rust_ms"] else "-"
        speedup = f"{row['speedup']:.2f}x" if row["speedup"] else "-"
        print(f"{row['op']:<20} {row['case']:<30} {row['mmworker_ms']:>12.3f} {rust_ms:>10} {speedup:>9}")

    failed = False
    print()
    for op, image, minimum in TARGETS:
        if not rust:  # unjudged is not passed
            failed = True
            print(f"target {op} on {image}: not measured, no Rust extension (need >= {minimum}x) MISS")
            continue
        row = next(r for r in results if r["op"] == op and r["image"] == image)
        ok = row["speedup"] >= minimum
        failed |= not ok
        verdict = "PASS" if ok else "MISS"
        print(f"target {op} on {image}: {row['speedup']:.2f}x (need >= {minimum}x) {verdict}")
    if args.json:
        args.json.write_text(json.dumps({"rounds": args.rounds, "results": results}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
