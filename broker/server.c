/*
 * server.c: the broker process around its state: startup (shm, store,
 * policies, startup and stored workers), the two ipc sockets and their
 * dispatch, the 250 ms housekeeping tick, the store flush once per loop
 * turn, and orderly shutdown on SIGTERM/SIGINT.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shared/ipc.h"
#include "shared/log.h"
#include "shared/metrics.h"
#include "shared/urlallow.h"
#include "shared/tls.h"
#include "shared/xmalloc.h"

#include "broker.h"
#include "kvindex.h"

struct server_rec {
	char *sr_key;
	cJSON *sr_json;
	double sr_order;
};

struct server_recs {
	struct server_rec *rs_v;
	size_t rs_n;
};

static void server_rep_cb(void *arg, const uint8_t *msg, size_t len,
    uint8_t **reply, size_t *reply_len);
static void server_pull_cb(void *arg, const uint8_t *msg, size_t len,
    uint8_t **reply, size_t *reply_len);
static void server_tick_cb(struct ev_loop *loop, ev_timer *t, int revents);
static void server_prepare_cb(struct ev_loop *loop, ev_prepare *p, int revents);
static void server_flush_cb(struct ev_loop *loop, ev_timer *t, int revents);
static void server_signal_cb(struct ev_loop *loop, ev_signal *s, int revents);
static int server_startup_workers(struct broker *br);
static int server_startup_worker(struct broker *br, const char *given, int type,
    int32_t bootstrap_port);
static int server_mode_of_urls(const struct config *cf);
static void server_collect_cb(void *arg, const char *key, const char *value);
static int server_rec_cmp(const void *a, const void *b);
static void server_restore(struct broker *br, struct server_rec *rec);
static int server_policies(struct broker *br);
static void server_remote_decided(struct broker *br, const Smg__RouteBatch *rb,
    const Smg__DecisionBatch *db);

static int
server_policies(struct broker *br)
{
	const struct config *cf = br->br_cf;

	if ((br->br_default =
	            policy_new(policy_info_name(cf->cf_policy), false)) == NULL)
		return -1;
	if (cf->cf_pd_disaggregation || cf->cf_epd_disaggregation) {
		br->br_legs[SMG__LEG__LEG_PREFILL] =
		    policy_new(policy_info_name(cf->cf_prefill_policy), false);
		br->br_legs[SMG__LEG__LEG_DECODE] =
		    policy_new(policy_info_name(cf->cf_decode_policy), false);
		if (br->br_legs[SMG__LEG__LEG_PREFILL] == NULL ||
		    br->br_legs[SMG__LEG__LEG_DECODE] == NULL)
			return -1;
	}
	if (cf->cf_epd_disaggregation &&
	    (br->br_legs[SMG__LEG__LEG_ENCODE] = policy_new(
	         policy_info_name(cf->cf_encode_policy), false)) == NULL)
		return -1;
	return 0;
}

/* The connection mode the URLs of --worker-urls imply. */
static int
server_mode_of_urls(const struct config *cf)
{
	size_t i;

	for (i = 0; i < cf->cf_worker_urls_n; i++) {
		if (strncmp(cf->cf_worker_urls[i], "grpc", 4) == 0)
			return SMG__CONNECTION_MODE__CONNECTION_MODE_GRPC;
		if (strncmp(cf->cf_worker_urls[i], "ipc://", 6) == 0)
			return SMG__CONNECTION_MODE__CONNECTION_MODE_ZMQ;
	}
	return SMG__CONNECTION_MODE__CONNECTION_MODE_HTTP;
}

/*
 * The workers of the command line: --worker-urls (regular, unless PD or
 * EPD), then --prefill, --decode and --encode.
 */
static int
server_startup_workers(struct broker *br)
{
	const struct config *cf = br->br_cf;
	bool pd = cf->cf_pd_disaggregation || cf->cf_epd_disaggregation;
	size_t i;

	for (i = 0; i < cf->cf_worker_urls_n && !pd; i++) {
		if (server_startup_worker(br, cf->cf_worker_urls[i],
		        SMG__WORKER_TYPE__WORKER_TYPE_REGULAR, -1) == -1)
			return -1;
	}
	for (i = 0; i < cf->cf_prefill_n; i++) {
		if (server_startup_worker(br, cf->cf_prefill[i].ce_url,
		        SMG__WORKER_TYPE__WORKER_TYPE_PREFILL,
		        cf->cf_prefill[i].ce_bootstrap_port) == -1)
			return -1;
	}
	for (i = 0; i < cf->cf_decode_n; i++) {
		if (server_startup_worker(br, cf->cf_decode[i],
		        SMG__WORKER_TYPE__WORKER_TYPE_DECODE, -1) == -1)
			return -1;
	}
	for (i = 0; i < cf->cf_encode_n; i++) {
		if (server_startup_worker(br, cf->cf_encode[i].ce_url,
		        SMG__WORKER_TYPE__WORKER_TYPE_ENCODE,
		        cf->cf_encode[i].ce_bootstrap_port) == -1)
			return -1;
	}
	return 0;
}

/* Registers one; 0 also for a duplicate (warned), -1 on failure. */
static int
server_startup_worker(struct broker *br, const char *given, int type,
    int32_t bootstrap_port)
{
	struct worker_spec ws;
	char url[SHM_URL_MAX], err[256];
	const char *why;

	if (registry_normalize_url(given, url, sizeof(url), err, sizeof(err)) ==
	    -1) {
		log_warnx("%s: worker %s: %s", __func__, given, err);
		return -1;
	}
	memset(&ws, 0, sizeof(ws));
	ws.ws_url = url;
	ws.ws_type = type;
	ws.ws_mode = br->br_mode;
	ws.ws_api_key = br->br_cf->cf_api_key;
	ws.ws_bootstrap_port = bootstrap_port;
	ws.ws_priority = 50;
	ws.ws_cost = 1.0;
	ws.ws_from_cli = true;
	if (registry_add(br, &ws, false, &why) == NULL) {
		if (strcmp(why, "exists") == 0) {
			log_warnx("%s: worker %s given twice", __func__, url);
			return 0;
		}
		log_warnx("%s: worker %s: table %s", __func__, url, why);
		return -1;
	}
	return 0;
}

static void
server_collect_cb(void *arg, const char *key, const char *value)
{
	struct server_recs *rs = arg;
	const cJSON *ord;
	cJSON *j;

	if ((j = cJSON_Parse(value)) == NULL || !cJSON_IsObject(j)) {
		log_warnx("server_collect: skipping unreadable record %s", key);
		cJSON_Delete(j);
		return;
	}
	ord = cJSON_GetObjectItemCaseSensitive(j, "order");
	rs->rs_v = xreallocarray(rs->rs_v, rs->rs_n + 1, sizeof(*rs->rs_v));
	rs->rs_v[rs->rs_n].sr_key = xstrdup(key);
	rs->rs_v[rs->rs_n].sr_json = j;
	rs->rs_v[rs->rs_n].sr_order =
	    cJSON_IsNumber(ord) ? ord->valuedouble : 0;
	rs->rs_n++;
}

static int
server_rec_cmp(const void *a, const void *b)
{
	const struct server_rec *x = a, *y = b;

	return (x->sr_order > y->sr_order) - (x->sr_order < y->sr_order);
}

/* One stored worker back into the registry. */
static void
server_restore(struct broker *br, struct server_rec *rec)
{
	const cJSON *j = rec->sr_json, *it, *ov;
	struct worker_spec ws;
	struct worker *w;
	char url[SHM_URL_MAX], err[256];
	const char *why;
	int t = 0, m = 0;

	memset(&ws, 0, sizeof(ws));
	if (registry_normalize_url(rec->sr_key, url, sizeof(url), err,
	        sizeof(err)) == -1) {
		log_warnx("%s: stored worker %s: %s", __func__, rec->sr_key,
		    err);
		return;
	}
	if (registry_find(br, url) != NULL)
		return; /* also on the command line */
	ws.ws_url = url;
	/* Not a UUID (a record of an older version): a new id, stored by
	 * registry_add. */
	it = cJSON_GetObjectItemCaseSensitive(j, "id");
	ws.ws_id = cJSON_IsString(it) ? it->valuestring : NULL;
	it = cJSON_GetObjectItemCaseSensitive(j, "model_id");
	ws.ws_model = cJSON_IsString(it) ? it->valuestring : NULL;
	it = cJSON_GetObjectItemCaseSensitive(j, "runtime");
	ws.ws_runtime = cJSON_IsString(it) ? it->valuestring : NULL;
	it = cJSON_GetObjectItemCaseSensitive(j, "worker_type");
	if (cJSON_IsString(it)) {
		for (t = 0; t < BROKER_NTYPES; t++)
			if (strcmp(registry_type_name(t), it->valuestring) == 0)
				break;
	}
	ws.ws_type = t < BROKER_NTYPES ? t : 0;
	it = cJSON_GetObjectItemCaseSensitive(j, "connection_mode");
	if (cJSON_IsString(it)) {
		for (m = 0; m < BROKER_NMODES; m++)
			if (strcmp(registry_mode_name(m), it->valuestring) == 0)
				break;
	}
	ws.ws_mode = m < BROKER_NMODES ? m : 0;
	it = cJSON_GetObjectItemCaseSensitive(j, "api_key");
	ws.ws_api_key = cJSON_IsString(it) ? it->valuestring : NULL;
	it = cJSON_GetObjectItemCaseSensitive(j, "bootstrap_port");
	ws.ws_bootstrap_port = cJSON_IsNumber(it) ? (int32_t)it->valueint : -1;
	it = cJSON_GetObjectItemCaseSensitive(j, "priority");
	ws.ws_priority = cJSON_IsNumber(it) ? (uint32_t)it->valuedouble : 50;
	it = cJSON_GetObjectItemCaseSensitive(j, "cost");
	ws.ws_cost = cJSON_IsNumber(it) ? it->valuedouble : 1.0;
	ws.ws_labels = cJSON_GetObjectItemCaseSensitive(j, "labels");
	ws.ws_spec = cJSON_GetObjectItemCaseSensitive(j, "spec");
	ws.ws_health_disabled = cJSON_IsTrue(
	    cJSON_GetObjectItemCaseSensitive(j, "health_disabled"));
	if ((ov = cJSON_GetObjectItemCaseSensitive(j, "overload")) != NULL) {
		it = cJSON_GetObjectItemCaseSensitive(ov, "waiting_requests");
		ws.ws_ov_waiting =
		    cJSON_IsNumber(it) ? (int64_t)it->valuedouble : 0;
		it = cJSON_GetObjectItemCaseSensitive(ov, "token_usage");
		ws.ws_ov_token_usage = cJSON_IsNumber(it) ? it->valuedouble : 0;
	}
	it = cJSON_GetObjectItemCaseSensitive(j, "load_monitor_interval_secs");
	ws.ws_load_interval_secs = cJSON_IsNumber(it) && it->valuedouble >= 1 &&
	        it->valuedouble <= 86400
	    ? (uint32_t)it->valuedouble
	    : 0;
	if ((w = registry_add(br, &ws, true, &why)) == NULL)
		log_warnx("%s: stored worker %s: %s", __func__, url, why);
}

struct broker *
server_new(struct ev_loop *loop, const struct config *cf, bool serve)
{
	struct server_recs rs = { NULL, 0 };
	struct broker *br;
	char url[512];
	unsigned t;
	size_t i;

	br = xcalloc(1, sizeof(*br));
	br->br_loop = loop;
	br->br_cf = cf;
	br->br_mode = server_mode_of_urls(cf);
	br->br_row = SHM_ROW_BROKER;
	br->br_debug = log_getlevel() == LOG_LEVEL_DEBUG;
	breaker_conf_init(&br->br_cbconf, cf);
	if (cf->cf_worker_allow_cidr_n > 0) {
		br->br_allow =
		    xcalloc(cf->cf_worker_allow_cidr_n, sizeof(*br->br_allow));
		for (i = 0; i < cf->cf_worker_allow_cidr_n; i++) {
			if (urlallow_cidr_parse(cf->cf_worker_allow_cidr[i],
			        &br->br_allow[i]) == -1) {
				log_warnx("%s: bad --worker-allow-cidr %s",
				    __func__, cf->cf_worker_allow_cidr[i]);
				goto fail;
			}
		}
		br->br_nallow = cf->cf_worker_allow_cidr_n;
	}
	if ((br->br_shm = shm_open_segment(cf->cf_run_dir)) == NULL)
		goto fail;
	if (shm_row_claim(br->br_shm, SHM_ROW_BROKER) == -1) {
		log_warnx("%s: another broker holds the broker row", __func__);
		shm_close(br->br_shm);
		br->br_shm = NULL;
		goto fail;
	}
	/* NULL: no usable state dir (logged); serve without persistence
	 * rather than fail in a loop. */
	br->br_store = store_open(cf->cf_state_dir);
	/* Who hears of registry changes, in this order. */
	registry_observe(br, &breaker_registry_observer);
	registry_observe(br, &policy_registry_observer);
	registry_observe(br, &kvindex_registry_observer);
	registry_observe(br, &live_registry_observer);
	policy_attach(br);
	/* persist first: sticky registers its restore hook there. */
	persist_init(br);
	sticky_init(br);
	if (server_policies(br) == -1)
		goto fail;
	br->br_m_shed_selection = stats_series(br, METRICS_COUNTER,
	    "smg_worker_overload_shed_total", "stage=\"selection\"");
	for (t = 0; t < BROKER_NTYPES; t++) {
		br->br_m_health_ok[t] = stats_series(br, METRICS_COUNTER,
		    "smg_worker_health_checks_total",
		    "worker_type=\"%s\",result=\"success\"",
		    registry_type_name((int)t));
		br->br_m_health_fail[t] = stats_series(br, METRICS_COUNTER,
		    "smg_worker_health_checks_total",
		    "worker_type=\"%s\",result=\"failure\"",
		    registry_type_name((int)t));
	}
	registry_adopt_begin(br);
	if (server_startup_workers(br) == -1) {
		registry_adopt_end(br);
		goto fail;
	}
	/* Then the workers added through the API before a restart. */
	if (store_each(br->br_store, server_collect_cb, &rs) == 0 &&
	    rs.rs_n > 0) {
		qsort(rs.rs_v, rs.rs_n, sizeof(*rs.rs_v), server_rec_cmp);
		for (i = 0; i < rs.rs_n; i++)
			server_restore(br, &rs.rs_v[i]);
	}
	for (i = 0; i < rs.rs_n; i++) {
		free(rs.rs_v[i].sr_key);
		cJSON_Delete(rs.rs_v[i].sr_json);
	}
	free(rs.rs_v);
	registry_adopt_end(br);
	/* Routing state last: it names workers by URL. */
	(void)persist_restore(br);
	(void)store_flush(br->br_store);
	if (!serve)
		return br;

	if (ipc_url(url, sizeof(url), cf->cf_run_dir, IPC_BROKER_SOCK) == -1 ||
	    (br->br_rep = ipc_server_new(loop, url, IPC_SERVER_REP,
	         server_rep_cb, br)) == NULL)
		goto fail;
	log_info("smg-broker: serving %s, %u workers, policy %s, state %s", url,
	    br->br_nworkers, policy_name(br->br_default), cf->cf_state_dir);
	/* The same conversation for frontends on other hosts. */
	br->br_remote =
	    xcalloc(cf->cf_broker_listen_n + 1, sizeof(*br->br_remote));
	for (i = 0; i < cf->cf_broker_listen_n; i++) {
		if (strncmp(cf->cf_broker_listen[i], "tls+", 4) == 0) {
			/* Remote frontends must show a certificate too. */
			if (br->br_tls == NULL &&
			    (br->br_tls = tls_ctx_new_server_mutual(
			         cf->cf_broker_tls_cert, cf->cf_broker_tls_key,
			         cf->cf_broker_tls_ca)) == NULL)
				goto fail;
			br->br_remote[i] =
			    ipc_server_new_tls(loop, cf->cf_broker_listen[i],
			        br->br_tls, server_rep_cb, br);
		} else
			br->br_remote[i] =
			    ipc_server_new(loop, cf->cf_broker_listen[i],
			        IPC_SERVER_REP, server_rep_cb, br);
		if (br->br_remote[i] == NULL)
			goto fail;
		log_info("smg-broker: also serving %s (port %d)",
		    cf->cf_broker_listen[i], ipc_server_port(br->br_remote[i]));
	}
	if (ipc_url(url, sizeof(url), cf->cf_run_dir, IPC_REPORTS_SOCK) == -1 ||
	    (br->br_pull = ipc_server_new(loop, url, IPC_SERVER_PULL,
	         server_pull_cb, br)) == NULL)
		goto fail;
	ev_timer_init(&br->br_tick, server_tick_cb, 0., BROKER_TICK_SECS);
	br->br_tick.data = br;
	ev_timer_start(loop, &br->br_tick);
	ev_timer_init(&br->br_flush, server_flush_cb, STORE_BEHIND_MS / 1000.,
	    STORE_BEHIND_MS / 1000.);
	br->br_flush.data = br;
	ev_timer_start(loop, &br->br_flush);
	ev_prepare_init(&br->br_prepare, server_prepare_cb);
	br->br_prepare.data = br;
	ev_prepare_start(loop, &br->br_prepare);
	ev_signal_init(&br->br_sigterm, server_signal_cb, SIGTERM);
	ev_signal_init(&br->br_sigint, server_signal_cb, SIGINT);
	br->br_sigterm.data = br->br_sigint.data = br;
	ev_signal_start(loop, &br->br_sigterm);
	ev_signal_start(loop, &br->br_sigint);
	return br;
fail:
	server_free(br);
	return NULL;
}

void
server_free(struct broker *br)
{
	unsigned i;

	if (br == NULL)
		return;
	ev_timer_stop(br->br_loop, &br->br_tick);
	ev_timer_stop(br->br_loop, &br->br_flush);
	ev_prepare_stop(br->br_loop, &br->br_prepare);
	ev_signal_stop(br->br_loop, &br->br_sigterm);
	ev_signal_stop(br->br_loop, &br->br_sigint);
	ipc_server_free(br->br_rep);
	ipc_server_free(br->br_pull);
	for (i = 0; br->br_remote != NULL && i < br->br_cf->cf_broker_listen_n;
	     i++)
		ipc_server_free(br->br_remote[i]);
	free(br->br_remote);
	tls_ctx_free(br->br_tls);
	remote_free(br);
	store_close(br->br_store);
	br->br_store = NULL;
	registry_free_all(br);
	kvindex_broker_free(br);
	policy_free(br->br_default);
	for (i = 0; i < 4; i++)
		policy_free(br->br_legs[i]);
	sticky_free(br);
	persist_free(br);
	policy_attach(NULL);
	if (br->br_shm != NULL) {
		shm_row_release(br->br_shm, SHM_ROW_BROKER);
		shm_close(br->br_shm);
	}
	free(br->br_allow);
	free(br);
}

/* Each decision of a remote frontend's batch counts on its worker now. */
static void
server_remote_decided(struct broker *br, const Smg__RouteBatch *rb,
    const Smg__DecisionBatch *db)
{
	const Smg__Decision *d;
	uint64_t tokens;
	size_t i;

	for (i = 0; i < db->n_decisions && i < rb->n_requests; i++) {
		d = db->decisions[i];
		if (d->status != SMG__DECISION_STATUS__DECISION_OK)
			continue;
		tokens = live_prompt_tokens(rb->requests[i], 0);
		remote_decided(br, rb->live, d->worker_slot,
		    tokens > d->cached_tokens ? tokens - d->cached_tokens : 0);
	}
}

uint8_t *
server_frontend(struct broker *br, const uint8_t *msg, size_t len,
    size_t *reply_len)
{
	Smg__FrontendMsg *m;
	Smg__BrokerReply r = SMG__BROKER_REPLY__INIT;
	Smg__Pong pong = SMG__PONG__INIT;
	Smg__DecisionBatch db = SMG__DECISION_BATCH__INIT;
	Smg__AdminReply ar = SMG__ADMIN_REPLY__INIT;
	const char *why;
	uint8_t *out = NULL;

	if ((m = ipc_decode_frontend(msg, len, &why)) == NULL) {
		log_warnx("%s: frontend message rejected: %s", __func__, why);
		return ipc_pack_error(why, "cannot decode the message",
		    reply_len);
	}
	r.version = IPC_VERSION;
	switch (m->body_case) {
	case SMG__FRONTEND_MSG__BODY_PING:
		pong.broker_pid = (int32_t)getpid();
		pong.registry_generation = shm_workers_generation(br->br_shm);
		r.body_case = SMG__BROKER_REPLY__BODY_PONG;
		r.pong = &pong;
		out = ipc_pack_broker(&r, reply_len);
		break;
	case SMG__FRONTEND_MSG__BODY_ROUTE_BATCH:
		/* A remote frontend's load counts for this batch already. */
		if (m->route_batch->live != NULL)
			remote_report(br, m->route_batch->live);
		if (route_batch(br, m->route_batch, &db) == -1) {
			out = ipc_pack_error("internal", "out of memory",
			    reply_len);
			break;
		}
		if (m->route_batch->live != NULL)
			server_remote_decided(br, m->route_batch, &db);
		r.body_case = SMG__BROKER_REPLY__BODY_DECISION_BATCH;
		r.decision_batch = &db;
		out = ipc_pack_broker(&r, reply_len);
		route_batch_free(&db);
		break;
	case SMG__FRONTEND_MSG__BODY_HOST_SYNC:
		out = remote_sync(br, m->host_sync, reply_len);
		break;
	case SMG__FRONTEND_MSG__BODY_TABLE_WAIT:
		/* NULL: held until the table changes (remote.c). */
		out = remote_table_wait(br, m->table_wait, reply_len);
		break;
	case SMG__FRONTEND_MSG__BODY_ADMIN:
		admin_handle(br, m->admin, &ar);
		r.body_case = SMG__BROKER_REPLY__BODY_ADMIN;
		r.admin = &ar;
		out = ipc_pack_broker(&r, reply_len);
		admin_reply_free(&ar);
		break;
	default:
		log_warnx("%s: unknown frontend message %d", __func__,
		    (int)m->body_case);
		out = ipc_pack_error("unknown", "unknown message", reply_len);
		break;
	}
	smg__frontend_msg__free_unpacked(m, NULL);
	return out;
}

void
server_poller(struct broker *br, const uint8_t *msg, size_t len)
{
	Smg__PollerMsg *m;
	const char *why;

	if ((m = ipc_decode_poller(msg, len, &why)) == NULL) {
		log_warnx("%s: poller message rejected: %s", __func__, why);
		return;
	}
	reports_handle(br, m);
	smg__poller_msg__free_unpacked(m, NULL);
}

static void
server_rep_cb(void *arg, const uint8_t *msg, size_t len, uint8_t **reply,
    size_t *reply_len)
{
	*reply = server_frontend(arg, msg, len, reply_len);
}

static void
server_pull_cb(void *arg, const uint8_t *msg, size_t len, uint8_t **reply,
    size_t *reply_len)
{
	(void)reply;
	(void)reply_len;
	server_poller(arg, msg, len);
}

static void
server_tick_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct broker *br = t->data;
	unsigned i;
	int n;

	(void)loop;
	(void)revents;
	if ((n = shm_reclaim_dead(br->br_shm)) > 0)
		log_info("%s: reclaimed %d dead process rows", __func__, n);
	shm_heartbeat(br->br_shm, br->br_row);
	for (i = 0; i < br->br_nworkers; i++) {
		struct worker *w = br->br_order[i];

		stats_set(br, w->wk_m_active, live_in_flight(br, w));
	}
	remote_sweep(br, shm_now_ms());
	remote_waits_sweep(br, shm_now_ms());
	live_tick(br);
	policy_sweep_all(br, shm_now_ms());
	sticky_sweep(br, shm_now_ms());
}

static void
server_prepare_cb(struct ev_loop *loop, ev_prepare *p, int revents)
{
	struct broker *br = p->data;

	(void)loop;
	(void)revents;
	if (store_flush_due(br->br_store, shm_now_ms()))
		(void)store_flush(br->br_store);
	remote_waits_check(br);
}

/*
 * Every STORE_BEHIND_MS, whatever is queued is written: routing state is
 * never more than that (plus one commit) behind the decisions.
 */
static void
server_flush_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct broker *br = t->data;

	(void)loop;
	(void)revents;
	if (store_pending(br->br_store))
		(void)store_flush(br->br_store);
}

static void
server_signal_cb(struct ev_loop *loop, ev_signal *s, int revents)
{
	(void)revents;
	log_info("%s: signal %d, stopping", __func__, s->signum);
	ev_break(loop, EVBREAK_ALL);
}
