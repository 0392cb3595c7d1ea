"""Static layout checks of the sdpa_decode kernel (aotc.kernels.sdpa_decode): the facts its code relies
on, evaluated on static layouts inside a jit trace, no GPU needed (tests/test_kernel_sdpa_decode_compile.py)."""
import cutlass.cute as cute

from ..families.kv_dtype import e4m3_row_bytes
from ..families.sdpa_decode import ROWS_PER_CTA, THREADS, WARPS, tile
from .warp_mma import (ATOM_COLS, DTYPES, acc_mn_view, check_accumulator_views, make_g2s, make_warp_mma, run_traced,
                       smem_tile_layout)

_ROWS, _THREADS, _WARPS = ROWS_PER_CTA, THREADS, WARPS
_CHECK_THREADS = (1, 2, 4, 8, 16, 31)       # lanes: every lane-index bit alone, and all of them
_CHECK_CTA_THREADS = (1, 2, 4, 8, 16, 32, 64, 127)


def _check_mappings_traced(dtype, head_dim: int, arch: str, kv_dtype: str | None) -> list[str]:
    """The layout facts the kernel relies on, evaluated on static layouts (inside a jit trace).

    1-2. warp_mma.check_accumulator_views on the (16, KW) S tile of every lane-index bit, and a lane
       holds exactly 2 accumulator rows (masks, row limits and the merge rows rely on it).
    3. g2s copies: row-iteration j of a thread covers row tid/8 + 16j only; its columns are those of
       the thread's (16, D) source partition (the per-row gather uses a row-stride-0 source); the
       page of row-iteration j is 16j // P.
    4. The warp view (rows [0, KW) of a tile at offset w*KW*64) addresses exactly rows
       w*KW .. w*KW+KW-1 of the (BN, D) tile layout.
    5. A thread's chunk of a row is columns 8 (tid % 8) .. 8 (tid % 8) + 7 (fp8 D64's copies are predicated on
       8 (tid % 8) < its 32 columns a row).
    fp8 KV: the K/V tiles' rows are D/2 16-bit pairs (D below: their columns), in a pitch of at least 64.
    """
    tl = tile(head_dim, arch, kv_dtype)
    KW, BN = tl.keys_per_warp, tl.block_n
    cols = head_dim // 2 if tl.fp8 else head_dim  # of the K/V tiles (fp8: pairs of e4m3 bytes)
    pitch = e4m3_row_bytes(head_dim) // 2 if tl.fp8 else head_dim
    D = head_dim
    errors = []
    mma = make_warp_mma(dtype, 1)
    g2s = make_g2s(dtype, _THREADS)
    cS = cute.make_identity_tensor((_ROWS, KW))
    t0S = acc_mn_view(mma.get_slice(0).partition_C(cS))
    if cute.size(t0S, mode=[0]) != 2:
        errors.append(f"a lane holds {cute.size(t0S, mode=[0])} accumulator rows, not 2")
    for t in (0,) + _CHECK_THREADS:
        errors += check_accumulator_views(mma.get_slice(t), cS, t0S, f"lane {t}")
    cT = cute.make_identity_tensor((BN, pitch))
    cQ = cute.make_identity_tensor((_ROWS, D))
    for t in (0,) + _CHECK_CTA_THREADS:
        thr = g2s.get_slice(t)
        for shape, cX in (((BN, pitch), cT), ((_ROWS, D), cQ)):
            tX = thr.partition_D(cX)
            tR = thr.partition_S(cute.make_identity_tensor((16, shape[1])))
            chunk = {c for e in range(cute.size(tX)) for c in [tX[e][1]]}
            if chunk != set(range(8 * (t % 8), 8 * (t % 8) + 8, 1)) and shape[1] == ATOM_COLS:
                errors.append(f"thread {t}: {shape} copy columns {sorted(chunk)}, not 8 * (tid % 8) + 0..7")
            if cute.size(tX, mode=[1]) != shape[0] // 16 or cute.size(tR, mode=[1]) != 1:
                errors.append(f"thread {t}: {shape} copy has {cute.size(tX, mode=[1])} row iterations")
                continue
            for j in range(cute.size(tX, mode=[1])):
                sub = tX[None, j, None]
                src = tR[None, 0, None]
                for e in range(cute.size(sub)):
                    if sub[e][0] != t // 8 + 16 * j or sub[e][1] != src[e][1]:
                        errors.append(f"thread {t}: row-iteration {j} element {e} at {sub[e]}, source column {src[e][1]}")
                        break
    p_tile = cute.make_ptr(dtype, 0, cute.AddressSpace.smem, assumed_align=1024)
    tile_t = cute.make_tensor(p_tile, smem_tile_layout(BN, pitch))
    wl = cute.local_tile(tile_t, (KW, cols), (0, 0)).layout
    for w in range(_WARPS):
        for rr in range(KW):
            for cc in range(0, cols, 8):
                a = wl((rr, cc)) + w * KW * ATOM_COLS
                b = tile_t.layout((w * KW + rr, cc))
                if a != b:
                    errors.append(f"warp {w}: view ({rr},{cc}) at {a}, tile row {w * KW + rr} at {b}")
                    break
    return errors


def verify_mappings(head_dim: int, dtype_name: str = "bf16", arch: str = "sm_90", kv_dtype: str | None = None) -> list[str]:
    """Run the static layout checks for one head dim (kv_dtype fp8_e4m3: its fp8 tile; no GPU needed); [] when
    all hold."""
    return run_traced(_check_mappings_traced, DTYPES[dtype_name], head_dim, arch, kv_dtype)
