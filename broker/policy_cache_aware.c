/*
 * policy_cache_aware.c: `cache_aware` (policies.md §11), the default
 * policy. Tree mode: per model a string tree (routing text) and a token
 * tree (token ids, paged by --block-size) whose tenants are worker slots;
 * the match rate against --cache-threshold decides whether the cache
 * counts. Every worker is then judged by its expected wait (scorer.h, live
 * figures from live.c): its pending prompt tokens plus the part of this
 * prompt it does not hold, over its prefill rate. Above the threshold the
 * holders compete among themselves, and a non-holder also pays the reuse
 * it forfeits (the matched prefix it would prefill again); the request
 * spills off the best holder when another worker still waits less after
 * that charge (the holder's queue costs more than its cache saves), or
 * when the holder is over the in-flight gate of --balance-abs-threshold
 * and --balance-rel-threshold. Below it, or under KV pressure, the plain
 * expected wait decides (the fallback pick). Hash mode (--cache-index hash,
 * §11.7): per model a placement map of (boundary, prefix hash) -> up to 3
 * holders with a TTL. Event mode (§11.4): a request with tokens whose model's
 * KV-event block index (kvindex.c) holds blocks goes where the engines' caches
 * overlap it. Every tree insert is journaled through persist.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
	uint64_t cp_saved_ms; /* last written to the store, 0 never */
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
	/* scratch, per decision: live figures of c[i], its cached tokens */
	struct scorer_cand ca_cands[SHM_MAX_WORKERS];
	uint32_t ca_load[SHM_MAX_WORKERS];
	uint64_t ca_cached[SHM_MAX_WORKERS];
	double ca_score[SHM_MAX_WORKERS];
	uint64_t ca_prompt; /* this request's prompt tokens */
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
static void ca_restore_place(struct policy *p, const char *key,
    const char *const *urls, const uint64_t *touch_ms, unsigned n);
static void ca_place_save(struct cache_aware *ca, struct ca_model *cm,
    struct ca_place *pl, uint64_t now_ms);
static struct ca_model *ca_model(struct cache_aware *ca, const char *name,
    bool create);
static void ca_model_free(struct ca_model *cm);
static const struct worker_load *ca_report(const struct cache_aware *ca,
    const struct worker *w, uint64_t now_ms);
static int ca_fallback(struct cache_aware *ca, unsigned n, uint64_t now_ms);
static void ca_charge(struct cache_aware *ca, unsigned n, bool cache,
    uint64_t matched, uint64_t now_ms);
static int ca_best(struct cache_aware *ca, unsigned n, int skip, double avg);
static bool ca_spills(struct cache_aware *ca, unsigned n, int *idx, double avg);
static bool ca_gated(const struct cache_aware *ca, uint32_t load, double avg);
static bool ca_kv_pressure(const struct cache_aware *ca,
    struct worker *const *c, unsigned n, uint64_t now_ms);
static int ca_pick_holder(struct cache_aware *ca, struct worker *const *c,
    const int *hp, unsigned nh, const double *matched, double blocks,
    uint32_t bs, double avg, uint64_t now_ms);
static uint64_t ca_tokens(const struct cache_aware *ca, size_t units,
    size_t input);
static void ca_insert(struct cache_aware *ca, struct ca_model *cm,
    struct worker *w, const Smg__RouteRequest *req);
static int ca_tree_select(struct cache_aware *ca, struct ca_model *cm,
    struct worker *const *c, unsigned n, const Smg__RouteRequest *req,
    double avg, uint64_t now_ms, enum ca_branch *b, double *rate);
static int ca_event_knobs(struct cache_aware *ca, struct ca_model *cm,
    struct worker *const *c, unsigned n, const Smg__RouteRequest *req,
    double avg, uint64_t now_ms, uint32_t *score);
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
static void ca_prune(struct cache_aware *ca);

const struct policy_ops policy_cache_aware_ops = {
	.po_kind = POLICY_CACHE_AWARE,
	.po_branch_metric = "smg_cache_aware_policy_branch_total",
	.po_create = ca_create,
	.po_free = ca_free,
	.po_select = ca_select,
	.po_on_add = ca_on_add,
	.po_on_remove = ca_on_remove,
	.po_on_report = ca_on_report,
	.po_sweep = ca_sweep,
	.po_replay = policy_cache_aware_replay,
	.po_restore_place = ca_restore_place,
};

/* ------------------------------------------------------------ lifecycle */

static void *
ca_create(struct policy *p)
{
	struct broker *br = p->pl_br;
	const struct config *cf = br != NULL ? br->br_cf : NULL;
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
	if (cf == NULL) {
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
			ca->ca_threshold = cf->cf_cache_threshold;
			ca->ca_abs = (double)cf->cf_balance_abs_threshold;
			ca->ca_rel = cf->cf_balance_rel_threshold;
			ca->ca_every_ms =
			    (uint64_t)cf->cf_eviction_interval * 1000;
			ca->ca_max_size = cf->cf_max_tree_size;
			if (cf->cf_cache_boundaries_n > 0) {
				ca->ca_nbounds = cf->cf_cache_boundaries_n;
				ca->ca_bounds = xcalloc(ca->ca_nbounds,
				    sizeof(*ca->ca_bounds));
				memcpy(ca->ca_bounds, cf->cf_cache_boundaries,
				    ca->ca_nbounds * sizeof(*ca->ca_bounds));
			}
			ca->ca_hash =
			    (cf->cf_cache_index == CACHE_INDEX_HASH) &&
			    ca->ca_nbounds > 0;
		}
		/* §13: these come from the flags for every instance. */
		if (cf->cf_block_size > 0)
			ca->ca_bs = cf->cf_block_size;
		ca->ca_bal_tu = cf->cf_balance_token_usage_threshold;
		ca->ca_over_tu = cf->cf_overload_token_usage_threshold;
		ca->ca_decay = cf->cf_overlap_decay;
		ca->ca_temp = cf->cf_selection_temperature;
		if (cf->cf_cache_ttl_secs > 0)
			ca->ca_ttl_ms = (uint64_t)cf->cf_cache_ttl_secs * 1000;
	}
	if (ca->ca_max_size == 0)
		ca->ca_max_size = 10000;
	if (ca->ca_rel < 1.0)
		ca->ca_rel = 1.0;
	if (cf != NULL)
		ca->ca_interval_ms =
		    (uint64_t)cf->cf_load_monitor_interval * 1000;
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
	unsigned i;

	if (cm->cm_str != NULL && w->wk_slot <= TREE_MAX_TENANT) {
		(void)tree_insert(cm->cm_str, "", 0, w->wk_slot);
		/* A worker whose model changed (discovered) is never a
		 * candidate under the old one: its prefixes there are dead. */
		for (i = 0; i < ca->ca_nmodels; i++) {
			if (ca->ca_models[i] == cm)
				continue;
			tree_remove_tenant(ca->ca_models[i]->cm_str,
			    w->wk_slot);
			tree_remove_tenant(ca->ca_models[i]->cm_tok,
			    w->wk_slot);
		}
		ca_prune(ca);
	}
	ca_gauges(ca, cm);
}

/*
 * Drops the tree-mode models no worker holds any more (the "unknown" model
 * once its workers' models are discovered, a model whose workers are all
 * gone), with their gauge series, so /metrics lists only live models.
 */
static void
ca_prune(struct cache_aware *ca)
{
	struct broker *br = ca->ca_p->pl_br;
	struct ca_model *cm;
	unsigned i = 0;

	while (i < ca->ca_nmodels) {
		cm = ca->ca_models[i];
		if (ca->ca_hash || tree_tenants(cm->cm_str) > 0 ||
		    tree_tenants(cm->cm_tok) > 0) {
			i++;
			continue;
		}
		if (br != NULL) {
			stats_retire(br, cm->cm_m_chars);
			stats_retire(br, cm->cm_m_tokens);
			stats_retire(br, cm->cm_m_ten_str);
			stats_retire(br, cm->cm_m_ten_tok);
		}
		ca_model_free(cm);
		ca->ca_models[i] = ca->ca_models[--ca->ca_nmodels];
	}
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
	ca_prune(ca);
	for (i = 0; i < ca->ca_nmodels; i++)
		ca_gauges(ca, ca->ca_models[i]);
}

static void
ca_on_report(struct policy *p, struct worker *w)
{
	struct cache_aware *ca = p->pl_state;
	const struct worker_load *l = &w->wk_load;
	struct scorer_report r = { 0 };

	if (!l->wl_valid) {
		scorer_report(ca->ca_scorer, w->wk_url_hash, NULL,
		    l->wl_received_ms);
		return;
	}
	memset(&r, 0, sizeof(r));
	r.sr_waiting_reqs = l->wl_waiting_reqs;
	r.sr_waiting_uncached_tokens = l->wl_waiting_uncached_tokens;
	r.sr_gen_throughput = l->wl_gen_throughput;
	r.sr_token_usage = l->wl_token_usage;
	r.sr_pending_then = live_pending(p->pl_br, w);
	r.sr_in_flight_then = live_in_flight(p->pl_br, w);
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
	/* Recorded before the worker's model was known, replayed after:
	 * dead state (a model still unknown may yet become the recorded
	 * one, so the other way round is kept). */
	if (model != NULL && strcmp(model, BROKER_MODEL_UNKNOWN) == 0 &&
	    strcmp(w->wk_model, BROKER_MODEL_UNKNOWN) != 0)
		return;
	cm = ca_model(ca, model, true);
	if (kind == 0)
		(void)tree_insert(cm->cm_str, key, keylen, w->wk_slot);
	else
		(void)tree_insert_tokens(cm->cm_tok, key, keylen, w->wk_slot);
	ca_gauges(ca, cm);
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
		ca->ca_m_branch[b] = stats_series(br, METRICS_COUNTER,
		    "smg_cache_aware_policy_branch_total", "branch=\"%s\"",
		    ca_branch_name(b));
	stats_add(br, ca->ca_m_branch[b], 1);
}

static void
ca_gauges(struct cache_aware *ca, struct ca_model *cm)
{
	struct broker *br = ca->ca_p->pl_br;
	char m[SHM_MODEL_MAX * 2];

	if (br == NULL)
		return;
	if (ca->ca_hash) {
		if (cm->cm_m_place == -2) {
			stats_label_escape(m, sizeof(m), cm->cm_name);
			cm->cm_m_place = stats_series(br, METRICS_GAUGE,
			    "smg_cache_placement_entries", "model=\"%s\"", m);
		}
		stats_set(br, cm->cm_m_place, (int64_t)cm->cm_place_n);
		return;
	}
	if (cm->cm_m_chars == -2) {
		stats_label_escape(m, sizeof(m), cm->cm_name);
		cm->cm_m_chars = stats_series(br, METRICS_GAUGE,
		    "smg_cache_tree_chars", "model=\"%s\"", m);
		cm->cm_m_tokens = stats_series(br, METRICS_GAUGE,
		    "smg_cache_tree_tokens", "model=\"%s\"", m);
		cm->cm_m_ten_str =
		    stats_series(br, METRICS_GAUGE, "smg_cache_tree_tenants",
		        "model=\"%s\",tree=\"string\"", m);
		cm->cm_m_ten_tok = stats_series(br, METRICS_GAUGE,
		    "smg_cache_tree_tenants", "model=\"%s\",tree=\"token\"", m);
	}
	stats_set(br, cm->cm_m_chars, (int64_t)tree_size(cm->cm_str));
	stats_set(br, cm->cm_m_tokens, (int64_t)tree_size(cm->cm_tok));
	stats_set(br, cm->cm_m_ten_str, (int64_t)tree_tenants(cm->cm_str));
	stats_set(br, cm->cm_m_ten_tok, (int64_t)tree_tenants(cm->cm_tok));
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

/*
 * §11.5: the expected wait over every candidate as ca_cands holds it (the
 * uncached part of the prompt per worker, no forfeit charge).
 */
static int
ca_fallback(struct cache_aware *ca, unsigned n, uint64_t now_ms)
{
	struct scorer_pick pick;
	int idx;

	idx = scorer_select(ca->ca_scorer, ca->ca_cands, n, now_ms,
	    ca->ca_interval_ms, &pick);
	return idx >= 0 ? idx : 0;
}

/*
 * Tokens of the prompt for `units` chars or tokens of an input of `input`
 * units: the prompt estimate scaled, so text (chars) and token ids speak
 * the same unit as the frontends' pending tokens.
 */
static uint64_t
ca_tokens(const struct cache_aware *ca, size_t units, size_t input)
{
	if (input == 0 || units >= input)
		return units == 0 ? 0 : ca->ca_prompt;
	return (
	    uint64_t)((double)ca->ca_prompt * (double)units / (double)input);
}

/*
 * Cache-routing charges: with `cache`, every candidate prefills what it
 * does not hold, and one that holds less than `matched` (the best match)
 * forfeits the difference, which it would prefill again and hold twice in
 * the fleet; without, the whole prompt everywhere (a match at or below
 * --cache-threshold does not count). Then scores every candidate into
 * ca_score.
 */
static void
ca_charge(struct cache_aware *ca, unsigned n, bool cache, uint64_t matched,
    uint64_t now_ms)
{
	uint64_t held;
	unsigned i;

	for (i = 0; i < n; i++) {
		held = cache ? ca->ca_cached[i] : 0;
		ca->ca_cands[i].sc_uncached =
		    ca->ca_prompt > held ? ca->ca_prompt - held : 0;
		ca->ca_cands[i].sc_forfeit =
		    cache && matched > held ? matched - held : 0;
		ca->ca_score[i] = scorer_score(ca->ca_scorer, &ca->ca_cands[i],
		    now_ms, ca->ca_interval_ms, NULL);
	}
}

/*
 * Lowest ca_score among candidates other than skip that are not over the
 * in-flight gate; ties uniformly at random. -1 when there is none.
 */
static int
ca_best(struct cache_aware *ca, unsigned n, int skip, double avg)
{
	uint32_t ties = 0;
	unsigned i;
	int best = -1;

	for (i = 0; i < n; i++) {
		if ((int)i == skip || ca_gated(ca, ca->ca_load[i], avg))
			continue;
		if (best < 0 || ca->ca_score[i] < ca->ca_score[best]) {
			best = (int)i;
			ties = 1;
		} else if (ca->ca_score[i] == ca->ca_score[best] &&
		    policy_rand_below(++ties) == 0)
			best = (int)i;
	}
	return best;
}

/*
 * The spill decision for holder *idx (ca_charge done): to the best other
 * worker when the holder is over the in-flight gate (§11.3), or when that
 * worker's expected wait, forfeit included, is lower than the holder's.
 * Returns whether it spilled (*idx then moved).
 */
static bool
ca_spills(struct cache_aware *ca, unsigned n, int *idx, double avg)
{
	int alt;

	if ((alt = ca_best(ca, n, *idx, avg)) < 0)
		return false;
	if (!ca_gated(ca, ca->ca_load[*idx], avg) &&
	    ca->ca_score[alt] >= ca->ca_score[*idx])
		return false;
	*idx = alt;
	return true;
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
 * Among the holder candidates hp[0..nh): lowest expected wait (ca_score)
 * among those under the in-flight gate, or among all when every one is
 * over it (§11.3: then the spill gate fires), ties random; with decay or
 * temperature (§11.6) the decayed match score decides: matched[i] is
 * holder i's match (tree: equal; event mode: its block overlap), blocks
 * the request's blocks of bs tokens.
 */
static int
ca_pick_holder(struct cache_aware *ca, struct worker *const *c, const int *hp,
    unsigned nh, const double *matched, double blocks, uint32_t bs, double avg,
    uint64_t now_ms)
{
	static double score[SHM_MAX_WORKERS];
	const struct worker_load *l;
	double best, lo, hi, w, total, r;
	int64_t minb = INT64_MAX, backlog;
	uint32_t bl = UINT32_MAX, ties = 0;
	unsigned i;
	int pick = -1;
	bool pick_gated = false;

	if (ca->ca_decay <= 0 && ca->ca_temp <= 0) {
		for (i = 0; i < nh; i++) {
			bool g = ca_gated(ca, ca->ca_load[hp[i]], avg);

			if (pick < 0 || (!g && pick_gated) ||
			    (g == pick_gated &&
			        ca->ca_score[hp[i]] < ca->ca_score[pick])) {
				pick = hp[i];
				pick_gated = g;
				ties = 1;
			} else if (g == pick_gated &&
			    ca->ca_score[hp[i]] == ca->ca_score[pick] &&
			    policy_rand_below(++ties) == 0)
				pick = hp[i];
		}
		return pick;
	}
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
		score[i] = matched[i];
		l = ca_report(ca, c[hp[i]], now_ms);
		if (ca->ca_decay > 0 && l != NULL) {
			backlog = l->wl_waiting_uncached_tokens > 0
			    ? l->wl_waiting_uncached_tokens
			    : 0;
			score[i] /= 1.0 +
			    ca->ca_decay *
			        (((double)(backlog - minb) / bs) / blocks);
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
		ca_gauges(ca, cm);
		return;
	}
	text = req->has_text && req->text != NULL ? req->text : "";
	len = strlen(text);
	if (tree_insert(cm->cm_str, text, len, w->wk_slot) == 0 && br != NULL &&
	    len > 0)
		persist_tree_insert(br, ca->ca_p, cm->cm_name, 0, w->wk_url,
		    text, len);
	/* The insert evicted down to the cap: the gauges follow both. */
	ca_gauges(ca, cm);
}

/* ------------------------------------------------------------ tree mode */

static int
ca_tree_select(struct cache_aware *ca, struct ca_model *cm,
    struct worker *const *c, unsigned n, const Smg__RouteRequest *req,
    double avg, uint64_t now_ms, enum ca_branch *b, double *rate)
{
	struct tree_match m;
	int hp[TREE_MAX_HOLDERS], idx;
	double each[TREE_MAX_HOLDERS];
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
	/* What each candidate holds of this prompt (a shorter prefix too). */
	for (i = 0; i < n; i++)
		ca->ca_cached[i] =
		    m.tm_matched == 0 || c[i]->wk_slot > TREE_MAX_TENANT
		    ? 0
		    : ca_tokens(ca, tree_match_depth(&m, c[i]->wk_slot),
		          m.tm_input);
	if (*rate <= ca->ca_threshold) {
		*b = CA_MIN_LOAD_FALLBACK;
		ca_charge(ca, n, false, 0, now_ms);
		idx = ca_fallback(ca, n, now_ms);
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
		return 0;
	}
	ca_charge(ca, n, true, ca_tokens(ca, m.tm_matched, m.tm_input), now_ms);
	for (i = 0; i < nh; i++)
		each[i] = (double)m.tm_matched;
	/* §11.6: request_blocks of a tree holder = max(1, len / bs). */
	idx = ca_pick_holder(ca, c, hp, nh, each,
	    (double)m.tm_input / ca->ca_bs, ca->ca_bs, avg, now_ms);
	*b = ca_spills(ca, n, &idx, avg) ? CA_SPILL : CA_TREE_MATCH;
	ca_insert(ca, cm, c[idx], req);
	return idx;
}

/* ------------------------------------------------------------ event mode */

/*
 * §11.6 in event mode: every candidate's block overlap, then the holders
 * (overlap > 0) are weighed by decay and temperature as tree holders are.
 * Returns the pick and its overlap in *score, or -1 when nobody overlaps.
 */
static int
ca_event_knobs(struct cache_aware *ca, struct ca_model *cm,
    struct worker *const *c, unsigned n, const Smg__RouteRequest *req,
    double avg, uint64_t now_ms, uint32_t *score)
{
	static unsigned slots[SHM_MAX_WORKERS];
	static uint32_t sc[SHM_MAX_WORKERS];
	static int hp[SHM_MAX_WORKERS];
	static double each[SHM_MAX_WORKERS];
	struct kvindex *kx = kvindex_of(ca->ca_p->pl_br);
	uint32_t bs = kvindex_block_size(kx, cm->cm_name);
	unsigned i, nh = 0;
	int idx;

	if (bs == 0)
		bs = ca->ca_bs;
	for (i = 0; i < n; i++)
		slots[i] = c[i]->wk_slot;
	kvindex_overlap(kx, cm->cm_name, req->tokens, req->n_tokens, bs, slots,
	    n, sc, now_ms);
	for (i = 0; i < n; i++)
		if (sc[i] > 0) {
			hp[nh] = (int)i;
			each[nh++] = sc[i];
		}
	*score = 0;
	if (nh == 0)
		return -1;
	idx = ca_pick_holder(ca, c, hp, nh, each, (double)(req->n_tokens / bs),
	    bs, avg, now_ms);
	*score = sc[idx];
	return idx;
}

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

	if (ca->ca_decay > 0 || ca->ca_temp > 0)
		idx = ca_event_knobs(ca, cm, c, n, req, avg, now_ms, &score);
	else
		idx = kvindex_select(br, cm->cm_name, c, n, ca->ca_load,
		    req->tokens, req->n_tokens, ca->ca_bs, &score);
	if (idx < 0) {
		*b = CA_EVENT_NO_OVERLAP;
		ca_charge(ca, n, false, 0, now_ms);
		return ca_fallback(ca, n, now_ms);
	}
	bs = kvindex_block_size(kvindex_of(br), cm->cm_name);
	*rate = (double)score * (bs ? bs : ca->ca_bs) / (double)req->n_tokens;
	/* Only the best overlap is known: the others count as cold. */
	ca->ca_cached[idx] =
	    ca_tokens(ca, (size_t)score * (bs ? bs : ca->ca_bs), req->n_tokens);
	ca_charge(ca, n, true, ca->ca_cached[idx], now_ms);
	*b = ca_spills(ca, n, &idx, avg) ? CA_EVENT_SPILL : CA_EVENT_MATCH;
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
	bool changed;
	size_t k;

	for (k = 0; k < nkeys; k++) {
		pl = ca_place_get(cm, keys[k], true);
		changed = false;
		for (i = 0, j = 0; i < pl->cp_n; i++) {
			if (now_ms - pl->cp_h[i].ch_touch_ms > ca->ca_ttl_ms)
				continue; /* expired */
			pl->cp_h[j++] = pl->cp_h[i];
		}
		changed = j != pl->cp_n;
		pl->cp_n = j;
		for (i = 0; i < pl->cp_n; i++) {
			if (pl->cp_h[i].ch_url_hash == w->wk_url_hash)
				break;
		}
		if (i == pl->cp_n) {
			changed = true;
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
		/* Written behind when its holders change, and refreshed a few
		 * times per TTL, so a hot key costs little. */
		if (changed || pl->cp_saved_ms == 0 ||
		    now_ms - pl->cp_saved_ms >= ca->ca_ttl_ms / 4)
			ca_place_save(ca, cm, pl, now_ms);
	}
}

/* The store's key of a placement: the map key in hex, then the model. */
static void
ca_place_name(const struct ca_model *cm, uint64_t key, char *buf, size_t len)
{
	snprintf(buf, len, "%016llx %s", (unsigned long long)key, cm->cm_name);
}

/* Writes (or, without holders, deletes) the stored copy of pl. */
static void
ca_place_save(struct cache_aware *ca, struct ca_model *cm, struct ca_place *pl,
    uint64_t now_ms)
{
	struct broker *br = ca->ca_p->pl_br;
	const char *urls[CA_HOLDERS_MAX];
	uint64_t touch[CA_HOLDERS_MAX], wall;
	char scope[SHM_MODEL_MAX + 32], inst[SHM_MODEL_MAX + 16];
	char name[SHM_MODEL_MAX + 24];
	struct timespec ts;
	unsigned i, j, n = 0;

	if (br == NULL || br->br_store == NULL)
		return;
	/* Touch times are monotonic: stored as wall-clock times. */
	clock_gettime(CLOCK_REALTIME, &ts);
	wall = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
	for (i = 0; i < pl->cp_n; i++) {
		for (j = 0; j < br->br_nworkers; j++) {
			if (br->br_order[j]->wk_url_hash ==
			    pl->cp_h[i].ch_url_hash)
				break;
		}
		if (j == br->br_nworkers)
			continue; /* a worker gone since */
		urls[n] = br->br_order[j]->wk_url;
		touch[n++] = wall - (now_ms - pl->cp_h[i].ch_touch_ms);
	}
	snprintf(scope, sizeof(scope), "hash/%s",
	    persist_scope(br, ca->ca_p, inst, sizeof(inst)));
	ca_place_name(cm, pl->cp_key, name, sizeof(name));
	persist_place_put(br, scope, name, urls, touch, n);
	pl->cp_saved_ms = now_ms;
}

/* persist_restore's hook: a placement saved by ca_place_save. */
static void
ca_restore_place(struct policy *p, const char *key, const char *const *urls,
    const uint64_t *touch_ms, unsigned n)
{
	struct cache_aware *ca = p->pl_state;
	struct ca_place *pl;
	struct ca_model *cm;
	struct timespec ts;
	uint64_t wall, now = shm_now_ms(), age, hkey;
	unsigned i;
	char *end;

	if (!ca->ca_hash || strlen(key) < 18 || key[16] != ' ')
		return;
	hkey = strtoull(key, &end, 16);
	if (end != key + 16)
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	wall = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
	cm = ca_model(ca, key + 17, true);
	pl = NULL;
	for (i = 0; i < n; i++) {
		age = wall > touch_ms[i] ? wall - touch_ms[i] : 0;
		if (age > ca->ca_ttl_ms || age > now ||
		    registry_find(p->pl_br, urls[i]) == NULL)
			continue; /* expired, or a worker gone */
		if (pl == NULL)
			pl = ca_place_get(cm, hkey, true);
		if (pl->cp_n == CA_HOLDERS_MAX)
			break;
		pl->cp_h[pl->cp_n].ch_url_hash =
		    XXH3_64bits(urls[i], strlen(urls[i]));
		pl->cp_h[pl->cp_n++].ch_touch_ms = now - age;
	}
	if (pl != NULL)
		pl->cp_saved_ms = now;
}

static int
ca_hash_select(struct cache_aware *ca, struct ca_model *cm,
    struct worker *const *c, unsigned n, const Smg__RouteRequest *req,
    double avg, uint64_t now_ms, enum ca_branch *b)
{
	uint64_t keys[64], held = 0;
	struct ca_place *pl;
	size_t nk, k;
	unsigned i, j;
	int idx = -1;

	ca_charge(ca, n, false, 0, now_ms);
	if (!req->has_tokens || req->n_tokens == 0 || ca->ca_nbounds == 0 ||
	    req->n_tokens < ca->ca_bounds[0]) {
		*b = req->has_tokens && req->n_tokens > 0
		    ? CA_SHORT_REQUEST
		    : CA_MIN_LOAD_FALLBACK;
		return ca_fallback(ca, n, now_ms);
	}
	nk = ca_hash_keys(ca, req->tokens, req->n_tokens, keys);
	if (ca_kv_pressure(ca, c, n, now_ms)) {
		*b = CA_KV_PRESSURE_MIN_LOAD;
		idx = ca_fallback(ca, n, now_ms);
		ca_place_record(ca, cm, keys, nk, c[idx], now_ms);
		return idx;
	}
	for (k = 0; k < nk && idx < 0; k++) {
		if ((pl = ca_place_get(cm, keys[k], false)) == NULL)
			continue;
		/* Key k is boundary nk - 1 - k (deepest first). */
		held = ca->ca_bounds[nk - 1 - k];
		for (i = 0; i < pl->cp_n; i++) {
			if (now_ms - pl->cp_h[i].ch_touch_ms > ca->ca_ttl_ms)
				continue;
			for (j = 0; j < n; j++) {
				if (c[j]->wk_url_hash !=
				    pl->cp_h[i].ch_url_hash)
					continue;
				ca->ca_cached[j] = held;
				/* Least in-flight, ties lower index. */
				if (idx < 0 ||
				    ca->ca_load[j] < ca->ca_load[idx] ||
				    (ca->ca_load[j] == ca->ca_load[idx] &&
				        (int)j < idx))
					idx = (int)j;
			}
		}
	}
	if (idx >= 0) {
		ca_charge(ca, n, true, held, now_ms);
		*b = ca_spills(ca, n, &idx, avg) ? CA_HASH_SPILL : CA_HASH_HIT;
	} else {
		*b = CA_MIN_LOAD_FALLBACK;
		idx = ca_fallback(ca, n, now_ms);
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
	ca->ca_prompt = live_prompt_tokens(req,
	    scorer_get_tunables(ca->ca_scorer)->st_mean_prefill_tokens);
	for (i = 0; i < n; i++) {
		ca->ca_load[i] = live_in_flight(br, c[i]);
		sum += ca->ca_load[i];
		ca->ca_cached[i] = 0;
		ca->ca_cands[i].sc_id = c[i]->wk_url_hash;
		ca->ca_cands[i].sc_in_flight = ca->ca_load[i];
		ca->ca_cands[i].sc_pending = live_pending(br, c[i]);
		ca->ca_cands[i].sc_rate = live_rate(c[i]);
		ca->ca_cands[i].sc_uncached = ca->ca_prompt;
		ca->ca_cands[i].sc_forfeit = 0;
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
		idx = ca_fallback(ca, n, now);
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
	route_hint_cached(br, c[idx], ca->ca_cached[idx]);
	if (br != NULL && br->br_debug)
		log_debug("%s: cache_aware model %s branch %s match %.3f "
		          "in_flight %u avg %.2f -> %s (pending %llu, cached "
		          "%llu of %llu, rate %.0f)",
		    __func__, cm != NULL ? cm->cm_name : c[0]->wk_model,
		    ca_branch_name(b), rate, ca->ca_load[idx], avg,
		    c[idx]->wk_url,
		    (unsigned long long)ca->ca_cands[idx].sc_pending,
		    (unsigned long long)ca->ca_cached[idx],
		    (unsigned long long)ca->ca_prompt,
		    ca->ca_cands[idx].sc_rate);
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
				if (k != pl->cp_n) {
					pl->cp_n = k;
					ca_place_save(ca, cm, pl, now_ms);
				}
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
