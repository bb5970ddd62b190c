/*
 * broker.h: private header of smg-broker, one section per file.
 *
 * The broker is single-threaded: every function here runs on the process's
 * one libev loop and none of them is safe to call from another thread.
 * struct broker is the process state; every file reaches the registry, the
 * policies, the store and the shm segment through it.
 */
#ifndef BROKER_BROKER_H
#define BROKER_BROKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <ev.h>

#include "ipc.pb-c.h"
#include "rate.h"
#include "shared/config.h"
#include "shared/policy_info.h"
#include "shared/shm.h"

#define BROKER_MODEL_UNKNOWN "unknown"
#define BROKER_NTYPES        4 /* enum Smg__WorkerType values */
#define BROKER_NMODES        3 /* enum Smg__ConnectionMode values */
#define BROKER_TICK_SECS     0.25
#define BROKER_RR_MAX_SETS   1024

struct broker;
struct worker;
struct policy;
struct store;
struct urlallow_cidr;

/* ---------------------------------------------------------- stats.c */

/*
 * Metric helpers on the broker's row of the shm metrics registry; they
 * call nothing else of the broker. stats_series registers (or finds) a
 * series of kind (enum metrics_kind) and returns its index, or -1 when
 * the table is full or the labels too long; stats_add and stats_set skip
 * a series of -1.
 */
int stats_series(struct broker *br, int kind, const char *family,
    const char *labels_fmt, ...) __attribute__((format(printf, 4, 5)));
void stats_add(struct broker *br, int series, int64_t delta);
void stats_set(struct broker *br, int series, int64_t value);
/* metrics_retire: the series leaves /metrics (a gauge of a label value
 * that no longer exists). */
void stats_retire(struct broker *br, int series);
/* Copies s into a Prometheus label value (escaping \ " and newline). */
void stats_label_escape(char *out, size_t len, const char *s);

/* ---------------------------------------------------------- breaker.c */

enum breaker_outcome {
	BREAKER_SUCCESS = 0,
	BREAKER_FAILURE,
	BREAKER_IGNORED,
};

struct breaker_conf {
	uint32_t bc_failure_threshold;
	uint32_t bc_success_threshold;
	uint64_t bc_timeout_ms;
};

struct breaker {
	enum shm_breaker_state cb_state;
	uint32_t cb_failures; /* consecutive */
	uint32_t cb_successes; /* consecutive */
	uint64_t cb_opened_ms;
};

/* gateway.md §7.2 default sets: 429 ignored, 408/5xx listed and transport
 * errors failures, everything else a success. */
enum breaker_outcome breaker_classify(uint32_t http_status,
    bool transport_error);
void breaker_conf_init(struct breaker_conf *bc, const struct config *cf);
void breaker_init(struct breaker *b);
/*
 * The pure state machine. breaker_step applies one outcome; breaker_poll
 * makes the lazy Open -> HalfOpen move when the timeout has passed. Both
 * return 1 when the state changed (old state in *from), else 0.
 */
int breaker_step(struct breaker *b, const struct breaker_conf *bc,
    enum breaker_outcome o, uint64_t now_ms, enum shm_breaker_state *from);
int breaker_poll(struct breaker *b, const struct breaker_conf *bc,
    uint64_t now_ms, enum shm_breaker_state *from);
const char *breaker_state_name(enum shm_breaker_state s);
/*
 * Worker level: record an outcome or examine availability, publish the
 * smg_worker_cb_* metrics and, on a transition, the shm row. Returns
 * whether the worker's breaker lets traffic through (not Open).
 */
void breaker_record(struct broker *br, struct worker *w,
    enum breaker_outcome o);
bool breaker_routable(struct broker *br, struct worker *w);
/*
 * Registry observer (server_new registers it): a new worker starts
 * Closed, with its smg_worker_cb_* series registered.
 */
extern const struct registry_observer breaker_registry_observer;

/* ---------------------------------------------------------- registry.c */

struct worker_load {
	bool wl_valid; /* a report with >= 1 rank */
	unsigned wl_nranks;
	int64_t wl_waiting_reqs;
	int64_t wl_waiting_uncached_tokens;
	int64_t wl_running_reqs;
	double wl_token_usage; /* mean over ranks */
	double wl_gen_throughput;
	int64_t wl_fetched_at_ms; /* CLOCK_REALTIME, from the poller */
	uint64_t wl_received_ms; /* our monotonic clock */
};

struct model_entry;

struct worker {
	char *wk_url; /* no trailing '/' */
	char wk_id[SHM_ID_MAX];
	uint64_t wk_url_hash; /* XXH3 of wk_url */
	char *wk_model; /* BROKER_MODEL_UNKNOWN until known */
	char *wk_runtime; /* "" unknown */
	int wk_type; /* Smg__WorkerType */
	int wk_mode; /* Smg__ConnectionMode */
	char *wk_api_key; /* NULL none */
	int32_t wk_bootstrap_port; /* -1 none */
	uint32_t wk_priority;
	double wk_cost;
	cJSON *wk_labels; /* object of strings, owned */
	cJSON *wk_spec; /* client's spec without api_key, or NULL */
	uint32_t wk_order;
	bool wk_from_cli;
	bool wk_discovered; /* from a Kubernetes pod (--service-discovery) */
	bool wk_persist; /* kept in the store (API-added) */
	enum shm_worker_status wk_status;
	struct breaker wk_cb;
	bool wk_health_disabled;
	uint32_t wk_health_passes; /* consecutive */
	uint32_t wk_health_fails; /* consecutive */
	uint32_t wk_probes_pending; /* probes while Pending */
	char *wk_error; /* last discovery error, or NULL */
	bool wk_overloaded;
	int64_t wk_ov_waiting; /* effective thresholds, 0 unset */
	double wk_ov_token_usage;
	uint32_t wk_load_interval_secs; /* spec's load poll period, 0 unset */
	uint32_t wk_dp_size; /* ranks of its engine (--dp-aware), 0 unknown */
	struct worker_load wk_load;
	unsigned wk_slot;
	uint32_t wk_generation;
	struct model_entry *wk_me;
	ev_timer wk_drain; /* Draining -> removed */
	/* metric series, -1 when the table was full */
	int wk_m_cb_state;
	int wk_m_cb_fail;
	int wk_m_cb_succ;
	int wk_m_cb_out_ok;
	int wk_m_cb_out_fail;
	int wk_m_health;
	int wk_m_active;
	int wk_m_pending; /* smg_worker_outstanding_prefill_tokens */
	int wk_m_rate; /* smg_worker_prefill_rate_tokens_per_second */
	struct rate wk_rate; /* learned prefill rate (live.c) */
};

struct model_entry {
	char *me_name;
	struct worker **me_workers; /* registration order */
	unsigned me_n;
	unsigned me_cap;
	struct policy *me_policy; /* owned; NULL: the default instance */
	bool me_policy_decided;
	/* smg_worker_selection_total series by type, mode; -2 not yet */
	int me_sel_series[BROKER_NTYPES][BROKER_NMODES];
	const struct policy *me_sel_policy[BROKER_NTYPES][BROKER_NMODES];
	int me_m_overloaded;
	int64_t me_overloaded;
	/* median learned prefill rate of its workers, 0 none (live.c) */
	double me_rate_prior;
};

/*
 * What other parts of the broker learn of the registry's changes, without
 * the registry knowing them (policies, the KV index, the breaker). Each
 * member is optional; observers run in the order they were registered.
 * All run on the loop, with w and me still valid and indexed as stated.
 */
struct registry_observer {
	/* w is created and has its slot, not yet indexed nor published:
	 * initialise w's own per-worker state. */
	void (*ro_worker_new)(struct broker *br, struct worker *w);
	/* me is a new model entry and `first` its first worker. */
	void (*ro_model_new)(struct broker *br, struct model_entry *me,
	    const struct worker *first);
	/* me lost its last worker (or the broker stops): me is about to be
	 * freed. */
	void (*ro_model_gone)(struct broker *br, struct model_entry *me);
	/* w is indexed under its model and published: after its creation
	 * and again after a model change. */
	void (*ro_worker_added)(struct broker *br, struct worker *w);
	/* w left its model (wk_me NULL, wk_model still the old name) for
	 * another; ro_worker_added follows under the new one. */
	void (*ro_worker_moved)(struct broker *br, struct worker *w);
	/* w is about to be unindexed and freed. */
	void (*ro_worker_removed)(struct broker *br, struct worker *w);
};

#define REGISTRY_MAX_OBSERVERS 8

/*
 * Adds an observer (startup, before the first registry_add); ro is
 * borrowed and must outlive the broker. Fatal beyond
 * REGISTRY_MAX_OBSERVERS.
 */
void registry_observe(struct broker *br, const struct registry_observer *ro);

/* Fields a new worker is created with. Strings are copied. */
struct worker_spec {
	const char *ws_url;
	const char *ws_id; /* NULL: a new one (restore: the stored one) */
	const char *ws_model; /* NULL/"" unknown */
	const char *ws_runtime;
	int ws_type;
	int ws_mode;
	const char *ws_api_key;
	int32_t ws_bootstrap_port;
	uint32_t ws_priority;
	double ws_cost;
	const cJSON *ws_labels; /* copied */
	const cJSON *ws_spec; /* copied */
	bool ws_from_cli;
	bool ws_discovered; /* never persisted; removed with its pod */
	bool ws_health_disabled; /* spec health.disable_health_check */
	int64_t ws_ov_waiting; /* per-worker overload overrides, 0 unset */
	double ws_ov_token_usage;
	uint32_t ws_load_interval_secs; /* spec load_monitor_interval_secs */
};

/*
 * Normalises a URL into buf (trailing '/' removed) and validates it as
 * gateway.md §1: scheme http/https/grpc/grpcs/ipc, a host except for ipc;
 * no quotes, backslashes, spaces or controls. Returns 0, or -1 with the
 * reason in err.
 */
int registry_normalize_url(const char *url, char *buf, size_t len, char *err,
    size_t errlen);
/*
 * Snapshot of the shm worker table at start, so a restarted broker keeps
 * the slots, generations, status and model of the workers it had.
 */
void registry_adopt_begin(struct broker *br);
/* Frees every slot no worker adopted; call once after startup adds. */
void registry_adopt_end(struct broker *br);
/*
 * Creates a worker, gives it a shm slot, indexes it and publishes it.
 * Returns the worker, or NULL with *why set (duplicate url, table full).
 * With `persist`, the worker is kept in the store (API-added workers) and
 * rewritten there on every change until removed.
 */
struct worker *registry_add(struct broker *br, const struct worker_spec *ws,
    bool persist, const char **why);
/* Immediate removal: policies, indexes, shm slot, store; frees w. */
void registry_remove(struct broker *br, struct worker *w);
/* Starts Draining for --drain-settle-secs, then registry_remove. */
void registry_drain(struct broker *br, struct worker *w);
struct worker *registry_find(struct broker *br, const char *id_or_url);
/*
 * The workers of the data-parallel ranks of base ("<base>@<rank>"), in
 * registration order, into out[0..max). Returns how many there are (at
 * most max are stored); 0 when base itself names a rank.
 */
unsigned registry_find_ranks(struct broker *br, const char *base,
    struct worker **out, unsigned max);
/*
 * --dp-aware (gateway.md §1): replaces w, whose engine reported size
 * data-parallel ranks, by one worker per rank, "<url>@0" .. "<url>@<size-1>",
 * each with w's fields, its own slot, id and counters, persisted when w
 * was, and Ready (the discovery that found the ranks stands for theirs);
 * then removes w. Returns 0, or -1 (logged; w kept as it is) when a rank
 * URL does not fit or the table has no room for every rank.
 */
int registry_expand(struct broker *br, struct worker *w, unsigned size);
struct worker *registry_by_slot(struct broker *br, unsigned slot,
    uint32_t generation);
/*
 * PUT /workers/{id}: w takes every field of ws but its url and id (a
 * model, runtime or api key ws leaves unset keeps w's). A changed model,
 * type or mode moves w to that pool as registry_set_model does.
 */
void registry_update(struct broker *br, struct worker *w,
    const struct worker_spec *ws);
/* Moves w to another model (discovery); decides the model's policy. */
void registry_set_model(struct broker *br, struct worker *w, const char *model);
void registry_set_status(struct broker *br, struct worker *w,
    enum shm_worker_status st);
void registry_set_overloaded(struct broker *br, struct worker *w, bool on);
/* Rewrites w's shm slot (after any change of a published field). */
void registry_publish(struct broker *br, struct worker *w);
/* Re-persists w (model/runtime learnt). */
void registry_persist(struct broker *br, struct worker *w);
struct model_entry *registry_model(struct broker *br, const char *name);
/* The model entry named name, or NULL (registry_model creates one). */
struct model_entry *registry_model_find(struct broker *br, const char *name);
/*
 * The model id name is an alias of: no model is named name and a
 * worker's WorkerSpec lists it in models[0].aliases (the first such
 * worker in registration order). NULL otherwise. Points into the worker.
 */
const char *registry_resolve_alias(struct broker *br, const char *name);
/* Frees every worker and model (shutdown); shm slots are left as they are. */
void registry_free_all(struct broker *br);
/* smg_worker_pool_size gauges. */
void registry_update_pool_metrics(struct broker *br);
const char *registry_type_name(int type);
const char *registry_mode_name(int mode);
const char *registry_status_name(enum shm_worker_status st);
/* Serialises the persisted form of w (malloc'ed JSON text). */
char *registry_record_json(const struct worker *w);

/* ---------------------------------------------------------- avail.c */

/*
 * policies.md §1.2. avail_pool fills out[] with the workers of the pool
 * (type, mode, model or model-less, registration order), before the
 * availability filter; avail_filter keeps the available ones in place and
 * returns how many remain. *overloaded_all is set when the pool is
 * non-empty and every member is overload-vetoed.
 */
unsigned avail_pool(struct broker *br, const char *model, int type, int mode,
    struct worker **out);
unsigned avail_filter(struct broker *br, struct worker **c, unsigned n,
    bool *overloaded_all);
bool avail_worker(struct broker *br, struct worker *w);

/* ---------------------------------------------------------- policy.c */

struct policy_ops {
	enum policy_kind po_kind; /* name and properties: policy_info_of */
	const char *po_branch_metric; /* NULL: none */
	void *(*po_new)(bool builtin_defaults);
	void (*po_free)(void *state);
	/* Index into c[0..n-1], or -1 for none. n >= 1. */
	int (*po_select)(struct policy *p, struct worker *const *c, unsigned n,
	    const Smg__RouteRequest *req);
	void (*po_on_add)(struct policy *p, struct worker *w);
	void (*po_on_remove)(struct policy *p, struct worker *w);
	void (*po_on_report)(struct policy *p, struct worker *w);
	/* Optional: replaces po_new when set; p->pl_br and pl_builtin are
	 * filled (pl_br is NULL when no broker was attached). */
	void *(*po_create)(struct policy *p);
	/* Optional: housekeeping from the broker tick (eviction sweeps). */
	void (*po_sweep)(struct policy *p, uint64_t now_ms);
	/*
	 * Optional restore hooks, called by persist_restore for the records
	 * this instance wrote: an assignment (persist_assign_put under
	 * "manual/<instance>"): key, its URLs in stored order, last access;
	 * a journaled tree insert (persist_tree_insert) of worker w, keylen
	 * in bytes (kind 0) or tokens (kind 1).
	 */
	void (*po_restore_assign)(struct policy *p, const char *key,
	    const char *const *urls, unsigned nurls, uint64_t last_ms);
	void (*po_replay)(struct policy *p, const char *model, int kind,
	    struct worker *w, const void *key, size_t keylen);
	/* A hash-mode placement (persist_place_put under "hash/<instance>"):
	 * key, holder URLs and their last touch (ms since the epoch). */
	void (*po_restore_place)(struct policy *p, const char *key,
	    const char *const *urls, const uint64_t *touch_ms, unsigned n);
};

struct policy {
	const struct policy_ops *pl_ops;
	void *pl_state;
	bool pl_builtin; /* built-in defaults, not CLI flags */
	bool pl_warned; /* one-shot warnings (passthrough) */
	struct broker *pl_br; /* the attached broker, or NULL */
};

extern const struct policy_ops policy_random_ops;
extern const struct policy_ops policy_round_robin_ops;
extern const struct policy_ops policy_passthrough_ops;
extern const struct policy_ops policy_cache_aware_ops;
extern const struct policy_ops policy_prefix_hash_ops;
extern const struct policy_ops policy_consistent_hashing_ops;
extern const struct policy_ops policy_manual_ops;
extern const struct policy_ops policy_least_load_ops;
extern const struct policy_ops policy_power_of_two_ops;
extern const struct policy_ops policy_bucket_ops;

/*
 * Canonical policy name for a user-given one (case- and
 * underscore-insensitive, policies.md §13), or NULL when unknown.
 */
const char *policy_canonical(const char *name);
/* Whether this broker implements the policy. */
bool policy_implemented(const char *canonical);
/* NULL when the name is unknown (logged). */
struct policy *policy_new(const char *name, bool builtin_defaults);
void policy_free(struct policy *p);
const char *policy_name(const struct policy *p);
int policy_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req);
/*
 * The model's instance under §13 (first worker's `policy` label decides);
 * leg policies for PD legs.
 */
struct policy *policy_for(struct broker *br, struct model_entry *me, int leg);
void policy_decide_model(struct broker *br, struct model_entry *me,
    const struct worker *first);
/* Hooks fanned out to every live instance. */
/*
 * Registry observer (server_new registers it): decides a new model's
 * instance (policy_decide_model), frees it with the model's last worker,
 * and passes worker additions and removals to the live instances.
 */
extern const struct registry_observer policy_registry_observer;
void policy_notify_add(struct broker *br, struct worker *w);
void policy_notify_remove(struct broker *br, struct worker *w);
void policy_notify_report(struct broker *br, struct worker *w);
/*
 * Policies created from now on see br (pl_br, the settings, shm, metrics,
 * store); server_new attaches itself before building them, NULL detaches.
 */
void policy_attach(struct broker *br);
/* Calls cb for every live instance: default, legs, per-model ones. */
typedef void (*policy_each_cb)(void *arg, struct policy *p);
void policy_each(struct broker *br, policy_each_cb cb, void *arg);
/* po_sweep of every live instance (the broker tick). */
void policy_sweep_all(struct broker *br, uint64_t now_ms);
/* Uniform in [0, n), n >= 1 (xoshiro256**, seeded from getrandom). */
uint32_t policy_rand_below(uint32_t n);

/* ----------------------------------------------------------
 * policy_round_robin.c */

/* Rotation count of the set c[0..n-1] in a round_robin state (tests). */
uint64_t policy_round_robin_counter(void *state, struct worker *const *c,
    unsigned n);

/* ----------------------------------------------------------
 * policy_bucket.c */

struct bucket;

/*
 * bucket (policies.md §10.3): per model, members are the prefill workers
 * (PD/EPD) or the regular workers (regular mode), in registration order; a
 * model-less request uses its first candidate's model. Ranges are
 * recomputed from po_sweep every 5 s per model (first 5 s after the
 * model's bucket appears). The model's bucket of a bucket instance, NULL
 * when p is no bucket or the model has none (tests).
 */
struct bucket *policy_bucket_state(struct policy *p, const char *model);

/* ----------------------------------------------------------
 * policy_least_load.c */

/*
 * least_load (policies.md §3) and the broker side of the expected-wait
 * scorer, which power_of_two (§4, policy_power_of_two.c) shares: one
 * scorer per instance, fed every load report of its workers (keyed by
 * wk_url_hash), forgetting removed workers; live figures (live.c) for the
 * candidates; a report older than 3 x --load-monitor-interval counts as
 * missing. Each decision is logged at debug level with the winner's score.
 */
struct scorer;

void *policy_least_load_create(struct policy *p);
void policy_least_load_free(void *state);
void policy_least_load_on_remove(struct policy *p, struct worker *w);
void policy_least_load_on_report(struct policy *p, struct worker *w);
/* The selection of least_load, or of power_of_two when `pair`. */
int policy_least_load_pick(struct policy *p, struct worker *const *c,
    unsigned n, const Smg__RouteRequest *req, bool pair);
/* The instance's scorer (tests). */
struct scorer *policy_least_load_scorer(struct policy *p);

/* ---------------------------------------------------------- rings.c */

struct rings;
struct ring;

/*
 * The hash rings of policies.md §5.2 for one policy instance: per model
 * over all its registered workers, and the wildcard ring (model-less or
 * unknown model) over every worker. Member ids are worker slots.
 * rings_invalidate marks every ring stale (worker added or removed); the
 * ring of a model is rebuilt at its next rings_for (allocation failure is
 * fatal there, as in ring_new).
 */
struct rings *rings_new(void);
void rings_free(struct rings *rs);
void rings_invalidate(struct rings *rs);
struct ring *rings_for(struct rings *rs, struct broker *br, const char *model);
/*
 * Candidate test for ring lookups: rings_mark(c, n) makes rings_candidate
 * return a worker's position in c; rings_unmark undoes it. Not reentrant.
 */
void rings_mark(struct worker *const *c, unsigned n);
void rings_unmark(struct worker *const *c, unsigned n);
int rings_candidate(void *arg, uint64_t id, const char *url);

/* ---------------------------------------------------------- sticky.c */

/* Per-key in-flight cap of the sticky overlay (policies.md §8.3). */
#define STICKY_INFLIGHT_CAP 2
/* Longest effective key: a leg prefix and 128 bytes. */
#define STICKY_KEY_MAX 160

enum sticky_branch {
	STICKY_NO_HEALTHY_WORKERS = 0,
	STICKY_OCCUPIED_HIT,
	STICKY_OCCUPIED_MISS,
	STICKY_VACANT,
	STICKY_NO_ROUTING_ID,
	STICKY_CAP_RESPILL,
	STICKY_NBRANCHES,
};

/*
 * An assignment map: key -> up to 2 worker URLs (first preferred) and the
 * last access (CLOCK_REALTIME ms). Used by manual (one per instance) and
 * by the sticky overlay (one per broker). A map with a scope persists
 * every change through persist.c under that scope.
 */
struct sticky_map;
struct sticky_pin {
	char *sp_urls[2];
	unsigned sp_n;
	uint64_t sp_last_ms;
	uint64_t sp_saved_ms; /* last_access as last persisted */
};

struct sticky_map *sticky_map_new(void);
void sticky_map_free(struct sticky_map *m);
size_t sticky_map_size(const struct sticky_map *m);
/* NULL when absent. */
struct sticky_pin *sticky_map_get(struct sticky_map *m, const char *key);
/* Creates an empty entry (sp_n 0) when absent. */
struct sticky_pin *sticky_map_add(struct sticky_map *m, const char *key);
void sticky_map_del(struct sticky_map *m, const char *key);
/* "Pin at the front" (§8.3) / append dropping the oldest (§7.2). */
void sticky_pin_front(struct sticky_pin *p, const char *url);
void sticky_pin_append(struct sticky_pin *p, const char *url);
/* Drops entries idle for >= max_idle_ms; calls cb for each (persistence). */
typedef void (*sticky_evict_cb)(void *arg, const char *key);
size_t sticky_map_evict(struct sticky_map *m, uint64_t now_ms,
    uint64_t max_idle_ms, sticky_evict_cb cb, void *arg);
/*
 * A persisted entry back into m: created when absent, the URLs appended
 * in order, last access (and as last persisted) set to last_ms.
 */
void sticky_map_restore(struct sticky_map *m, const char *key,
    const char *const *urls, unsigned nurls, uint64_t last_ms);
/* Calls cb for every entry (tests, persistence). */
typedef void (
    *sticky_each_cb)(void *arg, const char *key, struct sticky_pin *p);
void sticky_map_each(struct sticky_map *m, sticky_each_cb cb, void *arg);

/*
 * Strips one trailing "_r<digits>" then one "_t<digits>" (§8.2) of in into
 * out; the raw value when nothing would remain. Returns out.
 */
const char *sticky_strip(const char *in, char *out, size_t len);
/*
 * The effective key of req (§1.4, §8.2), with the leg prefix of §8.3:
 * override on: rid key, else the lineage-stripped routing key; override
 * off: the raw routing key. NULL when none; *source "rid" or "header".
 */
const char *sticky_key(struct broker *br, const Smg__RouteRequest *req,
    char *buf, size_t len, const char **source);
/*
 * Per-key in-flight on a worker (§1.4). sticky_dispatched counts a keyed
 * decision, sticky_finished the outcome naming that key
 * (Outcome.sticky_key, without leg prefix: the caller adds it); a NULL or
 * empty key is not counted. A count left unchanged for 2 s is clamped to
 * the worker's total in-flight, so lost outcomes (a frontend killed
 * mid-request) cannot pin a key forever.
 */
void sticky_dispatched(struct broker *br, const char *key, struct worker *w);
void sticky_finished(struct broker *br, const char *key, struct worker *w);
uint32_t sticky_inflight_get(struct broker *br, const char *key,
    struct worker *w);
/* Distinct keys with >= 1 request in flight on w (manual min_group). */
uint32_t sticky_keys_on(struct broker *br, struct worker *w);
/* Forgets every count of a removed worker. */
void sticky_forget_worker(struct broker *br, struct worker *w);

/* Assignment modes of §7.3 (enum assignment_mode values). */
int sticky_assign_pick(struct broker *br, int mode, struct worker *const *c,
    unsigned n);
/*
 * Whether the overlay of §8 applies to policy p for req: override on, p
 * neither manual nor consistent_hashing, and an effective key.
 */
bool sticky_applies(struct broker *br, const struct policy *p,
    const Smg__RouteRequest *req);
/* §8.3 around policy p. Index into c, or -1. */
int sticky_select(struct broker *br, struct policy *p, struct worker *const *c,
    unsigned n, const Smg__RouteRequest *req);
/* smg_manual_policy_branch_total{branch}. */
void sticky_count_branch(struct broker *br, enum sticky_branch b);
/* smg_routing_key_source_total{source}; source "rid" or "header". */
void sticky_count_source(struct broker *br, const char *source);
/* The broker-wide sticky map (tests). */
struct sticky_map *sticky_global_map(struct broker *br);
/* CLOCK_REALTIME milliseconds: the clock of sp_last_ms. */
uint64_t sticky_wall_ms(void);
const char *sticky_branch_name(enum sticky_branch b);
/* Broker-wide state: the sticky map and the per-key in-flight table. */
void sticky_init(struct broker *br);
void sticky_free(struct broker *br);
/* Idle eviction of the sticky map (broker tick). */
void sticky_sweep(struct broker *br, uint64_t now_ms);

/* ---------------------------------------------------------- persist.c */

/*
 * Routing state in LMDB, written behind through store.c (STORE_BEHIND_MS):
 * - assignments: (scope, key) -> URLs and last access, for manual
 *   instances (scope "manual/<instance>") and the sticky map ("sticky");
 * - the tree journal: every cache_aware tree insert as (instance, model,
 *   tree kind, tenant URL, key), appended under a sequence number. A
 *   re-insert of a recent key is not written again; the journal is kept
 *   under twice the trees' budgets by dropping its oldest records.
 *   Replaying it in order into capped trees rebuilds what they held.
 * persist_restore runs once at startup, after the workers and policies
 * exist; records of unknown workers or instances are skipped. Records go
 * back through restore hooks: an instance's through its policy_ops
 * (po_restore_assign, po_replay), a broker-wide owner's through the hook
 * it registered with persist_assign_owner.
 */
void persist_init(struct broker *br);
void persist_free(struct broker *br);
int persist_restore(struct broker *br);
/* Instance name of p ("default", "prefill", "model:<name>") into buf. */
const char *persist_scope(struct broker *br, const struct policy *p, char *buf,
    size_t len);
void persist_assign_put(struct broker *br, const char *scope, const char *key,
    const struct sticky_pin *pin);
void persist_assign_del(struct broker *br, const char *scope, const char *key);
/*
 * A cache_aware hash-mode placement (policies.md §11.7) under scope
 * "hash/<instance>": key, holder URLs and their last touch (ms since the
 * epoch); n 0 deletes it. Written behind like the rest.
 */
void persist_place_put(struct broker *br, const char *scope, const char *key,
    const char *const *urls, const uint64_t *touch_ms, unsigned n);
/*
 * Restore hook of a broker-wide owner of assignments (not a policy
 * instance): persist_restore calls cb for each record stored under
 * exactly `scope` (borrowed, must outlive the broker). Call after
 * persist_init, before persist_restore; fatal beyond PERSIST_MAX_OWNERS.
 */
#define PERSIST_MAX_OWNERS 4
typedef void (*persist_assign_restore_cb)(struct broker *br, const char *key,
    const char *const *urls, unsigned nurls, uint64_t last_ms);
void persist_assign_owner(struct broker *br, const char *scope,
    persist_assign_restore_cb cb);
/* kind: 0 string tree (key = UTF-8 bytes), 1 token tree (u32 ids). */
void persist_tree_insert(struct broker *br, const struct policy *p,
    const char *model, int kind, const char *url, const void *key,
    size_t keylen);
/* Adds a tree's budget (chars or tokens) to the journal bound. */
void persist_tree_budget(struct broker *br, uint64_t units);
/* Journal records written and replayed (tests, logs). */
uint64_t persist_journal_records(const struct broker *br);

/* A manual instance's assignment map (tests). */
struct sticky_map *policy_manual_map(struct policy *p);
/* cache_aware's po_replay: one journaled insert back into its trees. */
void policy_cache_aware_replay(struct policy *p, const char *model, int kind,
    struct worker *w, const void *key, size_t keylen);

/* ---------------------------------------------------------- store.c */

/* Write-behind bound of routing state (tree journal, assignments). */
#define STORE_BEHIND_MS 50
/* A queue this large is flushed without waiting for the bound. */
#define STORE_BATCH_BYTES (8UL * 1024 * 1024)
/* LMDB's default key size limit. */
#define STORE_KEY_MAX 511

enum store_db {
	STORE_DB_WORKERS = 0, /* url -> worker record JSON */
	STORE_DB_ASSIGN, /* persist.c: manual and sticky assignments */
	STORE_DB_JOURNAL, /* persist.c: cache_aware tree inserts */
	STORE_DB_CHUNKS, /* persist.c: shared 4 KB pieces of journaled keys */
	STORE_DB_COUNT,
};

/*
 * LMDB in the state dir: the databases of enum store_db and `meta`
 * (schema). Puts and deletes are queued in memory and written by
 * store_flush in one write transaction. Worker records are flushed from
 * an ev_prepare watcher (within one loop turn); routing state waits up to
 * STORE_BEHIND_MS so a burst shares one transaction (store_flush_due).
 * No transaction ever runs on the decision path.
 */
/*
 * store_open checks the environment before using it: the state dir is a
 * directory, data.mdb's meta pages are LMDB's and the file holds every
 * page they name (a truncated file would raise SIGBUS through the map),
 * mdb_env_open and the databases open, the schema is ours, and a cursor
 * walk of every database returns records inside the file. On any failure
 * the files are renamed "<name>.corrupt-<unixtime>" (the whole path when
 * it is not a directory), one error line says so, and a new empty
 * environment is opened. NULL when even that fails (logged): the broker
 * then runs without persistence; every store_* call accepts NULL.
 */
struct store *store_open(const char *dir);
/*
 * The file checks of store_open alone, without opening anything: 0, or
 * -1 with the reason in why (for tests).
 */
int store_check_files(const char *dir, char *why, size_t whylen);
/* Flushes what is queued, then closes; store_close(NULL) is a no-op. */
void store_close(struct store *st);
/* Queue; the last queued operation per key wins. */
void store_put(struct store *st, const char *key, const char *value);
void store_del(struct store *st, const char *key);
bool store_pending(const struct store *st);
/* Writes the queue in one transaction; 0, or -1 (kept for retry). */
int store_flush(struct store *st);
/* Calls cb for each stored worker record, in key order. */
typedef void (*store_each_cb)(void *arg, const char *key, const char *value);
int store_each(struct store *st, store_each_cb cb, void *arg);
/* Binary records of any database; keys 1..STORE_KEY_MAX bytes. */
void store_put_db(struct store *st, enum store_db db, const void *key,
    size_t klen, const void *value, size_t vlen);
void store_del_db(struct store *st, enum store_db db, const void *key,
    size_t klen);
/*
 * Calls cb for each record of db in key order (key and value valid during
 * the call only); cb returns non-zero to stop. 0, or -1 on LMDB errors.
 */
typedef int (*store_each_bin_cb)(void *arg, const void *key, size_t klen,
    const void *value, size_t vlen);
int store_each_db(struct store *st, enum store_db db, store_each_bin_cb cb,
    void *arg);
/* Whether the queue must be written now (see above). */
bool store_flush_due(const struct store *st, uint64_t now_ms);
/*
 * One read transaction for a restore: iterate a database and look records
 * up from inside the callback. Values stay valid until store_reader_end.
 * NULL (logged) on LMDB errors.
 */
struct store_reader;
struct store_reader *store_reader_begin(struct store *st);
int store_reader_each(struct store_reader *r, enum store_db db,
    store_each_bin_cb cb, void *arg);
/* 0 and *val set, or -1 when absent. */
int store_reader_get(struct store_reader *r, enum store_db db, const void *key,
    size_t klen, const void **val, size_t *vlen);
void store_reader_end(struct store_reader *r);
/* Write transactions committed so far (tests). */
uint64_t store_txn_count(const struct store *st);

/* ---------------------------------------------------------- route.c */

/*
 * Serves one RouteBatch: applies its outcomes to the breakers, then makes
 * every decision. out->decisions is malloc'ed with its Decision structs;
 * free with route_batch_free. Returns 0, or -1 on allocation failure.
 */
int route_batch(struct broker *br, const Smg__RouteBatch *rb,
    Smg__DecisionBatch *out);
void route_batch_free(Smg__DecisionBatch *out);
/*
 * One decision into d (strings point into broker state or msg, a buffer
 * of msglen bytes for the error message).
 */
void route_one(struct broker *br, const Smg__RouteRequest *req,
    Smg__Decision *d, char *msg, size_t msglen);
void route_outcome(struct broker *br, const Smg__Outcome *o);

/*
 * Tells route_one how many of the request's prompt tokens worker w holds
 * in its cache by the policy's estimate (Decision.cached_tokens); a
 * policy calls it for the worker it picks. Ignored when the final choice
 * (after the sticky overlay) is another worker.
 */
void route_hint_cached(struct broker *br, const struct worker *w,
    uint64_t tokens);

/* ---------------------------------------------------------- live.c */

/*
 * The live load of workers (DESIGN.md "live beats polled"): what the
 * frontends' shm rows say a worker has in flight and still waiting for a
 * first token, and the prefill rate learned from the outcomes they send.
 *
 * live_prompt_tokens: the request's prompt tokens as the frontends count
 * them: token ids, else routing-text chars / 4 (RouteRequest.size, else
 * the text's bytes), else `unknown`.
 * live_rate: w's learned rate (tokens/s), else the median of its model's
 * learned workers (refreshed by live_tick), else 0 (unknown: the scorer
 * then uses its T₀).
 * live_outcome: one attempt's outcome for w; an attempt that got a first
 * body byte on a streamed response is a rate sample (rate.h): the tokens
 * ahead of it plus its prompt's uncached part over its time to first byte.
 * live_tick (broker tick, 250 ms): model priors and the per-worker gauges
 * smg_worker_outstanding_prefill_tokens and
 * smg_worker_prefill_rate_tokens_per_second (0 until learned).
 */
uint64_t live_prompt_tokens(const Smg__RouteRequest *req, uint64_t unknown);
uint64_t live_pending(struct broker *br, const struct worker *w);
uint32_t live_in_flight(struct broker *br, const struct worker *w);
double live_rate(const struct worker *w);
void live_outcome(struct broker *br, struct worker *w, const Smg__Outcome *o);
void live_tick(struct broker *br);
/* Registers w's gauges (registry_add) and zeroes them (removal). */
/* Registers and zeroes each worker's live gauges. */
extern const struct registry_observer live_registry_observer;

/* ---------------------------------------------------------- admin.c */

/*
 * The worker API of gateway.md §3.3. Fills reply with the HTTP status,
 * the JSON body (malloc'ed, free with admin_reply_free) and Location.
 */
void admin_handle(struct broker *br, const Smg__AdminRequest *req,
    Smg__AdminReply *reply);
void admin_reply_free(Smg__AdminReply *reply);
/* WorkerInfo of §3.3 with SMG's models, max_connection_attempts and
 * provider (owned by the caller). */
cJSON *admin_worker_info(struct broker *br, struct worker *w);
/*
 * Parses a WorkerSpec JSON text into ws (pointers into *root, which the
 * caller frees with cJSON_Delete). Returns 0, or -1 with err and code set.
 */
int admin_parse_spec(const char *json, cJSON **root, struct worker_spec *ws,
    char *url_buf, size_t url_len, const char **err, const char **code);

/* ---------------------------------------------------------- reports.c */

/* Applies one message of the poller (logged and dropped when stale). */
void reports_handle(struct broker *br, const Smg__PollerMsg *m);
/*
 * A DiscoveredSet from the poller's pod watch: discovered workers it does
 * not list (or lists with another type or bootstrap port) are removed at
 * once, listed urls no worker has are added (not persisted, marked
 * discovered), and a url a worker of the command line or the worker API
 * already has is left to that worker. Idempotent: the poller re-sends it.
 */
void reports_discovered(struct broker *br, const Smg__DiscoveredSet *s);
/* Re-evaluates the overload flag of w from its latest report. */
void reports_eval_overload(struct broker *br, struct worker *w);

/* ---------------------------------------------------------- remote.c */

/*
 * Frontends of other hosts: remote_sync takes one HostSync (their row's
 * live load replaces what that frontend said before) and returns the
 * packed reply (the worker table when the sender mirrors it and its
 * generation is not current). remote_in_flight / remote_pending: the
 * remote sums for a worker slot. remote_sweep forgets frontends silent
 * for 3 of their intervals (server tick). remote_free: shutdown.
 */
uint8_t *remote_sync(struct broker *br, const Smg__HostSync *hs,
    size_t *reply_len);
/* The live load a RouteBatch carries: taken as a HostSync's, no reply. */
void remote_report(struct broker *br, const Smg__HostSync *hs);
/*
 * A request decided for the frontend hs names, on worker slot, counts as
 * that frontend's load at once (one in flight, tokens pending: the prompt
 * tokens the decision did not find cached) until its next figures, which
 * hold the requests it dispatched, replace them: without this the other
 * hosts' next choices would not see it for up to a report interval.
 */
void remote_decided(struct broker *br, const Smg__HostSync *hs, uint32_t slot,
    uint64_t tokens);
uint32_t remote_in_flight(const struct broker *br, unsigned slot);
uint64_t remote_pending(const struct broker *br, unsigned slot);
size_t remote_nsources(const struct broker *br);
void remote_sweep(struct broker *br, uint64_t now_ms);
/*
 * The mirroring frontend's long poll: a TableWait whose generation is not
 * the registry's is answered at once with the table; otherwise the
 * request is held (NULL returned, nothing to send now) until
 * remote_waits_check sees the generation move (called before the loop
 * sleeps, so a change made by any message or timer goes out in the same
 * loop iteration) or remote_waits_sweep its wait_ms pass ("unchanged").
 * A wait whose connection died is dropped by the sweep (server tick).
 */
uint8_t *remote_table_wait(struct broker *br, const Smg__TableWait *tw,
    size_t *reply_len);
void remote_waits_check(struct broker *br);
void remote_waits_sweep(struct broker *br, uint64_t now_ms);
void remote_free(struct broker *br);

/* ---------------------------------------------------------- server.c */

struct broker {
	struct ev_loop *br_loop;
	/* The command line, read where it is used; borrowed, read-only. */
	const struct config *br_cf;
	int br_mode; /* connection mode of the startup workers' URLs */
	struct urlallow_cidr *br_allow; /* --worker-allow-cidr, parsed */
	size_t br_nallow;
	struct breaker_conf br_cbconf;
	struct shm *br_shm;
	int br_row;
	struct store *br_store;
	struct ipc_server *br_rep;
	struct ipc_server *br_pull;
	struct ipc_server **br_remote; /* one per bs_listen */
	struct tls_ctx *br_tls; /* for tls+tcp:// listeners, else NULL */
	/* remote.c: frontends of other hosts and their summed live load */
	struct remote_source **br_sources;
	size_t br_nsources;
	uint32_t br_remote_inflight[SHM_MAX_WORKERS];
	uint64_t br_remote_pending[SHM_MAX_WORKERS];
	struct remote_wait *br_waits; /* held TableWait requests */
	size_t br_nwaits;
	uint64_t br_waits_gen; /* the generation they were last checked at */
	/* registry */
	struct worker *br_slots[SHM_MAX_WORKERS];
	struct worker **br_order; /* registration order */
	unsigned br_nworkers;
	uint32_t br_next_order;
	unsigned br_disc_refused; /* discovered urls not added, last set */
	struct model_entry **br_models;
	unsigned br_nmodels;
	struct shm_worker *br_adopt; /* startup snapshot, NULL after */
	bool *br_adopted;
	const struct registry_observer *br_observers[REGISTRY_MAX_OBSERVERS];
	unsigned br_nobservers;
	int *br_pool_series; /* smg_worker_pool_size series set */
	unsigned br_npool_series;
	unsigned br_cpool_series;
	/* policies */
	struct policy *br_default;
	struct policy *br_legs[4]; /* by Smg__Leg; [0] unused */
	/* scratch for decisions (no allocation per decision) */
	struct worker *br_cands[SHM_MAX_WORKERS];
	/* metrics */
	int br_m_shed_selection;
	int br_m_health_ok[BROKER_NTYPES];
	int br_m_health_fail[BROKER_NTYPES];
	/* watchers */
	ev_timer br_tick;
	ev_prepare br_prepare;
	ev_signal br_sigterm;
	ev_signal br_sigint;
	uint64_t br_decisions;
	bool br_debug;
	struct sticky_state *br_sticky; /* sticky.c */
	struct persist *br_persist; /* persist.c */
	ev_timer br_flush; /* write-behind wake-up, STORE_BEHIND_MS */
	bool br_restoring; /* persist_restore running: no journal writes */
	/* route_hint_cached of the decision being made */
	unsigned br_hint_slot; /* SHM_MAX_WORKERS: none */
	uint64_t br_hint_cached;
};

/*
 * Builds the broker on loop from cf (borrowed: it must outlive the broker):
 * opens the shm segment and the store, registers the startup workers of
 * cf and the stored ones, builds the policies. With
 * `serve`, also listens on the two ipc sockets and starts the tick, the
 * store flush watcher and the signal watchers. NULL (logged) on failure.
 */
struct broker *server_new(struct ev_loop *loop, const struct config *cf,
    bool serve);
/* Flushes the store and frees everything; server_free(NULL) no-op. */
void server_free(struct broker *br);
/*
 * One frontend message in, one packed BrokerReply out (malloc'ed): Pong,
 * DecisionBatch, AdminReply, or ErrorReply for anything malformed.
 */
uint8_t *server_frontend(struct broker *br, const uint8_t *msg, size_t len,
    size_t *reply_len);
void server_poller(struct broker *br, const uint8_t *msg, size_t len);

#endif /* BROKER_BROKER_H */
