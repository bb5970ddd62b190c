/*
 * e2e_test.c: the broker serving its real sockets in a child process,
 * driven by an nng REQ client: Ping, a malformed message, an add through
 * the worker API, SIGKILL shortly after, and a restarted broker that still
 * has the worker; SIGTERM exits 0 within a second.
 */
#define _XOPEN_SOURCE 700
#include <sys/wait.h>

#include <ftw.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "shared/ipc.h"
#include "shared/log.h"
#include "shared/shm.h"

#include "broker/broker.h"

static char dir[64], run[128], state_dir[128];
static struct broker_settings bs;
static struct broker_startup_worker sw[1] = { { "http://boot:1", 0, -1 } };

static int rm_cb(const char *path, const struct stat *sb, int flag,
    struct FTW *ftw);

static int
rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static void
sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static pid_t
start_broker(void)
{
	struct ev_loop *loop;
	struct broker *br;
	pid_t pid;

	if ((pid = fork()) != 0)
		return pid;
	loop = ev_default_loop(0);
	if ((br = server_new(loop, &bs, true)) == NULL)
		_exit(3);
	ev_run(loop, 0);
	server_free(br);
	_exit(0);
}

/* One request/reply; NULL when the broker did not answer in time. */
static Smg__BrokerReply *
call(nng_socket s, const uint8_t *buf, size_t len)
{
	const char *why;
	Smg__BrokerReply *r;
	void *out;
	size_t olen;
	int rv;

	if ((rv = nng_send(s, (void *)buf, len, 0)) != 0)
		return NULL;
	if ((rv = nng_recv(s, &out, &olen, NNG_FLAG_ALLOC)) != 0)
		return NULL;
	r = ipc_decode_broker(out, olen, &why);
	nng_free(out, olen);
	return r;
}

static Smg__BrokerReply *
call_msg(nng_socket s, Smg__FrontendMsg *m)
{
	Smg__BrokerReply *r;
	uint8_t *buf;
	size_t len;

	m->version = IPC_VERSION;
	buf = ipc_pack_frontend(m, &len);
	r = call(s, buf, len);
	free(buf);
	return r;
}

static nng_socket
client(void)
{
	Smg__FrontendMsg m = SMG__FRONTEND_MSG__INIT;
	Smg__Ping ping = SMG__PING__INIT;
	Smg__BrokerReply *r = NULL;
	nng_socket s;
	char url[256];
	int i;

	assert_int_equal(ipc_url(url, sizeof(url), run, IPC_BROKER_SOCK), 0);
	assert_int_equal(nng_req0_open(&s), 0);
	assert_int_equal(nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 500), 0);
	assert_int_equal(nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 500), 0);
	assert_int_equal(nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, 200),
	    0);
	assert_int_equal(nng_dial(s, url, NULL, NNG_FLAG_NONBLOCK), 0);
	m.body_case = SMG__FRONTEND_MSG__BODY_PING;
	m.ping = &ping;
	/* The broker may still be starting: bounded retries. */
	for (i = 0; i < 40 && r == NULL; i++) {
		if ((r = call_msg(s, &m)) == NULL)
			sleep_ms(100);
	}
	assert_non_null(r);
	assert_int_equal(r->body_case, SMG__BROKER_REPLY__BODY_PONG);
	smg__broker_reply__free_unpacked(r, NULL);
	return s;
}

static Smg__BrokerReply *
admin(nng_socket s, Smg__AdminRequest *a)
{
	Smg__FrontendMsg m = SMG__FRONTEND_MSG__INIT;

	m.body_case = SMG__FRONTEND_MSG__BODY_ADMIN;
	m.admin = a;
	return call_msg(s, &m);
}

static void
test_kill_and_restart(void **unused)
{
	Smg__AdminRequest a = SMG__ADMIN_REQUEST__INIT;
	Smg__WorkerSpec spec = SMG__WORKER_SPEC__INIT;
	Smg__BrokerReply *r;
	static const uint8_t junk[] = { 0x08, 0x01, 0xa2, 0x06, 0xff, 0x7f };
	nng_socket s;
	pid_t pid;
	int st, i;

	(void)unused;
	pid = start_broker();
	s = client();
	/* Malformed input gets an ErrorReply and the broker keeps going. */
	r = call(s, junk, sizeof(junk));
	assert_non_null(r);
	assert_int_equal(r->body_case, SMG__BROKER_REPLY__BODY_ERROR);
	smg__broker_reply__free_unpacked(r, NULL);
	spec.spec_json = "{\"url\":\"http://added:9\",\"models\":[{\"id\":"
			 "\"m1\"}]}";
	a.op_case = SMG__ADMIN_REQUEST__OP_ADD_WORKER;
	a.add_worker = &spec;
	assert_non_null(r = admin(s, &a));
	assert_int_equal(r->body_case, SMG__BROKER_REPLY__BODY_ADMIN);
	assert_int_equal(r->admin->http_status, 202);
	smg__broker_reply__free_unpacked(r, NULL);
	sleep_ms(150);
	kill(pid, SIGKILL);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFSIGNALED(st));
	nng_close(s);

	pid = start_broker();
	s = client();
	a.op_case = SMG__ADMIN_REQUEST__OP_GET_WORKER;
	a.get_worker = "http://added:9";
	assert_non_null(r = admin(s, &a));
	assert_int_equal(r->admin->http_status, 200);
	assert_non_null(strstr(r->admin->body_json, "\"model_id\":\"m1\""));
	smg__broker_reply__free_unpacked(r, NULL);
	a.op_case = SMG__ADMIN_REQUEST__OP_LIST_WORKERS;
	a.list_workers = "";
	assert_non_null(r = admin(s, &a));
	assert_non_null(strstr(r->admin->body_json, "\"total\":2"));
	smg__broker_reply__free_unpacked(r, NULL);
	nng_close(s);
	/* SIGTERM: flush and exit 0 within a second. */
	kill(pid, SIGTERM);
	for (i = 0; i < 20; i++) {
		if (waitpid(pid, &st, WNOHANG) == pid)
			break;
		sleep_ms(50);
	}
	assert_true(i < 20);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kill_and_restart),
	};
	int rc;

	log_init("e2e_test", LOG_LEVEL_WARN);
	snprintf(dir, sizeof(dir), "/tmp/smg-broker-e2e.XXXXXX");
	if (mkdtemp(dir) == NULL)
		return 1;
	snprintf(run, sizeof(run), "%s/run", dir);
	snprintf(state_dir, sizeof(state_dir), "%s/state", dir);
	bs.bs_state_dir = state_dir;
	bs.bs_run_dir = run;
	bs.bs_policy = "round_robin";
	bs.bs_cb_failure_threshold = 10;
	bs.bs_cb_success_threshold = 3;
	bs.bs_cb_timeout_secs = 60;
	bs.bs_health_failure_threshold = 3;
	bs.bs_health_success_threshold = 2;
	bs.bs_drain_settle_secs = 5;
	bs.bs_load_monitor_interval = 10;
	bs.bs_workers = sw;
	bs.bs_nworkers = 1;
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	shm_unlink_segment(run);
	nftw(dir, rm_cb, 8, FTW_DEPTH | FTW_PHYS);
	return rc;
}
