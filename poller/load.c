/*
 * load.c: load polling of Ready workers (gateway.md §9): /v1/loads
 * answers read by shared/loads.c, and the rank of the Prometheus /metrics
 * fallback (workers.md §3, read by shared/promload.c).
 *
 * Every --load-monitor-interval seconds per Ready worker: GET /v1/loads
 * with the worker's bearer key and a 5 s deadline. A load response with
 * ranks is a report; `loads: []` is no report this tick; 404/405/501 or a
 * 2xx that is not a load response marks the route absent for this worker
 * (until it is removed or replaced) and the /metrics fallback is used from
 * then on; other failures fall back for this tick only. The fallback
 * applies to SGLang and vLLM workers (and to workers whose engine the
 * poller has not learnt); others get no report. Each outcome reaches the
 * broker as one LoadReport: a report, or ok=false when the tick produced
 * none (which clears the overload veto, §8). A worker whose fetch is still
 * running when its next tick comes skips that tick, so a slow worker only
 * delays itself.
 */
#include "poller/poller.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "shared/config.h"
#include "shared/loads.h"
#include "shared/log.h"
#include "shared/metrics.h"
#include "shared/promload.h"

static void load_fetch(struct pworker *pw, enum load_step step);
static bool load_fallback_allowed(const struct pworker *pw);
static void load_done_cb(void *arg, const struct upstream_result *res);
static void load_send(struct pworker *, Smg__RankLoad *, size_t, const char *);
static void load_gauges(struct pworker *pw, const Smg__RankLoad *ranks,
    size_t n);
static void load_gauge_set(struct pworker *, const char *, int32_t, double,
    bool);
static bool load_grpc_fetch(struct pworker *pw);
static void load_grpc_msg_cb(void *arg, const uint8_t *msg, size_t len);
static void load_grpc_close_cb(void *arg, const struct grpc_status *st);

/* ------------------------------------------------------------ parsers */

int
load_parse_prom(const char *body, size_t len, const char *runtime,
    Smg__RankLoad *rank)
{
	struct promload_report pr;

	smg__rank_load__init(rank);
	if (promload_parse(body, len, runtime, &pr) == -1)
		return -1;
	/* One synthetic rank 0, without absolute token counts. */
	rank->num_running_reqs = pr.pr_num_running_reqs;
	rank->num_waiting_reqs = pr.pr_num_waiting_reqs;
	rank->token_usage = pr.pr_token_usage;
	rank->gen_throughput = pr.pr_gen_throughput;
	rank->cache_hit_rate = pr.pr_cache_hit_rate;
	rank->utilization = pr.pr_utilization;
	return 0;
}

/* ----------------------------------------------------------- schedule */

bool
load_wanted(const struct config *cf)
{
	bool pd = cf->cf_pd_disaggregation || cf->cf_epd_disaggregation;

	if (!cf->cf_disable_load_monitoring)
		return true;
	if (policy_info_of(cf->cf_policy)->pi_load_aware)
		return true;
	if (pd &&
	    (policy_info_of(cf->cf_prefill_policy)->pi_load_aware ||
	        policy_info_of(cf->cf_decode_policy)->pi_load_aware))
		return true;
	return cf->cf_dp_minimum_tokens_scheduler || cf->cf_engine_metrics ||
	    cf->cf_worker_overload_protection ||
	    cf->cf_worker_overload_waiting_requests_set ||
	    cf->cf_worker_overload_token_usage_set;
}

void
load_tick(struct pworker *pw, uint64_t now)
{
	struct poller *p = pw->pw_poller;
	struct load_state *ls = &pw->pw_load;
	uint64_t iv;

	/* A worker whose spec sets an overload veto is polled regardless. */
	if (!p->p_load_on && !pw->pw_overload_on)
		return;
	if (pw->pw_status != SHM_WORKER_READY || !poller_leads(pw)) {
		/* Another rank of its engine polls for it. */
		if (ls->ls_req != NULL || ls->ls_call != NULL ||
		    ls->ls_next_ms != 0)
			load_stop(pw);
		return;
	}
	iv = pw->pw_load_interval_ms ? pw->pw_load_interval_ms
	                             : p->p_load_interval_ms;
	/* A period lowered meanwhile takes effect now, not after the old. */
	if (ls->ls_next_ms > now + iv)
		ls->ls_next_ms = now + iv;
	if (ls->ls_req != NULL || ls->ls_call != NULL || now < ls->ls_next_ms)
		return;
	/* First poll as soon as the worker is Ready, then every interval. */
	ls->ls_next_ms = now + iv;
	if (rpc_target(pw) != NULL && !ls->ls_grpc_absent) {
		if (load_grpc_fetch(pw))
			return;
		if (!rpc_ready(pw)) {
			/* Engine not learnt yet: soon again. */
			ls->ls_next_ms = now + 1000;
			return;
		}
	}
	if (rpc_is_grpc_url(pw->pw_url))
		load_report(pw, NULL, 0, ""); /* no HTTP to fall back to */
	else if (!ls->ls_absent)
		load_fetch(pw, LOAD_LOADS);
	else if (load_fallback_allowed(pw))
		load_fetch(pw, LOAD_METRICS);
	else
		load_report(pw, NULL, 0, "");
}

void
load_stop(struct pworker *pw)
{
	struct load_state *ls = &pw->pw_load;
	bool absent = ls->ls_absent, grpc_absent;

	upstream_fetch_cancel(ls->ls_req);
	ls->ls_req = NULL;
	grpc_call_cancel(ls->ls_call);
	ls->ls_call = NULL;
	free(ls->ls_grpc_msg);
	/* Not Ready or gone: its engine gauges say nothing any more. */
	if (ls->ls_gauge_ranks > 0)
		load_gauges(pw, NULL, 0);
	grpc_absent = ls->ls_grpc_absent;
	memset(ls, 0, sizeof(*ls));
	/* The memos last until the worker goes. */
	ls->ls_absent = absent;
	ls->ls_grpc_absent = grpc_absent;
}

static bool
load_fallback_allowed(const struct pworker *pw)
{
	const char *rt = pw->pw_runtime;

	return rt[0] == '\0' || strcmp(rt, "sglang") == 0 ||
	    strcmp(rt, "vllm") == 0;
}

static void
load_fetch(struct pworker *pw, enum load_step step)
{
	struct poller *p = pw->pw_poller;
	struct load_state *ls = &pw->pw_load;

	ls->ls_step = step;
	ls->ls_req = fetch_get(p, pw->pw_base,
	    step == LOAD_LOADS ? LOAD_PATH : "/metrics", pw->pw_api_key,
	    LOAD_TIMEOUT_SECS, POLLER_BODY_MAX, load_done_cb, pw);
	if (ls->ls_req == NULL)
		ls->ls_step = LOAD_IDLE; /* out of memory: next tick */
}

static void
load_done_cb(void *arg, const struct upstream_result *res)
{
	static Smg__RankLoad ranks[LOAD_MAX_RANKS];
	struct pworker *pw = arg;
	struct load_state *ls = &pw->pw_load;
	enum load_step step = ls->ls_step;
	cJSON *doc;
	bool ok2xx;
	size_t n = 0;
	char why[64];

	ls->ls_req = NULL;
	ls->ls_step = LOAD_IDLE;
	ok2xx = res->ur_error == UPSTREAM_OK && res->ur_status >= 200 &&
	    res->ur_status < 300;
	if (res->ur_error != UPSTREAM_OK)
		snprintf(why, sizeof(why), "%s", res->ur_reason);
	else
		snprintf(why, sizeof(why), "status %d", res->ur_status);

	if (step == LOAD_METRICS) {
		if (ok2xx && !res->ur_truncated &&
		    load_parse_prom(res->ur_body, res->ur_body_len,
		        pw->pw_runtime[0] != '\0' ? pw->pw_runtime : NULL,
		        &ranks[0]) == 0) {
			load_report(pw, ranks, 1, "metrics");
			return;
		}
		log_debug("%s: %s/metrics: no load report (%s)", __func__,
		    pw->pw_url, ok2xx ? "no engine load gauges" : why);
		load_report(pw, NULL, 0, "");
		return;
	}

	switch (
	    loads_classify(res->ur_error == UPSTREAM_OK ? res->ur_status : 0,
	        !res->ur_truncated, res->ur_body, res->ur_body_len, &doc)) {
	case LOADS_REPORT:
		n = loads_ranks(doc, ranks, LOAD_MAX_RANKS);
		cJSON_Delete(doc);
		load_report(pw, ranks, n, "loads");
		return;
	case LOADS_EMPTY:
		/* Nothing this tick; ask again next interval. */
		log_debug("%s: %s: empty load response", __func__, pw->pw_url);
		return;
	case LOADS_ABSENT:
		if (ok2xx)
			snprintf(why, sizeof(why), "not a load response");
		ls->ls_absent = true;
		break;
	case LOADS_FAILED:
		break;
	}

	if (ls->ls_absent)
		log_info("%s: %s: /v1/loads absent (%s); using /metrics",
		    __func__, pw->pw_url, why);
	else
		log_debug("%s: %s/v1/loads failed: %s", __func__, pw->pw_url,
		    why);
	if (load_fallback_allowed(pw))
		load_fetch(pw, LOAD_METRICS);
	else
		load_report(pw, NULL, 0, "");
}

/*
 * GetLoads with SMG's include list (§4.1) on the worker's gRPC target.
 * Returns false when it cannot run now (engine not learnt, or one that
 * serves no GetLoads: then GetLoads counts as absent).
 */
static bool
load_grpc_fetch(struct pworker *pw)
{
	static char *include[] = { "core", "disagg", "queues", "memory" };
	struct load_state *ls = &pw->pw_load;
	Sglang__Grpc__Scheduler__GetLoadsRequest req =
	    SGLANG__GRPC__SCHEDULER__GET_LOADS_REQUEST__INIT;

	if (!rpc_ready(pw))
		return false;
	if (!rpc_engine_has(pw, RPC_GET_LOADS)) {
		log_info("%s: %s: the %s engine serves no GetLoads", __func__,
		    pw->pw_url, rpc_runtime(pw));
		ls->ls_grpc_absent = true;
		return false;
	}
	req.include = include;
	req.n_include = sizeof(include) / sizeof(include[0]);
	ls->ls_call = rpc_call(pw, RPC_GET_LOADS, &req.base, LOAD_TIMEOUT_SECS,
	    load_grpc_msg_cb, load_grpc_close_cb, pw);
	return ls->ls_call != NULL;
}

/* Kept until the call's status says whether it counts. */
static void
load_grpc_msg_cb(void *arg, const uint8_t *msg, size_t len)
{
	struct load_state *ls = &((struct pworker *)arg)->pw_load;

	free(ls->ls_grpc_msg);
	ls->ls_grpc_len = 0;
	if ((ls->ls_grpc_msg = malloc(len + 1)) == NULL)
		return;
	memcpy(ls->ls_grpc_msg, msg, len);
	ls->ls_grpc_len = len;
}

static void
load_grpc_close_cb(void *arg, const struct grpc_status *st)
{
	static Smg__RankLoad ranks[LOAD_MAX_RANKS];
	struct pworker *pw = arg;
	struct load_state *ls = &pw->pw_load;
	uint8_t *msg = ls->ls_grpc_msg;
	size_t len = ls->ls_grpc_len, n = 0;
	int parse = LOADS_ABSENT;

	ls->ls_call = NULL;
	ls->ls_grpc_msg = NULL;
	ls->ls_grpc_len = 0;
	if (st->gs_code == GRPC_OK && msg != NULL)
		parse = rpc_parse_loads(msg, len, ranks, LOAD_MAX_RANKS, &n);
	free(msg);
	if (st->gs_code == GRPC_UNIMPLEMENTED) {
		ls->ls_grpc_absent = true;
		log_info("%s: %s: GetLoads unimplemented (%s)%s", __func__,
		    pw->pw_url, st->gs_message,
		    rpc_is_grpc_url(pw->pw_url) ? "; no load reports"
		                                : "; using HTTP");
		load_report(pw, NULL, 0, "");
		return;
	}
	if (st->gs_code != GRPC_OK) {
		log_debug("%s: %s: GetLoads: %s: %s", __func__, pw->pw_url,
		    grpc_code_name(st->gs_code), st->gs_message);
		load_report(pw, NULL, 0, "");
		return;
	}
	switch (parse) {
	case LOADS_REPORT:
		load_report(pw, ranks, n, "grpc");
		return;
	case LOADS_EMPTY:
		log_debug("%s: %s: empty GetLoads response", __func__,
		    pw->pw_url);
		return;
	default:
		log_info("%s: %s: GetLoads answer missing or undecodable",
		    __func__, pw->pw_url);
		load_report(pw, NULL, 0, "");
		return;
	}
}

/* ------------------------------------------------------------ reports */

void
load_report(struct pworker *pw, Smg__RankLoad *ranks, size_t n,
    const char *source)
{
	struct pworker *sib[SHM_MAX_WORKERS];
	unsigned k, nsib;

	if (n > LOAD_MAX_RANKS)
		n = LOAD_MAX_RANKS;
	if (n > 0)
		log_debug("%s: %s via %s: %zu rank(s), waiting %lld, running "
		          "%lld",
		    __func__, pw->pw_base, source, n,
		    (long long)ranks[0].num_waiting_reqs,
		    (long long)ranks[0].num_running_reqs);
	/* A worker without rank takes every rank of its engine; the
	 * "<url>@<rank>" workers of one engine each take their own. */
	nsib = poller_ranks(pw, sib);
	for (k = 0; k < nsib; k++)
		load_send(sib[k], ranks, n, source);
	if (pw->pw_poller->p_cf->cf_engine_metrics && n > 0)
		load_gauges(pw, ranks, n);
}

/* The LoadReport of one worker: ranks[0..n), or for a rank its own. */
static void
load_send(struct pworker *pw, Smg__RankLoad *ranks, size_t n,
    const char *source)
{
	Smg__PollerMsg m = SMG__POLLER_MSG__INIT;
	Smg__LoadReport r = SMG__LOAD_REPORT__INIT;
	Smg__RankLoad *ptrs[LOAD_MAX_RANKS];
	struct timespec ts;
	size_t i, k = 0;

	for (i = 0; i < n; i++)
		if (pw->pw_rank < 0 || ranks[i].dp_rank == pw->pw_rank)
			ptrs[k++] = &ranks[i];
	if (n > 0 && k == 0)
		return; /* the engine reported no load of this rank */
	clock_gettime(CLOCK_REALTIME, &ts);
	r.worker_slot = pw->pw_slot;
	r.worker_generation = pw->pw_generation;
	r.worker_url = pw->pw_url;
	r.ok = k > 0;
	r.loads = k > 0 ? ptrs : NULL;
	r.n_loads = k;
	r.fetched_at_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	r.source = (char *)source;
	m.body_case = SMG__POLLER_MSG__BODY_LOAD;
	m.load = &r;
	(void)report_send(pw->pw_poller, &m);
}

/*
 * smg_engine_* gauges of --engine-metrics, from the poller's own metrics
 * row. With ranks NULL every gauge published before is zeroed.
 */
static void
load_gauges(struct pworker *pw, const Smg__RankLoad *ranks, size_t n)
{
	struct load_state *ls = &pw->pw_load;
	size_t i, upto = n > ls->ls_gauge_ranks ? n : ls->ls_gauge_ranks;

	for (i = 0; i < upto; i++) {
		const Smg__RankLoad *r =
		    ranks != NULL && i < n ? &ranks[i] : NULL;
		int32_t rank = r != NULL ? r->dp_rank : (int32_t)i;

		load_gauge_set(pw, "smg_engine_running_requests", rank,
		    r != NULL ? (double)r->num_running_reqs : 0, false);
		load_gauge_set(pw, "smg_engine_waiting_requests", rank,
		    r != NULL ? (double)r->num_waiting_reqs : 0, false);
		load_gauge_set(pw, "smg_engine_gen_throughput", rank,
		    r != NULL ? r->gen_throughput : 0, true);
		load_gauge_set(pw, "smg_engine_token_usage", rank,
		    r != NULL ? r->token_usage : 0, true);
		load_gauge_set(pw, "smg_engine_cache_hit_rate", rank,
		    r != NULL ? r->cache_hit_rate : 0, true);
	}
	ls->ls_gauge_ranks = ranks != NULL ? (unsigned)n : 0;
}

/* fractional: a ratio or rate, kept with six decimals. */
static void
load_gauge_set(struct pworker *pw, const char *family, int32_t rank,
    double value, bool fractional)
{
	struct shm *shm = pw->pw_poller->p_shm;
	char labels[SHM_SERIES_NAME_MAX], r[16];
	int s;

	snprintf(r, sizeof(r), "%d", (int)rank);
	if (metrics_labels(labels, sizeof(labels), "worker", pw->pw_url,
	        "model", pw->pw_model, "dp_rank", r, NULL) == -1)
		return;
	if (fractional) {
		if ((s = metrics_series(shm, METRICS_GAUGE_FLOAT, family,
		         labels)) >= 0)
			metrics_set_float(shm, SHM_ROW_POLLER, s, value);
	} else if ((s = metrics_series(shm, METRICS_GAUGE, family, labels)) >=
	    0)
		metrics_set(shm, SHM_ROW_POLLER, s, llround(value));
}
