"""The runtime's driver layer (ctypes over libcuda): every failure is an aotc.DriverError with a hint (no
libcuda, which is what CI is; a driver older than CUDA 12.4; a missing entry point; a failed call), and
every call passes the C arguments cuda.h declares. The second half runs against a stand-in libcuda built
from tests/stub_driver/libcuda_stub.c, which records what each entry point was given."""
from __future__ import annotations

import ctypes
import gc
import os
import shutil
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
    assert isinstance(e.value.__cause__, OSError)  # ctypes' dlopen error, kept as the cause


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


# ---- against the stand-in libcuda -------------------------------------------------------------------------
@pytest.fixture(scope="session")
def stub_library(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in libcuda")
    out = tmp_path_factory.mktemp("stub") / "libcuda_stub.so"
    subprocess.run([cc, "-O1", "-Wall", "-Werror", "-shared", "-fPIC", "-o", str(out),
                    str(REPO / "tests" / "stub_driver" / "libcuda_stub.c")], check=True, capture_output=True)
    return out


@pytest.fixture
def stub(stub_library, monkeypatch):
    """The driver layer bound afresh to the stand-in libcuda; returns it (its recorded globals readable)."""
    monkeypatch.setenv("AOTC_LIBCUDA", str(stub_library))
    for name in ("STUB_CUDA_VERSION", "STUB_INIT_CODE", "STUB_DEVICES", "STUB_LAUNCH_CODE", "STUB_ALLOC_CODE"):
        monkeypatch.delenv(name, raising=False)
    lib = ctypes.CDLL(str(stub_library))
    ctypes.c_int.in_dll(lib, "stub_init_calls").value = 0

    def reset():
        monkeypatch.setattr(driver, "_lib", None)
        monkeypatch.setattr(driver, "_functions", {})
        monkeypatch.setattr(driver, "_initialized", False)
        monkeypatch.setattr(driver, "driver_release", lambda path=None: None)
        for cached in (driver._primary_context, driver.compute_capability, driver.multiprocessor_count):
            cached.cache_clear()

    reset()
    yield lib
    reset()


def _recorded(lib, name: str, n: int) -> list[int]:
    return list((ctypes.c_uint64 * n).in_dll(lib, name))


def test_a_driver_older_than_cuda_12_4_is_refused_before_cuinit(stub, monkeypatch):
    monkeypatch.setenv("STUB_CUDA_VERSION", "12020")
    monkeypatch.setattr(driver, "driver_release", lambda path=None: "535.104.05")
    with pytest.raises(aotc.DriverError) as e:
        driver.init()
    assert str(e.value) == ("aotc's runtime needs a driver for CUDA 12.4 or newer (release >= 550); this driver "
                            "is 535.104.05 (CUDA 12.2)")
    assert e.value.hint == driver.OLD_DRIVER_HINT
    assert ctypes.c_int.in_dll(stub, "stub_init_calls").value == 0 and driver._initialized is False


@pytest.mark.parametrize("version", [12040, 12090, 13000, 13020])
def test_drivers_the_runtime_runs_on_initialize_once(stub, monkeypatch, version):
    monkeypatch.setenv("STUB_CUDA_VERSION", str(version))
    driver.init()
    driver.init()
    assert ctypes.c_int.in_dll(stub, "stub_init_calls").value == 1 and driver._initialized is True
    assert driver.driver_version() == version


def test_a_failed_driver_call_names_the_call_and_carries_a_hint(stub, monkeypatch):
    monkeypatch.setenv("STUB_INIT_CODE", "100")
    with pytest.raises(aotc.DriverError) as e:
        driver.init()
    assert str(e.value) == "cuInit failed: CUDA_ERROR_NO_DEVICE" and "CUDA_VISIBLE_DEVICES" in e.value.hint
    monkeypatch.setenv("STUB_INIT_CODE", "999")
    with pytest.raises(aotc.DriverError) as e:
        driver.init()
    assert str(e.value) == "cuInit failed: CUDA_ERROR_UNKNOWN" and e.value.hint == driver.DEFAULT_HINT
    monkeypatch.setenv("STUB_INIT_CODE", "12345")  # a code the driver has no name for is still reported
    with pytest.raises(aotc.DriverError, match=r"^cuInit failed: CUresult 12345$"):
        driver.init()


def test_an_entry_point_the_driver_lacks_is_named(stub):
    with pytest.raises(aotc.DriverError) as e:
        driver.function("cuKernelGetParamInfo")  # the stand-in, like a pre-12.4 driver, has none
    assert str(e.value).startswith("the driver has no cuKernelGetParamInfo") and e.value.hint == driver.OLD_DRIVER_HINT


def test_device_queries(stub, monkeypatch):
    monkeypatch.setenv("STUB_DEVICES", "2")
    assert driver.device_count() == 2
    assert driver.compute_capability(driver.device_handle(1)) == (9, 0)
    assert driver.multiprocessor_count(0) == 132 and driver.device_name(0) == "Stub GPU"
    with pytest.raises(aotc.DriverError, match="cuDeviceGet failed") as e:
        driver.device_handle(2)
    assert e.value.hint == "no GPU of that ordinal is visible: check CUDA_VISIBLE_DEVICES"


def test_launcher_passes_every_argument_and_follows_the_stream(stub):
    params = (ctypes.c_uint64 * 1)(0x1234_5678_9ABC_DEF0)
    array = (ctypes.c_void_p * 1)(ctypes.addressof(params))
    kernel, stream = 0x7F12_3456_7890, 0xFFFF_FFFF_0000_1000  # 64-bit handles survive whole
    launch = driver.Launcher(kernel, (132, 65535, 3), (384, 1, 2), 232448, ctypes.addressof(array))
    launch(0)
    assert _recorded(stub, "stub_launch_args", 12) == [kernel, 132, 65535, 3, 384, 1, 2, 232448, 0,
                                                       ctypes.addressof(array), 0, 0]
    assert ctypes.c_uint64.in_dll(stub, "stub_first_param").value == 0x1234_5678_9ABC_DEF0
    launch(stream)
    launch(stream)
    assert _recorded(stub, "stub_launch_args", 12)[8] == stream
    launch(0)
    assert _recorded(stub, "stub_launch_args", 12)[8] == 0 and ctypes.c_int.in_dll(stub, "stub_launches").value >= 4


def test_a_fork_runs_its_second_launch_on_the_side_stream_between_fork_and_join(stub):
    """driver.Fork: begin records on the caller's stream and the side stream waits; then a launch on each stream; end
    records on the side stream and the caller's stream waits: what is enqueued after it on the caller's stream
    follows both launches."""
    side = driver.stream_create()
    fork = driver.Fork(side)
    assert side and fork.side == side and driver.stream_create() != side
    ctypes.c_int.in_dll(stub, "stub_order_n").value = 0
    first = driver.Launcher(0x1234, (40, 1, 1), (384, 1, 1), 0, 0)
    second = driver.Launcher(0x5678, (8, 97, 1), (128, 1, 1), 0, 0)
    on_side = fork.begin(0xCAFE)  # as AttentionPlan.run forks: begin, the two launches, end
    first(0xCAFE)
    second(on_side)
    fork.end(0xCAFE)
    n = ctypes.c_int.in_dll(stub, "stub_order_n").value
    log = _recorded(stub, "stub_order", n)
    steps = [tuple(log[i:i + 3]) for i in range(0, n, 3)]
    (r1, e_fork, s1), (w1, s2, e2), (l1, on1, _), (l2, on2, _), (r2, e_join, s3), (w2, s4, e4) = steps
    assert (r1, w1, l1, l2, r2, w2) == (1, 2, 3, 3, 1, 2)
    assert (s1, s2, e2, on1, on2) == (0xCAFE, side, e_fork, 0xCAFE, side)
    assert (s3, s4, e4) == (side, 0xCAFE, e_join) and e_join != e_fork
    del fork  # its events go with it
    gc.collect()
    n2 = ctypes.c_int.in_dll(stub, "stub_order_n").value
    log = _recorded(stub, "stub_order", n2)
    assert sorted(log[i + 1] for i in range(n, n2, 3) if log[i] == 4) == sorted([e_fork, e_join])


def test_a_failed_launch_is_a_driver_error(stub, monkeypatch):
    launch = driver.Launcher(1, (1, 1, 1), (128, 1, 1), 0, 0)
    monkeypatch.setenv("STUB_LAUNCH_CODE", "2")
    with pytest.raises(aotc.DriverError, match="^cuLaunchKernelEx failed: CUDA_ERROR_OUT_OF_MEMORY$"):
        launch(0)


def test_tma_descriptor_encoding_passes_the_recipe(stub):
    from aotc.runtime.tma import DESCRIPTOR_BYTES, Encoder, TiledRecipe

    recipe = TiledRecipe("bf16", dims=(128, 4096, 16, 3), strides=(4096, 1 << 24, 1 << 28), box=(64, 128, 1, 1),
                         swizzle_bytes=128, l2_promotion_bytes=256)
    data = Encoder(recipe)(0x7F00_0000_1000)
    assert len(data) == DESCRIPTOR_BYTES and data[:8] == (0xA0C0000000000000).to_bytes(8, "little")
    m = _recorded(stub, "stub_tensor_map", 16)
    assert m[0] == 0x7F00_0000_1000
    assert m[1] == 9 | 4 << 8 | 3 << 16 | 3 << 24  # BFLOAT16, rank 4, SWIZZLE_128B, L2_256B, no interleave/fill
    assert m[2:6] == [128, 4096, 16, 3] and m[10:13] == [4096, 1 << 24, 1 << 28]
    assert m[6:10] == [64 | 1 << 32, 128 | 1 << 32, 1 | 1 << 32, 1 | 1 << 32]  # box, element strides 1


def test_workspace_memory_and_memset(stub, monkeypatch):
    buf = driver.DeviceBuffer(1000)
    assert buf.ptr == 0x7F00_0000_0000 + 1000 and buf.nbytes == 1000
    driver.memset_d32(0x7F00_0000_0040, 0, 17)
    assert _recorded(stub, "stub_memset", 4) == [0x7F00_0000_0040, 0, 17, 0]
    monkeypatch.setenv("STUB_ALLOC_CODE", "2")
    with pytest.raises(aotc.DriverError, match="cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY"):
        driver.DeviceBuffer(1 << 40)


def test_a_stream_s_capture_status(stub):
    """workspace.WorkspaceArena allocates for a new stream only where it is not capturing a CUDA graph."""
    status = ctypes.c_int.in_dll(stub, "stub_capture_status")
    assert driver.stream_capturing(0x5000) is False
    for capturing in (1, 2):  # CU_STREAM_CAPTURE_STATUS_ACTIVE, _INVALIDATED
        status.value = capturing
        assert driver.stream_capturing(0x5000) is True
    status.value = 0


def test_copy_to_device_passes_address_bytes_and_size(stub):
    """A dense-KV attention plan's page table goes up with copy_to_device (cuMemcpyHtoD's C arguments)."""
    import array

    data = array.array("i", [7, 8, 9]).tobytes()
    driver.copy_to_device(0x7F00_0000_1000, data)
    dst, n, first = _recorded(stub, "stub_memcpy", 3)
    assert (dst, n) == (0x7F00_0000_1000, 12) and first == 7 | 8 << 32


def test_the_enum_values_are_cuda_h_s():
    """The constants driver.py and tma.py pass are the values of cuda.h's enums (as cuda-bindings has them)."""
    cu = pytest.importorskip("cuda.bindings.driver")
    from aotc.runtime import tma

    a = cu.CUdevice_attribute
    assert driver.ATTR_MULTIPROCESSOR_COUNT == a.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    assert driver.ATTR_COMPUTE_CAPABILITY_MAJOR == a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    assert driver.ATTR_COMPUTE_CAPABILITY_MINOR == a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
    assert driver.FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES == \
        cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    assert tma._DTYPES["fp16"][0] == cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16
    assert tma._DTYPES["bf16"][0] == cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
    assert tma._DTYPES["fp8_e4m3"][0] == cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8
    for span, name in ((0, "NONE"), (32, "32B"), (64, "64B"), (128, "128B")):
        assert tma._SWIZZLE[span] == getattr(cu.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{name}")
    for size, name in ((0, "NONE"), (64, "L2_64B"), (128, "L2_128B"), (256, "L2_256B")):
        assert tma._L2[size] == getattr(cu.CUtensorMapL2promotion, f"CU_TENSOR_MAP_L2_PROMOTION_{name}")
    assert tma._INTERLEAVE_NONE == cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE
    assert tma._OOB_FILL_NONE == cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE


def test_the_runtime_imports_no_cuda_python_package(tmp_path):
    """Launching goes through ctypes: importing the runtime, loading a bundle and probing the driver import
    no cuda.bindings (28 ms of import), which this test also proves is not needed by making it unimportable."""
    code = (
        "import sys\n"
        "sys.modules['cuda'] = None; sys.modules['cuda.bindings'] = None\n"
        "import aotc, aotc.runtime, aotc.runtime.launch, aotc.runtime.tma\n"
        "from aotc.runtime import driver\n"
        "try:\n"
        "    driver.init()\n"
        "except aotc.DriverError as e:\n"
        "    print(type(e).__name__)\n"
        "print(sorted(m for m in sys.modules if m.startswith('cuda') and sys.modules[m] is not None))\n"
    )
    r = subprocess.run([PYTHON, "-c", code], env=aotc_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "[]"


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


