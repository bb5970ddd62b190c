/*
 * sticky.c: routing keys. The sticky-session overlay of policies.md §8
 * (--routing-key-override on top of any policy but manual and
 * consistent_hashing), the assignment map it shares with manual (§7), the
 * effective key and its lineage stripping (§8.2), the per-key in-flight
 * counts of §1.4 and the assignment modes of §7.3.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

#include "shared/config.h"
#include "shared/log.h"
#include "shared/metrics.h"
#include "shared/xmalloc.h"

#include "broker.h"

#define STICKY_CLAMP_MS  2000
#define STICKY_RESAVE_MS 60000
#define STICKY_SCOPE     "sticky"
#define STICKY_KEY_CAP   128

struct sticky_ent {
	char *se_key;
	uint64_t se_hash;
	struct sticky_pin se_pin;
	struct sticky_ent *se_next;
};

struct sticky_map {
	struct sticky_ent **sm_b;
	size_t sm_nb; /* power of two */
	size_t sm_n;
};

/* One (key, worker) in-flight count. */
struct sticky_fl {
	uint64_t sf_hash; /* XXH3 of the effective key */
	unsigned sf_slot;
	uint32_t sf_gen;
	uint32_t sf_count;
	uint64_t sf_changed_ms;
	struct sticky_fl *sf_next;
};

struct sticky_state {
	struct sticky_map *ss_map;
	struct sticky_fl **ss_fl;
	size_t ss_nfl; /* buckets, power of two */
	size_t ss_fl_n;
	uint32_t ss_keys_on[SHM_MAX_WORKERS];
	int ss_branch[STICKY_NBRANCHES]; /* series, -2 not yet */
	int ss_source[2]; /* rid, header */
	uint64_t ss_last_sweep_ms;
};

static void sticky_map_grow(struct sticky_map *m);
static uint64_t sticky_hash(const char *key);
static void sticky_pin_clear(struct sticky_pin *p);
static struct sticky_fl **sticky_fl_find(struct sticky_state *ss, uint64_t h,
    const struct worker *w);
static uint32_t sticky_fl_effective(struct broker *br, struct sticky_fl **pp,
    struct worker *w, uint64_t now_ms);
static void sticky_fl_add(struct broker *br, uint64_t h, struct worker *w,
    int delta);
static bool sticky_digits(const char *s, size_t n);
static int sticky_pinned(struct sticky_pin *pin, struct worker *const *c,
    unsigned n);
static int sticky_mode(struct broker *br);
static int sticky_pick(struct broker *br, struct policy *p, int mode,
    struct worker *const *c, unsigned n, const Smg__RouteRequest *req);
static void sticky_save(struct broker *br, const char *key,
    struct sticky_pin *pin);
static void sticky_evicted(void *arg, const char *key);
static void sticky_restore(struct broker *br, const char *key,
    const char *const *urls, unsigned nurls, uint64_t last_ms);

uint64_t
sticky_wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------ the map */

struct sticky_map *
sticky_map_new(void)
{
	struct sticky_map *m = xcalloc(1, sizeof(*m));

	m->sm_nb = 64;
	m->sm_b = xcalloc(m->sm_nb, sizeof(*m->sm_b));
	return m;
}

static void
sticky_pin_clear(struct sticky_pin *p)
{
	unsigned i;

	for (i = 0; i < p->sp_n; i++)
		free(p->sp_urls[i]);
	p->sp_n = 0;
}

void
sticky_map_free(struct sticky_map *m)
{
	struct sticky_ent *e, *next;
	size_t i;

	if (m == NULL)
		return;
	for (i = 0; i < m->sm_nb; i++) {
		for (e = m->sm_b[i]; e != NULL; e = next) {
			next = e->se_next;
			sticky_pin_clear(&e->se_pin);
			free(e->se_key);
			free(e);
		}
	}
	free(m->sm_b);
	free(m);
}

size_t
sticky_map_size(const struct sticky_map *m)
{
	return m->sm_n;
}

static void
sticky_map_grow(struct sticky_map *m)
{
	struct sticky_ent **nb, *e, *next;
	size_t i, n = m->sm_nb * 2;

	nb = xcalloc(n, sizeof(*nb));
	for (i = 0; i < m->sm_nb; i++) {
		for (e = m->sm_b[i]; e != NULL; e = next) {
			next = e->se_next;
			e->se_next = nb[e->se_hash & (n - 1)];
			nb[e->se_hash & (n - 1)] = e;
		}
	}
	free(m->sm_b);
	m->sm_b = nb;
	m->sm_nb = n;
}

struct sticky_pin *
sticky_map_get(struct sticky_map *m, const char *key)
{
	uint64_t h = XXH3_64bits(key, strlen(key));
	struct sticky_ent *e;

	for (e = m->sm_b[h & (m->sm_nb - 1)]; e != NULL; e = e->se_next) {
		if (e->se_hash == h && strcmp(e->se_key, key) == 0)
			return &e->se_pin;
	}
	return NULL;
}

struct sticky_pin *
sticky_map_add(struct sticky_map *m, const char *key)
{
	struct sticky_pin *p;
	struct sticky_ent *e;
	size_t b;

	if ((p = sticky_map_get(m, key)) != NULL)
		return p;
	if (m->sm_n >= m->sm_nb)
		sticky_map_grow(m);
	e = xcalloc(1, sizeof(*e));
	e->se_key = xstrdup(key);
	e->se_hash = XXH3_64bits(key, strlen(key));
	b = e->se_hash & (m->sm_nb - 1);
	e->se_next = m->sm_b[b];
	m->sm_b[b] = e;
	m->sm_n++;
	return &e->se_pin;
}

void
sticky_map_del(struct sticky_map *m, const char *key)
{
	uint64_t h = XXH3_64bits(key, strlen(key));
	struct sticky_ent **pp, *e;

	for (pp = &m->sm_b[h & (m->sm_nb - 1)]; (e = *pp) != NULL;
	     pp = &e->se_next) {
		if (e->se_hash == h && strcmp(e->se_key, key) == 0) {
			*pp = e->se_next;
			sticky_pin_clear(&e->se_pin);
			free(e->se_key);
			free(e);
			m->sm_n--;
			return;
		}
	}
}

void
sticky_pin_front(struct sticky_pin *p, const char *url)
{
	char *keep = NULL;
	unsigned i;

	for (i = 0; i < p->sp_n; i++) {
		if (strcmp(p->sp_urls[i], url) != 0) {
			if (keep == NULL)
				keep = p->sp_urls[i];
			else
				free(p->sp_urls[i]);
		} else
			free(p->sp_urls[i]);
	}
	p->sp_urls[0] = xstrdup(url);
	p->sp_urls[1] = keep;
	p->sp_n = keep != NULL ? 2 : 1;
}

void
sticky_pin_append(struct sticky_pin *p, const char *url)
{
	unsigned i;

	for (i = 0; i < p->sp_n; i++) {
		if (strcmp(p->sp_urls[i], url) == 0)
			return;
	}
	if (p->sp_n == 2) {
		free(p->sp_urls[0]);
		p->sp_urls[0] = p->sp_urls[1];
		p->sp_n = 1;
	}
	p->sp_urls[p->sp_n++] = xstrdup(url);
}

size_t
sticky_map_evict(struct sticky_map *m, uint64_t now_ms, uint64_t max_idle_ms,
    sticky_evict_cb cb, void *arg)
{
	struct sticky_ent **pp, *e;
	size_t i, n = 0;

	for (i = 0; i < m->sm_nb; i++) {
		pp = &m->sm_b[i];
		while ((e = *pp) != NULL) {
			if (now_ms >= e->se_pin.sp_last_ms &&
			    now_ms - e->se_pin.sp_last_ms >= max_idle_ms) {
				*pp = e->se_next;
				if (cb != NULL)
					cb(arg, e->se_key);
				sticky_pin_clear(&e->se_pin);
				free(e->se_key);
				free(e);
				m->sm_n--;
				n++;
			} else
				pp = &e->se_next;
		}
	}
	return n;
}

void
sticky_map_restore(struct sticky_map *m, const char *key,
    const char *const *urls, unsigned nurls, uint64_t last_ms)
{
	struct sticky_pin *pin = sticky_map_add(m, key);
	unsigned i;

	for (i = 0; i < nurls; i++)
		sticky_pin_append(pin, urls[i]);
	pin->sp_last_ms = last_ms;
	pin->sp_saved_ms = last_ms;
}

void
sticky_map_each(struct sticky_map *m, sticky_each_cb cb, void *arg)
{
	struct sticky_ent *e;
	size_t i;

	for (i = 0; i < m->sm_nb; i++) {
		for (e = m->sm_b[i]; e != NULL; e = e->se_next)
			cb(arg, e->se_key, &e->se_pin);
	}
}

/* ------------------------------------------------------------ keys */

static bool
sticky_digits(const char *s, size_t n)
{
	size_t i;

	if (n == 0)
		return false;
	for (i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
	}
	return true;
}

const char *
sticky_strip(const char *in, char *out, size_t len)
{
	size_t n = strlen(in);
	const char *u;
	int pass;
	const char tag[2] = { 'r', 't' };

	if (len == 0)
		return out;
	for (pass = 0; pass < 2; pass++) {
		/* The suffix is the text after the last '_'. */
		for (u = in + n; u > in && u[-1] != '_'; u--)
			;
		if (u == in)
			break;
		if (*u == tag[pass] &&
		    sticky_digits(u + 1, (size_t)(in + n - u - 1)))
			n = (size_t)(u - 1 - in);
	}
	if (n == 0)
		n = strlen(in);
	if (n >= len)
		n = len - 1;
	memcpy(out, in, n);
	out[n] = '\0';
	return out;
}

const char *
sticky_key(struct broker *br, const Smg__RouteRequest *req, char *buf,
    size_t len, const char **source)
{
	const struct config *cf = br->br_cf;
	const char *prefix, *key = NULL;
	char stripped[STICKY_KEY_CAP + 1];
	bool over = cf->cf_routing_key_override;
	int n;

	switch (req->leg) {
	case SMG__LEG__LEG_PREFILL:
		prefix = "prefill:";
		break;
	case SMG__LEG__LEG_DECODE:
		prefix = "decode:";
		break;
	case SMG__LEG__LEG_ENCODE:
		prefix = "encode:";
		break;
	default:
		prefix = "";
		break;
	}
	if (over && req->rid_key != NULL && req->rid_key[0] != '\0' &&
	    strlen(req->rid_key) <= STICKY_KEY_CAP) {
		key = req->rid_key;
		*source = "rid";
	} else if (req->routing_key != NULL && req->routing_key[0] != '\0' &&
	    strlen(req->routing_key) <= STICKY_KEY_CAP) {
		key = over
		    ? sticky_strip(req->routing_key, stripped, sizeof(stripped))
		    : req->routing_key;
		*source = "header";
	}
	if (key == NULL)
		return NULL;
	n = snprintf(buf, len, "%s%s", prefix, key);
	if (n < 0 || (size_t)n >= len)
		return NULL;
	return buf;
}

/* ------------------------------------------------------------ in-flight */

static struct sticky_fl **
sticky_fl_find(struct sticky_state *ss, uint64_t h, const struct worker *w)
{
	struct sticky_fl **pp, *f;

	for (pp = &ss->ss_fl[(h ^ w->wk_slot) & (ss->ss_nfl - 1)];
	     (f = *pp) != NULL; pp = &f->sf_next) {
		if (f->sf_hash == h && f->sf_slot == w->wk_slot &&
		    f->sf_gen == w->wk_generation)
			return pp;
	}
	return pp;
}

/* The count of *pp, clamped when stale; frees an entry that reaches 0. */
static uint32_t
sticky_fl_effective(struct broker *br, struct sticky_fl **pp, struct worker *w,
    uint64_t now_ms)
{
	struct sticky_state *ss = br->br_sticky;
	struct sticky_fl *f = *pp;
	uint32_t total;

	if (f == NULL)
		return 0;
	if (now_ms - f->sf_changed_ms >= STICKY_CLAMP_MS) {
		total = live_in_flight(br, w);
		if (f->sf_count > total) {
			f->sf_count = total;
			f->sf_changed_ms = now_ms;
		}
	}
	if (f->sf_count == 0) {
		*pp = f->sf_next;
		free(f);
		ss->ss_fl_n--;
		if (ss->ss_keys_on[w->wk_slot] > 0)
			ss->ss_keys_on[w->wk_slot]--;
		return 0;
	}
	return f->sf_count;
}

/* +1 or -1 on the count of (hash, w). */
static void
sticky_fl_add(struct broker *br, uint64_t h, struct worker *w, int delta)
{
	struct sticky_state *ss = br->br_sticky;
	uint64_t now = shm_now_ms();
	struct sticky_fl **pp, *f;

	pp = sticky_fl_find(ss, h, w);
	if ((f = *pp) == NULL) {
		if (delta <= 0)
			return;
		f = xcalloc(1, sizeof(*f));
		f->sf_hash = h;
		f->sf_slot = w->wk_slot;
		f->sf_gen = w->wk_generation;
		f->sf_next = ss->ss_fl[(h ^ w->wk_slot) & (ss->ss_nfl - 1)];
		ss->ss_fl[(h ^ w->wk_slot) & (ss->ss_nfl - 1)] = f;
		ss->ss_fl_n++;
		ss->ss_keys_on[w->wk_slot]++;
		pp = sticky_fl_find(ss, h, w);
	}
	if (delta < 0 && (uint32_t)-delta >= f->sf_count)
		f->sf_count = 0;
	else
		f->sf_count = (uint32_t)((int64_t)f->sf_count + delta);
	f->sf_changed_ms = now;
	(void)sticky_fl_effective(br, pp, w, now);
}

static uint64_t
sticky_hash(const char *key)
{
	uint64_t h = XXH3_64bits(key, strlen(key));

	return h == 0 ? 1 : h;
}

void
sticky_dispatched(struct broker *br, const char *key, struct worker *w)
{
	if (br->br_sticky == NULL || w->wk_slot >= SHM_MAX_WORKERS ||
	    key == NULL || *key == '\0')
		return;
	sticky_fl_add(br, sticky_hash(key), w, 1);
}

void
sticky_finished(struct broker *br, const char *key, struct worker *w)
{
	if (br->br_sticky == NULL || w->wk_slot >= SHM_MAX_WORKERS ||
	    key == NULL || *key == '\0')
		return;
	sticky_fl_add(br, sticky_hash(key), w, -1);
}

uint32_t
sticky_inflight_get(struct broker *br, const char *key, struct worker *w)
{
	struct sticky_state *ss = br->br_sticky;

	if (ss == NULL)
		return 0;
	return sticky_fl_effective(br, sticky_fl_find(ss, sticky_hash(key), w),
	    w, shm_now_ms());
}

uint32_t
sticky_keys_on(struct broker *br, struct worker *w)
{
	struct sticky_state *ss = br->br_sticky;
	uint32_t k, total;

	if (ss == NULL || w->wk_slot >= SHM_MAX_WORKERS)
		return 0;
	k = ss->ss_keys_on[w->wk_slot];
	total = live_in_flight(br, w);
	return k < total ? k : total;
}

void
sticky_forget_worker(struct broker *br, struct worker *w)
{
	struct sticky_state *ss = br->br_sticky;
	struct sticky_fl **pp, *f;
	size_t i;

	if (ss == NULL || w->wk_slot >= SHM_MAX_WORKERS)
		return;
	for (i = 0; i < ss->ss_nfl; i++) {
		pp = &ss->ss_fl[i];
		while ((f = *pp) != NULL) {
			if (f->sf_slot == w->wk_slot) {
				*pp = f->sf_next;
				free(f);
				ss->ss_fl_n--;
			} else
				pp = &f->sf_next;
		}
	}
	ss->ss_keys_on[w->wk_slot] = 0;
}

/* ------------------------------------------------------------ selection */

int
sticky_assign_pick(struct broker *br, int mode, struct worker *const *c,
    unsigned n)
{
	uint32_t best = UINT32_MAX, v, ties = 0;
	unsigned i;
	int pick = -1;

	if (n == 0)
		return -1;
	if (mode == ASSIGNMENT_MODE_RANDOM)
		return (int)policy_rand_below(n);
	for (i = 0; i < n; i++) {
		v = mode == ASSIGNMENT_MODE_MIN_GROUP
		    ? sticky_keys_on(br, c[i])
		    : live_in_flight(br, c[i]);
		if (v < best) {
			best = v;
			pick = (int)i;
			ties = 1;
		} else if (v == best && policy_rand_below(++ties) == 0)
			pick = (int)i; /* reservoir: uniform among ties */
	}
	return pick;
}

/* Position of the first stored URL that is a candidate, or -1. */
static int
sticky_pinned(struct sticky_pin *pin, struct worker *const *c, unsigned n)
{
	unsigned i, j;

	for (i = 0; i < pin->sp_n; i++) {
		for (j = 0; j < n; j++) {
			if (strcmp(pin->sp_urls[i], c[j]->wk_url) == 0)
				return (int)j;
		}
	}
	return -1;
}

static int
sticky_mode(struct broker *br)
{
	const struct config *cf = br->br_cf;

	if (cf->cf_assignment_mode_set)
		return cf->cf_assignment_mode;
	return ASSIGNMENT_MODE_DELEGATE;
}

static int
sticky_pick(struct broker *br, struct policy *p, int mode,
    struct worker *const *c, unsigned n, const Smg__RouteRequest *req)
{
	if (mode == ASSIGNMENT_MODE_DELEGATE)
		return policy_select(p, c, n, req);
	return sticky_assign_pick(br, mode, c, n);
}

static void
sticky_save(struct broker *br, const char *key, struct sticky_pin *pin)
{
	persist_assign_put(br, STICKY_SCOPE, key, pin);
	pin->sp_saved_ms = pin->sp_last_ms;
}

bool
sticky_applies(struct broker *br, const struct policy *p,
    const Smg__RouteRequest *req)
{
	const struct config *cf = br->br_cf;
	const char *name = policy_name(p), *src;
	char key[STICKY_KEY_MAX];

	if (!cf->cf_routing_key_override)
		return false;
	if (strcmp(name, "manual") == 0 ||
	    strcmp(name, "consistent_hashing") == 0)
		return false;
	return sticky_key(br, req, key, sizeof(key), &src) != NULL;
}

int
sticky_select(struct broker *br, struct policy *p, struct worker *const *c,
    unsigned n, const Smg__RouteRequest *req)
{
	struct sticky_state *ss = br->br_sticky;
	struct sticky_pin *pin;
	enum sticky_branch b;
	char key[STICKY_KEY_MAX];
	const char *src = "";
	int mode = sticky_mode(br), idx, pos;
	uint64_t now = sticky_wall_ms();
	bool stale;

	if (n == 0 || ss == NULL) {
		sticky_count_branch(br, STICKY_NO_HEALTHY_WORKERS);
		return -1;
	}
	if (sticky_key(br, req, key, sizeof(key), &src) == NULL)
		return policy_select(p, c, n, req);
	pin = sticky_map_get(ss->ss_map, key);
	if (pin != NULL)
		pin->sp_last_ms = now;
	pos = pin != NULL ? sticky_pinned(pin, c, n) : -1;
	stale = pin != NULL && pos < 0;
	if (pos >= 0 &&
	    sticky_inflight_get(br, key, c[pos]) < STICKY_INFLIGHT_CAP) {
		idx = pos;
		b = STICKY_OCCUPIED_HIT;
	} else if (pos >= 0) {
		idx = sticky_pick(br, p, mode, c, n, req);
		if (idx >= 0 && idx != pos &&
		    sticky_inflight_get(br, key, c[idx]) <
		        STICKY_INFLIGHT_CAP) {
			sticky_pin_front(pin, c[idx]->wk_url);
			sticky_save(br, key, pin);
		}
		b = STICKY_CAP_RESPILL;
	} else if (mode == ASSIGNMENT_MODE_DELEGATE) {
		idx = policy_select(p, c, n, req);
		b = stale ? STICKY_OCCUPIED_MISS : STICKY_VACANT;
		if (idx >= 0) {
			if (pin == NULL)
				pin = sticky_map_add(ss->ss_map, key);
			pin->sp_last_ms = now;
			sticky_pin_front(pin, c[idx]->wk_url);
			sticky_save(br, key, pin);
		}
	} else {
		idx = sticky_assign_pick(br, mode, c, n);
		b = stale ? STICKY_OCCUPIED_MISS : STICKY_VACANT;
		if (pin == NULL)
			pin = sticky_map_add(ss->ss_map, key);
		pin->sp_last_ms = now;
		sticky_pin_append(pin, c[idx]->wk_url);
		sticky_save(br, key, pin);
	}
	if (pin != NULL && now - pin->sp_saved_ms >= STICKY_RESAVE_MS)
		sticky_save(br, key, pin);
	sticky_count_branch(br, b);
	if (br->br_debug)
		log_debug("%s: sticky source %s key %s branch %s worker %s "
		          "model %s",
		    __func__, src, key, sticky_branch_name(b),
		    idx >= 0 ? c[idx]->wk_url : "-",
		    idx >= 0 ? c[idx]->wk_model : "-");
	return idx;
}

const char *
sticky_branch_name(enum sticky_branch b)
{
	switch (b) {
	case STICKY_NO_HEALTHY_WORKERS:
		return "no_healthy_workers";
	case STICKY_OCCUPIED_HIT:
		return "occupied_hit";
	case STICKY_OCCUPIED_MISS:
		return "occupied_miss";
	case STICKY_VACANT:
		return "vacant";
	case STICKY_NO_ROUTING_ID:
		return "no_routing_id";
	case STICKY_CAP_RESPILL:
		return "cap_respill";
	case STICKY_NBRANCHES:
		break;
	}
	return "unknown";
}

void
sticky_count_branch(struct broker *br, enum sticky_branch b)
{
	struct sticky_state *ss = br->br_sticky;

	if (ss == NULL || b >= STICKY_NBRANCHES)
		return;
	if (ss->ss_branch[b] == -2)
		ss->ss_branch[b] = stats_series(br, METRICS_COUNTER,
		    "smg_manual_policy_branch_total", "branch=\"%s\"",
		    sticky_branch_name(b));
	stats_add(br, ss->ss_branch[b], 1);
}

void
sticky_count_source(struct broker *br, const char *source)
{
	struct sticky_state *ss = br->br_sticky;
	int i = strcmp(source, "rid") == 0 ? 0 : 1;

	if (ss == NULL)
		return;
	if (ss->ss_source[i] == -2)
		ss->ss_source[i] = stats_series(br, METRICS_COUNTER,
		    "smg_routing_key_source_total", "source=\"%s\"",
		    i == 0 ? "rid" : "header");
	stats_add(br, ss->ss_source[i], 1);
}

/* ------------------------------------------------------------ lifecycle */

void
sticky_init(struct broker *br)
{
	struct sticky_state *ss = xcalloc(1, sizeof(*ss));
	unsigned i;

	ss->ss_map = sticky_map_new();
	ss->ss_nfl = 1024;
	ss->ss_fl = xcalloc(ss->ss_nfl, sizeof(*ss->ss_fl));
	for (i = 0; i < STICKY_NBRANCHES; i++)
		ss->ss_branch[i] = -2;
	ss->ss_source[0] = ss->ss_source[1] = -2;
	br->br_sticky = ss;
	persist_assign_owner(br, STICKY_SCOPE, sticky_restore);
}

void
sticky_free(struct broker *br)
{
	struct sticky_state *ss = br->br_sticky;
	struct sticky_fl *f, *next;
	size_t i;

	if (ss == NULL)
		return;
	for (i = 0; i < ss->ss_nfl; i++) {
		for (f = ss->ss_fl[i]; f != NULL; f = next) {
			next = f->sf_next;
			free(f);
		}
	}
	free(ss->ss_fl);
	sticky_map_free(ss->ss_map);
	free(ss);
	br->br_sticky = NULL;
}

/* persist_restore's hook for the records of sticky_save. */
static void
sticky_restore(struct broker *br, const char *key, const char *const *urls,
    unsigned nurls, uint64_t last_ms)
{
	if (br->br_sticky != NULL)
		sticky_map_restore(br->br_sticky->ss_map, key, urls, nurls,
		    last_ms);
}

struct sticky_map *
sticky_global_map(struct broker *br)
{
	return br->br_sticky != NULL ? br->br_sticky->ss_map : NULL;
}

static void
sticky_evicted(void *arg, const char *key)
{
	persist_assign_del(arg, STICKY_SCOPE, key);
}

void
sticky_sweep(struct broker *br, uint64_t now_ms)
{
	const struct config *cf = br->br_cf;
	struct sticky_state *ss = br->br_sticky;
	uint64_t every, idle;
	size_t n;

	if (ss == NULL || !cf->cf_routing_key_override)
		return;
	every = (uint64_t)cf->cf_eviction_interval * 1000;
	idle = (uint64_t)cf->cf_max_idle_secs * 1000;
	if (every == 0 || idle == 0)
		return; /* §7.4: no eviction task */
	if (now_ms - ss->ss_last_sweep_ms < every)
		return;
	ss->ss_last_sweep_ms = now_ms;
	n = sticky_map_evict(ss->ss_map, sticky_wall_ms(), idle, sticky_evicted,
	    br);
	if (n > 0)
		log_info("%s: evicted %zu idle sticky keys", __func__, n);
}
