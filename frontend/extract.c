/*
 * extract.c: routing inputs from a parsed inference request: route, model,
 * routing text or token ids (policies.md §1.6), keys and hints (§1.3, §5.1,
 * §8.2), PD batch size, and the x-request-id.
 */
#include <pthread.h>
#include <stdint.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "shared/log.h"
#include "shared/shm.h"
#include "frontend/extract.h"

/* Routing text under construction. */
struct tbuf {
	char *tb_buf;
	size_t tb_len;
	size_t tb_cap;
	bool tb_any; /* a piece was added (an empty one counts) */
	bool tb_oom;
};

/*
 * Lean extraction: a scanner over bodies that are plain JSON (RFC 8259,
 * no NUL, at most SCAN_DEPTH deep, keys without escapes). Anything else is
 * left to cJSON, so the answer for it stays cJSON's.
 */
struct scan {
	const char *sc_p;
	const char *sc_end;
};

/* A scanned string: the bytes between its quotes. */
struct jstr {
	const char *js_p;
	size_t js_len;
	bool js_escaped;
	uint64_t js_chars; /* Unicode scalar values once decoded */
};

/* Size of a routing text built piece by piece, without the text. */
struct lsize {
	uint64_t lz_chars;
	bool lz_any;
};

#define SCAN_DEPTH      64
#define SCAN_NUMBER_MAX 63 /* longest number cJSON 1.7.15 reads whole */
#define SCAN_PLAIN      0
#define SCAN_CJSON      1 /* not plain: cJSON decides */
/* Byte-parallel tests on a 64-bit word (exact for "is there any"). */
#define SWAR_ONES          0x0101010101010101ull
#define SWAR_HASZERO(x)    (((x)-SWAR_ONES) & ~(x) & (SWAR_ONES * 0x80))
#define SWAR_HASLESS(x, n) (((x)-SWAR_ONES * (n)) & ~(x) & (SWAR_ONES * 0x80))

static bool extract_lean_on;
static struct shm *extract_lean_shm;

static int tb_reserve(struct tbuf *, size_t);
static void tb_piece(struct tbuf *, const char *, size_t, bool);
static void tb_string(struct tbuf *, const cJSON *, bool);
static void tb_string_array(struct tbuf *, const cJSON *);
static void text_chat(struct tbuf *, const cJSON *);
static void text_messages(struct tbuf *, const cJSON *);
static void text_responses(struct tbuf *, const cJSON *);
static void text_blocks(struct tbuf *, const cJSON *, const char *const *);
static int generate_tokens(const cJSON *, struct extract_inputs *,
    struct tbuf *);
static unsigned batch_size(enum extract_endpoint, const cJSON *, bool *);
static int read_headers(const struct http_request *, const char *const *,
    size_t, struct extract_inputs *);
static const char *header_value(const struct http_request *, const char *,
    size_t *);
static bool visible_ascii(const char *, size_t);
static char *dup_n(const char *, size_t);
static bool has_suffix(const char *, const char *);
static uint64_t splitmix64(uint64_t *);
static void rid_forget(void);
static void rid_seed(void);
static uint64_t rid_next(void);
static int fail(int *, const char **, char *, size_t, int, const char *,
    const char *);
static int lean_inputs(enum extract_endpoint, const char *, size_t,
    const struct http_request *, const char *const *, size_t, bool,
    struct extract_inputs *);
static void sc_ws(struct scan *);
static int hex4(const char *, uint32_t *);
static bool key_is(const struct jstr *, const char *);
static int sc_string(struct scan *, struct jstr *);
static int sc_number(struct scan *);
static int sc_value(struct scan *, int);
static int sc_member(struct scan *, struct jstr *);
static char *jstr_dup(const struct jstr *);
static void lz_piece(struct lsize *, const struct jstr *, bool);
static int lz_strings(struct scan *, const char *, struct lsize *);
static int lz_chat(struct scan *, const char *, struct lsize *);
static int lz_blocks(struct scan *, const char *, struct lsize *);

static const struct {
	const char *rt_path;
	enum extract_endpoint rt_ep;
} routes[] = {
	{ "/generate", EXTRACT_EP_GENERATE },
	{ "/v1/chat/completions", EXTRACT_EP_CHAT },
	{ "/v1/completions", EXTRACT_EP_COMPLETIONS },
	{ "/v1/embeddings", EXTRACT_EP_EMBEDDINGS },
	{ "/v1/rerank", EXTRACT_EP_RERANK },
	{ "/rerank", EXTRACT_EP_RERANK },
	{ "/v1/classify", EXTRACT_EP_CLASSIFY },
	{ "/v1/messages", EXTRACT_EP_MESSAGES },
	{ "/v1/responses", EXTRACT_EP_RESPONSES },
	{ "/v1/audio/transcriptions", EXTRACT_EP_TRANSCRIPTIONS },
};

static const char *const text_types[] = { "text", NULL };
static const char *const response_text_types[] = { "input_text", "output_text",
	"text", NULL };

int
extract_route(const char *path, enum extract_endpoint *out)
{
	size_t i;

	for (i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
		if (strcmp(path, routes[i].rt_path) == 0) {
			*out = routes[i].rt_ep;
			return 0;
		}
	}
	return -1;
}

bool
extract_model_missing(const char *model)
{
	if (model == NULL || strcmp(model, "unknown") == 0)
		return true;
	for (; *model != '\0'; model++)
		if (!isspace((unsigned char)*model))
			return false;
	return true;
}

const char *
extract_endpoint_name(enum extract_endpoint ep)
{
	switch (ep) {
	case EXTRACT_EP_GENERATE:
		return "generate";
	case EXTRACT_EP_CHAT:
		return "chat";
	case EXTRACT_EP_COMPLETIONS:
		return "completions";
	case EXTRACT_EP_EMBEDDINGS:
		return "embeddings";
	case EXTRACT_EP_RERANK:
		return "rerank";
	case EXTRACT_EP_CLASSIFY:
		return "classify";
	case EXTRACT_EP_MESSAGES:
		return "messages";
	case EXTRACT_EP_RESPONSES:
		return "responses";
	case EXTRACT_EP_TRANSCRIPTIONS:
		return "transcriptions";
	case EXTRACT_EP_OTHER:
		break;
	}
	return "other";
}

int
extract_inputs(enum extract_endpoint ep, const char *body, size_t len,
    const struct http_request *req, const char *const *routing_key_headers,
    size_t nkeys, bool routing_key_override, struct extract_inputs *out,
    int *status, const char **code, char *msg, size_t msglen)
{
	const cJSON *model, *stream, *rid, *f;
	const char *end = NULL, *ridp;
	struct tbuf tb = { 0 };
	size_t i, keep;

	if (extract_lean_on &&
	    (extract_lean_shm == NULL || !shm_text_wanted(extract_lean_shm))) {
		switch (lean_inputs(ep, body, len, req, routing_key_headers,
		    nkeys, routing_key_override, out)) {
		case SCAN_PLAIN:
			return 0;
		case -1:
			return fail(status, code, msg, msglen, 503,
			    "out_of_memory", "out of memory");
		default:
			break;
		}
	}
	memset(out, 0, sizeof(*out));
	out->ei_endpoint = ep;
	out->ei_batch_n = 1;
	out->ei_json = cJSON_ParseWithLengthOpts(body, len, &end, false);
	if (out->ei_json == NULL)
		return fail(status, code, msg, msglen, 400, "json_parse_error",
		    "request body is not valid JSON");
	for (i = (size_t)(end - body); i < len; i++) {
		if (strchr(" \t\r\n", body[i]) == NULL || body[i] == '\0') {
			extract_inputs_free(out);
			return fail(status, code, msg, msglen, 400,
			    "json_parse_error",
			    "trailing characters after the JSON body");
		}
	}
	if (!cJSON_IsObject(out->ei_json)) {
		extract_inputs_free(out);
		return fail(status, code, msg, msglen, 400, "invalid_request",
		    "request body must be a JSON object");
	}

	model = cJSON_GetObjectItemCaseSensitive(out->ei_json, "model");
	if (model != NULL && !cJSON_IsNull(model)) {
		if (!cJSON_IsString(model)) {
			extract_inputs_free(out);
			return fail(status, code, msg, msglen, 422,
			    "invalid_request", "\"model\" must be a string");
		}
		if ((out->ei_model = strdup(model->valuestring)) == NULL)
			goto oom;
	}
	stream = cJSON_GetObjectItemCaseSensitive(out->ei_json, "stream");
	if (stream != NULL && !cJSON_IsNull(stream)) {
		if (!cJSON_IsBool(stream)) {
			extract_inputs_free(out);
			return fail(status, code, msg, msglen, 422,
			    "invalid_request", "\"stream\" must be a boolean");
		}
		out->ei_stream = cJSON_IsTrue(stream);
	}
	rid = cJSON_GetObjectItemCaseSensitive(out->ei_json, "rid");
	if (cJSON_IsArray(rid))
		rid = cJSON_GetArrayItem(rid, 0);
	if (rid != NULL && !cJSON_IsNull(rid)) {
		if (!cJSON_IsString(rid)) {
			extract_inputs_free(out);
			return fail(status, code, msg, msglen, 422,
			    "invalid_request",
			    "\"rid\" must be a string or an array of strings");
		}
		ridp = rid->valuestring;
		if ((out->ei_rid = strdup(ridp)) == NULL)
			goto oom;
		keep = extract_strip_lineage(ridp, strlen(ridp));
		if (routing_key_override && keep > 0 &&
		    keep <= EXTRACT_KEY_MAX &&
		    (out->ei_rid_key = dup_n(ridp, keep)) == NULL)
			goto oom;
	}

	if (read_headers(req, routing_key_headers, nkeys, out) == -1)
		goto oom;

	switch (ep) {
	case EXTRACT_EP_GENERATE:
		f = cJSON_GetObjectItemCaseSensitive(out->ei_json, "text");
		if (f != NULL && !cJSON_IsNull(f)) {
			if (cJSON_IsArray(f))
				tb_string_array(&tb, f);
			else
				tb_string(&tb, f, false);
		} else if (!out->ei_has_tokens &&
		    generate_tokens(out->ei_json, out, &tb) == -1) {
			goto oom;
		}
		break;
	case EXTRACT_EP_CHAT:
		text_chat(&tb, out->ei_json);
		break;
	case EXTRACT_EP_COMPLETIONS:
		f = cJSON_GetObjectItemCaseSensitive(out->ei_json, "prompt");
		if (cJSON_IsArray(f))
			tb_string_array(&tb, f);
		else
			tb_string(&tb, f, false);
		break;
	case EXTRACT_EP_EMBEDDINGS:
	case EXTRACT_EP_CLASSIFY:
		f = cJSON_GetObjectItemCaseSensitive(out->ei_json, "input");
		if (cJSON_IsArray(f))
			tb_string_array(&tb, f);
		else
			tb_string(&tb, f, false);
		break;
	case EXTRACT_EP_RERANK:
		tb_string(&tb,
		    cJSON_GetObjectItemCaseSensitive(out->ei_json, "query"),
		    false);
		break;
	case EXTRACT_EP_MESSAGES:
		text_messages(&tb, out->ei_json);
		break;
	case EXTRACT_EP_RESPONSES:
		text_responses(&tb, out->ei_json);
		break;
	case EXTRACT_EP_TRANSCRIPTIONS:
	case EXTRACT_EP_OTHER:
		break;
	}
	if (tb.tb_oom)
		goto oom;
	out->ei_batch_n = batch_size(ep, out->ei_json, &out->ei_is_batch);
	if (out->ei_has_tokens) {
		free(tb.tb_buf);
		out->ei_size = out->ei_ntokens;
	} else if (tb.tb_any) {
		if (tb.tb_buf == NULL && tb_reserve(&tb, 1) == -1)
			goto oom;
		out->ei_text = tb.tb_buf;
		out->ei_text_len = tb.tb_len;
		out->ei_has_text = true;
		out->ei_size = extract_utf8_chars(tb.tb_buf, tb.tb_len);
	}
	return 0;
oom:
	free(tb.tb_buf);
	extract_inputs_free(out);
	return fail(status, code, msg, msglen, 503, "out_of_memory",
	    "out of memory");
}

void
extract_set_lean(bool on, struct shm *shm)
{
	extract_lean_on = on;
	extract_lean_shm = shm;
}

int
extract_inputs_headers(enum extract_endpoint ep, const struct http_request *req,
    const char *const *routing_key_headers, size_t nkeys,
    struct extract_inputs *out)
{
	memset(out, 0, sizeof(*out));
	out->ei_endpoint = ep;
	out->ei_batch_n = 1;
	if (read_headers(req, routing_key_headers, nkeys, out) == -1) {
		extract_inputs_free(out);
		return -1;
	}
	if (out->ei_has_tokens)
		out->ei_size = out->ei_ntokens;
	return 0;
}

void
extract_inputs_free(struct extract_inputs *in)
{
	free(in->ei_model);
	free(in->ei_text);
	free(in->ei_tokens);
	free(in->ei_rid);
	free(in->ei_rid_key);
	free(in->ei_routing_key);
	free(in->ei_target_worker);
	free(in->ei_implicit_key);
	cJSON_Delete(in->ei_json);
	memset(in, 0, sizeof(*in));
}

/* Strips "_<c><digits>" from the end of key[0..len) when present. */
static size_t
strip_suffix(const char *key, size_t len, char c)
{
	size_t i = len;

	while (i > 0 && key[i - 1] >= '0' && key[i - 1] <= '9')
		i--;
	if (i == len || i < 2 || key[i - 1] != c || key[i - 2] != '_')
		return len;
	return i - 2;
}

size_t
extract_strip_lineage(const char *key, size_t len)
{
	size_t n;

	n = strip_suffix(key, len, 'r');
	n = strip_suffix(key, n, 't');
	return n == 0 ? len : n;
}

long
extract_routing_tokens(const char *value, size_t len, uint32_t **out)
{
	uint32_t ids[EXTRACT_ROUTING_TOKENS_MAX];
	size_t i = 0, n = 0, start;
	uint64_t v;

	*out = NULL;
	if (len == 0 || len > EXTRACT_ROUTING_TOKENS_BYTES)
		return 0;
	for (;;) {
		start = i;
		v = 0;
		while (i < len && value[i] >= '0' && value[i] <= '9') {
			v = v * 10 + (uint64_t)(value[i] - '0');
			if (v > UINT32_MAX)
				return 0;
			i++;
		}
		if (i == start || n == EXTRACT_ROUTING_TOKENS_MAX)
			return 0;
		ids[n++] = (uint32_t)v;
		if (i == len)
			break;
		if (value[i] != ',')
			return 0;
		i++;
	}
	if ((*out = malloc(n * sizeof(**out))) == NULL)
		return -1;
	memcpy(*out, ids, n * sizeof(**out));
	return (long)n;
}

bool
extract_utf8_valid(const char *str, size_t len)
{
	const unsigned char *s = (const unsigned char *)str;
	size_t i = 0, n, k;
	uint32_t cp;

	while (i < len) {
		if (s[i] < 0x80) {
			i++;
			continue;
		}
		if (s[i] >= 0xc2 && s[i] <= 0xdf) {
			n = 1;
			cp = s[i] & 0x1f;
		} else if (s[i] >= 0xe0 && s[i] <= 0xef) {
			n = 2;
			cp = s[i] & 0x0f;
		} else if (s[i] >= 0xf0 && s[i] <= 0xf4) {
			n = 3;
			cp = s[i] & 0x07;
		} else {
			return false;
		}
		if (len - i - 1 < n)
			return false;
		for (k = 1; k <= n; k++) {
			if ((s[i + k] & 0xc0) != 0x80)
				return false;
			cp = (cp << 6) | (s[i + k] & 0x3f);
		}
		if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
		    cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		i += n + 1;
	}
	return true;
}

size_t
extract_utf8_chars(const char *s, size_t len)
{
	size_t i, n = 0;

	for (i = 0; i < len; i++)
		if (((unsigned char)s[i] & 0xc0) != 0x80)
			n++;
	return n;
}

void
extract_request_id(const struct http_request *req,
    const char *const *id_headers, size_t nids, const char *path, char *out,
    size_t outlen)
{
	static const char alnum[] = "0123456789"
	                            "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	                            "abcdefghijklmnopqrstuvwxyz";
	unsigned char rnd[24];
	const char *v, *prefix;
	size_t i, vlen, plen;
	uint64_t r;

	if (outlen == 0)
		return;
	for (i = 0; req != NULL && i < nids; i++) {
		v = header_value(req, id_headers[i], &vlen);
		if (v == NULL || vlen == 0 || vlen > EXTRACT_REQUEST_ID_MAX ||
		    vlen >= outlen || !visible_ascii(v, vlen))
			continue;
		memcpy(out, v, vlen);
		out[vlen] = '\0';
		return;
	}
	if (path == NULL)
		prefix = "req-";
	else if (has_suffix(path, "/chat/completions"))
		prefix = "chatcmpl-";
	else if (has_suffix(path, "/completions"))
		prefix = "cmpl-";
	else if (has_suffix(path, "/generate"))
		prefix = "gnt-";
	else if (has_suffix(path, "/responses"))
		prefix = "resp-";
	else if (has_suffix(path, "/messages"))
		prefix = "msg_";
	else
		prefix = "req-";
	plen = strlen(prefix);
	if (plen >= outlen)
		plen = outlen - 1;
	memcpy(out, prefix, plen);
	for (i = 0; i < sizeof(rnd); i += sizeof(r)) {
		r = rid_next();
		memcpy(rnd + i, &r, sizeof(r));
	}
	for (i = 0; i < sizeof(rnd) && plen + i + 1 < outlen; i++)
		out[plen + i] = alnum[rnd[i] % (sizeof(alnum) - 1)];
	out[plen + i] = '\0';
}

/*
 * Generated request ids need to be unique, not secret: a xoshiro256**
 * generator, seeded from getrandom once per process (again in a forked
 * child), costs no syscall per request.
 */
static uint64_t rid_state[4];
static bool rid_seeded;
static bool rid_atfork;

static uint64_t
splitmix64(uint64_t *x)
{
	uint64_t z;

	z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* A forked child must not repeat its parent's ids. */
static void
rid_forget(void)
{
	rid_seeded = false;
}

static void
rid_seed(void)
{
	struct timespec ts;
	uint64_t x;
	size_t i;

	if (getrandom(&x, sizeof(x), 0) != (ssize_t)sizeof(x)) {
		log_warn("%s: getrandom; seeding from the clock", __func__);
		clock_gettime(CLOCK_REALTIME, &ts);
		x = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
		x ^= (uint64_t)getpid() << 32;
	}
	/* splitmix64 never yields an all-zero xoshiro state. */
	for (i = 0; i < 4; i++)
		rid_state[i] = splitmix64(&x);
	if (!rid_atfork && pthread_atfork(NULL, NULL, rid_forget) == 0)
		rid_atfork = true;
	rid_seeded = true;
}

static uint64_t
rid_next(void)
{
	uint64_t *s = rid_state, r, t;

	if (!rid_seeded)
		rid_seed();
	r = s[1] * 5;
	r = ((r << 7) | (r >> 57)) * 9;
	t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = (s[3] << 45) | (s[3] >> 19);
	return r;
}

/* ---------------------------------------------------------- routing text */

static int
tb_reserve(struct tbuf *tb, size_t more)
{
	size_t cap;
	char *p;

	if (tb->tb_oom)
		return -1;
	if (tb->tb_len + more + 1 <= tb->tb_cap)
		return 0;
	cap = tb->tb_cap ? tb->tb_cap : 256;
	while (cap < tb->tb_len + more + 1)
		cap *= 2;
	if ((p = realloc(tb->tb_buf, cap)) == NULL) {
		tb->tb_oom = true;
		return -1;
	}
	tb->tb_buf = p;
	tb->tb_cap = cap;
	if (tb->tb_len == 0)
		p[0] = '\0';
	return 0;
}

/*
 * Adds one piece, separated from the previous ones by a single space. With
 * skip_empty an empty piece adds nothing at all; otherwise it still takes
 * its place in the join (so ["a","","b"] gives "a  b").
 */
static void
tb_piece(struct tbuf *tb, const char *s, size_t n, bool skip_empty)
{
	bool sep;

	if (n == 0 && skip_empty)
		return;
	sep = tb->tb_any;
	if (tb_reserve(tb, n + 1) == -1)
		return;
	if (sep)
		tb->tb_buf[tb->tb_len++] = ' ';
	memcpy(tb->tb_buf + tb->tb_len, s, n);
	tb->tb_len += n;
	tb->tb_buf[tb->tb_len] = '\0';
	tb->tb_any = true;
}

static void
tb_string(struct tbuf *tb, const cJSON *item, bool skip_empty)
{
	if (cJSON_IsString(item))
		tb_piece(tb, item->valuestring, strlen(item->valuestring),
		    skip_empty);
}

/* String elements joined by one space; other elements skipped. */
static void
tb_string_array(struct tbuf *tb, const cJSON *arr)
{
	const cJSON *e;

	cJSON_ArrayForEach(e, arr)
	{
		tb_string(tb, e, false);
	}
}

/* A content value: a string, or an array of blocks whose "type" is one of
 * types, each contributing its "text". Empty pieces are skipped. */
static void
text_blocks(struct tbuf *tb, const cJSON *content, const char *const *types)
{
	const cJSON *part, *type;
	size_t i;

	if (cJSON_IsString(content)) {
		tb_string(tb, content, true);
		return;
	}
	cJSON_ArrayForEach(part, content)
	{
		type = cJSON_GetObjectItemCaseSensitive(part, "type");
		if (!cJSON_IsString(type))
			continue;
		for (i = 0; types[i] != NULL; i++)
			if (strcmp(type->valuestring, types[i]) == 0)
				break;
		if (types[i] != NULL)
			tb_string(tb,
			    cJSON_GetObjectItemCaseSensitive(part, "text"),
			    true);
	}
}

static void
text_chat(struct tbuf *tb, const cJSON *root)
{
	const cJSON *msgs, *m;

	msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
	if (!cJSON_IsArray(msgs))
		return;
	cJSON_ArrayForEach(m, msgs)
	{
		if (!cJSON_IsObject(m))
			continue;
		text_blocks(tb, cJSON_GetObjectItemCaseSensitive(m, "content"),
		    text_types);
		tb_string(tb,
		    cJSON_GetObjectItemCaseSensitive(m, "reasoning_content"),
		    true);
	}
}

static void
text_messages(struct tbuf *tb, const cJSON *root)
{
	const cJSON *msgs, *m;

	text_blocks(tb, cJSON_GetObjectItemCaseSensitive(root, "system"),
	    text_types);
	msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
	if (!cJSON_IsArray(msgs))
		return;
	cJSON_ArrayForEach(m, msgs)
	{
		if (cJSON_IsObject(m))
			text_blocks(tb,
			    cJSON_GetObjectItemCaseSensitive(m, "content"),
			    text_types);
	}
}

/* input: a string, or items; message items (type "message", or no type
 * with a role) contribute their content's text parts. */
static void
text_responses(struct tbuf *tb, const cJSON *root)
{
	const cJSON *input, *item, *type;

	input = cJSON_GetObjectItemCaseSensitive(root, "input");
	if (cJSON_IsString(input)) {
		tb_string(tb, input, false);
		return;
	}
	cJSON_ArrayForEach(item, input)
	{
		if (!cJSON_IsObject(item))
			continue;
		type = cJSON_GetObjectItemCaseSensitive(item, "type");
		if (type != NULL
		        ? !(cJSON_IsString(type) &&
		              strcmp(type->valuestring, "message") == 0)
		        : !cJSON_HasObjectItem(item, "role"))
			continue;
		text_blocks(tb,
		    cJSON_GetObjectItemCaseSensitive(item, "content"),
		    response_text_types);
	}
}

/* A JSON number that is an integer in u32 range. */
static bool
json_u32(const cJSON *e, uint32_t *v)
{
	double d;

	if (!cJSON_IsNumber(e))
		return false;
	d = e->valuedouble;
	if (!(d >= 0 && d <= 4294967295.0) || d != (double)(uint64_t)d)
		return false;
	*v = (uint32_t)d;
	return true;
}

/*
 * /generate input_ids: a list of ids, or a batch of lists. The first
 * sequence becomes the routing tokens; when it is empty but the batch has
 * ids, the flattened ids rendered in decimal become the routing text. Any id
 * that is not a u32 makes input_ids unusable for routing (the worker will
 * judge the request).
 */
static int
generate_tokens(const cJSON *root, struct extract_inputs *out, struct tbuf *tb)
{
	const cJSON *ids, *first, *seq, *e;
	size_t n, i = 0;
	uint32_t v = 0;
	char num[16];

	ids = cJSON_GetObjectItemCaseSensitive(root, "input_ids");
	if (!cJSON_IsArray(ids))
		return 0;
	first = cJSON_GetArrayItem(ids, 0);
	if (first == NULL)
		return 0;
	if (cJSON_IsArray(first)) {
		cJSON_ArrayForEach(seq, ids)
		{
			if (!cJSON_IsArray(seq))
				return 0;
			cJSON_ArrayForEach(e, seq)
			{
				if (!json_u32(e, &v))
					return 0;
			}
		}
	} else {
		cJSON_ArrayForEach(e, ids)
		{
			if (!json_u32(e, &v))
				return 0;
		}
		first = ids;
	}
	n = (size_t)cJSON_GetArraySize(first);
	if (n > 0) {
		if ((out->ei_tokens = malloc(n * sizeof(uint32_t))) == NULL)
			return -1;
		cJSON_ArrayForEach(e, first)
		{
			json_u32(e, &out->ei_tokens[i++]);
		}
		out->ei_ntokens = n;
		out->ei_has_tokens = true;
		return 0;
	}
	cJSON_ArrayForEach(seq, ids)
	{
		cJSON_ArrayForEach(e, seq)
		{
			json_u32(e, &v);
			snprintf(num, sizeof(num), "%u", v);
			tb_piece(tb, num, strlen(num), false);
		}
	}
	return 0;
}

/* PD batch size of gateway.md §11.2. */
static unsigned
batch_size(enum extract_endpoint ep, const cJSON *root, bool *is_batch)
{
	const cJSON *f, *first;
	double n;

	*is_batch = false;
	switch (ep) {
	case EXTRACT_EP_GENERATE:
		f = cJSON_GetObjectItemCaseSensitive(root, "text");
		if (cJSON_IsArray(f)) {
			*is_batch = true;
			return (unsigned)cJSON_GetArraySize(f);
		}
		if (f != NULL && !cJSON_IsNull(f))
			return 1;
		f = cJSON_GetObjectItemCaseSensitive(root, "input_ids");
		first = cJSON_GetArrayItem(f, 0);
		if (cJSON_IsArray(f) && cJSON_IsArray(first)) {
			*is_batch = true;
			return (unsigned)cJSON_GetArraySize(f);
		}
		return 1;
	case EXTRACT_EP_COMPLETIONS:
		f = cJSON_GetObjectItemCaseSensitive(root, "prompt");
		first = cJSON_GetArrayItem(f, 0);
		if (cJSON_IsArray(f) &&
		    (cJSON_IsString(first) || cJSON_IsArray(first))) {
			*is_batch = true;
			return (unsigned)cJSON_GetArraySize(f);
		}
		return 1;
	case EXTRACT_EP_CHAT:
		f = cJSON_GetObjectItemCaseSensitive(root, "n");
		if (!cJSON_IsNumber(f))
			return 1;
		n = f->valuedouble;
		if (n > 1 && n <= 65536 && n == (double)(unsigned)n) {
			*is_batch = true;
			return (unsigned)n;
		}
		return 1;
	default:
		return 1;
	}
}

/* ------------------------------------------------------ lean extraction */

static void
sc_ws(struct scan *sc)
{
	while (sc->sc_p < sc->sc_end &&
	    (*sc->sc_p == ' ' || *sc->sc_p == '\t' || *sc->sc_p == '\n' ||
	        *sc->sc_p == '\r'))
		sc->sc_p++;
}

static int
hex4(const char *p, uint32_t *v)
{
	int i;

	*v = 0;
	for (i = 0; i < 4; i++) {
		*v <<= 4;
		if (p[i] >= '0' && p[i] <= '9')
			*v |= (uint32_t)(p[i] - '0');
		else if (p[i] >= 'a' && p[i] <= 'f')
			*v |= (uint32_t)(p[i] - 'a' + 10);
		else if (p[i] >= 'A' && p[i] <= 'F')
			*v |= (uint32_t)(p[i] - 'A' + 10);
		else
			return -1;
	}
	return 0;
}

/*
 * A string at sc_p (the opening quote). Plain: no raw control byte, only
 * JSON's escapes, \u never 0 (cJSON would cut the string there) and
 * surrogates only in pairs.
 */
static int
sc_string(struct scan *sc, struct jstr *js)
{
	const char *p = sc->sc_p + 1, *end = sc->sc_end;
	uint32_t u, lo;

	memset(js, 0, sizeof(*js));
	js->js_p = p;
	while (p < end && *p != '"') {
		/* Eight plain bytes at a time: no quote, backslash or control
		 * byte among them; count all but UTF-8 continuation bytes. */
		while (end - p >= 8) {
			uint64_t x;

			memcpy(&x, p, 8);
			if (SWAR_HASZERO(x ^ SWAR_ONES * '"') ||
			    SWAR_HASZERO(x ^ SWAR_ONES * '\\') ||
			    SWAR_HASLESS(x, 0x20))
				break;
			/* Continuation bytes to 0/1 per byte, summed by
			 * the multiply into the top byte. */
			js->js_chars += 8 -
			    ((((x & ~(x << 1)) >> 7) & SWAR_ONES) * SWAR_ONES >>
			        56);
			p += 8;
		}
		if (p == end || *p == '"')
			break;
		if ((unsigned char)*p < 0x20)
			return SCAN_CJSON;
		if (*p != '\\') {
			if (((unsigned char)*p & 0xc0) != 0x80)
				js->js_chars++;
			p++;
			continue;
		}
		js->js_escaped = true;
		if (end - p < 2)
			return SCAN_CJSON;
		switch (p[1]) {
		case '"':
		case '\\':
		case '/':
		case 'b':
		case 'f':
		case 'n':
		case 'r':
		case 't':
			p += 2;
			break;
		case 'u':
			if (end - p < 6 || hex4(p + 2, &u) == -1 || u == 0 ||
			    (u >= 0xdc00 && u <= 0xdfff))
				return SCAN_CJSON;
			p += 6;
			if (u >= 0xd800 && u <= 0xdbff) {
				if (end - p < 6 || p[0] != '\\' ||
				    p[1] != 'u' || hex4(p + 2, &lo) == -1 ||
				    lo < 0xdc00 || lo > 0xdfff)
					return SCAN_CJSON;
				p += 6;
			}
			break;
		default:
			return SCAN_CJSON;
		}
		js->js_chars++;
	}
	if (p == end)
		return SCAN_CJSON;
	js->js_len = (size_t)(p - js->js_p);
	sc->sc_p = p + 1;
	return SCAN_PLAIN;
}

/* A number of RFC 8259's grammar, short enough for cJSON to read whole. */
static int
sc_number(struct scan *sc)
{
	const char *p = sc->sc_p, *end = sc->sc_end;

	if (p < end && *p == '-')
		p++;
	if (p == end || *p < '0' || *p > '9')
		return SCAN_CJSON;
	if (*p == '0')
		p++;
	else
		while (p < end && *p >= '0' && *p <= '9')
			p++;
	if (p < end && *p == '.') {
		if (++p == end || *p < '0' || *p > '9')
			return SCAN_CJSON;
		while (p < end && *p >= '0' && *p <= '9')
			p++;
	}
	if (p < end && (*p == 'e' || *p == 'E')) {
		p++;
		if (p < end && (*p == '+' || *p == '-'))
			p++;
		if (p == end || *p < '0' || *p > '9')
			return SCAN_CJSON;
		while (p < end && *p >= '0' && *p <= '9')
			p++;
	}
	if (p - sc->sc_p > SCAN_NUMBER_MAX)
		return SCAN_CJSON;
	sc->sc_p = p;
	return SCAN_PLAIN;
}

/* One object member's key and colon; sc_p is then at the value. */
static int
sc_member(struct scan *sc, struct jstr *key)
{
	sc_ws(sc);
	if (sc->sc_p == sc->sc_end || *sc->sc_p != '"' ||
	    sc_string(sc, key) != SCAN_PLAIN || key->js_escaped)
		return SCAN_CJSON;
	sc_ws(sc);
	if (sc->sc_p == sc->sc_end || *sc->sc_p != ':')
		return SCAN_CJSON;
	sc->sc_p++;
	sc_ws(sc);
	return SCAN_PLAIN;
}

static bool
key_is(const struct jstr *key, const char *name)
{
	return key->js_len == strlen(name) &&
	    memcmp(key->js_p, name, key->js_len) == 0;
}

/* Skips one value at sc_p (whitespace before it already skipped). */
static int
sc_value(struct scan *sc, int depth)
{
	struct jstr js;
	const char *p = sc->sc_p;
	size_t left = (size_t)(sc->sc_end - p);
	char close;

	if (left == 0)
		return SCAN_CJSON;
	switch (*p) {
	case '"':
		return sc_string(sc, &js);
	case 't':
	case 'n':
		if (left < 4 || memcmp(p, *p == 't' ? "true" : "null", 4) != 0)
			return SCAN_CJSON;
		sc->sc_p += 4;
		return SCAN_PLAIN;
	case 'f':
		if (left < 5 || memcmp(p, "false", 5) != 0)
			return SCAN_CJSON;
		sc->sc_p += 5;
		return SCAN_PLAIN;
	case '[':
	case '{':
		break;
	default:
		return sc_number(sc);
	}
	if (depth >= SCAN_DEPTH)
		return SCAN_CJSON;
	close = *p == '[' ? ']' : '}';
	sc->sc_p++;
	sc_ws(sc);
	if (sc->sc_p < sc->sc_end && *sc->sc_p == close) {
		sc->sc_p++;
		return SCAN_PLAIN;
	}
	for (;;) {
		if (close == '}' && sc_member(sc, &js) != SCAN_PLAIN)
			return SCAN_CJSON;
		if (sc_value(sc, depth + 1) != SCAN_PLAIN)
			return SCAN_CJSON;
		sc_ws(sc);
		if (sc->sc_p == sc->sc_end)
			return SCAN_CJSON;
		if (*sc->sc_p == close) {
			sc->sc_p++;
			return SCAN_PLAIN;
		}
		if (*sc->sc_p != ',')
			return SCAN_CJSON;
		sc->sc_p++;
		sc_ws(sc);
	}
}

/* The decoded string (escapes resolved), as cJSON's valuestring. */
static char *
jstr_dup(const struct jstr *js)
{
	const char *p = js->js_p, *end = js->js_p + js->js_len;
	uint32_t u, lo;
	char *out, *o;

	if ((out = malloc(js->js_len + 1)) == NULL)
		return NULL;
	if (!js->js_escaped) {
		memcpy(out, p, js->js_len);
		out[js->js_len] = '\0';
		return out;
	}
	/* Scanned already: every escape is whole and valid. */
	for (o = out; p < end;) {
		if (*p != '\\') {
			*o++ = *p++;
			continue;
		}
		switch (p[1]) {
		case 'b':
			*o++ = '\b';
			break;
		case 'f':
			*o++ = '\f';
			break;
		case 'n':
			*o++ = '\n';
			break;
		case 'r':
			*o++ = '\r';
			break;
		case 't':
			*o++ = '\t';
			break;
		case 'u':
			(void)hex4(p + 2, &u);
			if (u >= 0xd800 && u <= 0xdbff) {
				(void)hex4(p + 8, &lo);
				u = 0x10000 + ((u - 0xd800) << 10) +
				    (lo - 0xdc00);
				p += 6;
			}
			/* At most 4 bytes out for 6 or 12 in. */
			if (u < 0x80) {
				*o++ = (char)u;
			} else if (u < 0x800) {
				*o++ = (char)(0xc0 | (u >> 6));
				*o++ = (char)(0x80 | (u & 0x3f));
			} else if (u < 0x10000) {
				*o++ = (char)(0xe0 | (u >> 12));
				*o++ = (char)(0x80 | ((u >> 6) & 0x3f));
				*o++ = (char)(0x80 | (u & 0x3f));
			} else {
				*o++ = (char)(0xf0 | (u >> 18));
				*o++ = (char)(0x80 | ((u >> 12) & 0x3f));
				*o++ = (char)(0x80 | ((u >> 6) & 0x3f));
				*o++ = (char)(0x80 | (u & 0x3f));
			}
			p += 4;
			break;
		default: /* " \\ / */
			*o++ = p[1];
			break;
		}
		p += 2;
	}
	*o = '\0';
	return out;
}

/* tb_piece's arithmetic: one separator before every piece but the first.
 * Empty means no bytes (a lone continuation byte is a piece of 0 chars). */
static void
lz_piece(struct lsize *lz, const struct jstr *js, bool skip_empty)
{
	if (js->js_len == 0 && skip_empty)
		return;
	if (lz->lz_any)
		lz->lz_chars++;
	lz->lz_chars += js->js_chars;
	lz->lz_any = true;
}

/* tb_string or tb_string_array on the (plain) value at v. */
static int
lz_strings(struct scan *sc, const char *v, struct lsize *lz)
{
	struct jstr js;

	sc->sc_p = v;
	if (*v == '"') {
		(void)sc_string(sc, &js);
		lz_piece(lz, &js, false);
		return SCAN_PLAIN;
	}
	if (*v != '[')
		return SCAN_PLAIN;
	sc->sc_p++;
	for (;;) {
		sc_ws(sc);
		if (*sc->sc_p == ']')
			return SCAN_PLAIN;
		if (*sc->sc_p == '"') {
			(void)sc_string(sc, &js);
			lz_piece(lz, &js, false);
		} else {
			(void)sc_value(sc, 1);
		}
		sc_ws(sc);
		if (*sc->sc_p == ',')
			sc->sc_p++;
	}
}

/* text_blocks with the "text" type on the (plain) content value at v. */
static int
lz_blocks(struct scan *sc, const char *v, struct lsize *lz)
{
	struct jstr js, key, type;
	const char *text;
	bool have_type;

	sc->sc_p = v;
	if (*v == '"') {
		(void)sc_string(sc, &js);
		lz_piece(lz, &js, true);
		return SCAN_PLAIN;
	}
	if (*v == '{')
		return SCAN_CJSON; /* cJSON would walk its members */
	if (*v != '[')
		return SCAN_PLAIN;
	sc->sc_p++;
	for (;;) {
		sc_ws(sc);
		if (*sc->sc_p == ']')
			return SCAN_PLAIN;
		if (*sc->sc_p != '{') {
			(void)sc_value(sc, 1);
		} else {
			have_type = false;
			memset(&type, 0, sizeof(type));
			text = NULL;
			sc->sc_p++;
			sc_ws(sc);
			while (*sc->sc_p != '}') {
				(void)sc_member(sc, &key);
				if (!have_type && key_is(&key, "type") &&
				    *sc->sc_p == '"') {
					have_type = true;
					(void)sc_string(sc, &type);
					if (type.js_escaped)
						return SCAN_CJSON;
				} else {
					if (key_is(&key, "type"))
						have_type = true;
					if (text == NULL &&
					    key_is(&key, "text"))
						text = sc->sc_p;
					(void)sc_value(sc, 2);
				}
				sc_ws(sc);
				if (*sc->sc_p == ',') {
					sc->sc_p++;
					sc_ws(sc);
				}
			}
			sc->sc_p++;
			/* "type" must be the string "text" (first "type" key).
			 */
			if (have_type && type.js_p != NULL &&
			    type.js_len == 4 &&
			    memcmp(type.js_p, "text", 4) == 0 && text != NULL &&
			    *text == '"') {
				struct scan t = { text, sc->sc_end };

				(void)sc_string(&t, &js);
				lz_piece(lz, &js, true);
			}
		}
		sc_ws(sc);
		if (*sc->sc_p == ',')
			sc->sc_p++;
	}
}

/* text_chat on the (plain) "messages" value at v. */
static int
lz_chat(struct scan *sc, const char *v, struct lsize *lz)
{
	struct jstr key, js;
	const char *content, *reasoning;

	sc->sc_p = v;
	if (*v != '[')
		return SCAN_PLAIN;
	sc->sc_p++;
	for (;;) {
		sc_ws(sc);
		if (*sc->sc_p == ']')
			return SCAN_PLAIN;
		if (*sc->sc_p != '{') {
			(void)sc_value(sc, 1);
		} else {
			content = reasoning = NULL;
			sc->sc_p++;
			sc_ws(sc);
			while (*sc->sc_p != '}') {
				(void)sc_member(sc, &key);
				if (content == NULL && key_is(&key, "content"))
					content = sc->sc_p;
				else if (reasoning == NULL &&
				    key_is(&key, "reasoning_content"))
					reasoning = sc->sc_p;
				(void)sc_value(sc, 2);
				sc_ws(sc);
				if (*sc->sc_p == ',') {
					sc->sc_p++;
					sc_ws(sc);
				}
			}
			sc->sc_p++;
			if (content != NULL) {
				struct scan c = { content, sc->sc_end };

				if (lz_blocks(&c, content, lz) != SCAN_PLAIN)
					return SCAN_CJSON;
			}
			if (reasoning != NULL && *reasoning == '"') {
				struct scan r = { reasoning, sc->sc_end };

				(void)sc_string(&r, &js);
				lz_piece(lz, &js, true);
			}
		}
		sc_ws(sc);
		if (*sc->sc_p == ',')
			sc->sc_p++;
	}
}

/*
 * extract_inputs without a parse tree or the routing text, for a plain
 * body: SCAN_PLAIN with *out filled exactly as the full path would, bar
 * ei_json and ei_text (NULL; ei_has_text and ei_size as ever) and the
 * batch fields (1, false); SCAN_CJSON when the body is not plain or its
 * fields need cJSON's reading (then *out is zeroed); -1 out of memory.
 */
static int
lean_inputs(enum extract_endpoint ep, const char *body, size_t len,
    const struct http_request *req, const char *const *routing_key_headers,
    size_t nkeys, bool routing_key_override, struct extract_inputs *out)
{
	struct scan sc = { body, body + len };
	const char *model = NULL, *stream = NULL, *rid = NULL, *text = NULL;
	const char *ids = NULL;
	const char *text_key;
	struct lsize lz = { 0, false };
	struct jstr key, js, text_js;
	size_t keep;

	memset(out, 0, sizeof(*out));
	out->ei_endpoint = ep;
	out->ei_batch_n = 1;
	switch (ep) {
	case EXTRACT_EP_GENERATE:
		text_key = "text";
		break;
	case EXTRACT_EP_COMPLETIONS:
		text_key = "prompt";
		break;
	case EXTRACT_EP_EMBEDDINGS:
	case EXTRACT_EP_CLASSIFY:
		text_key = "input";
		break;
	case EXTRACT_EP_RERANK:
		text_key = "query";
		break;
	case EXTRACT_EP_CHAT:
		text_key = "messages";
		break;
	case EXTRACT_EP_OTHER:
		text_key = NULL;
		break;
	default:
		return SCAN_CJSON;
	}

	/* The whole body once: plain, one object, first of each key kept. */
	sc_ws(&sc);
	if (sc.sc_p == sc.sc_end || *sc.sc_p != '{')
		return SCAN_CJSON;
	sc.sc_p++;
	sc_ws(&sc);
	while (sc.sc_p < sc.sc_end && *sc.sc_p != '}') {
		if (sc_member(&sc, &key) != SCAN_PLAIN)
			return SCAN_CJSON;
		if (model == NULL && key_is(&key, "model"))
			model = sc.sc_p;
		else if (stream == NULL && key_is(&key, "stream"))
			stream = sc.sc_p;
		else if (rid == NULL && key_is(&key, "rid"))
			rid = sc.sc_p;
		else if (text == NULL && text_key != NULL &&
		    key_is(&key, text_key))
			text = sc.sc_p;
		else if (ids == NULL && key_is(&key, "input_ids"))
			ids = sc.sc_p;
		if (sc.sc_p == text && *text == '"') {
			/* The usual prompt: one string, scanned once. */
			if (sc_string(&sc, &text_js) != SCAN_PLAIN)
				return SCAN_CJSON;
		} else if (sc_value(&sc, 1) != SCAN_PLAIN) {
			return SCAN_CJSON;
		}
		sc_ws(&sc);
		if (sc.sc_p < sc.sc_end && *sc.sc_p == ',') {
			sc.sc_p++;
			sc_ws(&sc);
			if (sc.sc_p < sc.sc_end && *sc.sc_p == '}')
				return SCAN_CJSON; /* trailing comma */
		} else if (sc.sc_p < sc.sc_end && *sc.sc_p != '}') {
			return SCAN_CJSON;
		}
	}
	if (sc.sc_p == sc.sc_end)
		return SCAN_CJSON;
	sc.sc_p++;
	sc_ws(&sc);
	if (sc.sc_p != sc.sc_end)
		return SCAN_CJSON;

	/* Wrong types are the full path's errors (422). */
	if ((model != NULL && *model != '"' && *model != 'n') ||
	    (stream != NULL && *stream != 't' && *stream != 'f' &&
	        *stream != 'n'))
		return SCAN_CJSON;
	if (rid != NULL && *rid == '[') {
		sc.sc_p = rid + 1;
		sc_ws(&sc);
		rid = *sc.sc_p == ']' ? NULL : sc.sc_p;
	}
	if (rid != NULL && *rid != '"' && *rid != 'n')
		return SCAN_CJSON;
	/* /generate without text reads input_ids: cJSON's numbers. */
	if (ep == EXTRACT_EP_GENERATE && (text == NULL || *text == 'n') &&
	    ids != NULL)
		return SCAN_CJSON;
	if (ep == EXTRACT_EP_CHAT && text != NULL) {
		/* A content object anywhere: let cJSON judge the body. */
		if (lz_chat(&sc, text, &lz) != SCAN_PLAIN)
			return SCAN_CJSON;
	} else if (text != NULL && *text != 'n') {
		if (ep == EXTRACT_EP_RERANK && *text != '"')
			text = NULL;
		if (text != NULL && *text == '"')
			lz_piece(&lz, &text_js, false);
		else if (text != NULL)
			(void)lz_strings(&sc, text, &lz);
	}

	if (model != NULL && *model == '"') {
		sc.sc_p = model;
		(void)sc_string(&sc, &js);
		if ((out->ei_model = jstr_dup(&js)) == NULL)
			goto oom;
	}
	out->ei_stream = stream != NULL && *stream == 't';
	if (rid != NULL && *rid == '"') {
		sc.sc_p = rid;
		(void)sc_string(&sc, &js);
		if ((out->ei_rid = jstr_dup(&js)) == NULL)
			goto oom;
		keep = extract_strip_lineage(out->ei_rid, strlen(out->ei_rid));
		if (routing_key_override && keep > 0 &&
		    keep <= EXTRACT_KEY_MAX &&
		    (out->ei_rid_key = dup_n(out->ei_rid, keep)) == NULL)
			goto oom;
	}
	if (read_headers(req, routing_key_headers, nkeys, out) == -1)
		goto oom;
	if (out->ei_has_tokens) {
		out->ei_size = out->ei_ntokens;
	} else if (lz.lz_any) {
		out->ei_has_text = true;
		out->ei_size = lz.lz_chars;
	}
	return SCAN_PLAIN;
oom:
	extract_inputs_free(out);
	return -1;
}

/* ------------------------------------------------------------- headers */

static const char *
header_value(const struct http_request *req, const char *name, size_t *len)
{
	const struct http_header *h;

	if (req == NULL || (h = http_request_header(req, name)) == NULL)
		return NULL;
	*len = h->hh_value_len;
	return h->hh_value;
}

static int
read_headers(const struct http_request *req, const char *const *keys,
    size_t nkeys, struct extract_inputs *out)
{
	static const char *const implicit[] = { "authorization",
		"x-forwarded-for", "cookie" };
	const char *v;
	size_t i, len;
	long n;

	if (req == NULL)
		return 0;
	v = header_value(req, "x-smg-routing-tokens", &len);
	if (v != NULL) {
		if ((n = extract_routing_tokens(v, len, &out->ei_tokens)) == -1)
			return -1;
		if (n > 0) {
			out->ei_ntokens = (size_t)n;
			out->ei_has_tokens = true;
			out->ei_tokens_from_header = true;
		}
	}
	for (i = 0; i < nkeys; i++) {
		v = header_value(req, keys[i], &len);
		if (v == NULL || len == 0 || len > EXTRACT_KEY_MAX ||
		    !extract_utf8_valid(v, len))
			continue;
		if ((out->ei_routing_key = dup_n(v, len)) == NULL)
			return -1;
		break;
	}
	v = header_value(req, "x-smg-target-worker", &len);
	if (v != NULL && len > 0 && visible_ascii(v, len)) {
		if ((out->ei_target_worker = dup_n(v, len)) == NULL)
			return -1;
		out->ei_has_target_worker = true;
	}
	for (i = 0; i < sizeof(implicit) / sizeof(implicit[0]); i++) {
		if ((v = header_value(req, implicit[i], &len)) == NULL)
			continue;
		/* Only the first present header counts, valid or not. */
		if (len > 0 && visible_ascii(v, len)) {
			if ((out->ei_implicit_key = dup_n(v, len)) == NULL)
				return -1;
			out->ei_has_implicit_key = true;
		}
		break;
	}
	return 0;
}

/* Visible ASCII, SP and HT: what a header value may be read as text. */
static bool
visible_ascii(const char *s, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (!((s[i] >= 0x20 && s[i] < 0x7f) || s[i] == '\t'))
			return false;
	return true;
}

static char *
dup_n(const char *s, size_t n)
{
	char *p;

	if ((p = malloc(n + 1)) == NULL)
		return NULL;
	memcpy(p, s, n);
	p[n] = '\0';
	return p;
}

static bool
has_suffix(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);

	return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int
fail(int *status, const char **code, char *msg, size_t msglen, int st,
    const char *c, const char *text)
{
	*status = st;
	*code = c;
	if (msglen > 0)
		snprintf(msg, msglen, "%s", text);
	return -1;
}
