/*
 * upstream_test.c: the upstream client against a small scripted HTTP/1.1
 * server (plain or TLS) running on the same libev loop over loopback.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <ev.h>

#include "shared/log.h"
#include "shared/tls.h"
#include "shared/upstream.h"

#ifndef container_of
#define container_of(ptr, type, member)                                        \
	((type *)(void *)((char *)(ptr)-offsetof(type, member)))
#endif

#define T_BIG_LEN    (256 * 1024)
#define T_NCHUNKS    5
#define T_MAX_STREAM 200

enum srv_mode {
	SRV_CL = 0, /* Content-Length response, keep-alive */
	SRV_CLOSE_AFTER, /* same, then the server closes */
	SRV_DROP_SECOND, /* answers the first request, drops the second */
	SRV_DROP_LATER, /* answers the server's first request only */
	SRV_CHUNKED_SLOW, /* T_NCHUNKS chunks, 30 ms apart */
	SRV_STREAM, /* chunks every 20 ms until the client leaves */
	SRV_SILENT, /* never answers */
	SRV_EOF_BODY, /* no length: body ends at EOF */
	SRV_INTERIM, /* 100 Continue, then 201 */
	SRV_BIG, /* T_BIG_LEN body at once */
	SRV_GARBAGE, /* not HTTP */
	SRV_TRUNCATED, /* Content-Length 100, 10 bytes, close */
	SRV_SINK, /* reads and drops everything, never answers */
};

struct tconn {
	struct tconn *tc_next;
	int tc_fd;
	struct tls_conn *tc_tls;
	ev_io tc_rio;
	ev_io tc_wio;
	ev_timer tc_timer;
	char tc_in[8192];
	size_t tc_inlen;
	char *tc_out;
	size_t tc_outlen;
	size_t tc_outoff;
	bool tc_close_after; /* close once the output is flushed */
	int tc_nreq;
	int tc_chunks;
};

struct tsrv {
	int ts_lfd;
	int ts_port;
	ev_io ts_accept;
	enum srv_mode ts_mode;
	struct tls_ctx *ts_tls;
	int ts_accepts;
	int ts_peer_closed; /* connections the client closed */
	int ts_srv_closed; /* connections the server closed */
	int ts_chunks_sent;
	int ts_nreq;
	char ts_last_req[4096];
	struct tconn *ts_conns;
};

struct tres {
	int tr_status;
	int tr_nhead;
	bool tr_has_xtest;
	char *tr_body;
	size_t tr_body_len;
	int tr_pieces;
	int tr_chunks_at_first_body;
	bool tr_done;
	enum upstream_error tr_err;
	struct upstream_req *tr_req;
	int tr_cancel_after; /* cancel inside the n-th on_body (0: never) */
	bool tr_pause_first; /* pause inside the first on_body */
	int tr_writable; /* on_writable calls */
};

static struct ev_loop *loop;
static struct tsrv srv;
static struct tres res;
static bool guard_fired;
static char cert_dir[64];

static void guard_cb(struct ev_loop *l, ev_timer *w, int revents);
static void srv_start(enum srv_mode mode, bool tls);
static void srv_stop(void);
static void srv_accept_cb(struct ev_loop *l, ev_io *w, int revents);
static void tconn_close(struct tconn *tc, bool by_server);
static void tconn_read_cb(struct ev_loop *l, ev_io *w, int revents);
static void tconn_write_cb(struct ev_loop *l, ev_io *w, int revents);
static void tconn_timer_cb(struct ev_loop *l, ev_timer *w, int revents);
static void tconn_send(struct tconn *tc, const char *data, size_t len);
static void tconn_flush(struct tconn *tc);
static void tconn_request(struct tconn *tc);
static void on_head(void *arg, int status,
    const struct upstream_header *headers, size_t nheaders);
static void on_body(void *arg, const char *data, size_t len);
static void on_done(void *arg, enum upstream_error err);
static struct upstream *up_new(double request_timeout, const char *ca);
static struct upstream_req *start(struct upstream *up, const char *scheme,
    const char *method, const char *body);
static void res_reset(void);
static double now(void);

#define RUN_UNTIL(cond, secs)                                                  \
	do {                                                                   \
		ev_timer g_;                                                   \
		ev_timer_init(&g_, guard_cb, (secs), 0.);                      \
		ev_timer_start(loop, &g_);                                     \
		guard_fired = false;                                           \
		while (!(cond) && !guard_fired)                                \
			ev_run(loop, EVRUN_ONCE);                              \
		ev_timer_stop(loop, &g_);                                      \
	} while (0)

static void
guard_cb(struct ev_loop *l, ev_timer *w, int revents)
{
	(void)l;
	(void)w;
	(void)revents;
	guard_fired = true;
}

static double
now(void)
{
	ev_now_update(loop);
	return ev_now(loop);
}

static void
srv_start(enum srv_mode mode, bool tls)
{
	struct sockaddr_in sin;
	socklen_t len = sizeof(sin);
	char cert[128], key[128];
	int one = 1;

	memset(&srv, 0, sizeof(srv));
	srv.ts_mode = mode;
	if (tls) {
		snprintf(cert, sizeof(cert), "%s/srv.crt", cert_dir);
		snprintf(key, sizeof(key), "%s/srv.key", cert_dir);
		assert_non_null(srv.ts_tls = tls_ctx_new_server(cert, key));
	}
	srv.ts_lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	assert_int_not_equal(srv.ts_lfd, -1);
	setsockopt(srv.ts_lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(srv.ts_lfd, (struct sockaddr *)&sin, sizeof(sin)),
	    0);
	assert_int_equal(listen(srv.ts_lfd, 16), 0);
	assert_int_equal(getsockname(srv.ts_lfd, (struct sockaddr *)&sin, &len),
	    0);
	srv.ts_port = ntohs(sin.sin_port);
	ev_io_init(&srv.ts_accept, srv_accept_cb, srv.ts_lfd, EV_READ);
	ev_io_start(loop, &srv.ts_accept);
}

static void
srv_stop(void)
{
	while (srv.ts_conns != NULL)
		tconn_close(srv.ts_conns, true);
	ev_io_stop(loop, &srv.ts_accept);
	close(srv.ts_lfd);
	tls_ctx_free(srv.ts_tls);
	srv.ts_tls = NULL;
}

static void
srv_accept_cb(struct ev_loop *l, ev_io *w, int revents)
{
	struct tconn *tc;
	int fd;

	(void)w;
	(void)revents;
	if ((fd = accept(srv.ts_lfd, NULL, NULL)) == -1)
		return;
	assert_int_not_equal(fcntl(fd, F_SETFL, O_NONBLOCK), -1);
	srv.ts_accepts++;
	tc = calloc(1, sizeof(*tc));
	assert_non_null(tc);
	tc->tc_fd = fd;
	if (srv.ts_tls != NULL)
		assert_non_null(
		    tc->tc_tls = tls_conn_new_server(srv.ts_tls, fd));
	tc->tc_next = srv.ts_conns;
	srv.ts_conns = tc;
	ev_io_init(&tc->tc_rio, tconn_read_cb, fd, EV_READ);
	ev_io_init(&tc->tc_wio, tconn_write_cb, fd, EV_WRITE);
	ev_timer_init(&tc->tc_timer, tconn_timer_cb, 0., 0.);
	ev_io_start(l, &tc->tc_rio);
}

static void
tconn_close(struct tconn *tc, bool by_server)
{
	struct tconn **pp;

	for (pp = &srv.ts_conns; *pp != tc; pp = &(*pp)->tc_next)
		;
	*pp = tc->tc_next;
	if (by_server)
		srv.ts_srv_closed++;
	else
		srv.ts_peer_closed++;
	ev_io_stop(loop, &tc->tc_rio);
	ev_io_stop(loop, &tc->tc_wio);
	ev_timer_stop(loop, &tc->tc_timer);
	tls_conn_free(tc->tc_tls);
	close(tc->tc_fd);
	free(tc->tc_out);
	free(tc);
}

static void
tconn_read_cb(struct ev_loop *l, ev_io *w, int revents)
{
	struct tconn *tc = container_of(w, struct tconn, tc_rio);
	const char *eoh, *cl;
	size_t need;
	ssize_t n;

	(void)l;
	(void)revents;
	do {
		if (tc->tc_inlen == sizeof(tc->tc_in) - 1)
			fail_msg("request too large for the test server");
		if (tc->tc_tls != NULL) {
			n = tls_conn_read(tc->tc_tls, tc->tc_in + tc->tc_inlen,
			    sizeof(tc->tc_in) - 1 - tc->tc_inlen);
			if (n == TLS_WANT_READ || n == TLS_WANT_WRITE)
				return;
			if (n < 0)
				n = 0;
		} else {
			n = read(tc->tc_fd, tc->tc_in + tc->tc_inlen,
			    sizeof(tc->tc_in) - 1 - tc->tc_inlen);
			if (n == -1 && errno == EAGAIN)
				return;
		}
		if (n <= 0) {
			tconn_close(tc, false);
			return;
		}
		tc->tc_inlen += (size_t)n;
		tc->tc_in[tc->tc_inlen] = '\0';
		if (srv.ts_mode == SRV_SINK) {
			tc->tc_inlen = 0;
			continue;
		}
		if ((eoh = strstr(tc->tc_in, "\r\n\r\n")) == NULL)
			continue;
		need = (size_t)(eoh + 4 - tc->tc_in);
		if ((cl = strstr(tc->tc_in, "Content-Length: ")) != NULL &&
		    cl < eoh)
			need += strtoul(cl + 16, NULL, 10);
		if (tc->tc_inlen < need)
			continue;
		memcpy(srv.ts_last_req, tc->tc_in, need);
		srv.ts_last_req[need] = '\0';
		tc->tc_inlen = 0;
		tconn_request(tc);
		return;
	} while (tc->tc_tls != NULL && tls_conn_pending(tc->tc_tls) > 0);
}

static void
tconn_request(struct tconn *tc)
{
	static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n"
	                         "X-Test: yes\r\n\r\nhello";
	static char big[T_BIG_LEN];
	char head[128];

	tc->tc_nreq++;
	switch (srv.ts_mode) {
	case SRV_CL:
		tconn_send(tc, ok, sizeof(ok) - 1);
		break;
	case SRV_CLOSE_AFTER:
		tc->tc_close_after = true;
		tconn_send(tc, ok, sizeof(ok) - 1);
		break;
	case SRV_DROP_SECOND:
		if (tc->tc_nreq == 1)
			tconn_send(tc, ok, sizeof(ok) - 1);
		else
			tconn_close(tc, true);
		break;
	case SRV_DROP_LATER:
		if (++srv.ts_nreq == 1)
			tconn_send(tc, ok, sizeof(ok) - 1);
		else
			tconn_close(tc, true);
		break;
	case SRV_CHUNKED_SLOW:
	case SRV_STREAM:
		tconn_send(tc,
		    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
		    "Content-Type: text/event-stream\r\n\r\n",
		    strlen("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
		           "Content-Type: text/event-stream\r\n\r\n"));
		ev_timer_set(&tc->tc_timer, 0.02,
		    srv.ts_mode == SRV_STREAM ? 0.02 : 0.03);
		ev_timer_start(loop, &tc->tc_timer);
		break;
	case SRV_SILENT:
	case SRV_SINK:
		break;
	case SRV_EOF_BODY:
		tc->tc_close_after = true;
		tconn_send(tc, "HTTP/1.1 200 OK\r\n\r\nuntil-eof",
		    strlen("HTTP/1.1 200 OK\r\n\r\nuntil-eof"));
		break;
	case SRV_INTERIM:
		tconn_send(tc,
		    "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\n"
		    "Content-Length: 2\r\n\r\nok",
		    strlen(
		        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\n"
		        "Content-Length: 2\r\n\r\nok"));
		break;
	case SRV_BIG:
		memset(big, 'b', sizeof(big));
		snprintf(head, sizeof(head),
		    "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", T_BIG_LEN);
		tconn_send(tc, head, strlen(head));
		tconn_send(tc, big, sizeof(big));
		break;
	case SRV_GARBAGE:
		tconn_send(tc, "garbage\r\n\r\n", 11);
		break;
	case SRV_TRUNCATED:
		tc->tc_close_after = true;
		tconn_send(tc,
		    "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789",
		    strlen("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"
		           "0123456789"));
		break;
	}
}

static void
tconn_timer_cb(struct ev_loop *l, ev_timer *w, int revents)
{
	struct tconn *tc = container_of(w, struct tconn, tc_timer);
	char chunk[32];

	(void)revents;
	if (srv.ts_mode == SRV_CHUNKED_SLOW && tc->tc_chunks == T_NCHUNKS) {
		ev_timer_stop(l, w);
		tconn_send(tc, "0\r\n\r\n", 5);
		return;
	}
	if (srv.ts_mode == SRV_STREAM && tc->tc_chunks == T_MAX_STREAM) {
		ev_timer_stop(l, w);
		return;
	}
	snprintf(chunk, sizeof(chunk), "2\r\nc%d\r\n", tc->tc_chunks % 10);
	tc->tc_chunks++;
	srv.ts_chunks_sent++;
	tconn_send(tc, chunk, strlen(chunk));
}

static void
tconn_send(struct tconn *tc, const char *data, size_t len)
{
	tc->tc_out = realloc(tc->tc_out, tc->tc_outlen + len);
	assert_non_null(tc->tc_out);
	memcpy(tc->tc_out + tc->tc_outlen, data, len);
	tc->tc_outlen += len;
	tconn_flush(tc);
}

static void
tconn_flush(struct tconn *tc)
{
	ssize_t n;

	while (tc->tc_outoff < tc->tc_outlen) {
		if (tc->tc_tls != NULL) {
			n = tls_conn_write(tc->tc_tls,
			    tc->tc_out + tc->tc_outoff,
			    tc->tc_outlen - tc->tc_outoff);
			if (n == TLS_WANT_WRITE || n == TLS_WANT_READ) {
				ev_io_start(loop, &tc->tc_wio);
				return;
			}
		} else {
			n = send(tc->tc_fd, tc->tc_out + tc->tc_outoff,
			    tc->tc_outlen - tc->tc_outoff, MSG_NOSIGNAL);
			if (n == -1 && errno == EAGAIN) {
				ev_io_start(loop, &tc->tc_wio);
				return;
			}
		}
		if (n <= 0) {
			tconn_close(tc, false);
			return;
		}
		tc->tc_outoff += (size_t)n;
	}
	ev_io_stop(loop, &tc->tc_wio);
	tc->tc_outoff = tc->tc_outlen = 0;
	if (tc->tc_close_after)
		tconn_close(tc, true);
}

static void
tconn_write_cb(struct ev_loop *l, ev_io *w, int revents)
{
	(void)l;
	(void)revents;
	tconn_flush(container_of(w, struct tconn, tc_wio));
}

static void
on_head(void *arg, int status, const struct upstream_header *headers,
    size_t nheaders)
{
	size_t i;

	assert_ptr_equal(arg, &res);
	res.tr_status = status;
	res.tr_nhead++;
	for (i = 0; i < nheaders; i++) {
		if (headers[i].uh_name_len == 6 &&
		    memcmp(headers[i].uh_name, "x-test", 6) == 0 &&
		    headers[i].uh_value_len == 3 &&
		    memcmp(headers[i].uh_value, "yes", 3) == 0)
			res.tr_has_xtest = true;
	}
}

static void
on_body(void *arg, const char *data, size_t len)
{
	assert_ptr_equal(arg, &res);
	assert_false(res.tr_done);
	if (res.tr_pieces == 0)
		res.tr_chunks_at_first_body = srv.ts_chunks_sent;
	res.tr_pieces++;
	assert_true(res.tr_body_len + len <= T_BIG_LEN);
	memcpy(res.tr_body + res.tr_body_len, data, len);
	res.tr_body_len += len;
	if (res.tr_pause_first && res.tr_pieces == 1)
		upstream_pause(res.tr_req);
	if (res.tr_cancel_after == res.tr_pieces)
		upstream_cancel(res.tr_req);
}

static void
on_done(void *arg, enum upstream_error err)
{
	assert_ptr_equal(arg, &res);
	assert_false(res.tr_done);
	res.tr_done = true;
	res.tr_err = err;
}

static void
res_reset(void)
{
	char *body = res.tr_body;

	memset(&res, 0, sizeof(res));
	res.tr_body = body;
	res.tr_err = -1;
}

static struct upstream *
up_new(double request_timeout, const char *ca)
{
	struct upstream_config cfg;
	char ca_path[128];

	memset(&cfg, 0, sizeof(cfg));
	cfg.uc_idle_timeout_secs = 30;
	cfg.uc_connect_timeout_secs = 2;
	cfg.uc_request_timeout_secs = request_timeout;
	cfg.uc_max_idle_per_worker = 4;
	if (ca != NULL) {
		snprintf(ca_path, sizeof(ca_path), "%s/%s", cert_dir, ca);
		cfg.uc_ca_paths[0] = ca_path;
	}
	return upstream_new(loop, &cfg);
}

static struct upstream_req *
start(struct upstream *up, const char *scheme, const char *method,
    const char *body)
{
	static const struct upstream_cbs cbs = { .on_head = on_head,
		.on_body = on_body,
		.on_done = on_done };
	static const struct upstream_header hdrs[] = {
		{ "x-request-id", 12, "abc", 3 },
		{ "content-length", 14, "999", 3 }, /* replaced */
	};
	char url[128];

	res_reset();
	snprintf(url, sizeof(url), "%s://%s:%d", scheme,
	    strcmp(scheme, "https") == 0 ? "localhost" : "127.0.0.1",
	    srv.ts_port);
	res.tr_req = upstream_request(up, url, method, "/v1/test", hdrs, 2,
	    body, body != NULL ? strlen(body) : 0, &cbs, &res);
	assert_non_null(res.tr_req);
	return res.tr_req;
}

static int
group_setup(void **state)
{
	char cmd[2048];

	(void)state;
	log_init("upstream_test", LOG_LEVEL_INFO);
	res.tr_body = malloc(T_BIG_LEN);
	snprintf(cert_dir, sizeof(cert_dir), "/tmp/upstream_test.XXXXXX");
	if (res.tr_body == NULL || mkdtemp(cert_dir) == NULL)
		return -1;
	snprintf(cmd, sizeof(cmd),
	    "cd %s && "
	    "openssl req -x509 -newkey ec -pkeyopt "
	    "ec_paramgen_curve:prime256v1 "
	    "-nodes -keyout ca.key -out ca.crt -subj /CN=smg-test-ca -days 2 "
	    "2>/dev/null && "
	    "openssl req -x509 -newkey ec -pkeyopt "
	    "ec_paramgen_curve:prime256v1 "
	    "-nodes -keyout other.key -out other.crt -subj /CN=smg-other "
	    "-days 2 2>/dev/null && "
	    "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
	    "-nodes -keyout srv.key -out srv.csr -subj /CN=localhost "
	    "2>/dev/null && "
	    "printf 'subjectAltName=DNS:localhost\\n' > ext.cnf && "
	    "openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key "
	    "-set_serial 2 -days 2 -extfile ext.cnf -out srv.crt 2>/dev/null",
	    cert_dir);
	return system(cmd) == 0 ? 0 : -1;
}

static int
group_teardown(void **state)
{
	char cmd[128];

	(void)state;
	free(res.tr_body);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", cert_dir);
	return system(cmd) == 0 ? 0 : -1;
}

static int
setup(void **state)
{
	(void)state;
	loop = ev_loop_new(EVFLAG_AUTO);
	return loop != NULL ? 0 : -1;
}

static int
teardown(void **state)
{
	(void)state;
	ev_loop_destroy(loop);
	loop = NULL;
	return 0;
}

static void
test_content_length(void **state)
{
	struct upstream *up;

	(void)state;
	srv_start(SRV_CL, false);
	assert_non_null(up = up_new(5, NULL));
	start(up, "http", "POST", "{\"a\":1}");
	/* Nothing runs from inside upstream_request. */
	assert_false(res.tr_done);
	RUN_UNTIL(res.tr_done, 5);
	assert_true(res.tr_done);
	assert_int_equal(res.tr_err, UPSTREAM_OK);
	assert_int_equal(res.tr_status, 200);
	assert_int_equal(res.tr_nhead, 1);
	assert_true(res.tr_has_xtest);
	assert_int_equal(res.tr_body_len, 5);
	assert_memory_equal(res.tr_body, "hello", 5);
	assert_non_null(strstr(srv.ts_last_req, "POST /v1/test HTTP/1.1\r\n"));
	assert_non_null(strstr(srv.ts_last_req, "Host: 127.0.0.1:"));
	assert_non_null(strstr(srv.ts_last_req, "x-request-id: abc\r\n"));
	assert_non_null(strstr(srv.ts_last_req, "Content-Length: 7\r\n"));
	assert_null(strstr(srv.ts_last_req, "999"));
	assert_non_null(strstr(srv.ts_last_req, "Connection: keep-alive\r\n"));
	assert_non_null(strstr(srv.ts_last_req, "\r\n\r\n{\"a\":1}"));
	assert_int_equal(upstream_idle_connections(up), 1);
	upstream_free(up);
	srv_stop();
}

static void
test_chunked_pieces(void **state)
{
	struct upstream *up;

	(void)state;
	srv_start(SRV_CHUNKED_SLOW, false);
	assert_non_null(up = up_new(5, NULL));
	start(up, "http", "GET", NULL);
	RUN_UNTIL(res.tr_done, 5);
	assert_int_equal(res.tr_err, UPSTREAM_OK);
	assert_int_equal(res.tr_status, 200);
	/* One piece per chunk as it arrived, de-chunked. */
	assert_int_equal(res.tr_pieces, T_NCHUNKS);
	assert_true(res.tr_chunks_at_first_body < T_NCHUNKS);
	assert_int_equal(res.tr_body_len, 2 * T_NCHUNKS);
	assert_memory_equal(res.tr_body, "c0c1c2c3c4", 10);
	assert_null(strstr(srv.ts_last_req, "Content-Length"));
	assert_int_equal(upstream_idle_connections(up), 1);
	upstream_free(up);
	srv_stop();
}

static void
test_keepalive_reuse(void **state)
{
	struct upstream *up;
	int i;

	(void)state;
	srv_start(SRV_CL, false);
	assert_non_null(up = up_new(5, NULL));
	for (i = 0; i < 3; i++) {
		start(up, "http", "GET", NULL);
		RUN_UNTIL(res.tr_done, 5);
		assert_int_equal(res.tr_err, UPSTREAM_OK);
		assert_int_equal(res.tr_body_len, 5);
	}
	assert_int_equal(srv.ts_accepts, 1);
	assert_int_equal(upstream_idle_connections(up), 1);
	assert_int_equal(upstream_send_retries(up), 0);
	upstream_free(up);
	/* Freeing closes the pooled connection. */
	RUN_UNTIL(srv.ts_peer_closed == 1, 2);
	assert_int_equal(srv.ts_peer_closed, 1);
	srv_stop();
}

static void
test_idle_closed_by_server(void **state)
{
	struct upstream *up;

	(void)state;
	srv_start(SRV_CLOSE_AFTER, false);
	assert_non_null(up = up_new(5, NULL));
	start(up, "http", "GET", NULL);
	RUN_UNTIL(res.tr_done, 5);
	assert_int_equal(res.tr_err, UPSTREAM_OK);
	/* The pooled connection sees EOF while idle and is dropped. */
	RUN_UNTIL(upstream_idle_connections(up) == 0, 2);
	assert_int_equal(upstream_idle_connections(up), 0);
	start(up, "http", "GET", NULL);
	RUN_UNTIL(res.tr_done, 5);
	assert_int_equal(res.tr_err, UPSTREAM_OK);
	assert_int_equal(res.tr_body_len, 5);
	assert_int_equal(srv.ts_accepts, 2);

	/* Closed just before reuse: the request is re-sent once on a new
	 * connection. */
	RUN_UNTIL(srv.ts_srv_closed == 2, 2);
	start(up, "http", "GET", NULL);
	RUN_UNTIL(res.tr_done, 5);
	assert_int_equal(res.tr_err, UPSTREAM_OK);
	assert_int_equal(srv.ts_accepts, 3);
	upstream_free(up);
	srv_stop();
}

static void
test_resend_on_reused(void **state)
{
	struct upstream *up;

	(void)state;
	srv_start(SRV_DROP_SECOND, false);
	assert_non_null(up = up_new(5, NULL));
	start(up, "http", "POST", "x");
	RUN_UNTIL(res.tr_done, 5);
	assert_int_equal(res.tr_err, UPSTREAM_OK);
	/* The server drops the reused connection after reading the request:
	 * the request goes out again on a new connection. */
	start(up, "http", "POST", "y");
	RUN_UNTIL(res.tr_done, 5);
	assert_int_equal(res.tr_err, UPSTREAM_OK);
	assert_int_equal(res.tr_status, 200);
	assert_int_equal(upstream_send_retries(up), 1);
	assert_int_equal(srv.ts_accepts, 2);
	assert_non_null(strstr(srv.ts_last_req, "\r\n\r\ny"));
	upstream_free(up);
	srv_stop();
}

static void
test_connect_refused(void **state)
{
	struct upstream *up;
	double t0;

	(void)state;
	srv_start(SRV_CL, false);
	/* A port nobody listens on. */
	ev_io_stop(loop, &srv.ts_accept);
	close(srv.ts_lfd);
	srv.ts_lfd = socket(AF_INET, SOCK_STREAM, 0);
	assert_non_null(up = up_new(5, NULL));
	t0 = now();
	start(up, "http", "GET", NULL);
	RUN_UNTIL(res.tr_done, 5);
	assert_int_equal(res.tr_err, UPSTREAM_CONNECT_FAILED);
	assert_true(now() - t0 < 1.0);
	assert_int_equal(res.tr_nhead, 0);
	upstream_free(up);
	srv_stop();
}

static void
test_timeout(void **state)
{
	struct upstream *up;
	double t0, dt;

	(void)state;
	srv_start(SRV_SILENT, false);
	assert_non_null(up = up_new(0.3, NULL));
	t0 = now();
	start(up, "http", "GET", NULL);
	RUN_UNTIL(res.tr_done, 5);
	dt = now() - t0;
	assert_int_equal(res.tr_err, UPSTREAM_TIMEOUT);
	assert_true(dt >= 0.25 && dt < 2.0);
	assert_int_equal(upstream_idle_connections(up), 0);
	RUN_UNTIL(srv.ts_peer_closed == 1, 2);
	assert_int_equal(srv.ts_peer_closed, 1);
	upstream_free(up);
	srv_stop();
}

static void
test_cancel_midstream(void **state)
{
	struct upstream *up;

	(void)state;
	srv_start(SRV_STREAM, false);
	assert_non_null(up = up_new(5, NULL));
	start(up, "http", "POST", "{}");
	res.tr_cancel_after = 3;
	RUN_UNTIL(srv.ts_peer_closed == 1, 5);
	/* The worker saw the disconnect; no callback after the cancel. */
	assert_int_equal(srv.ts_peer_closed, 1);
	assert_int_equal(res.tr_pieces, 3);
	assert_false(res.tr_done);
	assert_int_equal(upstream_idle_connections(up), 0);

	/* Cancel from outside a callback, while the stream runs. */
	start(up, "http", "POST", "{}");
	RUN_UNTIL(res.tr_pieces >= 1, 5);
	upstream_cancel(res.tr_req);
	RUN_UNTIL(srv.ts_peer_closed == 2, 5);
	assert_int_equal(srv.ts_peer_closed, 2);
	assert_false(res.tr_done);
	upstream_free(up);
	srv_stop();
}

static void
test_pause_resume(void **state)
{
	struct upstream *up;
	int pieces;

	(void)state;
	srv_start(SRV_BIG, false);
	assert_non_null(up = up_new(5, NULL));
	start(up, "http", "GET", NULL);
	res.tr_pause_first = true;
	RUN_UNTIL(res.tr_pieces == 1, 5);
	pieces = res.tr_pieces;
	/* Paused: the loop runs, nothing more is delivered. */
	RUN_UNTIL(res.tr_done, 0.2);
	assert_int_equal(res.tr_pieces, pieces);
	assert_false(res.tr_done);
	upstream_resume(res.tr_req);
	RUN_UNTIL(res.tr_done, 5);
	assert_int_equal(res.tr_err, UPSTREAM_OK);
	assert_int_equal(res.tr_body_len, T_BIG_LEN);
	assert_true(res.tr_body[T_BIG_LEN - 1] == 'b');
	assert_int_equal(upstream_idle_connections(up), 1);
	upstream_free(up);
	srv_stop();
}

static void
test_response_shapes(void **state)
{
	struct upstream *up;

	(void)state;
	assert_non_null(up = up_new(5, NULL));

	srv_start(SRV_EOF_BODY, false);
	start(up, "http", "GET", NULL);
	RUN_UNTIL(res.tr_done, 5);
	assert_int_equal(res.tr_err, UPSTREAM_OK);
	assert_int_equal(res.tr_body_len, 9);
	assert_memory_equal(res.tr_body, "until-eof", 9);
	assert_int_equal(upstream_idle_connections(up), 0);
	srv_stop();

	srv_start(SRV_INTERIM, false);
	start(up, "http", "POST", "{}");
	RUN_UNTIL(res.tr_done, 5);
	assert_int_equal(res.tr_err, UPSTREAM_OK);
	assert_int_equal(res.tr_nhead, 1);
	assert_int_equal(res.tr_status, 201);
	assert_memory_equal(res.tr_body, "ok", 2);
	srv_stop();

	srv_start(SRV_GARBAGE, false);
	start(up, "http", "GET", NULL);
	RUN_UNTIL(res.tr_done, 5);
	assert_int_equal(res.tr_err, UPSTREAM_PROTOCOL);
	srv_stop();

	srv_start(SRV_TRUNCATED, false);
	start(up, "http", "GET", NULL);
	RUN_UNTIL(res.tr_done, 5);
	assert_int_equal(res.tr_err, UPSTREAM_RESET_MIDSTREAM);
	assert_int_equal(res.tr_status, 200);
	assert_int_equal(res.tr_body_len, 10);
	srv_stop();

	/* Dropped on a reused connection, then on the new one: a send
	 * failure after one internal re-send. */
	srv_start(SRV_DROP_LATER, false);
	start(up, "http", "GET", NULL);
	RUN_UNTIL(res.tr_done, 5);
	assert_int_equal(res.tr_err, UPSTREAM_OK);
	start(up, "http", "GET", NULL);
	RUN_UNTIL(res.tr_done, 5);
	assert_int_equal(res.tr_err, UPSTREAM_SEND_FAILED);
	assert_int_equal(srv.ts_accepts, 2);
	assert_int_equal(upstream_send_retries(up), 1);
	assert_int_equal(res.tr_nhead, 0);
	/* Dropped on a new connection: reported at once, no re-send. */
	start(up, "http", "GET", NULL);
	RUN_UNTIL(res.tr_done, 5);
	assert_int_equal(res.tr_err, UPSTREAM_SEND_FAILED);
	assert_int_equal(srv.ts_accepts, 3);
	assert_int_equal(upstream_send_retries(up), 1);
	srv_stop();
	upstream_free(up);
}

static void
test_bad_input(void **state)
{
	static const struct upstream_cbs cbs = { .on_head = on_head,
		.on_body = on_body,
		.on_done = on_done };
	struct upstream_header bad = { "x-a", 3, "v\r\nx-b: 1", 9 };
	struct upstream *up;

	(void)state;
	assert_non_null(up = up_new(5, NULL));
	res_reset();
	assert_null(upstream_request(up, "ftp://h:1", "GET", "/", NULL, 0, NULL,
	    0, &cbs, &res));
	assert_null(upstream_request(up, "http://", "GET", "/", NULL, 0, NULL,
	    0, &cbs, &res));
	assert_null(upstream_request(up, "http://u:p@h:1", "GET", "/", NULL, 0,
	    NULL, 0, &cbs, &res));
	assert_null(upstream_request(up, "http://h:1", "GET", "/a b", NULL, 0,
	    NULL, 0, &cbs, &res));
	assert_null(upstream_request(up, "http://h:1", "G T", "/", NULL, 0,
	    NULL, 0, &cbs, &res));
	assert_null(upstream_request(up, "http://h:1", "GET", "/", &bad, 1,
	    NULL, 0, &cbs, &res));
	/* An unresolvable name fails from the loop, not in the call. */
	assert_non_null(
	    res.tr_req = upstream_request(up, "http://no-such-host.invalid:80",
	        "GET", "/", NULL, 0, NULL, 0, &cbs, &res));
	assert_false(res.tr_done);
	RUN_UNTIL(res.tr_done, 5);
	assert_int_equal(res.tr_err, UPSTREAM_CONNECT_FAILED);
	upstream_free(up);

	/* A CA file that cannot be loaded fails at startup. */
	assert_null(up_new(5, "missing.crt"));
}

static void
on_writable(void *arg)
{
	assert_ptr_equal(arg, &res);
	res.tr_writable++;
}

/* A streamed upload: head first, then the body as the caller gets it. */
static void
stream_upload(const char *scheme)
{
	static const struct upstream_cbs cbs = { .on_head = on_head,
		.on_body = on_body,
		.on_done = on_done,
		.on_writable = on_writable };
	static char big[UPSTREAM_BODY_HIGH + 1000];
	struct upstream *up;
	char url[128];
	ssize_t n;
	int i;

	srv_start(SRV_CL, strcmp(scheme, "https") == 0);
	assert_non_null(up = up_new(5, "ca.crt"));
	snprintf(url, sizeof(url), "%s://%s:%d", scheme,
	    strcmp(scheme, "https") == 0 ? "localhost" : "127.0.0.1",
	    srv.ts_port);
	for (i = 0; i < 2; i++) {
		res_reset();
		res.tr_req = upstream_request_stream(up, url, "POST",
		    "/v1/test", NULL, 0, 12, &cbs, &res);
		assert_non_null(res.tr_req);
		assert_true(upstream_body_write(res.tr_req, "hello ", 6) >= 0);
		/* The worker waits for the rest of the declared body. */
		RUN_UNTIL(res.tr_done, 0.2);
		assert_false(res.tr_done);
		assert_int_equal(upstream_body_write(res.tr_req, "world!!", 7),
		    -1);
		assert_true(upstream_body_write(res.tr_req, "world!", 6) >= 0);
		RUN_UNTIL(res.tr_done, 5);
		assert_int_equal(res.tr_err, UPSTREAM_OK);
		assert_int_equal(res.tr_status, 200);
		assert_memory_equal(res.tr_body, "hello", 5);
		assert_non_null(
		    strstr(srv.ts_last_req, "Content-Length: 12\r\n"));
		assert_non_null(
		    strstr(srv.ts_last_req, "\r\n\r\nhello world!"));
	}
	/* Never on a pooled connection: the body cannot be sent twice. */
	assert_int_equal(srv.ts_accepts, 2);
	assert_int_equal(upstream_idle_connections(up), 2);

	/* Past the high mark, on_writable says when all of it is out; the
	 * server never answers and the request is cancelled. */
	srv.ts_mode = SRV_SINK;
	res_reset();
	res.tr_req = upstream_request_stream(up, url, "POST", "/v1/test", NULL,
	    0, sizeof(big) + 1, &cbs, &res);
	assert_non_null(res.tr_req);
	memset(big, 'x', sizeof(big));
	n = upstream_body_write(res.tr_req, big, sizeof(big));
	assert_true(n > UPSTREAM_BODY_HIGH);
	RUN_UNTIL(res.tr_writable > 0, 5);
	assert_int_equal(res.tr_writable, 1);
	assert_false(res.tr_done);
	upstream_cancel(res.tr_req);
	upstream_free(up);
	srv_stop();
}

static void
test_stream_upload(void **state)
{
	(void)state;
	stream_upload("http");
}

static void
test_stream_upload_https(void **state)
{
	(void)state;
	stream_upload("https");
}

static void
test_https(void **state)
{
	struct upstream *up;

	(void)state;
	srv_start(SRV_CL, true);
	assert_non_null(up = up_new(5, "ca.crt"));
	start(up, "https", "POST", "{\"tls\":true}");
	RUN_UNTIL(res.tr_done, 5);
	assert_int_equal(res.tr_err, UPSTREAM_OK);
	assert_int_equal(res.tr_status, 200);
	assert_memory_equal(res.tr_body, "hello", 5);
	assert_non_null(strstr(srv.ts_last_req, "Host: localhost:"));
	assert_non_null(strstr(srv.ts_last_req, "\r\n\r\n{\"tls\":true}"));
	start(up, "https", "GET", NULL);
	RUN_UNTIL(res.tr_done, 5);
	assert_int_equal(res.tr_err, UPSTREAM_OK);
	assert_int_equal(srv.ts_accepts, 1);
	upstream_free(up);

	/* A worker certificate from a CA we do not trust. */
	assert_non_null(up = up_new(5, "other.crt"));
	start(up, "https", "GET", NULL);
	RUN_UNTIL(res.tr_done, 5);
	assert_int_equal(res.tr_err, UPSTREAM_CONNECT_FAILED);
	assert_int_equal(res.tr_nhead, 0);
	upstream_free(up);
	srv_stop();
}

static void
test_https_stream_cancel(void **state)
{
	struct upstream *up;

	(void)state;
	srv_start(SRV_STREAM, true);
	assert_non_null(up = up_new(5, "ca.crt"));
	start(up, "https", "POST", "{}");
	res.tr_cancel_after = 4;
	RUN_UNTIL(srv.ts_peer_closed == 1, 5);
	assert_int_equal(srv.ts_peer_closed, 1);
	assert_int_equal(res.tr_pieces, 4);
	assert_memory_equal(res.tr_body, "c0c1c2c3", 8);
	assert_false(res.tr_done);
	upstream_free(up);
	srv_stop();
}

/* upstream_fetch: the whole response in one callback. */
struct fres {
	bool fr_done;
	enum upstream_error fr_err;
	char fr_reason[64];
	int fr_status;
	char fr_body[2048];
	size_t fr_len;
	bool fr_nul; /* the body came NUL-terminated */
	bool fr_truncated;
};

static struct fres fres;

static void
fetch_cb(void *arg, const struct upstream_result *r)
{
	(void)arg;
	fres.fr_done = true;
	fres.fr_err = r->ur_error;
	snprintf(fres.fr_reason, sizeof(fres.fr_reason), "%s", r->ur_reason);
	fres.fr_status = r->ur_status;
	fres.fr_len = r->ur_body_len;
	fres.fr_nul = r->ur_body[r->ur_body_len] == '\0';
	memcpy(fres.fr_body, r->ur_body,
	    r->ur_body_len < sizeof(fres.fr_body) ? r->ur_body_len
	                                          : sizeof(fres.fr_body));
	fres.fr_truncated = r->ur_truncated;
}

static void
never_cb(void *arg, const struct upstream_result *r)
{
	(void)arg;
	(void)r;
	fail_msg("fetch callback after cancel");
}

/* Runs one fetch to its end; returns how long it took. */
static double
fetch_run(struct upstream *up, const char *base, const char *path,
    double timeout, size_t body_max)
{
	static const struct upstream_header h[] = {
		{ "authorization", 13, "Bearer sekrit", 13 },
		{ "accept", 6, "application/json", 16 },
	};
	double t0;

	memset(&fres, 0, sizeof(fres));
	t0 = now();
	assert_non_null(upstream_fetch(up, base, path, h, 2, timeout, body_max,
	    fetch_cb, NULL));
	/* Never from inside the call, even for a bad URL. */
	assert_false(fres.fr_done);
	RUN_UNTIL(fres.fr_done, 5);
	assert_true(fres.fr_done);
	return now() - t0;
}

static void
test_fetch(void **state)
{
	struct upstream *up;
	char base[64];

	(void)state;
	srv_start(SRV_CL, false);
	snprintf(base, sizeof(base), "http://127.0.0.1:%d", srv.ts_port);
	assert_non_null(up = up_new(5, NULL));
	fetch_run(up, base, "/v1/loads?x=1", 2, 4096);
	assert_int_equal(fres.fr_err, UPSTREAM_OK);
	assert_string_equal(fres.fr_reason, "ok");
	assert_int_equal(fres.fr_status, 200);
	assert_int_equal(fres.fr_len, 5);
	assert_memory_equal(fres.fr_body, "hello", 5);
	assert_true(fres.fr_nul);
	assert_false(fres.fr_truncated);
	assert_non_null(
	    strstr(srv.ts_last_req, "GET /v1/loads?x=1 HTTP/1.1\r\n"));
	assert_non_null(
	    strstr(srv.ts_last_req, "authorization: Bearer sekrit\r\n"));
	assert_null(strstr(srv.ts_last_req, "Content-Length"));
	/* A cap the body just fits is no truncation. */
	fetch_run(up, base, "/", 2, 5);
	assert_int_equal(fres.fr_err, UPSTREAM_OK);
	assert_false(fres.fr_truncated);
	upstream_free(up);
	srv_stop();

	/* A body without length ends at EOF. */
	srv_start(SRV_EOF_BODY, false);
	snprintf(base, sizeof(base), "http://127.0.0.1:%d", srv.ts_port);
	assert_non_null(up = up_new(5, NULL));
	fetch_run(up, base, "/", 2, 4096);
	assert_int_equal(fres.fr_err, UPSTREAM_OK);
	assert_int_equal(fres.fr_len, 9);
	assert_memory_equal(fres.fr_body, "until-eof", 9);
	upstream_free(up);
	srv_stop();
}

static void
test_fetch_truncated(void **state)
{
	struct upstream *up;
	char base[64];

	(void)state;
	srv_start(SRV_BIG, false);
	snprintf(base, sizeof(base), "http://127.0.0.1:%d", srv.ts_port);
	assert_non_null(up = up_new(5, NULL));
	fetch_run(up, base, "/big", 2, 100);
	assert_int_equal(fres.fr_err, UPSTREAM_OK);
	assert_int_equal(fres.fr_status, 200);
	assert_true(fres.fr_truncated);
	assert_int_equal(fres.fr_len, 100);
	assert_true(fres.fr_nul);
	/* The rest is not read: the connection is dropped, not pooled. */
	assert_int_equal(upstream_idle_connections(up), 0);
	RUN_UNTIL(srv.ts_peer_closed == 1, 5);
	assert_int_equal(srv.ts_peer_closed, 1);
	upstream_free(up);
	srv_stop();
}

static void
test_fetch_failures(void **state)
{
	struct upstream *up;
	struct upstream_fetch *f;
	char base[64];
	double took;

	(void)state;
	srv_start(SRV_GARBAGE, false);
	snprintf(base, sizeof(base), "http://127.0.0.1:%d", srv.ts_port);
	assert_non_null(up = up_new(5, NULL));
	fetch_run(up, base, "/", 2, 4096);
	assert_int_equal(fres.fr_err, UPSTREAM_PROTOCOL);
	assert_string_equal(fres.fr_reason, "malformed response");
	assert_int_equal(fres.fr_status, 0);
	assert_int_equal(fres.fr_len, 0);
	srv_stop();

	/* The fetch's own deadline, shorter than the client's. */
	srv_start(SRV_SILENT, false);
	snprintf(base, sizeof(base), "http://127.0.0.1:%d", srv.ts_port);
	took = fetch_run(up, base, "/slow", 0.3, 4096);
	assert_int_equal(fres.fr_err, UPSTREAM_TIMEOUT);
	assert_string_equal(fres.fr_reason, "timeout");
	assert_true(took >= 0.25 && took < 2.0);
	srv_stop();

	/* Nothing listens there any more. */
	fetch_run(up, base, "/", 2, 4096);
	assert_int_equal(fres.fr_err, UPSTREAM_CONNECT_FAILED);
	assert_string_equal(fres.fr_reason, "connect failed");

	/* Requests that cannot start fail from the loop. */
	fetch_run(up, "ftp://127.0.0.1:1", "/x", 2, 4096);
	assert_int_equal(fres.fr_err, UPSTREAM_BAD_REQUEST);
	fetch_run(up, "not a url", "/", 2, 4096);
	assert_int_equal(fres.fr_err, UPSTREAM_BAD_REQUEST);
	fetch_run(up, "http://127.0.0.1:1", "no-slash", 2, 4096);
	assert_int_equal(fres.fr_err, UPSTREAM_BAD_REQUEST);
	assert_string_equal(fres.fr_reason, "bad url or request");

	/* Cancelled, pending or deferred: no callback, nothing leaks. */
	f = upstream_fetch(up, "not a url", "/", NULL, 0, 0.1, 10, never_cb,
	    NULL);
	upstream_fetch_cancel(f);
	srv_start(SRV_SILENT, false);
	snprintf(base, sizeof(base), "http://127.0.0.1:%d", srv.ts_port);
	f = upstream_fetch(up, base, "/", NULL, 0, 0.1, 10, never_cb, NULL);
	RUN_UNTIL(srv.ts_accepts == 1, 5);
	upstream_fetch_cancel(f);
	upstream_fetch_cancel(NULL);
	RUN_UNTIL(srv.ts_peer_closed == 1, 0.5);
	assert_int_equal(srv.ts_peer_closed, 1);
	upstream_free(up);
	srv_stop();
}

static void
test_fetch_https(void **state)
{
	struct upstream *up;
	char base[64];

	(void)state;
	srv_start(SRV_CL, true);
	snprintf(base, sizeof(base), "https://localhost:%d", srv.ts_port);
	assert_non_null(up = up_new(5, "ca.crt"));
	fetch_run(up, base, "/", 2, 4096);
	assert_int_equal(fres.fr_err, UPSTREAM_OK);
	assert_memory_equal(fres.fr_body, "hello", 5);
	upstream_free(up);

	/* The reason says what failed, beyond "connect failed". */
	assert_non_null(up = up_new(5, "other.crt"));
	fetch_run(up, base, "/", 2, 4096);
	assert_int_equal(fres.fr_err, UPSTREAM_CONNECT_FAILED);
	assert_string_equal(fres.fr_reason, "tls handshake failed");
	upstream_free(up);
	srv_stop();
}

static void
test_strerror(void **state)
{
	(void)state;
	assert_string_equal(upstream_strerror(UPSTREAM_OK), "ok");
	assert_string_equal(upstream_strerror(UPSTREAM_TIMEOUT), "timeout");
	assert_string_equal(upstream_strerror((enum upstream_error)99),
	    "unknown error");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_content_length, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_chunked_pieces, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_keepalive_reuse, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_idle_closed_by_server,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(test_resend_on_reused, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_connect_refused, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_timeout, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cancel_midstream, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_pause_resume, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_response_shapes, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_bad_input, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_stream_upload, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_stream_upload_https, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_https, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fetch, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fetch_truncated, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_fetch_failures, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_fetch_https, setup,
		    teardown),
		cmocka_unit_test(test_strerror),
		cmocka_unit_test_setup_teardown(test_https_stream_cancel, setup,
		    teardown),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
