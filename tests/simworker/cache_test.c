/* cache_test.c: unit tests of the simulated engine's paged prefix cache. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "tests/simworker/simworker.h"

#define PS 4 /* page size of these tests */

struct recorder {
	int r_stored;
	int r_cleared;
	int r_nremoved;
	int64_t r_removed[64];
	int64_t r_last_stored;
	int64_t r_last_parent;
	int r_last_has_parent;
};

static void
record(void *arg, const struct kv_event *ev)
{
	struct recorder *r = arg;

	switch (ev->ke_kind) {
	case KV_EVENT_STORED:
		r->r_stored++;
		r->r_last_stored = ev->ke_hash;
		r->r_last_parent = ev->ke_parent;
		r->r_last_has_parent = ev->ke_has_parent;
		break;
	case KV_EVENT_REMOVED:
		if (r->r_nremoved < 64)
			r->r_removed[r->r_nremoved++] = ev->ke_hash;
		break;
	case KV_EVENT_CLEARED:
		r->r_cleared++;
		break;
	}
}

/* Tokens of a sequence: page i of sequence s holds s*100 + i*PS + j. */
static void
seq_tokens(uint32_t *t, uint32_t s, uint32_t pages)
{
	uint32_t i;

	for (i = 0; i < pages * PS; i++)
		t[i] = s * 1000 + i;
}

/* Stores pages of tokens as a request would, then unlocks them. */
static void
store(struct cache *c, const uint32_t *t, uint32_t pages,
    struct cache_page **out)
{
	uint32_t m;

	m = cache_match(c, t, pages, out);
	assert_int_equal(cache_reserve(c, (uint64_t)(pages - m) * PS), 0);
	cache_insert(c, t, m, pages, out);
	cache_unlock(c, out, pages);
}

static void
test_hits(void **state)
{
	struct cache *c = cache_new(PS, 64);
	struct cache_page *pg[8];
	struct recorder rec;
	uint32_t a[8 * PS], b[8 * PS];
	int64_t first;

	(void)state;
	memset(&rec, 0, sizeof(rec));
	cache_set_listener(c, record, &rec);
	seq_tokens(a, 1, 4);
	assert_int_equal(cache_match(c, a, 4, NULL), 0);
	store(c, a, 3, pg);
	assert_int_equal(rec.r_stored, 3);
	assert_int_equal(rec.r_last_has_parent, 1);
	assert_int_equal(rec.r_last_parent, cache_page_hash(pg[1]));
	first = cache_page_hash(pg[0]);
	assert_int_equal(cache_cached_tokens(c), 3 * PS);
	assert_int_equal(cache_used_tokens(c), 0);
	/* Leading full pages only, and never past max_pages. */
	assert_int_equal(cache_match(c, a, 4, NULL), 3);
	assert_int_equal(cache_match(c, a, 2, NULL), 2);
	/* A different second page: only the first matches. */
	memcpy(b, a, sizeof(a));
	b[PS + 1] = 7;
	assert_int_equal(cache_match(c, b, 4, NULL), 1);
	/* Same tokens at another position hash differently. */
	memcpy(b, a + PS, PS * sizeof(uint32_t));
	assert_int_equal(cache_match(c, b, 1, NULL), 0);
	/* Storing the same prefix again adds nothing. */
	store(c, a, 3, pg);
	assert_int_equal(rec.r_stored, 3);
	assert_int_equal(cache_page_hash(pg[0]), first);
	cache_free(c);
}

static void
test_lru_order(void **state)
{
	struct cache *c = cache_new(PS, 6 * PS);
	struct cache_page *pa[4], *pb[4], *pc[4];
	struct recorder rec;
	uint32_t a[4 * PS], b[4 * PS], x[4 * PS];
	int64_t hb1, hb2;

	(void)state;
	memset(&rec, 0, sizeof(rec));
	cache_set_listener(c, record, &rec);
	seq_tokens(a, 1, 3);
	seq_tokens(b, 2, 3);
	seq_tokens(x, 3, 3);
	store(c, a, 3, pa); /* oldest */
	store(c, b, 3, pb);
	assert_int_equal(cache_cached_tokens(c), 6 * PS);
	/* Using a again makes b the least recently used. */
	assert_int_equal(cache_match(c, a, 3, pa), 3);
	cache_unlock(c, pa, 3);
	/* Two new pages evict b's last two pages, deepest first (read the
	 * hashes now: evicted pages are reused). */
	hb1 = cache_page_hash(pb[1]);
	hb2 = cache_page_hash(pb[2]);
	store(c, x, 2, pc);
	assert_int_equal(rec.r_nremoved, 2);
	assert_int_equal(rec.r_removed[0], hb2);
	assert_int_equal(rec.r_removed[1], hb1);
	assert_int_equal(cache_match(c, b, 3, NULL), 1);
	assert_int_equal(cache_match(c, a, 3, NULL), 3);
	assert_int_equal(cache_match(c, x, 3, NULL), 2);
	cache_free(c);
}

static void
test_capacity_and_locks(void **state)
{
	struct cache *c = cache_new(PS, 4 * PS);
	struct cache_page *pa[4], *pb[4];
	struct recorder rec;
	uint32_t a[4 * PS], b[4 * PS];

	(void)state;
	memset(&rec, 0, sizeof(rec));
	cache_set_listener(c, record, &rec);
	seq_tokens(a, 1, 4);
	seq_tokens(b, 2, 4);
	/* a's three pages stay locked, as by a running request. */
	assert_int_equal(cache_reserve(c, 3 * PS), 0);
	cache_insert(c, a, 0, 3, pa);
	assert_int_equal(cache_used_tokens(c), 3 * PS);
	/* Only one page of room is left and nothing is evictable. */
	assert_int_equal(cache_reserve(c, 2 * PS), -1);
	assert_int_equal(rec.r_nremoved, 0);
	assert_int_equal(cache_reserve(c, PS), 0);
	assert_int_equal(cache_flush(c), -1);
	cache_unreserve(c, PS);
	/* Unlocked, a's pages go; the cache never exceeds its capacity. */
	cache_unlock(c, pa, 3);
	assert_int_equal(cache_used_tokens(c), 0);
	assert_int_equal(cache_reserve(c, 4 * PS), 0);
	assert_int_equal(rec.r_nremoved, 3);
	assert_int_equal(cache_cached_tokens(c), 0);
	assert_int_equal(cache_reserve(c, 1), -1);
	cache_insert(c, b, 0, 4, pb);
	assert_int_equal(cache_cached_tokens(c), 4 * PS);
	assert_int_equal(cache_used_tokens(c), 4 * PS);
	cache_unlock(c, pb, 4);
	assert_int_equal(cache_flush(c), 0);
	assert_int_equal(rec.r_cleared, 1);
	assert_int_equal(cache_cached_tokens(c), 0);
	assert_int_equal(cache_match(c, b, 4, NULL), 0);
	cache_free(c);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hits),
		cmocka_unit_test(test_lru_order),
		cmocka_unit_test(test_capacity_and_locks),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
