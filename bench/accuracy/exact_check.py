"""With compression off (r = d, every token kept, f32 storage), greedy
generation through MosaicCache must give the same tokens as transformers'
DynamicCache on SmolLM2, for prompts of 1K-4K tokens.  Prints one line per
prompt and exits 1 on any difference."""
import argparse
import sys

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lengths", default="1024,2048,4000")
    ap.add_argument("--new-tokens", type=int, default=16)
    a = ap.parse_args()
    import mosaickv.hf as mhf
    from transformers import DynamicCache

    import model as M
    import tasks

    model, tok = M.load(attn_implementation="mosaickv")
    d = model.config.head_dim if getattr(model.config, "head_dim", None) else \
        model.config.hidden_size // model.config.num_attention_heads
    bad = 0
    lengths = [int(x) for x in a.lengths.split(",")]
    for i, n in enumerate(lengths):
        prompt, answer = tasks.passkey(tok, n, seed=500 + i)
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            ref = model.generate(ids, max_new_tokens=a.new_tokens, do_sample=False,
                                 past_key_values=DynamicCache(config=model.config))
            cache = mhf.MosaicCache(model.config, r=d, token_frac=1.0, store_dtype="f32", value_bits=0,
                                    drop=False, prefill_segment=1024)
            out = model.generate(ids, max_new_tokens=a.new_tokens, do_sample=False,
                                 past_key_values=cache)
        same = torch.equal(ref, out)
        bad += not same
        print(f"prompt {i}: {ids.shape[1]} tokens, {a.new_tokens} generated: "
              f"{'same' if same else 'DIFFERENT'} tokens; swaps {cache.stats().get('swaps')}; "
              f"answer {answer!r} -> {tok.decode(out[0, ids.shape[1]:])!r}")
        cache.close()
    print(f"{len(lengths) - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
