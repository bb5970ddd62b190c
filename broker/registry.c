/*
 * registry.c: the broker's workers. Owns every struct worker, the global
 * registration-order list, the per-model ordered indexes and the shm slot
 * of each worker; every change is mirrored into the shm worker table at
 * once and, for API-added workers, queued for the store. What others
 * keep per worker or per model (breaker, policies, KV index) follows
 * through the registry observers; the registry calls none of them.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "shared/config.h"
#include "shared/log.h"
#include "shared/url.h"
#include "shared/metrics.h"
#include "shared/uuid.h"
#include "shared/xmalloc.h"

#include "broker.h"

static struct worker *registry_find_url(struct broker *br, const char *url);
static int64_t registry_overload_waiting(const struct config *cf);
static double registry_overload_token_usage(const struct config *cf);
static int registry_pick_slot(struct broker *br, const char *url,
    bool *adopted);
static void registry_index(struct broker *br, struct worker *w);
static void registry_unindex(struct broker *br, struct worker *w);
static void registry_model_free(struct broker *br, struct model_entry *me);
static void registry_drain_cb(struct ev_loop *loop, ev_timer *t, int revents);
static void registry_worker_free(struct worker *w);
static void registry_pool_track(struct broker *br, int series);
static void registry_overload_count(struct broker *br, struct model_entry *me,
    int delta);

/* The overload veto's defaults of gateway.md §8: 0 = none. */
static int64_t
registry_overload_waiting(const struct config *cf)
{
	return cf->cf_worker_overload_waiting_requests_set
	    ? cf->cf_worker_overload_waiting_requests
	    : 0;
}

static double
registry_overload_token_usage(const struct config *cf)
{
	if (cf->cf_worker_overload_token_usage_set)
		return cf->cf_worker_overload_token_usage;
	return cf->cf_worker_overload_protection ? 0.9 : 0;
}

/* The observer calls, one per member of struct registry_observer. */
enum registry_event {
	REGISTRY_WORKER_NEW = 0,
	REGISTRY_MODEL_NEW,
	REGISTRY_MODEL_GONE,
	REGISTRY_WORKER_ADDED,
	REGISTRY_WORKER_MOVED,
	REGISTRY_WORKER_REMOVED,
};

static void registry_tell(struct broker *br, enum registry_event ev,
    struct worker *w, struct model_entry *me);

void
registry_observe(struct broker *br, const struct registry_observer *ro)
{
	if (br->br_nobservers == REGISTRY_MAX_OBSERVERS)
		fatalx("%s: too many registry observers", __func__);
	br->br_observers[br->br_nobservers++] = ro;
}

static void
registry_tell(struct broker *br, enum registry_event ev, struct worker *w,
    struct model_entry *me)
{
	const struct registry_observer *ro;
	unsigned i;

	for (i = 0; i < br->br_nobservers; i++) {
		ro = br->br_observers[i];
		switch (ev) {
		case REGISTRY_WORKER_NEW:
			if (ro->ro_worker_new != NULL)
				ro->ro_worker_new(br, w);
			break;
		case REGISTRY_MODEL_NEW:
			if (ro->ro_model_new != NULL)
				ro->ro_model_new(br, me, w);
			break;
		case REGISTRY_MODEL_GONE:
			if (ro->ro_model_gone != NULL)
				ro->ro_model_gone(br, me);
			break;
		case REGISTRY_WORKER_ADDED:
			if (ro->ro_worker_added != NULL)
				ro->ro_worker_added(br, w);
			break;
		case REGISTRY_WORKER_MOVED:
			if (ro->ro_worker_moved != NULL)
				ro->ro_worker_moved(br, w);
			break;
		case REGISTRY_WORKER_REMOVED:
			if (ro->ro_worker_removed != NULL)
				ro->ro_worker_removed(br, w);
			break;
		}
	}
}

int
registry_normalize_url(const char *url, char *buf, size_t len, char *err,
    size_t errlen)
{
	size_t n, i;

	if (url == NULL || *url == '\0') {
		snprintf(err, errlen, "url is empty");
		return -1;
	}
	n = strlen(url);
	while (n > 0 && url[n - 1] == '/')
		n--;
	if (n == 0 || n >= len || n >= SHM_URL_MAX) {
		snprintf(err, errlen, "url length is out of range");
		return -1;
	}
	for (i = 0; i < n; i++) {
		unsigned char c = (unsigned char)url[i];

		if (c <= ' ' || c == 0x7f || c == '"' || c == '\\') {
			snprintf(err, errlen,
			    "url contains a space, quote or control character");
			return -1;
		}
	}
	memcpy(buf, url, n);
	buf[n] = '\0';
	return config_check_worker_url(buf, err, errlen);
}

/*
 * A worker's id: the one it had (the store, or the shm slot a previous
 * broker gave it) when that is a UUID, else a new version 7 UUID. Ids of
 * older stores (16 hex digits) are replaced; the record is rewritten.
 */
static void
registry_assign_id(struct worker *w, const char *given, const char *slot_id)
{
	if (given != NULL && uuid_canonical(given))
		snprintf(w->wk_id, sizeof(w->wk_id), "%s", given);
	else if (slot_id != NULL && uuid_canonical(slot_id))
		snprintf(w->wk_id, sizeof(w->wk_id), "%s", slot_id);
	else
		uuid_v7(w->wk_id);
}

const char *
registry_type_name(int type)
{
	switch (type) {
	case SMG__WORKER_TYPE__WORKER_TYPE_PREFILL:
		return "prefill";
	case SMG__WORKER_TYPE__WORKER_TYPE_DECODE:
		return "decode";
	case SMG__WORKER_TYPE__WORKER_TYPE_ENCODE:
		return "encode";
	default:
		return "regular";
	}
}

const char *
registry_mode_name(int mode)
{
	switch (mode) {
	case SMG__CONNECTION_MODE__CONNECTION_MODE_GRPC:
		return "grpc";
	case SMG__CONNECTION_MODE__CONNECTION_MODE_ZMQ:
		return "zmq";
	default:
		return "http";
	}
}

const char *
registry_status_name(enum shm_worker_status st)
{
	switch (st) {
	case SHM_WORKER_PENDING:
		return "Pending";
	case SHM_WORKER_READY:
		return "Ready";
	case SHM_WORKER_NOT_READY:
		return "NotReady";
	case SHM_WORKER_FAILED:
		return "Failed";
	case SHM_WORKER_DRAINING:
		return "Draining";
	}
	return "Unknown";
}

void
registry_adopt_begin(struct broker *br)
{
	unsigned i;

	br->br_adopt = xcalloc(SHM_MAX_WORKERS, sizeof(*br->br_adopt));
	br->br_adopted = xcalloc(SHM_MAX_WORKERS, sizeof(*br->br_adopted));
	for (i = 0; i < SHM_MAX_WORKERS; i++) {
		if (shm_worker_read(br->br_shm, i, &br->br_adopt[i]) == -1)
			br->br_adopt[i].sw_in_use = 0;
	}
}

void
registry_adopt_end(struct broker *br)
{
	unsigned i;

	if (br->br_adopt == NULL)
		return;
	for (i = 0; i < SHM_MAX_WORKERS; i++) {
		if (br->br_adopt[i].sw_in_use && !br->br_adopted[i] &&
		    br->br_slots[i] == NULL) {
			log_info("%s: dropping stale slot %u (%s)", __func__, i,
			    br->br_adopt[i].sw_url);
			shm_worker_clear(br->br_shm, i);
		}
	}
	free(br->br_adopt);
	free(br->br_adopted);
	br->br_adopt = NULL;
	br->br_adopted = NULL;
}

static struct worker *
registry_find_url(struct broker *br, const char *url)
{
	unsigned i;

	for (i = 0; i < br->br_nworkers; i++) {
		if (strcmp(br->br_order[i]->wk_url, url) == 0)
			return br->br_order[i];
	}
	return NULL;
}

struct worker *
registry_find(struct broker *br, const char *id_or_url)
{
	char url[SHM_URL_MAX];
	size_t n;
	unsigned i;

	if (id_or_url == NULL)
		return NULL;
	for (i = 0; i < br->br_nworkers; i++) {
		if (strcmp(br->br_order[i]->wk_id, id_or_url) == 0)
			return br->br_order[i];
	}
	n = strlen(id_or_url);
	while (n > 0 && id_or_url[n - 1] == '/')
		n--;
	if (n == 0 || n >= sizeof(url))
		return NULL;
	memcpy(url, id_or_url, n);
	url[n] = '\0';
	return registry_find_url(br, url);
}

unsigned
registry_find_ranks(struct broker *br, const char *base, struct worker **out,
    unsigned max)
{
	size_t n = strlen(base);
	unsigned i, found = 0;

	while (n > 0 && base[n - 1] == '/')
		n--;
	if (n == 0 || url_rank(base) >= 0)
		return 0;
	for (i = 0; i < br->br_nworkers; i++) {
		const char *u = br->br_order[i]->wk_url;

		if (strncmp(u, base, n) == 0 && u[n] == '@' &&
		    url_rank(u) >= 0 && strrchr(u, '@') == u + n) {
			if (found < max)
				out[found] = br->br_order[i];
			found++;
		}
	}
	return found;
}

int
registry_expand(struct broker *br, struct worker *w, unsigned size)
{
	struct worker_spec ws;
	struct worker *r;
	char url[SHM_URL_MAX];
	const char *why;
	unsigned i;

	if (size == 0 || size > SHM_MAX_WORKERS - br->br_nworkers + 1) {
		log_warnx("%s: %s reports %u data-parallel ranks; the worker "
		          "table has room for %u more: kept as one worker",
		    __func__, w->wk_url, size,
		    SHM_MAX_WORKERS - br->br_nworkers + 1);
		return -1;
	}
	if ((size_t)snprintf(url, sizeof(url), "%s@%u", w->wk_url, size - 1) >=
	    sizeof(url)) {
		log_warnx("%s: %s: rank URLs too long: kept as one worker",
		    __func__, w->wk_url);
		return -1;
	}
	memset(&ws, 0, sizeof(ws));
	ws.ws_url = url;
	ws.ws_model = w->wk_model;
	ws.ws_runtime = w->wk_runtime;
	ws.ws_type = w->wk_type;
	ws.ws_mode = w->wk_mode;
	ws.ws_api_key = w->wk_api_key;
	ws.ws_bootstrap_port = w->wk_bootstrap_port;
	ws.ws_priority = w->wk_priority;
	ws.ws_cost = w->wk_cost;
	ws.ws_labels = w->wk_labels;
	ws.ws_spec = w->wk_spec;
	ws.ws_from_cli = w->wk_from_cli;
	ws.ws_health_disabled = w->wk_health_disabled;
	ws.ws_ov_waiting = w->wk_ov_waiting;
	ws.ws_ov_token_usage = w->wk_ov_token_usage;
	ws.ws_load_interval_secs = w->wk_load_interval_secs;
	log_info("%s: %s has %u data-parallel ranks: one worker each", __func__,
	    w->wk_url, size);
	/* Slots are counted above: only a rank URL already taken fails. */
	for (i = 0; i < size; i++) {
		snprintf(url, sizeof(url), "%s@%u", w->wk_url, i);
		if ((r = registry_add(br, &ws, w->wk_persist, &why)) == NULL) {
			log_warnx("%s: %s: %s", __func__, url, why);
			continue;
		}
		r->wk_dp_size = size;
		if (r->wk_status == SHM_WORKER_PENDING)
			registry_set_status(br, r, SHM_WORKER_READY);
	}
	registry_remove(br, w);
	return 0;
}

struct worker *
registry_by_slot(struct broker *br, unsigned slot, uint32_t generation)
{
	struct worker *w;

	if (slot >= SHM_MAX_WORKERS || (w = br->br_slots[slot]) == NULL)
		return NULL;
	return w->wk_generation == generation ? w : NULL;
}

/* A slot for url: the one a previous broker gave it, else a free one. */
static int
registry_pick_slot(struct broker *br, const char *url, bool *adopted)
{
	struct shm_segment *seg = shm_segment(br->br_shm);
	unsigned i;

	*adopted = false;
	if (br->br_adopt != NULL) {
		for (i = 0; i < SHM_MAX_WORKERS; i++) {
			if (br->br_adopt[i].sw_in_use && !br->br_adopted[i] &&
			    br->br_slots[i] == NULL &&
			    strcmp(br->br_adopt[i].sw_url, url) == 0) {
				br->br_adopted[i] = true;
				*adopted = true;
				return (int)i;
			}
		}
	}
	for (i = 0; i < SHM_MAX_WORKERS; i++) {
		if (br->br_slots[i] != NULL)
			continue;
		if (br->br_adopt != NULL && br->br_adopt[i].sw_in_use &&
		    !br->br_adopted[i])
			continue; /* may still be adopted at startup */
		if (br->br_adopt == NULL && seg->sh_workers[i].ws_w.sw_in_use)
			continue;
		return (int)i;
	}
	return -1;
}

struct model_entry *
registry_model_find(struct broker *br, const char *name)
{
	unsigned i;

	for (i = 0; i < br->br_nmodels; i++) {
		if (strcmp(br->br_models[i]->me_name, name) == 0)
			return br->br_models[i];
	}
	return NULL;
}

/* Whether w's spec lists name among the aliases of its first model. */
static bool
registry_has_alias(const struct worker *w, const char *name)
{
	const cJSON *m, *a;

	m = cJSON_GetArrayItem(
	    cJSON_GetObjectItemCaseSensitive(w->wk_spec, "models"), 0);
	cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(m, "aliases"))
	{
		if (cJSON_IsString(a) && strcmp(a->valuestring, name) == 0)
			return true;
	}
	return false;
}

const char *
registry_resolve_alias(struct broker *br, const char *name)
{
	struct worker *w;
	unsigned i;

	if (name == NULL || *name == '\0' ||
	    strcmp(name, BROKER_MODEL_UNKNOWN) == 0 ||
	    registry_model_find(br, name) != NULL)
		return NULL;
	/* First registered wins, as an alias may name only one model. */
	for (i = 0; i < br->br_nworkers; i++) {
		w = br->br_order[i];
		if (w->wk_spec != NULL &&
		    strcmp(w->wk_model, BROKER_MODEL_UNKNOWN) != 0 &&
		    registry_has_alias(w, name))
			return w->wk_model;
	}
	return NULL;
}

struct model_entry *
registry_model(struct broker *br, const char *name)
{
	struct model_entry *me;
	unsigned i, t, m;

	if (name == NULL || *name == '\0')
		name = BROKER_MODEL_UNKNOWN;
	for (i = 0; i < br->br_nmodels; i++) {
		if (strcmp(br->br_models[i]->me_name, name) == 0)
			return br->br_models[i];
	}
	me = xcalloc(1, sizeof(*me));
	me->me_name = xstrdup(name);
	for (t = 0; t < BROKER_NTYPES; t++)
		for (m = 0; m < BROKER_NMODES; m++)
			me->me_sel_series[t][m] = -2;
	me->me_m_overloaded = -2;
	br->br_models = xreallocarray(br->br_models, br->br_nmodels + 1,
	    sizeof(*br->br_models));
	br->br_models[br->br_nmodels++] = me;
	return me;
}

static void
registry_model_free(struct broker *br, struct model_entry *me)
{
	unsigned i;

	for (i = 0; i < br->br_nmodels; i++) {
		if (br->br_models[i] == me) {
			memmove(&br->br_models[i], &br->br_models[i + 1],
			    (br->br_nmodels - i - 1) * sizeof(*br->br_models));
			br->br_nmodels--;
			break;
		}
	}
	if (me->me_m_overloaded >= 0)
		stats_set(br, me->me_m_overloaded, 0);
	registry_tell(br, REGISTRY_MODEL_GONE, NULL, me);
	free(me->me_workers);
	free(me->me_name);
	free(me);
}

/* Into the model index, keeping registration order. */
static void
registry_index(struct broker *br, struct worker *w)
{
	struct model_entry *me = registry_model(br, w->wk_model);
	unsigned pos;

	if (me->me_n == me->me_cap) {
		me->me_cap = me->me_cap ? me->me_cap * 2 : 4;
		me->me_workers = xreallocarray(me->me_workers, me->me_cap,
		    sizeof(*me->me_workers));
	}
	pos = me->me_n;
	while (pos > 0 && me->me_workers[pos - 1]->wk_order > w->wk_order)
		pos--;
	memmove(&me->me_workers[pos + 1], &me->me_workers[pos],
	    (me->me_n - pos) * sizeof(*me->me_workers));
	me->me_workers[pos] = w;
	me->me_n++;
	w->wk_me = me;
	if (me->me_n == 1)
		registry_tell(br, REGISTRY_MODEL_NEW, w, me);
	if (w->wk_overloaded)
		registry_overload_count(br, me, 1);
}

static void
registry_unindex(struct broker *br, struct worker *w)
{
	struct model_entry *me = w->wk_me;
	unsigned i;

	if (me == NULL)
		return;
	for (i = 0; i < me->me_n; i++) {
		if (me->me_workers[i] == w) {
			memmove(&me->me_workers[i], &me->me_workers[i + 1],
			    (me->me_n - i - 1) * sizeof(*me->me_workers));
			me->me_n--;
			break;
		}
	}
	if (w->wk_overloaded)
		registry_overload_count(br, me, -1);
	w->wk_me = NULL;
	/* The model's policy mapping goes with its last worker (§13). */
	if (me->me_n == 0)
		registry_model_free(br, me);
}

struct worker *
registry_add(struct broker *br, const struct worker_spec *ws, bool persist,
    const char **why)
{
	struct shm_segment *seg = shm_segment(br->br_shm);
	const struct shm_worker *old = NULL;
	struct worker *w;
	char u[SHM_URL_MAX * 2];
	bool adopted;
	int slot;

	/* An engine is registered once: by its URL or by its ranks. */
	if (registry_find_url(br, ws->ws_url) != NULL ||
	    registry_find_ranks(br, ws->ws_url, NULL, 0) > 0) {
		*why = "exists";
		return NULL;
	}
	if ((slot = registry_pick_slot(br, ws->ws_url, &adopted)) == -1) {
		*why = "full";
		return NULL;
	}
	w = xcalloc(1, sizeof(*w));
	w->wk_url = xstrdup(ws->ws_url);
	w->wk_url_hash = XXH3_64bits(w->wk_url, strlen(w->wk_url));
	w->wk_model = xstrdup(ws->ws_model != NULL && *ws->ws_model != '\0'
	        ? ws->ws_model
	        : BROKER_MODEL_UNKNOWN);
	w->wk_runtime = xstrdup(ws->ws_runtime != NULL ? ws->ws_runtime : "");
	w->wk_type = ws->ws_type;
	w->wk_mode = ws->ws_mode;
	w->wk_api_key = ws->ws_api_key != NULL && *ws->ws_api_key != '\0'
	    ? xstrdup(ws->ws_api_key)
	    : NULL;
	w->wk_bootstrap_port = ws->ws_bootstrap_port;
	w->wk_priority = ws->ws_priority;
	w->wk_cost = ws->ws_cost;
	w->wk_labels = ws->ws_labels != NULL ? cJSON_Duplicate(ws->ws_labels, 1)
	                                     : cJSON_CreateObject();
	w->wk_spec =
	    ws->ws_spec != NULL ? cJSON_Duplicate(ws->ws_spec, 1) : NULL;
	if (w->wk_spec != NULL)
		cJSON_DeleteItemFromObjectCaseSensitive(w->wk_spec, "api_key");
	if (w->wk_labels == NULL)
		fatalx("%s: out of memory", __func__);
	w->wk_from_cli = ws->ws_from_cli;
	w->wk_discovered = ws->ws_discovered;
	w->wk_persist = persist;
	w->wk_health_disabled =
	    ws->ws_health_disabled || br->br_cf->cf_disable_health_check;
	w->wk_status =
	    w->wk_health_disabled ? SHM_WORKER_READY : SHM_WORKER_PENDING;
	w->wk_ov_waiting = ws->ws_ov_waiting > 0
	    ? ws->ws_ov_waiting
	    : registry_overload_waiting(br->br_cf);
	w->wk_ov_token_usage = ws->ws_ov_token_usage > 0
	    ? ws->ws_ov_token_usage
	    : registry_overload_token_usage(br->br_cf);
	w->wk_load_interval_secs = ws->ws_load_interval_secs;
	w->wk_order = br->br_next_order++;
	w->wk_slot = (unsigned)slot;
	if (adopted) {
		/* Same worker as before our restart: keep what it had. */
		old = &br->br_adopt[slot];
		w->wk_generation = old->sw_generation;
		if (!w->wk_health_disabled &&
		    (old->sw_status == SHM_WORKER_READY ||
		        old->sw_status == SHM_WORKER_NOT_READY))
			w->wk_status = old->sw_status;
		if (strcmp(w->wk_model, BROKER_MODEL_UNKNOWN) == 0 &&
		    old->sw_model[0] != '\0') {
			free(w->wk_model);
			w->wk_model = xstrdup(old->sw_model);
		}
		registry_assign_id(w, ws->ws_id, old->sw_id);
	} else {
		registry_assign_id(w, ws->ws_id, NULL);
		w->wk_generation = seg->sh_workers[slot].ws_w.sw_generation + 1;
		shm_inflight_reset_slot(br->br_shm, (unsigned)slot);
	}
	br->br_slots[slot] = w;
	br->br_order = xreallocarray(br->br_order, br->br_nworkers + 1,
	    sizeof(*br->br_order));
	br->br_order[br->br_nworkers++] = w;
	ev_init(&w->wk_drain, registry_drain_cb);
	w->wk_drain.data = br;
	stats_label_escape(u, sizeof(u), w->wk_url);
	w->wk_m_health = stats_series(br, METRICS_GAUGE, "smg_worker_health",
	    "worker=\"%s\"", u);
	w->wk_m_active = stats_series(br, METRICS_GAUGE,
	    "smg_worker_requests_active", "worker=\"%s\"", u);
	stats_set(br, w->wk_m_health, w->wk_status == SHM_WORKER_READY);
	registry_tell(br, REGISTRY_WORKER_NEW, w, NULL);
	registry_index(br, w);
	registry_publish(br, w);
	registry_persist(br, w);
	registry_tell(br, REGISTRY_WORKER_ADDED, w, NULL);
	registry_update_pool_metrics(br);
	log_info("%s: worker %s id %s %s/%s model %s slot %u%s: %s", __func__,
	    w->wk_url, w->wk_id, registry_type_name(w->wk_type),
	    registry_mode_name(w->wk_mode), w->wk_model, w->wk_slot,
	    adopted ? " (kept)" : "", registry_status_name(w->wk_status));
	return w;
}

static void
registry_worker_free(struct worker *w)
{
	free(w->wk_url);
	free(w->wk_model);
	free(w->wk_runtime);
	free(w->wk_api_key);
	free(w->wk_error);
	cJSON_Delete(w->wk_labels);
	cJSON_Delete(w->wk_spec);
	free(w);
}

void
registry_remove(struct broker *br, struct worker *w)
{
	unsigned i;

	log_info("%s: worker %s removed (slot %u)", __func__, w->wk_url,
	    w->wk_slot);
	ev_timer_stop(br->br_loop, &w->wk_drain);
	registry_tell(br, REGISTRY_WORKER_REMOVED, w, NULL);
	registry_unindex(br, w);
	for (i = 0; i < br->br_nworkers; i++) {
		if (br->br_order[i] == w) {
			memmove(&br->br_order[i], &br->br_order[i + 1],
			    (br->br_nworkers - i - 1) * sizeof(*br->br_order));
			br->br_nworkers--;
			break;
		}
	}
	br->br_slots[w->wk_slot] = NULL;
	shm_worker_clear(br->br_shm, w->wk_slot);
	if (w->wk_persist)
		store_del(br->br_store, w->wk_url);
	stats_set(br, w->wk_m_health, 0);
	stats_set(br, w->wk_m_active, 0);
	registry_worker_free(w);
	registry_update_pool_metrics(br);
}

static void
registry_drain_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct worker *w =
	    (struct worker *)((char *)t - offsetof(struct worker, wk_drain));

	(void)loop;
	(void)revents;
	registry_remove(t->data, w);
}

void
registry_drain(struct broker *br, struct worker *w)
{
	if (w->wk_status == SHM_WORKER_DRAINING)
		return;
	registry_set_status(br, w, SHM_WORKER_DRAINING);
	/* Gone from the store now: a restart must not bring it back. */
	if (w->wk_persist) {
		store_del(br->br_store, w->wk_url);
		w->wk_persist = false;
	}
	ev_timer_set(&w->wk_drain, br->br_cf->cf_drain_settle_secs, 0.);
	ev_timer_start(br->br_loop, &w->wk_drain);
}

void
registry_set_model(struct broker *br, struct worker *w, const char *model)
{
	if (model == NULL || *model == '\0')
		model = BROKER_MODEL_UNKNOWN;
	if (strcmp(w->wk_model, model) == 0)
		return;
	log_info("%s: worker %s model %s -> %s", __func__, w->wk_url,
	    w->wk_model, model);
	registry_unindex(br, w);
	registry_tell(br, REGISTRY_WORKER_MOVED, w, NULL);
	free(w->wk_model);
	w->wk_model = xstrdup(model);
	registry_index(br, w);
	registry_tell(br, REGISTRY_WORKER_ADDED, w, NULL);
	registry_publish(br, w);
	registry_persist(br, w);
	registry_update_pool_metrics(br);
}

void
registry_update(struct broker *br, struct worker *w,
    const struct worker_spec *ws)
{
	cJSON *labels, *spec;
	bool moved = (ws->ws_model != NULL && *ws->ws_model != '\0' &&
	                 strcmp(ws->ws_model, w->wk_model) != 0) ||
	    ws->ws_type != w->wk_type || ws->ws_mode != w->wk_mode;

	log_info("%s: worker %s replaced%s", __func__, w->wk_url,
	    moved ? " (pool changed)" : "");
	if (moved) {
		registry_unindex(br, w);
		registry_tell(br, REGISTRY_WORKER_MOVED, w, NULL);
		if (ws->ws_model != NULL && *ws->ws_model != '\0') {
			char *m = xstrdup(ws->ws_model);

			free(w->wk_model);
			w->wk_model = m;
		}
		w->wk_type = ws->ws_type;
		w->wk_mode = ws->ws_mode;
	}
	if (ws->ws_runtime != NULL && ws->ws_runtime != w->wk_runtime) {
		free(w->wk_runtime);
		w->wk_runtime = xstrdup(ws->ws_runtime);
	}
	if (ws->ws_api_key != NULL && ws->ws_api_key != w->wk_api_key) {
		free(w->wk_api_key);
		w->wk_api_key =
		    *ws->ws_api_key != '\0' ? xstrdup(ws->ws_api_key) : NULL;
	}
	w->wk_bootstrap_port = ws->ws_bootstrap_port;
	w->wk_priority = ws->ws_priority;
	w->wk_cost = ws->ws_cost;
	/* ws may point into w: copy before freeing. */
	labels = ws->ws_labels != NULL ? cJSON_Duplicate(ws->ws_labels, 1)
	                               : cJSON_CreateObject();
	spec = ws->ws_spec != NULL ? cJSON_Duplicate(ws->ws_spec, 1) : NULL;
	cJSON_Delete(w->wk_labels);
	cJSON_Delete(w->wk_spec);
	w->wk_labels = labels;
	w->wk_spec = spec;
	if (w->wk_spec != NULL)
		cJSON_DeleteItemFromObjectCaseSensitive(w->wk_spec, "api_key");
	if (w->wk_labels == NULL)
		fatalx("%s: out of memory", __func__);
	w->wk_health_disabled =
	    ws->ws_health_disabled || br->br_cf->cf_disable_health_check;
	if (w->wk_health_disabled && w->wk_status != SHM_WORKER_DRAINING)
		w->wk_status = SHM_WORKER_READY; /* nothing will probe it */
	stats_set(br, w->wk_m_health, w->wk_status == SHM_WORKER_READY);
	w->wk_ov_waiting = ws->ws_ov_waiting > 0
	    ? ws->ws_ov_waiting
	    : registry_overload_waiting(br->br_cf);
	w->wk_ov_token_usage = ws->ws_ov_token_usage > 0
	    ? ws->ws_ov_token_usage
	    : registry_overload_token_usage(br->br_cf);
	if (moved) {
		registry_index(br, w);
		registry_tell(br, REGISTRY_WORKER_ADDED, w, NULL);
	}
	registry_publish(br, w);
	registry_persist(br, w);
	registry_update_pool_metrics(br);
}

void
registry_set_status(struct broker *br, struct worker *w,
    enum shm_worker_status st)
{
	if (w->wk_status == st)
		return;
	/* Losing a worker is what an operator must see at the default level. */
	if (st == SHM_WORKER_NOT_READY || st == SHM_WORKER_FAILED)
		log_warnx("%s: worker %s %s -> %s", __func__, w->wk_url,
		    registry_status_name(w->wk_status),
		    registry_status_name(st));
	else
		log_info("%s: worker %s %s -> %s", __func__, w->wk_url,
		    registry_status_name(w->wk_status),
		    registry_status_name(st));
	w->wk_status = st;
	stats_set(br, w->wk_m_health, st == SHM_WORKER_READY);
	registry_publish(br, w);
}

static void
registry_overload_count(struct broker *br, struct model_entry *me, int delta)
{
	char m[SHM_MODEL_MAX * 2];

	me->me_overloaded += delta;
	if (me->me_overloaded < 0)
		me->me_overloaded = 0;
	if (me->me_m_overloaded == -2) {
		stats_label_escape(m, sizeof(m), me->me_name);
		me->me_m_overloaded = stats_series(br, METRICS_GAUGE,
		    "smg_workers_overloaded", "model=\"%s\"", m);
	}
	stats_set(br, me->me_m_overloaded, me->me_overloaded);
}

void
registry_set_overloaded(struct broker *br, struct worker *w, bool on)
{
	if (w->wk_overloaded == on)
		return;
	log_info("%s: worker %s overload %s", __func__, w->wk_url,
	    on ? "on" : "off");
	w->wk_overloaded = on;
	if (w->wk_me != NULL)
		registry_overload_count(br, w->wk_me, on ? 1 : -1);
	registry_publish(br, w);
}

void
registry_publish(struct broker *br, struct worker *w)
{
	const cJSON *kv;
	struct shm_worker sw;

	memset(&sw, 0, sizeof(sw));
	sw.sw_in_use = 1;
	sw.sw_generation = w->wk_generation;
	sw.sw_order = w->wk_order;
	sw.sw_type = (uint32_t)w->wk_type;
	sw.sw_mode = (uint32_t)w->wk_mode;
	sw.sw_status = w->wk_status;
	sw.sw_breaker = w->wk_cb.cb_state;
	sw.sw_overloaded = w->wk_overloaded;
	sw.sw_bootstrap_port = w->wk_bootstrap_port;
	/* The poller's per-worker schedule (gateway.md §8, §9.1). */
	sw.sw_load_interval_secs = w->wk_load_interval_secs;
	sw.sw_overload_on = w->wk_ov_waiting > 0 || w->wk_ov_token_usage > 0;
	snprintf(sw.sw_id, sizeof(sw.sw_id), "%s", w->wk_id);
	snprintf(sw.sw_url, sizeof(sw.sw_url), "%s", w->wk_url);
	snprintf(sw.sw_model, sizeof(sw.sw_model), "%s", w->wk_model);
	if (w->wk_api_key != NULL)
		snprintf(sw.sw_api_key, sizeof(sw.sw_api_key), "%s",
		    w->wk_api_key);
	/* The poller subscribes there (workers.md §6.4, cache_aware). */
	kv = cJSON_GetObjectItemCaseSensitive(w->wk_labels,
	    "kv_events_endpoint");
	if (cJSON_IsString(kv) &&
	    strlen(kv->valuestring) < sizeof(sw.sw_kv_endpoint))
		memcpy(sw.sw_kv_endpoint, kv->valuestring,
		    strlen(kv->valuestring) + 1);
	/* Loads and KV events over gRPC for an HTTP worker (workers.md §4). */
	kv = cJSON_GetObjectItemCaseSensitive(w->wk_labels, "grpc_endpoint");
	if (cJSON_IsString(kv) &&
	    strlen(kv->valuestring) < sizeof(sw.sw_grpc_endpoint))
		memcpy(sw.sw_grpc_endpoint, kv->valuestring,
		    strlen(kv->valuestring) + 1);
	shm_worker_write(br->br_shm, w->wk_slot, &sw);
}

char *
registry_record_json(const struct worker *w)
{
	cJSON *o, *ov;
	char *s;

	if ((o = cJSON_CreateObject()) == NULL)
		fatalx("%s: out of memory", __func__);
	cJSON_AddStringToObject(o, "url", w->wk_url);
	cJSON_AddStringToObject(o, "id", w->wk_id);
	cJSON_AddStringToObject(o, "model_id", w->wk_model);
	cJSON_AddStringToObject(o, "runtime", w->wk_runtime);
	cJSON_AddStringToObject(o, "worker_type",
	    registry_type_name(w->wk_type));
	cJSON_AddStringToObject(o, "connection_mode",
	    registry_mode_name(w->wk_mode));
	if (w->wk_api_key != NULL)
		cJSON_AddStringToObject(o, "api_key", w->wk_api_key);
	if (w->wk_bootstrap_port >= 0)
		cJSON_AddNumberToObject(o, "bootstrap_port",
		    w->wk_bootstrap_port);
	cJSON_AddNumberToObject(o, "priority", w->wk_priority);
	cJSON_AddNumberToObject(o, "cost", w->wk_cost);
	cJSON_AddItemToObject(o, "labels", cJSON_Duplicate(w->wk_labels, 1));
	if (w->wk_spec != NULL)
		cJSON_AddItemToObject(o, "spec",
		    cJSON_Duplicate(w->wk_spec, 1));
	cJSON_AddNumberToObject(o, "order", w->wk_order);
	cJSON_AddBoolToObject(o, "health_disabled", w->wk_health_disabled);
	if (w->wk_ov_waiting > 0 || w->wk_ov_token_usage > 0) {
		ov = cJSON_AddObjectToObject(o, "overload");
		if (ov != NULL && w->wk_ov_waiting > 0)
			cJSON_AddNumberToObject(ov, "waiting_requests",
			    (double)w->wk_ov_waiting);
		if (ov != NULL && w->wk_ov_token_usage > 0)
			cJSON_AddNumberToObject(ov, "token_usage",
			    w->wk_ov_token_usage);
	}
	if (w->wk_load_interval_secs > 0)
		cJSON_AddNumberToObject(o, "load_monitor_interval_secs",
		    w->wk_load_interval_secs);
	if ((s = cJSON_PrintUnformatted(o)) == NULL)
		fatalx("%s: out of memory", __func__);
	cJSON_Delete(o);
	return s;
}

void
registry_persist(struct broker *br, struct worker *w)
{
	char *rec;

	if (!w->wk_persist || br->br_store == NULL)
		return;
	rec = registry_record_json(w);
	store_put(br->br_store, w->wk_url, rec);
	free(rec);
}

static void
registry_pool_track(struct broker *br, int series)
{
	unsigned i;

	if (series < 0)
		return;
	for (i = 0; i < br->br_npool_series; i++) {
		if (br->br_pool_series[i] == series)
			return;
	}
	if (br->br_npool_series == br->br_cpool_series) {
		br->br_cpool_series =
		    br->br_cpool_series ? br->br_cpool_series * 2 : 16;
		br->br_pool_series = xreallocarray(br->br_pool_series,
		    br->br_cpool_series, sizeof(*br->br_pool_series));
	}
	br->br_pool_series[br->br_npool_series++] = series;
}

void
registry_update_pool_metrics(struct broker *br)
{
	char m[SHM_MODEL_MAX * 2];
	unsigned i, j;
	int s;

	/* Registry changes are rare: recount every group from scratch. */
	for (i = 0; i < br->br_npool_series; i++)
		stats_set(br, br->br_pool_series[i], 0);
	for (i = 0; i < br->br_nmodels; i++) {
		struct model_entry *me = br->br_models[i];
		int64_t n[BROKER_NTYPES][BROKER_NMODES];
		unsigned t, md;

		memset(n, 0, sizeof(n));
		for (j = 0; j < me->me_n; j++) {
			t = (unsigned)me->me_workers[j]->wk_type;
			md = (unsigned)me->me_workers[j]->wk_mode;
			if (t < BROKER_NTYPES && md < BROKER_NMODES)
				n[t][md]++;
		}
		stats_label_escape(m, sizeof(m), me->me_name);
		for (t = 0; t < BROKER_NTYPES; t++) {
			for (md = 0; md < BROKER_NMODES; md++) {
				if (n[t][md] == 0)
					continue;
				s = stats_series(br, METRICS_GAUGE,
				    "smg_worker_pool_size",
				    "worker_type=\"%s\",connection_mode=\"%s\","
				    "model=\"%s\"",
				    registry_type_name((int)t),
				    registry_mode_name((int)md), m);
				registry_pool_track(br, s);
				stats_set(br, s, n[t][md]);
			}
		}
	}
}

void
registry_free_all(struct broker *br)
{
	unsigned i;

	for (i = 0; i < br->br_nworkers; i++) {
		ev_timer_stop(br->br_loop, &br->br_order[i]->wk_drain);
		registry_worker_free(br->br_order[i]);
	}
	free(br->br_order);
	br->br_order = NULL;
	br->br_nworkers = 0;
	memset(br->br_slots, 0, sizeof(br->br_slots));
	while (br->br_nmodels > 0)
		registry_model_free(br, br->br_models[br->br_nmodels - 1]);
	free(br->br_models);
	br->br_models = NULL;
	free(br->br_pool_series);
	br->br_pool_series = NULL;
	br->br_npool_series = br->br_cpool_series = 0;
}
