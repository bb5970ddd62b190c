/*
 * hostsync.c: a frontend on another host than its broker (--broker
 * tcp://...). Its host has shared memory of its own, so with every
 * decision batch and at least every HOSTSYNC_SECS it tells the broker its
 * row's live load (requests in flight and prompt tokens pending per worker
 * slot), and the frontend of
 * row 0 mirrors the broker's worker table into the local segment: it
 * keeps one TableWait with the registry generation it holds at the
 * broker, which answers with the whole table as soon as the generation
 * is not that one (at once when it already is not, so the first wait,
 * with generation 0, brings the snapshot), or "unchanged" after
 * HOSTSYNC_WAIT_MS. A broker that does not know TableWait gets the old
 * question instead: the generation with every HostSync. While the broker
 * is away the last table stays, so the local fallback, /workers and
 * /v1/models keep answering.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nng/nng.h>

#include "frontend/frontend.h"
#include "shared/ipc.h"
#include "shared/log.h"
#include "shared/xmalloc.h"

#define HOSTSYNC_SECS          0.1
#define HOSTSYNC_WAIT_MS       5000 /* how long the broker may hold a TableWait */
#define HOSTSYNC_WAIT_SLACK_MS 2000 /* beyond it, the wait has failed */
#define HOSTSYNC_RETRY_SECS    0.1 /* after a failed wait */

static ev_timer hostsync_timer;
static ev_timer hostsync_retry;
static bool hostsync_waiting; /* a TableWait is at the broker */
static bool hostsync_longpoll; /* false: the broker predates TableWait */
static bool hostsync_on;
static bool hostsync_pending;
static bool hostsync_mirror; /* this frontend writes the worker table */
static uint64_t hostsync_generation; /* the broker's, last mirrored */
static char hostsync_host[512];
/* The last report, rebuilt by hostsync_live. */
static Smg__HostSync hostsync_msg;
static Smg__WorkerLive hostsync_lv[SHM_MAX_WORKERS];
static Smg__WorkerLive *hostsync_lvp[SHM_MAX_WORKERS];

static void hostsync_timer_cb(struct ev_loop *, ev_timer *, int);
static void hostsync_reply_cb(void *, int, const uint8_t *, size_t);
static void hostsync_apply(const Smg__HostTable *);
static void hostsync_wait_send(void);
static void hostsync_wait_cb(void *, int, const uint8_t *, size_t);
static void hostsync_retry_cb(struct ev_loop *, ev_timer *, int);

void
hostsync_init(void)
{
	char name[256];

	if (fe->fe_cf->cf_broker == NULL)
		return;
	if (gethostname(name, sizeof(name)) == -1)
		snprintf(name, sizeof(name), "unknown");
	name[sizeof(name) - 1] = '\0';
	snprintf(hostsync_host, sizeof(hostsync_host), "%s:%s", name,
	    fe->fe_cf->cf_run_dir);
	hostsync_mirror = fe->fe_row == 0;
	hostsync_longpoll = true;
	hostsync_on = true;
	ev_timer_init(&hostsync_timer, hostsync_timer_cb, 0., HOSTSYNC_SECS);
	ev_timer_start(fe->fe_loop, &hostsync_timer);
	ev_timer_init(&hostsync_retry, hostsync_retry_cb, HOSTSYNC_RETRY_SECS,
	    0.);
	if (hostsync_mirror)
		hostsync_wait_send();
}

void
hostsync_shutdown(void)
{
	if (!hostsync_on)
		return;
	ev_timer_stop(fe->fe_loop, &hostsync_timer);
	ev_timer_stop(fe->fe_loop, &hostsync_retry);
	hostsync_on = false;
}

bool
hostsync_broker_alive(void)
{
	if (fe->fe_cf->cf_broker == NULL)
		return shm_row_alive(fe->fe_shm, SHM_ROW_BROKER);
	return ipc_client_down_secs(fe->fe_broker) == 0.;
}

Smg__HostSync *
hostsync_live(void)
{
	struct shm_segment *seg;
	struct shm_row *row;
	struct shm_worker sw;
	Smg__HostSync *hs = &hostsync_msg;
	unsigned s;
	uint32_t inf;
	int64_t pend;
	size_t n = 0;

	if (!hostsync_on)
		return NULL;
	seg = shm_segment(fe->fe_shm);
	row = &seg->sh_rows[fe->fe_row];
	for (s = 0; s < SHM_MAX_WORKERS; s++) {
		inf = atomic_load_explicit(&row->row_inflight[s],
		    memory_order_relaxed);
		pend = atomic_load_explicit(&row->row_pending_tokens[s],
		    memory_order_relaxed);
		if ((inf == 0 && pend <= 0) ||
		    shm_worker_read(fe->fe_shm, s, &sw) == -1)
			continue;
		smg__worker_live__init(&hostsync_lv[n]);
		hostsync_lv[n].slot = s;
		hostsync_lv[n].generation = sw.sw_generation;
		hostsync_lv[n].in_flight = inf;
		hostsync_lv[n].pending_tokens = pend > 0 ? (uint64_t)pend : 0;
		hostsync_lvp[n] = &hostsync_lv[n];
		n++;
	}
	smg__host_sync__init(hs);
	hs->host = hostsync_host;
	hs->frontend_slot = (uint32_t)fe->fe_row;
	hs->interval_ms = (uint32_t)(HOSTSYNC_SECS * 1000);
	hs->n_live = n;
	hs->live = hostsync_lvp;
	return hs;
}

static void
hostsync_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	Smg__FrontendMsg m = SMG__FRONTEND_MSG__INIT;
	Smg__HostSync *hs;
	uint8_t *buf;
	size_t len;

	(void)loop;
	(void)w;
	(void)revents;
	if (hostsync_pending || (hs = hostsync_live()) == NULL)
		return;
	hs->want_table = hostsync_mirror && !hostsync_longpoll;
	hs->table_generation = hostsync_generation;
	m.version = IPC_VERSION;
	m.body_case = SMG__FRONTEND_MSG__BODY_HOST_SYNC;
	m.host_sync = hs;
	if ((buf = ipc_pack_frontend(&m, &len)) != NULL) {
		if (ipc_client_send(fe->fe_broker, buf, len,
		        FE_BROKER_TIMEOUT_MS, hostsync_reply_cb, NULL) == 0)
			hostsync_pending = true;
		free(buf);
	}
}

static void
hostsync_reply_cb(void *arg, int status, const uint8_t *reply, size_t len)
{
	Smg__BrokerReply *r;
	const char *why;

	(void)arg;
	hostsync_pending = false;
	if (status != 0 || !hostsync_on)
		return;
	if ((r = ipc_decode_broker(reply, len, &why)) == NULL) {
		log_warnx("%s: broker reply rejected: %s", __func__, why);
		return;
	}
	if (r->body_case == SMG__BROKER_REPLY__BODY_HOST_TABLE &&
	    hostsync_mirror && r->host_table->has_table)
		hostsync_apply(r->host_table);
	smg__broker_reply__free_unpacked(r, NULL);
}

/* The long poll: one TableWait at the broker at a time. */
static void
hostsync_wait_send(void)
{
	Smg__FrontendMsg m = SMG__FRONTEND_MSG__INIT;
	Smg__TableWait tw = SMG__TABLE_WAIT__INIT;
	uint8_t *buf;
	size_t len;

	if (!hostsync_on || !hostsync_longpoll || hostsync_waiting)
		return;
	tw.generation = hostsync_generation;
	tw.wait_ms = HOSTSYNC_WAIT_MS;
	m.version = IPC_VERSION;
	m.body_case = SMG__FRONTEND_MSG__BODY_TABLE_WAIT;
	m.table_wait = &tw;
	if ((buf = ipc_pack_frontend(&m, &len)) != NULL &&
	    ipc_client_send(fe->fe_broker, buf, len,
	        HOSTSYNC_WAIT_MS + HOSTSYNC_WAIT_SLACK_MS, hostsync_wait_cb,
	        NULL) == 0)
		hostsync_waiting = true;
	else
		ev_timer_start(fe->fe_loop, &hostsync_retry);
	free(buf);
}

static void
hostsync_retry_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
	hostsync_wait_send();
}

static void
hostsync_wait_cb(void *arg, int status, const uint8_t *reply, size_t len)
{
	Smg__BrokerReply *r;
	const char *why;

	(void)arg;
	hostsync_waiting = false;
	if (!hostsync_on || status == NNG_ECLOSED)
		return;
	if (status != 0) {
		/*
		 * Lost with its connection, or not answered in time: the
		 * next wait asks for a fresh snapshot, whichever broker
		 * answers it.
		 */
		hostsync_generation = 0;
		ev_timer_start(fe->fe_loop, &hostsync_retry);
		return;
	}
	if ((r = ipc_decode_broker(reply, len, &why)) == NULL) {
		log_warnx("%s: broker reply rejected: %s", __func__, why);
		ev_timer_start(fe->fe_loop, &hostsync_retry);
		return;
	}
	if (r->body_case == SMG__BROKER_REPLY__BODY_HOST_TABLE) {
		if (r->host_table->has_table)
			hostsync_apply(r->host_table);
		hostsync_wait_send();
	} else if (r->body_case == SMG__BROKER_REPLY__BODY_ERROR &&
	    r->error->code != NULL &&
	    (strcmp(r->error->code, "unknown") == 0 ||
	        strcmp(r->error->code, "empty") == 0)) {
		/* "empty": the message's body is a field it cannot decode. */
		log_info("%s: the broker does not hold table waits; "
		         "the generation goes with every sync",
		    __func__);
		hostsync_longpoll = false;
	} else
		ev_timer_start(fe->fe_loop, &hostsync_retry);
	smg__broker_reply__free_unpacked(r, NULL);
}

static void
hostsync_copy(char *dst, size_t size, const char *src)
{
	snprintf(dst, size, "%s", src != NULL ? src : "");
}

/* The broker's table replaces the local one, slot for slot. */
static void
hostsync_apply(const Smg__HostTable *t)
{
	bool seen[SHM_MAX_WORKERS];
	struct shm_worker sw, cur;
	size_t i;
	unsigned s;

	memset(seen, 0, sizeof(seen));
	for (i = 0; i < t->n_workers; i++) {
		const Smg__MirrorWorker *mw = t->workers[i];

		if (mw->slot >= SHM_MAX_WORKERS)
			continue;
		memset(&sw, 0, sizeof(sw));
		sw.sw_generation = mw->generation;
		sw.sw_order = mw->order;
		sw.sw_type = mw->type;
		sw.sw_mode = mw->mode;
		sw.sw_status = mw->status;
		sw.sw_breaker = mw->breaker;
		sw.sw_overloaded = mw->overloaded;
		sw.sw_bootstrap_port = mw->bootstrap_port;
		hostsync_copy(sw.sw_id, sizeof(sw.sw_id), mw->id);
		hostsync_copy(sw.sw_url, sizeof(sw.sw_url), mw->url);
		hostsync_copy(sw.sw_model, sizeof(sw.sw_model), mw->model);
		hostsync_copy(sw.sw_api_key, sizeof(sw.sw_api_key),
		    mw->api_key);
		hostsync_copy(sw.sw_kv_endpoint, sizeof(sw.sw_kv_endpoint),
		    mw->kv_endpoint);
		hostsync_copy(sw.sw_grpc_endpoint, sizeof(sw.sw_grpc_endpoint),
		    mw->grpc_endpoint);
		sw.sw_load_interval_secs = mw->load_interval_secs;
		sw.sw_overload_on = mw->overload_on;
		/* Another worker in the slot: the old one's load goes. */
		if (shm_worker_read(fe->fe_shm, mw->slot, &cur) == -1 ||
		    cur.sw_generation != sw.sw_generation)
			shm_inflight_reset_slot(fe->fe_shm, mw->slot);
		(void)shm_worker_mirror(fe->fe_shm, mw->slot, &sw);
		shm_prefill_rate_set(fe->fe_shm, mw->slot, mw->prefill_rate);
		seen[mw->slot] = true;
	}
	for (s = 0; s < SHM_MAX_WORKERS; s++)
		if (!seen[s] && shm_worker_read(fe->fe_shm, s, &cur) == 0)
			shm_worker_clear(fe->fe_shm, s);
	if (hostsync_generation != t->generation)
		log_info("%s: worker table of generation %llu: %zu workers",
		    __func__, (unsigned long long)t->generation, t->n_workers);
	hostsync_generation = t->generation;
}
