/* rate.c: the per-worker prefill-rate learner of rate.h. */
#include <math.h>
#include <stdlib.h>

#include "rate.h"

static int rate_cmp(const void *a, const void *b);

void
rate_init(struct rate *r)
{
	r->rt_log = 0;
	r->rt_samples = 0;
	r->rt_ignored = 0;
}

bool
rate_sample(struct rate *r, uint64_t tokens, uint64_t us)
{
	double s, d, alpha, lo = log(RATE_MIN), hi = log(RATE_MAX);

	if (tokens < RATE_MIN_TOKENS || us < RATE_MIN_US) {
		r->rt_ignored++;
		return false;
	}
	s = log((double)tokens * 1e6 / (double)us);
	if (s < lo)
		s = lo;
	if (s > hi)
		s = hi;
	if (r->rt_samples++ == 0) {
		r->rt_log = s;
		return true;
	}
	d = s - r->rt_log;
	if (d > log(RATE_CLIP))
		d = log(RATE_CLIP);
	if (d < -log(RATE_CLIP))
		d = -log(RATE_CLIP);
	alpha = r->rt_samples <= RATE_WARMUP ? 1.0 / (double)r->rt_samples
	                                     : RATE_ALPHA;
	r->rt_log += alpha * d;
	return true;
}

double
rate_get(const struct rate *r, double prior)
{
	return r->rt_samples > 0 ? exp(r->rt_log) : prior;
}

bool
rate_known(const struct rate *r)
{
	return r->rt_samples > 0;
}

static int
rate_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

double
rate_median(double *v, unsigned n)
{
	qsort(v, n, sizeof(*v), rate_cmp);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
