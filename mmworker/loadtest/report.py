"""The load test's report: figures from the tally, the terminal table, the JSON document, the plot, the verdict.

JSON schema (version 4), all times in ms unless named *_s:
    machine {cpus, allowed_cpus, cpu_model, python, pillow, numpy, kernel}
    config  {...the run's options..., family (its description)}
    duration_s, measured_s, interrupted (Ctrl-C stopped the run: the figures are of what ran)
    requests {submitted, answered, accepted, rejected, lost, abandoned, expected_bad, bad_accepted,
              bad_wrong_reason, good_rejected, internal, duplicated}: the measured requests (those
        submitted after the warm-up), the ones the throughput, latency and per-worker figures are
        of; `duplicated` counts answers of the whole run; `abandoned`, those still in flight when
        an interrupted run stopped waiting
    warmup_requests {the same but duplicated, rejects_by_kind}: the requests submitted during the warm-up
    throughput {requests_per_s, images_per_s, videos_per_s (new in 4)}
    latency_ms {mean, p50, p90, p99, p99.9, max} (percentiles within 0.05%: mmworker.loadtest.tally)
    latency_parts_ms {queued, to_worker, busy, returned: {mean, p50, ...}}: the latency of every
        accepted request is the sum of its four parts (mmworker.pool.Reply), so the means add up
    workers [{index, pid, cpu_utilisation, requests, images, videos (new in 4)}]: requests answered
        from the cache (cache.latency_ms.all_hit) are on no worker
    cache {enabled, hits, misses, hit_rate (hits / (hits + misses); null without lookups),
           deduplicated, evictions: the pool's counters over the measured phase (from the first
               measured submission on: the warm-up's lookups left out);
           entries, bytes, capacity_bytes: at the end of the run;
           repeat_fraction (the option), good_images_sent, repeated_images: the images of the
               measured good requests as the workload sent them, and how many of them repeated an
               earlier one (bad requests' images are all fresh; "too_many" sends 65 that are never
               looked up);
           latency_ms {all_hit, others: {count, p50, p90, p99}}: accepted measured requests whose
               images all came from the cache (answered with no worker, so never one with a
               video), and the rest}
    videos (new in 4) {fraction (--video-fraction), clips (in the video corpus; 0 without videos),
           requests {the `requests` counters but duplicated}: the measured requests that carry a
               video, good or deliberately bad (video_corrupt, video_truncated), also counted in
               `requests`;
           rejects_by_kind {Outcome value: count} of those;
           videos_sent: the videos of the measured good requests, as submitted;
           latency_ms {video, image_only: {count, mean, p50, p90, p99, max}}: accepted measured
               requests with a video, and without}
    client {cpu_utilisation, cpu_ms_per_request, peak_rss_mb (private), peak_rss_incl_shared_mb}
    shm {ring_mib, peak_held_mb}
    rejects_by_kind {Outcome value (mmworker.errors.Outcome): count} of the measured requests
    verify {checked, mismatches}
    restarts, chaos_kills
    rss_mb {samples [[s, MB]], peak, and for runs >= 3 min: second_minute_mean, last_minute_mean, growth_pct}
    inline (with --compare-inline) {requests, requests_per_s, pool_speedup}
    ok, failures [...]: the verdict's checks cover the warm-up requests too

Version 4 added `videos`, `throughput.videos_per_s` and `workers[].videos`; `print_report` reads
version 3 reports too (without those it prints no video rows).

The plot is drawn with Pillow alone: matplotlib would pull in plain Pillow and replace pillow-simd.
"""

import math
import os
import platform
import resource

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from mmworker.loadtest.runner import RunResult
from mmworker.loadtest.tally import LATENCY_PARTS

REPORT_VERSION = 4


def plural(n: int, noun: str) -> str:
    """'1 worker', '2 workers'."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


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
                 verified: int, mismatches: list[int], inline: dict | None) -> dict:  # fmt: skip
    """The report (the module docstring's schema) of one run; `verified` replies were re-run in
    process, `mismatches` lists the request indices whose results differed."""
    tally = result.tally
    warmup, measured = tally.warmup, tally.measured
    measured_s = max(1e-9, result.ended - result.measured_from)
    wall = max(1e-9, result.ended - result.started)
    failures = []
    lost = tally.total("lost")
    if lost:
        failures.append(f"{lost} request(s) lost (submitted, never answered)")
    if result.duplicates:
        failures.append(f"{result.duplicates} duplicated answer(s)")
    if mismatches:
        failures.append(f"{len(mismatches)} verified request(s) differ from in-process results: {mismatches[:5]}")
    bad_accepted = warmup.bad_accepted + measured.bad_accepted
    if bad_accepted:
        failures.append(f"{bad_accepted} expected-bad request(s) accepted: {tally.bad_accepted}")
    bad_wrong = warmup.bad_wrong_reason + measured.bad_wrong_reason
    if bad_wrong:
        failures.append(f"{bad_wrong} bad request(s) rejected for the wrong reason: {tally.bad_wrong[:3]}")
    internal = warmup.internal + measured.internal
    if internal:
        failures.append(f"{internal} request(s) failed with an internal error: {tally.internal_errors[:3]}")
    report = {
        "version": REPORT_VERSION,
        "machine": machine_info(),
        "config": config,
        "duration_s": wall,
        "measured_s": measured_s,
        "interrupted": result.interrupted,
        "requests": {**measured.as_dict(), "duplicated": result.duplicates},
        "warmup_requests": {**warmup.as_dict(), "rejects_by_kind": dict(warmup.rejects_by_kind.most_common())},
        "throughput": {
            "requests_per_s": measured.accepted / measured_s,
            "images_per_s": tally.measured_images / measured_s,
            "videos_per_s": tally.measured_videos / measured_s,
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
                "videos": tally.per_worker_videos.get(k, 0),
            }
            for k, pid in enumerate(worker_pids)
        ],
        "client": {
            "cpu_utilisation": result.cpu_s / wall,
            # Per answered request, warm-up included: so is the warm-up's CPU time in cpu_s.
            "cpu_ms_per_request": result.cpu_s / max(1, tally.total("answered")) * 1e3,
            # Private memory (RssAnon); ru_maxrss would also count the mapped rings' shared pages.
            "peak_rss_mb": max((c for _, c, _ in result.rss), default=0.0),
            "peak_rss_incl_shared_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        },
        "cache": _cache_summary(result, pool_stats, config.get("repeat_fraction", 0.0)),
        "videos": _video_summary(result, config),
        "shm": {"ring_mib": ring_mib, "peak_held_mb": pool_stats.shm_peak_held_bytes / 2**20},
        "rejects_by_kind": dict(measured.rejects_by_kind.most_common()),
        "verify": {"checked": verified, "mismatches": len(mismatches)},
        "restarts": pool_stats.restarts,
        "chaos_kills": result.kills,
        "rss_mb": _rss_summary(result),
        "ok": not failures,
        "failures": failures,
    }
    if inline is not None:
        report["inline"] = inline
    return report


def _cache_summary(result: RunResult, pool_stats, repeat_fraction: float) -> dict:
    """The report's `cache` (the module docstring): the pool's counters from the first measured
    submission on, set against what the workload sent."""
    start = result.cache_from if result.cache_from is not None else pool_stats  # None: nothing measured

    def measured(name: str) -> int:
        return getattr(pool_stats, name, 0) - getattr(start, name, 0)

    hits, misses = measured("cache_hits"), measured("cache_misses")
    tally = result.tally

    def latency(histogram) -> dict:
        summary = histogram.summary()
        return {"count": histogram.n, **{k: summary[k] for k in ("p50", "p90", "p99")}}

    return {
        "enabled": getattr(pool_stats, "cache_capacity_bytes", 0) > 0,
        "hits": hits, "misses": misses, "hit_rate": hits / (hits + misses) if hits + misses else None,
        "deduplicated": measured("cache_deduplicated"), "evictions": measured("cache_evictions"),
        "entries": getattr(pool_stats, "cache_entries", 0), "bytes": getattr(pool_stats, "cache_bytes", 0),
        "capacity_bytes": getattr(pool_stats, "cache_capacity_bytes", 0), "repeat_fraction": repeat_fraction,
        "good_images_sent": tally.sent_images, "repeated_images": tally.sent_repeats,
        "latency_ms": {"all_hit": latency(tally.latency_all_hit), "others": latency(tally.latency_others)},
    }  # fmt: skip


def _video_summary(result: RunResult, config: dict) -> dict:
    """The report's `videos` (the module docstring): the measured requests with a video, apart."""
    tally = result.tally

    def latency(histogram) -> dict:
        summary = histogram.summary()
        return {"count": histogram.n, **{k: summary[k] for k in ("mean", "p50", "p90", "p99", "max")}}

    return {
        "fraction": config.get("video_fraction", 0.0), "clips": config.get("video_clips", 0),
        "requests": tally.video.as_dict(), "rejects_by_kind": dict(tally.video.rejects_by_kind.most_common()),
        "videos_sent": tally.sent_videos,
        "latency_ms": {"video": latency(tally.latency_video), "image_only": latency(tally.latency_image_only)},
    }  # fmt: skip


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
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    r, lat, thr = report["requests"], report["latency_ms"], report["throughput"]
    table = Table(title="mmworker load test", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    cfg = report["config"]
    table.add_row("run", f"{cfg['mode']}, {report['measured_s']:.1f} s measured (+{cfg['warmup_s']:g} s warm-up), "
                         f"{plural(cfg['workers'], 'worker')}, spec {cfg['spec_name']}")  # fmt: skip
    if "family" in cfg:
        table.add_row("family", cfg["family"])
    videos = report.get("videos") or {}  # (none in a version 3 report)
    with_videos = bool(videos.get("fraction"))
    per_s = f", {thr['videos_per_s']:.2f} videos/s" if with_videos else ""
    table.add_row("throughput", f"{thr['requests_per_s']:.1f} requests/s, {thr['images_per_s']:.1f} images/s{per_s}")
    table.add_row("latency", "  ".join(f"{k} {lat[k]:.1f} ms" for k in ("p50", "p90", "p99", "p99.9", "max")))
    parts = report["latency_parts_ms"]
    table.add_row("latency parts", ", ".join(
        f"{label} {parts[name]['p50']:.2f} / {parts[name]['p99']:.2f}" for name, label in
        zip(LATENCY_PARTS, ("queued", "to the worker", "in the worker", "back"), strict=True)
    ) + " ms (p50 / p99)")  # fmt: skip
    table.add_row("requests", f"{r['submitted']} submitted, {r['answered']} answered, {r['accepted']} accepted, "
                              f"{r['rejected']} rejected ({r['expected_bad']} deliberately bad)")  # fmt: skip
    if with_videos:
        for name, text in _video_rows(videos):
            table.add_row(name, text)
    w = report["warmup_requests"]
    if w["submitted"]:
        table.add_row("warm-up", f"{w['submitted']} more submitted, {w['accepted']} accepted, {w['rejected']} rejected "
                                 "(checked, not in the figures)")  # fmt: skip
    lost = f"{r['lost'] + w['lost']} / {r['duplicated']}"
    abandoned = r["abandoned"] + w["abandoned"]
    if abandoned:
        lost += f" ({abandoned} in flight when the run was interrupted)"
    table.add_row("lost / duplicated", lost)
    skipped = " (the rest skipped: interrupted)" if report.get("interrupted") else ""
    table.add_row("verified", f"{report['verify']['checked']} replies re-run in process, "
                              f"{report['verify']['mismatches']} mismatches{skipped}")  # fmt: skip
    for w in report["workers"]:
        work = f"{plural(w['requests'], 'request')}, {plural(w['images'], 'image')}"
        if with_videos:
            work += f", {plural(w.get('videos', 0), 'video')}"
        table.add_row(f"worker {w['index']}", f"CPU {w['cpu_utilisation'] * 100:.0f}%, {work}")
    c = report["client"]
    table.add_row("client", f"CPU {c['cpu_utilisation'] * 100:.0f}% ({c['cpu_ms_per_request']:.2f} ms/request), "
                            f"peak private RSS {c['peak_rss_mb']:.0f} MB")  # fmt: skip
    table.add_row("shared memory", f"peak {report['shm']['peak_held_mb']:.1f} MB held by unreleased replies "
                                   f"(rings {report['shm']['ring_mib']} MiB per worker)")  # fmt: skip
    for name, text in _cache_rows(report["cache"]):
        table.add_row(name, text)
    rejects = ", ".join(f"{k}: {v}" for k, v in report["rejects_by_kind"].items()) or "none"
    table.add_row("rejects by kind", rejects)
    kills = report["chaos_kills"]
    restarts = f"{report['restarts']}" + (f" ({plural(kills, 'worker')} killed on purpose)" if kills else "")
    table.add_row("restarts", restarts)
    rss = report["rss_mb"]
    growth = (f", growth minute 2 -> last: {rss['growth_pct']:+.1f}% (client {rss['client_growth_pct']:+.1f}%, "
              f"workers {rss['workers_growth_pct']:+.1f}%)" if "growth_pct" in rss else "")  # fmt: skip
    table.add_row("memory", f"peak {rss['peak']:.0f} MB private RSS, client + workers{growth}")
    if "inline" in report:
        i = report["inline"]
        table.add_row("vs inline", f"{i['requests_per_s']:.1f} requests/s on one core in process: "
                                   f"the pool is {i['pool_speedup']:.2f}x")  # fmt: skip
    verdict = "[green]PASS[/green]" if report["ok"] else "[red]FAIL[/red]: " + escape("; ".join(report["failures"]))
    if report.get("interrupted"):
        verdict = f"[yellow]INTERRUPTED[/yellow] after {report['duration_s']:.1f} s; of what ran: {verdict}"
    table.add_row("verdict", verdict)
    console.print(table)


def _video_rows(videos: dict) -> list[tuple[str, str]]:
    """The table's rows about the requests with a video: their counts, then their latency beside
    the image-only requests'."""
    v = videos["requests"]
    rows = [("with a video", f"{v['submitted']} of the requests ({videos['fraction'] * 100:g}% asked, "
                             f"{plural(videos['videos_sent'], 'good video')} sent, {videos['clips']} clips): "
                             f"{v['accepted']} accepted, {v['rejected']} rejected ({v['expected_bad']} "
                             "deliberately bad)")]  # fmt: skip
    cells = []
    for name in ("video", "image_only"):
        lat = videos["latency_ms"][name]
        cells.append(f"{lat['p50']:.1f} / {lat['p90']:.1f} / {lat['p99']:.1f} ms ({plural(lat['count'], 'request')})"
                     if lat["count"] else "none")  # fmt: skip
    rows.append(("video / image-only", f"{cells[0]}; {cells[1]} (p50 / p90 / p99)"))
    return rows


def _cache_rows(cache: dict) -> list[tuple[str, str]]:
    """The table's rows about the feature cache: hit rate and content, then all-hit latency."""
    sent = (f"{cache['repeated_images']} of {cache['good_images_sent']} good requests' images sent repeated one"
            if cache["good_images_sent"] else "no good request sent")  # fmt: skip
    if not cache["enabled"]:
        return [("cache", f"off; {sent}")]
    rate = "no lookups" if cache["hit_rate"] is None else f"hit rate {cache['hit_rate'] * 100:.1f}%"
    entries = f"{cache['entries']} {'entry' if cache['entries'] == 1 else 'entries'}"
    rows = [("cache", f"{rate} ({cache['hits']} hits, {cache['misses']} misses; {sent}), {entries} "
                      f"({cache['bytes'] / 2**20:.0f} of {cache['capacity_bytes'] / 2**20:.0f} MiB), "
                      f"{plural(cache['evictions'], 'eviction')}")]  # fmt: skip
    hit, other = cache["latency_ms"]["all_hit"], cache["latency_ms"]["others"]
    if hit["count"]:
        cells = [f"{lat['p50']:.2f} / {lat['p90']:.2f} / {lat['p99']:.2f} ms ({plural(lat['count'], 'request')})"
                 if lat["count"] else "none" for lat in (hit, other)]  # fmt: skip
        rows.append(("all hits / others", f"{cells[0]}; {cells[1]} (p50 / p90 / p99)"))
    return rows


# The plot's geometry and colours.
_POINT, _CURVE, _MARK, _GRID, _CLIPPED = (31, 119, 180), (214, 39, 40), (90, 90, 90), (225, 225, 225), (214, 39, 40)
_MARGIN_LEFT, _MARGIN_RIGHT, _MARGIN_TOP, _MARGIN_BOTTOM, _GAP = 78, 24, 78, 64, 90


def nice_ticks(high: float, most: int = 6) -> list[float]:
    """Ticks 0, step, 2 step, ... up to the first at or above `high`, step 1, 2 or 5 times a power of
    ten, at most `most` + 1 of them."""
    high = max(high, 1e-9)
    for power in range(math.floor(math.log10(high / most)) - 1, 400):
        for mantissa in (1, 2, 5):
            step = mantissa * 10.0**power
            if math.ceil(high / step - 1e-9) <= most:
                return [k * step for k in range(math.ceil(high / step - 1e-9) + 1)]
    return [0.0, high]


def _tick_text(value: float, ticks: list[float]) -> str:
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return f"{value:.{decimals}f}"


def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    # Pillow's bundled scalable font when it has FreeType, its fixed bitmap font otherwise.
    return ImageFont.load_default(size)


class _Axes:
    """One panel: a frame with ticked, labelled axes mapping data (x, y) to pixels."""

    def __init__(self, image: Image.Image, box: tuple[int, int, int, int], xticks: list[float], yticks: list[float],
                 title: str, xlabel: str, ylabel: str, ytext=None) -> None:  # fmt: skip
        self.image, self.draw = image, ImageDraw.Draw(image)
        self.x0, self.y0, self.x1, self.y1 = box  # left, top, right, bottom of the plotting area
        self.xticks, self.yticks = xticks, yticks
        font, small = _font(16), _font(13)
        draw = self.draw
        for value in yticks:
            y = self.y(value)
            draw.line([(self.x0, y), (self.x1, y)], fill=_GRID)
            draw.line([(self.x0 - 5, y), (self.x0, y)], fill="black")
            text = ytext(value) if ytext else _tick_text(value, yticks)
            draw.text((self.x0 - 8, y), text, fill="black", font=small, anchor="rm")
        for value in xticks:
            x = self.x(value)
            draw.line([(x, self.y0), (x, self.y1)], fill=_GRID)
            draw.line([(x, self.y1), (x, self.y1 + 5)], fill="black")
            draw.text((x, self.y1 + 8), _tick_text(value, xticks), fill="black", font=small, anchor="mt")
        draw.rectangle([self.x0, self.y0, self.x1, self.y1], outline="black")
        draw.text(((self.x0 + self.x1) / 2, self.y0 - 12), title, fill="black", font=font, anchor="ms")
        draw.text(((self.x0 + self.x1) / 2, self.y1 + 32), xlabel, fill="black", font=small, anchor="mt")
        # The y label, turned to read upwards beside its axis.
        left, top, right, bottom = draw.textbbox((0, 0), ylabel, font=small)
        label = Image.new("RGB", (right - left + 4, bottom - top + 4), "white")
        ImageDraw.Draw(label).text((2 - left, 2 - top), ylabel, fill="black", font=small)
        label = label.rotate(90, expand=True)
        image.paste(label, (self.x0 - 66, int((self.y0 + self.y1) / 2 - label.height / 2)))

    def x(self, value: float) -> float:
        return self.x0 + value / self.xticks[-1] * (self.x1 - self.x0)

    def y(self, value: float) -> float:
        return self.y1 - value / self.yticks[-1] * (self.y1 - self.y0)

    def dashed(self, y: float, colour: tuple[int, int, int], text: str, above: bool) -> None:
        """A dashed horizontal line at pixel row `y`, labelled at its right end, above or below it."""
        for x in range(self.x0, self.x1, 12):
            self.draw.line([(x, y), (min(x + 6, self.x1), y)], fill=colour, width=2)
        at, anchor = ((self.x1 - 4, y - 3), "rb") if above else ((self.x1 - 4, y + 4), "rt")
        self.label(at, text, colour, anchor)

    def label(self, at: tuple[float, float], text: str, colour: tuple[int, int, int], anchor: str) -> None:
        """Text on a white box, readable over the points."""
        font = _font(13)
        left, top, right, bottom = self.draw.textbbox(at, text, font=font, anchor=anchor)
        self.draw.rectangle([left - 2, top - 1, right + 2, bottom + 1], fill="white")
        self.draw.text(at, text, fill=colour, font=font, anchor=anchor)


def plot(result: RunResult, report: dict, path: str, width: int = 1200, height: int = 520) -> None:
    """PNG: latency over time (left) and the latency CDF (right), of the measured accepted requests
    (all of them, or the tally's uniform sample of tally.PLOT_SAMPLE), with ticked axes in ms and s.

    Both panels share one latency range: up to the maximum, or to twice the 99th percentile when the
    maximum is further out, so that a few outliers do not squash the rest. Points beyond the range
    are drawn on the top edge in red and counted in the header.
    """
    points = result.tally.plot_points
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    cfg = report["config"]
    header = (f"mmworker load test: {cfg['mode']}, {plural(cfg['workers'], 'worker')}, spec {cfg['spec_name']}; "
              f"{plural(len(points), 'accepted request')} plotted")  # fmt: skip
    draw.text((_MARGIN_LEFT - 60, 14), header, fill="black", font=_font(16))
    if not len(points):
        draw.text((width / 2, height / 2), "no accepted requests to plot", fill="black", font=_font(16), anchor="mm")
        image.save(path)
        return
    t = np.maximum(points[:, 0] - (result.measured_from - result.started), 0.0)
    lat = np.sort(points[:, 1])
    high = float(lat[-1])
    yticks = nice_ticks(min(high, 2 * float(np.percentile(lat, 99))) or 1.0)
    clipped = int(np.count_nonzero(lat > yticks[-1]))
    if clipped:
        draw.text((_MARGIN_LEFT - 60, 36), f"{plural(clipped, 'request')} above {yticks[-1]:g} ms drawn on the top "
                  f"edge (max {high:.1f} ms)", fill=_CLIPPED, font=_font(13))  # fmt: skip
    panel = (width - _MARGIN_LEFT - _MARGIN_RIGHT - _GAP - _MARGIN_LEFT) // 2
    bottom = height - _MARGIN_BOTTOM
    left_box = (_MARGIN_LEFT, _MARGIN_TOP, _MARGIN_LEFT + panel, bottom)
    right_x0 = _MARGIN_LEFT + panel + _GAP + _MARGIN_LEFT
    right_box = (right_x0, _MARGIN_TOP, right_x0 + panel, bottom)
    summary = report["latency_ms"]

    over_time = _Axes(image, left_box, nice_ticks(float(t.max()) or 1.0), yticks, "latency over time",
                      "time since the warm-up (s)", "latency (ms)")  # fmt: skip
    y_top = over_time.y(yticks[-1])
    for ti, li in zip(t, points[:, 1], strict=True):
        x = over_time.x(ti)
        if li > yticks[-1]:
            draw.polygon([(x - 4, y_top + 7), (x + 4, y_top + 7), (x, y_top)], fill=_CLIPPED)
        else:
            y = over_time.y(li)
            draw.ellipse((x - 2, y - 2, x + 2, y + 2), fill=_POINT)
    for name, above in (("p50", False), ("p99", True)):
        if summary[name] <= yticks[-1]:
            over_time.dashed(over_time.y(summary[name]), _MARK, f"{name} {summary[name]:.1f} ms", above)

    cdf = _Axes(image, right_box, yticks, [0, 20, 40, 60, 80, 100], "latency CDF", "latency (ms)",
                "requests answered within (%)", ytext=lambda v: f"{v:.0f}%")  # fmt: skip
    # The empirical CDF as a step line, one vertex per pixel column at most.
    columns = np.linspace(0.0, yticks[-1], right_box[2] - right_box[0] + 1)
    share = np.searchsorted(lat, columns, side="right") / len(lat) * 100
    draw.line([(cdf.x(c), cdf.y(f)) for c, f in zip(columns, share, strict=True)], fill=_CURVE, width=2)
    for name in ("p50", "p90", "p99"):
        value, q = summary[name], float(name[1:])
        if value <= yticks[-1]:
            x, y = cdf.x(value), cdf.y(q)
            draw.ellipse((x - 4, y - 4, x + 4, y + 4), outline=_MARK, width=2)
            cdf.label((x + 8, y + 2), f"{name} {value:.1f} ms", _MARK, "lt")
    image.save(path)
