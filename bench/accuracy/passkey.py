"""Passkey retrieval on SmolLM2 through three caches at the same token
budget: the full cache (transformers' DynamicCache), mosaickv
(MosaicCache) and Quest (QuestCache).  Prints the solved count per method
and a RESULT line."""
import argparse
import sys

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--examples", type=int, default=10)
    ap.add_argument("--channels", type=float, default=0.25,
                    help="mosaickv's budget: the bytes of this share of the channels "
                         "in bf16 per vector (caches.budget_r)")
    ap.add_argument("--value-bits", type=int, default=6,
                    help="mosaickv's value rows: 4..8 bits, or 0 for bf16 with "
                         "r = channels * d")
    ap.add_argument("--tokens-frac", type=float, default=0.1)
    ap.add_argument("--drop", action="store_true")
    ap.add_argument("--methods", default="full,mosaickv,quest",
                    help="comma-separated subset of full,mosaickv,quest")
    a = ap.parse_args()
    import mosaickv.hf as mhf
    from transformers import DynamicCache

    import caches
    import model as M
    import tasks

    model, tok = M.load(attn_implementation="mosaickv")
    cfg = model.config
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    r = (caches.budget_r(d, a.channels, a.value_bits) if a.value_bits
         else max(1, int(round(d * a.channels))))
    methods = a.methods.split(",")
    solved = {m: 0 for m in methods}
    for i in range(a.examples):
        prompt, answer = tasks.passkey(tok, a.tokens, seed=2000 + i)
        ids = tok(prompt, return_tensors="pt").input_ids
        make = {
            "full": lambda: DynamicCache(config=cfg),
            "mosaickv": lambda: mhf.MosaicCache(cfg, r=r, drop=a.drop, token_frac=a.tokens_frac,
                                                value_bits=a.value_bits),
            "quest": lambda: mhf.QuestCache(cfg, token_frac=a.tokens_frac),
        }
        line = []
        for name in methods:
            cache = make[name]()
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=12, do_sample=False,
                                     past_key_values=cache)
            text = tok.decode(out[0, ids.shape[1]:])
            ok = answer in text
            solved[name] += ok
            line.append(f"{name}={'ok' if ok else 'miss'}")
            if hasattr(cache, "close"):
                cache.close()
        print(f"example {i}: {ids.shape[1]} tokens, answer {answer}: " + " ".join(line), flush=True)
    n = a.examples
    print(" ".join(f"{k} {v}/{n}" for k, v in solved.items()))
    print(f"RESULT name=passkey tokens={a.tokens} examples={n} r={r} "
          f"value_bits={a.value_bits} token_frac={a.tokens_frac} "
          + " ".join(f"{k}={v}" for k, v in solved.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
