/*
 * ipc_rtt.c: round trip of one request at a time between two processes,
 * each on its own libev loop, over the decision conversation's transport:
 *
 *   sp   shared/ipc.h REQ client -> REP server (SP on the loops, sp.c)
 *   sp-tcp  the same over tcp:// on loopback (remote frontends)
 *   sp-tls  the same over tls+tcp:// with mutual certificates (made with
 *           the openssl command in the temporary directory)
 *   nng  libnng REQ/REP with contexts whose aio callbacks queue to the
 *        loop with ev_async, as the frontend and broker did before sp.c
 *
 * The server answers every message with a copy of it. Compare with
 * bench-pingpong (a socketpair with blocking reads) run beside it.
 *
 * usage: bench-ipc-rtt [--transport sp|sp-tcp|sp-tls|nng] [--size BYTES]
 *                      [--count N]
 *                      [--warmup N]
 * Prints one JSON object on stdout:
 *   {"transport":"sp","size":256,"count":20000,"p50_us":..,"p99_us":..,
 *    "mean_us":..,"round_trips_per_s":..}
 */
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <errno.h>
#include <stdbool.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ev.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#include "shared/ipc.h"
#include "shared/log.h"
#include "shared/tls.h"
#include "shared/xmalloc.h"

struct bench {
	struct ev_loop *b_loop;
	size_t b_size, b_count, b_warmup, b_done;
	uint8_t *b_msg;
	uint64_t *b_rtt, b_t0, b_start, b_elapsed;
	int b_failed;
	struct ipc_client *b_cl;
	/* nng */
	nng_socket b_sock;
	nng_ctx b_ctx;
	nng_aio *b_aio;
	ev_async b_async;
	pthread_mutex_t b_mtx;
	int b_ready, b_rv, b_sending;
	nng_msg *b_reply;
};

static uint64_t
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static uint64_t
quantile(const uint64_t *v, size_t n, double q)
{
	size_t rank = (size_t)(q * (double)n + 0.999999);

	if (rank < 1)
		rank = 1;
	if (rank > n)
		rank = n;
	return v[rank - 1];
}

/* A finished round trip: record it and start the next, or stop. */
static int
bench_next(struct bench *b, int status, size_t len)
{
	uint64_t t = now_ns();

	if (status != 0 || len != b->b_size) {
		log_warnx("round trip %zu failed: status %d, %zu bytes",
		    b->b_done, status, len);
		b->b_failed = 1;
		ev_break(b->b_loop, EVBREAK_ALL);
		return -1;
	}
	if (b->b_done >= b->b_warmup)
		b->b_rtt[b->b_done - b->b_warmup] = t - b->b_t0;
	if (++b->b_done == b->b_warmup)
		b->b_start = now_ns();
	if (b->b_done == b->b_warmup + b->b_count) {
		b->b_elapsed = now_ns() - b->b_start;
		ev_break(b->b_loop, EVBREAK_ALL);
		return -1;
	}
	b->b_t0 = now_ns();
	return 0;
}

/* ------------------------------------------------------------------ sp */

static void
sp_echo_cb(void *arg, const uint8_t *msg, size_t len, uint8_t **reply,
    size_t *reply_len)
{
	(void)arg;
	*reply = xmalloc(len > 0 ? len : 1);
	memcpy(*reply, msg, len);
	*reply_len = len;
}

static void sp_reply_cb(void *, int, const uint8_t *, size_t);

static void
sp_send(struct bench *b)
{
	if (ipc_client_send(b->b_cl, b->b_msg, b->b_size, 5000, sp_reply_cb,
	        b) == -1)
		fatalx("ipc_client_send");
}

static void
sp_reply_cb(void *arg, int status, const uint8_t *reply, size_t len)
{
	struct bench *b = arg;

	(void)reply;
	if (bench_next(b, status, len) == 0)
		sp_send(b);
}

/* ----------------------------------------------------------------- nng */

/* nng thread: queue the result for the loop, as ipc.c used to. */
static void
nng_aio_cb(void *arg)
{
	struct bench *b = arg;

	pthread_mutex_lock(&b->b_mtx);
	b->b_rv = nng_aio_result(b->b_aio);
	b->b_ready = 1;
	pthread_mutex_unlock(&b->b_mtx);
	ev_async_send(b->b_loop, &b->b_async);
}

static void
nng_send_req(struct bench *b)
{
	nng_msg *m;

	if (nng_msg_alloc(&m, b->b_size) != 0)
		fatalx("nng_msg_alloc");
	memcpy(nng_msg_body(m), b->b_msg, b->b_size);
	b->b_sending = 1;
	nng_aio_set_msg(b->b_aio, m);
	nng_ctx_send(b->b_ctx, b->b_aio);
}

/* Client loop side: a send went out (now receive) or a reply came. */
static void
nng_client_async_cb(struct ev_loop *loop, ev_async *w, int revents)
{
	struct bench *b = w->data;
	nng_msg *m;
	int rv;

	(void)loop;
	(void)revents;
	pthread_mutex_lock(&b->b_mtx);
	if (!b->b_ready) {
		pthread_mutex_unlock(&b->b_mtx);
		return;
	}
	b->b_ready = 0;
	rv = b->b_rv;
	pthread_mutex_unlock(&b->b_mtx);
	if (b->b_sending) {
		b->b_sending = 0;
		if (rv != 0)
			fatalx("nng send: %s", nng_strerror(rv));
		nng_ctx_recv(b->b_ctx, b->b_aio);
		return;
	}
	m = rv == 0 ? nng_aio_get_msg(b->b_aio) : NULL;
	if (bench_next(b, rv, m != NULL ? nng_msg_len(m) : 0) == 0)
		nng_send_req(b);
	nng_msg_free(m);
}

/* Server loop side: a request came (answer it) or the answer went. */
static void
nng_server_async_cb(struct ev_loop *loop, ev_async *w, int revents)
{
	struct bench *b = w->data;
	nng_msg *m;
	int rv;

	(void)loop;
	(void)revents;
	pthread_mutex_lock(&b->b_mtx);
	if (!b->b_ready) {
		pthread_mutex_unlock(&b->b_mtx);
		return;
	}
	b->b_ready = 0;
	rv = b->b_rv;
	pthread_mutex_unlock(&b->b_mtx);
	if (b->b_sending || rv != 0) {
		b->b_sending = 0;
		nng_ctx_recv(b->b_ctx, b->b_aio);
		return;
	}
	m = nng_aio_get_msg(b->b_aio);
	b->b_sending = 1;
	nng_aio_set_msg(b->b_aio, m); /* echo the same message */
	nng_ctx_send(b->b_ctx, b->b_aio);
}

static void
nng_setup(struct bench *b, int server, const char *url)
{
	int rv;

	if (pthread_mutex_init(&b->b_mtx, NULL) != 0)
		fatalx("pthread_mutex_init");
	rv = server ? nng_rep0_open(&b->b_sock) : nng_req0_open(&b->b_sock);
	if (rv != 0 || nng_ctx_open(&b->b_ctx, b->b_sock) != 0 ||
	    nng_aio_alloc(&b->b_aio, nng_aio_cb, b) != 0)
		fatalx("nng setup");
	ev_async_init(&b->b_async,
	    server ? nng_server_async_cb : nng_client_async_cb);
	b->b_async.data = b;
	ev_async_start(b->b_loop, &b->b_async);
	if (server) {
		if ((rv = nng_listen(b->b_sock, url, NULL, 0)) != 0)
			fatalx("nng_listen %s: %s", url, nng_strerror(rv));
		nng_ctx_recv(b->b_ctx, b->b_aio);
	} else if ((rv = nng_dial(b->b_sock, url, NULL, 0)) != 0)
		fatalx("nng_dial %s: %s", url, nng_strerror(rv));
}

/* ---------------------------------------------------------------- main */

static long
parse_count(const char *flag, const char *s, long lo, long hi)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
		fatalx("%s: expected an integer in [%ld, %ld]", flag, lo, hi);
	return v;
}

static void
usage(void)
{
	fprintf(stderr,
	    "usage: bench-ipc-rtt [--transport sp|sp-tcp|sp-tls|nng] "
	    "[--size BYTES] [--count N] [--warmup N]\n");
	exit(2);
}

/* A loopback port free just now. */
static int
tcp_port(void)
{
	struct sockaddr_in sin;
	socklen_t sl = sizeof(sin);
	int fd, port;

	if ((fd = socket(AF_INET, SOCK_STREAM, 0)) == -1)
		fatal("socket");
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) == -1 ||
	    getsockname(fd, (struct sockaddr *)&sin, &sl) == -1)
		fatal("bind");
	port = ntohs(sin.sin_port);
	close(fd);
	return port;
}

/* The certificates of sp-tls: a CA, the server (localhost), a client. */
static void
tls_certs(const char *dir)
{
	char cmd[2048];

	snprintf(cmd, sizeof(cmd),
	    "(cd %s && E='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
	    "-nodes' && "
	    "openssl req -x509 $E -keyout ca.key -out ca.crt -subj /CN=rtt "
	    "-days 2 && printf 'subjectAltName=DNS:localhost\\n' > ext.cnf "
	    "&& openssl req $E -keyout srv.key -out srv.csr -subj "
	    "/CN=localhost && openssl x509 -req -in srv.csr -CA ca.crt "
	    "-CAkey ca.key -set_serial 2 -days 2 -extfile ext.cnf -out "
	    "srv.crt && openssl req $E -keyout cli.key -out cli.csr -subj "
	    "/CN=cli && openssl x509 -req -in cli.csr -CA ca.crt -CAkey "
	    "ca.key -set_serial 3 -days 2 -out cli.crt) >/dev/null 2>&1",
	    dir);
	if (system(cmd) != 0)
		fatalx("openssl failed");
}

static struct tls_ctx *
tls_ctx_of(const char *dir, bool server)
{
	char crt[256], key[256], ca[256];
	const char *cas[2] = { ca, NULL };
	struct tls_ctx *ctx;

	snprintf(crt, sizeof(crt), "%s/%s.crt", dir, server ? "srv" : "cli");
	snprintf(key, sizeof(key), "%s/%s.key", dir, server ? "srv" : "cli");
	snprintf(ca, sizeof(ca), "%s/ca.crt", dir);
	ctx = server ? tls_ctx_new_server_mutual(crt, key, ca)
	             : tls_ctx_new_client(cas, crt, key);
	if (ctx == NULL)
		fatalx("tls context");
	return ctx;
}

static void
run_server(const char *transport, const char *url, const char *dir)
{
	struct bench srv;

	memset(&srv, 0, sizeof(srv));
	srv.b_loop = ev_default_loop(0);
	if (strcmp(transport, "sp-tls") == 0) {
		if (ipc_server_new_tls(srv.b_loop, url, tls_ctx_of(dir, true),
		        sp_echo_cb, NULL) == NULL)
			_exit(1);
	} else if (strncmp(transport, "sp", 2) == 0) {
		if (ipc_server_new(srv.b_loop, url, IPC_SERVER_REP, sp_echo_cb,
		        NULL) == NULL)
			_exit(1);
	} else
		nng_setup(&srv, 1, url);
	ev_run(srv.b_loop, 0);
	_exit(0);
}

int
main(int argc, char **argv)
{
	const char *transport = "sp";
	char dir[] = "/tmp/bench-ipc-rtt.XXXXXX", url[160], path[128];
	struct bench b;
	struct stat st;
	uint64_t total = 0;
	pid_t pid;
	size_t i;
	int status, tries;
	bool tcp, tls;

	log_init("bench-ipc-rtt", LOG_LEVEL_WARN);
	memset(&b, 0, sizeof(b));
	b.b_size = 256;
	b.b_count = 20000;
	b.b_warmup = 1000;
	for (i = 1; i < (size_t)argc; i += 2) {
		if (i + 1 >= (size_t)argc)
			usage();
		if (strcmp(argv[i], "--transport") == 0)
			transport = argv[i + 1];
		else if (strcmp(argv[i], "--size") == 0)
			b.b_size = (size_t)parse_count(argv[i], argv[i + 1], 1,
			    1024 * 1024);
		else if (strcmp(argv[i], "--count") == 0)
			b.b_count = (size_t)parse_count(argv[i], argv[i + 1], 1,
			    10000000);
		else if (strcmp(argv[i], "--warmup") == 0)
			b.b_warmup = (size_t)parse_count(argv[i], argv[i + 1],
			    1, 10000000);
		else
			usage();
	}
	if (strcmp(transport, "sp") != 0 && strcmp(transport, "sp-tcp") != 0 &&
	    strcmp(transport, "sp-tls") != 0 && strcmp(transport, "nng") != 0)
		usage();
	tls = strcmp(transport, "sp-tls") == 0;
	tcp = tls || strcmp(transport, "sp-tcp") == 0;
	signal(SIGPIPE, SIG_IGN);
	if (mkdtemp(dir) == NULL)
		fatal("mkdtemp");
	snprintf(path, sizeof(path), "%s/rtt.ipc", dir);
	if (tls) {
		tls_certs(dir);
		snprintf(url, sizeof(url), "tls+tcp://localhost:%d",
		    tcp_port());
	} else if (tcp)
		snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", tcp_port());
	else
		snprintf(url, sizeof(url), "ipc://%s", path);

	/* Fork before either side touches nng (no threads across fork). */
	if ((pid = fork()) == -1)
		fatal("fork");
	if (pid == 0)
		run_server(transport, url, dir);
	for (tries = 0; !tcp && stat(path, &st) == -1 && tries < 500; tries++)
		usleep(10000);
	/* Over TCP the client redials until the server listens. */

	b.b_loop = ev_default_loop(0);
	b.b_msg = xmalloc(b.b_size);
	memset(b.b_msg, 'p', b.b_size);
	b.b_rtt = xcalloc(b.b_count, sizeof(*b.b_rtt));
	b.b_t0 = now_ns();
	if (tls) {
		if ((b.b_cl = ipc_client_new_tls(b.b_loop, url,
		         tls_ctx_of(dir, false), 1)) == NULL)
			fatalx("ipc_client_new_tls");
		sp_send(&b);
	} else if (strncmp(transport, "sp", 2) == 0) {
		if ((b.b_cl = ipc_client_new(b.b_loop, url, IPC_CLIENT_REQ,
		         1)) == NULL)
			fatalx("ipc_client_new");
		sp_send(&b);
	} else {
		nng_setup(&b, 0, url);
		nng_send_req(&b);
	}
	ev_run(b.b_loop, 0);

	kill(pid, SIGKILL);
	while (waitpid(pid, &status, 0) == -1 && errno == EINTR)
		;
	unlink(path);
	if (tls) {
		char rm[512];

		snprintf(rm, sizeof(rm),
		    "cd %s && rm -f ca.* srv.* cli.* ext.cnf", dir);
		(void)system(rm);
	}
	rmdir(dir);
	if (b.b_failed)
		return 1;
	for (i = 0; i < b.b_count; i++)
		total += b.b_rtt[i];
	qsort(b.b_rtt, b.b_count, sizeof(*b.b_rtt), cmp_u64);
	printf("{\"transport\":\"%s\",\"size\":%zu,\"count\":%zu,"
	       "\"p50_us\":%.1f,\"p99_us\":%.1f,\"mean_us\":%.1f,"
	       "\"round_trips_per_s\":%.0f}\n",
	    transport, b.b_size, b.b_count,
	    (double)quantile(b.b_rtt, b.b_count, 0.50) / 1e3,
	    (double)quantile(b.b_rtt, b.b_count, 0.99) / 1e3,
	    (double)total / (double)b.b_count / 1e3,
	    (double)b.b_count * 1e9 / (double)b.b_elapsed);
	/* The process exits now: the nng socket dies with it. */
	ipc_client_free(b.b_cl);
	free(b.b_rtt);
	free(b.b_msg);
	return 0;
}
