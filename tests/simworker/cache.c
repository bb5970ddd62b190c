/* cache.c: the simulated engine's paged prefix cache with LRU eviction. */
#include <sys/queue.h>

#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "shared/log.h"
#include "shared/xmalloc.h"
#include "tests/simworker/simworker.h"

/* Seed of the hash of a sequence's first page (it has no parent). */
#define CACHE_ROOT_SEED 0x736d6763ULL

struct cache_page {
	uint64_t cp_hash;
	uint64_t cp_parent;
	int cp_has_parent;
	uint32_t cp_ref; /* requests holding it; 0: on the LRU list */
	uint32_t *cp_tokens;
	struct cache_page *cp_next; /* hash chain or free list */
	TAILQ_ENTRY(cache_page) cp_lru;
};

TAILQ_HEAD(cache_lru, cache_page);

struct cache {
	uint32_t c_page_size;
	uint64_t c_capacity; /* tokens */
	uint32_t c_max_pages; /* capacity / page size */
	uint32_t c_pages; /* pages in the cache */
	uint32_t c_locked; /* pages with cp_ref > 0 */
	uint64_t c_reserved; /* tokens reserved by requests */
	struct cache_page *c_pool;
	uint32_t *c_token_pool;
	struct cache_page *c_free;
	struct cache_page **c_buckets;
	uint32_t c_nbuckets; /* a power of two */
	struct cache_lru c_lru; /* head: least recently used */
	cache_event_cb c_cb;
	void *c_cb_arg;
};

static uint64_t cache_hash(const struct cache *, const struct cache_page *,
    const uint32_t *);
static struct cache_page *cache_lookup(struct cache *,
    const struct cache_page *, const uint32_t *);
static void cache_bucket_remove(struct cache *, struct cache_page *);
static void cache_evict(struct cache *, struct cache_page *);
static void cache_lock(struct cache *, struct cache_page *);
static void cache_emit(struct cache *, const struct kv_event *);

struct cache *
cache_new(uint32_t page_size, uint64_t capacity_tokens)
{
	struct cache *c;
	uint32_t i;

	if (page_size == 0 || capacity_tokens < page_size ||
	    capacity_tokens / page_size > (1U << 26))
		fatalx("%s: page size %u, capacity %llu", __func__, page_size,
		    (unsigned long long)capacity_tokens);
	c = xcalloc(1, sizeof(*c));
	c->c_page_size = page_size;
	c->c_capacity = capacity_tokens;
	c->c_max_pages = (uint32_t)(capacity_tokens / page_size);
	c->c_pool = xcalloc(c->c_max_pages, sizeof(*c->c_pool));
	c->c_token_pool =
	    xcalloc((size_t)c->c_max_pages * page_size, sizeof(uint32_t));
	for (i = 0; i < c->c_max_pages; i++) {
		c->c_pool[i].cp_tokens =
		    c->c_token_pool + (size_t)i * page_size;
		c->c_pool[i].cp_next = c->c_free;
		c->c_free = &c->c_pool[i];
	}
	c->c_nbuckets = 1;
	while (c->c_nbuckets < c->c_max_pages)
		c->c_nbuckets <<= 1;
	c->c_buckets = xcalloc(c->c_nbuckets, sizeof(*c->c_buckets));
	TAILQ_INIT(&c->c_lru);
	return c;
}

void
cache_free(struct cache *c)
{
	if (c == NULL)
		return;
	free(c->c_buckets);
	free(c->c_token_pool);
	free(c->c_pool);
	free(c);
}

void
cache_set_listener(struct cache *c, cache_event_cb cb, void *arg)
{
	c->c_cb = cb;
	c->c_cb_arg = arg;
}

uint32_t
cache_page_size(const struct cache *c)
{
	return c->c_page_size;
}

uint64_t
cache_capacity(const struct cache *c)
{
	return c->c_capacity;
}

uint64_t
cache_cached_tokens(const struct cache *c)
{
	return (uint64_t)c->c_pages * c->c_page_size;
}

uint64_t
cache_used_tokens(const struct cache *c)
{
	return (uint64_t)c->c_locked * c->c_page_size + c->c_reserved;
}

int64_t
cache_page_hash(const struct cache_page *p)
{
	return (int64_t)p->cp_hash;
}

/* The page hash covers the parent's hash, so it encodes the whole prefix. */
static uint64_t
cache_hash(const struct cache *c, const struct cache_page *parent,
    const uint32_t *tokens)
{
	uint64_t seed;

	seed = parent != NULL ? parent->cp_hash : CACHE_ROOT_SEED;
	return XXH3_64bits_withSeed(tokens, c->c_page_size * sizeof(uint32_t),
	    seed);
}

static struct cache_page *
cache_lookup(struct cache *c, const struct cache_page *parent,
    const uint32_t *tokens)
{
	struct cache_page *p;
	uint64_t h;

	h = cache_hash(c, parent, tokens);
	for (p = c->c_buckets[h & (c->c_nbuckets - 1)]; p != NULL;
	     p = p->cp_next) {
		if (p->cp_hash != h)
			continue;
		if ((parent == NULL) != !p->cp_has_parent)
			continue;
		if (parent != NULL && p->cp_parent != parent->cp_hash)
			continue;
		if (memcmp(p->cp_tokens, tokens,
		        c->c_page_size * sizeof(uint32_t)) == 0)
			return p;
	}
	return NULL;
}

static void
cache_emit(struct cache *c, const struct kv_event *ev)
{
	if (c->c_cb != NULL)
		c->c_cb(c->c_cb_arg, ev);
}

static void
cache_lock(struct cache *c, struct cache_page *p)
{
	if (p->cp_ref++ == 0) {
		TAILQ_REMOVE(&c->c_lru, p, cp_lru);
		c->c_locked++;
	}
}

uint32_t
cache_match(struct cache *c, const uint32_t *tokens, uint32_t max_pages,
    struct cache_page **pages)
{
	struct cache_page *parent = NULL, *p;
	uint32_t i;

	for (i = 0; i < max_pages; i++) {
		p = cache_lookup(c, parent,
		    tokens + (size_t)i * c->c_page_size);
		if (p == NULL)
			break;
		if (pages != NULL) {
			cache_lock(c, p);
			pages[i] = p;
		}
		parent = p;
	}
	return i;
}

static void
cache_bucket_remove(struct cache *c, struct cache_page *p)
{
	struct cache_page **pp;

	pp = &c->c_buckets[p->cp_hash & (c->c_nbuckets - 1)];
	while (*pp != p)
		pp = &(*pp)->cp_next;
	*pp = p->cp_next;
}

static void
cache_evict(struct cache *c, struct cache_page *p)
{
	struct kv_event ev = {
		.ke_kind = KV_EVENT_REMOVED,
		.ke_hash = (int64_t)p->cp_hash,
	};

	TAILQ_REMOVE(&c->c_lru, p, cp_lru);
	cache_bucket_remove(c, p);
	p->cp_next = c->c_free;
	c->c_free = p;
	c->c_pages--;
	cache_emit(c, &ev);
}

int
cache_reserve(struct cache *c, uint64_t n)
{
	struct cache_page *p;

	while (cache_cached_tokens(c) + c->c_reserved + n > c->c_capacity) {
		if ((p = TAILQ_FIRST(&c->c_lru)) == NULL)
			return -1;
		cache_evict(c, p);
	}
	c->c_reserved += n;
	return 0;
}

void
cache_unreserve(struct cache *c, uint64_t n)
{
	if (n > c->c_reserved)
		fatalx("%s: %llu > %llu reserved", __func__,
		    (unsigned long long)n, (unsigned long long)c->c_reserved);
	c->c_reserved -= n;
}

void
cache_insert(struct cache *c, const uint32_t *tokens, uint32_t from,
    uint32_t to, struct cache_page **pages)
{
	struct cache_page *parent, *p;
	const uint32_t *t;
	struct kv_event ev;
	uint32_t i;

	for (i = from; i < to; i++) {
		parent = i > 0 ? pages[i - 1] : NULL;
		t = tokens + (size_t)i * c->c_page_size;
		cache_unreserve(c, c->c_page_size);
		if ((p = cache_lookup(c, parent, t)) != NULL) {
			/* Another request stored it meanwhile. */
			cache_lock(c, p);
			pages[i] = p;
			continue;
		}
		if ((p = c->c_free) == NULL)
			fatalx("%s: page pool exhausted", __func__);
		c->c_free = p->cp_next;
		memcpy(p->cp_tokens, t, c->c_page_size * sizeof(uint32_t));
		p->cp_hash = cache_hash(c, parent, t);
		p->cp_has_parent = parent != NULL;
		p->cp_parent = parent != NULL ? parent->cp_hash : 0;
		p->cp_ref = 1;
		p->cp_next = c->c_buckets[p->cp_hash & (c->c_nbuckets - 1)];
		c->c_buckets[p->cp_hash & (c->c_nbuckets - 1)] = p;
		c->c_pages++;
		c->c_locked++;
		pages[i] = p;
		ev = (struct kv_event) {
			.ke_kind = KV_EVENT_STORED,
			.ke_hash = (int64_t)p->cp_hash,
			.ke_parent = (int64_t)p->cp_parent,
			.ke_has_parent = p->cp_has_parent,
			.ke_tokens = p->cp_tokens,
			.ke_block_size = c->c_page_size,
		};
		cache_emit(c, &ev);
	}
}

/*
 * Deepest page first, so a parent is always more recently used than its
 * children and eviction keeps the cache prefix-closed.
 */
void
cache_unlock(struct cache *c, struct cache_page **pages, uint32_t n)
{
	struct cache_page *p;

	while (n > 0) {
		p = pages[--n];
		if (p->cp_ref == 0)
			fatalx("%s: page not locked", __func__);
		if (--p->cp_ref == 0) {
			TAILQ_INSERT_TAIL(&c->c_lru, p, cp_lru);
			c->c_locked--;
		}
	}
}

int
cache_flush(struct cache *c)
{
	struct kv_event ev = { .ke_kind = KV_EVENT_CLEARED };
	struct cache_page *p;

	if (c->c_locked > 0 || c->c_reserved > 0)
		return -1;
	while ((p = TAILQ_FIRST(&c->c_lru)) != NULL) {
		TAILQ_REMOVE(&c->c_lru, p, cp_lru);
		cache_bucket_remove(c, p);
		p->cp_next = c->c_free;
		c->c_free = p;
		c->c_pages--;
	}
	cache_emit(c, &ev);
	return 0;
}
