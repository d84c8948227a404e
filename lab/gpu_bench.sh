#!/usr/bin/env bash
# `dflash-parity bench` on one GPU (the lent H200): every table, progress on the terminal and in
# $OUT/bench/gpu_bench.log, results in $OUT/bench/ (bench.json, bench.md, <table>.png).
#
# The caller provides flashinfer (PYTHONPATH=/tmp/site:$PWD with the offline bundle unpacked there, as
# lab/gpu_session.sh does) and OUT. Optional:
#   TABLE=decode-rows|merge|hybrid|all   (default all)
#   BENCH_ARGS='--quick'                 extra arguments (e.g. --quick for a smoke run, --replays 20)
#   BENCH_TIMEOUT=570                    seconds before the run is stopped (the files keep what finished)
# Compiled flashinfer modules: installed first from .fib/fi_aot.tar.xz and packed afterwards into
# $OUT/fi_aot.tar.xz when .fib/flashinfer_aot.py exists (the first run of a head dim pays 15-95 s of JIT
# per module; head dim 64 is new to the check runs).
set -uo pipefail
: "${OUT:?set OUT to the output directory}"
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/bench"
exec > >(tee -a "$OUT/bench/gpu_bench.log") 2>&1
echo "== date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv || true
python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
python3 -c "import matplotlib; print('matplotlib', matplotlib.__version__)" || echo "matplotlib not importable: PNGs skipped"
if [ -f .fib/flashinfer_aot.py ] && [ -f .fib/fi_aot.tar.xz ]; then python3 .fib/flashinfer_aot.py install .fib/fi_aot.tar.xz || true; fi
python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)" \
  || echo "flashinfer not importable: its rows will say unavailable"
echo "== dflash-parity bench --device cuda --table ${TABLE:-all} ${BENCH_ARGS:-}"
start=$(date +%s)
# the bench verb comes from an entry point where the package is installed; this tree is not: it is passed in
timeout "${BENCH_TIMEOUT:-570}" python3 -c 'import sys; from parity.front import cli; from parity.bench.verb import VERB
sys.exit(cli.main(sys.argv[1:], added={"bench": VERB}))' bench --device cuda --out "$OUT/bench" --table "${TABLE:-all}" ${BENCH_ARGS:-}
rc=$?
echo "== exit code: $rc ($(( $(date +%s) - start )) s; 0 all verdicts pass, 1 a FAIL row, 2 bad usage, 124 timed out)"
if [ -f .fib/flashinfer_aot.py ]; then python3 .fib/flashinfer_aot.py pack "$OUT/fi_aot.tar.xz" || true; fi
ls -la "$OUT/bench"
exit $rc
