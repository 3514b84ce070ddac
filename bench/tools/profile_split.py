#!/usr/bin/env python3
"""Splits a pipeline profile (bench/tools/sampler.cpp samples) of raw and composed (composed, 16 in flight, H100) by thread role
and turn each frame's inclusive share into us per request, as session 38 did.

  python3 bench/tools/profile_split.py SAMPLES.txt.gz [RAW_CPU_US COMPOSED_CPU_US]

(session 43's samples: pipe-samples.txt.gz inside
bench/results/runs/2026-12-07-session43/call2-extra.tgz, with 100.3 131.1)

Roles: raw = threads with cublasSgemm_v2 frames (raw_thread's four), composed =
threads with cublasLtMatmul and cudnnActivationForward frames (the four io threads;
no launch or poll thread took samples), fused (session 38's file: cublasLtMatmul
only) left out.
  python3 bench/tools/profile_split.py bench/results/runs/2026-12-07T0415Z-session38/pipe-samples.txt.gz 108.3 128.8 Samples under one-time setup calls (handle creation, library
loading, pinned allocation) are left out of both. Frames are matched by the
dynamic symbol dladdr found at sampling time (exported functions); libc's memmove
is local, so it is matched by offset (the rep movsb of __memmove_avx_unaligned_erms
in the device's Ubuntu 24.04 libc, 0x1a19d0..0x1a19df, plus that function's range).
"""
import collections, gzip, re, subprocess, sys

if len(sys.argv) < 2:
    sys.exit(__doc__)
path = sys.argv[1]
# CPU us per request of each phase (prof.log; session 38's from performance.md: raw 108.3, composed 128.8)
CPU = {"raw": float(sys.argv[2]) if len(sys.argv) > 2 else 100.3,
       "comp": float(sys.argv[3]) if len(sys.argv) > 3 else 131.1}

samples = []
for line in gzip.open(path, "rt"):
    f = line.rstrip("\n").split("\t")
    st = []
    for fr in f[1:]:
        mod, _, rest = fr.partition("+")
        off, _, sym = rest.partition(" ")
        st.append((mod.rsplit("/", 1)[-1], int(off, 16), sym))
    samples.append((f[0], st))

syms_by_thread = collections.defaultdict(set)
for t, st in samples:
    syms_by_thread[t].update(s for _, _, s in st)
role = {}
for t, ss in syms_by_thread.items():
    role[t] = ("raw" if "cublasSgemm_v2" in ss else
               "comp" if "cublasLtMatmul" in ss and "cudnnActivationForward" in ss else
               "fused" if "cublasLtMatmul" in ss else "other")

SETUP = re.compile(r"cuLibraryLoadData|LibraryLoader|cudnnCreate|cublasCreate|cublasLtCreate|"
                   r"cuMemHostAlloc|cudaHostAlloc|cudaFreeHost|cuMemFreeHost|TracebackLogger|"
                   r"cudaStreamCreate|cudaEventCreate|cudaMalloc$|cuLibraryUnload|cudaSetDevice|"
                   r"cudaFree$|cuStreamDestroy|cudaEventDestroy")
n = collections.Counter()
kept = []
dropped = collections.Counter()
for t, st in samples:
    r = role[t]
    if r in ("other", "fused"):
        continue
    if any(SETUP.search(s) for _, _, s in st if s != "-"):
        dropped[r] += 1
        continue
    n[r] += 1
    kept.append((r, st))

CUDA_MODS = ("libcuda.so", "libcudart", "libcublas", "libcudnn", "libnv")
OWN_MODS = ("libatomr-accel-cuda.so", "atomr-bench-pipeline")


def is_memmove(fr):
    m, o, _ = fr
    return m == "libc.so.6" and 0x1a1600 <= o < 0x1a2000


def has(st, *names):
    return any(s in names for _, _, s in st)


def under_cuda(st, i):
    """Frame i has a CUDA library frame above it (its caller chain)."""
    return any(m.startswith(CUDA_MODS) for m, _, _ in st[i + 1:])


rows = [
    ("libc memmove, the two 256 KiB staging copies (leaf, called from the bench or the library)",
     lambda st: is_memmove(st[0]) and len(st) > 1 and st[1][0] in OWN_MODS),
    ("gemm: `cublasSgemm_v2` (raw) / `cublasLtMatmul` (composed)",
     lambda st: has(st, "cublasSgemm_v2", "cublasLtMatmul")),
    ("  of which `cublasLtSSSMatmulAlgoGetHeuristic`", lambda st: has(st, "cublasLtSSSMatmulAlgoGetHeuristic")),
    ("`cudnnActivationForward`", lambda st: has(st, "cudnnActivationForward")),
    ("`cudnnSetStream`", lambda st: has(st, "cudnnSetStream")),
    ("`cuMemcpyHtoDAsync` + `cuMemcpyDtoHAsync`",
     lambda st: has(st, "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2")),
    ("finding the end: `cuEventSynchronize` / `cuEventQuery`",
     lambda st: has(st, "cuEventSynchronize", "cuEventQuery", "cudaEventSynchronize", "cudaEventQuery")),
    ("`cuEventRecord`", lambda st: has(st, "cuEventRecord", "cudaEventRecord")),
    ("`cudaGetDevice` (the library's `make_current`)", lambda st: has(st, "cudaGetDevice")),
    ("`pthread_mutex_lock` (inclusive)", lambda st: has(st, "pthread_mutex_lock")),
    ("  under a CUDA library's frame",
     lambda st: any(s == "pthread_mutex_lock" and under_cuda(st, i) for i, (_, _, s) in enumerate(st))),
    ("  not under one (the library's and Asio's own locks)",
     lambda st: any(s == "pthread_mutex_lock" and not under_cuda(st, i) for i, (_, _, s) in enumerate(st))),
    ("`malloc`", lambda st: has(st, "malloc")),
    ("`free`", lambda st: has(st, "__libc_free", "free", "cfree")),
    ("leaf in the library's own code (`libatomr-accel-cuda.so` and the program: its templates, Asio; raw: `raw_thread` itself)",
     lambda st: st[0][0] in OWN_MODS),
]


def us(r, c):
    return CPU[r] * c / n[r]


out = []
out.append(f"samples kept: raw {n['raw']} (setup left out {dropped['raw']}), "
           f"composed {n['comp']} (setup left out {dropped['comp']})")
out.append("")
out.append("| frame | raw | composed | samples raw / composed |")
out.append("| --- | --- | --- | --- |")
for name, pred in rows:
    c = {r: sum(1 for rr, st in kept if rr == r and pred(st)) for r in ("raw", "comp")}
    out.append(f"| {name} | {us('raw', c['raw']):.1f} | {us('comp', c['comp']):.1f} | {c['raw']} / {c['comp']} |")


# A partition by the leaf frame (adds up to the CPU per request).
def leaf_class(st):
    m, o, s = st[0]
    if is_memmove(st[0]):
        return "memmove (staging copies and small ones)"
    if m.startswith("libcuda.so"):
        return "leaf in libcuda"
    if m.startswith(("libcublas", "libcudnn", "libcudart", "libnv")):
        return "leaf in cuBLAS(Lt) / cuDNN / cudart"
    if m == "libc.so.6" and re.search(r"mutex|rwlock|lll|futex", s):
        return "libc locks (mutex, rwlock)"
    if m == "libc.so.6" and 0x99000 <= o < 0x99200:
        return "libc locks (mutex, rwlock)"  # __lll_lock_wake / wait (unnamed)
    if m == "libc.so.6" and 0xa9000 <= o < 0xaf000:
        return "malloc / free (libc)"
    if m in OWN_MODS:
        return "leaf in the library / program"
    return "other (libc syscalls, ld.so, ...)"


part = {r: collections.Counter() for r in ("raw", "comp")}
for r, st in kept:
    part[r][leaf_class(st)] += 1
out.append("")
out.append("| leaf class (partition) | raw | composed | composed - raw |")
out.append("| --- | --- | --- | --- |")
keys = sorted(set(part["raw"]) | set(part["comp"]), key=lambda k: -(part["comp"][k] + part["raw"][k]))
for k in keys:
    a, b = us("raw", part["raw"][k]), us("comp", part["comp"][k])
    out.append(f"| {k} | {a:.1f} | {b:.1f} | {b - a:+.1f} |")
out.append(f"| total | {CPU['raw']:.1f} | {CPU['comp']:.1f} | {CPU['comp'] - CPU['raw']:+.1f} |")

# Exported library frames (dladdr named them): inclusive, and the part of it that is not
# CUDA libraries or memmove beneath (the library's own bookkeeping under that frame).
inc = collections.Counter()
own = collections.Counter()
leafc = collections.Counter()
for r, st in kept:
    if r != "comp":
        continue
    names = set(s for m, _, s in st if m == "libatomr-accel-cuda.so" and s != "-")
    inc.update(names)
    lm = st[0][0]
    if not lm.startswith(CUDA_MODS) and not is_memmove(st[0]):
        own.update(names)
    if st[0][0] in OWN_MODS and st[0][2] != "-":
        leafc[st[0][2]] += 1
dem = lambda s: subprocess.run(["c++filt", s], capture_output=True, text=True).stdout.strip()
out.append("")
out.append("exported library frames on the io threads: inclusive us/request, of it not under CUDA libraries or memmove")
for s, c in inc.most_common(25):
    out.append(f"  {us('comp', c):5.1f}  {us('comp', own[s]):5.1f}  ({c:3d} / {own[s]:3d} samples)  {dem(s)[:110]}")
out.append("")
out.append("named leaves in the library / program on the io threads (us/request, samples)")
for s, c in leafc.most_common(15):
    out.append(f"  {us('comp', c):5.2f}  {c:3d}  {dem(s)[:110]}")
print("\n".join(out))
