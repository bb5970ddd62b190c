/*
 * e2e_test.c: the smg-broker binary (next to the test's build folder)
 * serving its real sockets in a child process, driven by an nng REQ client:
 * Ping, a malformed message, an add through the worker API, SIGKILL shortly
 * after, and a restarted broker that still has the worker; SIGTERM exits 0
 * within a second.
 */
#define _XOPEN_SOURCE 700
#include <sys/wait.h>

#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
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

#include "broker/broker_testutil.h"

static char dir[BTU_DIR_SIZE], run[BTU_PATH_SIZE], state_dir[BTU_PATH_SIZE];
static char broker_bin[4096];

static void
sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* Forks and execs the binary (nng must not be used across fork). */
static pid_t
start_broker(void)
{
	char *argv[] = { broker_bin, "--policy", "round_robin", "--worker-urls",
		"http://boot:1", "--state-dir", state_dir, "--run-dir", run,
		"--log-level", "info", NULL };
	char log[192];
	pid_t pid;
	int fd;

	if ((pid = fork()) != 0)
		return pid;
	snprintf(log, sizeof(log), "%s/broker.log", dir);
	if ((fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600)) != -1) {
		dup2(fd, 1);
		dup2(fd, 2);
	}
	execv(broker_bin, argv);
	_exit(127);
}

static bool
log_has(const char *needle)
{
	char path[192], line[1024];
	bool found = false;
	FILE *fp;

	snprintf(path, sizeof(path), "%s/broker.log", dir);
	if ((fp = fopen(path, "r")) == NULL)
		return false;
	while (!found && fgets(line, sizeof(line), fp) != NULL)
		found = strstr(line, needle) != NULL;
	fclose(fp);
	return found;
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
	assert_int_equal(nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, 200), 0);
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
	assert_true(log_has("smg-broker: serving ipc://"));
	assert_true(log_has("1 workers, policy round_robin, state"));
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
	assert_true(log_has("frontend message rejected: malformed"));
	assert_false(log_has("AddressSanitizer"));
	assert_false(log_has("runtime error"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kill_and_restart),
	};
	char *slash;
	ssize_t n;
	int rc;

	log_init("e2e_test", LOG_LEVEL_WARN);
	if (btu_dir_make(dir, run, state_dir, "broker-e2e") == -1)
		return 1;
	/* The binary is at the build root, the test in <build>/broker. */
	n = readlink("/proc/self/exe", broker_bin, sizeof(broker_bin) - 32);
	if (n <= 0)
		return 1;
	broker_bin[n] = '\0';
	if ((slash = strrchr(broker_bin, '/')) == NULL)
		return 1;
	strcpy(slash, "/../smg-broker");
	if (access(broker_bin, X_OK) == -1) {
		fprintf(stderr, "%s not built\n", broker_bin);
		return 1;
	}
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	btu_dir_remove(dir, run);
	return rc;
}
