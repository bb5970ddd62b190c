/*
 * backoff.c: the retry arithmetic of gateway.md §7.1 (attempt count,
 * exponential backoff with jitter, which statuses are retried).
 */
#include <math.h>
#include <stdlib.h>

#include "frontend/frontend.h"

void
backoff_policy_from_config(struct backoff_policy *rp, const struct config *cf)
{
	rp->rp_max_attempts = cf->cf_retry_max_retries < 1
	    ? 1
	    : (unsigned)cf->cf_retry_max_retries;
	if (cf->cf_disable_retries)
		rp->rp_max_attempts = 1;
	rp->rp_initial_ms = cf->cf_retry_initial_backoff_ms;
	rp->rp_max_ms = cf->cf_retry_max_backoff_ms;
	rp->rp_multiplier = cf->cf_retry_backoff_multiplier;
	rp->rp_jitter = cf->cf_retry_jitter_factor;
}

long
backoff_ms(const struct backoff_policy *rp, unsigned attempt, double unit)
{
	double d, j;
	long base;

	d = (double)rp->rp_initial_ms * pow(rp->rp_multiplier, attempt);
	if (!(d < (double)rp->rp_max_ms))
		d = (double)rp->rp_max_ms;
	base = (long)trunc(d);
	if (unit < -1.0)
		unit = -1.0;
	if (unit > 1.0)
		unit = 1.0;
	j = round((double)base * rp->rp_jitter * unit);
	base += (long)j;
	return base < 0 ? 0 : base;
}

double
backoff_unit(void)
{
	return (double)random() / (double)RAND_MAX * 2.0 - 1.0;
}

bool
backoff_status_retryable(int status)
{
	switch (status) {
	case 408:
	case 429:
	case 500:
	case 502:
	case 503:
	case 504:
		return true;
	default:
		return false;
	}
}
