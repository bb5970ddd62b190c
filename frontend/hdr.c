/*
 * hdr.c: which headers cross the gateway (gateway.md §3.4): the client
 * headers forwarded to a worker, and the worker response head relayed to
 * the client with the gateway's own headers added.
 *
 * Every request sent to a worker carries Via (RFC 9110 §7.6.3): the
 * client's Via list, then this gateway's "1.1 smg-c-<id>". The id is the
 * same in every frontend of one gateway (a hash of host name, listening
 * address and run dir), so a request that comes back to the gateway, by
 * itself or through other proxies that keep Via, is recognised and cut
 * (hdr_is_looped) instead of recursing.
 */
#define _GNU_SOURCE /* memmem */
#include <unistd.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <xxhash.h>

#include "frontend/frontend.h"

static bool hdr_eq(const char *, size_t, const char *);
static bool hdr_value_ok(const char *, size_t);
static bool hdr_name_ok(const char *, size_t);
static bool hdr_via_has(const char *, size_t, const char *, size_t);
static size_t hdr_via_value(const struct http_request *, char *, size_t);

/* "smg-c-" and 16 hex digits; "1.1 " before it in Via. */
static char hdr_via_id[32];
static size_t hdr_via_id_len;
/* The Via value of the last hdr_upstream call. */
static char hdr_via_buf[HDR_VIA_MAX];

static const char *const hdr_hop[] = {
	"connection",
	"keep-alive",
	"proxy-authenticate",
	"proxy-authorization",
	"te",
	"trailers",
	"trailer",
	"transfer-encoding",
	"upgrade",
	"content-encoding",
	"host",
};

static const char *const hdr_fwd[] = {
	"authorization",
	"x-request-id",
	"x-correlation-id",
	"traceparent",
	"tracestate",
	"x-smg-routing-key",
};

static bool
hdr_eq(const char *name, size_t len, const char *lit)
{
	return strlen(lit) == len && strncasecmp(name, lit, len) == 0;
}

static bool
hdr_value_ok(const char *v, size_t len)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (v[i] == '\r' || v[i] == '\n' || v[i] == '\0')
			return false;
	return true;
}

static bool
hdr_name_ok(const char *nm, size_t len)
{
	static const char tchar[] = "!#$%&'*+-.^_`|~";
	size_t i;
	unsigned char ch;

	if (len == 0)
		return false;
	for (i = 0; i < len; i++) {
		ch = (unsigned char)nm[i];
		if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') ||
		        (ch >= 'A' && ch <= 'Z') ||
		        (ch != 0 && strchr(tchar, ch) != NULL)))
			return false;
	}
	return true;
}

void
hdr_init(const struct config *cf)
{
	char host[256], key[1024];
	int n;

	if (gethostname(host, sizeof(host)) == -1)
		host[0] = '\0';
	host[sizeof(host) - 1] = '\0';
	n = snprintf(key, sizeof(key), "%s|%s|%ld|%s", host,
	    cf->cf_host != NULL ? cf->cf_host : "", cf->cf_port,
	    cf->cf_run_dir != NULL ? cf->cf_run_dir : "");
	if (n < 0 || (size_t)n >= sizeof(key))
		n = (int)strlen(key);
	snprintf(hdr_via_id, sizeof(hdr_via_id), "smg-c-%016llx",
	    (unsigned long long)XXH3_64bits(key, (size_t)n));
	hdr_via_id_len = strlen(hdr_via_id);
}

const char *
hdr_via_token(void)
{
	return hdr_via_id;
}

/*
 * Whether the Via value v lists a hop whose received-by is id: a list
 * member "<protocol> <id>" followed by the end, ',', or a comment.
 */
static bool
hdr_via_has(const char *v, size_t len, const char *id, size_t idlen)
{
	const char *p = v, *end = v + len, *hit;
	char after;

	while (p < end &&
	    (hit = memmem(p, (size_t)(end - p), id, idlen)) != NULL) {
		after = hit + idlen < end ? hit[idlen] : ',';
		if (hit > v && (hit[-1] == ' ' || hit[-1] == '\t') &&
		    (after == ',' || after == ' ' || after == '\t' ||
		        after == '('))
			return true;
		p = hit + idlen;
	}
	return false;
}

bool
hdr_is_looped(const struct http_request *req)
{
	size_t i, total = 0;

	if (req == NULL || hdr_via_id_len == 0)
		return false;
	for (i = 0; i < req->hr_nheaders; i++) {
		const struct http_header *h = &req->hr_headers[i];

		if (!hdr_eq(h->hh_name, h->hh_name_len, "via"))
			continue;
		if (hdr_via_has(h->hh_value, h->hh_value_len, hdr_via_id,
		        hdr_via_id_len))
			return true;
		total += h->hh_value_len + 2;
	}
	/* A chain too long to extend is a loop among other proxies. */
	return total + hdr_via_id_len + 8 > HDR_VIA_MAX;
}

bool
hdr_is_hop_by_hop(const char *name, size_t len)
{
	size_t i;

	for (i = 0; i < sizeof(hdr_hop) / sizeof(hdr_hop[0]); i++)
		if (hdr_eq(name, len, hdr_hop[i]))
			return true;
	return false;
}

bool
hdr_is_forwarded(const char *name, size_t len)
{
	static const char prefix[] = "x-request-id-";
	size_t i;

	for (i = 0; i < sizeof(hdr_fwd) / sizeof(hdr_fwd[0]); i++)
		if (hdr_eq(name, len, hdr_fwd[i]))
			return true;
	return len > sizeof(prefix) - 1 &&
	    strncasecmp(name, prefix, sizeof(prefix) - 1) == 0;
}

/*
 * The client's Via values joined with ", ", then ours; 0 when they do not
 * fit (hdr_is_looped refuses such a request before it gets here).
 */
static size_t
hdr_via_value(const struct http_request *req, char *buf, size_t len)
{
	size_t i, n = 0;
	int w;

	for (i = 0; req != NULL && i < req->hr_nheaders; i++) {
		const struct http_header *h = &req->hr_headers[i];

		if (!hdr_eq(h->hh_name, h->hh_name_len, "via") ||
		    h->hh_value_len == 0 ||
		    !hdr_value_ok(h->hh_value, h->hh_value_len))
			continue;
		if (n + h->hh_value_len + 2 >= len)
			return 0;
		memcpy(buf + n, h->hh_value, h->hh_value_len);
		n += h->hh_value_len;
		memcpy(buf + n, ", ", 2);
		n += 2;
	}
	w = snprintf(buf + n, len - n, "1.1 %s", hdr_via_id);
	if (w < 0 || (size_t)w >= len - n)
		return 0;
	return n + (size_t)w;
}

size_t
hdr_upstream(const struct http_request *req, const struct reqctx *rx,
    const char *traceparent, const char *request_id, const char *worker_api_key,
    bool json_body, char *authbuf, size_t authlen, struct upstream_header *out,
    size_t max)
{
	size_t i, n = 0, vlen;
	/* A worker with a key of its own gets that key, never the client's
	 * credentials (which are the gateway's to check). */
	bool own_key = worker_api_key != NULL && worker_api_key[0] != '\0';
	bool have_auth = own_key, own_auth;
	int w;

	/* A credential of the gateway's own stays here; the worker gets its
	 * key instead. */
	own_auth = rx != NULL &&
	    (rx->rc_method == REQCTX_JWT || rx->rc_method == REQCTX_CP_KEY ||
	        rx->rc_method == REQCTX_TENANT_KEY);
	for (i = 0; req != NULL && i < req->hr_nheaders && n < max; i++) {
		const struct http_header *h = &req->hr_headers[i];

		if (!hdr_is_forwarded(h->hh_name, h->hh_name_len))
			continue;
		if (hdr_eq(h->hh_name, h->hh_name_len, "x-request-id"))
			continue;
		/* The trace context continues from the gateway's span. */
		if (rx != NULL && rx->rc_traceparent[0] != '\0' &&
		    (hdr_eq(h->hh_name, h->hh_name_len, "traceparent") ||
		        hdr_eq(h->hh_name, h->hh_name_len, "tracestate")))
			continue;
		if (hdr_eq(h->hh_name, h->hh_name_len, "authorization")) {
			if (have_auth || own_auth)
				continue;
			have_auth = true;
		}
		out[n].uh_name = h->hh_name;
		out[n].uh_name_len = h->hh_name_len;
		out[n].uh_value = h->hh_value;
		out[n].uh_value_len = h->hh_value_len;
		n++;
	}
	if (own_key && n < max) {
		w = snprintf(authbuf, authlen, "Bearer %s", worker_api_key);
		if (w > 0 && (size_t)w < authlen) {
			out[n].uh_name = "authorization";
			out[n].uh_name_len = strlen("authorization");
			out[n].uh_value = authbuf;
			out[n].uh_value_len = (size_t)w;
			n++;
		}
	}
	if (hdr_via_id_len > 0 && n < max &&
	    (vlen = hdr_via_value(req, hdr_via_buf, sizeof(hdr_via_buf))) > 0) {
		out[n].uh_name = "via";
		out[n].uh_name_len = strlen("via");
		out[n].uh_value = hdr_via_buf;
		out[n].uh_value_len = vlen;
		n++;
	}
	if (rx != NULL && rx->rc_traceparent[0] != '\0' && n < max) {
		if (traceparent == NULL || traceparent[0] == '\0')
			traceparent = rx->rc_traceparent;
		out[n].uh_name = "traceparent";
		out[n].uh_name_len = strlen("traceparent");
		out[n].uh_value = traceparent;
		out[n].uh_value_len = strlen(traceparent);
		n++;
		if (rx->rc_tracestate[0] != '\0' && n < max) {
			out[n].uh_name = "tracestate";
			out[n].uh_name_len = strlen("tracestate");
			out[n].uh_value = rx->rc_tracestate;
			out[n].uh_value_len = strlen(rx->rc_tracestate);
			n++;
		}
	}
	if (request_id != NULL && n < max) {
		out[n].uh_name = "x-request-id";
		out[n].uh_name_len = strlen("x-request-id");
		out[n].uh_value = request_id;
		out[n].uh_value_len = strlen(request_id);
		n++;
	}
	if (json_body && n < max) {
		out[n].uh_name = "content-type";
		out[n].uh_name_len = strlen("content-type");
		out[n].uh_value = "application/json";
		out[n].uh_value_len = strlen("application/json");
		n++;
	}
	return n;
}

const struct upstream_header *
hdr_find(const struct upstream_header *h, size_t n, const char *name)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (hdr_eq(h[i].uh_name, h[i].uh_name_len, name))
			return &h[i];
	return NULL;
}

void
hdr_response_head(struct http_out *o, int status,
    const struct upstream_header *h, size_t n, bool keep_length, bool streaming,
    bool chunked, const char *request_id, const char *worker_url,
    bool keep_alive)
{
	size_t i;

	http_out_status(o, status);
	for (i = 0; i < n; i++) {
		const char *nm = h[i].uh_name;
		size_t nl = h[i].uh_name_len;

		if (hdr_is_hop_by_hop(nm, nl) ||
		    hdr_eq(nm, nl, "x-request-id") ||
		    hdr_eq(nm, nl, "x-smg-routed-worker-id") ||
		    (!keep_length && hdr_eq(nm, nl, "content-length")) ||
		    (streaming && hdr_eq(nm, nl, "content-type")))
			continue;
		/* The writer refuses CR, LF and NUL and then fails the
		 * whole buffer: drop such a header instead. */
		if (!hdr_value_ok(h[i].uh_value, h[i].uh_value_len) ||
		    !hdr_name_ok(nm, nl))
			continue;
		http_out_header_n(o, nm, nl, h[i].uh_value, h[i].uh_value_len);
	}
	if (request_id != NULL)
		http_out_header(o, "x-request-id", request_id);
	if (worker_url != NULL)
		http_out_header(o, "x-smg-routed-worker-id", worker_url);
	if (streaming)
		http_out_header(o, "content-type", "text/event-stream");
	if (chunked)
		http_out_header(o, "transfer-encoding", "chunked");
	http_out_header(o, "connection", keep_alive ? "keep-alive" : "close");
	http_out_end_head(o);
}

struct upstream_header *
hdr_copy(const struct upstream_header *h, size_t n)
{
	struct upstream_header *out;
	size_t i, need = 0;
	char *p;

	for (i = 0; i < n; i++)
		need += h[i].uh_name_len + h[i].uh_value_len + 2;
	if ((out = malloc((n + 1) * sizeof(*out) + need + 1)) == NULL)
		return NULL;
	p = (char *)(out + n + 1);
	for (i = 0; i < n; i++) {
		memcpy(p, h[i].uh_name, h[i].uh_name_len);
		p[h[i].uh_name_len] = '\0';
		out[i].uh_name = p;
		out[i].uh_name_len = h[i].uh_name_len;
		p += h[i].uh_name_len + 1;
		memcpy(p, h[i].uh_value, h[i].uh_value_len);
		p[h[i].uh_value_len] = '\0';
		out[i].uh_value = p;
		out[i].uh_value_len = h[i].uh_value_len;
		p += h[i].uh_value_len + 1;
	}
	return out;
}

size_t
hdr_set_length(struct upstream_header *h, size_t n, char *buf, size_t buflen,
    size_t len)
{
	size_t i, k;
	int w;

	for (i = 0, k = 0; i < n; i++)
		if (!(h[i].uh_name_len == 14 &&
		        strncasecmp(h[i].uh_name, "content-length", 14) == 0))
			h[k++] = h[i];
	w = buflen > HTTP_U64_DIGITS ? (int)http_fmt_u64(buf, len)
	                             : snprintf(buf, buflen, "%zu", len);
	h[k].uh_name = "content-length";
	h[k].uh_name_len = 14;
	h[k].uh_value = buf;
	h[k].uh_value_len = w > 0 ? (size_t)w : 0;
	return k + 1;
}
