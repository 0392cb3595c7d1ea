"""Two Runtime.attention calls of one paged chunk (bench_paged_varlen's chunk2048 over a prefix) over the bf16
pools, then two over their e4m3 copies, for a profiler:

    ncu --kernel-name regex:SdpaPrefillSm90 python benchmarks/probes/paged_fp8_once.py BUNDLE [PREFIX]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

import aotc.runtime  # noqa: E402
from benchmarks.bench_paged_varlen import Pool, chunk_case  # noqa: E402

rt = aotc.runtime.load(sys.argv[1])
case = chunk_case(int(sys.argv[2]) if len(sys.argv) > 2 else 8192)
pool = Pool(case.seqs, seed=1)
k8, v8, ks, vs = pool.fp8()
bounds = {"max_seqlen_q": pool.max_q, "max_seqlen_kv": max(s for _, s in case.seqs)}
s = torch.cuda.current_stream()
for _ in range(2):
    rt.attention(pool.q, pool.k, pool.v, pool.out, pool.cu, pool.sl, pool.pt, stream=s, **bounds)
for _ in range(2):
    rt.attention(pool.q, k8, v8, pool.out, pool.cu, pool.sl, pool.pt, k_descale=ks, v_descale=vs, stream=s, **bounds)
torch.cuda.synchronize()
