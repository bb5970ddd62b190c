/*
 * pd_test.c: the PD body rewriting of gateway.md §11.2: bootstrap host of
 * a worker URL, rooms in [0, 2^63 - 1], and the injected fields as single
 * values or arrays of n for batches, with exact 63-bit integers.
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

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bootstrap_host),
		cmocka_unit_test(test_rooms),
		cmocka_unit_test(test_inject_single),
		cmocka_unit_test(test_inject_batch),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
