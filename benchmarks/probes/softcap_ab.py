"""A/B of two bundles' soft-capped dense prefill (bench_features' soft-cap cases: bf16 causal, S 8192, B 2,
H 16, D 128 and D 256, softcap 50), both bundles loaded in one process, timed in interleaved rounds beside
bundle A's plain kernel and an A/A twin.

    python benchmarks/probes/softcap_ab.py BUNDLE_A BUNDLE_B [--rounds 5] [--q-scale 8]

--q-scale: q's factor (bench_features' check_q_scale: logits about N(0, 8^2), within the cap of 50). Prints one
JSON line per head dim: softcap_a_ms, softcap_b_ms, aa_ms (A again), plain_ms (A, no soft-cap), x_b =
softcap_a_ms / softcap_b_ms, x_aa = softcap_a_ms / aa_ms, b_over_plain, a_over_plain, and each output's max
|error| against fp32 attention with the cap.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

import aotc.runtime  # noqa: E402
from benchmarks.bench_paged_varlen import rounded  # noqa: E402
from benchmarks.timing import event_time, interleaved, medians  # noqa: E402

CAP = 50.0


def reference(q, k, v, scale, rows):
    """fp32 soft-capped causal attention of query rows `rows` (of q [B, S, H, D]), bottom-right (S_q = S_kv)."""
    s = torch.einsum("bqhd,bkhd->bhqk", q[:, rows].float(), k.float()) * scale
    s = CAP * torch.tanh(s / CAP)
    keys = torch.arange(k.shape[1], device=q.device)
    s = s.masked_fill(keys[None, None, None, :] > rows.to(q.device)[None, None, :, None], float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v.float())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle_a")
    ap.add_argument("bundle_b")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--q-scale", type=float, default=8.0)
    args = ap.parse_args()
    rt_a, rt_b = aotc.runtime.load(args.bundle_a), aotc.runtime.load(args.bundle_b)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda").zero_
    B, S, H = 2, 8192, 16
    for D in (128, 256):
        gen = torch.Generator(device="cuda").manual_seed(D)
        q, k, v = (torch.randn(B, S, H, D, dtype=torch.bfloat16, device="cuda", generator=gen) for _ in range(3))
        q.mul_(args.q_scale)
        outs, fns = {}, {}
        for name, rt, cap in (("softcap_a", rt_a, CAP), ("softcap_b", rt_b, CAP), ("aa", rt_a, CAP),
                              ("plain", rt_a, None)):
            out = outs[name] = torch.full_like(q, float("nan"))
            fns[name] = lambda rt=rt, out=out, cap=cap, qkv=(q, k, v): rt.prefill(*qkv, out, causal=True, softcap=cap)
            fns[name]()
        torch.cuda.synchronize()
        rows = torch.tensor([0, 1, 175, 176, 4095, 8191])
        ref = reference(q, k, v, D ** -0.5, rows)
        row = {"D": D, "S": S, "B": B, "H": H, "softcap": CAP, "q_scale": args.q_scale}
        row.update({f"{n}_max_abs_err": (o[:, rows].float() - ref).abs().max().item()
                    for n, o in outs.items() if n != "plain"})
        samples = interleaved({n: (lambda fn=fn: event_time(fn, flush)[0]) for n, fn in fns.items()}, args.rounds)
        med, fields = medians(samples, "ms")
        row.update(fields)
        row.update(x_b=med["softcap_a"] / med["softcap_b"], x_aa=med["softcap_a"] / med["aa"],
                   b_over_plain=med["softcap_b"] / med["plain"], a_over_plain=med["softcap_a"] / med["plain"])
        print(json.dumps(rounded(row)), flush=True)
        del q, k, v, fns, outs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
