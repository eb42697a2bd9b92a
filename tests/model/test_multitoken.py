"""Several new tokens in one forward after the prefill (a later prompt chunk,
speculative decoding) through MosaicCache, on a small random Llama model
built by transformers (no download): with compression off (r = d, every
block, float32 storage) the logits of every new position must equal
DynamicCache's, and the cache must hold every token.  CPU."""
import sys

try:
    import torch
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
except ImportError as e:
    print(f"{e.name} not installed: skipping")
    sys.exit(77)

import mosaickv.hf as mhf


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def main():
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=300, hidden_size=256, intermediate_size=512,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=2048, attn_implementation="mosaickv")
    model = LlamaForCausalLM(cfg).eval()
    d = cfg.hidden_size // cfg.num_attention_heads
    ids = torch.randint(0, 300, (1, 700))
    chunks = [ids[:, :600], ids[:, 600:605], ids[:, 605:606], ids[:, 606:700]]
    cache = mhf.MosaicCache(cfg, r=d, token_frac=1.0, window=64, store_dtype="f32",
                             value_bits=0)
    dyn = DynamicCache(config=cfg)
    worst, pos = 0.0, 0
    with torch.no_grad():
        for c in chunks:
            p = torch.arange(pos, pos + c.shape[1])[None]
            a = model(c, past_key_values=cache, position_ids=p, use_cache=True).logits
            b = model(c, past_key_values=dyn, position_ids=p, use_cache=True).logits
            e = rel(a, b)
            print(f"chunk of {c.shape[1]} tokens at {pos}: logits rel err {e:.2e}")
            worst = max(worst, e)
            pos += c.shape[1]
    n = cache.get_seq_length()
    st = cache.stats()
    failed = 0
    for ok, what in [(worst < 1e-4, f"every position matches DynamicCache (worst {worst:.2e})"),
                     (n == 700, f"the cache holds {n} tokens"),
                     (st["tokens"] == 700, f"the sequence holds {st['tokens']} tokens")]:
        print(("ok  " if ok else "FAIL") + " " + what)
        failed += not ok
    cache.close()
    print(f"{3 - failed} passed, {failed} failed")
    return 1 if failed else 0


sys.exit(main())
