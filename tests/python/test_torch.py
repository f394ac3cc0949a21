"""fa_course.attention on a GPU: against PyTorch's SDPA and an fp64 reference on ragged shapes,
every layout, GQA, both causal alignments, LSE; torch.compile(fullgraph=True), opcheck, CUDA graph
replay, bad inputs. Skipped without PyTorch or a CUDA GPU (the ctest case `python.torch` then
reports itself skipped, never passed)."""
import warnings

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import fa_course  # noqa: E402
from fa_course.reference import attention_fp64  # noqa: E402

DEV = "cuda"
# The course's tolerance against an fp32-or-better reference (harness/check.h): |err| <= 0.01 + 0.01·|ref|.
ATOL, RTOL = 1e-2, 1e-2


def reference(q, k, v, causal=False, bottom_right=False, scale=None, lse=False):
    """fp64 attention of (B, N, H, D) tensors (fa_course.reference)."""
    o, l = attention_fp64(q, k, v, causal=causal, causal_align="bottom_right" if bottom_right else "top_left",
                          softmax_scale=scale)
    return (o, l) if lse else o


def inputs(b, n_q, n_kv, h_q, h_kv, d, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    mk = lambda n, h: torch.randn(b, n, h, d, device=DEV, dtype=torch.bfloat16, generator=g)
    return mk(n_q, h_q), mk(n_kv, h_kv), mk(n_kv, h_kv)


def close(out, ref):
    torch.testing.assert_close(out.double(), ref.double(), atol=ATOL, rtol=RTOL)


SHAPES = [(1, 1, 1, 1, 1, 64), (2, 77, 131, 4, 2, 64), (1, 1013, 1531, 8, 8, 128), (2, 300, 17, 6, 3, 128),
          (1, 1531, 1013, 4, 1, 64)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}_Nq{}_Nkv{}_H{}_Hkv{}_D{}".format(*s))
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "top_left"), (True, "bottom_right")])
def test_against_fp64_reference_with_lse(shape, causal, align):
    q, k, v = inputs(*shape)
    o, lse = fa_course.attention(q, k, v, causal=causal, causal_align=align, return_lse=True)
    ref_o, ref_lse = reference(q, k, v, causal=causal, bottom_right=align == "bottom_right", lse=True)
    assert o.shape == q.shape and o.dtype == torch.bfloat16 and o.is_contiguous()
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32
    close(o, ref_o)
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse.double()[finite], ref_lse[finite], atol=1e-3, rtol=1e-3)
    assert torch.equal(torch.isinf(lse), ~finite)  # rows that see no key: -inf, and only they


@pytest.mark.parametrize("causal", [False, True])
def test_against_sdpa(causal):
    q, k, v = inputs(2, 1024, 1024, 8, 8, 128, seed=1)
    out = fa_course.attention(q, k, v, causal=causal)
    ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                           is_causal=causal).transpose(1, 2)
    close(out, ref)


def test_bhnd_views_and_noncontiguous_layouts():
    q, k, v = inputs(2, 200, 333, 4, 2, 64, seed=2)
    ref = reference(q, k, v)
    bhnd = [t.transpose(1, 2).contiguous() for t in (q, k, v)]  # (B, H, N, D) storage
    close(fa_course.attention(*(t.transpose(1, 2) for t in bhnd)), ref)  # passed as (B, N, H, D) views
    wide = [torch.cat([t, t], dim=-1)[..., :64] for t in (q, k, v)]  # row stride 128, not D
    close(fa_course.attention(*wide), ref)


def test_gqa_and_scale():
    q, k, v = inputs(1, 257, 257, 8, 2, 128, seed=3)
    close(fa_course.attention(q, k, v, softmax_scale=0.05), reference(q, k, v, scale=0.05))
    with pytest.raises(ValueError, match="softmax_scale"):  # rounds to 0 in fp32, the library's "default"
        fa_course.attention(q, k, v, softmax_scale=1e-46)
    for bad in (float("inf"), float("nan"), 1e39, -0.1):  # the library's refusal (1e39 overflows fp32 to inf)
        with pytest.raises(ValueError, match="softmax.scale"):
            fa_course.attention(q, k, v, softmax_scale=bad)


HOPPER = torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.parametrize("step", [s.number for s in fa_course.steps() if s.number >= 4])
def test_every_tensor_core_step_on_this_gpu(step):
    q, k, v = inputs(1, 130, 190, 2, 1, 64, seed=4)
    if step >= 11 and not HOPPER:  # sm_90a code: refused on any other GPU, with the reason
        with pytest.raises(fa_course.UnsupportedInputError, match="built for compute capability 9.0"):
            fa_course.attention(q, k, v, step=step)
        return
    close(fa_course.attention(q, k, v, step=step), reference(q, k, v))


def test_pick_step_names_the_step_attention_runs():
    q, k, v = inputs(1, 300, 333, 4, 2, 128, seed=10)
    auto = fa_course.attention(q, k, v, causal=True, causal_align="bottom_right")  # refusals are learnt here
    picked = fa_course.pick_step(q, k, v, causal=True, causal_align="bottom_right")
    if HOPPER:
        assert picked == max(s.number for s in fa_course.steps())
    # The kernels are deterministic: the same step on the same inputs gives the same bits.
    assert torch.equal(auto, fa_course.attention(q, k, v, causal=True, causal_align="bottom_right", step=picked))
    assert fa_course.pick_step(q, k, v, return_lse=True) >= 7  # the first step that writes LSE
    said = fa_course.describe(q, k, v, causal=True, causal_align="bottom_right")
    assert said.startswith(f"step {picked}: ") and ("BLOCK_M=" in said or picked < 6), said
    q96 = inputs(1, 64, 64, 2, 2, 96)[0]
    with pytest.raises(fa_course.UnsupportedInputError, match="head dim"):
        fa_course.pick_step(q96, q96, q96)


class Block(torch.nn.Module):
    """A projection after attention, with the scale a model passes (transformers always passes one)."""

    def __init__(self, scale=None):
        super().__init__()
        self.proj = torch.nn.Linear(64, 64, dtype=torch.bfloat16, device=DEV)
        self.scale = scale

    def forward(self, q, k, v):
        return self.proj(fa_course.attention(q, k, v, causal=True, softmax_scale=self.scale))


@pytest.mark.parametrize("scale", [None, 0.125, 0.3])
def test_compile_fullgraph(scale):
    block = Block(scale)
    q, k, v = inputs(2, 128, 128, 4, 4, 64, seed=5)
    eager = block(q, k, v)
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)(q, k, v)
    torch.testing.assert_close(compiled, eager)
    close(block.proj(fa_course.attention(q, k, v, causal=True, softmax_scale=scale)), eager)


def test_scale_rounding_rule_matches_fp32():
    """The scale check is plain float arithmetic (traceable); it must agree with fp32's own rounding."""
    import struct

    from fa_course.ops import _FP32_ROUNDS_TO_ZERO
    for x in (2.0 ** -150, 2.0 ** -150 * (1 + 2 ** -52), 2.0 ** -149, 1e-46, 1e-45, 7e-46, 0.0, 0.125):
        rounds_to_zero = struct.unpack("f", struct.pack("f", x))[0] == 0.0
        assert (abs(x) <= _FP32_ROUNDS_TO_ZERO) == rounds_to_zero, x


def test_opcheck():
    q, k, v = inputs(1, 64, 96, 2, 1, 64, seed=6)
    for return_lse in (False, True):
        torch.library.opcheck(torch.ops.fa_course.forward.default, (q, k, v, True, False, 0.0, return_lse, -1))


def test_opcheck_with_inputs_that_require_grad():
    # The autograd registration and the fake are checked with inputs that require grad; the AOT
    # check would ask for a gradient, which raises until the backward exists (next test).
    q, k, v = (t.requires_grad_() for t in inputs(1, 64, 96, 2, 1, 64, seed=6))
    for return_lse in (False, True):
        torch.library.opcheck(torch.ops.fa_course.forward.default, (q, k, v, True, False, 0.0, return_lse, -1),
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_inference_with_grad_inputs_runs_and_backward_raises():
    q, k, v = (t.requires_grad_() for t in inputs(1, 100, 120, 4, 2, 128, seed=11))
    with warnings.catch_warnings():  # the warning PyTorch gives for an op with no autograd kernel
        warnings.filterwarnings("error", message=".*autograd kernel was not registered.*")
        out = fa_course.attention(q, k, v, causal=True)
    assert out.requires_grad and out.grad_fn is not None
    close(out.detach(), reference(q.detach(), k.detach(), v.detach(), causal=True))
    with pytest.raises(NotImplementedError, match="no backward pass yet"):
        out.float().sum().backward()
    assert q.grad is None and k.grad is None and v.grad is None
    with torch.no_grad():
        assert not fa_course.attention(q, k, v).requires_grad
    # Compiled: the graph traces through the backward op's fake; asking for the gradient raises.
    torch._dynamo.reset()
    compiled = torch.compile(Block(0.2), fullgraph=True)
    q64, k64, v64 = (t.requires_grad_() for t in inputs(1, 64, 64, 2, 2, 64, seed=12))
    y = compiled(q64, k64, v64)
    with pytest.raises(NotImplementedError, match="no backward pass yet"):
        y.float().sum().backward()


def test_cuda_graph_replay():
    q, k, v = inputs(1, 256, 256, 4, 4, 64, seed=7)
    fa_course.attention(q, k, v)  # warm-up: the step is chosen (and tuned) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fa_course.attention(q, k, v)
    for seed in (8, 9):
        new = inputs(1, 256, 256, 4, 4, 64, seed=seed)
        for t, n in zip((q, k, v), new):
            t.copy_(n)
        graph.replay()
        torch.cuda.synchronize()
        close(out, reference(q, k, v))


def test_bad_inputs_raise_with_the_librarys_message():
    q, k, v = inputs(1, 64, 64, 4, 4, 64)
    with pytest.raises(ValueError, match="bfloat16"):
        fa_course.attention(q.float(), k, v)
    with pytest.raises(ValueError, match="CUDA"):
        fa_course.attention(q.cpu(), k.cpu(), v.cpu())
    with pytest.raises(ValueError, match="4-D"):
        fa_course.attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="causal_align"):
        fa_course.attention(q, k, v, causal=True, causal_align="diagonal")
    q96, k96, v96 = inputs(1, 64, 64, 4, 4, 96)
    with pytest.raises(fa_course.UnsupportedInputError, match="head dim 96"):
        fa_course.attention(q96, k96, v96, step=15)
    q6, _, _ = inputs(1, 64, 64, 6, 4, 64)
    with pytest.raises(fa_course.UnsupportedInputError, match="multiple"):
        fa_course.attention(q6, k, v)
    with pytest.raises(fa_course.InvalidCallError, match="unknown step 99"):
        fa_course.attention(q, k, v, step=99)


@pytest.mark.parametrize("shape", [(2, 77, 131, 4, 2, 64), (1, 300, 200, 8, 1, 128)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_func_is_flash_attns_call(shape, causal):
    q, k, v = inputs(*shape, seed=13)
    out, lse = fa_course.flash_attn_func(q, k, v, None, 0.1, causal, return_lse=True)  # positional, as flash-attn
    ref_o, ref_lse = reference(q, k, v, causal=causal, bottom_right=True, scale=0.1, lse=True)
    close(out, ref_o)
    seen = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse.double()[seen], ref_lse[seen], atol=1e-3, rtol=1e-3)
    close(fa_course.flash_attn_func(q, k, v, causal=causal, deterministic=True), reference(
        q, k, v, causal=causal, bottom_right=True))


def test_flash_attn_func_refuses_what_it_does_not_have():
    q, k, v = inputs(1, 64, 64, 2, 2, 64, seed=14)
    for kwargs, what in (({"dropout_p": 0.1}, "dropout"), ({"window_size": (16, 0)}, "sliding window"),
                         ({"softcap": 30.0}, "softcapping"), ({"alibi_slopes": torch.ones(2, device=DEV)}, "ALiBi"),
                         ({"return_attn_probs": True}, "return_attn_probs")):
        with pytest.raises(NotImplementedError, match=what):
            fa_course.flash_attn_func(q, k, v, **kwargs)


def test_the_default_path_is_the_librarys_choice():
    """step=None is one fa_forward(FA_STEP_AUTO): the step it runs is pick_step's, bit for bit."""
    q, k, v = inputs(2, 333, 500, 4, 2, 128, seed=15)
    picked = fa_course.pick_step(q, k, v, causal=True)
    assert picked == (101 if HOPPER else 100), "the production kernels: Hopper's on an H100 or H200, mma.sync's elsewhere"
    assert torch.equal(fa_course.attention(q, k, v, causal=True), fa_course.attention(q, k, v, causal=True, step=picked))
    # A K that broadcasts over the batch: the Hopper kernel's tensor maps refuse it, so the choice
    # falls to the production kernel without them, 100 (mma.sync), on every GPU.
    kb = k[:1].expand(2, -1, -1, -1)
    assert fa_course.pick_step(q, kb, v) == 100
    close(fa_course.attention(q, kb, v), reference(q, kb.contiguous(), v))
    close(fa_course.attention(q, kb, v, step=10), reference(q, kb.contiguous(), v))
