"""Shared fixtures of the CPU suite.

Every test outside tests/gpu/ runs with AOTC_CACHE_DIR pointing into its own
tmp_path and with the other AOTC_* knobs cleared, so no test can touch the
user's real cache or inherit a setting from the shell.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
HAVE_DSL = importlib.util.find_spec("cutlass") is not None

# knobs a test must never inherit from the shell
_AOTC_ENV = ("AOTC_NO_COMPILE", "AOTC_LOCK_DIR", "AOTC_LOCK_TIMEOUT", "AOTC_BUNDLE_MAX_MEMBER_BYTES",
             "AOTC_BUNDLE_MAX_BYTES", "AOTC_BUNDLE_PATH", "AOTC_TEST_WORKER_SETUP")

# the small real variants compiled once per session (sm_80 is there for arch-mismatch tests)
REAL_VARIANTS = (
    ("sdpa_combine", "sm_90a", dict(dtype="bf16", head_dim=128, strides="packed")),
    ("sdpa_combine", "sm_90a", dict(dtype="fp16", head_dim=64, strides="general")),
    ("sdpa_combine", "sm_90a", dict(dtype="fp32", head_dim=256, strides="packed")),
    ("sdpa_combine", "sm_80", dict(dtype="bf16", head_dim=128, strides="packed")),
)

TINY_SPEC = """\
# 4 sdpa_combine variants for sm_90a (tests)
[[family]]
name = "sdpa_combine"
arch = ["sm_90a"]
dtype = ["bf16", "fp16"]
head_dim = [64, 128]
strides = "packed"
"""


def _is_gpu_test(request) -> bool:
    return "gpu" in Path(str(request.node.path)).relative_to(REPO).parts[:2]


@pytest.fixture(autouse=True)
def _isolated_aotc_env(request, tmp_path, monkeypatch):
    """A private cache root per test and no inherited AOTC_* knobs (tests/gpu/ is left alone)."""
    if _is_gpu_test(request):
        yield
        return
    monkeypatch.setenv("AOTC_CACHE_DIR", str(tmp_path / "aotc-cache"))
    for name in _AOTC_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CUTE_DSL_NO_CACHE", "1")
    yield


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    """The test's cache root (AOTC_CACHE_DIR); does not exist until something writes to it."""
    d = tmp_path / "aotc-cache"
    monkeypatch.setenv("AOTC_CACHE_DIR", str(d))
    return d


@pytest.fixture
def cache(cache_dir):
    from aotc.storage.cache import Cache

    return Cache()


@pytest.fixture(scope="session")
def real_artifacts(tmp_path_factory):
    """Artifacts compiled with the real DSL, once per session (about 1-2 s): a list in REAL_VARIANTS order."""
    pytest.importorskip("cutlass")
    from aotc.build.builder import build
    from aotc.storage.cache import Cache
    from aotc.common.variant import Variant

    root = tmp_path_factory.mktemp("real-artifacts-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AOTC_CACHE_DIR", str(root))
        mp.setenv("CUTE_DSL_NO_CACHE", "1")
        variants = [Variant.make(f, a, **fields) for f, a, fields in REAL_VARIANTS]
        report = build(variants, cache=Cache(root), jobs=1)
    assert not report.failed, [r.error for r in report.failed]
    assert [a.variant for a in report.artifacts] == variants
    return report.artifacts


@pytest.fixture
def fake_artifact(request):
    """Factory: fake_artifact(name_suffix, *, base=0, cubin=None, variant=None, key=None) -> Artifact.

    No compile, and honest in everything aotc checks (aotc.common.checks): the cubin is a real one
    from ``real_artifacts`` (index ``base``) with the suffix appended (so every fake has its own bytes
    and sha256, and is still the base's kernel for the base's arch); symbol, ABI and launch facts are
    what the family gives. The variant is, per test, the next unused sdpa_combine variant of the base's
    arch (the base's own first); the key is the one this aotc computes for it. Needs the DSL.
    """
    import itertools

    from aotc.build.compile import cache_key
    from aotc.common.artifact import Artifact, sha256_hex
    from aotc.common.variant import Variant
    from aotc.families import get_family

    real = request.getfixturevalue("real_artifacts")  # skips the test without the DSL
    fam = get_family("sdpa_combine")
    used: set = set()

    def next_variant(src: Artifact) -> Variant:
        names = [f.name for f in fam.fields]
        candidates = [src.variant] + [Variant.make(fam.name, src.variant.arch, **dict(zip(names, combo)))
                                      for combo in itertools.product(*(f.choices for f in fam.fields))]
        for v in candidates:
            if v not in used and fam.why_invalid(dict(v.fields)) is None:
                return v
        raise AssertionError(f"more fakes of {src.variant.arch} than sdpa_combine variants")

    def make(name_suffix: str, *, base: int = 0, cubin: bytes | None = None, variant=None, key: str | None = None):
        src = real[base]
        data = src.cubin + b"\0" + name_suffix.encode() if cubin is None else cubin
        if variant is None:
            variant = next_variant(src)
        used.add(variant)
        fam_v = get_family(variant.family)
        return Artifact(
            variant=variant,
            key=key if key is not None else cache_key(variant),
            abi=fam_v.abi(variant, src.abi.symbol),
            launch=fam_v.launch(variant),
            cubin=data,
            sha256=sha256_hex(data),
            info={"compile_seconds": 0.25, "fake": True},
        )

    return make


@pytest.fixture
def tiny_spec(tmp_path) -> Path:
    """A TOML spec with 4 sdpa_combine variants for sm_90a."""
    p = tmp_path / "tiny.toml"
    p.write_text(TINY_SPEC)
    return p


def patch_compile_processes(monkeypatch, tmp_path: Path, code: str) -> Path:
    """Run `code` in every compile process a build starts from now on (AOTC_TEST_WORKER_SETUP): compiles
    run in spawned processes, where a monkeypatch of this one does not reach. Returns the file."""
    import textwrap

    path = tmp_path / "compile_process_setup.py"
    path.write_text(textwrap.dedent(code))
    monkeypatch.setenv("AOTC_TEST_WORKER_SETUP", str(path))
    return path


def aotc_env(**extra: str) -> dict:
    """The environment for an `python -m aotc` subprocess: this one (already isolated) plus extra."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def run_aotc(*args: str, timeout: float = 300, stdin_text: str = "", **env: str) -> subprocess.CompletedProcess:
    """Run the CLI in a fresh interpreter (as a user would), capturing text output; stdin is never the terminal."""
    return subprocess.run([PYTHON, "-m", "aotc", *args], cwd=REPO, env=aotc_env(**env), capture_output=True,
                          text=True, timeout=timeout, input=stdin_text)


def tree(root: Path) -> dict[str, tuple[int, float]]:
    """Every file and directory under root with (size, mtime): a snapshot to prove nothing was written."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns)
    return out


@contextmanager
def lock_held_elsewhere(path: Path):
    """Hold a filelock on path in another process until the block ends (then kill it)."""
    code = ("import filelock, sys, time\n"
            "lock = filelock.FileLock(sys.argv[1]); lock.acquire()\n"
            "print('held', flush=True); time.sleep(120)\n")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    p = subprocess.Popen([PYTHON, "-c", code, str(path)], stdout=subprocess.PIPE, text=True, env=aotc_env())
    try:
        assert p.stdout.readline().strip() == "held"
        yield p
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
