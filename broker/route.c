/*
 * route.c: serves a RouteBatch. Outcomes first (they feed the breakers
 * the decisions then read), then one decision per request: pool, errors of
 * gateway.md §5, availability, exclusions, the policy, the selection
 * metric. No I/O and no allocation beyond the reply.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shared/log.h"
#include "shared/metrics.h"

#include "broker.h"

#define ROUTE_MSG_MAX 192

struct route_slot {
	Smg__Decision rs_d;
	char rs_msg[ROUTE_MSG_MAX];
};

static int route_type_of_leg(int leg);
static void route_error(Smg__Decision *d, uint32_t status, const char *code,
    const char *msg);
static unsigned route_exclude(struct worker **c, unsigned n,
    const Smg__RouteRequest *req);
static void route_count(struct broker *br, struct worker *w, struct policy *p);
static struct model_entry *route_model(struct broker *br, const char *model);
static void route_keyed(struct broker *br, const Smg__RouteRequest *req,
    struct worker *w);

static int
route_type_of_leg(int leg)
{
	switch (leg) {
	case SMG__LEG__LEG_PREFILL:
		return SMG__WORKER_TYPE__WORKER_TYPE_PREFILL;
	case SMG__LEG__LEG_DECODE:
		return SMG__WORKER_TYPE__WORKER_TYPE_DECODE;
	case SMG__LEG__LEG_ENCODE:
		return SMG__WORKER_TYPE__WORKER_TYPE_ENCODE;
	default:
		return SMG__WORKER_TYPE__WORKER_TYPE_REGULAR;
	}
}

static void
route_error(Smg__Decision *d, uint32_t status, const char *code,
    const char *msg)
{
	d->status = SMG__DECISION_STATUS__DECISION_ERROR;
	d->http_status = status;
	d->error_code = (char *)code;
	d->error_message = (char *)msg;
}

/* Drops excluded slots, unless that would leave no candidate. */
static unsigned
route_exclude(struct worker **c, unsigned n, const Smg__RouteRequest *req)
{
	unsigned i, j, k, keep = 0;
	bool ex;

	if (req->n_exclude_slots == 0)
		return n;
	for (i = 0; i < n; i++) {
		for (j = 0, ex = false; j < req->n_exclude_slots && !ex; j++)
			ex = c[i]->wk_slot == req->exclude_slots[j];
		keep += !ex;
	}
	if (keep == 0 || keep == n)
		return n;
	for (i = 0, k = 0; i < n; i++) {
		for (j = 0, ex = false; j < req->n_exclude_slots && !ex; j++)
			ex = c[i]->wk_slot == req->exclude_slots[j];
		if (!ex)
			c[k++] = c[i];
	}
	return k;
}

static struct model_entry *
route_model(struct broker *br, const char *model)
{
	unsigned i;

	if (model == NULL || *model == '\0')
		return NULL;
	for (i = 0; i < br->br_nmodels; i++) {
		if (strcmp(br->br_models[i]->me_name, model) == 0)
			return br->br_models[i];
	}
	return NULL;
}

static void
route_count(struct broker *br, struct worker *w, struct policy *p)
{
	struct model_entry *me = w->wk_me;
	char m[SHM_MODEL_MAX * 2];
	unsigned t = (unsigned)w->wk_type, md = (unsigned)w->wk_mode;

	if (me == NULL || t >= BROKER_NTYPES || md >= BROKER_NMODES)
		return;
	if (me->me_sel_series[t][md] == -2 || me->me_sel_policy[t][md] != p) {
		stats_label_escape(m, sizeof(m), me->me_name);
		me->me_sel_series[t][md] = stats_series(br, METRICS_COUNTER,
		    "smg_worker_selection_total",
		    "worker_type=\"%s\",connection_mode=\"%s\",model=\"%s\","
		    "policy=\"%s\"",
		    registry_type_name(w->wk_type),
		    registry_mode_name(w->wk_mode), m, policy_name(p));
		me->me_sel_policy[t][md] = p;
	}
	stats_add(br, me->me_sel_series[t][md], 1);
}

/* Per-key in-flight (+1 now, -1 by the outcome) and the key source. */
static void
route_keyed(struct broker *br, const Smg__RouteRequest *req, struct worker *w)
{
	char key[STICKY_KEY_MAX];
	const char *src;

	if (sticky_key(br, req, key, sizeof(key), &src) == NULL)
		return;
	sticky_dispatched(br, key, w);
	if (br->br_cf->cf_routing_key_override)
		sticky_count_source(br, src);
}

void
route_one(struct broker *br, const Smg__RouteRequest *req, Smg__Decision *d,
    char *msg, size_t msglen)
{
	struct worker **c = br->br_cands, *w;
	struct policy *p;
	unsigned n;
	bool pd = req->leg != SMG__LEG__LEG_SINGLE, over;
	int type = route_type_of_leg(req->leg), idx;
	const char *model = req->model != NULL ? req->model : "";
	const char *canon;

	d->id = req->id;
	/* A WorkerSpec alias routes as its model (SMG resolve_model_alias). */
	if ((canon = registry_resolve_alias(br, model)) != NULL) {
		model = canon;
		d->resolved_model = (char *)canon;
	}
	n = avail_pool(br, model, type, br->br_mode, c);
	if (n == 0) {
		if (pd) {
			snprintf(msg, msglen,
			    "No available servers: no %s workers",
			    registry_type_name(type));
			route_error(d, 503, "server_selection_failed", msg);
		} else {
			snprintf(msg, msglen,
			    "No worker available for model '%.120s'",
			    *model != '\0' ? model : BROKER_MODEL_UNKNOWN);
			route_error(d, 404, "model_not_found", msg);
		}
		return;
	}
	n = avail_filter(br, c, n, &over);
	if (over) {
		stats_add(br, br->br_m_shed_selection, 1);
		route_error(d, 503, "no_available_workers",
		    "All workers are overloaded");
		d->terminal = true;
		d->retry_after_secs = br->br_cf->cf_load_monitor_interval;
		return;
	}
	if (n == 0) {
		if (pd) {
			snprintf(msg, msglen,
			    "No available servers: no available %s workers",
			    registry_type_name(type));
			route_error(d, 503, "server_selection_failed", msg);
		} else
			route_error(d, 503, "no_available_workers",
			    "All workers are unavailable (circuit breaker "
			    "open or unhealthy)");
		return;
	}
	n = route_exclude(c, n, req);
	p = policy_for(br, route_model(br, model), req->leg);
	br->br_hint_slot = SHM_MAX_WORKERS;
	br->br_hint_cached = 0;
	/* The sticky overlay of policies.md §8 wraps the policy. */
	if (sticky_applies(br, p, req))
		idx = sticky_select(br, p, c, n, req);
	else
		idx = policy_select(p, c, n, req);
	if (idx < 0 || (unsigned)idx >= n) {
		route_error(d, 503,
		    pd ? "server_selection_failed" : "no_available_workers",
		    pd ? "No available servers: the policy selected none"
		       : "All workers are unavailable (circuit breaker open "
		         "or unhealthy)");
		return;
	}
	w = c[idx];
	if (w->wk_mode == SMG__CONNECTION_MODE__CONNECTION_MODE_GRPC) {
		/* gRPC inference needs the gateway to tokenize (SMG's gRPC
		 * router); such workers give routing signals only. */
		snprintf(msg, msglen,
		    "Worker %.160s is reachable only over gRPC; inference over "
		    "gRPC needs the gateway to tokenize and apply chat "
		    "templates, which smg-c does not implement (register the "
		    "worker's HTTP URL with a grpc_endpoint label instead)",
		    w->wk_url);
		route_error(d, 501, "grpc_inference_not_implemented", msg);
		d->terminal = true;
		return;
	}
	d->status = SMG__DECISION_STATUS__DECISION_OK;
	d->worker_slot = w->wk_slot;
	d->worker_generation = w->wk_generation;
	d->worker_url = w->wk_url;
	d->model =
	    strcmp(w->wk_model, BROKER_MODEL_UNKNOWN) != 0 || *model == '\0'
	    ? w->wk_model
	    : (char *)model;
	d->policy = (char *)policy_name(p);
	if (br->br_hint_slot == w->wk_slot)
		d->cached_tokens = br->br_hint_cached > UINT32_MAX
		    ? UINT32_MAX
		    : (uint32_t)br->br_hint_cached;
	route_count(br, w, p);
	route_keyed(br, req, w);
	br->br_decisions++;
	if (br->br_debug)
		log_debug("%s: policy %s model %s leg %d -> %s (slot %u, "
		          "%u candidates)",
		    __func__, policy_name(p), *model ? model : "-", req->leg,
		    w->wk_url, w->wk_slot, n);
}

void
route_hint_cached(struct broker *br, const struct worker *w, uint64_t tokens)
{
	if (br == NULL)
		return;
	br->br_hint_slot = w->wk_slot;
	br->br_hint_cached = tokens;
}

void
route_outcome(struct broker *br, const Smg__Outcome *o)
{
	struct worker *w;
	const char *prefix;
	char key[STICKY_KEY_MAX];
	int k;

	if ((w = registry_by_slot(br, o->worker_slot, o->worker_generation)) ==
	    NULL)
		return; /* removed or replaced since */
	live_outcome(br, w, o);
	if (!o->no_breaker_sample)
		breaker_record(br, w,
		    breaker_classify(o->http_status, o->transport_error));
	/* Only keyed requests were counted; the key has no leg prefix. */
	if (o->sticky_key == NULL || o->sticky_key[0] == '\0')
		return;
	prefix = w->wk_type == SMG__WORKER_TYPE__WORKER_TYPE_PREFILL
	    ? "prefill:"
	    : w->wk_type == SMG__WORKER_TYPE__WORKER_TYPE_DECODE ? "decode:"
	    : w->wk_type == SMG__WORKER_TYPE__WORKER_TYPE_ENCODE ? "encode:"
	                                                         : "";
	k = snprintf(key, sizeof(key), "%s%s", prefix, o->sticky_key);
	if (k > 0 && (size_t)k < sizeof(key))
		sticky_finished(br, key, w);
}

int
route_batch(struct broker *br, const Smg__RouteBatch *rb,
    Smg__DecisionBatch *out)
{
	struct route_slot *slots;
	Smg__Decision **ptrs;
	size_t i, n = rb->n_requests;

	smg__decision_batch__init(out);
	for (i = 0; i < rb->n_outcomes; i++)
		route_outcome(br, rb->outcomes[i]);
	if (n == 0)
		return 0;
	/* One block: the pointer array, then the decisions. */
	ptrs = calloc(1, n * (sizeof(*ptrs) + sizeof(*slots)));
	if (ptrs == NULL) {
		log_warnx("%s: out of memory for %zu decisions", __func__, n);
		return -1;
	}
	slots = (struct route_slot *)(void *)(ptrs + n);
	for (i = 0; i < n; i++) {
		smg__decision__init(&slots[i].rs_d);
		route_one(br, rb->requests[i], &slots[i].rs_d, slots[i].rs_msg,
		    sizeof(slots[i].rs_msg));
		ptrs[i] = &slots[i].rs_d;
	}
	out->decisions = ptrs;
	out->n_decisions = n;
	return 0;
}

void
route_batch_free(Smg__DecisionBatch *out)
{
	free(out->decisions);
	out->decisions = NULL;
	out->n_decisions = 0;
}
