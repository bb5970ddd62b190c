/*
 * jwt-bench: the cost of one JWT verification (shared/jwt.c) per
 * algorithm, and of the digest that a hit in the frontend's cache of
 * verified tokens costs instead. Keys are made here; run by hand:
 *   build-release/jwt-bench [iterations]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/ecdsa.h>
#include <mbedtls/entropy.h>
#include <mbedtls/md.h>
#include <mbedtls/rsa.h>
#include <mbedtls/sha256.h>

#include "shared/jwt.h"

static mbedtls_ctr_drbg_context drbg;

static void
b64url(const unsigned char *in, size_t n, char *out)
{
	static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrs"
	                        "tuvwxyz0123456789-_";
	size_t i, o = 0;
	unsigned acc = 0;
	int bits = 0;

	for (i = 0; i < n; i++) {
		acc = (acc << 8) | in[i];
		bits += 8;
		while (bits >= 6) {
			bits -= 6;
			out[o++] = t[(acc >> bits) & 63];
		}
	}
	if (bits > 0)
		out[o++] = t[(acc << (6 - bits)) & 63];
	out[o] = '\0';
}

static double
now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void
run(const char *name, const char *jwks, const char *tok, long iters)
{
	const struct jwt_params p = { .jp_issuer = "https://idp.test",
		.jp_audience = "smg",
		.jp_leeway_secs = JWT_LEEWAY_SECS };
	struct jwt_keyset *ks;
	struct jwt_claims c;
	unsigned char d[32];
	double t0, t1;
	char err[128];
	long i;

	if ((ks = jwt_keyset_parse(jwks, strlen(jwks), NULL, err,
	         sizeof(err))) == NULL) {
		fprintf(stderr, "%s: %s\n", name, err);
		exit(1);
	}
	t0 = now_us();
	for (i = 0; i < iters; i++) {
		if (jwt_verify(ks, &p, tok, strlen(tok), (int64_t)time(NULL),
		        &c) != JWT_OK) {
			fprintf(stderr, "%s: not verified\n", name);
			exit(1);
		}
	}
	t1 = now_us();
	printf("%s: %.1f us per verification (%ld)\n", name,
	    (t1 - t0) / (double)iters, iters);
	t0 = now_us();
	for (i = 0; i < iters * 10; i++)
		mbedtls_sha256_ret((const unsigned char *)tok, strlen(tok), d,
		    0);
	t1 = now_us();
	printf("%s: %.2f us per cache hit (token digest)\n", name,
	    (t1 - t0) / (double)(iters * 10));
	jwt_keyset_free(ks);
}

int
main(int argc, char *argv[])
{
	static char jwks[4096], tok[4096], ns[400], es[8], xs[64], ys[64];
	unsigned char n[256], e[3], pt[65], hash[32], sig[256];
	mbedtls_entropy_context entropy;
	mbedtls_rsa_context rsa;
	mbedtls_ecdsa_context ec;
	mbedtls_mpi r, s;
	char claims[256], head[128];
	long iters = argc > 1 ? atol(argv[1]) : 2000;
	size_t ptl, k;

	mbedtls_entropy_init(&entropy);
	mbedtls_ctr_drbg_init(&drbg);
	mbedtls_ctr_drbg_seed(&drbg, mbedtls_entropy_func, &entropy, NULL, 0);
	mbedtls_rsa_init(&rsa, MBEDTLS_RSA_PKCS_V15, 0);
	mbedtls_ecdsa_init(&ec);
	if (mbedtls_rsa_gen_key(&rsa, mbedtls_ctr_drbg_random, &drbg, 2048,
	        65537) != 0 ||
	    mbedtls_ecdsa_genkey(&ec, MBEDTLS_ECP_DP_SECP256R1,
	        mbedtls_ctr_drbg_random, &drbg) != 0)
		return 1;
	mbedtls_rsa_export_raw(&rsa, n, sizeof(n), NULL, 0, NULL, 0, NULL, 0, e,
	    sizeof(e));
	mbedtls_ecp_point_write_binary(&ec.grp, &ec.Q,
	    MBEDTLS_ECP_PF_UNCOMPRESSED, &ptl, pt, sizeof(pt));
	b64url(n, sizeof(n), ns);
	b64url(e, sizeof(e), es);
	b64url(pt + 1, 32, xs);
	b64url(pt + 33, 32, ys);
	snprintf(jwks, sizeof(jwks),
	    "{\"keys\":[{\"kty\":\"RSA\",\"kid\":\"r\",\"n\":\"%s\","
	    "\"e\":\"%s\"},{\"kty\":\"EC\",\"kid\":\"e\",\"crv\":\"P-256\","
	    "\"x\":\"%s\",\"y\":\"%s\"}]}",
	    ns, es, xs, ys);
	snprintf(claims, sizeof(claims),
	    "{\"iss\":\"https://idp.test\",\"aud\":\"smg\",\"sub\":\"a\","
	    "\"exp\":%ld,\"roles\":[\"admin\"]}",
	    (long)time(NULL) + 3600);

	b64url((const unsigned char *)"{\"alg\":\"RS256\",\"kid\":\"r\"}", 26,
	    head);
	k = (size_t)snprintf(tok, sizeof(tok), "%s.", head);
	b64url((const unsigned char *)claims, strlen(claims), tok + k);
	k = strlen(tok);
	mbedtls_sha256_ret((unsigned char *)tok, k, hash, 0);
	mbedtls_rsa_pkcs1_sign(&rsa, mbedtls_ctr_drbg_random, &drbg,
	    MBEDTLS_RSA_PRIVATE, MBEDTLS_MD_SHA256, 32, hash, sig);
	tok[k++] = '.';
	b64url(sig, 256, tok + k);
	run("RS256 (2048-bit)", jwks, tok, iters);

	b64url((const unsigned char *)"{\"alg\":\"ES256\",\"kid\":\"e\"}", 26,
	    head);
	k = (size_t)snprintf(tok, sizeof(tok), "%s.", head);
	b64url((const unsigned char *)claims, strlen(claims), tok + k);
	k = strlen(tok);
	mbedtls_sha256_ret((unsigned char *)tok, k, hash, 0);
	mbedtls_mpi_init(&r);
	mbedtls_mpi_init(&s);
	mbedtls_ecdsa_sign(&ec.grp, &r, &s, &ec.d, hash, 32,
	    mbedtls_ctr_drbg_random, &drbg);
	mbedtls_mpi_write_binary(&r, sig, 32);
	mbedtls_mpi_write_binary(&s, sig + 32, 32);
	tok[k++] = '.';
	b64url(sig, 64, tok + k);
	run("ES256 (P-256)", jwks, tok, iters / 4 > 0 ? iters / 4 : 1);

	mbedtls_mpi_free(&r);
	mbedtls_mpi_free(&s);
	mbedtls_rsa_free(&rsa);
	mbedtls_ecdsa_free(&ec);
	mbedtls_ctr_drbg_free(&drbg);
	mbedtls_entropy_free(&entropy);
	return 0;
}
