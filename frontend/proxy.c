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
#include "shared/url.h"

#define PROXY_PATH_MAX 2048

struct req {
	struct conn *rq_conn;
	const struct http_request *rq_hr;
	struct exchange *rq_ex;
	struct extract_inputs rq_in;
	char rq_id[EXTRACT_REQUEST_ID_MAX + 1];
	char *rq_body_alloc; /* re-serialised body (alias, DP rank) */
	bool rq_rank_sent; /* rq_body carries a data_parallel_rank we set */
	const char *rq_body;
	size_t rq_body_len;
	char rq_path[PROXY_PATH_MAX];
	bool rq_chunked;
	bool rq_paused;
	int rq_status; /* worker status of this attempt */
	/* A response not streamed to the client is read whole first
	 * (gateway.md §4 step 6): its head and body are held here. */
	bool rq_holding;
	struct upstream_header *rq_hh;
	size_t rq_nhh;
	char *rq_hbody;
	size_t rq_hlen;
	size_t rq_hcap;
	bool rq_stream_body; /* body streamed unparsed (gateway.md §6.4) */
	bool rq_client_paused; /* reading the streamed body is paused */
	uint64_t rq_body_total; /* its declared length */
	char *rq_early; /* body pieces that came before the dispatch */
	size_t rq_early_len;
	size_t rq_early_cap;
};

static void proxy_drained(void *);
static void proxy_routed(void *);
static void proxy_failed(void *, int, const char *, const char *, int);
static void proxy_on_head(void *, int, const struct upstream_header *, size_t);
static void proxy_on_body(void *, const char *, size_t);
static void proxy_on_done(void *, enum upstream_error);
static void proxy_hold_body(struct req *, const char *, size_t);
static void proxy_relay_held(struct req *);
static void proxy_free(void *);
static int proxy_resolve_alias(struct req *);
static size_t proxy_headers(struct req *, const struct decision *, bool, char *,
    size_t, struct upstream_header *);
static int proxy_resolved_model(struct req *, const struct decision *);
static const char *proxy_send_url(const struct decision *, char *);
static void proxy_start_stream(struct req *);
static void proxy_body(void *, const char *, size_t, bool);
static void proxy_body_stalled(void *);
static void proxy_on_writable(void *);
static void proxy_body_flow(struct req *, ssize_t);

static const struct conn_handler proxy_handler = {
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

static const struct exchange_ops proxy_ops = {
	.xo_routed = proxy_routed,
	.xo_failed = proxy_failed,
	.xo_reset = NULL,
};

static const unsigned proxy_legs[1] = { 0 }; /* SMG__LEG__LEG_SINGLE */
static const char *const proxy_leg_names[1] = { "regular" };

/* The request's state in its memory; NULL (answered 503) when out of it. */
static struct req *
proxy_new(struct conn *c, const struct http_request *hr,
    enum extract_endpoint ep, const char *request_id)
{
	struct req *rq;

	if ((rq = conn_alloc(c, sizeof(*rq))) == NULL ||
	    conn_on_end(c, proxy_free, rq) == -1 ||
	    (rq->rq_ex = exchange_new(c, &rq->rq_in, ep, "regular", 1,
	         proxy_legs, proxy_leg_names, &proxy_ops, rq)) == NULL) {
		conn_error(c, 503, "out_of_memory", "Out of memory", request_id,
		    0);
		return NULL;
	}
	rq->rq_conn = c;
	rq->rq_hr = hr;
	rq->rq_ex->ex_rx = reqctx_get(c, hr);
	snprintf(rq->rq_id, sizeof(rq->rq_id), "%s", request_id);
	/* The router bounds the target below PROXY_PATH_MAX. */
	snprintf(rq->rq_path, sizeof(rq->rq_path), "%s%s%s", hr->hr_path,
	    hr->hr_has_query ? "?" : "", hr->hr_query);
	conn_set_handler(c, &proxy_handler, rq);
	return rq;
}

/* Estimated prompt tokens of a request (live load): ids, else chars/4. */
static uint64_t
proxy_prompt_tokens(const struct extract_inputs *in, uint64_t body_len)
{
	if (in->ei_has_tokens)
		return in->ei_ntokens;
	if (in->ei_has_text)
		return (in->ei_size + 3) / 4;
	return (body_len + 3) / 4;
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

	if ((rq = proxy_new(c, hr, ep, request_id)) == NULL)
		return;
	if (conn_body_streaming(c)) {
		proxy_start_stream(rq);
		return;
	}
	if (ep == EXTRACT_EP_TRANSCRIPTIONS) {
		/* Multipart (a chunked upload): sent on unparsed. */
		if (extract_inputs_headers(ep, hr,
		        (const char *const *)cf->cf_routing_key_headers,
		        cf->cf_routing_key_headers_n, &rq->rq_in) == -1) {
			exchange_fail(rq->rq_ex, 503, "out_of_memory",
			    "Out of memory", 0);
			return;
		}
	} else if (extract_inputs(ep, hr->hr_body, hr->hr_body_len, hr,
	               (const char *const *)cf->cf_routing_key_headers,
	               cf->cf_routing_key_headers_n,
	               cf->cf_routing_key_override, &rq->rq_in, &status, &code,
	               msg, sizeof(msg)) == -1) {
		exchange_fail(rq->rq_ex, status, code, msg, 0);
		return;
	}
	if (cf->cf_enable_igw && ep == EXTRACT_EP_GENERATE &&
	    extract_model_missing(rq->rq_in.ei_model)) {
		exchange_fail(rq->rq_ex, 400, "missing_model",
		    EXTRACT_MISSING_MODEL_MSG, 0);
		return;
	}
	rq->rq_ex->ex_streaming = rq->rq_in.ei_stream;
	rq->rq_ex->ex_prompt_tokens =
	    proxy_prompt_tokens(&rq->rq_in, hr->hr_body_len);
	rq->rq_body = hr->hr_body;
	rq->rq_body_len = hr->hr_body_len;
	if (proxy_resolve_alias(rq) == -1) {
		exchange_fail(rq->rq_ex, 503, "out_of_memory", "Out of memory",
		    0);
		return;
	}
	if (exchange_admit(rq->rq_ex) == -1)
		return;
	exchange_route(rq->rq_ex);
}

void
proxy_fixed(struct conn *c, const struct http_request *hr,
    const struct shm_worker *w, unsigned slot, const char *request_id)
{
	struct req *rq;

	if ((rq = proxy_new(c, hr, EXTRACT_EP_GENERATE, request_id)) == NULL)
		return;
	rq->rq_body = hr->hr_body;
	rq->rq_body_len = hr->hr_body_len;
	exchange_fix(rq->rq_ex, slot, w);
	proxy_routed(rq);
}

/* The request's end hook (registered before the exchange's, so it runs
 * after it: upstream requests are gone by then). */
static void
proxy_free(void *arg)
{
	struct req *rq = arg;

	extract_inputs_free(&rq->rq_in);
	free(rq->rq_body_alloc);
	free(rq->rq_early);
	free(rq->rq_hh);
	free(rq->rq_hbody);
}

/* Drops what a failed attempt held. */
static void
proxy_drop_held(struct req *rq)
{
	conn_buffer_add(rq->rq_conn, -(int64_t)rq->rq_hlen);
	free(rq->rq_hh);
	rq->rq_hh = NULL;
	rq->rq_nhh = 0;
	rq->rq_hlen = 0;
	rq->rq_holding = false;
}

/* The request failed for good: the gateway's error answers it. */
static void
proxy_failed(void *arg, int status, const char *code, const char *msg,
    int retry_after)
{
	struct req *rq = arg;

	conn_error(rq->rq_conn, status, code, msg, rq->rq_id, retry_after);
}

static void
proxy_drained(void *arg)
{
	struct req *rq = arg;

	if (rq->rq_paused) {
		rq->rq_paused = false;
		exchange_resume(rq->rq_ex, 0);
	}
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

/*
 * The attempt's headers (hdr_upstream); a body goes as JSON, but for a
 * multipart upload (transcriptions), whose own content-type (boundary)
 * goes on.
 */
static size_t
proxy_headers(struct req *rq, const struct decision *d, bool body, char *auth,
    size_t alen, struct upstream_header *h)
{
	bool multipart = rq->rq_ex->ex_ep == EXTRACT_EP_TRANSCRIPTIONS;
	const struct http_header *ct;
	size_t n;

	n = hdr_upstream(rq->rq_hr, reqctx_find(rq->rq_hr),
	    rq->rq_ex->ex_legs[0].xl_traceparent, rq->rq_id, d->dc_api_key,
	    body && !multipart, auth, alen, h, HDR_UPSTREAM_MAX);
	if (multipart && n < HDR_UPSTREAM_MAX &&
	    (ct = http_request_header(rq->rq_hr, "content-type")) != NULL) {
		h[n].uh_name = "content-type";
		h[n].uh_name_len = strlen("content-type");
		h[n].uh_value = ct->hh_value;
		h[n].uh_value_len = ct->hh_value_len;
		n++;
	}
	return n;
}

/*
 * The attempt's body, as the worker must get it: the broker routed a
 * WorkerSpec alias (Decision.resolved_model), so "model" becomes the id
 * the worker knows, as for --model-alias; and a worker URL naming a
 * data-parallel rank ("<url>@<rank>") gets "data_parallel_rank": <rank>,
 * as SMG's prepare_request does. The rank leaves the parsed body after
 * printing (a client's own value is put back), so a retry on a worker
 * without rank sends the client's body. 0, or -1 when out of memory.
 */
static int
proxy_resolved_model(struct req *rq, const struct decision *d)
{
	struct extract_inputs *in = &rq->rq_in;
	cJSON *m, *own;
	char *s;
	int rank = url_rank(d->dc_url), rv;
	bool alias = d->dc_resolved[0] != '\0';

	if (rq->rq_stream_body || (!alias && rank < 0 && !rq->rq_rank_sent))
		return 0;
	/* A lean extraction kept no tree: the body is parsed now, for the
	 * rare request naming a worker's alias or a rank. */
	if (in->ei_json == NULL &&
	    (in->ei_json = cJSON_ParseWithLength(rq->rq_body,
	         rq->rq_body_len)) == NULL)
		return 0;
	if (!cJSON_IsObject(in->ei_json))
		return 0;
	m = cJSON_GetObjectItemCaseSensitive(in->ei_json, "model");
	if (alias &&
	    !(cJSON_IsString(m) &&
	        strcmp(m->valuestring, d->dc_resolved) == 0)) {
		if ((m = cJSON_CreateString(d->dc_resolved)) == NULL)
			return -1;
		if (!cJSON_ReplaceItemInObjectCaseSensitive(in->ei_json,
		        "model", m)) {
			cJSON_Delete(m);
			return -1;
		}
	} else if (rank < 0 && !rq->rq_rank_sent)
		return 0;
	own = rank >= 0 ? cJSON_DetachItemFromObjectCaseSensitive(in->ei_json,
	                      "data_parallel_rank")
	                : NULL;
	rv = rank >= 0 ? pd_rank_field(in->ei_json, "data_parallel_rank", rank)
	               : 0;
	s = rv == 0 ? cJSON_PrintUnformatted(in->ei_json) : NULL;
	if (rank >= 0) {
		cJSON_DeleteItemFromObjectCaseSensitive(in->ei_json,
		    "data_parallel_rank");
		if (own != NULL &&
		    !cJSON_AddItemToObject(in->ei_json, "data_parallel_rank",
		        own))
			cJSON_Delete(own);
	}
	if (s == NULL)
		return -1;
	rq->rq_rank_sent = rank >= 0;
	free(rq->rq_body_alloc);
	rq->rq_body_alloc = s;
	rq->rq_body = s;
	rq->rq_body_len = strlen(s);
	return 0;
}

/*
 * Where an attempt goes: the worker's URL, without the "@<rank>" of a
 * data-parallel rank (all ranks share their engine's address).
 */
static const char *
proxy_send_url(const struct decision *d, char *base)
{
	return url_rank_base(d->dc_url, base, SHM_URL_MAX) == 0 ? base
	                                                        : d->dc_url;
}

/* Every leg has its worker: send the attempt. */
static void
proxy_routed(void *arg)
{
	struct req *rq = arg;
	const struct decision *d = &rq->rq_ex->ex_legs[0].xl_d;
	struct upstream_header hdrs[HDR_UPSTREAM_MAX];
	char auth[SHM_KEY_MAX + 16], base[SHM_URL_MAX];
	struct upstream_req *up;
	ssize_t left = 0;
	size_t n;
	bool post = !rq->rq_ex->ex_fixed || rq->rq_hr->hr_method == HTTP_POST;

	rq->rq_status = 0;
	if (proxy_resolved_model(rq, d) == -1) {
		exchange_next(rq->rq_ex, 0, EXCHANGE_NO_MEMORY, 0, NULL);
		return;
	}
	if (rq->rq_stream_body) {
		n = proxy_headers(rq, d, true, auth, sizeof(auth), hdrs);
		up = upstream_request_stream(fe->fe_up, proxy_send_url(d, base),
		    "POST", rq->rq_path, hdrs, n, rq->rq_body_total, &proxy_cbs,
		    rq);
		if (up != NULL && rq->rq_early_len > 0) {
			left = upstream_body_write(up, rq->rq_early,
			    rq->rq_early_len);
			free(rq->rq_early);
			rq->rq_early = NULL;
			rq->rq_early_len = rq->rq_early_cap = 0;
			if (left == -1) {
				upstream_cancel(up);
				up = NULL;
			}
		}
	} else {
		n = proxy_headers(rq, d, post && rq->rq_body_len > 0, auth,
		    sizeof(auth), hdrs);
		up = upstream_request(fe->fe_up, proxy_send_url(d, base),
		    rq->rq_ex->ex_fixed ? rq->rq_hr->hr_method_str : "POST",
		    rq->rq_path, hdrs, n, rq->rq_body, rq->rq_body_len,
		    &proxy_cbs, rq);
	}
	if (exchange_dispatch(rq->rq_ex, 0, up) == -1)
		return;
	if (rq->rq_stream_body)
		proxy_body_flow(rq, left);
}

static void
proxy_on_head(void *arg, int status, const struct upstream_header *h, size_t n)
{
	struct req *rq = arg;
	struct exchange *ex = rq->rq_ex;
	struct conn *c = rq->rq_conn;
	const struct upstream_header *cl;
	bool keep_length;

	rq->rq_status = status;
	if (exchange_can_retry(ex, status)) {
		/* Not relayed: drop this response and try again. */
		exchange_next(ex, 0, EXCHANGE_WORKER_STATUS, status, NULL);
		return;
	}
	if (!ex->ex_streaming && !rq->rq_stream_body) {
		/* Read whole, then relayed: a worker failing mid-body is a
		 * failed attempt, never a truncated 200. */
		proxy_drop_held(rq);
		if ((rq->rq_hh = hdr_copy(h, n)) == NULL) {
			exchange_next(ex, 0, EXCHANGE_NO_MEMORY, 0, NULL);
			return;
		}
		rq->rq_nhh = n;
		rq->rq_holding = true;
		return;
	}
	cl = hdr_find(h, n, "content-length");
	keep_length = cl != NULL;
	rq->rq_chunked = !keep_length && conn_http_minor(c) >= 1;
	if (!keep_length && !rq->rq_chunked)
		conn_set_close(c); /* HTTP/1.0: the close ends the body */
	conn_relay_head(c, status, h, n, keep_length,
	    ex->ex_streaming && status < 300, rq->rq_chunked, rq->rq_id,
	    ex->ex_fixed ? NULL : ex->ex_legs[0].xl_d.dc_url);
	ex->ex_relayed = true;
	/* Goes out with the first body bytes (or the whole body). */
	conn_flush_later(c);
}

static void
proxy_on_body(void *arg, const char *data, size_t len)
{
	struct req *rq = arg;
	struct conn *c = rq->rq_conn;
	struct http_out *o = conn_out(c);
	struct upstream_req *up = rq->rq_ex->ex_legs[0].xl_up;

	if (len == 0)
		return;
	exchange_first_byte(rq->rq_ex, 0);
	exchange_progress(rq->rq_ex, 0);
	if (rq->rq_holding) {
		proxy_hold_body(rq, data, len);
		return;
	}
	if (rq->rq_chunked)
		http_out_chunk(o, data, len);
	else
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
	if (!rq->rq_paused && conn_pending(c) > FE_OUT_HIGH && up != NULL) {
		rq->rq_paused = true;
		exchange_pause(rq->rq_ex, 0, true);
	}
}

/* A held body grows; past --max-payload-size the attempt fails (502). */
static void
proxy_hold_body(struct req *rq, const char *data, size_t len)
{
	size_t cap;
	char *nb;

	if ((uint64_t)rq->rq_hlen + len > fe->fe_cf->cf_max_payload_size) {
		proxy_drop_held(rq);
		exchange_next(rq->rq_ex, 0, EXCHANGE_TOO_LARGE, 0, NULL);
		return;
	}
	/* Held bytes count against the frontend's memory cap. */
	if (conn_buffer_add(rq->rq_conn, (int64_t)len) == -1) {
		proxy_drop_held(rq);
		exchange_next(rq->rq_ex, 0, EXCHANGE_NO_MEMORY, 0, NULL);
		return;
	}
	if (rq->rq_hlen + len > rq->rq_hcap) {
		cap = rq->rq_hcap < 16384 ? 16384 : rq->rq_hcap;
		while (cap < rq->rq_hlen + len)
			cap *= 2;
		if ((nb = realloc(rq->rq_hbody, cap)) == NULL) {
			proxy_drop_held(rq);
			exchange_next(rq->rq_ex, 0, EXCHANGE_NO_MEMORY, 0,
			    NULL);
			return;
		}
		rq->rq_hbody = nb;
		rq->rq_hcap = cap;
	}
	memcpy(rq->rq_hbody + rq->rq_hlen, data, len);
	rq->rq_hlen += len;
}

/* The whole response is here: head (with its real length) and body. */
static void
proxy_relay_held(struct req *rq)
{
	struct exchange *ex = rq->rq_ex;
	struct conn *c = rq->rq_conn;
	char clen[24];
	size_t n;

	n = hdr_set_length(rq->rq_hh, rq->rq_nhh, clen, sizeof(clen),
	    rq->rq_hlen);
	conn_relay_head(c, rq->rq_status, rq->rq_hh, n, true, false, false,
	    rq->rq_id, ex->ex_fixed ? NULL : ex->ex_legs[0].xl_d.dc_url);
	ex->ex_relayed = true;
	if (rq->rq_hlen > 0)
		http_out_append(conn_out(c), rq->rq_hbody, rq->rq_hlen);
	exchange_finish(ex, rq->rq_status, true);
	conn_request_done(c);
}

static void
proxy_on_done(void *arg, enum upstream_error err)
{
	struct req *rq = arg;
	struct exchange *ex = rq->rq_ex;
	struct conn *c = rq->rq_conn;

	ex->ex_legs[0].xl_up = NULL; /* the upstream request is over */
	if (rq->rq_holding) {
		if (err != UPSTREAM_OK) {
			proxy_drop_held(rq);
			exchange_next(ex, 0, exchange_failure_of(err), 0, NULL);
			return;
		}
		proxy_relay_held(rq);
		return;
	}
	if (ex->ex_relayed) {
		exchange_finish(ex, rq->rq_status, err == UPSTREAM_OK);
		if (err == UPSTREAM_OK) {
			if (rq->rq_chunked)
				http_out_append(conn_out(c), "0\r\n\r\n", 5);
			conn_request_done(c);
		} else {
			/* Cut mid-body: the client sees the connection end. */
			conn_flush(c);
			conn_request_abort(c);
		}
		return;
	}
	exchange_next(ex, 0, exchange_failure_of(err), 0, NULL);
}

/* ------------------------------------------------- streamed bodies */

bool
proxy_stream_wanted(const struct http_request *hr)
{
	const struct config *cf = fe->fe_cf;
	struct extract_inputs in;
	enum extract_endpoint ep;
	bool hinted;

	/* Multipart audio is relayed as it comes, whatever its size. */
	if (hr->hr_method == HTTP_POST && !hr->hr_chunked &&
	    hr->hr_content_length >= 0 &&
	    extract_route(hr->hr_path, &ep) == 0 &&
	    ep == EXTRACT_EP_TRANSCRIPTIONS)
		return !cf->cf_pd_disaggregation && !cf->cf_epd_disaggregation;
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
	if (!policy_info_of(cf->cf_policy)->pi_needs_text)
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
	rq->rq_ex->ex_rp.rp_max_attempts = 1; /* never retried */
	rq->rq_ex->ex_prompt_tokens = (rq->rq_body_total + 3) / 4;
	if (extract_inputs_headers(rq->rq_ex->ex_ep, hr,
	        (const char *const *)cf->cf_routing_key_headers,
	        cf->cf_routing_key_headers_n, &rq->rq_in) == -1) {
		exchange_fail(rq->rq_ex, 503, "out_of_memory", "Out of memory",
		    0);
		return;
	}
	stats_add("smg_router_streamed_request_bodies_total", "", 1);
	if (exchange_admit(rq->rq_ex) == -1)
		return;
	exchange_route(rq->rq_ex);
}

/* A streamed body piece could not be kept: the request cannot go on. */
static void
proxy_body_lost(struct req *rq)
{
	struct exchange *ex = rq->rq_ex;

	if (!ex->ex_relayed) {
		exchange_next(ex, 0, EXCHANGE_NO_MEMORY, 0, NULL);
		return;
	}
	exchange_finish(ex, rq->rq_status, false);
	conn_request_abort(rq->rq_conn);
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
	struct upstream_req *up = rq->rq_ex->ex_legs[0].xl_up;
	ssize_t left;
	size_t cap;
	char *nb;

	(void)last;
	if (len == 0)
		return;
	if (up != NULL) {
		if ((left = upstream_body_write(up, data, len)) == -1) {
			proxy_body_lost(rq);
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
			proxy_body_lost(rq);
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
	struct exchange *ex = rq->rq_ex;

	if (!ex->ex_relayed) {
		exchange_fail(ex, 408, "request_body_stalled",
		    "The request body stopped arriving", 0);
		return;
	}
	exchange_finish(ex, rq->rq_status, false);
	conn_request_abort(rq->rq_conn);
}
