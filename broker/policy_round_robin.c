/*
 * policy_round_robin.c: `round_robin` (policies.md §9). One rotation
 * counter per candidate set, keyed by the ordered list of candidate URLs
 * (XXH3 over the URL hashes); the sets live in an LRU of
 * BROKER_RR_MAX_SETS, so a set that comes back resumes its counter.
 */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "shared/xmalloc.h"

#include "broker.h"

#define RR_BUCKETS (BROKER_RR_MAX_SETS * 2)

struct rr_set {
	uint64_t rs_key;
	uint64_t rs_counter;
	uint64_t rs_used; /* LRU clock at last use */
	int rs_next; /* chain in rr_buckets, -1 end */
};

struct rr_state {
	struct rr_set rr_sets[BROKER_RR_MAX_SETS];
	int rr_buckets[RR_BUCKETS];
	unsigned rr_n;
	uint64_t rr_clock;
};

static void *rr_new(bool builtin_defaults);
static void rr_free(void *state);
static int rr_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req);
static uint64_t rr_key(struct worker *const *c, unsigned n);
static struct rr_set *rr_lookup(struct rr_state *rr, uint64_t key, bool create);
static void rr_unlink(struct rr_state *rr, int idx);

const struct policy_ops policy_round_robin_ops = {
	.po_kind = POLICY_ROUND_ROBIN,
	.po_new = rr_new,
	.po_free = rr_free,
	.po_select = rr_select,
};

static void *
rr_new(bool builtin_defaults)
{
	struct rr_state *rr;
	unsigned i;

	(void)builtin_defaults;
	rr = xcalloc(1, sizeof(*rr));
	for (i = 0; i < RR_BUCKETS; i++)
		rr->rr_buckets[i] = -1;
	return rr;
}

static void
rr_free(void *state)
{
	free(state);
}

static uint64_t
rr_key(struct worker *const *c, unsigned n)
{
	uint64_t h[SHM_MAX_WORKERS];
	unsigned i;

	if (n > SHM_MAX_WORKERS)
		n = SHM_MAX_WORKERS;
	for (i = 0; i < n; i++)
		h[i] = c[i]->wk_url_hash;
	return XXH3_64bits(h, n * sizeof(h[0]));
}

static void
rr_unlink(struct rr_state *rr, int idx)
{
	int *pp = &rr->rr_buckets[rr->rr_sets[idx].rs_key % RR_BUCKETS];

	while (*pp != -1) {
		if (*pp == idx) {
			*pp = rr->rr_sets[idx].rs_next;
			return;
		}
		pp = &rr->rr_sets[*pp].rs_next;
	}
}

static struct rr_set *
rr_lookup(struct rr_state *rr, uint64_t key, bool create)
{
	unsigned b = (unsigned)(key % RR_BUCKETS), i;
	int idx;

	for (idx = rr->rr_buckets[b]; idx != -1;
	     idx = rr->rr_sets[idx].rs_next) {
		if (rr->rr_sets[idx].rs_key == key)
			return &rr->rr_sets[idx];
	}
	if (!create)
		return NULL;
	if (rr->rr_n < BROKER_RR_MAX_SETS) {
		idx = (int)rr->rr_n++;
	} else {
		/* Evict the least recently used set (new sets are rare). */
		idx = 0;
		for (i = 1; i < BROKER_RR_MAX_SETS; i++) {
			if (rr->rr_sets[i].rs_used < rr->rr_sets[idx].rs_used)
				idx = (int)i;
		}
		rr_unlink(rr, idx);
	}
	rr->rr_sets[idx].rs_key = key;
	rr->rr_sets[idx].rs_counter = 0;
	rr->rr_sets[idx].rs_next = rr->rr_buckets[b];
	rr->rr_buckets[b] = idx;
	return &rr->rr_sets[idx];
}

static int
rr_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req)
{
	struct rr_state *rr = p->pl_state;
	struct rr_set *s;
	int pick;

	(void)req;
	s = rr_lookup(rr, rr_key(c, n), true);
	s->rs_used = ++rr->rr_clock;
	pick = (int)(s->rs_counter % n);
	s->rs_counter++;
	return pick;
}

uint64_t
policy_round_robin_counter(void *state, struct worker *const *c, unsigned n)
{
	struct rr_set *s = rr_lookup(state, rr_key(c, n), false);

	return s != NULL ? s->rs_counter : 0;
}
