"""Prefill kernel time against torch SDPA (flash and cuDNN backends), side by side in one process.

    python benchmarks/bench_prefill.py --bundle artifacts/default.aotc --fa3 --out benchmarks/results

Two aotc columns: "aotc" is what the runtime dispatches to (the Hopper family sdpa_prefill_sm90 on
an H100/H200 when the bundle holds it), "portable" the mma.sync family sdpa_prefill on the same tensors.
--fa3 adds FlashAttention-3 (flash_attn_func of the fa3-fwd wheel, bf16 only) on the same BSHD tensors:
x_fa3 = fa3_ms / aotc_ms (above 1: aotc faster).

Problem: 16k tokens in all, B = 16384 / S, H = 16, packed BSHD, bf16 (and fp16 for D128).
Time (benchmarks/timing.py): each contender first runs untimed for 100 ms of GPU time (the clocks
settle on its power draw), then CUDA events around 10 back-to-back launches, median of 5 trials, an
L2 flush (a 256 MB memset) before each trial; the contenders take turns for `--rounds` rounds, the
order rotated every round, and each reports the median of its rounds (spread: (max - min) / median
over rounds). TFLOP/s = 4*B*H*S*S*D / t, halved when causal.

--ragged adds the rows of issue 24's ragged check (bf16, D128, H 16, causal; case "ragged_..."): one THD
batch of 1 x 16384 + 31 x 512 tokens through the ragged plan (aotc_ms; fa3: flash_attn_varlen_func) against
the same work as two dense calls, B 1 x S 16384 and B 31 x S 512 (dense_ms, their sum):
x_dense = dense_ms / aotc_ms (the goal: >= 0.95).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.timing import event_time, interleaved  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", default=str(ROOT / "artifacts" / "default.aotc"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--causal-only", action="store_true", help="only the causal shapes")
    ap.add_argument("--non-causal-only", action="store_true", help="only the non-causal shapes")
    ap.add_argument("--head-dim", type=int, action="append", choices=(64, 128, 256),
                    help="only these head dims (repeatable; default all)")
    ap.add_argument("--dtype", action="append", choices=("bf16", "fp16"),
                    help="these dtypes at every head dim (repeatable; default bf16 and fp16 at D128, bf16 at D64/D256)")
    ap.add_argument("--skip-portable", action="store_true", help="leave out the portable family (A/B runs of sm90)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per shape (median)")
    ap.add_argument("--heads", type=int, default=16,
                    help="query and KV heads (16; e.g. 33, whose D128/D256 launches of 4224 tiles fill every round "
                         "of 132 SMs: no schedule tail)")
    ap.add_argument("--baseline-bundle", action="append", default=[],
                    help="another bundle (e.g. built from the previous commit): its kernel runs as contender 'base' in "
                         "the same rounds (A/B of a kernel change); repeat for 'base2', 'base3', ...")
    ap.add_argument("--fa3", action="store_true", help="time FlashAttention-3 (the fa3-fwd wheel) on bf16 rows")
    ap.add_argument("--ragged", action="store_true", help="add the ragged THD rows (1 x 16384 + 31 x 512)")
    ap.add_argument("--baseline-family", default="auto", choices=("auto", "sdpa_prefill"),
                    help="the baseline bundle's family: auto (compared with 'aotc') or sdpa_prefill (with 'portable')")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import aotc.runtime
    from benchmarks.bench_runtime import dist_version, import_fa3, load_baselines, result_header

    fa3 = import_fa3() if args.fa3 else None
    rt = aotc.runtime.load(args.bundle)
    rt_bases = load_baselines(args.baseline_bundle)
    flush_buf = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    flush = flush_buf.zero_
    rows = []
    shapes = []
    seqs = (512, 2048, 4096, 8192, 16384)
    for D, dtypes in [(128, ("bf16", "fp16")), (64, ("bf16",)), (256, ("bf16",))]:
        for dtype in args.dtype or dtypes:
            for S in seqs:
                for causal in (False, True):
                    shapes.append((D, dtype, S, causal))
    if args.quick:
        shapes = [s for s in shapes if s[2] in (2048, 8192)]
    if args.head_dim:
        shapes = [s for s in shapes if s[0] in args.head_dim]
    if args.causal_only and args.non_causal_only:
        raise SystemExit("--causal-only and --non-causal-only: give one")
    if args.causal_only or args.non_causal_only:
        shapes = [s for s in shapes if s[3] == args.causal_only]
    for D, dtype, S, causal in shapes:
        H, B = args.heads, max(1, 16384 // S)
        t = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        q, k, v = (torch.randn(B, S, H, D, dtype=t, device="cuda") for _ in range(3))
        out = torch.empty_like(q)
        flops = 4 * B * H * S * S * D / (2 if causal else 1)
        row = {"D": D, "dtype": dtype, "S": S, "B": B, "H": H, "causal": causal, "flops": flops}
        stream = torch.cuda.current_stream().cuda_stream
        ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # torch SDPA wants [B, H, S, D]
        # contenders: "aotc" is what the runtime dispatches to (the Hopper family on an H100/H200 when
        # the bundle has it), "portable" the mma.sync family on the same tensors, then torch's backends
        contenders = {}
        for label, family in (("aotc", "auto"),) + ((("portable", "sdpa_prefill"),) if not args.skip_portable else ()):
            try:
                plan = rt.prepare_prefill(q, k, v, out, causal=causal, family=family)
                row["variant" if label == "aotc" else "portable_variant"] = plan.variant.name
                contenders[label] = (lambda p=plan: p.run(*ptrs, 0, 0, 0, stream))
                if label == "portable" and D == 128 and dtype == "bf16":
                    # what the packed stride specialization buys, same tensors
                    general = rt.prepare_prefill(q, k, v, out, causal=causal, specialize=False, family=family)
                    row["general_variant"] = general.variant.name
                    contenders["general"] = (lambda p=general: p.run(*ptrs, 0, 0, 0, stream))
            except Exception as e:
                row[f"{label}_error"] = f"{type(e).__name__}: {e}"
        for bname, rt_b in rt_bases.items():
            try:
                base = rt_b.prepare_prefill(q, k, v, out, causal=causal, family=args.baseline_family)
                row[f"{bname}_variant"] = base.variant.name
                contenders[bname] = (lambda p=base: p.run(*ptrs, 0, 0, 0, stream))
            except Exception as e:
                row[f"{bname}_error"] = f"{type(e).__name__}: {e}"
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            def call(backend=backend, qt=qt, kt=kt, vt=vt, causal=causal):
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            try:
                call()
                contenders[name] = call
            except Exception as e:
                row[f"{name}_error"] = f"{type(e).__name__}: {e}"
        if fa3 is not None and dtype == "bf16":
            try:
                fa3.flash_attn_func(q, k, v, causal=causal)
                contenders["fa3"] = lambda q=q, k=k, v=v, causal=causal: fa3.flash_attn_func(q, k, v, causal=causal)
            except Exception as e:
                row["fa3_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        # interleaved rounds in rotated order, each contender settled first (benchmarks/timing.py):
        # clock and power drift hits every contender alike instead of whichever ran last
        samples = interleaved({name: (lambda fn=fn: event_time(fn, flush)[0]) for name, fn in contenders.items()},
                              args.rounds)
        for name, ts in samples.items():
            ms = statistics.median(ts)
            row[f"{name}_ms"], row[f"{name}_tflops"] = ms, flops / ms / 1e9
            row[f"{name}_spread"] = (max(ts) - min(ts)) / ms
        for base in ("flash", "cudnn", "fa3"):
            if f"{base}_ms" in row:
                for label in ("aotc", "portable"):
                    if f"{label}_ms" in row:
                        row[("" if label == "aotc" else "portable_") + f"x_{base}"] = row[f"{base}_ms"] / row[f"{label}_ms"]
        against = "portable" if args.baseline_family == "sdpa_prefill" else "aotc"
        for bname in rt_bases:
            if f"{bname}_ms" in row and f"{against}_ms" in row:
                row[f"x_{bname}"] = row[f"{bname}_ms"] / row[f"{against}_ms"]
                for peer in ("cudnn", "fa3"):
                    if f"{peer}_ms" in row:
                        row[f"{bname}_x_{peer}"] = row[f"{peer}_ms"] / row[f"{bname}_ms"]
        if "general_ms" in row and "portable_ms" in row:
            row["packed_speedup"] = row["general_ms"] / row["portable_ms"]
        rows.append(row)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k != "flops"}),
              flush=True)
        del q, k, v, out, qt, kt, vt
    if args.ragged:
        rows.append(ragged_row(rt, rt_bases, fa3, flush, args.rounds))
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in rows[-1].items()}), flush=True)
    header = result_header("benchmarks/bench_prefill.py")
    if fa3 is not None:
        header["fa3"] = dist_version("fa3-fwd")
    result = {**header, "rounds": args.rounds, "rows": rows}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "prefill.json").write_text(json.dumps(result, indent=1))
    nan = float("nan")
    print(f"{'D':>4} {'dt':>5} {'S':>6} {'causal':>6} {'aotc TF/s':>10} {'portable':>9} {'flash':>8} {'cudnn':>8} "
          f"{'x cudnn':>8} {'x fa3':>6} {'port x flash':>12}" + "".join(f" {b + ' x cudnn':>14} {'x ' + b:>8}" for b in rt_bases))
    for r in rows:
        if "case" in r:
            print(f"{r['case']}: aotc {r['aotc_tflops']:.1f} TF/s, x_dense {r['x_dense']:.3f}"
                  + (f", x_fa3 {r['x_fa3']:.3f}" if "x_fa3" in r else ""))
            continue
        print(f"{r['D']:>4} {r['dtype']:>5} {r['S']:>6} {str(r['causal']):>6} {r.get('aotc_tflops', nan):>10.1f} "
              f"{r.get('portable_tflops', nan):>9.1f} {r.get('flash_tflops', nan):>8.1f} {r.get('cudnn_tflops', nan):>8.1f} "
              f"{r.get('x_cudnn', nan):>8.2f} {r.get('x_fa3', nan):>6.2f} {r.get('portable_x_flash', nan):>12.2f}"
              + "".join(f" {r.get(b + '_x_cudnn', nan):>14.2f} {r.get('x_' + b, nan):>8.2f}" for b in rt_bases))


def ragged_row(rt, rt_bases: dict, fa3, flush, rounds: int, lengths=(16384,) + (512,) * 31, D=128, H=16) -> dict:
    """One THD batch of `lengths` (causal, bf16) through the ragged plan against the same work as dense
    calls, one per distinct length (dense_ms: their sum); fa3 and baseline bundles on the ragged batch."""
    import torch

    total = sum(lengths)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(total, H, D, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    out = torch.empty_like(q)
    stream = torch.cuda.current_stream().cuda_stream
    flops = sum(4 * H * s * s * D / 2 for s in lengths)
    row = {"case": "ragged_1x16384_31x512", "D": D, "dtype": "bf16", "H": H, "causal": True,
           "lengths": f"1 x {lengths[0]} + {len(lengths) - 1} x {lengths[1]}", "flops": flops}
    contenders = {}
    for name, r in {"aotc": rt, **rt_bases}.items():
        plan = r.prepare_prefill(q, k, v, out, causal=True, cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                 max_seqlen_q=max(lengths), max_seqlen_kv=max(lengths))
        row[f"{name}_variant"] = plan.variant.name
        contenders[name] = (lambda p=plan: p.run(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), 0,
                                                 cu.data_ptr(), cu.data_ptr(), stream))
    dense_plans = []
    for s in sorted(set(lengths), reverse=True):
        b = lengths.count(s)
        dq, dk, dv = (torch.randn(b, s, H, D, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        do = torch.empty_like(dq)
        dense_plans.append((rt.prepare_prefill(dq, dk, dv, do, causal=True), dq, dk, dv, do))
    row["dense_variants"] = [p.variant.name for p, *_ in dense_plans]

    def dense():
        for p, dq, dk, dv, do in dense_plans:
            p.run(dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), do.data_ptr(), 0, 0, 0, stream)
    contenders["dense"] = dense
    if fa3 is not None:
        contenders["fa3"] = lambda: fa3.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)
    samples = interleaved({name: (lambda fn=fn: event_time(fn, flush)[0]) for name, fn in contenders.items()}, rounds)
    for name, ts in samples.items():
        ms = statistics.median(ts)
        row[f"{name}_ms"], row[f"{name}_tflops"] = ms, flops / ms / 1e9
        row[f"{name}_spread"] = (max(ts) - min(ts)) / ms
    for name in ("dense", "fa3", *rt_bases):
        if f"{name}_ms" in row:
            row[f"x_{name}"] = row[f"{name}_ms"] / row["aotc_ms"]
    return row


if __name__ == "__main__":
    main()
