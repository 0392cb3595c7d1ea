"""The serving entry point's short steps, two bundles side by side: Runtime.attention plans of each bundle on the
same pools, timed in interleaved rounds with an A/A twin of the candidate's plan; on decode steps (every
sequence one new token: the ragged decode kernel, queries found through cu_seqlens_q) also each bundle's
Runtime.decode (the dense-Q decode kernel on q viewed [B, 1, H_q, D]).

    python benchmarks/probes/decode_rows_ab.py --base BUNDLE --cand BUNDLE [--rounds 7] [--out FILE] [--only CASE]

Cases: bench_paged_varlen's decode step (64 sequences at 4096 keys) at llama's, gpt-oss's and gpt-oss's sliding
layers' shapes (MODELS), the llama step over e4m3 pools, 16 sequences at 32768 keys with a 4097-key window
(D128, H 32/8; bench_features' windowed decode batch), and at llama's shape bench_paged_varlen's mixed step
and a chunked prefill of 16 sequences x 256 new tokens over 4096 (the paged prefill kernel's batch of many
sequences). Written for the schedulers' start (every CTA reads a round of lengths before its first tile; the ragged
kernels once loaded each sequence's lengths behind the previous one's branch, a round is now loaded whole:
aotc/kernels/tile_scheduler.py's _load_round): a short step pays it once. One JSON line per case:
{base,cand}_attn_us, aa_us, x_cand = base_attn_us / cand_attn_us, x_aa = cand_attn_us / aa_us; decode steps
also {base,cand}_decode_us, {base,cand}_x_decode = decode_us / attn_us (how close the entry point's decode
rows come to the decode family) and x_decode_ab = base_decode_us / cand_decode_us; every contender's max |error|
against fp32 attention.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

import aotc.runtime  # noqa: E402
from benchmarks.bench_paged_varlen import CASES, MODELS, Case, Model, Pool, max_abs_err, rounded  # noqa: E402
from benchmarks.bench_runtime import write_rows  # noqa: E402
from benchmarks.timing import graph_time, interleaved, medians  # noqa: E402

DECODE_STEP = next(c for c in CASES if c.kind == "decode")
MIXED_STEP = next(c for c in CASES if c.kind == "mixed")
CHUNKS = Case("chunks16x256_prefix4096", "chunk", ((256, 4352),) * 16)
WINDOWED = (Model("llama-window4096", 128, 32, 8, window_left=4096),
            Case("decode_b16_32768", "decode", ((1, 32768),) * 16))


def step_contenders(rts: dict, pool: Pool, fp8: bool, decode: bool) -> tuple[dict, dict, dict]:
    """({name: fn}, {name: out}, facts): each bundle's attention plan over the pool (fp8: its e4m3 copy with
    per-head scales), the candidate's twice (aa), and with decode each bundle's decode plan."""
    cur = torch.cuda.current_stream
    model, B = pool.model, len(pool.seqs)
    k, v, extra = pool.k, pool.v, {}
    if fp8:
        k, v, ks, vs = pool.fp8()
        extra = {"k_descale": ks, "v_descale": vs}
    feats = {**pool.features, **extra}
    bounds = {"max_seqlen_q": pool.max_q, "max_seqlen_kv": max(s for _, s in pool.seqs),
              "min_seqlen_q": min(s_q for s_q, _ in pool.seqs)}
    fns, outs, facts = {}, {}, {}
    for name, rt in (("base", rts["base"]), ("cand", rts["cand"]), ("aa", rts["cand"])):
        key = "aa" if name == "aa" else f"{name}_attn"
        out = outs[key] = torch.full_like(pool.out, float("nan"))
        plan = rt.prepare_attention(pool.q, k, v, out, pool.cu, pool.sl, pool.pt, **bounds, **feats)
        facts[f"{name}_attn_variant"] = (plan.decode if decode else plan).variant.name
        fns[key] = lambda plan=plan, out=out, keep=(k, v): plan(pool.q, out, stream=cur())
        if name == "aa" or not decode:
            continue
        o4 = outs[f"{name}_decode"] = torch.full_like(pool.out, float("nan"))
        q4 = pool.q.view(B, 1, model.heads_q, model.head_dim)
        dplan = rt.prepare_decode(q4, k, v, o4.view(B, 1, model.heads_q, model.head_dim), pool.sl, pool.pt,
                                  window_left=feats["window_left"], sinks=feats["sinks"], **extra)
        facts[f"{name}_decode_variant"] = dplan.variant.name
        fns[f"{name}_decode"] = (lambda dplan=dplan, o4=o4, q4=q4, keep=(k, v):
                                 dplan(q4, o4.view(q4.shape), stream=cur()))
    return fns, outs, facts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--cand", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", help="also write the rows to this JSON file")
    ap.add_argument("--only", help="run only the cases whose name contains this string")
    args = ap.parse_args()
    rts = {"base": aotc.runtime.load(args.base), "cand": aotc.runtime.load(args.cand)}
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda").zero_
    llama = MODELS["llama"]
    cases = [(MODELS[m], DECODE_STEP, False) for m in ("llama", "gpt-oss", "gpt-oss-sliding")]
    cases += [(llama, DECODE_STEP, True), (*WINDOWED, False), (llama, MIXED_STEP, False), (llama, CHUNKS, False)]
    cases = [c for c in cases if not args.only or args.only in c[1].name]
    rows = []
    for model, case, fp8 in cases:
        decode = case.kind == "decode"
        pool = Pool(case.seqs, seed=1, model=model)
        fns, outs, facts = step_contenders(rts, pool, fp8, decode)
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        row = {"case": case.name, "model": model.name, "kv": "fp8_e4m3" if fp8 else "bf16", **facts}
        # fp8: against the unquantized reference, so the error holds the quantization's own
        row.update({f"{n}_max_abs_err": max_abs_err(pool, o) for n, o in outs.items()})
        med, fields = medians(interleaved({n: (lambda fn=fn: graph_time(fn, flush)) for n, fn in fns.items()},
                                          args.rounds), "us")
        row.update(fields)
        row.update(x_cand=med["base_attn"] / med["cand_attn"], x_aa=med["cand_attn"] / med["aa"])
        if decode:
            row.update(base_x_decode=med["base_decode"] / med["base_attn"],
                       cand_x_decode=med["cand_decode"] / med["cand_attn"],
                       x_decode_ab=med["base_decode"] / med["cand_decode"])
        rows.append(rounded(row))
        print(json.dumps(rows[-1]), flush=True)
        del pool, fns, outs
        torch.cuda.empty_cache()
    if args.out:
        write_rows(args.out, "benchmarks/probes/decode_rows_ab.py", rows)


if __name__ == "__main__":
    main()
