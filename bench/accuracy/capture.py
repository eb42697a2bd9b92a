"""Capture real post-RoPE Q/K/V from SmolLM2 on long prompts.

A registered attention function records the query of the last position and
the full K and V of every layer, then computes attention as usual (SDPA),
so the model's output is unchanged.  Saves one .npz per prompt.
"""
import argparse
import pathlib

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--out", default="captures")
    args = ap.parse_args()

    import torch
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    import model as M
    import tasks

    rec = {}

    def capture(module, query, key, value, attention_mask, **kw):
        # query (b, hq, n, d), key/value (b, hkv, n, d), keys after RoPE
        i = module.layer_idx
        q = query[0].float()
        grp = q.shape[0] // key.shape[1]
        # Second moment of the queries per KV head over the prefill
        # positions (the last one excluded: it is the one evaluated).
        qg = q[:, :-1].reshape(key.shape[1], grp * (q.shape[1] - 1), q.shape[2])
        qcov = torch.einsum("hnd,hne->hde", qg, qg) / qg.shape[1]
        rec[i] = (q[:, -1].numpy().copy(), key[0].float().numpy().copy(),
                  value[0].float().numpy().copy(), qcov.numpy().copy())
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)

    AttentionInterface.register("mkv_capture", capture)
    model, tok = M.load(attn_implementation="mkv_capture")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for p in range(args.prompts):
        prompt, answer = tasks.passkey(tok, args.tokens, seed=1000 + p)
        ids = tok(prompt, return_tensors="pt").input_ids
        rec.clear()
        with torch.no_grad():
            model(ids)
        L = len(rec)
        np.savez(out / f"qkv_{p}.npz",
                 q=np.stack([rec[i][0] for i in range(L)]),
                 k=np.stack([rec[i][1] for i in range(L)]),
                 v=np.stack([rec[i][2] for i in range(L)]),
                 qcov=np.stack([rec[i][3] for i in range(L)]))
        print(f"prompt {p}: {ids.shape[1]} tokens, {L} layers -> {out}/qkv_{p}.npz")


if __name__ == "__main__":
    main()
