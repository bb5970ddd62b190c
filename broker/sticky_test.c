/*
 * sticky_test.c: routing keys on hand-built states — lineage stripping,
 * every branch of manual (policies.md §7) and of the sticky overlay (§8)
 * with the per-key in-flight cap, the assignment modes, idle eviction,
 * the consistent_hashing and prefix_hash branches on the per-model rings,
 * and the LMDB persistence of assignments and tree inserts across a
 * broker restart (persist.c).
 */
#define _XOPEN_SOURCE 700
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "shared/config.h"
#include "shared/shm.h"

#include "broker/broker.h"
#include "broker/broker_testutil.h"

#define MANUAL "smg_manual_policy_branch_total"

static int
route(struct btu_fx *f, const char *key, const char *rid, int leg)
{
	Smg__RouteRequest rq = SMG__ROUTE_REQUEST__INIT;
	Smg__Decision d = SMG__DECISION__INIT;
	char msg[192];
	unsigned i;

	rq.routing_key = (char *)(key != NULL ? key : "");
	rq.rid_key = (char *)(rid != NULL ? rid : "");
	rq.text = (char *)"some text";
	rq.has_text = true;
	rq.leg = (Smg__Leg)leg;
	rq.model = (char *)"";
	route_one(f->fx_br, &rq, &d, msg, sizeof(msg));
	if (d.status != SMG__DECISION_STATUS__DECISION_OK)
		return -1;
	for (i = 0; i < 3; i++)
		if (f->fx_c[i]->wk_slot == d.worker_slot)
			return (int)i;
	return -1;
}

static void
finish(struct btu_fx *f, unsigned i, const char *key)
{
	Smg__Outcome o = SMG__OUTCOME__INIT;

	o.worker_slot = f->fx_c[i]->wk_slot;
	o.worker_generation = f->fx_c[i]->wk_generation;
	o.http_status = 200;
	o.sticky_key = (char *)(key != NULL ? key : "");
	route_outcome(f->fx_br, &o);
}

static void
test_strip(void **state)
{
	char b[64];

	(void)state;
	assert_string_equal(sticky_strip("conv123_t2_r1", b, sizeof(b)),
	    "conv123");
	assert_string_equal(sticky_strip("conv123_r1", b, sizeof(b)),
	    "conv123");
	assert_string_equal(sticky_strip("conv123_t7", b, sizeof(b)),
	    "conv123");
	assert_string_equal(sticky_strip("conv_tx", b, sizeof(b)), "conv_tx");
	assert_string_equal(sticky_strip("_t1", b, sizeof(b)), "_t1");
	assert_string_equal(sticky_strip("a_r", b, sizeof(b)), "a_r");
	assert_string_equal(sticky_strip("a_t1_t2", b, sizeof(b)), "a_t1");
	assert_string_equal(sticky_strip("plain", b, sizeof(b)), "plain");
}

static void
test_manual_branches(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("sticky", "manual");
	int a, i;

	(void)state;
	f->fx_cf.cf_assignment_mode = ASSIGNMENT_MODE_MIN_LOAD;
	f->fx_cf.cf_assignment_mode_set = true;
	btu_fx_start_order(f);
	btu_load(f, 0, 2);
	btu_load(f, 2, 1);
	/* No key: picked by mode, nothing stored. */
	assert_int_equal(route(f, NULL, NULL, 0), 1);
	assert_int_equal(btu_branch(f, MANUAL, "no_routing_id"), 1);
	/* New key: min_load picks 1 and pins it. */
	a = route(f, "alice", NULL, 0);
	assert_int_equal(a, 1);
	assert_int_equal(btu_branch(f, MANUAL, "vacant"), 1);
	/* The pin holds whatever the loads. */
	btu_load(f, 1, 10);
	for (i = 0; i < 3; i++)
		assert_int_equal(route(f, "alice", NULL, 0), 1);
	assert_int_equal(btu_branch(f, MANUAL, "occupied_hit"), 3);
	/* Pinned worker unavailable: reassigned, appended. */
	f->fx_c[1]->wk_status = SHM_WORKER_NOT_READY;
	assert_int_equal(route(f, "alice", NULL, 0), 2);
	assert_int_equal(btu_branch(f, MANUAL, "occupied_miss"), 1);
	/* It recovers: first in the list again. */
	f->fx_c[1]->wk_status = SHM_WORKER_READY;
	assert_int_equal(route(f, "alice", NULL, 0), 1);
	/* The map holds the bare key (single leg). */
	assert_non_null(
	    sticky_map_get(policy_manual_map(f->fx_br->br_default), "alice"));
	btu_fx_free(f);
}

static void
test_manual_min_group_and_eviction(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("sticky", "manual");
	struct sticky_pin *pin;

	(void)state;
	f->fx_cf.cf_assignment_mode = ASSIGNMENT_MODE_MIN_GROUP;
	f->fx_cf.cf_assignment_mode_set = true;
	f->fx_cf.cf_max_idle_secs = 10;
	btu_fx_start_order(f);
	/* Two keys in flight on 0, one on 1: a new key goes to 2. */
	sticky_dispatched(f->fx_br, "x", f->fx_c[0]);
	sticky_dispatched(f->fx_br, "y", f->fx_c[0]);
	sticky_dispatched(f->fx_br, "z", f->fx_c[1]);
	btu_load(f, 0, 2);
	btu_load(f, 1, 1);
	assert_int_equal(sticky_keys_on(f->fx_br, f->fx_c[0]), 2);
	assert_int_equal(route(f, "newkey", NULL, 0), 2);
	/* Idle eviction: an entry older than max_idle goes away. */
	pin = sticky_map_get(policy_manual_map(f->fx_br->br_default), "newkey");
	assert_non_null(pin);
	pin->sp_last_ms -= 11000;
	policy_sweep_all(f->fx_br, shm_now_ms() + 1000000);
	assert_null(
	    sticky_map_get(policy_manual_map(f->fx_br->br_default), "newkey"));
	btu_fx_free(f);
}

static void
test_sticky_overlay(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("sticky", "round_robin");
	int p, q;

	(void)state;
	f->fx_cf.cf_routing_key_override = true;
	btu_fx_start_order(f);
	/* vacant: delegated to round_robin, pinned. */
	p = route(f, "sess_t1", NULL, 0);
	assert_true(p >= 0);
	assert_int_equal(btu_branch(f, MANUAL, "vacant"), 1);
	/* Lineage-stripped header key: the same pin; in flight now 2. */
	assert_int_equal(route(f, "sess_t2", NULL, 0), p);
	assert_int_equal(btu_branch(f, MANUAL, "occupied_hit"), 1);
	btu_load(f, (unsigned)p, 2);
	/* Two in flight for the key: cap_respill moves the pin. */
	q = route(f, "sess", NULL, 0);
	assert_true(q >= 0 && q != p);
	assert_int_equal(btu_branch(f, MANUAL, "cap_respill"), 1);
	/* The outcomes end them (named keys: exact accounting). */
	finish(f, (unsigned)p, "sess");
	finish(f, (unsigned)p, "sess");
	assert_int_equal(sticky_inflight_get(f->fx_br, "sess", f->fx_c[p]), 0);
	assert_int_equal(route(f, "sess", NULL, 0), q);
	/* Both pinned workers unavailable: occupied_miss to the third. */
	f->fx_c[q]->wk_status = SHM_WORKER_NOT_READY;
	f->fx_c[p]->wk_status = SHM_WORKER_NOT_READY;
	assert_int_equal(route(f, "sess", NULL, 0), 3 - p - q);
	assert_int_equal(btu_branch(f, MANUAL, "occupied_miss"), 1);
	f->fx_c[q]->wk_status = SHM_WORKER_READY;
	f->fx_c[p]->wk_status = SHM_WORKER_READY;
	/* rid wins over the header; PD legs are namespaced. */
	p = route(f, "other", "conv9", 0);
	assert_non_null(sticky_map_get(sticky_global_map(f->fx_br), "conv9"));
	(void)route(f, "other", "conv9", SMG__LEG__LEG_PREFILL);
	assert_null(sticky_map_get(sticky_global_map(f->fx_br), "other"));
	btu_fx_free(f);
}

/* Outcome with its key (and optionally no breaker sample). */
static void
finish_as(struct btu_fx *f, unsigned i, const char *key, uint32_t status,
    bool no_sample)
{
	Smg__Outcome o = SMG__OUTCOME__INIT;

	o.worker_slot = f->fx_c[i]->wk_slot;
	o.worker_generation = f->fx_c[i]->wk_generation;
	o.http_status = status;
	o.sticky_key = (char *)(key != NULL ? key : "");
	o.no_breaker_sample = no_sample;
	route_outcome(f->fx_br, &o);
}

static void
test_inflight_exact(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("sticky", "round_robin");
	int p, q, i;

	(void)state;
	f->fx_cf.cf_routing_key_override = true;
	btu_fx_start_order(f);
	/* Two keyed and one unkeyed request on the pinned worker. */
	p = route(f, "conv_t1", NULL, 0);
	assert_true(p >= 0);
	assert_int_equal(route(f, NULL, NULL, 0) >= 0, 1);
	assert_int_equal(route(f, "conv_t2", NULL, 0), p);
	btu_load(f, (unsigned)p, 3);
	assert_int_equal(sticky_inflight_get(f->fx_br, "conv", f->fx_c[p]), 2);
	/* An unkeyed outcome ends nothing of the key. */
	finish_as(f, (unsigned)p, NULL, 200, false);
	assert_int_equal(sticky_inflight_get(f->fx_br, "conv", f->fx_c[p]), 2);
	/* The cap: the third goes elsewhere. */
	q = route(f, "conv", NULL, 0);
	assert_true(q >= 0 && q != p);
	assert_int_equal(btu_branch(f, MANUAL, "cap_respill"), 1);
	/* The client of one went away: no breaker sample, key ends. */
	for (i = 0; i < 6; i++)
		finish_as(f, (unsigned)q, "conv", 500, true);
	assert_int_equal(f->fx_c[q]->wk_cb.cb_state, SHM_BREAKER_CLOSED);
	assert_int_equal(sticky_inflight_get(f->fx_br, "conv", f->fx_c[q]), 0);
	finish_as(f, (unsigned)p, "conv", 0, true);
	assert_int_equal(sticky_inflight_get(f->fx_br, "conv", f->fx_c[p]), 1);
	finish_as(f, (unsigned)p, "conv", 200, false);
	assert_int_equal(sticky_inflight_get(f->fx_br, "conv", f->fx_c[p]), 0);
	assert_int_equal(sticky_keys_on(f->fx_br, f->fx_c[p]), 0);
	/* Outcomes with samples still feed the breaker. */
	for (i = 0; i < 5; i++)
		finish_as(f, (unsigned)p, "", 500, false);
	assert_int_equal(f->fx_c[p]->wk_cb.cb_state, SHM_BREAKER_OPEN);
	btu_fx_free(f);
}

static void
test_consistent_hashing(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("sticky", "consistent_hashing");
	Smg__RouteRequest rq = SMG__ROUTE_REQUEST__INIT;
	const char *fam = "smg_consistent_hashing_policy_branch_total";
	int a;

	(void)state;
	btu_fx_start_order(f);
	rq.routing_key = (char *)"user-1";
	a = policy_select(f->fx_br->br_default, f->fx_c, 3, &rq);
	assert_true(a >= 0);
	assert_int_equal(policy_select(f->fx_br->br_default, f->fx_c, 3, &rq),
	    a);
	assert_int_equal(btu_branch(f, fam, "routing_key_hit"), 2);
	/* The owner leaves the candidates: the next one on the ring. */
	{
		struct worker *c2[2];
		unsigned i, k = 0;

		for (i = 0; i < 3; i++)
			if ((int)i != a)
				c2[k++] = f->fx_c[i];
		assert_true(
		    policy_select(f->fx_br->br_default, c2, 2, &rq) >= 0);
	}
	rq.routing_key = (char *)"";
	rq.target_worker = (char *)"2";
	rq.has_target_worker = true;
	assert_int_equal(policy_select(f->fx_br->br_default, f->fx_c, 3, &rq),
	    2);
	assert_int_equal(btu_branch(f, fam, "target_worker_hit"), 1);
	rq.target_worker = (char *)"3";
	assert_int_equal(policy_select(f->fx_br->br_default, f->fx_c, 3, &rq),
	    -1);
	assert_int_equal(btu_branch(f, fam, "target_worker_miss"), 1);
	rq.has_target_worker = false;
	assert_true(policy_select(f->fx_br->br_default, f->fx_c, 3, &rq) >= 0);
	assert_int_equal(btu_branch(f, fam, "random_fallback"), 1);
	rq.implicit_key = (char *)"Bearer abc";
	rq.has_implicit_key = true;
	a = policy_select(f->fx_br->br_default, f->fx_c, 3, &rq);
	assert_int_equal(policy_select(f->fx_br->br_default, f->fx_c, 3, &rq),
	    a);
	assert_int_equal(btu_branch(f, fam, "routing_key_hit"), 5);
	btu_fx_free(f);
}

static void
test_prefix_hash(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("sticky", "prefix_hash");
	Smg__RouteRequest rq = SMG__ROUTE_REQUEST__INIT;
	const char *fam = "smg_prefix_hash_policy_branch_total";
	int a;

	(void)state;
	btu_fx_start_order(f);
	/* No key at all: least loaded, ties first. */
	btu_load(f, 0, 1);
	assert_int_equal(policy_select(f->fx_br->br_default, f->fx_c, 3, &rq),
	    1);
	assert_int_equal(btu_branch(f, fam, "no_routing_key"), 1);
	rq.text = (char *)"a shared prefix for prefix hashing";
	rq.has_text = true;
	a = policy_select(f->fx_br->br_default, f->fx_c, 3, &rq);
	assert_int_equal(policy_select(f->fx_br->br_default, f->fx_c, 3, &rq),
	    a);
	assert_int_equal(btu_branch(f, fam, "ring_hit"), 2);
	/* The target overloaded (L = 31+, 3 workers, abs 10): the walk. */
	btu_load(f, (unsigned)a, 30);
	assert_int_not_equal(
	    policy_select(f->fx_br->br_default, f->fx_c, 3, &rq), a);
	assert_int_equal(btu_branch(f, fam, "load_balance_walk"), 1);
	btu_fx_free(f);
}

static void
test_persist_across_restart(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("sticky", "cache_aware");
	const char *text = "a conversation whose prefix must survive a crash "
	                   "of the broker process";
	char q[160];
	int holder, pin;

	(void)state;
	f->fx_cf.cf_routing_key_override = true;
	btu_fx_start_order(f);
	btu_load(f, 1, 1);
	btu_load(f, 2, 1);
	holder = route(f, NULL, NULL, 0);
	assert_true(holder >= 0);
	{
		Smg__RouteRequest rq = SMG__ROUTE_REQUEST__INIT;

		rq.text = (char *)text;
		rq.has_text = true;
		assert_int_equal(
		    policy_select(f->fx_br->br_default, f->fx_c, 3, &rq), 0);
	}
	pin = route(f, "stay-here", NULL, 0);
	assert_true(store_flush(f->fx_br->br_store) == 0);
	assert_true(persist_journal_records(f->fx_br) >= 1);
	/* A new broker on the same state: as if the old one was killed. */
	server_free(f->fx_br);
	shm_unlink_segment(f->fx_run);
	btu_fx_start_order(f);
	btu_load(f, 0, 1);
	btu_load(f, 1, 2);
	btu_load(f, 2, 2);
	snprintf(q, sizeof(q), "%s, next turn", text);
	{
		Smg__RouteRequest rq = SMG__ROUTE_REQUEST__INIT;

		rq.text = q;
		rq.has_text = true;
		assert_int_equal(
		    policy_select(f->fx_br->br_default, f->fx_c, 3, &rq), 0);
	}
	assert_int_equal(route(f, "stay-here", NULL, 0), pin);
	assert_int_equal(btu_branch(f, MANUAL, "occupied_hit"), 1);
	btu_fx_free(f);
}

static int
pick_long(struct btu_fx *f, const char *text)
{
	Smg__RouteRequest rq = SMG__ROUTE_REQUEST__INIT;

	rq.text = (char *)text;
	rq.has_text = true;
	return policy_select(f->fx_br->br_default, f->fx_c, 3, &rq);
}

/* Keys longer than a chunk, sharing chunks, survive a restart. */
static void
test_journal_chunks(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("sticky", "cache_aware");
	char *a = malloc(20001), *b = malloc(20001);
	size_t i;

	(void)state;
	f->fx_cf.cf_max_tree_size = 1000000;
	for (i = 0; i < 20000; i++)
		a[i] = b[i] = (char)('a' + (i * 7 + i / 3) % 26);
	a[20000] = b[20000] = '\0';
	memset(b + 9000, 'Q', 11000); /* shares two whole chunks with a */
	btu_fx_start_order(f);
	btu_load(f, 1, 1);
	btu_load(f, 2, 1);
	assert_int_equal(pick_long(f, a), 0);
	shm_inflight_reset_slot(f->fx_br->br_shm, f->fx_c[1]->wk_slot);
	btu_load(f, 0, 1);
	assert_int_equal(pick_long(f, b), 1); /* 9000/20000 < 0.5 */
	assert_int_equal(store_flush(f->fx_br->br_store), 0);
	server_free(f->fx_br);
	shm_unlink_segment(f->fx_run);
	btu_fx_start_order(f);
	btu_load(f, 0, 1);
	btu_load(f, 1, 1);
	a[19999] = 'z';
	b[19999] = 'z';
	assert_int_equal(pick_long(f, a), 0);
	assert_int_equal(pick_long(f, b), 1);
	free(a);
	free(b);
	btu_fx_free(f);
}

static void
test_write_behind_bound(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("sticky", "round_robin");
	struct store *st;
	uint64_t t0, txns;

	(void)state;
	btu_fx_start_order(f);
	st = f->fx_br->br_store;
	txns = store_txn_count(st);
	t0 = shm_now_ms();
	persist_assign_del(f->fx_br, "sticky", "k");
	/* Routing state waits for the batch window ... */
	assert_false(store_flush_due(st, t0));
	assert_true(store_flush_due(st, t0 + STORE_BEHIND_MS + 5));
	assert_int_equal(store_flush(st), 0);
	assert_int_equal(store_txn_count(st), txns + 1);
	assert_false(store_flush_due(st, t0 + 1000));
	/* ... a worker record does not. */
	store_put(st, "http://z:9", "{}");
	assert_true(store_flush_due(st, t0));
	btu_fx_free(f);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_strip),
		cmocka_unit_test(test_manual_branches),
		cmocka_unit_test(test_manual_min_group_and_eviction),
		cmocka_unit_test(test_sticky_overlay),
		cmocka_unit_test(test_inflight_exact),
		cmocka_unit_test(test_consistent_hashing),
		cmocka_unit_test(test_prefix_hash),
		cmocka_unit_test(test_persist_across_restart),
		cmocka_unit_test(test_write_behind_bound),
		cmocka_unit_test(test_journal_chunks),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
