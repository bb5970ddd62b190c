/*
 * loads.c: reading /v1/loads answers (see loads.h).
 */
#include <math.h>
#include <stdint.h>

#include "shared/loads.h"

static double loads_num(const cJSON *o, const char *name);
static int64_t loads_int(const cJSON *o, const char *name);

static double
loads_num(const cJSON *o, const char *name)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, name);

	if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
		return 0.0;
	return it->valuedouble;
}

static int64_t
loads_int(const cJSON *o, const char *name)
{
	double v = loads_num(o, name);

	/* Clamp into int64 before converting (UB beyond). */
	if (v >= 9.2e18)
		return INT64_MAX;
	if (v <= -9.2e18)
		return INT64_MIN;
	return (int64_t)v;
}

enum loads_answer
loads_classify(int status, bool whole, const char *body, size_t len,
    cJSON **doc)
{
	cJSON *root;
	const cJSON *loads, *it;
	bool ranked = false;

	if (doc != NULL)
		*doc = NULL;
	if (status == 404 || status == 405 || status == 501)
		return LOADS_ABSENT;
	if (status < 200 || status > 299 || !whole)
		return LOADS_FAILED;
	if (body == NULL || len == 0 ||
	    (root = cJSON_ParseWithLength(body, len)) == NULL)
		return LOADS_ABSENT;
	loads = cJSON_GetObjectItemCaseSensitive(root, "loads");
	if (!cJSON_IsObject(root) || !cJSON_IsArray(loads)) {
		cJSON_Delete(root);
		return LOADS_ABSENT;
	}
	cJSON_ArrayForEach(it, loads)
	{
		if (cJSON_IsObject(it))
			ranked = true;
	}
	if (ranked && doc != NULL)
		*doc = root;
	else
		cJSON_Delete(root);
	return ranked ? LOADS_REPORT : LOADS_EMPTY;
}

size_t
loads_ranks(const cJSON *doc, Smg__RankLoad *ranks, size_t max)
{
	const cJSON *loads, *it, *dp;
	Smg__RankLoad *r;
	size_t k = 0, pos = 0;

	loads = cJSON_GetObjectItemCaseSensitive(doc, "loads");
	cJSON_ArrayForEach(it, loads)
	{
		pos++;
		if (!cJSON_IsObject(it) || k >= max)
			continue;
		r = &ranks[k++];
		smg__rank_load__init(r);
		dp = cJSON_GetObjectItemCaseSensitive(it, "dp_rank");
		r->dp_rank = cJSON_IsNumber(dp) && dp->valuedouble >= 0 &&
		        dp->valuedouble < 1e6
		    ? (int32_t)dp->valuedouble
		    : (int32_t)(pos - 1);
		r->num_running_reqs = loads_int(it, "num_running_reqs");
		r->num_waiting_reqs = loads_int(it, "num_waiting_reqs");
		r->num_waiting_uncached_tokens =
		    loads_int(it, "num_waiting_uncached_tokens");
		r->num_total_reqs = loads_int(it, "num_total_reqs");
		r->num_used_tokens = loads_int(it, "num_used_tokens");
		r->max_total_num_tokens = loads_int(it, "max_total_num_tokens");
		r->token_usage = loads_num(it, "token_usage");
		r->gen_throughput = loads_num(it, "gen_throughput");
		r->cache_hit_rate = loads_num(it, "cache_hit_rate");
		r->utilization = loads_num(it, "utilization");
		r->max_running_requests = loads_int(it, "max_running_requests");
	}
	return k;
}

double
loads_used_tokens(const cJSON *doc)
{
	const cJSON *loads, *r;
	double used = 0;
	bool sized = false;

	loads = cJSON_GetObjectItemCaseSensitive(doc, "loads");
	cJSON_ArrayForEach(r, loads)
	{
		used += loads_num(r, "num_used_tokens");
		if (loads_num(r, "max_total_num_tokens") > 0)
			sized = true;
	}
	return sized ? used : -1;
}
