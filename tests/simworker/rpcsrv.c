/*
 * rpcsrv.c: the simulated engine's gRPC surface (workers.md §4): the
 * routing-side RPCs of the engine's service (SglangScheduler or
 * VllmEngine) over HTTP/2 with nghttp2, h2c or TLS with ALPN h2.
 *
 * HealthCheck answers healthy (not while --start-delay lasts); GetLoads
 * reports the engine's real queue and KV usage as /v1/loads does;
 * FlushCache (SGLang only) flushes the prefix cache; SubscribeKvEvents
 * streams the cache's events, one KvEventBatch per engine step with a
 * publisher-wide sequence number (live only, no replay, as the bridges).
 * Any other service or method answers UNIMPLEMENTED.
 *
 * Faults (--grpc-fault): "unavailable" answers every call UNAVAILABLE,
 * "slow" holds every unary answer for RPCSRV_SLOW_SECS, "reset" resets
 * every stream (RST_STREAM INTERNAL_ERROR).
 */
#define _GNU_SOURCE /* accept4 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

#include "sglang_scheduler.pb-c.h"
#include "shared/grpc.h"
#include "shared/log.h"
#include "shared/tls.h"
#include "shared/xmalloc.h"
#include "tests/simworker/simworker.h"

#define RPCSRV_READ_CHUNK 16384
#define RPCSRV_SLOW_SECS  30.0
#define RPCSRV_MAX_MSG    (1024 * 1024)

struct rpcsrv_conn;

struct rpcsrv_stream {
	struct rpcsrv_conn *st_conn;
	int32_t st_id;
	char st_path[160];
	struct grpc_reader st_reader;
	uint8_t *st_req; /* the request message */
	size_t st_req_len;
	bool st_have_req;
	uint8_t *st_out; /* framed response messages not yet sent */
	size_t st_out_len;
	size_t st_out_off;
	bool st_responding; /* headers submitted */
	bool st_finishing; /* trailers follow the queued bytes */
	int st_status;
	char st_message[GRPC_MESSAGE_MAX];
	bool st_subscribed;
	ev_timer st_timer; /* slow fault */
	TAILQ_ENTRY(rpcsrv_stream) st_subs;
	TAILQ_ENTRY(rpcsrv_stream) st_link;
};

struct rpcsrv_conn {
	struct rpcsrv *c_srv;
	int c_fd;
	ev_io c_io;
	struct tls_conn *c_tls;
	bool c_handshaken;
	nghttp2_session *c_sess;
	uint8_t *c_wbuf;
	size_t c_wlen;
	size_t c_woff;
	bool c_dead;
	TAILQ_HEAD(, rpcsrv_stream) c_streams;
	TAILQ_ENTRY(rpcsrv_conn) c_link;
};

struct rpcsrv {
	struct ev_loop *r_loop;
	struct rpcsrv_config r_cfg;
	struct tls_ctx *r_tls;
	int r_fd;
	int r_port;
	ev_io r_accept;
	ev_timer r_batch; /* publishes the events of one loop turn */
	const char *r_service;
	uint64_t r_seq; /* next batch number */
	uint64_t r_event_id;
	Smg__Grpc__Common__KvCacheEvent **r_pending;
	size_t r_npending;
	size_t r_cap;
	TAILQ_HEAD(, rpcsrv_conn) r_conns;
	TAILQ_HEAD(, rpcsrv_stream) r_subs;
};

static void rpcsrv_accept_cb(struct ev_loop *, ev_io *, int);
static void rpcsrv_io_cb(struct ev_loop *, ev_io *, int);
static void rpcsrv_pump(struct rpcsrv_conn *);
static void rpcsrv_conn_free(struct rpcsrv_conn *);
static void rpcsrv_dispatch(struct rpcsrv_stream *);
static void rpcsrv_slow_cb(struct ev_loop *, ev_timer *, int);
static void rpcsrv_stream_free(struct rpcsrv_stream *);

/* ------------------------------------------------------------ responses */

static ssize_t
rpcsrv_read_cb(nghttp2_session *sess, int32_t id, uint8_t *buf, size_t length,
    uint32_t *flags, nghttp2_data_source *src, void *user)
{
	struct rpcsrv_stream *st = src->ptr;
	char status[16], msg[GRPC_MESSAGE_MAX * 3];
	nghttp2_nv tr[2];
	size_t n;

	(void)user;
	n = st->st_out_len - st->st_out_off;
	if (n > length)
		n = length;
	if (n > 0) {
		memcpy(buf, st->st_out + st->st_out_off, n);
		st->st_out_off += n;
		if (st->st_out_off == st->st_out_len)
			st->st_out_off = st->st_out_len = 0;
		return (ssize_t)n;
	}
	if (!st->st_finishing)
		return NGHTTP2_ERR_DEFERRED;
	*flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
	snprintf(status, sizeof(status), "%d", st->st_status);
	grpc_message_encode(st->st_message, msg, sizeof(msg));
	tr[0] = (nghttp2_nv) { (uint8_t *)"grpc-status", (uint8_t *)status, 11,
		strlen(status), NGHTTP2_NV_FLAG_NONE };
	tr[1] = (nghttp2_nv) { (uint8_t *)"grpc-message", (uint8_t *)msg, 12,
		strlen(msg), NGHTTP2_NV_FLAG_NONE };
	(void)nghttp2_submit_trailer(sess, id, tr, msg[0] ? 2 : 1);
	return 0;
}

/* Starts the response (headers, then the queued messages). */
static void
rpcsrv_respond(struct rpcsrv_stream *st)
{
	nghttp2_data_provider prd;
	nghttp2_nv nv[2] = {
		{ (uint8_t *)":status", (uint8_t *)"200", 7, 3,
		    NGHTTP2_NV_FLAG_NONE },
		{ (uint8_t *)"content-type", (uint8_t *)"application/grpc", 12,
		    16, NGHTTP2_NV_FLAG_NONE },
	};

	if (st->st_responding) {
		(void)nghttp2_session_resume_data(st->st_conn->c_sess,
		    st->st_id);
		return;
	}
	st->st_responding = true;
	prd.source.ptr = st;
	prd.read_callback = rpcsrv_read_cb;
	(void)nghttp2_submit_response(st->st_conn->c_sess, st->st_id, nv, 2,
	    &prd);
}

static void
rpcsrv_queue(struct rpcsrv_stream *st, const ProtobufCMessage *m)
{
	size_t len = protobuf_c_message_get_packed_size(m);

	st->st_out = xreallocarray(st->st_out,
	    st->st_out_len + GRPC_PREFIX_LEN + len, 1);
	grpc_frame_prefix(st->st_out + st->st_out_len, (uint32_t)len);
	protobuf_c_message_pack(m,
	    st->st_out + st->st_out_len + GRPC_PREFIX_LEN);
	st->st_out_len += GRPC_PREFIX_LEN + len;
}

/* Ends the call with status after what is queued; an error before any
 * message is a trailers-only response, as gRPC servers send. */
static void
rpcsrv_finish(struct rpcsrv_stream *st, int status, const char *msg)
{
	char code[16], enc[GRPC_MESSAGE_MAX * 3];
	nghttp2_nv nv[4];

	st->st_finishing = true;
	st->st_status = status;
	snprintf(st->st_message, sizeof(st->st_message), "%s", msg);
	if (st->st_responding || st->st_out_len > 0) {
		rpcsrv_respond(st);
		return;
	}
	st->st_responding = true;
	snprintf(code, sizeof(code), "%d", status);
	grpc_message_encode(msg, enc, sizeof(enc));
	nv[0] = (nghttp2_nv) { (uint8_t *)":status", (uint8_t *)"200", 7, 3,
		NGHTTP2_NV_FLAG_NONE };
	nv[1] = (nghttp2_nv) { (uint8_t *)"content-type",
		(uint8_t *)"application/grpc", 12, 16, NGHTTP2_NV_FLAG_NONE };
	nv[2] = (nghttp2_nv) { (uint8_t *)"grpc-status", (uint8_t *)code, 11,
		strlen(code), NGHTTP2_NV_FLAG_NONE };
	nv[3] = (nghttp2_nv) { (uint8_t *)"grpc-message", (uint8_t *)enc, 12,
		strlen(enc), NGHTTP2_NV_FLAG_NONE };
	(void)nghttp2_submit_response(st->st_conn->c_sess, st->st_id, nv,
	    enc[0] ? 4 : 3, NULL);
}

/* ------------------------------------------------------------ methods */

static void
rpcsrv_health(struct rpcsrv_stream *st)
{
	struct rpcsrv *r = st->st_conn->c_srv;
	Sglang__Grpc__Scheduler__HealthCheckResponse resp =
	    SGLANG__GRPC__SCHEDULER__HEALTH_CHECK_RESPONSE__INIT;
	bool ready = ev_now(r->r_loop) >= r->r_cfg.rc_ready_at;

	resp.has_healthy = true;
	resp.healthy = ready;
	resp.message = ready ? "ok" : "starting";
	rpcsrv_queue(st, &resp.base);
	rpcsrv_finish(st, GRPC_OK, "");
}

static void
rpcsrv_loads(struct rpcsrv_stream *st)
{
	struct rpcsrv *r = st->st_conn->c_srv;
	Sglang__Grpc__Scheduler__GetLoadsResponse resp =
	    SGLANG__GRPC__SCHEDULER__GET_LOADS_RESPONSE__INIT;
	Sglang__Grpc__Scheduler__SchedulerLoad l =
	    SGLANG__GRPC__SCHEDULER__SCHEDULER_LOAD__INIT;
	Sglang__Grpc__Scheduler__SchedulerLoad *lp = &l;
	Sglang__Grpc__Scheduler__QueueMetrics q =
	    SGLANG__GRPC__SCHEDULER__QUEUE_METRICS__INIT;
	struct engine_stats es;
	char ts[32];
	time_t now = time(NULL);
	struct tm tm;

	engine_get_stats(r->r_cfg.rc_engine, &es);
	gmtime_r(&now, &tm);
	strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", &tm);
	resp.timestamp = ts;
	resp.version = "smg-simworker";
	resp.has_dp_rank_count = true;
	resp.dp_rank_count = 1;
	resp.n_loads = 1;
	resp.loads = &lp;
#define SET(f, v)                                                              \
	do {                                                                   \
		l.has_##f = true;                                              \
		l.f = (v);                                                     \
	} while (0)
	SET(dp_rank, 0);
	SET(num_running_reqs, (int32_t)es.es_running);
	SET(num_waiting_reqs, (int32_t)es.es_waiting);
	SET(num_total_reqs, (int32_t)(es.es_running + es.es_waiting));
	SET(num_used_tokens, (int32_t)es.es_used_tokens);
	SET(max_total_num_tokens, (int32_t)es.es_capacity_tokens);
	SET(token_usage,
	    (double)es.es_used_tokens / (double)es.es_capacity_tokens);
	SET(gen_throughput, es.es_gen_throughput);
	SET(cache_hit_rate,
	    es.es_prompt_tokens
	        ? (double)es.es_cached_tokens / (double)es.es_prompt_tokens
	        : 0.0);
	SET(utilization, (double)es.es_running / r->r_cfg.rc_max_running);
	SET(max_running_requests, (int32_t)r->r_cfg.rc_max_running);
	SET(num_waiting_uncached_tokens, (int32_t)es.es_waiting_uncached);
#undef SET
	q.has_waiting = true;
	q.waiting = (int32_t)es.es_waiting;
	l.queues = &q;
	rpcsrv_queue(st, &resp.base);
	rpcsrv_finish(st, GRPC_OK, "");
}

static void
rpcsrv_flush_cache(struct rpcsrv_stream *st)
{
	struct rpcsrv *r = st->st_conn->c_srv;
	Smg__Grpc__Common__FlushCacheResponse resp =
	    SMG__GRPC__COMMON__FLUSH_CACHE_RESPONSE__INIT;
	bool ok = engine_flush(r->r_cfg.rc_engine) == 0;

	resp.has_success = true;
	resp.success = ok;
	resp.message = ok ? "Cache flushed"
	                  : "Cannot flush: requests are running or queued";
	rpcsrv_queue(st, &resp.base);
	rpcsrv_finish(st, GRPC_OK, "");
}

static void
rpcsrv_subscribe(struct rpcsrv_stream *st)
{
	struct rpcsrv *r = st->st_conn->c_srv;

	if (!r->r_cfg.rc_kv_events) {
		rpcsrv_finish(st, GRPC_UNIMPLEMENTED,
		    "KV events are not enabled (--grpc-kv-events 0)");
		return;
	}
	/* Live only: the start sequence number is ignored, as the bridges
	 * do. The response headers go out now. */
	st->st_subscribed = true;
	TAILQ_INSERT_TAIL(&r->r_subs, st, st_subs);
	rpcsrv_respond(st);
}

static void
rpcsrv_dispatch(struct rpcsrv_stream *st)
{
	struct rpcsrv *r = st->st_conn->c_srv;
	const char *method;
	size_t sl = strlen(r->r_service);

	if (strcmp(r->r_cfg.rc_fault, "unavailable") == 0) {
		rpcsrv_finish(st, GRPC_UNAVAILABLE, "simulated: unavailable");
		return;
	}
	if (st->st_path[0] != '/' ||
	    strncmp(st->st_path + 1, r->r_service, sl) != 0 ||
	    st->st_path[1 + sl] != '/') {
		rpcsrv_finish(st, GRPC_UNIMPLEMENTED, "unknown service");
		return;
	}
	method = st->st_path + 2 + sl;
	if (strcmp(method, "HealthCheck") == 0)
		rpcsrv_health(st);
	else if (strcmp(method, "GetLoads") == 0)
		rpcsrv_loads(st);
	else if (strcmp(method, "FlushCache") == 0 &&
	    r->r_cfg.rc_engine_kind == SIM_ENGINE_SGLANG)
		rpcsrv_flush_cache(st);
	else if (strcmp(method, "SubscribeKvEvents") == 0)
		rpcsrv_subscribe(st);
	else
		rpcsrv_finish(st, GRPC_UNIMPLEMENTED, "unknown method");
}

static void
rpcsrv_slow_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct rpcsrv_stream *st = w->data;
	struct rpcsrv_conn *c = st->st_conn;

	(void)loop;
	(void)revents;
	rpcsrv_dispatch(st);
	rpcsrv_pump(c);
}

/* A complete request: answer it (or the fault does). */
static void
rpcsrv_request(struct rpcsrv_stream *st)
{
	struct rpcsrv *r = st->st_conn->c_srv;

	if (strcmp(r->r_cfg.rc_fault, "reset") == 0) {
		(void)nghttp2_submit_rst_stream(st->st_conn->c_sess,
		    NGHTTP2_FLAG_NONE, st->st_id, NGHTTP2_INTERNAL_ERROR);
		return;
	}
	if (strcmp(r->r_cfg.rc_fault, "slow") == 0 &&
	    strstr(st->st_path, "/SubscribeKvEvents") == NULL) {
		ev_timer_set(&st->st_timer, RPCSRV_SLOW_SECS, 0.);
		ev_timer_start(r->r_loop, &st->st_timer);
		return;
	}
	rpcsrv_dispatch(st);
}

/* ------------------------------------------------------------ events */

void
rpcsrv_add_event(void *arg, const struct kv_event *ev)
{
	struct rpcsrv *r = arg;
	Smg__Grpc__Common__KvCacheEvent *e;

	if (TAILQ_EMPTY(&r->r_subs))
		return; /* nobody listens: a live stream starts from now */
	e = xcalloc(1, sizeof(*e));
	smg__grpc__common__kv_cache_event__init(e);
	e->has_event_id = true;
	e->event_id = r->r_event_id++;
	switch (ev->ke_kind) {
	case KV_EVENT_STORED: {
		Smg__Grpc__Common__KvBlocksStored *s = xcalloc(1, sizeof(*s));
		Smg__Grpc__Common__KvBlock *b = xcalloc(1, sizeof(*b));

		smg__grpc__common__kv_blocks_stored__init(s);
		smg__grpc__common__kv_block__init(b);
		b->has_block_hash = true;
		b->block_hash = ev->ke_hash;
		b->has_block_size = true;
		b->block_size = (int32_t)ev->ke_block_size;
		b->n_token_ids = ev->ke_block_size;
		b->token_ids = xcalloc(ev->ke_block_size + 1, sizeof(uint32_t));
		memcpy(b->token_ids, ev->ke_tokens,
		    ev->ke_block_size * sizeof(uint32_t));
		s->n_blocks = 1;
		s->blocks = xcalloc(1, sizeof(*s->blocks));
		s->blocks[0] = b;
		s->has_parent_block_hash = ev->ke_has_parent != 0;
		s->parent_block_hash = ev->ke_parent;
		e->data_case = SMG__GRPC__COMMON__KV_CACHE_EVENT__DATA_STORED;
		e->stored = s;
		break;
	}
	case KV_EVENT_REMOVED: {
		Smg__Grpc__Common__KvBlocksRemoved *rm =
		    xcalloc(1, sizeof(*rm));

		smg__grpc__common__kv_blocks_removed__init(rm);
		rm->n_block_hashes = 1;
		rm->block_hashes = xcalloc(1, sizeof(int64_t));
		rm->block_hashes[0] = ev->ke_hash;
		e->data_case = SMG__GRPC__COMMON__KV_CACHE_EVENT__DATA_REMOVED;
		e->removed = rm;
		break;
	}
	case KV_EVENT_CLEARED:
		e->cleared = xcalloc(1, sizeof(*e->cleared));
		smg__grpc__common__kv_cache_cleared__init(e->cleared);
		e->data_case = SMG__GRPC__COMMON__KV_CACHE_EVENT__DATA_CLEARED;
		break;
	}
	if (r->r_npending == r->r_cap) {
		r->r_cap = r->r_cap ? r->r_cap * 2 : 16;
		r->r_pending = xreallocarray(r->r_pending, r->r_cap,
		    sizeof(*r->r_pending));
	}
	r->r_pending[r->r_npending++] = e;
	/* One batch per loop turn (an engine step, a flush). */
	if (!ev_is_active(&r->r_batch)) {
		ev_timer_set(&r->r_batch, 0., 0.);
		ev_timer_start(r->r_loop, &r->r_batch);
	}
}

static void
rpcsrv_batch_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	rpcsrv_flush(w->data);
}

static void
rpcsrv_event_free(Smg__Grpc__Common__KvCacheEvent *e)
{
	size_t i;

	switch (e->data_case) {
	case SMG__GRPC__COMMON__KV_CACHE_EVENT__DATA_STORED:
		for (i = 0; i < e->stored->n_blocks; i++) {
			free(e->stored->blocks[i]->token_ids);
			free(e->stored->blocks[i]);
		}
		free(e->stored->blocks);
		free(e->stored);
		break;
	case SMG__GRPC__COMMON__KV_CACHE_EVENT__DATA_REMOVED:
		free(e->removed->block_hashes);
		free(e->removed);
		break;
	case SMG__GRPC__COMMON__KV_CACHE_EVENT__DATA_CLEARED:
		free(e->cleared);
		break;
	default:
		break;
	}
	free(e);
}

void
rpcsrv_flush(struct rpcsrv *r)
{
	Smg__Grpc__Common__KvEventBatch b =
	    SMG__GRPC__COMMON__KV_EVENT_BATCH__INIT;
	struct rpcsrv_stream *st;
	struct rpcsrv_conn *c, *next;
	size_t i;

	if (r == NULL || r->r_npending == 0)
		return;
	ev_timer_stop(r->r_loop, &r->r_batch);
	b.has_sequence_number = true;
	b.sequence_number = r->r_seq++;
	b.has_timestamp = true;
	b.timestamp = ev_now(r->r_loop);
	b.n_events = r->r_npending;
	b.events = r->r_pending;
	TAILQ_FOREACH(st, &r->r_subs, st_subs)
	{
		rpcsrv_queue(st, &b.base);
		rpcsrv_respond(st);
	}
	for (i = 0; i < r->r_npending; i++)
		rpcsrv_event_free(r->r_pending[i]);
	r->r_npending = 0;
	for (c = TAILQ_FIRST(&r->r_conns); c != NULL; c = next) {
		next = TAILQ_NEXT(c, c_link);
		rpcsrv_pump(c); /* may free c */
	}
}

/* ------------------------------------------------------------ nghttp2 */

static int
rpcsrv_begin_headers_cb(nghttp2_session *sess, const nghttp2_frame *f,
    void *user)
{
	struct rpcsrv_conn *c = user;
	struct rpcsrv_stream *st;

	if (f->hd.type != NGHTTP2_HEADERS ||
	    f->headers.cat != NGHTTP2_HCAT_REQUEST)
		return 0;
	st = xcalloc(1, sizeof(*st));
	st->st_conn = c;
	st->st_id = f->hd.stream_id;
	grpc_reader_init(&st->st_reader, RPCSRV_MAX_MSG);
	ev_init(&st->st_timer, rpcsrv_slow_cb);
	st->st_timer.data = st;
	TAILQ_INSERT_TAIL(&c->c_streams, st, st_link);
	nghttp2_session_set_stream_user_data(sess, f->hd.stream_id, st);
	return 0;
}

static int
rpcsrv_header_cb(nghttp2_session *sess, const nghttp2_frame *f,
    const uint8_t *name, size_t namelen, const uint8_t *value, size_t valuelen,
    uint8_t flags, void *user)
{
	struct rpcsrv_stream *st;

	(void)flags;
	(void)user;
	st = nghttp2_session_get_stream_user_data(sess, f->hd.stream_id);
	if (st != NULL && namelen == 5 && memcmp(name, ":path", 5) == 0)
		snprintf(st->st_path, sizeof(st->st_path), "%.*s",
		    (int)valuelen, (const char *)value);
	return 0;
}

static void
rpcsrv_req_msg(void *arg, const uint8_t *msg, size_t len)
{
	struct rpcsrv_stream *st = arg;

	free(st->st_req);
	st->st_req = xmalloc(len + 1);
	memcpy(st->st_req, msg, len);
	st->st_req_len = len;
	st->st_have_req = true;
}

static int
rpcsrv_data_cb(nghttp2_session *sess, uint8_t flags, int32_t id,
    const uint8_t *data, size_t len, void *user)
{
	struct rpcsrv_stream *st;

	(void)flags;
	(void)user;
	if ((st = nghttp2_session_get_stream_user_data(sess, id)) == NULL)
		return 0;
	if (grpc_reader_feed(&st->st_reader, data, len, rpcsrv_req_msg, st) !=
	    GRPC_OK)
		(void)nghttp2_submit_rst_stream(sess, NGHTTP2_FLAG_NONE, id,
		    NGHTTP2_PROTOCOL_ERROR);
	return 0;
}

static int
rpcsrv_frame_cb(nghttp2_session *sess, const nghttp2_frame *f, void *user)
{
	struct rpcsrv_stream *st;

	(void)user;
	if ((f->hd.type != NGHTTP2_DATA && f->hd.type != NGHTTP2_HEADERS) ||
	    !(f->hd.flags & NGHTTP2_FLAG_END_STREAM))
		return 0;
	if ((st = nghttp2_session_get_stream_user_data(sess,
	         f->hd.stream_id)) == NULL)
		return 0;
	rpcsrv_request(st);
	return 0;
}

static int
rpcsrv_close_cb(nghttp2_session *sess, int32_t id, uint32_t error, void *user)
{
	struct rpcsrv_stream *st;

	(void)error;
	(void)user;
	if ((st = nghttp2_session_get_stream_user_data(sess, id)) == NULL)
		return 0;
	nghttp2_session_set_stream_user_data(sess, id, NULL);
	rpcsrv_stream_free(st);
	return 0;
}

static void
rpcsrv_stream_free(struct rpcsrv_stream *st)
{
	struct rpcsrv_conn *c = st->st_conn;

	ev_timer_stop(c->c_srv->r_loop, &st->st_timer);
	if (st->st_subscribed)
		TAILQ_REMOVE(&c->c_srv->r_subs, st, st_subs);
	TAILQ_REMOVE(&c->c_streams, st, st_link);
	grpc_reader_clear(&st->st_reader);
	free(st->st_req);
	free(st->st_out);
	free(st);
}

static nghttp2_session_callbacks *
rpcsrv_callbacks(void)
{
	static nghttp2_session_callbacks *cbs;

	if (cbs == NULL) {
		if (nghttp2_session_callbacks_new(&cbs) != 0)
			fatalx("%s: out of memory", __func__);
		nghttp2_session_callbacks_set_on_begin_headers_callback(cbs,
		    rpcsrv_begin_headers_cb);
		nghttp2_session_callbacks_set_on_header_callback(cbs,
		    rpcsrv_header_cb);
		nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs,
		    rpcsrv_data_cb);
		nghttp2_session_callbacks_set_on_frame_recv_callback(cbs,
		    rpcsrv_frame_cb);
		nghttp2_session_callbacks_set_on_stream_close_callback(cbs,
		    rpcsrv_close_cb);
	}
	return cbs;
}

/* ------------------------------------------------------------ I/O */

static void
rpcsrv_conn_free(struct rpcsrv_conn *c)
{
	struct rpcsrv *r = c->c_srv;
	struct rpcsrv_stream *st;

	ev_io_stop(r->r_loop, &c->c_io);
	while ((st = TAILQ_FIRST(&c->c_streams)) != NULL)
		rpcsrv_stream_free(st);
	if (c->c_sess != NULL)
		nghttp2_session_del(c->c_sess);
	tls_conn_free(c->c_tls);
	close(c->c_fd);
	free(c->c_wbuf);
	TAILQ_REMOVE(&r->r_conns, c, c_link);
	free(c);
}

/* Reads and writes what it can; frees the connection when it ends. */
static void
rpcsrv_pump(struct rpcsrv_conn *c)
{
	uint8_t buf[RPCSRV_READ_CHUNK];
	const uint8_t *data;
	ssize_t n;
	int ev;

	if (c->c_tls != NULL && !c->c_handshaken) {
		int rv = tls_conn_handshake(c->c_tls);

		if (rv == TLS_WANT_READ || rv == TLS_WANT_WRITE) {
			ev_io_stop(c->c_srv->r_loop, &c->c_io);
			ev_io_set(&c->c_io, c->c_fd,
			    rv == TLS_WANT_READ ? EV_READ : EV_WRITE);
			ev_io_start(c->c_srv->r_loop, &c->c_io);
			return;
		}
		if (rv != TLS_OK) {
			rpcsrv_conn_free(c);
			return;
		}
		c->c_handshaken = true;
	}
	for (;;) {
		n = c->c_tls != NULL ? tls_conn_read(c->c_tls, buf, sizeof(buf))
		                     : read(c->c_fd, buf, sizeof(buf));
		if (c->c_tls != NULL &&
		    (n == TLS_WANT_READ || n == TLS_WANT_WRITE))
			break;
		if (c->c_tls == NULL && n == -1 &&
		    (errno == EAGAIN || errno == EINTR))
			break;
		if (n <= 0 ||
		    nghttp2_session_mem_recv(c->c_sess, buf, (size_t)n) < 0) {
			rpcsrv_conn_free(c);
			return;
		}
	}
	for (;;) {
		if (c->c_woff == c->c_wlen) {
			c->c_woff = c->c_wlen = 0;
			n = nghttp2_session_mem_send(c->c_sess, &data);
			if (n < 0) {
				rpcsrv_conn_free(c);
				return;
			}
			if (n == 0)
				break;
			free(c->c_wbuf);
			c->c_wbuf = xmalloc((size_t)n);
			memcpy(c->c_wbuf, data, (size_t)n);
			c->c_wlen = (size_t)n;
		}
		n = c->c_tls != NULL
		    ? tls_conn_write(c->c_tls, c->c_wbuf + c->c_woff,
		          c->c_wlen - c->c_woff)
		    : write(c->c_fd, c->c_wbuf + c->c_woff,
		          c->c_wlen - c->c_woff);
		if (c->c_tls != NULL &&
		    (n == TLS_WANT_READ || n == TLS_WANT_WRITE))
			break;
		if (c->c_tls == NULL && n == -1 &&
		    (errno == EAGAIN || errno == EINTR))
			break;
		if (n < 0) {
			rpcsrv_conn_free(c);
			return;
		}
		c->c_woff += (size_t)n;
	}
	if (!nghttp2_session_want_read(c->c_sess) &&
	    !nghttp2_session_want_write(c->c_sess) && c->c_woff == c->c_wlen) {
		rpcsrv_conn_free(c);
		return;
	}
	ev = EV_READ;
	if (c->c_woff < c->c_wlen || nghttp2_session_want_write(c->c_sess))
		ev |= EV_WRITE;
	if (c->c_io.events != ev || !ev_is_active(&c->c_io)) {
		ev_io_stop(c->c_srv->r_loop, &c->c_io);
		ev_io_set(&c->c_io, c->c_fd, ev);
		ev_io_start(c->c_srv->r_loop, &c->c_io);
	}
}

static void
rpcsrv_io_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)loop;
	(void)revents;
	rpcsrv_pump(w->data);
}

static void
rpcsrv_accept_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct rpcsrv *r = w->data;
	nghttp2_settings_entry iv[] = {
		{ NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 100 },
	};
	struct rpcsrv_conn *c;
	int fd, one = 1;

	(void)revents;
	while ((fd = accept4(r->r_fd, NULL, NULL,
	            SOCK_NONBLOCK | SOCK_CLOEXEC)) != -1) {
		(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one,
		    sizeof(one));
		c = xcalloc(1, sizeof(*c));
		c->c_srv = r;
		c->c_fd = fd;
		TAILQ_INIT(&c->c_streams);
		TAILQ_INSERT_TAIL(&r->r_conns, c, c_link);
		if (nghttp2_session_server_new(&c->c_sess, rpcsrv_callbacks(),
		        c) != 0)
			fatalx("%s: out of memory", __func__);
		(void)nghttp2_submit_settings(c->c_sess, NGHTTP2_FLAG_NONE, iv,
		    1);
		if (r->r_tls != NULL &&
		    (c->c_tls = tls_conn_new_server(r->r_tls, fd)) == NULL) {
			rpcsrv_conn_free(c);
			continue;
		}
		ev_io_init(&c->c_io, rpcsrv_io_cb, fd, EV_READ | EV_WRITE);
		c->c_io.data = c;
		ev_io_start(loop, &c->c_io);
	}
}

/* ------------------------------------------------------------ lifecycle */

struct rpcsrv *
rpcsrv_new(struct ev_loop *loop, const struct rpcsrv_config *cfg)
{
	static const char *alpn[] = { "h2", NULL };
	struct addrinfo hints, *res = NULL;
	struct sockaddr_storage ss;
	socklen_t sslen = sizeof(ss);
	struct rpcsrv *r;
	char portstr[16];
	int rv, one = 1;

	r = xcalloc(1, sizeof(*r));
	r->r_loop = loop;
	r->r_cfg = *cfg;
	r->r_fd = -1;
	r->r_service = cfg->rc_engine_kind == SIM_ENGINE_VLLM
	    ? "vllm.grpc.engine.VllmEngine"
	    : "sglang.grpc.scheduler.SglangScheduler";
	TAILQ_INIT(&r->r_conns);
	TAILQ_INIT(&r->r_subs);
	ev_init(&r->r_batch, rpcsrv_batch_cb);
	r->r_batch.data = r;
	if (cfg->rc_tls_cert != NULL) {
		r->r_tls =
		    tls_ctx_new_server(cfg->rc_tls_cert, cfg->rc_tls_key);
		if (r->r_tls == NULL || tls_ctx_set_alpn(r->r_tls, alpn) == -1)
			goto fail;
	}
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	snprintf(portstr, sizeof(portstr), "%d", cfg->rc_port);
	if ((rv = getaddrinfo(cfg->rc_host, portstr, &hints, &res)) != 0) {
		log_warnx("%s: %s: %s", __func__, cfg->rc_host,
		    gai_strerror(rv));
		goto fail;
	}
	r->r_fd = socket(res->ai_family,
	    res->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (r->r_fd == -1 ||
	    setsockopt(r->r_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ==
	        -1 ||
	    bind(r->r_fd, res->ai_addr, res->ai_addrlen) == -1 ||
	    listen(r->r_fd, SOMAXCONN) == -1 ||
	    getsockname(r->r_fd, (struct sockaddr *)&ss, &sslen) == -1) {
		log_warn("%s: listen on %s:%d", __func__, cfg->rc_host,
		    cfg->rc_port);
		goto fail;
	}
	freeaddrinfo(res);
	res = NULL;
	r->r_port = ss.ss_family == AF_INET6
	    ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
	    : ntohs(((struct sockaddr_in *)&ss)->sin_port);
	ev_io_init(&r->r_accept, rpcsrv_accept_cb, r->r_fd, EV_READ);
	r->r_accept.data = r;
	ev_io_start(loop, &r->r_accept);
	log_info("%s: gRPC (%s) on %s:%d, service %s%s%s", __func__,
	    r->r_tls != NULL ? "TLS, h2" : "h2c", cfg->rc_host, r->r_port,
	    r->r_service, cfg->rc_fault[0] ? ", fault " : "", cfg->rc_fault);
	return r;
fail:
	if (res != NULL)
		freeaddrinfo(res);
	rpcsrv_free(r);
	return NULL;
}

int
rpcsrv_port(const struct rpcsrv *r)
{
	return r->r_port;
}

void
rpcsrv_free(struct rpcsrv *r)
{
	struct rpcsrv_conn *c;
	size_t i;

	if (r == NULL)
		return;
	while ((c = TAILQ_FIRST(&r->r_conns)) != NULL)
		rpcsrv_conn_free(c);
	if (r->r_fd != -1) {
		ev_io_stop(r->r_loop, &r->r_accept);
		close(r->r_fd);
	}
	ev_timer_stop(r->r_loop, &r->r_batch);
	for (i = 0; i < r->r_npending; i++)
		rpcsrv_event_free(r->r_pending[i]);
	free(r->r_pending);
	tls_ctx_free(r->r_tls);
	free(r);
}
