/*
 * tree_bench.c: measures the cache_aware trees (broker/tree.c) the way the
 * broker uses them: one decision = match + insert of a prompt, on a tree
 * kept at --max-tree-size by eviction. Prints, per prompt size and tenant
 * count, decision time p50/p99, memory per cached char, and the time to
 * dump the full tree and rebuild it from the dump (restart cost).
 *
 * Workload: multi-turn conversations. Each conversation starts from one of
 * 16 system prompts (a quarter of the prompt size) and grows in three turns
 * to the full size; its tenant is fixed, except that a prompt matching
 * above the 0.3 threshold goes to a holder, and 10% of requests spill to a
 * random tenant (so hot system prompts get replicated). Text is ASCII words.
 *
 * usage: tree-bench [-c max_tree_size] [-n measured_conversations]
 */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "broker/tree.h"

#define NSYS        16
#define CORPUS_SIZE (8u << 20)

struct sample {
	double *sa_v;
	size_t sa_n;
	size_t sa_cap;
};

struct dumpbuf {
	unsigned char *db_p;
	size_t db_len;
	size_t db_cap;
	size_t db_recs;
};

static uint64_t rng_state = 0x2545f4914f6cdd1dULL;
static char *corpus;

static uint64_t rnd(void);
static double now_us(void);
static void corpus_init(void);
static void text_fill(char *, size_t);
static void sample_add(struct sample *, double);
static int cmp_double(const void *, const void *);
static double sample_pct(struct sample *, double);
static size_t heap_used(void);
static int dump_cb(void *, unsigned, const void *, size_t);
static double rebuild(const struct dumpbuf *, enum tree_kind, uint64_t,
    struct tree **);
static void run(size_t, unsigned, uint64_t, size_t, int);
static void run_unique(uint64_t);

static uint64_t
rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static double
now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static void
corpus_init(void)
{
	static const char *words[] = { "the", "model", "request", "worker",
		"cache", "prefix", "token", "answer", "question", "system",
		"assistant", "user", "please", "explain", "function", "value",
		"return", "error", "config", "gateway", "latency", "of", "and",
		"to", "in", "is", "that", "for", "with", "as", "on", "be",
		"this", "are", "by", "from", "data", "result", "between",
		"which", "how", "why", "when", "table", "number", "list" };
	size_t n = sizeof(words) / sizeof(words[0]), i = 0, l;
	const char *w;

	if ((corpus = malloc(CORPUS_SIZE)) == NULL) {
		perror("malloc");
		exit(1);
	}
	while (i < CORPUS_SIZE) {
		w = words[rnd() % n];
		l = strlen(w);
		if (i + l + 1 > CORPUS_SIZE)
			break;
		memcpy(corpus + i, w, l);
		i += l;
		corpus[i++] = rnd() % 12 == 0 ? '\n' : ' ';
	}
	memset(corpus + i, ' ', CORPUS_SIZE - i);
}

/* n bytes of text from a random place of the corpus. */
static void
text_fill(char *dst, size_t n)
{
	size_t off, chunk;

	while (n > 0) {
		off = rnd() % (CORPUS_SIZE / 2);
		chunk = n < CORPUS_SIZE / 2 ? n : CORPUS_SIZE / 2;
		memcpy(dst, corpus + off, chunk);
		dst += chunk;
		n -= chunk;
	}
}

static void
sample_add(struct sample *s, double v)
{
	if (s->sa_n == s->sa_cap) {
		s->sa_cap = s->sa_cap ? s->sa_cap * 2 : 1024;
		s->sa_v = realloc(s->sa_v, s->sa_cap * sizeof(double));
		if (s->sa_v == NULL) {
			perror("realloc");
			exit(1);
		}
	}
	s->sa_v[s->sa_n++] = v;
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double
sample_pct(struct sample *s, double p)
{
	size_t i;

	if (s->sa_n == 0)
		return 0;
	qsort(s->sa_v, s->sa_n, sizeof(double), cmp_double);
	i = (size_t)(p * (double)(s->sa_n - 1) + 0.5);
	return s->sa_v[i];
}

static size_t
heap_used(void)
{
	struct mallinfo2 mi = mallinfo2();

	return mi.uordblks + mi.hblkhd;
}

/* Record: tenant (2 bytes), key length (4 bytes), key; as a store would
 * keep it. */
static int
dump_cb(void *arg, unsigned tenant, const void *key, size_t len)
{
	struct dumpbuf *d = arg;
	uint16_t t16 = (uint16_t)tenant;
	uint32_t l32 = (uint32_t)len;

	if (d->db_len + 6 + len > d->db_cap) {
		d->db_cap = (d->db_len + 6 + len) * 2;
		if ((d->db_p = realloc(d->db_p, d->db_cap)) == NULL) {
			perror("realloc");
			exit(1);
		}
	}
	memcpy(d->db_p + d->db_len, &t16, 2);
	memcpy(d->db_p + d->db_len + 2, &l32, 4);
	memcpy(d->db_p + d->db_len + 6, key, len);
	d->db_len += 6 + len;
	d->db_recs++;
	return 0;
}

static double
rebuild(const struct dumpbuf *d, enum tree_kind kind, uint64_t cap,
    struct tree **out)
{
	struct tree *t = tree_new(kind, cap, 16);
	size_t off = 0;
	uint16_t t16;
	uint32_t l32;
	double t0 = now_us();

	while (off < d->db_len) {
		memcpy(&t16, d->db_p + off, 2);
		memcpy(&l32, d->db_p + off + 2, 4);
		if (tree_insert(t, (const char *)d->db_p + off + 6, l32, t16) ==
		    -1) {
			fprintf(stderr, "rebuild: insert failed\n");
			exit(1);
		}
		off += 6 + l32;
	}
	*out = t;
	return now_us() - t0;
}

/*
 * One scenario: prompts of psize bytes, ntenants tenants, tree capped at
 * cap chars. Warms up until the tree is at the cap (and at least one
 * round), then measures nconv conversations.
 */
static void
run(size_t psize, unsigned ntenants, uint64_t cap, size_t nconv, int dump)
{
	char *sys[NSYS], *conv;
	struct tree *t, *u;
	struct tree_match m;
	struct sample dec = { 0 }, mat = { 0 };
	struct dumpbuf db = { 0 };
	size_t heap0, heap1, c, k, len, warm = 0, evict_rounds = 0;
	unsigned tenant, own;
	double t0, t1, t2, dump_us, rebuild_us;
	int measuring = 0;

	for (k = 0; k < NSYS; k++) {
		sys[k] = malloc(psize / 4);
		text_fill(sys[k], psize / 4);
	}
	conv = malloc(psize);
	heap0 = heap_used();
	t = tree_new(TREE_STRING, cap, 16);
	for (c = 0; !measuring || c < nconv; c++) {
		if (!measuring && tree_size(t) + psize > cap)
			evict_rounds++;
		if (!measuring && evict_rounds > nconv / 4 + 1) {
			measuring = 1;
			warm = c;
			c = 0;
		}
		memcpy(conv, sys[rnd() % NSYS], psize / 4);
		text_fill(conv + psize / 4, psize - psize / 4);
		own = (unsigned)(rnd() % ntenants);
		for (k = 2; k <= 4; k++) {
			len = psize * k / 4;
			t0 = now_us();
			tree_match(t, conv, len, &m);
			tenant = own;
			if ((double)m.tm_matched > 0.3 * (double)m.tm_input &&
			    !tree_match_holds(&m, own))
				tenant = m.tm_holders[0];
			if (rnd() % 10 == 0)
				tenant = (unsigned)(rnd() % ntenants);
			t1 = now_us();
			if (tree_insert(t, conv, len, tenant) == -1) {
				fprintf(stderr, "insert failed\n");
				exit(1);
			}
			t2 = now_us();
			if (measuring && k == 4) {
				sample_add(&dec, t2 - t0);
				sample_add(&mat, t1 - t0);
			}
		}
	}
	heap1 = heap_used();
	printf("string %6zu B  %3u tenants: decision p50 %7.2f us p99 %7.2f "
	       "us (match p50 %6.2f p99 %6.2f) | size %llu chars, %zu nodes, "
	       "%.2f B/char (heap), %.2f B/char (own) | warmup %zu convs\n",
	    psize, ntenants, sample_pct(&dec, 0.5), sample_pct(&dec, 0.99),
	    sample_pct(&mat, 0.5), sample_pct(&mat, 0.99),
	    (unsigned long long)tree_size(t), tree_nodes(t),
	    (double)(heap1 - heap0) / (double)tree_size(t),
	    (double)tree_mem(t) / (double)tree_size(t), warm);
	if (dump) {
		t0 = now_us();
		tree_dump(t, dump_cb, &db);
		dump_us = now_us() - t0;
		rebuild_us = rebuild(&db, TREE_STRING, cap, &u);
		printf("  dump %zu records, %.1f MB in %.1f ms; rebuild %.1f "
		       "ms (%llu chars, %s)\n",
		    db.db_recs, (double)db.db_len / 1e6, dump_us / 1e3,
		    rebuild_us / 1e3, (unsigned long long)tree_size(u),
		    tree_size(u) == tree_size(t) ? "same size" : "DIFFERENT");
		tree_free(u);
		free(db.db_p);
	}
	tree_free(t);
	for (k = 0; k < NSYS; k++)
		free(sys[k]);
	free(conv);
	free(dec.sa_v);
	free(mat.sa_v);
}

/* Worst case for memory: unique prompts, nothing shared; and the token
 * tree at 4 chars per token. */
static void
run_unique(uint64_t cap)
{
	struct tree *t;
	struct sample dec = { 0 };
	uint32_t *tok;
	char *p;
	size_t heap0, heap1, i, j, n = 4096;
	double t0;
	struct tree_match m;

	p = malloc(16384);
	heap0 = heap_used();
	t = tree_new(TREE_STRING, cap, 16);
	for (i = 0; tree_size(t) + 16384 <= cap || i < 20000; i++) {
		text_fill(p, 16384);
		t0 = now_us();
		tree_match(t, p, 16384, &m);
		tree_insert(t, p, 16384, (unsigned)(rnd() % 8));
		sample_add(&dec, now_us() - t0);
	}
	heap1 = heap_used();
	printf("string unique 16384 B: decision p50 %.2f us p99 %.2f us | "
	       "%.2f B/char (heap) %zu nodes\n",
	    sample_pct(&dec, 0.5), sample_pct(&dec, 0.99),
	    (double)(heap1 - heap0) / (double)tree_size(t), tree_nodes(t));
	tree_free(t);
	free(p);

	dec.sa_n = 0;
	tok = malloc(n * sizeof(*tok));
	heap0 = heap_used();
	t = tree_new(TREE_TOKEN, cap / 4, 16);
	for (i = 0; i < 20000; i++) {
		/* 4096 tokens: a shared 1024-token head, then unique. */
		for (j = 0; j < n; j++)
			tok[j] = j < 1024 ? (uint32_t)(j * 7 + i % 16)
			                  : (uint32_t)(rnd() % 100000);
		t0 = now_us();
		tree_match_tokens(t, tok, n, &m);
		tree_insert_tokens(t, tok, n, (unsigned)(rnd() % 8));
		sample_add(&dec, now_us() - t0);
	}
	heap1 = heap_used();
	printf("token  4096 tokens bs 16: decision p50 %.2f us p99 %.2f us | "
	       "%.2f B/token (heap), size %llu tokens\n",
	    sample_pct(&dec, 0.5), sample_pct(&dec, 0.99),
	    (double)(heap1 - heap0) / (double)tree_size(t),
	    (unsigned long long)tree_size(t));
	tree_free(t);
	free(tok);
	free(dec.sa_v);
}

int
main(int argc, char **argv)
{
	uint64_t cap = 67108864;
	size_t nconv = 2000;
	int ch;

	while ((ch = getopt(argc, argv, "c:n:")) != -1) {
		switch (ch) {
		case 'c':
			cap = strtoull(optarg, NULL, 10);
			break;
		case 'n':
			nconv = strtoul(optarg, NULL, 10);
			break;
		default:
			fprintf(stderr,
			    "usage: tree-bench [-c max_tree_size] "
			    "[-n conversations]\n");
			return 2;
		}
	}
	if (cap == 0 || nconv == 0)
		return 2;
	corpus_init();
	printf("max tree size %llu, %zu measured conversations each\n",
	    (unsigned long long)cap, nconv);
	run(1024, 8, cap, nconv, 0);
	run(1024, 256, cap, nconv, 1);
	run(16384, 8, cap, nconv, 0);
	run(16384, 256, cap, nconv, 1);
	run(65536, 8, cap, nconv, 0);
	run(65536, 256, cap, nconv, 1);
	run_unique(cap);
	free(corpus);
	return 0;
}
