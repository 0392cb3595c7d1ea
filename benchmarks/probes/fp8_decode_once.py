"""One fp8 and one bf16 decode step of B=64 x 8192 (bf16 D128, H 32/8, page 16) for a profiler (ncu):
    ncu --kernel-name regex:SdpaDecode python benchmarks/probes/fp8_decode_once.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

import aotc.runtime  # noqa: E402
from benchmarks.bench_fp8_kv import Cache  # noqa: E402

rt = aotc.runtime.load(sys.argv[1] if len(sys.argv) > 1 else "artifacts/default.aotc")
c = Cache([8192] * 64, torch.Generator(device="cuda").manual_seed(1))
s = torch.cuda.current_stream()
for _ in range(2):
    rt.decode(c.q, c.k8, c.v8, c.out8, c.sl, c.pt, k_descale=c.k_scale, v_descale=c.v_scale, stream=s)
    rt.decode(c.q, c.k, c.v, c.out16, c.sl, c.pt, stream=s)
torch.cuda.synchronize()
