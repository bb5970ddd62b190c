/*
 * tls_test.c: TLS handshake, verification and data transfer between a
 * server and a client connection over a non-blocking socketpair, with
 * certificates made by the openssl command in a temporary directory.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
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

#include <mbedtls/aesni.h>

#include "shared/log.h"
#include "shared/tls.h"

static char test_dir[64];

static void test_path(char *buf, size_t size, const char *name);
static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int group_setup(void **state);
static int group_teardown(void **state);
static void make_pair(int sv[2]);
static void handshake_both(struct tls_conn *srv, struct tls_conn *cli,
    int *srv_rv, int *cli_rv);
static struct tls_ctx *client_ctx(const char *ca_name);
static struct tls_ctx *server_ctx(void);
static struct tls_ctx *server_ctx_named(const char *name);
static void test_system_store(void **state);
static void expect_client_failure(const char *ca_name, const char *hostname);

static void
test_path(char *buf, size_t size, const char *name)
{
	snprintf(buf, size, "%s/%s", test_dir, name);
}

static int
run(const char *fmt, ...)
{
	char cmd[2048];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	return system(cmd);
}

/* A CA, a server certificate for localhost signed by it, and a second CA
 * that signed nothing. */
static int
group_setup(void **state)
{
	const char *d;

	(void)state;
	log_init("tls_test", LOG_LEVEL_INFO);
	snprintf(test_dir, sizeof(test_dir), "/tmp/tls_test.XXXXXX");
	if (mkdtemp(test_dir) == NULL)
		return -1;
	d = test_dir;
	if (run("cd %s && "
	        "openssl req -x509 -newkey ec -pkeyopt "
	        "ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out "
	        "ca.crt -subj /CN=smg-test-ca -days 2 2>/dev/null && "
	        "openssl req -x509 -newkey ec -pkeyopt "
	        "ec_paramgen_curve:prime256v1 -nodes -keyout other.key -out "
	        "other.crt -subj /CN=smg-other-ca -days 2 2>/dev/null && "
	        "openssl req -newkey ec -pkeyopt "
	        "ec_paramgen_curve:prime256v1 -nodes -keyout srv.key -out "
	        "srv.csr -subj /CN=localhost 2>/dev/null && "
	        "printf 'subjectAltName=DNS:localhost\\n' > ext.cnf && "
	        "openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key "
	        "-set_serial 2 -days 2 -extfile ext.cnf -out srv.crt "
	        "2>/dev/null && "
	        "openssl req -newkey rsa:2048 -nodes -keyout rsa.key -out "
	        "rsa.csr -subj /CN=localhost 2>/dev/null && "
	        "openssl x509 -req -in rsa.csr -CA ca.crt -CAkey ca.key "
	        "-set_serial 3 -days 2 -extfile ext.cnf -out rsa.crt "
	        "2>/dev/null",
	        d) != 0)
		return -1;
	return 0;
}

static int
group_teardown(void **state)
{
	(void)state;
	return run("rm -rf %s", test_dir) == 0 ? 0 : -1;
}

static void
make_pair(int sv[2])
{
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	assert_int_not_equal(fcntl(sv[0], F_SETFL, O_NONBLOCK), -1);
	assert_int_not_equal(fcntl(sv[1], F_SETFL, O_NONBLOCK), -1);
}

static struct tls_ctx *
client_ctx(const char *ca_name)
{
	char ca[128];
	const char *cas[2] = { ca, NULL };

	test_path(ca, sizeof(ca), ca_name);
	return tls_ctx_new_client(cas, NULL, NULL);
}

static struct tls_ctx *
server_ctx_named(const char *name)
{
	char cert[128], key[128], f[32];

	snprintf(f, sizeof(f), "%s.crt", name);
	test_path(cert, sizeof(cert), f);
	snprintf(f, sizeof(f), "%s.key", name);
	test_path(key, sizeof(key), f);
	return tls_ctx_new_server(cert, key);
}

static struct tls_ctx *
server_ctx(void)
{
	return server_ctx_named("srv");
}

/* Runs both handshakes until neither wants to wait, bounded. */
static void
handshake_both(struct tls_conn *srv, struct tls_conn *cli, int *srv_rv,
    int *cli_rv)
{
	int i;

	*srv_rv = *cli_rv = TLS_WANT_READ;
	for (i = 0; i < 200; i++) {
		if (*cli_rv == TLS_WANT_READ || *cli_rv == TLS_WANT_WRITE)
			*cli_rv = tls_conn_handshake(cli);
		if (*srv_rv == TLS_WANT_READ || *srv_rv == TLS_WANT_WRITE)
			*srv_rv = tls_conn_handshake(srv);
		if ((*cli_rv != TLS_WANT_READ && *cli_rv != TLS_WANT_WRITE) &&
		    (*srv_rv != TLS_WANT_READ && *srv_rv != TLS_WANT_WRITE))
			return;
		/* The server waits on a client that failed: stop there. */
		if (*cli_rv == TLS_ERROR || *srv_rv == TLS_ERROR)
			return;
	}
}

/* A server and a client over a socketpair, with their contexts. */
struct pair {
	struct tls_ctx *p_sctx, *p_cctx;
	struct tls_conn *p_srv, *p_cli;
	int p_sv[2];
};

/* sctx (taken over) serves; the client trusts ca_name, dials hostname. */
static void
pair_open(struct pair *p, struct tls_ctx *sctx, const char *ca_name,
    const char *hostname)
{
	assert_non_null(p->p_sctx = sctx);
	assert_non_null(p->p_cctx = client_ctx(ca_name));
	make_pair(p->p_sv);
	assert_non_null(p->p_srv = tls_conn_new_server(sctx, p->p_sv[0]));
	assert_non_null(
	    p->p_cli = tls_conn_new_client(p->p_cctx, p->p_sv[1], hostname));
}

/* Frees what is left (a side already gone is NULL, its fd -1). */
static void
pair_close(struct pair *p)
{
	tls_conn_free(p->p_srv);
	tls_conn_free(p->p_cli);
	if (p->p_sv[0] != -1)
		close(p->p_sv[0]);
	if (p->p_sv[1] != -1)
		close(p->p_sv[1]);
	tls_ctx_free(p->p_sctx);
	tls_ctx_free(p->p_cctx);
}

static void
test_handshake_and_data(void **state)
{
	struct pair p;
	struct tls_conn *srv, *cli;
	static char big[200000], got[sizeof(big)];
	size_t off, roff;
	char buf[64];
	ssize_t n;
	int *sv = p.p_sv, srv_rv, cli_rv, i;
	struct pollfd pfd[2];

	(void)state;
	pair_open(&p, server_ctx(), "ca.crt", "localhost");
	srv = p.p_srv;
	cli = p.p_cli;

	/* Nothing to read yet: both sides want to wait. */
	assert_int_equal(tls_conn_read(srv, buf, sizeof(buf)), TLS_WANT_READ);
	handshake_both(srv, cli, &srv_rv, &cli_rv);
	assert_int_equal(cli_rv, TLS_OK);
	assert_int_equal(srv_rv, TLS_OK);
	assert_int_equal(tls_conn_handshake(cli), TLS_OK);

	/* Client to server. */
	assert_int_equal(tls_conn_write(cli, "hello", 5), 5);
	n = tls_conn_read(srv, buf, 2);
	assert_int_equal(n, 2);
	/* The rest of the record is inside mbedTLS, not on the fd. */
	assert_int_equal(tls_conn_pending(srv), 3);
	n = tls_conn_read(srv, buf + 2, sizeof(buf) - 2);
	assert_int_equal(n, 3);
	assert_memory_equal(buf, "hello", 5);
	assert_int_equal(tls_conn_pending(srv), 0);
	assert_int_equal(tls_conn_read(srv, buf, sizeof(buf)), TLS_WANT_READ);

	/* Two records in one read(2): the second waits off the fd. */
	assert_int_equal(tls_conn_write(cli, "abc", 3), 3);
	assert_int_equal(tls_conn_write(cli, "defg", 4), 4);
	assert_int_equal(tls_conn_read(srv, buf, sizeof(buf)), 3);
	assert_true(tls_conn_pending(srv) > 0);
	pfd[0].fd = sv[0];
	pfd[0].events = POLLIN;
	assert_int_equal(poll(pfd, 1, 0), 0);
	assert_int_equal(tls_conn_read(srv, buf + 3, sizeof(buf) - 3), 4);
	assert_memory_equal(buf, "abcdefg", 7);
	assert_int_equal(tls_conn_pending(srv), 0);

	/* Server to client, more than the socket buffer holds. */
	for (off = 0; off < sizeof(big); off++)
		big[off] = (char)('a' + off % 26);
	off = roff = 0;
	for (i = 0; i < 10000 && roff < sizeof(big); i++) {
		if (off < sizeof(big)) {
			n = tls_conn_write(srv, big + off, sizeof(big) - off);
			if (n > 0)
				off += (size_t)n;
			else
				assert_true(n == TLS_WANT_WRITE);
		}
		do {
			n = tls_conn_read(cli, got + roff, sizeof(got) - roff);
			if (n > 0)
				roff += (size_t)n;
		} while (n > 0 && roff < sizeof(got));
		if (n <= 0)
			assert_true(n == TLS_WANT_READ);
		pfd[0].fd = sv[0];
		pfd[0].events = off < sizeof(big) ? POLLOUT : 0;
		pfd[1].fd = sv[1];
		pfd[1].events = POLLIN;
		(void)poll(pfd, 2, 100);
	}
	assert_int_equal(roff, sizeof(big));
	assert_memory_equal(got, big, sizeof(big));

	/* close_notify ends the session for the reader. */
	assert_int_equal(tls_conn_close_notify(cli), TLS_OK);
	assert_int_equal(tls_conn_read(srv, buf, sizeof(buf)), TLS_CLOSED);

	pair_close(&p);
}

/*
 * Our client and server agree on the suite the CPU runs fastest: with AES
 * instructions AES-CCM for an ECDSA certificate, and ChaCha20-Poly1305
 * for an RSA one (TLS 1.2 has no ECDHE-RSA suite with CCM, and AES-GCM
 * is slower in mbedTLS 2.28); without them ChaCha20-Poly1305.
 */
static void
expect_suite(const char *server_name, const char *want)
{
	struct pair p;
	struct tls_conn *srv, *cli;
	int srv_rv, cli_rv;

	pair_open(&p, server_ctx_named(server_name), "ca.crt", "localhost");
	srv = p.p_srv;
	cli = p.p_cli;
	assert_null(tls_conn_suite(cli));
	handshake_both(srv, cli, &srv_rv, &cli_rv);
	assert_int_equal(cli_rv, TLS_OK);
	assert_int_equal(srv_rv, TLS_OK);
	assert_non_null(tls_conn_suite(cli));
	assert_string_equal(tls_conn_suite(cli), tls_conn_suite(srv));
	print_message("%s certificate: %s\n", server_name, tls_conn_suite(cli));
	assert_non_null(strstr(tls_conn_suite(cli), want));
	pair_close(&p);
}

static void
test_suite_preference(void **state)
{
	bool aes_hw = mbedtls_aesni_has_support(MBEDTLS_AESNI_AES) != 0;

	(void)state;
	expect_suite("srv",
	    aes_hw ? "ECDHE-ECDSA-WITH-AES-128-CCM" : "CHACHA20-POLY1305");
	expect_suite("rsa", "ECDHE-RSA-WITH-CHACHA20-POLY1305");
}

static void
test_eof_is_closed(void **state)
{
	struct pair p;
	int srv_rv, cli_rv;
	char buf[16];

	(void)state;
	pair_open(&p, server_ctx(), "ca.crt", "localhost");
	handshake_both(p.p_srv, p.p_cli, &srv_rv, &cli_rv);
	assert_int_equal(cli_rv, TLS_OK);
	assert_int_equal(srv_rv, TLS_OK);
	/* The server goes away without close_notify. */
	tls_conn_free(p.p_srv);
	p.p_srv = NULL;
	close(p.p_sv[0]);
	p.p_sv[0] = -1;
	assert_int_equal(tls_conn_read(p.p_cli, buf, sizeof(buf)), TLS_CLOSED);
	pair_close(&p);
}

static void
expect_client_failure(const char *ca_name, const char *hostname)
{
	struct pair p;
	int srv_rv, cli_rv;

	pair_open(&p, server_ctx(), ca_name, hostname);
	handshake_both(p.p_srv, p.p_cli, &srv_rv, &cli_rv);
	assert_int_equal(cli_rv, TLS_ERROR);
	pair_close(&p);
}

static void
test_untrusted_ca(void **state)
{
	(void)state;
	expect_client_failure("other.crt", "localhost");
}

static void
test_wrong_hostname(void **state)
{
	(void)state;
	expect_client_failure("ca.crt", "worker.example");
}

static void
test_load_errors(void **state)
{
	char cert[128], key[128], other_key[128], missing[128];
	const char *cas[2] = { missing, NULL };

	(void)state;
	test_path(cert, sizeof(cert), "srv.crt");
	test_path(key, sizeof(key), "srv.key");
	test_path(other_key, sizeof(other_key), "other.key");
	test_path(missing, sizeof(missing), "missing.pem");
	assert_null(tls_ctx_new_server(missing, key));
	assert_null(tls_ctx_new_server(cert, missing));
	/* A key that is not the certificate's. */
	assert_null(tls_ctx_new_server(cert, other_key));
	/* A key file given as certificate. */
	assert_null(tls_ctx_new_server(key, key));
	assert_null(tls_ctx_new_server(cert, NULL));
	assert_null(tls_ctx_new_client(cas, NULL, NULL));
	cas[0] = key;
	assert_null(tls_ctx_new_client(cas, NULL, NULL));
	cas[0] = cert;
	/* Half an mTLS pair. */
	assert_null(tls_ctx_new_client(cas, cert, NULL));
	assert_null(tls_ctx_new_client(cas, other_key, key));
}

static void
test_client_with_cert(void **state)
{
	char ca[128], cert[128], key[128];
	const char *cas[2] = { ca, NULL };
	struct tls_ctx *cctx, *sctx;
	struct tls_conn *srv, *cli;
	int sv[2], srv_rv, cli_rv;

	(void)state;
	test_path(ca, sizeof(ca), "ca.crt");
	test_path(cert, sizeof(cert), "srv.crt");
	test_path(key, sizeof(key), "srv.key");
	assert_non_null(cctx = tls_ctx_new_client(cas, cert, key));
	assert_non_null(sctx = server_ctx());
	/* Contexts of the wrong side are refused. */
	assert_null(tls_conn_new_server(cctx, 0));
	assert_null(tls_conn_new_client(sctx, 0, "localhost"));
	assert_null(tls_conn_new_client(cctx, 0, ""));
	make_pair(sv);
	assert_non_null(srv = tls_conn_new_server(sctx, sv[0]));
	assert_non_null(cli = tls_conn_new_client(cctx, sv[1], "localhost"));
	handshake_both(srv, cli, &srv_rv, &cli_rv);
	assert_int_equal(cli_rv, TLS_OK);
	assert_int_equal(srv_rv, TLS_OK);
	tls_conn_free(srv);
	tls_conn_free(cli);
	close(sv[0]);
	close(sv[1]);
	tls_ctx_free(sctx);
	tls_ctx_free(cctx);
	tls_ctx_free(NULL);
	tls_conn_free(NULL);
}

static void
test_system_store(void **state)
{
	struct tls_ctx *cctx;
	const char *none[1] = { NULL };

	(void)state;
	if (access(TLS_SYSTEM_CA_PATH, R_OK) == -1)
		skip();
	assert_non_null(cctx = tls_ctx_new_client(NULL, NULL, NULL));
	tls_ctx_free(cctx);
	assert_non_null(cctx = tls_ctx_new_client(none, NULL, NULL));
	tls_ctx_free(cctx);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_handshake_and_data),
		cmocka_unit_test(test_eof_is_closed),
		cmocka_unit_test(test_suite_preference),
		cmocka_unit_test(test_untrusted_ca),
		cmocka_unit_test(test_wrong_hostname),
		cmocka_unit_test(test_load_errors),
		cmocka_unit_test(test_client_with_cert),
		cmocka_unit_test(test_system_store),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
