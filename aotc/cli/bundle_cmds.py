"""`aotc bundle ...`: create, verify, inspect, diff, merge, wheel, install."""
from __future__ import annotations

import sys

import click

from . import _emit_json, _human_bytes, _spec_arg, cli

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
    from ..build.builder import build as run_build
    from ..storage.bundle import write_bundle

    s = _spec_arg(spec)
    report = run_build(s.variants, offline=True, build_command=f"aotc build {spec or ''}".strip())
    manifest = write_bundle(out, report.artifacts)
    click.echo(f"wrote {out} ({len(manifest['artifacts'])} kernels)")


@bundle.command("verify")
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False))
def bundle_verify(paths):
    """Check every member of each bundle against its manifest (sizes, sha256, arch)."""
    from ..storage.bundle import verify_bundle

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
    from ..storage.bundle import read_bundle

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


@bundle.command("diff")
@click.argument("a", type=click.Path(dir_okay=False))
@click.argument("b", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def bundle_diff(a, b, as_json):
    """Compare bundles A and B by variant name: cubin sha256 and size, ABI and launch facts, and the variants
    only one holds. Exit 0 when they launch the same kernels, 1 otherwise (cache keys are reported, but
    differ whenever sources or versions changed, so they are not a difference)."""
    from ..storage.bundle_diff import diff_bundles

    d = diff_bundles(a, b)
    if as_json:
        _emit_json(d.to_json())
    else:
        click.echo(d.render())
    if not d.same:
        sys.exit(1)


@bundle.command("merge")
@click.argument("out", type=click.Path(dir_okay=False))
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--spec", "spec", type=click.Path(dir_okay=False),
              help="refuse (exit 1, nothing written) unless every variant of this spec is in the inputs")
def bundle_merge(out, inputs, spec):
    """Join bundles (e.g. the shards of `aotc build --shard I/N`) into OUT.

    The same variant in two inputs must have the same sha256 (same aotc and DSL
    versions); OUT is written atomically."""
    from ..storage.bundle import merge_bundles

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
    from ..build.wheel import build_wheel

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
    from ..build.install import install_bundle
    from ..storage.cache import Cache

    cache = Cache()
    n = sum(install_bundle(p, cache) for p in paths)
    click.echo(f"installed {n} new kernels into {cache.root}")


