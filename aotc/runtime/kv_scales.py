"""fp8 KV caches in the runtime (aotc.families.kv_dtype): which kv_dtype a call's pools are, and their scales.

    k_descale / v_descale (decode, attention) and k_scale / v_scale (kv_write): the same tensors, fp32 on the
    device, shape [H_kv] (one scale per KV head) or [1] (one for every head), contiguous

A 16-bit cache takes none (passing one is an error: the pools hold no quantized values); an fp8_e4m3 cache
needs both. check_kv_scales() validates them before anything is prepared and gives the KvScales record a
plan reads: the variant field to dispatch on, the kernel parameters and the inputs no output may overlap.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..common.errors import ArgumentError
from ..families.kv_dtype import FP8
from . import validate as V
from .tensors import TensorArg, as_tensor

@dataclass(frozen=True)
class KvScales:
    kv_dtype: str
    k: TensorArg | None = None
    v: TensorArg | None = None
    prefix: str = "descale"  # the kernels' parameter names: k_descale (decode), k_scale (kv_write)

    @property
    def fields(self) -> dict:
        return {"kv_dtype": self.kv_dtype}

    @property
    def values(self) -> dict:
        p = self.prefix
        if self.k is None:
            return {f"k_{p}": 0, f"v_{p}": 0, f"{p}_stride_h": 0}
        return {f"k_{p}": self.k.ptr, f"v_{p}": self.v.ptr, f"{p}_stride_h": int(self.k.shape[0] > 1)}

    def inputs(self) -> dict[str, TensorArg]:
        p = self.prefix
        return {} if self.k is None else {f"k_{p}": self.k, f"v_{p}": self.v}


def check_kv_dtypes(k_cache: TensorArg, v_cache: TensorArg, query_dtype: str) -> None:
    """The pools' dtype: the queries' or fp8_e4m3, K and V alike."""
    V.dtype(k_cache, "k_cache", (query_dtype, FP8))
    V.dtype(v_cache, "v_cache", (k_cache.dtype,))


def check_kv_scales(k_cache: TensorArg, v_cache: TensorArg, query_dtype: str, k_scale, v_scale, *,
                    heads_kv: int, device: int, prefix: str = "descale") -> KvScales:
    """The pools' dtype (check_kv_dtypes) and, for fp8, the scales (named k_<prefix>, v_<prefix> in errors)."""
    check_kv_dtypes(k_cache, v_cache, query_dtype)
    names = (f"k_{prefix}", f"v_{prefix}")
    if k_cache.dtype != FP8:
        for name, s in zip(names, (k_scale, v_scale)):
            if s is not None:
                raise ArgumentError(name, "a tensor", f"None: the cache is {k_cache.dtype}, not {FP8} (scales "
                                                      "belong to an fp8 cache)")
        return KvScales(k_cache.dtype, prefix=prefix)
    recs = []
    for name, s in zip(names, (k_scale, v_scale)):
        if s is None:
            raise ArgumentError(name, None, f"an fp32 device tensor [H_kv = {heads_kv}] or [1]: the cache is {FP8} "
                                            f"(attention reads k_fp8 * k_{prefix}, v_fp8 * v_{prefix})")
        t = as_tensor(s, name)
        V.dtype(t, name, ("fp32",))
        V.ndim(t, name, 1, "H_kv or 1")
        if t.shape[0] not in (1, heads_kv):
            raise ArgumentError(f"{name}.shape[0]", t.shape[0], f"H_kv = {heads_kv} (one scale per KV head) or 1 "
                                                                "(one for every head)")
        if t.shape[0] > 1 and t.strides[0] != 1:
            raise ArgumentError(f"{name}.stride[0]", t.strides[0], "1 (contiguous)")
        V.aligned(t, name, 4)
        V.cuda_device({name: t}, device)
        recs.append(t)
    if recs[0].shape != recs[1].shape:
        raise ArgumentError(f"{names[1]}.shape", recs[1].shape, f"the shape of {names[0]}, {recs[0].shape}")
    return KvScales(FP8, recs[0], recs[1], prefix)


def kv_stride_multiple(dtype: str) -> int:
    """Elements of a 16-byte step: the pools' bases and strides are multiples of it (128-bit copies)."""
    return 16 if dtype == FP8 else 8
