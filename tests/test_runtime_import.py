"""The runtime's promise: it imports, and loads a bundle, with neither cutlass nor torch present."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BLOCK = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in ('cutlass', 'torch'):
            raise ImportError('blocked for this test: ' + name)
sys.meta_path.insert(0, Block())
sys.path.insert(0, %r)
"""


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK % str(ROOT) + code], capture_output=True, text=True, timeout=120)


def test_runtime_imports_without_cutlass_or_torch():
    r = run("""
import aotc, aotc.runtime, aotc.runtime.combine, aotc.runtime.kv_write, aotc.runtime.launch, aotc.runtime.loader
import aotc.runtime.driver, aotc.families.kv_write
import aotc.storage.bundle, aotc.storage.cache
aotc.runtime.Runtime([]).capabilities(arch='sm_90a')
bad = sorted(m for m in sys.modules if m.split('.')[0] in ('cutlass', 'torch'))
print('LOADED', bad)
""")
    assert r.returncode == 0, r.stderr
    assert "LOADED []" in r.stdout


def test_blocking_actually_blocks():
    """The guard above must be able to fail: importing cutlass under it raises."""
    r = run("import cutlass")
    assert r.returncode != 0 and "blocked for this test" in r.stderr


def test_runtime_reads_a_bundle_without_the_dsl(tmp_path):
    pytest.importorskip("cutlass")
    from aotc.build.builder import build
    from aotc.storage.bundle import write_bundle
    from aotc.storage.cache import Cache
    from aotc.common.variant import Variant

    report = build([Variant.make("sdpa_combine", "sm_90a", dtype="bf16", head_dim=128, strides="packed")],
                   cache=Cache(tmp_path / "cache"))
    real_bundle = tmp_path / "one.aotc"
    write_bundle(real_bundle, report.artifacts)
    r = run(f"""
import aotc.runtime
rt = aotc.runtime.load({str(real_bundle)!r})
print('KERNELS', sum(len(v) for v in rt.kernels.values()))
print('SERVED', rt.capabilities(arch='sm_90a')['entry_points']['combine']['kernels'])
print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] in ('cutlass', 'torch')))
""")
    assert r.returncode == 0, r.stderr
    assert "LOADED []" in r.stdout and "KERNELS 0" not in r.stdout and "SERVED 1" in r.stdout


def test_runtime_ignores_kernels_built_with_another_parameter_list(fake_artifact, monkeypatch):
    """A combine kernel from an aotc whose combine took no split_groups (an old cache entry or bundle)
    is never launched with this runtime's parameter buffer; a missing kernel's error names it."""
    import dataclasses

    import aotc.runtime as rt_mod
    from aotc.common.abi import KernelABI
    from aotc.common.errors import RuntimeLoadError
    from aotc.runtime import driver

    current = fake_artifact("current")
    old_abi = KernelABI(current.abi.symbol, tuple(p for p in current.abi.params if p.name != "split_groups"))
    old = dataclasses.replace(fake_artifact("old"), abi=old_abi)
    monkeypatch.setattr(driver, "compute_capability", lambda dev: (9, 0))
    runtime = rt_mod.Runtime([old, current])
    # set aside when dispatch first picks it (its header is checked then too), and the search goes on
    assert runtime.find("sdpa_combine", 0, [dict(old.variant.fields), dict(current.variant.fields)]).artifact is current
    assert [k.artifact for k in runtime.kernels["sdpa_combine"]] == [current]
    assert runtime.other_abi == [old.variant.name]

    only_old = rt_mod.Runtime([old])
    with pytest.raises(RuntimeLoadError, match="another parameter list") as info:
        only_old.select("sdpa_combine", 0, [dict(old.variant.fields)])
    assert old.variant.name in str(info.value) and "rebuild" in info.value.hint
    assert "sdpa_combine" not in only_old.kernels
