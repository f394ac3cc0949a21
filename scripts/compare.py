#!/usr/bin/env python3
"""Every course step side by side with PyTorch SDPA and a Triton FA2, on the same tensors.

On the GPU machine (CUDA toolkit, PyTorch; Triton optional), from the repository root:

    cmake -S . -B build -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 && cmake --build build --target fa2_capi
    python3 scripts/compare.py --lib build/libfa2_capi.so --quick     # small sweep, about 3 minutes
    python3 scripts/compare.py --lib build/libfa2_capi.so             # the full sweep

Without a GPU, exercise the report code (tables, plots, README block) on made-up numbers:

    python3 scripts/compare.py --selftest-fake-data

What it does, in one process and on one set of input tensors per shape:
  * providers: every course step through the C interface (ctypes on libfa2_capi.so), PyTorch
    SDPA with the flash, cuDNN and memory-efficient backends, and the seed's Triton FA2
    (reference/triton/fa2_triton.py); plus a bf16 GEMM (8192^3, torch.matmul) as the arithmetic
    ceiling and a device-to-device copy as the bandwidth ceiling.
  * correctness: every output against an fp32 reference computed from the upcast inputs, with
    the course's rule (|out - ref| <= 1e-2 + 1e-2 |ref| everywhere, ||out - ref|| / ||ref|| <= 1e-2,
    no NaN/Inf), LSE too where a provider writes it; the largest difference to SDPA flash is
    recorded as well. Any disagreement makes the exit code non-zero.
  * timing: CUDA events around each run, warm-up first, a 256 MiB buffer written before every run
    so no input is still in L2, the median of many runs, and every point measured `--repeats`
    times to show the spread.
  * output (in --out, default docs/results): <name>.csv (one row per provider, shape and
    repeat), <name>.md (TFLOP/s tables, ratios to SDPA flash and cuDNN, correctness),
    <name>_tflops.png and <name>_ceiling.png, and the results block of README.md between
    `<!-- results:begin -->` and `<!-- results:end -->`.
"""

import argparse
import csv
import ctypes
import datetime
import importlib.util
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The course's correctness rule (harness/compare.h): bf16 outputs, fp32 LSE.
ATOL = RTOL = 1e-2
MAX_REL_NORM = 1e-2
LSE_ATOL = LSE_RTOL = 1e-3

DEVICE = "cuda"  # every tensor lives here (a test harness may point it elsewhere)
FLUSH_BYTES = 256 << 20  # written before every timed run: larger than any GPU's L2
GEMM_N = 8192
COPY_BYTES = 1 << 30
REF_CHUNK_BYTES = 1 << 30  # the fp32 reference's score block per chunk of query rows

DEFAULT_N = [1024, 2048, 4096, 8192, 16384]
QUICK_N = [1024, 4096]
DEFAULT_D = [64, 128]
SEED_SHAPE = (2, 16, 4096, 64)  # B, H, N, D of the seeds' benchmark
SLOW_STEPS = [0, 1, 2]  # fp32 on CUDA cores: not timed above --slow-max-n

REFERENCE_PROVIDERS = [  # id, label, kind
    ("sdpa_flash", "SDPA flash", "sdpa"),
    ("sdpa_cudnn", "SDPA cuDNN", "sdpa"),
    ("sdpa_efficient", "SDPA efficient", "sdpa"),
    ("triton_fa2", "Triton FA2 (seed)", "triton"),
]


def fmt_bytes(n):
    return f"{n / (1 << 30):g} GiB" if n >= (1 << 30) else f"{n / (1 << 20):g} MiB"


def ceiling_providers():
    return [("gemm_bf16", f"bf16 GEMM {GEMM_N}³ (torch.matmul)", "ceiling"),
            ("copy_d2d", f"device-to-device copy, {fmt_bytes(COPY_BYTES)}", "ceiling")]

COLUMNS = ["provider", "label", "kind", "step", "family", "B", "H", "N_q", "N_kv", "D", "causal", "dtype", "repeat",
           "status", "median_ms", "min_ms", "max_ms", "iters", "tflops", "gbps", "max_abs_err", "rel_err",
           "lse_max_abs_err", "max_abs_vs_sdpa_flash", "config", "note", "gpu", "commit", "date"]

MARK_BEGIN = "<!-- results:begin -->"
MARK_END = "<!-- results:end -->"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Shapes and FLOPs
# ---------------------------------------------------------------------------------------------

class Shape:
    """One attention problem: (B, H, N, D) contiguous bf16, N_q = N_kv, top-left causal."""

    def __init__(self, B, H, N, D, causal, family):
        self.B, self.H, self.N, self.D, self.causal, self.family = B, H, N, D, causal, family

    def key(self):
        return (self.family, self.B, self.H, self.N, self.D, self.causal)

    def label(self):
        return f"B={self.B} H={self.H} N={self.N} D={self.D}" + (" causal" if self.causal else "")

    def flops(self):
        return attention_flops(self.B, self.H, self.N, self.N, self.D, self.causal)


def visible_pairs(n_q, n_kv, causal, offset=0):
    """(query, key) pairs the mask lets through, per head (the same count as harness/flops.h)."""
    if not causal:
        return n_q * n_kv
    return sum(min(max(i + offset + 1, 0), n_kv) for i in range(n_q))


def attention_flops(B, H, n_q, n_kv, D, causal):
    """4·D FLOPs per visible pair: 2·D for the row of Q·Kᵀ, 2·D for the row of P·V."""
    return 4.0 * B * H * D * visible_pairs(n_q, n_kv, causal)


def build_sweep(args):
    custom = args.n is not None or args.d is not None or args.b is not None or args.h is not None
    ns = args.n or (QUICK_N if args.quick else DEFAULT_N)
    ds = args.d or DEFAULT_D
    modes = [c for c in (False, True) if not (c and args.no_causal) and not (not c and args.causal_only)]
    if not modes:
        raise SystemExit("compare.py: --causal-only and --no-causal exclude each other")
    shapes = []
    for D in ds:
        for causal in modes:
            for N in ns:
                B = args.b or max(1, args.tokens // N)
                H = args.h or max(1, args.hidden // D)
                shapes.append(Shape(B, H, N, D, causal, "custom" if custom else "16k-tokens"))
    if not custom and not args.no_seed_shape:
        B, H, N, D = SEED_SHAPE
        for causal in modes:
            shapes.append(Shape(B, H, N, D, causal, "seed"))
    return shapes


def write_pair(res, env, args, prefix):
    old, _, new = args.pair.partition(",")
    path = args.pair_out or f"{prefix}_{new}_vs_{old}.md".replace("@", "_at_")
    with open(path, "w", encoding="utf-8") as f:
        f.write(pair_report(res, env, old.strip(), new.strip()))
    log(f"[compare] wrote {path}")
    return 0


def parse_baseline(spec):
    """'TAG=PATH:STEPS' (e.g. old=/tmp/old/build/libfa2_capi.so:7) -> (tag, path, [step numbers])."""
    tag, sep, rest = spec.partition("=")
    path, sep2, numbers = rest.rpartition(":")
    if not sep or not sep2 or not tag or not path:
        raise SystemExit(f"compare.py: --baseline expects TAG=PATH:STEPS, got '{spec}'")
    return tag, path, parse_int_list(numbers)


def parse_int_list(text):
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"compare.py: expected comma-separated integers, got '{text}'")


# ---------------------------------------------------------------------------------------------
# The C interface (include/fa/c_api.h) through ctypes
# ---------------------------------------------------------------------------------------------

class FaParams(ctypes.Structure):
    """Mirror of fa_attention_params; the library reports its size so a mismatch is caught."""
    _fields_ = [
        ("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("batch", ctypes.c_int64), ("heads_q", ctypes.c_int64), ("heads_kv", ctypes.c_int64),
        ("seqlen_q", ctypes.c_int64), ("seqlen_kv", ctypes.c_int64), ("head_dim", ctypes.c_int64),
        ("strides", (ctypes.c_int64 * 4) * 4),
        ("softmax_scale", ctypes.c_float), ("causal", ctypes.c_int32), ("causal_align", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
    ]


FA_C_API_VERSION = 1
FA_ERROR_UNSUPPORTED = 2


class CourseLibrary:
    """The course's steps, loaded from libfa2_capi.so."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        L = self.lib
        L.fa_api_version.restype = ctypes.c_int
        L.fa_attention_params_size.restype = ctypes.c_size_t
        L.fa_num_steps.restype = ctypes.c_int
        L.fa_step_info.restype = ctypes.c_int
        L.fa_step_info.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_char_p),
                                   ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_int),
                                   ctypes.POINTER(ctypes.c_int)]
        for fn in (L.fa_validate, L.fa_step_describe):
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_int, ctypes.POINTER(FaParams), ctypes.c_char_p, ctypes.c_size_t]
        L.fa_forward.restype = ctypes.c_int
        L.fa_forward.argtypes = [ctypes.c_int, ctypes.POINTER(FaParams), ctypes.c_void_p, ctypes.c_char_p,
                                 ctypes.c_size_t]
        if L.fa_api_version() != FA_C_API_VERSION:
            raise RuntimeError(f"{path}: C interface version {L.fa_api_version()}, this script speaks "
                               f"{FA_C_API_VERSION}; rebuild the library")
        if L.fa_attention_params_size() != ctypes.sizeof(FaParams):
            raise RuntimeError(f"{path}: fa_attention_params is {L.fa_attention_params_size()} bytes, "
                               f"this script's mirror is {ctypes.sizeof(FaParams)}")
        self.err = ctypes.create_string_buffer(1024)

    def steps(self):
        out = []
        for i in range(self.lib.fa_num_steps()):
            number, causal, lse = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
            name, lesson = ctypes.c_char_p(), ctypes.c_char_p()
            if self.lib.fa_step_info(i, ctypes.byref(number), ctypes.byref(name), ctypes.byref(lesson),
                                     ctypes.byref(causal), ctypes.byref(lse)) != 0:
                raise RuntimeError(f"fa_step_info({i}) failed")
            out.append({"number": number.value, "name": name.value.decode(), "lesson": lesson.value.decode(),
                        "causal": bool(causal.value), "lse": bool(lse.value)})
        return out

    @staticmethod
    def params(q, k, v, o, lse, causal):
        p = FaParams()
        p.q, p.k, p.v, p.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
        p.lse = lse.data_ptr() if lse is not None else None
        p.batch, p.heads_q, p.seqlen_q, p.head_dim = q.shape
        p.heads_kv, p.seqlen_kv = k.shape[1], k.shape[2]
        for t, tensor in enumerate((q, k, v, o)):  # strides in elements, as torch reports them
            for axis in range(4):
                p.strides[t][axis] = tensor.stride(axis)
        p.softmax_scale = 0.0  # 1/sqrt(D)
        p.causal = 1 if causal else 0
        p.causal_align = 0  # top-left, like torch's is_causal
        p.dtype = 0  # bf16
        return p

    def validate(self, step, p):
        rc = self.lib.fa_validate(step, ctypes.byref(p), self.err, len(self.err))
        return rc, self.err.value.decode(errors="replace")

    def describe(self, step, p):
        rc = self.lib.fa_step_describe(step, ctypes.byref(p), self.err, len(self.err))
        return self.err.value.decode(errors="replace") if rc == 0 else ""

    def forward(self, step, p, stream):
        rc = self.lib.fa_forward(step, ctypes.byref(p), stream, self.err, len(self.err))
        if rc != 0:
            raise RuntimeError(f"step {step:02d}: {self.err.value.decode(errors='replace')}")


# ---------------------------------------------------------------------------------------------
# GPU measurement (torch imported lazily: --help and the fake-data self-test need no GPU)
# ---------------------------------------------------------------------------------------------

def reference_fp32(q, k, v, causal, scale):
    """O and LSE in fp32 from the upcast bf16 inputs: plain matmul + softmax, chunked over query
    rows so the score block stays under ~1 GiB; TF32 off so the products are true fp32."""
    import torch
    B, H, n_q, D = q.shape
    n_kv = k.shape[2]
    out = torch.empty((B, H, n_q, D), dtype=torch.float32, device=q.device)
    lse = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    rows = max(1, min(n_q, REF_CHUNK_BYTES // (4 * H * n_kv)))
    cols = torch.arange(n_kv, device=q.device)
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        for b in range(B):
            kf = k[b].float()  # (H, N_kv, D)
            vf = v[b].float()
            for r0 in range(0, n_q, rows):
                r1 = min(n_q, r0 + rows)
                s = torch.matmul(q[b, :, r0:r1].float(), kf.transpose(-1, -2)) * scale  # (H, rows, N_kv)
                if causal:
                    hidden = cols[None, :] > torch.arange(r0, r1, device=q.device)[:, None]
                    s.masked_fill_(hidden, float("-inf"))
                lse[b, :, r0:r1] = torch.logsumexp(s, dim=-1)
                out[b, :, r0:r1] = torch.matmul(torch.softmax(s, dim=-1), vf)
                del s
    finally:
        torch.set_float32_matmul_precision(saved)
    return out, lse


def compare_to_reference(out, ref):
    """The course's rule: elementwise atol + rtol·|ref|, relative norm, no NaN/Inf."""
    import torch
    o = out.float()
    finite = torch.isfinite(o)
    nonfinite = int((~finite).sum().item())
    diff = torch.where(finite, (o - ref).abs(), torch.full_like(o, float("inf")))
    max_abs = float(diff.max().item())
    violations = int((diff > ATOL + RTOL * ref.abs()).sum().item())
    rel = float(torch.linalg.vector_norm(torch.where(finite, o - ref, torch.zeros_like(o))).item() /
                max(torch.linalg.vector_norm(ref).item(), 1e-30))
    ok = nonfinite == 0 and violations == 0 and rel <= MAX_REL_NORM
    why = ""
    if not ok:
        why = f"{violations} elements outside atol+rtol·|ref|, {nonfinite} NaN/Inf, rel norm {rel:.2e}"
    return ok, max_abs, rel, why


def compare_lse(lse, ref_lse):
    import torch
    finite = torch.isfinite(lse)
    if not bool(finite.all().item()):
        return False, float("inf")
    diff = (lse - ref_lse).abs()
    ok = bool((diff <= LSE_ATOL + LSE_RTOL * ref_lse.abs()).all().item())
    return ok, float(diff.max().item())


def fit_to_budget(warmup, iters, probe_ms, budget_ms, min_iters=5):
    """Fewer runs for a slow point (harness/timer.h's fit_to_budget, the same rule): as many timed
    runs as `budget_ms` pays for, between min(min_iters, iters) and iters; warm-ups shrink to a
    quarter of the budget but stay >= 1 if any were asked for. Returns (warmup, iters)."""
    if budget_ms <= 0 or not probe_ms > 0:
        return warmup, iters
    fits = budget_ms / probe_ms
    floor_iters = min(max(min_iters, 1), iters)
    new_iters = int(min(max(fits, floor_iters), iters))
    new_warmup = int(min(max(fits / 4, 1), warmup)) if warmup > 0 else 0
    return new_warmup, new_iters


class Timer:
    """CUDA-event timing: warm-up, L2 flush before every run, median of `iters` runs."""

    def __init__(self, warmup, iters):
        import torch
        self.torch = torch
        self.warmup, self.iters = warmup, iters
        self.flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=DEVICE)

    def probe(self, fn):
        """Milliseconds of one run (after the first-call costs are paid): decides if a point is
        affordable."""
        torch = self.torch
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    def time(self, fn, warmup=None, iters=None):
        torch = self.torch
        warmup = self.warmup if warmup is None else warmup
        iters = self.iters if iters is None else iters
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        # Let the CPU queue a few runs ahead of the GPU, so launch overhead is never inside the
        # events: the GPU spins for a few ms while the loop below enqueues.
        try:
            torch.cuda._sleep(20_000_000)
        except Exception:
            pass
        for i in range(iters):
            self.flush.zero_()  # evict the previous run's inputs and outputs from L2
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        samples = [s.elapsed_time(e) for s, e in zip(starts, ends)]
        return statistics.median(samples), min(samples), max(samples)


def environment(args):
    import torch
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda or "?",
           "cudnn": "?", "triton": "not installed", "driver": "?", "sm_clock": "?", "max_sm_clock": "?"}
    try:
        env["cudnn"] = str(torch.backends.cudnn.version())
    except Exception as e:  # a cuDNN the build does not match: SDPA cuDNN will say so per shape
        env["cudnn"] = f"unusable ({str(e).splitlines()[0][:80]})"
    props = torch.cuda.get_device_properties(0)
    env["sms"] = props.multi_processor_count
    try:
        import triton
        env["triton"] = triton.__version__
    except Exception:
        pass
    try:
        line = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.max.sm",
                               "--format=csv,noheader,nounits", "-i", "0"], capture_output=True, text=True,
                              timeout=30).stdout.strip().splitlines()[0]
        env["driver"], env["sm_clock"], env["max_sm_clock"] = [x.strip() for x in line.split(",")]
    except Exception:
        pass
    env["commit"] = args.commit or git_commit()
    env["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return env


def git_commit():
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=30).stdout.strip()
        return (sha + ("+local-changes" if dirty else "")) if sha else "unknown"
    except Exception:
        return "unknown"


def load_triton_fa2():
    """reference/triton/fa2_triton.py as a module, or (None, why)."""
    path = os.path.join(ROOT, "reference", "triton", "fa2_triton.py")
    try:
        spec = importlib.util.spec_from_file_location("fa2_triton", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["fa2_triton"] = mod
        spec.loader.exec_module(mod)
        return mod, ""
    except Exception as e:  # Triton missing, or no GPU backend for it
        return None, f"Triton FA2 unavailable: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def run_gpu(args, shapes):
    """Measures everything; returns (rows, env, steps) with one row per provider × shape × repeat."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not torch.cuda.is_available():
        raise SystemExit("compare.py: no CUDA GPU visible to PyTorch (use --selftest-fake-data to test the "
                         "report code without one)")
    torch.cuda.init()
    env = environment(args)
    log(f"[compare] {env['gpu']}, driver {env['driver']}, CUDA {env['cuda']}, torch {env['torch']}, "
        f"triton {env['triton']}, commit {env['commit']}")

    # Providers ----------------------------------------------------------------------------
    lib, steps = None, []
    want_steps = args.steps_list
    if want_steps != []:
        lib_path = args.lib or os.path.join(ROOT, "build", "libfa2_capi.so")
        if not os.path.exists(lib_path):
            raise SystemExit(f"compare.py: {lib_path} not found. Build it first:\n"
                             f"  cmake -S . -B build -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90 && "
                             f"cmake --build build --target fa2_capi\nor pass --lib PATH (or --steps none).")
        lib = CourseLibrary(lib_path)
        steps = lib.steps()
        if want_steps is not None:
            known = {s["number"] for s in steps}
            missing = [n for n in want_steps if n not in known]
            if missing:
                raise SystemExit(f"compare.py: unknown step(s) {missing}; the library has {sorted(known)}")
            steps = [s for s in steps if s["number"] in want_steps]
    # Baselines: steps of another build of the course (e.g. an older commit), in the same run on the
    # same tensors, so a redesign can be measured against the code it replaces.
    for spec in args.baseline or []:
        tag, path, numbers = parse_baseline(spec)
        base_lib = CourseLibrary(path)
        for st in base_lib.steps():
            if st["number"] in numbers:
                steps.append(dict(st, lib=base_lib, tag=tag))
    skip = set(args.skip_providers or [])
    triton_mod, triton_note = (None, "excluded by --skip-providers")
    if "triton_fa2" not in skip:
        triton_mod, triton_note = load_triton_fa2()
        if triton_mod is None:
            log(f"[compare] {triton_note}")
    backends = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
                "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}

    timer = Timer(args.warmup, args.iters)
    stream = torch.cuda.current_stream()
    rows = []

    def base_row(pid, label, kind, shape=None, step=""):
        r = {c: "" for c in COLUMNS}
        r.update(provider=pid, label=label, kind=kind, step=step, dtype="bf16", gpu=env["gpu"],
                 commit=env["commit"], date=env["date"])
        if shape is not None:
            r.update(family=shape.family, B=shape.B, H=shape.H, N_q=shape.N, N_kv=shape.N, D=shape.D,
                     causal=int(shape.causal))
        return r

    # Ceilings -------------------------------------------------------------------------------
    a = torch.randn(GEMM_N, GEMM_N, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(GEMM_N, GEMM_N, device=DEVICE, dtype=torch.bfloat16)
    c = torch.empty(GEMM_N, GEMM_N, device=DEVICE, dtype=torch.bfloat16)
    src = torch.empty(COPY_BYTES, device=DEVICE, dtype=torch.uint8).fill_(7)
    dst = torch.empty_like(src)
    for rep in range(args.repeats):
        med, lo, hi = timer.time(lambda: torch.matmul(a, b, out=c))
        r = base_row(*ceiling_providers()[0])
        r.update(repeat=rep, status="ok", median_ms=med, min_ms=lo, max_ms=hi, iters=args.iters,
                 tflops=2.0 * GEMM_N ** 3 / (med * 1e-3) / 1e12, config=f"M=N=K={GEMM_N}")
        rows.append(r)
        med, lo, hi = timer.time(lambda: dst.copy_(src))
        r = base_row(*ceiling_providers()[1])
        r.update(dtype="uint8", repeat=rep, status="ok", median_ms=med, min_ms=lo, max_ms=hi, iters=args.iters,
                 gbps=2.0 * COPY_BYTES / (med * 1e-3) / 1e9, config=f"{COPY_BYTES} bytes read + written")
        rows.append(r)
        log(f"[compare] ceilings, repeat {rep}: GEMM {rows[-2]['tflops']:.0f} TFLOP/s, copy {rows[-1]['gbps']:.0f} GB/s")
    del a, b, c, src, dst
    torch.cuda.empty_cache()

    # Attention ------------------------------------------------------------------------------
    def measure(si, shape):
        log(f"[compare] ({si + 1}/{len(shapes)}) {shape.label()} [{shape.family}]")
        gen = torch.Generator(device=DEVICE)
        gen.manual_seed(1234 + si)
        dims = (shape.B, shape.H, shape.N, shape.D)
        q = torch.randn(dims, device=DEVICE, dtype=torch.bfloat16, generator=gen)
        k = torch.randn(dims, device=DEVICE, dtype=torch.bfloat16, generator=gen)
        v = torch.randn(dims, device=DEVICE, dtype=torch.bfloat16, generator=gen)
        scale = 1.0 / math.sqrt(shape.D)
        ref, ref_lse = reference_fp32(q, k, v, shape.causal, scale)
        flops = shape.flops()

        # Each candidate: (id, label, kind, step, run() -> (o, lse or None), context, note-if-not-run)
        candidates = []
        for st in steps:
            pid, label = f"step{st['number']:02d}", f"{st['number']:02d}_{st['name']}"
            st_lib = st.get("lib", lib)
            if "tag" in st:
                pid, label = f"{pid}@{st['tag']}", f"{label} @{st['tag']}"
            o = torch.empty_like(q)
            lse = torch.empty(shape.B, shape.H, shape.N, device=DEVICE, dtype=torch.float32) if st["lse"] else None
            p = st_lib.params(q, k, v, o, lse, shape.causal)
            rc, msg = st_lib.validate(st["number"], p)
            note = ""
            if rc != 0:
                note = ("unsupported: " if rc == FA_ERROR_UNSUPPORTED else "refused: ") + msg
            elif st["number"] in args.slow_steps_list and args.slow_max_n > 0 and shape.N > args.slow_max_n:
                note = f"skipped: fp32 CUDA-core step, too slow above N={args.slow_max_n} (--slow-max-n)"

            def run_step(st=st, p=p, o=o, lse=lse, st_lib=st_lib):
                st_lib.forward(st["number"], p, stream.cuda_stream)
                return o, lse

            candidates.append(dict(pid=pid, label=label, kind="step", step=st["number"], run=run_step, o=o, lse=lse,
                                   ctx=None, note=note, params=p, lib=st_lib))
        for pid, label, kind in REFERENCE_PROVIDERS:
            if pid in skip:
                continue
            if kind == "sdpa":
                def run_sdpa():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal), None
                candidates.append(dict(pid=pid, label=label, kind=kind, step="", run=run_sdpa, ctx=backends[pid],
                                       note=""))
            else:
                def run_triton():
                    return triton_mod.fa2_forward(q, k, v, causal=shape.causal)
                candidates.append(dict(pid=pid, label=label, kind=kind, step="", run=run_triton, ctx=None,
                                       note="" if triton_mod else "unavailable: " + triton_note))

        def in_context(cand, fn):
            if cand["ctx"] is None:
                return fn()
            with sdpa_kernel([cand["ctx"]]):
                return fn()

        # Check every candidate once (this also pays first-call costs: autotuning, compilation).
        # SDPA flash goes first so every other output can also be compared with it.
        flash_out = None
        ready = []
        for i, cand in enumerate(candidates):
            cand["order"] = i
        for cand in sorted(candidates, key=lambda c: c["pid"] != "sdpa_flash"):
            row = base_row(cand["pid"], cand["label"], cand["kind"], shape, cand["step"])
            if cand["note"]:
                row.update(status="unsupported" if cand["note"].startswith(("unsupported", "unavailable"))
                           else "skipped", note=cand["note"])
                rows.append(row)
                log(f"    {cand['label']:<22} {cand['note']}")
                continue
            try:
                if cand["kind"] == "step":
                    cand["o"].fill_(float("nan"))  # an element the step never writes fails the check
                    if cand["lse"] is not None:
                        cand["lse"].fill_(float("nan"))
                out, lse = in_context(cand, cand["run"])
                torch.cuda.synchronize()
            except Exception as e:
                msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                if cand["kind"] == "step" and ("cudaErrorMemoryAllocation" in msg or "out of memory" in msg):
                    # Not a wrong answer: the shape does not fit next to the step's own buffers
                    # (step 00's N² score matrix).
                    row.update(status="skipped", note="skipped: out of device memory: " + msg)
                elif cand["kind"] == "step":
                    row.update(status="error", note="error: " + msg)  # a course step must run: a failure
                else:
                    # A reference that cannot run here (a backend without a kernel for this shape, a
                    # library mismatch) is missing from the comparison, not a wrong answer.
                    row.update(status="unsupported", note="unavailable: " + msg)
                rows.append(row)
                log(f"    {cand['label']:<22} {row['note']}")
                continue
            ok, max_abs, rel, why = compare_to_reference(out, ref)
            row.update(max_abs_err=max_abs, rel_err=rel)
            if lse is not None:
                lse_ok, lse_err = compare_lse(lse, ref_lse)
                row["lse_max_abs_err"] = lse_err
                if not lse_ok:
                    ok = False
                    why = (why + "; " if why else "") + f"LSE off by up to {lse_err:.2e}"
            if cand["pid"] == "sdpa_flash":
                flash_out = out
            elif flash_out is not None:
                row["max_abs_vs_sdpa_flash"] = float((out.float() - flash_out.float()).abs().max().item())
            if cand["kind"] == "step":
                row["config"] = cand["lib"].describe(cand["step"], cand["params"])
            elif cand["kind"] == "triton":
                try:
                    row["config"] = triton_mod.best_config(shape.N, shape.N, shape.D, shape.causal)
                except Exception:
                    pass
            elif cand["kind"] == "sdpa":
                row["config"] = f"sdpa_kernel({getattr(cand['ctx'], 'name', cand['ctx'])})"
            if not ok:
                row.update(status="fail", note="FAILED check: " + why)
                rows.append(row)
                log(f"    {cand['label']:<22} FAILED: max |err| {max_abs:.2e}: {why}")
                continue
            if out is not cand.get("o"):
                del out
            probe = in_context(cand, lambda: timer.probe(cand["run"]))
            if probe > args.max_ms_per_point:
                row.update(status="skipped", note=f"skipped: one run takes {probe:.0f} ms > --max-ms-per-point "
                                                  f"{args.max_ms_per_point:.0f}")
                rows.append(row)
                log(f"    {cand['label']:<22} {row['note']}")
                continue
            cand["row"] = row
            cand["warmup"], cand["iters"] = fit_to_budget(args.warmup, args.iters, probe, args.point_budget_ms)
            ready.append(cand)
            log(f"    {cand['label']:<22} ok, max |err| {max_abs:.2e}, one run {probe:.3f} ms")
        flash_out = None

        # Time: everyone once, then everyone again, so drifts show up as spread, not as bias.
        ready.sort(key=lambda c: c["order"])  # the report's order
        for rep in range(args.repeats):
            for cand in list(ready):
                try:
                    med, lo, hi = in_context(cand, lambda: timer.time(cand["run"], cand["warmup"], cand["iters"]))
                except Exception as e:
                    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                    row = dict(cand["row"])
                    row.update(status="error" if cand["kind"] == "step" else "unsupported",
                               note=("error while timing: " if cand["kind"] == "step" else "unavailable: ") + msg)
                    rows.append(row)
                    ready.remove(cand)
                    log(f"    {cand['label']:<22} {row['note']}")
                    continue
                row = dict(cand["row"])
                row.update(repeat=rep, status="ok", median_ms=med, min_ms=lo, max_ms=hi, iters=cand["iters"],
                           tflops=flops / (med * 1e-3) / 1e12)
                rows.append(row)
        for cand in ready:
            meds = [r["median_ms"] for r in rows if r["status"] == "ok" and r["provider"] == cand["pid"]
                    and r["N_q"] == shape.N and r["D"] == shape.D and r["causal"] == int(shape.causal)
                    and r["family"] == shape.family]
            log(f"    {cand['label']:<22} {flops / (statistics.median(meds) * 1e-3) / 1e12:8.1f} TFLOP/s "
                f"({' / '.join(f'{m:.3f}' for m in meds)} ms)")
        del q, k, v, ref, ref_lse, candidates, ready
        torch.cuda.empty_cache()

    for si, shape in enumerate(shapes):
        try:
            measure(si, shape)
        except Exception as e:  # out of memory, a dead CUDA context: record it, keep what was measured
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            log(f"[compare] {shape.label()}: aborted: {msg}")
            for st in steps:
                r = base_row(f"step{st['number']:02d}", f"{st['number']:02d}_{st['name']}", "step", shape,
                             st["number"])
                r.update(status="error", note="shape aborted: " + msg)
                rows.append(r)
            torch.cuda.empty_cache()
    return rows, env


# ---------------------------------------------------------------------------------------------
# Reports: CSV, markdown, plots, README block (pure Python + matplotlib; no GPU)
# ---------------------------------------------------------------------------------------------

def write_csv(rows, path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: fmt_csv(r.get(c, "")) for c in COLUMNS})


def fmt_csv(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


class Results:
    """Rows aggregated per (provider, shape): the median over repeats of each repeat's median."""

    def __init__(self, rows):
        self.rows = rows
        self.points = {}
        order = []
        for r in rows:
            if r["kind"] == "ceiling":
                continue
            key = (r["provider"], r["family"], int(r["B"]), int(r["H"]), int(r["N_q"]), int(r["D"]), int(r["causal"]))
            pt = self.points.get(key)
            if pt is None:
                pt = self.points[key] = {"provider": r["provider"], "label": r["label"], "kind": r["kind"],
                                         "step": r["step"], "status": r["status"], "note": r["note"], "ms": [],
                                         "tflops": None, "max_abs_err": r["max_abs_err"], "config": r["config"]}
            if r["provider"] not in order:
                order.append(r["provider"])
            if r["status"] == "ok":
                pt["ms"].append(float(r["median_ms"]))
                pt["_flops"] = float(r["tflops"]) * float(r["median_ms"]) * 1e-3 * 1e12
                if pt["status"] not in ("fail", "error"):
                    pt["status"] = "ok"
            elif r["status"] in ("fail", "error"):  # a failure in any repeat marks the point
                pt["status"], pt["note"] = r["status"], r["note"]
        for pt in self.points.values():
            if pt["ms"] and pt["status"] == "ok":
                pt["median_ms"] = statistics.median(pt["ms"])
                pt["tflops"] = pt["_flops"] / (pt["median_ms"] * 1e-3) / 1e12
                pt["spread"] = (max(pt["ms"]) - min(pt["ms"])) / min(pt["ms"])
        steps = sorted({p for p in order if self.kind(p) == "step"}, key=lambda p: int(self.step_of(p)))
        refs = [pid for pid, _, _ in REFERENCE_PROVIDERS if pid in order]
        self.providers = steps + refs
        self.gemm = self.ceiling("gemm_bf16", "tflops")
        self.copy = self.ceiling("copy_d2d", "gbps")

    def kind(self, pid):
        return next(p["kind"] for p in self.points.values() if p["provider"] == pid)

    def step_of(self, pid):
        return next(p["step"] for p in self.points.values() if p["provider"] == pid)

    def label(self, pid):
        return next(p["label"] for p in self.points.values() if p["provider"] == pid)

    def ceiling(self, pid, field):
        vals = [float(r[field]) for r in self.rows if r["provider"] == pid and r["status"] == "ok"]
        return statistics.median(vals) if vals else None

    def get(self, pid, family, B, H, N, D, causal):
        return self.points.get((pid, family, B, H, N, D, int(causal)))

    def shapes(self, family=None):
        seen = []
        for (_, fam, B, H, N, D, causal) in self.points:
            s = (fam, B, H, N, D, causal)
            if (family is None or fam == family) and s not in seen:
                seen.append(s)
        return seen

    def groups(self, family):
        """(D, causal) -> [(B, H, N)] sorted by N."""
        out = {}
        for fam, B, H, N, D, causal in self.shapes(family):
            out.setdefault((D, causal), []).append((B, H, N))
        return {g: sorted(v, key=lambda x: x[2]) for g, v in sorted(out.items())}


def fmt_tflops(x):
    if x is None:
        return "—"
    return f"{x:.0f}" if x >= 100 else (f"{x:.1f}" if x >= 10 else f"{x:.2f}")


def cell(pt):
    """A table cell: TFLOP/s, or why there is no number."""
    if pt is None:
        return "—"
    if pt["status"] == "ok":
        return fmt_tflops(pt["tflops"])
    return {"skipped": "skipped", "unsupported": "n/a", "fail": "**FAIL**", "error": "**ERROR**"}.get(pt["status"],
                                                                                                  pt["status"])


def ratio(pt, ref):
    if pt is None or ref is None or pt["status"] != "ok" or ref["status"] != "ok":
        return "—"
    r = pt["tflops"] / ref["tflops"]
    return f"{r:.2f}" if r >= 0.1 else f"{r:.1e}"


def n_label(n):
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def pair_report(res, env, old, new, reference_n=(1024, 4096, 16384)):
    """Markdown: provider `new` against provider `old` (e.g. a rewritten step against the build it
    replaces) on every measured shape, with the ratio of their TFLOP/s and each one's config; the
    shapes of the 16k-token family at `reference_n` (the course's reference shapes) are marked."""
    missing = [pid for pid in (old, new) if pid not in res.providers]
    if missing:
        raise SystemExit(f"compare.py: --pair: no provider {missing} in these results; "
                         f"providers: {', '.join(res.providers)}")
    L = [f"# {res.label(new)} against {res.label(old)} — {env['gpu']}", "",
         f"Measured in one run (commit `{env['commit']}`, {env['date']}) on the same tensors, L2 flushed "
         "between runs, median of each repeat's median; ratio = TFLOP/s of the first column over the "
         "second. ★ marks the 12 reference shapes (B·N = 16k tokens, H·D = 2048, N ∈ {1k, 4k, 16k}).", "",
         f"| shape | {res.label(new)} | {res.label(old)} | ratio | config ({res.label(new)}) | config ({res.label(old)}) |",
         "|---|---|---|---|---|---|"]
    worst = None
    for fam, B, H, N, D, causal in res.shapes():
        a, b = res.get(new, fam, B, H, N, D, causal), res.get(old, fam, B, H, N, D, causal)
        star = " ★" if fam == "16k-tokens" and N in reference_n else ""
        label = f"B={B} H={H} N={n_label(N)} D={D}{' causal' if causal else ''}{star}"
        r = ratio(a, b)
        if star and a and b and a["status"] == b["status"] == "ok":
            q = a["tflops"] / b["tflops"]
            worst = q if worst is None else min(worst, q)
        cfg = lambda pt: (pt or {}).get("config", "") or ""
        L.append(f"| {label} | {cell(a)} | {cell(b)} | {r} | {cfg(a)} | {cfg(b)} |")
    if worst is not None:
        L += ["", f"Lowest ratio on the reference shapes: {worst:.3f}."]
    return "\n".join(L) + "\n"


def markdown_report(res, env, args, plots):
    L = []
    L.append(f"# Attention forward: course steps vs PyTorch SDPA and Triton — {env['gpu']}")
    L.append("")
    L.append("| | |")
    L.append("|---|---|")
    L.append(f"| GPU | {env['gpu']}, {env.get('sms', '?')} SMs, SM clock {env['sm_clock']} MHz "
             f"(max {env['max_sm_clock']} MHz) |")
    L.append(f"| driver / CUDA (torch) / cuDNN | {env['driver']} / {env['cuda']} / {env['cudnn']} |")
    L.append(f"| torch / triton | {env['torch']} / {env['triton']} |")
    L.append(f"| commit | `{env['commit']}` |")
    L.append(f"| date | {env['date']} |")
    L.append(f"| timing | CUDA events; {args.warmup} warm-up runs, then the median of {args.iters} runs (fewer, "
             f"but at least 5, where they would exceed {args.point_budget_ms:.0f} ms: column `iters`), each "
             f"after writing a {FLUSH_BYTES >> 20} MiB buffer (L2 flushed); every point measured "
             f"{args.repeats}× (spread in the CSV) |")
    L.append(f"| correctness | every output vs an fp32 reference from the upcast inputs: \\|out − ref\\| ≤ {ATOL:g} + "
             f"{RTOL:g}·\\|ref\\|, ‖out − ref‖/‖ref‖ ≤ {MAX_REL_NORM:g}, no NaN/Inf; LSE within {LSE_ATOL:g} + "
             f"{LSE_RTOL:g}·\\|ref\\| |")
    L.append(f"| produced by | `python3 scripts/compare.py {' '.join(args.argv)}`".rstrip() + " |")
    spreads = sorted((pt["spread"], pt["label"], s) for (_, *s), pt in res.points.items() if "spread" in pt)
    if spreads:
        worst, label, (fam, B, H, N, D, causal) = spreads[-1]
        L.append(f"| spread between repeats | median {100 * spreads[len(spreads) // 2][0]:.1f} %, largest "
                 f"{100 * worst:.1f} % ({label}, B={B} H={H} N={n_label(N)} D={D}{' causal' if causal else ''}) |")
    L.append("")
    L.append("## Physical limits, measured in the same run")
    L.append("")
    L.append(f"- bf16 GEMM, {GEMM_N}³ with `torch.matmul`: **{fmt_tflops(res.gemm)} TFLOP/s** "
             f"(CSV rows `provider = gemm_bf16`). No attention kernel can beat this: both of its matmuls run "
             f"on the same tensor cores, and the softmax between them costs extra.")
    L.append(f"- device-to-device copy of {fmt_bytes(COPY_BYTES)}: **{res.copy:.0f} GB/s** read + write "
             f"(CSV rows `provider = copy_d2d`)." if res.copy else "- device-to-device copy: not measured.")
    L.append("")
    L.append("FLOPs per point: 4·B·H·N_q·N_kv·D, counting only the (query, key) pairs the causal mask "
             "lets through (docs/performance.md). TFLOP/s = FLOPs / median time.")
    L.append("")
    groups = res.groups("16k-tokens")
    if groups:
        L.append("## TFLOP/s, B·N = 16k tokens, H·D = 2048 (bf16)")
        L.append("")
        for (D, causal), pts in groups.items():
            L.append(f"### D = {D}, {'causal' if causal else 'non-causal'}")
            L.append("")
            L.append("| provider | " + " | ".join(f"N={n_label(N)} (B={B}, H={H})" for B, H, N in pts) + " |")
            L.append("|---|" + "---|" * len(pts))
            for pid in res.providers:
                cells = [cell(res.get(pid, "16k-tokens", B, H, N, D, causal)) for B, H, N in pts]
                L.append(f"| {res.label(pid)} | " + " | ".join(cells) + " |")
            if res.gemm:
                L.append("| *% of bf16 GEMM, best provider* | " + " | ".join(
                    best_pct(res, "16k-tokens", B, H, N, D, causal) for B, H, N in pts) + " |")
            L.append("")
            L.extend(ratio_table(res, [("16k-tokens", B, H, N, D, causal) for B, H, N in pts],
                                 [f"N={n_label(N)}" for _, _, N in pts]))
    for fam, title in (("seed", "The seeds' shape: B=2, H=16, N=4096, D=64"), ("custom", "Custom shapes")):
        shapes = res.shapes(fam)
        if not shapes:
            continue
        L.append(f"## TFLOP/s, {title}")
        L.append("")
        L.append("| provider | " + " | ".join(f"B={B} H={H} N={n_label(N)} D={D}{' causal' if c else ''}"
                                                for _, B, H, N, D, c in shapes) + " |")
        L.append("|---|" + "---|" * len(shapes))
        for pid in res.providers:
            L.append(f"| {res.label(pid)} | " + " | ".join(cell(res.get(pid, *s)) for s in shapes) + " |")
        L.append("")
        L.extend(ratio_table(res, shapes, [short_shape(s) for s in shapes]))
    L.append("## Correctness")
    L.append("")
    L.append("Largest error of each provider over all shapes it ran, against the fp32 reference.")
    L.append("")
    L.append("| provider | shapes checked | passed | worst max \\|err\\| | worst max \\|err\\| vs SDPA flash |")
    L.append("|---|---|---|---|---|")
    failures = []
    for pid in res.providers:
        checked = [r for r in first_rows(res.rows, pid) if r["max_abs_err"] != "" or r["status"] in ("fail", "error")]
        passed = [r for r in checked if r["status"] not in ("fail", "error")]
        errs = [float(r["max_abs_err"]) for r in checked if r["max_abs_err"] != ""]
        vs = [float(r["max_abs_vs_sdpa_flash"]) for r in checked if r["max_abs_vs_sdpa_flash"] != ""]
        worst = f"{max(errs):.2e}" if errs else "—"
        worst_vs = f"{max(vs):.2e}" if vs else "—"
        L.append(f"| {res.label(pid)} | {len(checked)} | {len(passed)} | {worst} | {worst_vs} |")
        failures += [(pid, r) for r in checked if r["status"] in ("fail", "error")]
    L.append("")
    if failures:
        L.append("**Failures:**")
        L.append("")
        for pid, r in failures:
            L.append(f"- {res.label(pid)}, B={r['B']} H={r['H']} N={r['N_q']} D={r['D']}"
                     f"{' causal' if str(r['causal']) == '1' else ''}: {r['note']}")
        L.append("")
    else:
        L.append("Every provider that ran agrees with the reference within tolerance.")
        L.append("")
    notes = not_timed_notes(res)
    if notes:
        L.append("## Not timed")
        L.append("")
        L.extend(notes)
        L.append("")
    if plots:
        L.append("## Plots")
        L.append("")
        for p in plots:
            L.append(f"![{os.path.basename(p)}]({os.path.basename(p)})")
            L.append("")
    L.append("Reading the numbers: see docs/performance.md (the FLOP count, how the timing is taken, the "
             "reference numbers production kernels reach on an H200).")
    L.append("")
    return "\n".join(L)


def ratio_table(res, shapes, headers):
    """Each step's TFLOP/s divided by SDPA flash's and by SDPA cuDNN's on the same shapes."""
    step_ids = [p for p in res.providers if res.kind(p) == "step"]
    if not step_ids or not any(res.get(ref, *s) for s in shapes for ref in ("sdpa_flash", "sdpa_cudnn")):
        return []
    L = ["Each step relative to the production kernels: TFLOP/s ÷ SDPA flash / ÷ SDPA cuDNN (1.00 = as fast).", ""]
    L.append("| step | " + " | ".join(headers) + " |")
    L.append("|---|" + "---|" * len(shapes))
    for pid in step_ids:
        cells = [f"{ratio(res.get(pid, *s), res.get('sdpa_flash', *s))} / "
                 f"{ratio(res.get(pid, *s), res.get('sdpa_cudnn', *s))}" for s in shapes]
        L.append(f"| {res.label(pid)} | " + " | ".join(cells) + " |")
    L.append("")
    return L


def first_rows(rows, pid):
    """One row per shape for `pid`: the first repeat (it holds the check result), or a later failure."""
    index, out = {}, []
    for r in rows:
        if r["provider"] != pid:
            continue
        key = (r["family"], r["B"], r["H"], r["N_q"], r["D"], r["causal"])
        if key not in index:
            index[key] = len(out)
            out.append(r)
        elif r["status"] in ("fail", "error") and out[index[key]]["status"] not in ("fail", "error"):
            out[index[key]] = dict(r, max_abs_err=out[index[key]]["max_abs_err"])  # a later failure wins
    return out


def best_pct(res, family, B, H, N, D, causal):
    vals = [pt["tflops"] for pid in res.providers
            for pt in [res.get(pid, family, B, H, N, D, causal)] if pt and pt["status"] == "ok"]
    return f"{100 * max(vals) / res.gemm:.0f}%" if vals and res.gemm else "—"


def short_shape(s):
    fam, B, H, N, D, causal = s
    tag = " (seed)" if fam == "seed" else ""
    return f"D={D} N={n_label(N)}{' c' if causal else ''}{tag}"


def not_timed_notes(res):
    """One line per distinct reason a (provider, shape) has no time, shapes grouped."""
    by_reason = {}
    for (pid, fam, B, H, N, D, causal), pt in res.points.items():
        if pt["status"] in ("ok", "fail", "error"):  # failures have their own list
            continue
        reason = re.sub(r"\d+ ms >", "… ms >", pt["note"]) if pt["status"] == "skipped" else pt["note"]
        by_reason.setdefault((res.label(pid), pt["status"], reason), []).append(
            f"D={D} N={n_label(N)}{' causal' if causal else ''}{' (seed)' if fam == 'seed' else ''}")
    lines = []
    for (label, status, reason), where in sorted(by_reason.items()):
        lines.append(f"- {label}: {reason} — {', '.join(where)}")
    return lines


def readme_block(res, env, args, report_rel, plot_rels=()):
    """The compact table that goes into README.md: every provider at N = 4k (or the largest N),
    followed by the plots (paths relative to the README)."""
    groups = res.groups("16k-tokens")
    cols = []
    for (D, causal), pts in groups.items():
        pick = next((p for p in pts if p[2] == 4096), pts[-1])
        cols.append(("16k-tokens", pick[0], pick[1], pick[2], D, causal))
    family = f"B·N = {args.tokens // 1024}k tokens, H·D = {args.hidden}" if cols else "custom shapes"
    if not cols:
        cols = res.shapes()
    L = [f"bf16 forward, TFLOP/s, on {env['gpu']} (commit `{env['commit']}`, {env['date']}); {family}. "
         f"Full report with every N, the ratios to SDPA and the plots: [{report_rel}]({report_rel}).", ""]
    L.append("| provider | " + " | ".join(f"D={D} N={n_label(N)}{' causal' if c else ''}"
                                            for _, B, H, N, D, c in cols) + " |")
    L.append("|---|" + "---|" * len(cols))
    for pid in res.providers:
        L.append(f"| {res.label(pid)} | " + " | ".join(cell(res.get(pid, *s)) for s in cols) + " |")
    extra = []
    if res.gemm:
        extra.append(f"bf16 GEMM ceiling on this GPU: {fmt_tflops(res.gemm)} TFLOP/s")
    if res.copy:
        extra.append(f"copy bandwidth: {res.copy:.0f} GB/s")
    L.append("")
    if extra:
        L.append("; ".join(extra) + ".")
    if any(pt["status"] in ("skipped", "unsupported") for pt in res.points.values()):
        slow = ", ".join(f"{n:02d}" for n in args.slow_steps_list)
        L.append(f"“skipped”: steps {slow} run in fp32 on CUDA cores and are not timed above N = {args.slow_max_n} "
                 f"(nor is anything whose single run exceeds {args.max_ms_per_point:.0f} ms); “n/a”: the provider "
                 "does not support the shape (e.g. a step before the causal lesson) or is not installed.")
    for rel in plot_rels:
        what = "TFLOP/s against N" if rel.endswith("_tflops.png") else "share of the bf16 GEMM ceiling"
        L += ["", f"[![{what}]({rel})]({rel})"]
    return "\n".join(L)


def update_readme(path, block):
    if not os.path.exists(path):
        log(f"[compare] warning: {path} not found; README results not updated")
        return False
    text = open(path, encoding="utf-8").read()
    b, e = text.find(MARK_BEGIN), text.find(MARK_END)
    if b < 0 or e < 0 or e < b:
        log(f"[compare] warning: {path} has no '{MARK_BEGIN}' ... '{MARK_END}' markers; README results not updated")
        return False
    new = text[:b + len(MARK_BEGIN)] + "\n" + block.rstrip() + "\n" + text[e:]
    with open(path, "w", encoding="utf-8") as f:
        f.write(new)
    return True


PROVIDER_STYLE = {
    "sdpa_flash": dict(color="tab:red", linestyle="--", marker="s"),
    "sdpa_cudnn": dict(color="tab:purple", linestyle="--", marker="^"),
    "sdpa_efficient": dict(color="tab:brown", linestyle="--", marker="v"),
    "triton_fa2": dict(color="tab:orange", linestyle="--", marker="D"),
}


def write_plots(res, env, prefix):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("[compare] warning: matplotlib not installed; no plots")
        return []
    groups = res.groups("16k-tokens")
    if not groups:
        return []
    step_ids = [p for p in res.providers if res.kind(p) == "step"]
    cmap = plt.get_cmap("viridis")
    paths = []
    for what in ("tflops", "ceiling"):
        if what == "ceiling" and not res.gemm:
            continue
        n = len(groups)
        ncols = 2 if n > 1 else 1
        nrows = (n + ncols - 1) // ncols
        fig, axes = plt.subplots(nrows, ncols, figsize=(6.4 * ncols, 4.6 * nrows), squeeze=False)
        handles = {}
        for ax, ((D, causal), pts) in zip(axes.flat, groups.items()):
            ns = [N for _, _, N in pts]
            for pid in res.providers:
                xs, ys = [], []
                for B, H, N in pts:
                    pt = res.get(pid, "16k-tokens", B, H, N, D, causal)
                    if pt and pt["status"] == "ok":
                        xs.append(N)
                        ys.append(pt["tflops"] if what == "tflops" else 100.0 * pt["tflops"] / res.gemm)
                if not xs:
                    continue
                if pid in PROVIDER_STYLE:
                    style = dict(PROVIDER_STYLE[pid])
                else:
                    i = step_ids.index(pid)
                    style = dict(color=cmap(i / max(1, len(step_ids) - 1) * 0.9), linestyle="-", marker="o")
                (line,) = ax.plot(xs, ys, label=res.label(pid), linewidth=1.8, markersize=5, **style)
                handles.setdefault(res.label(pid), line)
            if what == "tflops" and res.gemm:
                line = ax.axhline(res.gemm, color="gray", linestyle=":", linewidth=1.2)
                handles.setdefault(f"bf16 GEMM ({fmt_tflops(res.gemm)})", line)
            ax.set_xscale("log", base=2)
            ax.set_xticks(ns)
            ax.set_xticklabels([n_label(x) for x in ns])
            ax.minorticks_off()
            ax.set_xlabel("sequence length N (B = 16k / N)")
            if what == "tflops":
                ax.set_yscale("log")
                ax.set_ylabel("TFLOP/s (log scale)")
            else:
                ax.set_ylim(0, 100)
                ax.set_ylabel("% of measured bf16 GEMM rate")
            ax.set_title(f"D = {D}, {'causal' if causal else 'non-causal'} (H = {pts[0][1]})")
            ax.grid(True, which="major", alpha=0.3)
        for ax in list(axes.flat)[len(groups):]:
            ax.set_visible(False)
        title = ("Attention forward, bf16, TFLOP/s" if what == "tflops"
                 else "Attention forward, bf16, share of the GEMM ceiling")
        fig.suptitle(f"{title} — {env['gpu']}, commit {env['commit']}")
        fig.legend(list(handles.values()), list(handles.keys()), loc="lower center",
                   ncol=min(6, max(1, len(handles))), frameon=False, bbox_to_anchor=(0.5, -0.01))
        fig.tight_layout(rect=(0, 0.06 + 0.02 * ((len(handles) - 1) // 6), 1, 0.96))
        path = f"{prefix}_{what}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def write_outputs(rows, env, args):
    os.makedirs(args.out, exist_ok=True)
    prefix = os.path.join(args.out, args.name)
    write_csv(rows, prefix + ".csv")
    res = Results(rows)
    plots = write_plots(res, env, prefix)
    md = markdown_report(res, env, args, plots)
    with open(prefix + ".md", "w", encoding="utf-8") as f:
        f.write(md)
    written = [prefix + ".csv", prefix + ".md"] + plots
    readme = write_readme(res, env, args, prefix, plots)
    if readme:
        written.append(readme)
    return res, written


def write_readme(res, env, args, prefix, plots):
    """The README's results block, linking the report `<prefix>.md` and the TFLOP/s plot by paths
    relative to the README. Returns the README's path if it was updated, else None."""
    if args.no_readme:
        return None
    readme = args.readme or os.path.join(ROOT, "README.md")
    here = os.path.dirname(os.path.abspath(readme))
    plot_rels = [os.path.relpath(p, here) for p in plots if p.endswith("_tflops.png")]
    block = readme_block(res, env, args, os.path.relpath(prefix + ".md", here), plot_rels)
    return readme if update_readme(readme, block) else None


# ---------------------------------------------------------------------------------------------
# Self-test on made-up numbers (no GPU, no torch)
# ---------------------------------------------------------------------------------------------

def fake_rows(shapes, args):
    import random
    rnd = random.Random(7)
    env = {"gpu": "NVIDIA H200 (fake data)", "torch": "2.11.0", "cuda": "13.0", "cudnn": "91000",
           "triton": "3.6.0", "driver": "580.00", "sm_clock": "1980", "max_sm_clock": "1980", "sms": 132,
           "commit": "selftest", "date": "2000-01-01 00:00 UTC"}
    steps = [(0, "naive", 0.05), (1, "online_softmax", 0.4), (2, "tiled_fa1", 1.5), (3, "fa2_grid", 8.0),
             (4, "fp32_state", 90.0), (5, "causal_mask", 140.0), (6, "autotune", 230.0), (7, "lse_store", 235.0)]
    refs = {"sdpa_flash": 300.0, "sdpa_cudnn": 450.0, "sdpa_efficient": 190.0, "triton_fa2": 340.0}
    rows = []

    def row(pid, label, kind, shape=None, step=""):
        r = {c: "" for c in COLUMNS}
        r.update(provider=pid, label=label, kind=kind, step=step, dtype="bf16", gpu=env["gpu"], commit=env["commit"],
                 date=env["date"])
        if shape:
            r.update(family=shape.family, B=shape.B, H=shape.H, N_q=shape.N, N_kv=shape.N, D=shape.D,
                     causal=int(shape.causal))
        return r

    for rep in range(args.repeats):
        r = row(*ceiling_providers()[0])
        ms = 2.0 * GEMM_N ** 3 / 790e12 * 1e3 * (1 + 0.01 * rep)
        r.update(repeat=rep, status="ok", median_ms=ms, min_ms=ms, max_ms=ms, iters=args.iters,
                 tflops=2.0 * GEMM_N ** 3 / (ms * 1e-3) / 1e12)
        rows.append(r)
        r = row(*ceiling_providers()[1])
        ms = 2.0 * COPY_BYTES / 4.1e12 * 1e3
        r.update(dtype="uint8", repeat=rep, status="ok", median_ms=ms, min_ms=ms, max_ms=ms, iters=args.iters,
                 gbps=2.0 * COPY_BYTES / (ms * 1e-3) / 1e9)
        rows.append(r)
    largest_n = max(s.N for s in shapes)
    for shape in shapes:
        cands = [(f"step{n:02d}", f"{n:02d}_{name}", "step", n, rate) for n, name, rate in steps]
        cands += [(pid, label, kind, "", refs[pid]) for pid, label, kind in REFERENCE_PROVIDERS]
        for pid, label, kind, step, rate in cands:
            base = row(pid, label, kind, shape, step)
            if kind == "step" and step in SLOW_STEPS and shape.N > args.slow_max_n:
                base.update(status="skipped", note=f"skipped: fp32 CUDA-core step, too slow above N="
                                                   f"{args.slow_max_n} (--slow-max-n)")
                rows.append(base)
                continue
            if kind == "step" and step in (1, 2, 3, 4) and shape.causal:
                base.update(status="unsupported", note="unsupported: invalid attention input: this step does not "
                                                       "support the causal mask")
                rows.append(base)
                continue
            if pid == "sdpa_efficient" and shape.D == 128 and shape.N == largest_n and shape.causal:
                base.update(status="fail", note="FAILED check: 12 elements outside atol+rtol·|ref| (fake)",
                            max_abs_err=0.03, rel_err=2e-3)
                rows.append(base)
                continue
            eff = rate * (0.85 + 0.15 * math.log2(shape.N / 1024) / 4) * (1.1 if shape.D == 128 else 1.0)
            eff *= 0.85 if shape.causal else 1.0
            base.update(max_abs_err=rnd.uniform(1e-3, 4e-3), rel_err=rnd.uniform(2e-3, 4e-3),
                        max_abs_vs_sdpa_flash="" if pid == "sdpa_flash" else rnd.uniform(1e-3, 4e-3),
                        config="BLOCK_M=128 BLOCK_N=64 warps=4" if kind != "sdpa" else "")
            for rep in range(args.repeats):
                tf = eff * rnd.uniform(0.97, 1.03)
                ms = shape.flops() / (tf * 1e12) * 1e3
                r = dict(base)
                r.update(repeat=rep, status="ok", median_ms=ms, min_ms=ms * 0.98, max_ms=ms * 1.05,
                         iters=fit_to_budget(args.warmup, args.iters, ms, args.point_budget_ms)[1], tflops=tf)
                rows.append(r)
    return rows, env


def selftest(args):
    own_out = args.out_given is None
    if own_out:
        args.out = tempfile.mkdtemp(prefix="compare-selftest-")
    os.makedirs(args.out, exist_ok=True)
    shapes = build_sweep(args)
    rows, env = fake_rows(shapes, args)
    # A README copy with markers (updated) and one without (warning, untouched).
    readme = os.path.join(args.out, "README.md")
    with open(readme, "w", encoding="utf-8") as f:
        f.write("# Title\n\n## Results\n\n" + MARK_BEGIN + "\nold table\n" + MARK_END + "\n\n## After\n")
    args.readme = readme
    args.no_readme = False
    res, written = write_outputs(rows, env, args)
    problems = []
    text = open(readme, encoding="utf-8").read()
    if "old table" in text or "00_naive" not in text or not text.rstrip().endswith("## After"):
        problems.append("README block not replaced correctly")
    if "matplotlib" in sys.modules and f"]({args.name}_tflops.png)" not in text:
        problems.append("README block does not link the TFLOP/s plot")
    md = open(os.path.join(args.out, args.name + ".md"), encoding="utf-8").read()
    needles = ["SDPA flash", "SDPA cuDNN", "Triton FA2 (seed)", "07_lse_store", "**FAIL**", "n/a", "bf16 GEMM",
               "÷ SDPA flash / ÷ SDPA cuDNN", "seeds' shape", "gemm_bf16", "copy_d2d"]
    if any(s.N > args.slow_max_n for s in shapes):
        needles.append("skipped")
    for needle in needles:
        if needle not in md:
            problems.append(f"markdown lacks '{needle}'")
    with open(os.path.join(args.out, args.name + ".csv"), newline="") as f:
        csv_rows = list(csv.DictReader(f))
    if len(csv_rows) != len(rows) or list(csv_rows[0].keys()) != COLUMNS:
        problems.append("CSV rows or columns differ from what was measured")
    plots = [p for p in written if p.endswith(".png")]
    try:
        import matplotlib  # noqa: F401
        if len(plots) != 2 or any(os.path.getsize(p) < 10000 for p in plots):
            problems.append("expected two non-trivial PNG plots")
    except ImportError:
        log("[selftest] matplotlib missing: plots not checked")
    no_markers = os.path.join(args.out, "README_no_markers.md")
    with open(no_markers, "w", encoding="utf-8") as f:
        f.write("# No markers here\n")
    if update_readme(no_markers, "x") or open(no_markers).read() != "# No markers here\n":
        problems.append("a README without markers must be left alone")
    # The run-count rule must match harness/timer.h's (tests/cpu/harness_test.cpp, Timer.FitToBudget...).
    for (warm, iters, probe, budget), want in [((5, 30, 0.5, 2000.0), (5, 30)), ((5, 30, 100.0, 2000.0), (5, 20)),
                                               ((5, 30, 650.0, 2000.0), (1, 5)), ((0, 3, 650.0, 2000.0), (0, 3)),
                                               ((5, 30, 650.0, 0.0), (5, 30)), ((5, 30, 0.0, 2000.0), (5, 30))]:
        if fit_to_budget(warm, iters, probe, budget) != want:
            problems.append(f"fit_to_budget{(warm, iters, probe, budget)} != {want}")
    # Failures must make the real run's exit code non-zero: the same predicate is used there.
    if not any_failure(rows):
        problems.append("the fake failure was not detected")
    for p in written:
        log(f"[selftest] wrote {p}")
    if problems:
        for p in problems:
            log(f"[selftest] PROBLEM: {p}")
        return 1
    log(f"[selftest] ok: {len(rows)} rows, {len(res.providers)} providers, {len(res.shapes())} shapes "
        f"(output in {args.out})")
    return 0


def any_failure(rows):
    return any(r["status"] in ("fail", "error") for r in rows)


# ---------------------------------------------------------------------------------------------

def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(
        description="Course steps vs PyTorch SDPA (flash, cuDNN, efficient) and a Triton FA2: correctness and "
                    "TFLOP/s on the same tensors, plus the GEMM and copy ceilings.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="GPU machine:  python3 scripts/compare.py --lib build/libfa2_capi.so --quick\n"
               "No GPU:       python3 scripts/compare.py --selftest-fake-data")
    ap.add_argument("--lib", help="path of libfa2_capi.so (default: build/libfa2_capi.so)")
    ap.add_argument("--out", help="output folder (default: docs/results)")
    ap.add_argument("--name", help="file name stem (default: compare_<gpu>[_quick])")
    ap.add_argument("--readme", help="README to update between the results markers (default: README.md)")
    ap.add_argument("--no-readme", action="store_true", help="do not touch the README")
    ap.add_argument("--quick", action="store_true", help="small sweep: N in {1k, 4k}, D in {64, 128} (~3 minutes)")
    ap.add_argument("--steps", help="comma-separated step numbers, or 'none' (default: every step)")
    ap.add_argument("--baseline", action="append", metavar="TAG=PATH:STEPS",
                    help="also time steps STEPS of another build's libfa2_capi.so, labelled @TAG (repeatable)")
    ap.add_argument("--pair", metavar="OLD,NEW",
                    help="with --from-csv: a table of provider NEW against OLD (ids as in the CSV, e.g. "
                         "step07@0e4c464,step08) instead of the plots and README block")
    ap.add_argument("--pair-out", metavar="MD", help="where --pair writes (default: next to the CSV)")
    ap.add_argument("--skip-providers", help="comma-separated: sdpa_flash,sdpa_cudnn,sdpa_efficient,triton_fa2")
    ap.add_argument("--n", help="sequence lengths, e.g. 1024,4096 (replaces the default sweep)")
    ap.add_argument("--d", help="head dims, e.g. 64,128")
    ap.add_argument("--b", type=int, help="batch (default: tokens / N)")
    ap.add_argument("--h", type=int, help="heads (default: hidden / D)")
    ap.add_argument("--tokens", type=int, default=16384, help="B·N of the default sweep (default 16384)")
    ap.add_argument("--hidden", type=int, default=2048, help="H·D of the default sweep (default 2048)")
    ap.add_argument("--causal-only", action="store_true")
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--no-seed-shape", action="store_true", help="leave out B=2 H=16 N=4096 D=64")
    ap.add_argument("--warmup", type=int, help="warm-up runs per point (default 5; --quick: 3)")
    ap.add_argument("--iters", type=int, help="timed runs per point (default 30; --quick: 15)")
    ap.add_argument("--repeats", type=int, default=2, help="measure every point this many times (default 2)")
    ap.add_argument("--slow-max-n", type=int, default=4096,
                    help="steps 00-02 are not timed above this N (default 4096; 0 = no limit)")
    ap.add_argument("--slow-steps", default="0,1,2", help="the steps --slow-max-n applies to (default 0,1,2)")
    ap.add_argument("--max-ms-per-point", type=float, default=1000.0,
                    help="do not time a provider whose single run takes longer (default 1000 ms)")
    ap.add_argument("--point-budget-ms", type=float, default=1000.0,
                    help="fewer timed runs (never below 5) for a point whose runs would take longer (default 1000)")
    ap.add_argument("--commit", help="commit to stamp the results with (default: git rev-parse)")
    ap.add_argument("--from-csv", metavar="CSV",
                    help="no GPU: redraw the two PNG plots (next to the CSV) and the README block from a CSV this "
                         "script wrote")
    ap.add_argument("--selftest-fake-data", action="store_true",
                    help="no GPU: write every report from made-up numbers into a temp folder (or --out) and check it")
    args = ap.parse_args(argv)
    args.argv = argv
    args.out_given = args.out
    args.out = args.out or os.path.join(ROOT, "docs", "results")
    args.n = parse_int_list(args.n)
    args.d = parse_int_list(args.d)
    args.warmup = args.warmup if args.warmup is not None else (3 if args.quick else 5)
    args.iters = args.iters if args.iters is not None else (15 if args.quick else 30)
    if args.iters < 1 or args.warmup < 0 or args.repeats < 1:
        ap.error("--iters and --repeats must be >= 1, --warmup >= 0")
    args.steps_list = [] if (args.steps or "").strip().lower() == "none" else parse_int_list(args.steps)
    args.slow_steps_list = parse_int_list(args.slow_steps) or []
    args.skip_providers = [s.strip() for s in (args.skip_providers or "").split(",") if s.strip()]
    known = {pid for pid, _, _ in REFERENCE_PROVIDERS}
    if set(args.skip_providers) - known:
        ap.error(f"--skip-providers: unknown {sorted(set(args.skip_providers) - known)}; known: {sorted(known)}")
    shapes = build_sweep(args)

    if args.selftest_fake_data:
        args.name = args.name or "compare_selftest"
        return selftest(args)

    if args.from_csv:
        with open(args.from_csv, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        env = {"gpu": rows[0]["gpu"], "commit": rows[0]["commit"], "date": rows[0]["date"]}
        res = Results(rows)
        prefix = os.path.splitext(args.from_csv)[0]
        if args.pair:
            return write_pair(res, env, args, prefix)
        plots = write_plots(res, env, prefix)
        for p in plots + [write_readme(res, env, args, prefix, plots)]:
            if p:
                log(f"[compare] wrote {p}")
        return 0

    rows, env = run_gpu(args, shapes)
    if not args.name:
        slug = re.sub(r"[^A-Za-z0-9]+", "_", env["gpu"]).strip("_")
        args.name = f"compare_{slug}" + ("_quick" if args.quick else "")
    res, written = write_outputs(rows, env, args)
    for p in written:
        log(f"[compare] wrote {p}")
    if any_failure(rows):
        for r in rows:
            if r["status"] in ("fail", "error"):
                log(f"[compare] FAILED: {r['label']}, B={r['B']} H={r['H']} N={r['N_q']} D={r['D']}"
                    f"{' causal' if r['causal'] == 1 else ''}: {r['note']}")
        return 1
    log("[compare] every provider agrees with the fp32 reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
