/* backoff_test.c: attempts, backoff bounds with jitter, retryable statuses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "frontend/frontend.h"

static void
defaults(struct backoff_policy *rp)
{
	rp->rp_max_attempts = 5;
	rp->rp_initial_ms = 50;
	rp->rp_max_ms = 30000;
	rp->rp_multiplier = 1.5;
	rp->rp_jitter = 0.2;
}

static void
test_backoff_no_jitter(void **state)
{
	struct backoff_policy rp;

	(void)state;
	defaults(&rp);
	assert_int_equal(backoff_ms(&rp, 0, 0.0), 50);
	assert_int_equal(backoff_ms(&rp, 1, 0.0), 75);
	assert_int_equal(backoff_ms(&rp, 2, 0.0), 112);
	assert_int_equal(backoff_ms(&rp, 3, 0.0), 168);
	/* Capped at the maximum. */
	assert_int_equal(backoff_ms(&rp, 40, 0.0), 30000);
	rp.rp_max_ms = 100;
	assert_int_equal(backoff_ms(&rp, 2, 0.0), 100);
}

static void
test_backoff_jitter_bounds(void **state)
{
	struct backoff_policy rp;
	long d, lo = 1000000, hi = 0;
	unsigned a, i;

	(void)state;
	defaults(&rp);
	/* Extremes: d +- round(d * jitter). */
	assert_int_equal(backoff_ms(&rp, 0, 1.0), 60);
	assert_int_equal(backoff_ms(&rp, 0, -1.0), 40);
	assert_int_equal(backoff_ms(&rp, 2, 1.0), 112 + 22);
	/* Out-of-range draws are clamped. */
	assert_int_equal(backoff_ms(&rp, 0, 7.0), 60);
	for (a = 0; a < 4; a++) {
		long base = backoff_ms(&rp, a, 0.0);
		long j = (long)(base * 0.2 + 0.5);

		for (i = 0; i < 2000; i++) {
			d = backoff_ms(&rp, a, backoff_unit());
			assert_true(d >= base - j && d <= base + j);
			if (a == 0) {
				lo = d < lo ? d : lo;
				hi = d > hi ? d : hi;
			}
		}
	}
	/* The draws do spread over the interval. */
	assert_true(lo <= 43 && hi >= 57);
	/* Jitter 1 can reach zero but never below. */
	rp.rp_jitter = 1.0;
	assert_int_equal(backoff_ms(&rp, 0, -1.0), 0);
}

static void
test_retryable(void **state)
{
	static const int yes[] = { 408, 429, 500, 502, 503, 504 };
	static const int no[] = { 200, 201, 400, 401, 404, 422, 501, 505 };
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
		assert_true(backoff_status_retryable(yes[i]));
	for (i = 0; i < sizeof(no) / sizeof(no[0]); i++)
		assert_false(backoff_status_retryable(no[i]));
}

static void
test_policy_from_config(void **state)
{
	struct config cf;
	struct backoff_policy rp;

	(void)state;
	memset(&cf, 0, sizeof(cf));
	cf.cf_retry_max_retries = 3;
	cf.cf_retry_initial_backoff_ms = 10;
	cf.cf_retry_max_backoff_ms = 20;
	cf.cf_retry_backoff_multiplier = 2.0;
	cf.cf_retry_jitter_factor = 0.0;
	backoff_policy_from_config(&rp, &cf);
	assert_int_equal(rp.rp_max_attempts, 3);
	assert_int_equal(backoff_ms(&rp, 1, 0.5), 20);
	cf.cf_disable_retries = true;
	backoff_policy_from_config(&rp, &cf);
	assert_int_equal(rp.rp_max_attempts, 1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_backoff_no_jitter),
		cmocka_unit_test(test_backoff_jitter_bounds),
		cmocka_unit_test(test_retryable),
		cmocka_unit_test(test_policy_from_config),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
