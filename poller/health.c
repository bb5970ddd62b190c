/*
 * health.c: periodic health probes of Ready and NotReady workers
 * (gateway.md §10).
 *
 * Every --health-check-interval-secs per worker: GET <url><endpoint> with
 * the worker's bearer key and --health-check-timeout-secs; 2xx passes.
 * Each result goes to the broker as a HealthReport, which applies the
 * failure/success thresholds. The first probe of a worker comes one
 * interval after the poller first sees it Ready or NotReady (registration
 * has just checked it).
 */
#include "poller/poller.h"

#include <stdio.h>
#include <string.h>

#include "shared/config.h"
#include "shared/log.h"

/* Probe bodies are ignored; keep little of them. */
#define HEALTH_BODY_MAX 4096

static void health_done_cb(void *, const struct http_client_result *);

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
	if (hs->hs_next_ms == 0) {
		hs->hs_next_ms = now + interval;
		return;
	}
	if (hs->hs_req != NULL || now < hs->hs_next_ms)
		return;
	hs->hs_next_ms = now + interval;
	hs->hs_req = http_client_get(p->p_loop, p->p_tls, pw->pw_url,
	    cf->cf_health_check_endpoint, pw->pw_api_key,
	    (double)cf->cf_health_check_timeout_secs, HEALTH_BODY_MAX,
	    health_done_cb, pw);
}

void
health_stop(struct pworker *pw)
{
	http_client_cancel(pw->pw_health.hs_req);
	memset(&pw->pw_health, 0, sizeof(pw->pw_health));
}

static void
health_done_cb(void *arg, const struct http_client_result *res)
{
	struct pworker *pw = arg;
	Smg__PollerMsg m = SMG__POLLER_MSG__INIT;
	Smg__HealthReport h = SMG__HEALTH_REPORT__INIT;
	char detail[96];
	bool passed;

	pw->pw_health.hs_req = NULL;
	passed = res->hr_error == HTTP_CLIENT_OK && res->hr_status >= 200 &&
	    res->hr_status < 300;
	if (res->hr_error != HTTP_CLIENT_OK)
		snprintf(detail, sizeof(detail), "%s",
		    http_client_strerror(res->hr_error));
	else
		snprintf(detail, sizeof(detail), "status %d", res->hr_status);
	if (!passed)
		log_info("%s: %s%s failed: %s", __func__, pw->pw_url,
		    pw->pw_poller->p_cf->cf_health_check_endpoint, detail);
	else
		log_debug("%s: %s passed", __func__, pw->pw_url);
	h.worker_slot = pw->pw_slot;
	h.worker_generation = pw->pw_generation;
	h.worker_url = pw->pw_url;
	h.passed = passed;
	h.detail = detail;
	m.body_case = SMG__POLLER_MSG__BODY_HEALTH;
	m.health = &h;
	(void)report_send(pw->pw_poller, &m);
}
