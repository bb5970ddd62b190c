/*
 * decide_test.c: the effective routing key an outcome names
 * (decide_key), the dispatch-time overload re-check (decide_overloaded)
 * against hand-built shm worker slots, and batches of huge routing inputs
 * against a broker stand-in: every message fits IPC_MAX_MSG.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "frontend/frontend.h"
#include "shared/config.h"
#include "shared/ipc.h"

struct frontend *fe;

#define BIG_TEXT (IPC_ROUTE_TEXT_MAX + 1024 * 1024 + 1)
#define NBIG     4

/* What the broker stand-in saw. */
struct seen {
	int sn_msgs;
	int sn_requests;
	int sn_max_per_msg;
	size_t sn_max_text;
	uint64_t sn_sizes;
	int sn_bad_utf8;
};

struct answer {
	int an_calls;
};

static void
test_key(void **state)
{
	struct extract_inputs in;
	char buf[DECIDE_KEY_MAX];

	(void)state;
	memset(&in, 0, sizeof(in));
	assert_string_equal(decide_key(&in, true, buf, sizeof(buf)), "");
	in.ei_routing_key = (char *)"conv12_t3";
	/* Override: lineage-stripped header; without: the raw header. */
	assert_string_equal(decide_key(&in, true, buf, sizeof(buf)), "conv12");
	assert_string_equal(decide_key(&in, false, buf, sizeof(buf)),
	    "conv12_t3");
	/* The rid key wins, with the override only. */
	in.ei_rid_key = (char *)"rid7";
	assert_string_equal(decide_key(&in, true, buf, sizeof(buf)), "rid7");
	assert_string_equal(decide_key(&in, false, buf, sizeof(buf)),
	    "conv12_t3");
	in.ei_rid_key = (char *)"";
	assert_string_equal(decide_key(&in, true, buf, sizeof(buf)), "conv12");
	/* Too long for the buffer: no key rather than a cut one. */
	assert_string_equal(decide_key(&in, false, buf, 4), "");
}

static void
test_overloaded(void **state)
{
	char run[64];
	struct shm *shm;
	struct shm_worker w;
	uint32_t gen;

	(void)state;
	snprintf(run, sizeof(run), "/tmp/decide_test.XXXXXX");
	assert_non_null(mkdtemp(run));
	assert_non_null(shm = shm_open_segment(run));
	memset(&w, 0, sizeof(w));
	w.sw_in_use = 1;
	w.sw_status = SHM_WORKER_READY;
	snprintf(w.sw_url, sizeof(w.sw_url), "http://127.0.0.1:1");
	gen = shm_worker_write(shm, 2, &w);
	assert_false(decide_overloaded(shm, 2, gen));
	w.sw_overloaded = 1;
	assert_int_equal(shm_worker_write(shm, 2, &w), gen);
	assert_true(decide_overloaded(shm, 2, gen));
	/* Another generation is another worker: not shed by this flag. */
	assert_false(decide_overloaded(shm, 2, gen + 1));
	/* A slot out of range or unused is not overloaded. */
	assert_false(decide_overloaded(shm, SHM_MAX_WORKERS + 1, gen));
	assert_false(decide_overloaded(shm, 3, 0));
	shm_close(shm);
	shm_unlink_segment(run);
	rmdir(run);
}

static void
stand_in_cb(void *arg, const uint8_t *msg, size_t len, uint8_t **reply,
    size_t *reply_len)
{
	struct seen *sn = arg;
	Smg__BrokerReply r = SMG__BROKER_REPLY__INIT;
	Smg__DecisionBatch db = SMG__DECISION_BATCH__INIT;
	Smg__Decision *d, **dp;
	Smg__FrontendMsg *m;
	const char *why;
	size_t i, tl;

	assert_true(len <= IPC_MAX_MSG);
	m = ipc_decode_frontend(msg, len, &why);
	assert_non_null(m);
	if (m->body_case != SMG__FRONTEND_MSG__BODY_ROUTE_BATCH) {
		*reply = ipc_pack_error("unknown", "", reply_len);
		smg__frontend_msg__free_unpacked(m, NULL);
		return;
	}
	sn->sn_msgs++;
	sn->sn_requests += (int)m->route_batch->n_requests;
	if ((int)m->route_batch->n_requests > sn->sn_max_per_msg)
		sn->sn_max_per_msg = (int)m->route_batch->n_requests;
	d = calloc(m->route_batch->n_requests + 1, sizeof(*d));
	dp = calloc(m->route_batch->n_requests + 1, sizeof(*dp));
	assert_true(d != NULL && dp != NULL);
	for (i = 0; i < m->route_batch->n_requests; i++) {
		const Smg__RouteRequest *rq = m->route_batch->requests[i];

		tl = rq->text != NULL ? strlen(rq->text) : 0;
		if (tl > sn->sn_max_text)
			sn->sn_max_text = tl;
		/* A cut never splits a UTF-8 character. */
		if (tl > 0 && ((unsigned char)rq->text[tl - 1] & 0xc0) == 0xc0)
			sn->sn_bad_utf8++;
		sn->sn_sizes += rq->size;
		smg__decision__init(&d[i]);
		d[i].id = rq->id;
		d[i].status = SMG__DECISION_STATUS__DECISION_ERROR;
		d[i].http_status = 503;
		d[i].error_code = (char *)"from_broker";
		dp[i] = &d[i];
	}
	db.n_decisions = m->route_batch->n_requests;
	db.decisions = dp;
	r.body_case = SMG__BROKER_REPLY__BODY_DECISION_BATCH;
	r.decision_batch = &db;
	*reply = ipc_pack_broker(&r, reply_len);
	free(dp);
	free(d);
	smg__frontend_msg__free_unpacked(m, NULL);
}

static void
answer_cb(void *arg, const struct decision *d)
{
	struct answer *an = arg;

	(void)d;
	an->an_calls++;
}

static void
tick_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
}

static void
test_huge_inputs_fit(void **state)
{
	static struct frontend fe_state;
	static struct config cf;
	struct extract_inputs in[NBIG + 1];
	struct decide_item it[NBIG + 1];
	struct answer an[NBIG + 1];
	struct seen sn;
	struct ipc_server *srv;
	char run[] = "/tmp/decide_test.XXXXXX", url[128];
	ev_tstamp end;
	ev_timer tick;
	int i, calls;

	(void)state;
	memset(&sn, 0, sizeof(sn));
	memset(in, 0, sizeof(in));
	memset(it, 0, sizeof(it));
	memset(an, 0, sizeof(an));
	assert_non_null(mkdtemp(run));
	fe = &fe_state;
	fe->fe_loop = ev_loop_new(EVFLAG_AUTO);
	fe->fe_cf = &cf;
	fe->fe_shm = shm_open_segment(run);
	assert_non_null(fe->fe_shm);
	fe->fe_row = shm_frontend_claim(fe->fe_shm, -1);
	stats_init();
	assert_int_equal(ipc_url(url, sizeof(url), run, IPC_BROKER_SOCK), 0);
	srv =
	    ipc_server_new(fe->fe_loop, url, IPC_SERVER_REP, stand_in_cb, &sn);
	assert_non_null(srv);
	fe->fe_broker = ipc_client_new(fe->fe_loop, url, IPC_CLIENT_REQ, 64);
	assert_non_null(fe->fe_broker);
	decide_init();
	/* Connected first, as a running frontend is. */
	end = ev_time() + 10.0;
	while (ipc_client_down_secs(fe->fe_broker) > 0. && ev_time() < end) {
		ev_timer_init(&tick, tick_cb, 0.01, 0);
		ev_timer_start(fe->fe_loop, &tick);
		ev_run(fe->fe_loop, EVRUN_ONCE);
		ev_timer_stop(fe->fe_loop, &tick);
	}
	assert_true(ipc_client_down_secs(fe->fe_broker) == 0.);

	/* Four texts over the cut (two-byte characters), one small. */
	for (i = 0; i <= NBIG; i++) {
		size_t n = i < NBIG ? BIG_TEXT : 5, k;

		in[i].ei_text = malloc(n + 1);
		assert_non_null(in[i].ei_text);
		for (k = 0; k + 1 < n; k += 2) {
			in[i].ei_text[k] = (char)0xc3;
			in[i].ei_text[k + 1] = (char)0xa9;
		}
		if (k < n)
			in[i].ei_text[k] = 'a';
		in[i].ei_text[n] = '\0';
		in[i].ei_text_len = n;
		in[i].ei_has_text = true;
		in[i].ei_size = n;
		in[i].ei_model = (char *)"m";
		it[i].di_in = &in[i];
		it[i].di_cb = answer_cb;
		it[i].di_arg = &an[i];
		decide_submit(&it[i]);
	}
	end = ev_time() + 20.0;
	do {
		ev_timer_init(&tick, tick_cb, 0.01, 0);
		ev_timer_start(fe->fe_loop, &tick);
		ev_run(fe->fe_loop, EVRUN_ONCE);
		ev_timer_stop(fe->fe_loop, &tick);
		for (calls = 0, i = 0; i <= NBIG; i++)
			calls += an[i].an_calls;
	} while (
	    (calls < NBIG + 1 || sn.sn_requests < NBIG + 1) && ev_time() < end);

	/*
	 * Every question answered once: by the broker, or locally when a
	 * sanitizer build is too slow for the decision deadline. All of
	 * them were sent in one flush, whatever the deadlines did.
	 */
	for (i = 0; i <= NBIG; i++)
		assert_int_equal(an[i].an_calls, 1);
	assert_int_equal(sn.sn_requests, NBIG + 1);
	/* At most one cut text per message; each within the limit. */
	assert_true(sn.sn_msgs >= NBIG);
	assert_true(sn.sn_max_per_msg <= 2);
	assert_true(sn.sn_max_text <= IPC_ROUTE_TEXT_MAX);
	assert_true(sn.sn_max_text >= IPC_ROUTE_TEXT_MAX - 1);
	assert_int_equal(sn.sn_bad_utf8, 0);
	/* The broker learns the whole size; the inputs are intact. */
	assert_int_equal(sn.sn_sizes, (uint64_t)NBIG * BIG_TEXT + 5);
	for (i = 0; i <= NBIG; i++) {
		assert_int_equal(strlen(in[i].ei_text), in[i].ei_text_len);
		free(in[i].ei_text);
	}

	decide_shutdown();
	ipc_client_free(fe->fe_broker);
	ipc_server_free(srv);
	shm_row_release(fe->fe_shm, fe->fe_row);
	shm_close(fe->fe_shm);
	shm_unlink_segment(run);
	rmdir(run);
	ev_loop_destroy(fe->fe_loop);
	fe = NULL;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_key),
		cmocka_unit_test(test_overloaded),
		cmocka_unit_test(test_huge_inputs_fit),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
