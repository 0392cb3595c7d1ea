"""Can a mixed step's two kernels run side by side? Runtime.attention runs a step that mixes decode rows with a
prefill chunk as two launches on one stream (the decode kernel, then the paged prefill kernel), so the step
takes the sum of their times although one is bound by the tensor cores and the other by DRAM. With
prefill_sms=P the paged kernel's persistent grid is cut to P CTAs (P of the SMs) and the decode kernel runs on
the runtime's second stream, forked and joined with events (inside the timed CUDA graph), so its CTAs take the
other SMs (and each SM the paged kernel leaves): fork_P<P> against the call without it (seq), beside each kernel
alone (prefill_only: all SMs, decode_only).

    python benchmarks/probes/mixed_overlap.py BUNDLE [--rounds N] [--out FILE]

Each contender writes its own NaN-poisoned out, checked against seq's (max_abs_diff_vs_seq). Timing as
bench_paged_varlen: CUDA graphs of 10 calls, L2 flushed before each replay, contenders interleaved.
"""
import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import aotc  # noqa: E402
from benchmarks.bench_paged_varlen import Pool, rounded  # noqa: E402
from benchmarks.timing import graph_time, interleaved, medians  # noqa: E402

CASES = {
    "chunk2048_decode63x4096": ((2048, 2048),) + ((1, 4096),) * 63,
    "chunk2048_prefix8192_decode63x4096": ((2048, 10240),) + ((1, 4096),) * 63,
    "chunk2048_prefix4096_decode63x8192": ((2048, 6144),) + ((1, 8192),) * 63,
    "chunk512_decode127x8192": ((512, 512),) + ((1, 8192),) * 127,
    "chunks4x512_decode60x8192": ((512, 512), (512, 4096), (512, 8704), (512, 1536)) + ((1, 8192),) * 60,
    "chunk2048_prefix2048_decode63x4096": ((2048, 4096),) + ((1, 4096),) * 63,
    "chunk1024_decode63x4096": ((1024, 1024),) + ((1, 4096),) * 63,
}
GRIDS = tuple(int(g) for g in os.environ.get("MIXED_OVERLAP_GRIDS", "120,110,100,88,66").split(","))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rt = aotc.load(a.bundle)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    rows = []
    for name, seqs in CASES.items():
        pool = Pool(seqs, 7)
        max_kv = max(s for _, s in seqs)

        def plan_of():
            out = torch.full_like(pool.out, float("nan"))
            plan = rt.prepare_attention(pool.q, pool.k, pool.v, out, pool.cu, pool.sl, pool.pt,
                                        max_seqlen_q=pool.max_q, max_seqlen_kv=max_kv)
            plan(pool.q, out, stream=torch.cuda.current_stream())  # every parameter slot set for this step
            return plan, out

        fns, outs = {}, {}
        plan, outs["seq"] = plan_of()
        fns["seq"] = lambda plan=plan: plan(pool.q, outs["seq"], stream=torch.cuda.current_stream())
        pl = plan.launcher
        fns["prefill_only"] = lambda pl=pl: pl.launch(torch.cuda.current_stream().cuda_stream)
        fns["decode_only"] = lambda plan=plan: plan.decode.launcher.launch(torch.cuda.current_stream().cuda_stream)
        for P in GRIDS:
            p, outs[f"fork_P{P}"] = plan_of()
            fns[f"fork_P{P}"] = lambda p=p, o=outs[f"fork_P{P}"], P=P: p(pool.q, o, stream=torch.cuda.current_stream(),
                                                                        prefill_sms=P)
            outs[f"fork_P{P}"].fill_(float("nan"))
            fns[f"fork_P{P}"]()
        torch.cuda.synchronize()
        ref = outs["seq"].float()
        row = {"case": name, "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
               "prefill_grid": pl.grid[0], "decode_grid": list(plan.decode.launcher.grid),
               # what Runtime.step_prefill_sms picks for this step (None: one kernel after the other)
               "step_prefill_sms": rt.step_prefill_sms([q for q, _ in seqs], [k for _, k in seqs],
                                                       heads_q=pool.model.heads_q, heads_kv=pool.model.heads_kv,
                                                       head_dim=pool.model.head_dim)}
        for n, o in outs.items():
            if n != "seq":
                row[f"{n}_max_abs_diff_vs_seq"] = float((o.float() - ref).abs().max())
        row["seq_has_nan"] = bool(torch.isnan(ref).any())
        med, fields = medians(interleaved({n: (lambda fn=fn: graph_time(fn, flush.zero_)) for n, fn in fns.items()},
                                          a.rounds), "us")
        row.update(fields)
        for n, t in med.items():
            row[f"x_{n}"] = med["seq"] / t
        print(json.dumps(rounded(row)), flush=True)
        rows.append(row)
    if a.out:
        Path(a.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "command": " ".join(sys.argv),
                                           "rounds": a.rounds, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
