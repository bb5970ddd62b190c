/*
 * conn.c: one client connection: reads requests with the shared reader
 * (limits, 413/431, smuggling defences), answers pipelined requests one at
 * a time and in order, handles Expect: 100-continue, the slow-client
 * timeouts (head, body stall, keep-alive idle) and TLS when configured.
 * A body that the proxy streams unparsed (gateway.md §6.4) is handed to
 * the request's handler piece by piece while the request is in progress.
 * The client fd is watched while a request is in progress, so a client
 * that closes or resets its connection cancels the request at once.
 * A connection is freed only from the loop (a zero timer), never inside a
 * call made by its request handler. A connection closed by the gateway
 * lingers: its write side is shut and what the client still sends (the
 * rest of a refused body) is read and dropped for a moment, so the client
 * reads the answer instead of a reset.
 * Output appended with conn_flush_later is written once per loop turn
 * (an ev_prepare), so a response relayed in many small pieces costs one
 * write per connection per turn instead of one per piece.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include "frontend/frontend.h"
#include "shared/arena.h"
#include "shared/log.h"
#include "shared/tls.h"

#define CONN_TLS_WRITE_MAX 16384
#define CONN_LINGER_SECS   2.0 /* reading what a closed client still sends */

enum conn_state {
	CONN_IDLE = 0, /* between requests */
	CONN_HEAD, /* part of a request head arrived */
	CONN_BODY, /* head parsed, body arriving */
	CONN_BUSY, /* a request is being answered */
};

struct conn {
	ev_io c_rio;
	ev_io c_wio;
	ev_timer c_timer;
	ev_timer c_reap;
	int c_fd;
	enum listener_kind c_kind;
	enum conn_state c_state;
	struct tls_conn *c_tls;
	size_t c_tls_wlen; /* length of a TLS write to repeat */
	struct http_reader *c_reader;
	char c_in[FE_IN_BUF];
	size_t c_inlen;
	struct http_out c_out;
	size_t c_outoff;
	bool c_dead; /* fd closed, freed by c_reap */
	bool c_loopback; /* the client is on this host */
	bool c_close_after; /* close once the output is written */
	bool c_eof;
	bool c_lingering; /* write side shut, discarding input until EOF */
	bool c_in_process;
	bool c_want_drain;
	bool c_keep_alive;
	bool c_body_streaming; /* the busy request's body is still arriving */
	bool c_body_paused; /* ... and the handler cannot take more now */
	bool c_flush_queued; /* on conn_dirty, written before the loop sleeps */
	unsigned c_http_minor;
	const struct conn_handler *c_h;
	void *c_harg;
	struct arena c_pool; /* the current request's memory and hooks */
	int c_status; /* status of the response written, 0 none yet */
	char c_error_code[FE_CODE_MAX]; /* its gateway error code, "" none */
	ev_tstamp c_started; /* when the request became busy */
	/* Body progress, checked by the periodic body timer (not re-armed
	 * by each byte, so a trickle cannot hold the connection). */
	ev_tstamp c_body_progress; /* last time a body byte came */
	ev_tstamp c_body_window; /* start of the rate window */
	uint64_t c_body_seen; /* body bytes at the last check */
	uint64_t c_body_window_bytes; /* body bytes at the window start */
	uint64_t c_buffered; /* body bytes counted in conn_buffered */
	const char *c_method_label; /* metric labels of the request */
	const char *c_path_label;
	/* The access line's fields (log_access), per request. */
	ev_tstamp c_t0; /* request head complete */
	uint64_t c_sent; /* response bytes written */
	char c_reqid[64];
	char c_worker[128];
	TAILQ_ENTRY(conn) c_link;
	TAILQ_ENTRY(conn) c_flush_link;
};

static TAILQ_HEAD(, conn) conns = TAILQ_HEAD_INITIALIZER(conns);
static const struct conn_routes *conn_routes;
/* Request body bytes held by every connection of this process. */
static uint64_t conn_buffered;
static TAILQ_HEAD(, conn) conn_dirty = TAILQ_HEAD_INITIALIZER(conn_dirty);
static ev_prepare conn_flush_prep;
static bool conn_flush_prep_init;

static void conn_read_cb(struct ev_loop *, ev_io *, int);
static void conn_write_cb(struct ev_loop *, ev_io *, int);
static void conn_timer_cb(struct ev_loop *, ev_timer *, int);
static void conn_reap_cb(struct ev_loop *, ev_timer *, int);
static void conn_flush_prep_cb(struct ev_loop *, ev_prepare *, int);
static void conn_unqueue(struct conn *);
static void conn_kill(struct conn *);
static void conn_linger(struct conn *);
static void conn_process(struct conn *);
static void conn_read(struct conn *);
static int conn_write(struct conn *);
static void conn_update(struct conn *);
static void conn_arm_timer(struct conn *, double);
static bool conn_fd_loopback(int);
static void conn_body_watch(struct conn *);
static bool conn_body_moving(struct conn *);
static double conn_body_period(void);
static int conn_buffer_account(struct conn *, uint64_t);
static void conn_begin(struct conn *, const struct http_request *);
static void conn_stream_body(struct conn *, const struct http_request *);
static void conn_body_piece(struct conn *, const struct http_request *, bool);
static void conn_access_log(struct conn *);

void
conn_accept(int fd, enum listener_kind kind)
{
	struct conn *c;

	if ((c = calloc(1, sizeof(*c))) == NULL ||
	    (c->c_reader = http_reader_new(&fe->fe_limits)) == NULL) {
		free(c);
		close(fd);
		return;
	}
	if (kind == LISTENER_MAIN && fe->fe_tls != NULL &&
	    (c->c_tls = tls_conn_new_server(fe->fe_tls, fd)) == NULL) {
		http_reader_free(c->c_reader);
		free(c);
		close(fd);
		return;
	}
	c->c_fd = fd;
	c->c_kind = kind;
	c->c_loopback = conn_fd_loopback(fd);
	c->c_state = CONN_IDLE;
	http_out_init(&c->c_out);
	ev_io_init(&c->c_rio, conn_read_cb, fd, EV_READ);
	ev_io_init(&c->c_wio, conn_write_cb, fd, EV_WRITE);
	ev_init(&c->c_timer, conn_timer_cb);
	ev_timer_init(&c->c_reap, conn_reap_cb, 0., 0.);
	ev_io_start(fe->fe_loop, &c->c_rio);
	/* A TLS handshake must finish as fast as a request head. */
	conn_arm_timer(c,
	    c->c_tls != NULL ? FE_HEADER_TIMEOUT : FE_IDLE_TIMEOUT);
	TAILQ_INSERT_TAIL(&conns, c, c_link);
	fe->fe_nconns++;
}

/* Whether the peer of fd is a loopback address (or a Unix socket). */
static bool
conn_fd_loopback(int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	const struct sockaddr_in6 *s6;
	const uint8_t *a;

	if (getpeername(fd, (struct sockaddr *)&ss, &len) == -1)
		return false;
	switch (ss.ss_family) {
	case AF_UNIX:
		return true;
	case AF_INET:
		return (ntohl(((const struct sockaddr_in *)&ss)
		                  ->sin_addr.s_addr) >>
		           24) == 127;
	case AF_INET6:
		s6 = (const struct sockaddr_in6 *)&ss;
		a = s6->sin6_addr.s6_addr;
		if (IN6_IS_ADDR_LOOPBACK(&s6->sin6_addr))
			return true;
		return IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr) && a[12] == 127;
	default:
		return false;
	}
}

bool
conn_peer_loopback(const struct conn *c)
{
	return c->c_loopback;
}

void
conn_drain_all(void)
{
	struct conn *c;

	TAILQ_FOREACH(c, &conns, c_link)
	{
		if (c->c_dead)
			continue;
		if (c->c_lingering)
			conn_kill(c);
		else if (c->c_state == CONN_BUSY)
			c->c_close_after = true;
		else if (c->c_state == CONN_IDLE && conn_pending(c) == 0)
			/* A keep-alive client may be sending its next request
			 * right now: it gets a moment to be answered (with
			 * Connection: close) instead of a reset. */
			conn_arm_timer(c, FE_DRAIN_IDLE_SECS);
		else
			c->c_close_after = true;
	}
}

/* How often a body in progress is checked. */
static double
conn_body_period(void)
{
	double stall = (double)fe->fe_cf->cf_stream_body_stall_timeout_secs;

	return stall < FE_BODY_RATE_WINDOW ? stall : FE_BODY_RATE_WINDOW;
}

/* Starts watching a body: now is its last progress and window start. */
static void
conn_body_watch(struct conn *c)
{
	const struct http_request *req = http_reader_request(c->c_reader);
	uint64_t seen = req != NULL ? req->hr_body_total : 0;

	c->c_body_progress = c->c_body_window = ev_now(fe->fe_loop);
	c->c_body_seen = c->c_body_window_bytes = seen;
	conn_arm_timer(c, conn_body_period());
}

/*
 * At each check: whether the body still arrives well enough. It fails
 * when nothing came for --stream-body-stall-timeout-secs, or when a whole
 * window brought less than --body-min-rate-bytes-per-sec.
 */
static bool
conn_body_moving(struct conn *c)
{
	const struct http_request *req = http_reader_request(c->c_reader);
	uint64_t seen = req != NULL ? req->hr_body_total : 0;
	double now = ev_now(fe->fe_loop), span;
	double rate = (double)fe->fe_cf->cf_body_min_rate_bytes_per_sec;

	if (c->c_body_paused)
		return true; /* the wait is on the worker */
	if (seen > c->c_body_seen) {
		c->c_body_seen = seen;
		c->c_body_progress = now;
	}
	if (now - c->c_body_progress >=
	    (double)fe->fe_cf->cf_stream_body_stall_timeout_secs - 0.001)
		return false;
	span = now - c->c_body_window;
	if (span >= FE_BODY_RATE_WINDOW - 0.001) {
		if ((double)(seen - c->c_body_window_bytes) < rate * span) {
			stats_add("smg_frontend_slow_bodies_total", "", 1);
			return false;
		}
		c->c_body_window = now;
		c->c_body_window_bytes = seen;
	}
	return true;
}

int
conn_buffer_add(struct conn *c, int64_t delta)
{
	if (delta < 0 && (uint64_t)-delta > c->c_buffered)
		delta = -(int64_t)c->c_buffered;
	return conn_buffer_account(c, c->c_buffered + (uint64_t)delta);
}

/*
 * Sets this connection's share of the buffered body bytes to n. Returns
 * -1 (nothing changed) when that would take the process over
 * --max-buffered-bytes-total.
 */
static int
conn_buffer_account(struct conn *c, uint64_t n)
{
	uint64_t cap = fe->fe_cf->cf_max_buffered_bytes_total;

	if (n > c->c_buffered && cap > 0 &&
	    conn_buffered - c->c_buffered + n > cap)
		return -1;
	conn_buffered = conn_buffered - c->c_buffered + n;
	c->c_buffered = n;
	return 0;
}

static void
conn_arm_timer(struct conn *c, double secs)
{
	if (secs <= 0) {
		ev_timer_stop(fe->fe_loop, &c->c_timer);
		return;
	}
	c->c_timer.repeat = secs;
	ev_timer_again(fe->fe_loop, &c->c_timer);
}

/* Closes the socket now; the struct goes from the loop (conn_reap_cb). */
static void
conn_kill(struct conn *c)
{
	if (c->c_dead)
		return;
	c->c_dead = true;
	conn_unqueue(c);
	ev_io_stop(fe->fe_loop, &c->c_rio);
	ev_io_stop(fe->fe_loop, &c->c_wio);
	ev_timer_stop(fe->fe_loop, &c->c_timer);
	tls_conn_free(c->c_tls);
	c->c_tls = NULL;
	close(c->c_fd);
	c->c_fd = -1;
	ev_timer_start(fe->fe_loop, &c->c_reap);
}

static void
conn_reap_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct conn *c =
	    (struct conn *)((char *)w - offsetof(struct conn, c_reap));

	(void)loop;
	(void)revents;
	if (c->c_state == CONN_BUSY) {
		/* The client went away mid-request: its hooks release it. */
		fe->fe_nbusy--;
		c->c_state = CONN_IDLE;
		c->c_h = NULL;
		c->c_harg = NULL;
	}
	arena_reset(&c->c_pool);
	conn_buffer_account(c, 0);
	TAILQ_REMOVE(&conns, c, c_link);
	http_reader_free(c->c_reader);
	http_out_free(&c->c_out);
	fe->fe_nconns--;
	free(c);
}

void
conn_set_handler(struct conn *c, const struct conn_handler *h, void *arg)
{
	c->c_h = h;
	c->c_harg = arg;
}

struct http_out *
conn_out(struct conn *c)
{
	return &c->c_out;
}

size_t
conn_pending(const struct conn *c)
{
	return c->c_out.ho_len - c->c_outoff;
}

bool
conn_keep_alive(const struct conn *c)
{
	return c->c_keep_alive && !c->c_close_after && !fe->fe_draining;
}

void
conn_set_close(struct conn *c)
{
	c->c_keep_alive = false;
}

unsigned
conn_http_minor(const struct conn *c)
{
	return c->c_http_minor;
}

enum listener_kind
conn_kind(const struct conn *c)
{
	return c->c_kind;
}

int
conn_status(const struct conn *c)
{
	return c->c_status;
}

/* Writes what it can; 0 when all is written or must wait, -1 on error. */
static int
conn_write(struct conn *c)
{
	ssize_t n;
	size_t len;

	while (c->c_outoff < c->c_out.ho_len) {
		len = c->c_out.ho_len - c->c_outoff;
		if (c->c_tls != NULL) {
			if (c->c_tls_wlen != 0)
				len = c->c_tls_wlen;
			else if (len > CONN_TLS_WRITE_MAX)
				len = CONN_TLS_WRITE_MAX;
			n = tls_conn_write(c->c_tls,
			    c->c_out.ho_buf + c->c_outoff, len);
			if (n == TLS_WANT_READ || n == TLS_WANT_WRITE) {
				c->c_tls_wlen = len;
				ev_io_start(fe->fe_loop, &c->c_wio);
				return 0;
			}
			if (n < 0)
				return -1;
			c->c_tls_wlen = 0;
		} else {
			n = write(c->c_fd, c->c_out.ho_buf + c->c_outoff, len);
			if (n == -1) {
				if (errno == EINTR)
					continue;
				if (errno == EAGAIN || errno == EWOULDBLOCK) {
					ev_io_start(fe->fe_loop, &c->c_wio);
					return 0;
				}
				return -1;
			}
		}
		c->c_outoff += (size_t)n;
		c->c_sent += (uint64_t)n;
	}
	ev_io_stop(fe->fe_loop, &c->c_wio);
	http_out_reset(&c->c_out);
	c->c_outoff = 0;
	return 0;
}

void
conn_flush(struct conn *c)
{
	conn_unqueue(c);
	if (c->c_dead)
		return;
	if (c->c_out.ho_failed) {
		/* Out of memory mid-response: nothing sane can follow. */
		conn_kill(c);
		return;
	}
	if (conn_write(c) == -1) {
		conn_kill(c);
		return;
	}
	if (conn_pending(c) > FE_OUT_HIGH)
		c->c_want_drain = true;
	if (conn_pending(c) == 0 && c->c_close_after && c->c_state != CONN_BUSY)
		conn_linger(c);
}

void
conn_flush_later(struct conn *c)
{
	if (c->c_dead || c->c_flush_queued)
		return;
	if (!conn_flush_prep_init) {
		ev_prepare_init(&conn_flush_prep, conn_flush_prep_cb);
		conn_flush_prep_init = true;
	}
	c->c_flush_queued = true;
	TAILQ_INSERT_TAIL(&conn_dirty, c, c_flush_link);
	/* Only active while there is work, so it never keeps the loop up. */
	if (!ev_is_active(&conn_flush_prep))
		ev_prepare_start(fe->fe_loop, &conn_flush_prep);
}

static void
conn_unqueue(struct conn *c)
{
	if (!c->c_flush_queued)
		return;
	c->c_flush_queued = false;
	TAILQ_REMOVE(&conn_dirty, c, c_flush_link);
	if (TAILQ_EMPTY(&conn_dirty))
		ev_prepare_stop(fe->fe_loop, &conn_flush_prep);
}

/* The loop is about to sleep: one write per connection with output. */
static void
conn_flush_prep_cb(struct ev_loop *loop, ev_prepare *w, int revents)
{
	struct conn *c;

	(void)loop;
	(void)w;
	(void)revents;
	while ((c = TAILQ_FIRST(&conn_dirty)) != NULL)
		conn_flush(c);
}

/* Everything is written and the connection is to close: shut the write
 * side, then wait a moment for the client's EOF. */
static void
conn_linger(struct conn *c)
{
	if (c->c_lingering)
		return;
	if (c->c_eof || shutdown(c->c_fd, SHUT_WR) == -1) {
		conn_kill(c);
		return;
	}
	c->c_lingering = true;
	ev_io_stop(fe->fe_loop, &c->c_wio);
	ev_io_start(fe->fe_loop, &c->c_rio);
	conn_arm_timer(c, CONN_LINGER_SECS);
}

static void
conn_write_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct conn *c =
	    (struct conn *)((char *)w - offsetof(struct conn, c_wio));
	const struct conn_handler *h;

	(void)loop;
	(void)revents;
	conn_flush(c);
	if (c->c_dead)
		return;
	if (c->c_want_drain && conn_pending(c) < FE_OUT_LOW) {
		c->c_want_drain = false;
		h = c->c_h;
		if (c->c_state == CONN_BUSY && h != NULL &&
		    h->ch_drained != NULL)
			h->ch_drained(c->c_harg);
	}
	if (!c->c_dead && c->c_state != CONN_BUSY && conn_pending(c) == 0)
		conn_process(c);
}

static void
conn_read(struct conn *c)
{
	ssize_t n;

	while (c->c_inlen < sizeof(c->c_in)) {
		if (c->c_tls != NULL) {
			n = tls_conn_read(c->c_tls, c->c_in + c->c_inlen,
			    sizeof(c->c_in) - c->c_inlen);
			if (n == TLS_WANT_READ)
				return;
			if (n == TLS_WANT_WRITE) {
				ev_io_start(fe->fe_loop, &c->c_wio);
				return;
			}
			if (n == TLS_CLOSED || n == 0) {
				c->c_eof = true;
				return;
			}
			if (n < 0) {
				conn_kill(c);
				return;
			}
		} else {
			n = read(c->c_fd, c->c_in + c->c_inlen,
			    sizeof(c->c_in) - c->c_inlen);
			if (n == -1) {
				if (errno == EINTR)
					continue;
				if (errno != EAGAIN && errno != EWOULDBLOCK)
					conn_kill(c);
				return;
			}
			if (n == 0) {
				c->c_eof = true;
				return;
			}
		}
		c->c_inlen += (size_t)n;
		if (c->c_tls == NULL)
			return;
	}
}

static void
conn_read_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct conn *c =
	    (struct conn *)((char *)w - offsetof(struct conn, c_rio));

	(void)loop;
	(void)revents;
	if (c->c_lingering) {
		char drop[4096];
		ssize_t n;

		/* Raw bytes, TLS records included: all of it is dropped. */
		while ((n = read(c->c_fd, drop, sizeof(drop))) > 0)
			;
		if (n == 0 ||
		    (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
			conn_kill(c);
		return;
	}
	conn_read(c);
	if (c->c_dead)
		return;
	if (c->c_eof) {
		/*
		 * The client is gone: a request in progress ends now (its
		 * handler's ch_gone cancels the upstream request and ends the
		 * in-flight count). The read watcher stays on while a request
		 * is busy for this, pipelined bytes landing in c_in until it is
		 * full. A half-closed client (shutdown of its write side after
		 * a complete request) is taken as gone too, like a proxy that
		 * does not ignore client aborts: waiting would keep a worker
		 * generating for a peer that most often left.
		 */
		conn_kill(c);
		return;
	}
	conn_process(c);
}

/* Starts or stops the read watcher to match the state. */
static void
conn_update(struct conn *c)
{
	if (c->c_dead || c->c_lingering)
		return;
	if (c->c_body_paused) {
		ev_io_stop(fe->fe_loop, &c->c_rio);
	} else if (c->c_inlen < sizeof(c->c_in) && !c->c_close_after) {
		ev_io_start(fe->fe_loop, &c->c_rio);
		if (c->c_tls != NULL && tls_conn_pending(c->c_tls) > 0)
			ev_feed_event(fe->fe_loop, &c->c_rio, EV_READ);
	} else if (c->c_state != CONN_BUSY || c->c_close_after) {
		ev_io_stop(fe->fe_loop, &c->c_rio);
	} else {
		/* Busy with a full buffer: stop, the response frees it. */
		ev_io_stop(fe->fe_loop, &c->c_rio);
	}
}

static void
conn_process(struct conn *c)
{
	const struct http_request *req;
	enum http_read_status st;
	const char *reason;
	size_t used;
	int status;

	if (c->c_in_process || c->c_dead)
		return;
	c->c_in_process = true;
	while (!c->c_dead && !c->c_close_after) {
		if (c->c_state == CONN_BUSY &&
		    (!c->c_body_streaming || c->c_body_paused))
			break;
		if (!c->c_body_streaming && conn_pending(c) > FE_OUT_HIGH)
			break;
		if (c->c_state == CONN_IDLE && c->c_inlen == 0)
			break;
		st = http_reader_feed(c->c_reader, c->c_in, c->c_inlen, &used);
		if (used > 0) {
			memmove(c->c_in, c->c_in + used, c->c_inlen - used);
			c->c_inlen -= used;
		}
		if (c->c_state == CONN_BODY && !c->c_body_streaming &&
		    st != HTTP_READ_ERROR &&
		    conn_buffer_account(c,
		        http_reader_request(c->c_reader)->hr_body_total) ==
		        -1) {
			/* Every connection's bodies together are over the
			 * frontend's cap: this one is refused. */
			c->c_keep_alive = false;
			c->c_close_after = true;
			c->c_state = CONN_IDLE;
			ev_timer_stop(fe->fe_loop, &c->c_timer);
			http_out_error(&c->c_out, 503, "gateway_overloaded",
			    "The gateway holds too many request bodies", NULL,
			    1, false);
			stats_http_response("other", "other", 503,
			    "gateway_overloaded", -1);
			stats_add("smg_frontend_body_buffer_refusals_total", "",
			    1);
			conn_buffer_account(c, 0);
			conn_flush(c);
			break;
		}
		if (st == HTTP_READ_AGAIN) {
			if (c->c_state == CONN_IDLE) {
				c->c_state = CONN_HEAD;
				conn_arm_timer(c, FE_HEADER_TIMEOUT);
			}
			break;
		}
		if (st == HTTP_READ_HEADERS) {
			req = http_reader_request(c->c_reader);
			if (c->c_state != CONN_BODY)
				conn_body_watch(c);
			c->c_state = CONN_BODY;
			if (req->hr_expect_continue) {
				http_out_append(&c->c_out, HTTP_100_CONTINUE,
				    strlen(HTTP_100_CONTINUE));
				conn_flush(c);
			}
			if (c->c_kind == LISTENER_MAIN &&
			    conn_routes->cr_stream_wanted(req) &&
			    http_reader_stream_body(c->c_reader) == 0)
				conn_stream_body(c, req);
			continue;
		}
		if (st == HTTP_READ_BODY ||
		    (st == HTTP_READ_DONE && c->c_body_streaming)) {
			conn_body_piece(c, http_reader_request(c->c_reader),
			    st == HTTP_READ_DONE);
			continue;
		}
		if (st == HTTP_READ_DONE) {
			req = http_reader_request(c->c_reader);
			conn_begin(c, req);
			conn_routes->cr_dispatch(c, req, c->c_kind);
			continue;
		}
		/* HTTP_READ_ERROR (or anything unexpected). */
		status = http_reader_error(c->c_reader, &reason);
		if (status == 0)
			status = 400;
		c->c_keep_alive = false;
		c->c_close_after = true;
		http_out_error(&c->c_out, status, "bad_request",
		    reason != NULL ? reason : http_status_reason(status), NULL,
		    0, false);
		stats_http_response("other", "other", status, "bad_request",
		    -1);
		conn_flush(c);
		break;
	}
	c->c_in_process = false;
	if (c->c_dead)
		return;
	if (c->c_state == CONN_IDLE && c->c_inlen == 0 && fe->fe_draining &&
	    conn_pending(c) == 0 && !ev_is_active(&c->c_timer)) {
		conn_kill(c);
		return;
	}
	conn_update(c);
}

/* The request is complete enough to be answered: it becomes busy. */
static void
conn_begin(struct conn *c, const struct http_request *req)
{
	c->c_state = CONN_BUSY;
	ev_timer_stop(fe->fe_loop, &c->c_timer);
	fe->fe_nbusy++;
	c->c_keep_alive = req->hr_keep_alive;
	c->c_http_minor = req->hr_http_minor;
	c->c_h = NULL;
	c->c_status = 0;
	c->c_error_code[0] = '\0';
	c->c_started = ev_time();
	/* Kept as static strings: the request may be gone at the end. */
	c->c_method_label = stats_method_label(req);
	c->c_path_label = stats_path_label(req->hr_path);
	c->c_t0 = ev_now(fe->fe_loop);
	c->c_sent = 0;
	c->c_reqid[0] = c->c_worker[0] = '\0';
}

/*
 * The head of a request whose body is streamed: it is routed now, and the
 * body goes to its handler as it arrives, under the stall timeout.
 */
static void
conn_stream_body(struct conn *c, const struct http_request *req)
{
	conn_begin(c, req);
	c->c_body_streaming = true;
	conn_body_watch(c);
	conn_routes->cr_dispatch(c, req, c->c_kind);
}

static void
conn_body_piece(struct conn *c, const struct http_request *req, bool last)
{
	const struct conn_handler *h = c->c_h;

	if (last) {
		c->c_body_streaming = false;
		c->c_body_paused = false;
		ev_timer_stop(fe->fe_loop, &c->c_timer);
	}
	if (h != NULL && h->ch_body != NULL && (req->hr_body_len > 0 || last))
		h->ch_body(c->c_harg, req->hr_body, req->hr_body_len, last);
}

bool
conn_body_streaming(const struct conn *c)
{
	return c->c_body_streaming;
}

void
conn_body_pause(struct conn *c)
{
	if (!c->c_body_streaming || c->c_body_paused)
		return;
	c->c_body_paused = true;
	/* The wait is on the worker now, not on the client. */
	ev_timer_stop(fe->fe_loop, &c->c_timer);
	if (!c->c_in_process)
		conn_update(c);
}

void
conn_body_resume(struct conn *c)
{
	if (!c->c_body_paused || c->c_dead)
		return;
	c->c_body_paused = false;
	conn_body_watch(c);
	if (c->c_in_process)
		return;
	/* Bytes already buffered would not wake the fd. */
	conn_process(c);
}

static void
conn_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct conn *c =
	    (struct conn *)((char *)w - offsetof(struct conn, c_timer));
	const struct conn_handler *h = c->c_h;

	(void)loop;
	(void)revents;
	ev_timer_stop(fe->fe_loop, w);
	if (c->c_lingering) {
		conn_kill(c);
		return;
	}
	if ((c->c_state == CONN_BODY || c->c_body_streaming) &&
	    conn_body_moving(c)) {
		conn_arm_timer(c, conn_body_period());
		return;
	}
	if (c->c_body_streaming) {
		/* Stalled mid-body: the rest never comes, and the request
		 * ends (with 408 when nothing was answered yet). */
		c->c_body_streaming = false;
		c->c_body_paused = false;
		c->c_keep_alive = false;
		c->c_close_after = true;
		ev_io_stop(fe->fe_loop, &c->c_rio);
		if (c->c_state == CONN_BUSY && h != NULL &&
		    h->ch_body_stalled != NULL) {
			h->ch_body_stalled(c->c_harg);
			return;
		}
		conn_kill(c);
		return;
	}
	if (c->c_state == CONN_HEAD || c->c_state == CONN_BODY) {
		/* Slow client: tell it, then close. */
		c->c_close_after = true;
		c->c_keep_alive = false;
		c->c_state = CONN_IDLE;
		http_out_error(&c->c_out, 408, "request_timeout",
		    "Request not received in time", NULL, 0, false);
		stats_http_response("other", "other", 408, "request_timeout",
		    -1);
		conn_flush(c);
		if (c->c_dead || c->c_lingering || conn_pending(c) > 0)
			return;
	}
	conn_kill(c);
}

void
conn_request_done(struct conn *c)
{
	if (c->c_state == CONN_BUSY) {
		stats_http_response(c->c_method_label, c->c_path_label,
		    c->c_status != 0 ? c->c_status : 500, c->c_error_code,
		    ev_time() - c->c_started);
		conn_access_log(c);
	}
	/* The extra header lines lived in the request's memory. */
	http_out_extra(&c->c_out, NULL);
	/* Whatever the handler still holds goes before the next request. */
	arena_reset(&c->c_pool);
	conn_buffer_account(c, 0);
	if (c->c_body_streaming) {
		/* Answered before the whole body came: the rest is unread. */
		c->c_body_streaming = false;
		c->c_body_paused = false;
		c->c_keep_alive = false;
		ev_timer_stop(fe->fe_loop, &c->c_timer);
	}
	if (c->c_state == CONN_BUSY) {
		c->c_state = CONN_IDLE;
		fe->fe_nbusy--;
	}
	c->c_h = NULL;
	c->c_harg = NULL;
	if (c->c_dead)
		return;
	if (!c->c_keep_alive || fe->fe_draining)
		c->c_close_after = true;
	http_reader_reset(c->c_reader);
	conn_flush(c);
	if (c->c_dead || c->c_close_after)
		return;
	conn_arm_timer(c, FE_IDLE_TIMEOUT);
	conn_process(c);
}

/*
 * One access line per request of the main listener (not metrics scrapes
 * or the health port), unless --no-access-log. Bytes are the response
 * bytes written or still queued; method and path are the metric labels
 * (bounded, so a client cannot fill the log with its own strings).
 */
static void
conn_access_log(struct conn *c)
{
	struct log_access a;

	if (fe->fe_cf->cf_no_access_log || c->c_kind != LISTENER_MAIN)
		return;
	a.la_method = c->c_method_label;
	a.la_path = c->c_path_label;
	a.la_status = c->c_status != 0 ? c->c_status : 500;
	a.la_worker = c->c_worker;
	a.la_latency_ms = (ev_time() - c->c_t0) * 1e3;
	a.la_bytes = c->c_sent + (c->c_out.ho_len - c->c_outoff);
	a.la_request_id = c->c_reqid;
	log_access(&a);
}

void
conn_request_abort(struct conn *c)
{
	c->c_keep_alive = false;
	conn_request_done(c);
}

void
conn_respond(struct conn *c, int status, const char *content_type,
    const char *body, size_t len, const char *request_id)
{
	struct http_out *o = conn_response(c, status);

	if (request_id != NULL)
		snprintf(c->c_reqid, sizeof(c->c_reqid), "%s", request_id);
	if (content_type != NULL)
		http_out_header(o, "content-type", content_type);
	http_out_headerf(o, "content-length", "%zu", len);
	if (request_id != NULL)
		http_out_header(o, "x-request-id", request_id);
	http_out_header(o, "connection",
	    conn_keep_alive(c) ? "keep-alive" : "close");
	http_out_end_head(o);
	http_out_append(o, body, len);
	conn_request_done(c);
}

void
conn_error(struct conn *c, int status, const char *code, const char *message,
    const char *request_id, int retry_after_secs)
{
	c->c_status = status;
	snprintf(c->c_error_code, sizeof(c->c_error_code), "%s",
	    code != NULL ? code : "");
	if (request_id != NULL)
		snprintf(c->c_reqid, sizeof(c->c_reqid), "%s", request_id);
	http_out_error(&c->c_out, status, code, message, request_id,
	    retry_after_secs, conn_keep_alive(c));
	conn_request_done(c);
}

struct http_out *
conn_response(struct conn *c, int status)
{
	c->c_status = status;
	http_out_status(&c->c_out, status);
	return &c->c_out;
}

void
conn_json(struct conn *c, int status, cJSON *j, const char *request_id)
{
	char *s = j != NULL ? cJSON_PrintUnformatted(j) : NULL;

	cJSON_Delete(j);
	if (s == NULL) {
		conn_error(c, 503, "out_of_memory", "Out of memory", request_id,
		    0);
		return;
	}
	conn_respond(c, status, "application/json", s, strlen(s), request_id);
	free(s);
}

void
conn_relay_head(struct conn *c, int status, const struct upstream_header *h,
    size_t n, bool keep_length, bool streaming, bool chunked,
    const char *request_id, const char *worker_url)
{
	c->c_status = status;
	if (request_id != NULL)
		snprintf(c->c_reqid, sizeof(c->c_reqid), "%s", request_id);
	if (worker_url != NULL)
		snprintf(c->c_worker, sizeof(c->c_worker), "%s", worker_url);
	hdr_response_head(&c->c_out, status, h, n, keep_length, streaming,
	    chunked, request_id, worker_url, conn_keep_alive(c));
}

void *
conn_alloc(struct conn *c, size_t n)
{
	return arena_alloc(&c->c_pool, n);
}

int
conn_on_end(struct conn *c, void (*fn)(void *), void *arg)
{
	return arena_cleanup_add(&c->c_pool, fn, arg);
}

void
conn_set_routes(const struct conn_routes *routes)
{
	conn_routes = routes;
}

void
conn_method_not_allowed(struct conn *c, const char *allow, const char *id)
{
	struct http_out *o;
	char *body;
	size_t len;

	if ((body = http_error_body(405, "method_not_allowed",
	         "Method not allowed")) == NULL) {
		conn_error(c, 503, "out_of_memory", "Out of memory", id, 0);
		return;
	}
	len = strlen(body);
	o = conn_response(c, 405);
	http_out_header(o, "X-SMG-Error-Code", "method_not_allowed");
	http_out_header(o, "Allow", allow);
	http_out_header(o, "Content-Type", "application/json");
	http_out_headerf(o, "Content-Length", "%zu", len);
	if (id != NULL)
		http_out_header(o, "x-request-id", id);
	http_out_header(o, "Connection",
	    conn_keep_alive(c) ? "keep-alive" : "close");
	http_out_end_head(o);
	http_out_append(o, body, len);
	free(body);
	conn_request_done(c);
}
