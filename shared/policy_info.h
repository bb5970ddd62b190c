/*
 * policy_info.h: the routing policies (policies.md) and what every process
 * needs to know about each: its spec name, whether it routes on the
 * request's text, whether it consumes load reports, and which legs it may
 * serve. One table; config.c validates flags with it, the frontend asks
 * whether to extract text, the poller whether to poll loads, the broker
 * resolves names and labels with it.
 */
#ifndef SHARED_POLICY_INFO_H
#define SHARED_POLICY_INFO_H

#include <stdbool.h>

/* The ten routing policies; values are stable. */
enum policy_kind {
	POLICY_CACHE_AWARE = 0,
	POLICY_BUCKET,
	POLICY_POWER_OF_TWO,
	POLICY_LEAST_LOAD,
	POLICY_CONSISTENT_HASHING,
	POLICY_PREFIX_HASH,
	POLICY_MANUAL,
	POLICY_ROUND_ROBIN,
	POLICY_RANDOM,
	POLICY_PASSTHROUGH,
};
#define POLICY_KIND_COUNT 10

/* Where a policy is used: which flags accept it. */
enum policy_role {
	POLICY_ROLE_ANY = 0, /* --policy */
	POLICY_ROLE_LEG, /* --prefill-policy, --decode-policy */
	POLICY_ROLE_ENCODE, /* --encode-policy */
};

struct policy_info {
	enum policy_kind pi_kind;
	const char *pi_name; /* spec name, "round_robin" */
	bool pi_needs_text; /* routes on the request text (or tokens) */
	bool pi_load_aware; /* consumes worker load reports */
	bool pi_leg; /* valid for a prefill or decode leg */
	bool pi_encode; /* valid for the encode leg */
};

/* Every policy once, in the order of gateway.md §2.2 (help, errors). */
extern const struct policy_info policy_info_table[POLICY_KIND_COUNT];

/* The entry of kind; NULL when out of range. */
const struct policy_info *policy_info_of(enum policy_kind kind);
/* Spec name of a policy ("round_robin"); "unknown" when out of range. */
const char *policy_info_name(enum policy_kind kind);
/*
 * Parses a policy name, case-insensitive and underscore-insensitive
 * ("Round_Robin", "roundrobin"), as policies.md §13 lists them.
 * Returns 0 and sets *out, or -1 for an unknown name (*out untouched).
 */
int policy_info_parse(const char *name, enum policy_kind *out);
/* Whether kind may be used in role. */
bool policy_info_allowed(enum policy_kind kind, enum policy_role role);

#endif /* SHARED_POLICY_INFO_H */
