"""Exact with compression off: with r = d, every token kept (token_frac 1)
and f32 storage, greedy generation through MosaicCache gives the same
tokens as transformers' DynamicCache on SmolLM2, for 3 prompts of 1K-4K
tokens.  The prompts go into the store as 1,024-token segments, each
decode token through the update buffer, and decode attention is
PackedAttention across those segments."""
import argparse
import sys

import common


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lengths", default="1000,2000,4000",
                    help="prompt lengths in tokens, comma-separated")
    ap.add_argument("--new-tokens", type=int, default=16)
    a = ap.parse_args()
    model, tok, d = common.load()  # skips when the model is missing
    import torch
    import mosaickv.hf as mhf
    from transformers import DynamicCache

    lengths = [int(x) for x in a.lengths.split(",")]
    bad = 0
    for i, n in enumerate(lengths):
        ids, key = common.passkey(tok, n, seed=100 + i)
        gen = dict(max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, do_sample=False)
        cache = mhf.MosaicCache(model.config, r=d, token_frac=1.0, drop=False,
                                store_dtype="f32", value_bits=0,
                                prefill_segment=1024)
        with torch.no_grad():
            ref = model.generate(ids, past_key_values=DynamicCache(config=model.config), **gen)
            out = model.generate(ids, past_key_values=cache, **gen)
        same = torch.equal(ref, out)
        bad += not same
        print(f"prompt {i}: {ids.shape[1]} tokens, {a.new_tokens} generated, "
              f"{'same' if same else 'DIFFERENT'} tokens; swaps {cache.stats().get('swaps')}; "
              f"key {key}: dense {tok.decode(ref[0, ids.shape[1]:])!r}"
              + ("" if same else f", mosaickv {tok.decode(out[0, ids.shape[1]:])!r}"),
              flush=True)
        cache.close()
    print(f"{len(lengths) - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
