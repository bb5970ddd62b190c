/*
 * config.c: parses SMG's command line into struct config.
 *
 * One table (config_keys) declares every flag: names, type, default, bounds,
 * where it lives in struct config and its help line. The table drives
 * parsing, defaults, --help and config_free; config_finish() then applies
 * the cross-flag startup rules of gateway.md §2 and policies.md §14.
 */
#include "shared/config.h"
#include "shared/otlp.h"
#include "shared/url.h"
#include "shared/urlallow.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "shared/xmalloc.h"

_Static_assert(sizeof(long) >= 8, "long must hold u32 max and more");

enum key_type {
	KT_SECTION = 0,
	KT_SWITCH,
	KT_HELP,
	KT_VERSION,
	KT_LONG,
	KT_U64,
	KT_DOUBLE,
	KT_STRING,
	KT_LIST,
	KT_POLICY,
	KT_ASSIGN,
	KT_CACHE_INDEX,
	KT_LOG_LEVEL,
	KT_U32_LIST,
	KT_DOUBLE_LIST,
	KT_ENDPOINT,
	KT_ALIAS,
	KT_COMPAT, /* an SMG flag smg-c accepts without using it */
};

/*
 * What an SMG flag does here (docs/compat.md lists every one). Flags of
 * the table above KT_COMPAT are implemented; a KT_COMPAT flag is accepted
 * with one warning line at startup because it only affects something
 * smg-c does not route (INERT), needs a subsystem smg-c does not have,
 * whose routes answer 501 (ABSENT), or is not implemented yet (PENDING).
 */
enum key_compat {
	KCOMPAT_IMPLEMENTED = 0,
	KCOMPAT_INERT,
	KCOMPAT_ABSENT,
	KCOMPAT_PENDING,
};

/* How a KT_COMPAT flag's value is checked (nothing is stored). */
enum compat_value {
	CV_SWITCH = 0, /* no value, or true/false */
	CV_STRING, /* one value */
	CV_LONG, /* one integer within ck_lmin..ck_lmax */
	CV_LIST, /* zero or more values up to the next flag */
	CV_APPEND, /* one value per occurrence, repeatable */
	CV_CHOICE, /* one of ck_choices */
	CV_IP, /* an IPv4 or IPv6 address */
};

/* Extra checks on string and list values. */
enum key_check {
	KC_NONE = 0,
	KC_URL,
	KC_HEADER,
	KC_SELECTOR,
	KC_HTTP_PATH,
	KC_CIDR,
	KC_ID_SOURCE,
	KC_NAMESPACE,
};

#define KF_MIN_EXCL 0x01 /* double lower bound is exclusive */
#define KF_MAX_EXCL 0x02 /* double upper bound is exclusive */
#define KF_ONE      0x04 /* list flag takes one value per occurrence */
#define KF_VERBOSE  0x08 /* KT_VERSION: with build details */

struct config_key {
	const char *ck_name; /* primary long name without "--" */
	const char *ck_alias; /* second long name or NULL */
	char ck_short; /* short letter or 0 */
	enum key_type ck_type;
	size_t ck_off; /* the member */
	size_t ck_n_off; /* list length member */
	size_t ck_set_off; /* bool _set member; 0 = none */
	const char *ck_def; /* default, parsed like a command-line value */
	const char *ck_defdoc; /* default shown in --help when computed */
	long ck_lmin, ck_lmax;
	double ck_dmin, ck_dmax;
	unsigned ck_flags;
	enum key_check ck_check;
	enum policy_role ck_role; /* policies accepted by a KT_POLICY key */
	const char *const *ck_choices; /* accepted KT_STRING values */
	const char *ck_meta; /* value placeholder in --help */
	const char *ck_help;
	enum key_compat ck_compat; /* KT_COMPAT: why it is not used */
	enum compat_value ck_cv; /* KT_COMPAT: how its value is checked */
	const char *ck_subsystem; /* KT_COMPAT: what it would configure */
};

/* cf_argv sits at offset 0, so 0 can mean "no _set member". */
_Static_assert(offsetof(struct config, cf_argv) == 0, "cf_argv first");

#define OFF(m)    offsetof(struct config, m)
#define DMIN_NONE (-HUGE_VAL)
#define DMAX_NONE HUGE_VAL
#define U32_MAX_L ((long)UINT32_MAX)

#define SECTION(title)                                                         \
	{                                                                      \
		.ck_type = KT_SECTION, .ck_help = title                        \
	}
#define SWITCH(n, a, s, m, h)                                                  \
	{                                                                      \
		.ck_name = n, .ck_alias = a, .ck_short = s,                    \
		.ck_type = KT_SWITCH, .ck_off = OFF(m), .ck_help = h           \
	}
#define LONGV(n, a, m, def, lo, hi, h)                                         \
	{                                                                      \
		.ck_name = n, .ck_alias = a, .ck_type = KT_LONG,               \
		.ck_off = OFF(m), .ck_def = def, .ck_lmin = lo, .ck_lmax = hi, \
		.ck_meta = "N", .ck_help = h                                   \
	}
#define LONGO(n, a, m, lo, hi, h)                                              \
	{                                                                      \
		.ck_name = n, .ck_alias = a, .ck_type = KT_LONG,               \
		.ck_off = OFF(m), .ck_set_off = OFF(m##_set), .ck_lmin = lo,   \
		.ck_lmax = hi, .ck_meta = "N", .ck_help = h                    \
	}
#define U64V(n, a, m, def, lo, h)                                              \
	{                                                                      \
		.ck_name = n, .ck_alias = a, .ck_type = KT_U64,                \
		.ck_off = OFF(m), .ck_def = def, .ck_lmin = lo,                \
		.ck_lmax = LONG_MAX, .ck_meta = "BYTES", .ck_help = h          \
	}
#define DBLV(n, a, m, def, lo, hi, fl, h)                                      \
	{                                                                      \
		.ck_name = n, .ck_alias = a, .ck_type = KT_DOUBLE,             \
		.ck_off = OFF(m), .ck_def = def, .ck_dmin = lo, .ck_dmax = hi, \
		.ck_flags = fl, .ck_meta = "F", .ck_help = h                   \
	}
#define DBLO(n, a, m, lo, hi, fl, h)                                           \
	{                                                                      \
		.ck_name = n, .ck_alias = a, .ck_type = KT_DOUBLE,             \
		.ck_off = OFF(m), .ck_set_off = OFF(m##_set), .ck_dmin = lo,   \
		.ck_dmax = hi, .ck_flags = fl, .ck_meta = "F", .ck_help = h    \
	}
#define STRV(n, a, m, def, chk, meta, h)                                       \
	{                                                                      \
		.ck_name = n, .ck_alias = a, .ck_type = KT_STRING,             \
		.ck_off = OFF(m), .ck_def = def, .ck_check = chk,              \
		.ck_meta = meta, .ck_help = h                                  \
	}
#define LISTV(n, a, m, def, chk, fl, meta, h)                                  \
	{                                                                      \
		.ck_name = n, .ck_alias = a, .ck_type = KT_LIST,               \
		.ck_off = OFF(m), .ck_n_off = OFF(m##_n), .ck_def = def,       \
		.ck_check = chk, .ck_flags = fl, .ck_meta = meta, .ck_help = h \
	}
#define POLV(n, m, def, role, h)                                               \
	{                                                                      \
		.ck_name = n, .ck_type = KT_POLICY, .ck_off = OFF(m),          \
		.ck_set_off = OFF(m##_set), .ck_def = def, .ck_role = role,    \
		.ck_meta = "POLICY", .ck_help = h                              \
	}

/* SMG flags accepted without effect (see enum key_compat). */
#define ACCEPT(n, cv, kind, sub, meta, h)                                      \
	{                                                                      \
		.ck_name = n, .ck_type = KT_COMPAT, .ck_cv = cv,               \
		.ck_compat = kind, .ck_subsystem = sub, .ck_meta = meta,       \
		.ck_help = h                                                   \
	}
#define ACCEPTL(n, lo, hi, kind, sub, h)                                       \
	{                                                                      \
		.ck_name = n, .ck_type = KT_COMPAT, .ck_cv = CV_LONG,          \
		.ck_lmin = lo, .ck_lmax = hi, .ck_compat = kind,               \
		.ck_subsystem = sub, .ck_meta = "N", .ck_help = h              \
	}
#define ACCEPTC(n, choices, kind, sub, meta, h)                                \
	{                                                                      \
		.ck_name = n, .ck_type = KT_COMPAT, .ck_cv = CV_CHOICE,        \
		.ck_choices = choices, .ck_compat = kind, .ck_subsystem = sub, \
		.ck_meta = meta, .ck_help = h                                  \
	}

/* Subsystem names: warnings, docs/compat.md and the 501 answers. */
#define SUB_GRPC     "the gRPC tokenizing path"
#define SUB_K8S      "Kubernetes service discovery"
#define SUB_STORAGE  "response storage"
#define SUB_WASM     "WASM"
#define SUB_MCP      "MCP"
#define SUB_MESH     "mesh"
#define SUB_WEBRTC   "WebRTC"
#define SUB_PRIORITY "the priority scheduler"
#define SUB_RUNTIME  "a thread runtime (smg-c runs processes: --frontends)"

static const char *const config_history_backends[] = { "memory", "none",
	"oracle", "postgres", "redis", NULL };
static const char *const config_transports[] = { "inline", "shm", "auto",
	"rdma", NULL };

static const char *const config_backends[] = { "sglang", "vllm", "trtllm",
	"tokenspeed", "openai", "anthropic", "gemini", NULL };

static const struct config_key config_keys[] = {
	SECTION("General"),
	{ .ck_name = "help",
	    .ck_short = 'h',
	    .ck_type = KT_HELP,
	    .ck_help = "print this help and exit" },
	{ .ck_name = "version",
	    .ck_short = 'V',
	    .ck_type = KT_VERSION,
	    .ck_help = "print the version and exit" },
	{ .ck_name = "version-verbose",
	    .ck_type = KT_VERSION,
	    .ck_flags = KF_VERBOSE,
	    .ck_help = "print the version and build details and exit" },
	SWITCH("check-config", NULL, 'n', cf_check_config,
	    "validate the command line and exit 0"),
	{ .ck_name = "frontends",
	    .ck_type = KT_LONG,
	    .ck_off = OFF(cf_frontends),
	    .ck_lmin = 1,
	    .ck_lmax = 64,
	    .ck_defdoc = "number of online CPUs, at most 64",
	    .ck_meta = "N",
	    .ck_help = "number of smg-frontend processes (one per CPU: on 2 "
	               "CPUs, 1 and 4 measured no better than 2)" },
	{ .ck_name = "state-dir",
	    .ck_type = KT_STRING,
	    .ck_off = OFF(cf_state_dir),
	    .ck_defdoc = "/var/tmp/smg-<port>",
	    .ck_meta = "DIR",
	    .ck_help = "directory of the persistent routing state (LMDB)" },
	{ .ck_name = "run-dir",
	    .ck_type = KT_STRING,
	    .ck_off = OFF(cf_run_dir),
	    .ck_defdoc = "/tmp/smg-<port>",
	    .ck_meta = "DIR",
	    .ck_help = "directory of the IPC sockets and shared memory" },
	LONGV("frontend-slot", NULL, cf_frontend_slot, "-1", -1, 63,
	    "internal: shared-memory row of this frontend (-1 = any)"),
	LISTV("broker-listen", NULL, cf_broker_listen, NULL, KC_NONE, KF_ONE,
	    "URL",
	    "smg-c: the broker also serves frontends of other hosts on "
	    "tcp://HOST:PORT or tls+tcp://HOST:PORT (repeatable)"),
	STRV("broker", NULL, cf_broker, NULL, KC_NONE, "URL",
	    "smg-c: a frontend asks the broker at tcp:// or "
	    "tls+tcp://HOST:PORT "
	    "instead of its run dir's, and mirrors its worker table"),
	STRV("broker-tls-cert", NULL, cf_broker_tls_cert, NULL, KC_NONE, "PEM",
	    "smg-c: certificate of this end of a tls+tcp:// broker connection"),
	STRV("broker-tls-key", NULL, cf_broker_tls_key, NULL, KC_NONE, "PEM",
	    "smg-c: its private key"),
	STRV("broker-tls-ca", NULL, cf_broker_tls_ca, NULL, KC_NONE, "PEM",
	    "smg-c: CA the other end's certificate must chain to (both ends "
	    "are verified)"),

	SECTION("Listeners"),
	STRV("host", NULL, cf_host, "0.0.0.0", KC_NONE, "ADDR",
	    "address of the main listener"),
	LONGV("port", NULL, cf_port, "30000", 1, 65535,
	    "port of the main listener"),
	STRV("prometheus-host", NULL, cf_prometheus_host, "0.0.0.0", KC_NONE,
	    "ADDR", "address of the metrics listener"),
	LONGV("prometheus-port", NULL, cf_prometheus_port, "29000", 1, 65535,
	    "port of the metrics listener (GET /metrics)"),
	{ .ck_name = "prometheus-duration-buckets",
	    .ck_type = KT_DOUBLE_LIST,
	    .ck_off = OFF(cf_prometheus_duration_buckets),
	    .ck_n_off = OFF(cf_prometheus_duration_buckets_n),
	    .ck_dmin = 0,
	    .ck_dmax = DMAX_NONE,
	    .ck_defdoc = "built-in",
	    .ck_meta = "SECS...",
	    .ck_help = "histogram buckets of request durations, ascending" },
	LONGO("health-check-port", NULL, cf_health_check_port, 1, 65535,
	    "separate port serving /liveness, /readiness, /health"),

	SECTION("Workers and modes"),
	LISTV("worker-urls", NULL, cf_worker_urls, NULL, KC_URL, 0, "URL...",
	    "startup workers (regular mode)"),
	LISTV("worker-allow-cidr", NULL, cf_worker_allow_cidr, NULL, KC_CIDR, 0,
	    "CIDR...",
	    "smg-c: address ranges workers added through the API must resolve "
	    "into (repeatable; default any)"),
	SWITCH("pd-disaggregation", NULL, 0, cf_pd_disaggregation,
	    "prefill/decode disaggregated mode; use --prefill and --decode"),
	{ .ck_name = "prefill",
	    .ck_type = KT_ENDPOINT,
	    .ck_off = OFF(cf_prefill),
	    .ck_n_off = OFF(cf_prefill_n),
	    .ck_meta = "URL [PORT|none]",
	    .ck_help = "prefill worker and its bootstrap port (repeatable)" },
	LISTV("decode", NULL, cf_decode, NULL, KC_URL, KF_ONE, "URL",
	    "decode worker (repeatable)"),
	SWITCH("epd-disaggregation", NULL, 0, cf_epd_disaggregation,
	    "encode/prefill/decode mode; adds --encode"),
	{ .ck_name = "encode",
	    .ck_type = KT_ENDPOINT,
	    .ck_off = OFF(cf_encode),
	    .ck_n_off = OFF(cf_encode_n),
	    .ck_meta = "URL [PORT|none]",
	    .ck_help = "encode worker and its bootstrap port (repeatable)" },
	POLV("prefill-policy", cf_prefill_policy, NULL, POLICY_ROLE_LEG,
	    "policy of the prefill leg (default: --policy)"),
	POLV("decode-policy", cf_decode_policy, NULL, POLICY_ROLE_LEG,
	    "policy of the decode leg (default: --policy)"),
	POLV("encode-policy", cf_encode_policy, "consistent_hashing",
	    POLICY_ROLE_ENCODE,
	    "policy of the encode leg: random, round_robin, "
	    "consistent_hashing"),
	LONGV("worker-startup-timeout-secs", NULL,
	    cf_worker_startup_timeout_secs, "1800", 1, LONG_MAX,
	    "give up waiting for a startup worker after this many seconds"),
	LONGV("worker-startup-delay", NULL, cf_worker_startup_delay, "0", 0,
	    LONG_MAX, "grace before the first startup check (seconds)"),
	LONGV("worker-startup-check-interval", NULL,
	    cf_worker_startup_check_interval, "30", 1, LONG_MAX,
	    "seconds between startup checks"),
	SWITCH("dp-aware", NULL, 0, cf_dp_aware,
	    "expand data-parallel workers into per-rank workers (url@rank)"),
	SWITCH("dp-minimum-tokens-scheduler", NULL, 0,
	    cf_dp_minimum_tokens_scheduler,
	    "pick the DP rank with the fewest used tokens"),
	SWITCH("enable-igw", NULL, 0, cf_enable_igw,
	    "multi-model gateway mode (skips PD/power_of_two checks)"),
	STRV("model-path", "model", cf_model_path, NULL, KC_NONE, "PATH",
	    "tokenizer source (model id or path)"),
	STRV("tokenizer-path", NULL, cf_tokenizer_path, NULL, KC_NONE, "PATH",
	    "tokenizer file or directory"),
	{ .ck_name = "model-alias",
	    .ck_type = KT_ALIAS,
	    .ck_off = OFF(cf_model_alias),
	    .ck_n_off = OFF(cf_model_alias_n),
	    .ck_meta = "ALIAS=MODEL...",
	    .ck_help = "extra client-facing model name (repeatable)" },
	{ .ck_name = "backend",
	    .ck_alias = "runtime",
	    .ck_type = KT_STRING,
	    .ck_off = OFF(cf_backend),
	    .ck_choices = config_backends,
	    .ck_meta = "NAME",
	    .ck_help = "worker runtime: sglang, vllm, trtllm, tokenspeed, "
	               "openai, anthropic, gemini" },
	SWITCH("upstream-http2", NULL, 0, cf_upstream_http2,
	    "speak h2c to workers"),
	LONGV("upstream-pool-idle-timeout-secs", NULL,
	    cf_upstream_pool_idle_timeout_secs, "3", 1, LONG_MAX,
	    "idle timeout of pooled worker connections"),
	LONGV("job-queue-capacity", NULL, cf_job_queue_capacity, "1000", 1,
	    LONG_MAX, "capacity of the control-plane job queue"),
	LONGV("job-queue-concurrency", NULL, cf_job_queue_concurrency, "200", 1,
	    LONG_MAX, "concurrency of the control-plane job queue"),

	SECTION("Routing policy"),
	{ .ck_name = "policy",
	    .ck_type = KT_POLICY,
	    .ck_off = OFF(cf_policy),
	    .ck_def = "cache_aware",
	    .ck_role = POLICY_ROLE_ANY,
	    .ck_meta = "POLICY",
	    .ck_help = "random, round_robin, passthrough, cache_aware, "
	               "power_of_two, least_load, prefix_hash, "
	               "consistent_hashing, manual, bucket" },
	DBLV("cache-threshold", "cache-match-threshold", cf_cache_threshold,
	    "0.3", 0, 1, 0, "cache match ratio to exceed to route to a holder"),
	LONGV("balance-abs-threshold", "spill-abs-threshold",
	    cf_balance_abs_threshold, "64", 0, LONG_MAX,
	    "spill gate, absolute part (cache_aware, bucket)"),
	DBLV("balance-rel-threshold", "spill-rel-threshold",
	    cf_balance_rel_threshold, "1.5", 1, DMAX_NONE, 0,
	    "spill gate, relative part (cache_aware, bucket)"),
	DBLV("balance-token-usage-threshold", NULL,
	    cf_balance_token_usage_threshold, "1.0", 0, DMAX_NONE, KF_MIN_EXCL,
	    "KV-usage spread trigger (>= 1.0 disables)"),
	DBLV("overload-token-usage-threshold", NULL,
	    cf_overload_token_usage_threshold, "1.0", 0, DMAX_NONE, KF_MIN_EXCL,
	    "hottest-engine KV ceiling trigger (>= 1.0 disables)"),
	DBLV("overlap-decay", NULL, cf_overlap_decay, "0.0", 0, DMAX_NONE, 0,
	    "event-mode anti-hotspot decay"),
	DBLV("selection-temperature", NULL, cf_selection_temperature, "0.0", 0,
	    DMAX_NONE, 0, "event-mode softmax temperature"),
	LONGV("eviction-interval", NULL, cf_eviction_interval, "120", 1,
	    LONG_MAX, "tree eviction and idle-key sweep period (seconds)"),
	{ .ck_name = "max-tree-size",
	    .ck_type = KT_U64,
	    .ck_off = OFF(cf_max_tree_size),
	    .ck_def = "67108864",
	    .ck_lmin = 1,
	    .ck_meta = "N",
	    .ck_help = "per-model prefix tree budget (chars or tokens)" },
	LONGV("block-size", NULL, cf_block_size, "16", 1, U32_MAX_L,
	    "token-tree page size and assumed KV block size"),
	{ .ck_name = "cache-boundaries",
	    .ck_type = KT_U32_LIST,
	    .ck_off = OFF(cf_cache_boundaries),
	    .ck_n_off = OFF(cf_cache_boundaries_n),
	    .ck_defdoc = "empty",
	    .ck_meta = "N,N,...",
	    .ck_help = "ascending token positions for prefix keys" },
	{ .ck_name = "cache-index",
	    .ck_type = KT_CACHE_INDEX,
	    .ck_off = OFF(cf_cache_index),
	    .ck_def = "tree",
	    .ck_meta = "tree|hash",
	    .ck_help = "cache_aware index: tree or hash" },
	LONGV("cache-ttl-secs", NULL, cf_cache_ttl_secs, "180", 1, LONG_MAX,
	    "hash-mode placement lifetime"),
	LONGO("kv-indexer-ttl-secs", NULL, cf_kv_indexer_ttl_secs, 0, LONG_MAX,
	    "prune KV-event index entries idle this long (0 = never)"),
	LONGO("kv-indexer-max-entries", NULL, cf_kv_indexer_max_entries, 0,
	    LONG_MAX, "KV-event index size cap (0 = unbounded)"),
	LONGV("max-idle-secs", "sticky-key-idle-secs", cf_max_idle_secs,
	    "14400", 0, LONG_MAX,
	    "drop manual/sticky keys idle this long (0 = never)"),
	{ .ck_name = "assignment-mode",
	    .ck_type = KT_ASSIGN,
	    .ck_off = OFF(cf_assignment_mode),
	    .ck_set_off = OFF(cf_assignment_mode_set),
	    .ck_defdoc = "random (manual) / delegate (sticky)",
	    .ck_meta = "MODE",
	    .ck_help = "random, min_load, min_group, delegate" },
	LONGV("prefix-token-count", NULL, cf_prefix_token_count, "256", 1,
	    LONG_MAX, "prefix_hash key length in tokens"),
	DBLV("prefix-hash-load-factor", NULL, cf_prefix_hash_load_factor,
	    "1.25", 1, DMAX_NONE, 0, "prefix_hash overload factor over mean"),
	LONGV("prefix-hash-balance-abs-threshold", NULL,
	    cf_prefix_hash_balance_abs_threshold, "10", 0, LONG_MAX,
	    "prefix_hash overload absolute margin over mean"),
	DBLV("least-load-kv-pressure-weight", NULL,
	    cf_least_load_kv_pressure_weight, "0.15", 0, DMAX_NONE, 0,
	    "least_load KV pressure weight (seconds)"),
	DBLV("least-load-default-throughput", NULL,
	    cf_least_load_default_throughput, "2000.0", 0, DMAX_NONE,
	    KF_MIN_EXCL, "least_load assumed throughput (tokens/s)"),
	LONGV("least-load-mean-prefill-tokens", NULL,
	    cf_least_load_mean_prefill_tokens, "1024", 1, LONG_MAX,
	    "least_load assumed prefill length"),
	LONGV("least-load-max-waiting-requests", NULL,
	    cf_least_load_max_waiting_requests, "0", 0, U32_MAX_L,
	    "least_load waiting-request cap (0 = off)"),
	SWITCH("routing-key-override", "sticky-sessions", 0,
	    cf_routing_key_override, "pin routing keys to workers"),
	LISTV("routing-key-headers", NULL, cf_routing_key_headers,
	    "x-smg-routing-key", KC_HEADER, 0, "NAME...",
	    "ordered header names carrying the routing key"),

	SECTION("Load monitoring and overload protection"),
	LONGV("load-monitor-interval", NULL, cf_load_monitor_interval, "10", 1,
	    LONG_MAX, "seconds between load polls"),
	SWITCH("disable-load-monitoring", NULL, 0, cf_disable_load_monitoring,
	    "poll loads only when something needs them"),
	SWITCH("engine-metrics", NULL, 0, cf_engine_metrics,
	    "re-export engine load as smg_engine_* gauges"),
	SWITCH("worker-overload-protection", NULL, 0,
	    cf_worker_overload_protection,
	    "enable the overload guard (token ceiling 0.9)"),
	LONGO("worker-overload-waiting-requests", NULL,
	    cf_worker_overload_waiting_requests, 1, LONG_MAX,
	    "veto a worker at this many waiting requests"),
	DBLO("worker-overload-token-usage", NULL,
	    cf_worker_overload_token_usage, 0, 1, KF_MIN_EXCL,
	    "veto a worker at this mean KV usage"),

	SECTION("Health checks"),
	LONGV("health-failure-threshold", NULL, cf_health_failure_threshold,
	    "3", 1, U32_MAX_L, "failed probes that make a worker NotReady"),
	LONGV("health-success-threshold", NULL, cf_health_success_threshold,
	    "2", 1, U32_MAX_L, "good probes that make a worker Ready"),
	LONGV("health-check-timeout-secs", NULL, cf_health_check_timeout_secs,
	    "5", 1, LONG_MAX, "per-probe timeout"),
	LONGV("health-check-interval-secs", NULL, cf_health_check_interval_secs,
	    "60", 1, LONG_MAX, "probe period per worker"),
	STRV("health-check-endpoint", NULL, cf_health_check_endpoint, "/health",
	    KC_HTTP_PATH, "PATH", "HTTP path probed"),
	SWITCH("disable-health-check", NULL, 0, cf_disable_health_check,
	    "no probing; workers start Ready"),
	SWITCH("remove-unhealthy-workers", "worker-auto-recovery", 0,
	    cf_remove_unhealthy_workers, "remove workers that reach Failed"),
	LONGV("drain-settle-secs", NULL, cf_drain_settle_secs, "5", 0, LONG_MAX,
	    "Draining period of a removed worker"),

	SECTION("Retries and circuit breaker"),
	LONGV("retry-max-retries", NULL, cf_retry_max_retries, "5", 1,
	    U32_MAX_L, "total attempts including the first"),
	LONGV("retry-initial-backoff-ms", NULL, cf_retry_initial_backoff_ms,
	    "50", 1, LONG_MAX, "first retry backoff"),
	LONGV("retry-max-backoff-ms", NULL, cf_retry_max_backoff_ms, "30000", 1,
	    LONG_MAX, "backoff ceiling (>= initial)"),
	DBLV("retry-backoff-multiplier", NULL, cf_retry_backoff_multiplier,
	    "1.5", 1, DMAX_NONE, 0, "backoff growth per attempt"),
	DBLV("retry-jitter-factor", NULL, cf_retry_jitter_factor, "0.2", 0, 1,
	    0, "random share of each backoff"),
	SWITCH("disable-retries", NULL, 0, cf_disable_retries,
	    "one attempt only"),
	LONGV("cb-failure-threshold", NULL, cf_cb_failure_threshold, "10", 1,
	    U32_MAX_L, "consecutive failures that open the breaker"),
	LONGV("cb-success-threshold", NULL, cf_cb_success_threshold, "3", 1,
	    U32_MAX_L, "half-open successes that close the breaker"),
	LONGV("cb-timeout-duration-secs", NULL, cf_cb_timeout_duration_secs,
	    "60", 1, LONG_MAX, "open to half-open delay"),
	LONGV("cb-window-duration-secs", NULL, cf_cb_window_duration_secs,
	    "120", 1, LONG_MAX, "failure window (validated, unused)"),
	SWITCH("disable-circuit-breaker", NULL, 0, cf_disable_circuit_breaker,
	    "the breaker never opens"),

	SECTION("Request handling, admission, observability"),
	LONGV("request-timeout-secs", NULL, cf_request_timeout_secs, "1800", 1,
	    LONG_MAX, "upstream request timeout"),
	U64V("max-payload-size", NULL, cf_max_payload_size, "536870912", 1,
	    "request and response body limit"),
	U64V("max-buffered-request-bytes", "stream-request-bodies-over",
	    cf_max_buffered_request_bytes, "0", 0,
	    "stream larger request bodies unparsed (0 = never)"),
	LONGV("stream-body-stall-timeout-secs", NULL,
	    cf_stream_body_stall_timeout_secs, "300", 1, LONG_MAX,
	    "408 when a request body stalls this long"),
	U64V("body-min-rate-bytes-per-sec", NULL,
	    cf_body_min_rate_bytes_per_sec, "1024", 0,
	    "408 when a body brings less over 10 s (0 = no minimum)"),
	U64V("max-buffered-bytes-total", NULL, cf_max_buffered_bytes_total,
	    "1073741824", 0,
	    "request body bytes one frontend holds at most (503 beyond; 0 = "
	    "no cap)"),
	LONGV("stream-first-byte-timeout-secs", NULL,
	    cf_stream_first_byte_timeout_secs, "300", 0, LONG_MAX,
	    "streamed response: wait this long for its first byte (0 = no)"),
	LONGV("stream-idle-timeout-secs", NULL, cf_stream_idle_timeout_secs,
	    "120", 0, LONG_MAX,
	    "streamed response: cut after this long without a byte (0 = no)"),
	LONGV("shutdown-grace-period-secs", NULL, cf_shutdown_grace_period_secs,
	    "180", 0, LONG_MAX, "drain time on shutdown"),
	LONGV("max-concurrent-requests", NULL, cf_max_concurrent_requests, "-1",
	    LONG_MIN, LONG_MAX, "admission cap (<= 0: off)"),
	LONGV("queue-size", NULL, cf_queue_size, "100", 0, LONG_MAX,
	    "requests queued at the admission cap"),
	LONGV("queue-timeout-secs", NULL, cf_queue_timeout_secs, "60", 1,
	    LONG_MAX, "longest wait in the admission queue"),
	LONGO("rate-limit-tokens-per-second", NULL,
	    cf_rate_limit_tokens_per_second, 1, LONG_MAX,
	    "admission token-bucket refill rate"),
	LISTV("request-id-headers", NULL, cf_request_id_headers,
	    "x-request-id x-correlation-id x-trace-id request-id", KC_HEADER, 0,
	    "NAME...", "headers checked for an incoming request id"),
	STRV("api-key", NULL, cf_api_key, NULL, KC_NONE, "KEY",
	    "bearer key required from clients, sent to startup workers"),
	{ .ck_name = "log-level",
	    .ck_type = KT_LOG_LEVEL,
	    .ck_off = OFF(cf_log_level),
	    .ck_def = "info",
	    .ck_meta = "LEVEL",
	    .ck_help = "debug, info, warn, error" },
	SWITCH("log-json", NULL, 0, cf_log_json, "log lines as JSON"),
	STRV("log-dir", NULL, cf_log_dir, NULL, KC_NONE, "DIR",
	    "directory of log files (<role>.log; reopened on SIGUSR1)"),
	SWITCH("no-access-log", NULL, 0, cf_no_access_log,
	    "no per-request access line at info level (smg-c)"),
	SWITCH("enable-trace", NULL, 0, cf_enable_trace,
	    "OpenTelemetry spans exported to --otlp-traces-endpoint"),
	STRV("otlp-traces-endpoint", NULL, cf_otlp_traces_endpoint,
	    "localhost:4317", KC_NONE, "URL",
	    "OTLP/HTTP collector (host:port or URL; /v1/traces added)"),
	SWITCH("service-discovery", NULL, 0, cf_service_discovery,
	    "Kubernetes discovery (turns on --enable-igw)"),
	LISTV("selector", NULL, cf_selector, NULL, KC_SELECTOR, 0, "K=V...",
	    "Kubernetes label selector of workers"),
	LISTV("prefill-selector", NULL, cf_prefill_selector, NULL, KC_SELECTOR,
	    0, "K=V...", "Kubernetes label selector of prefill workers"),
	LISTV("decode-selector", NULL, cf_decode_selector, NULL, KC_SELECTOR, 0,
	    "K=V...", "Kubernetes label selector of decode workers"),
	LISTV("encode-selector", NULL, cf_encode_selector, NULL, KC_SELECTOR, 0,
	    "K=V...", "Kubernetes label selector of encode workers (EPD mode)"),
	LONGV("service-discovery-port", NULL, cf_service_discovery_port, "80",
	    1, 65535, "worker port of discovered pods"),
	STRV("service-discovery-namespace", NULL,
	    cf_service_discovery_namespace, NULL, KC_NAMESPACE, "NS",
	    "Kubernetes namespace watched (default: all)"),
	STRV("model-id-from", NULL, cf_model_id_from, NULL, KC_ID_SOURCE, "SRC",
	    "model id of discovered pods: namespace, label:<key>, "
	    "annotation:<key>"),

	SECTION("TLS and mTLS"),
	STRV("tls-cert-path", NULL, cf_tls_cert_path, NULL, KC_NONE, "PEM",
	    "server certificate; with --tls-key-path serve HTTPS"),
	STRV("tls-key-path", NULL, cf_tls_key_path, NULL, KC_NONE, "PEM",
	    "server private key"),
	STRV("client-cert-path", NULL, cf_client_cert_path, NULL, KC_NONE,
	    "PEM", "client certificate presented to https:// workers"),
	STRV("client-key-path", NULL, cf_client_key_path, NULL, KC_NONE, "PEM",
	    "client key presented to https:// workers"),
	LISTV("ca-cert-paths", NULL, cf_ca_cert_paths, NULL, KC_NONE, 0,
	    "PEM...", "CAs verifying https:// workers (default: system)"),

	SECTION("Authentication, tenants and CORS"),
	LISTV("control-plane-api-keys", NULL, cf_control_plane_api_keys, NULL,
	    KC_NONE, KF_ONE, "ID:NAME:ROLE:KEY",
	    "control-plane key, role admin or user (repeatable; also "
	    "CONTROL_PLANE_API_KEYS)"),
	STRV("jwt-issuer", NULL, cf_jwt_issuer, NULL, KC_URL, "URL",
	    "JWT issuer (iss); its OIDC discovery finds the JWKS"),
	STRV("jwt-audience", NULL, cf_jwt_audience, NULL, KC_NONE, "AUD",
	    "JWT audience (aud) required"),
	STRV("jwt-jwks-uri", NULL, cf_jwt_jwks_uri, NULL, KC_URL, "URL",
	    "JWKS URL (default: from OIDC discovery)"),
	STRV("jwt-role-claim", NULL, cf_jwt_role_claim, "roles", KC_NONE,
	    "CLAIM", "JWT claim holding the roles"),
	LISTV("jwt-role-mapping", NULL, cf_jwt_role_mapping, NULL, KC_NONE,
	    KF_ONE, "IDP=ROLE", "IdP role to admin or user (repeatable)"),
	LISTV("tenant-api-key", NULL, cf_tenant_api_keys, NULL, KC_NONE, KF_ONE,
	    "TENANT:KEY", "data-plane key of one tenant (repeatable)"),
	SWITCH("disable-audit-logging", NULL, 0, cf_disable_audit_logging,
	    "no audit line per control-plane request"),
	SWITCH("trust-tenant-header", NULL, 0, cf_trust_tenant_header,
	    "tenant id from --tenant-header-name when no key names one"),
	STRV("tenant-header-name", NULL, cf_tenant_header_name,
	    "x-smg-tenant-id", KC_HEADER, "NAME", "tenant id header"),
	SWITCH("tenant-rate-limit-enabled", NULL, 0,
	    cf_tenant_rate_limit_enabled, "per-tenant request rate limits"),
	STRV("tenant-rate-limit-config", NULL, cf_tenant_rate_limit_config,
	    NULL, KC_NONE, "PATH",
	    "per-tenant limits (JSON form of SMG's YAML)"),
	LISTV("cors-allowed-origins", NULL, cf_cors_allowed_origins, NULL,
	    KC_NONE, 0, "ORIGIN...", "origins answered with CORS headers"),

	SECTION("SMG flags accepted without effect (docs/compat.md)"),
	ACCEPT("chat-template", CV_STRING, KCOMPAT_INERT, SUB_GRPC, "PATH",
	    "chat template of the gRPC path"),
	ACCEPT("reasoning-parser", CV_STRING, KCOMPAT_INERT, SUB_GRPC, "NAME",
	    "reasoning parser of the gRPC path"),
	ACCEPT("tool-call-parser", CV_STRING, KCOMPAT_INERT, SUB_GRPC, "NAME",
	    "tool-call parser of the gRPC path"),
	ACCEPT("disable-tokenizer-autoload", CV_SWITCH, KCOMPAT_INERT, SUB_GRPC,
	    NULL, "no tokenizer loading at startup"),
	ACCEPT("tokenizer-cache-enable-l0", CV_SWITCH, KCOMPAT_INERT, SUB_GRPC,
	    NULL, "tokenizer exact-match cache"),
	ACCEPTL("tokenizer-cache-l0-max-entries", 0, LONG_MAX, KCOMPAT_INERT,
	    SUB_GRPC, "tokenizer L0 cache entries"),
	ACCEPT("tokenizer-cache-enable-l1", CV_SWITCH, KCOMPAT_INERT, SUB_GRPC,
	    NULL, "tokenizer prefix cache"),
	ACCEPTL("tokenizer-cache-l1-max-memory", 0, LONG_MAX, KCOMPAT_INERT,
	    SUB_GRPC, "tokenizer L1 cache bytes"),
	ACCEPTC("multimodal-tensor-transport", config_transports, KCOMPAT_INERT,
	    SUB_GRPC, "MODE",
	    "multimodal tensor transport: inline, shm, auto, rdma"),
	ACCEPTL("multimodal-shm-min-bytes", 0, LONG_MAX, KCOMPAT_INERT,
	    SUB_GRPC, "multimodal shared-memory threshold"),
	ACCEPT("router-selector", CV_LIST, KCOMPAT_INERT, SUB_K8S, "K=V...",
	    "label selector of peer gateways"),
	ACCEPTL("runtime-worker-threads", 1, LONG_MAX, KCOMPAT_INERT,
	    SUB_RUNTIME, "async runtime threads"),
	ACCEPTC("history-backend", config_history_backends, KCOMPAT_ABSENT,
	    SUB_STORAGE, "NAME",
	    "response storage: memory, none, oracle, postgres, redis"),
	ACCEPT("storage-context-headers", CV_LIST, KCOMPAT_ABSENT, SUB_STORAGE,
	    "NAME...", "headers passed to response storage"),
	ACCEPT("schema-config", CV_STRING, KCOMPAT_ABSENT, SUB_STORAGE, "PATH",
	    "storage schema file"),
	ACCEPT("oracle-wallet-path", CV_STRING, KCOMPAT_ABSENT, SUB_STORAGE,
	    "PATH", "Oracle storage"),
	ACCEPT("oracle-tns-alias", CV_STRING, KCOMPAT_ABSENT, SUB_STORAGE,
	    "NAME", "Oracle storage"),
	ACCEPT("oracle-dsn", CV_STRING, KCOMPAT_ABSENT, SUB_STORAGE, "DSN",
	    "Oracle storage"),
	ACCEPT("oracle-user", CV_STRING, KCOMPAT_ABSENT, SUB_STORAGE, "USER",
	    "Oracle storage"),
	ACCEPT("oracle-password", CV_STRING, KCOMPAT_ABSENT, SUB_STORAGE,
	    "PASSWORD", "Oracle storage"),
	ACCEPT("oracle-external-auth", CV_SWITCH, KCOMPAT_ABSENT, SUB_STORAGE,
	    NULL, "Oracle storage"),
	ACCEPTL("oracle-pool-min", 1, LONG_MAX, KCOMPAT_ABSENT, SUB_STORAGE,
	    "Oracle storage"),
	ACCEPTL("oracle-pool-max", 1, LONG_MAX, KCOMPAT_ABSENT, SUB_STORAGE,
	    "Oracle storage"),
	ACCEPTL("oracle-pool-timeout-secs", 0, LONG_MAX, KCOMPAT_ABSENT,
	    SUB_STORAGE, "Oracle storage"),
	ACCEPT("postgres-db-url", CV_STRING, KCOMPAT_ABSENT, SUB_STORAGE, "URL",
	    "PostgreSQL storage"),
	ACCEPTL("postgres-pool-max-size", 1, LONG_MAX, KCOMPAT_ABSENT,
	    SUB_STORAGE, "PostgreSQL storage"),
	ACCEPT("redis-url", CV_STRING, KCOMPAT_ABSENT, SUB_STORAGE, "URL",
	    "Redis storage"),
	ACCEPTL("redis-pool-max-size", 1, LONG_MAX, KCOMPAT_ABSENT, SUB_STORAGE,
	    "Redis storage"),
	ACCEPTL("redis-retention-days", LONG_MIN, LONG_MAX, KCOMPAT_ABSENT,
	    SUB_STORAGE, "Redis storage"),
	ACCEPT("enable-wasm", CV_SWITCH, KCOMPAT_ABSENT, SUB_WASM, NULL,
	    "WASM middleware"),
	ACCEPT("storage-hook-wasm-path", CV_STRING, KCOMPAT_ABSENT, SUB_WASM,
	    "PATH", "WASM storage hook"),
	ACCEPT("mcp-config-path", CV_STRING, KCOMPAT_ABSENT, SUB_MCP, "PATH",
	    "MCP tool servers"),
	ACCEPT("enable-mesh", CV_SWITCH, KCOMPAT_ABSENT, SUB_MESH, NULL,
	    "gateway mesh"),
	ACCEPT("mesh-server-name", CV_STRING, KCOMPAT_ABSENT, SUB_MESH, "NAME",
	    "gateway mesh"),
	ACCEPT("mesh-host", CV_STRING, KCOMPAT_ABSENT, SUB_MESH, "ADDR",
	    "gateway mesh"),
	ACCEPT("mesh-advertise-host", CV_STRING, KCOMPAT_ABSENT, SUB_MESH,
	    "ADDR", "gateway mesh"),
	ACCEPTL("mesh-port", 0, 65535, KCOMPAT_ABSENT, SUB_MESH,
	    "gateway mesh"),
	ACCEPT("mesh-peer-urls", CV_LIST, KCOMPAT_ABSENT, SUB_MESH, "ADDR...",
	    "gateway mesh"),
	ACCEPT("webrtc-bind-addr", CV_IP, KCOMPAT_ABSENT, SUB_WEBRTC, "IP",
	    "WebRTC realtime"),
	ACCEPT("webrtc-stun-server", CV_STRING, KCOMPAT_ABSENT, SUB_WEBRTC,
	    "HOST:PORT", "WebRTC realtime"),
	ACCEPT("priority-scheduler-enabled", CV_SWITCH, KCOMPAT_ABSENT,
	    SUB_PRIORITY, NULL, "priority scheduler"),
	ACCEPT("priority-scheduler-default-max-class", CV_STRING,
	    KCOMPAT_ABSENT, SUB_PRIORITY, "CLASS", "priority scheduler"),
	ACCEPT("priority-scheduler-config", CV_STRING, KCOMPAT_ABSENT,
	    SUB_PRIORITY, "PATH", "priority scheduler"),
	ACCEPTL("priority-scheduler-tenant-metric-top-n", 0, U32_MAX_L,
	    KCOMPAT_ABSENT, SUB_PRIORITY, "priority scheduler"),
};

#define CONFIG_NKEYS (sizeof(config_keys) / sizeof(config_keys[0]))

struct parse_state {
	bool ps_given[CONFIG_NKEYS];
};

static const char *const assignment_names[] = {
	[ASSIGNMENT_MODE_RANDOM] = "random",
	[ASSIGNMENT_MODE_MIN_LOAD] = "min_load",
	[ASSIGNMENT_MODE_MIN_GROUP] = "min_group",
	[ASSIGNMENT_MODE_DELEGATE] = "delegate",
};

static const char *const worker_schemes[] = { "http", "https", "grpc", "grpcs",
	"ipc", NULL };

/* Longest --run-dir that leaves room for socket names in sun_path. */
#define CONFIG_RUN_DIR_MAX 90

static int cfg_err(char *, size_t, const char *, ...)
    __attribute__((format(printf, 3, 4)));
static void *fld(struct config *, size_t);
static bool name_eq_loose(const char *, const char *);
static const struct config_key *key_find_long(const char *, size_t);
static const struct config_key *key_find_short(char);
static size_t key_index(const struct config_key *);
static bool key_given(const struct parse_state *, const char *);
static bool is_flag_token(const char *);
static void bounds_describe(const struct config_key *, char *, size_t);
static int value_long(const struct config_key *, const char *, const char *,
    long *, char *, size_t);
static int value_u64(const struct config_key *, const char *, const char *,
    uint64_t *, char *, size_t);
static int value_double(const struct config_key *, const char *, const char *,
    double *, char *, size_t);
static int value_check(const struct config_key *, const char *, const char *,
    char *, size_t);
static int value_policy(const struct config_key *, const char *, const char *,
    enum policy_kind *, char *, size_t);
static void choices_join(const char *const *, char *, size_t);
static int compat_check(const struct config_key *, const char *, const char *,
    char *, size_t);
static int compat_value(const struct config_key *, const char *, const char *,
    int, char *[], int *, char *, size_t);
static int compat_finish(struct config *, struct parse_state *);
static void list_clear(struct config *, const struct config_key *);
static int list_add(struct config *, const struct config_key *, const char *,
    const char *, char *, size_t);
static int key_apply(struct config *, const struct config_key *, const char *,
    const char *, bool, char *, size_t);
static int defaults_apply(struct config *, char *, size_t);
static int endpoint_port(const char *, const char *, int *, char *, size_t);
static enum config_result parse_one(struct config *, struct parse_state *, int,
    char *[], int *, char *, size_t);
static int check_modes(struct config *, struct parse_state *, char *, size_t);
static int check_power_of_two(const char *, size_t, const char *, char *,
    size_t);
static int check_compat(struct config *, char *, size_t);
static int check_values(struct config *, char *, size_t);
static int check_idp_url(const char *, const char *, char *, size_t);
static bool check_role_name(const char *, size_t);
static int check_auth(struct config *, char *, size_t);
static int check_own(struct config *, char *, size_t);
static bool config_tcp_url(const char *);
static int config_finish(struct config *, struct parse_state *, char *, size_t);
static void key_usage(FILE *, const struct config_key *);

static int
cfg_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (errlen > 0) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return -1;
}

static void *
fld(struct config *cf, size_t off)
{
	return (char *)cf + off;
}

/* Compares ignoring case and underscores ("Round_Robin" = "roundrobin"). */
static bool
name_eq_loose(const char *a, const char *b)
{
	for (;;) {
		while (*a == '_')
			a++;
		while (*b == '_')
			b++;
		if (*a == '\0' || *b == '\0')
			return *a == *b;
		if (tolower((unsigned char)*a) != tolower((unsigned char)*b))
			return false;
		a++;
		b++;
	}
}

const char *
assignment_mode_name(enum assignment_mode mode)
{
	if ((unsigned)mode > ASSIGNMENT_MODE_DELEGATE)
		return "unknown";
	return assignment_names[mode];
}

int
assignment_mode_parse(const char *name, enum assignment_mode *out)
{
	size_t i;

	for (i = 0; i <= ASSIGNMENT_MODE_DELEGATE; i++) {
		if (name_eq_loose(name, assignment_names[i])) {
			*out = (enum assignment_mode)i;
			return 0;
		}
	}
	return -1;
}

int
config_check_header_name(const char *name)
{
	const char *p;

	if (name == NULL || *name == '\0')
		return -1;
	for (p = name; *p != '\0'; p++) {
		if (isalnum((unsigned char)*p))
			continue;
		if (strchr("!#$%&'*+-.^_`|~", *p) == NULL)
			return -1;
	}
	return 0;
}

int
config_check_worker_url(const char *url, char *err, size_t errlen)
{
	const char *sep, *rest, *end, *host, *hend, *port;
	size_t i, slen;
	long v;
	char *pend;

	for (i = 0; url[i] != '\0'; i++) {
		if (isspace((unsigned char)url[i]) ||
		    iscntrl((unsigned char)url[i]))
			return cfg_err(err, errlen,
			    "invalid worker URL '%s' (contains whitespace or "
			    "control characters)",
			    url);
	}
	if ((sep = strstr(url, "://")) == NULL)
		return cfg_err(err, errlen,
		    "invalid worker URL '%s' (expected http://, https://, "
		    "grpc://, grpcs:// or ipc://)",
		    url);
	slen = (size_t)(sep - url);
	for (i = 0; worker_schemes[i] != NULL; i++) {
		if (strlen(worker_schemes[i]) == slen &&
		    strncmp(url, worker_schemes[i], slen) == 0)
			break;
	}
	if (worker_schemes[i] == NULL)
		return cfg_err(err, errlen,
		    "invalid worker URL '%s' (unsupported scheme '%.*s'; "
		    "expected lowercase http, https, grpc, grpcs or ipc)",
		    url, (int)slen, url);
	rest = sep + 3;
	if (strcmp(worker_schemes[i], "ipc") == 0) {
		if (*rest == '\0')
			return cfg_err(err, errlen,
			    "invalid worker URL '%s' (ipc:// needs a socket "
			    "path)",
			    url);
		return 0;
	}
	end = rest + strcspn(rest, "/?#");
	/* "host[:port]@N" names data-parallel rank N of that worker. */
	if (url_rank(url) >= 0 && strrchr(rest, '@') < end)
		end = strrchr(rest, '@');
	if ((host = memchr(rest, '@', (size_t)(end - rest))) != NULL)
		return cfg_err(err, errlen,
		    "invalid worker URL '%s' (user information not "
		    "supported; a data-parallel rank is written "
		    "host:port@N, N 0..2147483647)",
		    url);
	host = rest;
	if (*host == '[') {
		hend = memchr(host, ']', (size_t)(end - host));
		if (hend == NULL || hend == host + 1)
			return cfg_err(err, errlen,
			    "invalid worker URL '%s' (bad IPv6 host)", url);
		port = hend + 1;
		if (port != end && *port != ':')
			return cfg_err(err, errlen,
			    "invalid worker URL '%s' (bad IPv6 host)", url);
	} else {
		hend = memchr(host, ':', (size_t)(end - host));
		if (hend == NULL)
			hend = end;
		if (hend == host)
			return cfg_err(err, errlen,
			    "invalid worker URL '%s' (missing host)", url);
		port = hend;
	}
	if (port == end)
		return 0;
	port++; /* skip ':' */
	if (port == end || !isdigit((unsigned char)*port))
		return cfg_err(err, errlen,
		    "invalid worker URL '%s' (bad port)", url);
	errno = 0;
	v = strtol(port, &pend, 10);
	if (errno != 0 || pend != end || v < 1 || v > 65535)
		return cfg_err(err, errlen,
		    "invalid worker URL '%s' (bad port)", url);
	return 0;
}

static const struct config_key *
key_find_long(const char *name, size_t len)
{
	const struct config_key *k;
	size_t i;

	for (i = 0; i < CONFIG_NKEYS; i++) {
		k = &config_keys[i];
		if (k->ck_type == KT_SECTION)
			continue;
		if (strlen(k->ck_name) == len &&
		    strncmp(k->ck_name, name, len) == 0)
			return k;
		if (k->ck_alias != NULL && strlen(k->ck_alias) == len &&
		    strncmp(k->ck_alias, name, len) == 0)
			return k;
	}
	return NULL;
}

static const struct config_key *
key_find_short(char c)
{
	size_t i;

	for (i = 0; i < CONFIG_NKEYS; i++) {
		if (config_keys[i].ck_short != 0 &&
		    config_keys[i].ck_short == c)
			return &config_keys[i];
	}
	return NULL;
}

static size_t
key_index(const struct config_key *k)
{
	return (size_t)(k - config_keys);
}

/* Whether the flag (primary name without "--") was on the command line. */
static bool
key_given(const struct parse_state *ps, const char *name)
{
	const struct config_key *k;

	if ((k = key_find_long(name, strlen(name))) == NULL)
		fatalx("%s: no key %s", __func__, name);
	return ps->ps_given[key_index(k)];
}

/* A token that starts the next flag ends a flag's values. */
static bool
is_flag_token(const char *t)
{
	if (t[0] == '-' && t[1] == '-')
		return true;
	if (t[0] == '-' && t[1] != '\0' && t[2] == '\0' &&
	    key_find_short(t[1]) != NULL)
		return true;
	return false;
}

static void
bounds_describe(const struct config_key *k, char *buf, size_t len)
{
	bool lo, hi;

	if (k->ck_type == KT_DOUBLE || k->ck_type == KT_DOUBLE_LIST) {
		lo = k->ck_dmin != DMIN_NONE;
		hi = k->ck_dmax != DMAX_NONE;
		if (lo && hi &&
		    (k->ck_flags & (KF_MIN_EXCL | KF_MAX_EXCL)) == 0)
			snprintf(buf, len, "%g..%g", k->ck_dmin, k->ck_dmax);
		else if (lo && hi)
			snprintf(buf, len, "%s %g and %s %g",
			    (k->ck_flags & KF_MIN_EXCL) ? ">" : ">=",
			    k->ck_dmin,
			    (k->ck_flags & KF_MAX_EXCL) ? "<" : "<=",
			    k->ck_dmax);
		else if (lo)
			snprintf(buf, len, "%s %g",
			    (k->ck_flags & KF_MIN_EXCL) ? ">" : ">=",
			    k->ck_dmin);
		else if (hi)
			snprintf(buf, len, "%s %g",
			    (k->ck_flags & KF_MAX_EXCL) ? "<" : "<=",
			    k->ck_dmax);
		else
			snprintf(buf, len, "a finite number");
		return;
	}
	if (k->ck_type == KT_U64 || k->ck_lmax == LONG_MAX)
		snprintf(buf, len, ">= %ld", k->ck_lmin);
	else if (k->ck_lmin == LONG_MIN)
		snprintf(buf, len, "<= %ld", k->ck_lmax);
	else
		snprintf(buf, len, "%ld..%ld", k->ck_lmin, k->ck_lmax);
}

static int
value_long(const struct config_key *k, const char *flag, const char *val,
    long *out, char *err, size_t errlen)
{
	char *end, range[64];
	long v;

	errno = 0;
	v = strtol(val, &end, 10);
	if (*val == '\0' || isspace((unsigned char)*val) || *end != '\0')
		return cfg_err(err, errlen, "%s: invalid integer '%s'", flag,
		    val);
	bounds_describe(k, range, sizeof(range));
	if (errno == ERANGE || v < k->ck_lmin || v > k->ck_lmax)
		return cfg_err(err, errlen, "%s: %s out of range (expected %s)",
		    flag, val, range);
	*out = v;
	return 0;
}

static int
value_u64(const struct config_key *k, const char *flag, const char *val,
    uint64_t *out, char *err, size_t errlen)
{
	unsigned long long v;
	char *end, range[64];

	if (!isdigit((unsigned char)*val))
		return cfg_err(err, errlen, "%s: invalid integer '%s'", flag,
		    val);
	errno = 0;
	v = strtoull(val, &end, 10);
	if (*end != '\0')
		return cfg_err(err, errlen, "%s: invalid integer '%s'", flag,
		    val);
	bounds_describe(k, range, sizeof(range));
	if (errno == ERANGE || v < (unsigned long long)k->ck_lmin)
		return cfg_err(err, errlen, "%s: %s out of range (expected %s)",
		    flag, val, range);
	*out = (uint64_t)v;
	return 0;
}

static int
value_double(const struct config_key *k, const char *flag, const char *val,
    double *out, char *err, size_t errlen)
{
	char *end, range[64];
	double v;
	bool bad;

	errno = 0;
	v = strtod(val, &end);
	if (*val == '\0' || isspace((unsigned char)*val) || *end != '\0' ||
	    !isfinite(v) || errno == ERANGE)
		return cfg_err(err, errlen, "%s: invalid number '%s'", flag,
		    val);
	bad = false;
	if (k->ck_flags & KF_MIN_EXCL)
		bad = bad || v <= k->ck_dmin;
	else
		bad = bad || v < k->ck_dmin;
	if (k->ck_flags & KF_MAX_EXCL)
		bad = bad || v >= k->ck_dmax;
	else
		bad = bad || v > k->ck_dmax;
	if (bad) {
		bounds_describe(k, range, sizeof(range));
		return cfg_err(err, errlen, "%s: %s out of range (expected %s)",
		    flag, val, range);
	}
	*out = v;
	return 0;
}

static int
value_check(const struct config_key *k, const char *flag, const char *val,
    char *err, size_t errlen)
{
	char why[256];
	struct urlallow_cidr cidr;
	const char *eq;

	if (*val == '\0')
		return cfg_err(err, errlen, "%s: empty value", flag);
	switch (k->ck_check) {
	case KC_NONE:
		break;
	case KC_URL:
		if (config_check_worker_url(val, why, sizeof(why)) == -1)
			return cfg_err(err, errlen, "%s: %s", flag, why);
		break;
	case KC_CIDR:
		if (urlallow_cidr_parse(val, &cidr) == -1)
			return cfg_err(err, errlen,
			    "%s: invalid address range '%s' (expected "
			    "ADDR/BITS)",
			    flag, val);
		break;
	case KC_HEADER:
		if (config_check_header_name(val) == -1)
			return cfg_err(err, errlen,
			    "%s: invalid header name '%s'", flag, val);
		break;
	case KC_SELECTOR:
		eq = strchr(val, '=');
		if (eq == NULL || eq == val)
			return cfg_err(err, errlen,
			    "%s: invalid selector '%s' (expected key=value)",
			    flag, val);
		break;
	case KC_ID_SOURCE:
		if (strcasecmp(val, "namespace") == 0 ||
		    (strncmp(val, "label:", 6) == 0 && val[6] != '\0') ||
		    (strncmp(val, "annotation:", 11) == 0 && val[11] != '\0'))
			break;
		return cfg_err(err, errlen,
		    "%s: invalid value '%s' (expected namespace, label:<key> "
		    "or annotation:<key>)",
		    flag, val);
	case KC_NAMESPACE:
		/* A DNS label: it goes into the API path as it is. */
		if (val[0] == '\0' || strlen(val) > 63 ||
		    strspn(val, "abcdefghijklmnopqrstuvwxyz0123456789-") !=
		        strlen(val) ||
		    val[0] == '-' || val[strlen(val) - 1] == '-')
			return cfg_err(err, errlen,
			    "%s: invalid namespace '%s' (a lowercase DNS "
			    "label)",
			    flag, val);
		break;
	case KC_HTTP_PATH:
		if (val[0] != '/')
			return cfg_err(err, errlen,
			    "%s: invalid path '%s' (must start with '/')", flag,
			    val);
		break;
	}
	return 0;
}

static int
value_policy(const struct config_key *k, const char *flag, const char *val,
    enum policy_kind *out, char *err, size_t errlen)
{
	enum policy_kind p;
	char list[256];
	size_t i, n;
	int known;

	list[0] = '\0';
	n = 0;
	for (i = 0; i < POLICY_KIND_COUNT; i++) {
		if (!policy_info_allowed(policy_info_table[i].pi_kind,
		        k->ck_role))
			continue;
		n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s",
		    n == 0 ? "" : ", ", policy_info_table[i].pi_name);
	}
	known = policy_info_parse(val, &p);
	if (known == -1)
		return cfg_err(err, errlen,
		    "%s: unknown policy '%s' (expected one of: %s)", flag, val,
		    list);
	if (!policy_info_allowed(p, k->ck_role))
		return cfg_err(err, errlen,
		    "%s: policy '%s' not allowed here (expected one of: %s)",
		    flag, val, list);
	*out = p;
	return 0;
}

static void
choices_join(const char *const *choices, char *buf, size_t len)
{
	size_t i, n;

	buf[0] = '\0';
	n = 0;
	for (i = 0; choices[i] != NULL && n < len; i++)
		n += (size_t)snprintf(buf + n, len - n, "%s%s",
		    i == 0 ? "" : ", ", choices[i]);
}

/* Checks one value of a KT_COMPAT flag; nothing is kept. */
static int
compat_check(const struct config_key *k, const char *flag, const char *val,
    char *err, size_t errlen)
{
	struct in6_addr a6;
	struct in_addr a4;
	char list[256];
	long l;
	size_t i;

	switch (k->ck_cv) {
	case CV_LONG:
		return value_long(k, flag, val, &l, err, errlen);
	case CV_CHOICE:
		for (i = 0; k->ck_choices[i] != NULL; i++) {
			if (strcasecmp(k->ck_choices[i], val) == 0)
				return 0;
		}
		choices_join(k->ck_choices, list, sizeof(list));
		return cfg_err(err, errlen,
		    "%s: unknown value '%s' (expected one of: %s)", flag, val,
		    list);
	case CV_IP:
		if (inet_pton(AF_INET, val, &a4) == 1 ||
		    inet_pton(AF_INET6, val, &a6) == 1)
			return 0;
		return cfg_err(err, errlen, "%s: invalid IP address '%s'", flag,
		    val);
	default:
		if (val[0] == '\0')
			return cfg_err(err, errlen, "%s: empty value", flag);
		return 0;
	}
}

/* Consumes and checks the value(s) of a KT_COMPAT flag. */
static int
compat_value(const struct config_key *k, const char *flag, const char *val,
    int argc, char *argv[], int *i, char *err, size_t errlen)
{
	switch (k->ck_cv) {
	case CV_SWITCH:
		if (val == NULL || strcasecmp(val, "true") == 0 ||
		    strcasecmp(val, "false") == 0)
			return 0;
		return cfg_err(err, errlen,
		    "%s: takes no value (or true/false), got '%s'", flag, val);
	case CV_LIST:
		/* Like SMG: zero or more values. */
		if (val != NULL &&
		    compat_check(k, flag, val, err, errlen) == -1)
			return -1;
		while (*i < argc && !is_flag_token(argv[*i])) {
			if (compat_check(k, flag, argv[(*i)++], err, errlen) ==
			    -1)
				return -1;
		}
		return 0;
	default:
		if (val == NULL) {
			if (*i >= argc || is_flag_token(argv[*i]))
				return cfg_err(err, errlen, "%s: missing value",
				    flag);
			val = argv[(*i)++];
		}
		return compat_check(k, flag, val, err, errlen);
	}
}

/*
 * One warning line per KT_COMPAT flag given.
 */
static int
compat_finish(struct config *cf, struct parse_state *ps)
{
	const struct config_key *k;
	const char *why;
	size_t i;

	for (i = 0; i < CONFIG_NKEYS; i++) {
		k = &config_keys[i];
		if (k->ck_type != KT_COMPAT || !ps->ps_given[i])
			continue;
		switch (k->ck_compat) {
		case KCOMPAT_INERT:
			why = "no effect: it applies to";
			break;
		case KCOMPAT_ABSENT:
			why = "not used: this gateway has no";
			break;
		default:
			why = "not implemented yet:";
			break;
		}
		cf->cf_warnings = xreallocarray(cf->cf_warnings,
		    cf->cf_warnings_n + 1, sizeof(char *));
		cf->cf_warnings[cf->cf_warnings_n++] = xasprintf(
		    "--%s: accepted, %s %s%s", k->ck_name, why, k->ck_subsystem,
		    k->ck_compat == KCOMPAT_ABSENT ? " (its routes answer 501)"
		                                   : "");
	}
	return 0;
}

static void
list_clear(struct config *cf, const struct config_key *k)
{
	size_t *np = fld(cf, k->ck_n_off);
	void **pp = fld(cf, k->ck_off);
	struct config_endpoint *ep;
	struct config_alias *al;
	char **sp;
	size_t i;

	switch (k->ck_type) {
	case KT_LIST:
		sp = *pp;
		for (i = 0; i < *np; i++)
			free(sp[i]);
		break;
	case KT_ENDPOINT:
		ep = *pp;
		for (i = 0; i < *np; i++)
			free(ep[i].ce_url);
		break;
	case KT_ALIAS:
		al = *pp;
		for (i = 0; i < *np; i++) {
			free(al[i].ca_alias);
			free(al[i].ca_canonical);
		}
		break;
	default:
		break;
	}
	free(*pp);
	*pp = NULL;
	*np = 0;
}

/* Appends one value to a list key; numeric lists split it on commas. */
static int
list_add(struct config *cf, const struct config_key *k, const char *flag,
    const char *val, char *err, size_t errlen)
{
	size_t *np = fld(cf, k->ck_n_off);
	char ***sp = fld(cf, k->ck_off);
	uint32_t **up = fld(cf, k->ck_off);
	double **dp = fld(cf, k->ck_off);
	struct config_alias **ap = fld(cf, k->ck_off);
	char *copy, *piece, *save, *s;
	unsigned long long u;
	const char *eq;
	double d;
	int rv;

	switch (k->ck_type) {
	case KT_LIST:
		if (value_check(k, flag, val, err, errlen) == -1)
			return -1;
		*sp = xreallocarray(*sp, *np + 1, sizeof(**sp));
		s = xstrdup(val);
		if (k->ck_check == KC_HEADER) {
			for (piece = s; *piece != '\0'; piece++)
				*piece = (char)tolower((unsigned char)*piece);
		}
		(*sp)[(*np)++] = s;
		return 0;
	case KT_ALIAS:
		eq = strchr(val, '=');
		if (eq == NULL || eq == val || eq[1] == '\0')
			return cfg_err(err, errlen,
			    "%s: invalid alias '%s' (expected alias=canonical)",
			    flag, val);
		*ap = xreallocarray(*ap, *np + 1, sizeof(**ap));
		(*ap)[*np].ca_alias = xstrndup(val, (size_t)(eq - val));
		(*ap)[*np].ca_canonical = xstrdup(eq + 1);
		(*np)++;
		return 0;
	case KT_U32_LIST:
	case KT_DOUBLE_LIST:
		break;
	default:
		fatalx("%s: key %s is not a list", __func__, k->ck_name);
	}
	/* Empty pieces ("2048,", "") are skipped: "" means an empty list. */
	copy = xstrdup(val);
	rv = 0;
	for (piece = strtok_r(copy, ",", &save); piece != NULL;
	     piece = strtok_r(NULL, ",", &save)) {
		if (k->ck_type == KT_U32_LIST) {
			errno = 0;
			u = isdigit((unsigned char)*piece)
			    ? strtoull(piece, &s, 10)
			    : 0;
			if (!isdigit((unsigned char)*piece) || *s != '\0') {
				rv = cfg_err(err, errlen,
				    "%s: invalid integer '%s'", flag, piece);
				break;
			}
			if (errno == ERANGE || u == 0 || u > UINT32_MAX) {
				rv = cfg_err(err, errlen,
				    "%s: %s out of range (expected 1..%u)",
				    flag, piece, (unsigned)UINT32_MAX);
				break;
			}
			*up = xreallocarray(*up, *np + 1, sizeof(**up));
			(*up)[(*np)++] = (uint32_t)u;
		} else {
			if ((rv = value_double(k, flag, piece, &d, err,
			         errlen)) == -1)
				break;
			*dp = xreallocarray(*dp, *np + 1, sizeof(**dp));
			(*dp)[(*np)++] = d;
		}
	}
	free(copy);
	return rv;
}

/* Sets a single-valued key; user = given on the command line. */
static int
key_apply(struct config *cf, const struct config_key *k, const char *flag,
    const char *val, bool user, char *err, size_t errlen)
{
	void *p = fld(cf, k->ck_off);
	enum assignment_mode am;
	enum log_level lv;
	char **sp, *s, list[256];
	size_t i;

	switch (k->ck_type) {
	case KT_LONG:
		if (value_long(k, flag, val, p, err, errlen) == -1)
			return -1;
		break;
	case KT_U64:
		if (value_u64(k, flag, val, p, err, errlen) == -1)
			return -1;
		break;
	case KT_DOUBLE:
		if (value_double(k, flag, val, p, err, errlen) == -1)
			return -1;
		break;
	case KT_STRING:
		if (value_check(k, flag, val, err, errlen) == -1)
			return -1;
		s = xstrdup(val);
		if (k->ck_choices != NULL) {
			for (i = 0; k->ck_choices[i] != NULL; i++) {
				if (strcasecmp(k->ck_choices[i], val) == 0)
					break;
			}
			if (k->ck_choices[i] == NULL) {
				free(s);
				choices_join(k->ck_choices, list, sizeof(list));
				return cfg_err(err, errlen,
				    "%s: unknown value '%s' (expected one of: "
				    "%s)",
				    flag, val, list);
			}
			free(s);
			s = xstrdup(k->ck_choices[i]);
		}
		sp = p;
		free(*sp);
		*sp = s;
		break;
	case KT_POLICY:
		if (value_policy(k, flag, val, p, err, errlen) == -1)
			return -1;
		break;
	case KT_ASSIGN:
		if (assignment_mode_parse(val, &am) == -1)
			return cfg_err(err, errlen,
			    "%s: unknown mode '%s' (expected one of: random, "
			    "min_load, min_group, delegate)",
			    flag, val);
		*(enum assignment_mode *)p = am;
		break;
	case KT_CACHE_INDEX:
		if (strcasecmp(val, "tree") == 0)
			*(enum cache_index *)p = CACHE_INDEX_TREE;
		else if (strcasecmp(val, "hash") == 0)
			*(enum cache_index *)p = CACHE_INDEX_HASH;
		else
			return cfg_err(err, errlen,
			    "%s: unknown index '%s' (expected tree or hash)",
			    flag, val);
		break;
	case KT_LOG_LEVEL:
		if (log_level_parse(val, &lv) == -1)
			return cfg_err(err, errlen,
			    "%s: unknown level '%s' (expected one of: debug, "
			    "info, warn, error)",
			    flag, val);
		*(enum log_level *)p = lv;
		break;
	default:
		fatalx("%s: key %s is not single-valued", __func__, k->ck_name);
	}
	if (user && k->ck_set_off != 0)
		*(bool *)fld(cf, k->ck_set_off) = true;
	return 0;
}

static int
defaults_apply(struct config *cf, char *err, size_t errlen)
{
	const struct config_key *k;
	char *copy, *word, *save;
	size_t i;
	int rv;

	for (i = 0; i < CONFIG_NKEYS; i++) {
		k = &config_keys[i];
		if (k->ck_def == NULL)
			continue;
		if (k->ck_type != KT_LIST) {
			if (key_apply(cf, k, k->ck_name, k->ck_def, false, err,
			        errlen) == -1)
				return -1;
			continue;
		}
		copy = xstrdup(k->ck_def);
		rv = 0;
		for (word = strtok_r(copy, " ", &save); word != NULL && rv == 0;
		     word = strtok_r(NULL, " ", &save))
			rv = list_add(cf, k, k->ck_name, word, err, errlen);
		free(copy);
		if (rv == -1)
			return -1;
	}
	return 0;
}

/* The optional second token of --prefill/--encode: u16 or "none". */
static int
endpoint_port(const char *flag, const char *tok, int *port, char *err,
    size_t errlen)
{
	char *end;
	long v;

	if (strcasecmp(tok, "none") == 0) {
		*port = -1;
		return 0;
	}
	errno = 0;
	v = isdigit((unsigned char)*tok) ? strtol(tok, &end, 10) : -1;
	if (v < 0 || *end != '\0' || errno == ERANGE || v > 65535)
		return cfg_err(err, errlen,
		    "%s: invalid bootstrap port '%s' (expected 0..65535 or "
		    "none)",
		    flag, tok);
	*port = (int)v;
	return 0;
}

/* Parses the flag at argv[*i] and its values, advancing *i past them. */
static enum config_result
parse_one(struct config *cf, struct parse_state *ps, int argc, char *argv[],
    int *i, char *err, size_t errlen)
{
	const struct config_key *k;
	struct config_endpoint **ep;
	const char *tok, *body, *val;
	char flag[96];
	size_t len, nvals, *np;
	bool *bp;

	tok = argv[*i];
	val = NULL;
	if (tok[0] == '-' && tok[1] == '-' && tok[2] != '\0') {
		body = tok + 2;
		len = strcspn(body, "=");
		if (body[len] == '=')
			val = body + len + 1;
		snprintf(flag, sizeof(flag), "--%.*s", (int)len, body);
		k = key_find_long(body, len);
	} else if (tok[0] == '-' && tok[1] != '\0' && tok[2] == '\0') {
		snprintf(flag, sizeof(flag), "%s", tok);
		k = key_find_short(tok[1]);
	} else {
		cfg_err(err, errlen, "'%s': unexpected argument", tok);
		return CONFIG_ERROR;
	}
	if (k == NULL) {
		cfg_err(err, errlen, "%s: unknown flag", flag);
		return CONFIG_ERROR;
	}
	(*i)++;
	switch (k->ck_type) {
	case KT_HELP:
		config_usage(stdout);
		return CONFIG_EXIT;
	case KT_VERSION:
		printf("smg-c %s\n", SMG_VERSION);
		if (k->ck_flags & KF_VERBOSE)
			printf("compiler: %s\nbuilt: %s %s\n", __VERSION__,
			    __DATE__, __TIME__);
		return CONFIG_EXIT;
	case KT_COMPAT:
		if (compat_value(k, flag, val, argc, argv, i, err, errlen) ==
		    -1)
			return CONFIG_ERROR;
		break;
	case KT_SWITCH:
		bp = fld(cf, k->ck_off);
		if (val == NULL || strcasecmp(val, "true") == 0)
			*bp = true;
		else if (strcasecmp(val, "false") == 0)
			*bp = false;
		else {
			cfg_err(err, errlen,
			    "%s: takes no value (or true/false), got '%s'",
			    flag, val);
			return CONFIG_ERROR;
		}
		break;
	case KT_ENDPOINT:
		if (val == NULL) {
			if (*i >= argc || is_flag_token(argv[*i])) {
				cfg_err(err, errlen, "%s: missing value", flag);
				return CONFIG_ERROR;
			}
			val = argv[(*i)++];
		}
		if (value_check(&(struct config_key) { .ck_check = KC_URL },
		        flag, val, err, errlen) == -1)
			return CONFIG_ERROR;
		ep = fld(cf, k->ck_off);
		np = fld(cf, k->ck_n_off);
		*ep = xreallocarray(*ep, *np + 1, sizeof(**ep));
		(*ep)[*np].ce_url = xstrdup(val);
		(*ep)[*np].ce_bootstrap_port = -1;
		(*np)++;
		if (*i < argc && !is_flag_token(argv[*i])) {
			if (endpoint_port(flag, argv[*i],
			        &(*ep)[*np - 1].ce_bootstrap_port, err,
			        errlen) == -1)
				return CONFIG_ERROR;
			(*i)++;
		}
		break;
	case KT_LIST:
	case KT_U32_LIST:
	case KT_DOUBLE_LIST:
	case KT_ALIAS:
		if (!ps->ps_given[key_index(k)])
			list_clear(cf, k); /* the first use replaces defaults */
		nvals = 0;
		if (val != NULL) {
			if (list_add(cf, k, flag, val, err, errlen) == -1)
				return CONFIG_ERROR;
			nvals++;
		}
		while (*i < argc && !is_flag_token(argv[*i]) &&
		    !((k->ck_flags & KF_ONE) && nvals == 1)) {
			if (list_add(cf, k, flag, argv[(*i)++], err, errlen) ==
			    -1)
				return CONFIG_ERROR;
			nvals++;
		}
		if (nvals == 0) {
			cfg_err(err, errlen, "%s: missing value", flag);
			return CONFIG_ERROR;
		}
		break;
	default:
		if (val == NULL) {
			if (*i >= argc || is_flag_token(argv[*i])) {
				cfg_err(err, errlen, "%s: missing value", flag);
				return CONFIG_ERROR;
			}
			val = argv[(*i)++];
		}
		if (key_apply(cf, k, flag, val, true, err, errlen) == -1)
			return CONFIG_ERROR;
		break;
	}
	ps->ps_given[key_index(k)] = true;
	return CONFIG_OK;
}

/* Which flags belong to which mode (gateway.md §2.1). */
static int
check_modes(struct config *cf, struct parse_state *ps, char *err, size_t errlen)
{
	static const char *const leg_flags[] = { "prefill", "decode",
		"prefill-policy", "decode-policy", NULL };
	static const char *const epd_flags[] = { "encode", "encode-policy",
		NULL };
	bool legs;
	size_t i;

	if (cf->cf_pd_disaggregation && cf->cf_epd_disaggregation)
		return cfg_err(err, errlen,
		    "--epd-disaggregation: cannot be combined with "
		    "--pd-disaggregation");
	legs = cf->cf_pd_disaggregation || cf->cf_epd_disaggregation;
	for (i = 0; !legs && leg_flags[i] != NULL; i++) {
		if (key_given(ps, leg_flags[i]))
			return cfg_err(err, errlen,
			    "--%s: requires --pd-disaggregation or "
			    "--epd-disaggregation",
			    leg_flags[i]);
	}
	for (i = 0; !cf->cf_epd_disaggregation && epd_flags[i] != NULL; i++) {
		if (key_given(ps, epd_flags[i]))
			return cfg_err(err, errlen,
			    "--%s: requires --epd-disaggregation",
			    epd_flags[i]);
	}
	if (legs && cf->cf_worker_urls_n > 0)
		return cfg_err(err, errlen,
		    "--worker-urls: not used in %s mode (use --prefill and "
		    "--decode)",
		    cf->cf_pd_disaggregation ? "PD" : "EPD");
	return 0;
}

static int
check_power_of_two(const char *flag, size_t have, const char *workers,
    char *err, size_t errlen)
{
	if (have >= 2)
		return 0;
	return cfg_err(err, errlen,
	    "%s: power_of_two needs at least 2 %s (got %zu)", flag, workers,
	    have);
}

/* policies.md §14 compatibility rules; IGW mode skips them. */
static int
check_compat(struct config *cf, char *err, size_t errlen)
{
	const char *pflag, *dflag;

	if (cf->cf_enable_igw)
		return 0;
	pflag = cf->cf_prefill_policy_set ? "--prefill-policy" : "--policy";
	dflag = cf->cf_decode_policy_set ? "--decode-policy" : "--policy";
	if (cf->cf_pd_disaggregation) {
		if (cf->cf_decode_policy_set &&
		    cf->cf_decode_policy == POLICY_BUCKET)
			return cfg_err(err, errlen,
			    "--decode-policy: decode policy should not be "
			    "bucket");
		if (cf->cf_policy == POLICY_POWER_OF_TWO &&
		    check_power_of_two("--policy",
		        cf->cf_prefill_n + cf->cf_decode_n,
		        "workers (--prefill and --decode)", err, errlen) == -1)
			return -1;
		if (cf->cf_prefill_policy_set &&
		    cf->cf_prefill_policy == POLICY_POWER_OF_TWO &&
		    check_power_of_two("--prefill-policy", cf->cf_prefill_n,
		        "--prefill workers", err, errlen) == -1)
			return -1;
		if (cf->cf_decode_policy_set &&
		    cf->cf_decode_policy == POLICY_POWER_OF_TWO &&
		    check_power_of_two("--decode-policy", cf->cf_decode_n,
		        "--decode workers", err, errlen) == -1)
			return -1;
		return 0;
	}
	if (cf->cf_epd_disaggregation) {
		if (cf->cf_decode_policy == POLICY_BUCKET)
			return cfg_err(err, errlen,
			    "%s: decode policy should not be bucket%s", dflag,
			    cf->cf_decode_policy_set
			        ? ""
			        : " (the decode leg inherits --policy; set "
			          "--decode-policy)");
		if (cf->cf_prefill_policy == POLICY_POWER_OF_TWO &&
		    check_power_of_two(pflag, cf->cf_prefill_n,
		        "--prefill workers", err, errlen) == -1)
			return -1;
		if (cf->cf_decode_policy == POLICY_POWER_OF_TWO &&
		    check_power_of_two(dflag, cf->cf_decode_n,
		        "--decode workers", err, errlen) == -1)
			return -1;
		if (cf->cf_encode_policy == POLICY_POWER_OF_TWO &&
		    check_power_of_two("--encode-policy", cf->cf_encode_n,
		        "--encode workers", err, errlen) == -1)
			return -1;
		return 0;
	}
	if (cf->cf_policy == POLICY_POWER_OF_TWO)
		return check_power_of_two("--policy", cf->cf_worker_urls_n,
		    "--worker-urls", err, errlen);
	return 0;
}

/* Cross-value rules and the switches that force other values. */
static int
check_values(struct config *cf, char *err, size_t errlen)
{
	size_t i, j;

	if (cf->cf_retry_max_backoff_ms < cf->cf_retry_initial_backoff_ms)
		return cfg_err(err, errlen,
		    "--retry-max-backoff-ms: %ld is below "
		    "--retry-initial-backoff-ms %ld",
		    cf->cf_retry_max_backoff_ms,
		    cf->cf_retry_initial_backoff_ms);
	for (i = 1; i < cf->cf_cache_boundaries_n; i++) {
		if (cf->cf_cache_boundaries[i] <=
		    cf->cf_cache_boundaries[i - 1])
			return cfg_err(err, errlen,
			    "--cache-boundaries: values must be strictly "
			    "ascending (%u then %u)",
			    cf->cf_cache_boundaries[i - 1],
			    cf->cf_cache_boundaries[i]);
	}
	if (cf->cf_cache_index == CACHE_INDEX_HASH &&
	    cf->cf_cache_boundaries_n == 0)
		return cfg_err(err, errlen,
		    "--cache-index: hash requires --cache-boundaries");
	for (i = 1; i < cf->cf_prometheus_duration_buckets_n; i++) {
		if (cf->cf_prometheus_duration_buckets[i] <=
		    cf->cf_prometheus_duration_buckets[i - 1])
			return cfg_err(err, errlen,
			    "--prometheus-duration-buckets: values must be "
			    "strictly ascending (%g then %g)",
			    cf->cf_prometheus_duration_buckets[i - 1],
			    cf->cf_prometheus_duration_buckets[i]);
	}
	if ((cf->cf_tls_cert_path == NULL) != (cf->cf_tls_key_path == NULL))
		return cfg_err(err, errlen, "%s: requires %s",
		    cf->cf_tls_cert_path != NULL ? "--tls-cert-path"
		                                 : "--tls-key-path",
		    cf->cf_tls_cert_path != NULL ? "--tls-key-path"
		                                 : "--tls-cert-path");
	if ((cf->cf_client_cert_path == NULL) !=
	    (cf->cf_client_key_path == NULL))
		return cfg_err(err, errlen, "%s: requires %s",
		    cf->cf_client_cert_path != NULL ? "--client-cert-path"
		                                    : "--client-key-path",
		    cf->cf_client_cert_path != NULL ? "--client-key-path"
		                                    : "--client-cert-path");
	if (cf->cf_health_check_port_set &&
	    cf->cf_health_check_port == cf->cf_port)
		return cfg_err(err, errlen,
		    "--health-check-port: must differ from --port (%ld)",
		    cf->cf_port);
	if (cf->cf_prometheus_port == cf->cf_port)
		return cfg_err(err, errlen,
		    "--prometheus-port: must differ from --port (%ld)",
		    cf->cf_port);
	if (cf->cf_health_check_port_set &&
	    cf->cf_health_check_port == cf->cf_prometheus_port)
		return cfg_err(err, errlen,
		    "--health-check-port: must differ from --prometheus-port "
		    "(%ld)",
		    cf->cf_prometheus_port);
	for (i = 0; i < cf->cf_model_alias_n; i++) {
		if (strcmp(cf->cf_model_alias[i].ca_alias,
		        cf->cf_model_alias[i].ca_canonical) == 0)
			return cfg_err(err, errlen,
			    "--model-alias: '%s' is an alias of itself",
			    cf->cf_model_alias[i].ca_alias);
		for (j = 0; j < i; j++) {
			if (strcmp(cf->cf_model_alias[i].ca_alias,
			        cf->cf_model_alias[j].ca_alias) == 0)
				return cfg_err(err, errlen,
				    "--model-alias: alias '%s' given twice",
				    cf->cf_model_alias[i].ca_alias);
		}
	}
	if (cf->cf_disable_retries)
		cf->cf_retry_max_retries = 1;
	if (cf->cf_disable_circuit_breaker)
		cf->cf_cb_failure_threshold = U32_MAX_L;
	if (cf->cf_worker_overload_protection &&
	    !cf->cf_worker_overload_token_usage_set) {
		cf->cf_worker_overload_token_usage = 0.9;
		cf->cf_worker_overload_token_usage_set = true;
	}
	if (!cf->cf_assignment_mode_set)
		cf->cf_assignment_mode = (cf->cf_routing_key_override &&
		                             cf->cf_policy != POLICY_MANUAL)
		    ? ASSIGNMENT_MODE_DELEGATE
		    : ASSIGNMENT_MODE_RANDOM;
	if (cf->cf_max_concurrent_requests <= 0)
		cf->cf_max_concurrent_requests = -1;
	return 0;
}

/* http:// is for a loopback identity provider or Kubernetes API only
 * (tests, sidecars, kubectl proxy). */
static int
check_idp_url(const char *flag, const char *url, char *err, size_t errlen)
{
	const char *host;

	if (strncasecmp(url, "https://", 8) == 0)
		return 0;
	if (strncasecmp(url, "http://", 7) != 0)
		return cfg_err(err, errlen, "%s: '%s' is not an https:// URL",
		    flag, url);
	host = url + 7;
	if (strncmp(host, "127.", 4) == 0 ||
	    strncasecmp(host, "localhost", 9) == 0 ||
	    strncmp(host, "[::1]", 5) == 0)
		return 0;
	return cfg_err(err, errlen,
	    "%s: '%s': http:// only on loopback (use https://)", flag, url);
}

/* Is s "admin" or "user" (any case)? */
static bool
check_role_name(const char *s, size_t n)
{
	return (n == 5 && strncasecmp(s, "admin", 5) == 0) ||
	    (n == 4 && strncasecmp(s, "user", 4) == 0);
}

/*
 * Authentication flags (docs/decisions.md): CONTROL_PLANE_API_KEYS when no
 * --control-plane-api-keys is given, every entry well formed, JWT issuer
 * and audience together. A malformed key is refused rather than skipped:
 * skipping could leave a route open that the operator meant to guard.
 */
static int
check_auth(struct config *cf, char *err, size_t errlen)
{
	const char *env, *p, *q, *f[3];
	char *dup, *tok, *save, base[512], path[512], why[160];
	size_t i, k;

	env = getenv("CONTROL_PLANE_API_KEYS");
	if (cf->cf_control_plane_api_keys_n == 0 && env != NULL &&
	    env[0] != '\0') {
		dup = xstrdup(env);
		for (tok = strtok_r(dup, ",", &save); tok != NULL;
		     tok = strtok_r(NULL, ",", &save)) {
			cf->cf_control_plane_api_keys =
			    xreallocarray(cf->cf_control_plane_api_keys,
			        cf->cf_control_plane_api_keys_n + 1,
			        sizeof(char *));
			cf->cf_control_plane_api_keys
			    [cf->cf_control_plane_api_keys_n++] = xstrdup(tok);
		}
		free(dup);
	}
	for (i = 0; i < cf->cf_control_plane_api_keys_n; i++) {
		p = cf->cf_control_plane_api_keys[i];
		for (k = 0; k < 3; k++) {
			f[k] = p;
			if ((q = strchr(p, ':')) == NULL)
				break;
			p = q + 1;
		}
		if (k < 3 || f[1] == f[0] || *p == '\0' ||
		    !check_role_name(f[2], (size_t)(p - 1 - f[2])))
			return cfg_err(err, errlen,
			    "--control-plane-api-keys: entry %zu: expected "
			    "'id:name:role:key' with role admin or user",
			    i + 1);
	}
	for (i = 0; i < cf->cf_jwt_role_mapping_n; i++) {
		p = cf->cf_jwt_role_mapping[i];
		if ((q = strchr(p, '=')) == NULL || q == p ||
		    !check_role_name(q + 1, strlen(q + 1)))
			return cfg_err(err, errlen,
			    "--jwt-role-mapping: '%s': expected "
			    "'idp_role=admin' or 'idp_role=user'",
			    p);
	}
	for (i = 0; i < cf->cf_tenant_api_keys_n; i++) {
		p = cf->cf_tenant_api_keys[i];
		if ((q = strchr(p, ':')) == NULL || q == p || q[1] == '\0')
			return cfg_err(err, errlen,
			    "--tenant-api-key: entry %zu: expected "
			    "'tenant_id:key'",
			    i + 1);
	}
	if ((cf->cf_jwt_issuer != NULL) != (cf->cf_jwt_audience != NULL) ||
	    (cf->cf_jwt_jwks_uri != NULL && cf->cf_jwt_issuer == NULL))
		return cfg_err(err, errlen,
		    "--jwt-issuer and --jwt-audience go together (and "
		    "--jwt-jwks-uri needs them)");
	if (cf->cf_jwt_issuer != NULL &&
	    check_idp_url("--jwt-issuer", cf->cf_jwt_issuer, err, errlen) == -1)
		return -1;
	if (cf->cf_jwt_jwks_uri != NULL &&
	    check_idp_url("--jwt-jwks-uri", cf->cf_jwt_jwks_uri, err, errlen) ==
	        -1)
		return -1;
	if (cf->cf_tenant_rate_limit_enabled &&
	    cf->cf_tenant_rate_limit_config == NULL)
		return cfg_err(err, errlen,
		    "--tenant-rate-limit-enabled needs "
		    "--tenant-rate-limit-config");
	if (cf->cf_enable_trace &&
	    otlp_endpoint(cf->cf_otlp_traces_endpoint, base, sizeof(base), path,
	        sizeof(path), why, sizeof(why)) == -1)
		return cfg_err(err, errlen, "--otlp-traces-endpoint: %s", why);
	return 0;
}

/* smg-c's own flags: computed defaults and their bounds. */
static int
check_own(struct config *cf, char *err, size_t errlen)
{
	long cpus;
	size_t i;
	bool tls;

	if (cf->cf_frontends == 0) {
		cpus = sysconf(_SC_NPROCESSORS_ONLN);
		cf->cf_frontends = cpus < 1 ? 1 : cpus > 64 ? 64 : cpus;
	}
	if (cf->cf_frontend_slot >= cf->cf_frontends)
		return cfg_err(err, errlen,
		    "--frontend-slot: %ld out of range (expected -1..%ld for "
		    "%ld frontends)",
		    cf->cf_frontend_slot, cf->cf_frontends - 1,
		    cf->cf_frontends);
	if (cf->cf_state_dir == NULL)
		cf->cf_state_dir = xasprintf("/var/tmp/smg-%ld", cf->cf_port);
	if (cf->cf_run_dir == NULL)
		cf->cf_run_dir = xasprintf("/tmp/smg-%ld", cf->cf_port);
	if (strlen(cf->cf_run_dir) > CONFIG_RUN_DIR_MAX)
		return cfg_err(err, errlen,
		    "--run-dir: path longer than %d bytes (IPC socket paths "
		    "must fit a unix socket address)",
		    CONFIG_RUN_DIR_MAX);
	tls = false;
	for (i = 0; i < cf->cf_broker_listen_n; i++) {
		if (!config_tcp_url(cf->cf_broker_listen[i]))
			return cfg_err(err, errlen,
			    "--broker-listen: %s: expected tcp://HOST:PORT or "
			    "tls+tcp://HOST:PORT",
			    cf->cf_broker_listen[i]);
		tls = tls || strncmp(cf->cf_broker_listen[i], "tls+", 4) == 0;
	}
	if (cf->cf_broker != NULL) {
		if (!config_tcp_url(cf->cf_broker))
			return cfg_err(err, errlen,
			    "--broker: %s: expected tcp://HOST:PORT or "
			    "tls+tcp://HOST:PORT",
			    cf->cf_broker);
		tls = tls || strncmp(cf->cf_broker, "tls+", 4) == 0;
	}
	/* Mutual certificates: a tls+tcp:// end needs all three. */
	if (tls &&
	    (cf->cf_broker_tls_cert == NULL || cf->cf_broker_tls_key == NULL ||
	        cf->cf_broker_tls_ca == NULL))
		return cfg_err(err, errlen,
		    "tls+tcp:// needs --broker-tls-cert, --broker-tls-key and "
		    "--broker-tls-ca");
	return 0;
}

/* tcp://HOST:PORT with a numeric port (HOST may be empty or "*"). */
static bool
config_tcp_url(const char *url)
{
	const char *colon;
	char *end;
	long port;

	if (strncmp(url, "tls+", 4) == 0)
		url += 4;
	if (strncmp(url, "tcp://", 6) != 0 ||
	    (colon = strrchr(url + 6, ':')) == NULL || colon[1] == '\0')
		return false;
	port = strtol(colon + 1, &end, 10);
	return *end == '\0' && port >= 0 && port <= 65535;
}

static void
add_warning(struct config *cf, char *text)
{
	cf->cf_warnings = xreallocarray(cf->cf_warnings, cf->cf_warnings_n + 1,
	    sizeof(char *));
	cf->cf_warnings[cf->cf_warnings_n++] = text;
}

/*
 * Kubernetes discovery (gateway.md §1): the selector of the mode must be
 * given, or the gateway would discover nothing; the flags of the other
 * mode, or all of them without --service-discovery, only warn (SMG
 * ignores them too).
 */
static int
check_discovery(struct config *cf, char *err, size_t errlen)
{
	bool epd = cf->cf_epd_disaggregation;
	bool pd = cf->cf_pd_disaggregation || epd;

	if (!cf->cf_service_discovery) {
		if (cf->cf_selector_n > 0 || cf->cf_prefill_selector_n > 0 ||
		    cf->cf_decode_selector_n > 0 ||
		    cf->cf_encode_selector_n > 0 ||
		    cf->cf_service_discovery_namespace != NULL ||
		    cf->cf_model_id_from != NULL)
			add_warning(cf,
			    xasprintf("--selector, --prefill-selector, "
			              "--decode-selector, --encode-selector, "
			              "--service-discovery-namespace, "
			              "--model-id-from: no effect without "
			              "--service-discovery"));
		return 0;
	}
	if (pd && cf->cf_prefill_selector_n == 0 &&
	    cf->cf_decode_selector_n == 0 && cf->cf_encode_selector_n == 0)
		return cfg_err(err, errlen,
		    "--service-discovery: PD mode needs --prefill-selector "
		    "and/or --decode-selector%s",
		    epd ? " (or --encode-selector)" : "");
	if (!pd && cf->cf_selector_n == 0)
		return cfg_err(err, errlen,
		    "--service-discovery: needs --selector KEY=VALUE...");
	if (pd && cf->cf_selector_n > 0)
		add_warning(cf,
		    xasprintf(
		        "--selector: no effect with --pd-disaggregation or "
		        "--epd-disaggregation (use --prefill-selector and "
		        "--decode-selector)"));
	if (!pd &&
	    (cf->cf_prefill_selector_n > 0 || cf->cf_decode_selector_n > 0))
		add_warning(cf,
		    xasprintf("--prefill-selector, --decode-selector: no "
		              "effect without --pd-disaggregation"));
	if (!epd && cf->cf_encode_selector_n > 0)
		add_warning(cf,
		    xasprintf("--encode-selector: no effect without "
		              "--epd-disaggregation"));
	return 0;
}

static int
config_finish(struct config *cf, struct parse_state *ps, char *err,
    size_t errlen)
{
	if (cf->cf_service_discovery)
		cf->cf_enable_igw = true;
	if (check_modes(cf, ps, err, errlen) == -1)
		return -1;
	if (check_discovery(cf, err, errlen) == -1)
		return -1;
	if (!cf->cf_prefill_policy_set)
		cf->cf_prefill_policy = cf->cf_policy;
	if (!cf->cf_decode_policy_set)
		cf->cf_decode_policy = cf->cf_policy;
	if (check_compat(cf, err, errlen) == -1)
		return -1;
	if (check_values(cf, err, errlen) == -1)
		return -1;
	if (compat_finish(cf, ps) == -1)
		return -1;
	if (check_auth(cf, err, errlen) == -1)
		return -1;
	return check_own(cf, err, errlen);
}

enum config_result
config_parse(struct config *cf, int argc, char *argv[], char *err,
    size_t errlen)
{
	struct parse_state ps;
	enum config_result rc;
	int first, i;

	memset(cf, 0, sizeof(*cf));
	memset(&ps, 0, sizeof(ps));
	if (errlen > 0)
		err[0] = '\0';
	if (defaults_apply(cf, err, errlen) == -1)
		fatalx("%s: bad built-in default: %s", __func__, err);
	first = 1;
	if (argc > 1 &&
	    (strcmp(argv[1], "launch") == 0 || strcmp(argv[1], "start") == 0))
		first = 2;
	if (argc < first)
		argc = first;
	cf->cf_argc = argc - first;
	cf->cf_argv = xcalloc((size_t)cf->cf_argc + 1, sizeof(char *));
	for (i = 0; i < cf->cf_argc; i++)
		cf->cf_argv[i] = xstrdup(argv[first + i]);
	for (i = first; i < argc;) {
		rc = parse_one(cf, &ps, argc, argv, &i, err, errlen);
		if (rc != CONFIG_OK) {
			config_free(cf);
			return rc;
		}
	}
	if (config_finish(cf, &ps, err, errlen) == -1) {
		config_free(cf);
		return CONFIG_ERROR;
	}
	return CONFIG_OK;
}

void
config_free(struct config *cf)
{
	const struct config_key *k;
	size_t i;
	int j;

	if (cf == NULL)
		return;
	for (i = 0; i < CONFIG_NKEYS; i++) {
		k = &config_keys[i];
		switch (k->ck_type) {
		case KT_STRING:
			free(*(char **)fld(cf, k->ck_off));
			break;
		case KT_LIST:
		case KT_ENDPOINT:
		case KT_ALIAS:
		case KT_U32_LIST:
		case KT_DOUBLE_LIST:
			list_clear(cf, k);
			break;
		default:
			break;
		}
	}
	for (i = 0; i < cf->cf_warnings_n; i++)
		free(cf->cf_warnings[i]);
	free(cf->cf_warnings);
	if (cf->cf_argv != NULL) {
		for (j = 0; j < cf->cf_argc; j++)
			free(cf->cf_argv[j]);
		free(cf->cf_argv);
	}
	memset(cf, 0, sizeof(*cf));
}

static void
key_usage(FILE *out, const struct config_key *k)
{
	char names[128], range[64];
	const char *def;

	if (k->ck_short != 0 && k->ck_alias != NULL)
		snprintf(names, sizeof(names), "-%c, --%s, --%s", k->ck_short,
		    k->ck_name, k->ck_alias);
	else if (k->ck_short != 0)
		snprintf(names, sizeof(names), "-%c, --%s", k->ck_short,
		    k->ck_name);
	else if (k->ck_alias != NULL)
		snprintf(names, sizeof(names), "--%s, --%s", k->ck_name,
		    k->ck_alias);
	else
		snprintf(names, sizeof(names), "--%s", k->ck_name);
	fprintf(out, "  %s%s%s\n", names, k->ck_meta != NULL ? " " : "",
	    k->ck_meta != NULL ? k->ck_meta : "");
	if (k->ck_defdoc != NULL)
		def = k->ck_defdoc;
	else if (k->ck_def != NULL)
		def = k->ck_def;
	else if (k->ck_type == KT_SWITCH ||
	    (k->ck_type == KT_COMPAT && k->ck_cv == CV_SWITCH))
		def = "off";
	else if (k->ck_type == KT_HELP || k->ck_type == KT_VERSION)
		def = NULL;
	else if (k->ck_n_off != 0)
		def = "none";
	else
		def = "unset";
	if (k->ck_type == KT_POLICY && k->ck_def == NULL)
		def = "--policy"; /* leg policies inherit it */
	fprintf(out, "        %s", k->ck_help);
	if (k->ck_type == KT_COMPAT)
		fprintf(out, " [%s: %s]",
		    k->ck_compat == KCOMPAT_INERT ? "accepted, no effect"
		        : k->ck_compat == KCOMPAT_ABSENT
		        ? "accepted, needs"
		        : "accepted, not implemented",
		    k->ck_subsystem);
	if (k->ck_type == KT_LONG || k->ck_type == KT_U64 ||
	    k->ck_type == KT_DOUBLE) {
		bounds_describe(k, range, sizeof(range));
		fprintf(out, " [%s]", range);
	}
	if (def != NULL)
		fprintf(out, " (default: %s)", def);
	fputc('\n', out);
}

void
config_usage(FILE *out)
{
	size_t i;

	fprintf(out,
	    "usage: smg [launch|start] [flags]\n"
	    "\n"
	    "smg-c load-balancing gateway for LLM inference workers.\n"
	    "List flags take space-separated values up to the next flag;\n"
	    "--flag=value is accepted as well as --flag value.\n");
	for (i = 0; i < CONFIG_NKEYS; i++) {
		if (config_keys[i].ck_type == KT_SECTION)
			fprintf(out, "\n%s:\n", config_keys[i].ck_help);
		else
			key_usage(out, &config_keys[i]);
	}
}

void
config_load_or_exit(struct config *cf, int argc, char *argv[])
{
	const char *prog, *slash;
	char err[512];

	prog = "smg";
	if (argc > 0 && argv[0] != NULL && argv[0][0] != '\0') {
		slash = strrchr(argv[0], '/');
		prog = slash != NULL ? slash + 1 : argv[0];
	}
	switch (config_parse(cf, argc, argv, err, sizeof(err))) {
	case CONFIG_OK:
		break;
	case CONFIG_EXIT:
		fflush(stdout);
		exit(0);
	case CONFIG_ERROR:
		fprintf(stderr, "%s: %s\n", prog, err);
		exit(2);
	}
	/* Discovery needs a Kubernetes API: say so now rather than run a
	 * gateway that never finds a worker. */
	if (cf->cf_service_discovery && !cf->cf_check_config &&
	    getenv("SMG_K8S_API") == NULL &&
	    getenv("KUBERNETES_SERVICE_HOST") == NULL) {
		fprintf(stderr,
		    "%s: --service-discovery: no Kubernetes API "
		    "(KUBERNETES_SERVICE_HOST unset: not in a pod; "
		    "SMG_K8S_API unset)\n",
		    prog);
		exit(2);
	}
	if (cf->cf_service_discovery && getenv("SMG_K8S_API") != NULL &&
	    check_idp_url("SMG_K8S_API", getenv("SMG_K8S_API"), err,
	        sizeof(err)) == -1) {
		fprintf(stderr, "%s: %s\n", prog, err);
		exit(2);
	}
	if (cf->cf_check_config) {
		for (size_t i = 0; i < cf->cf_warnings_n; i++)
			fprintf(stderr, "%s: warning: %s\n", prog,
			    cf->cf_warnings[i]);
		printf("%s: configuration OK\n", prog);
		fflush(stdout);
		config_free(cf);
		exit(0);
	}
}
