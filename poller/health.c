/*
 * health.c: periodic health probes of Ready and NotReady workers
 * (gateway.md §10).
 *
 * Every --health-check-interval-secs per worker: GET <url><endpoint> with
 * the worker's bearer key and --health-check-timeout-secs; 2xx passes.
 * Each result goes to the broker as a HealthReport, which applies the
 * failure/success thresholds. The first probe of a worker comes one
 * interval after the poller first sees it Ready or NotReady (registration
 * has just checked it). A grpc:// worker is probed with its engine's
 * HealthCheck instead (workers.md §4.1): a healthy answer passes.
 */
#include "poller/poller.h"

#include <stdio.h>
#include <string.h>

#include "shared/config.h"
#include "shared/log.h"

/* Probe bodies are ignored; keep little of them. */
#define HEALTH_BODY_MAX 4096

static void health_done_cb(void *, const struct upstream_result *);
static void health_grpc_msg_cb(void *, const uint8_t *, size_t);
static void health_grpc_close_cb(void *, const struct grpc_status *);
static void health_grpc_detect_cb(struct pworker *, bool, const char *);
static void health_report(struct pworker *, bool, const char *);
static void health_grpc_start(struct pworker *);

void
health_tick(struct pworker *pw, uint64_t now)
{
	struct poller *p = pw->pw_poller;
	const struct config *cf = p->p_cf;
	struct health_state *hs = &pw->pw_health;
	uint64_t interval = (uint64_t)cf->cf_health_check_interval_secs * 1000;

	if (cf->cf_disable_health_check)
		return;
	if (pw->pw_status != SHM_WORKER_READY &&
	    pw->pw_status != SHM_WORKER_NOT_READY) {
		if (hs->hs_req != NULL || hs->hs_next_ms != 0)
			health_stop(pw);
		return;
	}
	if (!poller_leads(pw)) {
		/* Another rank of its engine probes for it. */
		if (hs->hs_req != NULL || hs->hs_call != NULL ||
		    hs->hs_detecting || hs->hs_next_ms != 0)
			health_stop(pw);
		return;
	}
	if (hs->hs_next_ms == 0) {
		hs->hs_next_ms = now + interval;
		return;
	}
	if (hs->hs_req != NULL || now < hs->hs_next_ms)
		return;
	if (hs->hs_call != NULL || hs->hs_detecting)
		return;
	hs->hs_next_ms = now + interval;
	if (rpc_is_grpc_url(pw->pw_url)) {
		health_grpc_start(pw);
		return;
	}
	hs->hs_req = fetch_get(p, pw->pw_base, cf->cf_health_check_endpoint,
	    pw->pw_api_key, (double)cf->cf_health_check_timeout_secs,
	    HEALTH_BODY_MAX, health_done_cb, pw);
}

/*
 * grpc:// workers: HealthCheck on the engine's service (a healthy answer
 * passes); with no engine learnt yet (the poller restarted), detection
 * does the probe and learns it.
 */
static void
health_grpc_start(struct pworker *pw)
{
	struct health_state *hs = &pw->pw_health;
	Sglang__Grpc__Scheduler__HealthCheckRequest req =
	    SGLANG__GRPC__SCHEDULER__HEALTH_CHECK_REQUEST__INIT;

	if (rpc_runtime(pw) == NULL) {
		hs->hs_detecting = rpc_detect(pw, health_grpc_detect_cb) == 0;
		if (!hs->hs_detecting)
			health_report(pw, false,
			    "cannot start gRPC HealthCheck");
		return;
	}
	hs->hs_passed = false;
	hs->hs_detail[0] = '\0';
	hs->hs_call = rpc_call(pw, RPC_HEALTH_CHECK, &req.base,
	    (double)pw->pw_poller->p_cf->cf_health_check_timeout_secs,
	    health_grpc_msg_cb, health_grpc_close_cb, pw);
	if (hs->hs_call == NULL)
		health_report(pw, false, "cannot start gRPC HealthCheck");
}

static void
health_grpc_detect_cb(struct pworker *pw, bool ok, const char *detail)
{
	pw->pw_health.hs_detecting = false;
	health_report(pw, ok, ok ? "healthy" : detail);
}

static void
health_grpc_msg_cb(void *arg, const uint8_t *msg, size_t len)
{
	struct health_state *hs = &((struct pworker *)arg)->pw_health;
	Sglang__Grpc__Scheduler__HealthCheckResponse *r;

	r = sglang__grpc__scheduler__health_check_response__unpack(NULL, len,
	    msg);
	if (r == NULL) {
		snprintf(hs->hs_detail, sizeof(hs->hs_detail),
		    "HealthCheckResponse does not decode");
		return;
	}
	hs->hs_passed = r->has_healthy && r->healthy;
	snprintf(hs->hs_detail, sizeof(hs->hs_detail), "%s%s%s",
	    hs->hs_passed ? "healthy" : "not healthy",
	    r->message != NULL && r->message[0] != '\0' ? ": " : "",
	    r->message != NULL ? r->message : "");
	sglang__grpc__scheduler__health_check_response__free_unpacked(r, NULL);
}

static void
health_grpc_close_cb(void *arg, const struct grpc_status *st)
{
	struct pworker *pw = arg;
	struct health_state *hs = &pw->pw_health;
	char detail[sizeof(hs->hs_detail)];

	hs->hs_call = NULL;
	if (st->gs_code != GRPC_OK) {
		snprintf(detail, sizeof(detail), "HealthCheck: %s: %s",
		    grpc_code_name(st->gs_code), st->gs_message);
		health_report(pw, false, detail);
		return;
	}
	snprintf(detail, sizeof(detail), "%s",
	    hs->hs_detail[0] ? hs->hs_detail : "no HealthCheckResponse");
	health_report(pw, hs->hs_passed, detail);
}

void
health_stop(struct pworker *pw)
{
	grpc_call_cancel(pw->pw_health.hs_call);
	if (pw->pw_health.hs_detecting)
		rpc_detect_cancel(pw);
	upstream_fetch_cancel(pw->pw_health.hs_req);
	memset(&pw->pw_health, 0, sizeof(pw->pw_health));
}

static void
health_done_cb(void *arg, const struct upstream_result *res)
{
	struct pworker *pw = arg;
	char detail[96];
	bool passed;

	pw->pw_health.hs_req = NULL;
	passed = res->ur_error == UPSTREAM_OK && res->ur_status >= 200 &&
	    res->ur_status < 300;
	if (res->ur_error != UPSTREAM_OK)
		snprintf(detail, sizeof(detail), "%s", res->ur_reason);
	else
		snprintf(detail, sizeof(detail), "status %d", res->ur_status);
	health_report(pw, passed, detail);
}

/*
 * The one exit of a probe, whatever its transport: the verdict of the
 * engine is every one of its ranks'.
 */
static void
health_report(struct pworker *pw, bool passed, const char *detail)
{
	struct pworker *ranks[SHM_MAX_WORKERS];
	unsigned i, n;

	if (!passed)
		log_info("%s: %s%s failed: %s", __func__, pw->pw_url,
		    rpc_is_grpc_url(pw->pw_url)
		        ? ""
		        : pw->pw_poller->p_cf->cf_health_check_endpoint,
		    detail);
	else
		log_debug("%s: %s passed", __func__, pw->pw_url);
	n = poller_ranks(pw, ranks);
	for (i = 0; i < n; i++) {
		Smg__PollerMsg m = SMG__POLLER_MSG__INIT;
		Smg__HealthReport h = SMG__HEALTH_REPORT__INIT;

		h.worker_slot = ranks[i]->pw_slot;
		h.worker_generation = ranks[i]->pw_generation;
		h.worker_url = ranks[i]->pw_url;
		h.passed = passed;
		h.detail = (char *)detail;
		m.body_case = SMG__POLLER_MSG__BODY_HEALTH;
		m.health = &h;
		(void)report_send(pw->pw_poller, &m);
	}
}
