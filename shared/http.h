/*
 * http.h: HTTP/1.1 server-side request reading and response writing, over
 * http-parser 2.9.
 *
 * Reading: one struct http_reader per client connection. Bytes are fed as
 * they arrive; the reader reports, in order, HTTP_READ_HEADERS (the request
 * head is parsed and validated, body limits already checked against a
 * declared Content-Length, so the caller may answer "Expect: 100-continue"),
 * then HTTP_READ_DONE (the whole request, body de-chunked into one buffer).
 * Bytes after the end of a request (pipelining) are not consumed: the caller
 * calls http_reader_reset() and feeds them again. On HTTP_READ_ERROR the
 * caller answers http_reader_error()'s status and closes the connection.
 *
 * The header block is checked strictly before http-parser sees it, because
 * http-parser is lenient in places: bare LF or bare CR line ends, obs-fold
 * lines, control characters, whitespace before the colon, duplicate
 * Content-Length or Host, Content-Length together with Transfer-Encoding,
 * any Transfer-Encoding other than exactly "chunked", Transfer-Encoding on
 * HTTP/1.0, and malformed request lines all fail with 400 (501 for the
 * unsupported transfer coding, 505 for an HTTP major version other than 1).
 * Chunked framing lines are checked the same way (CRLF only, no control
 * characters, at most HTTP_CHUNK_LINE_MAX bytes each).
 *
 * Writing: struct http_out is a growable byte buffer with helpers for the
 * status line, headers (CR, LF and NUL are refused, so nothing can split a
 * response) and the gateway error response of gateway.md §5.
 *
 * Everything here runs on the caller's thread; nothing blocks or logs
 * client input above debug level.
 */
#ifndef SHARED_HTTP_H
#define SHARED_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <http_parser.h>

#define HTTP_DEFAULT_MAX_HEADER_BYTES (64 * 1024)
#define HTTP_DEFAULT_MAX_HEADERS      100
#define HTTP_DEFAULT_MAX_BODY_BYTES   536870912ULL
/* Longest chunk-size line (size, extensions) or trailer line accepted. */
#define HTTP_CHUNK_LINE_MAX 1024

/* Limits of one reader. A zero field means its default above. */
struct http_limits {
	size_t hl_max_header_bytes; /* request line + headers + CRLFs (431) */
	size_t hl_max_headers; /* header lines (431) */
	uint64_t hl_max_body_bytes; /* de-chunked body (413) */
};

/* One request header. Both strings are NUL-terminated and live in the
 * reader's buffer until http_reader_reset()/http_reader_free(). */
struct http_header {
	const char *hh_name; /* lowercased */
	size_t hh_name_len;
	const char *hh_value; /* leading and trailing SP/HT removed */
	size_t hh_value_len;
};

/*
 * A parsed request, owned by the reader. Valid from HTTP_READ_HEADERS until
 * the next http_reader_reset() or http_reader_free(). Body fields are
 * meaningful once HTTP_READ_DONE was returned (or, in streaming mode, per
 * HTTP_READ_BODY).
 */
struct http_request {
	enum http_method hr_method; /* http-parser's enum */
	const char *hr_method_str; /* "GET", "POST", ... (static string) */
	/*
	 * Request target split in two, both NUL-terminated. Origin form
	 * "/a/b?x=1" gives path "/a/b", query "x=1". Absolute form
	 * "http://h/a?x" gives path "/a" (or "/" when it has none); "*" gives
	 * path "*". No percent-decoding. hr_query is "" when there is none and
	 * hr_has_query tells "/a?" from "/a". A fragment is dropped.
	 */
	const char *hr_path;
	size_t hr_path_len;
	const char *hr_query;
	size_t hr_query_len;
	bool hr_has_query;
	unsigned hr_http_minor; /* HTTP/1.<minor> (0 or 1; higher reads as 1) */
	bool hr_keep_alive; /* http_should_keep_alive() */
	bool hr_expect_continue; /* "Expect: 100-continue" */
	bool hr_chunked; /* Transfer-Encoding: chunked */
	int64_t hr_content_length; /* declared length, -1 when none */
	const struct http_header *hr_headers; /* in arrival order */
	size_t hr_nheaders;
	/*
	 * Body: the whole de-chunked body after HTTP_READ_DONE, NUL-terminated
	 * (the NUL is not counted; hr_body is never NULL, "" when empty). In
	 * streaming mode, the piece delivered by the last feed call.
	 */
	const char *hr_body;
	size_t hr_body_len;
	uint64_t hr_body_total; /* body bytes received so far */
};

enum http_read_status {
	HTTP_READ_AGAIN = 0, /* all input consumed; feed more */
	HTTP_READ_HEADERS, /* head parsed and valid; feed again */
	HTTP_READ_BODY, /* streaming mode: a body piece is in hr_body */
	HTTP_READ_DONE, /* request complete */
	HTTP_READ_ERROR, /* see http_reader_error(); close afterwards */
};

struct http_reader;

/* Returns a reader with the given limits (NULL: defaults), or NULL when out
 * of memory. */
struct http_reader *http_reader_new(const struct http_limits *limits);
/* Frees the reader and everything its request pointed to; NULL is a no-op. */
void http_reader_free(struct http_reader *r);
/*
 * Readies the reader for the next request on the same connection. Keeps its
 * buffers (a body buffer above 1 MiB is released), so the steady state does
 * not allocate. Invalidates the previous request's pointers.
 */
void http_reader_reset(struct http_reader *r);

/*
 * Feeds len bytes. *consumed is set to how many were used; unused bytes
 * (after HTTP_READ_HEADERS, HTTP_READ_BODY, HTTP_READ_DONE) must be fed again:
 * after HEADERS/BODY to this reader, after DONE to it after a reset. After
 * HEADERS the caller feeds again even with no new bytes (len 0): a request
 * without a body then reports DONE. Feeding after DONE or ERROR consumes
 * nothing and repeats that status. Returns a status as above.
 */
enum http_read_status http_reader_feed(struct http_reader *r, const char *data,
    size_t len, size_t *consumed);

/*
 * Switches to streaming the body, allowed right after HTTP_READ_HEADERS:
 * instead of accumulating it, each feed that yields body bytes returns
 * HTTP_READ_BODY with that piece in hr_body/hr_body_len (valid until the
 * next feed), the last piece coming with HTTP_READ_DONE. The body limit
 * still applies to the total. Returns 0, or -1 when called at another time.
 */
int http_reader_stream_body(struct http_reader *r);

/* The request being read; NULL before HTTP_READ_HEADERS. */
const struct http_request *http_reader_request(const struct http_reader *r);

/* After HTTP_READ_ERROR: the HTTP status to answer (400, 413, 417, 431, 501,
 * 505) and, when reason is not NULL, a short static reason text. 0 when
 * there is no error. */
int http_reader_error(const struct http_reader *r, const char **reason);

/* First header with that name (any case), or NULL. */
const struct http_header *http_request_header(const struct http_request *req,
    const char *name);
/* How many headers carry that name (any case). */
size_t http_request_header_count(const struct http_request *req,
    const char *name);

/* ------------------------------------------------------------- writing */

/* Canonical reason phrase of a status ("Service Unavailable"), "Unknown"
 * for a status without one. Static string. */
const char *http_status_reason(int status);

/* What a server writes after HTTP_READ_HEADERS for "Expect: 100-continue". */
#define HTTP_100_CONTINUE "HTTP/1.1 100 Continue\r\n\r\n"

/*
 * A growable output buffer. Zero-initialise (or http_out_init) before use;
 * http_out_reset() empties it keeping the memory. Every append returns 0, or
 * -1 on allocation failure or refused input, after which the buffer is
 * marked failed (ho_failed) and later appends do nothing, so a caller may
 * check once at the end.
 */
struct http_out {
	char *ho_buf;
	size_t ho_len;
	size_t ho_cap;
	bool ho_failed;
	/* Header lines ("Name: value\r\n"...) every head gets before its
	 * blank line; borrowed, NULL none (http_out_extra). */
	const char *ho_extra;
};

void http_out_init(struct http_out *o);
/*
 * Header lines added to every head http_out_end_head ends from now on
 * (CORS, WWW-Authenticate): text is borrowed until cleared with NULL, and
 * must hold only well-formed "Name: value\r\n" lines.
 */
void http_out_extra(struct http_out *o, const char *text);
void http_out_reset(struct http_out *o);
void http_out_free(struct http_out *o);
int http_out_append(struct http_out *o, const void *data, size_t len);
/* One chunk of the chunked transfer coding: "<hex len>\r\n" data "\r\n"
 * (len > 0; a zero-length chunk would end the body). 0, or -1 as
 * http_out_append. */
int http_out_chunk(struct http_out *o, const void *data, size_t len);
/* v in decimal into buf (at least HTTP_U64_DIGITS + 1 bytes), NUL-ended;
 * returns the digits written. For the request path, where snprintf costs
 * hundreds of instructions a call. */
#define HTTP_U64_DIGITS 20
size_t http_fmt_u64(char *buf, uint64_t v);
/* "HTTP/1.1 <status> <reason>\r\n". */
int http_out_status(struct http_out *o, int status);
/* "<name>: <value>\r\n". A name that is not a token, or a value holding CR,
 * LF or NUL, is refused (-1). */
int http_out_header(struct http_out *o, const char *name, const char *value);
int http_out_header_n(struct http_out *o, const char *name, size_t name_len,
    const char *value, size_t value_len);
int http_out_headerf(struct http_out *o, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The blank line ending the head. */
int http_out_end_head(struct http_out *o);

/*
 * The gateway error body of gateway.md §5, malloc'ed, NUL-terminated:
 *   {"error":{"type":"<reason phrase>","code":"<code>","message":"<text>",
 *    "param":null}}
 * NULL when out of memory. The caller frees it.
 */
char *http_error_body(int status, const char *code, const char *message);

/*
 * Appends a complete gateway error response to o: status line,
 * X-SMG-Error-Code, Content-Type: application/json, Content-Length,
 * Retry-After (when retry_after_secs > 0), x-request-id (when request_id is
 * not NULL), Connection: keep-alive or close, then the body. Returns 0 or -1
 * (out of memory, or a header value refused).
 */
int http_out_error(struct http_out *o, int status, const char *code,
    const char *message, const char *request_id, int retry_after_secs,
    bool keep_alive);

#endif /* SHARED_HTTP_H */
