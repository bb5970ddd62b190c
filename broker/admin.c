/*
 * admin.c: the worker API of gateway.md §3.3 as the broker executes it
 * (add, list, get, replace, patch, delete). The frontend passes the client's
 * JSON body in WorkerSpec.spec_json; this file validates it (§12) and answers
 * with the HTTP status, the JSON body and the Location header the frontend
 * relays.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shared/log.h"
#include "shared/url.h"
#include "shared/urlallow.h"
#include "shared/xmalloc.h"

#include "broker.h"

static void admin_set(Smg__AdminReply *r, uint32_t status, cJSON *body);
static void admin_error(Smg__AdminReply *r, uint32_t status, const char *msg,
    const char *code);
static int admin_url_allowed(struct broker *br, const char *url,
    Smg__AdminReply *r);
static void admin_add(struct broker *br, const Smg__WorkerSpec *spec,
    Smg__AdminReply *r);
static void admin_list(struct broker *br, const char *model,
    Smg__AdminReply *r);
static void admin_get(struct broker *br, const char *id, Smg__AdminReply *r);
static void admin_remove(struct broker *br, const char *id, Smg__AdminReply *r);
static void admin_replace(cJSON *o, const char *name, cJSON *item);
static int admin_type_parse(const char *s, int *out);
static int admin_check_models(const cJSON *models, const char **err);
static void admin_update(struct broker *br, const Smg__WorkerUpdate *u,
    Smg__AdminReply *r);
static int admin_patch(struct worker *w, const cJSON *o, struct worker_spec *ws,
    cJSON *spec, const char **err);
static void admin_not_found(Smg__AdminReply *r, const char *id);
static cJSON *admin_models(const struct worker *w);
static int admin_mode_parse(const char *s, int *out);
static int admin_mode_of_url(const char *url);
static int admin_spec_from_proto(const Smg__WorkerSpec *p,
    struct worker_spec *ws, char *url_buf, size_t url_len, char *err,
    size_t errlen);

/* SMG's worker-service error codes (WorkerServiceError::error_code). */
#define ADMIN_BAD_REQUEST    "BAD_REQUEST"
#define ADMIN_NOT_FOUND      "WORKER_NOT_FOUND"
#define ADMIN_EXISTS         "WORKER_ALREADY_EXISTS"
#define ADMIN_INTERNAL       "INTERNAL_SERVER_ERROR"
#define ADMIN_MAX_CONN_TRIES 20 /* WorkerSpec max_connection_attempts */

static char admin_errbuf[512];

static void
admin_set(Smg__AdminReply *r, uint32_t status, cJSON *body)
{
	char *s;

	r->http_status = status;
	if (body == NULL || (s = cJSON_PrintUnformatted(body)) == NULL)
		s = xstrdup("{\"error\":\"out of memory\",\"code\":"
		            "\"INTERNAL_SERVER_ERROR\"}");
	r->body_json = s;
	cJSON_Delete(body);
}

static void
admin_error(Smg__AdminReply *r, uint32_t status, const char *msg,
    const char *code)
{
	cJSON *o = cJSON_CreateObject();

	cJSON_AddStringToObject(o, "error", msg);
	cJSON_AddStringToObject(o, "code", code);
	admin_set(r, status, o);
}

void
admin_reply_free(Smg__AdminReply *reply)
{
	if (reply->body_json != NULL &&
	    reply->body_json != protobuf_c_empty_string)
		free(reply->body_json);
	if (reply->location != NULL &&
	    reply->location != protobuf_c_empty_string)
		free(reply->location);
	reply->body_json = NULL;
	reply->location = NULL;
}

static int
admin_type_parse(const char *s, int *out)
{
	static const char *names[] = { "regular", "prefill", "decode",
		"encode" };
	int i;

	for (i = 0; i < 4; i++) {
		if (strcmp(s, names[i]) == 0) {
			*out = i;
			return 0;
		}
	}
	return -1;
}

static int
admin_mode_parse(const char *s, int *out)
{
	static const char *names[] = { "http", "grpc", "zmq" };
	int i;

	for (i = 0; i < 3; i++) {
		if (strcmp(s, names[i]) == 0) {
			*out = i;
			return 0;
		}
	}
	return -1;
}

/* Mode implied by the URL scheme when the spec names none. */
static int
admin_mode_of_url(const char *url)
{
	if (strncmp(url, "grpc://", 7) == 0 || strncmp(url, "grpcs://", 8) == 0)
		return SMG__CONNECTION_MODE__CONNECTION_MODE_GRPC;
	if (strncmp(url, "ipc://", 6) == 0)
		return SMG__CONNECTION_MODE__CONNECTION_MODE_ZMQ;
	return SMG__CONNECTION_MODE__CONNECTION_MODE_HTTP;
}

/* models: every entry {"id": non-empty string, "aliases": [strings]}. */
static int
admin_check_models(const cJSON *models, const char **err)
{
	const cJSON *m, *id, *al, *a;

	cJSON_ArrayForEach(m, models)
	{
		id = cJSON_GetObjectItemCaseSensitive(m, "id");
		if (!cJSON_IsObject(m) || !cJSON_IsString(id) ||
		    *id->valuestring == '\0') {
			*err = "models[].id must be a non-empty string";
			return -1;
		}
		al = cJSON_GetObjectItemCaseSensitive(m, "aliases");
		if (al == NULL || cJSON_IsNull(al))
			continue;
		if (!cJSON_IsArray(al)) {
			*err = "models[].aliases must be a list of strings";
			return -1;
		}
		cJSON_ArrayForEach(a, al)
		{
			if (!cJSON_IsString(a) || *a->valuestring == '\0' ||
			    strlen(a->valuestring) >= SHM_MODEL_MAX) {
				*err = "models[].aliases must be a list of "
				       "non-empty strings";
				return -1;
			}
		}
	}
	return 0;
}

int
admin_parse_spec(const char *json, cJSON **root, struct worker_spec *ws,
    char *url_buf, size_t url_len, const char **err, const char **code)
{
	cJSON *o, *it, *first, *sub;
	char why[256];

	memset(ws, 0, sizeof(*ws));
	ws->ws_bootstrap_port = -1;
	ws->ws_priority = 50;
	ws->ws_cost = 1.0;
	*code = ADMIN_BAD_REQUEST;
	if ((*root = o = cJSON_Parse(json)) == NULL) {
		*err = "request body is not valid JSON";
		return -1;
	}
	if (!cJSON_IsObject(o)) {
		*err = "worker spec must be a JSON object";
		return -1;
	}
	it = cJSON_GetObjectItemCaseSensitive(o, "url");
	if (!cJSON_IsString(it)) {
		*err = "url is required and must be a string";
		*code = ADMIN_BAD_REQUEST;
		return -1;
	}
	if (registry_normalize_url(it->valuestring, url_buf, url_len, why,
	        sizeof(why)) == -1) {
		snprintf(admin_errbuf, sizeof(admin_errbuf), "invalid url: %s",
		    why);
		*err = admin_errbuf;
		*code = ADMIN_BAD_REQUEST;
		return -1;
	}
	ws->ws_url = url_buf;
	ws->ws_mode = admin_mode_of_url(url_buf);
	if ((it = cJSON_GetObjectItemCaseSensitive(o, "models")) != NULL &&
	    !cJSON_IsNull(it)) {
		if (!cJSON_IsArray(it)) {
			*err = "models must be a list of {\"id\": ...}";
			return -1;
		}
		if ((first = cJSON_GetArrayItem(it, 0)) != NULL) {
			sub = cJSON_GetObjectItemCaseSensitive(first, "id");
			if (!cJSON_IsString(sub) || *sub->valuestring == '\0' ||
			    strlen(sub->valuestring) >= SHM_MODEL_MAX) {
				*err = "models[0].id must be a non-empty "
				       "string";
				return -1;
			}
			ws->ws_model = sub->valuestring;
		}
		if (admin_check_models(it, err) == -1)
			return -1;
	}
	if ((it = cJSON_GetObjectItemCaseSensitive(o, "model_id")) != NULL &&
	    ws->ws_model == NULL && !cJSON_IsNull(it)) {
		if (!cJSON_IsString(it) ||
		    strlen(it->valuestring) >= SHM_MODEL_MAX) {
			*err = "model_id must be a string";
			return -1;
		}
		ws->ws_model = it->valuestring;
	}
	if ((it = cJSON_GetObjectItemCaseSensitive(o, "worker_type")) != NULL &&
	    !cJSON_IsNull(it)) {
		if (!cJSON_IsString(it) ||
		    admin_type_parse(it->valuestring, &ws->ws_type) == -1) {
			*err = "worker_type must be regular, prefill, decode "
			       "or encode";
			*code = ADMIN_BAD_REQUEST;
			return -1;
		}
	}
	if ((it = cJSON_GetObjectItemCaseSensitive(o, "connection_mode")) !=
	        NULL &&
	    !cJSON_IsNull(it)) {
		if (!cJSON_IsString(it) ||
		    admin_mode_parse(it->valuestring, &ws->ws_mode) == -1) {
			*err = "connection_mode must be http, grpc or zmq";
			*code = ADMIN_BAD_REQUEST;
			return -1;
		}
	}
	if ((it = cJSON_GetObjectItemCaseSensitive(o, "runtime_type")) ==
	        NULL ||
	    cJSON_IsNull(it))
		it = cJSON_GetObjectItemCaseSensitive(o, "runtime");
	if (it != NULL && !cJSON_IsNull(it)) {
		if (!cJSON_IsString(it)) {
			*err = "runtime_type must be a string";
			return -1;
		}
		ws->ws_runtime = it->valuestring;
	}
	if ((it = cJSON_GetObjectItemCaseSensitive(o, "labels")) != NULL &&
	    !cJSON_IsNull(it)) {
		if (!cJSON_IsObject(it)) {
			*err = "labels must be an object of strings";
			return -1;
		}
		cJSON_ArrayForEach(sub, it)
		{
			if (!cJSON_IsString(sub)) {
				*err = "labels must be an object of strings";
				return -1;
			}
		}
		/* The poller connects a ZMQ SUB there (workers.md §6.4). */
		sub =
		    cJSON_GetObjectItemCaseSensitive(it, "kv_events_endpoint");
		if (sub != NULL &&
		    (strstr(sub->valuestring, "://") == NULL ||
		        strlen(sub->valuestring) >= SHM_URL_MAX)) {
			*err = "labels.kv_events_endpoint must be a ZMQ "
			       "endpoint such as tcp://host:5557";
			return -1;
		}
		/* The poller's gRPC side channel (workers.md §4). */
		sub = cJSON_GetObjectItemCaseSensitive(it, "grpc_endpoint");
		if (sub != NULL &&
		    ((strncmp(sub->valuestring, "grpc://", 7) != 0 &&
		         strncmp(sub->valuestring, "grpcs://", 8) != 0) ||
		        strlen(sub->valuestring) >= SHM_URL_MAX)) {
			*err = "labels.grpc_endpoint must be a gRPC URL such "
			       "as grpc://host:50051";
			return -1;
		}
		ws->ws_labels = it;
	}
	if ((it = cJSON_GetObjectItemCaseSensitive(o, "priority")) != NULL &&
	    !cJSON_IsNull(it)) {
		if (!cJSON_IsNumber(it) || it->valuedouble < 0 ||
		    it->valuedouble > 4294967295.0 ||
		    it->valuedouble != floor(it->valuedouble)) {
			*err = "priority must be an unsigned 32-bit integer";
			return -1;
		}
		ws->ws_priority = (uint32_t)it->valuedouble;
	}
	if ((it = cJSON_GetObjectItemCaseSensitive(o, "cost")) != NULL &&
	    !cJSON_IsNull(it)) {
		if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble)) {
			*err = "cost must be a number";
			return -1;
		}
		ws->ws_cost = it->valuedouble;
	}
	if ((it = cJSON_GetObjectItemCaseSensitive(o, "api_key")) != NULL &&
	    !cJSON_IsNull(it)) {
		if (!cJSON_IsString(it) ||
		    strlen(it->valuestring) >= SHM_KEY_MAX) {
			*err = "api_key must be a string";
			return -1;
		}
		ws->ws_api_key = it->valuestring;
	}
	if ((it = cJSON_GetObjectItemCaseSensitive(o, "bootstrap_port")) !=
	        NULL &&
	    !cJSON_IsNull(it)) {
		if (!cJSON_IsNumber(it) || it->valuedouble < 0 ||
		    it->valuedouble > 65535 ||
		    it->valuedouble != floor(it->valuedouble)) {
			*err = "bootstrap_port must be an integer 0..65535";
			return -1;
		}
		ws->ws_bootstrap_port = (int32_t)it->valuedouble;
	}
	if ((it = cJSON_GetObjectItemCaseSensitive(o, "health")) != NULL &&
	    !cJSON_IsNull(it)) {
		if (!cJSON_IsObject(it)) {
			*err = "health must be an object";
			return -1;
		}
		sub = cJSON_GetObjectItemCaseSensitive(it,
		    "disable_health_check");
		if (sub != NULL && !cJSON_IsNull(sub) && !cJSON_IsBool(sub)) {
			*err = "health.disable_health_check must be a boolean";
			return -1;
		}
		ws->ws_health_disabled = cJSON_IsTrue(sub);
	}
	if ((it = cJSON_GetObjectItemCaseSensitive(o,
	         "max_connection_attempts")) != NULL &&
	    !cJSON_IsNull(it) &&
	    (!cJSON_IsNumber(it) || it->valuedouble < 0 ||
	        it->valuedouble > 4294967295.0 ||
	        it->valuedouble != floor(it->valuedouble))) {
		*err = "max_connection_attempts must be an unsigned 32-bit "
		       "integer";
		return -1;
	}
	if ((it = cJSON_GetObjectItemCaseSensitive(o, "provider")) != NULL &&
	    !cJSON_IsNull(it) && !cJSON_IsString(it)) {
		*err = "provider must be a string (openai, xai, anthropic, "
		       "gemini or a custom name)";
		return -1;
	}
	if ((it = cJSON_GetObjectItemCaseSensitive(o, "overload")) != NULL &&
	    !cJSON_IsNull(it)) {
		if (!cJSON_IsObject(it)) {
			*err = "overload must be an object";
			return -1;
		}
		sub = cJSON_GetObjectItemCaseSensitive(it, "waiting_requests");
		if (sub != NULL && !cJSON_IsNull(sub)) {
			if (!cJSON_IsNumber(sub) || sub->valuedouble < 1 ||
			    sub->valuedouble != floor(sub->valuedouble)) {
				*err = "overload.waiting_requests must be an "
				       "integer >= 1";
				return -1;
			}
			ws->ws_ov_waiting = (int64_t)sub->valuedouble;
		}
		sub = cJSON_GetObjectItemCaseSensitive(it, "token_usage");
		if (sub != NULL && !cJSON_IsNull(sub)) {
			if (!cJSON_IsNumber(sub) || !(sub->valuedouble > 0) ||
			    sub->valuedouble > 1) {
				*err = "overload.token_usage must be in (0, 1]";
				return -1;
			}
			ws->ws_ov_token_usage = sub->valuedouble;
		}
	}
	if ((it = cJSON_GetObjectItemCaseSensitive(o,
	         "load_monitor_interval_secs")) != NULL &&
	    !cJSON_IsNull(it)) {
		if (!cJSON_IsNumber(it) || it->valuedouble < 1 ||
		    it->valuedouble > 86400 ||
		    it->valuedouble != floor(it->valuedouble)) {
			*err = "load_monitor_interval_secs must be an integer "
			       "in [1, 86400]";
			return -1;
		}
		ws->ws_load_interval_secs = (uint32_t)it->valuedouble;
	}
	/* Kept for GET /workers; registry_add drops the key from its copy. */
	ws->ws_spec = o;
	return 0;
}

static int
admin_spec_from_proto(const Smg__WorkerSpec *p, struct worker_spec *ws,
    char *url_buf, size_t url_len, char *err, size_t errlen)
{
	memset(ws, 0, sizeof(*ws));
	if (registry_normalize_url(p->url, url_buf, url_len, err, errlen) == -1)
		return -1;
	if ((int)p->worker_type < 0 || (int)p->worker_type >= BROKER_NTYPES ||
	    (int)p->connection_mode < 0 ||
	    (int)p->connection_mode >= BROKER_NMODES) {
		snprintf(err, errlen, "unknown worker_type or connection_mode");
		return -1;
	}
	ws->ws_url = url_buf;
	ws->ws_model = p->model_id;
	ws->ws_runtime = p->runtime;
	ws->ws_type = (int)p->worker_type;
	ws->ws_mode = (int)p->connection_mode;
	ws->ws_api_key = p->api_key;
	ws->ws_bootstrap_port =
	    p->has_bootstrap_port ? (int32_t)(p->bootstrap_port & 0xffff) : -1;
	ws->ws_priority = p->priority;
	ws->ws_cost = p->cost;
	return 0;
}

/*
 * The worker API's URL rule: 400 invalid_url, worker_url_is_gateway or
 * worker_url_not_allowed, set into r, and -1 when url is refused.
 */
static int
admin_url_allowed(struct broker *br, const char *url, Smg__AdminReply *r)
{
	const struct config *cf = br->br_cf;
	struct urlallow_rule rule;
	char err[SHM_URL_MAX + 128];

	memset(&rule, 0, sizeof(rule));
	rule.ur_self_host = cf->cf_host;
	rule.ur_self_port = cf->cf_port;
	rule.ur_cidrs = br->br_allow;
	rule.ur_ncidrs = br->br_nallow;
	switch (urlallow_check(&rule, url, err, sizeof(err))) {
	case URLALLOW_OK:
		return 0;
	case URLALLOW_INVALID:
		admin_error(r, 400, err, ADMIN_BAD_REQUEST);
		break;
	case URLALLOW_SELF:
		admin_error(r, 400, err, ADMIN_BAD_REQUEST);
		break;
	case URLALLOW_DENIED:
		admin_error(r, 400, err, ADMIN_BAD_REQUEST);
		break;
	}
	log_warnx("%s: refused %s", __func__, err);
	return -1;
}

static void
admin_add(struct broker *br, const Smg__WorkerSpec *spec, Smg__AdminReply *r)
{
	struct worker_spec ws;
	struct worker *w;
	cJSON *root = NULL, *labels = NULL, *o;
	char url[SHM_URL_MAX], err[SHM_URL_MAX + 64], loc[SHM_ID_MAX + 16];
	const char *why, *code;
	size_t i;

	if (spec->spec_json != NULL && *spec->spec_json != '\0') {
		if (admin_parse_spec(spec->spec_json, &root, &ws, url,
		        sizeof(url), &why, &code) == -1) {
			admin_error(r, 400, why, code);
			cJSON_Delete(root);
			return;
		}
	} else {
		if (admin_spec_from_proto(spec, &ws, url, sizeof(url), err,
		        sizeof(err)) == -1) {
			admin_error(r, 400, err, ADMIN_BAD_REQUEST);
			return;
		}
		if (spec->n_labels > 0) {
			labels = cJSON_CreateObject();
			for (i = 0; i < spec->n_labels; i++)
				cJSON_AddStringToObject(labels,
				    spec->labels[i]->key,
				    spec->labels[i]->value);
			ws.ws_labels = labels;
		}
	}
	if (admin_url_allowed(br, url, r) == -1) {
		cJSON_Delete(root);
		cJSON_Delete(labels);
		return;
	}
	if ((w = registry_add(br, &ws, true, &why)) == NULL) {
		if (strcmp(why, "exists") == 0) {
			/* The URL itself, or its data-parallel ranks. */
			if ((w = registry_find(br, url)) == NULL)
				(void)registry_find_ranks(br, url, &w, 1);
			snprintf(admin_errbuf, sizeof(admin_errbuf),
			    "Worker already exists at URL '%s' with ID %s. Use "
			    "PUT /workers/%s to replace or PATCH /workers/%s "
			    "to "
			    "update.",
			    url, w->wk_id, w->wk_id, w->wk_id);
			admin_error(r, 409, admin_errbuf, ADMIN_EXISTS);
		} else
			admin_error(r, 500, "worker table is full",
			    ADMIN_INTERNAL);
		cJSON_Delete(root);
		cJSON_Delete(labels);
		return;
	}
	cJSON_Delete(root);
	cJSON_Delete(labels);
	snprintf(loc, sizeof(loc), "/workers/%s", w->wk_id);
	o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "status", "accepted");
	cJSON_AddStringToObject(o, "worker_id", w->wk_id);
	cJSON_AddStringToObject(o, "url", w->wk_url);
	cJSON_AddStringToObject(o, "location", loc);
	cJSON_AddStringToObject(o, "message",
	    "Worker addition queued for background processing");
	admin_set(r, 202, o);
	r->location = xstrdup(loc);
}

static void
admin_replace(cJSON *o, const char *name, cJSON *item)
{
	cJSON_DeleteItemFromObjectCaseSensitive(o, name);
	cJSON_AddItemToObject(o, name, item);
}

/*
 * WorkerInfo.models: the spec's list with its first id the worker's model
 * (discovery may have named it), else that model alone; [] while unknown.
 */
static cJSON *
admin_models(const struct worker *w)
{
	const cJSON *given =
	    cJSON_GetObjectItemCaseSensitive(w->wk_spec, "models");
	bool known = strcmp(w->wk_model, BROKER_MODEL_UNKNOWN) != 0;
	cJSON *list, *m;

	if (cJSON_IsArray(given) && cJSON_GetArraySize(given) > 0) {
		list = cJSON_Duplicate(given, 1);
		m = cJSON_GetArrayItem(list, 0);
		if (known && m != NULL)
			admin_replace(m, "id", cJSON_CreateString(w->wk_model));
		return list;
	}
	list = cJSON_CreateArray();
	if (known && (m = cJSON_CreateObject()) != NULL) {
		cJSON_AddStringToObject(m, "id", w->wk_model);
		cJSON_AddItemToArray(list, m);
	}
	return list;
}

cJSON *
admin_worker_info(struct broker *br, struct worker *w)
{
	cJSON *o, *job;

	o = w->wk_spec != NULL ? cJSON_Duplicate(w->wk_spec, 1)
	                       : cJSON_CreateObject();
	if (o == NULL)
		return NULL;
	cJSON_DeleteItemFromObjectCaseSensitive(o, "api_key");
	admin_replace(o, "id", cJSON_CreateString(w->wk_id));
	admin_replace(o, "url", cJSON_CreateString(w->wk_url));
	admin_replace(o, "model_id", cJSON_CreateString(w->wk_model));
	admin_replace(o, "worker_type",
	    cJSON_CreateString(registry_type_name(w->wk_type)));
	admin_replace(o, "connection_mode",
	    cJSON_CreateString(registry_mode_name(w->wk_mode)));
	admin_replace(o, "runtime_type",
	    *w->wk_runtime != '\0' ? cJSON_CreateString(w->wk_runtime)
	                           : cJSON_CreateNull());
	admin_replace(o, "labels", cJSON_Duplicate(w->wk_labels, 1));
	admin_replace(o, "priority", cJSON_CreateNumber(w->wk_priority));
	admin_replace(o, "cost", cJSON_CreateNumber(w->wk_cost));
	admin_replace(o, "bootstrap_port",
	    w->wk_bootstrap_port >= 0 ? cJSON_CreateNumber(w->wk_bootstrap_port)
	                              : cJSON_CreateNull());
	admin_replace(o, "is_healthy",
	    cJSON_CreateBool(w->wk_status == SHM_WORKER_READY));
	admin_replace(o, "status",
	    cJSON_CreateString(registry_status_name(w->wk_status)));
	admin_replace(o, "load", cJSON_CreateNumber(live_in_flight(br, w)));
	admin_replace(o, "circuit_breaker_state",
	    cJSON_CreateString(breaker_state_name(w->wk_cb.cb_state)));
	admin_replace(o, "overloaded", cJSON_CreateBool(w->wk_overloaded));
	admin_replace(o, "models", admin_models(w));
	/* A data-parallel rank ("<url>@<rank>", gateway.md §12). */
	if (url_rank(w->wk_url) >= 0) {
		char base[SHM_URL_MAX];

		admin_replace(o, "dp_rank",
		    cJSON_CreateNumber(url_rank(w->wk_url)));
		admin_replace(o, "dp_size",
		    w->wk_dp_size > 0 ? cJSON_CreateNumber(w->wk_dp_size)
		                      : cJSON_CreateNull());
		if (url_rank_base(w->wk_url, base, sizeof(base)) == 0)
			admin_replace(o, "dp_base_url",
			    cJSON_CreateString(base));
	}
	if (!cJSON_IsNumber(
	        cJSON_GetObjectItemCaseSensitive(o, "max_connection_attempts")))
		admin_replace(o, "max_connection_attempts",
		    cJSON_CreateNumber(ADMIN_MAX_CONN_TRIES));
	if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "provider")))
		admin_replace(o, "provider", cJSON_CreateNull());
	/* The background job of this worker, if one is running or failed. */
	job = NULL;
	if (w->wk_status == SHM_WORKER_PENDING ||
	    w->wk_status == SHM_WORKER_FAILED ||
	    w->wk_status == SHM_WORKER_DRAINING) {
		job = cJSON_CreateObject();
		cJSON_AddStringToObject(job, "job_type",
		    w->wk_status == SHM_WORKER_DRAINING ? "RemoveWorker"
		                                        : "AddWorker");
		cJSON_AddStringToObject(job, "status",
		    w->wk_status == SHM_WORKER_FAILED ? "failed" : "pending");
		if (w->wk_error != NULL)
			cJSON_AddStringToObject(job, "message", w->wk_error);
	}
	admin_replace(o, "job_status", job != NULL ? job : cJSON_CreateNull());
	return o;
}

static void
admin_list(struct broker *br, const char *model, Smg__AdminReply *r)
{
	cJSON *o, *arr, *stats;
	unsigned i, counts[BROKER_NTYPES] = { 0 }, n = 0;

	o = cJSON_CreateObject();
	arr = cJSON_AddArrayToObject(o, "workers");
	for (i = 0; i < br->br_nworkers; i++) {
		struct worker *w = br->br_order[i];

		if (model != NULL && *model != '\0' &&
		    strcmp(model, w->wk_model) != 0)
			continue;
		cJSON_AddItemToArray(arr, admin_worker_info(br, w));
		if ((unsigned)w->wk_type < BROKER_NTYPES)
			counts[w->wk_type]++;
		n++;
	}
	cJSON_AddNumberToObject(o, "total", n);
	stats = cJSON_AddObjectToObject(o, "stats");
	cJSON_AddNumberToObject(stats, "prefill_count",
	    counts[SMG__WORKER_TYPE__WORKER_TYPE_PREFILL]);
	cJSON_AddNumberToObject(stats, "decode_count",
	    counts[SMG__WORKER_TYPE__WORKER_TYPE_DECODE]);
	cJSON_AddNumberToObject(stats, "regular_count",
	    counts[SMG__WORKER_TYPE__WORKER_TYPE_REGULAR]);
	admin_set(r, 200, o);
}

static void
admin_not_found(Smg__AdminReply *r, const char *id)
{
	snprintf(admin_errbuf, sizeof(admin_errbuf), "Worker %.256s not found",
	    id);
	admin_error(r, 404, admin_errbuf, ADMIN_NOT_FOUND);
}

static void
admin_get(struct broker *br, const char *id, Smg__AdminReply *r)
{
	struct worker *w;

	if ((w = registry_find(br, id)) == NULL) {
		admin_not_found(r, id);
		return;
	}
	admin_set(r, 200, admin_worker_info(br, w));
}

/*
 * DELETE /workers/{id}: one worker by id or URL; the URL of an engine
 * expanded into data-parallel ranks removes every "<url>@<rank>" worker.
 */
static void
admin_remove(struct broker *br, const char *id, Smg__AdminReply *r)
{
	struct worker *w, *ranks[SHM_MAX_WORKERS];
	unsigned n, i;
	cJSON *o, *ids;

	if ((w = registry_find(br, id)) != NULL) {
		ranks[0] = w;
		n = 1;
	} else if ((n = registry_find_ranks(br, id, ranks, SHM_MAX_WORKERS)) ==
	    0) {
		admin_not_found(r, id);
		return;
	}
	o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "status", "accepted");
	cJSON_AddStringToObject(o, "worker_id", ranks[0]->wk_id);
	if (n > 1 || ranks[0] != w) {
		ids = cJSON_AddArrayToObject(o, "worker_ids");
		for (i = 0; i < n; i++)
			cJSON_AddItemToArray(ids,
			    cJSON_CreateString(ranks[i]->wk_id));
	}
	cJSON_AddStringToObject(o, "message",
	    "Worker removal queued for background processing");
	admin_set(r, 202, o);
	for (i = 0; i < n; i++)
		registry_drain(br, ranks[i]);
}

/* The worker's current fields as a spec (PATCH starts from them). */
static void
admin_spec_of(const struct worker *w, struct worker_spec *ws)
{
	memset(ws, 0, sizeof(*ws));
	ws->ws_url = w->wk_url;
	ws->ws_model = w->wk_model;
	ws->ws_type = w->wk_type;
	ws->ws_mode = w->wk_mode;
	ws->ws_bootstrap_port = w->wk_bootstrap_port;
	ws->ws_priority = w->wk_priority;
	ws->ws_cost = w->wk_cost;
	ws->ws_labels = w->wk_labels;
	ws->ws_health_disabled = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(
	    cJSON_GetObjectItemCaseSensitive(w->wk_spec, "health"),
	    "disable_health_check"));
	ws->ws_ov_waiting = w->wk_ov_waiting;
	ws->ws_ov_token_usage = w->wk_ov_token_usage;
}

/*
 * PATCH: SMG's WorkerUpdateRequest (priority, cost, labels merged,
 * api_key, health merged) onto ws and spec (w's spec, edited in place).
 */
static int
admin_patch(struct worker *w, const cJSON *o, struct worker_spec *ws,
    cJSON *spec, const char **err)
{
	const cJSON *it, *sub;
	cJSON *labels, *health;

	(void)w;
	if (!cJSON_IsObject(o)) {
		*err = "request body must be a JSON object";
		return -1;
	}
	if ((it = cJSON_GetObjectItemCaseSensitive(o, "priority")) != NULL &&
	    !cJSON_IsNull(it)) {
		if (!cJSON_IsNumber(it) || it->valuedouble < 0 ||
		    it->valuedouble > 4294967295.0 ||
		    it->valuedouble != floor(it->valuedouble)) {
			*err = "priority must be an unsigned 32-bit integer";
			return -1;
		}
		ws->ws_priority = (uint32_t)it->valuedouble;
		admin_replace(spec, "priority",
		    cJSON_CreateNumber(ws->ws_priority));
	}
	if ((it = cJSON_GetObjectItemCaseSensitive(o, "cost")) != NULL &&
	    !cJSON_IsNull(it)) {
		if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble)) {
			*err = "cost must be a number";
			return -1;
		}
		ws->ws_cost = it->valuedouble;
		admin_replace(spec, "cost", cJSON_CreateNumber(ws->ws_cost));
	}
	if ((it = cJSON_GetObjectItemCaseSensitive(o, "api_key")) != NULL &&
	    !cJSON_IsNull(it)) {
		if (!cJSON_IsString(it) ||
		    strlen(it->valuestring) >= SHM_KEY_MAX) {
			*err = "api_key must be a string";
			return -1;
		}
		ws->ws_api_key = it->valuestring;
	}
	if ((it = cJSON_GetObjectItemCaseSensitive(o, "labels")) != NULL &&
	    !cJSON_IsNull(it)) {
		if (!cJSON_IsObject(it)) {
			*err = "labels must be an object of strings";
			return -1;
		}
		labels = cJSON_Duplicate(ws->ws_labels, 1);
		cJSON_ArrayForEach(sub, it)
		{
			if (!cJSON_IsString(sub)) {
				cJSON_Delete(labels);
				*err = "labels must be an object of strings";
				return -1;
			}
			admin_replace(labels, sub->string,
			    cJSON_CreateString(sub->valuestring));
		}
		admin_replace(spec, "labels", labels);
		ws->ws_labels = labels;
	}
	if ((it = cJSON_GetObjectItemCaseSensitive(o, "health")) != NULL &&
	    !cJSON_IsNull(it)) {
		if (!cJSON_IsObject(it)) {
			*err = "health must be an object";
			return -1;
		}
		sub = cJSON_GetObjectItemCaseSensitive(it,
		    "disable_health_check");
		if (sub != NULL && !cJSON_IsNull(sub) && !cJSON_IsBool(sub)) {
			*err = "health.disable_health_check must be a boolean";
			return -1;
		}
		health = cJSON_GetObjectItemCaseSensitive(spec, "health");
		if (!cJSON_IsObject(health)) {
			health = cJSON_CreateObject();
			admin_replace(spec, "health", health);
		}
		cJSON_ArrayForEach(sub, it)
		{
			if (!cJSON_IsNull(sub))
				admin_replace(health, sub->string,
				    cJSON_Duplicate(sub, 1));
		}
		ws->ws_health_disabled =
		    cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(health,
		        "disable_health_check"));
	}
	return 0;
}

/*
 * PUT (the whole WorkerSpec, same url) and PATCH of gateway.md §3.3. The
 * broker applies the change at once; 202 as SMG answers for its job.
 */
static void
admin_update(struct broker *br, const Smg__WorkerUpdate *u, Smg__AdminReply *r)
{
	struct worker_spec ws;
	struct worker *w;
	cJSON *root = NULL, *spec = NULL, *o;
	char url[SHM_URL_MAX];
	const char *why, *code;

	if (u->id == NULL || (w = registry_find(br, u->id)) == NULL) {
		admin_not_found(r, u->id != NULL ? u->id : "");
		return;
	}
	if (u->partial) {
		admin_spec_of(w, &ws);
		spec = w->wk_spec != NULL ? cJSON_Duplicate(w->wk_spec, 1)
		                          : cJSON_CreateObject();
		root = cJSON_Parse(u->spec_json != NULL ? u->spec_json : "");
		if (root == NULL) {
			admin_error(r, 400, "request body is not valid JSON",
			    ADMIN_BAD_REQUEST);
			cJSON_Delete(spec);
			return;
		}
		if (admin_patch(w, root, &ws, spec, &why) == -1) {
			admin_error(r, 400, why, ADMIN_BAD_REQUEST);
			cJSON_Delete(root);
			cJSON_Delete(spec);
			return;
		}
		ws.ws_spec = spec;
	} else {
		if (admin_parse_spec(u->spec_json != NULL ? u->spec_json : "",
		        &root, &ws, url, sizeof(url), &why, &code) == -1) {
			admin_error(r, 400, why, code);
			cJSON_Delete(root);
			return;
		}
		if (strcmp(url, w->wk_url) != 0) {
			snprintf(admin_errbuf, sizeof(admin_errbuf),
			    "URL mismatch: worker has URL '%s' but request "
			    "body "
			    "has '%s'. URL changes are not supported via PUT. "
			    "Use DELETE + POST instead.",
			    w->wk_url, url);
			admin_error(r, 400, admin_errbuf, ADMIN_BAD_REQUEST);
			cJSON_Delete(root);
			return;
		}
	}
	registry_update(br, w, &ws);
	cJSON_Delete(root);
	cJSON_Delete(spec);
	o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "status", "accepted");
	cJSON_AddStringToObject(o, "worker_id", w->wk_id);
	cJSON_AddStringToObject(o, "message",
	    "Worker update queued for background processing");
	admin_set(r, 202, o);
}

void
admin_handle(struct broker *br, const Smg__AdminRequest *req,
    Smg__AdminReply *reply)
{
	smg__admin_reply__init(reply);
	switch (req->op_case) {
	case SMG__ADMIN_REQUEST__OP_ADD_WORKER:
		admin_add(br, req->add_worker, reply);
		break;
	case SMG__ADMIN_REQUEST__OP_REMOVE_WORKER:
		admin_remove(br, req->remove_worker, reply);
		break;
	case SMG__ADMIN_REQUEST__OP_LIST_WORKERS:
		admin_list(br, req->list_workers, reply);
		break;
	case SMG__ADMIN_REQUEST__OP_GET_WORKER:
		admin_get(br, req->get_worker, reply);
		break;
	case SMG__ADMIN_REQUEST__OP_UPDATE_WORKER:
		admin_update(br, req->update_worker, reply);
		break;
	default:
		admin_error(reply, 400, "unknown admin operation",
		    ADMIN_BAD_REQUEST);
		break;
	}
}
