/*
 * policy_bucket.c: `bucket` (policies.md §10.3) as a broker policy: one
 * bucket.c state per model whose members are the model's prefill workers
 * (PD and EPD) or, in regular mode, its regular workers (the spec's OPEN
 * recommendation), in registration order; the range recomputation every
 * BUCKET_TICK_MS from the broker tick.
 */
#include <stdlib.h>
#include <string.h>

#include "shared/log.h"
#include "shared/shm.h"
#include "shared/xmalloc.h"

#include "broker.h"
#include "bucket.h"

struct pb_member {
	char *pm_url;
	uint64_t pm_id; /* wk_url_hash */
	uint32_t pm_order; /* wk_order */
};

struct pb_model {
	char *pbm_name;
	struct bucket *pbm_bucket;
	struct pb_member *pbm_members; /* registration order */
	size_t pbm_n;
	uint64_t pbm_next_tick_ms; /* 0: not yet scheduled */
};

struct pbucket {
	struct bucket_conf pb_conf;
	int pb_member_type; /* Smg__WorkerType of the members */
	int pb_mode; /* connection mode of the members, -1 any */
	struct pb_model **pb_models;
	size_t pb_nmodels;
};

/* Candidate lookup of bucket_select: a member's position in c. */
struct pb_cands {
	struct worker *const *pc_c;
	unsigned pc_n;
};

static void *pbucket_create(struct policy *p);
static void pbucket_free(void *state);
static int pbucket_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req);
static void pbucket_on_add(struct policy *p, struct worker *w);
static void pbucket_on_remove(struct policy *p, struct worker *w);
static void pbucket_sweep(struct policy *p, uint64_t now_ms);
static struct pb_model *pbucket_model(struct pbucket *pb, const char *name,
    bool create);
static bool pbucket_drop(struct pb_model *m, const char *url);
static void pbucket_apply(struct pb_model *m);
static int pbucket_candidate(void *arg, uint64_t id, const char *url);
static void pbucket_log_ranges(const struct pb_model *m);

const struct policy_ops policy_bucket_ops = {
	.po_kind = POLICY_BUCKET,
	.po_create = pbucket_create,
	.po_free = pbucket_free,
	.po_select = pbucket_select,
	.po_on_add = pbucket_on_add,
	.po_on_remove = pbucket_on_remove,
	.po_sweep = pbucket_sweep,
};

static void *
pbucket_create(struct policy *p)
{
	const struct config *cf = p->pl_br != NULL ? p->pl_br->br_cf : NULL;
	struct pbucket *pb = xcalloc(1, sizeof(*pb));

	bucket_conf_default(&pb->pb_conf);
	/* Label-created instances keep the built-in defaults (§13). */
	if (!p->pl_builtin) {
		pb->pb_conf.bc_abs_threshold = 64;
		pb->pb_conf.bc_rel_threshold = 1.5;
		if (cf != NULL) {
			pb->pb_conf.bc_abs_threshold =
			    cf->cf_balance_abs_threshold;
			pb->pb_conf.bc_rel_threshold =
			    cf->cf_balance_rel_threshold;
		}
	}
	pb->pb_member_type = cf != NULL &&
	        (cf->cf_pd_disaggregation || cf->cf_epd_disaggregation)
	    ? SMG__WORKER_TYPE__WORKER_TYPE_PREFILL
	    : SMG__WORKER_TYPE__WORKER_TYPE_REGULAR;
	pb->pb_mode = cf != NULL ? p->pl_br->br_mode : -1;
	return pb;
}

static void
pbucket_model_free(struct pb_model *m)
{
	size_t i;

	for (i = 0; i < m->pbm_n; i++)
		free(m->pbm_members[i].pm_url);
	free(m->pbm_members);
	bucket_free(m->pbm_bucket);
	free(m->pbm_name);
	free(m);
}

static void
pbucket_free(void *state)
{
	struct pbucket *pb = state;
	size_t i;

	if (pb == NULL)
		return;
	for (i = 0; i < pb->pb_nmodels; i++)
		pbucket_model_free(pb->pb_models[i]);
	free(pb->pb_models);
	free(pb);
}

static struct pb_model *
pbucket_model(struct pbucket *pb, const char *name, bool create)
{
	struct pb_model *m;
	size_t i;

	if (name == NULL || *name == '\0')
		name = BROKER_MODEL_UNKNOWN;
	for (i = 0; i < pb->pb_nmodels; i++)
		if (strcmp(pb->pb_models[i]->pbm_name, name) == 0)
			return pb->pb_models[i];
	if (!create)
		return NULL;
	m = xcalloc(1, sizeof(*m));
	m->pbm_name = xstrdup(name);
	m->pbm_bucket = bucket_new(&pb->pb_conf);
	pb->pb_models = xreallocarray(pb->pb_models, pb->pb_nmodels + 1,
	    sizeof(*pb->pb_models));
	pb->pb_models[pb->pb_nmodels++] = m;
	return m;
}

/* Removes url from m's members; whether it was one. */
static bool
pbucket_drop(struct pb_model *m, const char *url)
{
	size_t i;

	for (i = 0; i < m->pbm_n; i++) {
		if (strcmp(m->pbm_members[i].pm_url, url) != 0)
			continue;
		free(m->pbm_members[i].pm_url);
		memmove(&m->pbm_members[i], &m->pbm_members[i + 1],
		    (m->pbm_n - i - 1) * sizeof(*m->pbm_members));
		m->pbm_n--;
		return true;
	}
	return false;
}

/* Hands the member list to the bucket (ranges re-split over 4096). */
static void
pbucket_apply(struct pb_model *m)
{
	struct bucket_member *bm;
	size_t i;

	bm = xcalloc(m->pbm_n + 1, sizeof(*bm));
	for (i = 0; i < m->pbm_n; i++) {
		bm[i].bm_url = m->pbm_members[i].pm_url;
		bm[i].bm_id = m->pbm_members[i].pm_id;
	}
	bucket_set_members(m->pbm_bucket, bm, m->pbm_n);
	free(bm);
	log_debug("%s: model %s: %zu bucket members", __func__, m->pbm_name,
	    m->pbm_n);
}

static void
pbucket_on_add(struct policy *p, struct worker *w)
{
	struct pbucket *pb = p->pl_state;
	struct pb_model *m;
	size_t i, pos;

	if (w->wk_type != pb->pb_member_type ||
	    (pb->pb_mode >= 0 && w->wk_mode != pb->pb_mode))
		return;
	/* A worker whose model changed leaves its old model's bucket. */
	for (i = 0; i < pb->pb_nmodels; i++) {
		m = pb->pb_models[i];
		if (strcmp(m->pbm_name, w->wk_model) != 0 &&
		    pbucket_drop(m, w->wk_url))
			pbucket_apply(m);
	}
	m = pbucket_model(pb, w->wk_model, true);
	for (i = 0; i < m->pbm_n; i++)
		if (strcmp(m->pbm_members[i].pm_url, w->wk_url) == 0)
			return;
	for (pos = m->pbm_n; pos > 0; pos--)
		if (m->pbm_members[pos - 1].pm_order <= w->wk_order)
			break;
	m->pbm_members = xreallocarray(m->pbm_members, m->pbm_n + 1,
	    sizeof(*m->pbm_members));
	memmove(&m->pbm_members[pos + 1], &m->pbm_members[pos],
	    (m->pbm_n - pos) * sizeof(*m->pbm_members));
	m->pbm_members[pos].pm_url = xstrdup(w->wk_url);
	m->pbm_members[pos].pm_id = w->wk_url_hash;
	m->pbm_members[pos].pm_order = w->wk_order;
	m->pbm_n++;
	pbucket_apply(m);
}

static void
pbucket_on_remove(struct policy *p, struct worker *w)
{
	struct pbucket *pb = p->pl_state;
	size_t i;

	for (i = 0; i < pb->pb_nmodels; i++)
		if (pbucket_drop(pb->pb_models[i], w->wk_url))
			pbucket_apply(pb->pb_models[i]);
}

static int
pbucket_candidate(void *arg, uint64_t id, const char *url)
{
	const struct pb_cands *pc = arg;
	unsigned i;

	for (i = 0; i < pc->pc_n; i++)
		if (pc->pc_c[i]->wk_url_hash == id &&
		    strcmp(pc->pc_c[i]->wk_url, url) == 0)
			return (int)i;
	return -1;
}

static int
pbucket_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req)
{
	struct pbucket *pb = p->pl_state;
	struct pb_cands pc = { c, n };
	struct bucket_pick pick;
	struct pb_model *m;
	const char *model = req != NULL ? req->model : NULL;
	uint64_t size = req != NULL ? req->size : 0;

	/* A model-less request uses the bucket of its first candidate. */
	if (model == NULL || *model == '\0' ||
	    strcmp(model, BROKER_MODEL_UNKNOWN) == 0)
		model = c[0]->wk_model;
	m = pbucket_model(pb, model, false);
	bucket_select(m != NULL ? m->pbm_bucket : NULL, size, n,
	    pbucket_candidate, &pc, policy_rand_below, shm_now_ms(), &pick);
	if (p->pl_br != NULL && p->pl_br->br_debug && pick.bp_index >= 0)
		log_debug("%s: model %s size %llu -> %s (%s)", __func__,
		    model != NULL ? model : "-", (unsigned long long)size,
		    c[pick.bp_index]->wk_url,
		    bucket_reason_name(pick.bp_reason));
	return pick.bp_index;
}

/* The range recomputation, every BUCKET_TICK_MS per model. */
static void
pbucket_sweep(struct policy *p, uint64_t now_ms)
{
	struct pbucket *pb = p->pl_state;
	struct pb_model *m;
	size_t i;

	for (i = 0; i < pb->pb_nmodels; i++) {
		m = pb->pb_models[i];
		if (m->pbm_next_tick_ms == 0) {
			m->pbm_next_tick_ms = now_ms + pb->pb_conf.bc_window_ms;
			continue;
		}
		if (now_ms < m->pbm_next_tick_ms)
			continue;
		bucket_tick(m->pbm_bucket);
		if (p->pl_br != NULL && p->pl_br->br_debug)
			pbucket_log_ranges(m);
		m->pbm_next_tick_ms += pb->pb_conf.bc_window_ms;
		if (m->pbm_next_tick_ms <= now_ms)
			m->pbm_next_tick_ms = now_ms + pb->pb_conf.bc_window_ms;
	}
}

struct bucket *
policy_bucket_state(struct policy *p, const char *model)
{
	struct pb_model *m;

	if (p == NULL || p->pl_ops != &policy_bucket_ops)
		return NULL;
	m = pbucket_model(p->pl_state, model, false);
	return m != NULL ? m->pbm_bucket : NULL;
}

/* Debug log: each member's range and window sum after a tick. */
static void
pbucket_log_ranges(const struct pb_model *m)
{
	struct bucket_range r[8];
	size_t n, i;

	n = bucket_ranges(m->pbm_bucket, r, sizeof(r) / sizeof(r[0]));
	for (i = 0; i < n && i < sizeof(r) / sizeof(r[0]); i++) {
		if (r[i].br_hi == BUCKET_INFINITY)
			log_debug("%s: model %s: %s [%llu, inf] window %llu",
			    __func__, m->pbm_name, r[i].br_url,
			    (unsigned long long)r[i].br_lo,
			    (unsigned long long)bucket_window_sum(m->pbm_bucket,
			        r[i].br_url));
		else
			log_debug("%s: model %s: %s [%llu, %llu] window %llu",
			    __func__, m->pbm_name, r[i].br_url,
			    (unsigned long long)r[i].br_lo,
			    (unsigned long long)r[i].br_hi,
			    (unsigned long long)bucket_window_sum(m->pbm_bucket,
			        r[i].br_url));
	}
}
