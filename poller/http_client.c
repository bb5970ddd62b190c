/*
 * http_client.c: one non-blocking HTTP/1.1 GET per connection on the
 * poller's libev loop, parsed with http-parser, optionally over TLS.
 *
 * Each request owns its socket, its watchers and its deadline, so a slow or
 * dead worker only ever delays its own request.
 */
#include "poller/poller.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <http_parser.h>

#include "shared/log.h"
#include "shared/tls.h"

#define HC_HOST_MAX   256
#define HC_READ_CHUNK 16384
/* One request per connection: the worker closes after answering. */
#define HC_REQ_FMT                                                             \
	"GET %.*s HTTP/1.1\r\nHost: %s\r\nUser-Agent: smg-poller\r\n"          \
	"Accept: application/json\r\n%sConnection: close\r\n\r\n"

enum hc_state {
	HC_CONNECTING = 0,
	HC_HANDSHAKE,
	HC_SENDING,
	HC_RECEIVING,
	HC_FAILED, /* failed before any I/O; reported from the timer */
};

struct http_client_req {
	struct ev_loop *hc_loop;
	ev_io hc_io;
	ev_timer hc_timer;
	int hc_fd;
	enum hc_state hc_state;
	enum http_client_error hc_error; /* HC_FAILED only */
	struct addrinfo *hc_ai; /* all addresses */
	struct addrinfo *hc_ai_cur; /* the one being tried */
	struct tls_ctx *hc_tls_ctx; /* NULL: plain TCP */
	struct tls_conn *hc_tls;
	char hc_host[HC_HOST_MAX];
	char *hc_req;
	size_t hc_req_len;
	size_t hc_req_off;
	http_parser hc_parser;
	bool hc_complete;
	char *hc_body;
	size_t hc_body_len;
	size_t hc_body_alloc;
	size_t hc_body_max;
	bool hc_truncated;
	http_client_cb hc_cb;
	void *hc_arg;
};

static void hc_io_cb(struct ev_loop *, ev_io *, int);
static void hc_timer_cb(struct ev_loop *, ev_timer *, int);
static int hc_start_connect(struct http_client_req *);
static void hc_advance(struct http_client_req *);
static void hc_finish(struct http_client_req *, enum http_client_error);
static void hc_fail_early(struct http_client_req *, enum http_client_error);
static void hc_want(struct http_client_req *, int);
static int hc_on_body(http_parser *, const char *, size_t);
static int hc_on_complete(http_parser *);
static void hc_free(struct http_client_req *);

static http_parser_settings hc_settings = {
	.on_body = hc_on_body,
	.on_message_complete = hc_on_complete,
};

const char *
http_client_strerror(enum http_client_error e)
{
	switch (e) {
	case HTTP_CLIENT_OK:
		return "ok";
	case HTTP_CLIENT_BAD_URL:
		return "bad url";
	case HTTP_CLIENT_RESOLVE:
		return "cannot resolve host";
	case HTTP_CLIENT_CONNECT:
		return "connect failed";
	case HTTP_CLIENT_TLS:
		return "tls handshake failed";
	case HTTP_CLIENT_TLS_UNAVAILABLE:
		return "https not available";
	case HTTP_CLIENT_IO:
		return "connection error";
	case HTTP_CLIENT_TIMEOUT:
		return "timeout";
	case HTTP_CLIENT_PROTOCOL:
		return "malformed response";
	case HTTP_CLIENT_NOMEM:
		return "out of memory";
	}
	return "unknown error";
}

/*
 * Splits url into scheme, host, port and path+query, builds the request
 * text and resolves the host. Numeric hosts never block; a DNS name is
 * resolved with getaddrinfo.
 * XXX getaddrinfo blocks the loop while DNS answers; workers are usually
 * registered by address.
 */
static enum http_client_error
hc_prepare(struct http_client_req *r, const char *base, const char *path,
    const char *api_key, bool *https)
{
	struct http_parser_url u;
	struct addrinfo hints;
	char *full, port[8], hosthdr[HC_HOST_MAX + 16], auth[300];
	const char *target;
	size_t hl, tl;
	unsigned portnum;
	int n, rv;

	if ((full = malloc(strlen(base) + strlen(path) + 1)) == NULL)
		return HTTP_CLIENT_NOMEM;
	strcpy(full, base);
	strcat(full, path);
	http_parser_url_init(&u);
	if (http_parser_parse_url(full, strlen(full), 0, &u) != 0 ||
	    !(u.field_set & (1 << UF_SCHEMA)) ||
	    !(u.field_set & (1 << UF_HOST))) {
		free(full);
		return HTTP_CLIENT_BAD_URL;
	}
	if (u.field_data[UF_SCHEMA].len == 4 &&
	    strncasecmp(full + u.field_data[UF_SCHEMA].off, "http", 4) == 0)
		*https = false;
	else if (u.field_data[UF_SCHEMA].len == 5 &&
	    strncasecmp(full + u.field_data[UF_SCHEMA].off, "https", 5) == 0)
		*https = true;
	else {
		free(full);
		return HTTP_CLIENT_BAD_URL;
	}
	hl = u.field_data[UF_HOST].len;
	if (hl == 0 || hl >= sizeof(r->hc_host)) {
		free(full);
		return HTTP_CLIENT_BAD_URL;
	}
	memcpy(r->hc_host, full + u.field_data[UF_HOST].off, hl);
	r->hc_host[hl] = '\0';
	portnum = (u.field_set & (1 << UF_PORT)) ? u.port : (*https ? 443 : 80);
	snprintf(port, sizeof(port), "%u", portnum);

	/* Path and query: everything from the path field on (no fragment). */
	if (u.field_set & (1 << UF_PATH)) {
		target = full + u.field_data[UF_PATH].off;
		tl = u.field_data[UF_PATH].len;
		if (u.field_set & (1 << UF_QUERY))
			tl = u.field_data[UF_QUERY].off +
			    u.field_data[UF_QUERY].len -
			    u.field_data[UF_PATH].off;
	} else {
		target = "/";
		tl = 1;
	}
	if (strchr(r->hc_host, ':') != NULL)
		snprintf(hosthdr, sizeof(hosthdr), "[%s]:%s", r->hc_host, port);
	else
		snprintf(hosthdr, sizeof(hosthdr), "%s:%s", r->hc_host, port);
	auth[0] = '\0';
	if (api_key != NULL && api_key[0] != '\0') {
		n = snprintf(auth, sizeof(auth), "Authorization: Bearer %s\r\n",
		    api_key);
		if (n < 0 || (size_t)n >= sizeof(auth)) {
			free(full);
			return HTTP_CLIENT_BAD_URL;
		}
	}
	n = snprintf(NULL, 0, HC_REQ_FMT, (int)tl, target, hosthdr, auth);
	if (n < 0 || (r->hc_req = malloc((size_t)n + 1)) == NULL) {
		free(full);
		return HTTP_CLIENT_NOMEM;
	}
	snprintf(r->hc_req, (size_t)n + 1, HC_REQ_FMT, (int)tl, target, hosthdr,
	    auth);
	r->hc_req_len = (size_t)n;
	free(full);

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
	rv = getaddrinfo(r->hc_host, port, &hints, &r->hc_ai);
	if (rv == EAI_NONAME) {
		hints.ai_flags = AI_NUMERICSERV | AI_ADDRCONFIG;
		rv = getaddrinfo(r->hc_host, port, &hints, &r->hc_ai);
	}
	if (rv != 0) {
		log_debug("%s: %s: %s", __func__, r->hc_host, gai_strerror(rv));
		r->hc_ai = NULL;
		return HTTP_CLIENT_RESOLVE;
	}
	return HTTP_CLIENT_OK;
}

struct http_client_req *
http_client_get(struct ev_loop *loop, struct tls_ctx *tls, const char *base,
    const char *path, const char *api_key, double timeout_secs, size_t body_max,
    http_client_cb cb, void *arg)
{
	struct http_client_req *r;
	enum http_client_error e;
	bool https = false;

	if ((r = calloc(1, sizeof(*r))) == NULL) {
		log_warnx("%s: out of memory", __func__);
		return NULL;
	}
	r->hc_loop = loop;
	r->hc_fd = -1;
	r->hc_cb = cb;
	r->hc_arg = arg;
	r->hc_body_max = body_max;
	http_parser_init(&r->hc_parser, HTTP_RESPONSE);
	r->hc_parser.data = r;
	ev_init(&r->hc_io, hc_io_cb);
	r->hc_io.data = r;
	ev_timer_init(&r->hc_timer, hc_timer_cb,
	    timeout_secs > 0 ? timeout_secs : 0.001, 0.);
	r->hc_timer.data = r;

	e = hc_prepare(r, base, path, api_key, &https);
	if (e == HTTP_CLIENT_OK && https) {
		if (tls == NULL)
			e = HTTP_CLIENT_TLS_UNAVAILABLE;
		r->hc_tls_ctx = tls;
	}
	if (e != HTTP_CLIENT_OK) {
		hc_fail_early(r, e);
		return r;
	}
	r->hc_ai_cur = r->hc_ai;
	if (hc_start_connect(r) == -1) {
		hc_fail_early(r, HTTP_CLIENT_CONNECT);
		return r;
	}
	ev_timer_start(loop, &r->hc_timer);
	return r;
}

void
http_client_cancel(struct http_client_req *r)
{
	if (r == NULL)
		return;
	hc_free(r);
}

/* Reports an error from the next loop iteration, never re-entering. */
static void
hc_fail_early(struct http_client_req *r, enum http_client_error e)
{
	r->hc_state = HC_FAILED;
	r->hc_error = e;
	ev_timer_stop(r->hc_loop, &r->hc_timer);
	ev_timer_set(&r->hc_timer, 0., 0.);
	ev_timer_start(r->hc_loop, &r->hc_timer);
}

/*
 * Starts a non-blocking connect to the current address, moving on to the
 * next address when one fails at once. -1 when none is left.
 */
static int
hc_start_connect(struct http_client_req *r)
{
	struct addrinfo *ai;
	int fd, one = 1;

	if (r->hc_fd != -1) {
		ev_io_stop(r->hc_loop, &r->hc_io);
		close(r->hc_fd);
		r->hc_fd = -1;
	}
	for (ai = r->hc_ai_cur; ai != NULL; ai = ai->ai_next) {
		r->hc_ai_cur = ai;
		fd = socket(ai->ai_family,
		    ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
		    ai->ai_protocol);
		if (fd == -1)
			continue;
		(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one,
		    sizeof(one));
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) == -1 &&
		    errno != EINPROGRESS) {
			close(fd);
			continue;
		}
		r->hc_fd = fd;
		r->hc_state = HC_CONNECTING;
		ev_io_set(&r->hc_io, fd, EV_WRITE);
		ev_io_start(r->hc_loop, &r->hc_io);
		return 0;
	}
	return -1;
}

static void
hc_want(struct http_client_req *r, int events)
{
	if ((r->hc_io.events & (EV_READ | EV_WRITE)) == events &&
	    ev_is_active(&r->hc_io))
		return;
	ev_io_stop(r->hc_loop, &r->hc_io);
	ev_io_set(&r->hc_io, r->hc_fd, events);
	ev_io_start(r->hc_loop, &r->hc_io);
}

static void
hc_io_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)loop;
	(void)revents;
	hc_advance(w->data);
}

static void
hc_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct http_client_req *r = w->data;

	(void)loop;
	(void)revents;
	hc_finish(r,
	    r->hc_state == HC_FAILED ? r->hc_error : HTTP_CLIENT_TIMEOUT);
}

/* Feeds bytes (len 0: EOF) to the parser; 1 when the response is done. */
static int
hc_feed(struct http_client_req *r, const char *buf, size_t len,
    enum http_client_error *err)
{
	size_t n;

	n = http_parser_execute(&r->hc_parser, &hc_settings, buf, len);
	if (r->hc_complete) {
		*err = HTTP_CLIENT_OK;
		return 1;
	}
	if (HTTP_PARSER_ERRNO(&r->hc_parser) != HPE_OK || n != len ||
	    len == 0) {
		*err = HTTP_CLIENT_PROTOCOL;
		return 1;
	}
	return 0;
}

/* Runs the state machine as far as the socket allows. */
static void
hc_advance(struct http_client_req *r)
{
	char buf[HC_READ_CHUNK];
	enum http_client_error err;
	socklen_t sl;
	ssize_t n;
	int soerr, rv;

	switch (r->hc_state) {
	case HC_CONNECTING:
		soerr = 0;
		sl = sizeof(soerr);
		if (getsockopt(r->hc_fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) ==
		        -1 ||
		    soerr != 0) {
			r->hc_ai_cur = r->hc_ai_cur->ai_next;
			if (hc_start_connect(r) == -1)
				hc_finish(r, HTTP_CLIENT_CONNECT);
			return;
		}
		if (r->hc_tls_ctx != NULL) {
			r->hc_tls = tls_conn_new_client(r->hc_tls_ctx, r->hc_fd,
			    r->hc_host);
			if (r->hc_tls == NULL) {
				hc_finish(r, HTTP_CLIENT_TLS);
				return;
			}
			r->hc_state = HC_HANDSHAKE;
		} else
			r->hc_state = HC_SENDING;
		break;
	default:
		break;
	}

	if (r->hc_state == HC_HANDSHAKE) {
		rv = tls_conn_handshake(r->hc_tls);
		if (rv == TLS_WANT_READ || rv == TLS_WANT_WRITE) {
			hc_want(r, rv == TLS_WANT_READ ? EV_READ : EV_WRITE);
			return;
		}
		if (rv != TLS_OK) {
			hc_finish(r, HTTP_CLIENT_TLS);
			return;
		}
		r->hc_state = HC_SENDING;
	}

	while (r->hc_state == HC_SENDING) {
		if (r->hc_tls != NULL) {
			n = tls_conn_write(r->hc_tls, r->hc_req + r->hc_req_off,
			    r->hc_req_len - r->hc_req_off);
			if (n == TLS_WANT_READ || n == TLS_WANT_WRITE) {
				hc_want(r,
				    n == TLS_WANT_READ ? EV_READ : EV_WRITE);
				return;
			}
			if (n < 0) {
				hc_finish(r, HTTP_CLIENT_IO);
				return;
			}
		} else {
			n = send(r->hc_fd, r->hc_req + r->hc_req_off,
			    r->hc_req_len - r->hc_req_off, MSG_NOSIGNAL);
			if (n == -1) {
				if (errno == EAGAIN || errno == EWOULDBLOCK ||
				    errno == EINTR) {
					hc_want(r, EV_WRITE);
					return;
				}
				hc_finish(r, HTTP_CLIENT_IO);
				return;
			}
		}
		r->hc_req_off += (size_t)n;
		if (r->hc_req_off == r->hc_req_len)
			r->hc_state = HC_RECEIVING;
	}

	for (;;) {
		if (r->hc_tls != NULL) {
			n = tls_conn_read(r->hc_tls, buf, sizeof(buf));
			if (n == TLS_WANT_READ || n == TLS_WANT_WRITE) {
				hc_want(r,
				    n == TLS_WANT_READ ? EV_READ : EV_WRITE);
				return;
			}
			if (n == TLS_CLOSED)
				n = 0;
			else if (n < 0) {
				hc_finish(r, HTTP_CLIENT_IO);
				return;
			}
		} else {
			n = recv(r->hc_fd, buf, sizeof(buf), 0);
			if (n == -1) {
				if (errno == EAGAIN || errno == EWOULDBLOCK ||
				    errno == EINTR) {
					hc_want(r, EV_READ);
					return;
				}
				/* A reset after a full response still counts.
				 */
				if (hc_feed(r, buf, 0, &err) && err == 0)
					hc_finish(r, HTTP_CLIENT_OK);
				else
					hc_finish(r, HTTP_CLIENT_IO);
				return;
			}
		}
		if (hc_feed(r, buf, (size_t)n, &err)) {
			hc_finish(r, err);
			return;
		}
	}
}

static int
hc_on_body(http_parser *p, const char *at, size_t len)
{
	struct http_client_req *r = p->data;
	size_t room, want;
	char *nb;

	room = r->hc_body_max - r->hc_body_len;
	if (len > room) {
		/* Over the cap: keep what fits and stop reading. */
		len = room;
		r->hc_truncated = true;
		r->hc_complete = true;
		http_parser_pause(p, 1);
	}
	want = r->hc_body_len + len + 1;
	if (want > r->hc_body_alloc) {
		size_t na = r->hc_body_alloc ? r->hc_body_alloc : 1024;

		while (na < want)
			na *= 2;
		if ((nb = realloc(r->hc_body, na)) == NULL)
			return -1;
		r->hc_body = nb;
		r->hc_body_alloc = na;
	}
	memcpy(r->hc_body + r->hc_body_len, at, len);
	r->hc_body_len += len;
	r->hc_body[r->hc_body_len] = '\0';
	return 0;
}

static int
hc_on_complete(http_parser *p)
{
	struct http_client_req *r = p->data;

	r->hc_complete = true;
	/* Stop here: nothing after the response matters. */
	http_parser_pause(p, 1);
	return 0;
}

/* Delivers the result exactly once and frees the request. */
static void
hc_finish(struct http_client_req *r, enum http_client_error err)
{
	struct http_client_result res;
	http_client_cb cb = r->hc_cb;
	void *arg = r->hc_arg;

	memset(&res, 0, sizeof(res));
	res.hr_error = err;
	if (err == HTTP_CLIENT_OK) {
		res.hr_status = (int)r->hc_parser.status_code;
		res.hr_body = r->hc_body != NULL ? r->hc_body : "";
		res.hr_body_len = r->hc_body_len;
		res.hr_truncated = r->hc_truncated;
	} else
		res.hr_body = "";
	/* The body stays valid during the callback; free afterwards. */
	ev_io_stop(r->hc_loop, &r->hc_io);
	ev_timer_stop(r->hc_loop, &r->hc_timer);
	cb(arg, &res);
	hc_free(r);
}

static void
hc_free(struct http_client_req *r)
{
	ev_io_stop(r->hc_loop, &r->hc_io);
	ev_timer_stop(r->hc_loop, &r->hc_timer);
	tls_conn_free(r->hc_tls);
	if (r->hc_fd != -1)
		close(r->hc_fd);
	if (r->hc_ai != NULL)
		freeaddrinfo(r->hc_ai);
	free(r->hc_req);
	free(r->hc_body);
	free(r);
}
