"""Which contender of bench_decode_varlen's heavy-tailed case faults (one contender per process, since a
fault poisons the context): eager calls, then a CUDA graph of 10 replayed 20 times, synchronized each.

    python benchmarks/probes/varlen_fault.py {aotc,legacy,fa3,uniform} [BASELINE.aotc]
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import aotc.runtime  # noqa: E402
from benchmarks.bench_decode_varlen import Paged, heavy_tailed  # noqa: E402
from benchmarks.bench_runtime import import_fa3  # noqa: E402

which = sys.argv[1]
lengths = heavy_tailed(128)
gen = torch.Generator(device="cuda").manual_seed(1)
cache = Paged([sum(lengths) // 128] * 128 if which == "uniform" else lengths, gen)
cur = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
if which in ("aotc", "uniform"):
    rt = aotc.runtime.load(str(ROOT / "artifacts" / "default.aotc"))
    plan = rt.prepare_decode(cache.q, cache.k, cache.v, cache.out, cache.sl, cache.pt)
    fn = lambda: plan.run(cache.q.data_ptr(), cache.out.data_ptr(), 0, 0, 0, cur())  # noqa: E731
elif which == "legacy":
    from benchmarks.legacy import LegacyDecode, legacy_decode_kernels

    kern = legacy_decode_kernels(sys.argv[2])[("bf16", 128, "paged16")]
    base = LegacyDecode(kern, cache.q, cache.k, cache.v, cache.out, cache.sl, cache.pt, max(lengths), 132)
    fn = lambda: base(cur())  # noqa: E731
else:
    fa3 = import_fa3()
    kd, vd = cache.dense()
    fn = lambda: fa3.flash_attn_with_kvcache(cache.q, kd, vd, cache_seqlens=cache.sl, causal=True)  # noqa: E731
for _ in range(3):
    fn()
    torch.cuda.synchronize()
print(which, "eager ok", flush=True)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    fn()
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    for _ in range(10):
        fn()
for _ in range(20):
    g.replay()
    torch.cuda.synchronize()
print(which, "graph ok", flush=True)
