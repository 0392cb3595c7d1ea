"""The content-addressed cache: keys, commit/load, counters, corruption, quarantine, gc, locks."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

import aotc
import aotc.build.compile as compile_mod
from aotc.storage.atomic import atomic_write
from aotc.storage.cache import Cache
from aotc.common.errors import CacheError, LockTimeoutError
from aotc.families import Family, get_family
from aotc.common.variant import Variant
from conftest import lock_held_elsewhere

V = Variant.make("sdpa_combine", "sm_90a", dtype="bf16", head_dim=128, strides="packed")


def counters(c: Cache) -> dict:
    s = c.stats()
    return {k: s[k] for k in ("hits", "misses", "compiles", "bypassed", "invalid")}


def counting(art):
    """A create function that returns art and counts its calls."""
    calls = []

    def create():
        calls.append(1)
        return art

    create.calls = calls
    return create


def flip_byte(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if at is None else at
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def quarantined(c: Cache) -> list[Path]:
    q = c.root / "quarantine"
    return sorted(q.iterdir()) if q.exists() else []


# ---- keys -------------------------------------------------------------------

def test_key_is_stable_hex():
    k = compile_mod.cache_key(V)
    assert k == compile_mod.cache_key(Variant.make("sdpa_combine", "sm_90a", strides="packed", head_dim=128,
                                                   dtype="bf16"))
    assert len(k) == 64 and int(k, 16) >= 0


@pytest.mark.parametrize("other", [
    Variant.make("sdpa_combine", "sm_90a", dtype="fp16", head_dim=128, strides="packed"),
    Variant.make("sdpa_combine", "sm_90a", dtype="bf16", head_dim=64, strides="packed"),
    Variant.make("sdpa_combine", "sm_90a", dtype="bf16", head_dim=128, strides="general"),
    Variant.make("sdpa_combine", "sm_90", dtype="bf16", head_dim=128, strides="packed"),
    Variant.make("sdpa_combine", "sm_100a", dtype="bf16", head_dim=128, strides="packed"),
    Variant.make("sdpa_combine", "sm_90a", dtype="bf16", head_dim=128, strides="packed", extra=1),
])
def test_key_changes_with_the_variant(other):
    assert compile_mod.cache_key(other) != compile_mod.cache_key(V)


def test_key_changes_with_aotc_version(monkeypatch):
    before = compile_mod.cache_key(V)
    monkeypatch.setattr(compile_mod, "__version__", aotc.__version__ + ".post1")
    assert compile_mod.cache_key(V) != before


def test_key_changes_with_dsl_versions(monkeypatch):
    real = dict(compile_mod.dsl_versions()) or {"nvidia-cutlass-dsl": "4.8.1"}
    monkeypatch.setattr(compile_mod, "dsl_versions", lambda: real)
    before = compile_mod.cache_key(V)
    bumped = {k: v + ".1" for k, v in real.items()}
    monkeypatch.setattr(compile_mod, "dsl_versions", lambda: bumped)
    assert compile_mod.cache_key(V) != before
    more = {**real, "nvidia-cutlass-dsl-libs-extra": "1.0"}
    monkeypatch.setattr(compile_mod, "dsl_versions", lambda: more)
    assert compile_mod.cache_key(V) != before


def test_key_changes_with_family_source(monkeypatch):
    before = compile_mod.cache_key(V)
    digest = get_family("sdpa_combine").source_digest()
    assert len(digest) == 64 and digest == get_family("sdpa_combine").source_digest()
    monkeypatch.setattr(Family, "source_digest", lambda self: "0" * 64)
    assert compile_mod.cache_key(V) != before


def test_key_changes_with_compile_options(monkeypatch):
    before = compile_mod.cache_key(V)
    monkeypatch.setattr(compile_mod, "COMPILE_OPTIONS", "--opt-level 2")
    assert compile_mod.cache_key(V) != before


def test_key_is_none_without_dsl_versions(monkeypatch):
    monkeypatch.setattr(compile_mod, "dsl_versions", lambda: {})
    assert compile_mod.cache_key(V) is None


def test_unknown_dsl_versions_bypass_the_cache(monkeypatch, cache, fake_artifact):
    import concurrent.futures as cf

    import aotc.build.builder as build_mod
    import aotc.build.executors as executors

    art = fake_artifact("bypass", key="")
    monkeypatch.setattr(build_mod, "cache_key", lambda v: None)
    monkeypatch.setattr(executors, "compile_variant", lambda v, key=None: art)
    with cf.ThreadPoolExecutor(1) as pool:  # in this process, where the monkeypatch applies
        report = build_mod.build([art.variant], cache=cache, executor=pool)
    assert [r.status for r in report.results] == ["bypassed"]
    assert report.artifacts == [art]
    assert counters(cache)["bypassed"] == 1
    assert counters(cache)["compiles"] == 0
    assert cache.keys() == []  # nothing persisted


# ---- commit / load / counters ---------------------------------------------

def test_commit_load_round_trip(cache, fake_artifact):
    art = fake_artifact("rt")
    with cache.locked(art.key):
        cache.commit(art)
    d = cache.entry_dir(art.key)
    assert d == cache.root / "entries" / art.key[:2] / art.key
    assert sorted(p.name for p in d.iterdir()) == ["kernel.cubin", "meta.json"]
    assert (d / "kernel.cubin").read_bytes() == art.cubin
    meta = json.loads((d / "meta.json").read_text())
    assert meta == art.header()
    got = cache.load(art.key)
    assert got == art
    assert got.info == art.info
    assert cache.keys() == [art.key]
    assert cache.check(art.key)[0].state == "ok"


def test_commit_refuses_mismatched_sha(cache, fake_artifact):
    import dataclasses

    art = fake_artifact("bad")
    with pytest.raises(CacheError, match="does not match its sha256"):
        cache.commit(dataclasses.replace(art, cubin=art.cubin + b"x"))
    assert cache.keys() == []


def test_counters_are_exact(cache, fake_artifact):
    a, b = fake_artifact("a"), fake_artifact("b")
    assert counters(cache) == dict(hits=0, misses=0, compiles=0, bypassed=0, invalid=0)
    create_a = counting(a)
    got, created = cache.get_or_create(a.key, a.variant, create_a)
    assert (got, created) == (a, True)
    assert counters(cache) == dict(hits=0, misses=1, compiles=1, bypassed=0, invalid=0)
    got, created = cache.get_or_create(a.key, a.variant, create_a)
    assert (got, created) == (a, False)
    assert len(create_a.calls) == 1
    assert counters(cache) == dict(hits=1, misses=1, compiles=1, bypassed=0, invalid=0)
    assert cache.load(b.key) is None
    assert cache.load(a.key) == a
    assert cache.load(a.key, count=False) == a
    cache.get_or_create(b.key, b.variant, lambda: b)
    assert counters(cache) == dict(hits=2, misses=3, compiles=2, bypassed=0, invalid=0)
    assert cache.stats()["compile_seconds"] == pytest.approx(0.5)


def test_flipped_cubin_byte_is_quarantined_and_rebuilt(cache, fake_artifact):
    art = fake_artifact("flip")
    cache.get_or_create(art.key, art.variant, lambda: art)
    flip_byte(cache.entry_dir(art.key) / "kernel.cubin")
    status, got = cache.check(art.key)
    assert status.state == "invalid" and "sha256" in status.reason and got is None
    assert cache.load(art.key) is None
    c = counters(cache)
    assert c["invalid"] == 1 and c["misses"] == 2 and c["compiles"] == 1
    assert not cache.entry_dir(art.key).exists()
    (q,) = quarantined(cache)
    assert q.name.startswith(art.key + ".")
    assert "sha256" in (q / "REASON").read_text()
    assert (q / "kernel.cubin").read_bytes() != art.cubin  # the bad bytes are kept for inspection
    create = counting(art)
    got, created = cache.get_or_create(art.key, art.variant, create)
    assert created and got == art and len(create.calls) == 1
    assert counters(cache)["compiles"] == 2
    assert cache.load(art.key) == art
    assert counters(cache)["invalid"] == 1


def test_missing_meta_is_a_partial_miss(cache, fake_artifact):
    art = fake_artifact("partial")
    cache.get_or_create(art.key, art.variant, lambda: art)
    (cache.entry_dir(art.key) / "meta.json").unlink()
    status, got = cache.check(art.key)
    assert (status.state, got) == ("partial", None)
    assert cache.load(art.key) is None
    assert counters(cache)["invalid"] == 0
    assert art.key not in [s.key for s in cache.verify(repair=False) if s.state == "ok"]
    got, created = cache.get_or_create(art.key, art.variant, lambda: art)
    assert created and cache.load(art.key) == art


def test_missing_cubin_is_invalid(cache, fake_artifact):
    art = fake_artifact("nocubin")
    cache.get_or_create(art.key, art.variant, lambda: art)
    (cache.entry_dir(art.key) / "kernel.cubin").unlink()
    assert cache.check(art.key)[0].reason == "kernel.cubin missing"
    assert cache.load(art.key) is None
    assert counters(cache)["invalid"] == 1


@pytest.mark.parametrize("edit,reason", [
    (lambda m: m.update(sha256="0" * 64), "sha256"),
    (lambda m: m.update(size=m["size"] + 1), "size"),
    (lambda m: m.update(key="f" * 64), "names key"),
    (lambda m: m["abi"]["params"][0].update(size=4), "recorded size/align"),
    (lambda m: m.pop("variant"), "no 'variant'"),
])
def test_edited_meta_is_invalid(cache, fake_artifact, edit, reason):
    art = fake_artifact("edit")
    cache.get_or_create(art.key, art.variant, lambda: art)
    meta_path = cache.entry_dir(art.key) / "meta.json"
    meta = json.loads(meta_path.read_text())
    edit(meta)
    meta_path.write_text(json.dumps(meta))
    status, got = cache.check(art.key)
    assert status.state == "invalid" and got is None
    assert reason in status.reason
    assert cache.load(art.key) is None
    assert counters(cache)["invalid"] == 1
    assert len(quarantined(cache)) == 1


@pytest.mark.parametrize("garbage", [b"{not json", b"\xff\xfe\x00", b"[1, 2]", b'"a string"', b"null"])
def test_garbage_meta_is_invalid_not_a_crash(cache, fake_artifact, garbage):
    art = fake_artifact("garbage")
    cache.get_or_create(art.key, art.variant, lambda: art)
    (cache.entry_dir(art.key) / "meta.json").write_bytes(garbage)
    assert cache.check(art.key)[0].state == "invalid"
    assert cache.load(art.key) is None
    assert counters(cache)["invalid"] == 1


def test_swapped_cubins_are_both_invalid(cache, fake_artifact):
    a, b = fake_artifact("swap-a"), fake_artifact("swap-b")
    for art in (a, b):
        cache.get_or_create(art.key, art.variant, lambda art=art: art)
    pa, pb = (cache.entry_dir(x.key) / "kernel.cubin" for x in (a, b))
    da, db = pa.read_bytes(), pb.read_bytes()
    pa.write_bytes(db)
    pb.write_bytes(da)
    assert cache.load(a.key) is None
    assert cache.load(b.key) is None
    assert counters(cache)["invalid"] == 2
    assert cache.keys() == []


def test_verify_finds_and_quarantines(cache, fake_artifact):
    good, bad, partial = fake_artifact("good"), fake_artifact("bad"), fake_artifact("partial")
    for art in (good, bad, partial):
        cache.get_or_create(art.key, art.variant, lambda art=art: art)
    flip_byte(cache.entry_dir(bad.key) / "kernel.cubin", at=0)
    (cache.entry_dir(partial.key) / "meta.json").unlink()
    found = cache.verify(repair=False)
    assert {(s.key, s.state) for s in found} == {(bad.key, "invalid"), (partial.key, "partial")}
    assert sorted(cache.keys()) == sorted([good.key, bad.key, partial.key])  # report only
    found = cache.verify()
    assert {(s.key, s.state) for s in found} == {(bad.key, "invalid"), (partial.key, "partial")}
    assert cache.keys() == [good.key]
    assert len(quarantined(cache)) == 2
    assert counters(cache)["invalid"] == 1  # a partial entry is an interrupted write, not a bad one
    assert cache.verify() == []
    assert cache.load(good.key) == good


def test_gc_evicts_least_recently_used_first(cache, fake_artifact):
    arts = {n: fake_artifact(n) for n in ("old", "mid", "new")}
    for art in arts.values():
        cache.get_or_create(art.key, art.variant, lambda art=art: art)

    def entry_bytes(key):
        return sum(f.stat().st_size for f in cache.entry_dir(key).iterdir())

    now = time.time()
    for age, n in ((3000, "old"), (2000, "mid"), (1000, "new")):
        os.utime(cache.entry_dir(arts[n].key) / "meta.json", (now - age, now - age))
    sizes = {n: entry_bytes(a.key) for n, a in arts.items()}
    total = sum(sizes.values())
    assert cache.gc(total) == []
    assert cache.gc(total - 1) == [arts["old"].key]
    assert sorted(cache.keys()) == sorted([arts["mid"].key, arts["new"].key])
    # a load is a use: "mid" becomes the most recent, so "new" goes next
    assert cache.load(arts["mid"].key) is not None
    assert cache.gc(sizes["mid"]) == [arts["new"].key]
    assert cache.keys() == [arts["mid"].key]
    assert cache.gc(0) == [arts["mid"].key]
    assert cache.keys() == []
    assert not (cache.root / "trash").exists()


def test_remove_and_clear(cache, fake_artifact):
    arts = [fake_artifact(f"c{i}") for i in range(3)]
    for art in arts:
        cache.get_or_create(art.key, art.variant, lambda art=art: art)
    flip_byte(cache.entry_dir(arts[0].key) / "kernel.cubin")
    cache.load(arts[0].key)  # quarantines it
    assert cache.remove(arts[1].key) is True
    assert cache.remove(arts[1].key) is False
    assert cache.keys() == [arts[2].key]
    assert cache.clear() == 1
    assert cache.keys() == []
    assert not (cache.root / "quarantine").exists()
    assert counters(cache) == dict(hits=0, misses=0, compiles=0, bypassed=0, invalid=0)


def test_empty_cache_operations(cache):
    assert cache.keys() == []
    assert cache.verify() == []
    assert cache.gc(0) == []
    assert cache.clear() == 0
    assert cache.size_bytes() == 0
    assert cache.load("ab" * 32) is None
    assert cache.check("ab" * 32)[0].state == "missing"


# ---- locks ----------------------------------------------------------------

def test_lock_timeout_names_the_lock(cache_dir, fake_artifact):
    c = Cache(lock_timeout=0.5)
    art = fake_artifact("locked")
    create = counting(art)
    with lock_held_elsewhere(c.lock_path(art.key)) as holder:
        t0 = time.monotonic()
        with pytest.raises(LockTimeoutError) as ei:
            c.get_or_create(art.key, art.variant, create)
        waited = time.monotonic() - t0
        assert 0.4 <= waited < 5
        msg = str(ei.value)
        assert str(c.lock_path(art.key)) in msg
        assert art.variant.name in msg and "0.5 s" in msg
        assert ei.value.exit_code == 6 and "AOTC_LOCK_TIMEOUT" in ei.value.hint
        assert create.calls == []
        holder.kill()
        holder.wait()
    # the killed holder's lock is gone with it
    got, created = c.get_or_create(art.key, art.variant, create)
    assert created and len(create.calls) == 1


def test_lock_timeout_from_env(cache_dir, monkeypatch):
    monkeypatch.setenv("AOTC_LOCK_TIMEOUT", "2.5")
    assert Cache().lock_timeout == 2.5
    assert Cache(lock_timeout=1).lock_timeout == 1


def test_lock_dir_from_env_is_used(cache_dir, tmp_path, monkeypatch, fake_artifact):
    locks = tmp_path / "node-local-locks"
    monkeypatch.setenv("AOTC_LOCK_DIR", str(locks))
    monkeypatch.setenv("AOTC_LOCK_TIMEOUT", "0.5")
    c = Cache()
    art = fake_artifact("lockdir")
    assert c.lock_dir == locks
    assert c.lock_path(art.key) == locks / f"{art.key}.lock"
    with lock_held_elsewhere(locks / f"{art.key}.lock"):
        with pytest.raises(LockTimeoutError, match=str(locks)):
            c.get_or_create(art.key, art.variant, lambda: art)
    c.get_or_create(art.key, art.variant, lambda: art)
    assert c.load(art.key) == art
    assert not (c.root / "locks").exists()  # nothing went to the default place


def test_threads_create_a_key_once(cache, fake_artifact):
    art = fake_artifact("threads")
    calls = []

    def slow_create():
        calls.append(threading.get_ident())
        time.sleep(0.3)
        return art

    results = []
    threads = [threading.Thread(target=lambda: results.append(
        Cache(cache.root.parent).get_or_create(art.key, art.variant, slow_create))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(calls) == 1
    assert sorted(created for _, created in results) == [False, False, False, True]
    assert all(a == art for a, _ in results)
    assert counters(cache)["compiles"] == 1


def test_fill_over_an_invalid_entry_repairs_it_without_waiting(cache_dir, fake_artifact):
    """fill() is what `aotc bundle install` calls directly: a bad entry must not deadlock on its own lock."""
    c = Cache(lock_timeout=3)
    art = fake_artifact("refill")
    c.fill(art.key, art.variant, lambda: art)
    flip_byte(c.entry_dir(art.key) / "kernel.cubin")
    t0 = time.monotonic()
    got, created = c.fill(art.key, art.variant, lambda: art)
    assert time.monotonic() - t0 < 2
    assert created and got == art
    assert c.load(art.key) == art
    assert counters(c)["invalid"] == 1
    assert len(quarantined(c)) == 1


# ---- atomic_write -------------------------------------------------------------

def test_atomic_write_leaves_no_temp_files(tmp_path):
    p = tmp_path / "f.bin"
    atomic_write(p, b"one")
    atomic_write(p, b"two")
    assert p.read_bytes() == b"two"
    assert [x.name for x in tmp_path.iterdir()] == ["f.bin"]


def test_atomic_write_failure_keeps_old_file_and_no_temp(tmp_path, monkeypatch):
    p = tmp_path / "f.bin"
    atomic_write(p, b"old")

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write(p, b"new")
    monkeypatch.undo()
    assert p.read_bytes() == b"old"
    assert [x.name for x in tmp_path.iterdir()] == ["f.bin"]


def test_cache_root_from_env(cache_dir):
    assert Cache().root == cache_dir / "v1"
    assert Cache(cache_dir / "elsewhere").root == cache_dir / "elsewhere" / "v1"


@pytest.mark.parametrize("key", ["", "../../../evil", "ab/../../x", "AB" * 32, "g" * 64, "a" * 63])
def test_keys_that_are_not_sha256_never_become_paths(cache, tmp_path, fake_artifact, key):
    art = fake_artifact("evil", key=key)
    with pytest.raises(CacheError, match="not a cache key"):
        cache.fill(art.key, art.variant, lambda: art)
    with pytest.raises(CacheError, match="not a cache key"):
        cache.commit(art)
    with pytest.raises(CacheError, match="not a cache key"):
        cache.load(key)
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert all(w.startswith("aotc-cache/v1/") for w in written), written
    assert not any(p.name in ("kernel.cubin", "meta.json", "evil", "x") for p in tmp_path.rglob("*"))


def test_keys_ignores_foreign_directories(cache, fake_artifact):
    art = fake_artifact("real")
    cache.get_or_create(art.key, art.variant, lambda: art)
    (cache.entries_dir / "zz" / "not-a-key").mkdir(parents=True)
    (cache.entries_dir / "00" / ("11" * 32)).mkdir(parents=True)  # a key filed under the wrong prefix
    (cache.entries_dir / art.key[:2] / f".{art.key}.tmp").mkdir()
    assert cache.keys() == [art.key]
    assert cache.verify() == []
