/*
 * policy_cache_aware.c: `cache_aware` (policies.md §11), the default
 * policy. Tree mode: per model a string tree (routing text) and a token
 * tree (token ids, paged by --block-size) whose tenants are worker slots;
 * the match rate against --cache-threshold picks a holder, the spill gate
 * sends it elsewhere when every holder is overloaded, and the fallback
 * pick is the expected-wait scorer of §2 with built-in defaults (every
 * dispatch credits it). Hash mode (--cache-index hash, §11.7): per model a
 * placement map of (boundary, prefix hash) -> up to 3 holders with a TTL.
 * Event mode (§11.4): a request with tokens whose model's KV-event block
 * index (kvindex.c) holds blocks goes where the engines' caches overlap it.
 * Every tree insert is journaled through persist.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "shared/log.h"
#include "shared/metrics.h"
#include "shared/xmalloc.h"

#include "broker.h"
#include "kvindex.h"
#include "scorer.h"
#include "tree.h"

#define CA_HOLDERS_MAX 3 /* hash mode, §11.7 */

enum ca_branch {
	CA_TREE_MATCH = 0,
	CA_SPILL,
	CA_MIN_LOAD_FALLBACK,
	CA_FIRST_HEALTHY_FALLBACK,
	CA_KV_PRESSURE_MIN_LOAD,
	CA_NO_TREE_RANDOM,
	CA_NO_HEALTHY_WORKERS,
	CA_EVENT_MATCH, /* event mode, §11.4 */
	CA_EVENT_SPILL,
	CA_EVENT_NO_OVERLAP,
	CA_NBRANCHES,
	/* hash mode: logged, not counted (§11.9) */
	CA_HASH_HIT,
	CA_HASH_SPILL,
	CA_SHORT_REQUEST,
};

struct ca_holder {
	uint64_t ch_url_hash; /* wk_url_hash */
	uint64_t ch_touch_ms;
};

struct ca_place {
	uint64_t cp_key;
	struct ca_holder cp_h[CA_HOLDERS_MAX];
	unsigned cp_n;
	struct ca_place *cp_next;
};

struct ca_model {
	char *cm_name;
	struct tree *cm_str;
	struct tree *cm_tok;
	/* hash mode */
	struct ca_place **cm_place;
	size_t cm_nplace; /* buckets, power of two */
	size_t cm_place_n;
	/* gauges, -2 not yet */
	int cm_m_chars;
	int cm_m_tokens;
	int cm_m_ten_str;
	int cm_m_ten_tok;
	int cm_m_place;
};

struct cache_aware {
	struct policy *ca_p;
	double ca_threshold;
	double ca_abs;
	double ca_rel;
	double ca_bal_tu;
	double ca_over_tu;
	double ca_decay;
	double ca_temp;
	uint64_t ca_every_ms;
	uint64_t ca_max_size;
	uint32_t ca_bs;
	bool ca_hash;
	uint64_t ca_ttl_ms;
	uint32_t *ca_bounds;
	size_t ca_nbounds;
	uint64_t ca_interval_ms; /* reports older than 3x are missing */
	struct ca_model **ca_models;
	unsigned ca_nmodels;
	struct scorer *ca_scorer;
	int ca_m_branch[CA_NBRANCHES];
	uint64_t ca_last_sweep_ms;
	/* scratch, per decision */
	struct scorer_cand ca_cands[SHM_MAX_WORKERS];
	uint32_t ca_load[SHM_MAX_WORKERS];
	int ca_pos[SHM_MAX_WORKERS]; /* candidate position by slot, -1 */
};

static void *ca_create(struct policy *p);
static void ca_free(void *state);
static int ca_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req);
static void ca_on_add(struct policy *p, struct worker *w);
static void ca_on_remove(struct policy *p, struct worker *w);
static void ca_on_report(struct policy *p, struct worker *w);
static void ca_sweep(struct policy *p, uint64_t now_ms);
static struct ca_model *ca_model(struct cache_aware *ca, const char *name,
    bool create);
static void ca_model_free(struct ca_model *cm);
static const struct worker_load *ca_report(const struct cache_aware *ca,
    const struct worker *w, uint64_t now_ms);
static int ca_fallback(struct cache_aware *ca, struct worker *const *c,
    unsigned n, const Smg__RouteRequest *req, uint64_t now_ms);
static int ca_spill(struct cache_aware *ca, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req, double avg, uint64_t now_ms);
static void ca_credit(struct cache_aware *ca, struct worker *w,
    const Smg__RouteRequest *req, uint64_t now_ms);
static bool ca_gated(const struct cache_aware *ca, uint32_t load, double avg);
static bool ca_kv_pressure(const struct cache_aware *ca,
    struct worker *const *c, unsigned n, uint64_t now_ms);
static int ca_pick_holder(struct cache_aware *ca, struct worker *const *c,
    const int *hp, unsigned nh, double matched, size_t input, uint64_t now_ms);
static void ca_insert(struct cache_aware *ca, struct ca_model *cm,
    struct worker *w, const Smg__RouteRequest *req);
static int ca_tree_select(struct cache_aware *ca, struct ca_model *cm,
    struct worker *const *c, unsigned n, const Smg__RouteRequest *req,
    double avg, uint64_t now_ms, enum ca_branch *b, double *rate);
static int ca_event_select(struct cache_aware *ca, struct ca_model *cm,
    struct worker *const *c, unsigned n, const Smg__RouteRequest *req,
    double avg, uint64_t now_ms, enum ca_branch *b, double *rate);
static int ca_hash_select(struct cache_aware *ca, struct ca_model *cm,
    struct worker *const *c, unsigned n, const Smg__RouteRequest *req,
    double avg, uint64_t now_ms, enum ca_branch *b);
static size_t ca_hash_keys(const struct cache_aware *ca, const uint32_t *tok,
    size_t ntok, uint64_t *keys);
static struct ca_place *ca_place_get(struct ca_model *cm, uint64_t key,
    bool create);
static void ca_place_record(struct cache_aware *ca, struct ca_model *cm,
    const uint64_t *keys, size_t nkeys, const struct worker *w,
    uint64_t now_ms);
static void ca_count(struct cache_aware *ca, enum ca_branch b);
static const char *ca_branch_name(enum ca_branch b);
static void ca_gauges(struct cache_aware *ca, struct ca_model *cm);

const struct policy_ops policy_cache_aware_ops = {
	.po_name = "cache_aware",
	.po_needs_text = true,
	.po_branch_metric = "smg_cache_aware_policy_branch_total",
	.po_create = ca_create,
	.po_free = ca_free,
	.po_select = ca_select,
	.po_on_add = ca_on_add,
	.po_on_remove = ca_on_remove,
	.po_on_report = ca_on_report,
	.po_sweep = ca_sweep,
};

/* ------------------------------------------------------------ lifecycle */

static void *
ca_create(struct policy *p)
{
	struct broker *br = p->pl_br;
	const struct broker_settings *bs = br != NULL ? br->br_set : NULL;
	struct cache_aware *ca = xcalloc(1, sizeof(*ca));
	unsigned i;

	ca->ca_p = p;
	/* Built-in defaults (label-created instances, §13). */
	ca->ca_threshold = 0.5;
	ca->ca_abs = 32;
	ca->ca_rel = 1.1;
	ca->ca_every_ms = 30 * 1000;
	ca->ca_max_size = 10000;
	ca->ca_bs = 16;
	ca->ca_bal_tu = 1.0;
	ca->ca_over_tu = 1.0;
	ca->ca_ttl_ms = 180 * 1000;
	if (bs == NULL || !bs->bs_policy_flags) {
		if (!p->pl_builtin) {
			/* The CLI defaults of policies.md §11.1. */
			ca->ca_threshold = 0.3;
			ca->ca_abs = 64;
			ca->ca_rel = 1.5;
			ca->ca_every_ms = 120 * 1000;
			ca->ca_max_size = 67108864;
		}
	} else {
		if (!p->pl_builtin) {
			ca->ca_threshold = bs->bs_cache_threshold;
			ca->ca_abs = (double)bs->bs_balance_abs_threshold;
			ca->ca_rel = bs->bs_balance_rel_threshold;
			ca->ca_every_ms =
			    (uint64_t)bs->bs_eviction_interval * 1000;
			ca->ca_max_size = bs->bs_max_tree_size;
			if (bs->bs_cache_boundaries_n > 0) {
				ca->ca_nbounds = bs->bs_cache_boundaries_n;
				ca->ca_bounds = xcalloc(ca->ca_nbounds,
				    sizeof(*ca->ca_bounds));
				memcpy(ca->ca_bounds, bs->bs_cache_boundaries,
				    ca->ca_nbounds * sizeof(*ca->ca_bounds));
			}
			ca->ca_hash =
			    bs->bs_cache_index_hash && ca->ca_nbounds > 0;
		}
		/* §13: these come from the flags for every instance. */
		if (bs->bs_block_size > 0)
			ca->ca_bs = bs->bs_block_size;
		ca->ca_bal_tu = bs->bs_balance_token_usage_threshold;
		ca->ca_over_tu = bs->bs_overload_token_usage_threshold;
		ca->ca_decay = bs->bs_overlap_decay;
		ca->ca_temp = bs->bs_selection_temperature;
		if (bs->bs_cache_ttl_secs > 0)
			ca->ca_ttl_ms = (uint64_t)bs->bs_cache_ttl_secs * 1000;
	}
	if (ca->ca_max_size == 0)
		ca->ca_max_size = 10000;
	if (ca->ca_rel < 1.0)
		ca->ca_rel = 1.0;
	if (bs != NULL)
		ca->ca_interval_ms =
		    (uint64_t)bs->bs_load_monitor_interval * 1000;
	ca->ca_scorer = scorer_new(NULL, policy_rand_below);
	for (i = 0; i < CA_NBRANCHES; i++)
		ca->ca_m_branch[i] = -2;
	for (i = 0; i < SHM_MAX_WORKERS; i++)
		ca->ca_pos[i] = -1;
	return ca;
}

static void
ca_model_free(struct ca_model *cm)
{
	struct ca_place *pl, *next;
	size_t i;

	tree_free(cm->cm_str);
	tree_free(cm->cm_tok);
	for (i = 0; i < cm->cm_nplace; i++) {
		for (pl = cm->cm_place[i]; pl != NULL; pl = next) {
			next = pl->cp_next;
			free(pl);
		}
	}
	free(cm->cm_place);
	free(cm->cm_name);
	free(cm);
}

static void
ca_free(void *state)
{
	struct cache_aware *ca = state;
	unsigned i;

	if (ca == NULL)
		return;
	for (i = 0; i < ca->ca_nmodels; i++)
		ca_model_free(ca->ca_models[i]);
	free(ca->ca_models);
	free(ca->ca_bounds);
	scorer_free(ca->ca_scorer);
	free(ca);
}

static struct ca_model *
ca_model(struct cache_aware *ca, const char *name, bool create)
{
	struct ca_model *cm;
	unsigned i;

	if (name == NULL || *name == '\0')
		name = BROKER_MODEL_UNKNOWN;
	for (i = 0; i < ca->ca_nmodels; i++) {
		if (strcmp(ca->ca_models[i]->cm_name, name) == 0)
			return ca->ca_models[i];
	}
	if (!create)
		return NULL;
	cm = xcalloc(1, sizeof(*cm));
	cm->cm_name = xstrdup(name);
	if (ca->ca_hash) {
		cm->cm_nplace = 256;
		cm->cm_place = xcalloc(cm->cm_nplace, sizeof(*cm->cm_place));
	} else {
		cm->cm_str = tree_new(TREE_STRING, ca->ca_max_size, 1);
		cm->cm_tok = tree_new(TREE_TOKEN, ca->ca_max_size, ca->ca_bs);
		/* The journal keeps up to twice this (persist.c). */
		persist_tree_budget(ca->ca_p->pl_br, ca->ca_max_size);
	}
	cm->cm_m_chars = cm->cm_m_tokens = -2;
	cm->cm_m_ten_str = cm->cm_m_ten_tok = cm->cm_m_place = -2;
	ca->ca_models = xreallocarray(ca->ca_models, ca->ca_nmodels + 1,
	    sizeof(*ca->ca_models));
	ca->ca_models[ca->ca_nmodels++] = cm;
	return cm;
}

/* A worker registers as a tenant of its model's string tree (§11.3). */
static void
ca_on_add(struct policy *p, struct worker *w)
{
	struct cache_aware *ca = p->pl_state;
	struct ca_model *cm = ca_model(ca, w->wk_model, true);

	if (cm->cm_str != NULL && w->wk_slot <= TREE_MAX_TENANT)
		(void)tree_insert(cm->cm_str, "", 0, w->wk_slot);
}

static void
ca_on_remove(struct policy *p, struct worker *w)
{
	struct cache_aware *ca = p->pl_state;
	unsigned i;

	for (i = 0; i < ca->ca_nmodels; i++) {
		if (ca->ca_models[i]->cm_str != NULL)
			tree_remove_tenant(ca->ca_models[i]->cm_str,
			    w->wk_slot);
		if (ca->ca_models[i]->cm_tok != NULL)
			tree_remove_tenant(ca->ca_models[i]->cm_tok,
			    w->wk_slot);
	}
	scorer_forget(ca->ca_scorer, w->wk_url_hash);
	if (p->pl_br != NULL)
		sticky_forget_worker(p->pl_br, w);
}

static void
ca_on_report(struct policy *p, struct worker *w)
{
	struct cache_aware *ca = p->pl_state;
	const struct worker_load *l = &w->wk_load;
	struct scorer_report r;

	if (!l->wl_valid) {
		scorer_report(ca->ca_scorer, w->wk_url_hash, NULL,
		    l->wl_received_ms);
		return;
	}
	r.sr_waiting_reqs = l->wl_waiting_reqs;
	r.sr_waiting_uncached_tokens = l->wl_waiting_uncached_tokens;
	r.sr_gen_throughput = l->wl_gen_throughput;
	r.sr_token_usage = l->wl_token_usage;
	scorer_report(ca->ca_scorer, w->wk_url_hash, &r, l->wl_received_ms);
}

void
policy_cache_aware_replay(struct policy *p, const char *model, int kind,
    struct worker *w, const void *key, size_t keylen)
{
	struct cache_aware *ca = p->pl_state;
	struct ca_model *cm;

	if (ca->ca_hash || w->wk_slot > TREE_MAX_TENANT)
		return;
	cm = ca_model(ca, model, true);
	if (kind == 0)
		(void)tree_insert(cm->cm_str, key, keylen, w->wk_slot);
	else
		(void)tree_insert_tokens(cm->cm_tok, key, keylen, w->wk_slot);
}

/* ------------------------------------------------------------ metrics */

static const char *
ca_branch_name(enum ca_branch b)
{
	switch (b) {
	case CA_TREE_MATCH:
		return "tree_match";
	case CA_SPILL:
		return "spill";
	case CA_MIN_LOAD_FALLBACK:
		return "min_load_fallback";
	case CA_FIRST_HEALTHY_FALLBACK:
		return "first_healthy_fallback";
	case CA_KV_PRESSURE_MIN_LOAD:
		return "kv_pressure_min_load";
	case CA_NO_TREE_RANDOM:
		return "no_tree_random";
	case CA_NO_HEALTHY_WORKERS:
		return "no_healthy_workers";
	case CA_EVENT_MATCH:
		return "event_match";
	case CA_EVENT_SPILL:
		return "event_spill";
	case CA_EVENT_NO_OVERLAP:
		return "event_no_overlap";
	case CA_HASH_HIT:
		return "hash_hit";
	case CA_HASH_SPILL:
		return "hash_spill";
	case CA_SHORT_REQUEST:
		return "short_request";
	case CA_NBRANCHES:
		break;
	}
	return "unknown";
}

/* Tree-mode branches only (§11.9). */
static void
ca_count(struct cache_aware *ca, enum ca_branch b)
{
	struct broker *br = ca->ca_p->pl_br;

	if (br == NULL || b >= CA_NBRANCHES)
		return;
	if (ca->ca_m_branch[b] == -2)
		ca->ca_m_branch[b] = server_series(br, METRICS_COUNTER,
		    "smg_cache_aware_policy_branch_total", "branch=\"%s\"",
		    ca_branch_name(b));
	server_metric_add(br, ca->ca_m_branch[b], 1);
}

static void
ca_gauges(struct cache_aware *ca, struct ca_model *cm)
{
	struct broker *br = ca->ca_p->pl_br;
	char m[SHM_MODEL_MAX * 2];

	if (br == NULL)
		return;
	server_label_escape(m, sizeof(m), cm->cm_name);
	if (ca->ca_hash) {
		if (cm->cm_m_place == -2)
			cm->cm_m_place = server_series(br, METRICS_GAUGE,
			    "smg_cache_placement_entries", "model=\"%s\"", m);
		server_metric_set(br, cm->cm_m_place, (int64_t)cm->cm_place_n);
		return;
	}
	if (cm->cm_m_chars == -2) {
		cm->cm_m_chars = server_series(br, METRICS_GAUGE,
		    "smg_cache_tree_chars", "model=\"%s\"", m);
		cm->cm_m_tokens = server_series(br, METRICS_GAUGE,
		    "smg_cache_tree_tokens", "model=\"%s\"", m);
		cm->cm_m_ten_str =
		    server_series(br, METRICS_GAUGE, "smg_cache_tree_tenants",
		        "model=\"%s\",tree=\"string\"", m);
		cm->cm_m_ten_tok = server_series(br, METRICS_GAUGE,
		    "smg_cache_tree_tenants", "model=\"%s\",tree=\"token\"", m);
	}
	server_metric_set(br, cm->cm_m_chars, (int64_t)tree_size(cm->cm_str));
	server_metric_set(br, cm->cm_m_tokens, (int64_t)tree_size(cm->cm_tok));
	server_metric_set(br, cm->cm_m_ten_str,
	    (int64_t)tree_tenants(cm->cm_str));
	server_metric_set(br, cm->cm_m_ten_tok,
	    (int64_t)tree_tenants(cm->cm_tok));
}

/* ------------------------------------------------------------ helpers */

static const struct worker_load *
ca_report(const struct cache_aware *ca, const struct worker *w, uint64_t now_ms)
{
	const struct worker_load *l = &w->wk_load;

	if (!l->wl_valid)
		return NULL;
	if (ca->ca_interval_ms > 0 &&
	    now_ms - l->wl_received_ms > 3 * ca->ca_interval_ms)
		return NULL;
	return l;
}

/* §11.5: the scorer of §2 over every candidate; it credits the winner. */
static int
ca_fallback(struct cache_aware *ca, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req, uint64_t now_ms)
{
	struct scorer_pick pick;
	unsigned i;
	int idx;

	for (i = 0; i < n; i++) {
		ca->ca_cands[i].sc_id = c[i]->wk_url_hash;
		ca->ca_cands[i].sc_in_flight = ca->ca_load[i];
	}
	idx = scorer_select(ca->ca_scorer, ca->ca_cands, n,
	    req->has_tokens ? (int64_t)req->n_tokens : -1, now_ms,
	    ca->ca_interval_ms, &pick);
	return idx >= 0 ? idx : 0;
}

/*
 * The spill target: the fallback pick over the candidates that are not
 * over the spill gate themselves. The gated holder must not win its own
 * spill (the expected-wait score does not read in-flight counts, so a
 * worker with a fast last report would); the least-loaded candidate is
 * never over the gate (its load is at most avg), so the set is never
 * empty.
 */
static int
ca_spill(struct cache_aware *ca, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req, double avg, uint64_t now_ms)
{
	struct scorer_pick pick;
	unsigned i, k = 0;
	int map[SHM_MAX_WORKERS], idx;

	for (i = 0; i < n; i++) {
		if (ca_gated(ca, ca->ca_load[i], avg))
			continue;
		ca->ca_cands[k].sc_id = c[i]->wk_url_hash;
		ca->ca_cands[k].sc_in_flight = ca->ca_load[i];
		map[k++] = (int)i;
	}
	if (k == 0)
		return ca_fallback(ca, c, n, req, now_ms);
	idx = scorer_select(ca->ca_scorer, ca->ca_cands, k,
	    req->has_tokens ? (int64_t)req->n_tokens : -1, now_ms,
	    ca->ca_interval_ms, &pick);
	return idx >= 0 ? map[idx] : map[0];
}

/*
 * Credits a dispatch the scorer did not choose (cache hit): scoring the
 * one-member set {w} credits its winner, w.
 */
static void
ca_credit(struct cache_aware *ca, struct worker *w,
    const Smg__RouteRequest *req, uint64_t now_ms)
{
	struct scorer_cand one;
	struct scorer_pick pick;

	one.sc_id = w->wk_url_hash;
	one.sc_in_flight = 0;
	(void)scorer_select(ca->ca_scorer, &one, 1,
	    req->has_tokens ? (int64_t)req->n_tokens : -1, now_ms,
	    ca->ca_interval_ms, &pick);
}

/* The spill gate of §11.3: over both thresholds. */
static bool
ca_gated(const struct cache_aware *ca, uint32_t load, double avg)
{
	return (double)load > avg * ca->ca_rel &&
	    (double)load > avg + ca->ca_abs;
}

/* §11.2 step 4. */
static bool
ca_kv_pressure(const struct cache_aware *ca, struct worker *const *c,
    unsigned n, uint64_t now_ms)
{
	const struct worker_load *l;
	double kmax = -1, kmin = 2;
	unsigned i;

	if (ca->ca_over_tu >= 1.0 && ca->ca_bal_tu >= 1.0)
		return false;
	for (i = 0; i < n; i++) {
		if ((l = ca_report(ca, c[i], now_ms)) == NULL)
			continue;
		if (l->wl_token_usage > kmax)
			kmax = l->wl_token_usage;
		if (l->wl_token_usage < kmin)
			kmin = l->wl_token_usage;
	}
	if (kmax < 0)
		return false;
	return (ca->ca_over_tu < 1.0 && kmax > ca->ca_over_tu) ||
	    (ca->ca_bal_tu < 1.0 && kmax - kmin > ca->ca_bal_tu);
}

/*
 * Among the holder candidates hp[0..nh): fewest in-flight, ties random;
 * with decay or temperature (§11.6) the decayed match score decides.
 */
static int
ca_pick_holder(struct cache_aware *ca, struct worker *const *c, const int *hp,
    unsigned nh, double matched, size_t input, uint64_t now_ms)
{
	const struct worker_load *l;
	double score[TREE_MAX_HOLDERS], best, lo, hi, w, total, r;
	int64_t minb = INT64_MAX, backlog;
	uint32_t bl = UINT32_MAX, ties = 0;
	double blocks;
	unsigned i;
	int pick = -1;

	if (ca->ca_decay <= 0 && ca->ca_temp <= 0) {
		for (i = 0; i < nh; i++) {
			uint32_t ld = ca->ca_load[hp[i]];

			if (ld < bl) {
				bl = ld;
				pick = hp[i];
				ties = 1;
			} else if (ld == bl && policy_rand_below(++ties) == 0)
				pick = hp[i];
		}
		return pick;
	}
	blocks = (double)input / ca->ca_bs;
	if (blocks < 1)
		blocks = 1;
	for (i = 0; i < nh; i++) {
		if ((l = ca_report(ca, c[hp[i]], now_ms)) != NULL) {
			backlog = l->wl_waiting_uncached_tokens > 0
			    ? l->wl_waiting_uncached_tokens
			    : 0;
			if (backlog < minb)
				minb = backlog;
		}
	}
	for (i = 0; i < nh; i++) {
		score[i] = matched;
		l = ca_report(ca, c[hp[i]], now_ms);
		if (ca->ca_decay > 0 && l != NULL) {
			backlog = l->wl_waiting_uncached_tokens > 0
			    ? l->wl_waiting_uncached_tokens
			    : 0;
			score[i] /= 1.0 +
			    ca->ca_decay *
			        (((double)(backlog - minb) / ca->ca_bs) /
			            blocks);
		}
	}
	if (ca->ca_temp > 0) {
		lo = hi = score[0];
		for (i = 1; i < nh; i++) {
			lo = score[i] < lo ? score[i] : lo;
			hi = score[i] > hi ? score[i] : hi;
		}
		if (hi <= lo)
			return hp[policy_rand_below(nh)];
		total = 0;
		for (i = 0; i < nh; i++)
			total += exp(
			    ((score[i] - lo) / (hi - lo) - 1) / ca->ca_temp);
		r = (double)policy_rand_below(1U << 30) / (double)(1U << 30) *
		    total;
		for (i = 0; i < nh; i++) {
			w = exp(
			    ((score[i] - lo) / (hi - lo) - 1) / ca->ca_temp);
			if (r < w)
				return hp[i];
			r -= w;
		}
		return hp[nh - 1];
	}
	best = -1;
	for (i = 0; i < nh; i++) {
		uint32_t ld = ca->ca_load[hp[i]];

		if (score[i] > best || (score[i] == best && ld < bl)) {
			best = score[i];
			bl = ld;
			pick = hp[i];
			ties = 1;
		} else if (score[i] == best && ld == bl &&
		    policy_rand_below(++ties) == 0)
			pick = hp[i];
	}
	return pick;
}

/* Inserts the request for w and journals it. */
static void
ca_insert(struct cache_aware *ca, struct ca_model *cm, struct worker *w,
    const Smg__RouteRequest *req)
{
	struct broker *br = ca->ca_p->pl_br;
	const char *text;
	size_t len, ntok;

	if (w->wk_slot > TREE_MAX_TENANT)
		return;
	if (req->has_tokens && req->n_tokens > 0) {
		ntok = req->n_tokens / ca->ca_bs * ca->ca_bs;
		if (ntok == 0)
			return;
		if (tree_insert_tokens(cm->cm_tok, req->tokens, ntok,
		        w->wk_slot) == 0 &&
		    br != NULL)
			persist_tree_insert(br, ca->ca_p, cm->cm_name, 1,
			    w->wk_url, req->tokens, ntok * sizeof(uint32_t));
		return;
	}
	text = req->has_text && req->text != NULL ? req->text : "";
	len = strlen(text);
	if (tree_insert(cm->cm_str, text, len, w->wk_slot) == 0 && br != NULL &&
	    len > 0)
		persist_tree_insert(br, ca->ca_p, cm->cm_name, 0, w->wk_url,
		    text, len);
}

/* ------------------------------------------------------------ tree mode */

static int
ca_tree_select(struct cache_aware *ca, struct ca_model *cm,
    struct worker *const *c, unsigned n, const Smg__RouteRequest *req,
    double avg, uint64_t now_ms, enum ca_branch *b, double *rate)
{
	struct tree_match m;
	int hp[TREE_MAX_HOLDERS], idx;
	unsigned i, nh = 0;
	const char *text;

	if (req->has_tokens && req->n_tokens > 0)
		tree_match_tokens(cm->cm_tok, req->tokens, req->n_tokens, &m);
	else {
		text = req->has_text && req->text != NULL ? req->text : "";
		tree_match(cm->cm_str, text, strlen(text), &m);
	}
	/* A frontend cuts huge inputs (ipc.h); size is the whole length. */
	if (m.tm_input < req->size)
		m.tm_input = (size_t)req->size;
	*rate =
	    m.tm_input > 0 ? (double)m.tm_matched / (double)m.tm_input : 0.0;
	if (*rate <= ca->ca_threshold) {
		*b = CA_MIN_LOAD_FALLBACK;
		idx = ca_fallback(ca, c, n, req, now_ms);
		ca_insert(ca, cm, c[idx], req);
		return idx;
	}
	for (i = 0; i < m.tm_nholders; i++) {
		if (m.tm_holders[i] < SHM_MAX_WORKERS &&
		    ca->ca_pos[m.tm_holders[i]] >= 0)
			hp[nh++] = ca->ca_pos[m.tm_holders[i]];
	}
	if (nh == 0) {
		*b = CA_FIRST_HEALTHY_FALLBACK;
		ca_credit(ca, c[0], req, now_ms);
		return 0;
	}
	idx = ca_pick_holder(ca, c, hp, nh, (double)m.tm_matched, m.tm_input,
	    now_ms);
	if (ca_gated(ca, ca->ca_load[idx], avg)) {
		*b = CA_SPILL;
		idx = ca_spill(ca, c, n, req, avg, now_ms);
	} else {
		*b = CA_TREE_MATCH;
		ca_credit(ca, c[idx], req, now_ms);
	}
	ca_insert(ca, cm, c[idx], req);
	return idx;
}

/* ------------------------------------------------------------ event mode */

/*
 * §11.4: the engines' own caches as their KV events report them (the
 * block index of kvindex.c). Nothing is inserted: the engines will report
 * what they store.
 */
static int
ca_event_select(struct cache_aware *ca, struct ca_model *cm,
    struct worker *const *c, unsigned n, const Smg__RouteRequest *req,
    double avg, uint64_t now_ms, enum ca_branch *b, double *rate)
{
	struct broker *br = ca->ca_p->pl_br;
	uint32_t score, bs;
	int idx;

	idx = kvindex_select(br, cm->cm_name, c, n, ca->ca_load, req->tokens,
	    req->n_tokens, ca->ca_bs, &score);
	if (idx < 0) {
		*b = CA_EVENT_NO_OVERLAP;
		return ca_fallback(ca, c, n, req, now_ms);
	}
	bs = kvindex_block_size(kvindex_of(br), cm->cm_name);
	*rate = (double)score * (bs ? bs : ca->ca_bs) / (double)req->n_tokens;
	if (ca_gated(ca, ca->ca_load[idx], avg)) {
		*b = CA_EVENT_SPILL;
		return ca_spill(ca, c, n, req, avg, now_ms);
	}
	*b = CA_EVENT_MATCH;
	ca_credit(ca, c[idx], req, now_ms);
	return idx;
}

/* ------------------------------------------------------------ hash mode */

/* Keys of the applicable boundaries, deepest first. */
static size_t
ca_hash_keys(const struct cache_aware *ca, const uint32_t *tok, size_t ntok,
    uint64_t *keys)
{
	XXH3_state_t st;
	unsigned char le[4 * 64];
	size_t i, done = 0, nk = 0, k, chunk;
	uint64_t h;

	XXH3_64bits_reset(&st);
	for (i = 0; i < ca->ca_nbounds && ca->ca_bounds[i] <= ntok && nk < 64;
	     i++) {
		while (done < ca->ca_bounds[i]) {
			chunk = ca->ca_bounds[i] - done;
			if (chunk > 64)
				chunk = 64;
			for (k = 0; k < chunk; k++) {
				uint32_t t = tok[done + k];

				le[4 * k] = (unsigned char)(t & 0xff);
				le[4 * k + 1] = (unsigned char)(t >> 8);
				le[4 * k + 2] = (unsigned char)(t >> 16);
				le[4 * k + 3] = (unsigned char)(t >> 24);
			}
			XXH3_64bits_update(&st, le, 4 * chunk);
			done += chunk;
		}
		h = XXH3_64bits_digest(&st);
		/* The map key binds the boundary to the prefix hash. */
		keys[nk++] = h ^
		    (XXH3_64bits(&ca->ca_bounds[i], sizeof(ca->ca_bounds[i])));
	}
	/* Deepest first. */
	for (i = 0; i < nk / 2; i++) {
		h = keys[i];
		keys[i] = keys[nk - 1 - i];
		keys[nk - 1 - i] = h;
	}
	return nk;
}

static struct ca_place *
ca_place_get(struct ca_model *cm, uint64_t key, bool create)
{
	struct ca_place *pl, **nb, *next;
	size_t i, n;

	for (pl = cm->cm_place[key & (cm->cm_nplace - 1)]; pl != NULL;
	     pl = pl->cp_next) {
		if (pl->cp_key == key)
			return pl;
	}
	if (!create)
		return NULL;
	if (cm->cm_place_n >= cm->cm_nplace) {
		n = cm->cm_nplace * 2;
		nb = xcalloc(n, sizeof(*nb));
		for (i = 0; i < cm->cm_nplace; i++) {
			for (pl = cm->cm_place[i]; pl != NULL; pl = next) {
				next = pl->cp_next;
				pl->cp_next = nb[pl->cp_key & (n - 1)];
				nb[pl->cp_key & (n - 1)] = pl;
			}
		}
		free(cm->cm_place);
		cm->cm_place = nb;
		cm->cm_nplace = n;
	}
	pl = xcalloc(1, sizeof(*pl));
	pl->cp_key = key;
	pl->cp_next = cm->cm_place[key & (cm->cm_nplace - 1)];
	cm->cm_place[key & (cm->cm_nplace - 1)] = pl;
	cm->cm_place_n++;
	return pl;
}

static void
ca_place_record(struct cache_aware *ca, struct ca_model *cm,
    const uint64_t *keys, size_t nkeys, const struct worker *w, uint64_t now_ms)
{
	struct ca_place *pl;
	unsigned i, j, stalest;
	size_t k;

	for (k = 0; k < nkeys; k++) {
		pl = ca_place_get(cm, keys[k], true);
		for (i = 0, j = 0; i < pl->cp_n; i++) {
			if (now_ms - pl->cp_h[i].ch_touch_ms > ca->ca_ttl_ms)
				continue; /* expired */
			pl->cp_h[j++] = pl->cp_h[i];
		}
		pl->cp_n = j;
		for (i = 0; i < pl->cp_n; i++) {
			if (pl->cp_h[i].ch_url_hash == w->wk_url_hash)
				break;
		}
		if (i == pl->cp_n) {
			if (pl->cp_n == CA_HOLDERS_MAX) {
				for (stalest = 0, j = 1; j < pl->cp_n; j++) {
					if (pl->cp_h[j].ch_touch_ms <
					    pl->cp_h[stalest].ch_touch_ms)
						stalest = j;
				}
				i = stalest;
			} else
				i = pl->cp_n++;
			pl->cp_h[i].ch_url_hash = w->wk_url_hash;
		}
		pl->cp_h[i].ch_touch_ms = now_ms;
	}
}

static int
ca_hash_select(struct cache_aware *ca, struct ca_model *cm,
    struct worker *const *c, unsigned n, const Smg__RouteRequest *req,
    double avg, uint64_t now_ms, enum ca_branch *b)
{
	uint64_t keys[64];
	struct ca_place *pl;
	size_t nk, k;
	unsigned i, j;
	int idx = -1;

	if (!req->has_tokens || req->n_tokens == 0 || ca->ca_nbounds == 0 ||
	    req->n_tokens < ca->ca_bounds[0]) {
		*b = req->has_tokens && req->n_tokens > 0
		    ? CA_SHORT_REQUEST
		    : CA_MIN_LOAD_FALLBACK;
		return ca_fallback(ca, c, n, req, now_ms);
	}
	nk = ca_hash_keys(ca, req->tokens, req->n_tokens, keys);
	if (ca_kv_pressure(ca, c, n, now_ms)) {
		*b = CA_KV_PRESSURE_MIN_LOAD;
		idx = ca_fallback(ca, c, n, req, now_ms);
		ca_place_record(ca, cm, keys, nk, c[idx], now_ms);
		return idx;
	}
	for (k = 0; k < nk && idx < 0; k++) {
		if ((pl = ca_place_get(cm, keys[k], false)) == NULL)
			continue;
		for (i = 0; i < pl->cp_n; i++) {
			if (now_ms - pl->cp_h[i].ch_touch_ms > ca->ca_ttl_ms)
				continue;
			for (j = 0; j < n; j++) {
				if (c[j]->wk_url_hash !=
				    pl->cp_h[i].ch_url_hash)
					continue;
				/* Least in-flight, ties lower index. */
				if (idx < 0 ||
				    ca->ca_load[j] < ca->ca_load[idx] ||
				    (ca->ca_load[j] == ca->ca_load[idx] &&
				        (int)j < idx))
					idx = (int)j;
			}
		}
	}
	if (idx >= 0 && ca_gated(ca, ca->ca_load[idx], avg)) {
		*b = CA_HASH_SPILL;
		idx = ca_spill(ca, c, n, req, avg, now_ms);
	} else if (idx >= 0) {
		*b = CA_HASH_HIT;
		ca_credit(ca, c[idx], req, now_ms);
	} else {
		*b = CA_MIN_LOAD_FALLBACK;
		idx = ca_fallback(ca, c, n, req, now_ms);
	}
	ca_place_record(ca, cm, keys, nk, c[idx], now_ms);
	return idx;
}

/* ------------------------------------------------------------ selection */

static int
ca_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req)
{
	struct cache_aware *ca = p->pl_state;
	struct broker *br = p->pl_br;
	struct ca_model *cm;
	enum ca_branch b;
	uint64_t now = shm_now_ms(), sum = 0;
	double avg, rate = 0;
	unsigned i;
	int idx;

	if (n == 0) {
		ca_count(ca, CA_NO_HEALTHY_WORKERS);
		return -1;
	}
	for (i = 0; i < n; i++) {
		ca->ca_load[i] = br != NULL
		    ? shm_inflight_total(br->br_shm, c[i]->wk_slot)
		    : 0;
		sum += ca->ca_load[i];
	}
	avg = (double)sum / n;
	cm = ca_model(ca, c[0]->wk_model, false);
	if (cm == NULL) {
		idx = (int)policy_rand_below(n);
		b = CA_NO_TREE_RANDOM;
	} else if (ca->ca_hash) {
		idx = ca_hash_select(ca, cm, c, n, req, avg, now, &b);
	} else if (ca_kv_pressure(ca, c, n, now)) {
		b = CA_KV_PRESSURE_MIN_LOAD;
		idx = ca_fallback(ca, c, n, req, now);
		ca_insert(ca, cm, c[idx], req);
	} else if (br != NULL && req->has_tokens && req->n_tokens > 0 &&
	    kvindex_active(br, cm->cm_name)) {
		idx = ca_event_select(ca, cm, c, n, req, avg, now, &b, &rate);
	} else {
		for (i = 0; i < n; i++)
			if (c[i]->wk_slot < SHM_MAX_WORKERS)
				ca->ca_pos[c[i]->wk_slot] = (int)i;
		idx = ca_tree_select(ca, cm, c, n, req, avg, now, &b, &rate);
		for (i = 0; i < n; i++)
			if (c[i]->wk_slot < SHM_MAX_WORKERS)
				ca->ca_pos[c[i]->wk_slot] = -1;
	}
	ca_count(ca, b);
	if (br != NULL && br->br_debug)
		log_debug("%s: cache_aware model %s branch %s match %.3f "
		          "in_flight %u avg %.2f -> %s",
		    __func__, cm != NULL ? cm->cm_name : c[0]->wk_model,
		    ca_branch_name(b), rate, ca->ca_load[idx], avg,
		    c[idx]->wk_url);
	return idx;
}

/* ------------------------------------------------------------ eviction */

static void
ca_sweep(struct policy *p, uint64_t now_ms)
{
	struct cache_aware *ca = p->pl_state;
	struct ca_place **pp, *pl;
	struct ca_model *cm;
	unsigned i, j, k;
	size_t b, evicted;

	if (ca->ca_every_ms == 0 ||
	    now_ms - ca->ca_last_sweep_ms < ca->ca_every_ms)
		return;
	ca->ca_last_sweep_ms = now_ms;
	for (i = 0; i < ca->ca_nmodels; i++) {
		cm = ca->ca_models[i];
		if (!ca->ca_hash) {
			evicted =
			    tree_evict(cm->cm_str) + tree_evict(cm->cm_tok);
			if (evicted > 0)
				log_info("%s: model %s: evicted %zu prefixes",
				    __func__, cm->cm_name, evicted);
			ca_gauges(ca, cm);
			continue;
		}
		for (b = 0; b < cm->cm_nplace; b++) {
			pp = &cm->cm_place[b];
			while ((pl = *pp) != NULL) {
				for (j = 0, k = 0; j < pl->cp_n; j++) {
					if (now_ms - pl->cp_h[j].ch_touch_ms <=
					    ca->ca_ttl_ms)
						pl->cp_h[k++] = pl->cp_h[j];
				}
				pl->cp_n = k;
				if (k == 0) {
					*pp = pl->cp_next;
					free(pl);
					cm->cm_place_n--;
				} else
					pp = &pl->cp_next;
			}
		}
		ca_gauges(ca, cm);
	}
}
