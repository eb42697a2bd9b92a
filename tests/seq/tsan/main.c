/* SPDX-License-Identifier: MIT */
/* Runs the tests registered through tsan/criterion/criterion.h in order;
 * with an argument, only those whose name contains it.  Exits 1 on the
 * first failure. */
#include <stdio.h>
#include <string.h>
#include "criterion/criterion.h"

struct mini_test mini_tests[64];
int mini_ntests;

int main(int argc, char **argv)
{
	int run = 0;
	for (int i = 0; i < mini_ntests; i++) {
		if (argc > 1 && !strstr(mini_tests[i].name, argv[1]))
			continue;
		fprintf(stderr, "[RUN ] %s::%s\n", mini_tests[i].suite, mini_tests[i].name);
		mini_tests[i].fn();
		run++;
	}
	printf("%d passed, 0 failed\n", run);
	return run ? 0 : 1;
}
