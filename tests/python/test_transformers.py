"""fa_course as transformers' attention (fa_course.integrations.transformers) on a small Llama-shaped
model built here with random weights (no downloads): 2 layers, 4 query heads over 2 KV heads
(GQA), D = 128, bf16. Against PyTorch's SDPA on the same weights and an fp32 eager copy: prefill
logits, prefill after a KV cache (fewer queries than keys), `generate` with the cache, a padded
batch and `generate` on one (through the varlen call), a compiled
attention call and a compiled model, a training step's gradients and a short training run beside
SDPA's; a Mistral-shaped model with a sliding window (logits, a prefill after a cache, gradients);
Gemma-2- and gpt-oss-shaped models (softcapping, sinks) against eager; Phi- and Gemma-shaped ones at
head dims 96 and 256 where the library is built for them; and each input it must refuse. Needs a CUDA GPU and
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


def _beyond_the_lessons_model(shape, seed):
    """A Phi-shaped Llama (D = 96) or a Gemma-shaped model (D = 256) with random weights: its head
    dim, a function that returns a fresh copy of its config (from_config writes the implementation
    into the config it is given), and its weights. Skips where the library lacks the head dim."""
    d = 96 if shape == "phi" else 256
    probe = torch.zeros(1, 1, 1, d, device=DEV, dtype=torch.bfloat16)
    try:
        fa_course.pick_step(probe, probe, probe)
    except fa_course.UnsupportedInputError:
        pytest.skip(f"the library is not built for head dim {d} (FA_HEAD_DIMS)")
    if shape == "phi":
        config = copy.deepcopy(CONFIG)
        config.hidden_size, config.head_dim = 4 * d, d
    else:
        config = _mod_config("GemmaConfig", head_dim=d)
    fresh = lambda: copy.deepcopy(config)
    torch.manual_seed(seed)
    return d, fresh, AutoModelForCausalLM.from_config(fresh(), attn_implementation="eager").state_dict()


def expect_gradients_within_sdpas_reach(x, config=None, state=_STATE, what="", dtype=torch.bfloat16):
    """One backward through the whole model (fa_course and SDPA in `dtype`, eager in fp32): every
    parameter's gradient finite and within that dtype's reach of SDPA's, judged against the fp32 one."""
    grads = {}
    low = dtype
    for impl, dtype in ((NAME, low), ("sdpa", low), ("eager", torch.float32)):
        m = model(impl, dtype, copy.deepcopy(config) if config is not None else CONFIG, state).train()
        m(x, labels=x).loss.backward()
        grads[impl] = {n: p.grad for n, p in m.named_parameters()}
    for n, exact in grads["eager"].items():
        ours, sdpa = grads[NAME][n], grads["sdpa"][n]
        assert ours is not None and torch.isfinite(ours).all(), f"{what}{n}"
        assert rel(ours, exact) <= max(1.5 * rel(sdpa, exact), 1e-2), \
            f"{what}{n}: fa_course rel {rel(ours, exact):.2e}, sdpa rel {rel(sdpa, exact):.2e}"


@pytest.mark.parametrize("shape", ["phi", "gemma"])
@torch.no_grad()
def test_head_dims_beyond_the_lessons_in_a_model(shape):
    """Part VI's head dims in a model's inference, where the library is built for them
    (FA_HEAD_DIMS=all): a Phi-shaped Llama (D = 96) and a Gemma-shaped one (D = 256), both on kernel
    101 on an H100/H200 and on kernel 100 elsewhere: prefill logits within bf16 eager's own error of the fp32 eager
    model, and each token `generate` picks the fp32 model's choice up to that error."""
    d, fresh, state = _beyond_the_lessons_model(shape, seed=41)
    x = ids(2, 100, seed=d)
    exact = model("eager", torch.float32, fresh(), state)(x).logits
    ours = model(NAME, config=fresh(), state=state)(x).logits
    eager = model("eager", torch.bfloat16, fresh(), state)(x).logits
    print(f"D = {d} prefill vs fp32 eager: fa_course rel {rel(ours, exact):.2e}, bf16 eager {rel(eager, exact):.2e}")
    assert rel(ours, exact) <= 1.5 * rel(eager, exact)
    assert worst(ours, exact) <= 2.0 * worst(eager, exact)
    seq = model(NAME, config=fresh(), state=state).generate(x[:, :50], attention_mask=torch.ones_like(x[:, :50]),
                                                             max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert seq.shape == (2, 58)
    exact = model("eager", torch.float32, fresh(), state)(seq).logits[:, 49:-1]
    tol = 4 * worst(model("eager", torch.bfloat16, fresh(), state)(seq).logits[:, 49:-1], exact)
    gap = (exact.max(-1).values - exact.gather(-1, seq[:, 50:, None]).squeeze(-1)).max().item()
    assert gap <= tol, f"a generated token's fp32 logit is {gap:.3f} below the best (bf16 error {tol / 4:.3f})"


@pytest.mark.parametrize("shape", ["phi", "gemma"])
def test_head_dims_beyond_the_lessons_train(shape):
    """Part VI's head dims in training, where the library is built for them: one backward through a
    Phi-shaped Llama (D = 96: kernel 100's backward, or the Hopper one on an H100/H200) and a
    Gemma-shaped model (D = 256: the mma.sync backward on either kernel), every parameter's gradient
    within bf16's reach of SDPA's, judged against an fp32 eager copy. At 256 before sm_90 the
    gradient is refused by name before the forward runs."""
    d, fresh, state = _beyond_the_lessons_model(shape, seed=43)
    x = ids(2, 150, seed=d + 1)
    if d == 256 and torch.cuda.get_device_capability() < (9, 0):
        with pytest.raises(NotImplementedError, match="no backward at head dim 256"):
            model(NAME, config=fresh(), state=state).train()(x, labels=x)
        return
    expect_gradients_within_sdpas_reach(x, fresh(), state, what=f"D = {d}: ")


def test_fp16_model_trains_within_sdpas_reach():
    """A float16 model (where the library is built with fp16: FA_DTYPES): inference logits within fp16
    SDPA's own error of the fp32 eager model, and one backward's gradients within fp16 SDPA's reach. A
    build without fp16 refuses the forward by name."""
    x = ids(2, 150, seed=44)
    try:
        with torch.no_grad():
            ours = model(NAME, torch.float16)(x).logits
    except fa_course.UnsupportedInputError as e:
        assert "element type fp16 is not supported" in str(e), e
        pytest.skip(f"the library is built without fp16 (FA_DTYPES): {e}")
    with torch.no_grad():
        exact = model("eager", torch.float32)(x).logits
        sdpa = model("sdpa", torch.float16)(x).logits
    assert ours.dtype == torch.float16 and torch.isfinite(ours).all()
    assert rel(ours, exact) <= max(1.5 * rel(sdpa, exact), 1e-3), f"fp16 logits: {rel(ours, exact):.2e} vs sdpa {rel(sdpa, exact):.2e}"
    expect_gradients_within_sdpas_reach(x, dtype=torch.float16, what="fp16: ")


def test_refusals_say_why():
    x = ids(2, 64, seed=6)
    m = model(NAME)
    padded = torch.ones_like(x)
    padded[0, :10] = 0  # the first sequence is 10 tokens shorter
    with torch.enable_grad(), pytest.raises(ValueError, match="padding mask .* while autograd records"):
        m(x, attention_mask=padded)  # a forward autograd records: the varlen backward is not built
    d80 = copy.deepcopy(CONFIG)  # a head dim no build has (FA_HEAD_DIMS=all has 96, Phi's)
    d80.hidden_size, d80.head_dim = 320, 80
    with pytest.raises(fa_course.UnsupportedInputError, match="head dim 80"):
        model(NAME, config=d80, state=None)(x)
    drop = copy.deepcopy(CONFIG)
    drop.attention_dropout = 0.1
    with torch.enable_grad(), pytest.raises(ValueError, match="dropout"):
        model(NAME, config=drop).train()(x)
    # Documents packed in one row (padding-free training's position_ids) with a cache in play, where
    # transformers' mask builder does not look for packing: refused, never attended across.
    docs = torch.cat((torch.arange(40), torch.arange(24))).to(DEV)[None]
    with pytest.raises(ValueError, match="packed sequences"):
        m(x[:1], position_ids=docs, use_cache=True)


# A Mistral-shaped model with a sliding window of 16 tokens (transformers: a token sees itself and
# the 15 before it), served through flash-attn's window_size (15, 0).
from transformers import MistralConfig  # noqa: E402

WINDOW_CONFIG = MistralConfig(**{k: getattr(CONFIG, k) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                                 "num_hidden_layers", "num_attention_heads",
                                                                 "num_key_value_heads", "initializer_range",
                                                                 "attention_dropout", "pad_token_id")},
                              head_dim=128, sliding_window=16, max_position_embeddings=4096)
torch.manual_seed(1)
_WINDOW_STATE = AutoModelForCausalLM.from_config(WINDOW_CONFIG, attn_implementation="eager").state_dict()


def test_sliding_window_model_within_sdpas_own_error():
    """Prefill logits of the window model (100 tokens, six windows long) against its fp32 eager copy,
    within SDPA's own error, a prefill after a cache (bottom-right), and one training step's
    gradients beside SDPA's."""
    x = ids(2, 100, seed=9)
    with torch.no_grad():
        exact = model("eager", torch.float32, WINDOW_CONFIG, _WINDOW_STATE)(x).logits
        ours = model(NAME, config=WINDOW_CONFIG, state=_WINDOW_STATE)(x).logits
        sdpa = model("sdpa", config=WINDOW_CONFIG, state=_WINDOW_STATE)(x).logits
    print(f"window prefill vs fp32 eager: fa_course rel {rel(ours, exact):.2e}, sdpa rel {rel(sdpa, exact):.2e}")
    assert rel(ours, exact) <= 1.5 * rel(sdpa, exact)
    assert worst(ours, exact) <= 2.0 * worst(sdpa, exact)
    with torch.no_grad():
        m = model(NAME, config=WINDOW_CONFIG, state=_WINDOW_STATE)
        first = m(x[:, :70], use_cache=True)
        after = m(x[:, 70:], past_key_values=first.past_key_values, use_cache=True).logits
    assert rel(after, exact[:, 70:]) <= 1.5 * rel(sdpa[:, 70:], exact[:, 70:])
    expect_gradients_within_sdpas_reach(x, WINDOW_CONFIG, _WINDOW_STATE)


# Models with score modifications, built here with random weights: a Gemma-2-shaped model (logit
# softcapping of 50 on every layer, a 16-token sliding window on every other, a scale of
# query_pre_attn_scalar^-1/2 = 1/16 rather than 1/sqrt(D)) and a gpt-oss-shaped one (a learnable sink
# per head, 16-token windows on every other layer). Their reference is transformers' eager attention:
# SDPA has no softcap or sinks.
def _mod_config(name, **extra):
    cls = getattr(transformers, name, None)
    if cls is None:
        pytest.skip(f"this transformers has no {name}")
    base = {k: getattr(CONFIG, k) for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                            "num_attention_heads", "num_key_value_heads", "initializer_range",
                                            "attention_dropout", "pad_token_id")}
    return cls(**base, max_position_embeddings=4096, **extra)


def _within_eagers_own_error(config, seed):
    """Prefill logits against the fp32 eager copy within bf16 eager's own error, and one training
    step's gradients of every parameter (the sinks included) likewise."""
    torch.manual_seed(seed)
    state = AutoModelForCausalLM.from_config(config, attn_implementation="eager").state_dict()
    x = ids(2, 100, seed=seed)
    with torch.no_grad():
        exact = model("eager", torch.float32, config, state)(x).logits
        ours = model(NAME, config=config, state=state)(x).logits
        eager = model("eager", torch.bfloat16, config, state)(x).logits
    print(f"{type(config).__name__} prefill vs fp32 eager: fa_course rel {rel(ours, exact):.2e}, "
          f"bf16 eager rel {rel(eager, exact):.2e}")
    assert rel(ours, exact) <= 1.5 * rel(eager, exact)
    assert worst(ours, exact) <= 2.0 * worst(eager, exact)
    grads = {}
    for impl, dtype in ((NAME, torch.bfloat16), ("eager-bf16", torch.bfloat16), ("eager", torch.float32)):
        m = model(impl.split("-")[0], dtype, config, state).train()
        m(x, labels=x).loss.backward()
        grads[impl] = {n: p.grad for n, p in m.named_parameters()}
    for n, g_exact in grads["eager"].items():
        if g_exact is None:  # a parameter the loss does not reach (an expert no token chose)
            continue
        g_ours, g_bf16 = grads[NAME][n], grads["eager-bf16"][n]
        assert g_ours is not None and torch.isfinite(g_ours).all(), n
        if n.endswith("router.bias"):
            # With every expert chosen (2 of 2) the router bias's gradient is a difference of two
            # near-equal sums (±0.016 in run S): its relative error is noise for any bf16
            # implementation (bf16 eager's 0.63 in one layer, 0.004 in the other). Judged by its
            # absolute error instead, against bf16 eager's or 1e-3.
            assert worst(g_ours, g_exact) <= 2 * max(worst(g_bf16, g_exact), 1e-3), \
                f"{n}: fa_course |err| {worst(g_ours, g_exact):.2e}, bf16 eager |err| {worst(g_bf16, g_exact):.2e}"
            continue
        assert rel(g_ours, g_exact) <= max(1.5 * rel(g_bf16, g_exact), 1e-2), \
            f"{n}: fa_course rel {rel(g_ours, g_exact):.2e}, bf16 eager rel {rel(g_bf16, g_exact):.2e}"
    return grads


def test_softcap_model_within_eagers_own_error():
    config = _mod_config("Gemma2Config", head_dim=128, query_pre_attn_scalar=256, sliding_window=16,
                         attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
    _within_eagers_own_error(config, seed=12)


def test_sinks_model_within_eagers_own_error():
    config = _mod_config("GptOssConfig", head_dim=64, sliding_window=16, num_local_experts=2, num_experts_per_tok=2)
    grads = _within_eagers_own_error(config, seed=13)
    assert any(n.endswith("sinks") and g is not None for n, g in grads[NAME].items()), "no sinks gradient"


@torch.no_grad()
@pytest.mark.parametrize("kind", ["window", "softcap", "sinks"])
def test_padded_batch_of_local_layers_each_sequence_alone(kind):
    """A left-padded batch of a model with sliding-window layers (Mistral-shaped; Gemma-2-shaped with
    softcapping; gpt-oss-shaped with sinks): the padded path hands the varlen call each layer's window,
    cap and sinks. Prefill logits of each sequence against the fp32 eager model on that sequence alone,
    within bf16 eager's own error, and generate's tokens the fp32 model's choices."""
    if kind == "window":
        config, state = WINDOW_CONFIG, _WINDOW_STATE
    else:
        config = (_mod_config("Gemma2Config", head_dim=128, query_pre_attn_scalar=256, sliding_window=16,
                              attn_logit_softcapping=50.0) if kind == "softcap" else
                  _mod_config("GptOssConfig", head_dim=64, sliding_window=16, num_local_experts=2,
                              num_experts_per_tok=2))
        torch.manual_seed(15)
        state = AutoModelForCausalLM.from_config(config, attn_implementation="eager").state_dict()
    x = ids(3, 60, seed=16)
    lengths = [60, 41, 23]  # windows of 16: every sequence longer than one
    mask = torch.zeros_like(x)
    for i, n in enumerate(lengths):
        mask[i, 60 - n:] = 1
        x[i, :60 - n] = 0
    ours = model(NAME, config=copy.deepcopy(config), state=state)
    out = ours(x, attention_mask=mask).logits
    seq = ours.generate(x, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    # (each model its own config: from_config writes the implementation into the config it is given)
    exact = model("eager", torch.float32, copy.deepcopy(config), state)
    eager = model("eager", torch.bfloat16, copy.deepcopy(config), state)
    for i, n in enumerate(lengths):
        alone, ref = exact(x[i:i + 1, 60 - n:]).logits, eager(x[i:i + 1, 60 - n:]).logits
        print(f"{kind} sequence {i} ({n} tokens): fa_course rel {rel(out[i:i + 1, 60 - n:], alone):.2e}, "
              f"bf16 eager rel {rel(ref, alone):.2e}")
        assert rel(out[i:i + 1, 60 - n:], alone) <= 1.5 * rel(ref, alone) + 1e-3
    for i, n in enumerate(lengths):
        own = seq[i:i + 1, 60 - n:]
        ex = exact(own).logits[:, n - 1:-1]
        tol = 4 * worst(eager(own).logits[:, n - 1:-1], ex)
        chosen = ex.gather(-1, own[:, n:, None]).squeeze(-1)
        gap = (ex.max(-1).values - chosen).max().item()
        assert gap <= tol, f"{kind} sequence {i}: a generated token's fp32 logit is {gap:.3f} below the best"


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
    expect_gradients_within_sdpas_reach(ids(2, 200, seed=8))
