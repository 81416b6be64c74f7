#!/usr/bin/env python3
"""Issue 4's named peer for `corolla bench decode`: Hugging Face transformers' own model class
(eager PyTorch, bf16, no torch.compile, no CUDA graphs) built from the same config with random
weights, timed per decode step at each batch size over a cached context, greedy.

usage (on the GPU machine):
  /opt/torch/.venv/bin/python scripts/bench_hf_transformers.py \
      [--config tests/data/configs/qwen3-30b-a3b.json] [--batch 1 64] [--context 1024] [--steps 8]

What it does, so that the figures compare with `corolla bench decode --random-weights --context
C --batch B`: the model is made on the GPU from the config (transformers' initialiser: normal
weights, so the router picks experts about uniformly, as ours do), C random token ids a sequence
are prefilled through the base model in chunks (no logits, so that [B, C, vocab] is never made),
then 2 warm-up and `--steps` timed decode steps each feed one token a sequence through the whole
model and take the argmax. One line a batch: ms a step and tokens/s (batch over step time).
"""
import argparse
import json
import sys
import time


class RouterProbe:
    """The experts a MoE block's router picked in its last call (a forward hook on its gate:
    the picks where the gate returns them, else the top-k of its logits)."""

    def __init__(self, moe, cfg):
        self.top_k = cfg.num_experts_per_tok
        self.last = None
        gate = getattr(moe, "gate", None)
        if gate is not None:
            gate.register_forward_hook(self.hook)

    def hook(self, module, inputs, output):
        outs = output if isinstance(output, tuple) else (output,)
        ids = [o for o in outs if hasattr(o, "dtype") and not o.dtype.is_floating_point]
        if ids:
            self.last = ids[0]
        else:
            self.last = outs[0].topk(self.top_k, dim=-1).indices

    def distinct(self):
        return "?" if self.last is None else int(self.last.reshape(-1).unique().numel())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="tests/data/configs/qwen3-30b-a3b.json")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=256, help="prefill tokens a sequence a forward")
    ap.add_argument("--layers", type=int, default=0, help="truncate to this many layers (0: all)")
    ap.add_argument("--attn", default="sdpa", help="attn_implementation (sdpa or eager)")
    args = ap.parse_args()

    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"bench_hf_transformers: {e}: no transformers here", file=sys.stderr)
        return 2
    with open(args.config) as f:
        cfg_dict = json.load(f)
    if args.layers > 0:
        cfg_dict["num_hidden_layers"] = args.layers
    cfg = transformers.AutoConfig.for_model(**cfg_dict)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name()}, {cfg.model_type}, {cfg.num_hidden_layers} layers, "
          f"attention {args.attn}, bf16, eager")

    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.device("cuda"):
        try:  # transformers 5 names it dtype, 4.x torch_dtype
            model = transformers.AutoModelForCausalLM.from_config(
                cfg, dtype=torch.bfloat16, attn_implementation=args.attn)
        except TypeError:
            model = transformers.AutoModelForCausalLM.from_config(
                cfg, torch_dtype=torch.bfloat16, attn_implementation=args.attn)
    model.eval()
    torch.cuda.synchronize()
    params = sum(p.numel() for p in model.parameters())
    print(f"model made in {time.perf_counter() - t0:.1f} s: {params / 1e9:.2f} B parameters, "
          f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB on the GPU")
    # The weights must be initialised (not left empty), else routing and timing mean nothing.
    for name, p in list(model.named_parameters())[:3] + list(model.named_parameters())[-1:]:
        x = p.detach().float()
        print(f"  {name} {tuple(p.shape)}: mean {x.mean().item():.2e} std {x.std().item():.3e}, "
              f"finite {bool(torch.isfinite(x).all())}")
    routed = RouterProbe(model.model.layers[0].mlp, cfg)

    for batch in args.batch:
        cache = transformers.DynamicCache()
        ids = torch.randint(0, cfg.vocab_size, (batch, args.context), device="cuda")
        with torch.no_grad():
            for s in range(0, args.context, args.chunk):
                model.model(input_ids=ids[:, s:s + args.chunk], past_key_values=cache,
                            use_cache=True)
            tok = ids[:, -1:]
            times = []
            for i in range(2 + args.steps):
                torch.cuda.synchronize()
                t = time.perf_counter()
                logits = model(input_ids=tok, past_key_values=cache, use_cache=True).logits
                tok = logits[:, -1].argmax(-1, keepdim=True)
                torch.cuda.synchronize()
                if i >= 2:
                    times.append(time.perf_counter() - t)
        times.sort()
        ms = times[len(times) // 2] * 1e3
        print(f"hf decode batch {batch} ctx {args.context}: {ms:.2f} ms/step (median of "
              f"{len(times)}; min {times[0] * 1e3:.2f}), {batch / (ms * 1e-3):.1f} tokens/s, "
              f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB, layer 0's last step "
              f"routed to {routed.distinct()} distinct experts")
        del cache, ids, logits
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
