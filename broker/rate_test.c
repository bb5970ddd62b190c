/*
 * rate_test.c: the prefill-rate learner: it converges from its first
 * sample and from a wrong start, shrugs off outliers, ignores samples
 * too small to mean anything, follows a worker that changes speed, and a
 * fresh learner (a re-registered worker) starts over.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>

#include <cmocka.h>

#include "broker/rate.h"

/* Relative error of the learned rate against want. */
static double
rel(const struct rate *r, double want)
{
	return fabs(rate_get(r, 0) - want) / want;
}

/* n samples at `tps` tokens/s, with a deterministic +-20 % jitter. */
static void
feed(struct rate *r, double tps, int n)
{
	static const double jitter[5] = { 1.0, 1.2, 0.8, 1.1, 0.9 };
	uint64_t tokens;
	int i;

	for (i = 0; i < n; i++) {
		tokens = 20000;
		assert_true(rate_sample(r, tokens,
		    (uint64_t)(tokens * 1e6 / (tps * jitter[i % 5]))));
	}
}

static void
test_prior_and_first_sample(void **state)
{
	struct rate r;

	(void)state;
	rate_init(&r);
	assert_false(rate_known(&r));
	assert_true(rate_get(&r, 1234.0) == 1234.0);
	/* 12000 tokens in 1.5 s. */
	assert_true(rate_sample(&r, 12000, 1500000));
	assert_true(rate_known(&r));
	assert_true(fabs(rate_get(&r, 1234.0) - 8000) < 1e-6);
}

static void
test_converges(void **state)
{
	struct rate r;

	(void)state;
	rate_init(&r);
	feed(&r, 10000, 50);
	assert_true(rel(&r, 10000) < 0.1);
	/* From a first sample 30x off, 40 true ones bring it within 10 %. */
	rate_init(&r);
	assert_true(rate_sample(&r, 300000, 1000000));
	feed(&r, 10000, 40);
	assert_true(rel(&r, 10000) < 0.1);
	/* A worker that slows down to half is followed. */
	feed(&r, 5000, 40);
	assert_true(rel(&r, 5000) < 0.1);
}

static void
test_ignores_outliers(void **state)
{
	struct rate r;
	double before;

	(void)state;
	rate_init(&r);
	feed(&r, 10000, 30);
	before = rate_get(&r, 0);
	/* A stall (100x slower) and a burst of cache luck (100x faster)
	 * each move it by at most 3^0.1, about 12 %. */
	assert_true(rate_sample(&r, 20000, 200000000));
	assert_true(rate_get(&r, 0) > before * 0.88);
	assert_true(rate_sample(&r, 20000, 20000));
	assert_true(rel(&r, before) < 0.12);
	/* Five stalls in a row still leave it within 2x. */
	feed(&r, 100, 5);
	assert_true(rate_get(&r, 0) > before / 2);
	feed(&r, 10000, 30);
	assert_true(rel(&r, 10000) < 0.1);
	/* Too few tokens or too short: fixed overhead, not prefill. */
	before = rate_get(&r, 0);
	assert_false(rate_sample(&r, RATE_MIN_TOKENS - 1, 1000));
	assert_false(rate_sample(&r, 100000, RATE_MIN_US - 1));
	assert_false(rate_sample(&r, 0, 0));
	assert_true(rate_get(&r, 0) == before);
	assert_int_equal(r.rt_ignored, 3);
	/* Absurd samples are clamped to the bounds. */
	rate_init(&r);
	assert_true(rate_sample(&r, UINT64_MAX, RATE_MIN_US));
	assert_true(rate_get(&r, 0) <= RATE_MAX * 1.000001);
	rate_init(&r);
	assert_true(rate_sample(&r, RATE_MIN_TOKENS, UINT64_MAX));
	assert_true(rate_get(&r, 0) >= RATE_MIN * 0.999999);
}

/* A restarted (re-registered) worker gets a fresh learner. */
static void
test_restart(void **state)
{
	struct rate r;

	(void)state;
	rate_init(&r);
	feed(&r, 10000, 30);
	rate_init(&r);
	assert_false(rate_known(&r));
	assert_true(rate_get(&r, 7500) == 7500);
	/* It relearns from its own first samples, not the old rate. */
	feed(&r, 2000, 5);
	assert_true(rel(&r, 2000) < 0.15);
}

static void
test_median(void **state)
{
	double v[5] = { 9, 1, 5, 7, 3 }, w[4] = { 4, 1, 8, 2 };

	(void)state;
	assert_true(rate_median(v, 5) == 5);
	assert_true(rate_median(w, 4) == 3);
	assert_true(rate_median(v, 1) == v[0]);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_prior_and_first_sample),
		cmocka_unit_test(test_converges),
		cmocka_unit_test(test_ignores_outliers),
		cmocka_unit_test(test_restart),
		cmocka_unit_test(test_median),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
