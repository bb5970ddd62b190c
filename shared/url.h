/*
 * url.h: the one URL grammar of the gateway, over http-parser's
 * http_parser_parse_url: worker and base URLs (http, https, grpc, grpcs),
 * identity-provider URLs, anything "scheme://authority[/path][?query]".
 *
 * One extension: a worker URL of a data-parallel rank is written
 * "scheme://host[:port]@N" (N decimal, at the very end, no path); the
 * "@N" is taken off before parsing and given as u_rank, so "http://u@1"
 * is host "u", rank 1. Every other "@" before the host is user
 * information, which the parser reports (u_userinfo) and which no caller
 * accepts.
 */
#ifndef SHARED_URL_H
#define SHARED_URL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define URL_SCHEME_MAX 16
#define URL_HOST_MAX   256

struct url {
	char u_scheme[URL_SCHEME_MAX]; /* lowercase */
	char u_host[URL_HOST_MAX]; /* an IPv6 literal without brackets */
	bool u_ipv6; /* the host was a bracketed literal */
	bool u_port_set; /* a port was written */
	uint16_t u_port; /* as written, else the scheme's; 0: none known */
	bool u_userinfo; /* "user[:pass]@" before the host */
	int u_rank; /* the "@N" suffix, -1 without */
	/* Spans into the parsed string (not NUL-terminated). */
	const char *u_authority; /* host[:port] as written, userinfo kept */
	size_t u_authority_len;
	const char *u_path; /* from its '/', "" when absent */
	size_t u_path_len;
	const char *u_query; /* without the '?', "" when absent */
	size_t u_query_len;
	bool u_fragment; /* a "#..." was present */
};

/*
 * Splits s (NUL-terminated, kept alive while u's spans are used) into u.
 * Returns 0, or -1 when s is no absolute URL: no "scheme://", no host, a
 * host longer than URL_HOST_MAX - 1, a port beyond 65535, whitespace or
 * control characters. The default ports are 80 for http and grpc, 443 for
 * https and grpcs.
 */
int url_parse(const char *s, struct url *u);
/* Whether u's scheme is name (lowercase). */
bool url_scheme_is(const struct url *u, const char *name);
/* Length of "scheme://authority", the origin without path or query. */
size_t url_origin_len(const struct url *u, const char *s);

/*
 * The data-parallel rank a worker URL names ("scheme://host[:port]@N",
 * N decimal up to INT32_MAX, nothing after it, no path before it), or -1
 * when it names none: no "@", "@" with nothing, a sign or anything but
 * digits after it, or a rank beyond INT32_MAX. The one reader of the
 * suffix for every process.
 */
int url_rank(const char *s);
/*
 * Copies s without its "@N" rank suffix (or whole when it has none) into
 * out. Returns 0, or -1 when it does not fit in len.
 */
int url_rank_base(const char *s, char *out, size_t len);

#endif /* SHARED_URL_H */
