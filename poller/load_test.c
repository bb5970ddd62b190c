/*
 * load_test.c: the poller's load report parsers on real-shaped bodies:
 * /v1/loads from SGLang (multi-rank, nested sections, newest shape without
 * dp_rank_count), empty and not-a-load responses, and the rank filled from
 * the Prometheus fallback (the text itself is shared/promload_test.c's).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "poller/poller.h"
#include "shared/config.h"

static Smg__RankLoad ranks[LOAD_MAX_RANKS];

static enum load_parse
parse_json(const char *body, size_t *n)
{
	return load_parse_json(body, strlen(body), ranks, LOAD_MAX_RANKS, n);
}

static int
parse_prom(const char *body, const char *runtime, Smg__RankLoad *r)
{
	return load_parse_prom(body, strlen(body), runtime, r);
}

static void
test_loads_two_ranks(void **state)
{
	const char *body =
	    "{\"timestamp\":\"2026-08-01T12:00:00Z\",\"version\":\"0.5.4\","
	    "\"dp_rank_count\":2,\"loads\":["
	    "{\"dp_rank\":0,\"num_running_reqs\":3,\"num_waiting_reqs\":5,"
	    "\"num_waiting_uncached_tokens\":4096,\"num_total_reqs\":8,"
	    "\"num_used_tokens\":12000,\"max_total_num_tokens\":500000,"
	    "\"token_usage\":0.024,\"gen_throughput\":812.5,"
	    "\"cache_hit_rate\":0.61,\"utilization\":0.4,"
	    "\"max_running_requests\":256,\"kv_transfer_latency_ms\":3.1,"
	    "\"disagg_mode\":\"prefill\",\"memory\":{\"weight_gb\":14.2},"
	    "\"queues\":{\"waiting\":5}},"
	    "{\"dp_rank\":1,\"num_running_reqs\":1,\"num_waiting_reqs\":0,"
	    "\"token_usage\":0.5,\"gen_throughput\":100}]}";
	size_t n;

	(void)state;
	assert_int_equal(parse_json(body, &n), LOAD_PARSE_REPORT);
	assert_int_equal(n, 2);
	assert_int_equal(ranks[0].dp_rank, 0);
	assert_int_equal(ranks[0].num_running_reqs, 3);
	assert_int_equal(ranks[0].num_waiting_reqs, 5);
	assert_int_equal(ranks[0].num_waiting_uncached_tokens, 4096);
	assert_int_equal(ranks[0].num_total_reqs, 8);
	assert_int_equal(ranks[0].num_used_tokens, 12000);
	assert_int_equal(ranks[0].max_total_num_tokens, 500000);
	assert_true(ranks[0].token_usage == 0.024);
	assert_true(ranks[0].gen_throughput == 812.5);
	assert_true(ranks[0].cache_hit_rate == 0.61);
	assert_true(ranks[0].utilization == 0.4);
	assert_int_equal(ranks[0].max_running_requests, 256);
	assert_int_equal(ranks[1].dp_rank, 1);
	assert_int_equal(ranks[1].num_running_reqs, 1);
	/* Missing fields are 0. */
	assert_int_equal(ranks[1].num_waiting_uncached_tokens, 0);
	assert_int_equal(ranks[1].max_total_num_tokens, 0);
	assert_true(ranks[1].token_usage == 0.5);
}

static void
test_loads_newest_shape(void **state)
{
	/* Newest SGLang: no dp_rank_count, num_total_tokens, no dp_rank. */
	const char *body = "{\"timestamp\":\"2026-08-01T12:00:00Z\","
	                   "\"loads\":[{\"num_running_reqs\":7,"
	                   "\"num_total_tokens\":99,\"num_waiting_reqs\":2,"
	                   "\"weird\":[1,2],\"token_usage\":\"high\"}]}";
	size_t n;

	(void)state;
	assert_int_equal(parse_json(body, &n), LOAD_PARSE_REPORT);
	assert_int_equal(n, 1);
	assert_int_equal(ranks[0].dp_rank, 0);
	assert_int_equal(ranks[0].num_running_reqs, 7);
	assert_int_equal(ranks[0].num_waiting_reqs, 2);
	/* A wrongly typed field reads as absent. */
	assert_true(ranks[0].token_usage == 0.0);
}

static void
test_loads_empty_and_absent(void **state)
{
	size_t n = 99;

	(void)state;
	assert_int_equal(parse_json("{\"timestamp\":\"x\",\"loads\":[]}", &n),
	    LOAD_PARSE_EMPTY);
	assert_int_equal(n, 0);
	/* Only non-objects: no rank, still a load response. */
	assert_int_equal(parse_json("{\"loads\":[1,\"a\"]}", &n),
	    LOAD_PARSE_EMPTY);
	/* Not a load response: the route counts as absent. */
	assert_int_equal(parse_json("{\"status\":\"ok\"}", &n),
	    LOAD_PARSE_NOT_LOADS);
	assert_int_equal(parse_json("{\"loads\":{}}", &n),
	    LOAD_PARSE_NOT_LOADS);
	assert_int_equal(parse_json("[{\"loads\":[]}]", &n),
	    LOAD_PARSE_NOT_LOADS);
	assert_int_equal(parse_json("<html>Not Found</html>", &n),
	    LOAD_PARSE_NOT_LOADS);
	assert_int_equal(parse_json("", &n), LOAD_PARSE_NOT_LOADS);
}

static void
test_loads_rank_cap(void **state)
{
	char body[64 * (LOAD_MAX_RANKS + 8)];
	size_t i, off, n;

	(void)state;
	off = (size_t)snprintf(body, sizeof(body), "{\"loads\":[");
	for (i = 0; i < LOAD_MAX_RANKS + 5; i++)
		off += (size_t)snprintf(body + off, sizeof(body) - off,
		    "%s{\"num_waiting_reqs\":%zu}", i ? "," : "", i);
	snprintf(body + off, sizeof(body) - off, "]}");
	assert_int_equal(parse_json(body, &n), LOAD_PARSE_REPORT);
	assert_int_equal(n, LOAD_MAX_RANKS);
	assert_int_equal(ranks[LOAD_MAX_RANKS - 1].num_waiting_reqs,
	    LOAD_MAX_RANKS - 1);
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
		cmocka_unit_test(test_loads_two_ranks),
		cmocka_unit_test(test_loads_newest_shape),
		cmocka_unit_test(test_loads_empty_and_absent),
		cmocka_unit_test(test_loads_rank_cap),
		cmocka_unit_test(test_prom_rank),
		cmocka_unit_test(test_wanted),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
