"""Specs, environment variables and bundle paths that used to hang or crash (issue 25 items 6 and 8):
each is a clear error naming what is wrong, or works."""
from __future__ import annotations

import os

import pytest

from aotc.build.spec import load_spec
from aotc.common.errors import BundleError, SpecError
from conftest import run_aotc

COMBINE = '[[family]]\nname = "sdpa_combine"\narch = ["sm_90a"]\n'


def test_a_spec_with_duplicated_values_is_refused_without_enumerating(tmp_path):
    """100 copies of each value of five fields would be 10^10 combinations."""
    def many(*values):
        return "[" + ", ".join(list(values) * 100) + "]"

    spec = tmp_path / "dup.toml"
    spec.write_text(f'[[family]]\nname = "sdpa_prefill"\narch = {many(chr(34) + "sm_90" + chr(34))}\n'
                    f'dtype = {many(chr(34) + "bf16" + chr(34))}\nhead_dim = {many("64")}\n'
                    f'layout = {many(chr(34) + "dense" + chr(34))}\ncausal = {many("false")}\n')
    r = run_aotc("list", str(spec), timeout=60)
    assert r.returncode == 2 and "listed more than once" in r.stderr and "'sm_90'" in r.stderr, r.stderr
    with pytest.raises(SpecError, match=r"head_dim: 128 is listed more than once"):
        load_spec(_write(tmp_path, COMBINE + "head_dim = [64, 128, 128]\n"))
    with pytest.raises(SpecError, match="exclude table is listed more than once"):
        load_spec(_write(tmp_path, COMBINE + 'exclude = [{dtype = "fp16"}, {dtype = "fp16"}]\n'))


def _write(tmp_path, text: str, name: str = "s.toml") -> os.PathLike:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_a_spec_with_a_byte_order_mark_reads(tmp_path):
    p = tmp_path / "bom.toml"
    p.write_bytes(b"\xef\xbb\xbf" + (COMBINE + 'head_dim = 128\nstrides = "packed"\n').encode())
    assert len(load_spec(p).variants) == 3
    r = run_aotc("list", str(p))
    assert r.returncode == 0 and "3 variants" in r.stdout, r.stderr


def test_a_spec_that_is_not_utf8_names_the_file_and_the_byte(tmp_path):
    p = tmp_path / "latin1.toml"
    p.write_bytes((COMBINE + "# caf").encode() + b"\xe9\n")
    r = run_aotc("list", str(p))
    assert r.returncode == 2 and "latin1.toml" in r.stderr and "not UTF-8" in r.stderr and "Traceback" not in r.stderr


def test_a_family_name_that_is_a_list_is_a_spec_error(tmp_path):
    p = _write(tmp_path, '[[family]]\nname = ["sdpa_combine"]\narch = ["sm_90a"]\n')
    r = run_aotc("list", str(p))
    assert r.returncode == 2 and "name = ['sdpa_combine']" in r.stderr and "Traceback" not in r.stderr


def test_a_fifo_spec_or_bundle_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = run_aotc("list", str(fifo), timeout=60)
    assert r.returncode == 2 and "not a regular file (a FIFO)" in r.stderr, r.stderr
    import aotc.runtime
    from aotc.storage.bundle import read_bundle

    with pytest.raises(BundleError, match="not a regular file"):
        read_bundle(fifo)
    with pytest.raises(BundleError, match="not a regular file"):
        aotc.runtime.load(fifo)


@pytest.mark.parametrize("value,ok", [("abc", False), ("10m", True), ("4G", True), ("256MiB", True), ("1.5G", False)])
def test_bundle_size_limits_take_units_and_name_the_variable_when_they_cannot(tmp_path, real_artifacts, value, ok):
    from aotc.storage.bundle import write_bundle

    b = tmp_path / "b.aotc"
    write_bundle(b, real_artifacts[:1])
    for name in ("AOTC_BUNDLE_MAX_BYTES", "AOTC_BUNDLE_MAX_MEMBER_BYTES"):
        r = run_aotc("bundle", "verify", str(b), **{name: value})
        if ok:
            assert r.returncode == 0, r.stderr
        else:
            assert r.returncode == 2 and f"{name}={value!r}" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_bundle_size_limit_with_a_unit_is_enforced(tmp_path, real_artifacts):
    from aotc.storage.bundle import write_bundle

    b = tmp_path / "b.aotc"
    write_bundle(b, real_artifacts[:1])
    r = run_aotc("bundle", "verify", str(b), AOTC_BUNDLE_MAX_BYTES="1k")
    assert r.returncode == 7 and "over the limit of 1024" in r.stderr, r.stderr  # 7: a bad bundle
