/* urlallow.c: the worker API's URL rule (see urlallow.h). */
#include <sys/socket.h>
#include <sys/types.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shared/config.h"
#include "shared/url.h"
#include "shared/urlallow.h"

/* One resolved address, IPv4-mapped IPv6 folded to IPv4. */
struct ua_addr {
	int ua_family;
	unsigned char ua_bytes[16];
};

static int ua_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int ua_split(const char *url, char *host, size_t hostlen, long *port);
static bool ua_bad_ipv4_form(const char *host);
static size_t ua_resolve(const char *host, struct ua_addr *out, size_t max);
static void ua_fold(struct ua_addr *a);
static bool ua_is_unspecified(const struct ua_addr *a);
static bool ua_is_loopback(const struct ua_addr *a);
static bool ua_is_local(const struct ua_addr *a);
static bool ua_is_self(const struct urlallow_rule *rule,
    const struct ua_addr *a);
static bool ua_in_cidr(const struct urlallow_cidr *c, const struct ua_addr *a);

#define UA_MAX_ADDRS 32

static int
ua_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err != NULL && errlen > 0) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return -1;
}

int
urlallow_cidr_parse(const char *s, struct urlallow_cidr *out)
{
	char buf[INET6_ADDRSTRLEN + 8], *slash, *end;
	long bits;
	size_t n = strlen(s);

	if (n == 0 || n >= sizeof(buf))
		return -1;
	memcpy(buf, s, n + 1);
	memset(out, 0, sizeof(*out));
	if ((slash = strchr(buf, '/')) != NULL)
		*slash = '\0';
	if (inet_pton(AF_INET, buf, out->uc_addr) == 1) {
		out->uc_family = AF_INET;
		out->uc_bits = 32;
	} else if (inet_pton(AF_INET6, buf, out->uc_addr) == 1) {
		out->uc_family = AF_INET6;
		out->uc_bits = 128;
	} else
		return -1;
	if (slash == NULL)
		return 0;
	if (slash[1] < '0' || slash[1] > '9')
		return -1;
	errno = 0;
	bits = strtol(slash + 1, &end, 10);
	if (errno != 0 || *end != '\0' || bits < 0 || bits > (long)out->uc_bits)
		return -1;
	out->uc_bits = (unsigned)bits;
	return 0;
}

/* Host (brackets of an IPv6 literal removed) and port (or the scheme's). */
static int
ua_split(const char *url, char *host, size_t hostlen, long *port)
{
	struct url u;
	int n;

	if (url_parse(url, &u) == -1)
		return -1;
	n = snprintf(host, hostlen, "%s", u.u_host);
	if (n <= 0 || (size_t)n >= hostlen)
		return -1;
	*port = u.u_port;
	return 0;
}

/* Digits, dots and hex only, yet not strict dotted-decimal IPv4. */
static bool
ua_bad_ipv4_form(const char *host)
{
	struct in_addr a;
	unsigned char b[4];
	size_t i;
	bool numeric = true;

	for (i = 0; host[i] != '\0'; i++)
		if (!((host[i] >= '0' && host[i] <= '9') || host[i] == '.'))
			numeric = false;
	if (inet_pton(AF_INET, host, b) == 1)
		return false;
	/* inet_aton takes "127.1", "2130706433", "0x7f.1", "0177.0.0.1". */
	return numeric || inet_aton(host, &a) != 0;
}

static void
ua_fold(struct ua_addr *a)
{
	static const unsigned char mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
		0xff, 0xff };

	if (a->ua_family == AF_INET6 &&
	    memcmp(a->ua_bytes, mapped, sizeof(mapped)) == 0) {
		memmove(a->ua_bytes, a->ua_bytes + 12, 4);
		memset(a->ua_bytes + 4, 0, 12);
		a->ua_family = AF_INET;
	}
}

static size_t
ua_resolve(const char *host, struct ua_addr *out, size_t max)
{
	struct addrinfo hints, *res, *ai;
	size_t n = 0;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	if (getaddrinfo(host, NULL, &hints, &res) != 0)
		return 0;
	for (ai = res; ai != NULL && n < max; ai = ai->ai_next) {
		memset(&out[n], 0, sizeof(out[n]));
		if (ai->ai_family == AF_INET) {
			out[n].ua_family = AF_INET;
			memcpy(out[n].ua_bytes,
			    &((struct sockaddr_in *)ai->ai_addr)->sin_addr, 4);
		} else if (ai->ai_family == AF_INET6) {
			out[n].ua_family = AF_INET6;
			memcpy(out[n].ua_bytes,
			    &((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr,
			    16);
		} else
			continue;
		ua_fold(&out[n]);
		n++;
	}
	freeaddrinfo(res);
	return n;
}

static bool
ua_is_unspecified(const struct ua_addr *a)
{
	static const unsigned char zero[16];

	return memcmp(a->ua_bytes, zero, a->ua_family == AF_INET ? 4 : 16) == 0;
}

static bool
ua_is_loopback(const struct ua_addr *a)
{
	static const unsigned char one[16] = { [15] = 1 };

	if (a->ua_family == AF_INET)
		return a->ua_bytes[0] == 127;
	return memcmp(a->ua_bytes, one, 16) == 0;
}

/* An address of this host: the kernel lets a socket bind to it. */
static bool
ua_is_local(const struct ua_addr *a)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int fd;
	bool ok;

	if (ua_is_unspecified(a) || ua_is_loopback(a))
		return true;
	memset(&ss, 0, sizeof(ss));
	if (a->ua_family == AF_INET) {
		struct sockaddr_in *sin = (struct sockaddr_in *)&ss;

		sin->sin_family = AF_INET;
		memcpy(&sin->sin_addr, a->ua_bytes, 4);
		len = sizeof(*sin);
	} else {
		struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;

		sin6->sin6_family = AF_INET6;
		memcpy(&sin6->sin6_addr, a->ua_bytes, 16);
		len = sizeof(*sin6);
	}
	if ((fd = socket(a->ua_family, SOCK_DGRAM | SOCK_CLOEXEC, 0)) == -1)
		return false;
	ok = bind(fd, (struct sockaddr *)&ss, len) == 0;
	close(fd);
	return ok;
}

/*
 * Whether a connection to a on the gateway's port reaches the gateway.
 * A connection to the unspecified address goes to loopback.
 */
static bool
ua_is_self(const struct urlallow_rule *rule, const struct ua_addr *a)
{
	struct ua_addr self[UA_MAX_ADDRS], dst = *a;
	const char *h = rule->ur_self_host;
	size_t n, i;

	if (h == NULL || *h == '\0' || strcmp(h, "0.0.0.0") == 0 ||
	    strcmp(h, "::") == 0 || strcmp(h, "[::]") == 0)
		return ua_is_local(a);
	if (ua_is_unspecified(&dst)) {
		if (dst.ua_family == AF_INET)
			dst.ua_bytes[0] = 127, dst.ua_bytes[3] = 1;
		else
			dst.ua_bytes[15] = 1;
	}
	n = ua_resolve(h, self, UA_MAX_ADDRS);
	for (i = 0; i < n; i++) {
		if (self[i].ua_family == dst.ua_family &&
		    memcmp(self[i].ua_bytes, dst.ua_bytes,
		        dst.ua_family == AF_INET ? 4 : 16) == 0)
			return true;
		/* The gateway on a wildcard of one family. */
		if (self[i].ua_family == dst.ua_family &&
		    ua_is_unspecified(&self[i]) && ua_is_local(&dst))
			return true;
	}
	return false;
}

static bool
ua_in_cidr(const struct urlallow_cidr *c, const struct ua_addr *a)
{
	unsigned full = c->uc_bits / 8, rest = c->uc_bits % 8;
	unsigned char mask;

	if (c->uc_family != a->ua_family)
		return false;
	if (memcmp(c->uc_addr, a->ua_bytes, full) != 0)
		return false;
	if (rest == 0)
		return true;
	mask = (unsigned char)(0xff << (8 - rest));
	return (c->uc_addr[full] & mask) == (a->ua_bytes[full] & mask);
}

enum urlallow_result
urlallow_check(const struct urlallow_rule *rule, const char *url, char *err,
    size_t errlen)
{
	static const char *const schemes[] = { "http://", "https://", "grpc://",
		"grpcs://" };
	struct ua_addr addrs[UA_MAX_ADDRS];
	char host[256], abuf[INET6_ADDRSTRLEN];
	size_t i, j, n;
	long port;

	if (config_check_worker_url(url, err, errlen) == -1)
		return URLALLOW_INVALID;
	for (i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++)
		if (strncmp(url, schemes[i], strlen(schemes[i])) == 0)
			break;
	if (i == sizeof(schemes) / sizeof(schemes[0])) {
		ua_err(err, errlen,
		    "worker URL '%s' not allowed (scheme must be http, "
		    "https, grpc or grpcs)",
		    url);
		return URLALLOW_INVALID;
	}
	if (ua_split(url, host, sizeof(host), &port) == -1) {
		ua_err(err, errlen, "invalid worker URL '%s' (bad host)", url);
		return URLALLOW_INVALID;
	}
	if (strchr(host, ':') == NULL && ua_bad_ipv4_form(host)) {
		ua_err(err, errlen,
		    "worker URL '%s' not allowed (IPv4 address not in "
		    "dotted-decimal form)",
		    url);
		return URLALLOW_INVALID;
	}
	n = ua_resolve(host, addrs, UA_MAX_ADDRS);
	for (i = 0; i < n; i++) {
		if (port == rule->ur_self_port && ua_is_self(rule, &addrs[i])) {
			ua_err(err, errlen,
			    "worker URL '%s' not allowed (it is this "
			    "gateway's own address; requests would loop)",
			    url);
			return URLALLOW_SELF;
		}
	}
	if (rule->ur_ncidrs == 0)
		return URLALLOW_OK;
	if (n == 0) {
		ua_err(err, errlen,
		    "worker URL '%s' not allowed (host does not resolve; "
		    "worker addresses are restricted)",
		    url);
		return URLALLOW_DENIED;
	}
	for (i = 0; i < n; i++) {
		for (j = 0; j < rule->ur_ncidrs; j++)
			if (ua_in_cidr(&rule->ur_cidrs[j], &addrs[i]))
				break;
		if (j == rule->ur_ncidrs) {
			inet_ntop(addrs[i].ua_family, addrs[i].ua_bytes, abuf,
			    sizeof(abuf));
			ua_err(err, errlen,
			    "worker URL '%s' not allowed (address %s is "
			    "outside the allowed ranges)",
			    url, abuf);
			return URLALLOW_DENIED;
		}
	}
	return URLALLOW_OK;
}
