"""Launch one aotc kernel a few times for Nsight Compute (ncu) to profile.

    ncu --clock-control none --kernel-name regex:kernel_cutlass --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        python3 benchmarks/probes/profile_kernel.py prefill 128 2048 0

Arguments: family (prefill; prefill-ragged: the same B sequences of S tokens packed as THD, rt.prefill_ragged;
prefill-paged16: the same queries through the serving entry point rt.attention, each sequence's S keys in
16-token pages of NHD pools in random order, one launch of the paged prefill kernel; prefill-fa3:
FlashAttention-3's flash_attn_func from the fa3-fwd wheel on the dense tensors, for side-by-side profiles: its
kernel is cutlass's device_kernel, so --kernel-name regex:device_kernel; decode: paged KV, 16-token pages in
random order; decode-dense: KV as [B, H_kv, S, D] contiguous tensors, the layout torch SDPA's backends take),
D (decode: B * 1000), S, causal[, softcap[, H]] (the prefill families: a logits soft-cap, e.g. 50, 0 for none;
H the heads, 16 unless given).
"""
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import aotc.runtime  # noqa: E402

family, D, S, causal = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), bool(int(sys.argv[4]))
# the bundle: $AOTC_PROFILE_BUNDLE, else the default build; prefill kernels of an older parameter list too
# (benchmarks.legacy), so an A/B across a change of the family's parameters profiles both
bundle = os.environ.get("AOTC_PROFILE_BUNDLE") or str(Path(__file__).resolve().parents[2] / "artifacts" / "default.aotc")
if family == "prefill":
    from benchmarks.legacy import load_prefill_runtime

    rt = load_prefill_runtime(bundle)
else:
    rt = aotc.runtime.load(bundle)
softcap = float(sys.argv[5]) if len(sys.argv) > 5 and float(sys.argv[5]) else None
if family in ("prefill", "prefill-ragged", "prefill-paged16", "prefill-fa3"):
    B, H = max(1, 16384 // S), int(sys.argv[6]) if len(sys.argv) > 6 else 16
    q, k, v = (torch.randn(B, S, H, D, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    out = torch.empty_like(q)
    cu = torch.arange(0, (B + 1) * S, S, dtype=torch.int32, device="cuda")
    if family == "prefill-fa3":
        from benchmarks.bench_runtime import import_fa3

        fa3 = import_fa3()
    if family == "prefill-paged16":
        page = 16
        pages = torch.randperm(B * S // page, device="cuda", dtype=torch.int32)
        k_pool, v_pool = (torch.empty(B * S // page, page, H, D, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        k_pool[pages.long()] = k.reshape(-1, page, H, D)  # token t of sequence b in page pages[(b * S + t) // 16]
        v_pool[pages.long()] = v.reshape(-1, page, H, D)
        page_table = pages.view(B, S // page)
        seqlens_kv = torch.full((B,), S, dtype=torch.int32, device="cuda")
    for _ in range(4):
        if family == "prefill":
            rt.prefill(q, k, v, out, causal=causal, softcap=softcap)
        elif family == "prefill-ragged":
            rt.prefill_ragged(q.view(B * S, H, D), k.view(B * S, H, D), v.view(B * S, H, D), out.view(B * S, H, D),
                              cu, cu, S, S, causal=causal, softcap=softcap)
        elif family == "prefill-paged16":
            rt.attention(q.view(B * S, H, D), k_pool, v_pool, out.view(B * S, H, D), cu, seqlens_kv, page_table,
                         causal=causal, softcap=softcap, max_seqlen_q=S, min_seqlen_q=S, max_seqlen_kv=S)
        else:
            fa3.flash_attn_func(q, k, v, causal=causal, softcap=softcap or 0.0)
elif family in ("decode", "decode-dense"):
    B, page, H_q, H_kv = D // 1000 or 64, 16, 32, 8  # D argument reused as B*1000 for decode runs
    D = 128
    if family == "decode":
        n_pages = B * S // page
        kc = torch.randn(n_pages, page, H_kv, D, dtype=torch.bfloat16, device="cuda")
        pt = torch.randperm(n_pages, device="cuda", dtype=torch.int32).view(B, S // page)
    else:
        kc = torch.randn(B, H_kv, S, D, dtype=torch.bfloat16, device="cuda").transpose(1, 2)
        pt = None
    vc = torch.randn_like(kc)  # its own V pool: with K = V the V reads would hit L2 (half the DRAM traffic)
    sl = torch.full((B,), S, dtype=torch.int32, device="cuda")
    q = torch.randn(B, 1, H_q, D, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(q)
    ws = torch.empty(rt.decode_workspace_bytes(B, 1, H_q, D, 64), dtype=torch.uint8, device="cuda")
    for _ in range(4):
        rt.decode(q, kc, vc, out, sl, pt, max_seqlen_kv=S, workspace=ws)
torch.cuda.synchronize()
print("done")
