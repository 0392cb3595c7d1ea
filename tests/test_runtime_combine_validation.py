"""sdpa_combine's argument checks, on CPU: each bad argument is refused naming the argument, before any launch."""
from __future__ import annotations

import pytest

from aotc.common.errors import ArgumentError
from aotc.runtime.combine import CombinePlan, layout_key
from aotc.runtime.tensors import tensor
from aotc.runtime.validate import is_packed, packed_strides

BASE = 1 << 32


class StubRuntime:
    """Stands in for Runtime: the head dims the loaded kernels cover."""

    def field_values(self, family, field, device):
        assert (family, field) == ("sdpa_combine", "head_dim")
        return {64, 128, 256}


def rec(ptr, shape, dtype="fp32", strides=None, device=0):
    return tensor(ptr, shape, strides or packed_strides(shape), dtype, device)


def args(splits=3, B=2, S=4, H=5, D=128, out_dtype="bf16", with_lse=True):
    op = rec(BASE, (splits, B, S, H, D))
    lp = rec(BASE + (1 << 28), (splits, B, H, S))
    o = rec(BASE + (2 << 28), (B, S, H, D), out_dtype)
    ls = rec(BASE + (3 << 28), (B, H, S)) if with_lse else None
    return op, lp, o, ls


def check(op, lp, o, ls):
    CombinePlan._check(StubRuntime(), op, lp, o, ls, 0)


def test_good_arguments_pass():
    check(*args())
    check(*args(with_lse=False))
    check(*args(splits=0, S=1))


@pytest.mark.parametrize("mutate, argname", [
    (lambda a: (rec(BASE, a[0].shape, "fp16"), *a[1:]), "o_partial.dtype"),
    (lambda a: (a[0], rec(a[1].ptr, a[1].shape, "bf16"), *a[2:]), "lse_partial.dtype"),
    (lambda a: (*a[:2], rec(a[2].ptr, a[2].shape, "int32"), a[3]), "out.dtype"),
    (lambda a: (*a[:3], rec(a[3].ptr, a[3].shape, "fp16")), "lse.dtype"),
    (lambda a: (rec(BASE, (2, 4, 5, 128)), *a[1:]), "o_partial.shape"),
    (lambda a: (rec(BASE, (3, 2, 4, 5, 96)), *a[1:]), "o_partial.shape[4]"),
    (lambda a: (a[0], rec(a[1].ptr, (3, 2, 4, 5)), *a[2:]), "lse_partial.shape[2]"),
    (lambda a: (*a[:2], rec(a[2].ptr, (2, 4, 6, 128), "bf16"), a[3]), "out.shape[2]"),
    (lambda a: (*a[:3], rec(a[3].ptr, (2, 5, 3))), "lse.shape[2]"),
    (lambda a: (rec(BASE + 4, a[0].shape), *a[1:]), "o_partial.data_ptr"),
    (lambda a: (rec(BASE, a[0].shape, strides=(2 * 4 * 5 * 132, 4 * 5 * 132, 5 * 132, 132, 1)), *a[1:]), None),
    (lambda a: (rec(BASE, a[0].shape, strides=(2 * 4 * 5 * 129, 4 * 5 * 129, 5 * 129, 129, 1)), *a[1:]),
     "o_partial.stride"),
    (lambda a: (rec(BASE, a[0].shape, strides=(2 * 4 * 5 * 256, 4 * 5 * 256, 5 * 256, 256, 2)), *a[1:]),
     "o_partial.stride[4]"),
    (lambda a: (*a[:2], rec(a[2].ptr + 1, a[2].shape, "bf16"), a[3]), "out.data_ptr"),
    (lambda a: (a[0], rec(a[1].ptr, a[1].shape, device=1), *a[2:]), "lse_partial.device"),
    (lambda a: (*a[:2], a[2], rec(a[0].ptr + 64, a[3].shape)), "lse"),  # lse inside o_partial
    (lambda a: (*a[:2], rec(a[1].ptr, a[2].shape, "bf16"), a[3]), "out"),  # out overlapping lse_partial
])
def test_bad_arguments_name_the_argument(mutate, argname):
    bad = mutate(args())
    if argname is None:  # a padded-but-aligned o_partial is fine
        check(*bad)
        return
    with pytest.raises(ArgumentError) as ei:
        check(*bad)
    assert argname in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_extents_beyond_int32_refused():
    big = (1 << 31) + 1
    op = rec(BASE, (1, big, 1, 1, 64), strides=(big * 64, 64, 64, 64, 1))
    lp = rec(BASE + (1 << 40), (1, big, 1, 1))
    o = rec(BASE + (2 << 40), (big, 1, 1, 64), "fp32")
    with pytest.raises(ArgumentError, match="B \\* S_q \\* H"):
        check(op, lp, o, None)


def test_strides_beyond_int32_accepted():
    stride = (1 << 31) + 4
    op = rec(BASE, (2, 1, 1, 4, 64), strides=(stride, 256, 256, 64, 1))
    lp = rec(BASE + (1 << 40), (2, 1, 4, 1))
    o = rec(BASE + (2 << 40), (1, 1, 4, 64), "bf16")
    check(op, lp, o, None)


def test_packed_detection_ignores_unit_dims():
    assert is_packed(rec(0, (1, 4, 8), strides=(999, 8, 1)))
    assert not is_packed(rec(0, (2, 4, 8), strides=(40, 8, 1)))
    assert not is_packed(rec(0, (2, 4, 8), strides=(32, 1, 4)))


def test_layout_key_tracks_out_alignment_class():
    op, lp, o, ls = args()
    o2 = rec(o.ptr + 2, o.shape, "bf16")
    assert layout_key(op, lp, o, ls) != layout_key(op, lp, o2, ls)
