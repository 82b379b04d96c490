"""A scheduler stand-in for the fault tests: starts a pool, prints its pids, keeps it busy until killed.

It prints "busy" once a reply has come and requests are in flight again, so the test kills it while
its workers are mid-request; a reply that failed ends it with the error instead.

python tests/pool_client.py
"""

import sys

from mmworker import WorkerPool
from mmworker.corpus import encode, photo_like

if __name__ == "__main__":
    image = encode(photo_like(640, 480, seed=1), "JPEG")
    pool = WorkerPool("qwen2_vl", {"workers": 2, "cache_mib": 0, "ring_mib": 64})  # every request a worker's
    print(" ".join(str(p) for p in [*pool.worker_pids(), pool.io_pid()]), flush=True)
    announced = False
    while True:  # keep requests in flight, so the workers are mid-request when this process dies
        replies = pool.poll(0.05)
        for reply in replies:
            if not reply.ok:
                sys.exit(f"pool_client: request {reply.request_id} failed: {reply.error}")
            reply.release()
        while pool.stats().in_flight < 4:
            pool.submit([151655], [image])
        if replies and not announced:
            print("busy", flush=True)
            announced = True
    sys.exit(0)
