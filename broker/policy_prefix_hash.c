/*
 * policy_prefix_hash.c: `prefix_hash` (policies.md §6): key levels from
 * the routing key, tokens or text (ring_prefix_levels), the ring target
 * per level with the load check and the walk (ring_prefix_select) on the
 * per-model rings of rings.c; branch counter
 * smg_prefix_hash_policy_branch_total.
 */
#include <stdlib.h>
#include <string.h>

#include "shared/log.h"
#include "shared/metrics.h"
#include "shared/xmalloc.h"

#include "broker.h"
#include "ring.h"

#define PH_NBRANCHES 5

struct phash {
	struct rings *ph_rings;
	struct ring_prefix_conf ph_conf;
	uint32_t *ph_boundaries; /* owned copy */
	int ph_m_branch[PH_NBRANCHES]; /* series, -2 not yet */
};

static void *phash_create(struct policy *p);
static void phash_free(void *state);
static int phash_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req);
static void phash_changed(struct policy *p, struct worker *w);

const struct policy_ops policy_prefix_hash_ops = {
	.po_kind = POLICY_PREFIX_HASH,
	.po_create = phash_create,
	.po_free = phash_free,
	.po_select = phash_select,
	.po_on_add = phash_changed,
	.po_on_remove = phash_changed,
};

static void *
phash_create(struct policy *p)
{
	const struct config *cf = p->pl_br != NULL ? p->pl_br->br_cf : NULL;
	struct phash *ph = xcalloc(1, sizeof(*ph));
	unsigned i;

	ph->ph_rings = rings_new();
	ring_prefix_conf_default(&ph->ph_conf);
	/* Label-created instances keep the built-in defaults (§13). */
	if (cf != NULL && !p->pl_builtin) {
		if (cf->cf_prefix_token_count > 0)
			ph->ph_conf.rpc_prefix_token_count =
			    cf->cf_prefix_token_count;
		if (cf->cf_prefix_hash_load_factor >= 1.0)
			ph->ph_conf.rpc_load_factor =
			    cf->cf_prefix_hash_load_factor;
		ph->ph_conf.rpc_abs_threshold =
		    (double)cf->cf_prefix_hash_balance_abs_threshold;
		if (cf->cf_cache_boundaries_n > 0) {
			ph->ph_boundaries = xcalloc(cf->cf_cache_boundaries_n,
			    sizeof(*ph->ph_boundaries));
			memcpy(ph->ph_boundaries, cf->cf_cache_boundaries,
			    cf->cf_cache_boundaries_n *
			        sizeof(*ph->ph_boundaries));
			ph->ph_conf.rpc_boundaries = ph->ph_boundaries;
			ph->ph_conf.rpc_nboundaries = cf->cf_cache_boundaries_n;
		}
	}
	for (i = 0; i < PH_NBRANCHES; i++)
		ph->ph_m_branch[i] = -2;
	return ph;
}

static void
phash_free(void *state)
{
	struct phash *ph = state;

	if (ph == NULL)
		return;
	rings_free(ph->ph_rings);
	free(ph->ph_boundaries);
	free(ph);
}

static void
phash_changed(struct policy *p, struct worker *w)
{
	struct phash *ph = p->pl_state;

	(void)w;
	rings_invalidate(ph->ph_rings);
}

static int
phash_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req)
{
	struct phash *ph = p->pl_state;
	struct broker *br = p->pl_br;
	struct ring_level levels[RING_PREFIX_MAX_LEVELS];
	struct ring_prefix_input in;
	struct ring_prefix_pick pick;
	uint64_t loads[SHM_MAX_WORKERS];
	struct ring *r;
	size_t nl;
	unsigned i;

	if (br == NULL)
		return n > 0 ? 0 : -1;
	memset(&in, 0, sizeof(in));
	if (req->routing_key != NULL && req->routing_key[0] != '\0') {
		in.rpi_routing_key = req->routing_key;
		in.rpi_routing_key_len = strlen(req->routing_key);
	}
	if (req->has_tokens && req->n_tokens > 0) {
		in.rpi_tokens = req->tokens;
		in.rpi_ntokens = req->n_tokens;
	}
	if (req->has_text && req->text != NULL) {
		in.rpi_text = req->text;
		in.rpi_text_len = strlen(req->text);
	}
	nl = ring_prefix_levels(&ph->ph_conf, &in, levels);
	for (i = 0; i < n && i < SHM_MAX_WORKERS; i++)
		loads[i] = live_in_flight(br, c[i]);
	r = nl > 0 ? rings_for(ph->ph_rings, br, req->model) : NULL;
	rings_mark(c, n);
	ring_prefix_select(r, &ph->ph_conf, levels, nl, loads, n,
	    rings_candidate, NULL, &pick);
	rings_unmark(c, n);
	if ((unsigned)pick.rpp_branch < PH_NBRANCHES) {
		if (ph->ph_m_branch[pick.rpp_branch] == -2)
			ph->ph_m_branch[pick.rpp_branch] =
			    stats_series(br, METRICS_COUNTER,
			        "smg_prefix_hash_policy_branch_total",
			        "branch=\"%s\"",
			        ring_prefix_branch_name(pick.rpp_branch));
		stats_add(br, ph->ph_m_branch[pick.rpp_branch], 1);
	}
	if (br->br_debug)
		log_debug("%s: prefix_hash level %d (%s, depth %llu) branch "
		          "%s -> %s",
		    __func__, pick.rpp_level,
		    pick.rpp_level >= 0
		        ? (levels[pick.rpp_level].rl_boundary ? "boundary"
		                                              : "fixed")
		        : "-",
		    pick.rpp_level >= 0
		        ? (unsigned long long)levels[pick.rpp_level].rl_depth
		        : 0ULL,
		    ring_prefix_branch_name(pick.rpp_branch),
		    pick.rpp_index >= 0 ? c[pick.rpp_index]->wk_url : "none");
	return pick.rpp_index;
}
