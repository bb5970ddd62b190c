/*
 * policy_least_load_test.c: least_load and power_of_two wired into a
 * whole broker (server_new without sockets), fed LoadReports the way the
 * poller sends them and asked for decisions the way a frontend does:
 * hand-computed scores from live pending tokens in shm and reports
 * together (without counting twice), the waiting cap and its 503, stale
 * reports, learned prefill rates and their gauges, a burst spread in
 * proportion to speed, the flags reaching least_load but not
 * power_of_two, in-flight counts from shm, removal, and the uniform random
 * tie-break.
 */
#define _XOPEN_SOURCE 700
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <math.h>

#include <cmocka.h>

#include "shared/ipc.h"
#include "shared/metrics.h"
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
	f->fx_cf.cf_cb_failure_threshold = 5;
	f->fx_cf.cf_health_failure_threshold = 2;
	f->fx_cf.cf_health_success_threshold = 2;
	f->fx_cf.cf_load_monitor_interval = 1;
	/* The CLI defaults, as main.c fills them. */
	f->fx_cf.cf_least_load_kv_pressure_weight = 0.15;
	f->fx_cf.cf_least_load_default_throughput = 2000.0;
	f->fx_cf.cf_least_load_mean_prefill_tokens = 1024;
	f->fx_cf.cf_least_load_max_waiting_requests = 0;
	f->fx_cf.cf_worker_urls_n = 2;
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

/* Value of a series in the metrics text, -1 when absent. */
static long
fx_metric(struct btu_fx *f, const char *series)
{
	char *out = NULL, pat[256], *p;
	size_t len;
	long v = -1;

	assert_int_equal(metrics_render(f->fx_br->br_shm, &out, &len), 0);
	snprintf(pat, sizeof(pat), "\n%s ", series);
	if ((p = strstr(out, pat)) != NULL)
		v = strtol(p + strlen(pat), NULL, 10);
	free(out);
	return v;
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

/*
 * One decision; returns the worker URL's host letter, or '5' for 503.
 * With `send`, the chosen worker's pending tokens grow by the prompt as a
 * frontend's dispatch would (the tokens, else p̄).
 */
static char
fx_route_send(struct btu_fx *f, const uint32_t *tokens, size_t ntokens,
    bool send)
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
	if (send)
		shm_pending_add(f->fx_br->br_shm, 0, d.worker_slot,
		    tokens != NULL ? (int64_t)ntokens : 1024);
	return d.worker_url[7];
}

static char
fx_route(struct btu_fx *f, const uint32_t *tokens, size_t ntokens)
{
	return fx_route_send(f, tokens, ntokens, false);
}

/* Teaches url a prefill rate: outcomes of `tokens` in 1 s each. */
static void
fx_learn(struct btu_fx *f, const char *url, uint32_t tokens, int n)
{
	Smg__Outcome o = SMG__OUTCOME__INIT;
	struct worker *w = fx_worker(f, url);
	int i;

	o.worker_slot = w->wk_slot;
	o.worker_generation = w->wk_generation;
	o.http_status = 200;
	o.prompt_tokens = tokens;
	o.ttfb_us = 1000000;
	o.first_byte = true;
	for (i = 0; i < n; i++)
		route_outcome(f->fx_br, &o);
}

static void
fx_pending(struct btu_fx *f, const char *url, int64_t tokens)
{
	shm_pending_add(f->fx_br->br_shm, 0, fx_worker(f, url)->wk_slot,
	    tokens);
}

static void
test_worked_numbers_and_live(void **state)
{
	struct btu_fx *f = *state;
	struct rank a = { 0, 8000, 100, 0.2 }, b = { 0, 1000, 100, 0.2 };
	uint64_t req;
	int i;

	btu_fx_start(f);
	fx_load(f, "http://a:1", &a);
	fx_load(f, "http://b:2", &b);
	/*
	 * No rate learned: T₀ 2000 tokens/s. a: (8000 + 1024) / 2000 +
	 * 0.15 * 0.2 / 0.8 = 4.5495 s; b: (1000 + 1024) / 2000 + 0.0375 =
	 * 1.0495 s. Each dispatch to b adds p̄ = 1024 pending tokens: b stays
	 * below a for m <= 6 (pending 6144) and passes it at m = 7 (7168).
	 */
	for (i = 0; i < 7; i++)
		assert_int_equal(fx_route_send(f, NULL, 0, true), 'b');
	assert_int_equal(fx_route_send(f, NULL, 0, true), 'a');
	assert_int_equal(
	    scorer_credit(policy_least_load_scorer(f->fx_br->br_default),
	        fx_worker(f, "http://b:2")->wk_url_hash, &req),
	    0);
	assert_int_equal(req, 7);
	/*
	 * A fresh report of b that shows its queue as this gateway sent it
	 * adds nothing (no double counting): b 7168 + 1024 < a 9024 + 1024.
	 */
	b.uncached = 7168;
	fx_load(f, "http://b:2", &b);
	assert_int_equal(fx_route(f, NULL, 0), 'b');
	/* Its first token released: b is lighter still. */
	fx_pending(f, "http://b:2", -7168);
	assert_int_equal(fx_route(f, NULL, 0), 'b');
}

static void
test_token_count(void **state)
{
	struct btu_fx *f = *state;
	struct rank a = { 0, 2000, 100, 0 }, b = { 0, 1000, 100, 0 };
	uint32_t toks[600];

	btu_fx_start(f);
	memset(toks, 0, sizeof(toks));
	fx_load(f, "http://a:1", &a);
	fx_load(f, "http://b:2", &b);
	/* a 2000 + 600, b 1000 + 600; every dispatch adds its 600 tokens. */
	assert_int_equal(fx_route_send(f, toks, 600, true), 'b'); /* 2200 */
	assert_int_equal(fx_route_send(f, toks, 600, true), 'b'); /* 2800 */
	assert_int_equal(fx_route_send(f, toks, 600, true), 'a');
	assert_int_equal(shm_pending_total(f->fx_br->br_shm,
	                     fx_worker(f, "http://b:2")->wk_slot),
	    1200);
}

static void
test_waiting_only_and_zero_throughput(void **state)
{
	struct btu_fx *f = *state;
	struct rank a = { 64, 0, 100, 0 }, b = { 0, 60000, 100, 0 };
	struct rank c = { 0, 10000, 0, 0 }, d = { 0, 1000, 0, 0 };

	btu_fx_start(f);
	/* a: 64 waiting, no token count: 64 x 1024 = 65536 tokens; b 60000. */
	fx_load(f, "http://a:1", &a);
	fx_load(f, "http://b:2", &b);
	assert_int_equal(fx_route(f, NULL, 0), 'b');
	/* Throughput 0 on both (it is a decode rate; not used): 10000 vs
	 * 1000 tokens. */
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

	f->fx_cf.cf_least_load_max_waiting_requests = 48;
	btu_fx_start(f);
	/* a would score best, but it is over the cap. */
	fx_load(f, "http://a:1", &busy);
	fx_load(f, "http://b:2", &idle);
	assert_int_equal(fx_route(f, NULL, 0), 'b');
	/* Both capped: 503 no_available_workers. */
	fx_load(f, "http://b:2", &busy);
	assert_int_equal(fx_route(f, NULL, 0), '5');
	/* 47 waiting + 1 dispatched request reaches 48: capped after one. */
	fx_load(f, "http://a:1", &edge);
	assert_int_equal(fx_route(f, NULL, 0), 'a');
	assert_int_equal(fx_route(f, NULL, 0), '5');
}

static void
test_cap_single_worker(void **state)
{
	struct btu_fx *f = *state;
	struct rank busy = { 64, 100, 100, 0 };

	f->fx_cf.cf_least_load_max_waiting_requests = 48;
	f->fx_cf.cf_worker_urls_n = 1;
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
	/* Both reports age past 3 x 1 s: live figures alone decide. */
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
	/* Live pending tokens still count without reports. */
	fx_pending(f, "http://a:1", 5000);
	for (i = 0; i < 20; i++)
		assert_int_equal(fx_route(f, NULL, 0), 'b');
	fx_pending(f, "http://a:1", -5000);
	shm_inflight_dec(f->fx_br->br_shm, 0, wb->wk_slot);
	/*
	 * Inside the window the reports still count, drained at T₀ for
	 * their age: a 100000 - 2.9 x 2000 tokens, still far above b.
	 */
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
	int i;

	btu_fx_start(f);
	/* b never reported and is idle live: it beats a's 500 queued. */
	fx_load(f, "http://a:1", &a);
	for (i = 0; i < 20; i++)
		assert_int_equal(fx_route(f, NULL, 0), 'b');
	/* b has 3000 prompt tokens waiting: a (500) wins. */
	fx_pending(f, "http://b:2", 3000);
	for (i = 0; i < 20; i++)
		assert_int_equal(fx_route(f, NULL, 0), 'a');
	fx_pending(f, "http://b:2", -3000);
}

static void
test_live_and_report_together(void **state)
{
	struct btu_fx *f = *state;
	struct rank b = { 0, 20000, 100, 0 }, a = { 0, 2000, 100, 0 };

	btu_fx_start(f);
	/*
	 * b had 5000 of this gateway's tokens pending when it reported 20000
	 * queued: 15000 are someone else's. With 8000 pending now b counts
	 * 23000; a, unreported, 20000 live: a.
	 */
	fx_pending(f, "http://b:2", 5000);
	fx_load(f, "http://b:2", &b);
	fx_pending(f, "http://b:2", 3000);
	fx_pending(f, "http://a:1", 20000);
	assert_int_equal(fx_route(f, NULL, 0), 'a');
	/* a's report is below what this gateway has there: no excess. */
	fx_load(f, "http://a:1", &a);
	assert_int_equal(fx_route(f, NULL, 0), 'a');
	/* A report of b showing only its live queue: b 8000 < a 20000. */
	b.uncached = 8000;
	fx_load(f, "http://b:2", &b);
	assert_int_equal(fx_route(f, NULL, 0), 'b');
}

static void
test_learned_rates(void **state)
{
	struct btu_fx *f = *state;
	struct worker *wa, *wb;
	int i, n[2] = { 0, 0 };

	btu_fx_start(f);
	wa = fx_worker(f, "http://a:1");
	wb = fx_worker(f, "http://b:2");
	/* Nothing learned: no rate of their own, no model prior. */
	assert_true(live_rate(wa) == 0);
	fx_learn(f, "http://a:1", 10000, 5);
	fx_learn(f, "http://b:2", 5000, 5);
	assert_true(fabs(live_rate(wa) - 10000) < 1);
	assert_true(fabs(live_rate(wb) - 5000) < 1);
	/* The gauges follow on the tick. */
	live_tick(f->fx_br);
	assert_int_equal(fx_metric(f,
	                     "smg_worker_prefill_rate_tokens_per_"
	                     "second{worker=\"http://a:1\"}"),
	    10000);
	/* a holds 15000 pending (1.6 s at 10000/s), b 6000 (1.4 s). */
	fx_pending(f, "http://a:1", 15000);
	fx_pending(f, "http://b:2", 6000);
	assert_int_equal(fx_route(f, NULL, 0), 'b');
	fx_pending(f, "http://b:2", 2000); /* b 1.8 s */
	assert_int_equal(fx_route(f, NULL, 0), 'a');
	assert_int_equal(
	    fx_metric(f,
	        "smg_worker_outstanding_prefill_tokens{worker=\"http://b:2\"}"),
	    0); /* as the last tick saw it */
	live_tick(f->fx_br);
	assert_int_equal(
	    fx_metric(f,
	        "smg_worker_outstanding_prefill_tokens{worker=\"http://b:2\"}"),
	    8000);
	fx_pending(f, "http://a:1", -15000);
	fx_pending(f, "http://b:2", -8000);
	/*
	 * A burst of equal requests between reports spreads in proportion
	 * to speed: b, at half a's rate, gets half as many.
	 */
	for (i = 0; i < 300; i++)
		n[fx_route_send(f, NULL, 0, true) - 'a']++;
	assert_in_range(n[1], 95, 105);
	assert_in_range(n[0], 195, 205);
	/* A worker without samples takes its model's median as prior. */
	live_tick(f->fx_br);
	assert_non_null(wb->wk_me);
	assert_true(fabs(wb->wk_me->me_rate_prior - 7500) < 1);
	/* Non-streamed first bytes and outcomes without one teach nothing. */
	{
		Smg__Outcome o = SMG__OUTCOME__INIT;

		o.worker_slot = wa->wk_slot;
		o.worker_generation = wa->wk_generation;
		o.prompt_tokens = 100000;
		o.ttfb_us = 1000;
		o.first_byte = true;
		o.unstreamed = true;
		route_outcome(f->fx_br, &o);
		o.unstreamed = false;
		o.first_byte = false;
		route_outcome(f->fx_br, &o);
		assert_true(fabs(live_rate(wa) - 10000) < 1);
		/* The cached part was not prefilled: 100000 - 90000 in 1 s. */
		o.first_byte = true;
		o.ttfb_us = 1000000;
		o.cached_tokens = 90000;
		route_outcome(f->fx_br, &o);
		assert_true(fabs(live_rate(wa) - 10000) < 1);
	}
	/* Removal zeroes the gauges. */
	registry_remove(f->fx_br, wa);
	assert_int_equal(fx_metric(f,
	                     "smg_worker_prefill_rate_tokens_per_"
	                     "second{worker=\"http://a:1\"}"),
	    0);
	/* Re-registered (a new generation), it learns from scratch, and the
	 * outcomes of its former self are not its own. */
	{
		Smg__Outcome o = SMG__OUTCOME__INIT;
		struct worker_spec ws;
		const char *why = NULL;
		uint32_t old_gen = wb->wk_generation;
		unsigned old_slot = wb->wk_slot;

		registry_remove(f->fx_br, wb);
		memset(&ws, 0, sizeof(ws));
		ws.ws_url = "http://b:2";
		ws.ws_bootstrap_port = -1;
		ws.ws_health_disabled = true;
		wb = registry_add(f->fx_br, &ws, false, &why);
		assert_non_null(wb);
		assert_int_not_equal(wb->wk_generation, old_gen);
		assert_false(rate_known(&wb->wk_rate));
		o.worker_slot = old_slot;
		o.worker_generation = old_gen;
		o.prompt_tokens = 30000;
		o.ttfb_us = 1000000;
		o.first_byte = true;
		route_outcome(f->fx_br, &o);
		assert_false(rate_known(&wb->wk_rate));
		fx_learn(f, "http://b:2", 3000, 3);
		assert_true(fabs(live_rate(wb) - 3000) < 1);
	}
}

static void
test_dark_ties_are_uniform(void **state)
{
	struct btu_fx *f = *state;
	int counts[3] = { 0, 0, 0 }, i;

	f->fx_cf.cf_worker_urls_n = 3;
	btu_fx_start(f);
	for (i = 0; i < 3000; i++)
		counts[fx_route(f, NULL, 0) - 'a']++;
	/* Expected 1000 each; 5 sigma is about 130. */
	for (i = 0; i < 3; i++)
		assert_true(counts[i] > 850 && counts[i] < 1150);
	/* Fewest in flight wins outright. */
	shm_inflight_inc(f->fx_br->br_shm, 0,
	    fx_worker(f, "http://a:1")->wk_slot);
	shm_inflight_inc(f->fx_br->br_shm, 0,
	    fx_worker(f, "http://b:2")->wk_slot);
	for (i = 0; i < 10; i++)
		assert_int_equal(fx_route(f, NULL, 0), 'c');
}

static void
test_flags_and_removal(void **state)
{
	struct btu_fx *f = *state;
	struct rank a = { 0, 100, 100, 0.98 }, b = { 0, 9000, 100, 0 };
	struct worker *wa;
	uint64_t req, ida;

	/* λ = 2: a's KV barrier 2 x 0.98 / 0.02 = 98 s > b's 5 s. */
	f->fx_cf.cf_least_load_kv_pressure_weight = 2.0;
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
	        wa->wk_url_hash, &req),
	    0);
	/* Removal forgets the worker's report and count. */
	ida = wa->wk_url_hash;
	registry_remove(f->fx_br, wa);
	assert_int_equal(
	    scorer_credit(policy_least_load_scorer(f->fx_br->br_default), ida,
	        &req),
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

	f->fx_cf.cf_policy = POLICY_POWER_OF_TWO;
	f->fx_cf.cf_least_load_max_waiting_requests = 48;
	f->fx_cf.cf_least_load_kv_pressure_weight = 3.0;
	btu_fx_start(f);
	/* The --least-load-* flags do not reach power_of_two. */
	t = scorer_get_tunables(policy_least_load_scorer(f->fx_br->br_default));
	assert_true(t->st_kv_pressure_weight == 0.15);
	assert_int_equal(t->st_max_waiting_requests, 0);
	/* Two workers: the pair is both; a (100 tokens) beats b (50000). */
	fx_load(f, "http://a:1", &busy);
	fx_load(f, "http://b:2", &idle);
	assert_int_equal(fx_route(f, NULL, 0), 'a');
	/* Live pending moves it: a with 60000 waiting loses to b. */
	fx_pending(f, "http://a:1", 60000);
	assert_int_equal(fx_route(f, NULL, 0), 'b');
	fx_pending(f, "http://a:1", -60000);
	/* No cap: both "capped" by least_load's rule still get traffic. */
	fx_load(f, "http://b:2", &busy);
	assert_true(fx_route(f, NULL, 0) != '5');
	server_free(f->fx_br);
	/* Three dark workers: every worker is drawn. */
	f->fx_cf.cf_worker_urls_n = 3;
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
		cmocka_unit_test_setup_teardown(test_worked_numbers_and_live,
		    fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_token_count, fx_setup,
		    fx_teardown),
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
		cmocka_unit_test_setup_teardown(test_live_and_report_together,
		    fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_learned_rates, fx_setup,
		    fx_teardown),
		cmocka_unit_test_setup_teardown(test_dark_ties_are_uniform,
		    fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_flags_and_removal,
		    fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_power_of_two, fx_setup,
		    fx_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
