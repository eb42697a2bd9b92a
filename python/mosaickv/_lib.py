"""Low-level ctypes declarations mirroring include/mosaickv/*.h.

Kept one-to-one with the C headers: when a struct gains a field there, it
gains it here, at the end (the C side checks sizeof through opts.size).
"""
import ctypes as C
import ctypes.util
import os
import pathlib

MKV_DTYPE_F32, MKV_DTYPE_F16, MKV_DTYPE_BF16 = 0, 1, 2
MKV_KIND_KEY, MKV_KIND_VALUE = 0, 1
MKV_SELECT_PER_VECTOR, MKV_SELECT_GLOBAL = 0, 1
MKV_SPACE_ROTATED, MKV_SPACE_ORIGINAL = 0, 1


class EncodeOpts(C.Structure):
    _fields_ = [("size", C.c_size_t), ("d", C.c_uint32), ("r", C.c_uint32),
                ("g", C.c_uint32), ("b", C.c_uint32), ("drop", C.c_uint32),
                ("rotate", C.c_uint32), ("select", C.c_int), ("kind", C.c_int),
                ("store_dtype", C.c_int), ("summary_channels", C.c_uint32),
                ("rotation", C.POINTER(C.c_float)), ("value_bits", C.c_uint32)]


class AttnOpts(C.Structure):
    _fields_ = [("size", C.c_size_t), ("n_q", C.c_uint32), ("d", C.c_uint32),
                ("scale", C.c_float), ("token_frac", C.c_double),
                ("quest_b", C.c_uint32), ("refine", C.c_double)]


class DenseKV(C.Structure):
    _fields_ = [("k", C.c_void_p), ("v", C.c_void_p), ("dtype", C.c_int),
                ("n", C.c_size_t)]


class AttnStats(C.Structure):
    _fields_ = [("blocks_total", C.c_size_t), ("blocks_selected", C.c_size_t),
                ("tokens_attended", C.c_size_t), ("bytes_read", C.c_size_t)]


class SegmentBytes(C.Structure):
    _fields_ = [("values", C.c_size_t), ("bitmaps", C.c_size_t),
                ("rotation", C.c_size_t), ("summaries", C.c_size_t),
                ("total", C.c_size_t), ("dense", C.c_size_t)]


class PackedView(C.Structure):
    _fields_ = [("n", C.c_uint32), ("d", C.c_uint32), ("d_keep", C.c_uint32),
                ("r", C.c_uint32), ("g", C.c_uint32), ("b", C.c_uint32),
                ("n_blocks", C.c_uint32), ("bitmap_bytes", C.c_uint32),
                ("summary_channels", C.c_uint32), ("kind", C.c_int),
                ("store_dtype", C.c_int), ("rotated", C.c_uint32),
                ("values", C.c_void_p), ("bitmaps", C.c_void_p),
                ("rotation", C.c_void_p), ("sum_min", C.c_void_p),
                ("sum_max", C.c_void_p), ("value_bits", C.c_uint32),
                ("row_bytes", C.c_uint32), ("sum_rest", C.c_void_p)]


class StrategyOpts(C.Structure):
    _fields_ = [("size", C.c_size_t), ("d", C.c_uint32), ("drop", C.c_uint32),
                ("loss_threshold", C.c_double), ("var_threshold", C.c_double),
                ("g_mask", C.c_uint32), ("b_mask", C.c_uint32),
                ("summary_channels", C.c_uint32)]


class Strategy(C.Structure):
    _fields_ = [("d", C.c_uint32), ("d_keep", C.c_uint32), ("r", C.c_uint32),
                ("g", C.c_uint32), ("b", C.c_uint32), ("loss", C.c_double),
                ("block_var", C.c_double), ("met", C.c_uint32)]


def _candidates():
    env = os.environ.get("MOSAICKV_LIB")
    if env:
        yield env
    # A source checkout: python/mosaickv/ -> <root>/build/libmosaickv.so
    root = pathlib.Path(__file__).resolve().parents[2]
    yield str(root / "build" / "libmosaickv.so")
    found = ctypes.util.find_library("mosaickv")
    if found:
        yield found


def load():
    errors = []
    for path in _candidates():
        try:
            lib = C.CDLL(path)
            break
        except OSError as e:
            errors.append(f"{path}: {e}")
    else:
        raise OSError("libmosaickv not found (set MOSAICKV_LIB or build "
                      "with scripts/build.sh): " + "; ".join(errors))
    P, I, SZ = C.c_void_p, C.c_int, C.c_size_t
    sig = {
        "mkv_strerror": (C.c_char_p, [I]),
        "mkv_version": (C.c_char_p, []),
        "mkv_encode_opts_init": (I, [C.POINTER(EncodeOpts), SZ]),
        "mkv_segment_encode": (I, [C.POINTER(EncodeOpts), P, I, SZ, C.POINTER(P)]),
        "mkv_segment_destroy": (None, [P]),
        "mkv_segment_bytes": (I, [P, C.POINTER(SegmentBytes)]),
        "mkv_segment_decode": (I, [P, SZ, SZ, I, P]),
        "mkv_segment_view": (I, [P, C.POINTER(PackedView)]),
        "mkv_segment_rotation": (I, [P, P]),
        "mkv_attn_opts_init": (I, [C.POINTER(AttnOpts), SZ]),
        "mkv_attend_dense": (I, [C.POINTER(AttnOpts), P, C.POINTER(DenseKV), P]),
        "mkv_attend_quest": (I, [C.POINTER(AttnOpts), P, C.POINTER(DenseKV),
                                 C.POINTER(DenseKV), P, C.POINTER(AttnStats)]),
        "mkv_attend_packed": (I, [C.POINTER(AttnOpts), P, P, P, SZ,
                                  C.POINTER(DenseKV), P, C.POINTER(AttnStats)]),
        "mkv_strategy_opts_init": (I, [C.POINTER(StrategyOpts), SZ]),
        "mkv_strategy_choose": (I, [C.POINTER(StrategyOpts), P, I, SZ, P,
                                    C.POINTER(Strategy)]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib
