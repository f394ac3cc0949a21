#!/usr/bin/env python3
"""What the PyTorch op costs per call on top of the C interface, on a shape so small that the
kernel itself takes a few microseconds: fa_course.attention (argument checks, the custom op's
dispatch, output allocation, the step choice) against fa_course._capi.forward on parameters
built once (one ctypes call into fa_forward). Wall time per call over a loop of launches, the GPU
synchronised once at the end; and the kernel's own time from CUDA events, for scale.

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--step", type=int, default=None, help="default: the step attention() picks")
    a = ap.parse_args()
    q, k, v = (torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    lse = torch.empty((1, 1, 128), device="cuda", dtype=torch.float32)
    step = a.step
    if step is None:  # the step attention(step=None) runs: the first candidate that accepts the call
        p = ops._params(q, k, v, o, None, False, False, 0.0)
        step = next(s for s in ops._candidates() if _capi.validate(s, p) is None)
    p = ops._params(q, k, v, o, None, False, False, 0.0)
    stream = torch.cuda.current_stream().cuda_stream

    direct = per_call_us(lambda: _capi.forward(step, p, stream), a.calls)
    op_auto = per_call_us(lambda: fa_course.attention(q, k, v), a.calls)
    op_step = per_call_us(lambda: fa_course.attention(q, k, v, step=step), a.calls)
    sdpa = per_call_us(lambda: torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)), a.calls)

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(200):
        _capi.forward(step, p, stream)
    end.record()
    torch.cuda.synchronize()
    kernel = start.elapsed_time(end) / 200 * 1e3

    print(f"B=1 H=1 N=128 D=64, step {step}, {a.calls} calls each, µs per call (wall, launch-bound):")
    print(f"  C interface (fa_forward via ctypes, params built once): {direct:7.2f}")
    print(f"  fa_course.attention(q, k, v, step={step}):             {op_step:7.2f}   (+{op_step - direct:.2f})")
    print(f"  fa_course.attention(q, k, v) (step=None):              {op_auto:7.2f}   (+{op_auto - direct:.2f})")
    print(f"  torch SDPA, for scale:                                 {sdpa:7.2f}")
    print(f"  kernel time back to back (CUDA events):                {kernel:7.2f}")


if __name__ == "__main__":
    main()
