/*
 * policy_bucket_test.c: the bucket policy's membership per model (prefill
 * or regular workers, registration order, model changes, removal), its
 * selection by request size and the range recomputation from po_sweep.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <xxhash.h>

#include "shared/log.h"

#include "broker/broker.h"
#include "broker/bucket.h"

#define NW 3

static struct worker ws[NW];
static char urls[NW][32];
static char models[NW][16];

static void
workers_init(int type)
{
	int i;

	memset(ws, 0, sizeof(ws));
	for (i = 0; i < NW; i++) {
		snprintf(urls[i], sizeof(urls[i]), "http://w%d:8000", i);
		snprintf(models[i], sizeof(models[i]), "m");
		ws[i].wk_url = urls[i];
		ws[i].wk_url_hash = XXH3_64bits(urls[i], strlen(urls[i]));
		ws[i].wk_slot = (unsigned)i;
		ws[i].wk_order = (uint32_t)i;
		ws[i].wk_model = models[i];
		ws[i].wk_type = type;
	}
}

static int
pick(struct policy *p, struct worker **c, unsigned n, const char *model,
    uint64_t size)
{
	Smg__RouteRequest req = SMG__ROUTE_REQUEST__INIT;
	int i;

	req.model = (char *)model;
	req.size = size;
	i = policy_select(p, c, n, &req);
	assert_true(i >= 0 && (unsigned)i < n);
	return (int)c[i]->wk_slot;
}

static void
test_members_and_ranges(void **state)
{
	struct policy *p = policy_new("bucket", false);
	struct worker *all[NW] = { &ws[0], &ws[1], &ws[2] };
	struct bucket_range r[NW];
	struct bucket *b;

	(void)state;
	workers_init(SMG__WORKER_TYPE__WORKER_TYPE_REGULAR);
	/* Out of registration order: the bucket keeps registration order. */
	p->pl_ops->po_on_add(p, &ws[2]);
	p->pl_ops->po_on_add(p, &ws[0]);
	p->pl_ops->po_on_add(p, &ws[1]);
	assert_non_null(b = policy_bucket_state(p, "m"));
	assert_int_equal(bucket_ranges(b, r, NW), 3);
	assert_string_equal(r[0].br_url, urls[0]);
	assert_int_equal(r[0].br_hi, 1364);
	assert_string_equal(r[2].br_url, urls[2]);
	assert_true(r[2].br_hi == BUCKET_INFINITY);
	/* Balanced (CLI thresholds 64/1.5): the range holding the size. */
	assert_int_equal(pick(p, all, NW, "m", 10), 0);
	assert_int_equal(pick(p, all, NW, "m", 1400), 1);
	/* w0 and w1 carry 1410 chars, w2 none: imbalanced, w2 wins. */
	assert_int_equal(pick(p, all, NW, "m", 10), 2);
	/* A model-less request uses its first candidate's model. */
	assert_non_null(policy_bucket_state(p, "m"));
	/* The worker moves to another model: it leaves m's bucket. */
	models[1][0] = 'x';
	p->pl_ops->po_on_add(p, &ws[1]);
	assert_int_equal(bucket_ranges(policy_bucket_state(p, "m"), r, NW), 2);
	assert_int_equal(bucket_ranges(policy_bucket_state(p, "x"), r, NW), 1);
	p->pl_ops->po_on_remove(p, &ws[2]);
	assert_int_equal(bucket_ranges(policy_bucket_state(p, "m"), r, NW), 1);
	assert_null(policy_bucket_state(p, "nope"));
	policy_free(p);
}

static void
test_tick_rebuilds_ranges(void **state)
{
	struct policy *p = policy_new("bucket", true);
	struct worker *all[2] = { &ws[0], &ws[1] };
	struct bucket_range r[2];
	uint64_t now;
	int i;

	(void)state;
	workers_init(SMG__WORKER_TYPE__WORKER_TYPE_REGULAR);
	p->pl_ops->po_on_add(p, &ws[0]);
	p->pl_ops->po_on_add(p, &ws[1]);
	/* Sizes 100 and 300 alternate: the split at 2048 sends them all to
	 * the first worker, the balance override then moves some. */
	for (i = 0; i < 20; i++)
		(void)pick(p, all, 2, "m", i % 2 ? 300 : 100);
	now = 1000000;
	p->pl_ops->po_sweep(p, now); /* schedules the first tick */
	bucket_ranges(policy_bucket_state(p, "m"), r, 2);
	assert_int_equal(r[0].br_hi, 2047);
	p->pl_ops->po_sweep(p, now + 4999);
	bucket_ranges(policy_bucket_state(p, "m"), r, 2);
	assert_int_equal(r[0].br_hi, 2047);
	p->pl_ops->po_sweep(p, now + 5000);
	bucket_ranges(policy_bucket_state(p, "m"), r, 2);
	/* total 4000, 2000 per worker: the first range ends at 300. */
	assert_int_equal(r[0].br_hi, 300);
	assert_int_equal(r[1].br_lo, 301);
	policy_free(p);
}

static void
test_needs_text(void **state)
{
	(void)state;
	assert_true(policy_implemented("bucket"));
	assert_null(policy_bucket_state(NULL, "m"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_members_and_ranges),
		cmocka_unit_test(test_tick_rebuilds_ranges),
		cmocka_unit_test(test_needs_text),
	};

	log_init("policy_bucket_test", LOG_LEVEL_WARN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
