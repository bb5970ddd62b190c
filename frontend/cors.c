/*
 * cors.c: CORS for browser clients (--cors-allowed-origins). Responses to
 * an allowed Origin carry Access-Control-Allow-Origin (that origin) and
 * expose x-request-id, streamed ones included (the header lines go into
 * every head through http_out_extra); preflights are answered here, before
 * authentication, since browsers send them without credentials. Origins
 * not listed get no CORS header at all. Without the flag nothing changes.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "frontend/frontend.h"

#define CORS_METHODS "GET, POST, PATCH, DELETE, OPTIONS"
#define CORS_HEADERS "content-type, authorization"
#define CORS_MAX_AGE "3600"

static const struct http_header *cors_origin(const struct http_request *);

/* The request's Origin when it is one of the listed ones, else NULL. */
static const struct http_header *
cors_origin(const struct http_request *hr)
{
	const struct config *cf = fe->fe_cf;
	const struct http_header *h;
	size_t i;

	if (cf->cf_cors_allowed_origins_n == 0 ||
	    (h = http_request_header(hr, "origin")) == NULL ||
	    h->hh_value_len == 0 || h->hh_value_len > 512)
		return NULL;
	for (i = 0; i < cf->cf_cors_allowed_origins_n; i++) {
		const char *o = cf->cf_cors_allowed_origins[i];

		if (strcmp(o, "*") == 0 ||
		    (strlen(o) == h->hh_value_len &&
		        strncasecmp(o, h->hh_value, h->hh_value_len) == 0))
			return h;
	}
	return NULL;
}

bool
cors_preflight(struct conn *c, const struct http_request *hr,
    const char *request_id)
{
	const struct http_header *h;
	struct http_out *o;

	if (fe->fe_cf->cf_cors_allowed_origins_n == 0 ||
	    hr->hr_method != HTTP_OPTIONS ||
	    http_request_header(hr, "origin") == NULL ||
	    http_request_header(hr, "access-control-request-method") == NULL)
		return false;
	o = conn_response(c, 204);
	if ((h = cors_origin(hr)) != NULL) {
		http_out_headerf(o, "Access-Control-Allow-Origin", "%.*s",
		    (int)h->hh_value_len, h->hh_value);
		http_out_header(o, "Access-Control-Allow-Methods",
		    CORS_METHODS);
		http_out_header(o, "Access-Control-Allow-Headers",
		    CORS_HEADERS);
		http_out_header(o, "Access-Control-Max-Age", CORS_MAX_AGE);
	}
	http_out_header(o, "Vary",
	    "Origin, Access-Control-Request-Method, "
	    "Access-Control-Request-Headers");
	if (request_id != NULL)
		http_out_header(o, "x-request-id", request_id);
	http_out_header(o, "Content-Length", "0");
	http_out_header(o, "Connection",
	    conn_keep_alive(c) ? "keep-alive" : "close");
	/* Its lines are written here already; none again from the extra. */
	http_out_extra(o, NULL);
	http_out_end_head(o);
	conn_request_done(c);
	return true;
}

char *
cors_lines(struct conn *c, const struct http_request *hr)
{
	const struct http_header *h;
	char *buf;
	size_t n;

	if ((h = cors_origin(hr)) == NULL)
		return NULL;
	n = h->hh_value_len + 160;
	if ((buf = conn_alloc(c, n)) == NULL)
		return NULL;
	snprintf(buf, n,
	    "Access-Control-Allow-Origin: %.*s\r\nVary: Origin\r\n"
	    "Access-Control-Expose-Headers: x-request-id\r\n",
	    (int)h->hh_value_len, h->hh_value);
	return buf;
}
