"""The binding's GPU path (suite gpu): CUDA tensors through mosaickv.seq and
mosaickv.hf.MosaicCache.  Skips (exit 77) without numpy, torch with CUDA,
or a library whose sequences can attend on the device; fails on any
mismatch.

1. A sequence on a store on the device, fed bf16 CUDA tensors (prefill read
   on the device, decode tokens appended), attends on the GPU (stats show
   device attends, the output is a CUDA tensor) and agrees with exact
   attention and with a twin sequence on the CPU path.  r = d and every
   block selected: the cache is exact up to bf16 storage.
2. If transformers is installed: a small random Llama model on the GPU,
   decode logits through MosaicCache (r = d, every block) against
   transformers' DynamicCache, step by step on the same tokens.
"""
import os
import sys

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"{e.name} not installed: skipping")
    sys.exit(77)
if not torch.cuda.is_available():
    print("torch sees no CUDA device: skipping")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
from mosaickv.seq import Sequence, Store  # noqa: E402

failures = 0


def check(cond, what):
    global failures
    print(("ok  " if cond else "FAIL") + " " + what)
    if not cond:
        failures += 1


def exact_attention(q, k, v, g):
    """q (H*g, d), k/v (H, n, d), float64 on the CPU."""
    q, k, v = (t.double().cpu() for t in (q, k, v))
    h, n, d = k.shape
    out = torch.empty(h * g, d, dtype=torch.float64)
    for i in range(h * g):
        s = (k[i // g] @ q[i]) / d ** 0.5
        out[i] = torch.softmax(s, 0) @ v[i // g]
    return out


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm())


def sequence_part(defaults=False):
    """r = d in bf16 rows, every block (near exact); with @defaults the
    library's default compression (6-bit rows, 10% of the tokens), checked
    against the CPU path only."""
    torch.manual_seed(1)
    H, G, d, n0, steps, layers = 3, 3, 64, 2500, 12, 2
    opts = dict(layers=layers, kv_heads=H, q_per_kv=G, d=d, r=d, token_frac=1.0,
                window=64, prefill_segment=1024, value_bits=0)
    if defaults:
        opts = dict(layers=layers, kv_heads=H, q_per_kv=G, d=d, window=64,
                    prefill_segment=1024)
    dev_store = Store(gpu=torch.cuda.current_device(), hbm_bytes=64 << 20)
    cpu_store = Store(gpu=-1, hbm_bytes=64 << 20)
    sd = Sequence(dev_store, 11, **opts)
    sc = Sequence(cpu_store, 12, **opts)
    if not sd.on_device():
        print("the sequence is not on the device (library built without CUDA?): skipping")
        sys.exit(77)
    k = torch.randn(layers, H, n0 + steps, d, device="cuda").bfloat16()
    v = torch.randn(layers, H, n0 + steps, d, device="cuda").bfloat16()
    for layer in range(layers):
        sd.prefill(layer, k[layer, :, :n0], v[layer, :, :n0])     # device pointers
        sc.prefill(layer, k[layer, :, :n0].float().cpu().numpy(),
                   v[layer, :, :n0].float().cpu().numpy())
    worst_exact = worst_twin = sum_twin = 0.0
    on_cuda = True
    for t in range(n0, n0 + steps):
        for layer in range(layers):
            sd.append(layer, k[layer, :, t], v[layer, :, t])
            sc.append(layer, k[layer, :, t].float().cpu().numpy(),
                      v[layer, :, t].float().cpu().numpy())
            q = torch.randn(H * G, d, device="cuda")
            out = sd.attend(layer, q)
            on_cuda &= out.is_cuda
            ref = exact_attention(q, k[layer, :, :t + 1], v[layer, :, :t + 1], G)
            twin = torch.from_numpy(sc.attend(layer, q.cpu().numpy()))
            worst_exact = max(worst_exact, rel(out, ref))
            worst_twin = max(worst_twin, rel(out, twin))
            sum_twin += rel(out, twin)
    torch.cuda.synchronize()
    st = sd.stats()
    check(on_cuda, "attend returns CUDA tensors")
    check(st["device_attends"] >= layers * steps,
          f"attends ran on the GPU ({st['device_attends']} device attends)")
    if defaults:
        # the same blocks are selected but for near-ties of the scores
        # (GPU and CPU sum them in different orders): the mean, not the worst
        mean_twin = sum_twin / (layers * steps)
        check(mean_twin < 1e-2, f"defaults: GPU attend vs the CPU path: mean rel err "
              f"{mean_twin:.2e} (worst {worst_twin:.2e})")
    else:
        check(worst_exact < 1e-2, f"GPU attend vs exact attention: worst rel err {worst_exact:.2e}")
        check(worst_twin < 1e-2, f"GPU attend vs the CPU path: worst rel err {worst_twin:.2e}")
    sd.close()
    sc.close()
    dev_store.close()
    cpu_store.close()


def model_part():
    try:
        from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
        import mosaickv.hf as mhf
    except ImportError as e:
        print(f"transformers part skipped: {e}")
        return
    torch.manual_seed(2)
    cfg = LlamaConfig(vocab_size=512, hidden_size=384, intermediate_size=768,
                      num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
                      max_position_embeddings=4096, attn_implementation="mosaickv")
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    ids = torch.randint(0, 512, (1, 1500), device="cuda")
    cache = mhf.MosaicCache(cfg, r=cfg.hidden_size // cfg.num_attention_heads,
                            token_frac=1.0, window=64, value_bits=0)
    dyn = DynamicCache(config=cfg)
    worst = 0.0
    with torch.no_grad():
        a = model(ids, past_key_values=cache, use_cache=True).logits[:, -1]
        b = model(ids, past_key_values=dyn, use_cache=True).logits[:, -1]
        worst = max(worst, rel(a, b))
        for step in range(8):
            nxt = b.argmax(-1, keepdim=True)
            pos = torch.tensor([[ids.shape[1] + step]], device="cuda")
            a = model(nxt, past_key_values=cache, position_ids=pos, use_cache=True).logits[:, -1]
            b = model(nxt, past_key_values=dyn, position_ids=pos, use_cache=True).logits[:, -1]
            worst = max(worst, rel(a, b))
    st = cache.stats()
    check(st["on_device"] == 1 and st["device_attends"] >= 8 * cfg.num_hidden_layers,
          f"MosaicCache on the GPU ({st['device_attends']} device attends)")
    check(worst < 2e-2, f"decode logits, MosaicCache (r = d) vs DynamicCache: worst rel err {worst:.2e}")
    cache.close()


sequence_part()
sequence_part(defaults=True)
model_part()
print(f"{failures} failures")
sys.exit(1 if failures else 0)
