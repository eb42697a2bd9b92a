"""UUID needle at 4K (the RULER study's 8 prompts): MosaicCache variants through
model.generate, each given as name=keyword arguments, e.g.
    python bench/accuracy/uuid_variants.py "s32=summary_channels=32" "b8=b=8"
Prints one line per prompt and a RESULT line."""
import sys, time, zlib
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
import torch
import caches, tasks
import model as M
import mosaickv.hf as mhf

cfgs = {a.split("=")[0]: eval("dict(" + a.split("=", 1)[1] + ")") for a in sys.argv[1:]}
model, tok = M.load(attn_implementation=caches.ATTN)
task, L = "niah_single_uuid", 4000
res = {k: 0 for k in cfgs}
for i in range(8):
    seed = zlib.crc32(task.encode()) % 100_000 * 100_000 + L + i
    e = tasks.SUITE[task](tok, L, seed)
    ids = tok(e["prompt"], return_tensors="pt").input_ids
    line = []
    for name, kw in cfgs.items():
        t = time.time()
        c = mhf.MosaicCache(model.config, token_frac=0.1, **kw)
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=e["max_new"], do_sample=False, past_key_values=c)
        text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        sc = tasks.score(text, e["answers"])
        res[name] += sc
        c.close()
        line.append(f"{name}={sc:.0f} ({time.time()-t:.0f}s) {text.strip()[:40]!r}")
    print(f"ex{i}: " + "; ".join(line), flush=True)
print("RESULT " + " ".join(f"{k}={v:.0f}/8" for k, v in res.items()))
