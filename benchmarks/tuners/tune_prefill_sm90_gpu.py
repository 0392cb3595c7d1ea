"""GPU half of the sdpa_prefill_sm90 tuning (see tune_prefill_sm90.py): after a correctness check,
every configuration's bundle of a head dim and torch SDPA's cuDNN backend are timed in one process,
in interleaved rounds with the clocks settled on each (benchmarks/timing.py).

    python benchmarks/tuners/tune_prefill_sm90_gpu.py /tmp/tune/*.aotc > tune.jsonl
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    import statistics

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import aotc.runtime
    from benchmarks.timing import event_time, interleaved

    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda").zero_
    runtimes = {Path(p).stem: aotc.runtime.load(p) for p in sys.argv[1:]}
    head_dim = {name: next(iter(rt.kernels["sdpa_prefill_sm90"])).variant["head_dim"] for name, rt in runtimes.items()}
    rows = {}
    for causal in (False, True):
        # correctness first: a small odd shape against the math backend in fp32; a configuration that
        # fails is reported and not timed
        for name, rt in runtimes.items():
            D = head_dim[name]
            q, k, v = (torch.randn(2, 333, 4, D, dtype=torch.bfloat16, device="cuda") for _ in range(3))
            out = torch.full_like(q, float("nan"))
            rt.prefill(q, k, v, out, causal=causal)
            ref = F.scaled_dot_product_attention(*(x.float().transpose(1, 2) for x in (q, k, v)), is_causal=causal)
            err = float((out.float() - ref.transpose(1, 2)).abs().max())
            rows[name, causal] = {"config": name, "D": D, "causal": causal, "max_err": err}
        # then every configuration of a head dim and cuDNN in interleaved rounds (benchmarks/timing.py)
        for D in sorted(set(head_dim.values())):
            for S in (2048, 8192, 16384):
                B, H = max(1, 16384 // S), 16
                q, k, v = (torch.randn(B, S, H, D, dtype=torch.bfloat16, device="cuda") for _ in range(3))
                out = torch.empty_like(q)
                flops = 4 * B * H * S * S * D / (2 if causal else 1)
                ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())
                stream = torch.cuda.current_stream().cuda_stream
                contenders = {}
                for name, rt in runtimes.items():
                    if head_dim[name] == D and rows[name, causal]["max_err"] < 3e-2:
                        plan = rt.prepare_prefill(q, k, v, out, causal=causal)
                        contenders[name] = lambda p=plan: p.run(*ptrs, 0, 0, 0, stream)
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

                def cudnn():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                contenders["cudnn"] = cudnn
                samples = interleaved({n: (lambda fn=fn: event_time(fn, flush)[0]) for n, fn in contenders.items()},
                                      rounds=3)
                ms = {n: statistics.median(ts) for n, ts in samples.items()}
                for name in contenders:
                    if name != "cudnn":
                        rows[name, causal].update({f"S{S}_tflops": round(flops / ms[name] / 1e9, 1),
                                                   f"S{S}_x_cudnn": round(ms["cudnn"] / ms[name], 3)})
    for row in rows.values():
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
