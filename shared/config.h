/*
 * config.h: the command line of every smg-c process, parsed once into one
 * read-only struct config.
 *
 * smg, smg-frontend, smg-broker and smg-poller all take SMG's command line
 * (spec gateway.md §1-§2, policies.md §14). config_parse() fills a struct
 * config from argv, applies every default, validates each value and the
 * cross-flag startup rules, and then the struct is read-only for the life of
 * the process. There is no reload: SIGHUP is a logged no-op (sighup.h), and
 * a changed flag takes a restart.
 *
 * Naming rule: member = "cf_" + the flag's primary long name with '-' turned
 * into '_' (--worker-urls -> cf_worker_urls). Types: switch -> bool,
 * integer -> long (uint64_t where the u64 range matters), float -> double,
 * string -> char * (NULL when unset), list -> char ** + size_t _n, optional
 * numeric without default -> value + bool _set.
 *
 * Ownership: every pointer in the struct is owned by it and freed by
 * config_free(). Nothing in it is modified after config_parse() returns.
 */
#ifndef SHARED_CONFIG_H
#define SHARED_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "shared/log.h"
#include "shared/policy_info.h"

/* --assignment-mode (policies.md §7.3). */
enum assignment_mode {
	ASSIGNMENT_MODE_RANDOM = 0,
	ASSIGNMENT_MODE_MIN_LOAD,
	ASSIGNMENT_MODE_MIN_GROUP,
	ASSIGNMENT_MODE_DELEGATE,
};

/* "random", "min_load", "min_group", "delegate"; "unknown" out of range. */
const char *assignment_mode_name(enum assignment_mode mode);
/* Case- and underscore-insensitive; 0 and *out set, or -1 if unknown. */
int assignment_mode_parse(const char *name, enum assignment_mode *out);

/* --cache-index (policies.md §11.7). */
enum cache_index {
	CACHE_INDEX_TREE = 0,
	CACHE_INDEX_HASH,
};

/* --prefill URL [PORT|none] and --encode URL [PORT|none]. */
struct config_endpoint {
	char *ce_url;
	int ce_bootstrap_port; /* 0..65535, or -1 for none/absent */
};

/* One --model-alias alias=canonical. */
struct config_alias {
	char *ca_alias;
	char *ca_canonical;
};

struct config {
	/* argv minus the program name and a leading launch/start word, in
	 * order, NULL-terminated; the launcher re-passes it to children. */
	char **cf_argv;
	int cf_argc;

	/* Listeners (gateway.md §1). */
	char *cf_host; /* "0.0.0.0" */
	long cf_port; /* 30000, 1..65535 */
	char *cf_prometheus_host; /* "0.0.0.0" */
	long cf_prometheus_port; /* 29000, 1..65535 */
	double *cf_prometheus_duration_buckets; /* empty: built-in buckets */
	size_t cf_prometheus_duration_buckets_n;
	long cf_health_check_port; /* valid only when _set */
	bool cf_health_check_port_set;

	/* Workers and modes (§2.1). */
	char **cf_worker_urls;
	size_t cf_worker_urls_n;
	char **cf_worker_allow_cidr; /* smg-c's own; NULL: any address */
	size_t cf_worker_allow_cidr_n;
	bool cf_pd_disaggregation;
	struct config_endpoint *cf_prefill;
	size_t cf_prefill_n;
	char **cf_decode;
	size_t cf_decode_n;
	bool cf_epd_disaggregation;
	struct config_endpoint *cf_encode;
	size_t cf_encode_n;
	/* Leg policies: after parsing, an unset prefill/decode leg holds the
	 * value of cf_policy; the encode leg defaults to consistent_hashing.
	 * _set says whether the flag was given. */
	enum policy_kind cf_prefill_policy;
	bool cf_prefill_policy_set;
	enum policy_kind cf_decode_policy;
	bool cf_decode_policy_set;
	enum policy_kind cf_encode_policy;
	bool cf_encode_policy_set;
	long cf_worker_startup_timeout_secs; /* 1800 */
	long cf_worker_startup_delay; /* 0 */
	long cf_worker_startup_check_interval; /* 30 */
	bool cf_dp_aware;
	bool cf_dp_minimum_tokens_scheduler;
	bool cf_enable_igw; /* also true when --service-discovery is given */
	char *cf_model_path;
	char *cf_tokenizer_path;
	struct config_alias *cf_model_alias;
	size_t cf_model_alias_n;
	char *cf_backend; /* lowercase: sglang, vllm, trtllm, ... or NULL */
	bool cf_upstream_http2;
	long cf_upstream_pool_idle_timeout_secs; /* 3 */
	long cf_job_queue_capacity; /* 1000 */
	long cf_job_queue_concurrency; /* 200 */

	/* Routing policy (§2.2). */
	enum policy_kind cf_policy; /* cache_aware */
	double cf_cache_threshold; /* 0.3 */
	long cf_balance_abs_threshold; /* 64 */
	double cf_balance_rel_threshold; /* 1.5 */
	double cf_balance_token_usage_threshold;
	double cf_overload_token_usage_threshold;
	double cf_overlap_decay;
	double cf_selection_temperature;
	long cf_eviction_interval; /* 120 */
	uint64_t cf_max_tree_size; /* 67108864 */
	long cf_block_size; /* 16 */
	uint32_t *cf_cache_boundaries; /* strictly ascending, > 0 */
	size_t cf_cache_boundaries_n;
	enum cache_index cf_cache_index;
	long cf_cache_ttl_secs; /* 180 */
	long cf_kv_indexer_ttl_secs;
	bool cf_kv_indexer_ttl_secs_set;
	long cf_kv_indexer_max_entries;
	bool cf_kv_indexer_max_entries_set;
	long cf_max_idle_secs; /* 14400 */
	/* Unset: random, except delegate when --routing-key-override is on
	 * and the policy is not manual; _set says whether it was given. */
	enum assignment_mode cf_assignment_mode;
	bool cf_assignment_mode_set;
	long cf_prefix_token_count; /* 256 */
	double cf_prefix_hash_load_factor; /* 1.25 */
	long cf_prefix_hash_balance_abs_threshold; /* 10 */
	double cf_least_load_kv_pressure_weight; /* 0.15 */
	double cf_least_load_default_throughput; /* 2000.0 */
	long cf_least_load_mean_prefill_tokens; /* 1024 */
	long cf_least_load_max_waiting_requests; /* 0 = off, u32 */
	bool cf_routing_key_override;
	char **cf_routing_key_headers; /* lowercase; x-smg-routing-key */
	size_t cf_routing_key_headers_n;

	/* Load monitoring and overload protection (§2.3). */
	long cf_load_monitor_interval; /* 10 */
	bool cf_disable_load_monitoring;
	bool cf_engine_metrics;
	bool cf_worker_overload_protection;
	long cf_worker_overload_waiting_requests; /* >= 1 when _set */
	bool cf_worker_overload_waiting_requests_set;
	/* (0,1]; --worker-overload-protection without it implies 0.9 and
	 * _set true. */
	double cf_worker_overload_token_usage;
	bool cf_worker_overload_token_usage_set;

	/* Health checks (§2.4). */
	long cf_health_failure_threshold; /* 3 */
	long cf_health_success_threshold; /* 2 */
	long cf_health_check_timeout_secs; /* 5 */
	long cf_health_check_interval_secs; /* 60 */
	char *cf_health_check_endpoint; /* "/health" */
	bool cf_disable_health_check;
	bool cf_remove_unhealthy_workers;
	long cf_drain_settle_secs; /* 5 */

	/* Retries and circuit breaker (§2.5); the disable switches are
	 * already applied to the numbers below. */
	long
	    cf_retry_max_retries; /* total attempts; 1 with --disable-retries */
	long cf_retry_initial_backoff_ms; /* 50 */
	long cf_retry_max_backoff_ms; /* 30000 */
	double cf_retry_backoff_multiplier; /* 1.5 */
	double cf_retry_jitter_factor; /* 0.2 */
	bool cf_disable_retries;
	long cf_cb_failure_threshold; /* UINT32_MAX when disabled */
	long cf_cb_success_threshold; /* 3 */
	long cf_cb_timeout_duration_secs; /* 60 */
	long cf_cb_window_duration_secs; /* 120 */
	bool cf_disable_circuit_breaker;

	/* Request handling, admission, observability (§2.6). */
	long cf_request_timeout_secs; /* 1800 */
	uint64_t cf_max_payload_size; /* 536870912 */
	/* alias --stream-request-bodies-over; 0 = never stream */
	uint64_t cf_max_buffered_request_bytes;
	long cf_stream_body_stall_timeout_secs; /* 300 */
	uint64_t cf_body_min_rate_bytes_per_sec; /* 1024; 0 = none */
	uint64_t cf_max_buffered_bytes_total; /* 1 GiB per frontend; 0 = none */
	long cf_stream_first_byte_timeout_secs; /* 300; 0 = none */
	long cf_stream_idle_timeout_secs; /* 120; 0 = none */
	long cf_shutdown_grace_period_secs; /* 180 */
	long cf_max_concurrent_requests; /* -1 = off (any value <= 0) */
	long cf_queue_size; /* 100 */
	long cf_queue_timeout_secs; /* 60 */
	long cf_rate_limit_tokens_per_second;
	bool cf_rate_limit_tokens_per_second_set;
	char **cf_request_id_headers; /* lowercase */
	size_t cf_request_id_headers_n;
	char *cf_api_key;
	enum log_level cf_log_level; /* info */
	bool cf_log_json;
	char *cf_log_dir;
	bool cf_no_access_log; /* smg-c: no access line per request */
	bool cf_enable_trace;
	char *cf_otlp_traces_endpoint; /* "localhost:4317" */
	bool cf_service_discovery;
	char **cf_selector; /* key=value each */
	size_t cf_selector_n;
	char **cf_prefill_selector;
	size_t cf_prefill_selector_n;
	char **cf_decode_selector;
	size_t cf_decode_selector_n;
	char **cf_encode_selector;
	size_t cf_encode_selector_n;
	long cf_service_discovery_port; /* 80 */
	char *cf_service_discovery_namespace; /* NULL: every namespace */
	char *cf_model_id_from; /* namespace, label:<key>, annotation:<key> */

	/* TLS and mTLS (§2.7). */
	char *cf_tls_cert_path;
	char *cf_tls_key_path;
	char *cf_client_cert_path;
	char *cf_client_key_path;
	char **cf_ca_cert_paths;
	size_t cf_ca_cert_paths_n;

	/* smg-c's own flags. */
	long cf_frontends; /* online CPUs clamped to 1..64 */
	char *cf_state_dir; /* /var/tmp/smg-<port> */
	char *cf_run_dir; /* /tmp/smg-<port> */
	char **cf_broker_listen; /* tcp:// listeners of the broker */
	size_t cf_broker_listen_n;
	char *cf_broker; /* remote broker of a frontend, or NULL */
	char *cf_broker_tls_cert; /* tls+tcp:// broker connections */
	char *cf_broker_tls_key;
	char *cf_broker_tls_ca;
	long cf_frontend_slot; /* -1 = any; else 0..cf_frontends-1 */
	bool cf_check_config;

	/* Who may do what (gateway.md §2; docs/decisions.md). */
	char **cf_control_plane_api_keys; /* id:name:role:key each */
	size_t cf_control_plane_api_keys_n;
	char *cf_jwt_issuer;
	char *cf_jwt_audience;
	char *cf_jwt_jwks_uri;
	char *cf_jwt_role_claim; /* "roles" */
	char **cf_jwt_role_mapping; /* idp_role=admin|user each */
	size_t cf_jwt_role_mapping_n;
	char **cf_tenant_api_keys; /* tenant_id:key each */
	size_t cf_tenant_api_keys_n;
	bool cf_disable_audit_logging;
	bool cf_trust_tenant_header;
	char *cf_tenant_header_name; /* "x-smg-tenant-id", lowercase */
	bool cf_tenant_rate_limit_enabled;
	char *cf_tenant_rate_limit_config;
	char **cf_cors_allowed_origins;
	size_t cf_cors_allowed_origins_n;

	/*
	 * SMG flags accepted without effect (docs/compat.md): one line each,
	 * "--flag: accepted, ...", for the launcher to log at startup.
	 */
	char **cf_warnings;
	size_t cf_warnings_n;
};

enum config_result {
	CONFIG_OK = 0,
	CONFIG_EXIT,
	CONFIG_ERROR,
};

/*
 * Fills cf from argv (argv[0] = program name; a following "launch" or
 * "start" word is skipped). cf need not be initialised.
 * CONFIG_OK: cf is complete and validated; release it with config_free().
 * CONFIG_EXIT: --help or --version was printed to stdout; exit 0.
 * CONFIG_ERROR: err holds one line naming the flag and the reason (no
 * trailing newline, no program name).
 * On CONFIG_EXIT and CONFIG_ERROR cf is left zeroed (config_free is a
 * harmless no-op on it). Allocation failure is fatal (startup only).
 */
enum config_result config_parse(struct config *cf, int argc, char *argv[],
    char *err, size_t errlen);
/* Frees what config_parse allocated and zeroes cf; safe on a zeroed cf. */
void config_free(struct config *cf);
/* Prints usage documenting every flag: names, aliases, default, meaning. */
void config_usage(FILE *out);
/*
 * For mains: config_parse; on CONFIG_EXIT exit(0); on CONFIG_ERROR print
 * "<prog>: <err>" to stderr and exit(2). With --check-config / -n it prints
 * "<prog>: configuration OK" to stdout and exits 0 after validation.
 */
void config_load_or_exit(struct config *cf, int argc, char *argv[]);

/*
 * Validates a worker URL as the command line does (gateway.md §1): scheme
 * http, https, grpc, grpcs or ipc (lowercase), a host (or a path for
 * ipc://), an optional port 1..65535. For POST /workers as well.
 * Returns 0, or -1 with the reason in err (without a flag name).
 */
int config_check_worker_url(const char *url, char *err, size_t errlen);
/* 0 if name is a valid HTTP header field name (RFC 9110 token), else -1. */
int config_check_header_name(const char *name);

#endif /* SHARED_CONFIG_H */
