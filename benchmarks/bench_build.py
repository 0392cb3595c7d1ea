"""Build-side and host-memory figures, measured on the CPU build machine (no GPU needed).

    python benchmarks/bench_build.py --out benchmarks/results [--spec specs/default.toml]

- cold build of the spec into an empty cache with `aotc build -j 2` (variants per minute), then the
  warm (all-hit) build, both as fresh processes, wall clock;
- bundle size and the time to read and verify it (aotc.runtime.load, sha256 of every member);
- the JIT path aotc removes: a fresh process that imports CuTe DSL and compiles one variant
  (what a first call pays without aotc), beside a fresh process that imports aotc.runtime and
  loads the bundle (what aotc pays; the GPU side adds driver init and module load, see
  bench_runtime / cold_start);
- memory: RSS added by `import aotc.runtime` and by loading the bundle, against `import cutlass`.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.bench_runtime import git_commit  # noqa: E402

RSS_PROBE = r"""
import json, sys, time
def rss():
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmRSS:'):
                return int(line.split()[1]) * 1024
sys.path.insert(0, {root!r})
r0 = rss(); t0 = time.perf_counter()
{body}
print(json.dumps(dict(rss_before=r0, rss_after=rss(), seconds=time.perf_counter() - t0, **extra)))
"""


def probe(body: str, env=None) -> dict:
    code = RSS_PROBE.format(root=str(ROOT), body=body)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def run(cmd: list[str], env) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default=str(ROOT / "specs" / "default.toml"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="aotc-bench-"))
    env = dict(os.environ, AOTC_CACHE_DIR=str(tmp / "cache"), PYTHONPATH=str(ROOT))
    bundle = tmp / "bench.aotc"
    aotc = [sys.executable, "-m", "aotc"]
    sys.path.insert(0, str(ROOT))
    from aotc.build.spec import load_spec

    spec = load_spec(args.spec)
    n = len(spec.variants)
    cold = run(aotc + ["build", args.spec, "-j", str(args.jobs), "--bundle", str(bundle)], env)
    warm = run(aotc + ["build", args.spec, "-j", str(args.jobs)], env)
    report = json.loads(subprocess.run(aotc + ["build", args.spec, "--json"], env=env, capture_output=True,
                                       text=True, check=True).stdout)
    stats = json.loads(subprocess.run(aotc + ["cache", "info", "--json"], env=env, capture_output=True, text=True,
                                      check=True).stdout)
    from aotc.storage.bundle import read_bundle

    per_variant = {a.variant.name: {"compile_seconds": a.info.get("compile_seconds"), "cubin_bytes": a.size,
                                    "registers": a.info.get("registers")}
                   for a in read_bundle(bundle).artifacts}

    jits = {}
    for family in sorted({v.family for v in spec.variants}):
        first = next(v for v in spec.variants if v.family == family)
        jits[family] = probe(f"""
import os; os.environ['CUTE_DSL_NO_CACHE'] = '1'
from aotc.common.variant import Variant
from aotc.build.compile import compile_variant
art = compile_variant(Variant.from_json({first.to_json()!r}))
extra = dict(variant=art.variant.name)
""")
    jit = jits[sorted(jits)[0]]
    runtime_import = probe("import aotc.runtime\nextra = {}")
    runtime_load = probe(f"import aotc.runtime\nrt = aotc.runtime.load({str(bundle)!r})\nextra = {{}}")
    dsl_import = probe("import cutlass, cutlass.cute\nextra = {}")
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, CPU build machine",
        "command": "python benchmarks/bench_build.py " + " ".join(sys.argv[1:]),
        "git_commit": git_commit(),
        "spec": args.spec, "variants": n, "jobs": args.jobs,
        "cold_build_s": cold, "variants_per_minute": n / cold * 60, "warm_build_s": warm,
        "warm_build_counts": report["counts"], "cache_counters": stats["counters"],
        "bundle_bytes": bundle.stat().st_size,
        "bundle_load_s (fresh process: import aotc.runtime + read + verify)": runtime_load["seconds"],
        "jit_first_compile_s (fresh process: import DSL + cute.compile one variant)": jit["seconds"],
        "jit_variant": jit["variant"],
        "jit_first_compile_s_per_family": {f: {"variant": j["variant"], "seconds": j["seconds"]} for f, j in jits.items()},
        "rss_import_aotc_runtime_bytes": runtime_import["rss_after"] - runtime_import["rss_before"],
        "rss_import_and_load_bundle_bytes": runtime_load["rss_after"] - runtime_load["rss_before"],
        "rss_import_cutlass_dsl_bytes": dsl_import["rss_after"] - dsl_import["rss_before"],
        "per_variant": per_variant,
    }
    result["rss_ratio_runtime_to_dsl"] = result["rss_import_and_load_bundle_bytes"] / result["rss_import_cutlass_dsl_bytes"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "build.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "per_variant"}, indent=1))


if __name__ == "__main__":
    main()
