"""The score features of every attention API (aotc.families.features): sliding window, soft-cap, sinks.

    window_left  None, or an int >= 0 (causal only): a row at position p sees keys p - window_left .. p
    softcap      None, or a finite float > 0: scores become softcap * tanh(score / softcap)
    sinks        None, or a contiguous fp32 device tensor [H_q]: one sink logit per query head

check_features() validates them once, before anything is prepared, and gives the Features record a plan
reads: the variant fields to dispatch on (exactly the features asked for, so a kernel without one pays
nothing), the kernel parameters (window_left, softcap, sinks: 0 for a feature that is off) and the sinks
tensor (an input no output may overlap). A call asking for a feature no loaded kernel has fails with
missing_kernel(), which names the spec fields to build.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..common.errors import ArgumentError
from ..families.features import FEATURES
from ..families.kv_dtype import FP8
from . import validate as V
from .tensors import TensorArg, as_tensor


@dataclass(frozen=True)
class Features:
    window_left: int | None = None
    softcap: float | None = None
    sinks: TensorArg | None = None

    @property
    def fields(self) -> dict:
        """The variant fields a kernel must have: each feature on exactly when asked for."""
        return {"window": self.window_left is not None, "softcap": self.softcap is not None,
                "sinks": self.sinks is not None}

    @property
    def values(self) -> dict:
        """The kernel parameters (every attention kernel has them; 0 where the feature is off)."""
        return {"window_left": 0 if self.window_left is None else self.window_left,
                "softcap": 0.0 if self.softcap is None else self.softcap,
                "sinks": 0 if self.sinks is None else self.sinks.ptr}

    @property
    def any(self) -> bool:
        return any(self.fields.values())

    @property
    def key(self) -> tuple:
        """What a plan cache keys on: the values and the sinks tensor's address and layout."""
        s = self.sinks
        return (self.window_left, self.softcap,
                None if s is None else (s.ptr, s.shape, s.strides, s.dtype, s.device))

    def inputs(self) -> dict[str, TensorArg]:
        return {} if self.sinks is None else {"sinks": self.sinks}



def check_feature_scalars(window_left, softcap) -> None:
    """window_left's and softcap's types and ranges alone (the one-call paths check them before hashing them
    into a plan key; check_features checks the rest)."""
    if window_left is not None and (not isinstance(window_left, int) or isinstance(window_left, bool)
                                    or not 0 <= window_left <= V.INT32_MAX):
        raise ArgumentError("window_left", window_left, f"None (no window) or an int in [0, {V.INT32_MAX}]: a row at "
                                                        "position p sees keys p - window_left .. p")
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
                                or not math.isfinite(softcap) or softcap <= 0):
        raise ArgumentError("softcap", softcap, "None (no soft-cap) or a finite float > 0")


def check_features(window_left, softcap, sinks, *, heads_q: int, device: int, causal: bool = True,
                   softmax_scale: float = 1.0) -> Features:
    """Validate the feature arguments of one call (heads_q: sinks' extent; causal: whether the call's
    mask is causal, which a window needs; softmax_scale: the call's, which the kernels divide by softcap)."""
    check_feature_scalars(window_left, softcap)
    if window_left is not None and not causal:
        raise ArgumentError("window_left", window_left, "None with causal=False (a window bounds the causal "
                                                        "keys from below: pass causal=True)")
    if softcap is not None:
        softcap = float(softcap)
        # the kernels take softcap and softmax_scale / softcap as float32 (1e39 would be inf, 1e-46 zero)
        if not V.f32_normal(softcap) or not V.f32_normal(softmax_scale / softcap):
            raise ArgumentError("softcap", softcap, f"a float > 0 with softcap and softmax_scale / softcap "
                                                    f"({softmax_scale:.3g} / softcap) in float32's normal range "
                                                    f"[{V.FLT_MIN:.3g}, {V.FLT_MAX:.3g}]")
    s = None
    if sinks is not None:
        s = as_tensor(sinks, "sinks")
        V.dtype(s, "sinks", ("fp32",))
        V.ndim(s, "sinks", 1, "H_q")
        V.dim(s, "sinks", 0, "H_q", heads_q, "one sink logit per query head")
        if s.shape[0] > 1 and s.strides[0] != 1:
            raise ArgumentError("sinks.stride[0]", s.strides[0], "1 (contiguous)")
        V.aligned(s, "sinks", 4)
        V.cuda_device({"sinks": s}, device)
    return Features(window_left, softcap, s)


def missing_kernel(families: tuple[str, ...], wanted: dict) -> ArgumentError:
    """The error for a call whose opt-in fields (the score features, an fp8 kv_dtype) no loaded kernel of
    `families` has."""
    on = [f for f in FEATURES if wanted.get(f)] + (["kv_dtype"] if wanted.get("kv_dtype") == FP8 else [])
    asked = [*FEATURES, *(["kv_dtype"] if "kv_dtype" in wanted else [])]
    fields = ", ".join(f"{k} = {_toml(v)}" for k, v in wanted.items())
    return ArgumentError(
        "/".join(on) or "features", {f: wanted.get(f) for f in asked},
        f"a loaded {' or '.join(families)} kernel with these features; build one: a [[family]] entry "
        f"name = \"{families[0]}\" with {fields} in a spec (specs/full.toml has them), then aotc build")


def _toml(v) -> str:
    if isinstance(v, bool):
        return "[true]" if v else "[false]"
    return f"[{v!r}]".replace("'", '"')


def feature_scalars(window_left, softcap) -> tuple:
    """The feature values as a plan-cache key, with their types (validate.typed)."""
    return V.typed(window_left, softcap)
