"""The benchmarks' interleaving (benchmarks/timing.py) needs no GPU: rotation and sample bookkeeping;
and the folder's layout (benchmarks, tuners, probes), whose programs must find the repository and
each other wherever they sit."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from benchmarks.timing import interleaved
from conftest import REPO


def test_interleaved_rotates_the_order_every_round():
    calls = []

    def contender(name, value):
        def measure():
            calls.append(name)
            return value
        return measure

    samples = interleaved({"a": contender("a", 1.0), "b": contender("b", 2.0), "c": contender("c", 3.0)}, rounds=4)
    assert samples == {"a": [1.0] * 4, "b": [2.0] * 4, "c": [3.0] * 4}
    # round r starts at contender r mod 3, so no contender always follows the same one
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]


def test_interleaved_with_no_contenders_or_rounds():
    assert interleaved({}, rounds=3) == {}
    assert interleaved({"a": lambda: 1.0}, rounds=0) == {"a": []}


# ---- the folder's layout: benchmarks, tuners, probes -----------------------------------------------------
BENCHMARKS = REPO / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.rglob("*.py") if "results" not in p.parts and p.name != "__init__.py")
MODULES = {p.stem for p in SCRIPTS}


def test_benchmarks_tuners_and_probes_each_have_their_folder():
    where = {p.stem: p.parent.relative_to(BENCHMARKS).as_posix() for p in SCRIPTS}
    assert {n: where.get(n) for n in ("tune_decode", "tune_prefill_sm90", "tune_prefill_sm90_gpu", "tuning")} == \
        dict.fromkeys(("tune_decode", "tune_prefill_sm90", "tune_prefill_sm90_gpu", "tuning"), "tuners")
    assert {n: where.get(n) for n in ("fp16_power_probe", "split_sweep", "profile_kernel")} == \
        dict.fromkeys(("fp16_power_probe", "split_sweep", "profile_kernel"), "probes")
    top = sorted(n for n, d in where.items() if d == ".")
    assert top == sorted(["bench_build", "bench_decode", "bench_decode_varlen", "bench_features", "bench_fp8_kv",
                          "bench_host", "bench_kv_write",
                          "bench_paged_varlen",
                          "bench_prefill", "bench_runtime", "cold_start", "decode_breakdown", "legacy", "report",
                          "timing"])


def _top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for t in node.targets:  # `X = ...` and `A, B = ...`
                names.update(e.id for e in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(e, ast.Name))
    return names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.relative_to(BENCHMARKS).as_posix())
def test_each_program_finds_the_repository_and_what_it_imports(script):
    """`Path(__file__).resolve().parents[N]` is the repository root, every `from benchmarks.x import y`
    names a module and a name it defines, and no sibling is imported by its bare name (from a path hack)."""
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "parents":
            assert script.resolve().parents[node.slice.value] == REPO, f"line {node.lineno}: parents[{node.slice.value}]"
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "benchmarks":
            target = REPO / (node.module.replace(".", "/") + ".py")
            assert target.is_file(), f"line {node.lineno}: no module {node.module}"
            missing = {a.name for a in node.names} - _top_level_names(target)
            assert not missing, f"line {node.lineno}: {node.module} defines no {sorted(missing)}"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bare = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            assert not [m for m in bare if m.split(".")[0] in MODULES], f"line {node.lineno}: import as benchmarks.x"


def test_git_commit_says_when_the_tree_is_not_its_head(tmp_path, monkeypatch):
    """A result file's git_commit names the commit whose kernels ran: a tree whose tracked files differ from
    HEAD (the GPU machine's copy can carry older history than its files) is marked, AOTC_GIT_COMMIT wins."""
    import subprocess

    from benchmarks import bench_runtime

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout
    git("init", "-q")
    (tmp_path / "k.py").write_text("a = 1\n")
    git("add", "k.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    head = git("rev-parse", "HEAD").strip()
    monkeypatch.setattr(bench_runtime, "ROOT", tmp_path)
    monkeypatch.delenv("AOTC_GIT_COMMIT", raising=False)
    assert bench_runtime.git_commit() == head
    (tmp_path / "k.py").write_text("a = 2\n")
    assert bench_runtime.git_commit() == head + "+uncommitted"
    monkeypatch.setenv("AOTC_GIT_COMMIT", "abc123")
    assert bench_runtime.git_commit() == "abc123"
