/*
 * ring.h: the consistent-hash ring of policies.md §5.2 and the two pure
 * selection rules built on it: consistent_hashing's key chain (§5.1) and
 * prefix_hash's key derivation, load check and selection (§6).
 *
 * Positions use XXH3-64 (seed 0) where SMG uses BLAKE3. Everything here is
 * single-threaded (the broker's loop). No function on the selection path
 * allocates.
 */
#ifndef BROKER_RING_H
#define BROKER_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RING_VNODES 150
/* 16 lowercase hex digits and the NUL. */
#define RING_HEX_SIZE 17
/* Most levels ring_prefix_levels produces (the deepest ones are kept). */
#define RING_PREFIX_MAX_LEVELS 32

struct ring;

/* One ring member as given to ring_new: the worker URL and the caller's id. */
struct ring_node {
	const char *rn_url;
	uint64_t rn_id;
};

/*
 * Candidate test of a lookup: returns the member's position in the caller's
 * candidate list (>= 0), or -1 when the member is not a candidate. Called at
 * most once per distinct URL per lookup.
 */
typedef int (*ring_candidate_cb)(void *arg, uint64_t id, const char *url);
/* Uniform in [0, n) for n >= 1 (the broker's policy_rand_below fits). */
typedef uint32_t (*ring_rand_cb)(uint32_t n);

/*
 * Candidate test over a plain list of ids: arg is a struct ring_ids, the
 * position is the index of the id in ri_ids (linear scan; for small lists
 * and tests).
 */
struct ring_ids {
	const uint64_t *ri_ids;
	size_t ri_n;
};
int ring_ids_candidate(void *arg, uint64_t id, const char *url);

/*
 * Builds a ring with RING_VNODES virtual nodes per distinct URL; vnode v of
 * URL u sits at XXH3-64("u#v"). Duplicate URLs keep the id of their first
 * occurrence. Positions and the walk order depend only on the URL set, never
 * on the order of nodes[]. URLs are copied. n may be 0 (every lookup then
 * finds nothing). Allocation failure is fatal (control path: called on
 * worker add/remove). Free with ring_free.
 */
struct ring *ring_new(const struct ring_node *nodes, size_t n);
/* ring_free(NULL) is a no-op. */
void ring_free(struct ring *r);
/* Number of distinct URLs on the ring. */
size_t ring_members(const struct ring *r);

/*
 * Looks key[0..keylen) up: p = XXH3-64(key); starting at the first vnode
 * with position >= p (wrapping to the first one), walks clockwise, skips
 * URLs already visited and returns the candidate position (cb) of the first
 * URL that is a candidate, storing its id in *id when id is not NULL.
 * Returns -1 when no member is a candidate or r is NULL. Uses scratch space
 * inside r, hence the non-const ring: not reentrant.
 */
int ring_lookup(struct ring *r, const void *key, size_t keylen,
    ring_candidate_cb cb, void *arg, uint64_t *id);

/* Writes h as 16 lowercase, zero-padded hex digits and a NUL into out. */
void ring_key_hex(uint64_t h, char out[RING_HEX_SIZE]);

/* ------------------------------------------------ consistent_hashing */

enum ring_ch_branch {
	RING_CH_NO_HEALTHY_WORKERS = 0,
	RING_CH_TARGET_WORKER_HIT,
	RING_CH_TARGET_WORKER_MISS,
	RING_CH_ROUTING_KEY_HIT,
	RING_CH_RANDOM_FALLBACK,
};

/*
 * Inputs of §5.1; NULL means the header (or key) is absent. rid_key is the
 * lineage-stripped rid key, given only when --routing-key-override is on;
 * routing_key is SelectInfo.routing_key (already validated by the caller,
 * and lineage-stripped when the override is on). The three implicit-key
 * headers are given raw; the first present one decides.
 */
struct ring_ch_input {
	const char *rci_target_worker; /* X-SMG-Target-Worker */
	const char *rci_rid_key;
	const char *rci_routing_key;
	const char *rci_authorization;
	const char *rci_forwarded_for; /* x-forwarded-for */
	const char *rci_cookie;
};

struct ring_ch_pick {
	int rcp_index; /* candidate position, -1 none (503) */
	enum ring_ch_branch rcp_branch;
	const char *rcp_key; /* the key hashed on the ring, or NULL */
};

/*
 * consistent_hashing over n candidates (§5.1): target worker index, rid key,
 * routing key, implicit key, random fallback (rnd). Keys are looked up on r
 * among the candidates (cb); r may be NULL (no key then finds a worker).
 * Exactly one branch per call. rcp_key points into in.
 */
void ring_ch_select(struct ring *r, const struct ring_ch_input *in, size_t n,
    ring_candidate_cb cb, void *arg, ring_rand_cb rnd,
    struct ring_ch_pick *out);
const char *ring_ch_branch_name(enum ring_ch_branch b);

/* ------------------------------------------------------- prefix_hash */

/* prefix_hash tunables (policies.md §6, §13). */
struct ring_prefix_conf {
	const uint32_t *rpc_boundaries; /* ascending, positive; may be NULL */
	size_t rpc_nboundaries;
	uint32_t rpc_prefix_token_count; /* > 0; 0 is read as 1 */
	double rpc_load_factor; /* >= 1.0 */
	double rpc_abs_threshold; /* >= 0 */
};
/* Built-in defaults: no boundaries, 256, 1.25, 10. */
void ring_prefix_conf_default(struct ring_prefix_conf *c);

/* The routing inputs of §6.1; absent ones are NULL / 0. */
struct ring_prefix_input {
	const char *rpi_routing_key; /* valid SelectInfo.routing_key */
	size_t rpi_routing_key_len;
	const uint32_t *rpi_tokens;
	size_t rpi_ntokens;
	const char *rpi_text; /* UTF-8 */
	size_t rpi_text_len;
};

enum ring_level_kind {
	RING_LEVEL_ROUTING_KEY = 0,
	RING_LEVEL_TOKENS,
	RING_LEVEL_TEXT,
};

/* One key level: h = XXH3-64(key bytes), seed 0. */
struct ring_level {
	uint64_t rl_hash;
	enum ring_level_kind rl_kind;
	uint64_t rl_depth; /* bytes, tokens or chars, per rl_kind */
	bool rl_boundary; /* a --cache-boundaries level, not the fixed depth */
};

/*
 * §6.1: fills out[] with the key levels, deepest first, and returns how
 * many (0: no routing key). Routing key: one level over its bytes. Tokens:
 * one level per boundary b <= len (first b ids as 4-byte little-endian),
 * else one level of the first min(len, prefix_token_count) ids. Text: the
 * same with 4 chars per token (Unicode scalar values, cut on a char
 * boundary; a byte that is not a UTF-8 continuation byte starts a char).
 * More than RING_PREFIX_MAX_LEVELS boundary levels keep the deepest ones.
 */
size_t ring_prefix_levels(const struct ring_prefix_conf *c,
    const struct ring_prefix_input *in,
    struct ring_level out[RING_PREFIX_MAX_LEVELS]);

/*
 * §6.2 load check: true when total == 0 or load <= max(avg * factor,
 * avg + abs) with avg = (total + 1) / n; n is the candidate count (>= 1).
 */
bool ring_prefix_acceptable(const struct ring_prefix_conf *c, uint64_t load,
    uint64_t total, size_t n);

enum ring_prefix_branch {
	RING_PREFIX_NO_HEALTHY_WORKERS = 0,
	RING_PREFIX_NO_ROUTING_KEY,
	RING_PREFIX_RING_HIT,
	RING_PREFIX_LOAD_BALANCE_WALK,
	RING_PREFIX_FALLBACK_LEAST_LOAD,
};

struct ring_prefix_pick {
	int rpp_index; /* candidate position; -1 only when n == 0 */
	enum ring_prefix_branch rpp_branch;
	int rpp_level; /* level of the ring target used (ring_hit, or the
	                  deepest target of load_balance_walk), else -1 */
};

/*
 * §6.2 over n candidates whose in-flight counts are loads[0..n): levels
 * deepest first (from ring_prefix_levels), each hashed to its hex ring key
 * and looked up on r (may be NULL) among the candidates (cb). Least-loaded
 * rules take the fewest in-flight, ties to the first in list order.
 */
void ring_prefix_select(struct ring *r, const struct ring_prefix_conf *c,
    const struct ring_level *levels, size_t nlevels, const uint64_t *loads,
    size_t n, ring_candidate_cb cb, void *arg, struct ring_prefix_pick *out);
const char *ring_prefix_branch_name(enum ring_prefix_branch b);

#endif /* BROKER_RING_H */
