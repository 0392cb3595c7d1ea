"""The fp8 kernels' fragment bookkeeping (aotc.kernels.fp8's gemm_qk_e4m3 and gemm_pv_e4m3, shared by sdpa_decode
and sdpa_prefill's paged layouts), emulated on the CPU (no GPU): the e4m3 bytes ldmatrix brings into each lane's
registers (from the MMA's own fragment coordinates, as the CuTe copies load them), the conversions and word moves
the blocks do, and the MMA's view of the result, checked against the K and V it must multiply: S = Q K^T with Q
stored in fp8_column order, and O's columns permuted as the epilogues undo (o_column). At each head dim, for the
decode kernel's tile (one warp's 16 keys, warp-level MMA of 1 warp) and the portable kernel's (block_n keys, the
4-warp tiled MMA: each thread's fragments hold every key of the tile, several k16 steps of V)."""
import os

import pytest

os.environ.setdefault("CUTE_DSL_NO_CACHE", "1")
pytest.importorskip("cutlass")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402

from aotc.families.sdpa_decode import tile as decode_tile  # noqa: E402
from aotc.families.sdpa_prefill import FP8_HEAD_DIMS, TILES  # noqa: E402
from aotc.kernels.fp8 import fp8_column, o_column  # noqa: E402
from aotc.kernels.warp_mma import make_warp_mma  # noqa: E402

# (head dim, keys of the tile a warp multiplies, warps of the tiled MMA): the decode tiles (fp8 KV: sm_90's) and
# the portable prefill tiles at the head dims that take fp8 KV
SHAPES = sorted({(D, decode_tile(D, "sm_90", "fp8_e4m3").keys_per_warp, 1) for D in (64, 128, 256)}
                | {(D, TILES[D].block_n, TILES[D].warps) for D in FP8_HEAD_DIMS})


def coordinates(D, keys, warps):
    """Per lane (of warp 0), the (row, col) of every element of the B fragments the blocks use."""
    out = {}

    @cute.jit
    def trace():
        mma = make_warp_mma(cutlass.Float16, warps)
        for name, shape in (("k_pairs", (keys, D // 2)), ("k", (keys, D)), ("v_pairs", (D // 2, keys)),
                            ("v", (64, keys))):
            c = cute.make_identity_tensor(shape)
            out[name] = [[tuple(p[i]) for i in range(cute.size(p))]
                         for p in (mma.get_slice(lane).partition_B(c) for lane in range(32))]
            out[name + "_shape"] = str(mma.get_slice(0).partition_B(c).shape)

    trace()
    return out


@pytest.fixture(scope="module", params=SHAPES, ids=lambda s: f"D{s[0]}-keys{s[1]}-warps{s[2]}")
def coords(request):
    D, keys, warps = request.param
    return {"D": D, "keys": keys, **coordinates(D, keys, warps)}


def test_fragments_are_the_layout_the_word_formulas_assume(coords):
    D, n_t, n_kk = coords["D"], coords["keys"] // 8, coords["keys"] // 16
    assert coords["k_pairs_shape"] == f"((2, 2), {n_t}, {D // 32})" and coords["k_shape"] == f"((2, 2), {n_t}, {D // 16})"
    assert coords["v_pairs_shape"] == f"((2, 2), {D // 16}, {n_kk})" and coords["v_shape"] == f"((2, 2), 8, {n_kk})"
    for name in ("k_pairs", "k", "v_pairs", "v"):
        for lane in range(32):
            c = coords[name][lane]
            for w in range(len(c) // 2):  # a word's two halves: the same row (n), consecutive k
                (n0, k0), (n1, k1) = c[2 * w], c[2 * w + 1]
                assert n1 == n0 and k1 == k0 + 1, (name, lane, w)


def test_k_words_give_the_mma_k_in_fp8_column_order(coords):
    # tag each byte of K by (key, d); a lane's loaded word w holds the bytes of its two 16-bit pairs
    kp, kr = coords["k_pairs"], coords["k"]
    n_t = coords["keys"] // 8
    for lane in range(32):
        loaded = []
        for w in range(len(kp[lane]) // 2):
            (n, j0), (_, j1) = kp[lane][2 * w], kp[lane][2 * w + 1]
            loaded.append([(n, 2 * j0), (n, 2 * j0 + 1), (n, 2 * j1), (n, 2 * j1 + 1)])
        real = [None] * (len(kr[lane]) // 2)
        for kk in range(coords["D"] // 32):  # gemm_qk_e4m3's loop
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
    # gemm_pv_e4m3 loads the pairs of one k16 step of keys at a time and converts 64 columns of D at a time
    vp, vr = coords["v_pairs"], coords["v"]
    D = coords["D"]
    n_all, chunks, n_kk = D // 16, max(D // 64, 1), coords["keys"] // 16
    n_u = n_all // chunks
    for lane in range(32):
        loaded = []
        for w in range(len(vp[lane]) // 2):
            (j, key0), (_, key1) = vp[lane][2 * w], vp[lane][2 * w + 1]  # (pair column, key)
            loaded.append([(key0, 2 * j), (key0, 2 * j + 1), (key1, 2 * j), (key1, 2 * j + 1)])
        for h in range(chunks):
            real = [None] * (len(vr[lane]) // 2)
            for kk in range(n_kk):
                for u in range(n_u):  # gemm_pv_e4m3's loop
                    for v1 in range(2):
                        b = loaded[v1 + 2 * (h * n_u + u) + 2 * n_all * kk]
                        real[v1 + 2 * (2 * u) + 4 * n_u * kk] = [b[0], b[2]]      # prmt 0x3120: bytes 0, 2 | 1, 3
                        real[v1 + 2 * (2 * u + 1) + 4 * n_u * kk] = [b[1], b[3]]
            assert None not in real, (lane, h)
            for w, halves in enumerate(real):
                for e in range(2):
                    n, k = vr[lane][2 * w + e]  # the MMA's (column n of chunk h of O, key k)
                    key, d = halves[e]
                    assert key == k, (lane, w, e)
                    assert d == 64 * h + o_column(n), (lane, h, w, e, n, d)
                    if D == 64:  # (the one chunk has the D/2 pairs' 64 columns)
                        assert d < 64
