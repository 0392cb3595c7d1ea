"""Every failure the runtime's driver layer can raise is an aotc.DriverError with a hint: no libcuda
(what CI is), cuda-bindings of a CUDA major the driver does not run, cuda-bindings missing, a failed call."""
from __future__ import annotations

import ctypes
import subprocess

import pytest

import aotc
import aotc.runtime as rt
from aotc.runtime import driver
from aotc.storage.bundle import write_bundle
from conftest import PYTHON, REPO, aotc_env


def _libcuda_loads() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


needs_no_driver = pytest.mark.skipif(_libcuda_loads(), reason="this machine has a CUDA driver")


def _dense(shape, dtype="bf16"):
    strides, step = [], 1
    for n in reversed(shape):
        strides.insert(0, step)
        step *= n
    return rt.tensor(1 << 20, shape, strides, dtype)


# ---- the real thing: this machine has no libcuda ---------------------------------------------------------
@needs_no_driver
def test_init_without_libcuda_is_a_driver_error_with_a_hint(monkeypatch):
    monkeypatch.setattr(driver, "_initialized", False)
    with pytest.raises(aotc.DriverError) as e:
        driver.init()
    assert "libcuda" in str(e.value) and "cannot be loaded" in str(e.value)
    assert e.value.hint == driver.NO_DRIVER_HINT and "aotc doctor" in e.value.hint
    assert isinstance(e.value.__cause__, RuntimeError)  # cuda.pathfinder's DynamicLibNotFoundError, kept as cause


@needs_no_driver
def test_public_calls_without_libcuda_raise_driver_errors(tmp_path, fake_artifact):
    path = tmp_path / "k.aotc"
    write_bundle(path, [fake_artifact("a")])
    runtime = aotc.runtime.load(path)  # loading needs no driver
    q = _dense((1, 128, 4, 128))
    calls = {
        "prefill": lambda: runtime.prefill(q, _dense((1, 128, 4, 128)), _dense((1, 128, 4, 128)),
                                           _dense((1, 128, 4, 128)), causal=True),
        "decode": lambda: runtime.decode(_dense((1, 1, 4, 128)), _dense((8, 16, 4, 128)), _dense((8, 16, 4, 128)),
                                         _dense((1, 1, 4, 128)), _dense((1,), "int32"), _dense((1, 8), "int32"),
                                         max_seqlen_kv=128),
        "combine": lambda: runtime.combine(_dense((2, 1, 1, 4, 128), "fp32"), _dense((2, 1, 4, 1), "fp32"),
                                           _dense((1, 1, 4, 128))),
        "device": runtime.device,
    }
    for name, call in calls.items():
        with pytest.raises(aotc.DriverError) as e:
            call()
        assert "libcuda" in str(e.value) and e.value.hint == driver.NO_DRIVER_HINT, name


# ---- the same rules against a stand-in driver (on any machine) ---------------------------------------------
class LibraryMissing(RuntimeError):
    """What cuda.pathfinder raises when libcuda is not on the system."""


class StandInDriver:
    """The few cuda.bindings.driver calls init() makes, answering as a given machine would."""

    NAMES = {0: "CUDA_SUCCESS", 100: "CUDA_ERROR_NO_DEVICE", 999: "CUDA_ERROR_UNKNOWN"}
    CUresult = int

    def __init__(self, version: int = 13000, init_code: int = 0, library: bool = True):
        self.version, self.init_code, self.library = version, init_code, library
        self.init_calls = 0

    def cuDriverGetVersion(self):
        if not self.library:
            raise LibraryMissing('"cuda" is an NVIDIA driver library and can only be found via system search')
        return 0, self.version

    def cuInit(self, flags):
        self.init_calls += 1
        return (self.init_code,)

    def cuGetErrorName(self, code):
        return 0, self.NAMES[code].encode()


@pytest.fixture
def stand_in(monkeypatch):
    def install(bindings: str = "13.4.4", release: str | None = None, **machine) -> StandInDriver:
        cu = StandInDriver(**machine)
        monkeypatch.setattr(driver, "cu", cu)
        monkeypatch.setattr(driver, "_initialized", False)
        monkeypatch.setattr(driver, "bindings_version", lambda: bindings)
        monkeypatch.setattr(driver, "driver_release", lambda: release)
        return cu

    return install


def test_no_library_is_a_driver_error_with_the_cause(stand_in):
    stand_in(library=False)
    with pytest.raises(aotc.DriverError) as e:
        driver.init()
    assert "LibraryMissing" in str(e.value) and e.value.hint == driver.NO_DRIVER_HINT
    assert isinstance(e.value.__cause__, LibraryMissing)


def test_bindings_newer_than_the_driver_are_refused_before_cuinit(stand_in):
    cu = stand_in(bindings="13.4.4", release="535.104.05", version=12020)
    with pytest.raises(aotc.DriverError) as e:
        driver.init()
    assert str(e.value) == "cuda-bindings 13.4.4 needs a driver >= 580; this driver is 535.104.05 (CUDA 12.2)"
    assert e.value.hint.startswith("pip install 'aotc[cu12]'")
    assert cu.init_calls == 0 and driver._initialized is False


@pytest.mark.parametrize("bindings, version", [("13.4.4", 13000), ("13.0.1", 13020), ("12.9.1", 13000),
                                               ("12.8.0", 12020)])
def test_bindings_the_driver_runs_initialize(stand_in, bindings, version):
    cu = stand_in(bindings=bindings, version=version)
    driver.init()
    driver.init()
    assert cu.init_calls == 1 and driver._initialized is True


def test_the_rule_names_the_fix_for_every_driver():
    e = driver.bindings_mismatch(12090, "13.4.4")
    assert str(e) == "cuda-bindings 13.4.4 needs a driver >= 580; this driver is one for CUDA 12.9"
    assert e.hint == "pip install 'aotc[cu12]' (cuda-bindings 12.x), or update the driver"
    e = driver.bindings_mismatch(11080, "12.9.1")  # older than any bindings aotc accepts
    assert "needs a driver >= 525" in str(e) and e.hint == "update the driver: >= 525 runs aotc[cu12], >= 580 aotc[cu13]"
    assert "for CUDA 14.0 or newer" in str(driver.bindings_mismatch(13000, "14.0.0"))
    assert driver.bindings_mismatch(13000, "") is None  # unknown bindings: nothing to say


def test_a_failed_driver_call_carries_a_hint(stand_in):
    stand_in(init_code=100)
    with pytest.raises(aotc.DriverError) as e:
        driver.init()
    assert str(e.value) == "cuInit failed: CUDA_ERROR_NO_DEVICE" and "CUDA_VISIBLE_DEVICES" in e.value.hint
    stand_in(init_code=999)
    with pytest.raises(aotc.DriverError) as e:
        driver.init()
    assert e.value.hint == driver.DEFAULT_HINT


@pytest.mark.parametrize("text, release", [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n", "535.104.05"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.03  Release Build  (dvs-builder@U16)\n",
     "580.159.03"),
    ("something else\n", None),
])
def test_driver_release_from_proc(tmp_path, text, release):
    (tmp_path / "version").write_text(text)
    assert driver.driver_release(str(tmp_path / "version")) == release
    assert driver.driver_release(str(tmp_path / "absent")) is None


def test_missing_bindings_are_named_when_the_driver_is_needed(tmp_path):
    """An install without cuda-bindings: the runtime still imports and loads; the first driver call says why not."""
    code = (
        "import sys\n"
        "sys.modules['cuda.bindings'] = None  # as if cuda-bindings were not installed\n"
        "import aotc, aotc.runtime\n"
        "from aotc.runtime import driver\n"
        "try:\n"
        "    driver.init()\n"
        "except aotc.DriverError as e:\n"
        "    print(e); print(e.hint)\n"
    )
    r = subprocess.run([PYTHON, "-c", code], env=aotc_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    message, hint = r.stdout.splitlines()
    assert message.startswith("cuda-bindings cannot be imported (ModuleNotFoundError: ")
    assert hint == "pip install 'aotc[cu13]' (drivers >= 580) or 'aotc[cu12]' (drivers >= 525)"
