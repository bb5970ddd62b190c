/*
 * admission.c: SMG's admission control for the inference routes
 * (gateway.md §2.6, §5): at most --max-concurrent-requests requests in
 * progress across every frontend (counted in shared memory), the others
 * waiting in a bounded FIFO queue (--queue-size across the gateway, one
 * FIFO per frontend) for at most --queue-timeout-secs, and, with
 * --rate-limit-tokens-per-second, a gateway-wide token bucket each admitted
 * request takes one token from. Queue full: 429 admission_queue_full;
 * waited too long: 503 admission_queue_timeout. Before all of that, the
 * request's tenant takes one request from its own rate (tenant.c; 429
 * tenant_rate_limited with Retry-After when over it).
 *
 * A request holds its place until it ends, however it ends (conn_on_end).
 * A frontend learns of places freed by another frontend by looking again
 * every ADMISSION_POLL while its queue is not empty; places freed by its
 * own requests are offered to its queue at once.
 */
#include <sys/queue.h>

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "frontend/frontend.h"
#include "shared/log.h"

#define ADMISSION_POLL 0.005 /* seconds between looks at other frontends */

enum admission_state {
	ADMISSION_QUEUED = 0,
	ADMISSION_RUNNING,
	ADMISSION_DONE,
};

/* One request under admission control, in its request memory. */
struct admission {
	struct conn *ad_conn;
	const struct http_request *ad_hr;
	enum extract_endpoint ad_ep;
	admission_start_cb ad_start;
	enum admission_state ad_state;
	bool ad_paused; /* we paused its streamed body while it waited */
	ev_tstamp ad_deadline;
	char ad_id[EXTRACT_REQUEST_ID_MAX + 1];
	TAILQ_ENTRY(admission) ad_link;
};

static void admission_end(void *);
static bool admission_try(void);
static void admission_run(struct admission *);
static void admission_timer_cb(struct ev_loop *, ev_timer *, int);
static void admission_arm(double);

static TAILQ_HEAD(, admission) admission_queue = TAILQ_HEAD_INITIALIZER(
    admission_queue);
static ev_timer admission_timer;
static bool admission_timer_ready;
/* The request being started now, and whether it ended meanwhile. */
static struct admission *admission_starting;
static bool admission_starting_ended;

bool
admission_enabled(void)
{
	return fe->fe_cf->cf_max_concurrent_requests > 0;
}

static uint64_t
admission_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Takes a place (and a rate token) for one request; false if none. */
static bool
admission_try(void)
{
	const struct config *cf = fe->fe_cf;
	uint64_t wait;

	if (!shm_admission_take(fe->fe_shm, fe->fe_row, SHM_ADMISSION_RUNNING,
	        (uint32_t)cf->cf_max_concurrent_requests))
		return false;
	if (cf->cf_rate_limit_tokens_per_second_set &&
	    !shm_rate_take(fe->fe_shm,
	        (double)cf->cf_rate_limit_tokens_per_second,
	        (double)cf->cf_max_concurrent_requests, admission_now_us(),
	        &wait)) {
		shm_admission_put(fe->fe_shm, fe->fe_row,
		    SHM_ADMISSION_RUNNING);
		return false;
	}
	return true;
}

static void
admission_arm(double after)
{
	if (!admission_timer_ready) {
		ev_timer_init(&admission_timer, admission_timer_cb, 0., 0.);
		admission_timer_ready = true;
	}
	ev_timer_stop(fe->fe_loop, &admission_timer);
	ev_timer_set(&admission_timer, after < 0 ? 0. : after, 0.);
	ev_timer_start(fe->fe_loop, &admission_timer);
}

/* An admitted request goes on to its route. */
static void
admission_run(struct admission *ad)
{
	bool paused = ad->ad_paused;
	struct conn *c = ad->ad_conn;

	ad->ad_state = ADMISSION_RUNNING;
	stats_add("smg_http_rate_limit_total", "result=\"allowed\"", 1);
	admission_starting = ad;
	admission_starting_ended = false;
	ad->ad_start(c, ad->ad_hr, ad->ad_ep, ad->ad_id);
	admission_starting = NULL;
	/* The route owns the body now; let it flow unless it ended. */
	if (paused && !admission_starting_ended)
		conn_body_resume(c);
}

static void
admission_end(void *arg)
{
	struct admission *ad = arg;

	if (ad == admission_starting)
		admission_starting_ended = true;
	switch (ad->ad_state) {
	case ADMISSION_QUEUED:
		TAILQ_REMOVE(&admission_queue, ad, ad_link);
		shm_admission_put(fe->fe_shm, fe->fe_row, SHM_ADMISSION_QUEUED);
		break;
	case ADMISSION_RUNNING:
		shm_admission_put(fe->fe_shm, fe->fe_row,
		    SHM_ADMISSION_RUNNING);
		if (!TAILQ_EMPTY(&admission_queue))
			admission_arm(0.);
		break;
	default:
		break;
	}
	ad->ad_state = ADMISSION_DONE;
}

/* Times out and admits the queue's head, in order. */
static void
admission_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct admission *ad;
	ev_tstamp now;

	(void)w;
	(void)revents;
	while ((ad = TAILQ_FIRST(&admission_queue)) != NULL) {
		now = ev_time();
		if (ad->ad_deadline <= now) {
			TAILQ_REMOVE(&admission_queue, ad, ad_link);
			shm_admission_put(fe->fe_shm, fe->fe_row,
			    SHM_ADMISSION_QUEUED);
			ad->ad_state = ADMISSION_DONE;
			stats_add("smg_http_rate_limit_total",
			    "result=\"rejected\"", 1);
			conn_error(ad->ad_conn, 503, "admission_queue_timeout",
			    "Request timed out in the admission queue",
			    ad->ad_id, 0);
			continue;
		}
		if (!admission_try())
			break;
		TAILQ_REMOVE(&admission_queue, ad, ad_link);
		shm_admission_put(fe->fe_shm, fe->fe_row, SHM_ADMISSION_QUEUED);
		admission_run(ad);
	}
	if ((ad = TAILQ_FIRST(&admission_queue)) != NULL) {
		now = ev_now(loop);
		admission_arm(ad->ad_deadline - now < ADMISSION_POLL
		        ? ad->ad_deadline - now
		        : ADMISSION_POLL);
	}
}

void
admission_start(struct conn *c, const struct http_request *hr,
    enum extract_endpoint ep, const char *request_id, admission_start_cb start)
{
	const struct config *cf = fe->fe_cf;
	struct admission *ad;
	int retry_after;

	/* The tenant's own rate first: an over-limit tenant never takes a
	 * place or a token that another tenant could use. */
	if (!tenant_take(reqctx_find(hr), &retry_after)) {
		stats_add("smg_http_rate_limit_total", "result=\"rejected\"",
		    1);
		conn_error(c, 429, "tenant_rate_limited",
		    "Too many requests: the tenant's rate limit is reached",
		    request_id, retry_after);
		return;
	}
	if (!admission_enabled()) {
		start(c, hr, ep, request_id);
		return;
	}
	if ((ad = conn_alloc(c, sizeof(*ad))) == NULL ||
	    conn_on_end(c, admission_end, ad) == -1) {
		conn_error(c, 503, "out_of_memory", "Out of memory", request_id,
		    0);
		return;
	}
	ad->ad_conn = c;
	ad->ad_hr = hr;
	ad->ad_ep = ep;
	ad->ad_start = start;
	ad->ad_state = ADMISSION_DONE;
	snprintf(ad->ad_id, sizeof(ad->ad_id), "%s", request_id);
	/* FIFO: nobody passes a request already waiting here. */
	if (TAILQ_EMPTY(&admission_queue) && admission_try()) {
		admission_run(ad);
		return;
	}
	if (cf->cf_queue_size <= 0 ||
	    !shm_admission_take(fe->fe_shm, fe->fe_row, SHM_ADMISSION_QUEUED,
	        (uint32_t)cf->cf_queue_size)) {
		stats_add("smg_http_rate_limit_total", "result=\"rejected\"",
		    1);
		conn_error(c, 429, "admission_queue_full",
		    "Too many requests: the admission queue is full",
		    request_id, 0);
		return;
	}
	ad->ad_state = ADMISSION_QUEUED;
	ad->ad_deadline = ev_time() + (double)cf->cf_queue_timeout_secs;
	if (conn_body_streaming(c)) {
		/* Its body waits in the socket until a route reads it. */
		conn_body_pause(c);
		ad->ad_paused = true;
	}
	TAILQ_INSERT_TAIL(&admission_queue, ad, ad_link);
	if (TAILQ_FIRST(&admission_queue) == ad)
		admission_arm(ADMISSION_POLL);
}

void
admission_shutdown(void)
{
	if (admission_timer_ready)
		ev_timer_stop(fe->fe_loop, &admission_timer);
}
