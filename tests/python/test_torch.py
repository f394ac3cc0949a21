"""fa_course.attention on a GPU: against PyTorch's SDPA and an fp64 reference on ragged shapes,
every layout, GQA, both causal alignments, LSE; torch.compile(fullgraph=True), opcheck, CUDA graph
replay, bad inputs. Skipped without PyTorch or a CUDA GPU (the ctest case `python.torch` then
reports itself skipped, never passed)."""
import itertools
import math
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


def inputs(b, n_q, n_kv, h_q, h_kv, d, seed=0, dtype=torch.bfloat16):
    g = torch.Generator(device=DEV).manual_seed(seed)
    mk = lambda n, h: torch.randn(b, n, h, d, device=DEV, dtype=dtype, generator=g)
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
    q80 = inputs(1, 64, 64, 2, 2, 80)[0]  # no build has 80 (FA_HEAD_DIMS=all has 96)
    with pytest.raises(fa_course.UnsupportedInputError, match="head dim"):
        fa_course.pick_step(q80, q80, q80)


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
    # Every check, test_aot_dispatch_dynamic included: it compiles the op and compares the gradients
    # of the sum of its outputs with eager mode's (through torch.ops.fa_course.backward). The LSE
    # output carries no gradient; with return_lse=False the backward recomputes it.
    q, k, v = (t.requires_grad_() for t in inputs(1, 64, 96, 2, 1, 64, seed=6))
    for return_lse in (False, True):
        torch.library.opcheck(torch.ops.fa_course.forward.default, (q, k, v, True, False, 0.0, return_lse, -1))
    torch.library.opcheck(torch.ops.fa_course.forward.default, (q, k, v, True, True, 0.2, True, -1, False))


def test_opcheck_backward_op():
    q, k, v = inputs(1, 64, 96, 2, 1, 64, seed=6)
    do = torch.randn_like(q)
    for causal, bottom_right in ((False, False), (True, False), (True, True)):
        o, lse = torch.ops.fa_course.forward.default(q, k, v, causal, bottom_right, 0.0, True, -1)
        torch.library.opcheck(torch.ops.fa_course.backward.default,
                              (do, q, k, v, o, lse, causal, bottom_right, 0.0, -1, False))
    torch.library.opcheck(torch.ops.fa_course.returned_lse.default, (lse, q, k, v))


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


@pytest.mark.parametrize("shape", [(1, 1, 8192, 32, 8, 128), (3, 1, 1000, 6, 2, 64), (2, 5, 777, 16, 2, 128)],
                         ids=lambda s: "B{}_Nq{}_Nkv{}_H{}_Hkv{}_D{}".format(*s))
def test_decode_calls_split_in_a_workspace_from_pytorch(shape):
    """A decode call (a few query rows per KV head) through the library's choice: the package gives
    the decode kernel a workspace from PyTorch's allocator, it splits the keys, and O and the LSE are
    the fp64 reference's; bottom-right causal for the speculative rows."""
    b, n_q, n_kv, h_q, h_kv, d = shape
    q, k, v = inputs(b, n_q, n_kv, h_q, h_kv, d, seed=11)
    from fa_course import _capi, ops
    p = ops._params(q, k, v, torch.empty_like(q), None, n_q > 1, True, 0.0)
    assert _capi.forward_workspace_size(p) > 0, "a decode call should get a split workspace"
    o, lse = fa_course.attention(q, k, v, causal=n_q > 1, causal_align="bottom_right", return_lse=True)
    ref_o, ref_lse = reference(q, k, v, causal=n_q > 1, bottom_right=True, lse=True)
    close(o, ref_o)
    torch.testing.assert_close(lse.double(), ref_lse.double(), atol=1e-3, rtol=1e-3)


def test_cuda_graph_replays_a_decode_step():
    """Serving engines replay decode as a CUDA graph: the split workspace comes from the graph's
    pool, and a replay on new inputs is right."""
    q, k, v = inputs(2, 1, 4096, 32, 8, 128, seed=21)
    fa_course.attention(q, k, v)  # warm-up: chosen and tuned outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fa_course.attention(q, k, v)
    for seed in (22, 23):
        for t, n in zip((q, k, v), inputs(2, 1, 4096, 32, 8, 128, seed=seed)):
            t.copy_(n)
        graph.replay()
        torch.cuda.synchronize()
        close(out, reference(q, k, v))


@pytest.mark.parametrize("n_new,causal", [(1, False), (3, True)])
def test_flash_attn_with_kvcache_appends_and_attends_to_each_length(n_new, causal):
    """flash-attn's decode call: each sequence's new tokens written at its length, then attention over
    its own keys only (rows past each length are NaN in the cache, so reading one shows), causal
    bottom-right to each length; the cache rows past the new tokens untouched."""
    b, cap, h_q, h_kv, d = 3, 600, 8, 2, 128
    g = torch.Generator(device=DEV).manual_seed(31)
    rnd = lambda *shape: torch.randn(*shape, device=DEV, dtype=torch.bfloat16, generator=g)
    k_cache, v_cache = rnd(b, cap, h_kv, d), rnd(b, cap, h_kv, d)
    lengths = [10, 500, 0]
    for i, n in enumerate(lengths):
        k_cache[i, n:] = float("nan")
        v_cache[i, n:] = float("nan")
    q, k, v = rnd(b, n_new, h_q, d), rnd(b, n_new, h_kv, d), rnd(b, n_new, h_kv, d)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEV)
    out, lse = fa_course.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, causal=causal,
                                                 return_softmax_lse=True)
    for i, n in enumerate(lengths):
        torch.testing.assert_close(k_cache[i, n:n + n_new], k[i])
        torch.testing.assert_close(v_cache[i, n:n + n_new], v[i])
        assert torch.isnan(k_cache[i, n + n_new:].float()).all(), "a row past the new tokens was written"
        keys, vals = k_cache[i:i + 1, :n + n_new], v_cache[i:i + 1, :n + n_new]
        ref_o, ref_lse = reference(q[i:i + 1], keys, vals, causal=causal, bottom_right=True, lse=True)
        close(out[i:i + 1], ref_o)
        torch.testing.assert_close(lse[i:i + 1].double(), ref_lse.double(), atol=1e-3, rtol=1e-3)
    assert seqlens.tolist() == lengths, "cache_seqlens is the caller's: not advanced in place"


@torch.no_grad()
def test_captured_decode_step_replays_as_the_cache_grows():
    """Serving engines capture one decode step and replay it while the cache grows: the lengths live
    in device memory (cache_seqlens), so each replay appends at the new length and attends to one
    key more, with nothing re-captured."""
    b, cap, h_q, h_kv, d = 2, 512, 8, 2, 128
    g = torch.Generator(device=DEV).manual_seed(41)
    rnd = lambda *shape: torch.randn(*shape, device=DEV, dtype=torch.bfloat16, generator=g)
    k_cache, v_cache = rnd(b, cap, h_kv, d), rnd(b, cap, h_kv, d)
    seqlens = torch.tensor([100, 300], dtype=torch.int32, device=DEV)
    q, k, v = rnd(b, 1, h_q, d), rnd(b, 1, h_kv, d), rnd(b, 1, h_kv, d)
    step = lambda: fa_course.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, causal=True)
    step()  # warm-up outside the capture (the kernel is chosen and tuned); it appended at 100 and 300
    seqlens += 1
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for t in range(3):
        for dst, src in zip((q, k, v), (rnd(b, 1, h_q, d), rnd(b, 1, h_kv, d), rnd(b, 1, h_kv, d))):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        for i, n in enumerate(seqlens.tolist()):  # the token was written at n, and attention saw n + 1 keys
            torch.testing.assert_close(k_cache[i, n], k[i, 0])
            close(out[i:i + 1], reference(q[i:i + 1], k_cache[i:i + 1, :n + 1], v_cache[i:i + 1, :n + 1],
                                          causal=True, bottom_right=True))
        seqlens += 1


@pytest.mark.parametrize("page_size,n_new", [(16, 1), (256, 2)])
def test_flash_attn_with_kvcache_paged_appends_through_the_block_table(page_size, n_new):
    """A paged cache (vLLM's layout, flash-attn's block_table): a pool of pages, NaN where no sequence
    keeps a token, each sequence's pages shuffled through the pool. The new tokens land in the page and
    row the table names, attention reads each sequence's keys through its pages, and the result is the
    unpaged call's on the same keys."""
    paged_append_matches(page_size, n_new, 128)


@pytest.mark.parametrize("d", [32, 96, 192, 256])
def test_flash_attn_with_kvcache_at_head_dims_beyond_the_lessons(d):
    """The decode kernel at Part VI's head dims (where the build has them): a paged cache with the new
    tokens appended (as above, pages of 16 keys), then a split decode call on a contiguous cache (the
    package's workspace), each against the fp64 reference. At 256 the decode kernel splits O's columns
    over two warps; the results are held to the same tolerance."""
    if not head_dim_built(d):
        pytest.skip(f"the library is not built for head dim {d} (FA_HEAD_DIMS)")
    paged_append_matches(16, 2, d)
    q, k, v = inputs(2, 1, 3000, 16, 4, d, seed=d + 5)
    o, lse = fa_course.attention(q, k, v, return_lse=True)
    ref_o, ref_lse = reference(q, k, v, lse=True)
    close(o, ref_o)
    torch.testing.assert_close(lse.double(), ref_lse.double(), atol=1e-3, rtol=1e-3)


def paged_append_matches(page_size, n_new, d, dtype=torch.bfloat16):
    b, h_q, h_kv, pages_per_seq = 3, 8, 2, 4
    g = torch.Generator(device=DEV).manual_seed(51 + d)
    rnd = lambda *shape: torch.randn(*shape, device=DEV, dtype=dtype, generator=g)
    tol = dict(atol=1.25e-3, rtol=1.25e-3) if dtype == torch.float16 else dict(atol=ATOL, rtol=RTOL)
    num_pages = b * pages_per_seq + 2
    order = torch.randperm(b * pages_per_seq, generator=torch.Generator().manual_seed(52)).to(DEV)
    block_table = order.view(b, pages_per_seq).to(torch.int32)
    cap = pages_per_seq * page_size
    lengths = [5, cap - n_new, 0]
    k_flat, v_flat = rnd(b, cap, h_kv, d), rnd(b, cap, h_kv, d)  # each sequence's keys, unpaged
    k_cache = torch.full((num_pages, page_size, h_kv, d), float("nan"), dtype=dtype, device=DEV)
    v_cache = k_cache.clone()
    for i, n in enumerate(lengths):
        for j in range(n):
            page, row = int(block_table[i, j // page_size]), j % page_size
            k_cache[page, row], v_cache[page, row] = k_flat[i, j], v_flat[i, j]
    q, k, v = rnd(b, n_new, h_q, d), rnd(b, n_new, h_kv, d), rnd(b, n_new, h_kv, d)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEV)
    out, lse = fa_course.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, causal=True,
                                                 block_table=block_table, return_softmax_lse=True)
    for i, n in enumerate(lengths):
        for t in range(n_new):
            page, row = int(block_table[i, (n + t) // page_size]), (n + t) % page_size
            torch.testing.assert_close(k_cache[page, row], k[i, t])
            torch.testing.assert_close(v_cache[page, row], v[i, t])
        keys = torch.cat([k_flat[i:i + 1, :n], k[i:i + 1]], 1)
        vals = torch.cat([v_flat[i:i + 1, :n], v[i:i + 1]], 1)
        ref_o, ref_lse = reference(q[i:i + 1], keys, vals, causal=True, bottom_right=True, lse=True)
        torch.testing.assert_close(out[i:i + 1].double(), ref_o.double(), **tol)
        torch.testing.assert_close(lse[i:i + 1].double(), ref_lse.double(), atol=1e-3, rtol=1e-3)
    written = sum(lengths) + b * n_new
    assert int((~torch.isnan(k_cache.float()).any(-1).any(-1)).sum()) == written, "a row no token owns was written"


def packed_inputs(q_len, k_len, h_q, h_kv, d, seed, dtype=torch.bfloat16):
    """Random bf16 (or `dtype`) packed q (total_q, H_q, D), k and v (total_k, H_kv, D) of sequences of q_len[b]
    queries and k_len[b] keys, and cu(lengths), their int32 offsets."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, device=DEV, dtype=dtype, generator=g)
    cu = lambda lengths: torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32, device=DEV)
    return rnd(sum(q_len), h_q, d), rnd(sum(k_len), h_kv, d), rnd(sum(k_len), h_kv, d), cu


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_varlen_func_attends_within_each_sequence(causal):
    """flash-attn's varlen call: sequences packed end to end, each attending to its own keys only
    (causal bottom-right within it); the same answer as each sequence alone, and its LSE in
    (H_q, total_q)."""
    q_len, k_len, h_q, h_kv, d = [5, 1, 130, 64], [5, 300, 130, 1], 8, 2, 128
    q, k, v, cu = packed_inputs(q_len, k_len, h_q, h_kv, d, seed=61)
    with torch.no_grad():
        out, lse = fa_course.flash_attn_varlen_func(q, k, v, cu(q_len), cu(k_len), max(q_len), max(k_len),
                                                    causal=causal, return_lse=True)
    assert out.shape == q.shape and lse.shape == (h_q, sum(q_len))
    with torch.no_grad():  # offsets right by construction: the caller may skip the check, same answer
        # (with the LSE again: a call without it is another shape to the tuner, which may pick another
        # configuration, whose sums round differently)
        unchecked = fa_course.flash_attn_varlen_func(q, k, v, cu(q_len), cu(k_len), max(q_len), max(k_len),
                                                     causal=causal, check_offsets=False, return_lse=True)
    assert torch.equal(unchecked[0], out) and torch.equal(unchecked[1], lse)
    qa = ka = 0
    for nq, nk in zip(q_len, k_len):
        ref_o, ref_lse = reference(q[None, qa:qa + nq], k[None, ka:ka + nk], v[None, ka:ka + nk], causal=causal,
                                   bottom_right=True, lse=True)
        close(out[None, qa:qa + nq], ref_o)
        torch.testing.assert_close(lse[:, qa:qa + nq].double(), ref_lse[0].double(), atol=1e-3, rtol=1e-3)
        qa, ka = qa + nq, ka + nk


@pytest.mark.parametrize("q_len,k_len", [([1, 3, 1, 2], [700, 77, 1, 2000]), ([5, 1, 130, 64], [5, 300, 130, 1])],
                         ids=["decode", "prefill"])
def test_flash_attn_varlen_func_sliding_window(q_len, k_len):
    """window_size on packed sequences (a padded batch of a model with local layers, unpadded): each
    sequence's window ends at its own bottom-right diagonal; decode-sized rows on the decode kernel,
    longer ones too (the mma.sync kernel's on an H100/H200). Against each sequence alone in fp64."""
    h_q, h_kv, d, window = 8, 2, 128, (48, 0)
    q, k, v, cu = packed_inputs(q_len, k_len, h_q, h_kv, d, seed=67)
    with torch.no_grad():
        out, lse = fa_course.flash_attn_varlen_func(q, k, v, cu(q_len), cu(k_len), max(q_len), max(k_len),
                                                    causal=True, window_size=window, return_lse=True)
    qa = ka = 0
    for nq, nk in zip(q_len, k_len):
        ref_o, ref_lse = attention_fp64(q[None, qa:qa + nq], k[None, ka:ka + nk], v[None, ka:ka + nk], causal=True,
                                        causal_align="bottom_right", window_size=window)
        close(out[None, qa:qa + nq], ref_o)
        torch.testing.assert_close(lse[:, qa:qa + nq].double(), ref_lse[0].double(), atol=1e-3, rtol=1e-3)
        qa, ka = qa + nq, ka + nk


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_flash_attn_with_kvcache_sliding_window(paged):
    """window_size on a decode call with an append: each sequence attends to the window's keys before
    its own new length (a Mistral-style local layer while it generates), split or not, through a
    contiguous cache and a paged one (pages of 16 keys, the window starting inside a page)."""
    b, cap, h_q, h_kv, d, n_new, window = 3, 512, 8, 2, 128, 2, (100, 0)
    g = torch.Generator(device=DEV).manual_seed(71)
    rnd = lambda *shape: torch.randn(*shape, device=DEV, dtype=torch.bfloat16, generator=g)
    k_cache, v_cache = rnd(b, cap, h_kv, d), rnd(b, cap, h_kv, d)
    lengths = [30, 400, 0]
    q, k, v = rnd(b, n_new, h_q, d), rnd(b, n_new, h_kv, d), rnd(b, n_new, h_kv, d)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEV)
    for num_splits in (1, 0):
        kc, vc = k_cache.clone(), v_cache.clone()
        if paged:
            page = 16
            table = torch.arange(b * cap // page, dtype=torch.int32, device=DEV).flip(0).reshape(b, cap // page)
            pool_k = torch.empty(b * cap // page, page, h_kv, d, dtype=kc.dtype, device=DEV)
            pool_v = torch.empty_like(pool_k)
            pool_k[table.flatten().long()] = kc.reshape(-1, page, h_kv, d)
            pool_v[table.flatten().long()] = vc.reshape(-1, page, h_kv, d)
            out = fa_course.flash_attn_with_kvcache(q, pool_k, pool_v, k, v, cache_seqlens=seqlens, causal=True,
                                                    window_size=window, block_table=table, num_splits=num_splits)
            kc = pool_k[table.flatten().long()].reshape(b, cap, h_kv, d)
            vc = pool_v[table.flatten().long()].reshape(b, cap, h_kv, d)
        else:
            out = fa_course.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, causal=True,
                                                    window_size=window, num_splits=num_splits)
        for i, n in enumerate(lengths):
            keys, vals = kc[i:i + 1, :n + n_new], vc[i:i + 1, :n + n_new]
            ref_o, _ = attention_fp64(q[i:i + 1], keys, vals, causal=True, causal_align="bottom_right",
                                      window_size=window)
            close(out[i:i + 1], ref_o)


@pytest.mark.parametrize("per_batch_slopes", [False, True])
def test_flash_attn_varlen_func_with_score_mods(per_batch_slopes):
    """softcap, alibi_slopes ((H_q,) or (B, H_q): bottom-right to each sequence's own lengths) and
    learnable_sink on packed sequences: each sequence against fp64 math attention over its own keys,
    N_q != N_kv both ways, a sequence of one query, one with no key (O = 0: the sink takes the row), and
    a long one (the call the Hopper kernel would take without the modifications)."""
    q_len, k_len, h_q, h_kv, d = [5, 1, 130, 64, 1000], [5, 300, 130, 0, 1200], 8, 2, 128
    b = len(q_len)
    g = torch.Generator(device=DEV).manual_seed(62)
    rnd = lambda *shape: torch.randn(*shape, device=DEV, dtype=torch.bfloat16, generator=g)
    q, k, v = rnd(sum(q_len), h_q, d), rnd(sum(k_len), h_kv, d), rnd(sum(k_len), h_kv, d)
    cu = lambda lengths: torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32, device=DEV)
    slopes = torch.tensor([2.0 ** (-8.0 * (x + 1) / h_q) for x in range(h_q)], device=DEV)
    if per_batch_slopes:
        slopes = slopes[None] * torch.linspace(0.5, 2.0, b, device=DEV)[:, None]
    sinks = torch.randn(h_q, device=DEV, generator=g) + 3.0
    with torch.no_grad():
        out = fa_course.flash_attn_varlen_func(q, k, v, cu(q_len), cu(k_len), max(q_len), max(k_len), causal=True,
                                               softcap=20.0, alibi_slopes=slopes, learnable_sink=sinks)
    qa = ka = 0
    for i, (nq, nk) in enumerate(zip(q_len, k_len)):
        if nk == 0:
            assert torch.equal(out[qa:qa + nq], torch.zeros_like(out[qa:qa + nq])), "a row with no key: O = 0"
        else:
            ref = math_attention(q[None, qa:qa + nq].double(), k[None, ka:ka + nk].double(),
                                 v[None, ka:ka + nk].double(), causal=True, causal_align="bottom_right", softcap=20.0,
                                 alibi_slopes=slopes[i] if per_batch_slopes else slopes, sinks=sinks)
            close(out[None, qa:qa + nq], ref)
        qa, ka = qa + nq, ka + nk


def test_packed_calls_are_the_unpacked_ones():
    """flash-attn's qkv- and kv-packed calls: the calls on the separate tensors (their views, strided
    by the stacking), outputs and gradients; the packed tensor's gradient the three (two) stacked."""
    q, k, v = inputs(2, 100, 100, 4, 4, 64, seed=63)
    do = torch.randn_like(q)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref = fa_course.flash_attn_func(*leaves, causal=True)
    ref.backward(do)
    qkv = torch.stack((q, k, v), 2).requires_grad_()
    out = fa_course.flash_attn_qkvpacked_func(qkv, causal=True)
    out.backward(do)
    close(out, ref)
    close(qkv.grad, torch.stack([t.grad for t in leaves], 2))
    kv = torch.stack((k, v), 2).requires_grad_()
    q2 = q.detach().clone().requires_grad_()
    out = fa_course.flash_attn_kvpacked_func(q2, kv, causal=True)
    out.backward(do)
    close(out, ref)
    close(q2.grad, leaves[0].grad)
    close(kv.grad, torch.stack([t.grad for t in leaves[1:]], 2))
    cu = torch.tensor([0, 37, 100], dtype=torch.int32, device=DEV)
    with torch.no_grad():
        flat = torch.stack((q[0], k[0], v[0]), 1)  # (total, 3, H, D)
        unpacked = fa_course.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 63, 63, causal=True)
        close(fa_course.flash_attn_varlen_qkvpacked_func(flat, cu, 63, causal=True), unpacked)
        close(fa_course.flash_attn_varlen_kvpacked_func(q[0], flat[:, 1:], cu, cu, 63, 63, causal=True), unpacked)
    with pytest.raises(ValueError, match=r"qkv must be \(B, N, 3, H, D\)"):
        fa_course.flash_attn_qkvpacked_func(q)


def test_flash_attn_varlen_func_refuses_what_it_cannot_do():
    q = torch.zeros(10, 4, 64, dtype=torch.bfloat16, device=DEV)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device=DEV)
    with pytest.raises(NotImplementedError, match="varlen backward is not built yet"):
        fa_course.flash_attn_varlen_func(q.clone().requires_grad_(), q, q, cu, cu, 6, 6)
    with pytest.raises(ValueError, match="no length past 5"):
        fa_course.flash_attn_varlen_func(q, q, q, cu, cu, 5, 6)  # a sequence of 6 with max_seqlen_q = 5
    with pytest.raises(ValueError, match="must run from 0 to the tensor's 10 rows"):
        fa_course.flash_attn_varlen_func(q, q, q, torch.tensor([0, 4, 9], dtype=torch.int32, device=DEV), cu, 6, 6)
    with pytest.raises(ValueError, match=r"window_size is \(left, right\)"):
        fa_course.flash_attn_varlen_func(q, q, q, cu, cu, 6, 6, window_size=(3, 0, 1))
    with pytest.raises(fa_course.UnsupportedInputError, match="window_left and window_right must be -1"):
        fa_course.flash_attn_varlen_func(q, q, q, cu, cu, 6, 6, window_size=(-3, 0))


def test_flash_attn_with_kvcache_refuses_what_it_does_not_have():
    q, k_cache, v_cache = inputs(2, 1, 64, 4, 2, 64)
    with pytest.raises(fa_course.UnsupportedInputError, match="window_left and window_right must be -1"):
        fa_course.flash_attn_with_kvcache(q, k_cache, v_cache, window_size=(16, -5))
    with pytest.raises(ValueError, match="block_table must be an int32"):
        fa_course.flash_attn_with_kvcache(q, k_cache, v_cache, block_table=torch.zeros(2, 1, dtype=torch.int64,
                                                                                        device=DEV))
    pool = torch.zeros(4, 48, 2, 64, dtype=torch.bfloat16, device=DEV)  # pages of 48 keys: not a power of two
    table = torch.zeros(2, 1, dtype=torch.int32, device=DEV)
    new = torch.ones(2, 1, 2, 64, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(fa_course.UnsupportedInputError, match="page_size must be a power of two"):
        fa_course.flash_attn_with_kvcache(q, pool, pool.clone(), new, new, cache_seqlens=3, block_table=table)
    assert not pool.any(), "a refused call wrote its new tokens into the cache"
    pool = torch.zeros(4, 16, 2, 64, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match="names pages outside the pool"):
        fa_course.flash_attn_with_kvcache(q, pool, pool.clone(), new, new, cache_seqlens=3,
                                          block_table=torch.full((2, 1), 9, dtype=torch.int32, device=DEV))
    assert not pool.any()
    k = torch.zeros(2, 2, 2, 64, dtype=torch.bfloat16, device=DEV)
    before = k_cache.clone()
    with pytest.raises(ValueError, match="nothing was written"):
        fa_course.flash_attn_with_kvcache(q, k_cache, v_cache, k, k.clone(), cache_seqlens=63)
    assert torch.equal(k_cache, before)


def test_flash_attn_with_kvcache_unchecked_writes_nothing_for_a_sequence_that_does_not_fit():
    """check_cache_seqlens=False (a serving engine's lengths, right by construction) skips the host's
    check; a sequence whose new token would pass the capacity then gets nothing written by the
    library, and the others are appended and attended as usual."""
    b, cap, h_q, h_kv, d = 2, 64, 4, 2, 64
    g = torch.Generator(device=DEV).manual_seed(61)
    rnd = lambda *shape: torch.randn(*shape, device=DEV, dtype=torch.bfloat16, generator=g)
    k_cache, v_cache = rnd(b, cap, h_kv, d), rnd(b, cap, h_kv, d)
    q, k, v = rnd(b, 1, h_q, d), rnd(b, 1, h_kv, d), rnd(b, 1, h_kv, d)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    seqlens = torch.tensor([10, cap], dtype=torch.int32, device=DEV)  # the second is full
    with pytest.raises(ValueError, match="nothing was written"):
        fa_course.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens)
    assert torch.equal(k_cache, before_k) and torch.equal(v_cache, before_v)
    out = fa_course.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens,
                                           check_cache_seqlens=False)
    torch.cuda.synchronize()
    torch.testing.assert_close(k_cache[0, 10], k[0, 0], rtol=0, atol=0)
    torch.testing.assert_close(v_cache[0, 10], v[0, 0], rtol=0, atol=0)
    k_cache[0, 10], v_cache[0, 10] = before_k[0, 10], before_v[0, 10]
    assert torch.equal(k_cache, before_k) and torch.equal(v_cache, before_v), "a row not appended was written"
    k_cache[0, 10], v_cache[0, 10] = k[0, 0], v[0, 0]
    close(out[0:1], reference(q[0:1], k_cache[0:1, :11], v_cache[0:1, :11]))
    close(out[1:2], reference(q[1:2], k_cache[1:2], v_cache[1:2]))  # the full sequence: its cache as it was


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


def head_dim_built(d):
    """Whether the library has a forward at head dim d (Part VI's head dims are built where
    FA_HEAD_DIMS names them, e.g. all; the default build has 64 and 128)."""
    q, k, v = inputs(1, 1, 1, 1, 1, d)
    try:
        fa_course.pick_step(q, k, v)
        return True
    except fa_course.UnsupportedInputError:
        return False


@pytest.mark.parametrize("d", [32, 96, 192, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims_beyond_the_lessons(d, causal):
    """Part VI's head dims on the production forwards (kernels 100 and 101 all four, 101 on an
    H100/H200): flash_attn_func against the fp64 reference (ragged, GQA, N_q > N_kv bottom-right,
    whose first rows see no key), the library's choice the fastest kernel that has the head dim;
    gradients at every one (kernel 100's backward; on an H100/H200 the Hopper backward at 32 and 96,
    the mma.sync one at 192 and 256) at the flash-attn suite's yardstick. At 256 before sm_90 a call
    that needs a gradient is refused by name before its forward runs."""
    if not head_dim_built(d):
        pytest.skip(f"the library is not built for head dim {d} (FA_HEAD_DIMS)")
    for shape in ((2, 77, 131, 4, 2, d), (1, 300, 200, 8, 1, d), (1, 1013, 1024, 2, 2, d)):
        q, k, v = inputs(*shape, seed=d)
        out, lse = fa_course.flash_attn_func(q, k, v, causal=causal, return_lse=True)
        ref_o, ref_lse = reference(q, k, v, causal=causal, bottom_right=True, lse=True)
        close(out, ref_o)
        seen = torch.isfinite(ref_lse)
        torch.testing.assert_close(lse.double()[seen], ref_lse[seen], atol=1e-3, rtol=1e-3)
        assert torch.equal(torch.isinf(lse), ~seen)
    hopper = torch.cuda.get_device_capability(q.device) == (9, 0)  # kernel 101 has all four
    assert fa_course.pick_step(q, k, v) == (101 if hopper else 100)
    q, k, v = inputs(2, 77, 131, 4, 2, d, seed=d + 1)
    do = upstream(q, seed=d + 2)
    if d == 256 and torch.cuda.get_device_capability(q.device) < (9, 0):
        q.requires_grad_()
        with pytest.raises(NotImplementedError, match="no backward at head dim 256"):
            fa_course.flash_attn_func(q, k, v, causal=causal)  # refused before the forward runs
        return
    ours, bf16, exact = three_ways([q, k, v], do, causal=causal, causal_align="bottom_right")
    within_yardstick(ours, bf16, exact, what=f"D = {d}: ")


def test_flash_attn_func_refuses_what_it_does_not_have():
    q, k, v = inputs(1, 64, 64, 2, 2, 64, seed=14)
    for kwargs, what in (({"dropout_p": 0.1}, "dropout"), ({"return_attn_probs": True}, "return_attn_probs")):
        with pytest.raises(NotImplementedError, match=what):
            fa_course.flash_attn_func(q, k, v, **kwargs)


@pytest.mark.parametrize("shape", [(2, 300, 517, 4, 2, 64), (1, 700, 400, 8, 8, 128)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(64, 0), (100, 30), (-1, 16), (0, 0), (250, -1)], ids=str)
def test_flash_attn_func_sliding_window(shape, causal, window):
    """flash-attn's window_size, aligned bottom-right like causal, against the fp64 reference with the
    same window; rows the window leaves without a key give O = 0 and LSE = -inf."""
    q, k, v = inputs(*shape, seed=16)
    out, lse = fa_course.flash_attn_func(q, k, v, causal=causal, window_size=window, return_lse=True)
    ref_o, ref_lse = attention_fp64(q, k, v, causal=causal, causal_align="bottom_right", window_size=window)
    close(out, ref_o)
    seen = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse.double()[seen], ref_lse[seen], atol=1e-3, rtol=1e-3)
    assert torch.equal(torch.isinf(lse), ~seen), "a row without a key has LSE -inf, and only such a row"


def test_sliding_window_refuses_a_step_without_one():
    q, k, v = inputs(1, 128, 128, 2, 2, 64, seed=17)
    for grad in (False, True):
        q.requires_grad_(grad)
        with pytest.raises(fa_course.UnsupportedInputError, match="has no sliding window"):
            fa_course.attention(q, k, v, window_size=(32, 0), step=16)


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


# ---- gradients ----------------------------------------------------------------------------------
# The yardstick of flash-attn's own test suite: for each of dq, dk, dv, the largest error against an
# fp64 reference is at most twice PyTorch's own in bf16 (plain attention, autograd) plus a small
# absolute slack, and the error's norm is at most 1% of the gradient's.


def math_attention(q, k, v, causal=False, causal_align="top_left", softmax_scale=None, window_size=(-1, -1),
                   deterministic=False, softcap=0.0, alibi_slopes=None, sinks=None):
    """Attention as plain PyTorch operations in the inputs' dtype, differentiable: in fp64 the
    reference, in bf16 the yardstick. (B, N, H, D) tensors; a row that sees no key gets O = 0 and no
    gradient, as in the library. window_size: flash-attn's (left, right), the offset causal_align's.
    softcap, alibi_slopes ((H,) or (B, H), bottom-right), sinks ((H,), one more logit in each row's
    softmax): the score modifications, in the library's order. (deterministic: ignored.)"""
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, N, D)
    group = qt.shape[1] // kt.shape[1]
    kt, vt = kt.repeat_interleave(group, 1), vt.repeat_interleave(group, 1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale
    s = (qt @ kt.transpose(-1, -2)) * scale
    n_q, n_kv = s.shape[-2], s.shape[-1]
    i = torch.arange(n_q, device=s.device)[:, None]
    j = torch.arange(n_kv, device=s.device)[None, :]
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(s.dtype).reshape(-1 if alibi_slopes.dim() == 2 else 1, s.shape[1], 1, 1)
        s = s - slopes * (i + n_kv - n_q - j).abs().to(s.dtype)
    offset = n_kv - n_q if causal_align == "bottom_right" else 0
    hidden = (j > i + offset) if causal else torch.zeros_like(j > i)
    left, right = window_size
    if left >= 0:
        hidden = hidden | (j < i + offset - left)
    if right >= 0:
        hidden = hidden | (j > i + offset + right)
    if sinks is not None:
        # Each row's softmax over its visible scores and its head's sink (a column of its own,
        # dropped after the softmax); a row with no key puts all its weight on the sink (O = 0).
        sink = sinks.to(s.dtype).reshape(1, -1, 1, 1).expand(s.shape[0], -1, n_q, 1)
        p = torch.softmax(torch.cat([s.masked_fill(hidden, float("-inf")), sink], dim=-1), dim=-1)[..., :n_kv]
        return (p @ vt).transpose(1, 2)
    empty = hidden.all(-1, keepdim=True)  # rows that see no key: kept finite here, zeroed after the softmax
    p = torch.softmax(s.masked_fill(hidden & ~empty, float("-inf")), dim=-1).masked_fill(empty, 0.0)
    return (p @ vt).transpose(1, 2)


def grads_of(fn, leaves, do):
    """(O, [d leaf for each leaf]) of fn(*leaves) for the upstream gradient `do`, on fresh leaves."""
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    o = fn(*leaves)
    o.backward(do.to(o.dtype))
    return o.detach(), [t.grad for t in leaves]


def three_ways(leaves, do, view=lambda *t: t, **opts):
    """The gradients w.r.t. `leaves` of attention on view(*leaves): ours, PyTorch's bf16 math, fp64."""
    ours = grads_of(lambda *t: fa_course.attention(*view(*t), **opts), leaves, do)[1]
    bf16 = grads_of(lambda *t: math_attention(*view(*t), **opts), leaves, do)[1]
    exact = grads_of(lambda *t: math_attention(*view(*t), **opts), [t.double() for t in leaves], do.double())[1]
    return ours, bf16, exact


def within_yardstick(ours, bf16, exact, names=("dq", "dk", "dv"), what="", dtype=torch.bfloat16):
    """flash-attn's yardstick: each gradient's max error at most twice PyTorch's own math's in the same
    dtype (`bf16`: its gradients, in `dtype`) plus 1e-3, and a relative norm error of 1e-2 (bf16; fp16,
    8 times finer, 2e-3)."""
    limit = 2e-3 if dtype == torch.float16 else 1e-2
    for name, g, pt, ref in zip(names, ours, bf16, exact):
        assert g is not None and g.dtype == dtype and g.shape == ref.shape, f"{what}{name}"
        assert torch.isfinite(g).all(), f"{what}{name} is not finite everywhere"
        err = (g.double() - ref).abs().max().item()
        pt_err = (pt.double() - ref).abs().max().item()
        rel = ((g.double() - ref).norm() / ref.norm()).item()
        assert err <= 2 * pt_err + 1e-3, f"{what}{name}: max |error| {err:.3e} > 2 × PyTorch {dtype}'s {pt_err:.3e} + 1e-3"
        assert rel <= limit, f"{what}{name}: relative norm error {rel:.3e} > {limit}"


def upstream(q, seed, dtype=torch.bfloat16):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(q.shape, device=DEV, dtype=dtype, generator=g)


GRAD_SHAPES = [(2, 77, 131, 4, 2, 64), (1, 131, 77, 4, 2, 128), (1, 300, 300, 4, 1, 128), (2, 300, 300, 4, 4, 64),
               (1, 2048, 2048, 4, 2, 128)]


@pytest.mark.parametrize("shape", GRAD_SHAPES, ids=lambda s: "B{}_Nq{}_Nkv{}_H{}_Hkv{}_D{}".format(*s))
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "top_left"), (True, "bottom_right")])
def test_gradients_against_fp64_reference(shape, causal, align):
    q, k, v = inputs(*shape, seed=30)
    do = upstream(q, seed=31)
    ours, bf16, exact = three_ways([q, k, v], do, causal=causal, causal_align=align)
    within_yardstick(ours, bf16, exact)
    n_q, n_kv = shape[1], shape[2]
    if causal and align == "bottom_right" and n_q > n_kv:  # the first N_q − N_kv queries see no key
        assert torch.equal(ours[0][:, :n_q - n_kv], torch.zeros_like(ours[0][:, :n_q - n_kv]))
        assert (exact[0][:, :n_q - n_kv] == 0).all()


@pytest.mark.parametrize("shape", [(2, 300, 517, 4, 2, 64), (1, 700, 400, 4, 4, 128)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(64, 0), (100, 30), (-1, 16), (250, -1)], ids=str)
def test_sliding_window_gradients(shape, causal, window):
    """flash-attn's window_size in the backward, at the yardstick, against fp64 autograd of the same
    window (bottom-right, as flash_attn_func aligns it); rows the window leaves without a key get no
    gradient. One window also in the deterministic mode."""
    q, k, v = inputs(*shape, seed=18)
    do = upstream(q, seed=19)
    opts = dict(causal=causal, causal_align="bottom_right", window_size=window)
    within_yardstick(*three_ways([q, k, v], do, **opts), what=f"window {window}: ")
    if window == (100, 30):
        within_yardstick(*three_ways([q, k, v], do, deterministic=True, **opts), what="deterministic: ")


def test_gradients_with_a_scale_and_through_flash_attn_func():
    q, k, v = inputs(2, 190, 250, 6, 2, 64, seed=32)
    do = upstream(q, seed=33)
    ours = grads_of(lambda *t: fa_course.flash_attn_func(*t, softmax_scale=0.3, causal=True), [q, k, v], do)[1]
    bf16, exact = (grads_of(lambda *t: math_attention(*t, causal=True, causal_align="bottom_right",
                                                      softmax_scale=0.3), leaves, do)[1]
                   for leaves in ([q, k, v], [q.double(), k.double(), v.double()]))
    within_yardstick(ours, bf16, exact)


def test_gradients_through_views_broadcasts_and_any_upstream_layout():
    q, k, v = inputs(2, 200, 333, 4, 2, 64, seed=34)
    do = upstream(q, seed=35)
    # (B, H, N, D) storage passed as (B, N, H, D) views: the gradients come back in that storage.
    bhnd = [t.transpose(1, 2).contiguous() for t in (q, k, v)]
    ours, bf16, exact = three_ways(bhnd, do, view=lambda *t: [x.transpose(1, 2) for x in t], causal=True)
    within_yardstick(ours, bf16, exact, what="(B, H, N, D) storage: ")
    assert all(g.is_contiguous() for g in ours)
    # Rows padded to 128 elements: the padding gets a zero gradient.
    wide = [torch.cat([t, t], dim=-1) for t in (q, k, v)]
    ours, bf16, exact = three_ways(wide, do, view=lambda *t: [x[..., :64] for x in t])
    within_yardstick([g[..., :64] for g in ours], [g[..., :64] for g in bf16], [g[..., :64] for g in exact],
                     what="padded rows: ")
    assert all((g[..., 64:] == 0).all() for g in ours)
    # K and V broadcast over the batch (zero stride, read by the production forward): their
    # gradients are summed over it.
    ours, bf16, exact = three_ways([q, k[:1], v[:1]], do, view=lambda q, k, v: (q, k.expand(2, -1, -1, -1),
                                                                                 v.expand(2, -1, -1, -1)))
    within_yardstick(ours, bf16, exact, what="broadcast K, V: ")
    # dO as autograd hands it over: a broadcast (from .sum()), a slice, (B, H, N, D) storage, an
    # unaligned start. The backward copies what the library would refuse.
    shape = q.shape
    ones = torch.ones((1, 1, 1, 1), device=DEV, dtype=torch.bfloat16).expand(shape)
    sliced = torch.cat([do, do], dim=-1)[..., :64]
    transposed = do.transpose(1, 2).contiguous().transpose(1, 2)
    unaligned = torch.empty(do.numel() + 1, device=DEV, dtype=torch.bfloat16)[1:].view(shape).copy_(do)
    assert unaligned.data_ptr() % 16 != 0
    for name, d in (("broadcast", ones), ("slice", sliced), ("transposed", transposed), ("unaligned", unaligned)):
        ours = grads_of(lambda *t: fa_course.attention(*t), [q, k, v], d)[1]
        bf16 = grads_of(math_attention, [q, k, v], d.contiguous())[1]
        exact = grads_of(math_attention, [q.double(), k.double(), v.double()], d.double())[1]
        within_yardstick(ours, bf16, exact, what=f"dO {name}: ")


def test_only_the_inputs_that_require_grad_get_one():
    q, k, v = inputs(1, 100, 120, 4, 2, 128, seed=36)
    do = upstream(q, seed=37)
    full = grads_of(lambda *t: fa_course.attention(*t, causal=True), [q, k, v], do)[1]
    for which in range(3):
        leaves = [t.clone() for t in (q, k, v)]
        leaves[which].requires_grad_()
        fa_course.attention(*leaves, causal=True).backward(do)
        for i, t in enumerate(leaves):
            if i == which:
                torch.testing.assert_close(t.grad, full[i])
            else:
                assert t.grad is None
    # Inputs that require grad, no gradient asked: the op runs without a warning; under no_grad the
    # output requires none.
    q.requires_grad_()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*autograd kernel was not registered.*")
        out = fa_course.attention(q, k, v, causal=True)
    assert out.requires_grad and out.grad_fn is not None
    close(out.detach(), reference(q.detach(), k, v, causal=True))
    with torch.no_grad():
        assert not fa_course.attention(q, k, v).requires_grad


def test_a_gradient_through_the_returned_lse_raises():
    q, k, v = (t.requires_grad_() for t in inputs(1, 100, 120, 4, 2, 128, seed=38))
    do = upstream(q, seed=39)
    o, lse = fa_course.attention(q, k, v, causal=True, return_lse=True)
    with torch.no_grad():
        _, lse_inference = fa_course.attention(q, k, v, causal=True, return_lse=True)
    assert lse.requires_grad and torch.equal(lse.detach(), lse_inference)
    with pytest.raises(NotImplementedError, match="returned LSE"):
        torch.autograd.grad(o.float().sum() + lse.sum(), (q, k, v))
    o, lse = fa_course.flash_attn_func(q, k, v, causal=True, return_lse=True)
    with pytest.raises(NotImplementedError, match="returned LSE"):
        torch.autograd.grad(lse.sum(), (q, k, v))
    # Returned but not used, or used detached: O's gradient, as without return_lse.
    o, lse = fa_course.attention(q, k, v, causal=True, return_lse=True)
    with_lse = torch.autograd.grad((o.float() * do.float()).sum() + lse.detach().sum(), (q, k, v))
    without = torch.autograd.grad(fa_course.attention(q, k, v, causal=True), (q, k, v), do)
    for a, b in zip(with_lse, without):
        torch.testing.assert_close(a, b)

    # Compiled, the refusal comes when the graph is compiled: AOTAutograd traces a gradient for every
    # output that requires one, used or not. An LSE detached inside the compiled function needs none.
    def returns_lse(q, k, v):
        return fa_course.attention(q, k, v, causal=True, return_lse=True)

    def returns_lse_detached(q, k, v):
        o, lse = fa_course.attention(q, k, v, causal=True, return_lse=True)
        return o, lse.detach()

    torch._dynamo.reset()
    with pytest.raises(Exception, match="returned LSE"):
        torch.compile(returns_lse, fullgraph=True)(q, k, v)
    o, lse = torch.compile(returns_lse_detached, fullgraph=True)(q, k, v)
    torch.testing.assert_close(lse, lse_inference, rtol=0, atol=0)
    for a, b in zip(torch.autograd.grad(o, (q, k, v), do), without):
        torch.testing.assert_close(a, b)


def test_a_pinned_step_runs_its_own_backward_or_the_librarys():
    from fa_course import _capi, ops

    assert _capi.has_backward(17) and not _capi.has_backward(10)
    assert ops._backward_step(17) == 17 and ops._backward_step(10) == _capi.STEP_AUTO
    assert ops._backward_step(-1) == _capi.STEP_AUTO
    q, k, v = inputs(1, 200, 260, 4, 2, 64, seed=40)
    do = upstream(q, seed=41)
    bf16 = grads_of(lambda *t: math_attention(*t, causal=True), [q, k, v], do)[1]
    exact = grads_of(lambda *t: math_attention(*t, causal=True), [q.double(), k.double(), v.double()], do.double())[1]
    for step in (17, 10):  # its own backward; step 10 has none: the library's choice
        ours = grads_of(lambda *t: fa_course.attention(*t, causal=True, step=step), [q, k, v], do)[1]
        within_yardstick(ours, bf16, exact, what=f"step {step}: ")
    # Step 17's backward has no deterministic mode: pinned, it refuses rather than run without it.
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = fa_course.attention(*leaves, causal=True, step=17, deterministic=True)
    with pytest.raises(fa_course.UnsupportedInputError, match="no deterministic mode"):
        o.backward(do)
    # A step that writes no LSE cannot give the backward one: refused with inputs that require grad,
    # run under no_grad.
    no_lse = max(s.number for s in fa_course.steps() if not s.lse)
    with pytest.raises(fa_course.UnsupportedInputError, match="no_grad"):
        fa_course.attention(*leaves, step=no_lse)
    with torch.no_grad():
        close(fa_course.attention(*leaves, step=no_lse), reference(q, k, v))


@pytest.mark.parametrize("shape", [(1, 1024, 1024, 2, 2, 64), (1, 1024, 1024, 4, 1, 128)], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_backward_is_bitwise_reproducible(shape, causal):
    """deterministic=True: bitwise-identical dq, dk, dv call after call, on a shape where 16 KV tiles
    add into every Q tile's dQ. A refusal fails the test: a step with the mode exists."""
    q, k, v = (t.requires_grad_() for t in inputs(*shape, seed=42))
    do = upstream(q, seed=43)
    runs = [torch.autograd.grad(fa_course.flash_attn_func(q, k, v, causal=causal, deterministic=True), (q, k, v), do)
            for _ in range(3)]
    for run in runs[1:]:
        for name, a, b in zip(("dq", "dk", "dv"), runs[0], run):
            assert torch.equal(a, b), f"{name} differs between two deterministic backward calls"
    leaves = [t.detach() for t in (q, k, v)]
    bf16 = grads_of(lambda *t: math_attention(*t, causal=causal, causal_align="bottom_right"), leaves, do)[1]
    exact = grads_of(lambda *t: math_attention(*t, causal=causal, causal_align="bottom_right"),
                     [t.double() for t in leaves], do.double())[1]
    within_yardstick(runs[0], bf16, exact)


def test_compiled_training_step_gives_eager_gradients():
    q, k, v = (t.requires_grad_() for t in inputs(2, 256, 320, 4, 2, 64, seed=44))
    w = upstream(q, seed=45)

    def loss_fn(q, k, v):
        o = fa_course.attention(q, k, v, causal=True, causal_align="bottom_right", softmax_scale=0.1)
        return (o.float() * w).sum()

    eager_loss = loss_fn(q, k, v)
    eager = torch.autograd.grad(eager_loss, (q, k, v))
    torch._dynamo.reset()
    compiled_loss = torch.compile(loss_fn, fullgraph=True)(q, k, v)
    compiled = torch.autograd.grad(compiled_loss, (q, k, v))
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-4, atol=1e-2)
    # The same kernels on the same dO (= w, exactly, either way): dK and dV bit for bit; dQ up to the
    # order of its fp32 atomic additions, one bf16 rounding step.
    dq, dk, dv = compiled
    torch.testing.assert_close(dk, eager[1], rtol=0, atol=0)
    torch.testing.assert_close(dv, eager[2], rtol=0, atol=0)
    torch.testing.assert_close(dq, eager[0], rtol=2 ** -7, atol=1e-3 * eager[0].abs().max().item())


def test_cuda_graph_captures_a_training_step():
    """Forward and backward in one captured graph: dQ, dK, dV and the workspace come from PyTorch's
    allocator (the graph's pool), so the capture holds no cudaMalloc, and replays give eager's grads."""
    q, k, v = (t.requires_grad_() for t in inputs(1, 256, 256, 4, 2, 64, seed=46))
    do = upstream(q, seed=47)

    def step():
        return torch.autograd.grad(fa_course.attention(q, k, v, causal=True), (q, k, v), do)

    side = torch.cuda.Stream()  # warm-up on a side stream, as PyTorch's graph capture asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for seed in (48, 49):
        with torch.no_grad():
            for t, n in zip((q, k, v), inputs(1, 256, 256, 4, 2, 64, seed=seed)):
                t.copy_(n)
            do.copy_(upstream(q, seed=seed + 100))
        graph.replay()
        torch.cuda.synchronize()
        eager = step()
        torch.testing.assert_close(captured[1], eager[1], rtol=0, atol=0)
        torch.testing.assert_close(captured[2], eager[2], rtol=0, atol=0)
        torch.testing.assert_close(captured[0], eager[0], rtol=2 ** -7, atol=1e-3 * eager[0].abs().max().item())


# ---- score modifications ------------------------------------------------------------------------

MOD_SHAPES = [(2, 300, 517, 4, 2, 64), (1, 517, 300, 4, 4, 128)]


def mod_args(kind, b, h, seed):
    """The keyword arguments of one modification: a cap in tanh's bend (scaled scores of std ~2.4 at
    D = 64 under a scale of 0.3 and a cap of 2) and Gemma 2's cap of 50, ALiBi slopes per head or per
    (batch, head), sink logits near the rows' own LSE (so that they weigh), all together under a window."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    slopes = torch.tensor([2.0 ** (-8.0 * (x + 1) / h) for x in range(h)], device=DEV)
    if kind == "softcap":
        return dict(softcap=2.0, softmax_scale=0.3)
    if kind == "softcap50":
        return dict(softcap=50.0)
    if kind == "alibi":
        return dict(alibi_slopes=slopes)
    if kind == "alibi_bh":
        return dict(alibi_slopes=slopes[None, :] * torch.arange(1, b + 1, device=DEV)[:, None].float())
    if kind == "sinks":
        return dict(sinks=torch.randn(h, device=DEV, generator=g) + 3.0)
    return dict(softcap=20.0, alibi_slopes=slopes, sinks=torch.randn(h, device=DEV, generator=g) + 3.0,
                window_size=(100, 0))


MOD_KINDS = ["softcap", "softcap50", "alibi", "alibi_bh", "sinks", "all"]


@pytest.mark.parametrize("shape", MOD_SHAPES, ids=lambda s: "B{}_Nq{}_Nkv{}_H{}_Hkv{}_D{}".format(*s))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", MOD_KINDS)
def test_score_mods_forward(shape, causal, kind):
    """Each modification (and all together under a window) against fp64 math attention, bottom-right
    as flash_attn_func aligns; rows that see no key (N_q > N_kv, causal) get O = 0."""
    q, k, v = inputs(*shape, seed=40)
    mods = mod_args(kind, shape[0], shape[3], seed=41)
    fa_mods = {("learnable_sink" if key == "sinks" else key): val for key, val in mods.items()}
    out = fa_course.flash_attn_func(q, k, v, causal=causal, **fa_mods)
    ref = math_attention(q.double(), k.double(), v.double(), causal=causal, causal_align="bottom_right", **mods)
    close(out, ref)


@pytest.mark.parametrize("shape", MOD_SHAPES, ids=lambda s: "B{}_Nq{}_Nkv{}_H{}_Hkv{}_D{}".format(*s))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", MOD_KINDS)
def test_score_mods_gradients(shape, causal, kind):
    """dq, dk, dv at flash-attn's yardstick against fp64 autograd of the same modifications (the cap's
    derivative, ALiBi's constant bias), and the sinks' gradient (a bf16 parameter, as gpt-oss keeps
    them) within 1e-2 of fp64's in norm; the deterministic mode once."""
    q, k, v = inputs(*shape, seed=42)
    do = upstream(q, seed=43)
    mods = mod_args(kind, shape[0], shape[3], seed=44)
    opts = dict(causal=causal, causal_align="bottom_right", **{key: val for key, val in mods.items() if key != "sinks"})
    if "sinks" not in mods:
        within_yardstick(*three_ways([q, k, v], do, **opts), what=f"{kind}: ")
        return
    sinks = mods["sinks"].to(torch.bfloat16)
    fn = lambda q, k, v, s: fa_course.attention(q, k, v, sinks=s, **opts)
    ref = lambda q, k, v, s: math_attention(q, k, v, sinks=s, **opts)
    ours = grads_of(fn, [q, k, v, sinks], do)[1]
    bf16 = grads_of(ref, [q, k, v, sinks], do)[1]
    exact = grads_of(ref, [q.double(), k.double(), v.double(), sinks.double()], do.double())[1]
    within_yardstick(ours[:3], bf16[:3], exact[:3], what=f"{kind}: ")
    assert ours[3] is not None and ours[3].dtype == torch.bfloat16 and ours[3].shape == sinks.shape
    rel = ((ours[3].double() - exact[3]).norm() / exact[3].norm()).item()
    assert rel <= 1e-2, f"{kind}: dsinks relative error {rel:.3e}"
    if kind == "all":
        det = grads_of(lambda *t: fa_course.attention(*t[:3], sinks=t[3], deterministic=True, **opts),
                       [q, k, v, sinks], do)[1]
        again = grads_of(lambda *t: fa_course.attention(*t[:3], sinks=t[3], deterministic=True, **opts),
                         [q, k, v, sinks], do)[1]
        assert all(torch.equal(a, b) for a, b in zip(det, again)), "deterministic: gradients differ run to run"


def test_score_mods_refusals():
    """What the library or this layer refuses, by name, nothing computed: slopes that require grad, arrays
    of the wrong dtype or shape, a negative cap, a pinned step without the modifications."""
    q, k, v = inputs(1, 64, 64, 2, 2, 64, seed=45)
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        fa_course.attention(q, k, v, alibi_slopes=torch.ones(2, device=DEV, requires_grad=True))
    with pytest.raises(ValueError, match="alibi_slopes must be a contiguous float32"):
        fa_course.attention(q, k, v, alibi_slopes=torch.ones(3, device=DEV))
    with pytest.raises(ValueError, match="sinks must be a contiguous float32"):
        fa_course.attention(q, k, v, sinks=torch.ones(2, 2, device=DEV))
    with pytest.raises(fa_course.UnsupportedInputError, match="softcap"):
        fa_course.attention(q, k, v, softcap=-1.0)
    with pytest.raises(fa_course.UnsupportedInputError, match="has no softcap"):
        fa_course.attention(q, k, v, softcap=30.0, step=16)
    # A cap past the kernels' tanh precision (about 1.3e-5·softcap): the uniform average at 1e9.
    with pytest.raises(fa_course.UnsupportedInputError, match="softcap must be at most 1000 "):
        fa_course.attention(q, k, v, softcap=1e9)


def test_alibi_slopes_of_one_batch_entry_any_stride():
    """(1, H_q) slopes are one per head whatever their first stride (a transposed (H_q, 1) view is
    contiguous with stride 1 there): the same output as the (H_q,) slopes, not a refusal."""
    q, k, v = inputs(1, 64, 64, 4, 2, 64, seed=49)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEV)
    odd = slopes.clone().view(4, 1).t()
    assert odd.shape == (1, 4) and odd.is_contiguous() and odd.stride(0) == 1
    close(fa_course.attention(q, k, v, alibi_slopes=odd), fa_course.attention(q, k, v, alibi_slopes=slopes))


def test_no_gradient_is_lost_silently():
    """Each call that autograd would record but that has no backward for something refuses, rather than
    return an output without that gradient: the LSE of a call whose sinks alone require grad (its
    backward refuses, as for q, k, v), slopes that require grad in varlen, a KV-cache call whose inputs
    require grad."""
    q, k, v = inputs(1, 64, 64, 2, 2, 64, seed=47)
    sinks = torch.zeros(2, device=DEV, requires_grad=True)
    out, lse = fa_course.attention(q, k, v, sinks=sinks, return_lse=True)
    assert lse.requires_grad
    with pytest.raises(NotImplementedError, match="gradients through the returned LSE"):
        (out.float().sum() + lse.sum()).backward()
    slopes = torch.ones(2, device=DEV, requires_grad=True)
    packed = q[0]
    cu = torch.tensor([0, 64], dtype=torch.int32, device=DEV)
    with pytest.raises(NotImplementedError, match="varlen backward is not built yet"):
        fa_course.flash_attn_varlen_func(packed, packed, packed, cu, cu, 64, 64, alibi_slopes=slopes)
    with pytest.raises(NotImplementedError, match="inference only"):
        fa_course.flash_attn_with_kvcache(q.clone().requires_grad_(), k, v, cache_seqlens=64)


def test_kind_errors_name_the_call_and_the_fix():
    """A CPU tensor or an fp32 one gets a message that names the function called and what it needs."""
    q, k, v = inputs(1, 64, 64, 2, 2, 64, seed=48)
    with pytest.raises(ValueError, match=r"flash_attn_with_kvcache: q must be bfloat16 .*\.to\(torch\.bfloat16\)"):
        fa_course.flash_attn_with_kvcache(q.float(), k.float(), v.float(), cache_seqlens=64)
    cu = torch.tensor([0, 64], dtype=torch.int32)
    with pytest.raises(ValueError, match="flash_attn_varlen_func: q must be a 3-D .* CUDA tensor"):
        fa_course.flash_attn_varlen_func(q[0].cpu(), k[0].cpu(), v[0].cpu(), cu, cu, 64, 64)


@pytest.mark.parametrize("n_new,num_splits", [(1, 0), (3, 1), (1, 4)])
def test_flash_attn_with_kvcache_score_mods(n_new, num_splits):
    """The decode call with flash-attn's softcap, alibi_slopes and learnable_sink, all three: each
    sequence against fp64 math attention over its own keys, ALiBi bottom-right to its length, the sink
    once a row whether the keys are split or not."""
    b, cap, h_q, h_kv, d = 3, 600, 8, 2, 128
    g = torch.Generator(device=DEV).manual_seed(46)
    rnd = lambda *shape: torch.randn(*shape, device=DEV, dtype=torch.bfloat16, generator=g)
    k_cache, v_cache = rnd(b, cap, h_kv, d), rnd(b, cap, h_kv, d)
    lengths = [10, 500, 0]
    q, k, v = rnd(b, n_new, h_q, d), rnd(b, n_new, h_kv, d), rnd(b, n_new, h_kv, d)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEV)
    slopes = torch.tensor([2.0 ** (-8.0 * (x + 1) / h_q) for x in range(h_q)], device=DEV)
    sinks = torch.randn(h_q, device=DEV, generator=g) + 4.0
    out = fa_course.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, causal=True, softcap=20.0,
                                           alibi_slopes=slopes, num_splits=num_splits, learnable_sink=sinks)
    for i, n in enumerate(lengths):
        keys, vals = k_cache[i:i + 1, :n + n_new], v_cache[i:i + 1, :n + n_new]
        ref = math_attention(q[i:i + 1].double(), keys.double(), vals.double(), causal=True, causal_align="bottom_right",
                             softcap=20.0, alibi_slopes=slopes, sinks=sinks)
        close(out[i:i + 1], ref)


# ---- fp16 (the production forwards, where the library is built with FA_DTYPES=bf16;fp16) ----------
# fp16 keeps 11 significant bits to bf16's 8: the course's rule divided by 8 (harness/compare.h's
# fp16_tolerance), which a kernel that rounded P or O to bf16's precision would fail.
ATOL16, RTOL16 = 1.25e-3, 1.25e-3


def fp16_or_skip(q, k, v, **kw):
    """fa_course.attention on fp16 inputs, or a skip where the library was built without fp16."""
    try:
        return fa_course.attention(q, k, v, **kw)
    except fa_course.UnsupportedInputError as e:
        if "element type fp16 is not supported" in str(e):
            pytest.skip(f"the library is built without fp16 (FA_DTYPES): {e}")
        raise


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}_Nq{}_Nkv{}_H{}_Hkv{}_D{}".format(*s))
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "top_left"), (True, "bottom_right")])
def test_fp16_forward_against_fp64_reference(shape, causal, align):
    """Ragged N_q != N_kv, GQA, both causal alignments (rows with no key among them), fp16 in and out."""
    q, k, v = (t.half() for t in inputs(*shape, seed=60))
    o, lse = fp16_or_skip(q, k, v, causal=causal, causal_align=align, return_lse=True)
    ref_o, ref_lse = reference(q, k, v, causal=causal, bottom_right=align == "bottom_right", lse=True)
    assert o.shape == q.shape and o.dtype == torch.float16 and o.is_contiguous()
    torch.testing.assert_close(o.double(), ref_o.double(), atol=ATOL16, rtol=RTOL16)
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse.double()[finite], ref_lse[finite], atol=1e-3, rtol=1e-3)
    assert torch.equal(torch.isinf(lse), ~finite)


def test_fp16_flash_attn_func_large_logits():
    """flash_attn_func's fp16 forward on logits of std ~100 (inputs ×10 fit fp16; Q·K is fp32 inside)."""
    q, k, v = (t.half() for t in inputs(2, 515, 700, 4, 2, 64, seed=61))
    q, k = q * 10, k * 10
    try:
        out = fa_course.flash_attn_func(q, k, v, causal=True)
    except fa_course.UnsupportedInputError as e:
        pytest.skip(f"the library is built without fp16 (FA_DTYPES): {e}")
    ref = reference(q, k, v, causal=True, bottom_right=True)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.double(), ref.double(), atol=ATOL16, rtol=RTOL16)


@pytest.mark.parametrize("d", [32, 96, 192, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_fp16_head_dims_beyond_the_lessons(d, causal):
    """Part VI's head dims in fp16, where the library is built for them (FA_HEAD_DIMS): kernels 100 and
    101 at all four, 32 and 96 on 101 in a half-used last panel, whose columns past the head dim must
    come in as zeros in this type too. Ragged GQA, and N_q > N_kv bottom-right (rows with no key)."""
    if not head_dim_built(d):
        pytest.skip(f"the library is not built for head dim {d} (FA_HEAD_DIMS)")
    for shape in ((2, 77, 131, 4, 2, d), (1, 300, 200, 8, 1, d)):
        q, k, v = (t.half() for t in inputs(*shape, seed=d + 64))
        o, lse = fp16_or_skip(q, k, v, causal=causal, causal_align="bottom_right", return_lse=True)
        ref_o, ref_lse = reference(q, k, v, causal=causal, bottom_right=True, lse=True)
        assert o.dtype == torch.float16
        torch.testing.assert_close(o.double(), ref_o.double(), atol=ATOL16, rtol=RTOL16)
        finite = torch.isfinite(ref_lse)
        torch.testing.assert_close(lse.double()[finite], ref_lse[finite], atol=1e-3, rtol=1e-3)
        assert torch.equal(torch.isinf(lse), ~finite)


def fp16_built():
    """Whether the library has fp16 kernels (FA_DTYPES=bf16;fp16): a one-row fp16 forward runs or is refused."""
    q = torch.zeros(1, 1, 1, 64, device=DEV, dtype=torch.float16)
    try:
        fa_course.attention(q, q, q)
    except fa_course.UnsupportedInputError as e:
        if "element type fp16 is not supported" in str(e):
            return False
        raise
    return True


FP16_GRAD_CASES = [((2, 77, 131, 4, 2, 64), False, "top_left"), ((1, 131, 77, 4, 2, 128), True, "bottom_right"),
                   ((1, 1024, 1024, 4, 2, 128), True, "top_left"), ((2, 300, 300, 4, 4, 64), True, "top_left")]


@pytest.mark.parametrize("shape,causal,align", FP16_GRAD_CASES, ids=str)
def test_fp16_gradients_against_fp64_reference(shape, causal, align):
    """The backward in fp16 (the production kernels', where the library is built with it): dq, dk, dv
    in fp16 at the yardstick against PyTorch's own fp16 math and fp64 autograd, relative norm within
    2e-3 (fp16's rounding is 8 times finer than bf16's); rows with no key get zero dq."""
    if not fp16_built():
        pytest.skip("the library is built without fp16 (FA_DTYPES)")
    q, k, v = inputs(*shape, seed=70, dtype=torch.float16)  # fp16's 11 bits, not bf16 values cast
    do = upstream(q, seed=71, dtype=torch.float16)
    ours, half, exact = three_ways([q, k, v], do, causal=causal, causal_align=align)
    within_yardstick(ours, half, exact, dtype=torch.float16)
    n_q, n_kv = shape[1], shape[2]
    if causal and align == "bottom_right" and n_q > n_kv:
        assert torch.equal(ours[0][:, :n_q - n_kv], torch.zeros_like(ours[0][:, :n_q - n_kv]))


@pytest.mark.parametrize("d", [32, 96, 192, 256])
def test_fp16_gradients_at_head_dims_beyond_the_lessons(d):
    """fp16 gradients at Part VI's head dims (where built; 256 on sm_90 alone), causal bottom-right."""
    if not head_dim_built(d):
        pytest.skip(f"the library is not built for head dim {d} (FA_HEAD_DIMS)")
    if d == 256 and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the backward at head dim 256 runs on sm_90 alone")
    if not fp16_built():
        pytest.skip("the library is built without fp16 (FA_DTYPES)")
    q, k, v = inputs(1, 200, 333, 4, 2, d, seed=72 + d, dtype=torch.float16)
    do = upstream(q, seed=73, dtype=torch.float16)
    within_yardstick(*three_ways([q, k, v], do, causal=True, causal_align="bottom_right"), dtype=torch.float16,
                     what=f"D = {d}: ")


def test_fp16_gradients_with_a_window_and_every_score_mod():
    """fp16 through the window and score-modification kernels' backward: a causal window with softcap,
    ALiBi and sinks together (the sinks' gradient in their own dtype, fp32 here), against fp64."""
    if not fp16_built():
        pytest.skip("the library is built without fp16 (FA_DTYPES)")
    shape = (2, 300, 517, 4, 2, 64)
    q, k, v = inputs(*shape, seed=74, dtype=torch.float16)
    do = upstream(q, seed=75, dtype=torch.float16)
    mods = mod_args("all", shape[0], shape[3], seed=76)
    sinks = mods.pop("sinks").float()
    opts = dict(causal=True, causal_align="bottom_right", **mods)  # "all": a window of 100 keys too
    fn = lambda q, k, v, s: fa_course.attention(q, k, v, sinks=s, **opts)
    ref = lambda q, k, v, s: math_attention(q, k, v, sinks=s, **opts)
    ours = grads_of(fn, [q, k, v, sinks], do)[1]
    half = grads_of(ref, [q, k, v, sinks.half()], do)[1]
    exact = grads_of(ref, [q.double(), k.double(), v.double(), sinks.double()], do.double())[1]
    within_yardstick(ours[:3], half[:3], exact[:3], dtype=torch.float16)
    rel = ((ours[3].double() - exact[3]).norm() / exact[3].norm()).item()
    assert ours[3].dtype == torch.float32 and rel <= 1e-2, f"dsinks relative error {rel:.3e}"


def test_fp16_flash_attn_with_kvcache_and_varlen():
    """fp16 through the decode kernel (where built): a paged cache with an append, and packed varlen
    calls, decode-sized (the decode kernel's packed path on either kernel) and longer (kernel 101's
    own packed prefill on an H100/H200), each at fp16's tolerance against fp64."""
    if not fp16_built():
        pytest.skip("the library is built without fp16 (FA_DTYPES)")
    paged_append_matches(16, 2, 128, dtype=torch.float16)
    for q_len, k_len in (([1, 3, 1, 2], [700, 77, 1, 2000]), ([5, 1, 130, 64], [5, 300, 130, 1])):
        h_q, h_kv, d = 8, 2, 128
        q, k, v, cu = packed_inputs(q_len, k_len, h_q, h_kv, d, seed=77, dtype=torch.float16)
        with torch.no_grad():
            out, lse = fa_course.flash_attn_varlen_func(q, k, v, cu(q_len), cu(k_len), max(q_len), max(k_len),
                                                        causal=True, return_lse=True)
        assert out.dtype == torch.float16
        qa = ka = 0
        for nq, nk in zip(q_len, k_len):
            ref_o, ref_lse = reference(q[None, qa:qa + nq], k[None, ka:ka + nk], v[None, ka:ka + nk], causal=True,
                                       bottom_right=True, lse=True)
            torch.testing.assert_close(out[None, qa:qa + nq].double(), ref_o.double(), atol=ATOL16, rtol=RTOL16)
            torch.testing.assert_close(lse[:, qa:qa + nq].double(), ref_lse[0].double(), atol=1e-3, rtol=1e-3)
            qa, ka = qa + nq, ka + nk


def test_fp16_mixed_types_and_cache_calls_are_refused():
    q, k, v = inputs(1, 64, 64, 2, 2, 64, seed=63)
    with pytest.raises(ValueError, match="share one dtype"):
        fa_course.attention(q.half(), k, v)
    with pytest.raises(ValueError, match="share one dtype"):
        fa_course.flash_attn_with_kvcache(q, k.half(), v, cache_seqlens=64)
