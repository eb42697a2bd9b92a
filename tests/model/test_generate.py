"""Smoke test: model.generate(..., past_key_values=MosaicCache(...)) on
SmolLM2 loaded with attn_implementation="mosaickv", on the CPU, with the
cache's default options.  Checks that it generates the tokens asked for,
that the cache holds the whole sequence, and that decode attention ran in
mosaickv (PackedAttention read packed bytes), not a dense fallback."""
import sys

import common


def main():
    model, tok, _ = common.load()  # skips when the model is missing
    import torch
    import mosaickv.hf as mhf

    chat = [{"role": "user", "content": "Name three colours of the rainbow."}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)["input_ids"]
    new = 8
    cache = mhf.MosaicCache(model.config)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             past_key_values=cache)
    st = cache.stats()
    text = tok.decode(out[0, ids.shape[1]:])
    print(f"{ids.shape[1]} prompt tokens -> {text!r}; cache {cache.get_seq_length()} tokens; "
          f"stats {st}")
    failed = 0
    for ok, what in [
            (out.shape == (1, ids.shape[1] + new), f"output shape {tuple(out.shape)}"),
            (torch.equal(out[0, :ids.shape[1]], ids[0]), "output starts with the prompt"),
            # The last generated token is not fed back, so not cached.
            (cache.get_seq_length() == ids.shape[1] + new - 1,
             f"cache length {cache.get_seq_length()}"),
            (st.get("attend_bytes_last", 0) > 0, "decode attention read packed bytes"),
            (st.get("finalize_failed", 1) == 0, "no failed finalization")]:
        if not ok:
            print(f"FAIL: {what}")
            failed += 1
    cache.close()
    print("ok" if not failed else f"{failed} checks failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
