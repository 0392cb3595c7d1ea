"""`aotc list` and `aotc build`."""
from __future__ import annotations

import sys

import click

from ..common import config
from ..common.errors import CheckFailedError, OutputError
from . import SHARD_STRATEGIES, _check_output_file, _emit_json, _parse_shard, _shard_variants, _spec_arg, cli, output


class VariantsFailedError(CheckFailedError):
    """Some variants of a build failed (each one's error is in the report)."""

    kind = "variants_failed"


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

    output.json_document(as_json)
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
        output.echo(f"{r['cache']:<11} {(r['key'] or '-')[:16]}  {r['name']}")
    of = f" in shard {where[0]}/{where[1]} (of {len(s.variants)})" if where else ""
    output.echo(f"{len(rows)} variants{of} ({sum(r['cache'] == 'cached' for r in rows)} cached), {len(pruned)} pruned")
    if why_not:
        for p in pruned:
            vals = " ".join(f"{k}={v}" for k, v in p["values"].items())
            output.echo(f"pruned {p['family']} {vals}: {p['reason']}")


# ---- build ----------------------------------------------------------------
@cli.command()
@click.argument("spec", required=False, type=click.Path(dir_okay=False))
@click.option("-j", "--jobs", default=1, show_default=True, type=click.IntRange(1, 256),
              help="compile processes (with --executor dask --scheduler local: workers)")
@click.option("--offline", is_flag=True, help="never compile: a cache miss is an error (also AOTC_NO_COMPILE=1)")
@click.option("--bundle", "bundle_out", type=click.Path(dir_okay=False), help="also write the variants to this bundle")
@click.option("--json", "as_json", is_flag=True,
              help="print the build report as JSON (on every exit, failures included)")
@click.option("--shard", metavar="I/N", help="build only shard I of N (1 <= I <= N), e.g. one job of a CI matrix; "
                                             "join the shards' bundles with `aotc bundle merge`")
@click.option("--shard-by", type=click.Choice(SHARD_STRATEGIES), default="balanced", show_default=True,
              help="balanced: round-robin over sorted variants (sizes differ by at most 1); "
                   "hash: sha256 of the variant mod N (a variant never moves when the spec changes)")
@click.option("--executor", "executor_kind", type=click.Choice(["process", "dask"]), default="process",
              show_default=True, help="where compiles run: local compile processes, or a Dask distributed cluster")
@click.option("--scheduler", metavar="ADDRESS|local",
              help="with --executor dask: a running scheduler (tcp://host:8786) or `local` for a LocalCluster "
                   "of -j workers (default: DASK_SCHEDULER_ADDRESS, else local)")
def build(spec, jobs, offline, bundle_out, as_json, shard, shard_by, executor_kind, scheduler):
    """Compile every variant of SPEC (default: the embedded default spec) into the cache.

    Every compile runs in a compile process of its own (-j of them at a time): a compile that crashes
    fails that variant only, and the report names it. Ctrl-C exits 130 and SIGTERM 143, after stopping
    the compile processes."""
    from ..build.builder import STATUSES, build as run_build
    from ..build.executors import start
    from ..storage.bundle import write_bundle

    done = []
    facts: dict = {"spec": spec, "bundle": bundle_out, "executor": executor_kind}
    report_json: dict = {}

    def document() -> dict:  # the report so far: what finished, in the order it finished
        if report_json:
            return {**facts, **report_json}
        return {**facts, "counts": {st: sum(r.status == st for r in done) for st in STATUSES},
                "variants": [r.to_json() for r in done]}

    output.json_document(as_json, document)
    where = _parse_shard(shard)
    s = _spec_arg(spec, need_variants=True)
    facts["spec"] = s.path
    variants = _shard_variants(s.variants, where, shard_by)
    if where is not None:
        facts["shard"] = {"index": where[0], "count": where[1], "strategy": shard_by,
                          "variants": len(variants), "spec_variants": len(s.variants)}
    if bundle_out:
        _check_output_file(bundle_out, "--bundle")
    offline = offline or config.no_compile()
    command = f"aotc build {spec or ''} -j {jobs}".replace("  ", " ")
    if where is not None:
        command += f" --shard {where[0]}/{where[1]}" + ("" if shard_by == "balanced" else f" --shard-by {shard_by}")
    show = not as_json and sys.stderr.isatty()

    def progress(r) -> None:
        done.append(r)
        if not as_json and not show:
            extra = f" ({r.seconds:.1f} s)" if r.status == "compiled" else ""
            click.echo(f"[{len(done)}/{len(variants)}] {r.status:<8} {r.variant.name}{extra}", err=True)

    if where is not None and not as_json:
        click.echo(f"shard {where[0]}/{where[1]} ({shard_by}): {len(variants)} of {len(s.variants)} variants", err=True)
    with start(executor_kind, jobs=jobs, scheduler=scheduler) as workers:
        kw = dict(offline=offline, build_command=command, executor=workers.executor, shared_cache=workers.shared_cache)
        if executor_kind != "process" and not as_json:
            click.echo(f"executor: {workers.description}", err=True)
        if show:
            with click.progressbar(length=len(variants), label="building", show_eta=True, file=sys.stderr) as bar:
                report = run_build(variants, progress=lambda r: (progress(r), bar.update(1)), **kw)
        else:
            report = run_build(variants, progress=progress, **kw)
    report_json.update(report.to_json())
    # a shard writes its bundle even when it holds nothing, so a CI matrix always has N pieces to merge
    wrote = bool(bundle_out and (report.artifacts or where is not None))
    if wrote:
        try:
            write_bundle(bundle_out, report.artifacts)
        except OSError as e:
            raise OutputError(f"--bundle {bundle_out!r}: cannot write it: {e.strerror or e}") from None
    facts["bundle"] = bundle_out if wrote else None
    if not as_json:
        counts = {st: len(report.by_status(st)) for st in STATUSES}
        output.echo(f"{len(report.results)} variants in {report.elapsed:.2f} s: " +
                    ", ".join(f"{n} {st}" for st, n in counts.items() if n))
        if wrote:
            output.echo(f"wrote {bundle_out} ({len(report.artifacts)} kernels)")
        for r in report.failed:
            click.echo(f"FAILED {r.variant.name}: {r.error}", err=True)
    if report.failed:
        names = ", ".join(r.variant.name for r in report.failed[:3]) + (", ..." if len(report.failed) > 3 else "")
        raise VariantsFailedError(f"{len(report.failed)} of {len(report.results)} variants failed: {names}",
                                  hint=f"each variant's error is above (and in --json's variants); rerun `{command}` "
                                       "to retry only those")
    if as_json:
        _emit_json(document())
