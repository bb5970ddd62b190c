/*
 * pd.c: the PD and EPD request path (gateway.md §11): a prefill and a
 * decode worker (and an encode worker in EPD mode) are chosen by the leg
 * policies in one decision batch, the body gets the bootstrap fields, all
 * legs are sent concurrently, and the client gets the decode response once
 * every other leg has answered 2xx. A leg that fails aborts the others;
 * retries wrap the whole selection and dispatch. Also the PD form of GET
 * /health_generate (gateway.md §3.2).
 *
 * DP ranks: a worker URL ending in "@<rank>" names one data-parallel rank
 * of the engine at the URL before it. The request goes to that base URL;
 * the prefill body gets "routed_dp_rank" (the prefill's rank) and the
 * decode body "routed_dp_rank" (its own) and "disagg_prefill_dp_rank" (the
 * prefill's), each only when that rank is known.
 *
 * return_logprob (true, or a batch list holding a true): the prefill
 * worker's body is kept and its meta_info.input_token_logprobs is put in
 * front of the decode worker's, as SGLang's routers do. Non-streaming: the
 * decode body is read whole, merged (a batch element by element) and sent
 * with its new length. Streaming: the decode head waits for the whole
 * prefill body (a JSON object, or SSE whose first event carrying the list
 * is used); then every decode event whose meta_info holds an
 * input_token_logprobs list gets the prefill's list in front, since SGLang
 * repeats the full list in each event. Nothing to merge (no list on either
 * side, a body that is not JSON, a streamed batch, a body over
 * PD_MERGE_MAX) leaves the decode response as the worker sent it.
 */
#include <sys/random.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "frontend/frontend.h"
#include "shared/log.h"
#include "shared/url.h"

#define PD_PATH_MAX  2048
#define PD_MSG_MAX   1024
#define PD_MERGE_MAX (16 * 1024 * 1024) /* bodies kept to merge logprobs */

enum pd_leg_index {
	PD_PREFILL = 0,
	PD_DECODE,
	PD_ENCODE,
	PD_NLEGS,
};

struct pd_req;

/* A leg's own state; its decision and attempt are in the exchange's
 * leg of the same index (lg_x). */
struct pd_leg {
	struct pd_req *lg_rq;
	enum pd_leg_index lg_index;
	struct exchange_leg *lg_x;
	int lg_status; /* 0 until the head came */
	bool lg_done;
	enum upstream_error lg_err;
	char *lg_buf; /* error body, decode bytes held back, prefill body */
	size_t lg_len;
	size_t lg_cap;
	bool lg_overflow;
	char *lg_body; /* this leg's own request body (DP ranks), or NULL */
	size_t lg_body_len;
};

struct pd_req {
	struct conn *pr_conn;
	const struct http_request *pr_hr;
	struct exchange *pr_ex;
	struct extract_inputs pr_in;
	char pr_id[EXTRACT_REQUEST_ID_MAX + 1];
	unsigned pr_nlegs;
	struct pd_leg pr_legs[PD_NLEGS];
	char *pr_body;
	size_t pr_body_len;
	char pr_path[PD_PATH_MAX];
	bool pr_chunked;
	bool pr_paused;
	bool pr_ttft_done;
	bool pr_merge; /* return_logprob: merge the prefill's logprobs */
	bool pr_merge_wanted; /* as asked, before an attempt gave it up */
	cJSON *pr_plp; /* the prefill body holding them, once parsed */
	char *pr_sse; /* streaming merge: a decode event not yet complete */
	size_t pr_sse_len;
	size_t pr_sse_cap;
	/* the decode head, held until every other leg answered 2xx */
	struct upstream_header *pr_dh;
	size_t pr_ndh;
};

struct pd_health;

/* One side of the pair: what its callbacks get. */
struct ph_probe {
	struct pd_health *pp_ph;
	unsigned pp_i; /* 0 prefill, 1 decode */
};

/* GET /health_generate in PD mode: one pair, probed in parallel. */
struct pd_health {
	struct ph_probe ph_probe[2];
	struct conn *ph_conn;
	const struct http_request *ph_hr;
	char ph_id[EXTRACT_REQUEST_ID_MAX + 1];
	struct extract_inputs ph_in;
	struct decide_item ph_di[2];
	struct decision ph_d[2];
	struct upstream_req *ph_up[2];
	int ph_status[2]; /* -1 failed, else HTTP status; 0 pending */
	unsigned ph_pending;
	ev_timer ph_timer;
};

static void pd_drained(void *);
static void pd_dispatch(void *);
static void pd_failed(void *, int, const char *, const char *, int);
static void pd_reset(void *);
static int pd_build_body(struct pd_req *);
static int pd_rank_bodies(struct pd_req *);
static void pd_on_head(void *, int, const struct upstream_header *, size_t);
static void pd_on_body(void *, const char *, size_t);
static void pd_on_done(void *, enum upstream_error);
static void pd_progress(struct pd_req *);
static void pd_release(struct pd_req *);
static void pd_relay(struct pd_req *, const char *, size_t);
static void pd_emit(struct pd_req *, const char *, size_t);
static int pd_merge_whole(struct pd_req *);
static void pd_sse_feed(struct pd_req *, const char *, size_t);
static bool pd_wants_logprob(const cJSON *);
static int pd_append(char **, size_t *, size_t *, const char *, size_t);
static const char *pd_send_url(const char *, char *, size_t);
static void pd_finish(struct pd_req *, bool);
static void pd_leg_error(struct pd_req *, struct pd_leg *);
static void pd_free(void *);
static void ph_free(void *);
static void pd_decode_error(struct pd_req *, struct pd_leg *);
static int pd_keep(struct pd_leg *, const char *, size_t, size_t);
static const char *pd_runtime(void);
static void pd_worker_message(const char *, size_t, char *, size_t);
static void ph_decided(void *, const struct decision *);
static void ph_head(void *, int, const struct upstream_header *, size_t);
static void ph_body(void *, const char *, size_t);
static void ph_done(void *, enum upstream_error);
static void ph_timeout_cb(struct ev_loop *, ev_timer *, int);
static void ph_finish(struct pd_health *);

static const char *const pd_leg_names[PD_NLEGS] = { "prefill", "decode",
	"encode" };
static const unsigned pd_leg_proto[PD_NLEGS] = { SMG__LEG__LEG_PREFILL,
	SMG__LEG__LEG_DECODE, SMG__LEG__LEG_ENCODE };

static const struct conn_handler pd_handler = {
	.ch_drained = pd_drained,
};

static const struct exchange_ops pd_ops = {
	.xo_routed = pd_dispatch,
	.xo_failed = pd_failed,
	.xo_reset = pd_reset,
};

static const struct upstream_cbs pd_cbs = {
	.on_head = pd_on_head,
	.on_body = pd_on_body,
	.on_done = pd_on_done,
};

static const struct conn_handler ph_handler = {
	.ch_drained = NULL,
};

static const struct upstream_cbs ph_cbs = {
	.on_head = ph_head,
	.on_body = ph_body,
	.on_done = ph_done,
};

bool
pd_enabled(void)
{
	return fe->fe_cf->cf_pd_disaggregation ||
	    fe->fe_cf->cf_epd_disaggregation;
}

/* ------------------------------------------------- body rewriting */

int
pd_bootstrap_host(const char *url, char *out, size_t len)
{
	struct url u;
	size_t n;

	if (url_parse(url, &u) == -1 || (n = strlen(u.u_host)) == 0 || n >= len)
		return -1;
	memcpy(out, u.u_host, n + 1);
	return 0;
}

uint64_t
pd_room(void)
{
	static uint64_t state;
	uint64_t x;

	/* splitmix64 over a getrandom seed; rooms need not be secret. */
	if (state == 0 &&
	    getrandom(&state, sizeof(state), 0) != (ssize_t)sizeof(state))
		state = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	x = (state += 0x9e3779b97f4a7c15ULL);
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x & INT64_MAX;
}

/* Replaces (or adds) member name of obj by item; item is taken. */
static int
pd_set(cJSON *obj, const char *name, cJSON *item)
{
	if (item == NULL)
		return -1;
	cJSON_DeleteItemFromObjectCaseSensitive(obj, name);
	if (!cJSON_AddItemToObject(obj, name, item)) {
		cJSON_Delete(item);
		return -1;
	}
	return 0;
}

/* A bootstrap value: JSON string, integer, null; or an array of n. */
static cJSON *
pd_value(const char *host, long port, const uint64_t *room, unsigned n,
    bool batch, unsigned k)
{
	char num[24];
	cJSON *a, *v;
	unsigned i;

	if (batch) {
		if ((a = cJSON_CreateArray()) == NULL)
			return NULL;
		for (i = 0; i < n; i++) {
			if ((v = pd_value(host, port,
			         room != NULL ? &room[i] : NULL, 1, false,
			         k)) == NULL ||
			    !cJSON_AddItemToArray(a, v)) {
				cJSON_Delete(v);
				cJSON_Delete(a);
				return NULL;
			}
		}
		return a;
	}
	switch (k) {
	case 0:
		return cJSON_CreateString(host);
	case 1:
		if (port < 0)
			return cJSON_CreateNull();
		snprintf(num, sizeof(num), "%ld", port);
		return cJSON_CreateRaw(num);
	default:
		/* Raw: a double would lose the low bits of a 63-bit room. */
		snprintf(num, sizeof(num), "%llu", (unsigned long long)*room);
		return cJSON_CreateRaw(num);
	}
}

int
pd_inject(cJSON *body, const char *host, long port, const uint64_t *rooms,
    unsigned n, bool batch, const char *prefix)
{
	char name[64];
	const char *fields[3] = { "bootstrap_host", "bootstrap_port",
		"bootstrap_room" };
	unsigned k;

	if (!cJSON_IsObject(body) || n == 0)
		return -1;
	for (k = 0; k < 3; k++) {
		if (k == 2 && rooms == NULL)
			break;
		snprintf(name, sizeof(name), "%s%s", prefix, fields[k]);
		if (pd_set(body, name,
		        pd_value(host, port, rooms, n, batch, k)) == -1)
			return -1;
	}
	return 0;
}

int
pd_rank_field(cJSON *body, const char *name, int rank)
{
	if (!cJSON_IsObject(body) || rank < 0)
		return -1;
	return pd_set(body, name, cJSON_CreateNumber(rank));
}

/* The URL a leg is sent to: the worker URL without its DP suffix. */
static const char *
pd_send_url(const char *url, char *buf, size_t len)
{
	return url_rank_base(url, buf, len) == 0 ? buf : url;
}

/* meta_info.input_token_logprobs of j when it is a list, else NULL. */
static cJSON *
pd_logprob_list(const cJSON *j)
{
	cJSON *m, *l;

	if (!cJSON_IsObject(j) ||
	    !cJSON_IsObject(
	        m = cJSON_GetObjectItemCaseSensitive(j, "meta_info")) ||
	    !cJSON_IsArray(l = cJSON_GetObjectItemCaseSensitive(m,
	                       "input_token_logprobs")))
		return NULL;
	return l;
}

/* Puts the entries of the prefill list pl in front of d's list. */
static int
pd_merge_one(cJSON *d, const cJSON *p)
{
	cJSON *dl, *pl, *n, *it;

	if ((dl = pd_logprob_list(d)) == NULL ||
	    (pl = pd_logprob_list(p)) == NULL)
		return 0;
	if ((n = cJSON_Duplicate(pl, true)) == NULL)
		return -1;
	/* Moving the decode entries keeps this linear in their count. */
	while ((it = dl->child) != NULL) {
		cJSON_DetachItemViaPointer(dl, it);
		if (!cJSON_AddItemToArray(n, it)) {
			cJSON_Delete(it);
			cJSON_Delete(n);
			return -1;
		}
	}
	if (!cJSON_ReplaceItemInObjectCaseSensitive(
	        cJSON_GetObjectItemCaseSensitive(d, "meta_info"),
	        "input_token_logprobs", n)) {
		cJSON_Delete(n);
		return -1;
	}
	return 1;
}

int
pd_merge_logprobs(cJSON *decode, const cJSON *prefill)
{
	const cJSON *p;
	cJSON *d;
	int rv, merged = 0;

	if (cJSON_IsObject(decode) && cJSON_IsObject(prefill))
		return pd_merge_one(decode, prefill);
	if (!cJSON_IsArray(decode) || !cJSON_IsArray(prefill) ||
	    cJSON_GetArraySize(decode) != cJSON_GetArraySize(prefill))
		return 0;
	for (d = decode->child, p = prefill->child; d != NULL && p != NULL;
	     d = d->next, p = p->next) {
		if ((rv = pd_merge_one(d, p)) == -1)
			return -1;
		merged |= rv;
	}
	return merged;
}

size_t
pd_sse_event_len(const char *p, size_t len)
{
	size_t i;

	for (i = 0; i + 1 < len; i++) {
		if (p[i] != '\n')
			continue;
		if (p[i + 1] == '\n')
			return i + 2;
		if (p[i + 1] == '\r' && i + 2 < len && p[i + 2] == '\n')
			return i + 3;
	}
	return 0;
}

/*
 * The JSON of an event that is a single "data:" line, parsed; NULL when
 * the event is anything else (comments, several lines, [DONE]).
 */
static cJSON *
pd_sse_json(const char *ev, size_t len)
{
	const char *p, *nl;
	size_t n;

	if (len < 5 || memcmp(ev, "data:", 5) != 0)
		return NULL;
	p = ev + 5;
	if (p < ev + len && *p == ' ')
		p++;
	if ((nl = memchr(p, '\n', (size_t)(ev + len - p))) == NULL)
		nl = ev + len;
	for (n = (size_t)(nl - ev); n < len; n++)
		if (ev[n] != '\r' && ev[n] != '\n')
			return NULL;
	n = (size_t)(nl - p);
	if (n > 0 && p[n - 1] == '\r')
		n--;
	return cJSON_ParseWithLength(p, n);
}

cJSON *
pd_prefill_logprobs(const char *body, size_t len)
{
	size_t i = 0, n;
	cJSON *j;

	while (i < len && strchr(" \t\r\n", body[i]) != NULL)
		i++;
	if (i == len)
		return NULL;
	if (body[i] == '{' || body[i] == '[') {
		j = cJSON_ParseWithLength(body + i, len - i);
		if (cJSON_IsObject(j) || cJSON_IsArray(j))
			return j;
		cJSON_Delete(j);
		return NULL;
	}
	/* SSE: the first event that carries the list. */
	while (i < len) {
		if ((n = pd_sse_event_len(body + i, len - i)) == 0)
			n = len - i;
		j = pd_sse_json(body + i, n);
		if (pd_logprob_list(j) != NULL)
			return j;
		cJSON_Delete(j);
		i += n;
	}
	return NULL;
}

char *
pd_merge_event(const char *ev, size_t len, const cJSON *prefill, size_t *outlen)
{
	cJSON *j;
	char *s, *out = NULL;
	size_t n;

	if ((j = pd_sse_json(ev, len)) == NULL)
		return NULL;
	if (pd_merge_logprobs(j, prefill) == 1 &&
	    (s = cJSON_PrintUnformatted(j)) != NULL) {
		n = strlen(s);
		if ((out = malloc(n + 9)) != NULL) {
			memcpy(out, "data: ", 6);
			memcpy(out + 6, s, n);
			memcpy(out + 6 + n, "\n\n", 3);
			*outlen = n + 8;
		}
		cJSON_free(s);
	}
	cJSON_Delete(j);
	return out;
}

/* Whether the body asks for logprobs (a batch: any of its entries). */
static bool
pd_wants_logprob(const cJSON *body)
{
	const cJSON *v, *it;

	v = cJSON_GetObjectItemCaseSensitive(body, "return_logprob");
	if (cJSON_IsTrue(v))
		return true;
	if (cJSON_IsArray(v)) {
		cJSON_ArrayForEach(it, v)
		{
			if (cJSON_IsTrue(it))
				return true;
		}
	}
	return false;
}

/* Appends to a growing buffer (always NUL-terminated); -1 on ENOMEM. */
static int
pd_append(char **buf, size_t *len, size_t *cap, const char *data, size_t n)
{
	size_t ncap;
	char *nb;

	if (*len + n + 1 > *cap) {
		ncap = *cap < 4096 ? 4096 : *cap;
		while (ncap < *len + n + 1)
			ncap *= 2;
		if ((nb = realloc(*buf, ncap)) == NULL)
			return -1;
		*buf = nb;
		*cap = ncap;
	}
	memcpy(*buf + *len, data, n);
	*len += n;
	(*buf)[*len] = '\0';
	return 0;
}

/* The bootstrap port a worker registered with, -1 none. */
static long
pd_bootstrap_port(const struct decision *d)
{
	struct shm_worker w;

	if (shm_worker_read(fe->fe_shm, d->dc_slot, &w) == -1 ||
	    w.sw_generation != d->dc_generation)
		return -1;
	return w.sw_bootstrap_port;
}

/* The attempt's body: canonical model, bootstrap fields, new rooms. */
static int
pd_build_body(struct pd_req *rq)
{
	struct extract_inputs *in = &rq->pr_in;
	const struct decision *pd = &rq->pr_legs[PD_PREFILL].lg_x->xl_d;
	unsigned n = in->ei_batch_n > 0 ? in->ei_batch_n : 1, i;
	bool batch = in->ei_is_batch;
	char host[SHM_URL_MAX];
	uint64_t *rooms;
	const char *canon;
	char *s;
	int rv = -1;

	if ((rooms = calloc(n, sizeof(*rooms))) == NULL)
		return -1;
	for (i = 0; i < n; i++)
		rooms[i] = pd_room();
	if (in->ei_model != NULL) {
		/* pd_start made ei_model canonical (--model-alias); the body
		 * still names what the client sent. A WorkerSpec alias the
		 * broker resolved wins. */
		const cJSON *m =
		    cJSON_GetObjectItemCaseSensitive(in->ei_json, "model");

		canon = pd->dc_resolved[0] != '\0'
		    ? pd->dc_resolved
		    : fallback_canonical(fe->fe_cf, in->ei_model);
		if ((!cJSON_IsString(m) ||
		        strcmp(canon, m->valuestring) != 0) &&
		    pd_set(in->ei_json, "model", cJSON_CreateString(canon)) ==
		        -1)
			goto out;
	}
	if (pd_bootstrap_host(pd->dc_url, host, sizeof(host)) == -1)
		snprintf(host, sizeof(host), "%s", "localhost");
	if (pd_inject(in->ei_json, host, pd_bootstrap_port(pd), rooms, n, batch,
	        "") == -1)
		goto out;
	if (rq->pr_nlegs > PD_ENCODE) {
		const struct decision *ed = &rq->pr_legs[PD_ENCODE].lg_x->xl_d;

		if (pd_bootstrap_host(ed->dc_url, host, sizeof(host)) == -1)
			snprintf(host, sizeof(host), "%s", "localhost");
		if (pd_inject(in->ei_json, host, pd_bootstrap_port(ed), NULL, n,
		        batch, "encode_") == -1)
			goto out;
	}
	if ((s = cJSON_PrintUnformatted(in->ei_json)) == NULL)
		goto out;
	free(rq->pr_body);
	rq->pr_body = s;
	rq->pr_body_len = strlen(s);
	rv = pd_rank_bodies(rq);
out:
	free(rooms);
	return rv;
}

/*
 * The prefill and decode bodies with the DP rank fields, when a leg's URL
 * names a rank (gateway.md §11.2); other legs send rq->pr_body. The fields
 * leave the parsed body afterwards, so a retry on workers without ranks
 * sends none.
 */
static int
pd_rank_bodies(struct pd_req *rq)
{
	cJSON *j = rq->pr_in.ei_json;
	struct pd_leg *lg;
	int pr, dr, rv = -1;
	unsigned i;

	for (i = 0; i < PD_NLEGS; i++) {
		lg = &rq->pr_legs[i];
		free(lg->lg_body);
		lg->lg_body = NULL;
		lg->lg_body_len = 0;
	}
	pr = url_rank(rq->pr_legs[PD_PREFILL].lg_x->xl_d.dc_url);
	dr = url_rank(rq->pr_legs[PD_DECODE].lg_x->xl_d.dc_url);
	if (pr < 0 && dr < 0)
		return 0;
	if (pr >= 0) {
		lg = &rq->pr_legs[PD_PREFILL];
		if (pd_rank_field(j, "routed_dp_rank", pr) == -1 ||
		    (lg->lg_body = cJSON_PrintUnformatted(j)) == NULL)
			goto out;
		lg->lg_body_len = strlen(lg->lg_body);
		if (pd_rank_field(j, "disagg_prefill_dp_rank", pr) == -1)
			goto out;
	}
	cJSON_DeleteItemFromObjectCaseSensitive(j, "routed_dp_rank");
	if (dr >= 0 && pd_rank_field(j, "routed_dp_rank", dr) == -1)
		goto out;
	lg = &rq->pr_legs[PD_DECODE];
	if ((lg->lg_body = cJSON_PrintUnformatted(j)) == NULL)
		goto out;
	lg->lg_body_len = strlen(lg->lg_body);
	rv = 0;
out:
	cJSON_DeleteItemFromObjectCaseSensitive(j, "routed_dp_rank");
	cJSON_DeleteItemFromObjectCaseSensitive(j, "disagg_prefill_dp_rank");
	return rv;
}

/* ------------------------------------------------- request life */

void
pd_start(struct conn *c, const struct http_request *hr,
    enum extract_endpoint ep, const char *request_id)
{
	const struct config *cf = fe->fe_cf;
	struct pd_req *rq;
	const char *code;
	char msg[FE_MSG_MAX];
	int status;
	unsigned i, nlegs = cf->cf_epd_disaggregation ? 3 : 2;

	if ((rq = conn_alloc(c, sizeof(*rq))) == NULL ||
	    conn_on_end(c, pd_free, rq) == -1 ||
	    (rq->pr_ex = exchange_new(c, &rq->pr_in, ep, "pd", nlegs,
	         pd_leg_proto, pd_leg_names, &pd_ops, rq)) == NULL) {
		conn_error(c, 503, "out_of_memory", "Out of memory", request_id,
		    0);
		return;
	}
	rq->pr_conn = c;
	rq->pr_hr = hr;
	rq->pr_ex->ex_rx = reqctx_get(c, hr);
	rq->pr_nlegs = nlegs;
	snprintf(rq->pr_id, sizeof(rq->pr_id), "%s", request_id);
	for (i = 0; i < PD_NLEGS; i++) {
		rq->pr_legs[i].lg_rq = rq;
		rq->pr_legs[i].lg_index = (enum pd_leg_index)i;
		rq->pr_legs[i].lg_x = &rq->pr_ex->ex_legs[i];
	}
	conn_set_handler(c, &pd_handler, rq);
	/* The router bounds the target below PD_PATH_MAX. */
	snprintf(rq->pr_path, sizeof(rq->pr_path), "%s%s%s", hr->hr_path,
	    hr->hr_has_query ? "?" : "", hr->hr_query);
	if (extract_inputs(ep, hr->hr_body, hr->hr_body_len, hr,
	        (const char *const *)cf->cf_routing_key_headers,
	        cf->cf_routing_key_headers_n, cf->cf_routing_key_override,
	        &rq->pr_in, &status, &code, msg, sizeof(msg)) == -1) {
		exchange_fail(rq->pr_ex, status, code, msg, 0);
		return;
	}
	if (cf->cf_enable_igw && ep == EXTRACT_EP_GENERATE &&
	    extract_model_missing(rq->pr_in.ei_model)) {
		exchange_fail(rq->pr_ex, 400, "missing_model",
		    EXTRACT_MISSING_MODEL_MSG, 0);
		return;
	}
	rq->pr_ex->ex_streaming = rq->pr_in.ei_stream;
	rq->pr_ex->ex_prompt_tokens = rq->pr_in.ei_has_tokens
	    ? rq->pr_in.ei_ntokens
	    : (rq->pr_in.ei_size + 3) / 4;
	/* A streamed batch interleaves its sequences: not merged. */
	rq->pr_merge = pd_wants_logprob(rq->pr_in.ei_json) &&
	    !(rq->pr_in.ei_stream && rq->pr_in.ei_is_batch);
	rq->pr_merge_wanted = rq->pr_merge;
	if (rq->pr_in.ei_model != NULL) {
		/* Route by the canonical id of an alias. */
		const char *canon = fallback_canonical(cf, rq->pr_in.ei_model);
		char *m;

		if (strcmp(canon, rq->pr_in.ei_model) != 0) {
			if ((m = strdup(canon)) == NULL) {
				exchange_fail(rq->pr_ex, 503, "out_of_memory",
				    "Out of memory", 0);
				return;
			}
			free(rq->pr_in.ei_model);
			rq->pr_in.ei_model = m;
		}
	}
	if (exchange_admit(rq->pr_ex) == -1)
		return;
	exchange_route(rq->pr_ex);
}

/* What a failed attempt left behind, before the next one. */
static void
pd_reset(void *arg)
{
	struct pd_req *rq = arg;
	unsigned i;

	for (i = 0; i < PD_NLEGS; i++) {
		free(rq->pr_legs[i].lg_body);
		rq->pr_legs[i].lg_body = NULL;
		rq->pr_legs[i].lg_len = 0;
	}
	free(rq->pr_dh);
	rq->pr_dh = NULL;
	rq->pr_ndh = 0;
	rq->pr_paused = false;
	cJSON_Delete(rq->pr_plp);
	rq->pr_plp = NULL;
	rq->pr_merge = rq->pr_merge_wanted;
	rq->pr_sse_len = 0;
}

/* Sends every leg at once (gateway.md §11.3). */
static void
pd_dispatch(void *arg)
{
	struct pd_req *rq = arg;
	struct upstream_header hdrs[HDR_UPSTREAM_MAX];
	char auth[SHM_KEY_MAX + 16], url[SHM_URL_MAX];
	struct pd_leg *lg;
	size_t n;
	unsigned i;

	if (pd_build_body(rq) == -1) {
		exchange_fail(rq->pr_ex, 400, "request_preparation_failed",
		    "Failed to add the bootstrap fields to the request", 0);
		return;
	}
	for (i = 0; i < rq->pr_nlegs; i++) {
		lg = &rq->pr_legs[i];
		lg->lg_status = 0;
		lg->lg_done = false;
		lg->lg_err = UPSTREAM_OK;
		lg->lg_len = 0;
		lg->lg_overflow = false;
		n = hdr_upstream(rq->pr_hr, reqctx_find(rq->pr_hr),
		    lg->lg_x->xl_traceparent, rq->pr_id,
		    lg->lg_x->xl_d.dc_api_key, true, auth, sizeof(auth), hdrs,
		    HDR_UPSTREAM_MAX);
		if (exchange_dispatch(rq->pr_ex, i,
		        upstream_request(fe->fe_up,
		            pd_send_url(lg->lg_x->xl_d.dc_url, url,
		                sizeof(url)),
		            "POST", rq->pr_path, hdrs, n,
		            lg->lg_body != NULL ? lg->lg_body : rq->pr_body,
		            lg->lg_body != NULL ? lg->lg_body_len
		                                : rq->pr_body_len,
		            &pd_cbs, lg)) == -1)
			return;
	}
}

/* Keeps up to max bytes of a leg's body; -1 when out of memory. */
static int
pd_keep(struct pd_leg *lg, const char *data, size_t len, size_t max)
{
	if (lg->lg_len + len > max) {
		lg->lg_overflow = true;
		len = max - lg->lg_len;
	}
	if (len == 0)
		return 0;
	return pd_append(&lg->lg_buf, &lg->lg_len, &lg->lg_cap, data, len);
}

static void
pd_on_head(void *arg, int status, const struct upstream_header *h, size_t n)
{
	struct pd_leg *lg = arg;
	struct pd_req *rq = lg->lg_rq;

	lg->lg_status = status;
	if (lg->lg_index != PD_DECODE) {
		/* A failed leg answers once its error body is read. */
		pd_progress(rq);
		return;
	}
	if (status >= 200 && status < 300) {
		/* Held until every other leg said 2xx: copy it. */
		if ((rq->pr_dh = hdr_copy(h, n)) == NULL) {
			exchange_next(rq->pr_ex, lg->lg_index,
			    EXCHANGE_NO_MEMORY, 0, NULL);
			return;
		}
		rq->pr_ndh = n;
		/* A body to merge is read whole before the client sees it. */
		if (!rq->pr_merge || rq->pr_ex->ex_streaming) {
			rq->pr_paused = true;
			exchange_pause(rq->pr_ex, PD_DECODE, false);
		}
	}
	pd_progress(rq);
}

static void
pd_on_body(void *arg, const char *data, size_t len)
{
	struct pd_leg *lg = arg;
	struct pd_req *rq = lg->lg_rq;
	bool ok = lg->lg_status >= 200 && lg->lg_status < 300;

	if (len == 0)
		return;
	exchange_first_byte(rq->pr_ex, lg->lg_index);
	exchange_progress(rq->pr_ex, lg->lg_index);
	if (lg->lg_index == PD_DECODE && rq->pr_ex->ex_relayed) {
		pd_relay(rq, data, len);
		return;
	}
	/* Other legs' 2xx bodies are discarded (gateway.md §11.5), but for
	 * the prefill's logprobs. */
	if (lg->lg_index != PD_DECODE && ok) {
		if (lg->lg_index == PD_PREFILL && rq->pr_merge &&
		    pd_keep(lg, data, len, PD_MERGE_MAX) == -1)
			lg->lg_overflow = true; /* not merged, not fatal */
		return;
	}
	if (lg->lg_index == PD_DECODE && ok && rq->pr_merge &&
	    !rq->pr_ex->ex_streaming) {
		if (lg->lg_len + len <= PD_MERGE_MAX) {
			if (pd_keep(lg, data, len, PD_MERGE_MAX) == -1)
				exchange_next(rq->pr_ex, lg->lg_index,
				    EXCHANGE_NO_MEMORY, 0, NULL);
			return;
		}
		/* Too big to merge: relayed unchanged, as without merging. */
		rq->pr_merge = false;
		if (pd_keep(lg, data, len, lg->lg_len + len) == -1) {
			exchange_next(rq->pr_ex, lg->lg_index,
			    EXCHANGE_NO_MEMORY, 0, NULL);
			return;
		}
		rq->pr_paused = true;
		exchange_pause(rq->pr_ex, PD_DECODE, false);
		pd_progress(rq);
		return;
	}
	if (pd_keep(lg, data, len, FE_FANOUT_BODY_MAX) == -1 ||
	    (ok && lg->lg_overflow)) {
		exchange_next(rq->pr_ex, lg->lg_index, EXCHANGE_NO_MEMORY, 0,
		    NULL);
		return;
	}
}

static void
pd_on_done(void *arg, enum upstream_error err)
{
	struct pd_leg *lg = arg;
	struct pd_req *rq = lg->lg_rq;
	struct conn *c = rq->pr_conn;
	char labels[SHM_SERIES_NAME_MAX];

	lg->lg_x->xl_up = NULL;
	lg->lg_done = true;
	lg->lg_err = err;
	if (err != UPSTREAM_OK) {
		if (lg->lg_index == PD_DECODE && rq->pr_ex->ex_relayed) {
			/* Cut mid-body: the client sees the connection end. */
			exchange_finish(rq->pr_ex, lg->lg_status, false);
			conn_flush(c);
			conn_request_abort(c);
			return;
		}
		if (rq->pr_ex->ex_relayed)
			return; /* a finished prefill's body broke: harmless */
		if (lg->lg_index != PD_DECODE)
			stats_add("smg_pd_bootstrap_failures_total", "", 1);
		exchange_next(rq->pr_ex, lg->lg_index, exchange_failure_of(err),
		    0, NULL);
		return;
	}
	if (lg->lg_index != PD_DECODE && lg->lg_status >= 200 &&
	    lg->lg_status < 300)
		/* Its part is done: its worker is free of it now. */
		exchange_end(rq->pr_ex, lg->lg_index, lg->lg_status, false,
		    false);
	if (lg->lg_index == PD_PREFILL && lg->lg_status >= 200 &&
	    lg->lg_status < 300) {
		snprintf(labels, sizeof(labels),
		    "backend_type=\"pd\",model=\"%s\",runtime=\"%s\"",
		    rq->pr_ex->ex_model, pd_runtime());
		stats_observe("smg_pd_prefill_duration_seconds", labels,
		    ev_now(fe->fe_loop) - lg->lg_x->xl_sent);
	}
	if (lg->lg_index == PD_DECODE && rq->pr_ex->ex_relayed) {
		pd_finish(rq, true);
		return;
	}
	pd_progress(rq);
}

/*
 * Decides what the client gets once enough is known: an error of a leg
 * other than decode (it wins), the held decode head, or a decode error.
 */
static void
pd_progress(struct pd_req *rq)
{
	struct pd_leg *lg, *dec = &rq->pr_legs[PD_DECODE];
	bool pending = false;
	unsigned i;

	if (rq->pr_ex->ex_relayed)
		return;
	for (i = 0; i < rq->pr_nlegs; i++) {
		lg = &rq->pr_legs[i];
		if (i == PD_DECODE)
			continue;
		if (lg->lg_status == 0) {
			pending = true;
			continue;
		}
		if (lg->lg_status < 200 || lg->lg_status >= 300) {
			if (lg->lg_done)
				pd_leg_error(rq, lg);
			return;
		}
		/* Merging needs the prefill's whole body. */
		if (i == PD_PREFILL && rq->pr_merge && !lg->lg_done)
			pending = true;
	}
	if (pending || dec->lg_status == 0)
		return;
	if (dec->lg_status >= 200 && dec->lg_status < 300) {
		if (rq->pr_merge && !rq->pr_ex->ex_streaming && !dec->lg_done)
			return;
		pd_release(rq);
		return;
	}
	if (dec->lg_done)
		pd_decode_error(rq, dec);
}

/* Every other leg answered 2xx: the decode response goes through. */
static void
pd_release(struct pd_req *rq)
{
	struct pd_leg *dec = &rq->pr_legs[PD_DECODE];
	struct pd_leg *pre = &rq->pr_legs[PD_PREFILL];
	struct conn *c = rq->pr_conn;
	struct upstream_header *h = rq->pr_dh;
	size_t nh = rq->pr_ndh;
	char clen[24];
	bool keep_length;

	if (rq->pr_merge && !pre->lg_overflow)
		rq->pr_plp = pd_prefill_logprobs(pre->lg_buf, pre->lg_len);
	if (rq->pr_plp == NULL)
		rq->pr_merge = false;
	keep_length = hdr_find(h, nh, "content-length") != NULL &&
	    !(rq->pr_merge && rq->pr_ex->ex_streaming);
	if (rq->pr_merge && !rq->pr_ex->ex_streaming) {
		/* The whole body is here: its length replaces the worker's. */
		if (pd_merge_whole(rq) == -1) {
			exchange_next(rq->pr_ex, PD_DECODE, EXCHANGE_NO_MEMORY,
			    0, NULL);
			return;
		}
		nh = hdr_set_length(h, nh, clen, sizeof(clen), dec->lg_len);
		keep_length = true;
	}
	rq->pr_chunked = !keep_length && conn_http_minor(c) >= 1;
	if (!keep_length && !rq->pr_chunked)
		conn_set_close(c); /* HTTP/1.0: the close ends the body */
	conn_relay_head(c, dec->lg_status, h, nh, keep_length,
	    rq->pr_ex->ex_streaming, rq->pr_chunked, rq->pr_id,
	    dec->lg_x->xl_d.dc_url);
	rq->pr_ex->ex_relayed = true;
	free(rq->pr_dh);
	rq->pr_dh = NULL;
	rq->pr_ndh = 0;
	if (dec->lg_len > 0) {
		pd_relay(rq, dec->lg_buf, dec->lg_len);
		dec->lg_len = 0;
	} else
		conn_flush(c);
	if (dec->lg_done) {
		pd_finish(rq, true);
		return;
	}
	if (rq->pr_paused && conn_pending(c) <= FE_OUT_HIGH) {
		rq->pr_paused = false;
		exchange_resume(rq->pr_ex, PD_DECODE);
	} else if (rq->pr_paused) {
		/* Held now for the client, not for the other legs. */
		exchange_resume(rq->pr_ex, PD_DECODE);
		exchange_pause(rq->pr_ex, PD_DECODE, true);
	}
}

/*
 * The held decode body merged with the prefill's logprobs, in place; a
 * body that does not merge stays as it is. -1 only when out of memory.
 */
static int
pd_merge_whole(struct pd_req *rq)
{
	struct pd_leg *dec = &rq->pr_legs[PD_DECODE];
	cJSON *j;
	char *s;
	int rv = 0;

	if ((j = cJSON_ParseWithLength(dec->lg_buf, dec->lg_len)) == NULL)
		return 0;
	if (pd_merge_logprobs(j, rq->pr_plp) == 1) {
		if ((s = cJSON_PrintUnformatted(j)) == NULL)
			rv = -1;
		else {
			free(dec->lg_buf);
			dec->lg_buf = s;
			dec->lg_len = strlen(s);
			dec->lg_cap = dec->lg_len + 1;
		}
	}
	cJSON_Delete(j);
	return rv;
}

/*
 * Streaming merge: decode bytes are cut into events; each complete one is
 * merged (or passed as it is) and sent. An event that grows past
 * PD_MERGE_MAX without ending stops the merging.
 */
static void
pd_sse_feed(struct pd_req *rq, const char *data, size_t len)
{
	size_t off = 0, n, outlen;
	char *out;

	if (pd_append(&rq->pr_sse, &rq->pr_sse_len, &rq->pr_sse_cap, data,
	        len) == -1) {
		/* Out of memory: what is held and this piece go unmerged. */
		if (rq->pr_sse_len > 0)
			pd_emit(rq, rq->pr_sse, rq->pr_sse_len);
		rq->pr_sse_len = 0;
		rq->pr_merge = false;
		pd_emit(rq, data, len);
		return;
	}
	while ((n = pd_sse_event_len(rq->pr_sse + off, rq->pr_sse_len - off)) >
	    0) {
		out = pd_merge_event(rq->pr_sse + off, n, rq->pr_plp, &outlen);
		if (out != NULL) {
			pd_emit(rq, out, outlen);
			free(out);
		} else
			pd_emit(rq, rq->pr_sse + off, n);
		off += n;
	}
	memmove(rq->pr_sse, rq->pr_sse + off, rq->pr_sse_len - off);
	rq->pr_sse_len -= off;
	if (rq->pr_sse_len > PD_MERGE_MAX) {
		pd_emit(rq, rq->pr_sse, rq->pr_sse_len);
		rq->pr_sse_len = 0;
		rq->pr_merge = false;
	}
}

/* Decode bytes for the client (merged when that is asked). */
static void
pd_relay(struct pd_req *rq, const char *data, size_t len)
{
	if (rq->pr_merge && rq->pr_ex->ex_streaming)
		pd_sse_feed(rq, data, len);
	else
		pd_emit(rq, data, len);
}

static void
pd_emit(struct pd_req *rq, const char *data, size_t len)
{
	struct pd_leg *dec = &rq->pr_legs[PD_DECODE];
	struct conn *c = rq->pr_conn;
	struct http_out *o = conn_out(c);
	char sz[24], labels[SHM_SERIES_NAME_MAX];
	int n;

	if (!rq->pr_ttft_done) {
		rq->pr_ttft_done = true;
		snprintf(labels, sizeof(labels),
		    "backend_type=\"pd\",model=\"%s\",runtime=\"%s\"",
		    rq->pr_ex->ex_model, pd_runtime());
		stats_observe("smg_pd_ttft_seconds", labels,
		    ev_now(fe->fe_loop) - rq->pr_ex->ex_start);
	}
	if (rq->pr_chunked) {
		n = snprintf(sz, sizeof(sz), "%zx\r\n", len);
		http_out_append(o, sz, (size_t)n);
		http_out_append(o, data, len);
		http_out_append(o, "\r\n", 2);
	} else
		http_out_append(o, data, len);
	conn_flush(c);
	if (!rq->pr_paused && conn_pending(c) > FE_OUT_HIGH &&
	    dec->lg_x->xl_up != NULL) {
		rq->pr_paused = true;
		exchange_pause(rq->pr_ex, PD_DECODE, true);
	}
}

/* The decode response ended: every leg records the final status. */
static void
pd_finish(struct pd_req *rq, bool ok)
{
	struct pd_leg *dec = &rq->pr_legs[PD_DECODE];
	struct conn *c = rq->pr_conn;

	exchange_finish(rq->pr_ex, dec->lg_status, ok);
	if (rq->pr_sse_len > 0) {
		/* The stream ended inside an event: sent as it came. */
		pd_emit(rq, rq->pr_sse, rq->pr_sse_len);
		rq->pr_sse_len = 0;
	}
	if (rq->pr_chunked)
		http_out_append(conn_out(c), "0\r\n\r\n", 5);
	conn_request_done(c);
}

/*
 * The worker's error text: a JSON body's "message" or "error.message"
 * (or "error" when a string), else the body itself.
 */
static void
pd_worker_message(const char *body, size_t len, char *out, size_t outlen)
{
	const cJSON *m = NULL, *e;
	cJSON *j;

	snprintf(out, outlen, "%.*s", (int)(len < outlen ? len : outlen - 1),
	    body != NULL ? body : "");
	if (body == NULL || (j = cJSON_ParseWithLength(body, len)) == NULL)
		return;
	if (cJSON_IsObject(j)) {
		m = cJSON_GetObjectItemCaseSensitive(j, "message");
		e = cJSON_GetObjectItemCaseSensitive(j, "error");
		if (!cJSON_IsString(m) && cJSON_IsString(e))
			m = e;
		else if (!cJSON_IsString(m) && cJSON_IsObject(e))
			m = cJSON_GetObjectItemCaseSensitive(e, "message");
	}
	if (cJSON_IsString(m))
		snprintf(out, outlen, "%s", m->valuestring);
	cJSON_Delete(j);
}

/* A leg other than decode answered non-2xx; its body is complete. */
static void
pd_leg_error(struct pd_req *rq, struct pd_leg *lg)
{
	char msg[PD_MSG_MAX];

	stats_add("smg_pd_bootstrap_failures_total", "", 1);
	pd_worker_message(lg->lg_buf, lg->lg_len, msg, sizeof(msg));
	exchange_next(rq->pr_ex, lg->lg_index, EXCHANGE_WORKER_STATUS,
	    lg->lg_status, msg);
}

/* The decode leg answered non-2xx (gateway.md §11.4). */
static void
pd_decode_error(struct pd_req *rq, struct pd_leg *dec)
{
	struct conn *c = rq->pr_conn;
	char msg[PD_MSG_MAX];
	cJSON *o, *e, *m;
	char *s, *ev;
	int status = dec->lg_status;

	if (!rq->pr_ex->ex_streaming || exchange_can_retry(rq->pr_ex, status)) {
		pd_worker_message(dec->lg_buf, dec->lg_len, msg, sizeof(msg));
		exchange_next(rq->pr_ex, PD_DECODE, EXCHANGE_WORKER_STATUS,
		    status, msg);
		return;
	}
	/* Streaming: an SSE error event with the decode status. */
	o = cJSON_CreateObject();
	e = cJSON_AddObjectToObject(o, "error");
	m = dec->lg_buf != NULL
	    ? cJSON_ParseWithLength(dec->lg_buf, dec->lg_len)
	    : NULL;
	if (m == NULL)
		m = cJSON_CreateString(dec->lg_buf != NULL ? dec->lg_buf : "");
	cJSON_AddItemToObject(e, "message", m);
	cJSON_AddNumberToObject(e, "status", status);
	s = cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	if (s == NULL || (ev = malloc(strlen(s) + 9)) == NULL) {
		cJSON_free(s);
		exchange_next(rq->pr_ex, PD_DECODE, EXCHANGE_NO_MEMORY, 0,
		    NULL);
		return;
	}
	sprintf(ev, "data: %s\n\n", s);
	cJSON_free(s);
	exchange_finish(rq->pr_ex, status, false);
	conn_respond(c, status, "text/event-stream", ev, strlen(ev), rq->pr_id);
	free(ev);
}

static const char *
pd_runtime(void)
{
	return fe->fe_cf->cf_backend != NULL ? fe->fe_cf->cf_backend : "sglang";
}

/* The request failed for good: the gateway's error answers it. */
static void
pd_failed(void *arg, int status, const char *code, const char *msg,
    int retry_after)
{
	struct pd_req *rq = arg;

	conn_error(rq->pr_conn, status, code, msg, rq->pr_id, retry_after);
}

static void
pd_drained(void *arg)
{
	struct pd_req *rq = arg;
	struct pd_leg *dec = &rq->pr_legs[PD_DECODE];

	(void)dec;
	if (rq->pr_paused && rq->pr_ex->ex_relayed) {
		rq->pr_paused = false;
		exchange_resume(rq->pr_ex, PD_DECODE);
	}
}

/* The request's end hook (runs after the exchange's: the legs are
 * over by then). */
static void
pd_free(void *arg)
{
	struct pd_req *rq = arg;
	unsigned i;

	for (i = 0; i < PD_NLEGS; i++) {
		free(rq->pr_legs[i].lg_buf);
		free(rq->pr_legs[i].lg_body);
	}
	cJSON_Delete(rq->pr_plp);
	free(rq->pr_sse);
	free(rq->pr_dh);
	free(rq->pr_body);
	extract_inputs_free(&rq->pr_in);
}

/* ------------------------------------------------- /health_generate */

void
pd_health_generate(struct conn *c, const struct http_request *hr,
    const char *request_id)
{
	struct pd_health *ph;
	unsigned i;

	if ((ph = conn_alloc(c, sizeof(*ph))) == NULL ||
	    conn_on_end(c, ph_free, ph) == -1) {
		conn_error(c, 503, "out_of_memory", "Out of memory", request_id,
		    0);
		return;
	}
	ph->ph_conn = c;
	ph->ph_hr = hr;
	snprintf(ph->ph_id, sizeof(ph->ph_id), "%s", request_id);
	ev_init(&ph->ph_timer, ph_timeout_cb);
	ph->ph_timer.data = ph;
	conn_set_handler(c, &ph_handler, ph);
	ph->ph_pending = 2;
	for (i = 0; i < 2; i++) {
		ph->ph_di[i].di_in = &ph->ph_in;
		ph->ph_di[i].di_leg = pd_leg_proto[i];
		ph->ph_probe[i].pp_ph = ph;
		ph->ph_probe[i].pp_i = i;
		ph->ph_di[i].di_cb = ph_decided;
		ph->ph_di[i].di_arg = &ph->ph_probe[i];
		decide_submit(&ph->ph_di[i]);
	}
}

static void
ph_decided(void *arg, const struct decision *d)
{
	struct ph_probe *pp = arg;
	struct pd_health *ph = pp->pp_ph;
	struct upstream_header hdrs[HDR_UPSTREAM_MAX];
	char auth[SHM_KEY_MAX + 16], url[SHM_URL_MAX];
	struct conn *c;
	size_t n;
	unsigned i;

	ph->ph_d[pp->pp_i] = *d;
	if (--ph->ph_pending > 0)
		return;
	if (!ph->ph_d[0].dc_ok || !ph->ph_d[1].dc_ok) {
		c = ph->ph_conn;
		conn_error(c, 503, "no_healthy_worker_pair",
		    "No healthy prefill/decode worker pair", ph->ph_id, 0);
		return;
	}
	for (i = 0; i < 2; i++) {
		n = hdr_upstream(ph->ph_hr, reqctx_find(ph->ph_hr), NULL,
		    ph->ph_id, ph->ph_d[i].dc_api_key, false, auth,
		    sizeof(auth), hdrs, HDR_UPSTREAM_MAX);
		ph->ph_up[i] = upstream_request(fe->fe_up,
		    pd_send_url(ph->ph_d[i].dc_url, url, sizeof(url)), "GET",
		    "/health_generate", hdrs, n, NULL, 0, &ph_cbs,
		    &ph->ph_probe[i]);
		if (ph->ph_up[i] == NULL)
			ph->ph_status[i] = -1;
	}
	ev_timer_set(&ph->ph_timer,
	    (double)fe->fe_cf->cf_health_check_timeout_secs, 0.);
	ev_timer_start(fe->fe_loop, &ph->ph_timer);
	ph_finish(ph);
}

static void
ph_head(void *arg, int status, const struct upstream_header *h, size_t n)
{
	struct ph_probe *pp = arg;

	(void)h;
	(void)n;
	pp->pp_ph->ph_status[pp->pp_i] = status;
}

static void
ph_body(void *arg, const char *data, size_t len)
{
	(void)arg;
	(void)data;
	(void)len;
}

static void
ph_done(void *arg, enum upstream_error err)
{
	struct ph_probe *pp = arg;
	struct pd_health *ph = pp->pp_ph;
	unsigned i = pp->pp_i;

	ph->ph_up[i] = NULL;
	if (err != UPSTREAM_OK || ph->ph_status[i] == 0)
		ph->ph_status[i] = -1;
	ph_finish(ph);
}

static void
ph_timeout_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct pd_health *ph = w->data;
	unsigned i;

	(void)loop;
	(void)revents;
	for (i = 0; i < 2; i++) {
		if (ph->ph_up[i] != NULL) {
			upstream_cancel(ph->ph_up[i]);
			ph->ph_up[i] = NULL;
			ph->ph_status[i] = -1;
		}
	}
	ph_finish(ph);
}

/* Answers once both probes are over (or one failed). */
static void
ph_finish(struct pd_health *ph)
{
	struct conn *c = ph->ph_conn;
	bool ok = true, over = true;
	unsigned i;

	for (i = 0; i < 2; i++) {
		if (ph->ph_up[i] != NULL)
			over = false;
		else if (ph->ph_status[i] < 200 || ph->ph_status[i] >= 300)
			ok = false;
	}
	if (ok && !over)
		return;
	if (ok)
		conn_respond(c, 200, "text/plain", "OK", 2, ph->ph_id);
	else
		conn_error(c, 503, "health_generate_failed",
		    "Health generate failed on the prefill or decode worker",
		    ph->ph_id, 0);
}

/* The request's end hook: probes and decisions still open. */
static void
ph_free(void *arg)
{
	struct pd_health *ph = arg;
	unsigned i;

	ev_timer_stop(fe->fe_loop, &ph->ph_timer);
	for (i = 0; i < 2; i++) {
		decide_cancel(&ph->ph_di[i]);
		if (ph->ph_up[i] != NULL)
			upstream_cancel(ph->ph_up[i]);
		ph->ph_up[i] = NULL;
	}
}
