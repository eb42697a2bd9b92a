"""Offload and prefetch through MosaicCache on SmolLM2, on the CPU.

transformers' offloaded caches move a layer off the device after its update
and bring the next one back before its own; MosaicCache maps both onto the
store's tiers (mkv_seq_offload / mkv_seq_prefetch).  This decodes a 2K-token
passkey prompt greedily twice at the library's default compression: once
plainly, once offloading every layer after each step and prefetching each
layer's last selection before the next.  The tokens must be the same (the
offloaded blocks are the same bytes, read from pinned host memory), and the
second run must have moved segments, fetched blocks from below the top
tier, and prefetched."""
import sys

import common


def decode(model, ids, cache, steps, offload):
    import torch
    toks = []
    with torch.no_grad():
        out = model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        for _ in range(steps):
            nxt = out.logits[0, -1].argmax().view(1, 1)
            toks.append(int(nxt))
            if offload:
                for layer in cache.layers:
                    layer.offload()
                cache.seq.sync()  # the moves are done: attention reads host memory
                for layer in cache.layers:
                    layer.prefetch()
            out = model(nxt, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return toks


def main():
    model, tok, _ = common.load()  # skips when the model is missing
    import mosaickv.hf as mhf

    ids, key = common.passkey(tok, 2000, seed=4242)
    steps = 8
    plain = mhf.MosaicCache(model.config, prefill_segment=512)
    a = decode(model, ids, plain, steps, offload=False)
    plain.close()
    off = mhf.MosaicCache(model.config, prefill_segment=512)
    b = decode(model, ids, off, steps, offload=True)
    off.seq.sync()
    st = off.stats()
    off.close()
    print(f"{ids.shape[1]} prompt tokens, key {key}: plain {tok.decode(a)!r}, "
          f"offloaded {tok.decode(b)!r}")
    print(f"offload_moves {st['offload_moves']} offload_failed {st['offload_failed']} "
          f"prefetch_blocks {st['prefetch_blocks']} prefetch_failed {st['prefetch_failed']} "
          f"fetch_bytes_total {st['fetch_bytes_total']}")
    import torch
    refused = True
    if not torch.cuda.is_available():
        # transformers' offloading runs on CUDA streams: refused clearly here
        try:
            mhf.MosaicCache(model.config, offloading=True)
            refused = False
        except ValueError:
            pass
    failed = 0
    for ok, what in [
            (refused, "offloading=True without CUDA is refused with ValueError"),
            (a == b, "the same tokens with and without offload"),
            (st["offload_moves"] > 0 and st["offload_failed"] == 0, "segments moved down"),
            (st["fetch_bytes_total"] > 0, "selected blocks fetched from the host tier"),
            (st["prefetch_blocks"] > 0 and st["prefetch_failed"] == 0, "selections prefetched")]:
        if not ok:
            print(f"FAIL: {what}")
            failed += 1
    print(f"RESULT name=model_offload steps={steps} same_tokens={int(a == b)} "
          f"offload_moves={st['offload_moves']} prefetch_blocks={st['prefetch_blocks']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
