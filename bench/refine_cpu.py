"""CPU decode attention of one sequence, one-stage against two-stage block
selection (mkv_seq_opts.refine = 2), side by side: SmolLM2's layer shape
(3 KV heads x 3 query heads, d = 64) at 4,000 tokens, the library's other
defaults; best of two passes of 200 steps each; two stages also with
attend_threads = 3 (the KV heads on 3 threads).  Usage (from the root):
  MOSAICKV_LIB=build/libmosaickv.so PYTHONPATH=python python3 bench/refine_cpu.py
"""
import time, sys
import numpy as np
from mosaickv.seq import Sequence, Store
rng = np.random.default_rng(1)
H, G, d, n = 3, 3, 64, 4000
k = rng.standard_normal((H, n, d)).astype(np.float32)
v = rng.standard_normal((H, n, d)).astype(np.float32)
res = {}
# (refine, attend_threads): one stage, two stages, two stages on H threads
for refine, nt in ((0.0, 1), (2.0, 1), (2.0, H), (0.0, 1), (2.0, 1), (2.0, H)):
    st = Store(gpu=-1, hbm_bytes=64 << 20, host_bytes=256 << 20)
    seq = Sequence(st, 1, layers=1, kv_heads=H, q_per_kv=G, d=d, refine=refine,
                   attend_threads=nt)
    seq.prefill(0, k, v)
    seq.sync()
    q = rng.standard_normal((H * G, d)).astype(np.float32)
    seq.attend(0, q)
    t = time.perf_counter()
    reps = 200
    for _ in range(reps):
        seq.attend(0, q)
    dt = (time.perf_counter() - t) / reps
    res.setdefault((refine, nt), []).append(dt)
    seq.close(); st.close()
one, two, two_t = min(res[(0.0, 1)]), min(res[(2.0, 1)]), min(res[(2.0, H)])
print(f"attend, 4K tokens, 3 KV heads x 3 q heads, d=64: one stage {one*1e6:.0f} us, "
      f"two stages {two*1e6:.0f} us ({two/one:.2f}x), two stages on {H} threads "
      f"{two_t*1e6:.0f} us ({two_t/one:.2f}x)")
print(f"RESULT name=refine_cpu one_stage_us={one*1e6:.0f} two_stage_us={two*1e6:.0f} "
      f"ratio={two/one:.2f} two_stage_threads_us={two_t*1e6:.0f} threads={H}")
