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
 * Without libFuzzer, a standalone driver mutates built-in seed streams:
 *   cc -g -fsanitize=address,undefined -DSP_FUZZ_STANDALONE -I. \
 *       shared/sp_fuzz.c shared/sp.c shared/log.c shared/xmalloc.c -lev \
 *       -o sp_fuzz
 *   ./sp_fuzz [iterations (default 200000)] [seed]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shared/sp.h"

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
static uint64_t rng;

static uint32_t
next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 11);
}

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

int
main(int argc, char **argv)
{
	static uint8_t buf[16384], seed[16384];
	static const uint8_t one[] = { 0x80, 0, 0, 1, 'h', 'i' };
	static const uint8_t two[] = { 0, 0, 0, 3, 0x80, 0, 0, 2, 'x' };
	static const uint8_t deep[] = { 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0,
		0, 0, 4, 0, 0, 0, 5, 0, 0, 0, 6, 0, 0, 0, 7, 0, 0, 0, 8, 0x80,
		0, 0, 9 };
	unsigned long iters = 200000, it;
	size_t slen = 1, len, pos, tl, k, nmut;

	if (argc > 1)
		iters = strtoul(argv[1], NULL, 10);
	rng = argc > 2 ? strtoull(argv[2], NULL, 10) : 0x9e3779b97f4a7c15ULL;
	if (rng == 0)
		rng = 1;
	/* Seed: a header and a few frames, as a libnng REQ sends them. */
	sp_header_make(seed + slen, SP_PROTO_REQ0);
	slen += SP_HEADER_LEN;
	put_frame(seed, sizeof(seed), &slen, one, sizeof(one));
	put_frame(seed, sizeof(seed), &slen, two, sizeof(two));
	put_frame(seed, sizeof(seed), &slen, deep, sizeof(deep));
	put_frame(seed, sizeof(seed), &slen, "", 0);
	put_frame(seed, sizeof(seed), &slen, one, 3);
	for (it = 0; it < iters; it++) {
		memcpy(buf, seed, slen);
		len = slen;
		buf[0] = (uint8_t)next();
		nmut = next() % 6;
		for (k = 0; k < nmut; k++) {
			pos = 1 + next() % len;
			switch (next() % 5) {
			case 0: /* flip a byte */
				if (pos < len)
					buf[pos] = (uint8_t)next();
				break;
			case 1: /* delete a run */
				tl = next() % 12;
				if (pos + tl <= len) {
					memmove(buf + pos, buf + pos + tl,
					    len - pos - tl);
					len -= tl;
				}
				break;
			case 2: /* a frame head with a random length */
				if (len + SP_FRAME_HEAD <= sizeof(buf)) {
					memmove(buf + pos + SP_FRAME_HEAD,
					    buf + pos, len - pos);
					sp_frame_head(buf + pos,
					    next() % (2 * FUZZ_MAX));
					len += SP_FRAME_HEAD;
				}
				break;
			case 3: /* duplicate a run */
				tl = next() % 64;
				if (pos + tl <= len &&
				    len + tl <= sizeof(buf)) {
					memmove(buf + pos + tl, buf + pos,
					    len - pos);
					len += tl;
				}
				break;
			default: /* truncate */
				len = pos;
				break;
			}
		}
		LLVMFuzzerTestOneInput(buf, len);
	}
	printf("sp_fuzz: %lu inputs\n", iters);
	return 0;
}
#endif /* SP_FUZZ_STANDALONE */
