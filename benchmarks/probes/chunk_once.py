"""One paged chunk (bench_paged_varlen's chunk2048 over a prefix) three ways, twice each, for a profiler:
Runtime.attention over the paged pools, aotc's dense ragged prefill over the same K/V packed (x_dense's
contender) and, with --fa3, FlashAttention-3's flash_attn_varlen_func on the packed K/V (x_fa3's):

    ncu --kernel-name regex:"SdpaPrefillSm90|device_kernel" python benchmarks/probes/chunk_once.py BUNDLE PREFIX [--fa3] \
        [--page P]

--page: the pools' page size (16 unless given; llama's shape, D128 H 32/8).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

import aotc.runtime  # noqa: E402
from benchmarks.bench_paged_varlen import Pool, chunk_case  # noqa: E402

rt = aotc.runtime.load(sys.argv[1])
case = chunk_case(int(sys.argv[2]))
pool = Pool(case.seqs, seed=1, page=int(sys.argv[sys.argv.index("--page") + 1]) if "--page" in sys.argv else 16)
max_kv = max(s for _, s in case.seqs)
kp, vp, cu_kv, _ = pool.packed(range(len(case.seqs)))
d_out = torch.empty_like(pool.out)
for _ in range(2):
    rt.attention(pool.q, pool.k, pool.v, pool.out, pool.cu, pool.sl, pool.pt, max_seqlen_q=pool.max_q,
                 max_seqlen_kv=max_kv)
for _ in range(2):
    rt.prefill_ragged(pool.q, kp, vp, d_out, pool.cu, cu_kv, pool.max_q, max_kv, causal=True)
if "--fa3" in sys.argv:
    from benchmarks.bench_runtime import import_fa3

    fa3 = import_fa3()
    for _ in range(2):
        fa3.flash_attn_varlen_func(pool.q, kp, vp, pool.cu, cu_kv, pool.max_q, max_kv, causal=True)
torch.cuda.synchronize()
print("paged vs dense max abs diff", (pool.out.float() - d_out.float()).abs().max().item())
