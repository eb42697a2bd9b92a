#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""torch SDPA baselines for bench/attn, on the same GPU in the same run.

Decode: one layer of the Llama-3.1-8B shape (32 query heads, 8 KV heads,
d = 128, bf16), batch B, L history tokens + 128 window tokens, timed with
CUDA events, L2 flushed before every repetition, median of 20.  Two ways of
handing GQA to SDPA are timed and both printed:
  gqa      q (B, 32, 1, d) with enable_gqa=True;
  grouped  q as (B, 8, 4, d): the 4 heads of a group as 4 query rows of one
           KV head (the decode trick flash-decoding uses), no mask.
Prefill: causal SDPA over 64K tokens, one layer, batch 1 (median of 5).

Prints lines 'sdpa B L gqa_us grouped_us' and 'prefill L us' (nan where a
variant could not run), read by bench/attn --sdpa FILE.
"""
import math
import sys

import torch
import torch.nn.functional as F


def timed(fn, reps, flush):
    times = []
    for i in range(reps + 2):
        flush.zero_()
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        if i >= 2:
            times.append(a.elapsed_time(b) * 1000.0)
    times.sort()
    return times[len(times) // 2]


def main():
    ctxs = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else
                             "32768,131072,262144,524288,1048576").split(",")]
    batches = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,8").split(",")]
    win, d, hq, hkv = 128, 128, 32, 8
    dev = torch.device("cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    torch.manual_seed(0)
    print(f"# torch {torch.__version__} on {torch.cuda.get_device_name(0)}", flush=True)
    for B in batches:
        for L in ctxs:
            n = L + win
            try:
                k = torch.randn(B, hkv, n, d, device=dev, dtype=torch.bfloat16)
                v = torch.randn(B, hkv, n, d, device=dev, dtype=torch.bfloat16)
                q = torch.randn(B, hq, 1, d, device=dev, dtype=torch.bfloat16)
            except torch.OutOfMemoryError:
                print(f"sdpa {B} {L} nan nan", flush=True)
                continue
            res = []
            try:
                f1 = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                f1()
                res.append(timed(f1, 20, flush))
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"# gqa B={B} L={L}: {e}", flush=True)
                res.append(float("nan"))
            try:
                qg = q.view(B, hkv, hq // hkv, d)
                f2 = lambda: F.scaled_dot_product_attention(qg, k, v)
                f2()
                res.append(timed(f2, 20, flush))
            except Exception as e:  # noqa: BLE001
                print(f"# grouped B={B} L={L}: {e}", flush=True)
                res.append(float("nan"))
            print(f"sdpa {B} {L} {res[0]:.2f} {res[1]:.2f}", flush=True)
            del k, v, q
            torch.cuda.empty_cache()
    # causal prefill of one layer at 64K
    L = 65536
    try:
        q = torch.randn(1, hq, L, d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(1, hkv, L, d, device=dev, dtype=torch.bfloat16)
        v = torch.randn(1, hkv, L, d, device=dev, dtype=torch.bfloat16)
        f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        f()
        t = timed(f, 5, flush)
    except Exception as e:  # noqa: BLE001
        print(f"# prefill: {e}", flush=True)
        t = float("nan")
    print(f"prefill {L} {t:.2f}", flush=True)
    if not math.isnan(t):
        flops = 4 * hq * d * L * L / 2
        print(f"# prefill {flops / t / 1e6:.0f} TFLOP/s (causal)", flush=True)


if __name__ == "__main__":
    main()
