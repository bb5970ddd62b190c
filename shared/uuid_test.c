/* uuid_test.c: unit tests of shared/uuid.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "shared/uuid.h"

static void
test_v7(void **state)
{
	char a[UUID_STR_LEN], b[UUID_STR_LEN];
	struct timespec ts;
	uint64_t ms, got;

	(void)state;
	clock_gettime(CLOCK_REALTIME, &ts);
	ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
	uuid_v7(a);
	uuid_v7(b);
	assert_int_equal(strlen(a), 36);
	assert_true(uuid_canonical(a));
	assert_true(uuid_valid(a));
	assert_string_not_equal(a, b);
	/* Version 7, RFC variant, the time in the first 48 bits. */
	assert_int_equal(a[14], '7');
	assert_non_null(strchr("89ab", a[19]));
	got = strtoull((char[]) { a[0], a[1], a[2], a[3], a[4], a[5], a[6],
	                   a[7], a[9], a[10], a[11], a[12], 0 },
	    NULL, 16);
	assert_true(got >= ms && got < ms + 5000);
}

static void
test_valid(void **state)
{
	(void)state;
	assert_true(uuid_valid("0191e2a4-6b7c-7d3e-8f00-0123456789ab"));
	assert_true(uuid_valid("0191E2A4-6B7C-7D3E-8F00-0123456789AB"));
	assert_true(uuid_valid("0191e2a46b7c7d3e8f000123456789ab"));
	assert_true(uuid_valid("{0191e2a4-6b7c-7d3e-8f00-0123456789ab}"));
	assert_true(
	    uuid_valid("urn:uuid:0191e2a4-6b7c-7d3e-8f00-0123456789ab"));
	assert_false(uuid_canonical("0191E2A4-6B7C-7D3E-8F00-0123456789AB"));
	assert_false(uuid_canonical("0191e2a46b7c7d3e8f000123456789ab"));
	assert_false(uuid_valid("not-a-uuid"));
	assert_false(uuid_valid("a3c5f1d2e4b60718"));
	assert_false(uuid_valid("0191e2a4-6b7c-7d3e-8f00-0123456789a"));
	assert_false(uuid_valid("0191e2a4x6b7c-7d3e-8f00-0123456789ab"));
	assert_false(uuid_valid("0191e2a4-6b7c-7d3e-8f00-0123456789ag"));
	assert_false(uuid_valid("{0191e2a4-6b7c-7d3e-8f00-0123456789ab"));
	assert_false(uuid_valid(""));
	assert_false(uuid_valid(NULL));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_v7),
		cmocka_unit_test(test_valid),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
