"""The aotc command line. Errors become messages and exit codes here, in one place.

Exit codes (aotc.common.errors.EXIT_CODES, one per kind of failure, the same from every command):
0 ok; 1 a check failed (some variants failed to build, bad cache entries, bundles differ, `aotc
doctor` found an unreadable bundle or a driver too old for the runtime, `bundle merge --spec` found
variants missing); 2 bad usage (an unknown option or value, a missing input file, a bad spec or
--shard, a spec that prunes to nothing, an unusable output path, an unknown executor or an
unreachable Dask scheduler); 3 compile error (a compile process that dies fails its variant: the
build exits 1); 4 cache error (including an unwritable cache or lock directory); 5 variants missing
while compiling is forbidden; 6 lock timeout; 7 bad bundle; 8 bundle of another format version or
other aotc/DSL versions; 9 bad runtime argument; 10 an artifact the
runtime refuses to load; 11 CUDA driver error; 12 I/O error (standard output or a file could not be
written or read); 130 interrupted (Ctrl-C); 143 terminated (SIGTERM).

With --json, the command's JSON document (aotc.cli.output) is printed on every exit, failures
included, with an "error" object.

Shell completion (click's): eval "$(_AOTC_COMPLETE=bash_source aotc)" in
~/.bashrc; zsh_source and fish_source for zsh and fish.
"""
from __future__ import annotations

import contextlib
import signal
import sys

import click

from .. import __version__
from ..common import signals
from ..common.errors import EXIT_CODES, AotcError, CheckFailedError, SpecError, UsageError
from . import output


def _spec_arg(spec: str | None, *, need_variants: bool = False):
    """The spec at `spec` (None: the embedded default). need_variants: a spec that prunes every combination
    is a SpecError naming why each was pruned (a build of nothing would succeed and write nothing)."""
    from ..build.spec import load_spec

    s = load_spec(spec)
    if need_variants and not s.variants:
        raise SpecError(f"spec {s.path}: no variants: every one of its {len(s.pruned)} combinations was pruned"
                        + "".join(f"\n  {line}" for line in _pruned_lines(s.pruned)),
                        hint=f"fix the spec's lists and excludes; `aotc list {spec or ''} --why-not` explains each "
                             "pruned combination".replace("  ", " "))
    return s


def _pruned_lines(pruned, examples: int = 3) -> list[str]:
    """One line per reason: how many combinations it pruned and a few of them."""
    by_reason: dict[str, list] = {}
    for p in pruned:
        by_reason.setdefault(f"{p.family}: {p.reason}", []).append(p.values)
    lines = []
    for reason, combos in by_reason.items():
        shown = "; ".join(" ".join(f"{k}={v}" for k, v in c.items()) for c in combos[:examples])
        more = f"; and {len(combos) - examples} more" if len(combos) > examples else ""
        lines.append(f"{reason} ({len(combos)}: {shown}{more})")
    return lines


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


def _emit_json(obj: dict) -> None:
    output.emit(obj)


def _check_output_file(path: str, option: str) -> None:
    """Refuse an output path nothing can be written to, before any work: a UsageError naming the option."""
    from pathlib import Path

    from ..build.builder import writable_dir_problem

    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{option} {path!r}: is a directory, expected a file path")
    problem = writable_dir_problem(p.parent if str(p.parent) else Path("."))
    if problem:
        raise UsageError(f"{option} {path!r}: cannot write there: {problem}")


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


EPILOG = "\b\nExit codes:\n" + "\n".join(f"  {code:>3}  {what}" for code, what in EXIT_CODES.items()) + """
\b
With --json, every command prints one JSON document, failures included ("error": kind, message, hint, exit_code).
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
@click.option("--arch", default=None, metavar="ARCH",
              help="report capabilities for a device of this arch (e.g. sm_90a) instead of this machine's GPUs")
def doctor(as_json, arch):
    """Versions, GPU and archs, cache and lock directories, which found bundles load on this GPU, and what
    each entry point (prefill, decode, ...) serves on it (Runtime.capabilities).

    Exits 1 when a bundle it finds (AOTC_BUNDLE_PATH, installed wheels) cannot be read, or the driver is
    too old for the runtime (a machine without any driver is not a failure: it builds, it does not launch)."""
    from ..doctor import collect, render

    if arch is not None:
        from ..common.errors import ArgumentError
        from ..runtime.capabilities import parse_arch

        try:
            parse_arch(arch)
        except ArgumentError as e:
            raise UsageError(f"--arch {arch!r}: expected {e.expected}") from None
    info = collect(arch)
    bad = [b for b in info["bundles"] if b.get("error")]
    problem = info["gpu"].get("driver_problem")
    output.json_document(as_json, lambda: info)
    if as_json:
        if not bad and not problem:
            _emit_json(info)
    else:
        output.echo(render(info))
    if bad:
        raise CheckFailedError(f"{len(bad)} of the bundles found cannot be read: " +
                               "; ".join(f"{b['path']} [{b['origin']}]" for b in bad[:5]))
    if problem:
        raise CheckFailedError(problem)


class Terminated(BaseException):
    """SIGTERM: unwind like Ctrl-C (compile processes stopped, temporary files removed), then exit 143.
    A BaseException, so no `except Exception` on the way takes it for a variant's failure."""


def _fail(kind: str, message: str, hint: str | None, exit_code: int, *, show: bool = True, command: str = "") -> int:
    """Report a failure on stderr (and as the JSON document's error when --json) and return its exit code."""
    if show:
        with contextlib.suppress(OSError, ValueError):
            click.echo(f"error: {message}", err=True)
            if hint:
                click.echo(f"hint: {hint}", err=True)
    if output.wants_json():
        output.emit_error(kind, message, hint, exit_code, command)
    return exit_code


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, turning every way it can end into a message, a JSON error and an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    output.reset()
    # SIGTERM (a supervisor stopping `aotc build`) raises Terminated in the main thread, once: the cleanup finishes
    with signals.raise_on_signal(signal.SIGTERM, Terminated, once=True):
        try:
            cli.main(args=args, prog_name="aotc", standalone_mode=False)
            output.flush_stdout()
        except AotcError as e:
            return _fail(e.kind, str(e), e.hint, e.exit_code, show=not getattr(e, "quiet", False))
        except click.exceptions.Abort as e:
            if isinstance(e.__context__, KeyboardInterrupt):
                return _fail("interrupted", "interrupted (Ctrl-C)", None, 130)
            return _fail("aborted", "aborted", None, 1)
        except KeyboardInterrupt:
            return _fail("interrupted", "interrupted (Ctrl-C)", None, 130)
        except Terminated:
            return _fail("terminated", "terminated (SIGTERM)", None, 143)
        except click.ClickException as e:
            with contextlib.suppress(OSError, ValueError):
                e.show()
            code = 2 if isinstance(e, click.UsageError) else e.exit_code
            output.note_usage_error(getattr(e, "ctx", None), args)
            return _fail("usage", e.format_message(), None, code, show=False)
        except SystemExit as e:
            return int(e.code or 0) if not isinstance(e.code, str) else 1
        except OSError as e:  # an I/O failure no command turned into a typed error
            where = f" ({e.filename})" if e.filename else ""
            return _fail("io", f"{e.strerror or e}{where}", None, 12)
    return 0


# the subcommands register themselves on `cli`
from . import build_cmds, bundle_cmds, cache_cmds  # noqa: E402,F401
