"""`aotc cache ...`: info, ls, verify, gc, clear."""
from __future__ import annotations

import contextlib

import click

from ..common.errors import CacheError, CheckFailedError
from . import _emit_json, _human_bytes, cli, output


@contextlib.contextmanager
def _writing(c, what: str):
    """A cache (or lock directory) this process cannot change is a CacheError naming it, never a traceback."""
    try:
        yield
    except OSError as e:
        where = f" ({e.filename})" if e.filename else ""
        raise CacheError(f"cannot {what} the cache at {c.root}: {e.strerror or e}{where}",
                         hint="fix the permissions of AOTC_CACHE_DIR and AOTC_LOCK_DIR, or point them at writable "
                              "directories") from None


# ---- cache ----------------------------------------------------------------
@cli.group()
def cache():
    """Inspect and maintain the artifact cache (AOTC_CACHE_DIR)."""


@cache.command("info")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def cache_info(as_json):
    """Where the cache is, its size, entry count and counters."""
    from ..storage.cache import Cache

    output.json_document(as_json)
    c = Cache()
    info = {"root": str(c.root), "lock_dir": str(c.lock_dir), "entries": len(c.keys()), "bytes": c.size_bytes(),
            "counters": c.stats()}
    if as_json:
        _emit_json(info)
        return
    output.echo(f"root:     {info['root']}\nlocks:    {info['lock_dir']}\nentries:  {info['entries']}\n"
                f"size:     {_human_bytes(info['bytes'])}")
    output.echo("counters: " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                         for k, v in info["counters"].items()))


@cache.command("ls")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def cache_ls(as_json):
    """One line per entry: key, state and variant; entries made by other aotc/DSL versions are marked
    stale with the versions that made them (this aotc never looks them up; `aotc cache gc` ages them out)."""
    from ..storage.cache import Cache
    from ..common.versions import producer_versions

    rows = []
    output.json_document(as_json, lambda: {"entries": rows})
    c = Cache()
    here = producer_versions()
    for key in c.keys():
        status, art = c.check(key)
        row = {"key": key, "state": status.state, "reason": status.reason, "variant": None, "made_by": None}
        if art is not None:
            row["variant"] = art.variant.name
            if status.state == "stale":  # valid, but not this aotc's key for its variant
                made = art.info.get("versions") if isinstance(art.info.get("versions"), dict) else {}
                row["made_by"] = {k: v for k, v in made.items() if here.get(k) != v}
        rows.append(row)
        if as_json:
            continue
        if art is None:
            output.echo(f"{key[:16]}  {row['state']:<8} {row['reason']}")
        elif row["made_by"] is not None:
            made = ", ".join(f"{k} {v}" for k, v in sorted(row["made_by"].items())) or "other kernel sources"
            output.echo(f"{key[:16]}  stale    {row['variant']}  (made by {made}; rebuild with `aotc build`)")
        else:
            output.echo(f"{key[:16]}  {row['state']:<8} {row['variant']}")
    if as_json:
        _emit_json({"root": str(c.root), "entries": rows})


@cache.command("verify")
@click.option("--no-repair", is_flag=True, help="report only; leave bad entries in place")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def cache_verify(no_repair, as_json):
    """Check every entry (its files, sha256, and its cubin against meta.json and the arch's limits); bad
    entries are quarantined (rebuilt on next use). Stale entries (other aotc/DSL versions) are not bad.

    Exits 1 when bad entries were found, 4 when some could not be quarantined (the cache or its lock
    directory is not writable here): only entries actually moved are reported quarantined."""
    from ..storage.cache import Cache

    c = Cache()
    found: dict = {"root": str(c.root), "checked": 0, "bad": []}
    output.json_document(as_json, lambda: found)
    found["checked"] = len(c.keys())
    problems = c.verify(repair=not no_repair)
    for p in problems:
        quarantined = not no_repair and not p.path.exists()
        found["bad"].append({"key": p.key, "state": p.state, "reason": p.reason, "quarantined": quarantined})
    shown, more = output.listed(found["bad"])
    if not as_json:
        for b in shown:
            left = "" if no_repair else ("  (quarantined)" if b["quarantined"] else "  (left in place: cannot move it)")
            click.echo(f"{b['key'][:16]}  {b['state']}: {b['reason']}{left}", err=True)
        if more:
            click.echo(f"... and {more} more bad entries", err=True)
        output.echo(f"{found['checked']} entries checked, {len(problems)} bad")
    stuck = [b for b in found["bad"] if not no_repair and not b["quarantined"]]
    if stuck:
        raise CacheError(f"{len(stuck)} bad entries could not be quarantined: {c.root} or its lock directory "
                         f"{c.lock_dir} is not writable here",
                         hint="run `aotc cache verify` as the cache's owner; loads skip bad entries meanwhile")
    if problems:
        raise CheckFailedError(f"{len(problems)} of {found['checked']} cache entries are bad" +
                               ("" if no_repair else " (quarantined; rebuilt on next use)"))
    if as_json:
        _emit_json(found)


@cache.command("gc")
@click.option("--max-bytes", required=True, type=click.IntRange(0), help="evict least-recently-used entries past this size")
def cache_gc(max_bytes):
    """Evict least-recently-used entries until the cache fits in --max-bytes."""
    from ..storage.cache import Cache

    c = Cache()
    with _writing(c, "evict entries from"):
        evicted = c.gc(max_bytes)
    output.echo(f"evicted {len(evicted)} entries")


@cache.command("clear")
@click.confirmation_option(prompt="Remove every cache entry?")
def cache_clear():
    """Remove every entry."""
    from ..storage.cache import Cache

    c = Cache()
    with _writing(c, "clear"):
        n = c.clear()
    output.echo(f"removed {n} entries")
