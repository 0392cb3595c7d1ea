"""Edge-shape launches of every family, for compute-sanitizer (memcheck over all, racecheck/synccheck on one each).

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python3 tests/gpu/sanitizer_cases.py all
    ... --tool racecheck python3 tests/gpu/sanitizer_cases.py one
    ... python3 tests/gpu/sanitizer_cases.py fp8      # every fp8 KV kernel of AOTC_TEST_BUNDLE
    ... python3 tests/gpu/sanitizer_cases.py hopper   # sdpa_prefill_sm90: D64, D128 causal, D256 ragged,
                                                      # D128 at its widest kv tile (block_n 176), and
                                                      # two paged layouts (Runtime.attention) and
                                                      # the paged boxes inside a page
    ... python3 tests/gpu/sanitizer_cases.py paged-boxes  # those boxes alone: D256 pages 32/128, D128-176 page 64

PYTORCH_NO_CUDA_MEMORY_CACHING=1 gives every tensor its own cudaMalloc, so an access past a
tensor's end is past an allocation's end, which memcheck reports.
"""
from __future__ import annotations

import itertools
import math
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import aotc.runtime  # noqa: E402
from prefill_cases import hopper_tile_runtime  # noqa: E402  (this file's folder: the GPU suite's helpers)

rt = aotc.runtime.load(os.environ.get("AOTC_TEST_BUNDLE", str(ROOT / "artifacts" / "default.aotc")))
mode = sys.argv[1] if len(sys.argv) > 1 else "all"
launches = 0


def combine_cases():
    global launches
    dims = (64, 128, 256) if mode == "all" else (128,)
    for D in dims:
        for splits, B, S, H in ((1, 1, 1, 1), (3, 2, 1, 5), (7, 1, 3, 3)):
            op = torch.randn(splits, B, S, H, D, device="cuda")
            lp = torch.randn(splits, B, H, S, device="cuda")
            lp[:, 0, 0, 0] = -math.inf  # an all-empty row
            for layout in ("packed", "padded") if mode == "all" else ("packed",):
                if layout == "packed":
                    out = torch.empty(B, S, H, D, device="cuda", dtype=torch.bfloat16)
                else:
                    out = torch.empty(B, S, H + 1, D + 8, device="cuda", dtype=torch.bfloat16)[:, :, :H, :D]
                lse = torch.empty(B, H, S, device="cuda")
                rt.combine(op, lp, out, lse)
                launches += 1


def prefill_cases(family, rt=rt, picks=None):
    """Edge shapes through one prefill family (forced, so the portable one runs on sm_90 too): its dense and
    ragged kernels (the paged ones are attention_cases')."""
    global launches
    variants = sorted({(k.variant["dtype"], k.variant["head_dim"], k.variant["layout"], k.variant["causal"])
                       for k in rt.kernels.get(family, []) if k.variant["layout"] in ("dense", "ragged")})
    if mode == "one":
        variants = [v for v in variants if v[1] == 128 and v[3] and v[2] == "dense"][:1]
    elif mode == "hopper":
        variants = [next(v for v in variants if (v[1], v[2], v[3]) == p) for p in picks]
    for dtype, D, layout, causal in variants:
        t = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
        if layout == "dense":
            for B, S_q, S_kv, H_q, H_kv in ((1, 1, 1, 1, 1), (2, 7, 1000, 4, 2), (1, 65, 65, 2, 2), (1, 3, 0, 2, 1),
                                            (1, 130, 7, 2, 2), (2, 300, 300, 2, 1),
                                            (5, 300, 450, 16, 4),  # 80 (batch, head) pairs: causal tile pairs
                                            (1, 800, 1100, 30, 6)):  # non-causal: a split tail (150-210 tiles)
                q = torch.randn(B, S_q, H_q, D, device="cuda", dtype=t)
                k = torch.randn(B, S_kv, H_kv, D, device="cuda", dtype=t)
                v = torch.randn(B, S_kv, H_kv, D, device="cuda", dtype=t)
                out = torch.empty_like(q)
                lse = torch.empty(B, H_q, S_q, device="cuda")
                rt.prefill(q, k, v, out, lse, causal=causal, family=family)
                launches += 1
        else:
            lq, lkv = [5, 0, 70, 200], [9, 3, 1, 300]
            cu_q = torch.tensor([0, 5, 5, 75, 275], dtype=torch.int32, device="cuda")
            cu_kv = torch.tensor([0, 9, 12, 13, 313], dtype=torch.int32, device="cuda")
            q = torch.randn(sum(lq), 4, D, device="cuda", dtype=t)
            k = torch.randn(sum(lkv), 2, D, device="cuda", dtype=t)
            out = torch.empty_like(q)
            lse = torch.empty(4, sum(lq), device="cuda")
            rt.prefill_ragged(q, k, k, out, cu_q, cu_kv, max(lq), max(lkv), lse, causal=causal, family=family)
            launches += 1


def decode_cases(kv_dtype=None):
    """Decode over the lengths below, dense KV and paged, unsplit, a few chunks and one wave of them.
    kv_dtype fp8_e4m3: the plain fp8 decode kernels (the ring's e4m3 tiles read by ldmatrix and converted in
    registers; Q rewritten in smem in K's fragment order between barriers: racecheck's case) over e4m3 pools
    with per-head scales."""
    global launches
    fp8 = kv_dtype == "fp8_e4m3"
    variants = sorted({(k.variant["dtype"], k.variant["head_dim"], k.variant["kv"]) for k in rt.kernels.get("sdpa_decode", [])
                       if (k.variant.get("kv_dtype") == "fp8_e4m3") == fp8
                       and (not fp8 or (k.variant["layout"] == "dense"
                                        and not any(k.variant.get(f) for f in ("window", "softcap", "sinks"))))})
    if fp8 and mode not in ("all", "fp8"):
        variants = variants[:1]
    elif not fp8 and mode != "all":
        variants = [v for v in variants if v[1] == 128 and v[2] == "paged16"][:1]
    for dtype, D, kv in variants:
        t = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
        kv_t = torch.float8_e4m3fn if fp8 else t
        lengths = [1, 15, 16, 17, 0, 130, 4096]  # length 1, page boundaries, empty, a tail, one split in chunks
        B, H_q, H_kv, S_q = len(lengths), 8, 2, 2
        max_len = max(lengths)
        q = torch.randn(B, S_q, H_q, D, device="cuda", dtype=t)
        out = torch.empty_like(q)
        lse = torch.empty(B, H_q, S_q, device="cuda")
        sl = torch.tensor(lengths, dtype=torch.int32, device="cuda")
        if kv == "dense":
            k = torch.randn(B, max_len, H_kv, D, device="cuda", dtype=t).to(kv_t)
            pt = None
        else:
            page = int(kv[len("paged"):])
            n = -(-max_len // page)
            k = torch.randn(B * n, page, H_kv, D, device="cuda", dtype=t).to(kv_t)
            pt = torch.randperm(B * n, device="cuda", dtype=torch.int32).view(B, n)
        scale = torch.full((H_kv,), 0.05, device="cuda")
        scales = {"k_descale": scale, "v_descale": scale} if fp8 else {}
        for chunks in (1, 5, None):  # none split, a few, one wave (short sequences: most chunks past the last)
            ws = torch.empty(max(16, rt.decode_workspace_bytes(B, S_q, H_q, D, chunks or 264)), dtype=torch.uint8,
                             device="cuda")
            rt.decode(q, k, k, out, sl, pt, lse, max_seqlen_kv=max_len, chunks=chunks, workspace=ws, **scales)
            launches += 1  # split sequences merge in the same launch


def kv_write_cases():
    """Token counts around a CTA's tokens, both pool layouts, slots the kernel must skip (-1, num_slots,
    past it, negative): an access past a pool or an input is past its allocation."""
    global launches
    variants = sorted({(k.variant["dtype"], k.variant["head_dim"]) for k in rt.kernels.get("kv_write", [])})
    for dtype, D in variants if mode == "all" else variants[:1]:
        t = torch.float16 if dtype == "fp16" else torch.bfloat16
        for layout in ("NHD", "HND"):
            for page in (16, 128) if mode == "all" else (16,):
                for tokens in (1, 31, 33, 100):
                    pages = -(-tokens // page) + 1
                    shape = (pages, page, 2, D) if layout == "NHD" else (pages, 2, page, D)
                    kc, vc = torch.empty(shape, device="cuda", dtype=t), torch.empty(shape, device="cuda", dtype=t)
                    key, value = (torch.randn(tokens, 2, D, device="cuda", dtype=t) for _ in range(2))
                    slots = torch.randperm(pages * page, device="cuda")[:tokens]
                    bad = torch.tensor([-1, pages * page, pages * page + 1, -5], device="cuda")
                    slots[::3] = bad.repeat(tokens)[: slots[::3].numel()]
                    rt.kv_write(key, value, kc, vc, slots.to(torch.int64), kv_layout=layout)
                    launches += 1


# the entry point's default batch: decode rows, S_q 4 rows, chunks whose prefix is in the cache, empty sequences,
# lengths at and around page and kv-block boundaries; first a sequence whose queries see no key (s_kv 0): its
# tiles visit no kv block, and the page table's row 0 is the allocation's start, so a read before it is past the
# allocation
ATTENTION_SEQS = [(2, 0), (1, 1), (4, 17), (0, 50), (130, 130), (1, 16), (0, 0), (200, 2500), (1, 127), (3, 129)]
# few tiles over long contexts: the paged kernel's KV splits (their partials, counters and merge)
SPLIT_SEQS = [(2, 0), (128, 8192), (5, 3000), (0, 50), (1, 100)]


def attention_cases(picks=None, features=None, fp8=False, family="sdpa_prefill_sm90", max_seqlen_kv=None,
                    seqs=ATTENTION_SEQS):
    """Runtime.attention over pools sized to the pages the sequences own (a read past a pool is past its
    allocation) with page-table padding -1, the batch `seqs` ((s_q, s_kv) per sequence); every row on the paged
    kernel, then the decode rows on the decode kernel. picks: (dtype, head_dim, page) to run (default: every paged
    variant of `family`: of its fp8 ones with fp8, over e4m3 pools and fp32 scales of their own allocations);
    features: the score features' arguments (feature_kwargs), else none. max_seqlen_kv: the bound the plans are
    told (from the widest kv tile's launch fact picked_from_seqlen_kv on, that tile)."""
    global launches
    variants = sorted({(k.variant["dtype"], k.variant["head_dim"], int(k.variant["layout"][len("paged"):]))
                       for k in rt.kernels.get(family, []) if k.variant["layout"].startswith("paged")
                       and (k.variant.get("kv_dtype") == "fp8_e4m3") == fp8
                       and (features is not None or not any(k.variant.get(f) for f in FEATURES))})
    if picks is not None:
        variants = [v for v in variants if v in picks]
    for dtype, D, page in variants:
        t = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
        H_q, H_kv = 8, 2
        need = [-(-s_kv // page) for _, s_kv in seqs]
        # the rows' padding holds max_seqlen_kv's keys: a bound past the page table is refused
        width = max(max(need) + 1, -(-(max_seqlen_kv or 0) // page))
        for layout in ("NHD", "HND") if picks is None else ("NHD",):
            shape = (sum(need) + 1, page, H_kv, D) if layout == "NHD" else (sum(need) + 1, H_kv, page, D)
            k, v = torch.randn(shape, device="cuda", dtype=t), torch.randn(shape, device="cuda", dtype=t)
            scales = {}
            if fp8:
                k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
                scales = {"k_descale": torch.full((H_kv,), 0.05, device="cuda"),
                          "v_descale": torch.full((H_kv,), 0.05, device="cuda")}
            perm = torch.randperm(shape[0], device="cuda", dtype=torch.int32)
            pt = torch.full((len(seqs), width), -1, dtype=torch.int32, device="cuda")  # its own allocation
            pos = 0
            for b, n in enumerate(need):
                pt[b, :n] = perm[pos:pos + n]
                pos += n
            cu = torch.tensor([0] + list(itertools.accumulate(s_q for s_q, _ in seqs)), dtype=torch.int32,
                              device="cuda")
            sl = torch.tensor([s_kv for _, s_kv in seqs], dtype=torch.int32, device="cuda")
            total = int(cu[-1])
            q = torch.randn(total, H_q, D, device="cuda", dtype=t)
            out, lse = torch.empty_like(q), torch.empty(H_q, total, device="cuda")
            for dq in (0, 1):
                rt.attention(q, k, v, out, cu, sl, pt, lse=lse, kv_layout=layout, decode_query_len=dq,
                             max_seqlen_kv=max_seqlen_kv,
                             **feature_kwargs(features, H_q), **scales)
                launches += 1


FEATURES = ("window", "softcap", "sinks")


def feature_kwargs(v, H_q):
    """A feature variant's arguments: a window of 128 keys (left-edge blocks, skipped blocks), soft-cap 30,
    sinks (an H_q fp32 tensor of its own allocation); none for v None."""
    kw = {}
    if v is not None and v.get("window"):
        kw["window_left"] = 127
    if v is not None and v.get("softcap"):
        kw["softcap"] = 30.0
    if v is not None and v.get("sinks"):
        kw["sinks"] = torch.randn(H_q, device="cuda")
    return kw


def feature_cases(picks=None):
    """Every loaded variant with a score feature, once: dense and ragged prefill (a window shorter than the
    sequences, lengths off the tiles), decode over a page pool with splits (the sinks join the merge), and
    the attention entry point's paged and decode-row kernels. picks: families to run (default: all)."""
    global launches
    done = set()
    for fam in picks or ("sdpa_prefill", "sdpa_prefill_sm90", "sdpa_decode"):
        for kern in rt.kernels.get(fam, []):
            v = kern.variant
            feats = tuple(f for f in FEATURES if v.get(f))
            key = (fam, v["dtype"], v["head_dim"], v.get("layout"), v.get("kv"), feats)
            if not feats or key in done:
                continue
            done.add(key)
            t = {"fp16": torch.float16, "bf16": torch.bfloat16}[v["dtype"]]
            D, H_q, H_kv = v["head_dim"], 8, 2
            kw = feature_kwargs(v, H_q)
            layout = v["layout"]
            if fam != "sdpa_decode" and layout == "dense":
                q = torch.randn(2, 300, H_q, D, device="cuda", dtype=t)
                k, vv = (torch.randn(2, 333, H_kv, D, device="cuda", dtype=t) for _ in range(2))
                out, lse = torch.empty_like(q), torch.empty(2, H_q, 300, device="cuda")
                rt.prefill(q, k, vv, out, lse, causal=True, family=fam, **kw)
                launches += 1
            elif fam != "sdpa_decode" and layout == "ragged":
                lens_q, lens_kv = [1, 300, 0, 129], [1, 433, 5, 129]
                cu_q = torch.tensor([0] + list(itertools.accumulate(lens_q)), dtype=torch.int32, device="cuda")
                cu_k = torch.tensor([0] + list(itertools.accumulate(lens_kv)), dtype=torch.int32, device="cuda")
                q = torch.randn(sum(lens_q), H_q, D, device="cuda", dtype=t)
                k, vv = (torch.randn(sum(lens_kv), H_kv, D, device="cuda", dtype=t) for _ in range(2))
                out, lse = torch.empty_like(q), torch.empty(H_q, sum(lens_q), device="cuda")
                rt.prefill_ragged(q, k, vv, out, cu_q, cu_k, max(lens_q), max(lens_kv), lse, causal=True,
                                  family=fam, **kw)
                launches += 1
            elif fam == "sdpa_prefill_sm90" or (fam == "sdpa_decode" and layout == "ragged"):
                attention_cases([(v["dtype"], D, int((v.get("kv") or layout)[len("paged"):]))], v)
            elif fam == "sdpa_decode":
                page = int(v["kv"][len("paged"):])
                lengths = [1, 200, 0, 5000]
                n = -(-max(lengths) // page)
                q = torch.randn(len(lengths), 2, H_q, D, device="cuda", dtype=t)
                k = torch.randn(len(lengths) * n, page, H_kv, D, device="cuda", dtype=t)
                pt = torch.randperm(len(lengths) * n, device="cuda", dtype=torch.int32).view(len(lengths), n)
                sl = torch.tensor(lengths, dtype=torch.int32, device="cuda")
                out, lse = torch.empty_like(q), torch.empty(len(lengths), H_q, 2, device="cuda")
                rt.decode(q, k, k, out, sl, pt, lse, max_seqlen_kv=max(lengths), **kw)
                launches += 1



def fp8_cases():
    """fp8 KV (kv_dtype fp8_e4m3): decode over e4m3 pools (decode_cases), the attention entry point over them
    (every fp8 paged kernel of the Hopper and the portable family) and the quantizing KV write."""
    global launches
    decode_cases("fp8_e4m3")
    for family in ("sdpa_prefill_sm90", "sdpa_prefill"):
        attention_cases(fp8=True, family=family)
    for dtype, D in sorted({(k.variant["dtype"], k.variant["head_dim"]) for k in rt.kernels.get("kv_write", [])
                            if k.variant.get("kv_dtype") == "fp8_e4m3"}):
        t = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
        for tokens in (1, 33, 100):
            pages = -(-tokens // 16) + 1
            kc = torch.empty(pages, 16, 2, D, device="cuda", dtype=torch.float8_e4m3fn)
            vc = torch.empty_like(kc)
            key = torch.randn(tokens, 2, D, device="cuda", dtype=t)
            slots = torch.randperm(pages * 16, device="cuda")[:tokens]
            slots[::3] = -1
            scale = torch.full((2,), 0.01, device="cuda")
            rt.kv_write(key, key, kc, vc, slots.to(torch.int64), k_scale=scale, v_scale=scale)
            launches += 1


def paged_box_cases():
    """16-row TMA boxes inside a page: D256's 80-key kv blocks over pages of 32 and 128, D128's 176-key ones over
    pages of 64 (the widest tile: a long-kv bound)."""
    attention_cases(picks=[("bf16", 256, 32), ("bf16", 256, 128)])
    attention_cases(picks=[("bf16", 128, 64)], max_seqlen_kv=8192)


if mode == "paged-boxes":  # the paged layouts' boxes inside a page alone
    paged_box_cases()
elif mode == "fp8":  # every fp8 KV kernel of the bundle (AOTC_TEST_BUNDLE: a bundle of every page size and head dim)
    fp8_cases()
elif mode == "hopper":  # the sdpa_prefill_sm90 set the Hopper issue names: D64, D128 causal, D256 ragged and dense
    prefill_cases("sdpa_prefill_sm90", picks=[(64, "dense", False), (128, "dense", True), (256, "ragged", False),
                                              (256, "dense", False)])
    # the edge shapes are short, so the runtime would pick the narrowest kv tile: force the widest too
    # (the widest tiles stage O in Q's slab and release it last: causal and ragged too)
    prefill_cases("sdpa_prefill_sm90", hopper_tile_runtime("widest"),
                  picks=[(128, "dense", False), (128, "dense", True), (128, "ragged", True)])
    attention_cases(picks=[("bf16", 128, 16), ("bf16", 64, 128)])  # the paged layouts' V-tail zeroing, barriers
    attention_cases(picks=[("bf16", 128, 16), ("bf16", 64, 128)], seqs=SPLIT_SEQS, max_seqlen_kv=8192)  # KV splits
    paged_box_cases()
    feature_cases(["sdpa_prefill_sm90"])  # the window's left-edge and skipped blocks in the warp-specialized loop
else:
    combine_cases()
    prefill_cases("sdpa_prefill")
    prefill_cases("sdpa_prefill_sm90")
    if mode == "all":
        prefill_cases("sdpa_prefill_sm90", hopper_tile_runtime("widest"))
    decode_cases()
    kv_write_cases()
    fp8_cases()
    attention_cases(None if mode == "all" else [("bf16", 128, 16)])
    if mode == "all":
        feature_cases()
torch.cuda.synchronize()
print(f"sanitizer cases: {launches} launches ({mode})")
