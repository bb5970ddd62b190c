/*
 * loads_test.c: /v1/loads answers as the poller and the /get_loads
 * fan-out read them: ranks, shapes old and new, empty, absent, failed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "shared/loads.h"

#define T_MAX_RANKS 256

static Smg__RankLoad ranks[T_MAX_RANKS];

/* A whole 2xx body, its ranks in ranks[0..*n). */
static enum loads_answer
parse_json(const char *body, size_t *n)
{
	enum loads_answer a;
	cJSON *doc;

	a = loads_classify(200, true, body, strlen(body), &doc);
	assert_true((a == LOADS_REPORT) == (doc != NULL));
	*n = doc != NULL ? loads_ranks(doc, ranks, T_MAX_RANKS) : 0;
	cJSON_Delete(doc);
	return a;
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
	assert_int_equal(parse_json(body, &n), LOADS_REPORT);
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
	assert_int_equal(parse_json(body, &n), LOADS_REPORT);
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
	    LOADS_EMPTY);
	assert_int_equal(n, 0);
	/* Only non-objects: no rank, still a load response. */
	assert_int_equal(parse_json("{\"loads\":[1,\"a\"]}", &n), LOADS_EMPTY);
	/* Not a load response: the route counts as absent. */
	assert_int_equal(parse_json("{\"status\":\"ok\"}", &n), LOADS_ABSENT);
	assert_int_equal(parse_json("{\"loads\":{}}", &n), LOADS_ABSENT);
	assert_int_equal(parse_json("[{\"loads\":[]}]", &n), LOADS_ABSENT);
	assert_int_equal(parse_json("<html>Not Found</html>", &n),
	    LOADS_ABSENT);
	assert_int_equal(parse_json("", &n), LOADS_ABSENT);
}

static void
test_loads_rank_cap(void **state)
{
	char body[64 * (T_MAX_RANKS + 8)];
	size_t i, off, n;

	(void)state;
	off = (size_t)snprintf(body, sizeof(body), "{\"loads\":[");
	for (i = 0; i < T_MAX_RANKS + 5; i++)
		off += (size_t)snprintf(body + off, sizeof(body) - off,
		    "%s{\"num_waiting_reqs\":%zu}", i ? "," : "", i);
	snprintf(body + off, sizeof(body) - off, "]}");
	assert_int_equal(parse_json(body, &n), LOADS_REPORT);
	assert_int_equal(n, T_MAX_RANKS);
	assert_int_equal(ranks[T_MAX_RANKS - 1].num_waiting_reqs,
	    T_MAX_RANKS - 1);
}

static void
test_loads_status(void **state)
{
	static const char body[] = "{\"loads\":[{\"num_running_reqs\":1}]}";
	cJSON *doc = (cJSON *)1;

	(void)state;
	/* The route is absent whatever the body says. */
	assert_int_equal(loads_classify(404, true, body, strlen(body), &doc),
	    LOADS_ABSENT);
	assert_null(doc);
	assert_int_equal(loads_classify(405, false, NULL, 0, NULL),
	    LOADS_ABSENT);
	assert_int_equal(loads_classify(501, true, "", 0, NULL), LOADS_ABSENT);
	/* Failures of this time only. */
	assert_int_equal(loads_classify(0, true, NULL, 0, &doc), LOADS_FAILED);
	assert_int_equal(loads_classify(500, true, body, strlen(body), NULL),
	    LOADS_FAILED);
	assert_int_equal(loads_classify(302, true, body, strlen(body), NULL),
	    LOADS_FAILED);
	/* A body cut at the cap is no verdict on the route. */
	assert_int_equal(loads_classify(200, false, body, 10, NULL),
	    LOADS_FAILED);
	assert_int_equal(loads_classify(204, true, NULL, 0, NULL),
	    LOADS_ABSENT);
	assert_int_equal(loads_classify(200, true, body, strlen(body), NULL),
	    LOADS_REPORT);
}

static void
test_loads_used_tokens(void **state)
{
	static const char sized[] =
	    "{\"loads\":[{\"num_used_tokens\":100,"
	    "\"max_total_num_tokens\":1000},{\"num_used_tokens\":23}]}";
	static const char unsized[] = "{\"loads\":[{\"num_used_tokens\":100}]}";
	cJSON *doc;

	(void)state;
	assert_int_equal(loads_classify(200, true, sized, strlen(sized), &doc),
	    LOADS_REPORT);
	assert_true(loads_used_tokens(doc) == 123.0);
	cJSON_Delete(doc);
	assert_int_equal(
	    loads_classify(200, true, unsized, strlen(unsized), &doc),
	    LOADS_REPORT);
	assert_true(loads_used_tokens(doc) == -1.0);
	cJSON_Delete(doc);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_loads_two_ranks),
		cmocka_unit_test(test_loads_newest_shape),
		cmocka_unit_test(test_loads_empty_and_absent),
		cmocka_unit_test(test_loads_rank_cap),
		cmocka_unit_test(test_loads_status),
		cmocka_unit_test(test_loads_used_tokens),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
