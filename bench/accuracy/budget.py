"""mosaickv's byte budget per vector, without torch (the report and the
fidelity study import it too): a channel share of d read as the bytes of
that many bf16 values, spent on quantized rows (include/mosaickv/compress.h,
mkv_row_bytes; at 25% and 6 bits the library's default r, mkv_seq_default_r)."""

VALUE_BITS = 6  # mosaickv's default value rows (include/mosaickv/sequence.h)


def row_bytes(r, bits=VALUE_BITS):
    """Bytes of one packed row of r values."""
    if not bits:
        return 2 * r
    n = 2 + (r * bits + 7) // 8
    return n + (n & 1)


def budget_r(d, channels, bits=VALUE_BITS):
    """The largest r whose packed row fits the bytes of channels*d bf16
    values (at 25%: 40 of 64)."""
    budget = 2 * channels * d
    return max([r for r in range(1, d + 1) if row_bytes(r, bits) <= budget] or [1])
