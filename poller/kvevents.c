/*
 * kvevents.c: KV-cache event subscriptions (workers.md §6). For each Ready
 * or NotReady worker with an event endpoint (label kv_events_endpoint, or
 * the kv_events_config its server info reports) the poller holds a ZMQ SUB
 * socket on the libev loop, decodes each msgpack batch, applies the
 * sequence rules of §6.4 and forwards the events to the broker as a
 * KvEventBatch. Only DP rank 0 (the endpoint as given) is subscribed.
 * Workers reached over gRPC (grpc:// URL, or the grpc_endpoint label)
 * stream the same events with SubscribeKvEvents (§5, §5.1) when a
 * cache_aware policy consumes them; both forms reach the broker through
 * kv_forward with the same sequence rules.
 */
#include "poller/poller.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <msgpack.h>
#include <zmq.h>

#include "shared/config.h"
#include "shared/log.h"
#include "shared/url.h"

#define KV_DEFAULT_ENDPOINT      "tcp://*:5557"
#define KV_DRAIN_MAX             256 /* messages per wake-up, then yield */
#define KV_RCVHWM                10000
#define KV_PROBE_RETRY_MS        10000
#define KV_TIMEOUT_SECS          5.0
#define KV_SEQ_LEN               8
#define KV_STREAM_BACKOFF_MIN_MS 100
#define KV_STREAM_BACKOFF_MAX_MS 30000

static const msgpack_object *kv_map_get(const msgpack_object *, const char *);
static void kv_dp_rank(const msgpack_object *, Smg__KvEventBatch *);
static bool kv_str_is(const msgpack_object *, const char *);
static int kv_hash(const msgpack_object *, int64_t *);
static int kv_hashes(const msgpack_object *, int64_t **, size_t *);
static int kv_event(const msgpack_object *, Smg__KvEvent **);
static void kv_event_free(Smg__KvEvent *);
static int kv_subscribe(struct pworker *, const char *, const char *);
static void kv_io_cb(struct ev_loop *, ev_io *, int);
static void kv_message(struct pworker *, zmq_msg_t *, size_t);
static void kv_probe(struct pworker *, const char *);
static void kv_probe_cb(void *, const struct upstream_result *);
static void kv_forward(struct pworker *, uint64_t, enum kvevents_verdict,
    Smg__KvEventBatch *);
static bool kv_grpc_wanted(const struct config *);
static void kv_grpc_tick(struct pworker *, uint64_t);
static void kv_grpc_msg_cb(void *, const uint8_t *, size_t);
static void kv_grpc_close_cb(void *, const struct grpc_status *);
static void kv_grpc_open_cb(void *);

/* ------------------------------------------------------------ decoding */

static const msgpack_object *
kv_map_get(const msgpack_object *m, const char *key)
{
	size_t n = strlen(key);
	uint32_t i;

	for (i = 0; i < m->via.map.size; i++) {
		const msgpack_object *k = &m->via.map.ptr[i].key;

		if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
		    memcmp(k->via.str.ptr, key, n) == 0)
			return &m->via.map.ptr[i].val;
	}
	return NULL;
}

static bool
kv_str_is(const msgpack_object *o, const char *s)
{
	size_t n = strlen(s);

	return o != NULL && o->type == MSGPACK_OBJECT_STR &&
	    o->via.str.size == n && memcmp(o->via.str.ptr, s, n) == 0;
}

/* An int hash as int64; bytes read big-endian, low 64 bits kept. */
static int
kv_hash(const msgpack_object *o, int64_t *out)
{
	const unsigned char *p;
	uint64_t v = 0;
	uint32_t i, n;

	switch (o->type) {
	case MSGPACK_OBJECT_POSITIVE_INTEGER:
		*out = (int64_t)o->via.u64;
		return 0;
	case MSGPACK_OBJECT_NEGATIVE_INTEGER:
		*out = o->via.i64;
		return 0;
	case MSGPACK_OBJECT_BIN:
		p = (const unsigned char *)o->via.bin.ptr;
		n = o->via.bin.size;
		break;
	case MSGPACK_OBJECT_STR:
		p = (const unsigned char *)o->via.str.ptr;
		n = o->via.str.size;
		break;
	default:
		return -1;
	}
	if (n == 0)
		return -1;
	for (i = n > 8 ? n - 8 : 0; i < n; i++)
		v = v << 8 | p[i];
	*out = (int64_t)v;
	return 0;
}

static int
kv_hashes(const msgpack_object *o, int64_t **out, size_t *n)
{
	uint32_t i;

	*out = NULL;
	*n = 0;
	if (o == NULL || o->type != MSGPACK_OBJECT_ARRAY)
		return -1;
	if (o->via.array.size == 0)
		return 0;
	if ((*out = calloc(o->via.array.size, sizeof(**out))) == NULL)
		return -1;
	for (i = 0; i < o->via.array.size; i++)
		if (kv_hash(&o->via.array.ptr[i], &(*out)[i]) == -1) {
			free(*out);
			*out = NULL;
			return -1;
		}
	*n = o->via.array.size;
	return 0;
}

static void
kv_event_free(Smg__KvEvent *e)
{
	if (e == NULL)
		return;
	if (e->data_case == SMG__KV_EVENT__DATA_STORED && e->stored != NULL) {
		free(e->stored->block_hashes);
		free(e->stored->token_ids);
		free(e->stored);
	} else if (e->data_case == SMG__KV_EVENT__DATA_REMOVED &&
	    e->removed != NULL) {
		free(e->removed->block_hashes);
		free(e->removed);
	} else if (e->data_case == SMG__KV_EVENT__DATA_CLEARED)
		free(e->cleared);
	free(e);
}

/*
 * One event, array form [tag, fields...] or map form {"type": tag, ...}.
 * *out is NULL for an unknown tag. Returns -1 when malformed.
 */
static int
kv_event(const msgpack_object *o, Smg__KvEvent **out)
{
	const msgpack_object *tag, *hashes, *parent = NULL, *tokens = NULL,
	                                    *bsize = NULL;
	const msgpack_object *f = NULL;
	Smg__KvEvent *e;
	uint32_t i, nf = 0;
	bool map;

	*out = NULL;
	if (o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size > 0) {
		map = false;
		f = o->via.array.ptr;
		nf = o->via.array.size;
		tag = &f[0];
	} else if (o->type == MSGPACK_OBJECT_MAP) {
		map = true;
		tag = kv_map_get(o, "type");
	} else
		return -1;
	if (tag == NULL || tag->type != MSGPACK_OBJECT_STR)
		return -1;
	if ((e = calloc(1, sizeof(*e))) == NULL)
		return -1;
	smg__kv_event__init(e);
	if (kv_str_is(tag, "BlockStored")) {
		Smg__KvBlocksStored *s;

		hashes = map ? kv_map_get(o, "block_hashes")
		             : (nf > 1 ? &f[1] : NULL);
		parent = map ? kv_map_get(o, "parent_block_hash")
		             : (nf > 2 ? &f[2] : NULL);
		tokens =
		    map ? kv_map_get(o, "token_ids") : (nf > 3 ? &f[3] : NULL);
		bsize =
		    map ? kv_map_get(o, "block_size") : (nf > 4 ? &f[4] : NULL);
		if ((s = calloc(1, sizeof(*s))) == NULL)
			goto fail;
		smg__kv_blocks_stored__init(s);
		e->data_case = SMG__KV_EVENT__DATA_STORED;
		e->stored = s;
		if (kv_hashes(hashes, &s->block_hashes, &s->n_block_hashes) ==
		    -1)
			goto fail;
		if (parent != NULL && parent->type != MSGPACK_OBJECT_NIL) {
			if (kv_hash(parent, &s->parent_block_hash) == -1)
				goto fail;
			s->has_parent = true;
		}
		if (tokens == NULL || tokens->type != MSGPACK_OBJECT_ARRAY)
			goto fail;
		if (tokens->via.array.size > 0) {
			s->token_ids = calloc(tokens->via.array.size,
			    sizeof(*s->token_ids));
			if (s->token_ids == NULL)
				goto fail;
		}
		for (i = 0; i < tokens->via.array.size; i++) {
			const msgpack_object *t = &tokens->via.array.ptr[i];

			if (t->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
			    t->via.u64 > UINT32_MAX)
				goto fail;
			s->token_ids[i] = (uint32_t)t->via.u64;
		}
		s->n_token_ids = tokens->via.array.size;
		if (bsize != NULL && bsize->type != MSGPACK_OBJECT_NIL) {
			if (bsize->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
			    bsize->via.u64 > UINT32_MAX)
				goto fail;
			s->block_size = (uint32_t)bsize->via.u64;
		}
	} else if (kv_str_is(tag, "BlockRemoved")) {
		Smg__KvBlocksRemoved *r;

		hashes = map ? kv_map_get(o, "block_hashes")
		             : (nf > 1 ? &f[1] : NULL);
		if ((r = calloc(1, sizeof(*r))) == NULL)
			goto fail;
		smg__kv_blocks_removed__init(r);
		e->data_case = SMG__KV_EVENT__DATA_REMOVED;
		e->removed = r;
		if (kv_hashes(hashes, &r->block_hashes, &r->n_block_hashes) ==
		    -1)
			goto fail;
	} else if (kv_str_is(tag, "AllBlocksCleared")) {
		if ((e->cleared = calloc(1, sizeof(*e->cleared))) == NULL)
			goto fail;
		smg__kv_cache_cleared__init(e->cleared);
		e->data_case = SMG__KV_EVENT__DATA_CLEARED;
	} else {
		free(e);
		return 0; /* a newer event kind: not ours to interpret */
	}
	*out = e;
	return 0;
fail:
	kv_event_free(e);
	return -1;
}

void
kvevents_batch_clear(Smg__KvEventBatch *b)
{
	size_t i;

	for (i = 0; i < b->n_events; i++)
		kv_event_free(b->events[i]);
	free(b->events);
	b->events = NULL;
	b->n_events = 0;
}

/* A batch's data-parallel rank: a non-negative integer, else none. */
static void
kv_dp_rank(const msgpack_object *o, Smg__KvEventBatch *b)
{
	if (o != NULL && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
	    o->via.u64 <= INT32_MAX) {
		b->has_dp_rank = true;
		b->dp_rank = (int32_t)o->via.u64;
	}
}

int
kvevents_decode(const void *buf, size_t len, Smg__KvEventBatch *b)
{
	msgpack_unpacked u;
	const msgpack_object *root, *events = NULL;
	Smg__KvEvent *e;
	size_t off = 0;
	uint32_t i;
	int rv = -1;

	b->events = NULL;
	b->n_events = 0;
	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, buf, len, &off) != MSGPACK_UNPACK_SUCCESS ||
	    off != len)
		goto out;
	root = &u.data;
	/* [ts, events, dp_rank?] or {"ts", "events", ...} */
	b->has_dp_rank = false;
	b->dp_rank = 0;
	if (root->type == MSGPACK_OBJECT_ARRAY && root->via.array.size >= 2) {
		events = &root->via.array.ptr[1];
		if (root->via.array.size >= 3)
			kv_dp_rank(&root->via.array.ptr[2], b);
	} else if (root->type == MSGPACK_OBJECT_MAP) {
		events = kv_map_get(root, "events");
		kv_dp_rank(kv_map_get(root, "data_parallel_rank"), b);
	}
	if (events == NULL || events->type != MSGPACK_OBJECT_ARRAY)
		goto out;
	if (events->via.array.size > 0 &&
	    (b->events = calloc(events->via.array.size, sizeof(*b->events))) ==
	        NULL)
		goto out;
	for (i = 0; i < events->via.array.size; i++) {
		if (kv_event(&events->via.array.ptr[i], &e) == -1) {
			kvevents_batch_clear(b);
			goto out;
		}
		if (e != NULL)
			b->events[b->n_events++] = e;
	}
	rv = 0;
out:
	msgpack_unpacked_destroy(&u);
	return rv;
}

/* ------------------------------------------------------------ gRPC form */

/* Appends one stored event of blocks[from, to) (equal sizes). */
static int
kv_grpc_stored(Smg__KvEventBatch *out, Smg__KvEvent **events,
    Smg__Grpc__Common__KvBlock *const *blocks, size_t from, size_t to,
    bool has_parent, int64_t parent)
{
	Smg__KvEvent *e;
	Smg__KvBlocksStored *st;
	size_t i, per = blocks[from]->n_token_ids, k = 0;

	if ((e = calloc(1, sizeof(*e))) == NULL)
		return -1;
	smg__kv_event__init(e);
	events[out->n_events++] = e;
	if ((st = calloc(1, sizeof(*st))) == NULL)
		return -1;
	smg__kv_blocks_stored__init(st);
	e->data_case = SMG__KV_EVENT__DATA_STORED;
	e->stored = st;
	st->has_parent = has_parent;
	st->parent_block_hash = parent;
	st->block_size = (uint32_t)per;
	if ((st->block_hashes = calloc(to - from, sizeof(int64_t))) == NULL)
		return -1;
	st->n_block_hashes = to - from;
	if (per > 0 &&
	    (st->token_ids = calloc((to - from) * per, sizeof(uint32_t))) ==
	        NULL)
		return -1;
	for (i = from; i < to; i++) {
		st->block_hashes[i - from] = blocks[i]->block_hash;
		if (per == 0)
			continue;
		memcpy(st->token_ids + k, blocks[i]->token_ids,
		    per * sizeof(uint32_t));
		k += per;
	}
	st->n_token_ids = k;
	return 0;
}

int
kvevents_from_grpc(const Smg__Grpc__Common__KvEventBatch *in,
    Smg__KvEventBatch *out)
{
	Smg__KvEvent **events, *e;
	size_t i, j, from, cap = 0;

	out->events = NULL;
	out->n_events = 0;
	out->has_dp_rank = in->has_dp_rank && in->dp_rank >= 0;
	out->dp_rank = out->has_dp_rank ? in->dp_rank : 0;
	for (i = 0; i < in->n_events; i++) {
		const Smg__Grpc__Common__KvCacheEvent *ge = in->events[i];

		/* A stored event may split at each change of block size. */
		if (ge->data_case ==
		        SMG__GRPC__COMMON__KV_CACHE_EVENT__DATA_STORED &&
		    ge->stored != NULL)
			cap += ge->stored->n_blocks;
		else
			cap++;
	}
	if (cap == 0)
		return 0;
	if ((events = calloc(cap, sizeof(*events))) == NULL)
		return -1;
	out->events = events;
	for (i = 0; i < in->n_events; i++) {
		const Smg__Grpc__Common__KvCacheEvent *ge = in->events[i];

		switch (ge->data_case) {
		case SMG__GRPC__COMMON__KV_CACHE_EVENT__DATA_STORED: {
			const Smg__Grpc__Common__KvBlocksStored *gs =
			    ge->stored;
			bool hp = gs->has_parent_block_hash;
			int64_t parent = gs->parent_block_hash;

			for (from = 0, j = 1; from < gs->n_blocks; j++) {
				if (j < gs->n_blocks &&
				    gs->blocks[j]->n_token_ids ==
				        gs->blocks[from]->n_token_ids)
					continue;
				if (kv_grpc_stored(out, events, gs->blocks,
				        from, j, hp, parent) == -1)
					goto fail;
				/* The next run hangs off this one's last. */
				hp = true;
				parent = gs->blocks[j - 1]->block_hash;
				from = j;
			}
			break;
		}
		case SMG__GRPC__COMMON__KV_CACHE_EVENT__DATA_REMOVED: {
			const Smg__Grpc__Common__KvBlocksRemoved *gr =
			    ge->removed;

			if ((e = calloc(1, sizeof(*e))) == NULL)
				goto fail;
			smg__kv_event__init(e);
			events[out->n_events++] = e;
			if ((e->removed = calloc(1, sizeof(*e->removed))) ==
			    NULL)
				goto fail;
			smg__kv_blocks_removed__init(e->removed);
			e->data_case = SMG__KV_EVENT__DATA_REMOVED;
			if (gr->n_block_hashes > 0) {
				e->removed->block_hashes =
				    calloc(gr->n_block_hashes, sizeof(int64_t));
				if (e->removed->block_hashes == NULL)
					goto fail;
				memcpy(e->removed->block_hashes,
				    gr->block_hashes,
				    gr->n_block_hashes * sizeof(int64_t));
				e->removed->n_block_hashes = gr->n_block_hashes;
			}
			break;
		}
		case SMG__GRPC__COMMON__KV_CACHE_EVENT__DATA_CLEARED:
			if ((e = calloc(1, sizeof(*e))) == NULL)
				goto fail;
			smg__kv_event__init(e);
			events[out->n_events++] = e;
			if ((e->cleared = calloc(1, sizeof(*e->cleared))) ==
			    NULL)
				goto fail;
			smg__kv_cache_cleared__init(e->cleared);
			e->data_case = SMG__KV_EVENT__DATA_CLEARED;
			break;
		default:
			break; /* an event kind newer than ours */
		}
	}
	return 0;
fail:
	kvevents_batch_clear(out);
	return -1;
}

/* ------------------------------------------------------------ sequence */

enum kvevents_verdict
kvevents_sequence(struct kvevents_seq *q, uint64_t seq)
{
	bool reset;

	if (!q->kq_have) {
		/* A new subscription: what the broker had may be stale. */
		q->kq_have = true;
		q->kq_last = seq;
		q->kq_reset_next = false;
		return KVEVENTS_RESET;
	}
	if (seq == q->kq_last + 1) {
		q->kq_last = seq;
		reset = q->kq_reset_next;
		q->kq_reset_next = false;
		return reset ? KVEVENTS_RESET : KVEVENTS_APPLY;
	}
	if (seq == 0) {
		/* The publisher restarted: its cache started empty. */
		q->kq_last = 0;
		q->kq_reset_next = false;
		return KVEVENTS_RESET;
	}
	if (seq <= q->kq_last)
		return KVEVENTS_SKIP;
	/* A gap: the lost batches are unknown, start over from this one. */
	q->kq_last = seq;
	q->kq_reset_next = false;
	return KVEVENTS_RESET;
}

/* ------------------------------------------------------------ endpoints */

int
kvevents_resolve(const char *endpoint, const char *worker_url, char *out,
    size_t len)
{
	const char *hp, *colon;
	char host[SHM_URL_MAX];
	struct url u;
	size_t hl;
	int n;

	if (strncmp(endpoint, "tcp://", 6) != 0) {
		n = snprintf(out, len, "%s", endpoint);
		return n < 0 || (size_t)n >= len ? -1 : 0;
	}
	hp = endpoint + 6;
	if ((colon = strrchr(hp, ':')) == NULL || colon[1] == '\0')
		return -1;
	hl = (size_t)(colon - hp);
	if (!(hl == 0 || (hl == 1 && hp[0] == '*') ||
	        (hl == 7 && memcmp(hp, "0.0.0.0", 7) == 0) ||
	        (hl == 4 && memcmp(hp, "[::]", 4) == 0) ||
	        (hl == 2 && memcmp(hp, "::", 2) == 0))) {
		n = snprintf(out, len, "%s", endpoint);
		return n < 0 || (size_t)n >= len ? -1 : 0;
	}
	/* The worker's own host, brackets kept for an IPv6 literal. */
	if (url_parse(worker_url, &u) == -1)
		return -1;
	n = snprintf(host, sizeof(host), u.u_ipv6 ? "[%s]" : "%s", u.u_host);
	if (n < 0 || (size_t)n >= sizeof(host))
		return -1;
	n = snprintf(out, len, "tcp://%s%s", host, colon);
	return n < 0 || (size_t)n >= len ? -1 : 0;
}

int
kvevents_parse_server_info(const char *body, size_t len, char *endpoint,
    size_t elen, char *topic, size_t tlen)
{
	cJSON *root, *cfg, *inner = NULL, *it;
	const char *ep = NULL, *tp = "";
	int rv = -1, n;

	if ((root = cJSON_ParseWithLength(body, len)) == NULL)
		return -1;
	cfg = cJSON_IsObject(root)
	    ? cJSON_GetObjectItemCaseSensitive(root, "kv_events_config")
	    : NULL;
	if (cJSON_IsString(cfg) && cfg->valuestring != NULL)
		cfg = inner = cJSON_Parse(cfg->valuestring);
	if (!cJSON_IsObject(cfg))
		goto out;
	it = cJSON_GetObjectItemCaseSensitive(cfg, "publisher");
	if (it != NULL &&
	    !(cJSON_IsString(it) && strcmp(it->valuestring, "zmq") == 0))
		goto out;
	it = cJSON_GetObjectItemCaseSensitive(cfg, "enable_kv_cache_events");
	if (cJSON_IsFalse(it))
		goto out;
	it = cJSON_GetObjectItemCaseSensitive(cfg, "endpoint");
	if (cJSON_IsString(it) && it->valuestring[0] != '\0')
		ep = it->valuestring;
	else if (it == NULL || cJSON_IsNull(it))
		ep = KV_DEFAULT_ENDPOINT;
	else
		goto out;
	it = cJSON_GetObjectItemCaseSensitive(cfg, "topic");
	if (cJSON_IsString(it))
		tp = it->valuestring;
	n = snprintf(endpoint, elen, "%s", ep);
	if (n < 0 || (size_t)n >= elen)
		goto out;
	n = snprintf(topic, tlen, "%s", tp);
	if (n < 0 || (size_t)n >= tlen)
		goto out;
	rv = 0;
out:
	cJSON_Delete(inner);
	cJSON_Delete(root);
	return rv;
}

/* ------------------------------------------------------------ probing */

static void
kv_probe(struct pworker *pw, const char *path)
{
	struct poller *p = pw->pw_poller;
	struct kvevents_state *ks = &pw->pw_kv;

	ks->ks_probe = KVEVENTS_PROBE_BUSY;
	ks->ks_req = fetch_get(p, pw->pw_base, path, pw->pw_api_key,
	    KV_TIMEOUT_SECS, POLLER_BODY_MAX, kv_probe_cb, pw);
	if (ks->ks_req == NULL) {
		ks->ks_probe = KVEVENTS_PROBE_NONE;
		ks->ks_next_ms = shm_now_ms() + KV_PROBE_RETRY_MS;
	}
}

static void
kv_probe_cb(void *arg, const struct upstream_result *res)
{
	struct pworker *pw = arg;
	struct kvevents_state *ks = &pw->pw_kv;

	ks->ks_req = NULL;
	if (res->ur_error != UPSTREAM_OK) {
		/* Unreachable for now: ask again later. */
		ks->ks_probe = KVEVENTS_PROBE_NONE;
		ks->ks_probe_fallback = false;
		ks->ks_next_ms = shm_now_ms() + KV_PROBE_RETRY_MS;
		return;
	}
	if (res->ur_status == 404 && !ks->ks_probe_fallback) {
		ks->ks_probe_fallback = true;
		kv_probe(pw, "/server_info");
		return;
	}
	ks->ks_probe = KVEVENTS_PROBE_DONE;
	ks->ks_found[0] = ks->ks_topic[0] = '\0';
	if (res->ur_status < 200 || res->ur_status >= 300 ||
	    res->ur_truncated ||
	    kvevents_parse_server_info(res->ur_body, res->ur_body_len,
	        ks->ks_found, sizeof(ks->ks_found), ks->ks_topic,
	        sizeof(ks->ks_topic)) == -1) {
		ks->ks_found[0] = ks->ks_topic[0] = '\0';
		log_debug("%s: %s publishes no KV events", __func__,
		    pw->pw_url);
		return;
	}
	log_info("%s: %s publishes KV events on %s", __func__, pw->pw_url,
	    ks->ks_found);
}

/* ------------------------------------------------------------ subscribing */

static int
kv_subscribe(struct pworker *pw, const char *endpoint, const char *topic)
{
	struct poller *p = pw->pw_poller;
	struct kvevents_state *ks = &pw->pw_kv;
	int linger = 0, hwm = KV_RCVHWM, fd;
	size_t fdlen = sizeof(fd);
	void *s;

	if (p->p_zmq == NULL && (p->p_zmq = zmq_ctx_new()) == NULL) {
		log_warnx("%s: zmq_ctx_new: %s", __func__,
		    zmq_strerror(zmq_errno()));
		return -1;
	}
	if ((s = zmq_socket(p->p_zmq, ZMQ_SUB)) == NULL) {
		log_warnx("%s: zmq_socket: %s", __func__,
		    zmq_strerror(zmq_errno()));
		return -1;
	}
	if (zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger)) == -1 ||
	    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof(hwm)) == -1 ||
	    zmq_setsockopt(s, ZMQ_SUBSCRIBE, topic, strlen(topic)) == -1 ||
	    zmq_connect(s, endpoint) == -1 ||
	    zmq_getsockopt(s, ZMQ_FD, &fd, &fdlen) == -1) {
		log_warnx("%s: %s: subscribe %s: %s", __func__, pw->pw_url,
		    endpoint, zmq_strerror(zmq_errno()));
		zmq_close(s);
		return -1;
	}
	ks->ks_sock = s;
	snprintf(ks->ks_endpoint, sizeof(ks->ks_endpoint), "%s", endpoint);
	memset(&ks->ks_seq, 0, sizeof(ks->ks_seq));
	ks->ks_batches = 0;
	ev_io_init(&ks->ks_io, kv_io_cb, fd, EV_READ);
	ks->ks_io.data = pw;
	ev_io_start(p->p_loop, &ks->ks_io);
	/* ZMQ_FD is edge-triggered: look for what is already queued. */
	ev_feed_event(p->p_loop, &ks->ks_io, EV_READ);
	log_info("%s: %s: subscribed to KV events on %s", __func__, pw->pw_url,
	    endpoint);
	return 0;
}

/* Drains the socket: every wake-up, until EAGAIN or KV_DRAIN_MAX. */
static void
kv_io_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct pworker *pw = w->data;
	struct kvevents_state *ks = &pw->pw_kv;
	zmq_msg_t frames[3];
	uint32_t events;
	size_t sz, nframes, i;
	unsigned n;
	int more, done;

	(void)revents;
	for (n = 0; n < KV_DRAIN_MAX && ks->ks_sock != NULL; n++) {
		sz = sizeof(events);
		if (zmq_getsockopt(ks->ks_sock, ZMQ_EVENTS, &events, &sz) ==
		        -1 ||
		    !(events & ZMQ_POLLIN))
			return;
		/* One message: keep its first 3 frames, drop any extra. */
		nframes = 0;
		done = 0;
		while (!done) {
			zmq_msg_t extra,
			    *m = nframes < 3 ? &frames[nframes] : &extra;

			zmq_msg_init(m);
			if (zmq_msg_recv(m, ks->ks_sock, ZMQ_DONTWAIT) == -1) {
				zmq_msg_close(m);
				break;
			}
			more = zmq_msg_more(m);
			if (m == &extra)
				zmq_msg_close(m);
			else
				nframes++;
			done = !more;
		}
		if (done)
			kv_message(pw, frames, nframes);
		for (i = 0; i < nframes; i++)
			zmq_msg_close(&frames[i]);
	}
	/* More may be queued: continue on the next loop iteration. */
	if (ks->ks_sock != NULL)
		ev_feed_event(loop, w, EV_READ);
}

/* One [topic, sequence, payload] message. */
static void
kv_message(struct pworker *pw, zmq_msg_t *frames, size_t nframes)
{
	struct kvevents_state *ks = &pw->pw_kv;
	Smg__KvEventBatch b = SMG__KV_EVENT_BATCH__INIT;
	const unsigned char *sp;
	enum kvevents_verdict v;
	uint64_t seq = 0;
	unsigned i;

	if (nframes < 3 || zmq_msg_size(&frames[1]) != KV_SEQ_LEN) {
		log_debug("%s: %s: malformed message ignored", __func__,
		    pw->pw_url);
		return;
	}
	sp = zmq_msg_data(&frames[1]);
	for (i = 0; i < KV_SEQ_LEN; i++)
		seq = seq << 8 | sp[i];
	if ((v = kvevents_sequence(&ks->ks_seq, seq)) == KVEVENTS_SKIP) {
		log_debug("%s: %s: batch %llu skipped (last %llu)", __func__,
		    pw->pw_url, (unsigned long long)seq,
		    (unsigned long long)ks->ks_seq.kq_last);
		return;
	}
	if (kvevents_decode(zmq_msg_data(&frames[2]), zmq_msg_size(&frames[2]),
	        &b) == -1) {
		log_warnx("%s: %s: batch %llu does not decode; dropped",
		    __func__, pw->pw_url, (unsigned long long)seq);
		/* Whatever it held is lost: the next batch starts over. */
		ks->ks_seq.kq_reset_next = true;
		return;
	}
	kv_forward(pw, seq, v, &b);
	kvevents_batch_clear(&b);
}

/*
 * The one exit of a batch, whatever its transport. The ranks of one
 * engine ("<url>@<rank>" workers) share its stream: a batch naming its
 * data-parallel rank goes to that rank's worker, one naming none to each
 * (a reset to each in any case, so none keeps blocks of a lost stretch).
 */
static void
kv_forward(struct pworker *pw, uint64_t seq, enum kvevents_verdict v,
    Smg__KvEventBatch *b)
{
	struct kvevents_state *ks = &pw->pw_kv;
	struct pworker *sib[SHM_MAX_WORKERS];
	Smg__KvEvent **events = b->events;
	size_t nevents = b->n_events;
	unsigned i, n, sent = 0;
	bool failed = false, mine;

	if (v == KVEVENTS_RESET && ks->ks_batches > 0)
		log_info("%s: %s: batch %llu after a gap or restart; the "
		         "worker's blocks are reset",
		    __func__, pw->pw_base, (unsigned long long)seq);
	b->sequence = seq;
	b->reset = v == KVEVENTS_RESET;
	n = poller_ranks(pw, sib);
	for (i = 0; i < n; i++) {
		Smg__PollerMsg m = SMG__POLLER_MSG__INIT;

		mine = sib[i]->pw_rank < 0 || !b->has_dp_rank ||
		    b->dp_rank == sib[i]->pw_rank;
		if (!mine && !b->reset)
			continue;
		b->worker_slot = sib[i]->pw_slot;
		b->worker_generation = sib[i]->pw_generation;
		b->worker_url = sib[i]->pw_url;
		b->events = mine ? events : NULL;
		b->n_events = mine ? nevents : 0;
		m.body_case = SMG__POLLER_MSG__BODY_KV_EVENTS;
		m.kv_events = b;
		if (report_send(pw->pw_poller, &m) == -1)
			failed = true;
		else
			sent++;
	}
	b->events = events;
	b->n_events = nevents;
	if (failed)
		ks->ks_seq.kq_reset_next = true;
	else if (sent > 0)
		ks->ks_batches++;
}

/* ------------------------------------------------------------ gRPC stream */

/* §5.1: subscriptions exist only where cache_aware consumes them. */
static bool
kv_grpc_wanted(const struct config *cf)
{
	bool pd = cf->cf_pd_disaggregation || cf->cf_epd_disaggregation;

	return cf->cf_policy == POLICY_CACHE_AWARE ||
	    (pd &&
	        (cf->cf_prefill_policy == POLICY_CACHE_AWARE ||
	            cf->cf_decode_policy == POLICY_CACHE_AWARE));
}

static void
kv_grpc_tick(struct pworker *pw, uint64_t now)
{
	struct kvevents_state *ks = &pw->pw_kv;
	Smg__Grpc__Common__SubscribeKvEventsRequest req =
	    SMG__GRPC__COMMON__SUBSCRIBE_KV_EVENTS_REQUEST__INIT;

	if (ks->ks_stream != NULL || now < ks->ks_stream_next_ms ||
	    !rpc_ready(pw))
		return;
	if (!rpc_engine_has(pw, RPC_SUBSCRIBE_KV_EVENTS)) {
		log_info("%s: %s: the %s engine streams no KV events; "
		         "cache_aware uses its tree for it",
		    __func__, pw->pw_url, rpc_runtime(pw));
		ks->ks_stream_off = true;
		return;
	}
	/* The bridges do not replay (§5): a resubscription that missed
	 * batches shows as a gap, which resets the worker's blocks. */
	req.has_start_sequence_number = true;
	req.start_sequence_number = ks->ks_seq.kq_have ? ks->ks_seq.kq_last : 0;
	ks->ks_stream_up = false;
	ks->ks_stream = rpc_call(pw, RPC_SUBSCRIBE_KV_EVENTS, &req.base, 0,
	    kv_grpc_msg_cb, kv_grpc_close_cb, pw);
	if (ks->ks_stream == NULL) {
		ks->ks_stream_next_ms = now + KV_PROBE_RETRY_MS;
		return;
	}
	grpc_call_on_open(ks->ks_stream, kv_grpc_open_cb);
	log_debug("%s: %s: SubscribeKvEvents from %llu", __func__, pw->pw_url,
	    (unsigned long long)req.start_sequence_number);
}

/* The server took the subscription: the stream is up. */
static void
kv_grpc_open_cb(void *arg)
{
	struct pworker *pw = arg;
	struct kvevents_state *ks = &pw->pw_kv;

	ks->ks_stream_up = true;
	ks->ks_stream_backoff_ms = 0;
	log_info("%s: %s: subscribed to KV events on %s", __func__, pw->pw_url,
	    pw->pw_rpc.rs_target);
}

static void
kv_grpc_msg_cb(void *arg, const uint8_t *msg, size_t len)
{
	struct pworker *pw = arg;
	struct kvevents_state *ks = &pw->pw_kv;
	Smg__Grpc__Common__KvEventBatch *gb;
	Smg__KvEventBatch b = SMG__KV_EVENT_BATCH__INIT;
	enum kvevents_verdict v;
	uint64_t seq;

	if ((gb = smg__grpc__common__kv_event_batch__unpack(NULL, len, msg)) ==
	    NULL) {
		log_warnx("%s: %s: a KvEventBatch does not decode; dropped",
		    __func__, pw->pw_url);
		ks->ks_seq.kq_reset_next = true;
		return;
	}
	seq = gb->sequence_number;
	if ((v = kvevents_sequence(&ks->ks_seq, seq)) == KVEVENTS_SKIP) {
		log_debug("%s: %s: batch %llu skipped (last %llu)", __func__,
		    pw->pw_url, (unsigned long long)seq,
		    (unsigned long long)ks->ks_seq.kq_last);
	} else if (kvevents_from_grpc(gb, &b) == -1) {
		log_warnx("%s: %s: batch %llu: out of memory; dropped",
		    __func__, pw->pw_url, (unsigned long long)seq);
		ks->ks_seq.kq_reset_next = true;
	} else {
		kv_forward(pw, seq, v, &b);
		kvevents_batch_clear(&b);
	}
	smg__grpc__common__kv_event_batch__free_unpacked(gb, NULL);
}

static void
kv_grpc_close_cb(void *arg, const struct grpc_status *st)
{
	struct pworker *pw = arg;
	struct kvevents_state *ks = &pw->pw_kv;
	Smg__KvEventBatch b = SMG__KV_EVENT_BATCH__INIT;
	uint64_t now = shm_now_ms();
	bool was_up = ks->ks_stream_up;

	ks->ks_stream = NULL;
	ks->ks_stream_up = false;
	switch (st->gs_code) {
	case GRPC_UNIMPLEMENTED:
		log_info("%s: %s: SubscribeKvEvents unimplemented (%s); "
		         "cache_aware uses its tree for this worker",
		    __func__, pw->pw_url, st->gs_message);
		ks->ks_stream_off = true;
		if (ks->ks_batches > 0)
			kv_forward(pw, ks->ks_seq.kq_last, KVEVENTS_RESET, &b);
		memset(&ks->ks_seq, 0, sizeof(ks->ks_seq));
		return;
	case GRPC_OUT_OF_RANGE:
	case GRPC_DATA_LOSS:
		/* The engine lost track: start over, now. */
		log_info("%s: %s: KV event stream: %s: %s; resubscribing",
		    __func__, pw->pw_url, grpc_code_name(st->gs_code),
		    st->gs_message);
		memset(&ks->ks_seq, 0, sizeof(ks->ks_seq));
		ks->ks_stream_next_ms = now;
		return;
	default:
		break;
	}
	if (was_up || ks->ks_stream_backoff_ms == 0)
		ks->ks_stream_backoff_ms = KV_STREAM_BACKOFF_MIN_MS;
	else if ((ks->ks_stream_backoff_ms *= 2) > KV_STREAM_BACKOFF_MAX_MS)
		ks->ks_stream_backoff_ms = KV_STREAM_BACKOFF_MAX_MS;
	ks->ks_stream_next_ms = now + ks->ks_stream_backoff_ms;
	if (was_up)
		log_info("%s: %s: KV event stream ended: %s: %s; resubscribing "
		         "with backoff",
		    __func__, pw->pw_url, grpc_code_name(st->gs_code),
		    st->gs_message);
	else
		log_debug("%s: %s: SubscribeKvEvents: %s: %s; again in %llu "
		          "ms",
		    __func__, pw->pw_url, grpc_code_name(st->gs_code),
		    st->gs_message,
		    (unsigned long long)ks->ks_stream_backoff_ms);
}

void
kvevents_tick(struct pworker *pw, uint64_t now)
{
	struct kvevents_state *ks = &pw->pw_kv;
	const char *want = NULL, *topic = "";
	char ep[SHM_URL_MAX];
	bool live;

	live = pw->pw_status == SHM_WORKER_READY ||
	    pw->pw_status == SHM_WORKER_NOT_READY;
	/* One subscription per engine: its leading rank's. */
	if (!live || !poller_leads(pw)) {
		if (ks->ks_sock != NULL || ks->ks_req != NULL ||
		    ks->ks_stream != NULL)
			kvevents_stop(pw);
		return;
	}
	/* gRPC events first; a side channel without them falls back to ZMQ. */
	if (rpc_target(pw) != NULL && !ks->ks_stream_off &&
	    kv_grpc_wanted(pw->pw_poller->p_cf)) {
		kv_grpc_tick(pw, now);
		return;
	}
	if (rpc_is_grpc_url(pw->pw_url))
		return;
	if (pw->pw_kv_label[0] != '\0')
		want = pw->pw_kv_label;
	else if (ks->ks_probe == KVEVENTS_PROBE_DONE) {
		if (ks->ks_found[0] != '\0') {
			want = ks->ks_found;
			topic = ks->ks_topic;
		}
	} else {
		if (ks->ks_probe == KVEVENTS_PROBE_NONE &&
		    now >= ks->ks_next_ms) {
			ks->ks_probe_fallback = false;
			kv_probe(pw, "/get_server_info");
		}
		return;
	}
	if (want == NULL ||
	    kvevents_resolve(want, pw->pw_base, ep, sizeof(ep)) == -1) {
		if (want != NULL && ks->ks_sock == NULL &&
		    ks->ks_next_ms == 0) {
			log_warnx("%s: %s: bad KV event endpoint '%s'",
			    __func__, pw->pw_url, want);
			ks->ks_next_ms = UINT64_MAX;
		}
		return;
	}
	if (ks->ks_sock != NULL) {
		if (strcmp(ep, ks->ks_endpoint) == 0)
			return;
		ev_io_stop(pw->pw_poller->p_loop, &ks->ks_io);
		zmq_close(ks->ks_sock);
		ks->ks_sock = NULL;
	}
	if (now < ks->ks_next_ms)
		return;
	if (kv_subscribe(pw, ep, topic) == -1)
		ks->ks_next_ms = now + KV_PROBE_RETRY_MS;
}

void
kvevents_stop(struct pworker *pw)
{
	struct kvevents_state *ks = &pw->pw_kv;

	if (ks->ks_sock != NULL) {
		ev_io_stop(pw->pw_poller->p_loop, &ks->ks_io);
		zmq_close(ks->ks_sock);
		log_info("%s: %s: unsubscribed from %s", __func__, pw->pw_url,
		    ks->ks_endpoint);
	}
	upstream_fetch_cancel(ks->ks_req);
	grpc_call_cancel(ks->ks_stream);
	memset(ks, 0, sizeof(*ks));
}

void
kvevents_shutdown(struct poller *p)
{
	if (p->p_zmq != NULL)
		zmq_ctx_term(p->p_zmq);
	p->p_zmq = NULL;
}
