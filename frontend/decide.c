/*
 * decide.c: the frontend's side of the broker conversation. Every routing
 * question that becomes ready during one loop turn travels in one
 * RouteBatch (flushed from an ev_prepare watcher, with the pending
 * outcomes piggy-backed); the DecisionBatch answers them in order. When
 * the broker does not answer in time the questions are answered by the
 * local fallback, and until a ping succeeds again every question is.
 * Batches are not held back while another is out: in
 * tests/bench/datapath.py one batch in flight at a time (on a plain REQ
 * socket) cost more CPU per request and lower throughput than a batch
 * per loop turn on nng contexts.
 *
 * No message may exceed what the broker accepts (IPC_MAX_MSG): a request's
 * routing text is cut to IPC_ROUTE_TEXT_MAX bytes and its token ids to
 * IPC_ROUTE_TOKENS_MAX (the rest changes no routing choice worth a frame
 * the broker would refuse), and a batch that would not fit one message
 * goes as several.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nng/nng.h>

#include "frontend/frontend.h"
#include "shared/ipc.h"
#include "shared/log.h"

#define DECIDE_MAX_OUTCOMES 8192
/* A RouteRequest's own bytes in a batch: tag and length prefix. */
#define DECIDE_ITEM_FRAMING 8
/* The envelope's own fields around the batch. */
#define DECIDE_ENVELOPE_SLACK 64
/* Not ready after the broker has been unreachable this long (seconds). */
#define DECIDE_READY_GRACE 5.0

struct decide_batch {
	size_t db_n;
	ev_tstamp db_sent;
	/* keys of items cancelled after the send, or NULL */
	char (*db_keys)[DECIDE_KEY_MAX];
	struct decide_item *db_items[];
};

static TAILQ_HEAD(, decide_item) decide_queue = TAILQ_HEAD_INITIALIZER(
    decide_queue);
static size_t decide_nqueued;
static ev_prepare decide_prep;
static ev_timer decide_outcome_timer;
static ev_timer decide_ping_timer;
static Smg__Outcome *decide_outcomes;
static char (*decide_keys)[DECIDE_KEY_MAX]; /* the outcomes' keys */
static size_t decide_noutcomes;
/*
 * Failure outcomes go to the broker at once, so its breaker has counted
 * them before the next decision (any frontend's); successes wait for the
 * next batch or FE_OUTCOME_FLUSH. One that comes during a send goes before
 * the loop sleeps.
 */
static bool decide_sending;
static bool decide_outcome_urgent;
static bool decide_down; /* broker unreachable: decide locally */
static ev_tstamp decide_down_since;
static bool decide_ping_pending;

static void decide_prepare_cb(struct ev_loop *, ev_prepare *, int);
static void decide_outcome_cb(struct ev_loop *, ev_timer *, int);
static void decide_ping_cb(struct ev_loop *, ev_timer *, int);
static void decide_flush(void);
static void decide_local(struct decide_item *);
static void decide_reply_cb(void *, int, const uint8_t *, size_t);
static void decide_pong_cb(void *, int, const uint8_t *, size_t);
static void decide_set_down(bool);
static void decide_outcome_send(void);
static bool decide_breaker_probing(unsigned, uint32_t);
static int decide_send(struct decide_batch *, struct decide_item **, size_t);
static size_t decide_cut_text(const struct extract_inputs *);
static void decide_copy(char *, size_t, const char *);
static void decide_from_proto(const Smg__Decision *, struct decision *);

void
decide_init(void)
{
	decide_outcomes = calloc(DECIDE_MAX_OUTCOMES, sizeof(Smg__Outcome));
	decide_keys = calloc(DECIDE_MAX_OUTCOMES, sizeof(*decide_keys));
	if (decide_outcomes == NULL || decide_keys == NULL)
		fatal("%s: calloc", __func__);
	ev_prepare_init(&decide_prep, decide_prepare_cb);
	ev_prepare_start(fe->fe_loop, &decide_prep);
	ev_timer_init(&decide_outcome_timer, decide_outcome_cb,
	    FE_OUTCOME_FLUSH, 0.);
	ev_timer_init(&decide_ping_timer, decide_ping_cb, FE_PING_INTERVAL,
	    FE_PING_INTERVAL);
}

void
decide_shutdown(void)
{
	ev_prepare_stop(fe->fe_loop, &decide_prep);
	ev_timer_stop(fe->fe_loop, &decide_outcome_timer);
	ev_timer_stop(fe->fe_loop, &decide_ping_timer);
	free(decide_outcomes);
	decide_outcomes = NULL;
	free(decide_keys);
	decide_keys = NULL;
	decide_noutcomes = 0;
}

void
decide_submit(struct decide_item *it)
{
	it->di_queued = true;
	it->di_batch = NULL;
	TAILQ_INSERT_TAIL(&decide_queue, it, di_link);
	decide_nqueued++;
}

void
decide_cancel(struct decide_item *it)
{
	struct decide_batch *b;

	if (it->di_queued) {
		TAILQ_REMOVE(&decide_queue, it, di_link);
		decide_nqueued--;
		it->di_queued = false;
	}
	if ((b = it->di_batch) != NULL) {
		b->db_items[it->di_index] = NULL;
		it->di_batch = NULL;
		/* The broker counts the key's in-flight: the reply ends it. */
		if (b->db_keys == NULL)
			b->db_keys = calloc(b->db_n, sizeof(*b->db_keys));
		if (b->db_keys != NULL)
			decide_key(it->di_in,
			    fe->fe_cf->cf_routing_key_override,
			    b->db_keys[it->di_index], sizeof(b->db_keys[0]));
	}
}

const char *
decide_key(const struct extract_inputs *in, bool override, char *buf,
    size_t len)
{
	const char *k = NULL;
	size_t n;

	if (len == 0)
		return buf;
	buf[0] = '\0';
	if (override && in->ei_rid_key != NULL && in->ei_rid_key[0] != '\0')
		k = in->ei_rid_key;
	else if (in->ei_routing_key != NULL && in->ei_routing_key[0] != '\0')
		k = in->ei_routing_key;
	if (k == NULL)
		return buf;
	n = strlen(k);
	if (override && k == in->ei_routing_key)
		n = extract_strip_lineage(k, n);
	if (n >= len)
		return buf; /* longer than any key the broker counts */
	memcpy(buf, k, n);
	buf[n] = '\0';
	return buf;
}

bool
decide_overloaded(struct shm *shm, unsigned slot, uint32_t generation)
{
	struct shm_worker w;

	if (shm_worker_read(shm, slot, &w) == -1 ||
	    w.sw_generation != generation)
		return false;
	return w.sw_overloaded != 0;
}

bool
decide_dispatch_shed(const struct decision *d)
{
	if (!decide_overloaded(fe->fe_shm, d->dc_slot, d->dc_generation))
		return false;
	stats_add("smg_worker_overload_shed_total", "stage=\"dispatch\"", 1);
	return true;
}

void
decide_outcome_of(const struct decision *d, const struct extract_inputs *in,
    int http_status, bool transport_error, bool no_breaker_sample,
    const struct outcome_live *live)
{
	char key[DECIDE_KEY_MAX];

	if (d->dc_fallback)
		key[0] = '\0';
	else
		decide_key(in, fe->fe_cf->cf_routing_key_override, key,
		    sizeof(key));
	decide_outcome(d->dc_slot, d->dc_generation, http_status,
	    transport_error, key, no_breaker_sample, live, d->dc_cached_tokens);
}

void
decide_outcome(unsigned slot, uint32_t generation, int http_status,
    bool transport_error, const char *key, bool no_breaker_sample,
    const struct outcome_live *live, uint32_t cached_tokens)
{
	Smg__Outcome *o;

	if (decide_outcomes == NULL)
		return;
	if (decide_noutcomes == DECIDE_MAX_OUTCOMES) {
		/* The broker has been away long: keep the newest. */
		memmove(decide_outcomes, decide_outcomes + 1,
		    (DECIDE_MAX_OUTCOMES - 1) * sizeof(*o));
		memmove(decide_keys, decide_keys + 1,
		    (DECIDE_MAX_OUTCOMES - 1) * sizeof(*decide_keys));
		decide_noutcomes--;
	}
	decide_copy(decide_keys[decide_noutcomes], sizeof(decide_keys[0]), key);
	o = &decide_outcomes[decide_noutcomes++];
	smg__outcome__init(o);
	o->worker_slot = slot;
	o->worker_generation = generation;
	o->http_status = (uint32_t)http_status;
	o->transport_error = transport_error;
	o->no_breaker_sample = no_breaker_sample;
	if (live != NULL) {
		o->prompt_tokens = live->ol_prompt_tokens;
		o->ttfb_us = live->ol_ttfb_us;
		o->ahead_tokens = live->ol_ahead_tokens;
		o->first_byte = live->ol_first_byte;
		o->unstreamed = live->ol_unstreamed;
		o->cached_tokens = cached_tokens;
	}
	if (decide_down)
		return;
	if (!no_breaker_sample &&
	    (transport_error || http_status == 408 || http_status == 500 ||
	        http_status == 502 || http_status == 503 ||
	        http_status == 504 ||
	        decide_breaker_probing(slot, generation))) {
		if (transport_error || http_status >= 500 || http_status == 408)
			stats_worker_error(slot, generation, http_status,
			    transport_error);
		if (decide_sending)
			decide_outcome_urgent = true;
		else
			decide_outcome_send();
		return;
	}
	if (!ev_is_active(&decide_outcome_timer))
		ev_timer_start(fe->fe_loop, &decide_outcome_timer);
}

static void
decide_prepare_cb(struct ev_loop *loop, ev_prepare *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
	if (decide_nqueued > 0)
		decide_flush(); /* carries every pending outcome */
	else if (decide_outcome_urgent)
		decide_outcome_send();
	decide_outcome_urgent = false;
}

/*
 * Whether the worker's breaker is not Closed: its successes decide the
 * half-open probe, so they go at once too, in order with failures that
 * other frontends send.
 */
static bool
decide_breaker_probing(unsigned slot, uint32_t generation)
{
	struct shm_worker w;

	if (shm_worker_read(fe->fe_shm, slot, &w) == -1 ||
	    w.sw_generation != generation)
		return false;
	return w.sw_breaker != SHM_BREAKER_CLOSED;
}

/* Sends the pending outcomes alone (a failure now, or the timer). */
static void
decide_outcome_send(void)
{
	struct decide_batch *b;

	if (decide_noutcomes == 0 || decide_down)
		return;
	if ((b = calloc(1, sizeof(*b))) == NULL)
		return;
	if (decide_send(b, NULL, 0) != 0)
		free(b);
}

static void
decide_outcome_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
	decide_outcome_send();
}

static void
decide_set_down(bool down)
{
	if (down == decide_down)
		return;
	decide_down = down;
	if (down) {
		decide_down_since = ev_time();
		log_warnx("%s: broker %s unreachable, routing locally",
		    __func__, fe->fe_broker_url);
		ev_timer_stop(fe->fe_loop, &decide_outcome_timer);
		ev_timer_again(fe->fe_loop, &decide_ping_timer);
	} else {
		log_info("%s: broker %s reachable again", __func__,
		    fe->fe_broker_url);
		ev_timer_stop(fe->fe_loop, &decide_ping_timer);
		if (decide_noutcomes > 0)
			ev_timer_start(fe->fe_loop, &decide_outcome_timer);
	}
}

static void
decide_local(struct decide_item *it)
{
	struct decision d;
	const char *model = it->di_in->ei_model;

	/* A leg's worker type has the leg's number (ipc.proto). */
	fallback_select(fe->fe_shm, fe->fe_cf, model, it->di_leg,
	    it->di_exclude, it->di_nexclude, &d);
	stats_add("smg_broker_fallback_decisions_total", "", 1);
	it->di_cb(it->di_arg, &d);
}

/*
 * Where the routing text of in is cut (IPC_ROUTE_TEXT_MAX bytes, on a
 * UTF-8 character boundary), or ei_text_len when it is not.
 */
static size_t
decide_cut_text(const struct extract_inputs *in)
{
	size_t n = IPC_ROUTE_TEXT_MAX;

	if (in->ei_text_len <= n)
		return in->ei_text_len;
	while (n > 0 && ((unsigned char)in->ei_text[n] & 0xc0) == 0x80)
		n--;
	return n;
}

/*
 * Packs the batch: a prefix of items[0..n) that fits one message becomes
 * RouteRequests, and every pending outcome travels along. Returns how
 * many items were sent (0 for outcomes alone; b then belongs to the
 * reply), -2 when items[0] cannot fit a message even alone, or -1.
 */
static int
decide_send(struct decide_batch *b, struct decide_item **items, size_t n)
{
	Smg__FrontendMsg m = SMG__FRONTEND_MSG__INIT;
	Smg__RouteBatch rb = SMG__ROUTE_BATCH__INIT;
	Smg__RouteRequest *rr = NULL, **rrp = NULL;
	Smg__Outcome **op = NULL;
	uint8_t *buf = NULL;
	size_t len, i, k, cut_at = 0, budget, sz;
	char saved = '\0';
	const struct extract_inputs *cut_in = NULL;
	int rv = -1;

	if (n > 0 &&
	    ((rr = calloc(n, sizeof(*rr))) == NULL ||
	        (rrp = calloc(n, sizeof(*rrp))) == NULL))
		goto out;
	if (decide_noutcomes > 0 &&
	    (op = calloc(decide_noutcomes, sizeof(*op))) == NULL)
		goto out;
	for (i = 0; i < decide_noutcomes; i++) {
		decide_outcomes[i].sticky_key = decide_keys[i];
		op[i] = &decide_outcomes[i];
	}
	rb.n_outcomes = decide_noutcomes;
	rb.outcomes = op;
	/* From another host: the broker sees this row's load with it. */
	rb.live = hostsync_live();
	budget = IPC_MAX_MSG - DECIDE_ENVELOPE_SLACK -
	    smg__route_batch__get_packed_size(&rb);
	for (k = 0; k < n; k++) {
		const struct extract_inputs *in = items[k]->di_in;
		bool big = in->ei_has_text && in->ei_text != NULL &&
		    in->ei_text_len > IPC_ROUTE_TEXT_MAX;

		/*
		 * At most one request per message is cut, in place (the text
		 * is the request's own buffer), and restored below.
		 */
		if (big && cut_in != NULL)
			break;
		smg__route_request__init(&rr[k]);
		rr[k].id = k;
		rr[k].endpoint = (Smg__Endpoint)in->ei_endpoint;
		rr[k].leg = (Smg__Leg)items[k]->di_leg;
		rr[k].model = in->ei_model != NULL ? in->ei_model : "";
		if (in->ei_has_text && in->ei_text != NULL) {
			rr[k].text = in->ei_text;
			rr[k].has_text = true;
		}
		if (in->ei_has_tokens) {
			rr[k].tokens = in->ei_tokens;
			rr[k].n_tokens = in->ei_ntokens;
			if (rr[k].n_tokens > IPC_ROUTE_TOKENS_MAX)
				rr[k].n_tokens = IPC_ROUTE_TOKENS_MAX;
			rr[k].has_tokens = true;
		}
		if (in->ei_routing_key != NULL)
			rr[k].routing_key = in->ei_routing_key;
		if (in->ei_rid_key != NULL)
			rr[k].rid_key = in->ei_rid_key;
		if (in->ei_has_target_worker) {
			rr[k].target_worker = in->ei_target_worker;
			rr[k].has_target_worker = true;
		}
		if (in->ei_has_implicit_key) {
			rr[k].implicit_key = in->ei_implicit_key;
			rr[k].has_implicit_key = true;
		}
		rr[k].attempt = items[k]->di_attempt;
		rr[k].exclude_slots = (uint32_t *)items[k]->di_exclude;
		rr[k].n_exclude_slots = items[k]->di_nexclude;
		rr[k].size = in->ei_size;
		rrp[k] = &rr[k];
		if (big) {
			cut_in = in;
			cut_at = decide_cut_text(in);
			saved = in->ei_text[cut_at];
			in->ei_text[cut_at] = '\0';
		}
		sz = smg__route_request__get_packed_size(&rr[k]) +
		    DECIDE_ITEM_FRAMING;
		if (sz > budget) {
			if (big) {
				in->ei_text[cut_at] = saved;
				cut_in = NULL;
			}
			if (k == 0) {
				/* Cannot travel even alone (a huge name). */
				rv = -2;
				goto out;
			}
			break; /* the rest goes in the next message */
		}
		budget -= sz;
	}
	rb.n_requests = k;
	rb.requests = rrp;
	m.version = IPC_VERSION;
	m.body_case = SMG__FRONTEND_MSG__BODY_ROUTE_BATCH;
	m.route_batch = &rb;
	if ((buf = ipc_pack_frontend(&m, &len)) == NULL)
		goto out;
	/* ev_time: ev_now is the start of this loop turn, not the send. */
	b->db_sent = ev_time();
	decide_sending = true;
	if (ipc_client_send(fe->fe_broker, buf, len, FE_BROKER_TIMEOUT_MS,
	        decide_reply_cb, b) == -1) {
		decide_sending = false;
		goto out;
	}
	decide_sending = false;
	/* Outcomes queued during the send stay for the next one. */
	if (decide_noutcomes > rb.n_outcomes) {
		memmove(decide_outcomes, decide_outcomes + rb.n_outcomes,
		    (decide_noutcomes - rb.n_outcomes) *
		        sizeof(decide_outcomes[0]));
		memmove(decide_keys, decide_keys + rb.n_outcomes,
		    (decide_noutcomes - rb.n_outcomes) *
		        sizeof(decide_keys[0]));
	}
	decide_noutcomes -= rb.n_outcomes;
	if (decide_noutcomes == 0)
		ev_timer_stop(fe->fe_loop, &decide_outcome_timer);
	if (cut_in != NULL)
		stats_add("smg_broker_routing_text_cut_total", "", 1);
	rv = (int)k;
out:
	if (cut_in != NULL)
		cut_in->ei_text[cut_at] = saved;
	free(buf);
	free(op);
	free(rrp);
	free(rr);
	return rv;
}

static void
decide_flush(void)
{
	struct decide_batch *b;
	struct decide_item *it;
	size_t n, i;
	int sent;

	while (decide_nqueued > 0 && !decide_down) {
		n = decide_nqueued;
		i = 0;
		if ((b = calloc(1, sizeof(*b) + n * sizeof(b->db_items[0]))) ==
		    NULL)
			break;
		TAILQ_FOREACH(it, &decide_queue, di_link)
		b->db_items[i++] = it;
		if ((sent = decide_send(b, b->db_items, n)) == -2) {
			free(b);
			it = TAILQ_FIRST(&decide_queue);
			log_warnx(
			    "%s: routing inputs too large for the broker, "
			    "routing locally",
			    __func__);
			TAILQ_REMOVE(&decide_queue, it, di_link);
			it->di_queued = false;
			decide_nqueued--;
			decide_local(it);
			continue;
		}
		if (sent <= 0) {
			free(b);
			stats_add("smg_broker_errors_total", "reason=\"send\"",
			    1);
			decide_set_down(true);
			break;
		}
		b->db_n = (size_t)sent;
		for (i = 0; i < b->db_n; i++) {
			it = b->db_items[i];
			TAILQ_REMOVE(&decide_queue, it, di_link);
			it->di_queued = false;
			it->di_batch = b;
			it->di_index = i;
			decide_nqueued--;
		}
	}
	/* Broker away or the send failed: answer locally, now. */
	while ((it = TAILQ_FIRST(&decide_queue)) != NULL) {
		TAILQ_REMOVE(&decide_queue, it, di_link);
		it->di_queued = false;
		decide_nqueued--;
		decide_local(it);
	}
}

bool
decide_broker_ready(void)
{
	/* No connection, or one whose broker stopped answering pings. */
	if (ipc_client_down_secs(fe->fe_broker) >= DECIDE_READY_GRACE)
		return false;
	return !decide_down ||
	    ev_time() - decide_down_since < DECIDE_READY_GRACE;
}

/* src (NULL: "") into dst, cut to fit; snprintf's "%s" without its cost
 * (three of these per decision). */
static void
decide_copy(char *dst, size_t size, const char *src)
{
	size_t n = src != NULL ? strnlen(src, size - 1) : 0;

	memcpy(dst, src != NULL ? src : "", n);
	dst[n] = '\0';
}

static void
decide_from_proto(const Smg__Decision *pd, struct decision *d)
{
	memset(d, 0, sizeof(*d));
	if (pd->status == SMG__DECISION_STATUS__DECISION_OK) {
		d->dc_ok = true;
		d->dc_slot = pd->worker_slot;
		d->dc_generation = pd->worker_generation;
		d->dc_cached_tokens = pd->cached_tokens;
		decide_copy(d->dc_url, sizeof(d->dc_url), pd->worker_url);
		decide_copy(d->dc_model, sizeof(d->dc_model), pd->model);
		decide_copy(d->dc_policy, sizeof(d->dc_policy), pd->policy);
		decide_copy(d->dc_resolved, sizeof(d->dc_resolved),
		    pd->resolved_model);
		if (fallback_fill_worker(fe->fe_shm, d->dc_slot,
		        d->dc_generation, d) == -1)
			log_debug("%s: slot %u changed since the decision",
			    __func__, d->dc_slot);
		if (d->dc_url[0] == '\0') {
			d->dc_ok = false;
			d->dc_status = 503;
			snprintf(d->dc_code, sizeof(d->dc_code), "%s",
			    "no_available_workers");
			snprintf(d->dc_message, sizeof(d->dc_message), "%s",
			    "All workers are unavailable (circuit breaker "
			    "open or unhealthy)");
		}
		return;
	}
	d->dc_status = pd->http_status != 0 ? (int)pd->http_status : 503;
	snprintf(d->dc_code, sizeof(d->dc_code), "%s",
	    pd->error_code != NULL && pd->error_code[0] != '\0'
	        ? pd->error_code
	        : "no_available_workers");
	snprintf(d->dc_message, sizeof(d->dc_message), "%s",
	    pd->error_message != NULL ? pd->error_message : "");
	d->dc_terminal = pd->terminal;
	d->dc_retry_after = pd->retry_after_secs;
}

static void
decide_reply_cb(void *arg, int status, const uint8_t *reply, size_t len)
{
	struct decide_batch *b = arg;
	Smg__BrokerReply *r = NULL;
	Smg__DecisionBatch *db = NULL;
	struct decision d;
	struct decide_item *it;
	const char *why = "";
	size_t i;

	if (status == 0) {
		if (b->db_n > 0)
			stats_observe("smg_broker_round_trip_seconds", "",
			    ev_time() - b->db_sent);
		if ((r = ipc_decode_broker(reply, len, &why)) != NULL &&
		    r->body_case == SMG__BROKER_REPLY__BODY_DECISION_BATCH)
			db = r->decision_batch;
		else if (r != NULL)
			why = r->body_case == SMG__BROKER_REPLY__BODY_ERROR &&
			        r->error->code != NULL
			    ? r->error->code
			    : "unexpected reply";
		if (db != NULL && db->n_decisions != b->db_n && b->db_n > 0) {
			log_warnx("%s: %zu decisions for %zu requests",
			    __func__, db->n_decisions, b->db_n);
			db = NULL;
			why = "count";
		}
		if (db == NULL && b->db_n > 0)
			log_warnx("%s: bad broker reply: %s", __func__, why);
	} else {
		log_debug("%s: broker: %s", __func__, nng_strerror(status));
		stats_add("smg_broker_errors_total",
		    status == NNG_ETIMEDOUT ? "reason=\"timeout\""
		                            : "reason=\"error\"",
		    1);
		/* Lost connection or deadline: local until a ping answers. */
		if (status != NNG_ECLOSED)
			decide_set_down(true);
	}
	for (i = 0; i < b->db_n; i++) {
		if ((it = b->db_items[i]) == NULL) {
			/* Cancelled: a keyed decision still ends its key. */
			if (db != NULL && b->db_keys != NULL &&
			    b->db_keys[i][0] != '\0' &&
			    db->decisions[i] != NULL &&
			    db->decisions[i]->status ==
			        SMG__DECISION_STATUS__DECISION_OK)
				decide_outcome(db->decisions[i]->worker_slot,
				    db->decisions[i]->worker_generation, 0,
				    false, b->db_keys[i], true, NULL, 0);
			continue;
		}
		it->di_batch = NULL;
		b->db_items[i] = NULL;
		if (status == NNG_ECLOSED)
			continue;
		if (db == NULL || db->decisions[i] == NULL) {
			decide_local(it);
			continue;
		}
		decide_from_proto(db->decisions[i], &d);
		it->di_cb(it->di_arg, &d);
	}
	if (r != NULL)
		smg__broker_reply__free_unpacked(r, NULL);
	free(b->db_keys);
	free(b);
}

static void
decide_ping_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	Smg__FrontendMsg m = SMG__FRONTEND_MSG__INIT;
	Smg__Ping p = SMG__PING__INIT;
	uint8_t *buf;
	size_t len;

	(void)loop;
	(void)w;
	(void)revents;
	if (decide_ping_pending)
		return;
	p.frontend_slot = (uint32_t)fe->fe_row;
	p.pid = (int32_t)getpid();
	m.version = IPC_VERSION;
	m.body_case = SMG__FRONTEND_MSG__BODY_PING;
	m.ping = &p;
	if ((buf = ipc_pack_frontend(&m, &len)) == NULL)
		return;
	if (ipc_client_send(fe->fe_broker, buf, len, FE_BROKER_TIMEOUT_MS,
	        decide_pong_cb, NULL) == 0)
		decide_ping_pending = true;
	free(buf);
}

static void
decide_pong_cb(void *arg, int status, const uint8_t *reply, size_t len)
{
	Smg__BrokerReply *r;
	const char *why;

	(void)arg;
	decide_ping_pending = false;
	if (status != 0)
		return;
	if ((r = ipc_decode_broker(reply, len, &why)) == NULL)
		return;
	if (r->body_case == SMG__BROKER_REPLY__BODY_PONG)
		decide_set_down(false);
	smg__broker_reply__free_unpacked(r, NULL);
}

int
decide_admin(Smg__AdminRequest *ar,
    void (*cb)(void *arg, int status, const uint8_t *reply, size_t len),
    void *arg)
{
	Smg__FrontendMsg m = SMG__FRONTEND_MSG__INIT;
	uint8_t *buf;
	size_t len;
	int rv;

	m.version = IPC_VERSION;
	m.body_case = SMG__FRONTEND_MSG__BODY_ADMIN;
	m.admin = ar;
	if ((buf = ipc_pack_frontend(&m, &len)) == NULL)
		return -1;
	/* No live broker process: wait only the short grace a starting
	 * broker needs, not FE_ADMIN_TIMEOUT_MS (kept for a slow one). */
	rv = ipc_client_send(fe->fe_broker, buf, len,
	    hostsync_broker_alive() ? FE_ADMIN_TIMEOUT_MS : FE_ADMIN_DOWN_MS,
	    cb, arg);
	free(buf);
	return rv;
}
