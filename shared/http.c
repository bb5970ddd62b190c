/*
 * http.c: HTTP/1.1 request reading over http-parser, with a strict scan of
 * the header block and of chunked framing in front of it, and response
 * writing helpers.
 *
 * The header block is collected in the reader's own buffer up to its blank
 * line, checked line by line, then handed whole to http-parser, which then
 * frames the body from the caller's bytes. The header strings stay in that
 * buffer and are NUL-terminated in place once http-parser is done with it.
 */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>

#include "shared/http.h"

#define HDR_INITIAL_CAP  2048
#define HEADERS_INITIAL  16
#define BODY_INITIAL_CAP 4096
/* A body buffer above this is released by reset, not kept for the next
 * request of the connection. */
#define BODY_KEEP_MAX (1024 * 1024)

enum reader_state {
	R_HEAD = 0, /* collecting the header block */
	R_BODY, /* head reported; framing the body */
	R_DONE,
	R_ERROR,
};

struct http_reader {
	struct http_limits r_lim;
	http_parser r_parser;
	enum reader_state r_state;
	bool r_complete; /* http-parser reported message complete */
	bool r_stream; /* body pieces handed out instead of kept */
	bool r_may_stream;

	char *r_hdr; /* the header block */
	size_t r_hdr_len;
	size_t r_hdr_cap;
	size_t r_line_start; /* offset of the line being collected */
	size_t r_nlines; /* complete lines of the block so far */

	struct http_header *r_headers;
	size_t r_headers_cap;

	char *r_body;
	size_t r_body_len;
	size_t r_body_cap;

	/* Chunked framing scan, across feeds. */
	const char *r_fr_pos; /* next framing byte of the current execute */
	size_t r_fr_line; /* bytes in the current framing line */
	bool r_fr_cr; /* last framing byte was CR */
	unsigned r_fr_after_data; /* bytes of the CRLF owed after chunk data */

	int r_err_status;
	const char *r_err_reason;

	struct http_request r_req;
};

static int reader_fail(struct http_reader *, int, const char *);
static int hdr_reserve(struct http_reader *, size_t);
static int body_reserve(struct http_reader *, size_t);
static enum http_read_status feed_head(struct http_reader *, const char *,
    size_t, size_t *);
static enum http_read_status feed_body(struct http_reader *, const char *,
    size_t, size_t *);
static int head_complete(struct http_reader *);
static int check_request_line(struct http_reader *, size_t, size_t *, size_t *,
    unsigned *);
static int check_header_lines(struct http_reader *, size_t);
static int check_framing(struct http_reader *, unsigned);
static int split_target(struct http_reader *, size_t, size_t);
static int scan_framing(struct http_reader *, const char *);
static int on_body(http_parser *, const char *, size_t);
static int on_message_complete(http_parser *);
static bool is_tchar(unsigned char);
static bool digits_only(const char *, size_t);
static int out_reserve(struct http_out *, size_t);

static const http_parser_settings reader_settings = {
	.on_body = on_body,
	.on_message_complete = on_message_complete,
};

struct http_reader *
http_reader_new(const struct http_limits *limits)
{
	struct http_reader *r;

	if ((r = calloc(1, sizeof(*r))) == NULL)
		return NULL;
	if (limits != NULL)
		r->r_lim = *limits;
	if (r->r_lim.hl_max_header_bytes == 0)
		r->r_lim.hl_max_header_bytes = HTTP_DEFAULT_MAX_HEADER_BYTES;
	if (r->r_lim.hl_max_headers == 0)
		r->r_lim.hl_max_headers = HTTP_DEFAULT_MAX_HEADERS;
	if (r->r_lim.hl_max_body_bytes == 0)
		r->r_lim.hl_max_body_bytes = HTTP_DEFAULT_MAX_BODY_BYTES;
	/*
	 * http-parser counts header and trailer bytes against a process-wide
	 * cap (80 KiB unless raised); ours is checked first, so only make
	 * sure theirs is never the smaller one.
	 */
	if (r->r_lim.hl_max_header_bytes > 80 * 1024 &&
	    r->r_lim.hl_max_header_bytes < UINT32_MAX - 1024)
		http_parser_set_max_header_size(
		    (uint32_t)r->r_lim.hl_max_header_bytes + 1024);
	http_reader_reset(r);
	return r;
}

void
http_reader_free(struct http_reader *r)
{
	if (r == NULL)
		return;
	free(r->r_hdr);
	free(r->r_headers);
	free(r->r_body);
	free(r);
}

void
http_reader_reset(struct http_reader *r)
{
	http_parser_init(&r->r_parser, HTTP_REQUEST);
	r->r_parser.data = r;
	r->r_state = R_HEAD;
	r->r_complete = false;
	r->r_stream = false;
	r->r_may_stream = false;
	r->r_hdr_len = 0;
	r->r_line_start = 0;
	r->r_nlines = 0;
	if (r->r_body_cap > BODY_KEEP_MAX) {
		free(r->r_body);
		r->r_body = NULL;
		r->r_body_cap = 0;
	}
	r->r_body_len = 0;
	r->r_fr_pos = NULL;
	r->r_fr_line = 0;
	r->r_fr_cr = false;
	r->r_fr_after_data = 0;
	r->r_err_status = 0;
	r->r_err_reason = NULL;
	memset(&r->r_req, 0, sizeof(r->r_req));
}

const struct http_request *
http_reader_request(const struct http_reader *r)
{
	if (r->r_state == R_HEAD ||
	    (r->r_state == R_ERROR && r->r_req.hr_path == NULL))
		return NULL;
	return &r->r_req;
}

int
http_reader_error(const struct http_reader *r, const char **reason)
{
	if (reason != NULL)
		*reason = r->r_err_reason;
	return r->r_state == R_ERROR ? r->r_err_status : 0;
}

int
http_reader_stream_body(struct http_reader *r)
{
	if (r->r_state != R_BODY || !r->r_may_stream)
		return -1;
	r->r_stream = true;
	return 0;
}

enum http_read_status
http_reader_feed(struct http_reader *r, const char *data, size_t len,
    size_t *consumed)
{
	*consumed = 0;
	switch (r->r_state) {
	case R_HEAD:
		return feed_head(r, data, len, consumed);
	case R_BODY:
		return feed_body(r, data, len, consumed);
	case R_DONE:
		return HTTP_READ_DONE;
	case R_ERROR:
		break;
	}
	return HTTP_READ_ERROR;
}

const struct http_header *
http_request_header(const struct http_request *req, const char *name)
{
	size_t i;

	for (i = 0; i < req->hr_nheaders; i++)
		if (strcasecmp(req->hr_headers[i].hh_name, name) == 0)
			return &req->hr_headers[i];
	return NULL;
}

size_t
http_request_header_count(const struct http_request *req, const char *name)
{
	size_t i, n = 0;

	for (i = 0; i < req->hr_nheaders; i++)
		if (strcasecmp(req->hr_headers[i].hh_name, name) == 0)
			n++;
	return n;
}

static int
reader_fail(struct http_reader *r, int status, const char *reason)
{
	if (r->r_state != R_ERROR) {
		r->r_state = R_ERROR;
		r->r_err_status = status;
		r->r_err_reason = reason;
	}
	return -1;
}

static int
hdr_reserve(struct http_reader *r, size_t need)
{
	size_t cap;
	char *p;

	if (need <= r->r_hdr_cap)
		return 0;
	cap = r->r_hdr_cap ? r->r_hdr_cap : HDR_INITIAL_CAP;
	while (cap < need)
		cap *= 2;
	if ((p = realloc(r->r_hdr, cap)) == NULL)
		return -1;
	r->r_hdr = p;
	r->r_hdr_cap = cap;
	return 0;
}

/* Room for need body bytes plus a NUL, growing geometrically. */
static int
body_reserve(struct http_reader *r, size_t need)
{
	size_t cap;
	char *p;

	if (need + 1 <= r->r_body_cap)
		return 0;
	if (r->r_body_cap != 0)
		cap = r->r_body_cap;
	else if (r->r_req.hr_content_length > 0 &&
	    r->r_req.hr_content_length < BODY_KEEP_MAX)
		cap = (size_t)r->r_req.hr_content_length + 1;
	else
		cap = BODY_INITIAL_CAP;
	while (cap < need + 1) {
		if (cap > SIZE_MAX / 2)
			return -1;
		cap *= 2;
	}
	if ((p = realloc(r->r_body, cap)) == NULL)
		return -1;
	r->r_body = p;
	r->r_body_cap = cap;
	return 0;
}

/*
 * Collects the header block byte by byte, rejecting bare CR and bare LF as
 * soon as they are seen and enforcing the size and line limits, so nothing
 * unbounded is ever buffered.
 */
static enum http_read_status
feed_head(struct http_reader *r, const char *data, size_t len, size_t *consumed)
{
	size_t i, max = r->r_lim.hl_max_header_bytes, room;
	unsigned char c, prev;

	room = r->r_hdr_len + len;
	if (room > max + 1)
		room = max + 1;
	if (hdr_reserve(r, room) == -1) {
		reader_fail(r, 503, "out of memory");
		return HTTP_READ_ERROR;
	}
	for (i = 0; i < len; i++) {
		c = (unsigned char)data[i];
		prev = r->r_hdr_len ? (unsigned char)r->r_hdr[r->r_hdr_len - 1]
		                    : 0;
		if (r->r_hdr_len >= max) {
			reader_fail(r, 431, "request header block too large");
			*consumed = i;
			return HTTP_READ_ERROR;
		}
		r->r_hdr[r->r_hdr_len++] = (char)c;
		if (prev == '\r' && c != '\n') {
			reader_fail(r, 400, "bare CR in request head");
			*consumed = i + 1;
			return HTTP_READ_ERROR;
		}
		if (c != '\n')
			continue;
		if (prev != '\r') {
			reader_fail(r, 400, "bare LF in request head");
			*consumed = i + 1;
			return HTTP_READ_ERROR;
		}
		if (r->r_hdr_len - r->r_line_start > 2) {
			r->r_nlines++;
			if (r->r_nlines > r->r_lim.hl_max_headers + 1) {
				reader_fail(r, 431, "too many request headers");
				*consumed = i + 1;
				return HTTP_READ_ERROR;
			}
			r->r_line_start = r->r_hdr_len;
			continue;
		}
		if (r->r_nlines == 0) {
			/* Empty lines before the request line are ignored. */
			r->r_hdr_len = 0;
			r->r_line_start = 0;
			continue;
		}
		*consumed = i + 1;
		if (head_complete(r) == -1)
			return HTTP_READ_ERROR;
		return HTTP_READ_HEADERS;
	}
	*consumed = len;
	return HTTP_READ_AGAIN;
}

/* The block in r_hdr is complete: check it, parse it, expose the request. */
static int
head_complete(struct http_reader *r)
{
	struct http_request *req = &r->r_req;
	size_t line_end, t0, t1, nparsed;
	unsigned minor;
	enum http_errno err;

	if (check_request_line(r, 0, &t0, &t1, &minor) == -1)
		return -1;
	line_end =
	    (size_t)((char *)memchr(r->r_hdr, '\r', r->r_hdr_len) - r->r_hdr);
	if (check_header_lines(r, line_end + 2) == -1)
		return -1;
	if (check_framing(r, minor) == -1)
		return -1;

	nparsed = http_parser_execute(&r->r_parser, &reader_settings, r->r_hdr,
	    r->r_hdr_len);
	err = HTTP_PARSER_ERRNO(&r->r_parser);
	if (err == HPE_PAUSED) {
		/* No body: the message ended with the block. */
		http_parser_pause(&r->r_parser, 0);
	} else if (err != HPE_OK) {
		return reader_fail(r, 400, http_errno_description(err));
	} else if (nparsed != r->r_hdr_len) {
		return reader_fail(r, 400, "malformed request head");
	}
	/* An Upgrade request is served as an ordinary request: http-parser
	 * frames its body (if any) as usual and the reader stops after it. */

	req->hr_method = (enum http_method)r->r_parser.method;
	req->hr_method_str = http_method_str(req->hr_method);
	req->hr_http_minor = r->r_parser.http_minor > 0 ? 1 : 0;
	req->hr_keep_alive = http_should_keep_alive(&r->r_parser) != 0;
	req->hr_headers = r->r_headers;
	req->hr_body = "";
	if (split_target(r, t0, t1) == -1)
		return -1;
	r->r_state = R_BODY;
	r->r_may_stream = !r->r_complete;
	return 0;
}

/*
 * request-line = method SP request-target SP HTTP/1.x CRLF, nothing more.
 * Sets the target span and the minor version.
 */
static int
check_request_line(struct http_reader *r, size_t start, size_t *t0, size_t *t1,
    unsigned *minor)
{
	const char *s = r->r_hdr + start, *v;
	size_t i = 0, n;

	n = (size_t)((char *)memchr(s, '\r', r->r_hdr_len - start) - s);
	while (i < n && is_tchar((unsigned char)s[i]))
		i++;
	if (i == 0 || i >= n || s[i] != ' ')
		return reader_fail(r, 400, "malformed request line");
	if (i == 7 && memcmp(s, "CONNECT", 7) == 0)
		return reader_fail(r, 501, "CONNECT not supported");
	*t0 = start + ++i;
	while (i < n && s[i] > 0x20 && s[i] < 0x7f)
		i++;
	if (start + i == *t0 || i >= n || s[i] != ' ')
		return reader_fail(r, 400, "malformed request target");
	*t1 = start + i++;
	v = s + i;
	n -= i;
	if (n < 6 || memcmp(v, "HTTP/", 5) != 0)
		return reader_fail(r, 400, "malformed HTTP version");
	if (n == 8 && v[5] == '1' && v[6] == '.' && v[7] >= '0' &&
	    v[7] <= '9') {
		*minor = (unsigned)(v[7] - '0');
		return 0;
	}
	if (n == 8 && v[5] >= '0' && v[5] <= '9' && v[6] == '.' &&
	    v[7] >= '0' && v[7] <= '9')
		return reader_fail(r, 505, "HTTP version not supported");
	return reader_fail(r, 400, "malformed HTTP version");
}

/*
 * field-line = field-name ":" OWS field-value OWS CRLF, where the name is a
 * token and the value holds only HTAB, SP, VCHAR and obs-text. Fills
 * r_headers with spans (NUL-terminated later).
 */
static int
check_header_lines(struct http_reader *r, size_t pos)
{
	struct http_request *req = &r->r_req;
	struct http_header *h, *nh;
	size_t end, i, ncap;
	const char *s;
	unsigned char c;

	req->hr_nheaders = 0;
	while (pos + 2 < r->r_hdr_len) {
		s = r->r_hdr + pos;
		end = (size_t)((char *)memchr(s, '\r', r->r_hdr_len - pos) - s);
		if (s[0] == ' ' || s[0] == '\t')
			return reader_fail(r, 400, "obsolete line folding");
		for (i = 0; i < end && is_tchar((unsigned char)s[i]); i++)
			;
		if (i == end || s[i] != ':') {
			if (i < end && (s[i] == ' ' || s[i] == '\t'))
				return reader_fail(r, 400,
				    "whitespace before header colon");
			return reader_fail(r, 400, "invalid header name");
		}
		if (i == 0)
			return reader_fail(r, 400, "empty header name");
		if (req->hr_nheaders >= r->r_lim.hl_max_headers)
			return reader_fail(r, 431, "too many request headers");
		if (req->hr_nheaders == r->r_headers_cap) {
			ncap = r->r_headers_cap ? r->r_headers_cap * 2
			                        : HEADERS_INITIAL;
			nh = reallocarray(r->r_headers, ncap, sizeof(*nh));
			if (nh == NULL)
				return reader_fail(r, 503, "out of memory");
			r->r_headers = nh;
			r->r_headers_cap = ncap;
		}
		h = &r->r_headers[req->hr_nheaders++];
		h->hh_name = s;
		h->hh_name_len = i;
		for (i++; i < end && (s[i] == ' ' || s[i] == '\t'); i++)
			;
		h->hh_value = s + i;
		for (; i < end; i++) {
			c = (unsigned char)s[i];
			if ((c < 0x20 && c != '\t') || c == 0x7f)
				return reader_fail(r, 400,
				    "control character in header value");
		}
		while (i > (size_t)(h->hh_value - s) &&
		    (s[i - 1] == ' ' || s[i - 1] == '\t'))
			i--;
		h->hh_value_len = i - (size_t)(h->hh_value - s);
		pos += end + 2;
	}
	return 0;
}

static bool
span_eq(const struct http_header *h, const char *name)
{
	return h->hh_name_len == strlen(name) &&
	    strncasecmp(h->hh_name, name, h->hh_name_len) == 0;
}

/* Message framing and the other checks that need the whole header set. */
static int
check_framing(struct http_reader *r, unsigned minor)
{
	struct http_request *req = &r->r_req;
	const struct http_header *h, *cl = NULL, *te = NULL, *expect = NULL;
	size_t i, ncl = 0, nte = 0, nhost = 0;
	uint64_t v = 0;

	for (i = 0; i < req->hr_nheaders; i++) {
		h = &r->r_headers[i];
		if (span_eq(h, "content-length")) {
			cl = h;
			ncl++;
		} else if (span_eq(h, "transfer-encoding")) {
			te = h;
			nte++;
		} else if (span_eq(h, "host")) {
			nhost++;
		} else if (span_eq(h, "expect")) {
			expect = h;
		}
	}
	if (ncl > 0 && nte > 0)
		return reader_fail(r, 400,
		    "both Content-Length and Transfer-Encoding");
	if (ncl > 1)
		return reader_fail(r, 400, "multiple Content-Length headers");
	if (nhost > 1)
		return reader_fail(r, 400, "multiple Host headers");
	/* RFC 9112 §3.2; http-parser does not check it. */
	if (nhost == 0 && minor > 0)
		return reader_fail(r, 400, "missing Host header");
	req->hr_content_length = -1;
	if (cl != NULL) {
		if (!digits_only(cl->hh_value, cl->hh_value_len))
			return reader_fail(r, 400, "invalid Content-Length");
		for (i = 0; i < cl->hh_value_len; i++) {
			if (v > (UINT64_MAX - 9) / 10)
				return reader_fail(r, 413,
				    "request body too large");
			v = v * 10 + (uint64_t)(cl->hh_value[i] - '0');
		}
		if (v > r->r_lim.hl_max_body_bytes || v > INT64_MAX)
			return reader_fail(r, 413, "request body too large");
		req->hr_content_length = (int64_t)v;
	}
	if (te != NULL) {
		if (minor == 0)
			return reader_fail(r, 400,
			    "Transfer-Encoding in an HTTP/1.0 request");
		if (nte > 1 || te->hh_value_len != 7 ||
		    strncasecmp(te->hh_value, "chunked", 7) != 0)
			return reader_fail(r, 501,
			    "unsupported transfer coding");
		req->hr_chunked = true;
	}
	if (expect != NULL && minor > 0) {
		if (expect->hh_value_len != 12 ||
		    strncasecmp(expect->hh_value, "100-continue", 12) != 0)
			return reader_fail(r, 417, "unsupported expectation");
		req->hr_expect_continue = true;
	}
	return 0;
}

/*
 * Splits the request target r_hdr[t0..t1) into path and query and
 * NUL-terminates the header strings in place; http-parser no longer reads
 * the block.
 */
static int
split_target(struct http_reader *r, size_t t0, size_t t1)
{
	struct http_request *req = &r->r_req;
	struct http_parser_url u;
	struct http_header *h;
	char *t = r->r_hdr + t0, *q, *f;
	size_t n = t1 - t0, i, j, off, pend, qoff, qlen;
	bool has_query = false;

	for (i = 0; i < req->hr_nheaders; i++) {
		h = &r->r_headers[i];
		off = (size_t)(h->hh_name - r->r_hdr);
		for (j = 0; j < h->hh_name_len; j++)
			if (r->r_hdr[off + j] >= 'A' &&
			    r->r_hdr[off + j] <= 'Z')
				r->r_hdr[off + j] += 'a' - 'A';
		/* After a name comes ':'; after a trimmed value SP, HT or CR.
		 */
		r->r_hdr[off + h->hh_name_len] = '\0';
		off = (size_t)(h->hh_value - r->r_hdr);
		r->r_hdr[off + h->hh_value_len] = '\0';
	}
	r->r_hdr[t1] = '\0';

	if (t[0] == '/') {
		f = memchr(t, '#', n);
		if (f != NULL) {
			*f = '\0';
			n = (size_t)(f - t);
		}
		q = memchr(t, '?', n);
		if (q != NULL) {
			*q = '\0';
			req->hr_path = t;
			req->hr_path_len = (size_t)(q - t);
			req->hr_query = q + 1;
			req->hr_query_len = n - req->hr_path_len - 1;
			req->hr_has_query = true;
		} else {
			req->hr_path = t;
			req->hr_path_len = n;
			req->hr_query = "";
		}
		return 0;
	}
	if (n == 1 && t[0] == '*') {
		if (req->hr_method != HTTP_OPTIONS)
			return reader_fail(r, 400, "invalid request target");
		req->hr_path = t;
		req->hr_path_len = 1;
		req->hr_query = "";
		return 0;
	}
	http_parser_url_init(&u);
	if (http_parser_parse_url(t, n, 0, &u) != 0 ||
	    !(u.field_set & (1 << UF_SCHEMA)) ||
	    !(u.field_set & (1 << UF_HOST)))
		return reader_fail(r, 400, "invalid request target");
	if ((u.field_set & (1 << UF_QUERY))) {
		has_query = true;
		qoff = u.field_data[UF_QUERY].off;
		qlen = u.field_data[UF_QUERY].len;
	} else {
		qoff = n;
		qlen = 0;
	}
	if (u.field_set & (1 << UF_PATH)) {
		req->hr_path = t + u.field_data[UF_PATH].off;
		req->hr_path_len = u.field_data[UF_PATH].len;
		pend = u.field_data[UF_PATH].off + u.field_data[UF_PATH].len;
		if (pend < n)
			t[pend] = '\0';
	} else {
		req->hr_path = "/";
		req->hr_path_len = 1;
	}
	if (has_query) {
		req->hr_query = t + qoff;
		req->hr_query_len = qlen;
		req->hr_has_query = true;
		if (qoff + qlen < n)
			t[qoff + qlen] = '\0';
	} else {
		req->hr_query = "";
	}
	return 0;
}

static enum http_read_status
feed_body(struct http_reader *r, const char *data, size_t len, size_t *consumed)
{
	struct http_request *req = &r->r_req;
	enum http_errno err;
	size_t n;

	r->r_may_stream = false;
	if (r->r_stream)
		r->r_body_len = 0;
	if (!r->r_complete && len > 0) {
		r->r_fr_pos = data;
		n = http_parser_execute(&r->r_parser, &reader_settings, data,
		    len);
		*consumed = n;
		if (r->r_state == R_ERROR)
			return HTTP_READ_ERROR;
		err = HTTP_PARSER_ERRNO(&r->r_parser);
		if (err == HPE_PAUSED)
			http_parser_pause(&r->r_parser, 0);
		else if (err != HPE_OK) {
			reader_fail(r, 400, http_errno_description(err));
			return HTTP_READ_ERROR;
		}
		if (req->hr_chunked && scan_framing(r, data + n) == -1)
			return HTTP_READ_ERROR;
	}
	req->hr_body = r->r_body != NULL ? r->r_body : "";
	req->hr_body_len = r->r_body_len;
	if (r->r_complete) {
		r->r_state = R_DONE;
		return HTTP_READ_DONE;
	}
	if (r->r_stream && r->r_body_len > 0)
		return HTTP_READ_BODY;
	return HTTP_READ_AGAIN;
}

/*
 * Checks chunked framing bytes (size lines, the CRLF after each chunk's
 * data, trailers) from r_fr_pos up to end: CRLF line ends only, no control
 * characters, bounded line length, and exactly CRLF right after chunk data
 * (http-parser built without HTTP_PARSER_STRICT, as Debian's is, takes any
 * two bytes there). http-parser decodes them; this only refuses what it
 * would let through.
 */
static int
scan_framing(struct http_reader *r, const char *end)
{
	const char *p;
	unsigned char c;

	for (p = r->r_fr_pos; p < end; p++) {
		c = (unsigned char)*p;
		if (r->r_fr_after_data > 0) {
			if (c != (r->r_fr_after_data == 2 ? '\r' : '\n'))
				return reader_fail(r, 400,
				    "missing CRLF after chunk data");
			r->r_fr_after_data--;
			continue;
		}
		if (r->r_fr_cr) {
			if (c != '\n')
				return reader_fail(r, 400,
				    "bare CR in chunked framing");
			r->r_fr_cr = false;
			r->r_fr_line = 0;
			continue;
		}
		if (c == '\r') {
			r->r_fr_cr = true;
			continue;
		}
		if (c == '\n')
			return reader_fail(r, 400,
			    "bare LF in chunked framing");
		if ((c < 0x20 && c != '\t') || c == 0x7f)
			return reader_fail(r, 400,
			    "control character in chunked framing");
		if (++r->r_fr_line > HTTP_CHUNK_LINE_MAX)
			return reader_fail(r, 400, "chunk line too long");
	}
	r->r_fr_pos = end;
	return 0;
}

static int
on_body(http_parser *p, const char *at, size_t len)
{
	struct http_reader *r = p->data;
	struct http_request *req = &r->r_req;

	if (req->hr_chunked && scan_framing(r, at) == -1)
		return -1;
	r->r_fr_pos = at + len;
	/* The pieces of one chunk's data are contiguous, so the next framing
	 * byte after any piece is the CR that ends the chunk. */
	if (req->hr_chunked)
		r->r_fr_after_data = 2;
	if (len > r->r_lim.hl_max_body_bytes - req->hr_body_total) {
		reader_fail(r, 413, "request body too large");
		return -1;
	}
	if (body_reserve(r, r->r_body_len + len) == -1) {
		reader_fail(r, 503, "out of memory");
		return -1;
	}
	memcpy(r->r_body + r->r_body_len, at, len);
	r->r_body_len += len;
	r->r_body[r->r_body_len] = '\0';
	req->hr_body_total += len;
	return 0;
}

static int
on_message_complete(http_parser *p)
{
	struct http_reader *r = p->data;

	r->r_complete = true;
	/* Stop here: the bytes after this request belong to the next one. */
	http_parser_pause(p, 1);
	return 0;
}

static bool
is_tchar(unsigned char c)
{
	if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	    (c >= '0' && c <= '9'))
		return true;
	return c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool
digits_only(const char *s, size_t n)
{
	size_t i;

	if (n == 0)
		return false;
	for (i = 0; i < n; i++)
		if (s[i] < '0' || s[i] > '9')
			return false;
	return true;
}

/* ------------------------------------------------------------- writing */

const char *
http_status_reason(int status)
{
	const char *s;

	s = http_status_str((enum http_status)status);
	if (s == NULL || s[0] == '<')
		return "Unknown";
	return s;
}

void
http_out_init(struct http_out *o)
{
	memset(o, 0, sizeof(*o));
}

void
http_out_reset(struct http_out *o)
{
	o->ho_len = 0;
	o->ho_failed = false;
}

void
http_out_free(struct http_out *o)
{
	free(o->ho_buf);
	http_out_init(o);
}

static int
out_reserve(struct http_out *o, size_t more)
{
	size_t cap;
	char *p;

	if (o->ho_failed)
		return -1;
	if (more > SIZE_MAX - o->ho_len - 1) {
		o->ho_failed = true;
		return -1;
	}
	if (o->ho_len + more + 1 <= o->ho_cap)
		return 0;
	cap = o->ho_cap ? o->ho_cap : 512;
	while (cap < o->ho_len + more + 1)
		cap *= 2;
	if ((p = realloc(o->ho_buf, cap)) == NULL) {
		o->ho_failed = true;
		return -1;
	}
	o->ho_buf = p;
	o->ho_cap = cap;
	return 0;
}

int
http_out_append(struct http_out *o, const void *data, size_t len)
{
	if (out_reserve(o, len) == -1)
		return -1;
	if (len > 0)
		memcpy(o->ho_buf + o->ho_len, data, len);
	o->ho_len += len;
	o->ho_buf[o->ho_len] = '\0';
	return 0;
}

int
http_out_chunk(struct http_out *o, const void *data, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	char head[2 * sizeof(size_t) + 2], *p = head + sizeof(head);
	size_t v = len, hl;

	*--p = '\n';
	*--p = '\r';
	do {
		*--p = hex[v & 0xf];
		v >>= 4;
	} while (v != 0);
	hl = (size_t)(head + sizeof(head) - p);
	if (len > SIZE_MAX - hl - 2 || out_reserve(o, hl + len + 2) == -1) {
		o->ho_failed = true;
		return -1;
	}
	memcpy(o->ho_buf + o->ho_len, p, hl);
	memcpy(o->ho_buf + o->ho_len + hl, data, len);
	memcpy(o->ho_buf + o->ho_len + hl + len, "\r\n", 2);
	o->ho_len += hl + len + 2;
	o->ho_buf[o->ho_len] = '\0';
	return 0;
}

size_t
http_fmt_u64(char *buf, uint64_t v)
{
	char tmp[HTTP_U64_DIGITS], *p = tmp + sizeof(tmp);
	size_t n;

	do {
		*--p = (char)('0' + v % 10);
		v /= 10;
	} while (v != 0);
	n = (size_t)(tmp + sizeof(tmp) - p);
	memcpy(buf, p, n);
	buf[n] = '\0';
	return n;
}

int
http_out_status(struct http_out *o, int status)
{
	const char *reason;
	char line[128];
	size_t rl;

	if (status < 100 || status > 999) {
		o->ho_failed = true;
		return -1;
	}
	reason = http_status_reason(status);
	rl = strlen(reason);
	if (rl > sizeof(line) - 15)
		rl = sizeof(line) - 15;
	memcpy(line, "HTTP/1.1 ", 9);
	line[9] = (char)('0' + status / 100);
	line[10] = (char)('0' + status / 10 % 10);
	line[11] = (char)('0' + status % 10);
	line[12] = ' ';
	memcpy(line + 13, reason, rl);
	memcpy(line + 13 + rl, "\r\n", 2);
	return http_out_append(o, line, 13 + rl + 2);
}

int
http_out_header_n(struct http_out *o, const char *name, size_t name_len,
    const char *value, size_t value_len)
{
	size_t i;

	if (o->ho_failed)
		return -1;
	for (i = 0; i < name_len; i++)
		if (!is_tchar((unsigned char)name[i]))
			break;
	if (name_len == 0 || i < name_len)
		goto refused;
	for (i = 0; i < value_len; i++)
		if (value[i] == '\r' || value[i] == '\n' || value[i] == '\0')
			goto refused;
	if (out_reserve(o, name_len + value_len + 4) == -1)
		return -1;
	http_out_append(o, name, name_len);
	http_out_append(o, ": ", 2);
	http_out_append(o, value, value_len);
	return http_out_append(o, "\r\n", 2);
refused:
	o->ho_failed = true;
	return -1;
}

int
http_out_header(struct http_out *o, const char *name, const char *value)
{
	return http_out_header_n(o, name, strlen(name), value, strlen(value));
}

int
http_out_headerf(struct http_out *o, const char *name, const char *fmt, ...)
{
	va_list ap;
	char small[256], *buf = small;
	int n, rv;

	va_start(ap, fmt);
	n = vsnprintf(small, sizeof(small), fmt, ap);
	va_end(ap);
	if (n < 0) {
		o->ho_failed = true;
		return -1;
	}
	if ((size_t)n >= sizeof(small)) {
		if ((buf = malloc((size_t)n + 1)) == NULL) {
			o->ho_failed = true;
			return -1;
		}
		va_start(ap, fmt);
		vsnprintf(buf, (size_t)n + 1, fmt, ap);
		va_end(ap);
	}
	rv = http_out_header_n(o, name, strlen(name), buf, (size_t)n);
	if (buf != small)
		free(buf);
	return rv;
}

int
http_out_end_head(struct http_out *o)
{
	if (o->ho_extra != NULL &&
	    http_out_append(o, o->ho_extra, strlen(o->ho_extra)) == -1)
		return -1;
	return http_out_append(o, "\r\n", 2);
}

void
http_out_extra(struct http_out *o, const char *text)
{
	o->ho_extra = text;
}

char *
http_error_body(int status, const char *code, const char *message)
{
	cJSON *root, *err;
	char *s = NULL;

	if ((root = cJSON_CreateObject()) == NULL)
		return NULL;
	if ((err = cJSON_AddObjectToObject(root, "error")) == NULL ||
	    cJSON_AddStringToObject(err, "type", http_status_reason(status)) ==
	        NULL ||
	    cJSON_AddStringToObject(err, "code", code ? code : "") == NULL ||
	    cJSON_AddStringToObject(err, "message", message ? message : "") ==
	        NULL ||
	    cJSON_AddNullToObject(err, "param") == NULL)
		goto out;
	s = cJSON_PrintUnformatted(root);
out:
	cJSON_Delete(root);
	return s;
}

int
http_out_error(struct http_out *o, int status, const char *code,
    const char *message, const char *request_id, int retry_after_secs,
    bool keep_alive)
{
	char *body;
	size_t blen;

	if ((body = http_error_body(status, code, message)) == NULL) {
		o->ho_failed = true;
		return -1;
	}
	blen = strlen(body);
	http_out_status(o, status);
	http_out_header(o, "X-SMG-Error-Code", code ? code : "");
	http_out_header(o, "Content-Type", "application/json");
	http_out_headerf(o, "Content-Length", "%zu", blen);
	if (retry_after_secs > 0)
		http_out_headerf(o, "Retry-After", "%d", retry_after_secs);
	if (request_id != NULL)
		http_out_header(o, "x-request-id", request_id);
	http_out_header(o, "Connection", keep_alive ? "keep-alive" : "close");
	http_out_end_head(o);
	http_out_append(o, body, blen);
	free(body);
	return o->ho_failed ? -1 : 0;
}
