#!/usr/bin/env bash
# Issue 48 on the GPU: where run 11's command spends its time, this tree against main 1933668 (.base/): run 11's
# command as lab/gpu_issue48_run11.sh runs it (a fill pass each, then PASSES warm passes alternating), then per
# lowering and pass the report's seconds and `phase_seconds` (build, oracle, yardstick, lowering, judge, ...), and
# the cases each tree judged in fp32 and fp64. Only the logs and one table come back ($OUT kept small).
# Over two calls on one warm machine: FILL=250 PASSES=0, then FILL=0 PASSES=2 (the table covers both).
# In one call with a hard limit: BUDGET=500 (seconds for the sweeps, lab/gpu_issue48_run11.sh), so the table is written.
#   OUT=dir FILL=170 PASSES=2 EXCLUDE='context[flashinfer-fa3]' bash lab/gpu_issue48_phases.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
date -u +%Y-%m-%dT%H:%M:%SZ
git log -1 --format='tree %h' 2>/dev/null || true
STEPS=none bash lab/gpu_session.sh > /tmp/setup.log 2>&1
head -3 /tmp/setup.log
RUNS=/tmp/phases-runs; mkdir -p "$RUNS"
OUT=$RUNS bash lab/gpu_issue48_run11.sh > "$OUT/run11.log" 2>&1
grep -E "^==|cases in|exit code" "$OUT/run11.log"
python3 - "$RUNS" > "$OUT/phases.txt" <<'PY'
import glob, gzip, json, sys
rows = []
for f in sorted(glob.glob(sys.argv[1] + "/parity-*.json.gz")):
    tag = f.rsplit("/", 1)[-1][len("parity-"):-len(".json.gz")]
    d = json.load(gzip.open(f))
    for name, v in d["lowerings"].items():
        ph = v.get("phase_seconds") or {}
        comp = sum((v.get("compiles") or {}).values())
        rows.append((name, tag, v.get("cases"), v.get("seconds"), ph, v.get("oracle"), comp, v.get("compile_families")))
keys = ["build", "oracle", "yardstick", "lowering", "judge", "hardening", "kernel_names", "wait", "precompile"]
print("lowering | pass | cases | seconds | " + " | ".join(keys) + " | compiles | families | oracle tally")
for name, tag, n, s, ph, o, comp, fam in sorted(rows):
    print(f"{name} | {tag} | {n} | {s} | " + " | ".join(str(ph.get(k, "")) for k in keys) + f" | {comp} | {fam} | {o}")
PY
cat "$OUT/phases.txt"
tar -C "$RUNS" -czf "$OUT/reports.tgz" $(cd "$RUNS" && ls parity-*.json.gz summary-*.md sweep-*.log.gz 2>/dev/null)
date -u +%T
