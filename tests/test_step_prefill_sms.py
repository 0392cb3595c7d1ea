"""aotc.runtime.attention.step_prefill_sms: a mixed step's two kernels go side by side (half the SMs for the paged
kernel) only where the decode rows' KV reads outweigh the chunks' work by SIDE_BY_SIDE_RATIO."""
from __future__ import annotations

import pytest

from aotc.runtime.attention import (DECODE_BYTES_PER_US, PREFILL_FLOPS_PER_US, SIDE_BY_SIDE_RATIO,
                                    step_prefill_sms)

LLAMA = {"heads_q": 32, "heads_kv": 8, "head_dim": 128}


def sms(seqs, sm_count=132, **kw):
    return step_prefill_sms(sm_count, [q for q, _ in seqs], [k for _, k in seqs], **{**LLAMA, **kw})


def test_steps_of_one_kind_run_one_kernel_after_the_other():
    assert sms([(1, 4096)] * 64) is None  # decode rows only
    assert sms([(2048, 2048)]) is None     # a chunk only
    assert sms([(0, 4096), (0, 10)]) is None
    assert sms([]) is None


def test_a_chunk_beside_many_long_decode_rows_goes_side_by_side_and_a_long_chunk_does_not():
    assert sms([(2048, 2048)] + [(1, 4096)] * 63) == 66  # 264 us of KV at 4 TB/s against 57 us of chunk
    assert sms([(2048, 2048)] + [(1, 4096)] * 63, sm_count=114) == 57
    assert sms([(2048, 10240)] + [(1, 4096)] * 63) is None  # the chunk over 8192 cached keys outweighs them
    assert sms([(512, 512)] + [(0, 9999)] * 3 + [(1, 8192)] * 127) == 66  # empty sequences count for nothing


def test_the_boundary_is_the_ratio_of_the_estimated_times():
    """One chunk of s_q queries (no prefix: s_q (s_q + 1) / 2 keys seen) beside n decode rows of 4096 keys."""
    per_row_us = 2 * 4096 * 8 * 128 * 2 / DECODE_BYTES_PER_US
    chunk_us = 4 * 32 * 128 * (1024 * 1025 // 2) / PREFILL_FLOPS_PER_US
    n = int(SIDE_BY_SIDE_RATIO * chunk_us / per_row_us)  # the most rows that still lose to the chunk
    assert sms([(1024, 1024)] + [(1, 4096)] * n) is None
    assert sms([(1024, 1024)] + [(1, 4096)] * (n + 1)) == 66


@pytest.mark.parametrize("kw", [{"kv_itemsize": 1}, {"window_left": 127}, {"causal": False}])
def test_fp8_windows_and_non_causal_chunks_change_the_estimates(kw):
    """A 2048-token chunk (57 us at the assumed rate, causal) beside 12 rows of 8192 keys (101 us of bf16 KV): side by
    side; e4m3 halves the bytes, a window of 128 keys leaves each row 128, a non-causal chunk sees every key (twice
    the work): one after the other."""
    seqs = [(2048, 2048)] + [(1, 8192)] * 12
    assert sms(seqs) == 66
    assert sms(seqs, **kw) is None


def test_speculative_rows_count_as_decode_rows_up_to_decode_query_len():
    seqs = [(2048, 2048)] + [(1, 8192)] * 6 + [(4, 8192)] * 6
    assert sms(seqs) is None  # the 4-query rows are the paged kernel's: half the KV reads, more chunk work
    assert sms(seqs, decode_query_len=4) == 66
