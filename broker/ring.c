/*
 * ring.c: the XXH3 consistent-hash ring (policies.md §5.2) and the pure
 * selection rules of consistent_hashing (§5.1) and prefix_hash (§6).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "shared/log.h"
#include "shared/xmalloc.h"

#include "ring.h"

struct ring_entry {
	uint64_t re_pos;
	uint32_t re_member;
};

struct ring {
	struct ring_entry *r_entries; /* sorted by position */
	size_t r_nentries;
	char **r_urls; /* members, sorted by URL */
	uint64_t *r_ids;
	uint32_t *r_stamp; /* lookup scratch: visited when == r_gen */
	size_t r_nmembers;
	uint32_t r_gen;
};

/* Sorting context of ring_new (qsort has no argument). */
struct ring_sort_in {
	const struct ring_node *rs_node;
	size_t rs_order;
};

static int ring_cmp_in(const void *a, const void *b);
static int ring_cmp_entry(const void *a, const void *b);
static bool ring_visible_ascii(const char *s);
static int ring_parse_index(const char *s, uint64_t *out);
static size_t ring_least_loaded(const uint64_t *loads, size_t n);
static size_t ring_utf8_advance(const char *s, size_t len, size_t off,
    uint64_t nchars, uint64_t *advanced);
static void ring_level_put(struct ring_level *win, size_t *nwin, size_t *next,
    const struct ring_level *l);
static void ring_feed_tokens(XXH3_state_t *st, const uint32_t *tok,
    size_t *done, size_t b);
static size_t ring_levels_tokens(const struct ring_prefix_conf *c,
    const uint32_t *tok, size_t ntok, struct ring_level *out);
static size_t ring_levels_text(const struct ring_prefix_conf *c,
    const char *text, size_t len, struct ring_level *out);
static size_t ring_levels_finish(struct ring_level *win, size_t nwin,
    size_t next, struct ring_level *out);

int
ring_ids_candidate(void *arg, uint64_t id, const char *url)
{
	const struct ring_ids *ri = arg;
	size_t i;

	(void)url;
	for (i = 0; i < ri->ri_n; i++)
		if (ri->ri_ids[i] == id)
			return (int)i;
	return -1;
}

static int
ring_cmp_in(const void *a, const void *b)
{
	const struct ring_sort_in *x = a, *y = b;
	int c;

	if ((c = strcmp(x->rs_node->rn_url, y->rs_node->rn_url)) != 0)
		return c;
	return (x->rs_order > y->rs_order) - (x->rs_order < y->rs_order);
}

static int
ring_cmp_entry(const void *a, const void *b)
{
	const struct ring_entry *x = a, *y = b;

	if (x->re_pos != y->re_pos)
		return x->re_pos < y->re_pos ? -1 : 1;
	/* Members are in URL order, so ties too are order-independent. */
	return (x->re_member > y->re_member) - (x->re_member < y->re_member);
}

struct ring *
ring_new(const struct ring_node *nodes, size_t n)
{
	struct ring *r;
	struct ring_sort_in *in;
	struct ring_entry *e;
	char *buf;
	size_t i, m, len, cap;
	uint32_t v;
	int w;

	r = xcalloc(1, sizeof(*r));
	if (n == 0)
		return r;
	in = xreallocarray(NULL, n, sizeof(*in));
	for (i = 0; i < n; i++) {
		in[i].rs_node = &nodes[i];
		in[i].rs_order = i;
	}
	qsort(in, n, sizeof(*in), ring_cmp_in);
	r->r_urls = xreallocarray(NULL, n, sizeof(*r->r_urls));
	r->r_ids = xreallocarray(NULL, n, sizeof(*r->r_ids));
	for (i = 0, m = 0; i < n; i++) {
		/* Sorted by (URL, order): the first of a run is kept. */
		if (m > 0 &&
		    strcmp(r->r_urls[m - 1], in[i].rs_node->rn_url) == 0)
			continue;
		r->r_urls[m] = xstrdup(in[i].rs_node->rn_url);
		r->r_ids[m] = in[i].rs_node->rn_id;
		m++;
	}
	free(in);
	r->r_nmembers = m;
	r->r_stamp = xcalloc(m, sizeof(*r->r_stamp));
	r->r_nentries = m * RING_VNODES;
	r->r_entries = xreallocarray(NULL, r->r_nentries, sizeof(*e));
	e = r->r_entries;
	for (i = 0; i < m; i++) {
		len = strlen(r->r_urls[i]);
		cap = len + 16;
		buf = xmalloc(cap);
		for (v = 0; v < RING_VNODES; v++) {
			w = snprintf(buf, cap, "%s#%" PRIu32, r->r_urls[i], v);
			if (w < 0 || (size_t)w >= cap)
				fatalx("%s: vnode name of %s", __func__,
				    r->r_urls[i]);
			e->re_pos = XXH3_64bits(buf, (size_t)w);
			e->re_member = (uint32_t)i;
			e++;
		}
		free(buf);
	}
	qsort(r->r_entries, r->r_nentries, sizeof(*e), ring_cmp_entry);
	return r;
}

void
ring_free(struct ring *r)
{
	size_t i;

	if (r == NULL)
		return;
	for (i = 0; i < r->r_nmembers; i++)
		free(r->r_urls[i]);
	free(r->r_urls);
	free(r->r_ids);
	free(r->r_stamp);
	free(r->r_entries);
	free(r);
}

size_t
ring_members(const struct ring *r)
{
	return r == NULL ? 0 : r->r_nmembers;
}

int
ring_lookup(struct ring *r, const void *key, size_t keylen,
    ring_candidate_cb cb, void *arg, uint64_t *id)
{
	uint64_t p;
	size_t lo, hi, mid, step, idx, visited;
	uint32_t m;
	int pos;

	if (r == NULL || r->r_nentries == 0)
		return -1;
	p = XXH3_64bits(key, keylen);
	lo = 0;
	hi = r->r_nentries;
	while (lo < hi) {
		mid = lo + (hi - lo) / 2;
		if (r->r_entries[mid].re_pos < p)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (++r->r_gen == 0) {
		memset(r->r_stamp, 0, r->r_nmembers * sizeof(*r->r_stamp));
		r->r_gen = 1;
	}
	visited = 0;
	for (step = 0; step < r->r_nentries; step++) {
		idx = (lo + step) % r->r_nentries;
		m = r->r_entries[idx].re_member;
		if (r->r_stamp[m] == r->r_gen)
			continue;
		r->r_stamp[m] = r->r_gen;
		if ((pos = cb(arg, r->r_ids[m], r->r_urls[m])) >= 0) {
			if (id != NULL)
				*id = r->r_ids[m];
			return pos;
		}
		if (++visited == r->r_nmembers)
			break;
	}
	return -1;
}

void
ring_key_hex(uint64_t h, char out[RING_HEX_SIZE])
{
	static const char digits[] = "0123456789abcdef";
	int i;

	for (i = 15; i >= 0; i--) {
		out[i] = digits[h & 0xf];
		h >>= 4;
	}
	out[16] = '\0';
}

/* ------------------------------------------------ consistent_hashing */

/* What an HTTP header value must be to be read as text: tab or 0x20-0x7e. */
static bool
ring_visible_ascii(const char *s)
{
	const unsigned char *p;

	for (p = (const unsigned char *)s; *p != '\0'; p++)
		if (*p != '\t' && (*p < 0x20 || *p > 0x7e))
			return false;
	return true;
}

/* Decimal unsigned integer, optional leading '+'; 0, or -1 if invalid. */
static int
ring_parse_index(const char *s, uint64_t *out)
{
	uint64_t v = 0;

	if (*s == '+')
		s++;
	if (*s == '\0')
		return -1;
	for (; *s != '\0'; s++) {
		if (*s < '0' || *s > '9')
			return -1;
		if (v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
			return -1;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	*out = v;
	return 0;
}

void
ring_ch_select(struct ring *r, const struct ring_ch_input *in, size_t n,
    ring_candidate_cb cb, void *arg, ring_rand_cb rnd, struct ring_ch_pick *out)
{
	const char *key = NULL, *first;
	uint64_t idx;

	out->rcp_index = -1;
	out->rcp_key = NULL;
	out->rcp_branch = RING_CH_NO_HEALTHY_WORKERS;
	if (n == 0)
		return;
	if (in->rci_target_worker != NULL && in->rci_target_worker[0] != '\0' &&
	    ring_visible_ascii(in->rci_target_worker)) {
		if (ring_parse_index(in->rci_target_worker, &idx) == 0 &&
		    idx < n) {
			out->rcp_index = (int)idx;
			out->rcp_branch = RING_CH_TARGET_WORKER_HIT;
		} else
			out->rcp_branch = RING_CH_TARGET_WORKER_MISS;
		return;
	}
	if (in->rci_rid_key != NULL && in->rci_rid_key[0] != '\0')
		key = in->rci_rid_key;
	else if (in->rci_routing_key != NULL && in->rci_routing_key[0] != '\0')
		key = in->rci_routing_key;
	else {
		/* Only the first present header counts, valid or not. */
		first = in->rci_authorization;
		if (first == NULL)
			first = in->rci_forwarded_for;
		if (first == NULL)
			first = in->rci_cookie;
		if (first != NULL && first[0] != '\0' &&
		    ring_visible_ascii(first))
			key = first;
	}
	if (key == NULL) {
		out->rcp_index = (int)rnd((uint32_t)n);
		out->rcp_branch = RING_CH_RANDOM_FALLBACK;
		return;
	}
	out->rcp_key = key;
	out->rcp_index = ring_lookup(r, key, strlen(key), cb, arg, NULL);
	out->rcp_branch = out->rcp_index >= 0 ? RING_CH_ROUTING_KEY_HIT
	                                      : RING_CH_NO_HEALTHY_WORKERS;
}

const char *
ring_ch_branch_name(enum ring_ch_branch b)
{
	switch (b) {
	case RING_CH_NO_HEALTHY_WORKERS:
		return "no_healthy_workers";
	case RING_CH_TARGET_WORKER_HIT:
		return "target_worker_hit";
	case RING_CH_TARGET_WORKER_MISS:
		return "target_worker_miss";
	case RING_CH_ROUTING_KEY_HIT:
		return "routing_key_hit";
	case RING_CH_RANDOM_FALLBACK:
		return "random_fallback";
	}
	return "unknown";
}

/* ------------------------------------------------------- prefix_hash */

void
ring_prefix_conf_default(struct ring_prefix_conf *c)
{
	c->rpc_boundaries = NULL;
	c->rpc_nboundaries = 0;
	c->rpc_prefix_token_count = 256;
	c->rpc_load_factor = 1.25;
	c->rpc_abs_threshold = 10;
}

/*
 * Moves from byte off over up to nchars chars; returns the new offset and
 * the chars actually passed in *advanced (fewer when the text ends).
 */
static size_t
ring_utf8_advance(const char *s, size_t len, size_t off, uint64_t nchars,
    uint64_t *advanced)
{
	uint64_t k;

	for (k = 0; k < nchars && off < len; k++) {
		off++;
		while (off < len && ((unsigned char)s[off] & 0xc0) == 0x80)
			off++;
	}
	*advanced = k;
	return off;
}

/* Keeps the last RING_PREFIX_MAX_LEVELS levels put, in a circular window. */
static void
ring_level_put(struct ring_level *win, size_t *nwin, size_t *next,
    const struct ring_level *l)
{
	win[*next] = *l;
	*next = (*next + 1) % RING_PREFIX_MAX_LEVELS;
	if (*nwin < RING_PREFIX_MAX_LEVELS)
		(*nwin)++;
}

/* Copies the window to out, deepest (last put) first. */
static size_t
ring_levels_finish(struct ring_level *win, size_t nwin, size_t next,
    struct ring_level *out)
{
	size_t i;

	for (i = 0; i < nwin; i++)
		out[i] = win[(next + RING_PREFIX_MAX_LEVELS - 1 - i) %
		    RING_PREFIX_MAX_LEVELS];
	return nwin;
}

/* Feeds tok[*done..b) to st as 4-byte little-endian ids. */
static void
ring_feed_tokens(XXH3_state_t *st, const uint32_t *tok, size_t *done, size_t b)
{
	unsigned char buf[4 * 64];
	size_t j, chunk;
	uint32_t t;

	while (*done < b) {
		chunk = b - *done;
		if (chunk > sizeof(buf) / 4)
			chunk = sizeof(buf) / 4;
		for (j = 0; j < chunk; j++) {
			t = tok[*done + j];
			buf[4 * j] = (unsigned char)t;
			buf[4 * j + 1] = (unsigned char)(t >> 8);
			buf[4 * j + 2] = (unsigned char)(t >> 16);
			buf[4 * j + 3] = (unsigned char)(t >> 24);
		}
		XXH3_64bits_update(st, buf, 4 * chunk);
		*done += chunk;
	}
}

static size_t
ring_levels_tokens(const struct ring_prefix_conf *c, const uint32_t *tok,
    size_t ntok, struct ring_level *out)
{
	struct ring_level win[RING_PREFIX_MAX_LEVELS], l;
	XXH3_state_t st;
	size_t i, done = 0, nwin = 0, next = 0;
	uint64_t prev = 0, b;

	XXH3_64bits_reset(&st);
	l.rl_kind = RING_LEVEL_TOKENS;
	l.rl_boundary = true;
	for (i = 0; i < c->rpc_nboundaries; i++) {
		b = c->rpc_boundaries[i];
		if (b == 0 || b <= prev)
			continue;
		if (b > ntok)
			break;
		prev = b;
		ring_feed_tokens(&st, tok, &done, (size_t)b);
		l.rl_hash = XXH3_64bits_digest(&st);
		l.rl_depth = b;
		ring_level_put(win, &nwin, &next, &l);
	}
	if (nwin == 0) {
		b = c->rpc_prefix_token_count == 0 ? 1
		                                   : c->rpc_prefix_token_count;
		if (b > ntok)
			b = ntok;
		ring_feed_tokens(&st, tok, &done, (size_t)b);
		l.rl_hash = XXH3_64bits_digest(&st);
		l.rl_depth = b;
		l.rl_boundary = false;
		ring_level_put(win, &nwin, &next, &l);
	}
	return ring_levels_finish(win, nwin, next, out);
}

static size_t
ring_levels_text(const struct ring_prefix_conf *c, const char *text, size_t len,
    struct ring_level *out)
{
	struct ring_level win[RING_PREFIX_MAX_LEVELS], l;
	XXH3_state_t st;
	size_t i, off = 0, nwin = 0, next = 0, noff;
	uint64_t chars = 0, want, adv, prev = 0, b;

	XXH3_64bits_reset(&st);
	l.rl_kind = RING_LEVEL_TEXT;
	l.rl_boundary = true;
	for (i = 0; i < c->rpc_nboundaries; i++) {
		b = c->rpc_boundaries[i];
		if (b == 0 || b <= prev)
			continue;
		prev = b;
		want = b > UINT64_MAX / 4 ? UINT64_MAX : 4 * b;
		noff = ring_utf8_advance(text, len, off, want - chars, &adv);
		if (chars + adv < want)
			break;
		XXH3_64bits_update(&st, text + off, noff - off);
		off = noff;
		chars = want;
		l.rl_hash = XXH3_64bits_digest(&st);
		l.rl_depth = chars;
		ring_level_put(win, &nwin, &next, &l);
	}
	if (nwin == 0) {
		b = c->rpc_prefix_token_count == 0 ? 1
		                                   : c->rpc_prefix_token_count;
		off = ring_utf8_advance(text, len, 0, 4 * b, &adv);
		l.rl_hash = XXH3_64bits(text, off);
		l.rl_depth = adv;
		l.rl_boundary = false;
		ring_level_put(win, &nwin, &next, &l);
	}
	return ring_levels_finish(win, nwin, next, out);
}

size_t
ring_prefix_levels(const struct ring_prefix_conf *c,
    const struct ring_prefix_input *in,
    struct ring_level out[RING_PREFIX_MAX_LEVELS])
{
	if (in->rpi_routing_key != NULL && in->rpi_routing_key_len > 0) {
		out[0].rl_hash =
		    XXH3_64bits(in->rpi_routing_key, in->rpi_routing_key_len);
		out[0].rl_kind = RING_LEVEL_ROUTING_KEY;
		out[0].rl_depth = in->rpi_routing_key_len;
		out[0].rl_boundary = false;
		return 1;
	}
	if (in->rpi_tokens != NULL && in->rpi_ntokens > 0)
		return ring_levels_tokens(c, in->rpi_tokens, in->rpi_ntokens,
		    out);
	if (in->rpi_text != NULL && in->rpi_text_len > 0)
		return ring_levels_text(c, in->rpi_text, in->rpi_text_len, out);
	return 0;
}

bool
ring_prefix_acceptable(const struct ring_prefix_conf *c, uint64_t load,
    uint64_t total, size_t n)
{
	double avg, rel, abs;

	if (total == 0)
		return true;
	if (n == 0)
		return false;
	avg = ((double)total + 1.0) / (double)n;
	rel = avg * c->rpc_load_factor;
	abs = avg + c->rpc_abs_threshold;
	return (double)load <= (rel > abs ? rel : abs);
}

/* Fewest in-flight, ties to the first; n >= 1. */
static size_t
ring_least_loaded(const uint64_t *loads, size_t n)
{
	size_t i, best = 0;

	for (i = 1; i < n; i++)
		if (loads[i] < loads[best])
			best = i;
	return best;
}

void
ring_prefix_select(struct ring *r, const struct ring_prefix_conf *c,
    const struct ring_level *levels, size_t nlevels, const uint64_t *loads,
    size_t n, ring_candidate_cb cb, void *arg, struct ring_prefix_pick *out)
{
	char hex[RING_HEX_SIZE];
	uint64_t total = 0;
	size_t i;
	int pos, deepest = -1, deepest_level = -1, best = -1;

	out->rpp_index = -1;
	out->rpp_level = -1;
	out->rpp_branch = RING_PREFIX_NO_HEALTHY_WORKERS;
	if (n == 0)
		return;
	if (nlevels == 0) {
		out->rpp_index = (int)ring_least_loaded(loads, n);
		out->rpp_branch = RING_PREFIX_NO_ROUTING_KEY;
		return;
	}
	for (i = 0; i < n; i++)
		total += loads[i];
	for (i = 0; i < nlevels; i++) {
		ring_key_hex(levels[i].rl_hash, hex);
		pos = ring_lookup(r, hex, RING_HEX_SIZE - 1, cb, arg, NULL);
		if (pos < 0 || (size_t)pos >= n)
			continue;
		if (ring_prefix_acceptable(c, loads[pos], total, n)) {
			out->rpp_index = pos;
			out->rpp_level = (int)i;
			out->rpp_branch = RING_PREFIX_RING_HIT;
			return;
		}
		if (deepest < 0) {
			deepest = pos;
			deepest_level = (int)i;
		}
	}
	if (deepest < 0) {
		out->rpp_index = (int)ring_least_loaded(loads, n);
		out->rpp_branch = RING_PREFIX_FALLBACK_LEAST_LOAD;
		return;
	}
	for (i = 0; i < n; i++) {
		if (!ring_prefix_acceptable(c, loads[i], total, n))
			continue;
		if (best < 0 || loads[i] < loads[best])
			best = (int)i;
	}
	out->rpp_index = best >= 0 ? best : deepest;
	out->rpp_level = deepest_level;
	out->rpp_branch = RING_PREFIX_LOAD_BALANCE_WALK;
}

const char *
ring_prefix_branch_name(enum ring_prefix_branch b)
{
	switch (b) {
	case RING_PREFIX_NO_HEALTHY_WORKERS:
		return "no_healthy_workers";
	case RING_PREFIX_NO_ROUTING_KEY:
		return "no_routing_key";
	case RING_PREFIX_RING_HIT:
		return "ring_hit";
	case RING_PREFIX_LOAD_BALANCE_WALK:
		return "load_balance_walk";
	case RING_PREFIX_FALLBACK_LEAST_LOAD:
		return "fallback_least_load";
	}
	return "unknown";
}
