/*
 * metrics.h: Prometheus series kept in shared memory.
 *
 * A series is a family name plus a label set ("smg_x_total" and
 * "worker=\"http://a\",status=\"200\""). Any process registers a series
 * once (metrics_series returns its index; cache it) and then adds to its
 * own row's column with atomics only. The renderer sums a series over all
 * rows, so counters survive the restart of the process that incremented
 * them (a restarted frontend takes over a row and keeps adding).
 * Registration is lock-free (CAS on the series table) and idempotent: the
 * same name and labels give the same index in every process.
 *
 * Histograms: metrics_histogram_init registers one series per bucket
 * (cumulative on render) plus _sum (in microseconds internally, rendered in
 * seconds) and _count.
 */
#ifndef SHARED_METRICS_H
#define SHARED_METRICS_H

#include <stddef.h>
#include <stdint.h>

struct shm;

enum metrics_kind {
	METRICS_COUNTER = 0,
	METRICS_GAUGE,
	METRICS_HISTOGRAM,
	METRICS_GAUGE_FLOAT, /* a gauge stored in millionths (ratios, rates) */
};

/*
 * Returns the series index, or -1 (logged) when the table is full, the
 * name does not fit SHM_SERIES_NAME_MAX, the same name was registered
 * with another kind, or family/labels are malformed. family must match
 * [a-zA-Z_:][a-zA-Z0-9_:]*; labels (NULL or "" for none) is the text
 * between the braces, k="v",k2="v2", with values already escaped: build
 * it with metrics_labels, which escapes.
 */
int metrics_series(struct shm *shm, enum metrics_kind kind, const char *family,
    const char *labels);

/*
 * Builds label text for metrics_series from (name, value) string pairs
 * ended by a NULL name, escaping \, " and newline in values (a NULL value
 * is ""). Returns 0, or -1 when a name is invalid or buf is too small.
 * Example: metrics_labels(buf, sizeof(buf), "worker", url, NULL).
 */
int metrics_labels(char *buf, size_t len, ...);
void metrics_add(struct shm *shm, int row, int series, int64_t delta);
/*
 * Hides a series from /metrics and zeroes it in every row, for a label
 * value that no longer exists (a model renamed once discovered). The slot
 * stays taken: registering the same name and kind again brings it back
 * (at 0) under the same index. Owned-gauge series only: a counter other
 * processes add to would lose their counts.
 */
void metrics_retire(struct shm *shm, int series);
/* Sets this row's value (gauges owned by one process, e.g. the broker). */
void metrics_set(struct shm *shm, int row, int series, int64_t value);
/*
 * Sets a METRICS_GAUGE_FLOAT series: the value is kept in millionths and
 * rendered as a decimal, so ratios like KV usage keep six digits.
 */
void metrics_set_float(struct shm *shm, int row, int series, double value);

#define METRICS_MAX_BUCKETS 24

struct metrics_histogram {
	int mh_buckets[METRICS_MAX_BUCKETS]; /* series per upper bound */
	double mh_bounds[METRICS_MAX_BUCKETS];
	int mh_nbuckets;
	int mh_sum; /* series, microseconds */
	int mh_count; /* series */
};

/*
 * Registers a histogram: bounds (seconds, finite, strictly increasing, at
 * most METRICS_MAX_BUCKETS) or, when bounds is NULL or nbounds 0, the
 * default 0.001 ... 300 s. Pass --prometheus-duration-buckets here when
 * given. Returns 0, or -1 (logged) as metrics_series does.
 * metrics_observe counts one observation in the caller's row; a negative
 * or NaN duration counts as 0.
 */
int metrics_histogram_init(struct shm *shm, struct metrics_histogram *h,
    const char *family, const char *labels, const double *bounds, int nbounds);
void metrics_observe(struct shm *shm, int row, struct metrics_histogram *h,
    double seconds);

/*
 * Renders every series in Prometheus text format into a malloc'ed,
 * NUL-terminated buffer (*len excludes the NUL; the caller frees it);
 * returns 0, or -1 on allocation failure. Values are summed over all rows.
 * Families come sorted by name, each after one # TYPE line, series sorted
 * by labels; a histogram shows cumulative _bucket lines in le order ending
 * with le="+Inf", then _sum in seconds and _count.
 */
int metrics_render(struct shm *shm, char **out, size_t *len);

#endif /* SHARED_METRICS_H */
