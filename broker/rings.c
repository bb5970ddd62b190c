/*
 * rings.c: the per-model hash rings of policies.md §5.2 that
 * consistent_hashing and prefix_hash look keys up on: one ring per model
 * over all its registered workers, plus the wildcard ring over every
 * registered worker for model-less requests. A policy instance owns one
 * set; membership changes only mark it stale and the ring of a model is
 * rebuilt at its next lookup. Ring member ids are worker slots.
 */
#include <stdlib.h>
#include <string.h>

#include "shared/xmalloc.h"

#include "broker.h"
#include "ring.h"

struct rings_entry {
	char *re_model; /* NULL: the wildcard ring */
	struct ring *re_ring;
	uint64_t re_epoch;
};

struct rings {
	struct rings_entry *rs_v;
	unsigned rs_n;
	uint64_t rs_epoch; /* bumped on every membership change */
};

/* Candidate position by slot for the lookup in progress, -1 elsewhere. */
static int rings_pos[SHM_MAX_WORKERS];
static bool rings_pos_ready;

static struct ring *rings_build(struct broker *br, struct model_entry *me);

struct rings *
rings_new(void)
{
	return xcalloc(1, sizeof(struct rings));
}

void
rings_free(struct rings *rs)
{
	unsigned i;

	if (rs == NULL)
		return;
	for (i = 0; i < rs->rs_n; i++) {
		ring_free(rs->rs_v[i].re_ring);
		free(rs->rs_v[i].re_model);
	}
	free(rs->rs_v);
	free(rs);
}

void
rings_invalidate(struct rings *rs)
{
	rs->rs_epoch++;
}

static struct ring *
rings_build(struct broker *br, struct model_entry *me)
{
	struct ring_node *nodes;
	struct worker *const *ws = me != NULL ? me->me_workers : br->br_order;
	unsigned i, n = me != NULL ? me->me_n : br->br_nworkers;
	struct ring *r;

	nodes = xcalloc(n ? n : 1, sizeof(*nodes));
	for (i = 0; i < n; i++) {
		nodes[i].rn_url = ws[i]->wk_url;
		nodes[i].rn_id = ws[i]->wk_slot;
	}
	r = ring_new(nodes, n);
	free(nodes);
	return r;
}

struct ring *
rings_for(struct rings *rs, struct broker *br, const char *model)
{
	struct model_entry *me = NULL;
	struct rings_entry *e = NULL;
	unsigned i;

	if (model != NULL && *model != '\0' &&
	    strcmp(model, BROKER_MODEL_UNKNOWN) != 0) {
		for (i = 0; i < br->br_nmodels; i++) {
			if (strcmp(br->br_models[i]->me_name, model) == 0) {
				me = br->br_models[i];
				break;
			}
		}
	}
	/* One model only: its ring is the wildcard ring (§5.2). */
	if (me != NULL && br->br_nmodels == 1)
		me = NULL;
	for (i = 0; i < rs->rs_n; i++) {
		if ((me == NULL && rs->rs_v[i].re_model == NULL) ||
		    (me != NULL && rs->rs_v[i].re_model != NULL &&
		        strcmp(rs->rs_v[i].re_model, me->me_name) == 0)) {
			e = &rs->rs_v[i];
			break;
		}
	}
	if (e == NULL) {
		rs->rs_v =
		    xreallocarray(rs->rs_v, rs->rs_n + 1, sizeof(*rs->rs_v));
		e = &rs->rs_v[rs->rs_n++];
		e->re_model = me != NULL ? xstrdup(me->me_name) : NULL;
		e->re_ring = NULL;
		e->re_epoch = rs->rs_epoch - 1;
	}
	if (e->re_ring == NULL || e->re_epoch != rs->rs_epoch) {
		ring_free(e->re_ring);
		e->re_ring = rings_build(br, me);
		e->re_epoch = rs->rs_epoch;
	}
	return e->re_ring;
}

void
rings_mark(struct worker *const *c, unsigned n)
{
	unsigned i;

	if (!rings_pos_ready) {
		for (i = 0; i < SHM_MAX_WORKERS; i++)
			rings_pos[i] = -1;
		rings_pos_ready = true;
	}
	for (i = 0; i < n; i++)
		rings_pos[c[i]->wk_slot] = (int)i;
}

void
rings_unmark(struct worker *const *c, unsigned n)
{
	unsigned i;

	for (i = 0; i < n; i++)
		rings_pos[c[i]->wk_slot] = -1;
}

int
rings_candidate(void *arg, uint64_t id, const char *url)
{
	(void)arg;
	(void)url;
	if (!rings_pos_ready || id >= SHM_MAX_WORKERS)
		return -1;
	return rings_pos[id];
}
