/*
 * urlallow.h: which worker URLs the worker API may register. The command
 * line is the operator's; a URL that arrives through POST /workers is
 * checked here, in one place:
 *   - the syntax of config_check_worker_url, and a scheme of http, https,
 *     grpc or grpcs (no ipc://: a local socket is not a remote worker);
 *   - no user information (already refused by the syntax check);
 *   - an IPv4 literal only in dotted-decimal form: the decimal, hex, octal
 *     and short forms inet_aton also takes ("2130706433", "0x7f.1",
 *     "0177.0.0.1", "127.1") are refused, as they are how allow lists are
 *     dodged;
 *   - not the gateway itself: no address the host resolves to may be the
 *     gateway's own listening address (--host/--port; with a wildcard
 *     --host any local, loopback or unspecified address on --port), or
 *     one request would recurse gateway -> gateway;
 *   - with --worker-allow-cidr, every address the host resolves to is in
 *     one of the ranges.
 * Host names are resolved with getaddrinfo, which blocks: call it from
 * the control path only (the broker's worker API), never per request.
 */
#ifndef SHARED_URLALLOW_H
#define SHARED_URLALLOW_H

#include <stdbool.h>
#include <stddef.h>

/* An address range, "10.0.0.0/8" or "fd00::/8"; a bare address is /32 or
 * /128. */
struct urlallow_cidr {
	int uc_family; /* AF_INET or AF_INET6 */
	unsigned char uc_addr[16];
	unsigned uc_bits;
};

/* Parses s; 0, or -1 when it is not an address with an optional prefix
 * length in range (host bits set are allowed and ignored). */
int urlallow_cidr_parse(const char *s, struct urlallow_cidr *out);

struct urlallow_rule {
	const char *ur_self_host; /* --host; NULL or "" = any address */
	long ur_self_port; /* --port */
	const struct urlallow_cidr *ur_cidrs; /* NULL: any address */
	size_t ur_ncidrs;
};

enum urlallow_result {
	URLALLOW_OK = 0,
	URLALLOW_INVALID, /* syntax, scheme, user info, IP form */
	URLALLOW_SELF, /* the gateway's own listening address */
	URLALLOW_DENIED, /* outside --worker-allow-cidr, or unresolvable
	                    while ranges are set */
};

/*
 * Checks url against rule; on anything but URLALLOW_OK the reason (no
 * flag names, fit for an API error) is written to err.
 */
enum urlallow_result urlallow_check(const struct urlallow_rule *rule,
    const char *url, char *err, size_t errlen);

#endif /* SHARED_URLALLOW_H */
