/*
 * stats.c: totals and latency percentiles of the simulated engine's
 * completed requests, as GET /sim/stats reports them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "shared/xmalloc.h"
#include "tests/simworker/simworker.h"

/* Percentiles are over the most recent samples only. */
#define STATS_SAMPLES 100000

struct stats_ring {
	double *sr_v;
	size_t sr_n; /* samples held, <= STATS_SAMPLES */
	size_t sr_next;
};

struct stats {
	uint64_t s_requests;
	uint64_t s_prompt_tokens;
	uint64_t s_cached_tokens;
	uint64_t s_routes[STATS_ROUTE_COUNT];
	uint64_t s_failed;
	uint64_t s_hung;
	uint64_t s_closed;
	uint64_t s_rejected;
	struct stats_ring s_ttft;
	struct stats_ring s_e2e;
};

static const char *const stats_route_names[STATS_ROUTE_COUNT] = {
	[STATS_ROUTE_GENERATE] = "/generate",
	[STATS_ROUTE_COMPLETIONS] = "/v1/completions",
	[STATS_ROUTE_CHAT] = "/v1/chat/completions",
};

static void stats_ring_add(struct stats_ring *, double);
static int stats_cmp(const void *, const void *);
static void stats_percentiles(const struct stats_ring *, cJSON *,
    const double *, const char *const *, size_t);

struct stats *
stats_new(void)
{
	struct stats *s;

	s = xcalloc(1, sizeof(*s));
	s->s_ttft.sr_v = xcalloc(STATS_SAMPLES, sizeof(double));
	s->s_e2e.sr_v = xcalloc(STATS_SAMPLES, sizeof(double));
	return s;
}

void
stats_free(struct stats *s)
{
	if (s == NULL)
		return;
	free(s->s_ttft.sr_v);
	free(s->s_e2e.sr_v);
	free(s);
}

void
stats_reset(struct stats *s)
{
	double *ttft = s->s_ttft.sr_v, *e2e = s->s_e2e.sr_v;

	memset(s, 0, sizeof(*s));
	s->s_ttft.sr_v = ttft;
	s->s_e2e.sr_v = e2e;
}

void
stats_count_route(struct stats *s, enum stats_route r)
{
	s->s_routes[r]++;
}

void
stats_count_fault(struct stats *s, const char *fault)
{
	if (strcmp(fault, "failed") == 0)
		s->s_failed++;
	else if (strcmp(fault, "hung") == 0)
		s->s_hung++;
	else if (strcmp(fault, "closed") == 0)
		s->s_closed++;
	else
		s->s_rejected++;
}

static void
stats_ring_add(struct stats_ring *r, double v)
{
	r->sr_v[r->sr_next] = v;
	r->sr_next = (r->sr_next + 1) % STATS_SAMPLES;
	if (r->sr_n < STATS_SAMPLES)
		r->sr_n++;
}

void
stats_record(struct stats *s, uint32_t prompt, uint32_t cached, double ttft_ms,
    double e2e_ms)
{
	s->s_requests++;
	s->s_prompt_tokens += prompt;
	s->s_cached_tokens += cached;
	stats_ring_add(&s->s_ttft, ttft_ms);
	stats_ring_add(&s->s_e2e, e2e_ms);
}

static int
stats_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Nearest-rank percentiles; members are null without samples. */
static void
stats_percentiles(const struct stats_ring *r, cJSON *obj, const double *q,
    const char *const *names, size_t nq)
{
	double *v;
	size_t i, rank;

	if (r->sr_n == 0 || (v = malloc(r->sr_n * sizeof(*v))) == NULL) {
		for (i = 0; i < nq; i++)
			cJSON_AddNullToObject(obj, names[i]);
		return;
	}
	memcpy(v, r->sr_v, r->sr_n * sizeof(*v));
	qsort(v, r->sr_n, sizeof(*v), stats_cmp);
	for (i = 0; i < nq; i++) {
		rank = (size_t)ceil(q[i] * (double)r->sr_n);
		if (rank > 0)
			rank--;
		cJSON_AddNumberToObject(obj, names[i], v[rank]);
	}
	free(v);
}

void
stats_to_json(const struct stats *s, cJSON *obj)
{
	static const double ttft_q[] = { 0.5, 0.9, 0.99 };
	static const char *const ttft_n[] = { "p50", "p90", "p99" };
	static const double e2e_q[] = { 0.5, 0.99 };
	static const char *const e2e_n[] = { "p50", "p99" };
	cJSON *o;
	int i;

	cJSON_AddNumberToObject(obj, "requests", (double)s->s_requests);
	cJSON_AddNumberToObject(obj, "prompt_tokens",
	    (double)s->s_prompt_tokens);
	cJSON_AddNumberToObject(obj, "cached_tokens",
	    (double)s->s_cached_tokens);
	cJSON_AddNumberToObject(obj, "hit_rate",
	    s->s_prompt_tokens
	        ? (double)s->s_cached_tokens / (double)s->s_prompt_tokens
	        : 0.0);
	o = cJSON_AddObjectToObject(obj, "ttft_ms");
	stats_percentiles(&s->s_ttft, o, ttft_q, ttft_n, 3);
	o = cJSON_AddObjectToObject(obj, "e2e_ms");
	stats_percentiles(&s->s_e2e, o, e2e_q, e2e_n, 2);
	o = cJSON_AddObjectToObject(obj, "routes");
	for (i = 0; i < STATS_ROUTE_COUNT; i++)
		cJSON_AddNumberToObject(o, stats_route_names[i],
		    (double)s->s_routes[i]);
	cJSON_AddNumberToObject(obj, "failed", (double)s->s_failed);
	cJSON_AddNumberToObject(obj, "hung", (double)s->s_hung);
	cJSON_AddNumberToObject(obj, "closed", (double)s->s_closed);
	cJSON_AddNumberToObject(obj, "rejected", (double)s->s_rejected);
}
