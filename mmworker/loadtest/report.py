"""The load test's report: figures from the tally, the terminal table, the JSON document, the plot, the verdict.

JSON schema (version 1), all times in ms unless named *_s:
    machine {cpus, allowed_cpus, cpu_model, python, pillow, numpy, kernel}
    config  {...the run's options...}
    duration_s, measured_s
    requests {submitted, answered, accepted, rejected, lost, duplicated, warmup, expected_bad,
              bad_accepted, bad_wrong_reason, good_rejected}
    throughput {requests_per_s, images_per_s}
    latency_ms {mean, p50, p90, p99, p99.9, max} (percentiles within 0.05%: mmworker.loadtest.tally)
    latency_parts_ms {queued, to_worker, busy, returned: {mean, p50, ...}}: the latency of every
        accepted request is the sum of its four parts (mmworker.pool.Reply), so the means add up
    workers [{index, pid, cpu_utilisation, requests, images}]
    client {cpu_utilisation, cpu_ms_per_request, peak_rss_mb (private), peak_rss_incl_shared_mb}
    shm {ring_mib, peak_held_mb}
    rejects_by_reason {reason: count}
    verify {checked, mismatches}
    restarts, chaos_kills
    rss_mb {samples [[s, MB]], peak, and for runs >= 3 min: second_minute_mean, last_minute_mean, growth_pct}
    inline (with --compare-inline) {requests, requests_per_s, pool_speedup}
    ok, failures [...]
"""

import os
import platform
import resource

import numpy as np
from PIL import Image, ImageDraw

from mmworker.loadtest.runner import RunResult
from mmworker.loadtest.tally import LATENCY_PARTS

REPORT_VERSION = 1


def machine_info() -> dict:
    import numpy
    import PIL

    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(), "allowed_cpus": sorted(os.sched_getaffinity(0)), "cpu_model": model,
        "python": platform.python_version(), "pillow": PIL.__version__, "numpy": numpy.__version__,
        "kernel": platform.release(),
    }  # fmt: skip


def build_report(result: RunResult, *, config: dict, pool_stats, worker_pids: list[int], ring_mib: int,
                 mismatches: list[int], inline: dict | None) -> dict:  # fmt: skip
    tally = result.tally
    measured_s = max(1e-9, result.ended - result.measured_from)
    wall = max(1e-9, result.ended - result.started)
    failures = []
    if tally.lost:
        failures.append(f"{tally.lost} request(s) lost (submitted, never answered)")
    if result.duplicates:
        failures.append(f"{result.duplicates} duplicated answer(s)")
    if mismatches:
        failures.append(f"{len(mismatches)} verified request(s) differ from in-process results: {mismatches[:5]}")
    if tally.bad_accepted_count:
        failures.append(f"{tally.bad_accepted_count} expected-bad request(s) accepted: {tally.bad_accepted}")
    if tally.bad_wrong_count:
        failures.append(f"{tally.bad_wrong_count} bad request(s) rejected for the wrong reason: "
                        f"{tally.bad_wrong[:3]}")  # fmt: skip
    report = {
        "version": REPORT_VERSION,
        "machine": machine_info(),
        "config": config,
        "duration_s": wall,
        "measured_s": measured_s,
        "requests": {
            "submitted": tally.submitted,
            "answered": tally.answered,
            "accepted": tally.accepted,
            "rejected": tally.rejected,
            "lost": tally.lost,
            "duplicated": result.duplicates,
            "warmup": tally.warmup,
            "expected_bad": tally.expected_bad,
            "bad_accepted": tally.bad_accepted_count,
            "bad_wrong_reason": tally.bad_wrong_count,
            "good_rejected": tally.good_rejected,
        },
        "throughput": {
            "requests_per_s": tally.measured_accepted / measured_s,
            "images_per_s": tally.measured_images / measured_s,
        },
        "latency_ms": tally.latency.summary(),
        "latency_parts_ms": {name: tally.parts[name].summary() for name in LATENCY_PARTS},
        "workers": [
            {
                "index": k,
                "pid": pid,
                "cpu_utilisation": result.worker_cpu_s.get(k, 0.0) / wall,
                "requests": tally.per_worker.get(k, 0),
                "images": tally.per_worker_images.get(k, 0),
            }
            for k, pid in enumerate(worker_pids)
        ],
        "client": {
            "cpu_utilisation": result.cpu_s / wall,
            "cpu_ms_per_request": result.cpu_s / max(1, tally.answered) * 1e3,
            # Private memory (RssAnon); ru_maxrss would also count the mapped rings' shared pages.
            "peak_rss_mb": max((c for _, c, _ in result.rss), default=0.0),
            "peak_rss_incl_shared_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        },
        "shm": {"ring_mib": ring_mib, "peak_held_mb": pool_stats.shm_peak_held_bytes / 2**20},
        "rejects_by_reason": dict(tally.rejects_by_reason.most_common()),
        "verify": {"checked": len(result.verify), "mismatches": len(mismatches)},
        "restarts": pool_stats.restarts,
        "chaos_kills": result.kills,
        "rss_mb": _rss_summary(result),
        "ok": not failures,
        "failures": failures,
    }
    if inline is not None:
        report["inline"] = inline
    return report


def _rss_summary(result: RunResult) -> dict:
    """Client + worker private RSS (RssAnon) over the run; growth compares the second minute with the last.

    Growth is given for the sum and for client and workers apart: a leak in the client (the scheduler's
    process) matters differently from one in workers, which the pool replaces anyway.
    """
    samples = [(t, c + w) for t, c, w in result.rss]
    out: dict = {
        "samples": [[round(t, 1), round(m, 1)] for t, m in samples],
        "peak": max((m for _, m in samples), default=0),
    }
    end = samples[-1][0] if samples else 0
    if end >= 180:
        second = [(c, w) for t, c, w in result.rss if 60 <= t < 120]
        last = [(c, w) for t, c, w in result.rss if t >= end - 60]
        for name, part in (("", lambda c, w: c + w), ("client_", lambda c, w: c), ("workers_", lambda c, w: w)):
            before = sum(part(c, w) for c, w in second) / len(second)
            after = sum(part(c, w) for c, w in last) / len(last)
            out[f"{name}second_minute_mean"] = before
            out[f"{name}last_minute_mean"] = after
            out[f"{name}growth_pct"] = (after / before - 1) * 100
    return out


def print_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    r, lat, thr = report["requests"], report["latency_ms"], report["throughput"]
    table = Table(title="mmworker load test", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    cfg = report["config"]
    table.add_row("run", f"{cfg['mode']}, {report['measured_s']:.1f} s measured (+{cfg['warmup_s']:g} s warm-up), "
                         f"{cfg['workers']} workers, spec {cfg['spec_name']}")  # fmt: skip
    table.add_row("throughput", f"{thr['requests_per_s']:.1f} requests/s, {thr['images_per_s']:.1f} images/s")
    table.add_row("latency", "  ".join(f"{k} {lat[k]:.1f} ms" for k in ("p50", "p90", "p99", "p99.9", "max")))
    parts = report["latency_parts_ms"]
    table.add_row("latency parts", ", ".join(
        f"{label} {parts[name]['p50']:.2f} / {parts[name]['p99']:.2f}" for name, label in
        zip(LATENCY_PARTS, ("queued", "to the worker", "in the worker", "back"), strict=True)
    ) + " ms (p50 / p99)")  # fmt: skip
    table.add_row("requests", f"{r['submitted']} submitted, {r['answered']} answered, {r['accepted']} accepted, "
                              f"{r['rejected']} rejected ({r['expected_bad']} deliberately bad)")  # fmt: skip
    table.add_row("lost / duplicated", f"{r['lost']} / {r['duplicated']}")
    table.add_row("verified", f"{report['verify']['checked']} replies re-run in process, "
                              f"{report['verify']['mismatches']} mismatches")  # fmt: skip
    for w in report["workers"]:
        table.add_row(f"worker {w['index']}", f"CPU {w['cpu_utilisation'] * 100:.0f}%, {w['requests']} requests, "
                                              f"{w['images']} images")  # fmt: skip
    c = report["client"]
    table.add_row("client", f"CPU {c['cpu_utilisation'] * 100:.0f}% ({c['cpu_ms_per_request']:.2f} ms/request), "
                            f"peak private RSS {c['peak_rss_mb']:.0f} MB")  # fmt: skip
    table.add_row("shared memory", f"peak {report['shm']['peak_held_mb']:.1f} MB held by unreleased replies "
                                   f"(rings {report['shm']['ring_mib']} MiB per worker)")  # fmt: skip
    rejects = ", ".join(f"{k}: {v}" for k, v in report["rejects_by_reason"].items()) or "none"
    table.add_row("rejects by reason", rejects)
    restarts = f"{report['restarts']}" + (f" ({report['chaos_kills']} workers killed on purpose)"
                                          if report["chaos_kills"] else "")  # fmt: skip
    table.add_row("restarts", restarts)
    rss = report["rss_mb"]
    growth = (f", growth minute 2 -> last: {rss['growth_pct']:+.1f}% (client {rss['client_growth_pct']:+.1f}%, "
              f"workers {rss['workers_growth_pct']:+.1f}%)" if "growth_pct" in rss else "")  # fmt: skip
    table.add_row("memory", f"peak {rss['peak']:.0f} MB private RSS, client + workers{growth}")
    if "inline" in report:
        i = report["inline"]
        table.add_row("vs inline", f"{i['requests_per_s']:.1f} requests/s on one core in process: "
                                   f"the pool is {i['pool_speedup']:.2f}x")  # fmt: skip
    verdict = "[green]PASS[/green]" if report["ok"] else "[red]FAIL[/red]: " + "; ".join(report["failures"])
    table.add_row("verdict", verdict)
    console.print(table)


def plot(result: RunResult, path: str, width: int = 1200, height: int = 500) -> None:
    """PNG: latency over time (left) and a latency histogram (right). Drawn with Pillow only:
    matplotlib would pull in plain Pillow and replace pillow-simd. Both show the tally's uniform
    sample of the measured accepted requests (all of them, up to tally.PLOT_SAMPLE)."""
    points = result.tally.plot_points
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    if not len(points):
        draw.text((20, 20), "no accepted requests", fill="black")
        image.save(path)
        return
    t = points[:, 0] - (result.measured_from - result.started)
    lat = points[:, 1]
    top = float(np.percentile(lat, 99.9)) * 1.1 or 1.0
    pad, mid = 60, width // 2

    def frame(x0, x1, title, xlabel):
        draw.rectangle([x0, pad, x1, height - pad], outline="black")
        draw.text((x0, 20), title, fill="black")
        draw.text((x0 + (x1 - x0) // 2 - 40, height - pad + 25), xlabel, fill="black")

    frame(pad, mid - 20, "latency over time (ms)", "seconds after warm-up")
    span = max(float(t.max()), 1e-9)
    for ti, li in zip(t, np.minimum(lat, top), strict=True):
        x = pad + max(ti, 0.0) / span * (mid - 20 - pad)
        y = height - pad - li / top * (height - 2 * pad)
        draw.ellipse((x - 2, y - 2, x + 2, y + 2), fill=(31, 119, 180))
    draw.text((pad, height - pad + 8), "0", fill="black")
    draw.text((mid - 50, height - pad + 8), f"{span:.0f}", fill="black")
    for frac in (0, 0.5, 1.0):
        y = height - pad - frac * (height - 2 * pad)
        draw.text((5, y - 6), f"{top * frac:.0f}", fill="black")
    frame(mid + 20, width - pad, "latency histogram (count per bin)", "latency (ms)")
    counts, _edges = np.histogram(np.minimum(lat, top), bins=50, range=(0, top))
    bar_w = (width - pad - mid - 20) / len(counts)
    for k, c in enumerate(counts):
        x0 = mid + 20 + k * bar_w
        y = height - pad - c / max(1, counts.max()) * (height - 2 * pad)
        draw.rectangle([x0, y, x0 + bar_w - 1, height - pad], fill=(255, 127, 14))
    draw.text((mid + 20, height - pad + 8), "0", fill="black")
    draw.text((width - pad - 30, height - pad + 8), f"{top:.0f}", fill="black")
    image.save(path)
