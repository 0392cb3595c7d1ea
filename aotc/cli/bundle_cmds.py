"""`aotc bundle ...`: create, verify, inspect, diff, merge, wheel, install.

Input bundles must exist (click's convention: a missing file is a usage error, exit 2); a bundle that
is there but bad exits 7 from every command (8: another format version or other aotc/DSL versions).
"""
from __future__ import annotations

import click

from ..common.errors import BundleError, CheckFailedError, OutputError, UsageError, VersionSkewError
from . import _check_output_file, _emit_json, _human_bytes, _spec_arg, cli, output

BUNDLE = click.Path(exists=True, dir_okay=False)


@cli.group()
def bundle():
    """Create, check, inspect, merge, install and package bundles (one file holding cubins and a manifest)."""


def _write(path: str, what: str, write):
    """Run write(); a failure to write `path` (full disk, read-only) is an OutputError naming it."""
    try:
        return write()
    except OSError as e:
        raise OutputError(f"{what} {path!r}: cannot write it: {e.strerror or e}") from None


@bundle.command("create")
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--spec", default=None, type=click.Path(dir_okay=False),
              help="spec whose variants to pack (default: the embedded default spec)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def bundle_create(out, spec, as_json):
    """Pack a spec's variants from the cache into OUT; every variant must already be built."""
    from ..build.builder import build as run_build
    from ..storage.bundle import write_bundle

    output.json_document(as_json, lambda: {"out": None, "spec": spec})
    s = _spec_arg(spec, need_variants=True)
    _check_output_file(out, "OUT")
    report = run_build(s.variants, offline=True, build_command=f"aotc build {spec or ''}".strip())
    manifest = _write(out, "OUT", lambda: write_bundle(out, report.artifacts))
    if as_json:
        _emit_json({"out": out, "spec": s.path, "kernels": len(manifest["artifacts"])})
    else:
        output.echo(f"wrote {out} ({len(manifest['artifacts'])} kernels)")


@bundle.command("verify")
@click.argument("paths", nargs=-1, required=True, type=BUNDLE)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def bundle_verify(paths, as_json):
    """Check every member of each bundle against its manifest (sizes, sha256, arch).

    Exits 7 when a bundle is bad (8: of another format version). At most 50 problems are listed per
    bundle; the rest are counted."""
    from ..storage.bundle import verify_bundle

    rows = []
    output.json_document(as_json, lambda: {"bundles": rows})
    skew = bad = 0
    for p in paths:
        try:
            problems = verify_bundle(p)
        except VersionSkewError as e:
            problems, skew = [str(e)], skew + 1
        except BundleError as e:
            problems = [str(e)]
        shown, more = output.listed(problems)
        rows.append({"path": p, "ok": not problems, "problems": shown, "problems_total": len(problems)})
        if not problems:
            if not as_json:
                output.echo(f"{p}: ok")
            continue
        bad += 1
        if not as_json:
            for msg in shown:
                click.echo(f"{p}: {msg}", err=True)
            if more:
                click.echo(f"{p}: ... and {more} more problems", err=True)
    if bad:
        which = "bundle" if bad == 1 else "bundles"
        cls = VersionSkewError if skew == bad else BundleError
        raise cls(f"{bad} of {len(paths)} {which} failed verification", hint="rebuild them: aotc build SPEC --bundle OUT")
    if as_json:
        _emit_json({"bundles": rows})


@bundle.command("inspect")
@click.argument("path", type=BUNDLE)
@click.option("--json", "as_json", is_flag=True, help="the manifest as JSON")
def bundle_inspect(path, as_json):
    """Show a bundle's manifest: producer versions and one line per kernel."""
    from ..storage.bundle import read_bundle

    output.json_document(as_json, lambda: {"path": path})
    b = read_bundle(path)
    if as_json:
        _emit_json(b.manifest)
        return
    m = b.manifest
    output.echo(f"{path}: format {m['format_version']}, created {m.get('created')}, {len(b.artifacts)} kernels")
    output.echo("producer: " + ", ".join(f"{k} {v}" for k, v in m.get("producer", {}).items()))
    for a in b.artifacts:
        output.echo(f"  {a.variant.name}  {_human_bytes(a.size)}  sha256 {a.sha256[:12]}  "
                    f"{len(a.abi.params)} params  block {a.launch.block}  smem {a.launch.dynamic_smem}")


@bundle.command("diff")
@click.argument("a", type=BUNDLE)
@click.argument("b", type=BUNDLE)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def bundle_diff(a, b, as_json):
    """Compare bundles A and B by variant name: cubin sha256 and size, ABI and launch facts, and the variants
    only one holds. Exit 0 when they launch the same kernels, 1 otherwise (cache keys are reported, but
    differ whenever sources or versions changed, so they are not a difference)."""
    from ..storage.bundle_diff import diff_bundles

    found: dict = {}
    output.json_document(as_json, lambda: found)
    d = diff_bundles(a, b)
    found.update(d.to_json())
    if as_json:
        if d.same:
            _emit_json(found)
    else:
        output.echo(d.render())
    if not d.same:
        raise CheckFailedError(f"{a} and {b} do not launch the same kernels")


@bundle.command("merge")
@click.argument("out", type=click.Path(dir_okay=False))
@click.argument("inputs", nargs=-1, required=True, type=BUNDLE)
@click.option("--spec", "spec", type=click.Path(dir_okay=False),
              help="refuse (exit 1, nothing written) unless every variant of this spec is in the inputs")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def bundle_merge(out, inputs, spec, as_json):
    """Join bundles (e.g. the shards of `aotc build --shard I/N`) into OUT.

    The same variant in two inputs must have the same sha256 (same aotc and DSL
    versions); OUT is written atomically."""
    from ..storage.bundle import merge_bundles

    output.json_document(as_json, lambda: {"out": None, "inputs": list(inputs), "spec": spec})
    expect = _spec_arg(spec, need_variants=True).variants if spec else None
    _check_output_file(out, "OUT")
    merged = _write(out, "OUT", lambda: merge_bundles(inputs, out, expect=expect))
    n = len(merged.manifest["artifacts"])
    if as_json:
        _emit_json({"out": out, "spec": spec, "kernels": n, "inputs": merged.inputs_json()})
    else:
        output.echo(f"wrote {out} ({n} kernels from {len(inputs)} bundles)")


@bundle.command("wheel")
@click.argument("path", type=BUNDLE)
@click.option("--name", required=True, help="distribution name, e.g. acme-attention-kernels")
@click.option("--version", "version", required=True, help="PEP 440 version in its normalized form, e.g. 1.0.0")
@click.option("--out", "out_dir", default="dist", show_default=True, type=click.Path(file_okay=False),
              help="directory the wheel is written to")
@click.option("--package", default=None,
              help="import name of the package holding the bundle (default: from --name); never a module "
                   "that is already importable")
@click.option("--requires", "requires", multiple=True, metavar="REQ",
              help="a Requires-Dist requirement (PEP 508), e.g. 'aotc>=0.1' (repeatable; none by default)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def bundle_wheel(path, name, version, out_dir, package, requires, as_json):
    """Make a pip-installable wheel carrying the bundle at PATH.

    The wheel (NAME-VERSION-py3-none-any.whl) holds a package with the bundle
    as package data and an `aotc.bundles` entry point, so aotc.load() with no
    argument finds it once installed."""
    from ..build.builder import writable_dir_problem
    from ..build.wheel import build_wheel

    output.json_document(as_json, lambda: {"wheel": None, "bundle": path})
    problem = writable_dir_problem(out_dir)
    if problem:
        raise UsageError(f"--out {out_dir!r}: cannot write there: {problem}")
    info = _write(out_dir, "--out", lambda: build_wheel(path, name=name, version=version, out_dir=out_dir,
                                                        package=package, requires=requires))
    if as_json:
        _emit_json(info)
        return
    output.echo(f"wrote {info['wheel']} ({info['kernels']} kernels; package {info['package']}, "
                f"entry point aotc.bundles:{info['entry_point']})")


@bundle.command("install")
@click.argument("paths", nargs=-1, required=True, type=BUNDLE)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def bundle_install(paths, as_json):
    """Copy each bundle's verified kernels into the cache (kernels already there are left as they are)."""
    from ..build.install import install_bundle
    from ..storage.cache import Cache

    cache = Cache()
    rows = []
    output.json_document(as_json, lambda: {"cache": str(cache.root), "bundles": rows})
    for p in paths:
        rows.append({"path": p, **install_bundle(p, cache)})
    new = sum(r["new"] for r in rows)
    if as_json:
        _emit_json({"cache": str(cache.root), "bundles": rows, "installed": new})
    else:
        output.echo(f"installed {new} new kernels into {cache.root}")
