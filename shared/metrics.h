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
};

/* Returns the series index, or -1 when the table is full or names bad. */
int metrics_series(struct shm *shm, enum metrics_kind kind,
    const char *family, const char *labels);
void metrics_add(struct shm *shm, int row, int series, int64_t delta);
/* Sets this row's value (gauges owned by one process, e.g. the broker). */
void metrics_set(struct shm *shm, int row, int series, int64_t value);

#define METRICS_MAX_BUCKETS 24

struct metrics_histogram {
	int mh_buckets[METRICS_MAX_BUCKETS]; /* series per upper bound */
	double mh_bounds[METRICS_MAX_BUCKETS];
	int mh_nbuckets;
	int mh_sum;	/* series, microseconds */
	int mh_count;	/* series */
};

/* Default seconds buckets, or --prometheus-duration-buckets when given. */
int metrics_histogram_init(struct shm *shm, struct metrics_histogram *h,
    const char *family, const char *labels, const double *bounds,
    int nbounds);
void metrics_observe(struct shm *shm, int row, struct metrics_histogram *h,
    double seconds);

/*
 * Renders every series in Prometheus text format (with # TYPE lines) into
 * a malloc'ed buffer; returns 0, or -1 on allocation failure.
 */
int metrics_render(struct shm *shm, char **out, size_t *len);

#endif /* SHARED_METRICS_H */
