/*
 * breaker.c: the per-worker circuit breaker of gateway.md §7.2-§7.3.
 *
 * The state machine itself (breaker_step, breaker_poll) is pure so it can
 * be tested without a loop; the worker-level wrappers publish the
 * smg_worker_cb_* metrics and the breaker column of the shm worker table.
 */
#include <stdint.h>

#include "shared/log.h"
#include "shared/metrics.h"
#include "shared/shm.h"

#include "broker.h"

static void breaker_enter(struct breaker *b, enum shm_breaker_state to,
    uint64_t now_ms);
static void breaker_publish(struct broker *br, struct worker *w,
    enum shm_breaker_state from, int changed);
static void breaker_metrics_init(struct broker *br, struct worker *w);
static void breaker_worker_new(struct broker *br, struct worker *w);

const struct registry_observer breaker_registry_observer = {
	.ro_worker_new = breaker_worker_new,
};

enum breaker_outcome
breaker_classify(uint32_t http_status, bool transport_error)
{
	if (transport_error)
		return BREAKER_FAILURE;
	switch (http_status) {
	case 429:
		return BREAKER_IGNORED;
	case 408:
	case 500:
	case 502:
	case 503:
	case 504:
		return BREAKER_FAILURE;
	default:
		return BREAKER_SUCCESS;
	}
}

void
breaker_conf_init(struct breaker_conf *bc, const struct config *cf)
{
	bc->bc_failure_threshold = cf->cf_disable_circuit_breaker
	    ? UINT32_MAX
	    : (uint32_t)cf->cf_cb_failure_threshold;
	bc->bc_success_threshold = (uint32_t)cf->cf_cb_success_threshold;
	bc->bc_timeout_ms = (uint64_t)cf->cf_cb_timeout_duration_secs * 1000;
	if (bc->bc_failure_threshold == 0)
		bc->bc_failure_threshold = 1;
	if (bc->bc_success_threshold == 0)
		bc->bc_success_threshold = 1;
}

void
breaker_init(struct breaker *b)
{
	b->cb_state = SHM_BREAKER_CLOSED;
	b->cb_failures = 0;
	b->cb_successes = 0;
	b->cb_opened_ms = 0;
}

static void
breaker_enter(struct breaker *b, enum shm_breaker_state to, uint64_t now_ms)
{
	b->cb_state = to;
	if (to == SHM_BREAKER_OPEN) {
		b->cb_opened_ms = now_ms;
		return;
	}
	/* Entering Closed or HalfOpen zeroes both counters. */
	b->cb_failures = 0;
	b->cb_successes = 0;
}

int
breaker_step(struct breaker *b, const struct breaker_conf *bc,
    enum breaker_outcome o, uint64_t now_ms, enum shm_breaker_state *from)
{
	*from = b->cb_state;
	if (o == BREAKER_IGNORED)
		return 0;
	if (o == BREAKER_SUCCESS) {
		b->cb_failures = 0;
		if (b->cb_successes < UINT32_MAX)
			b->cb_successes++;
		if (b->cb_state == SHM_BREAKER_HALF_OPEN &&
		    b->cb_successes >= bc->bc_success_threshold) {
			breaker_enter(b, SHM_BREAKER_CLOSED, now_ms);
			return 1;
		}
		return 0;
	}
	b->cb_successes = 0;
	if (b->cb_failures < UINT32_MAX)
		b->cb_failures++;
	switch (b->cb_state) {
	case SHM_BREAKER_CLOSED:
		if (b->cb_failures >= bc->bc_failure_threshold) {
			breaker_enter(b, SHM_BREAKER_OPEN, now_ms);
			return 1;
		}
		return 0;
	case SHM_BREAKER_HALF_OPEN:
		breaker_enter(b, SHM_BREAKER_OPEN, now_ms);
		return 1;
	case SHM_BREAKER_OPEN:
	default:
		/* A late outcome while open restarts nothing. */
		return 0;
	}
}

int
breaker_poll(struct breaker *b, const struct breaker_conf *bc, uint64_t now_ms,
    enum shm_breaker_state *from)
{
	*from = b->cb_state;
	if (b->cb_state != SHM_BREAKER_OPEN)
		return 0;
	if (now_ms - b->cb_opened_ms < bc->bc_timeout_ms)
		return 0;
	breaker_enter(b, SHM_BREAKER_HALF_OPEN, now_ms);
	return 1;
}

const char *
breaker_state_name(enum shm_breaker_state s)
{
	switch (s) {
	case SHM_BREAKER_CLOSED:
		return "closed";
	case SHM_BREAKER_OPEN:
		return "open";
	case SHM_BREAKER_HALF_OPEN:
		return "half_open";
	}
	return "unknown";
}

static void
breaker_worker_new(struct broker *br, struct worker *w)
{
	breaker_init(&w->wk_cb);
	breaker_metrics_init(br, w);
}

/* Registers the per-worker breaker series. */
static void
breaker_metrics_init(struct broker *br, struct worker *w)
{
	char u[SHM_URL_MAX * 2];

	stats_label_escape(u, sizeof(u), w->wk_url);
	w->wk_m_cb_state = stats_series(br, METRICS_GAUGE,
	    "smg_worker_cb_state", "worker=\"%s\"", u);
	w->wk_m_cb_fail = stats_series(br, METRICS_GAUGE,
	    "smg_worker_cb_consecutive_failures", "worker=\"%s\"", u);
	w->wk_m_cb_succ = stats_series(br, METRICS_GAUGE,
	    "smg_worker_cb_consecutive_successes", "worker=\"%s\"", u);
	w->wk_m_cb_out_ok =
	    stats_series(br, METRICS_COUNTER, "smg_worker_cb_outcomes_total",
	        "worker=\"%s\",outcome=\"success\"", u);
	w->wk_m_cb_out_fail =
	    stats_series(br, METRICS_COUNTER, "smg_worker_cb_outcomes_total",
	        "worker=\"%s\",outcome=\"failure\"", u);
	breaker_publish(br, w, w->wk_cb.cb_state, 0);
}

static void
breaker_publish(struct broker *br, struct worker *w,
    enum shm_breaker_state from, int changed)
{
	char u[SHM_URL_MAX * 2];
	int s;

	stats_set(br, w->wk_m_cb_state, (int64_t)w->wk_cb.cb_state);
	stats_set(br, w->wk_m_cb_fail, w->wk_cb.cb_failures);
	stats_set(br, w->wk_m_cb_succ, w->wk_cb.cb_successes);
	if (!changed)
		return;
	/* Transitions are rare: register their series when they happen. */
	stats_label_escape(u, sizeof(u), w->wk_url);
	s = stats_series(br, METRICS_COUNTER, "smg_worker_cb_transitions_total",
	    "worker=\"%s\",from=\"%s\",to=\"%s\"", u, breaker_state_name(from),
	    breaker_state_name(w->wk_cb.cb_state));
	stats_add(br, s, 1);
	log_info("%s: worker %s breaker %s -> %s", __func__, w->wk_url,
	    breaker_state_name(from), breaker_state_name(w->wk_cb.cb_state));
	registry_publish(br, w);
}

void
breaker_record(struct broker *br, struct worker *w, enum breaker_outcome o)
{
	enum shm_breaker_state from;
	int changed;

	changed =
	    breaker_step(&w->wk_cb, &br->br_cbconf, o, shm_now_ms(), &from);
	if (o == BREAKER_SUCCESS)
		stats_add(br, w->wk_m_cb_out_ok, 1);
	else if (o == BREAKER_FAILURE)
		stats_add(br, w->wk_m_cb_out_fail, 1);
	breaker_publish(br, w, from, changed);
}

bool
breaker_routable(struct broker *br, struct worker *w)
{
	enum shm_breaker_state from;

	if (w->wk_cb.cb_state != SHM_BREAKER_OPEN)
		return true;
	if (breaker_poll(&w->wk_cb, &br->br_cbconf, shm_now_ms(), &from))
		breaker_publish(br, w, from, 1);
	return w->wk_cb.cb_state != SHM_BREAKER_OPEN;
}
