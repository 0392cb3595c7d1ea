"""Turn benchmarks/results/*.json into PNG plots and the markdown table the README links to.

    python benchmarks/report.py [--results benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def plot_prefill(pre: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    for D in sorted({r["D"] for r in pre["rows"]}):
        rows = [r for r in pre["rows"] if r["D"] == D and r["dtype"] == "bf16" and "case" not in r]
        if not rows:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
        for ax, causal in zip(axes, (False, True)):
            sel = sorted((r for r in rows if r["causal"] == causal), key=lambda r: r["S"])
            xs = [r["S"] for r in sel]
            for key, label, style in (("aotc_tflops", "aotc (sdpa_prefill_sm90)", "o-"),
                                      ("portable_tflops", "aotc sdpa_prefill (portable)", "o:"),
                                      ("fa3_tflops", "FlashAttention-3 (fa3-fwd)", "d-"),
                                      ("flash_tflops", "torch SDPA flash", "s--"),
                                      ("cudnn_tflops", "torch SDPA cuDNN", "^--")):
                ys = [r.get(key, float("nan")) for r in sel]
                ax.plot(xs, ys, style, label=label)
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.set_xlabel("sequence length S (B = 16384 / S, H = 16)")
            ax.set_title(f"bf16 D={D} {'causal' if causal else 'non-causal'}")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("TFLOP/s (4·B·H·S²·D, halved if causal)")
        axes[0].legend()
        fig.suptitle(f"prefill forward on {pre['gpu']} ({pre['date'][:10]})")
        fig.tight_layout()
        name = f"prefill_d{D}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.append(name)
    return made


def plot_decode(dec: dict, out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = dec["rows"]
    labels = [f"p{r['page']} B{r['B']}\nS{r['S_kv'] // 1024}k" for r in rows]
    x = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(12, 4.5))
    for i, (key, label) in enumerate((("aotc_TBps", "aotc sdpa_decode (paged)"), ("cudnn_TBps", "torch SDPA cuDNN (dense)"),
                                      ("flash_TBps", "torch SDPA flash (dense)"))):
        ax.bar([xi + (i - 1) * 0.27 for xi in x], [r.get(key, 0) for r in rows], width=0.27, label=label)
    ax.set_xticks(x, labels)
    ax.set_xlabel("page size, batch, KV length (bf16, D 128, H_q/H_kv 32/8, one new token)")
    ax.set_ylabel("effective KV bandwidth, TB/s")
    ax.set_title(f"decode on {dec['gpu']} ({dec['date'][:10]})")
    ax.set_ylim(0, 1.25 * max(r.get(k, 0) for r in rows for k in ("aotc_TBps", "cudnn_TBps", "flash_TBps")))
    ax.legend(loc="upper center", ncol=3)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "decode.png", dpi=110)
    plt.close(fig)
    return "decode.png"


def plot_combine(rtj: dict, out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = rtj["combine_kernel"]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.bar(range(len(rows)), [r["GB_per_s"] / 1e3 for r in rows])
    ax.set_xticks(range(len(rows)), [f"splits {r['splits']}\nB {r['B']} S_q {r['S_q']}\n{r['bytes'] / 2**20:.1f} MiB"
                                     for r in rows])
    ax.set_ylabel("bytes read + written / time, TB/s")
    ax.set_xlabel("sdpa_combine shape (H 32, D 128, bf16 out, LSE out)")
    ax.set_title(f"sdpa_combine bandwidth on {rtj['gpu']} ({rtj['date'][:10]}), CUDA graph of 20 launches")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "combine.png", dpi=110)
    plt.close(fig)
    return "combine.png"


def plot_host(rtj: dict, out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    host = {k: v for k, v in rtj["host_enqueue"].items() if "median_us" in v}
    names = list(host)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    med = [host[n]["median_us"] for n in names]
    p99 = [host[n]["p99_us"] for n in names]
    y = range(len(names))
    ax.barh(y, med, label="median")
    ax.scatter(p99, y, color="black", marker="|", s=200, label="p99", zorder=3)
    ax.set_yticks(list(y), [n.replace("_", " ") for n in names])
    ax.invert_yaxis()
    ax.set_xlabel("host time per call, microseconds (10,000 calls, GPU synchronized outside the timer)")
    ax.set_title(f"host enqueue on {rtj['gpu']} ({rtj['date'][:10]})")
    ax.legend(loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "host_enqueue.png", dpi=110)
    plt.close(fig)
    return "host_enqueue.png"


def breakdown_lines(bd: dict) -> list[str]:
    """Where a split-KV decode step's time goes (benchmarks/decode_breakdown.py)."""
    lines = [f"### Decode step breakdown ({bd['gpu']}, {bd['date']}, commit {bd['git_commit'][:12]}, "
             f"`{bd['command']}`)", "",
             "µs per call (CUDA graph of 10, L2 flushed, clocks settled on each contender first, median of "
             "interleaved rounds in rotated order): the step as the runtime "
             "launches it (one kernel; with splits, the last split of each sequence and KV head merges), torch SDPA "
             "cuDNN on dense KV.", "",
             "| page | B | S_kv | splits | step µs | TB/s | cuDNN µs | x cuDNN |",
             "|---|---|---|---|---|---|---|---|"]
    for r in bd["rows"]:
        lines.append(f"| {r['page']} | {r['B']} | {r['S_kv']} | {r['splits']} | {r['step_us']:.1f} | "
                     f"{r['step_TBps']:.2f} | {r['cudnn_us']:.1f} | {r['x_cudnn']:.2f} |")
    for r in bd["rows"]:
        if "split_sweep_us" in r:
            sweep = ", ".join(f"{k}: {v:.1f}" for k, v in r["split_sweep_us"].items())
            lines.append(f"\nB {r['B']}, page {r['page']}, forced split counts (µs per step): {sweep}")
    return lines + [""]


def power_lines(probe: dict) -> list[str]:
    """fp16 against bf16 prefill: clock and power while each runs (benchmarks/probes/fp16_power_probe.py)."""
    sh = probe["shape"]
    lines = [f"### fp16 against bf16 prefill: SM clock and board power ({probe['gpu']}, {probe['date']}, "
             f"commit {probe['git_commit'][:12]}, `{probe['command']}`)", "",
             f"D {sh['D']}, B {sh['B']} x S {sh['S']}, H {sh['H']}, non-causal, random normal inputs; each row "
             "launches back to back for a few seconds while nvidia-smi samples (medians).", "",
             "| contender | dtype | TFLOP/s | SM clock MHz | power W | temperature C |", "|---|---|---|---|---|---|"]
    for r in probe["rows"]:
        lines.append(f"| {r['contender']} | {r['dtype']} | {r['tflops']:.1f} | {r['sm_clock_mhz']:.0f} | "
                     f"{r['power_w']:.0f} | {r['temp_c']:.0f} |")
    return lines + [""]


def markdown(rtj, pre, build, cold, dec=None, breakdown=None, probe=None) -> str:
    lines = ["# Benchmark results", ""]
    if dec:
        lines += [f"## Decode over a paged KV cache ({dec['gpu']}, {dec['date']}, commit {dec['git_commit'][:12]}, "
                  f"`{dec['command']}`)", "",
                  "bf16, D 128, H_q/H_kv 32/8, S_q 1; effective bandwidth = bytes of K and V / time (CUDA graph of 10 "
                  "calls, L2 flushed, clocks settled on each contender first, median of interleaved rounds in rotated "
                  "order); torch SDPA on dense KV of the same logical shape (enable_gqa); aotc dense-KV: "
                  "aotc's dense variant on those same tensors (the paged figure against it is the page gather's cost).", "",
                  "| page | B | S_kv | splits | aotc TB/s | aotc dense-KV TB/s | cuDNN TB/s | flash TB/s | x cuDNN | x flash "
                  "| max abs err vs fp32 |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in dec["rows"]:
            f = lambda k, d=2: f"{r[k]:.{d}f}" if k in r else "n/a"  # noqa: E731
            err = f"{r['max_abs_err_vs_fp32']:.1e}" if "max_abs_err_vs_fp32" in r else "-"
            dense = f('aotc_dense_TBps') if 'aotc_dense_TBps' in r else "-"
            lines.append(f"| {r['page']} | {r['B']} | {r['S_kv']} | {r.get('splits', '')} | {f('aotc_TBps')} | {dense} | "
                         f"{f('cudnn_TBps')} | {f('flash_TBps')} | {f('x_cudnn')} | {f('x_flash')} | {err} |")
        step_splits = next((r.get("splits") for r in dec["rows"] if r["page"] == 16 and r["B"] == 1), "?")
        lines += ["", f"Host enqueue of one prepared decode step (one launch, {step_splits} splits; B 1, page 16), "
                      "10,000 calls:", "",
                  "| path | median µs | p99 µs | x bare cuLaunchKernel |", "|---|---|---|---|"]
        for n, v in dec["host_enqueue"].items():
            lines.append(f"| {n} | {v['median_us']:.2f} | {v['p99_us']:.2f} | {v.get('x_bare_launch', float('nan')):.2f} |")
        lines.append("")
    if breakdown:
        lines += breakdown_lines(breakdown)
    if probe:
        lines += power_lines(probe)
    if cold:
        import statistics

        rows = cold["rows"]

        def med(k):
            return statistics.median(r[k] for r in rows)
        lines += [f"## Cold start ({cold['gpu']}, {len(rows)} fresh processes, commit {cold['git_commit'][:12]}, "
                  f"`{cold['command']}`)", "",
                  f"torch imported and tensors allocated first; then `import aotc.runtime` {med('import_ms'):.1f} ms, "
                  f"`load()` of the {rows[0]['kernels']}-kernel bundle {med('load_ms'):.1f} ms, first finished "
                  f"prefill call {med('first_call_ms'):.1f} ms (driver bindings import, module load, launch): "
                  f"median total {med('total_ms'):.1f} ms.", ""]
    if pre:
        lines += [f"## Prefill forward ({pre['gpu']}, {pre['date']}, commit {pre.get('git_commit', '?')[:12]}, "
                  f"`{pre['command']}`)", "",
                  "16k tokens (B = 16384 / S), H = 16, packed BSHD; every column measured in the same process, the "
                  "contenders taking turns in rotated order, each running 100 ms untimed first so the clocks settle on "
                  "its power draw (median of rounds; benchmarks/timing.py). *aotc* is what the runtime dispatches to on this GPU "
                  "(sdpa_prefill_sm90), *portable* the mma.sync family sdpa_prefill on the same tensors, *FA3* "
                  "FlashAttention-3's flash_attn_func (fa3-fwd wheel, bf16 only); x = peer time / aotc time; "
                  "*A/A*: the same bundle again as a contender (x_base).", "",
                  "| D | dtype | S | B | causal | aotc TFLOP/s | portable TFLOP/s | FA3 TFLOP/s | flash TFLOP/s | "
                  "cuDNN TFLOP/s | aotc x cuDNN | aotc x FA3 | A/A | portable x flash |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in pre["rows"]:
            if "case" in r:
                continue
            f = lambda k: f"{r[k]:.1f}" if k in r else "n/a"  # noqa: E731
            g = lambda k: f"{r[k]:.2f}" if k in r else "n/a"  # noqa: E731
            lines.append(f"| {r['D']} | {r['dtype']} | {r['S']} | {r['B']} | {r['causal']} | {f('aotc_tflops')} | "
                         f"{f('portable_tflops')} | {f('fa3_tflops')} | {f('flash_tflops')} | {f('cudnn_tflops')} | "
                         f"{g('x_cudnn')} | {g('x_fa3')} | {g('x_base')} | {g('portable_x_flash')} |")
        for r in pre["rows"]:
            if "case" in r:
                lines += ["", f"Ragged THD batch, {r['lengths']} tokens (bf16 D{r['D']}, H {r['H']}, causal): aotc "
                          f"{r['aotc_ms']:.3f} ms ({r['aotc_tflops']:.0f} TFLOP/s), the same work as dense calls "
                          f"{r['dense_ms']:.3f} ms (x_dense {r['x_dense']:.3f})"
                          + (f", FA3 varlen {r['fa3_ms']:.3f} ms (x_fa3 {r['x_fa3']:.3f})" if "fa3_ms" in r else "")
                          + "."]
        spec = [r for r in pre["rows"] if "packed_speedup" in r]
        if spec:
            lines += ["", "Portable family's stride specialization (same contiguous tensors, bf16 D128): packed variant "
                      "vs general Int64 strides", "",
                      "| S | causal | packed TFLOP/s | general TFLOP/s | packed / general |", "|---|---|---|---|---|"]
            for r in spec:
                lines.append(f"| {r['S']} | {r['causal']} | {r['portable_tflops']:.1f} | {r['general_tflops']:.1f} | "
                             f"{r['packed_speedup']:.3f} |")
            lines.append("")
    if rtj:
        lines += [f"## Host enqueue ({rtj['gpu']}, {rtj['date']}, commit {rtj['git_commit'][:12]})", "",
                  "| path | median µs | p99 µs | x bare cuLaunchKernel (cuda.bindings) |", "|---|---|---|---|"]
        for n, v in rtj["host_enqueue"].items():
            if "median_us" in v:
                lines.append(f"| {n} | {v['median_us']:.2f} | {v['p99_us']:.2f} | {v['x_floor_cuda_bindings']:.2f} |")
        lines += ["", f"Bundle load (read + verify {rtj['kernels']} kernels, in process): {rtj['load_bundle_s'] * 1e3:.1f} ms; "
                  f"first prepare incl. lazy module load: {rtj['first_prepare_s'] * 1e3:.2f} ms.", ""]
        if "gpu_memory" in rtj:
            gm = rtj["gpu_memory"]
            lines += [f"GPU memory: loading {gm['modules_loaded']} more modules took {gm['free_bytes_drop'] / 2**20:.1f} MiB "
                      "(cuMemGetInfo).", ""]
        lines += ["| combine shape | median µs | GB/s |", "|---|---|---|"]
        for r in rtj["combine_kernel"]:
            lines.append(f"| splits {r['splits']} B {r['B']} H {r['H']} S_q {r['S_q']} D {r['D']} | "
                         f"{r['median_us']:.1f} | {r['GB_per_s']:.0f} |")
        lines.append("")
    if build:
        lines += [f"## Build side ({build['machine']}, {build['date']}, `{build['command']}`)", "",
                  f"- {build['variants']} variants cold with -j {build['jobs']}: {build['cold_build_s']:.1f} s "
                  f"({build['variants_per_minute']:.0f} variants/minute); warm (all hits): {build['warm_build_s']:.2f} s",
                  f"- bundle: {build['bundle_bytes'] / 1024:.0f} KiB",
                  f"- fresh process, import aotc.runtime + read + verify the bundle: "
                  f"{build['bundle_load_s (fresh process: import aotc.runtime + read + verify)']:.3f} s",
                  f"- fresh process, import CuTe DSL + cute.compile one variant (the JIT path): "
                  f"{build['jit_first_compile_s (fresh process: import DSL + cute.compile one variant)']:.2f} s"
                  + "".join(f"; {f}: {j['seconds']:.1f} s" for f, j in build.get("jit_first_compile_s_per_family", {}).items()),
                  f"- RSS added: import aotc.runtime {build['rss_import_aotc_runtime_bytes'] / 2**20:.1f} MiB, "
                  f"+ load bundle {build['rss_import_and_load_bundle_bytes'] / 2**20:.1f} MiB, against import cutlass "
                  f"{build['rss_import_cutlass_dsl_bytes'] / 2**20:.1f} MiB "
                  f"(ratio {build['rss_ratio_runtime_to_dsl']:.2f})", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    res = Path(args.results)
    rtj, pre, build = load(res / "runtime.json"), load(res / "prefill.json"), load(res / "build.json")
    dec = load(res / "decode.json")
    breakdown = load(res / "decode_breakdown.json")
    probe = load(res / "fp16_power_probe.json")
    cold = load(res / "cold_start.json")
    made = []
    if pre:
        made += plot_prefill(pre, res)
    if rtj:
        made.append(plot_host(rtj, res))
        made.append(plot_combine(rtj, res))
    if dec:
        made.append(plot_decode(dec, res))
    md = markdown(rtj, pre, build, cold, dec, breakdown, probe) + "\n" + "\n".join(f"![{m}]({m})" for m in made) + "\n"
    (res / "README.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
