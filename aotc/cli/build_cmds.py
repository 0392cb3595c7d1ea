"""`aotc list` and `aotc build`."""
from __future__ import annotations

import sys

import click

from ..common import config
from . import SHARD_STRATEGIES, _emit_json, _parse_shard, _shard_variants, _spec_arg, cli

# ---- list -----------------------------------------------------------------
@cli.command("list")
@click.argument("spec", required=False, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--why-not", is_flag=True, help="also list pruned combinations and why")
@click.option("--shard", metavar="I/N", help="only the variants shard I of N builds (see aotc build --shard)")
@click.option("--shard-by", type=click.Choice(SHARD_STRATEGIES), default="balanced", show_default=True,
              help="how variants are dealt to shards")
def list_cmd(spec, as_json, why_not, shard, shard_by):
    """List a spec's variants (default: the embedded default spec), their cache keys and cache status."""
    from ..storage.cache import Cache
    from ..build.compile import cache_key

    where = _parse_shard(shard)
    s = _spec_arg(spec)
    cache = Cache()
    rows = []
    for v in _shard_variants(s.variants, where, shard_by):
        key = cache_key(v)
        status = "uncacheable" if key is None else cache.check(key)[0].state
        rows.append({"name": v.name, "variant": v.to_json(), "key": key, "cache": "cached" if status == "ok" else status})
    pruned = [{"family": p.family, "values": p.values, "reason": p.reason} for p in s.pruned]
    if as_json:
        extra = {"shard": {"index": where[0], "count": where[1], "strategy": shard_by,
                           "spec_variants": len(s.variants)}} if where else {}
        _emit_json({"spec": s.path, "variants": rows, **({"pruned": pruned} if why_not else {}), **extra})
        return
    for r in rows:
        click.echo(f"{r['cache']:<11} {(r['key'] or '-')[:16]}  {r['name']}")
    of = f" in shard {where[0]}/{where[1]} (of {len(s.variants)})" if where else ""
    click.echo(f"{len(rows)} variants{of} ({sum(r['cache'] == 'cached' for r in rows)} cached), {len(pruned)} pruned")
    if why_not:
        for p in pruned:
            vals = " ".join(f"{k}={v}" for k, v in p["values"].items())
            click.echo(f"pruned {p['family']} {vals}: {p['reason']}")


# ---- build ----------------------------------------------------------------
@cli.command()
@click.argument("spec", required=False, type=click.Path(dir_okay=False))
@click.option("-j", "--jobs", default=1, show_default=True, type=click.IntRange(1, 256),
              help="compile processes (with --executor dask --scheduler local: workers)")
@click.option("--offline", is_flag=True, help="never compile: a cache miss is an error (also AOTC_NO_COMPILE=1)")
@click.option("--bundle", "bundle_out", type=click.Path(dir_okay=False), help="also write the variants to this bundle")
@click.option("--json", "as_json", is_flag=True, help="print the build report as JSON")
@click.option("--shard", metavar="I/N", help="build only shard I of N (1 <= I <= N), e.g. one job of a CI matrix; "
                                             "join the shards' bundles with `aotc bundle merge`")
@click.option("--shard-by", type=click.Choice(SHARD_STRATEGIES), default="balanced", show_default=True,
              help="balanced: round-robin over sorted variants (sizes differ by at most 1); "
                   "hash: sha256 of the variant mod N (a variant never moves when the spec changes)")
@click.option("--executor", "executor_kind", type=click.Choice(["process", "dask"]), default="process",
              show_default=True, help="where compiles run: a local process pool, or a Dask distributed cluster")
@click.option("--scheduler", metavar="ADDRESS|local",
              help="with --executor dask: a running scheduler (tcp://host:8786) or `local` for a LocalCluster "
                   "of -j workers (default: DASK_SCHEDULER_ADDRESS, else local)")
def build(spec, jobs, offline, bundle_out, as_json, shard, shard_by, executor_kind, scheduler):
    """Compile every variant of SPEC (default: the embedded default spec) into the cache."""
    from ..build.builder import build as run_build
    from ..storage.bundle import write_bundle
    from ..build.executors import executor

    where = _parse_shard(shard)
    s = _spec_arg(spec)
    variants = _shard_variants(s.variants, where, shard_by)
    offline = offline or config.no_compile()
    command = f"aotc build {spec or ''} -j {jobs}".replace("  ", " ")
    if where is not None:
        command += f" --shard {where[0]}/{where[1]}" + ("" if shard_by == "balanced" else f" --shard-by {shard_by}")
    show = not as_json and sys.stderr.isatty()
    done = []

    def progress(r) -> None:
        done.append(r)
        if not as_json and not show:
            extra = f" ({r.seconds:.1f} s)" if r.status == "compiled" else ""
            click.echo(f"[{len(done)}/{len(variants)}] {r.status:<8} {r.variant.name}{extra}", err=True)

    if where is not None and not as_json:
        click.echo(f"shard {where[0]}/{where[1]} ({shard_by}): {len(variants)} of {len(s.variants)} variants", err=True)
    with executor(executor_kind, jobs=jobs, scheduler=scheduler) as ex:
        kw = dict(jobs=jobs, offline=offline, build_command=command)
        if ex is not None:
            kw.update(executor=ex.executor, shared_cache=ex.local)
            if not as_json:
                click.echo(f"executor: {ex.describe()}", err=True)
        if show:
            with click.progressbar(length=len(variants), label="building", show_eta=True, file=sys.stderr) as bar:
                report = run_build(variants, progress=lambda r: (progress(r), bar.update(1)), **kw)
        else:
            report = run_build(variants, progress=progress, **kw)
    # a shard writes its bundle even when it holds nothing, so a CI matrix always has N pieces to merge
    if bundle_out and (report.artifacts or where is not None):
        write_bundle(bundle_out, report.artifacts)
    if as_json:
        out = report.to_json()
        out["bundle"] = bundle_out
        out["executor"] = executor_kind
        if where is not None:
            out["shard"] = {"index": where[0], "count": where[1], "strategy": shard_by,
                            "variants": len(variants), "spec_variants": len(s.variants)}
        _emit_json(out)
    else:
        counts = {st: len(report.by_status(st)) for st in ("hit", "compiled", "bypassed", "failed")}
        click.echo(f"{len(report.results)} variants in {report.elapsed:.2f} s: " +
                   ", ".join(f"{n} {st}" for st, n in counts.items() if n))
        if bundle_out and (report.artifacts or where is not None):
            click.echo(f"wrote {bundle_out} ({len(report.artifacts)} kernels)")
        for r in report.failed:
            click.echo(f"FAILED {r.variant.name}: {r.error}", err=True)
    if report.failed:
        sys.exit(1)


