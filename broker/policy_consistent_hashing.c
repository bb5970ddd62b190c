/*
 * policy_consistent_hashing.c: `consistent_hashing` (policies.md §5): the
 * key chain of ring.h's ring_ch_select on the per-model rings of rings.c,
 * rebuilt after every worker add or remove; branch counter
 * smg_consistent_hashing_policy_branch_total.
 */
#include <stdlib.h>
#include <string.h>

#include "shared/log.h"
#include "shared/metrics.h"
#include "shared/xmalloc.h"

#include "broker.h"
#include "ring.h"

#define CH_NBRANCHES 5

struct chash {
	struct rings *ch_rings;
	int ch_m_branch[CH_NBRANCHES]; /* series, -2 not yet */
};

static void *chash_create(struct policy *p);
static void chash_free(void *state);
static int chash_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req);
static void chash_changed(struct policy *p, struct worker *w);

const struct policy_ops policy_consistent_hashing_ops = {
	.po_kind = POLICY_CONSISTENT_HASHING,
	.po_create = chash_create,
	.po_free = chash_free,
	.po_select = chash_select,
	.po_on_add = chash_changed,
	.po_on_remove = chash_changed,
};

static void *
chash_create(struct policy *p)
{
	struct chash *ch = xcalloc(1, sizeof(*ch));
	unsigned i;

	(void)p;
	ch->ch_rings = rings_new();
	for (i = 0; i < CH_NBRANCHES; i++)
		ch->ch_m_branch[i] = -2;
	return ch;
}

static void
chash_free(void *state)
{
	struct chash *ch = state;

	if (ch == NULL)
		return;
	rings_free(ch->ch_rings);
	free(ch);
}

static void
chash_changed(struct policy *p, struct worker *w)
{
	struct chash *ch = p->pl_state;

	(void)w;
	rings_invalidate(ch->ch_rings);
}

static int
chash_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req)
{
	struct chash *ch = p->pl_state;
	struct broker *br = p->pl_br;
	const struct config *cf;
	struct ring_ch_input in;
	struct ring_ch_pick pick;
	struct ring *r;
	char stripped[STICKY_KEY_MAX];
	bool over;

	if (br == NULL)
		return n > 0 ? (int)policy_rand_below(n) : -1;
	cf = br->br_cf;
	over = cf->cf_routing_key_override;
	memset(&in, 0, sizeof(in));
	if (req->has_target_worker)
		in.rci_target_worker = req->target_worker;
	if (over && req->rid_key != NULL && req->rid_key[0] != '\0')
		in.rci_rid_key = req->rid_key;
	if (req->routing_key != NULL && req->routing_key[0] != '\0')
		in.rci_routing_key = over
		    ? sticky_strip(req->routing_key, stripped, sizeof(stripped))
		    : req->routing_key;
	/* The frontend sends the first present implicit-key header only. */
	if (req->has_implicit_key)
		in.rci_authorization =
		    req->implicit_key != NULL ? req->implicit_key : "";
	r = rings_for(ch->ch_rings, br, req->model);
	rings_mark(c, n);
	ring_ch_select(r, &in, n, rings_candidate, NULL, policy_rand_below,
	    &pick);
	rings_unmark(c, n);
	if ((unsigned)pick.rcp_branch < CH_NBRANCHES) {
		if (ch->ch_m_branch[pick.rcp_branch] == -2)
			ch->ch_m_branch[pick.rcp_branch] =
			    stats_series(br, METRICS_COUNTER,
			        "smg_consistent_hashing_policy_branch_total",
			        "branch=\"%s\"",
			        ring_ch_branch_name(pick.rcp_branch));
		stats_add(br, ch->ch_m_branch[pick.rcp_branch], 1);
	}
	if (br->br_debug)
		log_debug("%s: branch %s key %s -> %s", __func__,
		    ring_ch_branch_name(pick.rcp_branch),
		    pick.rcp_key != NULL ? pick.rcp_key : "-",
		    pick.rcp_index >= 0 ? c[pick.rcp_index]->wk_url : "none");
	return pick.rcp_index;
}
