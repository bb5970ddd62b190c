/*
 * promload_test.c: load ranks from real-shaped SGLang (both prefixes) and
 * vLLM (v0, v1) Prometheus text, the presence gate, the runtime hint and
 * malformed lines.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "shared/promload.h"

static int
parse(const char *text, const char *runtime, struct promload_report *r)
{
	return promload_parse(text, strlen(text), runtime, r);
}

/* Every double of a report is finite (it is rendered as JSON). */
static void
assert_finite(const struct promload_report *r)
{
	assert_true(isfinite(r->pr_token_usage));
	assert_true(isfinite(r->pr_gen_throughput));
	assert_true(isfinite(r->pr_cache_hit_rate));
	assert_true(isfinite(r->pr_utilization));
}

/* SGLang <= 0.5.3: "sglang:" prefix, two label sets (two DP ranks). */
static const char sglang_colon[] =
    "# HELP sglang:num_running_reqs The number of running requests.\n"
    "# TYPE sglang:num_running_reqs gauge\n"
    "sglang:num_running_reqs{model_name=\"m\",dp_rank=\"0\"} 3.0\n"
    "sglang:num_running_reqs{model_name=\"m\",dp_rank=\"1\"} 4.0\n"
    "# TYPE sglang:num_queue_reqs gauge\n"
    "sglang:num_queue_reqs{model_name=\"m\",dp_rank=\"0\"} 5.0\n"
    "sglang:num_queue_reqs{model_name=\"m\",dp_rank=\"1\"} 1.0\n"
    "sglang:token_usage{model_name=\"m\",dp_rank=\"0\"} 0.2\n"
    "sglang:token_usage{model_name=\"m\",dp_rank=\"1\"} 0.4\n"
    "sglang:gen_throughput{model_name=\"m\",dp_rank=\"0\"} 100.0\n"
    "sglang:gen_throughput{model_name=\"m\",dp_rank=\"1\"} 300.0\n"
    "sglang:cache_hit_rate{model_name=\"m\",dp_rank=\"0\"} 0.5\n"
    "sglang:utilization{model_name=\"m\"} 0.25 1722000000000\n"
    "sglang:num_running_reqs_total{model_name=\"m\"} 1000\n"
    "sglang:prompt_tokens_total{model_name=\"m\"} 12345\n"
    "garbage line without value\n"
    "sglang:num_queue_reqs{model_name=\"m\"} notanumber\n";

static void
test_sglang_colon(void **state)
{
	struct promload_report r;

	(void)state;
	assert_int_equal(parse(sglang_colon, NULL, &r), 0);
	assert_int_equal(r.pr_engine, PROMLOAD_SGLANG);
	assert_int_equal(r.pr_num_running_reqs, 7); /* summed */
	assert_int_equal(r.pr_num_waiting_reqs, 6);
	assert_true(r.pr_token_usage > 0.2999 && r.pr_token_usage < 0.3001);
	assert_true(r.pr_gen_throughput == 200.0); /* mean */
	assert_true(r.pr_cache_hit_rate == 0.5);
	assert_true(r.pr_utilization == 0.25);
	/* Told it is SGLang: same; told vLLM: nothing of it is read. */
	assert_int_equal(parse(sglang_colon, "sglang", &r), 0);
	assert_int_equal(r.pr_num_running_reqs, 7);
	assert_int_equal(parse(sglang_colon, "vllm", &r), -1);
}

static void
test_sglang_colon_timestamps(void **state)
{
	/* One unlabelled-rank count with a timestamp; a _total series that
	 * shares the name's prefix is another metric. */
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
	struct promload_report r;

	(void)state;
	assert_int_equal(parse(text, NULL, &r), 0);
	assert_int_equal(r.pr_engine, PROMLOAD_SGLANG);
	assert_int_equal(r.pr_num_running_reqs, 7);
	assert_int_equal(r.pr_num_waiting_reqs, 7);
	assert_true(fabs(r.pr_token_usage - 0.3) < 1e-9);
	assert_true(r.pr_gen_throughput == 120.5);
	assert_true(r.pr_cache_hit_rate == 0.25);
	assert_true(r.pr_utilization == 0.5);
}

static void
test_sglang_underscore(void **state)
{
	/* SGLang >= 0.5.4: "sglang_" prefix, unlabelled samples, CRLF. */
	static const char crlf[] = "# TYPE sglang_num_running_reqs gauge\r\n"
	                           "sglang_num_running_reqs 2\r\n"
	                           "sglang_num_queue_reqs 9\r\n"
	                           "sglang_token_usage 0.75\r\n"
	                           "sglang_gen_throughput 1500.5\r\n";
	static const char lf[] = "sglang_num_running_reqs 2\n"
	                         "sglang_num_queue_reqs 1\n"
	                         "sglang_token_usage 0.75\n";
	struct promload_report r;

	(void)state;
	assert_int_equal(parse(crlf, NULL, &r), 0);
	assert_int_equal(r.pr_engine, PROMLOAD_SGLANG);
	assert_int_equal(r.pr_num_running_reqs, 2);
	assert_int_equal(r.pr_num_waiting_reqs, 9);
	assert_true(r.pr_token_usage == 0.75);
	assert_true(r.pr_gen_throughput == 1500.5);

	assert_int_equal(parse(lf, NULL, &r), 0);
	assert_int_equal(r.pr_num_running_reqs, 2);
	assert_int_equal(r.pr_num_waiting_reqs, 1);
	assert_true(r.pr_token_usage == 0.75);
	assert_true(r.pr_gen_throughput == 0); /* absent metric */
}

static void
test_sglang_prefix_choice(void **state)
{
	/* The prefix is the one whose token_usage exists, not the first
	 * name seen; names of the other prefix are not mixed in. */
	static const char text[] = "sglang:num_running_reqs 50\n"
	                           "sglang_num_running_reqs 3\n"
	                           "sglang_token_usage 0.1\n";
	static const char both[] = "sglang_token_usage 0.9\n"
	                           "sglang_num_queue_reqs 8\n"
	                           "sglang:token_usage 0.2\n"
	                           "sglang:num_queue_reqs 1\n";
	struct promload_report r;

	(void)state;
	assert_int_equal(parse(text, NULL, &r), 0);
	assert_int_equal(r.pr_num_running_reqs, 3);
	assert_true(r.pr_token_usage == 0.1);
	/* Both present: "sglang:" is tried first. */
	assert_int_equal(parse(both, NULL, &r), 0);
	assert_int_equal(r.pr_num_waiting_reqs, 1);
	assert_true(r.pr_token_usage == 0.2);
}

static void
test_vllm(void **state)
{
	static const char v1[] =
	    "# HELP vllm:num_requests_running Number of requests running.\n"
	    "# TYPE vllm:num_requests_running gauge\n"
	    "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 4.0\n"
	    "vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2.0\n"
	    "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0\n"
	    "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.1\n"
	    "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.3\n"
	    "vllm:gpu_prefix_cache_hit_rate{model_name=\"m\"} 0.9\n"
	    "vllm:generation_tokens_total{model_name=\"m\"} 5000.0\n";
	static const char v1b[] =
	    "vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 5\n"
	    "vllm:num_requests_running{model_name=\"m\",engine=\"1\"} 1\n"
	    "vllm:num_requests_waiting{model_name=\"m\"} 2\n"
	    "vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.5\n"
	    "vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"1\"} 0.1\n"
	    "vllm:gpu_prefix_cache_hit_rate{model_name=\"m\"} 0.9\n";
	static const char v0[] =
	    "vllm:num_requests_waiting{model_name=\"m\"} 11\n"
	    "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.95\n";
	static const char v0_bare[] = "vllm:gpu_cache_usage_perc 0.6\n";
	static const char v0_v1[] = "vllm:gpu_cache_usage_perc 0.6\n"
	                            "vllm:kv_cache_usage_perc 0.2\n";
	struct promload_report r;

	(void)state;
	assert_int_equal(parse(v1, NULL, &r), 0);
	assert_int_equal(r.pr_engine, PROMLOAD_VLLM);
	assert_int_equal(r.pr_num_running_reqs, 6);
	assert_int_equal(r.pr_num_waiting_reqs, 3);
	assert_true(r.pr_token_usage > 0.1999 && r.pr_token_usage < 0.2001);
	assert_true(r.pr_cache_hit_rate == 0.9);
	assert_true(r.pr_gen_throughput == 0.0);
	assert_true(r.pr_utilization == 0.0); /* vLLM exports none */
	assert_int_equal(parse(v1, "vllm", &r), 0);
	assert_int_equal(parse(v1, "sglang", &r), -1);

	assert_int_equal(parse(v1b, NULL, &r), 0);
	assert_int_equal(r.pr_num_running_reqs, 6);
	assert_int_equal(r.pr_num_waiting_reqs, 2);
	assert_true(fabs(r.pr_token_usage - 0.3) < 1e-9);
	assert_true(r.pr_cache_hit_rate == 0.9);
	assert_true(r.pr_gen_throughput == 0);

	assert_int_equal(parse(v0, "vllm", &r), 0);
	assert_int_equal(r.pr_engine, PROMLOAD_VLLM);
	assert_int_equal(r.pr_num_waiting_reqs, 11);
	assert_true(r.pr_token_usage == 0.95);
	assert_int_equal(parse(v0_bare, NULL, &r), 0);
	assert_true(r.pr_token_usage == 0.6);
	assert_int_equal(r.pr_num_running_reqs, 0);
	/* Both gauges: the v1 one. */
	assert_int_equal(parse(v0_v1, NULL, &r), 0);
	assert_true(r.pr_token_usage == 0.2);
}

static void
test_no_report(void **state)
{
	static const char generic[] = "http_requests_total 10\n"
	                              "process_cpu_seconds_total 1.5\n";
	/* Counts alone are not the presence gate. */
	static const char nogate[] = "vllm:num_requests_running 3\n"
	                             "sglang:num_running_reqs 3\n";
	static const char vllm_waiting[] =
	    "vllm:num_requests_waiting{model_name=\"m\"} 11\n"
	    "process_cpu_seconds_total 1.5\n";
	/* A gate gauge whose only sample is unusable is absent. */
	static const char nan_gate[] = "sglang:token_usage NaN\n"
	                               "vllm:kv_cache_usage_perc{a=\"b\"}\n";
	struct promload_report r;

	(void)state;
	assert_int_equal(parse(generic, NULL, &r), -1);
	assert_int_equal(parse(nogate, NULL, &r), -1);
	assert_int_equal(parse(vllm_waiting, NULL, &r), -1);
	assert_int_equal(parse(nan_gate, NULL, &r), -1);
	assert_int_equal(parse("", NULL, &r), -1);
	assert_int_equal(promload_parse(NULL, 0, NULL, &r), -1);
	assert_int_equal(r.pr_num_running_reqs, 0); /* zeroed on -1 */
}

static void
test_runtime_hint(void **state)
{
	static const char both[] = "sglang_token_usage 0.4\n"
	                           "vllm:kv_cache_usage_perc 0.7\n";
	struct promload_report r;

	(void)state;
	/* Unknown or empty hint: SGLang first, like no hint. */
	assert_int_equal(parse(both, NULL, &r), 0);
	assert_int_equal(r.pr_engine, PROMLOAD_SGLANG);
	assert_int_equal(parse(both, "", &r), 0);
	assert_int_equal(r.pr_engine, PROMLOAD_SGLANG);
	assert_int_equal(parse(both, "trtllm", &r), 0);
	assert_int_equal(r.pr_engine, PROMLOAD_SGLANG);
	assert_int_equal(parse(both, "vllm", &r), 0);
	assert_int_equal(r.pr_engine, PROMLOAD_VLLM);
	assert_true(r.pr_token_usage == 0.7);
	assert_int_equal(parse(both, "sglang", &r), 0);
	assert_true(r.pr_token_usage == 0.4);
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
	/* Labels with braces and spaces in values; +Inf skipped; no final
	 * newline. */
	static const char odd[] =
	    "sglang:token_usage{model_name=\"a b}c\",x=\"{\"} 0.5\n"
	    "sglang:token_usage{model_name=\"n\"} NaN\n"
	    "sglang:num_queue_reqs{model_name=\"a\"} +Inf\n"
	    "   \n"
	    "{broken} 1\n"
	    "sglang:num_queue_reqs{model_name=\"a\"} 4";
	struct promload_report r;

	(void)state;
	assert_int_equal(parse(text, NULL, &r), 0);
	assert_true(r.pr_token_usage == 0.5);
	assert_int_equal(r.pr_num_running_reqs, 2);
	assert_finite(&r);

	assert_int_equal(parse(odd, NULL, &r), 0);
	assert_true(r.pr_token_usage == 0.5);
	assert_int_equal(r.pr_num_waiting_reqs, 4);
	assert_finite(&r);
}

static void
test_length_bound(void **state)
{
	/* Only text[0..len) is read: the cut gauge line is no sample. */
	static const char text[] = "sglang_num_running_reqs 5\n"
	                           "sglang_token_usage 0.5\n";
	struct promload_report r;
	size_t cut = strlen("sglang_num_running_reqs 5\nsglang_token_usage");

	(void)state;
	assert_int_equal(promload_parse(text, cut, NULL, &r), -1);
	/* Cut inside the value: "0." is still a number. */
	assert_int_equal(promload_parse(text, cut + 3, NULL, &r), 0);
	assert_true(r.pr_token_usage == 0.0);
	assert_int_equal(r.pr_num_running_reqs, 5);
}

static void
test_extremes(void **state)
{
	/* Finite samples whose sum overflows double: counts saturate,
	 * ratios read 0; a value token too long to be a number is skipped;
	 * fractional counts round. */
	static const char text[] =
	    "sglang:token_usage 1e308\n"
	    "sglang:token_usage 1e308\n"
	    "sglang:num_running_reqs 1e308\n"
	    "sglang:num_running_reqs 1e308\n"
	    "sglang:num_queue_reqs 1.6\n"
	    "sglang:num_queue_reqs 0.000000000000000000000000000000000000"
	    "000000000000000000000000000000000000000001\n"
	    "sglang:gen_throughput -1e308\n"
	    "sglang:gen_throughput -1e308\n"
	    "sglang:gen_throughput 1e308\n";
	static const char mixed[] = "sglang_token_usage 0.5\n"
	                            "sglang_num_queue_reqs 1e308\n"
	                            "sglang_num_queue_reqs 1e308\n"
	                            "sglang_num_queue_reqs -1e308\n"
	                            "sglang_num_queue_reqs -1e308\n"
	                            "sglang_num_queue_reqs -1e308\n"
	                            "sglang_num_running_reqs -1e19\n";
	struct promload_report r;

	(void)state;
	assert_int_equal(parse(text, NULL, &r), 0);
	assert_int_equal(r.pr_num_running_reqs, INT64_MAX);
	assert_int_equal(r.pr_num_waiting_reqs, 2);
	assert_true(r.pr_token_usage == 0.0);
	assert_true(r.pr_gen_throughput == 0.0);
	assert_finite(&r);

	assert_int_equal(parse(mixed, NULL, &r), 0);
	/* An overflowed sum stays saturated. */
	assert_true(r.pr_num_waiting_reqs == INT64_MAX);
	assert_true(r.pr_num_running_reqs == INT64_MIN);
	assert_finite(&r);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sglang_colon),
		cmocka_unit_test(test_sglang_colon_timestamps),
		cmocka_unit_test(test_sglang_underscore),
		cmocka_unit_test(test_sglang_prefix_choice),
		cmocka_unit_test(test_vllm),
		cmocka_unit_test(test_no_report),
		cmocka_unit_test(test_runtime_hint),
		cmocka_unit_test(test_malformed_lines),
		cmocka_unit_test(test_length_bound),
		cmocka_unit_test(test_extremes),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
