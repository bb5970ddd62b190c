/*
 * sp_test.c: the SP REQ/REP transport: the wire codec, libnng as the peer
 * on either side, scripted peers that drop the connection in every state,
 * and malformed input on the server.
 */
#include <sys/socket.h>
#include <sys/un.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <ev.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#include "shared/log.h"
#include "shared/sp.h"
#include "shared/tls.h"

#define TEST_MAX   (1024 * 1024)
#define BIG_LEN    (8 * 1024 * 1024)
#define IO_TIMEOUT 5000
#define CLIENT_MAX (16 * 1024 * 1024)

struct fixture {
	char fx_dir[64];
	char fx_path[128];
	char fx_url[160];
	struct ev_loop *fx_loop;
};

struct rec {
	int r_calls;
	int r_status;
	char r_body[64];
	size_t r_len;
	int *r_counter;
};

/* ------------------------------------------------------------- helpers */

static void
tick_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
}

static int
run_until(struct ev_loop *loop, const int *count, int want, double secs)
{
	ev_tstamp end = ev_time() + secs;
	ev_timer tick;

	while (*count < want && ev_time() < end) {
		ev_timer_init(&tick, tick_cb, 0.01, 0);
		ev_timer_start(loop, &tick);
		ev_run(loop, EVRUN_ONCE);
		ev_timer_stop(loop, &tick);
	}
	return *count >= want;
}

static int
run_until_flag(struct ev_loop *loop, atomic_int *flag, double secs)
{
	ev_tstamp end = ev_time() + secs;
	ev_timer tick;

	while (!atomic_load(flag) && ev_time() < end) {
		ev_timer_init(&tick, tick_cb, 0.01, 0);
		ev_timer_start(loop, &tick);
		ev_run(loop, EVRUN_ONCE);
		ev_timer_stop(loop, &tick);
	}
	return atomic_load(flag);
}

static void
rec_cb(void *arg, int status, const uint8_t *reply, size_t len)
{
	struct rec *r = arg;
	size_t n;

	r->r_calls++;
	r->r_status = status;
	if (status == 0) {
		assert_non_null(reply);
		n = len < sizeof(r->r_body) - 1 ? len : sizeof(r->r_body) - 1;
		memcpy(r->r_body, reply, n);
		r->r_body[n] = '\0';
		r->r_len = len;
	} else
		assert_null(reply);
	if (r->r_counter != NULL)
		(*r->r_counter)++;
}

/* Echo server: ">" + body; "silent" gets no answer. */
static void
echo_cb(void *arg, const uint8_t *msg, size_t len, uint8_t **reply,
    size_t *reply_len)
{
	int *seen = arg;

	if (seen != NULL)
		(*seen)++;
	if (len == 6 && memcmp(msg, "silent", 6) == 0)
		return;
	*reply = malloc(len + 1);
	assert_non_null(*reply);
	(*reply)[0] = '>';
	if (len > 0)
		memcpy(*reply + 1, msg, len);
	*reply_len = len + 1;
}

static int
setup(void **state)
{
	struct fixture *fx = calloc(1, sizeof(*fx));

	assert_non_null(fx);
	snprintf(fx->fx_dir, sizeof(fx->fx_dir), "/tmp/sp_test.XXXXXX");
	assert_non_null(mkdtemp(fx->fx_dir));
	snprintf(fx->fx_path, sizeof(fx->fx_path), "%s/s.ipc", fx->fx_dir);
	snprintf(fx->fx_url, sizeof(fx->fx_url), "ipc://%s", fx->fx_path);
	fx->fx_loop = ev_loop_new(EVFLAG_AUTO);
	assert_non_null(fx->fx_loop);
	*state = fx;
	return 0;
}

static int
teardown(void **state)
{
	struct fixture *fx = *state;

	unlink(fx->fx_path);
	rmdir(fx->fx_dir);
	ev_loop_destroy(fx->fx_loop);
	free(fx);
	return 0;
}

/* Blocking helpers for the scripted peers (threads). */
static int
io_wait(int fd, short ev)
{
	struct pollfd p = { .fd = fd, .events = ev };

	return poll(&p, 1, IO_TIMEOUT) == 1 ? 0 : -1;
}

static int
read_exact(int fd, void *buf, size_t len)
{
	size_t got = 0;
	ssize_t n;

	while (got < len) {
		if (io_wait(fd, POLLIN) == -1)
			return -1;
		n = read(fd, (char *)buf + got, len - got);
		if (n <= 0)
			return -1;
		got += (size_t)n;
	}
	return 0;
}

static int
write_all(int fd, const void *buf, size_t len)
{
	size_t put = 0;
	ssize_t n;

	while (put < len) {
		n = send(fd, (const char *)buf + put, len - put, MSG_NOSIGNAL);
		if (n == -1 && errno == EAGAIN && io_wait(fd, POLLOUT) == 0)
			continue;
		if (n <= 0)
			return -1;
		put += (size_t)n;
	}
	return 0;
}

static int
raw_listen(const char *path)
{
	struct sockaddr_un sun;
	int fd;

	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	assert_true(strlen(path) < sizeof(sun.sun_path));
	memcpy(sun.sun_path, path, strlen(path) + 1);
	unlink(path);
	fd = socket(AF_UNIX, SOCK_STREAM, 0);
	assert_true(fd != -1);
	assert_int_equal(bind(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
	assert_int_equal(listen(fd, 8), 0);
	return fd;
}

static int
raw_connect(const char *path)
{
	struct sockaddr_un sun;
	int fd;

	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	assert_true(strlen(path) < sizeof(sun.sun_path));
	memcpy(sun.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM, 0);
	assert_true(fd != -1);
	assert_int_equal(connect(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
	return fd;
}

static int
raw_accept(int lfd)
{
	if (io_wait(lfd, POLLIN) == -1)
		return -1;
	return accept(lfd, NULL, NULL);
}

/* Reads one frame into a malloc'ed buffer; -1 on error. */
static int
raw_read_frame(int fd, uint8_t **payload, size_t *len)
{
	uint8_t h[SP_FRAME_HEAD];
	uint64_t n = 0;
	int i;

	if (read_exact(fd, h, sizeof(h)) == -1 || h[0] != 1)
		return -1;
	for (i = 0; i < 8; i++)
		n = n << 8 | h[1 + i];
	if ((*payload = malloc(n > 0 ? n : 1)) == NULL)
		return -1;
	if (read_exact(fd, *payload, n) == -1) {
		free(*payload);
		return -1;
	}
	*len = n;
	return 0;
}

static int
raw_write_frame(int fd, const uint8_t *a, size_t alen, const void *b,
    size_t blen)
{
	uint8_t h[SP_FRAME_HEAD];

	sp_frame_head(h, alen + blen);
	if (write_all(fd, h, sizeof(h)) == -1 || write_all(fd, a, alen) == -1)
		return -1;
	return blen > 0 ? write_all(fd, b, blen) : 0;
}

static int
raw_handshake(int fd, uint16_t self, uint16_t peer)
{
	uint8_t h[SP_HEADER_LEN];

	sp_header_make(h, self);
	if (write_all(fd, h, sizeof(h)) == -1 ||
	    read_exact(fd, h, sizeof(h)) == -1)
		return -1;
	return sp_header_check(h, peer);
}

/* --------------------------------------------------------------- codec */

static void
test_codec(void **state)
{
	uint8_t h[SP_HEADER_LEN], f[32];
	const uint8_t *p;
	size_t plen, used;
	const uint8_t one_hop[] = { 0x80, 0, 0, 7, 'x' };
	const uint8_t two_hops[] = { 0, 0, 0, 1, 0x80, 0, 0, 2 };
	uint8_t many[4 * (SP_MAX_HOPS + 1)];

	(void)state;
	sp_header_make(h, SP_PROTO_REQ0);
	assert_memory_equal(h, "\0SP\0\0\x30\0\0", 8);
	assert_int_equal(sp_header_check(h, SP_PROTO_REQ0), 0);
	assert_int_equal(sp_header_check(h, SP_PROTO_REP0), -1);
	h[6] = 1;
	assert_int_equal(sp_header_check(h, SP_PROTO_REQ0), -1);
	h[6] = 0;
	h[1] = 's';
	assert_int_equal(sp_header_check(h, SP_PROTO_REQ0), -1);

	sp_frame_head(f, 3);
	assert_memory_equal(f, "\x01\0\0\0\0\0\0\0\x03", 9);
	memcpy(f + 9, "abc", 3);
	assert_int_equal(sp_frame_parse(f, 0, 10, &p, &plen, &used),
	    SP_FRAME_NEED);
	assert_int_equal(sp_frame_parse(f, 5, 10, &p, &plen, &used),
	    SP_FRAME_NEED);
	assert_int_equal(used, 0);
	assert_int_equal(sp_frame_parse(f, 10, 10, &p, &plen, &used),
	    SP_FRAME_NEED);
	assert_int_equal(used, 12);
	assert_int_equal(sp_frame_parse(f, 12, 10, &p, &plen, &used),
	    SP_FRAME_OK);
	assert_int_equal(plen, 3);
	assert_int_equal(used, 12);
	assert_memory_equal(p, "abc", 3);
	assert_int_equal(sp_frame_parse(f, 12, 2, &p, &plen, &used),
	    SP_FRAME_TOO_LARGE);
	f[0] = 2;
	assert_int_equal(sp_frame_parse(f, 1, 10, &p, &plen, &used),
	    SP_FRAME_BAD);
	/* A length that does not fit size_t is refused, not wrapped. */
	memset(f, 0xff, 9);
	f[0] = 1;
	assert_int_equal(sp_frame_parse(f, 9, TEST_MAX, &p, &plen, &used),
	    SP_FRAME_TOO_LARGE);

	assert_int_equal(sp_backtrace_len(one_hop, sizeof(one_hop)), 4);
	assert_int_equal(sp_backtrace_len(two_hops, sizeof(two_hops)), 8);
	assert_int_equal(sp_backtrace_len(two_hops, 3), -1);
	assert_int_equal(sp_backtrace_len(two_hops, 6), -1);
	memset(many, 0, sizeof(many));
	many[4 * SP_MAX_HOPS] = 0x80;
	assert_int_equal(sp_backtrace_len(many, sizeof(many)), 0);
	many[4 * (SP_MAX_HOPS - 1)] = 0x80;
	assert_int_equal(sp_backtrace_len(many, sizeof(many)), 4 * SP_MAX_HOPS);
}

/* ------------------------------------------------ libnng REQ -> server */

struct nng_req_job {
	const char *nj_url;
	int nj_count;
	int nj_ok;
	size_t nj_big; /* also send one message of this size (refused) */
	atomic_int nj_done;
};

static void *
nng_req_thread(void *arg)
{
	struct nng_req_job *j = arg;
	char msg[32], want[34], *out;
	nng_socket s;
	size_t olen;
	int i;

	if (nng_req0_open(&s) != 0)
		goto done;
	nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 3000);
	nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 3000);
	if (nng_dial(s, j->nj_url, NULL, 0) != 0)
		goto out;
	for (i = 0; i < j->nj_count; i++) {
		snprintf(msg, sizeof(msg), "nng-%d", i);
		snprintf(want, sizeof(want), ">nng-%d", i);
		if (nng_send(s, msg, strlen(msg), 0) != 0 ||
		    nng_recv(s, &out, &olen, NNG_FLAG_ALLOC) != 0)
			continue;
		if (olen == strlen(want) && memcmp(out, want, olen) == 0)
			j->nj_ok++;
		nng_free(out, olen);
	}
	if (j->nj_big > 0) {
		/* Over the server's limit: no answer, only this pipe dies. */
		char *big = calloc(1, j->nj_big);

		nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 300);
		if (big != NULL && nng_send(s, big, j->nj_big, 0) == 0 &&
		    nng_recv(s, &out, &olen, NNG_FLAG_ALLOC) == 0) {
			nng_free(out, olen);
			j->nj_ok = -1000;
		}
		free(big);
	}
out:
	nng_close(s);
done:
	atomic_store(&j->nj_done, 1);
	return NULL;
}

static void
test_nng_req_to_server(void **state)
{
	struct fixture *fx = *state;
	struct nng_req_job j1 = { .nj_url = fx->fx_url, .nj_count = 50 };
	struct nng_req_job j2 = { .nj_url = fx->fx_url,
		.nj_count = 50,
		.nj_big = TEST_MAX + 100 };
	struct sp_server *srv;
	pthread_t t1, t2;
	int seen = 0;

	srv = sp_server_new(fx->fx_loop, fx->fx_path, TEST_MAX, echo_cb, &seen);
	assert_non_null(srv);
	assert_int_equal(pthread_create(&t1, NULL, nng_req_thread, &j1), 0);
	assert_int_equal(pthread_create(&t2, NULL, nng_req_thread, &j2), 0);
	assert_true(run_until_flag(fx->fx_loop, &j1.nj_done, 20.0));
	assert_true(run_until_flag(fx->fx_loop, &j2.nj_done, 20.0));
	pthread_join(t1, NULL);
	pthread_join(t2, NULL);
	assert_int_equal(j1.nj_ok, 50);
	assert_int_equal(j2.nj_ok, 50);
	assert_int_equal(seen, 100);
	sp_server_free(srv);
}

/* libnng REQ contexts: many requests in flight on one pipe, ids matched. */
#define NCTX 8

struct nng_ctx_job {
	const char *cj_url;
	int cj_ok;
	atomic_int cj_done;
};

static void *
nng_ctx_thread(void *arg)
{
	struct nng_ctx_job *j = arg;
	nng_socket s;
	nng_ctx ctx[NCTX];
	nng_aio *aio[NCTX];
	nng_msg *m;
	int i, round;

	memset(aio, 0, sizeof(aio));
	if (nng_req0_open(&s) != 0)
		goto done;
	if (nng_dial(s, j->cj_url, NULL, 0) != 0)
		goto out;
	for (i = 0; i < NCTX; i++)
		if (nng_ctx_open(&ctx[i], s) != 0 ||
		    nng_aio_alloc(&aio[i], NULL, NULL) != 0)
			goto out;
	for (round = 0; round < 5; round++) {
		for (i = 0; i < NCTX; i++) {
			if (nng_msg_alloc(&m, 0) != 0 ||
			    nng_msg_append(m, "c", 1) != 0 ||
			    nng_msg_append_u32(m, (uint32_t)i) != 0)
				goto out;
			nng_aio_set_msg(aio[i], m);
			nng_aio_set_timeout(aio[i], 3000);
			nng_ctx_send(ctx[i], aio[i]);
			nng_aio_wait(aio[i]);
			if (nng_aio_result(aio[i]) != 0) {
				nng_msg_free(m);
				goto out;
			}
		}
		/* All eight wait for their replies at once. */
		for (i = 0; i < NCTX; i++)
			nng_ctx_recv(ctx[i], aio[i]);
		for (i = 0; i < NCTX; i++) {
			nng_aio_wait(aio[i]);
			if (nng_aio_result(aio[i]) != 0)
				continue;
			m = nng_aio_get_msg(aio[i]);
			if (nng_msg_len(m) == 6 &&
			    memcmp(nng_msg_body(m), ">c", 2) == 0 &&
			    ((uint8_t *)nng_msg_body(m))[5] == (uint8_t)i)
				j->cj_ok++;
			nng_msg_free(m);
		}
	}
out:
	for (i = 0; i < NCTX; i++)
		nng_aio_free(aio[i]);
	nng_close(s);
done:
	atomic_store(&j->cj_done, 1);
	return NULL;
}

static void
test_nng_contexts_to_server(void **state)
{
	struct fixture *fx = *state;
	struct nng_ctx_job j = { .cj_url = fx->fx_url };
	struct sp_server *srv;
	pthread_t t;
	int seen = 0;

	srv = sp_server_new(fx->fx_loop, fx->fx_path, TEST_MAX, echo_cb, &seen);
	assert_non_null(srv);
	assert_int_equal(pthread_create(&t, NULL, nng_ctx_thread, &j), 0);
	assert_true(run_until_flag(fx->fx_loop, &j.cj_done, 20.0));
	pthread_join(t, NULL);
	assert_int_equal(j.cj_ok, 5 * NCTX);
	assert_int_equal(seen, 5 * NCTX);
	sp_server_free(srv);
}

/* ------------------------------------------------ client -> libnng REP */

struct nng_rep_job {
	const char *rj_url;
	atomic_int rj_ready;
	atomic_int rj_stop;
	int rj_served;
};

static void *
nng_rep_thread(void *arg)
{
	struct nng_rep_job *j = arg;
	char *in, *out;
	nng_socket s;
	size_t ilen;
	int rv;

	if (nng_rep0_open(&s) != 0 ||
	    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 50) != 0 ||
	    nng_listen(s, j->rj_url, NULL, 0) != 0) {
		atomic_store(&j->rj_ready, -1);
		return NULL;
	}
	atomic_store(&j->rj_ready, 1);
	while (!atomic_load(&j->rj_stop)) {
		rv = nng_recv(s, &in, &ilen, NNG_FLAG_ALLOC);
		if (rv == NNG_ETIMEDOUT)
			continue;
		if (rv != 0)
			break;
		out = malloc(ilen + 1);
		out[0] = '>';
		memcpy(out + 1, in, ilen);
		nng_free(in, ilen);
		if (nng_send(s, out, ilen + 1, 0) == 0)
			j->rj_served++;
		free(out);
	}
	nng_close(s);
	return NULL;
}

static void
test_client_to_nng_rep(void **state)
{
	struct fixture *fx = *state;
	struct nng_rep_job j = { .rj_url = fx->fx_url };
	struct rec r[32];
	struct sp_client *cl;
	char msg[32];
	pthread_t t;
	int i, done = 0;

	assert_int_equal(pthread_create(&t, NULL, nng_rep_thread, &j), 0);
	while (atomic_load(&j.rj_ready) == 0)
		usleep(1000);
	assert_int_equal(atomic_load(&j.rj_ready), 1);
	cl = sp_client_new(fx->fx_loop, fx->fx_path, 32, TEST_MAX);
	assert_non_null(cl);
	memset(r, 0, sizeof(r));
	/* All in flight at once on one connection, ids matched. */
	for (i = 0; i < 32; i++) {
		r[i].r_counter = &done;
		snprintf(msg, sizeof(msg), "rep-%d", i);
		assert_int_equal(sp_client_send(cl, (const uint8_t *)msg,
		                     strlen(msg), 5000, rec_cb, &r[i]),
		    0);
	}
	assert_int_equal(sp_client_inflight(cl), 32);
	assert_true(run_until(fx->fx_loop, &done, 32, 15.0));
	for (i = 0; i < 32; i++) {
		snprintf(msg, sizeof(msg), ">rep-%d", i);
		assert_int_equal(r[i].r_calls, 1);
		assert_int_equal(r[i].r_status, 0);
		assert_string_equal(r[i].r_body, msg);
	}
	assert_true(sp_client_down_secs(cl) == 0.);
	sp_client_free(cl);
	atomic_store(&j.rj_stop, 1);
	pthread_join(t, NULL);
	assert_int_equal(j.rj_served, 32);
}

/* ------------------------------------------ connection lost in a state */

enum kill_mode {
	KILL_BACKLOG = 0, /* connected, never accepted */
	KILL_HANDSHAKE, /* accepted, no header sent back */
	KILL_WRONG_PEER, /* a REQ0 header instead of REP0 */
	KILL_MID_SEND, /* part of a large request read */
	KILL_WAIT_REPLY, /* whole request read, no reply */
	KILL_MID_REPLY, /* half a reply written */
	KILL_BAD_FRAME, /* a frame of type 2 */
	KILL_HUGE_FRAME, /* a frame head over the limit */
};

struct script {
	const char *sc_path;
	enum kill_mode sc_mode;
	atomic_int sc_killed;
	atomic_int sc_stop;
	int sc_served;
	int sc_fail;
};

/* Serves one good connection: echo every request until it closes. */
static void
script_serve(struct script *sc, int lfd)
{
	uint8_t *p;
	size_t len;
	int fd;

	while (!atomic_load(&sc->sc_stop)) {
		struct pollfd pf = { .fd = lfd, .events = POLLIN };

		if (poll(&pf, 1, 50) != 1 ||
		    (fd = accept(lfd, NULL, NULL)) == -1)
			continue;
		if (raw_handshake(fd, SP_PROTO_REP0, SP_PROTO_REQ0) == -1) {
			sc->sc_fail++;
			close(fd);
			continue;
		}
		while (raw_read_frame(fd, &p, &len) == 0) {
			if (len < 4 ||
			    raw_write_frame(fd, p, 4, ">", 1) == -1) {
				free(p);
				break;
			}
			/* The reply is ">" + the body after the id. */
			sc->sc_served++;
			free(p);
		}
		close(fd);
	}
}

static void *
script_thread(void *arg)
{
	struct script *sc = arg;
	uint8_t h[SP_HEADER_LEN], buf[4096], *p;
	size_t len;
	int lfd, fd = -1;

	lfd = raw_listen(sc->sc_path);
	if (sc->sc_mode == KILL_BACKLOG) {
		/* Let the client connect into the backlog, then go away. */
		usleep(200 * 1000);
		close(lfd);
		unlink(sc->sc_path);
		atomic_store(&sc->sc_killed, 1);
		usleep(100 * 1000);
		lfd = raw_listen(sc->sc_path);
		script_serve(sc, lfd);
		close(lfd);
		return NULL;
	}
	if ((fd = raw_accept(lfd)) == -1) {
		sc->sc_fail++;
		goto serve;
	}
	switch (sc->sc_mode) {
	case KILL_HANDSHAKE:
		(void)read_exact(fd, h, sizeof(h));
		break;
	case KILL_WRONG_PEER:
		(void)raw_handshake(fd, SP_PROTO_REQ0, SP_PROTO_REQ0);
		usleep(100 * 1000);
		break;
	case KILL_MID_SEND:
		if (raw_handshake(fd, SP_PROTO_REP0, SP_PROTO_REQ0) == -1 ||
		    read_exact(fd, buf, sizeof(buf)) == -1)
			sc->sc_fail++;
		break;
	case KILL_WAIT_REPLY:
	case KILL_MID_REPLY:
	case KILL_BAD_FRAME:
	case KILL_HUGE_FRAME:
		if (raw_handshake(fd, SP_PROTO_REP0, SP_PROTO_REQ0) == -1 ||
		    raw_read_frame(fd, &p, &len) == -1) {
			sc->sc_fail++;
			break;
		}
		if (sc->sc_mode == KILL_MID_REPLY) {
			uint8_t fh[SP_FRAME_HEAD];

			sp_frame_head(fh, 100);
			(void)write_all(fd, fh, sizeof(fh));
			(void)write_all(fd, p, 4);
		} else if (sc->sc_mode == KILL_BAD_FRAME) {
			buf[0] = 2;
			(void)write_all(fd, buf, 1);
		} else if (sc->sc_mode == KILL_HUGE_FRAME) {
			uint8_t fh[SP_FRAME_HEAD];

			sp_frame_head(fh, (uint64_t)CLIENT_MAX + 5);
			(void)write_all(fd, fh, sizeof(fh));
			(void)write_all(fd, p, 4);
		}
		free(p);
		usleep(50 * 1000);
		break;
	default:
		break;
	}
	atomic_store(&sc->sc_killed, 1);
	close(fd);
serve:
	script_serve(sc, lfd);
	close(lfd);
	return NULL;
}

static void
kill_in_state(struct fixture *fx, enum kill_mode mode, int want_status)
{
	struct script sc = { .sc_path = fx->fx_path, .sc_mode = mode };
	struct rec a = { 0 }, b = { 0 };
	struct sp_client *cl;
	uint8_t *big = NULL;
	size_t alen = 5;
	pthread_t t;

	assert_int_equal(pthread_create(&t, NULL, script_thread, &sc), 0);
	usleep(50 * 1000);
	cl = sp_client_new(fx->fx_loop, fx->fx_path, 4, CLIENT_MAX);
	assert_non_null(cl);
	if (mode == KILL_MID_SEND) {
		alen = BIG_LEN;
		big = calloc(1, alen);
		assert_non_null(big);
	}
	/* Queued now, framed when a connection is up. */
	assert_int_equal(sp_client_send(cl,
	                     big != NULL ? big : (const uint8_t *)"first", alen,
	                     6000, rec_cb, &a),
	    0);
	free(big);
	assert_true(run_until(fx->fx_loop, &a.r_calls, 1, 8.0));
	assert_true(run_until_flag(fx->fx_loop, &sc.sc_killed, 3.0));
	assert_int_equal(a.r_status, want_status);
	if (want_status == 0)
		assert_string_equal(a.r_body, ">");
	/* The client reconnects by itself and the next request works. */
	assert_int_equal(
	    sp_client_send(cl, (const uint8_t *)"second", 6, 6000, rec_cb, &b),
	    0);
	assert_true(run_until(fx->fx_loop, &b.r_calls, 1, 8.0));
	assert_int_equal(b.r_status, 0);
	assert_string_equal(b.r_body, ">");
	assert_true(sp_client_down_secs(cl) == 0.);
	/* Exactly one completion each, none later. */
	{
		int never = 0;

		(void)run_until(fx->fx_loop, &never, 1, 0.2);
	}
	assert_int_equal(a.r_calls, 1);
	assert_int_equal(b.r_calls, 1);
	sp_client_free(cl);
	atomic_store(&sc.sc_stop, 1);
	pthread_join(t, NULL);
	assert_int_equal(sc.sc_fail, 0);
}

static void
test_kill_backlog(void **state)
{
	kill_in_state(*state, KILL_BACKLOG, 0);
}

static void
test_kill_handshake(void **state)
{
	kill_in_state(*state, KILL_HANDSHAKE, 0);
}

static void
test_kill_wrong_peer(void **state)
{
	kill_in_state(*state, KILL_WRONG_PEER, 0);
}

static void
test_kill_mid_send(void **state)
{
	kill_in_state(*state, KILL_MID_SEND, NNG_ECONNRESET);
}

static void
test_kill_wait_reply(void **state)
{
	kill_in_state(*state, KILL_WAIT_REPLY, NNG_ECONNRESET);
}

static void
test_kill_mid_reply(void **state)
{
	kill_in_state(*state, KILL_MID_REPLY, NNG_ECONNRESET);
}

static void
test_kill_bad_frame(void **state)
{
	kill_in_state(*state, KILL_BAD_FRAME, NNG_ECONNRESET);
}

static void
test_kill_huge_frame(void **state)
{
	kill_in_state(*state, KILL_HUGE_FRAME, NNG_ECONNRESET);
}

/* ------------------------------------------------ restart mid-batch */

static void
test_restart_mid_batch(void **state)
{
	struct fixture *fx = *state;
	struct sp_server *srv;
	struct sp_client *cl;
	struct rec r[16], after = { 0 };
	int i, done = 0, seen = 0;

	srv = sp_server_new(fx->fx_loop, fx->fx_path, TEST_MAX, echo_cb, &seen);
	assert_non_null(srv);
	cl = sp_client_new(fx->fx_loop, fx->fx_path, 16, TEST_MAX);
	assert_non_null(cl);
	memset(r, 0, sizeof(r));
	for (i = 0; i < 16; i++) {
		r[i].r_counter = &done;
		assert_int_equal(sp_client_send(cl, (const uint8_t *)"silent",
		                     6, 10000, rec_cb, &r[i]),
		    0);
	}
	assert_true(run_until(fx->fx_loop, &seen, 16, 5.0));
	/* The broker dies with the whole batch unanswered. */
	sp_server_free(srv);
	assert_true(run_until(fx->fx_loop, &done, 16, 5.0));
	for (i = 0; i < 16; i++) {
		assert_int_equal(r[i].r_calls, 1);
		assert_int_equal(r[i].r_status, NNG_ECONNRESET);
	}
	assert_int_equal(sp_client_inflight(cl), 0);
	assert_true(sp_client_down_secs(cl) > 0.);
	srv = sp_server_new(fx->fx_loop, fx->fx_path, TEST_MAX, echo_cb, &seen);
	assert_non_null(srv);
	assert_int_equal(
	    sp_client_send(cl, (const uint8_t *)"x", 1, 5000, rec_cb, &after),
	    0);
	assert_true(run_until(fx->fx_loop, &after.r_calls, 1, 5.0));
	assert_int_equal(after.r_status, 0);
	assert_string_equal(after.r_body, ">x");
	assert_int_equal(done, 16);
	sp_client_free(cl);
	sp_server_free(srv);
}

/* ----------------------------------------------- server: bad peers */

static void
test_server_bad_peers(void **state)
{
	struct fixture *fx = *state;
	struct sp_server *srv;
	struct rec good = { 0 };
	struct sp_client *cl;
	uint8_t h[SP_HEADER_LEN], fh[SP_FRAME_HEAD], *p;
	const uint8_t bt[] = { 0, 0, 0, 9, 0x80, 0, 0, 5 };
	uint8_t hops[4 * (SP_MAX_HOPS + 1)];
	size_t len;
	int seen = 0, fd[4], i, never = 0;
	char c;

	srv = sp_server_new(fx->fx_loop, fx->fx_path, TEST_MAX, echo_cb, &seen);
	assert_non_null(srv);
	cl = sp_client_new(fx->fx_loop, fx->fx_path, 4, TEST_MAX);
	assert_non_null(cl);

	/* 0: a wrong header; 1: frame over the limit; 2: no request id. */
	for (i = 0; i < 4; i++)
		fd[i] = raw_connect(fx->fx_path);
	memcpy(h, "\0SP\0\0\x31\0\0", 8);
	assert_int_equal(write_all(fd[0], h, 8), 0);
	sp_header_make(h, SP_PROTO_REQ0);
	for (i = 1; i < 4; i++)
		assert_int_equal(write_all(fd[i], h, 8), 0);
	sp_frame_head(fh, (uint64_t)TEST_MAX + 1);
	assert_int_equal(write_all(fd[1], fh, sizeof(fh)), 0);
	assert_int_equal(
	    raw_write_frame(fd[2], (const uint8_t *)"ab", 2, "", 0), 0);
	/* 3: too many hops (dropped), then a two-hop request, pipelined. */
	memset(hops, 0, sizeof(hops));
	hops[4 * SP_MAX_HOPS] = 0x80;
	assert_int_equal(raw_write_frame(fd[3], hops, sizeof(hops), "z", 1), 0);
	assert_int_equal(raw_write_frame(fd[3], bt, sizeof(bt), "q", 1), 0);
	(void)run_until(fx->fx_loop, &never, 1, 0.3);

	/* The three bad ones are closed: EOF after their header. */
	for (i = 0; i < 3; i++) {
		ssize_t n;

		(void)read_exact(fd[i], h, 8);
		n = read(fd[i], &c, 1);
		assert_true(n <= 0);
		close(fd[i]);
	}
	/* The good one answers with the whole backtrace echoed. */
	assert_int_equal(read_exact(fd[3], h, 8), 0);
	assert_int_equal(sp_header_check(h, SP_PROTO_REP0), 0);
	assert_int_equal(raw_read_frame(fd[3], &p, &len), 0);
	assert_int_equal(len, sizeof(bt) + 2);
	assert_memory_equal(p, bt, sizeof(bt));
	assert_memory_equal(p + sizeof(bt), ">q", 2);
	free(p);
	close(fd[3]);
	assert_int_equal(seen, 1);

	/* Other peers were never disturbed. */
	assert_int_equal(
	    sp_client_send(cl, (const uint8_t *)"ok", 2, 3000, rec_cb, &good),
	    0);
	assert_true(run_until(fx->fx_loop, &good.r_calls, 1, 5.0));
	assert_int_equal(good.r_status, 0);
	assert_string_equal(good.r_body, ">ok");
	(void)run_until(fx->fx_loop, &never, 1, 0.1);
	assert_int_equal(sp_server_nconns(srv), 1);
	sp_client_free(cl);
	sp_server_free(srv);
}

/* A request over the frame limit is refused at the sender. */
static void
test_client_limits(void **state)
{
	struct fixture *fx = *state;
	struct sp_client *cl;
	struct rec r = { 0 };
	uint8_t *big;

	cl = sp_client_new(fx->fx_loop, fx->fx_path, 1, 1000);
	assert_non_null(cl);
	big = calloc(1, 1000);
	assert_non_null(big);
	assert_int_equal(sp_client_send(cl, big, 997, 100, rec_cb, &r), -1);
	assert_int_equal(sp_client_send(cl, big, 996, 100, rec_cb, &r), 0);
	/* One slot: busy. */
	assert_int_equal(sp_client_send(cl, big, 1, 100, rec_cb, &r), -1);
	free(big);
	assert_true(run_until(fx->fx_loop, &r.r_calls, 1, 3.0));
	assert_int_equal(r.r_status, NNG_ETIMEDOUT);
	assert_true(sp_client_down_secs(cl) > 0.);
	sp_client_free(cl);
}

/* A request sent from a timeout's callback goes out at once. */
struct chain {
	struct sp_client *ch_cl;
	struct rec ch_first;
	struct rec ch_second;
};

static void
chain_cb(void *arg, int status, const uint8_t *reply, size_t len)
{
	struct chain *ch = arg;

	rec_cb(&ch->ch_first, status, reply, len);
	assert_int_equal(sp_client_send(ch->ch_cl, (const uint8_t *)"next", 4,
	                     5000, rec_cb, &ch->ch_second),
	    0);
}

static void
test_send_from_timeout(void **state)
{
	struct fixture *fx = *state;
	struct chain ch;
	struct sp_server *srv;
	ev_tstamp t0;
	int seen = 0;

	memset(&ch, 0, sizeof(ch));
	srv = sp_server_new(fx->fx_loop, fx->fx_path, TEST_MAX, echo_cb, &seen);
	assert_non_null(srv);
	ch.ch_cl = sp_client_new(fx->fx_loop, fx->fx_path, 4, TEST_MAX);
	assert_non_null(ch.ch_cl);
	assert_int_equal(sp_client_send(ch.ch_cl, (const uint8_t *)"silent", 6,
	                     200, chain_cb, &ch),
	    0);
	assert_true(run_until(fx->fx_loop, &ch.ch_first.r_calls, 1, 5.0));
	assert_int_equal(ch.ch_first.r_status, NNG_ETIMEDOUT);
	t0 = ev_time();
	assert_true(run_until(fx->fx_loop, &ch.ch_second.r_calls, 1, 5.0));
	assert_int_equal(ch.ch_second.r_status, 0);
	assert_string_equal(ch.ch_second.r_body, ">next");
	assert_true(ev_time() - t0 < 1.0);
	sp_client_free(ch.ch_cl);
	sp_server_free(srv);
}

/* Holds "wait" requests (at most 4); answers the others at once. */
struct holder {
	struct sp_held *ho_held[4];
	int ho_n;
	int ho_null; /* sp_server_hold returned NULL on a second call */
};

static void
hold_cb(void *arg, const uint8_t *msg, size_t len, uint8_t **reply,
    size_t *reply_len)
{
	struct holder *ho = arg;

	if (len == 4 && memcmp(msg, "wait", 4) == 0 && ho->ho_n < 4) {
		assert_non_null(ho->ho_held[ho->ho_n] = sp_server_hold());
		if (sp_server_hold() == NULL)
			ho->ho_null++;
		ho->ho_n++;
		return;
	}
	echo_cb(NULL, msg, len, reply, reply_len);
}

/*
 * A held request does not hold up the ones behind it on the connection;
 * its reply, given later, reaches the right request. A hold whose
 * connection died is dropped cleanly.
 */
static void
test_held_reply(void **state)
{
	struct fixture *fx = *state;
	struct holder ho;
	struct rec held, quick, gone;
	struct sp_server *srv;
	struct sp_client *cl;
	uint8_t *r;

	memset(&ho, 0, sizeof(ho));
	memset(&held, 0, sizeof(held));
	memset(&quick, 0, sizeof(quick));
	memset(&gone, 0, sizeof(gone));
	assert_null(sp_server_hold()); /* outside a request callback */
	srv = sp_server_new(fx->fx_loop, fx->fx_path, TEST_MAX, hold_cb, &ho);
	assert_non_null(srv);
	cl = sp_client_new(fx->fx_loop, fx->fx_path, 4, TEST_MAX);
	assert_non_null(cl);
	assert_int_equal(
	    sp_client_send(cl, (const uint8_t *)"wait", 4, 5000, rec_cb, &held),
	    0);
	assert_int_equal(
	    sp_client_send(cl, (const uint8_t *)"now", 3, 5000, rec_cb, &quick),
	    0);
	assert_true(run_until(fx->fx_loop, &quick.r_calls, 1, 5.0));
	assert_string_equal(quick.r_body, ">now");
	assert_int_equal(held.r_calls, 0);
	assert_int_equal(ho.ho_n, 1);
	assert_int_equal(ho.ho_null, 1);
	assert_true(sp_held_alive(ho.ho_held[0]));
	r = malloc(5);
	assert_non_null(r);
	memcpy(r, "later", 5);
	sp_held_reply(ho.ho_held[0], r, 5);
	assert_true(run_until(fx->fx_loop, &held.r_calls, 1, 5.0));
	assert_int_equal(held.r_status, 0);
	assert_string_equal(held.r_body, "later");

	/* The client goes away while the server holds its request. */
	assert_int_equal(
	    sp_client_send(cl, (const uint8_t *)"wait", 4, 5000, rec_cb, &gone),
	    0);
	assert_true(run_until(fx->fx_loop, &ho.ho_n, 2, 5.0));
	sp_client_free(cl);
	assert_int_equal(gone.r_status, NNG_ECLOSED);
	{
		int none = 0;

		/* Let the server see the end of the stream. */
		(void)run_until(fx->fx_loop, &none, 1, 0.2);
	}
	assert_int_equal(sp_server_nconns(srv), 0);
	assert_false(sp_held_alive(ho.ho_held[1]));
	r = malloc(1);
	assert_non_null(r);
	sp_held_reply(ho.ho_held[1], r, 1); /* dropped, freed */

	/* A hold outliving its server is still the caller's to free. */
	cl = sp_client_new(fx->fx_loop, fx->fx_path, 4, TEST_MAX);
	assert_non_null(cl);
	memset(&gone, 0, sizeof(gone));
	assert_int_equal(
	    sp_client_send(cl, (const uint8_t *)"wait", 4, 5000, rec_cb, &gone),
	    0);
	assert_true(run_until(fx->fx_loop, &ho.ho_n, 3, 5.0));
	sp_server_free(srv);
	assert_false(sp_held_alive(ho.ho_held[2]));
	sp_held_drop(ho.ho_held[2]);
	sp_client_free(cl);
}

/* ------------------------------------------------------------------ TCP */

/* A loopback port nobody listens on just now. */
static int
free_tcp_port(void)
{
	struct sockaddr_in sin;
	socklen_t sl = sizeof(sin);
	int fd, port;

	fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(fd >= 0);
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sin, &sl), 0);
	port = ntohs(sin.sin_port);
	close(fd);
	return port;
}

static void
test_tcp_codec(void **state)
{
	uint8_t f[16];
	const uint8_t *p;
	size_t plen, used;

	(void)state;
	sp_tcp_frame_head(f, 3);
	assert_memory_equal(f, "\0\0\0\0\0\0\0\x03", 8);
	memcpy(f + 8, "abc", 3);
	assert_int_equal(sp_tcp_frame_parse(f, 7, 10, &p, &plen, &used),
	    SP_FRAME_NEED);
	assert_int_equal(sp_tcp_frame_parse(f, 9, 10, &p, &plen, &used),
	    SP_FRAME_NEED);
	assert_int_equal(used, 11);
	assert_int_equal(sp_tcp_frame_parse(f, 11, 10, &p, &plen, &used),
	    SP_FRAME_OK);
	assert_int_equal(plen, 3);
	assert_memory_equal(p, "abc", 3);
	assert_int_equal(sp_tcp_frame_parse(f, 11, 2, &p, &plen, &used),
	    SP_FRAME_TOO_LARGE);
	/* No type byte: a first byte of 2 is a length byte. */
	f[0] = 2;
	assert_int_equal(sp_tcp_frame_parse(f, 11, 10, &p, &plen, &used),
	    SP_FRAME_TOO_LARGE);
}

/* libnng REQ sockets (plain and contexts) against a tcp:// server. */
static void
test_tcp_nng_req_to_server(void **state)
{
	struct fixture *fx = *state;
	char url[64];
	struct nng_req_job j1 = { .nj_url = url, .nj_count = 50 };
	struct nng_req_job j2 = { .nj_url = url,
		.nj_count = 50,
		.nj_big = TEST_MAX + 100 };
	struct nng_ctx_job j3 = { .cj_url = url };
	struct sp_server *srv;
	pthread_t t1, t2, t3;
	int seen = 0, port;

	assert_null(sp_server_new_tcp(fx->fx_loop, "127.0.0.1", TEST_MAX,
	    echo_cb, &seen));
	srv = sp_server_new_tcp(fx->fx_loop, "127.0.0.1:0", TEST_MAX, echo_cb,
	    &seen);
	assert_non_null(srv);
	port = sp_server_port(srv);
	assert_true(port > 0);
	snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
	assert_int_equal(pthread_create(&t1, NULL, nng_req_thread, &j1), 0);
	assert_int_equal(pthread_create(&t2, NULL, nng_req_thread, &j2), 0);
	assert_int_equal(pthread_create(&t3, NULL, nng_ctx_thread, &j3), 0);
	assert_true(run_until_flag(fx->fx_loop, &j1.nj_done, 20.0));
	assert_true(run_until_flag(fx->fx_loop, &j2.nj_done, 20.0));
	assert_true(run_until_flag(fx->fx_loop, &j3.cj_done, 20.0));
	pthread_join(t1, NULL);
	pthread_join(t2, NULL);
	pthread_join(t3, NULL);
	assert_int_equal(j1.nj_ok, 50);
	assert_int_equal(j2.nj_ok, 50);
	assert_int_equal(j3.cj_ok, 5 * NCTX);
	assert_int_equal(seen, 100 + 5 * NCTX);
	sp_server_free(srv);
}

/* An sp_client over tcp:// against a libnng REP socket. */
static void
test_tcp_client_to_nng_rep(void **state)
{
	struct fixture *fx = *state;
	char url[64], hp[64];
	struct nng_rep_job j = { .rj_url = url };
	struct rec r[32];
	struct sp_client *cl;
	char msg[32];
	pthread_t t;
	int i, done = 0, port = free_tcp_port();

	snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
	snprintf(hp, sizeof(hp), "127.0.0.1:%d", port);
	assert_int_equal(pthread_create(&t, NULL, nng_rep_thread, &j), 0);
	while (atomic_load(&j.rj_ready) == 0)
		usleep(1000);
	assert_int_equal(atomic_load(&j.rj_ready), 1);
	cl = sp_client_new_tcp(fx->fx_loop, hp, 32, TEST_MAX);
	assert_non_null(cl);
	memset(r, 0, sizeof(r));
	for (i = 0; i < 32; i++) {
		r[i].r_counter = &done;
		snprintf(msg, sizeof(msg), "tcp-%d", i);
		assert_int_equal(sp_client_send(cl, (const uint8_t *)msg,
		                     strlen(msg), 5000, rec_cb, &r[i]),
		    0);
	}
	assert_true(run_until(fx->fx_loop, &done, 32, 15.0));
	for (i = 0; i < 32; i++) {
		snprintf(msg, sizeof(msg), ">tcp-%d", i);
		assert_int_equal(r[i].r_status, 0);
		assert_string_equal(r[i].r_body, msg);
	}
	sp_client_free(cl);
	atomic_store(&j.rj_stop, 1);
	pthread_join(t, NULL);
	assert_int_equal(j.rj_served, 32);
}

/* Our own ends over TCP: a big frame, then a server restart redialed. */
static void
test_tcp_client_server_restart(void **state)
{
	struct fixture *fx = *state;
	struct sp_server *srv;
	struct sp_client *cl;
	struct rec r = { 0 }, r2 = { 0 };
	char hp[64];
	uint8_t *big;
	ev_tstamp t0;
	int done = 0, seen = 0, port;

	srv = sp_server_new_tcp(fx->fx_loop, "127.0.0.1:0", BIG_LEN + 64,
	    echo_cb, &seen);
	assert_non_null(srv);
	port = sp_server_port(srv);
	snprintf(hp, sizeof(hp), "localhost:%d", port);
	cl = sp_client_new_tcp(fx->fx_loop, hp, 4, BIG_LEN + 64);
	assert_non_null(cl);
	big = malloc(BIG_LEN);
	assert_non_null(big);
	memset(big, 'x', BIG_LEN);
	r.r_counter = &done;
	assert_int_equal(
	    sp_client_send(cl, big, BIG_LEN, IO_TIMEOUT, rec_cb, &r), 0);
	free(big);
	assert_true(run_until(fx->fx_loop, &done, 1, 10.0));
	assert_int_equal(r.r_status, 0);
	assert_int_equal(r.r_len, BIG_LEN + 1);
	assert_true(sp_client_down_secs(cl) == 0.);
	sp_server_free(srv);
	/* The client sees the loss (a request framed before would fail). */
	t0 = ev_time();
	while (sp_client_down_secs(cl) == 0. && ev_time() - t0 < 5.0)
		(void)run_until(fx->fx_loop, &done, 3, 0.02);
	assert_true(sp_client_down_secs(cl) > 0.);
	/* Same port at once (SO_REUSEADDR), the client comes back. */
	snprintf(hp, sizeof(hp), "127.0.0.1:%d", port);
	srv = sp_server_new_tcp(fx->fx_loop, hp, BIG_LEN + 64, echo_cb, &seen);
	assert_non_null(srv);
	r2.r_counter = &done;
	assert_int_equal(sp_client_send(cl, (const uint8_t *)"again", 5,
	                     IO_TIMEOUT, rec_cb, &r2),
	    0);
	assert_true(run_until(fx->fx_loop, &done, 2, 10.0));
	assert_int_equal(r2.r_status, 0);
	assert_string_equal(r2.r_body, ">again");
	assert_int_equal(seen, 2);
	sp_client_free(cl);
	sp_server_free(srv);
}

/* ------------------------------------------------------------------ TLS */

/* A CA, a server certificate for localhost, a client one, a stranger. */
static int
make_certs(const char *d)
{
	char cmd[2048];

	snprintf(cmd, sizeof(cmd),
	    "(cd %s && E='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
	    "-nodes' && "
	    "openssl req -x509 $E -keyout ca.key -out ca.crt "
	    "-subj /CN=sp-test-ca -days 2 && "
	    "openssl req -x509 $E -keyout other.key -out other.crt "
	    "-subj /CN=sp-other-ca -days 2 && "
	    "printf 'subjectAltName=DNS:localhost\\n' > ext.cnf && "
	    "openssl req $E -keyout srv.key -out srv.csr -subj /CN=localhost "
	    "&& "
	    "openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key "
	    "-set_serial 2 -days 2 -extfile ext.cnf -out srv.crt && "
	    "openssl req $E -keyout cli.key -out cli.csr -subj /CN=frontend && "
	    "openssl x509 -req -in cli.csr -CA ca.crt -CAkey ca.key "
	    "-set_serial 3 -days 2 -out cli.crt && "
	    "openssl req $E -keyout bad.key -out bad.csr -subj /CN=stranger && "
	    "openssl x509 -req -in bad.csr -CA other.crt -CAkey other.key "
	    "-set_serial 4 -days 2 -out bad.crt) >/dev/null 2>&1",
	    d);
	return system(cmd);
}

static struct tls_ctx *
tls_client(const char *d, const char *name)
{
	char ca[256], crt[256], key[256];
	const char *cas[2] = { ca, NULL };

	snprintf(ca, sizeof(ca), "%s/ca.crt", d);
	snprintf(crt, sizeof(crt), "%s/%s.crt", d, name);
	snprintf(key, sizeof(key), "%s/%s.key", d, name);
	return tls_ctx_new_client(cas, name != NULL ? crt : NULL,
	    name != NULL ? key : NULL);
}

/*
 * The certificates of make_certs in the fixture's directory and an echo
 * server over tls+tcp:// on a free port that requires a client one; hp
 * gets "localhost:PORT" (the name the server's certificate carries).
 */
static struct sp_server *
tls_echo_server(struct fixture *fx, struct tls_ctx **sctx, int *seen, char *hp,
    size_t hplen)
{
	char crt[256], key[256], ca[256];
	struct sp_server *srv;

	assert_int_equal(make_certs(fx->fx_dir), 0);
	snprintf(crt, sizeof(crt), "%s/srv.crt", fx->fx_dir);
	snprintf(key, sizeof(key), "%s/srv.key", fx->fx_dir);
	snprintf(ca, sizeof(ca), "%s/ca.crt", fx->fx_dir);
	*sctx = tls_ctx_new_server_mutual(crt, key, ca);
	assert_non_null(*sctx);
	srv = sp_server_new_tls(fx->fx_loop, "127.0.0.1:0", *sctx, TEST_MAX,
	    echo_cb, seen);
	assert_non_null(srv);
	snprintf(hp, hplen, "localhost:%d", sp_server_port(srv));
	return srv;
}

static void
tls_certs_remove(struct fixture *fx)
{
	char cmd[256];

	snprintf(cmd, sizeof(cmd),
	    "cd %s && rm -f ca.* other.* srv.* cli.* bad.* ext.cnf",
	    fx->fx_dir);
	assert_int_equal(system(cmd), 0);
}

/*
 * tls+tcp:// with certificates both ways: a known client is answered
 * (small requests and a frame larger than a TLS record); a client with
 * no certificate, or one from another CA, is never heard.
 */
static void
test_tls_mutual(void **state)
{
	struct fixture *fx = *state;
	char crt[256], key[256], hp[64];
	struct tls_ctx *sctx, *good, *anon, *bad;
	struct sp_server *srv;
	struct sp_client *cl, *cl_anon, *cl_bad;
	struct rec r[16], ra = { 0 }, rb = { 0 };
	uint8_t *big;
	char msg[32];
	int i, done = 0, seen = 0;

	srv = tls_echo_server(fx, &sctx, &seen, hp, sizeof(hp));
	snprintf(crt, sizeof(crt), "%s/srv.crt", fx->fx_dir);
	snprintf(key, sizeof(key), "%s/srv.key", fx->fx_dir);
	assert_null(tls_ctx_new_server_mutual(crt, key, NULL));
	good = tls_client(fx->fx_dir, "cli");
	anon = tls_client(fx->fx_dir, NULL);
	bad = tls_client(fx->fx_dir, "bad");
	assert_non_null(good);
	assert_non_null(anon);
	assert_non_null(bad);
	cl = sp_client_new_tls(fx->fx_loop, hp, good, 16, TEST_MAX);
	cl_anon = sp_client_new_tls(fx->fx_loop, hp, anon, 1, TEST_MAX);
	cl_bad = sp_client_new_tls(fx->fx_loop, hp, bad, 1, TEST_MAX);
	assert_non_null(cl);
	assert_non_null(cl_anon);
	assert_non_null(cl_bad);
	memset(r, 0, sizeof(r));
	for (i = 0; i < 15; i++) {
		r[i].r_counter = &done;
		snprintf(msg, sizeof(msg), "tls-%d", i);
		assert_int_equal(sp_client_send(cl, (const uint8_t *)msg,
		                     strlen(msg), IO_TIMEOUT, rec_cb, &r[i]),
		    0);
	}
	big = malloc(TEST_MAX / 2);
	assert_non_null(big);
	memset(big, 'b', TEST_MAX / 2);
	r[15].r_counter = &done;
	assert_int_equal(
	    sp_client_send(cl, big, TEST_MAX / 2, IO_TIMEOUT, rec_cb, &r[15]),
	    0);
	free(big);
	ra.r_counter = rb.r_counter = &done;
	assert_int_equal(sp_client_send(cl_anon, (const uint8_t *)"anon", 4,
	                     1500, rec_cb, &ra),
	    0);
	assert_int_equal(sp_client_send(cl_bad, (const uint8_t *)"bad", 3, 1500,
	                     rec_cb, &rb),
	    0);
	assert_true(run_until(fx->fx_loop, &done, 18, 20.0));
	for (i = 0; i < 15; i++) {
		snprintf(msg, sizeof(msg), ">tls-%d", i);
		assert_int_equal(r[i].r_status, 0);
		assert_string_equal(r[i].r_body, msg);
	}
	assert_int_equal(r[15].r_status, 0);
	assert_int_equal(r[15].r_len, TEST_MAX / 2 + 1);
	assert_int_equal(ra.r_status, NNG_ETIMEDOUT);
	assert_int_equal(rb.r_status, NNG_ETIMEDOUT);
	assert_int_equal(seen, 16);
	sp_client_free(cl);
	sp_client_free(cl_anon);
	sp_client_free(cl_bad);
	sp_server_free(srv);
	tls_ctx_free(good);
	tls_ctx_free(anon);
	tls_ctx_free(bad);
	tls_ctx_free(sctx);
	tls_certs_remove(fx);
}

/*
 * Pipelined frames of mixed sizes over tls+tcp://, wave after wave with
 * silence between them: bytes read ahead of the TLS layer must be
 * delivered without waiting for the fd to signal again, or a wave stalls
 * (nothing else arrives to wake the connection).
 */
static void
test_tls_pipelined_waves(void **state)
{
	struct fixture *fx = *state;
	char hp[64];
	struct tls_ctx *sctx, *cctx;
	struct sp_server *srv;
	struct sp_client *cl;
	struct rec r[32];
	size_t len[32];
	uint8_t *buf;
	unsigned seed = 7;
	int wave, i, done, seen = 0;

	srv = tls_echo_server(fx, &sctx, &seen, hp, sizeof(hp));
	cctx = tls_client(fx->fx_dir, "cli");
	assert_non_null(cctx);
	cl = sp_client_new_tls(fx->fx_loop, hp, cctx, 32, TEST_MAX);
	assert_non_null(cl);
	buf = malloc(70000);
	assert_non_null(buf);
	memset(buf, 'w', 70000);
	for (wave = 0; wave < 60; wave++) {
		done = 0;
		memset(r, 0, sizeof(r));
		for (i = 0; i < 32; i++) {
			/* Mostly small (decisions), some over a record. */
			len[i] = rand_r(&seed) % 8 == 0
			    ? 4000 + (size_t)(rand_r(&seed) % 66000)
			    : 1 + (size_t)(rand_r(&seed) % 300);
			r[i].r_counter = &done;
			assert_int_equal(sp_client_send(cl, buf, len[i],
			                     IO_TIMEOUT, rec_cb, &r[i]),
			    0);
		}
		assert_true(run_until(fx->fx_loop, &done, 32, 3.0));
		for (i = 0; i < 32; i++) {
			assert_int_equal(r[i].r_status, 0);
			assert_int_equal(r[i].r_len, len[i] + 1);
		}
	}
	assert_int_equal(seen, 60 * 32);
	free(buf);
	sp_client_free(cl);
	sp_server_free(srv);
	tls_ctx_free(cctx);
	tls_ctx_free(sctx);
	tls_certs_remove(fx);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_codec),
		cmocka_unit_test_setup_teardown(test_nng_req_to_server, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_nng_contexts_to_server,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(test_client_to_nng_rep, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_kill_backlog, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_kill_handshake, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_kill_wrong_peer, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_kill_mid_send, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_kill_wait_reply, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_kill_mid_reply, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_kill_bad_frame, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_kill_huge_frame, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_restart_mid_batch, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_server_bad_peers, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_client_limits, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_send_from_timeout, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_held_reply, setup,
		    teardown),
		cmocka_unit_test(test_tcp_codec),
		cmocka_unit_test_setup_teardown(test_tcp_nng_req_to_server,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(test_tcp_client_to_nng_rep,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(test_tcp_client_server_restart,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(test_tls_mutual, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_tls_pipelined_waves, setup,
		    teardown),
	};

	log_init("sp_test", LOG_LEVEL_WARN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
