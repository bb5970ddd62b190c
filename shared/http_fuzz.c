/*
 * http_fuzz.c: fuzz target for the request reader of shared/http.c.
 *
 * Each input is read as a connection's byte stream (pipelined requests,
 * reset between them) twice: in one piece and in pieces whose sizes come
 * from the input's first byte. Both readings must agree (same statuses,
 * paths, bodies, bytes consumed unless it failed) and every parsed request must
 * satisfy the reader's contract (among others: an HTTP/1.1 request has a
 * Host header); any disagreement aborts. Error responses are
 * also built from the input to exercise the writer.
 *
 * libFuzzer (clang):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I. shared/http_fuzz.c \
 *       shared/http.c -lhttp_parser -lcjson -o http_fuzz && ./http_fuzz
 * Without libFuzzer, the CMake target http_fuzz (-DHTTP_FUZZ_STANDALONE,
 * tests/fuzz/driver.c) mutates built-in seed requests:
 *   ./build/shared/http_fuzz [iterations (default 100000)] [seed]
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shared/http.h"
#ifdef HTTP_FUZZ_STANDALONE
#include "tests/fuzz/driver.h"
#endif

#define MAX_REQS 64

struct outcome {
	int oc_status[MAX_REQS]; /* read status, or error status + 1000 */
	uint64_t oc_digest[MAX_REQS];
	size_t oc_nreq;
	size_t oc_consumed;
};

int LLVMFuzzerTestOneInput(const uint8_t *, size_t);
static void check_request(const struct http_request *,
    const struct http_limits *);
static uint64_t digest(uint64_t, const void *, size_t);
static void read_stream(const uint8_t *, size_t, size_t, bool,
    struct outcome *);

static uint64_t
digest(uint64_t h, const void *p, size_t n)
{
	const unsigned char *s = p;
	size_t i;

	for (i = 0; i < n; i++)
		h = (h ^ s[i]) * 1099511628211ULL;
	return h;
}

static void
check_request(const struct http_request *q, const struct http_limits *lim)
{
	size_t i, j;

	if (strlen(q->hr_path) != q->hr_path_len ||
	    strlen(q->hr_query) != q->hr_query_len ||
	    q->hr_nheaders > lim->hl_max_headers ||
	    q->hr_body_total > lim->hl_max_body_bytes || q->hr_http_minor > 1 ||
	    q->hr_method_str == NULL)
		abort();
	if (q->hr_chunked && q->hr_content_length != -1)
		abort();
	/* HTTP/1.1 is accepted only with a Host header (RFC 9112 §3.2). */
	if (q->hr_http_minor == 1 && http_request_header(q, "host") == NULL)
		abort();
	for (i = 0; i < q->hr_nheaders; i++) {
		const struct http_header *h = &q->hr_headers[i];

		if (h->hh_name_len == 0 ||
		    strlen(h->hh_name) != h->hh_name_len ||
		    strlen(h->hh_value) != h->hh_value_len)
			abort();
		for (j = 0; j < h->hh_name_len; j++)
			if (h->hh_name[j] >= 'A' && h->hh_name[j] <= 'Z')
				abort();
		for (j = 0; j < h->hh_value_len; j++)
			if (h->hh_value[j] == '\r' || h->hh_value[j] == '\n')
				abort();
	}
}

/* Reads data as one connection, in pieces of at most step bytes. */
static void
read_stream(const uint8_t *data, size_t len, size_t step, bool stream,
    struct outcome *oc)
{
	struct http_limits lim = { .hl_max_header_bytes = 2048,
		.hl_max_headers = 16,
		.hl_max_body_bytes = 4096 };
	const struct http_request *q;
	enum http_read_status st;
	struct http_reader *r;
	size_t off = 0, piece, n;
	uint64_t body = 1469598103934665603ULL;

	memset(oc, 0, sizeof(*oc));
	if ((r = http_reader_new(&lim)) == NULL)
		abort();
	while (oc->oc_nreq < MAX_REQS) {
		piece = len - off < step ? len - off : step;
		st = http_reader_feed(r, (const char *)data + off, piece, &n);
		if (n > piece)
			abort();
		off += n;
		q = http_reader_request(r);
		if (st == HTTP_READ_HEADERS) {
			if (q == NULL)
				abort();
			if (stream)
				http_reader_stream_body(r);
			continue;
		}
		if (st == HTTP_READ_BODY || st == HTTP_READ_DONE) {
			check_request(q, &lim);
			body = digest(body, q->hr_body, q->hr_body_len);
		}
		if (st == HTTP_READ_BODY)
			continue;
		if (st == HTTP_READ_AGAIN) {
			if (n != piece)
				abort();
			if (off == len)
				break;
			continue;
		}
		if (st == HTTP_READ_ERROR) {
			/* Where the error was noticed may differ. */
			oc->oc_status[oc->oc_nreq++] =
			    1000 + http_reader_error(r, NULL);
			off = 0;
			break;
		}
		oc->oc_status[oc->oc_nreq] = (int)st;
		oc->oc_digest[oc->oc_nreq] =
		    digest(digest(body, q->hr_path, q->hr_path_len),
		        q->hr_query, q->hr_query_len);
		oc->oc_nreq++;
		body = 1469598103934665603ULL;
		http_reader_reset(r);
	}
	oc->oc_consumed = off;
	http_reader_free(r);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
	struct outcome whole, split;
	struct http_out o = { 0 };
	size_t step, i;
	char msg[64];
	bool stream;

	if (len == 0)
		return 0;
	step = (size_t)(data[0] % 7) + 1;
	stream = (data[0] & 0x80) != 0;
	data++;
	len--;
	read_stream(data, len, len ? len : 1, stream, &whole);
	read_stream(data, len, step, stream, &split);
	if (whole.oc_nreq != split.oc_nreq ||
	    whole.oc_consumed != split.oc_consumed)
		abort();
	for (i = 0; i < whole.oc_nreq; i++)
		if (whole.oc_status[i] != split.oc_status[i] ||
		    whole.oc_digest[i] != split.oc_digest[i])
			abort();

	i = len < sizeof(msg) - 1 ? len : sizeof(msg) - 1;
	memcpy(msg, data, i);
	msg[i] = '\0';
	http_out_error(&o, 400 + (int)(len % 200), msg, msg, msg, (int)len % 3,
	    (len & 1) != 0);
	if (!o.ho_failed && memchr(o.ho_buf, '\0', o.ho_len) != NULL)
		abort();
	http_out_free(&o);
	return 0;
}

#ifdef HTTP_FUZZ_STANDALONE
static const char *const seeds[] = {
	"GET /v1/models?x=1 HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n",
	"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\n"
	"Content-Length: 17\r\nExpect: "
	"100-continue\r\n\r\n{\"model\":\"m\",\"a\"}",
	"POST /generate HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
	"\r\n4;ext=1\r\nWiki\r\n5\r\npedia\r\n0\r\nTrailer: t\r\n\r\n",
	"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
	"GET http://h:1/p?q#f HTTP/1.1\r\nHost: h:1\r\n\r\n",
	"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"
	"POST /b HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: "
	"chunked\r\n\r\n1\r\nz\r\n0\r\n\r\n",
	"OPTIONS * HTTP/1.1\r\nHost: a\r\nX-Smg-Routing-Key: k\r\n\r\n",
	/* Refused: HTTP/1.1 without Host; chunk data not followed by CRLF. */
	"GET /v1/models HTTP/1.1\r\nAccept: */*\r\n\r\n",
	"POST /generate HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
	"\r\n8\r\nabcdefghXY0\r\n\r\n",
	"POST /generate HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
	"\r\n3\r\nabc\r\n2\r\nde\n\n0\r\n\r\n",
};

static const char *const tokens[] = { "\r\n", "\n", "\r", " ", "\t", ":",
	"\r\n\r\n", "0\r\n\r\n", "Content-Length: 5\r\n",
	"Transfer-Encoding: chunked\r\n", "ffffffff", ";", "\0", "HTTP/1.1",
	"?", "#", "Connection: close\r\n", "Upgrade: x\r\n", "Host: h\r\n",
	"XY", "\r\n0\r\n" };

#define NSEEDS  (sizeof(seeds) / sizeof(seeds[0]))
#define NTOKENS (sizeof(tokens) / sizeof(tokens[0]))

static size_t
http_seed(uint8_t *buf, size_t cap, uint32_t pick)
{
	const char *t = seeds[pick % NSEEDS];
	size_t len = strlen(t) < cap ? strlen(t) : cap;

	memcpy(buf, t, len);
	return len;
}

/* A token that matters to the reader: line ends, framing headers. */
static size_t
http_insert(uint8_t *buf, size_t len, size_t cap, size_t pos, uint32_t pick)
{
	const char *t = tokens[pick % NTOKENS];
	size_t tl = t[0] ? strlen(t) : 1;

	if (len + tl > cap)
		return len;
	memmove(buf + pos + tl, buf + pos, len - pos);
	memcpy(buf + pos, t, tl);
	return len + tl;
}

int
main(int argc, char **argv)
{
	static const struct fuzz_target t = {
		.ft_name = "http_fuzz",
		.ft_iters = 100000,
		.ft_delete_max = 7,
		.ft_seed = http_seed,
		.ft_insert = http_insert,
	};

	return fuzz_driver_main(argc, argv, &t);
}
#endif /* HTTP_FUZZ_STANDALONE */
