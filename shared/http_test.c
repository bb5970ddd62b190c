/*
 * http_test.c: unit tests of shared/http.c: request reading (framing,
 * pipelining, limits, request-smuggling defences, keep-alive) and response
 * writing.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "shared/http.h"

static enum http_read_status feed_all(struct http_reader *, const char *,
    size_t, size_t *);
static void expect_error(const char *, int);
static void expect_error_lim(const struct http_limits *, const char *, int);
static struct http_reader *parse_ok(const char *);

/* Feeds s until the reader needs more input, finishes or fails. */
static enum http_read_status
feed_all(struct http_reader *r, const char *s, size_t len, size_t *used)
{
	enum http_read_status st;
	size_t off = 0, n;
	int guard;

	for (guard = 0; guard < 1000; guard++) {
		st = http_reader_feed(r, s + off, len - off, &n);
		assert_true(n <= len - off);
		off += n;
		if (st != HTTP_READ_HEADERS && st != HTTP_READ_BODY)
			break;
	}
	if (used != NULL)
		*used = off;
	return st;
}

static void
expect_error_lim(const struct http_limits *lim, const char *s, int status)
{
	struct http_reader *r;
	const char *reason = NULL;

	assert_non_null(r = http_reader_new(lim));
	assert_int_equal(feed_all(r, s, strlen(s), NULL), HTTP_READ_ERROR);
	assert_int_equal(http_reader_error(r, &reason), status);
	assert_non_null(reason);
	/* Once failed, it stays failed. */
	assert_int_equal(
	    feed_all(r, "GET / HTTP/1.1\r\nHost: h\r\n\r\n", 18, NULL),
	    HTTP_READ_ERROR);
	http_reader_free(r);
}

static void
expect_error(const char *s, int status)
{
	expect_error_lim(NULL, s, status);
}

static struct http_reader *
parse_ok(const char *s)
{
	struct http_reader *r;
	size_t used;

	assert_non_null(r = http_reader_new(NULL));
	assert_int_equal(feed_all(r, s, strlen(s), &used), HTTP_READ_DONE);
	assert_int_equal(used, strlen(s));
	assert_int_equal(http_reader_error(r, NULL), 0);
	return r;
}

static void
test_simple_get(void **state)
{
	struct http_reader *r;
	const struct http_request *q;
	const struct http_header *h;

	(void)state;
	r = parse_ok("GET /v1/models?a=1&b=2 HTTP/1.1\r\n"
	             "Host: example\r\n"
	             "X-Custom-Header:   spaced value \t\r\n"
	             "Empty:\r\n"
	             "\r\n");
	assert_non_null(q = http_reader_request(r));
	assert_int_equal(q->hr_method, HTTP_GET);
	assert_string_equal(q->hr_method_str, "GET");
	assert_string_equal(q->hr_path, "/v1/models");
	assert_int_equal(q->hr_path_len, 10);
	assert_string_equal(q->hr_query, "a=1&b=2");
	assert_int_equal(q->hr_query_len, 7);
	assert_true(q->hr_has_query);
	assert_int_equal(q->hr_http_minor, 1);
	assert_true(q->hr_keep_alive);
	assert_false(q->hr_chunked);
	assert_int_equal(q->hr_content_length, -1);
	assert_int_equal(q->hr_nheaders, 3);
	assert_string_equal(q->hr_headers[0].hh_name, "host");
	assert_string_equal(q->hr_headers[1].hh_name, "x-custom-header");
	assert_string_equal(q->hr_headers[1].hh_value, "spaced value");
	assert_int_equal(q->hr_headers[1].hh_value_len, 12);
	assert_string_equal(q->hr_headers[2].hh_value, "");
	assert_non_null(h = http_request_header(q, "X-CUSTOM-header"));
	assert_string_equal(h->hh_value, "spaced value");
	assert_null(http_request_header(q, "missing"));
	assert_int_equal(http_request_header_count(q, "host"), 1);
	assert_string_equal(q->hr_body, "");
	assert_int_equal(q->hr_body_len, 0);
	http_reader_free(r);
}

static void
test_target_forms(void **state)
{
	struct http_reader *r;
	const struct http_request *q;

	(void)state;
	r = parse_ok("GET /plain HTTP/1.1\r\nHost: h\r\n\r\n");
	q = http_reader_request(r);
	assert_string_equal(q->hr_path, "/plain");
	assert_string_equal(q->hr_query, "");
	assert_false(q->hr_has_query);
	http_reader_free(r);

	r = parse_ok("GET /p? HTTP/1.1\r\nHost: h\r\n\r\n");
	q = http_reader_request(r);
	assert_string_equal(q->hr_path, "/p");
	assert_true(q->hr_has_query);
	assert_int_equal(q->hr_query_len, 0);
	http_reader_free(r);

	r = parse_ok(
	    "GET http://host:8080/a/b?x=1 HTTP/1.1\r\nHost: h\r\n\r\n");
	q = http_reader_request(r);
	assert_string_equal(q->hr_path, "/a/b");
	assert_string_equal(q->hr_query, "x=1");
	http_reader_free(r);

	r = parse_ok("GET http://host HTTP/1.1\r\nHost: h\r\n\r\n");
	assert_string_equal(http_reader_request(r)->hr_path, "/");
	http_reader_free(r);

	r = parse_ok("OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n");
	assert_string_equal(http_reader_request(r)->hr_path, "*");
	http_reader_free(r);

	/* Leading empty lines before a request are ignored. */
	r = parse_ok("\r\n\r\nGET /x HTTP/1.1\r\nHost: h\r\n\r\n");
	assert_string_equal(http_reader_request(r)->hr_path, "/x");
	http_reader_free(r);

	expect_error("GET * HTTP/1.1\r\nHost: h\r\n\r\n", 400);
	expect_error("GET abc HTTP/1.1\r\nHost: h\r\n\r\n", 400);
	expect_error("GET ://x HTTP/1.1\r\nHost: h\r\n\r\n", 400);
	expect_error("GET  /two-spaces HTTP/1.1\r\nHost: h\r\n\r\n", 400);
	expect_error("GET /a b HTTP/1.1\r\nHost: h\r\n\r\n", 400);
	expect_error("GET /\x01 HTTP/1.1\r\nHost: h\r\n\r\n", 400);
	expect_error("GET /\xc3\xa9 HTTP/1.1\r\nHost: h\r\n\r\n", 400);
	expect_error("GET /\r\n\r\n", 400);
	expect_error("G(T / HTTP/1.1\r\nHost: h\r\n\r\n", 400);
	expect_error("CONNECT host:443 HTTP/1.1\r\nHost: h\r\n\r\n", 501);
}

static void
test_versions(void **state)
{
	(void)state;
	expect_error("GET / HTTP/2.0\r\n\r\n", 505);
	expect_error("GET / HTTP/0.9\r\n\r\n", 505);
	expect_error("GET / HTTP/1.1x\r\n\r\n", 400);
	expect_error("GET / HTTP/1\r\n\r\n", 400);
	expect_error("GET / HTTX/1.1\r\n\r\n", 400);
}

static void
test_keep_alive(void **state)
{
	struct http_reader *r;

	(void)state;
	r = parse_ok("GET / HTTP/1.0\r\n\r\n");
	assert_int_equal(http_reader_request(r)->hr_http_minor, 0);
	assert_false(http_reader_request(r)->hr_keep_alive);
	http_reader_free(r);

	r = parse_ok("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
	assert_true(http_reader_request(r)->hr_keep_alive);
	http_reader_free(r);

	r = parse_ok("GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
	assert_false(http_reader_request(r)->hr_keep_alive);
	http_reader_free(r);

	r = parse_ok("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
	assert_true(http_reader_request(r)->hr_keep_alive);
	http_reader_free(r);

	/* An Upgrade request is read as an ordinary request. */
	r = parse_ok("GET /u HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\n"
	             "Upgrade: websocket\r\n\r\n");
	assert_string_equal(http_reader_request(r)->hr_path, "/u");
	http_reader_free(r);
	r = parse_ok("POST /u HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\n"
	             "Upgrade: h2c\r\nContent-Length: 2\r\n\r\nhi");
	assert_string_equal(http_reader_request(r)->hr_body, "hi");
	http_reader_free(r);
}

static void
test_post_content_length(void **state)
{
	struct http_reader *r;
	const struct http_request *q;

	(void)state;
	r = parse_ok("POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\n"
	             "Content-Length: 13\r\n"
	             "Content-Type: application/json\r\n"
	             "\r\n"
	             "{\"model\":\"m\"}");
	q = http_reader_request(r);
	assert_int_equal(q->hr_method, HTTP_POST);
	assert_int_equal(q->hr_content_length, 13);
	assert_int_equal(q->hr_body_len, 13);
	assert_string_equal(q->hr_body, "{\"model\":\"m\"}");
	assert_int_equal(q->hr_body_total, 13);
	http_reader_free(r);

	r = parse_ok("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n");
	assert_int_equal(http_reader_request(r)->hr_body_len, 0);
	http_reader_free(r);
}

static void
test_chunked(void **state)
{
	struct http_reader *r;
	const struct http_request *q;

	(void)state;
	r = parse_ok("POST /generate HTTP/1.1\r\nHost: h\r\n"
	             "Transfer-Encoding: chunked\r\n"
	             "\r\n"
	             "4\r\nWiki\r\n"
	             "5;name=value\r\npedia\r\n"
	             "C\r\n in\r\n\r\nchunk\r\n"
	             "0\r\n"
	             "Trailer-Field: x\r\n"
	             "\r\n");
	q = http_reader_request(r);
	assert_true(q->hr_chunked);
	assert_int_equal(q->hr_content_length, -1);
	assert_int_equal(q->hr_body_len, 21);
	assert_memory_equal(q->hr_body, "Wikipedia in\r\n\r\nchunk", 21);
	http_reader_free(r);

	r = parse_ok(
	    "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked\r\n\r\n"
	    "0\r\n\r\n");
	assert_int_equal(http_reader_request(r)->hr_body_len, 0);
	http_reader_free(r);
}

static void
test_pipelined(void **state)
{
	const char *two =
	    "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"
	    "GET /b HTTP/1.1\r\nHost: h\r\n\r\n"
	    "POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
	    "\r\n1\r\nz\r\n0\r\n\r\n"
	    "GET /d";
	struct http_reader *r;
	const struct http_request *q;
	size_t off = 0, used, len = strlen(two);

	(void)state;
	assert_non_null(r = http_reader_new(NULL));
	assert_int_equal(feed_all(r, two, len, &used), HTTP_READ_DONE);
	q = http_reader_request(r);
	assert_string_equal(q->hr_path, "/a");
	assert_string_equal(q->hr_body, "abc");
	off += used;
	assert_int_equal(off, 51);

	http_reader_reset(r);
	assert_null(http_reader_request(r));
	assert_int_equal(feed_all(r, two + off, len - off, &used),
	    HTTP_READ_DONE);
	q = http_reader_request(r);
	assert_string_equal(q->hr_path, "/b");
	assert_int_equal(q->hr_body_len, 0);
	off += used;

	http_reader_reset(r);
	assert_int_equal(feed_all(r, two + off, len - off, &used),
	    HTTP_READ_DONE);
	q = http_reader_request(r);
	assert_string_equal(q->hr_path, "/c");
	assert_string_equal(q->hr_body, "z");
	off += used;

	http_reader_reset(r);
	assert_int_equal(feed_all(r, two + off, len - off, &used),
	    HTTP_READ_AGAIN);
	assert_int_equal(off + used, len);
	assert_int_equal(feed_all(r, " HTTP/1.1\r\nHost: h\r\n\r\n", 22, &used),
	    HTTP_READ_DONE);
	assert_string_equal(http_reader_request(r)->hr_path, "/d");
	/* DONE repeats until reset, consuming nothing. */
	assert_int_equal(http_reader_feed(r, "xyz", 3, &used), HTTP_READ_DONE);
	assert_int_equal(used, 0);
	http_reader_free(r);
}

/* Feeds s one byte at a time, checking the order of the reports. */
static void
byte_by_byte(const char *s, const char *path, const char *body, size_t body_len)
{
	struct http_reader *r;
	enum http_read_status st = HTTP_READ_AGAIN;
	size_t i = 0, len = strlen(s), n;
	bool headers = false;

	assert_non_null(r = http_reader_new(NULL));
	while (i < len) {
		st = http_reader_feed(r, s + i, 1, &n);
		i += n;
		if (st == HTTP_READ_HEADERS) {
			assert_false(headers);
			headers = true;
			assert_string_equal(http_reader_request(r)->hr_path,
			    path);
			continue;
		}
		assert_int_equal(n, 1);
		if (st == HTTP_READ_DONE)
			break;
		assert_int_equal(st, HTTP_READ_AGAIN);
	}
	if (st == HTTP_READ_HEADERS)
		st = http_reader_feed(r, "", 0, &n);
	assert_true(headers);
	assert_int_equal(st, HTTP_READ_DONE);
	assert_int_equal(i, len);
	assert_int_equal(http_reader_request(r)->hr_body_len, body_len);
	assert_memory_equal(http_reader_request(r)->hr_body, body, body_len);
	http_reader_free(r);
}

static void
test_byte_by_byte(void **state)
{
	(void)state;
	byte_by_byte("POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n"
	             "hello",
	    "/x", "hello", 5);
	byte_by_byte(
	    "POST /y HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "3;e=1\r\nabc\r\n2\r\nde\r\n0\r\nT: v\r\n\r\n",
	    "/y", "abcde", 5);
	byte_by_byte("GET /z HTTP/1.1\r\nHost: h\r\n\r\n", "/z", "", 0);
}

static void
test_expect_continue(void **state)
{
	const char *head = "POST /v1/completions HTTP/1.1\r\nHost: h\r\n"
	                   "Content-Length: 4\r\n"
	                   "Expect: 100-continue\r\n\r\n";
	struct http_reader *r;
	size_t n;

	(void)state;
	assert_non_null(r = http_reader_new(NULL));
	assert_int_equal(http_reader_feed(r, head, strlen(head), &n),
	    HTTP_READ_HEADERS);
	assert_int_equal(n, strlen(head));
	assert_true(http_reader_request(r)->hr_expect_continue);
	assert_int_equal(http_reader_request(r)->hr_content_length, 4);
	assert_int_equal(http_reader_feed(r, "", 0, &n), HTTP_READ_AGAIN);
	assert_int_equal(http_reader_feed(r, "ab", 2, &n), HTTP_READ_AGAIN);
	assert_int_equal(http_reader_feed(r, "cdEXTRA", 7, &n), HTTP_READ_DONE);
	assert_int_equal(n, 2);
	assert_string_equal(http_reader_request(r)->hr_body, "abcd");
	http_reader_free(r);

	expect_error("POST / HTTP/1.1\r\nHost: h\r\nExpect: something-else\r\n"
	             "Content-Length: 1\r\n\r\nx",
	    417);
}

static void
test_limits(void **state)
{
	struct http_limits lim = { .hl_max_header_bytes = 256,
		.hl_max_headers = 4,
		.hl_max_body_bytes = 10 };
	struct http_reader *r;
	char big[600];
	size_t n;

	(void)state;
	/* Declared body over the limit: 413 before any body byte. */
	expect_error_lim(&lim,
	    "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\n", 413);
	expect_error_lim(&lim,
	    "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: "
	    "99999999999999999999999\r\n\r\n",
	    413);
	/* Chunked body growing over the limit. */
	expect_error_lim(&lim,
	    "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "6\r\nabcdef\r\n5\r\nghijk\r\n0\r\n\r\n",
	    413);
	/* Exactly at the limit is fine. */
	assert_non_null(r = http_reader_new(&lim));
	assert_int_equal(
	    feed_all(r,
	        "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n"
	        "0123456789",
	        58, &n),
	    HTTP_READ_DONE);
	http_reader_free(r);

	/* Header block too large, with and without its end in sight. */
	memset(big, 'a', sizeof(big));
	memcpy(big, "GET / HTTP/1.1\r\nHost: h\r\nX: ", 28);
	memcpy(big + sizeof(big) - 5, "\r\n\r\n", 5);
	expect_error_lim(&lim, big, 431);
	big[300] = '\0';
	expect_error_lim(&lim, big, 431);
	/* Too many header lines. */
	expect_error_lim(&lim,
	    "GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: "
	    "4\r\n\r\n",
	    431);
	assert_non_null(r = http_reader_new(&lim));
	assert_int_equal(feed_all(r,
	                     "GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: "
	                     "3\r\n\r\n",
	                     45, &n),
	    HTTP_READ_DONE);
	assert_int_equal(http_reader_request(r)->hr_nheaders, 4);
	http_reader_free(r);

	/* Default header limit: 64 KiB. */
	{
		size_t len = 70 * 1024;
		char *huge = malloc(len + 1);

		assert_non_null(huge);
		memset(huge, 'b', len);
		memcpy(huge, "GET / HTTP/1.1\r\nHost: h\r\nX: ", 19);
		memcpy(huge + len - 4, "\r\n\r\n", 4);
		huge[len] = '\0';
		expect_error(huge, 431);
		free(huge);
	}
}

static void
test_smuggling_framing(void **state)
{
	(void)state;
	/* Content-Length and Transfer-Encoding together. */
	expect_error("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n"
	             "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
	    400);
	expect_error(
	    "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
	    "Content-Length: 5\r\n\r\n0\r\n\r\n",
	    400);
	/* Several Content-Length, even equal. */
	expect_error("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n"
	             "Content-Length: 3\r\n\r\nabc",
	    400);
	expect_error(
	    "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3, 3\r\n\r\nabc",
	    400);
	expect_error(
	    "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +3\r\n\r\nabc", 400);
	expect_error("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n",
	    400);
	expect_error(
	    "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0x3\r\n\r\nabc",
	    400);
	expect_error("POST / HTTP/1.1\r\nHost: h\r\nContent-Length:\r\n\r\n",
	    400);
	/* Transfer codings other than exactly chunked. */
	expect_error(
	    "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n"
	    "\r\n0\r\n\r\n",
	    501);
	expect_error(
	    "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, "
	    "chunked\r\n\r\n0\r\n\r\n",
	    501);
	expect_error(
	    "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
	    "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
	    501);
	expect_error(
	    "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: xchunked\r\n"
	    "\r\n0\r\n\r\n",
	    501);
	expect_error(
	    "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: identity\r\n"
	    "\r\n",
	    501);
	/* Transfer-Encoding in HTTP/1.0. */
	expect_error("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n"
	             "\r\n0\r\n\r\n",
	    400);
	/* Host twice. */
	expect_error("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400);
}

static void
test_smuggling_lines(void **state)
{
	(void)state;
	/* obs-fold, also right after the request line. */
	expect_error("GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n  folded\r\n\r\n",
	    400);
	expect_error("GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n\tfolded\r\n\r\n",
	    400);
	expect_error("GET / HTTP/1.1\r\n Host: a\r\n\r\n", 400);
	/* Bare LF and bare CR line ends. */
	expect_error("GET / HTTP/1.1\nHost: a\r\n\r\n", 400);
	expect_error("GET / HTTP/1.1\r\nHost: a\n\r\n", 400);
	expect_error("GET / HTTP/1.1\r\nHost: a\n\n", 400);
	expect_error("GET / HTTP/1.1\r\nHost: a\rX: b\r\n\r\n", 400);
	expect_error("GET / HTTP/1.1\r\nHost: a\r\r\n\r\n", 400);
	/* NUL and control characters in names and values. */
	expect_error("GET / HTTP/1.1\r\nHost: h\r\nX-A: a\x01"
	             "b\r\n\r\n",
	    400);
	expect_error("GET / HTTP/1.1\r\nHost: h\r\nX-A: a\x7f\r\n\r\n", 400);
	expect_error("GET / HTTP/1.1\r\nHost: h\r\nX\x01"
	             "A: a\r\n\r\n",
	    400);
	{
		static const char nul[] =
		    "GET / HTTP/1.1\r\nHost: h\r\nX-A: a\0b\r\n\r\n";
		struct http_reader *r = http_reader_new(NULL);

		assert_int_equal(feed_all(r, nul, sizeof(nul) - 1, NULL),
		    HTTP_READ_ERROR);
		assert_int_equal(http_reader_error(r, NULL), 400);
		http_reader_free(r);
	}
	/* Names: whitespace before the colon, empty, not a token. */
	expect_error("GET / HTTP/1.1\r\nHost: h\r\nHost : a\r\n\r\n", 400);
	expect_error(
	    "POST / HTTP/1.1\r\nHost: h\r\nContent-Length : 3\r\n\r\nabc", 400);
	expect_error("GET / HTTP/1.1\r\nHost: h\r\n: a\r\n\r\n", 400);
	expect_error("GET / HTTP/1.1\r\nHost: h\r\nX(A): a\r\n\r\n", 400);
	expect_error("GET / HTTP/1.1\r\nHost: h\r\nno colon\r\n\r\n", 400);
	/* A header value may carry obs-text and tabs. */
	{
		struct http_reader *r =
		    parse_ok("GET / HTTP/1.1\r\nHost: h\r\nX-A: "
		             "caf\xc3\xa9\tok\r\n\r\n");

		assert_string_equal(
		    http_reader_request(r)->hr_headers[1].hh_value,
		    "caf\xc3\xa9\tok");
		http_reader_free(r);
	}
}

static void
test_smuggling_chunks(void **state)
{
	char ext[HTTP_CHUNK_LINE_MAX + 200];
	char req[sizeof(ext) + 100];

	(void)state;
	expect_error(
	    "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "zz\r\nab\r\n0\r\n\r\n",
	    400);
	expect_error(
	    "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "-1\r\nab\r\n0\r\n\r\n",
	    400);
	expect_error(
	    "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "fffffffffffffffffffff\r\nab\r\n0\r\n\r\n",
	    400);
	/* Bare LF / bare CR in the framing. */
	expect_error(
	    "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "2\nab\r\n0\r\n\r\n",
	    400);
	expect_error(
	    "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "2\r\nab\n0\r\n\r\n",
	    400);
	expect_error(
	    "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "2\r\nab\r\n0\r\n\n",
	    400);
	expect_error(
	    "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "2;a=\x01\r\nab\r\n0\r\n\r\n",
	    400);
	/* Data longer than its chunk size. */
	expect_error(
	    "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "2\r\nabc\r\n0\r\n\r\n",
	    400);
	/* Extension abuse: an over-long chunk line. */
	memset(ext, 'e', sizeof(ext));
	ext[sizeof(ext) - 1] = '\0';
	snprintf(req, sizeof(req),
	    "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
	    "2;%s\r\nab\r\n0\r\n\r\n",
	    ext);
	expect_error(req, 400);
}

/* The CRLF after chunk data is exactly CRLF, fed whole or byte by byte. */
static void
test_chunk_data_crlf(void **state)
{
	char req[512], data[73];
	struct http_reader *r;
	size_t i, n;
	enum http_read_status st = HTTP_READ_AGAIN;

	(void)state;
	memset(data, 'a', 72);
	data[72] = '\0';
	snprintf(req, sizeof(req),
	    "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
	    "\r\n48\r\n%sXY0\r\n\r\n",
	    data);
	expect_error(req, 400);
	/* One byte of the two wrong, either one. */
	expect_error("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: "
	             "chunked\r\n\r\n2\r\nabX\n0\r\n\r\n",
	    400);
	expect_error("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: "
	             "chunked\r\n\r\n2\r\nab\rX0\r\n\r\n",
	    400);
	/* Byte by byte, the missing CRLF is still seen. */
	assert_non_null(r = http_reader_new(NULL));
	for (i = 0; i < strlen(req); i += n) {
		st = http_reader_feed(r, req + i, 1, &n);
		if (st == HTTP_READ_ERROR || st == HTTP_READ_DONE)
			break;
	}
	assert_int_equal(st, HTTP_READ_ERROR);
	assert_int_equal(http_reader_error(r, NULL), 400);
	http_reader_free(r);
	/* The well-formed request parses. */
	snprintf(req, sizeof(req),
	    "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
	    "\r\n48\r\n%s\r\n0\r\n\r\n",
	    data);
	r = parse_ok(req);
	assert_int_equal(http_reader_request(r)->hr_body_len, 72);
	http_reader_free(r);
}

/* HTTP/1.1 needs Host (RFC 9112 §3.2); HTTP/1.0 does not. */
static void
test_host_required(void **state)
{
	struct http_reader *r;

	(void)state;
	expect_error("GET / HTTP/1.1\r\n\r\n", 400);
	expect_error("POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 400);
	r = parse_ok("GET / HTTP/1.0\r\n\r\n");
	http_reader_free(r);
	r = parse_ok("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
	http_reader_free(r);
	/* An empty Host is allowed (RFC 9112 §3.2, no authority). */
	r = parse_ok("GET / HTTP/1.1\r\nHost:\r\n\r\n");
	http_reader_free(r);
}

static void
test_stream_body(void **state)
{
	const char *head =
	    "POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 6\r\n\r\n";
	struct http_reader *r;
	size_t n;

	(void)state;
	assert_non_null(r = http_reader_new(NULL));
	assert_int_equal(http_reader_stream_body(r), -1);
	assert_int_equal(http_reader_feed(r, head, strlen(head), &n),
	    HTTP_READ_HEADERS);
	assert_int_equal(http_reader_stream_body(r), 0);
	assert_int_equal(http_reader_feed(r, "abc", 3, &n), HTTP_READ_BODY);
	assert_int_equal(http_reader_request(r)->hr_body_len, 3);
	assert_memory_equal(http_reader_request(r)->hr_body, "abc", 3);
	assert_int_equal(http_reader_feed(r, "de", 2, &n), HTTP_READ_BODY);
	assert_memory_equal(http_reader_request(r)->hr_body, "de", 2);
	assert_int_equal(http_reader_feed(r, "fGET", 4, &n), HTTP_READ_DONE);
	assert_int_equal(n, 1);
	assert_int_equal(http_reader_request(r)->hr_body_len, 1);
	assert_int_equal(http_reader_request(r)->hr_body_total, 6);
	http_reader_free(r);
}

static void
test_reset_reuse(void **state)
{
	struct http_reader *r;
	char body[3000];
	char req[3100];
	int i, len;

	(void)state;
	memset(body, 'q', sizeof(body) - 1);
	body[sizeof(body) - 1] = '\0';
	len = snprintf(req, sizeof(req),
	    "POST /r HTTP/1.1\r\nHost: h\r\nContent-Length: %zu\r\n\r\n%s",
	    strlen(body), body);
	assert_non_null(r = http_reader_new(NULL));
	for (i = 0; i < 50; i++) {
		assert_int_equal(feed_all(r, req, (size_t)len, NULL),
		    HTTP_READ_DONE);
		assert_int_equal(http_reader_request(r)->hr_body_len,
		    strlen(body));
		assert_string_equal(http_reader_request(r)->hr_body, body);
		http_reader_reset(r);
	}
	http_reader_free(r);
	http_reader_free(NULL);
}

static void
test_reason(void **state)
{
	(void)state;
	assert_string_equal(http_status_reason(200), "OK");
	assert_string_equal(http_status_reason(413), "Payload Too Large");
	assert_string_equal(http_status_reason(503), "Service Unavailable");
	assert_string_equal(http_status_reason(431),
	    "Request Header Fields Too Large");
	assert_string_equal(http_status_reason(799), "Unknown");
}

static void
test_out_head(void **state)
{
	struct http_out o;

	(void)state;
	http_out_init(&o);
	assert_int_equal(http_out_status(&o, 200), 0);
	assert_int_equal(http_out_header(&o, "Content-Type", "text/plain"), 0);
	assert_int_equal(http_out_headerf(&o, "Content-Length", "%d", 2), 0);
	assert_int_equal(http_out_end_head(&o), 0);
	assert_int_equal(http_out_append(&o, "OK", 2), 0);
	assert_string_equal(o.ho_buf,
	    "HTTP/1.1 200 OK\r\n"
	    "Content-Type: text/plain\r\n"
	    "Content-Length: 2\r\n\r\nOK");
	assert_int_equal(o.ho_len, strlen(o.ho_buf));

	/* Response splitting attempts are refused and stick. */
	http_out_reset(&o);
	assert_int_equal(http_out_header(&o, "X-A", "a\r\nSet-Cookie: x"), -1);
	assert_true(o.ho_failed);
	assert_int_equal(http_out_header(&o, "X-B", "fine"), -1);
	http_out_reset(&o);
	assert_int_equal(http_out_header(&o, "Bad Name", "v"), -1);
	http_out_reset(&o);
	assert_int_equal(http_out_header_n(&o, "X-N", 3, "a\0b", 3), -1);
	http_out_reset(&o);
	assert_int_equal(http_out_status(&o, 42), -1);
	http_out_free(&o);
}

static void
test_out_chunk_and_digits(void **state)
{
	struct http_out o;
	char big[300], num[HTTP_U64_DIGITS + 1];

	(void)state;
	http_out_init(&o);
	assert_int_equal(http_out_status(&o, 404), 0);
	assert_int_equal(http_out_status(&o, 599), 0);
	assert_string_equal(o.ho_buf,
	    "HTTP/1.1 404 Not Found\r\n"
	    "HTTP/1.1 599 Unknown\r\n");
	http_out_reset(&o);
	assert_int_equal(http_out_chunk(&o, "hello", 5), 0);
	memset(big, 'x', sizeof(big));
	assert_int_equal(http_out_chunk(&o, big, sizeof(big)), 0);
	assert_int_equal(o.ho_len, 3 + 5 + 2 + 5 + 300 + 2);
	assert_memory_equal(o.ho_buf, "5\r\nhello\r\n12c\r\nxxx", 18);
	assert_memory_equal(o.ho_buf + o.ho_len - 3, "x\r\n", 3);
	assert_int_equal(o.ho_buf[o.ho_len], '\0');
	http_out_free(&o);

	assert_int_equal(http_fmt_u64(num, 0), 1);
	assert_string_equal(num, "0");
	assert_int_equal(http_fmt_u64(num, 1234567), 7);
	assert_string_equal(num, "1234567");
	assert_int_equal(http_fmt_u64(num, UINT64_MAX), 20);
	assert_string_equal(num, "18446744073709551615");
}

static void
test_error_body(void **state)
{
	cJSON *j, *e;
	char *s;

	(void)state;
	s = http_error_body(503, "no_available_workers",
	    "All workers are \"unavailable\"\n");
	assert_non_null(s);
	assert_string_equal(s,
	    "{\"error\":{\"type\":\"Service Unavailable\",\"code\":"
	    "\"no_available_workers\",\"message\":\"All workers are "
	    "\\\"unavailable\\\"\\n\",\"param\":null}}");
	assert_non_null(j = cJSON_Parse(s));
	assert_non_null(e = cJSON_GetObjectItem(j, "error"));
	assert_true(cJSON_IsNull(cJSON_GetObjectItem(e, "param")));
	cJSON_Delete(j);
	free(s);
}

static void
test_out_error(void **state)
{
	struct http_out o = { 0 };
	const char *body = "{\"error\":{\"type\":\"Service Unavailable\","
	                   "\"code\":\"no_available_workers\",\"message\":"
	                   "\"busy\",\"param\":null}}";
	char expect[512];

	(void)state;
	assert_int_equal(http_out_error(&o, 503, "no_available_workers", "busy",
	                     "req-abc", 5, true),
	    0);
	snprintf(expect, sizeof(expect),
	    "HTTP/1.1 503 Service Unavailable\r\n"
	    "X-SMG-Error-Code: no_available_workers\r\n"
	    "Content-Type: application/json\r\n"
	    "Content-Length: %zu\r\n"
	    "Retry-After: 5\r\n"
	    "x-request-id: req-abc\r\n"
	    "Connection: keep-alive\r\n\r\n%s",
	    strlen(body), body);
	assert_string_equal(o.ho_buf, expect);

	http_out_reset(&o);
	assert_int_equal(http_out_error(&o, 400, "bad", "x", NULL, 0, false),
	    0);
	assert_non_null(strstr(o.ho_buf, "Connection: close\r\n"));
	assert_null(strstr(o.ho_buf, "Retry-After"));
	assert_null(strstr(o.ho_buf, "x-request-id"));
	http_out_reset(&o);
	assert_int_equal(
	    http_out_error(&o, 400, "bad", "x", "a\r\nb", 0, false), -1);
	http_out_free(&o);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_simple_get),
		cmocka_unit_test(test_target_forms),
		cmocka_unit_test(test_versions),
		cmocka_unit_test(test_keep_alive),
		cmocka_unit_test(test_post_content_length),
		cmocka_unit_test(test_chunked),
		cmocka_unit_test(test_pipelined),
		cmocka_unit_test(test_byte_by_byte),
		cmocka_unit_test(test_expect_continue),
		cmocka_unit_test(test_limits),
		cmocka_unit_test(test_smuggling_framing),
		cmocka_unit_test(test_smuggling_lines),
		cmocka_unit_test(test_smuggling_chunks),
		cmocka_unit_test(test_chunk_data_crlf),
		cmocka_unit_test(test_host_required),
		cmocka_unit_test(test_stream_body),
		cmocka_unit_test(test_reset_reuse),
		cmocka_unit_test(test_reason),
		cmocka_unit_test(test_out_chunk_and_digits),
		cmocka_unit_test(test_out_head),
		cmocka_unit_test(test_error_body),
		cmocka_unit_test(test_out_error),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
