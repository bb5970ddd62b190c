/*
 * scorer_test.c: the expected-wait scorer (smg-c's reading of policies.md
 * §2) on worked numbers: the spec's report-only examples, live figures
 * only, both together (excess over what this gateway sent, drained with
 * age, stale reports), the waiting cap, workers without reports, random
 * tie-breaking and power_of_two's pairs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
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
	struct scorer_report r = { 0 };

	r.sr_waiting_reqs = waiting;
	r.sr_waiting_uncached_tokens = tokens;
	r.sr_gen_throughput = tp;
	r.sr_token_usage = k;
	scorer_report(s, id, &r, now);
}

/* A candidate with live figures; rate 0 means T₀. */
static struct scorer_cand
cand(uint64_t id, uint64_t in_flight, uint64_t pending, double rate,
    uint64_t uncached)
{
	struct scorer_cand c;

	memset(&c, 0, sizeof(c));
	c.sc_id = id;
	c.sc_in_flight = in_flight;
	c.sc_pending = pending;
	c.sc_rate = rate;
	c.sc_uncached = uncached;
	return c;
}

/* Score of one candidate with rate `rate`, nothing live. */
static double
score_alone(struct scorer *s, uint64_t id, double rate)
{
	struct scorer_cand c = cand(id, 0, 0, rate, 0);

	return scorer_score(s, &c, 0, 0, NULL);
}

/*
 * policies.md §2's worked numbers, where only reports exist: with the
 * rate equal to the old divisor the seconds are the same, and in every
 * case the ranking is.
 */
static void
test_worked_numbers(void **state)
{
	struct scorer_tunables t;
	struct scorer *s;
	struct scorer_cand c[2];
	struct scorer_pick p;

	(void)state;
	s = scorer_new(NULL, test_rand);
	c[0] = cand(1, 0, 0, 100, 0);
	c[1] = cand(2, 0, 0, 100, 0);
	/* a: 8000 queued tokens @100 tok/s, k=0.2 → 80.0375 s. */
	report(s, 1, 0, 8000, 100, 0.2, 0);
	report(s, 2, 0, 1000, 100, 0.2, 0);
	assert_int_equal(scorer_select(s, c, 2, 0, 0, &p), 1);
	assert_int_equal(p.sp_kind, SCORER_REPORTING);
	assert_near(p.sp_score, 10.0375, EPS);
	assert_near(score_alone(s, 1, 100), 80.0375, EPS);

	/* No rate known: T₀ = 2000 → 5 s vs 0.5 s (gen_throughput is a
	 * decode rate and no longer divides prefill work). */
	report(s, 1, 0, 10000, 0, 0, 0);
	report(s, 2, 0, 1000, 0, 0, 0);
	c[0].sc_rate = c[1].sc_rate = 0;
	assert_int_equal(scorer_select(s, c, 2, 0, 0, &p), 1);
	assert_near(p.sp_score, 0.5, EPS);
	assert_near(score_alone(s, 1, 0), 5.0, EPS);

	/* 64 waiting, no token count: 64 * 1024 / 100 ≈ 655 s. */
	report(s, 1, 64, 0, 100, 0, 0);
	assert_near(score_alone(s, 1, 100), 655.36, EPS);
	/* Negative counts are read as zero; usage clamps to 0.999. */
	report(s, 1, -3, -5, 100, 2.0, 0);
	assert_near(score_alone(s, 1, 100), 0.15 * 0.999 / 0.001, 1e-6);
	scorer_free(s);

	/* λ = 2, k = 0.98 → barrier 2 · 0.98 / 0.02 = 98 s. */
	scorer_tunables_default(&t);
	t.st_kv_pressure_weight = 2;
	s = scorer_new(&t, test_rand);
	report(s, 1, 0, 0, 100, 0.98, 0);
	assert_near(score_alone(s, 1, 100), 98.0, 1e-9);
	scorer_free(s);
}

/* A report's KV use follows the live requests in flight since it. */
static void
test_kv_use_follows_live(void **state)
{
	struct scorer_report r = { 0 };
	struct scorer_cand c = cand(1, 4, 0, 100, 0);
	struct scorer *s;

	(void)state;
	s = scorer_new(NULL, test_rand);
	r.sr_token_usage = 0.9;
	r.sr_in_flight_then = 9;
	scorer_report(s, 1, &r, 0);
	/* 4 in flight now: k = 0.9 · 5 / 10 = 0.45 (plus 4 tokens / 100). */
	assert_near(scorer_score(s, &c, 0, 0, NULL), 0.04 + 0.15 * 0.45 / 0.55,
	    1e-9);
	/* 19 in flight: k would pass 1: clamped at 0.999. */
	c.sc_in_flight = 19;
	assert_near(scorer_score(s, &c, 0, 0, NULL),
	    0.19 + 0.15 * 0.999 / 0.001, 1e-6);
	scorer_free(s);
}

/* Live figures only: pending and own prompt over the rate. */
static void
test_live_only(void **state)
{
	struct scorer *s;
	struct scorer_cand c[3];
	struct scorer_pick p;

	(void)state;
	s = scorer_new(NULL, test_rand);
	/* a: (20000 + 4000) / 10000 = 2.4 s; b: (6000 + 4000) / 5000 = 2 s;
	 * c: (9000 + 4000 + 3 in flight) / 10000 = 1.3003 s. */
	c[0] = cand(1, 0, 20000, 10000, 4000);
	c[1] = cand(2, 0, 6000, 5000, 4000);
	c[2] = cand(3, 3, 9000, 10000, 4000);
	assert_near(scorer_score(s, &c[0], 0, 0, NULL), 2.4, EPS);
	assert_near(scorer_score(s, &c[1], 0, 0, NULL), 2.0, EPS);
	assert_near(scorer_score(s, &c[2], 0, 0, NULL), 1.3003, EPS);
	assert_int_equal(scorer_select(s, c, 3, 0, 0, &p), 2);
	assert_int_equal(p.sp_kind, SCORER_LIVE);
	assert_int_equal(p.sp_pending, 9000);
	/* The forfeit charge counts like prompt to prefill: c pays 12000
	 * tokens of reuse it would redo and loses to b. */
	c[2].sc_forfeit = 12000;
	assert_near(scorer_score(s, &c[2], 0, 0, NULL), 2.5003, EPS);
	assert_int_equal(scorer_select(s, c, 3, 0, 0, &p), 1);
	/* A broken rate (NaN, negative) reads as unknown: T₀. */
	c[0] = cand(1, 0, 2000, NAN, 0);
	assert_near(scorer_score(s, &c[0], 0, 0, NULL), 1.0, EPS);
	c[0].sc_rate = -5;
	assert_near(scorer_score(s, &c[0], 0, 0, NULL), 1.0, EPS);
	scorer_free(s);
}

/* Reports and live figures together, without counting anything twice. */
static void
test_live_and_report(void **state)
{
	struct scorer *s;
	struct scorer_report r = { 0 };
	struct scorer_cand c = cand(1, 0, 8000, 1000, 1000);
	bool rep;

	(void)state;
	s = scorer_new(NULL, test_rand);
	memset(&r, 0, sizeof(r));
	/* The report shows 20000 queued while this gateway had 5000 pending
	 * there: 15000 are other traffic, added to the 8000 live. */
	r.sr_waiting_uncached_tokens = 20000;
	r.sr_token_usage = 0.5;
	r.sr_pending_then = 5000;
	scorer_report(s, 1, &r, 1000);
	assert_near(scorer_score(s, &c, 1000, 10000, &rep),
	    (8000 + 15000 + 1000) / 1000.0 + 0.15, EPS);
	assert_true(rep);
	/* 4 s later the excess has drained at 1000 tokens/s. */
	assert_near(scorer_score(s, &c, 5000, 10000, NULL),
	    (8000 + 11000 + 1000) / 1000.0 + 0.15, EPS);
	/* Drained completely after 15 s (still a fresh report at 30 s). */
	assert_near(scorer_score(s, &c, 16000, 10000, NULL),
	    (8000 + 1000) / 1000.0 + 0.15, EPS);
	/* Older than 3 intervals: no excess, no KV penalty, live stays. */
	assert_near(scorer_score(s, &c, 31001, 10000, &rep), 9.0, EPS);
	assert_false(rep);
	/* A queue below what this gateway has sent adds nothing. */
	r.sr_waiting_uncached_tokens = 3000;
	r.sr_pending_then = 8000;
	r.sr_token_usage = 0;
	scorer_report(s, 1, &r, 40000);
	assert_near(scorer_score(s, &c, 40000, 10000, NULL), 9.0, EPS);
	/* Waiting requests without tokens count p̄ each. */
	r.sr_waiting_uncached_tokens = 0;
	r.sr_waiting_reqs = 10;
	r.sr_pending_then = 240;
	scorer_report(s, 1, &r, 40000);
	assert_near(scorer_score(s, &c, 40000, 10000, NULL),
	    (8000 + 10000 + 1000) / 1000.0, EPS);
	scorer_free(s);
}

static void
test_cap(void **state)
{
	struct scorer_tunables t;
	struct scorer *s;
	struct scorer_cand c[3];
	struct scorer_pick p;
	uint64_t req;

	(void)state;
	scorer_tunables_default(&t);
	t.st_max_waiting_requests = 48;
	s = scorer_new(&t, test_rand);
	c[0] = cand(1, 0, 0, 100, 0);
	c[1] = cand(2, 0, 0, 100, 0);
	c[2] = cand(3, 50, 0, 100, 0);
	/* a reports 64 waiting (best score otherwise): excluded first. */
	report(s, 1, 64, 1, 1e9, 0, 0);
	report(s, 2, 10, 50000, 100, 0, 0);
	assert_int_equal(scorer_select(s, c, 2, 0, 0, &p), 1);
	/* Capped reporter with a non-reporting peer → the peer. */
	assert_int_equal(scorer_least_load(s,
	                     (struct scorer_cand[]) { c[0], c[2] }, 2, 0, 0,
	                     &p),
	    1);
	assert_int_equal(p.sp_kind, SCORER_LIVE);
	/* All capped → nothing; the single-candidate shortcut is off. */
	report(s, 2, 48, 0, 100, 0, 0);
	assert_int_equal(scorer_select(s, c, 2, 0, 0, &p), -1);
	assert_int_equal(p.sp_index, -1);
	assert_int_equal(scorer_least_load(s, c, 1, 0, 0, &p), -1);
	/* Dispatches count toward the cap: 46 waiting + 2 sent = 48. */
	report(s, 2, 46, 0, 100, 0, 0);
	assert_int_equal(scorer_select(s, &c[1], 1, 0, 0, &p), 0);
	assert_int_equal(scorer_select(s, &c[1], 1, 0, 0, &p), 0);
	assert_int_equal(scorer_credit(s, 2, &req), 0);
	assert_int_equal(req, 2);
	assert_int_equal(scorer_select(s, &c[1], 1, 0, 0, &p), -1);
	/* A fresh report resets the count. */
	report(s, 2, 46, 0, 100, 0, 0);
	assert_int_equal(scorer_select(s, &c[1], 1, 0, 0, &p), 0);
	scorer_free(s);
}

static void
test_degradation(void **state)
{
	struct scorer *s;
	struct scorer_cand c[3];
	struct scorer_pick p;
	uint64_t req;

	(void)state;
	s = scorer_new(NULL, test_rand);
	c[0] = cand(1, 0, 0, 100, 0);
	c[1] = cand(2, 0, 0, 100, 0);
	c[2] = cand(3, 4, 0, 100, 0);
	/* Reporting a: 1000 tok = 10 s; b: 6000 = 60 s. */
	report(s, 1, 0, 1000, 100, 0, 0);
	report(s, 2, 0, 6000, 300, 0, 0);
	/* A worker without a report is judged on its live figures: with 4
	 * in flight, 4 * 1 / 100 = 0.04 s, below a's 10 s. */
	assert_int_equal(scorer_select(s, c, 3, 0, 0, &p), 2);
	assert_int_equal(p.sp_kind, SCORER_LIVE);
	assert_near(p.sp_score, 0.04, EPS);
	/* With a backlog it sinks below the reporter. */
	c[2].sc_pending = 1000;
	assert_int_equal(scorer_select(s, c, 3, 0, 0, &p), 0);
	assert_near(p.sp_score, 10.0, EPS);
	/* A report with zero ranks: no report from then on. */
	scorer_report(s, 1, NULL, 0);
	assert_int_equal(scorer_select(s, c, 2, 0, 0, &p), 0);
	assert_int_equal(p.sp_kind, SCORER_LIVE);
	assert_near(p.sp_score, 0, EPS);
	assert_int_equal(scorer_credit(s, 1, &req), 0);
	assert_int_equal(req, 0);
	/* A forgotten worker has no entry. */
	scorer_forget(s, 2);
	assert_int_equal(scorer_credit(s, 2, &req), -1);
	scorer_free(s);
}

static void
test_least_load_shortcut(void **state)
{
	struct scorer *s;
	struct scorer_cand c = cand(1, 9, 0, 0, 0);
	struct scorer_pick p;
	uint64_t req;

	(void)state;
	s = scorer_new(NULL, test_rand);
	report(s, 1, 0, 0, 100, 0, 0);
	assert_int_equal(scorer_least_load(s, &c, 1, 0, 0, &p), 0);
	assert_int_equal(p.sp_kind, SCORER_SHORTCUT);
	assert_int_equal(p.sp_in_flight, 9);
	assert_int_equal(scorer_credit(s, 1, &req), 0);
	assert_int_equal(req, 0);
	assert_int_equal(scorer_least_load(s, &c, 0, 0, 0, &p), -1);
	scorer_free(s);
}

static void
test_tie_distribution(void **state)
{
	struct scorer *s;
	struct scorer_cand c[5];
	struct scorer_pick p;
	double chi = 0, d;
	int i, count[5] = { 0 };
	const int picks = 8000;

	(void)state;
	for (i = 0; i < 5; i++)
		c[i] = cand((uint64_t)i + 1, i < 4 ? 2 : 3, 0, 0, 1000);
	s = scorer_new(NULL, test_rand);
	for (i = 0; i < picks; i++) {
		assert_true(scorer_least_load(s, c, 5, 0, 0, &p) >= 0);
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
	struct scorer_cand c[4];
	struct scorer_pick p;
	int pairs[4][4] = { { 0 } }, won[4] = { 0 };
	uint32_t i, j;
	double chi = 0, d;
	int k;
	const int draws = 12000;

	(void)state;
	for (k = 0; k < 4; k++)
		c[k] = cand((uint64_t)k + 1, 0, (uint64_t)k * 1000, 0, 500);
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
	/* The pair's lower pending wins, so worker 0 wins 1/2 of the time,
	 * 1 1/3, 2 1/6, 3 never. */
	for (k = 0; k < 6000; k++) {
		assert_true(scorer_power_of_two(s, c, 4, 0, 0, &p) >= 0);
		won[p.sp_index]++;
	}
	assert_in_range(won[0], 2800, 3200);
	assert_in_range(won[1], 1800, 2200);
	assert_in_range(won[2], 850, 1150);
	assert_int_equal(won[3], 0);
	assert_int_equal(scorer_power_of_two(s, c, 1, 0, 0, &p), 0);
	assert_int_equal(scorer_power_of_two(s, c, 0, 0, 0, &p), -1);
	scorer_free(s);

	/* Only the pair is scored: (1, 2) never sees idle worker 0. */
	s = scorer_new(NULL, script_rand);
	report(s, 1, 0, 100000, 100, 0, 0);
	script[0] = 1; /* i = 1 */
	script[1] = 0; /* j = (1 + 1 + 0) mod 3 = 2 */
	script_pos = 0;
	assert_int_equal(scorer_power_of_two(s, c, 3, 0, 0, &p), 1);
	assert_int_equal(p.sp_kind, SCORER_LIVE);
	assert_near(p.sp_score, 1500 / 2000.0, EPS);
	/* Pair (2, 0): 0 reports 100000 tokens; 2 has 2000 live. */
	script[0] = 2;
	script[1] = 0;
	script_pos = 0;
	assert_int_equal(scorer_power_of_two(s, c, 3, 0, 0, &p), 2);
	assert_near(p.sp_score, 2500 / 2000.0, EPS);
	scorer_free(s);
}

static void
test_table_and_debug(void **state)
{
	struct scorer_tunables t;
	struct scorer *s;
	struct scorer_pick p;
	char buf[SCORER_DEBUG_SIZE];
	uint64_t id, req;

	(void)state;
	/* Growth and backward-shift deletion keep every entry reachable. */
	s = scorer_new(NULL, test_rand);
	for (id = 0; id < 1000; id++)
		report(s, id * 7919, (int64_t)id, 0, 100, 0, 0);
	for (id = 0; id < 1000; id += 2)
		scorer_forget(s, id * 7919);
	for (id = 0; id < 1000; id++)
		assert_int_equal(scorer_credit(s, id * 7919, &req),
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
	p.sp_pending = 12000;
	p.sp_rate = 9876.4;
	assert_string_equal(scorer_debug(&p, buf, sizeof(buf)),
	    "score 10.0375, in_flight 3, pending 12000, rate 9876, live and "
	    "report");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_worked_numbers),
		cmocka_unit_test(test_kv_use_follows_live),
		cmocka_unit_test(test_live_only),
		cmocka_unit_test(test_live_and_report),
		cmocka_unit_test(test_cap),
		cmocka_unit_test(test_degradation),
		cmocka_unit_test(test_least_load_shortcut),
		cmocka_unit_test(test_tie_distribution),
		cmocka_unit_test(test_power_of_two),
		cmocka_unit_test(test_table_and_debug),
	};

	log_init("scorer_test", LOG_LEVEL_WARN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
