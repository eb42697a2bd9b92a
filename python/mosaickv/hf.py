"""mosaickv inside transformers (5.x): MosaicCache and the "mosaickv"
attention function.

    import mosaickv.hf
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="mosaickv")
    cache = mosaickv.hf.MosaicCache(model.config)
    model.generate(ids, past_key_values=cache, ...)

Prefill: each layer's K and V go to mosaickv as compressed segments, and the
prompt's own attention runs dense (SDPA), as in MosaicKV.  Decode: each new
token's K and V are appended (compressed at once into the update buffer) and
attention runs mosaickv's PackedAttention over the compressed cache; dense
K/V are never rebuilt.  Several new tokens after the prefill (a later
prompt chunk, speculative or assisted decoding) are appended one at a time,
each just before its own query attends, which is causal attention exactly
as if they had been decoded one by one.  The attention function finds its
layer through an
attribute set on the key tensor that the cache layer returns, since
generate() rejects unknown keyword arguments; with any other cache it is
plain SDPA, so one loaded model serves both.

Where it runs follows the model: with the model on a CUDA device (and a
library built with CUDA), the cache's store puts its top tier on that
device, the prefill K/V are read there, and decode attention runs
PackedAttention on the GPU in torch's current stream, the query and the
output staying on the device; only each decode token's K and V (a few
hundred bytes) cross to the host, where appends are compressed.  On the
CPU, or on a library without CUDA, everything runs on the CPU path (tensors
on a device are then copied).  Batch size 1 per cache.
"""
import itertools

import numpy as np
import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from .seq import Sequence, Store

_ids = itertools.count(1)


class MosaicLayer(CacheLayerMixin):
    is_sliding = False

    def __init__(self, cache, layer_idx):
        super().__init__()
        self.cache = cache
        self.layer_idx = layer_idx
        self.n = 0
        self.pending = None  # new tokens a multi-token step appends

    def lazy_initialization(self, key_states, value_states):
        self.device = key_states.device
        self.dtype = key_states.dtype
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.shape[0] != 1:
            raise NotImplementedError("MosaicCache holds one sequence (batch 1)")
        seq = self.cache._sequence(key_states)
        k, v = key_states[0], value_states[0]
        n = k.shape[1]
        if self.n == 0:
            seq.prefill(self.layer_idx, k, v)
            mode = "prefill"
        elif n == 1:
            seq.append(self.layer_idx, k[:, 0], v[:, 0])
            mode = "decode"
        else:
            # Several new tokens after the prefill (a later prompt chunk,
            # speculative or assisted decoding): query i may see only the
            # tokens up to i, and the sequence attends everything it holds,
            # so the attention function appends them one at a time, each
            # before its own query (pending here until then).
            self.pending = (k, v)
            mode = "multi"
        self.n += n
        key_states._mkv = (self, mode)
        return key_states, value_states

    def get_mask_sizes(self, query_length):
        return self.n + query_length, 0

    def get_seq_length(self):
        return self.n

    def get_max_length(self):
        return -1

    def offload(self):
        """The layer's final segments leave the store's top tier for pinned
        host memory; its attention then fetches only the blocks it selects
        (mkv_seq_offload).  transformers calls this after the layer's update
        when the cache was made with offloading=True."""
        if self.cache.seq is not None and self.n:
            self.cache.seq.offload(self.layer_idx)

    def prefetch(self):
        """The blocks this layer's last attention selected come back into
        the store's top tier ahead of its next one (mkv_seq_prefetch)."""
        if self.cache.seq is not None and self.n:
            self.cache.seq.prefetch(self.layer_idx)

    def reset(self):
        raise NotImplementedError("MosaicCache cannot be reset; make a new one")


# Candidates named by the bound, per block the budget needs, in two-stage
# selection (mkv_seq_opts.refine): at 2 the RULER study's loss went from
# 4.2 to 0 points on SmolLM2 (docs/ACCURACY.md).
DEFAULT_REFINE_CPU = 2.0


class MosaicCache(Cache):
    """A transformers Cache whose layers live in a mosaickv sequence.

    Options are those of mosaickv.seq.Sequence (r, g, b, value_bits, drop,
    token_frac, window, prefill_segment, ...).  The defaults are the
    library's: 10% of the tokens, and r = 0, the default budget (the bytes
    of d/4 bf16 values per vector, spent on 5d/8 values of 6 bits);
    adaptive=True chooses r per segment from loss_threshold.  refine (default
    None): blocks are selected in two stages, the bound naming refine x the
    budget and the candidates' keys picking it (docs/ACCURACY.md); None
    means 2 when attention runs on the CPU, 0 (one stage) on a CUDA device,
    whose kernels select in one stage for now.  `store` may be shared between caches; by default each
    cache makes its own store when it sees its first K/V: on their CUDA
    device if they are on one (hbm_bytes sizes its top tier there), in
    host memory otherwise."""

    def __init__(self, config, *, store=None, hbm_bytes=256 << 20, offloading=False,
                 **seq_opts):
        n_layers = config.num_hidden_layers
        # offloading: transformers then prefetches layer i + 1 before layer
        # i's update and offloads layer i after it (its CUDA streams: GPU
        # models only); MosaicLayer maps both onto the store's tiers.
        if offloading and not torch.cuda.is_available():
            raise ValueError("offloading=True needs CUDA (transformers runs it on CUDA "
                             "streams); on the CPU call cache.layers[i].offload() and "
                             ".prefetch() directly")
        super().__init__(layers=[MosaicLayer(self, i) for i in range(n_layers)],
                         offloading=offloading)
        self.config = config
        self.kv_heads = config.num_key_value_heads
        self.q_per_kv = config.num_attention_heads // config.num_key_value_heads
        self.d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.store = store
        self.hbm_bytes = hbm_bytes
        self.seq_opts = seq_opts
        self.seq = None

    def _sequence(self, key_states):
        if self.store is None:
            dev = key_states.device
            gpu = -1
            if dev.type == "cuda":
                gpu = dev.index if dev.index is not None else torch.cuda.current_device()
            self.store = Store(gpu=gpu, hbm_bytes=self.hbm_bytes)
        if self.seq is None:
            opts = dict(self.seq_opts)
            if opts.get("refine") is None:
                # Two-stage selection where attention runs on the CPU
                # (the GPU kernels select in one stage for now).
                opts["refine"] = 0.0 if key_states.device.type == "cuda" else DEFAULT_REFINE_CPU
            self.seq = Sequence(self.store, next(_ids), layers=len(self.layers),
                                kv_heads=self.kv_heads, q_per_kv=self.q_per_kv,
                                d=self.d, **opts)
        return self.seq

    def stats(self):
        return self.seq.stats() if self.seq else {}

    def close(self):
        if self.seq is not None:
            self.seq.close()
            self.seq = None


class QuestCache(Cache):
    """Quest for comparison: dense K/V (transformers' DynamicLayer) and, at
    decode, mosaickv's Quest reference: blocks of `block` tokens scored by
    their channel-wise min/max bound, the sink block, the top blocks up to
    `token_frac` of the history, and the last `window` tokens attended."""

    def __init__(self, config, *, token_frac=0.1, block=16, window=64):
        from transformers.cache_utils import DynamicLayer

        class _Layer(DynamicLayer):
            def update(layer, key_states, value_states, *args, **kwargs):
                first = not layer.is_initialized or layer.get_seq_length() == 0
                k, v = DynamicLayer.update(layer, key_states, value_states, *args, **kwargs)
                k._mkv = (self, "prefill" if first else "quest")
                return k, v

        super().__init__(layers=[_Layer() for _ in range(config.num_hidden_layers)])
        self.token_frac, self.block, self.window = token_frac, block, window
        self.q_per_kv = config.num_attention_heads // config.num_key_value_heads


def _quest_attention(cache, query, key, value):
    from . import attend_quest
    b, hq, qlen, d = query.shape
    q = query[0, :, 0].detach().to("cpu", torch.float32).numpy()
    k = key[0].detach().to("cpu", torch.float32).numpy()
    v = value[0].detach().to("cpu", torch.float32).numpy()
    n = k.shape[1]
    w = min(cache.window, n)
    g = cache.q_per_kv
    out = np.empty_like(q)
    for h in range(k.shape[0]):
        out[h * g:(h + 1) * g], _ = attend_quest(
            q[h * g:(h + 1) * g], k[h, :n - w], v[h, :n - w], k[h, n - w:], v[h, n - w:],
            token_frac=cache.token_frac, block=cache.block)
    return torch.from_numpy(out).to(query.device, query.dtype).view(1, 1, hq, d), None


def _multi_attention(layer, query, scaling):
    """Causal attention of several new tokens over the compressed cache:
    token i is appended (compressed at once), then its query attends; so
    query i sees the history and new tokens 0..i, exactly as if they had
    come one decode step at a time."""
    b, hq, qlen, d = query.shape
    if scaling is not None and abs(scaling - d ** -0.5) > 1e-6:
        raise NotImplementedError("mosaickv attention: scale other than 1/sqrt(d)")
    k, v = layer.pending
    layer.pending = None
    seq, li = layer.cache.seq, layer.layer_idx
    outs = []
    for i in range(qlen):
        seq.append(li, k[:, i], v[:, i])
        outs.append(seq.attend(li, query[0, :, i]).to(query.device, query.dtype))
    return torch.stack(outs).view(1, qlen, hq, d), None


def _packed_attention(layer, query, scaling):
    b, hq, qlen, d = query.shape
    if qlen != 1:
        raise NotImplementedError("mosaickv attention: one query token per step")
    if scaling is not None and abs(scaling - d ** -0.5) > 1e-6:
        raise NotImplementedError("mosaickv attention: scale other than 1/sqrt(d)")
    # A CUDA tensor stays on the device when the sequence is there.
    out = layer.cache.seq.attend(layer.layer_idx, query[0, :, 0])
    return out.to(query.device, query.dtype).view(1, 1, hq, d), None


def mosaickv_attention(module, query, key, value, attention_mask, scaling=None,
                       dropout=0.0, **kwargs):
    """The "mosaickv" attention function: PackedAttention for a MosaicCache
    decode step, Quest for a QuestCache decode step, SDPA otherwise (any
    other cache, and every prompt's own causal attention)."""
    tag = getattr(key, "_mkv", None)
    if tag is not None and tag[1] == "decode":
        return _packed_attention(tag[0], query, scaling)
    if tag is not None and tag[1] == "multi":
        return _multi_attention(tag[0], query, scaling)
    if tag is not None and tag[1] == "quest":
        return _quest_attention(tag[0], query, key, value)
    return sdpa_attention_forward(module, query, key, value, attention_mask,
                                  scaling=scaling, dropout=dropout, **kwargs)


AttentionInterface.register("mosaickv", mosaickv_attention)
AttentionMaskInterface.register("mosaickv", sdpa_mask)
