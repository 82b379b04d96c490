#!/usr/bin/env bash
# Soak test: the load test for N minutes (default 10) with 5% bad requests and a worker killed every
# few seconds, then the checks: nothing lost, duplicated or corrupted, no shared-memory segment
# left behind, and private RSS (client + workers) growing less than 5% from minute 2 to the end.
#   scripts/soak.sh [MINUTES] [KILL_EVERY_SECONDS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
minutes=${1:-10}
kill_every=${2:-5}
report=${SOAK_REPORT:-soak-report.json}
before=$(ls /dev/shm | grep -c '^mmw-' || true)
.venv/bin/mmworker loadtest --duration $((minutes * 60)) --warmup 5 --bad-fraction 0.05 \
    --kill-worker-every "$kill_every" --verify 50 --json "$report" --no-progress || status=$?
after=$(ls /dev/shm | grep -c '^mmw-' || true)
.venv/bin/python - "$report" "$before" "$after" "${status:-0}" <<'PY'
import json
import sys

report, before, after, status = json.load(open(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
r, rss = report["requests"], report["rss_mb"]
checks = [
    ("lost", r["lost"] == 0, r["lost"]),
    ("duplicated", r["duplicated"] == 0, r["duplicated"]),
    ("corrupted (verify mismatches)", report["verify"]["mismatches"] == 0, report["verify"]),
    ("bad requests accepted", r["bad_accepted"] == 0, r["bad_accepted"]),
    ("leaked shared-memory segments", after <= before, after - before),
    ("RSS growth minute 2 -> last minute < 5% (client + workers)", rss.get("growth_pct", 0.0) < 5.0,
     f"{rss.get('growth_pct', float('nan')):+.2f}% (client {rss.get('client_growth_pct', float('nan')):+.2f}%, "
     f"workers {rss.get('workers_growth_pct', float('nan')):+.2f}%)"),
    ("load test verdict", status == 0 and report["ok"], report["failures"]),
]
print(f"\nsoak: {report['measured_s'] / 60:.1f} min, {r['answered']} requests, {report['chaos_kills']} workers killed, "
      f"{report['throughput']['requests_per_s']:.1f} req/s")
for name, ok, value in checks:
    print(f"  {'PASS' if ok else 'FAIL'}  {name}: {value}")
sys.exit(0 if all(ok for _, ok, _ in checks) else 1)
PY
