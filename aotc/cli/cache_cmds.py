"""`aotc cache ...`: info, ls, verify, gc, clear."""
from __future__ import annotations

import sys

import click

from . import _emit_json, _human_bytes, cli

# ---- cache ----------------------------------------------------------------
@cli.group()
def cache():
    """Inspect and maintain the artifact cache (AOTC_CACHE_DIR)."""


@cache.command("info")
@click.option("--json", "as_json", is_flag=True)
def cache_info(as_json):
    """Where the cache is, its size, entry count and counters."""
    from ..storage.cache import Cache

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
    from ..storage.cache import Cache
    from ..common.versions import producer_versions

    c = Cache()
    here = producer_versions()
    for key in c.keys():
        status, art = c.check(key)
        if art is None:
            click.echo(f"{key[:16]}  {status.state:<8} {status.reason}")
            continue
        extra = ""
        if status.state == "stale":
            made = art.info.get("versions", {}) if isinstance(art.info.get("versions"), dict) else {}
            diff = {k: v for k, v in made.items() if here.get(k) != v}
            extra = "  (made by " + (", ".join(f"{k} {v}" for k, v in sorted(diff.items())) or "other kernel sources") \
                + "; rebuild with `aotc build`)"
        click.echo(f"{key[:16]}  {status.state:<8} {art.variant.name}{extra}")


@cache.command("verify")
@click.option("--no-repair", is_flag=True, help="report only; leave bad entries in place")
def cache_verify(no_repair):
    """Check every entry (its files, sha256, and its cubin against meta.json and the arch's limits); bad
    entries are quarantined (rebuilt on next use). Stale entries (other aotc/DSL versions) are not bad."""
    from ..storage.cache import Cache

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
    from ..storage.cache import Cache

    evicted = Cache().gc(max_bytes)
    click.echo(f"evicted {len(evicted)} entries")


@cache.command("clear")
@click.confirmation_option(prompt="Remove every cache entry?")
def cache_clear():
    """Remove every entry."""
    from ..storage.cache import Cache

    click.echo(f"removed {Cache().clear()} entries")


