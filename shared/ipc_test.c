/* ipc_test.c: REQ/REP (SP) and PUSH/PULL (nng) on a libev loop, and the codec.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>
#include <ev.h>
#include <nng/nng.h>

#include "shared/ipc.h"
#include "shared/log.h"

#define TEST_BATCH 64

struct fixture {
	char fx_dir[64];
	char fx_url[128];
	struct ev_loop *fx_loop;
};

/* Per-request record the reply callback fills. */
struct reply_rec {
	int rr_done;
	int rr_status;
	char rr_body[64];
	size_t rr_len;
	int *rr_counter;
	double rr_at;
};

struct server_state {
	int ss_mode; /* 0 echo, 1 never reply, 2 decode frontend, 3 echo "x" */
	int ss_seen;
	char ss_last[64];
};

struct pending_server {
	struct fixture *ps_fx;
	struct server_state *ps_state;
	struct ipc_server *ps_srv;
	ev_timer ps_timer;
};

static void
tick_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
}

/* Runs the loop until *count reaches want or secs pass. */
static int
run_until(struct ev_loop *loop, int *count, int want, double secs)
{
	ev_tstamp end;
	ev_timer tick;

	ev_now_update(loop);
	end = ev_time() + secs;
	while (*count < want && ev_time() < end) {
		ev_timer_init(&tick, tick_cb, 0.01, 0);
		ev_timer_start(loop, &tick);
		ev_run(loop, EVRUN_ONCE);
		ev_timer_stop(loop, &tick);
	}
	return *count >= want;
}

/* Runs the loop until the client has no connection, or secs pass. */
static int
run_until_down(struct ev_loop *loop, struct ipc_client *cl, double secs)
{
	int never = 0;

	while (ipc_client_down_secs(cl) == 0. && secs > 0) {
		(void)run_until(loop, &never, 1, 0.02);
		secs -= 0.02;
	}
	return ipc_client_down_secs(cl) > 0.;
}

static void
server_cb(void *arg, const uint8_t *msg, size_t len, uint8_t **reply,
    size_t *reply_len)
{
	struct server_state *ss = arg;
	Smg__FrontendMsg *fm;
	Smg__BrokerReply br = SMG__BROKER_REPLY__INIT;
	Smg__Pong pong = SMG__PONG__INIT;
	const char *why;
	size_t n;

	ss->ss_seen++;
	n = len < sizeof(ss->ss_last) - 1 ? len : sizeof(ss->ss_last) - 1;
	memcpy(ss->ss_last, msg, n);
	ss->ss_last[n] = '\0';
	if (reply == NULL)
		return; /* PULL */
	switch (ss->ss_mode) {
	case 0:
		*reply = malloc(len + 1);
		assert_non_null(*reply);
		(*reply)[0] = '>';
		memcpy(*reply + 1, msg, len);
		*reply_len = len + 1;
		break;
	case 1:
		break;
	case 3:
		if (len == 1 && msg[0] == 'x') {
			*reply = malloc(1);
			assert_non_null(*reply);
			(*reply)[0] = 'x';
			*reply_len = 1;
		}
		break;
	default:
		if ((fm = ipc_decode_frontend(msg, len, &why)) == NULL) {
			*reply =
			    ipc_pack_error(why, "cannot decode", reply_len);
			break;
		}
		pong.broker_pid = 42;
		br.body_case = SMG__BROKER_REPLY__BODY_PONG;
		br.pong = &pong;
		*reply = ipc_pack_broker(&br, reply_len);
		smg__frontend_msg__free_unpacked(fm, NULL);
		break;
	}
}

static void
reply_cb(void *arg, int status, const uint8_t *reply, size_t len)
{
	struct reply_rec *rr = arg;
	size_t n;

	rr->rr_done++;
	rr->rr_status = status;
	rr->rr_at = ev_time();
	if (status == 0) {
		assert_non_null(reply);
		n = len < sizeof(rr->rr_body) - 1 ? len
		                                  : sizeof(rr->rr_body) - 1;
		memcpy(rr->rr_body, reply, n);
		rr->rr_body[n] = '\0';
		rr->rr_len = len;
	} else {
		assert_null(reply);
	}
	if (rr->rr_counter != NULL)
		(*rr->rr_counter)++;
}

static int
setup(void **state)
{
	struct fixture *fx;

	fx = calloc(1, sizeof(*fx));
	assert_non_null(fx);
	snprintf(fx->fx_dir, sizeof(fx->fx_dir), "/tmp/ipc_test.XXXXXX");
	assert_non_null(mkdtemp(fx->fx_dir));
	assert_int_equal(ipc_url(fx->fx_url, sizeof(fx->fx_url), fx->fx_dir,
	                     IPC_BROKER_SOCK),
	    0);
	fx->fx_loop = ev_loop_new(EVFLAG_AUTO);
	assert_non_null(fx->fx_loop);
	*state = fx;
	return 0;
}

static int
teardown(void **state)
{
	struct fixture *fx = *state;
	char path[128];

	snprintf(path, sizeof(path), "%s/%s", fx->fx_dir, IPC_BROKER_SOCK);
	unlink(path);
	snprintf(path, sizeof(path), "%s/stale.ipc", fx->fx_dir);
	unlink(path);
	rmdir(fx->fx_dir);
	ev_loop_destroy(fx->fx_loop);
	free(fx);
	return 0;
}

static int
send_str(struct ipc_client *cl, const char *s, unsigned timeout_ms,
    struct reply_rec *rr)
{
	return ipc_client_send(cl, (const uint8_t *)s, strlen(s), timeout_ms,
	    reply_cb, rr);
}

static void
test_url(void **state)
{
	char buf[24], big[512];
	char longdir[200];

	(void)state;
	assert_int_equal(ipc_url(buf, sizeof(buf), "/tmp/a", "b.ipc"), 0);
	assert_string_equal(buf, "ipc:///tmp/a/b.ipc");
	assert_int_equal(ipc_url(buf, sizeof(buf), "/tmp/abcdefgh", "b.ipc"),
	    -1);
	memset(longdir, 'x', sizeof(longdir) - 1);
	longdir[0] = '/';
	longdir[sizeof(longdir) - 1] = '\0';
	assert_int_equal(ipc_url(big, sizeof(big), longdir, "b.ipc"), -1);
}

static void
test_round_trip(void **state)
{
	struct fixture *fx = *state;
	struct server_state ss = { .ss_mode = 0 };
	struct reply_rec rr = { 0 };
	struct ipc_server *srv;
	struct ipc_client *cl;

	srv = ipc_server_new(fx->fx_loop, fx->fx_url, IPC_SERVER_REP, server_cb,
	    &ss);
	assert_non_null(srv);
	cl = ipc_client_new(fx->fx_loop, fx->fx_url, IPC_CLIENT_REQ, 4);
	assert_non_null(cl);
	assert_int_equal(send_str(cl, "hello", 3000, &rr), 0);
	assert_int_equal(ipc_client_inflight(cl), 1);
	assert_true(run_until(fx->fx_loop, &rr.rr_done, 1, 5.0));
	assert_int_equal(rr.rr_status, 0);
	assert_string_equal(rr.rr_body, ">hello");
	assert_string_equal(ss.ss_last, "hello");
	assert_int_equal(ipc_client_inflight(cl), 0);
	ipc_client_free(cl);
	ipc_server_free(srv);
}

static void
test_concurrent(void **state)
{
	struct fixture *fx = *state;
	struct server_state ss = { .ss_mode = 0 };
	struct reply_rec rr[TEST_BATCH + 1];
	struct ipc_server *srv;
	struct ipc_client *cl;
	char msg[32], want[32];
	int i, done = 0, round;

	srv = ipc_server_new(fx->fx_loop, fx->fx_url, IPC_SERVER_REP, server_cb,
	    &ss);
	assert_non_null(srv);
	cl =
	    ipc_client_new(fx->fx_loop, fx->fx_url, IPC_CLIENT_REQ, TEST_BATCH);
	assert_non_null(cl);
	/* Two rounds: the second reuses every context. */
	for (round = 0; round < 2; round++) {
		memset(rr, 0, sizeof(rr));
		done = 0;
		for (i = 0; i < TEST_BATCH; i++) {
			rr[i].rr_counter = &done;
			snprintf(msg, sizeof(msg), "req-%d-%d", round, i);
			assert_int_equal(send_str(cl, msg, 5000, &rr[i]), 0);
		}
		/* Every context busy: the next send is refused. */
		assert_int_equal(send_str(cl, "extra", 5000, &rr[TEST_BATCH]),
		    -1);
		assert_int_equal(ipc_client_inflight(cl), TEST_BATCH);
		assert_true(run_until(fx->fx_loop, &done, TEST_BATCH, 10.0));
		for (i = 0; i < TEST_BATCH; i++) {
			snprintf(want, sizeof(want), ">req-%d-%d", round, i);
			assert_int_equal(rr[i].rr_done, 1);
			assert_int_equal(rr[i].rr_status, 0);
			assert_string_equal(rr[i].rr_body, want);
		}
		assert_int_equal(rr[TEST_BATCH].rr_done, 0);
	}
	assert_int_equal(ss.ss_seen, 2 * TEST_BATCH);
	ipc_client_free(cl);
	ipc_server_free(srv);
}

/* Many clients (frontends) against one server, all at once. */
static void
test_many_clients(void **state)
{
	struct fixture *fx = *state;
	struct server_state ss = { .ss_mode = 0 };
	struct reply_rec rr[4][16];
	struct ipc_client *cl[4];
	struct ipc_server *srv;
	char msg[32];
	int c, i, done = 0;

	srv = ipc_server_new(fx->fx_loop, fx->fx_url, IPC_SERVER_REP, server_cb,
	    &ss);
	assert_non_null(srv);
	memset(rr, 0, sizeof(rr));
	for (c = 0; c < 4; c++) {
		cl[c] =
		    ipc_client_new(fx->fx_loop, fx->fx_url, IPC_CLIENT_REQ, 16);
		assert_non_null(cl[c]);
		for (i = 0; i < 16; i++) {
			rr[c][i].rr_counter = &done;
			snprintf(msg, sizeof(msg), "c%d-%d", c, i);
			assert_int_equal(send_str(cl[c], msg, 5000, &rr[c][i]),
			    0);
		}
	}
	assert_true(run_until(fx->fx_loop, &done, 64, 10.0));
	for (c = 0; c < 4; c++) {
		for (i = 0; i < 16; i++) {
			snprintf(msg, sizeof(msg), ">c%d-%d", c, i);
			assert_string_equal(rr[c][i].rr_body, msg);
		}
		ipc_client_free(cl[c]);
	}
	ipc_server_free(srv);
}

static void
test_timeout(void **state)
{
	struct fixture *fx = *state;
	struct server_state ss = { .ss_mode = 1 };
	struct reply_rec rr = { 0 }, rr2 = { 0 };
	struct ipc_server *srv;
	struct ipc_client *cl;
	double start;

	srv = ipc_server_new(fx->fx_loop, fx->fx_url, IPC_SERVER_REP, server_cb,
	    &ss);
	assert_non_null(srv);
	cl = ipc_client_new(fx->fx_loop, fx->fx_url, IPC_CLIENT_REQ, 2);
	assert_non_null(cl);
	start = ev_time();
	assert_int_equal(send_str(cl, "silence", 300, &rr), 0);
	assert_true(run_until(fx->fx_loop, &rr.rr_done, 1, 5.0));
	assert_int_equal(rr.rr_status, NNG_ETIMEDOUT);
	assert_true(rr.rr_at - start >= 0.25);
	assert_true(rr.rr_at - start < 1.3);
	assert_int_equal(ss.ss_seen, 1);
	assert_int_equal(ipc_client_inflight(cl), 0);

	/* The context is reusable, and a late reply cannot confuse it. */
	ss.ss_mode = 0;
	assert_int_equal(send_str(cl, "again", 3000, &rr2), 0);
	assert_true(run_until(fx->fx_loop, &rr2.rr_done, 1, 5.0));
	assert_int_equal(rr2.rr_status, 0);
	assert_string_equal(rr2.rr_body, ">again");
	ipc_client_free(cl);
	ipc_server_free(srv);
}

/* Without any server at all the deadline still holds. */
static void
test_timeout_no_server(void **state)
{
	struct fixture *fx = *state;
	struct reply_rec rr = { 0 };
	struct ipc_client *cl;
	double start;

	cl = ipc_client_new(fx->fx_loop, fx->fx_url, IPC_CLIENT_REQ, 2);
	assert_non_null(cl);
	start = ev_time();
	assert_int_equal(send_str(cl, "nobody", 200, &rr), 0);
	assert_true(run_until(fx->fx_loop, &rr.rr_done, 1, 5.0));
	assert_int_equal(rr.rr_status, NNG_ETIMEDOUT);
	assert_true(rr.rr_at - start < 1.2);
	ipc_client_free(cl);
}

static void
start_server_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct pending_server *ps;

	(void)revents;
	ps = (struct pending_server *)(void *)((char *)w -
	    offsetof(struct pending_server, ps_timer));
	ps->ps_srv = ipc_server_new(loop, ps->ps_fx->fx_url, IPC_SERVER_REP,
	    server_cb, ps->ps_state);
}

static void
test_client_first(void **state)
{
	struct fixture *fx = *state;
	struct server_state ss = { .ss_mode = 0 };
	struct pending_server ps = { .ps_fx = fx, .ps_state = &ss };
	struct reply_rec rr = { 0 };
	struct ipc_client *cl;

	cl = ipc_client_new(fx->fx_loop, fx->fx_url, IPC_CLIENT_REQ, 4);
	assert_non_null(cl);
	assert_int_equal(send_str(cl, "early", 4000, &rr), 0);
	ev_timer_init(&ps.ps_timer, start_server_cb, 0.3, 0);
	ev_timer_start(fx->fx_loop, &ps.ps_timer);
	assert_true(run_until(fx->fx_loop, &rr.rr_done, 1, 6.0));
	assert_non_null(ps.ps_srv);
	assert_int_equal(rr.rr_status, 0);
	assert_string_equal(rr.rr_body, ">early");
	ipc_client_free(cl);
	ipc_server_free(ps.ps_srv);
}

static void
test_server_restart(void **state)
{
	struct fixture *fx = *state;
	struct server_state ss = { .ss_mode = 0 };
	struct reply_rec rr = { 0 }, rr2 = { 0 };
	struct ipc_server *srv;
	struct ipc_client *cl;

	srv = ipc_server_new(fx->fx_loop, fx->fx_url, IPC_SERVER_REP, server_cb,
	    &ss);
	assert_non_null(srv);
	cl = ipc_client_new(fx->fx_loop, fx->fx_url, IPC_CLIENT_REQ, 4);
	assert_non_null(cl);
	assert_int_equal(send_str(cl, "one", 3000, &rr), 0);
	assert_true(run_until(fx->fx_loop, &rr.rr_done, 1, 5.0));
	assert_string_equal(rr.rr_body, ">one");

	ipc_server_free(srv);
	/* The client notices the loss, then redials the new server. */
	assert_true(run_until_down(fx->fx_loop, cl, 5.0));
	srv = ipc_server_new(fx->fx_loop, fx->fx_url, IPC_SERVER_REP, server_cb,
	    &ss);
	assert_non_null(srv);
	assert_int_equal(send_str(cl, "two", 4000, &rr2), 0);
	assert_true(run_until(fx->fx_loop, &rr2.rr_done, 1, 6.0));
	assert_int_equal(rr2.rr_status, 0);
	assert_string_equal(rr2.rr_body, ">two");
	ipc_client_free(cl);
	ipc_server_free(srv);
}

static void
test_listen_conflicts(void **state)
{
	struct fixture *fx = *state;
	struct server_state ss = { .ss_mode = 0 };
	struct ipc_server *srv, *srv2;
	struct sockaddr_un sun;
	char url[128];
	int fd;

	/* A live listener is never stolen. */
	srv = ipc_server_new(fx->fx_loop, fx->fx_url, IPC_SERVER_REP, server_cb,
	    &ss);
	assert_non_null(srv);
	srv2 = ipc_server_new(fx->fx_loop, fx->fx_url, IPC_SERVER_PULL,
	    server_cb, &ss);
	assert_null(srv2);
	ipc_server_free(srv);

	/* A socket file nobody listens on is removed. */
	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s/stale.ipc",
	    fx->fx_dir);
	fd = socket(AF_UNIX, SOCK_STREAM, 0);
	assert_true(fd != -1);
	assert_int_equal(bind(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
	close(fd);
	assert_int_equal(access(sun.sun_path, F_OK), 0);
	assert_int_equal(ipc_url(url, sizeof(url), fx->fx_dir, "stale.ipc"), 0);
	srv = ipc_server_new(fx->fx_loop, url, IPC_SERVER_REP, server_cb, &ss);
	assert_non_null(srv);
	ipc_server_free(srv);
}

static void
test_push_pull(void **state)
{
	struct fixture *fx = *state;
	struct server_state ss = { .ss_mode = 0 };
	struct ipc_server *srv;
	struct ipc_client *cl;
	char msg[32];
	int i;

	srv = ipc_server_new(fx->fx_loop, fx->fx_url, IPC_SERVER_PULL,
	    server_cb, &ss);
	assert_non_null(srv);
	cl = ipc_client_new(fx->fx_loop, fx->fx_url, IPC_CLIENT_PUSH, 0);
	assert_non_null(cl);
	for (i = 0; i < 50; i++) {
		snprintf(msg, sizeof(msg), "report-%d", i);
		assert_int_equal(ipc_client_send(cl, (const uint8_t *)msg,
		                     strlen(msg), 1000, NULL, NULL),
		    0);
	}
	assert_int_equal(ipc_client_inflight(cl), 0);
	assert_true(run_until(fx->fx_loop, &ss.ss_seen, 50, 5.0));
	assert_int_equal(ss.ss_seen, 50);
	assert_string_equal(ss.ss_last, "report-49");
	ipc_client_free(cl);
	ipc_server_free(srv);
}

/* Without a peer the PUSH queue fills and then refuses. */
static void
test_push_queue_full(void **state)
{
	struct fixture *fx = *state;
	struct ipc_client *cl;
	int i, refused = 0;

	cl = ipc_client_new(fx->fx_loop, fx->fx_url, IPC_CLIENT_PUSH, 0);
	assert_non_null(cl);
	for (i = 0; i < 5000 && !refused; i++)
		if (ipc_client_send(cl, (const uint8_t *)"x", 1, 0, NULL,
		        NULL) == -1)
			refused = 1;
	assert_true(refused);
	ipc_client_free(cl);
}

static void
test_free_cancels(void **state)
{
	struct fixture *fx = *state;
	struct server_state ss = { .ss_mode = 1 };
	struct reply_rec rr[8];
	struct ipc_server *srv;
	struct ipc_client *cl;
	int i, done = 0;

	srv = ipc_server_new(fx->fx_loop, fx->fx_url, IPC_SERVER_REP, server_cb,
	    &ss);
	assert_non_null(srv);
	cl = ipc_client_new(fx->fx_loop, fx->fx_url, IPC_CLIENT_REQ, 8);
	assert_non_null(cl);
	memset(rr, 0, sizeof(rr));
	for (i = 0; i < 8; i++) {
		rr[i].rr_counter = &done;
		assert_int_equal(send_str(cl, "pending", 10000, &rr[i]), 0);
	}
	assert_true(run_until(fx->fx_loop, &ss.ss_seen, 8, 5.0));
	ipc_client_free(cl);
	assert_int_equal(done, 8);
	for (i = 0; i < 8; i++) {
		assert_int_equal(rr[i].rr_done, 1);
		assert_int_equal(rr[i].rr_status, NNG_ECLOSED);
	}
	ipc_server_free(srv);
}

struct free_in_cb {
	struct ipc_client *fc_cl;
	int fc_calls;
	int fc_closed;
};

static void
free_in_cb_reply(void *arg, int status, const uint8_t *reply, size_t len)
{
	struct free_in_cb *fc = arg;

	(void)reply;
	(void)len;
	fc->fc_calls++;
	if (status == NNG_ECLOSED)
		fc->fc_closed++;
	ipc_client_free(fc->fc_cl);
}

/* Freeing the client from its own callback is safe. */
static void
test_free_from_callback(void **state)
{
	struct fixture *fx = *state;
	struct server_state ss = { .ss_mode = 3 };
	struct free_in_cb fc = { 0 };
	struct ipc_server *srv;
	int i;

	/* Only "x" is answered: the three others are still waiting. */
	srv = ipc_server_new(fx->fx_loop, fx->fx_url, IPC_SERVER_REP, server_cb,
	    &ss);
	assert_non_null(srv);
	fc.fc_cl = ipc_client_new(fx->fx_loop, fx->fx_url, IPC_CLIENT_REQ, 4);
	assert_non_null(fc.fc_cl);
	for (i = 0; i < 3; i++)
		assert_int_equal(ipc_client_send(fc.fc_cl,
		                     (const uint8_t *)"hold", 4, 5000,
		                     free_in_cb_reply, &fc),
		    0);
	assert_true(run_until(fx->fx_loop, &ss.ss_seen, 3, 5.0));
	assert_int_equal(ipc_client_send(fc.fc_cl, (const uint8_t *)"x", 1,
	                     5000, free_in_cb_reply, &fc),
	    0);
	assert_true(run_until(fx->fx_loop, &fc.fc_calls, 4, 5.0));
	assert_int_equal(fc.fc_calls, 4);
	/* The answer freed the client; the three others were cancelled. */
	assert_int_equal(fc.fc_closed, 3);
	ipc_server_free(srv);
}

static void
test_codec(void **state)
{
	Smg__FrontendMsg fm = SMG__FRONTEND_MSG__INIT;
	Smg__Ping ping = SMG__PING__INIT;
	Smg__PollerMsg pm = SMG__POLLER_MSG__INIT;
	Smg__FrontendMsg *out;
	Smg__BrokerReply *br;
	Smg__PollerMsg *pout;
	const uint8_t garbage[] = { 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01, 0x02 };
	const char *why;
	uint8_t *buf;
	size_t len;

	(void)state;
	ping.frontend_slot = 3;
	ping.pid = 1234;
	fm.body_case = SMG__FRONTEND_MSG__BODY_PING;
	fm.ping = &ping;
	buf = ipc_pack_frontend(&fm, &len);
	assert_non_null(buf);
	out = ipc_decode_frontend(buf, len, &why);
	assert_non_null(out);
	assert_null(why);
	assert_int_equal(out->version, IPC_VERSION);
	assert_int_equal(out->body_case, SMG__FRONTEND_MSG__BODY_PING);
	assert_int_equal(out->ping->frontend_slot, 3);
	assert_int_equal(out->ping->pid, 1234);
	smg__frontend_msg__free_unpacked(out, NULL);

	/* Oversized: rejected on length alone, before reading. */
	assert_null(ipc_decode_frontend(buf, (size_t)IPC_MAX_MSG + 1, &why));
	assert_string_equal(why, "too_large");
	free(buf);

	assert_null(ipc_decode_frontend(garbage, sizeof(garbage), &why));
	assert_string_equal(why, "malformed");
	assert_null(ipc_decode_broker(garbage, sizeof(garbage), &why));
	assert_string_equal(why, "malformed");
	assert_null(ipc_decode_poller(garbage, sizeof(garbage), &why));
	assert_string_equal(why, "malformed");

	/* Wrong version: pack, then patch the version field (tag 1). */
	buf = ipc_pack_frontend(&fm, &len);
	assert_non_null(buf);
	assert_int_equal(buf[0], 0x08);
	buf[1] = IPC_VERSION + 1;
	assert_null(ipc_decode_frontend(buf, len, &why));
	assert_string_equal(why, "version");
	free(buf);

	/* No body. */
	fm.body_case = SMG__FRONTEND_MSG__BODY__NOT_SET;
	buf = ipc_pack_frontend(&fm, &len);
	assert_non_null(buf);
	assert_null(ipc_decode_frontend(buf, len, &why));
	assert_string_equal(why, "empty");
	free(buf);
	/* Zero bytes: version 0. */
	assert_null(ipc_decode_frontend(NULL, 0, &why));
	assert_string_equal(why, "version");

	pm.body_case = SMG__POLLER_MSG__BODY_PING;
	pm.ping = &ping;
	buf = ipc_pack_poller(&pm, &len);
	assert_non_null(buf);
	pout = ipc_decode_poller(buf, len, NULL);
	assert_non_null(pout);
	assert_int_equal(pout->ping->pid, 1234);
	smg__poller_msg__free_unpacked(pout, NULL);
	free(buf);

	buf = ipc_pack_error("unknown", "no such body", &len);
	assert_non_null(buf);
	br = ipc_decode_broker(buf, len, &why);
	assert_non_null(br);
	assert_int_equal(br->body_case, SMG__BROKER_REPLY__BODY_ERROR);
	assert_string_equal(br->error->code, "unknown");
	assert_string_equal(br->error->message, "no such body");
	smg__broker_reply__free_unpacked(br, NULL);
	free(buf);
}

static void
test_garbage_keeps_serving(void **state)
{
	struct fixture *fx = *state;
	struct server_state ss = { .ss_mode = 2 };
	Smg__FrontendMsg fm = SMG__FRONTEND_MSG__INIT;
	Smg__Ping ping = SMG__PING__INIT;
	struct reply_rec rr[3];
	struct ipc_server *srv;
	struct ipc_client *cl;
	Smg__BrokerReply *br;
	const uint8_t garbage[] = { 0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f };
	uint8_t *buf;
	size_t len;
	int done = 0;

	srv = ipc_server_new(fx->fx_loop, fx->fx_url, IPC_SERVER_REP, server_cb,
	    &ss);
	assert_non_null(srv);
	cl = ipc_client_new(fx->fx_loop, fx->fx_url, IPC_CLIENT_REQ, 4);
	assert_non_null(cl);
	memset(rr, 0, sizeof(rr));
	rr[0].rr_counter = rr[1].rr_counter = rr[2].rr_counter = &done;
	assert_int_equal(ipc_client_send(cl, garbage, sizeof(garbage), 3000,
	                     reply_cb, &rr[0]),
	    0);
	assert_int_equal(
	    ipc_client_send(cl, (const uint8_t *)"", 0, 3000, reply_cb, &rr[1]),
	    0);
	fm.body_case = SMG__FRONTEND_MSG__BODY_PING;
	fm.ping = &ping;
	buf = ipc_pack_frontend(&fm, &len);
	assert_non_null(buf);
	assert_int_equal(ipc_client_send(cl, buf, len, 3000, reply_cb, &rr[2]),
	    0);
	free(buf);
	assert_true(run_until(fx->fx_loop, &done, 3, 5.0));

	br = ipc_decode_broker((uint8_t *)rr[0].rr_body, rr[0].rr_len, NULL);
	assert_non_null(br);
	assert_int_equal(br->body_case, SMG__BROKER_REPLY__BODY_ERROR);
	assert_string_equal(br->error->code, "malformed");
	smg__broker_reply__free_unpacked(br, NULL);
	br = ipc_decode_broker((uint8_t *)rr[1].rr_body, rr[1].rr_len, NULL);
	assert_non_null(br);
	assert_string_equal(br->error->code, "version");
	smg__broker_reply__free_unpacked(br, NULL);
	br = ipc_decode_broker((uint8_t *)rr[2].rr_body, rr[2].rr_len, NULL);
	assert_non_null(br);
	assert_int_equal(br->body_case, SMG__BROKER_REPLY__BODY_PONG);
	assert_int_equal(br->pong->broker_pid, 42);
	smg__broker_reply__free_unpacked(br, NULL);
	ipc_client_free(cl);
	ipc_server_free(srv);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_url),
		cmocka_unit_test(test_codec),
		cmocka_unit_test_setup_teardown(test_round_trip, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_concurrent, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_many_clients, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_timeout, setup, teardown),
		cmocka_unit_test_setup_teardown(test_timeout_no_server, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_client_first, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_server_restart, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_listen_conflicts, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_push_pull, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_push_queue_full, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_free_cancels, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_free_from_callback, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_garbage_keeps_serving,
		    setup, teardown),
	};

	log_init("ipc_test", LOG_LEVEL_WARN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
