/*
 * promload.c: a load report from an engine's Prometheus /metrics text,
 * for workers without /v1/loads (workers.md §3): the SGLang names (prefix
 * "sglang:" or "sglang_") and the vLLM names, summed (counts) or averaged
 * (ratios) over their label sets, as one synthetic rank.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/frontend.h"

/* How the label sets of one metric name combine. */
enum promload_agg {
	PROMLOAD_SUM = 0,
	PROMLOAD_MEAN,
};

struct promload_field {
	const char *pf_report; /* field of the report */
	const char *pf_metric; /* metric name after the engine prefix */
	enum promload_agg pf_agg;
};

struct promload_acc {
	double pa_sum;
	unsigned long pa_n;
};

static const struct promload_field promload_sglang[] = {
	{ "num_running_reqs", "num_running_reqs", PROMLOAD_SUM },
	{ "num_waiting_reqs", "num_queue_reqs", PROMLOAD_SUM },
	{ "token_usage", "token_usage", PROMLOAD_MEAN },
	{ "gen_throughput", "gen_throughput", PROMLOAD_MEAN },
	{ "cache_hit_rate", "cache_hit_rate", PROMLOAD_MEAN },
	{ "utilization", "utilization", PROMLOAD_MEAN },
};

/* token_usage is filled from whichever KV-usage gauge exists. */
static const struct promload_field promload_vllm[] = {
	{ "num_running_reqs", "vllm:num_requests_running", PROMLOAD_SUM },
	{ "num_waiting_reqs", "vllm:num_requests_waiting", PROMLOAD_SUM },
	{ "cache_hit_rate", "vllm:gpu_prefix_cache_hit_rate", PROMLOAD_MEAN },
};

#define PROMLOAD_VLLM_USAGE_V1 "vllm:kv_cache_usage_perc"
#define PROMLOAD_VLLM_USAGE_V0 "vllm:gpu_cache_usage_perc"

static int promload_sample(const char *, size_t, const char **, size_t *,
    double *);
static void promload_collect(const char *, size_t, const char *, size_t,
    struct promload_acc *);
static bool promload_present(const char *, size_t, const char *);
static double promload_value(const struct promload_acc *, enum promload_agg);

/*
 * One sample line: the name (*name, *nlen) and its value. The label block
 * ends at the last '}' of the line; the value is the first token after the
 * name or the labels. Returns 0, or -1 for a comment, a blank or an
 * unparsable line.
 */
static int
promload_sample(const char *line, size_t len, const char **name, size_t *nlen,
    double *value)
{
	char num[64], *end;
	size_t i = 0, n, k;
	const char *brace;

	while (i < len && (line[i] == ' ' || line[i] == '\t'))
		i++;
	if (i == len || line[i] == '#')
		return -1;
	*name = line + i;
	while (i < len && line[i] != '{' && !isspace((unsigned char)line[i]))
		i++;
	*nlen = (size_t)(line + i - *name);
	if (*nlen == 0)
		return -1;
	if (i < len && line[i] == '{') {
		brace = NULL;
		for (k = len; k > i; k--)
			if (line[k - 1] == '}') {
				brace = line + k - 1;
				break;
			}
		if (brace == NULL)
			return -1;
		i = (size_t)(brace - line) + 1;
	}
	while (i < len && isspace((unsigned char)line[i]))
		i++;
	for (n = 0; i + n < len && !isspace((unsigned char)line[i + n]); n++)
		;
	if (n == 0 || n >= sizeof(num))
		return -1;
	memcpy(num, line + i, n);
	num[n] = '\0';
	*value = strtod(num, &end);
	if (*end != '\0' || !isfinite(*value))
		return -1;
	return 0;
}

/* Accumulates every sample of metric (exact name) in text into acc. */
static void
promload_collect(const char *text, size_t len, const char *metric, size_t mlen,
    struct promload_acc *acc)
{
	const char *p = text, *e = text + len, *nl, *name;
	size_t nlen;
	double v;

	acc->pa_sum = 0;
	acc->pa_n = 0;
	while (p < e) {
		nl = memchr(p, '\n', (size_t)(e - p));
		if (nl == NULL)
			nl = e;
		if (promload_sample(p, (size_t)(nl - p), &name, &nlen, &v) ==
		        0 &&
		    nlen == mlen && memcmp(name, metric, mlen) == 0) {
			acc->pa_sum += v;
			acc->pa_n++;
		}
		p = nl + 1;
	}
}

static bool
promload_present(const char *text, size_t len, const char *metric)
{
	struct promload_acc acc;

	promload_collect(text, len, metric, strlen(metric), &acc);
	return acc.pa_n > 0;
}

static double
promload_value(const struct promload_acc *acc, enum promload_agg agg)
{
	if (acc->pa_n == 0)
		return 0;
	return agg == PROMLOAD_SUM ? acc->pa_sum
	                           : acc->pa_sum / (double)acc->pa_n;
}

cJSON *
promload_report(const char *text, size_t len)
{
	static const char *const sglang_prefixes[] = { "sglang:", "sglang_" };
	const struct promload_field *fields = NULL;
	const char *prefix = "", *usage = NULL;
	struct promload_acc acc;
	char metric[128];
	size_t nfields = 0, i;
	cJSON *rep, *loads, *rank;

	for (i = 0; i < 2 && fields == NULL; i++) {
		snprintf(metric, sizeof(metric), "%stoken_usage",
		    sglang_prefixes[i]);
		if (promload_present(text, len, metric)) {
			prefix = sglang_prefixes[i];
			fields = promload_sglang;
			nfields = sizeof(promload_sglang) /
			    sizeof(promload_sglang[0]);
		}
	}
	if (fields == NULL) {
		if (promload_present(text, len, PROMLOAD_VLLM_USAGE_V1))
			usage = PROMLOAD_VLLM_USAGE_V1;
		else if (promload_present(text, len, PROMLOAD_VLLM_USAGE_V0))
			usage = PROMLOAD_VLLM_USAGE_V0;
		else
			return NULL; /* neither engine: no report */
		fields = promload_vllm;
		nfields = sizeof(promload_vllm) / sizeof(promload_vllm[0]);
	}

	if ((rep = cJSON_CreateObject()) == NULL)
		return NULL;
	cJSON_AddNumberToObject(rep, "dp_rank_count", 1);
	loads = cJSON_AddArrayToObject(rep, "loads");
	if (loads == NULL || (rank = cJSON_CreateObject()) == NULL) {
		cJSON_Delete(rep);
		return NULL;
	}
	cJSON_AddItemToArray(loads, rank);
	cJSON_AddNumberToObject(rank, "dp_rank", 0);
	for (i = 0; i < nfields; i++) {
		snprintf(metric, sizeof(metric), "%s%s", prefix,
		    fields[i].pf_metric);
		promload_collect(text, len, metric, strlen(metric), &acc);
		cJSON_AddNumberToObject(rank, fields[i].pf_report,
		    promload_value(&acc, fields[i].pf_agg));
	}
	if (usage != NULL) {
		promload_collect(text, len, usage, strlen(usage), &acc);
		cJSON_AddNumberToObject(rank, "token_usage",
		    promload_value(&acc, PROMLOAD_MEAN));
		cJSON_AddNumberToObject(rank, "gen_throughput", 0);
	}
	return rep;
}
