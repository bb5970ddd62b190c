/*
 * policy_test.c: round_robin, random and passthrough on hand-made
 * candidate lists, and policy names.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <xxhash.h>

#include "shared/log.h"

#include "broker/broker.h"

#define NW 4

static struct worker ws[NW];
static char urls[NW][32];

static void
workers_init(void)
{
	int i;

	memset(ws, 0, sizeof(ws));
	for (i = 0; i < NW; i++) {
		snprintf(urls[i], sizeof(urls[i]), "http://w%d:8000", i);
		ws[i].wk_url = urls[i];
		ws[i].wk_url_hash = XXH3_64bits(urls[i], strlen(urls[i]));
		ws[i].wk_slot = (unsigned)i;
	}
}

static int
pick(struct policy *p, struct worker **c, unsigned n)
{
	Smg__RouteRequest req = SMG__ROUTE_REQUEST__INIT;
	int i = policy_select(p, c, n, &req);

	assert_true(i >= 0 && (unsigned)i < n);
	return (int)c[i]->wk_slot;
}

static void
test_names(void **state)
{
	(void)state;
	assert_string_equal(policy_canonical("RoundRobin"), "round_robin");
	assert_string_equal(policy_canonical("round_robin"), "round_robin");
	assert_string_equal(policy_canonical("POWER_OF_TWO"), "power_of_two");
	assert_string_equal(policy_canonical("cacheaware"), "cache_aware");
	assert_null(policy_canonical("fastest"));
	assert_null(policy_canonical(""));
	assert_true(policy_implemented("random"));
	assert_true(policy_implemented("passthrough"));
	assert_true(policy_implemented("cache_aware"));
	assert_true(policy_implemented("manual"));
	assert_null(policy_new("nonsense", false));
}

static void
test_round_robin(void **state)
{
	struct policy *p = policy_new("round_robin", false);
	struct worker *all[3] = { &ws[0], &ws[1], &ws[2] };
	struct worker *two[2] = { &ws[0], &ws[2] };
	int exp1[] = { 0, 1, 2, 0, 1 };
	int exp2[] = { 0, 2, 0, 2 };
	int i;

	(void)state;
	workers_init();
	assert_non_null(p);
	for (i = 0; i < 5; i++)
		assert_int_equal(pick(p, all, 3), exp1[i]);
	/* The middle worker leaves: a new set with its own rotation. */
	for (i = 0; i < 4; i++)
		assert_int_equal(pick(p, two, 2), exp2[i]);
	/* It comes back: the old set resumes where it stopped (at 2). */
	assert_int_equal(pick(p, all, 3), 2);
	assert_int_equal(pick(p, all, 3), 0);
	assert_int_equal(policy_round_robin_counter(p->pl_state, all, 3), 7);
	assert_int_equal(policy_round_robin_counter(p->pl_state, two, 2), 4);
	policy_free(p);
}

static void
test_round_robin_lru(void **state)
{
	struct policy *p = policy_new("roundrobin", false);
	struct worker *set[1], *first[2] = { &ws[0], &ws[1] };
	struct worker many[BROKER_RR_MAX_SETS + 8];
	unsigned i;

	(void)state;
	workers_init();
	assert_int_equal(pick(p, first, 2), 0);
	memset(many, 0, sizeof(many));
	/* More sets than the LRU holds: the oldest one is forgotten. */
	for (i = 0; i < BROKER_RR_MAX_SETS + 8; i++) {
		many[i].wk_url_hash = 0x1000 + i;
		set[0] = &many[i];
		assert_int_equal(policy_select(p, set, 1, NULL), 0);
	}
	assert_int_equal(policy_round_robin_counter(p->pl_state, first, 2), 0);
	assert_int_equal(pick(p, first, 2), 0);
	/* A recent set is still there. */
	set[0] = &many[BROKER_RR_MAX_SETS + 7];
	assert_int_equal(policy_round_robin_counter(p->pl_state, set, 1), 1);
	policy_free(p);
}

static void
test_random_uniform(void **state)
{
	struct policy *p = policy_new("random", false);
	struct worker *c[3] = { &ws[0], &ws[1], &ws[2] };
	unsigned counts[3] = { 0 }, i;
	double chi = 0, e = 10000.0;

	(void)state;
	workers_init();
	for (i = 0; i < 30000; i++)
		counts[pick(p, c, 3)]++;
	for (i = 0; i < 3; i++)
		chi += (counts[i] - e) * (counts[i] - e) / e;
	/* 2 degrees of freedom: P(chi2 > 18.4) = 0.0001. */
	assert_true(chi < 18.4);
	for (i = 0; i < 3; i++)
		assert_true(counts[i] > 9400 && counts[i] < 10600);
	assert_int_equal(policy_rand_below(1), 0);
	policy_free(p);
}

static void
test_passthrough(void **state)
{
	struct policy *p = policy_new("passthrough", false);
	struct worker *c[3] = { &ws[2], &ws[0], &ws[1] };
	char line[512];
	FILE *cap;
	int i, saved, warnings = 0;

	(void)state;
	workers_init();
	/* Capture stderr to count the warnings. */
	assert_non_null(cap = tmpfile());
	fflush(stderr);
	saved = dup(2);
	assert_int_not_equal(dup2(fileno(cap), 2), -1);
	assert_false(p->pl_warned);
	assert_int_equal(pick(p, c, 1), 2);
	assert_false(p->pl_warned); /* one candidate: nothing to say */
	for (i = 0; i < 5; i++)
		assert_int_equal(pick(p, c, 3), 2);
	assert_true(p->pl_warned);
	assert_int_equal(policy_select(p, c, 0, NULL), -1);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	rewind(cap);
	while (fgets(line, sizeof(line), cap) != NULL)
		warnings += strstr(line, "passthrough always routes") != NULL;
	fclose(cap);
	assert_int_equal(warnings, 1);
	policy_free(p);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_round_robin),
		cmocka_unit_test(test_round_robin_lru),
		cmocka_unit_test(test_random_uniform),
		cmocka_unit_test(test_passthrough),
	};

	log_init("policy_test", LOG_LEVEL_WARN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
