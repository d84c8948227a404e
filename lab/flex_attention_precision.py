"""Why PyTorch's eager `flex_attention` passed, then failed, then passes the default verdict at `huge` fp16 scores
(docs/lab/flex-attention.md): its error on near-tie cases, next to the fp32 oracle's own error and a model of its
arithmetic (torch's `math_attention`: fp32 scores, the softmax normalized in fp32, P rounded to the working dtype, P.V in
the working dtype).

    PYTHONPATH=. python lab/flex_attention_precision.py [SEEDS]

One line per case: errors in working-dtype ulps of max|O| against the fp64 truth; the old verdict (fp32 oracle,
`rounded-oracle` yardstick, no score term) and the new one (the golden oracle, `working-dtype` yardstick).
"""

from __future__ import annotations

import dataclasses
import sys

import torch

import lowerings
from oracle import materialize
from oracle.reference import attention
from oracle.ulp import ulp
from parity.engine import yardstick
from parity.engine.golden import GoldenOracle
from parity.engine.judge import compare
from parity.engine.policy import load as load_policy
from tests.oracle.oracle_cases import build_case

sys.argv += [] if len(sys.argv) > 1 else ["177,317,364,0,1,2"]
import examples.plugin_flex_attention  # noqa: E402,F401  (registers flex_attention)


def main() -> int:
    pol = load_policy(None)
    new_tol = pol.for_case("flex_attention", "float16", ())[0]
    old_tol = dataclasses.replace(new_tol, yardstick_score_rel=0.0)
    flex = lowerings.get("flex_attention")
    print("seed  flex/truth  fp32-oracle/truth  flex/fp32-oracle  old verdict (margin)   new verdict (margin)")
    for seed in (int(s) for s in sys.argv[1].split(",")):
        case = dataclasses.replace(build_case((128,), 1, 3, 6, 128, 16, dtype="float16"), values="huge", seed=seed)
        x = materialize(case, "cpu")
        truth = attention(x, precision=torch.float64)
        fp32 = attention(x)
        out = flex.run(x)
        u = ulp(truth.out.abs().max().item(), "float16")
        e = lambda a, b: (a.double() - b.double()).abs().max().item() / u  # noqa: E731
        old = compare("output", out.out, out.lse, fp32.out, fp32.lse, dtype="float16", tol=old_tol,
                      yardstick_out=yardstick.get(yardstick.ROUNDED_ORACLE).output(x, fp32.out))
        g = GoldenOracle(x, new_tol)
        ref = g.confirm(new_tol, g.attention())
        new = compare("output", out.out, out.lse, ref.out, ref.lse, dtype="float16", tol=new_tol,
                      yardstick_out=yardstick.get(yardstick.DEFAULT).output(x))
        verdict = lambda c: f"{'pass' if c.passed else 'FAIL'} ({c.margin:.2f})"  # noqa: E731
        print(f"{seed:4d}  {e(out.out, truth.out):10.2f}  {e(fp32.out, truth.out):17.2f}  {e(out.out, fp32.out):16.2f}"
              f"  {verdict(old):21s}  {verdict(new)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
