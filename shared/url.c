/*
 * url.c: URL splitting for the whole gateway (see url.h); http-parser
 * does the grammar, this file the "@rank" suffix and the defaults.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <http_parser.h>

#include "shared/url.h"

static int url_rank_suffix(const char *s, size_t len, size_t *cut);

/* "@N" ending an URL without path: N, and where it starts in *cut. */
static int
url_rank_suffix(const char *s, size_t len, size_t *cut)
{
	const char *sep, *at, *p;
	long v = 0;

	if ((sep = strstr(s, "://")) == NULL)
		return -1;
	if ((at = strrchr(sep + 3, '@')) == NULL || at[1] == '\0')
		return -1;
	/* One spelling per rank: "@07" would be a second URL of rank 7. */
	if (at[1] == '0' && at + 2 < s + len)
		return -1;
	for (p = at + 1; p < s + len; p++) {
		if (*p < '0' || *p > '9')
			return -1;
		if ((v = v * 10 + (*p - '0')) > 0x7fffffff)
			return -1;
	}
	/* Digits after a path's, query's or fragment's '@' are theirs. */
	if (strcspn(sep + 3, "/?#") < (size_t)(at - sep - 3))
		return -1;
	*cut = (size_t)(at - s);
	return (int)v;
}

int
url_parse(const char *s, struct url *u)
{
	struct http_parser_url pu;
	size_t len, cut, n, i;
	const char *f;
	int rank;

	memset(u, 0, sizeof(*u));
	u->u_rank = -1;
	u->u_path = u->u_query = "";
	len = strlen(s);
	for (i = 0; i < len; i++) {
		if ((unsigned char)s[i] <= ' ' || s[i] == 0x7f)
			return -1;
	}
	if ((rank = url_rank_suffix(s, len, &cut)) >= 0) {
		u->u_rank = rank;
		len = cut;
	}
	http_parser_url_init(&pu);
	if (http_parser_parse_url(s, len, 0, &pu) != 0 ||
	    !(pu.field_set & (1 << UF_SCHEMA)) ||
	    !(pu.field_set & (1 << UF_HOST)))
		return -1;
	n = pu.field_data[UF_SCHEMA].len;
	f = s + pu.field_data[UF_SCHEMA].off;
	if (n == 0 || n >= sizeof(u->u_scheme) || strncmp(f + n, "://", 3) != 0)
		return -1;
	for (i = 0; i < n; i++)
		u->u_scheme[i] =
		    (char)((f[i] >= 'A' && f[i] <= 'Z') ? f[i] - 'A' + 'a'
		                                        : f[i]);
	u->u_authority = f + n + 3;
	n = pu.field_data[UF_HOST].len;
	f = s + pu.field_data[UF_HOST].off;
	if (n == 0 || n >= sizeof(u->u_host))
		return -1;
	memcpy(u->u_host, f, n);
	u->u_ipv6 = f > s && f[-1] == '[';
	u->u_userinfo = (pu.field_set & (1 << UF_USERINFO)) != 0;
	if (pu.field_set & (1 << UF_PORT)) {
		u->u_port_set = true;
		u->u_port = pu.port;
	} else if (url_scheme_is(u, "http") || url_scheme_is(u, "grpc"))
		u->u_port = 80;
	else if (url_scheme_is(u, "https") || url_scheme_is(u, "grpcs"))
		u->u_port = 443;
	if (pu.field_set & (1 << UF_PATH)) {
		u->u_path = s + pu.field_data[UF_PATH].off;
		u->u_path_len = pu.field_data[UF_PATH].len;
	}
	if (pu.field_set & (1 << UF_QUERY)) {
		u->u_query = s + pu.field_data[UF_QUERY].off;
		u->u_query_len = pu.field_data[UF_QUERY].len;
	}
	u->u_fragment = (pu.field_set & (1 << UF_FRAGMENT)) != 0;
	/* The authority ends where the path, query or fragment starts. */
	u->u_authority_len = strcspn(u->u_authority, "/?#");
	if (u->u_authority + u->u_authority_len > s + len)
		u->u_authority_len = (size_t)(s + len - u->u_authority);
	return 0;
}

int
url_rank(const char *s)
{
	size_t cut;

	return url_rank_suffix(s, strlen(s), &cut);
}

int
url_rank_base(const char *s, char *out, size_t len)
{
	size_t n = strlen(s), cut;

	if (url_rank_suffix(s, n, &cut) >= 0)
		n = cut;
	if (n >= len)
		return -1;
	memcpy(out, s, n);
	out[n] = '\0';
	return 0;
}

bool
url_scheme_is(const struct url *u, const char *name)
{
	return strcmp(u->u_scheme, name) == 0;
}

size_t
url_origin_len(const struct url *u, const char *s)
{
	return (size_t)(u->u_authority - s) + u->u_authority_len;
}
