/*
 * simworker.h: private interfaces of smg-simworker, the simulated LLM engine
 * (SGLang/vLLM HTTP surface, paged prefix cache, batch scheduler, ZMQ KV
 * events) used by the system tests and benchmarks of the gateway.
 *
 * Everything runs on the one libev default loop; nothing here is
 * thread-safe and nothing blocks.
 */
#ifndef TESTS_SIMWORKER_SIMWORKER_H
#define TESTS_SIMWORKER_SIMWORKER_H

#include <stddef.h>
#include <stdint.h>

#include <ev.h>
#include <msgpack.h>

/* cache.c */

/* One cache change, as published on the KV-event stream. */
enum kv_event_kind {
	KV_EVENT_STORED = 0,
	KV_EVENT_REMOVED,
	KV_EVENT_CLEARED,
};

struct kv_event {
	enum kv_event_kind ke_kind;
	int64_t ke_hash; /* STORED, REMOVED */
	int64_t ke_parent; /* STORED, when ke_has_parent */
	int ke_has_parent; /* 0: first page of a sequence */
	const uint32_t *ke_tokens; /* STORED: ke_block_size token ids */
	uint32_t ke_block_size;
};

/* Called for every page stored or evicted and for a flush; ev is only valid
 * during the call. */
typedef void (*cache_event_cb)(void *arg, const struct kv_event *ev);

struct cache;
struct cache_page;

/*
 * A paged prefix cache. A page holds page_size tokens and is keyed by a
 * position-aware hash of (parent page hash, its tokens), so equal prefixes
 * give equal pages. Pages locked by a request are never evicted; unlocked
 * pages are evicted least recently used first, deepest page of a chain
 * before its parent. Besides pages, requests reserve tokens (uncached
 * prompt and output); pages + reservations never exceed the capacity.
 * cache_new() fatals on a bad size (startup only).
 */
struct cache *cache_new(uint32_t page_size, uint64_t capacity_tokens);
void cache_free(struct cache *c); /* NULL is a no-op */
void cache_set_listener(struct cache *c, cache_event_cb cb, void *arg);
uint32_t cache_page_size(const struct cache *c);
/*
 * Counts the leading pages of tokens[0 .. max_pages*page_size) already
 * cached. With pages non-NULL, also locks them and stores them in pages[].
 */
uint32_t cache_match(struct cache *c, const uint32_t *tokens,
    uint32_t max_pages, struct cache_page **pages);
/* Reserves n tokens, evicting unlocked pages as needed; -1 if it cannot. */
int cache_reserve(struct cache *c, uint64_t n);
void cache_unreserve(struct cache *c, uint64_t n);
/*
 * Puts pages [from, to) of tokens into the cache and locks them; pages[0 ..
 * from) must be the locked pages before them. Each page consumes page_size
 * tokens of the caller's reservation.
 */
void cache_insert(struct cache *c, const uint32_t *tokens, uint32_t from,
    uint32_t to, struct cache_page **pages);
/* Unlocks pages[0 .. n) (one chain from the root), marking them used now. */
void cache_unlock(struct cache *c, struct cache_page **pages, uint32_t n);
/* Drops every page; -1 (nothing done) while a page is locked or reserved. */
int cache_flush(struct cache *c);
uint64_t cache_capacity(const struct cache *c);
uint64_t cache_cached_tokens(const struct cache *c); /* all pages */
uint64_t cache_used_tokens(const struct cache *c); /* locked + reserved */
int64_t cache_page_hash(const struct cache_page *p); /* for tests */

/* engine.c */

struct engine_params {
	uint32_t ep_max_running;
	double ep_prefill_tps;
	double ep_decode_base_ms;
	double ep_decode_per_req_ms;
	double ep_time_scale; /* delays divided by it; 0: no delays */
	/* Uncached prompt tokens one step admits (SGLang's max_prefill_tokens);
	 * the first request of a step always goes in. 0: no limit. */
	uint64_t ep_max_prefill_tokens;
};

/* What a request reports while running and when done. */
struct engine_info {
	uint32_t ei_prompt_tokens;
	uint32_t ei_cached_tokens;
	uint32_t ei_output_tokens; /* generated so far */
	uint32_t ei_max_tokens;
	double ei_arrival; /* ev_now() */
	double ei_first_token; /* 0 until the first token */
};

/*
 * A token was generated (info->ei_output_tokens counts it). Returning -1
 * drops the request: no done_cb, the engine frees it.
 */
typedef int (*engine_token_cb)(void *arg, const struct engine_info *info);
/* The request is complete; the engine frees it after this call. */
typedef void (*engine_done_cb)(void *arg, const struct engine_info *info);

struct engine_stats {
	uint32_t es_running; /* admitted, including held ones */
	uint32_t es_waiting;
	uint64_t es_waiting_uncached; /* prompt tokens not cached at arrival */
	uint64_t es_used_tokens;
	uint64_t es_capacity_tokens;
	double
	    es_gen_throughput; /* tokens/s while decoding, last second or so */
	uint64_t es_prompt_tokens; /* totals since start */
	uint64_t es_cached_tokens;
	uint64_t es_output_tokens;
};

struct engine;
struct engine_req;

/* The engine uses c (not owned) and calls hook(arg) after every step. */
struct engine *engine_new(struct ev_loop *loop, const struct engine_params *p,
    struct cache *c, void (*step_hook)(void *), void *hook_arg);
/* Cancels every request without callbacks; NULL is a no-op. */
void engine_free(struct engine *e);
/*
 * Queues a request of n prompt tokens (tokens taken: freed by the engine)
 * generating max_tokens (>= 1). After the last token the request stays in
 * the running batch for hold seconds of model time before done_cb.
 */
struct engine_req *engine_submit(struct engine *e, uint32_t *tokens, uint32_t n,
    uint32_t max_tokens, double hold, engine_token_cb token_cb,
    engine_done_cb done_cb, void *arg);
/* Removes a request in any state, without callbacks. */
void engine_cancel(struct engine *e, struct engine_req *r);
void engine_get_stats(const struct engine *e, struct engine_stats *out);
/* Leading prompt tokens that would be cached now (no side effect). */
uint32_t engine_cached_estimate(struct engine *e, const uint32_t *tokens,
    uint32_t n);
/* Flushes the prefix cache; -1 while requests are queued or running. */
int engine_flush(struct engine *e);
/* Seconds of real time for d seconds of model time; < 0: none. */
double engine_scale(const struct engine *e, double d);

/* kvevents.c */

enum kvev_format {
	KVEV_FORMAT_ARRAY = 0, /* SGLang: array_like structs */
	KVEV_FORMAT_MAP, /* vLLM: maps with a "type" tag */
};

struct kvevents;

/* Encodes one batch of n events into buf (appended); 0 or -1. */
int kvevents_encode(msgpack_sbuffer *buf, double ts, const struct kv_event *ev,
    size_t n, enum kvev_format fmt);
/* Binds a ZMQ PUB socket at endpoint; NULL (logged) on failure. */
struct kvevents *kvevents_new(const char *endpoint, const char *topic,
    enum kvev_format fmt);
void kvevents_free(struct kvevents *k); /* NULL is a no-op */
/* Copies ev into the pending batch; matches cache_event_cb. */
void kvevents_add(void *k, const struct kv_event *ev);
/* Publishes the pending batch, if any, as [topic, seq BE64, payload]. */
void kvevents_flush(struct kvevents *k);
uint64_t kvevents_seq(const struct kvevents *k); /* next sequence number */

/* rpcsrv.c */

struct engine;

struct rpcsrv_config {
	const char *rc_host;
	int rc_port; /* 0: any */
	const char *rc_tls_cert; /* NULL: h2c */
	const char *rc_tls_key;
	const char *rc_fault; /* "", "unavailable", "slow" or "reset" */
	int rc_kv_events; /* 0: SubscribeKvEvents is UNIMPLEMENTED */
	struct engine *rc_engine; /* not owned */
	int rc_engine_kind; /* enum sim_engine_kind */
	uint32_t rc_max_running;
	double rc_ready_at; /* ev_now() before which HealthCheck says no */
};

struct rpcsrv;

/* Listens (TLS with ALPN h2 when a certificate is given); NULL (logged)
 * on failure. */
struct rpcsrv *rpcsrv_new(struct ev_loop *loop,
    const struct rpcsrv_config *cfg);
/* Closes the listener and every connection; NULL is a no-op. */
void rpcsrv_free(struct rpcsrv *r);
int rpcsrv_port(const struct rpcsrv *r);
/* Queues a cache event for the subscribers (cache_event_cb). */
void rpcsrv_add_event(void *r, const struct kv_event *ev);
/* Sends the queued events as one KvEventBatch to every subscriber; done
 * by itself once per loop turn. NULL is a no-op. */
void rpcsrv_flush(struct rpcsrv *r);

/* server.c */

/* A parsed request; valid during the request callback only. */
struct srv_request {
	const char *sr_method; /* "GET", "POST", ... */
	const char *sr_path; /* without the query */
	const char *sr_query; /* "" when none */
	const char *sr_routing_key; /* x-smg-routing-key or NULL */
	const char *sr_request_id; /* x-request-id or NULL */
	const char *sr_body; /* NUL-terminated */
	size_t sr_body_len;
};

struct srv;
struct srv_conn;

/*
 * A request arrived on conn. The callee answers now or later with exactly
 * one srv_respond(), srv_stream_begin() ... srv_stream_end(), or
 * srv_drop(); until then no further request of the connection is read.
 */
typedef void (*srv_request_cb)(void *arg, struct srv_conn *conn,
    const struct srv_request *req);
/* The connection of a request not yet answered is gone; ctx is what the
 * callee set with srv_set_ctx(). conn must not be used any more. */
typedef void (*srv_abort_cb)(void *arg, void *ctx);

/* Listens on host:port (0: any); NULL (logged) on failure. */
struct srv *srv_new(struct ev_loop *loop, const char *host, int port,
    srv_request_cb req_cb, srv_abort_cb abort_cb, void *arg);
/* Closes the listener and every connection, aborting pending requests. */
void srv_free(struct srv *s);
int srv_port(const struct srv *s);
void srv_set_ctx(struct srv_conn *conn, void *ctx);
/* extra: more header lines, each ending in "\r\n" ("" for none). */
void srv_respond(struct srv_conn *conn, int status, const char *ctype,
    const char *extra, const char *body, size_t len);
void srv_stream_begin(struct srv_conn *conn, int status, const char *ctype,
    const char *extra);
void srv_stream_write(struct srv_conn *conn, const char *data, size_t len);
void srv_stream_end(struct srv_conn *conn);
/* Closes the connection once what was written is sent; the request ends
 * without its abort callback. */
void srv_drop(struct srv_conn *conn);
/* Raw bytes (a head without its body); for srv_drop() faults only. */
void srv_write_raw(struct srv_conn *conn, const char *data, size_t len);

/* stats.c */

enum stats_route {
	STATS_ROUTE_GENERATE = 0,
	STATS_ROUTE_COMPLETIONS,
	STATS_ROUTE_CHAT,
	STATS_ROUTE_COUNT,
};

struct stats;

struct stats *stats_new(void);
void stats_free(struct stats *s);
void stats_reset(struct stats *s);
void stats_count_route(struct stats *s, enum stats_route r);
/* fault: "failed", "hung", "closed" or "rejected" */
void stats_count_fault(struct stats *s, const char *fault);
/* A completed request; times in milliseconds. */
void stats_record(struct stats *s, uint32_t prompt, uint32_t cached,
    double ttft_ms, double e2e_ms);
/* Adds the totals and percentiles as members of obj (a cJSON object). */
struct cJSON;
void stats_to_json(const struct stats *s, struct cJSON *obj);

/* pd.c */

/* --role: what the worker is in a PD/EPD deployment (workers.md §1). */
enum sim_role {
	SIM_ROLE_REGULAR = 0,
	SIM_ROLE_PREFILL,
	SIM_ROLE_DECODE,
	SIM_ROLE_ENCODE,
};

#define PDSIM_KEY_MAX 256

struct pdsim;
struct pdsim_req;
typedef void (*pdsim_cb)(void *arg, int ok);

/* The rendezvous of one request; embedded in it, filled by pdsim_parse. */
struct pdsim_req {
	struct pdsim *pq_sim;
	int pq_has; /* the body carried a bootstrap_room */
	char pq_wait[PDSIM_KEY_MAX]; /* room to wait for, "" none */
	char pq_pub[PDSIM_KEY_MAX]; /* room to publish when done, "" none */
	int pq_waiting;
	double pq_deadline;
	ev_timer pq_poll;
	pdsim_cb pq_cb;
	void *pq_arg;
};

const char *pdsim_role_name(enum sim_role r);
/* "regular", "prefill", "decode", "encode": 0 and *out, or -1. */
int pdsim_role_parse(const char *s, enum sim_role *out);
/*
 * host and bootstrap_port (-1 none) are this worker's identity as a
 * bootstrap peer; dir is the rendezvous directory shared by the workers
 * (NULL: rooms are recorded but nobody waits); timeout in real seconds.
 */
struct pdsim *pdsim_new(struct ev_loop *loop, enum sim_role role,
    const char *host, long bootstrap_port, const char *dir, double timeout);
void pdsim_free(struct pdsim *ps); /* NULL is a no-op */
enum sim_role pdsim_role(const struct pdsim *ps);
/*
 * Reads the bootstrap fields of a request (raw is the body text, for the
 * exact room) into q: decode waits for <bootstrap_host>_<port>_<room>;
 * prefill waits for <encode_bootstrap_host>_<port>_<room> when given, and
 * prefill and encode publish <own host>_<own port>_<room> when done.
 * Returns 0, or -1 when a decode request lacks usable bootstrap fields.
 */
int pdsim_parse(struct pdsim *ps, const char *raw, size_t rawlen,
    const struct cJSON *body, struct pdsim_req *q);
/*
 * Starts waiting when q names a room: returns 1 and calls cb(arg, ok)
 * later (ok 0 on timeout); returns 0 (no callback) when there is nothing
 * to wait for.
 */
int pdsim_wait(struct pdsim_req *q, pdsim_cb cb, void *arg);
/* Stops a wait without its callback (the client went away). */
void pdsim_cancel(struct pdsim_req *q);
/* The request is done: its room is ready for its partner. */
void pdsim_publish(struct pdsim_req *q);
/* Adds "role" and "bootstrap" (counters, last rooms) to obj. */
void pdsim_stats_json(const struct pdsim *ps, struct cJSON *obj);

/* api.c */

enum sim_engine_kind {
	SIM_ENGINE_SGLANG = 0,
	SIM_ENGINE_VLLM,
};

/* Data-parallel ranks a simulated engine reports at most (--dp-size). */
#define SIM_DP_MAX 64

struct api_config {
	const char *ac_model;
	const char *ac_worker_id;
	enum sim_engine_kind ac_engine;
	int ac_no_loads;
	uint32_t ac_dp_size; /* data-parallel ranks reported, >= 1 */
	int ac_strict_model; /* 404 to a request naming another model */
	uint32_t ac_context_length;
	uint32_t ac_max_running;
	uint32_t ac_page_size;
	double ac_fail_rate;
	double ac_hang_rate;
	double ac_close_rate;
	int ac_fail_status;
	double ac_ready_at; /* ev_now() before which everything answers 503 */
	uint64_t ac_seed;
	double ac_time_scale;
	/* PD/EPD role and the bootstrap rendezvous (pd.c). */
	enum sim_role ac_role;
	const char *ac_host;
	long ac_bootstrap_port; /* -1 none */
	const char *ac_bootstrap_dir;
	double ac_bootstrap_timeout;
	/* KV-event publisher, shown as SGLang's kv_events_config; NULL none */
	const char *ac_kv_endpoint;
	const char *ac_kv_topic;
};

struct api;

/* Takes nothing; e, st must outlive the api. */
struct api *api_new(struct ev_loop *loop, const struct api_config *cfg,
    struct engine *e, struct stats *st);
void api_free(struct api *a);
/* srv callbacks; arg is the struct api. */
void api_request(void *arg, struct srv_conn *conn,
    const struct srv_request *req);
void api_abort(void *arg, void *ctx);

#endif /* TESTS_SIMWORKER_SIMWORKER_H */
