#!/usr/bin/env python3
"""Symbolises bench/tools/sampler.cpp output and prints where CPU time goes.

  python3 scripts/sampler-report.py SAMPLES.txt [--bin DIR] [--top N] [--focus SUBSTR]

Frames in modules found under --bin (copies of the binaries that ran, e.g.
the device run's libatomr-accel-cuda.so and bench program) are resolved with
addr2line; others by the exported symbol dladdr found, or the module name.
"""
import argparse, collections, os, subprocess, sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("samples")
    ap.add_argument("--bin", default=None)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--focus", default=None, help="only samples with a frame containing this")
    ap.add_argument("--threads", action="store_true",
                    help="also print each thread's share of the samples and its top frames")
    ap.add_argument("--callers", default=None,
                    help="also print who calls the frames containing this (3 frames up)")
    a = ap.parse_args()
    stacks, tids = [], []
    for line in open(a.samples, errors="replace"):
        line = line.rstrip("\n")
        if not line:
            continue
        fields = line.split("\t")
        tid = fields.pop(0) if fields[0].startswith("T") else "T?"
        stacks.append(fields)
        tids.append(tid)
    local = {}
    if a.bin:
        for f in os.listdir(a.bin):
            local[f] = os.path.join(a.bin, f)
    # Collect offsets per local module for one addr2line call each.
    want = collections.defaultdict(set)
    for st in stacks:
        for fr in st:
            mod, _, rest = fr.partition("+")
            base = os.path.basename(mod)
            if base in local:
                want[base].add(rest.split(" ")[0])
    resolved = {}
    for base, offs in want.items():
        offs = sorted(offs)
        out = subprocess.run(["addr2line", "-f", "-C", "-i", "-e", local[base]] + offs,
                             capture_output=True, text=True).stdout.splitlines()
        # With -i a frame may expand to several (inlined) pairs; keep the
        # outermost function (last pair) per address by re-running per chunk
        # would be slow, so take pairs in order and stop at the next address.
        # Simpler: resolve without -i for names.
        out = subprocess.run(["addr2line", "-f", "-C", "-e", local[base]] + offs,
                             capture_output=True, text=True).stdout.splitlines()
        for i, off in enumerate(offs):
            name = out[2 * i] if 2 * i < len(out) else "?"
            resolved[(base, off)] = short(name) + " [" + base + "]"

    def name(fr):
        mod, _, rest = fr.partition("+")
        base = os.path.basename(mod)
        off, _, sym = rest.partition(" ")
        if (base, off) in resolved:
            return resolved[(base, off)]
        if sym and sym != "-":
            d = subprocess.run(["c++filt", sym], capture_output=True, text=True).stdout.strip()
            return short(d) + " [" + base + "]"
        return "[" + base + "]"

    cache = {}
    def nm(fr):
        if fr not in cache:
            cache[fr] = name(fr)
        return cache[fr]

    if a.focus:
        keep = [i for i, st in enumerate(stacks) if any(a.focus in nm(fr) for fr in st)]
        stacks = [stacks[i] for i in keep]
        tids = [tids[i] for i in keep]
    n = len(stacks)
    print(f"{n} samples")
    flat, incl = counts(stacks, nm)
    modflat = collections.Counter(nm(st[0]).rsplit("[", 1)[-1] for st in stacks if st)
    print("\n== leaf module")
    for k, v in modflat.most_common(20):
        print(f"{100*v/n:6.1f}%  {k}")
    print("\n== leaf function")
    for k, v in flat.most_common(a.top):
        print(f"{100*v/n:6.1f}%  {k}")
    print("\n== inclusive")
    for k, v in incl.most_common(a.top * 2):
        print(f"{100*v/n:6.1f}%  {k}")
    if a.threads:
        print_threads(stacks, tids, nm, n)
    if a.callers:
        calls = collections.Counter()
        for st in stacks:
            names = [nm(fr) for fr in st]
            for i, x in enumerate(names):
                if a.callers in x:
                    calls[" <- ".join(names[i + 1:i + 4])] += 1
                    break
        print(f"\n== callers of {a.callers}")
        for k, v in calls.most_common(a.top):
            print(f"{100*v/n:6.1f}%  {k}")


def counts(stacks, nm):
    """Samples per leaf frame, and per frame anywhere in the stack (once per sample)."""
    leaf = collections.Counter(nm(st[0]) for st in stacks if st)
    incl = collections.Counter()
    for st in stacks:
        incl.update(set(nm(fr) for fr in st))
    return leaf, incl


def print_threads(stacks, tids, nm, n):
    """Per thread: its share of all samples, a role guessed from its frames, its top leaves."""
    by = collections.defaultdict(list)
    for st, t in zip(stacks, tids):
        by[t].append(st)
    print("\n== threads (share of all samples; role from the frames seen)")
    for t, sts in sorted(by.items(), key=lambda kv: -len(kv[1])):
        names = set(nm(fr) for st in sts for fr in st)
        role = ("launch thread" if any("launcher_loop" in x for x in names) else
                "io thread" if any("scheduler::run" in x or "io_context::run" in x for x in names)
                else "other")
        print(f"{100*len(sts)/n:6.1f}%  {t} ({role}, {len(sts)} samples)")
        leaf, incl = counts(sts, nm)
        for k, v in leaf.most_common(8):
            print(f"          {100*v/len(sts):6.1f}%  {k}")
        print("          -- inclusive")
        for k, v in incl.most_common(14):
            print(f"          {100*v/len(sts):6.1f}%  {k}")


def short(s):
    # Drop template arguments and parameter lists to keep lines readable.
    out, depth = [], 0
    for ch in s:
        if ch in "<(":
            if depth == 0:
                out.append("<>" if ch == "<" else "()")
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    return "".join(out)[:160]


if __name__ == "__main__":
    main()
