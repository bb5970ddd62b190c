/*
 * ring_test.c: the hash ring (policies.md §5.2), consistent_hashing's key
 * chain (§5.1) and prefix_hash's levels, load check and selection (§6).
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

#include "broker/ring.h"

#define NKEYS 10000

static const char *urls11[] = {
	"http://w0:8000",
	"http://w1:8000",
	"http://w2:8000",
	"http://w3:8000",
	"http://w4:8000",
	"http://w5:8000",
	"http://w6:8000",
	"http://w7:8000",
	"http://w8:8000",
	"http://w9:8000",
	"http://w10:8000",
};

/* Every member is a candidate; the position is the id. */
static int
all_candidate(void *arg, uint64_t id, const char *url)
{
	unsigned *calls = arg;

	(void)url;
	if (calls != NULL)
		(*calls)++;
	return (int)id;
}

/* Candidates: every id but the one in *arg. */
static int
all_but_candidate(void *arg, uint64_t id, const char *url)
{
	const uint64_t *skip = arg;

	(void)url;
	return id == *skip ? -1 : (int)id;
}

static struct ring *
make_ring(size_t n, const size_t *order)
{
	struct ring_node nodes[11];
	size_t i, k;

	for (i = 0; i < n; i++) {
		k = order != NULL ? order[i] : i;
		nodes[i].rn_url = urls11[k];
		nodes[i].rn_id = k;
	}
	return ring_new(nodes, n);
}

static int
lookup_str(struct ring *r, const char *key)
{
	return ring_lookup(r, key, strlen(key), all_candidate, NULL, NULL);
}

static void
test_determinism(void **state)
{
	static const size_t rev[] = { 9, 8, 7, 6, 5, 4, 3, 2, 1, 0 };
	static const size_t mix[] = { 3, 7, 0, 9, 1, 5, 2, 8, 4, 6 };
	struct ring *a, *b, *c;
	struct ring_node dup[3];
	char key[32];
	int i, pa;
	uint64_t id;

	(void)state;
	a = make_ring(10, NULL);
	b = make_ring(10, rev);
	c = make_ring(10, mix);
	assert_int_equal(ring_members(a), 10);
	for (i = 0; i < 2000; i++) {
		snprintf(key, sizeof(key), "key-%d", i);
		pa = lookup_str(a, key);
		assert_true(pa >= 0 && pa < 10);
		assert_int_equal(pa, lookup_str(b, key));
		assert_int_equal(pa, lookup_str(c, key));
		assert_int_equal(pa, lookup_str(a, key));
	}
	ring_free(a);
	ring_free(b);
	ring_free(c);

	/* Duplicate URLs count once and keep the first id. */
	dup[0].rn_url = "http://a";
	dup[0].rn_id = 7;
	dup[1].rn_url = "http://a";
	dup[1].rn_id = 8;
	dup[2].rn_url = "http://b";
	dup[2].rn_id = 9;
	a = ring_new(dup, 3);
	assert_int_equal(ring_members(a), 2);
	for (i = 0; i < 200; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		id = 0;
		assert_true(ring_lookup(a, key, strlen(key), all_candidate,
		                NULL, &id) >= 0);
		assert_true(id == 7 || id == 9);
	}
	ring_free(a);

	/* Empty and NULL rings find nothing. */
	a = ring_new(NULL, 0);
	assert_int_equal(ring_members(a), 0);
	assert_int_equal(lookup_str(a, "x"), -1);
	assert_int_equal(lookup_str(NULL, "x"), -1);
	ring_free(a);
	ring_free(NULL);
}

static void
test_movement(void **state)
{
	struct ring *r10, *r11, *back;
	static int before[NKEYS];
	char key[32];
	int i, after, moved = 0;

	(void)state;
	r10 = make_ring(10, NULL);
	r11 = make_ring(11, NULL);
	back = make_ring(10, NULL);
	for (i = 0; i < NKEYS; i++) {
		snprintf(key, sizeof(key), "session-%d", i);
		before[i] = lookup_str(r10, key);
		after = lookup_str(r11, key);
		if (after != before[i]) {
			/* Only keys the newcomer now owns move. */
			assert_int_equal(after, 10);
			moved++;
		}
	}
	/* Expected NKEYS / 11 = 909; 150 vnodes keep it well inside. */
	assert_in_range(moved, 600, 1250);
	/* Removing the 11th again: every key is back where it was. */
	for (i = 0; i < NKEYS; i++) {
		snprintf(key, sizeof(key), "session-%d", i);
		assert_int_equal(lookup_str(back, key), before[i]);
	}
	ring_free(r10);
	ring_free(r11);
	ring_free(back);
}

static void
test_candidate_skipping(void **state)
{
	static const size_t without3[] = { 0, 1, 2, 4, 5, 6, 7, 8, 9 };
	struct ring *r, *r9;
	struct ring_ids ids;
	uint64_t skip, id, list[2];
	unsigned calls;
	char key[32];
	int i, own;

	(void)state;
	r = make_ring(10, NULL);
	r9 = make_ring(9, without3);
	for (i = 0; i < 1000; i++) {
		snprintf(key, sizeof(key), "user-%d", i);
		/* Skipping a member gives what a ring without it gives. */
		skip = 3;
		assert_int_equal(ring_lookup(r, key, strlen(key),
		                     all_but_candidate, &skip, NULL),
		    lookup_str(r9, key));
		own = lookup_str(r, key);
		skip = (uint64_t)own;
		id = 99;
		assert_int_not_equal(ring_lookup(r, key, strlen(key),
		                         all_but_candidate, &skip, &id),
		    own);
		assert_true(id != (uint64_t)own && id < 10);
	}
	/* The callback runs at most once per URL, and for all when none
	 * is a candidate. */
	calls = 0;
	assert_true(ring_lookup(r, "abc", 3, all_candidate, &calls, NULL) >= 0);
	assert_int_equal(calls, 1);
	ids.ri_ids = list;
	ids.ri_n = 0;
	assert_int_equal(
	    ring_lookup(r, "abc", 3, ring_ids_candidate, &ids, NULL), -1);
	/* An id list maps the member to its position in the list. */
	list[0] = 42;
	list[1] = 5;
	ids.ri_n = 2;
	assert_int_equal(
	    ring_lookup(r, "abc", 3, ring_ids_candidate, &ids, &id), 1);
	assert_int_equal(id, 5);
	ring_free(r);
	ring_free(r9);
}

static void
test_wrap_around(void **state)
{
	struct ring *r;
	char name[64], key[32];
	uint64_t pos, maxpos = 0, minpos = UINT64_MAX, h;
	size_t u, v, minurl = 0;
	int i, found = 0;

	(void)state;
	r = make_ring(3, NULL);
	for (u = 0; u < 3; u++) {
		for (v = 0; v < RING_VNODES; v++) {
			snprintf(name, sizeof(name), "%s#%zu", urls11[u], v);
			pos = XXH3_64bits(name, strlen(name));
			if (pos > maxpos)
				maxpos = pos;
			if (pos < minpos) {
				minpos = pos;
				minurl = u;
			}
		}
	}
	for (i = 0; i < 200000 && found < 3; i++) {
		snprintf(key, sizeof(key), "wrap-%d", i);
		h = XXH3_64bits(key, strlen(key));
		/* Past the last vnode, or before the first: the first vnode's
		 * owner answers. */
		if (h > maxpos || h <= minpos) {
			assert_int_equal(lookup_str(r, key), (int)minurl);
			found++;
		}
	}
	assert_true(found > 0);
	ring_free(r);
}

static void
test_key_hex(void **state)
{
	char hex[RING_HEX_SIZE];

	(void)state;
	ring_key_hex(0, hex);
	assert_string_equal(hex, "0000000000000000");
	ring_key_hex(0xdeadbeefULL, hex);
	assert_string_equal(hex, "00000000deadbeef");
	ring_key_hex(UINT64_MAX, hex);
	assert_string_equal(hex, "ffffffffffffffff");
}

static uint32_t
rand_last(uint32_t n)
{
	return n - 1;
}

static void
test_ch_chain(void **state)
{
	struct ring_ch_input in;
	struct ring_ch_pick pk;
	struct ring *r;

	(void)state;
	r = make_ring(4, NULL);
	memset(&in, 0, sizeof(in));

	ring_ch_select(r, &in, 0, all_candidate, NULL, rand_last, &pk);
	assert_int_equal(pk.rcp_index, -1);
	assert_int_equal(pk.rcp_branch, RING_CH_NO_HEALTHY_WORKERS);

	/* 1: target worker index, never falls through. */
	in.rci_routing_key = "user-1";
	in.rci_target_worker = "2";
	ring_ch_select(r, &in, 4, all_candidate, NULL, rand_last, &pk);
	assert_int_equal(pk.rcp_index, 2);
	assert_int_equal(pk.rcp_branch, RING_CH_TARGET_WORKER_HIT);
	in.rci_target_worker = "+3";
	ring_ch_select(r, &in, 4, all_candidate, NULL, rand_last, &pk);
	assert_int_equal(pk.rcp_index, 3);
	in.rci_target_worker = "4";
	ring_ch_select(r, &in, 4, all_candidate, NULL, rand_last, &pk);
	assert_int_equal(pk.rcp_index, -1);
	assert_int_equal(pk.rcp_branch, RING_CH_TARGET_WORKER_MISS);
	in.rci_target_worker = "one";
	ring_ch_select(r, &in, 4, all_candidate, NULL, rand_last, &pk);
	assert_int_equal(pk.rcp_branch, RING_CH_TARGET_WORKER_MISS);
	in.rci_target_worker = "18446744073709551616";
	ring_ch_select(r, &in, 4, all_candidate, NULL, rand_last, &pk);
	assert_int_equal(pk.rcp_branch, RING_CH_TARGET_WORKER_MISS);
	in.rci_target_worker = "-1";
	ring_ch_select(r, &in, 4, all_candidate, NULL, rand_last, &pk);
	assert_int_equal(pk.rcp_branch, RING_CH_TARGET_WORKER_MISS);
	/* Empty or non-visible values do not count as the header. */
	in.rci_target_worker = "";
	ring_ch_select(r, &in, 4, all_candidate, NULL, rand_last, &pk);
	assert_int_equal(pk.rcp_branch, RING_CH_ROUTING_KEY_HIT);
	in.rci_target_worker = "1\x01";
	ring_ch_select(r, &in, 4, all_candidate, NULL, rand_last, &pk);
	assert_int_equal(pk.rcp_branch, RING_CH_ROUTING_KEY_HIT);
	in.rci_target_worker = NULL;

	/* 3: routing key on the ring. */
	ring_ch_select(r, &in, 4, all_candidate, NULL, rand_last, &pk);
	assert_int_equal(pk.rcp_branch, RING_CH_ROUTING_KEY_HIT);
	assert_string_equal(pk.rcp_key, "user-1");
	assert_int_equal(pk.rcp_index, lookup_str(r, "user-1"));

	/* 2: the rid key wins over the header key. */
	in.rci_rid_key = "conv123";
	ring_ch_select(r, &in, 4, all_candidate, NULL, rand_last, &pk);
	assert_string_equal(pk.rcp_key, "conv123");
	assert_int_equal(pk.rcp_index, lookup_str(r, "conv123"));
	in.rci_rid_key = NULL;
	in.rci_routing_key = NULL;

	/* 4: implicit key, first present header only. */
	in.rci_cookie = "session=abc";
	ring_ch_select(r, &in, 4, all_candidate, NULL, rand_last, &pk);
	assert_string_equal(pk.rcp_key, "session=abc");
	in.rci_forwarded_for = "10.0.0.1";
	ring_ch_select(r, &in, 4, all_candidate, NULL, rand_last, &pk);
	assert_string_equal(pk.rcp_key, "10.0.0.1");
	assert_int_equal(pk.rcp_index, lookup_str(r, "10.0.0.1"));
	in.rci_authorization = "Bearer sk-1";
	ring_ch_select(r, &in, 4, all_candidate, NULL, rand_last, &pk);
	assert_string_equal(pk.rcp_key, "Bearer sk-1");
	in.rci_authorization = "";
	ring_ch_select(r, &in, 4, all_candidate, NULL, rand_last, &pk);
	assert_null(pk.rcp_key);
	assert_int_equal(pk.rcp_branch, RING_CH_RANDOM_FALLBACK);
	in.rci_authorization = "caf\xc3\xa9";
	ring_ch_select(r, &in, 4, all_candidate, NULL, rand_last, &pk);
	assert_int_equal(pk.rcp_branch, RING_CH_RANDOM_FALLBACK);
	/* 5: random fallback draws from rnd. */
	assert_int_equal(pk.rcp_index, 3);

	/* A key with no candidate on the ring: nothing. */
	in.rci_authorization = NULL;
	in.rci_routing_key = "user-1";
	ring_ch_select(NULL, &in, 4, all_candidate, NULL, rand_last, &pk);
	assert_int_equal(pk.rcp_index, -1);
	assert_int_equal(pk.rcp_branch, RING_CH_NO_HEALTHY_WORKERS);
	assert_string_equal(ring_ch_branch_name(RING_CH_ROUTING_KEY_HIT),
	    "routing_key_hit");
	assert_string_equal(ring_ch_branch_name(RING_CH_TARGET_WORKER_MISS),
	    "target_worker_miss");
	ring_free(r);
}

static uint64_t
hash_tokens(const uint32_t *t, size_t n)
{
	static unsigned char buf[4 * 8192];
	size_t i;

	assert_true(n <= 8192);
	for (i = 0; i < n; i++) {
		buf[4 * i] = (unsigned char)t[i];
		buf[4 * i + 1] = (unsigned char)(t[i] >> 8);
		buf[4 * i + 2] = (unsigned char)(t[i] >> 16);
		buf[4 * i + 3] = (unsigned char)(t[i] >> 24);
	}
	return XXH3_64bits(buf, 4 * n);
}

static void
test_levels_tokens(void **state)
{
	static uint32_t tok[17000], other[3048];
	static const uint32_t b1[] = { 2048, 8192 }, b2[] = { 16, 64 };
	struct ring_level lv[RING_PREFIX_MAX_LEVELS],
	    lv2[RING_PREFIX_MAX_LEVELS];
	struct ring_prefix_conf c;
	struct ring_prefix_input in;
	size_t i, n;

	(void)state;
	for (i = 0; i < 17000; i++)
		tok[i] = (uint32_t)(i * 2654435761u);
	memcpy(other, tok, sizeof(other));
	ring_prefix_conf_default(&c);
	memset(&in, 0, sizeof(in));
	in.rpi_tokens = tok;

	/* No boundaries: the first min(len, 256) ids. */
	in.rpi_ntokens = 300;
	n = ring_prefix_levels(&c, &in, lv);
	assert_int_equal(n, 1);
	assert_int_equal(lv[0].rl_kind, RING_LEVEL_TOKENS);
	assert_int_equal(lv[0].rl_depth, 256);
	assert_false(lv[0].rl_boundary);
	assert_true(lv[0].rl_hash == hash_tokens(tok, 256));
	in.rpi_ntokens = 10;
	n = ring_prefix_levels(&c, &in, lv);
	assert_int_equal(n, 1);
	assert_true(lv[0].rl_hash == hash_tokens(tok, 10));

	/* B = {2048, 8192}: a 3048-token turn and its 17000-token
	 * follow-up co-hash at 2048. */
	c.rpc_boundaries = b1;
	c.rpc_nboundaries = 2;
	in.rpi_tokens = other;
	in.rpi_ntokens = 3048;
	n = ring_prefix_levels(&c, &in, lv);
	assert_int_equal(n, 1);
	assert_int_equal(lv[0].rl_depth, 2048);
	assert_true(lv[0].rl_boundary);
	in.rpi_tokens = tok;
	in.rpi_ntokens = 17000;
	n = ring_prefix_levels(&c, &in, lv2);
	assert_int_equal(n, 2);
	assert_int_equal(lv2[0].rl_depth, 8192);
	assert_int_equal(lv2[1].rl_depth, 2048);
	assert_true(lv2[1].rl_hash == lv[0].rl_hash);
	assert_true(lv2[0].rl_hash == hash_tokens(tok, 8192));

	/* B = {16, 64}: 63 tokens key at 16; shorter than 16: fixed depth. */
	c.rpc_boundaries = b2;
	in.rpi_ntokens = 63;
	n = ring_prefix_levels(&c, &in, lv);
	assert_int_equal(n, 1);
	assert_int_equal(lv[0].rl_depth, 16);
	assert_true(lv[0].rl_hash == hash_tokens(tok, 16));
	in.rpi_ntokens = 64;
	n = ring_prefix_levels(&c, &in, lv);
	assert_int_equal(n, 2);
	assert_true(lv[0].rl_hash == hash_tokens(tok, 64));
	assert_true(lv[1].rl_hash == hash_tokens(tok, 16));
	in.rpi_ntokens = 15;
	n = ring_prefix_levels(&c, &in, lv);
	assert_int_equal(n, 1);
	assert_int_equal(lv[0].rl_depth, 15);
	assert_false(lv[0].rl_boundary);
	assert_true(lv[0].rl_hash == hash_tokens(tok, 15));
}

static void
test_levels_many_boundaries(void **state)
{
	static uint32_t tok[100], bounds[40];
	struct ring_level lv[RING_PREFIX_MAX_LEVELS];
	struct ring_prefix_conf c;
	struct ring_prefix_input in;
	size_t i, n;

	(void)state;
	for (i = 0; i < 100; i++)
		tok[i] = (uint32_t)i;
	for (i = 0; i < 40; i++)
		bounds[i] = (uint32_t)(i + 1);
	ring_prefix_conf_default(&c);
	c.rpc_boundaries = bounds;
	c.rpc_nboundaries = 40;
	memset(&in, 0, sizeof(in));
	in.rpi_tokens = tok;
	in.rpi_ntokens = 100;
	n = ring_prefix_levels(&c, &in, lv);
	assert_int_equal(n, RING_PREFIX_MAX_LEVELS);
	/* The deepest are kept, deepest first. */
	for (i = 0; i < n; i++) {
		assert_int_equal(lv[i].rl_depth, 40 - i);
		assert_true(lv[i].rl_hash == hash_tokens(tok, 40 - i));
	}
}

static void
test_levels_text_and_key(void **state)
{
	/* 10 chars: h, e-acute (2 bytes), l, l, o, space, emoji (4 bytes),
	 * w, o, r. */
	static const char text[] = "h\xc3\xa9llo \xf0\x9f\x98\x80wor";
	static const uint32_t b[] = { 1, 2, 3 };
	struct ring_level lv[RING_PREFIX_MAX_LEVELS];
	struct ring_prefix_conf c;
	struct ring_prefix_input in;
	size_t n;

	(void)state;
	ring_prefix_conf_default(&c);
	memset(&in, 0, sizeof(in));
	in.rpi_text = text;
	in.rpi_text_len = strlen(text);

	/* Fixed depth 4 * 256 chars: the whole text. */
	n = ring_prefix_levels(&c, &in, lv);
	assert_int_equal(n, 1);
	assert_int_equal(lv[0].rl_kind, RING_LEVEL_TEXT);
	assert_int_equal(lv[0].rl_depth, 10);
	assert_true(lv[0].rl_hash == XXH3_64bits(text, strlen(text)));

	/* Fixed depth 4 chars (count 1): cut after "h\xc3\xa9ll". */
	c.rpc_prefix_token_count = 1;
	n = ring_prefix_levels(&c, &in, lv);
	assert_int_equal(n, 1);
	assert_int_equal(lv[0].rl_depth, 4);
	assert_true(lv[0].rl_hash == XXH3_64bits(text, 5));

	/* Boundaries {1,2,3}: 4 and 8 chars reached, 12 not. 8 chars end
	 * after the 4-byte emoji and "w". */
	c.rpc_boundaries = b;
	c.rpc_nboundaries = 3;
	n = ring_prefix_levels(&c, &in, lv);
	assert_int_equal(n, 2);
	assert_int_equal(lv[0].rl_depth, 8);
	assert_true(lv[0].rl_boundary);
	assert_true(lv[0].rl_hash == XXH3_64bits(text, 12));
	assert_int_equal(lv[1].rl_depth, 4);
	assert_true(lv[1].rl_hash == XXH3_64bits(text, 5));

	/* Empty token list falls through to text. */
	in.rpi_tokens = b;
	in.rpi_ntokens = 0;
	assert_int_equal(ring_prefix_levels(&c, &in, lv), 2);

	/* A routing key wins, one level, boundaries ignored. */
	in.rpi_routing_key = "tenant-7";
	in.rpi_routing_key_len = 8;
	n = ring_prefix_levels(&c, &in, lv);
	assert_int_equal(n, 1);
	assert_int_equal(lv[0].rl_kind, RING_LEVEL_ROUTING_KEY);
	assert_true(lv[0].rl_hash == XXH3_64bits("tenant-7", 8));

	/* Nothing at all: no level. */
	memset(&in, 0, sizeof(in));
	in.rpi_text = "";
	assert_int_equal(ring_prefix_levels(&c, &in, lv), 0);
}

static void
test_acceptable(void **state)
{
	struct ring_prefix_conf c;

	(void)state;
	ring_prefix_conf_default(&c);
	/* abs 0, L=100, 4 workers: avg 25.25, threshold 31.5625. */
	c.rpc_abs_threshold = 0;
	assert_true(ring_prefix_acceptable(&c, 30, 100, 4));
	assert_true(ring_prefix_acceptable(&c, 31, 100, 4));
	assert_false(ring_prefix_acceptable(&c, 32, 100, 4));
	assert_false(ring_prefix_acceptable(&c, 35, 100, 4));
	/* abs 10, L=100: max(31.5625, 35.25). */
	c.rpc_abs_threshold = 10;
	assert_true(ring_prefix_acceptable(&c, 35, 100, 4));
	assert_false(ring_prefix_acceptable(&c, 36, 100, 4));
	/* abs 10, L=40: avg 10.25, threshold 20.25. */
	assert_true(ring_prefix_acceptable(&c, 13, 40, 4));
	assert_true(ring_prefix_acceptable(&c, 20, 40, 4));
	assert_false(ring_prefix_acceptable(&c, 21, 40, 4));
	/* abs 10, L=800: avg 200.25, threshold 250.3125. */
	assert_true(ring_prefix_acceptable(&c, 240, 800, 4));
	assert_true(ring_prefix_acceptable(&c, 250, 800, 4));
	assert_false(ring_prefix_acceptable(&c, 251, 800, 4));
	assert_false(ring_prefix_acceptable(&c, 260, 800, 4));
	/* L=0: always. */
	assert_true(ring_prefix_acceptable(&c, 0, 0, 4));
	assert_true(ring_prefix_acceptable(&c, 1000, 0, 4));
}

/* A key whose first-choice worker on r is want (level hash search). */
static uint64_t
level_hash_owned_by(struct ring *r, int want, int skip_first)
{
	char hex[RING_HEX_SIZE];
	uint64_t h;
	int i;

	for (i = 0; i < 100000; i++) {
		h = XXH3_64bits(&i, sizeof(i));
		ring_key_hex(h, hex);
		if (lookup_str(r, hex) == want && skip_first-- <= 0)
			return h;
	}
	fail();
	return 0;
}

static void
test_prefix_select(void **state)
{
	struct ring_prefix_conf c;
	struct ring_prefix_pick pk;
	struct ring_level lv[2];
	struct ring *r;
	uint64_t loads[4] = { 0, 0, 0, 0 }, skip;

	(void)state;
	ring_prefix_conf_default(&c);
	r = make_ring(4, NULL);
	memset(lv, 0, sizeof(lv));

	ring_prefix_select(r, &c, lv, 1, loads, 0, all_candidate, NULL, &pk);
	assert_int_equal(pk.rpp_index, -1);
	assert_int_equal(pk.rpp_branch, RING_PREFIX_NO_HEALTHY_WORKERS);

	/* No key: fewest in-flight, ties to the first. */
	loads[0] = 3;
	loads[1] = 1;
	loads[2] = 1;
	loads[3] = 2;
	ring_prefix_select(r, &c, lv, 0, loads, 4, all_candidate, NULL, &pk);
	assert_int_equal(pk.rpp_index, 1);
	assert_int_equal(pk.rpp_branch, RING_PREFIX_NO_ROUTING_KEY);

	/* Deepest level's target acceptable: ring_hit at level 0. */
	lv[0].rl_hash = level_hash_owned_by(r, 2, 0);
	lv[1].rl_hash = level_hash_owned_by(r, 0, 0);
	ring_prefix_select(r, &c, lv, 2, loads, 4, all_candidate, NULL, &pk);
	assert_int_equal(pk.rpp_index, 2);
	assert_int_equal(pk.rpp_level, 0);
	assert_int_equal(pk.rpp_branch, RING_PREFIX_RING_HIT);

	/* Deepest target overloaded, shallower one fine: ring_hit at 1.
	 * L=100, 4 workers, abs 10: threshold 35.25. */
	loads[0] = 30;
	loads[1] = 20;
	loads[2] = 40;
	loads[3] = 10;
	ring_prefix_select(r, &c, lv, 2, loads, 4, all_candidate, NULL, &pk);
	assert_int_equal(pk.rpp_index, 0);
	assert_int_equal(pk.rpp_level, 1);
	assert_int_equal(pk.rpp_branch, RING_PREFIX_RING_HIT);

	/* Every target overloaded: least-loaded acceptable candidate. */
	loads[0] = 36;
	loads[1] = 14;
	loads[2] = 40;
	loads[3] = 10;
	ring_prefix_select(r, &c, lv, 2, loads, 4, all_candidate, NULL, &pk);
	assert_int_equal(pk.rpp_index, 3);
	assert_int_equal(pk.rpp_level, 0);
	assert_int_equal(pk.rpp_branch, RING_PREFIX_LOAD_BALANCE_WALK);

	/* No acceptable candidate at all (only reachable with a negative
	 * absolute part): the deepest target anyway. */
	c.rpc_abs_threshold = -100;
	c.rpc_load_factor = 0.1;
	ring_prefix_select(r, &c, lv, 2, loads, 4, all_candidate, NULL, &pk);
	assert_int_equal(pk.rpp_index, 2);
	assert_int_equal(pk.rpp_branch, RING_PREFIX_LOAD_BALANCE_WALK);
	ring_prefix_conf_default(&c);

	/* No ring, or no target among the candidates: least loaded. */
	ring_prefix_select(NULL, &c, lv, 2, loads, 4, all_candidate, NULL, &pk);
	assert_int_equal(pk.rpp_index, 3);
	assert_int_equal(pk.rpp_branch, RING_PREFIX_FALLBACK_LEAST_LOAD);
	ring_prefix_select(r, &c, lv, 2, loads, 4, ring_ids_candidate,
	    &(struct ring_ids) { .ri_ids = NULL, .ri_n = 0 }, &pk);
	assert_int_equal(pk.rpp_branch, RING_PREFIX_FALLBACK_LEAST_LOAD);

	/* A skipped (non-candidate) owner walks on to the next URL. */
	skip = 2;
	loads[0] = loads[1] = loads[2] = loads[3] = 0;
	ring_prefix_select(r, &c, lv, 1, loads, 4, all_but_candidate, &skip,
	    &pk);
	assert_int_equal(pk.rpp_branch, RING_PREFIX_RING_HIT);
	assert_int_not_equal(pk.rpp_index, 2);
	assert_string_equal(ring_prefix_branch_name(RING_PREFIX_RING_HIT),
	    "ring_hit");
	assert_string_equal(
	    ring_prefix_branch_name(RING_PREFIX_FALLBACK_LEAST_LOAD),
	    "fallback_least_load");
	ring_free(r);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_determinism),
		cmocka_unit_test(test_movement),
		cmocka_unit_test(test_candidate_skipping),
		cmocka_unit_test(test_wrap_around),
		cmocka_unit_test(test_key_hex),
		cmocka_unit_test(test_ch_chain),
		cmocka_unit_test(test_levels_tokens),
		cmocka_unit_test(test_levels_many_boundaries),
		cmocka_unit_test(test_levels_text_and_key),
		cmocka_unit_test(test_acceptable),
		cmocka_unit_test(test_prefix_select),
	};

	log_init("ring_test", LOG_LEVEL_WARN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
