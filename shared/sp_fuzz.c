/*
 * sp_fuzz.c: fuzz target for the SP frame decoder of shared/sp.c.
 *
 * Each input, after its first byte, is a connection's byte stream as a
 * REP server receives it: the 8-byte header, then frames. It is decoded
 * twice, as the connection reader does (sp_header_check, then
 * sp_frame_parse until it needs more, consuming each frame): once whole,
 * once arriving in pieces whose sizes come from the first byte, with the
 * buffer grown to the size sp_frame_parse announces. Both readings must
 * agree (same frames, same verdict), every frame must lie inside the
 * input, and sp_backtrace_len must keep its contract on each payload;
 * any disagreement aborts.
 *
 * libFuzzer (clang):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I. shared/sp_fuzz.c \
 *       shared/sp.c shared/log.c shared/xmalloc.c -lev -o sp_fuzz &&
 *   ./sp_fuzz
 * Without libFuzzer, the CMake target sp_fuzz (-DSP_FUZZ_STANDALONE,
 * tests/fuzz/driver.c) mutates built-in seed streams:
 *   ./build/shared/sp_fuzz [iterations (default 200000)] [seed]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shared/sp.h"
#ifdef SP_FUZZ_STANDALONE
#include "tests/fuzz/driver.h"
#endif

#define FUZZ_MAX    4096 /* frame payload limit under test */
#define FUZZ_FRAMES 256

struct reading {
	int rd_header; /* 0 need, 1 ok, -1 refused */
	int rd_end; /* the final sp_frame_status */
	size_t rd_nframes;
	size_t rd_off[FUZZ_FRAMES]; /* payload offsets in the stream */
	size_t rd_len[FUZZ_FRAMES];
};

int LLVMFuzzerTestOneInput(const uint8_t *, size_t);
static void check_payload(const uint8_t *, size_t);
static void read_stream(const uint8_t *, size_t, size_t, struct reading *);

static void
check_payload(const uint8_t *p, size_t len)
{
	int bt = sp_backtrace_len(p, len), i;

	if (bt == -1) {
		/* Malformed only when a word runs past the end. */
		if (len >= 4 * SP_MAX_HOPS)
			abort();
		for (i = 0; (size_t)i + 4 <= len && i < 4 * SP_MAX_HOPS; i += 4)
			if (p[i] & 0x80)
				abort();
		return;
	}
	if (bt == 0) {
		for (i = 0; i < 4 * SP_MAX_HOPS; i += 4)
			if ((size_t)i + 4 > len || (p[i] & 0x80))
				abort();
		return;
	}
	if (bt % 4 != 0 || bt > 4 * SP_MAX_HOPS || (size_t)bt > len ||
	    !(p[bt - 4] & 0x80))
		abort();
	for (i = 0; i < bt - 4; i += 4)
		if (p[i] & 0x80)
			abort();
}

/*
 * Feeds s[0..len) to the decoder in pieces of at most piece bytes (0:
 * whole), keeping only the undecoded tail as the connection does.
 */
static void
read_stream(const uint8_t *s, size_t len, size_t piece, struct reading *rd)
{
	uint8_t *buf;
	const uint8_t *p;
	size_t have = 0, off = 0, fed = 0, n, plen, used, base = 0;
	enum sp_frame_status st = SP_FRAME_NEED;

	memset(rd, 0, sizeof(*rd));
	if ((buf = malloc(len > 0 ? len : 1)) == NULL)
		abort();
	while (fed < len || have > 0) {
		n = piece == 0 ? len - fed : piece;
		if (n > len - fed)
			n = len - fed;
		memcpy(buf + have, s + fed, n);
		have += n;
		fed += n;
		if (rd->rd_header == 0) {
			if (have < SP_HEADER_LEN) {
				if (fed == len)
					break;
				continue;
			}
			if (sp_header_check(buf, SP_PROTO_REQ0) == -1) {
				rd->rd_header = -1;
				break;
			}
			rd->rd_header = 1;
			memmove(buf, buf + SP_HEADER_LEN, have - SP_HEADER_LEN);
			have -= SP_HEADER_LEN;
			base = SP_HEADER_LEN;
		}
		off = 0;
		for (;;) {
			st = sp_frame_parse(buf + off, have - off, FUZZ_MAX, &p,
			    &plen, &used);
			if (st != SP_FRAME_OK)
				break;
			if (used != SP_FRAME_HEAD + plen ||
			    p != buf + off + SP_FRAME_HEAD || off + used > have)
				abort();
			check_payload(p, plen);
			if (rd->rd_nframes < FUZZ_FRAMES) {
				rd->rd_off[rd->rd_nframes] =
				    base + off + SP_FRAME_HEAD;
				rd->rd_len[rd->rd_nframes] = plen;
			}
			rd->rd_nframes++;
			off += used;
		}
		if (st == SP_FRAME_NEED && used != 0 &&
		    (used < SP_FRAME_HEAD || used > SP_FRAME_HEAD + FUZZ_MAX))
			abort();
		memmove(buf, buf + off, have - off);
		have -= off;
		base += off;
		if (st != SP_FRAME_NEED || fed == len)
			break;
	}
	rd->rd_end = st;
	free(buf);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct reading whole, pieces;
	size_t i;

	if (size < 1)
		return 0;
	read_stream(data + 1, size - 1, 0, &whole);
	read_stream(data + 1, size - 1, 1 + data[0] % 17, &pieces);
	if (whole.rd_header != pieces.rd_header ||
	    whole.rd_nframes != pieces.rd_nframes)
		abort();
	if (whole.rd_header == 1 && whole.rd_end != pieces.rd_end)
		abort();
	for (i = 0; i < whole.rd_nframes && i < FUZZ_FRAMES; i++)
		if (whole.rd_off[i] != pieces.rd_off[i] ||
		    whole.rd_len[i] != pieces.rd_len[i] ||
		    whole.rd_off[i] + whole.rd_len[i] > size - 1)
			abort();
	return 0;
}

#ifdef SP_FUZZ_STANDALONE
/* Appends a frame of payload p (len bytes) to buf at *n. */
static void
put_frame(uint8_t *buf, size_t cap, size_t *n, const void *p, size_t len)
{
	if (*n + SP_FRAME_HEAD + len > cap)
		return;
	sp_frame_head(buf + *n, len);
	memcpy(buf + *n + SP_FRAME_HEAD, p, len);
	*n += SP_FRAME_HEAD + len;
}

/* A header and a few frames, as a libnng REQ sends them. */
static size_t
sp_seed(uint8_t *buf, size_t cap, uint32_t pick)
{
	static const uint8_t one[] = { 0x80, 0, 0, 1, 'h', 'i' };
	static const uint8_t two[] = { 0, 0, 0, 3, 0x80, 0, 0, 2, 'x' };
	static const uint8_t deep[] = { 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0,
		0, 0, 4, 0, 0, 0, 5, 0, 0, 0, 6, 0, 0, 0, 7, 0, 0, 0, 8, 0x80,
		0, 0, 9 };
	size_t n = 0;

	(void)pick;
	if (cap < SP_HEADER_LEN)
		return 0;
	sp_header_make(buf, SP_PROTO_REQ0);
	n = SP_HEADER_LEN;
	put_frame(buf, cap, &n, one, sizeof(one));
	put_frame(buf, cap, &n, two, sizeof(two));
	put_frame(buf, cap, &n, deep, sizeof(deep));
	put_frame(buf, cap, &n, "", 0);
	put_frame(buf, cap, &n, one, 3);
	return n;
}

/* A frame head announcing a random length, up to twice the limit. */
static size_t
sp_insert(uint8_t *buf, size_t len, size_t cap, size_t pos, uint32_t pick)
{
	if (len + SP_FRAME_HEAD > cap)
		return len;
	memmove(buf + pos + SP_FRAME_HEAD, buf + pos, len - pos);
	sp_frame_head(buf + pos, pick % (2 * FUZZ_MAX));
	return len + SP_FRAME_HEAD;
}

int
main(int argc, char **argv)
{
	static const struct fuzz_target t = {
		.ft_name = "sp_fuzz",
		.ft_iters = 200000,
		.ft_delete_max = 11,
		.ft_seed = sp_seed,
		.ft_insert = sp_insert,
	};

	return fuzz_driver_main(argc, argv, &t);
}
#endif /* SP_FUZZ_STANDALONE */
