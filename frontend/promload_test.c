/* promload_test.c: load reports from SGLang and vLLM Prometheus text. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "frontend/frontend.h"

static cJSON *
rank0(cJSON *rep)
{
	cJSON *loads;

	assert_non_null(rep);
	assert_int_equal(
	    cJSON_GetObjectItemCaseSensitive(rep, "dp_rank_count")->valueint,
	    1);
	loads = cJSON_GetObjectItemCaseSensitive(rep, "loads");
	assert_true(cJSON_IsArray(loads));
	assert_int_equal(cJSON_GetArraySize(loads), 1);
	return cJSON_GetArrayItem(loads, 0);
}

static double
num(cJSON *r, const char *name)
{
	cJSON *v = cJSON_GetObjectItemCaseSensitive(r, name);

	assert_true(cJSON_IsNumber(v));
	return v->valuedouble;
}

static void
test_sglang_colon(void **state)
{
	static const char text[] =
	    "# HELP sglang:num_running_reqs Running.\n"
	    "# TYPE sglang:num_running_reqs gauge\n"
	    "sglang:num_running_reqs{model_name=\"m\",dp=\"0\"} 3\n"
	    "sglang:num_running_reqs{model_name=\"m\",dp=\"1\"} 4\n"
	    "sglang:num_queue_reqs{model_name=\"m\"} 7 1700000000000\n"
	    "sglang:token_usage{model_name=\"m\",dp=\"0\"} 0.2\n"
	    "sglang:token_usage{model_name=\"m\",dp=\"1\"} 0.4\n"
	    "sglang:gen_throughput{model_name=\"m\"} 120.5\n"
	    "sglang:cache_hit_rate{model_name=\"m\"} 0.25\n"
	    "sglang:utilization{model_name=\"m\"} 0.5\n"
	    "sglang:num_running_reqs_total 99\n"
	    "\n";
	cJSON *rep = promload_report(text, sizeof(text) - 1), *r = rank0(rep);

	(void)state;
	assert_int_equal((int)num(r, "dp_rank"), 0);
	assert_true(num(r, "num_running_reqs") == 7); /* summed */
	assert_true(num(r, "num_waiting_reqs") == 7);
	assert_true(fabs(num(r, "token_usage") - 0.3) < 1e-9); /* mean */
	assert_true(num(r, "gen_throughput") == 120.5);
	assert_true(num(r, "cache_hit_rate") == 0.25);
	assert_true(num(r, "utilization") == 0.5);
	/* No absolute token counts from this source. */
	assert_null(cJSON_GetObjectItemCaseSensitive(r, "num_used_tokens"));
	assert_null(
	    cJSON_GetObjectItemCaseSensitive(r, "max_total_num_tokens"));
	cJSON_Delete(rep);
}

static void
test_sglang_underscore(void **state)
{
	static const char text[] = "sglang_num_running_reqs 2\n"
	                           "sglang_num_queue_reqs 1\n"
	                           "sglang_token_usage 0.75\n";
	cJSON *rep = promload_report(text, sizeof(text) - 1), *r = rank0(rep);

	(void)state;
	assert_true(num(r, "num_running_reqs") == 2);
	assert_true(num(r, "num_waiting_reqs") == 1);
	assert_true(num(r, "token_usage") == 0.75);
	assert_true(num(r, "gen_throughput") == 0); /* absent metric */
	cJSON_Delete(rep);
}

static void
test_vllm(void **state)
{
	static const char v1[] =
	    "vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 5\n"
	    "vllm:num_requests_running{model_name=\"m\",engine=\"1\"} 1\n"
	    "vllm:num_requests_waiting{model_name=\"m\"} 2\n"
	    "vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.5\n"
	    "vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"1\"} 0.1\n"
	    "vllm:gpu_prefix_cache_hit_rate{model_name=\"m\"} 0.9\n";
	static const char v0[] = "vllm:gpu_cache_usage_perc 0.6\n";
	cJSON *rep = promload_report(v1, sizeof(v1) - 1), *r = rank0(rep);

	(void)state;
	assert_true(num(r, "num_running_reqs") == 6);
	assert_true(num(r, "num_waiting_reqs") == 2);
	assert_true(fabs(num(r, "token_usage") - 0.3) < 1e-9);
	assert_true(num(r, "cache_hit_rate") == 0.9);
	assert_true(num(r, "gen_throughput") == 0);
	assert_null(cJSON_GetObjectItemCaseSensitive(r, "utilization"));
	cJSON_Delete(rep);

	rep = promload_report(v0, sizeof(v0) - 1);
	r = rank0(rep);
	assert_true(num(r, "token_usage") == 0.6);
	assert_true(num(r, "num_running_reqs") == 0);
	cJSON_Delete(rep);
}

static void
test_no_report(void **state)
{
	static const char generic[] = "http_requests_total 10\n"
	                              "process_cpu_seconds_total 1.5\n";
	/* Running counts alone are not the presence gate. */
	static const char nogate[] = "vllm:num_requests_running 3\n"
	                             "sglang:num_running_reqs 3\n";

	(void)state;
	assert_null(promload_report(generic, sizeof(generic) - 1));
	assert_null(promload_report(nogate, sizeof(nogate) - 1));
	assert_null(promload_report("", 0));
}

static void
test_malformed_lines(void **state)
{
	/* Broken lines are skipped; the label block ends at the last '}',
	 * so braces inside label values do not cut it short. */
	static const char text[] = "sglang:token_usage{a=\"}\"} 0.5\n"
	                           "sglang:token_usage{unterminated 0.9\n"
	                           "sglang:token_usage{a=\"x\"} not-a-number\n"
	                           "sglang:token_usage{a=\"y\"} NaN\n"
	                           "sglang:token_usage{a=\"z\"}\n"
	                           "   \t\n"
	                           "{} 3\n"
	                           "sglang:num_running_reqs 1e400\n"
	                           "sglang:num_running_reqs\t2";
	cJSON *rep = promload_report(text, sizeof(text) - 1), *r = rank0(rep);
	char *s;

	(void)state;
	assert_true(num(r, "token_usage") == 0.5);
	assert_true(num(r, "num_running_reqs") == 2);
	s = cJSON_PrintUnformatted(rep);
	assert_non_null(s);
	assert_null(strstr(s, "null"));
	cJSON_free(s);
	cJSON_Delete(rep);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sglang_colon),
		cmocka_unit_test(test_sglang_underscore),
		cmocka_unit_test(test_vllm),
		cmocka_unit_test(test_no_report),
		cmocka_unit_test(test_malformed_lines),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
