/*
 * scorer_test.c: the expected-wait scorer of policies.md §2 with the worked
 * numbers of the spec, its degradation rules, the waiting cap, stale
 * reports, credit, random tie-breaking and power_of_two's pairs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "shared/log.h"

#include "broker/scorer.h"

#define EPS 1e-9
/* cmocka 1.1 compares only floats; scores need doubles. */
#define assert_near(a, b, eps) assert_true(fabs((a) - (b)) <= (eps))

/* Deterministic xorshift64* for the statistical tests. */
static uint64_t test_rng_state = 0x2545f4914f6cdd1dULL;

static uint32_t
test_rand(uint32_t n)
{
	uint64_t x = test_rng_state;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	test_rng_state = x;
	return (uint32_t)(((x * 0x2545f4914f6cdd1dULL) >> 32) * n >> 32);
}

/* Scripted draws: each call returns the next value mod n. */
static uint32_t script[8];
static size_t script_pos;

static uint32_t
script_rand(uint32_t n)
{
	return script[script_pos++ % 8] % n;
}

static void
report(struct scorer *s, uint64_t id, int64_t waiting, int64_t tokens,
    double tp, double k, uint64_t now)
{
	struct scorer_report r;

	r.sr_waiting_reqs = waiting;
	r.sr_waiting_uncached_tokens = tokens;
	r.sr_gen_throughput = tp;
	r.sr_token_usage = k;
	scorer_report(s, id, &r, now);
}

/* Score of one candidate as scorer_select sees it alone. */
static double
score_alone(struct scorer *s, uint64_t id, uint64_t in_flight)
{
	struct scorer_cand c = { id, in_flight };
	struct scorer_pick p;
	uint64_t t, r, t2, r2;
	int had;

	/* Scoring credits the winner: undo it by measuring before/after. */
	had = scorer_credit(s, id, &t, &r);
	assert_int_equal(scorer_select(s, &c, 1, 0, 0, 0, &p), 0);
	if (had == 0) {
		assert_int_equal(scorer_credit(s, id, &t2, &r2), 0);
		assert_true(t2 == t && r2 == r + 1);
	}
	return p.sp_score;
}

static void
test_worked_numbers(void **state)
{
	struct scorer_tunables t;
	struct scorer *s;
	struct scorer_cand c[2] = { { 1, 0 }, { 2, 0 } };
	struct scorer_pick p;

	(void)state;
	s = scorer_new(NULL, test_rand);
	/* a: 8000 queued tokens @100 tok/s, k=0.2 → 80.0375 s. */
	report(s, 1, 0, 8000, 100, 0.2, 0);
	report(s, 2, 0, 1000, 100, 0.2, 0);
	assert_int_equal(scorer_select(s, c, 2, 0, 0, 0, &p), 1);
	assert_int_equal(p.sp_kind, SCORER_REPORTING);
	assert_near(p.sp_score, 10.0375, EPS);
	assert_near(score_alone(s, 1, 0), 80.0375, EPS);

	/* gen_throughput 0 on both: T₀ = 2000 → 5 s vs 0.5 s. */
	report(s, 1, 0, 10000, 0, 0, 0);
	report(s, 2, 0, 1000, 0, 0, 0);
	assert_int_equal(scorer_select(s, c, 2, 0, 0, 0, &p), 1);
	assert_near(p.sp_score, 0.5, EPS);
	assert_near(score_alone(s, 1, 0), 5.0, EPS);

	/* 64 waiting, no token count: 64 * 1024 / 100 ≈ 655 s. */
	report(s, 1, 64, 0, 100, 0, 0);
	assert_near(score_alone(s, 1, 0), 655.36, EPS);
	/* Negative counts are read as zero; usage clamps to 0.999. */
	report(s, 1, -3, -5, 100, 2.0, 0);
	assert_near(score_alone(s, 1, 0), 0.15 * 0.999 / 0.001, 1e-6);
	scorer_free(s);

	/* λ = 2, k = 0.98 → barrier 2 · 0.98 / 0.02 = 98 s. */
	scorer_tunables_default(&t);
	t.st_kv_pressure_weight = 2;
	s = scorer_new(&t, test_rand);
	report(s, 1, 0, 0, 100, 0.98, 0);
	assert_near(score_alone(s, 1, 0), 98.0, 1e-9);
	scorer_free(s);
}

static void
test_cap(void **state)
{
	struct scorer_tunables t;
	struct scorer *s;
	struct scorer_cand c[3] = { { 1, 0 }, { 2, 0 }, { 3, 50 } };
	struct scorer_pick p;
	uint64_t tok, req;

	(void)state;
	scorer_tunables_default(&t);
	t.st_max_waiting_requests = 48;
	s = scorer_new(&t, test_rand);
	/* a reports 64 waiting (best score otherwise): excluded first. */
	report(s, 1, 64, 1, 1e9, 0, 0);
	report(s, 2, 10, 50000, 100, 0, 0);
	assert_int_equal(scorer_select(s, c, 2, 0, 0, 0, &p), 1);
	/* Capped reporter with a non-reporting peer → the peer. */
	assert_int_equal(scorer_least_load(s,
	                     (struct scorer_cand[]) { c[0], c[2] }, 2, 0, 0, 0,
	                     &p),
	    1);
	assert_int_equal(p.sp_kind, SCORER_DARK);
	/* All capped → nothing; the single-candidate shortcut is off. */
	report(s, 2, 48, 0, 100, 0, 0);
	assert_int_equal(scorer_select(s, c, 2, 0, 0, 0, &p), -1);
	assert_int_equal(p.sp_index, -1);
	assert_int_equal(scorer_least_load(s, c, 1, 0, 0, 0, &p), -1);
	/* Credit counts toward the cap: 46 waiting + 2 credited = 48. */
	report(s, 2, 46, 0, 100, 0, 0);
	assert_int_equal(scorer_select(s, &c[1], 1, 7, 0, 0, &p), 0);
	assert_int_equal(scorer_select(s, &c[1], 1, 7, 0, 0, &p), 0);
	assert_int_equal(scorer_credit(s, 2, &tok, &req), 0);
	assert_int_equal(tok, 14);
	assert_int_equal(req, 2);
	assert_int_equal(scorer_select(s, &c[1], 1, 7, 0, 0, &p), -1);
	/* A fresh report resets the credit. */
	report(s, 2, 46, 0, 100, 0, 0);
	assert_int_equal(scorer_select(s, &c[1], 1, 7, 0, 0, &p), 0);
	scorer_free(s);
}

static void
test_degradation(void **state)
{
	struct scorer *s;
	struct scorer_cand c[4] = { { 1, 0 }, { 2, 0 }, { 3, 4 }, { 4, 1 } };
	struct scorer_pick p;
	int i, won[3] = { 0 };

	(void)state;
	s = scorer_new(NULL, test_rand);
	/* Reporting a: 1000 tok @100 = 10 s; b: 6000 @300 = 20 s. */
	report(s, 1, 0, 1000, 100, 0, 0);
	report(s, 2, 0, 6000, 300, 0, 0);
	/* Reporting is scoped to C: alone, non-reporter 3 is dark. */
	assert_int_equal(scorer_select(s, &c[2], 1, 0, 0, 0, &p), 0);
	assert_int_equal(p.sp_kind, SCORER_DARK);
	assert_near(p.sp_score, 4.0, EPS);
	/* With 4 in flight the non-reporter scores 10 + 4 * 1024 / 200. */
	assert_int_equal(scorer_select(s, c, 3, 0, 0, 0, &p), 0);
	assert_int_equal(p.sp_kind, SCORER_REPORTING);
	assert_near(p.sp_score, 10.0, EPS);
	/* An idle non-reporter ties the best reporter and shares its
	 * traffic through the random tie-break. */
	c[2].sc_in_flight = 0;
	for (i = 0; i < 400; i++) {
		assert_true(scorer_select(s, c, 3, 0, 0, 0, &p) >= 0);
		won[p.sp_index]++;
		if (p.sp_index == 2)
			assert_int_equal(p.sp_kind, SCORER_NON_REPORTING);
		assert_near(p.sp_score, 10.0, EPS);
	}
	assert_int_equal(won[1], 0);
	assert_in_range(won[0], 140, 260);
	assert_in_range(won[2], 140, 260);
	/* Dark set: fewest in-flight, score = in-flight. */
	c[2].sc_in_flight = 2;
	assert_int_equal(scorer_select(s, &c[2], 2, 0, 0, 0, &p), 1);
	assert_int_equal(p.sp_kind, SCORER_DARK);
	assert_near(p.sp_score, 1.0, EPS);
	/* A forgotten worker is non-reporting again. */
	scorer_forget(s, 1);
	c[0].sc_in_flight = 7;
	c[1].sc_in_flight = 9;
	assert_int_equal(scorer_select(s, c, 2, 0, 0, 0, &p), 1);
	assert_int_equal(p.sp_kind, SCORER_REPORTING);
	assert_near(p.sp_score, 20.0, EPS);
	scorer_free(s);
}

static void
test_stale_and_credit(void **state)
{
	struct scorer *s;
	struct scorer_cand c[2] = { { 1, 5 }, { 2, 1 } };
	struct scorer_pick p;
	uint64_t tok, req;

	(void)state;
	s = scorer_new(NULL, test_rand);
	/* 1 has an idle report at t=1000; 2 never reported and has one in
	 * flight, so it scores 1024 / 100 s above 1. */
	report(s, 1, 0, 0, 100, 0, 1000);
	/* Interval 1 s: still valid at 4000 (3 s old). */
	assert_int_equal(scorer_select(s, c, 2, -1, 4000, 1000, &p), 0);
	assert_int_equal(p.sp_kind, SCORER_REPORTING);
	assert_int_equal(scorer_credit(s, 1, &tok, &req), 0);
	assert_int_equal(tok, 1024); /* no token count: p̄ */
	assert_int_equal(req, 1);
	/* Older than 3 intervals: missing → dark, in-flight decides. */
	assert_int_equal(scorer_select(s, c, 2, -1, 4001, 1000, &p), 1);
	assert_int_equal(p.sp_kind, SCORER_DARK);
	/* Interval 0: reports never age. */
	assert_int_equal(scorer_select(s, c, 2, 100, 999999, 0, &p), 0);
	assert_int_equal(scorer_credit(s, 1, &tok, &req), 0);
	assert_int_equal(tok, 1124);
	assert_int_equal(req, 2);
	/* Credit raises the score: 1124 / 100 tok/s. */
	assert_near(p.sp_score, 10.24, EPS);
	/* Non-reporting winners have no entry and get no credit. */
	assert_int_equal(scorer_credit(s, 2, &tok, &req), -1);
	/* A report with zero ranks: no report from then on. */
	scorer_report(s, 1, NULL, 5000);
	assert_int_equal(scorer_select(s, c, 2, 0, 5000, 1000, &p), 1);
	assert_int_equal(p.sp_kind, SCORER_DARK);
	assert_int_equal(scorer_credit(s, 1, &tok, &req), 0);
	assert_int_equal(req, 0);
	scorer_free(s);
}

static void
test_least_load_shortcut(void **state)
{
	struct scorer *s;
	struct scorer_cand c = { 1, 9 };
	struct scorer_pick p;
	uint64_t tok, req;

	(void)state;
	s = scorer_new(NULL, test_rand);
	report(s, 1, 0, 0, 100, 0, 0);
	assert_int_equal(scorer_least_load(s, &c, 1, 0, 0, 0, &p), 0);
	assert_int_equal(p.sp_kind, SCORER_SHORTCUT);
	assert_int_equal(p.sp_in_flight, 9);
	assert_int_equal(scorer_credit(s, 1, &tok, &req), 0);
	assert_int_equal(req, 0);
	assert_int_equal(scorer_least_load(s, &c, 0, 0, 0, 0, &p), -1);
	scorer_free(s);
}

static void
test_tie_distribution(void **state)
{
	struct scorer *s;
	struct scorer_cand c[5] = { { 1, 2 }, { 2, 2 }, { 3, 2 }, { 4, 2 },
		{ 5, 3 } };
	struct scorer_pick p;
	double chi = 0, d;
	int i, count[5] = { 0 };
	const int picks = 8000;

	(void)state;
	s = scorer_new(NULL, test_rand);
	for (i = 0; i < picks; i++) {
		assert_true(scorer_least_load(s, c, 5, 0, 0, 0, &p) >= 0);
		count[p.sp_index]++;
	}
	assert_int_equal(count[4], 0);
	for (i = 0; i < 4; i++) {
		d = count[i] - picks / 4.0;
		chi += d * d / (picks / 4.0);
	}
	/* 3 degrees of freedom: 16.27 is the 0.1 % critical value. */
	assert_true(chi < 16.27);
	scorer_free(s);
}

static void
test_power_of_two(void **state)
{
	struct scorer *s;
	struct scorer_cand c[4] = { { 1, 0 }, { 2, 1 }, { 3, 2 }, { 4, 3 } };
	struct scorer_pick p;
	int pairs[4][4] = { { 0 } }, won[4] = { 0 };
	uint32_t i, j;
	double chi = 0, d;
	int k;
	const int draws = 12000;

	(void)state;
	s = scorer_new(NULL, test_rand);
	/* Every ordered pair of distinct workers equally likely. */
	for (k = 0; k < draws; k++) {
		scorer_pair(s, 4, &i, &j);
		assert_true(i < 4 && j < 4 && i != j);
		pairs[i][j]++;
	}
	for (i = 0; i < 4; i++)
		for (j = 0; j < 4; j++) {
			if (i == j)
				continue;
			d = pairs[i][j] - draws / 12.0;
			chi += d * d / (draws / 12.0);
		}
	/* 11 degrees of freedom: 31.26 is the 0.1 % critical value. */
	assert_true(chi < 31.26);
	/* Dark fleet: the pair's lower in-flight wins, so worker 0 wins
	 * 1/2 of the time, 1 1/3, 2 1/6, 3 never. */
	for (k = 0; k < 6000; k++) {
		assert_true(scorer_power_of_two(s, c, 4, 0, 0, 0, &p) >= 0);
		won[p.sp_index]++;
	}
	assert_in_range(won[0], 2800, 3200);
	assert_in_range(won[1], 1800, 2200);
	assert_in_range(won[2], 850, 1150);
	assert_int_equal(won[3], 0);
	assert_int_equal(scorer_power_of_two(s, c, 1, 0, 0, 0, &p), 0);
	assert_int_equal(scorer_power_of_two(s, c, 0, 0, 0, 0, &p), -1);
	scorer_free(s);

	/* Only the pair is scored: 1 and 2 are both dark within the pair
	 * even though 0 reports, so the winner's score is its in-flight. */
	s = scorer_new(NULL, script_rand);
	report(s, 1, 0, 100000, 100, 0, 0);
	script[0] = 1; /* i = 1 */
	script[1] = 0; /* j = (1 + 1 + 0) mod 3 = 2 */
	script_pos = 0;
	c[1].sc_in_flight = 5;
	c[2].sc_in_flight = 1;
	assert_int_equal(scorer_power_of_two(s, c, 3, 0, 0, 0, &p), 2);
	assert_int_equal(p.sp_kind, SCORER_DARK);
	assert_near(p.sp_score, 1.0, EPS);
	/* Pair (2, 0): 0 reports 1000 s; idle 2 ties it as a non-reporter
	 * and the tie draw (1 of 2: keep the first) keeps 2. */
	script[0] = 2;
	script[1] = 0;
	script[2] = 1;
	script_pos = 0;
	c[2].sc_in_flight = 0;
	assert_int_equal(scorer_power_of_two(s, c, 3, 0, 0, 0, &p), 2);
	assert_int_equal(p.sp_kind, SCORER_NON_REPORTING);
	assert_near(p.sp_score, 1000.0, EPS);
	/* With one in flight it sinks below the reporter. */
	c[2].sc_in_flight = 1;
	script_pos = 0;
	assert_int_equal(scorer_power_of_two(s, c, 3, 0, 0, 0, &p), 0);
	assert_near(p.sp_score, 1000.0, EPS);
	scorer_free(s);
}

static void
test_table_and_debug(void **state)
{
	struct scorer_tunables t;
	struct scorer *s;
	struct scorer_pick p;
	char buf[SCORER_DEBUG_SIZE];
	uint64_t id, tok, req;

	(void)state;
	/* Growth and backward-shift deletion keep every entry reachable. */
	s = scorer_new(NULL, test_rand);
	for (id = 0; id < 1000; id++)
		report(s, id * 7919, (int64_t)id, 0, 100, 0, 0);
	for (id = 0; id < 1000; id += 2)
		scorer_forget(s, id * 7919);
	for (id = 0; id < 1000; id++)
		assert_int_equal(scorer_credit(s, id * 7919, &tok, &req),
		    id % 2 == 0 ? -1 : 0);
	scorer_forget(s, 12345678);
	scorer_free(s);
	scorer_free(NULL);

	/* Constructor corrections. */
	t.st_kv_pressure_weight = -1;
	t.st_default_throughput = 0;
	t.st_mean_prefill_tokens = 0;
	t.st_max_waiting_requests = 3;
	s = scorer_new(&t, test_rand);
	assert_near(scorer_get_tunables(s)->st_kv_pressure_weight, 0.15, EPS);
	assert_near(scorer_get_tunables(s)->st_default_throughput, 2000, EPS);
	assert_int_equal(scorer_get_tunables(s)->st_mean_prefill_tokens, 1);
	assert_int_equal(scorer_get_tunables(s)->st_max_waiting_requests, 3);
	scorer_free(s);

	p.sp_index = 0;
	p.sp_kind = SCORER_REPORTING;
	p.sp_score = 10.0375;
	p.sp_in_flight = 3;
	assert_string_equal(scorer_debug(&p, buf, sizeof(buf)),
	    "score 10.0375, in_flight 3, reporting");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_worked_numbers),
		cmocka_unit_test(test_cap),
		cmocka_unit_test(test_degradation),
		cmocka_unit_test(test_stale_and_credit),
		cmocka_unit_test(test_least_load_shortcut),
		cmocka_unit_test(test_tie_distribution),
		cmocka_unit_test(test_power_of_two),
		cmocka_unit_test(test_table_and_debug),
	};

	log_init("scorer_test", LOG_LEVEL_WARN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
