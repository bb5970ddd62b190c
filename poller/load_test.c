/*
 * load_test.c: the rank the poller fills from the Prometheus fallback
 * (the text itself is shared/promload_test.c's; /v1/loads bodies are
 * shared/loads_test.c's) and whether loads are polled at all.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "poller/poller.h"
#include "shared/config.h"

static int
parse_prom(const char *body, const char *runtime, Smg__RankLoad *r)
{
	return load_parse_prom(body, strlen(body), runtime, r);
}

static void
test_prom_rank(void **state)
{
	/* Every report field lands in the rank; the rest stays 0. */
	static const char sglang[] =
	    "sglang:num_running_reqs{dp_rank=\"0\"} 3\n"
	    "sglang:num_running_reqs{dp_rank=\"1\"} 4\n"
	    "sglang:num_queue_reqs 6\n"
	    "sglang:token_usage 0.25\n"
	    "sglang:gen_throughput 200\n"
	    "sglang:cache_hit_rate 0.5\n"
	    "sglang:utilization 0.75\n";
	static const char vllm[] = "vllm:num_requests_waiting 11\n"
	                           "vllm:gpu_cache_usage_perc 0.95\n";
	Smg__RankLoad r;

	(void)state;
	assert_int_equal(parse_prom(sglang, NULL, &r), 0);
	assert_int_equal(r.dp_rank, 0);
	assert_int_equal(r.num_running_reqs, 7);
	assert_int_equal(r.num_waiting_reqs, 6);
	assert_true(r.token_usage == 0.25);
	assert_true(r.gen_throughput == 200.0);
	assert_true(r.cache_hit_rate == 0.5);
	assert_true(r.utilization == 0.75);
	assert_int_equal(r.num_waiting_uncached_tokens, 0);
	assert_int_equal(r.num_total_reqs, 0);
	assert_int_equal(r.num_used_tokens, 0);
	assert_int_equal(r.max_total_num_tokens, 0);
	assert_int_equal(r.max_running_requests, 0);
	/* The runtime reaches the parser. */
	assert_int_equal(parse_prom(sglang, "vllm", &r), -1);
	assert_int_equal(r.num_running_reqs, 0); /* initialised even so */
	assert_int_equal(parse_prom(vllm, "vllm", &r), 0);
	assert_int_equal(r.num_waiting_reqs, 11);
	assert_true(r.token_usage == 0.95);
	assert_int_equal(parse_prom(vllm, "sglang", &r), -1);
	assert_int_equal(parse_prom("", NULL, &r), -1);
}

static void
test_wanted(void **state)
{
	struct config cf;

	(void)state;
	memset(&cf, 0, sizeof(cf));
	cf.cf_policy = POLICY_ROUND_ROBIN;
	assert_true(load_wanted(&cf));
	cf.cf_disable_load_monitoring = true;
	assert_false(load_wanted(&cf));
	cf.cf_engine_metrics = true;
	assert_true(load_wanted(&cf));
	cf.cf_engine_metrics = false;
	cf.cf_worker_overload_waiting_requests_set = true;
	assert_true(load_wanted(&cf));
	cf.cf_worker_overload_waiting_requests_set = false;
	cf.cf_policy = POLICY_LEAST_LOAD;
	assert_true(load_wanted(&cf));
	cf.cf_policy = POLICY_POWER_OF_TWO;
	assert_true(load_wanted(&cf));
	cf.cf_policy = POLICY_RANDOM;
	cf.cf_pd_disaggregation = true;
	cf.cf_prefill_policy = POLICY_RANDOM;
	cf.cf_decode_policy = POLICY_CACHE_AWARE;
	assert_true(load_wanted(&cf));
	cf.cf_decode_policy = POLICY_RANDOM;
	assert_false(load_wanted(&cf));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_prom_rank),
		cmocka_unit_test(test_wanted),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
