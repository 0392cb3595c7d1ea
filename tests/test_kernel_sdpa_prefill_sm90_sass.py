"""The Hopper prefill's kv loop as ptxas scheduled it (SASS of cubins compiled here; no GPU needed).

Each steady kv iteration issues S(t) = Q K(t)^T and O += P(t-1) V(t-1), waits for S (wgmma wait_group 1),
runs the softmax of S(t) and waits for PV (wait_group 0) before P(t) replaces P(t-1) in its registers. The softmax overlaps the PV GEMM
only as far as ptxas leaves the PV wait below it, and ptxas moves that wait up: next to the pipeline
barriers' arrives, and ahead of any branch taken while PV is in flight. A branch there (Q's release in the
last iteration) once put the wait above the whole softmax of the D128 block_n 128 and D64 loops, unnoticed, at
2-4% of their SM cycles (benchmarks/results/prefill_release_q_after_pv.json); V's arrive after O's rescale moved
it below 17 of D128-176's 90 exp2s, from 3 (prefill_release_v_late.json). O's rescale moved from after the PV
wait to under the S GEMM (FA3's order for D > 128) leaves ptxas nothing after the softmax to interleave with the
exp2s but P's conversion: D256, its P converted in pairs (one PV wgmma group), then waits for PV after 15 of its 42
exp2s, from 5, at 3.1-4.1% fewer SM cycles (prefill_rescale_before_pv.json). These tests hold the loops to what
was measured: the exp2s issued before the PV wait, S and PV one wgmma group each, and no branch between the two
waits.

The disassembler is nvdisasm (the test extra installs nvidia-cuda-nvdisasm; NVDISASM names another); the SASS parsing
is benchmarks/probes/sass_loops.py's, which also sets these loops beside FA3's.
"""
import os
import re

import pytest

os.environ.setdefault("CUTE_DSL_NO_CACHE", "1")
pytest.importorskip("cutlass")

from aotc.common.variant import Variant  # noqa: E402
from aotc.families.sdpa_prefill_sm90 import tail_splits  # noqa: E402
from aotc.kernels import sdpa_prefill_sm90 as kernel  # noqa: E402
from benchmarks.probes.sass_loops import between_waits, disassemble, kv_loops, nvdisasm  # noqa: E402

NVDISASM = nvdisasm()
pytestmark = pytest.mark.skipif(NVDISASM is None, reason="no nvdisasm (pip install nvidia-cuda-nvdisasm)")


def steady_loops(cubin: bytes) -> list[list[str]]:
    """The kv loops of the kernel (benchmarks.probes.sass_loops.kv_loops: bodies of backward branches holding both
    GEMMs of an iteration, under 1000 instructions)."""
    return kv_loops(disassemble(cubin))


# (head_dim, block_n, causal): the fewest exp2s before the PV wait over the kernel's kv loops, as compiled for
# the measurements above (nvidia-cutlass-dsl 4.8.1; before them D128-128 had 0, D128-176 3, D256 5). D64 (three
# consumer warpgroups at 160 registers) waits for PV after its row maxima whatever the order: recorded, not a goal;
# so is D128-176 causal's 10 (49 with O's rescale after the PV wait, at the same SM cycles within 0.2%).
EXP2S_BEFORE_PV_WAIT = {  # of the 66, 90 and 42 exp2s an iteration issues at block_n 128, 176 and 80
    (128, 128, False): 24,
    (128, 176, False): 24,
    (128, 176, True): 10,
    (256, 80, False): 15,
    (64, 128, False): 0,
}


@pytest.mark.parametrize("head_dim,block_n,causal", sorted(EXP2S_BEFORE_PV_WAIT))
def test_the_softmax_overlaps_the_pv_gemm(tmp_path, head_dim, block_n, causal):
    v = Variant.make("sdpa_prefill_sm90", "sm_90a", dtype="bf16", head_dim=head_dim, layout="dense", causal=causal,
                     block_n=block_n)
    loops = steady_loops(kernel.compile(v, dump_dir=str(tmp_path)).cubin)
    assert loops, "no kv loop found in the SASS"
    windows = [between_waits(body) for body in loops]
    counts = [sum("MUFU.EX2" in op for op in w) for w in windows]
    if tail_splits(v):
        # the split tail's pieces run a copy of the loops of their own, after the whole rounds' in the code; a
        # non-causal tile masks only its first block (first_block, before the loops), so of each copy only the
        # unmasked loop, the shorter, runs: the whole rounds' (nearly all the work) is held to what was measured
        assert len(loops) == 4, f"{len(loops)} kv loops: expected the whole rounds' two and the split tail's two"
        counts = [min(zip(loops[:2], counts[:2]), key=lambda lc: len(lc[0]))[1]]
    assert min(counts) >= EXP2S_BEFORE_PV_WAIT[head_dim, block_n, causal], (
        f"exp2s before the PV wait per kv loop: {counts}: ptxas now waits for PV earlier in the softmax; "
        "re-measure (benchmarks/probes/cycles_ab.py) before accepting it")
    assert not any(re.search(r"\bBRA\b", op) for w in windows for op in w), "a branch while the PV GEMM is in flight"
    # the S wait (wait_group 1) leaves PV's group in flight only if PV is one group: ptxas splits it where P's
    # registers are written between its wgmmas (P converted singly and merged: D256's PV GEMM became five groups,
    # and the S wait also waited for four of them)
    groups = [sum("HGMMA" in op and "gsb0" in op for op in body[:body.index(w[0])]) for body, w in zip(loops, windows)]
    assert max(groups) <= 2, f"wgmma groups issued before the S wait per kv loop: {groups}; expected S and PV, one each"


@pytest.mark.parametrize("layout", ["dense", "ragged", "paged16"])
def test_the_soft_capped_kv_loop_against_a_fixed_offset_has_no_row_max(tmp_path, layout):
    """bf16 soft-cap compiles the kv loop twice (aotc.kernels.softmax.capped_softmax_row): against the cap's fixed
    offset, no row max (FMNMX), no quad shuffle and no exp2 of an O rescale factor, and the online softmax for
    softcaps above the bound. Up to D128 the fixed-offset loop takes its row sums from the tensor cores (sum_by_mma:
    an m64n8 wgmma per k slice in PV's group, no FADD a score) and runs its tanhs under the PV GEMM; ptxas then
    issues its exp2s after the PV wait, next to P's conversion, at 4.1% fewer SM cycles than with the FADDs and 78
    exp2s before that wait (benchmarks/results/prefill_softcap_sum_mma.json, dense). The ragged and paged kernels
    (Runtime.attention's serving path) hold the same loops; their masked loop (the diagonal's second block, a chunk's
    unaligned prefix) waits for PV before its tanhs at paged16, as the dense masked loop does at block_n 128: recorded
    here, not measured. The dense online loop keeps its exp2s ahead of the PV wait; the ragged and paged ones, at
    232 consumer registers, wait for PV first (240 with a 32-register producer hung: benchmarks/experiments/README.md)."""
    v = Variant.make("sdpa_prefill_sm90", "sm_90a", dtype="bf16", head_dim=128, layout=layout, causal=True,
                     block_n=176, softcap=True)
    loops = steady_loops(kernel.compile(v, dump_dir=str(tmp_path)).cubin)
    fixed = [body for body in loops if not any("FMNMX" in op for op in body)]
    online = [body for body in loops if any("FMNMX" in op for op in body)]
    assert fixed and online, f"kv loops with / without a row max: {len(online)} / {len(fixed)}; expected both"
    for body in fixed:
        assert not any("SHFL" in op for op in body), "a quad shuffle in the fixed-offset loop"
        # one exp2 a score (88 at block_n 176, two rows of 44 a thread), none for a rescale factor
        assert sum("MUFU.EX2" in op for op in body) == 88
        assert not any(op.startswith("FADD") for op in body), "a row-sum FADD in the loop whose sums come from wgmma"
        assert sum("HGMMA.64x8x16" in op for op in body) == 176 // 16, "one row-sum wgmma a k slice of P"
    for body in fixed if layout == "dense" else [min(fixed, key=len)]:  # the unmasked loop is the shortest
        assert sum("MUFU.TANH" in op for op in between_waits(body)) >= 80
    if layout == "dense":
        for body in online:
            assert sum("MUFU.EX2" in op for op in between_waits(body)) >= 24


def test_the_soft_capped_d256_loop_keeps_its_fadd_row_sums(tmp_path):
    """D256's tensor pipe is 93% busy: the row sums' wgmmas cost it 4.5% more SM cycles, so its sums stay FADDs."""
    v = Variant.make("sdpa_prefill_sm90", "sm_90a", dtype="bf16", head_dim=256, layout="dense", causal=True,
                     block_n=80, softcap=True)
    loops = steady_loops(kernel.compile(v, dump_dir=str(tmp_path)).cubin)
    assert loops, "no kv loop found in the SASS"
    for body in loops:
        assert not any("HGMMA.64x8x16" in op for op in body)
        assert sum(op.startswith("FADD") for op in body) >= 40  # a thread's 2 rows x 20 scores at block_n 80
