"""`aotc doctor` (on a machine without a GPU, and with a pretend one) and click's shell completion."""
from __future__ import annotations

import json
import subprocess
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import pytest

import aotc
from aotc import doctor
from aotc.storage.bundle import write_bundle
from aotc.cli import main
from conftest import PYTHON, REPO, aotc_env, run_aotc

H200 = {"driver": "13.0", "error": "", "devices": [
    {"ordinal": 0, "name": "NVIDIA H200", "compute_capability": "9.0", "sms": 132,
     "archs": ["sm_90a", "sm_90", "sm_80"]}]}  # (the real list: driver.runnable_archs((9, 0)))


@pytest.fixture
def bundles(tmp_path, fake_artifact):
    """A directory with a good bundle (2 sm_90a kernels, 1 sm_80) and a corrupt one."""
    pytest.importorskip("cutlass")  # real cubins (read_bundle checks each one's arch)
    d = tmp_path / "bundles"
    write_bundle(d / "good.aotc", [fake_artifact("a"), fake_artifact("b", base=1), fake_artifact("c", base=3)])
    data = bytearray((d / "good.aotc").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (d / "bad.aotc").write_bytes(bytes(data))
    return d


def test_doctor_json_without_a_gpu(cache_dir, monkeypatch, capsys):
    monkeypatch.setattr(doctor, "gpu", lambda: {"driver": None, "devices": [], "error": "CUDA_ERROR_NO_DEVICE"})
    assert main(["doctor", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    v = info["versions"]
    assert v["aotc"] == aotc.__version__ and v["python"].count(".") == 2
    assert "cuda-bindings" in v or "cuda-python" in v
    assert info["gpu"] == {"driver": None, "devices": [], "error": "CUDA_ERROR_NO_DEVICE"}
    c = info["cache"]
    assert c["root"] == str(cache_dir / "v1") and c["lock_dir"] == str(cache_dir / "v1" / "locks")
    assert c["entries"] == 0 and c["counters"]["compiles"] == 0 and c["no_compile"] is False
    assert info["bundles"] == [] and info["bundle_path"] == []
    assert info["env"] == {"AOTC_CACHE_DIR": str(cache_dir)}
    assert info["capabilities"] == []  # no device, and no --arch to stand for one
    assert main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert "gpu: no GPU (CUDA_ERROR_NO_DEVICE)" in text
    assert f"cache: {cache_dir / 'v1'}" in text and "bundles: none found" in text
    assert "capabilities: no usable GPU; `aotc doctor --arch sm_90a` gives them" in text


def test_doctor_capabilities_for_an_arch_without_a_gpu(cache_dir, monkeypatch, capsys):
    monkeypatch.setattr(doctor, "gpu", lambda: {"driver": None, "devices": [], "error": "no libcuda"})
    assert main(["doctor", "--json", "--arch", "sm_90a"]) == 0
    (caps,) = json.loads(capsys.readouterr().out)["capabilities"]
    assert caps["arch"] == "sm_90a" and caps["device"] is None and caps["kernels"] == 0  # nothing found
    assert set(caps["entry_points"]) == {"prefill", "prefill_ragged", "attention", "decode", "kv_write", "combine"}
    assert not any(e["supported"] for e in caps["entry_points"].values())
    assert main(["doctor", "--arch", "sm_90a"]) == 0
    text = capsys.readouterr().out
    assert "capabilities on arch sm_90a (no device) of the bundles found (0 kernels run there):" in text
    assert "\n  decode          none" in text
    assert main(["doctor", "--arch", "hopper"]) == 2
    assert "--arch 'hopper': expected an arch name such as 'sm_90a'" in capsys.readouterr().err


def test_doctor_on_this_machine_never_fails_for_want_of_a_gpu(cache_dir):
    """The real probe: no driver here (or a GPU on the device machine); either way a report and exit 0."""
    r = run_aotc("doctor", "--json")
    assert r.returncode == 0, r.stderr
    g = json.loads(r.stdout)["gpu"]
    assert g["devices"] or g["error"]
    for d in g["devices"]:
        assert d["archs"][0] == f"sm_{d['compute_capability'].replace('.', '')}a"
    r = run_aotc("doctor")
    assert r.returncode == 0 and ("no GPU" in r.stdout) == (not g["devices"])


def pretend_h200(monkeypatch):
    """doctor.gpu() and the driver calls capabilities() makes, as on an H200."""
    from aotc.runtime import driver

    monkeypatch.setattr(doctor, "gpu", lambda: H200)
    monkeypatch.setattr(driver, "device_handle", lambda ordinal: ordinal)
    monkeypatch.setattr(driver, "compute_capability", lambda dev: (9, 0))
    monkeypatch.setattr(driver, "device_name", lambda dev: "NVIDIA H200")
    monkeypatch.setattr(driver, "multiprocessor_count", lambda dev: 132)


def test_doctor_reports_bundles_and_what_this_gpu_runs(bundles, monkeypatch, tmp_path, capsys):
    pretend_h200(monkeypatch)
    monkeypatch.setenv("AOTC_BUNDLE_PATH", str(bundles / "good.aotc"))
    monkeypatch.setenv("AOTC_LOCK_DIR", str(tmp_path / "locks"))
    assert main(["doctor", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    (b,) = info["bundles"]
    assert b["path"] == str(bundles / "good.aotc") and b["origin"] == "AOTC_BUNDLE_PATH" and b["error"] == ""
    assert b["kernels"] == 3 and b["archs"] == ["sm_80", "sm_90a"] and b["families"] == ["sdpa_combine"]
    assert b["runnable"] == {"0": 3}
    assert info["cache"]["lock_dir"] == str(tmp_path / "locks")
    # the found bundles' capabilities, on device 0 as the driver reports it (the runtime's arch rule: the
    # sm_80 kernel does not run on a 9.0 device)
    (caps,) = info["capabilities"]
    assert caps["device"] == {"ordinal": 0, "name": "NVIDIA H200", "compute_capability": "9.0", "sms": 132}
    assert caps["sources"] == [str(bundles / "good.aotc")] and caps["other_archs"] == ["sm_80"]
    combine = caps["entry_points"]["combine"]
    assert combine["kernels"] == 2 and combine["served_by"][0]["arch"] == "sm_90a"
    assert combine["gaps"] == [{"dtype": "bf16", "head_dim": 64}, {"dtype": "fp16", "head_dim": 128}]
    assert main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert "[0] NVIDIA H200  compute capability 9.0, 132 SMs, runs sm_90a sm_90 sm_80" in text
    assert f"ok  {bundles / 'good.aotc'}  [AOTC_BUNDLE_PATH]: 3 kernels (sdpa_combine) for sm_80 sm_90a; " \
           f"3/3 run on device 0" in text
    assert "capabilities on device 0 (sm_90a) of the bundles found (2 kernels run there):" in text
    assert ("\n  combine         bf16 fp16, head dims 64 128, lse, strides general/packed, 2 combinations not served "
            "(--json lists them); by sdpa_combine (sm_90a) 2") in text  # of 4: the fakes are bf16 D128, fp16 D64
    assert "\n  prefill         none" in text
    # an sm_89 device runs only the sm_80 kernel
    monkeypatch.setattr(doctor, "gpu", lambda: {**H200, "devices": [{**H200["devices"][0], "archs": [
        "sm_89a", "sm_89", "sm_88", "sm_87", "sm_86", "sm_85", "sm_84", "sm_83", "sm_82", "sm_81", "sm_80"]}]})
    assert main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bundles"][0]["runnable"] == {"0": 1}


def test_doctor_exits_1_for_a_bad_bundle(bundles, monkeypatch, capsys):
    monkeypatch.setattr(doctor, "gpu", lambda: H200)
    monkeypatch.setenv("AOTC_BUNDLE_PATH", str(bundles))  # a directory: both files
    assert main(["doctor"]) == 1
    text = capsys.readouterr().out
    assert f"BAD {bundles / 'bad.aotc'}  [AOTC_BUNDLE_PATH]: BundleError: " in text
    assert f"ok  {bundles / 'good.aotc'}" in text


def test_doctor_imports_neither_the_dsl_nor_torch(cache_dir):
    code = ("import sys\nfrom aotc.cli import main\nrc = main(['doctor', '--json'])\n"
            "assert 'cutlass' not in sys.modules and 'torch' not in sys.modules, 'imported'\nsys.exit(rc)\n")
    r = subprocess.run([PYTHON, "-c", code], env=aotc_env(), capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr


# ---- the driver's version, and the build side ---------------------------------------------------------
@pytest.fixture
def pretend_driver(monkeypatch):
    """doctor.gpu() against a driver that runs CUDA `version` (cuInit then finds no device)."""
    from aotc.runtime import driver

    def no_device():
        raise aotc.DriverError("cuDeviceGetCount failed: CUDA_ERROR_NO_DEVICE")

    def install(version: int, release: str | None):
        monkeypatch.setattr(driver, "_initialized", False)
        monkeypatch.setattr(driver, "driver_version", lambda: version)
        monkeypatch.setattr(driver, "library_name", lambda: "libcuda.so.1")
        monkeypatch.setattr(driver, "driver_release", lambda: release)
        monkeypatch.setattr(driver, "device_count", no_device)

    return install


def test_doctor_says_when_the_driver_is_too_old(pretend_driver, cache_dir, capsys):
    pretend_driver(12020, "535.104.05")
    g = doctor.gpu()
    assert g["driver"] == "12.2" and g["driver_release"] == "535.104.05" and g["libcuda"] == "libcuda.so.1"
    assert g["driver_problem"] == ("aotc's runtime needs a driver for CUDA 12.4 or newer (release >= 550); this "
                                   "driver is 535.104.05 (CUDA 12.2): update the NVIDIA driver to release 550 or "
                                   "newer (CUDA 12.4)")
    assert g["devices"] == [] and g["error"] == "the driver is older than aotc's runtime needs"
    assert main(["doctor"]) == 1  # a GPU node the runtime cannot use fails the check
    text = capsys.readouterr().out
    assert "driver: CUDA 12.2, release 535.104.05; TOO OLD: aotc's runtime needs a driver for CUDA 12.4" in text


def test_doctor_names_the_driver_it_uses(pretend_driver, cache_dir, capsys):
    pretend_driver(13000, "580.159.03")
    g = doctor.gpu()
    assert g["driver"] == "13.0" and g["driver_problem"] == ""
    assert g["error"] == "DriverError: cuDeviceGetCount failed: CUDA_ERROR_NO_DEVICE"  # then the devices are probed
    assert main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert "driver: CUDA 13.0, release 580.159.03 (libcuda.so.1)" in text
    assert "gpu: no GPU (DriverError: cuDeviceGetCount failed: CUDA_ERROR_NO_DEVICE)" in text


def test_doctor_says_this_machine_cannot_build_without_the_compile_extra(monkeypatch, cache_dir, capsys):
    real = doctor._dist_version
    monkeypatch.setattr(doctor, "_dist_version", lambda name: None if name == "nvidia-cutlass-dsl" else real(name))
    monkeypatch.setattr(doctor, "gpu", lambda: {"driver": None, "devices": [], "error": "no libcuda"})
    b = doctor.build_side()
    assert b["can_build"] is False and b["problem"] == "nvidia-cutlass-dsl is not installed: pip install 'aotc[compile]'"
    assert main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert "build: cannot compile here (nvidia-cutlass-dsl is not installed: pip install 'aotc[compile]')" in text
    assert "building works" not in text


def test_doctor_build_side_finds_the_dsl_without_importing_it(monkeypatch):
    have_dsl = doctor._dist_version("nvidia-cutlass-dsl") is not None
    b = doctor.build_side()
    assert b["can_build"] is have_dsl and b["nvidia-cutlass-dsl"] == doctor._dist_version("nvidia-cutlass-dsl")
    if have_dsl:
        pin = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["compile"]
        assert f"nvidia-cutlass-dsl=={b['pinned']}" in pin and b["problem"] == ""  # read from aotc's metadata
    # metadata without a locatable package (a broken install) cannot build either
    monkeypatch.setattr(doctor, "_dist_version", lambda name: "4.8.1")
    monkeypatch.setattr(doctor.importlib.util, "find_spec", lambda name: None)
    b = doctor.build_side()
    assert b["can_build"] is False and "cutlass package cannot be found" in b["problem"]


# ---- shell completion (click's mechanism) ----------------------------------------------------------------
@pytest.mark.parametrize("shell, marker", [("bash", "complete -o nosort -F"), ("zsh", "#compdef aotc"),
                                           ("fish", "complete --no-files --command aotc")])
def test_completion_script(shell, marker):
    r = run_aotc(**{"_AOTC_COMPLETE": f"{shell}_source"})
    assert r.returncode == 0, r.stderr
    assert marker in r.stdout and "_AOTC_COMPLETE" in r.stdout


@pytest.mark.parametrize("words, cword, want", [
    ("aotc bu", 1, ["plain,build", "plain,bundle"]),
    ("aotc do", 1, ["plain,doctor"]),
    ("aotc bundle w", 2, ["plain,wheel"]),
    ("aotc build --sh", 2, ["plain,--shard", "plain,--shard-by"]),
    ("aotc build --executor ", 3, ["plain,process", "plain,dask"]),
])
def test_completion_completes(words, cword, want):
    r = run_aotc(_AOTC_COMPLETE="bash_complete", COMP_WORDS=words, COMP_CWORD=str(cword))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == want


def test_completion_of_spec_paths(tmp_path):
    (tmp_path / "mine.toml").write_text("")
    env = aotc_env(_AOTC_COMPLETE="bash_complete", COMP_WORDS="aotc build mi", COMP_CWORD="2")
    r = subprocess.run([PYTHON, "-m", "aotc"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["file,mi"]  # click hands file completion to the shell


def test_help_documents_exit_codes_and_completion(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "Exit codes:" in out and "1  a check failed: some variants failed" in out
    assert "8  bundle of another format version" in out
    assert 'eval "$(_AOTC_COMPLETE=bash_source aotc)"' in out
    for cmd in ("doctor", "build", "bundle"):
        assert cmd in out
    assert main(["bundle", "--help"]) == 0
    assert "wheel" in capsys.readouterr().out
