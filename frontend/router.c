/*
 * router.c: the route table. Every complete request a connection reads
 * comes here (conn_set_dispatcher) and goes to the one module that owns
 * its route: the inference paths (proxy.c, pd.c), the gateway's own
 * endpoints (endpoints.c), the fan-outs (fanout.c) and the worker API
 * (workerapi.c). Limits that hold for every route are checked first.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "frontend/frontend.h"
#include "shared/log.h"
#include "shared/secret.h"

static bool
router_authorized(const struct http_request *hr)
{
	const char *key = fe->fe_cf->cf_api_key;
	const struct http_header *h;

	if (key == NULL || key[0] == '\0')
		return true;
	if ((h = http_request_header(hr, "authorization")) == NULL)
		return false;
	return h->hh_value_len >= 7 &&
	    strncasecmp(h->hh_value, "Bearer ", 7) == 0 &&
	    secret_equal(key, h->hh_value + 7, h->hh_value_len - 7);
}

static void
router_dispatch(struct conn *c, const struct http_request *hr,
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
		conn_error(c, 404, "not_found", "Not found", id, 0);
		return;
	}
	if (hdr_is_looped(hr)) {
		conn_error(c, 508, "loop_detected",
		    "Request loop: it already passed through this gateway", id,
		    0);
		return;
	}
	if (get && strcmp(path, "/v1/models") == 0) {
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
	if (extract_route(path, &ep) == 0) {
		if (!post) {
			conn_error(c, 405, "method_not_allowed",
			    "Method not allowed", id, 0);
			return;
		}
		if (!router_authorized(hr)) {
			conn_error(c, 401, "unauthorized",
			    "Invalid or missing API key", id, 0);
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
		if (!router_authorized(hr)) {
			conn_error(c, 401, "unauthorized",
			    "Invalid or missing API key", id, 0);
			return;
		}
		if (path[1] == 'f')
			fanout_start(c, hr, FANOUT_FLUSH, id);
		else if (path[1] == 'g')
			fanout_start(c, hr, FANOUT_LOADS, id);
		else
			workerapi_start(c, hr, id);
		return;
	}
	conn_error(c, 404, "not_found", "Not found", id, 0);
}

const struct conn_routes router_routes = {
	.cr_dispatch = router_dispatch,
	.cr_stream_wanted = proxy_stream_wanted,
};
