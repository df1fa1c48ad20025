#!/usr/bin/env bash
# A worker lost mid-run, on real GPUs: a cluster run (build_results.py --cluster) of two experiments, one
# worker killed (SIGKILL) while it times its experiment. Expected: the run ends with exit 1 and names the
# lost experiment; the other experiment's record lands and validates; nothing else is written. Run at the
# repository root on a machine with two or more GPUs and Ray installed (checks/cluster.sh says how):
#
#   checks/cluster_worker_loss.sh [OUT_DIR]        # softmax-row-fusion and softmax-short-rows
#
# Writes OUT_DIR/worker_loss.log, OUT_DIR/records/ and OUT_DIR/worker_loss.json; exits non-zero when an
# expectation fails.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT="${1:-/tmp/cluster_worker_loss}"
KILL_AFTER_S="${KILL_AFTER_S:-6}"
mkdir -p "$OUT"
rm -rf "$OUT/records"
docs=$(mktemp -d)

"$PY" tools/build_results.py --cluster --run softmax-row-fusion softmax-short-rows --no-progress \
    --records-dir "$OUT/records" --docs-dir "$docs" >"$OUT/worker_loss.log" 2>&1 &
driver=$!

# Wait for a worker to start timing (Ray titles an actor's process after the method it runs), then kill it.
victim=""
for _ in $(seq 1 240); do
    victim=$(pgrep -f "ray::GpuWorker.run" | head -n 1)
    [ -n "$victim" ] && break
    kill -0 "$driver" 2>/dev/null || break
    sleep 0.5
done
if [ -n "$victim" ]; then
    sleep "$KILL_AFTER_S"
    kill -9 "$victim" 2>/dev/null && echo "cluster_worker_loss: killed worker pid $victim" | tee -a "$OUT/worker_loss.log"
fi
wait "$driver"
status=$?

"$PY" - "$OUT" "$status" "${victim:-}" <<'PYEOF'
import json, sys
from pathlib import Path

sys.path.insert(0, ".")
from lab.evidence.store import load_records

out, status, victim = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
runs, problems = load_records(out / "records", missing_ok=True)
log = (out / "worker_loss.log").read_text(errors="replace")
landed = sorted(r.experiment for r in runs)
facts = {"exit": status, "killed_pid": victim or None, "records_landed": landed,
         "invalid_records": [str(p.path) for p in problems], "log_tail": log[-2000:]}
ok = bool(victim) and status == 1 and len(landed) == 1 and not problems
facts["expected"] = ok
(out / "worker_loss.json").write_text(json.dumps(facts, indent=2) + "\n")
print(f"cluster_worker_loss: exit {status}, records landed {landed}, invalid {len(problems)}: "
      f"{'as expected' if ok else 'NOT as expected'}")
sys.exit(0 if ok else 1)
PYEOF
