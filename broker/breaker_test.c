/*
 * breaker_test.c: the circuit breaker of gateway.md §7.2-§7.3: outcome
 * classes and every transition of the state machine.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "shared/log.h"

#include "broker/broker.h"

static const struct breaker_conf conf = {
	.bc_failure_threshold = 3,
	.bc_success_threshold = 2,
	.bc_timeout_ms = 1000,
};

static void
test_classify(void **state)
{
	uint32_t s;

	(void)state;
	assert_int_equal(breaker_classify(429, false), BREAKER_IGNORED);
	assert_int_equal(breaker_classify(408, false), BREAKER_FAILURE);
	assert_int_equal(breaker_classify(500, false), BREAKER_FAILURE);
	assert_int_equal(breaker_classify(502, false), BREAKER_FAILURE);
	assert_int_equal(breaker_classify(503, false), BREAKER_FAILURE);
	assert_int_equal(breaker_classify(504, false), BREAKER_FAILURE);
	assert_int_equal(breaker_classify(0, true), BREAKER_FAILURE);
	assert_int_equal(breaker_classify(200, true), BREAKER_FAILURE);
	/* Every other status, 4xx included, is a success. */
	for (s = 100; s < 600; s++) {
		if (s == 429 || s == 408 || s == 500 || s == 502 || s == 503 ||
		    s == 504)
			continue;
		assert_int_equal(breaker_classify(s, false), BREAKER_SUCCESS);
	}
	assert_int_equal(breaker_classify(501, false), BREAKER_SUCCESS);
}

static void
test_closed_to_open(void **state)
{
	struct breaker b;
	enum shm_breaker_state from;

	(void)state;
	breaker_init(&b);
	assert_int_equal(breaker_step(&b, &conf, BREAKER_FAILURE, 0, &from), 0);
	assert_int_equal(breaker_step(&b, &conf, BREAKER_FAILURE, 0, &from), 0);
	/* A success resets the run of failures. */
	assert_int_equal(breaker_step(&b, &conf, BREAKER_SUCCESS, 0, &from), 0);
	assert_int_equal(b.cb_failures, 0);
	/* 429 neither counts nor resets. */
	assert_int_equal(breaker_step(&b, &conf, BREAKER_FAILURE, 0, &from), 0);
	assert_int_equal(breaker_step(&b, &conf, BREAKER_IGNORED, 0, &from), 0);
	assert_int_equal(b.cb_failures, 1);
	assert_int_equal(breaker_step(&b, &conf, BREAKER_FAILURE, 0, &from), 0);
	assert_int_equal(breaker_step(&b, &conf, BREAKER_FAILURE, 50, &from),
	    1);
	assert_int_equal(from, SHM_BREAKER_CLOSED);
	assert_int_equal(b.cb_state, SHM_BREAKER_OPEN);
	assert_int_equal(b.cb_opened_ms, 50);
}

static void
test_open_half_open_closed(void **state)
{
	struct breaker b;
	enum shm_breaker_state from;
	int i;

	(void)state;
	breaker_init(&b);
	for (i = 0; i < 3; i++)
		breaker_step(&b, &conf, BREAKER_FAILURE, 100, &from);
	assert_int_equal(b.cb_state, SHM_BREAKER_OPEN);
	/* Not before the timeout... */
	assert_int_equal(breaker_poll(&b, &conf, 1099, &from), 0);
	assert_int_equal(b.cb_state, SHM_BREAKER_OPEN);
	/* ...then lazily when examined. */
	assert_int_equal(breaker_poll(&b, &conf, 1100, &from), 1);
	assert_int_equal(from, SHM_BREAKER_OPEN);
	assert_int_equal(b.cb_state, SHM_BREAKER_HALF_OPEN);
	assert_int_equal(b.cb_failures, 0);
	assert_int_equal(b.cb_successes, 0);
	assert_int_equal(breaker_step(&b, &conf, BREAKER_SUCCESS, 1200, &from),
	    0);
	assert_int_equal(b.cb_state, SHM_BREAKER_HALF_OPEN);
	assert_int_equal(breaker_step(&b, &conf, BREAKER_SUCCESS, 1300, &from),
	    1);
	assert_int_equal(from, SHM_BREAKER_HALF_OPEN);
	assert_int_equal(b.cb_state, SHM_BREAKER_CLOSED);
	assert_int_equal(b.cb_successes, 0);
	assert_int_equal(b.cb_failures, 0);
	assert_int_equal(breaker_poll(&b, &conf, 99999, &from), 0);
}

static void
test_half_open_failure_reopens(void **state)
{
	struct breaker b;
	enum shm_breaker_state from;
	int i;

	(void)state;
	breaker_init(&b);
	for (i = 0; i < 3; i++)
		breaker_step(&b, &conf, BREAKER_FAILURE, 0, &from);
	breaker_poll(&b, &conf, 1000, &from);
	assert_int_equal(b.cb_state, SHM_BREAKER_HALF_OPEN);
	breaker_step(&b, &conf, BREAKER_SUCCESS, 1001, &from);
	/* One failure in HalfOpen is enough, whatever came before. */
	assert_int_equal(breaker_step(&b, &conf, BREAKER_FAILURE, 1002, &from),
	    1);
	assert_int_equal(from, SHM_BREAKER_HALF_OPEN);
	assert_int_equal(b.cb_state, SHM_BREAKER_OPEN);
	assert_int_equal(b.cb_opened_ms, 1002);
	/* 4xx and 429 in HalfOpen never reopen it. */
	breaker_poll(&b, &conf, 2002, &from);
	assert_int_equal(
	    breaker_step(&b, &conf, breaker_classify(404, false), 2003, &from),
	    0);
	assert_int_equal(
	    breaker_step(&b, &conf, breaker_classify(429, false), 2004, &from),
	    0);
	assert_int_equal(b.cb_state, SHM_BREAKER_HALF_OPEN);
	/* Outcomes arriving while Open change nothing. */
	for (i = 0; i < 3; i++)
		breaker_step(&b, &conf, BREAKER_FAILURE, 3000, &from);
	assert_int_equal(b.cb_state, SHM_BREAKER_OPEN);
	assert_int_equal(breaker_step(&b, &conf, BREAKER_SUCCESS, 3001, &from),
	    0);
	assert_int_equal(b.cb_state, SHM_BREAKER_OPEN);
}

static void
test_disabled_never_opens(void **state)
{
	struct config cf;
	struct breaker_conf bc;
	struct breaker b;
	enum shm_breaker_state from;
	int i;

	(void)state;
	memset(&cf, 0, sizeof(cf));
	cf.cf_cb_failure_threshold = 1;
	cf.cf_cb_success_threshold = 1;
	cf.cf_cb_timeout_duration_secs = 1;
	cf.cf_disable_circuit_breaker = true;
	breaker_conf_init(&bc, &cf);
	breaker_init(&b);
	for (i = 0; i < 10000; i++)
		breaker_step(&b, &bc, BREAKER_FAILURE, 0, &from);
	assert_int_equal(b.cb_state, SHM_BREAKER_CLOSED);
	assert_string_equal(breaker_state_name(SHM_BREAKER_HALF_OPEN),
	    "half_open");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_classify),
		cmocka_unit_test(test_closed_to_open),
		cmocka_unit_test(test_open_half_open_closed),
		cmocka_unit_test(test_half_open_failure_reopens),
		cmocka_unit_test(test_disabled_never_opens),
	};

	log_init("breaker_test", LOG_LEVEL_WARN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
