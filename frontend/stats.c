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

static struct stats_entry *stats_lookup(const char *, const char *,
    enum metrics_kind);

void
stats_init(void)
{
	memset(stats_tab, 0, sizeof(stats_tab));
	stats_used = 0;
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
	char labels[SHM_SERIES_NAME_MAX];

	snprintf(labels, sizeof(labels),
	    "router_type=\"http\",backend_type=\"%s\","
	    "connection_mode=\"http\",model=\"%s\",endpoint=\"%s\","
	    "streaming=\"%s\"",
	    backend, model, endpoint, streaming ? "true" : "false");
	stats_add("smg_router_requests_total", labels, 1);
	if (!ok)
		return;
	snprintf(labels, sizeof(labels),
	    "router_type=\"http\",backend_type=\"%s\","
	    "connection_mode=\"http\",model=\"%s\",endpoint=\"%s\"",
	    backend, model, endpoint);
	stats_observe("smg_router_request_duration_seconds", labels, seconds);
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
	char labels[200];

	/* SMG's labels: the method is on the request series only. */
	snprintf(labels, sizeof(labels),
	    "path=\"%s\",status_code=\"%d\",error_code=\"%s\"", path, status,
	    error_code != NULL ? error_code : "");
	stats_add("smg_http_responses_total", labels, 1);
	if (seconds < 0)
		return;
	snprintf(labels, sizeof(labels), "method=\"%s\",path=\"%s\"", method,
	    path);
	stats_observe("smg_http_request_duration_seconds", labels, seconds);
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
