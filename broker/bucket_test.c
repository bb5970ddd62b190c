/*
 * bucket_test.c: the bucket policy's state (policies.md §10.3): initial
 * ranges, the worked recomputation examples, range lookup, the balance
 * override over available workers, the 5 s window and membership changes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "shared/log.h"

#include "broker/bucket.h"

static const struct bucket_member members3[] = {
	{ "http://p0:8000", 0 },
	{ "http://p1:8000", 1 },
	{ "http://p2:8000", 2 },
};

/* Candidates are ids 0..n-1 at their own position, minus a mask. */
static unsigned unavailable;

static int
cand(void *arg, uint64_t id, const char *url)
{
	(void)arg;
	(void)url;
	if (id < 32 && (unavailable & (1u << id)) != 0)
		return -1;
	return (int)id;
}

static uint32_t rand_value;

static uint32_t
fixed_rand(uint32_t n)
{
	return rand_value % n;
}

static struct bucket *
make3(uint64_t abs, double rel)
{
	struct bucket_conf c;
	struct bucket *b;

	bucket_conf_default(&c);
	c.bc_abs_threshold = abs;
	c.bc_rel_threshold = rel;
	b = bucket_new(&c);
	bucket_set_members(b, members3, 3);
	return b;
}

static void
assert_ranges(const struct bucket *b, const uint64_t *lohi, size_t n)
{
	struct bucket_range r[8];
	size_t i;

	assert_int_equal(bucket_ranges(b, r, 8), n);
	for (i = 0; i < n; i++) {
		assert_true(r[i].br_lo == lohi[2 * i]);
		assert_true(r[i].br_hi == lohi[2 * i + 1]);
		assert_true(r[i].br_id == i);
	}
}

static int
pick(struct bucket *b, uint64_t size, uint64_t now)
{
	struct bucket_pick p;

	return bucket_select(b, size, 3, cand, NULL, fixed_rand, now, &p);
}

static void
test_initial_ranges(void **state)
{
	static const uint64_t r3[] = { 0, 1364, 1365, 2729, 2730,
		BUCKET_INFINITY };
	static const uint64_t r1[] = { 0, BUCKET_INFINITY };
	struct bucket *b;

	(void)state;
	b = make3(32, 1.0001);
	assert_ranges(b, r3, 3);
	/* No history: a tick changes nothing. */
	bucket_tick(b);
	assert_ranges(b, r3, 3);
	bucket_set_members(b, members3, 1);
	assert_ranges(b, r1, 1);
	bucket_free(b);
	bucket_free(NULL);
}

static void
test_worked_recomputation(void **state)
{
	static const uint64_t sizes[] = { 5, 10, 15, 20, 24, 26 };
	static const uint64_t e1[] = { 0, 20, 21, 26, 27, BUCKET_INFINITY };
	static const uint64_t e2[] = { 0, 20, 21, 27, 28, BUCKET_INFINITY };
	static const uint64_t e3[] = { 0, 7, 8, 10, 11, BUCKET_INFINITY };
	struct bucket *b;
	size_t i;

	(void)state;
	b = make3(32, 1.0001);
	for (i = 0; i < 6; i++)
		pick(b, sizes[i], 1000);
	assert_int_equal(bucket_total(b), 100);
	/* total 100, 3 workers: new = 33. */
	bucket_tick(b);
	assert_ranges(b, e1, 3);
	/* Same history: new = old, ranges kept. */
	bucket_tick(b);
	assert_ranges(b, e1, 3);
	/* One request of 20 after the window: the rest leaves; new 6. */
	pick(b, 20, 7000);
	assert_int_equal(bucket_total(b), 20);
	bucket_tick(b);
	assert_ranges(b, e2, 3);
	/* Then only a 7: new 2. */
	pick(b, 7, 13000);
	assert_int_equal(bucket_total(b), 7);
	bucket_tick(b);
	assert_ranges(b, e3, 3);
	bucket_free(b);
}

static void
test_keep_within_twice(void **state)
{
	static const uint64_t e1[] = { 0, 20, 21, 26, 27, BUCKET_INFINITY };
	static const uint64_t sizes[] = { 5, 10, 15, 20, 24, 26 };
	struct bucket *b;
	size_t i;

	(void)state;
	b = make3(32, 1.0001);
	for (i = 0; i < 6; i++)
		pick(b, sizes[i], 0);
	bucket_tick(b); /* new 33 */
	assert_ranges(b, e1, 3);
	/* 60 more: total 160, new 53 <= 66: the ranges stay. */
	pick(b, 60, 100);
	bucket_tick(b);
	assert_ranges(b, e1, 3);
	/* 40 more: total 200, new 66 = 2 * 33: kept. 300 more: total 500,
	 * new 166 > 66: rebuilt. */
	pick(b, 40, 200);
	bucket_tick(b);
	assert_ranges(b, e1, 3);
	pick(b, 300, 300);
	bucket_tick(b);
	{
		/* sorted {5,10,15,20,24,26,40,60,300}, new 166: 5..60 sum 200
		 * reaches 166 at 60; 300 reaches at 300. */
		static const uint64_t e[] = { 0, 60, 61, 300, 301,
			BUCKET_INFINITY };

		assert_ranges(b, e, 3);
	}
	bucket_free(b);
}

static void
test_range_lookup(void **state)
{
	static const uint64_t sizes[] = { 5, 10, 15, 20, 24, 26 };
	struct bucket_pick p;
	struct bucket *b;
	size_t i;

	(void)state;
	/* An unreachable absolute gate: never imbalanced. */
	b = make3(UINT64_MAX, 1.0001);
	assert_int_equal(pick(b, 0, 0), 0);
	assert_int_equal(pick(b, 1364, 0), 0);
	assert_int_equal(pick(b, 1365, 0), 1);
	assert_int_equal(pick(b, 2729, 0), 1);
	assert_int_equal(pick(b, 2730, 0), 2);
	assert_int_equal(pick(b, UINT64_MAX, 0), 2);
	for (i = 0; i < 6; i++)
		pick(b, sizes[i], 10000);
	bucket_tick(b); /* [0,20] [21,26] [27,inf] */
	assert_int_equal(pick(b, 20, 10000), 0);
	assert_int_equal(pick(b, 21, 10000), 1);
	assert_int_equal(pick(b, 26, 10000), 1);
	assert_int_equal(pick(b, 27, 10000), 2);
	/* The owner is unavailable: uniform among the candidates. */
	unavailable = 1u << 1;
	rand_value = 2;
	assert_int_equal(
	    bucket_select(b, 22, 3, cand, NULL, fixed_rand, 10000, &p), 2);
	assert_int_equal(p.bp_reason, BUCKET_RANDOM);
	unavailable = 0;
	assert_int_equal(
	    bucket_select(b, 22, 3, cand, NULL, fixed_rand, 10000, &p), 1);
	assert_int_equal(p.bp_reason, BUCKET_RANGE);
	assert_string_equal(bucket_reason_name(p.bp_reason), "range");
	bucket_free(b);
}

static void
test_balance(void **state)
{
	struct bucket_pick p;
	struct bucket *b;

	(void)state;
	b = make3(32, 1.0001);
	/* 100 chars to p0 (its range); sums {100, 0, 0}: imbalanced, the
	 * first smallest is p1. */
	assert_int_equal(pick(b, 100, 0), 0);
	assert_int_equal(bucket_window_sum(b, "http://p0:8000"), 100);
	assert_int_equal(
	    bucket_select(b, 100, 3, cand, NULL, fixed_rand, 0, &p), 1);
	assert_int_equal(p.bp_reason, BUCKET_IMBALANCE);
	assert_int_equal(bucket_window_sum(b, "http://p1:8000"), 100);
	/* Sums {100, 100, 0}: p2. Then {100, 100, 100}: balanced, range. */
	assert_int_equal(pick(b, 100, 0), 2);
	assert_int_equal(
	    bucket_select(b, 3000, 3, cand, NULL, fixed_rand, 0, &p), 2);
	assert_int_equal(p.bp_reason, BUCKET_RANGE);
	/* Sums {100, 100, 3100}: max - min 3000 > 32, 3100 > 100.01. */
	assert_int_equal(pick(b, 3000, 0), 0);
	/* Min and max over available workers only: p0 and p1 out, only p2
	 * counts, balanced; size 10 → p0's range, unavailable → random. */
	unavailable = (1u << 0) | (1u << 1);
	rand_value = 5;
	assert_int_equal(bucket_select(b, 10, 3, cand, NULL, fixed_rand, 0, &p),
	    2);
	assert_int_equal(p.bp_reason, BUCKET_RANDOM);
	/* The random pick is recorded for the worker it chose. */
	assert_int_equal(bucket_window_sum(b, "http://p2:8000"), 3110);
	/* p1 out: sums {3100, -, 3110} (p0 got the 3000): within abs? 10
	 * apart → balanced → range of 5000 is p2's. */
	unavailable = 1u << 1;
	assert_int_equal(
	    bucket_select(b, 5000, 3, cand, NULL, fixed_rand, 0, &p), 2);
	assert_int_equal(p.bp_reason, BUCKET_RANGE);
	unavailable = 0;
	/* Relative gate alone (abs 0, rel 1.5), p2 out: {100, 0} is
	 * imbalanced, {100, 140} is not (140 <= 150). */
	bucket_free(b);
	b = make3(0, 1.5);
	unavailable = 1u << 2;
	assert_int_equal(pick(b, 100, 0), 0);
	assert_int_equal(
	    bucket_select(b, 140, 3, cand, NULL, fixed_rand, 0, &p), 1);
	assert_int_equal(p.bp_reason, BUCKET_IMBALANCE);
	assert_int_equal(
	    bucket_select(b, 2000, 3, cand, NULL, fixed_rand, 0, &p), 1);
	assert_int_equal(p.bp_reason, BUCKET_RANGE);
	unavailable = 0;
	bucket_free(b);
}

static void
test_window(void **state)
{
	struct bucket *b;

	(void)state;
	b = make3(UINT64_MAX, 1.0001);
	pick(b, 10, 1000);
	pick(b, 2000, 3000);
	/* Exactly 5 s old stays; strictly older leaves. */
	pick(b, 1, 6000);
	assert_int_equal(bucket_total(b), 2011);
	assert_int_equal(bucket_window_sum(b, "http://p0:8000"), 11);
	pick(b, 1, 6001);
	assert_int_equal(bucket_total(b), 2002);
	assert_int_equal(bucket_window_sum(b, "http://p0:8000"), 2);
	assert_int_equal(bucket_window_sum(b, "http://p1:8000"), 2000);
	pick(b, 1, 100000);
	assert_int_equal(bucket_total(b), 1);
	assert_int_equal(bucket_window_sum(b, "http://p1:8000"), 0);
	bucket_free(b);
}

static void
test_history_growth(void **state)
{
	struct bucket *b;
	int i;

	(void)state;
	b = make3(UINT64_MAX, 1.0001);
	for (i = 0; i < 3000; i++)
		pick(b, 3, (uint64_t)i);
	assert_int_equal(bucket_total(b), 9000);
	/* Half of them leave the window, then all. */
	pick(b, 0, 1500 + 5000);
	assert_int_equal(bucket_total(b), 3 * 1500);
	pick(b, 0, 100000);
	assert_int_equal(bucket_total(b), 0);
	assert_int_equal(bucket_window_sum(b, "http://p0:8000"), 0);
	bucket_free(b);
}

static void
test_membership(void **state)
{
	static const struct bucket_member next[] = {
		{ "http://p2:8000", 0 },
		{ "http://p0:8000", 1 },
		{ "http://p3:8000", 2 },
	};
	static const uint64_t r3[] = { 0, 1364, 1365, 2729, 2730,
		BUCKET_INFINITY };
	struct bucket *b;

	(void)state;
	b = make3(UINT64_MAX, 1.0001);
	pick(b, 100, 0);
	pick(b, 1500, 0);
	pick(b, 3000, 0);
	bucket_tick(b);
	/* p1 leaves, p3 joins, order changes: survivors keep their sums,
	 * the ranges are split again and p1's request stays in the total. */
	bucket_set_members(b, next, 3);
	assert_ranges(b, r3, 3);
	assert_int_equal(bucket_window_sum(b, "http://p2:8000"), 3000);
	assert_int_equal(bucket_window_sum(b, "http://p0:8000"), 100);
	assert_int_equal(bucket_window_sum(b, "http://p3:8000"), 0);
	assert_int_equal(bucket_window_sum(b, "http://p1:8000"), 0);
	assert_int_equal(bucket_total(b), 4600);
	/* Departed entries leave the window without touching any sum. */
	pick(b, 1, 10000);
	assert_int_equal(bucket_total(b), 1);
	assert_int_equal(bucket_window_sum(b, "http://p2:8000"), 1);
	assert_int_equal(bucket_window_sum(b, "http://p0:8000"), 0);
	/* The next tick rebuilds from the history (last share reset). */
	bucket_tick(b);
	{
		static const uint64_t e[] = { 0, 1, 2, 2, 3, BUCKET_INFINITY };

		assert_ranges(b, e, 3);
	}
	bucket_set_members(b, NULL, 0);
	assert_int_equal(bucket_ranges(b, NULL, 0), 0);
	rand_value = 1;
	assert_int_equal(pick(b, 5, 10000), 1);
	bucket_tick(b);
	bucket_free(b);
}

static void
test_size_and_edges(void **state)
{
	struct bucket_pick p;

	(void)state;
	assert_int_equal(bucket_request_size(true, 0, "abc", 3), 0);
	assert_int_equal(bucket_request_size(true, 17, NULL, 0), 17);
	assert_int_equal(bucket_request_size(false, 0, "h\xc3\xa9llo", 6), 5);
	assert_int_equal(bucket_request_size(false, 0, "\xf0\x9f\x98\x80!", 5),
	    2);
	assert_int_equal(bucket_request_size(false, 0, NULL, 0), 0);
	/* No bucket for the model: uniform; no candidates: nothing. */
	rand_value = 4;
	assert_int_equal(
	    bucket_select(NULL, 5, 3, cand, NULL, fixed_rand, 0, &p), 1);
	assert_int_equal(p.bp_reason, BUCKET_RANDOM);
	assert_int_equal(
	    bucket_select(NULL, 5, 0, cand, NULL, fixed_rand, 0, &p), -1);
	assert_int_equal(p.bp_reason, BUCKET_NONE);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_initial_ranges),
		cmocka_unit_test(test_worked_recomputation),
		cmocka_unit_test(test_keep_within_twice),
		cmocka_unit_test(test_range_lookup),
		cmocka_unit_test(test_balance),
		cmocka_unit_test(test_window),
		cmocka_unit_test(test_history_growth),
		cmocka_unit_test(test_membership),
		cmocka_unit_test(test_size_and_edges),
	};

	log_init("bucket_test", LOG_LEVEL_WARN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
