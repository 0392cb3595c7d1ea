"""Runtime.attention's portable paged kernel: sdpa_prefill at layout pagedP (aotc.families.sdpa_prefill),
the fallback for the chunked-prefill rows where no loaded Hopper kernel (sdpa_prefill_sm90) serves the call
on this device (A100, L40S, Blackwell, or an sm_90 bundle of portable kernels only). The Hopper kernel stays
preferred wherever one serves; the decode rows go to sdpa_decode (layout ragged) either way.

What differs from the Hopper kernel's launch: Q, K and V are plain pointers with Int64 strides (no TMA
descriptor to encode for a new token count), any GQA group (one query head a CTA, no packing), and the grid
is not persistent: (ceil(bound / block_m), H_q, B), the bound the call's max_seqlen_q (None: the step's
token count; either cut at the token count), rewritten per call. Tiles past a sequence's queries exit at
once, so a CUDA graph captured with a bound replays correctly for any batch whose query counts stay within
it; a sequence longer than the bound (a replay keeps its captured grid) is still computed whole, its CTAs
walking its query tiles gridDim.x apart (slower, never wrong: as on the Hopper kernel, the bound only sizes
the launch). Without a bound every sequence is given ceil(total_q / block_m) tiles a head, most of which
exit at once: pass the bound.
"""
from __future__ import annotations

from ..common.errors import ArgumentError
from ..families.sdpa_prefill_sm90 import Q_BOX_ROWS
from .features import Features
from .prefill import MAX_GRID_YZ, hopper_candidates

HOPPER = "sdpa_prefill_sm90"
PORTABLE = "sdpa_prefill"


def served_pages(runtime, device: int, family: str) -> list[int]:
    """The page sizes of `family`'s loaded paged kernels for this device."""
    return sorted(int(x[len("paged"):]) for x in runtime.field_values(family, "layout", device)
                  if str(x).startswith("paged"))


def portable_fields(wanted: dict) -> list[dict]:
    """The portable kernel's candidates for the call's fields (the cache's kv_dtype among them: 16-bit, or fp8
    e4m3): general strides (paged has no packed form)."""
    return [{**wanted, "strides": "general"}]


def prefill_family(runtime, device: int, q, k, kv_layout, causal: bool, window_left, softcap, sinks) -> str:
    """The family of the call's paged prefill kernel: the Hopper one where a loaded kernel of it serves the
    call's dtype, head dim, page size, mask and features on this device, else the portable one where one
    does. Where none does, the family whose checks then name what is missing: the Hopper one where it has
    paged kernels for this device (as before the portable kernel was a choice), else the portable one where
    it has. The Hopper kernel serves GQA groups (H_q / H_kv) of 1 to Q_BOX_ROWS only: a larger one (MQA over
    many query heads) goes to the portable kernel where one serves. q, k: TensorArg records, not yet checked (a
    malformed call goes the Hopper way, to its errors)."""
    if kv_layout not in ("NHD", "HND") or len(q.shape) != 3 or len(k.shape) != 4:
        return HOPPER
    page, heads_kv = (k.shape[1], k.shape[2]) if kv_layout == "NHD" else (k.shape[2], k.shape[1])
    wanted = {"dtype": q.dtype, "head_dim": q.shape[2], "layout": f"paged{page}", "causal": causal,
              "kv_dtype": k.dtype, **Features(window_left, softcap, sinks).fields}
    hopper_group = heads_kv > 0 and q.shape[1] // heads_kv <= Q_BOX_ROWS
    if hopper_group and runtime.find(HOPPER, device, hopper_candidates(runtime, device, wanted, 0)) is not None:
        return HOPPER
    if runtime.find(PORTABLE, device, portable_fields(wanted)) is not None:
        return PORTABLE
    if served_pages(runtime, device, HOPPER) or not served_pages(runtime, device, PORTABLE):
        return HOPPER
    return PORTABLE


def check_grid(batch: int, heads_q: int) -> None:
    """The portable grid's y and z extents (H_q, B) are CUDA's 16-bit ones."""
    for name, value in (("H_q", heads_q), ("B", batch)):
        if value > MAX_GRID_YZ:
            raise ArgumentError(name, value, f"at most {MAX_GRID_YZ} for the portable paged kernel (its grid is "
                                             f"(m_blocks, H_q, B))")


class PortableLaunch:
    """The portable kernel's pointer parameters and its per-call grid (see the module docstring)."""

    def __init__(self, kernel, t: dict, d):
        """kernel: the loaded portable kernel; t: the call's checked tensors; d: its AttentionShape. `values`:
        the parameters only this kernel has (AttentionPlan adds the outputs, lengths and page table)."""
        self.block_m = int(kernel.artifact.launch.extra["block_m"])  # the tile of the cubin that runs
        q = t["q"]
        self.values = {
            "q": q.ptr, "k": t["k_cache"].ptr, "v": t["v_cache"].ptr, "pages": d.pages,
            "q_stride_s": q.strides[0], "q_stride_h": q.strides[1],
            "k_stride_page": d.k_strides[0], "k_stride_token": d.k_strides[1], "k_stride_head": d.k_strides[2],
            "v_stride_page": d.v_strides[0], "v_stride_token": d.v_strides[1], "v_stride_head": d.v_strides[2],
        }
        self.d = d

    def grid(self, bound: int | None, total_q: int) -> tuple[int, int, int]:
        """(m_blocks, H_q, B) for a step of total_q tokens whose query counts are at most `bound` (None: no
        bound); at least one m_block, so an empty step's plan still binds a launcher."""
        rows = total_q if bound is None else min(bound, total_q)
        return (max(1, -(-rows // self.block_m)), self.d.heads_q, self.d.batch)

    def bind(self, plan) -> None:
        self._q_slot = plan.slots("q")[0]
        self._set_grid_x = None if plan.launcher.empty else plan.launcher.launch.set_grid_x
        self._grid_x = None

    def set(self, q: int, bound: int | None, total_q: int) -> None:
        """The step's q pointer and grid."""
        self._q_slot.value = q
        x = self.grid(bound, total_q)[0]
        if x != self._grid_x and self._set_grid_x is not None:
            self._set_grid_x(x)
            self._grid_x = x
