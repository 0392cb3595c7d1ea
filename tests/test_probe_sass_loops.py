"""benchmarks/probes/sass_loops.py reads nvdisasm's text without a GPU: functions, kv loops and their counts."""
from benchmarks.probes.sass_loops import functions, kv_loops, loop_stats, opcode_classes


def _sass(ops: list[str], start: int = 0) -> list[str]:
    return [f"        /*{start + 16 * i:04x}*/                   {op} ;" for i, op in enumerate(ops)]


S_WGMMA = "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24"  # S = Q K^T: A (Q) from shared memory
PV_WGMMA = "HGMMA.64x128x16.F32.BF16 R88, R148, gdesc[UR12].tnspB, R88"  # O += P V: A (P) from registers


def _loop(hgmmas: int, exp2_before: int, exp2_after: int, s_gemm: bool = True) -> list[str]:
    """A backward branch to .L_x_7 around an iteration: the GEMMs (half S, half PV; PV alone without s_gemm), the S
    wait, exp2s, the PV wait, exp2s."""
    n_s = hgmmas // 2 if s_gemm else 0
    body = (["SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x10], R2"] + [S_WGMMA] * n_s + [PV_WGMMA] * (hgmmas - n_s)
            + ["WARPGROUP.DEPBAR.LE gsb0, 0x1"] + ["MUFU.EX2 R3, R3"] * exp2_before + ["FMNMX R5, R5, R6, !PT"]
            + ["WARPGROUP.DEPBAR.LE gsb0, 0x0"] + ["MUFU.EX2 R4, R4"] * exp2_after + ["@P1 BRA `(.L_x_7)"])
    return [".L_x_7:"] + _sass(body, 0x100)


def test_a_kv_loop_and_where_its_exp2s_sit():
    text = "\n".join(_sass(["MOV R1, c[0x0][0x28]"]) + _loop(16, 3, 2) + _sass(["EXIT"], 0x800))
    (body,) = kv_loops(text)
    assert loop_stats(body) == {"instructions": len(body), "HGMMA": 16, "exp2": 5, "FMNMX": 1, "BAR": 0,
                                "exp2_before_pv_wait": 3}


def test_loops_without_both_gemms_are_not_kv_loops():
    assert kv_loops("\n".join(_loop(9, 3, 2))) == []  # fewer than 10 wgmma: not an iteration of both GEMMs
    # PV wgmmas alone (the ragged and paged kernels' last block of a tile): no S GEMM, not a kv loop
    assert kv_loops("\n".join(_loop(11, 0, 0, s_gemm=False))) == []


def test_functions_split_a_cubins_text_by_section():
    text = "\n".join([".section .text._Z1av,\"ax\",@progbits", *_sass(["NOP"]),
                      "\t.section\t.text._Z1bv,\"ax\",@progbits", *_loop(12, 1, 0)])
    parts = functions(text)
    assert sorted(parts) == ["_Z1av", "_Z1bv"]
    assert kv_loops(parts["_Z1av"]) == [] and len(kv_loops(parts["_Z1bv"])) == 1


def test_opcode_classes_drop_predicates_and_modifiers():
    assert opcode_classes(["@!P0 MUFU.EX2 R1, R1", "MUFU.TANH R2, R2", "FMUL R3, R3, R4"]) == {"MUFU": 2, "FMUL": 1}
