"""What the cache serves: only entries whose cubin is what meta.json says, and to the runtime only
entries whose key this aotc computes for their variant (issue 25 items 1 and 2; 6 and 8 for the cache)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

import aotc.runtime
from aotc.cli import main
from aotc.common.artifact import sha256_hex
from aotc.storage.cache import Cache
from conftest import PYTHON, REPO, aotc_env, lock_held_elsewhere, run_aotc

pytest.importorskip("cutlass")  # real cubins (every check reads the cubin)


def plant(cache: Cache, art, header: dict | None = None) -> Path:
    """Write an entry by hand (as another aotc, or a tamperer, would), bypassing commit()'s checks."""
    d = cache.entry_dir(art.key)
    d.mkdir(parents=True, exist_ok=True)
    (d / "kernel.cubin").write_bytes(art.cubin)
    (d / "meta.json").write_text(json.dumps(header if header is not None else art.header()))
    return d


def with_cubin(art, data: bytes):
    return dataclasses.replace(art, cubin=data, sha256=sha256_hex(data))


def old_build(art, *, record_parts: bool):
    """art as an older aotc (other version, other kernel sources, other DSL) made it: other bytes and
    another key. record_parts=False: a header of the format before key parts were recorded, whose key
    this aotc cannot explain; True: one that records the parts its key is made of."""
    old = with_cubin(art, art.cubin + b"\0an older kernel")
    info = {k: v for k, v in art.info.items() if k != "key_parts"}
    info["versions"] = {"aotc": "0.0.9", "nvidia-cutlass-dsl": "4.7.0", "python": "3.11"}
    if not record_parts:
        return dataclasses.replace(old, key=hashlib.sha256(b"an older aotc's key").hexdigest(), info=info)
    from aotc.common.keys import key_from_parts

    parts = {"family_source": "2" * 64, "aotc": "0.0.9", "dsl": {"nvidia-cutlass-dsl": "4.7.0"}, "options": ""}
    return dataclasses.replace(old, key=key_from_parts(art.variant, parts), info={**info, "key_parts": parts})


def loaded_shas(rt) -> list[str]:
    return sorted(k.artifact.sha256 for ks in rt.kernels.values() for k in ks)


# ---- item 1: stale entries never reach the runtime ----------------------------------------------

@pytest.mark.parametrize("record_parts", [False, True], ids=["old-header-format", "key-parts-recorded"])
def test_load_serves_only_entries_with_this_aotcs_key(cache_dir, real_artifacts, capsys, record_parts):
    c = Cache()
    current = real_artifacts[0]
    stale = old_build(current, record_parts=record_parts)
    with c.locked(current.key):
        c.commit(current)
    plant(c, stale)
    rt = aotc.runtime.load(cache=True, installed=False)
    assert loaded_shas(rt) == [current.sha256]  # the old kernel of the same variant is never a candidate
    assert c.load(stale.key) is None and c.entry_dir(stale.key).exists()  # a miss, left in place
    assert main(["cache", "ls"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(stale.key[:16] in line and "stale" in line and "aotc 0.0.9" in line for line in lines), lines
    assert any(current.key[:16] in line and " ok " in line for line in lines), lines
    assert main(["cache", "verify"]) == 0  # stale is not bad: valid for the aotc that made it
    assert c.entry_dir(stale.key).exists() and c.stats()["invalid"] == 0


# ---- item 2: meta.json is not believed beyond the cubin ------------------------------------------

def _arch_swap(arts):
    """An sm_90a cubin, with its right sha256 and size, in the sm_80 entry of the same kernel."""
    sm90, sm80 = arts[0], arts[3]
    h = sm80.header()
    h.update(sha256=sm90.sha256, size=sm90.size)
    return sm80, sm90.cubin, h, "is a cubin for sm_90a, but meta.json says sm_80"


def _abi_lacks_a_parameter(arts):
    a = arts[0]
    h = a.header()
    h["abi"]["params"] = [p for p in h["abi"]["params"] if p["name"] != "split_groups"]
    return a, a.cubin, h, "parameter table"


def _symbol_not_in_cubin(arts):
    a = arts[0]
    h = a.header()
    h["abi"]["symbol"] = "kernel_not_in_this_cubin"
    return a, a.cubin, h, "is not in the cubin"


def _launch_beyond_limits(arts):
    a = arts[0]
    h = a.header()
    h["launch"]["block"] = [4096, 4096, 1]
    return a, a.cubin, h, "beyond CUDA's limits"


def _relabelled(arts):
    """The D256 entry's header says head_dim 128 (same key, sha256 and size)."""
    a = arts[2]
    h = a.header()
    h["variant"]["head_dim"] = 128
    return a, a.cubin, h, "is not the key of"


LIES = {"arch-swap": _arch_swap, "abi-lacks-a-parameter": _abi_lacks_a_parameter,
        "symbol-not-in-cubin": _symbol_not_in_cubin, "launch-beyond-limits": _launch_beyond_limits,
        "relabelled": _relabelled}


@pytest.mark.parametrize("case", sorted(LIES))
def test_an_entry_whose_cubin_is_not_what_meta_json_says_is_quarantined(cache_dir, real_artifacts, case, capsys):
    art, cubin, header, needle = LIES[case](real_artifacts)
    c = Cache()
    d = c.entry_dir(art.key)
    d.mkdir(parents=True)
    (d / "kernel.cubin").write_bytes(cubin)
    (d / "meta.json").write_text(json.dumps(header))
    status, got = c.check(art.key)
    assert status.state == "invalid" and got is None and needle in status.reason, status
    assert c.load(art.key, art.variant) is None  # never a hit: quarantined, so the build rebuilds it
    assert not d.exists() and c.stats()["invalid"] == 1
    again, created = c.get_or_create(art.key, art.variant, lambda: art)
    assert created and again == art


def test_the_runtime_never_loads_an_arch_swap_and_cache_verify_quarantines_it(cache_dir, real_artifacts, capsys):
    art, cubin, header, _ = _arch_swap(real_artifacts)
    c = Cache()

    def planted() -> Path:
        d = c.entry_dir(art.key)
        d.mkdir(parents=True)
        (d / "kernel.cubin").write_bytes(cubin)
        (d / "meta.json").write_text(json.dumps(header))
        return d

    d = planted()
    with pytest.raises(aotc.RuntimeLoadError, match="no kernels to load"):
        aotc.runtime.load(cache=True, installed=False)
    assert not d.exists()  # load() set it aside
    d = planted()
    assert main(["cache", "verify"]) == 1
    assert "is a cubin for sm_90a" in capsys.readouterr().err
    assert not d.exists() and c.stats()["invalid"] == 2


def test_build_rebuilds_an_arch_swapped_entry_and_its_bundle_verifies(cache_dir, real_artifacts, tmp_path):
    """The issue's sequence: the swapped entry was a hit for `aotc build`, whose --bundle then failed
    its own `bundle verify`."""
    art, cubin, header, _ = _arch_swap(real_artifacts)
    c = Cache()
    d = c.entry_dir(art.key)
    d.mkdir(parents=True)
    (d / "kernel.cubin").write_bytes(cubin)
    (d / "meta.json").write_text(json.dumps(header))
    spec = tmp_path / "one.toml"
    spec.write_text('[[family]]\nname = "sdpa_combine"\narch = "sm_80"\ndtype = "bf16"\nhead_dim = 128\n'
                    'strides = "packed"\n')
    out = tmp_path / "one.aotc"
    r = run_aotc("build", str(spec), "--bundle", str(out))
    assert r.returncode == 0, r.stderr
    assert "1 compiled" in r.stderr + r.stdout
    r = run_aotc("bundle", "verify", str(out))
    assert r.returncode == 0, r.stderr


def test_commit_refuses_what_a_read_would_quarantine(cache, real_artifacts):
    a = real_artifacts[0]
    lying = dataclasses.replace(a, launch=dataclasses.replace(a.launch, block=(4096, 4096, 1)))
    with cache.locked(a.key), pytest.raises(aotc.CacheError, match="beyond CUDA's limits"):
        cache.commit(lying)
    assert cache.keys() == [] or not (cache.entry_dir(a.key) / "meta.json").exists()


# ---- item 6 (cache): FIFOs never hang a reader ------------------------------------------------------

@pytest.mark.parametrize("which", ["kernel.cubin", "meta.json"])
def test_a_fifo_in_an_entry_hangs_nothing(cache_dir, real_artifacts, tmp_path, which):
    art = real_artifacts[0]
    c = Cache()

    def planted() -> Path:
        d = plant(c, art)
        (d / which).unlink()
        os.mkfifo(d / which)
        return d

    d = planted()
    status, _ = c.check(art.key)
    assert status.state == "invalid" and "FIFO" in status.reason
    spec = tmp_path / "one.toml"
    spec.write_text('[[family]]\nname = "sdpa_combine"\narch = "sm_90a"\ndtype = "bf16"\nhead_dim = 128\n'
                    'strides = "packed"\n')
    for args, code in ((["cache", "ls"], 0), (["list", str(spec)], 0), (["cache", "verify", "--no-repair"], 1)):
        r = run_aotc(*args, timeout=60)
        assert r.returncode == code, (args, r.stderr)
    assert "FIFO" in r.stderr
    r = subprocess.run([PYTHON, "-c", "import aotc.runtime\ntry:\n aotc.runtime.load(cache=True, installed=False)\n"
                        "except aotc.RuntimeLoadError as e:\n print('refused', e)"],
                       cwd=REPO, env=aotc_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "no kernels to load" in r.stdout, r.stderr
    d = planted() if not d.exists() else d
    r = run_aotc("build", str(spec), "--offline", timeout=60)
    assert r.returncode == 5, r.stderr
    d = planted() if not d.exists() else d
    r = run_aotc("cache", "verify", timeout=60)
    assert r.returncode == 1 and "FIFO" in r.stderr and "(quarantined)" in r.stderr
    assert not d.exists()


# ---- item 8 (cache): nested JSON and counters of the wrong type -----------------------------------

def test_deeply_nested_meta_json_is_invalid_and_quarantined(cache_dir, real_artifacts):
    art = real_artifacts[0]
    c = Cache()
    d = plant(c, art)
    (d / "meta.json").write_text('{"key": "%s", "variant": %s}' % (art.key, "[" * 100000 + "]" * 100000))
    status, _ = c.check(art.key)
    assert status.state == "invalid" and "nests too deeply" in status.reason
    r = run_aotc("cache", "ls")
    assert r.returncode == 0 and "invalid" in r.stdout, r.stderr
    r = run_aotc("cache", "verify")
    assert r.returncode == 1 and "(quarantined)" in r.stderr and "Traceback" not in r.stderr
    assert not d.exists()


@pytest.mark.parametrize("text", ['{"hits": "abc", "misses": 2}', "[1, 2]", "null", '{"hits": 1e400, "misses": 2}',
                                  '{"compile_seconds": "x", "misses": 2}', '{"hits": ' + "9" * 400 + ', "misses": 2}'])
def test_stats_json_of_the_wrong_types_reads_as_zero_and_is_repaired(cache_dir, text, capsys):
    c = Cache()
    c.root.mkdir(parents=True)
    (c.root / "stats.json").write_text(text)
    stats = c.stats()
    assert stats["hits"] == 0 and stats["compile_seconds"] == 0.0
    assert stats["misses"] == (2 if text.startswith("{") else 0)
    assert main(["cache", "info"]) == 0
    c.count(hits=1, compile_seconds=0.5)
    assert c.stats()["hits"] == 1 and c.stats()["compile_seconds"] == 0.5


# ---- AOTC_LOCK_TIMEOUT ------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["-1", "inf", "1e400", "nan"])
def test_a_lock_timeout_that_would_wait_forever_is_refused(cache_dir, tiny_spec, value):
    from aotc.build.compile import cache_key
    from aotc.build.spec import load_spec

    v = load_spec(tiny_spec).variants[0]
    with lock_held_elsewhere(Cache().lock_path(cache_key(v))):
        r = run_aotc("build", str(tiny_spec), timeout=60, AOTC_LOCK_TIMEOUT=value)
    assert r.returncode == 2, r.stderr
    assert f"AOTC_LOCK_TIMEOUT={value!r}" in r.stderr and "Traceback" not in r.stderr
    from aotc.common.errors import ConfigError

    with pytest.raises(ConfigError):
        Cache(lock_timeout=float(value))


@pytest.mark.parametrize("value", ["abc", ""])
def test_a_bad_lock_timeout_stops_only_what_takes_a_lock(cache_dir, tiny_spec, real_artifacts, value):
    c = Cache()
    with c.locked(real_artifacts[0].key):
        c.commit(real_artifacts[0])
    for args in (["cache", "ls"], ["cache", "info"], ["list", str(tiny_spec)]):
        r = run_aotc(*args, AOTC_LOCK_TIMEOUT=value)
        assert r.returncode == 0, (args, r.stderr)
    r = subprocess.run([PYTHON, "-c", "import aotc.runtime; print(len(aotc.runtime.load(cache=True, installed=False)"
                        ".kernels['sdpa_combine']))"], cwd=REPO, env=aotc_env(AOTC_LOCK_TIMEOUT=value),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr
    if value:  # empty is unset: the default
        r = run_aotc("build", str(tiny_spec), AOTC_LOCK_TIMEOUT=value)
        assert r.returncode == 2 and "AOTC_LOCK_TIMEOUT='abc'" in r.stderr and "Traceback" not in r.stderr
