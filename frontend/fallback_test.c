/* fallback_test.c: the local fallback decision over a hand-built table. */
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

struct fixture {
	char fx_run[64];
	struct shm *fx_shm;
	int fx_row;
};

static int
setup(void **state)
{
	struct fixture *fx = calloc(1, sizeof(*fx));

	assert_non_null(fx);
	snprintf(fx->fx_run, sizeof(fx->fx_run), "/tmp/fallback_test.XXXXXX");
	assert_non_null(mkdtemp(fx->fx_run));
	fx->fx_shm = shm_open_segment(fx->fx_run);
	assert_non_null(fx->fx_shm);
	fx->fx_row = shm_frontend_claim(fx->fx_shm, -1);
	assert_true(fx->fx_row >= 0);
	*state = fx;
	return 0;
}

static int
teardown(void **state)
{
	struct fixture *fx = *state;

	shm_row_release(fx->fx_shm, fx->fx_row);
	shm_close(fx->fx_shm);
	shm_unlink_segment(fx->fx_run);
	rmdir(fx->fx_run);
	free(fx);
	return 0;
}

static void
put(struct fixture *fx, unsigned slot, const char *url, const char *model,
    uint32_t status, uint32_t breaker, uint32_t overloaded, unsigned load)
{
	struct shm_worker w;
	unsigned i;

	memset(&w, 0, sizeof(w));
	w.sw_in_use = 1;
	w.sw_generation = slot + 7;
	w.sw_order = slot;
	w.sw_status = status;
	w.sw_breaker = breaker;
	w.sw_overloaded = overloaded;
	w.sw_bootstrap_port = -1;
	snprintf(w.sw_id, sizeof(w.sw_id), "w%u", slot);
	snprintf(w.sw_url, sizeof(w.sw_url), "%s", url);
	snprintf(w.sw_model, sizeof(w.sw_model), "%s", model);
	snprintf(w.sw_api_key, sizeof(w.sw_api_key), "key%u", slot);
	shm_worker_write(fx->fx_shm, slot, &w);
	for (i = 0; i < load; i++)
		shm_inflight_inc(fx->fx_shm, fx->fx_row, slot);
}

static void
test_least_inflight(void **state)
{
	struct fixture *fx = *state;
	struct decision d;
	struct shm_worker w;

	put(fx, 0, "http://a:1", "m", SHM_WORKER_READY, 0, 0, 3);
	put(fx, 1, "http://b:1", "m", SHM_WORKER_READY, 0, 0, 1);
	put(fx, 2, "http://c:1", "m", SHM_WORKER_READY, 0, 0, 2);
	put(fx, 3, "http://d:1", "other", SHM_WORKER_READY, 0, 0, 0);
	fallback_select(fx->fx_shm, NULL, "m", 0, NULL, 0, &d);
	assert_true(d.dc_ok);
	assert_true(d.dc_fallback);
	assert_int_equal(d.dc_slot, 1);
	assert_int_equal(shm_worker_read(fx->fx_shm, 1, &w), 0);
	assert_int_equal(d.dc_generation, w.sw_generation);
	assert_string_equal(d.dc_url, "http://b:1");
	assert_string_equal(d.dc_model, "m");
	assert_string_equal(d.dc_api_key, "key1");
	/* Model-less takes every worker: d has none in flight. */
	fallback_select(fx->fx_shm, NULL, NULL, 0, NULL, 0, &d);
	assert_true(d.dc_ok);
	assert_int_equal(d.dc_slot, 3);
	fallback_select(fx->fx_shm, NULL, "unknown", 0, NULL, 0, &d);
	assert_int_equal(d.dc_slot, 3);
}

static void
test_availability(void **state)
{
	struct fixture *fx = *state;
	struct decision d;

	put(fx, 0, "http://a:1", "m", SHM_WORKER_NOT_READY, 0, 0, 0);
	put(fx, 1, "http://b:1", "m", SHM_WORKER_READY, SHM_BREAKER_OPEN, 0, 0);
	put(fx, 2, "http://c:1", "m", SHM_WORKER_READY, 0, 1, 0);
	put(fx, 3, "http://d:1", "m", SHM_WORKER_READY, SHM_BREAKER_HALF_OPEN,
	    0, 5);
	fallback_select(fx->fx_shm, NULL, "m", 0, NULL, 0, &d);
	assert_true(d.dc_ok);
	assert_int_equal(d.dc_slot, 3);
	/* Another type is not a candidate. */
	fallback_select(fx->fx_shm, NULL, "m", 2, NULL, 0, &d);
	assert_false(d.dc_ok);
	assert_int_equal(d.dc_status, 404);
}

static void
test_errors(void **state)
{
	struct fixture *fx = *state;
	struct decision d;

	fallback_select(fx->fx_shm, NULL, "m", 0, NULL, 0, &d);
	assert_false(d.dc_ok);
	assert_int_equal(d.dc_status, 404);
	assert_string_equal(d.dc_code, "model_not_found");
	assert_string_equal(d.dc_message, "No worker available for model 'm'");
	put(fx, 0, "http://a:1", "m", SHM_WORKER_PENDING, 0, 0, 0);
	fallback_select(fx->fx_shm, NULL, "m", 0, NULL, 0, &d);
	assert_false(d.dc_ok);
	assert_int_equal(d.dc_status, 503);
	assert_string_equal(d.dc_code, "no_available_workers");
	fallback_select(fx->fx_shm, NULL, "absent", 0, NULL, 0, &d);
	assert_int_equal(d.dc_status, 404);
}

static void
test_exclude(void **state)
{
	struct fixture *fx = *state;
	struct decision d;
	uint32_t ex[2] = { 0, 1 };

	put(fx, 0, "http://a:1", "m", SHM_WORKER_READY, 0, 0, 0);
	put(fx, 1, "http://b:1", "m", SHM_WORKER_READY, 0, 0, 4);
	fallback_select(fx->fx_shm, NULL, "m", 0, ex, 1, &d);
	assert_true(d.dc_ok);
	assert_int_equal(d.dc_slot, 1);
	/* Every candidate excluded: the exclusion is dropped. */
	fallback_select(fx->fx_shm, NULL, "m", 0, ex, 2, &d);
	assert_true(d.dc_ok);
	assert_int_equal(d.dc_slot, 0);
}

static void
test_ties_random(void **state)
{
	struct fixture *fx = *state;
	struct decision d;
	unsigned seen[3] = { 0 }, i;

	put(fx, 0, "http://a:1", "m", SHM_WORKER_READY, 0, 0, 1);
	put(fx, 1, "http://b:1", "m", SHM_WORKER_READY, 0, 0, 1);
	put(fx, 2, "http://c:1", "m", SHM_WORKER_READY, 0, 0, 1);
	for (i = 0; i < 600; i++) {
		fallback_select(fx->fx_shm, NULL, "m", 0, NULL, 0, &d);
		assert_true(d.dc_ok);
		seen[d.dc_slot]++;
	}
	/* Uniform: each near 200; 100 is more than 9 sigma away. */
	for (i = 0; i < 3; i++)
		assert_true(seen[i] > 100);
}

static void
test_alias(void **state)
{
	struct fixture *fx = *state;
	struct config cf;
	struct config_alias al = { "short", "canonical/model" };
	struct decision d;

	memset(&cf, 0, sizeof(cf));
	cf.cf_model_alias = &al;
	cf.cf_model_alias_n = 1;
	put(fx, 0, "http://a:1", "canonical/model", SHM_WORKER_READY, 0, 0, 0);
	fallback_select(fx->fx_shm, &cf, "short", 0, NULL, 0, &d);
	assert_true(d.dc_ok);
	assert_string_equal(d.dc_model, "canonical/model");
	assert_string_equal(fallback_canonical(&cf, "x"), "x");
}

static void
test_first_ready(void **state)
{
	struct fixture *fx = *state;
	struct shm_worker w;
	unsigned slot;

	assert_int_equal(fallback_first_ready(fx->fx_shm, &w, &slot), -1);
	put(fx, 4, "http://late:1", "m", SHM_WORKER_READY, 0, 0, 0);
	put(fx, 2, "http://sick:1", "m", SHM_WORKER_NOT_READY, 0, 0, 0);
	put(fx, 3, "http://ok:1", "m", SHM_WORKER_READY, 0, 0, 0);
	assert_int_equal(fallback_first_ready(fx->fx_shm, &w, &slot), 0);
	assert_int_equal(slot, 3);
	assert_string_equal(w.sw_url, "http://ok:1");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_least_inflight, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_availability, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_exclude, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ties_random, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_alias, setup, teardown),
		cmocka_unit_test_setup_teardown(test_first_ready, setup,
		    teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
