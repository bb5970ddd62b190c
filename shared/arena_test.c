/* arena_test.c: allocation, alignment, large blocks, hook order, reuse. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "shared/arena.h"

static char trace[16];
static size_t ntrace;

static void
hook(void *arg)
{
	trace[ntrace++] = *(char *)arg;
}

static void
test_alloc_zeroed_aligned(void **state)
{
	struct arena a;
	unsigned char *p;
	size_t i, j;

	(void)state;
	arena_init(&a);
	for (i = 1; i < 600; i += 7) {
		p = arena_alloc(&a, i);
		assert_non_null(p);
		assert_int_equal((uintptr_t)p % 16, 0);
		for (j = 0; j < i; j++)
			assert_int_equal(p[j], 0);
		memset(p, 0xab, i);
	}
	assert_true(arena_used(&a) > 0);
	assert_null(arena_alloc(&a, 0));
	assert_null(arena_alloc(&a, SIZE_MAX - 8));
	arena_reset(&a);
	assert_int_equal(arena_used(&a), 0);
}

static void
test_large_keeps_small_block(void **state)
{
	struct arena a;
	char *s1, *big, *s2;

	(void)state;
	arena_init(&a);
	s1 = arena_alloc(&a, 32);
	big = arena_alloc(&a, 1 << 20);
	s2 = arena_alloc(&a, 32);
	assert_non_null(s1);
	assert_non_null(big);
	assert_non_null(s2);
	/* The small ones share the first block. */
	assert_ptr_equal(s2, s1 + 32);
	memset(big, 1, 1 << 20);
	arena_reset(&a);
}

static void
test_hooks_newest_first_once(void **state)
{
	struct arena a;
	char *x, *y;

	(void)state;
	arena_init(&a);
	ntrace = 0;
	x = arena_alloc(&a, 1);
	y = arena_alloc(&a, 1);
	*x = 'x';
	*y = 'y';
	/* Hooks see arena memory: it is freed after they ran. */
	assert_int_equal(arena_cleanup_add(&a, hook, x), 0);
	assert_int_equal(arena_cleanup_add(&a, hook, y), 0);
	arena_reset(&a);
	assert_int_equal(ntrace, 2);
	assert_memory_equal(trace, "yx", 2);
	arena_reset(&a);
	assert_int_equal(ntrace, 2);
	/* Reusable. */
	x = arena_alloc(&a, 8);
	assert_non_null(x);
	arena_reset(&a);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_alloc_zeroed_aligned),
		cmocka_unit_test(test_large_keeps_small_block),
		cmocka_unit_test(test_hooks_newest_first_once),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
