/*
 * tree.h: the multi-tenant radix trees of the cache_aware policy
 * (spec/policies.md §11.3 tree mode, §11.8 eviction).
 *
 * A tree maps prefixes to the tenants (workers, as small integers chosen by
 * the caller) that were sent them. Two kinds:
 * - TREE_STRING: keys are UTF-8 text, compared and counted by Unicode scalar
 *   values ("chars"). Invalid UTF-8 is read as if every invalid byte were
 *   U+FFFD. Edges keep the UTF-8 bytes, one byte per ASCII char.
 * - TREE_TOKEN: keys are uint32 token ids, handled in pages of block_size
 *   tokens: only the floor(len / bs) * bs leading tokens are inserted or
 *   matched, a sequence shorter than one page is not inserted, matches end on
 *   a page boundary.
 *
 * Size (§11.8) = sum over nodes of edge length (chars or tokens) times the
 * number of tenants on the node. max_size is a hard cap: every insert evicts
 * least-recently-used (tenant, leaf) pairs until size <= max_size again, so
 * the cap holds after every call, whatever the input.
 *
 * Recency is one global order of (tenant, node) pairs: an insert refreshes
 * every pair on its path, a match refreshes the path of the holders it
 * reports. Eviction removes the least recent pair whose node has no child
 * holding that tenant, deletes nodes left with no tenant, and never touches
 * the root (so a tenant stays registered until tree_remove_tenant).
 *
 * A tree is not thread-safe; the broker calls it from its one loop. Cost of
 * insert and match: one pass over the key plus O(depth * log fanout); an
 * insert also pays O(evicted pairs).
 */
#ifndef BROKER_TREE_H
#define BROKER_TREE_H

#include <stddef.h>
#include <stdint.h>

struct tree;
struct tree_node;

enum tree_kind {
	TREE_STRING = 0,
	TREE_TOKEN,
};

/* Tenant ids are 0 .. TREE_MAX_TENANT. */
#define TREE_MAX_TENANT 65534
/* Holders reported by a match (§11.3: at most 8). */
#define TREE_MAX_HOLDERS 8

struct tree_match {
	/* Chars (string) or tokens (token, a multiple of the block size). */
	size_t tm_matched;
	/* Length of the whole input in chars or tokens (unaligned). */
	size_t tm_input;
	/* Up to TREE_MAX_HOLDERS tenants of the node where the match ended,
	 * in no particular order (successive matches rotate through a node's
	 * tenants); none when tm_matched is 0. */
	unsigned tm_nholders;
	uint16_t tm_holders[TREE_MAX_HOLDERS];
	/* Number of tenants on that node (may exceed tm_nholders). */
	unsigned tm_total;
	/* Chars or tokens matched above that node (its parent's depth). */
	size_t tm_above;
	/* The node itself, for tree_match_holds; valid only until the next
	 * insert, eviction or removal on the tree. NULL when tm_matched is 0.
	 */
	const struct tree_node *tm_node;
};

/*
 * Creates an empty tree. max_size > 0 (chars or tokens); block_size > 0 is
 * the page size of a TREE_TOKEN tree and ignored for TREE_STRING. Aborts
 * (fatal) on allocation failure: call it at startup or registration.
 * The caller frees it with tree_free.
 */
struct tree *tree_new(enum tree_kind kind, uint64_t max_size,
    uint32_t block_size);
/* Frees the tree and everything in it; NULL is a no-op. */
void tree_free(struct tree *tree);

/*
 * Inserts text s (len bytes, UTF-8) for tenant into a TREE_STRING tree,
 * attaching the tenant to every node on the path and making the path the
 * most recently used. The empty string registers the tenant at the root.
 * Then evicts down to max_size. Returns 0, or -1 if memory ran out or the
 * arguments are invalid (the tree stays consistent; the prefix may be
 * partially inserted).
 */
int tree_insert(struct tree *tree, const char *s, size_t len, unsigned tenant);
/* Same for a TREE_TOKEN tree: the ntok token ids, truncated to whole pages.
 * Fewer than block_size tokens: nothing is inserted, returns 0. */
int tree_insert_tokens(struct tree *tree, const uint32_t *tok, size_t ntok,
    unsigned tenant);

/*
 * Longest-prefix match of s (TREE_STRING) into *m, as §11.3 says: the match
 * ends at the deepest node fully matched or at the child where the
 * comparison diverged, counting the chars matched in it. Refreshes the
 * recency of the reported holders along the matched path. Never fails.
 */
void tree_match(struct tree *tree, const char *s, size_t len,
    struct tree_match *m);
/* Same for a TREE_TOKEN tree. */
void tree_match_tokens(struct tree *tree, const uint32_t *tok, size_t ntok,
    struct tree_match *m);
/* 1 if tenant is on the node where match m ended, else 0. m must be fresh
 * (no insert, eviction or removal on the tree since the match). */
int tree_match_holds(const struct tree_match *m, unsigned tenant);

/*
 * How much of the matched input tenant holds: tm_matched when it is on the
 * node where match m ended, else the depth of the deepest node of the
 * matched path that holds it (tenant sets are closed towards the root), 0
 * when none does. Same freshness rule as tree_match_holds. Costs one
 * step per node of the path, O(log tenants) each.
 */
size_t tree_match_depth(const struct tree_match *m, unsigned tenant);

/* Detaches tenant from every node, root included, deleting nodes left
 * without tenant (worker removed). */
void tree_remove_tenant(struct tree *tree, unsigned tenant);

/* Changes the cap (> 0) and evicts down to it. */
void tree_set_max_size(struct tree *tree, uint64_t max_size);
/* Evicts least recently used pairs until size <= max_size (the periodic
 * sweep of §11.8; inserts already keep the cap). Returns pairs evicted. */
size_t tree_evict(struct tree *tree);

/* Size per §11.8: the smg_cache_tree_chars / _tokens gauge. */
uint64_t tree_size(const struct tree *tree);
/* Tenants on the root: the smg_cache_tree_tenants gauge. */
size_t tree_tenants(const struct tree *tree);
/* Nodes, root included. */
size_t tree_nodes(const struct tree *tree);
/* Bytes the tree has asked malloc for (excluding malloc's own overhead). */
size_t tree_mem(const struct tree *tree);
enum tree_kind tree_kind(const struct tree *tree);

/*
 * Serialisation for persistence. tree_dump calls cb once per tenant on the
 * root with an empty key (string trees only), then once per (tenant, node)
 * pair whose node has no child holding that tenant, least recently used
 * first, with the whole key of the node: UTF-8 bytes (len = bytes) for a
 * string tree, token ids (len = tokens, key points to uint32_t) for a token
 * tree. The key is valid during the call only. Inserting the pairs in the
 * order given into an empty tree of the same kind and block size rebuilds
 * the same prefixes, tenants, size and leaf recency order. The tree must not
 * be changed from cb. cb returns 0 to go on, non-zero to stop; tree_dump
 * returns 0 when all pairs were emitted, -1 when cb stopped it.
 */
typedef int (
    *tree_dump_cb)(void *arg, unsigned tenant, const void *key, size_t len);
int tree_dump(struct tree *tree, tree_dump_cb cb, void *arg);

/* Verifies the internal invariants (size, tenant sets closed towards the
 * root, recency order, sorted children). Returns 0 or -1 (logged). Costs a
 * full walk: for tests. */
int tree_check(const struct tree *tree);

#endif /* BROKER_TREE_H */
