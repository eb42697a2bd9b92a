/* SPDX-License-Identifier: MIT */
/* Helpers shared by the io/, tiers/ and policy/ tests. */
#ifndef MKV_TEST_UTIL_H
#define MKV_TEST_UTIL_H

#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

/* A fresh directory on a real file system that supports O_DIRECT (tmpfs
 * does not): /var/tmp first, then /tmp.  Skips the test if neither does. */
static inline void tu_mkdtemp(char *path, size_t cap)
{
	static const char *roots[] = {"/var/tmp", "/tmp"};

	for (unsigned i = 0; i < 2; i++) {
		char probe[512];
		int fd;

		snprintf(path, cap, "%s/mkvtest-XXXXXX", roots[i]);
		if (!mkdtemp(path))
			continue;
		snprintf(probe, sizeof probe, "%s/.probe", path);
		fd = open(probe, O_CREAT | O_RDWR | O_DIRECT, 0600);
		if (fd >= 0) {
			close(fd);
			unlink(probe);
			return;
		}
		rmdir(path);
	}
	cr_skip_test("no file system with O_DIRECT under /var/tmp or /tmp");
}

/* Remove every plain file in @path, then the directory. */
static inline void tu_rmtree(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *de;
	char p[1024];

	if (!d)
		return;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.' && (!de->d_name[1] ||
		    (de->d_name[1] == '.' && !de->d_name[2])))
			continue;
		snprintf(p, sizeof p, "%s/%s", path, de->d_name);
		unlink(p);
	}
	closedir(d);
	rmdir(path);
}

/* Deterministic pseudo-random bytes (xorshift64*). */
static inline void tu_fill(void *buf, size_t len, uint64_t seed)
{
	uint8_t *p = buf;
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;

	for (size_t i = 0; i < len; i++) {
		x ^= x >> 12;
		x ^= x << 25;
		x ^= x >> 27;
		p[i] = (uint8_t)((x * 0x2545F4914F6CDD1Dull) >> 56);
	}
}

/* Compressible bytes: short runs of a few values. */
static inline void tu_fill_compressible(void *buf, size_t len, uint64_t seed)
{
	uint8_t *p = buf;

	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)(((i / 64) * 7 + seed) % 5);
}

#endif
