/*
 * reports.c: what the poller tells the broker. Discovery completes a
 * registration (Pending -> Ready, model and runtime learnt) or fails it;
 * health probes move workers between Ready, NotReady and Failed with the
 * thresholds of gateway.md §10; load reports are kept per worker and set
 * the overload flag of §8; KV-event batches go to the block index
 * (kvindex.c).
 */
#include <stdlib.h>
#include <string.h>

#include "shared/log.h"
#include "shared/metrics.h"
#include "shared/url.h"
#include "shared/xmalloc.h"

#include "broker.h"
#include "kvindex.h"

static struct worker *reports_worker(struct broker *br, uint32_t slot,
    uint32_t gen, const char *url, const char *what);
static void reports_discovery(struct broker *br, const Smg__WorkerDiscovery *d);
static void reports_health(struct broker *br, const Smg__HealthReport *h);
static void reports_load(struct broker *br, const Smg__LoadReport *l);
static void reports_failed(struct broker *br, struct worker *w);
static const Smg__DiscoveredWorker *reports_listed(const Smg__DiscoveredSet *s,
    const char *url);

static struct worker *
reports_worker(struct broker *br, uint32_t slot, uint32_t gen, const char *url,
    const char *what)
{
	struct worker *w = registry_by_slot(br, slot, gen);

	if (w == NULL ||
	    (url != NULL && *url != '\0' && strcmp(url, w->wk_url) != 0)) {
		log_debug("%s: stale %s for slot %u generation %u (%s)",
		    __func__, what, slot, gen, url ? url : "");
		return NULL;
	}
	return w;
}

static void
reports_failed(struct broker *br, struct worker *w)
{
	registry_set_status(br, w, SHM_WORKER_FAILED);
	if (br->br_cf->cf_remove_unhealthy_workers)
		registry_remove(br, w);
}

static void
reports_rank_size(struct broker *br, const struct worker *w, uint32_t size)
{
	struct worker *ranks[SHM_MAX_WORKERS];
	char base[SHM_URL_MAX];
	unsigned n, i;

	if (url_rank_base(w->wk_url, base, sizeof(base)) == -1)
		return;
	n = registry_find_ranks(br, base, ranks, SHM_MAX_WORKERS);
	for (i = 0; i < n && i < SHM_MAX_WORKERS; i++)
		ranks[i]->wk_dp_size = size;
}

static void
reports_discovery(struct broker *br, const Smg__WorkerDiscovery *d)
{
	struct worker *w;

	if ((w = reports_worker(br, d->worker_slot, d->worker_generation,
	         d->worker_url, "discovery")) == NULL)
		return;
	if (w->wk_status == SHM_WORKER_DRAINING)
		return;
	if (!d->ok) {
		free(w->wk_error);
		w->wk_error = xstrdup(d->error != NULL && *d->error != '\0'
		        ? d->error
		        : "registration failed");
		log_warnx("%s: worker %s: %s", __func__, w->wk_url,
		    w->wk_error);
		reports_failed(br, w);
		return;
	}
	free(w->wk_error);
	w->wk_error = NULL;
	if (d->runtime != NULL && *d->runtime != '\0' &&
	    strcmp(d->runtime, w->wk_runtime) != 0) {
		free(w->wk_runtime);
		w->wk_runtime = xstrdup(d->runtime);
		registry_persist(br, w);
	}
	/* The spec's model id wins over the discovered one. */
	if (strcmp(w->wk_model, BROKER_MODEL_UNKNOWN) == 0 &&
	    d->model_id != NULL && *d->model_id != '\0')
		registry_set_model(br, w, d->model_id);
	/* --dp-aware: an engine of data-parallel ranks is one worker per
	 * rank ("<url>@<rank>"); a URL naming its rank is that rank. */
	if (br->br_cf->cf_dp_aware && d->dp_size > 0 &&
	    url_rank(w->wk_url) < 0 && registry_expand(br, w, d->dp_size) == 0)
		return;
	/* Ranks named or restored as "<url>@N" learn their engine's size
	 * from the one probe of that engine. */
	if (d->dp_size > 0 && url_rank(w->wk_url) >= 0)
		reports_rank_size(br, w, d->dp_size);
	if (w->wk_status == SHM_WORKER_PENDING)
		registry_set_status(br, w, SHM_WORKER_READY);
}

static void
reports_health(struct broker *br, const Smg__HealthReport *h)
{
	const struct config *cf = br->br_cf;
	struct worker *w;
	unsigned t;

	if ((w = reports_worker(br, h->worker_slot, h->worker_generation,
	         h->worker_url, "health report")) == NULL)
		return;
	if (w->wk_status == SHM_WORKER_FAILED ||
	    w->wk_status == SHM_WORKER_DRAINING || w->wk_health_disabled)
		return;
	t = (unsigned)w->wk_type < BROKER_NTYPES ? (unsigned)w->wk_type : 0;
	stats_add(br,
	    h->passed ? br->br_m_health_ok[t] : br->br_m_health_fail[t], 1);
	if (h->passed) {
		w->wk_health_fails = 0;
		w->wk_health_passes++;
	} else {
		w->wk_health_passes = 0;
		w->wk_health_fails++;
	}
	switch (w->wk_status) {
	case SHM_WORKER_PENDING:
		/* Discovery promotes a Pending worker; probes only give up. */
		if (++w->wk_probes_pending >=
		    10 * cf->cf_health_failure_threshold) {
			free(w->wk_error);
			w->wk_error = xstrdup("not ready after registration "
			                      "probes");
			reports_failed(br, w);
		}
		break;
	case SHM_WORKER_READY:
		if (w->wk_health_fails >= cf->cf_health_failure_threshold)
			registry_set_status(br, w, SHM_WORKER_NOT_READY);
		break;
	case SHM_WORKER_NOT_READY:
		if (w->wk_health_passes >= cf->cf_health_success_threshold)
			registry_set_status(br, w, SHM_WORKER_READY);
		else if (w->wk_health_fails >=
		    3 * cf->cf_health_failure_threshold)
			reports_failed(br, w);
		break;
	default:
		break;
	}
}

void
reports_eval_overload(struct broker *br, struct worker *w)
{
	const struct worker_load *l = &w->wk_load;
	bool on = false;

	if (l->wl_valid) {
		if (w->wk_ov_waiting > 0 &&
		    l->wl_waiting_reqs >= w->wk_ov_waiting)
			on = true;
		if (w->wk_ov_token_usage > 0 &&
		    l->wl_token_usage >= w->wk_ov_token_usage)
			on = true;
	}
	registry_set_overloaded(br, w, on);
}

static void
reports_load(struct broker *br, const Smg__LoadReport *r)
{
	struct worker_load *l;
	struct worker *w;
	size_t i;

	if ((w = reports_worker(br, r->worker_slot, r->worker_generation,
	         r->worker_url, "load report")) == NULL)
		return;
	l = &w->wk_load;
	if (!r->ok) {
		/* The last good report stays for the load-aware policies;
		 * a failed fetch clears the overload veto (§8). */
		registry_set_overloaded(br, w, false);
		return;
	}
	if (r->n_loads == 0)
		return; /* no report this tick */
	memset(l, 0, sizeof(*l));
	l->wl_valid = true;
	l->wl_nranks = (unsigned)r->n_loads;
	for (i = 0; i < r->n_loads; i++) {
		const Smg__RankLoad *k = r->loads[i];

		l->wl_waiting_reqs += k->num_waiting_reqs;
		l->wl_waiting_uncached_tokens += k->num_waiting_uncached_tokens;
		l->wl_running_reqs += k->num_running_reqs;
		l->wl_gen_throughput += k->gen_throughput;
		l->wl_token_usage += k->token_usage;
	}
	l->wl_token_usage /= (double)r->n_loads;
	l->wl_fetched_at_ms = r->fetched_at_ms;
	l->wl_received_ms = shm_now_ms();
	log_debug("%s: %s via %s: waiting %lld, running %lld, uncached "
	          "tokens %lld, token usage %.3f, throughput %.1f",
	    __func__, w->wk_url,
	    r->source != NULL && *r->source != '\0' ? r->source : "?",
	    (long long)l->wl_waiting_reqs, (long long)l->wl_running_reqs,
	    (long long)l->wl_waiting_uncached_tokens, l->wl_token_usage,
	    l->wl_gen_throughput);
	reports_eval_overload(br, w);
	policy_notify_report(br, w);
}

/* The entry of s for url (normalised as the registry keeps it). */
static const Smg__DiscoveredWorker *
reports_listed(const Smg__DiscoveredSet *s, const char *url)
{
	char u[SHM_URL_MAX], err[128];
	size_t i;

	for (i = 0; i < s->n_workers; i++) {
		if (s->workers[i]->url == NULL ||
		    registry_normalize_url(s->workers[i]->url, u, sizeof(u),
		        err, sizeof(err)) == -1)
			continue;
		if (strcmp(u, url) == 0)
			return s->workers[i];
	}
	return NULL;
}

void
reports_discovered(struct broker *br, const Smg__DiscoveredSet *s)
{
	const Smg__DiscoveredWorker *d;
	struct worker_spec ws;
	struct worker *w;
	char url[SHM_URL_MAX], err[128];
	const char *why;
	unsigned refused = 0, i;
	int32_t bp;
	size_t k;

	/* Removals first: a pod that changed role frees its url for the
	 * add below. br_order shifts on removal: walk it backwards. */
	for (i = br->br_nworkers; i-- > 0;) {
		w = br->br_order[i];
		if (!w->wk_discovered)
			continue;
		d = reports_listed(s, w->wk_url);
		bp = d != NULL && d->has_bootstrap_port
		    ? (int32_t)d->bootstrap_port
		    : -1;
		if (d != NULL && (int)d->worker_type == w->wk_type &&
		    bp == w->wk_bootstrap_port)
			continue;
		log_info("%s: worker %s: its pod is %s", __func__, w->wk_url,
		    d == NULL ? "gone or not ready" : "of another role");
		registry_remove(br, w);
	}
	for (k = 0; k < s->n_workers; k++) {
		d = s->workers[k];
		if ((int)d->worker_type < 0 ||
		    (int)d->worker_type >
		        SMG__WORKER_TYPE__WORKER_TYPE_ENCODE) {
			log_warnx("%s: pod %s: bad worker type %d", __func__,
			    d->pod != NULL ? d->pod : "?", (int)d->worker_type);
			refused++;
			continue;
		}
		if (d->url == NULL ||
		    registry_normalize_url(d->url, url, sizeof(url), err,
		        sizeof(err)) == -1) {
			log_warnx("%s: pod %s: bad url: %s", __func__,
			    d->pod != NULL ? d->pod : "?", err);
			refused++;
			continue;
		}
		if ((w = registry_find(br, url)) != NULL) {
			/* Ours from before, or an operator's worker. */
			if (w->wk_discovered && d->model_id != NULL &&
			    *d->model_id != '\0' &&
			    strcmp(d->model_id, w->wk_model) != 0)
				registry_set_model(br, w, d->model_id);
			continue;
		}
		memset(&ws, 0, sizeof(ws));
		ws.ws_url = url;
		ws.ws_model = d->model_id;
		ws.ws_type = (int)d->worker_type;
		ws.ws_mode = SMG__CONNECTION_MODE__CONNECTION_MODE_HTTP;
		ws.ws_api_key = br->br_cf->cf_api_key;
		ws.ws_bootstrap_port =
		    d->has_bootstrap_port ? (int32_t)d->bootstrap_port : -1;
		ws.ws_priority = 50;
		ws.ws_cost = 1.0;
		ws.ws_discovered = true;
		if (registry_add(br, &ws, false, &why) == NULL) {
			refused++;
			if (br->br_disc_refused == 0)
				log_warnx("%s: pod %s (%s): %s", __func__,
				    d->pod != NULL ? d->pod : "?", url,
				    strcmp(why, "full") == 0
				        ? "worker table full"
				        : why);
			continue;
		}
		log_info("%s: pod %s is worker %s", __func__,
		    d->pod != NULL ? d->pod : "?", url);
	}
	/* The poller re-sends the set while a url is missing: say so once. */
	br->br_disc_refused = refused;
}

void
reports_handle(struct broker *br, const Smg__PollerMsg *m)
{
	switch (m->body_case) {
	case SMG__POLLER_MSG__BODY_PING:
		break;
	case SMG__POLLER_MSG__BODY_LOAD:
		reports_load(br, m->load);
		break;
	case SMG__POLLER_MSG__BODY_HEALTH:
		reports_health(br, m->health);
		break;
	case SMG__POLLER_MSG__BODY_DISCOVERY:
		reports_discovery(br, m->discovery);
		break;
	case SMG__POLLER_MSG__BODY_KV_EVENTS:
		kvindex_handle(br, m->kv_events);
		break;
	case SMG__POLLER_MSG__BODY_DISCOVERED:
		reports_discovered(br, m->discovered);
		break;
	default:
		log_warnx("%s: unknown poller message %d", __func__,
		    (int)m->body_case);
		break;
	}
}
