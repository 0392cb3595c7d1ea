"""aotc.runtime.tensors and aotc.runtime.dlpack: the adapter's two halves import in either order and keep
the public names (as_tensor and as_output live in dlpack and are re-exported by tensors)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CODE = """
import importlib, sys
sys.path.insert(0, sys.argv[1])
importlib.import_module("aotc.runtime." + sys.argv[2])
from aotc.runtime.tensors import DTYPES, TensorArg, as_output, as_stream, as_tensor, tensor
from aotc.runtime import dlpack, tensors
assert as_tensor is dlpack.as_tensor is tensors.as_tensor
assert as_output is dlpack.as_output is tensors.as_output
assert set(tensors.__all__) == {"DTYPES", "TensorArg", "tensor", "as_tensor", "as_output", "as_stream"}
t = tensor(64, (2,), (1,), "fp32")
assert as_tensor(t, "x") is t and as_stream(None) == 0 and DTYPES["bf16"] == 2
print("ok")
"""


@pytest.mark.parametrize("first", ["tensors", "dlpack"])
def test_public_names_importable_whichever_half_comes_first(first):
    out = subprocess.run([sys.executable, "-c", CODE, str(ROOT), first], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stdout + out.stderr


def test_unknown_attribute_is_still_an_attribute_error():
    from aotc.runtime import tensors

    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        tensors.not_a_name  # noqa: B018
