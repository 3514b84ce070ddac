#!/usr/bin/env python3
"""PyTorch peer of atomr-bench-throughput (issue 5 b): the same small workloads.

Workloads (each on preallocated float32 / complex64 CUDA tensors, written in
place, like the C++ benchmark):
  sgemm64, sgemm256  torch.mm(a, b, out=c), n x n float32, TF32 off
  fft4096            torch.fft.fft(x, out=y), complex64, 4096 points, batch 1
  rng1M              r.normal_() on 2^20 float32 (the default CUDA generator)

Throughput, "eight streams from one Python thread": launches go round robin over
--streams torch.cuda.Stream objects (torch.cuda.set_stream before each launch;
every stream has its own tensors), with no synchronisation per operation and one
torch.cuda.synchronize() at the end; warm-up first; at least --seconds per
workload. ops/s = operations / wall time, wall time including the final sync.

Extra: single-stream launch + torch.cuda.synchronize() latency of sgemm 256 and
1024 (torch.mm, --reps repetitions): median and p99.

Writes JSON to --json PATH (default: stdout); the human summary goes to stderr.
Exit status: 0 success, 1 a workload failed, 64 usage error, 69 no torch / no
usable CUDA device.
"""

import datetime
import json
import math
import sys
import time

from peer_common import EXIT_NO_GPU, EXIT_USAGE, UsageParser  # noqa: F401

EXIT_FAILED = 1

WORKLOADS = ("sgemm64", "sgemm256", "fft4096", "rng1M")
LATENCY_SIZES = (256, 1024)


def parse_args(argv):
    p = UsageParser(
        prog="torch_small.py",
        description="PyTorch peer of atomr-bench-throughput: small sgemm, FFT and "
        "normal-draw throughput from one Python thread over several CUDA "
        "streams, plus torch.mm + synchronize latency.",
    )
    p.add_argument("--json", metavar="PATH", default="-",
                   help="write the JSON result here (default: stdout)")
    p.add_argument("--work", default="all",
                   help="comma separated workloads: %s, or all (default all)"
                   % ", ".join(WORKLOADS))
    p.add_argument("--streams", type=int, default=8,
                   help="streams to launch on, round robin (default 8)")
    p.add_argument("--seconds", type=float, default=1.0,
                   help="timed seconds per workload (default 1)")
    p.add_argument("--warmup", type=int, default=50,
                   help="untimed launches per stream before timing (default 50)")
    p.add_argument("--reps", type=int, default=1000,
                   help="repetitions of the latency measurement (default 1000)")
    p.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    a = p.parse_args(argv)
    if a.work == "all":
        a.work = list(WORKLOADS)
    else:
        names = [w for w in a.work.split(",")]
        for w in names:
            if w not in WORKLOADS and w != "all":
                p.error("--work: unknown workload %r (known: %s, all)"
                        % (w, ", ".join(WORKLOADS)))
        a.work = []
        for w in names:
            for x in (WORKLOADS if w == "all" else (w,)):
                if x not in a.work:
                    a.work.append(x)
    if not 1 <= a.streams <= 1024:
        p.error("--streams wants an integer in 1..1024")
    if not (a.seconds > 0 and a.seconds <= 600 and math.isfinite(a.seconds)):
        p.error("--seconds wants a number > 0 and <= 600")
    if not 0 <= a.warmup <= 100000:
        p.error("--warmup wants an integer in 0..100000")
    if not 1 <= a.reps <= 10000000:
        p.error("--reps wants an integer in 1..10000000")
    if a.device < 0:
        p.error("--device wants an index >= 0")
    return a


def nearest_rank(sorted_values, p):
    """Nearest-rank percentile, as bench.hpp's summarize()."""
    n = len(sorted_values)
    k = int(math.ceil(p * n - 1e-9))
    return sorted_values[min(max(k, 1), n) - 1]


def make_launcher(torch, work, dev, style="tuned"):
    """Per-stream tensors for `work` and a function launching one op on set i.

    style "tuned": in-place forms writing preallocated outputs (out=, normal_).
    style "idiomatic": what a PyTorch user writes: each op returns a new tensor
    from the caching allocator (a @ b, torch.fft.fft(x), torch.randn(n)).
    """
    if work.startswith("sgemm"):
        n = int(work[len("sgemm"):])

        def alloc():
            a = torch.rand(n, n, device=dev, dtype=torch.float32) * 2 - 1
            b = torch.rand(n, n, device=dev, dtype=torch.float32) * 2 - 1
            c = torch.empty(n, n, device=dev, dtype=torch.float32)
            return (a, b, c)

        def launch(t):
            if style == "idiomatic":
                return t[0] @ t[1]
            torch.mm(t[0], t[1], out=t[2])

    elif work == "fft4096":
        n = 4096

        def alloc():
            x = torch.randn(n, device=dev, dtype=torch.complex64)
            y = torch.empty(n, device=dev, dtype=torch.complex64)
            return (x, y)

        def launch(t):
            if style == "idiomatic":
                return torch.fft.fft(t[0])
            torch.fft.fft(t[0], out=t[1])

    elif work == "rng1M":
        n = 1 << 20

        def alloc():
            return (torch.empty(n, device=dev, dtype=torch.float32),)

        def launch(t):
            if style == "idiomatic":
                return torch.randn(n, device=dev, dtype=torch.float32)
            t[0].normal_()

    else:
        raise ValueError("unknown workload " + work)
    return alloc, launch


def throughput(torch, work, args, dev, style="tuned"):
    """Round-robin launches over args.streams streams from this one thread.

    "tuned" switches streams with torch.cuda.set_stream; "idiomatic" enters a
    `with torch.cuda.stream(s):` block per launch, as user code does."""
    alloc, launch_on = make_launcher(torch, work, dev, style)
    if style == "idiomatic":
        def launch(t, s):
            with torch.cuda.stream(s):
                launch_on(t)
    else:
        def launch(t, s):
            torch.cuda.set_stream(s)
            launch_on(t)
    streams = [torch.cuda.Stream(device=dev) for _ in range(args.streams)]
    default = torch.cuda.current_stream(dev)
    sets = [alloc() for _ in streams]
    torch.cuda.synchronize(dev)  # inputs were made on the default stream
    k = len(streams)
    try:
        # Warm-up: kernels loaded, cuBLAS / cuFFT plans made on every stream.
        for _ in range(args.warmup):
            for i in range(k):
                launch(sets[i], streams[i])
        torch.cuda.synchronize(dev)

        ops = 0
        chunk = 64 * k  # check the clock once per chunk
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        deadline = t0 + args.seconds
        while True:
            for j in range(chunk):
                i = j % k
                launch(sets[i], streams[i])
            ops += chunk
            if time.perf_counter() >= deadline:
                break
        torch.cuda.synchronize(dev)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
    finally:
        torch.cuda.set_stream(default)
    return {
        "work": work,
        "style": style,
        "streams": k,
        "torch_ops_per_s": ops / wall,
        "ops": ops,
        "seconds": wall,
        "cpu_us_per_op": cpu * 1e6 / ops,
    }


def sync_latency(torch, n, reps, dev):
    """torch.mm + torch.cuda.synchronize() on the current stream, reps times."""
    a = torch.rand(n, n, device=dev, dtype=torch.float32)
    b = torch.rand(n, n, device=dev, dtype=torch.float32)
    c = torch.empty(n, n, device=dev, dtype=torch.float32)
    for _ in range(20):
        torch.mm(a, b, out=c)
    torch.cuda.synchronize(dev)
    us = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        torch.mm(a, b, out=c)
        torch.cuda.synchronize(dev)
        us.append((time.perf_counter_ns() - t0) / 1e3)
    us.sort()
    return {
        "work": "sgemm%d" % n,
        "median_us": nearest_rank(us, 0.5),
        "p99_us": nearest_rank(us, 0.99),
        "min_us": us[0],
        "reps": reps,
    }


def main(argv):
    args = parse_args(argv[1:])
    try:
        import torch
    except Exception as e:  # ImportError, or a broken installation
        sys.stderr.write("torch_small.py: PyTorch is not usable (%s); nothing to measure\n" % e)
        return EXIT_NO_GPU
    if not torch.cuda.is_available():
        sys.stderr.write("torch_small.py: torch %s sees no usable CUDA device; nothing to "
                         "measure\n" % torch.__version__)
        return EXIT_NO_GPU
    if args.device >= torch.cuda.device_count():
        sys.stderr.write("torch_small.py: there is no CUDA device %d (%d devices); nothing "
                         "to measure\n" % (args.device, torch.cuda.device_count()))
        return EXIT_NO_GPU

    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    # Same math as the C++ side: pedantic f32, no TF32.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    result = {
        "bench": "torch_peer",
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(argv),
        "peer_torch": [],
        "torch_sync_latency": [],
    }
    log = sys.stderr
    try:
        log.write("%-9s %-9s %8s %14s %12s\n"
                  % ("work", "style", "streams", "torch ops/s", "CPU us/op"))
        for w in args.work:
            for style in ("idiomatic", "tuned"):
                r = throughput(torch, w, args, dev, style)
                result["peer_torch"].append(r)
                log.write("%-9s %-9s %8d %14.0f %12.2f\n"
                          % (w, style, r["streams"], r["torch_ops_per_s"], r["cpu_us_per_op"]))
        log.write("%-9s %12s %12s\n" % ("mm+sync", "median us", "p99 us"))
        for n in LATENCY_SIZES:
            r = sync_latency(torch, n, args.reps, dev)
            result["torch_sync_latency"].append(r)
            log.write("%-9s %12.1f %12.1f\n" % (r["work"], r["median_us"], r["p99_us"]))
    except Exception as e:  # a CUDA or PyTorch error: report it, exit 1
        sys.stderr.write("torch_small.py: failed: %s: %s\n" % (type(e).__name__, e))
        return EXIT_FAILED

    text = json.dumps(result, indent=2) + "\n"
    if args.json == "-":
        sys.stdout.write(text)
    else:
        try:
            with open(args.json, "w") as f:
                f.write(text)
        except OSError as e:
            sys.stderr.write("torch_small.py: cannot write %s: %s\n" % (args.json, e))
            return EXIT_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
