/*
 * pd_test.c: the PD body rewriting of gateway.md §11.2: bootstrap host of
 * a worker URL, rooms in [0, 2^63 - 1], the injected fields as single
 * values or arrays of n for batches, with exact 63-bit integers, DP ranks
 * of "@<rank>" URLs; and the return_logprob merge of §11.5 (JSON, batches,
 * SSE events).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "frontend/frontend.h"

struct frontend *fe;

static void
test_bootstrap_host(void **state)
{
	char h[64];

	(void)state;
	assert_int_equal(pd_bootstrap_host("http://10.0.0.5:8000", h, 64), 0);
	assert_string_equal(h, "10.0.0.5");
	assert_int_equal(pd_bootstrap_host("https://pre.example/v1", h, 64), 0);
	assert_string_equal(h, "pre.example");
	assert_int_equal(pd_bootstrap_host("http://h:8000@3", h, 64), 0);
	assert_string_equal(h, "h");
	assert_int_equal(pd_bootstrap_host("http://h@2", h, 64), 0);
	assert_string_equal(h, "h");
	assert_int_equal(pd_bootstrap_host("http://[::1]:8000", h, 64), 0);
	assert_string_equal(h, "::1");
	assert_int_equal(pd_bootstrap_host("nourl", h, 64), -1);
	assert_int_equal(pd_bootstrap_host("http://", h, 64), -1);
	assert_int_equal(pd_bootstrap_host("http://longhostname", h, 4), -1);
}

static void
test_rooms(void **state)
{
	uint64_t a, b;
	int i;

	(void)state;
	for (i = 0; i < 1000; i++)
		assert_true(pd_room() <= (uint64_t)INT64_MAX);
	a = pd_room();
	b = pd_room();
	assert_true(a != b);
}

static void
test_inject_single(void **state)
{
	cJSON *j = cJSON_Parse("{\"text\":\"hi\",\"bootstrap_port\":1}");
	uint64_t room = 9223372036854775807ULL;
	char *s;

	(void)state;
	assert_int_equal(pd_inject(j, "10.0.0.5", 8998, &room, 1, false, ""),
	    0);
	s = cJSON_PrintUnformatted(j);
	assert_string_equal(s,
	    "{\"text\":\"hi\",\"bootstrap_host\":\"10.0.0.5\","
	    "\"bootstrap_port\":8998,"
	    "\"bootstrap_room\":9223372036854775807}");
	free(s);
	/* No bootstrap port: null; an encode prefix and no room. */
	assert_int_equal(pd_inject(j, "e", -1, NULL, 1, false, "encode_"), 0);
	s = cJSON_PrintUnformatted(j);
	assert_non_null(strstr(s, "\"encode_bootstrap_host\":\"e\""));
	assert_non_null(strstr(s, "\"encode_bootstrap_port\":null"));
	assert_null(strstr(s, "encode_bootstrap_room"));
	free(s);
	assert_int_equal(pd_inject(j, "h", 1, &room, 0, false, ""), -1);
	cJSON_Delete(j);
	j = cJSON_Parse("[1]");
	assert_int_equal(pd_inject(j, "h", 1, &room, 1, false, ""), -1);
	cJSON_Delete(j);
}

static void
test_inject_batch(void **state)
{
	cJSON *j = cJSON_Parse("{\"prompt\":[\"a\",\"b\",\"c\"]}");
	uint64_t rooms[3] = { 1, 4611686018427387905ULL, 3 };
	char *s;

	(void)state;
	assert_int_equal(pd_inject(j, "p", -1, rooms, 3, true, ""), 0);
	s = cJSON_PrintUnformatted(j);
	assert_string_equal(s,
	    "{\"prompt\":[\"a\",\"b\",\"c\"],"
	    "\"bootstrap_host\":[\"p\",\"p\",\"p\"],"
	    "\"bootstrap_port\":[null,null,null],"
	    "\"bootstrap_room\":[1,4611686018427387905,3]}");
	free(s);
	cJSON_Delete(j);
}

static void
test_rank_field(void **state)
{
	cJSON *j = cJSON_Parse("{\"text\":\"hi\",\"data_parallel_rank\":9}");
	cJSON *a = cJSON_Parse("[1]");
	char *s;

	(void)state;
	assert_int_equal(pd_rank_field(j, "data_parallel_rank", 3), 0);
	assert_int_equal(pd_rank_field(j, "routed_dp_rank", 0), 0);
	s = cJSON_PrintUnformatted(j);
	/* The client's own rank is replaced, never duplicated. */
	assert_string_equal(s,
	    "{\"text\":\"hi\",\"data_parallel_rank\":3,"
	    "\"routed_dp_rank\":0}");
	free(s);
	assert_int_equal(pd_rank_field(j, "data_parallel_rank", -1), -1);
	assert_int_equal(pd_rank_field(a, "data_parallel_rank", 1), -1);
	assert_int_equal(pd_rank_field(NULL, "data_parallel_rank", 1), -1);
	s = cJSON_PrintUnformatted(a);
	assert_string_equal(s, "[1]");
	free(s);
	cJSON_Delete(a);
	cJSON_Delete(j);
}

static char *
merged(const char *decode, const char *prefill, int want)
{
	cJSON *d = cJSON_Parse(decode), *p = cJSON_Parse(prefill);
	char *s;

	assert_non_null(d);
	assert_non_null(p);
	assert_int_equal(pd_merge_logprobs(d, p), want);
	s = cJSON_PrintUnformatted(d);
	cJSON_Delete(d);
	cJSON_Delete(p);
	return s;
}

static void
test_merge_json(void **state)
{
	char *s;

	(void)state;
	/* The prefill's entries come first. */
	s = merged("{\"text\":\"x\",\"meta_info\":{\"id\":\"a\","
	           "\"input_token_logprobs\":[[-0.5,9,null]]}}",
	    "{\"meta_info\":{\"input_token_logprobs\":"
	    "[[null,7,null],[-1.25,8,null]]}}",
	    1);
	assert_string_equal(s,
	    "{\"text\":\"x\",\"meta_info\":{\"id\":\"a\","
	    "\"input_token_logprobs\":[[null,7,null],[-1.25,8,null],"
	    "[-0.5,9,null]]}}");
	free(s);
	/* Empty decode list: the prefill's alone. */
	s = merged("{\"meta_info\":{\"input_token_logprobs\":[]}}",
	    "{\"meta_info\":{\"input_token_logprobs\":[[null,1,null]]}}", 1);
	assert_string_equal(s,
	    "{\"meta_info\":{\"input_token_logprobs\":[[null,1,null]]}}");
	free(s);
	/* No list on one side: unchanged. */
	s = merged("{\"meta_info\":{\"id\":1}}",
	    "{\"meta_info\":{\"input_token_logprobs\":[[null,1,null]]}}", 0);
	assert_string_equal(s, "{\"meta_info\":{\"id\":1}}");
	free(s);
	s = merged("{\"meta_info\":{\"input_token_logprobs\":[[1,2,null]]}}",
	    "{\"meta_info\":{\"input_token_logprobs\":\"no\"}}", 0);
	assert_string_equal(s,
	    "{\"meta_info\":{\"input_token_logprobs\":[[1,2,null]]}}");
	free(s);
	/* Batches element by element; sizes must agree. */
	s = merged("[{\"meta_info\":{\"input_token_logprobs\":[[1,1,null]]}},"
	           "{\"meta_info\":{\"input_token_logprobs\":[[2,2,null]]}}]",
	    "[{\"meta_info\":{\"input_token_logprobs\":[[3,3,null]]}},"
	    "{\"meta_info\":{\"input_token_logprobs\":[[4,4,null]]}}]",
	    1);
	assert_string_equal(s,
	    "[{\"meta_info\":{\"input_token_logprobs\":[[3,3,null],"
	    "[1,1,null]]}},{\"meta_info\":{\"input_token_logprobs\":"
	    "[[4,4,null],[2,2,null]]}}]");
	free(s);
	s = merged("[{\"meta_info\":{\"input_token_logprobs\":[]}}]",
	    "[{\"meta_info\":{\"input_token_logprobs\":[[1,1,null]]}},{}]", 0);
	free(s);
	s = merged("[{\"meta_info\":{\"input_token_logprobs\":[]}}]",
	    "{\"meta_info\":{\"input_token_logprobs\":[[1,1,null]]}}", 0);
	free(s);
}

static void
test_prefill_body(void **state)
{
	const char *sse =
	    ": comment\n\n"
	    "data: {\"text\":\"a\",\"meta_info\":{\"id\":1}}\n\n"
	    "data: {\"meta_info\":{\"input_token_logprobs\":[[null,5,null]]}}"
	    "\r\n\r\n"
	    "data: {\"meta_info\":{\"input_token_logprobs\":[[0,6,null]]}}\n\n"
	    "data: [DONE]\n\n";
	const char *js = " {\"meta_info\":{\"input_token_logprobs\":[]}}";
	cJSON *j;
	char *s;

	(void)state;
	j = pd_prefill_logprobs(js, strlen(js));
	assert_true(cJSON_IsObject(j));
	cJSON_Delete(j);
	/* SSE: the first event holding the list. */
	j = pd_prefill_logprobs(sse, strlen(sse));
	assert_non_null(j);
	s = cJSON_PrintUnformatted(j);
	assert_string_equal(s,
	    "{\"meta_info\":{\"input_token_logprobs\":[[null,5,null]]}}");
	free(s);
	cJSON_Delete(j);
	assert_null(pd_prefill_logprobs("data: [DONE]\n\n", 14));
	assert_null(pd_prefill_logprobs("not json", 8));
	assert_null(pd_prefill_logprobs("", 0));
	assert_null(pd_prefill_logprobs("data: {\"a\":", 12));
}

static void
test_sse_events(void **state)
{
	const char *two = "data: {}\n\ndata: [DONE]\r\n\r\n";
	const char *ev = "data: {\"text\":\"x\",\"meta_info\":"
	                 "{\"input_token_logprobs\":[[-1,9,null]]}}\n\n";
	cJSON *p = cJSON_Parse(
	    "{\"meta_info\":{\"input_token_logprobs\":[[null,8,null]]}}");
	size_t n = 0;
	char *out;

	(void)state;
	assert_int_equal(pd_sse_event_len(two, strlen(two)), 10);
	assert_int_equal(pd_sse_event_len(two + 10, strlen(two) - 10), 16);
	assert_int_equal(pd_sse_event_len("data: {}\n", 9), 0);
	assert_int_equal(pd_sse_event_len("", 0), 0);
	out = pd_merge_event(ev, strlen(ev), p, &n);
	assert_non_null(out);
	assert_int_equal(n, strlen(out));
	assert_string_equal(out,
	    "data: {\"text\":\"x\",\"meta_info\":{\"input_token_logprobs\":"
	    "[[null,8,null],[-1,9,null]]}}\n\n");
	free(out);
	/* Left alone: [DONE], no list, several lines, not JSON. */
	assert_null(pd_merge_event("data: [DONE]\n\n", 14, p, &n));
	assert_null(pd_merge_event("data: {\"a\":1}\n\n", 15, p, &n));
	assert_null(pd_merge_event("event: x\ndata: {}\n\n", 20, p, &n));
	assert_null(pd_merge_event("data: {}\ndata: {}\n\n", 20, p, &n));
	assert_null(pd_merge_event("data: {\n\n", 9, p, &n));
	cJSON_Delete(p);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bootstrap_host),
		cmocka_unit_test(test_rooms),
		cmocka_unit_test(test_inject_single),
		cmocka_unit_test(test_inject_batch),
		cmocka_unit_test(test_rank_field),
		cmocka_unit_test(test_merge_json),
		cmocka_unit_test(test_prefill_body),
		cmocka_unit_test(test_sse_events),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
