/*
 * local.c: request routing by path, and the routes the gateway answers
 * itself (gateway.md §3.2-§3.3): probes, readiness, models, relays to the
 * first Ready worker, fan-outs to every worker (/flush_cache, /get_loads
 * with the Prometheus fallback of gateway.md §9.2), the worker API
 * (executed by the broker) and /metrics.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "frontend/frontend.h"
#include "shared/ipc.h"
#include "shared/log.h"
#include "shared/promload.h"

#define LOCAL_LOADS_PATH    "/v1/loads?include=core,disagg,queues,memory"
#define LOCAL_LOADS_TIMEOUT 5.0 /* per fetch, gateway.md §9.2 */

enum fanout_kind {
	FANOUT_FLUSH = 0,
	FANOUT_LOADS,
};

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
};

struct fanout {
	struct conn *fo_conn;
	const struct http_request *fo_hr;
	char fo_id[EXTRACT_REQUEST_ID_MAX + 1];
	enum fanout_kind fo_kind;
	bool fo_starting; /* parts still being started */
	size_t fo_n;
	size_t fo_left;
	struct fanout_part fo_parts[];
};

struct admin_ctx {
	struct conn *ac_conn;
	const struct http_request *ac_hr;
	char ac_id[EXTRACT_REQUEST_ID_MAX + 1];
};

static void local_json(struct conn *, const struct http_request *, int, cJSON *,
    const char *);
static void local_text(struct conn *, const struct http_request *, int,
    const char *, const char *);
static void local_err(struct conn *, const struct http_request *, int,
    const char *, const char *, const char *);
static void local_readiness(struct conn *, const struct http_request *,
    const char *);
static void local_models(struct conn *, const struct http_request *,
    const char *);
static void local_first_ready(struct conn *, const struct http_request *,
    const char *);
static void local_metrics(struct conn *, const struct http_request *);
static void local_fanout(struct conn *, const struct http_request *,
    enum fanout_kind, const char *);
static void fanout_send(struct fanout_part *);
static void fanout_head(void *, int, const struct upstream_header *, size_t);
static void fanout_body(void *, const char *, size_t);
static void fanout_done(void *, enum upstream_error);
static void fanout_timeout_cb(struct ev_loop *, ev_timer *, int);
static bool fanout_loads_answered(struct fanout_part *);
static cJSON *fanout_prom_report(const char *, size_t);
static void fanout_part_done(struct fanout_part *, enum upstream_error);
static void fanout_gone(void *);
static void fanout_finish(struct fanout *);
static void fanout_free(struct fanout *);
static void local_admin(struct conn *, const struct http_request *,
    const char *);
static void admin_gone(void *);
static void admin_reply(void *, int, const uint8_t *, size_t);
static bool local_authorized(const struct http_request *);
static size_t local_unescape(const char *, size_t, char *, size_t);
static bool local_query_param(const struct http_request *, const char *, char *,
    size_t);

/*
 * Workers whose /v1/loads route is absent (gateway.md §9.2), by slot:
 * generation + 1 of the worker that lacked it, so a worker that replaces
 * it in the slot is probed again.
 */
static uint32_t local_loads_absent[SHM_MAX_WORKERS];

static const struct conn_handler fanout_handler = {
	.ch_gone = fanout_gone,
	.ch_drained = NULL,
};

static const struct conn_handler admin_handler = {
	.ch_gone = admin_gone,
	.ch_drained = NULL,
};

static const struct upstream_cbs fanout_cbs = {
	.on_head = fanout_head,
	.on_body = fanout_body,
	.on_done = fanout_done,
};

static const char *const local_paths[] = {
	"/generate",
	"/v1/chat/completions",
	"/v1/completions",
	"/v1/embeddings",
	"/v1/rerank",
	"/rerank",
	"/v1/classify",
	"/v1/messages",
	"/v1/responses",
	"/health",
	"/liveness",
	"/readiness",
	"/v1/models",
	"/get_model_info",
	"/get_server_info",
	"/health_generate",
	"/flush_cache",
	"/get_loads",
	"/workers",
	"/metrics",
};

const char *
local_path_label(const char *path)
{
	size_t i;

	for (i = 0; i < sizeof(local_paths) / sizeof(local_paths[0]); i++)
		if (strcmp(path, local_paths[i]) == 0)
			return local_paths[i];
	if (strncmp(path, "/workers/", 9) == 0)
		return "/workers/{id}";
	return "other";
}

static const char *
local_method_label(const struct http_request *hr)
{
	switch (hr->hr_method) {
	case HTTP_GET:
	case HTTP_POST:
	case HTTP_PUT:
	case HTTP_DELETE:
	case HTTP_PATCH:
	case HTTP_HEAD:
		return hr->hr_method_str;
	default:
		return "other";
	}
}

void
local_count_response(const struct http_request *hr, int status)
{
	char labels[160];

	snprintf(labels, sizeof(labels),
	    "method=\"%s\",path=\"%s\",status_code=\"%d\"",
	    local_method_label(hr), local_path_label(hr->hr_path), status);
	stats_add("smg_http_responses_total", labels, 1);
}

static void
local_json(struct conn *c, const struct http_request *hr, int status, cJSON *j,
    const char *id)
{
	char *s = j != NULL ? cJSON_PrintUnformatted(j) : NULL;

	cJSON_Delete(j);
	if (s == NULL) {
		local_err(c, hr, 503, "out_of_memory", "Out of memory", id);
		return;
	}
	local_count_response(hr, status);
	conn_respond(c, status, "application/json", s, strlen(s), id);
	free(s);
}

static void
local_text(struct conn *c, const struct http_request *hr, int status,
    const char *text, const char *id)
{
	local_count_response(hr, status);
	conn_respond(c, status, "text/plain; charset=utf-8", text, strlen(text),
	    id);
}

static void
local_err(struct conn *c, const struct http_request *hr, int status,
    const char *code, const char *msg, const char *id)
{
	local_count_response(hr, status);
	conn_error(c, status, code, msg, id, 0);
}

/* Worker-service error body of gateway.md §3.3. */
static void
local_admin_err(struct conn *c, const struct http_request *hr, int status,
    const char *code, const char *msg, const char *id)
{
	cJSON *j = cJSON_CreateObject();

	cJSON_AddStringToObject(j, "error", msg);
	cJSON_AddStringToObject(j, "code", code);
	local_json(c, hr, status, j, id);
}

static bool
local_authorized(const struct http_request *hr)
{
	const char *key = fe->fe_cf->cf_api_key;
	const struct http_header *h;
	size_t klen;

	if (key == NULL || key[0] == '\0')
		return true;
	if ((h = http_request_header(hr, "authorization")) == NULL)
		return false;
	klen = strlen(key);
	return h->hh_value_len == klen + 7 &&
	    strncasecmp(h->hh_value, "Bearer ", 7) == 0 &&
	    memcmp(h->hh_value + 7, key, klen) == 0;
}

void
local_route(struct conn *c, const struct http_request *hr,
    enum listener_kind kind)
{
	const struct config *cf = fe->fe_cf;
	enum extract_endpoint ep;
	const char *path = hr->hr_path;
	char id[EXTRACT_REQUEST_ID_MAX + 1], labels[128];
	bool get = hr->hr_method == HTTP_GET, post = hr->hr_method == HTTP_POST;

	extract_request_id(hr, (const char *const *)cf->cf_request_id_headers,
	    cf->cf_request_id_headers_n, path, id, sizeof(id));
	snprintf(labels, sizeof(labels), "method=\"%s\",path=\"%s\"",
	    local_method_label(hr), local_path_label(path));
	stats_add("smg_http_requests_total", labels, 1);

	if (kind == LISTENER_METRICS) {
		if (get && strcmp(path, "/metrics") == 0)
			local_metrics(c, hr);
		else
			local_err(c, hr, 404, "not_found", "Not found", id);
		return;
	}
	if (get &&
	    (strcmp(path, "/health") == 0 || strcmp(path, "/liveness") == 0)) {
		local_text(c, hr, 200, "OK", id);
		return;
	}
	if (get && strcmp(path, "/readiness") == 0) {
		local_readiness(c, hr, id);
		return;
	}
	if (kind == LISTENER_HEALTH) {
		local_err(c, hr, 404, "not_found", "Not found", id);
		return;
	}
	if (get && strcmp(path, "/v1/models") == 0) {
		local_models(c, hr, id);
		return;
	}
	if (get && strcmp(path, "/health_generate") == 0 && pd_enabled()) {
		pd_health_generate(c, hr, id);
		return;
	}
	if (get &&
	    (strcmp(path, "/get_model_info") == 0 ||
	        strcmp(path, "/get_server_info") == 0 ||
	        strcmp(path, "/health_generate") == 0)) {
		local_first_ready(c, hr, id);
		return;
	}
	if (extract_route(path, &ep) == 0) {
		if (!post) {
			local_err(c, hr, 405, "method_not_allowed",
			    "Method not allowed", id);
			return;
		}
		if (!local_authorized(hr)) {
			local_err(c, hr, 401, "unauthorized",
			    "Invalid or missing API key", id);
			return;
		}
		if (pd_enabled())
			pd_start(c, hr, ep, id);
		else
			proxy_start(c, hr, ep, id);
		return;
	}
	if ((post && strcmp(path, "/flush_cache") == 0) ||
	    (get && strcmp(path, "/get_loads") == 0) ||
	    strcmp(path, "/workers") == 0 ||
	    strncmp(path, "/workers/", 9) == 0) {
		if (!local_authorized(hr)) {
			local_err(c, hr, 401, "unauthorized",
			    "Invalid or missing API key", id);
			return;
		}
		if (path[1] == 'f')
			local_fanout(c, hr, FANOUT_FLUSH, id);
		else if (path[1] == 'g')
			local_fanout(c, hr, FANOUT_LOADS, id);
		else
			local_admin(c, hr, id);
		return;
	}
	local_err(c, hr, 404, "not_found", "Not found", id);
}

static void
local_readiness(struct conn *c, const struct http_request *hr, const char *id)
{
	struct shm_worker w;
	unsigned slot, total = 0, healthy = 0, ready_type[4] = { 0 };
	bool ready;
	cJSON *j = cJSON_CreateObject();

	for (slot = 0; slot < SHM_MAX_WORKERS; slot++) {
		if (shm_worker_read(fe->fe_shm, slot, &w) == -1)
			continue;
		total++;
		if (w.sw_status == SHM_WORKER_READY) {
			healthy++;
			if (w.sw_type < 4)
				ready_type[w.sw_type]++;
		}
	}
	if (fe->fe_cf->cf_epd_disaggregation)
		ready =
		    ready_type[1] > 0 && ready_type[2] > 0 && ready_type[3] > 0;
	else if (fe->fe_cf->cf_pd_disaggregation)
		ready = ready_type[1] > 0 && ready_type[2] > 0;
	else
		ready = healthy > 0;
	if (fe->fe_draining) {
		cJSON_AddStringToObject(j, "status", "not ready");
		cJSON_AddStringToObject(j, "reason", "draining");
		local_json(c, hr, 503, j, id);
	} else if (!ready) {
		cJSON_AddStringToObject(j, "status", "not ready");
		cJSON_AddStringToObject(j, "reason",
		    "insufficient healthy workers");
		local_json(c, hr, 503, j, id);
	} else if (!decide_broker_ready()) {
		cJSON_AddStringToObject(j, "status", "not ready");
		cJSON_AddStringToObject(j, "reason", "broker unreachable");
		local_json(c, hr, 503, j, id);
	} else {
		cJSON_AddStringToObject(j, "status", "ready");
		cJSON_AddNumberToObject(j, "healthy_workers", healthy);
		cJSON_AddNumberToObject(j, "total_workers", total);
		local_json(c, hr, 200, j, id);
	}
}

static void
local_models(struct conn *c, const struct http_request *hr, const char *id)
{
	static struct shm_worker ws[SHM_MAX_WORKERS];
	unsigned slot, n = 0, i, k;
	cJSON *j, *data, *m;

	for (slot = 0; slot < SHM_MAX_WORKERS; slot++)
		if (shm_worker_read(fe->fe_shm, slot, &ws[n]) == 0)
			n++;
	/* Registration order, so the list is stable. */
	for (i = 1; i < n; i++)
		for (k = i; k > 0 && ws[k - 1].sw_order > ws[k].sw_order; k--) {
			struct shm_worker t = ws[k];

			ws[k] = ws[k - 1];
			ws[k - 1] = t;
		}
	j = cJSON_CreateObject();
	cJSON_AddStringToObject(j, "object", "list");
	data = cJSON_AddArrayToObject(j, "data");
	for (i = 0; i < n; i++) {
		bool seen = false;

		for (k = 0; k < i && !seen; k++)
			seen = strcmp(ws[k].sw_model, ws[i].sw_model) == 0;
		if (seen)
			continue;
		m = cJSON_CreateObject();
		cJSON_AddStringToObject(m, "id", ws[i].sw_model);
		cJSON_AddStringToObject(m, "object", "model");
		cJSON_AddNumberToObject(m, "created", 0);
		cJSON_AddStringToObject(m, "owned_by", "smg");
		cJSON_AddItemToArray(data, m);
	}
	if (cJSON_GetArraySize(data) == 0) {
		cJSON_Delete(j);
		local_text(c, hr, 503, "No models available", id);
		return;
	}
	local_json(c, hr, 200, j, id);
}

/* The first Ready HTTP worker of a type (registration order); -1 none. */
static int
local_first_of_type(uint32_t type, struct shm_worker *out, unsigned *slot)
{
	struct shm_worker w;
	unsigned s;
	bool found = false;

	for (s = 0; s < SHM_MAX_WORKERS; s++) {
		if (shm_worker_read(fe->fe_shm, s, &w) == -1)
			continue;
		if (w.sw_status != SHM_WORKER_READY || w.sw_mode != 0 ||
		    w.sw_type != type)
			continue;
		if (!found || w.sw_order < out->sw_order) {
			*out = w;
			*slot = s;
			found = true;
		}
	}
	return found ? 0 : -1;
}

/*
 * GET /get_model_info, /get_server_info and (regular mode)
 * /health_generate: the first Ready worker's answer. PD/EPD has no
 * regular workers: the first Ready prefill worker answers, else the first
 * Ready decode worker.
 */
static void
local_first_ready(struct conn *c, const struct http_request *hr, const char *id)
{
	struct shm_worker w;
	unsigned slot;
	int rv;

	if (pd_enabled()) {
		rv = local_first_of_type(SMG__WORKER_TYPE__WORKER_TYPE_PREFILL,
		    &w, &slot);
		if (rv == -1)
			rv = local_first_of_type(
			    SMG__WORKER_TYPE__WORKER_TYPE_DECODE, &w, &slot);
	} else
		rv = fallback_first_ready(fe->fe_shm, &w, &slot);
	if (rv == -1) {
		local_err(c, hr, 503, "no_workers", "No healthy workers", id);
		return;
	}
	proxy_fixed(c, hr, &w, slot, id);
}

static void
local_metrics(struct conn *c, const struct http_request *hr)
{
	struct shm_worker w;
	struct http_out o;
	char *text = NULL;
	size_t len = 0;
	unsigned slot;
	bool first = true;

	http_out_init(&o);
	if (metrics_render(fe->fe_shm, &text, &len) == -1) {
		local_err(c, hr, 503, "out_of_memory", "Out of memory", NULL);
		return;
	}
	http_out_append(&o, text, len);
	/* In-flight is summed over the frontend rows at render time. */
	if (strstr(text, "\nsmg_worker_requests_active{") == NULL &&
	    strncmp(text, "smg_worker_requests_active{", 27) != 0) {
		for (slot = 0; slot < SHM_MAX_WORKERS; slot++) {
			if (shm_worker_read(fe->fe_shm, slot, &w) == -1)
				continue;
			if (first) {
				static const char t[] =
				    "# TYPE smg_worker_requests_active gauge\n";
				http_out_append(&o, t, sizeof(t) - 1);
				first = false;
			}
			char line[SHM_URL_MAX + 96];
			int n = snprintf(line, sizeof(line),
			    "smg_worker_requests_active{worker=\"%s\"} %u\n",
			    w.sw_url, shm_inflight_total(fe->fe_shm, slot));
			if (n > 0 && (size_t)n < sizeof(line))
				http_out_append(&o, line, (size_t)n);
		}
	}
	free(text);
	if (o.ho_failed) {
		http_out_free(&o);
		local_err(c, hr, 503, "out_of_memory", "Out of memory", NULL);
		return;
	}
	local_count_response(hr, 200);
	conn_respond(c, 200, "text/plain; version=0.0.4", o.ho_buf, o.ho_len,
	    NULL);
	http_out_free(&o);
}

/* ------------------------------------------------------------ fan-out */

static void
local_fanout(struct conn *c, const struct http_request *hr,
    enum fanout_kind kind, const char *id)
{
	static struct shm_worker ws[SHM_MAX_WORKERS];
	static unsigned slots[SHM_MAX_WORKERS];
	struct fanout *fo;
	unsigned slot, n = 0, i;

	for (slot = 0; slot < SHM_MAX_WORKERS; slot++)
		if (shm_worker_read(fe->fe_shm, slot, &ws[n]) == 0 &&
		    ws[n].sw_mode == 0)
			slots[n++] = slot;
	if ((fo = calloc(1, sizeof(*fo) + n * sizeof(fo->fo_parts[0]))) ==
	    NULL) {
		local_err(c, hr, 503, "out_of_memory", "Out of memory", id);
		return;
	}
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
		snprintf(p->fp_url, sizeof(p->fp_url), "%s", ws[i].sw_url);
		if (ws[i].sw_api_key[0] != '\0')
			snprintf(p->fp_auth, sizeof(p->fp_auth), "Bearer %s",
			    ws[i].sw_api_key);
		ev_init(&p->fp_timer, fanout_timeout_cb);
		p->fp_timer.data = p;
		/* A worker known to lack /v1/loads goes to /metrics. */
		p->fp_metrics = kind == FANOUT_LOADS &&
		    local_loads_absent[p->fp_slot] == p->fp_generation + 1;
		fanout_send(p);
	}
	fo->fo_starting = false;
	if (fo->fo_left == 0)
		fanout_finish(fo);
}

/* Starts the part's current request; a failure to start ends the part. */
static void
fanout_send(struct fanout_part *p)
{
	struct upstream_header h;
	const char *path;

	p->fp_status = 0;
	p->fp_len = 0;
	p->fp_overflow = false;
	if (p->fp_fo->fo_kind == FANOUT_FLUSH)
		path = "/flush_cache";
	else
		path = p->fp_metrics ? "/metrics" : LOCAL_LOADS_PATH;
	h.uh_name = "authorization";
	h.uh_name_len = 13;
	h.uh_value = p->fp_auth;
	h.uh_value_len = strlen(p->fp_auth);
	p->fp_up = upstream_request(fe->fe_up, p->fp_url,
	    p->fp_fo->fo_kind == FANOUT_FLUSH ? "POST" : "GET", path, &h,
	    p->fp_auth[0] != '\0' ? 1 : 0, NULL, 0, &fanout_cbs, p);
	if (p->fp_up == NULL) {
		fanout_part_done(p, UPSTREAM_CONNECT_FAILED);
		return;
	}
	if (p->fp_fo->fo_kind == FANOUT_LOADS) {
		ev_timer_set(&p->fp_timer, LOCAL_LOADS_TIMEOUT, 0.);
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
	bool ok = p->fp_err == UPSTREAM_OK && !p->fp_overflow;
	cJSON *rep, *loads;

	if (ok && p->fp_status >= 200 && p->fp_status < 300) {
		rep = p->fp_body != NULL
		    ? cJSON_ParseWithLength(p->fp_body, p->fp_len)
		    : NULL;
		loads = cJSON_GetObjectItemCaseSensitive(rep, "loads");
		if (cJSON_IsObject(rep) && cJSON_IsArray(loads)) {
			if (cJSON_GetArraySize(loads) > 0)
				p->fp_report = rep;
			else
				cJSON_Delete(rep);
			return true;
		}
		cJSON_Delete(rep);
		local_loads_absent[p->fp_slot] = p->fp_generation + 1;
	} else if (ok &&
	    (p->fp_status == 404 || p->fp_status == 405 || p->fp_status == 501))
		local_loads_absent[p->fp_slot] = p->fp_generation + 1;
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

static void
fanout_gone(void *arg)
{
	struct fanout *fo = arg;

	fo->fo_conn = NULL;
	fanout_free(fo);
}

static void
fanout_free(struct fanout *fo)
{
	size_t i;

	for (i = 0; i < fo->fo_n; i++) {
		struct fanout_part *p = &fo->fo_parts[i];

		ev_timer_stop(fe->fe_loop, &p->fp_timer);
		if (p->fp_up != NULL)
			upstream_cancel(p->fp_up);
		free(p->fp_body);
		cJSON_Delete(p->fp_report);
	}
	free(fo);
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
	cJSON *e = cJSON_CreateObject(), *loads, *r, *v;
	double used = 0;
	bool sized = false;

	cJSON_AddStringToObject(e, "worker", p->fp_url);
	if (p->fp_report == NULL) {
		cJSON_AddNumberToObject(e, "load", -1);
		return e;
	}
	loads = cJSON_GetObjectItemCaseSensitive(p->fp_report, "loads");
	cJSON_ArrayForEach(r, loads)
	{
		v = cJSON_GetObjectItemCaseSensitive(r, "num_used_tokens");
		if (cJSON_IsNumber(v))
			used += v->valuedouble;
		v = cJSON_GetObjectItemCaseSensitive(r, "max_total_num_tokens");
		if (cJSON_IsNumber(v) && v->valuedouble > 0)
			sized = true;
	}
	cJSON_AddNumberToObject(e, "load", sized ? used : -1);
	cJSON_AddItemToObject(e, "details", p->fp_report);
	p->fp_report = NULL;
	return e;
}

static void
fanout_finish(struct fanout *fo)
{
	struct conn *c = fo->fo_conn;
	cJSON *j = cJSON_CreateObject(), *arr, *f;
	size_t i, nok = 0;
	int status = 200;

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
			if (p->fp_err == UPSTREAM_OK)
				snprintf(err, sizeof(err), "HTTP %d",
				    p->fp_status);
			else
				snprintf(err, sizeof(err), "%s",
				    fanout_error(p));
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
		cJSON_AddNumberToObject(j, "total_http_workers",
		    (double)fo->fo_n);
	}
	fo->fo_conn = NULL;
	local_json(c, fo->fo_hr, status, j, fo->fo_id);
	fanout_free(fo);
}

/* ------------------------------------------------------------ worker API */

static int
local_hexval(int ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	ch = tolower(ch);
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	return -1;
}

/* Percent-decodes (and '+' to space) into out; returns the length. */
static size_t
local_unescape(const char *s, size_t len, char *out, size_t outlen)
{
	size_t i, n = 0;
	int hi, lo;

	for (i = 0; i < len && n + 1 < outlen; i++) {
		if (s[i] == '%' && i + 2 < len &&
		    (hi = local_hexval((unsigned char)s[i + 1])) != -1 &&
		    (lo = local_hexval((unsigned char)s[i + 2])) != -1) {
			out[n++] = (char)(hi * 16 + lo);
			i += 2;
		} else if (s[i] == '+')
			out[n++] = ' ';
		else
			out[n++] = s[i];
	}
	out[n] = '\0';
	return n;
}

static bool
local_query_param(const struct http_request *hr, const char *name, char *out,
    size_t outlen)
{
	const char *q = hr->hr_query, *amp, *eq;
	size_t nlen = strlen(name), plen;

	while (q != NULL && *q != '\0') {
		amp = strchr(q, '&');
		plen = amp != NULL ? (size_t)(amp - q) : strlen(q);
		eq = memchr(q, '=', plen);
		if (eq != NULL && (size_t)(eq - q) == nlen &&
		    strncmp(q, name, nlen) == 0) {
			local_unescape(eq + 1, plen - nlen - 1, out, outlen);
			return true;
		}
		q = amp != NULL ? amp + 1 : NULL;
	}
	return false;
}

static void
local_admin(struct conn *c, const struct http_request *hr, const char *id)
{
	Smg__AdminRequest ar = SMG__ADMIN_REQUEST__INIT;
	Smg__WorkerSpec ws = SMG__WORKER_SPEC__INIT;
	struct admin_ctx *ac;
	char arg[SHM_URL_MAX * 2], *body = NULL;
	const char *path = hr->hr_path;
	bool collection = strcmp(path, "/workers") == 0;
	cJSON *j, *u;

	if (!collection) {
		local_unescape(path + 9, strlen(path + 9), arg, sizeof(arg));
		if (arg[0] == '\0' || strchr(arg, '/') != NULL) {
			local_admin_err(c, hr, 400, "invalid_worker_id",
			    "Invalid worker id", id);
			return;
		}
	}
	if (collection && hr->hr_method == HTTP_POST) {
		j = cJSON_ParseWithLength(hr->hr_body, hr->hr_body_len);
		u = cJSON_GetObjectItemCaseSensitive(j, "url");
		if (!cJSON_IsObject(j) || !cJSON_IsString(u)) {
			cJSON_Delete(j);
			local_admin_err(c, hr, 400, "invalid_request",
			    "Body must be a JSON object with a string \"url\"",
			    id);
			return;
		}
		snprintf(arg, sizeof(arg), "%s", u->valuestring);
		cJSON_Delete(j);
		if ((body = strndup(hr->hr_body, hr->hr_body_len)) == NULL) {
			local_err(c, hr, 503, "out_of_memory", "Out of memory",
			    id);
			return;
		}
		ws.url = arg;
		ws.spec_json = body;
		ar.op_case = SMG__ADMIN_REQUEST__OP_ADD_WORKER;
		ar.add_worker = &ws;
	} else if (collection && hr->hr_method == HTTP_GET) {
		if (!local_query_param(hr, "model", arg, sizeof(arg)))
			arg[0] = '\0';
		ar.op_case = SMG__ADMIN_REQUEST__OP_LIST_WORKERS;
		ar.list_workers = arg;
	} else if (collection && hr->hr_method == HTTP_DELETE &&
	    local_query_param(hr, "url", arg, sizeof(arg))) {
		ar.op_case = SMG__ADMIN_REQUEST__OP_REMOVE_WORKER;
		ar.remove_worker = arg;
	} else if (!collection && hr->hr_method == HTTP_GET) {
		ar.op_case = SMG__ADMIN_REQUEST__OP_GET_WORKER;
		ar.get_worker = arg;
	} else if (!collection && hr->hr_method == HTTP_DELETE) {
		ar.op_case = SMG__ADMIN_REQUEST__OP_REMOVE_WORKER;
		ar.remove_worker = arg;
	} else {
		local_admin_err(c, hr, 405, "method_not_allowed",
		    "Method not allowed", id);
		return;
	}
	if ((ac = calloc(1, sizeof(*ac))) == NULL) {
		free(body);
		local_err(c, hr, 503, "out_of_memory", "Out of memory", id);
		return;
	}
	ac->ac_conn = c;
	ac->ac_hr = hr;
	snprintf(ac->ac_id, sizeof(ac->ac_id), "%s", id);
	if (decide_admin(&ar, admin_reply, ac) == -1) {
		free(ac);
		free(body);
		local_admin_err(c, hr, 503, "broker_unavailable",
		    "The control plane is unavailable", id);
		return;
	}
	free(body);
	conn_set_handler(c, &admin_handler, ac);
}

static void
admin_gone(void *arg)
{
	struct admin_ctx *ac = arg;

	/* The broker's reply still comes; it frees ac. */
	ac->ac_conn = NULL;
}

static void
admin_reply(void *arg, int status, const uint8_t *reply, size_t len)
{
	struct admin_ctx *ac = arg;
	struct conn *c = ac->ac_conn;
	Smg__BrokerReply *r = NULL;
	struct http_out *o;
	const char *why, *body;
	size_t blen;

	if (c == NULL) {
		free(ac);
		return;
	}
	if (status == 0)
		r = ipc_decode_broker(reply, len, &why);
	if (r == NULL || r->body_case != SMG__BROKER_REPLY__BODY_ADMIN ||
	    r->admin->http_status < 100 || r->admin->http_status > 599) {
		if (r != NULL)
			smg__broker_reply__free_unpacked(r, NULL);
		local_admin_err(c, ac->ac_hr, 503, "broker_unavailable",
		    "The control plane is unavailable", ac->ac_id);
		free(ac);
		return;
	}
	body = r->admin->body_json != NULL ? r->admin->body_json : "";
	blen = strlen(body);
	o = conn_out(c);
	http_out_status(o, (int)r->admin->http_status);
	http_out_header(o, "content-type", "application/json");
	http_out_headerf(o, "content-length", "%zu", blen);
	if (r->admin->location != NULL && r->admin->location[0] != '\0')
		http_out_header(o, "location", r->admin->location);
	http_out_header(o, "x-request-id", ac->ac_id);
	http_out_header(o, "connection",
	    conn_keep_alive(c) ? "keep-alive" : "close");
	http_out_end_head(o);
	http_out_append(o, body, blen);
	local_count_response(ac->ac_hr, (int)r->admin->http_status);
	smg__broker_reply__free_unpacked(r, NULL);
	free(ac);
	conn_request_done(c);
}
