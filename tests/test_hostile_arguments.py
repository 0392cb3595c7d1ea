"""Property-based hostile arguments against the runtime's validation layer (no GPU, no launch).

Generated argument sets for sdpa_combine and sdpa_prefill (dense and ragged) start valid and get zero or
more perturbations (dtype, ndim, shapes, strides, alignment, device, overlapping or self-overlapping
outputs, extents beyond int32 and the grid, head dims not covered, H_q not a multiple of H_kv, bad
cu_seqlens and max_seqlen, ...). An oracle written here, independently of aotc.runtime.validate, lists
every rule a case breaks and the arguments each broken rule involves. The property:

* the oracle finds nothing  -> the check passes;
* the oracle finds a breach -> the check raises ArgumentError (a ValueError) naming an argument of one
  of the breached rules, and one the perturbations touched (directly, or through a rule that compares
  it with the perturbed one);
* any other exception fails the test.

Then as_tensor / tensor() / as_stream fuzz: junk objects, broken __dlpack__, __dlpack_device__ and
__cuda_array_interface__, and well-formed DLPack capsules with random headers give a record or an
ArgumentError / ArgumentTypeError, never anything else.

Hypothesis draws the structure of each case (extents, dtypes, which perturbations); the many small
details (stride orders and padding, placement, perturbation parameters) come from a Random that
hypothesis seeds (``st.randoms(use_true_random=True)``), which keeps ~12,000 derandomized examples at
about a millisecond each.
"""
from __future__ import annotations

import ctypes
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aotc.common.errors import ArgumentError
from aotc.runtime.combine import CombinePlan
from aotc.runtime.prefill import check_prefill
from aotc.runtime.tensors import DTYPES, TensorArg, as_stream, as_tensor, tensor

INT32_MAX = 2**31 - 1
GRID_YZ = 65535
COMBINE_HEADS = frozenset({64, 128, 256})
PREFILL_HEADS = frozenset({64, 128})
ALL_DTYPES = sorted(DTYPES)
OK_DEVICES = (("cuda", 0), ("cuda", -1))
OUTPUTS = ("out", "lse")  # the arguments an overlap is blamed on

N_COMBINE = 4000
N_DENSE = 2500
N_RAGGED = 2500
N_AS_TENSOR = 2000
N_TENSOR = 1000
N_STREAM = 500
TOTAL_EXAMPLES = N_COMBINE + N_DENSE + N_RAGGED + N_AS_TENSOR + N_TENSOR + N_STREAM

OUTCOMES: dict[str, dict[str, int]] = {"combine": {}, "prefill dense": {}, "prefill ragged": {}}


def fuzz(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


class StubRuntime:
    """What the checks ask of a Runtime: the head dims its loaded kernels cover (no Hopper prefill
    kernels here: prefill takes the union of both prefill families' head dims)."""

    def field_values(self, family, field, device):
        assert field == "head_dim" and device == 0
        return set({"sdpa_combine": COMBINE_HEADS, "sdpa_prefill": PREFILL_HEADS,
                    "sdpa_prefill_sm90": frozenset()}[family])


STUB = StubRuntime()


class R:
    """The fine-grained choices of one example, from a Random hypothesis seeded."""

    def __init__(self, rnd: random.Random):
        self.r = rnd

    def int(self, a: int, b: int) -> int:
        return self.r.randint(a, b)

    def pick(self, seq):
        return seq[self.r.randrange(len(seq))]

    def coin(self, p: float = 0.5) -> bool:
        return self.r.random() < p

    def perm(self, seq) -> list:
        return self.r.sample(list(seq), len(seq))


# ---------------------------------------------------------------------------- mutable tensor specs

class T:
    """A tensor under construction: mutable, turned into a TensorArg at the end."""

    def __init__(self, shape, strides, dtype, ptr=0, device=("cuda", 0)):
        self.shape, self.strides = list(shape), list(strides or ())
        self.dtype, self.ptr, self.device = dtype, ptr, device

    def record(self) -> TensorArg:
        if self.device[0] == "cuda" and self.device[1] >= 0:
            return tensor(self.ptr, tuple(self.shape), tuple(self.strides), self.dtype, self.device[1])
        # what as_tensor gives for CAI producers (-1) and host or foreign DLPack devices
        return TensorArg(self.ptr, tuple(self.shape), tuple(self.strides), self.dtype, self.device)


def span(t: T):
    """[lo, hi) bytes any element can occupy, or None when the tensor has no element."""
    if any(n == 0 for n in t.shape):
        return None
    neg = sum(s * (n - 1) for n, s in zip(t.shape, t.strides) if s < 0)
    pos = sum(s * (n - 1) for n, s in zip(t.shape, t.strides) if s > 0)
    size = DTYPES[t.dtype]
    return t.ptr + neg * size, t.ptr + (pos + 1) * size


def layout(r: R, shape, *, unit_last: bool, multiple: int, negative: bool, zero: bool) -> list[int]:
    """Strides (elements) of a non-self-overlapping layout of `shape`, dims in a random order.

    unit_last: the last dim has stride 1 and every other stride is a multiple of `multiple`.
    negative / zero: some strides are negated / are 0 (a broadcast: for inputs only)."""
    nd = len(shape)
    rest = r.perm(range(nd - 1) if unit_last else range(nd))
    order = ([nd - 1] if unit_last else []) + rest  # innermost first
    strides = [0] * nd
    acc = 1
    for i, d in enumerate(order):
        if i == 0 and unit_last:
            s = 1
        else:
            s = max(-(-acc // multiple) * multiple + multiple * r.pick((0, 0, 1, 2)), multiple)
        strides[d] = s
        acc = s * max(shape[d], 1)
    for d in range(nd - 1 if unit_last else nd):
        if zero and r.coin(0.1):
            strides[d] = 0
        elif negative and r.coin(0.15):
            strides[d] = -strides[d]
    return strides


def place(r: R, tensors: dict[str, T], align: dict[str, int]) -> None:
    """A pointer for every tensor, with its alignment, in a random order, none overlapping."""
    cursor = r.pick((1 << 32, 1 << 40, (1 << 47) - (1 << 30)))
    for name in r.perm(sorted(tensors)):
        t, a = tensors[name], align[name]
        t.ptr = 0
        lo, hi = span(t) or (0, 0)
        ptr = cursor - lo
        t.ptr = -(-ptr // a) * a + a * r.pick((0, 0, 1, 3))
        cursor = t.ptr + hi + r.pick((0, 0, 4, 16, 256))


class Case:
    """A generated argument set, and what its perturbations touched."""

    def __init__(self, r: R, tensors: dict[str, T | None], dtype_links: dict, shape_links: dict):
        self.r = r
        self.t = tensors
        self.touched: set[str] = set()
        self.applied: list[str] = []
        # who else a check may blame when a tensor's dtype or shape changes (it is compared with them)
        self.dtype_links, self.shape_links = dtype_links, shape_links
        self.ragged = False
        self.max_q = self.max_kv = None

    def names(self, pred=lambda t: True) -> list[str]:
        return sorted(n for n, t in self.t.items() if t is not None and pred(t))

    def touch(self, what: str, *names: str) -> None:
        self.applied.append(what)
        self.touched.update(names)

    def __repr__(self) -> str:
        return f"Case({self.applied})"


def base_name(err_name: str) -> str:
    if err_name == "B * S_q * H":
        return err_name
    m = re.match(r"\w+", err_name)
    return m.group() if m else err_name


def check_property(case: Case, breaches: list[set[str]], call, key: str) -> None:
    try:
        call()
    except ArgumentError as e:
        assert breaches, f"refused a valid case {case.applied}: {e}"
        got = base_name(e.name)
        allowed = set().union(*breaches)
        assert got in allowed, f"error names {e.name!r}, the broken rules involve {allowed} {case.applied}: {e}"
        assert got in case.touched, f"error names {e.name!r}, the perturbations touched {case.touched}: {e}"
        assert e.name in str(e) and isinstance(e, ValueError)
    except Exception as e:
        raise AssertionError(f"{type(e).__name__} escaped the validation {case.applied}: {e}") from e
    else:
        assert not breaches, f"accepted a case that breaks {breaches} {case.applied}"
        got = "pass"
    OUTCOMES[key][got] = OUTCOMES[key].get(got, 0) + 1


def self_overlapping(t: T) -> bool:
    """Two elements at one address for sure: a zero stride, or two dims with one |stride| (extents > 1)."""
    live = [abs(s) for n, s in zip(t.shape, t.strides) if n > 1]
    return 0 in live or len(set(live)) != len(live)


def overlap_breaches(outputs: dict[str, T | None], inputs: dict[str, T | None]) -> list[set[str]]:
    out = []
    every = {**inputs, **outputs}
    for oname, o in outputs.items():
        so = None if o is None else span(o)
        if so is None:
            continue
        if self_overlapping(o):
            out.append({oname})
        for name, t in every.items():
            s = None if t is None or name == oname else span(t)
            if s is not None and s[0] < so[1] and so[0] < s[1]:
                out.append({oname, name})
    return out


# ---------------------------------------------------------------------------- perturbations (shared)

def p_dtype(case: Case):
    r = case.r
    name = r.pick(case.names())
    case.t[name].dtype = r.pick(ALL_DTYPES)
    case.touch(f"dtype {name}={case.t[name].dtype}", name, *case.dtype_links.get(name, ()), *OUTPUTS)


def p_ndim(case: Case):
    r = case.r
    name = r.pick(case.names())
    t = case.t[name]
    if t.shape and r.coin():
        i = r.int(0, len(t.shape) - 1)
        del t.shape[i], t.strides[i]
    else:
        i = r.int(0, len(t.shape))
        t.shape.insert(i, r.int(1, 3))
        t.strides.insert(i, r.pick((0, 1, 8, 1 << 20)))
    case.touch(f"ndim {name}={len(t.shape)}", name, *case.shape_links.get(name, ()), *OUTPUTS)


def p_shape(case: Case):
    r = case.r
    name = r.pick(case.names(lambda t: t.shape))
    t = case.t[name]
    i = r.int(0, len(t.shape) - 1)
    t.shape[i] = r.int(0, 9)
    case.touch(f"shape {name}[{i}]={t.shape[i]}", name, *case.shape_links.get(name, ()), *OUTPUTS)


def p_stride(case: Case):
    r = case.r
    name = r.pick(case.names(lambda t: t.shape))
    t = case.t[name]
    i = r.int(0, len(t.shape) - 1)
    t.strides[i] = r.pick((r.int(-3, 3), t.strides[i] + r.int(1, 9), 2**40 + 4, -(2**40) - 8, 2**62))
    case.touch(f"stride {name}[{i}]={t.strides[i]}", name, *OUTPUTS)  # outputs: via overlap


def p_pointer(case: Case):
    r = case.r
    name = r.pick(case.names())
    t = case.t[name]
    t.ptr = min(r.pick((t.ptr + r.int(1, 15), t.ptr + r.int(1, 3) * 16, 0, 2**64 - 16, r.int(0, 2**64 - 1))),
                2**64 - 1)
    case.touch(f"pointer {name}={t.ptr:#x}", name, *OUTPUTS)


def p_device(case: Case):
    r = case.r
    name = r.pick(case.names())
    case.t[name].device = r.pick((("cuda", 1), ("cuda", 7), ("cpu", 0), ("other", 14), ("cuda", -1)))
    case.touch(f"device {name}={case.t[name].device}", name)


def p_overlap(case: Case):
    """Move an output onto another tensor's bytes, keeping 16-byte alignment."""
    r = case.r
    outs = [n for n in OUTPUTS if case.t.get(n) is not None]
    oname = r.pick(outs)
    other = r.pick(case.names(lambda t: t is not case.t[oname]))
    t = case.t[other]
    lo, hi = span(t) or (t.ptr, t.ptr + 16)
    case.t[oname].ptr = max(0, min(r.int(lo, max(lo, hi - 1)), 2**64 - 16)) // 16 * 16  # a valid address
    case.touch(f"overlap {oname} onto {other}", oname, other, *OUTPUTS)  # may now overlap the other output too


def p_self_overlap(case: Case):
    """An output whose elements share addresses: a zero stride, or two dims with one stride."""
    r = case.r
    outs = [n for n in OUTPUTS if case.t.get(n) is not None and len(case.t[n].shape) >= 2]
    if not outs:
        return
    name = r.pick(outs)
    t = case.t[name]
    i, j = r.r.sample(range(len(t.shape)), 2)
    t.shape[i] = max(t.shape[i], 2)
    t.strides[i] = r.pick((0, t.strides[j], -t.strides[j]))
    case.touch(f"self-overlap {name}[{i}]", name, *case.shape_links.get(name, ()), *OUTPUTS)


SHARED = (p_dtype, p_ndim, p_shape, p_stride, p_pointer, p_device, p_overlap, p_self_overlap)


# ---------------------------------------------------------------------------- sdpa_combine

def c_head_dim(case: Case):
    d = case.r.pick((0, 1, 8, 32, 96, 192, 512))
    for n in ("o_partial", "out"):
        if len(case.t[n].shape) >= 4:
            case.t[n].shape[-1] = d
    case.touch(f"head_dim={d}", "o_partial")


def c_extents(case: Case):
    """B, S_q or H (consistently in every tensor), their product, or splits beyond int32."""
    r = case.r
    what = r.pick(("B", "S_q", "H", "BSH", "splits"))
    big = r.pick((2**31, 2**31 + 1, 2**32 + 5, 2**40))
    sizes = {"B": 2**11, "S_q": 2**10, "H": 2**10} if what == "BSH" else {what: big}
    axes = {"o_partial": ("splits", "B", "S_q", "H"), "lse_partial": ("splits", "B", "H", "S_q"),
            "out": ("B", "S_q", "H"), "lse": ("B", "H", "S_q")}
    for n, dims in axes.items():
        x = case.t.get(n)
        for ax, dim in enumerate(dims):
            if x is not None and dim in sizes and ax < len(x.shape):
                x.shape[ax] = sizes[dim]
    case.touch(f"extent {what}", "o_partial", "lse_partial", "out", "lse", "B * S_q * H")


def c_swap(case: Case):
    """lse_partial passed where lse goes (an overlap, and mostly a shape mismatch)."""
    lp = case.t["lse_partial"]
    case.t["lse"] = T(lp.shape, lp.strides, lp.dtype, lp.ptr, lp.device)
    case.touch("lse=lse_partial", "lse", "lse_partial", "o_partial")


COMBINE_PERTURBATIONS = SHARED + (c_head_dim, c_extents, c_swap)


def perturbation_lists(choices):
    # a quarter without perturbation (valid cases), the rest with one to three
    return st.one_of(st.just([]), st.lists(st.sampled_from(choices), min_size=1, max_size=3),
                     st.lists(st.sampled_from(choices), min_size=1, max_size=1),
                     st.lists(st.sampled_from(choices), min_size=1, max_size=3))


# strategies built once (building them per example costs more than drawing from them)
RANDOMS = st.randoms(use_true_random=True)
COMBINE_STRUCTURE = st.tuples(st.tuples(*[st.integers(0, 4)] * 4), st.sampled_from(sorted(COMBINE_HEADS)),
                              st.sampled_from(["fp16", "bf16", "fp32"]), st.booleans(),
                              perturbation_lists(COMBINE_PERTURBATIONS))


@st.composite
def combine_cases(draw):
    (splits, B, S, H), D, out_dtype, with_lse, perturbations = draw(COMBINE_STRUCTURE)
    r = R(draw(RANDOMS))
    t = {"o_partial": T((splits, B, S, H, D), None, "fp32"), "lse_partial": T((splits, B, H, S), None, "fp32"),
         "out": T((B, S, H, D), None, out_dtype), "lse": T((B, H, S), None, "fp32") if with_lse else None}
    t["o_partial"].strides = layout(r, t["o_partial"].shape, unit_last=True, multiple=4, negative=True, zero=True)
    t["lse_partial"].strides = layout(r, t["lse_partial"].shape, unit_last=False, multiple=1, negative=True,
                                      zero=True)
    for n in OUTPUTS:
        if t[n] is not None:
            t[n].strides = layout(r, t[n].shape, unit_last=False, multiple=1, negative=True, zero=False)
    place(r, {n: x for n, x in t.items() if x is not None},
          {"o_partial": 16, "lse_partial": 4, "out": r.pick((DTYPES[out_dtype], 16)), "lse": 4})
    if r.coin(0.1):  # __cuda_array_interface__ producers: ordinal unknown, accepted
        for x in t.values():
            if x is not None and r.coin():
                x.device = ("cuda", -1)
    case = Case(r, t, {}, {"o_partial": ("lse_partial", "out", "lse", "B * S_q * H")})
    assert not combine_oracle(case), ("the generator made an invalid base case", combine_oracle(case))
    for p in perturbations:
        p(case)
    return case


def combine_oracle(case: Case) -> list[set[str]]:
    t = case.t
    op, lp, o, ls = t["o_partial"], t["lse_partial"], t["out"], t["lse"]
    bad: list[set[str]] = []
    for name, x, ok in (("o_partial", op, ("fp32",)), ("lse_partial", lp, ("fp32",)),
                        ("out", o, ("fp16", "bf16", "fp32")), ("lse", ls, ("fp32",))):
        if x is not None and x.dtype not in ok:
            bad.append({name})
    for name, x, nd in (("o_partial", op, 5), ("lse_partial", lp, 4), ("out", o, 4), ("lse", ls, 3)):
        if x is not None and len(x.shape) != nd:
            bad.append({name})
    if len(op.shape) == 5:
        splits, B, S, H, D = op.shape
        if D not in COMBINE_HEADS:
            bad.append({"o_partial"})
        for name, x, want in (("lse_partial", lp, [splits, B, H, S]), ("out", o, [B, S, H, D]),
                              ("lse", ls, [B, H, S])):
            if x is not None and len(x.shape) == len(want) and x.shape != want:
                bad.append({name, "o_partial"})
        if splits > INT32_MAX:
            bad.append({"o_partial"})
        if B * S * H > INT32_MAX:
            bad.append({"B * S_q * H"})
        if D > 1 and op.strides[4] != 1:
            bad.append({"o_partial"})
        if any(n > 1 and s % 4 for n, s in zip(op.shape[:4], op.strides[:4])):
            bad.append({"o_partial"})
    for name, x in t.items():
        if x is not None and x.device not in OK_DEVICES:
            bad.append({name})
    for name, x, a in (("o_partial", op, 16), ("lse_partial", lp, 4), ("out", o, DTYPES[o.dtype]), ("lse", ls, 4)):
        if x is not None and x.ptr % a:
            bad.append({name})
    bad += overlap_breaches({"out": o, "lse": ls}, {"o_partial": op, "lse_partial": lp})
    return bad


@fuzz(N_COMBINE)
@given(combine_cases())
def test_combine_validation_property(case):
    rec = {n: (None if x is None else x.record()) for n, x in case.t.items()}
    check_property(case, combine_oracle(case), lambda: CombinePlan._check(
        STUB, rec["o_partial"], rec["lse_partial"], rec["out"], rec["lse"], 0), "combine")


# ---------------------------------------------------------------------------- sdpa_prefill

QKV = ("q", "k", "v", "out")


def f_head_dim(case: Case):
    d = case.r.pick((0, 1, 8, 32, 96, 256))
    for n in QKV:
        if case.t[n].shape:
            case.t[n].shape[-1] = d
    case.touch(f"head_dim={d}", "q")


def f_heads(case: Case):
    """An H_kv that is 0 or may not divide H_q, in k and v alike."""
    hk = case.r.pick((0, 4, 5, 7))
    for n in ("k", "v"):
        if len(case.t[n].shape) >= 2:
            case.t[n].shape[-2] = hk
    case.touch(f"H_kv={hk}", "k", "q")


def f_extents(case: Case):
    """B, S_q, S_kv or H_q beyond the grid's y/z limit or int32 (consistently where they appear)."""
    r = case.r
    what = r.pick(("B", "S_q", "S_kv", "H_q"))
    big = r.pick((GRID_YZ + 1, 2**31, 2**31 + 7, 2**33))
    if case.ragged:
        if what == "B":
            for n in ("cu_seqlens_q", "cu_seqlens_kv"):
                if case.t[n] is not None and case.t[n].shape:
                    case.t[n].shape[0] = big + 1
        elif what in ("S_q", "S_kv"):
            for n in (("q", "out") if what == "S_q" else ("k", "v")):
                if case.t[n].shape:
                    case.t[n].shape[0] = big
            if what == "S_q" and case.t["lse"] is not None and len(case.t["lse"].shape) == 2:
                case.t["lse"].shape[1] = big
            if what == "S_q":
                case.max_q = big
            else:
                case.max_kv = big
        else:
            for n in ("q", "out"):
                if len(case.t[n].shape) >= 2:
                    case.t[n].shape[-2] = big
            if case.t["lse"] is not None and case.t["lse"].shape:
                case.t["lse"].shape[0] = big
    else:
        axes = {"B": {"q": 0, "k": 0, "v": 0, "out": 0, "lse": 0}, "S_q": {"q": 1, "out": 1, "lse": 2},
                "S_kv": {"k": 1, "v": 1}, "H_q": {"q": 2, "out": 2, "lse": 1}}[what]
        for n, ax in axes.items():
            x = case.t.get(n)
            if x is not None and ax < len(x.shape):
                x.shape[ax] = big
    case.touch(f"extent {what}={big}", "B", "S_q", "S_kv", "H_q", *QKV, "lse", "cu_seqlens_q", "cu_seqlens_kv",
               "max_seqlen_q", "max_seqlen_kv")


def f_max(case: Case):
    r = case.r
    which = r.pick(("max_q", "max_kv"))
    value = r.pick((r.int(-3, 40), 2**31, None, True, False, 3.0, "4", 2**64, -1))
    setattr(case, which, value)
    case.touch(f"{which}={value!r}", "max_seqlen_q" if which == "max_q" else "max_seqlen_kv")


def f_cu(case: Case):
    """A bad cu_seqlens: missing, wrong dtype, 2-D, strided, misaligned, or of the other one's length."""
    r = case.r
    name = r.pick(("cu_seqlens_q", "cu_seqlens_kv"))
    how = r.pick(("missing", "dtype", "ndim", "stride", "pointer", "length"))
    c = case.t[name]
    case.touch(f"{name} {how}", "cu_seqlens_q", "cu_seqlens_kv", *OUTPUTS)
    if c is None:
        return
    if how == "missing":
        case.t[name] = None
    elif how == "dtype":
        c.dtype = r.pick(("int64", "uint8", "fp32", "int8"))
    elif how == "ndim":
        c.shape, c.strides = [1, c.shape[0]] if c.shape else [1, 1], [max(c.shape or [1]), 1]
    elif how == "stride":
        c.strides[0] = r.pick((0, 2, -1))
    elif how == "pointer":
        c.ptr += r.int(1, 3)
    else:
        c.shape[0] = r.int(0, 6)


DENSE_PERTURBATIONS = SHARED + (f_head_dim, f_heads, f_extents)
RAGGED_PERTURBATIONS = DENSE_PERTURBATIONS + (f_max, f_cu)


PREFILL_STRUCTURE = {ragged: st.tuples(
    st.sampled_from(["fp16", "bf16"]), st.sampled_from(sorted(PREFILL_HEADS)),
    st.integers(1, 3), st.integers(0, 3),  # H_kv and H_q / H_kv (H_q = 0 is a valid, empty case)
    st.booleans(),
    st.tuples(st.integers(0, 4), st.integers(0, 12), st.integers(0, 12)) if ragged  # B, total_q, total_kv
    else st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(0, 5)),  # B, S_q, S_kv
    perturbation_lists(RAGGED_PERTURBATIONS if ragged else DENSE_PERTURBATIONS)) for ragged in (False, True)}


@st.composite
def prefill_cases(draw, ragged: bool):
    dtype, D, H_kv, group, with_lse, extents, perturbations = draw(PREFILL_STRUCTURE[ragged])
    H_q = H_kv * group
    if ragged:
        B, total_q, total_kv = extents
        shapes = {"q": (total_q, H_q, D), "k": (total_kv, H_kv, D), "v": (total_kv, H_kv, D), "out": (total_q, H_q, D)}
        lse_shape = (H_q, total_q)
    else:
        B, S_q, S_kv = extents
        shapes = {"q": (B, S_q, H_q, D), "k": (B, S_kv, H_kv, D), "v": (B, S_kv, H_kv, D), "out": (B, S_q, H_q, D)}
        lse_shape = (B, H_q, S_q)
    r = R(draw(RANDOMS))
    t: dict[str, T | None] = {}
    for n in QKV:
        t[n] = T(shapes[n], layout(r, shapes[n], unit_last=True, multiple=8, negative=True, zero=(n != "out")), dtype)
    t["lse"] = T(lse_shape, layout(r, lse_shape, unit_last=False, multiple=1, negative=True, zero=False),
                 "fp32") if with_lse else None
    if ragged:
        t["cu_seqlens_q"] = T((B + 1,), (1,), "int32")
        t["cu_seqlens_kv"] = T((B + 1,), (1,), "int32")
    place(r, {n: x for n, x in t.items() if x is not None},
          {"q": 16, "k": 16, "v": 16, "out": 16, "lse": 4, "cu_seqlens_q": 4, "cu_seqlens_kv": 4})
    if r.coin(0.1):
        for x in t.values():
            if x is not None and r.coin():
                x.device = ("cuda", -1)
    case = Case(r, t, {"q": ("k", "v", "out")}, {
        "q": ("k", "v", "out", "lse", "B", "S_q", "H_q", "max_seqlen_q"), "k": ("v", "max_seqlen_kv", "S_kv"),
        "cu_seqlens_q": ("cu_seqlens_kv",)})
    case.ragged = ragged
    if ragged:
        case.max_q, case.max_kv = r.int(0, shapes["q"][0]), r.int(0, shapes["k"][0])
    assert not prefill_oracle(case), ("the generator made an invalid base case", prefill_oracle(case))
    for p in perturbations:
        p(case)
    return case


def prefill_oracle(case: Case) -> list[set[str]]:
    t, ragged = case.t, case.ragged
    q, k, v, o, ls = t["q"], t["k"], t["v"], t["out"], t["lse"]
    cuq, cuk = t.get("cu_seqlens_q"), t.get("cu_seqlens_kv")
    bad: list[set[str]] = []
    if q.dtype not in ("fp16", "bf16"):
        bad.append({"q"})
    for n in ("k", "v", "out"):
        if t[n].dtype != q.dtype:
            bad.append({n, "q"})
    nd = 3 if ragged else 4
    for n in QKV:
        if len(t[n].shape) != nd:
            bad.append({n})
    if ls is not None and (ls.dtype != "fp32" or len(ls.shape) != (2 if ragged else 3) or ls.ptr % 4):
        bad.append({"lse"})
    if ragged:
        if cuq is None or cuk is None:
            bad.append({"cu_seqlens_q", "cu_seqlens_kv"})
        for n, c in (("cu_seqlens_q", cuq), ("cu_seqlens_kv", cuk)):
            if c is not None and (c.dtype != "int32" or len(c.shape) != 1 or c.ptr % 4
                                  or (c.shape[0] > 1 and c.strides[0] != 1)):
                bad.append({n})
        if cuq is not None and cuk is not None and len(cuq.shape) == len(cuk.shape) == 1:
            if cuq.shape[0] != cuk.shape[0] or cuq.shape[0] < 1:
                bad.append({"cu_seqlens_q", "cu_seqlens_kv"})
    if all(len(t[n].shape) == nd for n in QKV):
        if ragged:
            total_q, H_q, D = q.shape
            total_kv, H_kv, _ = k.shape
            B = cuq.shape[0] - 1 if cuq is not None and len(cuq.shape) == 1 else 0
            for n, m, total in (("max_seqlen_q", case.max_q, total_q), ("max_seqlen_kv", case.max_kv, total_kv)):
                if type(m) is not int or not 0 <= m <= total:
                    bad.append({n})
            S_q = case.max_q if type(case.max_q) is int else 0
            S_kv = case.max_kv if type(case.max_kv) is int else 0
            v_want, lse_want = [total_kv, H_kv, D], [H_q, total_q]
        else:
            B, S_q, H_q, D = q.shape
            _, S_kv, H_kv, _ = k.shape
            if k.shape[0] != B:
                bad.append({"k", "q"})
            v_want, lse_want = [B, S_kv, H_kv, D], [B, H_q, S_q]
        if v.shape != v_want:
            bad.append({"v", "k", "q"})
        if k.shape[-1] != D:
            bad.append({"k", "q"})
        if o.shape != q.shape:
            bad.append({"out", "q"})
        if D not in PREFILL_HEADS:
            bad.append({"q"})
        if H_kv == 0 or H_q % H_kv:
            bad.append({"k", "q"})
        if ls is not None and len(ls.shape) == len(lse_want) and ls.shape != lse_want:
            bad.append({"lse", "q"})
        for name, value in (("B", B), ("S_q", S_q), ("S_kv", S_kv), ("H_q", H_q)):
            if value > INT32_MAX:
                bad.append({name})
        if H_q > GRID_YZ:
            bad.append({"H_q"})
        if B > GRID_YZ:
            bad.append({"B"})
    for name, x in t.items():
        if x is not None and x.device not in OK_DEVICES:
            bad.append({name})
    for n in QKV:
        x = t[n]
        if not x.shape:
            continue
        if x.shape[-1] > 1 and x.strides[-1] != 1:
            bad.append({n})
        if x.ptr % 16:
            bad.append({n})
        if any(e > 1 and s % 8 for e, s in zip(x.shape[:-1], x.strides[:-1])):
            bad.append({n})
    inputs = {"q": q, "k": k, "v": v, "cu_seqlens_q": cuq, "cu_seqlens_kv": cuk}
    bad += overlap_breaches({"out": o, "lse": ls}, inputs)
    return bad


def run_prefill(case: Case, key: str) -> None:
    rec = {n: (None if x is None else x.record()) for n, x in case.t.items()}
    check_property(case, prefill_oracle(case), lambda: check_prefill(
        STUB, 0, {n: rec[n] for n in QKV}, rec["lse"], case.ragged, rec.get("cu_seqlens_q"),
        rec.get("cu_seqlens_kv"), case.max_q, case.max_kv), key)


@fuzz(N_DENSE)
@given(prefill_cases(ragged=False))
def test_prefill_dense_validation_property(case):
    run_prefill(case, "prefill dense")


@fuzz(N_RAGGED)
@given(prefill_cases(ragged=True))
def test_prefill_ragged_validation_property(case):
    run_prefill(case, "prefill ragged")


def test_the_properties_saw_both_outcomes_and_every_kind_of_refusal(capsys):
    """Runs after the three properties (file order): each passed and refused many cases, many ways."""
    if not all(OUTCOMES.values()):
        pytest.skip("run together with the property tests")
    with capsys.disabled():
        for key, seen in OUTCOMES.items():
            print(f"\n{key}: {sum(seen.values())} cases; by the argument refused: "
                  + ", ".join(f"{k} {n}" for k, n in sorted(seen.items(), key=lambda kv: -kv[1])))
    for key, seen in OUTCOMES.items():
        refused = sum(seen.values()) - seen.get("pass", 0)
        assert seen.get("pass", 0) >= 200 and refused >= 1000, (key, seen)
    assert {"o_partial", "lse_partial", "out", "lse", "B * S_q * H"} <= set(OUTCOMES["combine"])
    assert {"q", "k", "v", "out", "lse", "B", "S_q", "S_kv", "H_q"} <= set(OUTCOMES["prefill dense"])
    assert {"cu_seqlens_q", "cu_seqlens_kv", "max_seqlen_q", "max_seqlen_kv"} <= set(OUTCOMES["prefill ragged"])


# ---------------------------------------------------------------------------- as_tensor / tensor / as_stream fuzz

class RaisingIter:
    def __init__(self, exc):
        self.exc = exc

    def __iter__(self):
        raise self.exc("no iteration")


class BadIndex:
    def __init__(self, exc):
        self.exc = exc

    def __index__(self):
        raise self.exc("no index")


class Plain:
    pass


EXCEPTIONS = (RuntimeError, TypeError, ValueError, BufferError, KeyError, AttributeError, NotImplementedError,
              IndexError, ZeroDivisionError, OverflowError, MemoryError)


def junk(r: R, depth: int = 2):
    """A random non-tensor: scalars, strings, containers, objects whose protocols raise."""
    k = r.int(0, 14 if depth else 11)
    if k == 0:
        return None
    if k == 1:
        return r.coin()
    if k == 2:
        return r.pick((0, 1, -1, 2**31, 2**63, 2**64, -(2**64), 2**70, r.int(-(2**65), 2**65)))
    if k == 3:
        return r.pick((0.0, -1.5, float("nan"), float("inf"), 1e300))
    if k == 4:
        return r.pick(("", "x", "cuda", "<f4", "dltensor", "é" * 3))
    if k == 5:
        return r.pick((b"", b"dltensor", bytearray(b"ab")))
    if k == 6:
        return object()
    if k == 7:
        return r.pick((int, str, type, Plain))
    if k == 8:
        return Plain()
    if k == 9:
        return complex(1, 2)
    if k == 10:
        return RaisingIter(r.pick(EXCEPTIONS))
    if k == 11:
        return BadIndex(r.pick(EXCEPTIONS))
    n = r.int(0, 3)
    items = [junk(r, depth - 1) for _ in range(n)]
    if k == 12:
        return items
    if k == 13:
        return tuple(items)
    return {str(i): x for i, x in enumerate(items)}


def raiser(exc):
    def f(*a, **k):
        raise exc("broken")
    return f


# a private prototype: ctypes.pythonapi.PyCapsule_New is one object shared with other test modules' argtypes
_CapsuleNew = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))
CAPSULE_NAMES = (b"dltensor", b"dltensor_versioned", b"used_dltensor", b"used_dltensor_versioned", b"other")
_SCRATCH = (ctypes.c_char * 128)()


class DLTensorHeader(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("byte_offset", ctypes.c_uint64)]


class VersionedHeader(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("t", DLTensorHeader)]


assert ctypes.sizeof(DLTensorHeader) == 48 and ctypes.sizeof(VersionedHeader) == 80


class RandomHeaderProducer:
    """A DLPack producer whose header fields are random but whose memory is all ours: every pointer the
    parser follows (shape, strides: 64 int64 each) is valid, so only the header's values are hostile."""

    def __init__(self, r: R):
        self.versioned = r.coin()
        right = b"dltensor_versioned" if self.versioned else b"dltensor"
        self.name = r.pick((right,) * 5 + CAPSULE_NAMES)
        i64 = lambda: r.pick((r.int(-4, 9), r.int(0, 9), r.int(-(2**63), 2**63 - 1)))  # noqa: E731
        self.shape = (ctypes.c_int64 * 64)(*[i64() for _ in range(64)])
        self.strides = (ctypes.c_int64 * 64)(*[i64() for _ in range(64)])
        m = VersionedHeader() if self.versioned else DLTensorHeader()
        h = m.t if self.versioned else m
        h.data = r.int(0, 2**64 - 1)
        h.device_type = r.pick((1, 2, 13, 4, 0, -1, 2**31 - 1))
        h.device_id = r.pick((0, 1, -1, r.int(-(2**31), 2**31 - 1)))
        h.ndim = r.pick((r.int(0, 6), r.int(0, 6), -1, 64, 65, 2**31 - 1, -(2**31)))
        h.code = r.pick((0, 1, 2, 4, r.int(0, 255)))
        h.bits = r.pick((8, 16, 32, 64, 0, 1, 128, 255))
        h.lanes = r.pick((1, 1, 1, 0, 2, 4, 65535))
        h.shape = ctypes.addressof(self.shape) if r.coin(0.9) else None
        h.strides = ctypes.addressof(self.strides) if r.coin() else None
        h.byte_offset = r.pick((0, 0, 64, r.int(0, 2**64 - 1)))
        if self.versioned:
            m.major = r.pick((1, 1, 1, 0, 2, 2**32 - 1))
            m.minor = r.int(0, 2**32 - 1)
            m.flags = r.pick((0, 0, 1, 2, 3, 2**64 - 1))
        self.m = m
        self.device = r.pick(((2, 0), (1, 0), (13, 0), (4, 1)))

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, max_version=None):
        return _CapsuleNew(ctypes.addressof(self.m), self.name, None)


def cai_dict(r: R) -> dict:
    ints = lambda: r.pick((r.int(-2, 8), r.int(0, 8), r.int(0, 2**64), 2**70))  # noqa: E731
    d = {}
    good = r.coin(0.5)  # half of them well formed but for (at most) a detail
    small = lambda: r.int(0, 8) if good else ints()  # noqa: E731
    if r.coin(0.95):
        d["typestr"] = r.pick(("<f2", "<f4", "<f8", "|i1", "|u1", "<i4", "<i8") if good else (
            ">f4", ">i1", "<c8", "<b1", "f4", "<f16", "", "<V2", "<f4", junk(r)))
    if r.coin(0.95):
        n = r.int(0, 4)
        d["shape"] = r.pick((tuple(small() for _ in range(n)), [small() for _ in range(n)]) if good else (
            tuple(ints() for _ in range(n)), junk(r)))
    if r.coin(0.95):
        d["data"] = (r.int(0, 2**48) * 16, r.coin()) if good else r.pick(
            ((r.pick((ints(), None, junk(r))), r.coin()), junk(r), (1,), (1, 2, 3)))
    if r.coin(0.4):
        d["strides"] = r.pick((None, tuple(ints() for _ in range(r.int(0, 4))), junk(r)))
    if r.coin(0.2):
        d["mask"] = r.pick((None, junk(r)))
    if r.coin(0.3):
        d["version"] = r.int(0, 4)
    return d


def hostile_object(r: R):
    kind = r.pick(("junk", "dlpack", "cai", "both", "header"))
    if kind == "junk":
        return junk(r)
    if kind == "header":
        return RandomHeaderProducer(r)
    ns = {}
    if kind in ("dlpack", "both"):
        how = r.pick(("raise", "return", "property", "noncallable"))
        if how == "raise":
            ns["__dlpack__"] = raiser(r.pick(EXCEPTIONS))
        elif how == "return":
            value = r.pick((junk(r), _CapsuleNew(ctypes.addressof(_SCRATCH), r.pick(CAPSULE_NAMES[2:]), None)))
            ns["__dlpack__"] = lambda self, *a, _v=value, **k: _v
        elif how == "property":
            ns["__dlpack__"] = property(raiser(r.pick(EXCEPTIONS)))
        else:
            ns["__dlpack__"] = junk(r)
        dev = r.pick(("missing", "raise", "property", "junk", "cuda", "cpu"))
        if dev == "raise":
            ns["__dlpack_device__"] = raiser(r.pick(EXCEPTIONS))
        elif dev == "property":
            ns["__dlpack_device__"] = property(raiser(r.pick(EXCEPTIONS)))
        elif dev == "junk":
            ns["__dlpack_device__"] = lambda self, _v=junk(r): _v
        elif dev in ("cuda", "cpu"):
            ns["__dlpack_device__"] = lambda self, _v=(2 if dev == "cuda" else 1): (_v, 0)
    if kind in ("cai", "both"):
        how = r.pick(("dict", "dict", "dict", "property", "junk"))
        if how == "property":
            ns["__cuda_array_interface__"] = property(raiser(r.pick(EXCEPTIONS)))
        else:
            ns["__cuda_array_interface__"] = cai_dict(r) if how == "dict" else junk(r)
    return type(r.pick(("Fake", "Tensor", "ndarray")), (), ns)()


AS_TENSOR_OUTCOMES: dict[str, int] = {}


@fuzz(N_AS_TENSOR)
@given(st.randoms(use_true_random=True), st.sampled_from(["q", "o_partial", "x"]))
def test_as_tensor_fuzz_gives_a_record_or_an_argument_error(rnd, name):
    obj = hostile_object(R(rnd))
    try:
        got = as_tensor(obj, name)
    except ArgumentError as e:  # ArgumentTypeError is one too
        assert e.name == name or e.name.startswith(f"{name}."), e
        assert isinstance(e, ValueError)
        kind = "refused"
    except Exception as e:
        raise AssertionError(f"as_tensor({type(obj).__name__}) raised {type(e).__name__}: {e}") from e
    else:
        assert type(got) is TensorArg
        assert got.dtype in DTYPES and len(got.shape) == len(got.strides)
        assert all(type(n) is int and n >= 0 for n in got.shape), got  # no negative extent gets through
        assert 0 <= got.ptr < 2**64
        kind = "record"
    AS_TENSOR_OUTCOMES[kind] = AS_TENSOR_OUTCOMES.get(kind, 0) + 1


@fuzz(N_TENSOR)
@given(st.randoms(use_true_random=True))
def test_tensor_record_fuzz(rnd):
    r = R(rnd)
    nd = r.int(0, 5)
    ptr = r.pick((r.int(0, 2**64 - 1), -1, 2**64, junk(r)))
    shape = r.pick((tuple(r.pick((r.int(0, 9), -1, 2**63, r.int(0, 2**64))) for _ in range(nd)), junk(r)))
    strides = r.pick((tuple(r.pick((r.int(-9, 9), 2**63, -(2**63) - 1)) for _ in range(r.pick((nd, nd + 1)))),
                      junk(r)))
    dtype = r.pick((r.pick(ALL_DTYPES), "float32", "", junk(r)))
    device = r.pick((0, r.int(0, 7), -1, 2**31, junk(r)))
    try:
        t = tensor(ptr, shape, strides, dtype, device)
    except ArgumentError as e:
        assert base_name(e.name) in ("ptr", "shape", "strides", "dtype", "device"), e
        return
    except Exception as e:
        raise AssertionError(f"tensor() raised {type(e).__name__}: {e}") from e
    assert t.device[0] == "cuda" and 0 <= t.ptr < 2**64 and len(t.shape) == len(t.strides)


@fuzz(N_STREAM)
@given(st.randoms(use_true_random=True))
def test_as_stream_fuzz(rnd):
    r = R(rnd)
    kind = r.int(0, 3)
    if kind == 0:
        obj = junk(r)
    elif kind == 1:
        obj = r.int(-(2**65), 2**65)
    else:
        attr = r.pick(("cuda_stream", "ptr", "__cuda_stream__"))
        value = r.pick((junk(r), property(raiser(r.pick(EXCEPTIONS))), lambda self: (0, 5), (0, r.int(-1, 2**65))))
        obj = type("S", (), {attr: value})()
    try:
        h = as_stream(obj)
    except ArgumentError as e:
        assert e.name == "stream"
        return
    except Exception as e:
        raise AssertionError(f"as_stream raised {type(e).__name__}: {e}") from e
    assert type(h) is int and 0 <= h < 2**64


def test_as_tensor_fuzz_made_records_and_refusals():
    if not AS_TENSOR_OUTCOMES:
        pytest.skip("run together with the as_tensor fuzz")
    assert AS_TENSOR_OUTCOMES.get("record", 0) >= 50 and AS_TENSOR_OUTCOMES.get("refused", 0) >= 1000, \
        AS_TENSOR_OUTCOMES


def test_example_budget():
    assert TOTAL_EXAMPLES >= 10_000


# ---------------------------------------------------------------------------- regressions the fuzz found

def _combine(op, lp, o, ls=None):
    CombinePlan._check(STUB, op, lp, o, ls, 0)


def _packed(shape):
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


def test_an_empty_input_overlaps_nothing():
    """splits = 0: o_partial and lse_partial have no element, wherever their pointers point."""
    base = 1 << 32
    o = tensor(base, (2, 1, 4, 64), _packed((2, 1, 4, 64)), "bf16")
    op = tensor(base + 256, (0, 2, 1, 4, 64), (2 * 4 * 64, 4 * 64, 4 * 64, 64, 1), "fp32")  # inside out's bytes
    lp = tensor(base + 512, (0, 2, 4, 1), (8, 4, 1, 1), "fp32")
    _combine(op, lp, o)


@pytest.mark.parametrize("strides", [(0, 256, 64, 1), (256, 256, 64, 1), (256, 64, 64, 1), (256, 64, -64, 1)])
def test_an_output_whose_elements_share_addresses_is_refused(strides):
    base = 1 << 32
    op = tensor(base, (1, 2, 2, 2, 64), _packed((1, 2, 2, 2, 64)), "fp32")
    lp = tensor(base + (1 << 20), (1, 2, 2, 2), _packed((1, 2, 2, 2)), "fp32")
    o = tensor(base + (2 << 20), (2, 2, 2, 64), strides, "bf16")
    with pytest.raises(ArgumentError, match=r"out\.stride\[\d\].*distinct address per element"):
        _combine(op, lp, o)


def test_a_broadcast_lse_output_is_refused():
    base = 1 << 32
    op = tensor(base, (1, 2, 3, 2, 64), _packed((1, 2, 3, 2, 64)), "fp32")
    lp = tensor(base + (1 << 20), (1, 2, 2, 3), _packed((1, 2, 2, 3)), "fp32")
    o = tensor(base + (2 << 20), (2, 3, 2, 64), _packed((2, 3, 2, 64)), "fp32")
    ls = tensor(base + (3 << 20), (2, 2, 3), (6, 3, 0), "fp32")
    with pytest.raises(ArgumentError, match=r"lse\.stride\[2\]"):
        _combine(op, lp, o, ls)


def test_ragged_output_overlapping_cu_seqlens_is_refused():
    base = 1 << 32
    q = tensor(base, (8, 2, 64), (128, 64, 1), "bf16")
    k = tensor(base + (1 << 20), (8, 2, 64), (128, 64, 1), "bf16")
    v = tensor(base + (2 << 20), (8, 2, 64), (128, 64, 1), "bf16")
    out = tensor(base + (3 << 20), (8, 2, 64), (128, 64, 1), "bf16")
    cuq = tensor(base + (3 << 20) + 64, (3,), (1,), "int32")  # inside out: the kernel would overwrite it
    cuk = tensor(base + (4 << 20), (3,), (1,), "int32")
    with pytest.raises(ArgumentError, match="not overlapping cu_seqlens_q") as ei:
        check_prefill(STUB, 0, {"q": q, "k": k, "v": v, "out": out}, None, True, cuq, cuk, 4, 4)
    assert ei.value.name == "out"


def test_hand_built_record_with_a_negative_extent_is_refused():
    base = 1 << 32
    op = TensorArg(base, (1, -1, 1, 1, 64), (64, 64, 64, 64, 1), "fp32", ("cuda", 0))
    lp = TensorArg(base + (1 << 20), (1, -1, 1, 1), (1, 1, 1, 1), "fp32", ("cuda", 0))
    o = TensorArg(base + (2 << 20), (-1, 1, 1, 64), (64, 64, 64, 1), "fp32", ("cuda", 0))
    with pytest.raises(ArgumentError, match="non-negative extents"):
        _combine(op, lp, o)


def test_dlpack_export_with_a_negative_extent_is_refused():
    r = R(random.Random(0))
    p = RandomHeaderProducer(r)
    p.name, p.device = (b"dltensor_versioned" if p.versioned else b"dltensor"), (2, 0)
    h = p.m.t if p.versioned else p.m
    if p.versioned:
        p.m.major, p.m.flags = 1, 0
    h.ndim, h.code, h.bits, h.lanes, h.shape = 2, 2, 32, 1, ctypes.addressof(p.shape)
    p.shape[0], p.shape[1] = 4, -3
    with pytest.raises(ArgumentError, match="non-negative shape"):
        as_tensor(p, "x")
    p.shape[1] = 3
    assert as_tensor(p, "x").shape == (4, 3)


@pytest.mark.parametrize("attr", ["__dlpack__", "__dlpack_device__"])
def test_dlpack_attributes_that_raise_when_read_are_argument_errors(attr):
    ns = {"__dlpack__": lambda self, **k: None, "__dlpack_device__": lambda self: (2, 0)}
    ns[attr] = property(raiser(RuntimeError))
    with pytest.raises(ArgumentError, match="RuntimeError"):
        as_tensor(type("Producer", (), ns)(), "q")


def test_broken_index_and_iteration_are_argument_errors():
    with pytest.raises(ArgumentError, match="ptr"):
        tensor(BadIndex(ZeroDivisionError), (1,), (1,), "fp32")
    with pytest.raises(ArgumentError, match="shape"):
        tensor(0, RaisingIter(RuntimeError), (1,), "fp32")
    with pytest.raises(ArgumentError, match="stream"):
        as_stream(type("S", (), {"ptr": property(raiser(RuntimeError))})())
    with pytest.raises(ArgumentError, match="stream"):
        as_stream(type("S", (), {"cuda_stream": BadIndex(ValueError)})())
