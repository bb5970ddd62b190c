/*
 * persist.c: the broker's routing state in LMDB, written behind through
 * store.c — manual and sticky assignments, and the journal of cache_aware
 * tree inserts — and its restore at startup.
 *
 * Why a journal and not tree dumps: a dump of a tree at --max-tree-size
 * (64 Mi chars by default) is one huge write transaction that would stall
 * the loop, and anything inserted between two dumps would be lost. The
 * journal writes each insert once, in the batch of its STORE_BEHIND_MS
 * window. Its size is bounded: a key inserted again while its record is in
 * the newest quarter of the journal is not rewritten (hot prefixes cost
 * nothing), an older one is moved to the end (so replay order follows
 * recency), and the oldest records are deleted once the journal holds more
 * than twice the trees' budgets. Replaying it in order into trees with the
 * same caps keeps the most recent prefixes, as the live trees did.
 *
 * Keys are stored in pieces: every whole PERSIST_CHUNK bytes of a key is
 * a chunk named by a chain hash (XXH3 of the chunk seeded with the hash
 * of the chunk before it), written once and shared by every record whose
 * key starts the same way. A conversation that grows by one turn writes
 * its new chunk and a short record; a hot system prompt is stored once.
 * Chunks are reference-counted in memory and deleted with their last
 * record.
 *
 * Journal record: key = sequence number (8 bytes, big-endian); value =
 * u8 version (2), u8 tree kind, u16 scope, model and url lengths, u32
 * chunk count (all little-endian), the three strings, the chunks' chain
 * hashes (u64 LE each), then the key's tail (< PERSIST_CHUNK bytes). Key
 * bytes are UTF-8, or u32 token ids in host order. Chunk record: key =
 * chain hash (u64 LE), value = PERSIST_CHUNK bytes. Assignment record:
 * key = scope NUL key; value = JSON {"urls": [...], "last": <ms since the
 * epoch>}; a hash-mode placement (scope "hash/<instance>") adds "touch":
 * each holder's last touch, ms since the epoch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "shared/log.h"
#include "shared/xmalloc.h"

#include "broker.h"

#define PERSIST_VERSION  2
#define PERSIST_HDR      12
#define PERSIST_NAME_MAX 0xffff
#define PERSIST_CHUNK    4096 /* a multiple of 4: token keys split too */
#define PERSIST_SEED     0x736d67632d6a6eULL

/* A live journal record, by content hash. */
struct persist_rec {
	uint64_t pr_hash;
	uint64_t pr_seq;
	uint64_t pr_units;
	uint64_t *pr_chunks; /* chain hashes */
	uint32_t pr_nchunks;
	struct persist_rec *pr_next;
};

/* A stored chunk and the number of live records using it. */
struct persist_chunk {
	uint64_t pc_hash;
	uint32_t pc_refs;
	struct persist_chunk *pc_next;
};

/* Journal order: every record written, oldest first (dead ones too). */
struct persist_fifo {
	uint64_t pf_seq;
	uint64_t pf_hash;
};

struct persist {
	struct persist_rec **pe_map;
	size_t pe_nmap; /* buckets, power of two */
	size_t pe_nrec;
	struct persist_fifo *pe_fifo;
	size_t pe_head;
	size_t pe_len; /* entries from pe_head */
	size_t pe_cap;
	uint64_t pe_next_seq;
	uint64_t pe_bytes; /* live journal size in chars and tokens */
	uint64_t pe_budget; /* chars and tokens; 0 until a tree registers */
	uint64_t pe_records; /* written or replayed */
	struct persist_chunk **pe_chunks;
	size_t pe_nchunkb; /* buckets, power of two */
	size_t pe_nchunks;
	unsigned char *pe_buf; /* record being built or key being rebuilt */
	size_t pe_bufcap;
	/* broker-wide assignment owners (persist_assign_owner) */
	const char *pe_owner_scope[PERSIST_MAX_OWNERS];
	persist_assign_restore_cb pe_owner_cb[PERSIST_MAX_OWNERS];
	unsigned pe_nowners;
};

struct persist_restore_ctx;

static struct persist_rec **persist_find(struct persist *pe, uint64_t hash);
static void persist_map_grow(struct persist *pe);
static void persist_fifo_push(struct persist *pe, uint64_t seq, uint64_t h);
static void persist_forget(struct broker *br, struct persist_rec **pp);
static void persist_trim(struct broker *br);
static void persist_remember(struct broker *br, uint64_t seq, uint64_t hash,
    uint64_t units, const uint64_t *chunks, uint32_t nchunks);
static struct persist_chunk **persist_chunk_find(struct persist *pe,
    uint64_t hash);
static bool persist_chunk_ref(struct persist *pe, uint64_t hash);
static void persist_chunk_unref(struct broker *br, uint64_t hash);
static unsigned char *persist_buf(struct persist *pe, size_t len);
static void persist_le(uint64_t v, unsigned char *out, int n);
static uint64_t persist_get_le(const unsigned char *p, int n);
static int persist_orphan_cb(void *arg, const void *key, size_t klen,
    const void *val, size_t vlen);
static uint64_t persist_units(int kind, size_t keylen);
static void persist_be64(uint64_t v, unsigned char out[8]);
static uint64_t persist_get_be64(const unsigned char *p);
static struct policy *persist_policy(struct broker *br, const char *scope);
static void persist_find_cb(void *arg, struct policy *p);
static int persist_journal_cb(void *arg, const void *key, size_t klen,
    const void *val, size_t vlen);
static int persist_assign_cb(void *arg, const void *key, size_t klen,
    const void *val, size_t vlen);

void
persist_init(struct broker *br)
{
	struct persist *pe = xcalloc(1, sizeof(*pe));

	pe->pe_nmap = 1024;
	pe->pe_map = xcalloc(pe->pe_nmap, sizeof(*pe->pe_map));
	pe->pe_next_seq = 1;
	pe->pe_nchunkb = 1024;
	pe->pe_chunks = xcalloc(pe->pe_nchunkb, sizeof(*pe->pe_chunks));
	br->br_persist = pe;
}

void
persist_free(struct broker *br)
{
	struct persist *pe = br->br_persist;
	struct persist_rec *r, *next;
	struct persist_chunk *c, *cnext;
	size_t i;

	if (pe == NULL)
		return;
	for (i = 0; i < pe->pe_nmap; i++) {
		for (r = pe->pe_map[i]; r != NULL; r = next) {
			next = r->pr_next;
			free(r->pr_chunks);
			free(r);
		}
	}
	for (i = 0; i < pe->pe_nchunkb; i++) {
		for (c = pe->pe_chunks[i]; c != NULL; c = cnext) {
			cnext = c->pc_next;
			free(c);
		}
	}
	free(pe->pe_chunks);
	free(pe->pe_buf);
	free(pe->pe_map);
	free(pe->pe_fifo);
	free(pe);
	br->br_persist = NULL;
}

void
persist_assign_owner(struct broker *br, const char *scope,
    persist_assign_restore_cb cb)
{
	struct persist *pe = br->br_persist;

	if (pe->pe_nowners == PERSIST_MAX_OWNERS)
		fatalx("%s: too many assignment owners", __func__);
	pe->pe_owner_scope[pe->pe_nowners] = scope;
	pe->pe_owner_cb[pe->pe_nowners++] = cb;
}

uint64_t
persist_journal_records(const struct broker *br)
{
	return br->br_persist != NULL ? br->br_persist->pe_records : 0;
}

void
persist_tree_budget(struct broker *br, uint64_t units)
{
	if (br != NULL && br->br_persist != NULL)
		br->br_persist->pe_budget += units;
}

/* Journal size of a key: chars (as bytes) or tokens. */
static uint64_t
persist_units(int kind, size_t keylen)
{
	return kind == 1 ? keylen / 4 : keylen;
}

static void
persist_be64(uint64_t v, unsigned char out[8])
{
	int i;

	for (i = 7; i >= 0; i--) {
		out[i] = (unsigned char)(v & 0xff);
		v >>= 8;
	}
}

static uint64_t
persist_get_be64(const unsigned char *p)
{
	uint64_t v = 0;
	int i;

	for (i = 0; i < 8; i++)
		v = (v << 8) | p[i];
	return v;
}

static void
persist_le(uint64_t v, unsigned char *out, int n)
{
	int i;

	for (i = 0; i < n; i++, v >>= 8)
		out[i] = (unsigned char)(v & 0xff);
}

static uint64_t
persist_get_le(const unsigned char *p, int n)
{
	uint64_t v = 0;
	int i;

	for (i = n - 1; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static unsigned char *
persist_buf(struct persist *pe, size_t len)
{
	unsigned char *b;

	if (len > pe->pe_bufcap) {
		if ((b = realloc(pe->pe_buf, len)) == NULL)
			return NULL;
		pe->pe_buf = b;
		pe->pe_bufcap = len;
	}
	return pe->pe_buf;
}

/* ------------------------------------------------------------ scopes */

const char *
persist_scope(struct broker *br, const struct policy *p, char *buf, size_t len)
{
	static const char *const legs[4] = { "single", "prefill", "decode",
		"encode" };
	unsigned i;

	if (p == br->br_default) {
		snprintf(buf, len, "default");
		return buf;
	}
	for (i = 1; i < 4; i++) {
		if (p == br->br_legs[i]) {
			snprintf(buf, len, "%s", legs[i]);
			return buf;
		}
	}
	for (i = 0; i < br->br_nmodels; i++) {
		if (br->br_models[i]->me_policy == p) {
			snprintf(buf, len, "model:%s",
			    br->br_models[i]->me_name);
			return buf;
		}
	}
	snprintf(buf, len, "detached");
	return buf;
}

struct persist_find_ctx {
	struct broker *fc_br;
	const char *fc_scope;
	struct policy *fc_found;
};

static void
persist_find_cb(void *arg, struct policy *p)
{
	struct persist_find_ctx *fc = arg;
	char buf[SHM_MODEL_MAX + 16];

	if (fc->fc_found == NULL &&
	    strcmp(persist_scope(fc->fc_br, p, buf, sizeof(buf)),
	        fc->fc_scope) == 0)
		fc->fc_found = p;
}

static struct policy *
persist_policy(struct broker *br, const char *scope)
{
	struct persist_find_ctx fc = { br, scope, NULL };

	policy_each(br, persist_find_cb, &fc);
	return fc.fc_found;
}

/* ------------------------------------------------------------ chunks */

static struct persist_chunk **
persist_chunk_find(struct persist *pe, uint64_t hash)
{
	struct persist_chunk **pp;

	for (pp = &pe->pe_chunks[hash & (pe->pe_nchunkb - 1)]; *pp != NULL;
	     pp = &(*pp)->pc_next) {
		if ((*pp)->pc_hash == hash)
			return pp;
	}
	return pp;
}

/* Takes a reference; true when the chunk is new (to be written). */
static bool
persist_chunk_ref(struct persist *pe, uint64_t hash)
{
	struct persist_chunk **pp = persist_chunk_find(pe, hash), *c, *next;
	struct persist_chunk **nb;
	size_t i, n;

	if (*pp != NULL) {
		(*pp)->pc_refs++;
		return false;
	}
	if (pe->pe_nchunks >= pe->pe_nchunkb) {
		n = pe->pe_nchunkb * 2;
		nb = xcalloc(n, sizeof(*nb));
		for (i = 0; i < pe->pe_nchunkb; i++) {
			for (c = pe->pe_chunks[i]; c != NULL; c = next) {
				next = c->pc_next;
				c->pc_next = nb[c->pc_hash & (n - 1)];
				nb[c->pc_hash & (n - 1)] = c;
			}
		}
		free(pe->pe_chunks);
		pe->pe_chunks = nb;
		pe->pe_nchunkb = n;
		pp = persist_chunk_find(pe, hash);
	}
	c = xcalloc(1, sizeof(*c));
	c->pc_hash = hash;
	c->pc_refs = 1;
	*pp = c;
	pe->pe_nchunks++;
	return true;
}

static void
persist_chunk_unref(struct broker *br, uint64_t hash)
{
	struct persist *pe = br->br_persist;
	struct persist_chunk **pp = persist_chunk_find(pe, hash), *c;
	unsigned char k[8];

	if ((c = *pp) == NULL || --c->pc_refs > 0)
		return;
	persist_le(hash, k, 8);
	store_del_db(br->br_store, STORE_DB_CHUNKS, k, sizeof(k));
	*pp = c->pc_next;
	free(c);
	pe->pe_nchunks--;
}

/* ------------------------------------------------------------ journal */

static struct persist_rec **
persist_find(struct persist *pe, uint64_t hash)
{
	struct persist_rec **pp;

	for (pp = &pe->pe_map[hash & (pe->pe_nmap - 1)]; *pp != NULL;
	     pp = &(*pp)->pr_next) {
		if ((*pp)->pr_hash == hash)
			return pp;
	}
	return pp;
}

static void
persist_map_grow(struct persist *pe)
{
	struct persist_rec **nm, *r, *next;
	size_t i, n = pe->pe_nmap * 2;

	nm = xcalloc(n, sizeof(*nm));
	for (i = 0; i < pe->pe_nmap; i++) {
		for (r = pe->pe_map[i]; r != NULL; r = next) {
			next = r->pr_next;
			r->pr_next = nm[r->pr_hash & (n - 1)];
			nm[r->pr_hash & (n - 1)] = r;
		}
	}
	free(pe->pe_map);
	pe->pe_map = nm;
	pe->pe_nmap = n;
}

static void
persist_fifo_push(struct persist *pe, uint64_t seq, uint64_t h)
{
	size_t i, k;

	if (pe->pe_head + pe->pe_len == pe->pe_cap) {
		if (pe->pe_len > 2 * pe->pe_nrec + 64) {
			/* Mostly dead records: keep only the live ones. */
			for (i = pe->pe_head, k = 0;
			     i < pe->pe_head + pe->pe_len; i++) {
				struct persist_rec **pp =
				    persist_find(pe, pe->pe_fifo[i].pf_hash);

				if (*pp != NULL &&
				    (*pp)->pr_seq == pe->pe_fifo[i].pf_seq)
					pe->pe_fifo[k++] = pe->pe_fifo[i];
			}
			pe->pe_head = 0;
			pe->pe_len = k;
		} else if (pe->pe_head > 0) {
			memmove(pe->pe_fifo, pe->pe_fifo + pe->pe_head,
			    pe->pe_len * sizeof(*pe->pe_fifo));
			pe->pe_head = 0;
		}
		if (pe->pe_head + pe->pe_len == pe->pe_cap) {
			pe->pe_cap = pe->pe_cap ? pe->pe_cap * 2 : 1024;
			pe->pe_fifo = xreallocarray(pe->pe_fifo, pe->pe_cap,
			    sizeof(*pe->pe_fifo));
		}
	}
	pe->pe_fifo[pe->pe_head + pe->pe_len].pf_seq = seq;
	pe->pe_fifo[pe->pe_head + pe->pe_len].pf_hash = h;
	pe->pe_len++;
}

/* Deletes the live record *pp from the map and the database. */
static void
persist_forget(struct broker *br, struct persist_rec **pp)
{
	struct persist *pe = br->br_persist;
	struct persist_rec *r = *pp;
	unsigned char k[8];
	uint32_t i;

	persist_be64(r->pr_seq, k);
	store_del_db(br->br_store, STORE_DB_JOURNAL, k, sizeof(k));
	for (i = 0; i < r->pr_nchunks; i++)
		persist_chunk_unref(br, r->pr_chunks[i]);
	pe->pe_bytes -= r->pr_units < pe->pe_bytes ? r->pr_units : pe->pe_bytes;
	*pp = r->pr_next;
	free(r->pr_chunks);
	free(r);
	pe->pe_nrec--;
}

static void
persist_trim(struct broker *br)
{
	struct persist *pe = br->br_persist;
	struct persist_rec **pp;
	struct persist_fifo f;

	while (pe->pe_budget > 0 && pe->pe_bytes > 2 * pe->pe_budget &&
	    pe->pe_len > 0) {
		f = pe->pe_fifo[pe->pe_head++];
		pe->pe_len--;
		pp = persist_find(pe, f.pf_hash);
		if (*pp != NULL && (*pp)->pr_seq == f.pf_seq)
			persist_forget(br, pp);
	}
	if (pe->pe_len == 0)
		pe->pe_head = 0;
}

/* A live record (chunks already referenced); replaces an older copy. */
static void
persist_remember(struct broker *br, uint64_t seq, uint64_t hash, uint64_t units,
    const uint64_t *chunks, uint32_t nchunks)
{
	struct persist *pe = br->br_persist;
	struct persist_rec **pp, *r;

	pp = persist_find(pe, hash);
	if (*pp != NULL)
		persist_forget(br, pp);
	if (pe->pe_nrec >= pe->pe_nmap)
		persist_map_grow(pe);
	r = xcalloc(1, sizeof(*r));
	r->pr_hash = hash;
	r->pr_seq = seq;
	r->pr_units = units;
	if (nchunks > 0) {
		r->pr_chunks = xcalloc(nchunks, sizeof(*r->pr_chunks));
		memcpy(r->pr_chunks, chunks, nchunks * sizeof(*chunks));
	}
	r->pr_nchunks = nchunks;
	r->pr_next = pe->pe_map[hash & (pe->pe_nmap - 1)];
	pe->pe_map[hash & (pe->pe_nmap - 1)] = r;
	pe->pe_nrec++;
	pe->pe_bytes += units;
	persist_fifo_push(pe, seq, hash);
	if (seq >= pe->pe_next_seq)
		pe->pe_next_seq = seq + 1;
}

void
persist_tree_insert(struct broker *br, const struct policy *p,
    const char *model, int kind, const char *url, const void *key,
    size_t keylen)
{
	struct persist *pe = br->br_persist;
	const unsigned char *kb = key;
	char scope[SHM_MODEL_MAX + 16];
	size_t ls, lm, lu, len, off, tail;
	unsigned char *v, k[8];
	struct persist_rec **pp;
	uint64_t h, seq, span, chain, *chunks;
	uint32_t nch, i;

	if (pe == NULL || br->br_store == NULL || br->br_restoring)
		return;
	persist_scope(br, p, scope, sizeof(scope));
	ls = strlen(scope);
	lm = strlen(model);
	lu = strlen(url);
	if (ls > PERSIST_NAME_MAX || lm > PERSIST_NAME_MAX ||
	    lu > PERSIST_NAME_MAX || keylen / PERSIST_CHUNK > UINT32_MAX / 8)
		return;
	nch = (uint32_t)(keylen / PERSIST_CHUNK);
	tail = keylen - (size_t)nch * PERSIST_CHUNK;
	len = PERSIST_HDR + ls + lm + lu + (size_t)nch * 8 + tail;
	if ((v = persist_buf(pe, len)) == NULL) {
		log_warnx("%s: out of memory, insert not journaled", __func__);
		return;
	}
	v[0] = PERSIST_VERSION;
	v[1] = (unsigned char)kind;
	persist_le(ls, v + 2, 2);
	persist_le(lm, v + 4, 2);
	persist_le(lu, v + 6, 2);
	persist_le(nch, v + 8, 4);
	memcpy(v + PERSIST_HDR, scope, ls);
	memcpy(v + PERSIST_HDR + ls, model, lm);
	memcpy(v + PERSIST_HDR + ls + lm, url, lu);
	off = PERSIST_HDR + ls + lm + lu;
	/* Identity of the insert: the names and the whole key. */
	h = XXH3_64bits_withSeed(key, keylen, XXH3_64bits(v, off));
	pp = persist_find(pe, h);
	if (*pp != NULL) {
		/* Recent enough: replay order barely changes. */
		span = pe->pe_next_seq -
		    (pe->pe_len > 0 ? pe->pe_fifo[pe->pe_head].pf_seq
		                    : pe->pe_next_seq);
		if ((*pp)->pr_seq + span / 4 >= pe->pe_next_seq)
			return;
	}
	chunks = xcalloc(nch > 0 ? nch : 1, sizeof(*chunks));
	chain = PERSIST_SEED + (uint64_t)kind;
	for (i = 0; i < nch; i++) {
		chain = XXH3_64bits_withSeed(kb + (size_t)i * PERSIST_CHUNK,
		    PERSIST_CHUNK, chain);
		chunks[i] = chain;
		persist_le(chain, v + off + (size_t)i * 8, 8);
		if (persist_chunk_ref(pe, chain)) {
			persist_le(chain, k, 8);
			store_put_db(br->br_store, STORE_DB_CHUNKS, k,
			    sizeof(k), kb + (size_t)i * PERSIST_CHUNK,
			    PERSIST_CHUNK);
		}
	}
	if (tail > 0)
		memcpy(v + off + (size_t)nch * 8,
		    kb + (size_t)nch * PERSIST_CHUNK, tail);
	seq = pe->pe_next_seq++;
	persist_be64(seq, k);
	store_put_db(br->br_store, STORE_DB_JOURNAL, k, sizeof(k), v, len);
	/* After the put: a replaced copy may drop the last chunk refs. */
	persist_remember(br, seq, h, persist_units(kind, keylen), chunks, nch);
	free(chunks);
	pe->pe_records++;
	persist_trim(br);
}

struct persist_restore_ctx {
	struct broker *rc_br;
	struct store_reader *rc_rd;
	uint64_t rc_replayed;
	uint64_t rc_skipped;
	uint64_t rc_assign;
	uint64_t rc_orphans;
};

static int
persist_journal_cb(void *arg, const void *key, size_t klen, const void *val,
    size_t vlen)
{
	struct persist_restore_ctx *rc = arg;
	struct broker *br = rc->rc_br;
	struct persist *pe = br->br_persist;
	const unsigned char *v = val;
	const void *cv;
	char scope[SHM_MODEL_MAX + 16], model[SHM_MODEL_MAX], url[SHM_URL_MAX];
	unsigned char ck[8], *kb;
	size_t ls, lm, lu, off, tail, keylen, cl;
	uint64_t *chunks = NULL, h;
	uint32_t nch = 0, i, got = 0;
	struct policy *p;
	struct worker *w;

	if (klen != 8 || vlen < PERSIST_HDR || v[0] != PERSIST_VERSION)
		goto drop;
	ls = persist_get_le(v + 2, 2);
	lm = persist_get_le(v + 4, 2);
	lu = persist_get_le(v + 6, 2);
	nch = (uint32_t)persist_get_le(v + 8, 4);
	off = PERSIST_HDR + ls + lm + lu;
	if (off > vlen || (vlen - off) / 8 < nch || ls >= sizeof(scope) ||
	    lm >= sizeof(model) || lu >= sizeof(url) || v[1] > 1)
		goto drop;
	tail = vlen - off - (size_t)nch * 8;
	keylen = (size_t)nch * PERSIST_CHUNK + tail;
	if (v[1] == 1 && keylen % 4 != 0)
		goto drop;
	memcpy(scope, v + PERSIST_HDR, ls);
	scope[ls] = '\0';
	memcpy(model, v + PERSIST_HDR + ls, lm);
	model[lm] = '\0';
	memcpy(url, v + PERSIST_HDR + ls + lm, lu);
	url[lu] = '\0';
	if ((kb = persist_buf(pe, keylen ? keylen : 1)) == NULL)
		return 0;
	chunks = xcalloc(nch > 0 ? nch : 1, sizeof(*chunks));
	for (i = 0; i < nch; i++) {
		chunks[i] = persist_get_le(v + off + (size_t)i * 8, 8);
		persist_le(chunks[i], ck, 8);
		if (store_reader_get(rc->rc_rd, STORE_DB_CHUNKS, ck, sizeof(ck),
		        &cv, &cl) == -1 ||
		    cl != PERSIST_CHUNK)
			goto drop;
		memcpy(kb + (size_t)i * PERSIST_CHUNK, cv, PERSIST_CHUNK);
		(void)persist_chunk_ref(pe, chunks[i]);
		got++;
	}
	if (tail > 0)
		memcpy(kb + (size_t)nch * PERSIST_CHUNK,
		    v + off + (size_t)nch * 8, tail);
	h = XXH3_64bits_withSeed(kb, keylen, XXH3_64bits(v, off));
	persist_remember(br, persist_get_be64(key), h,
	    persist_units(v[1], keylen), chunks, nch);
	free(chunks);
	p = persist_policy(br, scope);
	w = registry_find(br, url);
	if (p == NULL || w == NULL || p->pl_ops->po_replay == NULL) {
		rc->rc_skipped++;
		return 0;
	}
	p->pl_ops->po_replay(p, model, v[1], w, kb,
	    v[1] == 1 ? keylen / 4 : keylen);
	rc->rc_replayed++;
	return 0;
drop:
	/* Unreadable, foreign or incomplete: forgotten. */
	for (i = 0; i < got; i++)
		persist_chunk_unref(br, chunks[i]);
	free(chunks);
	store_del_db(br->br_store, STORE_DB_JOURNAL, key, klen);
	rc->rc_skipped++;
	return 0;
}

/* Chunks no record uses (left by a crash between batches) are deleted. */
static int
persist_orphan_cb(void *arg, const void *key, size_t klen, const void *val,
    size_t vlen)
{
	struct persist_restore_ctx *rc = arg;
	struct persist *pe = rc->rc_br->br_persist;

	(void)val;
	(void)vlen;
	if (klen != 8 ||
	    *persist_chunk_find(pe, persist_get_le(key, 8)) == NULL) {
		store_del_db(rc->rc_br->br_store, STORE_DB_CHUNKS, key, klen);
		rc->rc_orphans++;
	}
	return 0;
}

/* ------------------------------------------------------------ assignments */

void
persist_assign_put(struct broker *br, const char *scope, const char *key,
    const struct sticky_pin *pin)
{
	char k[STORE_KEY_MAX + 1], *js;
	size_t ls = strlen(scope), lk = strlen(key);
	cJSON *o, *a;
	unsigned i;

	if (br->br_store == NULL || br->br_restoring ||
	    ls + 1 + lk > STORE_KEY_MAX)
		return;
	memcpy(k, scope, ls);
	k[ls] = '\0';
	memcpy(k + ls + 1, key, lk);
	if ((o = cJSON_CreateObject()) == NULL)
		return;
	a = cJSON_AddArrayToObject(o, "urls");
	for (i = 0; a != NULL && i < pin->sp_n; i++)
		cJSON_AddItemToArray(a, cJSON_CreateString(pin->sp_urls[i]));
	cJSON_AddNumberToObject(o, "last", (double)pin->sp_last_ms);
	if ((js = cJSON_PrintUnformatted(o)) != NULL) {
		store_put_db(br->br_store, STORE_DB_ASSIGN, k, ls + 1 + lk, js,
		    strlen(js));
		free(js);
	}
	cJSON_Delete(o);
}

void
persist_place_put(struct broker *br, const char *scope, const char *key,
    const char *const *urls, const uint64_t *touch_ms, unsigned n)
{
	char k[STORE_KEY_MAX + 1], *js;
	size_t ls = strlen(scope), lk = strlen(key);
	uint64_t last = 0;
	cJSON *o, *a, *t;
	unsigned i;

	if (br->br_store == NULL || br->br_restoring ||
	    ls + 1 + lk > STORE_KEY_MAX)
		return;
	if (n == 0) {
		persist_assign_del(br, scope, key);
		return;
	}
	memcpy(k, scope, ls);
	k[ls] = '\0';
	memcpy(k + ls + 1, key, lk);
	if ((o = cJSON_CreateObject()) == NULL)
		return;
	a = cJSON_AddArrayToObject(o, "urls");
	t = cJSON_AddArrayToObject(o, "touch");
	for (i = 0; a != NULL && t != NULL && i < n; i++) {
		cJSON_AddItemToArray(a, cJSON_CreateString(urls[i]));
		cJSON_AddItemToArray(t,
		    cJSON_CreateNumber((double)touch_ms[i]));
		if (touch_ms[i] > last)
			last = touch_ms[i];
	}
	cJSON_AddNumberToObject(o, "last", (double)last);
	if ((js = cJSON_PrintUnformatted(o)) != NULL) {
		store_put_db(br->br_store, STORE_DB_ASSIGN, k, ls + 1 + lk, js,
		    strlen(js));
		free(js);
	}
	cJSON_Delete(o);
}

/* A placement record back into its cache_aware instance. */
static void
persist_place_restore(struct policy *p, const char *name, const cJSON *j)
{
	const cJSON *urls = cJSON_GetObjectItemCaseSensitive(j, "urls");
	const cJSON *touch = cJSON_GetObjectItemCaseSensitive(j, "touch");
	const cJSON *u, *t;
	const char **v;
	uint64_t *tm;
	unsigned n = 0;

	if (!cJSON_IsArray(urls) || !cJSON_IsArray(touch) ||
	    cJSON_GetArraySize(urls) != cJSON_GetArraySize(touch) ||
	    cJSON_GetArraySize(urls) == 0)
		return;
	v = xcalloc((size_t)cJSON_GetArraySize(urls), sizeof(*v));
	tm = xcalloc((size_t)cJSON_GetArraySize(urls), sizeof(*tm));
	for (u = urls->child, t = touch->child; u != NULL && t != NULL;
	     u = u->next, t = t->next) {
		if (!cJSON_IsString(u) || !cJSON_IsNumber(t) ||
		    t->valuedouble < 0)
			continue;
		v[n] = u->valuestring;
		tm[n++] = (uint64_t)t->valuedouble;
	}
	if (n > 0)
		p->pl_ops->po_restore_place(p, name, v, tm, n);
	free(v);
	free(tm);
}

void
persist_assign_del(struct broker *br, const char *scope, const char *key)
{
	char k[STORE_KEY_MAX + 1];
	size_t ls = strlen(scope), lk = strlen(key);

	if (br->br_store == NULL || ls + 1 + lk > STORE_KEY_MAX)
		return;
	memcpy(k, scope, ls);
	k[ls] = '\0';
	memcpy(k + ls + 1, key, lk);
	store_del_db(br->br_store, STORE_DB_ASSIGN, k, ls + 1 + lk);
}

static int
persist_assign_cb(void *arg, const void *key, size_t klen, const void *val,
    size_t vlen)
{
	struct persist_restore_ctx *rc = arg;
	struct broker *br = rc->rc_br;
	const char *k = key, *nul;
	char scope[SHM_MODEL_MAX + 32], name[STICKY_KEY_MAX + 1];
	struct persist *pe = br->br_persist;
	persist_assign_restore_cb owner = NULL;
	struct policy *p = NULL;
	const cJSON *urls, *u, *last;
	const char **v;
	unsigned i, n;
	cJSON *j;
	size_t ls;

	if ((nul = memchr(k, '\0', klen)) == NULL)
		return 0;
	ls = (size_t)(nul - k);
	if (ls >= sizeof(scope) || klen - ls - 1 >= sizeof(name) ||
	    klen - ls - 1 == 0)
		return 0;
	memcpy(scope, k, ls);
	scope[ls] = '\0';
	memcpy(name, nul + 1, klen - ls - 1);
	name[klen - ls - 1] = '\0';
	for (i = 0; i < pe->pe_nowners && owner == NULL; i++)
		if (strcmp(scope, pe->pe_owner_scope[i]) == 0)
			owner = pe->pe_owner_cb[i];
	if (owner == NULL && strncmp(scope, "hash/", 5) == 0) {
		if ((p = persist_policy(br, scope + 5)) == NULL ||
		    p->pl_ops->po_restore_place == NULL ||
		    (j = cJSON_ParseWithLength(val, vlen)) == NULL)
			return 0;
		persist_place_restore(p, name, j);
		cJSON_Delete(j);
		rc->rc_assign++;
		return 0;
	}
	if (owner == NULL &&
	    (strncmp(scope, "manual/", 7) != 0 ||
	        (p = persist_policy(br, scope + 7)) == NULL ||
	        p->pl_ops->po_restore_assign == NULL))
		return 0;
	if ((j = cJSON_ParseWithLength(val, vlen)) == NULL)
		return 0;
	urls = cJSON_GetObjectItemCaseSensitive(j, "urls");
	last = cJSON_GetObjectItemCaseSensitive(j, "last");
	if (cJSON_IsArray(urls) && cJSON_GetArraySize(urls) > 0) {
		v = xcalloc((size_t)cJSON_GetArraySize(urls), sizeof(*v));
		n = 0;
		cJSON_ArrayForEach(u, urls)
		{
			if (cJSON_IsString(u) && u->valuestring != NULL)
				v[n++] = u->valuestring;
		}
		if (owner != NULL)
			owner(br, name, v, n,
			    cJSON_IsNumber(last) ? (uint64_t)last->valuedouble
			                         : 0);
		else
			p->pl_ops->po_restore_assign(p, name, v, n,
			    cJSON_IsNumber(last) ? (uint64_t)last->valuedouble
			                         : 0);
		free(v);
		rc->rc_assign++;
	}
	cJSON_Delete(j);
	return 0;
}

int
persist_restore(struct broker *br)
{
	struct persist_restore_ctx rc;
	uint64_t t0 = shm_now_ms();
	int rv = 0;

	if (br->br_store == NULL || br->br_persist == NULL)
		return 0;
	memset(&rc, 0, sizeof(rc));
	rc.rc_br = br;
	br->br_restoring = true;
	if (store_each_db(br->br_store, STORE_DB_ASSIGN, persist_assign_cb,
	        &rc) == -1)
		rv = -1;
	if ((rc.rc_rd = store_reader_begin(br->br_store)) == NULL)
		rv = -1;
	else {
		if (store_reader_each(rc.rc_rd, STORE_DB_JOURNAL,
		        persist_journal_cb, &rc) == -1 ||
		    store_reader_each(rc.rc_rd, STORE_DB_CHUNKS,
		        persist_orphan_cb, &rc) == -1)
			rv = -1;
		store_reader_end(rc.rc_rd);
	}
	br->br_restoring = false;
	br->br_persist->pe_records += rc.rc_replayed;
	/* The budget is known now: drop what no longer fits. */
	persist_trim(br);
	log_info("%s: %llu assignments, %llu tree inserts replayed "
	         "(%llu skipped, %llu journal chars+tokens, %zu chunks, "
	         "%llu orphans) in %llu ms",
	    __func__, (unsigned long long)rc.rc_assign,
	    (unsigned long long)rc.rc_replayed,
	    (unsigned long long)rc.rc_skipped,
	    (unsigned long long)br->br_persist->pe_bytes,
	    br->br_persist->pe_nchunks, (unsigned long long)rc.rc_orphans,
	    (unsigned long long)(shm_now_ms() - t0));
	return rv;
}
