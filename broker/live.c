/*
 * live.c: the live load of workers. Frontends keep, per worker, the
 * requests they have in flight and the prompt tokens still waiting for a
 * first response byte in their shm rows; their outcomes say how long each
 * prompt took to its first byte, which teaches every worker's prefill rate
 * (rate.h). The load-aware policies read both through this file.
 */
#include <stdlib.h>
#include <string.h>

#include "shared/log.h"
#include "shared/metrics.h"
#include "shared/xmalloc.h"

#include "broker.h"

#define LIVE_RATE_SAME 1.25 /* rates closer than this ratio are one */

uint64_t
live_prompt_tokens(const Smg__RouteRequest *req, uint64_t unknown)
{
	uint64_t chars;

	if (req == NULL)
		return unknown;
	if (req->has_tokens && req->n_tokens > 0)
		return req->n_tokens;
	chars = req->size;
	if (chars == 0 && req->has_text && req->text != NULL)
		chars = strlen(req->text);
	/* A non-empty text is at least one token. */
	return chars > 0 ? (chars + 3) / 4 : unknown;
}

uint64_t
live_pending(struct broker *br, const struct worker *w)
{
	if (br == NULL || br->br_shm == NULL)
		return 0;
	/* This host's rows, then the other hosts' (remote.c). */
	return shm_pending_total(br->br_shm, w->wk_slot) +
	    remote_pending(br, w->wk_slot);
}

uint32_t
live_in_flight(struct broker *br, const struct worker *w)
{
	if (br == NULL || br->br_shm == NULL)
		return 0;
	return shm_inflight_total(br->br_shm, w->wk_slot) +
	    remote_in_flight(br, w->wk_slot);
}

double
live_rate(const struct worker *w)
{
	double r, med = w->wk_me != NULL ? w->wk_me->me_rate_prior : 0;

	if (!rate_known(&w->wk_rate))
		return med;
	r = rate_get(&w->wk_rate, 0);
	/*
	 * Within LIVE_RATE_SAME of its model's median a worker is taken to
	 * run at the median: the learner's noise between equal engines
	 * would otherwise skew a balanced fleet (and at high utilisation a
	 * small skew is a long queue); engines that really differ stay apart.
	 */
	if (med > 0 && r < med * LIVE_RATE_SAME && r * LIVE_RATE_SAME > med)
		return med;
	return r;
}

void
live_outcome(struct broker *br, struct worker *w, const Smg__Outcome *o)
{
	uint64_t uncached, tokens;

	(void)br;
	if (!o->first_byte || o->unstreamed || o->ttfb_us == 0)
		return;
	/* What the worker had to prefill before this first byte. */
	uncached = o->cached_tokens < o->prompt_tokens
	    ? o->prompt_tokens - o->cached_tokens
	    : 0;
	tokens = o->ahead_tokens + uncached;
	if (rate_sample(&w->wk_rate, tokens, o->ttfb_us))
		log_debug("%s: %s: %llu tokens in %u us -> %.0f tokens/s",
		    __func__, w->wk_url, (unsigned long long)tokens, o->ttfb_us,
		    rate_get(&w->wk_rate, 0));
}

void
live_tick(struct broker *br)
{
	struct model_entry *me;
	struct worker *w;
	double *v = NULL, r;
	unsigned i, j, n;
	size_t cap = 0;

	for (i = 0; i < br->br_nmodels; i++) {
		me = br->br_models[i];
		if (me->me_n > cap) {
			cap = me->me_n;
			v = xreallocarray(v, cap, sizeof(*v));
		}
		for (j = 0, n = 0; j < me->me_n; j++) {
			if (rate_known(&me->me_workers[j]->wk_rate))
				v[n++] =
				    rate_get(&me->me_workers[j]->wk_rate, 0);
		}
		me->me_rate_prior = n > 0 ? rate_median(v, n) : 0;
	}
	free(v);
	for (i = 0; i < br->br_nworkers; i++) {
		w = br->br_order[i];
		stats_set(br, w->wk_m_pending, (int64_t)live_pending(br, w));
		/* What the frontends expect of it (non-streamed prefill). */
		r = live_rate(w);
		if (r <= 0)
			r = br->br_cf->cf_least_load_default_throughput;
		shm_prefill_rate_set(br->br_shm, w->wk_slot,
		    r > 0 ? (uint32_t)(r < 4e9 ? r + 0.5 : 4e9) : 0);
		stats_set(br, w->wk_m_rate,
		    rate_known(&w->wk_rate)
		        ? (int64_t)(rate_get(&w->wk_rate, 0) + 0.5)
		        : 0);
	}
}

static void
live_metrics_init(struct broker *br, struct worker *w)
{
	char u[SHM_URL_MAX * 2];

	rate_init(&w->wk_rate);
	stats_label_escape(u, sizeof(u), w->wk_url);
	w->wk_m_pending = stats_series(br, METRICS_GAUGE,
	    "smg_worker_outstanding_prefill_tokens", "worker=\"%s\"", u);
	w->wk_m_rate = stats_series(br, METRICS_GAUGE,
	    "smg_worker_prefill_rate_tokens_per_second", "worker=\"%s\"", u);
	stats_set(br, w->wk_m_pending, (int64_t)live_pending(br, w));
	stats_set(br, w->wk_m_rate, 0);
}

static void
live_metrics_clear(struct broker *br, struct worker *w)
{
	stats_set(br, w->wk_m_pending, 0);
	stats_set(br, w->wk_m_rate, 0);
}

/* The live gauges follow the registry: created with a worker, zeroed
 * when it goes. */
const struct registry_observer live_registry_observer = {
	.ro_worker_new = live_metrics_init,
	.ro_worker_removed = live_metrics_clear,
};
