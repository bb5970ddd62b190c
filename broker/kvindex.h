/*
 * kvindex.h: the block index of cache_aware's event mode (policies.md
 * §11.4, workers.md §5.1): which worker holds which KV-cache blocks, fed
 * by the engines' own event streams (decoded by the poller, applied here).
 *
 * Per model: index (position, content hash, prefix hash) -> set of worker
 * slots, and the block size learnt from the first stored block. Per worker
 * slot: engine block hash -> (position, content hash, prefix hash), so
 * later blocks can be chained to their parent and removals matched.
 * content = XXH3-64 (seed 1337) over a block's token ids as 4-byte
 * little-endian; prefix = content at a chain start, else XXH3-64 (seed
 * 1337) over LE64(parent prefix) || LE64(content).
 *
 * Bounds (both 0 = unbounded): entries (worker-block memberships) neither
 * stored nor matched within the TTL are pruned; above the maximum the
 * oldest-touched are pruned to 90 %, never one touched in the last 2 s.
 * Pruning runs from kvindex_prune, every KVINDEX_PRUNE_MS.
 *
 * Single-threaded, like the rest of the broker.
 */
#ifndef BROKER_KVINDEX_H
#define BROKER_KVINDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ipc.pb-c.h"

#define KVINDEX_SEED      1337
#define KVINDEX_PRUNE_MS  30000
#define KVINDEX_RECENT_MS 2000

struct kvindex;
struct broker;
struct worker;

/* XXH3-64 seed 1337 of n token ids as 4-byte little-endian. */
uint64_t kvindex_content_hash(const uint32_t *tokens, size_t n);
/* XXH3-64 seed 1337 of LE64(prev) || LE64(content). */
uint64_t kvindex_prefix_hash(uint64_t prev, uint64_t content);

/*
 * An empty index; ttl_ms and max_entries 0 mean unbounded. Allocation
 * failure is fatal (startup or first use). kvindex_free(NULL) is a no-op.
 */
struct kvindex *kvindex_new(uint64_t ttl_ms, uint64_t max_entries);
void kvindex_free(struct kvindex *kx);
void kvindex_set_bounds(struct kvindex *kx, uint64_t ttl_ms,
    uint64_t max_entries);

/*
 * Applies one batch of worker `slot` (generation `gen`) of model `model`
 * in order: reset first when b->reset, then every event. A worker seen
 * with another generation or model starts empty. Malformed events (no
 * tokens for a stored hash) are skipped and counted in the return value:
 * the number of blocks skipped, 0 when all applied.
 */
size_t kvindex_apply(struct kvindex *kx, const char *model, unsigned slot,
    uint32_t gen, const Smg__KvEventBatch *b, uint64_t now_ms);
/* Drops every block of the worker in `slot` (removal, stream reset). */
void kvindex_forget_worker(struct kvindex *kx, unsigned slot);

/* Distinct (position, content, prefix) entries of a model; 0 if none. */
size_t kvindex_blocks(const struct kvindex *kx, const char *model);
/* Worker-block memberships over every model (the bounded quantity). */
size_t kvindex_entries(const struct kvindex *kx);
/* Block size learnt for the model, 0 when not learnt yet. */
uint32_t kvindex_block_size(const struct kvindex *kx, const char *model);

/*
 * Overlap score (§11.4) of each of the n worker slots for tokens, with
 * block size bs (> 0): scores[i] = number of leading request blocks whose
 * (position, content, prefix) the worker in slots[i] holds. Entries that
 * match are touched (TTL). Slots >= SHM_MAX_WORKERS score 0.
 */
void kvindex_overlap(struct kvindex *kx, const char *model,
    const uint32_t *tokens, size_t ntok, uint32_t bs, const unsigned *slots,
    unsigned n, uint32_t *scores, uint64_t now_ms);

/* Applies the TTL and capacity bounds; returns the entries pruned. */
size_t kvindex_prune(struct kvindex *kx, uint64_t now_ms);

/* ---- the broker's index (one per broker, made on first use) ---- */

/*
 * The index of br; created on first use with the bounds last given to
 * kvindex_broker_bounds (unbounded by default), with a libev timer on
 * br's loop that prunes every KVINDEX_PRUNE_MS. Freed by
 * kvindex_broker_free (server_free calls it).
 */
struct kvindex *kvindex_of(struct broker *br);
void kvindex_broker_bounds(struct broker *br, uint64_t ttl_secs,
    uint64_t max_entries);
void kvindex_broker_free(struct broker *br);
/* A KvEventBatch of the poller (stale slot/generation/url: dropped). */
void kvindex_handle(struct broker *br, const Smg__KvEventBatch *b);
/* A worker left the registry: its blocks go. */
void kvindex_worker_removed(struct broker *br, struct worker *w);
/*
 * Registry observer (server_new registers it): a removed worker, or one
 * that moved to another model (its blocks were indexed under the old
 * one), is forgotten by kvindex_worker_removed.
 */
struct registry_observer;
extern const struct registry_observer kvindex_registry_observer;
/* Whether event mode applies to the model: its index holds >= 1 block. */
bool kvindex_active(struct broker *br, const char *model);
/*
 * Event-mode selection over candidates c[0..n) with in-flight load[]
 * (§11.4): the candidate with the highest overlap score > 0, ties fewer
 * in-flight, then uniform random. Request blocks use the model's learnt
 * block size, else default_bs. Returns the index into c, or -1 when no
 * candidate overlaps (the caller makes the fallback pick); *score gets
 * the winner's score (0 for -1).
 */
int kvindex_select(struct broker *br, const char *model,
    struct worker *const *c, unsigned n, const uint32_t *load,
    const uint32_t *tokens, size_t ntok, uint32_t default_bs, uint32_t *score);

#endif /* BROKER_KVINDEX_H */
