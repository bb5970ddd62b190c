/* metrics.c: Prometheus series in shared memory: register, add, render. */
#include "shared/metrics.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

#include "shared/log.h"
#include "shared/shm.h"

#define METRICS_SPIN_YIELDS 1000 /* then sleep 1 ms per try */
#define METRICS_SPIN_SLEEPS 1000 /* a registrar that died mid-write */
#define METRICS_RETIRED     3 /* se_state: hidden, name kept for reuse */

enum metrics_part {
	METRICS_PART_PLAIN = 0, /* counter, gauge, or a histogram bucket */
	METRICS_PART_SUM,
	METRICS_PART_COUNT,
};

/* One series as the renderer sees it. */
struct metrics_entry {
	char me_name[SHM_SERIES_NAME_MAX];
	size_t me_flen; /* family, suffix stripped */
	size_t me_lstart; /* labels, le stripped */
	size_t me_llen;
	enum metrics_kind me_kind;
	enum metrics_part me_part;
	double me_le;
	int64_t me_value;
};

struct metrics_buf {
	char *mb_buf;
	size_t mb_len;
	size_t mb_cap;
	int mb_err;
};

static const double metrics_default_bounds[] = { 0.001, 0.005, 0.01, 0.025,
	0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300 };

/*
 * # HELP text of the families this gateway exports (SMG's wording where
 * SMG has the family). A family missing here gets a line made from its
 * name (metrics_help), so every family has one.
 */
struct metrics_help_entry {
	const char *mh_family;
	const char *mh_help;
};

static const struct metrics_help_entry metrics_helps[] = {
	{ "smg_http_requests_total", "Total HTTP requests by method and path" },
	{ "smg_http_request_duration_seconds",
	    "HTTP request duration by method and path" },
	{ "smg_http_responses_total",
	    "Total HTTP responses by path, status_code and error_code" },
	{ "smg_http_connections_active", "Currently active HTTP connections" },
	{ "smg_http_rate_limit_total",
	    "Admission decisions (allowed, rejected) of the rate limiter" },
	{ "smg_worker_errors_total",
	    "Worker-level errors by worker_type, connection_mode, error_type" },
	{ "smg_worker_selection_total",
	    "Worker selection events by worker_type, connection_mode, model, "
	    "policy" },
	{ "smg_worker_requests_active", "Requests in flight per worker" },
	{ "smg_worker_pool_size", "Workers registered per worker_type" },
	{ "smg_worker_health", "Worker health (1 healthy, 0 not)" },
	{ "smg_worker_health_checks_total",
	    "Health check results by worker_type and result" },
	{ "smg_worker_cb_state",
	    "Circuit breaker state per worker (0 closed, 1 open, 2 "
	    "half-open)" },
	{ "smg_worker_cb_transitions_total",
	    "Circuit breaker state transitions per worker" },
	{ "smg_worker_cb_outcomes_total",
	    "Circuit breaker outcomes per worker (success, failure)" },
	{ "smg_worker_cb_consecutive_failures",
	    "Consecutive failures counted by each worker's circuit breaker" },
	{ "smg_worker_cb_consecutive_successes",
	    "Consecutive successes counted by each worker's circuit breaker" },
	{ "smg_worker_retries_total", "Retries per worker_type and endpoint" },
	{ "smg_worker_retries_exhausted_total",
	    "Requests that used every attempt" },
	{ "smg_worker_retry_backoff_seconds", "Backoff before each retry" },
	{ "smg_router_requests_total",
	    "Requests routed by router_type, backend, model, endpoint" },
	{ "smg_router_request_duration_seconds",
	    "Routed request duration by router_type, backend, model, "
	    "endpoint" },
	{ "smg_router_request_errors_total",
	    "Routed request errors by error_type" },
	{ "smg_router_upstream_responses_total",
	    "Worker responses by status class" },
	{ "smg_engine_running_requests",
	    "Running requests reported by each engine" },
	{ "smg_engine_waiting_requests",
	    "Waiting requests reported by each engine" },
	{ "smg_engine_token_usage", "KV-cache token usage of each engine" },
	{ "smg_engine_cache_hit_rate", "Prefix cache hit rate of each engine" },
	{ "smg_engine_gen_throughput",
	    "Generation throughput of each engine (tokens/s)" },
	{ "smg_pd_ttft_seconds", "PD time to first token" },
	{ "smg_pd_prefill_duration_seconds", "PD prefill leg duration" },
	{ "smg_pd_bootstrap_failures_total", "PD bootstrap failures" },
	{ "smg_discovery_pods",
	    "Pods Kubernetes discovery sees, by role and readiness" },
	{ "smg_discovery_api_errors_total",
	    "Failed Kubernetes API lists and watches, by role" },
	{ "smg_discovery_synced",
	    "1 while a role's pod list is current and its watch open" },
};

/*
 * Writes the help of family (len bytes) into buf: the table's, else the
 * family's own words ("smg_worker_retries_total" -> "smg-c: worker
 * retries total").
 */
static void
metrics_help(const char *family, size_t len, char *buf, size_t buflen)
{
	size_t i, o;
	const char *p = family;

	for (i = 0; i < sizeof(metrics_helps) / sizeof(metrics_helps[0]); i++) {
		if (strlen(metrics_helps[i].mh_family) == len &&
		    strncmp(metrics_helps[i].mh_family, family, len) == 0) {
			snprintf(buf, buflen, "%s", metrics_helps[i].mh_help);
			return;
		}
	}
	if (buflen < 16)
		return;
	memcpy(buf, "smg-c: ", 7);
	o = 7;
	if (len > 4 && strncmp(p, "smg_", 4) == 0) {
		p += 4;
		len -= 4;
	}
	for (i = 0; i < len && o + 1 < buflen; i++)
		buf[o++] = p[i] == '_' ? ' ' : p[i];
	buf[o] = '\0';
}

static const char *const metrics_kind_names[] = {
	[METRICS_COUNTER] = "counter",
	[METRICS_GAUGE] = "gauge",
	[METRICS_HISTOGRAM] = "histogram",
	[METRICS_GAUGE_FLOAT] = "gauge",
};

static int metrics_valid_family(const char *);
static int metrics_valid_label_name(const char *, size_t);
static int metrics_valid_labels(const char *);
static int metrics_register(struct shm *, enum metrics_kind, const char *);
static uint32_t metrics_wait_ready(_Atomic uint32_t *);
static void metrics_fmt_bound(char *, size_t, double);
static int metrics_entry_parse(struct metrics_entry *);
static int metrics_entry_cmp(const void *, const void *);
static int metrics_same_group(const struct metrics_entry *,
    const struct metrics_entry *);
static void metrics_printf(struct metrics_buf *, const char *, ...)
    __attribute__((format(printf, 2, 3)));
static void metrics_print_seconds(struct metrics_buf *, int64_t);
static size_t metrics_render_histogram(struct metrics_buf *,
    const struct metrics_entry *, size_t, size_t);

static int
metrics_valid_family(const char *s)
{
	const char *p;

	if (s == NULL || *s == '\0')
		return 0;
	for (p = s; *p != '\0'; p++) {
		if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		    *p == '_' || *p == ':')
			continue;
		if (p != s && *p >= '0' && *p <= '9')
			continue;
		return 0;
	}
	return 1;
}

static int
metrics_valid_label_name(const char *s, size_t len)
{
	size_t i;

	if (len == 0)
		return 0;
	for (i = 0; i < len; i++) {
		if ((s[i] >= 'a' && s[i] <= 'z') ||
		    (s[i] >= 'A' && s[i] <= 'Z') || s[i] == '_')
			continue;
		if (i > 0 && s[i] >= '0' && s[i] <= '9')
			continue;
		return 0;
	}
	return 1;
}

/* k="v",k2="v2" with values escaped; "" is valid. */
static int
metrics_valid_labels(const char *s)
{
	const char *p = s, *name;

	if (s == NULL || *s == '\0')
		return 1;
	for (;;) {
		for (name = p; *p != '=' && *p != '\0'; p++)
			;
		if (*p != '=' ||
		    !metrics_valid_label_name(name, (size_t)(p - name)))
			return 0;
		if (*++p != '"')
			return 0;
		for (p++; *p != '"'; p++) {
			if (*p == '\0' || *p == '\n')
				return 0;
			if (*p == '\\') {
				p++;
				if (*p != '\\' && *p != '"' && *p != 'n')
					return 0;
			}
		}
		p++;
		if (*p == '\0')
			return 1;
		if (*p++ != ',')
			return 0;
	}
}

int
metrics_labels(char *buf, size_t len, ...)
{
	va_list ap;
	const char *k, *v;
	size_t o = 0;
	int first = 1, esc;

	if (len == 0)
		return -1;
	buf[0] = '\0';
	va_start(ap, len);
	while ((k = va_arg(ap, const char *)) != NULL) {
		v = va_arg(ap, const char *);
		if (v == NULL)
			v = "";
		if (!metrics_valid_label_name(k, strlen(k)))
			goto fail;
		/* [','] name '=' '"' ... '"' NUL */
		if (o + !first + strlen(k) + 4 > len)
			goto fail;
		if (!first)
			buf[o++] = ',';
		first = 0;
		memcpy(buf + o, k, strlen(k));
		o += strlen(k);
		buf[o++] = '=';
		buf[o++] = '"';
		for (; *v != '\0'; v++) {
			esc = *v == '\\' || *v == '"' || *v == '\n';
			/* the character, then room for '"' and NUL */
			if (o + 1 + esc + 2 > len)
				goto fail;
			if (*v == '\\' || *v == '"') {
				buf[o++] = '\\';
				buf[o++] = *v;
			} else if (*v == '\n') {
				buf[o++] = '\\';
				buf[o++] = 'n';
			} else
				buf[o++] = *v;
		}
		buf[o++] = '"';
		buf[o] = '\0';
	}
	va_end(ap);
	return 0;
fail:
	va_end(ap);
	buf[0] = '\0';
	return -1;
}

/* Waits out a registrar between state 1 and 2; returns the state seen. */
static uint32_t
metrics_wait_ready(_Atomic uint32_t *state)
{
	struct timespec ms = { 0, 1000000L };
	uint32_t st;
	int i;

	for (i = 0; i < METRICS_SPIN_YIELDS + METRICS_SPIN_SLEEPS; i++) {
		st = atomic_load_explicit(state, memory_order_acquire);
		if (st != 1)
			return st;
		if (i < METRICS_SPIN_YIELDS)
			sched_yield();
		else
			nanosleep(&ms, NULL);
	}
	return 1;
}

/*
 * Open addressing by name hash: a name always probes the same sequence,
 * so two processes registering it race for the same first free slot, and
 * the loser finds the winner's entry there.
 */
static int
metrics_register(struct shm *shm, enum metrics_kind kind, const char *name)
{
	struct shm_segment *seg = shm_segment(shm);
	struct shm_series *se;
	size_t len = strlen(name);
	uint64_t h;
	uint32_t st, expect;
	unsigned i, idx;

	h = XXH3_64bits(name, len);
	for (i = 0; i < SHM_MAX_SERIES; i++) {
		idx = (unsigned)((h + i) % SHM_MAX_SERIES);
		se = &seg->sh_series[idx];
		st = atomic_load_explicit(&se->se_state, memory_order_acquire);
		if (st == 0) {
			expect = 0;
			if (atomic_compare_exchange_strong_explicit(
			        &se->se_state, &expect, 1, memory_order_acq_rel,
			        memory_order_acquire)) {
				memset(se->se_name, 0, sizeof(se->se_name));
				memcpy(se->se_name, name, len);
				se->se_kind = (uint32_t)kind;
				atomic_store_explicit(&se->se_state, 2,
				    memory_order_release);
				atomic_fetch_add_explicit(&seg->sh_series_count,
				    1, memory_order_relaxed);
				return (int)idx;
			}
			st = expect;
		}
		if (st == 1)
			st = metrics_wait_ready(&se->se_state);
		if (st == METRICS_RETIRED && strcmp(se->se_name, name) == 0 &&
		    se->se_kind == (uint32_t)kind) {
			/* Registered again: the same slot comes back. */
			expect = METRICS_RETIRED;
			(void)atomic_compare_exchange_strong_explicit(
			    &se->se_state, &expect, 2, memory_order_acq_rel,
			    memory_order_acquire);
			return (int)idx;
		}
		if (st != 2)
			continue; /* retired, or its registrar died */
		if (strcmp(se->se_name, name) != 0)
			continue;
		if (se->se_kind != (uint32_t)kind) {
			log_warnx("%s: %s registered as %s, not %s", __func__,
			    name,
			    se->se_kind <= METRICS_GAUGE_FLOAT
			        ? metrics_kind_names[se->se_kind]
			        : "?",
			    metrics_kind_names[kind]);
			return -1;
		}
		return (int)idx;
	}
	log_warnx("%s: series table full (%d), %s not registered", __func__,
	    SHM_MAX_SERIES, name);
	return -1;
}

int
metrics_series(struct shm *shm, enum metrics_kind kind, const char *family,
    const char *labels)
{
	char name[SHM_SERIES_NAME_MAX];
	int n;

	if ((unsigned)kind > METRICS_GAUGE_FLOAT) {
		log_warnx("%s: bad kind %d", __func__, (int)kind);
		return -1;
	}
	if (!metrics_valid_family(family)) {
		log_warnx("%s: bad family \"%s\"", __func__,
		    family != NULL ? family : "(null)");
		return -1;
	}
	if (!metrics_valid_labels(labels)) {
		log_warnx("%s: %s: bad labels \"%s\"", __func__, family,
		    labels);
		return -1;
	}
	if (labels == NULL || *labels == '\0')
		n = snprintf(name, sizeof(name), "%s", family);
	else
		n = snprintf(name, sizeof(name), "%s{%s}", family, labels);
	if (n < 0 || (size_t)n >= sizeof(name)) {
		log_warnx("%s: %s: name longer than %d", __func__, family,
		    SHM_SERIES_NAME_MAX - 1);
		return -1;
	}
	return metrics_register(shm, kind, name);
}

void
metrics_retire(struct shm *shm, int series)
{
	struct shm_segment *seg;
	uint32_t expect = 2;
	int row;

	if (series < 0 || series >= SHM_MAX_SERIES)
		return;
	seg = shm_segment(shm);
	for (row = 0; row < SHM_ROWS; row++)
		atomic_store_explicit(&seg->sh_values[row][series], 0,
		    memory_order_relaxed);
	(void)atomic_compare_exchange_strong_explicit(
	    &seg->sh_series[series].se_state, &expect, METRICS_RETIRED,
	    memory_order_acq_rel, memory_order_acquire);
}

void
metrics_add(struct shm *shm, int row, int series, int64_t delta)
{
	if (row < 0 || row >= SHM_ROWS || series < 0 ||
	    series >= SHM_MAX_SERIES)
		return;
	atomic_fetch_add_explicit(&shm_segment(shm)->sh_values[row][series],
	    delta, memory_order_relaxed);
}

void
metrics_set(struct shm *shm, int row, int series, int64_t value)
{
	if (row < 0 || row >= SHM_ROWS || series < 0 ||
	    series >= SHM_MAX_SERIES)
		return;
	atomic_store_explicit(&shm_segment(shm)->sh_values[row][series], value,
	    memory_order_relaxed);
}

void
metrics_set_float(struct shm *shm, int row, int series, double value)
{
	if (!isfinite(value))
		value = 0;
	metrics_set(shm, row, series, llround(value * 1e6));
}

/* Same text for the same bound in every process: the series key. */
static void
metrics_fmt_bound(char *buf, size_t len, double v)
{
	snprintf(buf, len, "%.15g", v);
}

int
metrics_histogram_init(struct shm *shm, struct metrics_histogram *h,
    const char *family, const char *labels, const double *bounds, int nbounds)
{
	char fam[SHM_SERIES_NAME_MAX], lab[SHM_SERIES_NAME_MAX], le[32];
	int i, n;

	if (bounds == NULL || nbounds == 0) {
		bounds = metrics_default_bounds;
		nbounds = (int)(sizeof(metrics_default_bounds) /
		    sizeof(metrics_default_bounds[0]));
	}
	memset(h, 0, sizeof(*h));
	h->mh_sum = h->mh_count = -1;
	if (nbounds < 0 || nbounds > METRICS_MAX_BUCKETS) {
		log_warnx("%s: %d buckets (max %d)", __func__, nbounds,
		    METRICS_MAX_BUCKETS);
		return -1;
	}
	for (i = 0; i < nbounds; i++) {
		if (!isfinite(bounds[i]) ||
		    (i > 0 && bounds[i] <= bounds[i - 1])) {
			log_warnx("%s: %s: bucket bounds must be finite and "
			          "increasing",
			    __func__, family);
			return -1;
		}
	}
	if (labels == NULL)
		labels = "";
	for (i = 0; i < nbounds; i++) {
		metrics_fmt_bound(le, sizeof(le), bounds[i]);
		n = snprintf(fam, sizeof(fam), "%s_bucket", family);
		if (n < 0 || (size_t)n >= sizeof(fam))
			return -1;
		n = snprintf(lab, sizeof(lab), "%s%sle=\"%s\"", labels,
		    *labels != '\0' ? "," : "", le);
		if (n < 0 || (size_t)n >= sizeof(lab))
			return -1;
		if ((h->mh_buckets[i] = metrics_series(shm, METRICS_HISTOGRAM,
		         fam, lab)) == -1)
			return -1;
		h->mh_bounds[i] = bounds[i];
	}
	h->mh_nbuckets = nbounds;
	n = snprintf(fam, sizeof(fam), "%s_sum", family);
	if (n < 0 || (size_t)n >= sizeof(fam) ||
	    (h->mh_sum = metrics_series(shm, METRICS_HISTOGRAM, fam, labels)) ==
	        -1)
		return -1;
	n = snprintf(fam, sizeof(fam), "%s_count", family);
	if (n < 0 || (size_t)n >= sizeof(fam) ||
	    (h->mh_count =
	            metrics_series(shm, METRICS_HISTOGRAM, fam, labels)) == -1)
		return -1;
	return 0;
}

void
metrics_observe(struct shm *shm, int row, struct metrics_histogram *h,
    double seconds)
{
	struct shm_segment *seg = shm_segment(shm);
	int64_t us;
	int i;

	if (row < 0 || row >= SHM_ROWS || h->mh_count < 0)
		return;
	if (!(seconds > 0)) /* negative or NaN */
		seconds = 0;
	if (seconds > 9e12) /* keep microseconds within int64 */
		seconds = 9e12;
	us = (int64_t)llround(seconds * 1e6);
	/*
	 * Count first, then the bucket with release: a renderer that sees
	 * the bucket sees the count, so +Inf never trails a bucket.
	 */
	atomic_fetch_add_explicit(&seg->sh_values[row][h->mh_count], 1,
	    memory_order_relaxed);
	for (i = 0; i < h->mh_nbuckets; i++) {
		if (seconds <= h->mh_bounds[i]) {
			atomic_fetch_add_explicit(
			    &seg->sh_values[row][h->mh_buckets[i]], 1,
			    memory_order_release);
			break;
		}
	}
	atomic_fetch_add_explicit(&seg->sh_values[row][h->mh_sum], us,
	    memory_order_relaxed);
}

/* ---------------------------------------------------------------- render */

static void
metrics_printf(struct metrics_buf *mb, const char *fmt, ...)
{
	va_list ap;
	size_t cap;
	char *p;
	int n;

	if (mb->mb_err)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(mb->mb_buf + mb->mb_len, mb->mb_cap - mb->mb_len,
		    fmt, ap);
		va_end(ap);
		if (n < 0) {
			mb->mb_err = 1;
			return;
		}
		if ((size_t)n < mb->mb_cap - mb->mb_len) {
			mb->mb_len += (size_t)n;
			return;
		}
		cap = mb->mb_cap * 2 + (size_t)n;
		if ((p = realloc(mb->mb_buf, cap)) == NULL) {
			mb->mb_err = 1;
			return;
		}
		mb->mb_buf = p;
		mb->mb_cap = cap;
	}
}

static void
metrics_print_seconds(struct metrics_buf *mb, int64_t us)
{
	uint64_t a = us < 0 ? (uint64_t)0 - (uint64_t)us : (uint64_t)us;

	metrics_printf(mb, "%s%llu.%06llu", us < 0 ? "-" : "",
	    (unsigned long long)(a / 1000000u),
	    (unsigned long long)(a % 1000000u));
}

/*
 * Splits me_name into family (histogram suffix stripped) and labels (the
 * le label stripped from buckets); 0, or -1 for a name we cannot read.
 */
static int
metrics_entry_parse(struct metrics_entry *me)
{
	static const char *const sfx[] = { "_bucket", "_sum", "_count" };
	const char *name = me->me_name, *brace, *le, *p;
	size_t flen, slen, lend;
	unsigned i;

	brace = strchr(name, '{');
	flen = brace != NULL ? (size_t)(brace - name) : strlen(name);
	me->me_lstart = brace != NULL ? flen + 1 : flen;
	lend = brace != NULL ? strlen(name) - 1 : flen;
	me->me_part = METRICS_PART_PLAIN;
	me->me_le = 0;
	if (me->me_kind != METRICS_HISTOGRAM) {
		me->me_flen = flen;
		me->me_llen = lend - me->me_lstart;
		return 0;
	}
	for (i = 0; i < 3; i++) {
		slen = strlen(sfx[i]);
		if (flen > slen &&
		    memcmp(name + flen - slen, sfx[i], slen) == 0)
			break;
	}
	if (i == 3)
		return -1;
	me->me_flen = flen - slen;
	if (i == 1)
		me->me_part = METRICS_PART_SUM;
	else if (i == 2)
		me->me_part = METRICS_PART_COUNT;
	if (i != 0) {
		me->me_llen = lend - me->me_lstart;
		return 0;
	}
	/* A bucket: le is the last label, added by metrics_histogram_init. */
	if (brace == NULL)
		return -1;
	le = NULL;
	for (p = brace; (p = strstr(p, "le=\"")) != NULL; p++)
		if (p[-1] == '{' || p[-1] == ',')
			le = p;
	if (le == NULL)
		return -1;
	me->me_le = strtod(le + 4, NULL);
	me->me_llen = (size_t)(le - name) - me->me_lstart;
	if (me->me_llen > 0)
		me->me_llen--; /* the ',' before le */
	return 0;
}

static int
metrics_cmp_span(const char *a, size_t alen, const char *b, size_t blen)
{
	int c;

	c = memcmp(a, b, alen < blen ? alen : blen);
	if (c != 0)
		return c;
	return alen < blen ? -1 : alen > blen ? 1 : 0;
}

static int
metrics_entry_cmp(const void *pa, const void *pb)
{
	const struct metrics_entry *a = pa, *b = pb;
	int c;

	if ((c = metrics_cmp_span(a->me_name, a->me_flen, b->me_name,
	         b->me_flen)) != 0)
		return c;
	if (a->me_kind != b->me_kind)
		return a->me_kind < b->me_kind ? -1 : 1;
	if ((c = metrics_cmp_span(a->me_name + a->me_lstart, a->me_llen,
	         b->me_name + b->me_lstart, b->me_llen)) != 0)
		return c;
	if (a->me_part != b->me_part)
		return a->me_part < b->me_part ? -1 : 1;
	if (a->me_le != b->me_le)
		return a->me_le < b->me_le ? -1 : 1;
	return strcmp(a->me_name, b->me_name);
}

static int
metrics_same_group(const struct metrics_entry *a, const struct metrics_entry *b)
{
	return a->me_kind == b->me_kind &&
	    metrics_cmp_span(a->me_name, a->me_flen, b->me_name, b->me_flen) ==
	    0 &&
	    metrics_cmp_span(a->me_name + a->me_lstart, a->me_llen,
	        b->me_name + b->me_lstart, b->me_llen) == 0;
}

/* Renders one histogram (entries i..n-1 of one group); returns its end. */
static size_t
metrics_render_histogram(struct metrics_buf *mb, const struct metrics_entry *e,
    size_t i, size_t n)
{
	const struct metrics_entry *sum = NULL, *count = NULL, *g = &e[i];
	int64_t cum = 0, total;
	size_t j, end;

	for (end = i; end < n && metrics_same_group(g, &e[end]); end++) {
		if (e[end].me_part == METRICS_PART_SUM)
			sum = &e[end];
		else if (e[end].me_part == METRICS_PART_COUNT)
			count = &e[end];
	}
	for (j = i; j < end; j++) {
		if (e[j].me_part != METRICS_PART_PLAIN)
			continue;
		cum += e[j].me_value;
		metrics_printf(mb, "%s %lld\n", e[j].me_name, (long long)cum);
	}
	total = count != NULL ? count->me_value : 0;
	if (total < cum)
		total = cum;
	metrics_printf(mb, "%.*s_bucket{%.*s%sle=\"+Inf\"} %lld\n",
	    (int)g->me_flen, g->me_name, (int)g->me_llen,
	    g->me_name + g->me_lstart, g->me_llen > 0 ? "," : "",
	    (long long)total);
	if (sum != NULL) {
		metrics_printf(mb, "%s ", sum->me_name);
		metrics_print_seconds(mb, sum->me_value);
		metrics_printf(mb, "\n");
	}
	if (count != NULL)
		metrics_printf(mb, "%s %lld\n", count->me_name,
		    (long long)total);
	return end;
}

int
metrics_render(struct shm *shm, char **out, size_t *len)
{
	struct shm_segment *seg = shm_segment(shm);
	struct metrics_entry *e, *me;
	struct metrics_buf mb = { 0 };
	const struct metrics_entry *typed = NULL;
	char help[160];
	size_t n = 0, i;
	unsigned s;
	int row;

	*out = NULL;
	*len = 0;
	if ((e = calloc(SHM_MAX_SERIES, sizeof(*e))) == NULL) {
		log_warnx("%s: out of memory", __func__);
		return -1;
	}
	for (s = 0; s < SHM_MAX_SERIES; s++) {
		if (atomic_load_explicit(&seg->sh_series[s].se_state,
		        memory_order_acquire) != 2)
			continue;
		me = &e[n];
		memcpy(me->me_name, seg->sh_series[s].se_name,
		    sizeof(me->me_name));
		me->me_name[sizeof(me->me_name) - 1] = '\0';
		me->me_kind = seg->sh_series[s].se_kind;
		if (me->me_kind > METRICS_GAUGE_FLOAT ||
		    metrics_entry_parse(me) == -1)
			continue;
		me->me_value = 0;
		for (row = 0; row < SHM_ROWS; row++)
			me->me_value += atomic_load_explicit(
			    &seg->sh_values[row][s], memory_order_acquire);
		n++;
	}
	qsort(e, n, sizeof(*e), metrics_entry_cmp);

	mb.mb_cap = 4096;
	if ((mb.mb_buf = malloc(mb.mb_cap)) == NULL) {
		free(e);
		log_warnx("%s: out of memory", __func__);
		return -1;
	}
	mb.mb_buf[0] = '\0';
	for (i = 0; i < n;) {
		if (typed == NULL ||
		    metrics_cmp_span(typed->me_name, typed->me_flen,
		        e[i].me_name, e[i].me_flen) != 0) {
			typed = &e[i];
			metrics_help(e[i].me_name, e[i].me_flen, help,
			    sizeof(help));
			metrics_printf(&mb, "# HELP %.*s %s\n",
			    (int)e[i].me_flen, e[i].me_name, help);
			metrics_printf(&mb, "# TYPE %.*s %s\n",
			    (int)e[i].me_flen, e[i].me_name,
			    metrics_kind_names[e[i].me_kind]);
		}
		if (e[i].me_kind == METRICS_HISTOGRAM) {
			i = metrics_render_histogram(&mb, e, i, n);
			continue;
		}
		if (e[i].me_kind == METRICS_GAUGE_FLOAT)
			metrics_printf(&mb, "%s %.6f\n", e[i].me_name,
			    (double)e[i].me_value / 1e6);
		else
			metrics_printf(&mb, "%s %lld\n", e[i].me_name,
			    (long long)e[i].me_value);
		i++;
	}
	free(e);
	if (mb.mb_err) {
		free(mb.mb_buf);
		log_warnx("%s: out of memory", __func__);
		return -1;
	}
	*out = mb.mb_buf;
	*len = mb.mb_len;
	return 0;
}
