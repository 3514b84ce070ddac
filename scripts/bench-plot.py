#!/usr/bin/env python3
"""Plots bench/results/summary.json (made by scripts/bench-summary.py) with gnuplot.

Panels, each drawn when its data is there:
  1. completion latency overhead over the raw call (median_us - raw_median_us),
     per workload, one bar per strategy, log scale (overheads <= 0 are drawn
     at the floor of the axis and said so in the title);
  2. small-operation throughput per workload and io-thread count: ours (the
     best coroutine count at that T), the raw ceiling, and PyTorch (T = 1 only);
  3. large operations: library time over raw time, with the 1% target.

Usage: scripts/bench-plot.py [SUMMARY_JSON] [-o OUTPUT] [--svg]
  default SUMMARY_JSON: bench/results/summary.json
  default OUTPUT: summary.png (summary.svg with --svg) next to SUMMARY_JSON

Needs gnuplot (Debian: apt-get install gnuplot-nox); Python 3 standard library.
Exit status: 0 written, 1 bad input or gnuplot failed, 64 bad usage,
69 gnuplot is not installed.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

PROG = "bench-plot"
# bench/results/summary.json of the checkout this script is in.
DEFAULT_SUMMARY = os.path.relpath(os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "bench", "results", "summary.json"))
LOG_FLOOR_US = 0.01  # where overheads <= 0 are drawn on the log axis


def note(msg):
    print(f"{PROG}: {msg}", file=sys.stderr)


def quote(s):
    """A gnuplot string literal (single quotes; a quote is doubled)."""
    return "'" + str(s).replace("'", "''") + "'"


def cell(v, scale=1.0):
    return "-" if v is None else f"{v * scale:.6g}"


def latency_panel(s, tmp):
    rows = [r for r in s.get("latency", []) if r.get("overhead_us") is not None]
    if not rows:
        return None
    works, strategies = [], []
    for r in rows:
        if r["work"] not in works:
            works.append(r["work"])
        if r["strategy"] not in strategies:
            strategies.append(r["strategy"])
    val = {(r["work"], r["strategy"]): r["overhead_us"] for r in rows}
    clamped = any(v <= LOG_FLOOR_US for v in val.values())
    path = os.path.join(tmp, "latency.dat")
    with open(path, "w", encoding="utf-8") as f:
        f.write("work " + " ".join(f'"{st}"' for st in strategies) + "\n")
        for w in works:
            cells = []
            for st in strategies:
                v = val.get((w, st))
                cells.append("-" if v is None else f"{max(v, LOG_FLOOR_US):.6g}")
            f.write(f'"{w}" ' + " ".join(cells) + "\n")
    title = "completion latency overhead over raw (median, us, log scale)"
    if clamped:
        title += f"; <= {LOG_FLOOR_US} us drawn at {LOG_FLOOR_US}"
    return "\n".join([
        f"set title {quote(title)}",
        "set logscale y",
        f"set yrange [{LOG_FLOOR_US}:*]",
        "set ylabel 'us'",
        "set style data histogram",
        "set style histogram clustered gap 1",
        "set style fill solid 0.85 border -1",
        "set boxwidth 0.9",
        "set xtics nomirror",
        "set key top left",
        "set grid ytics",
        f"plot for [i=2:{len(strategies) + 1}] {quote(path)} using i:xtic(1) "
        "title columnheader(i)",
        "unset logscale y",
        "set yrange [*:*]",
    ])


def throughput_panel(s, tmp):
    rows = [r for r in s.get("throughput", []) if r.get("ops_per_s") is not None]
    if not rows:
        return None
    torch = {p["work"]: p.get("torch_ops_per_s") for p in s.get("peer", [])}
    best = {}
    order = []
    for r in rows:
        key = (r["work"], r["io_threads"])
        if key not in best:
            order.append(key)
            best[key] = r
        elif r["ops_per_s"] > best[key]["ops_per_s"]:
            best[key] = r
    works = []
    for w, _ in order:
        if w not in works:
            works.append(w)
    order.sort(key=lambda k: (works.index(k[0]), k[1]))
    path = os.path.join(tmp, "throughput.dat")
    with open(path, "w", encoding="utf-8") as f:
        f.write('case "ours" "raw ceiling" "PyTorch"\n')
        for w, t in order:
            r = best[(w, t)]
            tv = torch.get(w) if t == 1 else None
            f.write(f'"{w} T={t}" {cell(r["ops_per_s"], 1e-3)} '
                    f'{cell(r.get("raw_ceiling_ops_per_s"), 1e-3)} {cell(tv, 1e-3)}\n')
    return "\n".join([
        "set title 'small-operation throughput (thousand ops/s; ours: best coroutine count; "
        "PyTorch at T = 1 only)'",
        "set ylabel 'kops/s'",
        "set style data histogram",
        "set style histogram clustered gap 1",
        "set style fill solid 0.85 border -1",
        "set boxwidth 0.9",
        "set xtics nomirror rotate by -30",
        "set key top left",
        "set grid ytics",
        f"plot for [i=2:4] {quote(path)} using i:xtic(1) title columnheader(i)",
        "set xtics norotate",
    ])


def large_panel(s, tmp):
    rows = [r for r in s.get("large", []) if r.get("ratio") is not None]
    if not rows:
        return None
    path = os.path.join(tmp, "large.dat")
    with open(path, "w", encoding="utf-8") as f:
        f.write('work "lib / raw"\n')
        for r in rows:
            f.write(f'"{short_large(r["work"])}" {r["ratio"]:.6g}\n')
    lo = min(0.98, min(r["ratio"] for r in rows) - 0.01)
    hi = max(1.03, max(r["ratio"] for r in rows) + 0.01)
    return "\n".join([
        "set title 'large operations: library time / raw time (median); target <= 1.01'",
        "set ylabel 'lib / raw'",
        f"set yrange [{lo:.4f}:{hi:.4f}]",
        "set style data histogram",
        "set style histogram clustered gap 1",
        "set style fill solid 0.85 border -1",
        "set boxwidth 0.6",
        "set xtics nomirror rotate by -20",
        "set key outside top center horizontal",
        "set grid ytics",
        f"plot {quote(path)} using 2:xtic(1) title columnheader(2), "
        "1.01 with lines dashtype 2 linewidth 2 title 'target 1.01', "
        "1.0 with lines linecolor rgb 'gray' title 'raw'",
        "set yrange [*:*]",
        "set xtics norotate",
        "set key inside top left vertical",
    ])


def short_large(work):
    """An x label for a large-operation row: the convolution's long names shortened."""
    for long, short in (("conv_resnet50_3x3_b64_f16", "conv f16"), ("_vs_legacy_call", " vs legacy"),
                        ("_no_cuda_graphs", " no graphs"), ("_legacy_api", " legacy API"),
                        ("sgemm8192_", "sgemm8192 "), ("fft_c2c_", "FFT ")):
        work = work.replace(long, short)
    return work.replace("_", " ")


def main(argv):
    summary, out, svg = DEFAULT_SUMMARY, None, False
    args, positional = list(argv), []
    while args:
        a = args.pop(0)
        if a in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        if a == "--svg":
            svg = True
        elif a in ("-o", "--output") or a.startswith("--output="):
            out = a.split("=", 1)[1] if "=" in a else (args.pop(0) if args else "")
            if not out:
                note(f"{a} needs a file name")
                return 64
        elif a.startswith("-"):
            note(f"unknown option {a} (try --help)")
            return 64
        else:
            positional.append(a)
    if len(positional) > 1:
        note(f"unexpected argument {positional[1]} (try --help)")
        return 64
    if positional:
        summary = positional[0]
    if out is None:
        out = os.path.join(os.path.dirname(summary) or ".",
                           "summary.svg" if svg else "summary.png")

    gnuplot = shutil.which("gnuplot")
    if gnuplot is None:
        note("gnuplot is not installed; on Debian/Ubuntu: sudo apt-get install gnuplot-nox")
        return 69
    try:
        with open(summary, encoding="utf-8") as f:
            s = json.load(f)
    except (OSError, ValueError) as e:
        note(f"cannot read {summary}: {e}")
        return 1
    if not isinstance(s, dict):
        note(f"{summary}: not a JSON object")
        return 1

    with tempfile.TemporaryDirectory(prefix="bench-plot.") as tmp:
        panels = [p for p in (latency_panel(s, tmp), throughput_panel(s, tmp),
                              large_panel(s, tmp)) if p]
        if not panels:
            note(f"{summary}: nothing to plot (no latency, throughput or large results)")
            return 1
        width, height = 1400, 430 * len(panels)
        if svg:
            term = f"set terminal svg size {width},{height} font 'sans,11' noenhanced"
        else:
            listed = subprocess.run([gnuplot, "-e", "set terminal"], capture_output=True,
                                    text=True)
            terms = listed.stdout + listed.stderr
            kind = "pngcairo" if "pngcairo" in terms else "png"
            term = f"set terminal {kind} size {width},{height} noenhanced"
        header = f"{s.get('device') or 'unknown device'}, {s.get('date') or 'undated'}"
        script = "\n".join([
            term,
            f"set output {quote(out)}",
            "set datafile missing '-'",
            f"set multiplot layout {len(panels)},1 title {quote('atomr-accel-cuda benchmarks: ' + header)}",
            *panels,
            "unset multiplot",
            "set output",
        ]) + "\n"
        path = os.path.join(tmp, "plot.gp")
        with open(path, "w", encoding="utf-8") as f:
            f.write(script)
        run = subprocess.run([gnuplot, path], capture_output=True, text=True)
        if run.returncode != 0:
            note(f"gnuplot failed:\n{run.stderr.strip()}")
            return 1
        if run.stderr.strip():
            note(run.stderr.strip())
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
