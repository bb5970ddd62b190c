/*
 * server.c: the simulated engine's HTTP/1.1 server on libev and http-parser:
 * keep-alive, pipelining (one request at a time), Content-Length and chunked
 * request bodies, responses with Content-Length or chunked streaming.
 */
#define _GNU_SOURCE /* accept4 */
#include <sys/types.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <http_parser.h>

#include "shared/log.h"
#include "shared/xmalloc.h"
#include "tests/simworker/simworker.h"

#define SRV_MAX_HEADER_BYTES (64 * 1024)
#define SRV_MAX_BODY_BYTES   (32 * 1024 * 1024)
#define SRV_MAX_INBUF        (SRV_MAX_BODY_BYTES + SRV_MAX_HEADER_BYTES)
#define SRV_READ_SIZE        16384

struct srv_buf {
	char *b_data; /* NUL-terminated when non-NULL */
	size_t b_len;
	size_t b_cap;
};

struct srv_conn {
	TAILQ_ENTRY(srv_conn) sc_entry;
	struct srv *sc_srv;
	int sc_fd;
	ev_io sc_rio;
	ev_io sc_wio;
	http_parser sc_parser;
	struct srv_buf sc_in;
	size_t sc_out_off;
	struct srv_buf sc_out;
	/* the request being parsed */
	struct srv_buf sc_url;
	struct srv_buf sc_field;
	struct srv_buf sc_value;
	struct srv_buf sc_body;
	struct srv_buf sc_routing_key;
	struct srv_buf sc_request_id;
	int sc_in_value; /* last header callback was a value */
	int sc_expect; /* Expect: 100-continue */
	size_t sc_header_bytes;
	int sc_err_status; /* set by a callback that failed the request */
	int sc_complete; /* parsed, not yet dispatched */
	int sc_pending; /* dispatched, response not finished */
	int sc_keepalive;
	int sc_http10;
	int sc_chunked; /* streaming response with chunked framing */
	int sc_closing; /* close once the output is sent */
	int sc_broken; /* write failed: close without sending more */
	void *sc_ctx;
};

TAILQ_HEAD(srv_conns, srv_conn);

struct srv {
	struct ev_loop *s_loop;
	int s_fd;
	int s_port;
	ev_io s_accept;
	struct srv_conns s_conns;
	srv_request_cb s_req_cb;
	srv_abort_cb s_abort_cb;
	void *s_arg;
	http_parser_settings s_settings;
};

static int srv_buf_reserve(struct srv_buf *, size_t);
static int srv_buf_add(struct srv_buf *, const char *, size_t);
static void srv_buf_reset(struct srv_buf *);
static void srv_buf_free(struct srv_buf *);
static void srv_accept_cb(struct ev_loop *, ev_io *, int);
static void srv_read_cb(struct ev_loop *, ev_io *, int);
static void srv_write_cb(struct ev_loop *, ev_io *, int);
static void srv_conn_close(struct srv_conn *);
static void srv_conn_process(struct srv_conn *);
static void srv_dispatch(struct srv_conn *);
static void srv_out(struct srv_conn *, const char *, size_t);
static void srv_outf(struct srv_conn *, const char *, ...)
    __attribute__((format(printf, 2, 3)));
static void srv_flush(struct srv_conn *);
static void srv_schedule(struct srv_conn *);
static void srv_finish(struct srv_conn *);
static void srv_error(struct srv_conn *, int);
static const char *srv_reason(int);
static void srv_end_header(struct srv_conn *);
static int srv_on_message_begin(http_parser *);
static int srv_on_url(http_parser *, const char *, size_t);
static int srv_on_header_field(http_parser *, const char *, size_t);
static int srv_on_header_value(http_parser *, const char *, size_t);
static int srv_on_headers_complete(http_parser *);
static int srv_on_body(http_parser *, const char *, size_t);
static int srv_on_message_complete(http_parser *);

/* Makes room for extra more bytes and a NUL. */
static int
srv_buf_reserve(struct srv_buf *b, size_t extra)
{
	size_t cap;
	char *p;

	if (b->b_len + extra + 1 <= b->b_cap)
		return 0;
	cap = b->b_cap ? b->b_cap : 256;
	while (cap < b->b_len + extra + 1)
		cap *= 2;
	if ((p = realloc(b->b_data, cap)) == NULL)
		return -1;
	b->b_data = p;
	b->b_cap = cap;
	return 0;
}

static int
srv_buf_add(struct srv_buf *b, const char *data, size_t len)
{
	if (srv_buf_reserve(b, len) == -1)
		return -1;
	if (len > 0)
		memcpy(b->b_data + b->b_len, data, len);
	b->b_len += len;
	b->b_data[b->b_len] = '\0';
	return 0;
}

static void
srv_buf_reset(struct srv_buf *b)
{
	b->b_len = 0;
	if (b->b_data != NULL)
		b->b_data[0] = '\0';
}

static void
srv_buf_free(struct srv_buf *b)
{
	free(b->b_data);
	memset(b, 0, sizeof(*b));
}

struct srv *
srv_new(struct ev_loop *loop, const char *host, int port, srv_request_cb req_cb,
    srv_abort_cb abort_cb, void *arg)
{
	struct addrinfo hints, *res = NULL;
	struct sockaddr_storage ss;
	socklen_t sslen = sizeof(ss);
	struct srv *s;
	char portstr[16];
	int rv, one = 1;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	snprintf(portstr, sizeof(portstr), "%d", port);
	if ((rv = getaddrinfo(host, portstr, &hints, &res)) != 0) {
		log_warnx("%s: %s: %s", __func__, host, gai_strerror(rv));
		return NULL;
	}
	s = xcalloc(1, sizeof(*s));
	s->s_loop = loop;
	s->s_fd = socket(res->ai_family,
	    res->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s->s_fd == -1) {
		log_warn("%s: socket", __func__);
		goto fail;
	}
	if (setsockopt(s->s_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ==
	    -1)
		log_warn("%s: SO_REUSEADDR", __func__);
	if (bind(s->s_fd, res->ai_addr, res->ai_addrlen) == -1) {
		log_warn("%s: bind %s:%d", __func__, host, port);
		goto fail;
	}
	if (listen(s->s_fd, SOMAXCONN) == -1) {
		log_warn("%s: listen", __func__);
		goto fail;
	}
	if (getsockname(s->s_fd, (struct sockaddr *)&ss, &sslen) == -1) {
		log_warn("%s: getsockname", __func__);
		goto fail;
	}
	s->s_port = ss.ss_family == AF_INET6
	    ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
	    : ntohs(((struct sockaddr_in *)&ss)->sin_port);
	freeaddrinfo(res);
	s->s_req_cb = req_cb;
	s->s_abort_cb = abort_cb;
	s->s_arg = arg;
	TAILQ_INIT(&s->s_conns);
	http_parser_settings_init(&s->s_settings);
	s->s_settings.on_message_begin = srv_on_message_begin;
	s->s_settings.on_url = srv_on_url;
	s->s_settings.on_header_field = srv_on_header_field;
	s->s_settings.on_header_value = srv_on_header_value;
	s->s_settings.on_headers_complete = srv_on_headers_complete;
	s->s_settings.on_body = srv_on_body;
	s->s_settings.on_message_complete = srv_on_message_complete;
	ev_io_init(&s->s_accept, srv_accept_cb, s->s_fd, EV_READ);
	s->s_accept.data = s;
	ev_io_start(loop, &s->s_accept);
	return s;
fail:
	freeaddrinfo(res);
	if (s->s_fd != -1)
		close(s->s_fd);
	free(s);
	return NULL;
}

void
srv_free(struct srv *s)
{
	struct srv_conn *c;

	if (s == NULL)
		return;
	ev_io_stop(s->s_loop, &s->s_accept);
	close(s->s_fd);
	while ((c = TAILQ_FIRST(&s->s_conns)) != NULL)
		srv_conn_close(c);
	free(s);
}

int
srv_port(const struct srv *s)
{
	return s->s_port;
}

void
srv_set_ctx(struct srv_conn *c, void *ctx)
{
	c->sc_ctx = ctx;
}

static void
srv_accept_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct srv *s = w->data;
	struct srv_conn *c;
	int fd, one = 1;

	(void)revents;
	for (;;) {
		fd = accept4(s->s_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd == -1) {
			if (errno != EAGAIN && errno != EWOULDBLOCK &&
			    errno != EINTR && errno != ECONNABORTED)
				log_warn("%s: accept", __func__);
			return;
		}
		if ((c = calloc(1, sizeof(*c))) == NULL) {
			log_warnx("%s: out of memory", __func__);
			close(fd);
			continue;
		}
		if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one,
		        sizeof(one)) == -1 &&
		    errno != EOPNOTSUPP)
			log_warn("%s: TCP_NODELAY", __func__);
		c->sc_srv = s;
		c->sc_fd = fd;
		http_parser_init(&c->sc_parser, HTTP_REQUEST);
		c->sc_parser.data = c;
		ev_io_init(&c->sc_rio, srv_read_cb, fd, EV_READ);
		ev_io_init(&c->sc_wio, srv_write_cb, fd, EV_WRITE);
		c->sc_rio.data = c;
		c->sc_wio.data = c;
		ev_io_start(loop, &c->sc_rio);
		TAILQ_INSERT_TAIL(&s->s_conns, c, sc_entry);
	}
}

/* Frees the connection; a request not yet answered is aborted. */
static void
srv_conn_close(struct srv_conn *c)
{
	struct srv *s = c->sc_srv;
	void *ctx = c->sc_pending ? c->sc_ctx : NULL;

	ev_io_stop(s->s_loop, &c->sc_rio);
	ev_io_stop(s->s_loop, &c->sc_wio);
	ev_clear_pending(s->s_loop, &c->sc_wio);
	ev_clear_pending(s->s_loop, &c->sc_rio);
	close(c->sc_fd);
	TAILQ_REMOVE(&s->s_conns, c, sc_entry);
	srv_buf_free(&c->sc_in);
	srv_buf_free(&c->sc_out);
	srv_buf_free(&c->sc_url);
	srv_buf_free(&c->sc_field);
	srv_buf_free(&c->sc_value);
	srv_buf_free(&c->sc_body);
	srv_buf_free(&c->sc_routing_key);
	srv_buf_free(&c->sc_request_id);
	free(c);
	if (ctx != NULL)
		s->s_abort_cb(s->s_arg, ctx);
}

static void
srv_read_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct srv_conn *c = w->data;
	ssize_t n;

	(void)revents;
	if (c->sc_in.b_len + SRV_READ_SIZE > SRV_MAX_INBUF) {
		/* Unread input piles up behind a pending request. */
		ev_io_stop(loop, w);
		return;
	}
	if (srv_buf_reserve(&c->sc_in, SRV_READ_SIZE) == -1) {
		srv_conn_close(c);
		return;
	}
	n = read(c->sc_fd, c->sc_in.b_data + c->sc_in.b_len, SRV_READ_SIZE);
	if (n == -1) {
		if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
			return;
		srv_conn_close(c);
		return;
	}
	if (n == 0) {
		srv_conn_close(c);
		return;
	}
	c->sc_in.b_len += (size_t)n;
	srv_conn_process(c);
}

/* Parses and dispatches buffered requests, one at a time. */
static void
srv_conn_process(struct srv_conn *c)
{
	struct srv *s = c->sc_srv;
	enum http_errno err;
	size_t n;

	while (!c->sc_pending && !c->sc_closing && c->sc_in.b_len > 0) {
		n = http_parser_execute(&c->sc_parser, &s->s_settings,
		    c->sc_in.b_data, c->sc_in.b_len);
		err = HTTP_PARSER_ERRNO(&c->sc_parser);
		if (n > c->sc_in.b_len)
			n = c->sc_in.b_len;
		memmove(c->sc_in.b_data, c->sc_in.b_data + n,
		    c->sc_in.b_len - n);
		c->sc_in.b_len -= n;
		if (c->sc_complete) {
			c->sc_complete = 0;
			http_parser_pause(&c->sc_parser, 0);
			if (c->sc_parser.upgrade) {
				srv_error(c, 400);
				break;
			}
			srv_dispatch(c);
			continue;
		}
		if (err != HPE_OK) {
			srv_error(c, c->sc_err_status ? c->sc_err_status : 400);
			break;
		}
		break; /* needs more input */
	}
	if (!c->sc_pending && !c->sc_closing && !ev_is_active(&c->sc_rio))
		ev_io_start(s->s_loop, &c->sc_rio);
}

/* Answers a request that could not be parsed, then closes. */
static void
srv_error(struct srv_conn *c, int status)
{
	char body[128];
	int n;

	n = snprintf(body, sizeof(body),
	    "{\"object\":\"error\",\"message\":\"%s\",\"type\":"
	    "\"BadRequestError\",\"param\":null,\"code\":%d}",
	    srv_reason(status), status);
	c->sc_keepalive = 0;
	c->sc_pending = 1;
	c->sc_ctx = NULL;
	srv_respond(c, status, "application/json", "", body, (size_t)n);
}

static void
srv_dispatch(struct srv_conn *c)
{
	struct srv_request req;
	char *q;

	if (c->sc_url.b_data == NULL || c->sc_url.b_data[0] == '\0') {
		srv_error(c, 400);
		return;
	}
	memset(&req, 0, sizeof(req));
	req.sr_method = http_method_str(c->sc_parser.method);
	req.sr_path = c->sc_url.b_data;
	req.sr_query = "";
	if ((q = strchr(c->sc_url.b_data, '#')) != NULL)
		*q = '\0';
	if ((q = strchr(c->sc_url.b_data, '?')) != NULL) {
		*q = '\0';
		req.sr_query = q + 1;
	}
	req.sr_routing_key = c->sc_routing_key.b_data;
	req.sr_request_id = c->sc_request_id.b_data;
	if (c->sc_body.b_data == NULL &&
	    srv_buf_add(&c->sc_body, "", 0) == -1) {
		srv_error(c, 503);
		return;
	}
	req.sr_body = c->sc_body.b_data;
	req.sr_body_len = c->sc_body.b_len;
	c->sc_pending = 1;
	c->sc_ctx = NULL;
	c->sc_srv->s_req_cb(c->sc_srv->s_arg, c, &req);
}

static int
srv_on_message_begin(http_parser *p)
{
	struct srv_conn *c = p->data;

	srv_buf_reset(&c->sc_url);
	srv_buf_reset(&c->sc_field);
	srv_buf_reset(&c->sc_value);
	srv_buf_reset(&c->sc_body);
	srv_buf_free(&c->sc_routing_key);
	srv_buf_free(&c->sc_request_id);
	c->sc_in_value = 0;
	c->sc_expect = 0;
	c->sc_header_bytes = 0;
	c->sc_err_status = 0;
	return 0;
}

static int
srv_on_url(http_parser *p, const char *at, size_t len)
{
	struct srv_conn *c = p->data;

	c->sc_header_bytes += len;
	if (c->sc_header_bytes > SRV_MAX_HEADER_BYTES) {
		c->sc_err_status = 414;
		return -1;
	}
	if (srv_buf_add(&c->sc_url, at, len) == -1) {
		c->sc_err_status = 503;
		return -1;
	}
	return 0;
}

/* Keeps the value of the one header just read if it is one we echo. */
static void
srv_end_header(struct srv_conn *c)
{
	struct srv_buf *dst = NULL;

	if (c->sc_field.b_data == NULL)
		return;
	if (strcasecmp(c->sc_field.b_data, "expect") == 0 &&
	    c->sc_value.b_data != NULL &&
	    strcasecmp(c->sc_value.b_data, "100-continue") == 0)
		c->sc_expect = 1;
	if (strcasecmp(c->sc_field.b_data, "x-smg-routing-key") == 0)
		dst = &c->sc_routing_key;
	else if (strcasecmp(c->sc_field.b_data, "x-request-id") == 0)
		dst = &c->sc_request_id;
	if (dst != NULL) {
		srv_buf_reset(dst);
		if (srv_buf_add(dst,
		        c->sc_value.b_data ? c->sc_value.b_data : "",
		        c->sc_value.b_len) == -1)
			srv_buf_free(dst);
	}
	srv_buf_reset(&c->sc_field);
	srv_buf_reset(&c->sc_value);
}

static int
srv_on_header_field(http_parser *p, const char *at, size_t len)
{
	struct srv_conn *c = p->data;

	if (c->sc_in_value) {
		srv_end_header(c);
		c->sc_in_value = 0;
	}
	c->sc_header_bytes += len;
	if (c->sc_header_bytes > SRV_MAX_HEADER_BYTES) {
		c->sc_err_status = 431;
		return -1;
	}
	if (srv_buf_add(&c->sc_field, at, len) == -1) {
		c->sc_err_status = 503;
		return -1;
	}
	return 0;
}

static int
srv_on_header_value(http_parser *p, const char *at, size_t len)
{
	struct srv_conn *c = p->data;

	c->sc_in_value = 1;
	c->sc_header_bytes += len;
	if (c->sc_header_bytes > SRV_MAX_HEADER_BYTES) {
		c->sc_err_status = 431;
		return -1;
	}
	if (srv_buf_add(&c->sc_value, at, len) == -1) {
		c->sc_err_status = 503;
		return -1;
	}
	return 0;
}

static int
srv_on_headers_complete(http_parser *p)
{
	struct srv_conn *c = p->data;

	if (c->sc_in_value)
		srv_end_header(c);
	c->sc_in_value = 0;
	if ((p->flags & F_CONTENTLENGTH) &&
	    p->content_length > SRV_MAX_BODY_BYTES) {
		c->sc_err_status = 413;
		return -1;
	}
	/* The client waits for this before it sends the body. */
	if (c->sc_expect && p->http_minor >= 1 && !c->sc_pending) {
		srv_out(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
		srv_schedule(c);
	}
	return 0;
}

static int
srv_on_body(http_parser *p, const char *at, size_t len)
{
	struct srv_conn *c = p->data;

	if (c->sc_body.b_len + len > SRV_MAX_BODY_BYTES) {
		c->sc_err_status = 413;
		return -1;
	}
	if (srv_buf_add(&c->sc_body, at, len) == -1) {
		c->sc_err_status = 503;
		return -1;
	}
	return 0;
}

static int
srv_on_message_complete(http_parser *p)
{
	struct srv_conn *c = p->data;

	c->sc_complete = 1;
	c->sc_keepalive = http_should_keep_alive(p);
	c->sc_http10 = p->http_major == 1 && p->http_minor == 0;
	http_parser_pause(p, 1);
	return 0;
}

static const char *
srv_reason(int status)
{
	switch (status) {
	case 200:
		return "OK";
	case 400:
		return "Bad Request";
	case 404:
		return "Not Found";
	case 405:
		return "Method Not Allowed";
	case 413:
		return "Payload Too Large";
	case 414:
		return "URI Too Long";
	case 429:
		return "Too Many Requests";
	case 431:
		return "Request Header Fields Too Large";
	case 500:
		return "Internal Server Error";
	case 502:
		return "Bad Gateway";
	case 503:
		return "Service Unavailable";
	case 504:
		return "Gateway Timeout";
	default:
		return status < 400 ? "OK" : "Error";
	}
}

static void
srv_out(struct srv_conn *c, const char *data, size_t len)
{
	if (c->sc_broken)
		return;
	if (srv_buf_add(&c->sc_out, data, len) == -1) {
		log_warnx("%s: out of memory, dropping a connection", __func__);
		c->sc_broken = 1;
	}
}

/* Streamed output goes out on the next loop turn, one write per turn. */
static void
srv_schedule(struct srv_conn *c)
{
	if (!ev_is_active(&c->sc_wio))
		ev_io_start(c->sc_srv->s_loop, &c->sc_wio);
	if (c->sc_broken)
		ev_feed_event(c->sc_srv->s_loop, &c->sc_wio, EV_WRITE);
}

static void
srv_outf(struct srv_conn *c, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(buf)) {
		c->sc_broken = 1;
		return;
	}
	srv_out(c, buf, (size_t)n);
}

/*
 * Writes what it can now. The write watcher sends the rest, closes, or
 * (after a response ends) goes on with input already buffered.
 */
static void
srv_flush(struct srv_conn *c)
{
	struct ev_loop *loop = c->sc_srv->s_loop;
	ssize_t n;
	int more;

	while (!c->sc_broken && c->sc_out_off < c->sc_out.b_len) {
		n = send(c->sc_fd, c->sc_out.b_data + c->sc_out_off,
		    c->sc_out.b_len - c->sc_out_off, MSG_NOSIGNAL);
		if (n == -1) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				c->sc_broken = 1;
			break;
		}
		c->sc_out_off += (size_t)n;
	}
	if (c->sc_out_off == c->sc_out.b_len) {
		c->sc_out_off = 0;
		srv_buf_reset(&c->sc_out);
	}
	more = c->sc_broken || c->sc_out.b_len > 0 ||
	    (!c->sc_pending &&
	        (c->sc_closing || c->sc_in.b_len > 0 ||
	            !ev_is_active(&c->sc_rio)));
	if (more && !ev_is_active(&c->sc_wio))
		ev_io_start(loop, &c->sc_wio);
	if (c->sc_broken)
		ev_feed_event(loop, &c->sc_wio, EV_WRITE);
}

static void
srv_write_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct srv_conn *c = w->data;

	(void)revents;
	srv_flush(c);
	if (c->sc_broken) {
		srv_conn_close(c);
		return;
	}
	if (c->sc_out.b_len > 0)
		return;
	ev_io_stop(loop, w);
	if (c->sc_closing) {
		srv_conn_close(c);
		return;
	}
	if (!c->sc_pending)
		srv_conn_process(c);
}

/* The response is complete: the next request may be read. */
static void
srv_finish(struct srv_conn *c)
{
	c->sc_pending = 0;
	c->sc_ctx = NULL;
	if (!c->sc_keepalive)
		c->sc_closing = 1;
	srv_flush(c);
}

void
srv_respond(struct srv_conn *c, int status, const char *ctype,
    const char *extra, const char *body, size_t len)
{
	srv_outf(c,
	    "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
	    "%s%s\r\n",
	    status, srv_reason(status), ctype, len, extra,
	    c->sc_keepalive ? "" : "Connection: close\r\n");
	srv_out(c, body, len);
	srv_finish(c);
}

void
srv_stream_begin(struct srv_conn *c, int status, const char *ctype,
    const char *extra)
{
	/* HTTP/1.0 has no chunked framing: the end of the body is a close. */
	c->sc_chunked = !c->sc_http10;
	if (!c->sc_chunked)
		c->sc_keepalive = 0;
	srv_outf(c, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%s%s%s\r\n", status,
	    srv_reason(status), ctype, extra, "Cache-Control: no-cache\r\n",
	    c->sc_chunked ? "Transfer-Encoding: chunked\r\n"
	                  : "Connection: close\r\n");
	srv_schedule(c);
}

void
srv_stream_write(struct srv_conn *c, const char *data, size_t len)
{
	if (len == 0)
		return;
	if (c->sc_chunked)
		srv_outf(c, "%zx\r\n", len);
	srv_out(c, data, len);
	if (c->sc_chunked)
		srv_out(c, "\r\n", 2);
	srv_schedule(c);
}

void
srv_stream_end(struct srv_conn *c)
{
	if (c->sc_chunked)
		srv_out(c, "0\r\n\r\n", 5);
	srv_finish(c);
}

void
srv_drop(struct srv_conn *c)
{
	c->sc_keepalive = 0;
	srv_finish(c);
}

void
srv_write_raw(struct srv_conn *c, const char *data, size_t len)
{
	srv_out(c, data, len);
	srv_schedule(c);
}
