/*
 * stats.c: this frontend's metric series, registered in the shared segment
 * on first use and remembered in a local table, so the request path never
 * scans the shared series table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "frontend/frontend.h"
#include "shared/log.h"

#define STATS_SLOTS 4096 /* power of two, > SHM_MAX_SERIES / 2 */

struct stats_entry {
	uint64_t st_hash;
	char *st_key; /* family '\0' labels */
	size_t st_keylen;
	int st_series; /* counter index, or -1 for a histogram */
	struct metrics_histogram *st_hist;
};

static struct stats_entry stats_tab[STATS_SLOTS];
static unsigned stats_used;

/*
 * The series of the last request seen by a per-request call, under the
 * values their labels were made from: consecutive requests mostly share
 * them, and comparing the values costs less than formatting the labels
 * and hashing them (measured: about 3,000 instructions per request).
 */
struct stats_memo {
	char sm_key[SHM_SERIES_NAME_MAX];
	size_t sm_len; /* 0: empty */
	struct stats_entry *sm_count; /* the counter */
	struct stats_entry *sm_time; /* the histogram, once looked up */
};

static struct stats_memo stats_rr_memo, stats_http_memo;

static struct stats_entry *stats_lookup(const char *, const char *,
    enum metrics_kind);
static bool stats_memo_hit(struct stats_memo *, const char *const *, size_t);
static void stats_count(struct stats_entry *, int64_t);
static void stats_time(struct stats_entry *, double);

void
stats_init(void)
{
	memset(stats_tab, 0, sizeof(stats_tab));
	stats_used = 0;
	memset(&stats_rr_memo, 0, sizeof(stats_rr_memo));
	memset(&stats_http_memo, 0, sizeof(stats_http_memo));
}

/*
 * Whether parts (n strings) are the memo's values. On a miss the memo takes
 * them, with no series yet; a key too long for it is always a miss and
 * leaves the memo empty.
 */
static bool
stats_memo_hit(struct stats_memo *m, const char *const *parts, size_t n)
{
	char key[SHM_SERIES_NAME_MAX];
	size_t i, len = 0, pl;

	for (i = 0; i < n; i++) {
		pl = strlen(parts[i]);
		if (len + pl + 1 > sizeof(key)) {
			m->sm_len = 0;
			return false;
		}
		memcpy(key + len, parts[i], pl);
		len += pl;
		key[len++] = '\x1f'; /* in no label value we write */
	}
	if (m->sm_len == len && memcmp(m->sm_key, key, len) == 0)
		return true;
	memcpy(m->sm_key, key, len);
	m->sm_len = len;
	m->sm_count = m->sm_time = NULL;
	return false;
}

static void
stats_count(struct stats_entry *e, int64_t delta)
{
	if (e != NULL && e->st_series != -1)
		metrics_add(fe->fe_shm, fe->fe_row, e->st_series, delta);
}

static void
stats_time(struct stats_entry *e, double seconds)
{
	if (e != NULL && e->st_hist != NULL)
		metrics_observe(fe->fe_shm, fe->fe_row, e->st_hist, seconds);
}

static struct stats_entry *
stats_lookup(const char *family, const char *labels, enum metrics_kind kind)
{
	char key[SHM_SERIES_NAME_MAX * 2];
	size_t fl = strlen(family), ll = strlen(labels), klen;
	uint64_t h;
	unsigned i, n;
	struct stats_entry *e;
	const struct config *cf = fe->fe_cf;

	if (fl + ll + 2 > sizeof(key))
		return NULL;
	memcpy(key, family, fl + 1);
	memcpy(key + fl + 1, labels, ll + 1);
	klen = fl + ll + 2;
	h = XXH3_64bits(key, klen);
	for (n = 0, i = (unsigned)h & (STATS_SLOTS - 1); n < STATS_SLOTS;
	     n++, i = (i + 1) & (STATS_SLOTS - 1)) {
		e = &stats_tab[i];
		if (e->st_key == NULL)
			break;
		if (e->st_hash == h && e->st_keylen == klen &&
		    memcmp(e->st_key, key, klen) == 0)
			return e;
	}
	/* Keep the table at most three quarters full. */
	if (n == STATS_SLOTS || stats_used >= STATS_SLOTS / 4 * 3)
		return NULL;
	if ((e->st_key = malloc(klen)) == NULL)
		return NULL;
	memcpy(e->st_key, key, klen);
	e->st_keylen = klen;
	e->st_hash = h;
	e->st_series = -1;
	e->st_hist = NULL;
	if (kind == METRICS_HISTOGRAM) {
		if ((e->st_hist = calloc(1, sizeof(*e->st_hist))) == NULL ||
		    metrics_histogram_init(fe->fe_shm, e->st_hist, family,
		        labels, cf->cf_prometheus_duration_buckets,
		        (int)cf->cf_prometheus_duration_buckets_n) == -1) {
			log_warnx("%s: cannot register %s{%s}", __func__,
			    family, labels);
			free(e->st_hist);
			e->st_hist = NULL;
		}
	} else {
		e->st_series = metrics_series(fe->fe_shm, kind, family, labels);
		if (e->st_series == -1)
			log_warnx("%s: cannot register %s{%s}", __func__,
			    family, labels);
	}
	stats_used++;
	return e;
}

void
stats_add(const char *family, const char *labels, int64_t delta)
{
	struct stats_entry *e;

	if ((e = stats_lookup(family, labels, METRICS_COUNTER)) == NULL ||
	    e->st_series == -1)
		return;
	metrics_add(fe->fe_shm, fe->fe_row, e->st_series, delta);
}

void
stats_observe(const char *family, const char *labels, double seconds)
{
	struct stats_entry *e;

	if ((e = stats_lookup(family, labels, METRICS_HISTOGRAM)) == NULL ||
	    e->st_hist == NULL)
		return;
	metrics_observe(fe->fe_shm, fe->fe_row, e->st_hist, seconds);
}

void
stats_router_request(const char *backend, const char *model,
    const char *endpoint, bool streaming, bool ok, double seconds)
{
	const char *parts[] = { backend, model, endpoint,
		streaming ? "true" : "false" };
	struct stats_memo *m = &stats_rr_memo;
	char labels[SHM_SERIES_NAME_MAX];
	bool hit = stats_memo_hit(m, parts, 4);

	if (!hit || m->sm_count == NULL) {
		snprintf(labels, sizeof(labels),
		    "router_type=\"http\",backend_type=\"%s\","
		    "connection_mode=\"http\",model=\"%s\",endpoint=\"%s\","
		    "streaming=\"%s\"",
		    backend, model, endpoint, parts[3]);
		m->sm_count = stats_lookup("smg_router_requests_total", labels,
		    METRICS_COUNTER);
	}
	stats_count(m->sm_count, 1);
	if (!ok)
		return;
	if (m->sm_time == NULL) {
		snprintf(labels, sizeof(labels),
		    "router_type=\"http\",backend_type=\"%s\","
		    "connection_mode=\"http\",model=\"%s\",endpoint=\"%s\"",
		    backend, model, endpoint);
		m->sm_time = stats_lookup("smg_router_request_duration_seconds",
		    labels, METRICS_HISTOGRAM);
	}
	stats_time(m->sm_time, seconds);
	if (m->sm_len == 0) /* not memoised: nothing may outlive the call */
		m->sm_count = m->sm_time = NULL;
}

void
stats_router_error(const char *backend, const char *model, const char *endpoint,
    const char *error_type)
{
	char labels[SHM_SERIES_NAME_MAX];

	snprintf(labels, sizeof(labels),
	    "router_type=\"http\",backend_type=\"%s\","
	    "connection_mode=\"http\",model=\"%s\",endpoint=\"%s\","
	    "error_type=\"%s\"",
	    backend, model, endpoint, error_type);
	stats_add("smg_router_request_errors_total", labels, 1);
}

static const char *const stats_paths[] = {
	"/generate",
	"/v1/chat/completions",
	"/v1/completions",
	"/v1/embeddings",
	"/v1/rerank",
	"/rerank",
	"/v1/classify",
	"/v1/messages",
	"/v1/responses",
	"/health",
	"/liveness",
	"/readiness",
	"/v1/models",
	"/get_model_info",
	"/get_server_info",
	"/health_generate",
	"/flush_cache",
	"/get_loads",
	"/workers",
	"/metrics",
};

const char *
stats_path_label(const char *path)
{
	size_t i;

	for (i = 0; i < sizeof(stats_paths) / sizeof(stats_paths[0]); i++)
		if (strcmp(path, stats_paths[i]) == 0)
			return stats_paths[i];
	if (strncmp(path, "/workers/", 9) == 0)
		return "/workers/{id}";
	return "other";
}

const char *
stats_method_label(const struct http_request *hr)
{
	switch (hr->hr_method) {
	case HTTP_GET:
	case HTTP_POST:
	case HTTP_PUT:
	case HTTP_DELETE:
	case HTTP_PATCH:
	case HTTP_HEAD:
		return hr->hr_method_str;
	default:
		return "other";
	}
}

void
stats_http_response(const char *method, const char *path, int status,
    const char *error_code, double seconds)
{
	char labels[200], st[HTTP_U64_DIGITS + 2];
	const char *parts[] = { method, path, st,
		error_code != NULL ? error_code : "" };
	struct stats_memo *m = &stats_http_memo;

	if (status >= 0)
		(void)http_fmt_u64(st, (uint64_t)status);
	else
		snprintf(st, sizeof(st), "%d", status);
	if (!stats_memo_hit(m, parts, 4) || m->sm_count == NULL) {
		/* SMG's labels: the method is on the request series only. */
		snprintf(labels, sizeof(labels),
		    "path=\"%s\",status_code=\"%s\",error_code=\"%s\"", path,
		    st, parts[3]);
		m->sm_count = stats_lookup("smg_http_responses_total", labels,
		    METRICS_COUNTER);
	}
	stats_count(m->sm_count, 1);
	if (seconds >= 0) {
		if (m->sm_time == NULL) {
			snprintf(labels, sizeof(labels),
			    "method=\"%s\",path=\"%s\"", method, path);
			m->sm_time =
			    stats_lookup("smg_http_request_duration_seconds",
			        labels, METRICS_HISTOGRAM);
		}
		stats_time(m->sm_time, seconds);
	}
	if (m->sm_len == 0)
		m->sm_count = m->sm_time = NULL;
}

void
stats_gauge_set(const char *family, const char *labels, int64_t value)
{
	struct stats_entry *e;

	if ((e = stats_lookup(family, labels, METRICS_GAUGE)) == NULL ||
	    e->st_series == -1)
		return;
	metrics_set(fe->fe_shm, fe->fe_row, e->st_series, value);
}

void
stats_worker_error(unsigned slot, uint32_t generation, int status,
    bool transport_error)
{
	static const char *const types[] = { "regular", "prefill", "decode",
		"encode" };
	struct shm_worker w;
	char labels[160];

	if (shm_worker_read(fe->fe_shm, slot, &w) == -1 ||
	    w.sw_generation != generation)
		return;
	snprintf(labels, sizeof(labels),
	    "worker_type=\"%s\",connection_mode=\"http\",error_type=\"%s\"",
	    w.sw_type < 4 ? types[w.sw_type] : "regular",
	    !transport_error && (status == 408 || status == 504)
	        ? "timeout"
	        : "backend_error");
	stats_add("smg_worker_errors_total", labels, 1);
}
