"""The fp8 decode kernel's fragment bookkeeping, emulated on the CPU (no GPU): the e4m3 bytes ldmatrix brings
into each lane's registers (from the MMA's own fragment coordinates, as the CuTe copies load them), the
conversions and word moves the kernel does (aotc.kernels.sdpa_decode k_step / fp8_pv), and the MMA's view
of the result, checked against the K and V the kernel must multiply: S = Q K^T with Q stored in
fp8_column order, and O's columns permuted as the epilogue undoes."""
import os

import pytest

os.environ.setdefault("CUTE_DSL_NO_CACHE", "1")
pytest.importorskip("cutlass")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402

from aotc.kernels.fp8 import fp8_column  # noqa: E402
from aotc.kernels.warp_mma import make_warp_mma  # noqa: E402

KW = 16
HEAD_DIMS = (128, 256)  # the head dims with fp8 decode tiles (aotc.families.sdpa_decode)


def coordinates(D):
    """Per lane, the (row, col) of every element of the B fragments the kernel uses at head dim D."""
    out = {}

    @cute.jit
    def trace():
        mma = make_warp_mma(cutlass.Float16, 1)
        for name, shape in (("k_pairs", (KW, D // 2)), ("k", (KW, D)), ("v_pairs", (D // 2, KW)), ("v", (64, KW))):
            c = cute.make_identity_tensor(shape)
            out[name] = [[tuple(p[i]) for i in range(cute.size(p))]
                         for p in (mma.get_slice(lane).partition_B(c) for lane in range(32))]
            out[name + "_shape"] = str(mma.get_slice(0).partition_B(c).shape)

    trace()
    return out


@pytest.fixture(scope="module", params=HEAD_DIMS)
def coords(request):
    return {"D": request.param, **coordinates(request.param)}


def test_fragments_are_the_layout_the_word_formulas_assume(coords):
    D = coords["D"]
    assert coords["k_pairs_shape"] == f"((2, 2), 2, {D // 32})" and coords["k_shape"] == f"((2, 2), 2, {D // 16})"
    assert coords["v_pairs_shape"] == f"((2, 2), {D // 16}, 1)" and coords["v_shape"] == "((2, 2), 8, 1)"
    for name in ("k_pairs", "k", "v_pairs", "v"):
        for lane in range(32):
            c = coords[name][lane]
            for w in range(len(c) // 2):  # a word's two halves: the same row (n), consecutive k
                (n0, k0), (n1, k1) = c[2 * w], c[2 * w + 1]
                assert n1 == n0 and k1 == k0 + 1, (name, lane, w)


def test_k_words_give_the_mma_k_in_fp8_column_order(coords):
    # tag each byte of K by (key, d); a lane's loaded word w holds the bytes of its two 16-bit pairs
    kp, kr = coords["k_pairs"], coords["k"]
    n_t = 2
    for lane in range(32):
        loaded = []
        for w in range(len(kp[lane]) // 2):
            (n, j0), (_, j1) = kp[lane][2 * w], kp[lane][2 * w + 1]
            loaded.append([(n, 2 * j0), (n, 2 * j0 + 1), (n, 2 * j1), (n, 2 * j1 + 1)])
        real = [None] * (len(kr[lane]) // 2)
        for kk in range(coords["D"] // 32):  # the kernel's loop (k_step, KV8)
            for nt in range(n_t):
                for j in range(2):
                    x = loaded[j + 2 * nt + 2 * n_t * kk]
                    real[2 * nt + 2 * n_t * (2 * kk + j)] = x[0:2]
                    real[1 + 2 * nt + 2 * n_t * (2 * kk + j)] = x[2:4]
        for w, halves in enumerate(real):
            for e in range(2):
                n, k = kr[lane][2 * w + e]
                key, d = halves[e]
                assert key == n and (d & ~15) | fp8_column(d & 15) == k, (lane, w, e, halves[e], (n, k))


def test_v_words_give_the_permuted_columns_the_epilogue_restores(coords):
    # the kernel loads the whole tile's pairs at once (fp8_pv) and converts 64 columns of D at a time
    vp, vr = coords["v_pairs"], coords["v"]
    D = coords["D"]
    n_all, chunks = D // 16, D // 64
    n_u = n_all // chunks
    for lane in range(32):
        loaded = []
        for w in range(len(vp[lane]) // 2):
            (j, key0), (_, key1) = vp[lane][2 * w], vp[lane][2 * w + 1]  # (pair column, key)
            loaded.append([(key0, 2 * j), (key0, 2 * j + 1), (key1, 2 * j), (key1, 2 * j + 1)])
        for h in range(chunks):
            real = [None] * (len(vr[lane]) // 2)
            for u in range(n_u):  # the kernel's loop (fp8_pv), one k16 step
                for v1 in range(2):
                    b = loaded[v1 + 2 * (h * n_u + u)]
                    real[v1 + 2 * (2 * u)] = [b[0], b[2]]      # prmt 0x3120: bytes 0, 2 | 1, 3
                    real[v1 + 2 * (2 * u + 1)] = [b[1], b[3]]
            for w, halves in enumerate(real):
                for e in range(2):
                    n, k = vr[lane][2 * w + e]  # the MMA's (column n of chunk h of O, key k)
                    key, d = halves[e]
                    assert key == k, (lane, w, e)
                    assert d == 64 * h + ((n >> 4) << 4) + ((n & 7) << 1) + ((n >> 3) & 1), (lane, h, w, e, n, d)
