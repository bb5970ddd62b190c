/*
 * proxy.c: the inference path. A request is extracted, routed (broker or
 * local fallback), counted in flight on its worker in the shm row, sent
 * on a pooled upstream connection, and its response relayed as it arrives
 * (SSE chunk by chunk, with back-pressure through upstream_pause). Failed
 * attempts are retried per gateway.md §7.1 until a byte went to the client.
 * A large body may instead be streamed to the worker unparsed (§6.4): it
 * is routed on its headers alone, relayed as it arrives, never retried.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "frontend/frontend.h"
#include "shared/log.h"

#define PROXY_PATH_MAX 2048

struct req {
	struct conn *rq_conn;
	const struct http_request *rq_hr;
	struct extract_inputs rq_in;
	char rq_id[EXTRACT_REQUEST_ID_MAX + 1];
	enum extract_endpoint rq_ep;
	bool rq_fixed; /* a gateway-local relay: no routing */
	struct retry_policy rq_rp;
	unsigned rq_attempt; /* 0-based */
	uint32_t rq_exclude[FE_MAX_EXCLUDE];
	size_t rq_nexclude;
	struct decide_item rq_di;
	struct decision rq_d;
	char *rq_body_alloc; /* re-serialised body (alias resolved) */
	const char *rq_body;
	size_t rq_body_len;
	char rq_path[PROXY_PATH_MAX];
	struct upstream_req *rq_up;
	bool rq_inflight;
	bool rq_head_sent;
	bool rq_chunked;
	bool rq_streaming;
	bool rq_paused;
	bool rq_resent;
	bool rq_routed; /* some decision succeeded */
	bool rq_outcome_due; /* rq_d still owes the broker its outcome */
	int rq_status; /* worker status of this attempt */
	bool rq_stream_body; /* body streamed unparsed (gateway.md §6.4) */
	bool rq_client_paused; /* reading the streamed body is paused */
	uint64_t rq_body_total; /* its declared length */
	char *rq_early; /* body pieces that came before the dispatch */
	size_t rq_early_len;
	size_t rq_early_cap;
	char rq_model[SHM_MODEL_MAX]; /* metric label */
	ev_timer rq_backoff;
	ev_tstamp rq_start;
};

static void proxy_gone(void *);
static void proxy_drained(void *);
static void proxy_decided(void *, const struct decision *);
static void proxy_attempt(struct req *);
static void proxy_on_head(void *, int, const struct upstream_header *, size_t);
static void proxy_on_body(void *, const char *, size_t);
static void proxy_on_done(void *, enum upstream_error);
static void proxy_attempt_failed(struct req *, int, const char *, const char *,
    bool);
static void proxy_backoff_cb(struct ev_loop *, ev_timer *, int);
static void proxy_end_inflight(struct req *);
static void proxy_outcome(struct req *, int, bool, bool);
static void proxy_free(struct req *);
static void proxy_fail(struct req *, int, const char *, const char *, int);
static void proxy_count(struct req *, int, bool);
static int proxy_resolve_alias(struct req *);
static void proxy_start_stream(struct req *);
static void proxy_body(void *, const char *, size_t, bool);
static void proxy_body_stalled(void *);
static void proxy_on_writable(void *);
static void proxy_body_flow(struct req *, ssize_t);
static bool proxy_can_retry(struct req *);

static const struct conn_handler proxy_handler = {
	.ch_gone = proxy_gone,
	.ch_drained = proxy_drained,
	.ch_body = proxy_body,
	.ch_body_stalled = proxy_body_stalled,
};

static const struct upstream_cbs proxy_cbs = {
	.on_head = proxy_on_head,
	.on_body = proxy_on_body,
	.on_done = proxy_on_done,
	.on_writable = proxy_on_writable,
};

static struct req *
proxy_new(struct conn *c, const struct http_request *hr, const char *request_id)
{
	struct req *rq;
	int n;

	if ((rq = calloc(1, sizeof(*rq))) == NULL)
		return NULL;
	rq->rq_conn = c;
	rq->rq_hr = hr;
	rq->rq_start = ev_now(fe->fe_loop);
	snprintf(rq->rq_id, sizeof(rq->rq_id), "%s", request_id);
	snprintf(rq->rq_model, sizeof(rq->rq_model), "%s", "unknown");
	n = snprintf(rq->rq_path, sizeof(rq->rq_path), "%s%s%s", hr->hr_path,
	    hr->hr_has_query ? "?" : "", hr->hr_query);
	if (n < 0 || (size_t)n >= sizeof(rq->rq_path)) {
		free(rq);
		return NULL;
	}
	ev_init(&rq->rq_backoff, proxy_backoff_cb);
	rq->rq_backoff.data = rq;
	conn_set_handler(c, &proxy_handler, rq);
	return rq;
}

void
proxy_start(struct conn *c, const struct http_request *hr,
    enum extract_endpoint ep, const char *request_id)
{
	const struct config *cf = fe->fe_cf;
	struct req *rq;
	const char *code;
	char msg[FE_MSG_MAX];
	int status;

	if ((rq = proxy_new(c, hr, request_id)) == NULL) {
		conn_error(c, 503, "out_of_memory", "Out of memory", request_id,
		    0);
		local_count_response(hr, 503);
		return;
	}
	rq->rq_ep = ep;
	retry_policy_from_config(&rq->rq_rp, cf);
	if (conn_body_streaming(c)) {
		proxy_start_stream(rq);
		return;
	}
	if (extract_inputs(ep, hr->hr_body, hr->hr_body_len, hr,
	        (const char *const *)cf->cf_routing_key_headers,
	        cf->cf_routing_key_headers_n, cf->cf_routing_key_override,
	        &rq->rq_in, &status, &code, msg, sizeof(msg)) == -1) {
		proxy_fail(rq, status, code, msg, 0);
		return;
	}
	rq->rq_streaming = rq->rq_in.ei_stream;
	rq->rq_body = hr->hr_body;
	rq->rq_body_len = hr->hr_body_len;
	if (proxy_resolve_alias(rq) == -1) {
		proxy_fail(rq, 503, "out_of_memory", "Out of memory", 0);
		return;
	}
	rq->rq_di.di_in = &rq->rq_in;
	rq->rq_di.di_cb = proxy_decided;
	rq->rq_di.di_arg = rq;
	rq->rq_di.di_attempt = 0;
	decide_submit(&rq->rq_di);
}

void
proxy_fixed(struct conn *c, const struct http_request *hr,
    const struct shm_worker *w, unsigned slot, const char *request_id)
{
	struct req *rq;

	if ((rq = proxy_new(c, hr, request_id)) == NULL) {
		conn_error(c, 503, "out_of_memory", "Out of memory", request_id,
		    0);
		local_count_response(hr, 503);
		return;
	}
	rq->rq_fixed = true;
	rq->rq_rp.rp_max_attempts = 1;
	rq->rq_body = hr->hr_body;
	rq->rq_body_len = hr->hr_body_len;
	rq->rq_d.dc_ok = true;
	rq->rq_d.dc_slot = slot;
	rq->rq_d.dc_generation = w->sw_generation;
	snprintf(rq->rq_d.dc_url, sizeof(rq->rq_d.dc_url), "%s", w->sw_url);
	snprintf(rq->rq_d.dc_api_key, sizeof(rq->rq_d.dc_api_key), "%s",
	    w->sw_api_key);
	proxy_attempt(rq);
}

static void
proxy_free(struct req *rq)
{
	decide_cancel(&rq->rq_di);
	ev_timer_stop(fe->fe_loop, &rq->rq_backoff);
	if (rq->rq_up != NULL) {
		upstream_cancel(rq->rq_up);
		rq->rq_up = NULL;
	}
	proxy_end_inflight(rq);
	/* Ended without a result (client gone, shed): only the key's end. */
	proxy_outcome(rq, 0, false, true);
	extract_inputs_free(&rq->rq_in);
	free(rq->rq_body_alloc);
	free(rq->rq_early);
	free(rq);
}

static void
proxy_end_inflight(struct req *rq)
{
	if (!rq->rq_inflight)
		return;
	rq->rq_inflight = false;
	shm_inflight_dec(fe->fe_shm, fe->fe_row, rq->rq_d.dc_slot);
}

/* The one outcome of the current decision (decide_outcome). */
static void
proxy_outcome(struct req *rq, int status, bool transport, bool no_sample)
{
	if (!rq->rq_outcome_due)
		return;
	rq->rq_outcome_due = false;
	decide_outcome_of(&rq->rq_d, &rq->rq_in, status, transport, no_sample,
	    NULL);
}

/* Request-level metrics once the response is decided. */
static void
proxy_count(struct req *rq, int status, bool ok)
{
	local_count_response(rq->rq_hr, status);
	if (rq->rq_fixed)
		return;
	stats_router_request("regular", rq->rq_model,
	    extract_endpoint_name(rq->rq_ep), rq->rq_streaming, ok,
	    ev_now(fe->fe_loop) - rq->rq_start);
}

/* Answers with a gateway error and ends the request. */
static void
proxy_fail(struct req *rq, int status, const char *code, const char *msg,
    int retry_after)
{
	struct conn *c = rq->rq_conn;

	proxy_count(rq, status, false);
	if (!rq->rq_fixed)
		stats_router_error("regular", rq->rq_model,
		    extract_endpoint_name(rq->rq_ep), code);
	rq->rq_conn = NULL;
	conn_error(c, status, code, msg, rq->rq_id, retry_after);
	proxy_free(rq);
}

static void
proxy_gone(void *arg)
{
	struct req *rq = arg;

	rq->rq_conn = NULL;
	proxy_free(rq);
}

static void
proxy_drained(void *arg)
{
	struct req *rq = arg;

	if (rq->rq_paused && rq->rq_up != NULL) {
		rq->rq_paused = false;
		upstream_resume(rq->rq_up);
	}
}

static bool
proxy_can_retry(struct req *rq)
{
	return !rq->rq_fixed && !rq->rq_head_sent &&
	    rq->rq_attempt + 1 < rq->rq_rp.rp_max_attempts;
}

/* Backs off, then asks for a new decision (gateway.md §7.1). */
static void
proxy_retry(struct req *rq)
{
	char labels[128];
	long ms;

	ms = retry_backoff_ms(&rq->rq_rp, rq->rq_attempt, retry_unit());
	snprintf(labels, sizeof(labels),
	    "worker_type=\"regular\",endpoint=\"%s\"",
	    extract_endpoint_name(rq->rq_ep));
	stats_add("smg_worker_retries_total", labels, 1);
	snprintf(labels, sizeof(labels), "attempt=\"%u\"", rq->rq_attempt + 1);
	stats_observe("smg_worker_retry_backoff_seconds", labels,
	    (double)ms / 1000.0);
	rq->rq_attempt++;
	ev_timer_set(&rq->rq_backoff, (double)ms / 1000.0, 0.);
	ev_timer_start(fe->fe_loop, &rq->rq_backoff);
}

static void
proxy_exhausted(struct req *rq)
{
	char labels[128];

	snprintf(labels, sizeof(labels),
	    "worker_type=\"regular\",endpoint=\"%s\"",
	    extract_endpoint_name(rq->rq_ep));
	stats_add("smg_worker_retries_exhausted_total", labels, 1);
}

static void
proxy_backoff_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct req *rq = w->data;

	(void)loop;
	(void)revents;
	rq->rq_di.di_attempt = rq->rq_attempt;
	rq->rq_di.di_exclude = rq->rq_exclude;
	rq->rq_di.di_nexclude = rq->rq_nexclude;
	decide_submit(&rq->rq_di);
}

static void
proxy_decided(void *arg, const struct decision *d)
{
	struct req *rq = arg;
	char labels[SHM_SERIES_NAME_MAX];

	if (!d->dc_ok) {
		if (retry_status_retryable(d->dc_status) && !d->dc_terminal &&
		    proxy_can_retry(rq)) {
			proxy_retry(rq);
			return;
		}
		if (retry_status_retryable(d->dc_status) && !d->dc_terminal)
			proxy_exhausted(rq);
		proxy_fail(rq, d->dc_status, d->dc_code, d->dc_message,
		    (int)d->dc_retry_after);
		return;
	}
	rq->rq_d = *d;
	rq->rq_routed = true;
	rq->rq_outcome_due = true;
	snprintf(rq->rq_model, sizeof(rq->rq_model), "%s",
	    d->dc_model[0] != '\0' ? d->dc_model : "unknown");
	snprintf(labels, sizeof(labels),
	    "worker_type=\"regular\",connection_mode=\"http\",model=\"%s\","
	    "policy=\"%s\"",
	    rq->rq_model, d->dc_policy[0] != '\0' ? d->dc_policy : "unknown");
	/* The broker counts its own selections; count only local ones. */
	if (d->dc_fallback)
		stats_add("smg_worker_selection_total", labels, 1);
	/* Overloaded since the decision (gateway.md §8): shed, terminal. */
	if (decide_dispatch_shed(d)) {
		proxy_fail(rq, 503, "no_available_workers",
		    "All workers are overloaded",
		    (int)fe->fe_cf->cf_load_monitor_interval);
		return;
	}
	proxy_attempt(rq);
}

/*
 * --model-alias (gateway.md §3.1, §4.1): a request naming an alias is
 * routed by the canonical id, and the worker gets the body re-serialised
 * with "model" replaced by it. Other bodies go out byte for byte.
 * Returns 0, or -1 when out of memory.
 */
static int
proxy_resolve_alias(struct req *rq)
{
	struct extract_inputs *in = &rq->rq_in;
	const char *canon;
	char *s, *model;
	cJSON *m;

	if (in->ei_model == NULL || in->ei_json == NULL)
		return 0;
	canon = fallback_canonical(fe->fe_cf, in->ei_model);
	if (strcmp(canon, in->ei_model) == 0)
		return 0;
	if ((model = strdup(canon)) == NULL)
		return -1;
	if ((m = cJSON_CreateString(canon)) == NULL) {
		free(model);
		return -1;
	}
	if (!cJSON_ReplaceItemInObjectCaseSensitive(in->ei_json, "model", m)) {
		cJSON_Delete(m);
		free(model);
		return -1;
	}
	if ((s = cJSON_PrintUnformatted(in->ei_json)) == NULL) {
		free(model);
		return -1;
	}
	free(in->ei_model);
	in->ei_model = model;
	rq->rq_body_alloc = s;
	rq->rq_body = s;
	rq->rq_body_len = strlen(s);
	return 0;
}

static void
proxy_attempt(struct req *rq)
{
	struct upstream_header hdrs[HDR_UPSTREAM_MAX];
	char auth[SHM_KEY_MAX + 16];
	size_t n;
	bool post = !rq->rq_fixed || rq->rq_hr->hr_method == HTTP_POST;

	n = hdr_upstream(rq->rq_hr, rq->rq_id, rq->rq_d.dc_api_key,
	    post && rq->rq_body_len > 0, auth, sizeof(auth), hdrs,
	    HDR_UPSTREAM_MAX);
	rq->rq_status = 0;
	if (rq->rq_stream_body) {
		n = hdr_upstream(rq->rq_hr, rq->rq_id, rq->rq_d.dc_api_key,
		    true, auth, sizeof(auth), hdrs, HDR_UPSTREAM_MAX);
		rq->rq_up = upstream_request_stream(fe->fe_up, rq->rq_d.dc_url,
		    "POST", rq->rq_path, hdrs, n, rq->rq_body_total, &proxy_cbs,
		    rq);
	} else
		rq->rq_up = upstream_request(fe->fe_up, rq->rq_d.dc_url,
		    rq->rq_fixed ? rq->rq_hr->hr_method_str : "POST",
		    rq->rq_path, hdrs, n, rq->rq_body, rq->rq_body_len,
		    &proxy_cbs, rq);
	if (rq->rq_up != NULL && rq->rq_stream_body && rq->rq_early_len > 0) {
		ssize_t left = upstream_body_write(rq->rq_up, rq->rq_early,
		    rq->rq_early_len);

		free(rq->rq_early);
		rq->rq_early = NULL;
		rq->rq_early_len = rq->rq_early_cap = 0;
		if (left == -1) {
			upstream_cancel(rq->rq_up);
			rq->rq_up = NULL;
		} else
			proxy_body_flow(rq, left);
	}
	if (rq->rq_up == NULL) {
		proxy_attempt_failed(rq, 500, "call_upstream_request_error",
		    "Failed to send the request to the worker", true);
		return;
	}
	shm_inflight_inc(fe->fe_shm, fe->fe_row, rq->rq_d.dc_slot);
	rq->rq_inflight = true;
}

/*
 * An attempt ended without a byte relayed: record it, then retry or
 * answer with the gateway error.
 */
static void
proxy_attempt_failed(struct req *rq, int status, const char *code,
    const char *msg, bool transport)
{
	char labels[192];

	proxy_end_inflight(rq);
	proxy_outcome(rq, status, transport, false);
	snprintf(labels, sizeof(labels),
	    "router_type=\"http\",status_code=\"%d\",error_code=\"%s\"", status,
	    code);
	stats_add("smg_router_upstream_responses_total", labels, 1);
	if (proxy_can_retry(rq)) {
		/* Avoid this worker next time when another remains. */
		if (rq->rq_nexclude < FE_MAX_EXCLUDE)
			rq->rq_exclude[rq->rq_nexclude++] = rq->rq_d.dc_slot;
		proxy_retry(rq);
		return;
	}
	if (!rq->rq_fixed)
		proxy_exhausted(rq);
	proxy_fail(rq, status, code, msg, 0);
}

static void
proxy_on_head(void *arg, int status, const struct upstream_header *h, size_t n)
{
	struct req *rq = arg;
	struct conn *c = rq->rq_conn;
	const struct upstream_header *cl;
	bool keep_length;
	char labels[128];

	rq->rq_status = status;
	if (retry_status_retryable(status) && proxy_can_retry(rq)) {
		/* Not relayed: drop this response and try again. */
		upstream_cancel(rq->rq_up);
		rq->rq_up = NULL;
		proxy_end_inflight(rq);
		proxy_outcome(rq, status, false, false);
		snprintf(labels, sizeof(labels),
		    "router_type=\"http\",status_code=\"%d\",error_code=\"\"",
		    status);
		stats_add("smg_router_upstream_responses_total", labels, 1);
		if (rq->rq_nexclude < FE_MAX_EXCLUDE)
			rq->rq_exclude[rq->rq_nexclude++] = rq->rq_d.dc_slot;
		proxy_retry(rq);
		return;
	}
	if (retry_status_retryable(status) && !rq->rq_fixed)
		proxy_exhausted(rq);
	cl = hdr_find(h, n, "content-length");
	keep_length = cl != NULL;
	rq->rq_chunked = !keep_length && conn_http_minor(c) >= 1;
	if (!keep_length && !rq->rq_chunked)
		conn_set_close(c); /* HTTP/1.0: the close ends the body */
	hdr_response_head(conn_out(c), status, h, n, keep_length,
	    rq->rq_streaming && status < 300, rq->rq_chunked, rq->rq_id,
	    rq->rq_fixed ? NULL : rq->rq_d.dc_url, conn_keep_alive(c));
	rq->rq_head_sent = true;
	/* Goes out with the first body bytes (or the whole body). */
	conn_flush_later(c);
}

static void
proxy_on_body(void *arg, const char *data, size_t len)
{
	struct req *rq = arg;
	struct conn *c = rq->rq_conn;
	struct http_out *o = conn_out(c);
	char sz[24];
	int n;

	if (len == 0)
		return;
	if (rq->rq_chunked) {
		n = snprintf(sz, sizeof(sz), "%zx\r\n", len);
		http_out_append(o, sz, (size_t)n);
		http_out_append(o, data, len);
		http_out_append(o, "\r\n", 2);
	} else
		http_out_append(o, data, len);
	/*
	 * One write per loop turn for all the pieces of an upstream read;
	 * past the high mark write now, so that a pause always has a
	 * pending write whose completion resumes it (ch_drained).
	 */
	if (conn_pending(c) > FE_OUT_HIGH)
		conn_flush(c);
	else
		conn_flush_later(c);
	if (!rq->rq_paused && conn_pending(c) > FE_OUT_HIGH &&
	    rq->rq_up != NULL) {
		rq->rq_paused = true;
		upstream_pause(rq->rq_up);
	}
}

static void
proxy_on_done(void *arg, enum upstream_error err)
{
	struct req *rq = arg;
	struct conn *c = rq->rq_conn;
	char labels[128];

	rq->rq_up = NULL;
	if (err == UPSTREAM_OK || rq->rq_head_sent) {
		proxy_end_inflight(rq);
		proxy_outcome(rq, rq->rq_status, false, false);
		snprintf(labels, sizeof(labels),
		    "router_type=\"http\",status_code=\"%d\",error_code=\"\"",
		    rq->rq_status);
		stats_add("smg_router_upstream_responses_total", labels, 1);
		proxy_count(rq, rq->rq_status,
		    err == UPSTREAM_OK && rq->rq_status < 400);
		rq->rq_conn = NULL;
		if (err == UPSTREAM_OK) {
			if (rq->rq_chunked)
				http_out_append(conn_out(c), "0\r\n\r\n", 5);
			conn_request_done(c);
		} else {
			/* Cut mid-body: the client sees the connection end. */
			conn_flush(c);
			conn_request_abort(c);
		}
		proxy_free(rq);
		return;
	}
	switch (err) {
	case UPSTREAM_SEND_FAILED:
		/* A streamed body is gone: it cannot be sent again. */
		if (!rq->rq_resent && !rq->rq_stream_body) {
			/* Reset before any response: re-send once. */
			rq->rq_resent = true;
			proxy_end_inflight(rq);
			stats_add("smg_router_upstream_send_retries_total",
			    "router_type=\"http\"", 1);
			proxy_attempt(rq);
			return;
		}
		proxy_attempt_failed(rq, 500, "call_upstream_request_error",
		    "Connection to the worker failed during the request", true);
		return;
	case UPSTREAM_CONNECT_FAILED:
		proxy_attempt_failed(rq, 500, "call_upstream_connection_failed",
		    "Failed to connect to the worker", true);
		return;
	case UPSTREAM_TIMEOUT:
		proxy_attempt_failed(rq, 504, "call_upstream_timeout",
		    "The worker did not answer in time", true);
		return;
	default:
		proxy_attempt_failed(rq, 502, "call_upstream_bad_response",
		    "The worker sent an invalid response", true);
		return;
	}
}

/* ------------------------------------------------- streamed bodies */

/* Whether the policy needs the request text (gateway.md §6.4). */
static bool
proxy_policy_needs_text(enum policy_kind k)
{
	return k == POLICY_CACHE_AWARE || k == POLICY_BUCKET;
}

bool
proxy_stream_wanted(const struct http_request *hr)
{
	const struct config *cf = fe->fe_cf;
	struct extract_inputs in;
	enum extract_endpoint ep;
	bool hinted;

	if (cf->cf_max_buffered_request_bytes == 0 ||
	    hr->hr_method != HTTP_POST || hr->hr_chunked ||
	    hr->hr_content_length < 0 ||
	    (uint64_t)hr->hr_content_length <=
	        cf->cf_max_buffered_request_bytes)
		return false;
	if (extract_route(hr->hr_path, &ep) == -1)
		return false;
	switch (ep) {
	case EXTRACT_EP_GENERATE:
	case EXTRACT_EP_CHAT:
	case EXTRACT_EP_COMPLETIONS:
	case EXTRACT_EP_MESSAGES:
	case EXTRACT_EP_EMBEDDINGS:
	case EXTRACT_EP_CLASSIFY:
		break;
	default:
		return false;
	}
	/* A worker would rewrite the body; several routers. */
	if (cf->cf_pd_disaggregation || cf->cf_epd_disaggregation ||
	    cf->cf_dp_aware || cf->cf_enable_igw)
		return false;
	if (!proxy_policy_needs_text(cf->cf_policy))
		return true;
	if (extract_inputs_headers(ep, hr,
	        (const char *const *)cf->cf_routing_key_headers,
	        cf->cf_routing_key_headers_n, &in) == -1)
		return false;
	hinted = (in.ei_has_tokens && in.ei_tokens_from_header) ||
	    (cf->cf_routing_key_override && in.ei_routing_key != NULL);
	extract_inputs_free(&in);
	return hinted;
}

/* Routes a streamed-body request on its headers: model "unknown". */
static void
proxy_start_stream(struct req *rq)
{
	const struct config *cf = fe->fe_cf;
	const struct http_request *hr = rq->rq_hr;

	rq->rq_stream_body = true;
	rq->rq_body_total = (uint64_t)hr->hr_content_length;
	rq->rq_rp.rp_max_attempts = 1; /* never retried */
	if (extract_inputs_headers(rq->rq_ep, hr,
	        (const char *const *)cf->cf_routing_key_headers,
	        cf->cf_routing_key_headers_n, &rq->rq_in) == -1) {
		proxy_fail(rq, 503, "out_of_memory", "Out of memory", 0);
		return;
	}
	stats_add("smg_router_streamed_request_bodies_total", "", 1);
	rq->rq_di.di_in = &rq->rq_in;
	rq->rq_di.di_cb = proxy_decided;
	rq->rq_di.di_arg = rq;
	rq->rq_di.di_attempt = 0;
	decide_submit(&rq->rq_di);
}

/* Back-pressure: stop reading the client while the worker lags. */
static void
proxy_body_flow(struct req *rq, ssize_t buffered)
{
	if (rq->rq_conn == NULL)
		return;
	if (buffered > UPSTREAM_BODY_HIGH && !rq->rq_client_paused) {
		rq->rq_client_paused = true;
		conn_body_pause(rq->rq_conn);
	} else if (buffered <= UPSTREAM_BODY_HIGH && rq->rq_client_paused) {
		rq->rq_client_paused = false;
		conn_body_resume(rq->rq_conn);
	}
}

static void
proxy_body(void *arg, const char *data, size_t len, bool last)
{
	struct req *rq = arg;
	ssize_t left;
	size_t cap;
	char *nb;

	(void)last;
	if (len == 0)
		return;
	if (rq->rq_up != NULL) {
		if ((left = upstream_body_write(rq->rq_up, data, len)) == -1) {
			upstream_cancel(rq->rq_up);
			rq->rq_up = NULL;
			proxy_end_inflight(rq);
			proxy_fail(rq, 503, "out_of_memory", "Out of memory",
			    0);
			return;
		}
		proxy_body_flow(rq, left);
		return;
	}
	/* Not dispatched yet (or between attempts): keep it for later. */
	if (rq->rq_early_len + len > rq->rq_early_cap) {
		cap = rq->rq_early_cap < 16384 ? 16384 : rq->rq_early_cap;
		while (cap < rq->rq_early_len + len)
			cap *= 2;
		if ((nb = realloc(rq->rq_early, cap)) == NULL) {
			proxy_fail(rq, 503, "out_of_memory", "Out of memory",
			    0);
			return;
		}
		rq->rq_early = nb;
		rq->rq_early_cap = cap;
	}
	memcpy(rq->rq_early + rq->rq_early_len, data, len);
	rq->rq_early_len += len;
	proxy_body_flow(rq, (ssize_t)rq->rq_early_len);
}

static void
proxy_on_writable(void *arg)
{
	proxy_body_flow(arg, 0);
}

/* The client stopped sending the body: 408, no breaker sample. */
static void
proxy_body_stalled(void *arg)
{
	struct req *rq = arg;
	struct conn *c = rq->rq_conn;

	if (rq->rq_up != NULL) {
		upstream_cancel(rq->rq_up);
		rq->rq_up = NULL;
	}
	if (!rq->rq_head_sent) {
		proxy_fail(rq, 408, "request_body_stalled",
		    "The request body stopped arriving", 0);
		return;
	}
	proxy_count(rq, rq->rq_status, false);
	rq->rq_conn = NULL;
	conn_request_abort(c);
	proxy_free(rq);
}
