/*
 * remote.c: frontends on other hosts (--broker-listen). Each of their
 * frontends reports its shm row's live load with a HostSync every 100 ms;
 * the figures are summed per worker slot beside the local rows that
 * live.c reads, so every load-aware choice sees the whole fleet. A source
 * silent for REMOTE_SILENT_INTERVALS of its interval is forgotten. The
 * mirroring frontend (row 0) of each group long-polls the worker table
 * with a TableWait the broker holds until the registry generation moves;
 * a HostSync asking for the table (an older frontend) still gets it when
 * its generation is not the registry's.
 */
#include <stdlib.h>
#include <string.h>

#include "shared/ipc.h"
#include "shared/log.h"
#include "shared/sp.h"
#include "shared/xmalloc.h"

#include "broker.h"

#define REMOTE_SILENT_INTERVALS 3
#define REMOTE_MAX_SOURCES      1024
#define REMOTE_MIN_INTERVAL_MS  10
#define REMOTE_MAX_INTERVAL_MS  10000
#define REMOTE_MAX_WAITS        1024
#define REMOTE_WAIT_MIN_MS      100
#define REMOTE_WAIT_MAX_MS      60000
#define REMOTE_WAIT_DEFAULT_MS  5000

/* A held TableWait: answered when the generation moves or at deadline. */
struct remote_wait {
	struct sp_held *rw_held;
	uint64_t rw_generation; /* the sender's */
	uint64_t rw_deadline_ms;
};

/* One remote frontend: its figures as last reported. */
struct remote_source {
	char *rs_host;
	uint32_t rs_slot;
	uint64_t rs_seen_ms;
	uint32_t rs_interval_ms;
	size_t rs_n;
	uint32_t *rs_wslot; /* worker slots with figures */
	uint32_t *rs_inflight;
	uint64_t *rs_pending;
};

static void remote_drop_figures(struct broker *, struct remote_source *);
static void remote_forget(struct broker *, size_t);
static uint8_t *remote_table_reply(struct broker *, uint64_t, bool, size_t *);
static void remote_wait_answer(struct broker *, size_t, const uint8_t *,
    size_t);

uint32_t
remote_in_flight(const struct broker *br, unsigned slot)
{
	return slot < SHM_MAX_WORKERS ? br->br_remote_inflight[slot] : 0;
}

uint64_t
remote_pending(const struct broker *br, unsigned slot)
{
	return slot < SHM_MAX_WORKERS ? br->br_remote_pending[slot] : 0;
}

size_t
remote_nsources(const struct broker *br)
{
	return br->br_nsources;
}

static void
remote_drop_figures(struct broker *br, struct remote_source *rs)
{
	size_t i;
	uint32_t s;

	for (i = 0; i < rs->rs_n; i++) {
		s = rs->rs_wslot[i];
		br->br_remote_inflight[s] -= rs->rs_inflight[i];
		br->br_remote_pending[s] -= rs->rs_pending[i];
	}
	rs->rs_n = 0;
}

static void
remote_forget(struct broker *br, size_t i)
{
	struct remote_source *rs = br->br_sources[i];

	log_info("%s: %s frontend %u silent, its load forgotten", __func__,
	    rs->rs_host, rs->rs_slot);
	remote_drop_figures(br, rs);
	free(rs->rs_host);
	free(rs->rs_wslot);
	free(rs->rs_inflight);
	free(rs->rs_pending);
	free(rs);
	br->br_sources[i] = br->br_sources[--br->br_nsources];
}

void
remote_sweep(struct broker *br, uint64_t now_ms)
{
	struct remote_source *rs;
	size_t i = 0;

	while (i < br->br_nsources) {
		rs = br->br_sources[i];
		if (now_ms - rs->rs_seen_ms >
		    (uint64_t)REMOTE_SILENT_INTERVALS * rs->rs_interval_ms)
			remote_forget(br, i);
		else
			i++;
	}
}

static struct remote_source *
remote_find(struct broker *br, const Smg__HostSync *hs)
{
	size_t i;

	for (i = 0; i < br->br_nsources; i++)
		if (br->br_sources[i]->rs_slot == hs->frontend_slot &&
		    strcmp(br->br_sources[i]->rs_host, hs->host) == 0)
			return br->br_sources[i];
	return NULL;
}

void
remote_decided(struct broker *br, const Smg__HostSync *hs, uint32_t slot,
    uint64_t tokens)
{
	struct remote_source *rs;
	size_t k;

	if (slot >= SHM_MAX_WORKERS || hs->host == NULL ||
	    (rs = remote_find(br, hs)) == NULL)
		return;
	for (k = 0; k < rs->rs_n && rs->rs_wslot[k] != slot; k++)
		;
	if (k == rs->rs_n) {
		if (rs->rs_n == SHM_MAX_WORKERS)
			return;
		rs->rs_wslot[k] = slot;
		rs->rs_inflight[k] = 0;
		rs->rs_pending[k] = 0;
		rs->rs_n++;
	}
	rs->rs_inflight[k]++;
	rs->rs_pending[k] += tokens;
	br->br_remote_inflight[slot]++;
	br->br_remote_pending[slot] += tokens;
}

/* The figures of one report replace that source's previous ones. */
static void
remote_take(struct broker *br, const Smg__HostSync *hs, uint64_t now_ms)
{
	struct remote_source *rs = remote_find(br, hs);
	struct shm_worker sw;
	size_t i;

	if (rs == NULL) {
		if (br->br_nsources >= REMOTE_MAX_SOURCES) {
			log_warnx("%s: over %d remote frontends; %s ignored",
			    __func__, REMOTE_MAX_SOURCES, hs->host);
			return;
		}
		rs = xcalloc(1, sizeof(*rs));
		rs->rs_host = xstrdup(hs->host);
		rs->rs_slot = hs->frontend_slot;
		rs->rs_wslot = xcalloc(SHM_MAX_WORKERS, sizeof(*rs->rs_wslot));
		rs->rs_inflight =
		    xcalloc(SHM_MAX_WORKERS, sizeof(*rs->rs_inflight));
		rs->rs_pending =
		    xcalloc(SHM_MAX_WORKERS, sizeof(*rs->rs_pending));
		br->br_sources = xreallocarray(br->br_sources,
		    br->br_nsources + 1, sizeof(*br->br_sources));
		br->br_sources[br->br_nsources++] = rs;
		log_info("%s: remote frontend %s slot %u", __func__,
		    rs->rs_host, rs->rs_slot);
	}
	remote_drop_figures(br, rs);
	rs->rs_seen_ms = now_ms;
	rs->rs_interval_ms = hs->interval_ms < REMOTE_MIN_INTERVAL_MS
	    ? REMOTE_MIN_INTERVAL_MS
	    : hs->interval_ms > REMOTE_MAX_INTERVAL_MS ? REMOTE_MAX_INTERVAL_MS
	                                               : hs->interval_ms;
	for (i = 0; i < hs->n_live && rs->rs_n < SHM_MAX_WORKERS; i++) {
		const Smg__WorkerLive *lv = hs->live[i];

		/* Figures for a slot since given to another worker: none. */
		if (lv->slot >= SHM_MAX_WORKERS ||
		    shm_worker_read(br->br_shm, lv->slot, &sw) == -1 ||
		    sw.sw_generation != lv->generation)
			continue;
		rs->rs_wslot[rs->rs_n] = lv->slot;
		rs->rs_inflight[rs->rs_n] = lv->in_flight;
		rs->rs_pending[rs->rs_n] = lv->pending_tokens;
		br->br_remote_inflight[lv->slot] += lv->in_flight;
		br->br_remote_pending[lv->slot] += lv->pending_tokens;
		rs->rs_n++;
	}
}

/* The whole worker table for a mirroring host. */
static void
remote_table(struct broker *br, Smg__HostTable *t)
{
	struct shm_worker sw, *c;
	Smg__MirrorWorker *mw;
	unsigned s;

	t->workers = xcalloc(SHM_MAX_WORKERS, sizeof(*t->workers));
	for (s = 0; s < SHM_MAX_WORKERS; s++) {
		if (shm_worker_read(br->br_shm, s, &sw) == -1)
			continue;
		mw = xcalloc(1, sizeof(*mw) + sizeof(sw));
		smg__mirror_worker__init(mw);
		/* The strings point into a copy kept behind the message. */
		c = (struct shm_worker *)(void *)(mw + 1);
		*c = sw;
		mw->slot = s;
		mw->generation = c->sw_generation;
		mw->order = c->sw_order;
		mw->type = c->sw_type;
		mw->mode = c->sw_mode;
		mw->status = c->sw_status;
		mw->breaker = c->sw_breaker;
		mw->overloaded = c->sw_overloaded;
		mw->bootstrap_port = c->sw_bootstrap_port;
		mw->id = c->sw_id;
		mw->url = c->sw_url;
		mw->model = c->sw_model;
		mw->api_key = c->sw_api_key;
		mw->kv_endpoint = c->sw_kv_endpoint;
		mw->grpc_endpoint = c->sw_grpc_endpoint;
		mw->load_interval_secs = c->sw_load_interval_secs;
		mw->overload_on = c->sw_overload_on;
		mw->prefill_rate = shm_prefill_rate(br->br_shm, s);
		t->workers[t->n_workers++] = mw;
	}
}

void
remote_report(struct broker *br, const Smg__HostSync *hs)
{
	uint64_t now = shm_now_ms();

	if (hs->host == NULL || hs->host[0] == '\0')
		return;
	remote_sweep(br, now);
	remote_take(br, hs, now);
}

/*
 * A packed HostTable reply of generation gen, with the table when
 * with_table. gen is read before the copy: a change meanwhile is seen
 * next time.
 */
static uint8_t *
remote_table_reply(struct broker *br, uint64_t gen, bool with_table,
    size_t *reply_len)
{
	Smg__BrokerReply r = SMG__BROKER_REPLY__INIT;
	Smg__HostTable t = SMG__HOST_TABLE__INIT;
	uint8_t *out;
	size_t i;

	t.generation = gen;
	if (with_table) {
		t.has_table = true;
		remote_table(br, &t);
	}
	r.version = IPC_VERSION;
	r.body_case = SMG__BROKER_REPLY__BODY_HOST_TABLE;
	r.host_table = &t;
	out = ipc_pack_broker(&r, reply_len);
	for (i = 0; i < t.n_workers; i++)
		free(t.workers[i]);
	free(t.workers);
	return out;
}

uint8_t *
remote_sync(struct broker *br, const Smg__HostSync *hs, size_t *reply_len)
{
	uint64_t gen;

	if (hs->host == NULL || hs->host[0] == '\0')
		return ipc_pack_error("malformed", "host sync without a host",
		    reply_len);
	remote_report(br, hs);
	gen = shm_workers_generation(br->br_shm);
	return remote_table_reply(br, gen,
	    hs->want_table && hs->table_generation != gen, reply_len);
}

uint8_t *
remote_table_wait(struct broker *br, const Smg__TableWait *tw,
    size_t *reply_len)
{
	struct remote_wait *rw;
	struct sp_held *h;
	uint64_t gen = shm_workers_generation(br->br_shm);
	uint32_t ms = tw->wait_ms;

	if (tw->generation != gen)
		return remote_table_reply(br, gen, true, reply_len);
	/* Held: over the cap or outside a REP callback, "unchanged" now. */
	if (br->br_nwaits >= REMOTE_MAX_WAITS || (h = sp_server_hold()) == NULL)
		return remote_table_reply(br, gen, false, reply_len);
	if (ms == 0)
		ms = REMOTE_WAIT_DEFAULT_MS;
	ms = ms < REMOTE_WAIT_MIN_MS  ? REMOTE_WAIT_MIN_MS
	    : ms > REMOTE_WAIT_MAX_MS ? REMOTE_WAIT_MAX_MS
	                              : ms;
	br->br_waits = xreallocarray(br->br_waits, br->br_nwaits + 1,
	    sizeof(*br->br_waits));
	rw = &br->br_waits[br->br_nwaits++];
	rw->rw_held = h;
	rw->rw_generation = gen;
	rw->rw_deadline_ms = shm_now_ms() + ms;
	br->br_waits_gen = gen;
	*reply_len = 0;
	return NULL;
}

/* Answers wait i with a copy of the packed reply (none: dropped). */
static void
remote_wait_answer(struct broker *br, size_t i, const uint8_t *packed,
    size_t len)
{
	struct sp_held *h = br->br_waits[i].rw_held;
	uint8_t *copy;

	br->br_waits[i] = br->br_waits[--br->br_nwaits];
	if (packed == NULL || !sp_held_alive(h)) {
		sp_held_drop(h);
		return;
	}
	copy = xmalloc(len > 0 ? len : 1);
	memcpy(copy, packed, len);
	sp_held_reply(h, copy, len);
}

void
remote_waits_check(struct broker *br)
{
	uint64_t gen;
	uint8_t *table = NULL;
	size_t len = 0, i = 0;

	if (br->br_nwaits == 0 ||
	    (gen = shm_workers_generation(br->br_shm)) == br->br_waits_gen)
		return;
	br->br_waits_gen = gen;
	while (i < br->br_nwaits) {
		if (br->br_waits[i].rw_generation == gen) {
			i++;
			continue;
		}
		/* One table for every waiter of this change. */
		if (table == NULL &&
		    (table = remote_table_reply(br, gen, true, &len)) == NULL) {
			log_warnx("%s: cannot pack the worker table", __func__);
			return;
		}
		remote_wait_answer(br, i, table, len);
	}
	free(table);
}

void
remote_waits_sweep(struct broker *br, uint64_t now_ms)
{
	uint8_t *same = NULL;
	size_t len = 0, i = 0;

	while (i < br->br_nwaits) {
		if (!sp_held_alive(br->br_waits[i].rw_held)) {
			remote_wait_answer(br, i, NULL, 0);
			continue;
		}
		if (now_ms < br->br_waits[i].rw_deadline_ms) {
			i++;
			continue;
		}
		/* Only waits still at the current generation are left. */
		if (same == NULL &&
		    (same = remote_table_reply(br, br->br_waits_gen, false,
		         &len)) == NULL)
			return;
		remote_wait_answer(br, i, same, len);
	}
	free(same);
}

void
remote_free(struct broker *br)
{
	while (br->br_nsources > 0)
		remote_forget(br, br->br_nsources - 1);
	while (br->br_nwaits > 0)
		remote_wait_answer(br, br->br_nwaits - 1, NULL, 0);
	free(br->br_waits);
	br->br_waits = NULL;
	free(br->br_sources);
	br->br_sources = NULL;
}
