#!/usr/bin/env python3
"""PyTorch peer of atomr-bench-pipeline (issue 19): the same request.

One request: a pageable (numpy-backed CPU) n x n float32 input copied into a
pinned staging tensor, then to the GPU (non_blocking), torch.mm with GPU-resident
weights (TF32 off), relu, copied back into pinned staging (non_blocking), one
synchronisation of the request's stream, the result copied out of staging and
one element checked against a float64 reference.

--threads Python threads (default 4), each with its own torch.cuda.Stream and
--in-flight / threads requests in flight (each slot its own tensors and event;
a slot's event is synchronised before the slot is reused: one sync per
request). req/s over a timed window after a warm-up, p50 and p99 latency from a
request's start to its sync, process CPU time per request.

Writes JSON to --json PATH (default: stdout): {"device", "date", "command",
"n", "threads", "pipeline_torch": [{"in_flight", "req_per_s", "p50_us",
"p99_us", "cpu_us_per_req", "wrong"}]}; the summary goes to stderr.
Exit status: 0 success, 1 a wrong result, 64 usage error, 69 no torch or no
usable CUDA device.
"""

import datetime
import json
import math
import sys
import threading
import time

from peer_common import EXIT_NO_GPU, EXIT_USAGE, UsageParser  # noqa: F401

EXIT_WRONG = 1


def parse_args(argv):
    p = UsageParser(prog="torch_pipeline.py",
                    description="PyTorch peer of atomr-bench-pipeline.")
    p.add_argument("--json", metavar="PATH", default="-")
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--in-flight", default="4,16,512",
                   help="comma separated requests in flight (default 4,16,512)")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--warmup", type=float, default=0.3)
    p.add_argument("--device", type=int, default=0)
    a = p.parse_args(argv)
    try:
        a.in_flight = [int(x) for x in a.in_flight.split(",")]
    except ValueError:
        p.error("--in-flight wants comma separated integers")
    if any(f < 1 or f > 4096 for f in a.in_flight):
        p.error("--in-flight wants counts in 1..4096")
    if not 1 <= a.n <= 8192:
        p.error("--n wants 1..8192")
    if not 1 <= a.threads <= 64:
        p.error("--threads wants 1..64")
    if not 0 < a.seconds <= 60:
        p.error("--seconds wants a number in (0, 60]")
    return a


def percentile(sorted_values, p):
    if not sorted_values:
        return 0.0
    k = max(1, min(len(sorted_values), int(math.ceil(p * len(sorted_values)))))
    return sorted_values[k - 1]


def main(argv):
    a = parse_args(argv)
    try:
        import numpy as np
        import torch
    except ImportError as e:
        sys.stderr.write("torch_pipeline.py: %s\n" % e)
        return EXIT_NO_GPU
    if not torch.cuda.is_available():
        sys.stderr.write("torch_pipeline.py: no usable CUDA device\n")
        return EXIT_NO_GPU
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda", a.device)
    n = a.n
    rng = np.random.default_rng(1)
    w_host = (rng.random((n, n), dtype=np.float32) - 0.5)
    w = torch.from_numpy(w_host).to(dev)
    inputs = []
    for i in range(64):
        x = (np.random.default_rng(i + 2).random((n, n), dtype=np.float32) - 0.5)
        r, c = (i * 7919) % n, (i * 104729) % n
        terms = x[r, :].astype(np.float64) * w_host[:, c].astype(np.float64)
        inputs.append((x, r, c, max(float(terms.sum()), 0.0), 1e-5 * float(abs(terms).sum()) + 1e-6))

    rows = []
    wrong_total = 0
    for in_flight in a.in_flight:
        threads = min(a.threads, in_flight)
        lat = [[] for _ in range(threads)]
        wrong = [0] * threads
        start = time.perf_counter() + a.warmup
        end = start + a.seconds

        def worker(t, depth):
            stream = torch.cuda.Stream(device=dev)
            slots = []
            for s in range(depth):
                x, r, c, ref, tol = inputs[(t * 131 + s) % len(inputs)]
                slots.append({
                    "x": x, "r": r, "c": c, "ref": ref, "tol": tol,
                    "pin_in": torch.empty((n, n), dtype=torch.float32).pin_memory(),
                    "pin_out": torch.empty((n, n), dtype=torch.float32).pin_memory(),
                    "out": np.empty((n, n), dtype=np.float32),
                    "event": torch.cuda.Event(), "busy": False, "t0": 0.0,
                })
            running = True
            while running:
                running = False
                for s in slots:
                    if s["busy"]:
                        s["event"].synchronize()
                        s["out"][...] = s["pin_out"].numpy()
                        t1 = time.perf_counter()
                        if s["t0"] >= start and t1 <= end:
                            lat[t].append((t1 - s["t0"]) * 1e6)
                        got = float(s["out"][s["r"], s["c"]])
                        if not math.isfinite(got) or abs(got - s["ref"]) > s["tol"]:
                            wrong[t] += 1
                        s["busy"] = False
                    s["t0"] = time.perf_counter()
                    if s["t0"] >= end:
                        continue
                    running = True
                    with torch.cuda.stream(stream):
                        s["pin_in"].numpy()[...] = s["x"]
                        g = s["pin_in"].to(dev, non_blocking=True)
                        y = torch.relu(torch.mm(g, w))
                        s["pin_out"].copy_(y, non_blocking=True)
                        s["event"].record(stream)
                    s["busy"] = True

        pool = [threading.Thread(target=worker,
                                 args=(t, in_flight // threads + (1 if t < in_flight % threads else 0)))
                for t in range(threads)]
        for th in pool:
            th.start()
        time.sleep(max(0.0, start - time.perf_counter()))
        cpu0 = time.process_time()
        time.sleep(max(0.0, end - time.perf_counter()))
        cpu1 = time.process_time()
        for th in pool:
            th.join()
        all_lat = sorted(x for l in lat for x in l)
        reqs = len(all_lat)
        row = {
            "in_flight": in_flight,
            "req_per_s": reqs / a.seconds,
            "p50_us": percentile(all_lat, 0.5),
            "p99_us": percentile(all_lat, 0.99),
            "cpu_us_per_req": (cpu1 - cpu0) * 1e6 / reqs if reqs else 0.0,
            "wrong": sum(wrong),
        }
        wrong_total += row["wrong"]
        rows.append(row)
        sys.stderr.write("torch in_flight %4d: %9.0f req/s  p50 %8.1f us  p99 %8.1f us  "
                         "CPU %7.1f us/req  wrong %d\n"
                         % (in_flight, row["req_per_s"], row["p50_us"], row["p99_us"],
                            row["cpu_us_per_req"], row["wrong"]))
    out = {
        "device": torch.cuda.get_device_name(dev),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(["python3", "bench/peers/torch_pipeline.py"] + list(argv)),
        "n": n,
        "threads": a.threads,
        "pipeline_torch": rows,
    }
    text = json.dumps(out, indent=1)
    if a.json == "-":
        print(text)
    else:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    return EXIT_WRONG if wrong_total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
