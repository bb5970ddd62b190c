/*
 * policy.c: the policy vtable, names (shared/policy_info.h), per-model
 * instances (policies.md §13), and the PRNG the policies share.
 */
#include <sys/random.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shared/log.h"
#include "shared/xmalloc.h"

#include "broker.h"

static const struct policy_ops *const policy_table[] = {
	&policy_random_ops,
	&policy_round_robin_ops,
	&policy_passthrough_ops,
	&policy_least_load_ops,
	&policy_power_of_two_ops,
	&policy_cache_aware_ops,
	&policy_prefix_hash_ops,
	&policy_consistent_hashing_ops,
	&policy_manual_ops,
	&policy_bucket_ops,
};

static uint64_t policy_rng[4];
static bool policy_rng_seeded;
static struct broker *policy_broker;

static const struct policy_ops *policy_ops_find(const char *canonical);
static uint64_t policy_rotl(uint64_t x, int k);
static uint64_t policy_next(void);
static void policy_seed(void);
static void policy_notify(struct broker *br, struct worker *w, int what);
static void policy_sweep_one(void *arg, struct policy *p);

const char *
policy_canonical(const char *name)
{
	enum policy_kind k;

	if (name == NULL || policy_info_parse(name, &k) == -1)
		return NULL;
	return policy_info_name(k);
}

static const struct policy_ops *
policy_ops_find(const char *canonical)
{
	size_t i;

	enum policy_kind k;

	if (policy_info_parse(canonical, &k) == -1)
		return NULL;
	for (i = 0; i < sizeof(policy_table) / sizeof(policy_table[0]); i++) {
		if (policy_table[i]->po_kind == k)
			return policy_table[i];
	}
	return NULL;
}

bool
policy_implemented(const char *canonical)
{
	return canonical != NULL && policy_ops_find(canonical) != NULL;
}

struct policy *
policy_new(const char *name, bool builtin_defaults)
{
	const struct policy_ops *ops;
	const char *canon;
	struct policy *p;

	if ((canon = policy_canonical(name)) == NULL) {
		log_warnx("%s: unknown policy '%s'", __func__, name);
		return NULL;
	}
	/* Every canonical name has an entry: a miss is a broken build. */
	if ((ops = policy_ops_find(canon)) == NULL)
		fatalx("%s: policy %s missing from the policy table", __func__,
		    canon);
	p = xcalloc(1, sizeof(*p));
	p->pl_ops = ops;
	p->pl_builtin = builtin_defaults;
	p->pl_br = policy_broker;
	if (ops->po_create != NULL)
		p->pl_state = ops->po_create(p);
	else
		p->pl_state =
		    ops->po_new != NULL ? ops->po_new(builtin_defaults) : NULL;
	return p;
}

void
policy_free(struct policy *p)
{
	if (p == NULL)
		return;
	if (p->pl_ops->po_free != NULL)
		p->pl_ops->po_free(p->pl_state);
	free(p);
}

const char *
policy_name(const struct policy *p)
{
	return policy_info_name(p->pl_ops->po_kind);
}

int
policy_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req)
{
	if (n == 0)
		return -1;
	return p->pl_ops->po_select(p, c, n, req);
}

struct policy *
policy_for(struct broker *br, struct model_entry *me, int leg)
{
	if (leg > SMG__LEG__LEG_SINGLE && leg < 4 && br->br_legs[leg] != NULL)
		return br->br_legs[leg];
	if (me != NULL && me->me_policy != NULL)
		return me->me_policy;
	return br->br_default;
}

void
policy_decide_model(struct broker *br, struct model_entry *me,
    const struct worker *first)
{
	const cJSON *lab;
	const char *canon, *def;

	if (me->me_policy_decided)
		return;
	me->me_policy_decided = true;
	if (strcmp(me->me_name, BROKER_MODEL_UNKNOWN) == 0)
		return;
	lab = first->wk_labels != NULL
	    ? cJSON_GetObjectItemCaseSensitive(first->wk_labels, "policy")
	    : NULL;
	if (!cJSON_IsString(lab) || lab->valuestring == NULL)
		return;
	if ((canon = policy_canonical(lab->valuestring)) == NULL) {
		log_warnx("%s: model %s: unknown policy label '%s', using "
		          "the default policy",
		    __func__, me->me_name, lab->valuestring);
		return;
	}
	def = policy_canonical(policy_info_name(br->br_cf->cf_policy));
	/* Same type as --policy: CLI tunables; another: built-in ones. */
	me->me_policy =
	    policy_new(canon, def == NULL || strcmp(def, canon) != 0);
	/* Frontends skip the routing text when --policy reads none. */
	if (br->br_shm != NULL &&
	    (strcmp(canon, "cache_aware") == 0 ||
	        strcmp(canon, "prefix_hash") == 0 ||
	        strcmp(canon, "bucket") == 0))
		shm_text_wanted_set(br->br_shm);
	log_info("%s: model %s uses its own %s instance (%s settings)",
	    __func__, me->me_name, canon,
	    me->me_policy->pl_builtin ? "built-in" : "command-line");
}

static void
policy_notify(struct broker *br, struct worker *w, int what)
{
	struct policy *all[8];
	unsigned i, n = 0;

	all[n++] = br->br_default;
	for (i = 1; i < 4; i++) {
		if (br->br_legs[i] != NULL)
			all[n++] = br->br_legs[i];
	}
	if (w->wk_me != NULL && w->wk_me->me_policy != NULL)
		all[n++] = w->wk_me->me_policy;
	for (i = 0; i < n; i++) {
		const struct policy_ops *ops;

		if (all[i] == NULL)
			continue;
		ops = all[i]->pl_ops;
		if (what == 0 && ops->po_on_add != NULL)
			ops->po_on_add(all[i], w);
		else if (what == 1 && ops->po_on_remove != NULL)
			ops->po_on_remove(all[i], w);
		else if (what == 2 && ops->po_on_report != NULL)
			ops->po_on_report(all[i], w);
	}
}

/* The model's own instance goes with its last worker (§13). */
static void
policy_model_gone(struct broker *br, struct model_entry *me)
{
	(void)br;
	policy_free(me->me_policy);
	me->me_policy = NULL;
}

/*
 * A worker that moved to another model is only added again: rings and
 * trees of the new model learn it; its state under the old model is left
 * to be skipped (never a candidate there).
 */
const struct registry_observer policy_registry_observer = {
	.ro_model_new = policy_decide_model,
	.ro_model_gone = policy_model_gone,
	.ro_worker_added = policy_notify_add,
	.ro_worker_removed = policy_notify_remove,
};

void
policy_notify_add(struct broker *br, struct worker *w)
{
	policy_notify(br, w, 0);
}

void
policy_notify_remove(struct broker *br, struct worker *w)
{
	policy_notify(br, w, 1);
}

void
policy_notify_report(struct broker *br, struct worker *w)
{
	policy_notify(br, w, 2);
}

void
policy_attach(struct broker *br)
{
	policy_broker = br;
}

void
policy_each(struct broker *br, policy_each_cb cb, void *arg)
{
	unsigned i;

	if (br->br_default != NULL)
		cb(arg, br->br_default);
	for (i = 1; i < 4; i++) {
		if (br->br_legs[i] != NULL)
			cb(arg, br->br_legs[i]);
	}
	for (i = 0; i < br->br_nmodels; i++) {
		if (br->br_models[i]->me_policy != NULL)
			cb(arg, br->br_models[i]->me_policy);
	}
}

static void
policy_sweep_one(void *arg, struct policy *p)
{
	if (p->pl_ops->po_sweep != NULL)
		p->pl_ops->po_sweep(p, *(const uint64_t *)arg);
}

void
policy_sweep_all(struct broker *br, uint64_t now_ms)
{
	policy_each(br, policy_sweep_one, &now_ms);
}

static uint64_t
policy_rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static void
policy_seed(void)
{
	uint64_t s;
	int i;

	if (getrandom(policy_rng, sizeof(policy_rng), 0) !=
	    (ssize_t)sizeof(policy_rng)) {
		/* No entropy source: time and pid still differ per run. */
		s = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
		for (i = 0; i < 4; i++) {
			s += 0x9e3779b97f4a7c15ULL;
			policy_rng[i] = s ^ (s >> 31);
		}
	}
	if ((policy_rng[0] | policy_rng[1] | policy_rng[2] | policy_rng[3]) ==
	    0)
		policy_rng[0] = 1;
	policy_rng_seeded = true;
}

/* xoshiro256** by Blackman and Vigna. */
static uint64_t
policy_next(void)
{
	uint64_t r, t;

	if (!policy_rng_seeded)
		policy_seed();
	r = policy_rotl(policy_rng[1] * 5, 7) * 9;
	t = policy_rng[1] << 17;
	policy_rng[2] ^= policy_rng[0];
	policy_rng[3] ^= policy_rng[1];
	policy_rng[1] ^= policy_rng[2];
	policy_rng[0] ^= policy_rng[3];
	policy_rng[2] ^= t;
	policy_rng[3] = policy_rotl(policy_rng[3], 45);
	return r;
}

uint32_t
policy_rand_below(uint32_t n)
{
	uint64_t m;
	uint32_t lo, threshold;

	if (n <= 1)
		return 0;
	/* Lemire's multiply-and-reject: unbiased. */
	m = (uint64_t)(uint32_t)(policy_next() >> 32) * n;
	lo = (uint32_t)m;
	if (lo < n) {
		threshold = (uint32_t)(-n) % n;
		while (lo < threshold) {
			m = (uint64_t)(uint32_t)(policy_next() >> 32) * n;
			lo = (uint32_t)m;
		}
	}
	return (uint32_t)(m >> 32);
}
