/*
 * kvevents_decode_test.c: decoding of KV-event payloads (array and map forms,
 * int and bytes hashes), the sequence rules, endpoint resolution and the
 * kv_events_config of a server info body.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>

#include "poller/poller.h"

static void
pk_str(msgpack_packer *pk, const char *s)
{
	msgpack_pack_str(pk, strlen(s));
	msgpack_pack_str_body(pk, s, strlen(s));
}

static void
pk_u32s(msgpack_packer *pk, const uint32_t *v, size_t n)
{
	size_t i;

	msgpack_pack_array(pk, n);
	for (i = 0; i < n; i++)
		msgpack_pack_uint32(pk, v[i]);
}

static const uint32_t toks[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };

/* SGLang: [ts, [events], dp_rank]; trailing defaults omitted. */
static void
pack_array_form(msgpack_sbuffer *sb)
{
	msgpack_packer pk;

	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	msgpack_pack_array(&pk, 3);
	msgpack_pack_double(&pk, 1754000000.5);
	msgpack_pack_array(&pk, 5);
	/* two blocks, no parent, no block size (inferred later) */
	msgpack_pack_array(&pk, 4);
	pk_str(&pk, "BlockStored");
	msgpack_pack_array(&pk, 2);
	msgpack_pack_int64(&pk, -5);
	msgpack_pack_uint64(&pk, UINT64_MAX - 1);
	msgpack_pack_nil(&pk);
	pk_u32s(&pk, toks, 8);
	/* one block with a parent, block size and extra trailing fields */
	msgpack_pack_array(&pk, 8);
	pk_str(&pk, "BlockStored");
	msgpack_pack_array(&pk, 1);
	msgpack_pack_int64(&pk, 77);
	msgpack_pack_int64(&pk, -5);
	pk_u32s(&pk, toks, 4);
	msgpack_pack_uint32(&pk, 4);
	msgpack_pack_nil(&pk);
	pk_str(&pk, "GPU");
	msgpack_pack_int(&pk, 9);
	msgpack_pack_array(&pk, 2);
	pk_str(&pk, "BlockRemoved");
	msgpack_pack_array(&pk, 1);
	msgpack_pack_int64(&pk, 77);
	/* a newer kind: skipped */
	msgpack_pack_array(&pk, 2);
	pk_str(&pk, "SomethingNew");
	msgpack_pack_int(&pk, 1);
	msgpack_pack_array(&pk, 1);
	pk_str(&pk, "AllBlocksCleared");
	msgpack_pack_int(&pk, 0);
}

/* vLLM: {"ts", "events", "data_parallel_rank"}; bytes hashes. */
static void
pack_map_form(msgpack_sbuffer *sb)
{
	static const unsigned char h32[32] = { [0] = 0xff,
		[23] = 0xaa,
		[24] = 0x01,
		[25] = 0x02,
		[26] = 0x03,
		[27] = 0x04,
		[28] = 0x05,
		[29] = 0x06,
		[30] = 0x07,
		[31] = 0x08 };
	static const unsigned char h3[3] = { 0x01, 0x00, 0xff };
	msgpack_packer pk;

	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 3);
	pk_str(&pk, "ts");
	msgpack_pack_double(&pk, 1.0);
	pk_str(&pk, "events");
	msgpack_pack_array(&pk, 3);
	msgpack_pack_map(&pk, 8);
	pk_str(&pk, "type");
	pk_str(&pk, "BlockStored");
	pk_str(&pk, "block_hashes");
	msgpack_pack_array(&pk, 1);
	msgpack_pack_bin(&pk, 32);
	msgpack_pack_bin_body(&pk, h32, 32);
	pk_str(&pk, "parent_block_hash");
	msgpack_pack_bin(&pk, 3);
	msgpack_pack_bin_body(&pk, h3, 3);
	pk_str(&pk, "token_ids");
	pk_u32s(&pk, toks, 4);
	pk_str(&pk, "block_size");
	msgpack_pack_uint32(&pk, 4);
	pk_str(&pk, "lora_id");
	msgpack_pack_nil(&pk);
	pk_str(&pk, "medium");
	pk_str(&pk, "GPU");
	pk_str(&pk, "lora_name");
	msgpack_pack_nil(&pk);
	msgpack_pack_map(&pk, 3);
	pk_str(&pk, "type");
	pk_str(&pk, "BlockRemoved");
	pk_str(&pk, "block_hashes");
	msgpack_pack_array(&pk, 1);
	msgpack_pack_bin(&pk, 32);
	msgpack_pack_bin_body(&pk, h32, 32);
	pk_str(&pk, "medium");
	msgpack_pack_nil(&pk);
	msgpack_pack_map(&pk, 1);
	pk_str(&pk, "type");
	pk_str(&pk, "AllBlocksCleared");
	pk_str(&pk, "data_parallel_rank");
	msgpack_pack_int(&pk, 0);
}

static void
test_decode_array_form(void **state)
{
	Smg__KvEventBatch b = SMG__KV_EVENT_BATCH__INIT;
	msgpack_sbuffer sb;
	Smg__KvBlocksStored *s;

	(void)state;
	msgpack_sbuffer_init(&sb);
	pack_array_form(&sb);
	assert_int_equal(kvevents_decode(sb.data, sb.size, &b), 0);
	assert_int_equal(b.n_events, 4);
	assert_int_equal(b.events[0]->data_case, SMG__KV_EVENT__DATA_STORED);
	s = b.events[0]->stored;
	assert_int_equal(s->n_block_hashes, 2);
	assert_true(s->block_hashes[0] == -5);
	assert_true(s->block_hashes[1] == -2); /* u64 max - 1 as int64 */
	assert_false(s->has_parent);
	assert_int_equal(s->n_token_ids, 8);
	assert_int_equal(s->token_ids[7], 8);
	assert_int_equal(s->block_size, 0);
	s = b.events[1]->stored;
	assert_true(s->has_parent);
	assert_true(s->parent_block_hash == -5);
	assert_int_equal(s->block_size, 4);
	assert_int_equal(b.events[2]->data_case, SMG__KV_EVENT__DATA_REMOVED);
	assert_int_equal(b.events[2]->removed->n_block_hashes, 1);
	assert_true(b.events[2]->removed->block_hashes[0] == 77);
	assert_int_equal(b.events[3]->data_case, SMG__KV_EVENT__DATA_CLEARED);
	kvevents_batch_clear(&b);
	assert_null(b.events);
	msgpack_sbuffer_destroy(&sb);
}

static void
test_decode_map_form_bytes(void **state)
{
	Smg__KvEventBatch b = SMG__KV_EVENT_BATCH__INIT;
	msgpack_sbuffer sb;
	Smg__KvBlocksStored *s;

	(void)state;
	msgpack_sbuffer_init(&sb);
	pack_map_form(&sb);
	assert_int_equal(kvevents_decode(sb.data, sb.size, &b), 0);
	assert_int_equal(b.n_events, 3);
	s = b.events[0]->stored;
	/* Last 8 bytes, big-endian. */
	assert_true(s->block_hashes[0] == (int64_t)0x0102030405060708LL);
	assert_true(s->has_parent);
	assert_true(s->parent_block_hash == 0x0100ff);
	assert_int_equal(s->block_size, 4);
	assert_int_equal(s->n_token_ids, 4);
	assert_true(b.events[1]->removed->block_hashes[0] ==
	    (int64_t)0x0102030405060708LL);
	assert_int_equal(b.events[2]->data_case, SMG__KV_EVENT__DATA_CLEARED);
	kvevents_batch_clear(&b);
	msgpack_sbuffer_destroy(&sb);
}

static void
test_decode_bytes_high_bit(void **state)
{
	static const unsigned char h[9] = { 0x11, 0xff, 0, 0, 0, 0, 0, 0,
		0x01 };
	Smg__KvEventBatch b = SMG__KV_EVENT_BATCH__INIT;
	msgpack_sbuffer sb;
	msgpack_packer pk;

	(void)state;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_array(&pk, 2);
	msgpack_pack_double(&pk, 0);
	msgpack_pack_array(&pk, 1);
	msgpack_pack_array(&pk, 2);
	pk_str(&pk, "BlockRemoved");
	msgpack_pack_array(&pk, 1);
	msgpack_pack_bin(&pk, 9);
	msgpack_pack_bin_body(&pk, h, 9);
	assert_int_equal(kvevents_decode(sb.data, sb.size, &b), 0);
	assert_true(b.events[0]->removed->block_hashes[0] ==
	    (int64_t)0xff00000000000001ULL);
	kvevents_batch_clear(&b);
	msgpack_sbuffer_destroy(&sb);
}

/* Packs [ts, [event]] where event is built by fn. */
static int
decode_one(void (*fn)(msgpack_packer *))
{
	Smg__KvEventBatch b = SMG__KV_EVENT_BATCH__INIT;
	msgpack_sbuffer sb;
	msgpack_packer pk;
	int rv;

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_array(&pk, 2);
	msgpack_pack_double(&pk, 0);
	msgpack_pack_array(&pk, 1);
	fn(&pk);
	rv = kvevents_decode(sb.data, sb.size, &b);
	if (rv == -1)
		assert_int_equal(b.n_events, 0);
	kvevents_batch_clear(&b);
	msgpack_sbuffer_destroy(&sb);
	return rv;
}

static void
ev_negative_token(msgpack_packer *pk)
{
	msgpack_pack_array(pk, 4);
	pk_str(pk, "BlockStored");
	msgpack_pack_array(pk, 1);
	msgpack_pack_int(pk, 1);
	msgpack_pack_nil(pk);
	msgpack_pack_array(pk, 1);
	msgpack_pack_int(pk, -1);
}

static void
ev_big_token(msgpack_packer *pk)
{
	msgpack_pack_array(pk, 4);
	pk_str(pk, "BlockStored");
	msgpack_pack_array(pk, 1);
	msgpack_pack_int(pk, 1);
	msgpack_pack_nil(pk);
	msgpack_pack_array(pk, 1);
	msgpack_pack_uint64(pk, 1ULL << 32);
}

static void
ev_no_tokens(msgpack_packer *pk)
{
	msgpack_pack_array(pk, 2);
	pk_str(pk, "BlockStored");
	msgpack_pack_array(pk, 1);
	msgpack_pack_int(pk, 1);
}

static void
ev_float_hash(msgpack_packer *pk)
{
	msgpack_pack_array(pk, 2);
	pk_str(pk, "BlockRemoved");
	msgpack_pack_array(pk, 1);
	msgpack_pack_double(pk, 1.5);
}

static void
ev_untagged(msgpack_packer *pk)
{
	msgpack_pack_array(pk, 1);
	msgpack_pack_int(pk, 3);
}

static void
ev_map_no_type(msgpack_packer *pk)
{
	msgpack_pack_map(pk, 1);
	pk_str(pk, "block_hashes");
	msgpack_pack_array(pk, 0);
}

static void
ev_empty_removed(msgpack_packer *pk)
{
	msgpack_pack_array(pk, 2);
	pk_str(pk, "BlockRemoved");
	msgpack_pack_array(pk, 0);
}

static void
test_decode_malformed(void **state)
{
	static const char junk[] = "\xc1\xc1\xc1";
	Smg__KvEventBatch b = SMG__KV_EVENT_BATCH__INIT;
	msgpack_sbuffer sb;
	msgpack_packer pk;

	(void)state;
	assert_int_equal(decode_one(ev_negative_token), -1);
	assert_int_equal(decode_one(ev_big_token), -1);
	assert_int_equal(decode_one(ev_no_tokens), -1);
	assert_int_equal(decode_one(ev_float_hash), -1);
	assert_int_equal(decode_one(ev_untagged), -1);
	assert_int_equal(decode_one(ev_map_no_type), -1);
	assert_int_equal(decode_one(ev_empty_removed), 0);
	assert_int_equal(kvevents_decode(junk, 3, &b), -1);
	assert_int_equal(kvevents_decode("", 0, &b), -1);
	/* A lone integer, a one-element array, trailing bytes. */
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_int(&pk, 5);
	assert_int_equal(kvevents_decode(sb.data, sb.size, &b), -1);
	msgpack_sbuffer_clear(&sb);
	msgpack_pack_array(&pk, 1);
	msgpack_pack_double(&pk, 0);
	assert_int_equal(kvevents_decode(sb.data, sb.size, &b), -1);
	msgpack_sbuffer_clear(&sb);
	msgpack_pack_array(&pk, 2);
	msgpack_pack_double(&pk, 0);
	msgpack_pack_array(&pk, 0);
	assert_int_equal(kvevents_decode(sb.data, sb.size, &b), 0);
	assert_int_equal(b.n_events, 0);
	msgpack_pack_int(&pk, 1);
	assert_int_equal(kvevents_decode(sb.data, sb.size, &b), -1);
	/* Truncated payload. */
	msgpack_sbuffer_clear(&sb);
	pack_map_form(&sb);
	assert_int_equal(kvevents_decode(sb.data, sb.size - 3, &b), -1);
	msgpack_sbuffer_destroy(&sb);
}

static void
test_sequence(void **state)
{
	struct kvevents_seq q;

	(void)state;
	memset(&q, 0, sizeof(q));
	/* The first batch fixes the baseline and resets stale blocks. */
	assert_int_equal(kvevents_sequence(&q, 5), KVEVENTS_RESET);
	assert_int_equal(kvevents_sequence(&q, 6), KVEVENTS_APPLY);
	assert_int_equal(kvevents_sequence(&q, 7), KVEVENTS_APPLY);
	/* Duplicates and older batches. */
	assert_int_equal(kvevents_sequence(&q, 7), KVEVENTS_SKIP);
	assert_int_equal(kvevents_sequence(&q, 3), KVEVENTS_SKIP);
	/* A gap: reset and continue from the received batch. */
	assert_int_equal(kvevents_sequence(&q, 10), KVEVENTS_RESET);
	assert_int_equal(q.kq_last, 10);
	assert_int_equal(kvevents_sequence(&q, 11), KVEVENTS_APPLY);
	/* The publisher restarted: back to 0 is a cleared cache. */
	assert_int_equal(kvevents_sequence(&q, 0), KVEVENTS_RESET);
	assert_int_equal(kvevents_sequence(&q, 1), KVEVENTS_APPLY);
	/* A batch lost on our side: the next one resets. */
	q.kq_reset_next = true;
	assert_int_equal(kvevents_sequence(&q, 2), KVEVENTS_RESET);
	assert_int_equal(kvevents_sequence(&q, 3), KVEVENTS_APPLY);
	/* Wrap-around safety at the top of the range. */
	memset(&q, 0, sizeof(q));
	assert_int_equal(kvevents_sequence(&q, UINT64_MAX - 1), KVEVENTS_RESET);
	assert_int_equal(kvevents_sequence(&q, UINT64_MAX), KVEVENTS_APPLY);
}

static void
test_resolve(void **state)
{
	char out[64];

	(void)state;
	assert_int_equal(kvevents_resolve("tcp://*:5557",
	                     "http://10.1.2.3:8000", out, sizeof(out)),
	    0);
	assert_string_equal(out, "tcp://10.1.2.3:5557");
	assert_int_equal(kvevents_resolve("tcp://0.0.0.0:6000",
	                     "https://host.example/api", out, sizeof(out)),
	    0);
	assert_string_equal(out, "tcp://host.example:6000");
	assert_int_equal(kvevents_resolve("tcp://[::]:6000",
	                     "http://[fe80::1]:8000", out, sizeof(out)),
	    0);
	assert_string_equal(out, "tcp://[fe80::1]:6000");
	assert_int_equal(
	    kvevents_resolve("tcp://*:7", "grpc://h@2", out, sizeof(out)), 0);
	assert_string_equal(out, "tcp://h:7");
	assert_int_equal(kvevents_resolve("tcp://127.0.0.1:5557",
	                     "http://10.0.0.1:8000", out, sizeof(out)),
	    0);
	assert_string_equal(out, "tcp://127.0.0.1:5557");
	assert_int_equal(kvevents_resolve("ipc:///tmp/kv.sock", "http://h:1",
	                     out, sizeof(out)),
	    0);
	assert_string_equal(out, "ipc:///tmp/kv.sock");
	assert_int_equal(
	    kvevents_resolve("tcp://*", "http://h:1", out, sizeof(out)), -1);
	assert_int_equal(
	    kvevents_resolve("tcp://*:1", "nohost", out, sizeof(out)), -1);
	assert_int_equal(
	    kvevents_resolve("tcp://*:1", "http://", out, sizeof(out)), -1);
	assert_int_equal(kvevents_resolve("tcp://*:5557",
	                     "http://a-very-long-host-name-that-does-not-fit."
	                     "example.com:1",
	                     out, 20),
	    -1);
}

static void
test_server_info(void **state)
{
	char ep[64], topic[32];
	const char *s;

	(void)state;
	s = "{\"model_path\":\"m\",\"kv_events_config\":"
	    "\"{\\\"publisher\\\":\\\"zmq\\\",\\\"endpoint\\\":"
	    "\\\"tcp://*:6001\\\",\\\"topic\\\":\\\"kv\\\"}\"}";
	assert_int_equal(kvevents_parse_server_info(s, strlen(s), ep,
	                     sizeof(ep), topic, sizeof(topic)),
	    0);
	assert_string_equal(ep, "tcp://*:6001");
	assert_string_equal(topic, "kv");
	/* An object; no endpoint: the engines' default. */
	s = "{\"kv_events_config\":{\"publisher\":\"zmq\"}}";
	assert_int_equal(kvevents_parse_server_info(s, strlen(s), ep,
	                     sizeof(ep), topic, sizeof(topic)),
	    0);
	assert_string_equal(ep, "tcp://*:5557");
	assert_string_equal(topic, "");
	s = "{\"kv_events_config\":null}";
	assert_int_equal(kvevents_parse_server_info(s, strlen(s), ep,
	                     sizeof(ep), topic, sizeof(topic)),
	    -1);
	s = "{\"model_path\":\"m\"}";
	assert_int_equal(kvevents_parse_server_info(s, strlen(s), ep,
	                     sizeof(ep), topic, sizeof(topic)),
	    -1);
	s = "{\"kv_events_config\":{\"publisher\":\"null\"}}";
	assert_int_equal(kvevents_parse_server_info(s, strlen(s), ep,
	                     sizeof(ep), topic, sizeof(topic)),
	    -1);
	s = "{\"kv_events_config\":{\"enable_kv_cache_events\":false}}";
	assert_int_equal(kvevents_parse_server_info(s, strlen(s), ep,
	                     sizeof(ep), topic, sizeof(topic)),
	    -1);
	s = "{\"kv_events_config\":\"not json\"}";
	assert_int_equal(kvevents_parse_server_info(s, strlen(s), ep,
	                     sizeof(ep), topic, sizeof(topic)),
	    -1);
	s = "[1,2]";
	assert_int_equal(kvevents_parse_server_info(s, strlen(s), ep,
	                     sizeof(ep), topic, sizeof(topic)),
	    -1);
	s = "{\"kv_events_config\":{\"endpoint\":\"tcp://*:1\"}}";
	assert_int_equal(kvevents_parse_server_info(s, strlen(s), ep, 5, topic,
	                     sizeof(topic)),
	    -1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_decode_array_form),
		cmocka_unit_test(test_decode_map_form_bytes),
		cmocka_unit_test(test_decode_bytes_high_bit),
		cmocka_unit_test(test_decode_malformed),
		cmocka_unit_test(test_sequence),
		cmocka_unit_test(test_resolve),
		cmocka_unit_test(test_server_info),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
