#!/usr/bin/env bash
# A cluster run (build_results.py --cluster) on a CUDA machine, checked against the same experiments run
# the ordinary way, one after another. Run at the repository root:
#
#   checks/cluster.sh                      # softmax-row-fusion and softmax-short-rows, both ways
#   checks/cluster.sh SLUG [SLUG ...]      # these experiments, both ways
#   checks/cluster.sh --all                # every experiment at once, one per GPU; no sequential
#                                                   # run (SEQUENTIAL=1 adds it: minutes per experiment)
#
# Ray: used when it imports; otherwise installed from the wheelhouse in .whl/ray (tools/ray_wheelhouse.py
# builds it where there is network; PYTHON names the interpreter, python3 by default). Writes under $OUT
# (default /tmp/gpu_check_cluster): records/ (the cluster run's records, to commit), records-sequential/,
# the logs of both runs, cluster_check.json, and prints a table: per experiment, the host and GPU each
# worker held, its duration, the copy ceiling in both runs and the median over points of the claim
# subject's p50 in the cluster run over the sequential run's; then the wall times.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT="${OUT:-/tmp/gpu_check_cluster}"
mkdir -p "$OUT"

if ! "$PY" -c "import ray" 2>/dev/null; then
    pin=$(sed -n 's/^ray==//p' requirements/cpu.lock)
    [ -d .whl/ray ] || { echo "gpu_check_cluster: Ray does not import and .whl/ray is missing" >&2; exit 2; }
    echo "gpu_check_cluster: installing ray==$pin from .whl/ray"
    if ! "$PY" -m pip install --quiet --no-index --find-links .whl/ray "ray==$pin"; then
        "$PY" -m pip install --quiet --no-index --find-links .whl/ray --target "$OUT/site" "ray==$pin"
        export PYTHONPATH="$OUT/site${PYTHONPATH:+:$PYTHONPATH}"
    fi
fi
"$PY" -c "import ray, torch; print(f'gpu_check_cluster: ray {ray.__version__}, torch {torch.__version__}, '
          f'{torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}')"

if [ "${1:-}" = "--all" ]; then
    slugs=()
    sequential="${SEQUENTIAL:-0}"
else
    slugs=("$@")
    [ ${#slugs[@]} -gt 0 ] || slugs=(softmax-row-fusion softmax-short-rows)
    sequential="${SEQUENTIAL:-1}"
fi

timed() {  # timed NAME COMMAND...: run, log to $OUT/NAME.log, keep the wall time and exit status
    local name=$1; shift
    local start end status=0
    start=$(date +%s.%N)
    "$@" > >(tee "$OUT/$name.log") 2>&1 || status=$?
    end=$(date +%s.%N)
    awk -v s="$start" -v e="$end" -v x="$status" 'BEGIN { printf "{\"wall_s\": %.2f, \"exit\": %d}\n", e - s, x }' > "$OUT/$name.json"
    echo "gpu_check_cluster: $name: exit $status"
}

rm -rf "$OUT/records" "$OUT/records-sequential"
docs=$(mktemp -d)  # the pages each run renders are not what this checks
timed cluster "$PY" tools/build_results.py --cluster --run ${slugs[@]+"${slugs[@]}"} --no-progress \
    --records-dir "$OUT/records" --docs-dir "$docs/cluster"
if [ "$sequential" = 1 ]; then
    timed sequential "$PY" tools/build_results.py --run ${slugs[@]+"${slugs[@]}"} --no-progress \
        --records-dir "$OUT/records-sequential" --docs-dir "$docs/sequential"
fi

"$PY" - "$OUT" <<'EOF'
import json, statistics, sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, ".")
from experiments import all_experiments
from lab.evidence.store import load_records

out = Path(sys.argv[1])
experiments = all_experiments()


def seconds(r):
    parse = lambda t: datetime.strptime(t, "%Y-%m-%dT%H:%M:%SZ")
    return (parse(r.finished_utc) - parse(r.started_utc)).total_seconds()


def subject_p50(r):
    name = experiments[r.experiment].claim.subject
    return {(p.case, p.dtype): p.results[name].p50_ms for p in r.points
            if name in p.results and p.results[name].p50_ms is not None}


runs = {kind: {r.experiment: r for r in load_records(out / d)[0]}
        for kind, d in (("cluster", "records"), ("sequential", "records-sequential"))}
walls = {k: json.loads((out / f"{k}.json").read_text()) for k in ("cluster", "sequential")
         if (out / f"{k}.json").exists()}
rows = []
print(f"{'experiment':24} {'host':14} {'gpu':4} {'s':>5} {'ceiling GB/s':>14} {'subject p50 cl/seq':>19}")
for slug, r in sorted(runs["cluster"].items()):
    env, seq = r.environment, runs["sequential"].get(slug)
    ratio = None
    if seq is not None:
        a, b = subject_p50(r), subject_p50(seq)
        common = [k for k in a if k in b and b[k] > 0]
        ratio = statistics.median(a[k] / b[k] for k in common) if common else None
    ceiling = f"{r.copy_ceiling.gbps:.0f}" + (f"/{seq.copy_ceiling.gbps:.0f}" if seq else "")
    gpus = ",".join(env.get("worker", {}).get("gpu_ids", []))
    print(f"{slug:24} {env.get('host', '?')[:14]:14} {gpus:4} {seconds(r):5.0f} {ceiling:>14} "
          f"{'' if ratio is None else f'{ratio:.3f}':>19}")
    rows.append({"experiment": slug, "run_id": r.run_id, "gpu_key": r.gpu_key, "host": env.get("host"),
                 "worker": env.get("worker"), "seconds": seconds(r), "ceiling_gbps": r.copy_ceiling.gbps,
                 "sequential_run_id": seq.run_id if seq else None,
                 "sequential_ceiling_gbps": seq.copy_ceiling.gbps if seq else None,
                 "subject_p50_ratio_median": ratio})
summed = sum(x["seconds"] for x in rows)
print(f"cluster wall {walls.get('cluster', {}).get('wall_s', float('nan')):.1f} s; the experiments' own "
      f"durations sum to {summed:.0f} s; sequential wall "
      f"{walls.get('sequential', {}).get('wall_s', float('nan')):.1f} s")
(out / "cluster_check.json").write_text(json.dumps({"walls": walls, "sum_of_durations_s": summed,
                                                    "experiments": rows}, indent=2) + "\n")
EOF
