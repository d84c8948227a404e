# Run 40 (session 12): one H200 call over main at the commit named in the record; .fib/ carried (flashinfer bundle,
# the pack of all 42 modules, fa3's included).
# 1. Run 39's lost failures: the fa2 context lowering on fp16 queries over fp8 KV pools, seed 3, until a failure
#    (kept even if the limit stops its shrinking); each failure file replayed with format 3's values and, the
#    same case as format 2, with format 2's; scripts/fa2_precision.py on both.
# 2. Issue 18: run 11's sweep (the 11 GPU lowerings x 500 cases, --jobs 15, the compiled merge in 5 shards,
#    --warm-up, no hardening, in process) on this fresh machine: pass 1 with cold Triton/inductor caches, pass 2 warm.
set -u
STEPS=check CHECK_ARGS="--lowering context[flashinfer-fa2] --limit dtypes=float16 --limit kv_dtypes=float8_e4m3fn --seed 3 --max-examples 60 --no-hardening --no-isolate --warm-up" \
  CHECK_TIMEOUT=${FP16_TIMEOUT:-90} NO_FINAL_PACK=1 bash scripts/gpu_session.sh
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/fp16
for f in /tmp/report/failures/*.json; do
  [ -f "$f" ] || continue
  b=$(basename "$f" .json); cp "$f" "$OUT/fp16/$b.json"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); c=d.get('case', d); c['version']=2; json.dump(d, open(sys.argv[2],'w'))" "$f" "$OUT/fp16/$b-v2.json"
  for g in "$OUT/fp16/$b.json" "$OUT/fp16/$b-v2.json"; do
    echo "== repro $g"; timeout 60 python3 -m parity.cli repro "$g" --device cuda --no-isolate 2>&1 | grep -v "Warning\|warn" | tail -12
  done
  echo "== fa2_precision"; timeout 90 python3 scripts/fa2_precision.py --device cuda --lowering 'context[flashinfer-fa2]' \
    "$OUT/fp16/$b.json" "$OUT/fp16/$b-v2.json" 2>&1 | grep -v "Warning\|warn" | tail -40
done
tar -C $OUT -czf $OUT/fp16.tgz fp16 && rm -rf $OUT/fp16
mv $OUT/gpu_session.log $OUT/fp16-gpu_session.log; mv $OUT/report.tgz $OUT/fp16-report.tgz
STEPS=sweep SWEEP_PASSES=2 SWEEP_JOBS=15 SWEEP_EXTRA='--shards windowed_merge[flashinfer-compiled]=5' \
  SWEEP_TIMEOUT=${COLD_TIMEOUT:-200} SWEEP_TIMEOUT_LATER=${WARM_TIMEOUT:-100} NO_FINAL_PACK=1 bash scripts/gpu_session.sh
