/* SPDX-License-Identifier: MIT */
#include <string.h>
#include "internal.h"

#define MKV_STR2(x) #x
#define MKV_STR(x) MKV_STR2(x)

const char *mkv_version(void)
{
	return MKV_STR(MKV_VERSION_MAJOR) "." MKV_STR(MKV_VERSION_MINOR) "." MKV_STR(MKV_VERSION_PATCH);
}

const char *mkv_strerror(int err)
{
	if (err < 0)
		err = -err;
	switch (err) {
	case 0:
		return "success";
	case MKV_ENONFINITE:
		return "input holds NaN or Inf";
	case MKV_ELAPACK:
		return "eigen-decomposition failed to converge";
	case MKV_ECORRUPT:
		return "stored data failed its checksum or format check";
	case MKV_ESHAPE:
		return "argument shapes do not agree";
	case MKV_ENODEV:
		return "no usable GPU for this operation";
	/* The errno values the library returns, spelled out so that the text
	 * does not depend on the C library's locale or thread-safety of
	 * strerror(). */
	case EINVAL:
		return "invalid argument";
	case ENOMEM:
		return "out of memory";
	case ENOSPC:
		return "no space left (device, tier or buffer full)";
	case EIO:
		return "input/output error";
	case ENOENT:
		return "no such entry";
	case EEXIST:
		return "entry already exists";
	case EBUSY:
		return "resource busy (pinned or moving)";
	case EAGAIN:
		return "resource temporarily unavailable; try again";
	case ENOTSUP:
		return "operation not supported";
	case ERANGE:
		return "value out of range";
	case ECANCELED:
		return "operation canceled";
	case EOVERFLOW:
		return "value too large";
	case ENODATA:
		return "no data available";
	case EBADF:
		return "bad file descriptor";
	case EFAULT:
		return "bad address";
	case ENODEV:
		return "no such device";
	case ESHUTDOWN:
		return "shut down";
	}
	return "unknown error";
}
