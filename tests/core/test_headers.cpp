// SPDX-License-Identifier: MIT
// The public headers, used from C++: the per-header translation units
// (generated from header_alone.c.in, built as C and as C++ with -Werror)
// link, and the umbrella header's API is callable with C linkage.
#include <mosaickv.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

extern "C" {
int mkv_header_alone_umbrella_c(void);
int mkv_header_alone_umbrella_cpp(void);
int mkv_header_alone_common_c(void);
int mkv_header_alone_common_cpp(void);
int mkv_header_alone_compress_c(void);
int mkv_header_alone_compress_cpp(void);
int mkv_header_alone_attention_c(void);
int mkv_header_alone_attention_cpp(void);
}

static int failures;

static void check(bool ok, const char *what)
{
	if (!ok) {
		std::fprintf(stderr, "test_headers: FAILED: %s\n", what);
		failures++;
	}
}

int main()
{
	int (*const fns[])(void) = {
		mkv_header_alone_umbrella_c,   mkv_header_alone_umbrella_cpp,
		mkv_header_alone_common_c,     mkv_header_alone_common_cpp,
		mkv_header_alone_compress_c,   mkv_header_alone_compress_cpp,
		mkv_header_alone_attention_c,  mkv_header_alone_attention_cpp,
	};
	int first = fns[0]();
	for (auto f : fns)
		check(f() == first, "C and C++ see the same enum size");

	char want[32];
	std::snprintf(want, sizeof want, "%d.%d.%d", MKV_VERSION_MAJOR,
		      MKV_VERSION_MINOR, MKV_VERSION_PATCH);
	check(std::strcmp(mkv_version(), want) == 0, "mkv_version matches the header");
	check(std::strcmp(mkv_strerror(-EINVAL), mkv_strerror(-MKV_ECORRUPT)) != 0,
	      "mkv_strerror distinguishes codes");

	mkv_encode_opts eo;
	std::memset(&eo, 0, sizeof eo);
	check(mkv_encode_opts_init(&eo, sizeof eo) == 0, "mkv_encode_opts_init from C++");
	check(eo.size == sizeof eo && eo.d == 128 && eo.r == 32 && eo.g == 1 &&
		      eo.b == 16 && eo.rotate == 1 && eo.drop == 0 &&
		      eo.store_dtype == MKV_DTYPE_BF16 && eo.rotation == nullptr,
	      "encode defaults as documented");
	mkv_strategy_opts so;
	check(mkv_strategy_opts_init(&so, sizeof so) == 0, "mkv_strategy_opts_init from C++");
	check(so.d == 128 && so.drop == 1 && so.loss_threshold == 0.3 &&
		      so.var_threshold == 0.5,
	      "strategy defaults as documented");
	mkv_attn_opts ao;
	check(mkv_attn_opts_init(&ao, sizeof ao) == 0, "mkv_attn_opts_init from C++");
	check(ao.n_q == 1 && ao.d == 128 && ao.scale == 0.0f && ao.token_frac == 0.1 &&
		      ao.quest_b == 16,
	      "attention defaults as documented");

	// a tiny segment, encoded and decoded from C++
	float x[4 * 64];
	for (int i = 0; i < 4 * 64; i++)
		x[i] = (float)((i * 37) % 17) - 8.0f;
	eo.d = 64;
	eo.r = 16;
	mkv_segment *s = nullptr;
	check(mkv_segment_encode(&eo, x, MKV_DTYPE_F32, 4, &s) == 0 && s, "encode from C++");
	mkv_packed_view v;
	check(s && mkv_segment_view(s, &v) == 0 && v.n == 4 && v.r == 16, "view from C++");
	mkv_segment_destroy(s);
	mkv_segment_destroy(nullptr);

	if (failures)
		return 1;
	std::printf("test_headers: all public headers compile alone as C and C++\n");
	return 0;
}
