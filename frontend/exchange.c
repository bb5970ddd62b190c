/*
 * exchange.c: a request's life upstream, for the single and the PD path
 * (see frontend.h). Three rules live here and nowhere else: a request is
 * counted in flight on its worker in exchange_dispatch and released in
 * exchange_end; a failed attempt becomes a status, an error code and a
 * retry-or-fail choice in exchange_next; every decision gets exactly one
 * outcome. The re-send of a request on a stale pooled connection is the
 * upstream client's (upstream.c), never repeated here.
 */
#include <stdio.h>
#include <string.h>

#include "frontend/frontend.h"
#include "shared/log.h"
#include "shared/url.h"

static void exchange_decided(void *, const struct decision *);
static void exchange_backoff_cb(struct ev_loop *, ev_timer *, int);
static void exchange_stream_cb(struct ev_loop *, ev_timer *, int);
static void exchange_cleanup(void *);
static void exchange_end_all(struct exchange *, int,
    const struct exchange_leg *, bool);
static void exchange_count(struct exchange *, bool, const char *);
static void exchange_stream_arm(struct exchange *, struct exchange_leg *, long);
static void exchange_prefill_estimate(struct exchange *, struct exchange_leg *);
static void exchange_release_pending(struct exchange_leg *);
static void exchange_trace_decision(struct exchange *,
    const struct exchange_leg *);
static void exchange_trace_attempt(struct exchange *, struct exchange_leg *,
    int, bool);

/* Whether a leg's worker prefills the prompt (not a decode or encode
 * leg): only those carry live prefill load. */
static bool
exchange_prefills(const struct exchange_leg *xl)
{
	return xl->xl_leg == SMG__LEG__LEG_SINGLE ||
	    xl->xl_leg == SMG__LEG__LEG_PREFILL;
}

struct exchange *
exchange_new(struct conn *c, const struct extract_inputs *in,
    enum extract_endpoint ep, const char *backend, unsigned nlegs,
    const unsigned *legs, const char *const *names,
    const struct exchange_ops *ops, void *arg)
{
	struct exchange *ex;
	unsigned i;

	if (nlegs == 0 || nlegs > EXCHANGE_MAX_LEGS)
		return NULL;
	if ((ex = conn_alloc(c, sizeof(*ex))) == NULL ||
	    conn_on_end(c, exchange_cleanup, ex) == -1)
		return NULL;
	ex->ex_conn = c;
	ex->ex_in = in;
	ex->ex_ep = ep;
	ex->ex_backend = backend;
	ex->ex_ops = ops;
	ex->ex_arg = arg;
	ex->ex_nlegs = nlegs;
	ex->ex_start = ev_now(fe->fe_loop);
	snprintf(ex->ex_model, sizeof(ex->ex_model), "%s", "unknown");
	backoff_policy_from_config(&ex->ex_rp, fe->fe_cf);
	ev_init(&ex->ex_backoff, exchange_backoff_cb);
	ex->ex_backoff.data = ex;
	for (i = 0; i < nlegs; i++) {
		ex->ex_legs[i].xl_ex = ex;
		ex->ex_legs[i].xl_leg = legs[i];
		ex->ex_legs[i].xl_name = names[i];
		ev_init(&ex->ex_legs[i].xl_timer, exchange_stream_cb);
		ex->ex_legs[i].xl_timer.data = &ex->ex_legs[i];
	}
	return ex;
}

void
exchange_fix(struct exchange *ex, unsigned slot, const struct shm_worker *w)
{
	struct decision *d = &ex->ex_legs[0].xl_d;

	ex->ex_fixed = true;
	ex->ex_rp.rp_max_attempts = 1;
	d->dc_ok = true;
	d->dc_slot = slot;
	d->dc_generation = w->sw_generation;
	snprintf(d->dc_url, sizeof(d->dc_url), "%s", w->sw_url);
	snprintf(d->dc_api_key, sizeof(d->dc_api_key), "%s", w->sw_api_key);
	ex->ex_legs[0].xl_decided = true;
}

void
exchange_route(struct exchange *ex)
{
	struct exchange_leg *xl;
	unsigned i;

	ex->ex_undecided = ex->ex_nlegs;
	if (trace_recording(ex->ex_rx))
		ex->ex_route_ns = otlp_now_ns();
	for (i = 0; i < ex->ex_nlegs; i++) {
		xl = &ex->ex_legs[i];
		xl->xl_decided = false;
		xl->xl_di.di_in = ex->ex_in;
		xl->xl_di.di_leg = xl->xl_leg;
		xl->xl_di.di_attempt = ex->ex_attempt;
		xl->xl_di.di_exclude = xl->xl_exclude;
		xl->xl_di.di_nexclude = xl->xl_nexclude;
		xl->xl_di.di_cb = exchange_decided;
		xl->xl_di.di_arg = xl;
		decide_submit(&xl->xl_di);
	}
}

int
exchange_admit(struct exchange *ex)
{
	char msg[FE_MSG_MAX];
	int retry;

	if (tenant_charge(ex->ex_rx, ex->ex_in->ei_model, ex->ex_prompt_tokens,
	        &retry, msg, sizeof(msg)))
		return 0;
	stats_add("smg_http_rate_limit_total", "result=\"rejected\"", 1);
	exchange_fail(ex, 429, "tenant_rate_limited", msg, retry);
	return -1;
}

bool
exchange_can_retry(const struct exchange *ex, int status)
{
	return !ex->ex_fixed && !ex->ex_relayed &&
	    backoff_status_retryable(status) &&
	    ex->ex_attempt + 1 < ex->ex_rp.rp_max_attempts;
}

/* Backs off, then routes again (gateway.md §7.1, §11.7). */
static void
exchange_retry(struct exchange *ex, const struct exchange_leg *failed)
{
	char labels[128];
	long ms;

	ms = backoff_ms(&ex->ex_rp, ex->ex_attempt, backoff_unit());
	snprintf(labels, sizeof(labels), "worker_type=\"%s\",endpoint=\"%s\"",
	    failed != NULL ? failed->xl_name : ex->ex_legs[0].xl_name,
	    extract_endpoint_name(ex->ex_ep));
	stats_add("smg_worker_retries_total", labels, 1);
	snprintf(labels, sizeof(labels), "attempt=\"%u\"", ex->ex_attempt + 1);
	stats_observe("smg_worker_retry_backoff_seconds", labels,
	    (double)ms / 1000.0);
	ex->ex_attempt++;
	if (ex->ex_ops->xo_reset != NULL)
		ex->ex_ops->xo_reset(ex->ex_arg);
	ev_timer_set(&ex->ex_backoff, (double)ms / 1000.0, 0.);
	ev_timer_start(fe->fe_loop, &ex->ex_backoff);
}

static void
exchange_backoff_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	exchange_route(w->data);
}

static void
exchange_exhausted(struct exchange *ex, const struct exchange_leg *failed)
{
	char labels[128];

	snprintf(labels, sizeof(labels), "worker_type=\"%s\",endpoint=\"%s\"",
	    failed->xl_name, extract_endpoint_name(ex->ex_ep));
	stats_add("smg_worker_retries_exhausted_total", labels, 1);
}

void
exchange_fail(struct exchange *ex, int status, const char *code,
    const char *msg, int retry_after)
{
	exchange_end_all(ex, 0, NULL, true);
	exchange_count(ex, false, code);
	ex->ex_ops->xo_failed(ex->ex_arg, status, code, msg, retry_after);
}

static void
exchange_decided(void *arg, const struct decision *d)
{
	struct exchange_leg *xl = arg, *bad = NULL;
	struct exchange *ex = xl->xl_ex;
	char labels[SHM_SERIES_NAME_MAX];
	const struct decision *md;
	unsigned i;

	xl->xl_d = *d;
	xl->xl_decided = true;
	xl->xl_outcome_due = d->dc_ok;
	if (--ex->ex_undecided > 0)
		return;
	for (i = 0; i < ex->ex_nlegs && bad == NULL; i++)
		if (!ex->ex_legs[i].xl_d.dc_ok)
			bad = &ex->ex_legs[i];
	/* The model label: the decode leg's in PD, else the only leg's. */
	md = &ex->ex_legs[ex->ex_nlegs > 1 ? 1 : 0].xl_d;
	if (md->dc_model[0] != '\0')
		snprintf(ex->ex_model, sizeof(ex->ex_model), "%s",
		    md->dc_model);
	exchange_trace_decision(ex, bad);
	if (bad != NULL) {
		d = &bad->xl_d;
		if (!d->dc_terminal && exchange_can_retry(ex, d->dc_status)) {
			/* Nothing was sent: the decided legs' keys end. */
			exchange_end_all(ex, 0, NULL, true);
			exchange_retry(ex, NULL);
			return;
		}
		if (!d->dc_terminal && backoff_status_retryable(d->dc_status) &&
		    ex->ex_rp.rp_max_attempts > 1)
			exchange_exhausted(ex, bad);
		exchange_fail(ex, d->dc_status, d->dc_code, d->dc_message,
		    (int)d->dc_retry_after);
		return;
	}
	for (i = 0; i < ex->ex_nlegs; i++) {
		d = &ex->ex_legs[i].xl_d;
		/* The broker counts its own selections; count local ones. */
		if (!d->dc_fallback)
			continue;
		snprintf(labels, sizeof(labels),
		    "worker_type=\"%s\",connection_mode=\"http\",model=\"%s\","
		    "policy=\"%s\"",
		    ex->ex_legs[i].xl_name, ex->ex_model,
		    d->dc_policy[0] != '\0' ? d->dc_policy : "unknown");
		stats_add("smg_worker_selection_total", labels, 1);
	}
	/* Overloaded since the decision (gateway.md §8): shed, terminal. */
	for (i = 0; i < ex->ex_nlegs; i++) {
		if (decide_dispatch_shed(&ex->ex_legs[i].xl_d)) {
			exchange_fail(ex, 503, "no_available_workers",
			    "All workers are overloaded",
			    (int)fe->fe_cf->cf_load_monitor_interval);
			return;
		}
	}
	ex->ex_ops->xo_routed(ex->ex_arg);
}

int
exchange_dispatch(struct exchange *ex, unsigned i, struct upstream_req *up)
{
	struct exchange_leg *xl = &ex->ex_legs[i];

	if (up == NULL) {
		exchange_next(ex, i, EXCHANGE_NO_REQUEST, 0, NULL);
		return -1;
	}
	xl->xl_up = up;
	xl->xl_sent = ev_now(fe->fe_loop);
	if (xl->xl_traceparent[0] != '\0')
		xl->xl_start_ns = otlp_now_ns();
	xl->xl_first_byte = false;
	xl->xl_ttfb = 0;
	/* A stream's first byte is its first token: it has a deadline of its
	 * own (a non-streamed body comes whole at the end, so none). */
	exchange_stream_arm(ex, xl,
	    fe->fe_cf->cf_stream_first_byte_timeout_secs);
	if (!xl->xl_inflight) {
		xl->xl_inflight = true;
		shm_inflight_inc(fe->fe_shm, fe->fe_row, xl->xl_d.dc_slot);
		/* Live load: this prompt waits for its first byte there. */
		xl->xl_ahead = shm_pending_total(fe->fe_shm, xl->xl_d.dc_slot);
		/* What it must prefill: the broker's estimate of what the
		 * worker already holds of this prompt is not work. */
		xl->xl_pending = exchange_prefills(xl) &&
		        ex->ex_prompt_tokens > xl->xl_d.dc_cached_tokens
		    ? ex->ex_prompt_tokens - xl->xl_d.dc_cached_tokens
		    : 0;
		if (xl->xl_pending > 0)
			shm_pending_add(fe->fe_shm, fe->fe_row,
			    xl->xl_d.dc_slot, (int64_t)xl->xl_pending);
		exchange_prefill_estimate(ex, xl);
	}
	return 0;
}

/*
 * A non-streamed response shows no first token: its body comes whole at
 * the end of the generation. Its prompt stops counting as waiting once
 * the worker should have prefilled what was ahead of it and it, at the
 * rate the broker expects of that worker.
 */
static void
exchange_prefill_estimate(struct exchange *ex, struct exchange_leg *xl)
{
	uint32_t rate;

	if (ex->ex_streaming || xl->xl_pending == 0)
		return;
	rate = shm_prefill_rate(fe->fe_shm, xl->xl_d.dc_slot);
	if (rate == 0)
		return;
	xl->xl_timer.repeat =
	    (double)(xl->xl_ahead + xl->xl_pending) / (double)rate + 0.001;
	ev_timer_again(fe->fe_loop, &xl->xl_timer);
}

/* Its prompt's prefill is no longer waiting on the worker. */
static void
exchange_release_pending(struct exchange_leg *xl)
{
	if (xl->xl_pending == 0)
		return;
	shm_pending_add(fe->fe_shm, fe->fe_row, xl->xl_d.dc_slot,
	    -(int64_t)xl->xl_pending);
	xl->xl_pending = 0;
}

void
exchange_first_byte(struct exchange *ex, unsigned i)
{
	struct exchange_leg *xl = &ex->ex_legs[i];

	if (xl->xl_first_byte)
		return;
	xl->xl_first_byte = true;
	xl->xl_ttfb = ev_now(fe->fe_loop) - xl->xl_sent;
	exchange_release_pending(xl);
	exchange_stream_arm(ex, xl, fe->fe_cf->cf_stream_idle_timeout_secs);
}

void
exchange_pause(struct exchange *ex, unsigned i, bool client)
{
	struct exchange_leg *xl = &ex->ex_legs[i];
	long secs = fe->fe_cf->cf_stream_idle_timeout_secs;

	if (xl->xl_up == NULL || xl->xl_paused)
		return;
	xl->xl_paused = true;
	xl->xl_client_paused = client;
	upstream_pause(xl->xl_up);
	ev_timer_stop(fe->fe_loop, &xl->xl_timer);
	if (client && secs > 0) {
		xl->xl_timer.repeat = (double)secs;
		ev_timer_again(fe->fe_loop, &xl->xl_timer);
	}
}

void
exchange_resume(struct exchange *ex, unsigned i)
{
	struct exchange_leg *xl = &ex->ex_legs[i];

	if (!xl->xl_paused)
		return;
	xl->xl_paused = false;
	xl->xl_client_paused = false;
	if (xl->xl_up == NULL)
		return;
	upstream_resume(xl->xl_up);
	exchange_stream_arm(ex, xl,
	    xl->xl_first_byte ? fe->fe_cf->cf_stream_idle_timeout_secs
	                      : fe->fe_cf->cf_stream_first_byte_timeout_secs);
}

void
exchange_progress(struct exchange *ex, unsigned i)
{
	struct exchange_leg *xl = &ex->ex_legs[i];

	if (ev_is_active(&xl->xl_timer))
		ev_timer_again(fe->fe_loop, &xl->xl_timer);
}

/* (Re)starts leg xl's stream deadline: secs without a byte (0: none). */
static void
exchange_stream_arm(struct exchange *ex, struct exchange_leg *xl, long secs)
{
	ev_timer_stop(fe->fe_loop, &xl->xl_timer);
	if (!ex->ex_streaming || secs <= 0)
		return;
	xl->xl_timer.repeat = (double)secs;
	ev_timer_again(fe->fe_loop, &xl->xl_timer);
}

/*
 * A stream went quiet too long: before anything was relayed the attempt
 * failed (504, retried); after, the client's response is cut.
 */
static void
exchange_stream_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct exchange_leg *xl = w->data;
	struct exchange *ex = xl->xl_ex;
	struct conn *c = ex->ex_conn;
	unsigned i = (unsigned)(xl - ex->ex_legs);

	(void)loop;
	(void)revents;
	ev_timer_stop(fe->fe_loop, w);
	if (xl->xl_client_paused) {
		/* The client stopped reading: its fault, not the worker's. */
		stats_add("smg_router_stream_timeouts_total", "kind=\"client\"",
		    1);
		exchange_end_all(ex, 0, NULL, true);
		exchange_count(ex, false, NULL);
		conn_request_abort(c);
		return;
	}
	if (!ex->ex_streaming) {
		/* exchange_prefill_estimate's deadline. */
		exchange_release_pending(xl);
		return;
	}
	stats_add("smg_router_stream_timeouts_total",
	    xl->xl_first_byte ? "kind=\"idle\"" : "kind=\"first_byte\"", 1);
	if (!ex->ex_relayed) {
		exchange_next(ex, i, EXCHANGE_TIMEOUT, 0, NULL);
		return;
	}
	exchange_finish(ex, 504, false);
	conn_flush(c);
	conn_request_abort(c);
}

void
exchange_end(struct exchange *ex, unsigned i, int status, bool transport,
    bool no_sample)
{
	struct exchange_leg *xl = &ex->ex_legs[i];
	struct outcome_live live = { 0 };
	bool sent = xl->xl_inflight;
	double ttfb_us;

	ev_timer_stop(fe->fe_loop, &xl->xl_timer);
	xl->xl_paused = xl->xl_client_paused = false;
	if (xl->xl_up != NULL) {
		upstream_cancel(xl->xl_up);
		xl->xl_up = NULL;
	}
	if (xl->xl_inflight) {
		xl->xl_inflight = false;
		exchange_release_pending(xl);
		shm_inflight_dec(fe->fe_shm, fe->fe_row, xl->xl_d.dc_slot);
		exchange_trace_attempt(ex, xl, status, transport);
	}
	if (xl->xl_outcome_due) {
		xl->xl_outcome_due = false;
		if (ex->ex_fixed)
			return; /* never decided by the broker */
		if (sent && exchange_prefills(xl)) {
			live.ol_prompt_tokens =
			    (uint32_t)(ex->ex_prompt_tokens > UINT32_MAX
			            ? UINT32_MAX
			            : ex->ex_prompt_tokens);
			live.ol_ahead_tokens = xl->xl_ahead;
			live.ol_first_byte = xl->xl_first_byte;
			ttfb_us = xl->xl_ttfb * 1e6;
			live.ol_ttfb_us = xl->xl_first_byte
			    ? (uint32_t)(ttfb_us > 4e9 ? 4e9 : ttfb_us)
			    : 0;
			/* A whole body at once: its first byte is the end of
			 * the generation, not of the prefill. */
			live.ol_unstreamed = !ex->ex_streaming;
		}
		decide_outcome_of(&xl->xl_d, ex->ex_in, status, transport,
		    no_sample, sent ? &live : NULL);
	}
}

/*
 * Ends every leg's attempt: with status for those that were sent
 * (transport blamed on `transport` only), without a sample for the
 * others, or for all when no_sample.
 */
static void
exchange_end_all(struct exchange *ex, int status,
    const struct exchange_leg *transport, bool no_sample)
{
	struct exchange_leg *xl;
	unsigned i;

	for (i = 0; i < ex->ex_nlegs; i++) {
		xl = &ex->ex_legs[i];
		exchange_end(ex, i, status != 0 ? status : 502, xl == transport,
		    no_sample || !xl->xl_inflight);
	}
}

/* The router's request series, once per request. */
static void
exchange_count(struct exchange *ex, bool ok, const char *code)
{
	if (ex->ex_ended || ex->ex_fixed)
		return;
	ex->ex_ended = true;
	stats_router_request(ex->ex_backend, ex->ex_model,
	    extract_endpoint_name(ex->ex_ep), ex->ex_streaming, ok,
	    ev_now(fe->fe_loop) - ex->ex_start);
	if (code != NULL)
		stats_router_error(ex->ex_backend, ex->ex_model,
		    extract_endpoint_name(ex->ex_ep), code);
}

/* The PD error codes of gateway.md §11.4-§11.5 for a leg's status. */
static int
exchange_pd_status(const char *leg, int status, char *code, size_t len)
{
	const char *what;
	int out = status;

	switch (status) {
	case 400:
		what = "bad_request";
		break;
	case 404:
		what = "not_found";
		break;
	case 500:
		what = "internal_error";
		break;
	case 502:
		what = "bad_gateway";
		break;
	case 503:
		what = "unavailable";
		break;
	default:
		what = "error";
		out = 500;
		break;
	}
	snprintf(code, len, "%s_%s", leg, what);
	return out;
}

enum exchange_failure
exchange_failure_of(enum upstream_error err)
{
	switch (err) {
	case UPSTREAM_CONNECT_FAILED:
		return EXCHANGE_CONNECT;
	case UPSTREAM_SEND_FAILED:
		return EXCHANGE_SEND;
	case UPSTREAM_TIMEOUT:
		return EXCHANGE_TIMEOUT;
	default:
		return EXCHANGE_BAD_RESPONSE;
	}
}

void
exchange_next(struct exchange *ex, unsigned i, enum exchange_failure f,
    int worker_status, const char *worker_message)
{
	struct exchange_leg *xl = &ex->ex_legs[i];
	bool pd = ex->ex_nlegs > 1, transport = true, sample = true;
	char code[FE_CODE_MAX], labels[192];
	const char *msg;
	int status;

	switch (f) {
	case EXCHANGE_WORKER_STATUS:
		transport = false;
		if (pd)
			status = exchange_pd_status(xl->xl_name, worker_status,
			    code, sizeof(code));
		else {
			status = worker_status;
			snprintf(code, sizeof(code), "%s", "worker_error");
		}
		msg = worker_message != NULL ? worker_message
		                             : "The worker answered an error";
		break;
	case EXCHANGE_NO_REQUEST:
		status = 500;
		snprintf(code, sizeof(code), "%s",
		    "call_upstream_request_error");
		msg = "Failed to send the request to the worker";
		break;
	case EXCHANGE_TIMEOUT:
		status = 504;
		snprintf(code, sizeof(code), "%s", "call_upstream_timeout");
		msg = "The worker did not answer in time";
		break;
	case EXCHANGE_TOO_LARGE:
		/* The worker answered: no breaker sample, and the same
		 * request would get the same answer: no retry either. */
		status = 502;
		transport = false;
		sample = false;
		snprintf(code, sizeof(code), "%s",
		    "upstream_response_too_large");
		msg = "The worker's response is over --max-payload-size";
		break;
	case EXCHANGE_NO_MEMORY:
		status = 503;
		transport = false;
		sample = false; /* the gateway's failure, not the worker's */
		snprintf(code, sizeof(code), "%s", "out_of_memory");
		msg = "Out of memory";
		break;
	default:
		if (pd) {
			status = 502;
			snprintf(code, sizeof(code), "%s", "pd_request_failed");
			msg = "PD disaggregation request failed";
		} else if (f == EXCHANGE_CONNECT) {
			status = 500;
			snprintf(code, sizeof(code), "%s",
			    "call_upstream_connection_failed");
			msg = "Failed to connect to the worker";
		} else if (f == EXCHANGE_SEND) {
			status = 500;
			snprintf(code, sizeof(code), "%s",
			    "call_upstream_request_error");
			msg = "Connection to the worker failed during the "
			      "request";
		} else {
			status = 502;
			snprintf(code, sizeof(code), "%s",
			    "call_upstream_bad_response");
			msg = "The worker sent an invalid response";
		}
		break;
	}
	exchange_end_all(ex,
	    f == EXCHANGE_WORKER_STATUS ? worker_status : status,
	    transport ? xl : NULL, !sample);
	snprintf(labels, sizeof(labels),
	    "router_type=\"http\",status_code=\"%d\",error_code=\"%s\"",
	    f == EXCHANGE_WORKER_STATUS ? worker_status : status,
	    f == EXCHANGE_WORKER_STATUS ? "" : code);
	stats_add("smg_router_upstream_responses_total", labels, 1);
	if (f != EXCHANGE_TOO_LARGE && exchange_can_retry(ex, status)) {
		/* Avoid this worker next time when another remains. */
		if (xl->xl_nexclude < FE_MAX_EXCLUDE)
			xl->xl_exclude[xl->xl_nexclude++] = xl->xl_d.dc_slot;
		exchange_retry(ex, xl);
		return;
	}
	/* Exhausted: a retryable failure that the policy would have tried
	 * again had attempts been left. */
	if (!ex->ex_fixed && f != EXCHANGE_TOO_LARGE &&
	    backoff_status_retryable(status) && ex->ex_rp.rp_max_attempts > 1)
		exchange_exhausted(ex, xl);
	exchange_count(ex, false, code);
	ex->ex_ops->xo_failed(ex->ex_arg, status, code, msg, 0);
}

void
exchange_finish(struct exchange *ex, int status, bool ok)
{
	char labels[128];
	unsigned i;

	if (!ex->ex_fixed) {
		snprintf(labels, sizeof(labels),
		    "router_type=\"http\",status_code=\"%d\",error_code=\"\"",
		    status);
		stats_add("smg_router_upstream_responses_total", labels, 1);
	}
	for (i = 0; i < ex->ex_nlegs; i++)
		exchange_end(ex, i, status, false, !ex->ex_legs[i].xl_inflight);
	exchange_count(ex, ok && status < 400, NULL);
}

/* The request's end hook: whatever is still open is released. */
static void
exchange_cleanup(void *arg)
{
	struct exchange *ex = arg;
	unsigned i;

	ev_timer_stop(fe->fe_loop, &ex->ex_backoff);
	for (i = 0; i < ex->ex_nlegs; i++)
		decide_cancel(&ex->ex_legs[i].xl_di);
	/* Ended without a result (client gone): only the keys' end. */
	exchange_end_all(ex, 0, NULL, true);
}

/*
 * The routing decision's span (trace.c): every leg decided, bad the leg
 * without a worker (NULL: all have one). On success each leg gets its
 * attempt's span id, the parent its worker will see.
 */
static void
exchange_trace_decision(struct exchange *ex, const struct exchange_leg *bad)
{
	char urls[OTLP_STR_MAX], policies[OTLP_STR_MAX];
	struct exchange_leg *xl;
	struct otlp_span sp;
	bool fallback = false;
	size_t ul = 0, pl = 0;
	unsigned i;
	int n;

	for (i = 0; i < ex->ex_nlegs; i++)
		ex->ex_legs[i].xl_traceparent[0] = '\0';
	if (!trace_recording(ex->ex_rx))
		return;
	snprintf(ex->ex_rx->rc_model, sizeof(ex->ex_rx->rc_model), "%s",
	    ex->ex_model);
	trace_span_begin(ex->ex_rx, &sp, NULL, "smg.route", OTLP_KIND_INTERNAL,
	    ex->ex_route_ns);
	urls[0] = policies[0] = '\0';
	for (i = 0; i < ex->ex_nlegs; i++) {
		xl = &ex->ex_legs[i];
		fallback |= xl->xl_d.dc_fallback;
		n = snprintf(urls + ul, sizeof(urls) - ul, "%s%s",
		    i > 0 ? "," : "", xl->xl_d.dc_ok ? xl->xl_d.dc_url : "");
		ul = n > 0 && ul + (size_t)n < sizeof(urls) ? ul + (size_t)n
		                                            : ul;
		n = snprintf(policies + pl, sizeof(policies) - pl, "%s%s",
		    i > 0 ? "," : "", xl->xl_d.dc_policy);
		pl = n > 0 && pl + (size_t)n < sizeof(policies) ? pl + (size_t)n
		                                                : pl;
		if (bad == NULL)
			trace_child(ex->ex_rx, xl->xl_span_id,
			    xl->xl_traceparent);
	}
	otlp_span_int(&sp, "smg.attempt", ex->ex_attempt);
	otlp_span_str(&sp, "smg.policy", policies);
	otlp_span_str(&sp, "gen_ai.request.model", ex->ex_model);
	otlp_span_bool(&sp, "smg.fallback", fallback);
	if (bad == NULL)
		otlp_span_str(&sp, "smg.worker.url", urls);
	else {
		otlp_span_int(&sp, "http.response.status_code",
		    bad->xl_d.dc_status);
		otlp_span_str(&sp, "error.type", bad->xl_d.dc_code);
	}
	trace_span_end(&sp, bad != NULL);
}

/*
 * Leg xl's attempt ended (it was sent): its client span, under the
 * request's, with the id its worker got as parent.
 */
static void
exchange_trace_attempt(struct exchange *ex, struct exchange_leg *xl, int status,
    bool transport)
{
	const struct http_request *hr;
	struct otlp_span sp;
	char name[OTLP_NAME_MAX];
	struct url u;

	if (xl->xl_traceparent[0] == '\0' || !trace_recording(ex->ex_rx))
		return;
	hr = ex->ex_rx->rc_hr;
	snprintf(name, sizeof(name), "%s %s", stats_method_label(hr),
	    stats_path_label(hr->hr_path));
	trace_span_begin(ex->ex_rx, &sp, xl->xl_span_id, name, OTLP_KIND_CLIENT,
	    xl->xl_start_ns);
	otlp_span_str(&sp, "http.request.method", stats_method_label(hr));
	otlp_span_str(&sp, "url.path", hr->hr_path);
	if (url_parse(xl->xl_d.dc_url, &u) == 0) {
		otlp_span_str(&sp, "server.address", u.u_host);
		otlp_span_int(&sp, "server.port", u.u_port);
	}
	otlp_span_str(&sp, "smg.worker.url", xl->xl_d.dc_url);
	otlp_span_str(&sp, "smg.worker_type", xl->xl_name);
	otlp_span_int(&sp, "smg.attempt", ex->ex_attempt);
	if (ex->ex_attempt > 0)
		otlp_span_int(&sp, "http.request.resend_count", ex->ex_attempt);
	otlp_span_str(&sp, "gen_ai.request.model", ex->ex_model);
	if (transport)
		otlp_span_str(&sp, "error.type", "transport");
	else
		otlp_span_int(&sp, "http.response.status_code", status);
	trace_span_end(&sp, transport || status >= 500);
	/* One span per attempt: a later end of this leg adds none. */
	xl->xl_traceparent[0] = '\0';
}
