/* promerge_test.c: unit tests of shared/promerge.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shared/promerge.h"

static const char *sglang =
    "# HELP sglang:num_running_reqs The number of running requests.\n"
    "# TYPE sglang:num_running_reqs gauge\n"
    "sglang:num_running_reqs{model_name=\"m\"} 3.0\n"
    "# HELP sglang:e2e_request_latency_seconds Latency.\n"
    "# TYPE sglang:e2e_request_latency_seconds histogram\n"
    "sglang:e2e_request_latency_seconds_bucket{le=\"0.1\"} 1\n"
    "sglang:e2e_request_latency_seconds_bucket{le=\"+Inf\"} 2\n"
    "sglang:e2e_request_latency_seconds_sum 0.5\n"
    "sglang:e2e_request_latency_seconds_count 2\r\n"
    "# a comment\n"
    "\n"
    "up{} 1\n";

static void
test_merge(void **state)
{
	struct promerge *pm;
	char *t;
	size_t len;

	(void)state;
	assert_non_null(pm = promerge_new());
	assert_int_equal(promerge_add(pm, sglang, strlen(sglang), "worker_addr",
	                     "http://a:1"),
	    0);
	assert_int_equal(promerge_add(pm, sglang, strlen(sglang), "worker_addr",
	                     "http://b\"2"),
	    0);
	assert_non_null(t = promerge_text(pm, &len));
	assert_int_equal(strlen(t), len);
	/* One HELP/TYPE per family, the samples of both workers under it. */
	assert_string_equal(t,
	    "# HELP sglang_num_running_reqs The number of running requests.\n"
	    "# TYPE sglang_num_running_reqs gauge\n"
	    "sglang_num_running_reqs{worker_addr=\"http://a:1\","
	    "model_name=\"m\"} 3.0\n"
	    "sglang_num_running_reqs{worker_addr=\"http://b\\\"2\","
	    "model_name=\"m\"} 3.0\n"
	    "# HELP sglang_e2e_request_latency_seconds Latency.\n"
	    "# TYPE sglang_e2e_request_latency_seconds histogram\n"
	    "sglang_e2e_request_latency_seconds_bucket{worker_addr=\"http://"
	    "a:1\",le=\"0.1\"} 1\n"
	    "sglang_e2e_request_latency_seconds_bucket{worker_addr=\"http://"
	    "a:1\",le=\"+Inf\"} 2\n"
	    "sglang_e2e_request_latency_seconds_sum{worker_addr=\"http://"
	    "a:1\"} 0.5\n"
	    "sglang_e2e_request_latency_seconds_count{worker_addr=\"http://"
	    "a:1\"} 2\n"
	    "sglang_e2e_request_latency_seconds_bucket{worker_addr=\"http://"
	    "b\\\"2\",le=\"0.1\"} 1\n"
	    "sglang_e2e_request_latency_seconds_bucket{worker_addr=\"http://"
	    "b\\\"2\",le=\"+Inf\"} 2\n"
	    "sglang_e2e_request_latency_seconds_sum{worker_addr=\"http://"
	    "b\\\"2\"} 0.5\n"
	    "sglang_e2e_request_latency_seconds_count{worker_addr=\"http://"
	    "b\\\"2\"} 2\n"
	    "up{worker_addr=\"http://a:1\"} 1\n"
	    "up{worker_addr=\"http://b\\\"2\"} 1\n");
	free(t);
	promerge_free(pm);
}

static void
test_odd_input(void **state)
{
	struct promerge *pm;
	char *t;
	size_t len;

	(void)state;
	assert_non_null(pm = promerge_new());
	/* Read to len only, no final newline, junk lines. */
	assert_int_equal(promerge_add(pm,
	                     "# HELP\n#TYPE x\nnovalue\n{} 1\nx 1 and more", 31,
	                     "w", "v"),
	    0);
	assert_int_equal(promerge_add(pm, "", 0, "w", "v"), 0);
	assert_non_null(t = promerge_text(pm, &len));
	assert_string_equal(t, "x{w=\"v\"} 1\n");
	free(t);
	promerge_free(pm);
	promerge_free(NULL);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_merge),
		cmocka_unit_test(test_odd_input),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
