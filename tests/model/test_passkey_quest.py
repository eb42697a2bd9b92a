"""At least as good as Quest: at mosaickv's default compression (10% of the
tokens; per vector the bytes of 25% of the channels in bf16, spent as the
library's default r = 5d/8 values of 6 bits), passkey retrieval over a 4K context is solved
at least as often as with Quest at the same token budget, on SmolLM2, over
a fixed set of examples (10 by default; the needle phrased as RULER's
niah_single, see common.py).

The full cache (transformers' DynamicCache) runs too, as a check on the
task set: if it solves fewer than 8 in 10, the comparison says nothing and
the test fails for that reason.  The last line is a RESULT line with the
counts.  Exit 0 when mosaickv >= Quest, 1 otherwise."""
import argparse
import sys
import time

import common

TOKEN_FRAC = 0.1    # of the history, for both; sink block and window on top


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--examples", type=int, default=10)
    ap.add_argument("--first", type=int, default=0,
                    help="skip this many prompts (held-out sets: --first 10)")
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--needle", choices=["magic", "landmark"], default="magic",
                    help="the needle's phrasing (tests/model/common.py)")
    a = ap.parse_args()
    model, tok, d = common.load()  # skips when the model is missing
    import torch
    import mosaickv.hf as mhf
    from transformers import DynamicCache

    import mosaickv.seq as mseq

    cfg = model.config
    r = mseq.default_r(d)  # what the library's r = 0 resolves to
    caches = {
        "full": lambda: DynamicCache(config=cfg),
        # the library's defaults: nothing but the token budget is set
        "mosaickv": lambda: mhf.MosaicCache(cfg, token_frac=TOKEN_FRAC),
        "quest": lambda: mhf.QuestCache(cfg, token_frac=TOKEN_FRAC),
    }
    solved = dict.fromkeys(caches, 0)
    for i in range(a.first, a.first + a.examples):
        ids, key = common.passkey(tok, a.tokens, seed=1000 + i, needle=a.needle)
        line = []
        for name, make in caches.items():
            t = time.time()
            cache = make()
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=10, do_sample=False,
                                     past_key_values=cache)
            text = tok.decode(out[0, ids.shape[1]:])
            ok = key in text
            solved[name] += ok
            line.append(f"{name} {'ok' if ok else 'miss'} {text.strip()!r} ({time.time() - t:.0f} s)")
            if hasattr(cache, "close"):
                cache.close()
        print(f"example {i}: {ids.shape[1]} tokens, key {key}: " + "; ".join(line), flush=True)

    n = a.examples
    print(" ".join(f"{k} {v}/{n}" for k, v in solved.items()))
    print(f"RESULT name=passkey_vs_quest needle={a.needle} tokens={a.tokens} first={a.first} examples={n} r={r} value_bits=6 "
          f"token_frac={TOKEN_FRAC} " + " ".join(f"{k}={v}" for k, v in solved.items()))
    if solved["full"] < 0.8 * n:
        print(f"FAIL: the full cache solves only {solved['full']}/{n}: the task set is broken")
        return 1
    if solved["mosaickv"] < solved["quest"]:
        print(f"FAIL: mosaickv solves {solved['mosaickv']}/{n}, Quest {solved['quest']}/{n}")
        return 1
    print(f"ok: mosaickv {solved['mosaickv']}/{n} >= Quest {solved['quest']}/{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
