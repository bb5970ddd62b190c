/*
 * engine.c: the simulated engine's scheduler: a waiting queue, a running
 * batch admitted by batch size and KV capacity, and steps timed like a GPU
 * (prefill of uncached tokens, then one token per running request per step).
 */
#include <sys/queue.h>

#include <stdlib.h>
#include <string.h>

#include "shared/log.h"
#include "shared/xmalloc.h"
#include "tests/simworker/simworker.h"

/* Zero-delay steps run back to back before the loop polls I/O again. */
#define ENGINE_BURST 16

enum engine_state {
	ENGINE_WAITING = 0,
	ENGINE_PREFILL, /* admitted in the current step */
	ENGINE_DECODE,
	ENGINE_HOLD, /* all tokens out, response held open */
};

struct engine_req {
	TAILQ_ENTRY(engine_req) er_entry;
	struct engine *er_engine;
	enum engine_state er_state;
	uint32_t *er_tokens;
	uint32_t er_max_tokens;
	struct cache_page **er_pages; /* one slot per full prompt page */
	uint32_t er_npages; /* locked pages */
	uint64_t er_reserved; /* tokens reserved in the cache */
	uint64_t er_uncached_est; /* while waiting */
	double er_hold;
	ev_timer er_hold_timer;
	engine_token_cb er_token_cb;
	engine_done_cb er_done_cb;
	void *er_arg;
	struct engine_info er_info;
};

TAILQ_HEAD(engine_queue, engine_req);

struct engine {
	struct ev_loop *e_loop;
	struct engine_params e_params;
	struct cache *e_cache;
	void (*e_hook)(void *);
	void *e_hook_arg;
	struct engine_queue e_waiting;
	struct engine_queue e_running;
	uint32_t e_nwaiting;
	uint32_t e_nrunning;
	uint64_t e_waiting_uncached;
	ev_timer e_step;
	int e_stepping;
	int e_closing; /* engine_free: admit nothing more */
	uint64_t e_prompt_tokens;
	uint64_t e_cached_tokens;
	uint64_t e_output_tokens;
	double e_win_start; /* throughput window */
	uint64_t e_win_tokens;
	double e_win_busy; /* seconds spent stepping in the window */
	double e_step_secs; /* length of the step being run */
	double e_rate;
};

static void engine_kick(struct engine *);
static void engine_step_begin(struct engine *);
static int engine_step_plan(struct engine *, double *);
static void engine_step_run(struct engine *);
static double engine_window_rate(const struct engine *, double);
static void engine_step_cb(struct ev_loop *, ev_timer *, int);
static void engine_hold_cb(struct ev_loop *, ev_timer *, int);
static int engine_admit(struct engine *, struct engine_req *);
static void engine_release(struct engine *, struct engine_req *);
static void engine_finish(struct engine *, struct engine_req *);
static void engine_complete(struct engine *, struct engine_req *);

struct engine *
engine_new(struct ev_loop *loop, const struct engine_params *p, struct cache *c,
    void (*step_hook)(void *), void *hook_arg)
{
	struct engine *e;

	e = xcalloc(1, sizeof(*e));
	e->e_loop = loop;
	e->e_params = *p;
	e->e_cache = c;
	e->e_hook = step_hook;
	e->e_hook_arg = hook_arg;
	TAILQ_INIT(&e->e_waiting);
	TAILQ_INIT(&e->e_running);
	ev_timer_init(&e->e_step, engine_step_cb, 0, 0);
	e->e_step.data = e;
	e->e_win_start = ev_now(loop);
	return e;
}

void
engine_free(struct engine *e)
{
	struct engine_req *r;

	if (e == NULL)
		return;
	e->e_closing = 1;
	while ((r = TAILQ_FIRST(&e->e_waiting)) != NULL)
		engine_cancel(e, r);
	while ((r = TAILQ_FIRST(&e->e_running)) != NULL)
		engine_cancel(e, r);
	ev_timer_stop(e->e_loop, &e->e_step);
	free(e);
}

double
engine_scale(const struct engine *e, double d)
{
	if (e->e_params.ep_time_scale <= 0)
		return 0;
	return d / e->e_params.ep_time_scale;
}

uint32_t
engine_cached_estimate(struct engine *e, const uint32_t *tokens, uint32_t n)
{
	uint32_t ps = cache_page_size(e->e_cache);

	if (n == 0)
		return 0;
	/* At least one prompt token is always computed, as engines do. */
	return cache_match(e->e_cache, tokens, (n - 1) / ps, NULL) * ps;
}

struct engine_req *
engine_submit(struct engine *e, uint32_t *tokens, uint32_t n,
    uint32_t max_tokens, double hold, engine_token_cb token_cb,
    engine_done_cb done_cb, void *arg)
{
	struct engine_req *r;
	uint32_t ps = cache_page_size(e->e_cache);

	if (n == 0 || max_tokens == 0 ||
	    (uint64_t)n + max_tokens > cache_capacity(e->e_cache)) {
		free(tokens);
		return NULL;
	}
	if ((r = calloc(1, sizeof(*r))) == NULL) {
		free(tokens);
		return NULL;
	}
	if ((r->er_pages = calloc(n / ps + 1, sizeof(*r->er_pages))) == NULL) {
		free(r);
		free(tokens);
		return NULL;
	}
	r->er_engine = e;
	r->er_state = ENGINE_WAITING;
	r->er_tokens = tokens;
	r->er_max_tokens = max_tokens;
	r->er_hold = hold;
	r->er_token_cb = token_cb;
	r->er_done_cb = done_cb;
	r->er_arg = arg;
	r->er_info.ei_prompt_tokens = n;
	r->er_info.ei_max_tokens = max_tokens;
	r->er_info.ei_arrival = ev_now(e->e_loop);
	r->er_uncached_est = n - engine_cached_estimate(e, tokens, n);
	ev_timer_init(&r->er_hold_timer, engine_hold_cb, 0, 0);
	r->er_hold_timer.data = r;
	TAILQ_INSERT_TAIL(&e->e_waiting, r, er_entry);
	e->e_nwaiting++;
	e->e_waiting_uncached += r->er_uncached_est;
	engine_kick(e);
	return r;
}

/* Gives back what an admitted request holds in the cache. */
static void
engine_release(struct engine *e, struct engine_req *r)
{
	cache_unlock(e->e_cache, r->er_pages, r->er_npages);
	r->er_npages = 0;
	cache_unreserve(e->e_cache, r->er_reserved);
	r->er_reserved = 0;
}

void
engine_cancel(struct engine *e, struct engine_req *r)
{
	if (r->er_state == ENGINE_WAITING) {
		TAILQ_REMOVE(&e->e_waiting, r, er_entry);
		e->e_nwaiting--;
		e->e_waiting_uncached -= r->er_uncached_est;
	} else {
		ev_timer_stop(e->e_loop, &r->er_hold_timer);
		engine_release(e, r);
		TAILQ_REMOVE(&e->e_running, r, er_entry);
		e->e_nrunning--;
	}
	free(r->er_pages);
	free(r->er_tokens);
	free(r);
	engine_kick(e);
}

/* Locks the cached prefix and reserves the rest; -1 if KV is short. */
static int
engine_admit(struct engine *e, struct engine_req *r)
{
	uint32_t ps = cache_page_size(e->e_cache);
	uint32_t n = r->er_info.ei_prompt_tokens;
	uint32_t matched;
	uint64_t need;

	matched =
	    cache_match(e->e_cache, r->er_tokens, (n - 1) / ps, r->er_pages);
	need = (uint64_t)(n - matched * ps) + r->er_max_tokens;
	if (cache_reserve(e->e_cache, need) == -1) {
		cache_unlock(e->e_cache, r->er_pages, matched);
		return -1;
	}
	r->er_npages = matched;
	r->er_reserved = need;
	r->er_info.ei_cached_tokens = matched * ps;
	TAILQ_REMOVE(&e->e_waiting, r, er_entry);
	e->e_nwaiting--;
	e->e_waiting_uncached -= r->er_uncached_est;
	TAILQ_INSERT_TAIL(&e->e_running, r, er_entry);
	e->e_nrunning++;
	r->er_state = ENGINE_PREFILL;
	e->e_prompt_tokens += n;
	e->e_cached_tokens += r->er_info.ei_cached_tokens;
	return 0;
}

static void
engine_kick(struct engine *e)
{
	if (!e->e_stepping && !e->e_closing)
		engine_step_begin(e);
}

/*
 * Admits what fits (batch size, KV, prefill tokens per step) and returns
 * the real-time length of the next step (prefill of the admitted requests
 * plus one decode token for the others);
 * -1 when there is nothing to step.
 */
static int
engine_step_plan(struct engine *e, double *delay)
{
	struct engine_req *r;
	uint64_t prefill = 0;
	uint32_t decoding = 0;
	double ms = 0;

	while ((r = TAILQ_FIRST(&e->e_waiting)) != NULL &&
	    e->e_nrunning < e->e_params.ep_max_running) {
		/* Estimated at arrival: a prefix cached since only makes it
		 * smaller, so the limit holds. */
		if (e->e_params.ep_max_prefill_tokens > 0 && prefill > 0 &&
		    prefill + r->er_uncached_est >
		        e->e_params.ep_max_prefill_tokens)
			break;
		if (engine_admit(e, r) == -1)
			break;
		prefill +=
		    r->er_info.ei_prompt_tokens - r->er_info.ei_cached_tokens;
	}
	TAILQ_FOREACH(r, &e->e_running, er_entry)
	if (r->er_state == ENGINE_DECODE)
		decoding++;
	if (prefill == 0 && decoding == 0)
		return -1;
	if (prefill > 0)
		ms += (double)prefill * 1000.0 / e->e_params.ep_prefill_tps;
	if (decoding > 0)
		ms += e->e_params.ep_decode_base_ms +
		    e->e_params.ep_decode_per_req_ms * decoding;
	*delay = engine_scale(e, ms / 1000.0);
	e->e_step_secs = *delay;
	return 0;
}

static void
engine_step_begin(struct engine *e)
{
	double delay;

	if (engine_step_plan(e, &delay) == -1) {
		e->e_stepping = 0;
		return;
	}
	e->e_stepping = 1;
	ev_timer_set(&e->e_step, delay, 0);
	ev_timer_start(e->e_loop, &e->e_step);
}

static void
engine_step_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct engine *e = w->data;
	double delay;
	int n;

	(void)loop;
	(void)revents;
	for (n = 1;; n++) {
		engine_step_run(e);
		if (e->e_hook != NULL)
			e->e_hook(e->e_hook_arg);
		if (engine_step_plan(e, &delay) == -1) {
			e->e_stepping = 0;
			return;
		}
		if (delay > 0 || n >= ENGINE_BURST)
			break;
	}
	ev_timer_set(&e->e_step, delay, 0);
	ev_timer_start(e->e_loop, &e->e_step);
}

/* The end of a step: first tokens of the prefilled, a token for others. */
static void
engine_step_run(struct engine *e)
{
	struct engine_req *r, *next;
	uint32_t ps = cache_page_size(e->e_cache);
	uint32_t full;
	double now = ev_now(e->e_loop);

	for (r = TAILQ_FIRST(&e->e_running); r != NULL; r = next) {
		next = TAILQ_NEXT(r, er_entry);
		if (r->er_state == ENGINE_HOLD)
			continue;
		if (r->er_state == ENGINE_PREFILL) {
			full = r->er_info.ei_prompt_tokens / ps;
			cache_insert(e->e_cache, r->er_tokens, r->er_npages,
			    full, r->er_pages);
			r->er_reserved -= (uint64_t)(full - r->er_npages) * ps;
			r->er_npages = full;
			r->er_info.ei_first_token = now;
			r->er_state = ENGINE_DECODE;
		}
		r->er_info.ei_output_tokens++;
		e->e_output_tokens++;
		if (r->er_token_cb(r->er_arg, &r->er_info) == -1) {
			/* Safe here: e_stepping keeps engine_kick() idle. */
			engine_cancel(e, r);
			continue;
		}
		if (r->er_info.ei_output_tokens >= r->er_max_tokens)
			engine_finish(e, r);
	}
	e->e_win_busy += e->e_step_secs;
	if (now - e->e_win_start >= 1.0) {
		e->e_rate = engine_window_rate(e, now);
		e->e_win_start = now;
		e->e_win_tokens = e->e_output_tokens;
		e->e_win_busy = 0;
	}
}

/*
 * Generation throughput as engines report it: tokens over the time spent
 * decoding, not diluted by idle time (an idle engine is not a slow one).
 * Without sleeping (--time-scale 0) steps take no simulated time: use the
 * wall clock.
 */
static double
engine_window_rate(const struct engine *e, double now)
{
	double tokens = (double)(e->e_output_tokens - e->e_win_tokens);

	if (e->e_win_busy > 0)
		return tokens / e->e_win_busy;
	return now > e->e_win_start ? tokens / (now - e->e_win_start) : 0;
}

static void
engine_finish(struct engine *e, struct engine_req *r)
{
	double d;

	if (r->er_hold <= 0) {
		engine_complete(e, r);
		return;
	}
	/* Without a time scale a hold is real time: it is the only delay. */
	d = e->e_params.ep_time_scale > 0 ? engine_scale(e, r->er_hold)
	                                  : r->er_hold;
	r->er_state = ENGINE_HOLD;
	ev_timer_set(&r->er_hold_timer, d, 0);
	ev_timer_start(e->e_loop, &r->er_hold_timer);
}

static void
engine_hold_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct engine_req *r = w->data;
	struct engine *e = r->er_engine;

	(void)loop;
	(void)revents;
	engine_complete(e, r);
	engine_kick(e);
	if (e->e_hook != NULL)
		e->e_hook(e->e_hook_arg);
}

static void
engine_complete(struct engine *e, struct engine_req *r)
{
	engine_release(e, r);
	TAILQ_REMOVE(&e->e_running, r, er_entry);
	e->e_nrunning--;
	r->er_done_cb(r->er_arg, &r->er_info);
	free(r->er_pages);
	free(r->er_tokens);
	free(r);
}

void
engine_get_stats(const struct engine *e, struct engine_stats *out)
{
	double now = ev_now(e->e_loop), elapsed;

	memset(out, 0, sizeof(*out));
	out->es_running = e->e_nrunning;
	out->es_waiting = e->e_nwaiting;
	out->es_waiting_uncached = e->e_waiting_uncached;
	out->es_used_tokens = cache_used_tokens(e->e_cache);
	out->es_capacity_tokens = cache_capacity(e->e_cache);
	elapsed = now - e->e_win_start;
	if (elapsed >= 1.0)
		out->es_gen_throughput = engine_window_rate(e, now);
	else
		out->es_gen_throughput = e->e_rate;
	out->es_prompt_tokens = e->e_prompt_tokens;
	out->es_cached_tokens = e->e_cached_tokens;
	out->es_output_tokens = e->e_output_tokens;
}

int
engine_flush(struct engine *e)
{
	if (e->e_nrunning > 0 || e->e_nwaiting > 0)
		return -1;
	if (cache_flush(e->e_cache) == -1)
		return -1;
	if (e->e_hook != NULL)
		e->e_hook(e->e_hook_arg);
	return 0;
}
