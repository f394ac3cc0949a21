"""Context-parallel attention (fa_course.context_parallel) against the fp64 reference.

- P simulated ranks in one process: on the CPU with fp64 attention for each step (the merge and the
  ring's bookkeeping alone, exact to fp32), and on a GPU with the course's kernel (bf16 tolerance).
- The ring over real processes (torchrun, context_parallel/check_ring.py): three CPU processes over
  gloo wherever PyTorch is, and two GPUs over NCCL, skipped with a message where fewer are present.
Skipped as a whole without PyTorch. Three ctest cases (tests/python/run.sh): python.context_parallel
runs the unmarked tests, python.context_parallel.gpu those marked `gpu`, python.context_parallel.nccl
those marked `multigpu`; each is skipped, never passed, where its hardware is missing."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from fa_course import context_parallel as cp  # noqa: E402
from fa_course.reference import attend_fp64, attention_fp64  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPU = torch.cuda.is_available()


def inputs(b, n_q, n_kv, h_q, h_kv, d, device, dtype, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [torch.randn(b, n, h, d, generator=g).to(device, dtype) for n, h in ((n_q, h_q), (n_kv, h_kv), (n_kv, h_kv))]


# (B, N_q, N_kv, H_q, H_kv, D): ragged lengths, N_q != N_kv both ways, GQA.
SHAPES = [(1, 37, 37, 2, 2, 16), (2, 50, 93, 4, 2, 16), (1, 93, 50, 2, 1, 32), (1, 64, 64, 3, 1, 16)]
MODES = [(False, "top_left"), (True, "top_left"), (True, "bottom_right")]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal,align", MODES)
def test_simulated_ranks_on_the_cpu_match_fp64(shape, world, kind, causal, align):
    q, k, v = inputs(*shape, "cpu", torch.float64, seed=world)
    o, lse = cp.simulate(q, k, v, world, kind=kind, causal=causal, causal_align=align, attend=attend_fp64)
    ref_o, ref_lse = attention_fp64(q, k, v, causal=causal, causal_align=align)
    torch.testing.assert_close(o, ref_o, atol=1e-6, rtol=1e-6)  # the merge runs in fp32
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), seen)  # rows that see no key: -inf, and only they
    torch.testing.assert_close(lse.double()[seen], ref_lse[seen], atol=1e-5, rtol=1e-5)
    assert torch.equal(o[~seen.transpose(1, 2)], torch.zeros_like(o[~seen.transpose(1, 2)]))


def test_merge_of_two_halves_is_the_whole():
    """Step 07's identity on its own: attention over keys [0, m) and [m, n), merged, is attention over [0, n)."""
    q, k, v = inputs(1, 20, 30, 2, 2, 8, "cpu", torch.float64, seed=7)
    acc = cp.Accumulator(1, 20, 2, 8, "cpu")
    for lo, hi in ((0, 11), (11, 30)):
        acc.merge(slice(0, 20), *attend_fp64(q, k[:, lo:hi], v[:, lo:hi], None, 8 ** -0.5))
    o, lse = acc.result(torch.float64)
    ref_o, ref_lse = attention_fp64(q, k, v)
    torch.testing.assert_close(o, ref_o, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="no CUDA GPU: the course's kernel cannot run")
@pytest.mark.parametrize("world,kind", [(2, "zigzag"), (4, "zigzag"), (3, "contiguous")])
@pytest.mark.parametrize("shape,causal,align", [((1, 1000, 1000, 4, 2, 128), True, "top_left"),
                                                ((2, 777, 777, 4, 4, 64), False, "top_left"),
                                                ((1, 600, 1531, 8, 2, 64), True, "bottom_right")], ids=str)
def test_simulated_ranks_with_the_kernel_match_fp64(world, kind, shape, causal, align):
    q, k, v = inputs(*shape, "cuda", torch.bfloat16, seed=world)
    o, lse = cp.simulate(q, k, v, world, kind=kind, causal=causal, causal_align=align)
    ref_o, ref_lse = attention_fp64(q, k, v, causal=causal, causal_align=align)
    torch.testing.assert_close(o.double(), ref_o, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-3, rtol=1e-3)


def torchrun(backend, nproc=2, *extra):
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")  # the package as this process found it (PYTHONPATH, FA_COURSE_LIB)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           os.path.join(ROOT, "context_parallel", "check_ring.py"), "--backend", backend, *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    return r.returncode, r.stdout + r.stderr


def test_ring_over_three_processes_gloo_cpu():
    # Three, not two: with two ranks, the slice from rank r − t and the one from r + t are the same,
    # so a ring turned the wrong way would go unnoticed.
    rc, out = torchrun("gloo", nproc=3)
    assert rc == 0 and "all ranks agree" in out, out[-4000:]


def test_ring_on_a_process_group_of_its_own_gloo_cpu():
    # Ranks 1-3 of 4: the ring's neighbours are group ranks, the messages go to global ones.
    rc, out = torchrun("gloo", 4, "--subgroup")
    assert rc == 0 and "all ranks agree" in out, out[-4000:]


@pytest.mark.multigpu
@pytest.mark.skipif(not GPU or torch.cuda.device_count() < 2,
                    reason="the NCCL ring needs two GPUs; this machine has "
                           f"{torch.cuda.device_count() if GPU else 0}")
def test_ring_over_two_gpus_nccl():
    rc, out = torchrun("nccl")
    assert rc == 0 and "all ranks agree" in out, out[-4000:]
