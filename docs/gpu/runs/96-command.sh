# Run 96 (session 27): an A/B of the forked fork server on one machine (runs 92, 93 and 95 ran on hosts whose
# single-process compile took 0.86 to 1.44 s a kernel: cold rates across machines confound the host with the
# change). 0. a warm-up of the bytecode and page caches (one case, its own Triton cache); then run 8's command on
# empty Triton and inductor caches, each its own, limit 75 s (the 14 lowerings without a torch.compile family
# finish before): A. DFLASH_PARITY_FORKED_SERVER=0 (each child's fork server a fresh interpreter, as before this
# session); B. the default (forked).
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1; mv $OUT/gpu_session.log /tmp/setup.log 2>/dev/null
head -8 /tmp/setup.log
export PYTHONPATH=/tmp/site:$PWD DFLASH_PARITY_PYCACHE=/tmp/dflash-pycache
PROD_OFF="--limit max_production_context=0 --limit max_production_batch=2 --limit models=none"
mkdir -p /tmp/r96
echo "== $(date -u +%T) warm-up of the bytecode and page caches"
TRITON_CACHE_DIR=/tmp/jit-W/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-W/inductor timeout 100 python3 -m parity.cli check \
  --device cuda --lowering context --lowering 'context[flashinfer-fa2]' --max-examples 1 --no-hardening $PROD_OFF \
  --report /tmp/report-w > /tmp/r96/warmup.log 2>&1; echo "exit code: $?"
for ab in A B; do
  export TRITON_CACHE_DIR=/tmp/jit-$ab/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit-$ab/inductor
  [ $ab = A ] && export DFLASH_PARITY_FORKED_SERVER=0 || unset DFLASH_PARITY_FORKED_SERVER
  echo "== $(date -u +%T) $ab: run 8's command, cold (limit 75 s), DFLASH_PARITY_FORKED_SERVER=${DFLASH_PARITY_FORKED_SERVER:-unset}"
  start=$(date +%s.%N)
  DFLASH_PARITY_COMPILE_LOG=/tmp/r96/compiles-$ab.log timeout -s TERM -k 20 75 python3 -m parity.cli check --device cuda \
    --profile gpu --report /tmp/report-$ab --mps $PROD_OFF --jobs 16 > /tmp/r96/run8-$ab.log 2>&1
  echo "exit code: $?; wall $(python3 -c "import time;print(round(time.time()-$start,1))") s"
  grep -E "children forked|prefork used|\[jobs\] .*done in|  time |cases in" /tmp/r96/run8-$ab.log | cut -c1-200 | head -40
  grep -E "variants gone over" /tmp/r96/run8-$ab.log | sed 's/.*kernels: //' | cut -c1-30 | sort | uniq -c | head -4
  echo "fork server lines: $(grep -c "fork server: forked" /tmp/r96/run8-$ab.log) forked, $(grep -c "fork server: a fresh" /tmp/r96/run8-$ab.log) fresh"
  cp /tmp/report-$ab/parity.json /tmp/r96/run8-$ab-parity.json 2>/dev/null
done
cp /tmp/setup.log /tmp/r96/
(cd /tmp && tar -czf $OUT/run96.tgz r96)
echo "all done $(date -u +%T)"
