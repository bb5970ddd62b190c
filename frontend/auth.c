/*
 * auth.c: who sent a request and what they may do (docs/decisions.md,
 * "Roles, keys and JWTs").
 *
 * Credentials are bearer tokens. Keys (--api-key, --tenant-api-key,
 * --control-plane-api-keys) are kept as SHA-256 digests and a presented
 * token is hashed once and compared with every digest in constant time.
 * JWTs are verified against the key set the poller fetches and writes to
 * RUN/jwks.json (this process only reads the file, when it changes: the
 * loop never waits on the identity provider); a verified token is cached
 * by its digest until it expires or the key set changes. A token whose key
 * id is unknown asks the poller for a fresh key set (shm_jwks_want), at
 * most once a second from each frontend.
 */
#include <sys/stat.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <mbedtls/sha256.h>

#include "frontend/frontend.h"
#include "shared/jwt.h"
#include "shared/log.h"
#include "shared/xmalloc.h"

#define AUTH_CACHE_SIZE   1024 /* verified JWTs remembered, a power of 2 */
#define AUTH_JWKS_FILE    "jwks.json"
#define AUTH_JWKS_MAX     (1024 * 1024)
#define AUTH_AUDIT_MAX    1024 /* longer audit fields are truncated */
#define AUTH_WANT_SPACING 1.0 /* seconds between refresh wishes */

struct auth_key {
	unsigned char ak_hash[32];
	char *ak_id; /* key id, or tenant id */
	char *ak_name;
	bool ak_admin;
};

struct auth_cached {
	unsigned char ac_hash[32];
	uint32_t ac_generation; /* of the key set that verified it */
	bool ac_used;
	struct jwt_claims ac_claims;
};

static void auth_hash(const void *, size_t, unsigned char[32]);
static bool auth_digest_eq(const unsigned char *, const unsigned char *);
static const struct auth_key *auth_key_find(const struct auth_key *, size_t,
    const unsigned char[32]);
static bool auth_bearer(const struct http_request *, const char **, size_t *);
static enum jwt_result auth_jwt(const char *, size_t, struct jwt_claims *);
static void auth_jwks_load(void);
static void auth_jwks_stat_cb(struct ev_loop *, ev_stat *, int);
static bool auth_cp_configured(void);
static void auth_audit(const struct http_request *, const char *,
    const struct reqctx *, bool, const char *);
static void auth_audit_add(cJSON *, const char *, const char *, size_t);
static void auth_tenant_from_header(const struct http_request *,
    struct reqctx *);

static unsigned char auth_api_key_hash[32];
static bool auth_api_key_set;
static struct auth_key *auth_cp_keys;
static size_t auth_cp_keys_n;
static struct auth_key *auth_tenant_keys;
static size_t auth_tenant_keys_n;

static bool auth_jwt_on;
static struct jwt_params auth_jwt_params;
static struct jwt_keyset *auth_keyset;
static uint32_t auth_keyset_generation = 1;
static struct auth_cached *auth_cache;
static char auth_jwks_path[512];
static ev_stat auth_jwks_stat;
static ev_tstamp auth_want_last;
static uint64_t auth_n_verified, auth_n_cached;

static void
auth_hash(const void *p, size_t n, unsigned char out[32])
{
	mbedtls_sha256_ret(p, n, out, 0);
}

/* Constant time: the digests of different keys differ anywhere. */
static bool
auth_digest_eq(const unsigned char *a, const unsigned char *b)
{
	unsigned char d = 0;
	size_t i;

	for (i = 0; i < 32; i++)
		d |= a[i] ^ b[i];
	return d == 0;
}

/* Looks at every entry, whatever matched, so timing says nothing. */
static const struct auth_key *
auth_key_find(const struct auth_key *keys, size_t n,
    const unsigned char digest[32])
{
	const struct auth_key *found = NULL;
	size_t i;

	for (i = 0; i < n; i++) {
		if (auth_digest_eq(keys[i].ak_hash, digest) && found == NULL)
			found = &keys[i];
	}
	return found;
}

void
auth_init(void)
{
	const struct config *cf = fe->fe_cf;
	const char *p, *q, *r, *key;
	size_t i;

	if (cf->cf_api_key != NULL && cf->cf_api_key[0] != '\0') {
		auth_hash(cf->cf_api_key, strlen(cf->cf_api_key),
		    auth_api_key_hash);
		auth_api_key_set = true;
	}
	auth_cp_keys_n = cf->cf_control_plane_api_keys_n;
	auth_cp_keys = xcalloc(auth_cp_keys_n + 1, sizeof(*auth_cp_keys));
	for (i = 0; i < auth_cp_keys_n; i++) {
		/* id:name:role:key, checked by config.c; the key may hold ':'.
		 */
		p = cf->cf_control_plane_api_keys[i];
		q = strchr(p, ':');
		r = strchr(q + 1, ':');
		key = strchr(r + 1, ':') + 1;
		auth_cp_keys[i].ak_id = xstrndup(p, (size_t)(q - p));
		auth_cp_keys[i].ak_name = xstrndup(q + 1, (size_t)(r - q - 1));
		auth_cp_keys[i].ak_admin = strncasecmp(r + 1, "admin", 5) == 0;
		auth_hash(key, strlen(key), auth_cp_keys[i].ak_hash);
	}
	auth_tenant_keys_n = cf->cf_tenant_api_keys_n;
	auth_tenant_keys =
	    xcalloc(auth_tenant_keys_n + 1, sizeof(*auth_tenant_keys));
	for (i = 0; i < auth_tenant_keys_n; i++) {
		p = cf->cf_tenant_api_keys[i];
		q = strchr(p, ':');
		auth_tenant_keys[i].ak_id = xstrndup(p, (size_t)(q - p));
		auth_hash(q + 1, strlen(q + 1), auth_tenant_keys[i].ak_hash);
	}
	if (cf->cf_jwt_issuer == NULL)
		return;
	auth_jwt_on = true;
	auth_jwt_params.jp_issuer = cf->cf_jwt_issuer;
	auth_jwt_params.jp_audience = cf->cf_jwt_audience;
	auth_jwt_params.jp_role_claim = cf->cf_jwt_role_claim;
	auth_jwt_params.jp_role_map = cf->cf_jwt_role_mapping;
	auth_jwt_params.jp_role_map_n = cf->cf_jwt_role_mapping_n;
	auth_jwt_params.jp_leeway_secs = JWT_LEEWAY_SECS;
	auth_cache = xcalloc(AUTH_CACHE_SIZE, sizeof(*auth_cache));
	snprintf(auth_jwks_path, sizeof(auth_jwks_path), "%s/%s",
	    cf->cf_run_dir, AUTH_JWKS_FILE);
	ev_stat_init(&auth_jwks_stat, auth_jwks_stat_cb, auth_jwks_path, 0.5);
	ev_stat_start(fe->fe_loop, &auth_jwks_stat);
	auth_jwks_load();
}

void
auth_shutdown(void)
{
	size_t i;

	if (auth_jwt_on)
		ev_stat_stop(fe->fe_loop, &auth_jwks_stat);
	jwt_keyset_free(auth_keyset);
	auth_keyset = NULL;
	free(auth_cache);
	auth_cache = NULL;
	for (i = 0; i < auth_cp_keys_n; i++) {
		free(auth_cp_keys[i].ak_id);
		free(auth_cp_keys[i].ak_name);
	}
	for (i = 0; i < auth_tenant_keys_n; i++)
		free(auth_tenant_keys[i].ak_id);
	free(auth_cp_keys);
	free(auth_tenant_keys);
	auth_cp_keys = auth_tenant_keys = NULL;
}

/* Reads RUN/jwks.json (small, local) and swaps the key set in. */
static void
auth_jwks_load(void)
{
	struct jwt_keyset *ks;
	char err[128], *buf;
	size_t skipped = 0;
	ssize_t n;
	int fd;

	if ((fd = open(auth_jwks_path, O_RDONLY | O_CLOEXEC)) == -1) {
		if (errno != ENOENT)
			log_warn("%s: %s", __func__, auth_jwks_path);
		return;
	}
	buf = malloc(AUTH_JWKS_MAX);
	n = buf != NULL ? read(fd, buf, AUTH_JWKS_MAX) : -1;
	close(fd);
	if (n <= 0) {
		free(buf);
		return;
	}
	ks = jwt_keyset_parse(buf, (size_t)n, &skipped, err, sizeof(err));
	free(buf);
	if (ks == NULL) {
		/* Keep the last good set: the poller writes only good ones. */
		log_warnx("%s: %s: %s", __func__, auth_jwks_path, err);
		return;
	}
	jwt_keyset_free(auth_keyset);
	auth_keyset = ks;
	/* Tokens verified with keys now gone must be verified again. */
	auth_keyset_generation++;
	log_info("%s: %zu signing keys loaded (%zu skipped)", __func__,
	    jwt_keyset_size(ks), skipped);
}

static void
auth_jwks_stat_cb(struct ev_loop *loop, ev_stat *w, int revents)
{
	(void)loop;
	(void)revents;
	if (w->attr.st_nlink > 0)
		auth_jwks_load();
}

static enum jwt_result
auth_jwt(const char *tok, size_t len, struct jwt_claims *out)
{
	struct auth_cached *ac;
	unsigned char digest[32];
	enum jwt_result rc;
	time_t now = time(NULL);

	auth_hash(tok, len, digest);
	ac =
	    &auth_cache[(digest[0] | (digest[1] << 8)) & (AUTH_CACHE_SIZE - 1)];
	if (ac->ac_used && ac->ac_generation == auth_keyset_generation &&
	    auth_digest_eq(ac->ac_hash, digest) &&
	    ac->ac_claims.jc_exp + JWT_LEEWAY_SECS > (int64_t)now) {
		auth_n_cached++;
		*out = ac->ac_claims;
		return JWT_OK;
	}
	rc = jwt_verify(auth_keyset, &auth_jwt_params, tok, len, (int64_t)now,
	    out);
	auth_n_verified++;
	if (rc == JWT_OK) {
		memcpy(ac->ac_hash, digest, sizeof(digest));
		ac->ac_generation = auth_keyset_generation;
		ac->ac_claims = *out;
		ac->ac_used = true;
	} else if (rc == JWT_UNKNOWN_KID &&
	    ev_now(fe->fe_loop) - auth_want_last >= AUTH_WANT_SPACING) {
		auth_want_last = ev_now(fe->fe_loop);
		shm_jwks_want(fe->fe_shm);
	}
	stats_add("smg_auth_jwt_verifications_total",
	    rc == JWT_OK ? "result=\"ok\"" : "result=\"refused\"", 1);
	return rc;
}

void
auth_jwt_counts(uint64_t *verified, uint64_t *cached)
{
	*verified = auth_n_verified;
	*cached = auth_n_cached;
}

static bool
auth_bearer(const struct http_request *hr, const char **tok, size_t *len)
{
	const struct http_header *h = http_request_header(hr, "authorization");

	if (h == NULL || h->hh_value_len <= 7 ||
	    strncasecmp(h->hh_value, "Bearer ", 7) != 0)
		return false;
	*tok = h->hh_value + 7;
	*len = h->hh_value_len - 7;
	return true;
}

static bool
auth_cp_configured(void)
{
	return auth_cp_keys_n > 0 || auth_jwt_on;
}

static void
auth_tenant_from_header(const struct http_request *hr, struct reqctx *rx)
{
	const struct config *cf = fe->fe_cf;
	const struct http_header *h;
	size_t a, b;

	if (!cf->cf_trust_tenant_header ||
	    (h = http_request_header(hr, cf->cf_tenant_header_name)) == NULL)
		return;
	for (a = 0; a < h->hh_value_len &&
	     (h->hh_value[a] == ' ' || h->hh_value[a] == '\t');
	     a++)
		;
	for (b = h->hh_value_len;
	     b > a && (h->hh_value[b - 1] == ' ' || h->hh_value[b - 1] == '\t');
	     b--)
		;
	if (b > a)
		snprintf(rx->rc_tenant, sizeof(rx->rc_tenant), "header:%.*s",
		    (int)(b - a), h->hh_value + a);
}

enum auth_verdict
auth_data_plane(const struct http_request *hr, struct reqctx *rx, char *why,
    size_t whylen)
{
	const struct auth_key *k;
	struct jwt_claims jc;
	unsigned char digest[32];
	enum jwt_result jr;
	const char *tok;
	size_t len;
	bool required = auth_api_key_set || auth_tenant_keys_n > 0;

	snprintf(rx->rc_tenant, sizeof(rx->rc_tenant), "anonymous");
	if (!required) {
		auth_tenant_from_header(hr, rx);
		return AUTH_ALLOW;
	}
	if (!auth_bearer(hr, &tok, &len)) {
		snprintf(why, whylen, "Missing or invalid API key");
		return AUTH_UNAUTHENTICATED;
	}
	if (auth_jwt_on && jwt_looks_like(tok, len)) {
		if ((jr = auth_jwt(tok, len, &jc)) != JWT_OK) {
			snprintf(why, whylen, "Invalid JWT: %s",
			    jwt_strerror(jr));
			return AUTH_UNAUTHENTICATED;
		}
		rx->rc_method = REQCTX_JWT;
		rx->rc_admin = jc.jc_admin;
		snprintf(rx->rc_principal, sizeof(rx->rc_principal), "%s",
		    jc.jc_subject);
		snprintf(rx->rc_tenant, sizeof(rx->rc_tenant), "auth:%s",
		    jc.jc_subject);
		return AUTH_ALLOW;
	}
	auth_hash(tok, len, digest);
	if ((k = auth_key_find(auth_tenant_keys, auth_tenant_keys_n, digest)) !=
	    NULL) {
		rx->rc_method = REQCTX_TENANT_KEY;
		snprintf(rx->rc_principal, sizeof(rx->rc_principal), "%s",
		    k->ak_id);
		snprintf(rx->rc_tenant, sizeof(rx->rc_tenant), "auth:%s",
		    k->ak_id);
		return AUTH_ALLOW;
	}
	if (auth_api_key_set && auth_digest_eq(auth_api_key_hash, digest)) {
		rx->rc_method = REQCTX_API_KEY;
		snprintf(rx->rc_principal, sizeof(rx->rc_principal), "api_key");
		/* One shared key names no tenant of its own: a header may. */
		auth_tenant_from_header(hr, rx);
		return AUTH_ALLOW;
	}
	if ((k = auth_key_find(auth_cp_keys, auth_cp_keys_n, digest)) != NULL) {
		rx->rc_method = REQCTX_CP_KEY;
		rx->rc_admin = k->ak_admin;
		snprintf(rx->rc_principal, sizeof(rx->rc_principal), "%s",
		    k->ak_id);
		snprintf(rx->rc_tenant, sizeof(rx->rc_tenant), "auth:%s",
		    k->ak_id);
		return AUTH_ALLOW;
	}
	snprintf(why, whylen, "Invalid or missing API key");
	return AUTH_UNAUTHENTICATED;
}

enum auth_verdict
auth_control_plane(const struct http_request *hr, const char *request_id,
    struct reqctx *rx, char *why, size_t whylen)
{
	const struct auth_key *k;
	struct jwt_claims jc;
	unsigned char digest[32];
	enum jwt_result jr;
	const char *tok;
	size_t len;

	snprintf(rx->rc_tenant, sizeof(rx->rc_tenant), "anonymous");
	if (!auth_cp_configured()) {
		/* The gateway's one key, as before any role existed. */
		if (!auth_api_key_set)
			return AUTH_ALLOW;
		if (auth_bearer(hr, &tok, &len)) {
			auth_hash(tok, len, digest);
			if (auth_digest_eq(auth_api_key_hash, digest)) {
				rx->rc_method = REQCTX_API_KEY;
				rx->rc_admin = true;
				snprintf(rx->rc_principal,
				    sizeof(rx->rc_principal), "api_key");
				auth_audit(hr, request_id, rx, true, NULL);
				return AUTH_ALLOW;
			}
		}
		snprintf(why, whylen, "Invalid or missing API key");
		auth_audit(hr, request_id, rx, false, why);
		return AUTH_UNAUTHENTICATED;
	}
	if (!auth_bearer(hr, &tok, &len)) {
		snprintf(why, whylen,
		    "Missing or invalid Authorization header");
		auth_audit(hr, request_id, rx, false, why);
		return AUTH_UNAUTHENTICATED;
	}
	if (auth_jwt_on && jwt_looks_like(tok, len)) {
		/* A JWT that fails is refused, never tried as a key. */
		if ((jr = auth_jwt(tok, len, &jc)) != JWT_OK) {
			snprintf(why, whylen, "Invalid JWT: %s",
			    jwt_strerror(jr));
			auth_audit(hr, request_id, rx, false, why);
			return AUTH_UNAUTHENTICATED;
		}
		rx->rc_method = REQCTX_JWT;
		rx->rc_admin = jc.jc_admin;
		snprintf(rx->rc_principal, sizeof(rx->rc_principal), "%s",
		    jc.jc_subject);
	} else {
		auth_hash(tok, len, digest);
		if ((k = auth_key_find(auth_cp_keys, auth_cp_keys_n, digest)) ==
		    NULL) {
			snprintf(why, whylen, "Invalid authentication token");
			auth_audit(hr, request_id, rx, false, why);
			return AUTH_UNAUTHENTICATED;
		}
		rx->rc_method = REQCTX_CP_KEY;
		rx->rc_admin = k->ak_admin;
		snprintf(rx->rc_principal, sizeof(rx->rc_principal), "%s",
		    k->ak_id);
	}
	if (!rx->rc_admin) {
		snprintf(why, whylen,
		    "Admin role required for control plane access");
		auth_audit(hr, request_id, rx, false, why);
		return AUTH_FORBIDDEN;
	}
	auth_audit(hr, request_id, rx, true, NULL);
	return AUTH_ALLOW;
}

/* Adds a string field, truncated and with control characters escaped
 * (cJSON escapes them as \uXXXX). */
static void
auth_audit_add(cJSON *o, const char *name, const char *v, size_t len)
{
	char buf[AUTH_AUDIT_MAX + sizeof("...[TRUNCATED]")];

	if (len > AUTH_AUDIT_MAX)
		snprintf(buf, sizeof(buf), "%.*s...[TRUNCATED]", AUTH_AUDIT_MAX,
		    v);
	else
		snprintf(buf, sizeof(buf), "%.*s", (int)len, v);
	cJSON_AddStringToObject(o, name, buf);
}

/* One control-plane event, as SMG's control_plane_audit line. */
static void
auth_audit(const struct http_request *hr, const char *request_id,
    const struct reqctx *rx, bool success, const char *details)
{
	static const char *const methods[] = { [REQCTX_NONE] = "none",
		[REQCTX_API_KEY] = "api_key",
		[REQCTX_TENANT_KEY] = "tenant_key",
		[REQCTX_CP_KEY] = "api_key",
		[REQCTX_JWT] = "jwt" };
	const char *principal = rx->rc_principal, *res = NULL;
	struct timespec ts;
	struct tm tm;
	char when[40];
	cJSON *o;
	char *line;

	if (fe->fe_cf->cf_disable_audit_logging)
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(when + strlen(when), sizeof(when) - strlen(when), ".%03ldZ",
	    ts.tv_nsec / 1000000);
	if (rx->rc_method == REQCTX_NONE)
		principal = "unauthenticated";
	if (strncmp(hr->hr_path, "/workers/", 9) == 0 && hr->hr_path[9])
		res = hr->hr_path + 9;
	if ((o = cJSON_CreateObject()) == NULL)
		return;
	cJSON_AddStringToObject(o, "timestamp", when);
	auth_audit_add(o, "principal", principal, strlen(principal));
	cJSON_AddStringToObject(o, "auth_method", methods[rx->rc_method]);
	cJSON_AddStringToObject(o, "role", rx->rc_admin ? "admin" : "user");
	cJSON_AddStringToObject(o, "method", hr->hr_method_str);
	auth_audit_add(o, "path", hr->hr_path, hr->hr_path_len);
	if (res != NULL)
		auth_audit_add(o, "resource", res, strlen(res));
	cJSON_AddStringToObject(o, "outcome", success ? "success" : "denied");
	if (request_id != NULL)
		auth_audit_add(o, "request_id", request_id, strlen(request_id));
	if (details != NULL)
		auth_audit_add(o, "details", details, strlen(details));
	if ((line = cJSON_PrintUnformatted(o)) != NULL)
		log_info("control_plane_audit %s", line);
	free(line);
	cJSON_Delete(o);
}
