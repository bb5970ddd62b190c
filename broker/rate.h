/*
 * rate.h: a worker's prefill rate (tokens per second), learned online from
 * its own traffic.
 *
 * A sample is one attempt that got a first response body byte: the prompt
 * work that had to be done before that byte (the tokens still waiting on
 * the worker when the request was sent, plus the uncached part of its own
 * prompt) over the time from dispatch to that byte. The estimate is an
 * exponentially weighted mean in log space, so a rate that is off by a
 * factor is corrected by the same steps whichever way it is off:
 *   - the first sample sets it (clamped to [RATE_MIN, RATE_MAX]);
 *   - every later one moves it by alpha * d, where d is the sample's log
 *     distance from the estimate clipped to +-ln RATE_CLIP (one outlier
 *     moves the estimate by at most a factor RATE_CLIP^alpha) and alpha is
 *     1/n for the first RATE_WARMUP samples (a plain mean, fast to settle),
 *     then RATE_ALPHA (an EWMA that follows a worker that changes speed);
 *   - samples of fewer than RATE_MIN_TOKENS tokens or under RATE_MIN_US
 *     are ignored: their time is mostly fixed overhead, not prefill.
 * Before its first sample a worker has no rate of its own; the caller
 * supplies a prior (rate_get). One struct per worker, owned by its
 * registration: a re-registered worker (new generation) starts empty.
 * Pure computation: no allocation, no clock, any thread.
 */
#ifndef BROKER_RATE_H
#define BROKER_RATE_H

#include <stdbool.h>
#include <stdint.h>

#define RATE_MIN        50.0
#define RATE_MAX        1e8
#define RATE_CLIP       3.0
#define RATE_ALPHA      0.1
#define RATE_WARMUP     10
#define RATE_MIN_TOKENS 256
#define RATE_MIN_US     1000

struct rate {
	double rt_log; /* ln tokens/s, valid when rt_samples > 0 */
	uint64_t rt_samples;
	uint64_t rt_ignored;
};

void rate_init(struct rate *r);
/*
 * Adds a sample of `tokens` prefilled in `us` microseconds. Returns true
 * when it was used, false when ignored (too small or too short).
 */
bool rate_sample(struct rate *r, uint64_t tokens, uint64_t us);
/* The learned rate in tokens/s, or prior when there is no sample yet. */
double rate_get(const struct rate *r, double prior);
bool rate_known(const struct rate *r);
/*
 * Median of v[0..n) (n >= 1), reordering v; the mean of the two middle
 * values when n is even. For the fleet prior.
 */
double rate_median(double *v, unsigned n);

#endif /* BROKER_RATE_H */
