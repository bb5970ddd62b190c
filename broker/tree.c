/*
 * tree.c: the multi-tenant radix trees of cache_aware (string and token),
 * with a global least-recently-used order of (tenant, node) pairs that makes
 * eviction O(1) per pair.
 *
 * Layout. A node owns its edge (UTF-8 bytes or token ids, in a separate
 * allocation so a split can shrink it), a sorted array of children keyed by
 * their first unit (a char's UTF-8 bytes, or a hash of the first token page,
 * which may collide and is then disambiguated by comparing the page), and a
 * sorted array of tenant slots. Every slot of a non-root node points to an
 * entry in a pool of list entries (32-bit indices, chunked so the pool never
 * moves); entry 0 is the head of the recency list.
 *
 * Invariants (tree_check verifies them):
 * - the nodes holding a tenant form a subtree closed towards the root, so a
 *   node without tenant has no child and is deleted;
 * - in the recency list, the entry of (t, n) comes before the entry of
 *   (t, parent of n). Inserts and matches refresh paths deepest first, a
 *   split puts the new upper node right after the lower one, a new pair goes
 *   right before its parent's pair. Hence the head of the list is always a
 *   pair whose node has no child holding its tenant: the eviction candidate
 *   §11.8 asks for, without a search.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "broker/tree.h"
#include "shared/log.h"
#include "shared/xmalloc.h"

#define ENT_SHIFT 12
#define ENT_CHUNK (1u << ENT_SHIFT)
#define ENT_MASK  (ENT_CHUNK - 1)
#define ENT_LIMIT 0xfffff000u
/* Largest key accepted, in bytes (edges keep 32-bit lengths). */
#define KEY_LIMIT 0x40000000u
#define CMP_BLOCK 256

struct tree_ent {
	uint32_t e_prev;
	uint32_t e_next;
	struct tree_node *e_node;
	uint16_t e_tenant;
};

struct tree_slot {
	uint32_t s_ent; /* 0 on the root, which is not in the list */
	uint16_t s_tenant;
};

struct tree_node {
	struct tree_node *n_parent;
	struct tree_node **n_kids;
	struct tree_slot *n_slots;
	unsigned char *n_edge;
	uint32_t n_key;
	uint32_t n_len; /* chars or tokens */
	uint32_t n_bytes; /* bytes of n_edge */
	uint32_t n_nkids;
	uint32_t n_kcap;
	uint32_t n_nslots;
	uint32_t n_scap;
};

struct tree {
	enum tree_kind t_kind;
	uint32_t t_bs; /* tokens per page; 1 for strings */
	uint32_t t_unit; /* bytes per page (tokens only) */
	uint64_t t_max;
	uint64_t t_size;
	size_t t_nodes;
	size_t t_mem;
	uint32_t t_rot;
	struct tree_node t_root;
	struct tree_ent **t_chunks;
	uint32_t t_nchunks;
	uint32_t t_nents; /* entries ever handed out, sentinel included */
	uint32_t t_free; /* free list through e_next, 0 = empty */
	uint32_t t_nfree;
	uint32_t *t_path; /* entries of the current insert path */
	size_t t_pathcap;
	unsigned char *t_buf; /* sanitised input */
	size_t t_bufcap;
};

static void *mem_alloc(struct tree *, size_t);
static void *mem_realloc(struct tree *, void *, size_t, size_t);
static void mem_free(struct tree *, void *, size_t);
static struct tree_ent *ent(const struct tree *, uint32_t);
static int ent_reserve(struct tree *, uint32_t);
static uint32_t ent_get(struct tree *);
static void ent_put(struct tree *, uint32_t);
static void lru_unlink(struct tree *, uint32_t);
static void lru_after(struct tree *, uint32_t, uint32_t);
static void lru_tail(struct tree *, uint32_t);
static size_t utf8_seqlen(const unsigned char *, size_t);
static size_t utf8_scan(const unsigned char *, size_t);
static size_t utf8_count(const unsigned char *, size_t);
static size_t mismatch(const unsigned char *, const unsigned char *, size_t);
static size_t common(const struct tree *, const unsigned char *,
    const unsigned char *, size_t);
static uint32_t units(const struct tree *, const unsigned char *, size_t);
static uint32_t key_of(const struct tree *, const unsigned char *);
static int slot_find(const struct tree_node *, unsigned, uint32_t *);
static uint32_t kid_lower(const struct tree_node *, uint32_t);
static struct tree_node *kid_find(const struct tree *, const struct tree_node *,
    const unsigned char *);
static uint32_t kid_index(const struct tree_node *, const struct tree_node *);
static int kid_reserve(struct tree *, struct tree_node *);
static void kid_add(struct tree_node *, struct tree_node *);
static int attach(struct tree *, struct tree_node *, unsigned, uint32_t *);
static void detach(struct tree *, struct tree_node *, uint32_t);
static struct tree_node *leaf_new(struct tree *, struct tree_node *,
    const unsigned char *, size_t, uint32_t);
static struct tree_node *split(struct tree *, struct tree_node *, size_t);
static void node_delete(struct tree *, struct tree_node *);
static void node_destroy(struct tree *, struct tree_node *);
static size_t evict(struct tree *);
static const unsigned char *text_prepare(struct tree *, const char *, size_t,
    size_t *, size_t *);
static int insert_bytes(struct tree *, const unsigned char *, size_t, size_t,
    unsigned);
static void match_bytes(struct tree *, const unsigned char *, size_t,
    struct tree_match *);
static int leaf_for(const struct tree_node *, unsigned);

static void *
mem_alloc(struct tree *t, size_t n)
{
	void *p;

	if ((p = malloc(n)) != NULL)
		t->t_mem += n;
	return p;
}

static void *
mem_realloc(struct tree *t, void *p, size_t old, size_t n)
{
	void *q;

	if ((q = realloc(p, n)) != NULL)
		t->t_mem = t->t_mem - old + n;
	return q;
}

static void
mem_free(struct tree *t, void *p, size_t n)
{
	if (p == NULL)
		return;
	free(p);
	t->t_mem -= n;
}

static struct tree_ent *
ent(const struct tree *t, uint32_t i)
{
	return &t->t_chunks[i >> ENT_SHIFT][i & ENT_MASK];
}

/* Makes sure n entries can be taken without allocating. */
static int
ent_reserve(struct tree *t, uint32_t n)
{
	struct tree_ent **chunks, *c;
	uint64_t avail;

	for (;;) {
		avail = (uint64_t)t->t_nfree +
		    ((uint64_t)t->t_nchunks * ENT_CHUNK - t->t_nents);
		if (avail >= n)
			return 0;
		if ((uint64_t)t->t_nchunks * ENT_CHUNK >= ENT_LIMIT) {
			log_warnx("%s: too many tree entries", __func__);
			return -1;
		}
		chunks =
		    mem_realloc(t, t->t_chunks, t->t_nchunks * sizeof(*chunks),
		        (t->t_nchunks + 1) * sizeof(*chunks));
		if (chunks == NULL)
			return -1;
		t->t_chunks = chunks;
		if ((c = mem_alloc(t, ENT_CHUNK * sizeof(*c))) == NULL)
			return -1;
		t->t_chunks[t->t_nchunks++] = c;
	}
}

/* Takes an entry; ent_reserve must have made room. */
static uint32_t
ent_get(struct tree *t)
{
	uint32_t i;

	if (t->t_free != 0) {
		i = t->t_free;
		t->t_free = ent(t, i)->e_next;
		t->t_nfree--;
		return i;
	}
	return t->t_nents++;
}

static void
ent_put(struct tree *t, uint32_t i)
{
	struct tree_ent *e = ent(t, i);

	e->e_node = NULL;
	e->e_next = t->t_free;
	t->t_free = i;
	t->t_nfree++;
}

static void
lru_unlink(struct tree *t, uint32_t i)
{
	struct tree_ent *e = ent(t, i);

	ent(t, e->e_prev)->e_next = e->e_next;
	ent(t, e->e_next)->e_prev = e->e_prev;
}

static void
lru_after(struct tree *t, uint32_t i, uint32_t after)
{
	struct tree_ent *e = ent(t, i), *a = ent(t, after);

	e->e_prev = after;
	e->e_next = a->e_next;
	ent(t, a->e_next)->e_prev = i;
	a->e_next = i;
}

static void
lru_tail(struct tree *t, uint32_t i)
{
	lru_after(t, i, ent(t, 0)->e_prev);
}

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if invalid. */
static size_t
utf8_seqlen(const unsigned char *s, size_t n)
{
	unsigned c = s[0];

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		return n >= 2 && (s[1] & 0xc0) == 0x80 ? 2 : 0;
	if (c >= 0xe0 && c <= 0xef) {
		if (n < 3 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80)
			return 0;
		if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0))
			return 0;
		return 3;
	}
	if (c >= 0xf0 && c <= 0xf4) {
		if (n < 4 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80 ||
		    (s[3] & 0xc0) != 0x80)
			return 0;
		if ((c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] >= 0x90))
			return 0;
		return 4;
	}
	return 0;
}

/* Scalar values in s if it is valid UTF-8, else SIZE_MAX. */
static size_t
utf8_scan(const unsigned char *s, size_t n)
{
	size_t i = 0, chars = 0, l;
	uint64_t w[4];

	while (i < n) {
		if (n - i >= 32) {
			memcpy(w, s + i, 32);
			if (((w[0] | w[1] | w[2] | w[3]) &
			        0x8080808080808080ULL) == 0) {
				i += 32;
				chars += 32;
				continue;
			}
		}
		if ((l = utf8_seqlen(s + i, n - i)) == 0)
			return SIZE_MAX;
		i += l;
		chars++;
	}
	return chars;
}

/* Scalar values in valid UTF-8: bytes that are not continuation bytes. */
static size_t
utf8_count(const unsigned char *s, size_t n)
{
	size_t i = 0, cont = 0;
	uint64_t w;

	for (; i + 8 <= n; i += 8) {
		memcpy(&w, s + i, 8);
		cont += (size_t)__builtin_popcountll(
		    w & ~(w << 1) & 0x8080808080808080ULL);
	}
	for (; i < n; i++)
		cont += (s[i] & 0xc0) == 0x80;
	return n - cont;
}

/* Index of the first differing byte of a and b, or n. */
static size_t
mismatch(const unsigned char *a, const unsigned char *b, size_t n)
{
	size_t i = 0, step;
	uint64_t x, y;

	while (n - i > CMP_BLOCK) {
		if (memcmp(a + i, b + i, CMP_BLOCK) != 0)
			break;
		i += CMP_BLOCK;
	}
	for (; n - i >= 8; i += 8) {
		memcpy(&x, a + i, 8);
		memcpy(&y, b + i, 8);
		if (x != y) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
			step = (size_t)__builtin_clzll(x ^ y) >> 3;
#else
			step = (size_t)__builtin_ctzll(x ^ y) >> 3;
#endif
			return i + step;
		}
	}
	while (i < n && a[i] == b[i])
		i++;
	return i;
}

/* Common prefix of a and b (n bytes at most), in bytes, cut back to a char
 * or page boundary. */
static size_t
common(const struct tree *t, const unsigned char *a, const unsigned char *b,
    size_t n)
{
	size_t k = mismatch(a, b, n);

	if (k == n)
		return k;
	if (t->t_kind == TREE_TOKEN)
		return k - k % t->t_unit;
	while (k > 0 && (a[k] & 0xc0) == 0x80)
		k--;
	return k;
}

static uint32_t
units(const struct tree *t, const unsigned char *b, size_t n)
{
	if (t->t_kind == TREE_TOKEN)
		return (uint32_t)(n / sizeof(uint32_t));
	return (uint32_t)utf8_count(b, n);
}

/* Child key of a key starting at b: the first char's bytes, or a hash of
 * the first page. */
static uint32_t
key_of(const struct tree *t, const unsigned char *b)
{
	uint32_t k;
	size_t l, i;

	if (t->t_kind == TREE_TOKEN)
		return (uint32_t)XXH3_64bits(b, t->t_unit);
	if (b[0] < 0x80)
		return b[0];
	l = b[0] >= 0xf0 ? 4 : b[0] >= 0xe0 ? 3 : 2;
	for (k = 0, i = 0; i < l; i++)
		k = k << 8 | b[i];
	return k;
}

/* Finds tenant in n's slots: 1 and its index, or 0 and where it goes. */
static int
slot_find(const struct tree_node *n, unsigned tenant, uint32_t *pos)
{
	uint32_t lo = 0, hi = n->n_nslots, mid;

	while (lo < hi) {
		mid = lo + (hi - lo) / 2;
		if (n->n_slots[mid].s_tenant < tenant)
			lo = mid + 1;
		else
			hi = mid;
	}
	*pos = lo;
	return lo < n->n_nslots && n->n_slots[lo].s_tenant == tenant;
}

static uint32_t
kid_lower(const struct tree_node *n, uint32_t key)
{
	uint32_t lo = 0, hi = n->n_nkids, mid;

	while (lo < hi) {
		mid = lo + (hi - lo) / 2;
		if (n->n_kids[mid]->n_key < key)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The child of n whose edge starts with the unit at b, or NULL. */
static struct tree_node *
kid_find(const struct tree *t, const struct tree_node *n,
    const unsigned char *b)
{
	uint32_t key = key_of(t, b), i;
	struct tree_node *c;

	for (i = kid_lower(n, key); i < n->n_nkids; i++) {
		c = n->n_kids[i];
		if (c->n_key != key)
			break;
		if (t->t_kind == TREE_STRING ||
		    memcmp(c->n_edge, b, t->t_unit) == 0)
			return c;
	}
	return NULL;
}

static uint32_t
kid_index(const struct tree_node *n, const struct tree_node *c)
{
	uint32_t i;

	for (i = kid_lower(n, c->n_key); i < n->n_nkids; i++)
		if (n->n_kids[i] == c)
			return i;
	fatalx("%s: child missing from its parent", __func__);
}

static int
kid_reserve(struct tree *t, struct tree_node *n)
{
	struct tree_node **k;
	uint32_t cap;

	if (n->n_nkids < n->n_kcap)
		return 0;
	cap = n->n_kcap == 0 ? 1 : n->n_kcap * 2;
	k = mem_realloc(t, n->n_kids, n->n_kcap * sizeof(*k), cap * sizeof(*k));
	if (k == NULL)
		return -1;
	n->n_kids = k;
	n->n_kcap = cap;
	return 0;
}

/* Adds c to n's children; kid_reserve must have made room. */
static void
kid_add(struct tree_node *n, struct tree_node *c)
{
	uint32_t i = kid_lower(n, c->n_key);

	memmove(n->n_kids + i + 1, n->n_kids + i,
	    (n->n_nkids - i) * sizeof(*n->n_kids));
	n->n_kids[i] = c;
	n->n_nkids++;
	c->n_parent = n;
}

/*
 * Puts tenant on n (whose parent already holds it) and returns its entry
 * (0 on the root) in *ei. A new pair is linked right before its parent's
 * pair, or last under the root, which keeps the recency invariant.
 */
static int
attach(struct tree *t, struct tree_node *n, unsigned tenant, uint32_t *ei)
{
	struct tree_node *p = n->n_parent;
	struct tree_slot *s;
	uint32_t pos, ppos, cap, i = 0;

	if (slot_find(n, tenant, &pos)) {
		*ei = n->n_slots[pos].s_ent;
		return 0;
	}
	if (n->n_nslots == n->n_scap) {
		cap = n->n_scap == 0 ? 1 : n->n_scap * 2;
		s = mem_realloc(t, n->n_slots, n->n_scap * sizeof(*s),
		    cap * sizeof(*s));
		if (s == NULL)
			return -1;
		n->n_slots = s;
		n->n_scap = cap;
	}
	if (p != NULL) {
		if (ent_reserve(t, 1) == -1)
			return -1;
		i = ent_get(t);
		ent(t, i)->e_node = n;
		ent(t, i)->e_tenant = (uint16_t)tenant;
		if (p == &t->t_root)
			lru_tail(t, i);
		else {
			if (!slot_find(p, tenant, &ppos))
				fatalx("%s: parent lacks tenant", __func__);
			lru_after(t, i, ent(t, p->n_slots[ppos].s_ent)->e_prev);
		}
	}
	memmove(n->n_slots + pos + 1, n->n_slots + pos,
	    (n->n_nslots - pos) * sizeof(*n->n_slots));
	n->n_slots[pos].s_ent = i;
	n->n_slots[pos].s_tenant = (uint16_t)tenant;
	n->n_nslots++;
	t->t_size += n->n_len;
	*ei = i;
	return 0;
}

/* Removes slot pos from n, with its entry. */
static void
detach(struct tree *t, struct tree_node *n, uint32_t pos)
{
	uint32_t i = n->n_slots[pos].s_ent;

	if (i != 0) {
		lru_unlink(t, i);
		ent_put(t, i);
	}
	memmove(n->n_slots + pos, n->n_slots + pos + 1,
	    (n->n_nslots - pos - 1) * sizeof(*n->n_slots));
	n->n_nslots--;
	t->t_size -= n->n_len;
}

/* A new child of p with edge b (nb bytes, len units); no tenant yet. */
static struct tree_node *
leaf_new(struct tree *t, struct tree_node *p, const unsigned char *b, size_t nb,
    uint32_t len)
{
	struct tree_node *n;

	if (kid_reserve(t, p) == -1)
		return NULL;
	if ((n = mem_alloc(t, sizeof(*n))) == NULL)
		return NULL;
	memset(n, 0, sizeof(*n));
	if ((n->n_edge = mem_alloc(t, nb)) == NULL) {
		mem_free(t, n, sizeof(*n));
		return NULL;
	}
	memcpy(n->n_edge, b, nb);
	n->n_bytes = (uint32_t)nb;
	n->n_len = len;
	n->n_key = key_of(t, b);
	kid_add(p, n);
	t->t_nodes++;
	return n;
}

/*
 * Splits c after k bytes (0 < k < edge): a new node m takes c's place with
 * the first k bytes and c's tenants, c keeps the rest below m. Returns m,
 * or NULL with the tree unchanged.
 */
static struct tree_node *
split(struct tree *t, struct tree_node *c, size_t k)
{
	struct tree_node *m = NULL, *p = c->n_parent;
	unsigned char *rest = NULL;
	uint32_t i, e, at, restlen = c->n_bytes - (uint32_t)k;

	if (ent_reserve(t, c->n_nslots) == -1)
		return NULL;
	if ((m = mem_alloc(t, sizeof(*m))) == NULL)
		return NULL;
	memset(m, 0, sizeof(*m));
	m->n_edge = mem_alloc(t, k);
	rest = mem_alloc(t, restlen);
	m->n_kids = mem_alloc(t, sizeof(*m->n_kids));
	m->n_slots = mem_alloc(t, c->n_nslots * sizeof(*m->n_slots));
	if (m->n_edge == NULL || rest == NULL || m->n_kids == NULL ||
	    m->n_slots == NULL) {
		mem_free(t, m->n_edge, k);
		mem_free(t, rest, restlen);
		mem_free(t, m->n_kids, sizeof(*m->n_kids));
		mem_free(t, m->n_slots, c->n_nslots * sizeof(*m->n_slots));
		mem_free(t, m, sizeof(*m));
		return NULL;
	}
	at = kid_index(p, c);
	memcpy(m->n_edge, c->n_edge, k);
	memcpy(rest, c->n_edge + k, restlen);
	mem_free(t, c->n_edge, c->n_bytes);
	m->n_bytes = (uint32_t)k;
	m->n_len = units(t, m->n_edge, k);
	m->n_key = c->n_key;
	c->n_edge = rest;
	c->n_bytes = restlen;
	c->n_len -= m->n_len;
	c->n_key = key_of(t, rest);

	p->n_kids[at] = m;
	m->n_parent = p;
	m->n_kids[0] = c;
	m->n_nkids = m->n_kcap = 1;
	c->n_parent = m;

	m->n_nslots = m->n_scap = c->n_nslots;
	for (i = 0; i < c->n_nslots; i++) {
		e = ent_get(t);
		ent(t, e)->e_node = m;
		ent(t, e)->e_tenant = c->n_slots[i].s_tenant;
		lru_after(t, e, c->n_slots[i].s_ent);
		m->n_slots[i].s_ent = e;
		m->n_slots[i].s_tenant = c->n_slots[i].s_tenant;
	}
	t->t_nodes++;
	return m;
}

/* Unlinks n (no tenant, no child) from its parent and frees it. */
static void
node_delete(struct tree *t, struct tree_node *n)
{
	struct tree_node *p = n->n_parent;
	uint32_t i = kid_index(p, n);

	memmove(p->n_kids + i, p->n_kids + i + 1,
	    (p->n_nkids - i - 1) * sizeof(*p->n_kids));
	if (--p->n_nkids == 0) {
		mem_free(t, p->n_kids, p->n_kcap * sizeof(*p->n_kids));
		p->n_kids = NULL;
		p->n_kcap = 0;
	}
	node_destroy(t, n);
	t->t_nodes--;
}

static void
node_destroy(struct tree *t, struct tree_node *n)
{
	mem_free(t, n->n_edge, n->n_bytes);
	mem_free(t, n->n_kids, n->n_kcap * sizeof(*n->n_kids));
	mem_free(t, n->n_slots, n->n_scap * sizeof(*n->n_slots));
	if (n != &t->t_root)
		mem_free(t, n, sizeof(*n));
}

static size_t
evict(struct tree *t)
{
	struct tree_ent *e;
	struct tree_node *n;
	uint32_t i, pos;
	size_t count = 0;

	while (t->t_size > t->t_max && (i = ent(t, 0)->e_next) != 0) {
		e = ent(t, i);
		n = e->e_node;
		if (!slot_find(n, e->e_tenant, &pos))
			fatalx("%s: entry without slot", __func__);
		detach(t, n, pos);
		if (n->n_nslots == 0)
			node_delete(t, n);
		count++;
	}
	return count;
}

/*
 * Validates s as UTF-8, replacing every invalid byte by U+FFFD in a scratch
 * copy if needed. Returns the bytes to use (*nb, *chars), or NULL when out
 * of memory.
 */
static const unsigned char *
text_prepare(struct tree *t, const char *s, size_t len, size_t *nb,
    size_t *chars)
{
	const unsigned char *u = (const unsigned char *)s;
	unsigned char *o;
	size_t i, l, n = 0;

	if ((*chars = utf8_scan(u, len)) != SIZE_MAX) {
		*nb = len;
		return u;
	}
	if (len > KEY_LIMIT / 3)
		return NULL;
	if (t->t_bufcap < len * 3) {
		o = mem_realloc(t, t->t_buf, t->t_bufcap, len * 3);
		if (o == NULL)
			return NULL;
		t->t_buf = o;
		t->t_bufcap = len * 3;
	}
	o = t->t_buf;
	for (i = 0; i < len; i += l) {
		if ((l = utf8_seqlen(u + i, len - i)) == 0) {
			memcpy(o + n, "\xef\xbf\xbd", 3);
			n += 3;
			l = 1;
		} else {
			memcpy(o + n, u + i, l);
			n += l;
		}
	}
	*nb = n;
	*chars = utf8_count(o, n);
	return o;
}

/* Inserts the nb bytes at b (nunits chars or tokens, aligned) for tenant. */
static int
insert_bytes(struct tree *t, const unsigned char *b, size_t nb, size_t nunits,
    unsigned tenant)
{
	struct tree_node *n = &t->t_root, *c;
	size_t pos = 0, depth = 0, k, cap, done = 0;
	uint32_t ei, *path;
	int rv = -1;

	if (attach(t, n, tenant, &ei) == -1)
		goto out;
	while (pos < nb) {
		if (depth == t->t_pathcap) {
			cap = depth == 0 ? 16 : depth * 2;
			path = mem_realloc(t, t->t_path,
			    t->t_pathcap * sizeof(*path), cap * sizeof(*path));
			if (path == NULL)
				goto out;
			t->t_path = path;
			t->t_pathcap = cap;
		}
		if ((c = kid_find(t, n, b + pos)) == NULL) {
			c = leaf_new(t, n, b + pos, nb - pos,
			    (uint32_t)(nunits - done));
			if (c == NULL)
				goto out;
			if (attach(t, c, tenant, &ei) == -1) {
				/* The slot array could not grow: drop c. */
				node_delete(t, c);
				goto out;
			}
			t->t_path[depth++] = ei;
			break;
		}
		k = common(t, c->n_edge, b + pos,
		    c->n_bytes < nb - pos ? c->n_bytes : nb - pos);
		if (k == 0)
			fatalx("%s: child key matched, edge did not", __func__);
		if (k < c->n_bytes && (c = split(t, c, k)) == NULL)
			goto out;
		if (attach(t, c, tenant, &ei) == -1)
			goto out;
		t->t_path[depth++] = ei;
		done += c->n_len;
		pos += k;
		n = c;
	}
	rv = 0;
	/* Deepest first, so each pair stays before its parent's pair. */
	while (depth > 0) {
		ei = t->t_path[--depth];
		lru_unlink(t, ei);
		lru_tail(t, ei);
	}
out:
	evict(t);
	return rv;
}

static void
match_bytes(struct tree *t, const unsigned char *b, size_t nb,
    struct tree_match *m)
{
	struct tree_node *n = &t->t_root, *c, *end = NULL, *x;
	size_t pos = 0, k, matched = 0, above = 0;
	uint32_t i, start, pos_slot, e;

	while (pos < nb && (c = kid_find(t, n, b + pos)) != NULL) {
		k = common(t, c->n_edge, b + pos,
		    c->n_bytes < nb - pos ? c->n_bytes : nb - pos);
		end = c;
		above = matched;
		if (k < c->n_bytes) {
			matched += units(t, c->n_edge, k);
			break;
		}
		matched += c->n_len;
		pos += k;
		n = c;
	}
	m->tm_matched = matched;
	m->tm_nholders = 0;
	m->tm_total = 0;
	m->tm_above = above;
	m->tm_node = NULL;
	if (end == NULL || matched == 0)
		return;
	m->tm_node = end;
	m->tm_total = end->n_nslots;
	start = t->t_rot % end->n_nslots;
	t->t_rot += TREE_MAX_HOLDERS;
	for (i = 0; i < end->n_nslots && i < TREE_MAX_HOLDERS; i++)
		m->tm_holders[m->tm_nholders++] =
		    end->n_slots[(start + i) % end->n_nslots].s_tenant;
	/* Refresh the reported holders along the path, deepest first. */
	for (i = 0; i < m->tm_nholders; i++) {
		for (x = end; x != &t->t_root; x = x->n_parent) {
			if (!slot_find(x, m->tm_holders[i], &pos_slot))
				fatalx("%s: tenant not on path", __func__);
			e = x->n_slots[pos_slot].s_ent;
			lru_unlink(t, e);
			lru_tail(t, e);
		}
	}
}

struct tree *
tree_new(enum tree_kind kind, uint64_t max_size, uint32_t block_size)
{
	struct tree *t;

	if (kind != TREE_STRING && kind != TREE_TOKEN)
		fatalx("%s: bad kind %d", __func__, (int)kind);
	if (max_size == 0 || (kind == TREE_TOKEN && block_size == 0))
		fatalx("%s: max_size and block_size must be > 0", __func__);
	if (kind == TREE_TOKEN && block_size > KEY_LIMIT / sizeof(uint32_t))
		fatalx("%s: block_size %u too large", __func__, block_size);
	t = xcalloc(1, sizeof(*t));
	t->t_kind = kind;
	t->t_bs = kind == TREE_TOKEN ? block_size : 1;
	t->t_unit = t->t_bs * (uint32_t)sizeof(uint32_t);
	t->t_max = max_size;
	t->t_chunks = xcalloc(1, sizeof(*t->t_chunks));
	t->t_chunks[0] = xcalloc(ENT_CHUNK, sizeof(struct tree_ent));
	t->t_nchunks = 1;
	t->t_nents = 1; /* entry 0: the list head */
	t->t_nodes = 1;
	t->t_mem = sizeof(*t) + sizeof(*t->t_chunks) +
	    ENT_CHUNK * sizeof(struct tree_ent);
	return t;
}

void
tree_free(struct tree *t)
{
	struct tree_node **stack = NULL, *n;
	size_t sp = 0, cap = 0;
	uint32_t i;

	if (t == NULL)
		return;
	for (i = 0; i < t->t_root.n_nkids; i++) {
		if (sp == cap) {
			cap = cap ? cap * 2 : 64;
			stack = xreallocarray(stack, cap, sizeof(*stack));
		}
		stack[sp++] = t->t_root.n_kids[i];
	}
	while (sp > 0) {
		n = stack[--sp];
		for (i = 0; i < n->n_nkids; i++) {
			if (sp == cap) {
				cap = cap * 2;
				stack =
				    xreallocarray(stack, cap, sizeof(*stack));
			}
			stack[sp++] = n->n_kids[i];
		}
		node_destroy(t, n);
	}
	free(stack);
	node_destroy(t, &t->t_root);
	for (i = 0; i < t->t_nchunks; i++)
		free(t->t_chunks[i]);
	free(t->t_chunks);
	free(t->t_path);
	free(t->t_buf);
	free(t);
}

int
tree_insert(struct tree *t, const char *s, size_t len, unsigned tenant)
{
	const unsigned char *b;
	size_t nb, chars;

	if (t->t_kind != TREE_STRING || tenant > TREE_MAX_TENANT ||
	    (s == NULL && len > 0) || len > KEY_LIMIT) {
		log_warnx("%s: invalid arguments", __func__);
		return -1;
	}
	if (len == 0)
		s = "";
	if ((b = text_prepare(t, s, len, &nb, &chars)) == NULL)
		return -1;
	return insert_bytes(t, b, nb, chars, tenant);
}

int
tree_insert_tokens(struct tree *t, const uint32_t *tok, size_t ntok,
    unsigned tenant)
{
	size_t n;

	if (t->t_kind != TREE_TOKEN || tenant > TREE_MAX_TENANT ||
	    (tok == NULL && ntok > 0) || ntok > KEY_LIMIT / sizeof(uint32_t)) {
		log_warnx("%s: invalid arguments", __func__);
		return -1;
	}
	n = ntok - ntok % t->t_bs;
	if (n == 0)
		return 0;
	return insert_bytes(t, (const unsigned char *)tok, n * sizeof(uint32_t),
	    n, tenant);
}

void
tree_match(struct tree *t, const char *s, size_t len, struct tree_match *m)
{
	const unsigned char *b;
	size_t nb, chars;

	memset(m, 0, sizeof(*m));
	if (t->t_kind != TREE_STRING || len == 0 || s == NULL ||
	    len > KEY_LIMIT)
		return;
	if ((b = text_prepare(t, s, len, &nb, &chars)) == NULL)
		return;
	m->tm_input = chars;
	match_bytes(t, b, nb, m);
}

void
tree_match_tokens(struct tree *t, const uint32_t *tok, size_t ntok,
    struct tree_match *m)
{
	size_t n;

	memset(m, 0, sizeof(*m));
	m->tm_input = ntok;
	if (t->t_kind != TREE_TOKEN || tok == NULL ||
	    ntok > KEY_LIMIT / sizeof(uint32_t))
		return;
	n = ntok - ntok % t->t_bs;
	if (n == 0)
		return;
	match_bytes(t, (const unsigned char *)tok, n * sizeof(uint32_t), m);
}

int
tree_match_holds(const struct tree_match *m, unsigned tenant)
{
	uint32_t pos;

	if (m->tm_node == NULL || tenant > TREE_MAX_TENANT)
		return 0;
	return slot_find(m->tm_node, tenant, &pos);
}

size_t
tree_match_depth(const struct tree_match *m, unsigned tenant)
{
	const struct tree_node *x;
	size_t depth;
	uint32_t pos;

	if (m->tm_node == NULL || tenant > TREE_MAX_TENANT)
		return 0;
	if (slot_find(m->tm_node, tenant, &pos))
		return m->tm_matched;
	depth = m->tm_above;
	/* The root (no parent) holds every tenant but no text. */
	for (x = m->tm_node->n_parent; x != NULL && x->n_parent != NULL;
	     x = x->n_parent) {
		if (slot_find(x, tenant, &pos))
			return depth;
		depth -= x->n_len;
	}
	return 0;
}

void
tree_remove_tenant(struct tree *t, unsigned tenant)
{
	struct tree_node **list = NULL, *n;
	size_t len = 0, cap = 0, i;
	uint32_t k, pos;

	if (tenant > TREE_MAX_TENANT || !slot_find(&t->t_root, tenant, &pos))
		return;
	/* Breadth first over the nodes holding tenant (a subtree closed
	 * towards the root), then detach deepest first. */
	cap = 64;
	list = xreallocarray(NULL, cap, sizeof(*list));
	list[len++] = &t->t_root;
	for (i = 0; i < len; i++) {
		n = list[i];
		for (k = 0; k < n->n_nkids; k++) {
			if (!slot_find(n->n_kids[k], tenant, &pos))
				continue;
			if (len == cap) {
				cap *= 2;
				list = xreallocarray(list, cap, sizeof(*list));
			}
			list[len++] = n->n_kids[k];
		}
	}
	while (len > 0) {
		n = list[--len];
		if (!slot_find(n, tenant, &pos))
			fatalx("%s: tenant vanished", __func__);
		detach(t, n, pos);
		if (n != &t->t_root && n->n_nslots == 0)
			node_delete(t, n);
	}
	free(list);
}

void
tree_set_max_size(struct tree *t, uint64_t max_size)
{
	if (max_size == 0) {
		log_warnx("%s: max_size must be > 0", __func__);
		return;
	}
	t->t_max = max_size;
	evict(t);
}

size_t
tree_evict(struct tree *t)
{
	return evict(t);
}

uint64_t
tree_size(const struct tree *t)
{
	return t->t_size;
}

size_t
tree_tenants(const struct tree *t)
{
	return t->t_root.n_nslots;
}

size_t
tree_nodes(const struct tree *t)
{
	return t->t_nodes;
}

size_t
tree_mem(const struct tree *t)
{
	return t->t_mem;
}

enum tree_kind
tree_kind(const struct tree *t)
{
	return t->t_kind;
}

/* 1 if no child of n holds tenant. */
static int
leaf_for(const struct tree_node *n, unsigned tenant)
{
	uint32_t i, pos;

	for (i = 0; i < n->n_nkids; i++)
		if (slot_find(n->n_kids[i], tenant, &pos))
			return 0;
	return 1;
}

int
tree_dump(struct tree *t, tree_dump_cb cb, void *arg)
{
	struct tree_node **up = NULL, *n;
	unsigned char *key = NULL;
	size_t upcap = 0, keycap = 0, depth, nb, off;
	struct tree_ent *e;
	uint32_t i;
	int rv = 0;

	if (t->t_kind == TREE_STRING)
		for (i = 0; i < t->t_root.n_nslots; i++)
			if (cb(arg, t->t_root.n_slots[i].s_tenant, "", 0) != 0)
				return -1;
	for (i = ent(t, 0)->e_next; i != 0; i = e->e_next) {
		e = ent(t, i);
		if (!leaf_for(e->e_node, e->e_tenant))
			continue;
		depth = nb = 0;
		for (n = e->e_node; n != &t->t_root; n = n->n_parent) {
			if (depth == upcap) {
				upcap = upcap ? upcap * 2 : 64;
				up = xreallocarray(up, upcap, sizeof(*up));
			}
			up[depth++] = n;
			nb += n->n_bytes;
		}
		if (nb > keycap) {
			keycap = nb * 2;
			free(key);
			key = xmalloc(keycap);
		}
		for (off = 0; depth > 0; off += n->n_bytes) {
			n = up[--depth];
			memcpy(key + off, n->n_edge, n->n_bytes);
		}
		if (cb(arg, e->e_tenant, key,
		        t->t_kind == TREE_TOKEN ? nb / sizeof(uint32_t) : nb) !=
		    0) {
			rv = -1;
			break;
		}
	}
	free(up);
	free(key);
	return rv;
}

int
tree_check(const struct tree *t)
{
	const struct tree_node **stack = NULL, *n, *p;
	uint32_t *rank = NULL, i, j, r, pos, nlist = 0;
	size_t sp = 0, cap = 64, nodes = 0, pairs = 0;
	uint64_t size = 0;
	const struct tree_ent *e;
	int rv = -1;

	rank = xcalloc(t->t_nents, sizeof(*rank));
	for (i = ent(t, 0)->e_next, r = 1; i != 0; i = e->e_next, r++) {
		if (i >= t->t_nents || rank[i] != 0 ||
		    (e = ent(t, i))->e_node == NULL) {
			log_warnx("%s: recency list broken at %u", __func__, i);
			goto out;
		}
		if (ent(t, e->e_next)->e_prev != i) {
			log_warnx("%s: bad back link at %u", __func__, i);
			goto out;
		}
		rank[i] = r;
		nlist++;
	}
	stack = xreallocarray(NULL, cap, sizeof(*stack));
	stack[sp++] = &t->t_root;
	while (sp > 0) {
		n = stack[--sp];
		p = n->n_parent;
		nodes++;
		if (n != &t->t_root) {
			if (n->n_bytes == 0 || n->n_nslots == 0 ||
			    n->n_len != units(t, n->n_edge, n->n_bytes) ||
			    n->n_key != key_of(t, n->n_edge) ||
			    (t->t_kind == TREE_TOKEN &&
			        n->n_bytes % t->t_unit != 0)) {
				log_warnx("%s: bad node", __func__);
				goto out;
			}
		}
		for (j = 0; j < n->n_nslots; j++) {
			if (j > 0 &&
			    n->n_slots[j - 1].s_tenant >=
			        n->n_slots[j].s_tenant) {
				log_warnx("%s: slots unsorted", __func__);
				goto out;
			}
			size += n->n_len;
			if (n == &t->t_root) {
				if (n->n_slots[j].s_ent != 0)
					goto bad_ent;
				continue;
			}
			pairs++;
			i = n->n_slots[j].s_ent;
			if (i == 0 || i >= t->t_nents || rank[i] == 0)
				goto bad_ent;
			e = ent(t, i);
			if (e->e_node != n ||
			    e->e_tenant != n->n_slots[j].s_tenant)
				goto bad_ent;
			if (!slot_find(p, e->e_tenant, &pos)) {
				log_warnx("%s: tenant %u not on parent",
				    __func__, e->e_tenant);
				goto out;
			}
			if (p != &t->t_root &&
			    rank[p->n_slots[pos].s_ent] <= rank[i]) {
				log_warnx(
				    "%s: tenant %u: node more recent than "
				    "its parent",
				    __func__, e->e_tenant);
				goto out;
			}
		}
		for (j = 0; j < n->n_nkids; j++) {
			if (n->n_kids[j]->n_parent != n ||
			    (j > 0 &&
			        n->n_kids[j - 1]->n_key >
			            n->n_kids[j]->n_key)) {
				log_warnx("%s: children broken", __func__);
				goto out;
			}
			if (sp == cap) {
				cap *= 2;
				stack =
				    xreallocarray(stack, cap, sizeof(*stack));
			}
			stack[sp++] = n->n_kids[j];
		}
	}
	if (size != t->t_size || nodes != t->t_nodes || pairs != nlist) {
		log_warnx("%s: size %llu/%llu nodes %zu/%zu pairs %zu/%u",
		    __func__, (unsigned long long)size,
		    (unsigned long long)t->t_size, nodes, t->t_nodes, pairs,
		    nlist);
		goto out;
	}
	rv = 0;
	goto out;
bad_ent:
	log_warnx("%s: slot and entry disagree", __func__);
out:
	free(stack);
	free(rank);
	return rv;
}
