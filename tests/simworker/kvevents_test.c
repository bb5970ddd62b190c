/*
 * kvevents_test.c: unit tests of the KV-event encoder (decoded back with
 * msgpack-c's unpacker) and of the ZMQ framing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <zmq.h>

#include "tests/simworker/simworker.h"

static const uint32_t toks[4] = { 11, 22, 33, 2147483647 };

static const struct kv_event events[4] = {
	{ .ke_kind = KV_EVENT_STORED,
	    .ke_hash = -5,
	    .ke_has_parent = 0,
	    .ke_tokens = toks,
	    .ke_block_size = 4 },
	{ .ke_kind = KV_EVENT_STORED,
	    .ke_hash = INT64_MAX,
	    .ke_parent = -5,
	    .ke_has_parent = 1,
	    .ke_tokens = toks,
	    .ke_block_size = 4 },
	{ .ke_kind = KV_EVENT_REMOVED, .ke_hash = INT64_MIN },
	{ .ke_kind = KV_EVENT_CLEARED },
};

static int
str_is(const msgpack_object *o, const char *s)
{
	return o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
	    memcmp(o->via.str.ptr, s, o->via.str.size) == 0;
}

static int64_t
int_of(const msgpack_object *o)
{
	if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
		return (int64_t)o->via.u64;
	assert_int_equal(o->type, MSGPACK_OBJECT_NEGATIVE_INTEGER);
	return o->via.i64;
}

/* The value of key in a map, or NULL. */
static const msgpack_object *
get(const msgpack_object *map, const char *key)
{
	uint32_t i;

	assert_int_equal(map->type, MSGPACK_OBJECT_MAP);
	for (i = 0; i < map->via.map.size; i++)
		if (str_is(&map->via.map.ptr[i].key, key))
			return &map->via.map.ptr[i].val;
	return NULL;
}

static void
check_tokens(const msgpack_object *o)
{
	uint32_t i;

	assert_int_equal(o->type, MSGPACK_OBJECT_ARRAY);
	assert_int_equal(o->via.array.size, 4);
	for (i = 0; i < 4; i++)
		assert_int_equal(int_of(&o->via.array.ptr[i]), toks[i]);
}

static void
check_hashes(const msgpack_object *o, int64_t h)
{
	assert_int_equal(o->type, MSGPACK_OBJECT_ARRAY);
	assert_int_equal(o->via.array.size, 1);
	assert_int_equal(int_of(&o->via.array.ptr[0]), h);
}

static void
test_array_form(void **state)
{
	msgpack_sbuffer buf;
	msgpack_unpacked u;
	const msgpack_object *b, *ev, *e;

	(void)state;
	msgpack_sbuffer_init(&buf);
	assert_int_equal(
	    kvevents_encode(&buf, 1754000000.5, events, 4, KVEV_FORMAT_ARRAY),
	    0);
	msgpack_unpacked_init(&u);
	assert_int_equal(msgpack_unpack_next(&u, buf.data, buf.size, NULL),
	    MSGPACK_UNPACK_SUCCESS);
	b = &u.data;
	assert_int_equal(b->type, MSGPACK_OBJECT_ARRAY);
	assert_int_equal(b->via.array.size, 2);
	assert_int_equal(b->via.array.ptr[0].type, MSGPACK_OBJECT_FLOAT64);
	assert_true(b->via.array.ptr[0].via.f64 == 1754000000.5);
	ev = &b->via.array.ptr[1];
	assert_int_equal(ev->via.array.size, 4);

	e = &ev->via.array.ptr[0];
	assert_int_equal(e->via.array.size, 5);
	assert_true(str_is(&e->via.array.ptr[0], "BlockStored"));
	check_hashes(&e->via.array.ptr[1], -5);
	assert_int_equal(e->via.array.ptr[2].type, MSGPACK_OBJECT_NIL);
	check_tokens(&e->via.array.ptr[3]);
	assert_int_equal(int_of(&e->via.array.ptr[4]), 4);

	e = &ev->via.array.ptr[1];
	check_hashes(&e->via.array.ptr[1], INT64_MAX);
	assert_int_equal(int_of(&e->via.array.ptr[2]), -5);

	e = &ev->via.array.ptr[2];
	assert_int_equal(e->via.array.size, 2);
	assert_true(str_is(&e->via.array.ptr[0], "BlockRemoved"));
	check_hashes(&e->via.array.ptr[1], INT64_MIN);

	e = &ev->via.array.ptr[3];
	assert_int_equal(e->via.array.size, 1);
	assert_true(str_is(&e->via.array.ptr[0], "AllBlocksCleared"));
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&buf);
}

static void
test_map_form(void **state)
{
	msgpack_sbuffer buf;
	msgpack_unpacked u;
	const msgpack_object *b, *ev, *e;

	(void)state;
	msgpack_sbuffer_init(&buf);
	assert_int_equal(
	    kvevents_encode(&buf, 2.25, events, 4, KVEV_FORMAT_MAP), 0);
	msgpack_unpacked_init(&u);
	assert_int_equal(msgpack_unpack_next(&u, buf.data, buf.size, NULL),
	    MSGPACK_UNPACK_SUCCESS);
	b = &u.data;
	assert_true(get(b, "ts")->via.f64 == 2.25);
	assert_int_equal(int_of(get(b, "data_parallel_rank")), 0);
	ev = get(b, "events");
	assert_int_equal(ev->via.array.size, 4);

	e = &ev->via.array.ptr[0];
	assert_true(str_is(get(e, "type"), "BlockStored"));
	check_hashes(get(e, "block_hashes"), -5);
	assert_int_equal(get(e, "parent_block_hash")->type, MSGPACK_OBJECT_NIL);
	check_tokens(get(e, "token_ids"));
	assert_int_equal(int_of(get(e, "block_size")), 4);
	assert_true(str_is(get(e, "medium"), "GPU"));

	e = &ev->via.array.ptr[1];
	assert_int_equal(int_of(get(e, "parent_block_hash")), -5);

	e = &ev->via.array.ptr[2];
	assert_true(str_is(get(e, "type"), "BlockRemoved"));
	check_hashes(get(e, "block_hashes"), INT64_MIN);

	e = &ev->via.array.ptr[3];
	assert_true(str_is(get(e, "type"), "AllBlocksCleared"));
	assert_int_equal(e->via.map.size, 1);
	msgpack_unpacked_destroy(&u);
	msgpack_sbuffer_destroy(&buf);
}

/* Publishes through a real PUB socket; a SUB sees 3 frames per batch. */
static void
test_publish(void **state)
{
	char ep[128], topic[16], payload[4096];
	unsigned char seq[16];
	struct kvevents *k;
	void *ctx, *sub;
	int timeout = 200, i, more, got = 0;
	size_t moresz = sizeof(more);
	uint64_t s;

	(void)state;
	snprintf(ep, sizeof(ep), "ipc:///tmp/smg-kvev-test-%d.sock",
	    (int)getpid());
	k = kvevents_new(ep, "kv", KVEV_FORMAT_ARRAY);
	assert_non_null(k);
	ctx = zmq_ctx_new();
	sub = zmq_socket(ctx, ZMQ_SUB);
	assert_int_equal(zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0), 0);
	assert_int_equal(
	    zmq_setsockopt(sub, ZMQ_RCVTIMEO, &timeout, sizeof(timeout)), 0);
	assert_int_equal(zmq_connect(sub, ep), 0);
	/* Publish until the subscription is through (slow joiner). */
	for (i = 0; i < 50 && !got; i++) {
		kvevents_add(k, &events[i % 2 == 0 ? 2 : 3]);
		kvevents_flush(k);
		if (zmq_recv(sub, topic, sizeof(topic), 0) == 2)
			got = 1;
	}
	assert_true(got);
	assert_memory_equal(topic, "kv", 2);
	assert_int_equal(zmq_getsockopt(sub, ZMQ_RCVMORE, &more, &moresz), 0);
	assert_true(more);
	assert_int_equal(zmq_recv(sub, seq, sizeof(seq), 0), 8);
	for (s = 0, i = 0; i < 8; i++)
		s = s << 8 | seq[i];
	assert_true(s < kvevents_seq(k));
	assert_true(zmq_recv(sub, payload, sizeof(payload), 0) > 0);
	assert_int_equal(zmq_getsockopt(sub, ZMQ_RCVMORE, &more, &moresz), 0);
	assert_false(more);
	/* An empty batch publishes nothing and keeps the sequence. */
	s = kvevents_seq(k);
	kvevents_flush(k);
	assert_int_equal(kvevents_seq(k), s);
	zmq_close(sub);
	zmq_ctx_term(ctx);
	kvevents_free(k);
	snprintf(ep, sizeof(ep), "/tmp/smg-kvev-test-%d.sock", (int)getpid());
	unlink(ep);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_array_form),
		cmocka_unit_test(test_map_form),
		cmocka_unit_test(test_publish),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
