"""GPU half of the sdpa_prefill_sm90 tuning (see tune_prefill_sm90.py): each configuration's bundle
timed beside torch SDPA's cuDNN backend in one process, after a correctness check.

    python benchmarks/tune_prefill_sm90_gpu.py /tmp/tune/*.aotc > tune.jsonl
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import aotc.runtime
    from timing import event_time

    flush_buf = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    cudnn_ms: dict = {}
    for path in sys.argv[1:]:
        rt = aotc.runtime.load(path)
        name = Path(path).stem
        D = next(iter(rt.kernels["sdpa_prefill_sm90"])).variant["head_dim"]
        for causal in (False, True):
            # correctness first: a small odd shape against the math backend in fp32
            q, k, v = (torch.randn(2, 333, 4, D, dtype=torch.bfloat16, device="cuda") for _ in range(3))
            out = torch.full_like(q, float("nan"))
            rt.prefill(q, k, v, out, causal=causal)
            ref = F.scaled_dot_product_attention(*(x.float().transpose(1, 2) for x in (q, k, v)), is_causal=causal)
            err = float((out.float() - ref.transpose(1, 2)).abs().max())
            row = {"config": name, "D": D, "causal": causal, "max_err": err}
            if not err < 3e-2:
                print(json.dumps(row), flush=True)
                continue
            for S in (2048, 8192, 16384):
                B, H = max(1, 16384 // S), 16
                q, k, v = (torch.randn(B, S, H, D, dtype=torch.bfloat16, device="cuda") for _ in range(3))
                out = torch.empty_like(q)
                flops = 4 * B * H * S * S * D / (2 if causal else 1)
                plan = rt.prepare_prefill(q, k, v, out, causal=causal)
                ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())
                stream = torch.cuda.current_stream().cuda_stream
                ms, _ = event_time(lambda: plan.run(*ptrs, 0, 0, 0, stream), flush_buf.zero_)
                key = (D, causal, S)
                if key not in cudnn_ms:
                    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

                    def call():
                        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                            F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    cudnn_ms[key], _ = event_time(call, flush_buf.zero_)
                row.update({f"S{S}_tflops": round(flops / ms / 1e9, 1),
                            f"S{S}_x_cudnn": round(cudnn_ms[key] / ms, 3)})
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
