"""Host cost of one attention call through each layer of aotc, beside torch SDPA and FA3's op, one process.

    python benchmarks/bench_host.py --bundle artifacts/default.aotc --fa3 --out benchmarks/results

Decode step as a serving engine makes it: B 8, S_q 1, H_q/H_kv 32/8, D 128, pages of 16, 4k context,
bf16; prefill: B 1, S 512, H 16, D 128 (dense) and the same tokens as a varlen batch of 4. Every call
gets new q/out tensors' pointers as a serving loop would (a ring of 8), the GPU is synchronized every 256
calls outside the timer, each call timed alone with perf_counter_ns: median and p99 of --calls calls.
Rows: the bare cuLaunchKernel of the decode cubin through cuda-bindings (the floor) and through the
runtime's ctypes Launcher, DecodePlan.run (raw pointers),
DecodePlan(tensors), Runtime.decode (one call, cached plan), the torch ops (with caller buffers, and the
allocating forms), torch SDPA (cuDNN), FA3's flash_attn_with_kvcache. Writes host.json.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", default=str(ROOT / "artifacts" / "default.aotc"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--fa3", action="store_true")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    from cuda.bindings import driver as cu
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import aotc.runtime
    import aotc.torch
    from benchmarks.bench_runtime import git_commit, import_fa3, time_calls

    rt = aotc.runtime.load(args.bundle)
    aotc.torch.set_runtime(rt)
    sync = torch.cuda.synchronize
    n = args.calls
    B, H_q, H_kv, D, page, L = 8, 32, 8, 128, 16, 4096
    pages = B * L // page
    k = torch.randn(pages, page, H_kv, D, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    pt = torch.randperm(pages, device="cuda", dtype=torch.int32).view(B, L // page)
    sl = torch.full((B,), L, dtype=torch.int32, device="cuda")
    ring = 8
    qs = [torch.randn(B, 1, H_q, D, dtype=torch.bfloat16, device="cuda") for _ in range(ring)]
    outs = [torch.empty_like(qs[0]) for _ in range(ring)]
    lses = [torch.empty(B, H_q, 1, device="cuda") for _ in range(ring)]
    stream = torch.cuda.current_stream().cuda_stream
    plan = rt.prepare_decode(qs[0], k, v, outs[0], sl, pt, lses[0])
    plan(qs[0], outs[0], lses[0], stream=stream)
    sync()
    lau = plan.launcher
    kern, cs, g, blk = cu.CUkernel(lau.handle), cu.CUstream(stream), lau.grid, lau.block
    rows = []

    def row(call, fn):
        fn(0)
        sync()
        r = time_calls(fn, n, sync)
        rows.append({"call": call, "median_us": round(r["median_us"], 2), "p99_us": round(r["p99_us"], 2),
                     "calls": n})
        print(json.dumps(rows[-1]), flush=True)

    row("bare cuLaunchKernel (decode cubin)", lambda i: cu.cuLaunchKernel(
        kern, g[0], g[1], g[2], blk[0], blk[1], blk[2], lau.smem, cs, lau.params.address, 0))
    row("bare aotc Launcher (ctypes, prebuilt arguments: what Plan.run ends in)", lambda i: lau.launch(stream))
    ptrs = [(q.data_ptr(), o.data_ptr(), ls.data_ptr()) for q, o, ls in zip(qs, outs, lses)]
    row("DecodePlan.run(pointers)", lambda i: plan.run(*ptrs[i % ring], 0, 0, stream))
    row("DecodePlan(q, out, lse) torch tensors", lambda i: plan(qs[i % ring], outs[i % ring], lses[i % ring],
                                                                  stream=stream))
    row("Runtime.decode (one call, cached plan)", lambda i: rt.decode(
        qs[i % ring], k, v, outs[i % ring], sl, pt, lses[i % ring], stream=stream))
    op = torch.ops.aotc
    row("torch.ops.aotc.decode_out (caller buffers)", lambda i: op.decode_out(
        qs[i % ring], k, v, sl, pt, outs[i % ring], lses[i % ring], None, "NHD", None, None))
    row("torch.ops.aotc.decode (allocates out, lse)", lambda i: op.decode(
        qs[i % ring], k, v, sl, pt, None, "NHD", None, None))
    # torch SDPA (cuDNN) on the same decode step over dense KV
    kd = k[pt.long()].reshape(B, L, H_kv, D).transpose(1, 2).contiguous()
    vd = v[pt.long()].reshape(B, L, H_kv, D).transpose(1, 2).contiguous()
    qts = [q.transpose(1, 2) for q in qs]

    def sdpa(i):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(qts[i % ring], kd, vd, enable_gqa=True)

    row("torch SDPA cuDNN (decode step, dense KV)", sdpa)
    if args.fa3:
        fa3 = import_fa3()
        kdn, vdn = kd.transpose(1, 2).contiguous(), vd.transpose(1, 2).contiguous()
        row("FA3 flash_attn_with_kvcache (its op, dense KV)", lambda i: fa3.flash_attn_with_kvcache(
            qs[i % ring], kdn, vdn, cache_seqlens=sl, causal=True))
    # prefill: dense B 1 x 512, and the same tokens as a varlen batch of 4 sequences
    S, H = 512, 16
    pq = [torch.randn(1, S, H, D, dtype=torch.bfloat16, device="cuda") for _ in range(ring)]
    pk, pv = torch.randn_like(pq[0]), torch.randn_like(pq[0])
    po = [torch.empty_like(pq[0]) for _ in range(ring)]
    pl = [torch.empty(1, H, S, device="cuda") for _ in range(ring)]
    row("torch.ops.aotc.prefill_out (caller buffers)", lambda i: op.prefill_out(
        pq[i % ring], pk, pv, po[i % ring], pl[i % ring], True, None))
    row("torch.ops.aotc.prefill (allocates out, lse)", lambda i: op.prefill(pq[i % ring], pk, pv, True, None))
    row("Runtime.prefill (one call, cached plan)", lambda i: rt.prefill(
        pq[i % ring], pk, pv, po[i % ring], pl[i % ring], causal=True, stream=stream))
    cu_q = torch.tensor([0, 128, 256, 384, 512], dtype=torch.int32, device="cuda")
    vq = [x[0] for x in pq]
    vo = [x[0] for x in po]
    vl = [torch.empty(H, S, device="cuda") for _ in range(ring)]
    row("torch.ops.aotc.prefill_varlen_out (caller buffers)", lambda i: op.prefill_varlen_out(
        vq[i % ring], pk[0], pv[0], cu_q, cu_q, 128, 128, vo[i % ring], vl[i % ring], True, None))
    pqt = [x.transpose(1, 2) for x in pq]
    pkt, pvt = pk.transpose(1, 2), pv.transpose(1, 2)

    def sdpa_prefill(i):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(pqt[i % ring], pkt, pvt, is_causal=True)

    row("torch SDPA cuDNN (prefill B 1 x 512)", sdpa_prefill)
    floor = rows[0]["median_us"]
    sdpa_us = next(r["median_us"] for r in rows if r["call"].startswith("torch SDPA cuDNN (decode"))
    for r in rows:
        r["x_bare_launch"] = round(r["median_us"] / floor, 3)
        r["x_torch_sdpa"] = round(r["median_us"] / sdpa_us, 3)
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": torch.cuda.get_device_name(0),
              "driver": subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True).stdout.strip(),
              "torch": torch.__version__, "git_commit": git_commit(),
              "command": "python benchmarks/bench_host.py " + " ".join(sys.argv[1:]),
              "decode_shape": {"B": B, "S_q": 1, "H_q": H_q, "H_kv": H_kv, "D": D, "page": page, "context": L},
              "rows": rows}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "host.json").write_text(json.dumps(result, indent=1))
    for r in rows:
        print(f"{r['median_us']:8.2f} us  p99 {r['p99_us']:8.2f}  x bare {r['x_bare_launch']:5.2f}  "
              f"x sdpa {r['x_torch_sdpa']:5.2f}  {r['call']}")


if __name__ == "__main__":
    main()
