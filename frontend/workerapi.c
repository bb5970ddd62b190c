/*
 * workerapi.c: the worker API of gateway.md §3.3 (/workers,
 * /workers/{id}), executed by the broker: the request becomes an
 * AdminRequest, the broker's reply is returned verbatim. Worker ids are
 * UUIDs: another id is refused here with SMG's 400 BAD_REQUEST.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "frontend/frontend.h"
#include "shared/ipc.h"
#include "shared/log.h"
#include "shared/uuid.h"

struct admin_ctx {
	struct conn *ac_conn;
	const struct http_request *ac_hr;
	char ac_id[EXTRACT_REQUEST_ID_MAX + 1];
};

static void admin_reply(void *, int, const uint8_t *, size_t);
static void admin_detach(void *);

/* Worker-service error body of gateway.md §3.3. */
static void
workerapi_err(struct conn *c, int status, const char *code, const char *msg,
    const char *id)
{
	cJSON *j = cJSON_CreateObject();

	cJSON_AddStringToObject(j, "error", msg);
	cJSON_AddStringToObject(j, "code", code);
	conn_json(c, status, j, id);
}

static int
workerapi_hexval(int ch)
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
workerapi_unescape(const char *s, size_t len, char *out, size_t outlen)
{
	size_t i, n = 0;
	int hi, lo;

	for (i = 0; i < len && n + 1 < outlen; i++) {
		if (s[i] == '%' && i + 2 < len &&
		    (hi = workerapi_hexval((unsigned char)s[i + 1])) != -1 &&
		    (lo = workerapi_hexval((unsigned char)s[i + 2])) != -1) {
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
workerapi_query_param(const struct http_request *hr, const char *name,
    char *out, size_t outlen)
{
	const char *q = hr->hr_query, *amp, *eq;
	size_t nlen = strlen(name), plen;

	while (q != NULL && *q != '\0') {
		amp = strchr(q, '&');
		plen = amp != NULL ? (size_t)(amp - q) : strlen(q);
		eq = memchr(q, '=', plen);
		if (eq != NULL && (size_t)(eq - q) == nlen &&
		    strncmp(q, name, nlen) == 0) {
			workerapi_unescape(eq + 1, plen - nlen - 1, out,
			    outlen);
			return true;
		}
		q = amp != NULL ? amp + 1 : NULL;
	}
	return false;
}

void
workerapi_start(struct conn *c, const struct http_request *hr, const char *id)
{
	Smg__AdminRequest ar = SMG__ADMIN_REQUEST__INIT;
	Smg__WorkerSpec ws = SMG__WORKER_SPEC__INIT;
	Smg__WorkerUpdate wu = SMG__WORKER_UPDATE__INIT;
	struct admin_ctx *ac;
	char arg[SHM_URL_MAX * 2], *body = NULL;
	const char *path = hr->hr_path;
	bool collection = strcmp(path, "/workers") == 0;
	cJSON *j, *u;

	if (!collection) {
		workerapi_unescape(path + 9, strlen(path + 9), arg,
		    sizeof(arg));
		if (!uuid_valid(arg)) {
			char msg[FE_MSG_MAX];

			snprintf(msg, sizeof(msg),
			    "Invalid worker_id '%.200s' (expected UUID). "
			    "Error: "
			    "not a UUID",
			    arg);
			workerapi_err(c, 400, "BAD_REQUEST", msg, id);
			return;
		}
	}
	if (collection && hr->hr_method == HTTP_POST) {
		j = cJSON_ParseWithLength(hr->hr_body, hr->hr_body_len);
		u = cJSON_GetObjectItemCaseSensitive(j, "url");
		if (!cJSON_IsObject(j) || !cJSON_IsString(u)) {
			cJSON_Delete(j);
			workerapi_err(c, 400, "BAD_REQUEST",
			    "Body must be a JSON object with a string \"url\"",
			    id);
			return;
		}
		snprintf(arg, sizeof(arg), "%s", u->valuestring);
		cJSON_Delete(j);
		if ((body = strndup(hr->hr_body, hr->hr_body_len)) == NULL) {
			conn_error(c, 503, "out_of_memory", "Out of memory", id,
			    0);
			return;
		}
		ws.url = arg;
		ws.spec_json = body;
		ar.op_case = SMG__ADMIN_REQUEST__OP_ADD_WORKER;
		ar.add_worker = &ws;
	} else if (collection && hr->hr_method == HTTP_GET) {
		if (!workerapi_query_param(hr, "model", arg, sizeof(arg)))
			arg[0] = '\0';
		ar.op_case = SMG__ADMIN_REQUEST__OP_LIST_WORKERS;
		ar.list_workers = arg;
	} else if (collection && hr->hr_method == HTTP_DELETE &&
	    workerapi_query_param(hr, "url", arg, sizeof(arg))) {
		ar.op_case = SMG__ADMIN_REQUEST__OP_REMOVE_WORKER;
		ar.remove_worker = arg;
	} else if (!collection && hr->hr_method == HTTP_GET) {
		ar.op_case = SMG__ADMIN_REQUEST__OP_GET_WORKER;
		ar.get_worker = arg;
	} else if (!collection && hr->hr_method == HTTP_DELETE) {
		ar.op_case = SMG__ADMIN_REQUEST__OP_REMOVE_WORKER;
		ar.remove_worker = arg;
	} else if (!collection &&
	    (hr->hr_method == HTTP_PUT || hr->hr_method == HTTP_PATCH)) {
		if ((body = strndup(hr->hr_body, hr->hr_body_len)) == NULL) {
			conn_error(c, 503, "out_of_memory", "Out of memory", id,
			    0);
			return;
		}
		wu.id = arg;
		wu.spec_json = body;
		wu.partial = hr->hr_method == HTTP_PATCH;
		ar.op_case = SMG__ADMIN_REQUEST__OP_UPDATE_WORKER;
		ar.update_worker = &wu;
	} else {
		router_method_not_allowed(c,
		    collection ? "GET, POST, DELETE"
		               : "GET, PUT, PATCH, DELETE",
		    id);
		return;
	}
	if ((ac = calloc(1, sizeof(*ac))) == NULL) {
		free(body);
		conn_error(c, 503, "out_of_memory", "Out of memory", id, 0);
		return;
	}
	ac->ac_conn = c;
	ac->ac_hr = hr;
	snprintf(ac->ac_id, sizeof(ac->ac_id), "%s", id);
	/* No live broker process: answer now, not after FE_ADMIN_TIMEOUT_MS
	 * (the timeout stays for a broker alive but slow). */
	if (!hostsync_broker_alive() ||
	    decide_admin(&ar, admin_reply, ac) == -1) {
		free(ac);
		free(body);
		workerapi_err(c, 503, "broker_unavailable",
		    "The control plane is unavailable", id);
		return;
	}
	free(body);
	if (conn_on_end(c, admin_detach, ac) == -1) {
		/* The reply still comes and frees ac; nobody waits for it. */
		ac->ac_conn = NULL;
		conn_error(c, 503, "out_of_memory", "Out of memory", id, 0);
	}
}

/* The request ended (answered or the client gone): the broker's reply
 * still comes, and frees ac. */
static void
admin_detach(void *arg)
{
	struct admin_ctx *ac = arg;

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
		workerapi_err(c, 503, "broker_unavailable",
		    "The control plane is unavailable", ac->ac_id);
		free(ac);
		return;
	}
	body = r->admin->body_json != NULL ? r->admin->body_json : "";
	blen = strlen(body);
	o = conn_response(c, (int)r->admin->http_status);
	http_out_header(o, "content-type", "application/json");
	http_out_headerf(o, "content-length", "%zu", blen);
	if (r->admin->location != NULL && r->admin->location[0] != '\0')
		http_out_header(o, "location", r->admin->location);
	http_out_header(o, "x-request-id", ac->ac_id);
	http_out_header(o, "connection",
	    conn_keep_alive(c) ? "keep-alive" : "close");
	http_out_end_head(o);
	http_out_append(o, body, blen);
	smg__broker_reply__free_unpacked(r, NULL);
	conn_request_done(c);
	free(ac);
}
