# call A: where a production-scale case's time goes (cProfile, one process per lowering, no ledger wait),
# then the flashinfer modules still missing (fa3 fp16, ...) compiled and packed for the next machine.
set -m
source gpu_calls/setup.sh
i=0
for L in 'decode_rows[flashinfer-tc]' 'context' 'context[flashinfer-fa2]' 'windowed_merge[eager]'; do
  i=$((i+1))
  timeout -s INT -k 20 110 python3 -m cProfile -o $OUT/prof$i.pstats -m parity.cli check --device cuda --profile gpu \
    --lowering "$L" --max-examples 30 --no-isolate --report $OUT/prof$i > $OUT/prof$i.log 2>&1 &
done
timeout -s INT -k 20 110 python3 -m parity.cli check --device cuda --profile gpu --lowering 'decode_rows[flashinfer-tc]' \
    --max-examples 30 --report $OUT/iso5 > $OUT/iso5.log 2>&1 &
wait
date -u +%T; for f in $OUT/prof*.log $OUT/iso5.log; do echo "== $f"; grep -i "cases/s\|interrupted\|exit\|FAIL\|pass" $f | tail -5; done
timeout -s INT -k 20 260 python3 -m parity.warmup --jobs 10 'context[flashinfer-fa3]' 'context[flashinfer-fa2]' \
  'decode_rows[flashinfer]' 'decode_rows[flashinfer-tc]' 'windowed_merge[flashinfer-eager]' \
  'windowed_merge[flashinfer-triton]' 'windowed_merge[flashinfer-merge_state]' > $OUT/warmup.log 2>&1
echo "warmup exit $?"; tail -30 $OUT/warmup.log
python3 .fib/flashinfer_aot.py pack $OUT/fi_aot_3.tar.xz
date -u +%T
