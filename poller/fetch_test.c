/*
 * fetch_test.c: what the poller's GET sends (user agent, accept, bearer
 * key only when there is one) and that its answer comes back whole, one
 * request per connection, against a raw loopback server.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "poller/poller.h"
#include "shared/config.h"
#include "shared/log.h"

struct seen {
	bool sn_done;
	enum upstream_error sn_err;
	int sn_status;
	char sn_body[64];
};

static void
fetch_cb(void *arg, const struct upstream_result *r)
{
	struct seen *sn = arg;

	sn->sn_done = true;
	sn->sn_err = r->ur_error;
	sn->sn_status = r->ur_status;
	snprintf(sn->sn_body, sizeof(sn->sn_body), "%s", r->ur_body);
}

/* One GET answered by a server that reads the request head first. */
static void
get_once(struct poller *p, int lfd, const char *base, const char *key,
    char *req, size_t reqlen, struct seen *sn)
{
	static const char resp[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
	                           "\r\n{}";
	size_t off = 0;
	ssize_t n;
	int fd = -1, i;

	memset(sn, 0, sizeof(*sn));
	assert_non_null(
	    fetch_get(p, base, "/v1/loads", key, 2., 1024, fetch_cb, sn));
	for (i = 0; i < 2000 && fd == -1; i++) {
		ev_run(p->p_loop, EVRUN_NOWAIT);
		fd = accept(lfd, NULL, NULL);
		if (fd == -1)
			usleep(1000);
	}
	assert_int_not_equal(fd, -1);
	while (strstr(req, "\r\n\r\n") == NULL && off < reqlen - 1) {
		n = read(fd, req + off, reqlen - 1 - off);
		assert_true(n > 0);
		off += (size_t)n;
		req[off] = '\0';
	}
	assert_int_equal(write(fd, resp, sizeof(resp) - 1),
	    (ssize_t)(sizeof(resp) - 1));
	for (i = 0; i < 2000 && !sn->sn_done; i++)
		ev_run(p->p_loop, EVRUN_ONCE);
	assert_true(sn->sn_done);
	/* Nothing pooled: the client closed its side. */
	assert_int_equal(read(fd, req + off, 1), 0);
	close(fd);
}

static void
test_fetch_get(void **state)
{
	struct sockaddr_in sin;
	socklen_t len = sizeof(sin);
	struct config cf;
	struct poller p;
	struct seen sn;
	char base[64], req[4096];
	int lfd;

	(void)state;
	log_init("fetch_test", LOG_LEVEL_WARN);
	memset(&cf, 0, sizeof(cf));
	memset(&p, 0, sizeof(p));
	p.p_loop = ev_loop_new(EVFLAG_AUTO);
	p.p_cf = &cf;
	assert_non_null(p.p_up = fetch_client_new(p.p_loop, &cf));

	lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	assert_int_equal(listen(lfd, 4), 0);
	assert_int_equal(getsockname(lfd, (struct sockaddr *)&sin, &len), 0);
	snprintf(base, sizeof(base), "http://127.0.0.1:%d",
	    ntohs(sin.sin_port));

	memset(req, 0, sizeof(req));
	get_once(&p, lfd, base, "sekrit", req, sizeof(req), &sn);
	assert_int_equal(sn.sn_err, UPSTREAM_OK);
	assert_int_equal(sn.sn_status, 200);
	assert_string_equal(sn.sn_body, "{}");
	assert_non_null(strstr(req, "GET /v1/loads HTTP/1.1\r\n"));
	assert_non_null(strstr(req, "user-agent: smg-poller\r\n"));
	assert_non_null(strstr(req, "accept: application/json\r\n"));
	assert_non_null(strstr(req, "authorization: Bearer sekrit\r\n"));

	memset(req, 0, sizeof(req));
	get_once(&p, lfd, base, "", req, sizeof(req), &sn);
	assert_int_equal(sn.sn_status, 200);
	assert_null(strstr(req, "authorization"));
	assert_int_equal(upstream_idle_connections(p.p_up), 0);

	close(lfd);
	upstream_free(p.p_up);
	ev_loop_destroy(p.p_loop);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fetch_get),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
