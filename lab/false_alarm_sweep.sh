#!/usr/bin/env bash
# The false-alarm sweep: N cases per correct lowering (default 2000), random draws with a fixed seed,
# targeted at the worst ulp error (nightly profile). Writes docs/lab/false-alarm-sweep.md from the report.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-2000}
DEVICE=${DEVICE:-cpu}
OUTDIR=${OUTDIR:-/tmp/false-alarm}
LOWERINGS=${LOWERINGS:-"sdpa context decode_rows windowed_merge[eager] windowed_merge[compiled] windowed_merge[triton] hybrid_paged"}
args=()
for l in $LOWERINGS; do args+=(--lowering "$l"); done
start=$(date -u +%Y-%m-%dT%H:%M:%SZ)
set +e
.venv/bin/dflash-parity check --device "$DEVICE" --profile nightly --seed 1 --max-examples "$N" --report "$OUTDIR" "${args[@]}" | tee "$OUTDIR.log"
code=${PIPESTATUS[0]}
set -e
echo "exit code $code (started $start, ended $(date -u +%Y-%m-%dT%H:%M:%SZ))" | tee -a "$OUTDIR.log"
