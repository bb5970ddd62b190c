/*
 * rpc_fuzz.c: fuzz target for the poller's gRPC message decoding: the
 * DATA bytes of a stream are reassembled by shared/grpc.c's reader, and
 * each message is decoded as every answer the poller reads
 * (HealthCheckResponse, GetLoadsResponse into RankLoads, KvEventBatch into
 * the report's events).
 *
 * Each input's first byte picks the piece sizes; the input is read once
 * whole and once in pieces, and both readings must give the same
 * messages and the same verdict; any disagreement aborts.
 *
 * libFuzzer (clang), from the build tree's generated headers:
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I. -Ibuild/proto \
 *       poller/rpc_fuzz.c ... (link build/poller/libsmg-poller_lib.a and
 *       its libraries, as the CMake target rpc_fuzz does)
 * Without libFuzzer, the CMake target rpc_fuzz (-DRPC_FUZZ_STANDALONE,
 * tests/fuzz/driver.c) mutates built-in seed streams:
 *   ./build/poller/rpc_fuzz [iterations (default 100000)] [seed]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "poller/poller.h"
#include "shared/log.h"
#ifdef RPC_FUZZ_STANDALONE
#include "tests/fuzz/driver.h"
#endif

#define MAX_MSGS 64

struct reading {
	size_t rd_n;
	uint64_t rd_digest[MAX_MSGS];
};

int LLVMFuzzerTestOneInput(const uint8_t *, size_t);

static uint64_t
digest(const uint8_t *p, size_t len)
{
	uint64_t h = 1469598103934665603ULL;
	size_t i;

	for (i = 0; i < len; i++)
		h = (h ^ p[i]) * 1099511628211ULL;
	return h ^ len;
}

/* Decodes one message every way the poller does. */
static void
decode(const uint8_t *msg, size_t len)
{
	static Smg__RankLoad ranks[LOAD_MAX_RANKS];
	Sglang__Grpc__Scheduler__HealthCheckResponse *h;
	Smg__Grpc__Common__KvEventBatch *gb;
	Smg__KvEventBatch b = SMG__KV_EVENT_BATCH__INIT;
	size_t n, i, j;
	int v;

	h = sglang__grpc__scheduler__health_check_response__unpack(NULL, len,
	    msg);
	if (h != NULL)
		sglang__grpc__scheduler__health_check_response__free_unpacked(h,
		    NULL);
	v = rpc_parse_loads(msg, len, ranks, LOAD_MAX_RANKS, &n);
	if ((v == LOADS_REPORT) != (n > 0) || n > LOAD_MAX_RANKS)
		abort();
	gb = smg__grpc__common__kv_event_batch__unpack(NULL, len, msg);
	if (gb == NULL)
		return;
	if (kvevents_from_grpc(gb, &b) == 0) {
		for (i = 0; i < b.n_events; i++) {
			const Smg__KvEvent *e = b.events[i];

			if (e->data_case == SMG__KV_EVENT__DATA_STORED) {
				/* Every hash carries block_size tokens. */
				if (e->stored->n_token_ids !=
				    e->stored->n_block_hashes *
				        e->stored->block_size)
					abort();
				for (j = 0; j < e->stored->n_token_ids; j++)
					(void)e->stored->token_ids[j];
			}
		}
		kvevents_batch_clear(&b);
	}
	smg__grpc__common__kv_event_batch__free_unpacked(gb, NULL);
}

static void
on_message(void *arg, const uint8_t *msg, size_t len)
{
	struct reading *r = arg;

	if (r->rd_n < MAX_MSGS)
		r->rd_digest[r->rd_n] = digest(msg, len);
	r->rd_n++;
	decode(msg, len);
}

static int
read_stream(const uint8_t *data, size_t len, size_t piece, struct reading *r)
{
	struct grpc_reader rd;
	size_t off, n;
	int rv = GRPC_OK;

	memset(r, 0, sizeof(*r));
	grpc_reader_init(&rd, 4096);
	for (off = 0; off < len && rv == GRPC_OK; off += n) {
		n = len - off < piece ? len - off : piece;
		rv = grpc_reader_feed(&rd, data + off, n, on_message, r);
	}
	if (rv == GRPC_OK && grpc_reader_partial(&rd))
		rv = -1; /* the stream would end inside a message */
	grpc_reader_clear(&rd);
	return rv;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
	struct reading whole, split;
	size_t piece, i;
	int a, b;

	if (len == 0)
		return 0;
	piece = 1 + data[0] % 17;
	a = read_stream(data + 1, len - 1, len, &whole);
	b = read_stream(data + 1, len - 1, piece, &split);
	if (a != b || whole.rd_n != split.rd_n)
		abort();
	for (i = 0; i < whole.rd_n && i < MAX_MSGS; i++)
		if (whole.rd_digest[i] != split.rd_digest[i])
			abort();
	return 0;
}

#ifdef RPC_FUZZ_STANDALONE
/* Appends m framed to buf at *len. */
static void
frame(uint8_t *buf, size_t *len, const ProtobufCMessage *m)
{
	size_t n = protobuf_c_message_get_packed_size(m);

	grpc_frame_prefix(buf + *len, (uint32_t)n);
	protobuf_c_message_pack(m, buf + *len + GRPC_PREFIX_LEN);
	*len += GRPC_PREFIX_LEN + n;
}

/* One stream holding an answer of each kind. */
static size_t
seed(uint8_t *buf)
{
	static uint32_t toks[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	static int64_t gone[2] = { -1, 42 };
	Sglang__Grpc__Scheduler__HealthCheckResponse h =
	    SGLANG__GRPC__SCHEDULER__HEALTH_CHECK_RESPONSE__INIT;
	Sglang__Grpc__Scheduler__GetLoadsResponse lr =
	    SGLANG__GRPC__SCHEDULER__GET_LOADS_RESPONSE__INIT;
	Sglang__Grpc__Scheduler__SchedulerLoad l =
	    SGLANG__GRPC__SCHEDULER__SCHEDULER_LOAD__INIT;
	Sglang__Grpc__Scheduler__SchedulerLoad *lp = &l;
	Smg__Grpc__Common__KvEventBatch kb =
	    SMG__GRPC__COMMON__KV_EVENT_BATCH__INIT;
	Smg__Grpc__Common__KvCacheEvent e[2], *ep[2] = { &e[0], &e[1] };
	Smg__Grpc__Common__KvBlocksStored st =
	    SMG__GRPC__COMMON__KV_BLOCKS_STORED__INIT;
	Smg__Grpc__Common__KvBlocksRemoved rm =
	    SMG__GRPC__COMMON__KV_BLOCKS_REMOVED__INIT;
	Smg__Grpc__Common__KvBlock kbk[2], *bp[2] = { &kbk[0], &kbk[1] };
	size_t len = 0, i;

	h.has_healthy = true;
	h.healthy = true;
	h.message = "ok";
	frame(buf, &len, &h.base);
	l.has_num_waiting_reqs = true;
	l.num_waiting_reqs = 5;
	l.has_token_usage = true;
	l.token_usage = 0.5;
	lr.n_loads = 1;
	lr.loads = &lp;
	frame(buf, &len, &lr.base);
	for (i = 0; i < 2; i++) {
		smg__grpc__common__kv_block__init(&kbk[i]);
		kbk[i].has_block_hash = true;
		kbk[i].block_hash = (int64_t)i - 7;
		kbk[i].n_token_ids = 4;
		kbk[i].token_ids = toks + 4 * i;
		smg__grpc__common__kv_cache_event__init(&e[i]);
	}
	st.n_blocks = 2;
	st.blocks = bp;
	e[0].data_case = SMG__GRPC__COMMON__KV_CACHE_EVENT__DATA_STORED;
	e[0].stored = &st;
	rm.n_block_hashes = 2;
	rm.block_hashes = gone;
	e[1].data_case = SMG__GRPC__COMMON__KV_CACHE_EVENT__DATA_REMOVED;
	e[1].removed = &rm;
	kb.n_events = 2;
	kb.events = ep;
	frame(buf, &len, &kb.base);
	return len;
}

static size_t
rpc_seed(uint8_t *buf, size_t cap, uint32_t pick)
{
	static uint8_t base[1024];
	static size_t blen;

	(void)pick;
	if (blen == 0)
		blen = seed(base);
	memcpy(buf, base, blen < cap ? blen : cap);
	return blen < cap ? blen : cap;
}

int
main(int argc, char **argv)
{
	static const struct fuzz_target t = {
		.ft_name = "rpc_fuzz",
		.ft_iters = 100000,
		.ft_delete_max = 7,
		.ft_seed = rpc_seed,
	};

	log_init("rpc_fuzz", LOG_LEVEL_ERROR);
	return fuzz_driver_main(argc, argv, &t);
}
#endif /* RPC_FUZZ_STANDALONE */
