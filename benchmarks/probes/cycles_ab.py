"""A/B of prefill kernels in SM cycles under Nsight Compute at base clocks (and FA3 beside them).

    python benchmarks/probes/cycles_ab.py --bundle artifacts/default.aotc --bundle artifacts/exp.aotc --fa3 \
        --shape 128:16384:1 --shape 256:4096:0

Each (contender, shape) runs benchmarks/probes/profile_kernel.py in a process of its own under
`ncu --clock-control base --metrics ...`, which counts the kernel's cycles with the SM clock held at base. The count
does not move with the clock and power state that timed A/B runs share: launches of one cubin land within about 1%
(benchmarks/results/prefill_experiment_d256_pv_one_group.json), where the same cubins timed have measured 0.94-1.03
apart. Cycles are not time, though: under a power limit a kernel that does less work can run at a higher clock.
Report the two side by side.

Prints one JSON line per shape: per contender (a bundle's file stem, or fa3) the cycles, the tensor pipe's active
% and the SMs' active % of the elapsed cycles (below 100: SMs idle, e.g. in a schedule's tail) of each profiled
launch, any --metric asked for, and x_<contender> = the first bundle's fewest cycles / the contender's (> 1: fewer
cycles than the first bundle). Shapes are D:S:causal[:H[:softcap]] with B = 16384 / S, H 16 unless given, bf16
(profile_kernel.py's): a head count whose tiles fill the persistent grid's rounds exactly (H 33 on the H200's 132
SMs) isolates a schedule's tail; a softcap (e.g. 50) profiles the soft-capped kernels (FA3 with the same softcap).
--layout ragged or paged16 profiles aotc's kernels for packed THD tokens (rt.prefill_ragged) or for the serving
entry point over 16-token pages (rt.attention) on the same work; FA3 stays on its dense kernel.
"""
import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

PROFILE_KERNEL = Path(__file__).resolve().parent / "profile_kernel.py"
CYCLES = "sm__cycles_elapsed.avg"
TENSOR = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
ACTIVE = "sm__cycles_active.avg"
DEFAULT_SHAPES = ("128:8192:0", "128:16384:1", "256:4096:0", "256:16384:0")
# a metric line of ncu's text report: name, unit (absent for unitless metrics), value with thousands separators
_METRIC_LINE = re.compile(r"^\s+([a-z0-9_]+__[\w.]+)\s+(?:\S+\s+)?([\d,]+(?:\.\d+)?)\s*$")


def parse_metrics(report: str) -> dict[str, list[float]]:
    """ncu's text report -> each metric's values, one per profiled launch in launch order."""
    values: dict[str, list[float]] = {}
    for line in report.splitlines():
        m = _METRIC_LINE.match(line)
        if m:
            values.setdefault(m.group(1), []).append(float(m.group(2).replace(",", "")))
    return values


def parse_shape(text: str) -> tuple[int, int, bool, int, int]:
    """'D:S:causal[:H[:softcap]]' -> (D, S, causal, H, softcap), H 16 and softcap 0 (none) unless given; a bad one is
    an error naming it and the expected form."""
    parts = text.split(":")
    if len(parts) not in (3, 4, 5) or not all(p.isdigit() for p in parts) or parts[2] not in ("0", "1"):
        raise argparse.ArgumentTypeError(f"--shape {text!r}: expected D:S:causal[:H[:softcap]], e.g. 128:16384:1, "
                                         "128:16384:1:33 or 128:8192:1:16:50")
    d, s, c = int(parts[0]), int(parts[1]), parts[2] == "1"
    h = int(parts[3]) if len(parts) >= 4 else 16
    cap = int(parts[4]) if len(parts) == 5 else 0
    if d not in (64, 128, 256) or s < 1 or 16384 % s or not 1 <= h <= 128:
        raise argparse.ArgumentTypeError(f"--shape {text!r}: D must be 64, 128 or 256, S divide 16384 and H be 1..128")
    return d, s, c, h, cap


# aotc's prefill kernels by the layout they read (profile_kernel.py's families): the same B sequences of S tokens
# dense [B, S, H, D], packed THD (rt.prefill_ragged), or through the serving entry point over 16-token pages
# (rt.attention); FA3 runs its dense kernel on the dense tensors whatever the layout
LAYOUTS = {"dense": "prefill", "ragged": "prefill-ragged", "paged16": "prefill-paged16"}


def ncu_command(shape: tuple[int, int, bool, int, int], fa3: bool, launches: int,
                extra: tuple[str, ...] = (), layout: str = "dense") -> list[str]:
    """The ncu command line that profiles one contender on one shape (aotc's kernel, or FA3's device_kernel)."""
    d, s, causal, h, cap = shape
    return ["ncu", "--clock-control", "base", "--metrics", ",".join((CYCLES, TENSOR, ACTIVE) + tuple(extra)),
            "--kernel-name", "regex:device_kernel" if fa3 else "regex:sdpa_prefill",
            "--launch-skip", "1", "--launch-count", str(launches),
            sys.executable, str(PROFILE_KERNEL), "prefill-fa3" if fa3 else LAYOUTS[layout], str(d), str(s),
            str(int(causal)), str(cap), str(h)]


def profile(shape, bundle: str | None, launches: int, extra: tuple[str, ...] = (), layout: str = "dense") -> dict:
    env = dict(os.environ)
    if bundle:
        env["AOTC_PROFILE_BUNDLE"] = bundle
    run = subprocess.run(ncu_command(shape, bundle is None, launches, extra, layout), capture_output=True, text=True,
                         env=env, timeout=300)
    values = parse_metrics(run.stdout)
    if run.returncode != 0 or len(values.get(CYCLES, [])) != launches:
        raise RuntimeError(f"ncu on {bundle or 'fa3'} {shape}: exit {run.returncode}, "
                           f"{len(values.get(CYCLES, []))} of {launches} launches profiled\n{run.stdout[-2000:]}"
                           f"{run.stderr[-2000:]}")
    return {"sm_cycles": values[CYCLES], "tensor_active_pct": values.get(TENSOR, []),
            "sm_active_pct": [round(100 * a / c, 2) for a, c in zip(values.get(ACTIVE, []), values[CYCLES])],
            **({"metrics": {m: values.get(m, []) for m in extra}} if extra else {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", action="append", required=True, help="a bundle (repeat; the first is the reference)")
    ap.add_argument("--fa3", action="store_true", help="profile FlashAttention-3 (the fa3-fwd wheel) too")
    ap.add_argument("--shape", action="append", type=parse_shape, help=f"D:S:causal (repeat; default {DEFAULT_SHAPES})")
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="dense",
                    help="the layout aotc's kernels read (FA3 runs dense): dense, ragged (THD) or paged16")
    ap.add_argument("--launches", type=int, default=2, help="profiled launches per contender, after one warm-up")
    ap.add_argument("--metric", action="append", default=[],
                    help="another ncu metric to report per launch (repeat), e.g. smsp__inst_executed.sum")
    args = ap.parse_args()
    names = [Path(b).stem for b in args.bundle]
    if len(set(names)) != len(names):
        ap.error(f"--bundle: two bundles share a file stem ({names}); name them apart")
    extra = tuple(args.metric)
    shapes = args.shape or [parse_shape(s) for s in DEFAULT_SHAPES]
    if args.layout == "paged16" and not all(causal for _, _, causal, _, _ in shapes):
        # the serving entry point's paged kernels are causal (specs/default.toml builds no other)
        ap.error("--layout paged16 profiles the serving entry point, which is causal: every --shape needs causal 1 "
                 f"(got {[f'{d}:{s}:{int(c)}' for d, s, c, _, _ in shapes if not c]})")
    for shape in shapes:
        d, s, causal, h, cap = shape
        row = {"D": d, "S": s, "B": 16384 // s, "H": h, "causal": causal, "dtype": "bf16", "layout": args.layout,
               **({"softcap": cap} if cap else {})}
        contenders = {name: profile(shape, bundle, args.launches, extra, args.layout)
                      for name, bundle in zip(names, args.bundle)}
        if args.fa3:
            contenders["fa3"] = profile(shape, None, args.launches, extra)
        ref = min(contenders[names[0]]["sm_cycles"])
        row["contenders"] = contenders
        row.update({f"x_{n}": round(ref / min(c["sm_cycles"]), 4) for n, c in contenders.items()})
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
