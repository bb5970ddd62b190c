/*
 * policy_cache_aware_test.c: every branch of cache_aware (policies.md
 * §11) on hand-built states: a broker with three Ready workers, in-flight
 * counts set in shm, load reports set on the workers, and selections
 * made straight through the policy.
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
#if defined(__SANITIZE_ADDRESS__)
/* The sanitizer runtime's allocator statistics (no header in Debian). */
size_t __sanitizer_get_current_allocated_bytes(void);
#else
#include <malloc.h>
#endif

#include "shared/metrics.h"
#include "shared/shm.h"

#include "broker/broker.h"
#include "broker/broker_testutil.h"
#include "broker/kvindex.h"

static void
report(struct btu_fx *f, unsigned i, double usage, int64_t waiting_tokens)
{
	struct worker *w = f->fx_c[i];

	w->wk_load.wl_valid = true;
	w->wk_load.wl_nranks = 1;
	w->wk_load.wl_token_usage = usage;
	w->wk_load.wl_waiting_uncached_tokens = waiting_tokens;
	w->wk_load.wl_gen_throughput = 1000;
	w->wk_load.wl_received_ms = shm_now_ms();
	policy_notify_report(f->fx_br, w);
}

/* A report with no queue but an explicit generation throughput. */
static void
report_tp(struct btu_fx *f, unsigned i, int64_t waiting_tokens, double tp)
{
	report(f, i, 0.0, waiting_tokens);
	f->fx_c[i]->wk_load.wl_gen_throughput = tp;
	policy_notify_report(f->fx_br, f->fx_c[i]);
}

static int
pick_text(struct btu_fx *f, const char *text)
{
	Smg__RouteRequest rq = SMG__ROUTE_REQUEST__INIT;

	rq.text = (char *)text;
	rq.has_text = true;
	return policy_select(f->fx_br->br_default, f->fx_c, 3, &rq);
}

static int
pick_tokens(struct btu_fx *f, const uint32_t *tok, size_t n)
{
	Smg__RouteRequest rq = SMG__ROUTE_REQUEST__INIT;

	rq.tokens = (uint32_t *)tok;
	rq.n_tokens = n;
	rq.has_tokens = true;
	return policy_select(f->fx_br->br_default, f->fx_c, 3, &rq);
}

#define CA "smg_cache_aware_policy_branch_total"

static const char *long_a = "the first conversation with a long shared "
                            "system prompt that many requests repeat";
static const char *long_b = "a second, unrelated conversation that shares "
                            "nothing with the first one at all";

static void
test_tree_match_and_fallback(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("ca", "cache_aware");
	char q[256];
	int first, i;

	(void)state;
	btu_fx_start_order(f);
	/* Nothing matches: the fallback pick (dark fleet: fewest in
	 * flight), then the text is inserted for the winner. */
	btu_load(f, 0, 1);
	btu_load(f, 2, 1);
	first = pick_text(f, long_a);
	assert_int_equal(first, 1);
	assert_int_equal(btu_branch(f, CA, "min_load_fallback"), 1);
	/* Same prefix, longer text: the holder, despite load elsewhere. */
	for (i = 0; i < 5; i++) {
		snprintf(q, sizeof(q), "%s, turn %d", long_a, i);
		assert_int_equal(pick_text(f, q), 1);
	}
	assert_int_equal(btu_branch(f, CA, "tree_match"), 5);
	/* Below the threshold (short shared part): fallback again. */
	btu_load(f, 1, 3);
	assert_int_not_equal(pick_text(f,
	                         "the first zzzzzzzzzzzzzzzzzzzzzzzzz"
	                         "zzzzzzzzzzzzzzzzzzzzzz"),
	    1);
	assert_int_equal(btu_branch(f, CA, "tree_match"), 5);
	assert_int_equal(btu_branch(f, CA, "min_load_fallback"), 2);
	btu_fx_free(f);
}

static void
test_spill_needs_both_gates(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("ca", "cache_aware");

	(void)state;
	btu_fx_start_order(f);
	btu_load(f, 1, 1);
	btu_load(f, 2, 1);
	assert_int_equal(pick_text(f, long_a), 0);
	/* Holder 0 at 5, others 1: avg 7/3, rel gate 3.5, abs gate 4.33:
	 * both exceeded -> spill to the least loaded. */
	btu_load(f, 0, 5);
	assert_int_not_equal(pick_text(f, long_a), 0);
	assert_int_equal(btu_branch(f, CA, "spill"), 1);
	btu_fx_free(f);

	/* Holder at 3 with others at 2, abs 0: avg 7/3; over the absolute
	 * gate (3 > 2.33) but not the relative one (3 > 3.5): stays. */
	f = btu_fx_flags_new("ca", "cache_aware");
	f->fx_cf.cf_balance_abs_threshold = 0;
	btu_fx_start_order(f);
	btu_load(f, 1, 1);
	btu_load(f, 2, 1);
	assert_int_equal(pick_text(f, long_a), 0);
	btu_load(f, 0, 3);
	btu_load(f, 1, 1);
	btu_load(f, 2, 1);
	assert_int_equal(pick_text(f, long_a), 0);
	assert_int_equal(btu_branch(f, CA, "tree_match"), 1);
	assert_int_equal(btu_branch(f, CA, "spill"), 0);
	btu_fx_free(f);
}

static void
test_first_healthy_and_no_tree(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("ca", "cache_aware");
	Smg__RouteRequest rq = SMG__ROUTE_REQUEST__INIT;
	int idx;

	(void)state;
	btu_fx_start_order(f);
	btu_load(f, 1, 1);
	btu_load(f, 2, 1);
	assert_int_equal(pick_text(f, long_a), 0);
	/* The holder is not a candidate: first candidate, no insert. */
	rq.text = (char *)long_a;
	rq.has_text = true;
	idx = policy_select(f->fx_br->br_default, f->fx_c + 1, 2, &rq);
	assert_int_equal(idx, 0);
	assert_int_equal(btu_branch(f, CA, "first_healthy_fallback"), 1);
	/* A model no worker was ever registered under: random, counted. */
	free(f->fx_c[0]->wk_model);
	f->fx_c[0]->wk_model = strdup("never-seen");
	idx = pick_text(f, long_b);
	assert_true(idx >= 0 && idx < 3);
	assert_int_equal(btu_branch(f, CA, "no_tree_random"), 1);
	free(f->fx_c[0]->wk_model);
	f->fx_c[0]->wk_model = strdup(BROKER_MODEL_UNKNOWN);
	assert_int_equal(policy_select(f->fx_br->br_default, f->fx_c, 0, &rq),
	    -1);
	btu_fx_free(f);
}

static void
test_kv_pressure(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("ca", "cache_aware");

	(void)state;
	f->fx_cf.cf_overload_token_usage_threshold = 0.9;
	btu_fx_start_order(f);
	btu_load(f, 1, 1);
	btu_load(f, 2, 1);
	assert_int_equal(pick_text(f, long_a), 0);
	report(f, 0, 0.95, 50000);
	report(f, 1, 0.10, 0);
	report(f, 2, 0.20, 4000);
	/* kmax 0.95 > 0.9: the scorer picks, the holder is ignored. */
	assert_int_equal(pick_text(f, long_a), 1);
	assert_int_equal(btu_branch(f, CA, "kv_pressure_min_load"), 1);
	/* Still inserted for the winner: 1 now holds the prefix too. */
	report(f, 0, 0.5, 0);
	btu_load(f, 0, 2);
	assert_int_equal(pick_text(f, long_a), 1);
	assert_int_equal(btu_branch(f, CA, "tree_match"), 1);
	btu_fx_free(f);
}

static void
test_token_tree_pages(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("ca", "cache_aware");
	uint32_t tok[12] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 };
	uint32_t other[12] = { 1, 2, 3, 4, 50, 60, 70, 80, 90, 100, 110, 120 };

	(void)state;
	btu_fx_start_order(f);
	btu_load(f, 0, 1);
	btu_load(f, 1, 1);
	assert_int_equal(pick_tokens(f, tok, 12), 2);
	btu_load(f, 2, 1);
	/* 12 of 12 tokens match on page boundaries. */
	assert_int_equal(pick_tokens(f, tok, 12), 2);
	assert_int_equal(btu_branch(f, CA, "tree_match"), 1);
	/* Only the first page (4 of 12) matches: 0.33 <= 0.5. */
	(void)pick_tokens(f, other, 12);
	assert_int_equal(btu_branch(f, CA, "min_load_fallback"), 2);
	btu_fx_free(f);
}

static void
test_eviction_sweep_and_gauges(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("ca", "cache_aware");
	char *out = NULL;
	char q[64];
	size_t len;
	int i;

	(void)state;
	f->fx_cf.cf_max_tree_size = 100;
	btu_fx_start_order(f);
	for (i = 0; i < 50; i++) {
		snprintf(q, sizeof(q), "unique prompt number %d padding", i);
		(void)pick_text(f, q);
	}
	policy_sweep_all(f->fx_br, shm_now_ms() + 10000);
	assert_int_equal(metrics_render(f->fx_br->br_shm, &out, &len), 0);
	assert_non_null(strstr(out, "smg_cache_tree_chars{model=\"unknown\"}"));
	assert_non_null(strstr(out,
	    "smg_cache_tree_tenants{model=\"unknown\","
	    "tree=\"string\"} 3"));
	{
		const char *p =
		    strstr(out, "smg_cache_tree_chars{model=\"unknown\"} ");

		assert_true(strtol(p +
		                    strlen("smg_cache_tree_chars{model="
		                           "\"unknown\"} "),
		                NULL, 10) <= 100);
	}
	free(out);
	btu_fx_free(f);
}

/* family{labels} value in the metrics text, -1 when the series is absent. */
static long
gauge(struct btu_fx *f, const char *series)
{
	char *out = NULL, pat[256], *p;
	size_t len;
	long v = -1;

	assert_int_equal(metrics_render(f->fx_br->br_shm, &out, &len), 0);
	snprintf(pat, sizeof(pat), "%s ", series);
	if ((p = strstr(out, pat)) != NULL)
		v = strtol(p + strlen(pat), NULL, 10);
	free(out);
	return v;
}

/*
 * smg_cache_tree_chars follows every insert and the eviction it causes,
 * without waiting for the sweep; once the workers' model is discovered the
 * "unknown" series are gone and the real model's are there.
 */
static void
test_gauges_live_and_model_discovery(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("ca", "cache_aware");
	char *out = NULL;
	size_t len;
	long v;
	unsigned i;

	(void)state;
	f->fx_cf.cf_max_tree_size = 100;
	btu_fx_start_order(f);
	(void)pick_text(f, long_a);
	assert_int_equal(gauge(f, "smg_cache_tree_chars{model=\"unknown\"}"),
	    (long)strlen(long_a));
	(void)pick_text(f, long_b);
	v = gauge(f, "smg_cache_tree_chars{model=\"unknown\"}");
	assert_true(v > 0 && v <= 100);
	assert_int_not_equal(v, (long)strlen(long_a));

	for (i = 0; i < 3; i++)
		registry_set_model(f->fx_br, f->fx_c[i], "m1");
	assert_int_equal(metrics_render(f->fx_br->br_shm, &out, &len), 0);
	assert_null(strstr(out, "smg_cache_tree_chars{model=\"unknown\"}"));
	assert_null(strstr(out, "smg_cache_tree_tokens{model=\"unknown\"}"));
	assert_null(strstr(out, "smg_cache_tree_tenants{model=\"unknown\""));
	free(out);
	assert_int_equal(gauge(f,
	                     "smg_cache_tree_tenants{model=\"m1\","
	                     "tree=\"string\"}"),
	    3);
	assert_int_equal(gauge(f, "smg_cache_tree_chars{model=\"m1\"}"), 0);
	(void)pick_text(f, long_b);
	assert_int_equal(gauge(f, "smg_cache_tree_chars{model=\"m1\"}"),
	    (long)strlen(long_b));
	btu_fx_free(f);
}

/* Heap bytes in use, from the allocator in force. */
static size_t
heap_in_use(void)
{
#if defined(__SANITIZE_ADDRESS__)
	return __sanitizer_get_current_allocated_bytes();
#else
	return mallinfo2().uordblks;
#endif
}

/*
 * Soak: 14,000 prompts of 64 KB (four 8 KB system prompts, the rest
 * unique) into a 64 Mi-char tree with the journal attached. The tree's
 * gauge never exceeds the budget after any insert, and the broker's heap
 * (tree, journal index, store queue) stays within the budget plus a
 * quarter: the bound holds at insert, not at the next sweep.
 */
static void
test_soak_heap_bounded(void **state)
{
	const uint64_t cap = 64ULL * 1024 * 1024;
	const size_t len = 64 * 1024, sys = 8 * 1024;
	struct btu_fx *f = btu_fx_flags_new("ca", "cache_aware");
	uint64_t seed = 0x2545f4914f6cdd1dULL;
	size_t base, peak = 0, now, i, j;
	char *buf, sysp[4][8 * 1024];
	long chars;

	(void)state;
	f->fx_cf.cf_max_tree_size = cap;
	f->fx_cf.cf_eviction_interval = 3600;
	btu_fx_start_order(f);
	for (i = 0; i < 4; i++)
		for (j = 0; j < sys; j++) {
			seed ^= seed << 13, seed ^= seed >> 7,
			    seed ^= seed << 17;
			sysp[i][j] = (char)('a' + seed % 26);
		}
	assert_non_null(buf = malloc(len + 1));
	buf[len] = '\0';
	base = heap_in_use();
	for (i = 0; i < 14000; i++) {
		memcpy(buf, sysp[i % 4], sys);
		for (j = sys; j < len; j += 8) {
			seed ^= seed << 13, seed ^= seed >> 7,
			    seed ^= seed << 17;
			memset(buf + j, 'a' + (int)(seed % 26), 8);
			buf[j] = (char)('a' + (seed >> 8) % 26);
			buf[j + 3] = (char)('a' + (seed >> 16) % 26);
		}
		(void)pick_text(f, buf);
		if (store_flush_due(f->fx_br->br_store, shm_now_ms()))
			(void)store_flush(f->fx_br->br_store);
		if (i % 500 == 0) {
			chars =
			    gauge(f, "smg_cache_tree_chars{model=\"unknown\"}");
			assert_true(chars > 0 && (uint64_t)chars <= cap);
		}
		now = heap_in_use();
		if (now > peak)
			peak = now;
	}
	(void)store_flush(f->fx_br->br_store);
	chars = gauge(f, "smg_cache_tree_chars{model=\"unknown\"}");
	print_message("soak: tree %ld chars, heap peak %zu MB over %zu MB "
	              "before\n",
	    chars, (peak - base) >> 20, base >> 20);
	assert_true((uint64_t)chars <= cap && (uint64_t)chars > cap / 2);
	assert_true(peak - base < cap + cap / 4);
	free(buf);
	btu_fx_free(f);
}

static void
test_hash_mode(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("ca", "cache_aware");
	uint32_t tok[10] = { 9, 8, 7, 6, 5, 4, 3, 2, 1, 0 };
	uint32_t shallow[10] = { 9, 8, 7, 6, 55, 44, 33, 22, 11, 0 };
	int first;

	(void)state;
	f->fx_cf.cf_cache_index = CACHE_INDEX_HASH;
	f->fx_cf.cf_cache_boundaries = f->fx_bounds;
	f->fx_cf.cf_cache_boundaries_n = 2;
	btu_fx_start_order(f);
	/* Shorter than min(B) = 4: fallback, nothing recorded. */
	btu_load(f, 0, 1);
	btu_load(f, 2, 1);
	assert_int_equal(pick_tokens(f, tok, 3), 1);
	first = pick_tokens(f, tok, 10);
	assert_int_equal(first, 1); /* nothing recorded before */
	btu_load(f, 1, 1);
	/* Deepest boundary 8 hits holder 1 (load 1 is not over the gate). */
	assert_int_equal(pick_tokens(f, tok, 10), 1);
	/* Boundary 4 only is shared: still the holder of that key. */
	assert_int_equal(pick_tokens(f, shallow, 10), 1);
	/* Overloaded holder: hash_spill to the least loaded. */
	btu_load(f, 1, 6);
	btu_load(f, 0, 1);
	assert_int_equal(pick_tokens(f, tok, 10), 2);
	/* Tree-mode counter untouched by hash-mode decisions. */
	assert_int_equal(btu_branch(f, CA, "tree_match"), 0);
	btu_fx_free(f);
}

static void
test_decay_prefers_shorter_backlog(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("ca", "cache_aware");
	int i;

	(void)state;
	f->fx_cf.cf_overlap_decay = 1.0;
	btu_fx_start_order(f);
	/* Make 0 and 1 both holders: 0 first, 1 by a spill. */
	btu_load(f, 1, 1);
	btu_load(f, 2, 2);
	assert_int_equal(pick_text(f, long_a), 0);
	btu_load(f, 0, 20);
	assert_int_equal(pick_text(f, long_a), 1);
	shm_inflight_reset_slot(f->fx_br->br_shm, f->fx_c[0]->wk_slot);
	btu_load(f, 0, 1);
	/* Equal in-flight; 0 has a big uncached backlog: decay picks 1. */
	btu_load(f, 1, 1);
	report(f, 0, 0.1, 100000);
	report(f, 1, 0.1, 0);
	for (i = 0; i < 10; i++)
		assert_int_equal(pick_text(f, long_a), 1);
	btu_fx_free(f);
}

/* Worker i's engine stored nblocks blocks of 16 tokens of tok. */
static void
stored(struct btu_fx *f, unsigned i, const uint32_t *tok, size_t nblocks)
{
	static uint64_t seq;
	struct worker *w = f->fx_c[i];
	Smg__KvEventBatch b = SMG__KV_EVENT_BATCH__INIT;
	Smg__KvEvent e = SMG__KV_EVENT__INIT, *ep = &e;
	Smg__KvBlocksStored st = SMG__KV_BLOCKS_STORED__INIT;
	int64_t hashes[16];
	size_t j;

	for (j = 0; j < nblocks; j++)
		hashes[j] = (int64_t)(1000 * (i + 1) + j);
	st.block_hashes = hashes;
	st.n_block_hashes = nblocks;
	st.token_ids = (uint32_t *)tok;
	st.n_token_ids = nblocks * 16;
	st.block_size = 16;
	e.data_case = SMG__KV_EVENT__DATA_STORED;
	e.stored = &st;
	b.worker_slot = w->wk_slot;
	b.worker_generation = w->wk_generation;
	b.worker_url = w->wk_url;
	b.sequence = ++seq;
	b.events = &ep;
	b.n_events = 1;
	kvindex_handle(f->fx_br, &b);
}

/*
 * §11.6 in event mode: worker 0 holds 14 blocks of the request, worker
 * 1 the first 13. Plain event mode takes 0; decay with 0's backlog takes
 * 1; a tiny temperature keeps 0, a large one spreads.
 */
static void
test_event_mode_decay_and_temperature(void **state)
{
	uint32_t tok[14 * 16 + 5];
	struct btu_fx *f;
	int i, seen[3], mode;

	(void)state;
	for (i = 0; i < 14 * 16 + 5; i++)
		tok[i] = 100 + (uint32_t)i;
	for (mode = 0; mode < 4; mode++) {
		f = btu_fx_flags_new("ca", "cache_aware");
		if (mode == 1)
			f->fx_cf.cf_overlap_decay = 1.0;
		if (mode == 2)
			f->fx_cf.cf_selection_temperature = 0.01;
		if (mode == 3)
			f->fx_cf.cf_selection_temperature = 100;
		btu_fx_start_order(f);
		stored(f, 0, tok, 14);
		stored(f, 1, tok, 13);
		/* A backlog too small to spill over, enough for decay. */
		report(f, 0, 0.1, 64);
		report(f, 1, 0.1, 0);
		report(f, 2, 0.1, 0);
		memset(seen, 0, sizeof(seen));
		for (i = 0; i < 200; i++)
			seen[pick_tokens(f, tok,
			    sizeof(tok) / sizeof(tok[0]))]++;
		assert_int_equal(seen[2], 0); /* no overlap, never a holder */
		if (mode == 0 || mode == 2)
			assert_int_equal(seen[0], 200);
		else if (mode == 1)
			assert_int_equal(seen[1], 200);
		else
			assert_true(seen[0] > 20 && seen[1] > 20);
		assert_int_equal(btu_branch(f, CA, "event_match"), 200);
		btu_fx_free(f);
	}
}

/* A fresh conversation: 64 hex digits that share nothing to speak of. */
static void
fresh_text(char *buf, size_t len, unsigned seed)
{
	uint64_t x = 0x9e3779b97f4a7c15ULL * (seed + 1);
	size_t i;

	for (i = 0; i + 1 < len && i < 64; i++) {
		x ^= x >> 12;
		x ^= x << 25;
		x ^= x >> 27;
		buf[i] = "0123456789abcdef"[(x * 0x2545f4914f6cdd1dULL) >> 60];
	}
	buf[i] = '\0';
}

static void
test_new_conversations_spread(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("ca", "cache_aware");
	unsigned got[3] = { 0, 0, 0 }, i;
	char q[80];
	int idx;

	(void)state;
	btu_fx_start_order(f);
	/* Dark fleet, equal in-flight: uniform among the three. */
	for (i = 0; i < 600; i++) {
		fresh_text(q, sizeof(q), i);
		idx = pick_text(f, q);
		assert_true(idx >= 0 && idx < 3);
		got[idx]++;
	}
	for (i = 0; i < 3; i++)
		assert_in_range(got[i], 150, 250);
	assert_int_equal(btu_branch(f, CA, "min_load_fallback"), 600);
	/* Equal reports: the prompt tokens each dispatch leaves pending
	 * (as the frontends count them) spread them evenly between two
	 * polls, one each in turn. */
	for (i = 0; i < 3; i++)
		report(f, i, 0.0, 0);
	got[0] = got[1] = got[2] = 0;
	for (i = 0; i < 300; i++) {
		fresh_text(q, sizeof(q), 1000 + i);
		idx = pick_text(f, q);
		got[idx]++;
		shm_pending_add(f->fx_br->br_shm, 0, f->fx_c[idx]->wk_slot, 16);
	}
	for (i = 0; i < 3; i++)
		assert_int_equal(got[i], 100);
	btu_fx_free(f);
}

static void
test_holder_ties_uniform(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("ca", "cache_aware");
	unsigned got[3] = { 0, 0, 0 }, i;

	(void)state;
	btu_fx_start_order(f);
	for (i = 0; i < 3; i++)
		policy_cache_aware_replay(f->fx_br->br_default,
		    BROKER_MODEL_UNKNOWN, 0, f->fx_c[i], long_a,
		    strlen(long_a));
	for (i = 0; i < 3; i++)
		btu_load(f, i, 2);
	for (i = 0; i < 600; i++)
		got[pick_text(f, long_a)]++;
	for (i = 0; i < 3; i++)
		assert_in_range(got[i], 150, 250);
	assert_int_equal(btu_branch(f, CA, "tree_match"), 600);
	/* One holder less loaded: always it. */
	btu_load(f, 0, 1);
	btu_load(f, 2, 1);
	for (i = 0; i < 20; i++)
		assert_int_equal(pick_text(f, long_a), 1);
	btu_fx_free(f);
}

static void
test_spill_leaves_gated_holder(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("ca", "cache_aware");
	int i, idx;

	(void)state;
	btu_fx_start_order(f);
	btu_load(f, 1, 1);
	btu_load(f, 2, 1);
	assert_int_equal(pick_text(f, long_a), 0);
	/* Holder 0 at 8, others 1: avg 10/3, gates 5 and 5.33: spill. Its
	 * last report makes it the scorer's best (fast, nothing queued);
	 * the spill still goes to a worker under the gate. */
	btu_load(f, 0, 7);
	report_tp(f, 0, 0, 100000);
	report_tp(f, 1, 4000, 1000);
	report_tp(f, 2, 4000, 1000);
	idx = pick_text(f, long_a);
	assert_true(idx == 1 || idx == 2);
	assert_int_equal(btu_branch(f, CA, "spill"), 1);
	/* The spill target now holds the prefix too: it is the least
	 * loaded holder from then on. */
	for (i = 0; i < 5; i++)
		assert_int_equal(pick_text(f, long_a), idx);
	assert_int_equal(btu_branch(f, CA, "tree_match"), 5);
	/* Outside a spill the scorer still prefers 0 for new text. */
	assert_int_equal(pick_text(f, long_b), 0);
	assert_int_equal(btu_branch(f, CA, "min_load_fallback"), 2);
	btu_fx_free(f);
}

/* One decision through route_one (the default policy), into *d. */
static int
route_text(struct btu_fx *f, const char *text, Smg__Decision *d)
{
	Smg__RouteRequest rq = SMG__ROUTE_REQUEST__INIT;
	char msg[192];
	unsigned i;

	smg__decision__init(d);
	rq.model = "";
	rq.text = (char *)text;
	rq.has_text = true;
	rq.size = strlen(text);
	route_one(f->fx_br, &rq, d, msg, sizeof(msg));
	assert_int_equal(d->status, SMG__DECISION_STATUS__DECISION_OK);
	for (i = 0; i < 3; i++)
		if (f->fx_c[i]->wk_slot == d->worker_slot)
			return (int)i;
	fail();
	return -1;
}

/* A conversation of `len` chars (4 chars a token), then its next turn. */
static char *
turn(unsigned seed, size_t len, size_t more)
{
	char *t = malloc(len + more + 1);
	size_t i;

	assert_non_null(t);
	for (i = 0; i < len + more; i++)
		t[i] = (char)('a' + (i * 7 + i / 5 + seed * 13) % 26);
	for (i = len; i < len + more; i++)
		t[i] = 'Z';
	t[len + more] = '\0';
	return t;
}

/*
 * The holder keeps its conversation while its queue costs less than the
 * cache saves (this prompt's prefix, and the copy a move would leave in
 * two caches), and loses it beyond.
 */
static void
test_spill_when_queue_outweighs_cache(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("ca", "cache_aware");
	Smg__Decision d;
	char *t1 = turn(1, 4000, 0), *t2 = turn(1, 4000, 100);
	struct worker *w0;
	int idx;

	(void)state;
	f->fx_cf.cf_max_tree_size = 1000000;
	btu_fx_start_order(f);
	w0 = f->fx_c[0];
	btu_load(f, 1, 1);
	btu_load(f, 2, 1);
	/* 1000 tokens, nowhere cached: the idlest, nothing cached. */
	assert_int_equal(route_text(f, t1, &d), 0);
	assert_int_equal(d.cached_tokens, 0);
	/* Next turn, 1025 tokens of which 0 holds 1000: it stays while its
	 * backlog is below the others' by less than 2 x 1000 tokens. */
	shm_pending_add(f->fx_br->br_shm, 0, w0->wk_slot, 1900);
	assert_int_equal(route_text(f, t2, &d), 0);
	assert_int_equal(d.cached_tokens, 1000);
	assert_int_equal(btu_branch(f, CA, "tree_match"), 1);
	/* 0: 2100 + 25 + 1; 1: 1025 + 1000 forfeited + 1 + 1: spill. */
	shm_pending_add(f->fx_br->br_shm, 0, w0->wk_slot, 200);
	idx = route_text(f, t2, &d);
	assert_true(idx == 1 || idx == 2);
	assert_int_equal(btu_branch(f, CA, "spill"), 1);
	assert_int_equal(d.cached_tokens, 0);
	/* Below the in-flight gates: the work gate alone fired. */
	assert_int_equal(btu_branch(f, CA, "min_load_fallback"), 1);
	free(t1);
	free(t2);
	btu_fx_free(f);
}

/* Among holders the expected wait decides, learned rates included. */
static void
test_holders_by_expected_wait(void **state)
{
	struct btu_fx *f = btu_fx_flags_new("ca", "cache_aware");
	char *t1 = turn(2, 4000, 0), *t2 = turn(2, 4000, 100);
	unsigned i;

	(void)state;
	f->fx_cf.cf_max_tree_size = 1000000;
	btu_fx_start_order(f);
	for (i = 0; i < 3; i++)
		policy_cache_aware_replay(f->fx_br->br_default,
		    BROKER_MODEL_UNKNOWN, 0, f->fx_c[i], t1, strlen(t1));
	/* Equal rates (none learned): the shortest backlog, whatever the
	 * in-flight counts say. */
	shm_pending_add(f->fx_br->br_shm, 0, f->fx_c[0]->wk_slot, 9000);
	shm_pending_add(f->fx_br->br_shm, 0, f->fx_c[1]->wk_slot, 3000);
	shm_pending_add(f->fx_br->br_shm, 0, f->fx_c[2]->wk_slot, 5000);
	btu_load(f, 2, 3);
	for (i = 0; i < 5; i++)
		assert_int_equal(pick_text(f, t2), 1);
	/* 2 prefills four times as fast: 5000 tokens there wait less. */
	for (i = 0; i < 3; i++) {
		assert_true(rate_sample(&f->fx_c[i]->wk_rate, 20000,
		    i == 2 ? 500000 : 2000000));
	}
	for (i = 0; i < 5; i++)
		assert_int_equal(pick_text(f, t2), 2);
	/* 1 alone held all of t2 by then: the first of these moved it to
	 * 2 at the cost of 25 forfeited tokens (a spill), the rest stayed. */
	assert_int_equal(btu_branch(f, CA, "tree_match"), 9);
	assert_int_equal(btu_branch(f, CA, "spill"), 1);
	free(t1);
	free(t2);
	btu_fx_free(f);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tree_match_and_fallback),
		cmocka_unit_test(test_gauges_live_and_model_discovery),
		cmocka_unit_test(test_soak_heap_bounded),
		cmocka_unit_test(test_spill_needs_both_gates),
		cmocka_unit_test(test_first_healthy_and_no_tree),
		cmocka_unit_test(test_kv_pressure),
		cmocka_unit_test(test_token_tree_pages),
		cmocka_unit_test(test_eviction_sweep_and_gauges),
		cmocka_unit_test(test_hash_mode),
		cmocka_unit_test(test_decay_prefers_shorter_backlog),
		cmocka_unit_test(test_event_mode_decay_and_temperature),
		cmocka_unit_test(test_new_conversations_spread),
		cmocka_unit_test(test_holder_ties_uniform),
		cmocka_unit_test(test_spill_leaves_gated_holder),
		cmocka_unit_test(test_spill_when_queue_outweighs_cache),
		cmocka_unit_test(test_holders_by_expected_wait),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
