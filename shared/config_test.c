/* config_test.c: unit tests of the command-line parser (shared/config.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shared/config.h"
#include "shared/url.h"

#define MAX_ARGS 64

/* Splits line on single spaces into argv after the program name "smg". */
static enum config_result
parse_line(struct config *cf, const char *line, char *err, size_t errlen)
{
	char *argv[MAX_ARGS], *copy, *tok, *save;
	enum config_result rc;
	int argc;

	copy = strdup(line);
	assert_non_null(copy);
	argc = 0;
	argv[argc++] = "smg";
	for (tok = strtok_r(copy, " ", &save); tok != NULL;
	     tok = strtok_r(NULL, " ", &save)) {
		assert_true(argc < MAX_ARGS - 1);
		argv[argc++] = tok;
	}
	argv[argc] = NULL;
	rc = config_parse(cf, argc, argv, err, errlen);
	free(copy);
	return rc;
}

/* Parses a line that must be accepted. */
static void
parse_ok(struct config *cf, const char *line)
{
	char err[512];

	if (parse_line(cf, line, err, sizeof(err)) != CONFIG_OK)
		fail_msg("'%s' rejected: %s", line, err);
}

static void
test_defaults(void **state)
{
	struct config cf;

	(void)state;
	parse_ok(&cf, "");
	assert_string_equal(cf.cf_host, "0.0.0.0");
	assert_int_equal(cf.cf_port, 30000);
	assert_string_equal(cf.cf_prometheus_host, "0.0.0.0");
	assert_int_equal(cf.cf_prometheus_port, 29000);
	assert_int_equal(cf.cf_prometheus_duration_buckets_n, 0);
	assert_false(cf.cf_health_check_port_set);
	assert_int_equal(cf.cf_worker_urls_n, 0);
	assert_null(cf.cf_worker_urls);
	assert_false(cf.cf_pd_disaggregation);
	assert_false(cf.cf_epd_disaggregation);
	assert_int_equal(cf.cf_policy, POLICY_CACHE_AWARE);
	assert_int_equal(cf.cf_prefill_policy, POLICY_CACHE_AWARE);
	assert_false(cf.cf_prefill_policy_set);
	assert_int_equal(cf.cf_decode_policy, POLICY_CACHE_AWARE);
	assert_false(cf.cf_decode_policy_set);
	assert_int_equal(cf.cf_encode_policy, POLICY_CONSISTENT_HASHING);
	assert_false(cf.cf_encode_policy_set);
	assert_int_equal(cf.cf_worker_startup_timeout_secs, 1800);
	assert_int_equal(cf.cf_worker_startup_delay, 0);
	assert_int_equal(cf.cf_worker_startup_check_interval, 30);
	assert_false(cf.cf_enable_igw);
	assert_null(cf.cf_model_path);
	assert_null(cf.cf_backend);
	assert_int_equal(cf.cf_upstream_pool_idle_timeout_secs, 3);
	assert_int_equal(cf.cf_job_queue_capacity, 1000);
	assert_int_equal(cf.cf_job_queue_concurrency, 200);
	assert_true(cf.cf_cache_threshold == 0.3);
	assert_int_equal(cf.cf_balance_abs_threshold, 64);
	assert_true(cf.cf_balance_rel_threshold == 1.5);
	assert_true(cf.cf_balance_token_usage_threshold == 1.0);
	assert_true(cf.cf_overload_token_usage_threshold == 1.0);
	assert_true(cf.cf_overlap_decay == 0.0);
	assert_true(cf.cf_selection_temperature == 0.0);
	assert_int_equal(cf.cf_eviction_interval, 120);
	assert_true(cf.cf_max_tree_size == 67108864);
	assert_int_equal(cf.cf_block_size, 16);
	assert_int_equal(cf.cf_cache_boundaries_n, 0);
	assert_int_equal(cf.cf_cache_index, CACHE_INDEX_TREE);
	assert_int_equal(cf.cf_cache_ttl_secs, 180);
	assert_false(cf.cf_kv_indexer_ttl_secs_set);
	assert_false(cf.cf_kv_indexer_max_entries_set);
	assert_int_equal(cf.cf_max_idle_secs, 14400);
	assert_int_equal(cf.cf_assignment_mode, ASSIGNMENT_MODE_RANDOM);
	assert_false(cf.cf_assignment_mode_set);
	assert_int_equal(cf.cf_prefix_token_count, 256);
	assert_true(cf.cf_prefix_hash_load_factor == 1.25);
	assert_int_equal(cf.cf_prefix_hash_balance_abs_threshold, 10);
	assert_true(cf.cf_least_load_kv_pressure_weight == 0.15);
	assert_true(cf.cf_least_load_default_throughput == 2000.0);
	assert_int_equal(cf.cf_least_load_mean_prefill_tokens, 1024);
	assert_int_equal(cf.cf_least_load_max_waiting_requests, 0);
	assert_false(cf.cf_routing_key_override);
	assert_int_equal(cf.cf_routing_key_headers_n, 1);
	assert_string_equal(cf.cf_routing_key_headers[0], "x-smg-routing-key");
	assert_int_equal(cf.cf_load_monitor_interval, 10);
	assert_false(cf.cf_worker_overload_protection);
	assert_false(cf.cf_worker_overload_waiting_requests_set);
	assert_false(cf.cf_worker_overload_token_usage_set);
	assert_int_equal(cf.cf_health_failure_threshold, 3);
	assert_int_equal(cf.cf_health_success_threshold, 2);
	assert_int_equal(cf.cf_health_check_timeout_secs, 5);
	assert_int_equal(cf.cf_health_check_interval_secs, 60);
	assert_string_equal(cf.cf_health_check_endpoint, "/health");
	assert_false(cf.cf_disable_health_check);
	assert_false(cf.cf_remove_unhealthy_workers);
	assert_int_equal(cf.cf_drain_settle_secs, 5);
	assert_int_equal(cf.cf_retry_max_retries, 5);
	assert_int_equal(cf.cf_retry_initial_backoff_ms, 50);
	assert_int_equal(cf.cf_retry_max_backoff_ms, 30000);
	assert_true(cf.cf_retry_backoff_multiplier == 1.5);
	assert_true(cf.cf_retry_jitter_factor == 0.2);
	assert_int_equal(cf.cf_cb_failure_threshold, 10);
	assert_int_equal(cf.cf_cb_success_threshold, 3);
	assert_int_equal(cf.cf_cb_timeout_duration_secs, 60);
	assert_int_equal(cf.cf_cb_window_duration_secs, 120);
	assert_int_equal(cf.cf_request_timeout_secs, 1800);
	assert_true(cf.cf_max_payload_size == 536870912);
	assert_true(cf.cf_max_buffered_request_bytes == 0);
	assert_int_equal(cf.cf_stream_body_stall_timeout_secs, 300);
	assert_int_equal(cf.cf_shutdown_grace_period_secs, 180);
	assert_int_equal(cf.cf_max_concurrent_requests, -1);
	assert_int_equal(cf.cf_queue_size, 100);
	assert_int_equal(cf.cf_queue_timeout_secs, 60);
	assert_false(cf.cf_rate_limit_tokens_per_second_set);
	assert_int_equal(cf.cf_request_id_headers_n, 4);
	assert_string_equal(cf.cf_request_id_headers[0], "x-request-id");
	assert_string_equal(cf.cf_request_id_headers[1], "x-correlation-id");
	assert_string_equal(cf.cf_request_id_headers[2], "x-trace-id");
	assert_string_equal(cf.cf_request_id_headers[3], "request-id");
	assert_null(cf.cf_api_key);
	assert_int_equal(cf.cf_log_level, LOG_LEVEL_INFO);
	assert_int_equal(cf.cf_service_discovery_port, 80);
	assert_null(cf.cf_tls_cert_path);
	assert_int_equal(cf.cf_ca_cert_paths_n, 0);
	assert_true(cf.cf_frontends >= 1 && cf.cf_frontends <= 64);
	assert_string_equal(cf.cf_state_dir, "/var/tmp/smg-30000");
	assert_string_equal(cf.cf_run_dir, "/tmp/smg-30000");
	assert_int_equal(cf.cf_frontend_slot, -1);
	assert_false(cf.cf_check_config);
	assert_int_equal(cf.cf_argc, 0);
	assert_null(cf.cf_argv[0]);
	config_free(&cf);
	assert_null(cf.cf_host);
	config_free(&cf); /* twice: the struct is zeroed */
}

static void
test_aliases(void **state)
{
	struct config cf;

	(void)state;
	parse_ok(&cf,
	    "--cache-match-threshold 0.7 --spill-abs-threshold 5 "
	    "--spill-rel-threshold 2.5 --sticky-key-idle-secs 60 "
	    "--sticky-sessions --worker-auto-recovery --model m1 "
	    "--runtime VLLM --stream-request-bodies-over 4096 -n");
	assert_true(cf.cf_cache_threshold == 0.7);
	assert_int_equal(cf.cf_balance_abs_threshold, 5);
	assert_true(cf.cf_balance_rel_threshold == 2.5);
	assert_int_equal(cf.cf_max_idle_secs, 60);
	assert_true(cf.cf_routing_key_override);
	assert_true(cf.cf_remove_unhealthy_workers);
	assert_string_equal(cf.cf_model_path, "m1");
	assert_string_equal(cf.cf_backend, "vllm");
	assert_true(cf.cf_max_buffered_request_bytes == 4096);
	assert_true(cf.cf_check_config);
	/* sticky override without --assignment-mode: delegate */
	assert_int_equal(cf.cf_assignment_mode, ASSIGNMENT_MODE_DELEGATE);
	config_free(&cf);

	parse_ok(&cf,
	    "--cache-threshold 0.1 --balance-abs-threshold 1 "
	    "--balance-rel-threshold 1.0 --max-idle-secs 0 "
	    "--routing-key-override --remove-unhealthy-workers "
	    "--model-path /m --backend sglang --max-buffered-request-bytes 1 "
	    "--check-config");
	assert_true(cf.cf_cache_threshold == 0.1);
	assert_int_equal(cf.cf_balance_abs_threshold, 1);
	assert_int_equal(cf.cf_max_idle_secs, 0);
	assert_string_equal(cf.cf_model_path, "/m");
	assert_true(cf.cf_max_buffered_request_bytes == 1);
	config_free(&cf);
}

static void
test_launch_start(void **state)
{
	struct config cf;
	char *argv1[] = { "smg", "launch", "--port", "8080", NULL };
	char *argv2[] = { "/usr/bin/smg", "start", "--policy", "random", NULL };
	char *argv3[] = { "smg", NULL };
	char err[256];

	(void)state;
	assert_int_equal(config_parse(&cf, 4, argv1, err, sizeof(err)),
	    CONFIG_OK);
	assert_int_equal(cf.cf_port, 8080);
	assert_int_equal(cf.cf_argc, 2);
	assert_string_equal(cf.cf_argv[0], "--port");
	assert_string_equal(cf.cf_argv[1], "8080");
	assert_null(cf.cf_argv[2]);
	assert_string_equal(cf.cf_run_dir, "/tmp/smg-8080");
	assert_string_equal(cf.cf_state_dir, "/var/tmp/smg-8080");
	config_free(&cf);
	assert_int_equal(config_parse(&cf, 4, argv2, err, sizeof(err)),
	    CONFIG_OK);
	assert_int_equal(cf.cf_policy, POLICY_RANDOM);
	assert_int_equal(cf.cf_argc, 2);
	config_free(&cf);
	assert_int_equal(config_parse(&cf, 1, argv3, err, sizeof(err)),
	    CONFIG_OK);
	config_free(&cf);
	/* only the first word counts as the subcommand */
	assert_int_equal(parse_line(&cf, "--port 1 launch", err, sizeof(err)),
	    CONFIG_ERROR);
	assert_string_equal(err, "'launch': unexpected argument");
}

static void
test_equals_form(void **state)
{
	struct config cf;

	(void)state;
	parse_ok(&cf,
	    "--port=8081 --policy=manual --cache-threshold=0.5 "
	    "--worker-urls=http://a:1 http://b:2 --dp-aware=true "
	    "--upstream-http2=false --api-key=k=v --log-level=debug "
	    "--assignment-mode=min_group");
	assert_int_equal(cf.cf_port, 8081);
	assert_int_equal(cf.cf_policy, POLICY_MANUAL);
	assert_true(cf.cf_cache_threshold == 0.5);
	assert_int_equal(cf.cf_worker_urls_n, 2);
	assert_true(cf.cf_dp_aware);
	assert_false(cf.cf_upstream_http2);
	assert_string_equal(cf.cf_api_key, "k=v");
	assert_int_equal(cf.cf_log_level, LOG_LEVEL_DEBUG);
	assert_int_equal(cf.cf_assignment_mode, ASSIGNMENT_MODE_MIN_GROUP);
	assert_true(cf.cf_assignment_mode_set);
	config_free(&cf);
}

static void
test_lists(void **state)
{
	struct config cf;

	(void)state;
	parse_ok(&cf,
	    "--worker-urls http://a:8000 https://b grpc://c:1 --port 9 "
	    "--worker-urls ipc:///tmp/w.sock grpcs://[::1]:5 "
	    "--routing-key-headers X-Tenant x-session "
	    "--request-id-headers X-Req "
	    "--cache-boundaries 2048,8192 --prometheus-duration-buckets 0.1 "
	    "0.5,1 2.5 --ca-cert-paths /a.pem /b.pem "
	    "--selector app=w tier=gpu --decode-selector role=d "
	    "--model-alias gpt=llama-3 fast=llama-3-8b --model-alias x=y");
	assert_int_equal(cf.cf_worker_urls_n, 5);
	assert_string_equal(cf.cf_worker_urls[0], "http://a:8000");
	assert_string_equal(cf.cf_worker_urls[2], "grpc://c:1");
	assert_string_equal(cf.cf_worker_urls[4], "grpcs://[::1]:5");
	assert_int_equal(cf.cf_port, 9);
	assert_int_equal(cf.cf_routing_key_headers_n, 2);
	assert_string_equal(cf.cf_routing_key_headers[0], "x-tenant");
	assert_string_equal(cf.cf_routing_key_headers[1], "x-session");
	assert_int_equal(cf.cf_request_id_headers_n, 1);
	assert_string_equal(cf.cf_request_id_headers[0], "x-req");
	assert_int_equal(cf.cf_cache_boundaries_n, 2);
	assert_int_equal(cf.cf_cache_boundaries[0], 2048);
	assert_int_equal(cf.cf_cache_boundaries[1], 8192);
	assert_int_equal(cf.cf_prometheus_duration_buckets_n, 4);
	assert_true(cf.cf_prometheus_duration_buckets[1] == 0.5);
	assert_true(cf.cf_prometheus_duration_buckets[3] == 2.5);
	assert_int_equal(cf.cf_ca_cert_paths_n, 2);
	assert_int_equal(cf.cf_selector_n, 2);
	assert_string_equal(cf.cf_selector[1], "tier=gpu");
	assert_int_equal(cf.cf_decode_selector_n, 1);
	assert_int_equal(cf.cf_model_alias_n, 3);
	assert_string_equal(cf.cf_model_alias[0].ca_alias, "gpt");
	assert_string_equal(cf.cf_model_alias[0].ca_canonical, "llama-3");
	assert_string_equal(cf.cf_model_alias[2].ca_alias, "x");
	assert_string_equal(cf.cf_model_alias[2].ca_canonical, "y");
	config_free(&cf);

	/* a list ends at a short flag too; "2048, 8192" is accepted */
	parse_ok(&cf,
	    "--cache-boundaries 2048, 8192 --worker-urls http://a -n");
	assert_int_equal(cf.cf_cache_boundaries_n, 2);
	assert_int_equal(cf.cf_worker_urls_n, 1);
	assert_true(cf.cf_check_config);
	config_free(&cf);
}

static void
test_endpoints(void **state)
{
	struct config cf;

	(void)state;
	parse_ok(&cf,
	    "--pd-disaggregation --prefill http://p1:8000 8998 "
	    "--prefill http://p2:8000 none --prefill http://p3:8000 "
	    "--prefill=http://p4:8000 0 --decode http://d1:8000 "
	    "--decode=http://d2:8000 --prefill http://p5:1");
	assert_int_equal(cf.cf_prefill_n, 5);
	assert_string_equal(cf.cf_prefill[0].ce_url, "http://p1:8000");
	assert_int_equal(cf.cf_prefill[0].ce_bootstrap_port, 8998);
	assert_int_equal(cf.cf_prefill[1].ce_bootstrap_port, -1);
	assert_int_equal(cf.cf_prefill[2].ce_bootstrap_port, -1);
	assert_string_equal(cf.cf_prefill[3].ce_url, "http://p4:8000");
	assert_int_equal(cf.cf_prefill[3].ce_bootstrap_port, 0);
	assert_int_equal(cf.cf_prefill[4].ce_bootstrap_port, -1);
	assert_int_equal(cf.cf_decode_n, 2);
	assert_string_equal(cf.cf_decode[1], "http://d2:8000");
	config_free(&cf);

	parse_ok(&cf,
	    "--epd-disaggregation --encode http://e1:1 9001 --encode "
	    "http://e2:1 NONE --prefill http://p:1 --decode http://d:1 "
	    "--encode-policy round_robin");
	assert_int_equal(cf.cf_encode_n, 2);
	assert_int_equal(cf.cf_encode[0].ce_bootstrap_port, 9001);
	assert_int_equal(cf.cf_encode[1].ce_bootstrap_port, -1);
	assert_int_equal(cf.cf_encode_policy, POLICY_ROUND_ROBIN);
	assert_true(cf.cf_encode_policy_set);
	config_free(&cf);
}

static void
test_policies(void **state)
{
	enum assignment_mode m;

	(void)state;
	assert_int_equal(assignment_mode_parse("MinLoad", &m), 0);
	assert_int_equal(m, ASSIGNMENT_MODE_MIN_LOAD);
	assert_int_equal(assignment_mode_parse("delegate", &m), 0);
	assert_int_equal(m, ASSIGNMENT_MODE_DELEGATE);
	assert_int_equal(assignment_mode_parse("x", &m), -1);
	assert_string_equal(assignment_mode_name(ASSIGNMENT_MODE_MIN_GROUP),
	    "min_group");
}

static void
test_forced_values(void **state)
{
	struct config cf;

	(void)state;
	parse_ok(&cf,
	    "--disable-retries --retry-max-retries 9 --disable-circuit-breaker "
	    "--worker-overload-protection --max-concurrent-requests 0 "
	    "--service-discovery --selector app=w --policy power_of_two");
	assert_int_equal(cf.cf_retry_max_retries, 1);
	assert_int_equal(cf.cf_cb_failure_threshold, (long)UINT32_MAX);
	assert_true(cf.cf_worker_overload_token_usage_set);
	assert_true(cf.cf_worker_overload_token_usage == 0.9);
	assert_int_equal(cf.cf_max_concurrent_requests, -1);
	assert_true(cf.cf_enable_igw);
	config_free(&cf);

	parse_ok(&cf,
	    "--worker-overload-protection --worker-overload-token-usage 0.75 "
	    "--worker-overload-waiting-requests 4 --max-concurrent-requests 64 "
	    "--routing-key-override --policy manual "
	    "--rate-limit-tokens-per-second 10 --health-check-port 8001 "
	    "--kv-indexer-ttl-secs 0");
	assert_true(cf.cf_worker_overload_token_usage == 0.75);
	assert_int_equal(cf.cf_worker_overload_waiting_requests, 4);
	assert_true(cf.cf_worker_overload_waiting_requests_set);
	assert_int_equal(cf.cf_max_concurrent_requests, 64);
	/* manual honours keys itself: its default mode stays random */
	assert_int_equal(cf.cf_assignment_mode, ASSIGNMENT_MODE_RANDOM);
	assert_true(cf.cf_rate_limit_tokens_per_second_set);
	assert_int_equal(cf.cf_health_check_port, 8001);
	assert_true(cf.cf_health_check_port_set);
	assert_true(cf.cf_kv_indexer_ttl_secs_set);
	config_free(&cf);
}

static void
test_modes_accepted(void **state)
{
	static const char *const lines[] = {
		"--enable-igw --policy power_of_two",
		"--enable-igw --pd-disaggregation --decode-policy bucket",
		"--service-discovery --pd-disaggregation --prefill-policy "
		"power_of_two --prefill-selector role=p",
		"--service-discovery --selector app=w tier=gpu "
		"--service-discovery-namespace llm --model-id-from label:model",
		"--policy power_of_two --worker-urls http://a http://b",
		"--pd-disaggregation --policy bucket --prefill http://p",
		"--pd-disaggregation --policy power_of_two --prefill http://p "
		"--decode http://d",
		"--pd-disaggregation --prefill-policy power_of_two --prefill "
		"http://p1 --prefill http://p2 --decode http://d",
		"--pd-disaggregation --policy passthrough",
		"--pd-disaggregation",
		"--epd-disaggregation --prefill-policy bucket",
		"--cache-index hash --cache-boundaries 16,64",
		"--cache-boundaries=",
		"--tls-cert-path /c.pem --tls-key-path /k.pem",
		"--client-cert-path /c.pem --client-key-path /k.pem",
		"--frontends 4 --frontend-slot 3",
		"--worker-urls ipc:///run/w.sock http://10.0.0.1 http://h/v1",
		"--max-concurrent-requests -1 --queue-size 0",
		"--log-level warning --backend Gemini --runtime openai",
		"--retry-max-backoff-ms 50 --retry-initial-backoff-ms 50",
		"--retry-jitter-factor 0 --retry-jitter-factor 1",
		"--worker-overload-token-usage 1",
		"--least-load-max-waiting-requests 4294967295",
		"--max-tree-size 18446744073709551615",
		"--prefill-selector a=b --service-discovery-port 8080 "
		"--service-discovery-namespace ns",
	};
	struct config cf;
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
		parse_ok(&cf, lines[i]);
		config_free(&cf);
	}
	parse_ok(&cf,
	    "--pd-disaggregation --policy round_robin "
	    "--decode-policy least_load");
	assert_int_equal(cf.cf_prefill_policy, POLICY_ROUND_ROBIN);
	assert_false(cf.cf_prefill_policy_set);
	assert_int_equal(cf.cf_decode_policy, POLICY_LEAST_LOAD);
	assert_true(cf.cf_decode_policy_set);
	config_free(&cf);
}

/* Each rejected line and the flag its one-line error must start with. */
static const struct {
	const char *line;
	const char *flag;
} rejects[] = {
	{ "--bogus", "--bogus: unknown flag" },
	{ "--bogus=1", "--bogus: unknown flag" },
	{ "-x", "-x: unknown flag" },
	{ "stray", "'stray': unexpected argument" },
	{ "--policy", "--policy: missing value" },
	{ "--policy --port 1", "--policy: missing value" },
	{ "--worker-urls", "--worker-urls: missing value" },
	{ "--worker-urls --port 1", "--worker-urls: missing value" },
	{ "--decode", "--decode" },
	{ "--port abc", "--port: invalid integer" },
	{ "--port 1x", "--port: invalid integer" },
	{ "--port=", "--port: invalid integer" },
	{ "--port 0", "--port: 0 out of range" },
	{ "--port 65536", "--port" },
	{ "--port 99999999999999999999", "--port" },
	{ "--policy bogus", "--policy: unknown policy 'bogus'" },
	{ "--pd-disaggregation --prefill-policy passthrough",
	    "--prefill-policy: policy 'passthrough' not allowed" },
	{ "--pd-disaggregation --decode-policy passthrough",
	    "--decode-policy: policy 'passthrough' not allowed" },
	{ "--pd-disaggregation --decode-policy bucket", "--decode-policy" },
	{ "--epd-disaggregation --decode-policy bucket", "--decode-policy" },
	{ "--epd-disaggregation --policy bucket", "--policy" },
	{ "--policy power_of_two", "--policy: power_of_two" },
	{ "--policy power_of_two --worker-urls http://a", "--policy" },
	{ "--pd-disaggregation --policy power_of_two --prefill http://p",
	    "--policy" },
	{ "--pd-disaggregation --prefill-policy power_of_two --prefill "
	  "http://p --decode http://d1 --decode http://d2",
	    "--prefill-policy" },
	{ "--pd-disaggregation --decode-policy power_of_two --prefill "
	  "http://p1 --prefill http://p2 --decode http://d",
	    "--decode-policy" },
	{ "--epd-disaggregation --policy power_of_two --prefill http://p1 "
	  "--prefill http://p2 --decode http://d --encode http://e",
	    "--policy" },
	{ "--epd-disaggregation --prefill-policy power_of_two --prefill "
	  "http://p --decode http://d1 --decode http://d2",
	    "--prefill-policy" },
	{ "--epd-disaggregation --encode-policy cache_aware",
	    "--encode-policy: policy 'cache_aware' not allowed" },
	{ "--epd-disaggregation --encode-policy power_of_two",
	    "--encode-policy" },
	{ "--epd-disaggregation --encode-policy bogus",
	    "--encode-policy: unknown policy" },
	{ "--prefill http://p", "--prefill: requires --pd-disaggregation" },
	{ "--decode http://d", "--decode: requires" },
	{ "--prefill-policy random", "--prefill-policy: requires" },
	{ "--decode-policy random", "--decode-policy: requires" },
	{ "--pd-disaggregation --encode http://e", "--encode: requires" },
	{ "--encode-policy random", "--encode-policy: requires" },
	{ "--pd-disaggregation --worker-urls http://a", "--worker-urls" },
	{ "--epd-disaggregation --pd-disaggregation", "--epd-disaggregation" },
	{ "--pd-disaggregation --prefill http://p 70000", "--prefill" },
	{ "--pd-disaggregation --prefill http://p 80x", "--prefill" },
	{ "--pd-disaggregation --prefill http://p -1", "--prefill" },
	{ "--pd-disaggregation --prefill ftp://p", "--prefill" },
	{ "--pd-disaggregation --prefill", "--prefill: missing value" },
	{ "--epd-disaggregation --encode http://e 65536", "--encode" },
	{ "--pd-disaggregation --decode HTTP://d", "--decode" },
	{ "--cache-threshold 1.5", "--cache-threshold" },
	{ "--cache-threshold -0.1", "--cache-threshold" },
	{ "--cache-threshold nan", "--cache-threshold: invalid number" },
	{ "--cache-match-threshold 2", "--cache-match-threshold" },
	{ "--balance-rel-threshold 0.9", "--balance-rel-threshold" },
	{ "--spill-rel-threshold 0.5", "--spill-rel-threshold" },
	{ "--balance-abs-threshold -1", "--balance-abs-threshold" },
	{ "--eviction-interval 0", "--eviction-interval" },
	{ "--max-tree-size 0", "--max-tree-size" },
	{ "--max-tree-size -1", "--max-tree-size" },
	{ "--max-tree-size 18446744073709551616", "--max-tree-size" },
	{ "--block-size 0", "--block-size" },
	{ "--balance-token-usage-threshold 0",
	    "--balance-token-usage-threshold" },
	{ "--overload-token-usage-threshold 0",
	    "--overload-token-usage-threshold" },
	{ "--overlap-decay -1", "--overlap-decay" },
	{ "--overlap-decay inf", "--overlap-decay" },
	{ "--selection-temperature -0.5", "--selection-temperature" },
	{ "--selection-temperature nan", "--selection-temperature" },
	{ "--cache-ttl-secs 0", "--cache-ttl-secs" },
	{ "--cache-index hash", "--cache-index: hash requires" },
	{ "--cache-index bogus", "--cache-index: unknown index" },
	{ "--cache-boundaries 8192,2048", "--cache-boundaries" },
	{ "--cache-boundaries 2048,2048", "--cache-boundaries" },
	{ "--cache-boundaries 0,5", "--cache-boundaries" },
	{ "--cache-boundaries abc", "--cache-boundaries" },
	{ "--cache-boundaries -5", "--cache-boundaries" },
	{ "--cache-boundaries 4294967296", "--cache-boundaries" },
	{ "--prefix-token-count 0", "--prefix-token-count" },
	{ "--prefix-hash-load-factor 0.99", "--prefix-hash-load-factor" },
	{ "--prefix-hash-balance-abs-threshold -1",
	    "--prefix-hash-balance-abs-threshold" },
	{ "--least-load-kv-pressure-weight -1",
	    "--least-load-kv-pressure-weight" },
	{ "--least-load-kv-pressure-weight inf",
	    "--least-load-kv-pressure-weight" },
	{ "--least-load-mean-prefill-tokens 0",
	    "--least-load-mean-prefill-tokens" },
	{ "--least-load-default-throughput 0",
	    "--least-load-default-throughput" },
	{ "--least-load-default-throughput inf",
	    "--least-load-default-throughput" },
	{ "--least-load-max-waiting-requests 4294967296",
	    "--least-load-max-waiting-requests" },
	{ "--retry-max-retries 0", "--retry-max-retries" },
	{ "--retry-initial-backoff-ms 0", "--retry-initial-backoff-ms" },
	{ "--retry-max-backoff-ms 10 --retry-initial-backoff-ms 50",
	    "--retry-max-backoff-ms" },
	{ "--retry-backoff-multiplier 0.5", "--retry-backoff-multiplier" },
	{ "--retry-jitter-factor 1.1", "--retry-jitter-factor" },
	{ "--retry-jitter-factor -0.1", "--retry-jitter-factor" },
	{ "--cb-failure-threshold 0", "--cb-failure-threshold" },
	{ "--cb-success-threshold 0", "--cb-success-threshold" },
	{ "--cb-timeout-duration-secs 0", "--cb-timeout-duration-secs" },
	{ "--cb-window-duration-secs 0", "--cb-window-duration-secs" },
	{ "--request-timeout-secs 0", "--request-timeout-secs" },
	{ "--load-monitor-interval 0", "--load-monitor-interval" },
	{ "--health-check-port 0", "--health-check-port" },
	{ "--health-check-port 30000", "--health-check-port: must differ" },
	{ "--prometheus-port 30000", "--prometheus-port: must differ" },
	{ "--health-check-port 29000", "--health-check-port: must differ" },
	{ "--worker-overload-waiting-requests 0",
	    "--worker-overload-waiting-requests" },
	{ "--worker-overload-token-usage 0", "--worker-overload-token-usage" },
	{ "--worker-overload-token-usage 1.01",
	    "--worker-overload-token-usage" },
	{ "--tls-cert-path /c.pem",
	    "--tls-cert-path: requires --tls-key-path" },
	{ "--tls-key-path /k.pem", "--tls-key-path: requires --tls-cert-path" },
	{ "--client-cert-path /c.pem", "--client-cert-path: requires" },
	{ "--client-key-path /k.pem", "--client-key-path: requires" },
	{ "--worker-urls HTTP://a:1", "--worker-urls: invalid worker URL" },
	{ "--worker-urls ftp://a", "--worker-urls" },
	{ "--worker-urls a:8000", "--worker-urls" },
	{ "--worker-urls http://", "--worker-urls" },
	{ "--worker-urls http://:80", "--worker-urls" },
	{ "--worker-urls http://a:0", "--worker-urls" },
	{ "--worker-urls http://a:99999", "--worker-urls" },
	{ "--worker-urls http://a:", "--worker-urls" },
	{ "--worker-urls http://u@a", "--worker-urls" },
	{ "--worker-urls http://[]:1", "--worker-urls" },
	{ "--worker-urls ipc://", "--worker-urls" },
	{ "--worker-urls http://ok http://bad:x", "--worker-urls" },
	{ "--log-level verbose", "--log-level: unknown level" },
	{ "--routing-key-headers bad@name", "--routing-key-headers" },
	{ "--request-id-headers x(y)", "--request-id-headers" },
	{ "--model-alias noequals", "--model-alias" },
	{ "--model-alias =x", "--model-alias" },
	{ "--model-alias a=", "--model-alias" },
	{ "--model-alias a=b --model-alias a=c", "--model-alias" },
	{ "--model-alias a=a", "--model-alias" },
	{ "--assignment-mode bogus", "--assignment-mode: unknown mode" },
	{ "--backend foo", "--backend: unknown value 'foo'" },
	{ "--runtime foo", "--runtime: unknown value" },
	{ "--frontends 0", "--frontends" },
	{ "--frontends 65", "--frontends" },
	{ "--frontends 2 --frontend-slot 2", "--frontend-slot" },
	{ "--frontend-slot -2", "--frontend-slot" },
	{ "--dp-aware=maybe", "--dp-aware" },
	{ "--health-check-endpoint health", "--health-check-endpoint" },
	{ "--selector noeq", "--selector" },
	{ "--prefill-selector =v", "--prefill-selector" },
	{ "--service-discovery-port 0", "--service-discovery-port" },
	{ "--service-discovery", "--service-discovery: needs --selector" },
	{ "--service-discovery --pd-disaggregation --selector a=b",
	    "--service-discovery: PD mode needs --prefill-selector" },
	{ "--service-discovery --epd-disaggregation --selector a=b",
	    "--service-discovery: PD mode needs --prefill-selector and/or "
	    "--decode-selector (or --encode-selector)" },
	{ "--encode-selector =v", "--encode-selector" },
	{ "--service-discovery-namespace Bad_NS",
	    "--service-discovery-namespace: invalid namespace" },
	{ "--service-discovery-namespace a/b",
	    "--service-discovery-namespace: invalid namespace" },
	{ "--model-id-from pod", "--model-id-from: invalid value" },
	{ "--model-id-from label:", "--model-id-from" },
	{ "--max-payload-size -5", "--max-payload-size" },
	{ "--max-payload-size 0", "--max-payload-size" },
	{ "--stream-request-bodies-over x", "--stream-request-bodies-over" },
	{ "--prometheus-duration-buckets 0.5 0.1",
	    "--prometheus-duration-buckets" },
	{ "--prometheus-duration-buckets -1", "--prometheus-duration-buckets" },
	{ "--job-queue-capacity 0", "--job-queue-capacity" },
	{ "--job-queue-concurrency 0", "--job-queue-concurrency" },
	{ "--max-concurrent-requests x", "--max-concurrent-requests" },
	{ "--worker-startup-timeout-secs 0", "--worker-startup-timeout-secs" },
	{ "--worker-startup-delay -1", "--worker-startup-delay" },
	{ "--worker-startup-check-interval 0",
	    "--worker-startup-check-interval" },
	{ "--health-failure-threshold 0", "--health-failure-threshold" },
	{ "--health-success-threshold 0", "--health-success-threshold" },
	{ "--health-check-timeout-secs 0", "--health-check-timeout-secs" },
	{ "--health-check-interval-secs 0", "--health-check-interval-secs" },
	{ "--rate-limit-tokens-per-second 0",
	    "--rate-limit-tokens-per-second" },
	{ "--kv-indexer-max-entries -1", "--kv-indexer-max-entries" },
	{ "--upstream-pool-idle-timeout-secs 0",
	    "--upstream-pool-idle-timeout-secs" },
	{ "--host=", "--host: empty value" },
	{ "--run-dir "
	  "/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
	    "--run-dir" },
};

static void
test_rejections(void **state)
{
	struct config cf;
	char err[512];
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(rejects) / sizeof(rejects[0]); i++) {
		memset(err, 0, sizeof(err));
		if (parse_line(&cf, rejects[i].line, err, sizeof(err)) !=
		    CONFIG_ERROR)
			fail_msg("'%s' accepted", rejects[i].line);
		if (strncmp(err, rejects[i].flag, strlen(rejects[i].flag)) != 0)
			fail_msg("'%s': error '%s' does not start with '%s'",
			    rejects[i].line, err, rejects[i].flag);
		/* one line, no trailing newline */
		assert_null(strchr(err, '\n'));
		/* the struct is left zeroed */
		assert_null(cf.cf_argv);
		assert_null(cf.cf_host);
		config_free(&cf);
	}
}

static void
test_help_version(void **state)
{
	struct config cf;
	char err[128];

	(void)state;
	assert_int_equal(parse_line(&cf, "--help", err, sizeof(err)),
	    CONFIG_EXIT);
	assert_null(cf.cf_argv);
	assert_int_equal(parse_line(&cf, "--port 1 -h", err, sizeof(err)),
	    CONFIG_EXIT);
	assert_int_equal(parse_line(&cf, "--version", err, sizeof(err)),
	    CONFIG_EXIT);
	assert_int_equal(parse_line(&cf, "-V", err, sizeof(err)), CONFIG_EXIT);
	config_free(&cf);
}

/* --help documents every flag and every alias. */
static void
test_usage_complete(void **state)
{
	static const char *const names[] = { "--worker-urls",
		"--pd-disaggregation", "--prefill URL [PORT|none]", "--decode",
		"--epd-disaggregation", "--encode URL [PORT|none]",
		"--prefill-policy", "--decode-policy", "--encode-policy",
		"--worker-startup-timeout-secs", "--worker-startup-delay",
		"--worker-startup-check-interval", "--dp-aware",
		"--dp-minimum-tokens-scheduler", "--enable-igw",
		"--model-path, --model", "--tokenizer-path", "--model-alias",
		"--backend, --runtime", "--upstream-http2",
		"--upstream-pool-idle-timeout-secs", "--job-queue-capacity",
		"--job-queue-concurrency", "--policy",
		"--cache-threshold, --cache-match-threshold",
		"--balance-abs-threshold, --spill-abs-threshold",
		"--balance-rel-threshold, --spill-rel-threshold",
		"--balance-token-usage-threshold",
		"--overload-token-usage-threshold", "--overlap-decay",
		"--selection-temperature", "--eviction-interval",
		"--max-tree-size", "--block-size", "--cache-boundaries",
		"--cache-index", "--cache-ttl-secs", "--kv-indexer-ttl-secs",
		"--kv-indexer-max-entries",
		"--max-idle-secs, --sticky-key-idle-secs", "--assignment-mode",
		"--prefix-token-count", "--prefix-hash-load-factor",
		"--prefix-hash-balance-abs-threshold",
		"--least-load-kv-pressure-weight",
		"--least-load-default-throughput",
		"--least-load-mean-prefill-tokens",
		"--least-load-max-waiting-requests",
		"--routing-key-override, --sticky-sessions",
		"--routing-key-headers", "--load-monitor-interval",
		"--disable-load-monitoring", "--engine-metrics",
		"--worker-overload-protection",
		"--worker-overload-waiting-requests",
		"--worker-overload-token-usage", "--health-failure-threshold",
		"--health-success-threshold", "--health-check-timeout-secs",
		"--health-check-interval-secs", "--health-check-endpoint",
		"--disable-health-check",
		"--remove-unhealthy-workers, --worker-auto-recovery",
		"--drain-settle-secs", "--retry-max-retries",
		"--retry-initial-backoff-ms", "--retry-max-backoff-ms",
		"--retry-backoff-multiplier", "--retry-jitter-factor",
		"--disable-retries", "--cb-failure-threshold",
		"--cb-success-threshold", "--cb-timeout-duration-secs",
		"--cb-window-duration-secs", "--disable-circuit-breaker",
		"--request-timeout-secs", "--max-payload-size",
		"--max-buffered-request-bytes, --stream-request-bodies-over",
		"--stream-body-stall-timeout-secs",
		"--shutdown-grace-period-secs", "--max-concurrent-requests",
		"--queue-size", "--queue-timeout-secs",
		"--rate-limit-tokens-per-second", "--request-id-headers",
		"--api-key", "--log-level", "--log-json", "--log-dir",
		"--service-discovery", "--selector", "--prefill-selector",
		"--decode-selector", "--service-discovery-port",
		"--service-discovery-namespace", "--tls-cert-path",
		"--tls-key-path", "--client-cert-path", "--client-key-path",
		"--ca-cert-paths", "--host", "--port", "--prometheus-host",
		"--prometheus-port", "--prometheus-duration-buckets",
		"--health-check-port", "--frontends", "--state-dir",
		"--run-dir", "--frontend-slot", "-n, --check-config",
		"-h, --help", "-V, --version", "(default: 30000)",
		"(default: 0.3)", "(default: x-smg-routing-key)", NULL };
	char *buf;
	size_t len, i;
	FILE *f;

	(void)state;
	f = open_memstream(&buf, &len);
	assert_non_null(f);
	config_usage(f);
	fclose(f);
	for (i = 0; names[i] != NULL; i++) {
		if (strstr(buf, names[i]) == NULL)
			fail_msg("usage lacks '%s'", names[i]);
	}
	free(buf);
}

static void
test_worker_url_check(void **state)
{
	char err[256];

	(void)state;
	assert_int_equal(config_check_worker_url("http://a", err, 256), 0);
	assert_int_equal(config_check_worker_url("https://a:443/x", err, 256),
	    0);
	assert_int_equal(
	    config_check_worker_url("grpc://[fe80::1]:9", err, 256), 0);
	assert_int_equal(config_check_worker_url("ipc:///tmp/s", err, 256), 0);
	assert_int_equal(config_check_worker_url("Http://a", err, 256), -1);
	assert_non_null(strstr(err, "lowercase"));
	assert_int_equal(config_check_worker_url("http://a b", err, 256), -1);
	assert_int_equal(config_check_worker_url("http://a?x", err, 256), 0);
	assert_int_equal(config_check_worker_url("http://[::1]x", err, 256),
	    -1);
	/* Data-parallel ranks; anything else after '@' is user info. */
	assert_int_equal(config_check_worker_url("http://a:8@1", err, 256), 0);
	assert_int_equal(config_check_worker_url("http://[::1]@0", err, 256),
	    0);
	assert_int_equal(config_check_worker_url("http://a:8@", err, 256), -1);
	assert_non_null(strstr(err, "user information"));
	assert_int_equal(config_check_worker_url("http://a:8@-1", err, 256),
	    -1);
	assert_int_equal(config_check_worker_url("http://a:8@x", err, 256), -1);
	assert_int_equal(
	    config_check_worker_url("http://a:8@99999999999", err, 256), -1);
	assert_int_equal(config_check_worker_url("http://a@b:8", err, 256), -1);
	assert_int_equal(config_check_worker_url("http://a:x@1", err, 256), -1);
	assert_int_equal(config_check_worker_url("http://a?q@1", err, 256), 0);
	assert_int_equal(url_rank("http://a?q@1"), -1);
	assert_int_equal(config_check_header_name("X-Smg-Routing-Key"), 0);
	assert_int_equal(config_check_header_name(""), -1);
	assert_int_equal(config_check_header_name("a b"), -1);
	assert_int_equal(config_check_header_name("a:b"), -1);
}

/* --broker-listen / --broker: tcp:// or tls+tcp://, TLS with all files. */
static void
test_broker_urls(void **state)
{
	struct config cf;
	char err[512];

	(void)state;
	parse_ok(&cf, "");
	assert_int_equal(cf.cf_broker_listen_n, 0);
	assert_null(cf.cf_broker);
	config_free(&cf);
	parse_ok(&cf,
	    "--broker-listen tcp://127.0.0.1:7000 --broker-listen tcp://*:0");
	assert_int_equal(cf.cf_broker_listen_n, 2);
	assert_string_equal(cf.cf_broker_listen[1], "tcp://*:0");
	config_free(&cf);
	parse_ok(&cf, "--broker tcp://brain:7000");
	assert_string_equal(cf.cf_broker, "tcp://brain:7000");
	config_free(&cf);
	parse_ok(&cf,
	    "--broker tls+tcp://brain:7000 --broker-tls-cert c.pem "
	    "--broker-tls-key k.pem --broker-tls-ca ca.pem");
	config_free(&cf);
	assert_int_equal(
	    parse_line(&cf, "--broker ipc:///tmp/x", err, sizeof(err)),
	    CONFIG_ERROR);
	assert_non_null(strstr(err, "--broker"));
	config_free(&cf);
	assert_int_equal(
	    parse_line(&cf, "--broker-listen tcp://h:port", err, sizeof(err)),
	    CONFIG_ERROR);
	config_free(&cf);
	assert_int_equal(
	    parse_line(&cf, "--broker-listen tcp://h:70000", err, sizeof(err)),
	    CONFIG_ERROR);
	config_free(&cf);
	assert_int_equal(parse_line(&cf,
	                     "--broker-listen tls+tcp://:7000 "
	                     "--broker-tls-cert c.pem --broker-tls-key k.pem",
	                     err, sizeof(err)),
	    CONFIG_ERROR);
	assert_non_null(strstr(err, "--broker-tls-ca"));
	config_free(&cf);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_broker_urls),
		cmocka_unit_test(test_aliases),
		cmocka_unit_test(test_launch_start),
		cmocka_unit_test(test_equals_form),
		cmocka_unit_test(test_lists),
		cmocka_unit_test(test_endpoints),
		cmocka_unit_test(test_policies),
		cmocka_unit_test(test_forced_values),
		cmocka_unit_test(test_modes_accepted),
		cmocka_unit_test(test_rejections),
		cmocka_unit_test(test_help_version),
		cmocka_unit_test(test_usage_complete),
		cmocka_unit_test(test_worker_url_check),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
