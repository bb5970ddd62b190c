/*
 * policy_least_load_test.c: least_load and power_of_two wired into a
 * whole broker (server_new without sockets), fed LoadReports the way the
 * poller sends them and asked for decisions the way a frontend does:
 * hand-computed scores including the credit of work sent since a report,
 * the waiting cap and its 503, stale reports, the flags reaching
 * least_load but not power_of_two, in-flight counts from shm, removal, and
 * the uniform random tie-break.
 */
#define _XOPEN_SOURCE 700
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shared/ipc.h"
#include "shared/shm.h"

#include "broker/broker.h"
#include "broker/broker_testutil.h"
#include "broker/scorer.h"

struct rank {
	int64_t waiting;
	int64_t uncached;
	double tput;
	double usage;
};

static int
fx_setup(void **state)
{
	struct btu_fx *f = btu_fx_new("ll", "least_load");

	if (f == NULL)
		return -1;
	f->fx_bs.bs_cb_failure_threshold = 5;
	f->fx_bs.bs_health_failure_threshold = 2;
	f->fx_bs.bs_health_success_threshold = 2;
	f->fx_bs.bs_load_monitor_interval = 1;
	/* The CLI defaults, as main.c fills them. */
	f->fx_bs.bs_ll_kv_pressure_weight = 0.15;
	f->fx_bs.bs_ll_default_throughput = 2000.0;
	f->fx_bs.bs_ll_mean_prefill_tokens = 1024;
	f->fx_bs.bs_ll_max_waiting_requests = 0;
	f->fx_bs.bs_nworkers = 2;
	*state = f;
	return 0;
}

static int
fx_teardown(void **state)
{
	btu_fx_free(*state);
	return 0;
}

static struct worker *
fx_worker(struct btu_fx *f, const char *url)
{
	struct worker *w = registry_find(f->fx_br, url);

	assert_non_null(w);
	return w;
}

/* One LoadReport of one rank, as the poller sends it. */
static void
fx_load(struct btu_fx *f, const char *url, const struct rank *k)
{
	Smg__PollerMsg m = SMG__POLLER_MSG__INIT;
	Smg__LoadReport l = SMG__LOAD_REPORT__INIT;
	Smg__RankLoad r0 = SMG__RANK_LOAD__INIT, *rs[1] = { &r0 };
	struct worker *w = fx_worker(f, url);
	uint8_t *buf;
	size_t len;

	r0.num_waiting_reqs = k->waiting;
	r0.num_waiting_uncached_tokens = k->uncached;
	r0.gen_throughput = k->tput;
	r0.token_usage = k->usage;
	l.worker_slot = w->wk_slot;
	l.worker_generation = w->wk_generation;
	l.worker_url = w->wk_url;
	l.ok = true;
	l.loads = rs;
	l.n_loads = 1;
	l.source = "loads";
	m.body_case = SMG__POLLER_MSG__BODY_LOAD;
	m.load = &l;
	m.version = IPC_VERSION;
	buf = ipc_pack_poller(&m, &len);
	server_poller(f->fx_br, buf, len);
	free(buf);
}

/* One decision; returns the worker URL's host letter, or '5' for 503. */
static char
fx_route(struct btu_fx *f, const uint32_t *tokens, size_t ntokens)
{
	Smg__RouteRequest rq = SMG__ROUTE_REQUEST__INIT;
	Smg__Decision d = SMG__DECISION__INIT;
	char msg[192];

	rq.id = 1;
	rq.model = "";
	if (tokens != NULL) {
		rq.tokens = (uint32_t *)tokens;
		rq.n_tokens = ntokens;
		rq.has_tokens = true;
	}
	route_one(f->fx_br, &rq, &d, msg, sizeof(msg));
	if (d.status != SMG__DECISION_STATUS__DECISION_OK) {
		assert_int_equal(d.http_status, 503);
		assert_string_equal(d.error_code, "no_available_workers");
		assert_false(d.terminal); /* retryable, unlike overload */
		return '5';
	}
	return d.worker_url[7];
}

static void
test_worked_numbers_and_credit(void **state)
{
	struct btu_fx *f = *state;
	struct rank a = { 0, 8000, 100, 0.2 }, b = { 0, 1000, 100, 0.2 };
	uint64_t tok, req;
	int i;

	btu_fx_start(f);
	fx_load(f, "http://a:1", &a);
	fx_load(f, "http://b:2", &b);
	/*
	 * a: 8000/100 + 0.15*0.2/0.8 = 80.0375 s; b: 10.0375 s. Each pick of
	 * b credits p̄ = 1024 tokens: b = 10.0375 + 10.24 m, still below a
	 * for m <= 6 (71.4775) and above it at m = 7 (81.7175).
	 */
	for (i = 0; i < 7; i++)
		assert_int_equal(fx_route(f, NULL, 0), 'b');
	assert_int_equal(fx_route(f, NULL, 0), 'a');
	assert_int_equal(
	    scorer_credit(policy_least_load_scorer(f->fx_br->br_default),
	        fx_worker(f, "http://b:2")->wk_url_hash, &tok, &req),
	    0);
	assert_int_equal(tok, 7 * 1024);
	assert_int_equal(req, 7);
	/* A fresh report resets the credit: b wins again. */
	fx_load(f, "http://b:2", &b);
	assert_int_equal(fx_route(f, NULL, 0), 'b');
}

static void
test_token_count_credit(void **state)
{
	struct btu_fx *f = *state;
	struct rank a = { 0, 2000, 100, 0 }, b = { 0, 1000, 100, 0 };
	uint32_t toks[600];
	uint64_t tok, req;

	btu_fx_start(f);
	memset(toks, 0, sizeof(toks));
	fx_load(f, "http://a:1", &a);
	fx_load(f, "http://b:2", &b);
	/* a 20 s, b 10 s; b is credited 600 tokens per request, not p̄. */
	assert_int_equal(fx_route(f, toks, 600), 'b'); /* b -> 16 s */
	assert_int_equal(fx_route(f, toks, 600), 'b'); /* b -> 22 s */
	assert_int_equal(fx_route(f, toks, 600), 'a');
	assert_int_equal(
	    scorer_credit(policy_least_load_scorer(f->fx_br->br_default),
	        fx_worker(f, "http://b:2")->wk_url_hash, &tok, &req),
	    0);
	assert_int_equal(tok, 1200);
}

static void
test_waiting_only_and_zero_throughput(void **state)
{
	struct btu_fx *f = *state;
	struct rank a = { 64, 0, 100, 0 }, b = { 0, 60000, 100, 0 };
	struct rank c = { 0, 10000, 0, 0 }, d = { 0, 1000, 0, 0 };

	btu_fx_start(f);
	/* a: 64 waiting, no token count: 64 x 1024 / 100 = 655.36 s;
	 * b: 60000 / 100 = 600 s. */
	fx_load(f, "http://a:1", &a);
	fx_load(f, "http://b:2", &b);
	assert_int_equal(fx_route(f, NULL, 0), 'b');
	/* Throughput 0 on both: T₀ 2000; a 5 s, b 0.5 s. */
	fx_load(f, "http://a:1", &c);
	fx_load(f, "http://b:2", &d);
	assert_int_equal(fx_route(f, NULL, 0), 'b');
}

static void
test_waiting_cap(void **state)
{
	struct btu_fx *f = *state;
	struct rank busy = { 64, 100, 100, 0 }, idle = { 0, 50000, 100, 0 };
	struct rank edge = { 47, 0, 1e9, 0 };

	f->fx_bs.bs_ll_max_waiting_requests = 48;
	btu_fx_start(f);
	/* a would score 1 s, b 500 s, but a is over the cap. */
	fx_load(f, "http://a:1", &busy);
	fx_load(f, "http://b:2", &idle);
	assert_int_equal(fx_route(f, NULL, 0), 'b');
	/* Both capped: 503 no_available_workers. */
	fx_load(f, "http://b:2", &busy);
	assert_int_equal(fx_route(f, NULL, 0), '5');
	/* 47 waiting + 1 credited request reaches 48: capped after one. */
	fx_load(f, "http://a:1", &edge);
	assert_int_equal(fx_route(f, NULL, 0), 'a');
	assert_int_equal(fx_route(f, NULL, 0), '5');
}

static void
test_cap_single_worker(void **state)
{
	struct btu_fx *f = *state;
	struct rank busy = { 64, 100, 100, 0 };

	f->fx_bs.bs_ll_max_waiting_requests = 48;
	f->fx_bs.bs_nworkers = 1;
	btu_fx_start(f);
	/* A worker without a report is never capped. */
	assert_int_equal(fx_route(f, NULL, 0), 'a');
	fx_load(f, "http://a:1", &busy);
	/* The single-candidate shortcut is skipped when a cap is set. */
	assert_int_equal(fx_route(f, NULL, 0), '5');
}

static void
test_stale_report_counts_as_missing(void **state)
{
	struct btu_fx *f = *state;
	struct rank a = { 0, 100000, 100, 0 }, b = { 0, 100, 100, 0 };
	struct worker *wa, *wb;
	int i, na = 0;

	btu_fx_start(f);
	fx_load(f, "http://a:1", &a);
	fx_load(f, "http://b:2", &b);
	assert_int_equal(fx_route(f, NULL, 0), 'b');
	/* Both reports age past 3 x 1 s: a dark set, in-flight decides. */
	wa = fx_worker(f, "http://a:1");
	wb = fx_worker(f, "http://b:2");
	wa->wk_load.wl_received_ms = shm_now_ms() - 3100;
	wb->wk_load.wl_received_ms = shm_now_ms() - 3100;
	policy_notify_report(f->fx_br, wa);
	policy_notify_report(f->fx_br, wb);
	shm_inflight_inc(f->fx_br->br_shm, 0, wb->wk_slot);
	for (i = 0; i < 20; i++)
		na += fx_route(f, NULL, 0) == 'a';
	assert_int_equal(na, 20);
	shm_inflight_dec(f->fx_br->br_shm, 0, wb->wk_slot);
	/* Inside the window the reports still count. */
	wa->wk_load.wl_received_ms = shm_now_ms() - 2900;
	wb->wk_load.wl_received_ms = shm_now_ms() - 2900;
	policy_notify_report(f->fx_br, wa);
	policy_notify_report(f->fx_br, wb);
	for (i = 0; i < 20; i++)
		assert_int_equal(fx_route(f, NULL, 0), 'b');
}

static void
test_non_reporting_peer(void **state)
{
	struct btu_fx *f = *state;
	struct rank a = { 0, 500, 100, 0 };
	struct worker *wb;
	int i, nb = 0;

	btu_fx_start(f);
	/*
	 * b never reported: idle, it scores the best reporter's score plus
	 * 0 x p̄ / nominal, an exact tie with a, broken at random (a's
	 * credit moves both scores alike).
	 */
	fx_load(f, "http://a:1", &a);
	wb = fx_worker(f, "http://b:2");
	for (i = 0; i < 400; i++)
		nb += fx_route(f, NULL, 0) == 'b';
	assert_true(nb > 140 && nb < 260);
	/* b busy: 3 in flight = 3 x 1024/100 s over the best reporter. */
	fx_load(f, "http://a:1", &a);
	for (i = 0; i < 3; i++)
		shm_inflight_inc(f->fx_br->br_shm, 0, wb->wk_slot);
	assert_int_equal(fx_route(f, NULL, 0), 'a');
	assert_int_equal(fx_route(f, NULL, 0), 'a');
	assert_int_equal(fx_route(f, NULL, 0), 'a');
	for (i = 0; i < 3; i++)
		shm_inflight_dec(f->fx_br->br_shm, 0, wb->wk_slot);
}

static void
test_dark_ties_are_uniform(void **state)
{
	struct btu_fx *f = *state;
	int counts[3] = { 0, 0, 0 }, i;
	struct worker *wc;

	f->fx_bs.bs_nworkers = 3;
	btu_fx_start(f);
	for (i = 0; i < 3000; i++)
		counts[fx_route(f, NULL, 0) - 'a']++;
	/* Expected 1000 each; 5 sigma is about 130. */
	for (i = 0; i < 3; i++)
		assert_true(counts[i] > 850 && counts[i] < 1150);
	/* Fewest in flight wins outright. */
	wc = fx_worker(f, "http://c:3");
	shm_inflight_inc(f->fx_br->br_shm, 0,
	    fx_worker(f, "http://a:1")->wk_slot);
	shm_inflight_inc(f->fx_br->br_shm, 0,
	    fx_worker(f, "http://b:2")->wk_slot);
	for (i = 0; i < 10; i++)
		assert_int_equal(fx_route(f, NULL, 0), 'c');
	(void)wc;
}

static void
test_flags_and_removal(void **state)
{
	struct btu_fx *f = *state;
	struct rank a = { 0, 100, 100, 0.98 }, b = { 0, 9000, 100, 0 };
	struct worker *wa;
	uint64_t tok, req, ida;

	/* λ = 2: a's KV barrier 2 x 0.98 / 0.02 = 98 s + 1 s > b's 90 s. */
	f->fx_bs.bs_ll_kv_pressure_weight = 2.0;
	btu_fx_start(f);
	assert_true(
	    scorer_get_tunables(policy_least_load_scorer(f->fx_br->br_default))
	        ->st_kv_pressure_weight == 2.0);
	fx_load(f, "http://a:1", &a);
	fx_load(f, "http://b:2", &b);
	assert_int_equal(fx_route(f, NULL, 0), 'b');
	wa = fx_worker(f, "http://a:1");
	assert_int_equal(
	    scorer_credit(policy_least_load_scorer(f->fx_br->br_default),
	        wa->wk_url_hash, &tok, &req),
	    0);
	/* Removal forgets the worker's report and credit. */
	ida = wa->wk_url_hash;
	registry_remove(f->fx_br, wa);
	assert_int_equal(
	    scorer_credit(policy_least_load_scorer(f->fx_br->br_default), ida,
	        &tok, &req),
	    -1);
	/* The remaining worker is the only candidate (no cap): it. */
	assert_int_equal(fx_route(f, NULL, 0), 'b');
}

static void
test_power_of_two(void **state)
{
	struct btu_fx *f = *state;
	struct rank busy = { 64, 100, 100, 0 }, idle = { 0, 50000, 100, 0 };
	const struct scorer_tunables *t;
	int i, seen[3] = { 0, 0, 0 };

	f->fx_bs.bs_policy = "power_of_two";
	f->fx_bs.bs_ll_max_waiting_requests = 48;
	f->fx_bs.bs_ll_kv_pressure_weight = 3.0;
	btu_fx_start(f);
	/* The --least-load-* flags do not reach power_of_two. */
	t = scorer_get_tunables(policy_least_load_scorer(f->fx_br->br_default));
	assert_true(t->st_kv_pressure_weight == 0.15);
	assert_int_equal(t->st_max_waiting_requests, 0);
	/* Two workers: the pair is both; a (1 s) beats b (500 s). */
	fx_load(f, "http://a:1", &busy);
	fx_load(f, "http://b:2", &idle);
	assert_int_equal(fx_route(f, NULL, 0), 'a');
	/* No cap: both "capped" by least_load's rule still get traffic. */
	fx_load(f, "http://b:2", &busy);
	assert_true(fx_route(f, NULL, 0) != '5');
	server_free(f->fx_br);
	/* Three dark workers: every worker is drawn. */
	f->fx_bs.bs_nworkers = 3;
	btu_fx_start(f);
	for (i = 0; i < 300; i++)
		seen[fx_route(f, NULL, 0) - 'a']++;
	for (i = 0; i < 3; i++)
		assert_true(seen[i] > 50);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_worked_numbers_and_credit,
		    fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_token_count_credit,
		    fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(
		    test_waiting_only_and_zero_throughput, fx_setup,
		    fx_teardown),
		cmocka_unit_test_setup_teardown(test_waiting_cap, fx_setup,
		    fx_teardown),
		cmocka_unit_test_setup_teardown(test_cap_single_worker,
		    fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(
		    test_stale_report_counts_as_missing, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_non_reporting_peer,
		    fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_dark_ties_are_uniform,
		    fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_flags_and_removal,
		    fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_power_of_two, fx_setup,
		    fx_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
