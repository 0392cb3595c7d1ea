"""Static layout checks of the sdpa_decode kernel (aotc.kernels.sdpa_decode): the facts its code relies
on, evaluated on static layouts inside a jit trace, no GPU needed (tests/test_kernel_sdpa_decode_compile.py)."""
import cutlass.cute as cute

from ..common.variant import Variant
from ..families.sdpa_decode import ROWS_PER_CTA, THREADS, WARPS
from .sdpa_decode import SdpaDecode
from .warp_mma import (ATOM_COLS, DTYPES, VEC, acc_mn_view, check_accumulator_views, ldmatrix_atoms, make_g2s,
                       make_warp_mma, run_traced, smem_tile_layout)

_ROWS, _THREADS, _WARPS = ROWS_PER_CTA, THREADS, WARPS
_CHECK_THREADS = (1, 2, 4, 8, 16, 31)       # lanes: every lane-index bit alone, and all of them
_CHECK_CTA_THREADS = (1, 2, 4, 8, 16, 32, 64, 127)


def _check_mappings_traced(dtype, kernel) -> list[str]:
    """The layout facts the kernel relies on, evaluated on static layouts (inside a jit trace).

    1-2. warp_mma.check_accumulator_views on the (16, KW) S tile of every lane-index bit, and a lane
       holds exactly 2 accumulator rows (masks, row limits and the merge rows rely on it).
    3. g2s copies: row-iteration j of a thread covers row tid/TPR + RPP j only (TPR threads a row: 8, or 4
       for a narrow 32-column K/V tile; RPP = 128 / TPR rows a pass); its columns are those of the
       thread's (RPP, cols) source partition (the per-row gather uses a row-stride-0 source); the page of
       row-iteration j is (RPP j + tid/TPR) // P (tests/test_decode_addresses.py runs the gather itself:
       pages, addresses and the rows it zero-fills).
    4. The warp view (rows [0, KW) of a tile at offset w*KW*ATOM_W) addresses exactly rows
       w*KW .. w*KW+KW-1 of the (BN, pitch) tile layout.
    5. A thread's chunk of a row is columns 8 (tid % TPR) .. 8 (tid % TPR) + 7.
    6. Shared-memory banks: each 8-lane phase of every ldmatrix of K (and transposed of V) and each 8-thread
       phase of the cp.async stores touches 8 distinct 16-byte bank groups (no conflict), for every warp's
       keys: the swizzle of warp_mma.smem_tile_layout at the tile's width, narrow or not.
    fp8 KV: the K/V tiles' rows are D/2 16-bit pairs (D64's 32 in half a 64-column atom row, or, packed, in a
    narrow atom's).
    """
    KW, BN, D = kernel.KW, kernel.BN, kernel.D
    cols, pitch = kernel.KV_COLS, kernel.KV_PITCH  # of the K/V tiles (fp8: pairs of e4m3 bytes) and their rows
    errors = []
    mma = make_warp_mma(dtype, 1)
    g2s = make_g2s(dtype, _THREADS)  # Q's, as the kernel's ctx.g2s
    g2s_kv = make_g2s(dtype, _THREADS, kernel.TPR * VEC)  # as the kernel's ctx.g2s_kv
    cS = cute.make_identity_tensor((_ROWS, KW))
    t0S = acc_mn_view(mma.get_slice(0).partition_C(cS))
    if cute.size(t0S, mode=[0]) != 2:
        errors.append(f"a lane holds {cute.size(t0S, mode=[0])} accumulator rows, not 2")
    for t in (0,) + _CHECK_THREADS:
        errors += check_accumulator_views(mma.get_slice(t), cS, t0S, f"lane {t}")
    cT = cute.make_identity_tensor((BN, pitch))
    cQ = cute.make_identity_tensor((_ROWS, D))
    for t in (0,) + _CHECK_CTA_THREADS:
        for copy, shape, cX, tpr, rpp in ((g2s_kv, (BN, pitch), cT, kernel.TPR, kernel.RPP),
                                          (g2s, (_ROWS, D), cQ, ATOM_COLS // VEC, 16)):
            thr = copy.get_slice(t)
            tX = thr.partition_D(cX)
            tR = thr.partition_S(cute.make_identity_tensor((rpp, shape[1])))
            chunk = {c % ATOM_COLS for e in range(cute.size(tX)) for c in [tX[e][1]]}
            if chunk != set(range(8 * (t % tpr), 8 * (t % tpr) + 8, 1)):
                errors.append(f"thread {t}: {shape} copy columns {sorted(chunk)}, not 8 * (tid % {tpr}) + 0..7")
            if cute.size(tX, mode=[1]) != shape[0] // rpp or cute.size(tR, mode=[1]) != 1:
                errors.append(f"thread {t}: {shape} copy has {cute.size(tX, mode=[1])} row iterations")
                continue
            for j in range(cute.size(tX, mode=[1])):
                sub = tX[None, j, None]
                src = tR[None, 0, None]
                for e in range(cute.size(sub)):
                    if sub[e][0] != t // tpr + rpp * j or sub[e][1] != src[e][1]:
                        errors.append(f"thread {t}: row-iteration {j} element {e} at {sub[e]}, source column {src[e][1]}")
                        break
    p_tile = cute.make_ptr(dtype, 0, cute.AddressSpace.smem, assumed_align=1024)
    tile_t = cute.make_tensor(p_tile, smem_tile_layout(BN, pitch))
    wl = cute.local_tile(tile_t, (KW, cols), (0, 0)).layout
    for w in range(_WARPS):
        for rr in range(KW):
            for cc in range(0, cols, 8):
                a = wl((rr, cc)) + w * KW * kernel.ATOM_W  # the kernel's warp view offset
                b = tile_t.layout((w * KW + rr, cc))
                if a != b:
                    errors.append(f"warp {w}: view ({rr},{cc}) at {a}, tile row {w * KW + rr} at {b}")
                    break
    errors += _bank_conflicts(dtype, KW, BN, cols, pitch, mma, g2s_kv)
    return errors


def _phase_conflicts(byte_offsets: list[int], who: str) -> list[str]:
    """8 consecutive addresses a phase: 16-byte accesses to distinct bank groups, else a conflict."""
    out = []
    for ph in range(len(byte_offsets) // 8):
        offs = byte_offsets[8 * ph:8 * ph + 8]
        if len({(o // 16) % 8 for o in offs}) != 8:
            out.append(f"{who} phase {ph}: bank conflict at byte offsets {offs}")
    return out


def _bank_conflicts(dtype, KW: int, BN: int, cols: int, pitch: int, mma, g2s_kv) -> list[str]:
    """Fact 6: the byte offset in the (BN, pitch) tile of each lane's ldmatrix row (its first element; the warp
    views are cols wide) and of each thread's 16-byte cp.async chunk, phase by phase."""
    layout = smem_tile_layout(BN, pitch)
    ldsm, ldsm_t = ldmatrix_atoms(dtype)
    errors = []
    for name, s2r, shape in (("K", cute.make_tiled_copy_B(ldsm, mma), (KW, cols)),
                             ("V", cute.make_tiled_copy_B(ldsm_t, mma), (cols, KW))):  # V read as V^T
        parts = [s2r.get_slice(lane).partition_S(cute.make_identity_tensor(shape)) for lane in range(32)]
        for w in range(_WARPS):
            for i in range(cute.size(parts[0]) // VEC):  # one ldmatrix.x4 per 8 elements of a lane
                rows = [parts[lane][VEC * i] for lane in range(32)]
                keys = [(c[0], c[1]) if name == "K" else (c[1], c[0]) for c in rows]
                errors += _phase_conflicts([layout((w * KW + r, c)) * 2 for r, c in keys], f"warp {w} {name} ldmatrix {i}")
    parts = [g2s_kv.get_slice(t).partition_D(cute.make_identity_tensor((BN, pitch))) for t in range(_THREADS)]
    for i in range(cute.size(parts[0]) // VEC):
        errors += _phase_conflicts([layout(tuple(parts[t][VEC * i])) * 2 for t in range(_THREADS)], f"cp.async {i}")
    return errors


def verify_mappings(head_dim: int, dtype_name: str = "bf16", arch: str = "sm_90", kv_dtype: str | None = None,
                    tile=None) -> list[str]:
    """Run the static layout checks for one head dim and arch (kv_dtype fp8_e4m3: its fp8 tile; tile: another
    tile record) on the kernel's own tile facts (no GPU needed); [] when all hold."""
    fields = {"kv_dtype": kv_dtype} if kv_dtype else {}
    kernel = SdpaDecode(Variant.make("sdpa_decode", arch, dtype=dtype_name, head_dim=head_dim, kv="paged16",
                                     layout="dense", **fields), tile)
    return run_traced(_check_mappings_traced, DTYPES[dtype_name], kernel)
