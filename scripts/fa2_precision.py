"""Why a flash kernel's output error exceeds the yardstick's on a case: models of its rounding, measured.

    python scripts/fa2_precision.py [--device cuda] [--lowering NAME ...] CASE.json [CASE.json ...]

For each case file (a failure file or a bare case), on the inputs `materialize(case, device)` builds:
the oracle in fp64 (the reference every error below is taken against); the judge's yardstick (the working
dtype's arithmetic in the order of flash kernels, `oracle.reference.working_dtype_output`) and torch SDPA in the
working dtype (the yardstick before issue 47); every `--lowering` given
(on CUDA, e.g. `context[flashinfer-fa2]`); and three models of a flash kernel's arithmetic, each exact
in fp32 but for the one rounding it names:
- `P rounded`: the probabilities `exp(s - m)` relative to the row's max rounded to the working dtype
  before `P @ V` (a flash kernel's tensor-core product), the denominator summed from the unrounded ones
  (what `lowerings.paged.attend`, the torch `context` lowering, computes: `--lowering context` agrees);
- `P rounded, tiles of 128`: the same with the running max of 128-key tiles, as a kernel sees them;
- `scores rounded`: the scores `scale * q.k` rounded to the working dtype before the softmax;
- `scores off by 2^-15`: each score multiplied by `1 + 2^-15 n` (n standard normal, seeded): a kernel
  whose scores carry a relative error of that size, which its LSE error shows (|LSE| times it).
A windowed case gets the lowerings and the yardsticks only (the models attend every key). Each line gives
the max |O - O_ref| in ulps of the working dtype at max |O_ref| (the judge's unit), the
relative L2 error and the LSE error; then, for the worst element of the first lowering (or of the
`P rounded` model), the row's largest probabilities and the spread of its values.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from oracle.case import Case  # noqa: E402
from oracle.inputs import materialize  # noqa: E402
from oracle.reference import attention, working_dtype_output  # noqa: E402

MANTISSA = {torch.bfloat16: 7, torch.float16: 10}


def _ulp(x: float, dtype: torch.dtype) -> float:
    return 2.0 ** (math.floor(math.log2(max(x, 1e-30))) - MANTISSA[dtype])


def _keys(inputs, b: int):
    """Request b's logical keys and values `[L+K, Hkv, D]` in the working dtype (pool pages, then the block)."""
    from lowerings import paged

    c = inputs.case
    L, ps = inputs.context_lens_host[b], c.page_size
    t = torch.arange(L, device=inputs.device)
    pid = inputs.page_table[b].to(torch.long)[t // ps]
    dt = inputs.q.dtype
    k = torch.cat([paged.read_pool(inputs.k_pool, pid, t % ps, c.layout, c.k_scale, dt), inputs.k_block[b]])
    v = torch.cat([paged.read_pool(inputs.v_pool, pid, t % ps, c.layout, c.v_scale, dt), inputs.v_block[b]])
    return k, v


def models(inputs) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """`{name: (O [B, K, Hq, D] fp32, LSE [B, K, Hq] natural log)}` of the three rounding models."""
    c = inputs.case
    dt, G, K = inputs.q.dtype, c.group_size, c.block_size
    names = ("P rounded", "P rounded, tiles of 128", "scores rounded", "scores off by 2^-15")
    gen = torch.Generator(device=inputs.device).manual_seed(0)
    out = {n: (torch.zeros(inputs.q.shape, dtype=torch.float32, device=inputs.device),
               torch.zeros(inputs.q.shape[:3], dtype=torch.float32, device=inputs.device)) for n in names}
    if c.window != (-1, -1):
        raise ValueError("fa2_precision.py's models attend every key (window (-1, -1))")
    for b in range(c.batch_size):
        k, v = _keys(inputs, b)
        q = inputs.q[b].float()  # [K, Hq, D]
        kf, vf = k.float(), v.float()
        for h in range(c.num_kv_heads):
            qh = q[:, h * G:(h + 1) * G].reshape(K * G, -1)  # rows in (i, g) order
            s = (qh @ kf[:, h].T) * c.softmax_scale  # [K*G, T] fp32
            m = s.max(dim=1, keepdim=True).values
            p = torch.exp(s - m)
            lse = (m.squeeze(1) + p.sum(1).log())
            res = {"P rounded": ((p.to(dt).float() @ vf[:, h]) / p.sum(1, keepdim=True), lse)}
            acc = torch.zeros((K * G, vf.shape[-1]), device=s.device)
            run_m = torch.full((K * G, 1), -math.inf, device=s.device)
            den = torch.zeros((K * G, 1), device=s.device)
            for t0 in range(0, s.shape[1], 128):
                st = s[:, t0:t0 + 128]
                new_m = torch.maximum(run_m, st.max(1, keepdim=True).values)
                alpha = torch.exp(run_m - new_m)
                pt = torch.exp(st - new_m)
                acc = acc * alpha + pt.to(dt).float() @ vf[t0:t0 + 128, h]
                den = den * alpha + pt.sum(1, keepdim=True)
                run_m = new_m
            res["P rounded, tiles of 128"] = (acc / den, (run_m + den.log()).squeeze(1))
            sr = s.to(dt).float()
            mr = sr.max(dim=1, keepdim=True).values
            pr = torch.exp(sr - mr)
            res["scores rounded"] = ((pr @ vf[:, h]) / pr.sum(1, keepdim=True), mr.squeeze(1) + pr.sum(1).log())
            sp = s * (1 + 2.0 ** -15 * torch.randn(s.shape, generator=gen, device=s.device))
            mp = sp.max(dim=1, keepdim=True).values
            pp = torch.exp(sp - mp)
            res["scores off by 2^-15"] = ((pp @ vf[:, h]) / pp.sum(1, keepdim=True), mp.squeeze(1) + pp.sum(1).log())
            for n, (o, l) in res.items():
                out[n][0][b, :, h * G:(h + 1) * G] = o.view(K, G, -1)
                out[n][1][b, :, h * G:(h + 1) * G] = l.view(K, G)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--lowering", action="append", default=[], metavar="NAME")
    ap.add_argument("case", nargs="+")
    args = ap.parse_args(argv)
    from lowerings import registry
    from lowerings.protocol import lse_to_natural
    from lowerings.torch_emulation import Sdpa

    for path in args.case:
        d = json.load(open(path))
        case = Case.from_json_dict(d.get("case", d))
        inputs = materialize(case, args.device)
        dt = inputs.q.dtype
        ref = attention(inputs, precision=torch.float64)
        o_ref, lse_ref = ref.out.float(), ref.lse.float()
        top = float(o_ref.abs().max())
        unit = _ulp(top, dt)
        lse_top = float(lse_ref.abs().nan_to_num(0.0, posinf=0.0, neginf=0.0).max())
        print(f"== {os.path.basename(path)} on {args.device}: {case.short()} values={case.values}; "
              f"max |O_ref| {top:.4g}, ulp {unit:.3g}; max |LSE_ref| {lse_top:.6g}")
        full = case.window == (-1, -1)  # the models (and the worst row's detail) attend every key
        results: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
        for name in args.lowering:
            low = registry.get(name)
            r = low.run(materialize(case, args.device))
            results[name] = (r.out.float(), None if r.lse is None else lse_to_natural(r.lse.float(), low.lse_base))
        results["the yardstick (working dtype)"] = (working_dtype_output(inputs).float(), None)
        results["sdpa (working dtype)"] = (Sdpa().run_output(inputs).float(), None)
        if full:
            for n, (o, l) in models(inputs).items():
                results[f"model: {n}"] = (o.to(dt).float(), l)
        else:
            print(f"   (window {case.window}: the models attend every key, so they are not run on this case)")
        for name, (o, l) in results.items():
            err = (o - o_ref).abs()
            rel = float(err.norm() / o_ref.norm().clamp_min(1e-30))
            lse = "" if l is None else f", LSE error {float((l - lse_ref).abs().nan_to_num(0.0).max()):.3g}"
            print(f"   {name:32s} max error {float(err.max()):.4g} = {float(err.max()) / unit:5.2f} ulp, "
                  f"rel L2 {rel:.3g}{lse}")
        if not full:
            continue
        first = next(iter(results))
        err = (results[first][0] - o_ref).abs()
        b, i, hq, dd = (int(x) for x in torch.unravel_index(err.argmax(), err.shape))
        k, v = _keys(inputs, b)
        G = case.group_size
        s = (inputs.q[b, i, hq].float() @ k[:, hq // G].float().T) * case.softmax_scale
        p = torch.softmax(s, 0)
        pv = torch.sort(p, descending=True)
        vals = v[:, hq // G, dd].float()
        print(f"   worst element of {first}: b={b} i={i} h={hq} d={dd}; its row's 5 largest p "
              f"{[round(float(x), 5) for x in pv.values[:5]]}, their v {[round(float(vals[j]), 3) for j in pv.indices[:5]]}; "
              f"score range {float(s.min()):.1f} .. {float(s.max()):.1f}; O_ref {float(o_ref[b, i, hq, dd]):.4f}; "
              f"LSE_ref {float(lse_ref[b, i, hq]):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
