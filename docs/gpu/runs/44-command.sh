# Run 44 (session 13): one H200 call over main at the commit named in the record; .fib/ carried.
# 1. The SIGINT fix on the machine whose shell blocks SIGINT (run 43): run 40's fp16-over-fp8 check (the policy
#    before out_score_rel, seed 3) in the foreground under `timeout -s INT 75`: its report, the failure kept.
# 2. scripts/fa2_precision.py (GPU, windowed cases now get the lowering and the yardstick) on that failure and on
#    run 41's two worst fp16 cases of the fa2 kernel: |LSE_ref| beside the kernel's LSE error at huge scores.
set -u
export PYTHONUNBUFFERED=1
STEPS=setup NO_FINAL_PACK=1 bash scripts/gpu_session.sh > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR=/tmp/jit/triton TORCHINDUCTOR_CACHE_DIR=/tmp/jit/inductor
grep -v '^out_score_rel' tolerances.toml > /tmp/old_tolerances.toml
R=/tmp/r44; mkdir -p $R
echo "shell mask: $(grep -E 'SigBlk' /proc/$$/status)" > $R/run.log
start=$(date +%s)
timeout -s INT -k 30 ${SIGINT_AT:-75} python3 -m parity.cli check --device cuda --profile gpu --lowering 'context[flashinfer-fa2]' \
  --limit dtypes=float16 --limit kv_dtypes=float8_e4m3fn --seed 3 --max-examples 300 --no-hardening --no-isolate \
  --warm-up --tolerances /tmp/old_tolerances.toml --report /tmp/fp16 > $R/check.log 2>&1
echo "check: exit code $? after $(( $(date +%s) - start )) s; report files: $(ls /tmp/fp16 | tr '\n' ' ')" >> $R/run.log
grep -v "cases, 0 unsupported" $R/check.log | grep -v "warm-up [0-9]" | tail -25 >> $R/run.log
cp -r /tmp/fp16/failures /tmp/fp16/summary.md $R/ 2>/dev/null
shopt -s nullglob; fails=(/tmp/fp16/failures/*.json); shopt -u nullglob
timeout ${PREC_LIMIT:-150} python3 scripts/fa2_precision.py --device cuda --lowering 'context[flashinfer-fa2]' "${fails[@]}" \
  docs/gpu/runs/43-cases/41-decode_rows-worst-ulp-fp16-huge.json docs/gpu/runs/43-cases/41-fa2-worst-ulp-fp16-large.json \
  2>&1 | grep -v "Warning\|warn" > $R/fa2_precision.log
tar -C /tmp -czf $OUT/r44.tgz r44
cat $R/run.log $R/fa2_precision.log
