/* SPDX-License-Identifier: MIT */
/*
 * gpu/expand.cuh — the bf16 rows' expansion into dense tiles (bitmap
 * positions to channels), PackedAttention's per-channel cost: attn.cu's
 * staged kernel and bench/kgather_probe.cu (which measures it against
 * another design) run this one code.
 */
#pragma once
#include <stdint.h>

__device__ __forceinline__ void sts128(uint32_t a, uint32_t x, uint32_t y, uint32_t z, uint32_t w)
{
	asm volatile("st.shared.v4.b32 [%0], {%1,%2,%3,%4};" ::"r"(a), "r"(x), "r"(y), "r"(z),
		     "r"(w)
		     : "memory");
}

/* One 16-bit shared store (the low half of @v; the positions' scatter). */
__device__ __forceinline__ void sts16(uint32_t a, uint32_t v)
{
	asm volatile("st.shared.u16 [%0], %1;" ::"r"(a), "r"(v) : "memory");
}

/* One channel of the out-of-place expansion: the value at @p if @wd has
 * @bit (then @p steps on), else 0.  Not volatile, no memory clobber, so
 * the compiler may interleave the groups (their sources and the tile never
 * overlap); the predicate depends on the bitmap, read after the stage's
 * wait, which keeps every load behind that wait. */
__device__ __forceinline__ uint32_t take_bit(uint32_t wd, uint32_t bit, uint32_t &p)
{
	uint32_t v;
	asm("{\n\t.reg .pred q;\n\t.reg .b32 t;\n\t"
	    "and.b32 t, %2, %3;\n\t"
	    "setp.ne.u32 q, t, 0;\n\t"
	    "mov.u32 %0, 0;\n\t"
	    "@q ld.shared.u16 %0, [%1];\n\t"
	    "@q add.u32 %1, %1, 2;\n\t}"
	    : "=r"(v), "+r"(p)
	    : "r"(wd), "r"(bit));
	return v;
}

/* bf16 rows: the staged row's r values (shared @src) expanded to channels
 * [0, nch) of tile row @dst, out of place.  Each group of 8 channels
 * starts at its own value index (popcounts of the bits below it): twelve
 * short chains instead of one of d_keep dependent steps (ncu: the in-place
 * walk's pointer chain was the top stall of the staged kernel).  FIXED:
 * exactly NG groups, no test per group (bits past d_keep are clear, so
 * groups past nch write zeros): straight-line code the compiler may
 * interleave; a test per group made each group its own basic block, so
 * the chains ran one after another (cuobjdump, tenth session). */
/* Start indices of the bitmap words' values: base[i] = set bits in words
 * below i, counting the first NW words only. */
template <int NW>
__device__ __forceinline__ void word_bases(const uint32_t (&bm)[4], uint32_t (&base)[4])
{
	static_assert(NW <= 4, "word_bases: at most 4 words");
	base[0] = 0;
#pragma unroll
	for (int i = 1; i < 4; i++)
		base[i] = base[i - 1] + (i - 1 < NW ? __popc(bm[i - 1]) : 0u);
}

/* word_bases for NG groups of 8 channels at g = 1: (NG + 3) / 4 words. */
template <int NG>
__device__ __forceinline__ void expand_bases(const uint32_t (&bm)[4], uint32_t (&base)[4])
{
	word_bases<(NG + 3) / 4>(bm, base);
}

/* Group @gi (channels 8 gi .. 8 gi + 7) of a row: its values from shared
 * @src at its start index, zeros where @bm has no bit, to shared @dst. */
__device__ __forceinline__ void expand_group(uint32_t src, uint32_t dst, const uint32_t (&bm)[4],
					     const uint32_t (&base)[4], int gi)
{
	const int sh = (gi & 3) * 8;
	const uint32_t wd = bm[gi >> 2];
	uint32_t p = src + 2 * (base[gi >> 2] + __popc(wd & ((1u << sh) - 1u)));
	uint32_t v[8];
#pragma unroll
	for (int e = 0; e < 8; e++)
		v[e] = take_bit(wd, 1u << (sh + e), p);
	sts128(dst + 16 * gi, __byte_perm(v[0], v[1], 0x5410), __byte_perm(v[2], v[3], 0x5410),
	       __byte_perm(v[4], v[5], 0x5410), __byte_perm(v[6], v[7], 0x5410));
}

template <int NG, bool FIXED>
__device__ __forceinline__ void expand_direct(uint32_t src, uint32_t dst, const uint32_t (&bm)[4],
					      uint32_t nch)
{
	uint32_t base[4];
	expand_bases<NG>(bm, base);
#pragma unroll
	for (int gi = 0; gi < NG; gi++) {
		if (!FIXED && (uint32_t)gi * 8 >= nch)
			continue;
		expand_group(src, dst, bm, base, gi);
	}
}

/* g = 2: one bit a pair of channels, stored as one 32-bit word (channel
 * 2j in the low half), so a group of 8 channels takes 4 bit tests and 4
 * predicated 32-bit loads where g = 1 takes 8 of each and 4 byte
 * permutes: the expansion's loads (most of the shared-memory pipe's
 * wavefronts in the staged kernel, gpu/NOTES.md) halve.  The row's
 * values start 4-byte aligned (staged rows are). */
__device__ __forceinline__ uint32_t take_pair(uint32_t wd, uint32_t bit, uint32_t &p)
{
	uint32_t v;
	asm("{\n\t.reg .pred q;\n\t.reg .b32 t;\n\t"
	    "and.b32 t, %2, %3;\n\t"
	    "setp.ne.u32 q, t, 0;\n\t"
	    "mov.u32 %0, 0;\n\t"
	    "@q ld.shared.u32 %0, [%1];\n\t"
	    "@q add.u32 %1, %1, 4;\n\t}"
	    : "=r"(v), "+r"(p)
	    : "r"(wd), "r"(bit));
	return v;
}

/* The g = 2 expansion of a row: @bm holds one bit a pair (bit j: channels
 * 2j, 2j + 1), so group @gi of 8 channels is bits 4 gi .. 4 gi + 3 of word
 * gi / 8; otherwise expand_direct's contract (NG groups, FIXED: no test
 * per group, bits past d_keep / 2 clear). */
template <int NG, bool FIXED>
__device__ __forceinline__ void expand_direct_g2(uint32_t src, uint32_t dst,
						 const uint32_t (&bm)[4], uint32_t nch)
{
	uint32_t base[4];
	word_bases<(NG + 7) / 8>(bm, base); /* 4 bits a group: 8 groups a word */
#pragma unroll
	for (int gi = 0; gi < NG; gi++) {
		if (!FIXED && (uint32_t)gi * 8 >= nch)
			continue;
		const int sh = (gi & 7) * 4;
		const uint32_t wd = bm[gi >> 3];
		uint32_t p = src + 4 * (base[gi >> 3] + __popc(wd & ((1u << sh) - 1u)));
		uint32_t v[4];
#pragma unroll
		for (int e = 0; e < 4; e++)
			v[e] = take_pair(wd, 1u << (sh + e), p);
		sts128(dst + 16 * gi, v[0], v[1], v[2], v[3]);
	}
}
