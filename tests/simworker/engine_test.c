/* engine_test.c: unit tests of the simulated engine's scheduler. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/simworker/simworker.h"

struct probe {
	struct engine *p_engine;
	int p_done;
	int p_order[16];
	uint32_t p_max_running;
	uint32_t p_max_waiting;
	uint32_t p_tokens[16];
	struct engine_info p_info[16];
	int p_stop_at; /* token count at which token_cb returns -1 */
};

struct tag {
	struct probe *t_probe;
	int t_id;
};

static void
observe(struct probe *p)
{
	struct engine_stats es;

	engine_get_stats(p->p_engine, &es);
	if (es.es_running > p->p_max_running)
		p->p_max_running = es.es_running;
	if (es.es_waiting > p->p_max_waiting)
		p->p_max_waiting = es.es_waiting;
}

static int
on_token(void *arg, const struct engine_info *info)
{
	struct tag *t = arg;

	t->t_probe->p_tokens[t->t_id] = info->ei_output_tokens;
	observe(t->t_probe);
	if (t->t_probe->p_stop_at > 0 &&
	    info->ei_output_tokens == (uint32_t)t->t_probe->p_stop_at)
		return -1;
	return 0;
}

static void
on_done(void *arg, const struct engine_info *info)
{
	struct tag *t = arg;
	struct probe *p = t->t_probe;

	p->p_info[t->t_id] = *info;
	p->p_order[p->p_done++] = t->t_id;
}

static uint32_t *
prompt(uint32_t n, uint32_t seed)
{
	uint32_t *t = calloc(n, sizeof(*t)), i;

	assert_non_null(t);
	for (i = 0; i < n; i++)
		t[i] = seed * 100000 + i;
	return t;
}

static struct engine *
setup(struct ev_loop *loop, struct cache *c, uint32_t max_running, double scale)
{
	struct engine_params ep = {
		.ep_max_running = max_running,
		.ep_prefill_tps = 8000,
		.ep_decode_base_ms = 6,
		.ep_decode_per_req_ms = 0.35,
		.ep_time_scale = scale,
	};

	return engine_new(loop, &ep, c, NULL, NULL);
}

static void
test_batch_limit(void **state)
{
	struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
	struct cache *c = cache_new(16, 65536);
	struct probe p;
	struct tag tags[5];
	struct engine_stats es;
	int i;

	(void)state;
	memset(&p, 0, sizeof(p));
	p.p_engine = setup(loop, c, 2, 0);
	for (i = 0; i < 5; i++) {
		tags[i] = (struct tag) { &p, i };
		assert_non_null(
		    engine_submit(p.p_engine, prompt(40, (uint32_t)i + 1), 40,
		        3, 0, on_token, on_done, &tags[i]));
	}
	engine_get_stats(p.p_engine, &es);
	assert_int_equal(es.es_running + es.es_waiting, 5);
	assert_int_equal(es.es_waiting_uncached, 40 * es.es_waiting);
	ev_run(loop, 0);
	assert_int_equal(p.p_done, 5);
	assert_int_equal(p.p_max_running, 2);
	assert_true(p.p_max_waiting >= 2);
	for (i = 0; i < 5; i++) {
		assert_int_equal(p.p_order[i], i); /* FIFO */
		assert_int_equal(p.p_info[i].ei_output_tokens, 3);
		assert_int_equal(p.p_info[i].ei_prompt_tokens, 40);
	}
	engine_get_stats(p.p_engine, &es);
	assert_int_equal(es.es_running, 0);
	assert_int_equal(es.es_used_tokens, 0);
	assert_int_equal(es.es_output_tokens, 15);
	engine_free(p.p_engine);
	cache_free(c);
	ev_loop_destroy(loop);
}

/* Two requests that do not fit in KV together run one after the other. */
static void
test_kv_admission(void **state)
{
	struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
	struct cache *c = cache_new(4, 32);
	struct probe p;
	struct tag tags[3];
	int i;

	(void)state;
	memset(&p, 0, sizeof(p));
	p.p_engine = setup(loop, c, 8, 0);
	for (i = 0; i < 2; i++) {
		tags[i] = (struct tag) { &p, i };
		assert_non_null(
		    engine_submit(p.p_engine, prompt(10, (uint32_t)i + 1), 10,
		        10, 0, on_token, on_done, &tags[i]));
	}
	/* Larger than the whole cache: refused. */
	tags[2] = (struct tag) { &p, 2 };
	assert_null(engine_submit(p.p_engine, prompt(30, 9), 30, 3, 0, on_token,
	    on_done, &tags[2]));
	ev_run(loop, 0);
	assert_int_equal(p.p_done, 2);
	assert_int_equal(p.p_max_running, 1);
	assert_int_equal(p.p_max_waiting, 1);
	engine_free(p.p_engine);
	cache_free(c);
	ev_loop_destroy(loop);
}

/* A repeated prompt is served from the cache, all but its last page. */
static void
test_prefix_reuse(void **state)
{
	struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
	struct cache *c = cache_new(16, 4096);
	struct probe p;
	struct tag tags[3];
	struct engine_stats es;
	uint32_t *t;

	(void)state;
	memset(&p, 0, sizeof(p));
	p.p_engine = setup(loop, c, 8, 0);
	tags[0] = (struct tag) { &p, 0 };
	tags[1] = (struct tag) { &p, 1 };
	tags[2] = (struct tag) { &p, 2 };
	engine_submit(p.p_engine, prompt(100, 1), 100, 2, 0, on_token, on_done,
	    &tags[0]);
	ev_run(loop, 0);
	t = prompt(100, 1);
	assert_int_equal(engine_cached_estimate(p.p_engine, t, 100), 96);
	free(t);
	engine_submit(p.p_engine, prompt(100, 1), 100, 2, 0, on_token, on_done,
	    &tags[1]);
	/* Exactly 6 pages: the last page is recomputed, not matched. */
	engine_submit(p.p_engine, prompt(96, 1), 96, 2, 0, on_token, on_done,
	    &tags[2]);
	ev_run(loop, 0);
	assert_int_equal(p.p_info[0].ei_cached_tokens, 0);
	assert_int_equal(p.p_info[1].ei_cached_tokens, 96);
	assert_int_equal(p.p_info[2].ei_cached_tokens, 80);
	engine_get_stats(p.p_engine, &es);
	assert_int_equal(es.es_prompt_tokens, 296);
	assert_int_equal(es.es_cached_tokens, 176);
	assert_int_equal(engine_flush(p.p_engine), 0);
	assert_int_equal(cache_cached_tokens(c), 0);
	engine_free(p.p_engine);
	cache_free(c);
	ev_loop_destroy(loop);
}

/* Prefill time follows uncached tokens; a hold keeps the slot. */
static void
test_timing_and_hold(void **state)
{
	struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
	struct cache *c = cache_new(16, 65536);
	struct probe p;
	struct tag tags[2];
	struct engine_stats es;
	double ttft, e2e;

	(void)state;
	memset(&p, 0, sizeof(p));
	/* 10x faster: 800 tokens at 8000/s = 100 ms -> 10 ms real. */
	p.p_engine = setup(loop, c, 8, 10);
	tags[0] = (struct tag) { &p, 0 };
	engine_submit(p.p_engine, prompt(800, 1), 800, 2, 0.5, on_token,
	    on_done, &tags[0]);
	ev_run(loop, EVRUN_ONCE);
	engine_get_stats(p.p_engine, &es);
	assert_int_equal(es.es_running, 1);
	ev_run(loop, 0);
	assert_int_equal(p.p_done, 1);
	ttft = p.p_info[0].ei_first_token - p.p_info[0].ei_arrival;
	assert_true(ttft >= 0.0095);
	assert_true(ttft < 0.5);
	ev_now_update(loop);
	e2e = ev_now(loop) - p.p_info[0].ei_arrival;
	/* Hold of 500 ms model time = 50 ms real, after the tokens. */
	assert_true(e2e >= 0.0095 + 0.0006 + 0.05);
	engine_free(p.p_engine);
	cache_free(c);
	ev_loop_destroy(loop);
}

/*
 * gen_throughput counts decoding time only: an engine that went idle
 * reports the speed it decoded at, not tokens diluted by idle seconds.
 */
static void
test_throughput_not_diluted(void **state)
{
	struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
	struct cache *c = cache_new(16, 65536);
	struct probe p;
	struct tag tag;
	struct engine_stats es;

	(void)state;
	memset(&p, 0, sizeof(p));
	/* 10x faster: a step of 6.35 ms model time is 0.635 ms real. */
	p.p_engine = setup(loop, c, 8, 10);
	tag = (struct tag) { &p, 0 };
	engine_submit(p.p_engine, prompt(16, 3), 16, 300, 0, on_token, on_done,
	    &tag);
	ev_run(loop, 0);
	assert_int_equal(p.p_done, 1);
	ev_sleep(1.1);
	ev_now_update(loop);
	engine_get_stats(p.p_engine, &es);
	/* About 1 / 0.635 ms = 1575 tokens/s; diluted it would be ~230. */
	assert_true(es.es_gen_throughput > 1000);
	assert_true(es.es_gen_throughput < 2000);
	engine_free(p.p_engine);
	cache_free(c);
	ev_loop_destroy(loop);
}

static void
count_step(void *arg)
{
	(*(int *)arg)++;
}

/*
 * With a prefill limit a step admits requests while their uncached tokens
 * fit (the first always), so a short prompt queued behind a long one gets
 * its first token in a step of its own; without it, everything waiting
 * goes into one step.
 */
static void
test_max_prefill_tokens(void **state)
{
	struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
	struct cache *c = cache_new(16, 65536);
	struct engine_params ep = {
		.ep_max_running = 8,
		.ep_prefill_tps = 8000,
		.ep_time_scale = 0,
	};
	struct probe p;
	struct tag tags[4];
	uint32_t lens[4] = { 2000, 300, 500, 100 };
	int i, limited, steps;

	(void)state;
	for (limited = 0; limited < 2; limited++) {
		memset(&p, 0, sizeof(p));
		ep.ep_max_prefill_tokens = limited ? 600 : 0;
		steps = 0;
		p.p_engine = engine_new(loop, &ep, c, count_step, &steps);
		for (i = 0; i < 4; i++) {
			tags[i] = (struct tag) { &p, i };
			assert_non_null(engine_submit(p.p_engine,
			    prompt(lens[i], (uint32_t)(10 * limited + i + 1)),
			    lens[i], 1, 0, on_token, on_done, &tags[i]));
		}
		ev_run(loop, 0);
		assert_int_equal(p.p_done, 4);
		/* The first submit starts a step of the 2000 alone. Then,
		 * limited: 300 (+500 is over), then 500 + 100: three steps,
		 * at most two requests in one. Unlimited: one step of the
		 * other three. */
		assert_int_equal(steps, limited ? 3 : 2);
		assert_int_equal(p.p_max_running, limited ? 2 : 3);
		for (i = 0; i < 4; i++)
			assert_int_equal(p.p_order[i], i);
		engine_free(p.p_engine);
		assert_int_equal(cache_flush(c), 0);
	}
	cache_free(c);
	ev_loop_destroy(loop);
}

/* Cancelling, in any state or from the token callback, frees all. */
static void
test_cancel(void **state)
{
	struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
	struct cache *c = cache_new(16, 65536);
	struct engine_req *r[4];
	struct engine_stats es;
	struct probe p;
	struct tag tags[4];
	int i;

	(void)state;
	memset(&p, 0, sizeof(p));
	p.p_engine = setup(loop, c, 1, 0);
	for (i = 0; i < 4; i++) {
		tags[i] = (struct tag) { &p, i };
		r[i] = engine_submit(p.p_engine, prompt(50, (uint32_t)i + 1),
		    50, 4, 0, on_token, on_done, &tags[i]);
		assert_non_null(r[i]);
	}
	engine_cancel(p.p_engine, r[0]); /* running (prefill) */
	engine_cancel(p.p_engine, r[2]); /* waiting */
	p.p_stop_at = 2; /* r[1] and r[3] dropped at 2 */
	ev_run(loop, 0);
	assert_int_equal(p.p_done, 0);
	assert_int_equal(p.p_tokens[1], 2);
	assert_int_equal(p.p_tokens[3], 2);
	engine_get_stats(p.p_engine, &es);
	assert_int_equal(es.es_running + es.es_waiting, 0);
	assert_int_equal(es.es_used_tokens, 0);
	/* And engine_free() drops what is still queued. */
	p.p_stop_at = 0;
	engine_submit(p.p_engine, prompt(50, 7), 50, 4, 0, on_token, on_done,
	    &tags[0]);
	engine_submit(p.p_engine, prompt(50, 8), 50, 4, 0, on_token, on_done,
	    &tags[1]);
	engine_free(p.p_engine);
	assert_int_equal(p.p_done, 0);
	cache_free(c);
	ev_loop_destroy(loop);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_batch_limit),
		cmocka_unit_test(test_kv_admission),
		cmocka_unit_test(test_prefix_reuse),
		cmocka_unit_test(test_timing_and_hold),
		cmocka_unit_test(test_throughput_not_diluted),
		cmocka_unit_test(test_max_prefill_tokens),
		cmocka_unit_test(test_cancel),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
