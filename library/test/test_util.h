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

/* A named test case of a multi-case test program (one CTest entry per case). */
struct test_case {
	const char *name;
	void (*fn)(void);
};

/* test_dispatch runs the case argv[1] names and reports it as <prefix><name>; 2 on bad usage. */
static inline int test_dispatch(int argc, char **argv, const char *prefix, const struct test_case *cases,
				size_t n)
{
	if (argc != 2)
		return 2;
	for (size_t i = 0; i < n; i++) {
		if (strcmp(argv[1], cases[i].name) == 0) {
			cases[i].fn();
			char name[64];
			snprintf(name, sizeof(name), "%s%s", prefix, argv[1]);
			return test_finish(name);
		}
	}
	fprintf(stderr, "unknown test %s\n", argv[1]);
	return 2;
}

#endif
