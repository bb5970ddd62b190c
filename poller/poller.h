/*
 * poller.h: the poller's private contracts, one section per file.
 *
 * smg-poller watches the shm worker table and talks HTTP to workers on one
 * libev loop: registration discovery for Pending workers (register.c),
 * health probes for Ready/NotReady ones (health.c) and load polling of
 * Ready ones (load.c), and KV-event subscriptions over ZMQ (kvevents.c).
 * Every finding goes to the broker as a PollerMsg over nng PUSH
 * (report.c). Nothing here blocks
 * the loop on a worker: each HTTP request has its own deadline.
 */
#ifndef POLLER_POLLER_H
#define POLLER_POLLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ev.h>

#include <cjson/cJSON.h>

#include "ipc.pb-c.h"
#include "sglang_scheduler.pb-c.h"
#include "shared/grpc.h"
#include "shared/loads.h"
#include "shared/shm.h"
#include "shared/upstream.h"

struct config;
struct ipc_client;
struct tls_ctx;
struct pworker;
struct poller;
struct jwks;
struct discovery;

/* ---- fetch.c ---- */

/*
 * The poller's HTTP client: one request per connection (nothing pooled:
 * probes are seconds apart), each with its own deadline; the CA files and
 * client certificate of the config, checked now (fatal when they cannot
 * be loaded, as in the frontend).
 */
struct upstream *fetch_client_new(struct ev_loop *loop,
    const struct config *cf);
/*
 * GET base+path through p->p_up (upstream_fetch), with "Authorization:
 * Bearer <api_key>" when api_key is non-empty, as smg-poller asking for
 * JSON. Same contract as upstream_fetch: NULL (logged) only when out of
 * memory, otherwise cb runs once from the loop unless cancelled
 * (upstream_fetch_cancel).
 */
struct upstream_fetch *fetch_get(struct poller *p, const char *base,
    const char *path, const char *api_key, double timeout_secs, size_t body_max,
    upstream_fetch_cb cb, void *arg);

/* ---- rpc.c ---- */

/*
 * gRPC to engines (workers.md §4): a worker registered as grpc:// or
 * grpcs:// is reached over gRPC only; an HTTP worker whose label
 * grpc_endpoint names a grpc[s]:// URL gets its loads and KV events that
 * way (inference and health stay HTTP). One channel per worker.
 */

/* What the poller calls on an engine's service. */
enum rpc_method {
	RPC_HEALTH_CHECK = 0,
	RPC_GET_LOADS,
	RPC_SUBSCRIBE_KV_EVENTS,
	RPC_FLUSH_CACHE,
};

#define RPC_ENGINE_UNKNOWN 0
#define RPC_MAX_MESSAGE    (4 * 1024 * 1024)

typedef void (*rpc_detect_cb)(struct pworker *pw, bool ok, const char *detail);

struct rpc_state {
	struct grpc_channel *rs_ch;
	char rs_target[SHM_URL_MAX]; /* the channel's URL */
	int rs_engine; /* engine table index + 1, or RPC_ENGINE_UNKNOWN */
	struct grpc_call *rs_detect;
	unsigned rs_detect_idx; /* how many services were tried */
	int rs_detect_first; /* the service tried first */
	rpc_detect_cb rs_detect_cb;
	bool rs_detect_healthy; /* what the service being tried answered */
	char rs_detect_text[GRPC_MESSAGE_MAX];
};

/* Whether url is grpc:// or grpcs://. */
bool rpc_is_grpc_url(const char *url);
/* The worker's gRPC target: its URL (grpc[s]://), else its grpc_endpoint
 * label, else NULL. */
const char *rpc_target(const struct pworker *pw);
/* The runtime name of the engine learnt for the worker, NULL unknown. */
const char *rpc_runtime(const struct pworker *pw);
/* Whether the learnt engine serves m (unknown engine: false). */
bool rpc_engine_has(const struct pworker *pw, enum rpc_method m);
/*
 * Engine detection (§4): HealthCheck on each engine's service in turn (the
 * runtime already known first) until one answers other than
 * UNIMPLEMENTED. cb(pw, ok, detail) runs once from the loop: ok when a
 * service answered healthy (rpc_runtime is then set), else detail says
 * why. Returns 0, or -1 (no target, bad URL, no memory; no callback).
 */
int rpc_detect(struct pworker *pw, rpc_detect_cb cb);
void rpc_detect_cancel(struct pworker *pw);
/*
 * Whether the worker's engine is known, so rpc_call can run. When not, a
 * side-channel worker's detection is started (once at a time); grpc://
 * workers learn theirs through registration and health probes.
 */
bool rpc_ready(struct pworker *pw);
/*
 * Starts m on the learnt engine's service with the packed request req
 * (see grpc_call_start for timeout and callbacks). NULL when there is no
 * channel, no learnt engine, or no memory (logged at debug).
 */
struct grpc_call *rpc_call(struct pworker *pw, enum rpc_method m,
    const ProtobufCMessage *req, double timeout_secs,
    grpc_message_cb on_message, grpc_close_cb on_close, void *arg);
/* Frees the channel; every call on it must have been cancelled first. */
void rpc_stop(struct pworker *pw);
/*
 * Maps a GetLoadsResponse (§4.2) into ranks[0..*n) (at most max). Returns
 * LOADS_REPORT, LOADS_EMPTY (no ranks) or LOADS_ABSENT
 * (the bytes do not decode).
 */
int rpc_parse_loads(const uint8_t *buf, size_t len, Smg__RankLoad *ranks,
    size_t max, size_t *n);
/* Maps one decoded SchedulerLoad into a RankLoad. */
void rpc_map_load(const Sglang__Grpc__Scheduler__SchedulerLoad *in,
    Smg__RankLoad *out);

/* ---- jwks.c ---- */

#define JWKS_TTL_SECS     3600 /* a key set is fetched again after this */
#define JWKS_RETRY_SECS   10 /* after a failed fetch */
#define JWKS_WANT_SPACING 5 /* refreshes asked by frontends, at most */

/*
 * The JWT key set of --jwt-issuer (its --jwt-jwks-uri, else the jwks_uri
 * of its OIDC discovery document), fetched here because the poller is the
 * process that already speaks HTTP off the request path, and shared with
 * the frontends as RUN/jwks.json (written whole to a temporary file, then
 * renamed over it; only a key set that parses is written). Fetched at
 * start, every JWKS_TTL_SECS, and when a frontend asks (shm_jwks_want,
 * at most every JWKS_WANT_SPACING); a failed fetch keeps the last file
 * and tries again after JWKS_RETRY_SECS. jwks_tick runs from the scan.
 */
struct jwks *jwks_new(struct poller *p);
void jwks_tick(struct jwks *j, uint64_t now_ms);
void jwks_free(struct jwks *j);
/*
 * Splits url into base ("scheme://host[:port]") and path ("/..." or "/",
 * query kept; path may be url itself);
 * -1 when it is not an http(s) URL or does not fit.
 */
int jwks_split_url(const char *url, char *base, size_t baselen, char *path,
    size_t pathlen);

/* ---- discovery.c ---- */

/*
 * Kubernetes service discovery (--service-discovery): the pods of the
 * selector (regular mode) or of the prefill and decode selectors (PD
 * mode, one list+watch each) are listed, then watched, through the API
 * server: https://kubernetes.default.svc:$KUBERNETES_SERVICE_PORT with
 * the service account's token and CA, or SMG_K8S_API (http:// on
 * loopback only), SMG_K8S_TOKEN_FILE and SMG_K8S_CA_FILE. A pod that is
 * Running, Ready and not being deleted is the worker
 * http://<podIP>:<--service-discovery-port>; the set of them goes to the
 * broker as one DiscoveredSet after every change (reports_discovered
 * there adds and removes). A dropped watch, an unreadable or oversized
 * event or an error lists again with backoff (0.25 s doubling to 30 s);
 * 410 Gone lists again at once; a watch the server ended resumes from
 * its resourceVersion. Nothing blocks the loop but the one getaddrinfo
 * of the API's host name when its pool is made (shared/upstream.h).
 */
#define DISCOVERY_KEY_MAX  320 /* "namespace/name" */
#define DISCOVERY_RV_MAX   128
#define DISCOVERY_LINE_MAX (1024 * 1024) /* one watch event, at most */

/* What makes a pod a worker. */
struct discovery_rule {
	const char *const *dr_selector; /* "key=value" each, all must hold */
	size_t dr_nselector;
	int dr_type; /* WorkerType of the pods it selects */
	long dr_port; /* --service-discovery-port */
	const char *dr_model_from; /* --model-id-from, NULL none */
};

/* One selected pod as a worker. */
struct discovery_pod {
	char dp_key[DISCOVERY_KEY_MAX]; /* namespace/name */
	bool dp_ready; /* Running, Ready True, not deleting, an address */
	char dp_url[SHM_URL_MAX]; /* set when dp_ready */
	int dp_type;
	int32_t dp_bootstrap_port; /* prefill annotation, -1 none */
	char dp_model[SHM_MODEL_MAX]; /* "" none */
};

/*
 * Maps a pod object. Returns 1 when its labels hold every key=value of
 * the rule (out filled), 0 when they do not (only dp_key set, so a watch
 * forgets a pod whose labels changed), -1 when it is not a named object.
 * Hostile fields (an address that is not one, a port out of range, an
 * oversized name or model) make the pod not ready or the field absent.
 */
int discovery_pod_parse(const cJSON *pod, const struct discovery_rule *r,
    struct discovery_pod *out);

enum discovery_event {
	DISCOVERY_EV_ADDED = 0,
	DISCOVERY_EV_MODIFIED,
	DISCOVERY_EV_DELETED,
	DISCOVERY_EV_BOOKMARK,
	DISCOVERY_EV_ERROR, /* *code: the Status code (410 Gone), 0 none */
	DISCOVERY_EV_BAD, /* not JSON, no type, no object, unknown type */
};

/*
 * Parses one watch line. *doc is the parsed document (NULL when not
 * JSON), to cJSON_Delete after using *object, which points into it.
 */
enum discovery_event discovery_event_parse(const char *line, size_t len,
    cJSON **doc, const cJSON **object, int *code);

/* Splits a watch body into lines of at most dl_max bytes. */
struct discovery_lines {
	char *dl_buf;
	size_t dl_len;
	size_t dl_cap;
	size_t dl_max;
};

/* One complete line, NUL-terminated, no '\n' or trailing '\r'; return -1
 * to stop. */
typedef int (*discovery_line_cb)(void *arg, const char *line, size_t len);

/*
 * Feeds len bytes; cb runs for every complete non-empty line. Returns 0,
 * or -1 when a line grows past dl_max, memory runs out (the partial line
 * is dropped) or cb returned -1.
 */
int discovery_lines_feed(struct discovery_lines *l, const char *data,
    size_t len, discovery_line_cb cb, void *arg);
void discovery_lines_reset(struct discovery_lines *l);

/* NULL without --service-discovery; fatal when the API URL is not
 * allowed or its CA file cannot be loaded (startup). */
struct discovery *discovery_new(struct poller *p);
/* From the scan: re-sends the set when one of its urls is missing from
 * the worker table (the broker restarted) or every 30 s. */
void discovery_tick(struct discovery *d, uint64_t now_ms);
void discovery_free(struct discovery *d);

/* ---- register.c ---- */

#define REGISTER_RUNTIME_MAX 16
#define REGISTER_ERROR_MAX   160

enum register_step {
	REGISTER_IDLE = 0, /* not a discovery candidate */
	REGISTER_WAIT, /* waiting for rs_next_ms to try again */
	REGISTER_HEALTH, /* GET /health */
	REGISTER_MODELS, /* GET /v1/models */
	REGISTER_VERSION, /* GET /version (vLLM detection) */
	REGISTER_SERVER_INFO, /* GET /server_info (SGLang detection) */
	REGISTER_MODEL_INFO, /* GET /model_info (model path) */
	REGISTER_GET_MODEL_INFO, /* GET /get_model_info after a 404 */
	REGISTER_DP_INFO, /* --dp-aware: GET /server_info for dp_size */
	REGISTER_DP_INFO_GET, /* GET /get_server_info after a 404 */
	REGISTER_GRPC, /* engine detection by gRPC HealthCheck */
	REGISTER_DONE, /* reported; re-run if still Pending later */
};

struct register_state {
	enum register_step rs_step;
	struct upstream_fetch *rs_req;
	uint64_t rs_first_ms; /* when discovery began for this generation */
	uint64_t rs_next_ms; /* next attempt (WAIT) or re-check (DONE) */
	unsigned rs_attempts;
	bool rs_models_live; /* /v1/models answered 2xx JSON */
	char rs_model[SHM_MODEL_MAX];
	char rs_runtime[REGISTER_RUNTIME_MAX];
	char rs_error[REGISTER_ERROR_MAX];
	uint32_t rs_dp_size; /* data-parallel ranks reported, 0 unknown */
};

/* What GET /v1/models said (workers.md §2.1): the first entry only. */
struct register_models {
	char rm_id[SHM_MODEL_MAX]; /* "" when absent */
	char rm_runtime[REGISTER_RUNTIME_MAX]; /* "" when owned_by unknown */
	char rm_root[SHM_MODEL_MAX]; /* "" when absent */
};

/*
 * Parses a /v1/models body. Returns 0 when it is a JSON object (a live
 * OpenAI-style listing, possibly empty), -1 when it is not. The runtime
 * is the lowercase owned_by when it names a known engine (sglang, vllm,
 * trtllm, tokenspeed, mlx; "nvidia" means trtllm).
 */
int register_parse_models(const char *body, size_t len,
    struct register_models *out);
/*
 * The data-parallel size of a /server_info or /get_server_info body
 * (SGLang's "dp_size", else "data_parallel_size"): an integer 1 ..
 * INT32_MAX, or 0 when the body is no JSON object or names none.
 */
uint32_t register_parse_dp_size(const char *body, size_t len);
/*
 * Parses a /model_info or /get_model_info body into its "model_path".
 * Returns 0 when found (non-empty string), -1 otherwise.
 */
int register_parse_model_info(const char *body, size_t len, char *model,
    size_t model_len);

/* ---- health.c ---- */

struct health_state {
	struct upstream_fetch *hs_req;
	struct grpc_call *hs_call; /* grpc:// workers */
	bool hs_detecting; /* grpc:// with no engine learnt: detection */
	bool hs_passed; /* the HealthCheckResponse said healthy */
	char hs_detail[GRPC_MESSAGE_MAX];
	uint64_t hs_next_ms; /* 0: not scheduled */
};

/* ---- load.c ---- */

/* gateway.md §9.2: the load route, its timeout and the ranks kept. */
#define LOAD_PATH         "/v1/loads?include=core,disagg,queues,memory"
#define LOAD_TIMEOUT_SECS 5.0
#define LOAD_MAX_RANKS    256

enum load_step {
	LOAD_IDLE = 0,
	LOAD_LOADS, /* GET /v1/loads in flight */
	LOAD_METRICS, /* GET /metrics (fallback) in flight */
};

struct load_state {
	struct upstream_fetch *ls_req;
	struct grpc_call *ls_call; /* GetLoads in flight */
	bool ls_grpc_absent; /* GetLoads is UNIMPLEMENTED (logged once) */
	uint8_t *ls_grpc_msg; /* the GetLoadsResponse, until the status */
	size_t ls_grpc_len;
	enum load_step ls_step;
	uint64_t ls_next_ms; /* next poll; 0: not scheduled */
	bool ls_absent; /* /v1/loads is absent: /metrics from now on */
	unsigned ls_gauge_ranks; /* ranks with smg_engine_* gauges set */
};

/*
 * Reads one synthetic rank from Prometheus text (workers.md §3): SGLang
 * names (prefix "sglang:" or "sglang_", whichever has token_usage) or vLLM
 * names, counts summed and ratios averaged over label sets. runtime
 * "sglang" or "vllm" restricts the names tried; anything else tries
 * SGLang first. Returns 0 with *rank filled, -1 when no engine's
 * presence gauge is in the text (no report).
 */
int load_parse_prom(const char *body, size_t len, const char *runtime,
    Smg__RankLoad *rank);
/*
 * Whether the poller polls loads at all (§9.1): always, unless
 * --disable-load-monitoring and nothing consumes them (load-aware
 * policies, DP-rank scheduling, --engine-metrics, overload protection).
 */
bool load_wanted(const struct config *cf);
/*
 * Per-slot hooks of the scan, like health's: every --load-monitor-interval
 * (lowered for a group by a member's spec load_monitor_interval_secs) a
 * Ready worker's loads are fetched (gRPC GetLoads on its gRPC target, else
 * /v1/loads or the /metrics fallback) and the LoadReport sent to the
 * broker; at most one fetch per worker in flight. Workers are polled when
 * load_wanted() or their spec sets an overload veto.
 */
void load_tick(struct pworker *pw, uint64_t now_ms);
void load_stop(struct pworker *pw);
/*
 * The one exit of a fetch, whatever its transport (HTTP here; a gRPC
 * GetLoads client calls it the same way with source "grpc"): sends the
 * LoadReport of ranks[0..n) (n 0: ok=false, no report this tick) and, with
 * --engine-metrics, sets the smg_engine_* gauges.
 */
void load_report(struct pworker *pw, Smg__RankLoad *ranks, size_t n,
    const char *source);

/* ---- kvevents.c ---- */

/* Per-subscription sequence state (workers.md §6.4). */
struct kvevents_seq {
	bool kq_have; /* a first batch fixed the baseline */
	uint64_t kq_last;
	bool kq_reset_next; /* a batch was lost: the next one resets */
};

enum kvevents_verdict {
	KVEVENTS_APPLY = 0, /* the next batch: forward */
	KVEVENTS_RESET, /* forward with reset: first, gap or restart */
	KVEVENTS_SKIP, /* duplicate or older */
};

enum kvevents_probe {
	KVEVENTS_PROBE_NONE = 0, /* not asked yet */
	KVEVENTS_PROBE_BUSY, /* GET /get_server_info or /server_info */
	KVEVENTS_PROBE_DONE, /* answered: ks_found holds what it said */
};

struct kvevents_state {
	void *ks_sock; /* ZMQ SUB, NULL when not subscribed */
	ev_io ks_io; /* on ZMQ_FD */
	char ks_endpoint[SHM_URL_MAX]; /* the connected endpoint */
	struct kvevents_seq ks_seq;
	uint64_t ks_batches; /* forwarded since subscribing */
	/* discovery of kv_events_config when no label names an endpoint */
	enum kvevents_probe ks_probe;
	bool ks_probe_fallback; /* /get_server_info 404: trying /server_info */
	struct upstream_fetch *ks_req;
	uint64_t ks_next_ms; /* next probe after a transport failure */
	char ks_found[SHM_URL_MAX]; /* "" none */
	char ks_topic[SHM_URL_MAX];
	/* gRPC SubscribeKvEvents (workers.md §5.1) */
	struct grpc_call *ks_stream;
	bool ks_stream_off; /* UNIMPLEMENTED: tree mode, not asked again */
	bool ks_stream_up; /* the server accepted this stream */
	uint64_t ks_stream_next_ms; /* next subscribe */
	uint64_t ks_stream_backoff_ms;
};

/*
 * Decodes one msgpack payload (workers.md §6.2: array or map form, events
 * of either form, int or bytes hashes) into b->events, each malloc'ed;
 * kvevents_batch_clear frees them. Unknown event tags are skipped.
 * Returns 0, or -1 (b left empty) when the payload is not a valid batch.
 */
int kvevents_decode(const void *buf, size_t len, Smg__KvEventBatch *b);
void kvevents_batch_clear(Smg__KvEventBatch *b);
/* Applies the sequence rules of workers.md §6.4 to the batch number seq. */
enum kvevents_verdict kvevents_sequence(struct kvevents_seq *q, uint64_t seq);
/*
 * The endpoint to connect to for a worker: a bind wildcard host (*,
 * 0.0.0.0, ::, empty) becomes the host of worker_url; anything else is
 * copied. Returns 0, or -1 when it does not fit or cannot be parsed.
 */
int kvevents_resolve(const char *endpoint, const char *worker_url, char *out,
    size_t len);
/*
 * Reads `kv_events_config` (a JSON string or object) of a server info
 * body: its endpoint (the engines' default, port 5557 on every address,
 * when a zmq publisher names none) and topic. Returns 0 when the worker
 * publishes over ZMQ, -1 not.
 */
int kvevents_parse_server_info(const char *body, size_t len, char *endpoint,
    size_t elen, char *topic, size_t tlen);
/*
 * Per-slot hooks of the scan: a Ready or NotReady worker whose label (or
 * server info) names an endpoint is subscribed; batches go to the broker
 * as KvEventBatch. _stop unsubscribes and forgets the probe.
 */
void kvevents_tick(struct pworker *pw, uint64_t now_ms);
void kvevents_stop(struct pworker *pw);
/*
 * Converts a gRPC KvEventBatch (§5) into the report form: consecutive
 * blocks of one BlocksStored with the same block size stay one event,
 * chained by their hashes. Events are malloc'ed as kvevents_decode's;
 * free with kvevents_batch_clear. Returns 0, or -1 (out left empty).
 */
int kvevents_from_grpc(const Smg__Grpc__Common__KvEventBatch *in,
    Smg__KvEventBatch *out);
/* Closes the ZMQ context (after every _stop). */
void kvevents_shutdown(struct poller *p);

/* ---- main.c / report.c: the process ---- */

/* The poller's view of one worker table slot. */
struct pworker {
	struct poller *pw_poller;
	unsigned pw_slot;
	bool pw_in_use;
	uint32_t pw_generation;
	uint32_t pw_status; /* enum shm_worker_status, as last scanned */
	char pw_url[SHM_URL_MAX];
	/* Where its engine is reached: pw_url without a data-parallel
	 * "@<rank>" suffix (pw_rank, -1 none). */
	char pw_base[SHM_URL_MAX];
	int pw_rank;
	char pw_api_key[SHM_KEY_MAX];
	char pw_model[SHM_MODEL_MAX];
	char pw_runtime[REGISTER_RUNTIME_MAX]; /* learnt by registration */
	struct register_state pw_reg;
	struct health_state pw_health;
	struct load_state pw_load;
	char pw_kv_label[SHM_URL_MAX]; /* label kv_events_endpoint, "" none */
	char pw_grpc_label[SHM_URL_MAX]; /* label grpc_endpoint, "" none */
	uint32_t pw_type; /* enum WorkerType */
	uint32_t pw_mode; /* enum ConnectionMode */
	uint32_t pw_own_interval_secs; /* spec load_monitor_interval_secs */
	bool pw_overload_on; /* the spec's overload veto applies */
	uint64_t pw_load_interval_ms; /* its group's period (gateway.md §9.1) */
	struct rpc_state pw_rpc;
	struct kvevents_state pw_kv;
};

struct poller {
	struct ev_loop *p_loop;
	const struct config *p_cf;
	struct shm *p_shm;
	struct ipc_client *p_reports; /* PUSH to RUN/reports.ipc */
	struct upstream *p_up; /* HTTP to workers and the JWKS issuer */
	struct tls_ctx *p_grpc_tls; /* ALPN h2; NULL: grpcs:// calls fail */
	bool p_load_on; /* load_wanted() */
	uint64_t p_load_interval_ms;
	void *p_zmq; /* ZMQ context, made on the first subscription */
	struct pworker p_workers[SHM_MAX_WORKERS];
	struct jwks *p_jwks; /* NULL without --jwt-issuer */
	struct discovery *p_discovery; /* NULL without --service-discovery */
};

/*
 * Data-parallel ranks of one engine ("<url>@<rank>" slots, --dp-aware)
 * share its address: one of them, the leader, probes its health, polls
 * its loads and subscribes to its KV events for all (the lowest slot
 * among those Ready or NotReady); the others stay idle. A worker without
 * rank leads itself.
 */
bool poller_leads(const struct pworker *pw);
/*
 * The slots a finding of pw's engine is reported for: pw, and for a rank
 * its siblings that are Ready or NotReady, in slot order. Returns how
 * many were stored in out (SHM_MAX_WORKERS entries).
 */
unsigned poller_ranks(struct pworker *pw, struct pworker **out);

/*
 * Sends one message to the broker (version set here). Returns 0, or -1
 * (logged) when it could not be queued; the callers' schedules retry.
 */
int report_send(struct poller *p, Smg__PollerMsg *m);

/*
 * Per-slot hooks, called by the 200 ms scan with the slot's fresh copy in
 * pw (identity, status, url, key). _tick starts what is due; _stop cancels
 * in-flight requests and forgets the schedule (slot freed or reused).
 */
void register_tick(struct pworker *pw, uint64_t now_ms);
void register_stop(struct pworker *pw);
void health_tick(struct pworker *pw, uint64_t now_ms);
void health_stop(struct pworker *pw);

/* Body cap for every poller GET. */
#define POLLER_BODY_MAX (1024 * 1024)

#endif /* POLLER_POLLER_H */
