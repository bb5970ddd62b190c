/* fdlimit_test.c: unit tests of shared/fdlimit.c. */
#include <sys/resource.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "shared/fdlimit.h"

/* A lowered soft limit comes back up to the hard limit. */
static void
test_raise_to_hard(void **state)
{
	struct rlimit rl, saved;
	long got;

	(void)state;
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &saved), 0);
	rl.rlim_max = saved.rlim_max == RLIM_INFINITY || saved.rlim_max > 4096
	    ? 4096
	    : saved.rlim_max;
	rl.rlim_cur = rl.rlim_max / 4;
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
	got = fdlimit_raise();
	assert_int_equal(got, (long)rl.rlim_max);
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
	assert_int_equal((long)rl.rlim_cur, got);
	/* Already at the hard limit: nothing to do, same answer. */
	assert_int_equal(fdlimit_raise(), got);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_raise_to_hard),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
