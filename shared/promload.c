/*
 * promload.c: one synthetic load rank from Prometheus text (workers.md
 * §3), read in one pass over the lines into per-metric accumulators, then
 * combined for the engine whose presence gauge is there.
 */
#include "shared/promload.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* The metrics read; the accumulators are indexed by these. */
enum promload_metric {
	PM_SG_RUNNING = 0, /* SGLang, after the prefix */
	PM_SG_QUEUE,
	PM_SG_USAGE,
	PM_SG_TPUT,
	PM_SG_HIT,
	PM_SG_UTIL,
	PM_SG_N, /* per prefix */
	PM_VLLM_RUNNING = 2 * PM_SG_N,
	PM_VLLM_WAITING,
	PM_VLLM_USAGE_V1,
	PM_VLLM_USAGE_V0,
	PM_VLLM_HIT,
	PM_N,
};

#define PROMLOAD_VALUE_MAX 64 /* longest value token read, with its NUL */

struct promload_acc {
	double pa_sum;
	unsigned long pa_n;
};

/* In preference order: the first with token_usage wins. */
static const char *const promload_sglang_prefixes[2] = { "sglang:", "sglang_" };

static const char *const promload_sglang_names[PM_SG_N] = {
	"num_running_reqs",
	"num_queue_reqs",
	"token_usage",
	"gen_throughput",
	"cache_hit_rate",
	"utilization",
};

static const char *const promload_vllm_names[PM_N - PM_VLLM_RUNNING] = {
	"vllm:num_requests_running",
	"vllm:num_requests_waiting",
	"vllm:kv_cache_usage_perc",
	"vllm:gpu_cache_usage_perc",
	"vllm:gpu_prefix_cache_hit_rate",
};

static bool promload_blank(char c);
static int promload_sample(const char *line, size_t len, const char **name,
    size_t *nlen, double *value);
static bool promload_name_is(const char *name, size_t nlen, const char *want);
static int promload_metric_of(const char *name, size_t nlen);
static int64_t promload_count(const struct promload_acc *a);
static double promload_mean(const struct promload_acc *a);

/* Separators of a sample line; '\r' so that CRLF text reads the same. */
static bool
promload_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\r';
}

/*
 * One sample line: `name{labels} value [timestamp]` (the label block ends
 * at the last '}' of the line, so braces inside label values do not cut
 * it short) or `name value`. Returns 0 with the name and a finite value,
 * -1 for anything else (comments, blanks, unparsable values).
 */
static int
promload_sample(const char *line, size_t len, const char **name, size_t *nlen,
    double *value)
{
	char num[PROMLOAD_VALUE_MAX], *stop;
	size_t i = 0, end, vlen;

	while (i < len && promload_blank(line[i]))
		i++;
	if (i == len || line[i] == '#')
		return -1;
	*name = line + i;
	while (i < len && line[i] != '{' && !promload_blank(line[i]))
		i++;
	*nlen = (size_t)(line + i - *name);
	if (*nlen == 0)
		return -1;
	if (i < len && line[i] == '{') {
		for (end = len; end > i && line[end - 1] != '}'; end--)
			;
		if (end == i)
			return -1; /* unterminated label block */
		i = end;
	}
	while (i < len && promload_blank(line[i]))
		i++;
	for (vlen = 0; i + vlen < len && !promload_blank(line[i + vlen]);
	     vlen++)
		;
	if (vlen == 0 || vlen >= sizeof(num))
		return -1;
	memcpy(num, line + i, vlen);
	num[vlen] = '\0';
	*value = strtod(num, &stop);
	if (*stop != '\0' || !isfinite(*value))
		return -1;
	return 0;
}

static bool
promload_name_is(const char *name, size_t nlen, const char *want)
{
	return strlen(want) == nlen && memcmp(name, want, nlen) == 0;
}

/* The accumulator index of an exact metric name, or -1. */
static int
promload_metric_of(const char *name, size_t nlen)
{
	size_t p, m, plen;

	for (p = 0; p < 2; p++) {
		plen = strlen(promload_sglang_prefixes[p]);
		if (nlen <= plen ||
		    memcmp(name, promload_sglang_prefixes[p], plen) != 0)
			continue;
		for (m = 0; m < PM_SG_N; m++)
			if (promload_name_is(name + plen, nlen - plen,
			        promload_sglang_names[m]))
				return (int)(p * PM_SG_N + m);
	}
	for (m = 0; m < PM_N - PM_VLLM_RUNNING; m++)
		if (promload_name_is(name, nlen, promload_vllm_names[m]))
			return (int)(PM_VLLM_RUNNING + m);
	return -1;
}

/*
 * A summed count, clamped to int64. The samples are finite, so the sum is
 * finite or, once it overflows, stays at that infinity: never NaN.
 */
static int64_t
promload_count(const struct promload_acc *a)
{
	double s = a->pa_sum;

	if (s >= 9.2e18)
		return INT64_MAX;
	if (s <= -9.2e18)
		return INT64_MIN;
	return (int64_t)llround(s);
}

/* The mean over label sets; 0 when absent or when the sum overflowed. */
static double
promload_mean(const struct promload_acc *a)
{
	double m;

	if (a->pa_n == 0)
		return 0.0;
	m = a->pa_sum / (double)a->pa_n;
	return isfinite(m) ? m : 0.0;
}

int
promload_parse(const char *text, size_t len, const char *runtime,
    struct promload_report *rep)
{
	struct promload_acc acc[PM_N];
	const struct promload_acc *a;
	const char *line = text, *end, *nl, *name;
	bool try_sglang, try_vllm;
	size_t llen, nlen, p;
	double v;
	int m;

	memset(rep, 0, sizeof(*rep));
	memset(acc, 0, sizeof(acc));
	end = text != NULL ? text + len : NULL;
	while (line != end) {
		nl = memchr(line, '\n', (size_t)(end - line));
		llen = nl != NULL ? (size_t)(nl - line) : (size_t)(end - line);
		if (promload_sample(line, llen, &name, &nlen, &v) == 0 &&
		    (m = promload_metric_of(name, nlen)) >= 0) {
			acc[m].pa_sum += v;
			acc[m].pa_n++;
		}
		line = nl != NULL ? nl + 1 : end;
	}

	try_sglang = runtime == NULL || strcmp(runtime, "vllm") != 0;
	try_vllm = runtime == NULL || strcmp(runtime, "sglang") != 0;
	for (p = 0; p < 2 && try_sglang; p++) {
		a = &acc[p * PM_SG_N];
		if (a[PM_SG_USAGE].pa_n == 0)
			continue;
		rep->pr_engine = PROMLOAD_SGLANG;
		rep->pr_num_running_reqs = promload_count(&a[PM_SG_RUNNING]);
		rep->pr_num_waiting_reqs = promload_count(&a[PM_SG_QUEUE]);
		rep->pr_token_usage = promload_mean(&a[PM_SG_USAGE]);
		rep->pr_gen_throughput = promload_mean(&a[PM_SG_TPUT]);
		rep->pr_cache_hit_rate = promload_mean(&a[PM_SG_HIT]);
		rep->pr_utilization = promload_mean(&a[PM_SG_UTIL]);
		return 0;
	}
	if (try_vllm &&
	    (acc[PM_VLLM_USAGE_V1].pa_n > 0 ||
	        acc[PM_VLLM_USAGE_V0].pa_n > 0)) {
		rep->pr_engine = PROMLOAD_VLLM;
		rep->pr_num_running_reqs =
		    promload_count(&acc[PM_VLLM_RUNNING]);
		rep->pr_num_waiting_reqs =
		    promload_count(&acc[PM_VLLM_WAITING]);
		rep->pr_token_usage = acc[PM_VLLM_USAGE_V1].pa_n > 0
		    ? promload_mean(&acc[PM_VLLM_USAGE_V1])
		    : promload_mean(&acc[PM_VLLM_USAGE_V0]);
		rep->pr_cache_hit_rate = promload_mean(&acc[PM_VLLM_HIT]);
		return 0;
	}
	return -1;
}
