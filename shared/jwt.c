/*
 * jwt.c: JWT verification against a JWKS with mbedTLS (see jwt.h).
 */
#include "shared/jwt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>
#include <mbedtls/bignum.h>
#include <mbedtls/ecdsa.h>
#include <mbedtls/ecp.h>
#include <mbedtls/md.h>
#include <mbedtls/rsa.h>

#define JWT_KID_MAX   128
#define JWT_PART_MAX  (JWT_TOKEN_MAX * 3 / 4 + 4)
#define JWT_KEY_BYTES 1024 /* RSA modulus up to 8192 bits */

enum jwt_key_kind {
	JWT_KEY_RSA = 0,
	JWT_KEY_P256,
	JWT_KEY_P384,
};

struct jwt_key {
	char jk_kid[JWT_KID_MAX]; /* "" when the JWK has none */
	char jk_alg[8]; /* the JWK's "alg", "" when absent */
	enum jwt_key_kind jk_kind;
	mbedtls_rsa_context jk_rsa;
	mbedtls_ecp_group jk_grp;
	mbedtls_ecp_point jk_q;
};

struct jwt_keyset {
	struct jwt_key *ks_keys;
	size_t ks_n;
};

/* One signature algorithm a token may name. */
struct jwt_alg {
	const char *ja_name;
	enum jwt_key_kind ja_kind; /* the key it needs (RSA: any size) */
	mbedtls_md_type_t ja_md;
};

static const struct jwt_alg jwt_algs[] = {
	{ "RS256", JWT_KEY_RSA, MBEDTLS_MD_SHA256 },
	{ "RS384", JWT_KEY_RSA, MBEDTLS_MD_SHA384 },
	{ "RS512", JWT_KEY_RSA, MBEDTLS_MD_SHA512 },
	{ "ES256", JWT_KEY_P256, MBEDTLS_MD_SHA256 },
	{ "ES384", JWT_KEY_P384, MBEDTLS_MD_SHA384 },
};

static int jwt_b64_value(int);
static int jwt_key_rsa(struct jwt_key *, const cJSON *);
static int jwt_key_ec(struct jwt_key *, const cJSON *);
static void jwt_key_free(struct jwt_key *);
static int jwt_field(const cJSON *, const char *, unsigned char *, size_t,
    size_t *);
static const struct jwt_alg *jwt_alg_find(const char *);
static bool jwt_key_fits(const struct jwt_key *, const struct jwt_alg *);
static bool jwt_sig_ok(const struct jwt_key *, const struct jwt_alg *,
    const unsigned char *, size_t, const unsigned char *, size_t);
static cJSON *jwt_part_json(const char *, size_t);
static enum jwt_result jwt_check_claims(const cJSON *,
    const struct jwt_params *, int64_t, struct jwt_claims *);
static bool jwt_role_admin(const cJSON *, const struct jwt_params *);
static int jwt_role_of(const char *, const struct jwt_params *);

static int
jwt_b64_value(int c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '-')
		return 62;
	if (c == '_')
		return 63;
	return -1;
}

long
jwt_b64url_decode(const char *in, size_t len, unsigned char *out, size_t outmax)
{
	size_t i, o = 0;
	uint32_t acc = 0;
	int bits = 0, v;

	if (len % 4 == 1)
		return -1;
	for (i = 0; i < len; i++) {
		if ((v = jwt_b64_value((unsigned char)in[i])) < 0)
			return -1;
		acc = (acc << 6) | (uint32_t)v;
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			if (o >= outmax)
				return -1;
			out[o++] = (unsigned char)(acc >> bits);
			acc &= (1u << bits) - 1;
		}
	}
	/* Leftover bits must be zero (canonical encoding). */
	if (acc != 0)
		return -1;
	return (long)o;
}

/* Decodes the base64url string member name of o into buf. */
static int
jwt_field(const cJSON *o, const char *name, unsigned char *buf, size_t max,
    size_t *n)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
	long l;

	if (!cJSON_IsString(v) || v->valuestring[0] == '\0')
		return -1;
	if ((l = jwt_b64url_decode(v->valuestring, strlen(v->valuestring), buf,
	         max)) <= 0)
		return -1;
	*n = (size_t)l;
	return 0;
}

static int
jwt_key_rsa(struct jwt_key *k, const cJSON *jwk)
{
	unsigned char n[JWT_KEY_BYTES], e[16];
	size_t nl, el;

	if (jwt_field(jwk, "n", n, sizeof(n), &nl) == -1 ||
	    jwt_field(jwk, "e", e, sizeof(e), &el) == -1)
		return -1;
	/* Shorter than 2048 bits is not a key to trust. */
	while (nl > 0 && n[0] == 0) {
		memmove(n, n + 1, --nl);
	}
	if (nl < 256)
		return -1;
	k->jk_kind = JWT_KEY_RSA;
	if (mbedtls_rsa_import_raw(&k->jk_rsa, n, nl, NULL, 0, NULL, 0, NULL, 0,
	        e, el) != 0 ||
	    mbedtls_rsa_complete(&k->jk_rsa) != 0 ||
	    mbedtls_rsa_check_pubkey(&k->jk_rsa) != 0)
		return -1;
	return 0;
}

static int
jwt_key_ec(struct jwt_key *k, const cJSON *jwk)
{
	const cJSON *crv = cJSON_GetObjectItemCaseSensitive(jwk, "crv");
	unsigned char pt[1 + 2 * 48], x[48], y[48];
	size_t xl, yl, sz;

	if (!cJSON_IsString(crv))
		return -1;
	if (strcmp(crv->valuestring, "P-256") == 0) {
		k->jk_kind = JWT_KEY_P256;
		sz = 32;
	} else if (strcmp(crv->valuestring, "P-384") == 0) {
		k->jk_kind = JWT_KEY_P384;
		sz = 48;
	} else
		return -1;
	if (jwt_field(jwk, "x", x, sizeof(x), &xl) == -1 ||
	    jwt_field(jwk, "y", y, sizeof(y), &yl) == -1 || xl != sz ||
	    yl != sz)
		return -1;
	pt[0] = 0x04;
	memcpy(pt + 1, x, sz);
	memcpy(pt + 1 + sz, y, sz);
	if (mbedtls_ecp_group_load(&k->jk_grp,
	        k->jk_kind == JWT_KEY_P256 ? MBEDTLS_ECP_DP_SECP256R1
	                                   : MBEDTLS_ECP_DP_SECP384R1) != 0 ||
	    mbedtls_ecp_point_read_binary(&k->jk_grp, &k->jk_q, pt,
	        1 + 2 * sz) != 0 ||
	    mbedtls_ecp_check_pubkey(&k->jk_grp, &k->jk_q) != 0)
		return -1;
	return 0;
}

static void
jwt_key_free(struct jwt_key *k)
{
	mbedtls_rsa_free(&k->jk_rsa);
	mbedtls_ecp_group_free(&k->jk_grp);
	mbedtls_ecp_point_free(&k->jk_q);
}

struct jwt_keyset *
jwt_keyset_parse(const char *json, size_t len, size_t *skipped, char *err,
    size_t errlen)
{
	struct jwt_keyset *ks;
	const cJSON *keys, *jwk, *kty, *kid, *use, *alg;
	struct jwt_key *k;
	cJSON *doc;
	size_t bad = 0, n;
	int rc;

	if ((doc = cJSON_ParseWithLength(json, len)) == NULL) {
		snprintf(err, errlen, "not JSON");
		return NULL;
	}
	keys = cJSON_GetObjectItemCaseSensitive(doc, "keys");
	if (!cJSON_IsArray(keys)) {
		snprintf(err, errlen, "no \"keys\" array");
		cJSON_Delete(doc);
		return NULL;
	}
	n = (size_t)cJSON_GetArraySize(keys);
	if ((ks = calloc(1, sizeof(*ks))) == NULL ||
	    (ks->ks_keys = calloc(n ? n : 1, sizeof(*ks->ks_keys))) == NULL) {
		free(ks);
		cJSON_Delete(doc);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	cJSON_ArrayForEach(jwk, keys)
	{
		k = &ks->ks_keys[ks->ks_n];
		memset(k, 0, sizeof(*k));
		mbedtls_rsa_init(&k->jk_rsa, MBEDTLS_RSA_PKCS_V15, 0);
		mbedtls_ecp_group_init(&k->jk_grp);
		mbedtls_ecp_point_init(&k->jk_q);
		kty = cJSON_GetObjectItemCaseSensitive(jwk, "kty");
		kid = cJSON_GetObjectItemCaseSensitive(jwk, "kid");
		use = cJSON_GetObjectItemCaseSensitive(jwk, "use");
		alg = cJSON_GetObjectItemCaseSensitive(jwk, "alg");
		rc = -1;
		if (!cJSON_IsString(kty) ||
		    (use != NULL &&
		        (!cJSON_IsString(use) ||
		            strcmp(use->valuestring, "sig") != 0)) ||
		    (kid != NULL &&
		        (!cJSON_IsString(kid) ||
		            strlen(kid->valuestring) >= JWT_KID_MAX)) ||
		    (alg != NULL &&
		        (!cJSON_IsString(alg) ||
		            jwt_alg_find(alg->valuestring) == NULL)))
			rc = -1;
		else if (strcmp(kty->valuestring, "RSA") == 0)
			rc = jwt_key_rsa(k, jwk);
		else if (strcmp(kty->valuestring, "EC") == 0)
			rc = jwt_key_ec(k, jwk);
		if (rc == 0 && alg != NULL &&
		    !jwt_key_fits(k, jwt_alg_find(alg->valuestring)))
			rc = -1;
		if (rc == -1) {
			jwt_key_free(k);
			bad++;
			continue;
		}
		if (kid != NULL)
			snprintf(k->jk_kid, sizeof(k->jk_kid), "%s",
			    kid->valuestring);
		if (alg != NULL)
			snprintf(k->jk_alg, sizeof(k->jk_alg), "%s",
			    alg->valuestring);
		ks->ks_n++;
	}
	cJSON_Delete(doc);
	if (skipped != NULL)
		*skipped = bad;
	if (ks->ks_n == 0) {
		snprintf(err, errlen,
		    "no usable RSA or EC signature key (%zu "
		    "skipped)",
		    bad);
		jwt_keyset_free(ks);
		return NULL;
	}
	return ks;
}

void
jwt_keyset_free(struct jwt_keyset *ks)
{
	size_t i;

	if (ks == NULL)
		return;
	for (i = 0; i < ks->ks_n; i++)
		jwt_key_free(&ks->ks_keys[i]);
	free(ks->ks_keys);
	free(ks);
}

size_t
jwt_keyset_size(const struct jwt_keyset *ks)
{
	return ks == NULL ? 0 : ks->ks_n;
}

static const struct jwt_alg *
jwt_alg_find(const char *name)
{
	size_t i;

	for (i = 0; i < sizeof(jwt_algs) / sizeof(jwt_algs[0]); i++) {
		if (strcmp(jwt_algs[i].ja_name, name) == 0)
			return &jwt_algs[i];
	}
	return NULL;
}

static bool
jwt_key_fits(const struct jwt_key *k, const struct jwt_alg *a)
{
	if (a == NULL || k->jk_kind != a->ja_kind)
		return false;
	return k->jk_alg[0] == '\0' || strcmp(k->jk_alg, a->ja_name) == 0;
}

static bool
jwt_sig_ok(const struct jwt_key *k, const struct jwt_alg *a,
    const unsigned char *msg, size_t msglen, const unsigned char *sig,
    size_t siglen)
{
	const mbedtls_md_info_t *md = mbedtls_md_info_from_type(a->ja_md);
	unsigned char hash[MBEDTLS_MD_MAX_SIZE];
	mbedtls_mpi r, s;
	size_t half, hlen;
	bool ok;

	if (md == NULL || mbedtls_md(md, msg, msglen, hash) != 0)
		return false;
	hlen = mbedtls_md_get_size(md);
	if (k->jk_kind == JWT_KEY_RSA) {
		if (siglen != mbedtls_rsa_get_len(&k->jk_rsa))
			return false;
		/* The context is only read; the API is not const. */
		return mbedtls_rsa_pkcs1_verify(
		           (mbedtls_rsa_context *)&k->jk_rsa, NULL, NULL,
		           MBEDTLS_RSA_PUBLIC, a->ja_md, (unsigned)hlen, hash,
		           sig) == 0;
	}
	/* JWS ECDSA signatures are r || s, each the curve's size. */
	half = k->jk_kind == JWT_KEY_P256 ? 32 : 48;
	if (siglen != 2 * half)
		return false;
	mbedtls_mpi_init(&r);
	mbedtls_mpi_init(&s);
	ok = mbedtls_mpi_read_binary(&r, sig, half) == 0 &&
	    mbedtls_mpi_read_binary(&s, sig + half, half) == 0 &&
	    mbedtls_ecdsa_verify((mbedtls_ecp_group *)&k->jk_grp, hash, hlen,
	        &k->jk_q, &r, &s) == 0;
	mbedtls_mpi_free(&r);
	mbedtls_mpi_free(&s);
	return ok;
}

/* A base64url part holding a JSON object, parsed; NULL if not one. */
static cJSON *
jwt_part_json(const char *p, size_t n)
{
	unsigned char *buf;
	cJSON *o;
	long l;

	if ((buf = malloc(JWT_PART_MAX)) == NULL)
		return NULL;
	l = jwt_b64url_decode(p, n, buf, JWT_PART_MAX);
	o = l > 0 ? cJSON_ParseWithLength((const char *)buf, (size_t)l) : NULL;
	free(buf);
	if (o != NULL && !cJSON_IsObject(o)) {
		cJSON_Delete(o);
		return NULL;
	}
	return o;
}

bool
jwt_looks_like(const char *token, size_t len)
{
	const char *d1, *d2;

	if ((d1 = memchr(token, '.', len)) == NULL)
		return false;
	d2 = memchr(d1 + 1, '.', len - (size_t)(d1 + 1 - token));
	return d2 != NULL &&
	    memchr(d2 + 1, '.', len - (size_t)(d2 + 1 - token)) == NULL;
}

/* 1: admin, 0: user, -1: not a role this name maps to. */
static int
jwt_role_of(const char *v, const struct jwt_params *p)
{
	const char *eq;
	size_t i, n;

	if (p->jp_role_map_n == 0) {
		if (strcasecmp(v, "admin") == 0)
			return 1;
		return strcasecmp(v, "user") == 0 ? 0 : -1;
	}
	n = strlen(v);
	for (i = 0; i < p->jp_role_map_n; i++) {
		eq = strchr(p->jp_role_map[i], '=');
		if (eq != NULL && (size_t)(eq - p->jp_role_map[i]) == n &&
		    strncmp(p->jp_role_map[i], v, n) == 0)
			return strcasecmp(eq + 1, "admin") == 0 ? 1 : 0;
	}
	return -1;
}

static bool
jwt_role_admin(const cJSON *claims, const struct jwt_params *p)
{
	static const char *const alternates[] = { "role", "roles", "groups",
		"group" };
	const cJSON *vals[4], *v, *e;
	size_t i, n = 0;
	int r;

	v = cJSON_GetObjectItemCaseSensitive(claims,
	    p->jp_role_claim != NULL ? p->jp_role_claim : "roles");
	if (v != NULL)
		vals[n++] = v;
	else {
		for (i = 0; i < 4; i++) {
			v = cJSON_GetObjectItemCaseSensitive(claims,
			    alternates[i]);
			if (v != NULL)
				vals[n++] = v;
		}
	}
	/* The first value that names a role decides, as SMG does. */
	for (i = 0; i < n; i++) {
		if (cJSON_IsString(vals[i])) {
			if ((r = jwt_role_of(vals[i]->valuestring, p)) >= 0)
				return r == 1;
			continue;
		}
		if (!cJSON_IsArray(vals[i]))
			continue;
		cJSON_ArrayForEach(e, vals[i])
		{
			if (cJSON_IsString(e) &&
			    (r = jwt_role_of(e->valuestring, p)) >= 0)
				return r == 1;
		}
	}
	return false;
}

static enum jwt_result
jwt_check_claims(const cJSON *c, const struct jwt_params *p, int64_t now,
    struct jwt_claims *out)
{
	const cJSON *exp, *nbf, *iss, *aud, *sub, *e;
	bool aud_ok = false;

	exp = cJSON_GetObjectItemCaseSensitive(c, "exp");
	nbf = cJSON_GetObjectItemCaseSensitive(c, "nbf");
	iss = cJSON_GetObjectItemCaseSensitive(c, "iss");
	aud = cJSON_GetObjectItemCaseSensitive(c, "aud");
	sub = cJSON_GetObjectItemCaseSensitive(c, "sub");
	if (!cJSON_IsNumber(exp) || (nbf != NULL && !cJSON_IsNumber(nbf)))
		return JWT_MALFORMED;
	if (exp->valuedouble + (double)p->jp_leeway_secs <= (double)now)
		return JWT_EXPIRED;
	if (nbf != NULL &&
	    nbf->valuedouble - (double)p->jp_leeway_secs > (double)now)
		return JWT_NOT_YET_VALID;
	if (p->jp_issuer != NULL &&
	    (!cJSON_IsString(iss) || strcmp(iss->valuestring, p->jp_issuer)))
		return JWT_BAD_ISSUER;
	if (p->jp_audience != NULL) {
		if (cJSON_IsString(aud))
			aud_ok = strcmp(aud->valuestring, p->jp_audience) == 0;
		else if (cJSON_IsArray(aud)) {
			cJSON_ArrayForEach(e, aud)
			{
				if (cJSON_IsString(e) &&
				    strcmp(e->valuestring, p->jp_audience) == 0)
					aud_ok = true;
			}
		}
		if (!aud_ok)
			return JWT_BAD_AUDIENCE;
	}
	snprintf(out->jc_subject, sizeof(out->jc_subject), "%s",
	    cJSON_IsString(sub) ? sub->valuestring : "");
	out->jc_exp = (int64_t)exp->valuedouble;
	out->jc_admin = jwt_role_admin(c, p);
	return JWT_OK;
}

enum jwt_result
jwt_verify(const struct jwt_keyset *ks, const struct jwt_params *p,
    const char *token, size_t len, int64_t now, struct jwt_claims *out)
{
	const char *d1, *d2;
	const cJSON *alg, *kid;
	const struct jwt_alg *a;
	const struct jwt_key *k;
	unsigned char *sig = NULL;
	cJSON *head = NULL, *claims = NULL;
	enum jwt_result rc;
	bool kid_seen = false, ok = false;
	size_t i;
	long sl;

	if (len == 0 || len > JWT_TOKEN_MAX || !jwt_looks_like(token, len))
		return JWT_MALFORMED;
	d1 = memchr(token, '.', len);
	d2 = memchr(d1 + 1, '.', len - (size_t)(d1 + 1 - token));
	if ((head = jwt_part_json(token, (size_t)(d1 - token))) == NULL)
		return JWT_MALFORMED;
	alg = cJSON_GetObjectItemCaseSensitive(head, "alg");
	kid = cJSON_GetObjectItemCaseSensitive(head, "kid");
	/* none, HS*, and anything else unknown stop here. */
	if (!cJSON_IsString(alg) ||
	    (a = jwt_alg_find(alg->valuestring)) == NULL) {
		rc = JWT_ALG;
		goto out;
	}
	if (kid != NULL && !cJSON_IsString(kid)) {
		rc = JWT_MALFORMED;
		goto out;
	}
	if ((sig = malloc(JWT_PART_MAX)) == NULL) {
		rc = JWT_NOMEM;
		goto out;
	}
	sl = jwt_b64url_decode(d2 + 1, len - (size_t)(d2 + 1 - token), sig,
	    JWT_PART_MAX);
	if (sl <= 0) {
		rc = JWT_MALFORMED;
		goto out;
	}
	for (i = 0; ks != NULL && i < ks->ks_n && !ok; i++) {
		k = &ks->ks_keys[i];
		if (kid != NULL && strcmp(k->jk_kid, kid->valuestring) != 0)
			continue;
		kid_seen = true;
		if (!jwt_key_fits(k, a))
			continue;
		ok = jwt_sig_ok(k, a, (const unsigned char *)token,
		    (size_t)(d2 - token), sig, (size_t)sl);
	}
	if (!ok) {
		rc = !kid_seen ? JWT_UNKNOWN_KID : JWT_BAD_SIGNATURE;
		goto out;
	}
	if ((claims = jwt_part_json(d1 + 1, (size_t)(d2 - d1 - 1))) == NULL) {
		rc = JWT_MALFORMED;
		goto out;
	}
	rc = jwt_check_claims(claims, p, now, out);
out:
	free(sig);
	cJSON_Delete(head);
	cJSON_Delete(claims);
	return rc;
}

const char *
jwt_strerror(enum jwt_result r)
{
	switch (r) {
	case JWT_OK:
		return "ok";
	case JWT_MALFORMED:
		return "malformed token";
	case JWT_ALG:
		return "algorithm not accepted";
	case JWT_UNKNOWN_KID:
		return "unknown signing key";
	case JWT_BAD_SIGNATURE:
		return "bad signature";
	case JWT_EXPIRED:
		return "token expired";
	case JWT_NOT_YET_VALID:
		return "token not yet valid";
	case JWT_BAD_ISSUER:
		return "wrong issuer";
	case JWT_BAD_AUDIENCE:
		return "wrong audience";
	case JWT_NOMEM:
		return "out of memory";
	}
	return "unknown error";
}
