/* sp.c: SP REQ/REP over Unix stream sockets on a libev loop. */
#include "shared/sp.h"

#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <netdb.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nng/nng.h>

#include "shared/log.h"
#include "shared/tls.h"
#include "shared/xmalloc.h"

#define SP_RECONN_MIN     0.02
#define SP_RECONN_MAX     0.5
#define SP_HANDSHAKE_SECS 2.0 /* seconds for connect plus headers */
#define SP_READ_CHUNK     (64 * 1024)
#define SP_SHRINK_ABOVE   (1024 * 1024) /* an idle buffer larger is freed */
#define SP_ACCEPT_BURST   64
#define SP_ACCEPT_PAUSE   0.1
#define SP_LISTEN_QUEUE   128
#define SP_TLS_RECORD     16384 /* bytes handed to one TLS write */

#define SP_CONTAINER_OF(p, type, member)                                       \
	((type *)(void *)((char *)(p)-offsetof(type, member)))

/* A byte buffer: live bytes are b_data[b_off .. b_off + b_len). */
struct sp_buf {
	uint8_t *b_data;
	size_t b_off;
	size_t b_len;
	size_t b_cap;
};

/* One stream connection, either side. */
struct sp_conn {
	int c_fd;
	ev_io c_io;
	int c_events;
	uint16_t c_peer; /* protocol id the peer must announce */
	bool c_typed; /* frames carry the IPC type byte (not over TCP) */
	struct tls_conn *c_tls; /* tls+tcp://, else NULL */
	size_t c_tls_wlen; /* a TLS write to retry with this length */
	bool c_tls_wantw; /* TLS waits for the fd to be writable */
	bool c_open; /* both headers exchanged */
	size_t c_max; /* frame payload limit */
	struct sp_buf c_in;
	struct sp_buf c_out;
};

enum sp_cstate {
	SP_IDLE = 0, /* no socket; the timer redials */
	SP_CONNECTING, /* connect(2) in progress */
	SP_HANDSHAKE, /* connected, headers being exchanged */
	SP_OPEN,
};

struct sp_req {
	struct sp_client *rq_cl;
	uint32_t rq_id;
	bool rq_busy;
	bool rq_framed; /* written to the current connection's output */
	sp_reply_cb rq_cb;
	void *rq_arg;
	uint8_t *rq_msg; /* copy held until framed */
	size_t rq_len;
	ev_timer rq_timer;
	TAILQ_ENTRY(sp_req) rq_link; /* idle list or wait queue */
};
TAILQ_HEAD(sp_req_list, sp_req);

struct sp_client {
	struct ev_loop *cl_loop;
	struct sockaddr_storage cl_addr;
	socklen_t cl_addrlen;
	char cl_name[SP_NAME_MAX]; /* the path or host:port, for logs */
	struct tls_ctx *cl_tls; /* borrowed; NULL: no TLS */
	char cl_host[SP_NAME_MAX]; /* the name the certificate must match */
	enum sp_cstate cl_state;
	struct sp_conn cl_conn;
	ev_timer cl_timer; /* redial, handshake deadline, deferred loss */
	bool cl_broken; /* a write failed outside a loop callback */
	double cl_backoff;
	ev_tstamp cl_down_since;
	struct sp_req *cl_reqs;
	unsigned cl_nreq;
	unsigned cl_slot_bits;
	uint32_t cl_seq;
	unsigned cl_inflight;
	struct sp_req_list cl_idle;
	struct sp_req_list cl_wait; /* sent while no connection was up */
	int cl_depth; /* loop callbacks on the stack */
	bool cl_free_pending;
	bool cl_closing;
	void *cl_owner; /* freed with the client */
};

/* A request whose reply the server gives later (sp_server_hold). */
struct sp_held {
	struct sp_sconn *h_sc; /* NULL: its connection is gone */
	uint8_t h_bt[4 * SP_MAX_HOPS]; /* the backtrace the reply echoes */
	size_t h_btlen;
	TAILQ_ENTRY(sp_held) h_link;
};

struct sp_sconn {
	struct sp_server *sc_srv;
	struct sp_conn sc_conn;
	ev_timer sc_timer; /* handshake deadline */
	bool sc_dead;
	TAILQ_HEAD(, sp_held) sc_held;
	TAILQ_ENTRY(sp_sconn) sc_link;
};

/* The request an sp_request_cb is handling, for sp_server_hold. */
struct sp_current {
	struct sp_sconn *cur_sc;
	const uint8_t *cur_bt;
	size_t cur_btlen;
	struct sp_held *cur_held;
};
static struct sp_current *sp_cur;

struct sp_server {
	struct ev_loop *srv_loop;
	int srv_fd;
	ev_io srv_io;
	ev_timer srv_pause; /* accept paused: out of descriptors */
	bool srv_unix;
	struct tls_ctx *srv_tls; /* borrowed; NULL: no TLS */
	char srv_path[SP_NAME_MAX]; /* Unix: the socket file; TCP: host:port */
	dev_t srv_dev;
	ino_t srv_ino;
	size_t srv_max;
	sp_request_cb srv_cb;
	void *srv_arg;
	TAILQ_HEAD(, sp_sconn) srv_conns;
	unsigned srv_nconns;
	int srv_depth;
	bool srv_free_pending;
};

static void sp_buf_free(struct sp_buf *);
static int sp_buf_reserve(struct sp_buf *, size_t);
static int sp_buf_append(struct sp_buf *, const void *, size_t);
static void sp_buf_consume(struct sp_buf *, size_t);
static int sp_nonblock(int);
static enum sp_frame_status sp_frame_parse_as(const uint8_t *, size_t, size_t,
    bool, const uint8_t **, size_t *, size_t *);
static int sp_tcp_resolve(const char *, bool, struct sockaddr_storage *,
    socklen_t *);
static void sp_tcp_nodelay(int);
static struct sp_client *sp_client_alloc(struct ev_loop *, unsigned, size_t);
static struct sp_client *sp_client_tcp(struct ev_loop *, const char *,
    struct tls_ctx *, unsigned, size_t);
static struct sp_server *sp_server_start(struct ev_loop *, int, const char *,
    bool, size_t, sp_request_cb, void *);
static void sp_conn_init(struct sp_conn *, int, uint16_t, uint16_t, size_t,
    bool);
static void sp_conn_close(struct ev_loop *, struct sp_conn *);
static void sp_conn_events(struct ev_loop *, struct sp_conn *, int);
static int sp_conn_read(struct sp_conn *);
static int sp_conn_read_tls(struct sp_conn *);
static int sp_conn_flush_tls(struct sp_conn *);
static int sp_conn_flush(struct ev_loop *, struct sp_conn *);
static int sp_conn_frame(struct sp_conn *, const uint8_t *, size_t,
    const uint8_t *, size_t);
static int sp_conn_next(struct sp_conn *, const uint8_t **, size_t *, size_t *);
static void sp_client_dial(struct sp_client *);
static void sp_client_lost(struct sp_client *, const char *);
static void sp_client_opened(struct sp_client *);
static void sp_client_io_cb(struct ev_loop *, ev_io *, int);
static void sp_client_timer_cb(struct ev_loop *, ev_timer *, int);
static void sp_client_req_timer_cb(struct ev_loop *, ev_timer *, int);
static void sp_client_complete(struct sp_client *, struct sp_req *, int,
    const uint8_t *, size_t);
static int sp_client_frame_req(struct sp_client *, struct sp_req *,
    const uint8_t *, size_t);
static void sp_client_reply(struct sp_client *, const uint8_t *, size_t);
static void sp_client_leave(struct sp_client *);
static void sp_client_destroy(struct sp_client *);
static void sp_server_accept_cb(struct ev_loop *, ev_io *, int);
static void sp_server_pause_cb(struct ev_loop *, ev_timer *, int);
static void sp_server_conn_cb(struct ev_loop *, ev_io *, int);
static void sp_server_hs_cb(struct ev_loop *, ev_timer *, int);
static void sp_server_drop(struct sp_server *, struct sp_sconn *);
static void sp_server_request(struct sp_server *, struct sp_sconn *,
    const uint8_t *, size_t);
static void sp_server_leave(struct sp_server *);
static void sp_server_destroy(struct sp_server *);

/* ------------------------------------------------------------------ codec */

void
sp_header_make(uint8_t h[SP_HEADER_LEN], uint16_t self)
{
	h[0] = 0;
	h[1] = 'S';
	h[2] = 'P';
	h[3] = 0;
	h[4] = (uint8_t)(self >> 8);
	h[5] = (uint8_t)self;
	h[6] = 0;
	h[7] = 0;
}

int
sp_header_check(const uint8_t h[SP_HEADER_LEN], uint16_t peer)
{
	if (h[0] != 0 || h[1] != 'S' || h[2] != 'P' || h[3] != 0 || h[6] != 0 ||
	    h[7] != 0)
		return -1;
	if ((uint16_t)((h[4] << 8) | h[5]) != peer)
		return -1;
	return 0;
}

void
sp_frame_head(uint8_t h[SP_FRAME_HEAD], uint64_t len)
{
	int i;

	h[0] = 1;
	for (i = 0; i < 8; i++)
		h[1 + i] = (uint8_t)(len >> (56 - 8 * i));
}

void
sp_tcp_frame_head(uint8_t h[SP_TCP_FRAME_HEAD], uint64_t len)
{
	int i;

	for (i = 0; i < 8; i++)
		h[i] = (uint8_t)(len >> (56 - 8 * i));
}

/* Both framings: typed (IPC) has the type byte before the length. */
static enum sp_frame_status
sp_frame_parse_as(const uint8_t *buf, size_t len, size_t max, bool typed,
    const uint8_t **payload, size_t *plen, size_t *used)
{
	size_t head = typed ? SP_FRAME_HEAD : SP_TCP_FRAME_HEAD;
	uint64_t n = 0;
	size_t i;

	*used = 0;
	if (len == 0)
		return SP_FRAME_NEED;
	if (typed && buf[0] != 1)
		return SP_FRAME_BAD;
	if (len < head)
		return SP_FRAME_NEED;
	for (i = head - 8; i < head; i++)
		n = n << 8 | buf[i];
	if (n > max)
		return SP_FRAME_TOO_LARGE;
	*used = head + (size_t)n;
	if (len - head < n)
		return SP_FRAME_NEED;
	*payload = buf + head;
	*plen = (size_t)n;
	return SP_FRAME_OK;
}

enum sp_frame_status
sp_frame_parse(const uint8_t *buf, size_t len, size_t max,
    const uint8_t **payload, size_t *plen, size_t *used)
{
	return sp_frame_parse_as(buf, len, max, true, payload, plen, used);
}

enum sp_frame_status
sp_tcp_frame_parse(const uint8_t *buf, size_t len, size_t max,
    const uint8_t **payload, size_t *plen, size_t *used)
{
	return sp_frame_parse_as(buf, len, max, false, payload, plen, used);
}

int
sp_backtrace_len(const uint8_t *p, size_t len)
{
	size_t off;
	int hops;

	for (hops = 1, off = 0;; hops++, off += 4) {
		if (hops > SP_MAX_HOPS)
			return 0;
		if (len - off < 4)
			return -1;
		if (p[off] & 0x80)
			return (int)(off + 4);
	}
}

/* ---------------------------------------------------------------- buffers */

static void
sp_buf_free(struct sp_buf *b)
{
	free(b->b_data);
	memset(b, 0, sizeof(*b));
}

/* Room for n more bytes after the live ones; -1 when out of memory. */
static int
sp_buf_reserve(struct sp_buf *b, size_t n)
{
	size_t cap;
	uint8_t *p;

	if (b->b_cap - b->b_off - b->b_len >= n)
		return 0;
	if (b->b_off > 0) {
		memmove(b->b_data, b->b_data + b->b_off, b->b_len);
		b->b_off = 0;
		if (b->b_cap - b->b_len >= n)
			return 0;
	}
	cap = b->b_cap > 0 ? b->b_cap : SP_READ_CHUNK;
	while (cap - b->b_len < n) {
		if (cap > SIZE_MAX / 2)
			return -1;
		cap *= 2;
	}
	if ((p = realloc(b->b_data, cap)) == NULL) {
		log_warnx("%s: out of memory (%zu bytes)", __func__, cap);
		return -1;
	}
	b->b_data = p;
	b->b_cap = cap;
	return 0;
}

static int
sp_buf_append(struct sp_buf *b, const void *p, size_t n)
{
	if (n == 0)
		return 0;
	if (sp_buf_reserve(b, n) == -1)
		return -1;
	memcpy(b->b_data + b->b_off + b->b_len, p, n);
	b->b_len += n;
	return 0;
}

static void
sp_buf_consume(struct sp_buf *b, size_t n)
{
	b->b_off += n;
	b->b_len -= n;
	if (b->b_len == 0) {
		b->b_off = 0;
		/* One huge frame must not pin its buffer for good. */
		if (b->b_cap > SP_SHRINK_ABOVE)
			sp_buf_free(b);
	}
}

/* ------------------------------------------------------------ connections */

static int
sp_nonblock(int fd)
{
	int fl;

	if ((fl = fcntl(fd, F_GETFL)) == -1 ||
	    fcntl(fd, F_SETFL, fl | O_NONBLOCK) == -1 ||
	    fcntl(fd, F_SETFD, FD_CLOEXEC) == -1)
		return -1;
	return 0;
}

/* Small frames go out at once: the conversation is request/reply. */
static void
sp_tcp_nodelay(int fd)
{
	int on = 1;

	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on)) == -1)
		log_warn("%s: TCP_NODELAY", __func__);
}

/*
 * host:port ([v6]:port) to a socket address, numeric or by name (once,
 * here). For a listener an empty host or "*" is every address.
 */
static int
sp_tcp_resolve(const char *hostport, bool passive, struct sockaddr_storage *ss,
    socklen_t *sl)
{
	struct addrinfo hints, *res = NULL;
	char host[256];
	const char *colon, *h = hostport, *port;
	size_t hl;
	int rv;

	if ((colon = strrchr(hostport, ':')) == NULL || colon[1] == '\0') {
		log_warnx("%s: %s: expected host:port", __func__, hostport);
		return -1;
	}
	port = colon + 1;
	hl = (size_t)(colon - hostport);
	if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
		h++;
		hl -= 2;
	}
	if (hl >= sizeof(host)) {
		log_warnx("%s: %s: host too long", __func__, hostport);
		return -1;
	}
	memcpy(host, h, hl);
	host[hl] = '\0';
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
	if ((rv = getaddrinfo(hl == 0 || strcmp(host, "*") == 0 ? NULL : host,
	         port, &hints, &res)) != 0) {
		log_warnx("%s: %s: %s", __func__, hostport, gai_strerror(rv));
		return -1;
	}
	if (res->ai_addrlen > sizeof(*ss)) {
		freeaddrinfo(res);
		return -1;
	}
	memset(ss, 0, sizeof(*ss));
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	*sl = res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

/* Our header goes first into the output; the peer's is awaited. */
static void
sp_conn_init(struct sp_conn *c, int fd, uint16_t self, uint16_t peer,
    size_t max, bool typed)
{
	uint8_t h[SP_HEADER_LEN];

	memset(&c->c_in, 0, sizeof(c->c_in));
	memset(&c->c_out, 0, sizeof(c->c_out));
	c->c_fd = fd;
	c->c_events = 0;
	c->c_peer = peer;
	c->c_typed = typed;
	c->c_tls = NULL;
	c->c_tls_wlen = 0;
	c->c_tls_wantw = false;
	c->c_open = false;
	c->c_max = max;
	sp_header_make(h, self);
	(void)sp_buf_append(&c->c_out, h, sizeof(h));
}

static void
sp_conn_close(struct ev_loop *loop, struct sp_conn *c)
{
	if (c->c_fd == -1)
		return;
	ev_io_stop(loop, &c->c_io);
	tls_conn_free(c->c_tls);
	c->c_tls = NULL;
	c->c_tls_wlen = 0;
	c->c_tls_wantw = false;
	close(c->c_fd);
	c->c_fd = -1;
	c->c_events = 0;
	c->c_open = false;
	sp_buf_free(&c->c_in);
	sp_buf_free(&c->c_out);
}

static void
sp_conn_events(struct ev_loop *loop, struct sp_conn *c, int events)
{
	if (c->c_events == events)
		return;
	ev_io_stop(loop, &c->c_io);
	ev_io_set(&c->c_io, c->c_fd, events);
	if (events != 0)
		ev_io_start(loop, &c->c_io);
	c->c_events = events;
}

/* One read; -1 on end of file or error (the connection is done). */
static int
sp_conn_read(struct sp_conn *c)
{
	size_t want = SP_READ_CHUNK, need = 0;
	const uint8_t *p;
	size_t plen;
	ssize_t n;

	/* A frame whose head is in: make room for all of it at once. */
	if (c->c_open && c->c_in.b_len > 0 &&
	    sp_frame_parse_as(c->c_in.b_data + c->c_in.b_off, c->c_in.b_len,
	        c->c_max, c->c_typed, &p, &plen, &need) == SP_FRAME_NEED &&
	    need > c->c_in.b_len && need - c->c_in.b_len > want)
		want = need - c->c_in.b_len;
	if (sp_buf_reserve(&c->c_in, want) == -1)
		return -1;
	if (c->c_tls != NULL)
		return sp_conn_read_tls(c);
	n = read(c->c_fd, c->c_in.b_data + c->c_in.b_off + c->c_in.b_len,
	    c->c_in.b_cap - c->c_in.b_off - c->c_in.b_len);
	if (n == -1)
		return errno == EAGAIN || errno == EINTR ? 0 : -1;
	if (n == 0)
		return -1;
	c->c_in.b_len += (size_t)n;
	return 0;
}

/*
 * Reads what TLS has, mbedTLS's own buffer included (the fd does not
 * signal it). 0, or -1 when the connection is done.
 */
static int
sp_conn_read_tls(struct sp_conn *c)
{
	ssize_t n;

	c->c_tls_wantw = false;
	for (;;) {
		n = tls_conn_read(c->c_tls,
		    c->c_in.b_data + c->c_in.b_off + c->c_in.b_len,
		    c->c_in.b_cap - c->c_in.b_off - c->c_in.b_len);
		if (n == TLS_WANT_READ)
			return 0;
		if (n == TLS_WANT_WRITE) {
			c->c_tls_wantw = true;
			return 0;
		}
		if (n <= 0)
			return -1;
		c->c_in.b_len += (size_t)n;
		if (tls_conn_pending(c->c_tls) == 0)
			return 0;
		if (sp_buf_reserve(&c->c_in, tls_conn_pending(c->c_tls)) == -1)
			return -1;
	}
}

/*
 * The TLS side of a flush. A write that had to wait is retried with the
 * same length (mbedTLS holds its record and reports that length). -1: the
 * connection is done.
 */
static int
sp_conn_flush_tls(struct sp_conn *c)
{
	size_t len;
	ssize_t n;

	c->c_tls_wantw = false;
	while (c->c_out.b_len > 0) {
		len = c->c_tls_wlen;
		if (len == 0)
			len = c->c_out.b_len < SP_TLS_RECORD ? c->c_out.b_len
			                                     : SP_TLS_RECORD;
		n = tls_conn_write(c->c_tls, c->c_out.b_data + c->c_out.b_off,
		    len);
		if (n == TLS_WANT_WRITE || n == TLS_WANT_READ) {
			c->c_tls_wlen = len;
			c->c_tls_wantw = n == TLS_WANT_WRITE;
			return 0;
		}
		if (n <= 0)
			return -1;
		c->c_tls_wlen = 0;
		sp_buf_consume(&c->c_out, (size_t)n);
	}
	return 0;
}

/* Writes what it can; EV_WRITE waits for the rest. -1: connection done. */
static int
sp_conn_flush(struct ev_loop *loop, struct sp_conn *c)
{
	ssize_t n;

	if (c->c_tls != NULL) {
		if (sp_conn_flush_tls(c) == -1)
			return -1;
		sp_conn_events(loop, c,
		    EV_READ | (c->c_tls_wantw ? EV_WRITE : 0));
		return 0;
	}
	while (c->c_out.b_len > 0) {
		n = send(c->c_fd, c->c_out.b_data + c->c_out.b_off,
		    c->c_out.b_len, MSG_NOSIGNAL);
		if (n == -1 && errno == EINTR)
			continue;
		if (n == -1 && errno == EAGAIN)
			break;
		if (n == -1)
			return -1;
		sp_buf_consume(&c->c_out, (size_t)n);
	}
	sp_conn_events(loop, c, EV_READ | (c->c_out.b_len > 0 ? EV_WRITE : 0));
	return 0;
}

/* Appends one frame: head, then a (the backtrace or id), then b. */
static int
sp_conn_frame(struct sp_conn *c, const uint8_t *a, size_t alen,
    const uint8_t *b, size_t blen)
{
	uint8_t h[SP_FRAME_HEAD];
	size_t hlen = c->c_typed ? SP_FRAME_HEAD : SP_TCP_FRAME_HEAD;

	if (c->c_typed)
		sp_frame_head(h, (uint64_t)alen + blen);
	else
		sp_tcp_frame_head(h, (uint64_t)alen + blen);
	if (sp_buf_reserve(&c->c_out, hlen + alen + blen) == -1)
		return -1;
	(void)sp_buf_append(&c->c_out, h, hlen);
	(void)sp_buf_append(&c->c_out, a, alen);
	(void)sp_buf_append(&c->c_out, b, blen);
	return 0;
}

/*
 * The next unit of input: the peer's header (checked, then consumed) or a
 * whole frame. 2: the header was good (the connection is open); 1: a
 * frame (*payload, *plen; consume *used after use); 0: need more input;
 * -1: the connection must close (logged).
 */
static int
sp_conn_next(struct sp_conn *c, const uint8_t **payload, size_t *plen,
    size_t *used)
{
	const uint8_t *in;

	if (!c->c_open) {
		if (c->c_in.b_len < SP_HEADER_LEN)
			return 0;
		if (sp_header_check(c->c_in.b_data + c->c_in.b_off,
		        c->c_peer) == -1) {
			log_warnx("sp: peer is not an SP protocol 0x%x peer",
			    c->c_peer);
			return -1;
		}
		sp_buf_consume(&c->c_in, SP_HEADER_LEN);
		c->c_open = true;
		return 2;
	}
	if (c->c_in.b_len == 0)
		return 0;
	in = c->c_in.b_data + c->c_in.b_off;
	switch (sp_frame_parse_as(in, c->c_in.b_len, c->c_max, c->c_typed,
	    payload, plen, used)) {
	case SP_FRAME_OK:
		return 1;
	case SP_FRAME_NEED:
		return 0;
	case SP_FRAME_BAD:
		log_warnx("sp: frame of unknown type %u", in[0]);
		return -1;
	case SP_FRAME_TOO_LARGE:
	default:
		log_warnx("sp: frame over %zu bytes", c->c_max);
		return -1;
	}
}

/* ----------------------------------------------------------------- client */

struct sp_client *
sp_client_new(struct ev_loop *loop, const char *path, unsigned max_inflight,
    size_t max_frame)
{
	struct sockaddr_un sun;
	struct sp_client *cl;

	memset(&sun, 0, sizeof(sun));
	if (strlen(path) >= sizeof(sun.sun_path)) {
		log_warnx("%s: %s: path too long", __func__, path);
		return NULL;
	}
	sun.sun_family = AF_UNIX;
	memcpy(sun.sun_path, path, strlen(path) + 1);
	cl = sp_client_alloc(loop, max_inflight, max_frame);
	memcpy(&cl->cl_addr, &sun, sizeof(sun));
	cl->cl_addrlen = sizeof(sun);
	cl->cl_conn.c_typed = true;
	snprintf(cl->cl_name, sizeof(cl->cl_name), "%s", path);
	sp_client_dial(cl);
	return cl;
}

struct sp_client *
sp_client_new_tcp(struct ev_loop *loop, const char *hostport,
    unsigned max_inflight, size_t max_frame)
{
	return sp_client_tcp(loop, hostport, NULL, max_inflight, max_frame);
}

struct sp_client *
sp_client_new_tls(struct ev_loop *loop, const char *hostport,
    struct tls_ctx *tls, unsigned max_inflight, size_t max_frame)
{
	return sp_client_tcp(loop, hostport, tls, max_inflight, max_frame);
}

static struct sp_client *
sp_client_tcp(struct ev_loop *loop, const char *hostport, struct tls_ctx *tls,
    unsigned max_inflight, size_t max_frame)
{
	struct sockaddr_storage ss;
	struct sp_client *cl;
	const char *h = hostport;
	socklen_t sl;
	size_t hl;

	if (sp_tcp_resolve(hostport, false, &ss, &sl) == -1)
		return NULL;
	cl = sp_client_alloc(loop, max_inflight, max_frame);
	memcpy(&cl->cl_addr, &ss, sl);
	cl->cl_addrlen = sl;
	cl->cl_conn.c_typed = false;
	snprintf(cl->cl_name, sizeof(cl->cl_name), "%s", hostport);
	/* The certificate must name the host as written, brackets off. */
	hl = (size_t)(strrchr(hostport, ':') - hostport);
	if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
		h++;
		hl -= 2;
	}
	snprintf(cl->cl_host, sizeof(cl->cl_host), "%.*s", (int)hl, h);
	cl->cl_tls = tls;
	sp_client_dial(cl);
	return cl;
}

/* A client with no address yet: the caller sets it, then dials. */
static struct sp_client *
sp_client_alloc(struct ev_loop *loop, unsigned max_inflight, size_t max_frame)
{
	struct sp_client *cl;
	unsigned i;

	cl = xcalloc(1, sizeof(*cl));
	cl->cl_loop = loop;
	cl->cl_conn.c_fd = -1;
	cl->cl_backoff = SP_RECONN_MIN;
	cl->cl_down_since = ev_time();
	if (max_inflight == 0)
		max_inflight = 1;
	if (max_inflight > SP_MAX_REQUEST)
		max_inflight = SP_MAX_REQUEST;
	cl->cl_nreq = max_inflight;
	while ((1u << cl->cl_slot_bits) < max_inflight)
		cl->cl_slot_bits++;
	cl->cl_conn.c_max = max_frame;
	TAILQ_INIT(&cl->cl_idle);
	TAILQ_INIT(&cl->cl_wait);
	cl->cl_reqs = xcalloc(max_inflight, sizeof(*cl->cl_reqs));
	for (i = 0; i < max_inflight; i++) {
		cl->cl_reqs[i].rq_cl = cl;
		ev_timer_init(&cl->cl_reqs[i].rq_timer, sp_client_req_timer_cb,
		    0., 0.);
		TAILQ_INSERT_TAIL(&cl->cl_idle, &cl->cl_reqs[i], rq_link);
	}
	ev_io_init(&cl->cl_conn.c_io, sp_client_io_cb, -1, 0);
	ev_timer_init(&cl->cl_timer, sp_client_timer_cb, 0., 0.);
	return cl;
}

void
sp_client_free_with(struct sp_client *cl, void *owner)
{
	if (cl == NULL || cl->cl_free_pending || cl->cl_closing) {
		if (cl == NULL)
			free(owner);
		return;
	}
	cl->cl_owner = owner;
	sp_client_free(cl);
}

void
sp_client_free(struct sp_client *cl)
{
	if (cl == NULL || cl->cl_free_pending || cl->cl_closing)
		return;
	if (cl->cl_depth > 0) {
		cl->cl_free_pending = true;
		return;
	}
	sp_client_destroy(cl);
}

static void
sp_client_destroy(struct sp_client *cl)
{
	unsigned i;

	cl->cl_closing = true;
	cl->cl_depth++;
	for (i = 0; i < cl->cl_nreq; i++)
		if (cl->cl_reqs[i].rq_busy)
			sp_client_complete(cl, &cl->cl_reqs[i], NNG_ECLOSED,
			    NULL, 0);
	cl->cl_depth--;
	ev_timer_stop(cl->cl_loop, &cl->cl_timer);
	sp_conn_close(cl->cl_loop, &cl->cl_conn);
	free(cl->cl_owner);
	free(cl->cl_reqs);
	free(cl);
}

/*
 * Called on the way out of every loop callback: a deferred free, and the
 * output callbacks queued.
 */
static void
sp_client_leave(struct sp_client *cl)
{
	if (--cl->cl_depth > 0)
		return;
	if (cl->cl_free_pending) {
		sp_client_destroy(cl);
		return;
	}
	/* Requests a callback sent from a timer go out now. */
	if (cl->cl_state == SP_OPEN && !cl->cl_broken &&
	    cl->cl_conn.c_out.b_len > 0 && !(cl->cl_conn.c_events & EV_WRITE) &&
	    sp_conn_flush(cl->cl_loop, &cl->cl_conn) == -1) {
		cl->cl_depth++;
		sp_client_lost(cl, "send");
		sp_client_leave(cl);
	}
}

int
sp_client_send(struct sp_client *cl, const uint8_t *msg, size_t len,
    unsigned timeout_ms, sp_reply_cb cb, void *arg)
{
	struct sp_req *rq;
	uint32_t slot;

	if (cl == NULL || cl->cl_closing || cl->cl_free_pending)
		return -1;
	if (len > cl->cl_conn.c_max - 4) {
		log_warnx("%s: %zu-byte request over the %zu-byte frame limit",
		    __func__, len, cl->cl_conn.c_max);
		return -1;
	}
	if ((rq = TAILQ_FIRST(&cl->cl_idle)) == NULL)
		return -1;
	slot = (uint32_t)(rq - cl->cl_reqs);
	cl->cl_seq++;
	rq->rq_id = SP_ID_FLAG |
	    (((cl->cl_seq << cl->cl_slot_bits) | slot) & ~SP_ID_FLAG);
	rq->rq_cb = cb;
	rq->rq_arg = arg;
	rq->rq_framed = false;
	rq->rq_msg = NULL;
	rq->rq_len = len;
	if (cl->cl_state != SP_OPEN || cl->cl_broken) {
		if ((rq->rq_msg = malloc(len > 0 ? len : 1)) == NULL) {
			log_warnx("%s: out of memory", __func__);
			return -1;
		}
		if (len > 0)
			memcpy(rq->rq_msg, msg, len);
	} else if (sp_client_frame_req(cl, rq, msg, len) == -1)
		return -1;
	TAILQ_REMOVE(&cl->cl_idle, rq, rq_link);
	rq->rq_busy = true;
	cl->cl_inflight++;
	if (!rq->rq_framed)
		TAILQ_INSERT_TAIL(&cl->cl_wait, rq, rq_link);
	ev_timer_set(&rq->rq_timer, (timeout_ms > 0 ? timeout_ms : 1) / 1000.,
	    0.);
	ev_timer_start(cl->cl_loop, &rq->rq_timer);
	if (rq->rq_framed && cl->cl_depth == 0 &&
	    sp_conn_flush(cl->cl_loop, &cl->cl_conn) == -1) {
		/* Never complete from inside this call: defer the loss. */
		cl->cl_broken = true;
		ev_timer_stop(cl->cl_loop, &cl->cl_timer);
		ev_timer_set(&cl->cl_timer, 0., 0.);
		ev_timer_start(cl->cl_loop, &cl->cl_timer);
	}
	return 0;
}

/* Frames rq's message on the open connection. */
static int
sp_client_frame_req(struct sp_client *cl, struct sp_req *rq, const uint8_t *msg,
    size_t len)
{
	uint8_t id[4];

	id[0] = (uint8_t)(rq->rq_id >> 24);
	id[1] = (uint8_t)(rq->rq_id >> 16);
	id[2] = (uint8_t)(rq->rq_id >> 8);
	id[3] = (uint8_t)rq->rq_id;
	if (sp_conn_frame(&cl->cl_conn, id, sizeof(id), msg, len) == -1)
		return -1;
	rq->rq_framed = true;
	return 0;
}

unsigned
sp_client_inflight(const struct sp_client *cl)
{
	return cl == NULL ? 0 : cl->cl_inflight;
}

double
sp_client_down_secs(const struct sp_client *cl)
{
	double d;

	if (cl == NULL || cl->cl_state == SP_OPEN)
		return 0.;
	d = ev_time() - cl->cl_down_since;
	return d > 0. ? d : 0.;
}

/* Starts a connection attempt; failures wait for the backoff timer. */
static void
sp_client_dial(struct sp_client *cl)
{
	struct sp_conn *c = &cl->cl_conn;
	int fd;

	if ((fd = socket(cl->cl_addr.ss_family, SOCK_STREAM, 0)) == -1) {
		log_warn("%s: socket", __func__);
		sp_client_lost(cl, NULL);
		return;
	}
	if (sp_nonblock(fd) == -1) {
		log_warn("%s: fcntl", __func__);
		close(fd);
		sp_client_lost(cl, NULL);
		return;
	}
	if (!c->c_typed)
		sp_tcp_nodelay(fd);
	sp_conn_init(c, fd, SP_PROTO_REQ0, SP_PROTO_REP0, c->c_max, c->c_typed);
	if (cl->cl_tls != NULL &&
	    (c->c_tls = tls_conn_new_client(cl->cl_tls, fd, cl->cl_host)) ==
	        NULL) {
		close(fd);
		c->c_fd = -1;
		sp_client_lost(cl, NULL);
		return;
	}
	ev_timer_stop(cl->cl_loop, &cl->cl_timer);
	ev_timer_set(&cl->cl_timer, SP_HANDSHAKE_SECS, 0.);
	ev_timer_start(cl->cl_loop, &cl->cl_timer);
	if (connect(fd, (struct sockaddr *)&cl->cl_addr, cl->cl_addrlen) == 0) {
		cl->cl_state = SP_HANDSHAKE;
		if (sp_conn_flush(cl->cl_loop, c) == -1)
			sp_client_lost(cl, "send");
		return;
	}
	if (errno == EINPROGRESS) {
		cl->cl_state = SP_CONNECTING;
		sp_conn_events(cl->cl_loop, c, EV_WRITE);
		return;
	}
	log_debug("%s: %s: %s", __func__, cl->cl_name, strerror(errno));
	sp_client_lost(cl, NULL);
}

/*
 * The connection is gone (or never came): requests framed on it complete
 * with NNG_ECONNRESET, those waiting for a connection keep waiting, and
 * the next dial is scheduled after the backoff.
 */
static void
sp_client_lost(struct sp_client *cl, const char *why)
{
	struct sp_req_list done;
	struct sp_req *rq;
	unsigned i;

	if (why != NULL && cl->cl_state == SP_OPEN)
		log_warnx("%s: connection to %s lost: %s", __func__,
		    cl->cl_name, why);
	if (cl->cl_state == SP_OPEN)
		cl->cl_down_since = ev_time();
	sp_conn_close(cl->cl_loop, &cl->cl_conn);
	cl->cl_state = SP_IDLE;
	cl->cl_broken = false;
	ev_timer_stop(cl->cl_loop, &cl->cl_timer);
	ev_timer_set(&cl->cl_timer, cl->cl_backoff, 0.);
	ev_timer_start(cl->cl_loop, &cl->cl_timer);
	cl->cl_backoff *= 2;
	if (cl->cl_backoff > SP_RECONN_MAX)
		cl->cl_backoff = SP_RECONN_MAX;

	TAILQ_INIT(&done);
	for (i = 0; i < cl->cl_nreq; i++) {
		rq = &cl->cl_reqs[i];
		if (rq->rq_busy && rq->rq_framed)
			TAILQ_INSERT_TAIL(&done, rq, rq_link);
	}
	/* A callback may free the client: stop when it does. */
	while ((rq = TAILQ_FIRST(&done)) != NULL && !cl->cl_free_pending) {
		TAILQ_REMOVE(&done, rq, rq_link);
		sp_client_complete(cl, rq, NNG_ECONNRESET, NULL, 0);
	}
}

/* Headers exchanged: frame everything that waited for a connection. */
static void
sp_client_opened(struct sp_client *cl)
{
	struct sp_req *rq;

	cl->cl_state = SP_OPEN;
	cl->cl_backoff = SP_RECONN_MIN;
	ev_timer_stop(cl->cl_loop, &cl->cl_timer);
	while ((rq = TAILQ_FIRST(&cl->cl_wait)) != NULL) {
		if (sp_client_frame_req(cl, rq, rq->rq_msg, rq->rq_len) == -1)
			break;
		TAILQ_REMOVE(&cl->cl_wait, rq, rq_link);
		free(rq->rq_msg);
		rq->rq_msg = NULL;
	}
}

static void
sp_client_io_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct sp_client *cl =
	    SP_CONTAINER_OF(w, struct sp_client, cl_conn.c_io);
	struct sp_conn *c = &cl->cl_conn;
	const uint8_t *p;
	size_t plen, used;
	socklen_t sl;
	int rv, err;

	(void)loop;
	cl->cl_depth++;
	if (cl->cl_state == SP_CONNECTING) {
		sl = sizeof(err);
		if (getsockopt(c->c_fd, SOL_SOCKET, SO_ERROR, &err, &sl) ==
		        -1 ||
		    err != 0) {
			sp_client_lost(cl, NULL);
			goto out;
		}
		cl->cl_state = SP_HANDSHAKE;
	}
	if ((revents & EV_READ) && sp_conn_read(c) == -1) {
		sp_client_lost(cl, "end of stream");
		goto out;
	}
	while (!cl->cl_free_pending && c->c_fd != -1 &&
	    (rv = sp_conn_next(c, &p, &plen, &used)) != 0) {
		if (rv == -1) {
			sp_client_lost(cl, "protocol error");
			goto out;
		}
		if (rv == 2) {
			sp_client_opened(cl);
			continue;
		}
		sp_client_reply(cl, p, plen);
		/* A callback's send may have lost the connection. */
		if (c->c_fd != -1)
			sp_buf_consume(&c->c_in, used);
	}
	if (cl->cl_free_pending || c->c_fd == -1)
		goto out;
	if (sp_conn_flush(loop, c) == -1)
		sp_client_lost(cl, "send");
out:
	sp_client_leave(cl);
}

/* A reply: the id picks the request; a late or unknown one is dropped. */
static void
sp_client_reply(struct sp_client *cl, const uint8_t *p, size_t len)
{
	struct sp_req *rq;
	uint32_t id, slot;

	if (len < 4 || !(p[0] & 0x80)) {
		log_warnx("%s: malformed reply (%zu bytes)", __func__, len);
		sp_client_lost(cl, "malformed reply");
		return;
	}
	id = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
	    p[3];
	slot = id & ((1u << cl->cl_slot_bits) - 1);
	if (slot >= cl->cl_nreq)
		return;
	rq = &cl->cl_reqs[slot];
	if (!rq->rq_busy || !rq->rq_framed || rq->rq_id != id)
		return;
	sp_client_complete(cl, rq, 0, p + 4, len - 4);
}

/* Frees the slot, then tells the caller (who may send or free). */
static void
sp_client_complete(struct sp_client *cl, struct sp_req *rq, int status,
    const uint8_t *reply, size_t len)
{
	sp_reply_cb cb = rq->rq_cb;
	void *arg = rq->rq_arg;

	ev_timer_stop(cl->cl_loop, &rq->rq_timer);
	if (!rq->rq_framed)
		TAILQ_REMOVE(&cl->cl_wait, rq, rq_link);
	free(rq->rq_msg);
	rq->rq_msg = NULL;
	rq->rq_busy = false;
	rq->rq_framed = false;
	rq->rq_cb = NULL;
	rq->rq_arg = NULL;
	TAILQ_INSERT_TAIL(&cl->cl_idle, rq, rq_link);
	cl->cl_inflight--;
	if (cb != NULL)
		cb(arg, status, status == 0 ? reply : NULL,
		    status == 0 ? len : 0);
}

static void
sp_client_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct sp_client *cl = SP_CONTAINER_OF(w, struct sp_client, cl_timer);

	(void)loop;
	(void)revents;
	cl->cl_depth++;
	if (cl->cl_broken)
		sp_client_lost(cl, "send");
	else if (cl->cl_state == SP_IDLE)
		sp_client_dial(cl);
	else if (cl->cl_state != SP_OPEN) {
		log_debug("%s: %s: no handshake in time", __func__,
		    cl->cl_name);
		sp_client_lost(cl, NULL);
	}
	sp_client_leave(cl);
}

static void
sp_client_req_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct sp_req *rq = SP_CONTAINER_OF(w, struct sp_req, rq_timer);
	struct sp_client *cl = rq->rq_cl;

	(void)loop;
	(void)revents;
	cl->cl_depth++;
	if (rq->rq_busy)
		sp_client_complete(cl, rq, NNG_ETIMEDOUT, NULL, 0);
	sp_client_leave(cl);
}

/* ----------------------------------------------------------------- server */

struct sp_server *
sp_server_new(struct ev_loop *loop, const char *path, size_t max_frame,
    sp_request_cb cb, void *arg)
{
	struct sp_server *srv;
	struct sockaddr_un sun;
	struct stat st;
	int fd;

	memset(&sun, 0, sizeof(sun));
	if (strlen(path) >= sizeof(sun.sun_path)) {
		log_warnx("%s: %s: path too long", __func__, path);
		return NULL;
	}
	sun.sun_family = AF_UNIX;
	memcpy(sun.sun_path, path, strlen(path) + 1);
	if ((fd = socket(AF_UNIX, SOCK_STREAM, 0)) == -1) {
		log_warn("%s: socket", __func__);
		return NULL;
	}
	if (sp_nonblock(fd) == -1 ||
	    bind(fd, (struct sockaddr *)&sun, sizeof(sun)) == -1 ||
	    listen(fd, SP_LISTEN_QUEUE) == -1 || stat(path, &st) == -1) {
		log_warn("%s: listen %s", __func__, path);
		close(fd);
		return NULL;
	}
	srv = sp_server_start(loop, fd, path, true, max_frame, cb, arg);
	srv->srv_dev = st.st_dev;
	srv->srv_ino = st.st_ino;
	return srv;
}

struct sp_server *
sp_server_new_tcp(struct ev_loop *loop, const char *hostport, size_t max_frame,
    sp_request_cb cb, void *arg)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	int fd, on = 1;

	if (sp_tcp_resolve(hostport, true, &ss, &sl) == -1)
		return NULL;
	if ((fd = socket(ss.ss_family, SOCK_STREAM, 0)) == -1) {
		log_warn("%s: socket", __func__);
		return NULL;
	}
	/* A restarted broker must not wait out its predecessor's TIME_WAIT. */
	if (sp_nonblock(fd) == -1 ||
	    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) == -1 ||
	    bind(fd, (struct sockaddr *)&ss, sl) == -1 ||
	    listen(fd, SP_LISTEN_QUEUE) == -1) {
		log_warn("%s: listen tcp://%s", __func__, hostport);
		close(fd);
		return NULL;
	}
	return sp_server_start(loop, fd, hostport, false, max_frame, cb, arg);
}

struct sp_server *
sp_server_new_tls(struct ev_loop *loop, const char *hostport,
    struct tls_ctx *tls, size_t max_frame, sp_request_cb cb, void *arg)
{
	struct sp_server *srv;

	if ((srv = sp_server_new_tcp(loop, hostport, max_frame, cb, arg)) !=
	    NULL)
		srv->srv_tls = tls;
	return srv;
}

/* The server around a listening socket. */
static struct sp_server *
sp_server_start(struct ev_loop *loop, int fd, const char *name, bool unix_sock,
    size_t max_frame, sp_request_cb cb, void *arg)
{
	struct sp_server *srv;

	srv = xcalloc(1, sizeof(*srv));
	srv->srv_loop = loop;
	srv->srv_fd = fd;
	srv->srv_unix = unix_sock;
	snprintf(srv->srv_path, sizeof(srv->srv_path), "%s", name);
	srv->srv_max = max_frame;
	srv->srv_cb = cb;
	srv->srv_arg = arg;
	TAILQ_INIT(&srv->srv_conns);
	ev_io_init(&srv->srv_io, sp_server_accept_cb, fd, EV_READ);
	ev_io_start(loop, &srv->srv_io);
	ev_timer_init(&srv->srv_pause, sp_server_pause_cb, SP_ACCEPT_PAUSE, 0.);
	return srv;
}

void
sp_server_free(struct sp_server *srv)
{
	if (srv == NULL || srv->srv_free_pending)
		return;
	if (srv->srv_depth > 0) {
		srv->srv_free_pending = true;
		return;
	}
	sp_server_destroy(srv);
}

static void
sp_server_destroy(struct sp_server *srv)
{
	struct sp_sconn *sc;
	struct stat st;

	while ((sc = TAILQ_FIRST(&srv->srv_conns)) != NULL)
		sp_server_drop(srv, sc);
	ev_io_stop(srv->srv_loop, &srv->srv_io);
	ev_timer_stop(srv->srv_loop, &srv->srv_pause);
	close(srv->srv_fd);
	/* A successor may already listen on the path: leave its file. */
	if (srv->srv_unix && stat(srv->srv_path, &st) == 0 &&
	    st.st_dev == srv->srv_dev && st.st_ino == srv->srv_ino)
		unlink(srv->srv_path);
	free(srv);
}

unsigned
sp_server_nconns(const struct sp_server *srv)
{
	return srv == NULL ? 0 : srv->srv_nconns;
}

int
sp_server_port(const struct sp_server *srv)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);

	if (srv == NULL || srv->srv_unix ||
	    getsockname(srv->srv_fd, (struct sockaddr *)&ss, &sl) == -1)
		return -1;
	if (ss.ss_family == AF_INET)
		return ntohs(((struct sockaddr_in *)(void *)&ss)->sin_port);
	if (ss.ss_family == AF_INET6)
		return ntohs(((struct sockaddr_in6 *)(void *)&ss)->sin6_port);
	return -1;
}

static void
sp_server_leave(struct sp_server *srv)
{
	if (--srv->srv_depth == 0 && srv->srv_free_pending)
		sp_server_destroy(srv);
}

static void
sp_server_drop(struct sp_server *srv, struct sp_sconn *sc)
{
	struct sp_held *h;

	/* Held requests outlive the connection until their owner answers. */
	while ((h = TAILQ_FIRST(&sc->sc_held)) != NULL) {
		TAILQ_REMOVE(&sc->sc_held, h, h_link);
		h->h_sc = NULL;
	}
	TAILQ_REMOVE(&srv->srv_conns, sc, sc_link);
	srv->srv_nconns--;
	ev_timer_stop(srv->srv_loop, &sc->sc_timer);
	sp_conn_close(srv->srv_loop, &sc->sc_conn);
	free(sc);
}

static void
sp_server_accept_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct sp_server *srv = SP_CONTAINER_OF(w, struct sp_server, srv_io);
	struct sp_sconn *sc;
	int fd, i;

	(void)revents;
	for (i = 0; i < SP_ACCEPT_BURST; i++) {
		if ((fd = accept(srv->srv_fd, NULL, NULL)) == -1) {
			if (errno == EMFILE || errno == ENFILE ||
			    errno == ENOBUFS || errno == ENOMEM) {
				/* Never spin: wait for descriptors. */
				log_warn("%s: accept, pausing %.0f ms",
				    __func__, SP_ACCEPT_PAUSE * 1000);
				ev_io_stop(loop, &srv->srv_io);
				ev_timer_start(loop, &srv->srv_pause);
			} else if (errno != EAGAIN && errno != EINTR &&
			    errno != ECONNABORTED)
				log_warn("%s: accept", __func__);
			return;
		}
		if (sp_nonblock(fd) == -1) {
			log_warn("%s: fcntl", __func__);
			close(fd);
			continue;
		}
		if (!srv->srv_unix)
			sp_tcp_nodelay(fd);
		sc = xcalloc(1, sizeof(*sc));
		sc->sc_srv = srv;
		TAILQ_INIT(&sc->sc_held);
		sp_conn_init(&sc->sc_conn, fd, SP_PROTO_REP0, SP_PROTO_REQ0,
		    srv->srv_max, srv->srv_unix);
		ev_io_init(&sc->sc_conn.c_io, sp_server_conn_cb, fd, 0);
		if (srv->srv_tls != NULL &&
		    (sc->sc_conn.c_tls =
		            tls_conn_new_server(srv->srv_tls, fd)) == NULL) {
			sp_conn_close(loop, &sc->sc_conn);
			free(sc);
			continue;
		}
		ev_timer_init(&sc->sc_timer, sp_server_hs_cb, SP_HANDSHAKE_SECS,
		    0.);
		ev_timer_start(loop, &sc->sc_timer);
		TAILQ_INSERT_TAIL(&srv->srv_conns, sc, sc_link);
		srv->srv_nconns++;
		if (sp_conn_flush(loop, &sc->sc_conn) == -1)
			sp_server_drop(srv, sc);
	}
}

static void
sp_server_pause_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct sp_server *srv = SP_CONTAINER_OF(w, struct sp_server, srv_pause);

	(void)revents;
	ev_io_start(loop, &srv->srv_io);
}

static void
sp_server_hs_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct sp_sconn *sc = SP_CONTAINER_OF(w, struct sp_sconn, sc_timer);

	(void)loop;
	(void)revents;
	log_debug("%s: a peer sent no SP header in time", __func__);
	sp_server_drop(sc->sc_srv, sc);
}

static void
sp_server_conn_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct sp_sconn *sc = SP_CONTAINER_OF(w, struct sp_sconn, sc_conn.c_io);
	struct sp_server *srv = sc->sc_srv;
	struct sp_conn *c = &sc->sc_conn;
	const uint8_t *p;
	size_t plen, used;
	int rv;

	srv->srv_depth++;
	if ((revents & EV_READ) && sp_conn_read(c) == -1)
		sc->sc_dead = true;
	while (!sc->sc_dead && !srv->srv_free_pending &&
	    (rv = sp_conn_next(c, &p, &plen, &used)) != 0) {
		if (rv == -1) {
			sc->sc_dead = true;
			break;
		}
		if (rv == 2) {
			ev_timer_stop(loop, &sc->sc_timer);
			continue;
		}
		sp_server_request(srv, sc, p, plen);
		sp_buf_consume(&c->c_in, used);
	}
	if (!srv->srv_free_pending) {
		/* A peer that leaves its replies unread is cut off. */
		if (!sc->sc_dead && c->c_out.b_len > 4 * srv->srv_max) {
			log_warnx("%s: peer does not read its replies",
			    __func__);
			sc->sc_dead = true;
		}
		if (sc->sc_dead || sp_conn_flush(loop, c) == -1)
			sp_server_drop(srv, sc);
	}
	sp_server_leave(srv);
}

/*
 * One request frame: hand the body over, frame the reply behind it (or
 * nothing now when the callback held the request).
 */
static void
sp_server_request(struct sp_server *srv, struct sp_sconn *sc, const uint8_t *p,
    size_t len)
{
	struct sp_current cur, *prev;
	uint8_t *reply = NULL;
	size_t reply_len = 0;
	int bt;

	if ((bt = sp_backtrace_len(p, len)) == -1) {
		log_warnx("%s: request without a request id", __func__);
		sc->sc_dead = true;
		return;
	}
	if (bt == 0) {
		log_debug("%s: request over %d hops dropped", __func__,
		    SP_MAX_HOPS);
		return;
	}
	cur.cur_sc = sc;
	cur.cur_bt = p;
	cur.cur_btlen = (size_t)bt;
	cur.cur_held = NULL;
	prev = sp_cur;
	sp_cur = &cur;
	srv->srv_cb(srv->srv_arg, p + bt, len - (size_t)bt, &reply, &reply_len);
	sp_cur = prev;
	if (cur.cur_held != NULL) {
		free(reply);
		return;
	}
	if (reply == NULL)
		return;
	if (!srv->srv_free_pending &&
	    sp_conn_frame(&sc->sc_conn, p, (size_t)bt, reply, reply_len) == -1)
		sc->sc_dead = true;
	free(reply);
}

struct sp_held *
sp_server_hold(void)
{
	struct sp_held *h;

	if (sp_cur == NULL || sp_cur->cur_held != NULL)
		return NULL;
	h = xcalloc(1, sizeof(*h));
	h->h_sc = sp_cur->cur_sc;
	memcpy(h->h_bt, sp_cur->cur_bt, sp_cur->cur_btlen);
	h->h_btlen = sp_cur->cur_btlen;
	TAILQ_INSERT_TAIL(&h->h_sc->sc_held, h, h_link);
	sp_cur->cur_held = h;
	return h;
}

bool
sp_held_alive(const struct sp_held *h)
{
	return h != NULL && h->h_sc != NULL && !h->h_sc->sc_dead &&
	    !h->h_sc->sc_srv->srv_free_pending;
}

/*
 * The reply is framed now; the write happens from the connection's own
 * callback (fed as writable), so that a write error may drop the
 * connection wherever this was called from.
 */
void
sp_held_reply(struct sp_held *h, uint8_t *reply, size_t len)
{
	struct sp_sconn *sc;

	if (h == NULL) {
		free(reply);
		return;
	}
	if (sp_held_alive(h)) {
		sc = h->h_sc;
		if (sp_conn_frame(&sc->sc_conn, h->h_bt, h->h_btlen, reply,
		        len) == -1)
			sc->sc_dead = true;
		ev_feed_event(sc->sc_srv->srv_loop, &sc->sc_conn.c_io,
		    EV_WRITE);
	}
	free(reply);
	sp_held_drop(h);
}

void
sp_held_drop(struct sp_held *h)
{
	if (h == NULL)
		return;
	if (h->h_sc != NULL)
		TAILQ_REMOVE(&h->h_sc->sc_held, h, h_link);
	free(h);
}
