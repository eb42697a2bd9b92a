"""RULER-style accuracy study of mosaickv on SmolLM2-135M (issue 6).

Modes, each writing JSON under --results (bench/accuracy/results/) and
printing markdown:

  (default)     the study, at 4K tokens: for every task variant of STUDY, 5
                examples; per example one prefill (full attention), then the
                full cache, mosaickv, Quest and the global mask at the default
                budget (25% channels, 10% tokens), decoded greedily and
                batched; on the last 2 examples also the sweep (channel
                retention 12.5-50% at 10% tokens, token retention 5-20% at
                25% channels; --grid for every pair).  The study calibrates
                as it goes: a variant on which the full cache can no longer
                reach 80% is stopped (and its harder variants skipped), and
                only variants with full >= 80% enter the averages.
  --calibrate   the full cache alone on the variants at other lengths
                (--lengths, default 2K,4K,8K): which variants a 135M model can
                do at which length.
  --verify N    on N prompts: the captured-prefill path (one at a time and
                batched) gives the same tokens as model.generate() through
                each method's cache.
  --report      re-print the tables (and redraw the plot) from the JSON.

--quick runs a tiny version (2K tokens, 2 examples, two variants).
Environment: PYTHONPATH=python, the library from build/ (or MOSAICKV_LIB).
"""
import argparse
import json
import pathlib
import sys
import time
import zlib

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import budget  # noqa: E402 (torch-free: the report needs neither torch nor the library)

CHANNELS = [0.125, 0.25, 0.375, 0.5]
TOKENS = [0.05, 0.1, 0.2]
DEFAULT = (0.25, 0.1)
METHODS = ["full", "mosaickv", "quest", "globalmask"]
THRESHOLD = 0.8
# The variants the study runs by default, easy to hard within a family; a
# variant is skipped when its easier one (EASIER) is not calibrated.
STUDY = ["niah_single_number", "niah_single_word", "niah_single_uuid",
         "niah_multikey2_number", "niah_multikey4_number", "niah_multikey4_uuid",
         "niah_multivalue2_number", "niah_multivalue4_number",
         "niah_multiquery2_number", "niah_multiquery4_number",
         "vt_hops1", "vt_hops2", "vt_hops4", "cwe_common3", "cwe_common10"]
EASIER = {"niah_multikey4_number": "niah_multikey2_number",
          "niah_multikey4_uuid": "niah_single_uuid",
          "niah_multivalue4_number": "niah_multivalue2_number",
          "niah_multiquery4_number": "niah_multiquery2_number",
          "vt_hops2": "vt_hops1", "vt_hops4": "vt_hops2",
          "cwe_common10": "cwe_common3"}


def now():
    return time.strftime("%Y-%m-%d %H:%M:%S")


def load_model():
    import torch

    import caches
    import model as M
    t = time.time()
    model, tok = M.load(attn_implementation=caches.ATTN)
    print(f"# model loaded in {time.time() - t:.1f} s; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads", flush=True)
    return model, tok


def save(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    tmp.replace(path)


# ---------------------------------------------------------------------------
# Running one example


class Runner:
    def __init__(self, model, tok):
        import caches
        import mosaickv.seq as mseq
        self.C = caches
        self.model, self.tok = model, tok
        self.cfg = model.config
        self.d = caches.head_dim(self.cfg)
        self.eos = caches.eos_ids(model)
        self.store = mseq.Store(gpu=-1)

    def example(self, task, length, i):
        import tasks
        seed = zlib.crc32(task.encode()) % 100_000 * 100_000 + length + i
        e = tasks.SUITE[task](self.tok, length, seed)
        ids = self.tok(e["prompt"], return_tensors="pt").input_ids
        t = time.time()
        first, kv = self.C.prefill(self.model, ids)
        return e, ids.shape[1], first, kv, time.time() - t

    def run(self, e, first, kv, points):
        """Decode example @e from its prefill through the cache of every
        (method, channels, tokens) in @points, batched.  One result each."""
        import tasks
        t = time.time()
        rs = [self.C.method_r(m, self.d, c) for m, c, _ in points]
        cs = [self.C.load_prefill(self.C.make_cache(m, self.cfg, r=r, token_frac=f,
                                                    store=self.store), kv)
              for (m, c, f), r in zip(points, rs)]
        tb = time.time() - t
        ans = e["answers"]
        toks = self.C.decode_many(self.model, cs, first, e["max_new"], eos=self.eos,
                                  stops=lambda tt: tasks.score(self.tok.decode(tt), ans) == 1.0)
        for c in cs:
            self.C.close(c)
        out = []
        for (m, c, f), r, tt in zip(points, rs, toks):
            text = self.tok.decode(tt, skip_special_tokens=True)
            out.append({"method": m, "channels": c, "tokens": f, "r": r,
                        "score": tasks.score(text, ans), "text": text, "n_new": len(tt)})
        return out, tb, time.time() - t - tb


# ---------------------------------------------------------------------------
# Calibration


def calibrate(a):
    import tasks
    model, tok = load_model()
    R = Runner(model, tok)
    names = a.tasks.split(",") if a.tasks else STUDY
    lengths = [int(x) for x in a.lengths.split(",")] if a.lengths else [2000, 4000, 8000]
    n = a.examples or 5
    out = {"date": now(), "examples": n, "lengths": lengths, "rows": []}
    dst = a.results / f"calibration_{'_'.join(str(L) for L in lengths)}{a.tag}.json"
    t0 = time.time()
    for name in names:
        for L in lengths:
            if any(r["task"] in (name, EASIER.get(name)) and r["length"] <= L
                   and r["full_pct"] < 100 * THRESHOLD for r in out["rows"]):
                break  # it or its easier variant failed at this or a shorter length
            scores, texts, ptime, toks = [], [], 0.0, 0
            for i in range(n):
                e, ntok, first, kv, pt = R.example(name, L, i)
                res = R.run(e, first, kv, [("full", 1.0, 1.0)])[0][0]
                del kv
                scores.append(res["score"])
                texts.append(res["text"])
                ptime += pt
                toks = ntok
                print(f"{name} {L} ex{i} {ntok} tok: {res['score']:.2f} {res['text']!r} "
                      f"(prefill {pt:.1f} s)", flush=True)
                # Stop once the 80% threshold is out of reach.
                if sum(1 - s for s in scores) > (1 - THRESHOLD) * n + 1e-9:
                    break
            row = {"task": name, "length": L, "prompt_tokens": toks, "examples": len(scores),
                   "full_pct": 100 * sum(scores) / len(scores), "scores": scores, "texts": texts,
                   "prefill_s": round(ptime, 1)}
            out["rows"].append(row)
            print(f"== {name} {L}: full {row['full_pct']:.0f}% over {len(scores)}", flush=True)
            save(dst, out)
    out["seconds"] = round(time.time() - t0)
    save(dst, out)
    print(report_calibration(out))


def calibration_rows(results_dir):
    """Full-cache scores per (variant, length): the calibration runs' and
    the study's own (its full-cache runs are the calibration at its length)."""
    rows = {}
    for p in sorted(results_dir.glob("calibration_*.json")):
        for r in json.loads(p.read_text())["rows"]:
            rows[(r["task"], r["length"])] = r
    st = load_studies(results_dir)
    if st:
        for t in st["tasks"]:
            for L in st["lengths"]:
                xs = [r["score"] for r in st["rows"]
                      if r["task"] == t and r["length"] == L and r["method"] == "full"]
                if xs:
                    rows[(t, L)] = {"task": t, "length": L, "examples": len(xs),
                                    "full_pct": 100 * sum(xs) / len(xs)}
        for t, L, why in st.get("skipped", []):
            rows.setdefault((t, L), {"task": t, "length": L, "skipped": why})
    return list(rows.values())


def report_calibration(cal):
    lengths = sorted({r["length"] for r in cal["rows"]})
    names = [t for t in STUDY if any(r["task"] == t for r in cal["rows"])]
    names += [t for t in dict.fromkeys(r["task"] for r in cal["rows"]) if t not in names]
    by = {(r["task"], r["length"]): r for r in cal["rows"]}
    lines = ["| task variant | " + " | ".join(f"{L // 1000}K" for L in lengths) + " |",
             "| --- |" + " --- |" * len(lengths)]
    for nm in names:
        cells = []
        for L in lengths:
            r = by.get((nm, L))
            if r is None:
                cells.append("-")
            elif "skipped" in r:
                cells.append("skipped")
            else:
                pct = f"{r['full_pct']:.0f}%"
                if r["full_pct"] >= 100 * THRESHOLD:
                    pct = f"**{pct}**"
                cells.append(f"{pct} ({r['examples']})")
        lines.append(f"| {nm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# The study


def sweep_points(grid=False):
    """The base points plus the sweep: channel retention at the default
    token retention (mosaickv and the global mask) and token retention at
    the default channel retention (mosaickv and Quest); with @grid every
    (channels, tokens) pair for mosaickv and the global mask."""
    pts = [("full", 1.0, 1.0), ("mosaickv_seg",) + DEFAULT]
    for f in TOKENS:
        pts.append(("quest", 1.0, f))
        for c in CHANNELS:
            if grid or f == DEFAULT[1] or c == DEFAULT[0]:
                pts.append(("mosaickv", c, f))
                pts.append(("mosaickv_r2", c, f))
            if grid or f == DEFAULT[1]:
                pts.append(("globalmask", c, f))
    return pts


def study(a):
    import tasks
    lengths = [int(x) for x in a.lengths.split(",")] if a.lengths else [4000, 2000]
    names = a.tasks.split(",") if a.tasks else STUDY
    n = a.examples or 5
    ns = a.sweep_examples
    model, tok = load_model()
    R = Runner(model, tok)
    out = {"date": now(), "lengths": lengths, "tasks": names, "examples": n,
           "sweep_examples": ns, "rows": [], "prefill": []}
    t0 = time.time()
    base = [("full", 1.0, 1.0), ("mosaickv",) + DEFAULT, ("quest", 1.0, DEFAULT[1]),
            ("globalmask",) + DEFAULT, ("mosaickv_seg",) + DEFAULT,
            ("mosaickv_r2",) + DEFAULT, ("mosaickv_s8",) + DEFAULT]
    if a.methods:
        # Only these (without "full" no variant is stopped as uncalibrated:
        # for adding a method to a study whose calibration is known).
        base = [k for k in base if k[0] in a.methods.split(",")]
    dst = a.results / f"study_{'_'.join(str(L) for L in lengths)}{a.tag}.json"
    ok = set()  # calibrated at an earlier length: not run at the later ones
    for L in lengths:
        failed = set()
        for name in names:
            if name in ok:
                continue
            if EASIER.get(name) in failed:
                print(f"{name} {L}: not run, {EASIER[name]} is not calibrated", flush=True)
                out.setdefault("skipped", []).append([name, L, EASIER[name]])
                failed.add(name)
                continue
            lost = 0.0
            for i in range(a.first, a.first + n):
                if lost > (1 - THRESHOLD) * n + 1e-9 and a.first == 0:
                    # The full cache cannot reach 80% on this variant any
                    # more: not calibrated, stop here.
                    break
                e, ntok, first, kv, pt = R.example(name, L, i)
                out["prefill"].append({"task": name, "length": L, "example": i,
                                       "prompt_tokens": ntok, "seconds": round(pt, 1)})
                # The sweep runs on the last examples, when the variant is
                # likely calibrated already.
                pts = sweep_points(a.grid) if i >= a.first + n - ns else base
                if a.methods:
                    pts = [k for k in pts if k[0] in a.methods.split(",")]
                res, tb, td = R.run(e, first, kv, pts)
                del kv
                out["prefill"][-1].update(build_s=round(tb, 1), decode_s=round(td, 1),
                                          runs=len(pts))
                line = []
                for (m, c, f), x in zip(pts, res):
                    x.update(task=name, length=L, example=i, prompt_tokens=ntok)
                    out["rows"].append(x)
                    if (m, c, f) in base:
                        line.append(f"{m}={x['score']:.2f}")
                    if m == "full":
                        lost += 1 - x["score"]
                print(f"{name} {L} ex{i} {ntok} tok: prefill {pt:.0f} s, {len(pts)} caches "
                      f"built {tb:.0f} s, decoded {td:.0f} s: " + " ".join(line), flush=True)
                out["seconds"] = round(time.time() - t0)
                save(dst, out)
            if lost > (1 - THRESHOLD) * n + 1e-9:
                failed.add(name)
            else:
                ok.add(name)
    out["seconds"] = round(time.time() - t0)
    save(dst, out)
    print(report_study(load_studies(a.results), a.plot))


def load_studies(results_dir):
    """All study_*.json under @results_dir merged into one (the lengths of
    separate runs side by side)."""
    st = None
    for p in sorted(results_dir.glob("study_*.json"), reverse=True):
        x = json.loads(p.read_text())
        if st is None:
            st = dict(x, rows=list(x["rows"]), skipped=list(x.get("skipped", [])),
                      seconds=x.get("seconds", 0), lengths=list(x["lengths"]),
                      tasks=list(x["tasks"]))
            continue
        st["rows"] += x["rows"]
        st["skipped"] += x.get("skipped", [])
        st["seconds"] += x.get("seconds", 0)
        st["lengths"] += [L for L in x["lengths"] if L not in st["lengths"]]
        st["tasks"] += [t for t in x["tasks"] if t not in st["tasks"]]
    return st


def _mean(xs):
    xs = [x for x in xs if x == x]
    return sum(xs) / len(xs) if xs else float("nan")


def _fmt(v):
    return "-" if v != v else f"{v:.1f}"


def report_study(st, plot=None):
    # One row per (example, method, budget): a method added to a study by a
    # later run (--methods) repeats the points its sweep shares with the
    # base run; greedy decoding gives the same score both times.
    seen = {}
    for r in st["rows"]:
        seen.setdefault((r["task"], r["length"], r["example"], r["method"],
                         r["channels"], r["tokens"]), r)
    rows = list(seen.values())
    lines = []

    # The examples that ran the sweep: those with more than the base points.
    counts = {}
    for r in rows:
        k = (r["task"], r["length"], r["example"])
        counts[k] = counts.get(k, 0) + 1
    swept = {(r["task"], r["length"], r["example"]) for r in rows
             if (r["channels"], r["tokens"]) != DEFAULT and r["method"] != "full"
             and r["method"] != "quest"}

    def acc(task, L, m, c, f, sweep_only=False):
        xs = [r["score"] for r in rows if r["task"] == task and r["length"] == L
              and r["method"] == m and r["channels"] == c and r["tokens"] == f
              and (not sweep_only or (task, L, r["example"]) in swept)]
        return 100 * _mean(xs), len(xs)

    keys = [("full", 1.0, 1.0), ("mosaickv",) + DEFAULT, ("quest", 1.0, DEFAULT[1]),
            ("globalmask",) + DEFAULT, ("mosaickv_seg",) + DEFAULT,
            ("mosaickv_r2",) + DEFAULT, ("mosaickv_s8",) + DEFAULT]
    lines.append("| task | length | n | full | mosaickv, one stage | Quest | global mask "
                 "| mosaickv one stage, SegmentCache | **mosaickv, two stages (refine 2)** "
                 "| mosaickv one stage, 8-bit scores |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    cal, summary = [], {m: [] for m, _, _ in keys}
    order = sorted(st["tasks"], key=lambda t: STUDY.index(t) if t in STUDY else len(STUDY))
    for L in st["lengths"]:
        for t in order:
            vals = [acc(t, L, *k) for k in keys]
            if vals[0][1] == 0:
                continue
            ok = vals[0][0] >= 100 * THRESHOLD
            if ok:
                cal.append((t, L))
                for (m, _, _), (v, _) in zip(keys, vals):
                    summary[m].append(v)
            mark = "" if ok else " (full < 80%: not averaged)"
            lines.append(f"| {t}{mark} | {L // 1000}K | {vals[0][1]} | "
                         + " | ".join(f"{v:.0f}" for v, _ in vals) + " |")
    avg = {m: _mean(v) for m, v in summary.items()}
    lines.append(f"| **average ({len(cal)} calibrated)** | | | "
                 + " | ".join(f"**{avg[m]:.1f}**" for m, _, _ in keys) + " |")
    lines.append("| loss vs full (points) | | | | " + " | ".join(
        f"{avg['full'] - avg[m]:.1f}" for m, _, _ in keys[1:]) + " |")
    for nm, L, why in st.get("skipped", []):
        lines.append(f"| {nm} | {L // 1000}K | 0 | not run: {why} not calibrated | | | | | | |")
    # The sweep over the sweep examples of the calibrated tasks.
    ns = len([k for k in swept if (k[0], k[1]) in cal])
    if ns:
        def sw(m, c, f):
            return _mean([acc(t, L, m, c, f, True)[0] for t, L in cal])
        lines.append("")
        lines.append(f"Sweep: accuracy (%) averaged over the {len(cal)} calibrated tasks, on "
                     f"the {ns} examples of theirs that ran the sweep; full cache on the same "
                     f"examples {sw('full', 1.0, 1.0):.1f}%.")
        lines.append("")
        lines.append("| budget: bytes of this share of bf16 channels (values kept of d=64) | method | "
                     + " | ".join(f"{int(f * 100)}% tokens" for f in TOKENS) + " |")
        lines.append("| --- | --- |" + " --- |" * len(TOKENS))
        grid = {}
        for c in CHANNELS:
            r = int(round(64 * c))
            rq = budget.budget_r(64, c)  # d = 64, 6-bit rows, as in the runs
            for m in ("mosaickv_r2", "mosaickv", "globalmask"):
                grid[(m, c)] = [sw(m, c, f) for f in TOKENS]
                # caches.globalmask_r at d = 64 (not imported: the report
                # needs neither torch nor the library)
                lab = f"r={rq} 6-bit" if m.startswith("mosaickv") else f"r={min(64, r + 4)} bf16"
                name = {"mosaickv_r2": "mosaickv, two stages",
                        "mosaickv": "mosaickv, one stage"}.get(m, m)
                lines.append(f"| {c * 100:g}% ({lab}) | {name} | "
                             + " | ".join(_fmt(v) for v in grid[(m, c)]) + " |")
        grid["quest"] = [sw("quest", 1.0, f) for f in TOKENS]
        lines.append("| 100% (dense) | Quest | "
                     + " | ".join(_fmt(v) for v in grid["quest"]) + " |")
        if plot:
            draw(grid, sw("full", 1.0, 1.0), plot, len(cal), ns)
            lines.append("")
            lines.append(f"(plot: {plot})")
    lines.append("")
    # avg_loss_pct: MosaicCache's default on the CPU, two-stage selection
    # where the study ran it, else (older studies) one stage.
    main = "mosaickv_r2" if avg["mosaickv_r2"] == avg["mosaickv_r2"] else "mosaickv"
    lines.append(f"RESULT name=accuracy avg_loss_pct={avg['full'] - avg[main]:.1f} "
                 f"quest_avg_loss_pct={avg['full'] - avg['quest']:.1f} "
                 f"globalmask_avg_loss_pct={avg['full'] - avg['globalmask']:.1f} "
                 f"full_avg_pct={avg['full']:.1f} "
                 f"onestage_avg_loss_pct={avg['full'] - avg['mosaickv']:.1f} "
                 f"s8_avg_loss_pct={avg['full'] - avg['mosaickv_s8']:.1f}")
    return "\n".join(lines)


def draw(grid, full, path, ntasks, ns):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    xs = [100 * c for c in CHANNELS]
    i10 = TOKENS.index(DEFAULT[1])
    ax[0].plot(xs, [grid[("mosaickv_r2", c)][i10] for c in CHANNELS], "D-",
               label="mosaickv, two-stage selection")
    ax[0].plot(xs, [grid[("mosaickv", c)][i10] for c in CHANNELS], "o-",
               label="mosaickv, one stage")
    ax[0].plot(xs, [grid[("globalmask", c)][i10] for c in CHANNELS], "s--",
               label="global mask (equal memory)")
    ax[0].axhline(grid["quest"][i10], color="C2", ls="-.", label="Quest (dense K/V)")
    ax[0].axhline(full, color="k", ls=":", label="full cache")
    ax[0].set_xlabel("bytes per vector: % of d = 64 channels in bf16, 10% of tokens\n"
                     "(mosaickv: 6-bit values; global mask: bf16 at equal memory)", fontsize=8)
    ax[0].set_ylabel("accuracy (%)")
    ax[0].set_ylim(-3, 103)
    ax[0].set_xticks(xs)
    ax[0].legend(fontsize=8)
    tx = [100 * f for f in TOKENS]
    for j, c in enumerate(CHANNELS):
        for m, mk, nm in (("mosaickv_r2", "D-", "two stages"), ("mosaickv", "o--", "one stage")):
            ys = grid[(m, c)]
            if sum(y == y for y in ys) >= 2:  # only the channel settings swept over tokens
                ax[1].plot(tx, ys, mk, color=f"C{j + 3}",
                           label=f"mosaickv {nm}, {100 * c:g}% of the channels' bytes")
    ax[1].plot(tx, grid["quest"], "s-.", color="C2", label="Quest (dense K/V)")
    ax[1].axhline(full, color="k", ls=":", label="full cache")
    ax[1].set_xlabel("token retention (% of history), the bytes of 25% of channels")
    ax[1].set_xticks(tx)
    ax[1].legend(fontsize=8)
    fig.suptitle(f"SmolLM2-135M, RULER-style tasks ({ntasks} calibrated, {ns} examples in all)")
    fig.tight_layout()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------------------


def verify(a):
    import caches
    import tasks
    model, tok = load_model()
    n = a.verify
    L = int(a.lengths.split(",")[0]) if a.lengths else 4000
    ms = ["full", "mosaickv", "quest", "globalmask", "mosaickv_seg"]
    bad = 0
    for i in range(n):
        e = tasks.SUITE["niah_single_number"](tok, L, 777 + i)
        ids = tok(e["prompt"], return_tensors="pt").input_ids
        t = time.time()
        res = caches.verify(model, ids, ms, max_new=12, r=caches.budget_r(64, 0.25),
                            token_frac=0.1)
        for m, (same, ref, got, many) in res.items():
            bad += not same
            print(f"prompt {i} ({ids.shape[1]} tokens, answer {e['answers'][0]}) {m}: "
                  f"{'same' if same else 'DIFFERENT'} tokens: generate "
                  f"{tok.decode(ref)!r} captured {tok.decode(got)!r} batched "
                  f"{tok.decode(many)!r}", flush=True)
        print(f"# {time.time() - t:.0f} s", flush=True)
    print(f"RESULT name=accuracy_verify prompts={n} methods={len(ms)} different={bad}")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibrate", action="store_true")
    ap.add_argument("--verify", type=int, default=0, metavar="N")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tasks", help="comma-separated variants of tasks.SUITE")
    ap.add_argument("--lengths", help="comma-separated prompt lengths in tokens")
    ap.add_argument("--examples", type=int, help="per task and length (default 5)")
    ap.add_argument("--first", type=int, default=0,
                    help="index of the first example (to add examples to a run)")
    ap.add_argument("--sweep-examples", type=int, default=2,
                    help="examples per task that also run the sweep")
    ap.add_argument("--grid", action="store_true",
                    help="sweep every (channels, tokens) pair, not only the two axes")
    ap.add_argument("--methods", help="comma-separated: run only these of the study's "
                    "methods (default all)")
    ap.add_argument("--tag", default="", help="suffix of the JSON file name, to keep "
                    "several runs at the same lengths side by side")
    # results/v2: runs with today's format (6-bit rows, remainder bound);
    # the first format's runs stay in results/ (docs/ACCURACY.md has both)
    ap.add_argument("--results", type=pathlib.Path, default=HERE / "results" / "v2")
    ap.add_argument("--plot", default=str(ROOT / "docs" / "accuracy_sweep.png"))
    a = ap.parse_args()
    if a.quick:
        a.results = a.results / "quick"
        a.plot = str(a.results / "accuracy_sweep.png")
        a.examples = a.examples or (2 if a.calibrate else 2)
        a.sweep_examples = min(a.sweep_examples, 1)
        a.lengths = a.lengths or "2000"
        a.tasks = a.tasks or "niah_single_number,vt_hops1"
    if a.report:
        rows = calibration_rows(a.results)
        if rows:
            print(report_calibration({"rows": rows}))
            print()
        st = load_studies(a.results)
        if st:
            print(report_study(st, a.plot))
        return 0
    if a.verify:
        return verify(a)
    if a.calibrate:
        return calibrate(a)
    return study(a)


if __name__ == "__main__":
    sys.exit(main())
