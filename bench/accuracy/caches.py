"""The caches the accuracy study compares, built from one captured prefill.

Every method runs the prompt's own attention exactly (dense SDPA): MosaicKV
and Quest only change decode attention.  So the study runs each prompt once
through the model with transformers' DynamicCache, keeps the per-layer K/V
and the last position's logits, and for every method builds that method's
cache by handing it the captured K/V exactly as the model's prefill would
(`layer.update(k, v)` on each layer), then decodes greedily; decode_many()
decodes all methods of one prompt together, one batch row per method.
`verify()` checks on real prompts that both give the same tokens as
`model.generate(ids, past_key_values=cache)`.

Methods (make_cache):
  full          exact attention: transformers' DynamicLayer semantics on a
                growing buffer (GrowLayer: no torch.cat per step).
  mosaickv      mosaickv.hf.MosaicCache (the library's sequence layer):
                per-vector top-r in each segment's rotated basis, block
                selection on rotated summaries, 64-token dense window.
  quest         mosaickv.hf.QuestCache (on GrowLayers): Quest's block
                selection over dense K/V.
  globalmask    SegmentCache below with select="global": the same rotation
                and block selection, but one channel set per segment (ThinK's
                global mask), at the memory of mosaickv's values + bitmap.
  mosaickv_seg  SegmentCache with mosaickv's per-vector selection: the
                global mask's like-for-like partner.

The "mkv_bench" attention function registered here serves all of them: it
splits batched steps by row, handles SegmentCache's decode steps and passes
everything else on to mosaickv.hf's "mosaickv" attention function.
"""
import numpy as np
import torch
from transformers import AttentionInterface, AttentionMaskInterface, DynamicCache
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer
from transformers.masking_utils import sdpa_mask

import mosaickv as mkv
import mosaickv.hf as mhf

ATTN = "mkv_bench"


def head_dim(cfg):
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


from budget import VALUE_BITS, budget_r, row_bytes  # noqa: F401 (re-exported)


def method_r(method, d, channels):
    """r for @method at @channels: the byte budget for mosaickv's
    quantized rows, r = channels*d bf16 values for the global mask."""
    if method.startswith("mosaickv"):
        return budget_r(d, channels)
    return max(1, int(round(d * channels)))


def globalmask_r(r, d):
    """Channels a global mask keeps at the memory of per-vector top-r: the
    per-vector format stores r bf16 values plus a d-bit bitmap per vector,
    a global mask needs no bitmap (one mask per segment), so it affords
    d/16 more bf16 values per vector."""
    return min(d, r + d // 16)


class SegmentLayer(CacheLayerMixin):
    """One layer of a SegmentCache: per KV head, the prefill history encoded
    as mosaickv.Segment pairs and a dense window of the rest."""
    is_sliding = False

    def __init__(self, cache, layer_idx):
        super().__init__()
        self.cache, self.layer_idx, self.n = cache, layer_idx, 0

    def lazy_initialization(self, key_states, value_states):
        self.device, self.dtype = key_states.device, key_states.dtype
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        k = key_states[0].detach().to("cpu", torch.float32).numpy()
        v = value_states[0].detach().to("cpu", torch.float32).numpy()
        if self.n == 0:
            self._prefill(k, v)
            mode = "prefill"
        else:
            self.wk = np.concatenate([self.wk, k], axis=1)
            self.wv = np.concatenate([self.wv, v], axis=1)
            mode = "segment"
        self.n += k.shape[1]
        key_states._mkv = (self, mode)
        return key_states, value_states

    def _prefill(self, k, v):
        c = self.cache
        n = k.shape[1]
        hist = max(0, n - c.window)
        ps = c.prefill_segment
        cuts = [(a, min(a + ps, hist)) for a in range(0, hist, ps)]
        self.ks = [[mkv.Segment(k[h, a:b], kind="key", **c.enc) for a, b in cuts]
                   for h in range(k.shape[0])]
        venc = dict(c.enc, summary_channels=0)
        self.vs = [[mkv.Segment(v[h, a:b], kind="value", **venc) for a, b in cuts]
                   for h in range(k.shape[0])]
        self.wk = np.ascontiguousarray(k[:, hist:])
        self.wv = np.ascontiguousarray(v[:, hist:])

    def attend(self, query, scaling):
        b, hq, qlen, d = query.shape
        if qlen != 1:
            raise NotImplementedError("SegmentCache: one query token per step")
        q = query[0, :, 0].detach().to("cpu", torch.float32).numpy()
        g = self.cache.q_per_kv
        out = np.empty_like(q)
        for h in range(len(self.ks)):
            out[h * g:(h + 1) * g], _ = mkv.attend_packed(
                q[h * g:(h + 1) * g], self.ks[h], self.vs[h], self.wk[h], self.wv[h],
                token_frac=self.cache.token_frac)
        return torch.from_numpy(out).to(query.device, query.dtype).view(1, 1, hq, d), None

    def get_mask_sizes(self, query_length):
        return self.n + query_length, 0

    def get_seq_length(self):
        return self.n

    def get_max_length(self):
        return -1


class SegmentCache(Cache):
    """A cache of mosaickv segments encoded with any encode options (here:
    the global channel mask, which the sequence layer does not offer).

    Layout as MosaicCache's sequence: the prefill history (all but the last
    `window` tokens) in segments of `prefill_segment` tokens, the rest dense.
    Unlike the sequence, decode tokens are not compressed: they join the
    dense window (a few dozen tokens in this study), and the history stays
    the prefill's."""

    def __init__(self, config, *, r, token_frac=0.1, select="global", rotate=True,
                 drop=False, summary_channels=0, window=64, prefill_segment=4096,
                 store="bf16", value_bits=0):
        super().__init__(layers=[SegmentLayer(self, i)
                                 for i in range(config.num_hidden_layers)])
        self.q_per_kv = config.num_attention_heads // config.num_key_value_heads
        self.token_frac, self.window, self.prefill_segment = token_frac, window, prefill_segment
        self.enc = dict(r=r, select=select, rotate=rotate, drop=drop, store=store,
                        summary_channels=summary_channels, value_bits=value_bits)


class GrowLayer(DynamicLayer):
    """transformers' DynamicLayer without the torch.cat of every step: K/V
    live in a buffer grown by doubling and the layer hands out views of it.
    The same tensors, so the same attention; only faster on a loaded CPU."""

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._n, self._kb, self._vb = 0, None, None
        n0, n = self._n, self._n + key_states.shape[-2]
        if self._kb is None or n > self._kb.shape[-2]:
            cap = max(n + 64, 2 * n0)
            kb = key_states.new_empty(key_states.shape[:-2] + (cap, key_states.shape[-1]))
            vb = value_states.new_empty(value_states.shape[:-2] + (cap, value_states.shape[-1]))
            if n0:
                kb[..., :n0, :] = self._kb[..., :n0, :]
                vb[..., :n0, :] = self._vb[..., :n0, :]
            self._kb, self._vb = kb, vb
        self._kb[..., n0:n, :] = key_states
        self._vb[..., n0:n, :] = value_states
        self._n = n
        self.keys, self.values = self._kb[..., :n, :], self._vb[..., :n, :]
        return self.keys, self.values


class QuestGrowLayer(GrowLayer):
    """QuestCache's layer on a GrowLayer: tags the keys for the "mosaickv"
    attention function as mosaickv.hf.QuestCache's layers do."""

    def __init__(self, cache):
        super().__init__()
        self.cache = cache

    def update(self, key_states, value_states, *args, **kwargs):
        first = not self.is_initialized or self.get_seq_length() == 0
        k, v = GrowLayer.update(self, key_states, value_states, *args, **kwargs)
        k._mkv = (self.cache, "prefill" if first else "quest")
        return k, v


def full_cache(cfg):
    return Cache(layers=[GrowLayer() for _ in range(cfg.num_hidden_layers)])


def quest_cache(cfg, token_frac):
    c = mhf.QuestCache(cfg, token_frac=token_frac)
    c.layers = [QuestGrowLayer(c) for _ in range(cfg.num_hidden_layers)]
    return c


class MultiLayer(CacheLayerMixin):
    is_sliding = False

    def __init__(self, multi, layer_idx):
        super().__init__()
        self.multi, self.layer_idx = multi, layer_idx

    def lazy_initialization(self, key_states, value_states):
        self.device, self.dtype = key_states.device, key_states.dtype
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.outs = [c.layers[self.layer_idx].update(key_states[b:b + 1], value_states[b:b + 1],
                                                     *args, **kwargs)
                     for b, c in enumerate(self.multi.caches)]
        key_states._mkv = (self, "multi")
        return key_states, value_states

    def get_seq_length(self):
        return self.multi.caches[0].layers[self.layer_idx].get_seq_length()

    def get_mask_sizes(self, query_length):
        return self.get_seq_length() + query_length, 0

    def get_max_length(self):
        return -1


class MultiCache(Cache):
    """Batch row b of a decode step goes to caches[b]: several methods decode
    the same prompt in one forward pass (the weights are read once per step
    for all of them); attention still runs per row, each in its own cache.
    All rows must hold the same number of tokens."""

    def __init__(self, caches):
        self.caches = caches
        super().__init__(layers=[MultiLayer(self, i) for i in range(len(caches[0].layers))])


def bench_attention(module, query, key, value, attention_mask, scaling=None,
                    dropout=0.0, **kwargs):
    tag = getattr(key, "_mkv", None)
    if tag is not None and tag[1] == "multi":
        outs = []
        for b, (kb, vb) in enumerate(tag[0].outs):
            m = attention_mask[b:b + 1] if attention_mask is not None else None
            outs.append(bench_attention(module, query[b:b + 1], kb, vb, m, scaling=scaling,
                                        dropout=dropout, **kwargs)[0])
        return torch.cat(outs, 0), None
    if tag is not None and tag[1] == "segment":
        if scaling is not None and abs(scaling - query.shape[-1] ** -0.5) > 1e-6:
            raise NotImplementedError("SegmentCache: scale other than 1/sqrt(d)")
        return tag[0].attend(query, scaling)
    return mhf.mosaickv_attention(module, query, key, value, attention_mask,
                                  scaling=scaling, dropout=dropout, **kwargs)


AttentionInterface.register(ATTN, bench_attention)
AttentionMaskInterface.register(ATTN, sdpa_mask)


# ---------------------------------------------------------------------------

def make_cache(method, cfg, *, r=16, token_frac=0.1, store=None):
    """A fresh, empty cache of @method at r values per vector and token_frac
    (mosaickv: r values of VALUE_BITS bits; the global mask: bf16)."""
    d = head_dim(cfg)
    if method == "full":
        return full_cache(cfg)
    if method == "mosaickv":
        # One-stage selection (the paper's; the study's "mosaickv" rows):
        # MosaicCache's CPU default is now two stages ("mosaickv_r2").
        return mhf.MosaicCache(cfg, store=store, r=r, token_frac=token_frac,
                               value_bits=VALUE_BITS, refine=0.0)
    if method == "mosaickv_s8":
        # mosaickv with 8-bit block scores (mkv_seq_opts.summary_bits = 8:
        # final segments scored in integers, docs/ACCURACY.md).
        return mhf.MosaicCache(cfg, store=store, r=r, token_frac=token_frac,
                               value_bits=VALUE_BITS, refine=0.0, summary_bits=8)
    if method == "mosaickv_r2":
        # Two-stage selection (mkv_seq_opts.refine = 2): the bound names
        # twice the budget's blocks, their keys pick the budget.
        return mhf.MosaicCache(cfg, store=store, r=r, token_frac=token_frac,
                               value_bits=VALUE_BITS, refine=2.0)
    if method == "quest":
        return quest_cache(cfg, token_frac)
    if method == "globalmask":
        # Summaries over the same r rotated channels as mosaickv's, so that
        # they cost the same and only the kept elements differ.
        return SegmentCache(cfg, r=globalmask_r(r, d), token_frac=token_frac,
                            select="global", summary_channels=r)
    if method == "mosaickv_seg":
        # mosaickv's per-vector selection through SegmentCache: checks that
        # SegmentCache's layout matches the sequence layer's (verify()).
        return SegmentCache(cfg, r=r, token_frac=token_frac, select="per_vector",
                            value_bits=VALUE_BITS, summary_channels=min(r, d // 4))
    raise ValueError(method)


def close(cache):
    if hasattr(cache, "close"):
        cache.close()


@torch.no_grad()
def prefill(model, ids):
    """Run the prompt once: (first generated token, [(k, v)] per layer)."""
    dc = DynamicCache(config=model.config)
    out = model(input_ids=ids, past_key_values=dc, use_cache=True, logits_to_keep=1)
    kv = [(layer.keys, layer.values) for layer in dc.layers]
    return int(out.logits[0, -1].argmax()), kv


def load_prefill(cache, kv):
    """Hand the captured prefill K/V to @cache as the model's prefill does."""
    for i, (k, v) in enumerate(kv):
        cache.layers[i].update(k, v)
    return cache


def eos_ids(model):
    e = model.generation_config.eos_token_id
    return set(e if isinstance(e, (list, tuple)) else [e] if e is not None else [])


@torch.no_grad()
def decode(model, cache, first, max_new, stop=None, eos=()):
    """Greedy decode after a prefill loaded into @cache: @first is the
    token the prefill's logits chose.  Stops after @max_new tokens, at an
    EOS token, or as soon as stop(tokens) is true.  Returns the tokens."""
    toks = [first]
    while len(toks) < max_new and toks[-1] not in eos and not (stop and stop(toks)):
        out = model(input_ids=torch.tensor([[toks[-1]]]), past_key_values=cache,
                    use_cache=True)
        toks.append(int(out.logits[0, -1].argmax()))
    return toks


@torch.no_grad()
def decode_many(model, caches, first, max_new, stops=None, eos=()):
    """decode() for several caches holding the same prefill, batched: one
    forward pass per step for all rows still running.  @max_new and @stops
    per row (or one for all).  Returns the tokens of each row."""
    B = len(caches)
    max_new = max_new if isinstance(max_new, (list, tuple)) else [max_new] * B
    stops = stops if isinstance(stops, (list, tuple)) else [stops] * B
    toks = [[first] for _ in range(B)]

    def done(b):
        t = toks[b]
        return len(t) >= max_new[b] or t[-1] in eos or bool(stops[b] and stops[b](t))

    live = [b for b in range(B) if not done(b)]
    while live:
        multi = MultiCache([caches[b] for b in live])
        out = model(input_ids=torch.tensor([[toks[b][-1]] for b in live]),
                    past_key_values=multi, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1).tolist()
        for b, t in zip(live, nxt):
            toks[b].append(int(t))
        live = [b for b in live if not done(b)]
    return toks


@torch.no_grad()
def verify(model, ids, methods, max_new=12, **kw):
    """For each method: tokens from model.generate through the method's own
    cache (full: transformers' DynamicCache, quest: mosaickv.hf.QuestCache)
    against the captured-prefill path, one method at a time (decode) and
    all methods batched (decode_many).  {method: (same, ref, one, batched)}."""
    first, kv = prefill(model, ids)
    eos = eos_ids(model)
    res = {}
    for m in methods:
        c = {"full": lambda: DynamicCache(config=model.config),
             "quest": lambda: mhf.QuestCache(model.config, token_frac=kw.get("token_frac", 0.1)),
             }.get(m, lambda: make_cache(m, model.config, **kw))()
        ref = model.generate(ids, max_new_tokens=max_new, do_sample=False,
                             past_key_values=c)[0, ids.shape[1]:].tolist()
        close(c)
        c = load_prefill(make_cache(m, model.config, **kw), kv)
        got = decode(model, c, first, max_new, eos=eos)
        close(c)
        res[m] = [ref, got]
    cs = [load_prefill(make_cache(m, model.config, **kw), kv) for m in methods]
    many = decode_many(model, cs, first, max_new, eos=eos)
    for c in cs:
        close(c)
    for m, t in zip(methods, many):
        ref, got = res[m]
        res[m] = (ref == got == t, ref, got, t)
    return res
