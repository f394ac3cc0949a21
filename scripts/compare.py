#!/usr/bin/env python3
"""Every course step side by side with PyTorch SDPA and a Triton FA2, shape by shape.

`fa2 bench` times the course steps, once per shape (an old build's too, with --baseline); this adds PyTorch SDPA's
flash, cuDNN and efficient backends, the seed's Triton FA2, the course's PyTorch package (fa_course.attention with its
own step choice, on the library of the build being compared: the same kernels reached the way a model reaches them) and
the bf16 GEMM and copy ceilings, checked against an fp32 reference and timed the same way. Sweep, FLOPs, tolerances and timing options come from `fa2 bench --list --json`.

    python3 scripts/compare.py --fa2 build/fa2 --quick         # N in {1k, 4k}: a few minutes
    python3 scripts/compare.py --fa2 build/fa2                 # the full sweep
    python3 scripts/compare.py --fa2 build/fa2 --baseline old=/tmp/old/build/fa2:7
    python3 scripts/compare.py --from-csv docs/results/compare_<gpu>.csv [--pair step07@old,step08]
    python3 scripts/compare.py --selftest-fake-data --fa2 build/fa2     # no GPU, no torch
    python3 scripts/compare.py --fa2 build/fa2 --steps 17 --direction fwd,bwd   # the backward too
"""
import argparse
import csv
import datetime
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import write_report as report  # noqa: E402

ROOT = report.ROOT
GEMM_N, COPY_BYTES, REF_CHUNK_BYTES = 8192, 1 << 30, 1 << 30
SWEEP = ["steps", "n", "d", "b", "h", "tokens", "hidden", "iters", "warmup", "repeats", "slow_steps", "slow_max_n",
         "max_ms_per_point", "point_budget_ms", "direction", "dtype", "quick", "causal_only", "no_causal", "no_seed_shape"]
BWD_MAX_REL_NORM = 1e-2  # a backward's dQ, dK, dV against the fp32 backward: ‖g − ref‖/‖ref‖ (step 17's test limit)
BENCH_KEYS = ("repeat", "median_ms", "min_ms", "max_ms", "iters", "tflops", "max_abs_err", "rel_err", "config")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def sweep_args(args):
    """The sweep and timing options as given, for `fa2 bench` (which owns their defaults)."""
    out = []
    for k in SWEEP:
        v = getattr(args, k)
        if v is not None and v is not False and not (k == "steps" and v == "none"):
            out += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return out


def fa2_plan(fa2, argv):
    r = subprocess.run([fa2, "bench", "--list", "--json"] + argv, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"compare.py: `{fa2} bench --list --json` failed: {r.stderr.strip() or r.returncode}")
    return json.loads(r.stdout)


def row(pid, label, kind, s, meta, **kw):
    r = dict(provider=pid, label=label, kind=kind, gpu=meta["gpu"], commit=meta["commit"], date=meta["date"])
    if s:  # an attention shape: a forward unless the caller says backward (a ceiling row has neither)
        r.update(family=s["family"], B=s["B"], H=s["H"], N_q=s["N"], N_kv=s["N"], D=s["D"], causal=int(s["causal"]),
                 direction="fwd")
    return dict(r, **kw)


def step_row(n, tag, names, s, meta, bwd=False, **kw):
    """Step n's row: provider stepNN[@TAG][_bwd], label NN_name[ @TAG][ backward]."""
    at = f"@{tag}" if tag else ""
    return row(f"step{n:02d}{at}" + report.BWD * bwd, f"{n:02d}_{names.get(n, '?')} {at}".rstrip() + " backward" * bwd,
               "step", s, meta, step=n, direction="bwd" if bwd else "fwd", **kw)


def not_run_rows(s, names, meta):
    """The steps fa2 bench's plan does not run on shape s, with its reason."""
    return [step_row(nr["step"], "", names, s, meta, repeat=0, status=nr["status"], note=nr["note"])
            for nr in s["not_run"]]


def bench_rows(path, rc, err, steps, s, tag, names, meta, bwd=False):
    """One shape's rows of a `fa2 bench --csv` file; after a failed run, an error row for each step missing there."""
    got = report.read_csv(path) if os.path.exists(path) else []
    names = {**names, **{int(b["step"]): b["name"] for b in got if b.get("name")}}
    out = [step_row(int(b["step"]), tag, names, s, meta, bwd=b.get("direction") == "bwd", status=b.get("status") or "ok",
                    note=b.get("note", ""), **{k: b.get(k, "") for k in BENCH_KEYS}) for b in got]
    seen, msg = {int(b["step"]) for b in got}, (err.strip().splitlines() or ["?"])[-1]
    return out + [step_row(n, tag, names, s, meta, bwd=bwd, repeat=0, status="error",
                           note=f"error: fa2 bench exited with {rc}: {msg}") for n in steps if rc and n not in seen], got


def run_bench(fa2, steps, s, t, tag, names, meta, bwd=False):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.csv")
        cmd = [fa2, "bench", "--steps", ",".join(map(str, steps)), "--csv", path, "--b", s["B"], "--h", s["H"],
               "--n", s["N"], "--d", s["D"], "--causal-only" if s["causal"] else "--no-causal", "--repeats",
               t["repeats"], "--iters", t["iters"], "--warmup", t["warmup"], "--slow-max-n", t["slow_max_n"],
               "--slow-steps", ",".join(map(str, t["slow_steps"])), "--max-ms-per-point", t["max_ms_per_point"],
               "--point-budget-ms", t["point_budget_ms"], "--direction", "bwd" if bwd else "fwd"]
        cmd += ["--dtype", meta["dtype"]] if meta["dtype"] != "bf16" else []  # a baseline build may predate --dtype
        r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
        return bench_rows(path, r.returncode, r.stderr, steps, s, tag, names, meta, bwd)


class Torch:
    """SDPA, Triton and the ceilings: checked against an fp32 reference, then timed like time_step."""

    def __init__(self, t, tol):
        import torch
        self.torch, self.t, self.tol = torch, t, tol
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)
        self.flush = torch.empty(2 * max(l2, 64 << 20), dtype=torch.uint8, device="cuda")  # as harness/timer.cpp

    def time(self, fn):
        torch = self.torch
        for _ in range(self.t["warmup"]):
            fn()
        torch.cuda.synchronize()
        event = lambda: torch.cuda.Event(enable_timing=True)
        ev = [(event(), event()) for _ in range(self.t["iters"])]
        torch.cuda._sleep(20_000_000)  # the GPU spins while Python queues runs: no launch gap inside the events
        for a, b in ev:
            self.flush.zero_()
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        ms = sorted(a.elapsed_time(b) for a, b in ev)
        return ms[len(ms) // 2] if len(ms) % 2 else (ms[len(ms) // 2 - 1] + ms[len(ms) // 2]) / 2, ms[0], ms[-1]

    def timed(self, ready, flops):
        """Rows of every (row, fn) in `ready` timed `repeats` times: everyone once, then everyone again,
        so drifts show as spread between repeats."""
        rows = []
        for rep in range(self.t["repeats"]):
            for r, fn in ready:
                med, lo, hi = self.time(fn)
                rows.append(dict(r, repeat=rep, status="ok", median_ms=med, min_ms=lo, max_ms=hi, iters=self.t["iters"],
                                 tflops=flops / (med * 1e-3) / 1e12))
        return rows

    def check(self, out, ref, tol):
        """The course's rule (harness/compare.h) with fa2 bench's tolerances: NaN/Inf count as outside."""
        torch = self.torch
        o = out.float()
        diff = torch.where(torch.isfinite(o), (o - ref).abs(), torch.full_like(o, math.inf))
        bad = int((diff > tol["atol"] + tol["rtol"] * ref.abs()).sum())
        norm = torch.linalg.vector_norm
        rel = float(norm(torch.nan_to_num(o - ref, 0, 0, 0)) / norm(ref).clamp_min(1e-30))
        why = f"{bad} elements outside atol+rtol·|ref|, rel norm {rel:.2e}"
        return bad == 0 and rel <= tol["max_rel_norm"], float(diff.max()), rel, why

    def reference(self, q, k, v, causal):
        """O and LSE in fp32 from the upcast inputs, chunked over query rows, TF32 off."""
        torch = self.torch
        B, H, N, D = q.shape
        out, lse = torch.empty(q.shape, device="cuda"), torch.empty((B, H, N), device="cuda")
        rows, saved = max(1, min(N, REF_CHUNK_BYTES // (4 * H * N))), torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")
        for b in range(B):
            for r0 in range(0, N, rows):
                s = torch.matmul(q[b, :, r0:r0 + rows].float(), k[b].float().transpose(-1, -2)) / math.sqrt(D)
                if causal:
                    cols, rws = torch.arange(N, device="cuda"), torch.arange(r0, r0 + s.shape[1], device="cuda")
                    s.masked_fill_(cols[None, :] > rws[:, None], -math.inf)
                lse[b, :, r0:r0 + rows] = torch.logsumexp(s, -1)
                out[b, :, r0:r0 + rows] = torch.matmul(torch.softmax(s, -1), v[b].float())
        torch.set_float32_matmul_precision(saved)
        return out, lse

    def measure(self, si, s, skip, triton, package, meta):
        torch, rows, ready = self.torch, [], []
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        gen = torch.Generator(device="cuda").manual_seed(1234 + si)
        dt = getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[meta["dtype"]])
        q, k, v = (torch.randn((s["B"], s["H"], s["N"], s["D"]), device="cuda", dtype=dt, generator=gen)
                   for _ in range(3))
        ref, ref_lse = self.reference(q, k, v, s["causal"])
        for pid, label in report.REFS:
            if pid in skip:
                continue
            r = row(pid, label, {"triton_fa2": "triton", "fa_course": "package"}.get(pid, "sdpa"), s, meta, repeat=0)
            if pid == "fa_course":  # the course as a model calls it: (B, N, H, D) views, the op's own step choice
                def fn():
                    if package[0] is None:
                        raise RuntimeError(package[1])
                    o, lse = package[0].attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  causal=s["causal"], return_lse=True)
                    return o.transpose(1, 2), lse
            elif pid == "triton_fa2":
                def fn():
                    if triton[0] is None:
                        raise RuntimeError(triton[1])
                    return triton[0].fa2_forward(q, k, v, causal=s["causal"])
            else:
                def fn(b=getattr(SDPBackend, {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION",
                                              "sdpa_efficient": "EFFICIENT_ATTENTION"}[pid])):
                    with sdpa_kernel([b]):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=s["causal"])
                r["config"] = f"sdpa_kernel({pid[5:]})"
            try:  # the first call also pays one-time costs (Triton's compilation and autotuning)
                out, lse = (lambda o: o if isinstance(o, tuple) else (o, None))(fn())
                torch.cuda.synchronize()
            except Exception as e:  # no kernel for this shape here, a library mismatch: not a wrong answer
                rows.append(dict(r, status="unsupported", note="unavailable: " + (str(e).strip().splitlines() or
                                                                                  [type(e).__name__])[0]))
                continue
            if pid == "fa_course":
                # Which step, and which of its configurations the tuner chose: fa2 bench's rows say theirs.
                r["config"] = package[0].describe(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  causal=s["causal"], return_lse=True)
            ok, err, rel, why = self.check(out, ref, self.tol["o"])
            if lse is not None and not self.check(lse, ref_lse, self.tol["lse"])[0]:
                ok, why = False, why + "; LSE outside its tolerance"
            r.update(max_abs_err=err, rel_err=rel)
            if ok:
                ready.append((r, fn))
            else:
                rows.append(dict(r, status="fail", note="FAILED check: " + why))
        return rows + self.timed(ready, s["flops"])

    def reference_bwd(self, q, k, v, d_o, causal):
        """dQ, dK, dV in fp32 from the upcast inputs, head by head (an N×N fp32 matrix at a time), TF32 off."""
        torch = self.torch
        B, H, N, D = q.shape
        c, grads = 1.0 / math.sqrt(D), [torch.empty(q.shape, device="cuda") for _ in range(3)]
        saved = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")
        keep = torch.ones(N, N, dtype=torch.bool, device="cuda").tril() if causal else None
        for b in range(B):
            for h in range(H):
                qf, kf, vf, of = (t[b, h].float() for t in (q, k, v, d_o))
                s_ = (qf @ kf.T) * c
                if causal:
                    s_.masked_fill_(~keep, -math.inf)
                p = torch.softmax(s_, -1)
                ds = p * (of @ vf.T - (of * (p @ vf)).sum(-1, keepdim=True))  # P ∘ (dP − rowsum(dO ∘ O))
                grads[0][b, h], grads[1][b, h], grads[2][b, h] = c * ds @ kf, c * ds.T @ qf, p.T @ of
        torch.set_float32_matmul_precision(saved)
        return grads

    def measure_bwd(self, si, s, skip, meta):
        """SDPA flash's and cuDNN's backward: dQ, dK, dV checked against the fp32 backward, then the backward
        alone timed (torch.autograd.grad on a kept graph), FLOPs from fa2 bench's plan (flops_bwd)."""
        torch, rows, ready = self.torch, [], []
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        gen = torch.Generator(device="cuda").manual_seed(4321 + si)
        dt = getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[meta["dtype"]])
        q, k, v, d_o = (torch.randn((s["B"], s["H"], s["N"], s["D"]), device="cuda", dtype=dt,
                                    generator=gen) for _ in range(4))
        ref = self.reference_bwd(q, k, v, d_o, s["causal"])
        norm = torch.linalg.vector_norm
        for pid, label in report.REFS_BWD:
            base = pid[:-len(report.BWD)]
            if base in skip or pid in skip:
                continue
            r = row(pid, label, "sdpa", s, meta, repeat=0, direction="bwd", config=f"sdpa_kernel({base[5:]}) backward")
            backend = getattr(SDPBackend, {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION"}[base])
            try:
                qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                with sdpa_kernel([backend]):
                    out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=s["causal"])
                fn = lambda out=out, inputs=(qg, kg, vg): torch.autograd.grad(out, inputs, d_o, retain_graph=True)
                grads = fn()
                torch.cuda.synchronize()
            except Exception as e:
                rows.append(dict(r, status="unsupported", note="unavailable: " + (str(e).strip().splitlines() or
                                                                                  [type(e).__name__])[0]))
                continue
            rels = [float(norm(torch.nan_to_num(g.float() - want, 0, 0, 0)) / norm(want).clamp_min(1e-30))
                    for g, want in zip(grads, ref)]
            finite = all(bool(torch.isfinite(g).all()) for g in grads)
            err = max(float((g.float() - want).abs().max()) for g, want in zip(grads, ref))
            r.update(max_abs_err=err, rel_err=max(rels))
            if finite and max(rels) <= BWD_MAX_REL_NORM:
                ready.append((r, fn))
            else:
                rows.append(dict(r, status="fail", note="FAILED check: dQ, dK, dV relative norms " +
                                 ", ".join(f"{x:.2e}" for x in rels) + ("" if finite else "; NaN/Inf")))
        return rows + self.timed(ready, s["flops_bwd"])

    def ceilings(self, meta):
        torch, rows = self.torch, []
        a, b, c = (torch.randn(GEMM_N, GEMM_N, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        src, dst = (torch.ones(COPY_BYTES, device="cuda", dtype=torch.uint8) for _ in range(2))
        for rep in range(self.t["repeats"]):
            med, lo, hi = self.time(lambda: torch.matmul(a, b, out=c))
            rows.append(row("gemm_bf16", f"bf16 GEMM {GEMM_N}³ (torch.matmul)", "ceiling", None, meta, repeat=rep,
                            status="ok", median_ms=med, min_ms=lo, max_ms=hi, iters=self.t["iters"],
                            tflops=2.0 * GEMM_N ** 3 / (med * 1e-3) / 1e12, config=f"M=N=K={GEMM_N}"))
            med, lo, hi = self.time(lambda: dst.copy_(src))
            rows.append(row("copy_d2d", "device-to-device copy, 1 GiB", "ceiling", None, meta, repeat=rep,
                            status="ok", median_ms=med, min_ms=lo, max_ms=hi, iters=self.t["iters"],
                            gbps=2.0 * COPY_BYTES / (med * 1e-3) / 1e9, config=f"{COPY_BYTES} bytes read + written"))
        return rows


def environment(args, plan, argv):
    import torch
    meta = dict(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, cuda=torch.version.cuda,
                sms=torch.cuda.get_device_properties(0).multi_processor_count, timing=plan["timing"],
                tolerance=plan["tolerance"], dtype=plan.get("dtype", "bf16"), tokens=int(args.tokens or 16384), hidden=int(args.hidden or 2048),
                command=" ".join(["python3 scripts/compare.py"] + argv), triton="not installed",
                commit=args.commit or (report.sh(["git", "rev-parse", "--short", "HEAD"]) or "unknown"),
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    for key, get in (("cudnn", lambda: str(torch.backends.cudnn.version())),
                     ("triton", lambda: __import__("triton").__version__)):
        try:
            meta[key] = get()
        except Exception:
            pass
    smi = report.sh(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm", "--format=csv,noheader,nounits",
                     "-i", "0"])
    if smi.count(",") == 1:
        meta["driver"], meta["max_sm_clock"] = [x.strip() for x in smi.split(",")]
    return meta


def load_triton():
    try:
        path = os.path.join(ROOT, "reference", "triton", "fa2_triton.py")
        spec = importlib.util.spec_from_file_location("fa2_triton", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod, ""
    except Exception as e:  # Triton missing, or no GPU backend for it
        return None, f"Triton FA2: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}"


def load_package(fa2):
    """fa_course from this checkout, on the libfa2_capi.so beside `fa2` (the build being compared)
    unless FA_COURSE_LIB names another."""
    lib = os.path.join(os.path.dirname(os.path.abspath(fa2)), "libfa2_capi.so")
    if os.path.exists(lib):
        os.environ.setdefault("FA_COURSE_LIB", lib)
    sys.path.insert(0, os.path.join(ROOT, "python"))
    try:
        import fa_course
        fa_course.steps()  # loads the library now: a missing or mismatched one is this provider's note
        return fa_course, ""
    except Exception as e:
        return None, f"fa_course: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}"


def parse_baseline(spec):
    """TAG=PATH:STEPS; PATH is an old build's fa2, its build folder, or its libfa2_capi.so (fa2 beside it)."""
    tag, _, rest = spec.partition("=")
    path, _, steps = rest.rpartition(":")
    if not tag or not path or not steps:
        raise SystemExit(f"compare.py: --baseline expects TAG=PATH:STEPS, got '{spec}'")
    path = os.path.join(os.path.dirname(path), "fa2") if path.endswith(".so") else path
    return tag, os.path.join(path, "fa2") if os.path.isdir(path) else path, [int(x) for x in steps.split(",")]


def run_gpu(args, fa2, plan, argv):
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("compare.py: no CUDA GPU visible to PyTorch (--selftest-fake-data needs none)")
    meta, names = environment(args, plan, argv), {st["number"]: st["name"] for st in plan["steps"]}
    baselines = [parse_baseline(b) for b in args.baseline or []]
    skip = set((args.skip_providers or "").split(",")) - {""}
    triton = load_triton() if "triton_fa2" not in skip else (None, "")
    package = load_package(fa2) if "fa_course" not in skip else (None, "")
    clocks = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
    sampler = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,utilization.gpu", "--format=csv,noheader,nounits",
                                "-i", "0", "-lms", "500"], stdout=clocks, stderr=subprocess.DEVNULL)
    T = Torch(plan["timing"], plan["tolerance"])
    rows, raw = T.ceilings(meta), []
    try:
        for si, s in enumerate(plan["shapes"]):
            log(f"[compare] ({si + 1}/{len(plan['shapes'])}) B={s['B']} H={s['H']} N={s['N']} D={s['D']}"
                f"{' causal' if s['causal'] else ''} [{s['family']}]")
            torch.cuda.empty_cache()  # fa2 bench allocates its own tensors
            if args.steps != "none":
                rows += not_run_rows(s, names, meta)
                if s["run"]:
                    got, bench = run_bench(fa2, s["run"], s, plan["timing"], "", names, meta)
                    rows, raw = rows + got, raw + [dict(b, family=s["family"]) for b in bench]
            for tag, path, steps in baselines:  # in the directions asked, as this build's steps
                for d in (args.direction or "fwd").split(","):
                    rows += run_bench(path, steps, s, plan["timing"], tag, names, meta, bwd=d == "bwd")[0]
            if s.get("run") or "fwd" in (args.direction or "fwd"):
                rows += T.measure(si, s, skip, triton, package, meta)
            if "bwd" in (args.direction or ""):
                if args.steps != "none" and s.get("run_bwd"):
                    got, bench = run_bench(fa2, s["run_bwd"], s, plan["timing"], "", names, meta, bwd=True)
                    rows, raw = rows + got, raw + [dict(b, family=s["family"]) for b in bench]
                rows += T.measure_bwd(si, s, skip, meta)
    finally:
        sampler.terminate()
        meta["sm_clock"] = report.clock_summary(clocks.name)
    return rows, raw, meta


FAKE_LOGS = {
    "ctest.log": "1/3 Test  #1: step05.Ragged ......   Passed\n2/3 Test  #2: bug.05-mask_after_max ...   Passed\n"
                 "3/3 Test  #3: bug.04-p_not_cast ...***Failed\n",
    "ctest.xml": "<testsuite><testcase name='bug.05-mask_after_max'><system-out>MUTANT 05-mask_after_max: KILLED — "
                 "max|err|=1.5</system-out></testcase><testcase name='bug.04-p_not_cast'><system-out>MUTANT "
                 "04-p_not_cast: CRASHED — a fault</system-out></testcase></testsuite>",
    "clocks.txt": "1980, 97\n1755, 100\n345, 0\n1980, 99\n",  # the idle sample (utilization 0) is left out
    "sanitizer.csv": "step,tool,result,errors\n05,memcheck,clean,0\n",
    "ladder_d64.csv": "step,name,B,H_q,N_q,D,causal,median_ms,tflops,status,max_abs_err,rel_err\n"
                      "4,x,2,16,4096,64,0,0.2,4,ok,1e-3,2e-3\n5,causal_mask,2,16,4096,64,0,0.166667,5,ok,1e-3,2e-3\n"}


def fake_rows(plan, meta, tmp):
    """Made-up numbers in the forms fa2 bench and the torch providers give them; the old build crashes once."""
    names, rows = {st["number"]: st["name"] for st in plan["steps"]}, []
    rows = [row(p, p, "ceiling", None, meta, repeat=rep, status="ok", median_ms=1.0, tflops=790.0 + rep, gbps=4100.0)
            for rep in range(2) for p in ("gemm_bf16", "copy_d2d")]
    for si, s in enumerate(plan["shapes"]):
        for tag, steps in (("", s["run"]), ("old", [7] if 7 in s["run"] else [])):
            path, crash = os.path.join(tmp, f"{si}{tag}.csv"), tag and si == 0
            fake = [dict(step=n, name=names[n], repeat=rep, status="ok", tflops=tf, median_ms=s["flops"] / tf / 1e9,
                         max_abs_err=2e-3, rel_err=2e-3, config="BLOCK_M=64 BLOCK_N=64 warps=4") for n in steps
                    for rep in range(2) for tf in [0.9 * 1.6 ** n * (1.1 if tag else 1) * (1 + 0.01 * rep)]]
            if fake and not crash:
                report.write_csv(fake, path, list(fake[0]))
            rows += bench_rows(path, int(bool(crash)), "boom", steps, s, tag, names, meta)[0]
        rows += not_run_rows(s, names, meta)
        for i, (pid, label) in enumerate(report.REFS):
            fail, tf = pid == "sdpa_efficient" and s["D"] == 128 and s["causal"], 300.0 + 50 * i
            rows += [row(pid, label, "sdpa", s, meta, repeat=rep, status="fail" if fail else "ok", tflops=tf,
                         median_ms=s["flops"] / tf / 1e9, max_abs_err=3e-3, note="FAILED check: fake" * fail)
                     for rep in range(2)]
        if s.get("run_bwd"):  # the backward: its steps through fa2 bench's CSV, SDPA's through torch
            path = os.path.join(tmp, f"{si}bwd.csv")
            fake = [dict(step=n, name=names[n], repeat=rep, status="ok", tflops=100.0, median_ms=s["flops_bwd"] / 1e14,
                         direction="bwd", config="BLOCK_M=32 BLOCK_N=64") for n in s["run_bwd"] for rep in range(2)]
            report.write_csv(fake, path, list(fake[0]))
            rows += bench_rows(path, 0, "", s["run_bwd"], s, "", names, meta, bwd=True)[0]
            rows += [row(pid, label, "sdpa", s, meta, repeat=rep, status="ok", tflops=200.0 + 100 * i, direction="bwd",
                         median_ms=s["flops_bwd"] / (200.0 + 100 * i) / 1e9, max_abs_err=4e-3)
                     for i, (pid, label) in enumerate(report.REFS_BWD) for rep in range(2)]
    return rows


def selftest(args, fa2):
    """Every report from made-up numbers and logs, on the real plan of `fa2 bench --list --json` (no GPU)."""
    # With the backward too, when the build has a step with one: its rows and ratio tables are checked below.
    plan = fa2_plan(fa2, sweep_args(args) + ([] if args.direction else ["--direction", "fwd,bwd"]))
    problems = [f"{k} missing from the plan" for k in ("tolerance", "timing", "steps", "shapes") if k not in plan]
    backward = any(s.get("run_bwd") for s in plan.get("shapes", []))
    for s in plan.get("shapes", []):
        pairs = s["N"] * (s["N"] + 1) // 2 if s["causal"] else s["N"] ** 2
        problems += [] if s["flops"] == 4 * s["B"] * s["H"] * s["D"] * pairs else [f"FLOPs of {s}"]
        problems += [] if s.get("flops_bwd") == 2.5 * s["flops"] else [f"backward FLOPs of {s}"]
    out = args.out or tempfile.mkdtemp(prefix="compare-selftest-")
    logs, readme, prefix = (os.path.join(out, x) for x in ("logs", "README.md", "compare_selftest"))
    os.makedirs(logs, exist_ok=True)
    meta = dict(gpu="NVIDIA H200 (fake data)", commit="selftest", date="2000-01-01 00:00 UTC", timing=plan["timing"],
                tolerance=plan["tolerance"], dtype=plan.get("dtype", "bf16"), sm_clock="1980 / 1980 / 1980 MHz",
                command="compare.py --selftest")
    report.write(readme, f"# T\n{report.MARK_BEGIN}\nold table\n{report.MARK_END}\n## After\n")
    res, written = report.write_compare(fake_rows(plan, meta, logs), meta, out, "compare_selftest", readme)
    md, text = report.read(prefix + ".md"), report.read(readme)
    with open(prefix + ".csv", newline="") as f:  # every attention row says fwd or bwd; a ceiling row neither
        problems += [f"direction '{r['direction']}' on {r['provider']} {r['N_q']}" for r in csv.DictReader(f)
                     if r["direction"] not in (("fwd", "bwd") if r["N_q"] else ("",))]
    expect = lambda text, needles, what: [f"{what} lacks '{n}'" for n in needles if n not in text]
    problems += expect(md, ["SDPA cuDNN", "Triton FA2 (seed)", "fa_course.attention (package, step=None)", "07_lse_store @old", "**FAIL**", "**ERROR**", "n/a",
                            "seeds' shape", "÷ SDPA flash / ÷ SDPA cuDNN", "gemm_bf16", "spread between repeats",
                            "exited with 1: boom", f"‖/‖ref‖ ≤ {plan['tolerance']['o']['max_rel_norm']:g},"], "report")
    if backward:
        problems += expect(md, ["Attention forward and backward", "SDPA flash backward", "17_backward_mma backward",
                                "a backward over theirs", "0.50 / 0.33"], "report (backward)")
    problems += expect(text, [report.MARK_BEGIN + "\nbf16 forward", "00_naive", report.MARK_END + "\n## After"] +
                       ["_tflops.png)"] * ("matplotlib" in sys.modules), "README")
    problems += ["README block not replaced"] * ("old table" in text)
    problems += [f"the raw bench CSV of --name {n} would overwrite the comparison's" for n in
                 ("compare_x", "backward_x") if bench_csv_name(n) == n]
    main(["--from-csv", prefix + ".csv", "--readme", readme])
    problems += ["--from-csv does not reproduce the report"] * (report.read(prefix + ".md") != md)
    main(["--from-csv", prefix + ".csv", "--pair", "step07@old,step07"])
    problems += expect(report.read(prefix + "_step07_vs_step07_at_old.md"),
                       ["Lowest ratio on the reference shapes: 0.909"], "pair table")
    for name, body in FAKE_LOGS.items():  # the GPU report from made-up logs
        report.write(os.path.join(logs, name), body)
    report.gpu_report(argparse.Namespace(logs=logs, out=out, slug="gpu", gpu="fake", commit="selftest", ctest_rc=0))
    problems += expect(report.read(os.path.join(out, "gpu.md")), [
        "| `05-mask_after_max` | killed | max\\|err\\|=1.5 |", "**CRASHED**", "1755 / 1980 / 1980 MHz",
        "| 05_causal_mask | no | 1.00e-03 | 2.00e-03 | 0.167 | 5.0 | 1.20× |", "| 05 | memcheck | clean | 0 |"],
        "GPU report")
    for p in problems:
        log(f"[selftest] PROBLEM: {p}")
    log(f"[selftest] {'FAILED' if problems else 'ok'}: {len(res.providers)} providers, {len(written)} files in {out}")
    return 1 if problems else 0


def bench_csv_name(name):
    """The raw fa2 bench CSV's file stem beside the comparison `name`: compare_X -> bench_X, any other
    name -> name_bench (never `name` itself, which would overwrite the comparison's own CSV)."""
    return name.replace("compare_", "bench_", 1) if name.startswith("compare_") else name + "_bench"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="The sweep and timing options go to "
                                 "`fa2 bench` (see `fa2 --help` for their defaults).")
    ap.add_argument("--fa2", help="this build's fa2 (default: next to --lib, else build/fa2)")
    ap.add_argument("--lib", help="this build's libfa2_capi.so: its folder's fa2 is used")
    ap.add_argument("--baseline", action="append", metavar="TAG=PATH:STEPS",
                    help="also time steps STEPS of an old build's fa2 (or its folder), labelled @TAG (repeatable)")
    ap.add_argument("--out", help="output folder (default: docs/results; with --from-csv, the CSV's folder)")
    ap.add_argument("--name", help="file name stem (default: compare_<gpu>[_quick])")
    ap.add_argument("--readme", help="README to update between the results markers (default: README.md)")
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument("--skip-providers", help="comma-separated: sdpa_flash,sdpa_cudnn,sdpa_efficient,triton_fa2,fa_course")
    ap.add_argument("--commit", help="commit to stamp the results with (default: git rev-parse)")
    ap.add_argument("--from-csv", metavar="CSV", help="no GPU: rewrite the reports (or --pair) from a CSV this wrote")
    ap.add_argument("--pair", metavar="OLD,NEW", help="with --from-csv: NEW against OLD, e.g. step07@0e4c464,step08")
    ap.add_argument("--pair-out", metavar="MD", help="where --pair writes (default: next to the CSV)")
    ap.add_argument("--selftest-fake-data", action="store_true", help="no GPU: every report from made-up numbers")
    for k in SWEEP:
        ap.add_argument("--" + k.replace("_", "-"), **({"action": "store_true"} if k in SWEEP[-4:] else {}),
                        help="passed to fa2 bench" + (" ('none': no course steps)" if k == "steps" else ""))
    args = ap.parse_args(argv)
    fa2 = args.fa2 or os.path.join(os.path.dirname(args.lib) if args.lib else os.path.join(ROOT, "build"), "fa2")
    readme = None if args.no_readme else args.readme or os.path.join(ROOT, "README.md")
    if args.selftest_fake_data:
        return selftest(args, fa2)
    if args.from_csv:
        rows, prefix = report.read_csv(args.from_csv), os.path.splitext(args.from_csv)[0]
        meta = json.loads(report.read(prefix + ".json")) if os.path.exists(prefix + ".json") else dict(
            fa2_plan(fa2, []), **{k: rows[0][k] for k in ("gpu", "commit", "date")})  # a CSV from before the .json
        if args.pair:
            old, _, new = args.pair.partition(",")
            path = args.pair_out or f"{prefix}_{new}_vs_{old}.md".replace("@", "_at_")
            report.write(path, report.pair_report(report.Results(rows), meta, old.strip(), new.strip()))
            return log(f"[compare] wrote {path}") or 0
        out, name = args.out or os.path.dirname(prefix) or ".", os.path.basename(prefix)
        return log("[compare] wrote " + ", ".join(report.write_compare(rows, meta, out, name, readme)[1])) or 0
    plan = fa2_plan(fa2, sweep_args(args))
    rows, raw, meta = run_gpu(args, fa2, plan, argv)
    slug = "".join(c if c.isalnum() else "_" for c in meta["gpu"]).strip("_")
    out = args.out or os.path.join(ROOT, "docs", "results")
    name = args.name or f"compare_{slug}" + ("_quick" if args.quick else "")
    log("[compare] wrote " + ", ".join(report.write_compare(rows, meta, out, name, readme)[1]))
    if raw:  # this build's fa2 bench rows over the whole sweep, as fa2 bench --csv writes them
        report.write_csv(raw, os.path.join(out, bench_csv_name(name) + ".csv"), list(raw[0]))
    failed = [r for r in rows if r["status"] in report.FAILED]
    for r in failed:
        log(f"[compare] FAILED: {r['label']}, B={r['B']} H={r['H']} N={r['N_q']} D={r['D']}: {r['note']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
