/*
 * frontend.h: private header of smg-frontend, one section per file.
 *
 * The frontend is single-threaded: everything here runs on the process's
 * one libev loop (nng's threads stay inside shared/ipc.c). struct frontend
 * is the process state, reached through the global `fe` set up by main.c.
 */
#ifndef FRONTEND_FRONTEND_H
#define FRONTEND_FRONTEND_H

#include <sys/queue.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <ev.h>

#include "ipc.pb-c.h"

#include "frontend/extract.h"
#include "shared/upstream.h"
#include "shared/config.h"
#include "shared/http.h"
#include "shared/metrics.h"
#include "shared/otlp.h"
#include "shared/shm.h"

#define FE_IN_BUF            16384 /* client read buffer per connection */
#define FE_OUT_HIGH          (256 * 1024) /* pause the worker above this */
#define FE_OUT_LOW           (64 * 1024) /* resume it below this */
#define FE_MAX_CONNS         16384
#define FE_HEADER_TIMEOUT    30.0 /* request head must arrive within */
#define FE_IDLE_TIMEOUT      75.0 /* keep-alive idle connection */
#define FE_BROKER_TIMEOUT_MS 250 /* one decision batch round trip */
#define FE_ADMIN_TIMEOUT_MS  10000 /* worker API through the broker */
#define FE_ADMIN_DOWN_MS     800 /* ... when no broker process is alive */
#define FE_DRAIN_IDLE_SECS   1.0 /* idle keep-alive clients while draining */
#define FE_OUTCOME_FLUSH     0.05 /* outcomes wait at most this long */
#define FE_PING_INTERVAL     0.25 /* broker probe while it is down */
#define FE_HEARTBEAT         0.25
#define FE_MAX_EXCLUDE       16
#define FE_POLICY_MAX        32
#define FE_CODE_MAX          48
#define FE_MSG_MAX           256
#define FE_FANOUT_BODY_MAX   (1024 * 1024)
#define FE_TARGET_MAX        2048 /* path + "?" + query, 414 beyond */
#define FE_BODY_RATE_WINDOW  10.0 /* request body rate measured over */

struct conn;
struct req;
struct reqctx;

/* Which listener accepted a connection, hence which routes it serves. */
enum listener_kind {
	LISTENER_MAIN = 0,
	LISTENER_METRICS,
	LISTENER_HEALTH,
};

/* The process state; read-mostly after startup. */
struct frontend {
	struct ev_loop *fe_loop;
	const struct config *fe_cf;
	struct shm *fe_shm;
	int fe_row;
	struct upstream *fe_up;
	struct ipc_client *fe_broker;
	struct tls_ctx *fe_tls; /* server side, NULL: plain HTTP */
	struct tls_ctx *fe_broker_tls; /* tls+tcp:// broker, else NULL */
	struct http_limits fe_limits;
	char fe_broker_url[512];
	bool fe_draining;
	unsigned fe_nconns;
	unsigned fe_nbusy; /* connections with a request in progress */
};

extern struct frontend *fe;

/* ---------------------------------------------------------- listener.c */

/*
 * Binds host:port with SO_REUSEPORT (so every frontend shares the port)
 * and accepts into conn_accept. Returns 0, or -1 (logged).
 */
int listener_open(const char *host, long port, enum listener_kind kind);
/* Stops accepting on every listener and closes them (shutdown). */
void listener_close_all(void);

/* ---------------------------------------------------------- conn.c */

/*
 * A request handler attached to a busy connection. on_drained runs when
 * the pending output fell below FE_OUT_LOW after having exceeded
 * FE_OUT_HIGH. What a request holds (upstream requests, timers, decisions)
 * is released by the hooks it registers with conn_on_end, which run once
 * however the request ends: answered, aborted, or the client gone (then
 * from the loop, never from inside a conn_* call made by the handler).
 *
 * For a request whose body is streamed (proxy_stream_wanted), ch_body
 * gets each piece as it arrives (valid during the call; last set with the
 * final one), and ch_body_stalled runs when the client stopped sending
 * for --stream-body-stall-timeout-secs: the handler ends the request
 * (conn_error, conn_request_abort); the connection closes afterwards.
 */
struct conn_handler {
	void (*ch_drained)(void *arg);
	void (*ch_body)(void *arg, const char *data, size_t len, bool last);
	void (*ch_body_stalled)(void *arg);
};

/*
 * Where complete requests go (main.c sets it once): dispatch gets each
 * request, complete or (when stream_wanted said so for its head on the
 * main listener) with its body still arriving through ch_body.
 */
struct conn_routes {
	void (*cr_dispatch)(struct conn *c, const struct http_request *hr,
	    enum listener_kind kind);
	bool (*cr_stream_wanted)(const struct http_request *hr);
};
void conn_set_routes(const struct conn_routes *routes);

/* Takes the accepted non-blocking fd (closed on any failure). */
void conn_accept(int fd, enum listener_kind kind);
/* Closes idle connections and marks the others to close after their
 * current response (shutdown). */
void conn_drain_all(void);

void conn_set_handler(struct conn *c, const struct conn_handler *h, void *arg);
/*
 * Memory of the current request: zeroed, freed when the request ends
 * (after the conn_on_end hooks ran). NULL when out of memory.
 */
void *conn_alloc(struct conn *c, size_t n);
/* Registers fn(arg) to run once when the current request ends, newest
 * first. Returns 0, or -1 when out of memory. */
int conn_on_end(struct conn *c, void (*fn)(void *), void *arg);
/* The output buffer; append the response, then conn_flush. */
struct http_out *conn_out(struct conn *c);
void conn_flush(struct conn *c);
/*
 * Like conn_flush, but the write happens once, before the loop next
 * sleeps, for everything appended until then (a response relayed piece by
 * piece). conn_pending counts the bytes not yet written either way.
 */
void conn_flush_later(struct conn *c);
/* Response bytes not yet written to the socket. */
size_t conn_pending(const struct conn *c);
/* Whether the response being written may keep the connection open. */
bool conn_keep_alive(const struct conn *c);
/* Whether the current request's body is still being streamed in. */
bool conn_body_streaming(const struct conn *c);
/* Stops / resumes reading a streamed body (back-pressure from the
 * worker); the stall timeout does not run while paused. */
void conn_body_pause(struct conn *c);
void conn_body_resume(struct conn *c);
/* Forces "Connection: close" semantics for the current response. */
void conn_set_close(struct conn *c);
/* The client's HTTP minor version (chunked responses need 1). */
unsigned conn_http_minor(const struct conn *c);
enum listener_kind conn_kind(const struct conn *c);
/* The status of the response written for the current request, 0 none. */
int conn_status(const struct conn *c);
/*
 * Counts delta more (or fewer) bytes held for the current request in the
 * frontend's --max-buffered-bytes-total (request bodies are counted by
 * the connection itself; a handler adds what it holds of a response).
 * Released when the request ends. -1 (nothing counted) when over the cap.
 */
int conn_buffer_add(struct conn *c, int64_t delta);
/* Whether the client connects from this host (loopback or Unix socket). */
bool conn_peer_loopback(const struct conn *c);
/*
 * The current response is fully appended. The response is counted
 * (smg_http_responses_total, with the status written), the request's
 * hooks run and its memory is freed, and the connection goes on with the
 * next (pipelined) request or closes: the handler must not touch c, the
 * request or anything it allocated with conn_alloc afterwards.
 */
void conn_request_done(struct conn *c);
/* The response cannot be completed (worker failed mid-body): closes the
 * connection once the pending output is written. Same rule as above. */
void conn_request_abort(struct conn *c);

/* Complete responses; both end the request (conn_request_done). */
void conn_respond(struct conn *c, int status, const char *content_type,
    const char *body, size_t len, const char *request_id);
void conn_error(struct conn *c, int status, const char *code,
    const char *message, const char *request_id, int retry_after_secs);
/* 405 with Allow: allow (the route's methods), in the gateway's error
 * shape; ends the request. */
void conn_method_not_allowed(struct conn *c, const char *allow,
    const char *request_id);
/* Takes ownership of j (deleted); 503 when it cannot be printed. */
void conn_json(struct conn *c, int status, cJSON *j, const char *request_id);
/* Starts a response of its own: the status line, recorded as the status
 * answered; the caller appends headers, body, then conn_request_done. */
struct http_out *conn_response(struct conn *c, int status);
/* Appends a worker's response head (hdr_response_head) and records its
 * status as the one this request answered. */
void conn_relay_head(struct conn *c, int status,
    const struct upstream_header *h, size_t n, bool keep_length, bool streaming,
    bool chunked, const char *request_id, const char *worker_url);

/* ---------------------------------------------------------- hdr.c */

/* Hop-by-hop response headers of gateway.md §3.4 (never relayed). */
bool hdr_is_hop_by_hop(const char *name, size_t len);
/* Client request headers forwarded to workers (gateway.md §3.4). */
bool hdr_is_forwarded(const char *name, size_t len);

#define HDR_UPSTREAM_MAX 24
#define HDR_VIA_MAX      1024 /* longest Via value sent upstream */

/*
 * Computes this gateway's hop id from cf (host name, --host, --port,
 * --run-dir: the same in every frontend of one gateway). Call once at
 * startup, before hdr_upstream or hdr_is_looped.
 */
void hdr_init(const struct config *cf);
/* "smg-c-<16 hex>", the received-by of our Via entries. */
const char *hdr_via_token(void);
/*
 * Whether req already passed through this gateway: a Via header lists
 * our hop id, or the Via chain is too long to extend (HDR_VIA_MAX). The
 * caller answers 508 loop_detected.
 */
bool hdr_is_looped(const struct http_request *req);

/*
 * The header list sent to a worker: the forwarded client headers (minus
 * x-request-id, replaced by request_id), authorization ("Bearer
 * <worker_api_key>" formatted into authbuf when the worker has a key, else
 * the client's own unless the gateway authenticated it with a credential
 * of its own: JWT, tenant or control-plane key), the request's traceparent
 * (traceparent when not NULL: an attempt's, trace.c) and tracestate from
 * its reqctx in place of the client's, via
 * (the client's Via list plus "1.1 <hdr_via_token()>", once hdr_init ran),
 * x-request-id and content-type: application/json when json_body. Pointers
 * borrow req, request_id and authbuf; the via value lives in hdr.c until the
 * next call, so hand the list on (upstream_request copies it) before calling
 * again. Returns the count written to out (at most max).
 */
size_t hdr_upstream(const struct http_request *req, const struct reqctx *rx,
    const char *traceparent, const char *request_id, const char *worker_api_key,
    bool json_body, char *authbuf, size_t authlen, struct upstream_header *out,
    size_t max);

/*
 * Appends the relayed response head: status line, the worker's headers
 * minus hop-by-hop ones (and minus content-length unless keep_length, and
 * minus content-type when streaming, and minus x-request-id), then
 * x-request-id, x-smg-routed-worker-id (when worker_url), content-type
 * text/event-stream when streaming, the framing (content-length kept,
 * "transfer-encoding: chunked" when chunked), and Connection.
 */
void hdr_response_head(struct http_out *o, int status,
    const struct upstream_header *h, size_t n, bool keep_length, bool streaming,
    bool chunked, const char *request_id, const char *worker_url,
    bool keep_alive);

/*
 * A copy of h[0..n) in one malloc'd block (free() it), with room for one
 * more entry at index n; NULL when out of memory.
 */
struct upstream_header *hdr_copy(const struct upstream_header *h, size_t n);
/*
 * Replaces any content-length in h (which has room for n + 1 entries) by
 * one of value len, formatted into buf. Returns the new count.
 */
size_t hdr_set_length(struct upstream_header *h, size_t n, char *buf,
    size_t buflen, size_t len);
/* The value of a response header (any case) or NULL. */
const struct upstream_header *hdr_find(const struct upstream_header *h,
    size_t n, const char *name);

/* ---------------------------------------------------------- backoff.c */

struct backoff_policy {
	unsigned rp_max_attempts; /* total, >= 1 */
	long rp_initial_ms;
	long rp_max_ms;
	double rp_multiplier;
	double rp_jitter;
};

void backoff_policy_from_config(struct backoff_policy *rp,
    const struct config *cf);
/*
 * Backoff after failed attempt `attempt` (0-based), gateway.md §7.1:
 * d = min(trunc(initial * multiplier^attempt), max), then
 * max(0, d + round(d * u)) with u = jitter * unit, unit in [-1, 1].
 */
long backoff_ms(const struct backoff_policy *rp, unsigned attempt, double unit);
/* A uniform draw in [-1, 1] for backoff_ms. */
double backoff_unit(void);
/* {408, 429, 500, 502, 503, 504}. */
bool backoff_status_retryable(int status);

/* ---------------------------------------------------------- fallback.c */

/* A routing decision, from the broker or made locally. */
struct decision {
	bool dc_ok;
	bool dc_fallback; /* made locally */
	unsigned dc_slot;
	uint32_t dc_generation;
	char dc_url[SHM_URL_MAX];
	char dc_model[SHM_MODEL_MAX];
	/* Decision.resolved_model: the model a WorkerSpec alias named, or "" */
	char dc_resolved[SHM_MODEL_MAX];
	char dc_policy[FE_POLICY_MAX];
	char dc_api_key[SHM_KEY_MAX];
	uint32_t dc_worker_type;
	int dc_status; /* error: 404, 503, ... */
	char dc_code[FE_CODE_MAX];
	char dc_message[FE_MSG_MAX];
	bool dc_terminal;
	unsigned dc_retry_after;
	uint32_t dc_cached_tokens; /* Decision.cached_tokens, for the outcome */
};

/*
 * Local fallback (DESIGN.md): least in-flight among the available workers
 * (in use, Ready, breaker not Open, not overloaded, HTTP, of worker_type)
 * of the model in the shm table; model NULL, "" or "unknown" takes every
 * worker; aliases resolve through cf. Slots in exclude are avoided when
 * another candidate remains. Ties are broken at random. Fills d: 404
 * model_not_found when no worker serves the model, 503
 * no_available_workers when none is available.
 */
void fallback_select(struct shm *shm, const struct config *cf,
    const char *model, uint32_t worker_type, const uint32_t *exclude,
    size_t nexclude, struct decision *d);
/* Fills d from the shm slot (url, api key, type); -1 if the slot is no
 * longer the one decided (free or another generation). */
int fallback_fill_worker(struct shm *shm, unsigned slot, uint32_t generation,
    struct decision *d);
/* Resolves --model-alias; returns model itself when it is no alias. */
const char *fallback_canonical(const struct config *cf, const char *model);
/* The first Ready worker (registration order) of type regular; -1 none. */
int fallback_first_ready(struct shm *shm, struct shm_worker *out,
    unsigned *slot);

/* ---------------------------------------------------------- decide.c */

typedef void (*decide_cb)(void *arg, const struct decision *d);

/* One routing question; embedded in its requester. */
struct decide_item {
	const struct extract_inputs *di_in;
	unsigned di_leg; /* Smg__Leg; 0 (LEG_SINGLE) outside PD */
	unsigned di_attempt;
	const uint32_t *di_exclude;
	size_t di_nexclude;
	decide_cb di_cb;
	void *di_arg;
	/* private */
	bool di_queued;
	void *di_batch;
	size_t di_index;
	TAILQ_ENTRY(decide_item) di_link;
};

void decide_init(void);
void decide_shutdown(void);
/*
 * hostsync.c: with --broker (a broker on another host), sends this row's
 * live load every 100 ms and, on row 0, mirrors the broker's worker table
 * into the local shared memory. No-ops without --broker.
 */
void hostsync_init(void);
void hostsync_shutdown(void);
/*
 * Whether a broker process is there to answer: its shm row is alive, or,
 * for a broker on another host, the connection to it is up.
 */
bool hostsync_broker_alive(void);
/*
 * With --broker: this row's live load now, in a message owned by
 * hostsync.c and valid until the next call (decide.c sends it with each
 * RouteBatch). NULL without --broker.
 */
Smg__HostSync *hostsync_live(void);
/*
 * Queues a routing question; every question queued during one loop turn
 * travels in one RouteBatch. di_cb runs later (never inside this call),
 * with the broker's decision or, when the broker is unreachable, the local
 * fallback's.
 */
void decide_submit(struct decide_item *it);
/* Withdraws a question whose answer is no longer wanted; no callback. */
void decide_cancel(struct decide_item *it);
/* An effective routing key: at most 128 bytes and the NUL. */
#define DECIDE_KEY_MAX 129
/*
 * What an attempt dispatched to a worker saw live (Outcome fields 7-11 of
 * ipc.proto): prompt tokens it added to the worker's pending tokens, the
 * worker's pending total just before, and the time to the first response
 * body byte. NULL where an outcome has none (never dispatched): zeros.
 */
struct outcome_live {
	uint32_t ol_prompt_tokens;
	uint64_t ol_ahead_tokens;
	uint32_t ol_ttfb_us; /* 0 when no body byte came */
	bool ol_first_byte;
	bool ol_unstreamed; /* not streamed: ttfb is the whole generation */
};

/*
 * Queues an attempt's outcome for the broker: the circuit breaker's
 * sample (none when no_breaker_sample: the client went away), the end
 * of the key's in-flight (key from decide_key, "" or NULL when none) and
 * the attempt's live figures (live, NULL for none; cached_tokens is the
 * decision's Decision.cached_tokens). Every successful broker decision
 * gets exactly one outcome.
 */
void decide_outcome(unsigned slot, uint32_t generation, int http_status,
    bool transport_error, const char *key, bool no_breaker_sample,
    const struct outcome_live *live, uint32_t cached_tokens);
/*
 * The request's effective routing key as the broker counts it (policies.md
 * §1.4), without leg prefix: with override the rid key if any, else the
 * lineage-stripped routing-key header; without it the raw header; ""
 * when none. Returns buf.
 */
const char *decide_key(const struct extract_inputs *in, bool override,
    char *buf, size_t len);
/*
 * decide_outcome for decision d of a request with inputs in: the key is
 * the request's effective key, or none for a local (fallback) decision,
 * which the broker never counted.
 */
void decide_outcome_of(const struct decision *d,
    const struct extract_inputs *in, int http_status, bool transport_error,
    bool no_breaker_sample, const struct outcome_live *live);
/*
 * The dispatch-time overload re-check (gateway.md §8): whether the
 * worker of (slot, generation) has its overload flag set in shm now.
 */
bool decide_overloaded(struct shm *shm, unsigned slot, uint32_t generation);
/*
 * decide_overloaded on d's worker, counting
 * smg_worker_overload_shed_total{stage="dispatch"} when it is.
 */
bool decide_dispatch_shed(const struct decision *d);
/*
 * Whether the broker conversation is healthy enough for /readiness: false
 * once the broker has been unreachable (no connection, or no answer to
 * pings) for 5 s; decisions are then all local fallbacks.
 */
bool decide_broker_ready(void);
/* Sends an admin request; cb gets the packed BrokerReply or an error. */
int decide_admin(Smg__AdminRequest *ar,
    void (*cb)(void *arg, int status, const uint8_t *reply, size_t len),
    void *arg);

/* ---------------------------------------------------------- reqctx.c */

#define REQCTX_TENANT_MAX 192 /* "auth:<id>", "header:<id>", "anonymous" */
#define REQCTX_TRACE_MAX  56 /* a version-00 traceparent value */
#define REQCTX_STATE_MAX  512 /* tracestate relayed whole up to this */

/*
 * Who sent a request and under which trace, set by the router before the
 * request goes on and read by the modules it reaches (admission.c for
 * tenant limits, hdr.c for the headers sent to workers). It lives in the
 * request's memory and is found again from its struct http_request.
 */
enum reqctx_method {
	REQCTX_NONE = 0, /* nothing presented, or nothing required */
	REQCTX_API_KEY, /* --api-key */
	REQCTX_TENANT_KEY, /* --tenant-api-key */
	REQCTX_CP_KEY, /* --control-plane-api-keys */
	REQCTX_JWT,
};

struct reqctx {
	const struct http_request *rc_hr;
	struct conn *rc_conn;
	enum reqctx_method rc_method;
	bool rc_admin;
	char rc_principal[128]; /* key id, tenant id, JWT subject */
	char rc_tenant[REQCTX_TENANT_MAX];
	char rc_traceparent[REQCTX_TRACE_MAX]; /* ours, sent to workers */
	char rc_trace_id[33];
	char rc_tracestate[REQCTX_STATE_MAX]; /* "" none */
	/* Spans (--enable-trace, trace.c): the request's span, its parent
	 * (the client's span, zero for a new trace), when it started. */
	bool rc_recording;
	uint8_t rc_trace_bin[16];
	uint8_t rc_span_bin[8];
	uint8_t rc_parent_bin[8];
	uint8_t rc_flags;
	uint64_t rc_start_ns;
	char rc_model[SHM_MODEL_MAX]; /* as routed, "" before */
	char rc_request_id[OTLP_STR_MAX]; /* recording only */
	LIST_ENTRY(reqctx) rc_link;
};

/*
 * The context of c's current request for hr, made on first call (zeroed,
 * in the request's memory, forgotten when the request ends). NULL when
 * out of memory.
 */
struct reqctx *reqctx_get(struct conn *c, const struct http_request *hr);
/* The context of a request in progress, NULL when it has none. */
const struct reqctx *reqctx_find(const struct http_request *hr);

/* ---------------------------------------------------------- auth.c */

/* What the router does with a request after auth_* decided. */
enum auth_verdict {
	AUTH_ALLOW = 0,
	AUTH_UNAUTHENTICATED, /* 401 */
	AUTH_FORBIDDEN, /* 403: authenticated, not admin */
};

/*
 * Loads the credentials of the configuration (keys kept as SHA-256
 * digests), and with --jwt-* the key set the poller shares in
 * RUN/jwks.json, watched for changes. Call once at startup.
 */
void auth_init(void);
void auth_shutdown(void);
/*
 * The data plane (inference, model listing): a credential is required
 * when --api-key or --tenant-api-key is set, and then any of the
 * gateway's credentials is accepted (--api-key, a tenant key, a
 * control-plane key, a valid JWT: the user role is enough). Fills rx
 * (principal, tenant) either way; why says what failed.
 */
enum auth_verdict auth_data_plane(const struct http_request *hr,
    struct reqctx *rx, char *why, size_t whylen);
/*
 * The control plane (worker API, /flush_cache, /get_loads): with
 * --control-plane-api-keys or --jwt-* an admin principal is required
 * (a JWT that fails verification is refused, never retried as a key);
 * otherwise --api-key when set; otherwise open. Writes the audit line
 * (one per request) unless --disable-audit-logging.
 */
enum auth_verdict auth_control_plane(const struct http_request *hr,
    const char *request_id, struct reqctx *rx, char *why, size_t whylen);
/* Verifications done and cache hits, for the measurement tests. */
void auth_jwt_counts(uint64_t *verified, uint64_t *cached);

/* ---------------------------------------------------------- tenant.c */

/*
 * Per-tenant request rates (--tenant-rate-limit-*), one GCRA bucket per
 * tenant in shared memory, so the limit holds across every frontend.
 * tenant_init loads the limits file (fatal when it cannot: an operator
 * who turned limits on must not run unlimited). tenant_take takes one
 * request from rx's tenant; false: over its limit, *retry_after_secs says
 * when to come back.
 */
void tenant_init(void);
bool tenant_take(const struct reqctx *rx, int *retry_after_secs);
/*
 * The rest of rx's tenant limits, once the request's model and prompt
 * tokens are known (before its first routing): the tenant's
 * tokens_per_minute and the model rule matching model (NULL: none), its
 * requests and tokens. All or nothing: refused, nothing stays taken,
 * the request taken by tenant_take included; why gets the message and
 * *retry_after_secs when to come back (0: never fits, more tokens than a
 * minute allows).
 */
bool tenant_charge(const struct reqctx *rx, const char *model, uint64_t tokens,
    int *retry_after_secs, char *why, size_t whylen);
/* The bounded metric label of a tenant key: itself if configured. */
const char *tenant_label(const char *tenant);

/* ---------------------------------------------------------- cors.c */

/*
 * --cors-allowed-origins ("*" lists every origin). cors_preflight answers
 * an OPTIONS preflight (204; the CORS headers only for a listed origin)
 * and returns true when hr is one. cors_lines returns the header lines
 * for the responses to hr (in c's request memory), NULL when its Origin
 * is not listed or absent.
 */
bool cors_preflight(struct conn *c, const struct http_request *hr,
    const char *request_id);
char *cors_lines(struct conn *c, const struct http_request *hr);

/* ---------------------------------------------------------- trace.c */

/*
 * With --enable-trace: this frontend's span exporter (OTLP/HTTP to
 * --otlp-traces-endpoint, shared/otlp.c). Without it, no-ops.
 */
void trace_init(void);
void trace_shutdown(void);
/*
 * W3C trace context: the client's traceparent (version 00, valid ids)
 * continued, else a new trace started; rx gets the traceparent sent to
 * workers (same trace id, the gateway's span as parent) and the client's
 * tracestate. With --enable-trace a sampled request (the client's flag,
 * or a trace started here) records its server span, ended with the
 * answered status when c's request ends.
 */
void trace_start(struct conn *c, const struct http_request *hr,
    struct reqctx *rx, const char *request_id);
/* Whether rx's request records spans (NULL: no). */
bool trace_recording(const struct reqctx *rx);
/*
 * A new span id of rx's trace, and the traceparent (REQCTX_TRACE_MAX)
 * that makes it the parent of a worker's spans.
 */
void trace_child(const struct reqctx *rx, uint8_t span_id[8],
    char *traceparent);
/*
 * Starts a span of rx's request in sp: span_id (NULL: a new one), the
 * request's span as parent, name, kind, started at start_ns (Unix ns).
 * The caller adds attributes (otlp_span_*) and hands it to
 * trace_span_end, which stamps the end and queues it for export
 * (dropped and counted when the queue is full; never blocks).
 */
void trace_span_begin(const struct reqctx *rx, struct otlp_span *sp,
    const uint8_t *span_id, const char *name, enum otlp_kind kind,
    uint64_t start_ns);
void trace_span_end(struct otlp_span *sp, bool error);

/* ---------------------------------------------------------- admission.c */

/* What an admitted request goes on to (the route's start function). */
typedef void (*admission_start_cb)(struct conn *c,
    const struct http_request *hr, enum extract_endpoint ep,
    const char *request_id);
/* Whether --max-concurrent-requests is on (> 0). */
bool admission_enabled(void);
/*
 * Admission control of one inference request (gateway.md §2.6, §5): start
 * runs now when a place is free (gateway-wide cap, rate token), or later
 * from the loop when the request reaches the head of this frontend's
 * queue and a place frees; otherwise the request is answered 429
 * admission_queue_full, or 503 admission_queue_timeout after
 * --queue-timeout-secs in the queue. hr must stay valid until the request
 * ends (it does: the connection reads nothing more meanwhile, and a
 * streamed body is paused while it waits). The place is given back when
 * the request ends, however it ends. Without the cap, start runs now.
 */
void admission_start(struct conn *c, const struct http_request *hr,
    enum extract_endpoint ep, const char *request_id, admission_start_cb start);
/* Stops the queue timer (shutdown). */
void admission_shutdown(void);

/* ---------------------------------------------------------- exchange.c */

#define EXCHANGE_MAX_LEGS 3

/* Why an attempt failed; exchange_next maps each to its status and code. */
enum exchange_failure {
	EXCHANGE_WORKER_STATUS = 0, /* an error status not relayed */
	EXCHANGE_NO_REQUEST, /* the upstream request could not start */
	EXCHANGE_CONNECT, /* no connection to the worker */
	EXCHANGE_SEND, /* the connection broke before a response */
	EXCHANGE_TIMEOUT, /* --request-timeout-secs */
	EXCHANGE_BAD_RESPONSE, /* not HTTP, or cut before the head ended */
	EXCHANGE_NO_MEMORY, /* the gateway's own failure */
	EXCHANGE_TOO_LARGE, /* a held response over --max-payload-size */
};

/* What the owner of an exchange (proxy.c, pd.c) is told. */
struct exchange_ops {
	/* Every leg has a worker: send each (exchange_dispatch). */
	void (*xo_routed)(void *arg);
	/* The request failed for good (every attempt used, or terminal):
	 * answer with this error; the exchange has ended every leg. */
	void (*xo_failed)(void *arg, int status, const char *code,
	    const char *message, int retry_after_secs);
	/* A retry is about to ask for new workers: drop what the failed
	 * attempt left (buffers, held heads). May be NULL. */
	void (*xo_reset)(void *arg);
};

/* One worker's part of an attempt: the whole request, or a PD leg. */
struct exchange_leg {
	struct exchange *xl_ex;
	unsigned xl_leg; /* Smg__Leg; 0 (LEG_SINGLE) outside PD */
	const char *xl_name; /* worker_type label: regular, prefill, ... */
	struct decide_item xl_di;
	struct decision xl_d;
	struct upstream_req *xl_up; /* owner clears it when on_done ran */
	bool xl_decided;
	bool xl_outcome_due; /* xl_d owes the broker its outcome */
	bool xl_inflight; /* counted in shm (exchange_dispatch) */
	bool xl_first_byte; /* a response body byte arrived */
	ev_tstamp xl_sent;
	ev_tstamp xl_ttfb; /* seconds to the first body byte */
	uint64_t xl_pending; /* prompt tokens counted in shm pending now */
	uint64_t xl_ahead; /* the worker's pending tokens at dispatch */
	/* Stream: first-byte, then idle deadline. Not streamed: when the
	 * prompt should have been prefilled (live load). */
	ev_timer xl_timer;
	bool xl_paused; /* reading its response is paused */
	bool xl_client_paused; /* ... because the client lags */
	uint32_t xl_exclude[FE_MAX_EXCLUDE];
	size_t xl_nexclude;
	/* The attempt's span (trace.c): the worker's parent. */
	uint8_t xl_span_id[8];
	char xl_traceparent[REQCTX_TRACE_MAX]; /* "" none: the request's */
	uint64_t xl_start_ns;
};

/*
 * A request's life upstream (nginx's ngx_http_upstream_t in spirit): its
 * decisions, attempts, exclusions, in-flight counts, outcomes and timings,
 * for the single and the PD path alike. It lives in the request's memory
 * (conn_alloc) and registers its own end hook, so the in-flight counts
 * and the broker's outcomes are settled however the request ends.
 *
 * Flow: exchange_route asks for a worker per leg; xo_routed dispatches;
 * a failed attempt goes to exchange_next, which decides retry (back off,
 * route again with the failed worker excluded) or xo_failed; a relayed
 * response ends with exchange_finish.
 */
struct exchange {
	struct conn *ex_conn;
	const struct extract_inputs *ex_in;
	const struct exchange_ops *ex_ops;
	void *ex_arg;
	const char *ex_backend; /* "regular" or "pd" (metric label) */
	enum extract_endpoint ex_ep;
	struct backoff_policy ex_rp;
	unsigned ex_attempt; /* 0-based */
	unsigned ex_nlegs;
	unsigned ex_undecided;
	bool ex_fixed; /* one given worker: no routing, no retry */
	bool ex_relayed; /* a byte went to the client: no retry */
	bool ex_streaming; /* the client asked for SSE (metric label) */
	bool ex_ended; /* counted in the router series */
	uint64_t ex_prompt_tokens; /* estimated, for live load */
	char ex_model[SHM_MODEL_MAX]; /* metric label */
	ev_tstamp ex_start;
	struct reqctx *ex_rx; /* trace context, NULL none */
	uint64_t ex_route_ns; /* the routing decision's span start */
	ev_timer ex_backoff;
	struct exchange_leg ex_legs[EXCHANGE_MAX_LEGS];
};

/*
 * Allocates an exchange in c's request memory with nlegs legs (leg i of
 * Smg__Leg legs[i], label names[i]) and the retry flags; NULL when out of
 * memory. in must outlive the request.
 */
struct exchange *exchange_new(struct conn *c, const struct extract_inputs *in,
    enum extract_endpoint ep, const char *backend, unsigned nlegs,
    const unsigned *legs, const char *const *names,
    const struct exchange_ops *ops, void *arg);
/* One given worker (gateway-local relays): no decision, no retry. */
void exchange_fix(struct exchange *ex, unsigned slot,
    const struct shm_worker *w);
/*
 * The tenant's token and model-rule limits (tenant_charge) for the
 * request's model and ex_prompt_tokens, before the first exchange_route:
 * 0, or -1 when refused: answered 429 tenant_rate_limited, and the
 * caller returns without touching the request.
 */
int exchange_admit(struct exchange *ex);
/* Asks for a worker for every leg (one batch); xo_routed or a retry or
 * xo_failed follows, never inside this call. */
void exchange_route(struct exchange *ex);
/*
 * Leg i's upstream request has been started (up), or could not be (NULL:
 * the attempt fails through exchange_next, and -1 is returned, after
 * which the caller must not touch the request). The only place that
 * counts a request in flight. Returns 0.
 */
int exchange_dispatch(struct exchange *ex, unsigned i, struct upstream_req *up);
/* The first response body byte of leg i arrived (live load, TTFB). */
void exchange_first_byte(struct exchange *ex, unsigned i);
/*
 * Stops / resumes reading leg i's response (upstream_pause/resume). While
 * paused the worker's stream deadlines do not run; a pause for the
 * client's back-pressure (client true) has a deadline of its own
 * (--stream-idle-timeout-secs): a client that stops reading that long
 * ends the request, with no breaker sample (not the worker's fault).
 */
void exchange_pause(struct exchange *ex, unsigned i, bool client);
void exchange_resume(struct exchange *ex, unsigned i);
/*
 * More of leg i's body arrived (restarts a stream's idle deadline). A
 * stream (the client asked for SSE) whose first byte does not come within
 * --stream-first-byte-timeout-secs, or that then stays silent for
 * --stream-idle-timeout-secs, fails: retried as a 504 before anything
 * was relayed, cut after.
 */
void exchange_progress(struct exchange *ex, unsigned i);
/*
 * Whether an attempt failing now with status (a worker status, or the
 * gateway's for a failure) would be tried again.
 */
bool exchange_can_retry(const struct exchange *ex, int status);
/*
 * Leg i's attempt failed before anything reached the client (the owner
 * already dropped its upstream request, or leaves it to be cancelled
 * here). The only place that maps a failure to the answer: every leg's
 * attempt ends (outcomes, in-flight), then a retry is scheduled or
 * xo_failed runs. worker_status and worker_message (may be NULL) describe
 * EXCHANGE_WORKER_STATUS. The caller must return without touching the
 * request: it may have ended.
 */
void exchange_next(struct exchange *ex, unsigned i, enum exchange_failure f,
    int worker_status, const char *worker_message);
/* The failure of an upstream request that ended before its head. */
enum exchange_failure exchange_failure_of(enum upstream_error err);
/*
 * The response (status as relayed) is complete, or was cut after bytes
 * went out (ok false): every leg ends with that status, the router series
 * counts the request. The owner then ends the connection's request.
 */
void exchange_finish(struct exchange *ex, int status, bool ok);
/*
 * The request ends without an answer from the workers (shed, refused
 * before routing, body stalled): answers status/code/message and ends
 * every leg without a breaker sample.
 */
void exchange_fail(struct exchange *ex, int status, const char *code,
    const char *message, int retry_after_secs);
/*
 * Ends leg i's attempt: the only place that releases its in-flight count
 * and live load, and that sends the broker its outcome (none when
 * no_sample: only the key's in-flight ends). Idempotent.
 */
void exchange_end(struct exchange *ex, unsigned i, int status, bool transport,
    bool no_sample);

/* ---------------------------------------------------------- stats.c */

/*
 * Metric series of this process, registered on first use and cached
 * locally (no scan of the shm table per request). labels may be "".
 */
void stats_init(void);
void stats_add(const char *family, const char *labels, int64_t delta);
void stats_observe(const char *family, const char *labels, double seconds);
/*
 * The router's request series (gateway.md §13) for one finished request of
 * backend_type `backend` ("regular", "pd"): smg_router_requests_total, and
 * the duration histogram when ok. stats_router_error counts a gateway
 * error in smg_router_request_errors_total.
 */
void stats_router_request(const char *backend, const char *model,
    const char *endpoint, bool streaming, bool ok, double seconds);
void stats_router_error(const char *backend, const char *model,
    const char *endpoint, const char *error_type);
/* Metric labels of a request (bounded sets, static strings). */
const char *stats_method_label(const struct http_request *hr);
const char *stats_path_label(const char *path);
/*
 * One answered request: smg_http_responses_total{path,status_code,
 * error_code} (error_code: the gateway's, "" for a relayed answer), and
 * smg_http_request_duration_seconds{method,path} unless seconds < 0.
 */
void stats_http_response(const char *method, const char *path, int status,
    const char *error_code, double seconds);
/* Sets this process's value of a gauge (summed over the processes). */
void stats_gauge_set(const char *family, const char *labels, int64_t value);
/*
 * smg_worker_errors_total{worker_type,connection_mode,error_type} for a
 * failed attempt on the worker of (slot, generation): error_type timeout
 * (408, 504) or backend_error.
 */
void stats_worker_error(unsigned slot, uint32_t generation, int status,
    bool transport_error);

/* ---------------------------------------------------------- proxy.c */

/* Starts the inference path for a complete request on route ep. */
void proxy_start(struct conn *c, const struct http_request *hr,
    enum extract_endpoint ep, const char *request_id);
/*
 * Whether the body of the request whose head is hr is to be streamed to
 * the worker unparsed (gateway.md §6.4): a route with a typed JSON body,
 * a declared Content-Length over --max-buffered-request-bytes (0: never),
 * no policy that needs the text (unless routing tokens or, with the sticky
 * override, a routing key come in headers), no body rewrite (PD, EPD,
 * DP-aware) and a single router (not IGW). proxy_start then routes it on
 * its headers alone and never retries it.
 */
bool proxy_stream_wanted(const struct http_request *hr);
/* Relays method+path of hr to one given worker (no retries). */
void proxy_fixed(struct conn *c, const struct http_request *hr,
    const struct shm_worker *w, unsigned slot, const char *request_id);

/* ---------------------------------------------------------- pd.c */

/* Whether the gateway runs in PD or EPD mode (--pd/--epd-disaggregation). */
bool pd_enabled(void);
/*
 * The PD/EPD inference path of gateway.md §11 for a complete request on
 * route ep: one decision per leg in one batch, the bootstrap fields added,
 * every leg sent at once, the decode response relayed once the other legs
 * answered 2xx; a failing leg aborts the others; retries wrap the whole.
 */
void pd_start(struct conn *c, const struct http_request *hr,
    enum extract_endpoint ep, const char *request_id);
/*
 * GET /health_generate in PD/EPD mode: a prefill/decode pair chosen by the
 * leg policies, both probed in parallel within --health-check-timeout-secs;
 * 200 when both answer 2xx, else 503 health_generate_failed (no pair: 503
 * no_healthy_worker_pair).
 */
void pd_health_generate(struct conn *c, const struct http_request *hr,
    const char *request_id);
/* The host of a worker URL (no scheme, port, path or DP suffix); -1. */
int pd_bootstrap_host(const char *url, char *out, size_t len);
/* A random bootstrap room in [0, 2^63 - 1]. */
uint64_t pd_room(void);
/*
 * Sets <prefix>bootstrap_host (string), <prefix>bootstrap_port (integer,
 * null when port < 0) and, when rooms is not NULL, <prefix>bootstrap_room
 * (exact integers) in body; with batch each is an array of n entries
 * (rooms[0..n)), else single values (rooms[0]). Returns 0, or -1 (body not
 * an object, n 0, out of memory).
 */
int pd_inject(cJSON *body, const char *host, long port, const uint64_t *rooms,
    unsigned n, bool batch, const char *prefix);
/*
 * Sets member name of body to the integer rank (replacing one the client
 * sent): the one writer of DP rank fields, data_parallel_rank on the
 * regular path (proxy.c) and routed_dp_rank / disagg_prefill_dp_rank on
 * PD legs. Worker URLs name ranks as "<url>@<rank>" (url_rank). Returns
 * 0, or -1 (body not an object, rank < 0, out of memory).
 */
int pd_rank_field(cJSON *body, const char *name, int rank);
/*
 * return_logprob merging (gateway.md §11.5). pd_prefill_logprobs parses a
 * prefill body: a JSON object or array as is, or SSE: its first event
 * whose meta_info holds an input_token_logprobs list. NULL when there is
 * none; the caller frees the result with cJSON_Delete.
 */
cJSON *pd_prefill_logprobs(const char *body, size_t len);
/*
 * Puts the prefill's meta_info.input_token_logprobs entries in front of
 * the decode's: two objects, or two arrays of the same size element by
 * element; only where both lists exist. Returns 1 when something merged, 0
 * when nothing did, -1 out of memory (decode may be partly merged).
 */
int pd_merge_logprobs(cJSON *decode, const cJSON *prefill);
/* Length of the first complete SSE event in p (blank-line ended), or 0. */
size_t pd_sse_event_len(const char *p, size_t len);
/*
 * One SSE event (a single "data:" line of JSON) merged with the prefill's
 * list: a new "data: ...\n\n" (malloc'd, length in *outlen), or NULL when
 * the event is left as it is.
 */
char *pd_merge_event(const char *ev, size_t len, const cJSON *prefill,
    size_t *outlen);

/* ---------------------------------------------------------- router.c */

/* The connection's routes: one complete request read on a connection of
 * that kind goes to the module owning its route. */
extern const struct conn_routes router_routes;

/* ---------------------------------------------------------- endpoints.c */

/* The gateway's own routes; each answers and ends the request. */
void endpoint_readiness(struct conn *c, const char *request_id);
void endpoint_models(struct conn *c, const char *request_id);
/* /get_model_info, /get_server_info, /health_generate outside PD. */
void endpoint_first_ready(struct conn *c, const struct http_request *hr,
    const char *request_id);
void endpoint_metrics(struct conn *c);

/* ---------------------------------------------------------- fanout.c */

enum fanout_kind {
	FANOUT_FLUSH = 0, /* POST /flush_cache */
	FANOUT_LOADS, /* GET /get_loads */
	FANOUT_ENGINE_METRICS, /* GET /engine_metrics */
	FANOUT_START_PROFILE, /* POST /start_profile */
	FANOUT_STOP_PROFILE, /* POST /stop_profile */
};

/* Asks every worker at once and answers with the combined result. */
void fanout_start(struct conn *c, const struct http_request *hr,
    enum fanout_kind kind, const char *request_id);

/* ---------------------------------------------------------- workerapi.c */

/* /workers and /workers/{id} (gateway.md §3.3), through the broker. */
void workerapi_start(struct conn *c, const struct http_request *hr,
    const char *request_id);

#endif /* FRONTEND_FRONTEND_H */
