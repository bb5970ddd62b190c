/*
 * promload.h: one synthetic load rank from an engine's Prometheus /metrics
 * text, for workers without /v1/loads (workers.md §3).
 *
 * SGLang names carry the prefix "sglang:" (<= v0.5.3) or "sglang_"
 * (>= v0.5.4); the one whose token_usage is present is used, "sglang:"
 * first. vLLM names are fixed; its KV-usage gauge is
 * vllm:kv_cache_usage_perc (v1), else vllm:gpu_cache_usage_perc (v0).
 * The label sets of one name are summed (request counts) or averaged
 * (ratios and throughput). Comment, blank and unparsable lines, and
 * non-finite values (NaN, +Inf, overflow), are skipped.
 */
#ifndef SHARED_PROMLOAD_H
#define SHARED_PROMLOAD_H

#include <stddef.h>
#include <stdint.h>

/* Whose names filled the report. */
enum promload_engine {
	PROMLOAD_SGLANG = 0,
	PROMLOAD_VLLM,
};

/*
 * The report fields of workers.md §3; a metric absent from the text reads
 * 0. No absolute token counts exist in this source, so there are none
 * here. Every double is finite.
 */
struct promload_report {
	enum promload_engine pr_engine;
	int64_t pr_num_running_reqs; /* summed, rounded, clamped to int64 */
	int64_t pr_num_waiting_reqs; /* SGLang num_queue_reqs */
	double pr_token_usage; /* mean */
	double pr_gen_throughput; /* mean; vLLM exports none: 0 */
	double pr_cache_hit_rate; /* mean */
	double pr_utilization; /* mean; vLLM exports none: 0 */
};

/*
 * Reads text[0..len) (need not be NUL-terminated) into *rep. runtime
 * "sglang" or "vllm" restricts the names tried to that engine; NULL, ""
 * or any other value tries SGLang, then vLLM. Returns 0 with *rep filled,
 * or -1 when no tried engine's presence gauge (SGLang <p>token_usage,
 * vLLM KV usage) has a sample: no report, *rep zeroed. Pure function:
 * no allocation, no logging; safe on any input.
 */
int promload_parse(const char *text, size_t len, const char *runtime,
    struct promload_report *rep);

#endif /* SHARED_PROMLOAD_H */
