#!/usr/bin/env bash
# The controls' full sweep (a CPU sample: tests/parity/test_controls.py; on the GPU: docs/gpu/2026-12-06-h100-session28.md):
# the three correct computation orders of tests/controls.py through
# `dflash-parity check` at the ci profile (60 draws and the boundary cases, hardened, isolated), on the CPU, seeds
# 0-9, as drawn by default and narrowed to each value regime. JOBS checks at a time; one line per check, then the
# verdicts summed (exit 1 if any check failed).
#   JOBS=14 OUT=dir [SWEEP_ARGS="--no-hardening --no-isolate"] bash lab/controls_sweep.sh
set -uo pipefail
OUT=${OUT:-/tmp/controls-sweep}; JOBS=${JOBS:-2}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
regimes=$($PY -c "from oracle.case import VALUE_REGIMES; print(' '.join(VALUE_REGIMES))")
for seed in 0 1 2 3 4 5 6 7 8 9; do
  for scope in default $regimes; do echo "$seed $scope"; done
done | xargs -P "$JOBS" -L 1 bash -c '
  seed=$0 scope=$1 dir='"$OUT"'/$0-$1
  lim=(); [ "$scope" = default ] || lim=(--limit "values=$scope")
  OMP_NUM_THREADS=1 '"$PY"' -m parity.front.cli check --device cpu --plugin tests/controls_plugin.py --profile ci --seed "$seed" \
    --threads 1 --lowering "control[fp32-one-rounding]" --lowering "control[p-rounded]" --lowering "control[split-kv-4]" \
    "${lim[@]}" '"${SWEEP_ARGS:-}"' --quiet --report "$dir" > "$dir.log" 2>&1
  echo "seed $seed $scope exit $?"'
$PY - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1]); cases = fails = checks = bad = 0; worst = (0.0, "")
for p in sorted(out.glob("*/parity.json")):
    d = json.loads(p.read_text()); checks += 1; bad += d["verdict"] != "pass"
    for name, v in d["lowerings"].items():
        cases += v["cases"]; fails += len(v["failures"])
        if v["worst_margin"] > worst[0]: worst = (v["worst_margin"], f"{p.parent.name} {name}")
print(f"{checks} checks, {cases} cases, {fails} failures, {bad} verdicts not pass; worst margin {worst[0]:.3f} ({worst[1]})")
sys.exit(1 if bad or fails or checks == 0 else 0)
PY
