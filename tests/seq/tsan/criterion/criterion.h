/* SPDX-License-Identifier: MIT */
/*
 * A minimal stand-in for <criterion/criterion.h>, used only to run the
 * sequence tests under ThreadSanitizer: Criterion's fork arena cannot be
 * set up under TSan (Snaipe/Criterion#274), so the TSan build compiles the
 * same test source against this header and runs every test in-process.
 * Supports what tests/seq, the store stress test and the nvme tier test
 * use: Test(), cr_assert(), cr_assert_eq/neq/gt/geq/lt/leq/null/str_eq(),
 * cr_skip_test().
 */
#ifndef MKV_MINI_CRITERION_H
#define MKV_MINI_CRITERION_H
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The optional message of an assertion (may be empty, hence no format
 * attribute: an empty format is what cr_assert(x) passes). */
static inline void mini_msg(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

struct mini_test {
	const char *suite, *name;
	void (*fn)(void);
};
extern struct mini_test mini_tests[64];
extern int mini_ntests;

#define Test(suite, name, ...)                                                 \
	static void suite##_##name(void);                                      \
	__attribute__((constructor)) static void mini_reg_##suite##_##name(void) \
	{                                                                      \
		mini_tests[mini_ntests++] =                                    \
			(struct mini_test){#suite, #name, suite##_##name};     \
	}                                                                      \
	static void suite##_##name(void)

#define cr_assert(cond, ...)                                                   \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "%s:%d: assertion failed: %s\n  ",    \
				__FILE__, __LINE__, #cond);                    \
			mini_msg("" __VA_ARGS__);                              \
			exit(1);                                               \
		}                                                              \
	} while (0)
#define cr_assert_eq(a, b, ...) cr_assert((a) == (b), __VA_ARGS__)
#define cr_assert_gt(a, b, ...) cr_assert((a) > (b), __VA_ARGS__)
#define cr_assert_leq(a, b, ...) cr_assert((a) <= (b), __VA_ARGS__)
#define cr_assert_lt(a, b, ...) cr_assert((a) < (b), __VA_ARGS__)
#define cr_assert_geq(a, b, ...) cr_assert((a) >= (b), __VA_ARGS__)
#define cr_assert_neq(a, b, ...) cr_assert((a) != (b), __VA_ARGS__)
#define cr_assert_null(p, ...) cr_assert((p) == NULL, __VA_ARGS__)
#define cr_assert_not_null(p, ...) cr_assert((p) != NULL, __VA_ARGS__)
#define cr_assert_str_eq(a, b, ...) cr_assert(strcmp((a), (b)) == 0, __VA_ARGS__)
/* Criterion's info log: to stderr here. */
#define cr_log_info(...) fprintf(stderr, __VA_ARGS__)
#define cr_skip_test(...)                                                      \
	do {                                                                   \
		mini_msg("skipped: " __VA_ARGS__);                             \
		return;                                                        \
	} while (0)
#endif
