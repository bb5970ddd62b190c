/*
 * policy_manual.c: `manual` (policies.md §7). Each routing key is pinned
 * to up to two workers, first preferred; a key moves only when all of its
 * workers are unavailable or it was evicted after --max-idle-secs. The
 * map is persisted through persist.c under "manual/<instance>".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shared/config.h"
#include "shared/log.h"
#include "shared/metrics.h"
#include "shared/xmalloc.h"

#include "broker.h"

#define MANUAL_RESAVE_MS 60000

struct manual {
	struct policy *mn_p;
	struct sticky_map *mn_map;
	int mn_mode; /* enum assignment_mode */
	uint64_t mn_idle_ms; /* 0: no eviction */
	uint64_t mn_every_ms; /* 0: no eviction */
	uint64_t mn_last_sweep_ms;
	int mn_m_entries; /* gauge series, -2 not yet */
};

static void *manual_create(struct policy *p);
static void manual_free(void *state);
static int manual_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req);
static void manual_sweep(struct policy *p, uint64_t now_ms);
static int manual_pick(struct broker *br, struct manual *mn,
    struct worker *const *c, unsigned n);
static void manual_save(struct broker *br, struct manual *mn, const char *key,
    struct sticky_pin *pin);
static void manual_evicted(void *arg, const char *key);
static void manual_restore(struct policy *p, const char *key,
    const char *const *urls, unsigned nurls, uint64_t last_ms);

const struct policy_ops policy_manual_ops = {
	.po_kind = POLICY_MANUAL,
	.po_create = manual_create,
	.po_free = manual_free,
	.po_select = manual_select,
	.po_sweep = manual_sweep,
	.po_restore_assign = manual_restore,
};

static void *
manual_create(struct policy *p)
{
	const struct config *cf = p->pl_br != NULL ? p->pl_br->br_cf : NULL;
	struct manual *mn = xcalloc(1, sizeof(*mn));
	bool cli = cf != NULL && !p->pl_builtin;

	mn->mn_p = p;
	mn->mn_map = sticky_map_new();
	mn->mn_mode = ASSIGNMENT_MODE_RANDOM;
	mn->mn_idle_ms = 14400 * 1000ULL;
	mn->mn_every_ms = (p->pl_builtin ? 60 : 120) * 1000ULL;
	if (cli) {
		if (cf->cf_assignment_mode_set)
			mn->mn_mode = cf->cf_assignment_mode;
		mn->mn_idle_ms = (uint64_t)cf->cf_max_idle_secs * 1000;
		mn->mn_every_ms = (uint64_t)cf->cf_eviction_interval * 1000;
	}
	mn->mn_m_entries = -2;
	return mn;
}

static void
manual_free(void *state)
{
	struct manual *mn = state;

	if (mn == NULL)
		return;
	sticky_map_free(mn->mn_map);
	free(mn);
}

struct sticky_map *
policy_manual_map(struct policy *p)
{
	return ((struct manual *)p->pl_state)->mn_map;
}

/* persist_restore's hook for the records of manual_save. */
static void
manual_restore(struct policy *p, const char *key, const char *const *urls,
    unsigned nurls, uint64_t last_ms)
{
	sticky_map_restore(policy_manual_map(p), key, urls, nurls, last_ms);
}

/* §7.3; delegate has nothing to delegate to here: min_load. */
static int
manual_pick(struct broker *br, struct manual *mn, struct worker *const *c,
    unsigned n)
{
	int mode = mn->mn_mode;

	if (mode == ASSIGNMENT_MODE_DELEGATE)
		mode = ASSIGNMENT_MODE_MIN_LOAD;
	return sticky_assign_pick(br, mode, c, n);
}

static void
manual_save(struct broker *br, struct manual *mn, const char *key,
    struct sticky_pin *pin)
{
	char scope[SHM_MODEL_MAX + 32], inst[SHM_MODEL_MAX + 16];

	snprintf(scope, sizeof(scope), "manual/%s",
	    persist_scope(br, mn->mn_p, inst, sizeof(inst)));
	persist_assign_put(br, scope, key, pin);
	pin->sp_saved_ms = pin->sp_last_ms;
}

static int
manual_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req)
{
	struct manual *mn = p->pl_state;
	struct broker *br = p->pl_br;
	struct sticky_pin *pin;
	enum sticky_branch b;
	char key[STICKY_KEY_MAX];
	const char *src;
	unsigned i, j;
	int idx = -1;
	uint64_t now = sticky_wall_ms();

	if (n == 0 || br == NULL) {
		if (br != NULL)
			sticky_count_branch(br, STICKY_NO_HEALTHY_WORKERS);
		return n == 0 ? -1 : (int)policy_rand_below(n);
	}
	if (sticky_key(br, req, key, sizeof(key), &src) == NULL) {
		idx = manual_pick(br, mn, c, n);
		b = STICKY_NO_ROUTING_ID;
	} else if ((pin = sticky_map_get(mn->mn_map, key)) != NULL) {
		pin->sp_last_ms = now;
		for (i = 0; i < pin->sp_n && idx < 0; i++) {
			for (j = 0; j < n; j++) {
				if (strcmp(pin->sp_urls[i], c[j]->wk_url) ==
				    0) {
					idx = (int)j;
					break;
				}
			}
		}
		if (idx >= 0) {
			b = STICKY_OCCUPIED_HIT;
			if (now - pin->sp_saved_ms >= MANUAL_RESAVE_MS)
				manual_save(br, mn, key, pin);
		} else {
			idx = manual_pick(br, mn, c, n);
			sticky_pin_append(pin, c[idx]->wk_url);
			manual_save(br, mn, key, pin);
			b = STICKY_OCCUPIED_MISS;
		}
	} else {
		idx = manual_pick(br, mn, c, n);
		pin = sticky_map_add(mn->mn_map, key);
		pin->sp_last_ms = now;
		sticky_pin_append(pin, c[idx]->wk_url);
		manual_save(br, mn, key, pin);
		b = STICKY_VACANT;
	}
	sticky_count_branch(br, b);
	if (mn->mn_m_entries == -2)
		mn->mn_m_entries = stats_series(br, METRICS_GAUGE,
		    "smg_manual_policy_cache_entries", "%s", "");
	stats_set(br, mn->mn_m_entries, (int64_t)sticky_map_size(mn->mn_map));
	if (br->br_debug)
		log_debug("%s: manual key %s branch %s worker %s", __func__,
		    b == STICKY_NO_ROUTING_ID ? "-" : key,
		    sticky_branch_name(b), c[idx]->wk_url);
	return idx;
}

struct manual_evict_ctx {
	struct broker *ec_br;
	char ec_scope[SHM_MODEL_MAX + 32];
};

static void
manual_evicted(void *arg, const char *key)
{
	struct manual_evict_ctx *ec = arg;

	persist_assign_del(ec->ec_br, ec->ec_scope, key);
}

static void
manual_sweep(struct policy *p, uint64_t now_ms)
{
	struct manual *mn = p->pl_state;
	struct manual_evict_ctx ec;
	char inst[SHM_MODEL_MAX + 16];
	size_t n;

	if (mn->mn_every_ms == 0 || mn->mn_idle_ms == 0 || p->pl_br == NULL)
		return; /* §7.4: no eviction task */
	if (now_ms - mn->mn_last_sweep_ms < mn->mn_every_ms)
		return;
	mn->mn_last_sweep_ms = now_ms;
	ec.ec_br = p->pl_br;
	snprintf(ec.ec_scope, sizeof(ec.ec_scope), "manual/%s",
	    persist_scope(p->pl_br, p, inst, sizeof(inst)));
	n = sticky_map_evict(mn->mn_map, sticky_wall_ms(), mn->mn_idle_ms,
	    manual_evicted, &ec);
	if (n > 0)
		log_info("%s: evicted %zu idle keys", __func__, n);
	if (mn->mn_m_entries >= 0)
		stats_set(p->pl_br, mn->mn_m_entries,
		    (int64_t)sticky_map_size(mn->mn_map));
}
