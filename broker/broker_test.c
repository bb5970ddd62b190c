/*
 * broker_test.c: the broker's state in one process, driven through the
 * same entry points the sockets use (server_frontend, server_poller):
 * candidate filter, route errors, admin JSON, poller reports, breaker
 * outcomes, the LMDB store and a restart that keeps the workers.
 */
#define _XOPEN_SOURCE 700
#include <sys/stat.h>

#include <fcntl.h>
#include <glob.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "shared/ipc.h"
#include "shared/log.h"
#include "shared/metrics.h"
#include "shared/shm.h"
#include "shared/uuid.h"

#include "broker/broker.h"
#include "broker/broker_testutil.h"

struct dec {
	int ok;
	unsigned slot;
	uint32_t gen;
	char url[SHM_URL_MAX];
	char model[SHM_MODEL_MAX];
	char resolved[SHM_MODEL_MAX];
	char policy[32];
	unsigned http_status;
	char code[64];
	char msg[256];
	int terminal;
	unsigned retry_after;
};

static int
fx_setup(void **state)
{
	struct btu_fx *f = btu_fx_new("broker", "round_robin");

	if (f == NULL)
		return -1;
	f->fx_cf.cf_cb_failure_threshold = 2;
	f->fx_cf.cf_health_failure_threshold = 2;
	f->fx_cf.cf_health_success_threshold = 2;
	f->fx_cf.cf_drain_settle_secs = 0;
	f->fx_cf.cf_load_monitor_interval = 7;
	f->fx_urls[0] = "http://a:1/";
	*state = f;
	return 0;
}

static int
fx_teardown(void **state)
{
	btu_fx_free(*state);
	return 0;
}

static Smg__BrokerReply *
fx_send(struct btu_fx *f, Smg__FrontendMsg *m)
{
	Smg__BrokerReply *r;
	uint8_t *buf, *out;
	size_t len, olen;
	const char *why;

	m->version = IPC_VERSION;
	buf = ipc_pack_frontend(m, &len);
	out = server_frontend(f->fx_br, buf, len, &olen);
	assert_non_null(out);
	r = ipc_decode_broker(out, olen, &why);
	assert_non_null(r);
	free(buf);
	free(out);
	return r;
}

static void
fx_route_ex(struct btu_fx *f, const char *model, int leg, const uint32_t *excl,
    size_t nexcl, struct dec *d)
{
	Smg__FrontendMsg m = SMG__FRONTEND_MSG__INIT;
	Smg__RouteBatch rb = SMG__ROUTE_BATCH__INIT;
	Smg__RouteRequest rq = SMG__ROUTE_REQUEST__INIT, *rqs[1] = { &rq };
	Smg__BrokerReply *r;
	Smg__Decision *x;

	rq.id = 42;
	rq.model = (char *)model;
	rq.leg = (Smg__Leg)leg;
	rq.exclude_slots = (uint32_t *)excl;
	rq.n_exclude_slots = nexcl;
	rb.requests = rqs;
	rb.n_requests = 1;
	m.body_case = SMG__FRONTEND_MSG__BODY_ROUTE_BATCH;
	m.route_batch = &rb;
	r = fx_send(f, &m);
	assert_int_equal(r->body_case, SMG__BROKER_REPLY__BODY_DECISION_BATCH);
	assert_int_equal(r->decision_batch->n_decisions, 1);
	x = r->decision_batch->decisions[0];
	memset(d, 0, sizeof(*d));
	assert_int_equal(x->id, 42);
	d->ok = x->status == SMG__DECISION_STATUS__DECISION_OK;
	d->slot = x->worker_slot;
	d->gen = x->worker_generation;
	snprintf(d->url, sizeof(d->url), "%s", x->worker_url);
	snprintf(d->model, sizeof(d->model), "%s", x->model);
	snprintf(d->resolved, sizeof(d->resolved), "%s", x->resolved_model);
	snprintf(d->policy, sizeof(d->policy), "%s", x->policy);
	d->http_status = x->http_status;
	snprintf(d->code, sizeof(d->code), "%s", x->error_code);
	snprintf(d->msg, sizeof(d->msg), "%s", x->error_message);
	d->terminal = x->terminal;
	d->retry_after = x->retry_after_secs;
	smg__broker_reply__free_unpacked(r, NULL);
}

static void
fx_route(struct btu_fx *f, const char *model, struct dec *d)
{
	fx_route_ex(f, model, SMG__LEG__LEG_SINGLE, NULL, 0, d);
}

static void
fx_outcome(struct btu_fx *f, struct worker *w, unsigned status)
{
	Smg__FrontendMsg m = SMG__FRONTEND_MSG__INIT;
	Smg__RouteBatch rb = SMG__ROUTE_BATCH__INIT;
	Smg__Outcome o = SMG__OUTCOME__INIT, *os[1] = { &o };
	Smg__BrokerReply *r;

	o.worker_slot = w->wk_slot;
	o.worker_generation = w->wk_generation;
	o.http_status = status;
	rb.outcomes = os;
	rb.n_outcomes = 1;
	m.body_case = SMG__FRONTEND_MSG__BODY_ROUTE_BATCH;
	m.route_batch = &rb;
	r = fx_send(f, &m);
	assert_int_equal(r->decision_batch->n_decisions, 0);
	smg__broker_reply__free_unpacked(r, NULL);
}

/* Admin op; returns the status, *body parsed (caller frees). */
static unsigned
fx_admin(struct btu_fx *f, Smg__AdminRequest *a, cJSON **body, char *loc,
    size_t loclen)
{
	Smg__FrontendMsg m = SMG__FRONTEND_MSG__INIT;
	Smg__BrokerReply *r;
	unsigned st;

	m.body_case = SMG__FRONTEND_MSG__BODY_ADMIN;
	m.admin = a;
	r = fx_send(f, &m);
	assert_int_equal(r->body_case, SMG__BROKER_REPLY__BODY_ADMIN);
	st = r->admin->http_status;
	*body = cJSON_Parse(r->admin->body_json);
	assert_non_null(*body);
	if (loc != NULL)
		snprintf(loc, loclen, "%s", r->admin->location);
	smg__broker_reply__free_unpacked(r, NULL);
	return st;
}

static unsigned
fx_add(struct btu_fx *f, const char *json, cJSON **body, char *loc, size_t n)
{
	Smg__AdminRequest a = SMG__ADMIN_REQUEST__INIT;
	Smg__WorkerSpec s = SMG__WORKER_SPEC__INIT;

	s.spec_json = (char *)json;
	a.op_case = SMG__ADMIN_REQUEST__OP_ADD_WORKER;
	a.add_worker = &s;
	return fx_admin(f, &a, body, loc, n);
}

static unsigned
fx_simple(struct btu_fx *f, int op, const char *arg, cJSON **body)
{
	Smg__AdminRequest a = SMG__ADMIN_REQUEST__INIT;

	a.op_case = (Smg__AdminRequest__OpCase)op;
	if (op == SMG__ADMIN_REQUEST__OP_LIST_WORKERS)
		a.list_workers = (char *)arg;
	else if (op == SMG__ADMIN_REQUEST__OP_GET_WORKER)
		a.get_worker = (char *)arg;
	else
		a.remove_worker = (char *)arg;
	return fx_admin(f, &a, body, NULL, 0);
}

static void
fx_poll(struct btu_fx *f, Smg__PollerMsg *m)
{
	uint8_t *buf;
	size_t len;

	m->version = IPC_VERSION;
	buf = ipc_pack_poller(m, &len);
	server_poller(f->fx_br, buf, len);
	free(buf);
}

static void
fx_discovery(struct btu_fx *f, struct worker *w, bool ok, const char *model)
{
	Smg__PollerMsg m = SMG__POLLER_MSG__INIT;
	Smg__WorkerDiscovery d = SMG__WORKER_DISCOVERY__INIT;

	d.worker_slot = w->wk_slot;
	d.worker_generation = w->wk_generation;
	d.worker_url = w->wk_url;
	d.ok = ok;
	d.model_id = (char *)model;
	d.runtime = "sglang";
	d.error = ok ? "" : "unreachable";
	m.body_case = SMG__POLLER_MSG__BODY_DISCOVERY;
	m.discovery = &d;
	fx_poll(f, &m);
}

static void
fx_health(struct btu_fx *f, struct worker *w, bool passed)
{
	Smg__PollerMsg m = SMG__POLLER_MSG__INIT;
	Smg__HealthReport h = SMG__HEALTH_REPORT__INIT;

	h.worker_slot = w->wk_slot;
	h.worker_generation = w->wk_generation;
	h.worker_url = w->wk_url;
	h.passed = passed;
	m.body_case = SMG__POLLER_MSG__BODY_HEALTH;
	m.health = &h;
	fx_poll(f, &m);
}

static void
fx_load(struct btu_fx *f, struct worker *w, bool ok, int64_t waiting,
    double usage)
{
	Smg__PollerMsg m = SMG__POLLER_MSG__INIT;
	Smg__LoadReport l = SMG__LOAD_REPORT__INIT;
	Smg__RankLoad r0 = SMG__RANK_LOAD__INIT, r1 = SMG__RANK_LOAD__INIT;
	Smg__RankLoad *rs[2] = { &r0, &r1 };

	r0.num_waiting_reqs = waiting / 2;
	r1.num_waiting_reqs = waiting - waiting / 2;
	r0.token_usage = usage;
	r1.token_usage = usage;
	l.worker_slot = w->wk_slot;
	l.worker_generation = w->wk_generation;
	l.worker_url = w->wk_url;
	l.ok = ok;
	l.loads = rs;
	l.n_loads = ok ? 2 : 0;
	m.body_case = SMG__POLLER_MSG__BODY_LOAD;
	m.load = &l;
	fx_poll(f, &m);
}

static struct worker *
fx_worker(struct btu_fx *f, const char *url)
{
	struct worker *w = registry_find(f->fx_br, url);

	assert_non_null(w);
	return w;
}

static int64_t
metric(struct btu_fx *f, const char *family, const char *labels)
{
	int s =
	    metrics_series(f->fx_br->br_shm, METRICS_COUNTER, family, labels);
	int64_t v = 0;
	int row;

	assert_true(s >= 0);
	for (row = 0; row < SHM_ROWS; row++)
		v += shm_segment(f->fx_br->br_shm)->sh_values[row][s];
	return v;
}

/*
 * A remote frontend's decided requests count on their worker at once and
 * give way to the figures of that frontend's next report.
 */
static void
test_remote_decided_counts_until_reported(void **state)
{
	struct btu_fx *f = *state;
	Smg__FrontendMsg m = SMG__FRONTEND_MSG__INIT;
	Smg__RouteBatch rb = SMG__ROUTE_BATCH__INIT;
	Smg__RouteRequest rq = SMG__ROUTE_REQUEST__INIT, *rqs[1] = { &rq };
	Smg__HostSync hs = SMG__HOST_SYNC__INIT;
	Smg__WorkerLive lv = SMG__WORKER_LIVE__INIT, *lvs[1] = { &lv };
	Smg__BrokerReply *r;
	struct shm_worker sw;
	uint32_t slot;

	btu_fx_start(f);
	hs.host = "hostb:/run";
	hs.frontend_slot = 0;
	hs.interval_ms = 100;
	rq.id = 7;
	rq.has_text = true;
	rq.text = "0123456789012345678901234567890123456789"; /* 10 tokens */
	rb.requests = rqs;
	rb.n_requests = 1;
	rb.live = &hs;
	m.body_case = SMG__FRONTEND_MSG__BODY_ROUTE_BATCH;
	m.route_batch = &rb;
	r = fx_send(f, &m);
	assert_int_equal(r->body_case, SMG__BROKER_REPLY__BODY_DECISION_BATCH);
	assert_int_equal(r->decision_batch->decisions[0]->status,
	    SMG__DECISION_STATUS__DECISION_OK);
	slot = r->decision_batch->decisions[0]->worker_slot;
	smg__broker_reply__free_unpacked(r, NULL);
	assert_int_equal(remote_in_flight(f->fx_br, slot), 1);
	assert_int_equal(remote_pending(f->fx_br, slot), 10);

	/* The next report holds the request as dispatched: it replaces. */
	assert_int_equal(shm_worker_read(f->fx_br->br_shm, slot, &sw), 0);
	lv.slot = slot;
	lv.generation = sw.sw_generation;
	lv.in_flight = 1;
	lv.pending_tokens = 4;
	hs.live = lvs;
	hs.n_live = 1;
	remote_report(f->fx_br, &hs);
	assert_int_equal(remote_in_flight(f->fx_br, slot), 1);
	assert_int_equal(remote_pending(f->fx_br, slot), 4);
	hs.n_live = 0;
	remote_report(f->fx_br, &hs);
	assert_int_equal(remote_in_flight(f->fx_br, slot), 0);
	assert_int_equal(remote_pending(f->fx_br, slot), 0);
}

static void
test_route_round_robin(void **state)
{
	struct btu_fx *f = *state;
	struct shm_worker sw;
	struct dec d;
	const char *exp[] = { "http://a:1", "http://b:2", "http://c:3",
		"http://a:1" };
	int i;

	btu_fx_start(f);
	for (i = 0; i < 4; i++) {
		fx_route(f, "", &d);
		assert_true(d.ok);
		assert_string_equal(d.url, exp[i]);
		assert_string_equal(d.policy, "round_robin");
		assert_int_equal(shm_worker_read(f->fx_br->br_shm, d.slot, &sw),
		    0);
		assert_string_equal(sw.sw_url, d.url);
		assert_int_equal(sw.sw_generation, d.gen);
		assert_int_equal(sw.sw_status, SHM_WORKER_READY);
	}
	assert_int_equal(metric(f, "smg_worker_selection_total",
	                     "worker_type=\"regular\",connection_mode=\"http\","
	                     "model=\"unknown\",policy=\"round_robin\""),
	    4);
}

static void
test_route_errors(void **state)
{
	struct btu_fx *f = *state;
	struct dec d;

	f->fx_cf.cf_worker_urls_n = 0;
	btu_fx_start(f);
	/* No worker at all serves the model. */
	fx_route(f, "llama", &d);
	assert_false(d.ok);
	assert_int_equal(d.http_status, 404);
	assert_string_equal(d.code, "model_not_found");
	assert_string_equal(d.msg, "No worker available for model 'llama'");
	server_free(f->fx_br);
	/* Workers exist but none is available (Pending). */
	f->fx_cf.cf_worker_urls_n = 2;
	f->fx_cf.cf_disable_health_check = false;
	btu_fx_start(f);
	fx_route(f, "llama", &d);
	assert_false(d.ok);
	assert_int_equal(d.http_status, 503);
	assert_string_equal(d.code, "no_available_workers");
	assert_false(d.terminal);
	/* A PD leg without workers of its type. */
	fx_route_ex(f, "", SMG__LEG__LEG_PREFILL, NULL, 0, &d);
	assert_int_equal(d.http_status, 503);
	assert_string_equal(d.code, "server_selection_failed");
}

static void
test_candidate_filter(void **state)
{
	struct btu_fx *f = *state;
	struct worker *pool[SHM_MAX_WORKERS];
	struct worker *a, *b, *c;
	cJSON *body;
	bool over;
	unsigned n;

	f->fx_cf.cf_worker_overload_waiting_requests = 4;
	f->fx_cf.cf_worker_overload_waiting_requests_set = true;
	btu_fx_start(f);
	a = fx_worker(f, "http://a:1");
	b = fx_worker(f, "http://b:2");
	c = fx_worker(f, "http://c:3");
	/* Type and mode narrow the pool. */
	assert_int_equal(fx_add(f,
	                     "{\"url\":\"http://p:9\",\"worker_type\":"
	                     "\"prefill\",\"health\":{\"disable_health_check\":"
	                     "true}}",
	                     &body, NULL, 0),
	    202);
	cJSON_Delete(body);
	assert_int_equal(fx_add(f,
	                     "{\"url\":\"grpc://g:9\",\"health\":"
	                     "{\"disable_health_check\":true}}",
	                     &body, NULL, 0),
	    202);
	cJSON_Delete(body);
	n = avail_pool(f->fx_br, "", SMG__WORKER_TYPE__WORKER_TYPE_REGULAR,
	    SMG__CONNECTION_MODE__CONNECTION_MODE_HTTP, pool);
	assert_int_equal(n, 3);
	assert_ptr_equal(pool[0], a);
	assert_ptr_equal(pool[2], c);
	n = avail_pool(f->fx_br, "", SMG__WORKER_TYPE__WORKER_TYPE_PREFILL,
	    SMG__CONNECTION_MODE__CONNECTION_MODE_HTTP, pool);
	assert_int_equal(n, 1);
	n = avail_pool(f->fx_br, "", SMG__WORKER_TYPE__WORKER_TYPE_REGULAR,
	    SMG__CONNECTION_MODE__CONNECTION_MODE_GRPC, pool);
	assert_int_equal(n, 1);
	/* Status: NotReady is out. */
	registry_set_status(f->fx_br, a, SHM_WORKER_NOT_READY);
	n = avail_pool(f->fx_br, "", 0, 0, pool);
	n = avail_filter(f->fx_br, pool, n, &over);
	assert_int_equal(n, 2);
	assert_ptr_equal(pool[0], b);
	assert_false(over);
	registry_set_status(f->fx_br, a, SHM_WORKER_READY);
	/* Breaker open is out; half-open (after the timeout) is back. */
	fx_outcome(f, b, 503);
	fx_outcome(f, b, 200);
	assert_int_equal(b->wk_cb.cb_state, SHM_BREAKER_CLOSED);
	fx_outcome(f, b, 502);
	fx_outcome(f, b, 500);
	assert_int_equal(b->wk_cb.cb_state, SHM_BREAKER_OPEN);
	n = avail_filter(f->fx_br, pool, avail_pool(f->fx_br, "", 0, 0, pool),
	    &over);
	assert_int_equal(n, 2);
	assert_ptr_equal(pool[1], c);
	f->fx_br->br_cbconf.bc_timeout_ms = 0;
	n = avail_filter(f->fx_br, pool, avail_pool(f->fx_br, "", 0, 0, pool),
	    &over);
	assert_int_equal(n, 3);
	assert_int_equal(b->wk_cb.cb_state, SHM_BREAKER_HALF_OPEN);
	/* Overload flag is out. */
	fx_load(f, c, true, 4, 0.1);
	assert_true(c->wk_overloaded);
	n = avail_filter(f->fx_br, pool, avail_pool(f->fx_br, "", 0, 0, pool),
	    &over);
	assert_int_equal(n, 2);
	assert_false(over);
	/* Model: a model's workers plus model-less ones, in order. */
	fx_discovery(f, a, true, "m1");
	fx_discovery(f, b, true, "m2");
	n = avail_pool(f->fx_br, "m1", 0, 0, pool);
	assert_int_equal(n, 2);
	assert_ptr_equal(pool[0], a);
	assert_ptr_equal(pool[1], c);
	n = avail_pool(f->fx_br, "m2", 0, 0, pool);
	assert_int_equal(n, 2);
	assert_ptr_equal(pool[0], b);
	n = avail_pool(f->fx_br, "", 0, 0, pool);
	assert_int_equal(n, 3);
}

static void
test_exclude_and_overload_shed(void **state)
{
	struct btu_fx *f = *state;
	struct dec d;
	uint32_t ex[2];
	int i;

	f->fx_cf.cf_worker_overload_waiting_requests = 10;
	f->fx_cf.cf_worker_overload_waiting_requests_set = true;
	btu_fx_start(f);
	ex[0] = fx_worker(f, "http://a:1")->wk_slot;
	for (i = 0; i < 6; i++) {
		fx_route_ex(f, "", 0, ex, 1, &d);
		assert_true(d.ok);
		assert_string_not_equal(d.url, "http://a:1");
	}
	/* Excluding everything would leave nothing: ignored. */
	ex[0] = fx_worker(f, "http://a:1")->wk_slot;
	ex[1] = fx_worker(f, "http://b:2")->wk_slot;
	fx_route_ex(f, "", 0, ex, 2, &d);
	assert_string_equal(d.url, "http://c:3");
	/* Every worker of the pool overloaded: terminal 503. */
	fx_load(f, fx_worker(f, "http://a:1"), true, 10, 0.1);
	fx_load(f, fx_worker(f, "http://b:2"), true, 11, 0.1);
	fx_load(f, fx_worker(f, "http://c:3"), true, 20, 0.1);
	fx_route(f, "", &d);
	assert_false(d.ok);
	assert_int_equal(d.http_status, 503);
	assert_string_equal(d.code, "no_available_workers");
	assert_true(d.terminal);
	assert_int_equal(d.retry_after, 7);
	assert_int_equal(
	    metric(f, "smg_worker_overload_shed_total", "stage=\"selection\""),
	    1);
	/* A failed fetch clears the flag; a lower report too. */
	fx_load(f, fx_worker(f, "http://b:2"), false, 0, 0);
	fx_route(f, "", &d);
	assert_true(d.ok);
	assert_string_equal(d.url, "http://b:2");
	fx_load(f, fx_worker(f, "http://a:1"), true, 9, 0.1);
	assert_false(fx_worker(f, "http://a:1")->wk_overloaded);
}

static void
test_policy_label(void **state)
{
	struct btu_fx *f = *state;
	struct dec d;
	cJSON *body;

	f->fx_cf.cf_worker_urls_n = 0;
	btu_fx_start(f);
	assert_int_equal(fx_add(f,
	                     "{\"url\":\"http://x1:1\",\"models\":[{\"id\":"
	                     "\"mx\"}],\"labels\":{\"policy\":\"Random\"},"
	                     "\"health\":{\"disable_health_check\":true}}",
	                     &body, NULL, 0),
	    202);
	cJSON_Delete(body);
	/* A later label for the same model is ignored. */
	assert_int_equal(fx_add(f,
	                     "{\"url\":\"http://x2:1\",\"models\":[{\"id\":"
	                     "\"mx\"}],\"labels\":{\"policy\":\"passthrough\"},"
	                     "\"health\":{\"disable_health_check\":true}}",
	                     &body, NULL, 0),
	    202);
	cJSON_Delete(body);
	assert_int_equal(fx_add(f,
	                     "{\"url\":\"http://y1:1\",\"models\":[{\"id\":"
	                     "\"my\"}],\"labels\":{\"policy\":\"bogus\"},"
	                     "\"health\":{\"disable_health_check\":true}}",
	                     &body, NULL, 0),
	    202);
	cJSON_Delete(body);
	fx_route(f, "mx", &d);
	assert_true(d.ok);
	assert_string_equal(d.policy, "random");
	assert_string_equal(d.model, "mx");
	fx_route(f, "my", &d);
	assert_string_equal(d.policy, "round_robin");
	/* The mapping goes with the model's last worker. */
	registry_remove(f->fx_br, fx_worker(f, "http://x1:1"));
	registry_remove(f->fx_br, fx_worker(f, "http://x2:1"));
	fx_route(f, "mx", &d);
	assert_int_equal(d.http_status, 404);
	assert_int_equal(
	    fx_add(f,
	        "{\"url\":\"http://x3:1\",\"models\":[{\"id\":"
	        "\"mx\"}],\"labels\":{\"policy\":\"pass_through\"},"
	        "\"health\":{\"disable_health_check\":true}}",
	        &body, NULL, 0),
	    202);
	cJSON_Delete(body);
	fx_route(f, "mx", &d);
	assert_string_equal(d.policy, "passthrough");
}

static void
test_admin_shapes(void **state)
{
	struct btu_fx *f = *state;
	cJSON *body, *it, *w;
	char loc[128], id[64], path[96];
	int i;

	f->fx_cf.cf_disable_health_check = false;
	btu_fx_start(f);
	fx_discovery(f, fx_worker(f, "http://a:1"), true, "");
	assert_int_equal(fx_add(f,
	                     "{\"url\":\"http://new:8000/\",\"worker_type\":"
	                     "\"decode\",\"api_key\":\"sekret\",\"labels\":"
	                     "{\"zone\":\"z1\"},\"priority\":7,\"cost\":2.5,"
	                     "\"dp_size\":2}",
	                     &body, loc, sizeof(loc)),
	    202);
	assert_string_equal(cJSON_GetObjectItem(body, "status")->valuestring,
	    "accepted");
	snprintf(id, sizeof(id), "%s",
	    cJSON_GetObjectItem(body, "worker_id")->valuestring);
	assert_int_equal(strlen(id), 36);
	assert_true(uuid_canonical(id));
	assert_int_equal(id[14], '7');
	assert_string_equal(cJSON_GetObjectItem(body, "url")->valuestring,
	    "http://new:8000");
	snprintf(path, sizeof(path), "/workers/%s", id);
	assert_string_equal(loc, path);
	assert_string_equal(cJSON_GetObjectItem(body, "location")->valuestring,
	    path);
	assert_string_equal(cJSON_GetObjectItem(body, "message")->valuestring,
	    "Worker addition queued for background processing");
	cJSON_Delete(body);
	/* The same URL again. */
	assert_int_equal(
	    fx_add(f, "{\"url\":\"http://new:8000\"}", &body, NULL, 0), 409);
	assert_string_equal(cJSON_GetObjectItem(body, "code")->valuestring,
	    "WORKER_ALREADY_EXISTS");
	cJSON_Delete(body);
	/* GET by id and by url. */
	for (i = 0; i < 2; i++) {
		assert_int_equal(fx_simple(f, SMG__ADMIN_REQUEST__OP_GET_WORKER,
		                     i == 0 ? id : "http://new:8000", &body),
		    200);
		assert_string_equal(
		    cJSON_GetObjectItem(body, "id")->valuestring, id);
		assert_string_equal(
		    cJSON_GetObjectItem(body, "model_id")->valuestring,
		    "unknown");
		assert_string_equal(
		    cJSON_GetObjectItem(body, "worker_type")->valuestring,
		    "decode");
		assert_string_equal(
		    cJSON_GetObjectItem(body, "connection_mode")->valuestring,
		    "http");
		assert_string_equal(
		    cJSON_GetObjectItem(body, "status")->valuestring,
		    "Pending");
		assert_true(
		    cJSON_IsFalse(cJSON_GetObjectItem(body, "is_healthy")));
		assert_int_equal(cJSON_GetObjectItem(body, "load")->valueint,
		    0);
		assert_int_equal(
		    cJSON_GetObjectItem(body, "priority")->valueint, 7);
		assert_int_equal(cJSON_GetObjectItem(body, "dp_size")->valueint,
		    2);
		assert_string_equal(
		    cJSON_GetObjectItem(cJSON_GetObjectItem(body, "labels"),
		        "zone")
		        ->valuestring,
		    "z1");
		it = cJSON_GetObjectItem(body, "job_status");
		assert_string_equal(
		    cJSON_GetObjectItem(it, "status")->valuestring, "pending");
		assert_null(cJSON_GetObjectItem(body, "api_key"));
		cJSON_Delete(body);
	}
	/* List with stats, and with a model filter. */
	assert_int_equal(
	    fx_simple(f, SMG__ADMIN_REQUEST__OP_LIST_WORKERS, "", &body), 200);
	assert_int_equal(
	    cJSON_GetArraySize(cJSON_GetObjectItem(body, "workers")), 4);
	assert_int_equal(cJSON_GetObjectItem(body, "total")->valueint, 4);
	it = cJSON_GetObjectItem(body, "stats");
	assert_int_equal(cJSON_GetObjectItem(it, "regular_count")->valueint, 3);
	assert_int_equal(cJSON_GetObjectItem(it, "decode_count")->valueint, 1);
	assert_int_equal(cJSON_GetObjectItem(it, "prefill_count")->valueint, 0);
	w = cJSON_GetArrayItem(cJSON_GetObjectItem(body, "workers"), 0);
	assert_string_equal(cJSON_GetObjectItem(w, "url")->valuestring,
	    "http://a:1");
	assert_true(cJSON_IsTrue(cJSON_GetObjectItem(w, "is_healthy")));
	assert_true(cJSON_IsNull(cJSON_GetObjectItem(w, "job_status")));
	cJSON_Delete(body);
	fx_discovery(f, fx_worker(f, "http://b:2"), true, "m9");
	assert_int_equal(
	    fx_simple(f, SMG__ADMIN_REQUEST__OP_LIST_WORKERS, "m9", &body),
	    200);
	assert_int_equal(cJSON_GetObjectItem(body, "total")->valueint, 1);
	cJSON_Delete(body);
	/* Unknown id. */
	assert_int_equal(
	    fx_simple(f, SMG__ADMIN_REQUEST__OP_GET_WORKER, "nope", &body),
	    404);
	assert_string_equal(cJSON_GetObjectItem(body, "code")->valuestring,
	    "WORKER_NOT_FOUND");
	assert_non_null(cJSON_GetObjectItem(body, "error"));
	cJSON_Delete(body);
	/* DELETE: Draining, then gone after the settle time. */
	assert_int_equal(
	    fx_simple(f, SMG__ADMIN_REQUEST__OP_REMOVE_WORKER, id, &body), 202);
	assert_string_equal(cJSON_GetObjectItem(body, "message")->valuestring,
	    "Worker removal queued for background processing");
	assert_string_equal(cJSON_GetObjectItem(body, "worker_id")->valuestring,
	    id);
	cJSON_Delete(body);
	assert_int_equal(fx_worker(f, id)->wk_status, SHM_WORKER_DRAINING);
	for (i = 0; i < 5 && registry_find(f->fx_br, id) != NULL; i++)
		ev_run(f->fx_loop, EVRUN_NOWAIT);
	assert_null(registry_find(f->fx_br, id));
	assert_int_equal(
	    fx_simple(f, SMG__ADMIN_REQUEST__OP_REMOVE_WORKER, id, &body), 404);
	cJSON_Delete(body);
}

static void
test_admin_validation(void **state)
{
	struct btu_fx *f = *state;
	static const char *bad[] = {
		"{not json",
		"[1,2]",
		"{}",
		"{\"url\":42}",
		"{\"url\":\"ftp://x:1\"}",
		"{\"url\":\"http://\"}",
		"{\"url\":\"http://a b:1\"}",
		"{\"url\":\"http://q:1\",\"worker_type\":\"gpu\"}",
		"{\"url\":\"http://q:1\",\"connection_mode\":\"tcp\"}",
		"{\"url\":\"http://q:1\",\"labels\":{\"a\":1}}",
		"{\"url\":\"http://q:1\",\"labels\":[]}",
		"{\"url\":\"http://q:1\",\"bootstrap_port\":70000}",
		"{\"url\":\"http://q:1\",\"priority\":-1}",
		"{\"url\":\"http://q:1\",\"models\":[{\"id\":\"\"}]}",
		"{\"url\":\"http://q:1\",\"overload\":{\"token_usage\":2}}",
		/* One string over two lines. */
		("{\"url\":\"http://q:1\",\"health\":{\"disable_health_check\":"
		 "\"yes\"}}"),
	};
	cJSON *body;
	size_t i;

	btu_fx_start(f);
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(fx_add(f, bad[i], &body, NULL, 0), 400);
		assert_true(cJSON_IsString(cJSON_GetObjectItem(body, "error")));
		assert_true(cJSON_IsString(cJSON_GetObjectItem(body, "code")));
		cJSON_Delete(body);
	}
	assert_int_equal(f->fx_br->br_nworkers, 3);
}

static void
test_malformed_and_ping(void **state)
{
	struct btu_fx *f = *state;
	Smg__FrontendMsg m = SMG__FRONTEND_MSG__INIT;
	Smg__Ping ping = SMG__PING__INIT;
	Smg__BrokerReply *r;
	static const uint8_t junk[] = { 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01 };
	uint8_t *buf, *out;
	size_t len, olen;
	const char *why;

	btu_fx_start(f);
	out = server_frontend(f->fx_br, junk, sizeof(junk), &olen);
	assert_non_null(out);
	r = ipc_decode_broker(out, olen, &why);
	assert_non_null(r);
	assert_int_equal(r->body_case, SMG__BROKER_REPLY__BODY_ERROR);
	assert_string_equal(r->error->code, "malformed");
	smg__broker_reply__free_unpacked(r, NULL);
	free(out);
	/* Wrong version. */
	m.body_case = SMG__FRONTEND_MSG__BODY_PING;
	m.ping = &ping;
	m.version = IPC_VERSION + 7;
	buf = ipc_pack_frontend(&m, &len);
	if (buf != NULL) {
		/* ipc_pack_frontend may force the version; patch it back. */
		Smg__FrontendMsg *u = smg__frontend_msg__unpack(NULL, len, buf);

		assert_non_null(u);
		u->version = IPC_VERSION + 7;
		free(buf);
		len = smg__frontend_msg__get_packed_size(u);
		buf = malloc(len);
		smg__frontend_msg__pack(u, buf);
		smg__frontend_msg__free_unpacked(u, NULL);
	}
	out = server_frontend(f->fx_br, buf, len, &olen);
	r = ipc_decode_broker(out, olen, &why);
	assert_non_null(r);
	assert_int_equal(r->body_case, SMG__BROKER_REPLY__BODY_ERROR);
	assert_string_equal(r->error->code, "version");
	smg__broker_reply__free_unpacked(r, NULL);
	free(out);
	free(buf);
	/* Ping -> Pong. */
	m.version = IPC_VERSION;
	r = fx_send(f, &m);
	assert_int_equal(r->body_case, SMG__BROKER_REPLY__BODY_PONG);
	assert_int_equal(r->pong->broker_pid, getpid());
	assert_int_equal(r->pong->registry_generation,
	    shm_workers_generation(f->fx_br->br_shm));
	smg__broker_reply__free_unpacked(r, NULL);
	/* Garbage from the poller is dropped, the broker keeps serving. */
	server_poller(f->fx_br, junk, sizeof(junk));
	assert_int_equal(f->fx_br->br_nworkers, 3);
}

static void
test_reports_lifecycle(void **state)
{
	struct btu_fx *f = *state;
	struct worker *a, *b, *c, stale;
	struct shm_worker sw;
	struct dec d;
	int i;

	f->fx_cf.cf_disable_health_check = false;
	btu_fx_start(f);
	a = fx_worker(f, "http://a:1");
	b = fx_worker(f, "http://b:2");
	c = fx_worker(f, "http://c:3");
	assert_int_equal(a->wk_status, SHM_WORKER_PENDING);
	/* A stale generation is ignored. */
	stale = *a;
	stale.wk_generation++;
	fx_discovery(f, &stale, true, "m");
	assert_int_equal(a->wk_status, SHM_WORKER_PENDING);
	fx_discovery(f, a, true, "m");
	assert_int_equal(a->wk_status, SHM_WORKER_READY);
	assert_string_equal(a->wk_model, "m");
	assert_string_equal(a->wk_runtime, "sglang");
	assert_int_equal(shm_worker_read(f->fx_br->br_shm, a->wk_slot, &sw), 0);
	assert_string_equal(sw.sw_model, "m");
	assert_int_equal(sw.sw_status, SHM_WORKER_READY);
	fx_route(f, "m", &d);
	assert_true(d.ok);
	assert_string_equal(d.url, "http://a:1");
	/* Ready -> NotReady after 2 failures, back after 2 passes. */
	fx_health(f, a, false);
	assert_int_equal(a->wk_status, SHM_WORKER_READY);
	fx_health(f, a, false);
	assert_int_equal(a->wk_status, SHM_WORKER_NOT_READY);
	fx_health(f, a, true);
	assert_int_equal(a->wk_status, SHM_WORKER_NOT_READY);
	fx_health(f, a, true);
	assert_int_equal(a->wk_status, SHM_WORKER_READY);
	/* NotReady -> Failed after 3 x 2 failures. */
	for (i = 0; i < 5; i++)
		fx_health(f, a, false);
	assert_int_equal(a->wk_status, SHM_WORKER_NOT_READY);
	fx_health(f, a, false);
	assert_int_equal(a->wk_status, SHM_WORKER_FAILED);
	fx_health(f, a, true);
	fx_health(f, a, true);
	assert_int_equal(a->wk_status, SHM_WORKER_FAILED);
	/* Discovery failure: Failed. */
	fx_discovery(f, b, false, "");
	assert_int_equal(b->wk_status, SHM_WORKER_FAILED);
	/* Pending -> Failed after 10 x 2 probes without promotion. */
	for (i = 0; i < 19; i++)
		fx_health(f, c, true);
	assert_int_equal(c->wk_status, SHM_WORKER_PENDING);
	fx_health(f, c, false);
	assert_int_equal(c->wk_status, SHM_WORKER_FAILED);
	assert_int_equal(metric(f, "smg_worker_health_checks_total",
	                     "worker_type=\"regular\",result=\"failure\""),
	    9);
}

static void
test_outcomes_breaker(void **state)
{
	struct btu_fx *f = *state;
	struct worker *a, stale;
	struct shm_worker sw;
	struct dec d;
	int i;

	btu_fx_start(f);
	a = fx_worker(f, "http://a:1");
	for (i = 0; i < 10; i++)
		fx_outcome(f, a, 404);
	fx_outcome(f, a, 429);
	fx_outcome(f, a, 429);
	assert_int_equal(a->wk_cb.cb_state, SHM_BREAKER_CLOSED);
	fx_outcome(f, a, 504);
	fx_outcome(f, a, 408);
	assert_int_equal(a->wk_cb.cb_state, SHM_BREAKER_OPEN);
	assert_int_equal(shm_worker_read(f->fx_br->br_shm, a->wk_slot, &sw), 0);
	assert_int_equal(sw.sw_breaker, SHM_BREAKER_OPEN);
	for (i = 0; i < 6; i++) {
		fx_route(f, "", &d);
		assert_string_not_equal(d.url, "http://a:1");
	}
	assert_int_equal(metric(f, "smg_worker_cb_transitions_total",
	                     "worker=\"http://a:1\",from=\"closed\","
	                     "to=\"open\""),
	    1);
	assert_int_equal(metric(f, "smg_worker_cb_outcomes_total",
	                     "worker=\"http://a:1\",outcome=\"success\""),
	    10);
	f->fx_br->br_cbconf.bc_timeout_ms = 0;
	fx_route(f, "", &d);
	assert_int_equal(a->wk_cb.cb_state, SHM_BREAKER_HALF_OPEN);
	/* Outcome for a slot generation that is gone: ignored. */
	stale = *a;
	stale.wk_generation++;
	fx_outcome(f, &stale, 503);
	assert_int_equal(a->wk_cb.cb_state, SHM_BREAKER_HALF_OPEN);
	fx_outcome(f, a, 200);
	assert_int_equal(a->wk_cb.cb_state, SHM_BREAKER_CLOSED);
	assert_int_equal(shm_worker_read(f->fx_br->br_shm, a->wk_slot, &sw), 0);
	assert_int_equal(sw.sw_breaker, SHM_BREAKER_CLOSED);
}

struct recs {
	int n;
	char keys[8][64];
};

static void
collect(void *arg, const char *key, const char *value)
{
	struct recs *r = arg;

	assert_non_null(strstr(value, "v"));
	if (r->n < 8)
		snprintf(r->keys[r->n], sizeof(r->keys[0]), "%s", key);
	r->n++;
}

static void
test_store_roundtrip(void **state)
{
	struct btu_fx *f = *state;
	struct store *st;
	struct recs r = { 0 };

	st = store_open(f->fx_state);
	assert_non_null(st);
	store_put(st, "http://k1", "v1");
	store_put(st, "http://k2", "v2");
	store_put(st, "http://k3", "v3");
	store_put(st, "http://k2", "v2b");
	store_del(st, "http://k3");
	store_del(st, "http://never");
	assert_true(store_pending(st));
	assert_int_equal(store_txn_count(st), 0);
	assert_int_equal(store_each(st, collect, &r), 0);
	assert_int_equal(r.n, 0); /* nothing written yet */
	assert_int_equal(store_flush(st), 0);
	assert_int_equal(store_txn_count(st), 1);
	assert_false(store_pending(st));
	store_put(st, "http://k4", "v4");
	store_close(st); /* flushes */
	st = store_open(f->fx_state);
	assert_non_null(st);
	memset(&r, 0, sizeof(r));
	assert_int_equal(store_each(st, collect, &r), 0);
	assert_int_equal(r.n, 3);
	assert_string_equal(r.keys[0], "http://k1");
	assert_string_equal(r.keys[1], "http://k2");
	assert_string_equal(r.keys[2], "http://k4");
	store_close(st);
}

/* Fills dir's store with n records of about 1 KB. */
static void
store_fill(const char *dir, int n)
{
	struct store *st;
	char key[64], val[1024];
	int i;

	assert_non_null(st = store_open(dir));
	memset(val, 'v', sizeof(val) - 1);
	val[sizeof(val) - 1] = '\0';
	for (i = 0; i < n; i++) {
		snprintf(key, sizeof(key), "http://w%04d", i);
		store_put(st, key, val);
	}
	store_close(st);
}

static size_t
store_count(struct store *st)
{
	struct recs r = { 0 };

	assert_int_equal(store_each(st, collect, &r), 0);
	return r.n;
}

/* How many paths match pattern. */
static size_t
glob_count(const char *pattern)
{
	glob_t g;
	size_t n;

	if (glob(pattern, 0, NULL, &g) != 0)
		return 0;
	n = g.gl_pathc;
	globfree(&g);
	return n;
}

static void
write_garbage(const char *path, off_t off, size_t len)
{
	unsigned char buf[4096];
	size_t i, n;
	int fd;

	srand(7);
	assert_true((fd = open(path, O_WRONLY)) != -1);
	while (len > 0) {
		n = len < sizeof(buf) ? len : sizeof(buf);
		for (i = 0; i < n; i++)
			buf[i] = (unsigned char)rand();
		assert_int_equal(pwrite(fd, buf, n, off), (ssize_t)n);
		off += (off_t)n;
		len -= n;
	}
	close(fd);
}

/*
 * A damaged state dir (truncated file, garbage, data.mdb not a file, the
 * dir a file) is moved aside and a new empty store opens: never a crash,
 * never a failure to start.
 */
static void
test_store_damaged(void **state)
{
	struct btu_fx *f = *state;
	struct store *st;
	char dir[512], data[600], pat[700], why[256];
	struct stat sb;
	size_t full;
	FILE *fp;

	snprintf(dir, sizeof(dir), "%s/dmg", f->fx_state);
	snprintf(data, sizeof(data), "%s/data.mdb", dir);
	snprintf(pat, sizeof(pat), "%s.corrupt-*", data);

	/* Sound: the checks pass and the records are there. */
	store_fill(dir, 200);
	assert_int_equal(store_check_files(dir, why, sizeof(why)), 0);
	assert_int_equal(stat(data, &sb), 0);
	assert_true(sb.st_size > 24576);
	assert_non_null(st = store_open(dir));
	full = store_count(st);
	assert_int_equal(full, 200);
	store_close(st);

	/* Truncated: the meta page names pages past the end (SIGBUS). */
	assert_int_equal(truncate(data, 24576), 0);
	assert_int_equal(store_check_files(dir, why, sizeof(why)), -1);
	assert_non_null(strstr(why, "meta page names"));
	assert_non_null(st = store_open(dir));
	assert_int_equal(store_count(st), 0);
	store_close(st);
	assert_int_equal(glob_count(pat), 1);
	assert_int_equal(store_check_files(dir, why, sizeof(why)), 0);

	/* Garbage over the meta pages. */
	store_fill(dir, 50);
	write_garbage(data, 0, 8192);
	assert_int_equal(store_check_files(dir, why, sizeof(why)), -1);
	assert_non_null(st = store_open(dir));
	assert_int_equal(store_count(st), 0);
	store_close(st);

	/* Garbage pages between sound meta pages: opens (moved aside or
	 * not, depending on what the walk meets) and never crashes. */
	store_fill(dir, 200);
	assert_int_equal(stat(data, &sb), 0);
	write_garbage(data, 8192, (size_t)sb.st_size - 8192);
	assert_non_null(st = store_open(dir));
	(void)store_count(st);
	store_close(st);

	/* data.mdb a directory (unreadable as a file). */
	assert_int_equal(unlink(data), 0);
	assert_int_equal(mkdir(data, 0700), 0);
	assert_non_null(st = store_open(dir));
	assert_int_equal(store_count(st), 0);
	store_put(st, "http://after", "v1");
	store_close(st);
	assert_non_null(st = store_open(dir));
	assert_int_equal(store_count(st), 1);
	store_close(st);

	/* The state dir a file. */
	snprintf(dir, sizeof(dir), "%s/afile", f->fx_state);
	assert_non_null(fp = fopen(dir, "w"));
	fputs("not a dir\n", fp);
	fclose(fp);
	assert_int_equal(store_check_files(dir, why, sizeof(why)), -1);
	assert_non_null(st = store_open(dir));
	assert_int_equal(store_count(st), 0);
	store_close(st);
	assert_int_equal(stat(dir, &sb), 0);
	assert_true(S_ISDIR(sb.st_mode));
	snprintf(pat, sizeof(pat), "%s.corrupt-*", dir);
	assert_int_equal(glob_count(pat), 1);
}

static void
test_write_behind(void **state)
{
	struct btu_fx *f = *state;
	cJSON *body;
	char js[128];
	uint64_t before;
	int i;
	struct dec d;

	btu_fx_start(f);
	before = store_txn_count(f->fx_br->br_store);
	for (i = 0; i < 40; i++) {
		snprintf(js, sizeof(js), "{\"url\":\"http://wb%d:1\"}", i);
		assert_int_equal(fx_add(f, js, &body, NULL, 0), 202);
		cJSON_Delete(body);
		fx_route(f, "", &d);
	}
	/* No transaction per request: all of it waits for the flush. */
	assert_int_equal(store_txn_count(f->fx_br->br_store), before);
	assert_true(store_pending(f->fx_br->br_store));
	assert_int_equal(store_flush(f->fx_br->br_store), 0);
	assert_int_equal(store_txn_count(f->fx_br->br_store), before + 1);
	for (i = 0; i < 100; i++)
		fx_route(f, "", &d);
	assert_false(store_pending(f->fx_br->br_store));
}

static void
test_restart_keeps_workers(void **state)
{
	struct btu_fx *f = *state;
	struct worker *a, *n;
	unsigned slot_a, slot_n;
	uint32_t gen_a;
	char id_a[SHM_ID_MAX], id_n[SHM_ID_MAX];
	cJSON *body;

	f->fx_cf.cf_disable_health_check = false;
	btu_fx_start(f);
	a = fx_worker(f, "http://a:1");
	fx_discovery(f, a, true, "ma");
	slot_a = a->wk_slot;
	gen_a = a->wk_generation;
	assert_int_equal(fx_add(f,
	                     "{\"url\":\"http://api:7\",\"models\":[{\"id\":"
	                     "\"mm\"}],\"labels\":{\"k\":\"v\"},\"api_key\":"
	                     "\"key1\",\"bootstrap_port\":8998}",
	                     &body, NULL, 0),
	    202);
	cJSON_Delete(body);
	assert_int_equal(
	    fx_add(f, "{\"url\":\"http://gone:7\"}", &body, NULL, 0), 202);
	cJSON_Delete(body);
	slot_n = fx_worker(f, "http://api:7")->wk_slot;
	snprintf(id_n, sizeof(id_n), "%s", fx_worker(f, "http://api:7")->wk_id);
	snprintf(id_a, sizeof(id_a), "%s", a->wk_id);
	assert_int_equal(fx_simple(f, SMG__ADMIN_REQUEST__OP_REMOVE_WORKER,
	                     "http://gone:7", &body),
	    202);
	cJSON_Delete(body);
	server_free(f->fx_br);
	f->fx_br = NULL;
	/* The command line loses c; the API worker comes back. */
	f->fx_cf.cf_worker_urls_n = 2;
	btu_fx_start(f);
	assert_int_equal(f->fx_br->br_nworkers, 3);
	assert_null(registry_find(f->fx_br, "http://c:3"));
	assert_null(registry_find(f->fx_br, "http://gone:7"));
	n = fx_worker(f, "http://api:7");
	assert_string_equal(n->wk_model, "mm");
	assert_string_equal(n->wk_api_key, "key1");
	assert_int_equal(n->wk_bootstrap_port, 8998);
	assert_string_equal(cJSON_GetObjectItem(n->wk_labels, "k")->valuestring,
	    "v");
	assert_int_equal(n->wk_slot, slot_n);
	assert_string_equal(n->wk_id, id_n); /* from the store */
	/* The startup worker keeps its slot, generation, status, model, id. */
	a = fx_worker(f, "http://a:1");
	assert_string_equal(a->wk_id, id_a); /* from the shm slot */
	assert_int_equal(a->wk_slot, slot_a);
	assert_int_equal(a->wk_generation, gen_a);
	assert_int_equal(a->wk_status, SHM_WORKER_READY);
	assert_string_equal(a->wk_model, "ma");
}

static unsigned
fx_update(struct btu_fx *f, const char *id, const char *json, bool partial,
    cJSON **body)
{
	Smg__AdminRequest a = SMG__ADMIN_REQUEST__INIT;
	Smg__WorkerUpdate u = SMG__WORKER_UPDATE__INIT;

	u.id = (char *)id;
	u.spec_json = (char *)json;
	u.partial = partial;
	a.op_case = SMG__ADMIN_REQUEST__OP_UPDATE_WORKER;
	a.update_worker = &u;
	return fx_admin(f, &a, body, NULL, 0);
}

/*
 * PUT applies the new spec (SMG test_replace_worker_applies_new_spec),
 * refuses another url; PATCH merges labels and keeps the rest; a
 * WorkerSpec alias routes to its model and says so in the decision.
 */
static void
test_admin_update_and_alias(void **state)
{
	struct btu_fx *f = *state;
	struct worker *w;
	char id[SHM_ID_MAX], json[256];
	cJSON *body, *m;
	struct dec d;
	int i;

	btu_fx_start(f);
	assert_int_equal(fx_add(f,
	                     "{\"url\":\"http://n:1\",\"models\":[{\"id\":"
	                     "\"canon\",\"aliases\":[\"nick\",\"short\"]}],"
	                     "\"labels\":{\"a\":\"1\"},\"priority\":5,"
	                     "\"provider\":\"openai\"}",
	                     &body, NULL, 0),
	    202);
	snprintf(id, sizeof(id), "%s",
	    cJSON_GetObjectItem(body, "worker_id")->valuestring);
	cJSON_Delete(body);
	w = fx_worker(f, "http://n:1");
	/* WorkerInfo: models, max_connection_attempts, provider. */
	assert_int_equal(
	    fx_simple(f, SMG__ADMIN_REQUEST__OP_GET_WORKER, id, &body), 200);
	m = cJSON_GetArrayItem(cJSON_GetObjectItem(body, "models"), 0);
	assert_string_equal(cJSON_GetObjectItem(m, "id")->valuestring, "canon");
	assert_string_equal(
	    cJSON_GetArrayItem(cJSON_GetObjectItem(m, "aliases"), 1)
	        ->valuestring,
	    "short");
	assert_int_equal(
	    cJSON_GetObjectItem(body, "max_connection_attempts")->valueint, 20);
	assert_string_equal(cJSON_GetObjectItem(body, "provider")->valuestring,
	    "openai");
	cJSON_Delete(body);
	assert_int_equal(fx_simple(f, SMG__ADMIN_REQUEST__OP_GET_WORKER,
	                     fx_worker(f, "http://a:1")->wk_id, &body),
	    200);
	assert_true(cJSON_IsNull(cJSON_GetObjectItem(body, "provider")));
	assert_int_equal(
	    cJSON_GetArraySize(cJSON_GetObjectItem(body, "models")), 0);
	cJSON_Delete(body);
	/* The alias routes to the model (and to the wildcard workers, as
	 * the model would); the decision names it. */
	for (i = 0; i < 4; i++) {
		fx_route(f, "nick", &d);
		if (strcmp(d.url, "http://n:1") == 0)
			break;
	}
	assert_true(d.ok);
	assert_string_equal(d.url, "http://n:1");
	assert_string_equal(d.model, "canon");
	assert_string_equal(d.resolved, "canon");
	fx_route(f, "canon", &d);
	assert_string_equal(d.resolved, "");
	fx_route(f, "nope", &d);
	assert_string_equal(d.resolved, "");
	assert_string_not_equal(d.url, "http://n:1");
	/* PUT: the new spec applies; the url may not change. */
	snprintf(json, sizeof(json),
	    "{\"url\":\"http://n:1/\",\"priority\":12,\"models\":"
	    "[{\"id\":\"canon\"}]}");
	assert_int_equal(fx_update(f, id, json, false, &body), 202);
	assert_string_equal(cJSON_GetObjectItem(body, "message")->valuestring,
	    "Worker update queued for background processing");
	assert_string_equal(cJSON_GetObjectItem(body, "worker_id")->valuestring,
	    id);
	cJSON_Delete(body);
	assert_int_equal(w->wk_priority, 12);
	assert_int_equal(cJSON_GetArraySize(w->wk_labels), 0);
	fx_route(f, "nick", &d); /* the new spec has no alias */
	assert_string_equal(d.resolved, "");
	assert_int_equal(
	    fx_update(f, id, "{\"url\":\"http://other:1\"}", false, &body),
	    400);
	assert_string_equal(cJSON_GetObjectItem(body, "code")->valuestring,
	    "BAD_REQUEST");
	cJSON_Delete(body);
	/* PATCH: labels merge, the rest stays. */
	assert_int_equal(fx_update(f, id,
	                     "{\"labels\":{\"b\":\"2\"},\"cost\":3}", true,
	                     &body),
	    202);
	cJSON_Delete(body);
	assert_int_equal(fx_update(f, id,
	                     "{\"labels\":{\"c\":\"3\"},\"api_key\":\"k9\"}",
	                     true, &body),
	    202);
	cJSON_Delete(body);
	assert_int_equal(w->wk_priority, 12);
	assert_true(w->wk_cost == 3.0);
	assert_string_equal(w->wk_api_key, "k9");
	assert_string_equal(cJSON_GetObjectItem(w->wk_labels, "b")->valuestring,
	    "2");
	assert_string_equal(cJSON_GetObjectItem(w->wk_labels, "c")->valuestring,
	    "3");
	assert_int_equal(fx_update(f, id, "{\"priority\":-3}", true, &body),
	    400);
	cJSON_Delete(body);
	/* PUT moving the worker to another model and type. */
	assert_int_equal(fx_update(f, id,
	                     "{\"url\":\"http://n:1\",\"worker_type\":"
	                     "\"prefill\",\"models\":[{\"id\":\"m2\"}]}",
	                     false, &body),
	    202);
	cJSON_Delete(body);
	assert_string_equal(w->wk_model, "m2");
	assert_int_equal(w->wk_type, SMG__WORKER_TYPE__WORKER_TYPE_PREFILL);
	assert_int_equal(fx_update(f, "0191e2a4-6b7c-7d3e-8f00-0123456789ab",
	                     "{}", true, &body),
	    404);
	assert_string_equal(cJSON_GetObjectItem(body, "code")->valuestring,
	    "WORKER_NOT_FOUND");
	cJSON_Delete(body);
}

/* A record of an older version (16 hex digit id) gets a UUID, stored. */
static void
test_store_migrates_ids(void **state)
{
	struct btu_fx *f = *state;
	struct store *st;
	struct worker *w;
	char id[SHM_ID_MAX];

	assert_non_null(st = store_open(f->fx_state));
	store_put(st, "http://old:5",
	    "{\"url\":\"http://old:5\",\"id\":\"a3c5f1d2e4b60718\","
	    "\"model_id\":\"mo\",\"worker_type\":\"regular\","
	    "\"connection_mode\":\"http\",\"priority\":50,\"cost\":1,"
	    "\"labels\":{},\"order\":9}");
	store_close(st);
	btu_fx_start(f);
	w = fx_worker(f, "http://old:5");
	assert_true(uuid_canonical(w->wk_id));
	assert_string_equal(w->wk_model, "mo");
	snprintf(id, sizeof(id), "%s", w->wk_id);
	server_free(f->fx_br);
	f->fx_br = NULL;
	btu_fx_start(f);
	assert_string_equal(fx_worker(f, "http://old:5")->wk_id, id);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_route_round_robin,
		    fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(
		    test_remote_decided_counts_until_reported, fx_setup,
		    fx_teardown),
		cmocka_unit_test_setup_teardown(test_route_errors, fx_setup,
		    fx_teardown),
		cmocka_unit_test_setup_teardown(test_candidate_filter, fx_setup,
		    fx_teardown),
		cmocka_unit_test_setup_teardown(test_exclude_and_overload_shed,
		    fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_policy_label, fx_setup,
		    fx_teardown),
		cmocka_unit_test_setup_teardown(test_admin_shapes, fx_setup,
		    fx_teardown),
		cmocka_unit_test_setup_teardown(test_admin_update_and_alias,
		    fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_store_migrates_ids,
		    fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_admin_validation, fx_setup,
		    fx_teardown),
		cmocka_unit_test_setup_teardown(test_malformed_and_ping,
		    fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_reports_lifecycle,
		    fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_outcomes_breaker, fx_setup,
		    fx_teardown),
		cmocka_unit_test_setup_teardown(test_store_roundtrip, fx_setup,
		    fx_teardown),
		cmocka_unit_test_setup_teardown(test_store_damaged, fx_setup,
		    fx_teardown),
		cmocka_unit_test_setup_teardown(test_write_behind, fx_setup,
		    fx_teardown),
		cmocka_unit_test_setup_teardown(test_restart_keeps_workers,
		    fx_setup, fx_teardown),
	};

	log_init("broker_test", LOG_LEVEL_ERROR);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
