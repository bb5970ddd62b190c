/*
 * kvindex.c: the KV-block index of cache_aware's event mode (policies.md
 * §11.4), applied from the poller's KvEventBatch messages (workers.md
 * §5.1 semantics) and queried by the policy for overlap scores.
 */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "shared/log.h"
#include "shared/shm.h"
#include "shared/xmalloc.h"

#include "broker.h"
#include "kvindex.h"

#define KX_BUCKETS_MIN 64
#define KX_NO_MARK     UINT32_MAX

/* One (position, content, prefix) of a model and the workers holding it. */
struct kv_entry {
	uint64_t ke_pos;
	uint64_t ke_content;
	uint64_t ke_prefix;
	uint64_t ke_touch_ms; /* last matched by a request */
	uint16_t *ke_slots; /* may repeat a slot (two engine hashes) */
	uint16_t ke_n;
	uint16_t ke_cap;
	struct kv_entry *ke_next;
};

struct kv_model {
	char *km_name;
	uint32_t km_bs; /* learnt block size, 0 unknown */
	struct kv_entry **km_tab;
	size_t km_nbuckets; /* power of two */
	size_t km_n;
	unsigned km_nworkers;
	struct kv_model *km_next;
};

/* One block of one worker: its engine hash and its index entry. */
struct kv_block {
	int64_t kb_engine;
	struct kv_entry *kb_entry;
	uint64_t kb_touch_ms; /* last stored */
	struct kv_block *kb_next;
};

struct kv_worker {
	bool kw_used;
	uint32_t kw_gen;
	struct kv_model *kw_model;
	struct kv_block **kw_tab;
	size_t kw_nbuckets;
	size_t kw_n;
};

struct kvindex {
	uint64_t kx_ttl_ms;
	uint64_t kx_max;
	struct kv_model *kx_models;
	size_t kx_entries; /* worker-block memberships */
	struct kv_worker kx_workers[SHM_MAX_WORKERS];
	uint32_t kx_mark[SHM_MAX_WORKERS]; /* overlap scratch */
	int kx_pos[SHM_MAX_WORKERS];
};

/* The broker's index and its prune timer. */
struct kx_glue {
	struct broker *kg_br;
	struct kvindex *kg_kx;
	uint64_t kg_ttl_ms;
	uint64_t kg_max;
	ev_timer kg_prune;
	struct kx_glue *kg_next;
};

/* Victim of capacity pruning. */
struct kx_victim {
	uint64_t kv_touch_ms;
	int64_t kv_engine;
	unsigned kv_slot;
};

static uint64_t kx_mix(uint64_t);
static size_t kx_entry_bucket(const struct kv_model *, uint64_t, uint64_t,
    uint64_t);
static struct kv_model *kx_model(struct kvindex *, const char *, bool);
static void kx_model_free(struct kvindex *, struct kv_model *);
static void kx_model_grow(struct kv_model *);
static struct kv_entry *kx_entry_find(const struct kv_model *, uint64_t,
    uint64_t, uint64_t);
static struct kv_entry *kx_entry_get(struct kv_model *, uint64_t, uint64_t,
    uint64_t);
static void kx_entry_add(struct kv_entry *, unsigned);
static void kx_entry_drop(struct kvindex *, struct kv_model *,
    struct kv_entry *, unsigned);
static struct kv_block *kx_block_find(const struct kv_worker *, int64_t);
static void kx_block_grow(struct kv_worker *);
static bool kx_block_del(struct kvindex *, unsigned, int64_t);
static void kx_worker_clear(struct kvindex *, unsigned);
static void kx_worker_detach(struct kvindex *, unsigned);
static void kx_put(struct kvindex *, unsigned, int64_t, uint64_t, uint64_t,
    uint64_t, uint64_t);
static size_t kx_stored(struct kvindex *, unsigned, const Smg__KvBlocksStored *,
    uint64_t);
static int kx_victim_cmp(const void *, const void *);
static struct kx_glue *kx_glue(struct broker *, bool);
static void kx_prune_cb(struct ev_loop *, ev_timer *, int);

static struct kx_glue *kx_glues;

/* ------------------------------------------------------------ hashing */

uint64_t
kvindex_content_hash(const uint32_t *tokens, size_t n)
{
	unsigned char stack[4 * 256], *le = stack;
	uint64_t h;
	size_t i;

	if (n == 0)
		return XXH3_64bits_withSeed(NULL, 0, KVINDEX_SEED);
	/* One-shot: libxxhash 0.8.1's streaming state misbehaves on the
	 * stack under ASan for 241-256 byte inputs. */
	if (n > 256 && (le = reallocarray(NULL, n, 4)) == NULL) {
		log_warnx("%s: out of memory", __func__);
		return 0;
	}
	for (i = 0; i < n; i++) {
		le[4 * i] = (unsigned char)tokens[i];
		le[4 * i + 1] = (unsigned char)(tokens[i] >> 8);
		le[4 * i + 2] = (unsigned char)(tokens[i] >> 16);
		le[4 * i + 3] = (unsigned char)(tokens[i] >> 24);
	}
	h = XXH3_64bits_withSeed(le, 4 * n, KVINDEX_SEED);
	if (le != stack)
		free(le);
	return h;
}

uint64_t
kvindex_prefix_hash(uint64_t prev, uint64_t content)
{
	unsigned char le[16];
	unsigned i;

	for (i = 0; i < 8; i++) {
		le[i] = (unsigned char)(prev >> (8 * i));
		le[8 + i] = (unsigned char)(content >> (8 * i));
	}
	return XXH3_64bits_withSeed(le, sizeof(le), KVINDEX_SEED);
}

/* splitmix64's finaliser: spreads engine hashes that may be small ints. */
static uint64_t
kx_mix(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x;
}

/* ------------------------------------------------------------ lifecycle */

struct kvindex *
kvindex_new(uint64_t ttl_ms, uint64_t max_entries)
{
	struct kvindex *kx = xcalloc(1, sizeof(*kx));
	unsigned i;

	kx->kx_ttl_ms = ttl_ms;
	kx->kx_max = max_entries;
	for (i = 0; i < SHM_MAX_WORKERS; i++) {
		kx->kx_mark[i] = KX_NO_MARK;
		kx->kx_pos[i] = -1;
	}
	return kx;
}

void
kvindex_set_bounds(struct kvindex *kx, uint64_t ttl_ms, uint64_t max_entries)
{
	kx->kx_ttl_ms = ttl_ms;
	kx->kx_max = max_entries;
}

void
kvindex_free(struct kvindex *kx)
{
	unsigned i;

	if (kx == NULL)
		return;
	for (i = 0; i < SHM_MAX_WORKERS; i++)
		kx_worker_detach(kx, i);
	while (kx->kx_models != NULL)
		kx_model_free(kx, kx->kx_models);
	free(kx);
}

/* ------------------------------------------------------------ models */

static struct kv_model *
kx_model(struct kvindex *kx, const char *name, bool create)
{
	struct kv_model *km;

	for (km = kx->kx_models; km != NULL; km = km->km_next)
		if (strcmp(km->km_name, name) == 0)
			return km;
	if (!create)
		return NULL;
	km = xcalloc(1, sizeof(*km));
	km->km_name = xstrdup(name);
	km->km_nbuckets = KX_BUCKETS_MIN;
	km->km_tab = xcalloc(km->km_nbuckets, sizeof(*km->km_tab));
	km->km_next = kx->kx_models;
	kx->kx_models = km;
	return km;
}

/* Unlinks and frees a model; its workers must be detached already. */
static void
kx_model_free(struct kvindex *kx, struct kv_model *km)
{
	struct kv_model **pp;
	struct kv_entry *e, *next;
	size_t b;

	for (pp = &kx->kx_models; *pp != NULL; pp = &(*pp)->km_next)
		if (*pp == km) {
			*pp = km->km_next;
			break;
		}
	for (b = 0; b < km->km_nbuckets; b++)
		for (e = km->km_tab[b]; e != NULL; e = next) {
			next = e->ke_next;
			free(e->ke_slots);
			free(e);
		}
	free(km->km_tab);
	free(km->km_name);
	free(km);
}

static size_t
kx_entry_bucket(const struct kv_model *km, uint64_t pos, uint64_t content,
    uint64_t prefix)
{
	return (size_t)(kx_mix(prefix ^ (content * 31) ^ pos) &
	    (km->km_nbuckets - 1));
}

static void
kx_model_grow(struct kv_model *km)
{
	struct kv_entry **old = km->km_tab, *e, *next;
	size_t nold = km->km_nbuckets, b, nb;

	km->km_nbuckets = nold * 2;
	km->km_tab = xcalloc(km->km_nbuckets, sizeof(*km->km_tab));
	for (b = 0; b < nold; b++)
		for (e = old[b]; e != NULL; e = next) {
			next = e->ke_next;
			nb = kx_entry_bucket(km, e->ke_pos, e->ke_content,
			    e->ke_prefix);
			e->ke_next = km->km_tab[nb];
			km->km_tab[nb] = e;
		}
	free(old);
}

static struct kv_entry *
kx_entry_find(const struct kv_model *km, uint64_t pos, uint64_t content,
    uint64_t prefix)
{
	struct kv_entry *e;

	for (e = km->km_tab[kx_entry_bucket(km, pos, content, prefix)];
	     e != NULL; e = e->ke_next)
		if (e->ke_pos == pos && e->ke_content == content &&
		    e->ke_prefix == prefix)
			return e;
	return NULL;
}

static struct kv_entry *
kx_entry_get(struct kv_model *km, uint64_t pos, uint64_t content,
    uint64_t prefix)
{
	struct kv_entry *e;
	size_t b;

	if ((e = kx_entry_find(km, pos, content, prefix)) != NULL)
		return e;
	if (km->km_n >= km->km_nbuckets)
		kx_model_grow(km);
	e = xcalloc(1, sizeof(*e));
	e->ke_pos = pos;
	e->ke_content = content;
	e->ke_prefix = prefix;
	b = kx_entry_bucket(km, pos, content, prefix);
	e->ke_next = km->km_tab[b];
	km->km_tab[b] = e;
	km->km_n++;
	return e;
}

static void
kx_entry_add(struct kv_entry *e, unsigned slot)
{
	if (e->ke_n == e->ke_cap) {
		e->ke_cap = e->ke_cap ? (uint16_t)(e->ke_cap * 2) : 2;
		e->ke_slots =
		    xreallocarray(e->ke_slots, e->ke_cap, sizeof(*e->ke_slots));
	}
	e->ke_slots[e->ke_n++] = (uint16_t)slot;
}

/* Removes one membership of slot; frees the entry left without one. */
static void
kx_entry_drop(struct kvindex *kx, struct kv_model *km, struct kv_entry *e,
    unsigned slot)
{
	struct kv_entry **pp;
	uint16_t i;

	for (i = 0; i < e->ke_n; i++)
		if (e->ke_slots[i] == slot) {
			e->ke_slots[i] = e->ke_slots[--e->ke_n];
			kx->kx_entries--;
			break;
		}
	if (e->ke_n > 0)
		return;
	pp = &km->km_tab[kx_entry_bucket(km, e->ke_pos, e->ke_content,
	    e->ke_prefix)];
	for (; *pp != NULL; pp = &(*pp)->ke_next)
		if (*pp == e) {
			*pp = e->ke_next;
			break;
		}
	km->km_n--;
	free(e->ke_slots);
	free(e);
}

/* ------------------------------------------------------------ workers */

static struct kv_block *
kx_block_find(const struct kv_worker *kw, int64_t engine)
{
	struct kv_block *kb;

	if (kw->kw_tab == NULL)
		return NULL;
	for (kb = kw->kw_tab[kx_mix((uint64_t)engine) & (kw->kw_nbuckets - 1)];
	     kb != NULL; kb = kb->kb_next)
		if (kb->kb_engine == engine)
			return kb;
	return NULL;
}

static void
kx_block_grow(struct kv_worker *kw)
{
	struct kv_block **old = kw->kw_tab, *kb, *next;
	size_t nold = kw->kw_nbuckets, b, nb;

	kw->kw_nbuckets = nold ? nold * 2 : KX_BUCKETS_MIN;
	kw->kw_tab = xcalloc(kw->kw_nbuckets, sizeof(*kw->kw_tab));
	for (b = 0; b < nold; b++)
		for (kb = old[b]; kb != NULL; kb = next) {
			next = kb->kb_next;
			nb = kx_mix((uint64_t)kb->kb_engine) &
			    (kw->kw_nbuckets - 1);
			kb->kb_next = kw->kw_tab[nb];
			kw->kw_tab[nb] = kb;
		}
	free(old);
}

/* Drops the worker's block with this engine hash; false if unknown. */
static bool
kx_block_del(struct kvindex *kx, unsigned slot, int64_t engine)
{
	struct kv_worker *kw = &kx->kx_workers[slot];
	struct kv_block **pp, *kb;

	if (kw->kw_tab == NULL)
		return false;
	pp = &kw->kw_tab[kx_mix((uint64_t)engine) & (kw->kw_nbuckets - 1)];
	for (; (kb = *pp) != NULL; pp = &kb->kb_next)
		if (kb->kb_engine == engine) {
			*pp = kb->kb_next;
			kx_entry_drop(kx, kw->kw_model, kb->kb_entry, slot);
			free(kb);
			kw->kw_n--;
			return true;
		}
	return false;
}

/* Drops every block of the worker; it stays attached to its model. */
static void
kx_worker_clear(struct kvindex *kx, unsigned slot)
{
	struct kv_worker *kw = &kx->kx_workers[slot];
	struct kv_block *kb, *next;
	size_t b;

	for (b = 0; b < kw->kw_nbuckets; b++) {
		for (kb = kw->kw_tab[b]; kb != NULL; kb = next) {
			next = kb->kb_next;
			kx_entry_drop(kx, kw->kw_model, kb->kb_entry, slot);
			free(kb);
		}
	}
	free(kw->kw_tab);
	kw->kw_tab = NULL;
	kw->kw_nbuckets = 0;
	kw->kw_n = 0;
}

/* Clears the worker and leaves its model, freeing a model left empty. */
static void
kx_worker_detach(struct kvindex *kx, unsigned slot)
{
	struct kv_worker *kw = &kx->kx_workers[slot];
	struct kv_model *km = kw->kw_model;

	if (!kw->kw_used)
		return;
	kx_worker_clear(kx, slot);
	kw->kw_used = false;
	kw->kw_model = NULL;
	if (km != NULL && --km->km_nworkers == 0)
		kx_model_free(kx, km);
}

void
kvindex_forget_worker(struct kvindex *kx, unsigned slot)
{
	if (slot < SHM_MAX_WORKERS)
		kx_worker_detach(kx, slot);
}

/* Records that the worker holds (pos, content, prefix) as engine hash. */
static void
kx_put(struct kvindex *kx, unsigned slot, int64_t engine, uint64_t pos,
    uint64_t content, uint64_t prefix, uint64_t now_ms)
{
	struct kv_worker *kw = &kx->kx_workers[slot];
	struct kv_block *kb;
	struct kv_entry *e;
	size_t b;

	if ((kb = kx_block_find(kw, engine)) != NULL) {
		e = kb->kb_entry;
		kb->kb_touch_ms = now_ms;
		if (e->ke_pos == pos && e->ke_content == content &&
		    e->ke_prefix == prefix)
			return;
		/* Same engine hash, other content: the engine reused it. */
		(void)kx_block_del(kx, slot, engine);
	}
	if (kw->kw_n >= kw->kw_nbuckets)
		kx_block_grow(kw);
	e = kx_entry_get(kw->kw_model, pos, content, prefix);
	kx_entry_add(e, slot);
	kx->kx_entries++;
	kb = xcalloc(1, sizeof(*kb));
	kb->kb_engine = engine;
	kb->kb_entry = e;
	kb->kb_touch_ms = now_ms;
	b = kx_mix((uint64_t)engine) & (kw->kw_nbuckets - 1);
	kb->kb_next = kw->kw_tab[b];
	kw->kw_tab[b] = kb;
	kw->kw_n++;
}

/*
 * BlockStored: chain after the parent when this worker knows it, else
 * start a chain at position 0. Returns the hashes skipped for lack of
 * tokens.
 */
static size_t
kx_stored(struct kvindex *kx, unsigned slot, const Smg__KvBlocksStored *s,
    uint64_t now_ms)
{
	struct kv_worker *kw = &kx->kx_workers[slot];
	struct kv_model *km = kw->kw_model;
	struct kv_block *parent;
	uint64_t pos = 0, prev = 0, content, prefix;
	uint32_t bs = s->block_size;
	bool chained = false;
	size_t i;

	if (s->n_block_hashes == 0)
		return 0;
	if (bs == 0 && s->n_token_ids % s->n_block_hashes == 0)
		bs = (uint32_t)(s->n_token_ids / s->n_block_hashes);
	if (bs == 0)
		return s->n_block_hashes;
	if (km->km_bs == 0) {
		km->km_bs = bs;
		log_info("%s: model %s: KV block size %u", __func__,
		    km->km_name, bs);
	}
	if (s->has_parent &&
	    (parent = kx_block_find(kw, s->parent_block_hash)) != NULL) {
		pos = parent->kb_entry->ke_pos + 1;
		prev = parent->kb_entry->ke_prefix;
		chained = true;
	}
	for (i = 0; i < s->n_block_hashes; i++) {
		if ((i + 1) * (size_t)bs > s->n_token_ids)
			return s->n_block_hashes - i;
		content = kvindex_content_hash(s->token_ids + i * bs, bs);
		prefix = chained ? kvindex_prefix_hash(prev, content) : content;
		kx_put(kx, slot, s->block_hashes[i], pos, content, prefix,
		    now_ms);
		prev = prefix;
		pos++;
		chained = true;
	}
	return 0;
}

size_t
kvindex_apply(struct kvindex *kx, const char *model, unsigned slot,
    uint32_t gen, const Smg__KvEventBatch *b, uint64_t now_ms)
{
	struct kv_worker *kw;
	struct kv_model *km;
	size_t i, j, skipped = 0;

	if (slot >= SHM_MAX_WORKERS)
		return 0;
	kw = &kx->kx_workers[slot];
	km = kx_model(kx, model, true);
	if (kw->kw_used && (kw->kw_gen != gen || kw->kw_model != km))
		kx_worker_detach(kx, slot);
	if (!kw->kw_used) {
		/* The detach may have freed a model: look it up again. */
		km = kx_model(kx, model, true);
		kw->kw_used = true;
		kw->kw_gen = gen;
		kw->kw_model = km;
		km->km_nworkers++;
	}
	if (b->reset)
		kx_worker_clear(kx, slot);
	for (i = 0; i < b->n_events; i++) {
		const Smg__KvEvent *ev = b->events[i];

		switch (ev->data_case) {
		case SMG__KV_EVENT__DATA_STORED:
			skipped += kx_stored(kx, slot, ev->stored, now_ms);
			break;
		case SMG__KV_EVENT__DATA_REMOVED:
			for (j = 0; j < ev->removed->n_block_hashes; j++)
				(void)kx_block_del(kx, slot,
				    ev->removed->block_hashes[j]);
			break;
		case SMG__KV_EVENT__DATA_CLEARED:
			kx_worker_clear(kx, slot);
			break;
		default:
			break;
		}
	}
	return skipped;
}

/* ------------------------------------------------------------ queries */

size_t
kvindex_blocks(const struct kvindex *kx, const char *model)
{
	const struct kv_model *km;

	for (km = kx->kx_models; km != NULL; km = km->km_next)
		if (strcmp(km->km_name, model) == 0)
			return km->km_n;
	return 0;
}

size_t
kvindex_entries(const struct kvindex *kx)
{
	return kx->kx_entries;
}

uint32_t
kvindex_block_size(const struct kvindex *kx, const char *model)
{
	const struct kv_model *km;

	for (km = kx->kx_models; km != NULL; km = km->km_next)
		if (strcmp(km->km_name, model) == 0)
			return km->km_bs;
	return 0;
}

void
kvindex_overlap(struct kvindex *kx, const char *model, const uint32_t *tokens,
    size_t ntok, uint32_t bs, const unsigned *slots, unsigned n,
    uint32_t *scores, uint64_t now_ms)
{
	struct kv_model *km;
	struct kv_entry *e;
	uint64_t content, prefix = 0;
	size_t j, nblocks;
	unsigned i, alive;
	uint16_t k;

	memset(scores, 0, n * sizeof(*scores));
	if (bs == 0 || (km = kx_model(kx, model, false)) == NULL ||
	    km->km_n == 0)
		return;
	nblocks = ntok / bs;
	/* kx_mark[s] == j: the candidate in slot s holds blocks 0..j-1. */
	for (i = 0, alive = 0; i < n; i++)
		if (slots[i] < SHM_MAX_WORKERS) {
			kx->kx_mark[slots[i]] = 0;
			kx->kx_pos[slots[i]] = (int)i;
			alive++;
		}
	for (j = 0; j < nblocks && alive > 0; j++) {
		content = kvindex_content_hash(tokens + j * bs, bs);
		prefix =
		    j == 0 ? content : kvindex_prefix_hash(prefix, content);
		if ((e = kx_entry_find(km, j, content, prefix)) == NULL)
			break;
		e->ke_touch_ms = now_ms;
		alive = 0;
		for (k = 0; k < e->ke_n; k++) {
			unsigned s = e->ke_slots[k];

			if (kx->kx_mark[s] == (uint32_t)j) {
				kx->kx_mark[s] = (uint32_t)j + 1;
				scores[kx->kx_pos[s]]++;
				alive++;
			}
		}
	}
	for (i = 0; i < n; i++)
		if (slots[i] < SHM_MAX_WORKERS) {
			kx->kx_mark[slots[i]] = KX_NO_MARK;
			kx->kx_pos[slots[i]] = -1;
		}
}

/* ------------------------------------------------------------ bounds */

static int
kx_victim_cmp(const void *a, const void *b)
{
	const struct kx_victim *x = a, *y = b;

	if (x->kv_touch_ms != y->kv_touch_ms)
		return x->kv_touch_ms < y->kv_touch_ms ? -1 : 1;
	return 0;
}

size_t
kvindex_prune(struct kvindex *kx, uint64_t now_ms)
{
	struct kx_victim *v = NULL;
	struct kv_block *kb, *next;
	struct kv_worker *kw;
	uint64_t t, target;
	size_t b, nv = 0, i, pruned = 0;
	unsigned s;

	if (kx->kx_ttl_ms > 0) {
		for (s = 0; s < SHM_MAX_WORKERS; s++) {
			kw = &kx->kx_workers[s];
			for (b = 0; b < kw->kw_nbuckets; b++)
				for (kb = kw->kw_tab[b]; kb != NULL;
				     kb = next) {
					next = kb->kb_next;
					t = kb->kb_touch_ms >
					        kb->kb_entry->ke_touch_ms
					    ? kb->kb_touch_ms
					    : kb->kb_entry->ke_touch_ms;
					if (now_ms > t &&
					    now_ms - t > kx->kx_ttl_ms &&
					    kx_block_del(kx, s, kb->kb_engine))
						pruned++;
				}
		}
	}
	if (kx->kx_max == 0 || kx->kx_entries <= kx->kx_max)
		return pruned;
	target = kx->kx_max - kx->kx_max / 10;
	v = xreallocarray(NULL, kx->kx_entries, sizeof(*v));
	for (s = 0; s < SHM_MAX_WORKERS; s++) {
		kw = &kx->kx_workers[s];
		for (b = 0; b < kw->kw_nbuckets; b++)
			for (kb = kw->kw_tab[b]; kb != NULL; kb = kb->kb_next) {
				t = kb->kb_touch_ms > kb->kb_entry->ke_touch_ms
				    ? kb->kb_touch_ms
				    : kb->kb_entry->ke_touch_ms;
				if (now_ms >= t &&
				    now_ms - t < KVINDEX_RECENT_MS)
					continue;
				v[nv].kv_touch_ms = t;
				v[nv].kv_engine = kb->kb_engine;
				v[nv].kv_slot = s;
				nv++;
			}
	}
	qsort(v, nv, sizeof(*v), kx_victim_cmp);
	for (i = 0; i < nv && kx->kx_entries > target; i++)
		if (kx_block_del(kx, v[i].kv_slot, v[i].kv_engine))
			pruned++;
	free(v);
	return pruned;
}

/* ------------------------------------------------------------ broker */

static struct kx_glue *
kx_glue(struct broker *br, bool create)
{
	struct kx_glue *g;

	for (g = kx_glues; g != NULL; g = g->kg_next)
		if (g->kg_br == br)
			return g;
	if (!create)
		return NULL;
	g = xcalloc(1, sizeof(*g));
	g->kg_br = br;
	ev_timer_init(&g->kg_prune, kx_prune_cb, KVINDEX_PRUNE_MS / 1000.,
	    KVINDEX_PRUNE_MS / 1000.);
	g->kg_prune.data = g;
	g->kg_next = kx_glues;
	kx_glues = g;
	return g;
}

static void
kx_prune_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct kx_glue *g = t->data;
	size_t n;

	(void)loop;
	(void)revents;
	if (g->kg_kx == NULL)
		return;
	if ((n = kvindex_prune(g->kg_kx, shm_now_ms())) > 0)
		log_info("%s: pruned %zu KV blocks, %zu left", __func__, n,
		    kvindex_entries(g->kg_kx));
}

struct kvindex *
kvindex_of(struct broker *br)
{
	struct kx_glue *g = kx_glue(br, true);

	if (g->kg_kx == NULL) {
		g->kg_kx = kvindex_new(g->kg_ttl_ms, g->kg_max);
		if (br->br_loop != NULL)
			ev_timer_start(br->br_loop, &g->kg_prune);
	}
	return g->kg_kx;
}

void
kvindex_broker_bounds(struct broker *br, uint64_t ttl_secs,
    uint64_t max_entries)
{
	struct kx_glue *g = kx_glue(br, true);

	g->kg_ttl_ms = ttl_secs * 1000;
	g->kg_max = max_entries;
	if (g->kg_kx != NULL)
		kvindex_set_bounds(g->kg_kx, g->kg_ttl_ms, g->kg_max);
}

void
kvindex_broker_free(struct broker *br)
{
	struct kx_glue **pp, *g;

	for (pp = &kx_glues; (g = *pp) != NULL; pp = &g->kg_next)
		if (g->kg_br == br) {
			*pp = g->kg_next;
			if (br->br_loop != NULL)
				ev_timer_stop(br->br_loop, &g->kg_prune);
			kvindex_free(g->kg_kx);
			free(g);
			return;
		}
}

/* The leg whose policy routes this worker type. */
static int
kx_leg(const struct worker *w)
{
	switch (w->wk_type) {
	case SMG__WORKER_TYPE__WORKER_TYPE_PREFILL:
		return SMG__LEG__LEG_PREFILL;
	case SMG__WORKER_TYPE__WORKER_TYPE_DECODE:
		return SMG__LEG__LEG_DECODE;
	case SMG__WORKER_TYPE__WORKER_TYPE_ENCODE:
		return SMG__LEG__LEG_ENCODE;
	default:
		return SMG__LEG__LEG_SINGLE;
	}
}

void
kvindex_handle(struct broker *br, const Smg__KvEventBatch *b)
{
	struct worker *w;
	struct policy *p;
	size_t skipped;

	w = registry_by_slot(br, b->worker_slot, b->worker_generation);
	if (w == NULL ||
	    (b->worker_url != NULL && *b->worker_url != '\0' &&
	        strcmp(b->worker_url, w->wk_url) != 0)) {
		log_debug("%s: stale KV events for slot %u generation %u",
		    __func__, b->worker_slot, b->worker_generation);
		return;
	}
	/* Only cache_aware consumes the index (workers.md §5.1). */
	p = policy_for(br, w->wk_me, kx_leg(w));
	if (p == NULL || strcmp(policy_name(p), "cache_aware") != 0) {
		if (kx_glue(br, false) != NULL)
			kvindex_worker_removed(br, w);
		return;
	}
	skipped = kvindex_apply(kvindex_of(br), w->wk_model, w->wk_slot,
	    w->wk_generation, b, shm_now_ms());
	if (skipped > 0)
		log_warnx("%s: %s: batch %llu: %zu stored blocks without "
		          "their tokens skipped",
		    __func__, w->wk_url, (unsigned long long)b->sequence,
		    skipped);
	log_debug("%s: %s: batch %llu%s, %zu events; model %s holds %zu "
	          "blocks",
	    __func__, w->wk_url, (unsigned long long)b->sequence,
	    b->reset ? " (reset)" : "", b->n_events, w->wk_model,
	    kvindex_blocks(kvindex_of(br), w->wk_model));
}

void
kvindex_worker_removed(struct broker *br, struct worker *w)
{
	struct kx_glue *g = kx_glue(br, false);

	if (g != NULL && g->kg_kx != NULL)
		kvindex_forget_worker(g->kg_kx, w->wk_slot);
}

const struct registry_observer kvindex_registry_observer = {
	.ro_worker_moved = kvindex_worker_removed,
	.ro_worker_removed = kvindex_worker_removed,
};

bool
kvindex_active(struct broker *br, const char *model)
{
	struct kx_glue *g = kx_glue(br, false);

	return g != NULL && g->kg_kx != NULL &&
	    kvindex_blocks(g->kg_kx, model) > 0;
}

int
kvindex_select(struct broker *br, const char *model, struct worker *const *c,
    unsigned n, const uint32_t *load, const uint32_t *tokens, size_t ntok,
    uint32_t default_bs, uint32_t *score)
{
	struct kx_glue *g = kx_glue(br, false);
	unsigned slots[SHM_MAX_WORKERS];
	uint32_t scores[SHM_MAX_WORKERS], best = 0, bl = 0, ties = 0, bs;
	unsigned i;
	int pick = -1;

	*score = 0;
	if (g == NULL || g->kg_kx == NULL || n == 0 || n > SHM_MAX_WORKERS)
		return -1;
	bs = kvindex_block_size(g->kg_kx, model);
	if (bs == 0)
		bs = default_bs;
	for (i = 0; i < n; i++)
		slots[i] = c[i]->wk_slot;
	kvindex_overlap(g->kg_kx, model, tokens, ntok, bs, slots, n, scores,
	    shm_now_ms());
	for (i = 0; i < n; i++) {
		if (scores[i] == 0)
			continue;
		if (scores[i] > best || (scores[i] == best && load[i] < bl)) {
			best = scores[i];
			bl = load[i];
			pick = (int)i;
			ties = 1;
		} else if (scores[i] == best && load[i] == bl &&
		    policy_rand_below(++ties) == 0)
			pick = (int)i;
	}
	*score = best;
	return pick;
}
