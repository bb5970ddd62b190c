/*
 * scorer.h: the expected-wait scorer of policies.md §2, shared by
 * least_load (§3), power_of_two (§4) and cache_aware's fallback pick
 * (§11.5).
 *
 * One scorer per policy instance. It keeps, per worker id (the caller's
 * choice, stable for the worker's lifetime), the latest load report and the
 * credit {tokens, requests} this instance dispatched since that report.
 * Single-threaded (the broker's loop). The selection functions do not
 * allocate and run in time linear in the candidate count.
 */
#ifndef BROKER_SCORER_H
#define BROKER_SCORER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Debug text of a decision fits in this many bytes. */
#define SCORER_DEBUG_SIZE 96

struct scorer;

/* Uniform in [0, n) for n >= 1 (the broker's policy_rand_below fits). */
typedef uint32_t (*scorer_rand_cb)(uint32_t n);

struct scorer_tunables {
	double st_kv_pressure_weight; /* λ, seconds; finite, >= 0 */
	double st_default_throughput; /* T₀, tokens/s; finite, > 0 */
	uint32_t st_mean_prefill_tokens; /* p̄, > 0 */
	uint32_t st_max_waiting_requests; /* cap; 0 = off */
};

/* Built-in defaults: λ 0.15, T₀ 2000, p̄ 1024, cap 0. */
void scorer_tunables_default(struct scorer_tunables *t);

/* A worker's report, already summed over DP ranks (§1.5). */
struct scorer_report {
	int64_t sr_waiting_reqs;
	int64_t sr_waiting_uncached_tokens;
	double sr_gen_throughput; /* tokens/s */
	double sr_token_usage; /* mean over ranks, 0.0-1.0 */
};

/* One candidate of a selection, in the caller's candidate order. */
struct scorer_cand {
	uint64_t sc_id;
	uint64_t sc_in_flight; /* live in-flight count of the worker */
};

/* How the winner was scored. */
enum scorer_kind {
	SCORER_SHORTCUT = 0, /* single candidate, not scored */
	SCORER_REPORTING, /* its own report (§2.1 step 3) */
	SCORER_NON_REPORTING, /* beside reporting peers (step 4) */
	SCORER_DARK, /* nobody in the set reports (step 5) */
};

struct scorer_pick {
	int sp_index; /* position in the candidates, -1: none (503) */
	enum scorer_kind sp_kind;
	double sp_score; /* seconds, or in-flight count when dark */
	uint64_t sp_in_flight;
};

/*
 * New scorer. t NULL means the built-in defaults; a non-finite or negative
 * λ becomes 0.15, a non-finite or non-positive T₀ becomes 2000, p̄ 0
 * becomes 1. rnd draws the random tie-breaks and power_of_two pairs.
 * Allocation failure is fatal (control path).
 */
struct scorer *scorer_new(const struct scorer_tunables *t, scorer_rand_cb rnd);
/* scorer_free(NULL) is a no-op. */
void scorer_free(struct scorer *s);
/* The tunables in effect (after the constructor's corrections). */
const struct scorer_tunables *scorer_get_tunables(const struct scorer *s);

/*
 * Ingests a fresh report of worker id received at now_ms and resets its
 * credit to zero. rep NULL is a report with zero ranks: the worker has no
 * report from then on. A failed poll should not be passed in (the previous
 * report stays until it ages out).
 */
void scorer_report(struct scorer *s, uint64_t id,
    const struct scorer_report *rep, uint64_t now_ms);
/* Drops everything known about id (worker removed). */
void scorer_forget(struct scorer *s, uint64_t id);
/*
 * Credit of id into *tokens and *requests; returns 0, or -1 when the
 * scorer holds no entry for id. Only workers that have reported are
 * credited: a report resets the credit, so credit before it is moot.
 */
int scorer_credit(const struct scorer *s, uint64_t id, uint64_t *tokens,
    uint64_t *requests);

/*
 * §2 over c[0..n): the waiting cap, reporting / non-reporting / dark
 * scores, minimum with exact ties uniformly at random, then credits the
 * winner with tokens (the request's token-id count; < 0 when unknown, then
 * p̄) and one request. A report received more than 3 × interval_ms before
 * now_ms counts as missing (interval_ms 0: reports never age). Fills *out
 * and returns the winner's position, or -1 when n is 0 or every candidate
 * is capped.
 */
int scorer_select(struct scorer *s, const struct scorer_cand *c, size_t n,
    int64_t tokens, uint64_t now_ms, uint64_t interval_ms,
    struct scorer_pick *out);
/*
 * least_load (§3): one candidate and no cap → it, unscored and uncredited;
 * otherwise scorer_select.
 */
int scorer_least_load(struct scorer *s, const struct scorer_cand *c, size_t n,
    int64_t tokens, uint64_t now_ms, uint64_t interval_ms,
    struct scorer_pick *out);
/*
 * power_of_two (§4): one candidate → it (unscored); otherwise a pair drawn
 * by scorer_pair and scorer_select on the pair only. Returns the winner's
 * position in c.
 */
int scorer_power_of_two(struct scorer *s, const struct scorer_cand *c, size_t n,
    int64_t tokens, uint64_t now_ms, uint64_t interval_ms,
    struct scorer_pick *out);
/*
 * The pair of §4 for n >= 2: i uniform in [0, n), j = (i + 1 + uniform
 * [0, n - 1)) mod n; distinct, every ordered pair equally likely.
 */
void scorer_pair(const struct scorer *s, uint32_t n, uint32_t *i, uint32_t *j);

/*
 * Writes "score <s>, in_flight <k>" (plus how it was scored) into buf and
 * returns buf; len SCORER_DEBUG_SIZE is always enough.
 */
const char *scorer_debug(const struct scorer_pick *p, char *buf, size_t len);
const char *scorer_kind_name(enum scorer_kind k);

#endif /* BROKER_SCORER_H */
