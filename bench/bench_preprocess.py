"""Benchmark of bytes -> pixel_values per image: mmworker vs Hugging Face (both processors) vs the Rust crate.

One process per implementation family, one thread each, pinned to one CPU, allocator tuned, the
same encoded images. Two protocols, measured in the same rounds, the result of each the median
over rounds (with the range) of its per-round medians:
- warm: for each image in turn, all implementations, the one in another process too, are called
  in turn, each timed call right after an untimed one of the same implementation on the same image
  (yardstick.interleaved_medians): the input bytes, the output buffer and the code are in cache as
  far as they fit, as for a worker given the same image twice;
- cold-cache: every implementation on every image, once per cycle, interleaved call by call so that
  each timed call follows a call of another implementation (another library: mmworker's two modes
  share their code, as do the Rust crate's) on another image, with no untimed call before it
  (yardstick.cold_medians): the caches hold what another image's processing left, as for a pool
  worker whose previous call was another image and whose core other processes share. The floors
  are not in it (their calls leave the caches as they found them, so they are no implementation's
  previous call).
The speed-ups are per round (each implementation's time over ours, both from that round), and each
target is judged on the median over rounds of its per-round figure. The implementations:
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
The yardsticks are looked for under --ref-root (default $MMWORKER_REF_ROOT, else this checkout),
where the scripts that build them put them: a git worktree of this repository can use those built
in the main tree. A yardstick that is not installed is named at the start, with what installs it;
its column is left out and its targets count as MISS. Also, warm only: the floor (decode alone +
one write of the output, with non-temporal stores as the kernel writes it, into one of four buffers
in turn so that it is not in cache: a ring slot never is) and peak RSS per image in a fresh process.
How long other processes ran on the measuring CPU meanwhile (its busy time less the measuring
processes' CPU time) is printed with the tables: others on that CPU (a test suite's pool workers
pin themselves there) take time slices out of the timed calls, more often out of the long ones,
which leans the ratios towards the faster implementation; a run where they took more than a few
percent is to be judged so. --json writes per protocol, case and implementation the median,
range and per-round ms, the seconds measured and taken by others, and the targets.

    .venv/bin/python bench/bench_preprocess.py [--rounds 5] [--ref-root DIR] [--json out.json]
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
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
from yardstick import (
    GET_REF_EXT,
    REF_ROOT_ENV,
    cold_medians,
    cpu_busy_s,
    interleaved_medians,
    load_reference_extension,
    local_timer,
    process_cpu_s,
    ref_root,
)

REF_PYTHON = Path(".venv-ref") / "bin" / "python"  # under the yardsticks' root (--ref-root)
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
WARM, COLD = "warm", "cold-cache"
PROTOCOLS = {
    WARM: "each timed call right after an untimed one of the same implementation on the same image",
    COLD: "implementations and images interleaved, each timed call after another implementation's on another image",
}
CELL = 23  # a table cell: "112.07 (101.60-116.60)"

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


def start_torchvision(spec: dict, cpu: int, python: Path) -> subprocess.Popen | None:
    """The torchvision processor in the reference venv's `python`, pinned to our CPU, measuring on request."""
    if not python.exists():
        return None
    proc = subprocess.Popen(
        ["taskset", "-c", str(cpu), str(python), "-c", TORCHVISION_WORKER, json.dumps(spec)],
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
    parser.add_argument(
        "--ref-root", type=Path, default=ref_root(),
        help=f"the checkout whose scripts built the yardsticks (.cache/ref_ext, .venv-ref); default ${REF_ROOT_ENV}, "
        "else this one",
    )  # fmt: skip
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
    rust = load_reference_extension(args.ref_root)
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

    torchvision = start_torchvision(spec, cpu, args.ref_root / REF_PYTHON)
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
    if missing:
        print(f"(yardsticks looked for under {args.ref_root}: --ref-root or ${REF_ROOT_ENV})", file=sys.stderr)
    warm_timers = {}  # case -> {implementation or floor: timer}
    output_mb = {}
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
        warm_timers[key] = {name: local_timer(fn) for name, fn in impls.items()}
        if torchvision is not None:
            warm_timers[key]["HF torchvision (1 thread)"] = torchvision_timer(torchvision, path)
        output_mb[key] = pv.nbytes / 1e6
    # The cold-cache schedule times the implementations only: a floor's call is no implementation's
    # previous call (the write floor's non-temporal stores leave the caches as they were).
    cold_timers = {
        (name, key): timer
        for key, timers in warm_timers.items()
        for name, timer in timers.items()
        if not name.startswith("floor")
    }
    names = {name for name, _ in cold_timers}
    # Calls must follow another library's; with no yardstick here only mmworker's two modes are left to alternate.
    apart = family if len({family(n) for n in names}) > 1 else lambda name: name
    samples = {WARM: {key: {name: [] for name in timers} for key, timers in warm_timers.items()}}
    samples[COLD] = {key: {name: [] for name in timers if name in names} for key, timers in warm_timers.items()}
    # What other processes take of our CPU while we measure: its busy time less ours and torchvision's.
    ours = [os.getpid()] + ([torchvision.pid] if torchvision is not None else [])
    started, foreign = time.perf_counter(), cpu_busy_s(cpu) - sum(process_cpu_s(pid) for pid in ours)
    for turn in range(args.rounds):
        # Call by call in turn, torchvision's process too: a slow second of the shared machine
        # hits every implementation, and each call follows the others' as each of theirs does.
        for key, timers in warm_timers.items():
            for name, seconds in interleaved_medians(timers, args.budget * len(timers)).items():
                samples[WARM][key][name].append(seconds * 1e3)
        # The same round, cold: every implementation on every image, each call after another's.
        cold = cold_medians(cold_timers, args.budget * len(cold_timers), min_calls=5, family=apart, seed=turn)
        for (name, key), seconds in cold.items():
            samples[COLD][key][name].append(seconds * 1e3)
        print(f"round {turn + 1} of {args.rounds} measured", file=sys.stderr)
    measuring = time.perf_counter() - started
    foreign = cpu_busy_s(cpu) - sum(process_cpu_s(pid) for pid in ours) - foreign
    if torchvision is not None:
        torchvision.stdin.close()
        torchvision.wait()

    rss = {}
    for key, (_, path) in images.items():
        measured = subprocess.run(
            [sys.executable, "-c", RSS_WORKER, SPEC_NAME, str(MAX_PIXELS), "aten_u8", str(path), key[1]],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        peak, nbytes = (int(v) for v in measured.stdout.split())
        rss[key] = peak / nbytes

    print(f"\nbytes -> pixel_values, ms per image ({SPEC_NAME}, max_pixels {MAX_PIXELS}, 1 thread, CPU {cpu}),")
    print(f"median over {args.rounds} rounds (range); other processes ran on CPU {cpu} for {foreign:.1f} s of the")
    print(f"{measuring:.0f} s measured ({100 * foreign / measuring:.0f}%: time they took from the timed calls)")
    verdicts: list[tuple[str, float | None, bool]] = []
    for protocol in PROTOCOLS:
        verdicts += report(protocol, samples[protocol], missing)
    print(f"\n{'output MB':<28}" + "".join(f"{output_mb[k]:>{CELL}.1f}" for k in images))
    print(f"{'peak RSS / output':<28}" + "".join(f"{rss[k]:>{CELL}.2f}" for k in images))
    worst_rss = max(rss.values())
    verdicts.append(("peak RSS per image <= 1.5x output", worst_rss, worst_rss <= 1.5))
    print()
    for text, value, ok in verdicts:
        measured = f"{value:.2f} {'PASS' if ok else 'MISS'}" if value is not None else "not measured, MISS"
        print(f"target {text}: {measured}")
    for name, how in missing.items():
        print(f"(yardstick missing: {name}; get it with {how})")
    if args.json:
        out = {
            "rounds": args.rounds,
            "seconds measuring": measuring,
            "seconds others ran on the CPU": foreign,
            "ms": {
                protocol: {case_name(k): {n: spread(v) for n, v in by_name.items()} for k, by_name in cases.items()}
                for protocol, cases in samples.items()
            },
            "output MB": {case_name(k): v for k, v in output_mb.items()},
            "peak RSS / output": {case_name(k): v for k, v in rss.items()},
            "targets": [{"target": t, "value": v, "pass": ok} for t, v, ok in verdicts],
        }
        args.json.write_text(json.dumps(out, indent=2))
    tmp_dir.cleanup()
    return 0 if all(ok for *_, ok in verdicts) else 1


def family(name: str) -> str:
    """What a cold call's predecessor must differ in (yardstick.cold_medians): a library's modes share its code."""
    return name.split()[0] if name.startswith(("mmworker", "Rust")) else name


def case_name(key: tuple) -> str:
    return f"{key[0]} {key[1]}"


def spread(values: list) -> dict:
    """Median and range over rounds, with the rounds' values."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "rounds": values}


def cell(values: list, suffix: str = "") -> str:
    """'median (min-max)' of a value per round."""
    return f"{statistics.median(values):.2f}{suffix} ({min(values):.2f}-{max(values):.2f})"


def report(protocol: str, samples: dict, missing: dict) -> list:
    """Print one protocol's table of ms, speed-ups and targets (each a median over rounds of the
    round's figure, with the range); return its verdicts (text, median or None, passed)."""
    cases = list(samples)
    names = list(samples[cases[0]])
    print(f"\n{protocol} protocol: {PROTOCOLS[protocol]}")
    print(f"{'implementation':<28}" + "".join(f"{case_name(k):>{CELL}}" for k in cases))
    for name in names:
        print(f"{name:<28}" + "".join(f"{cell(samples[k][name]):>{CELL}}" for k in cases))

    rounds = range(len(samples[cases[0]]["mmworker aten_u8"]))
    others = [n for n in names if not n.startswith(("mmworker", "floor"))]
    # Per round, the other's time over ours, both from that round: {other: {case: [ratio per round]}}.
    ratios = {
        o: {k: [samples[k][o][r] / samples[k]["mmworker aten_u8"][r] for r in rounds] for k in cases} for o in others
    }
    print("speed-up of mmworker aten_u8 over (per round, then median and range):")
    for other in others:
        print(f"  {other:<26}" + "".join(f"{cell(ratios[other][k], 'x'):>{CELL}}" for k in cases))
    if "floor: decode" in names:
        floor = ("floor: decode", "floor: write")
        over = {
            k: [samples[k]["mmworker aten_u8"][r] - sum(samples[k][f][r] for f in floor) for r in rounds] for k in cases
        }
        print(f"  {'(ms above the floor)':<26}" + "".join(f"{cell(over[k]):>{CELL}}" for k in cases))

    jpegs = [k for k in cases if k[1] == "JPEG"]

    def geomean(other: str) -> list:
        """Per round, the geometric mean of the speed-ups over `other` on the JPEG sizes."""
        return [math.exp(statistics.mean(math.log(ratios[other][k][r]) for k in jpegs)) for r in rounds]

    def least(other: str, among: list) -> list:
        """Per round, the smallest speed-up over `other` among the cases `among`."""
        return [min(ratios[other][k][r] for k in among) for r in rounds]

    rust, tv = "Rust aten_u8", "HF torchvision (1 thread)"
    # (target, the yardstick it needs, its value per round, the least that passes; 0: a figure, no target)
    targets = [
        ("vs Rust, geometric mean over JPEG sizes >= 3x", rust, lambda: geomean(rust), 3),
        ("vs Rust, every JPEG size >= 2x", rust, lambda: least(rust, jpegs), 2),
        ("vs Rust, 1280x720 PNG not slower (>= 1x)", rust, lambda: ratios[rust][("1280x720", "PNG")], 1),
        ("vs torchvision processor, geometric mean over JPEG sizes", tv, lambda: geomean(tv), 0),
        ("vs torchvision processor, every case >= 2.5x", tv, lambda: least(tv, cases), 2.5),
    ]
    verdicts = []
    for text, needs, values_of, at_least in targets:
        if needs in missing:
            if at_least:
                verdicts.append((f"{protocol}: {text} ({needs} missing)", None, False))
            continue
        values = values_of()
        print(f"  {text}: {cell(values, 'x')}")
        if at_least:
            median = statistics.median(values)
            verdicts.append((f"{protocol}: {text}", median, median >= at_least))
    return verdicts


if __name__ == "__main__":
    sys.exit(main())
