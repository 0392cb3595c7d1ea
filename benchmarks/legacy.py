"""Kernels of a bundle built by an earlier aotc, launched in this process beside the current ones (A/B).

An A/B of a kernel change times both in one process. When the change also changed a family's parameter
list, this aotc's runtime sets the old artifacts aside (their ABI is not the family's), so:

* load_prefill_runtime(path): a Runtime over an old bundle whose prefill/combine artifacts differ from
  this aotc's ABI only by the pointee alignments the new ABI records (the same parameters, names and
  kinds): their recorded ABI is upgraded to the family's, so this runtime launches the old cubins.
* LegacyDecode: the decode kernel of bundles before the chunk schedule (parameters num_splits,
  write_partial, partials by [split, batch, ...]), prepared and launched as that aotc's DecodePlan did it
  (its split heuristic: as many splits as fit one wave of 2 CTAs per SM, at least 4 blocks of 64 keys
  each, no empty split).

Benchmarks only: nothing here is used by aotc itself.
"""
from __future__ import annotations

import dataclasses
import math

LEGACY_DECODE_PARAMS = (
    "q", "k", "v", "o", "lse", "o_partial", "lse_partial", "counters", "page_table", "seqlens_kv",
    "batch", "seqlen_q", "heads_q", "heads_kv", "num_splits", "max_pages", "write_lse", "write_partial",
    "softmax_scale", "q_stride_b", "q_stride_s", "q_stride_h", "k_stride_page", "k_stride_token", "k_stride_head",
    "v_stride_page", "v_stride_token", "v_stride_head", "o_stride_b", "o_stride_s", "o_stride_h",
    "lse_stride_b", "lse_stride_h", "lse_stride_s", "pt_stride_b", "pt_stride_p",
    "op_stride_split", "op_stride_b", "op_stride_s", "op_stride_h",
    "lp_stride_split", "lp_stride_b", "lp_stride_h", "lp_stride_s",
)


def _upgraded(art):
    from aotc.families import get_family

    fam = get_family(art.variant.family)
    want = fam.params(art.variant)
    if [(p.name, p.kind) for p in art.abi.params] != [(p.name, p.kind) for p in want]:
        return None
    return dataclasses.replace(art, abi=dataclasses.replace(art.abi, params=tuple(want)))


def _named_subset(art) -> bool:
    """The old parameter list is a subset of this aotc's, by name and kind (parameters the family added
    since, e.g. sdpa_prefill_sm90's paged ones, which its dense and ragged variants take as zeros): plans
    fill a kernel's parameters by name, so the old cubin launches with its own list."""
    from aotc.families import get_family

    want = {p.name: p.kind for p in get_family(art.variant.family).params(art.variant)}
    return all(want.get(p.name) == p.kind for p in art.abi.params)


def load_prefill_runtime(path: str):
    """A Runtime over the old bundle's prefill/combine artifacts (load_old_runtime)."""
    return load_old_runtime(path, ("sdpa_prefill", "sdpa_prefill_sm90", "sdpa_combine"))


def load_old_runtime(path: str, families: tuple[str, ...]):
    """A Runtime over the old bundle's artifacts of `families`: those whose parameters are this aotc's (ABI
    upgraded), and those whose parameters are a named subset of them (launched with their own list: e.g.
    the decode kernel from before the score features)."""
    from aotc.runtime import Runtime
    from aotc.storage.bundle import read_bundle

    class OldListRuntime(Runtime):
        # dispatch reads a record from before the score features as the kernel without them (Runtime's
        # _first_match, checks.with_defaults); their feature parameters are not written into older lists
        def _fits(self, k) -> bool:  # the header is checked (k.artifact); the parameter list is the cubin's own
            k.artifact
            return True

    arts = []
    for a in read_bundle(path, other_sources=True).artifacts:
        if a.variant.family not in families:
            continue
        up = _upgraded(a)
        if up is not None or _named_subset(a):
            arts.append(up or a)
    return OldListRuntime(arts, [path])


def legacy_decode_kernels(path: str) -> dict:
    """{(dtype, head_dim, kv): LoadedKernel} of the old bundle's decode artifacts with the old parameter list."""
    from aotc.runtime.loader import LoadedKernel
    from aotc.storage.bundle import read_bundle

    out = {}
    for a in read_bundle(path, other_sources=True).artifacts:
        if a.variant.family == "sdpa_decode" and tuple(p.name for p in a.abi.params) == LEGACY_DECODE_PARAMS:
            out[(a.variant["dtype"], a.variant["head_dim"], a.variant["kv"])] = LoadedKernel(a)
    return out


def legacy_splits(batch: int, heads_kv: int, max_seqlen_kv: int, sm_count: int) -> int:
    """The old heuristic (one row tile, 64-key blocks, 2 CTAs per SM, at most 64 splits)."""
    ctas = max(1, batch * heads_kv)
    blocks = max(1, math.ceil(max_seqlen_kv / 64))
    splits = max(1, min(sm_count * 2 // ctas, blocks // 4, 64))
    return math.ceil(blocks / math.ceil(blocks / splits))


class LegacyDecode:
    """A prepared step of the old decode kernel over torch tensors q/out [B, 1, H_q, D], an NHD pool and a
    page table, with `splits` splits (the old heuristic's from max_seqlen_kv unless given)."""

    def __init__(self, kernel, q, k, v, out, seqlens, page_table, max_seqlen_kv: int, sm_count: int,
                 splits: int | None = None):
        import torch

        from aotc.runtime import driver
        from aotc.runtime.launch import PreparedLaunch

        B, S_q, H_q, D = q.shape
        H_kv = k.shape[2]
        self.splits = splits or legacy_splits(B, H_kv, max_seqlen_kv, sm_count)
        rows = B * S_q * H_q
        a16 = lambda n: (n + 15) // 16 * 16  # noqa: E731
        n_counters = B * H_kv  # one row tile: H_q / H_kv * S_q <= 16
        nbytes = a16(self.splits * rows * D * 4) + a16(self.splits * rows * 4) + a16(rows * 4)
        self.ws = torch.zeros(max(nbytes, 16), dtype=torch.uint8, device=q.device)
        ws = self.ws.data_ptr()
        counters = ws + nbytes // 16 * 16 - a16(n_counters * 4)
        if self.splits > 1:
            driver.memset_d32(counters, 0, n_counters)
        values = {
            "q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(), "o": out.data_ptr(), "lse": 0,
            "o_partial": ws if self.splits > 1 else 0, "lse_partial": ws + a16(self.splits * rows * D * 4),
            "counters": counters, "page_table": page_table.data_ptr(), "seqlens_kv": seqlens.data_ptr(),
            "batch": B, "seqlen_q": S_q, "heads_q": H_q, "heads_kv": H_kv, "num_splits": self.splits,
            "max_pages": page_table.shape[1], "write_lse": 0, "write_partial": int(self.splits > 1),
            "softmax_scale": 1.0 / math.sqrt(D),
            "q_stride_b": q.stride(0), "q_stride_s": q.stride(1), "q_stride_h": q.stride(2),
            "k_stride_page": k.stride(0), "k_stride_token": k.stride(1), "k_stride_head": k.stride(2),
            "v_stride_page": v.stride(0), "v_stride_token": v.stride(1), "v_stride_head": v.stride(2),
            "o_stride_b": out.stride(0), "o_stride_s": out.stride(1), "o_stride_h": out.stride(2),
            "lse_stride_b": 0, "lse_stride_h": 0, "lse_stride_s": 0,
            "pt_stride_b": page_table.stride(0), "pt_stride_p": page_table.stride(1),
            "op_stride_split": rows * D, "op_stride_b": S_q * H_q * D, "op_stride_s": H_q * D, "op_stride_h": D,
            "lp_stride_split": rows, "lp_stride_b": H_q * S_q, "lp_stride_h": S_q, "lp_stride_s": 1,
        }
        self.launcher = PreparedLaunch(kernel, (self.splits, H_kv, B), q.get_device(), values)
        # the launch writes through these pointers at every call: keep the tensors alive with the plan
        self._tensors = (q, k, v, out, seqlens, page_table)

    def __call__(self, stream: int) -> None:
        self.launcher.launch(stream)
