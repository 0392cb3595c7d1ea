"""Decode bandwidth over forced chunk counts (KvChunks target) at a few paged shapes (bf16, D 128, H 32/8, 16-token pages).

    python benchmarks/probes/split_sweep.py     # from the repository root, with artifacts/default.aotc

Prints, per (B, S_kv), "chunks:TB/s" for the default count (first) and each forced one.
"""
import sys, torch
sys.path.insert(0, ".")
import aotc.runtime
from benchmarks.timing import graph_time
rt = aotc.runtime.load("artifacts/default.aotc")
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda").zero_
D, H_q, H_kv = 128, 32, 8
for page in (16,):
    for B, S in ((1, 32768), (8, 8192), (8, 32768), (2, 32768), (4, 16384)):
        n_pages = B * S // page
        k = torch.randn(n_pages, page, H_kv, D, dtype=torch.bfloat16, device="cuda"); v = torch.randn_like(k)
        pt = torch.randperm(n_pages, device="cuda", dtype=torch.int32).view(B, S // page)
        sl = torch.full((B,), S, dtype=torch.int32, device="cuda")
        q = torch.randn(B, 1, H_q, D, dtype=torch.bfloat16, device="cuda"); out = torch.empty_like(q)
        ws = torch.empty(rt.decode_workspace_bytes(B, 1, H_q, D, 256), dtype=torch.uint8, device="cuda")
        res = []
        for splits in (None, 8, 16, 24, 33, 48, 64, 96, 128):
            plan = rt.prepare_decode(q, k, v, out, sl, pt, max_seqlen_kv=S, workspace=ws, chunks=splits)
            us = graph_time(lambda: plan.run(q.data_ptr(), out.data_ptr(), 0, 0, 0, torch.cuda.current_stream().cuda_stream), flush)
            res.append(f"{plan.chunks}:{2*B*S*H_kv*D*2/us/1e6:.2f}")
        print(B, S, " ".join(res), flush=True)
