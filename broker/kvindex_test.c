/*
 * kvindex_test.c: the event-mode block index: hashes against reference
 * XXH3 values, stored/removed/cleared, chain positions, overlap scores,
 * resets, bounds and the event-mode pick.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "broker.h"
#include "kvindex.h"

#define BS 4

/* Reference values from an independent XXH3 implementation (seed 1337). */
#define H_A   0xcb38e4d7fb2dca5cULL /* tokens 1 2 3 4 */
#define H_B   0xe8d3ec39b907b74cULL /* 5 6 7 8 */
#define H_C   0x06b748f1777d599cULL /* 9 10 11 12 */
#define P_AB  0x44a2b2379d6d3c3dULL
#define P_ABC 0xaea1e67a6c80cf84ULL
#define H_BIG 0x2e96f9453762cebeULL /* 0xffffffff 0x01020304 0 7 */
#define H_300 0x1474c801f1576d1cULL /* 0 .. 299 */

static const uint32_t toks_abc[] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 };

/* A batch under construction: up to 8 events. */
struct tb {
	Smg__KvEventBatch b;
	Smg__KvEvent ev[8];
	Smg__KvEvent *evp[8];
	Smg__KvBlocksStored st[8];
	Smg__KvBlocksRemoved rm[8];
	Smg__KvCacheCleared cl;
	int64_t hashes[8][8];
};

static void
tb_init(struct tb *t)
{
	memset(t, 0, sizeof(*t));
	smg__kv_event_batch__init(&t->b);
	smg__kv_cache_cleared__init(&t->cl);
	t->b.events = t->evp;
}

static Smg__KvEvent *
tb_next(struct tb *t)
{
	Smg__KvEvent *e = &t->ev[t->b.n_events];

	smg__kv_event__init(e);
	t->evp[t->b.n_events++] = e;
	return e;
}

/* Stores n blocks of bs tokens from tok with engine hashes h0, h0+1, ... */
static void
tb_store(struct tb *t, int64_t h0, size_t n, const uint32_t *tok, uint32_t bs,
    bool has_parent, int64_t parent)
{
	size_t k = t->b.n_events, i;
	Smg__KvEvent *e = tb_next(t);
	Smg__KvBlocksStored *s = &t->st[k];

	smg__kv_blocks_stored__init(s);
	for (i = 0; i < n; i++)
		t->hashes[k][i] = h0 + (int64_t)i;
	s->n_block_hashes = n;
	s->block_hashes = t->hashes[k];
	s->has_parent = has_parent;
	s->parent_block_hash = parent;
	s->n_token_ids = n * (bs ? bs : BS);
	s->token_ids = (uint32_t *)(uintptr_t)tok;
	s->block_size = bs;
	e->data_case = SMG__KV_EVENT__DATA_STORED;
	e->stored = s;
}

static void
tb_remove(struct tb *t, int64_t h)
{
	size_t k = t->b.n_events;
	Smg__KvEvent *e = tb_next(t);
	Smg__KvBlocksRemoved *r = &t->rm[k];

	smg__kv_blocks_removed__init(r);
	t->hashes[k][0] = h;
	r->n_block_hashes = 1;
	r->block_hashes = t->hashes[k];
	e->data_case = SMG__KV_EVENT__DATA_REMOVED;
	e->removed = r;
}

static void
tb_clear(struct tb *t)
{
	Smg__KvEvent *e = tb_next(t);

	e->data_case = SMG__KV_EVENT__DATA_CLEARED;
	e->cleared = &t->cl;
}

/* Scores of slots 1 and 2 for toks[0..n). */
static void
scores12(struct kvindex *kx, const uint32_t *toks, size_t n, uint32_t *sc)
{
	const unsigned slots[2] = { 1, 2 };

	kvindex_overlap(kx, "m", toks, n, BS, slots, 2, sc, 1000);
}

static void
test_hashes(void **state)
{
	const uint32_t big[] = { 0xffffffffu, 0x01020304u, 0, 7 };
	uint32_t seq[300];
	unsigned i;

	(void)state;
	for (i = 0; i < 300; i++)
		seq[i] = i;
	assert_true(kvindex_content_hash(toks_abc, 4) == H_A);
	assert_true(kvindex_content_hash(toks_abc + 4, 4) == H_B);
	assert_true(kvindex_content_hash(toks_abc + 8, 4) == H_C);
	assert_true(kvindex_prefix_hash(H_A, H_B) == P_AB);
	assert_true(kvindex_prefix_hash(P_AB, H_C) == P_ABC);
	assert_true(kvindex_content_hash(big, 4) == H_BIG);
	/* Longer than one streaming chunk. */
	assert_true(kvindex_content_hash(seq, 300) == H_300);
}

static void
test_stored_chain_and_overlap(void **state)
{
	struct kvindex *kx = kvindex_new(0, 0);
	const uint32_t abx[] = { 1, 2, 3, 4, 5, 6, 7, 8, 99, 10, 11, 12 };
	const uint32_t bc[] = { 5, 6, 7, 8, 9, 10, 11, 12 };
	struct tb t;
	uint32_t sc[2];

	(void)state;
	/* Worker 1: A B C in one event; worker 2: A alone. */
	tb_init(&t);
	tb_store(&t, 100, 3, toks_abc, BS, false, 0);
	assert_int_equal(kvindex_apply(kx, "m", 1, 7, &t.b, 0), 0);
	tb_init(&t);
	tb_store(&t, 500, 1, toks_abc, BS, false, 0);
	assert_int_equal(kvindex_apply(kx, "m", 2, 7, &t.b, 0), 0);
	assert_int_equal(kvindex_blocks(kx, "m"), 3);
	assert_int_equal(kvindex_entries(kx), 4);
	assert_int_equal(kvindex_block_size(kx, "m"), BS);
	assert_int_equal(kvindex_blocks(kx, "other"), 0);

	scores12(kx, toks_abc, 12, sc);
	assert_int_equal(sc[0], 3);
	assert_int_equal(sc[1], 1);
	/* A trailing partial block does not count; a short request: none. */
	scores12(kx, toks_abc, 11, sc);
	assert_int_equal(sc[0], 2);
	scores12(kx, toks_abc, 3, sc);
	assert_int_equal(sc[0], 0);
	/* Divergence at block 2. */
	scores12(kx, abx, 12, sc);
	assert_int_equal(sc[0], 2);
	/* B C at position 0 is another chain: no overlap. */
	scores12(kx, bc, 8, sc);
	assert_int_equal(sc[0], 0);
	assert_int_equal(sc[1], 0);
	kvindex_free(kx);
}

static void
test_parent_chaining(void **state)
{
	struct kvindex *kx = kvindex_new(0, 0);
	struct tb t;
	uint32_t sc[2];

	(void)state;
	/* SGLang style: one page per event, each naming its parent. */
	tb_init(&t);
	tb_store(&t, 10, 1, toks_abc, BS, false, 0);
	tb_store(&t, 11, 1, toks_abc + 4, BS, true, 10);
	assert_int_equal(kvindex_apply(kx, "m", 1, 1, &t.b, 0), 0);
	/* Unknown parent: a new chain at position 0, not position 2. */
	tb_init(&t);
	tb_store(&t, 12, 1, toks_abc + 8, BS, true, 999);
	assert_int_equal(kvindex_apply(kx, "m", 1, 1, &t.b, 0), 0);
	scores12(kx, toks_abc, 12, sc);
	assert_int_equal(sc[0], 2);
	/* Block C stored again under its real parent: now 3. */
	tb_init(&t);
	tb_store(&t, 13, 1, toks_abc + 8, BS, true, 11);
	assert_int_equal(kvindex_apply(kx, "m", 1, 1, &t.b, 0), 0);
	scores12(kx, toks_abc, 12, sc);
	assert_int_equal(sc[0], 3);
	/* The orphan C at position 0 matches a request starting with C. */
	scores12(kx, toks_abc + 8, 4, sc);
	assert_int_equal(sc[0], 1);
	kvindex_free(kx);
}

static void
test_removed_prefix_closed(void **state)
{
	struct kvindex *kx = kvindex_new(0, 0);
	struct tb t;
	uint32_t sc[2];

	(void)state;
	tb_init(&t);
	tb_store(&t, 100, 3, toks_abc, BS, false, 0);
	(void)kvindex_apply(kx, "m", 1, 1, &t.b, 0);
	tb_init(&t);
	tb_store(&t, 100, 3, toks_abc, BS, false, 0);
	(void)kvindex_apply(kx, "m", 2, 1, &t.b, 0);
	/* Worker 1 loses its middle block: C becomes unreachable. */
	tb_init(&t);
	tb_remove(&t, 101);
	tb_remove(&t, 4242); /* unknown hash: ignored */
	(void)kvindex_apply(kx, "m", 1, 1, &t.b, 0);
	scores12(kx, toks_abc, 12, sc);
	assert_int_equal(sc[0], 1);
	assert_int_equal(sc[1], 3);
	assert_int_equal(kvindex_entries(kx), 5);
	/* Tail first, as engines evict: worker 2 keeps A B. */
	tb_init(&t);
	tb_remove(&t, 102);
	(void)kvindex_apply(kx, "m", 2, 1, &t.b, 0);
	scores12(kx, toks_abc, 12, sc);
	assert_int_equal(sc[1], 2);
	kvindex_free(kx);
}

static void
test_cleared_and_reset(void **state)
{
	struct kvindex *kx = kvindex_new(0, 0);
	struct tb t;
	uint32_t sc[2];

	(void)state;
	tb_init(&t);
	tb_store(&t, 100, 3, toks_abc, BS, false, 0);
	(void)kvindex_apply(kx, "m", 1, 1, &t.b, 0);
	(void)kvindex_apply(kx, "m", 2, 1, &t.b, 0);
	tb_init(&t);
	tb_clear(&t);
	(void)kvindex_apply(kx, "m", 1, 1, &t.b, 0);
	scores12(kx, toks_abc, 12, sc);
	assert_int_equal(sc[0], 0);
	assert_int_equal(sc[1], 3);
	assert_int_equal(kvindex_entries(kx), 3);
	/* Cleared then stored in the same batch: the store survives. */
	tb_init(&t);
	tb_clear(&t);
	tb_store(&t, 100, 1, toks_abc, BS, false, 0);
	(void)kvindex_apply(kx, "m", 2, 1, &t.b, 0);
	scores12(kx, toks_abc, 12, sc);
	assert_int_equal(sc[1], 1);
	/* A reset batch drops what the worker had before its events. */
	tb_init(&t);
	tb_store(&t, 300, 2, toks_abc, BS, false, 0);
	(void)kvindex_apply(kx, "m", 1, 1, &t.b, 0);
	tb_init(&t);
	t.b.reset = true;
	tb_store(&t, 400, 1, toks_abc + 8, BS, false, 0);
	(void)kvindex_apply(kx, "m", 1, 1, &t.b, 0);
	scores12(kx, toks_abc, 12, sc);
	assert_int_equal(sc[0], 0);
	scores12(kx, toks_abc + 8, 4, sc);
	assert_int_equal(sc[0], 1);
	kvindex_free(kx);
}

static void
test_generation_model_and_forget(void **state)
{
	struct kvindex *kx = kvindex_new(0, 0);
	struct tb t;
	uint32_t sc[2];

	(void)state;
	tb_init(&t);
	tb_store(&t, 100, 3, toks_abc, BS, false, 0);
	(void)kvindex_apply(kx, "m", 1, 1, &t.b, 0);
	/* The slot now holds another worker (new generation). */
	tb_init(&t);
	tb_store(&t, 100, 1, toks_abc, BS, false, 0);
	(void)kvindex_apply(kx, "m", 1, 2, &t.b, 0);
	scores12(kx, toks_abc, 12, sc);
	assert_int_equal(sc[0], 1);
	/* It moved to model "n": gone from "m", and "m" itself is gone. */
	(void)kvindex_apply(kx, "n", 1, 2, &t.b, 0);
	assert_int_equal(kvindex_blocks(kx, "m"), 0);
	assert_int_equal(kvindex_block_size(kx, "m"), 0);
	assert_int_equal(kvindex_blocks(kx, "n"), 1);
	kvindex_forget_worker(kx, 1);
	assert_int_equal(kvindex_blocks(kx, "n"), 0);
	assert_int_equal(kvindex_entries(kx), 0);
	kvindex_forget_worker(kx, 1);
	kvindex_forget_worker(kx, 100000);
	kvindex_free(kx);
}

static void
test_block_size_inferred_and_short_tokens(void **state)
{
	struct kvindex *kx = kvindex_new(0, 0);
	struct tb t;
	uint32_t sc[2];

	(void)state;
	/* block_size 0: inferred from tokens per hash. */
	tb_init(&t);
	tb_store(&t, 100, 3, toks_abc, 0, false, 0);
	assert_int_equal(kvindex_apply(kx, "m", 1, 1, &t.b, 0), 0);
	assert_int_equal(kvindex_block_size(kx, "m"), BS);
	scores12(kx, toks_abc, 12, sc);
	assert_int_equal(sc[0], 3);
	/* Three hashes, two blocks of tokens: the third is skipped. */
	tb_init(&t);
	tb_store(&t, 200, 3, toks_abc, BS, false, 0);
	t.st[0].n_token_ids = 8;
	assert_int_equal(kvindex_apply(kx, "m", 2, 1, &t.b, 0), 1);
	scores12(kx, toks_abc, 12, sc);
	assert_int_equal(sc[1], 2);
	/* Hashes that cannot be split evenly and no block size: skipped. */
	tb_init(&t);
	tb_store(&t, 300, 3, toks_abc, 0, false, 0);
	t.st[0].n_token_ids = 11;
	assert_int_equal(kvindex_apply(kx, "m", 3, 1, &t.b, 0), 3);
	kvindex_free(kx);
}

static void
test_ttl_prune(void **state)
{
	struct kvindex *kx = kvindex_new(10000, 0);
	const unsigned slot1 = 1;
	struct tb t;
	uint32_t sc;

	(void)state;
	tb_init(&t);
	tb_store(&t, 100, 3, toks_abc, BS, false, 0);
	(void)kvindex_apply(kx, "m", 1, 1, &t.b, 1000);
	(void)kvindex_apply(kx, "m", 2, 1, &t.b, 1000);
	/* Matching A at t=8000 keeps block A alive for both workers. */
	kvindex_overlap(kx, "m", toks_abc, 4, BS, &slot1, 1, &sc, 8000);
	assert_int_equal(sc, 1);
	assert_int_equal(kvindex_prune(kx, 11000), 0);
	assert_int_equal(kvindex_prune(kx, 12000), 4);
	assert_int_equal(kvindex_blocks(kx, "m"), 1);
	assert_int_equal(kvindex_prune(kx, 18001), 2);
	assert_int_equal(kvindex_blocks(kx, "m"), 0);
	kvindex_free(kx);
}

static void
test_capacity_prune(void **state)
{
	struct kvindex *kx = kvindex_new(0, 10);
	uint32_t toks[20 * BS];
	struct tb t;
	unsigned i;

	(void)state;
	for (i = 0; i < 20 * BS; i++)
		toks[i] = i;
	/* 20 single-block chains stored at t = 0..19 s. */
	for (i = 0; i < 20; i++) {
		tb_init(&t);
		tb_store(&t, 1000 + i, 1, toks + i * BS, BS, false, 0);
		(void)kvindex_apply(kx, "m", 1, 1, &t.b, (uint64_t)i * 1000);
	}
	assert_int_equal(kvindex_entries(kx), 20);
	/* At 19.5 s the last two (touched < 2 s ago) are exempt; the
	 * oldest go until 9 remain. */
	assert_int_equal(kvindex_prune(kx, 19500), 11);
	assert_int_equal(kvindex_entries(kx), 9);
	for (i = 0; i < 11; i++) {
		const unsigned slot = 1;
		uint32_t sc;

		kvindex_overlap(kx, "m", toks + i * BS, BS, BS, &slot, 1, &sc,
		    19500);
		assert_int_equal(sc, 0);
	}
	kvindex_free(kx);
}

static void
test_select(void **state)
{
	struct broker *br = calloc(1, sizeof(*br));
	struct worker w[3];
	struct worker *c[3] = { &w[0], &w[1], &w[2] };
	uint32_t load[3] = { 5, 2, 0 }, score;
	const uint32_t other[] = { 50, 51, 52, 53 };
	struct tb t;
	int idx;

	(void)state;
	memset(w, 0, sizeof(w));
	w[0].wk_slot = 10;
	w[1].wk_slot = 11;
	w[2].wk_slot = 12;
	assert_false(kvindex_active(br, "m"));
	assert_int_equal(
	    kvindex_select(br, "m", c, 3, load, toks_abc, 12, BS, &score), -1);
	tb_init(&t);
	tb_store(&t, 100, 3, toks_abc, BS, false, 0);
	(void)kvindex_apply(kvindex_of(br), "m", 10, 1, &t.b, 0);
	(void)kvindex_apply(kvindex_of(br), "m", 11, 1, &t.b, 0);
	tb_init(&t);
	tb_store(&t, 100, 1, toks_abc, BS, false, 0);
	(void)kvindex_apply(kvindex_of(br), "m", 12, 1, &t.b, 0);
	assert_true(kvindex_active(br, "m"));
	assert_false(kvindex_active(br, "x"));
	/* Max score 3 for slots 10 and 11: the one with fewer in flight. */
	idx = kvindex_select(br, "m", c, 3, load, toks_abc, 12, 16, &score);
	assert_int_equal(idx, 1);
	assert_int_equal(score, 3);
	/* One block only: all three tie on score, slot 12 is idle. */
	idx = kvindex_select(br, "m", c, 3, load, toks_abc, 4, 16, &score);
	assert_int_equal(idx, 2);
	assert_int_equal(score, 1);
	/* No overlap: -1 so the caller falls back. */
	idx = kvindex_select(br, "m", c, 3, load, other, 4, 16, &score);
	assert_int_equal(idx, -1);
	assert_int_equal(score, 0);
	/* Only candidates count. */
	idx = kvindex_select(br, "m", c + 2, 1, load + 2, toks_abc, 12, 16,
	    &score);
	assert_int_equal(idx, 0);
	assert_int_equal(score, 1);
	kvindex_broker_free(br);
	kvindex_broker_free(br);
	free(br);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hashes),
		cmocka_unit_test(test_stored_chain_and_overlap),
		cmocka_unit_test(test_parent_chaining),
		cmocka_unit_test(test_removed_prefix_closed),
		cmocka_unit_test(test_cleared_and_reset),
		cmocka_unit_test(test_generation_model_and_forget),
		cmocka_unit_test(test_block_size_inferred_and_short_tokens),
		cmocka_unit_test(test_ttl_prune),
		cmocka_unit_test(test_capacity_prune),
		cmocka_unit_test(test_select),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
