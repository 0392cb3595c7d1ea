"""The README's CuPy and JAX examples rest on the runtime reading their arrays through DLPack.

JAX (CPU) runs wherever jax is installed; CuPy needs a GPU and is skipped elsewhere. CI installs
neither (they are not aotc dependencies), so there these tests skip.
"""
from __future__ import annotations

import pytest

from aotc.runtime import as_stream, as_tensor


@pytest.mark.parametrize("dtype, name", [("bfloat16", "bf16"), ("float16", "fp16"), ("float32", "fp32"),
                                         ("int32", "int32")])
def test_jax_arrays_through_dlpack(dtype, name):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    x = jnp.arange(2 * 3 * 5 * 8).reshape(2, 3, 5, 8).astype(getattr(jnp, dtype))
    t = as_tensor(x, "q")
    assert (t.shape, t.strides, t.dtype, t.device) == ((2, 3, 5, 8), (120, 40, 8, 1), name, ("cpu", 0))
    assert t.ptr == x.unsafe_buffer_pointer()


def test_cupy_arrays_and_streams():
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no GPU")
    except Exception:
        pytest.skip("no GPU")
    x = cp.zeros((2, 7, 4, 64), dtype=cp.float16)[:, 1:]
    t = as_tensor(x, "q")
    assert (t.shape, t.strides, t.dtype) == ((2, 6, 4, 64), (7 * 256, 256, 64, 1), "fp16")
    assert t.ptr == x.data.ptr and t.device[0] == "cuda"
    s = cp.cuda.Stream()
    assert as_stream(s) == s.ptr
