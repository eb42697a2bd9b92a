"""mosaickv: a thin ctypes binding over libmosaickv.

No compile step: it loads libmosaickv.so (MOSAICKV_LIB, then the source
checkout's build/, then the system).  Arrays are numpy float32/float16 or
anything exposing the buffer protocol; torch tensors go through .numpy()
on the CPU.  Every failure raises MosaicError with the library's text.
"""
import ctypes as C

import numpy as np

from . import _lib
from ._lib import (MKV_DTYPE_BF16, MKV_DTYPE_F16, MKV_DTYPE_F32, MKV_KIND_KEY,
                   MKV_KIND_VALUE, MKV_SELECT_GLOBAL, MKV_SELECT_PER_VECTOR,
                   MKV_SPACE_ORIGINAL, MKV_SPACE_ROTATED)

_L = _lib.load()

__all__ = ["MosaicError", "Segment", "attend_dense", "attend_quest",
           "attend_packed", "strategy_choose", "version"]


class MosaicError(RuntimeError):
    def __init__(self, rc, what):
        self.errno = -rc
        super().__init__(f"{what}: {_L.mkv_strerror(rc).decode()} ({rc})")


def _check(rc, what):
    if rc < 0:
        raise MosaicError(rc, what)
    return rc


def version():
    return _L.mkv_version().decode()


def _as_rows(x, d):
    """Contiguous 2-D float32/float16 view of x with rows of d; dtype code."""
    a = np.ascontiguousarray(x)
    if a.dtype == np.float32:
        dt = MKV_DTYPE_F32
    elif a.dtype == np.float16:
        dt = MKV_DTYPE_F16
    else:
        a = np.ascontiguousarray(a, dtype=np.float32)
        dt = MKV_DTYPE_F32
    if a.ndim != 2 or a.shape[1] != d:
        raise ValueError(f"expected an (n, {d}) array, got {a.shape}")
    return a, dt


class Segment:
    """One encoded segment of K or V (see include/mosaickv/compress.h)."""

    def __init__(self, x, *, kind="key", r=None, g=1, b=16, drop=False,
                 rotate=True, select="per_vector", store="bf16",
                 summary_channels=0, rotation=None, value_bits=0):
        x = np.asarray(x)
        d = x.shape[-1]
        o = _lib.EncodeOpts()
        _check(_L.mkv_encode_opts_init(C.byref(o), C.sizeof(o)), "opts")
        o.d, o.g, o.b = d, g, b
        o.r = d // 4 if r is None else r
        o.drop, o.rotate = int(drop), int(rotate)
        o.select = MKV_SELECT_GLOBAL if select == "global" else MKV_SELECT_PER_VECTOR
        o.kind = MKV_KIND_KEY if kind == "key" else MKV_KIND_VALUE
        o.store_dtype = MKV_DTYPE_F32 if store == "f32" else MKV_DTYPE_BF16
        o.summary_channels = summary_channels
        o.value_bits = value_bits
        self._rot = None
        if rotation is not None:
            self._rot = np.ascontiguousarray(rotation, dtype=np.float32)
            o.rotation = self._rot.ctypes.data_as(C.POINTER(C.c_float))
        a, dt = _as_rows(x, d)
        h = C.c_void_p()
        _check(_L.mkv_segment_encode(C.byref(o), a.ctypes.data, dt, a.shape[0],
                                     C.byref(h)), "encode")
        self._h = h
        self.n, self.d, self.kind = a.shape[0], d, kind

    def __del__(self):
        h = getattr(self, "_h", None)
        if h:
            _L.mkv_segment_destroy(h)
            self._h = None

    @property
    def handle(self):
        return self._h

    def bytes(self):
        b = _lib.SegmentBytes()
        _check(_L.mkv_segment_bytes(self._h, C.byref(b)), "bytes")
        return {f: getattr(b, f) for f, _ in b._fields_}

    def view(self):
        """Shape of the packed segment: n, d, d_keep, r, g, b, n_blocks, ..."""
        v = _lib.PackedView()
        _check(_L.mkv_segment_view(self._h, C.byref(v)), "view")
        return {f: getattr(v, f) for f, _ in v._fields_
                if f not in ("values", "bitmaps", "rotation", "sum_min", "sum_max",
                             "sum_rest")}

    def decode(self, space="original"):
        """Reconstruction (n, d) in the original channels, or the stored
        elements in rotated space (n, d_keep) with space='rotated'."""
        sp = MKV_SPACE_ROTATED if space == "rotated" else MKV_SPACE_ORIGINAL
        w = self.d if sp == MKV_SPACE_ORIGINAL else self.view()["d_keep"]
        out = np.empty((self.n, w), dtype=np.float32)
        _check(_L.mkv_segment_decode(self._h, 0, self.n, sp, out.ctypes.data), "decode")
        return out


def _attn_opts(n_q, d, token_frac, quest_b, scale):
    o = _lib.AttnOpts()
    _check(_L.mkv_attn_opts_init(C.byref(o), C.sizeof(o)), "opts")
    o.n_q, o.d, o.token_frac, o.quest_b = n_q, d, token_frac, quest_b
    o.scale = scale
    return o


def _dense(k, v, d):
    if k is None or len(k) == 0:
        return None, ()
    ka, kdt = _as_rows(k, d)
    va, vdt = _as_rows(v, d)
    if kdt != vdt or ka.shape != va.shape:
        raise ValueError("k and v must have the same shape and dtype")
    return _lib.DenseKV(ka.ctypes.data, va.ctypes.data, kdt, ka.shape[0]), (ka, va)


def _stats(st):
    return {f: getattr(st, f) for f, _ in st._fields_}


def attend_dense(q, k, v, *, scale=0.0):
    """Exact attention of q (n_q, d) over k, v (n, d)."""
    q = np.ascontiguousarray(q, dtype=np.float32)
    n_q, d = q.shape
    o = _attn_opts(n_q, d, 1.0, 16, scale)
    kv, keep = _dense(k, v, d)
    out = np.empty_like(q)
    _check(_L.mkv_attend_dense(C.byref(o), q.ctypes.data, C.byref(kv),
                               out.ctypes.data), "attend_dense")
    return out


def attend_quest(q, k, v, win_k=None, win_v=None, *, token_frac=0.1,
                 block=16, scale=0.0):
    q = np.ascontiguousarray(q, dtype=np.float32)
    n_q, d = q.shape
    o = _attn_opts(n_q, d, token_frac, block, scale)
    h, keep1 = _dense(k, v, d)
    w, keep2 = _dense(win_k, win_v, d)
    out = np.empty_like(q)
    st = _lib.AttnStats()
    _check(_L.mkv_attend_quest(C.byref(o), q.ctypes.data,
                               C.byref(h) if h else None,
                               C.byref(w) if w else None,
                               out.ctypes.data, C.byref(st)), "attend_quest")
    return out, _stats(st)


def attend_packed(q, ksegs, vsegs, win_k=None, win_v=None, *, token_frac=0.1,
                  scale=0.0):
    q = np.ascontiguousarray(q, dtype=np.float32)
    n_q, d = q.shape
    o = _attn_opts(n_q, d, token_frac, 16, scale)
    n = len(ksegs)
    KA = (C.c_void_p * max(n, 1))(*[s.handle for s in ksegs])
    VA = (C.c_void_p * max(n, 1))(*[s.handle for s in vsegs])
    w, keep = _dense(win_k, win_v, d)
    out = np.empty_like(q)
    st = _lib.AttnStats()
    _check(_L.mkv_attend_packed(C.byref(o), q.ctypes.data, KA, VA, n,
                                C.byref(w) if w else None, out.ctypes.data,
                                C.byref(st)), "attend_packed")
    return out, _stats(st)


def strategy_choose(x, *, loss_threshold=0.3, var_threshold=0.5, drop=True):
    """One-shot strategy for the vectors x (n, d): (Strategy dict, R (d, d))."""
    a, dt = _as_rows(x, np.asarray(x).shape[-1])
    d = a.shape[1]
    o = _lib.StrategyOpts()
    _check(_L.mkv_strategy_opts_init(C.byref(o), C.sizeof(o)), "opts")
    o.d, o.drop = d, int(drop)
    o.loss_threshold, o.var_threshold = loss_threshold, var_threshold
    R = np.empty((d, d), dtype=np.float32)
    s = _lib.Strategy()
    _check(_L.mkv_strategy_choose(C.byref(o), a.ctypes.data, dt, a.shape[0],
                                  R.ctypes.data, C.byref(s)), "strategy")
    return {f: getattr(s, f) for f, _ in s._fields_}, R
