#!/usr/bin/env python3
"""What the PyTorch op costs per call on top of the C interface, on a shape so small that the
kernel itself takes a few microseconds. Wall time per call over a loop of launches, the GPU
synchronised once at the end, for:

- the C interface: fa_course._capi.forward on parameters built once (one ctypes call into fa_forward);
- the op's pieces one by one: the argument checks, the two output allocations, the parameter struct,
  the stream lookup, and the whole body called as a plain Python function;
- the op through the dispatcher (torch.ops.fa_course.forward), and the same body registered with the
  low-level torch.library.Library API instead of the custom_op decorator, to see what each costs;
- fa_course.attention with a step and with step=None; torch SDPA for scale; the kernel's own time
  back to back from CUDA events.

    python3 scripts/package_overhead.py [--calls 2000] [--step N]
"""
import argparse
import time

import torch

import fa_course
from fa_course import _capi, ops


def per_call_us(fn, calls):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def low_level_op():
    """ops._run registered through torch.library.Library (define + impl), no custom_op wrapper."""
    lib = torch.library.Library("fa_course_overhead", "DEF")
    lib.define("forward(Tensor q, Tensor k, Tensor v, bool causal, bool bottom_right, float softmax_scale, "
               "bool return_lse, int step) -> (Tensor, Tensor)")
    lib.impl("forward", ops._run, "CUDA")
    return lib, torch.ops.fa_course_overhead.forward.default


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--step", type=int, default=None, help="default: the step attention() picks")
    a = ap.parse_args()
    q, k, v = (torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fa_course.attention(q, k, v)  # loads the library, learns this GPU's refusals
    step = fa_course.pick_step(q, k, v) if a.step is None else a.step
    o, lse, p = ops._outputs_and_params(q, k, v, False, False, 0.0, False)
    stream = ops._stream(q.device.index)
    _keep, low = low_level_op()
    args = (q, k, v, False, False, 0.0, False, step)

    rows = [
        ("C interface: _capi.forward, params built once", lambda: _capi.forward(step, p, stream)),
        ("  piece: argument checks (_check)", lambda: ops._check(q, k, v)),
        ("  piece: O and LSE allocation (2 torch.empty)", lambda: (
            torch.empty((1, 128, 1, 64), dtype=q.dtype, device=q.device),
            torch.empty((0,), dtype=torch.float32, device=q.device))),
        ("  piece: the parameter struct (_params)", lambda: ops._params(q, k, v, o, None, False, False, 0.0)),
        ("  piece: the current stream (_stream)", lambda: ops._stream(q.device.index)),
        ("  piece: fa_choose_step (pick_step's; fa_forward(STEP_AUTO) chooses in C)", lambda: _capi.choose(p)),
        ("op body as a plain function (ops._run)", lambda: ops._run(*args)),
        ("op via torch.library.Library define/impl", lambda: low(*args)),
        ("op via torch.library.custom_op (torch.ops.fa_course.forward)",
         lambda: torch.ops.fa_course.forward.default(*args)),
        (f"fa_course.attention(q, k, v, step={step})", lambda: fa_course.attention(q, k, v, step=step)),
        ("fa_course.attention(q, k, v) (step=None)", lambda: fa_course.attention(q, k, v)),
        ("torch SDPA, for scale", lambda: torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))),
    ]
    times = [(name, per_call_us(fn, a.calls)) for name, fn in rows]

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(200):
        _capi.forward(step, p, stream)
    end.record()
    torch.cuda.synchronize()
    kernel = start.elapsed_time(end) / 200 * 1e3

    direct = times[0][1]
    print(f"B=1 H=1 N=128 D=64, step {step}, {a.calls} calls each, µs per call (wall, launch-bound); "
          f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for name, us in times:
        extra = "" if name.startswith("  piece") or us is direct else f"   (+{us - direct:.2f} over the C interface)"
        print(f"  {name:<64} {us:7.2f}{extra}")
    print(f"  {'kernel time back to back (CUDA events)':<64} {kernel:7.2f}")


if __name__ == "__main__":
    main()
