"""Store and sequence bindings (include/mosaickv/store.h, sequence.h).

The option structs mirror the C headers field for field; the library
checks their size, so a stale mirror fails loudly (MosaicError EINVAL at
*_opts_init) instead of misreading memory.
"""
import ctypes as C

import numpy as np

from . import _lib
from . import MosaicError, _check, _L

MKV_TIER_COUNT = 3


class StoreOpts(C.Structure):
    _fields_ = [("size", C.c_size_t), ("hbm_bytes", C.c_size_t),
                ("host_bytes", C.c_size_t), ("nvme_bytes", C.c_size_t),
                ("nvme_dir", C.c_char_p), ("gpu", C.c_int), ("numa_node", C.c_int),
                ("workers", C.c_uint32), ("io_depth", C.c_uint32), ("lz4", C.c_uint32),
                ("half_life", C.c_double),
                ("high_wm", C.c_double * MKV_TIER_COUNT),
                ("low_wm", C.c_double * MKV_TIER_COUNT),
                ("auto_balance", C.c_uint32), ("hot_fraction", C.c_double),
                ("io_buf_bytes", C.c_size_t), ("fetch_mapped", C.c_uint32),
                ("fetch_threads", C.c_uint32), ("fetch_spin_us", C.c_uint32),
                ("fetch_kernel_share", C.c_double)]


class SeqOpts(C.Structure):
    _fields_ = [("size", C.c_size_t), ("layers", C.c_uint32), ("kv_heads", C.c_uint32),
                ("q_per_kv", C.c_uint32), ("d", C.c_uint32),
                ("prefill_segment", C.c_uint32), ("min_segment", C.c_uint32),
                ("max_segment", C.c_uint32), ("window", C.c_uint32),
                ("token_frac", C.c_double), ("r", C.c_uint32), ("g", C.c_uint32),
                ("b", C.c_uint32), ("drop", C.c_uint32),
                ("loss_threshold", C.c_double), ("var_threshold", C.c_double),
                ("store_dtype", C.c_int), ("lag_cap", C.c_size_t),
                ("staging_bytes", C.c_size_t), ("device_attend", C.c_uint32),
                ("value_bits", C.c_uint32), ("adaptive", C.c_uint32),
                ("summary_channels", C.c_uint32), ("refine", C.c_double),
                ("attend_threads", C.c_uint32), ("device_positions", C.c_uint32),
                ("summary_bits", C.c_uint32)]


class SeqStats(C.Structure):
    _fields_ = [("size", C.c_size_t), ("tokens", C.c_uint64), ("swaps", C.c_uint64),
                ("finalize_failed", C.c_uint64), ("last_error", C.c_int64),
                ("lag_tokens", C.c_uint64), ("lag_bytes", C.c_uint64),
                ("max_lag_bytes", C.c_uint64), ("sync_finalized", C.c_uint64),
                ("queue_depth", C.c_uint32), ("segments_final", C.c_uint64),
                ("segments_pending", C.c_uint64), ("fetch_bytes_last", C.c_uint64),
                ("fetch_bytes_total", C.c_uint64), ("attend_bytes_last", C.c_uint64),
                ("on_device", C.c_uint32), ("device_bytes", C.c_uint64),
                ("device_upload_failed", C.c_uint64), ("device_attends", C.c_uint64),
                ("offload_moves", C.c_uint64), ("offload_failed", C.c_uint64),
                ("prefetch_blocks", C.c_uint64), ("prefetch_failed", C.c_uint64),
                ("device_ordered", C.c_uint64), ("device_unordered", C.c_uint64)]


P, I, SZ, U32 = C.c_void_p, C.c_int, C.c_size_t, C.c_uint32
for _name, _res, _args in [
        ("mkv_store_opts_init", I, [C.POINTER(StoreOpts), SZ]),
        ("mkv_store_create", I, [C.POINTER(StoreOpts), C.POINTER(P)]),
        ("mkv_store_destroy", None, [P]),
        ("mkv_seq_opts_init", I, [C.POINTER(SeqOpts), SZ]),
        ("mkv_seq_default_r", C.c_uint32, [C.c_uint32, C.c_uint32, C.c_uint32]),
        ("mkv_seq_open", I, [P, C.POINTER(SeqOpts), C.c_uint64, C.POINTER(P)]),
        ("mkv_seq_close", I, [P]),
        ("mkv_seq_prefill", I, [P, U32, P, P, I, SZ]),
        ("mkv_seq_append", I, [C.POINTER(P), SZ, U32, P, P, I]),
        ("mkv_seq_attend", I, [P, U32, P, P, P]),
        ("mkv_seq_attend_dev", I, [P, U32, P, P, P]),
        ("mkv_seq_flush", I, [P, U32]),
        ("mkv_seq_offload", I, [P, U32]),
        ("mkv_seq_prefetch", I, [P, U32]),
        ("mkv_seq_sync", I, [P]),
        ("mkv_seq_get_stats", I, [P, C.POINTER(SeqStats)])]:
    _fn = getattr(_L, _name)
    _fn.restype, _fn.argtypes = _res, _args


def _torch():
    import torch
    return torch


def _is_tensor(x):
    # torch is optional: only tensors built by an imported torch reach here.
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


class _TorchDtypes(dict):
    """torch dtype -> mkv_dtype, filled on first use (torch is optional)."""

    def get(self, key, default=None):
        if not self:
            torch = _torch()
            self.update({torch.float32: _lib.MKV_DTYPE_F32,
                         torch.float16: _lib.MKV_DTYPE_F16,
                         torch.bfloat16: _lib.MKV_DTYPE_BF16})
        return dict.get(self, key, default)


_TORCH_DT = _TorchDtypes()


class Store:
    """A tiered store; every sequence on it must be closed before it."""

    def __init__(self, hbm_bytes=256 << 20, host_bytes=1 << 30, nvme_dir=None,
                 gpu=-1, workers=2):
        o = StoreOpts()
        _check(_L.mkv_store_opts_init(C.byref(o), C.sizeof(o)),
               "store options (binding out of date?)")
        o.hbm_bytes, o.host_bytes, o.gpu, o.workers = hbm_bytes, host_bytes, gpu, workers
        self.gpu = gpu
        self._dir = nvme_dir.encode() if nvme_dir else None
        o.nvme_dir = self._dir
        h = C.c_void_p()
        _check(_L.mkv_store_create(C.byref(o), C.byref(h)), "store")
        self._h = h

    def close(self):
        if getattr(self, "_h", None):
            _L.mkv_store_destroy(self._h)
            self._h = None

    __del__ = close


def default_r(d, value_bits=6, g=1):
    """The r that r=0 stands for (mkv_seq_default_r): the largest multiple
    of g whose packed row fits the bytes of d/4 bf16 values."""
    r = _L.mkv_seq_default_r(d, value_bits, g)
    if r == 0:
        raise ValueError(f"no default r for d={d} value_bits={value_bits} g={g}")
    return r


class Sequence:
    """One request's cache: layers × kv_heads of compressed segments.

    Options mirror struct mkv_seq_opts.  refine > 1 turns on two-stage
    block selection: the bound names refine × token_frac of the history,
    those blocks' packed keys score them, the top token_frac is attended
    (more keys read per step; CPU path only).  attend_threads > 1 shares
    the KV heads of a CPU-path attend and of every append (each head's
    token encoded into its open segment, the decode thread's main cost on
    the GPU path too) over that many threads (the caller and helpers the
    sequence starts, each with its own fetch staging of staging_bytes);
    the results are the same.  device_positions=True keeps
    each value's channel beside the bitmaps in the device copies of bf16
    segments (value_bits=0, g=1, r <= 32): a faster GPU attend for more
    device bytes, the same results.  summary_bits=8 scores final segments
    (S of 8, 16, 24 or 32) in integers on 8-bit summaries, on both paths:
    a shorter GPU score stage, a slightly different selection."""

    def __init__(self, store, seq_id, *, layers, kv_heads, q_per_kv, d,
                 r=0, g=1, b=16, drop=False, token_frac=0.1, window=64,
                 prefill_segment=4096, min_segment=256, max_segment=65536,
                 loss_threshold=0.3, store_dtype="bf16", value_bits=6,
                 adaptive=False, summary_channels=0, refine=0.0, attend_threads=1,
                 device_positions=False, summary_bits=16):
        o = SeqOpts()
        _check(_L.mkv_seq_opts_init(C.byref(o), C.sizeof(o)),
               "sequence options (binding out of date?)")
        o.layers, o.kv_heads, o.q_per_kv, o.d = layers, kv_heads, q_per_kv, d
        o.r, o.g, o.b, o.drop = r, g, b, int(drop)
        o.token_frac, o.window = token_frac, window
        o.prefill_segment, o.min_segment, o.max_segment = prefill_segment, min_segment, max_segment
        o.loss_threshold = loss_threshold
        o.value_bits, o.adaptive = value_bits, int(adaptive)
        o.summary_channels = summary_channels
        o.refine = refine
        o.attend_threads = attend_threads
        o.device_positions = int(device_positions)
        o.summary_bits = summary_bits
        self.refine = refine
        o.store_dtype = _lib.MKV_DTYPE_F32 if store_dtype == "f32" else _lib.MKV_DTYPE_BF16
        self.store = store  # keeps the store alive
        self.layers, self.kv_heads, self.q_per_kv, self.d = layers, kv_heads, q_per_kv, d
        h = C.c_void_p()
        _check(_L.mkv_seq_open(store._h, C.byref(o), seq_id, C.byref(h)), "open")
        self._h = h

    def prefill(self, layer, k, v):
        """k, v: (kv_heads, n, d): numpy arrays, or torch tensors (float32,
        float16 or bfloat16).  Tensors on the store's CUDA device, with the
        sequence on the device, are passed as device pointers (the library
        reads them there) once the current stream has finished writing
        them; others are copied to the host."""
        if _is_tensor(k):
            import torch
            dt = _TORCH_DT.get(k.dtype)
            if dt is None:
                k, v, dt = k.float(), v.float(), _lib.MKV_DTYPE_F32
            k = k.detach().contiguous()
            v = v.detach().to(k.dtype).contiguous()
            # Device pointers only where the library reads them: a
            # library built without CUDA would take them for host memory.
            if not (k.is_cuda and self._device_index() == k.device.index
                    and self.on_device()):
                k, v = k.cpu(), v.cpu()
            elif v.device != k.device:
                v = v.to(k.device)
            if k.is_cuda:
                # The library copies with cudaMemcpy on the legacy default
                # stream, which does not wait for torch's streams.
                torch.cuda.current_stream(k.device).synchronize()
            _check(_L.mkv_seq_prefill(self._h, layer, k.data_ptr(), v.data_ptr(),
                                      dt, k.shape[1]), "prefill")
            return
        k = np.ascontiguousarray(k, dtype=np.float32)
        v = np.ascontiguousarray(v, dtype=np.float32)
        _check(_L.mkv_seq_prefill(self._h, layer, k.ctypes.data, v.ctypes.data,
                                  _lib.MKV_DTYPE_F32, k.shape[1]), "prefill")

    def append(self, layer, k, v):
        """k, v: (kv_heads, d), one decode token: numpy arrays or torch
        tensors (copied to the host: appends take host memory)."""
        if _is_tensor(k):
            k = k.detach().to("cpu", dtype=_torch().float32).numpy()
            v = v.detach().to("cpu", dtype=_torch().float32).numpy()
        k = np.ascontiguousarray(k, dtype=np.float32)
        v = np.ascontiguousarray(v, dtype=np.float32)
        arr = (C.c_void_p * 1)(self._h)
        _check(_L.mkv_seq_append(arr, 1, layer, k.ctypes.data, v.ctypes.data,
                                 _lib.MKV_DTYPE_F32), "append")

    def on_device(self):
        """Whether attention runs on the GPU (mkv_seq_stats.on_device)."""
        return bool(self.stats()["on_device"])

    def _device_index(self):
        return self.store.gpu if self.store.gpu >= 0 else None

    def attend(self, layer, q):
        """q: (kv_heads * q_per_kv, d) -> output of the same shape, float32.

        A numpy array runs the CPU path.  A CUDA tensor on the store's
        device, with the sequence on the device, runs PackedAttention on
        the GPU in torch's current stream (mkv_seq_attend_dev: no host
        copy, no synchronization) and returns a CUDA tensor; any other
        tensor, and every one when refine > 1 (two-stage selection runs on
        the CPU only), is copied to the host and back."""
        if _is_tensor(q):
            torch = _torch()
            if (q.is_cuda and self._device_index() == q.device.index and self.on_device()
                    and self.refine <= 1):
                q32 = q.detach().to(torch.float32).contiguous()
                out = torch.empty_like(q32)
                stream = torch.cuda.current_stream(q.device).cuda_stream
                # q32 may be freed on return: the caching allocator reuses
                # it only for later work on this same stream, which runs
                # after these kernels.
                _check(_L.mkv_seq_attend_dev(self._h, layer, q32.data_ptr(),
                                             out.data_ptr(), stream), "attend_dev")
                return out
            out = self.attend(layer, q.detach().to("cpu", torch.float32).numpy())
            return torch.from_numpy(out).to(q.device)
        q = np.ascontiguousarray(q, dtype=np.float32)
        out = np.empty_like(q)
        _check(_L.mkv_seq_attend(self._h, layer, q.ctypes.data, out.ctypes.data, None),
               "attend")
        return out

    def sync(self):
        _check(_L.mkv_seq_sync(self._h), "sync")

    def offload(self, layer):
        """Move the layer's final segments from the store's top tier to
        pinned host memory (asynchronous; mkv_seq_offload).  Returns the
        number of moves submitted."""
        return _check(_L.mkv_seq_offload(self._h, layer), "offload")

    def prefetch(self, layer):
        """Ask the store to bring the blocks the layer's last attend
        selected back into its top tier ahead of the next one
        (asynchronous; mkv_seq_prefetch).  Returns the blocks asked for."""
        return _check(_L.mkv_seq_prefetch(self._h, layer), "prefetch")

    def stats(self):
        st = SeqStats()
        st.size = C.sizeof(st)
        _check(_L.mkv_seq_get_stats(self._h, C.byref(st)), "stats")
        return {f: getattr(st, f) for f, _ in st._fields_ if f != "size"}

    def close(self):
        if getattr(self, "_h", None):
            rc = _L.mkv_seq_close(self._h)
            self._h = None
            _check(rc, "close")

    def __del__(self):
        try:
            self.close()
        except MosaicError:
            pass
