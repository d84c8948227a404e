"""Time the Triton lowerings on a GPU next to the `sdpa` yardstick (issue: Triton lowerings).

For B in {1, 8, 32}, L in {2K, 8K, 32K}, heads 16/2 and 64/8, K=7, D=128, bf16, page 32:
- `hybrid_paged`: the hybrid paged split-KV kernel (default split plan), replayed in a CUDA graph;
- `merge[triton]`: the one-kernel merge of the later block keys (window 4096 -> right = 4095), in a graph;
- `sdpa`: torch SDPA in bf16 over the same keys, already gathered contiguous (the yardstick's kernel
  alone; the gather from pages is not timed), one batched call with a padding mask.
Median of CUDA-graph replays (triton.testing.do_bench_cudagraph), several input sets rotated is not
needed at these sizes (each case's KV is larger than the 60 MB L2 from L=8K on; L=2K is marked).
Prints a Markdown table and writes JSON to the path given as argv[1] (optional).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F
import triton.testing as tt

from lowerings._hybrid_kernel import hybrid_paged_attention, planned_launches
from lowerings._merge_kernel import merge_future_block_keys_triton


def bench(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return tt.do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3  # us


def main() -> None:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    rows = []
    K, D, ps = 7, 128, 32
    for hq, hkv in ((16, 2), (64, 8)):
        for L in (2048, 8192, 32768):
            for B in (1, 8, 32):
                pages_per = (L + K + ps - 1) // ps
                num_pages = B * pages_per + 1
                k_pool = torch.randn(num_pages, ps, hkv, D, device=dev, dtype=torch.bfloat16)
                v_pool = torch.randn_like(k_pool)
                table = torch.randperm(num_pages - 1, device=dev, dtype=torch.int32)[: B * pages_per].view(B, pages_per)
                ctx = torch.full((B,), L, device=dev, dtype=torch.int32)
                q = torch.randn(B, K, hq, D, device=dev, dtype=torch.bfloat16)
                kb = torch.randn(B, K, hkv, D, device=dev, dtype=torch.bfloat16)
                vb = torch.randn_like(kb)
                out = torch.empty_like(q)
                lse = torch.empty(B, K, hq, device=dev, dtype=torch.float32)
                scale = D ** -0.5
                t_h = bench(lambda: hybrid_paged_attention(q, k_pool, v_pool, table, ctx, kb, vb, scale=scale,
                                                           out=out, lse_out=lse))
                path = "+".join(planned_launches(B, K, hq, hkv, D, pages_per * ps, device=dev))
                lse2 = torch.randn(B, K, hq, device=dev, dtype=torch.float32)
                o_m = torch.empty_like(q)
                l_m = torch.empty_like(lse2)
                t_m = bench(lambda: merge_future_block_keys_triton(q, kb, vb, out, lse2, scale=scale, right=4095,
                                                                   out=o_m, out_lse=l_m))
                # Yardstick kernel: the keys gathered contiguous, GQA expanded as SDPA needs it.
                kc = k_pool[table.long()].reshape(B, pages_per * ps, hkv, D)[:, : L + K]
                vc = v_pool[table.long()].reshape(B, pages_per * ps, hkv, D)[:, : L + K]
                kc = kc.transpose(1, 2).repeat_interleave(hq // hkv, 1).contiguous()
                vc = vc.transpose(1, 2).repeat_interleave(hq // hkv, 1).contiguous()
                qs = q.transpose(1, 2).contiguous()
                t_s = bench(lambda: F.scaled_dot_product_attention(qs, kc, vc, scale=scale))
                kv_bytes = 2 * B * (L + K) * hkv * D * 2
                rows.append({"heads": f"{hq}/{hkv}", "L": L, "B": B, "hybrid_us": round(t_h, 1), "path": path,
                             "hybrid_TBps": round(kv_bytes / (t_h * 1e-6) / 1e12, 2), "merge_triton_us": round(t_m, 1),
                             "sdpa_us": round(t_s, 1)})
                print(rows[-1], flush=True)
                del k_pool, v_pool, kc, vc
                torch.cuda.empty_cache()
    print("\n| heads | L | B | hybrid_paged us | path | KV TB/s | merge[triton] us | sdpa (bf16, contiguous) us |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['heads']} | {r['L']} | {r['B']} | {r['hybrid_us']} | {r['path']} | {r['hybrid_TBps']} | "
              f"{r['merge_triton_us']} | {r['sdpa_us']} |")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
