/* Minimal assertion helpers for the library's C tests. A failed CHECK prints what a user
 * would see differ, counts, and the test exits non-zero at the end. */
#ifndef VGPU_TEST_UTIL_H
#define VGPU_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures;

#define CHECK(cond, ...)                                                                 \
	do {                                                                             \
		if (!(cond)) {                                                           \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);  \
			fprintf(stderr, __VA_ARGS__);                                    \
			fprintf(stderr, "\n");                                           \
			test_failures++;                                                 \
		}                                                                        \
	} while (0)

#define CHECK_EQ_U64(a, b)                                                                       \
	CHECK((unsigned long long)(a) == (unsigned long long)(b), "%s = %llu, want %llu", #a,    \
	      (unsigned long long)(a), (unsigned long long)(b))

#define CHECK_EQ_INT(a, b) CHECK((long long)(a) == (long long)(b), "%s = %lld, want %lld", #a, \
				 (long long)(a), (long long)(b))

static inline const char *test_or_null(const char *s);
static inline int test_contains(const char *hay, const char *needle)
{
	return hay != NULL && strstr(hay, needle) != NULL;
}
#define CHECK_STR_CONTAINS(hay, needle)                                                        \
	CHECK(test_contains((hay), (needle)), "\"%s\" does not contain \"%s\"", test_or_null(hay), (needle))
static inline const char *test_or_null(const char *s) { return s ? s : "(null)"; }

static inline int test_finish(const char *name)
{
	if (test_failures) {
		fprintf(stderr, "%s: %d check(s) failed\n", name, test_failures);
		return 1;
	}
	printf("%s: ok\n", name);
	return 0;
}

#endif
