"""Benchmark of bytes -> pixel_values per image: mmworker vs Hugging Face (both processors) vs the Rust crate.

One process per implementation family, one thread each, pinned to one CPU, allocator tuned, the
same encoded images; in every round all implementations, the one in another process too, are
called in turn, each timed call right after an untimed one of the same implementation
(yardstick.interleaved_medians), and each round's medians are taken over those calls; the result
is the median over rounds:
- mmworker `qwen_vl.preprocess` in both modes (aten_u8, pil);
- `Qwen2VLImageProcessorPil` on pillow-simd, if transformers is installed here (`pip install
  transformers==5.24.0`, pyproject's `bench` extra; it pulls neither torch nor Pillow, where
  `pip install -e '.[bench]'` would put stock Pillow over pillow-simd for mmworker's own requirement);
- the torchvision `Qwen2VLImageProcessor` with one torch thread, run in the reference venv
  (.venv-ref, scripts/setup_reference.sh) because torchvision would replace pillow-simd here, as a
  process on the same CPU that makes and times one call when asked, so that its calls take
  their turn among the others' and find the caches as the others' calls left them, as every
  other implementation's do (timing blocks of its own back-to-back calls would not);
- the sglang 0.5.23 Rust extension's `qwen_vl.preprocess` with SGL_MM_RS_THREADS=1 (a yardstick only).
A yardstick that is not installed is named at the start, with what installs it; its column is
left out and its targets count as MISS. Also: the floor (decode alone + one write of the output,
with non-temporal stores as the kernel writes it, into one of four buffers in turn so that it is
not in cache: a ring slot never is) and peak RSS per image in a fresh process.

    .venv/bin/python bench/bench_preprocess.py [--rounds 5] [--json out.json]
"""

import argparse
import functools
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
from yardstick import GET_REF_EXT, interleaved_medians, load_reference_extension, local_timer

ROOT = Path(__file__).resolve().parent.parent
REF_PYTHON = ROOT / ".venv-ref" / "bin" / "python"
SETUP_REF = "scripts/setup_reference.sh"  # what builds it
CASES = [
    ("640x480", "JPEG"),
    ("1280x720", "JPEG"),
    ("1920x1080", "JPEG"),
    ("4032x3024", "JPEG"),
    ("1280x720", "PNG"),
]
# Qwen2-VL with the HF processor's default pixel budget (the sizes of docs/benchmarks.md, "Images").
SPEC_NAME = "qwen2_vl"
MAX_PIXELS = 1003520

TORCHVISION_WORKER = r"""
import io, json, sys, time
import torch
torch.set_num_threads(1)
from PIL import Image
from transformers import Qwen2VLImageProcessor
spec = json.loads(sys.argv[1])
proc = Qwen2VLImageProcessor(patch_size=spec["patch_size"], merge_size=spec["merge_size"],
    temporal_patch_size=spec["temporal_patch_size"], image_mean=spec["image_mean"],
    image_std=spec["image_std"],
    size={"shortest_edge": spec["min_pixels"], "longest_edge": spec["max_pixels"]})
def run(data):
    return proc(images=Image.open(io.BytesIO(data)).convert("RGB"), return_tensors="pt")["pixel_values"]
print("ready", flush=True)
encoded = {}
for line in sys.stdin:  # "<path> <warm calls>" -> seconds of one call after them: its turn in the caller's cycle
    path, warm = line.split()
    if path not in encoded:
        encoded[path] = open(path, "rb").read()
    for _ in range(int(warm)):
        run(encoded[path])
    t0 = time.perf_counter(); run(encoded[path]); print(repr(time.perf_counter() - t0), flush=True)
"""

RSS_WORKER = r"""
import sys
from mmworker.qwen_vl import preprocess
from mmworker.corpus import encode, photo_like
from mmworker.registry import named_spec
spec = named_spec(sys.argv[1]); spec["max_pixels"] = int(sys.argv[2]); spec["resample"] = sys.argv[3]
data = open(sys.argv[4], "rb").read()
preprocess(encode(photo_like(64, 48), sys.argv[5]), spec)  # imports, kernels, first-use allocations
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
before = status("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:  # "5" resets VmHWM (peak RSS) to the current RSS
    f.write("5")
pv, _ = preprocess(data, spec)
print(status("VmHWM:") - before, pv.nbytes)
"""


@functools.cache
def _stream_fill():
    """A numba kernel filling a float32 array with non-temporal stores (compiled once, on first use)."""
    from numba import njit

    from mmworker.common.stream import stream_fence, stream_out

    @njit
    def fill(out, stage):
        flat, at = out.reshape(-1), 0
        while at < flat.shape[0]:
            n = min(stage.shape[0], flat.shape[0] - at)
            stream_out(flat, at, stage, n, out.ctypes.data)
            at += n
        stream_fence()

    return fill


def write_floor(buffers: list):
    """One streaming write of the output per call, to the next of `buffers` (together larger than L3).

    The values written are random floats, as pixel_values are: some machines write zeros with
    non-temporal stores much faster, which would make this floor lower than any real output costs.
    """
    stage = np.random.default_rng(0).random(4096, dtype=np.float32)
    fill, turn = _stream_fill(), itertools.cycle(buffers)
    return lambda: fill(next(turn), stage)


def load_hf_pil(spec: dict):
    try:
        from transformers import Qwen2VLImageProcessorPil
    except ImportError:
        return None
    return Qwen2VLImageProcessorPil(
        patch_size=spec["patch_size"], merge_size=spec["merge_size"],
        temporal_patch_size=spec["temporal_patch_size"], image_mean=spec["image_mean"],
        image_std=spec["image_std"],
        size={"shortest_edge": spec["min_pixels"], "longest_edge": spec["max_pixels"]},
    )  # fmt: skip


def start_torchvision(spec: dict, cpu: int) -> subprocess.Popen | None:
    """The torchvision processor in the reference venv, pinned to our CPU, measuring on request."""
    if not REF_PYTHON.exists():
        return None
    proc = subprocess.Popen(
        ["taskset", "-c", str(cpu), str(REF_PYTHON), "-c", TORCHVISION_WORKER, json.dumps(spec)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(f"the torchvision reference process did not start ({SETUP_REF})")
    return proc


def torchvision_timer(proc: subprocess.Popen, path: Path) -> Callable[[int], float]:
    """A timer (yardstick.interleaved_medians) of the torchvision process: it makes the calls and times its own."""

    def timer(warm_calls: int) -> float:
        proc.stdin.write(f"{path} {warm_calls}\n")
        proc.stdin.flush()
        return float(proc.stdout.readline())

    return timer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=0.3, help="seconds per round and implementation")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from mmworker.runtime import reexec_tuned

    reexec_tuned()
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})

    import io

    from PIL import Image

    from mmworker.common.decode import decode_image
    from mmworker.corpus import STANDARD_SIZES, encode, photo_like
    from mmworker.qwen_vl import preprocess
    from mmworker.registry import named_spec

    spec = named_spec(SPEC_NAME)
    spec["max_pixels"] = MAX_PIXELS
    specs = {mode: {**spec, "resample": mode} for mode in ("aten_u8", "pil")}
    rust = load_reference_extension()
    hf_pil = load_hf_pil(spec)
    tmp_dir = tempfile.TemporaryDirectory(prefix="mmworker-bench-")  # encoded images, up to 12 MP
    tmp = Path(tmp_dir.name)
    images = {}
    for size, fmt in CASES:
        w, h = STANDARD_SIZES[size]
        data = encode(photo_like(w, h, seed=1), fmt)
        path = tmp / f"{size}.{fmt.lower()}"
        path.write_bytes(data)
        images[(size, fmt)] = (data, path)

    torchvision = start_torchvision(spec, cpu)
    # A yardstick that is not here leaves its column out and its targets unjudged (each a MISS):
    # say so now, with what gets it, rather than let a table without it look complete.
    missing = {
        name: how
        for name, how, here in (
            ("Rust aten_u8", GET_REF_EXT, rust is not None),
            ("HF Pil (pillow-simd)", "pip install transformers==5.24.0", hf_pil is not None),
            ("HF torchvision (1 thread)", SETUP_REF, torchvision is not None),
        )
        if not here
    }
    for name, how in missing.items():
        print(f"yardstick missing: {name}, left out (get it with {how})", file=sys.stderr)
    rows = {}
    for key, (data, path) in images.items():
        pv, _ = preprocess(data, specs["aten_u8"])
        impls = {
            "mmworker aten_u8": partial(preprocess, data, specs["aten_u8"]),
            "mmworker pil": partial(preprocess, data, specs["pil"]),
            "floor: decode": partial(decode_image, data),
            "floor: write": write_floor([np.empty_like(pv) for _ in range(4)]),
        }
        if hf_pil is not None:
            impls["HF Pil (pillow-simd)"] = lambda d=data: hf_pil(
                images=Image.open(io.BytesIO(d)).convert("RGB"), return_tensors="np"
            )
        if rust is not None:
            for mode in ("aten_u8", "pil"):
                impls[f"Rust {mode}"] = partial(rust.qwen_vl.preprocess, data, json.dumps(specs[mode]))
        timers = {name: local_timer(fn) for name, fn in impls.items()}
        if torchvision is not None:
            timers["HF torchvision (1 thread)"] = torchvision_timer(torchvision, path)
        samples = {name: [] for name in timers}
        for _ in range(args.rounds):
            # Call by call in turn, torchvision's process too: a slow second of the shared machine
            # hits every implementation, and each call follows the others' as each of theirs does.
            for name, seconds in interleaved_medians(timers, args.budget * len(timers)).items():
                samples[name].append(seconds * 1e3)
        rows[key] = {name: statistics.median(v) for name, v in samples.items()}
        rows[key]["output MB"] = pv.nbytes / 1e6
        print(f"measured {key[0]} {key[1]}", file=sys.stderr)
    if torchvision is not None:
        torchvision.stdin.close()
        torchvision.wait()

    for key, (_, path) in images.items():
        measured = subprocess.run(
            [sys.executable, "-c", RSS_WORKER, SPEC_NAME, str(MAX_PIXELS), "aten_u8", str(path), key[1]],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        peak, nbytes = (int(v) for v in measured.stdout.split())
        rows[key]["peak RSS / output"] = peak / nbytes

    names = [n for n in next(iter(rows.values())) if n not in ("output MB", "peak RSS / output")]
    print(f"\nbytes -> pixel_values, ms per image ({SPEC_NAME}, max_pixels {MAX_PIXELS}, 1 thread, CPU {cpu})")
    print(f"{'implementation':<28}" + "".join(f"{k[0] + ' ' + k[1]:>17}" for k in rows))
    for name in names:
        print(f"{name:<28}" + "".join(f"{rows[k].get(name, float('nan')):>17.2f}" for k in rows))
    print(f"{'output MB':<28}" + "".join(f"{rows[k]['output MB']:>17.1f}" for k in rows))
    print(f"{'peak RSS / output':<28}" + "".join(f"{rows[k]['peak RSS / output']:>17.2f}" for k in rows))

    def ratio(key, other, ours="mmworker aten_u8"):
        return rows[key][other] / rows[key][ours] if other in rows[key] else float("nan")

    print("\nspeed-up of mmworker aten_u8 over:")
    others = [n for n in names if not n.startswith(("mmworker", "floor"))]
    for other in others:
        print(f"  {other:<26}" + "".join(f"{ratio(k, other):>16.2f}x" for k in rows))
    over = [rows[k]["mmworker aten_u8"] - rows[k]["floor: decode"] - rows[k]["floor: write"] for k in rows]
    print(f"  {'(ms above the floor)':<26}" + "".join(f"{v:>16.2f} " for v in over))

    jpegs = [k for k in rows if k[1] == "JPEG"]
    # (target, the yardstick it needs, how to get its value, the least that passes)
    targets = [
        ("vs Rust, geometric mean over JPEG sizes >= 3x", "Rust aten_u8",
         lambda: math.exp(statistics.mean(math.log(ratio(k, "Rust aten_u8")) for k in jpegs)), 3),
        ("vs Rust, every JPEG size >= 2x", "Rust aten_u8", lambda: min(ratio(k, "Rust aten_u8") for k in jpegs), 2),
        ("vs Rust, 1280x720 PNG not slower (>= 1x)", "Rust aten_u8",
         lambda: ratio(("1280x720", "PNG"), "Rust aten_u8"), 1),
        ("vs torchvision processor, every case >= 2.5x", "HF torchvision (1 thread)",
         lambda: min(ratio(k, "HF torchvision (1 thread)") for k in rows), 2.5),
    ]  # fmt: skip
    verdicts: list[tuple[str, float | None, bool]] = []
    for text, needs, value_of, least in targets:
        if needs in missing:
            verdicts.append((f"{text} ({needs} missing)", None, False))
        else:
            value = value_of()
            verdicts.append((text, value, value >= least))
    worst_rss = max(rows[k]["peak RSS / output"] for k in rows)
    verdicts.append(("peak RSS per image <= 1.5x output", worst_rss, worst_rss <= 1.5))
    print()
    for text, value, ok in verdicts:
        measured = f"{value:.2f} {'PASS' if ok else 'MISS'}" if value is not None else "not measured, MISS"
        print(f"target {text}: {measured}")
    for name, how in missing.items():
        print(f"(yardstick missing: {name}; get it with {how})")
    if args.json:
        args.json.write_text(json.dumps({f"{k[0]} {k[1]}": v for k, v in rows.items()}, indent=2))
    tmp_dir.cleanup()
    return 0 if all(ok for *_, ok in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
