"""fa_course as transformers' attention (fa_course.integrations.transformers) on a small Llama-shaped
model built here with random weights (no downloads): 2 layers, 4 query heads over 2 KV heads
(GQA), D = 128, bf16. Against PyTorch's SDPA on the same weights and an fp32 eager copy: prefill
logits, prefill after a KV cache (fewer queries than keys), `generate` with the cache, a padded
batch and `generate` on one (through the varlen call), a compiled
attention call and a compiled model, a training step's gradients and a short training run beside
SDPA's; and each input it must refuse. Needs a CUDA GPU and
transformers (tests/python/run.sh skips the ctest case, with the reason, where either is missing)."""
import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import fa_course  # noqa: E402
import fa_course.integrations.transformers as fa_hf  # noqa: E402
from transformers import AttentionInterface, AttentionMaskInterface, AutoModelForCausalLM, LlamaConfig  # noqa: E402

DEV = "cuda"
NAME = fa_hf.register()
CONFIG = LlamaConfig(vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                     initializer_range=0.05, attention_dropout=0.0, pad_token_id=0)
assert CONFIG.hidden_size // CONFIG.num_attention_heads == 128

# A spy beside the integration: the same functions under another name, recording (N_q, N_kv) per call.
CALLS = []


def _spy(module, query, key, value, attention_mask, **kwargs):
    CALLS.append((query.shape[2], key.shape[2]))
    return fa_hf.attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register("fa_course_spy", _spy)
AttentionMaskInterface.register("fa_course_spy", fa_hf.mask_function)

torch.manual_seed(0)
_STATE = AutoModelForCausalLM.from_config(CONFIG, attn_implementation="eager").state_dict()


def model(impl, dtype=torch.bfloat16, config=CONFIG, state=_STATE):
    m = AutoModelForCausalLM.from_config(config, attn_implementation=impl)
    if state is not None:
        m.load_state_dict(state)
    return m.to(DEV, dtype).eval()


def ids(b, n, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(1, CONFIG.vocab_size, (b, n), generator=g).to(DEV)


def rel(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


def worst(x, ref):
    return (x.double() - ref.double()).abs().max().item()


@torch.no_grad()
def test_prefill_logits_within_sdpas_own_error():
    x = ids(2, 333, seed=1)
    exact = model("eager", torch.float32)(x).logits
    ours = model(NAME)(x).logits
    sdpa = model("sdpa")(x).logits
    print(f"prefill vs fp32 eager: fa_course rel {rel(ours, exact):.2e} max {worst(ours, exact):.3f}; "
          f"sdpa rel {rel(sdpa, exact):.2e} max {worst(sdpa, exact):.3f}")
    assert rel(ours, exact) <= 1.5 * rel(sdpa, exact)
    assert worst(ours, exact) <= 2.0 * worst(sdpa, exact)


@torch.no_grad()
def test_prefill_after_a_cache_is_bottom_right_aligned():
    """57 new tokens after 200 in the cache: each sees the whole prefix and the new ones before it."""
    x = ids(1, 257, seed=2)
    exact = model("eager", torch.float32)(x).logits[:, 200:]
    out = {}
    for impl in (NAME, "sdpa"):
        m = model(impl)
        first = m(x[:, :200], use_cache=True)
        out[impl] = m(x[:, 200:], past_key_values=first.past_key_values, use_cache=True).logits
    print(f"after the cache: fa_course rel {rel(out[NAME], exact):.2e}, sdpa rel {rel(out['sdpa'], exact):.2e}")
    assert rel(out[NAME], exact) <= 1.5 * rel(out["sdpa"], exact)


@torch.no_grad()
def test_generate_with_a_kv_cache():
    x = ids(2, 50, seed=3)
    CALLS.clear()
    m = model("fa_course_spy")
    seq = m.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert seq.shape == (2, 66)
    layers = CONFIG.num_hidden_layers
    assert CALLS[:layers] == [(50, 50)] * layers  # the prefill
    assert CALLS[layers:] == [(1, 50 + t) for t in range(1, 16) for _ in range(layers)]  # decoding, N_q = 1
    # Each generated token is the fp32 model's choice, up to bf16's own error on these logits.
    exact = model("eager", torch.float32)(seq).logits[:, 49:-1]
    sdpa = model("sdpa")(seq).logits[:, 49:-1]
    tol = 4 * worst(sdpa, exact)
    chosen = exact.gather(-1, seq[:, 50:, None]).squeeze(-1)
    gap = (exact.max(-1).values - chosen).max().item()
    assert gap <= tol, f"a generated token's fp32 logit is {gap:.3f} below the best (bf16 error {tol / 4:.3f})"


def test_compiled_attention_call_with_a_scale_is_one_graph():
    module = torch.nn.Module()
    module.is_causal = True
    g = torch.Generator(device=DEV).manual_seed(4)
    q = torch.randn(2, 4, 100, 128, device=DEV, dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(2, 2, 130, 128, device=DEV, dtype=torch.bfloat16, generator=g) for _ in range(2))

    def call(q, k, v):
        return fa_hf.attention_forward(module, q, k, v, None, dropout=0.0, scaling=0.07)[0]

    eager = call(q, k, v)
    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True)(q, k, v)
    torch.testing.assert_close(compiled, eager, atol=0, rtol=0)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(2, 1),
                                                           v.float().repeat_interleave(2, 1), scale=0.07,
                                                           attn_mask=torch.ones(100, 130, dtype=torch.bool,
                                                                                device=DEV).tril(30))
    torch.testing.assert_close(eager.float(), ref.transpose(1, 2), atol=1e-2, rtol=1e-2)  # bottom-right causal


@torch.no_grad()
def test_compiled_model_is_one_graph_within_sdpas_error():
    x = ids(2, 200, seed=5)
    exact = model("eager", torch.float32)(x).logits
    sdpa = model("sdpa")(x).logits
    torch._dynamo.reset()
    # One graph, the mask builder and the attention op included; the compiler fuses the model's other
    # bf16 operations differently from eager mode, so its logits are judged like SDPA's, against fp32.
    compiled = torch.compile(model(NAME), fullgraph=True)(x).logits
    print(f"compiled model: fa_course rel {rel(compiled, exact):.2e}, eager sdpa rel {rel(sdpa, exact):.2e}")
    assert rel(compiled, exact) <= 1.5 * rel(sdpa, exact)


@torch.no_grad()
@torch.no_grad()
def test_padded_batch_is_each_sequence_alone():
    """A batch of different lengths, left-padded as generate pads it: each sequence's logits are its
    own, unpadded (flash_attn_varlen_func underneath), and the padded rows' attention is zero, not NaN."""
    x = ids(3, 80, seed=7)
    lengths = [80, 51, 17]
    mask = torch.zeros_like(x)
    for i, n in enumerate(lengths):
        mask[i, 80 - n:] = 1
    out = model(NAME)(x, attention_mask=mask).logits
    exact, sdpa = model("eager", torch.float32), model("sdpa")
    for i, n in enumerate(lengths):
        alone = exact(x[i:i + 1, 80 - n:]).logits
        ref = sdpa(x[i:i + 1, 80 - n:]).logits
        print(f"sequence {i} ({n} tokens): fa_course rel {rel(out[i:i + 1, 80 - n:], alone):.2e}, "
              f"sdpa rel {rel(ref, alone):.2e}")
        assert rel(out[i:i + 1, 80 - n:], alone) <= 1.5 * rel(ref, alone) + 1e-3
    assert torch.isfinite(out).all()


@torch.no_grad()
def test_generate_a_left_padded_batch():
    """generate on sequences of different lengths: after the prefill every step is a decode call over
    each sequence's own cached tokens. Each generated token is the fp32 model's choice for that
    sequence alone, unpadded, up to bf16's own error on its logits (as test_generate_with_a_kv_cache)."""
    x = ids(2, 40, seed=8)
    mask = torch.ones_like(x)
    mask[1, :15] = 0  # the second sequence has 25 tokens, left-padded
    x[1, :15] = 0
    seq = model(NAME).generate(x, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert seq.shape == (2, 52)
    exact, sdpa = model("eager", torch.float32), model("sdpa")
    for i, start in ((0, 0), (1, 15)):
        own = seq[i:i + 1, start:]  # the sequence alone: its prompt and its generated tokens
        n = 40 - start
        ex = exact(own).logits[:, n - 1:-1]
        tol = 4 * worst(sdpa(own).logits[:, n - 1:-1], ex)
        chosen = ex.gather(-1, own[:, n:, None]).squeeze(-1)
        gap = (ex.max(-1).values - chosen).max().item()
        assert gap <= tol, f"sequence {i}: a generated token's fp32 logit is {gap:.3f} below the best"


def test_refusals_say_why():
    x = ids(2, 64, seed=6)
    m = model(NAME)
    padded = torch.ones_like(x)
    padded[0, :10] = 0  # the first sequence is 10 tokens shorter
    with torch.enable_grad(), pytest.raises(ValueError, match="padding mask .* while autograd records"):
        m(x, attention_mask=padded)  # a forward autograd records: the varlen backward is not built
    with pytest.raises(ValueError, match="bfloat16"):
        model(NAME, torch.float16)(x)
    d96 = copy.deepcopy(CONFIG)
    d96.hidden_size, d96.head_dim = 384, 96
    with pytest.raises(fa_course.UnsupportedInputError, match="head dim 96"):
        model(NAME, config=d96, state=None)(x)
    drop = copy.deepcopy(CONFIG)
    drop.attention_dropout = 0.1
    with torch.enable_grad(), pytest.raises(ValueError, match="dropout"):
        model(NAME, config=drop).train()(x)
    from transformers import MistralConfig
    window = MistralConfig(**{k: getattr(CONFIG, k) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                              "num_hidden_layers", "num_attention_heads",
                                                              "num_key_value_heads")}, sliding_window=16)
    with pytest.raises(ValueError, match="sliding window|sliding_window"):
        model(NAME, config=window, state=None)(x)


def train(impl, steps=30, lr=1e-3):
    """`steps` AdamW steps of the bf16 model from _STATE on the same token batches, each a random
    first half repeated (the second half is predictable through attention alone). Returns the losses."""
    torch.manual_seed(0)
    m = model(impl).train()
    opt = torch.optim.AdamW(m.parameters(), lr=lr)
    losses = []
    for i in range(steps):
        half = ids(4, 96, seed=100 + i)
        x = torch.cat([half, half], dim=1)
        loss = m(x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def test_training_follows_sdpas_loss_curve():
    ours, sdpa = train(NAME), train("sdpa")
    print("step  fa_course  sdpa\n" + "\n".join(f"{i:4d}  {a:.4f}  {b:.4f}" for i, (a, b) in enumerate(zip(ours, sdpa))))
    for i, (a, b) in enumerate(zip(ours, sdpa)):
        assert abs(a - b) <= 2e-2 * abs(b), f"step {i}: loss {a:.4f} with fa_course, {b:.4f} with sdpa"
    assert abs(ours[-1] - sdpa[-1]) <= 1e-2 * abs(sdpa[-1])
    first, last = sum(ours[:5]) / 5, sum(ours[-5:]) / 5  # each batch's loss is noisy: means of five
    assert last < first - 0.2, f"the loss did not decrease: {first:.3f} over the first five steps, {last:.3f} the last"


def test_training_step_gradients_match_sdpas():
    """One backward through the whole model: every parameter's gradient within bf16's reach of SDPA's,
    judged against an fp32 eager copy as the logits are."""
    x = ids(2, 200, seed=8)
    grads = {}
    for impl, dtype in ((NAME, torch.bfloat16), ("sdpa", torch.bfloat16), ("eager", torch.float32)):
        m = model(impl, dtype).train()
        m(x, labels=x).loss.backward()
        grads[impl] = {n: p.grad for n, p in m.named_parameters()}
    for n, exact in grads["eager"].items():
        ours, sdpa = grads[NAME][n], grads["sdpa"][n]
        assert ours is not None and torch.isfinite(ours).all(), n
        assert rel(ours, exact) <= max(1.5 * rel(sdpa, exact), 1e-2), \
            f"{n}: fa_course rel {rel(ours, exact):.2e}, sdpa rel {rel(sdpa, exact):.2e}"
