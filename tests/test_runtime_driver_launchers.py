"""The launchers' prepared state, without a GPU (nothing here calls into the driver)."""
import pytest

driver = pytest.importorskip("aotc.runtime.driver")
cu = driver.cu


def test_programmatic_launcher_sets_the_pdl_attribute():
    launcher = driver.ProgrammaticLauncher(0x1234)
    cfg = launcher._config
    assert cfg.numAttrs == 1
    attr = cfg.attrs[0]
    assert attr.id == cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert attr.value.programmaticStreamSerializationAllowed == 1
    assert int(launcher.function) == 0x1234  # the CUkernel handle, cast as cuLaunchKernelEx allows


def test_programmatic_launcher_reuses_its_config(monkeypatch):
    calls = []
    launcher = driver.ProgrammaticLauncher(0x1234)
    monkeypatch.setattr(launcher, "_launch", lambda cfg, f, params, extra: calls.append(
        (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX, cfg.sharedMemBytes, int(cfg.hStream), params))
        or (cu.CUresult.CUDA_SUCCESS,))
    launcher((32, 1, 1), (128, 1, 1), 2048, 0, 0xA0)
    launcher((32, 1, 1), (128, 1, 1), 2048, 0, 0xA0)
    launcher((8, 2, 1), (128, 1, 1), 2048, 0x77, 0xB0)
    assert calls == [(32, 1, 1, 128, 2048, 0, 0xA0), (32, 1, 1, 128, 2048, 0, 0xA0), (8, 2, 1, 128, 2048, 0x77, 0xB0)]


def test_programmatic_launcher_raises_on_driver_errors(monkeypatch):
    launcher = driver.ProgrammaticLauncher(0x1234)
    monkeypatch.setattr(launcher, "_launch", lambda *a: (cu.CUresult.CUDA_ERROR_INVALID_VALUE,))
    with pytest.raises(driver.DriverError, match="cuLaunchKernelEx.*CUDA_ERROR_INVALID_VALUE|cuLaunchKernelEx.*CUresult 1"):
        launcher((1, 1, 1), (128, 1, 1), 0, 0, 0xA0)
