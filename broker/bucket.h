/*
 * bucket.h: the state and selection of the `bucket` policy (policies.md
 * §10.3): prefill workers own contiguous ranges of request sizes, moved
 * every interval to follow the size distribution of the last window, with
 * a balance override toward the worker that received the fewest chars.
 *
 * One struct bucket per model. Time is passed in (milliseconds of any
 * monotonic clock). Single-threaded (the broker's loop). bucket_select does
 * not allocate except when its request history outgrows its buffer.
 */
#ifndef BROKER_BUCKET_H
#define BROKER_BUCKET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Upper bound of the last range. */
#define BUCKET_INFINITY UINT64_MAX
/* Sizes [0, BUCKET_INITIAL_SPAN) are split evenly at first. */
#define BUCKET_INITIAL_SPAN 4096

struct bucket;

/*
 * Candidate test: the member's position in the caller's candidate list
 * (>= 0), or -1 when it is not a candidate.
 */
typedef int (*bucket_candidate_cb)(void *arg, uint64_t id, const char *url);
/* Uniform in [0, n) for n >= 1 (the broker's policy_rand_below fits). */
typedef uint32_t (*bucket_rand_cb)(uint32_t n);

struct bucket_conf {
	uint64_t bc_abs_threshold; /* --balance-abs-threshold */
	double bc_rel_threshold; /* --balance-rel-threshold, >= 1.0 */
	uint64_t bc_window_ms; /* bucket_adjust_interval_secs * 1000 */
};
/* Built-in defaults: abs 32, rel 1.0001, window 5 s. */
void bucket_conf_default(struct bucket_conf *c);

/* A prefill worker of the model, in registration order. */
struct bucket_member {
	const char *bm_url;
	uint64_t bm_id;
};

/* One range [br_lo, br_hi] (inclusive) and its owner. */
struct bucket_range {
	uint64_t br_lo;
	uint64_t br_hi; /* BUCKET_INFINITY for the last */
	uint64_t br_id;
	const char *br_url; /* owned by the bucket */
};

enum bucket_reason {
	BUCKET_NONE = 0, /* no candidates */
	BUCKET_RANGE, /* the range holding the size */
	BUCKET_IMBALANCE, /* smallest window sum */
	BUCKET_RANDOM, /* no bucket, or the owner is not a candidate */
};

struct bucket_pick {
	int bp_index; /* candidate position, -1 only when no candidates */
	enum bucket_reason bp_reason;
};

/* c is copied. Allocation failure is fatal (control path). */
struct bucket *bucket_new(const struct bucket_conf *c);
/* bucket_free(NULL) is a no-op. */
void bucket_free(struct bucket *b);

/*
 * Sets the prefill workers (registration order; URLs copied): the ranges
 * are re-split over [0, 4096) and the next bucket_tick rebuilds them from
 * the history; window sums of workers that stay (same URL) are kept,
 * departed workers' requests stay in the history (and in its size
 * distribution) without a worker. n may be 0.
 */
void bucket_set_members(struct bucket *b, const struct bucket_member *m,
    size_t n);

/*
 * Request size: the token-id count when the request carries tokens (even
 * none), else the Unicode chars of the routing text (bytes that are not
 * UTF-8 continuation bytes), else 0.
 */
uint64_t bucket_request_size(bool has_tokens, size_t ntokens, const char *text,
    size_t len);

/*
 * Chooses among ncand candidates for a request of size chars at now_ms:
 * b NULL or without members → uniform (rnd). Otherwise the balance check on
 * the window sums of the members that are candidates (cb); imbalanced → the
 * smallest sum (first in member order); else the range holding size; an
 * owner that is not a candidate → uniform among the candidates. Then
 * records the request (window sum of the chosen member, when it is one;
 * entries older than the window leave the history). Returns out->bp_index.
 */
int bucket_select(struct bucket *b, uint64_t size, size_t ncand,
    bucket_candidate_cb cb, void *arg, bucket_rand_cb rnd, uint64_t now_ms,
    struct bucket_pick *out);

/*
 * The range recomputation of one interval (call every window, first one a
 * window after start): nothing when the history is empty or there are no
 * members; otherwise rebuilds the ranges when the per-worker share moved by
 * more than 2x. Allocates scratch; on failure keeps the ranges (logged).
 */
void bucket_tick(struct bucket *b);

/* Copies up to max ranges into out; returns the member count. */
size_t bucket_ranges(const struct bucket *b, struct bucket_range *out,
    size_t max);
/* Window sum of url (0 when not a member). */
uint64_t bucket_window_sum(const struct bucket *b, const char *url);
/* Sum of the sizes in the history. */
uint64_t bucket_total(const struct bucket *b);
const char *bucket_reason_name(enum bucket_reason r);

#endif /* BROKER_BUCKET_H */
