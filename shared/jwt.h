/*
 * jwt.h: verifying JSON Web Tokens (RFC 7519) signed with a key of a JSON
 * Web Key Set (RFC 7517): RS256/384/512 and ES256/384, through mbedTLS.
 *
 * Nothing else is accepted: "alg": "none" and the HMAC algorithms are
 * refused whatever the key set holds (an RSA public key must never serve
 * as an HMAC secret), and a token's alg must fit its key (RS* needs an RSA
 * key, ES256 a P-256 key, ES384 a P-384 key; a key's own "alg", when
 * given, must be the token's). Claims checked: exp (required), nbf, iss
 * (exact), aud (string or array holding the audience), all with a leeway.
 * The role comes from the configured claim, else from "role", "roles",
 * "groups", "group" (strings or arrays of strings), through the role
 * mapping when one is given ("idp_role=admin|user"), else a value "admin"
 * or "user" itself; no role found means user.
 *
 * No I/O, no globals: a key set is immutable once parsed and may be used
 * by any number of verifications.
 */
#ifndef SHARED_JWT_H
#define SHARED_JWT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JWT_TOKEN_MAX   8192 /* longer tokens are refused as malformed */
#define JWT_SUBJECT_MAX 128 /* longer subjects are truncated */
#define JWT_LEEWAY_SECS 30 /* clock skew allowed on exp and nbf */

struct jwt_keyset;

enum jwt_result {
	JWT_OK = 0,
	JWT_MALFORMED, /* not three base64url parts of JSON */
	JWT_ALG, /* none, HMAC, unknown, or not the key's algorithm */
	JWT_UNKNOWN_KID, /* no key of the set has the token's kid */
	JWT_BAD_SIGNATURE,
	JWT_EXPIRED,
	JWT_NOT_YET_VALID,
	JWT_BAD_ISSUER,
	JWT_BAD_AUDIENCE,
	JWT_NOMEM,
};

/* What a verification checks against. Strings are borrowed. */
struct jwt_params {
	const char *jp_issuer;
	const char *jp_audience;
	const char *jp_role_claim; /* NULL: "roles" */
	char *const *jp_role_map; /* "idp_role=admin|user" each */
	size_t jp_role_map_n;
	int64_t jp_leeway_secs;
};

/* A verified token's facts. */
struct jwt_claims {
	char jc_subject[JWT_SUBJECT_MAX]; /* "sub", "" when absent */
	bool jc_admin;
	int64_t jc_exp; /* seconds since the epoch */
};

/*
 * Parses a JWKS document ({"keys": [...]}). Keys that are not RSA or EC
 * P-256/P-384 signature keys, or are malformed, are skipped (counted in
 * *skipped when not NULL). Returns NULL with err set when the document is
 * not a JWKS at all or holds no usable key. The caller owns the result.
 */
struct jwt_keyset *jwt_keyset_parse(const char *json, size_t len,
    size_t *skipped, char *err, size_t errlen);
void jwt_keyset_free(struct jwt_keyset *ks);
size_t jwt_keyset_size(const struct jwt_keyset *ks);

/*
 * Verifies token[0..len) against ks (NULL: no keys, JWT_UNKNOWN_KID) and p
 * at time now (seconds since the epoch). On JWT_OK fills *out. Any context.
 */
enum jwt_result jwt_verify(const struct jwt_keyset *ks,
    const struct jwt_params *p, const char *token, size_t len, int64_t now,
    struct jwt_claims *out);

/* Whether token[0..len) has a JWT's shape: three dot-separated parts. */
bool jwt_looks_like(const char *token, size_t len);

/* Static text for a result ("token expired", ...). */
const char *jwt_strerror(enum jwt_result r);

/*
 * base64url without padding (RFC 4648 §5) into out (room for outmax
 * bytes); returns the decoded length or -1 on a bad character, bad length
 * or lack of room.
 */
long jwt_b64url_decode(const char *in, size_t len, unsigned char *out,
    size_t outmax);

#endif /* SHARED_JWT_H */
