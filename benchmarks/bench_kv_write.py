"""KV-cache write (kv_write) against torch's index_copy_ / index_put_ scatter of the same tokens, side by side.

    python benchmarks/bench_kv_write.py --bundle artifacts/default.aotc --out benchmarks/results

H_kv 8, D 128, fp16 and bf16, NHD pools of 16-token pages (65536 pages: 1M slots, 2 GiB a pool), two shapes
of a serving step: a decode step of 256 tokens (each to a random slot of the pool) and a prefill chunk of
8192 tokens (whole pages of one sequence, the pages shuffled). Bytes moved = K and V read and written
(2 * 2 * tokens * H_kv * D * 2) plus the slots read (8 * tokens); GB/s = bytes / time. Every contender runs
as a CUDA graph of 10 calls (host cost hidden), median of 20 replays after an L2 flush, once the clocks
have settled on it; the contenders take turns for --rounds rounds in rotated order, median of rounds
(benchmarks/timing.py). torch's contenders: index_copy_ (dim 0 of the pools viewed [slots, H_kv, D]) and
index_put_ (pool[slots] = key), K then V, as a torch-only engine writes its cache. Also the host cost of
one prepared call (plan.run, raw pointers) and of Runtime.kv_write (torch tensors, the cached plan).

Before timing, each shape is checked: the pools aotc wrote hold exactly the tokens at their slots (bitwise).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.timing import graph_time, interleaved  # noqa: E402

H_KV, D, PAGE, PAGES = 8, 128, 16, 65536
SHAPES = (("decode", 256), ("prefill", 8192))


def slots_for(kind: str, tokens: int, gen):
    """decode: one random slot of the pool per token; prefill: the tokens of one sequence, page after page,
    in shuffled pages."""
    import torch

    if kind == "decode":
        return torch.randperm(PAGES * PAGE, device="cuda", generator=gen)[:tokens].to(torch.int64)
    pages = torch.randperm(PAGES, device="cuda", generator=gen)[: -(-tokens // PAGE)]
    return (pages[:, None] * PAGE + torch.arange(PAGE, device="cuda")[None, :]).flatten()[:tokens].to(torch.int64)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", default=str(ROOT / "artifacts" / "default.aotc"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per shape (median)")
    args = ap.parse_args()
    import torch

    import aotc.runtime
    from benchmarks.bench_runtime import result_header, time_calls

    rt = aotc.runtime.load(args.bundle)
    flush_buf = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, host = [], {}
    for dtype in (torch.bfloat16, torch.float16):
        k_cache = torch.zeros(PAGES, PAGE, H_KV, D, dtype=dtype, device="cuda")
        v_cache = torch.zeros_like(k_cache)
        k_flat, v_flat = k_cache.view(-1, H_KV, D), v_cache.view(-1, H_KV, D)
        for kind, tokens in SHAPES:
            key = torch.randn(tokens, H_KV, D, dtype=dtype, device="cuda", generator=gen)
            value = torch.randn_like(key)
            slots = slots_for(kind, tokens, gen)
            nbytes = 2 * 2 * tokens * H_KV * D * key.element_size() + 8 * tokens
            row = {"shape": kind, "tokens": tokens, "dtype": str(dtype).removeprefix("torch."), "H_kv": H_KV,
                   "D": D, "page": PAGE, "layout": "NHD", "bytes": nbytes}
            try:
                plan = rt.prepare_kv_write(key, value, k_cache, v_cache, slots)
                plan(key, value, slots, stream=torch.cuda.current_stream())
                torch.cuda.synchronize()
                ok = (torch.equal(k_flat[slots].view(torch.int16), key.view(torch.int16))
                      and torch.equal(v_flat[slots].view(torch.int16), value.view(torch.int16)))
                row.update(variant=plan.variant.name, bitwise_ok=ok)
            except Exception as e:
                row["aotc_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            contenders = {}
            if "aotc_error" not in row:
                ptrs = (key.data_ptr(), value.data_ptr(), slots.data_ptr(), tokens)
                contenders["aotc"] = lambda p=plan, a=ptrs: p.run(*a, torch.cuda.current_stream().cuda_stream)

            def index_copy(key=key, value=value, slots=slots, k_flat=k_flat, v_flat=v_flat):
                k_flat.index_copy_(0, slots, key)
                v_flat.index_copy_(0, slots, value)

            def index_put(key=key, value=value, slots=slots, k_flat=k_flat, v_flat=v_flat):
                k_flat.index_put_((slots,), key)
                v_flat.index_put_((slots,), value)

            contenders["torch_index_copy"] = index_copy
            contenders["torch_index_put"] = index_put
            timed = {n: (lambda fn=fn: graph_time(fn, flush_buf.zero_)) for n, fn in contenders.items()}
            samples = interleaved(timed, args.rounds)
            for n, ts in samples.items():
                us = statistics.median(ts)
                row[f"{n}_us"], row[f"{n}_GBps"] = us, nbytes / us / 1e3
                row[f"{n}_spread"] = (max(ts) - min(ts)) / us
            for n in ("torch_index_copy", "torch_index_put"):
                if "aotc_us" in row:
                    row[f"x_{n}"] = row[f"{n}_us"] / row["aotc_us"]
            if "aotc" in contenders and dtype == torch.bfloat16:
                stream = torch.cuda.current_stream().cuda_stream
                host[f"aotc_plan_run_{kind}"] = time_calls(
                    lambda i, f=contenders["aotc"]: f(), 3000, torch.cuda.synchronize)
                host[f"aotc_runtime_kv_write_{kind}"] = time_calls(
                    lambda i, a=(key, value, k_cache, v_cache, slots): rt.kv_write(*a, stream=stream), 3000,
                    torch.cuda.synchronize)
                host[f"torch_index_copy_{kind}"] = time_calls(lambda i, f=index_copy: f(), 3000, torch.cuda.synchronize)
            rows.append(row)
            print(json.dumps({k_: (round(v_, 3) if isinstance(v_, float) else v_) for k_, v_ in row.items()}),
                  flush=True)
            del key, value, slots, contenders
        del k_cache, v_cache, k_flat, v_flat
        torch.cuda.empty_cache()
    result = {**result_header("benchmarks/bench_kv_write.py"), "rows": rows, "host_us": host}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "kv_write.json").write_text(json.dumps(result, indent=1))
    print(f"{'shape':>8} {'tokens':>6} {'dtype':>9} {'aotc GB/s':>10} {'index_copy':>11} {'index_put':>10} "
          f"{'x copy':>7} {'x put':>7}")
    for r in rows:
        print(f"{r['shape']:>8} {r['tokens']:>6} {r['dtype']:>9} {r.get('aotc_GBps', float('nan')):>10.1f} "
              f"{r.get('torch_index_copy_GBps', float('nan')):>11.1f} "
              f"{r.get('torch_index_put_GBps', float('nan')):>10.1f} "
              f"{r.get('x_torch_index_copy', float('nan')):>7.2f} {r.get('x_torch_index_put', float('nan')):>7.2f}")
    for n, v_ in host.items():
        print(n, {k_: round(x, 2) for k_, x in v_.items() if isinstance(x, float)})


if __name__ == "__main__":
    main()
