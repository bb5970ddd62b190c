/*
 * rpc_test.c: the gRPC mappings into the poller's reports, from bytes
 * packed as an engine packs them: GetLoadsResponse (§4.2, DP ranks, the
 * optional sections, empty and undecodable answers) into RankLoad, and
 * KvEventBatch (§5: stored chains with and without a parent, block-size
 * changes, removals, clears) into the report's KvEventBatch.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "poller/poller.h"

static Smg__RankLoad ranks[LOAD_MAX_RANKS];

static size_t
pack(const ProtobufCMessage *m, uint8_t *buf)
{
	return protobuf_c_message_pack(m, buf);
}

static void
test_loads_two_ranks(void **state)
{
	Sglang__Grpc__Scheduler__GetLoadsResponse r =
	    SGLANG__GRPC__SCHEDULER__GET_LOADS_RESPONSE__INIT;
	Sglang__Grpc__Scheduler__SchedulerLoad l0 =
	    SGLANG__GRPC__SCHEDULER__SCHEDULER_LOAD__INIT;
	Sglang__Grpc__Scheduler__SchedulerLoad l1 =
	    SGLANG__GRPC__SCHEDULER__SCHEDULER_LOAD__INIT;
	Sglang__Grpc__Scheduler__DisaggregationMetrics dm =
	    SGLANG__GRPC__SCHEDULER__DISAGGREGATION_METRICS__INIT;
	Sglang__Grpc__Scheduler__SchedulerLoad *ls[] = { &l0, &l1 };
	uint8_t buf[1024];
	size_t len, n;

	(void)state;
	r.timestamp = "2026-01-01T00:00:00Z";
	r.has_dp_rank_count = true;
	r.dp_rank_count = 2;
	r.n_loads = 2;
	r.loads = ls;
	l0.has_dp_rank = true; /* rank 0 leaves it at its default */
	l0.has_num_running_reqs = true;
	l0.num_running_reqs = 3;
	l0.has_num_waiting_reqs = true;
	l0.num_waiting_reqs = 7;
	l0.has_token_usage = true;
	l0.token_usage = 0.25;
	l0.has_num_waiting_uncached_tokens = true;
	l0.num_waiting_uncached_tokens = 4096;
	l0.has_max_total_num_tokens = true;
	l0.max_total_num_tokens = 100000;
	l1.has_dp_rank = true;
	l1.dp_rank = 1;
	l1.has_num_used_tokens = true;
	l1.num_used_tokens = 512;
	l1.has_utilization = true;
	l1.utilization = 0.5;
	l1.has_max_running_requests = true;
	l1.max_running_requests = 64;
	l1.has_cache_hit_rate = true;
	l1.cache_hit_rate = 0.75;
	l1.has_gen_throughput = true;
	l1.gen_throughput = 123.5;
	l1.has_num_total_reqs = true;
	l1.num_total_reqs = 9;
	dm.mode = "decode";
	dm.has_decode_prealloc_queue_reqs = true;
	dm.decode_prealloc_queue_reqs = 2;
	l1.disaggregation = &dm;
	len = pack(&r.base, buf);
	assert_int_equal(rpc_parse_loads(buf, len, ranks, LOAD_MAX_RANKS, &n),
	    LOADS_REPORT);
	assert_int_equal(n, 2);
	assert_int_equal(ranks[0].dp_rank, 0);
	assert_int_equal(ranks[0].num_running_reqs, 3);
	assert_int_equal(ranks[0].num_waiting_reqs, 7);
	assert_int_equal(ranks[0].num_waiting_uncached_tokens, 4096);
	assert_int_equal(ranks[0].max_total_num_tokens, 100000);
	assert_true(ranks[0].token_usage == 0.25);
	assert_int_equal(ranks[1].dp_rank, 1);
	assert_int_equal(ranks[1].num_used_tokens, 512);
	assert_int_equal(ranks[1].num_total_reqs, 9);
	assert_int_equal(ranks[1].max_running_requests, 64);
	assert_true(ranks[1].utilization == 0.5);
	assert_true(ranks[1].cache_hit_rate == 0.75);
	assert_true(ranks[1].gen_throughput == 123.5);
	/* The cap keeps the first ranks. */
	assert_int_equal(rpc_parse_loads(buf, len, ranks, 1, &n), LOADS_REPORT);
	assert_int_equal(n, 1);
}

/* Field 17 after the optionals, and unknown fields (aggregate = 5,
 * speculative = 13) skipped, as a newer engine would send them. */
static void
test_loads_wire_shapes(void **state)
{
	/* loads { dp_rank 2; num_waiting_uncached_tokens 300 } plus an
	 * AggregateMetrics { total_running_reqs 4 } */
	static const uint8_t wire[] = {
		0x22, 0x06, 0x08, 0x02, 0x88, 0x01, 0xac, 0x02, /* loads */
		0x2a, 0x02, 0x08, 0x04, /* aggregate */
		0x18, 0x01, /* dp_rank_count 1 */
	};
	uint8_t junk[] = { 0x22, 0x7f, 0x01 };
	size_t n;

	(void)state;
	assert_int_equal(
	    rpc_parse_loads(wire, sizeof(wire), ranks, LOAD_MAX_RANKS, &n),
	    LOADS_REPORT);
	assert_int_equal(n, 1);
	assert_int_equal(ranks[0].dp_rank, 2);
	assert_int_equal(ranks[0].num_waiting_uncached_tokens, 300);
	assert_int_equal(ranks[0].num_running_reqs, 0);
	/* No ranks: no report this tick. */
	assert_int_equal(
	    rpc_parse_loads(wire + 8, 6, ranks, LOAD_MAX_RANKS, &n),
	    LOADS_EMPTY);
	assert_int_equal(
	    rpc_parse_loads((const uint8_t *)"", 0, ranks, LOAD_MAX_RANKS, &n),
	    LOADS_EMPTY);
	assert_int_equal(
	    rpc_parse_loads(junk, sizeof(junk), ranks, LOAD_MAX_RANKS, &n),
	    LOADS_ABSENT);
	assert_int_equal(n, 0);
}

static Smg__Grpc__Common__KvBlock *
block(int64_t hash, uint32_t first, size_t ntok)
{
	Smg__Grpc__Common__KvBlock *b = calloc(1, sizeof(*b));
	size_t i;

	smg__grpc__common__kv_block__init(b);
	b->has_block_hash = true;
	b->block_hash = hash;
	b->has_block_size = true;
	b->block_size = (int32_t)ntok;
	b->n_token_ids = ntok;
	b->token_ids = calloc(ntok + 1, sizeof(uint32_t));
	for (i = 0; i < ntok; i++)
		b->token_ids[i] = first + (uint32_t)i;
	return b;
}

static void
test_kv_batch(void **state)
{
	Smg__Grpc__Common__KvEventBatch in =
	    SMG__GRPC__COMMON__KV_EVENT_BATCH__INIT;
	Smg__Grpc__Common__KvCacheEvent e[4];
	Smg__Grpc__Common__KvCacheEvent *ep[4] = { &e[0], &e[1], &e[2], &e[3] };
	Smg__Grpc__Common__KvBlocksStored st =
	    SMG__GRPC__COMMON__KV_BLOCKS_STORED__INIT;
	Smg__Grpc__Common__KvBlocksRemoved rm =
	    SMG__GRPC__COMMON__KV_BLOCKS_REMOVED__INIT;
	Smg__Grpc__Common__KvCacheCleared cl =
	    SMG__GRPC__COMMON__KV_CACHE_CLEARED__INIT;
	Smg__Grpc__Common__KvBlock *blocks[3];
	int64_t gone[] = { -5, 7 };
	Smg__KvEventBatch out = SMG__KV_EVENT_BATCH__INIT;
	Smg__Grpc__Common__KvEventBatch *dec;
	uint8_t buf[2048];
	size_t i, len;

	(void)state;
	for (i = 0; i < 4; i++)
		smg__grpc__common__kv_cache_event__init(&e[i]);
	/* Two 4-token blocks, then a 2-token tail: two stored events. */
	blocks[0] = block(-100, 10, 4);
	blocks[1] = block(200, 14, 4);
	blocks[2] = block(300, 18, 2);
	st.n_blocks = 3;
	st.blocks = blocks;
	st.has_parent_block_hash = true;
	st.parent_block_hash = 0; /* a parent hash of 0 still is one */
	e[0].data_case = SMG__GRPC__COMMON__KV_CACHE_EVENT__DATA_STORED;
	e[0].stored = &st;
	rm.n_block_hashes = 2;
	rm.block_hashes = gone;
	e[1].data_case = SMG__GRPC__COMMON__KV_CACHE_EVENT__DATA_REMOVED;
	e[1].removed = &rm;
	e[2].data_case = SMG__GRPC__COMMON__KV_CACHE_EVENT__DATA_CLEARED;
	e[2].cleared = &cl;
	/* e[3]: no data (a kind newer than ours) is skipped. */
	in.has_sequence_number = true;
	in.sequence_number = 41;
	in.n_events = 4;
	in.events = ep;
	/* Through the wire, as the poller receives it. */
	len = pack(&in.base, buf);
	dec = smg__grpc__common__kv_event_batch__unpack(NULL, len, buf);
	assert_non_null(dec);
	assert_int_equal(dec->sequence_number, 41);
	assert_true(dec->events[0]->stored->has_parent_block_hash);
	assert_int_equal(kvevents_from_grpc(dec, &out), 0);
	assert_int_equal(out.n_events, 4);
	assert_int_equal(out.events[0]->data_case, SMG__KV_EVENT__DATA_STORED);
	assert_true(out.events[0]->stored->has_parent);
	assert_int_equal(out.events[0]->stored->parent_block_hash, 0);
	assert_int_equal(out.events[0]->stored->n_block_hashes, 2);
	assert_int_equal(out.events[0]->stored->block_hashes[0], -100);
	assert_int_equal(out.events[0]->stored->block_hashes[1], 200);
	assert_int_equal(out.events[0]->stored->block_size, 4);
	assert_int_equal(out.events[0]->stored->n_token_ids, 8);
	for (i = 0; i < 8; i++)
		assert_int_equal(out.events[0]->stored->token_ids[i], 10 + i);
	/* The tail hangs off the last block before it. */
	assert_true(out.events[1]->stored->has_parent);
	assert_int_equal(out.events[1]->stored->parent_block_hash, 200);
	assert_int_equal(out.events[1]->stored->block_size, 2);
	assert_int_equal(out.events[1]->stored->token_ids[1], 19);
	assert_int_equal(out.events[2]->data_case, SMG__KV_EVENT__DATA_REMOVED);
	assert_int_equal(out.events[2]->removed->n_block_hashes, 2);
	assert_int_equal(out.events[2]->removed->block_hashes[0], -5);
	assert_int_equal(out.events[3]->data_case, SMG__KV_EVENT__DATA_CLEARED);
	kvevents_batch_clear(&out);
	assert_int_equal(out.n_events, 0);

	/* Without a parent the chain starts at position 0. */
	dec->events[0]->stored->has_parent_block_hash = false;
	len = dec->n_events;
	dec->n_events = 1;
	assert_int_equal(kvevents_from_grpc(dec, &out), 0);
	assert_int_equal(out.n_events, 2);
	assert_false(out.events[0]->stored->has_parent);
	kvevents_batch_clear(&out);
	dec->n_events = len;
	smg__grpc__common__kv_event_batch__free_unpacked(dec, NULL);
	for (i = 0; i < 3; i++) {
		free(blocks[i]->token_ids);
		free(blocks[i]);
	}
}

static void
test_kv_empty(void **state)
{
	Smg__Grpc__Common__KvEventBatch in =
	    SMG__GRPC__COMMON__KV_EVENT_BATCH__INIT;
	Smg__KvEventBatch out = SMG__KV_EVENT_BATCH__INIT;

	(void)state;
	assert_int_equal(kvevents_from_grpc(&in, &out), 0);
	assert_int_equal(out.n_events, 0);
	assert_null(out.events);
}

static void
test_grpc_urls(void **state)
{
	(void)state;
	assert_true(rpc_is_grpc_url("grpc://h:1"));
	assert_true(rpc_is_grpc_url("grpcs://h:1"));
	assert_false(rpc_is_grpc_url("http://h:1"));
	assert_false(rpc_is_grpc_url("grpc:/h"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_loads_two_ranks),
		cmocka_unit_test(test_loads_wire_shapes),
		cmocka_unit_test(test_kv_batch),
		cmocka_unit_test(test_kv_empty),
		cmocka_unit_test(test_grpc_urls),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
