/*
 * tls.c: mbedTLS contexts and non-blocking TLS connections over socket fds.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mbedtls/aesni.h>
#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>
#include <mbedtls/error.h>
#include <mbedtls/net_sockets.h>
#include <mbedtls/pk.h>
#include <mbedtls/ssl.h>
#include <mbedtls/ssl_ciphersuites.h>
#include <mbedtls/x509_crt.h>

#include "shared/log.h"
#include "shared/tls.h"

struct tls_ctx {
	bool tc_server;
	mbedtls_entropy_context tc_entropy;
	mbedtls_ctr_drbg_context tc_drbg;
	mbedtls_ssl_config tc_conf;
	mbedtls_x509_crt tc_ca; /* client: trusted CAs */
	mbedtls_x509_crt tc_cert; /* own certificate (server, or mTLS) */
	mbedtls_pk_context tc_key;
	int *tc_suites; /* preference order, 0-terminated (mbedTLS keeps it) */
};

/*
 * Bytes read from the fd ahead of mbedTLS. mbedTLS asks for a record's
 * 5-byte header, then for its body: two read(2) calls a record. Reading
 * up to this much at once makes a small record (a decision) cost one.
 */
#define TLS_READ_AHEAD 4096

struct tls_conn {
	struct tls_ctx *tn_ctx;
	int tn_fd;
	bool tn_handshaken;
	mbedtls_ssl_context tn_ssl;
	size_t tn_ra_off; /* read-ahead bytes not yet given to mbedTLS */
	size_t tn_ra_len;
	unsigned char tn_ra[TLS_READ_AHEAD];
};

static struct tls_ctx *tls_ctx_alloc(bool server);
static int tls_load_own(struct tls_ctx *ctx, const char *cert_path,
    const char *key_path);
static void tls_log_err(const char *func, const char *what, int ret);
static int tls_suite_rank(const mbedtls_ssl_ciphersuite_t *cs, bool aes_hw);
static int tls_conf_suites(struct tls_ctx *ctx);
static int tls_bio_send(void *arg, const unsigned char *buf, size_t len);
static int tls_bio_recv(void *arg, unsigned char *buf, size_t len);
static struct tls_conn *tls_conn_new(struct tls_ctx *ctx, int fd,
    const char *hostname);
static int tls_map(struct tls_conn *c, const char *func, int ret);

static const char tls_pers[] = "smg-c tls";

static void
tls_log_err(const char *func, const char *what, int ret)
{
	char buf[160];

	mbedtls_strerror(ret, buf, sizeof(buf));
	log_warnx("%s: %s: %s (-0x%04x)", func, what, buf, (unsigned)-ret);
}

static struct tls_ctx *
tls_ctx_alloc(bool server)
{
	struct tls_ctx *ctx;
	int ret;

	if ((ctx = calloc(1, sizeof(*ctx))) == NULL) {
		log_warn("%s: calloc", __func__);
		return NULL;
	}
	ctx->tc_server = server;
	mbedtls_entropy_init(&ctx->tc_entropy);
	mbedtls_ctr_drbg_init(&ctx->tc_drbg);
	mbedtls_ssl_config_init(&ctx->tc_conf);
	mbedtls_x509_crt_init(&ctx->tc_ca);
	mbedtls_x509_crt_init(&ctx->tc_cert);
	mbedtls_pk_init(&ctx->tc_key);

	if ((ret = mbedtls_ctr_drbg_seed(&ctx->tc_drbg, mbedtls_entropy_func,
	         &ctx->tc_entropy, (const unsigned char *)tls_pers,
	         sizeof(tls_pers) - 1)) != 0) {
		tls_log_err(__func__, "seeding the random generator", ret);
		tls_ctx_free(ctx);
		return NULL;
	}
	if ((ret = mbedtls_ssl_config_defaults(&ctx->tc_conf,
	         server ? MBEDTLS_SSL_IS_SERVER : MBEDTLS_SSL_IS_CLIENT,
	         MBEDTLS_SSL_TRANSPORT_STREAM, MBEDTLS_SSL_PRESET_DEFAULT)) !=
	    0) {
		tls_log_err(__func__, "ssl config defaults", ret);
		tls_ctx_free(ctx);
		return NULL;
	}
	mbedtls_ssl_conf_rng(&ctx->tc_conf, mbedtls_ctr_drbg_random,
	    &ctx->tc_drbg);
	/* TLS 1.2 is the oldest version worth accepting. */
	mbedtls_ssl_conf_min_version(&ctx->tc_conf, MBEDTLS_SSL_MAJOR_VERSION_3,
	    MBEDTLS_SSL_MINOR_VERSION_3);
	if (tls_conf_suites(ctx) == -1) {
		tls_ctx_free(ctx);
		return NULL;
	}
	return ctx;
}

/*
 * Where a suite goes in our preference: lower first. Only the record
 * cipher is ranked; the library's order (forward secrecy first) stays
 * within a rank. Per record in mbedTLS 2.28 with AES-NI, AES-CCM costs
 * about half of ChaCha20-Poly1305, and AES-GCM more than ChaCha20 (its
 * GHASH goes one block at a time): docs/decisions.md has the figures.
 * Without AES-NI, software AES is the slowest of all.
 */
static int
tls_suite_rank(const mbedtls_ssl_ciphersuite_t *cs, bool aes_hw)
{
	int rank;

	if (cs->flags & MBEDTLS_CIPHERSUITE_SHORT_TAG)
		rank = 6;
	else if (cs->cipher == MBEDTLS_CIPHER_CHACHA20_POLY1305)
		rank = aes_hw ? 2 : 0;
	else if (!aes_hw)
		rank = 6;
	else if (cs->cipher == MBEDTLS_CIPHER_AES_128_CCM)
		rank = 0;
	else if (cs->cipher == MBEDTLS_CIPHER_AES_256_CCM)
		rank = 1;
	else if (cs->cipher == MBEDTLS_CIPHER_AES_128_GCM)
		rank = 3;
	else if (cs->cipher == MBEDTLS_CIPHER_AES_256_GCM)
		rank = 4;
	else
		rank = 6;
	/*
	 * The key exchange goes before the cipher: ECDHE, then finite-field
	 * DHE (a far slower handshake), then suites without forward secrecy.
	 */
	switch (cs->key_exchange) {
	case MBEDTLS_KEY_EXCHANGE_ECDHE_ECDSA:
	case MBEDTLS_KEY_EXCHANGE_ECDHE_RSA:
	case MBEDTLS_KEY_EXCHANGE_ECDHE_PSK:
		return rank;
	case MBEDTLS_KEY_EXCHANGE_DHE_RSA:
	case MBEDTLS_KEY_EXCHANGE_DHE_PSK:
		return 10 + rank;
	default:
		return 20 + rank;
	}
}

/* The library's suites, reordered for the ciphers this CPU runs fast. */
static int
tls_conf_suites(struct tls_ctx *ctx)
{
	const mbedtls_ssl_ciphersuite_t *cs;
	const int *all = mbedtls_ssl_list_ciphersuites();
	bool aes_hw;
	size_t n, i, j;
	int *v, *rank, id, r;

	aes_hw = mbedtls_aesni_has_support(MBEDTLS_AESNI_AES) != 0;
	for (n = 0; all[n] != 0; n++)
		;
	v = calloc(n + 1, sizeof(*v));
	rank = calloc(n + 1, sizeof(*rank));
	if (v == NULL || rank == NULL) {
		log_warn("%s: calloc", __func__);
		free(v);
		free(rank);
		return -1;
	}
	/* Insertion sort: stable, and the list is short. */
	for (i = 0; i < n; i++) {
		id = all[i];
		r = (cs = mbedtls_ssl_ciphersuite_from_id(id)) != NULL
		    ? tls_suite_rank(cs, aes_hw)
		    : 100;
		for (j = i; j > 0 && rank[j - 1] > r; j--) {
			v[j] = v[j - 1];
			rank[j] = rank[j - 1];
		}
		v[j] = id;
		rank[j] = r;
	}
	free(rank);
	ctx->tc_suites = v;
	mbedtls_ssl_conf_ciphersuites(&ctx->tc_conf, ctx->tc_suites);
	return 0;
}

static int
tls_load_own(struct tls_ctx *ctx, const char *cert_path, const char *key_path)
{
	char what[512];
	int ret;

	if ((ret = mbedtls_x509_crt_parse_file(&ctx->tc_cert, cert_path)) !=
	    0) {
		if (ret > 0)
			ret = MBEDTLS_ERR_X509_CERT_UNKNOWN_FORMAT;
		snprintf(what, sizeof(what), "certificate %s", cert_path);
		tls_log_err(__func__, what, ret);
		return -1;
	}
	if ((ret = mbedtls_pk_parse_keyfile(&ctx->tc_key, key_path, NULL)) !=
	    0) {
		snprintf(what, sizeof(what), "private key %s", key_path);
		tls_log_err(__func__, what, ret);
		return -1;
	}
	if ((ret = mbedtls_pk_check_pair(&ctx->tc_cert.pk, &ctx->tc_key)) !=
	    0) {
		snprintf(what, sizeof(what), "key %s does not match %s",
		    key_path, cert_path);
		tls_log_err(__func__, what, ret);
		return -1;
	}
	if ((ret = mbedtls_ssl_conf_own_cert(&ctx->tc_conf, &ctx->tc_cert,
	         &ctx->tc_key)) != 0) {
		tls_log_err(__func__, "own certificate", ret);
		return -1;
	}
	return 0;
}

struct tls_ctx *
tls_ctx_new_server(const char *cert_path, const char *key_path)
{
	struct tls_ctx *ctx;

	if (cert_path == NULL || key_path == NULL) {
		log_warnx("%s: certificate and key are both required",
		    __func__);
		return NULL;
	}
	if ((ctx = tls_ctx_alloc(true)) == NULL)
		return NULL;
	if (tls_load_own(ctx, cert_path, key_path) == -1) {
		tls_ctx_free(ctx);
		return NULL;
	}
	mbedtls_ssl_conf_authmode(&ctx->tc_conf, MBEDTLS_SSL_VERIFY_NONE);
	return ctx;
}

struct tls_ctx *
tls_ctx_new_server_mutual(const char *cert_path, const char *key_path,
    const char *ca_path)
{
	struct tls_ctx *ctx;
	char what[512];
	int ret;

	if (ca_path == NULL) {
		log_warnx("%s: a CA is required", __func__);
		return NULL;
	}
	if ((ctx = tls_ctx_new_server(cert_path, key_path)) == NULL)
		return NULL;
	if ((ret = mbedtls_x509_crt_parse_file(&ctx->tc_ca, ca_path)) < 0 ||
	    ctx->tc_ca.version == 0) {
		snprintf(what, sizeof(what), "CA file %s", ca_path);
		tls_log_err(__func__, what,
		    ret < 0 ? ret : MBEDTLS_ERR_X509_CERT_UNKNOWN_FORMAT);
		tls_ctx_free(ctx);
		return NULL;
	}
	mbedtls_ssl_conf_ca_chain(&ctx->tc_conf, &ctx->tc_ca, NULL);
	mbedtls_ssl_conf_authmode(&ctx->tc_conf, MBEDTLS_SSL_VERIFY_REQUIRED);
	return ctx;
}

struct tls_ctx *
tls_ctx_new_client(const char *const *ca_paths, const char *cert_path,
    const char *key_path)
{
	static const char *const system_ca[] = { TLS_SYSTEM_CA_PATH, NULL };
	struct tls_ctx *ctx;
	char what[512];
	size_t i;
	int ret;

	if ((cert_path == NULL) != (key_path == NULL)) {
		log_warnx("%s: client certificate and key go together",
		    __func__);
		return NULL;
	}
	if (ca_paths == NULL || ca_paths[0] == NULL)
		ca_paths = system_ca;
	if ((ctx = tls_ctx_alloc(false)) == NULL)
		return NULL;
	for (i = 0; ca_paths[i] != NULL; i++) {
		/* > 0: some certificates of a bundle were skipped. */
		ret = mbedtls_x509_crt_parse_file(&ctx->tc_ca, ca_paths[i]);
		if (ret < 0) {
			snprintf(what, sizeof(what), "CA file %s", ca_paths[i]);
			tls_log_err(__func__, what, ret);
			tls_ctx_free(ctx);
			return NULL;
		}
		if (ret > 0)
			log_debug("%s: %s: %d certificates skipped", __func__,
			    ca_paths[i], ret);
	}
	if (ctx->tc_ca.version == 0) {
		log_warnx("%s: no usable CA certificate", __func__);
		tls_ctx_free(ctx);
		return NULL;
	}
	mbedtls_ssl_conf_ca_chain(&ctx->tc_conf, &ctx->tc_ca, NULL);
	mbedtls_ssl_conf_authmode(&ctx->tc_conf, MBEDTLS_SSL_VERIFY_REQUIRED);
	if (cert_path != NULL && tls_load_own(ctx, cert_path, key_path) == -1) {
		tls_ctx_free(ctx);
		return NULL;
	}
	return ctx;
}

void
tls_ctx_free(struct tls_ctx *ctx)
{
	if (ctx == NULL)
		return;
	mbedtls_ssl_config_free(&ctx->tc_conf);
	mbedtls_pk_free(&ctx->tc_key);
	mbedtls_x509_crt_free(&ctx->tc_cert);
	mbedtls_x509_crt_free(&ctx->tc_ca);
	mbedtls_ctr_drbg_free(&ctx->tc_drbg);
	mbedtls_entropy_free(&ctx->tc_entropy);
	free(ctx->tc_suites);
	free(ctx);
}

static int
tls_bio_send(void *arg, const unsigned char *buf, size_t len)
{
	struct tls_conn *c = arg;
	ssize_t n;

	n = send(c->tn_fd, buf, len, MSG_NOSIGNAL);
	if (n >= 0)
		return (int)n;
	switch (errno) {
	case EAGAIN:
#if EWOULDBLOCK != EAGAIN
	case EWOULDBLOCK:
#endif
	case EINTR:
		return MBEDTLS_ERR_SSL_WANT_WRITE;
	case EPIPE:
	case ECONNRESET:
		return MBEDTLS_ERR_NET_CONN_RESET;
	default:
		return MBEDTLS_ERR_NET_SEND_FAILED;
	}
}

/*
 * Read-ahead only once the handshake is done, and so only inside
 * tls_conn_read, whose callers look at tls_conn_pending before they wait
 * on the fd: bytes read ahead during a handshake could be application
 * data that nothing would come back for.
 */
static int
tls_bio_recv(void *arg, unsigned char *buf, size_t len)
{
	struct tls_conn *c = arg;
	ssize_t n;

	if (c->tn_ra_len > 0) {
		n = (ssize_t)(len < c->tn_ra_len ? len : c->tn_ra_len);
		memcpy(buf, c->tn_ra + c->tn_ra_off, (size_t)n);
		c->tn_ra_off += (size_t)n;
		c->tn_ra_len -= (size_t)n;
		if (c->tn_ra_len == 0)
			c->tn_ra_off = 0;
		return (int)n;
	}
	if (c->tn_handshaken && len < sizeof(c->tn_ra)) {
		n = read(c->tn_fd, c->tn_ra, sizeof(c->tn_ra));
		if (n > 0) {
			c->tn_ra_len = (size_t)n;
			return tls_bio_recv(arg, buf, len);
		}
	} else
		n = read(c->tn_fd, buf, len);
	if (n >= 0)
		return (int)n;
	switch (errno) {
	case EAGAIN:
#if EWOULDBLOCK != EAGAIN
	case EWOULDBLOCK:
#endif
	case EINTR:
		return MBEDTLS_ERR_SSL_WANT_READ;
	case ECONNRESET:
	case EPIPE:
		return MBEDTLS_ERR_NET_CONN_RESET;
	default:
		return MBEDTLS_ERR_NET_RECV_FAILED;
	}
}

static struct tls_conn *
tls_conn_new(struct tls_ctx *ctx, int fd, const char *hostname)
{
	struct tls_conn *c;
	int ret;

	if ((c = calloc(1, sizeof(*c))) == NULL) {
		log_warn("%s: calloc", __func__);
		return NULL;
	}
	c->tn_ctx = ctx;
	c->tn_fd = fd;
	mbedtls_ssl_init(&c->tn_ssl);
	if ((ret = mbedtls_ssl_setup(&c->tn_ssl, &ctx->tc_conf)) != 0) {
		tls_log_err(__func__, "ssl setup", ret);
		tls_conn_free(c);
		return NULL;
	}
	if (hostname != NULL &&
	    (ret = mbedtls_ssl_set_hostname(&c->tn_ssl, hostname)) != 0) {
		tls_log_err(__func__, hostname, ret);
		tls_conn_free(c);
		return NULL;
	}
	mbedtls_ssl_set_bio(&c->tn_ssl, c, tls_bio_send, tls_bio_recv, NULL);
	return c;
}

struct tls_conn *
tls_conn_new_server(struct tls_ctx *ctx, int fd)
{
	if (!ctx->tc_server) {
		log_warnx("%s: not a server context", __func__);
		return NULL;
	}
	return tls_conn_new(ctx, fd, NULL);
}

struct tls_conn *
tls_conn_new_client(struct tls_ctx *ctx, int fd, const char *hostname)
{
	if (ctx->tc_server) {
		log_warnx("%s: not a client context", __func__);
		return NULL;
	}
	if (hostname == NULL || hostname[0] == '\0') {
		log_warnx("%s: a hostname is required", __func__);
		return NULL;
	}
	return tls_conn_new(ctx, fd, hostname);
}

/* Maps an mbedTLS return code that is not a byte count to tls_result. */
static int
tls_map(struct tls_conn *c, const char *func, int ret)
{
	char buf[256];
	uint32_t flags;

	switch (ret) {
	case MBEDTLS_ERR_SSL_WANT_READ:
		return TLS_WANT_READ;
	case MBEDTLS_ERR_SSL_WANT_WRITE:
		return TLS_WANT_WRITE;
	case MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY:
	case MBEDTLS_ERR_SSL_CONN_EOF:
	case MBEDTLS_ERR_NET_CONN_RESET:
		return TLS_CLOSED;
	case MBEDTLS_ERR_X509_CERT_VERIFY_FAILED:
		flags = mbedtls_ssl_get_verify_result(&c->tn_ssl);
		if (mbedtls_x509_crt_verify_info(buf, sizeof(buf), "", flags) <
		    0)
			snprintf(buf, sizeof(buf), "flags 0x%x",
			    (unsigned)flags);
		buf[strcspn(buf, "\n")] = '\0';
		if (c->tn_ctx->tc_server)
			log_debug("%s: peer certificate: %s", func, buf);
		else
			log_warnx("%s: peer certificate: %s", func, buf);
		return TLS_ERROR;
	default:
		mbedtls_strerror(ret, buf, sizeof(buf));
		if (c->tn_ctx->tc_server)
			log_debug("%s: %s (-0x%04x)", func, buf,
			    (unsigned)-ret);
		else
			log_warnx("%s: %s (-0x%04x)", func, buf,
			    (unsigned)-ret);
		return TLS_ERROR;
	}
}

int
tls_conn_handshake(struct tls_conn *c)
{
	int ret;

	if (c->tn_handshaken)
		return TLS_OK;
	if ((ret = mbedtls_ssl_handshake(&c->tn_ssl)) != 0)
		return tls_map(c, __func__, ret);
	c->tn_handshaken = true;
	log_debug("%s: %s side: %s", __func__,
	    c->tn_ctx->tc_server ? "server" : "client", tls_conn_suite(c));
	return TLS_OK;
}

ssize_t
tls_conn_read(struct tls_conn *c, void *buf, size_t len)
{
	int ret;

	if (len == 0)
		return 0;
	if (len > INT32_MAX)
		len = INT32_MAX;
	if (!c->tn_handshaken && (ret = tls_conn_handshake(c)) != TLS_OK)
		return ret;
	ret = mbedtls_ssl_read(&c->tn_ssl, buf, len);
	if (ret > 0)
		return ret;
	if (ret == 0)
		return TLS_CLOSED;
	return tls_map(c, __func__, ret);
}

ssize_t
tls_conn_write(struct tls_conn *c, const void *buf, size_t len)
{
	int ret;

	if (len == 0)
		return 0;
	if (len > INT32_MAX)
		len = INT32_MAX;
	if (!c->tn_handshaken && (ret = tls_conn_handshake(c)) != TLS_OK)
		return ret;
	ret = mbedtls_ssl_write(&c->tn_ssl, buf, len);
	if (ret > 0)
		return ret;
	if (ret == 0)
		return TLS_WANT_WRITE;
	return tls_map(c, __func__, ret);
}

int
tls_ctx_set_alpn(struct tls_ctx *ctx, const char **protos)
{
	int ret;

	if ((ret = mbedtls_ssl_conf_alpn_protocols(&ctx->tc_conf, protos)) !=
	    0) {
		tls_log_err(__func__, "ALPN protocols", ret);
		return -1;
	}
	return 0;
}

const char *
tls_conn_suite(const struct tls_conn *c)
{
	if (!c->tn_handshaken)
		return NULL;
	return mbedtls_ssl_get_ciphersuite(&c->tn_ssl);
}

const char *
tls_conn_alpn(const struct tls_conn *c)
{
	return mbedtls_ssl_get_alpn_protocol(&c->tn_ssl);
}

size_t
tls_conn_pending(const struct tls_conn *c)
{
	return mbedtls_ssl_get_bytes_avail(&c->tn_ssl) + c->tn_ra_len;
}

int
tls_conn_close_notify(struct tls_conn *c)
{
	int ret;

	if ((ret = mbedtls_ssl_close_notify(&c->tn_ssl)) == 0)
		return TLS_OK;
	ret = tls_map(c, __func__, ret);
	/* A peer that is already gone needs no notification. */
	return ret == TLS_CLOSED ? TLS_OK : ret;
}

void
tls_conn_free(struct tls_conn *c)
{
	if (c == NULL)
		return;
	mbedtls_ssl_free(&c->tn_ssl);
	free(c);
}
