/* SPDX-License-Identifier: MIT */
/*
 * mosaickv — common definitions: error codes, element types, versioning.
 *
 * Conventions used by every mosaickv header:
 *  - Functions return 0 (or a non-negative count) on success and a negative
 *    errno value on failure.  Library-specific failures use the MKV_E* codes
 *    below, which live outside the range of system errno values.  Any
 *    negative return can be turned into text with mkv_strerror().
 *  - A failed call leaves every object it was handed exactly as it was.
 *  - Options structs are versioned by size: call the matching *_opts_init()
 *    with sizeof the struct you compiled against; fields are only ever
 *    appended, so an older caller keeps working against a newer library.
 *  - Handles are opaque; every *_create() has a *_destroy() that accepts NULL.
 *  - Nothing in the library prints, reads the environment or keeps globals.
 */
#ifndef MOSAICKV_COMMON_H
#define MOSAICKV_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define MKV_API __attribute__((visibility("default")))
#else
#define MKV_API
#endif

#define MKV_VERSION_MAJOR 0
#define MKV_VERSION_MINOR 1
#define MKV_VERSION_PATCH 0

/* Library-specific error codes, returned negated (e.g. -MKV_ENONFINITE). */
enum mkv_error {
	MKV_EFIRST = 10000,
	MKV_ENONFINITE = 10000, /* input holds NaN or Inf */
	MKV_ELAPACK = 10001,    /* the eigen-solver did not converge */
	MKV_ECORRUPT = 10002,   /* stored data failed its checksum or format check */
	MKV_ESHAPE = 10003,     /* shapes of two arguments do not agree */
	MKV_ENODEV = 10004,     /* the operation needs a GPU and none is usable */
	MKV_ELAST = 10004,
};

/* Element types of caller-provided vectors and of packed storage. */
enum mkv_dtype {
	MKV_DTYPE_F32 = 0,
	MKV_DTYPE_F16 = 1,
	MKV_DTYPE_BF16 = 2,
};

/* Size in bytes of one element of @dt, or 0 if @dt is not a valid type. */
MKV_API size_t mkv_dtype_size(enum mkv_dtype dt);

/*
 * Text for a return value of any mosaickv function: system errno values
 * (given negated or not) and MKV_E* codes.  Returns a pointer to a static,
 * immutable string; never NULL.  Thread-safe.
 */
MKV_API const char *mkv_strerror(int err);

/* "MAJOR.MINOR.PATCH" of the library actually linked.  Never NULL. */
MKV_API const char *mkv_version(void);

#ifdef __cplusplus
}
#endif
#endif
