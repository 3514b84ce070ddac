#!/usr/bin/env python3
"""Summarises the atomr-bench-* results (issue 5) into one JSON and a Markdown table.

Reads, from a results directory (default bench/results/), whichever of these
exist (a missing or unreadable one is skipped with a note on stderr):

  latency.json     {"latency": [{"work", "strategy", "median_us", "p99_us",
                    "raw_median_us", ...}], "idle_cpu_percent", "long_wait_cpu_percent"}
  throughput.json  {"throughput": [{"work", "io_threads", "coroutines", "ops_per_s",
                    "raw_ceiling_ops_per_s", ...}]}
  large.json       {"large": [{"work", "lib_ms", "raw_ms", ...}]}
  torch_peer.json  {"peer_torch": [{"work", "streams", "torch_ops_per_s"}]}
  throughput_streams.json  the same shape as throughput.json, from one io thread
                   and one actor (stream) per torch stream (atomr-bench-throughput
                   --threads 1 --actors 8): what is compared with torch's eight
                   streams from one Python thread; not a throughput-target row
  throughput_one_actor.json  the same shape, from one actor with default options
                   shared by every io thread (atomr-bench-throughput --actors 1
                   --default-actor): added to the throughput section as rows with
                   "config": "one_actor" (each against the raw ceiling of its own
                   run), judged by their own target (one_actor_vs_ceiling: T = 8)

  service_raw.json, service_json.json, service_isolated.json  atomr-load's --json
                   output (scripts/bench-service.sh: atomr-serve under 64 connections,
                   raw and JSON bodies in process, and isolated with injected faults)
  service_pipeline.json  atomr-bench-pipeline --variants serve_gemm: the library
                   doing the service's request in the same run ("service" rows)
  service_raw_t8.json, service_pipeline_t8.json  the same raw-body load and
                   library run with 8 io threads each (the service and the library)

each with "device", "date" and "command" (atomr-load's files have neither). Writes summary.json and summary.md
(the Markdown also goes to stdout) and evaluates the targets of issue 5.
When DIR/runs/*/ hold further complete runs (the same files), each target
case is also tabulated across them ("runs" in the JSON), because single
runs on a shared machine differ by more than some targets' margins.

Usage: scripts/bench-summary.py [DIR] [--out DIR]   (DIR: default bench/results of this checkout)
Exit status: 0 written, 1 no results (the directory is missing or holds none of
the files) or the output cannot be written, 64 bad usage. A failed target does
not change the status.
Python 3 standard library only.
"""

import json
import os
import sys

PROG = "bench-summary"
# bench/results of the checkout this script is in, whatever the working directory.
DEFAULT_DIR = os.path.relpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "results"))

# The targets of issue 5.
EMPTY_OVERHEAD_US = 1.0  # default strategy, empty stream
SGEMM_OVERHEAD_US = 1.5  # default strategy, sgemm: max(1.5 us, 2% of raw)
SGEMM_OVERHEAD_FRACTION = 0.02
THROUGHPUT_FRACTION = 0.90  # of the raw ceiling, sgemm64 and sgemm256, each T
THROUGHPUT_WORKS = ("sgemm64", "sgemm256")
# One default actor shared by every io thread (issue 18 item 11): >= 90% of
# the raw ceiling at T = 8 for every small workload.
ONE_ACTOR_WORKS = ("sgemm64", "sgemm256", "fft4096", "rng1M")
ONE_ACTOR_THREADS = 8
LARGE_RATIO = 1.01  # lib within 1% of raw
TORCH_FACTOR = 3.0  # ours >= 3x torch, every small workload, T = 1
LONG_WAIT_CPU_PERCENT = 25.0
# Issue 19: the composed unit against raw CUDA at 4 and 16 in flight, every
# variant against PyTorch.
PIPELINE_DEPTHS = (4, 16)
PIPELINE_REQ_RATIO = 1.0
PIPELINE_P50_RATIO = 1.15
PIPELINE_CPU_RATIO = 1.3
PIPELINE_TORCH_FACTOR = 5.0
PIPELINE_GRAPH_RATIO = {"graph": 1.5, "fused_graph": 1.7}  # req/s over raw, issue 19
PIPELINE_VARIANTS = ("per_op", "composed", "fused", "graph", "fused_graph")  # the variants
# Issue 20: the isolated device against the in-process one (same run).
ISOLATION_LATENCY_US = 5.0      # median overhead at sgemm 256
ISOLATION_THROUGHPUT = 0.8      # of in-process ops/s at T = 8
ISOLATION_BANDWIDTH = 0.9       # of in-process GB/s
ISOLATION_RECOVERY_S = 1.0      # median, fault to first successful op
# Issue 21: the reference service against the library doing the same work.
SERVICE_VS_LIBRARY = 0.9        # service req/s over the library's (serve_gemm unit)
SERVICE_FAILED_S_PER_FAULT = 1.5  # seconds of failed requests per injected fault

SOURCES = (
    ("latency", "latency.json"),
    ("throughput", "throughput.json"),
    ("large", "large.json"),
    ("peer", "torch_peer.json"),
    ("streams", "throughput_streams.json"),
    ("one_actor", "throughput_one_actor.json"),
    ("pipeline", "pipeline.json"),
    ("pipeline_torch", "torch_pipeline.json"),
    ("isolation", "isolation.json"),
    ("service_raw", "service_raw.json"),
    ("service_json", "service_json.json"),
    ("service_pipeline", "service_pipeline.json"),
    ("service_isolated", "service_isolated.json"),
    ("service_raw_t8", "service_raw_t8.json"),
    ("service_pipeline_t8", "service_pipeline_t8.json"),
)


def note(msg):
    print(f"{PROG}: {msg}", file=sys.stderr)


def num(v):
    """A finite float, or None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if v == v and v not in (float("inf"), float("-inf")) else None


def load(directory):
    """The parsed files by kind; a missing or bad file is left out with a note."""
    docs = {}
    for kind, name in SOURCES:
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            note(f"{path} not found: no {kind} results")
            continue
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            note(f"{path} skipped: {e}")
            continue
        if not isinstance(doc, dict):
            note(f"{path} skipped: not a JSON object")
            continue
        docs[kind] = doc
    return docs


def rows_of(doc, key, path, fields):
    """doc[key] as a list of dicts holding every field; others are skipped with a note."""
    rows = doc.get(key)
    if not isinstance(rows, list):
        note(f"{path}: no list '{key}'")
        return []
    out = []
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or any(f not in r for f in fields):
            missing = [f for f in fields if not isinstance(r, dict) or f not in r]
            note(f"{path}: {key}[{i}] skipped: missing {', '.join(missing)}")
            continue
        out.append(r)
    return out


def summarise(docs, directory):
    out = {"device": None, "date": None, "command": None}

    # Header: the device (warn if the files disagree), the latest date, the command.
    devices = {d.get("device") for d in docs.values() if d.get("device")}
    if len(devices) > 1:
        note(f"results come from different devices: {', '.join(sorted(devices))}")
    out["device"] = next((docs[k]["device"] for k, _ in SOURCES
                          if k in docs and docs[k].get("device")), "unknown")
    # Which file came from another device than the header's (the GPU host
    # lent an H100 for some runs): named per file, in the JSON and the table.
    out["other_devices"] = {f: docs[k]["device"] for k, f in SOURCES
                            if k in docs and docs[k].get("device")
                            and docs[k]["device"] != out["device"]}
    dates = sorted(d["date"] for d in docs.values() if isinstance(d.get("date"), str))
    out["date"] = dates[-1] if dates else None
    cmd_file = os.path.join(directory, "command.txt")
    if os.path.exists(cmd_file):
        # One command a line (scripts/bench.sh appends each one it runs);
        # lines starting with '#' are notes (where, which commit), kept apart.
        with open(cmd_file, encoding="utf-8") as f:
            lines = [line.strip() for line in f if line.strip()]
        out["command"] = "; ".join(x for x in lines if not x.startswith("#"))
        notes = [x.lstrip("# ").rstrip() for x in lines if x.startswith("#")]
        if notes:
            out["command_notes"] = " ".join(notes)
    else:
        cmds = [docs[k]["command"] for k, _ in SOURCES
                if k in docs and isinstance(docs[k].get("command"), str)]
        out["command"] = "; ".join(cmds)

    # Latency.
    latency = []
    if "latency" in docs:
        for r in rows_of(docs["latency"], "latency", "latency.json",
                         ("work", "strategy", "median_us", "p99_us", "raw_median_us")):
            med, raw = num(r["median_us"]), num(r["raw_median_us"])
            latency.append({
                "work": r["work"],
                "strategy": r["strategy"],
                "median_us": med,
                "p99_us": num(r["p99_us"]),
                "raw_median_us": raw,
                "overhead_us": med - raw if med is not None and raw is not None else None,
            })
            if "paired_overhead_us" in r:  # since session 8: median of per-repetition differences
                latency[-1]["paired_overhead_us"] = num(r["paired_overhead_us"])
    out["latency"] = latency

    # Throughput: the target rows (one actor per io thread, against T raw
    # threads) and, separately, one io thread driving several actors (streams).
    throughput = throughput_rows(docs, "throughput", "throughput.json")
    multi = throughput_rows(docs, "streams", "throughput_streams.json")
    # One default actor shared by every io thread: rows of their own kind in
    # the throughput section (each against the raw ceiling of its own run).
    one_actor = throughput_rows(docs, "one_actor", "throughput_one_actor.json")
    for r in one_actor:
        r["config"] = "one_actor"
    out["throughput"] = throughput + one_actor
    out["throughput_streams"] = multi

    # Large operations.
    large = []
    if "large" in docs:
        for r in rows_of(docs["large"], "large", "large.json", ("work", "lib_ms", "raw_ms")):
            lib, raw = num(r["lib_ms"]), num(r["raw_ms"])
            row = {"work": r["work"], "lib_ms": lib, "raw_ms": raw,
                   "ratio": lib / raw if lib is not None and raw else None}
            for extra in ("lib_p99_ms", "raw_p99_ms", "reps", "raw_call", "library_default"):
                if extra in r:
                    row[extra] = r[extra]
            if isinstance(r.get("check"), dict) and "ok" in r["check"]:
                row["check_ok"] = r["check"]["ok"]
            large.append(row)
    out["large"] = large

    # Peer: our best at io_threads == 1 against torch as users write it
    # ("idiomatic": a new output per op, `with torch.cuda.stream(s):`), the
    # way issue 5's reference figures were measured; torch with preallocated
    # outputs and set_stream ("tuned") is reported beside it.
    peer = []
    if "peer" in docs:
        by_style = {}
        for r in rows_of(docs["peer"], "peer_torch", "torch_peer.json",
                         ("work", "torch_ops_per_s")):
            v = num(r["torch_ops_per_s"])
            key = (r["work"], r.get("style", "tuned"))
            if v is not None and (key not in by_style or v > by_style[key][0]):
                by_style[key] = (v, r.get("streams"), num(r.get("cpu_us_per_op")))
        works = []
        for (work, _style) in by_style:
            if work not in works:
                works.append(work)
        for work in works:
            idiomatic = by_style.get((work, "idiomatic"))
            tuned = by_style.get((work, "tuned"))
            torch, streams, torch_cpu = idiomatic or tuned
            ours = [t for t in throughput + multi
                    if t["work"] == work and t["io_threads"] == 1 and t["ops_per_s"] is not None]
            best = max(ours, key=lambda t: t["ops_per_s"]) if ours else None
            # One actor (one stream, so at most one launch thread) as well: the
            # best row may use one launch thread per actor besides the io thread.
            single = [t for t in ours if t.get("actors") in (None, 1)]
            one = max(single, key=lambda t: t["ops_per_s"]) if single else None
            if best is None:
                note(f"peer {work}: no throughput result at io_threads == 1 to compare with")
            peer.append({
                "work": work,
                "ours_ops_per_s": best["ops_per_s"] if best else None,
                "torch_ops_per_s": torch,
                "torch_style": "idiomatic" if idiomatic else "tuned",
                "ratio": best["ops_per_s"] / torch if best and torch else None,
                "torch_tuned_ops_per_s": tuned[0] if tuned else None,
                "ratio_vs_tuned": best["ops_per_s"] / tuned[0] if best and tuned else None,
                "ours_coroutines": best["coroutines"] if best else None,
                "ours_streams": best.get("actors") if best else None,
                "ours_launch_threads": best.get("launch_threads") if best else None,
                "ours_cpu_us_per_op": best.get("cpu_us_per_op") if best else None,
                "torch_streams": streams,
                "torch_cpu_us_per_op": torch_cpu,
                "ours_one_actor_ops_per_s": one["ops_per_s"] if one else None,
                "ratio_one_actor": one["ops_per_s"] / torch if one and torch else None,
            })
    out["peer"] = peer

    # Request pipelines (issue 19): atomr-bench-pipeline's rows, each with the
    # PyTorch peer's req/s at the same in-flight depth when it ran.
    pipeline = []
    if "pipeline" in docs:
        torch_by_depth = {}
        if "pipeline_torch" in docs:
            for r in rows_of(docs["pipeline_torch"], "pipeline_torch", "torch_pipeline.json",
                             ("in_flight", "req_per_s")):
                torch_by_depth[r["in_flight"]] = num(r["req_per_s"])
        for r in rows_of(docs["pipeline"], "pipeline", "pipeline.json",
                         ("variant", "in_flight", "req_per_s", "p50_us", "p99_us",
                          "cpu_us_per_req", "raw_req_per_s", "raw_p50_us",
                          "raw_cpu_us_per_req")):
            row = {k: r[k] for k in ("variant", "in_flight")}
            for k in ("req_per_s", "p50_us", "p99_us", "cpu_us_per_req", "raw_req_per_s",
                      "raw_p50_us", "raw_cpu_us_per_req"):
                row[k] = num(r[k])
            row["torch_req_per_s"] = torch_by_depth.get(r["in_flight"])
            row["wrong"] = r.get("wrong")
            pipeline.append(row)
    out["pipeline"] = pipeline

    # The isolated device (issue 20): atomr-bench-isolation's rows as they are.
    isolation = []
    if "isolation" in docs:
        for r in rows_of(docs["isolation"], "isolation", "isolation.json",
                         ("metric", "work", "in_process", "isolated", "unit")):
            row = {k: r[k] for k in ("metric", "work", "unit")}
            for k in ("in_process", "isolated", "ratio", "difference"):
                row[k] = num(r.get(k))
            row["extra"] = r.get("extra")
            isolation.append(row)
    out["isolation"] = isolation

    out["service"] = service_rows(docs)

    lat = docs.get("latency", {})
    out["idle_cpu_percent"] = num(lat.get("idle_cpu_percent"))
    out["long_wait_cpu_percent"] = num(lat.get("long_wait_cpu_percent"))
    if "latency" in docs:
        for k in ("idle_cpu_percent", "long_wait_cpu_percent"):
            if out[k] is None:
                note(f"latency.json: no {k}")

    out["targets"] = targets(out)
    out["sources"] = {k: {"date": docs[k].get("date"), "command": docs[k].get("command")}
                      for k, _ in SOURCES if k in docs}
    return out


def service_rows(docs):
    """The service's runs (scripts/bench-service.sh): one row per atomr-load run,
    the in-process ones with the library's serve_gemm unit and raw CUDA of the
    same run beside them."""
    def library(key):
        """The serve_gemm and serve_gemm_alloc rows of one pipeline run."""
        lib, lib_alloc = {}, {}
        if key in docs:
            for r in rows_of(docs[key], "pipeline", key + ".json",
                             ("variant", "in_flight", "req_per_s", "raw_req_per_s")):
                if r["variant"] == "serve_gemm":
                    lib = r
                elif r["variant"] == "serve_gemm_alloc":
                    lib_alloc = r
        return lib, lib_alloc

    rows = []
    for kind, mode, lib_key in (("service_raw", "in_process_raw", "service_pipeline"),
                                ("service_json", "in_process_json", "service_pipeline"),
                                ("service_isolated", "isolated_faults", None),
                                ("service_raw_t8", "in_process_raw_8_threads",
                                 "service_pipeline_t8")):
        lib, lib_alloc = library(lib_key)
        d = docs.get(kind)
        if d is None:
            continue
        if any(k not in d for k in ("req_per_s", "ok", "wrong", "failed")):
            note(f"{kind}.json skipped: not atomr-load's --json output")
            continue
        row = {"mode": mode, "endpoint": d.get("endpoint"), "size": d.get("size"),
               "connections": d.get("connections"), "seconds": num(d.get("seconds")),
               "ok": d["ok"], "failed": d["failed"], "wrong": d["wrong"],
               "checked": d.get("checked"), "faults": d.get("faults", 0),
               "failed_seconds": num(d.get("failed_seconds")),
               "req_per_s": num(d["req_per_s"]), "p50_us": num(d.get("p50_us")),
               "p99_us": num(d.get("p99_us")),
               "server_cpu_us_per_req": num(d.get("server_cpu_us_per_req")),
               "client_cpu_us_per_req": num(d.get("client_cpu_us_per_req")),
               "server_threads": d.get("server_threads")}
        try:
            health = json.loads(d.get("health_after") or "{}")
        except ValueError:
            health = {}
        row["health_after"] = health.get("health")
        row["worker_restarts"] = health.get("worker_restarts")
        if mode.startswith("in_process") and lib:
            row["library_req_per_s"] = num(lib.get("req_per_s"))
            row["library_threads"] = (docs.get(lib_key) or {}).get("threads")
            row["library_in_flight"] = lib.get("in_flight")
            row["library_p99_us"] = num(lib.get("p99_us"))
            row["raw_req_per_s"] = num(lib.get("raw_req_per_s"))
            row["library_wrong"] = lib.get("wrong")
            row["library_cpu_us_per_req"] = num(lib.get("cpu_us_per_req"))
            if lib_alloc:  # the library with the service's per-request allocations
                row["library_alloc_req_per_s"] = num(lib_alloc.get("req_per_s"))
            if row["req_per_s"] is not None and row["library_req_per_s"]:
                row["vs_library"] = row["req_per_s"] / row["library_req_per_s"]
        rows.append(row)
    return rows


def throughput_rows(docs, key, path):
    """The rows of one atomr-bench-throughput JSON, with the fraction of its ceiling."""
    out = []
    if key not in docs:
        return out
    for r in rows_of(docs[key], "throughput", path,
                     ("work", "io_threads", "coroutines", "ops_per_s",
                      "raw_ceiling_ops_per_s")):
        ops, ceil = num(r["ops_per_s"]), num(r["raw_ceiling_ops_per_s"])
        row = {
            "work": r["work"],
            "io_threads": r["io_threads"],
            "coroutines": r["coroutines"],
            "actors": r.get("actors"),
            # Library threads that ran the batches' library calls besides the
            # io threads (device_options::launch_threads; absent before it).
            "launch_threads": r.get("launch_threads"),
            "cpu_us_per_op": num(r.get("cpu_us_per_op")),
            "ops_per_s": ops,
            "raw_ceiling_ops_per_s": ceil,
            "fraction_of_ceiling": ops / ceil if ops is not None and ceil else None,
        }
        # Lanes (one actor, several streams; since issue 18): what the actors
        # were made with and how many lanes they had made by the end.
        for extra in ("default_actor", "max_lanes", "lanes"):
            if extra in r:
                row[extra] = r[extra]
        # Paired rounds (atomr-bench-throughput --rounds): the fraction is
        # the median of the per-round ratios of adjacent windows, not the
        # ratio of the two sides' separate medians.
        rounds = r.get("round_ratio")
        if isinstance(rounds, list) and rounds and num(r.get("ratio")) is not None:
            row["fraction_of_ceiling"] = num(r["ratio"])
            row["rounds"] = len(rounds)
            row["round_fractions"] = rounds
        out.append(row)
    return out


def check(measured, limit, passed, **ids):
    c = dict(ids)
    c.update({"measured": measured, "limit": limit,
              "pass": None if measured is None else bool(passed)})
    return c


def target(description, unit, checks):
    """A target passes when it has checks and every one passes; null without data."""
    results = [c["pass"] for c in checks]
    if not checks or any(p is None for p in results):
        verdict = None
    else:
        verdict = all(results)
    return {"description": description, "unit": unit, "pass": verdict, "checks": checks}


def targets(s):
    t = {}

    # 1. Latency overhead of the default strategy.
    rows = [r for r in s["latency"] if r["strategy"] == "default"]
    strategy = "default"
    if not rows:
        rows = [r for r in s["latency"] if r["strategy"] == "event_poll"]
        strategy = "event_poll"
        if rows:
            note("latency: no 'default' strategy rows; using event_poll (the library default)")
    checks = []
    for r in rows:
        raw = r["raw_median_us"]
        if r["work"] in ("empty", "fill4"):
            limit = EMPTY_OVERHEAD_US
        elif r["work"].startswith("sgemm"):
            limit = max(SGEMM_OVERHEAD_US, SGEMM_OVERHEAD_FRACTION * raw) if raw is not None \
                else SGEMM_OVERHEAD_US
        else:
            continue
        m = r["overhead_us"]
        checks.append(check(m, limit, m is not None and m <= limit, work=r["work"],
                            strategy=strategy))
    t["latency_overhead"] = target(
        "default-strategy median overhead (median_us - raw_median_us): <= 1.0 us on empty "
        "and on fill4 (fill_bytes of 4 bytes vs cudaMemsetAsync + sync), "
        "<= max(1.5 us, 2% of raw) on sgemm256/1024/4096", "us", checks)

    # 2. Throughput against the raw ceiling, best coroutine count at each T.
    best = {}
    for r in s["throughput"]:
        if r.get("config") == "one_actor":
            continue  # judged below
        if r["work"] not in THROUGHPUT_WORKS or r["fraction_of_ceiling"] is None:
            continue
        if r.get("actors") not in (None, r["io_threads"]):
            continue  # the ceiling is T threads on T streams: compare T actors only
        key = (r["work"], r["io_threads"])
        if key not in best or r["fraction_of_ceiling"] > best[key]["fraction_of_ceiling"]:
            best[key] = r
    checks = [check(r["fraction_of_ceiling"], THROUGHPUT_FRACTION,
                    r["fraction_of_ceiling"] >= THROUGHPUT_FRACTION, work=r["work"],
                    io_threads=r["io_threads"], coroutines=r["coroutines"])
              for _, r in sorted(best.items(),
                                 key=lambda kv: (THROUGHPUT_WORKS.index(kv[0][0]), kv[0][1]))]
    t["throughput_vs_ceiling"] = target(
        "ops_per_s >= 90% of raw_ceiling_ops_per_s for sgemm64 and sgemm256 at each io_threads "
        "(best coroutine count)", "fraction", checks)

    # 2b. One default actor shared by every io thread, against the raw
    # ceiling of the same run (best coroutine count); only when measured.
    one = [r for r in s["throughput"] if r.get("config") == "one_actor"]
    if one:
        best = {}
        for r in one:
            if r["io_threads"] != ONE_ACTOR_THREADS or r["fraction_of_ceiling"] is None:
                continue
            if r["work"] not in best or r["fraction_of_ceiling"] > best[r["work"]]["fraction_of_ceiling"]:
                best[r["work"]] = r
        checks = []
        for work in ONE_ACTOR_WORKS:
            r = best.get(work)
            m = r["fraction_of_ceiling"] if r else None
            checks.append(check(m, THROUGHPUT_FRACTION, m is not None and m >= THROUGHPUT_FRACTION,
                                work=work, io_threads=ONE_ACTOR_THREADS))
        t["one_actor_vs_ceiling"] = target(
            "one actor with default options shared by 8 io threads: ops_per_s >= 90% of "
            "raw_ceiling_ops_per_s (8 raw threads, same run) for sgemm64, sgemm256, fft4096 and "
            "rng1M (best coroutine count)", "fraction", checks)

    # 3. Large operations within 1% of the raw call.
    # Rows marked library_default: false run the library in an opt-in
    # configuration (the convolution on cuDNN's legacy API): shown, not judged.
    checks = [check(r["ratio"], LARGE_RATIO, r["ratio"] is not None and r["ratio"] <= LARGE_RATIO,
                    work=r["work"]) for r in s["large"] if r.get("library_default", True)]
    t["large_vs_raw"] = target(
        "lib_ms / raw_ms <= 1.01 for every large operation (library in its default "
        "configuration; each raw call listed)", "ratio", checks)

    # 4. Ours against PyTorch at one io thread.
    checks = [check(r["ratio"], TORCH_FACTOR, r["ratio"] is not None and r["ratio"] >= TORCH_FACTOR,
                    work=r["work"]) for r in s["peer"]]
    t["peer_vs_torch"] = target(
        "ours_ops_per_s (io_threads == 1; one actor, or one per torch stream) >= 3x "
        "torch_ops_per_s on every small workload",
        "ratio", checks)

    # 5. CPU use during a long wait.
    m = s["long_wait_cpu_percent"]
    t["long_wait_cpu"] = target(
        "long_wait_cpu_percent <= 25", "percent",
        [check(m, LONG_WAIT_CPU_PERCENT, m <= LONG_WAIT_CPU_PERCENT)] if m is not None else [])

    # 6. Request pipelines (issue 19), only where atomr-bench-pipeline ran.
    if s.get("pipeline"):
        def ratio(a, b):
            return a / b if a is not None and b else None
        checks = []
        for r in s["pipeline"]:
            if r["variant"] != "composed" or r["in_flight"] not in PIPELINE_DEPTHS:
                continue
            q = ratio(r["req_per_s"], r["raw_req_per_s"])
            p = ratio(r["p50_us"], r["raw_p50_us"])
            c = ratio(r["cpu_us_per_req"], r["raw_cpu_us_per_req"])
            ids = {"variant": r["variant"], "in_flight": r["in_flight"]}
            checks.append(check(q, PIPELINE_REQ_RATIO, q is not None and q >= PIPELINE_REQ_RATIO,
                                metric="req_per_s / raw", **ids))
            checks.append(check(p, PIPELINE_P50_RATIO, p is not None and p <= PIPELINE_P50_RATIO,
                                metric="p50 / raw", **ids))
            checks.append(check(c, PIPELINE_CPU_RATIO, c is not None and c <= PIPELINE_CPU_RATIO,
                                metric="cpu / raw", **ids))
        t["pipeline_composed_vs_raw"] = target(
            "composed unit at 4 and 16 in flight: req/s >= 1.0x raw, p50 <= 1.15x raw, CPU per "
            "request <= 1.3x raw (same run)", "ratio", checks)
        checks = []
        for r in s["pipeline"]:
            want = PIPELINE_GRAPH_RATIO.get(r["variant"])
            if want is None:
                continue
            q = ratio(r["req_per_s"], r["raw_req_per_s"])
            checks.append(check(q, want, q is not None and q >= want, metric="req_per_s / raw",
                                variant=r["variant"], in_flight=r["in_flight"]))
        t["pipeline_graph_vs_raw"] = target(
            "graph replay >= 1.5x raw req/s, fused epilogue + graph >= 1.7x, at every in-flight "
            "depth (same run)", "ratio", checks)
        checks = []
        for r in s["pipeline"]:
            if r["variant"] not in PIPELINE_VARIANTS:  # a diagnostic (composed_own, raw_graph)
                continue
            q = ratio(r["req_per_s"], r["torch_req_per_s"])
            checks.append(check(q, PIPELINE_TORCH_FACTOR,
                                q is not None and q >= PIPELINE_TORCH_FACTOR,
                                variant=r["variant"], in_flight=r["in_flight"]))
        t["pipeline_vs_torch"] = target(
            "every pipeline variant >= 5x PyTorch req/s at the same in-flight depth", "ratio",
            checks)

    # 7. The isolated device (issue 20), only where atomr-bench-isolation ran.
    if s.get("isolation"):
        def rows(metric, pred=lambda r: True):
            return [r for r in s["isolation"] if r["metric"] == metric and pred(r)]
        checks = [check(r["difference"], ISOLATION_LATENCY_US,
                        r["difference"] is not None and r["difference"] <= ISOLATION_LATENCY_US,
                        work=r["work"])
                  for r in rows("latency", lambda r: r["work"] == "sgemm256")]
        t["isolation_latency"] = target(
            "isolated latency overhead <= 5 us median at sgemm 256", "us", checks)
        checks = [check(r["ratio"], ISOLATION_THROUGHPUT,
                        r["ratio"] is not None and r["ratio"] >= ISOLATION_THROUGHPUT,
                        work=r["work"])
                  for r in rows("throughput", lambda r: r["work"].endswith("T=8"))]
        t["isolation_throughput"] = target(
            "isolated throughput >= 80% of in-process at T = 8", "ratio", checks)
        checks = [check(r["ratio"], ISOLATION_BANDWIDTH,
                        r["ratio"] is not None and r["ratio"] >= ISOLATION_BANDWIDTH,
                        work=r["work"])
                  for r in rows("bandwidth")]
        t["isolation_bandwidth"] = target(
            "isolated 256 MiB upload and download bandwidth >= 90% of in-process", "ratio",
            checks)
        checks = [check(r["isolated"], ISOLATION_RECOVERY_S,
                        r["isolated"] is not None and 0 < r["isolated"] <= ISOLATION_RECOVERY_S,
                        work=r["work"])
                  for r in rows("recovery")]
        t["isolation_recovery"] = target(
            "recovery (fault to first successful op) <= 1 s median", "s", checks)

    # 8. The reference service (issue 21), only where bench-service.sh ran.
    if s.get("service"):
        checks = [check(r.get("vs_library"), SERVICE_VS_LIBRARY,
                        r.get("vs_library") is not None and r["vs_library"] >= SERVICE_VS_LIBRARY,
                        mode=r["mode"])
                  for r in s["service"] if r["mode"].startswith("in_process_raw")]
        t["service_vs_library"] = target(
            "the service >= 90% of the library's req/s for the same work (raw bodies)", "ratio",
            checks)
        checks = [check(r["wrong"] + (r.get("library_wrong") or 0), 0,
                        r["wrong"] == 0 and not r.get("library_wrong") and r.get("checked"),
                        mode=r["mode"])
                  for r in s["service"]]
        t["service_wrong"] = target("0 wrong responses, every one checked", "count", checks)
        checks = []
        for r in s["service"]:
            if r["mode"] != "isolated_faults":
                continue
            per = (r["failed_seconds"] / r["faults"]
                   if r["faults"] and r["failed_seconds"] is not None else None)
            checks.append(check(per, SERVICE_FAILED_S_PER_FAULT,
                                per is not None and per <= SERVICE_FAILED_S_PER_FAULT
                                and r["health_after"] == "healthy" and r["ok"] > 0,
                                mode=r["mode"]))
        t["service_isolated_fault"] = target(
            "isolated: an injected fault costs <= 1.5 s of failed requests; serving after",
            "s", checks)

    verdicts = [v["pass"] for v in t.values()]
    t["all_pass"] = None if any(v is None for v in verdicts) else all(verdicts)
    return t


# ------------------------------------------------------------------ Markdown

def fmt(v, digits=3):
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v == 0:
            return "0"
        a = abs(v)
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 100:
            return f"{v:.1f}"
        return f"{v:.{digits}g}" if a < 1 else f"{v:.{digits}f}".rstrip("0").rstrip(".")
    return str(v)


def verdict(p):
    return "n/a" if p is None else ("pass" if p else "**FAIL**")


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return lines


def markdown(s):
    others = "".join(f"; {f}: {d}" for f, d in (s.get("other_devices") or {}).items())
    md = [f"Device: {s['device']}{others}; date: {s['date'] or 'n/a'}.", "",
          f"Command: `{s['command']}`" if s["command"] else "Command: n/a", ""]
    if s.get("command_notes"):
        md += [s["command_notes"], ""]

    md += ["**Completion latency** (medians of one awaited operation; overhead = median - raw)",
           ""]
    if s["latency"]:
        md += table(["work", "strategy", "median us", "p99 us", "raw median us", "overhead us"],
                    [[r["work"], r["strategy"], fmt(r["median_us"]), fmt(r["p99_us"]),
                      fmt(r["raw_median_us"]), fmt(r["overhead_us"])] for r in s["latency"]])
    else:
        md.append("no latency results")
    md += ["", f"CPU: idle {fmt(s['idle_cpu_percent'])}%, during a long wait "
               f"{fmt(s['long_wait_cpu_percent'])}% of one core.", ""]

    def pct(x):
        return "n/a" if x is None else f"{100 * x:.1f}%"

    def spread(r):
        f = [num(x) for x in r.get("round_fractions", [])]
        f = [x for x in f if x is not None]
        return f"{pct(min(f))} .. {pct(max(f))} ({len(f)})" if f else "-"

    per_thread = [r for r in s["throughput"] if r.get("config") != "one_actor"]
    one_actor = [r for r in s["throughput"] if r.get("config") == "one_actor"]
    md += ["**Throughput** (small operations; T = io threads, one actor per io thread)", ""]
    if per_thread:
        md += table(["work", "T", "coroutines", "ops/s", "raw ceiling ops/s", "of ceiling",
                     "per round: min .. max (rounds)"],
                    [[r["work"], r["io_threads"], r["coroutines"], fmt(r["ops_per_s"]),
                      fmt(r["raw_ceiling_ops_per_s"]), pct(r["fraction_of_ceiling"]), spread(r)]
                     for r in per_thread])
        if any(r.get("rounds") for r in per_thread):
            md += ["", "Paired rounds: each round is an ours window and the raw window right "
                   "after it; \"of ceiling\" is the median of the rounds' ratios, ops/s and the "
                   "ceiling are the medians of each side."]
    else:
        md.append("no throughput results")
    md.append("")
    if one_actor:
        md += ["**One default actor** (one actor with default options shared by T io threads; "
               "lanes made on demand; against T raw threads of the same run)", ""]
        md += table(["work", "T", "coroutines", "lanes", "ops/s", "raw ceiling ops/s",
                     "of ceiling", "per round: min .. max (rounds)"],
                    [[r["work"], r["io_threads"], r["coroutines"], r.get("lanes", "n/a"),
                      fmt(r["ops_per_s"]), fmt(r["raw_ceiling_ops_per_s"]),
                      pct(r["fraction_of_ceiling"]), spread(r)] for r in one_actor])
        md.append("")

    md += ["**Large operations** (library vs the raw call, medians)", ""]
    if s["large"]:
        md += table(["work", "lib ms", "raw ms", "lib/raw", "raw call"],
                    [[r["work"] + ("" if r.get("library_default", True) else " (opt-in config)"),
                      fmt(r["lib_ms"], 4), fmt(r["raw_ms"], 4), fmt(r["ratio"], 4),
                      r.get("raw_call", "")]
                     for r in s["large"]])
    else:
        md.append("no large-operation results")
    md.append("")

    if s.get("throughput_streams"):
        md += ["**One io thread, several actors** (T = 1, one stream per actor, against "
               "one raw thread on one stream; not a target row: compared with torch below)", ""]
        md += table(["work", "actors (streams)", "coroutines", "ops/s",
                     "one-stream raw ops/s"],
                    [[r["work"], r.get("actors"), r["coroutines"], fmt(r["ops_per_s"]),
                      fmt(r["raw_ceiling_ops_per_s"])] for r in s["throughput_streams"]])
        md.append("")

    md += ["**Against PyTorch** (ours at T = 1, best of one actor and one actor per torch "
           "stream; torch on 8 streams from one Python thread, as users write it "
           "(idiomatic) and with preallocated outputs (tuned). With launch threads, "
           "each busy actor's library calls run on a library thread besides the one io "
           "thread: CPU per operation is the whole process's, both sides)", ""]
    if s["peer"]:
        md += table(["work", "ours streams (launch threads)", "ours ops/s",
                     "torch ops/s (idiomatic)", "ours/torch", "one actor: ours/torch",
                     "ours CPU us/op", "torch CPU us/op", "torch ops/s (tuned)",
                     "ours/tuned"],
                    [[r["work"],
                      f'{r.get("ours_streams")} ({r.get("ours_launch_threads", "-")})',
                      fmt(r["ours_ops_per_s"]), fmt(r["torch_ops_per_s"]), fmt(r["ratio"]),
                      fmt(r.get("ratio_one_actor")), fmt(r.get("ours_cpu_us_per_op")),
                      fmt(r.get("torch_cpu_us_per_op")), fmt(r.get("torch_tuned_ops_per_s")),
                      fmt(r.get("ratio_vs_tuned"))] for r in s["peer"]])
    else:
        md.append("no peer results")
    md.append("")

    if s.get("service"):
        md += ["**The reference service** (atomr-serve + atomr-load, 64 connections; the "
               "library's serve_gemm unit and raw CUDA doing the same request in the same run)",
               ""]
        md += table(["mode", "endpoint, n", "req/s", "p50 us", "p99 us", "ok", "failed",
                     "wrong", "faults", "failed s", "library req/s", "service / library",
                     "raw req/s"],
                    [[r["mode"], f'{r["endpoint"]} {r["size"]}', fmt(r["req_per_s"]),
                      fmt(r["p50_us"]), fmt(r["p99_us"]), r["ok"], r["failed"], r["wrong"],
                      r["faults"], fmt(r["failed_seconds"]), fmt(r.get("library_req_per_s")),
                      fmt(r.get("vs_library")), fmt(r.get("raw_req_per_s"))]
                     for r in s["service"]])
        md.append("")

    md += ["**Targets of issue 5**", ""]
    rows = []
    for name, t in s["targets"].items():
        if name == "all_pass":
            continue
        if not t["checks"]:
            rows.append([name, "no data", "", "", "n/a"])
        for c in t["checks"]:
            rows.append([name, case_label(c), fmt(c["measured"], 4), fmt(c["limit"], 4),
                         verdict(c["pass"])])
    md += table(["target", "case", "measured", "limit", "result"], rows)
    md += ["", f"All targets: {verdict(s['targets']['all_pass'])}."]
    if s.get("runs"):
        md += runs_markdown(s["runs"])
    return "\n".join(md) + "\n"


def case_label(c):
    ids = ", ".join(str(c[k]) if k == "work" else f"{k}={c[k]}"
                    for k in c if k not in ("measured", "limit", "pass"))
    return ids or "-"


def runs_markdown(runs):
    """Every target case across the runs under runs/: the spread a noisy machine gives."""
    md = ["", f"**Across runs** ({len(runs)} runs under `runs/`: "
          + ", ".join(r["name"] for r in runs) + ")", ""]
    order, values = [], {}
    for i, r in enumerate(runs):
        for name, t in r["targets"].items():
            if name == "all_pass":
                continue
            for c in t["checks"]:
                key = (name, case_label(c))
                if key not in values:
                    order.append(key)
                    values[key] = [None] * len(runs)
                values[key][i] = c
    rows = []
    for key in order:
        cs = values[key]
        passed = sum(1 for c in cs if c and c["pass"])
        have = sum(1 for c in cs if c and c["pass"] is not None)
        rows.append([key[0], key[1]] + [fmt(c["measured"], 4) if c else "n/a" for c in cs]
                    + [f"{passed} of {have}"])
    md += table(["target", "case"] + [r["name"] for r in runs] + ["passed"], rows)
    return md


def load_runs(directory):
    """Summaries of the complete runs kept in directory/runs/*/ (oldest name first)."""
    root = os.path.join(directory, "runs")
    if not os.path.isdir(root):
        return []
    out = []
    for name in sorted(os.listdir(root)):
        sub = os.path.join(root, name)
        if not os.path.isdir(sub):
            continue
        docs = load(sub)
        if not docs:
            continue
        r = summarise(docs, sub)
        out.append({"name": name, "date": r["date"], "targets": r["targets"]})
    return out


def main(argv):
    out_dir, positional = None, []
    args = list(argv)
    while args:
        a = args.pop(0)
        if a in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        if a == "--out" or a.startswith("--out="):
            out_dir = a.split("=", 1)[1] if "=" in a else (args.pop(0) if args else "")
            if not out_dir:
                note("--out needs a directory")
                return 64
        elif a.startswith("-"):
            note(f"unknown option {a} (try --help)")
            return 64
        else:
            positional.append(a)
    if len(positional) > 1:
        note(f"unexpected argument {positional[1]} (try --help)")
        return 64
    directory = positional[0] if positional else DEFAULT_DIR
    out_dir = out_dir or directory
    if not os.path.isdir(directory):
        note(f"{directory}: no such directory")
        return 1

    docs = load(directory)
    if not docs:
        note(f"no results in {directory}; nothing written")
        return 1
    s = summarise(docs, directory)
    runs = load_runs(directory)
    if runs:
        s["runs"] = runs
    md = markdown(s)
    try:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(s, f, indent=2)
            f.write("\n")
        with open(os.path.join(out_dir, "summary.md"), "w", encoding="utf-8") as f:
            f.write(md)
    except OSError as e:
        note(f"cannot write the summary: {e}")
        return 1
    sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
