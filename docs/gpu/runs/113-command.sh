# run 113's call (session 35, a fresh H100, carry .fib .pre48 .base): the set-up, a fill pass each, then warm passes
# alternating (this tree 7971578 and .pre48/ = 7023d6d, the tree just before issue 48), BUDGET s for all the sweeps
OUT=$OUT BUDGET=500 FILL=190 PASSES=3 TREES="new pre48" bash lab/gpu_issue48_phases.sh
