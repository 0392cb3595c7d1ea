"""Property-based hostile arguments against the runtime's validation layer (no GPU, no launch).

Generated argument sets for sdpa_combine, sdpa_prefill (dense and ragged), sdpa_decode (paged NHD/HND
pools or dense K/V) and the attention entry point (ragged q over paged NHD/HND pools, check_attention)
start valid and get zero or more perturbations (dtype, ndim, shapes, strides, alignment, device,
overlapping or self-overlapping outputs, extents beyond int32 and the grid, head dims not covered, H_q
not a multiple of H_kv, bad cu_seqlens and max_seqlen; for decode also misaligned int32 lengths, page
tables, empty pools, page sizes not served, kv_layout strings, S_q out of range, overlapping output rows,
B at the grid limit, ...; for attention also cu_seqlens_q of another length, rank or layout, H_q / H_kv
not dividing 64 (0 included), B, total_q, total_q * H_q / H_kv and max_pages * page_size at and past
int32, strides no multiple of 8, element-aligned pointers that are not 16-byte aligned). An oracle
written here, independently of aotc.runtime.validate, lists every rule a case breaks and the arguments
each broken rule involves.
The property:

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
hypothesis seeds (``st.randoms(use_true_random=True)``), which keeps ~14,500 derandomized examples at
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
from aotc.runtime import validate as V
from aotc.runtime.attention import check_attention
from aotc.runtime.combine import CombinePlan
from aotc.runtime.decode import check_decode
from aotc.runtime.prefill import check_prefill
from aotc.runtime.tensors import DTYPES, TensorArg, as_stream, as_tensor, tensor

INT32_MAX = 2**31 - 1
GRID_YZ = 65535
COMBINE_HEADS = frozenset({64, 128, 256})
PREFILL_HEADS = frozenset({64, 128})
DECODE_HEADS = frozenset({64, 128})  # 256 stands for a decode head dim no loaded kernel covers
ATTENTION_PAGES = frozenset({16, 32, 128})  # 64 stands for a page size no loaded kernel serves
ALL_DTYPES = sorted(DTYPES)
OK_DEVICES = (("cuda", 0), ("cuda", -1))
OUTPUTS = ("out", "lse")  # the arguments an overlap is blamed on

N_COMBINE = 2500
N_DENSE = 1500
N_RAGGED = 1500
N_DECODE = 3000
N_ATTENTION = 2500
N_AS_TENSOR = 2000
N_TENSOR = 1000
N_STREAM = 500
TOTAL_EXAMPLES = N_COMBINE + N_DENSE + N_RAGGED + N_DECODE + N_ATTENTION + N_AS_TENSOR + N_TENSOR + N_STREAM

OUTCOMES: dict[str, dict[str, int]] = {"combine": {}, "prefill dense": {}, "prefill ragged": {}, "decode": {},
                                       "attention": {}}


def fuzz(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


class StubRuntime:
    """What the checks ask of a Runtime: the head dims its loaded kernels cover (the Hopper prefill
    family's are the portable one's: prefill takes their union), and the Hopper family's layouts
    (attention serves the page sizes of its pagedP kernels; None: a kernel of a bundle that records no
    layout)."""

    def field_values(self, family, field, device):
        assert device == 0
        if field == "layout":
            assert family == "sdpa_prefill_sm90"
            return {"dense", "ragged", None} | {f"paged{p}" for p in ATTENTION_PAGES}
        assert field == "head_dim"
        return set({"sdpa_combine": COMBINE_HEADS, "sdpa_prefill": PREFILL_HEADS,
                    "sdpa_prefill_sm90": PREFILL_HEADS, "sdpa_decode": DECODE_HEADS}[family])


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

    def __init__(self, r: R, tensors: dict[str, T | None], dtype_links: dict, shape_links: dict,
                 derived: dict | None = None):
        self.r = r
        self.t = tensors
        self.touched: set[str] = set()
        self.applied: list[str] = []
        # who else a check may blame when a tensor's dtype or shape changes (it is compared with them)
        self.dtype_links, self.shape_links = dtype_links, shape_links
        # the quantities a check computes from an argument and names on their own (attention's H_q / H_kv
        # from q's and the pool's heads): touching the argument touches them
        self.derived = derived or {}
        self.ragged = False
        self.max_q = self.max_kv = None

    def names(self, pred=lambda t: True) -> list[str]:
        return sorted(n for n, t in self.t.items() if t is not None and pred(t))

    def touch(self, what: str, *names: str) -> None:
        self.applied.append(what)
        self.touched.update(names)
        for n in names:
            self.touched.update(self.derived.get(n, ()))

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


def records(case: Case) -> dict[str, TensorArg | None]:
    return {n: (None if x is None else x.record()) for n, x in case.t.items()}


def self_overlapping(t: T) -> bool:
    """The output rule of every family: a layout that does not nest (see nested()) may put two elements at
    one address (a zero stride, two dims with one |stride|, rows that overlap), so it is refused."""
    return not nested(t)


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


def device_breaches(t: dict[str, T | None]) -> list[set[str]]:
    return [{name} for name, x in t.items() if x is not None and x.device not in OK_DEVICES]


def operand_breaches(operands: dict[str, T]) -> list[set[str]]:
    """The rules of attention's q, k, v and out (TMA or 128-bit accesses): the head dim (last) contiguous,
    16-byte aligned, every other stride a multiple of 16 bytes (8 elements, 16 of an fp8 cache; dims of extent 1
    excepted)."""
    bad = []
    for n, x in operands.items():
        if x.shape[-1] > 1 and x.strides[-1] != 1:
            bad.append({n})
        if x.ptr % 16:
            bad.append({n})
        step = 16 if x.dtype == "fp8_e4m3" else 8
        if any(e > 1 and s % step for e, s in zip(x.shape[:-1], x.strides[:-1])):
            bad.append({n})
    return bad


def unknown_ordinals(r: R, t: dict[str, T | None]) -> None:
    """Now and then some tensors come from __cuda_array_interface__ producers: ordinal unknown, accepted."""
    if r.coin(0.1):
        for x in t.values():
            if x is not None and r.coin():
                x.device = ("cuda", -1)


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
    unknown_ordinals(r, t)
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
    bad += device_breaches(t)
    for name, x, a in (("o_partial", op, 16), ("lse_partial", lp, 4), ("out", o, DTYPES[o.dtype]), ("lse", ls, 4)):
        if x is not None and x.ptr % a:
            bad.append({name})
    bad += overlap_breaches({"out": o, "lse": ls}, {"o_partial": op, "lse_partial": lp})
    return bad


@fuzz(N_COMBINE)
@given(combine_cases())
def test_combine_validation_property(case):
    rec = records(case)
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
    unknown_ordinals(r, t)
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
    bad += device_breaches(t)
    bad += operand_breaches({n: t[n] for n in QKV if t[n].shape})
    inputs = {"q": q, "k": k, "v": v, "cu_seqlens_q": cuq, "cu_seqlens_kv": cuk}
    bad += overlap_breaches({"out": o, "lse": ls}, inputs)
    return bad


def run_prefill(case: Case, key: str) -> None:
    rec = records(case)
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


# ---------------------------------------------------------------------------- sdpa_decode

PAGE_SIZES = (16, 32, 64, 128)
MAX_S_Q = 16
DECODE_GRID_B = 2**15 - 2  # the chunk schedule: B + target chunks share 2**15 - 1 slots, at least one chunk
QKVO = ("q", "k_cache", "v_cache", "out")
DECODE_INPUTS = ("q", "k_cache", "v_cache", "seqlens_kv", "page_table")
# extents at and past the limits, set before the layouts are made: (what, value)
DECODE_EXTREMES = (("B", DECODE_GRID_B), ("B", DECODE_GRID_B + 1), ("B", 2**31), ("rows", "at"),
                   ("rows", "over"), ("max_pages", INT32_MAX), ("max_pages", 2**31))


def nested(t: T) -> bool:
    """The decode output rule: every element its own address, by nesting. Taken in order of |stride|, each
    dimension (extent > 1) steps past the farthest offset the dimensions before it reach, which is what any
    slice, permutation or flip of one dense buffer gives."""
    reach = 0
    for s, n in sorted((abs(s), n) for n, s in zip(t.shape, t.strides) if n > 1):
        if s <= reach:
            return False
        reach += s * (n - 1)
    return True


def paged_breaches(t: dict[str, T | None], lse_rank: int, operands: list[str], inputs: tuple[str, ...]):
    """The rules decode and attention state alike: lse fp32 of its rank and 4-byte aligned, every tensor on
    the device, the operand rules (of the operands of the right rank), outputs overlapping nothing."""
    ls = t["lse"]
    bad = [{"lse"}] if ls is not None and (ls.dtype != "fp32" or len(ls.shape) != lse_rank or ls.ptr % 4) else []
    return (bad + device_breaches(t) + operand_breaches({n: t[n] for n in operands})
            + overlap_breaches({"out": t["out"], "lse": ls}, {n: t[n] for n in inputs}))


def decode_capacity(case: Case) -> int:
    """The KV length the current page table (or dense K) holds, for perturbations that pick max_seqlen_kv."""
    k, pt = case.t["k_cache"], case.t["page_table"]
    if pt is not None and len(pt.shape) == 2 and len(k.shape) > case.tok_ax:
        return pt.shape[1] * k.shape[case.tok_ax]
    return k.shape[case.tok_ax] if pt is None and len(k.shape) > case.tok_ax else 0


def d_head_dim(case: Case):
    d = case.r.pick((0, 1, 8, 32, 96, 256, 512))
    for n in QKVO:
        if case.t[n].shape:
            case.t[n].shape[-1] = d
    case.touch(f"head_dim={d}", "q", *OUTPUTS)


def d_heads(case: Case):
    """An H_kv that is 0, may not divide H_q, or is past the grid limit, in both pools."""
    hk = case.r.pick((0, 4, 5, 7, GRID_YZ + 1))
    for n in ("k_cache", "v_cache"):
        if len(case.t[n].shape) > case.head_ax:
            case.t[n].shape[case.head_ax] = hk
    case.touch(f"H_kv={hk}", "k_cache", "q", "H_kv", *OUTPUTS)


def d_kv_head_dim(case: Case):
    """K and V pools of one head dim, not q's (changing one pool alone is a K/V mismatch first)."""
    d = case.r.pick((0, 32, 64, 128, 256))
    for n in ("k_cache", "v_cache"):
        if case.t[n].shape:
            case.t[n].shape[-1] = d
    case.touch(f"kv head_dim={d}", "k_cache", *OUTPUTS)


def break_lengths(r: R, c: T, how: str, lengths: tuple[int, ...] = ()) -> None:
    """An int32 vector (seqlens_kv, cu_seqlens_q) of another dtype, rank, stride or length (one of
    `lengths`, one more or less, or any), or at a pointer +1..3 bytes (misaligned int32)."""
    if how == "dtype":
        c.dtype = r.pick(("int64", "uint8", "fp32", "int8", "fp16"))
    elif how == "ndim":
        n = c.shape[0] if c.shape else 1
        c.shape, c.strides = r.pick(([[1, n], [n, 1]], [[n, 1], [1, 1]], [[], []]))
    elif how == "stride" and c.shape:
        c.strides[0] = r.pick((0, 2, -1))
    elif how == "pointer":
        c.ptr += r.int(1, 3)
    elif c.shape:
        c.shape[0] = r.pick(lengths + (c.shape[0] + 1, max(c.shape[0] - 1, 0), r.int(0, 6)))


def d_seqlens(case: Case):
    how = case.r.pick(("dtype", "ndim", "stride", "pointer", "pointer", "length"))
    break_lengths(case.r, case.t["seqlens_kv"], how)
    case.touch(f"seqlens_kv {how}", "seqlens_kv", *OUTPUTS)


PAGE_TABLE_BREAKS = ("dtype", "ndim", "rows", "width", "pointer", "strides", "strides")


def break_page_table(r: R, pt: T, how: str) -> None:
    """A bad dtype, rank, row count, width or pointer (misaligned), or odd strides (valid)."""
    if how == "dtype":
        pt.dtype = r.pick(("int64", "uint8", "fp32", "int8"))
    elif how == "ndim":
        pt.shape, pt.strides = r.pick(([pt.shape[:1], [1]], [pt.shape + [1], pt.strides + [1]]))
    elif how == "rows" and pt.shape:  # (an earlier perturbation may have taken dims away)
        pt.shape[0] = r.pick((pt.shape[0] + 1, r.int(0, 5)))
    elif how == "width" and len(pt.shape) > 1:
        pt.shape[1] = r.int(0, 6)
    elif how == "pointer":
        pt.ptr += r.int(1, 3)
    elif how == "strides":
        pt.strides = [r.pick((0, 1, -1, r.int(-9, 9), 2**16 + 3, -(2**16))) for _ in pt.shape]


def page_table_strides(r: R, pt: T) -> list[int]:
    """Any strides (the table is read by index): a layout, or junk including 0 and negatives."""
    return (layout(r, pt.shape, unit_last=False, multiple=1, negative=True, zero=True) if r.coin(0.7)
            else [r.pick((0, 1, -1, 2**16 + 3, -(2**16))) for _ in pt.shape])


def d_page_table(case: Case):
    """A bad page table (see break_page_table), or none for a paged pool and one for dense K/V (the pool
    is then read the other way)."""
    r, pt = case.r, case.t["page_table"]
    if pt is None:
        B = case.t["q"].shape[0] if case.t["q"].shape else 1
        case.t["page_table"] = T((B, r.int(0, 3)), (r.int(1, 4), 1), "int32", far_pointer(case, 4))
        case.touch("page_table added", "page_table", "k_cache", "H_kv", *OUTPUTS)
        return
    how = r.pick(PAGE_TABLE_BREAKS + ("drop",))
    if how == "drop":
        case.t["page_table"] = None
    else:
        break_page_table(r, pt, how)
    case.touch(f"page_table {how}", "page_table", "k_cache", "H_kv", *OUTPUTS)


def far_pointer(case: Case, align: int) -> int:
    """An address past every tensor of the case (so a new tensor overlaps nothing)."""
    top = max((span(t) or (t.ptr, t.ptr))[1] for t in case.t.values() if t is not None)
    ptr = -(-(top + 256) // align) * align
    return ptr if ptr < 2**63 else 4096  # a pointer perturbation went near the top: low memory instead


def d_kv_layout(case: Case):
    r = case.r
    value = r.pick(("HND" if case.kv_layout == "NHD" else "NHD",) * 4
                   + ("nhd", "", "NHD ", None, 0, b"NHD", ("NHD",), "dense", "paged16"))
    case.kv_layout = value
    case.touch(f"kv_layout={value!r}", "kv_layout", "k_cache", "H_kv", "page_table")


def d_seqlen_q(case: Case):
    s = case.r.pick((0, MAX_S_Q + 1, 32, 1000))
    for n, ax in (("q", 1), ("out", 1), ("lse", 2)):
        x = case.t[n]
        if x is not None and len(x.shape) > ax:
            x.shape[ax] = s
    case.touch(f"S_q={s}", "q", "out", "lse", "H_q", *OUTPUTS)


def d_max(case: Case):
    r = case.r
    cap = decode_capacity(case)
    case.max_kv = r.pick((None, -1, True, False, 3.0, "4", cap, cap + 1, cap + r.int(1, 200), 2**31, 2**64,
                          2**1100, r.int(0, max(cap, 0))))
    case.touch(f"max_seqlen_kv={case.max_kv!r:.20}", "max_seqlen_kv", "page_table", "k_cache")


def d_page_size(case: Case):
    if case.t["page_table"] is None:
        return
    p = case.r.pick((0, 1, 8, 15, 16, 32, 64, 128, 256, 512))
    for n in ("k_cache", "v_cache"):
        if len(case.t[n].shape) > case.tok_ax:
            case.t[n].shape[case.tok_ax] = p
    case.touch(f"page_size={p}", "k_cache", "v_cache", "page_table", *OUTPUTS)


def d_empty_pool(case: Case):
    """Pools with no page (dense: no token)."""
    ax = 0 if case.t["page_table"] is not None else 1
    for n in ("k_cache", "v_cache"):
        if len(case.t[n].shape) > ax:
            case.t[n].shape[ax] = 0
    case.touch("empty pools", "k_cache", "v_cache", *OUTPUTS)


def d_alias(case: Case):
    """out is q (an in-place decode), or lse sits on seqlens_kv."""
    r = case.r
    if case.t["lse"] is not None and r.coin(0.3):
        case.t["lse"].ptr = case.t["seqlens_kv"].ptr // 4 * 4
        case.touch("lse on seqlens_kv", "lse", "seqlens_kv", *OUTPUTS)
    else:
        q = case.t["q"]
        case.t["out"] = T(q.shape, q.strides, q.dtype, q.ptr, q.device)
        case.touch("out is q", "out", "q", *OUTPUTS)


def d_out_rows(case: Case):
    """An output stride that makes rows overlap: one of out's strides but the head dim's 0 or below the
    head dim (head stride 8 with D = 128), or lse strides such as (0, 0, 1) or (1, 1)."""
    r = case.r
    ls = case.t["lse"]
    if ls is not None and len(ls.shape) in (2, 3) and r.coin(0.4):
        if len(ls.shape) == 3:
            choices = ((0, 0, 1), (1, 1, 1), (0, 1, 0), (1, 2, 1), (ls.shape[2], 1, 1))
        else:
            choices = ((0, 1), (1, 1), (1, 0), (max(ls.shape[1] - 1, 0), 1), (1, max(ls.shape[0] - 1, 0)))
        ls.strides = list(r.pick(choices))
        case.touch(f"lse strides {ls.strides}", "lse", *OUTPUTS)
        return
    o = case.t["out"]
    axes = [a for a in range(len(o.shape) - 1) if o.shape[a] > 1] or list(range(len(o.shape) - 1))
    if not axes or not o.shape:
        return
    a = r.pick(axes)
    D = max(o.shape[-1], 1)
    o.strides[a] = r.pick((0, 8, max(D - 8, 0), D // 2, -8, D))  # D: rows just apart (valid for the head axis)
    case.touch(f"out.stride[{a}]={o.strides[a]}", "out", *OUTPUTS)


DECODE_PERTURBATIONS = SHARED + (d_head_dim, d_heads, d_kv_head_dim, d_seqlens, d_page_table, d_kv_layout,
                                 d_seqlen_q, d_max, d_page_size, d_empty_pool, d_alias, d_out_rows)

DECODE_STRUCTURE = st.tuples(
    st.sampled_from(["fp16", "bf16"]), st.sampled_from(sorted(DECODE_HEADS)),
    st.integers(1, 3), st.integers(0, 3),  # H_kv and H_q / H_kv (H_q = 0 is a valid, empty case)
    st.integers(0, 3), st.integers(1, MAX_S_Q),  # B, S_q
    st.sampled_from((0,) + PAGE_SIZES),  # page size, 0: dense K/V
    st.sampled_from(["NHD", "HND"]), st.booleans(), st.booleans(),  # kv_layout, with lse, with max_seqlen_kv
    st.sampled_from((None,) * 15 + DECODE_EXTREMES),
    perturbation_lists(DECODE_PERTURBATIONS))


@st.composite
def decode_cases(draw):
    dtype, D, H_kv, group, B, S_q, page, kv_layout, with_lse, with_max, extreme, perturbations = draw(
        DECODE_STRUCTURE)
    r = R(draw(RANDOMS))
    H_q = H_kv * group
    max_pages = r.int(0, 4)
    what, value = extreme or (None, None)
    if what == "B":
        B = value
    elif what == "rows":  # S_q * H_q at the int32 limit or just past it
        H_q = H_kv * (INT32_MAX // (S_q * H_kv) + (value == "over"))
    elif what == "max_pages" and page:
        max_pages = value
    tok_ax, head_ax = (1, 2) if kv_layout == "NHD" else (2, 1)  # dense too: [B, S, H_kv, D] or [B, H_kv, S, D]
    kv_shape = [r.int(1, 4) if page else B, 0, 0, D]
    kv_shape[tok_ax], kv_shape[head_ax] = page or r.int(0, 5), H_kv
    t: dict[str, T | None] = {
        "q": T((B, S_q, H_q, D), None, dtype), "out": T((B, S_q, H_q, D), None, dtype),
        "k_cache": T(kv_shape, None, dtype), "v_cache": T(kv_shape, None, dtype),
        "seqlens_kv": T((B,), (1 if B > 1 else r.pick((1, 1, 0, 3, -1)),), "int32"),
        "page_table": T((B, max_pages), None, "int32") if page else None,
        "lse": T((B, H_q, S_q), None, "fp32") if with_lse else None}
    for n in QKVO:  # K and V are separate pools with their own strides; inputs may broadcast
        t[n].strides = layout(r, t[n].shape, unit_last=True, multiple=8, negative=True, zero=(n != "out"))
    if page:
        t["page_table"].strides = page_table_strides(r, t["page_table"])
    if with_lse:
        t["lse"].strides = layout(r, t["lse"].shape, unit_last=False, multiple=1, negative=True, zero=False)
    place(r, {n: x for n, x in t.items() if x is not None},
          {"q": 16, "k_cache": 16, "v_cache": 16, "out": 16, "lse": 4, "seqlens_kv": 4, "page_table": 4})
    unknown_ordinals(r, t)
    # (K and V share one dtype: the queries', or fp8_e4m3 with its scales, so either one's dtype involves the other)
    case = Case(r, t, {"q": ("k_cache", "v_cache", "out"), "k_cache": ("v_cache",), "v_cache": ("k_cache",)}, {
        "q": ("out", "k_cache", "v_cache", "seqlens_kv", "page_table", "lse", "B", "H_q"),
        "k_cache": ("v_cache", "page_table", "H_kv")})
    case.kv_layout, case.tok_ax, case.head_ax = kv_layout, tok_ax, head_ax
    case.max_kv = r.pick((decode_capacity(case), r.int(0, max(decode_capacity(case), 0)))) if with_max else None
    if extreme is not None:
        case.touch(f"extreme {what}={value}", {"B": "B", "rows": "H_q", "max_pages": "page_table"}[what])
    breaches = decode_oracle(case)
    valid_extreme = extreme is None or value in (DECODE_GRID_B, "at", INT32_MAX) or (what == "max_pages"
                                                                                    and not page)
    assert bool(breaches) != valid_extreme, ("the generator's base case", extreme, breaches)
    for p in perturbations:
        p(case)
    return case


def decode_oracle(case: Case) -> list[set[str]]:
    t = case.t
    q, k, v, o, sl, pt, ls = (t[n] for n in ("q", "k_cache", "v_cache", "out", "seqlens_kv", "page_table", "lse"))
    m = case.max_kv
    bad: list[set[str]] = []
    if q.dtype not in ("fp16", "bf16"):
        bad.append({"q"})
    if o.dtype != q.dtype:
        bad.append({"out", "q"})
    if k.dtype not in (q.dtype, "fp8_e4m3"):  # an fp8 cache under 16-bit queries (its scales: kv_scales)
        bad.append({"k_cache", "q"})
    if v.dtype != k.dtype:
        bad.append({"v_cache", "k_cache"})
    four = {n: len(t[n].shape) == 4 for n in QKVO}
    bad += [{n} for n in QKVO if not four[n]]
    layout_ok = type(case.kv_layout) is str and case.kv_layout in ("NHD", "HND")
    if not layout_ok:
        bad.append({"kv_layout"})
    m_ok = m is None or (type(m) is int and m >= 0)
    if not m_ok:
        bad.append({"max_seqlen_kv"})
    page = None
    if four["q"]:
        B, S_q, H_q, D = q.shape
        if four["out"] and o.shape != q.shape:
            bad.append({"out", "q"})
        if not 1 <= S_q <= MAX_S_Q:
            bad.append({"q"})
        if D not in DECODE_HEADS:
            bad.append({"q"})
        if B > INT32_MAX or B > DECODE_GRID_B:
            bad.append({"B"})
        if S_q * H_q > INT32_MAX:  # a sequence's rows, 32-bit in the kernel
            bad.append({"H_q"})
        if four["k_cache"] and four["v_cache"] and layout_ok:
            tok, head = (1, 2) if case.kv_layout == "NHD" else (2, 1)
            if pt is None:
                if k.shape[0] != B:
                    bad.append({"k_cache", "q"})
                if m_ok and m is not None and k.shape[tok] < m:
                    bad.append({"k_cache", "max_seqlen_kv"})
            else:
                page = k.shape[tok]
                if k.shape[0] == 0:
                    bad.append({"k_cache"})
                if page not in PAGE_SIZES:
                    bad.append({"k_cache"})
            H_kv = k.shape[head]
            if v.shape != k.shape:
                bad.append({"v_cache", "k_cache"})
            if k.shape[3] != D:
                bad.append({"k_cache", "q"})
            if H_kv == 0 or H_q % H_kv:
                bad.append({"k_cache", "q"})
            if H_kv > GRID_YZ:
                bad.append({"H_kv"})
        if len(sl.shape) == 1:
            if sl.shape[0] != B:
                bad.append({"seqlens_kv", "q"})
            elif B > 1 and sl.strides[0] != 1:
                bad.append({"seqlens_kv"})
        if pt is not None and len(pt.shape) == 2 and pt.shape[0] != B:
            bad.append({"page_table", "q"})
        if ls is not None and len(ls.shape) == 3 and ls.shape != [B, H_q, S_q]:
            bad.append({"lse", "q"})
    if sl.dtype != "int32" or len(sl.shape) != 1 or sl.ptr % 4:
        bad.append({"seqlens_kv"})
    if pt is not None:
        if pt.dtype != "int32" or len(pt.shape) != 2 or pt.ptr % 4:
            bad.append({"page_table"})
        if len(pt.shape) == 2:
            if pt.shape[1] > INT32_MAX:  # max_pages, a 32-bit kernel parameter
                bad.append({"page_table"})
            if page and m_ok and m is not None and pt.shape[1] * page < m:
                bad.append({"page_table", "max_seqlen_kv", "k_cache"})
    return bad + paged_breaches(t, 3, [n for n in QKVO if four[n]], DECODE_INPUTS)


@fuzz(N_DECODE)
@given(decode_cases())
def test_decode_validation_property(case):
    rec = records(case)
    check_property(case, decode_oracle(case), lambda: check_decode(
        STUB, 0, {n: rec[n] for n in QKVO}, rec["seqlens_kv"], rec["page_table"], rec["lse"], case.max_kv,
        case.kv_layout), "decode")


# ---------------------------------------------------------------------------- attention (paged, ragged q)

POOLS = ("k_cache", "v_cache")
ATTENTION_INPUTS = ("q", "k_cache", "v_cache", "cu_seqlens_q", "seqlens_kv", "page_table")
Q_BOX_ROWS = 64  # the kernel packs a KV head's query heads into 64-row tiles: H_q / H_kv must divide it
# extents at and past the limits, set before the layouts are made: (what, value)
ATTENTION_EXTREMES = (("B", INT32_MAX), ("B", 2**31), ("total_q", "at"), ("total_q", "over"), ("max_pages", "at"),
                      ("max_pages", "over"), ("max_pages", 2**31), ("H_q", 2**31))


def int32_vector_ok(c: T) -> bool:
    """cu_seqlens_q and seqlens_kv: int32, one dimension, contiguous, 4-byte aligned."""
    return (c.dtype == "int32" and len(c.shape) == 1 and not c.ptr % 4
            and not (c.shape[0] > 1 and c.strides[0] != 1))


def a_cu_seqlens(case: Case):
    """A bad cu_seqlens_q (see break_lengths): B + 1 = 0, or another B than the lengths' and the page
    table's, among the lengths."""
    how = case.r.pick(("dtype", "ndim", "stride", "pointer", "length", "length"))
    break_lengths(case.r, case.t["cu_seqlens_q"], how, (0,))
    case.touch(f"cu_seqlens_q {how}", "cu_seqlens_q", *case.shape_links["cu_seqlens_q"], *OUTPUTS)


def a_page_table(case: Case):
    how = case.r.pick(PAGE_TABLE_BREAKS)
    break_page_table(case.r, case.t["page_table"], how)
    case.touch(f"page_table {how}", "page_table", *OUTPUTS)


def a_group(case: Case):
    """H_q / H_kv set to a group of 1 to 64 or not (0 and 65 included), in q, out and lse alike."""
    k, g = case.t["k_cache"], case.r.pick((0, 3, 5, 6, 7, 12, 65, 128, 1, 2, 4, 8, 16, 32, 64))
    h_kv = k.shape[case.head_ax] if len(k.shape) > case.head_ax else 1
    for n, ax in (("q", 1), ("out", 1), ("lse", 0)):
        x = case.t[n]
        if x is not None and len(x.shape) > ax:
            x.shape[ax] = h_kv * g
    case.touch(f"group={g}", "q", "out", "lse", "H_q", "total_q", *OUTPUTS)


def a_odd_stride(case: Case):
    """One stride of q, k_cache, v_cache or out, but the head dim's, grown by 1 to 7 elements: no
    multiple of 8, and no overlap where there was none (p_stride's values seldom break this rule alone)."""
    r = case.r
    name = r.pick(QKVO)
    x = case.t[name]
    axes = [a for a in range(len(x.shape) - 1) if x.shape[a] > 1]
    if not axes:
        return
    a = r.pick(axes)
    x.strides[a] += r.int(1, 7) * (1 if x.strides[a] >= 0 else -1)
    case.touch(f"stride {name}[{a}]={x.strides[a]}", name, *OUTPUTS)


def a_element_aligned(case: Case):
    """q, k_cache, v_cache or out moved by 2 to 14 bytes: element-aligned, not 16-byte aligned."""
    name = case.r.pick(QKVO)
    case.t[name].ptr += 2 * case.r.int(1, 7)
    case.touch(f"pointer {name}={case.t[name].ptr:#x}", name, *OUTPUTS)


ATTENTION_PERTURBATIONS = SHARED + (d_head_dim, d_heads, d_kv_head_dim, d_seqlens, a_page_table, d_kv_layout,
                                    d_page_size, d_empty_pool, d_alias, d_out_rows, a_cu_seqlens, a_group,
                                    a_odd_stride, a_element_aligned)

ATTENTION_STRUCTURE = st.tuples(
    st.sampled_from(["fp16", "bf16"]), st.sampled_from([64, 128, 256]),
    st.integers(1, 3), st.sampled_from((1, 1, 2, 4, 4, 8, 8, 16, 32, 64)),  # H_kv and H_q / H_kv
    st.integers(0, 4), st.integers(0, 12),  # B, total_q
    st.sampled_from(sorted(ATTENTION_PAGES)), st.sampled_from(["NHD", "HND"]), st.booleans(),  # with lse
    st.sampled_from((None,) * 15 + ATTENTION_EXTREMES),
    perturbation_lists(ATTENTION_PERTURBATIONS))


@st.composite
def attention_cases(draw):
    dtype, D, H_kv, group, B, total_q, page, kv_layout, with_lse, extreme, perturbations = draw(
        ATTENTION_STRUCTURE)
    r = R(draw(RANDOMS))
    max_pages = r.int(0, 4)
    what, value = extreme or (None, None)
    if what == "B":
        B = value
    elif what == "total_q":  # total_q * group packed rows at the int32 limit or just past it
        total_q = INT32_MAX // group + (value == "over")
    elif what == "max_pages":  # page_table.shape[1] * page_size at the limit or past it, or the width itself
        max_pages = {"at": INT32_MAX // page, "over": INT32_MAX // page + 1}.get(value, value)
    elif what == "H_q":
        H_kv, group = value, 1
    H_q = H_kv * group
    tok_ax, head_ax = (1, 2) if kv_layout == "NHD" else (2, 1)
    kv_shape = [r.int(1, 4), 0, 0, D]
    kv_shape[tok_ax], kv_shape[head_ax] = page, H_kv
    t: dict[str, T | None] = {
        "q": T((total_q, H_q, D), None, dtype), "out": T((total_q, H_q, D), None, dtype),
        "k_cache": T(kv_shape, None, dtype), "v_cache": T(kv_shape, None, dtype),
        "cu_seqlens_q": T((B + 1,), (1 if B > 0 else r.pick((1, 1, 0, 3, -1)),), "int32"),
        "seqlens_kv": T((B,), (1 if B > 1 else r.pick((1, 1, 0, 3, -1)),), "int32"),
        "page_table": T((B, max_pages), None, "int32"),
        "lse": T((H_q, total_q), None, "fp32") if with_lse else None}
    for n in QKVO:  # K and V are separate pools with their own strides; inputs may broadcast
        t[n].strides = layout(r, t[n].shape, unit_last=True, multiple=8, negative=True, zero=(n != "out"))
    for n in ("q", "out"):  # their token strides serve every later count: positive, whatever the extent
        if t[n].shape[0] <= 1 or t[n].strides[0] <= 0:
            t[n].strides = [abs(t[n].strides[0]) if t[n].shape[0] > 1 and t[n].strides[0]
                            else r.pick((H_q * D, (H_q + 1) * D, 8 * r.int(1, 4096))), *t[n].strides[1:]]
    t["page_table"].strides = page_table_strides(r, t["page_table"])
    if with_lse:
        t["lse"].strides = layout(r, t["lse"].shape, unit_last=False, multiple=1, negative=True, zero=False)
    place(r, {n: x for n, x in t.items() if x is not None},
          {"q": 16, "k_cache": 16, "v_cache": 16, "out": 16, "lse": 4, "cu_seqlens_q": 4, "seqlens_kv": 4,
           "page_table": 4})
    unknown_ordinals(r, t)
    case = Case(r, t, {"q": ("k_cache", "v_cache", "out")}, {
        "q": ("out", "k_cache", "v_cache", "lse"), "k_cache": ("v_cache", "page_table"),
        "cu_seqlens_q": ("seqlens_kv", "page_table", "B")},
        # H_q / H_kv and total_q * H_q / H_kv are checked as such; B is cu_seqlens_q's length - 1
        {n: ("H_q", "total_q") for n in ("q", "k_cache", "kv_layout", "H_kv")} | {"cu_seqlens_q": ("B",)})
    case.kv_layout, case.tok_ax, case.head_ax = kv_layout, tok_ax, head_ax
    if extreme is not None:
        case.touch(f"extreme {what}={value}", {"max_pages": "page_table"}.get(what, what))
    breaches = attention_oracle(case)
    assert bool(breaches) != (extreme is None or value in (INT32_MAX, "at")), ("the generator's base case",
                                                                                extreme, breaches)
    for p in perturbations:
        p(case)
    return case


def attention_oracle(case: Case) -> list[set[str]]:
    t = case.t
    q, k, v, o, cuq, sl, pt, ls = (t[n] for n in ("q", "k_cache", "v_cache", "out", "cu_seqlens_q", "seqlens_kv",
                                                  "page_table", "lse"))
    bad: list[set[str]] = []
    if q.dtype not in ("fp16", "bf16"):
        bad.append({"q"})
    bad += [{n, "q"} for n in ("k_cache", "v_cache", "out") if t[n].dtype != q.dtype]
    ranked = {n: len(t[n].shape) == (4 if n in POOLS else 3) for n in QKVO}
    bad += [{n} for n in QKVO if not ranked[n]]
    layout_ok = type(case.kv_layout) is str and case.kv_layout in ("NHD", "HND")
    if not layout_ok:
        bad.append({"kv_layout"})
    bad += [{n} for n, c in (("cu_seqlens_q", cuq), ("seqlens_kv", sl)) if not int32_vector_ok(c)]
    if pt.dtype != "int32" or len(pt.shape) != 2 or pt.ptr % 4:
        bad.append({"page_table"})
    width = pt.shape[1] if len(pt.shape) == 2 else 0
    if width > INT32_MAX:
        bad.append({"page_table"})
    if len(cuq.shape) == 1:
        B = cuq.shape[0] - 1
        if B < 0:
            bad.append({"cu_seqlens_q"})
        if B > INT32_MAX:
            bad.append({"B"})
        if len(sl.shape) == 1 and sl.shape[0] != B:
            bad.append({"seqlens_kv", "cu_seqlens_q"})
        if len(pt.shape) == 2 and pt.shape[0] != B:
            bad.append({"page_table", "cu_seqlens_q"})
    # q's and out's token strides serve every later step's count, so they must be usable whatever the
    # extent: positive multiples of 8 elements below 2^40 bytes
    for n in ("q", "out"):
        x = t[n]
        if ranked[n] and x.dtype in ("fp16", "bf16") and not (
                x.strides[0] > 0 and x.strides[0] % 8 == 0 and x.strides[0] * 2 < 1 << 40):
            bad.append({n})
    if ranked["q"]:
        total_q, H_q, D = q.shape
        if ranked["out"] and o.shape != q.shape:
            bad.append({"out", "q"})
        bad += [{name} for name, n in (("total_q", total_q), ("H_q", H_q)) if n > INT32_MAX]
        if ls is not None and len(ls.shape) == 2 and ls.shape != [H_q, total_q]:
            bad.append({"lse", "q"})
        if ranked["k_cache"] and ranked["v_cache"] and layout_ok:
            tok, head = (1, 2) if case.kv_layout == "NHD" else (2, 1)
            page, H_kv = k.shape[tok], k.shape[head]
            if v.shape != k.shape:
                bad.append({"v_cache", "k_cache"})
            if k.shape[3] != D:
                bad.append({"k_cache", "q"})
            if k.shape[0] == 0 or page not in ATTENTION_PAGES:
                bad.append({"k_cache"})
            if width * page > INT32_MAX:
                bad.append({"page_table"})
            if H_kv == 0 or H_q % H_kv:
                bad.append({"k_cache", "q"})
            else:
                group = H_q // H_kv
                if not 1 <= group <= Q_BOX_ROWS:  # H_q = 0 is no group: nothing to pack
                    bad.append({"H_q"})
                if total_q * group > INT32_MAX:
                    bad.append({"total_q"})
    return bad + paged_breaches(t, 2, [n for n in QKVO if ranked[n]], ATTENTION_INPUTS)


@fuzz(N_ATTENTION)
@given(attention_cases())
def test_attention_validation_property(case):
    rec = records(case)
    check_property(case, attention_oracle(case), lambda: check_attention(
        STUB, 0, {n: rec[n] for n in QKVO}, rec["cu_seqlens_q"], rec["seqlens_kv"], rec["page_table"], rec["lse"],
        case.kv_layout), "attention")


def test_the_properties_saw_both_outcomes_and_every_kind_of_refusal(capsys):
    """Runs after the five properties (file order): each passed and refused many cases, many ways."""
    if not all(OUTCOMES.values()):
        pytest.skip("run together with the property tests")
    with capsys.disabled():
        for key, seen in OUTCOMES.items():
            print(f"\n{key}: {sum(seen.values())} cases; by the argument refused: "
                  + ", ".join(f"{k} {n}" for k, n in sorted(seen.items(), key=lambda kv: -kv[1])))
    for key, seen in OUTCOMES.items():
        refused = sum(seen.values()) - seen.get("pass", 0)
        assert seen.get("pass", 0) >= 200 and refused >= 0.4 * sum(seen.values()), (key, seen)
    assert {"o_partial", "lse_partial", "out", "lse", "B * S_q * H"} <= set(OUTCOMES["combine"])
    assert {"q", "k", "v", "out", "lse", "B", "S_q", "S_kv", "H_q"} <= set(OUTCOMES["prefill dense"])
    assert {"cu_seqlens_q", "cu_seqlens_kv", "max_seqlen_q", "max_seqlen_kv"} <= set(OUTCOMES["prefill ragged"])
    assert {"q", "k_cache", "v_cache", "out", "lse", "seqlens_kv", "page_table", "kv_layout", "max_seqlen_kv", "B",
            "H_q", "H_kv"} <= set(OUTCOMES["decode"])
    assert {"q", "k_cache", "v_cache", "out", "lse", "cu_seqlens_q", "seqlens_kv", "page_table", "kv_layout", "B",
            "H_q", "total_q"} <= set(OUTCOMES["attention"])


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
    assert TOTAL_EXAMPLES >= 14_000


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


# ---------------------------------------------------------------------------- decode regressions

def _decode_args(*, out_strides=None, lse_strides=None, seqlens_offset=0, pages=4, heads_q=4, seqlen_q=1,
                 max_pages=2, kv_layout="NHD", lse=False):
    """A valid paged decode (B=2, H_kv=2, D=128, page 16) but for the one detail a test changes."""
    base = 1 << 32
    B, D, H_kv, P = 2, 128, 2, 16
    qs = (B, seqlen_q, heads_q, D)
    kv = (pages, P, H_kv, D) if kv_layout == "NHD" else (pages, H_kv, P, D)
    q = tensor(base, qs, _packed(qs), "bf16")
    k = tensor(base + (1 << 40), kv, _packed(kv), "bf16")
    v = tensor(base + (2 << 40), kv, _packed(kv), "bf16")
    o = tensor(base + (3 << 40), qs, out_strides or _packed(qs), "bf16")
    sl = tensor(base + (4 << 40) + seqlens_offset, (B,), (1,), "int32")
    pt = tensor(base + (5 << 40), (B, max_pages), (max_pages, 1), "int32")
    ls = tensor(base + (6 << 40), (B, heads_q, seqlen_q), lse_strides or _packed((B, heads_q, seqlen_q)),
                "fp32") if lse or lse_strides else None
    return {"q": q, "k_cache": k, "v_cache": v, "out": o}, sl, pt, ls, kv_layout


def _decode(t, sl, pt, ls, kv_layout, max_seqlen_kv=32):
    return check_decode(STUB, 0, t, sl, pt, ls, max_seqlen_kv, kv_layout)


def test_decode_regression_base_case_is_valid():
    """The arguments the regressions below start from pass (so each refusal is the one detail's)."""
    _decode(*_decode_args(lse=True))
    _decode(*_decode_args(kv_layout="HND", lse=True))


@pytest.mark.parametrize("axis", [0, 2])
def test_decode_out_with_a_zero_batch_or_head_stride_is_refused(axis):
    strides = list(_packed((2, 1, 4, 128)))
    strides[axis] = 0
    with pytest.raises(ArgumentError, match=rf"out\.stride\[{axis}\].*distinct address per element") as ei:
        _decode(*_decode_args(out_strides=tuple(strides)))
    assert ei.value.name == f"out.stride[{axis}]"


@pytest.mark.parametrize("head_stride", [8, 64, 120])
def test_decode_out_whose_heads_overlap_is_refused(head_stride):
    """Head stride below D = 128 (a multiple of 8, so no other rule catches it): rows overlap."""
    with pytest.raises(ArgumentError, match=r"out\.stride\[2\].*distinct address per element") as ei:
        _decode(*_decode_args(out_strides=(512, 512, head_stride, 1)))
    assert ei.value.value == head_stride
    _decode(*_decode_args(out_strides=(1024, 1024, 256, 1)))  # heads apart, with a gap: fine


@pytest.mark.parametrize("strides", [(0, 0, 1), (1, 1, 1), (4, 1, 2)])
def test_decode_lse_whose_elements_share_addresses_is_refused(strides):
    """(0, 0, 1) is a broadcast; (4, 1, 2) over [2, 4, 2] puts (0, 2, 0) and (0, 0, 1) at one address."""
    with pytest.raises(ArgumentError, match=r"lse\.stride\[\d\].*distinct address per element"):
        _decode(*_decode_args(lse_strides=strides, seqlen_q=2))


@pytest.mark.parametrize("offset", [1, 2, 3])
def test_decode_misaligned_seqlens_is_refused(offset):
    with pytest.raises(ArgumentError, match="multiple of 4 bytes") as ei:
        _decode(*_decode_args(seqlens_offset=offset))
    assert ei.value.name == "seqlens_kv.data_ptr"


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_decode_pools_without_pages_are_refused(kv_layout):
    with pytest.raises(ArgumentError, match="at least one page") as ei:
        _decode(*_decode_args(pages=0, kv_layout=kv_layout), max_seqlen_kv=0)
    assert ei.value.name == "k_cache.shape[0]"


def test_decode_huge_max_seqlen_kv_is_an_argument_error():
    """Past the page table by more than a float holds: the message's page count is integer arithmetic."""
    with pytest.raises(ArgumentError, match=r"page_table\.shape\[1\]") as ei:
        _decode(*_decode_args(), max_seqlen_kv=2**1100)
    assert str(2**1100 // 16)[:30] in str(ei.value)


@pytest.mark.parametrize("seqlen_q", [1, 16])
def test_decode_rows_past_int32_are_refused(seqlen_q):
    """H_q * S_q rows of a sequence are 32-bit in the kernel (heads_q is an i32 parameter)."""
    over = 2 * (INT32_MAX // (2 * seqlen_q) + 1)  # a multiple of H_kv = 2
    with pytest.raises(ArgumentError, match="H_q") as ei:
        _decode(*_decode_args(heads_q=over, seqlen_q=seqlen_q))
    assert ei.value.name == "H_q"
    _decode(*_decode_args(heads_q=over - 2, seqlen_q=seqlen_q))  # at the limit: fine


def test_decode_page_table_wider_than_int32_is_refused():
    with pytest.raises(ArgumentError, match="at most 2147483647") as ei:
        _decode(*_decode_args(max_pages=2**31))
    assert ei.value.name == "page_table.shape[1]"
    _decode(*_decode_args(max_pages=INT32_MAX))


def _offsets(shape, strides):
    out = [0]
    for n, s in zip(shape, strides):
        out = [o + i * s for o in out for i in range(n)]
    return out


@fuzz(400)
@given(st.randoms(use_true_random=True))
def test_no_self_overlap_accepts_only_layouts_with_distinct_addresses(rnd):
    """V.no_self_overlap against enumeration: what it accepts has one address per element, and every view
    of a dense buffer (stepped slices, flips, a permutation of the dims) is accepted."""
    r = R(rnd)
    nd = r.int(1, 4)
    view = r.coin()
    if view:
        full = [r.int(1, 6) for _ in range(nd)]
        steps = [r.pick((1, 1, 2, 3, -1, -2)) for _ in range(nd)]
        shape = [r.int(0, -(-n // abs(k))) for n, k in zip(full, steps)]
        strides = [d * k for d, k in zip(_packed(full), steps)]
        order = r.perm(range(nd))
        shape, strides = [shape[i] for i in order], [strides[i] for i in order]
    else:
        shape = [r.int(0, 4) for _ in range(nd)]
        strides = [r.pick((0, 1, 2, 3, 4, 6, 8, 12, -1, -4)) for _ in range(nd)]
    offsets = _offsets(shape, strides)
    try:
        V.no_self_overlap(TensorArg(1 << 32, tuple(shape), tuple(strides), "fp32", ("cuda", 0)), "x")
    except ArgumentError as e:
        assert not view, ("refused a view of a dense buffer", shape, strides, e)
        assert re.fullmatch(r"x\.stride\[\d\]", e.name), e
    else:
        assert len(set(offsets)) == len(offsets), ("accepted a layout with shared addresses", shape, strides)
