/*
 * rpc.c: the poller's gRPC side (workers.md §4): one channel per worker,
 * the table of engine services, engine detection by HealthCheck, and the
 * mapping of GetLoads into the load report of /v1/loads. What each call
 * is for stays with its owner: registration (register.c), health
 * (health.c), loads (load.c), KV events (kvevents.c).
 */
#include "poller/poller.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shared/config.h"
#include "shared/log.h"

/* The services of §4 and what each serves (SMG's clients). */
static const struct rpc_engine {
	const char *re_runtime;
	const char *re_service;
	bool re_loads;
	bool re_kv;
	bool re_flush;
} rpc_engines[] = {
	{ "sglang", "sglang.grpc.scheduler.SglangScheduler", true, true, true },
	{ "vllm", "vllm.grpc.engine.VllmEngine", true, true, false },
	{ "tokenspeed", "tokenspeed.grpc.scheduler.TokenSpeedScheduler", true,
	    true, true },
	{ "trtllm", "trtllm.TrtllmService", false, true, false },
	{ "mlx", "mlx.grpc.engine.MlxEngine", false, false, false },
};
#define RPC_NENGINES (int)(sizeof(rpc_engines) / sizeof(rpc_engines[0]))

static const char *const rpc_method_names[] = {
	[RPC_HEALTH_CHECK] = "HealthCheck",
	[RPC_GET_LOADS] = "GetLoads",
	[RPC_SUBSCRIBE_KV_EVENTS] = "SubscribeKvEvents",
	[RPC_FLUSH_CACHE] = "FlushCache",
};

static struct grpc_channel *rpc_channel(struct pworker *);
static struct grpc_call *rpc_start(struct pworker *, int, enum rpc_method,
    const ProtobufCMessage *, double, grpc_message_cb, grpc_close_cb, void *);
static void rpc_detect_next(struct pworker *);
static void rpc_detect_msg_cb(void *, const uint8_t *, size_t);
static void rpc_detect_close_cb(void *, const struct grpc_status *);

bool
rpc_is_grpc_url(const char *url)
{
	return strncmp(url, "grpc://", 7) == 0 ||
	    strncmp(url, "grpcs://", 8) == 0;
}

const char *
rpc_target(const struct pworker *pw)
{
	if (rpc_is_grpc_url(pw->pw_url))
		return pw->pw_base;
	if (pw->pw_grpc_label[0] != '\0')
		return pw->pw_grpc_label;
	return NULL;
}

const char *
rpc_runtime(const struct pworker *pw)
{
	int e = pw->pw_rpc.rs_engine - 1;

	if (e < 0 || e >= RPC_NENGINES)
		return NULL;
	return rpc_engines[e].re_runtime;
}

bool
rpc_engine_has(const struct pworker *pw, enum rpc_method m)
{
	int e = pw->pw_rpc.rs_engine - 1;

	if (e < 0 || e >= RPC_NENGINES)
		return false;
	switch (m) {
	case RPC_HEALTH_CHECK:
		return true;
	case RPC_GET_LOADS:
		return rpc_engines[e].re_loads;
	case RPC_SUBSCRIBE_KV_EVENTS:
		return rpc_engines[e].re_kv;
	case RPC_FLUSH_CACHE:
		return rpc_engines[e].re_flush;
	}
	return false;
}

/* The worker's channel, made (or remade for a new target) on demand. */
static struct grpc_channel *
rpc_channel(struct pworker *pw)
{
	struct rpc_state *rs = &pw->pw_rpc;
	const char *t = rpc_target(pw);

	if (t == NULL)
		return NULL;
	if (rs->rs_ch != NULL && strcmp(rs->rs_target, t) == 0)
		return rs->rs_ch;
	if (rs->rs_ch != NULL)
		return NULL; /* the owners stop their calls first (rpc_stop) */
	rs->rs_ch = grpc_channel_new(pw->pw_poller->p_loop, t,
	    pw->pw_poller->p_grpc_tls, RPC_MAX_MESSAGE);
	if (rs->rs_ch != NULL)
		snprintf(rs->rs_target, sizeof(rs->rs_target), "%s", t);
	return rs->rs_ch;
}

static struct grpc_call *
rpc_start(struct pworker *pw, int engine, enum rpc_method m,
    const ProtobufCMessage *req, double timeout, grpc_message_cb on_message,
    grpc_close_cb on_close, void *arg)
{
	struct grpc_channel *ch;
	struct grpc_call *c;
	uint8_t stackbuf[512], *buf = stackbuf;
	char path[160];
	size_t len;

	if ((ch = rpc_channel(pw)) == NULL)
		return NULL;
	snprintf(path, sizeof(path), "/%s/%s", rpc_engines[engine].re_service,
	    rpc_method_names[m]);
	len = protobuf_c_message_get_packed_size(req);
	if (len > sizeof(stackbuf) && (buf = malloc(len)) == NULL) {
		log_warnx("%s: out of memory", __func__);
		return NULL;
	}
	protobuf_c_message_pack(req, buf);
	c = grpc_call_start(ch, path, pw->pw_api_key, buf, len, timeout,
	    on_message, on_close, arg);
	if (buf != stackbuf)
		free(buf);
	return c;
}

struct grpc_call *
rpc_call(struct pworker *pw, enum rpc_method m, const ProtobufCMessage *req,
    double timeout_secs, grpc_message_cb on_message, grpc_close_cb on_close,
    void *arg)
{
	if (!rpc_engine_has(pw, m))
		return NULL;
	return rpc_start(pw, pw->pw_rpc.rs_engine - 1, m, req, timeout_secs,
	    on_message, on_close, arg);
}

void
rpc_stop(struct pworker *pw)
{
	struct rpc_state *rs = &pw->pw_rpc;

	rpc_detect_cancel(pw);
	grpc_channel_free(rs->rs_ch);
	memset(rs, 0, sizeof(*rs));
}

/* ------------------------------------------------------------ detection */

int
rpc_detect(struct pworker *pw, rpc_detect_cb cb)
{
	struct rpc_state *rs = &pw->pw_rpc;
	int i;

	rpc_detect_cancel(pw);
	if (rpc_channel(pw) == NULL)
		return -1;
	rs->rs_detect_first = 0;
	for (i = 0; i < RPC_NENGINES; i++)
		if (strcmp(pw->pw_runtime, rpc_engines[i].re_runtime) == 0)
			rs->rs_detect_first = i;
	rs->rs_detect_idx = 0;
	rs->rs_detect_cb = cb;
	rpc_detect_next(pw);
	return rs->rs_detect != NULL ? 0 : -1;
}

void
rpc_detect_cancel(struct pworker *pw)
{
	grpc_call_cancel(pw->pw_rpc.rs_detect);
	pw->pw_rpc.rs_detect = NULL;
}

static void
rpc_detect_next(struct pworker *pw)
{
	struct rpc_state *rs = &pw->pw_rpc;
	Sglang__Grpc__Scheduler__HealthCheckRequest req =
	    SGLANG__GRPC__SCHEDULER__HEALTH_CHECK_REQUEST__INIT;
	int e = (rs->rs_detect_first + (int)rs->rs_detect_idx) % RPC_NENGINES;

	rs->rs_detect_healthy = false;
	rs->rs_detect_text[0] = '\0';
	rs->rs_detect = rpc_start(pw, e, RPC_HEALTH_CHECK, &req.base,
	    (double)pw->pw_poller->p_cf->cf_health_check_timeout_secs,
	    rpc_detect_msg_cb, rpc_detect_close_cb, pw);
}

static void
rpc_detect_msg_cb(void *arg, const uint8_t *msg, size_t len)
{
	struct rpc_state *rs = &((struct pworker *)arg)->pw_rpc;
	Sglang__Grpc__Scheduler__HealthCheckResponse *r;

	r = sglang__grpc__scheduler__health_check_response__unpack(NULL, len,
	    msg);
	if (r == NULL) {
		snprintf(rs->rs_detect_text, sizeof(rs->rs_detect_text),
		    "HealthCheckResponse does not decode");
		return;
	}
	rs->rs_detect_healthy = r->has_healthy && r->healthy;
	snprintf(rs->rs_detect_text, sizeof(rs->rs_detect_text), "%s",
	    r->message != NULL ? r->message : "");
	sglang__grpc__scheduler__health_check_response__free_unpacked(r, NULL);
}

static void
rpc_detect_close_cb(void *arg, const struct grpc_status *st)
{
	struct pworker *pw = arg;
	struct rpc_state *rs = &pw->pw_rpc;
	int e = (rs->rs_detect_first + (int)rs->rs_detect_idx) % RPC_NENGINES;
	rpc_detect_cb cb = rs->rs_detect_cb;
	char detail[GRPC_MESSAGE_MAX + 96];

	rs->rs_detect = NULL;
	if (st->gs_code == GRPC_UNIMPLEMENTED &&
	    ++rs->rs_detect_idx < (unsigned)RPC_NENGINES) {
		rpc_detect_next(pw);
		if (rs->rs_detect == NULL)
			cb(pw, false, "out of memory");
		return;
	}
	if (st->gs_code == GRPC_UNIMPLEMENTED) {
		cb(pw, false, "no engine service answers HealthCheck");
		return;
	}
	if (st->gs_code != GRPC_OK) {
		snprintf(detail, sizeof(detail), "%s HealthCheck: %s: %s",
		    rpc_engines[e].re_runtime, grpc_code_name(st->gs_code),
		    st->gs_message);
		cb(pw, false, detail);
		return;
	}
	rs->rs_engine = e + 1;
	if (!rs->rs_detect_healthy) {
		snprintf(detail, sizeof(detail),
		    "%s HealthCheck: not healthy%s%s",
		    rpc_engines[e].re_runtime,
		    rs->rs_detect_text[0] ? ": " : "", rs->rs_detect_text);
		cb(pw, false, detail);
		return;
	}
	snprintf(detail, sizeof(detail), "%s", rpc_engines[e].re_service);
	cb(pw, true, detail);
}

static void
rpc_side_detect_cb(struct pworker *pw, bool ok, const char *detail)
{
	if (ok)
		log_info("%s: %s: gRPC side channel %s serves %s", __func__,
		    pw->pw_url, pw->pw_rpc.rs_target, detail);
	else
		log_debug("%s: %s: gRPC side channel %s: %s", __func__,
		    pw->pw_url, pw->pw_rpc.rs_target, detail);
}

bool
rpc_ready(struct pworker *pw)
{
	if (rpc_runtime(pw) != NULL)
		return true;
	/* grpc:// workers learn their engine through registration/health. */
	if (!rpc_is_grpc_url(pw->pw_url) && pw->pw_rpc.rs_detect == NULL &&
	    rpc_target(pw) != NULL)
		(void)rpc_detect(pw, rpc_side_detect_cb);
	return false;
}

/* ------------------------------------------------------------ loads */

void
rpc_map_load(const Sglang__Grpc__Scheduler__SchedulerLoad *in,
    Smg__RankLoad *out)
{
	smg__rank_load__init(out);
	out->dp_rank = in->dp_rank;
	out->num_running_reqs = in->num_running_reqs;
	out->num_waiting_reqs = in->num_waiting_reqs;
	out->num_waiting_uncached_tokens = in->num_waiting_uncached_tokens;
	out->num_total_reqs = in->num_total_reqs;
	out->num_used_tokens = in->num_used_tokens;
	out->max_total_num_tokens = in->max_total_num_tokens;
	out->token_usage = in->token_usage;
	out->gen_throughput = in->gen_throughput;
	out->cache_hit_rate = in->cache_hit_rate;
	out->utilization = in->utilization;
	out->max_running_requests = in->max_running_requests;
}

int
rpc_parse_loads(const uint8_t *buf, size_t len, Smg__RankLoad *ranks,
    size_t max, size_t *n)
{
	Sglang__Grpc__Scheduler__GetLoadsResponse *r;
	size_t i;

	*n = 0;
	r = sglang__grpc__scheduler__get_loads_response__unpack(NULL, len, buf);
	if (r == NULL)
		return LOADS_ABSENT;
	for (i = 0; i < r->n_loads && *n < max; i++)
		rpc_map_load(r->loads[i], &ranks[(*n)++]);
	sglang__grpc__scheduler__get_loads_response__free_unpacked(r, NULL);
	return *n > 0 ? LOADS_REPORT : LOADS_EMPTY;
}
