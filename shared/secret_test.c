/* secret_test.c: unit tests of shared/secret.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "shared/secret.h"

static void
test_equal(void **state)
{
	(void)state;
	assert_true(secret_equal("k3y", "k3y", 3));
	assert_true(secret_equal("", "", 0));
	/* A prefix, a longer string, one byte off, NULLs: no match. */
	assert_false(secret_equal("k3y", "k3", 2));
	assert_false(secret_equal("k3y", "k3yy", 4));
	assert_false(secret_equal("k3y", "k3z", 3));
	assert_false(secret_equal("k3y", "k3y\0", 4));
	assert_false(secret_equal(NULL, "k3y", 3));
	assert_false(secret_equal("k3y", NULL, 0));
	/* got need not be NUL-terminated. */
	assert_true(secret_equal("abc", "abcdef", 3));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_equal),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
