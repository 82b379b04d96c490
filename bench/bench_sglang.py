"""Benchmark: SGLang's own Qwen-VL processor against the mmworker plug-in, inside SGLang's environment.

    bash scripts/setup_sglang.sh && .venv-sglang/bin/python bench/bench_sglang.py [--rounds 5] [--json out.json]

The same request streams go through SGLang 0.5.23's built-in `QwenVLImageProcessor` (its default
executor: two processor threads for Qwen-VL and its I/O threads; CPU device, one torch thread) and
through the class SGLang picks with SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE=mmworker.sglang (its
automatic worker plan), each built as the TokenizerManager builds it (default arguments, Qwen2.5-VL,
the torchvision image processor with the released checkpoint's settings). Each measurement is a
fresh process pinned to the same CPUs (all of this machine's), which warms up, then keeps
`--in-flight` requests of one image each in flight on its asyncio loop (a closed loop, as a busy
server) for `--requests` requests, and reports images/s, latency p50/p99 and the CPU time of the
event-loop thread per request (`time.thread_time` on that thread: the TokenizerManager's loop,
where SGLang's tokenisation, every other request's handling and our hand-off share one core).
Streams: 720p JPEGs (distinct images), and bench_preprocess's mix (640x480, 720p, 1080p and 12 MP
JPEG, 720p PNG, in turn). Rounds alternate the two implementations; the result per figure is the
median over rounds with its range, and the plug-in/built-in ratio per round.

Targets (the SGLang plug-in issue): throughput >= 2.5x the built-in at equal cores; event-loop CPU
per request <= 0.5 ms.
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from yardstick import percentile

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TESTS = ROOT / "tests" / "sglang_env"
MODEL = "qwen2_5_vl"
STREAMS = {
    "720p": [(1280, 720, "JPEG")],
    "mix": [(640, 480, "JPEG"), (1280, 720, "JPEG"), (1920, 1080, "JPEG"), (4032, 3024, "JPEG"), (1280, 720, "PNG")],
}
TARGET_THROUGHPUT, TARGET_LOOP_CPU_MS = 2.5, 0.5


def child(kind: str, stream: str, requests: int, in_flight: int) -> dict:
    """One measurement in this process: build the processor, warm up, run the stream, return figures."""
    sys.path[:0] = [str(TESTS), str(ROOT / "tests")]
    import torch

    torch.set_num_threads(1)
    import plugin_env as env  # SGLang's builders; stubs sgl_kernel (no CPU build)

    from mmworker.corpus import encode, photo_like

    # SGLang's default worker count (the model's own); no preprocess cache on either side (SGLang's is
    # off by default for Qwen; the flag turns the plug-in's off too): the images go round in turn, and
    # the processing is what is compared (bench_cache measures the cache).
    args = env.server_args(mm_processor_worker_num=0, mm_preprocess_cache_size_mb=0)
    cls = env.builtin_class(MODEL) if kind == "builtin" else env.plugin_class(MODEL)
    processor = cls(env.hf_config(MODEL), args, env.hf_processor(MODEL, "torchvision"), "default")
    # Distinct images (a cache anywhere would otherwise flatter): 16 per shape, used in turn.
    images = [encode(photo_like(w, h, seed=k), fmt) for k in range(16) for (w, h, fmt) in STREAMS[stream]]
    text = env.prompt(1)

    async def one(k: int) -> float:
        t0 = time.perf_counter()
        out = await processor.process_mm_data_async(
            image_data=[images[k % len(images)]], input_text=text, request_obj=env.Request(rid=str(k))
        )
        del out  # as the TokenizerManager does once it has sent the request on
        return time.perf_counter() - t0

    async def closed_loop(n: int) -> tuple[list[float], float, float]:
        latencies: list[float] = []
        next_k = iter(range(n))

        async def caller() -> None:
            for k in next_k:
                latencies.append(await one(k))

        cpu0, t0 = time.thread_time(), time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(in_flight)))
        return latencies, time.perf_counter() - t0, time.thread_time() - cpu0

    asyncio.run(closed_loop(max(2 * in_flight, 8)))  # warm-up: kernels, executors, caches
    latencies, wall, loop_cpu = asyncio.run(closed_loop(requests))
    stats = processor.stats() if hasattr(processor, "stats") else {}
    processor.shutdown()
    return {
        "kind": kind,
        "stream": stream,
        "requests": requests,
        "images_per_s": requests / wall,
        "p50_ms": 1e3 * percentile(latencies, 0.5),
        "p99_ms": 1e3 * percentile(latencies, 0.99),
        "loop_cpu_ms_per_request": 1e3 * loop_cpu / requests,
        "served": stats.get("served"),
        "delegated": stats.get("delegated"),
    }


def measure(kind: str, stream: str, requests: int, in_flight: int) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", kind, "--stream", stream, "--requests", str(requests),
         "--in-flight", str(in_flight)],
        capture_output=True, text=True, timeout=1800, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"{kind} {stream} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=160)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--streams", default=",".join(STREAMS))
    parser.add_argument("--json", help="write every round's figures here")
    parser.add_argument("--child", choices=("builtin", "plugin"), help=argparse.SUPPRESS)
    parser.add_argument("--stream", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        print(json.dumps(child(opts.child, opts.stream, opts.requests, opts.in_flight)), flush=True)
        return 0
    cpus = sorted(os.sched_getaffinity(0))
    print(f"bench_sglang: {opts.rounds} rounds x {opts.requests} requests, {opts.in_flight} in flight, CPUs {cpus}")
    rows, verdicts, report = [], [], {}
    for stream in opts.streams.split(","):
        runs: dict[str, list[dict]] = {"builtin": [], "plugin": []}
        for r in range(opts.rounds):
            for kind in ("builtin", "plugin") if r % 2 == 0 else ("plugin", "builtin"):
                runs[kind].append(measure(kind, stream, opts.requests, opts.in_flight))
        ratios = [p["images_per_s"] / b["images_per_s"] for p, b in zip(runs["plugin"], runs["builtin"], strict=True)]
        for kind in ("builtin", "plugin"):
            figures = ("images_per_s", "p50_ms", "p99_ms", "loop_cpu_ms_per_request")
            rows.append((stream, kind, *(summary([x[f] for x in runs[kind]]) for f in figures)))
        loop_cpu = statistics.median(x["loop_cpu_ms_per_request"] for x in runs["plugin"])
        ratio = statistics.median(ratios)
        verdicts.append(f"{stream}: throughput plug-in/built-in {summary(ratios)}x (target >= {TARGET_THROUGHPUT}x: "
                        f"{'PASS' if ratio >= TARGET_THROUGHPUT else 'MISS'}); plug-in event-loop CPU "
                        f"{loop_cpu:.3f} ms/request (target <= {TARGET_LOOP_CPU_MS}: "
                        f"{'PASS' if loop_cpu <= TARGET_LOOP_CPU_MS else 'MISS'})")  # fmt: skip
        served = {x["served"] for x in runs["plugin"]}
        if served != {opts.requests + max(2 * opts.in_flight, 8)}:
            verdicts.append(f"{stream}: WARNING the plug-in did not serve every request itself: {served}")
        report[stream] = runs
    print("\n| stream | processor | images/s | latency p50 ms | p99 ms | event-loop CPU ms/request |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print("\nmedian (range) over rounds\n" + "\n".join(verdicts))
    if opts.json:
        Path(opts.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
