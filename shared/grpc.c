/*
 * grpc.c: gRPC framing and the HTTP/2 client channel (see grpc.h).
 *
 * The channel feeds nghttp2 with nghttp2_session_mem_recv and drains it
 * with nghttp2_session_mem_send, so plain sockets and mbedTLS connections
 * share one I/O path; the fd's watcher asks for what the session wants
 * (nghttp2_session_want_read / want_write) plus any unsent bytes.
 */
#include "shared/grpc.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

#include "shared/log.h"
#include "shared/tls.h"
#include "shared/url.h"

#define CH_HOST_MAX       256
#define CH_READ_CHUNK     16384
#define CH_BACKOFF_MIN_MS 100
#define CH_BACKOFF_MAX_MS 30000
#define CH_CONNECT_SECS   5.0 /* TCP connect + TLS handshake */
#define CH_WINDOW         (1 << 20)
/* A connection with calls is pinged this often; an unanswered PING by
 * the next one ends it (a peer gone without a reset). */
#define CH_KEEPALIVE_SECS 20.0

enum ch_state {
	CH_IDLE = 0, /* no connection, may connect */
	CH_CONNECTING,
	CH_HANDSHAKE, /* TLS */
	CH_READY, /* HTTP/2 session up */
	CH_BACKOFF, /* failed: waits before connecting again */
};

struct grpc_call {
	struct grpc_channel *gc_ch;
	struct grpc_call *gc_next; /* the channel's list */
	struct grpc_call **gc_prevp;
	int32_t gc_stream; /* 0: not submitted yet */
	char *gc_path;
	char gc_key_hdr[300]; /* "Bearer <key>", "" none */
	uint8_t *gc_out; /* prefix + request */
	size_t gc_out_len;
	size_t gc_out_off;
	double gc_timeout;
	ev_timer gc_timer; /* deadline, or the deferred early failure */
	bool gc_failed_early; /* gc_timer delivers gc_early */
	int gc_early_code;
	char gc_early_msg[GRPC_MESSAGE_MAX];
	int gc_http_status;
	bool gc_have_status;
	int gc_status;
	char gc_message[GRPC_MESSAGE_MAX];
	int gc_reader_err; /* GRPC_OK, or why the stream was reset */
	struct grpc_reader gc_reader;
	grpc_message_cb gc_on_message;
	grpc_close_cb gc_on_close;
	void (*gc_on_open)(void *);
	void *gc_arg;
};

struct grpc_channel {
	struct ev_loop *ch_loop;
	char *ch_url;
	char ch_host[CH_HOST_MAX];
	char ch_port[8];
	char ch_authority[CH_HOST_MAX + 8];
	bool ch_tls_wanted;
	struct tls_ctx *ch_tls_ctx;
	struct tls_conn *ch_tls;
	size_t ch_max;
	enum ch_state ch_state;
	int ch_fd;
	ev_io ch_io;
	ev_timer ch_timer; /* connect deadline, or the backoff */
	uint64_t ch_backoff_ms;
	bool ch_was_ready; /* the failure to come ends a working connection */
	struct addrinfo *ch_ai;
	struct addrinfo *ch_ai_cur;
	nghttp2_session *ch_sess;
	uint8_t *ch_wbuf; /* bytes nghttp2 gave that the fd did not take */
	size_t ch_wlen;
	size_t ch_woff;
	struct grpc_call *ch_calls;
	bool ch_ping_out; /* a keepalive PING awaits its ACK */
	unsigned ch_depth; /* inside code that runs the calls' callbacks */
	bool ch_freeing; /* freed from a callback: the rest waits */
};

static void ch_io_cb(struct ev_loop *, ev_io *, int);
static void ch_timer_cb(struct ev_loop *, ev_timer *, int);
static void call_timer_cb(struct ev_loop *, ev_timer *, int);
static int ch_connect(struct grpc_channel *);
static int ch_try_next(struct grpc_channel *);
static int ch_session_up(struct grpc_channel *);
static void ch_fail(struct grpc_channel *, const char *, ...)
    __attribute__((format(printf, 2, 3)));
static void ch_pump(struct grpc_channel *);
static int ch_read(struct grpc_channel *);
static int ch_write(struct grpc_channel *);
static void ch_want(struct grpc_channel *, int);
static void ch_step(struct grpc_channel *);
static bool ch_leave(struct grpc_channel *);
static int call_submit(struct grpc_call *);
static void call_unlink(struct grpc_call *);
static void call_free(struct grpc_call *);
static void call_close(struct grpc_call *, int, const char *);
static void call_fail_later(struct grpc_call *, int, const char *);

/* ------------------------------------------------------------ framing */

static const char *const grpc_code_names[] = {
	"OK",
	"CANCELLED",
	"UNKNOWN",
	"INVALID_ARGUMENT",
	"DEADLINE_EXCEEDED",
	"NOT_FOUND",
	"ALREADY_EXISTS",
	"PERMISSION_DENIED",
	"RESOURCE_EXHAUSTED",
	"FAILED_PRECONDITION",
	"ABORTED",
	"OUT_OF_RANGE",
	"UNIMPLEMENTED",
	"INTERNAL",
	"UNAVAILABLE",
	"DATA_LOSS",
	"UNAUTHENTICATED",
};

const char *
grpc_code_name(int code)
{
	if (code < 0 ||
	    (size_t)code >=
	        sizeof(grpc_code_names) / sizeof(grpc_code_names[0]))
		return "UNKNOWN_CODE";
	return grpc_code_names[code];
}

int
grpc_code_from_http(int s)
{
	/* The mapping of gRPC's http-grpc-status-mapping document. */
	switch (s) {
	case 400:
		return GRPC_INTERNAL;
	case 401:
		return GRPC_UNAUTHENTICATED;
	case 403:
		return GRPC_PERMISSION_DENIED;
	case 404:
		return GRPC_UNIMPLEMENTED;
	case 429:
	case 502:
	case 503:
	case 504:
		return GRPC_UNAVAILABLE;
	default:
		return GRPC_UNKNOWN;
	}
}

void
grpc_frame_prefix(uint8_t out[GRPC_PREFIX_LEN], uint32_t len)
{
	out[0] = 0;
	out[1] = (uint8_t)(len >> 24);
	out[2] = (uint8_t)(len >> 16);
	out[3] = (uint8_t)(len >> 8);
	out[4] = (uint8_t)len;
}

void
grpc_timeout_format(double secs, char *buf, size_t len)
{
	double ms = ceil(secs * 1000.0);

	if (ms < 1)
		ms = 1;
	if (ms <= 99999999.0)
		snprintf(buf, len, "%.0fm", ms);
	else if (secs <= 99999999.0)
		snprintf(buf, len, "%.0fS", ceil(secs));
	else
		snprintf(buf, len, "99999999S");
}

int
grpc_timeout_parse(const char *s, double *secs)
{
	double v = 0;
	size_t i, n = strlen(s);

	if (n < 2 || n > 9)
		return -1;
	for (i = 0; i + 1 < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (s[i] - '0');
	}
	switch (s[n - 1]) {
	case 'H':
		*secs = v * 3600;
		return 0;
	case 'M':
		*secs = v * 60;
		return 0;
	case 'S':
		*secs = v;
		return 0;
	case 'm':
		*secs = v / 1e3;
		return 0;
	case 'u':
		*secs = v / 1e6;
		return 0;
	case 'n':
		*secs = v / 1e9;
		return 0;
	}
	return -1;
}

static int
grpc_hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

void
grpc_message_decode(const char *in, size_t len, char *out, size_t outlen)
{
	size_t i, o = 0;
	int hi, lo;

	if (outlen == 0)
		return;
	for (i = 0; i < len && o + 1 < outlen; i++) {
		if (in[i] == '%' && i + 2 < len &&
		    (hi = grpc_hexval(in[i + 1])) >= 0 &&
		    (lo = grpc_hexval(in[i + 2])) >= 0) {
			out[o++] = (char)(hi << 4 | lo);
			i += 2;
		} else
			out[o++] = in[i];
	}
	out[o] = '\0';
}

void
grpc_message_encode(const char *in, char *out, size_t outlen)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t o = 0;
	unsigned char c;

	if (outlen == 0)
		return;
	for (; *in != '\0'; in++) {
		c = (unsigned char)*in;
		if (c >= 0x20 && c <= 0x7e && c != '%') {
			if (o + 1 >= outlen)
				break;
			out[o++] = (char)c;
		} else {
			if (o + 3 >= outlen)
				break;
			out[o++] = '%';
			out[o++] = hex[c >> 4];
			out[o++] = hex[c & 15];
		}
	}
	out[o] = '\0';
}

void
grpc_reader_init(struct grpc_reader *r, size_t max)
{
	memset(r, 0, sizeof(*r));
	r->gr_max = max;
}

void
grpc_reader_clear(struct grpc_reader *r)
{
	free(r->gr_msg);
	r->gr_msg = NULL;
	r->gr_head_len = 0;
	r->gr_msg_len = r->gr_msg_have = 0;
	r->gr_in_msg = false;
}

bool
grpc_reader_partial(const struct grpc_reader *r)
{
	return r->gr_head_len > 0;
}

int
grpc_reader_feed(struct grpc_reader *r, const uint8_t *data, size_t len,
    grpc_message_cb cb, void *arg)
{
	size_t take;
	uint8_t *msg;

	while (len > 0) {
		if (!r->gr_in_msg) {
			take = GRPC_PREFIX_LEN - r->gr_head_len;
			if (take > len)
				take = len;
			memcpy(r->gr_head + r->gr_head_len, data, take);
			r->gr_head_len += take;
			data += take;
			len -= take;
			if (r->gr_head_len < GRPC_PREFIX_LEN)
				break;
			if (r->gr_head[0] != 0)
				return GRPC_INTERNAL;
			r->gr_msg_len = (size_t)r->gr_head[1] << 24 |
			    (size_t)r->gr_head[2] << 16 |
			    (size_t)r->gr_head[3] << 8 | r->gr_head[4];
			if (r->gr_msg_len > r->gr_max)
				return GRPC_RESOURCE_EXHAUSTED;
			r->gr_in_msg = true;
			r->gr_msg_have = 0;
			/* +1: a zero-length message still gets a buffer */
			if ((r->gr_msg = malloc(r->gr_msg_len + 1)) == NULL)
				return GRPC_RESOURCE_EXHAUSTED;
		}
		take = r->gr_msg_len - r->gr_msg_have;
		if (take > len)
			take = len;
		memcpy(r->gr_msg + r->gr_msg_have, data, take);
		r->gr_msg_have += take;
		data += take;
		len -= take;
		if (r->gr_msg_have < r->gr_msg_len)
			break;
		msg = r->gr_msg;
		r->gr_msg = NULL;
		r->gr_in_msg = false;
		r->gr_head_len = 0;
		cb(arg, msg, r->gr_msg_len);
		free(msg);
	}
	return GRPC_OK;
}

/* ------------------------------------------------------------ nghttp2 */

static ssize_t
h2_read_cb(nghttp2_session *s, int32_t stream, uint8_t *buf, size_t length,
    uint32_t *flags, nghttp2_data_source *src, void *user)
{
	struct grpc_call *c;
	size_t n;

	(void)src;
	(void)user;
	/* Through the stream, not src: a cancelled call is gone. */
	if ((c = nghttp2_session_get_stream_user_data(s, stream)) == NULL)
		return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
	n = c->gc_out_len - c->gc_out_off;
	if (n > length)
		n = length;
	memcpy(buf, c->gc_out + c->gc_out_off, n);
	c->gc_out_off += n;
	if (c->gc_out_off == c->gc_out_len)
		*flags |= NGHTTP2_DATA_FLAG_EOF;
	return (ssize_t)n;
}

static int
h2_header_cb(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name,
    size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
    void *user)
{
	struct grpc_call *c;
	char v[16];

	(void)flags;
	(void)user;
	if (f->hd.type != NGHTTP2_HEADERS ||
	    (c = nghttp2_session_get_stream_user_data(s, f->hd.stream_id)) ==
	        NULL)
		return 0;
	if (namelen == 7 && memcmp(name, ":status", 7) == 0) {
		snprintf(v, sizeof(v), "%.*s",
		    (int)(valuelen < 15 ? valuelen : 15), (const char *)value);
		c->gc_http_status = atoi(v);
	} else if (namelen == 11 && memcmp(name, "grpc-status", 11) == 0) {
		snprintf(v, sizeof(v), "%.*s",
		    (int)(valuelen < 15 ? valuelen : 15), (const char *)value);
		c->gc_have_status = true;
		c->gc_status = atoi(v);
	} else if (namelen == 12 && memcmp(name, "grpc-message", 12) == 0)
		grpc_message_decode((const char *)value, valuelen,
		    c->gc_message, sizeof(c->gc_message));
	return 0;
}

static void
h2_message(void *arg, const uint8_t *msg, size_t len)
{
	struct grpc_call *c = arg;

	if (c->gc_on_message != NULL)
		c->gc_on_message(c->gc_arg, msg, len);
}

static int
h2_data_cb(nghttp2_session *s, uint8_t flags, int32_t stream,
    const uint8_t *data, size_t len, void *user)
{
	struct grpc_call *c;
	int rv;

	(void)flags;
	(void)user;
	if ((c = nghttp2_session_get_stream_user_data(s, stream)) == NULL ||
	    c->gc_reader_err != GRPC_OK)
		return 0;
	if ((rv = grpc_reader_feed(&c->gc_reader, data, len, h2_message, c)) !=
	    GRPC_OK) {
		c->gc_reader_err = rv;
		nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, stream,
		    NGHTTP2_CANCEL);
	}
	return 0;
}

static int
h2_close_cb(nghttp2_session *s, int32_t stream, uint32_t error, void *user)
{
	struct grpc_call *c;
	char msg[GRPC_MESSAGE_MAX];

	(void)user;
	if ((c = nghttp2_session_get_stream_user_data(s, stream)) == NULL)
		return 0;
	nghttp2_session_set_stream_user_data(s, stream, NULL);
	c->gc_stream = 0;
	if (c->gc_reader_err == GRPC_RESOURCE_EXHAUSTED)
		call_close(c, GRPC_RESOURCE_EXHAUSTED,
		    "received message larger than the limit");
	else if (c->gc_reader_err != GRPC_OK)
		call_close(c, c->gc_reader_err,
		    "received a compressed message (none negotiated)");
	else if (c->gc_have_status) {
		if (c->gc_status == GRPC_OK &&
		    grpc_reader_partial(&c->gc_reader))
			call_close(c, GRPC_INTERNAL,
			    "stream ended inside a message");
		else
			call_close(c, c->gc_status, c->gc_message);
	} else if (c->gc_http_status != 0 && c->gc_http_status != 200) {
		snprintf(msg, sizeof(msg), "HTTP status %d without grpc-status",
		    c->gc_http_status);
		call_close(c, grpc_code_from_http(c->gc_http_status), msg);
	} else if (error == NGHTTP2_REFUSED_STREAM) {
		call_close(c, GRPC_UNAVAILABLE, "stream refused by the server");
	} else if (error != NGHTTP2_NO_ERROR) {
		snprintf(msg, sizeof(msg), "stream reset by the server (%s)",
		    nghttp2_http2_strerror(error));
		call_close(c,
		    error == NGHTTP2_CANCEL ? GRPC_CANCELLED : GRPC_INTERNAL,
		    msg);
	} else
		call_close(c, GRPC_INTERNAL,
		    "stream ended without grpc-status");
	return 0;
}

static int
h2_frame_cb(nghttp2_session *s, const nghttp2_frame *f, void *user)
{
	struct grpc_call *c;
	void (*cb)(void *);

	if (f->hd.type == NGHTTP2_PING && (f->hd.flags & NGHTTP2_FLAG_ACK)) {
		((struct grpc_channel *)user)->ch_ping_out = false;
		return 0;
	}
	if (f->hd.type != NGHTTP2_HEADERS ||
	    f->headers.cat != NGHTTP2_HCAT_RESPONSE ||
	    (f->hd.flags & NGHTTP2_FLAG_END_STREAM) ||
	    (c = nghttp2_session_get_stream_user_data(s, f->hd.stream_id)) ==
	        NULL ||
	    c->gc_http_status != 200 || (cb = c->gc_on_open) == NULL)
		return 0;
	c->gc_on_open = NULL;
	cb(c->gc_arg);
	return 0;
}

static nghttp2_session_callbacks *
h2_callbacks(void)
{
	static nghttp2_session_callbacks *cbs;

	if (cbs == NULL) {
		if (nghttp2_session_callbacks_new(&cbs) != 0)
			return NULL;
		nghttp2_session_callbacks_set_on_header_callback(cbs,
		    h2_header_cb);
		nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs,
		    h2_data_cb);
		nghttp2_session_callbacks_set_on_stream_close_callback(cbs,
		    h2_close_cb);
		nghttp2_session_callbacks_set_on_frame_recv_callback(cbs,
		    h2_frame_cb);
	}
	return cbs;
}

/* ------------------------------------------------------------ channel */

/* grpc[s]://host:port[/] into host, port, authority. */
static int
ch_parse_url(struct grpc_channel *ch, const char *url)
{
	struct url u;
	int n;

	if (url_parse(url, &u) == -1 || u.u_userinfo || u.u_rank >= 0 ||
	    !u.u_port_set || u.u_port == 0)
		return -1;
	if (url_scheme_is(&u, "grpcs"))
		ch->ch_tls_wanted = true;
	else if (!url_scheme_is(&u, "grpc"))
		return -1;
	n = snprintf(ch->ch_host, sizeof(ch->ch_host), "%s", u.u_host);
	if (n < 0 || (size_t)n >= sizeof(ch->ch_host))
		return -1;
	snprintf(ch->ch_port, sizeof(ch->ch_port), "%u", (unsigned)u.u_port);
	n = snprintf(ch->ch_authority, sizeof(ch->ch_authority), "%.*s",
	    (int)u.u_authority_len, u.u_authority);
	return n < 0 || (size_t)n >= sizeof(ch->ch_authority) ? -1 : 0;
}

struct grpc_channel *
grpc_channel_new(struct ev_loop *loop, const char *url, struct tls_ctx *tls,
    size_t max_message)
{
	struct grpc_channel *ch;

	if ((ch = calloc(1, sizeof(*ch))) == NULL ||
	    (ch->ch_url = strdup(url)) == NULL) {
		free(ch);
		log_warnx("%s: out of memory", __func__);
		return NULL;
	}
	if (ch_parse_url(ch, url) == -1) {
		log_warnx("%s: bad gRPC URL '%s' (want grpc[s]://host:port)",
		    __func__, url);
		free(ch->ch_url);
		free(ch);
		return NULL;
	}
	ch->ch_loop = loop;
	ch->ch_tls_ctx = tls;
	ch->ch_max = max_message ? max_message : GRPC_DEFAULT_MAX_MESSAGE;
	ch->ch_fd = -1;
	ch->ch_backoff_ms = CH_BACKOFF_MIN_MS;
	ev_init(&ch->ch_io, ch_io_cb);
	ch->ch_io.data = ch;
	ev_init(&ch->ch_timer, ch_timer_cb);
	ch->ch_timer.data = ch;
	return ch;
}

const char *
grpc_channel_url(const struct grpc_channel *ch)
{
	return ch->ch_url;
}

/* Drops the connection's resources (not the calls). */
static void
ch_close(struct grpc_channel *ch)
{
	ev_io_stop(ch->ch_loop, &ch->ch_io);
	ev_timer_stop(ch->ch_loop, &ch->ch_timer);
	if (ch->ch_sess != NULL) {
		nghttp2_session_del(ch->ch_sess);
		ch->ch_sess = NULL;
	}
	tls_conn_free(ch->ch_tls);
	ch->ch_tls = NULL;
	if (ch->ch_fd != -1)
		close(ch->ch_fd);
	ch->ch_fd = -1;
	if (ch->ch_ai != NULL)
		freeaddrinfo(ch->ch_ai);
	ch->ch_ai = ch->ch_ai_cur = NULL;
	free(ch->ch_wbuf);
	ch->ch_wbuf = NULL;
	ch->ch_wlen = ch->ch_woff = 0;
}

void
grpc_channel_free(struct grpc_channel *ch)
{
	struct grpc_call *c;

	if (ch == NULL)
		return;
	while ((c = ch->ch_calls) != NULL) {
		call_unlink(c);
		call_free(c);
	}
	if (ch->ch_depth > 0) {
		/* From a callback: nghttp2 is still on the stack. */
		ch->ch_freeing = true;
		ev_io_stop(ch->ch_loop, &ch->ch_io);
		ev_timer_stop(ch->ch_loop, &ch->ch_timer);
		return;
	}
	ch_close(ch);
	free(ch->ch_url);
	free(ch);
}

/* Leaves callback-running code; true when the channel is gone. */
static bool
ch_leave(struct grpc_channel *ch)
{
	if (--ch->ch_depth > 0 || !ch->ch_freeing)
		return false;
	ch->ch_freeing = false;
	grpc_channel_free(ch);
	return true;
}

/*
 * The connection failed or ended: every call ends with UNAVAILABLE and the
 * channel backs off. Not from inside nghttp2 callbacks.
 */
static void
ch_fail(struct grpc_channel *ch, const char *fmt, ...)
{
	struct grpc_call *c;
	char why[192];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	if (ch->ch_was_ready)
		log_info("%s: %s: %s; reconnecting in %.1f s", __func__,
		    ch->ch_url, why, ch->ch_backoff_ms / 1000.0);
	else
		log_debug("%s: %s: %s; retry in %.1f s", __func__, ch->ch_url,
		    why, ch->ch_backoff_ms / 1000.0);
	ch->ch_was_ready = false;
	ch_close(ch);
	ch->ch_state = CH_BACKOFF;
	ev_timer_set(&ch->ch_timer, ch->ch_backoff_ms / 1000.0, 0.);
	ev_timer_start(ch->ch_loop, &ch->ch_timer);
	ch->ch_backoff_ms *= 2;
	if (ch->ch_backoff_ms > CH_BACKOFF_MAX_MS)
		ch->ch_backoff_ms = CH_BACKOFF_MAX_MS;
	/* Ended from the loop: the callers may be inside grpc_call_start. */
	for (c = ch->ch_calls; c != NULL; c = c->gc_next) {
		c->gc_stream = 0;
		if (!c->gc_failed_early)
			call_fail_later(c, GRPC_UNAVAILABLE, why);
	}
}

static void
ch_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct grpc_channel *ch = w->data;

	(void)loop;
	(void)revents;
	if (ch->ch_state == CH_BACKOFF) {
		ch->ch_state = CH_IDLE;
		return;
	}
	if (ch->ch_state == CH_READY) {
		/* Keepalive: only while calls run (idle channels may rest). */
		if (ch->ch_ping_out) {
			ch_fail(ch, "no answer to a keepalive PING in %.0f s",
			    CH_KEEPALIVE_SECS);
			return;
		}
		if (ch->ch_calls != NULL &&
		    nghttp2_submit_ping(ch->ch_sess, NGHTTP2_FLAG_NONE, NULL) ==
		        0) {
			ch->ch_ping_out = true;
			ch->ch_depth++;
			ch_pump(ch);
			(void)ch_leave(ch);
		}
		return;
	}
	ch_fail(ch, "connect timed out");
}

static int
ch_connect(struct grpc_channel *ch)
{
	struct addrinfo hints;
	int rv;

	if (ch->ch_tls_wanted && ch->ch_tls_ctx == NULL) {
		ch_fail(ch, "grpcs:// without a TLS client context");
		return -1;
	}
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	if ((rv = getaddrinfo(ch->ch_host, ch->ch_port, &hints, &ch->ch_ai)) !=
	    0) {
		ch->ch_ai = NULL;
		ch_fail(ch, "cannot resolve %s: %s", ch->ch_host,
		    gai_strerror(rv));
		return -1;
	}
	ch->ch_ai_cur = NULL;
	ch->ch_state = CH_CONNECTING;
	ev_timer_set(&ch->ch_timer, CH_CONNECT_SECS, 0.);
	ev_timer_start(ch->ch_loop, &ch->ch_timer);
	return ch_try_next(ch);
}

/* Starts a non-blocking connect to the next address. */
static int
ch_try_next(struct grpc_channel *ch)
{
	struct addrinfo *ai;
	int fd, one = 1;

	if (ch->ch_fd != -1) {
		ev_io_stop(ch->ch_loop, &ch->ch_io);
		close(ch->ch_fd);
		ch->ch_fd = -1;
	}
	ai = ch->ch_ai_cur == NULL ? ch->ch_ai : ch->ch_ai_cur->ai_next;
	for (; ai != NULL; ai = ai->ai_next) {
		ch->ch_ai_cur = ai;
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
		ch->ch_fd = fd;
		ev_io_set(&ch->ch_io, fd, EV_WRITE);
		ev_io_start(ch->ch_loop, &ch->ch_io);
		return 0;
	}
	ch_fail(ch, "connect failed");
	return -1;
}

/* Transport ready: the session starts with our SETTINGS. */
static int
ch_session_up(struct grpc_channel *ch)
{
	nghttp2_settings_entry iv[] = {
		{ NGHTTP2_SETTINGS_ENABLE_PUSH, 0 },
		{ NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, CH_WINDOW },
	};
	nghttp2_session_callbacks *cbs;
	struct grpc_call *c, *next;
	int rv;

	if ((cbs = h2_callbacks()) == NULL ||
	    nghttp2_session_client_new(&ch->ch_sess, cbs, ch) != 0) {
		ch_fail(ch, "out of memory");
		return -1;
	}
	if ((rv = nghttp2_submit_settings(ch->ch_sess, NGHTTP2_FLAG_NONE, iv,
	         sizeof(iv) / sizeof(iv[0]))) != 0 ||
	    (rv = nghttp2_session_set_local_window_size(ch->ch_sess,
	         NGHTTP2_FLAG_NONE, 0, CH_WINDOW)) != 0) {
		ch_fail(ch, "HTTP/2 setup: %s", nghttp2_strerror(rv));
		return -1;
	}
	ev_timer_stop(ch->ch_loop, &ch->ch_timer);
	ev_timer_set(&ch->ch_timer, CH_KEEPALIVE_SECS, CH_KEEPALIVE_SECS);
	ev_timer_start(ch->ch_loop, &ch->ch_timer);
	ch->ch_ping_out = false;
	ch->ch_state = CH_READY;
	ch->ch_was_ready = true;
	ch->ch_backoff_ms = CH_BACKOFF_MIN_MS;
	log_debug("%s: %s: connected%s", __func__, ch->ch_url,
	    ch->ch_tls != NULL ? " (TLS, h2)" : " (h2c)");
	for (c = ch->ch_calls; c != NULL; c = next) {
		next = c->gc_next;
		if (c->gc_stream == 0 && !c->gc_failed_early)
			(void)call_submit(c);
	}
	return 0;
}

static void
ch_want(struct grpc_channel *ch, int events)
{
	if (ch->ch_io.events == events && ev_is_active(&ch->ch_io))
		return;
	ev_io_stop(ch->ch_loop, &ch->ch_io);
	ev_io_set(&ch->ch_io, ch->ch_fd, events);
	ev_io_start(ch->ch_loop, &ch->ch_io);
}

/* Reads what the fd has into the session. 0, or -1 after ch_fail. */
static int
ch_read(struct grpc_channel *ch)
{
	uint8_t buf[CH_READ_CHUNK];
	ssize_t n, rv;

	for (;;) {
		if (ch->ch_tls != NULL) {
			n = tls_conn_read(ch->ch_tls, buf, sizeof(buf));
			if (n == TLS_WANT_READ || n == TLS_WANT_WRITE)
				return 0;
			if (n == TLS_CLOSED) {
				ch_fail(ch, "connection closed by the server");
				return -1;
			}
			if (n < 0) {
				ch_fail(ch, "TLS read error");
				return -1;
			}
		} else {
			n = read(ch->ch_fd, buf, sizeof(buf));
			if (n == -1 && (errno == EAGAIN || errno == EINTR))
				return 0;
			if (n == -1) {
				ch_fail(ch, "read: %s", strerror(errno));
				return -1;
			}
			if (n == 0) {
				ch_fail(ch, "connection closed by the server");
				return -1;
			}
		}
		rv = nghttp2_session_mem_recv(ch->ch_sess, buf, (size_t)n);
		if (ch->ch_freeing)
			return -1;
		if (rv < 0) {
			ch_fail(ch, "HTTP/2 error: %s",
			    nghttp2_strerror((int)rv));
			return -1;
		}
	}
}

/* Sends what the session has. 0 (maybe blocked), or -1 after ch_fail. */
static int
ch_write(struct grpc_channel *ch)
{
	const uint8_t *data;
	ssize_t n;

	for (;;) {
		if (ch->ch_woff == ch->ch_wlen) {
			ch->ch_woff = ch->ch_wlen = 0;
			n = nghttp2_session_mem_send(ch->ch_sess, &data);
			if (n < 0) {
				ch_fail(ch, "HTTP/2 error: %s",
				    nghttp2_strerror((int)n));
				return -1;
			}
			if (n == 0)
				return 0;
			free(ch->ch_wbuf);
			if ((ch->ch_wbuf = malloc((size_t)n)) == NULL) {
				ch_fail(ch, "out of memory");
				return -1;
			}
			memcpy(ch->ch_wbuf, data, (size_t)n);
			ch->ch_wlen = (size_t)n;
		}
		if (ch->ch_tls != NULL) {
			n = tls_conn_write(ch->ch_tls,
			    ch->ch_wbuf + ch->ch_woff,
			    ch->ch_wlen - ch->ch_woff);
			if (n == TLS_WANT_READ || n == TLS_WANT_WRITE)
				return 0;
			if (n < 0) {
				ch_fail(ch, "TLS write error");
				return -1;
			}
		} else {
			n = write(ch->ch_fd, ch->ch_wbuf + ch->ch_woff,
			    ch->ch_wlen - ch->ch_woff);
			if (n == -1 && (errno == EAGAIN || errno == EINTR))
				return 0;
			if (n == -1) {
				ch_fail(ch, "write: %s", strerror(errno));
				return -1;
			}
		}
		ch->ch_woff += (size_t)n;
	}
}

/* Runs the session both ways and waits for what it needs next. */
static void
ch_pump(struct grpc_channel *ch)
{
	int ev = 0;

	if (ch_read(ch) == -1 || ch_write(ch) == -1)
		return;
	if (!nghttp2_session_want_read(ch->ch_sess) &&
	    !nghttp2_session_want_write(ch->ch_sess) &&
	    ch->ch_woff == ch->ch_wlen) {
		ch_fail(ch, "connection ended by the server (GOAWAY)");
		return;
	}
	ev = EV_READ;
	if (ch->ch_woff < ch->ch_wlen ||
	    nghttp2_session_want_write(ch->ch_sess))
		ev |= EV_WRITE;
	ch_want(ch, ev);
}

static void
ch_io_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct grpc_channel *ch = w->data;

	(void)loop;
	(void)revents;
	ch->ch_depth++;
	ch_step(ch);
	(void)ch_leave(ch);
}

/* One wake-up of the fd, whatever the connection's stage. */
static void
ch_step(struct grpc_channel *ch)
{
	socklen_t len;
	const char *alpn;
	int err, rv;

	switch (ch->ch_state) {
	case CH_CONNECTING:
		err = 0;
		len = sizeof(err);
		if (getsockopt(ch->ch_fd, SOL_SOCKET, SO_ERROR, &err, &len) ==
		        -1 ||
		    err != 0) {
			log_debug("%s: %s: connect: %s", __func__, ch->ch_url,
			    strerror(err ? err : errno));
			(void)ch_try_next(ch);
			return;
		}
		if (!ch->ch_tls_wanted) {
			if (ch_session_up(ch) == 0)
				ch_pump(ch);
			return;
		}
		if ((ch->ch_tls = tls_conn_new_client(ch->ch_tls_ctx, ch->ch_fd,
		         ch->ch_host)) == NULL) {
			ch_fail(ch, "TLS setup failed");
			return;
		}
		ch->ch_state = CH_HANDSHAKE;
		/* FALLTHROUGH */
	case CH_HANDSHAKE:
		rv = tls_conn_handshake(ch->ch_tls);
		if (rv == TLS_WANT_READ) {
			ch_want(ch, EV_READ);
			return;
		}
		if (rv == TLS_WANT_WRITE) {
			ch_want(ch, EV_WRITE);
			return;
		}
		if (rv != TLS_OK) {
			ch_fail(ch, "TLS handshake failed");
			return;
		}
		alpn = tls_conn_alpn(ch->ch_tls);
		if (alpn == NULL || strcmp(alpn, "h2") != 0) {
			ch_fail(ch, "the server did not agree to h2 by ALPN");
			return;
		}
		if (ch_session_up(ch) == 0)
			ch_pump(ch);
		return;
	case CH_READY:
		ch_pump(ch);
		return;
	case CH_IDLE:
	case CH_BACKOFF:
		ev_io_stop(ch->ch_loop, &ch->ch_io);
		return;
	}
}

/* ------------------------------------------------------------ calls */

static void
call_unlink(struct grpc_call *c)
{
	if (c->gc_prevp == NULL)
		return;
	*c->gc_prevp = c->gc_next;
	if (c->gc_next != NULL)
		c->gc_next->gc_prevp = c->gc_prevp;
	c->gc_next = NULL;
	c->gc_prevp = NULL;
}

static void
call_free(struct grpc_call *c)
{
	struct grpc_channel *ch = c->gc_ch;

	ev_timer_stop(ch->ch_loop, &c->gc_timer);
	if (c->gc_stream != 0 && ch->ch_sess != NULL) {
		nghttp2_session_set_stream_user_data(ch->ch_sess, c->gc_stream,
		    NULL);
		(void)nghttp2_submit_rst_stream(ch->ch_sess, NGHTTP2_FLAG_NONE,
		    c->gc_stream, NGHTTP2_CANCEL);
	}
	grpc_reader_clear(&c->gc_reader);
	free(c->gc_path);
	free(c->gc_out);
	free(c);
}

/* The one end of a call that reports: unlink, callback, free. */
static void
call_close(struct grpc_call *c, int code, const char *msg)
{
	struct grpc_status st;

	call_unlink(c);
	c->gc_stream = 0;
	st.gs_code = code;
	st.gs_message = msg != NULL ? msg : "";
	if (c->gc_on_close != NULL)
		c->gc_on_close(c->gc_arg, &st);
	call_free(c);
}

/* Ends the call with code from the loop, after grpc_call_start returns. */
static void
call_fail_later(struct grpc_call *c, int code, const char *msg)
{
	c->gc_failed_early = true;
	c->gc_early_code = code;
	snprintf(c->gc_early_msg, sizeof(c->gc_early_msg), "%s", msg);
	ev_timer_stop(c->gc_ch->ch_loop, &c->gc_timer);
	ev_timer_set(&c->gc_timer, 0., 0.);
	ev_timer_start(c->gc_ch->ch_loop, &c->gc_timer);
}

static void
call_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct grpc_call *c = w->data;
	struct grpc_channel *ch = c->gc_ch;
	char msg[64];

	(void)loop;
	(void)revents;
	ch->ch_depth++;
	if (c->gc_failed_early)
		call_close(c, c->gc_early_code, c->gc_early_msg);
	else {
		snprintf(msg, sizeof(msg), "deadline of %.1f s exceeded",
		    c->gc_timeout);
		call_close(c, GRPC_DEADLINE_EXCEEDED, msg);
		if (ch->ch_state == CH_READY && !ch->ch_freeing)
			ch_pump(ch); /* send the RST_STREAM */
	}
	(void)ch_leave(ch);
}

static int
call_submit(struct grpc_call *c)
{
	struct grpc_channel *ch = c->gc_ch;
	nghttp2_data_provider prd;
	char tmo[24];
	nghttp2_nv nv[8];
	size_t n = 0;
	int32_t id;

#define NV(k, v)                                                               \
	do {                                                                   \
		nv[n].name = (uint8_t *)(k);                                   \
		nv[n].namelen = strlen(k);                                     \
		nv[n].value = (uint8_t *)(v);                                  \
		nv[n].valuelen = strlen(v);                                    \
		nv[n].flags = NGHTTP2_NV_FLAG_NONE;                            \
		n++;                                                           \
	} while (0)
	NV(":method", "POST");
	NV(":scheme", ch->ch_tls_wanted ? "https" : "http");
	NV(":path", c->gc_path);
	NV(":authority", ch->ch_authority);
	NV("content-type", "application/grpc");
	NV("te", "trailers");
	if (c->gc_timeout > 0) {
		grpc_timeout_format(c->gc_timeout, tmo, sizeof(tmo));
		NV("grpc-timeout", tmo);
	}
	if (c->gc_key_hdr[0] != '\0')
		NV("authorization", c->gc_key_hdr);
#undef NV
	prd.source.ptr = c;
	prd.read_callback = h2_read_cb;
	id = nghttp2_submit_request(ch->ch_sess, NULL, nv, n, &prd, c);
	if (id < 0) {
		call_fail_later(c, GRPC_UNAVAILABLE, nghttp2_strerror(id));
		return -1;
	}
	c->gc_stream = id;
	return 0;
}

struct grpc_call *
grpc_call_start(struct grpc_channel *ch, const char *path, const char *api_key,
    const void *req, size_t len, double timeout_secs,
    grpc_message_cb on_message, grpc_close_cb on_close, void *arg)
{
	struct grpc_call *c;
	char msg[64];

	if ((c = calloc(1, sizeof(*c))) == NULL ||
	    (c->gc_path = strdup(path)) == NULL ||
	    (c->gc_out = malloc(GRPC_PREFIX_LEN + len)) == NULL) {
		if (c != NULL)
			free(c->gc_path);
		free(c);
		log_warnx("%s: out of memory", __func__);
		return NULL;
	}
	c->gc_ch = ch;
	grpc_frame_prefix(c->gc_out, (uint32_t)len);
	if (len > 0)
		memcpy(c->gc_out + GRPC_PREFIX_LEN, req, len);
	c->gc_out_len = GRPC_PREFIX_LEN + len;
	c->gc_timeout = timeout_secs;
	if (api_key != NULL && api_key[0] != '\0')
		snprintf(c->gc_key_hdr, sizeof(c->gc_key_hdr), "Bearer %s",
		    api_key);
	grpc_reader_init(&c->gc_reader, ch->ch_max);
	c->gc_on_message = on_message;
	c->gc_on_close = on_close;
	c->gc_arg = arg;
	ev_init(&c->gc_timer, call_timer_cb);
	c->gc_timer.data = c;
	c->gc_next = ch->ch_calls;
	if (c->gc_next != NULL)
		c->gc_next->gc_prevp = &c->gc_next;
	c->gc_prevp = &ch->ch_calls;
	ch->ch_calls = c;

	if (ch->ch_state == CH_BACKOFF) {
		snprintf(msg, sizeof(msg), "not connected (retrying in %.1f s)",
		    ev_timer_remaining(ch->ch_loop, &ch->ch_timer));
		call_fail_later(c, GRPC_UNAVAILABLE, msg);
		return c;
	}
	if (timeout_secs > 0) {
		ev_timer_set(&c->gc_timer, timeout_secs, 0.);
		ev_timer_start(ch->ch_loop, &c->gc_timer);
	}
	if (ch->ch_state == CH_IDLE) {
		/* On failure every call, this one included, ends later. */
		(void)ch_connect(ch);
		return c;
	}
	if (ch->ch_state == CH_READY && call_submit(c) == 0)
		ch_want(ch, EV_READ | EV_WRITE);
	return c;
}

void
grpc_call_on_open(struct grpc_call *c, void (*cb)(void *arg))
{
	c->gc_on_open = cb;
}

void
grpc_call_cancel(struct grpc_call *c)
{
	struct grpc_channel *ch;

	if (c == NULL)
		return;
	ch = c->gc_ch;
	call_unlink(c);
	call_free(c);
	if (ch->ch_state == CH_READY)
		ch_want(ch, EV_READ | EV_WRITE);
}
