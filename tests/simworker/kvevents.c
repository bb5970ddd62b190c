/*
 * kvevents.c: KV-cache events of the simulated engine, msgpack-encoded in
 * SGLang's array form or vLLM's map form and published on a ZMQ PUB socket
 * as [topic, sequence (u64 big-endian), payload], one batch per step.
 */
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "shared/log.h"
#include "shared/xmalloc.h"
#include "tests/simworker/simworker.h"

#define KVEV_HWM 100000

struct kvevents {
	void *k_ctx;
	void *k_pub;
	char *k_topic;
	enum kvev_format k_format;
	uint64_t k_seq;
	struct kv_event *k_ev; /* pending batch; ke_tokens unset */
	size_t *k_tokoff; /* token offset of each pending event */
	size_t k_nev;
	size_t k_evcap;
	uint32_t *k_tok;
	size_t k_ntok;
	size_t k_tokcap;
	int k_dropped; /* pending batch lost to an allocation failure */
};

static void kvevents_pack_str(msgpack_packer *, const char *);
static void kvevents_pack_event(msgpack_packer *, const struct kv_event *,
    enum kvev_format);

static void
kvevents_pack_str(msgpack_packer *pk, const char *s)
{
	size_t n = strlen(s);

	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}

static void
kvevents_pack_event(msgpack_packer *pk, const struct kv_event *ev,
    enum kvev_format fmt)
{
	uint32_t i;
	int map = fmt == KVEV_FORMAT_MAP;

	switch (ev->ke_kind) {
	case KV_EVENT_STORED:
		if (map) {
			msgpack_pack_map(pk, 8);
			kvevents_pack_str(pk, "type");
		} else {
			msgpack_pack_array(pk, 5);
		}
		kvevents_pack_str(pk, "BlockStored");
		if (map)
			kvevents_pack_str(pk, "block_hashes");
		msgpack_pack_array(pk, 1);
		msgpack_pack_int64(pk, ev->ke_hash);
		if (map)
			kvevents_pack_str(pk, "parent_block_hash");
		if (ev->ke_has_parent)
			msgpack_pack_int64(pk, ev->ke_parent);
		else
			msgpack_pack_nil(pk);
		if (map)
			kvevents_pack_str(pk, "token_ids");
		msgpack_pack_array(pk, ev->ke_block_size);
		for (i = 0; i < ev->ke_block_size; i++)
			msgpack_pack_uint32(pk, ev->ke_tokens[i]);
		if (map)
			kvevents_pack_str(pk, "block_size");
		msgpack_pack_uint32(pk, ev->ke_block_size);
		if (map) {
			kvevents_pack_str(pk, "lora_id");
			msgpack_pack_nil(pk);
			kvevents_pack_str(pk, "medium");
			kvevents_pack_str(pk, "GPU");
			kvevents_pack_str(pk, "lora_name");
			msgpack_pack_nil(pk);
		}
		break;
	case KV_EVENT_REMOVED:
		if (map) {
			msgpack_pack_map(pk, 3);
			kvevents_pack_str(pk, "type");
		} else {
			msgpack_pack_array(pk, 2);
		}
		kvevents_pack_str(pk, "BlockRemoved");
		if (map)
			kvevents_pack_str(pk, "block_hashes");
		msgpack_pack_array(pk, 1);
		msgpack_pack_int64(pk, ev->ke_hash);
		if (map) {
			kvevents_pack_str(pk, "medium");
			kvevents_pack_str(pk, "GPU");
		}
		break;
	case KV_EVENT_CLEARED:
		if (map) {
			msgpack_pack_map(pk, 1);
			kvevents_pack_str(pk, "type");
		} else {
			msgpack_pack_array(pk, 1);
		}
		kvevents_pack_str(pk, "AllBlocksCleared");
		break;
	}
}

int
kvevents_encode(msgpack_sbuffer *buf, double ts, const struct kv_event *ev,
    size_t n, enum kvev_format fmt)
{
	msgpack_packer pk;
	size_t i;

	if (n > UINT32_MAX)
		return -1;
	msgpack_packer_init(&pk, buf, msgpack_sbuffer_write);
	if (fmt == KVEV_FORMAT_MAP) {
		msgpack_pack_map(&pk, 3);
		kvevents_pack_str(&pk, "ts");
		msgpack_pack_double(&pk, ts);
		kvevents_pack_str(&pk, "events");
	} else {
		/* SGLang omits dp_rank when unset. */
		msgpack_pack_array(&pk, 2);
		msgpack_pack_double(&pk, ts);
	}
	msgpack_pack_array(&pk, (uint32_t)n);
	for (i = 0; i < n; i++)
		kvevents_pack_event(&pk, &ev[i], fmt);
	if (fmt == KVEV_FORMAT_MAP) {
		kvevents_pack_str(&pk, "data_parallel_rank");
		msgpack_pack_int32(&pk, 0);
	}
	return 0;
}

struct kvevents *
kvevents_new(const char *endpoint, const char *topic, enum kvev_format fmt)
{
	struct kvevents *k;
	int hwm = KVEV_HWM, linger = 0;

	k = xcalloc(1, sizeof(*k));
	k->k_topic = xstrdup(topic);
	k->k_format = fmt;
	if ((k->k_ctx = zmq_ctx_new()) == NULL) {
		log_warnx("%s: zmq_ctx_new: %s", __func__,
		    zmq_strerror(zmq_errno()));
		goto fail;
	}
	if ((k->k_pub = zmq_socket(k->k_ctx, ZMQ_PUB)) == NULL) {
		log_warnx("%s: zmq_socket: %s", __func__,
		    zmq_strerror(zmq_errno()));
		goto fail;
	}
	if (zmq_setsockopt(k->k_pub, ZMQ_SNDHWM, &hwm, sizeof(hwm)) == -1 ||
	    zmq_setsockopt(k->k_pub, ZMQ_LINGER, &linger, sizeof(linger)) ==
	        -1) {
		log_warnx("%s: zmq_setsockopt: %s", __func__,
		    zmq_strerror(zmq_errno()));
		goto fail;
	}
	if (zmq_bind(k->k_pub, endpoint) == -1) {
		log_warnx("%s: bind %s: %s", __func__, endpoint,
		    zmq_strerror(zmq_errno()));
		goto fail;
	}
	log_info("%s: publishing KV events on %s", __func__, endpoint);
	return k;
fail:
	kvevents_free(k);
	return NULL;
}

void
kvevents_free(struct kvevents *k)
{
	if (k == NULL)
		return;
	if (k->k_pub != NULL)
		zmq_close(k->k_pub);
	if (k->k_ctx != NULL)
		zmq_ctx_term(k->k_ctx);
	free(k->k_ev);
	free(k->k_tokoff);
	free(k->k_tok);
	free(k->k_topic);
	free(k);
}

uint64_t
kvevents_seq(const struct kvevents *k)
{
	return k->k_seq;
}

void
kvevents_add(void *arg, const struct kv_event *ev)
{
	struct kvevents *k = arg;
	size_t ntok = ev->ke_kind == KV_EVENT_STORED ? ev->ke_block_size : 0;
	size_t cap;
	void *p;

	if (k->k_dropped)
		return;
	if (k->k_nev == k->k_evcap) {
		cap = k->k_evcap ? k->k_evcap * 2 : 64;
		if ((p = reallocarray(k->k_ev, cap, sizeof(*k->k_ev))) == NULL)
			goto drop;
		k->k_ev = p;
		if ((p = reallocarray(k->k_tokoff, cap, sizeof(size_t))) ==
		    NULL)
			goto drop;
		k->k_tokoff = p;
		k->k_evcap = cap;
	}
	if (k->k_ntok + ntok > k->k_tokcap) {
		cap = k->k_tokcap ? k->k_tokcap : 1024;
		while (cap < k->k_ntok + ntok)
			cap *= 2;
		if ((p = reallocarray(k->k_tok, cap, sizeof(uint32_t))) == NULL)
			goto drop;
		k->k_tok = p;
		k->k_tokcap = cap;
	}
	k->k_ev[k->k_nev] = *ev;
	k->k_ev[k->k_nev].ke_tokens = NULL;
	k->k_tokoff[k->k_nev] = k->k_ntok;
	if (ntok > 0)
		memcpy(k->k_tok + k->k_ntok, ev->ke_tokens,
		    ntok * sizeof(uint32_t));
	k->k_ntok += ntok;
	k->k_nev++;
	return;
drop:
	log_warnx("%s: out of memory, dropping a KV event batch", __func__);
	k->k_dropped = 1;
}

void
kvevents_flush(struct kvevents *k)
{
	msgpack_sbuffer buf;
	unsigned char seq[8];
	size_t i;
	int rv = 0;

	if (k->k_dropped) {
		/* Consumers see the sequence gap and resynchronise. */
		k->k_seq++;
		k->k_dropped = 0;
		k->k_nev = k->k_ntok = 0;
		return;
	}
	if (k->k_nev == 0)
		return;
	for (i = 0; i < k->k_nev; i++)
		k->k_ev[i].ke_tokens = k->k_tok + k->k_tokoff[i];
	msgpack_sbuffer_init(&buf);
	kvevents_encode(&buf, ev_time(), k->k_ev, k->k_nev, k->k_format);
	for (i = 0; i < 8; i++)
		seq[i] = (unsigned char)(k->k_seq >> (56 - 8 * i));
	if (zmq_send(k->k_pub, k->k_topic, strlen(k->k_topic),
	        ZMQ_SNDMORE | ZMQ_DONTWAIT) == -1 ||
	    zmq_send(k->k_pub, seq, sizeof(seq), ZMQ_SNDMORE | ZMQ_DONTWAIT) ==
	        -1 ||
	    zmq_send(k->k_pub, buf.data, buf.size, ZMQ_DONTWAIT) == -1)
		rv = -1;
	if (rv == -1)
		log_warnx("%s: batch %llu: %s", __func__,
		    (unsigned long long)k->k_seq, zmq_strerror(zmq_errno()));
	k->k_seq++;
	msgpack_sbuffer_destroy(&buf);
	k->k_nev = k->k_ntok = 0;
}
