/* hdr_test.c: headers forwarded to workers and relayed back to clients. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "frontend/frontend.h"

/* hdr_upstream looks up request contexts (reqctx.c), which links conn.c. */
struct frontend *fe;

/* Parses a request head with the shared reader, as the frontend does. */
static struct http_reader *
parse(const char *raw, const struct http_request **req)
{
	struct http_reader *r = http_reader_new(NULL);
	enum http_read_status st;
	size_t used, off = 0, len = strlen(raw);

	assert_non_null(r);
	do {
		st = http_reader_feed(r, raw + off, len - off, &used);
		off += used;
	} while (st == HTTP_READ_HEADERS);
	assert_int_equal(st, HTTP_READ_DONE);
	*req = http_reader_request(r);
	return r;
}

static const struct upstream_header *
find(const struct upstream_header *h, size_t n, const char *name)
{
	return hdr_find(h, n, name);
}

static bool
value_is(const struct upstream_header *h, const char *v)
{
	return h != NULL && h->uh_value_len == strlen(v) &&
	    memcmp(h->uh_value, v, h->uh_value_len) == 0;
}

static void
test_forwarded_names(void **state)
{
	(void)state;
	assert_true(hdr_is_forwarded("authorization", 13));
	assert_true(hdr_is_forwarded("X-Correlation-Id", 16));
	assert_true(hdr_is_forwarded("traceparent", 11));
	assert_true(hdr_is_forwarded("tracestate", 10));
	assert_true(hdr_is_forwarded("x-smg-routing-key", 17));
	assert_true(hdr_is_forwarded("x-request-id-extra", 18));
	assert_false(hdr_is_forwarded("x-request-id-", 13));
	assert_false(hdr_is_forwarded("cookie", 6));
	assert_false(hdr_is_forwarded("host", 4));
	assert_false(hdr_is_forwarded("content-length", 14));
	assert_false(hdr_is_forwarded("x-forwarded-for", 15));
}

static void
test_hop_by_hop(void **state)
{
	static const char *const hop[] = { "connection", "Keep-Alive",
		"proxy-authenticate", "proxy-authorization", "te", "trailers",
		"transfer-encoding", "upgrade", "content-encoding", "host" };
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(hop) / sizeof(hop[0]); i++)
		assert_true(hdr_is_hop_by_hop(hop[i], strlen(hop[i])));
	assert_false(hdr_is_hop_by_hop("content-type", 12));
	assert_false(hdr_is_hop_by_hop("x-sim-worker", 12));
}

static void
test_upstream_client_auth(void **state)
{
	const struct http_request *req;
	struct http_reader *r;
	struct upstream_header h[HDR_UPSTREAM_MAX];
	char auth[64];
	size_t n;

	(void)state;
	r = parse("POST /generate HTTP/1.1\r\nHost: gw\r\n"
	          "Authorization: Bearer client\r\nCookie: a=b\r\n"
	          "X-Request-Id: theirs\r\nTraceparent: 00-aa-bb-01\r\n"
	          "X-Request-Id-Span: s1\r\nX-SMG-Routing-Key: k\r\n"
	          "Content-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}",
	    &req);
	n = hdr_upstream(req, NULL, NULL, "gnt-123", "workerkey", true, auth,
	    sizeof(auth), h, HDR_UPSTREAM_MAX);
	/* The worker's own key wins; the client's is not passed on. */
	assert_true(value_is(find(h, n, "authorization"), "Bearer workerkey"));
	n = hdr_upstream(req, NULL, NULL, "gnt-123", "", true, auth,
	    sizeof(auth), h, HDR_UPSTREAM_MAX);
	assert_true(value_is(find(h, n, "authorization"), "Bearer client"));
	assert_true(value_is(find(h, n, "x-request-id"), "gnt-123"));
	assert_true(value_is(find(h, n, "traceparent"), "00-aa-bb-01"));
	assert_true(value_is(find(h, n, "x-request-id-span"), "s1"));
	assert_true(value_is(find(h, n, "x-smg-routing-key"), "k"));
	assert_true(value_is(find(h, n, "content-type"), "application/json"));
	assert_null(find(h, n, "cookie"));
	assert_null(find(h, n, "host"));
	assert_null(find(h, n, "content-length"));
	/* Exactly one x-request-id: ours. */
	assert_int_equal(n, 6);
	http_reader_free(r);
}

static void
test_upstream_worker_key(void **state)
{
	const struct http_request *req;
	struct http_reader *r;
	struct upstream_header h[HDR_UPSTREAM_MAX];
	char auth[64];
	size_t n;

	(void)state;
	r = parse("GET /get_model_info HTTP/1.1\r\nHost: gw\r\n\r\n", &req);
	n = hdr_upstream(req, NULL, NULL, "req-1", "sekret", false, auth,
	    sizeof(auth), h, HDR_UPSTREAM_MAX);
	assert_true(value_is(find(h, n, "authorization"), "Bearer sekret"));
	assert_null(find(h, n, "content-type"));
	assert_int_equal(n, 2);
	n = hdr_upstream(req, NULL, NULL, "req-1", "", false, auth,
	    sizeof(auth), h, HDR_UPSTREAM_MAX);
	assert_null(find(h, n, "authorization"));
	assert_int_equal(n, 1);
	http_reader_free(r);
}

/*
 * Via: ours appended to the client's list; a request listing our hop id
 * (directly, or after other proxies) is a loop; other ids are not.
 */
static void
test_via_loop(void **state)
{
	const struct http_request *req;
	struct http_reader *r;
	struct upstream_header h[HDR_UPSTREAM_MAX];
	struct config cf;
	char auth[64], ours[64], raw[4096], other[64], big[HDR_VIA_MAX + 64];
	const struct upstream_header *v;
	size_t n;

	(void)state;
	memset(&cf, 0, sizeof(cf));
	cf.cf_host = "127.0.0.1";
	cf.cf_port = 30001;
	cf.cf_run_dir = "/tmp/smg-a";
	hdr_init(&cf);
	snprintf(other, sizeof(other), "%s", hdr_via_token());
	cf.cf_port = 30000;
	hdr_init(&cf);
	assert_string_not_equal(other, hdr_via_token());
	assert_int_equal(strncmp(hdr_via_token(), "smg-c-", 6), 0);
	assert_int_equal(strlen(hdr_via_token()), 6 + 16);
	snprintf(ours, sizeof(ours), "1.1 %s", hdr_via_token());

	/* No Via: ours alone; not a loop. */
	r = parse("POST /generate HTTP/1.1\r\nHost: gw\r\n"
	          "Content-Length: 2\r\n\r\n{}",
	    &req);
	assert_false(hdr_is_looped(req));
	n = hdr_upstream(req, NULL, NULL, "id", "", true, auth, sizeof(auth), h,
	    HDR_UPSTREAM_MAX);
	assert_non_null(v = find(h, n, "via"));
	assert_true(value_is(v, ours));
	http_reader_free(r);

	/* Another proxy's Via is kept in front of ours. */
	snprintf(raw, sizeof(raw),
	    "GET /v1/models HTTP/1.1\r\nHost: gw\r\nVia: 1.0 fred, 1.1 %s\r\n"
	    "Via: HTTP/1.1 p3 (comment)\r\n\r\n",
	    other);
	r = parse(raw, &req);
	assert_false(hdr_is_looped(req));
	n = hdr_upstream(req, NULL, NULL, "id", "", false, auth, sizeof(auth),
	    h, HDR_UPSTREAM_MAX);
	snprintf(raw, sizeof(raw),
	    "1.0 fred, 1.1 %s, HTTP/1.1 p3 (comment), %s", other, ours);
	assert_true(value_is(find(h, n, "via"), raw));
	http_reader_free(r);

	/* Our id anywhere in any Via line: a loop. */
	snprintf(raw, sizeof(raw),
	    "GET / HTTP/1.1\r\nHost: gw\r\nVia: 1.0 fred\r\nVia: 1.1 %s, 1.1 "
	    "%s\r\n\r\n",
	    other, hdr_via_token());
	r = parse(raw, &req);
	assert_true(hdr_is_looped(req));
	http_reader_free(r);
	snprintf(raw, sizeof(raw),
	    "GET / HTTP/1.1\r\nHost: gw\r\nVia: 1.1 %s (smg-c)\r\n\r\n",
	    hdr_via_token());
	r = parse(raw, &req);
	assert_true(hdr_is_looped(req));
	http_reader_free(r);
	/* A longer id that starts like ours is someone else. */
	snprintf(raw, sizeof(raw),
	    "GET / HTTP/1.1\r\nHost: gw\r\nVia: 1.1 %s0, 1.1 x%s\r\n\r\n",
	    hdr_via_token(), hdr_via_token());
	r = parse(raw, &req);
	assert_false(hdr_is_looped(req));
	http_reader_free(r);

	/* A chain too long to extend. */
	memset(big, 'a', sizeof(big));
	big[sizeof(big) - 1] = '\0';
	snprintf(raw, sizeof(raw),
	    "GET / HTTP/1.1\r\nHost: gw\r\nVia: 1.1 %s\r\n\r\n", big);
	r = parse(raw, &req);
	assert_true(hdr_is_looped(req));
	http_reader_free(r);
}

static void
test_response_head(void **state)
{
	const struct upstream_header h[] = {
		{ "content-type", 12, "application/json", 16 },
		{ "content-length", 14, "42", 2 },
		{ "connection", 10, "keep-alive", 10 },
		{ "transfer-encoding", 17, "chunked", 7 },
		{ "x-request-id", 12, "worker-id", 9 },
		{ "x-sim-worker", 12, "8001", 4 },
		{ "x-bad", 5, "a\r\nInjected: 1", 14 },
	};
	struct http_out o;
	char *s;

	(void)state;
	http_out_init(&o);
	hdr_response_head(&o, 200, h, sizeof(h) / sizeof(h[0]), true, false,
	    false, "chatcmpl-abc", "http://w:1", true);
	assert_false(o.ho_failed);
	s = strndup(o.ho_buf, o.ho_len);
	assert_non_null(strstr(s, "HTTP/1.1 200 OK\r\n"));
	assert_non_null(strstr(s, "content-type: application/json\r\n"));
	assert_non_null(strstr(s, "content-length: 42\r\n"));
	assert_non_null(strstr(s, "x-sim-worker: 8001\r\n"));
	assert_non_null(strstr(s, "x-request-id: chatcmpl-abc\r\n"));
	assert_non_null(strstr(s, "x-smg-routed-worker-id: http://w:1\r\n"));
	assert_non_null(strstr(s, "connection: keep-alive\r\n"));
	assert_null(strstr(s, "worker-id\r\n"));
	assert_null(strstr(s, "chunked"));
	assert_null(strstr(s, "Injected"));
	assert_non_null(strstr(s, "\r\n\r\n"));
	free(s);

	/* Streaming: event-stream content type, re-chunked, no length. */
	http_out_reset(&o);
	hdr_response_head(&o, 200, h, sizeof(h) / sizeof(h[0]), false, true,
	    true, "gnt-1", NULL, false);
	s = strndup(o.ho_buf, o.ho_len);
	assert_non_null(strstr(s, "content-type: text/event-stream\r\n"));
	assert_null(strstr(s, "application/json"));
	assert_null(strstr(s, "content-length"));
	assert_non_null(strstr(s, "transfer-encoding: chunked\r\n"));
	assert_non_null(strstr(s, "connection: close\r\n"));
	assert_null(strstr(s, "x-smg-routed-worker-id"));
	free(s);
	http_out_free(&o);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_forwarded_names),
		cmocka_unit_test(test_hop_by_hop),
		cmocka_unit_test(test_upstream_client_auth),
		cmocka_unit_test(test_upstream_worker_key),
		cmocka_unit_test(test_via_loop),
		cmocka_unit_test(test_response_head),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
