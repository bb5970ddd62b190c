/*
 * jwks.c: fetches the JWT key set and shares it with the frontends as
 * RUN/jwks.json (see poller.h).
 */
#include "poller/poller.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "shared/config.h"
#include "shared/jwt.h"
#include "shared/log.h"
#include "shared/url.h"
#include "shared/xmalloc.h"

#define JWKS_BODY_MAX  (1024 * 1024)
#define JWKS_TIMEOUT   10.0
#define JWKS_URL_MAX   1024
#define JWKS_DISCOVERY "/.well-known/openid-configuration"

struct jwks {
	struct poller *j_poller;
	struct upstream_fetch *j_req;
	bool j_discovering; /* j_req asks the discovery document */
	char j_uri[JWKS_URL_MAX]; /* "" until known */
	char j_path[512]; /* RUN/jwks.json */
	uint64_t j_next_ms; /* next scheduled fetch */
	uint64_t j_last_ms; /* last fetch started */
	uint32_t j_wanted; /* shm_jwks_wanted last seen */
	char *j_last; /* the body last written */
};

static void jwks_fetch(struct jwks *, uint64_t);
static void jwks_done(void *, const struct upstream_result *);
static void jwks_write(struct jwks *, const char *, size_t);
static bool jwks_url_ok(const char *);

int
jwks_split_url(const char *url, char *base, size_t baselen, char *path,
    size_t pathlen)
{
	struct url u;
	size_t origin, tail;

	if (url_parse(url, &u) == -1 || u.u_userinfo || u.u_rank >= 0 ||
	    (!url_scheme_is(&u, "http") && !url_scheme_is(&u, "https")))
		return -1;
	origin = url_origin_len(&u, url);
	tail = strlen(url + origin);
	if (origin >= baselen || (tail == 0 ? 2 : tail + 1) > pathlen)
		return -1;
	/* path may be url's own buffer: base first, then move the tail. */
	memcpy(base, url, origin);
	base[origin] = '\0';
	if (tail == 0)
		memcpy(path, "/", 2);
	else
		memmove(path, url + origin, tail + 1);
	return 0;
}

/* The discovered jwks_uri obeys the rule config.c applies to the flags. */
static bool
jwks_url_ok(const char *url)
{
	const char *h;

	if (strncasecmp(url, "https://", 8) == 0)
		return true;
	if (strncasecmp(url, "http://", 7) != 0)
		return false;
	h = url + 7;
	return strncmp(h, "127.", 4) == 0 ||
	    strncasecmp(h, "localhost", 9) == 0 || strncmp(h, "[::1]", 5) == 0;
}

struct jwks *
jwks_new(struct poller *p)
{
	const struct config *cf = p->p_cf;
	struct jwks *j;

	if (cf->cf_jwt_issuer == NULL)
		return NULL;
	j = xcalloc(1, sizeof(*j));
	j->j_poller = p;
	if (cf->cf_jwt_jwks_uri != NULL)
		snprintf(j->j_uri, sizeof(j->j_uri), "%s", cf->cf_jwt_jwks_uri);
	snprintf(j->j_path, sizeof(j->j_path), "%s/jwks.json", cf->cf_run_dir);
	j->j_wanted = shm_jwks_wanted(p->p_shm);
	log_info("%s: JWT keys of %s from %s", __func__, cf->cf_jwt_issuer,
	    j->j_uri[0] != '\0' ? j->j_uri : "its OIDC discovery");
	return j;
}

void
jwks_free(struct jwks *j)
{
	if (j == NULL)
		return;
	upstream_fetch_cancel(j->j_req);
	free(j->j_last);
	free(j);
}

void
jwks_tick(struct jwks *j, uint64_t now_ms)
{
	uint32_t wanted;

	if (j == NULL || j->j_req != NULL)
		return;
	wanted = shm_jwks_wanted(j->j_poller->p_shm);
	if (now_ms >= j->j_next_ms) {
		j->j_wanted = wanted;
		jwks_fetch(j, now_ms);
	} else if (wanted != j->j_wanted &&
	    now_ms - j->j_last_ms >= JWKS_WANT_SPACING * 1000) {
		/* A frontend met an unknown key id: the issuer may have
		 * rotated its keys. */
		j->j_wanted = wanted;
		log_info("%s: unknown key id seen, fetching the key set",
		    __func__);
		jwks_fetch(j, now_ms);
	}
}

static void
jwks_fetch(struct jwks *j, uint64_t now_ms)
{
	const struct config *cf = j->j_poller->p_cf;
	char base[JWKS_URL_MAX], path[JWKS_URL_MAX];
	int n;

	j->j_last_ms = now_ms;
	/* If this fails, the next try is after the retry delay. */
	j->j_next_ms = now_ms + JWKS_RETRY_SECS * 1000;
	j->j_discovering = j->j_uri[0] == '\0';
	if (j->j_discovering) {
		n = snprintf(path, sizeof(path), "%s", cf->cf_jwt_issuer);
		/* "<issuer>/.well-known/...", one slash between. */
		while (n > 0 && path[n - 1] == '/')
			path[--n] = '\0';
		if (jwks_split_url(path, base, sizeof(base), path,
		        sizeof(path)) == -1) {
			log_warnx("%s: bad issuer URL %s", __func__,
			    cf->cf_jwt_issuer);
			return;
		}
		if (strcmp(path, "/") == 0)
			path[0] = '\0';
		if (strlen(path) + sizeof(JWKS_DISCOVERY) > sizeof(path))
			return;
		strcat(path, JWKS_DISCOVERY);
	} else if (jwks_split_url(j->j_uri, base, sizeof(base), path,
	               sizeof(path)) == -1) {
		log_warnx("%s: bad JWKS URL %s", __func__, j->j_uri);
		return;
	}
	j->j_req = fetch_get(j->j_poller, base, path, NULL, JWKS_TIMEOUT,
	    JWKS_BODY_MAX, jwks_done, j);
}

static void
jwks_done(void *arg, const struct upstream_result *res)
{
	struct jwks *j = arg;
	const cJSON *u;
	struct jwt_keyset *ks;
	char err[128];
	cJSON *doc;
	size_t skipped = 0;

	j->j_req = NULL;
	if (res->ur_error != UPSTREAM_OK || res->ur_status != 200 ||
	    res->ur_truncated) {
		if (res->ur_error != UPSTREAM_OK)
			snprintf(err, sizeof(err), "%s", res->ur_reason);
		else if (res->ur_truncated)
			snprintf(err, sizeof(err), "document too large");
		else
			snprintf(err, sizeof(err), "status %d", res->ur_status);
		log_warnx("%s: %s: %s (keeping the last key set; retry in "
		          "%d s)",
		    __func__, j->j_discovering ? "OIDC discovery" : j->j_uri,
		    err, JWKS_RETRY_SECS);
		return;
	}
	if (j->j_discovering) {
		doc = cJSON_ParseWithLength(res->ur_body, res->ur_body_len);
		u = cJSON_GetObjectItemCaseSensitive(doc, "jwks_uri");
		if (!cJSON_IsString(u) || !jwks_url_ok(u->valuestring) ||
		    strlen(u->valuestring) >= sizeof(j->j_uri)) {
			log_warnx(
			    "%s: OIDC discovery of %s: no usable jwks_uri",
			    __func__, j->j_poller->p_cf->cf_jwt_issuer);
			cJSON_Delete(doc);
			return;
		}
		snprintf(j->j_uri, sizeof(j->j_uri), "%s", u->valuestring);
		cJSON_Delete(doc);
		log_info("%s: discovered JWKS at %s", __func__, j->j_uri);
		jwks_fetch(j, j->j_last_ms);
		return;
	}
	if ((ks = jwt_keyset_parse(res->ur_body, res->ur_body_len, &skipped,
	         err, sizeof(err))) == NULL) {
		log_warnx("%s: %s: %s (keeping the last key set)", __func__,
		    j->j_uri, err);
		return;
	}
	jwt_keyset_free(ks);
	j->j_next_ms = j->j_last_ms + JWKS_TTL_SECS * 1000;
	if (j->j_last != NULL && strlen(j->j_last) == res->ur_body_len &&
	    memcmp(j->j_last, res->ur_body, res->ur_body_len) == 0)
		return;
	jwks_write(j, res->ur_body, res->ur_body_len);
}

/* Whole or not at all: a reader never sees half a file. */
static void
jwks_write(struct jwks *j, const char *body, size_t len)
{
	char tmp[600];
	ssize_t w;
	int fd;

	snprintf(tmp, sizeof(tmp), "%s.tmp", j->j_path);
	if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) ==
	    -1) {
		log_warn("%s: %s", __func__, tmp);
		return;
	}
	w = write(fd, body, len);
	if (close(fd) == -1 || w != (ssize_t)len) {
		log_warn("%s: %s", __func__, tmp);
		unlink(tmp);
		return;
	}
	if (rename(tmp, j->j_path) == -1) {
		log_warn("%s: rename to %s", __func__, j->j_path);
		unlink(tmp);
		return;
	}
	free(j->j_last);
	j->j_last = xstrndup(body, len);
	log_info("%s: key set written to %s", __func__, j->j_path);
}
