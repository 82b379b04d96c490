"""The standalone load test (`mmworker loadtest`): drives a WorkerPool the way a busy server would.

| module | owns |
|---|---|
| `corpus` | the built-in photo-like corpus (JPEG/PNG/WebP at real-world sizes, cached) or a user's directory |
| `clips` | the built-in video clips (a few codecs, sizes and lengths, encoded with PyAV, cached) |
| `variants` | distinct copies of a corpus image (a marker the decoders skip): other bytes, the same pixels |
| `mediaserver` | the 127.0.0.1 HTTP server (its own process) serving the corpus, its variants and the clips by URL |
| `workload` | the request stream: images and videos per request, source kinds, prompts, the bad requests, repeats |
| `runner` | closed/open-loop driving, warm-up, live progress, the requests in flight, verification digests |
| `tally` | what is kept of answered requests: counters, latency histograms, a bounded sample (fixed memory) |
| `report` | figures (the cache's among them), the terminal table, the JSON report, the plot, the verdict |
"""
