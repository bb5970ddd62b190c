/*
 * http_client_test.c: the poller's HTTP client against a small HTTP server
 * running on the same libev loop (2xx, 404, chunked, close-delimited,
 * truncation, bearer key, garbage, timeout, refused, bad URL, cancel).
 */
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "poller/poller.h"

struct tsrv {
	struct ev_loop *ts_loop;
	int ts_fd;
	int ts_port;
	ev_io ts_io;
	int ts_held[8]; /* connections left unanswered (/slow) */
	int ts_nheld;
};

struct tconn {
	struct tsrv *tc_srv;
	int tc_fd;
	ev_io tc_io;
	char tc_buf[4096];
	size_t tc_len;
};

struct tres {
	bool tr_done;
	enum http_client_error tr_error;
	int tr_status;
	char tr_body[16384];
	size_t tr_len;
	bool tr_truncated;
};

static struct tsrv srv;

static void
send_all(int fd, const char *s, size_t len)
{
	ssize_t n;

	while (len > 0) {
		n = send(fd, s, len, MSG_NOSIGNAL);
		if (n == -1 && errno == EINTR)
			continue;
		if (n <= 0)
			return;
		s += n;
		len -= (size_t)n;
	}
}

static void
respond(struct tconn *c)
{
	static char big[10000 + 200];
	const char *req = c->tc_buf, *r;
	char line[256];

	if (strncmp(req, "GET /ok ", 8) == 0)
		r = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
		    "Content-Length: 11\r\n\r\n{\"ok\":true}";
	else if (strncmp(req, "GET /missing ", 13) == 0)
		r = "HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\n"
		    "not found";
	else if (strncmp(req, "GET /chunked ", 13) == 0)
		r = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
		    "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
	else if (strncmp(req, "GET /eof ", 9) == 0)
		r = "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil eof";
	else if (strncmp(req, "GET /garbage ", 13) == 0)
		r = "NOT HTTP AT ALL\r\n\r\n";
	else if (strncmp(req, "GET /auth ", 10) == 0)
		r = strstr(req, "\r\nAuthorization: Bearer sekrit\r\n") != NULL
		    ? "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nyes"
		    : "HTTP/1.1 401 Unauthorized\r\nContent-Length: "
		      "2\r\n\r\nno";
	else if (strncmp(req, "GET /query?a=1&b=2 ", 19) == 0)
		r = "HTTP/1.1 204 No Content\r\n\r\n";
	else if (strncmp(req, "GET /big ", 9) == 0) {
		snprintf(big, sizeof(big),
		    "HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n\r\n");
		memset(big + strlen(big), 'x', 10000);
		send_all(c->tc_fd, big, strlen(big));
		r = NULL;
	} else if (strncmp(req, "GET /slow ", 10) == 0) {
		if (srv.ts_nheld < 8) {
			srv.ts_held[srv.ts_nheld++] = c->tc_fd;
			c->tc_fd = -1;
		}
		return;
	} else {
		snprintf(line, sizeof(line),
		    "HTTP/1.1 500 Unexpected\r\nContent-Length: 0\r\n\r\n");
		r = line;
	}
	if (r != NULL)
		send_all(c->tc_fd, r, strlen(r));
}

static void
conn_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct tconn *c = w->data;
	ssize_t n;

	(void)revents;
	n = recv(c->tc_fd, c->tc_buf + c->tc_len,
	    sizeof(c->tc_buf) - 1 - c->tc_len, 0);
	if (n > 0) {
		c->tc_len += (size_t)n;
		c->tc_buf[c->tc_len] = '\0';
		if (strstr(c->tc_buf, "\r\n\r\n") == NULL &&
		    c->tc_len < sizeof(c->tc_buf) - 1)
			return;
		respond(c);
	}
	ev_io_stop(loop, w);
	if (c->tc_fd != -1)
		close(c->tc_fd);
	free(c);
}

static void
accept_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct tconn *c;
	int fd;

	(void)revents;
	if ((fd = accept(w->fd, NULL, NULL)) == -1)
		return;
	c = calloc(1, sizeof(*c));
	assert_non_null(c);
	c->tc_srv = &srv;
	c->tc_fd = fd;
	ev_io_init(&c->tc_io, conn_cb, fd, EV_READ);
	c->tc_io.data = c;
	ev_io_start(loop, &c->tc_io);
}

static int
setup(void **state)
{
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	int one = 1;

	(void)state;
	memset(&srv, 0, sizeof(srv));
	srv.ts_loop = ev_default_loop(0);
	srv.ts_fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(srv.ts_fd >= 0);
	setsockopt(srv.ts_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(srv.ts_fd, (struct sockaddr *)&sa, sizeof(sa)),
	    0);
	assert_int_equal(listen(srv.ts_fd, 16), 0);
	assert_int_equal(getsockname(srv.ts_fd, (struct sockaddr *)&sa, &sl),
	    0);
	srv.ts_port = ntohs(sa.sin_port);
	ev_io_init(&srv.ts_io, accept_cb, srv.ts_fd, EV_READ);
	ev_io_start(srv.ts_loop, &srv.ts_io);
	return 0;
}

static int
teardown(void **state)
{
	int i;

	(void)state;
	ev_io_stop(srv.ts_loop, &srv.ts_io);
	close(srv.ts_fd);
	for (i = 0; i < srv.ts_nheld; i++)
		close(srv.ts_held[i]);
	return 0;
}

static void
done_cb(void *arg, const struct http_client_result *res)
{
	struct tres *t = arg;

	t->tr_done = true;
	t->tr_error = res->hr_error;
	t->tr_status = res->hr_status;
	t->tr_truncated = res->hr_truncated;
	assert_non_null(res->hr_body);
	assert_true(res->hr_body_len < sizeof(t->tr_body));
	memcpy(t->tr_body, res->hr_body, res->hr_body_len + 1);
	t->tr_len = res->hr_body_len;
	ev_break(srv.ts_loop, EVBREAK_ALL);
}

static void
guard_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)w;
	(void)revents;
	ev_break(loop, EVBREAK_ALL);
}

/* Runs one GET to completion (or the guard's 5 s); returns elapsed s. */
static double
run_get(struct tres *t, const char *base, const char *path, const char *key,
    double timeout, size_t body_max)
{
	struct http_client_req *r;
	ev_timer guard;
	ev_tstamp start;

	memset(t, 0, sizeof(*t));
	ev_now_update(srv.ts_loop);
	start = ev_now(srv.ts_loop);
	r = http_client_get(srv.ts_loop, NULL, base, path, key, timeout,
	    body_max, done_cb, t);
	assert_non_null(r);
	/* Never called back before returning. */
	assert_false(t->tr_done);
	ev_timer_init(&guard, guard_cb, 5., 0.);
	ev_timer_start(srv.ts_loop, &guard);
	ev_run(srv.ts_loop, 0);
	ev_timer_stop(srv.ts_loop, &guard);
	assert_true(t->tr_done);
	ev_now_update(srv.ts_loop);
	return ev_now(srv.ts_loop) - start;
}

static char *
base_url(void)
{
	static char b[64];

	snprintf(b, sizeof(b), "http://127.0.0.1:%d", srv.ts_port);
	return b;
}

static void
test_ok(void **state)
{
	struct tres t;

	(void)state;
	run_get(&t, base_url(), "/ok", NULL, 2., 4096);
	assert_int_equal(t.tr_error, HTTP_CLIENT_OK);
	assert_int_equal(t.tr_status, 200);
	assert_string_equal(t.tr_body, "{\"ok\":true}");
	assert_false(t.tr_truncated);
}

static void
test_404(void **state)
{
	struct tres t;

	(void)state;
	run_get(&t, base_url(), "/missing", NULL, 2., 4096);
	assert_int_equal(t.tr_error, HTTP_CLIENT_OK);
	assert_int_equal(t.tr_status, 404);
	assert_string_equal(t.tr_body, "not found");
}

static void
test_chunked_and_eof(void **state)
{
	struct tres t;

	(void)state;
	run_get(&t, base_url(), "/chunked", NULL, 2., 4096);
	assert_int_equal(t.tr_error, HTTP_CLIENT_OK);
	assert_string_equal(t.tr_body, "hello world");
	run_get(&t, base_url(), "/eof", NULL, 2., 4096);
	assert_int_equal(t.tr_error, HTTP_CLIENT_OK);
	assert_int_equal(t.tr_status, 200);
	assert_string_equal(t.tr_body, "until eof");
	run_get(&t, base_url(), "/query?a=1&b=2", NULL, 2., 4096);
	assert_int_equal(t.tr_status, 204);
	assert_int_equal(t.tr_len, 0);
}

static void
test_truncated(void **state)
{
	struct tres t;

	(void)state;
	run_get(&t, base_url(), "/big", NULL, 2., 100);
	assert_int_equal(t.tr_error, HTTP_CLIENT_OK);
	assert_int_equal(t.tr_status, 200);
	assert_true(t.tr_truncated);
	assert_int_equal(t.tr_len, 100);
	run_get(&t, base_url(), "/big", NULL, 2., 10000);
	assert_false(t.tr_truncated);
	assert_int_equal(t.tr_len, 10000);
}

static void
test_bearer(void **state)
{
	struct tres t;

	(void)state;
	run_get(&t, base_url(), "/auth", "sekrit", 2., 4096);
	assert_int_equal(t.tr_status, 200);
	run_get(&t, base_url(), "/auth", "", 2., 4096);
	assert_int_equal(t.tr_status, 401);
	run_get(&t, base_url(), "/auth", "wrong", 2., 4096);
	assert_int_equal(t.tr_status, 401);
}

static void
test_garbage(void **state)
{
	struct tres t;

	(void)state;
	run_get(&t, base_url(), "/garbage", NULL, 2., 4096);
	assert_int_equal(t.tr_error, HTTP_CLIENT_PROTOCOL);
}

static void
test_timeout(void **state)
{
	struct tres t;
	double took;

	(void)state;
	took = run_get(&t, base_url(), "/slow", NULL, 0.3, 4096);
	assert_int_equal(t.tr_error, HTTP_CLIENT_TIMEOUT);
	assert_true(took >= 0.25 && took < 2.0);
}

static void
test_refused(void **state)
{
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	struct tres t;
	char base[64];
	int fd;

	(void)state;
	/* A port that was just free: nothing listens there. */
	fd = socket(AF_INET, SOCK_STREAM, 0);
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
	close(fd);
	snprintf(base, sizeof(base), "http://127.0.0.1:%d", ntohs(sa.sin_port));
	run_get(&t, base, "/ok", NULL, 2., 4096);
	assert_int_equal(t.tr_error, HTTP_CLIENT_CONNECT);
	assert_int_equal(t.tr_status, 0);
}

static void
test_bad_urls(void **state)
{
	struct tres t;

	(void)state;
	run_get(&t, "ftp://127.0.0.1:1", "/x", NULL, 2., 4096);
	assert_int_equal(t.tr_error, HTTP_CLIENT_BAD_URL);
	run_get(&t, "not a url", "", NULL, 2., 4096);
	assert_int_equal(t.tr_error, HTTP_CLIENT_BAD_URL);
	run_get(&t, "https://127.0.0.1:1", "/health", NULL, 2., 4096);
	assert_int_equal(t.tr_error, HTTP_CLIENT_TLS_UNAVAILABLE);
}

static void
never_cb(void *arg, const struct http_client_result *res)
{
	(void)arg;
	(void)res;
	fail_msg("callback after cancel");
}

static void
test_cancel(void **state)
{
	struct http_client_req *r;
	ev_timer guard;

	(void)state;
	r = http_client_get(srv.ts_loop, NULL, base_url(), "/slow", NULL, 0.1,
	    4096, never_cb, NULL);
	assert_non_null(r);
	http_client_cancel(r);
	http_client_cancel(NULL);
	/* Past the request's deadline: nothing may fire. */
	ev_timer_init(&guard, guard_cb, 0.3, 0.);
	ev_timer_start(srv.ts_loop, &guard);
	ev_run(srv.ts_loop, 0);
}

static void
test_strerror(void **state)
{
	(void)state;
	assert_string_equal(http_client_strerror(HTTP_CLIENT_TIMEOUT),
	    "timeout");
	assert_string_equal(http_client_strerror(HTTP_CLIENT_OK), "ok");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_ok, setup, teardown),
		cmocka_unit_test_setup_teardown(test_404, setup, teardown),
		cmocka_unit_test_setup_teardown(test_chunked_and_eof, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_truncated, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_bearer, setup, teardown),
		cmocka_unit_test_setup_teardown(test_garbage, setup, teardown),
		cmocka_unit_test_setup_teardown(test_timeout, setup, teardown),
		cmocka_unit_test_setup_teardown(test_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_urls, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
		cmocka_unit_test(test_strerror),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
