/*
 * policy_least_load.c: `least_load` (policies.md §3) and the glue between
 * the broker and the expected-wait scorer (§2) that power_of_two shares.
 *
 * Each instance owns one scorer. Load reports reach it through
 * po_on_report (every report the broker ingests for a worker of the
 * instance, with this gateway's pending tokens at that moment), removed
 * workers leave it through po_on_remove; a selection gives it the
 * candidates with their live figures (live.c): in flight, pending prompt
 * tokens, learned prefill rate, and this request's prompt tokens. A
 * report older than 3 x --load-monitor-interval counts as missing, so a
 * dead poller leaves the live figures alone to decide.
 */
#include <stdlib.h>
#include <string.h>

#include "shared/log.h"
#include "shared/xmalloc.h"

#include "broker.h"
#include "scorer.h"

struct ll_state {
	struct scorer *ll_scorer;
	struct scorer_cand ll_cands[SHM_MAX_WORKERS];
};

static int ll_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req);

const struct policy_ops policy_least_load_ops = {
	.po_kind = POLICY_LEAST_LOAD,
	.po_create = policy_least_load_create,
	.po_free = policy_least_load_free,
	.po_select = ll_select,
	.po_on_remove = policy_least_load_on_remove,
	.po_on_report = policy_least_load_on_report,
};

void *
policy_least_load_create(struct policy *p)
{
	const struct config *cf = p->pl_br != NULL ? p->pl_br->br_cf : NULL;
	struct scorer_tunables t;
	struct ll_state *st;

	scorer_tunables_default(&t);
	/* Only least_load reads the flags; power_of_two keeps the built-in
	 * values (§4), as does an instance with built-in settings (§13). */
	if (p->pl_ops == &policy_least_load_ops && !p->pl_builtin &&
	    cf != NULL && cf->cf_least_load_default_throughput > 0) {
		t.st_kv_pressure_weight = cf->cf_least_load_kv_pressure_weight;
		t.st_default_throughput = cf->cf_least_load_default_throughput;
		t.st_mean_prefill_tokens =
		    cf->cf_least_load_mean_prefill_tokens;
		t.st_max_waiting_requests =
		    cf->cf_least_load_max_waiting_requests;
	}
	st = xcalloc(1, sizeof(*st));
	st->ll_scorer = scorer_new(&t, policy_rand_below);
	return st;
}

void
policy_least_load_free(void *state)
{
	struct ll_state *st = state;

	if (st == NULL)
		return;
	scorer_free(st->ll_scorer);
	free(st);
}

struct scorer *
policy_least_load_scorer(struct policy *p)
{
	return ((struct ll_state *)p->pl_state)->ll_scorer;
}

void
policy_least_load_on_remove(struct policy *p, struct worker *w)
{
	scorer_forget(policy_least_load_scorer(p), w->wk_url_hash);
}

void
policy_least_load_on_report(struct policy *p, struct worker *w)
{
	const struct worker_load *l = &w->wk_load;
	struct scorer_report r = { 0 };

	if (!l->wl_valid) {
		scorer_report(policy_least_load_scorer(p), w->wk_url_hash, NULL,
		    l->wl_received_ms);
		return;
	}
	memset(&r, 0, sizeof(r));
	r.sr_waiting_reqs = l->wl_waiting_reqs;
	r.sr_waiting_uncached_tokens = l->wl_waiting_uncached_tokens;
	r.sr_gen_throughput = l->wl_gen_throughput;
	r.sr_token_usage = l->wl_token_usage;
	r.sr_pending_then = live_pending(p->pl_br, w);
	r.sr_in_flight_then = live_in_flight(p->pl_br, w);
	scorer_report(policy_least_load_scorer(p), w->wk_url_hash, &r,
	    l->wl_received_ms);
}

int
policy_least_load_pick(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req, bool pair)
{
	struct ll_state *st = p->pl_state;
	struct broker *br = p->pl_br;
	struct scorer_pick pick;
	uint64_t interval_ms = 0, now = shm_now_ms(), prompt;
	char dbg[SCORER_DEBUG_SIZE];
	unsigned i;
	int idx;

	if (n > SHM_MAX_WORKERS)
		n = SHM_MAX_WORKERS;
	if (br != NULL)
		interval_ms =
		    (uint64_t)br->br_cf->cf_load_monitor_interval * 1000;
	/* No cache knowledge here: the whole prompt is to prefill. */
	prompt = live_prompt_tokens(req,
	    scorer_get_tunables(st->ll_scorer)->st_mean_prefill_tokens);
	for (i = 0; i < n; i++) {
		st->ll_cands[i].sc_id = c[i]->wk_url_hash;
		st->ll_cands[i].sc_in_flight = live_in_flight(br, c[i]);
		st->ll_cands[i].sc_pending = live_pending(br, c[i]);
		st->ll_cands[i].sc_rate = live_rate(c[i]);
		st->ll_cands[i].sc_uncached = prompt;
		st->ll_cands[i].sc_forfeit = 0;
	}
	if (pair)
		idx = scorer_power_of_two(st->ll_scorer, st->ll_cands, n, now,
		    interval_ms, &pick);
	else
		idx = scorer_least_load(st->ll_scorer, st->ll_cands, n, now,
		    interval_ms, &pick);
	if (log_getlevel() > LOG_LEVEL_DEBUG)
		return idx;
	if (idx < 0)
		log_debug("%s selected none: every candidate is at the "
		          "waiting cap",
		    policy_name(p));
	else
		log_debug("%s selected %s (%s)", policy_name(p), c[idx]->wk_url,
		    scorer_debug(&pick, dbg, sizeof(dbg)));
	return idx;
}

static int
ll_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req)
{
	return policy_least_load_pick(p, c, n, req, false);
}
