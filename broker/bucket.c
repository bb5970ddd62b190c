/*
 * bucket.c: the `bucket` policy's per-model state (policies.md §10.3):
 * ranges of request sizes per prefill worker, the windowed request history
 * and the periodic range recomputation.
 */
#include <stdlib.h>
#include <string.h>

#include "shared/log.h"
#include "shared/xmalloc.h"

#include "bucket.h"

/* History entry of a request whose worker is no longer a member. */
#define BUCKET_NO_MEMBER UINT32_MAX
#define BUCKET_HIST_MIN  256

struct bucket_hist {
	uint64_t bh_size;
	uint64_t bh_ts;
	uint32_t bh_member;
};

struct bucket {
	struct bucket_conf bk_conf;
	char **bk_urls; /* members, registration order */
	uint64_t *bk_ids;
	uint64_t *bk_sum; /* window sum per member */
	int *bk_pos; /* selection scratch: candidate position */
	struct bucket_range *bk_ranges; /* one per member, ascending */
	size_t bk_n;
	struct bucket_hist *bk_hist; /* circular FIFO */
	size_t bk_hcap;
	size_t bk_hhead;
	size_t bk_hlen;
	uint64_t bk_total;
	uint64_t bk_last_per_worker;
};

static void bucket_initial_ranges(struct bucket *b);
static size_t bucket_find_range(const struct bucket *b, uint64_t size);
static void bucket_record(struct bucket *b, uint32_t member, uint64_t size,
    uint64_t now_ms);
static int bucket_cmp_u64(const void *a, const void *b);
static uint64_t bucket_add(uint64_t a, uint64_t b);

void
bucket_conf_default(struct bucket_conf *c)
{
	c->bc_abs_threshold = 32;
	c->bc_rel_threshold = 1.0001;
	c->bc_window_ms = 5000;
}

struct bucket *
bucket_new(const struct bucket_conf *c)
{
	struct bucket *b;

	b = xcalloc(1, sizeof(*b));
	b->bk_conf = *c;
	return b;
}

void
bucket_free(struct bucket *b)
{
	size_t i;

	if (b == NULL)
		return;
	for (i = 0; i < b->bk_n; i++)
		free(b->bk_urls[i]);
	free(b->bk_urls);
	free(b->bk_ids);
	free(b->bk_sum);
	free(b->bk_pos);
	free(b->bk_ranges);
	free(b->bk_hist);
	free(b);
}

/* Saturating addition: range bounds never wrap past infinity. */
static uint64_t
bucket_add(uint64_t a, uint64_t b)
{
	return a > BUCKET_INFINITY - b ? BUCKET_INFINITY : a + b;
}

static void
bucket_initial_ranges(struct bucket *b)
{
	uint64_t gap;
	size_t i;

	if (b->bk_n == 0)
		return;
	gap = BUCKET_INITIAL_SPAN / b->bk_n;
	if (gap == 0)
		gap = 1;
	for (i = 0; i < b->bk_n; i++) {
		b->bk_ranges[i].br_lo = i * gap;
		b->bk_ranges[i].br_hi =
		    i + 1 == b->bk_n ? BUCKET_INFINITY : (i + 1) * gap - 1;
		b->bk_ranges[i].br_id = b->bk_ids[i];
		b->bk_ranges[i].br_url = b->bk_urls[i];
	}
}

void
bucket_set_members(struct bucket *b, const struct bucket_member *m, size_t n)
{
	char **urls;
	uint64_t *ids, *sum;
	uint32_t *map;
	size_t i, j, k;

	urls = xreallocarray(NULL, n + 1, sizeof(*urls));
	ids = xreallocarray(NULL, n + 1, sizeof(*ids));
	sum = xcalloc(n + 1, sizeof(*sum));
	map = xreallocarray(NULL, b->bk_n + 1, sizeof(*map));
	for (j = 0; j < b->bk_n; j++)
		map[j] = BUCKET_NO_MEMBER;
	for (i = 0; i < n; i++) {
		urls[i] = xstrdup(m[i].bm_url);
		ids[i] = m[i].bm_id;
		for (j = 0; j < b->bk_n; j++) {
			if (map[j] == BUCKET_NO_MEMBER &&
			    strcmp(b->bk_urls[j], urls[i]) == 0) {
				map[j] = (uint32_t)i;
				sum[i] = b->bk_sum[j];
				break;
			}
		}
	}
	for (k = 0; k < b->bk_hlen; k++) {
		struct bucket_hist *h =
		    &b->bk_hist[(b->bk_hhead + k) % b->bk_hcap];

		if (h->bh_member != BUCKET_NO_MEMBER)
			h->bh_member = map[h->bh_member];
	}
	free(map);
	for (j = 0; j < b->bk_n; j++)
		free(b->bk_urls[j]);
	free(b->bk_urls);
	free(b->bk_ids);
	free(b->bk_sum);
	free(b->bk_pos);
	free(b->bk_ranges);
	b->bk_urls = urls;
	b->bk_ids = ids;
	b->bk_sum = sum;
	b->bk_n = n;
	b->bk_pos = xcalloc(n + 1, sizeof(*b->bk_pos));
	b->bk_ranges = xcalloc(n + 1, sizeof(*b->bk_ranges));
	bucket_initial_ranges(b);
	/* The split ranges follow no history: the next tick rebuilds. */
	b->bk_last_per_worker = 0;
}

uint64_t
bucket_request_size(bool has_tokens, size_t ntokens, const char *text,
    size_t len)
{
	uint64_t chars = 0;
	size_t i;

	if (has_tokens)
		return ntokens;
	if (text == NULL)
		return 0;
	for (i = 0; i < len; i++)
		if (((unsigned char)text[i] & 0xc0) != 0x80)
			chars++;
	return chars;
}

/* The range holding size, by binary search; ranges are contiguous. */
static size_t
bucket_find_range(const struct bucket *b, uint64_t size)
{
	size_t lo = 0, hi = b->bk_n, mid;

	/* Last range whose lower bound is <= size. */
	while (hi - lo > 1) {
		mid = lo + (hi - lo) / 2;
		if (b->bk_ranges[mid].br_lo <= size)
			lo = mid;
		else
			hi = mid;
	}
	if (size < b->bk_ranges[lo].br_lo || size > b->bk_ranges[lo].br_hi)
		return b->bk_n;
	return lo;
}

static void
bucket_record(struct bucket *b, uint32_t member, uint64_t size, uint64_t now_ms)
{
	struct bucket_hist *h, *nh;
	size_t ncap, k;

	if (member != BUCKET_NO_MEMBER)
		b->bk_sum[member] += size;
	while (b->bk_hlen > 0) {
		h = &b->bk_hist[b->bk_hhead];
		if (!(now_ms > h->bh_ts &&
		        now_ms - h->bh_ts > b->bk_conf.bc_window_ms))
			break;
		if (h->bh_member != BUCKET_NO_MEMBER)
			b->bk_sum[h->bh_member] -= h->bh_size;
		b->bk_total -= h->bh_size;
		b->bk_hhead = (b->bk_hhead + 1) % b->bk_hcap;
		b->bk_hlen--;
	}
	if (b->bk_hlen == b->bk_hcap) {
		ncap = b->bk_hcap == 0 ? BUCKET_HIST_MIN : 2 * b->bk_hcap;
		if ((nh = calloc(ncap, sizeof(*nh))) == NULL) {
			/* Keep sums equal to the history: drop the record. */
			log_warnx("%s: history of %zu requests: out of memory",
			    __func__, b->bk_hlen);
			if (member != BUCKET_NO_MEMBER)
				b->bk_sum[member] -= size;
			return;
		}
		for (k = 0; k < b->bk_hlen; k++)
			nh[k] = b->bk_hist[(b->bk_hhead + k) % b->bk_hcap];
		free(b->bk_hist);
		b->bk_hist = nh;
		b->bk_hcap = ncap;
		b->bk_hhead = 0;
	}
	h = &b->bk_hist[(b->bk_hhead + b->bk_hlen) % b->bk_hcap];
	h->bh_size = size;
	h->bh_ts = now_ms;
	h->bh_member = member;
	b->bk_hlen++;
	b->bk_total += size;
}

int
bucket_select(struct bucket *b, uint64_t size, size_t ncand,
    bucket_candidate_cb cb, void *arg, bucket_rand_cb rnd, uint64_t now_ms,
    struct bucket_pick *out)
{
	uint64_t max = 0, min = 0;
	size_t i, avail = 0, smallest = 0, r;
	uint32_t member = BUCKET_NO_MEMBER;

	out->bp_index = -1;
	out->bp_reason = BUCKET_NONE;
	if (ncand == 0)
		return -1;
	if (b == NULL || b->bk_n == 0) {
		out->bp_index = (int)rnd((uint32_t)ncand);
		out->bp_reason = BUCKET_RANDOM;
		return out->bp_index;
	}
	for (i = 0; i < b->bk_n; i++) {
		b->bk_pos[i] = cb(arg, b->bk_ids[i], b->bk_urls[i]);
		if (b->bk_pos[i] < 0 || (size_t)b->bk_pos[i] >= ncand) {
			b->bk_pos[i] = -1;
			continue;
		}
		if (avail++ == 0 || b->bk_sum[i] < min) {
			min = b->bk_sum[i];
			smallest = i;
		}
		if (b->bk_sum[i] > max)
			max = b->bk_sum[i];
	}
	if (avail > 0 && max - min > b->bk_conf.bc_abs_threshold &&
	    (double)max > b->bk_conf.bc_rel_threshold * (double)min) {
		member = (uint32_t)smallest;
		out->bp_index = b->bk_pos[smallest];
		out->bp_reason = BUCKET_IMBALANCE;
	} else if ((r = bucket_find_range(b, size)) < b->bk_n &&
	    b->bk_pos[r] >= 0) {
		member = (uint32_t)r;
		out->bp_index = b->bk_pos[r];
		out->bp_reason = BUCKET_RANGE;
	} else {
		out->bp_index = (int)rnd((uint32_t)ncand);
		out->bp_reason = BUCKET_RANDOM;
		for (i = 0; i < b->bk_n; i++)
			if (b->bk_pos[i] == out->bp_index)
				member = (uint32_t)i;
	}
	bucket_record(b, member, size, now_ms);
	return out->bp_index;
}

static int
bucket_cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

void
bucket_tick(struct bucket *b)
{
	uint64_t *sizes, nw, old, upper = 0, sum, s;
	size_t i, k, idx = 0, len = b->bk_hlen;
	bool last, reached;

	if (len == 0 || b->bk_n == 0)
		return;
	nw = b->bk_total / b->bk_n;
	old = b->bk_last_per_worker;
	if (old != 0 && nw <= 2 * old && old <= 2 * nw)
		return;
	if ((sizes = calloc(len, sizeof(*sizes))) == NULL) {
		log_warnx("%s: %zu sizes: out of memory", __func__, len);
		return;
	}
	b->bk_last_per_worker = nw;
	for (k = 0; k < len; k++)
		sizes[k] = b->bk_hist[(b->bk_hhead + k) % b->bk_hcap].bh_size;
	qsort(sizes, len, sizeof(*sizes), bucket_cmp_u64);
	for (i = 0; i < b->bk_n; i++) {
		last = i + 1 == b->bk_n;
		b->bk_ranges[i].br_id = b->bk_ids[i];
		b->bk_ranges[i].br_url = b->bk_urls[i];
		b->bk_ranges[i].br_lo = upper;
		if (last) {
			/* Whatever remains, the last worker ends at infinity.
			 */
			b->bk_ranges[i].br_hi = BUCKET_INFINITY;
			break;
		}
		sum = 0;
		s = 0;
		reached = false;
		while (idx < len) {
			s = sizes[idx++];
			sum = bucket_add(sum, s);
			if (sum >= nw) {
				reached = true;
				break;
			}
		}
		if (reached && s > upper) {
			b->bk_ranges[i].br_hi = s;
			upper = bucket_add(s, 1);
		} else {
			b->bk_ranges[i].br_hi = bucket_add(upper, nw);
			upper = bucket_add(b->bk_ranges[i].br_hi, 1);
		}
	}
	free(sizes);
}

size_t
bucket_ranges(const struct bucket *b, struct bucket_range *out, size_t max)
{
	size_t i;

	for (i = 0; i < b->bk_n && i < max; i++)
		out[i] = b->bk_ranges[i];
	return b->bk_n;
}

uint64_t
bucket_window_sum(const struct bucket *b, const char *url)
{
	size_t i;

	for (i = 0; i < b->bk_n; i++)
		if (strcmp(b->bk_urls[i], url) == 0)
			return b->bk_sum[i];
	return 0;
}

uint64_t
bucket_total(const struct bucket *b)
{
	return b->bk_total;
}

const char *
bucket_reason_name(enum bucket_reason r)
{
	switch (r) {
	case BUCKET_NONE:
		return "none";
	case BUCKET_RANGE:
		return "range";
	case BUCKET_IMBALANCE:
		return "imbalance";
	case BUCKET_RANDOM:
		return "random";
	}
	return "unknown";
}
