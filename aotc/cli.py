"""The aotc command line. Errors become messages and exit codes here, in one place.

Exit codes: 0 success; 1 some variants failed to build or a check failed
(including `aotc doctor` finding an unreadable bundle and `bundle merge --spec`
finding variants missing); 2 bad spec or usage (including a bad --shard, an
unknown executor or an unreachable Dask scheduler); 3 compile error; 4 cache
error; 5 variants missing while compiling is forbidden; 6 lock timeout; 7 bad
bundle; 8 bundle from another format version.

Shell completion (click's): eval "$(_AOTC_COMPLETE=bash_source aotc)" in
~/.bashrc; zsh_source and fish_source for zsh and fish.
"""
from __future__ import annotations

import json
import sys

import click

from . import __version__, config
from .errors import AotcError


def _spec_arg(spec: str | None):
    from .spec import load_spec

    return load_spec(spec)


SHARD_STRATEGIES = ("balanced", "hash")  # aotc.shard.STRATEGIES (kept here so --help needs no import)


def _parse_shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    from .shard import parse_shard

    return parse_shard(text)


def _shard_variants(variants, where: tuple[int, int] | None, strategy: str) -> list:
    if where is None:
        return list(variants)
    from .shard import select

    return select(variants, where[0], where[1], strategy)


def _emit_json(obj) -> None:
    click.echo(json.dumps(obj, indent=1, sort_keys=True, default=str))


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


EPILOG = """\b
Exit codes: 0 ok, 1 some variants failed or a check failed, 2 bad spec or usage,
3 compile error, 4 cache error, 5 variants missing while compiling is forbidden,
6 lock timeout, 7 bad bundle, 8 bundle of another format version.
\b
Shell completion: eval "$(_AOTC_COMPLETE=bash_source aotc)"  (zsh_source, fish_source)
"""


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.version_option(__version__, prog_name="aotc")
def cli() -> None:
    """Ahead-of-time CuTe DSL attention kernels: build specs into a cache, ship bundles, launch without compiling."""


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
    from .cache import Cache
    from .compile import cache_key

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
    from .build import build as run_build
    from .bundle import write_bundle
    from .executors import executor

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


# ---- bundle ---------------------------------------------------------------
@cli.group()
def bundle():
    """Create, check, inspect, merge, install and package bundles (one file holding cubins and a manifest)."""


@bundle.command("create")
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--spec", default=None, type=click.Path(dir_okay=False),
              help="spec whose variants to pack (default: the embedded default spec)")
def bundle_create(out, spec):
    """Pack a spec's variants from the cache into OUT; every variant must already be built."""
    from .build import build as run_build
    from .bundle import write_bundle

    s = _spec_arg(spec)
    report = run_build(s.variants, offline=True, build_command=f"aotc build {spec or ''}".strip())
    manifest = write_bundle(out, report.artifacts)
    click.echo(f"wrote {out} ({len(manifest['artifacts'])} kernels)")


@bundle.command("verify")
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False))
def bundle_verify(paths):
    """Check every member of each bundle against its manifest (sizes, sha256, arch)."""
    from .bundle import verify_bundle

    bad = False
    for p in paths:
        problems = verify_bundle(p)
        if problems:
            bad = True
            for msg in problems:
                click.echo(f"{p}: {msg}", err=True)
        else:
            click.echo(f"{p}: ok")
    if bad:
        sys.exit(1)


@bundle.command("inspect")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
def bundle_inspect(path, as_json):
    """Show a bundle's manifest: producer versions and one line per kernel."""
    from .bundle import read_bundle

    b = read_bundle(path)
    if as_json:
        _emit_json(b.manifest)
        return
    m = b.manifest
    click.echo(f"{path}: format {m['format_version']}, created {m.get('created')}, {len(b.artifacts)} kernels")
    click.echo("producer: " + ", ".join(f"{k} {v}" for k, v in m.get("producer", {}).items()))
    for a in b.artifacts:
        click.echo(f"  {a.variant.name}  {_human_bytes(a.size)}  sha256 {a.sha256[:12]}  "
                   f"{len(a.abi.params)} params  block {a.launch.block}  smem {a.launch.dynamic_smem}")


@bundle.command("merge")
@click.argument("out", type=click.Path(dir_okay=False))
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--spec", "spec", type=click.Path(dir_okay=False),
              help="refuse (exit 1, nothing written) unless every variant of this spec is in the inputs")
def bundle_merge(out, inputs, spec):
    """Join bundles (e.g. the shards of `aotc build --shard I/N`) into OUT.

    The same variant in two inputs must have the same sha256 (same aotc and DSL
    versions); OUT is written atomically."""
    from .bundle import merge_bundles

    expect = _spec_arg(spec).variants if spec else None
    manifest = merge_bundles(inputs, out, expect=expect)
    click.echo(f"wrote {out} ({len(manifest['artifacts'])} kernels from {len(inputs)} bundles)")


@bundle.command("wheel")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--name", required=True, help="distribution name, e.g. acme-attention-kernels")
@click.option("--version", "version", required=True, help="PEP 440 version, e.g. 1.0.0")
@click.option("--out", "out_dir", default="dist", show_default=True, type=click.Path(file_okay=False),
              help="directory the wheel is written to")
@click.option("--package", default=None, help="import name of the package holding the bundle (default: from --name)")
@click.option("--requires", "requires", multiple=True, metavar="REQ",
              help="a Requires-Dist line, e.g. 'aotc>=0.1' (repeatable; none by default)")
@click.option("--json", "as_json", is_flag=True)
def bundle_wheel(path, name, version, out_dir, package, requires, as_json):
    """Make a pip-installable wheel carrying the bundle at PATH.

    The wheel (NAME-VERSION-py3-none-any.whl) holds a package with the bundle
    as package data and an `aotc.bundles` entry point, so aotc.load() with no
    argument finds it once installed."""
    from .wheel import build_wheel

    info = build_wheel(path, name=name, version=version, out_dir=out_dir, package=package, requires=requires)
    if as_json:
        _emit_json(info)
        return
    click.echo(f"wrote {info['wheel']} ({info['kernels']} kernels; package {info['package']}, "
               f"entry point aotc.bundles:{info['entry_point']})")


@bundle.command("install")
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False))
def bundle_install(paths):
    """Copy each bundle's verified kernels into the cache."""
    from .bundle import install_bundle
    from .cache import Cache

    cache = Cache()
    n = sum(install_bundle(p, cache) for p in paths)
    click.echo(f"installed {n} new kernels into {cache.root}")


# ---- cache ----------------------------------------------------------------
@cli.group()
def cache():
    """Inspect and maintain the artifact cache (AOTC_CACHE_DIR)."""


@cache.command("info")
@click.option("--json", "as_json", is_flag=True)
def cache_info(as_json):
    """Where the cache is, its size, entry count and counters."""
    from .cache import Cache

    c = Cache()
    info = {"root": str(c.root), "lock_dir": str(c.lock_dir), "entries": len(c.keys()), "bytes": c.size_bytes(),
            "counters": c.stats()}
    if as_json:
        _emit_json(info)
        return
    click.echo(f"root:     {info['root']}\nlocks:    {info['lock_dir']}\nentries:  {info['entries']}\n"
               f"size:     {_human_bytes(info['bytes'])}")
    click.echo("counters: " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                        for k, v in info["counters"].items()))


@cache.command("ls")
def cache_ls():
    """One line per entry: key, state and variant; entries made by other aotc/DSL versions are marked
    stale with the versions that made them (this aotc never looks them up; `aotc cache gc` ages them out)."""
    from .cache import Cache
    from .compile import cache_key
    from .versions import producer_versions

    c = Cache()
    here = producer_versions()
    for key in c.keys():
        status, art = c.check(key)
        if art is None:
            click.echo(f"{key[:16]}  {status.state:<8} {status.reason}")
            continue
        state, extra = status.state, ""
        if cache_key(art.variant) not in (None, key):
            made = art.info.get("versions", {})
            diff = {k: v for k, v in made.items() if here.get(k) != v}
            state, extra = "stale", "  (made by " + ", ".join(f"{k} {v}" for k, v in sorted(diff.items())) + \
                "; rebuild with `aotc build`)"
        click.echo(f"{key[:16]}  {state:<8} {art.variant.name}{extra}")


@cache.command("verify")
@click.option("--no-repair", is_flag=True, help="report only; leave bad entries in place")
def cache_verify(no_repair):
    """Check every entry's sha256 and files; bad entries are quarantined (rebuilt on next use)."""
    from .cache import Cache

    c = Cache()
    problems = c.verify(repair=not no_repair)
    for p in problems:
        click.echo(f"{p.key[:16]}  {p.state}: {p.reason}" + ("" if no_repair else "  (quarantined)"), err=True)
    click.echo(f"{len(c.keys()) + (0 if no_repair else len(problems))} entries checked, {len(problems)} bad")
    if problems:
        sys.exit(1)


@cache.command("gc")
@click.option("--max-bytes", required=True, type=click.IntRange(0), help="evict least-recently-used entries past this size")
def cache_gc(max_bytes):
    """Evict least-recently-used entries until the cache fits in --max-bytes."""
    from .cache import Cache

    evicted = Cache().gc(max_bytes)
    click.echo(f"evicted {len(evicted)} entries")


@cache.command("clear")
@click.confirmation_option(prompt="Remove every cache entry?")
def cache_clear():
    """Remove every entry."""
    from .cache import Cache

    click.echo(f"removed {Cache().clear()} entries")


# ---- doctor ---------------------------------------------------------------
@cli.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def doctor(as_json):
    """Versions, GPU and archs, cache and lock directories, and which found bundles load on this GPU.

    Exits 1 when a bundle it finds (AOTC_BUNDLE_PATH, installed wheels) cannot be read."""
    from .doctor import collect, render

    info = collect()
    if as_json:
        _emit_json(info)
    else:
        click.echo(render(info))
    if any(b.get("error") for b in info["bundles"]):
        sys.exit(1)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, turning aotc errors into a message and an exit code."""
    try:
        cli.main(args=argv, prog_name="aotc", standalone_mode=False)
    except AotcError as e:
        click.echo(f"error: {e}", err=True)
        if e.hint:
            click.echo(f"hint: {e.hint}", err=True)
        return e.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 1
    except click.ClickException as e:
        e.show()
        return 2 if isinstance(e, click.UsageError) else e.exit_code
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
