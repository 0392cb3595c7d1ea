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

from .. import __version__
from ..common.errors import AotcError


def _spec_arg(spec: str | None):
    from ..build.spec import load_spec

    return load_spec(spec)


SHARD_STRATEGIES = ("balanced", "hash")  # aotc.shard.STRATEGIES (kept here so --help needs no import)


def _parse_shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    from ..build.shard import parse_shard

    return parse_shard(text)


def _shard_variants(variants, where: tuple[int, int] | None, strategy: str) -> list:
    if where is None:
        return list(variants)
    from ..build.shard import select

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


# ---- doctor ---------------------------------------------------------------
@cli.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def doctor(as_json):
    """Versions, GPU and archs, cache and lock directories, and which found bundles load on this GPU.

    Exits 1 when a bundle it finds (AOTC_BUNDLE_PATH, installed wheels) cannot be read."""
    from ..doctor import collect, render

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


# the subcommands register themselves on `cli`
from . import build_cmds, bundle_cmds, cache_cmds  # noqa: E402,F401
