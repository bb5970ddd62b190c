/*
 * policy_info.c: the policy table (see policy_info.h).
 */
#include <ctype.h>
#include <stddef.h>

#include "shared/policy_info.h"

static bool policy_info_name_eq(const char *a, const char *b);

/* cache_aware and bucket hash the text; least_load, power_of_two and
 * cache_aware read loads (policies.md §2-§11); passthrough has no leg of a
 * disaggregated pair; the encode leg takes the three stateless ones. */
const struct policy_info policy_info_table[POLICY_KIND_COUNT] = {
	{ POLICY_RANDOM, "random", false, false, true, true },
	{ POLICY_ROUND_ROBIN, "round_robin", false, false, true, true },
	{ POLICY_PASSTHROUGH, "passthrough", false, false, false, false },
	{ POLICY_CACHE_AWARE, "cache_aware", true, true, true, false },
	{ POLICY_POWER_OF_TWO, "power_of_two", false, true, true, false },
	{ POLICY_LEAST_LOAD, "least_load", false, true, true, false },
	{ POLICY_PREFIX_HASH, "prefix_hash", false, false, true, false },
	{ POLICY_CONSISTENT_HASHING, "consistent_hashing", false, false, true,
	    true },
	{ POLICY_MANUAL, "manual", false, false, true, false },
	{ POLICY_BUCKET, "bucket", true, false, true, false },
};

const struct policy_info *
policy_info_of(enum policy_kind kind)
{
	size_t i;

	for (i = 0; i < POLICY_KIND_COUNT; i++) {
		if (policy_info_table[i].pi_kind == kind)
			return &policy_info_table[i];
	}
	return NULL;
}

const char *
policy_info_name(enum policy_kind kind)
{
	const struct policy_info *pi = policy_info_of(kind);

	return pi != NULL ? pi->pi_name : "unknown";
}

/* Compares ignoring case and underscores ("Round_Robin" = "roundrobin"). */
static bool
policy_info_name_eq(const char *a, const char *b)
{
	for (;;) {
		while (*a == '_')
			a++;
		while (*b == '_')
			b++;
		if (*a == '\0' || *b == '\0')
			return *a == *b;
		if (tolower((unsigned char)*a) != tolower((unsigned char)*b))
			return false;
		a++;
		b++;
	}
}

int
policy_info_parse(const char *name, enum policy_kind *out)
{
	size_t i;

	for (i = 0; i < POLICY_KIND_COUNT; i++) {
		if (policy_info_name_eq(name, policy_info_table[i].pi_name)) {
			*out = policy_info_table[i].pi_kind;
			return 0;
		}
	}
	return -1;
}

bool
policy_info_allowed(enum policy_kind kind, enum policy_role role)
{
	const struct policy_info *pi = policy_info_of(kind);

	if (pi == NULL)
		return false;
	switch (role) {
	case POLICY_ROLE_ANY:
		return true;
	case POLICY_ROLE_LEG:
		return pi->pi_leg;
	case POLICY_ROLE_ENCODE:
		return pi->pi_encode;
	}
	return false;
}
