"""A scheduler stand-in for the fault tests: starts a pool, prints its pids, keeps it busy until killed.

python tests/pool_client.py
"""

import sys

from mmworker import WorkerPool
from mmworker.corpus import encode, photo_like

if __name__ == "__main__":
    image = encode(photo_like(640, 480, seed=1), "JPEG")
    pool = WorkerPool("qwen2_vl", {"workers": 2, "ring_mib": 64})
    print(" ".join(str(p) for p in [*pool.worker_pids(), pool.io_pid()]), flush=True)
    while True:  # keep requests in flight, so the workers are mid-request when this process dies
        for reply in pool.poll(0.05):
            reply.release()
        while pool.stats().in_flight < 4:
            pool.submit([151655], [image])
    sys.exit(0)
