/*
 * scorer.h: the expected-wait scorer shared by least_load (policies.md §3),
 * power_of_two (§4) and cache_aware (§11.3, §11.5), in smg-c's reading of
 * §2 (docs/decisions.md): how long a request sent to a worker would wait
 * for its first token, from what the gateway knows live, topped up by the
 * worker's load report where the report shows more.
 *
 * For candidate w, with rate r = its prefill rate (sc_rate, or T0 when 0):
 *   excess  = fresh report ? max(0, queued - pending_then - r * age) : 0
 *             queued = waiting_uncached_tokens if > 0, else
 *                      max(waiting_reqs, 0) * p̄; pending_then = the live
 *             pending tokens when the report arrived; age = its age (s).
 *             The report's queue beyond what this gateway had sent there
 *             (other gateways' traffic), drained at r since.
 *   k       = fresh report ? token_usage × (in_flight + 1) /
 *             (in_flight_then + 1), clamped to [0, 0.999] : 0 — the
 *             report's KV use followed live: the requests that held it
 *             leave, new ones come, between two reports.
 *   tokens  = sc_pending + excess + sc_uncached + sc_forfeit
 *             + sc_in_flight * SCORER_INFLIGHT_TOKENS
 *   score   = tokens / r + λ · k / (1 − k)          (seconds)
 * A report is fresh when received at most 3 × interval_ms ago (interval 0:
 * reports never age). Minimum wins; exact ties uniformly at random.
 *
 * One scorer per policy instance. It keeps, per worker id (the caller's
 * choice, stable for the worker's lifetime), the latest load report and
 * the requests this instance dispatched there since it (for the waiting
 * cap). Live figures come with the candidates. Single-threaded (the
 * broker's loop). The selection functions do not allocate and run in time
 * linear in the candidate count.
 */
#ifndef BROKER_SCORER_H
#define BROKER_SCORER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Debug text of a decision fits in this many bytes. */
#define SCORER_DEBUG_SIZE 128
/*
 * Prompt tokens one request in flight counts for. A running request's
 * decode steps share the engine's batches with prefill, but they cost a
 * prefill of thousands of tokens little; the term orders workers of equal
 * backlog by decode load (fewest in flight, the dark-fleet rule of §2)
 * and, one token per request, cannot pull a conversation off its
 * cache.
 */
#define SCORER_INFLIGHT_TOKENS 1

struct scorer;

/* Uniform in [0, n) for n >= 1 (the broker's policy_rand_below fits). */
typedef uint32_t (*scorer_rand_cb)(uint32_t n);

struct scorer_tunables {
	double st_kv_pressure_weight; /* λ, seconds; finite, >= 0 */
	double st_default_throughput; /* T₀: rate when none is known; > 0 */
	uint32_t st_mean_prefill_tokens; /* p̄, > 0 */
	uint32_t st_max_waiting_requests; /* cap; 0 = off */
};

/* Built-in defaults: λ 0.15, T₀ 2000, p̄ 1024, cap 0. */
void scorer_tunables_default(struct scorer_tunables *t);

/* A worker's report, already summed over DP ranks (§1.5). */
struct scorer_report {
	int64_t sr_waiting_reqs;
	int64_t sr_waiting_uncached_tokens;
	double sr_gen_throughput; /* tokens/s (decode; not used to score) */
	double sr_token_usage; /* mean over ranks, 0.0-1.0 */
	/* This gateway's live pending tokens on the worker on arrival. */
	uint64_t sr_pending_then;
	/* ... and its live requests in flight there (0 when unknown). */
	uint64_t sr_in_flight_then;
};

/* One candidate of a selection, in the caller's candidate order. */
struct scorer_cand {
	uint64_t sc_id;
	uint64_t sc_in_flight; /* live requests in flight (shm) */
	uint64_t sc_pending; /* live prompt tokens awaiting a first byte */
	double sc_rate; /* prefill tokens/s; 0 unknown (T₀) */
	uint64_t sc_uncached; /* this prompt's tokens it must prefill */
	uint64_t sc_forfeit; /* cached reuse forfeited by going there */
};

/* How the winner was scored. */
enum scorer_kind {
	SCORER_SHORTCUT = 0, /* single candidate, not scored */
	SCORER_LIVE, /* live figures only (no fresh report) */
	SCORER_REPORTING, /* live figures and a fresh report */
};

struct scorer_pick {
	int sp_index; /* position in the candidates, -1: none (503) */
	enum scorer_kind sp_kind;
	double sp_score; /* seconds */
	uint64_t sp_in_flight;
	uint64_t sp_pending;
	double sp_rate;
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
 * dispatch count to zero. rep NULL is a report with zero ranks: the worker
 * has no report from then on. A failed poll should not be passed in (the
 * previous report stays until it ages out).
 */
void scorer_report(struct scorer *s, uint64_t id,
    const struct scorer_report *rep, uint64_t now_ms);
/* Drops everything known about id (worker removed). */
void scorer_forget(struct scorer *s, uint64_t id);
/*
 * Requests this instance dispatched to id since its last report into
 * *requests; returns 0, or -1 when the scorer holds no entry for id (only
 * workers that have reported are counted).
 */
int scorer_credit(const struct scorer *s, uint64_t id, uint64_t *requests);

/*
 * The score of the header comment for candidate c (seconds) and whether a
 * fresh report entered it (*reporting, may be NULL). Changes nothing.
 */
double scorer_score(const struct scorer *s, const struct scorer_cand *c,
    uint64_t now_ms, uint64_t interval_ms, bool *reporting);
/*
 * Over c[0..n): drops every candidate with a fresh report whose
 * waiting_reqs plus the requests dispatched there since reach the cap (if
 * set), scores the others, takes the minimum (exact ties uniformly at
 * random) and counts one dispatch for the winner. Fills *out and returns
 * the winner's position, or -1 when n is 0 or every candidate is capped.
 */
int scorer_select(struct scorer *s, const struct scorer_cand *c, size_t n,
    uint64_t now_ms, uint64_t interval_ms, struct scorer_pick *out);
/*
 * least_load (§3): one candidate and no cap → it, unscored and uncounted;
 * otherwise scorer_select.
 */
int scorer_least_load(struct scorer *s, const struct scorer_cand *c, size_t n,
    uint64_t now_ms, uint64_t interval_ms, struct scorer_pick *out);
/*
 * power_of_two (§4): one candidate → it (unscored); otherwise a pair drawn
 * by scorer_pair and scorer_select on the pair only. Returns the winner's
 * position in c.
 */
int scorer_power_of_two(struct scorer *s, const struct scorer_cand *c, size_t n,
    uint64_t now_ms, uint64_t interval_ms, struct scorer_pick *out);
/*
 * The pair of §4 for n >= 2: i uniform in [0, n), j = (i + 1 + uniform
 * [0, n - 1)) mod n; distinct, every ordered pair equally likely.
 */
void scorer_pair(const struct scorer *s, uint32_t n, uint32_t *i, uint32_t *j);

/*
 * Writes "score <s>, in_flight <k>, pending <t>, rate <r>" (plus how it was
 * scored) into buf and returns buf; len SCORER_DEBUG_SIZE is always enough.
 */
const char *scorer_debug(const struct scorer_pick *p, char *buf, size_t len);
const char *scorer_kind_name(enum scorer_kind k);

#endif /* BROKER_SCORER_H */
