/*
 * decide_test.c: the effective routing key an outcome names
 * (decide_key) and the dispatch-time overload re-check
 * (decide_overloaded) against hand-built shm worker slots.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "frontend/frontend.h"

struct frontend *fe;

static void
test_key(void **state)
{
	struct extract_inputs in;
	char buf[DECIDE_KEY_MAX];

	(void)state;
	memset(&in, 0, sizeof(in));
	assert_string_equal(decide_key(&in, true, buf, sizeof(buf)), "");
	in.ei_routing_key = (char *)"conv12_t3";
	/* Override: lineage-stripped header; without: the raw header. */
	assert_string_equal(decide_key(&in, true, buf, sizeof(buf)), "conv12");
	assert_string_equal(decide_key(&in, false, buf, sizeof(buf)),
	    "conv12_t3");
	/* The rid key wins, with the override only. */
	in.ei_rid_key = (char *)"rid7";
	assert_string_equal(decide_key(&in, true, buf, sizeof(buf)), "rid7");
	assert_string_equal(decide_key(&in, false, buf, sizeof(buf)),
	    "conv12_t3");
	in.ei_rid_key = (char *)"";
	assert_string_equal(decide_key(&in, true, buf, sizeof(buf)), "conv12");
	/* Too long for the buffer: no key rather than a cut one. */
	assert_string_equal(decide_key(&in, false, buf, 4), "");
}

static void
test_overloaded(void **state)
{
	char run[64];
	struct shm *shm;
	struct shm_worker w;
	uint32_t gen;

	(void)state;
	snprintf(run, sizeof(run), "/tmp/decide_test.XXXXXX");
	assert_non_null(mkdtemp(run));
	assert_non_null(shm = shm_open_segment(run));
	memset(&w, 0, sizeof(w));
	w.sw_in_use = 1;
	w.sw_status = SHM_WORKER_READY;
	snprintf(w.sw_url, sizeof(w.sw_url), "http://127.0.0.1:1");
	gen = shm_worker_write(shm, 2, &w);
	assert_false(decide_overloaded(shm, 2, gen));
	w.sw_overloaded = 1;
	assert_int_equal(shm_worker_write(shm, 2, &w), gen);
	assert_true(decide_overloaded(shm, 2, gen));
	/* Another generation is another worker: not shed by this flag. */
	assert_false(decide_overloaded(shm, 2, gen + 1));
	/* A slot out of range or unused is not overloaded. */
	assert_false(decide_overloaded(shm, SHM_MAX_WORKERS + 1, gen));
	assert_false(decide_overloaded(shm, 3, 0));
	shm_close(shm);
	shm_unlink_segment(run);
	rmdir(run);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_key),
		cmocka_unit_test(test_overloaded),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
