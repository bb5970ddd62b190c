/*
 * jwt_test.c: unit tests of shared/jwt.c, with RSA and EC keys made at
 * test time and tokens signed here with mbedTLS.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <mbedtls/ctr_drbg.h>
#include <mbedtls/ecdsa.h>
#include <mbedtls/entropy.h>
#include <mbedtls/md.h>
#include <mbedtls/rsa.h>

#include "shared/jwt.h"

static mbedtls_entropy_context entropy;
static mbedtls_ctr_drbg_context drbg;
static mbedtls_rsa_context rsa;
static mbedtls_ecdsa_context ec;
static char jwks[4096];

static void
b64url(const unsigned char *in, size_t n, char *out)
{
	static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrs"
	                        "tuvwxyz0123456789-_";
	size_t i, o = 0;
	uint32_t acc = 0;
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

static int
setup(void **state)
{
	unsigned char n[256], e[3], x[32], y[32], pt[65];
	char ns[400], es[8], xs[64], ys[64];
	size_t ptl;

	(void)state;
	mbedtls_entropy_init(&entropy);
	mbedtls_ctr_drbg_init(&drbg);
	if (mbedtls_ctr_drbg_seed(&drbg, mbedtls_entropy_func, &entropy, NULL,
	        0) != 0)
		return -1;
	mbedtls_rsa_init(&rsa, MBEDTLS_RSA_PKCS_V15, 0);
	if (mbedtls_rsa_gen_key(&rsa, mbedtls_ctr_drbg_random, &drbg, 2048,
	        65537) != 0)
		return -1;
	mbedtls_ecdsa_init(&ec);
	if (mbedtls_ecdsa_genkey(&ec, MBEDTLS_ECP_DP_SECP256R1,
	        mbedtls_ctr_drbg_random, &drbg) != 0)
		return -1;
	if (mbedtls_rsa_export_raw(&rsa, n, sizeof(n), NULL, 0, NULL, 0, NULL,
	        0, e, sizeof(e)) != 0)
		return -1;
	if (mbedtls_ecp_point_write_binary(&ec.grp, &ec.Q,
	        MBEDTLS_ECP_PF_UNCOMPRESSED, &ptl, pt, sizeof(pt)) != 0)
		return -1;
	memcpy(x, pt + 1, 32);
	memcpy(y, pt + 33, 32);
	b64url(n, sizeof(n), ns);
	b64url(e, sizeof(e), es);
	b64url(x, 32, xs);
	b64url(y, 32, ys);
	snprintf(jwks, sizeof(jwks),
	    "{\"keys\":[{\"kty\":\"RSA\",\"kid\":\"r1\",\"use\":\"sig\","
	    "\"n\":\"%s\",\"e\":\"%s\"},"
	    "{\"kty\":\"EC\",\"kid\":\"e1\",\"crv\":\"P-256\",\"x\":\"%s\","
	    "\"y\":\"%s\"},{\"kty\":\"oct\",\"kid\":\"h1\",\"k\":\"c2VjcmV0\"}]"
	    "}",
	    ns, es, xs, ys);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	mbedtls_rsa_free(&rsa);
	mbedtls_ecdsa_free(&ec);
	mbedtls_ctr_drbg_free(&drbg);
	mbedtls_entropy_free(&entropy);
	return 0;
}

/* A token: header and claims as given, signed with alg's test key. */
static char *
mint(const char *header, const char *claims, const char *alg)
{
	unsigned char hash[64], sig[512];
	char *tok = malloc(JWT_TOKEN_MAX);
	mbedtls_mpi r, s;
	size_t n, sl = 0;

	b64url((const unsigned char *)header, strlen(header), tok);
	n = strlen(tok);
	tok[n++] = '.';
	b64url((const unsigned char *)claims, strlen(claims), tok + n);
	n = strlen(tok);
	if (strcmp(alg, "RS256") == 0) {
		mbedtls_md(mbedtls_md_info_from_type(MBEDTLS_MD_SHA256),
		    (unsigned char *)tok, n, hash);
		assert_int_equal(
		    mbedtls_rsa_pkcs1_sign(&rsa, mbedtls_ctr_drbg_random, &drbg,
		        MBEDTLS_RSA_PRIVATE, MBEDTLS_MD_SHA256, 32, hash, sig),
		    0);
		sl = 256;
	} else if (strcmp(alg, "ES256") == 0) {
		mbedtls_md(mbedtls_md_info_from_type(MBEDTLS_MD_SHA256),
		    (unsigned char *)tok, n, hash);
		mbedtls_mpi_init(&r);
		mbedtls_mpi_init(&s);
		assert_int_equal(mbedtls_ecdsa_sign(&ec.grp, &r, &s, &ec.d,
		                     hash, 32, mbedtls_ctr_drbg_random, &drbg),
		    0);
		mbedtls_mpi_write_binary(&r, sig, 32);
		mbedtls_mpi_write_binary(&s, sig + 32, 32);
		mbedtls_mpi_free(&r);
		mbedtls_mpi_free(&s);
		sl = 64;
	}
	tok[n++] = '.';
	b64url(sig, sl, tok + n);
	return tok;
}

static const struct jwt_params params = {
	.jp_issuer = "https://idp.test",
	.jp_audience = "smg",
	.jp_leeway_secs = JWT_LEEWAY_SECS,
};

static enum jwt_result
check(const char *header, const char *claims, const char *alg,
    const struct jwt_params *p, struct jwt_claims *out)
{
	struct jwt_keyset *ks;
	enum jwt_result rc;
	char err[128], *tok;
	size_t skipped;

	ks = jwt_keyset_parse(jwks, strlen(jwks), &skipped, err, sizeof(err));
	assert_non_null(ks);
	assert_int_equal(jwt_keyset_size(ks), 2);
	assert_int_equal(skipped, 1); /* the HMAC key is never a key */
	tok = mint(header, claims, alg);
	rc = jwt_verify(ks, p, tok, strlen(tok), (int64_t)time(NULL), out);
	free(tok);
	jwt_keyset_free(ks);
	return rc;
}

static void
test_valid_tokens(void **state)
{
	struct jwt_claims c;
	char claims[256];
	long now = (long)time(NULL);

	(void)state;
	snprintf(claims, sizeof(claims),
	    "{\"iss\":\"https://idp.test\",\"aud\":[\"x\",\"smg\"],"
	    "\"sub\":\"alice\",\"exp\":%ld,\"roles\":[\"admin\"]}",
	    now + 60);
	assert_int_equal(check("{\"alg\":\"RS256\",\"kid\":\"r1\"}", claims,
	                     "RS256", &params, &c),
	    JWT_OK);
	assert_string_equal(c.jc_subject, "alice");
	assert_true(c.jc_admin);
	snprintf(claims, sizeof(claims),
	    "{\"iss\":\"https://idp.test\",\"aud\":\"smg\",\"exp\":%ld,"
	    "\"groups\":\"ops\"}",
	    now + 60);
	assert_int_equal(check("{\"alg\":\"ES256\",\"kid\":\"e1\"}", claims,
	                     "ES256", &params, &c),
	    JWT_OK);
	assert_false(c.jc_admin); /* no role: user */
}

static void
test_role_mapping(void **state)
{
	char *map[] = { "ops=admin" };
	struct jwt_params p = params;
	struct jwt_claims c;
	char claims[256];

	(void)state;
	p.jp_role_map = map;
	p.jp_role_map_n = 1;
	p.jp_role_claim = "team";
	snprintf(claims, sizeof(claims),
	    "{\"iss\":\"https://idp.test\",\"aud\":\"smg\",\"exp\":%ld,"
	    "\"groups\":[\"dev\",\"ops\"]}",
	    (long)time(NULL) + 60);
	assert_int_equal(check("{\"alg\":\"ES256\"}", claims, "ES256", &p, &c),
	    JWT_OK);
	assert_true(c.jc_admin);
}

static void
test_refused(void **state)
{
	struct jwt_claims c;
	char claims[256], none[1024], *tok, *dot;
	long now = (long)time(NULL);
	struct jwt_keyset *ks;
	char err[64];

	(void)state;
	snprintf(claims, sizeof(claims),
	    "{\"iss\":\"https://idp.test\",\"aud\":\"smg\",\"exp\":%ld}",
	    now - 3600);
	assert_int_equal(check("{\"alg\":\"RS256\",\"kid\":\"r1\"}", claims,
	                     "RS256", &params, &c),
	    JWT_EXPIRED);
	snprintf(claims, sizeof(claims),
	    "{\"iss\":\"https://idp.test\",\"aud\":\"smg\",\"exp\":%ld,"
	    "\"nbf\":%ld}",
	    now + 7200, now + 3600);
	assert_int_equal(check("{\"alg\":\"RS256\",\"kid\":\"r1\"}", claims,
	                     "RS256", &params, &c),
	    JWT_NOT_YET_VALID);
	snprintf(claims, sizeof(claims),
	    "{\"iss\":\"https://evil.test\",\"aud\":\"smg\",\"exp\":%ld}",
	    now + 60);
	assert_int_equal(check("{\"alg\":\"RS256\",\"kid\":\"r1\"}", claims,
	                     "RS256", &params, &c),
	    JWT_BAD_ISSUER);
	snprintf(claims, sizeof(claims),
	    "{\"iss\":\"https://idp.test\",\"aud\":\"other\",\"exp\":%ld}",
	    now + 60);
	assert_int_equal(check("{\"alg\":\"RS256\",\"kid\":\"r1\"}", claims,
	                     "RS256", &params, &c),
	    JWT_BAD_AUDIENCE);
	snprintf(claims, sizeof(claims),
	    "{\"iss\":\"https://idp.test\",\"aud\":\"smg\",\"exp\":%ld}",
	    now + 60);
	/* Signed by the EC key, presented as the RSA one. */
	assert_int_equal(check("{\"alg\":\"ES256\",\"kid\":\"r1\"}", claims,
	                     "ES256", &params, &c),
	    JWT_BAD_SIGNATURE);
	assert_int_equal(check("{\"alg\":\"RS256\",\"kid\":\"zz\"}", claims,
	                     "RS256", &params, &c),
	    JWT_UNKNOWN_KID);
	assert_int_equal(check("{\"alg\":\"HS256\",\"kid\":\"h1\"}", claims,
	                     "RS256", &params, &c),
	    JWT_ALG);
	assert_int_equal(
	    check("{\"alg\":\"none\"}", claims, "RS256", &params, &c), JWT_ALG);

	/* A flipped signature byte. */
	ks = jwt_keyset_parse(jwks, strlen(jwks), NULL, err, sizeof(err));
	tok = mint("{\"alg\":\"RS256\",\"kid\":\"r1\"}", claims, "RS256");
	dot = strrchr(tok, '.');
	dot[5] = dot[5] == 'A' ? 'B' : 'A';
	assert_int_equal(jwt_verify(ks, &params, tok, strlen(tok), now, &c),
	    JWT_BAD_SIGNATURE);
	/* alg none with an empty signature. */
	snprintf(none, sizeof(none), "%s", tok);
	*strrchr(none, '.') = '\0';
	strcat(none, ".");
	assert_int_equal(jwt_verify(ks, &params, none, strlen(none), now, &c),
	    JWT_MALFORMED);
	assert_int_equal(jwt_verify(ks, &params, "a.b", 3, now, &c),
	    JWT_MALFORMED);
	assert_int_equal(jwt_verify(NULL, &params, tok, strlen(tok), now, &c),
	    JWT_UNKNOWN_KID);
	free(tok);
	jwt_keyset_free(ks);
	assert_null(
	    jwt_keyset_parse("{\"keys\":[]}", 11, NULL, err, sizeof(err)));
	assert_null(jwt_keyset_parse("[", 1, NULL, err, sizeof(err)));
}

static void
test_b64url(void **state)
{
	unsigned char out[8];

	(void)state;
	assert_int_equal(jwt_b64url_decode("YWJj", 4, out, sizeof(out)), 3);
	assert_memory_equal(out, "abc", 3);
	assert_int_equal(jwt_b64url_decode("YWI", 3, out, sizeof(out)), 2);
	assert_int_equal(jwt_b64url_decode("YWI=", 4, out, sizeof(out)), -1);
	assert_int_equal(jwt_b64url_decode("Y", 1, out, sizeof(out)), -1);
	assert_int_equal(jwt_b64url_decode("YWJjZGVmZ2hp", 12, out, 8), -1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_b64url),
		cmocka_unit_test(test_valid_tokens),
		cmocka_unit_test(test_role_mapping),
		cmocka_unit_test(test_refused),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
