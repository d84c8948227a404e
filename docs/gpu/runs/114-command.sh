# run 114's call (the same machine, warm, about 20 s after run 113): eight more warm passes each, numbered 5-12
OUT=$OUT BUDGET=430 FILL=0 PASSES=8 FIRST_PASS=5 TREES="new pre48" bash lab/gpu_issue48_phases.sh
