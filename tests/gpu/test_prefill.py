"""sdpa_prefill (portable, mma.sync) on the GPU: every variant of the default bundle against an
fp32 torch reference; the cases and tolerances are in prefill_cases.py."""
from __future__ import annotations

import pytest

from prefill_cases import (DENSE_CASES, RAGGED_CASES, run_bad_arguments, run_custom_scale_and_no_lse, run_dense,
                           run_large_score_range, run_ragged)

pytestmark = pytest.mark.gpu
FAMILY = "sdpa_prefill"


@pytest.mark.parametrize("case", DENSE_CASES, ids=lambda c: "B{}_Sq{}_Skv{}_H{}-{}_{}".format(*c))
def test_prefill_dense_matches_reference(rt, case):
    run_dense(rt, FAMILY, case)


@pytest.mark.parametrize("case", RAGGED_CASES, ids=lambda c: f"q{c[0]}_kv{c[1]}_H{c[2]}-{c[3]}")
def test_prefill_ragged_matches_reference(rt, case):
    run_ragged(rt, FAMILY, case)


def test_prefill_large_score_range(rt):
    run_large_score_range(rt, FAMILY)


def test_prefill_custom_scale_and_no_lse(rt):
    run_custom_scale_and_no_lse(rt, FAMILY)


def test_prefill_bad_arguments(rt):
    run_bad_arguments(rt, FAMILY)
