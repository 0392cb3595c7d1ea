"""GPU suite fixtures: the default bundle, loaded with the runtime alone (no DSL on the GPU machine)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = Path(os.environ.get("AOTC_TEST_BUNDLE", ROOT / "artifacts" / "default.aotc"))


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
        for item in items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def rt():
    import aotc.runtime

    if not BUNDLE.exists():
        pytest.fail(f"the GPU suite needs {BUNDLE}: run `make build` first (and carry artifacts/ to the GPU machine)")
    torch.cuda.init()
    return aotc.runtime.load(BUNDLE)


@pytest.fixture(scope="module")
def ops(rt):
    """aotc.torch (torch.ops.aotc.*) launching through the suite's runtime."""
    import aotc.torch

    aotc.torch.set_runtime(rt)
    yield aotc.torch
    aotc.torch.set_runtime(None)
