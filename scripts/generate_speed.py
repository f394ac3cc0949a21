#!/usr/bin/env python3
"""Decode tokens per second of a transformers model generating with fa_course attention, beside SDPA.

A randomly initialised Llama-style model (GQA 32/8 at D = 128 like an 8B model's attention, a few
layers, bf16), greedy `generate` from a random prompt at each batch size, once with
attn_implementation="fa_course" (the integration: decode steps go to the split-KV decode kernel,
their workspace from PyTorch's allocator) and once with "sdpa". The decode rate is the new tokens
over the time generate spends after the prefill: each run is timed twice, with 1 and with
1 + --new-tokens new tokens, and the difference is the decode steps' time. The whole model is
timed, not attention alone: the table says what a user of the model sees. The tokens the two
implementations choose are compared too (a random model's logits are close together, so bf16
rounding may flip a token; the fraction that agree is reported, not asserted).

    python3 scripts/generate_speed.py --batches 1,8,32 --prompt 4096 --new-tokens 128
"""
import argparse
import csv
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompt", type=int, default=4096, help="prompt tokens per sequence")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3, help="median of this many timed runs")
    ap.add_argument("--csv", default=None)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    import fa_course.integrations.transformers as fa_hf

    name = fa_hf.register()
    config = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=args.layers,
                         num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=args.prompt +
                         args.new_tokens + 16, attention_dropout=0.0, pad_token_id=0, eos_token_id=None,
                         bos_token_id=None)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to("cuda", torch.bfloat16).eval()

    def generate(ids, new_tokens):
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)

    def timed(ids, new_tokens):
        times = []
        for _ in range(args.repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = generate(ids, new_tokens)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2], out

    rows = []
    gpu = torch.cuda.get_device_name()
    print(f"generate_speed — {gpu} — Llama-style, {args.layers} layers, hidden 4096, 32 query heads / 8 KV heads, "
          f"D = 128, bf16; prompt {args.prompt}, {args.new_tokens} new tokens, greedy; median of {args.repeats}\n")
    print("| batch | implementation | prefill + 1 token (ms) | decode (ms) | decode tokens/s | × SDPA | tokens equal to SDPA's |")
    print("|---|---|---|---|---|---|---|")
    for b in [int(x) for x in args.batches.split(",")]:
        g = torch.Generator(device="cpu").manual_seed(b)
        ids = torch.randint(1, config.vocab_size, (b, args.prompt), generator=g).to("cuda")
        result = {}
        for impl in ("sdpa", name):
            model.set_attn_implementation(impl)
            generate(ids, 2)  # warm-up: kernels loaded, autotuned, the allocator grown
            t_first, _ = timed(ids, 1)
            t_all, out = timed(ids, 1 + args.new_tokens)
            decode = t_all - t_first
            result[impl] = (t_first, decode, b * args.new_tokens / decode, out[:, args.prompt:])
        for impl in ("sdpa", name):
            t_first, decode, rate, toks = result[impl]
            ratio = rate / result["sdpa"][2]
            same = (toks == result["sdpa"][3]).float().mean().item()
            print(f"| {b} | {impl} | {t_first * 1e3:.1f} | {decode * 1e3:.1f} | {rate:.0f} | {ratio:.2f} | {same:.3f} |")
            rows.append(dict(gpu=gpu, batch=b, impl=impl, prompt=args.prompt, new_tokens=args.new_tokens,
                             layers=args.layers, prefill_ms=t_first * 1e3, decode_ms=decode * 1e3,
                             decode_tokens_per_s=rate, x_sdpa=ratio, tokens_equal=same))
        sys.stdout.flush()
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
