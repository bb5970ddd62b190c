/*
 * router.c: the route table. Every complete request a connection reads
 * comes here (conn_set_dispatcher) and goes to the one module that owns
 * its route: the inference paths (through admission.c to proxy.c, pd.c),
 * the gateway's own endpoints (endpoints.c), the fan-outs (fanout.c) and
 * the worker API (workerapi.c). Limits that hold for every route are
 * checked first. A known route asked with another method answers 405 with
 * Allow; the routes of SMG subsystems this gateway does not have answer
 * 501 naming the subsystem.
 *
 * Who may do what is decided here, through auth.c: CORS preflights first
 * (browsers send them without credentials), then the data plane
 * (inference, model listing: any principal) and the control plane (worker
 * API, /flush_cache, /get_loads: admin). Every request gets its context
 * (reqctx.c: principal, tenant, trace) before it goes on.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "frontend/frontend.h"
#include "shared/log.h"

/* SMG routes of subsystems this gateway does not have (answer 501). */
struct router_absent {
	const char *ra_path;
	bool ra_prefix; /* also ra_path + "/..." */
	const char *ra_subsystem;
};

static const struct router_absent router_absent_routes[] = {
	{ "/v1/responses/", false, "response storage" }, /* by id: stored */
	{ "/v1/conversations", true, "response storage" },
	{ "/v1/interactions", true, "response storage (interactions)" },
	{ "/v1/tokenize", false, "a tokenizer (it routes HTTP workers)" },
	{ "/v1/detokenize", false, "a tokenizer (it routes HTTP workers)" },
	{ "/v1/tokenizers", true, "a tokenizer (it routes HTTP workers)" },
	{ "/parse", true, "the gRPC parsers" },
	{ "/wasm", true, "WASM" },
	{ "/v1/realtime", true, "WebRTC (realtime)" },
	{ "/mcp", true, "MCP" },
	{ "/ha", true, "mesh" },
};

/* Routes answered for one method only: 405 with Allow otherwise. */
struct router_known {
	const char *rk_path;
	const char *rk_allow;
};

static const struct router_known router_known_routes[] = {
	{ "/health", "GET" },
	{ "/liveness", "GET" },
	{ "/readiness", "GET" },
	{ "/health_generate", "GET" },
	{ "/v1/models", "GET" },
	{ "/get_model_info", "GET" },
	{ "/get_server_info", "GET" },
	{ "/get_loads", "GET" },
	{ "/engine_metrics", "GET" },
	{ "/flush_cache", "POST" },
	{ "/start_profile", "POST" },
	{ "/stop_profile", "POST" },
};

static const char *router_absent_subsystem(const char *);
static const char *router_known_allow(const char *);
static enum fanout_kind router_fanout_kind(const char *);
static void router_serve(struct conn *, const struct http_request *,
    enum extract_endpoint, const char *);
static void router_deny(struct conn *, enum auth_verdict, const char *,
    const char *, const char *);

static const char *
router_absent_subsystem(const char *path)
{
	const struct router_absent *ra;
	size_t i, n;

	for (i = 0;
	     i < sizeof(router_absent_routes) / sizeof(router_absent_routes[0]);
	     i++) {
		ra = &router_absent_routes[i];
		n = strlen(ra->ra_path);
		if (ra->ra_path[n - 1] == '/') {
			if (strncmp(path, ra->ra_path, n) == 0 &&
			    path[n] != '\0')
				return ra->ra_subsystem;
		} else if (strncmp(path, ra->ra_path, n) == 0 &&
		    (path[n] == '\0' || (ra->ra_prefix && path[n] == '/')))
			return ra->ra_subsystem;
	}
	return NULL;
}

static enum fanout_kind
router_fanout_kind(const char *path)
{
	if (strcmp(path, "/flush_cache") == 0)
		return FANOUT_FLUSH;
	if (strcmp(path, "/get_loads") == 0)
		return FANOUT_LOADS;
	if (strcmp(path, "/engine_metrics") == 0)
		return FANOUT_ENGINE_METRICS;
	if (strcmp(path, "/start_profile") == 0)
		return FANOUT_START_PROFILE;
	return FANOUT_STOP_PROFILE;
}

static const char *
router_known_allow(const char *path)
{
	size_t i;

	for (i = 0;
	     i < sizeof(router_known_routes) / sizeof(router_known_routes[0]);
	     i++) {
		if (strcmp(path, router_known_routes[i].rk_path) == 0)
			return router_known_routes[i].rk_allow;
	}
	return NULL;
}

/* An admitted inference request goes to its path (admission.c). */
static void
router_serve(struct conn *c, const struct http_request *hr,
    enum extract_endpoint ep, const char *id)
{
	if (pd_enabled())
		pd_start(c, hr, ep, id);
	else
		proxy_start(c, hr, ep, id);
}

/*
 * The control plane (worker API, /flush_cache, /get_loads, profiling)
 * changes what the gateway routes to: with no credential configured to
 * check it is open only to clients on this host.
 */
static bool
router_admin_allowed(const struct conn *c)
{
	const struct config *cf = fe->fe_cf;

	return (cf->cf_api_key != NULL && cf->cf_api_key[0] != '\0') ||
	    cf->cf_control_plane_api_keys_n > 0 ||
	    (cf->cf_jwt_issuer != NULL && cf->cf_jwt_issuer[0] != '\0') ||
	    conn_peer_loopback(c);
}

/*
 * 401 (with WWW-Authenticate for realm) or 403, in the gateway's error
 * shape; the CORS lines already set stay.
 */
static void
router_deny(struct conn *c, enum auth_verdict v, const char *why,
    const char *realm, const char *id)
{
	struct http_out *o = conn_out(c);
	const char *cors = o->ho_extra;
	char *lines;
	size_t n;

	if (v == AUTH_FORBIDDEN) {
		conn_error(c, 403, "forbidden", why, id, 0);
		return;
	}
	n = (cors != NULL ? strlen(cors) : 0) + strlen(realm) + 64;
	if ((lines = conn_alloc(c, n)) != NULL) {
		snprintf(lines, n,
		    "%sWWW-Authenticate: Bearer realm=\"%s\"\r\n",
		    cors != NULL ? cors : "", realm);
		http_out_extra(o, lines);
	}
	conn_error(c, 401, "unauthorized", why, id, 0);
}

static void
router_dispatch(struct conn *c, const struct http_request *hr,
    enum listener_kind kind)
{
	const struct config *cf = fe->fe_cf;
	enum extract_endpoint ep;
	const char *path = hr->hr_path;
	char id[EXTRACT_REQUEST_ID_MAX + 1], labels[128], msg[FE_MSG_MAX];
	const char *allow, *subsystem;
	enum auth_verdict v;
	struct reqctx *rx;
	bool get = hr->hr_method == HTTP_GET, post = hr->hr_method == HTTP_POST;

	extract_request_id(hr, (const char *const *)cf->cf_request_id_headers,
	    cf->cf_request_id_headers_n, path, id, sizeof(id));
	snprintf(labels, sizeof(labels), "method=\"%s\",path=\"%s\"",
	    stats_method_label(hr), stats_path_label(path));
	stats_add("smg_http_requests_total", labels, 1);
	/* One bound for every route: targets are relayed and logged whole. */
	if (hr->hr_path_len + hr->hr_query_len + 1 >= FE_TARGET_MAX) {
		conn_error(c, 414, "uri_too_long", "Request target too long",
		    id, 0);
		return;
	}

	if (kind == LISTENER_METRICS) {
		if (get && strcmp(path, "/metrics") == 0)
			endpoint_metrics(c);
		else
			conn_error(c, 404, "not_found", "Not found", id, 0);
		return;
	}
	if (get &&
	    (strcmp(path, "/health") == 0 || strcmp(path, "/liveness") == 0)) {
		conn_respond(c, 200, "text/plain; charset=utf-8", "OK",
		    strlen("OK"), id);
		return;
	}
	if (get && strcmp(path, "/readiness") == 0) {
		endpoint_readiness(c, id);
		return;
	}
	if (kind == LISTENER_HEALTH) {
		if (strcmp(path, "/health") == 0 ||
		    strcmp(path, "/liveness") == 0 ||
		    strcmp(path, "/readiness") == 0)
			conn_method_not_allowed(c, "GET", id);
		else
			conn_error(c, 404, "not_found", "Not found", id, 0);
		return;
	}
	if (cors_preflight(c, hr, id))
		return;
	if ((rx = reqctx_get(c, hr)) == NULL) {
		conn_error(c, 503, "out_of_memory", "Out of memory", id, 0);
		return;
	}
	trace_start(c, hr, rx, id);
	http_out_extra(conn_out(c), cors_lines(c, hr));
	if (hdr_is_looped(hr)) {
		conn_error(c, 508, "loop_detected",
		    "Request loop: it already passed through this gateway", id,
		    0);
		return;
	}
	if (get && strcmp(path, "/v1/models") == 0) {
		if ((v = auth_data_plane(hr, rx, msg, sizeof(msg))) !=
		    AUTH_ALLOW) {
			router_deny(c, v, msg, "data-plane", id);
			return;
		}
		endpoint_models(c, id);
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
		endpoint_first_ready(c, hr, id);
		return;
	}
	if (get && strcmp(path, "/engine_metrics") == 0) {
		/* Public, as /metrics is (gateway.md §3.2). */
		fanout_start(c, hr, FANOUT_ENGINE_METRICS, id);
		return;
	}
	if (extract_route(path, &ep) == 0) {
		if (!post) {
			conn_method_not_allowed(c, "POST", id);
			return;
		}
		if ((v = auth_data_plane(hr, rx, msg, sizeof(msg))) !=
		    AUTH_ALLOW) {
			router_deny(c, v, msg, "data-plane", id);
			return;
		}
		admission_start(c, hr, ep, id, router_serve);
		return;
	}
	if ((post && strcmp(path, "/flush_cache") == 0) ||
	    (get && strcmp(path, "/get_loads") == 0) ||
	    (post && strcmp(path, "/start_profile") == 0) ||
	    (post && strcmp(path, "/stop_profile") == 0) ||
	    strcmp(path, "/workers") == 0 ||
	    strncmp(path, "/workers/", 9) == 0) {
		if ((v = auth_control_plane(hr, id, rx, msg, sizeof(msg))) !=
		    AUTH_ALLOW) {
			router_deny(c, v, msg, "control-plane", id);
			return;
		}
		if (!router_admin_allowed(c)) {
			conn_error(c, 403, "admin_loopback_only",
			    "Without --api-key the control plane answers only "
			    "on loopback",
			    id, 0);
			return;
		}
		if (path[1] == 'w')
			workerapi_start(c, hr, id);
		else
			fanout_start(c, hr, router_fanout_kind(path), id);
		return;
	}
	if ((allow = router_known_allow(path)) != NULL) {
		conn_method_not_allowed(c, allow, id);
		return;
	}
	if ((subsystem = router_absent_subsystem(path)) != NULL) {
		snprintf(msg, sizeof(msg),
		    "%s is not available: this gateway has no %s", path,
		    subsystem);
		conn_error(c, 501, "not_implemented", msg, id, 0);
		return;
	}
	conn_error(c, 404, "not_found", "Not found", id, 0);
}

const struct conn_routes router_routes = {
	.cr_dispatch = router_dispatch,
	.cr_stream_wanted = proxy_stream_wanted,
};
