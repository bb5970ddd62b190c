/*
 * fanout.c: the routes that ask every worker at once (gateway.md §3.2,
 * §3.3): POST /flush_cache, GET /get_loads (with the Prometheus fallback
 * of gateway.md §9.2 for workers without /v1/loads), GET /engine_metrics
 * (the workers' /metrics merged, each sample labelled worker_addr) and
 * POST /start_profile, /stop_profile. One upstream request per worker,
 * answered together once every part ended. Workers registered as
 * grpc:// or grpcs:// get their flush as the engine's FlushCache RPC
 * (workers.md §4.1) over shared/grpc.c, on a channel of their own.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "frontend/frontend.h"
#include "sglang_scheduler.pb-c.h"
#include "shared/grpc.h"
#include "shared/loads.h"
#include "shared/log.h"
#include "shared/url.h"
#include "shared/promerge.h"
#include "shared/promload.h"
#include "shared/tls.h"

#define FANOUT_LOADS_PATH     "/v1/loads?include=core,disagg,queues,memory"
#define FANOUT_LOADS_TIMEOUT  5.0 /* per fetch, gateway.md §9.2 */
#define FANOUT_FLUSH_RPC_SECS 30.0

/* The services serving FlushCache (workers.md §4.1), tried in turn. */
static const char *const fanout_flush_paths[] = {
	"/sglang.grpc.scheduler.SglangScheduler/FlushCache",
	"/tokenspeed.grpc.scheduler.TokenSpeedScheduler/FlushCache",
};
#define FANOUT_NFLUSH_PATHS                                                    \
	(sizeof(fanout_flush_paths) / sizeof(fanout_flush_paths[0]))

struct fanout;

struct fanout_part {
	struct fanout *fp_fo;
	char fp_url[SHM_URL_MAX];
	char fp_auth[SHM_KEY_MAX + 16]; /* "Bearer <worker key>" or "" */
	unsigned fp_slot;
	uint32_t fp_generation;
	struct upstream_req *fp_up;
	ev_timer fp_timer; /* /get_loads: per-fetch deadline */
	bool fp_metrics; /* /get_loads: the Prometheus fallback */
	int fp_status;
	enum upstream_error fp_err;
	char *fp_body;
	size_t fp_len;
	size_t fp_cap;
	bool fp_overflow; /* body over FE_FANOUT_BODY_MAX: unusable */
	cJSON *fp_report; /* /get_loads: the worker's load report */
	/* grpc:// workers: FlushCache */
	bool fp_grpc;
	struct grpc_channel *fp_ch;
	struct grpc_call *fp_call;
	unsigned fp_path; /* index into fanout_flush_paths */
	char fp_grpc_err[GRPC_MESSAGE_MAX + 32]; /* "" when it succeeded */
};

struct fanout {
	struct conn *fo_conn;
	const struct http_request *fo_hr;
	char fo_id[EXTRACT_REQUEST_ID_MAX + 1];
	enum fanout_kind fo_kind;
	char *fo_body; /* /start_profile: the options sent on, or NULL */
	bool fo_starting; /* parts still being started */
	size_t fo_n;
	size_t fo_left;
	struct fanout_part fo_parts[];
};

static void fanout_send(struct fanout_part *);
static void fanout_head(void *, int, const struct upstream_header *, size_t);
static void fanout_body(void *, const char *, size_t);
static void fanout_done(void *, enum upstream_error);
static void fanout_timeout_cb(struct ev_loop *, ev_timer *, int);
static bool fanout_loads_answered(struct fanout_part *);
static cJSON *fanout_prom_report(const char *, size_t);
static void fanout_part_done(struct fanout_part *, enum upstream_error);
static void fanout_finish(struct fanout *);
static void fanout_free(void *);
static void fanout_grpc_send(struct fanout_part *);
static void fanout_grpc_msg_cb(void *, const uint8_t *, size_t);
static void fanout_grpc_close_cb(void *, const struct grpc_status *);
static bool fanout_wanted(enum fanout_kind, const struct shm_worker *,
    const char *, const struct shm_worker *, unsigned);
static int fanout_profile_body(const struct http_request *, char **, char *,
    size_t);
static void fanout_profile_finish(struct fanout *);
static void fanout_metrics_finish(struct fanout *);

/*
 * Workers whose /v1/loads route is absent (gateway.md §9.2), by slot:
 * generation + 1 of the worker that lacked it, so a worker that replaces
 * it in the slot is probed again.
 */
static uint32_t fanout_loads_absent[SHM_MAX_WORKERS];

static const struct conn_handler fanout_handler = {
	.ch_drained = NULL,
};

static const struct upstream_cbs fanout_cbs = {
	.on_head = fanout_head,
	.on_body = fanout_body,
	.on_done = fanout_done,
};

void
fanout_start(struct conn *c, const struct http_request *hr,
    enum fanout_kind kind, const char *id)
{
	static struct shm_worker ws[SHM_MAX_WORKERS];
	static unsigned slots[SHM_MAX_WORKERS];
	struct fanout *fo;
	unsigned slot, n = 0, i;
	char target[SHM_URL_MAX], *body = NULL;

	target[0] = '\0';
	if (kind == FANOUT_START_PROFILE || kind == FANOUT_STOP_PROFILE) {
		if (fanout_profile_body(hr,
		        kind == FANOUT_START_PROFILE ? &body : NULL, target,
		        sizeof(target)) == -1) {
			conn_error(c, 400, "invalid_request",
			    "Body must be a JSON object of profile options "
			    "(url: a string)",
			    id, 0);
			return;
		}
	}
	for (slot = 0; slot < SHM_MAX_WORKERS; slot++)
		if (shm_worker_read(fe->fe_shm, slot, &ws[n]) == 0 &&
		    (ws[n].sw_mode ==
		            SMG__CONNECTION_MODE__CONNECTION_MODE_HTTP ||
		        (kind == FANOUT_FLUSH &&
		            ws[n].sw_mode ==
		                SMG__CONNECTION_MODE__CONNECTION_MODE_GRPC)) &&
		    fanout_wanted(kind, &ws[n], target, ws, n))
			slots[n++] = slot;
	if ((fo = conn_alloc(c, sizeof(*fo) + n * sizeof(fo->fo_parts[0]))) ==
	        NULL ||
	    conn_on_end(c, fanout_free, fo) == -1) {
		free(body);
		conn_error(c, 503, "out_of_memory", "Out of memory", id, 0);
		return;
	}
	fo->fo_body = body;
	fo->fo_conn = c;
	fo->fo_hr = hr;
	fo->fo_kind = kind;
	fo->fo_n = n;
	fo->fo_left = n;
	fo->fo_starting = true;
	snprintf(fo->fo_id, sizeof(fo->fo_id), "%s", id);
	conn_set_handler(c, &fanout_handler, fo);
	for (i = 0; i < n; i++) {
		struct fanout_part *p = &fo->fo_parts[i];

		p->fp_fo = fo;
		p->fp_slot = slots[i];
		p->fp_generation = ws[i].sw_generation;
		p->fp_grpc =
		    ws[i].sw_mode == SMG__CONNECTION_MODE__CONNECTION_MODE_GRPC;
		/* Sent to the engine: a rank's base URL. */
		if (url_rank_base(ws[i].sw_url, p->fp_url, sizeof(p->fp_url)) ==
		    -1)
			snprintf(p->fp_url, sizeof(p->fp_url), "%s",
			    ws[i].sw_url);
		if (ws[i].sw_api_key[0] != '\0')
			snprintf(p->fp_auth, sizeof(p->fp_auth), "Bearer %s",
			    ws[i].sw_api_key);
		ev_init(&p->fp_timer, fanout_timeout_cb);
		p->fp_timer.data = p;
		/* A worker known to lack /v1/loads goes to /metrics. */
		p->fp_metrics = kind == FANOUT_LOADS &&
		    fanout_loads_absent[p->fp_slot] == p->fp_generation + 1;
		fanout_send(p);
	}
	fo->fo_starting = false;
	if (fo->fo_left == 0)
		fanout_finish(fo);
}

/*
 * Whether w (not yet in seen[0..n)) gets a part: each engine once, so
 * the data-parallel ranks of one ("<url>@<rank>" workers) share their base
 * URL's part; a profile with a url only that worker.
 */
static bool
fanout_wanted(enum fanout_kind kind, const struct shm_worker *w,
    const char *target, const struct shm_worker *seen, unsigned n)
{
	char base[SHM_URL_MAX], other[SHM_URL_MAX];
	unsigned i;

	(void)kind;
	if (target[0] != '\0')
		return strcmp(w->sw_url, target) == 0;
	if (url_rank_base(w->sw_url, base, sizeof(base)) == -1)
		return true;
	for (i = 0; i < n; i++)
		if (url_rank_base(seen[i].sw_url, other, sizeof(other)) == 0 &&
		    strcmp(base, other) == 0)
			return false;
	return true;
}

/*
 * A profile request's body: an optional JSON object whose "url" names one
 * worker (into target, "" for all); for /start_profile the other fields
 * are the options sent on (*out, malloc'ed, NULL when none). 0, or -1 on
 * a body that is no such object.
 */
static int
fanout_profile_body(const struct http_request *hr, char **out, char *target,
    size_t tlen)
{
	cJSON *j, *u;

	if (out != NULL)
		*out = NULL;
	if (hr->hr_body_len == 0)
		return 0;
	if ((j = cJSON_ParseWithLength(hr->hr_body, hr->hr_body_len)) == NULL ||
	    !cJSON_IsObject(j)) {
		cJSON_Delete(j);
		return -1;
	}
	u = cJSON_GetObjectItemCaseSensitive(j, "url");
	if (u != NULL && !cJSON_IsNull(u)) {
		if (!cJSON_IsString(u) || strlen(u->valuestring) >= tlen) {
			cJSON_Delete(j);
			return -1;
		}
		snprintf(target, tlen, "%s", u->valuestring);
		/* Registered URLs have no trailing '/'. */
		while (strlen(target) > 1 && target[strlen(target) - 1] == '/')
			target[strlen(target) - 1] = '\0';
	}
	cJSON_DeleteItemFromObjectCaseSensitive(j, "url");
	if (out != NULL && (*out = cJSON_PrintUnformatted(j)) == NULL) {
		cJSON_Delete(j);
		return -1;
	}
	cJSON_Delete(j);
	return 0;
}

/* Starts the part's current request; a failure to start ends the part. */
static void
fanout_send(struct fanout_part *p)
{
	struct upstream_header h[2];
	const char *path, *method = "POST", *body = p->fp_fo->fo_body;
	size_t nh = 0;

	p->fp_status = 0;
	p->fp_len = 0;
	p->fp_overflow = false;
	if (p->fp_grpc) {
		fanout_grpc_send(p);
		return;
	}
	switch (p->fp_fo->fo_kind) {
	case FANOUT_FLUSH:
		path = "/flush_cache";
		break;
	case FANOUT_LOADS:
		path = p->fp_metrics ? "/metrics" : FANOUT_LOADS_PATH;
		method = "GET";
		break;
	case FANOUT_ENGINE_METRICS:
		path = "/metrics";
		method = "GET";
		break;
	case FANOUT_START_PROFILE:
		path = "/start_profile";
		break;
	default:
		path = "/stop_profile";
		break;
	}
	if (p->fp_auth[0] != '\0') {
		h[nh].uh_name = "authorization";
		h[nh].uh_name_len = 13;
		h[nh].uh_value = p->fp_auth;
		h[nh].uh_value_len = strlen(p->fp_auth);
		nh++;
	}
	if (body != NULL) {
		h[nh].uh_name = "content-type";
		h[nh].uh_name_len = 12;
		h[nh].uh_value = "application/json";
		h[nh].uh_value_len = 16;
		nh++;
	}
	p->fp_up = upstream_request(fe->fe_up, p->fp_url, method, path, h, nh,
	    body, body != NULL ? strlen(body) : 0, &fanout_cbs, p);
	if (p->fp_up == NULL) {
		fanout_part_done(p, UPSTREAM_CONNECT_FAILED);
		return;
	}
	if (p->fp_fo->fo_kind == FANOUT_LOADS) {
		ev_timer_set(&p->fp_timer, FANOUT_LOADS_TIMEOUT, 0.);
		ev_timer_start(fe->fe_loop, &p->fp_timer);
	}
}

static void
fanout_head(void *arg, int status, const struct upstream_header *h, size_t n)
{
	struct fanout_part *p = arg;

	(void)h;
	(void)n;
	p->fp_status = status;
}

static void
fanout_body(void *arg, const char *data, size_t len)
{
	struct fanout_part *p = arg;
	size_t cap;
	char *nb;

	if (p->fp_overflow)
		return;
	if (p->fp_len + len > FE_FANOUT_BODY_MAX) {
		p->fp_overflow = true;
		return;
	}
	if (p->fp_len + len + 1 > p->fp_cap) {
		cap = (p->fp_len + len + 1) * 2;
		if ((nb = realloc(p->fp_body, cap)) == NULL) {
			p->fp_overflow = true;
			return;
		}
		p->fp_body = nb;
		p->fp_cap = cap;
	}
	memcpy(p->fp_body + p->fp_len, data, len);
	p->fp_len += len;
	p->fp_body[p->fp_len] = '\0';
}

static void
fanout_done(void *arg, enum upstream_error err)
{
	struct fanout_part *p = arg;

	p->fp_up = NULL;
	fanout_part_done(p, err);
}

static void
fanout_timeout_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct fanout_part *p = w->data;

	(void)loop;
	(void)revents;
	if (p->fp_up != NULL) {
		upstream_cancel(p->fp_up);
		p->fp_up = NULL;
	}
	fanout_part_done(p, UPSTREAM_TIMEOUT);
}

/*
 * gateway.md §9.2 for the /v1/loads answer: true with p->fp_report set
 * (or left NULL for an empty "loads") when the worker answered with a load
 * response; false when the Prometheus fallback applies, after noting a
 * route that is absent (404, 405, 501, or 2xx that is no load response).
 */
static bool
fanout_loads_answered(struct fanout_part *p)
{
	cJSON *rep;

	switch (loads_classify(p->fp_err == UPSTREAM_OK ? p->fp_status : 0,
	    !p->fp_overflow, p->fp_body, p->fp_len, &rep)) {
	case LOADS_REPORT:
		p->fp_report = rep;
		return true;
	case LOADS_EMPTY:
		return true;
	case LOADS_ABSENT:
		fanout_loads_absent[p->fp_slot] = p->fp_generation + 1;
		return false;
	case LOADS_FAILED:
		break;
	}
	return false;
}

/*
 * The gateway.md §9.3 shape of a /metrics fallback report: one synthetic
 * rank without absolute token counts, and no utilization for vLLM, which
 * exports none (workers.md §3). NULL when there is no report or memory.
 */
static cJSON *
fanout_prom_report(const char *text, size_t len)
{
	struct promload_report pr;
	cJSON *rep, *loads, *rank;

	if (promload_parse(text, len, NULL, &pr) == -1)
		return NULL;
	if ((rep = cJSON_CreateObject()) == NULL)
		return NULL;
	cJSON_AddNumberToObject(rep, "dp_rank_count", 1);
	if ((loads = cJSON_AddArrayToObject(rep, "loads")) == NULL ||
	    (rank = cJSON_CreateObject()) == NULL) {
		cJSON_Delete(rep);
		return NULL;
	}
	cJSON_AddItemToArray(loads, rank);
	cJSON_AddNumberToObject(rank, "dp_rank", 0);
	cJSON_AddNumberToObject(rank, "num_running_reqs",
	    (double)pr.pr_num_running_reqs);
	cJSON_AddNumberToObject(rank, "num_waiting_reqs",
	    (double)pr.pr_num_waiting_reqs);
	cJSON_AddNumberToObject(rank, "token_usage", pr.pr_token_usage);
	cJSON_AddNumberToObject(rank, "gen_throughput", pr.pr_gen_throughput);
	cJSON_AddNumberToObject(rank, "cache_hit_rate", pr.pr_cache_hit_rate);
	if (pr.pr_engine == PROMLOAD_SGLANG)
		cJSON_AddNumberToObject(rank, "utilization", pr.pr_utilization);
	return rep;
}

/* The part's current request ended with err (its handle is gone). */
static void
fanout_part_done(struct fanout_part *p, enum upstream_error err)
{
	struct fanout *fo = p->fp_fo;

	ev_timer_stop(fe->fe_loop, &p->fp_timer);
	p->fp_err = err;
	if (fo->fo_kind == FANOUT_LOADS && !p->fp_metrics) {
		if (!fanout_loads_answered(p)) {
			p->fp_metrics = true;
			fanout_send(p);
			return;
		}
	} else if (fo->fo_kind == FANOUT_LOADS && err == UPSTREAM_OK &&
	    !p->fp_overflow && p->fp_status >= 200 && p->fp_status < 300 &&
	    p->fp_body != NULL)
		p->fp_report = fanout_prom_report(p->fp_body, p->fp_len);
	if (--fo->fo_left == 0 && !fo->fo_starting)
		fanout_finish(fo);
}

/* The request's end hook: what the parts still hold. */
static void
fanout_free(void *arg)
{
	struct fanout *fo = arg;
	size_t i;

	free(fo->fo_body);
	fo->fo_body = NULL;
	for (i = 0; i < fo->fo_n; i++) {
		struct fanout_part *p = &fo->fo_parts[i];

		ev_timer_stop(fe->fe_loop, &p->fp_timer);
		if (p->fp_up != NULL)
			upstream_cancel(p->fp_up);
		p->fp_up = NULL;
		free(p->fp_body);
		p->fp_body = NULL;
		cJSON_Delete(p->fp_report);
		p->fp_report = NULL;
		grpc_call_cancel(p->fp_call);
		p->fp_call = NULL;
		grpc_channel_free(p->fp_ch);
		p->fp_ch = NULL;
	}
}

/* The client context for grpcs:// flushes: the workers' CA flags, ALPN h2.
 * Made on first use, kept for the process. */
static struct tls_ctx *
fanout_grpc_tls(void)
{
	static const char *alpn[] = { "h2", NULL };
	static struct tls_ctx *ctx;
	static bool tried;
	const struct config *cf = fe->fe_cf;
	const char **cas;
	size_t i;

	if (tried)
		return ctx;
	tried = true;
	if ((cas = calloc(cf->cf_ca_cert_paths_n + 1, sizeof(*cas))) == NULL)
		return NULL;
	for (i = 0; i < cf->cf_ca_cert_paths_n; i++)
		cas[i] = cf->cf_ca_cert_paths[i];
	ctx = tls_ctx_new_client(cas, cf->cf_client_cert_path,
	    cf->cf_client_key_path);
	free(cas);
	if (ctx != NULL && tls_ctx_set_alpn(ctx, alpn) == -1) {
		tls_ctx_free(ctx);
		ctx = NULL;
	}
	return ctx;
}

/* FlushCache on the next service that may serve it. */
static void
fanout_grpc_send(struct fanout_part *p)
{
	Smg__Grpc__Common__FlushCacheRequest req =
	    SMG__GRPC__COMMON__FLUSH_CACHE_REQUEST__INIT;
	uint8_t buf[16];
	size_t len;

	if (p->fp_ch == NULL &&
	    (p->fp_ch = grpc_channel_new(fe->fe_loop, p->fp_url,
	         strncmp(p->fp_url, "grpcs://", 8) == 0 ? fanout_grpc_tls()
	                                                : NULL,
	         0)) == NULL) {
		snprintf(p->fp_grpc_err, sizeof(p->fp_grpc_err),
		    "bad gRPC URL");
		fanout_part_done(p, UPSTREAM_OK);
		return;
	}
	len = protobuf_c_message_pack(&req.base, buf);
	p->fp_grpc_err[0] = '\0';
	p->fp_call = grpc_call_start(p->fp_ch, fanout_flush_paths[p->fp_path],
	    p->fp_auth[0] != '\0' ? p->fp_auth + 7 : "", buf, len,
	    FANOUT_FLUSH_RPC_SECS, fanout_grpc_msg_cb, fanout_grpc_close_cb, p);
	if (p->fp_call == NULL) {
		snprintf(p->fp_grpc_err, sizeof(p->fp_grpc_err),
		    "out of memory");
		fanout_part_done(p, UPSTREAM_OK);
	}
}

static void
fanout_grpc_msg_cb(void *arg, const uint8_t *msg, size_t len)
{
	struct fanout_part *p = arg;
	Smg__Grpc__Common__FlushCacheResponse *r;

	if ((r = smg__grpc__common__flush_cache_response__unpack(NULL, len,
	         msg)) == NULL) {
		p->fp_status = 502;
		snprintf(p->fp_grpc_err, sizeof(p->fp_grpc_err),
		    "FlushCacheResponse does not decode");
		return;
	}
	p->fp_status = r->has_success && r->success ? 200 : 500;
	if (p->fp_status != 200)
		snprintf(p->fp_grpc_err, sizeof(p->fp_grpc_err),
		    "FlushCache failed: %s",
		    r->message != NULL ? r->message : "");
	smg__grpc__common__flush_cache_response__free_unpacked(r, NULL);
}

static void
fanout_grpc_close_cb(void *arg, const struct grpc_status *st)
{
	struct fanout_part *p = arg;

	p->fp_call = NULL;
	if (st->gs_code == GRPC_UNIMPLEMENTED &&
	    ++p->fp_path < FANOUT_NFLUSH_PATHS) {
		fanout_grpc_send(p);
		return;
	}
	if (st->gs_code != GRPC_OK) {
		p->fp_status = 0;
		snprintf(p->fp_grpc_err, sizeof(p->fp_grpc_err), "%s: %s",
		    grpc_code_name(st->gs_code), st->gs_message);
	} else if (p->fp_status == 0) {
		p->fp_status = 502;
		snprintf(p->fp_grpc_err, sizeof(p->fp_grpc_err),
		    "no FlushCacheResponse");
	}
	if (p->fp_grpc_err[0] != '\0')
		log_info("%s: %s: FlushCache: %s", __func__, p->fp_url,
		    p->fp_grpc_err);
	fanout_part_done(p, UPSTREAM_OK);
}

static const char *
fanout_error(const struct fanout_part *p)
{
	switch (p->fp_err) {
	case UPSTREAM_OK:
		return "bad status";
	case UPSTREAM_CONNECT_FAILED:
		return "connection failed";
	case UPSTREAM_TIMEOUT:
		return "timeout";
	default:
		return "request failed";
	}
}

/*
 * gateway.md §9.4 entry of one worker: load = the sum of num_used_tokens
 * over ranks when some rank has max_total_num_tokens > 0, else -1;
 * details = the report, absent when there is none. Takes p's report.
 */
static cJSON *
fanout_load_entry(struct fanout_part *p)
{
	cJSON *e = cJSON_CreateObject();

	cJSON_AddStringToObject(e, "worker", p->fp_url);
	if (p->fp_report == NULL) {
		cJSON_AddNumberToObject(e, "load", -1);
		return e;
	}
	cJSON_AddNumberToObject(e, "load", loads_used_tokens(p->fp_report));
	cJSON_AddItemToObject(e, "details", p->fp_report);
	p->fp_report = NULL;
	return e;
}

static void
fanout_finish(struct fanout *fo)
{
	struct conn *c = fo->fo_conn;
	cJSON *j, *arr, *f;
	size_t i, nok = 0, ngrpc = 0;
	int status = 200;

	if (fo->fo_kind == FANOUT_ENGINE_METRICS) {
		fanout_metrics_finish(fo);
		return;
	}
	if (fo->fo_kind == FANOUT_START_PROFILE ||
	    fo->fo_kind == FANOUT_STOP_PROFILE) {
		fanout_profile_finish(fo);
		return;
	}
	j = cJSON_CreateObject();
	if (fo->fo_kind == FANOUT_LOADS) {
		arr = cJSON_AddArrayToObject(j, "workers");
		for (i = 0; i < fo->fo_n; i++)
			cJSON_AddItemToArray(arr,
			    fanout_load_entry(&fo->fo_parts[i]));
	} else {
		arr = cJSON_CreateArray();
		for (i = 0; i < fo->fo_n; i++) {
			const struct fanout_part *p = &fo->fo_parts[i];
			char err[64];

			if (p->fp_err == UPSTREAM_OK && p->fp_status >= 200 &&
			    p->fp_status < 300) {
				nok++;
				continue;
			}
			f = cJSON_CreateObject();
			cJSON_AddStringToObject(f, "worker", p->fp_url);
			if (p->fp_grpc)
				cJSON_AddStringToObject(f, "error",
				    p->fp_grpc_err[0] ? p->fp_grpc_err
				                      : "FlushCache failed");
			else if (p->fp_err == UPSTREAM_OK)
				snprintf(err, sizeof(err), "HTTP %d",
				    p->fp_status);
			else
				snprintf(err, sizeof(err), "%s",
				    fanout_error(p));
			if (!p->fp_grpc)
				cJSON_AddStringToObject(f, "error", err);
			cJSON_AddItemToArray(arr, f);
		}
		if (nok == fo->fo_n) {
			cJSON_Delete(arr);
			cJSON_AddStringToObject(j, "status", "success");
			cJSON_AddStringToObject(j, "message",
			    "Cache flushed on all workers");
		} else {
			status = 206;
			cJSON_AddStringToObject(j, "status", "partial_success");
			cJSON_AddStringToObject(j, "message",
			    "Cache flush failed on some workers");
			cJSON_AddItemToObject(j, "failed", arr);
		}
		cJSON_AddNumberToObject(j, "workers_flushed", (double)nok);
		for (i = 0; i < fo->fo_n; i++)
			ngrpc += fo->fo_parts[i].fp_grpc;
		cJSON_AddNumberToObject(j, "total_http_workers",
		    (double)(fo->fo_n - ngrpc));
		if (ngrpc > 0)
			cJSON_AddNumberToObject(j, "total_grpc_workers",
			    (double)ngrpc);
	}
	fo->fo_conn = NULL;
	conn_json(c, status, j, fo->fo_id);
}

/* SMG's ProfileResult: 200 success, 206 partial_success, 404 no worker. */
static void
fanout_profile_finish(struct fanout *fo)
{
	struct conn *c = fo->fo_conn;
	bool start = fo->fo_kind == FANOUT_START_PROFILE;
	cJSON *j = cJSON_CreateObject(), *ok, *failed, *f;
	char msg[128], err[64];
	size_t i, nok = 0;
	int status;

	ok = cJSON_CreateArray();
	failed = cJSON_CreateArray();
	for (i = 0; i < fo->fo_n; i++) {
		const struct fanout_part *p = &fo->fo_parts[i];

		if (p->fp_err == UPSTREAM_OK && p->fp_status >= 200 &&
		    p->fp_status < 300) {
			cJSON_AddItemToArray(ok, cJSON_CreateString(p->fp_url));
			nok++;
			continue;
		}
		if (p->fp_err == UPSTREAM_OK)
			snprintf(err, sizeof(err), "HTTP %d", p->fp_status);
		else
			snprintf(err, sizeof(err), "%s", fanout_error(p));
		f = cJSON_CreateObject();
		cJSON_AddStringToObject(f, "worker", p->fp_url);
		cJSON_AddStringToObject(f, "error", err);
		cJSON_AddItemToArray(failed, f);
	}
	if (fo->fo_n == 0) {
		status = 404;
		snprintf(msg, sizeof(msg),
		    "No workers available for profiling");
	} else if (nok == fo->fo_n) {
		status = 200;
		snprintf(msg, sizeof(msg),
		    "Successfully %s profiling on all %zu workers",
		    start ? "started" : "stopped", nok);
	} else {
		status = 206;
		snprintf(msg, sizeof(msg),
		    "Profile %s: %zu succeeded, %zu failed",
		    start ? "start" : "stop", nok, fo->fo_n - nok);
	}
	cJSON_AddStringToObject(j, "status",
	    status == 200       ? "success"
	        : status == 206 ? "partial_success"
	                        : "error");
	cJSON_AddStringToObject(j, "message", msg);
	cJSON_AddNumberToObject(j, "workers_profiled", (double)nok);
	cJSON_AddNumberToObject(j, "total_workers", (double)fo->fo_n);
	if (status == 206) {
		cJSON_AddItemToObject(j, "successful", ok);
		cJSON_AddItemToObject(j, "failed", failed);
	} else {
		cJSON_Delete(ok);
		cJSON_Delete(failed);
	}
	fo->fo_conn = NULL;
	conn_json(c, status, j, fo->fo_id);
}

/* /engine_metrics: the merged exposition, or SMG's 500 text. */
static void
fanout_metrics_finish(struct fanout *fo)
{
	struct conn *c = fo->fo_conn;
	struct promerge *em;
	const char *err = NULL;
	char *text = NULL;
	size_t i, used = 0, len = 0;

	fo->fo_conn = NULL;
	if (fo->fo_n == 0)
		err = "No available workers";
	else if ((em = promerge_new()) == NULL)
		err = "Out of memory";
	else {
		for (i = 0; i < fo->fo_n; i++) {
			const struct fanout_part *p = &fo->fo_parts[i];

			if (p->fp_err != UPSTREAM_OK || p->fp_overflow ||
			    p->fp_status < 200 || p->fp_status >= 300)
				continue;
			if (promerge_add(em,
			        p->fp_body != NULL ? p->fp_body : "", p->fp_len,
			        "worker_addr", p->fp_url) == -1) {
				err = "Out of memory";
				break;
			}
			used++;
		}
		if (err == NULL && used == 0)
			err = "All backend requests failed";
		if (err == NULL && (text = promerge_text(em, &len)) == NULL)
			err = "Out of memory";
		promerge_free(em);
	}
	if (err != NULL) {
		conn_respond(c, 500, "text/plain; charset=utf-8", err,
		    strlen(err), fo->fo_id);
		return;
	}
	conn_respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", text,
	    len, fo->fo_id);
	free(text);
}
