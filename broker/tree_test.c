/*
 * tree_test.c: unit tests of the cache_aware radix trees (broker/tree.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "broker/tree.h"

#define BIG (1ULL << 40)

static void match_str(struct tree *, const char *, struct tree_match *);
static int holders_are(const struct tree_match *, const unsigned *, size_t);
static uint64_t rnd(uint64_t *);

static void
match_str(struct tree *t, const char *s, struct tree_match *m)
{
	tree_match(t, s, strlen(s), m);
}

/* 1 if the reported holders are exactly the given set. */
static int
holders_are(const struct tree_match *m, const unsigned *want, size_t n)
{
	size_t i, j;

	if (m->tm_nholders != n || m->tm_total != n)
		return 0;
	for (i = 0; i < n; i++) {
		for (j = 0; j < n && m->tm_holders[j] != want[i]; j++)
			;
		if (j == n || !tree_match_holds(m, want[i]))
			return 0;
	}
	return 1;
}

static uint64_t
rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void
test_shared_prefix(void **state)
{
	struct tree *t = tree_new(TREE_STRING, BIG, 1);
	struct tree_match m;
	unsigned h0[] = { 0 }, h01[] = { 0, 1 }, h1[] = { 1 };

	(void)state;
	assert_int_equal(tree_insert(t, "hello world", 11, 0), 0);
	match_str(t, "hello there", &m);
	assert_int_equal(m.tm_matched, 6);
	assert_int_equal(m.tm_input, 11);
	assert_true(holders_are(&m, h0, 1));

	assert_int_equal(tree_insert(t, "hello there", 11, 1), 0);
	/* Ends inside the shared edge "hello ": partial chars count. */
	match_str(t, "help", &m);
	assert_int_equal(m.tm_matched, 3);
	assert_int_equal(m.tm_input, 4);
	assert_true(holders_are(&m, h01, 2));
	/* Full match of the shared node: holders are both. */
	match_str(t, "hello ", &m);
	assert_int_equal(m.tm_matched, 6);
	assert_true(holders_are(&m, h01, 2));
	/* Diverges inside "world": ends at that child, held by 0 only. */
	match_str(t, "hello wxyz", &m);
	assert_int_equal(m.tm_matched, 7);
	assert_true(holders_are(&m, h0, 1));
	match_str(t, "hello there, friend", &m);
	assert_int_equal(m.tm_matched, 11);
	assert_int_equal(m.tm_input, 19);
	assert_true(holders_are(&m, h1, 1));
	assert_false(tree_match_holds(&m, 0));
	/* No match: no holders. */
	match_str(t, "xyz", &m);
	assert_int_equal(m.tm_matched, 0);
	assert_int_equal(m.tm_nholders, 0);
	assert_false(tree_match_holds(&m, 0));
	match_str(t, "", &m);
	assert_int_equal(m.tm_matched, 0);
	assert_int_equal(m.tm_input, 0);
	assert_int_equal(tree_check(t), 0);
	tree_free(t);
}

/* How much of a match each tenant holds, along the matched path. */
static void
test_match_depth(void **state)
{
	struct tree *t = tree_new(TREE_STRING, BIG, 1);
	struct tree *k = tree_new(TREE_TOKEN, BIG, 4);
	struct tree_match m;
	uint32_t a[12] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 };
	uint32_t b[12] = { 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0 };

	(void)state;
	assert_int_equal(tree_insert(t, "system: be brief. user: hi", 26, 0),
	    0);
	assert_int_equal(tree_insert(t, "system: be brief. user: yo", 26, 1),
	    0);
	assert_int_equal(tree_insert(t, "system: be", 10, 2), 0);
	assert_int_equal(tree_insert(t, "", 0, 3), 0);
	match_str(t, "system: be brief. user: hi there", &m);
	assert_int_equal(m.tm_matched, 26);
	assert_int_equal(m.tm_above, 24);
	assert_int_equal(tree_match_depth(&m, 0), 26);
	/* 1 shares "system: be brief. user: " (24 chars), 2 "system: be". */
	assert_int_equal(tree_match_depth(&m, 1), 24);
	assert_int_equal(tree_match_depth(&m, 2), 10);
	/* On the root only, or unknown: nothing held. */
	assert_int_equal(tree_match_depth(&m, 3), 0);
	assert_int_equal(tree_match_depth(&m, 9), 0);
	assert_int_equal(tree_match_depth(&m, 70000), 0);
	/* A match ending inside an edge: its holders hold that much. */
	match_str(t, "system: be brief. user: y", &m);
	assert_int_equal(m.tm_matched, 25);
	assert_int_equal(tree_match_depth(&m, 1), 25);
	assert_int_equal(tree_match_depth(&m, 0), 24);
	match_str(t, "nothing", &m);
	assert_int_equal(tree_match_depth(&m, 0), 0);
	/* Token trees count whole pages. */
	assert_int_equal(tree_insert_tokens(k, a, 12, 0), 0);
	assert_int_equal(tree_insert_tokens(k, b, 12, 1), 0);
	tree_match_tokens(k, a, 12, &m);
	assert_int_equal(tree_match_depth(&m, 0), 12);
	assert_int_equal(tree_match_depth(&m, 1), 8);
	tree_free(t);
	tree_free(k);
}

static void
test_utf8(void **state)
{
	struct tree *t = tree_new(TREE_STRING, BIG, 1);
	struct tree_match m;
	unsigned h0[] = { 0 };

	(void)state;
	/* "héllo wörld": 11 chars, 13 bytes. */
	assert_int_equal(tree_insert(t, "h\xc3\xa9llo w\xc3\xb6rld", 13, 0), 0);
	assert_int_equal(tree_size(t), 11);
	match_str(t, "h\xc3\xa9llo w\xc3\xb6rld!", &m);
	assert_int_equal(m.tm_matched, 11);
	assert_int_equal(m.tm_input, 12);
	/* é (c3 a9) vs è (c3 a8): same first byte, different char. */
	match_str(t, "h\xc3\xa8llo", &m);
	assert_int_equal(m.tm_matched, 1);
	assert_true(holders_are(&m, h0, 1));
	/* ö vs a 4-byte char, and a 3-byte char. */
	match_str(t, "h\xc3\xa9llo w\xf0\x9d\x84\x9e", &m);
	assert_int_equal(m.tm_matched, 7);
	assert_int_equal(m.tm_input, 8);
	/* A split inside multibyte text keeps char counts right. */
	assert_int_equal(tree_insert(t, "h\xc3\xa9llo w\xe2\x82\xac", 11, 1),
	    0);
	assert_int_equal(tree_size(t), 11 + 8);
	match_str(t, "h\xc3\xa9llo w\xe2\x82\xac\xe2\x82\xac", &m);
	assert_int_equal(m.tm_matched, 8);
	assert_int_equal(m.tm_input, 9);
	/* Children whose first chars share a lead byte: € (e2 82 ac) and
	 * ₤ (e2 82 a4). */
	assert_int_equal(tree_insert(t, "\xe2\x82\xa4x", 4, 2), 0);
	assert_int_equal(tree_insert(t, "\xe2\x82\xacy", 4, 3), 0);
	match_str(t, "\xe2\x82\xa4xz", &m);
	assert_int_equal(m.tm_matched, 2);
	assert_int_equal(m.tm_holders[0], 2);
	match_str(t, "\xe2\x82\xacyz", &m);
	assert_int_equal(m.tm_matched, 2);
	assert_int_equal(m.tm_holders[0], 3);
	/* Invalid bytes count as one U+FFFD each, and match themselves. */
	assert_int_equal(tree_insert(t,
	                     "\xff\xfe"
	                     "ab\xc3",
	                     5, 4),
	    0);
	match_str(t,
	    "\xff\xfe"
	    "ab\xc3",
	    &m);
	assert_int_equal(m.tm_matched, 5);
	assert_int_equal(m.tm_input, 5);
	match_str(t, "\xef\xbf\xbd", &m); /* U+FFFD itself */
	assert_int_equal(m.tm_matched, 1);
	assert_int_equal(tree_check(t), 0);
	tree_free(t);
}

static void
test_holders(void **state)
{
	struct tree *t = tree_new(TREE_STRING, BIG, 1);
	struct tree_match m;
	unsigned seen[12] = { 0 }, i, j;

	(void)state;
	for (i = 0; i < 12; i++)
		assert_int_equal(tree_insert(t, "shared prompt", 13, i * 3), 0);
	assert_int_equal(tree_tenants(t), 12);
	for (j = 0; j < 3; j++) {
		match_str(t, "shared prompt and more", &m);
		assert_int_equal(m.tm_matched, 13);
		assert_int_equal(m.tm_nholders, TREE_MAX_HOLDERS);
		assert_int_equal(m.tm_total, 12);
		for (i = 0; i < m.tm_nholders; i++) {
			assert_int_equal(m.tm_holders[i] % 3, 0);
			seen[m.tm_holders[i] / 3]++;
		}
	}
	/* Successive matches rotate through all the holders. */
	for (i = 0; i < 12; i++) {
		assert_true(seen[i] > 0);
		assert_true(tree_match_holds(&m, i * 3));
		assert_false(tree_match_holds(&m, i * 3 + 1));
	}
	assert_false(tree_match_holds(&m, 70000));
	assert_int_equal(tree_check(t), 0);
	tree_free(t);
}

static void
test_remove_tenant(void **state)
{
	struct tree *t = tree_new(TREE_STRING, BIG, 1);
	struct tree_match m;
	unsigned h1[] = { 1 };

	(void)state;
	assert_int_equal(tree_insert(t, "", 0, 7), 0);
	assert_int_equal(tree_tenants(t), 1);
	assert_int_equal(tree_size(t), 0);
	assert_int_equal(tree_insert(t, "abcdef", 6, 0), 0);
	assert_int_equal(tree_insert(t, "abcxyz", 6, 1), 0);
	assert_int_equal(tree_insert(t, "qqq", 3, 0), 0);
	assert_int_equal(tree_size(t), 3 * 2 + 3 + 3 + 3);
	assert_int_equal(tree_nodes(t), 5);
	tree_remove_tenant(t, 0);
	assert_int_equal(tree_size(t), 6);
	assert_int_equal(tree_tenants(t), 2);
	match_str(t, "abcdef", &m);
	assert_int_equal(m.tm_matched, 3);
	assert_true(holders_are(&m, h1, 1));
	match_str(t, "qqq", &m);
	assert_int_equal(m.tm_matched, 0);
	/* "def" and "qqq" are gone; "abc" + "xyz" stay as two nodes. */
	assert_int_equal(tree_nodes(t), 3);
	tree_remove_tenant(t, 1);
	tree_remove_tenant(t, 1);
	tree_remove_tenant(t, 7);
	assert_int_equal(tree_size(t), 0);
	assert_int_equal(tree_tenants(t), 0);
	assert_int_equal(tree_nodes(t), 1);
	assert_int_equal(tree_check(t), 0);
	tree_free(t);
}

static void
test_token_paging(void **state)
{
	struct tree *t = tree_new(TREE_TOKEN, BIG, 4);
	struct tree_match m;
	uint32_t a[10] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 };
	uint32_t b[10] = { 1, 2, 3, 4, 5, 99, 7, 8, 9, 10 };
	uint32_t c[6] = { 1, 2, 99, 4, 5, 6 };
	unsigned h01[] = { 0, 1 }, h0[] = { 0 };

	(void)state;
	/* Shorter than a page: not inserted, not even as a tenant. */
	assert_int_equal(tree_insert_tokens(t, a, 3, 0), 0);
	assert_int_equal(tree_size(t), 0);
	assert_int_equal(tree_tenants(t), 0);
	/* 10 tokens: only the 8 of two whole pages go in. */
	assert_int_equal(tree_insert_tokens(t, a, 10, 0), 0);
	assert_int_equal(tree_size(t), 8);
	tree_match_tokens(t, a, 10, &m);
	assert_int_equal(m.tm_matched, 8);
	assert_int_equal(m.tm_input, 10);
	assert_true(holders_are(&m, h0, 1));
	/* Divergence at token 5 (inside page 2): rounded down to 4. */
	tree_match_tokens(t, b, 10, &m);
	assert_int_equal(m.tm_matched, 4);
	assert_true(holders_are(&m, h0, 1));
	/* Divergence inside the first page: nothing. */
	tree_match_tokens(t, c, 6, &m);
	assert_int_equal(m.tm_matched, 0);
	assert_int_equal(m.tm_nholders, 0);
	tree_match_tokens(t, a, 3, &m);
	assert_int_equal(m.tm_matched, 0);
	assert_int_equal(m.tm_input, 3);
	/* b shares one page with a: the split happens on the page boundary. */
	assert_int_equal(tree_insert_tokens(t, b, 10, 1), 0);
	assert_int_equal(tree_size(t), 4 * 2 + 4 + 4);
	assert_int_equal(tree_nodes(t), 4);
	tree_match_tokens(t, a, 7, &m);
	assert_int_equal(m.tm_matched, 4);
	assert_true(holders_are(&m, h01, 2));
	tree_match_tokens(t, b, 8, &m);
	assert_int_equal(m.tm_matched, 8);
	assert_int_equal(m.tm_holders[0], 1);
	assert_int_equal(tree_check(t), 0);
	tree_free(t);

	/* Block size 1: every token is a page. */
	t = tree_new(TREE_TOKEN, BIG, 1);
	assert_int_equal(tree_insert_tokens(t, a, 10, 0), 0);
	tree_match_tokens(t, b, 10, &m);
	assert_int_equal(m.tm_matched, 5);
	assert_int_equal(tree_insert_tokens(t, b, 3, 2), 0);
	assert_int_equal(tree_size(t), 13);
	assert_int_equal(tree_check(t), 0);
	tree_free(t);
}

static void
test_size_accounting(void **state)
{
	struct tree *t = tree_new(TREE_STRING, BIG, 1);

	(void)state;
	assert_int_equal(tree_insert(t, "abcd", 4, 0), 0);
	assert_int_equal(tree_size(t), 4);
	assert_int_equal(tree_insert(t, "abcd", 4, 0), 0);
	assert_int_equal(tree_size(t), 4);
	assert_int_equal(tree_insert(t, "abcd", 4, 1), 0);
	assert_int_equal(tree_size(t), 8);
	/* Split: "ab"{0,1} + "cd"{0,1} + "xy"{0}. */
	assert_int_equal(tree_insert(t, "abxy", 4, 0), 0);
	assert_int_equal(tree_size(t), 10);
	/* A prefix of an edge only splits it. */
	assert_int_equal(tree_insert(t, "a", 1, 2), 0);
	assert_int_equal(tree_size(t), 11);
	assert_int_equal(tree_nodes(t), 5);
	assert_int_equal(tree_tenants(t), 3);
	assert_int_equal(tree_check(t), 0);
	/* Invalid calls fail without changing anything. */
	assert_int_equal(tree_insert(t, "abc", 3, TREE_MAX_TENANT + 1), -1);
	assert_int_equal(tree_insert(t, NULL, 3, 0), -1);
	assert_int_equal(tree_insert_tokens(t, (const uint32_t *)"abcd", 1, 0),
	    -1);
	assert_int_equal(tree_size(t), 11);
	tree_free(t);
}

static void
test_eviction_lru(void **state)
{
	struct tree *t = tree_new(TREE_STRING, BIG, 1);
	struct tree_match m;

	(void)state;
	assert_int_equal(tree_insert(t, "aaaa", 4, 0), 0);
	assert_int_equal(tree_insert(t, "bbbb", 4, 1), 0);
	assert_int_equal(tree_insert(t, "cccc", 4, 2), 0);
	assert_int_equal(tree_evict(t), 0);
	tree_set_max_size(t, 8);
	assert_int_equal(tree_size(t), 8);
	match_str(t, "aaaa", &m);
	assert_int_equal(m.tm_matched, 0);
	/* The match refreshes "bbbb", so the next insert evicts "cccc". */
	match_str(t, "bbbb", &m);
	assert_int_equal(m.tm_matched, 4);
	assert_int_equal(tree_insert(t, "dddd", 4, 3), 0);
	assert_int_equal(tree_size(t), 8);
	match_str(t, "cccc", &m);
	assert_int_equal(m.tm_matched, 0);
	match_str(t, "bbbb", &m);
	assert_int_equal(m.tm_matched, 4);
	/* Evicted tenants stay registered on the root. */
	assert_int_equal(tree_tenants(t), 4);
	assert_int_equal(tree_check(t), 0);
	tree_free(t);

	/* Leaves go first, then the parent becomes a candidate. */
	t = tree_new(TREE_STRING, BIG, 1);
	assert_int_equal(tree_insert(t, "abcdef", 6, 0), 0);
	assert_int_equal(tree_insert(t, "abc", 3, 0), 0);
	assert_int_equal(tree_insert(t, "zzz", 3, 1), 0);
	assert_int_equal(tree_size(t), 9);
	tree_set_max_size(t, 8);
	assert_int_equal(tree_size(t), 6);
	match_str(t, "abcdef", &m);
	assert_int_equal(m.tm_matched, 3);
	match_str(t, "zzz", &m); /* refresh zzz: abc is now the oldest */
	tree_set_max_size(t, 5);
	assert_int_equal(tree_size(t), 3);
	match_str(t, "abc", &m);
	assert_int_equal(m.tm_matched, 0);
	match_str(t, "zzz", &m);
	assert_int_equal(m.tm_matched, 3);
	assert_int_equal(tree_nodes(t), 2);
	assert_int_equal(tree_check(t), 0);
	tree_free(t);

	/* Shared node: one tenant's pair goes, the other's stays. */
	t = tree_new(TREE_STRING, 100, 1);
	assert_int_equal(tree_insert(t, "shared", 6, 0), 0);
	assert_int_equal(tree_insert(t, "shared", 6, 1), 0);
	match_str(t, "shared", &m); /* refreshes both */
	assert_int_equal(tree_insert(t, "shared", 6, 1), 0);
	tree_set_max_size(t, 6);
	match_str(t, "shared", &m);
	assert_int_equal(m.tm_total, 1);
	assert_int_equal(m.tm_holders[0], 1);
	assert_int_equal(tree_check(t), 0);
	tree_free(t);
}

/* The test: a flood of unique 64 KB prompts never grows the tree
 * past --max-tree-size (default 64 Mi chars). */
static void
test_hard_cap_flood(void **state)
{
	const uint64_t cap = 67108864;
	const size_t len = 65536;
	struct tree *t = tree_new(TREE_STRING, cap, 1);
	struct tree_match m;
	uint64_t seed = 0x9e3779b97f4a7c15ULL, r;
	char *buf = malloc(len), *last = malloc(len);
	size_t i, j, maxmem = 0;

	(void)state;
	assert_non_null(buf);
	assert_non_null(last);
	for (i = 0; i < len; i++)
		buf[i] = (char)('a' + rnd(&seed) % 26);
	for (i = 0; i < 10000; i++) {
		/* A unique random head; the rest is shared text at a random
		 * rotation, so prompts only share a few leading chars. */
		r = rnd(&seed);
		for (j = 0; j < 16; j++)
			buf[j] = (char)('a' + (r >> (j * 4)) % 26);
		memcpy(buf + 16, &i, sizeof(i));
		buf[16 + sizeof(i)] = (char)('a' + i % 26);
		for (j = 16; j < 16 + sizeof(i); j++)
			buf[j] = (char)('A' + ((unsigned char)buf[j] & 15));
		assert_int_equal(tree_insert(t, buf, len, (unsigned)(i % 256)),
		    0);
		assert_true(tree_size(t) <= cap);
		if (tree_mem(t) > maxmem)
			maxmem = tree_mem(t);
	}
	memcpy(last, buf, len);
	/* The newest prompt survived, the oldest ones did not. */
	tree_match(t, last, len, &m);
	assert_int_equal(m.tm_matched, len);
	assert_true(tree_size(t) > cap - len);
	/* Memory tracks the cap: about one byte per char plus overhead. */
	assert_true(maxmem < cap + cap / 8);
	assert_int_equal(tree_check(t), 0);
	tree_free(t);
	free(buf);
	free(last);
}

struct dump_rec {
	unsigned dr_tenant;
	size_t dr_len;
	char *dr_key;
};

struct dump_list {
	struct dump_rec *dl_recs;
	size_t dl_n;
	size_t dl_cap;
	size_t dl_unit;
};

static int dump_collect(void *, unsigned, const void *, size_t);
static int dump_stop(void *, unsigned, const void *, size_t);
static void dump_list_free(struct dump_list *);
static void rebuild(struct tree *, const struct dump_list *);

static int
dump_collect(void *arg, unsigned tenant, const void *key, size_t len)
{
	struct dump_list *dl = arg;
	struct dump_rec *r;

	if (dl->dl_n == dl->dl_cap) {
		dl->dl_cap = dl->dl_cap ? dl->dl_cap * 2 : 64;
		dl->dl_recs =
		    realloc(dl->dl_recs, dl->dl_cap * sizeof(*dl->dl_recs));
		assert_non_null(dl->dl_recs);
	}
	r = &dl->dl_recs[dl->dl_n++];
	r->dr_tenant = tenant;
	r->dr_len = len;
	r->dr_key = malloc(len * dl->dl_unit + 1);
	assert_non_null(r->dr_key);
	memcpy(r->dr_key, key, len * dl->dl_unit);
	return 0;
}

static int
dump_stop(void *arg, unsigned tenant, const void *key, size_t len)
{
	(void)tenant;
	(void)key;
	(void)len;
	return *(int *)arg;
}

static void
dump_list_free(struct dump_list *dl)
{
	size_t i;

	for (i = 0; i < dl->dl_n; i++)
		free(dl->dl_recs[i].dr_key);
	free(dl->dl_recs);
	memset(dl, 0, sizeof(*dl));
}

static void
rebuild(struct tree *t, const struct dump_list *dl)
{
	size_t i;
	const struct dump_rec *r;

	for (i = 0; i < dl->dl_n; i++) {
		r = &dl->dl_recs[i];
		if (tree_kind(t) == TREE_STRING)
			assert_int_equal(
			    tree_insert(t, r->dr_key, r->dr_len, r->dr_tenant),
			    0);
		else
			assert_int_equal(tree_insert_tokens(t,
			                     (const uint32_t *)r->dr_key,
			                     r->dr_len, r->dr_tenant),
			    0);
	}
}

static const char *alphabet[] = { "a", "b", "\xc3\xa9", "\xe2\x82\xac",
	"\xf0\x9d\x84\x9e" };

static void
test_dump_rebuild(void **state)
{
	struct dump_list d1 = { .dl_unit = 1 }, d2 = { .dl_unit = 1 };
	struct tree *t = tree_new(TREE_STRING, 400, 1), *u;
	struct tree_match m1, m2;
	uint64_t seed = 42;
	char s[64];
	size_t i, j, n, len;
	int stop = 1;

	(void)state;
	tree_insert(t, "", 0, 9);
	for (i = 0; i < 300; i++) {
		n = 1 + rnd(&seed) % 12;
		for (len = 0, j = 0; j < n; j++) {
			const char *a = alphabet[rnd(&seed) % 3];
			memcpy(s + len, a, strlen(a));
			len += strlen(a);
		}
		assert_int_equal(tree_insert(t, s, len, rnd(&seed) % 5), 0);
		if (i % 3 == 0)
			tree_match(t, s, len / 2, &m1);
	}
	assert_int_equal(tree_check(t), 0);
	assert_int_equal(tree_dump(t, dump_collect, &d1), 0);
	assert_int_equal(d1.dl_recs[0].dr_len, 0); /* root tenants first */
	u = tree_new(TREE_STRING, 400, 1);
	rebuild(u, &d1);
	assert_int_equal(tree_check(u), 0);
	assert_int_equal(tree_size(u), tree_size(t));
	assert_int_equal(tree_tenants(u), tree_tenants(t));
	/* Same pairs in the same recency order. */
	assert_int_equal(tree_dump(u, dump_collect, &d2), 0);
	assert_int_equal(d2.dl_n, d1.dl_n);
	for (i = 0; i < d1.dl_n; i++) {
		assert_int_equal(d1.dl_recs[i].dr_tenant,
		    d2.dl_recs[i].dr_tenant);
		assert_int_equal(d1.dl_recs[i].dr_len, d2.dl_recs[i].dr_len);
		assert_memory_equal(d1.dl_recs[i].dr_key, d2.dl_recs[i].dr_key,
		    d1.dl_recs[i].dr_len);
	}
	/* Same answers. */
	for (i = 0; i < d1.dl_n; i++) {
		tree_match(t, d1.dl_recs[i].dr_key, d1.dl_recs[i].dr_len, &m1);
		tree_match(u, d1.dl_recs[i].dr_key, d1.dl_recs[i].dr_len, &m2);
		assert_int_equal(m1.tm_matched, m2.tm_matched);
		assert_int_equal(m1.tm_total, m2.tm_total);
		for (j = 0; j < 10; j++)
			assert_int_equal(tree_match_holds(&m1, j),
			    tree_match_holds(&m2, j));
	}
	/* The callback can stop the dump. */
	assert_int_equal(tree_dump(u, dump_stop, &stop), -1);
	dump_list_free(&d1);
	dump_list_free(&d2);
	tree_free(u);
	tree_free(t);

	/* Token tree round trip. */
	t = tree_new(TREE_TOKEN, BIG, 2);
	d1.dl_unit = d2.dl_unit = sizeof(uint32_t);
	for (i = 0; i < 200; i++) {
		uint32_t tok[16];
		n = rnd(&seed) % 16;
		for (j = 0; j < n; j++)
			tok[j] = (uint32_t)(rnd(&seed) % 3);
		assert_int_equal(tree_insert_tokens(t, tok, n, i % 4), 0);
	}
	assert_int_equal(tree_dump(t, dump_collect, &d1), 0);
	u = tree_new(TREE_TOKEN, BIG, 2);
	rebuild(u, &d1);
	assert_int_equal(tree_size(u), tree_size(t));
	assert_int_equal(tree_check(u), 0);
	assert_int_equal(tree_dump(u, dump_collect, &d2), 0);
	assert_int_equal(d2.dl_n, d1.dl_n);
	dump_list_free(&d1);
	dump_list_free(&d2);
	tree_free(u);
	tree_free(t);
}

/* Reference size: per tenant, the distinct non-empty prefixes (in chars)
 * of its live strings; valid while nothing was evicted. */
static void
test_random_against_reference(void **state)
{
	enum { NSTR = 120, MAXC = 8 };
	struct tree *t = tree_new(TREE_STRING, BIG, 1);
	struct tree_match m;
	char str[NSTR][MAXC * 4 + 1];
	size_t blen[NSTR], clen[NSTR], ppos[NSTR][MAXC + 1];
	unsigned ten[NSTR];
	int live[NSTR];
	uint64_t seed = 7, size;
	size_t i, j, k, c, best, op;

	(void)state;
	memset(live, 0, sizeof(live));
	for (i = 0; i < NSTR; i++) {
		clen[i] = 1 + rnd(&seed) % MAXC;
		blen[i] = 0;
		ppos[i][0] = 0;
		for (j = 0; j < clen[i]; j++) {
			const char *a = alphabet[rnd(&seed) % 5];
			memcpy(str[i] + blen[i], a, strlen(a));
			blen[i] += strlen(a);
			ppos[i][j + 1] = blen[i];
		}
		ten[i] = (unsigned)(rnd(&seed) % 6);
	}
	for (op = 0; op < 2000; op++) {
		i = rnd(&seed) % NSTR;
		if (rnd(&seed) % 4 == 0) {
			/* Longest common prefix, in chars, with live strings.
			 */
			tree_match(t, str[i], blen[i], &m);
			for (best = 0, k = 0; k < NSTR; k++) {
				if (!live[k])
					continue;
				for (c = 0; c < clen[i] && c < clen[k] &&
				     ppos[i][c + 1] == ppos[k][c + 1] &&
				     memcmp(str[i], str[k], ppos[i][c + 1]) ==
				         0;
				     c++)
					;
				if (c > best)
					best = c;
			}
			assert_int_equal(m.tm_matched, best);
			assert_int_equal(m.tm_input, clen[i]);
			/* Every tenant with a string reaching the end of the
			 * match holds the node where it ended. */
			for (k = 0; k < NSTR && best > 0; k++)
				if (live[k] && clen[k] >= best &&
				    ppos[k][best] == ppos[i][best] &&
				    memcmp(str[k], str[i], ppos[i][best]) == 0)
					assert_true(
					    tree_match_holds(&m, ten[k]));
			continue;
		}
		if (rnd(&seed) % 10 == 0) {
			tree_remove_tenant(t, ten[i]);
			for (k = 0; k < NSTR; k++)
				if (ten[k] == ten[i])
					live[k] = 0;
		} else {
			assert_int_equal(
			    tree_insert(t, str[i], blen[i], ten[i]), 0);
			live[i] = 1;
		}
		/* Reference size. */
		for (size = 0, k = 0; k < NSTR; k++) {
			if (!live[k])
				continue;
			for (c = 1; c <= clen[k]; c++) {
				/* Count prefix c of k unless an earlier live
				 * string of the same tenant has it. */
				for (j = 0; j < k; j++)
					if (live[j] && ten[j] == ten[k] &&
					    clen[j] >= c &&
					    ppos[j][c] == ppos[k][c] &&
					    memcmp(str[j], str[k],
					        ppos[k][c]) == 0)
						break;
				if (j == k)
					size++;
			}
		}
		assert_int_equal(tree_size(t), size);
		if (op % 50 == 0)
			assert_int_equal(tree_check(t), 0);
	}
	assert_int_equal(tree_check(t), 0);
	/* Now shrink step by step: invariants hold during eviction. */
	while (tree_size(t) > 1) {
		tree_set_max_size(t, tree_size(t) - 1);
		assert_int_equal(tree_check(t), 0);
	}
	tree_free(t);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_shared_prefix),
		cmocka_unit_test(test_match_depth),
		cmocka_unit_test(test_utf8),
		cmocka_unit_test(test_holders),
		cmocka_unit_test(test_remove_tenant),
		cmocka_unit_test(test_token_paging),
		cmocka_unit_test(test_size_accounting),
		cmocka_unit_test(test_eviction_lru),
		cmocka_unit_test(test_hard_cap_flood),
		cmocka_unit_test(test_dump_rebuild),
		cmocka_unit_test(test_random_against_reference),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
