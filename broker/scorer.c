/*
 * scorer.c: the expected-wait scorer (smg-c's reading of policies.md §2,
 * see scorer.h) with least_load's and power_of_two's candidate rules.
 * Per-worker report entries live in an open-addressing table keyed by the
 * caller's worker id.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shared/xmalloc.h"

#include "scorer.h"

#define SCORER_MIN_SLOTS 16
#define SCORER_K_MAX     0.999

struct scorer_entry {
	uint64_t se_id;
	bool se_used;
	bool se_has_report;
	struct scorer_report se_report;
	uint64_t se_received_ms;
	uint64_t se_credit_requests;
};

struct scorer {
	struct scorer_tunables sc_t;
	scorer_rand_cb sc_rnd;
	struct scorer_entry *sc_slots;
	size_t sc_nslots; /* power of two */
	size_t sc_count;
};

/* Per-selection context, so helpers need few arguments. */
struct scorer_ctx {
	struct scorer *cx_s;
	uint64_t cx_now_ms;
	uint64_t cx_interval_ms;
};

static size_t scorer_home(const struct scorer *s, uint64_t id);
static struct scorer_entry *scorer_find(const struct scorer *s, uint64_t id);
static void scorer_grow(struct scorer *s);
static const struct scorer_entry *scorer_live(const struct scorer_ctx *cx,
    uint64_t id);
static bool scorer_capped(const struct scorer_ctx *cx,
    const struct scorer_entry *e);
static double scorer_value(const struct scorer_ctx *cx,
    const struct scorer_cand *c, const struct scorer_entry *e);

void
scorer_tunables_default(struct scorer_tunables *t)
{
	t->st_kv_pressure_weight = 0.15;
	t->st_default_throughput = 2000.0;
	t->st_mean_prefill_tokens = 1024;
	t->st_max_waiting_requests = 0;
}

struct scorer *
scorer_new(const struct scorer_tunables *t, scorer_rand_cb rnd)
{
	struct scorer *s;

	s = xcalloc(1, sizeof(*s));
	if (t != NULL)
		s->sc_t = *t;
	else
		scorer_tunables_default(&s->sc_t);
	if (!isfinite(s->sc_t.st_kv_pressure_weight) ||
	    s->sc_t.st_kv_pressure_weight < 0)
		s->sc_t.st_kv_pressure_weight = 0.15;
	if (!isfinite(s->sc_t.st_default_throughput) ||
	    s->sc_t.st_default_throughput <= 0)
		s->sc_t.st_default_throughput = 2000.0;
	if (s->sc_t.st_mean_prefill_tokens == 0)
		s->sc_t.st_mean_prefill_tokens = 1;
	s->sc_rnd = rnd;
	s->sc_nslots = SCORER_MIN_SLOTS;
	s->sc_slots = xcalloc(s->sc_nslots, sizeof(*s->sc_slots));
	return s;
}

void
scorer_free(struct scorer *s)
{
	if (s == NULL)
		return;
	free(s->sc_slots);
	free(s);
}

const struct scorer_tunables *
scorer_get_tunables(const struct scorer *s)
{
	return &s->sc_t;
}

static size_t
scorer_home(const struct scorer *s, uint64_t id)
{
	/* Fibonacci hashing; sc_nslots is a power of two. */
	return (size_t)((id * 0x9e3779b97f4a7c15ULL) >> 32) &
	    (s->sc_nslots - 1);
}

static struct scorer_entry *
scorer_find(const struct scorer *s, uint64_t id)
{
	size_t i;

	for (i = scorer_home(s, id); s->sc_slots[i].se_used;
	     i = (i + 1) & (s->sc_nslots - 1))
		if (s->sc_slots[i].se_id == id)
			return &s->sc_slots[i];
	return NULL;
}

static void
scorer_grow(struct scorer *s)
{
	struct scorer_entry *old = s->sc_slots;
	size_t i, j, n = s->sc_nslots;

	s->sc_nslots = n * 2;
	s->sc_slots = xcalloc(s->sc_nslots, sizeof(*s->sc_slots));
	for (i = 0; i < n; i++) {
		if (!old[i].se_used)
			continue;
		for (j = scorer_home(s, old[i].se_id); s->sc_slots[j].se_used;
		     j = (j + 1) & (s->sc_nslots - 1))
			;
		s->sc_slots[j] = old[i];
	}
	free(old);
}

void
scorer_report(struct scorer *s, uint64_t id, const struct scorer_report *rep,
    uint64_t now_ms)
{
	struct scorer_entry *e;
	size_t i;

	if ((e = scorer_find(s, id)) == NULL) {
		if (rep == NULL)
			return;
		/* Keep the table at most half full. */
		if ((s->sc_count + 1) * 2 > s->sc_nslots)
			scorer_grow(s);
		for (i = scorer_home(s, id); s->sc_slots[i].se_used;
		     i = (i + 1) & (s->sc_nslots - 1))
			;
		e = &s->sc_slots[i];
		memset(e, 0, sizeof(*e));
		e->se_used = true;
		e->se_id = id;
		s->sc_count++;
	}
	e->se_has_report = rep != NULL;
	if (rep != NULL)
		e->se_report = *rep;
	e->se_received_ms = now_ms;
	e->se_credit_requests = 0;
}

void
scorer_forget(struct scorer *s, uint64_t id)
{
	struct scorer_entry *e;
	size_t i, j, home, mask = s->sc_nslots - 1;

	if ((e = scorer_find(s, id)) == NULL)
		return;
	i = (size_t)(e - s->sc_slots);
	e->se_used = false;
	s->sc_count--;
	/* Backward-shift deletion keeps every probe chain unbroken. */
	for (j = (i + 1) & mask; s->sc_slots[j].se_used; j = (j + 1) & mask) {
		home = scorer_home(s, s->sc_slots[j].se_id);
		/* Entry j may move to i when i lies on its path home..j. */
		if (((j - home) & mask) >= ((j - i) & mask)) {
			s->sc_slots[i] = s->sc_slots[j];
			s->sc_slots[j].se_used = false;
			i = j;
		}
	}
}

int
scorer_credit(const struct scorer *s, uint64_t id, uint64_t *requests)
{
	const struct scorer_entry *e;

	if ((e = scorer_find(s, id)) == NULL)
		return -1;
	*requests = e->se_credit_requests;
	return 0;
}

/* The entry of id when it holds a report young enough to count. */
static const struct scorer_entry *
scorer_live(const struct scorer_ctx *cx, uint64_t id)
{
	const struct scorer_entry *e;

	if ((e = scorer_find(cx->cx_s, id)) == NULL || !e->se_has_report)
		return NULL;
	if (cx->cx_interval_ms > 0 && cx->cx_now_ms > e->se_received_ms &&
	    cx->cx_now_ms - e->se_received_ms > 3 * cx->cx_interval_ms)
		return NULL;
	return e;
}

/* Step 1: a reporting worker at or over the waiting cap. */
static bool
scorer_capped(const struct scorer_ctx *cx, const struct scorer_entry *e)
{
	uint32_t cap = cx->cx_s->sc_t.st_max_waiting_requests;
	int64_t waiting;

	if (cap == 0 || e == NULL)
		return false;
	waiting = e->se_report.sr_waiting_reqs;
	if (waiting >= (int64_t)cap)
		return true;
	if (waiting < INT64_MIN / 2)
		return false;
	return (uint64_t)((int64_t)cap - waiting) <= e->se_credit_requests;
}

/* The score of scorer.h for c; e is its fresh report entry or NULL. */
static double
scorer_value(const struct scorer_ctx *cx, const struct scorer_cand *c,
    const struct scorer_entry *e)
{
	const struct scorer_tunables *t = &cx->cx_s->sc_t;
	const struct scorer_report *r;
	double rate, queued, excess = 0, k = 0, age, tokens, score;

	rate = c->sc_rate > 0 && isfinite(c->sc_rate)
	    ? c->sc_rate
	    : t->st_default_throughput;
	if (e != NULL) {
		r = &e->se_report;
		if (r->sr_waiting_uncached_tokens > 0)
			queued = (double)r->sr_waiting_uncached_tokens;
		else
			queued =
			    (double)(r->sr_waiting_reqs > 0 ? r->sr_waiting_reqs
			                                    : 0) *
			    t->st_mean_prefill_tokens;
		age = cx->cx_now_ms > e->se_received_ms
		    ? (double)(cx->cx_now_ms - e->se_received_ms) / 1000.0
		    : 0;
		/* What this gateway sent is counted live, not twice; the
		 * rest drains at the worker's rate since the report. */
		excess = queued - (double)r->sr_pending_then - rate * age;
		if (excess < 0)
			excess = 0;
		k = r->sr_token_usage;
		if (isnan(k) || k < 0)
			k = 0;
		/* A report is seconds old: its KV use moves with the live
		 * requests in flight since (who holds KV), or a worker that
		 * was full at the last poll stays shunned while it drains. */
		if (r->sr_in_flight_then > 0 || c->sc_in_flight > 0)
			k *= (double)(c->sc_in_flight + 1) /
			    (double)(r->sr_in_flight_then + 1);
		if (k > SCORER_K_MAX)
			k = SCORER_K_MAX;
	}
	tokens = (double)c->sc_pending + excess + (double)c->sc_uncached +
	    (double)c->sc_forfeit +
	    (double)c->sc_in_flight * SCORER_INFLIGHT_TOKENS;
	score = tokens / rate + t->st_kv_pressure_weight * k / (1 - k);
	/* A broken report (NaN) never wins over a number. */
	return isnan(score) ? HUGE_VAL : score;
}

double
scorer_score(const struct scorer *s, const struct scorer_cand *c,
    uint64_t now_ms, uint64_t interval_ms, bool *reporting)
{
	struct scorer_ctx cx = { (struct scorer *)s, now_ms, interval_ms };
	const struct scorer_entry *e = scorer_live(&cx, c->sc_id);

	if (reporting != NULL)
		*reporting = e != NULL;
	return scorer_value(&cx, c, e);
}

int
scorer_select(struct scorer *s, const struct scorer_cand *c, size_t n,
    uint64_t now_ms, uint64_t interval_ms, struct scorer_pick *out)
{
	struct scorer_ctx cx = { s, now_ms, interval_ms };
	const struct scorer_entry *e;
	struct scorer_entry *w;
	double score, best = 0;
	size_t i;
	uint32_t ties = 0;

	out->sp_index = -1;
	out->sp_kind = SCORER_LIVE;
	out->sp_score = 0;
	out->sp_in_flight = 0;
	out->sp_pending = 0;
	out->sp_rate = 0;
	/* One pass: cap, score, reservoir over exact ties. */
	for (i = 0; i < n; i++) {
		e = scorer_live(&cx, c[i].sc_id);
		if (scorer_capped(&cx, e))
			continue;
		score = scorer_value(&cx, &c[i], e);
		if (ties == 0 || score < best) {
			ties = 1;
		} else if (score == best) {
			if (s->sc_rnd(++ties) != 0)
				continue;
		} else
			continue;
		best = score;
		out->sp_index = (int)i;
		out->sp_kind = e != NULL ? SCORER_REPORTING : SCORER_LIVE;
		out->sp_score = score;
		out->sp_in_flight = c[i].sc_in_flight;
		out->sp_pending = c[i].sc_pending;
		out->sp_rate = c[i].sc_rate > 0 ? c[i].sc_rate
		                                : s->sc_t.st_default_throughput;
	}
	if (out->sp_index < 0)
		return -1;
	/* Only an entry with a report counts dispatches (for the cap). */
	if ((w = scorer_find(s, c[out->sp_index].sc_id)) != NULL &&
	    w->se_has_report)
		w->se_credit_requests++;
	return out->sp_index;
}

int
scorer_least_load(struct scorer *s, const struct scorer_cand *c, size_t n,
    uint64_t now_ms, uint64_t interval_ms, struct scorer_pick *out)
{
	if (n == 1 && s->sc_t.st_max_waiting_requests == 0) {
		out->sp_index = 0;
		out->sp_kind = SCORER_SHORTCUT;
		out->sp_score = 0;
		out->sp_in_flight = c[0].sc_in_flight;
		out->sp_pending = c[0].sc_pending;
		out->sp_rate = c[0].sc_rate;
		return 0;
	}
	return scorer_select(s, c, n, now_ms, interval_ms, out);
}

void
scorer_pair(const struct scorer *s, uint32_t n, uint32_t *i, uint32_t *j)
{
	*i = s->sc_rnd(n);
	*j = (*i + 1 + s->sc_rnd(n - 1)) % n;
}

int
scorer_power_of_two(struct scorer *s, const struct scorer_cand *c, size_t n,
    uint64_t now_ms, uint64_t interval_ms, struct scorer_pick *out)
{
	struct scorer_cand pair[2];
	uint32_t i, j;

	out->sp_index = -1;
	out->sp_kind = SCORER_SHORTCUT;
	out->sp_score = 0;
	out->sp_in_flight = 0;
	out->sp_pending = 0;
	out->sp_rate = 0;
	if (n == 0)
		return -1;
	if (n == 1) {
		out->sp_index = 0;
		out->sp_in_flight = c[0].sc_in_flight;
		out->sp_pending = c[0].sc_pending;
		out->sp_rate = c[0].sc_rate;
		return 0;
	}
	scorer_pair(s, (uint32_t)n, &i, &j);
	pair[0] = c[i];
	pair[1] = c[j];
	if (scorer_select(s, pair, 2, now_ms, interval_ms, out) < 0)
		return -1;
	out->sp_index = out->sp_index == 0 ? (int)i : (int)j;
	return out->sp_index;
}

const char *
scorer_kind_name(enum scorer_kind k)
{
	switch (k) {
	case SCORER_SHORTCUT:
		return "single candidate";
	case SCORER_LIVE:
		return "live";
	case SCORER_REPORTING:
		return "live and report";
	}
	return "unknown";
}

const char *
scorer_debug(const struct scorer_pick *p, char *buf, size_t len)
{
	snprintf(buf, len,
	    "score %.4f, in_flight %" PRIu64 ", pending %" PRIu64
	    ", rate %.0f, %s",
	    p->sp_score, p->sp_in_flight, p->sp_pending, p->sp_rate,
	    scorer_kind_name(p->sp_kind));
	return buf;
}
