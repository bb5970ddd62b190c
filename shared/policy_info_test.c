/*
 * policy_info_test.c: policy names as users spell them, and the
 * properties the processes act on.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "shared/policy_info.h"

static void
test_names(void **state)
{
	static const struct {
		const char *name;
		enum policy_kind kind;
	} names[] = {
		{ "cache_aware", POLICY_CACHE_AWARE },
		{ "cacheaware", POLICY_CACHE_AWARE },
		{ "CacheAware", POLICY_CACHE_AWARE },
		{ "bucket", POLICY_BUCKET },
		{ "power_of_two", POLICY_POWER_OF_TWO },
		{ "poweroftwo", POLICY_POWER_OF_TWO },
		{ "least_load", POLICY_LEAST_LOAD },
		{ "leastload", POLICY_LEAST_LOAD },
		{ "consistent_hashing", POLICY_CONSISTENT_HASHING },
		{ "consistenthashing", POLICY_CONSISTENT_HASHING },
		{ "prefix_hash", POLICY_PREFIX_HASH },
		{ "prefixhash", POLICY_PREFIX_HASH },
		{ "manual", POLICY_MANUAL },
		{ "round_robin", POLICY_ROUND_ROBIN },
		{ "Round_Robin", POLICY_ROUND_ROBIN },
		{ "ROUNDROBIN", POLICY_ROUND_ROBIN },
		{ "random", POLICY_RANDOM },
		{ "passthrough", POLICY_PASSTHROUGH },
	};
	enum policy_kind k;
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		assert_int_equal(policy_info_parse(names[i].name, &k), 0);
		assert_int_equal(k, names[i].kind);
	}
	assert_int_equal(policy_info_parse("bogus", &k), -1);
	assert_int_equal(policy_info_parse("", &k), -1);
	assert_int_equal(policy_info_parse("round-robin", &k), -1);
	assert_string_equal(policy_info_name(POLICY_ROUND_ROBIN),
	    "round_robin");
	assert_string_equal(policy_info_name(POLICY_CACHE_AWARE),
	    "cache_aware");
	assert_string_equal(policy_info_name(POLICY_PASSTHROUGH),
	    "passthrough");
	assert_string_equal(policy_info_name((enum policy_kind)99), "unknown");
}

static void
test_properties(void **state)
{
	enum policy_kind k;
	size_t i, j;

	(void)state;
	/* Every kind exactly once. */
	for (i = 0; i < POLICY_KIND_COUNT; i++) {
		k = policy_info_table[i].pi_kind;
		assert_ptr_equal(policy_info_of(k), &policy_info_table[i]);
		for (j = i + 1; j < POLICY_KIND_COUNT; j++)
			assert_int_not_equal(policy_info_table[j].pi_kind, k);
	}
	assert_null(policy_info_of((enum policy_kind)POLICY_KIND_COUNT));
	/* The frontend extracts text for these two only. */
	for (i = 0; i < POLICY_KIND_COUNT; i++) {
		k = policy_info_table[i].pi_kind;
		assert_int_equal(policy_info_table[i].pi_needs_text,
		    k == POLICY_CACHE_AWARE || k == POLICY_BUCKET);
		assert_int_equal(policy_info_table[i].pi_load_aware,
		    k == POLICY_CACHE_AWARE || k == POLICY_LEAST_LOAD ||
		        k == POLICY_POWER_OF_TWO);
	}
	assert_true(policy_info_allowed(POLICY_PASSTHROUGH, POLICY_ROLE_ANY));
	assert_false(policy_info_allowed(POLICY_PASSTHROUGH, POLICY_ROLE_LEG));
	assert_true(policy_info_allowed(POLICY_BUCKET, POLICY_ROLE_LEG));
	assert_true(policy_info_allowed(POLICY_MANUAL, POLICY_ROLE_LEG));
	assert_true(
	    policy_info_allowed(POLICY_CONSISTENT_HASHING, POLICY_ROLE_ENCODE));
	assert_false(
	    policy_info_allowed(POLICY_CACHE_AWARE, POLICY_ROLE_ENCODE));
	assert_false(
	    policy_info_allowed((enum policy_kind)99, POLICY_ROLE_ANY));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_properties),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
