/*
 * api.c: the simulated engine's HTTP routes: SGLang/vLLM inference routes
 * (JSON and SSE), metadata, load and metrics endpoints, and the sim
 * control endpoints used by tests, including fault injection.
 *
 * /generate with "return_logprob": true reports meta_info.
 * input_token_logprobs as SGLang does ([logprob, token id, null] per prompt
 * token, the first logprob null), in every streamed event too. A decode
 * worker received the prompt's KV cache from its prefill peer, so it
 * reports only the last prompt token, the one it runs again to start
 * decoding; the gateway prepends the prefill worker's list.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <xxhash.h>

#include "shared/log.h"
#include "shared/xmalloc.h"
#include "tests/simworker/simworker.h"

#define API_DEFAULT_MAX_TOKENS 16
#define API_CHUNK_MAX          2048
#define API_EXTRA_MAX          1024
#define API_VERSION            "0.5.0-sim"

enum api_route {
	API_ROUTE_GENERATE = 0,
	API_ROUTE_COMPLETIONS,
	API_ROUTE_CHAT,
	API_ROUTE_HEALTH_GENERATE,
};

struct api {
	struct ev_loop *a_loop;
	struct api_config a_cfg;
	struct engine *a_engine;
	struct stats *a_stats;
	int a_healthy;
	double a_fail_rate;
	double a_hang_rate;
	double a_close_rate;
	int a_fail_status;
	uint64_t a_rng;
	uint64_t a_next_id;
	long a_started; /* wall clock, for "created" */
	struct pdsim *a_pd; /* PD/EPD role */
	char *a_model_json; /* the model id as a JSON string */
	/* data_parallel_rank of inference requests: counts per rank, the
	 * requests without one (or out of range), the last one (-1 none) */
	uint64_t a_dp_by_rank[SIM_DP_MAX];
	uint64_t a_dp_without;
	long a_dp_last;
	/* gateway probes: GET /health, GET /v1/loads */
	uint64_t a_probe_health;
	uint64_t a_probe_loads;
};

/* One inference request between arrival and its response's end. */
struct api_req {
	struct api *ar_api;
	struct srv_conn *ar_conn;
	struct engine_req *ar_ereq;
	enum api_route ar_route;
	int ar_stream;
	int ar_close; /* fault: drop the connection mid-response */
	long ar_created;
	char ar_id[48];
	char *ar_rid_json; /* /generate "rid" as JSON, or NULL */
	char *ar_itl_json; /* input_token_logprobs as JSON, or NULL */
	char ar_extra[API_EXTRA_MAX];
	/* PD: the bootstrap rendezvous, and what runs once it is over */
	struct pdsim_req ar_pd;
	uint32_t *ar_tok;
	uint32_t ar_ntok;
	uint32_t ar_max_tokens;
	double ar_hold;
};

/* Output tokens: four characters each, like the input tokenizer. */
static const char *const api_words[] = { " the", " sim", " cat", " dog", " sun",
	" red", " big", " one" };

static double api_rand(struct api *);
static void api_reply_json(struct api *, struct srv_conn *,
    const struct srv_request *, int, cJSON *);
static void api_error(struct api *, struct srv_conn *,
    const struct srv_request *, int, const char *);
static void api_extra(const struct api *, const struct srv_request *, char *,
    size_t);
static const char *api_word(uint32_t);
static char *api_text(uint32_t);
static uint32_t *api_tokenize(const char *, size_t, uint32_t *);
static int api_token_ids(const cJSON *, uint32_t **, uint32_t *);
static char *api_chat_prompt(const cJSON *);
static int api_max_tokens(const cJSON *, const char *, uint32_t *);
static char *api_input_logprobs(const uint32_t *, uint32_t, uint32_t);
static void api_infer(struct api *, struct srv_conn *,
    const struct srv_request *, enum api_route);
static void api_health_generate(struct api *, struct srv_conn *,
    const struct srv_request *);
static int api_token_cb(void *, const struct engine_info *);
static void api_done_cb(void *, const struct engine_info *);
static void api_req_free(struct api_req *);
static void api_run(void *, int);
static void api_stream_event(struct api_req *, const struct engine_info *);
static cJSON *api_usage(const struct engine_info *);
static cJSON *api_result(struct api_req *, const struct engine_info *);
static void api_models(struct api *, struct srv_conn *,
    const struct srv_request *);
static void api_model_info(struct api *, struct srv_conn *,
    const struct srv_request *);
static void api_note_dp_rank(struct api *, const cJSON *);
static void api_server_info(struct api *, struct srv_conn *,
    const struct srv_request *);
static void api_loads(struct api *, struct srv_conn *,
    const struct srv_request *);
static void api_metrics(struct api *, struct srv_conn *,
    const struct srv_request *);
static void api_flush(struct api *, struct srv_conn *,
    const struct srv_request *);
static void api_control(struct api *, struct srv_conn *,
    const struct srv_request *);
static void api_profile(struct api *, struct srv_conn *,
    const struct srv_request *);
static void api_transcribe(struct api *, struct srv_conn *,
    const struct srv_request *);
static cJSON *api_control_state(const struct api *);
static void api_sim_stats(struct api *, struct srv_conn *,
    const struct srv_request *);

struct api *
api_new(struct ev_loop *loop, const struct api_config *cfg, struct engine *e,
    struct stats *st)
{
	struct api *a;
	cJSON *s;

	a = xcalloc(1, sizeof(*a));
	a->a_loop = loop;
	a->a_cfg = *cfg;
	a->a_engine = e;
	a->a_stats = st;
	a->a_healthy = 1;
	a->a_fail_rate = cfg->ac_fail_rate;
	a->a_hang_rate = cfg->ac_hang_rate;
	a->a_close_rate = cfg->ac_close_rate;
	a->a_fail_status = cfg->ac_fail_status;
	a->a_rng = cfg->ac_seed ? cfg->ac_seed : 0x9e3779b97f4a7c15ULL;
	a->a_started = (long)time(NULL);
	a->a_dp_last = -1;
	a->a_pd = pdsim_new(loop, cfg->ac_role,
	    cfg->ac_host != NULL ? cfg->ac_host : "127.0.0.1",
	    cfg->ac_bootstrap_port, cfg->ac_bootstrap_dir,
	    cfg->ac_bootstrap_timeout);
	if ((s = cJSON_CreateString(cfg->ac_model)) == NULL ||
	    (a->a_model_json = cJSON_PrintUnformatted(s)) == NULL)
		fatalx("%s: out of memory", __func__);
	cJSON_Delete(s);
	return a;
}

void
api_free(struct api *a)
{
	if (a == NULL)
		return;
	cJSON_free(a->a_model_json);
	pdsim_free(a->a_pd);
	free(a);
}

/* xorshift64*: fault decisions, reproducible with --seed. */
static double
api_rand(struct api *a)
{
	a->a_rng ^= a->a_rng >> 12;
	a->a_rng ^= a->a_rng << 25;
	a->a_rng ^= a->a_rng >> 27;
	return (double)((a->a_rng * 0x2545f4914f6cdd1dULL) >> 11) * 0x1p-53;
}

/* Header lines every response carries: worker id, echoed routing hints. */
static void
api_extra(const struct api *a, const struct srv_request *req, char *buf,
    size_t size)
{
	const char *names[2] = { "x-sim-routing-key", "x-sim-request-id" };
	const char *vals[2] = { req->sr_routing_key, req->sr_request_id };
	size_t len;
	int i, n;
	char *p;

	n = snprintf(buf, size, "x-sim-worker: %s\r\n", a->a_cfg.ac_worker_id);
	len = n > 0 && (size_t)n < size ? (size_t)n : 0;
	buf[len] = '\0';
	for (i = 0; i < 2; i++) {
		if (vals[i] == NULL)
			continue;
		n = snprintf(buf + len, size - len, "%s: %.512s\r\n", names[i],
		    vals[i]);
		if (n < 0 || (size_t)n >= size - len) {
			buf[len] = '\0';
			break;
		}
		/* Nothing the client sent may end the header line early. */
		for (p = buf + len + strlen(names[i]) + 2;
		     p < buf + len + n - 2; p++)
			if ((unsigned char)*p < 0x20 && *p != '\t')
				*p = ' ';
		len += (size_t)n;
	}
}

static void
api_reply_json(struct api *a, struct srv_conn *conn,
    const struct srv_request *req, int status, cJSON *body)
{
	char extra[API_EXTRA_MAX];
	char *s;

	api_extra(a, req, extra, sizeof(extra));
	if (body == NULL || (s = cJSON_PrintUnformatted(body)) == NULL) {
		cJSON_Delete(body);
		srv_respond(conn, 503, "application/json", extra,
		    "{\"error\":\"out of memory\"}", 25);
		return;
	}
	srv_respond(conn, status, "application/json", extra, s, strlen(s));
	cJSON_free(s);
	cJSON_Delete(body);
}

/* The OpenAI-style error body vLLM and SGLang answer with. */
static void
api_error(struct api *a, struct srv_conn *conn, const struct srv_request *req,
    int status, const char *msg)
{
	cJSON *o;

	o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "object", "error");
	cJSON_AddStringToObject(o, "message", msg);
	cJSON_AddStringToObject(o, "type",
	    status == 404      ? "NotFoundError"
	        : status < 500 ? "BadRequestError"
	                       : "InternalServerError");
	cJSON_AddNullToObject(o, "param");
	cJSON_AddNumberToObject(o, "code", status);
	api_reply_json(a, conn, req, status, o);
}

static const char *
api_word(uint32_t i)
{
	return api_words[(i * 5 + 3) %
	    (sizeof(api_words) / sizeof(*api_words))];
}

/* The text of output tokens 1 .. n; NULL on allocation failure. */
static char *
api_text(uint32_t n)
{
	char *s, *p;
	uint32_t i;

	if ((s = malloc((size_t)n * 4 + 1)) == NULL)
		return NULL;
	for (i = 1, p = s; i <= n; i++, p += 4)
		memcpy(p, api_word(i), 4);
	*p = '\0';
	return s;
}

/* One token per 4 characters, its id a hash of them; NULL on ENOMEM. */
static uint32_t *
api_tokenize(const char *s, size_t len, uint32_t *n)
{
	uint32_t *t;
	size_t i, k;

	*n = (uint32_t)((len + 3) / 4);
	if ((t = malloc(((size_t)*n + 1) * sizeof(*t))) == NULL)
		return NULL;
	for (i = 0, k = 0; i < len; i += 4, k++)
		t[k] =
		    (uint32_t)(XXH3_64bits(s + i, len - i < 4 ? len - i : 4) &
		        0x7fffffff);
	return t;
}

/* An array of token ids; -1 if it is not one. */
static int
api_token_ids(const cJSON *arr, uint32_t **out, uint32_t *n)
{
	const cJSON *it;
	uint32_t *t, k = 0;
	int size;

	size = cJSON_GetArraySize(arr);
	if (size <= 0 || (t = malloc((size_t)size * sizeof(*t))) == NULL)
		return -1;
	cJSON_ArrayForEach(it, arr)
	{
		if (!cJSON_IsNumber(it) || it->valuedouble < 0 ||
		    it->valuedouble > 2147483647.0 ||
		    it->valuedouble != floor(it->valuedouble)) {
			free(t);
			return -1;
		}
		t[k++] = (uint32_t)it->valuedouble;
	}
	*out = t;
	*n = k;
	return 0;
}

/* Flattens chat messages into one prompt, a stand-in chat template. */
static char *
api_chat_prompt(const cJSON *msgs)
{
	const cJSON *m, *role, *content, *part, *text;
	size_t len = 0, need;
	char *s = NULL, *p = NULL;
	int pass;

	if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
		return NULL;
	/* Pass 0 validates and measures, pass 1 copies. */
	for (pass = 0; pass < 2; pass++) {
		if (pass == 1) {
			if ((s = malloc(len + 1)) == NULL)
				return NULL;
			p = s;
		}
		len = 0;
		cJSON_ArrayForEach(m, msgs)
		{
			role = cJSON_GetObjectItemCaseSensitive(m, "role");
			content =
			    cJSON_GetObjectItemCaseSensitive(m, "content");
			if (!cJSON_IsObject(m) || !cJSON_IsString(role))
				goto bad;
			need = strlen(role->valuestring) + 5;
			if (pass == 1)
				p += sprintf(p, "<|%s|>\n", role->valuestring);
			len += need;
			if (cJSON_IsString(content)) {
				need = strlen(content->valuestring);
				if (pass == 1) {
					memcpy(p, content->valuestring, need);
					p += need;
				}
				len += need;
			} else if (cJSON_IsArray(content)) {
				cJSON_ArrayForEach(part, content)
				{
					text = cJSON_GetObjectItemCaseSensitive(
					    part, "text");
					if (!cJSON_IsString(text))
						continue;
					need = strlen(text->valuestring);
					if (pass == 1) {
						memcpy(p, text->valuestring,
						    need);
						p += need;
					}
					len += need;
				}
			} else if (!cJSON_IsNull(content) && content != NULL) {
				goto bad;
			}
			if (pass == 1)
				*p++ = '\n';
			len++;
		}
	}
	*p = '\0';
	return s;
bad:
	if (pass == 1)
		free(s);
	return NULL;
}

/* Reads a max-tokens field; absent or null keeps *out. -1 if invalid. */
static int
api_max_tokens(const cJSON *obj, const char *name, uint32_t *out)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);

	if (v == NULL || cJSON_IsNull(v))
		return 0;
	if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 1e9 ||
	    v->valuedouble != floor(v->valuedouble))
		return -1;
	*out = (uint32_t)v->valuedouble;
	return 0;
}

/*
 * SGLang's input_token_logprobs for prompt tokens [first, n): a list of
 * [logprob, token id, null], the logprob a function of the token id (and
 * null for the prompt's first token, which has no context). NULL on ENOMEM.
 */
static char *
api_input_logprobs(const uint32_t *tok, uint32_t n, uint32_t first)
{
	cJSON *a, *e;
	char *s;
	uint32_t i;

	if ((a = cJSON_CreateArray()) == NULL)
		return NULL;
	for (i = first; i < n; i++) {
		if ((e = cJSON_CreateArray()) == NULL ||
		    !cJSON_AddItemToArray(a, e)) {
			cJSON_Delete(e);
			cJSON_Delete(a);
			return NULL;
		}
		if (i == 0)
			cJSON_AddItemToArray(e, cJSON_CreateNull());
		else
			cJSON_AddItemToArray(e,
			    cJSON_CreateNumber(
			        -(double)(tok[i] % 997 + 1) / 128.0));
		cJSON_AddItemToArray(e, cJSON_CreateNumber((double)tok[i]));
		cJSON_AddItemToArray(e, cJSON_CreateNull());
	}
	s = cJSON_PrintUnformatted(a);
	cJSON_Delete(a);
	return s;
}

void
api_request(void *arg, struct srv_conn *conn, const struct srv_request *req)
{
	struct api *a = arg;
	const char *path = req->sr_path, *m = req->sr_method;
	int get = strcmp(m, "GET") == 0, post = strcmp(m, "POST") == 0;
	int sglang = a->a_cfg.ac_engine == SIM_ENGINE_SGLANG;
	char extra[API_EXTRA_MAX];

	if (ev_now(a->a_loop) < a->a_cfg.ac_ready_at) {
		api_error(a, conn, req, 503, "the engine is starting");
		return;
	}
	if (strcmp(path, "/health") == 0 && get) {
		a->a_probe_health++;
		api_extra(a, req, extra, sizeof(extra));
		srv_respond(conn, a->a_healthy ? 200 : 503, "text/plain", extra,
		    "", 0);
	} else if (strcmp(path, "/health_generate") == 0 && get) {
		api_health_generate(a, conn, req);
	} else if (strcmp(path, "/generate") == 0 && post) {
		api_infer(a, conn, req, API_ROUTE_GENERATE);
	} else if (strcmp(path, "/v1/completions") == 0 && post) {
		api_infer(a, conn, req, API_ROUTE_COMPLETIONS);
	} else if (strcmp(path, "/v1/chat/completions") == 0 && post) {
		api_infer(a, conn, req, API_ROUTE_CHAT);
	} else if (strcmp(path, "/v1/models") == 0 && get) {
		api_models(a, conn, req);
	} else if ((strcmp(path, "/get_model_info") == 0 ||
	               (sglang && strcmp(path, "/model_info") == 0)) &&
	    get) {
		api_model_info(a, conn, req);
	} else if ((strcmp(path, "/get_server_info") == 0 ||
	               (sglang && strcmp(path, "/server_info") == 0)) &&
	    get) {
		api_server_info(a, conn, req);
	} else if (!sglang && strcmp(path, "/version") == 0 && get) {
		api_reply_json(a, conn, req, 200,
		    cJSON_Parse("{\"version\":\"" API_VERSION "\"}"));
	} else if (strcmp(path, "/v1/loads") == 0 && get) {
		a->a_probe_loads++;
		if (a->a_cfg.ac_no_loads)
			api_error(a, conn, req, 404, "Not Found");
		else
			api_loads(a, conn, req);
	} else if (strcmp(path, "/metrics") == 0 && get) {
		api_metrics(a, conn, req);
	} else if (strcmp(path, "/flush_cache") == 0 && (get || post)) {
		api_flush(a, conn, req);
	} else if ((strcmp(path, "/start_profile") == 0 ||
	               strcmp(path, "/stop_profile") == 0) &&
	    post) {
		api_profile(a, conn, req);
	} else if (strcmp(path, "/v1/audio/transcriptions") == 0 && post) {
		api_transcribe(a, conn, req);
	} else if (strcmp(path, "/sim/control") == 0 && post) {
		api_control(a, conn, req);
	} else if (strcmp(path, "/sim/control") == 0 && get) {
		api_reply_json(a, conn, req, 200, api_control_state(a));
	} else if (strcmp(path, "/sim/stats") == 0 && get) {
		api_sim_stats(a, conn, req);
	} else if (strcmp(path, "/sim/reset_stats") == 0 && post) {
		stats_reset(a->a_stats);
		memset(a->a_dp_by_rank, 0, sizeof(a->a_dp_by_rank));
		a->a_dp_without = 0;
		a->a_dp_last = -1;
		api_reply_json(a, conn, req, 200,
		    cJSON_Parse("{\"success\":true}"));
	} else {
		api_error(a, conn, req, 404, "Not Found");
	}
}

void
api_abort(void *arg, void *ctx)
{
	struct api *a = arg;
	struct api_req *r = ctx;

	if (r->ar_ereq != NULL)
		engine_cancel(a->a_engine, r->ar_ereq);
	pdsim_cancel(&r->ar_pd);
	api_req_free(r);
}

static void
api_req_free(struct api_req *r)
{
	if (r == NULL)
		return;
	cJSON_free(r->ar_rid_json);
	cJSON_free(r->ar_itl_json);
	free(r->ar_tok);
	free(r);
}

static void
api_health_generate(struct api *a, struct srv_conn *conn,
    const struct srv_request *req)
{
	struct api_req *r;
	uint32_t *tok;

	if (!a->a_healthy) {
		api_error(a, conn, req, 503, "unhealthy");
		return;
	}
	if ((r = calloc(1, sizeof(*r))) == NULL ||
	    (tok = calloc(1, sizeof(*tok))) == NULL) {
		free(r);
		api_error(a, conn, req, 503, "out of memory");
		return;
	}
	r->ar_api = a;
	r->ar_conn = conn;
	r->ar_route = API_ROUTE_HEALTH_GENERATE;
	api_extra(a, req, r->ar_extra, sizeof(r->ar_extra));
	r->ar_ereq = engine_submit(a->a_engine, tok, 1, 1, 0, api_token_cb,
	    api_done_cb, r);
	if (r->ar_ereq == NULL) {
		free(r);
		api_error(a, conn, req, 503, "out of memory");
		return;
	}
	srv_set_ctx(conn, r);
}

/* Parses an inference request, applies faults, queues it in the engine. */
static void
api_infer(struct api *a, struct srv_conn *conn, const struct srv_request *req,
    enum api_route route)
{
	const cJSON *v, *sp;
	struct engine_stats es;
	cJSON *body;
	struct api_req *r = NULL;
	uint32_t *tok = NULL, ntok = 0, max_tokens = API_DEFAULT_MAX_TOKENS;
	double hold = 0;
	char *prompt, msg[256];
	const char *err = NULL;
	int stream = 0, logprob = 0;

	stats_count_route(a->a_stats, (enum stats_route)route);
	body = cJSON_ParseWithLength(req->sr_body, req->sr_body_len);
	if (body == NULL || !cJSON_IsObject(body)) {
		err = "The request body is not a valid JSON object";
		goto bad;
	}
	v = cJSON_GetObjectItemCaseSensitive(body, "stream");
	if (v != NULL && !cJSON_IsBool(v) && !cJSON_IsNull(v)) {
		err = "stream must be a boolean";
		goto bad;
	}
	stream = cJSON_IsTrue(v);
	v = cJSON_GetObjectItemCaseSensitive(body, "model");
	if (a->a_cfg.ac_strict_model && cJSON_IsString(v) &&
	    strcmp(v->valuestring, a->a_cfg.ac_model) != 0) {
		snprintf(msg, sizeof(msg), "The model `%.200s` does not exist.",
		    v->valuestring);
		cJSON_Delete(body);
		api_error(a, conn, req, 404, msg);
		return;
	}
	api_note_dp_rank(a, body);
	v = cJSON_GetObjectItemCaseSensitive(body, "sim_hold_ms");
	if (v != NULL) {
		if (!cJSON_IsNumber(v) || v->valuedouble < 0 ||
		    v->valuedouble > 3.6e6) {
			err = "sim_hold_ms must be a number of milliseconds";
			goto bad;
		}
		hold = v->valuedouble / 1000.0;
	}
	switch (route) {
	case API_ROUTE_GENERATE:
		sp = cJSON_GetObjectItemCaseSensitive(body, "sampling_params");
		if (sp != NULL && !cJSON_IsObject(sp) && !cJSON_IsNull(sp)) {
			err = "sampling_params must be an object";
			goto bad;
		}
		if (cJSON_IsObject(sp) &&
		    api_max_tokens(sp, "max_new_tokens", &max_tokens) == -1) {
			err = "max_new_tokens must be a positive integer";
			goto bad;
		}
		v = cJSON_GetObjectItemCaseSensitive(body, "return_logprob");
		if (v != NULL && !cJSON_IsBool(v) && !cJSON_IsNull(v)) {
			err = "return_logprob must be a boolean";
			goto bad;
		}
		logprob = cJSON_IsTrue(v);
		v = cJSON_GetObjectItemCaseSensitive(body, "input_ids");
		if (v != NULL && !cJSON_IsNull(v)) {
			if (!cJSON_IsArray(v) ||
			    api_token_ids(v, &tok, &ntok) == -1) {
				err = "input_ids must be a non-empty list of "
				      "token ids (batches are not supported)";
				goto bad;
			}
		} else if (cJSON_IsString(v = cJSON_GetObjectItemCaseSensitive(
		                              body, "text"))) {
			tok = api_tokenize(v->valuestring,
			    strlen(v->valuestring), &ntok);
		} else {
			err = "Either text or input_ids must be given (batches "
			      "are not supported)";
			goto bad;
		}
		break;
	case API_ROUTE_COMPLETIONS:
		if (api_max_tokens(body, "max_tokens", &max_tokens) == -1) {
			err = "max_tokens must be a positive integer";
			goto bad;
		}
		v = cJSON_GetObjectItemCaseSensitive(body, "prompt");
		if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 &&
		    cJSON_IsString(cJSON_GetArrayItem(v, 0)))
			v = cJSON_GetArrayItem(v, 0);
		if (cJSON_IsString(v)) {
			tok = api_tokenize(v->valuestring,
			    strlen(v->valuestring), &ntok);
		} else if (!cJSON_IsArray(v) ||
		    api_token_ids(v, &tok, &ntok) == -1) {
			err = "prompt must be a string or a list of token ids "
			      "(batches are not supported)";
			goto bad;
		}
		break;
	case API_ROUTE_CHAT:
		if (api_max_tokens(body, "max_tokens", &max_tokens) == -1 ||
		    api_max_tokens(body, "max_completion_tokens",
		        &max_tokens) == -1) {
			err = "max_tokens must be a positive integer";
			goto bad;
		}
		prompt = api_chat_prompt(
		    cJSON_GetObjectItemCaseSensitive(body, "messages"));
		if (prompt == NULL) {
			err = "messages must be a non-empty list of messages "
			      "with a role and a content";
			goto bad;
		}
		tok = api_tokenize(prompt, strlen(prompt), &ntok);
		free(prompt);
		break;
	case API_ROUTE_HEALTH_GENERATE:
		break;
	}
	if (tok == NULL) {
		cJSON_Delete(body);
		api_error(a, conn, req, 503, "out of memory");
		return;
	}
	if (ntok == 0) {
		err = "The prompt is empty";
		goto bad;
	}
	if ((uint64_t)ntok + max_tokens > a->a_cfg.ac_context_length) {
		snprintf(msg, sizeof(msg),
		    "This model's maximum context length is %u tokens. "
		    "However, you requested %llu tokens (%u in the input, "
		    "%u for the completion).",
		    a->a_cfg.ac_context_length,
		    (unsigned long long)ntok + max_tokens, ntok, max_tokens);
		err = msg;
		goto bad;
	}
	engine_get_stats(a->a_engine, &es);
	if ((uint64_t)ntok + max_tokens > es.es_capacity_tokens) {
		err = "The request does not fit in the KV cache";
		goto bad;
	}
	if ((r = calloc(1, sizeof(*r))) == NULL) {
		free(tok);
		cJSON_Delete(body);
		api_error(a, conn, req, 503, "out of memory");
		return;
	}
	r->ar_api = a;
	r->ar_conn = conn;
	r->ar_route = route;
	r->ar_stream = stream;
	r->ar_created = (long)time(NULL);
	snprintf(r->ar_id, sizeof(r->ar_id), "%s%lx%06llx",
	    route == API_ROUTE_CHAT ? "chatcmpl-" : "cmpl-", a->a_started,
	    (unsigned long long)a->a_next_id++);
	v = cJSON_GetObjectItemCaseSensitive(body, "rid");
	if (route == API_ROUTE_GENERATE && cJSON_IsString(v))
		r->ar_rid_json = cJSON_PrintUnformatted(v);
	if (logprob &&
	    (r->ar_itl_json = api_input_logprobs(tok, ntok,
	         pdsim_role(a->a_pd) == SIM_ROLE_DECODE ? ntok - 1 : 0)) ==
	        NULL) {
		free(tok);
		api_req_free(r);
		cJSON_Delete(body);
		api_error(a, conn, req, 503, "out of memory");
		return;
	}
	if (pdsim_parse(a->a_pd, req->sr_body, req->sr_body_len, body,
	        &r->ar_pd) == -1) {
		api_req_free(r);
		err = "a decode request needs bootstrap_host, bootstrap_port "
		      "and bootstrap_room";
		goto bad;
	}
	/* A prefill or encode worker computes the prompt and one token. */
	if (pdsim_role(a->a_pd) == SIM_ROLE_PREFILL ||
	    pdsim_role(a->a_pd) == SIM_ROLE_ENCODE)
		max_tokens = 1;
	cJSON_Delete(body);
	body = NULL;
	api_extra(a, req, r->ar_extra, sizeof(r->ar_extra));

	if (api_rand(a) < a->a_fail_rate) {
		stats_count_fault(a->a_stats, "failed");
		free(tok);
		api_req_free(r);
		api_error(a, conn, req, a->a_fail_status, "injected failure");
		return;
	}
	if (api_rand(a) < a->a_hang_rate) {
		/* Never answered; freed when the client goes away. */
		stats_count_fault(a->a_stats, "hung");
		free(tok);
		srv_set_ctx(conn, r);
		return;
	}
	if (api_rand(a) < a->a_close_rate) {
		stats_count_fault(a->a_stats, "closed");
		r->ar_close = 1;
	}
	r->ar_tok = tok;
	r->ar_ntok = ntok;
	r->ar_max_tokens = max_tokens;
	r->ar_hold = hold;
	srv_set_ctx(conn, r);
	/* Decode: the KV cache of the prompt must arrive first. */
	if (pdsim_wait(&r->ar_pd, api_run, r) == 0)
		api_run(r, 1);
	return;
bad:
	free(tok);
	cJSON_Delete(body);
	stats_count_fault(a->a_stats, "rejected");
	api_error(a, conn, req, 400, err);
}

/* Runs a request in the engine (ok 0: its bootstrap transfer failed). */
static void
api_run(void *arg, int ok)
{
	struct api_req *r = arg;
	struct api *a = r->ar_api;
	char msg[PDSIM_KEY_MAX + 64], *s;
	cJSON *o;

	if (!ok) {
		snprintf(msg, sizeof(msg),
		    "KV transfer failed: room %s did not arrive",
		    r->ar_pd.pq_wait);
		o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "object", "error");
		cJSON_AddStringToObject(o, "message", msg);
		cJSON_AddStringToObject(o, "type", "InternalServerError");
		cJSON_AddNumberToObject(o, "code", 500);
		s = cJSON_PrintUnformatted(o);
		srv_respond(r->ar_conn, 500, "application/json", r->ar_extra,
		    s != NULL ? s : "{}", s != NULL ? strlen(s) : 2);
		cJSON_free(s);
		cJSON_Delete(o);
		api_req_free(r);
		return;
	}
	r->ar_ereq = engine_submit(a->a_engine, r->ar_tok, r->ar_ntok,
	    r->ar_max_tokens, r->ar_hold, api_token_cb, api_done_cb, r);
	r->ar_tok = NULL; /* the engine took it */
	if (r->ar_ereq == NULL) {
		srv_respond(r->ar_conn, 503, "application/json", r->ar_extra,
		    "{\"error\":\"out of memory\"}", 25);
		api_req_free(r);
		return;
	}
	if (r->ar_stream)
		srv_stream_begin(r->ar_conn, 200, "text/event-stream",
		    r->ar_extra);
}

/* One SSE event for the token just generated. */
static void
api_stream_event(struct api_req *r, const struct engine_info *info)
{
	struct api *a = r->ar_api;
	int last = info->ei_output_tokens >= info->ei_max_tokens;
	const char *fin = last ? "\"length\"" : "null";
	char buf[API_CHUNK_MAX], fr[64], *text, *big;
	size_t size;
	int n;

	switch (r->ar_route) {
	case API_ROUTE_COMPLETIONS:
		n = snprintf(buf, sizeof(buf),
		    "data: {\"id\":\"%s\",\"object\":\"text_completion\","
		    "\"created\":%ld,\"model\":%s,\"choices\":[{\"index\":0,"
		    "\"text\":\"%s\",\"logprobs\":null,\"finish_reason\":%s}]}"
		    "\n\n",
		    r->ar_id, r->ar_created, a->a_model_json,
		    api_word(info->ei_output_tokens), fin);
		break;
	case API_ROUTE_CHAT:
		n = snprintf(buf, sizeof(buf),
		    "data: {\"id\":\"%s\",\"object\":\"chat.completion.chunk\","
		    "\"created\":%ld,\"model\":%s,\"choices\":[{\"index\":0,"
		    "\"delta\":{%s\"content\":\"%s\"},\"logprobs\":null,"
		    "\"finish_reason\":%s}]}\n\n",
		    r->ar_id, r->ar_created, a->a_model_json,
		    info->ei_output_tokens == 1 ? "\"role\":\"assistant\","
		                                : "",
		    api_word(info->ei_output_tokens), fin);
		break;
	case API_ROUTE_GENERATE:
		/* SGLang streams the text so far in every event. */
		if ((text = api_text(info->ei_output_tokens)) == NULL)
			return;
		size = strlen(text) + 512 +
		    (r->ar_itl_json != NULL ? strlen(r->ar_itl_json) : 0);
		if ((big = malloc(size)) == NULL) {
			free(text);
			return;
		}
		if (last)
			snprintf(fr, sizeof(fr),
			    "{\"type\":\"length\",\"length\":%u}",
			    info->ei_output_tokens);
		else
			snprintf(fr, sizeof(fr), "null");
		n = snprintf(big, size,
		    "data: {\"text\":\"%s\",\"meta_info\":{\"id\":%s%s%s,"
		    "\"finish_reason\":%s,\"prompt_tokens\":%u,"
		    "\"completion_tokens\":%u,\"cached_tokens\":%u%s%s}}\n\n",
		    text, r->ar_rid_json ? "" : "\"",
		    r->ar_rid_json ? r->ar_rid_json : r->ar_id,
		    r->ar_rid_json ? "" : "\"", fr, info->ei_prompt_tokens,
		    info->ei_output_tokens, info->ei_cached_tokens,
		    r->ar_itl_json != NULL ? ",\"input_token_logprobs\":" : "",
		    r->ar_itl_json != NULL ? r->ar_itl_json : "");
		if (n > 0 && (size_t)n < size)
			srv_stream_write(r->ar_conn, big, (size_t)n);
		free(text);
		free(big);
		return;
	default:
		return;
	}
	if (n > 0 && (size_t)n < sizeof(buf))
		srv_stream_write(r->ar_conn, buf, (size_t)n);
}

static int
api_token_cb(void *arg, const struct engine_info *info)
{
	struct api_req *r = arg;

	if (!r->ar_stream)
		return 0;
	api_stream_event(r, info);
	if (r->ar_close) {
		/* The fault: the stream ends without its last events. */
		srv_drop(r->ar_conn);
		api_req_free(r);
		return -1;
	}
	return 0;
}

static cJSON *
api_usage(const struct engine_info *info)
{
	cJSON *u, *d;

	u = cJSON_CreateObject();
	cJSON_AddNumberToObject(u, "prompt_tokens", info->ei_prompt_tokens);
	cJSON_AddNumberToObject(u, "completion_tokens", info->ei_output_tokens);
	cJSON_AddNumberToObject(u, "total_tokens",
	    (double)info->ei_prompt_tokens + info->ei_output_tokens);
	d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
	cJSON_AddNumberToObject(d, "cached_tokens", info->ei_cached_tokens);
	return u;
}

/* The non-streaming response body of a finished request. */
static cJSON *
api_result(struct api_req *r, const struct engine_info *info)
{
	struct api *a = r->ar_api;
	cJSON *o, *ch, *c, *m, *fr;
	char *text;

	if ((text = api_text(info->ei_output_tokens)) == NULL)
		return NULL;
	o = cJSON_CreateObject();
	if (r->ar_route == API_ROUTE_GENERATE) {
		cJSON_AddStringToObject(o, "text", text);
		m = cJSON_AddObjectToObject(o, "meta_info");
		if (r->ar_rid_json != NULL)
			cJSON_AddItemToObject(m, "id",
			    cJSON_Parse(r->ar_rid_json));
		else
			cJSON_AddStringToObject(m, "id", r->ar_id);
		fr = cJSON_AddObjectToObject(m, "finish_reason");
		cJSON_AddStringToObject(fr, "type", "length");
		cJSON_AddNumberToObject(fr, "length", info->ei_output_tokens);
		cJSON_AddNumberToObject(m, "prompt_tokens",
		    info->ei_prompt_tokens);
		cJSON_AddNumberToObject(m, "completion_tokens",
		    info->ei_output_tokens);
		cJSON_AddNumberToObject(m, "cached_tokens",
		    info->ei_cached_tokens);
		cJSON_AddNumberToObject(m, "e2e_latency",
		    ev_now(a->a_loop) - info->ei_arrival);
		if (r->ar_itl_json != NULL)
			cJSON_AddItemToObject(m, "input_token_logprobs",
			    cJSON_Parse(r->ar_itl_json));
		free(text);
		return o;
	}
	cJSON_AddStringToObject(o, "id", r->ar_id);
	cJSON_AddStringToObject(o, "object",
	    r->ar_route == API_ROUTE_CHAT ? "chat.completion"
	                                  : "text_completion");
	cJSON_AddNumberToObject(o, "created", (double)r->ar_created);
	cJSON_AddStringToObject(o, "model", a->a_cfg.ac_model);
	ch = cJSON_AddArrayToObject(o, "choices");
	c = cJSON_CreateObject();
	cJSON_AddItemToArray(ch, c);
	cJSON_AddNumberToObject(c, "index", 0);
	if (r->ar_route == API_ROUTE_CHAT) {
		m = cJSON_AddObjectToObject(c, "message");
		cJSON_AddStringToObject(m, "role", "assistant");
		cJSON_AddStringToObject(m, "content", text);
	} else {
		cJSON_AddStringToObject(c, "text", text);
	}
	cJSON_AddNullToObject(c, "logprobs");
	cJSON_AddStringToObject(c, "finish_reason", "length");
	cJSON_AddItemToObject(o, "usage", api_usage(info));
	free(text);
	return o;
}

static void
api_done_cb(void *arg, const struct engine_info *info)
{
	struct api_req *r = arg;
	struct api *a = r->ar_api;
	double now = ev_now(a->a_loop);
	cJSON *o;
	char *s;
	int n;

	if (r->ar_route == API_ROUTE_HEALTH_GENERATE) {
		srv_respond(r->ar_conn, 200, "text/plain", r->ar_extra, "", 0);
		api_req_free(r);
		return;
	}
	pdsim_publish(&r->ar_pd);
	stats_record(a->a_stats, info->ei_prompt_tokens, info->ei_cached_tokens,
	    (info->ei_first_token - info->ei_arrival) * 1000.0,
	    (now - info->ei_arrival) * 1000.0);
	if (r->ar_stream) {
		if (r->ar_route != API_ROUTE_GENERATE) {
			o = cJSON_CreateObject();
			cJSON_AddStringToObject(o, "id", r->ar_id);
			cJSON_AddStringToObject(o, "object",
			    r->ar_route == API_ROUTE_CHAT
			        ? "chat.completion.chunk"
			        : "text_completion");
			cJSON_AddNumberToObject(o, "created",
			    (double)r->ar_created);
			cJSON_AddStringToObject(o, "model", a->a_cfg.ac_model);
			cJSON_AddArrayToObject(o, "choices");
			cJSON_AddItemToObject(o, "usage", api_usage(info));
			if ((s = cJSON_PrintUnformatted(o)) != NULL) {
				srv_stream_write(r->ar_conn, "data: ", 6);
				srv_stream_write(r->ar_conn, s, strlen(s));
				srv_stream_write(r->ar_conn, "\n\n", 2);
				cJSON_free(s);
			}
			cJSON_Delete(o);
		}
		srv_stream_write(r->ar_conn, "data: [DONE]\n\n", 14);
		srv_stream_end(r->ar_conn);
		api_req_free(r);
		return;
	}
	o = api_result(r, info);
	if (o == NULL || (s = cJSON_PrintUnformatted(o)) == NULL) {
		cJSON_Delete(o);
		srv_respond(r->ar_conn, 503, "application/json", r->ar_extra,
		    "{\"error\":\"out of memory\"}", 25);
		api_req_free(r);
		return;
	}
	cJSON_Delete(o);
	if (r->ar_close) {
		/* The fault: the body stops half way. */
		char head[API_EXTRA_MAX + 256];

		n = snprintf(head, sizeof(head),
		    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
		    "Content-Length: %zu\r\n%s\r\n",
		    strlen(s), r->ar_extra);
		if (n > 0 && (size_t)n < sizeof(head))
			srv_write_raw(r->ar_conn, head, (size_t)n);
		srv_write_raw(r->ar_conn, s, strlen(s) / 2);
		srv_drop(r->ar_conn);
	} else {
		srv_respond(r->ar_conn, 200, "application/json", r->ar_extra, s,
		    strlen(s));
	}
	cJSON_free(s);
	api_req_free(r);
}

static void
api_models(struct api *a, struct srv_conn *conn, const struct srv_request *req)
{
	cJSON *o, *d, *m;

	o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "object", "list");
	d = cJSON_AddArrayToObject(o, "data");
	m = cJSON_CreateObject();
	cJSON_AddItemToArray(d, m);
	cJSON_AddStringToObject(m, "id", a->a_cfg.ac_model);
	cJSON_AddStringToObject(m, "object", "model");
	cJSON_AddNumberToObject(m, "created", (double)a->a_started);
	cJSON_AddStringToObject(m, "owned_by",
	    a->a_cfg.ac_engine == SIM_ENGINE_SGLANG ? "sglang" : "vllm");
	cJSON_AddStringToObject(m, "root", a->a_cfg.ac_model);
	cJSON_AddNumberToObject(m, "max_model_len", a->a_cfg.ac_context_length);
	api_reply_json(a, conn, req, 200, o);
}

static void
api_model_info(struct api *a, struct srv_conn *conn,
    const struct srv_request *req)
{
	cJSON *o;

	o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "model_path", a->a_cfg.ac_model);
	cJSON_AddStringToObject(o, "tokenizer_path", a->a_cfg.ac_model);
	cJSON_AddBoolToObject(o, "is_generation", 1);
	cJSON_AddStringToObject(o, "served_model_name", a->a_cfg.ac_model);
	cJSON_AddNumberToObject(o, "max_context_length",
	    a->a_cfg.ac_context_length);
	api_reply_json(a, conn, req, 200, o);
}

/* What data_parallel_rank a request carried (SGLang's DP routing). */
static void
api_note_dp_rank(struct api *a, const cJSON *body)
{
	const cJSON *v =
	    cJSON_GetObjectItemCaseSensitive(body, "data_parallel_rank");

	if (cJSON_IsNumber(v) && v->valuedouble >= 0 &&
	    v->valuedouble < a->a_cfg.ac_dp_size &&
	    v->valuedouble == (double)(long)v->valuedouble) {
		a->a_dp_last = (long)v->valuedouble;
		a->a_dp_by_rank[a->a_dp_last]++;
	} else {
		a->a_dp_last = -1;
		a->a_dp_without++;
	}
}

static void
api_server_info(struct api *a, struct srv_conn *conn,
    const struct srv_request *req)
{
	struct engine_stats es;
	cJSON *o, *kv;
	char *text;

	engine_get_stats(a->a_engine, &es);
	o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "model_path", a->a_cfg.ac_model);
	cJSON_AddStringToObject(o, "served_model_name", a->a_cfg.ac_model);
	cJSON_AddStringToObject(o, "version", API_VERSION);
	cJSON_AddNumberToObject(o, "max_running_requests",
	    a->a_cfg.ac_max_running);
	cJSON_AddNumberToObject(o, "max_total_num_tokens",
	    (double)es.es_capacity_tokens);
	cJSON_AddNumberToObject(o, "page_size", a->a_cfg.ac_page_size);
	cJSON_AddNumberToObject(o, "context_length",
	    a->a_cfg.ac_context_length);
	cJSON_AddNumberToObject(o, "tp_size", 1);
	cJSON_AddNumberToObject(o, "dp_size", a->a_cfg.ac_dp_size);
	cJSON_AddStringToObject(o, "load_balance_method", "round_robin");
	cJSON_AddStringToObject(o, "disaggregation_mode", "null");
	if (a->a_cfg.ac_kv_endpoint != NULL) {
		/* SGLang's server args carry the --kv-events-config text. */
		kv = cJSON_CreateObject();
		cJSON_AddStringToObject(kv, "publisher", "zmq");
		cJSON_AddStringToObject(kv, "endpoint",
		    a->a_cfg.ac_kv_endpoint);
		cJSON_AddStringToObject(kv, "topic",
		    a->a_cfg.ac_kv_topic != NULL ? a->a_cfg.ac_kv_topic : "");
		if ((text = cJSON_PrintUnformatted(kv)) != NULL) {
			cJSON_AddStringToObject(o, "kv_events_config", text);
			free(text);
		}
		cJSON_Delete(kv);
	}
	api_reply_json(a, conn, req, 200, o);
}

static void
api_loads(struct api *a, struct srv_conn *conn, const struct srv_request *req)
{
	struct engine_stats es;
	char ts[32];
	time_t now = time(NULL);
	struct tm tm;
	cJSON *o, *arr, *l;
	double hit;
	uint32_t r;

	engine_get_stats(a->a_engine, &es);
	gmtime_r(&now, &tm);
	strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%SZ", &tm);
	hit = es.es_prompt_tokens
	    ? (double)es.es_cached_tokens / (double)es.es_prompt_tokens
	    : 0.0;
	o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "timestamp", ts);
	cJSON_AddStringToObject(o, "version", API_VERSION);
	cJSON_AddNumberToObject(o, "dp_rank_count", a->a_cfg.ac_dp_size);
	arr = cJSON_AddArrayToObject(o, "loads");
	/* One engine simulates every rank: each reports its figures. */
	for (r = 0; r < a->a_cfg.ac_dp_size; r++) {
		l = cJSON_CreateObject();
		cJSON_AddItemToArray(arr, l);
		cJSON_AddNumberToObject(l, "dp_rank", r);
		cJSON_AddNumberToObject(l, "num_running_reqs", es.es_running);
		cJSON_AddNumberToObject(l, "num_waiting_reqs", es.es_waiting);
		cJSON_AddNumberToObject(l, "num_waiting_uncached_tokens",
		    (double)es.es_waiting_uncached);
		cJSON_AddNumberToObject(l, "num_total_reqs",
		    (double)es.es_running + es.es_waiting);
		cJSON_AddNumberToObject(l, "num_used_tokens",
		    (double)es.es_used_tokens);
		cJSON_AddNumberToObject(l, "max_total_num_tokens",
		    (double)es.es_capacity_tokens);
		cJSON_AddNumberToObject(l, "token_usage",
		    (double)es.es_used_tokens / (double)es.es_capacity_tokens);
		cJSON_AddNumberToObject(l, "gen_throughput",
		    es.es_gen_throughput);
		cJSON_AddNumberToObject(l, "cache_hit_rate", hit);
		cJSON_AddNumberToObject(l, "utilization",
		    (double)es.es_running / a->a_cfg.ac_max_running);
		cJSON_AddNumberToObject(l, "max_running_requests",
		    a->a_cfg.ac_max_running);
	}
	api_reply_json(a, conn, req, 200, o);
}

static void
api_metrics(struct api *a, struct srv_conn *conn, const struct srv_request *req)
{
	struct engine_stats es;
	char buf[8192], extra[API_EXTRA_MAX];
	const char *mn = a->a_cfg.ac_model;
	double usage, hit;
	int n;

	engine_get_stats(a->a_engine, &es);
	usage = (double)es.es_used_tokens / (double)es.es_capacity_tokens;
	hit = es.es_prompt_tokens
	    ? (double)es.es_cached_tokens / (double)es.es_prompt_tokens
	    : 0.0;
	if (a->a_cfg.ac_engine == SIM_ENGINE_SGLANG)
		n = snprintf(buf, sizeof(buf),
		    "# HELP sglang:num_running_reqs Running requests.\n"
		    "# TYPE sglang:num_running_reqs gauge\n"
		    "sglang:num_running_reqs{model_name=\"%s\"} %u\n"
		    "# HELP sglang:num_queue_reqs Waiting requests.\n"
		    "# TYPE sglang:num_queue_reqs gauge\n"
		    "sglang:num_queue_reqs{model_name=\"%s\"} %u\n"
		    "# HELP sglang:num_used_tokens KV tokens in use.\n"
		    "# TYPE sglang:num_used_tokens gauge\n"
		    "sglang:num_used_tokens{model_name=\"%s\"} %llu\n"
		    "# HELP sglang:token_usage KV usage, 0 to 1.\n"
		    "# TYPE sglang:token_usage gauge\n"
		    "sglang:token_usage{model_name=\"%s\"} %.6f\n"
		    "# HELP sglang:gen_throughput Generated tokens per "
		    "second.\n"
		    "# TYPE sglang:gen_throughput gauge\n"
		    "sglang:gen_throughput{model_name=\"%s\"} %.3f\n"
		    "# HELP sglang:cache_hit_rate Prefix cache hit rate.\n"
		    "# TYPE sglang:cache_hit_rate gauge\n"
		    "sglang:cache_hit_rate{model_name=\"%s\"} %.6f\n"
		    "# HELP sglang:utilization Running batch over its limit.\n"
		    "# TYPE sglang:utilization gauge\n"
		    "sglang:utilization{model_name=\"%s\"} %.6f\n"
		    "# HELP sglang:prompt_tokens_total Prompt tokens.\n"
		    "# TYPE sglang:prompt_tokens_total counter\n"
		    "sglang:prompt_tokens_total{model_name=\"%s\"} %llu\n"
		    "# HELP sglang:generation_tokens_total Generated tokens.\n"
		    "# TYPE sglang:generation_tokens_total counter\n"
		    "sglang:generation_tokens_total{model_name=\"%s\"} %llu\n"
		    "# HELP sglang:cached_tokens_total Prompt tokens from "
		    "cache.\n"
		    "# TYPE sglang:cached_tokens_total counter\n"
		    "sglang:cached_tokens_total{model_name=\"%s\"} %llu\n",
		    mn, es.es_running, mn, es.es_waiting, mn,
		    (unsigned long long)es.es_used_tokens, mn, usage, mn,
		    es.es_gen_throughput, mn, hit, mn,
		    (double)es.es_running / a->a_cfg.ac_max_running, mn,
		    (unsigned long long)es.es_prompt_tokens, mn,
		    (unsigned long long)es.es_output_tokens, mn,
		    (unsigned long long)es.es_cached_tokens);
	else
		n = snprintf(buf, sizeof(buf),
		    "# HELP vllm:num_requests_running Running requests.\n"
		    "# TYPE vllm:num_requests_running gauge\n"
		    "vllm:num_requests_running{model_name=\"%s\"} %u\n"
		    "# HELP vllm:num_requests_waiting Waiting requests.\n"
		    "# TYPE vllm:num_requests_waiting gauge\n"
		    "vllm:num_requests_waiting{model_name=\"%s\"} %u\n"
		    "# HELP vllm:kv_cache_usage_perc KV usage, 0 to 1.\n"
		    "# TYPE vllm:kv_cache_usage_perc gauge\n"
		    "vllm:kv_cache_usage_perc{model_name=\"%s\"} %.6f\n"
		    "# HELP vllm:gpu_prefix_cache_hit_rate Prefix cache hit "
		    "rate.\n"
		    "# TYPE vllm:gpu_prefix_cache_hit_rate gauge\n"
		    "vllm:gpu_prefix_cache_hit_rate{model_name=\"%s\"} %.6f\n"
		    "# HELP vllm:prompt_tokens_total Prompt tokens.\n"
		    "# TYPE vllm:prompt_tokens_total counter\n"
		    "vllm:prompt_tokens_total{model_name=\"%s\"} %llu\n"
		    "# HELP vllm:generation_tokens_total Generated tokens.\n"
		    "# TYPE vllm:generation_tokens_total counter\n"
		    "vllm:generation_tokens_total{model_name=\"%s\"} %llu\n",
		    mn, es.es_running, mn, es.es_waiting, mn, usage, mn, hit,
		    mn, (unsigned long long)es.es_prompt_tokens, mn,
		    (unsigned long long)es.es_output_tokens);
	api_extra(a, req, extra, sizeof(extra));
	if (n < 0 || (size_t)n >= sizeof(buf)) {
		api_error(a, conn, req, 500, "metrics too large");
		return;
	}
	srv_respond(conn, 200, "text/plain; version=0.0.4", extra, buf,
	    (size_t)n);
}

static void
api_flush(struct api *a, struct srv_conn *conn, const struct srv_request *req)
{
	static const char ok[] = "Cache flushed.\n";
	static const char busy[] = "Cache not flushed: there are running or "
	                           "waiting requests.\n";
	char extra[API_EXTRA_MAX];

	api_extra(a, req, extra, sizeof(extra));
	if (engine_flush(a->a_engine) == -1)
		srv_respond(conn, 400, "text/plain", extra, busy,
		    sizeof(busy) - 1);
	else
		srv_respond(conn, 200, "text/plain", extra, ok, sizeof(ok) - 1);
}

/*
 * SGLang's /start_profile and /stop_profile: an optional JSON object of
 * options (anything else is 400); the options are echoed back.
 */
static void
api_profile(struct api *a, struct srv_conn *conn, const struct srv_request *req)
{
	cJSON *o = NULL, *r;

	if (req->sr_body_len > 0 &&
	    ((o = cJSON_Parse(req->sr_body)) == NULL || !cJSON_IsObject(o))) {
		cJSON_Delete(o);
		api_error(a, conn, req, 400,
		    "profile options must be a JSON "
		    "object");
		return;
	}
	r = cJSON_CreateObject();
	cJSON_AddBoolToObject(r, "success", true);
	cJSON_AddItemToObject(r, "options",
	    o != NULL ? o : cJSON_CreateObject());
	api_reply_json(a, conn, req, 200, r);
}

/*
 * /v1/audio/transcriptions: a multipart upload with a "file" part. The
 * answer says how many bytes came and the form's fields it saw.
 */
static void
api_transcribe(struct api *a, struct srv_conn *conn,
    const struct srv_request *req)
{
	cJSON *r;

	if (req->sr_body_len < 2 || strncmp(req->sr_body, "--", 2) != 0 ||
	    strstr(req->sr_body, "name=\"file\"") == NULL) {
		api_error(a, conn, req, 400,
		    "expected a multipart form with a "
		    "file part");
		return;
	}
	r = cJSON_CreateObject();
	cJSON_AddStringToObject(r, "text", "simulated transcription");
	cJSON_AddNumberToObject(r, "bytes", (double)req->sr_body_len);
	cJSON_AddBoolToObject(r, "has_model",
	    strstr(req->sr_body, "name=\"model\"") != NULL);
	api_reply_json(a, conn, req, 200, r);
}

static cJSON *
api_control_state(const struct api *a)
{
	cJSON *o;

	o = cJSON_CreateObject();
	cJSON_AddBoolToObject(o, "healthy", a->a_healthy);
	cJSON_AddNumberToObject(o, "fail_rate", a->a_fail_rate);
	cJSON_AddNumberToObject(o, "hang_rate", a->a_hang_rate);
	cJSON_AddNumberToObject(o, "close_rate", a->a_close_rate);
	cJSON_AddNumberToObject(o, "status", a->a_fail_status);
	return o;
}

/* Changes health and fault rates; all fields are checked before any is
 * applied. */
static void
api_control(struct api *a, struct srv_conn *conn, const struct srv_request *req)
{
	static const char *const rates[] = { "fail_rate", "hang_rate",
		"close_rate" };
	double *dst[3] = { &a->a_fail_rate, &a->a_hang_rate, &a->a_close_rate };
	const cJSON *v;
	cJSON *body;
	int i;

	body = cJSON_ParseWithLength(req->sr_body, req->sr_body_len);
	if (body == NULL || !cJSON_IsObject(body))
		goto bad;
	v = cJSON_GetObjectItemCaseSensitive(body, "healthy");
	if (v != NULL && !cJSON_IsBool(v))
		goto bad;
	for (i = 0; i < 3; i++) {
		v = cJSON_GetObjectItemCaseSensitive(body, rates[i]);
		if (v != NULL &&
		    (!cJSON_IsNumber(v) || v->valuedouble < 0 ||
		        v->valuedouble > 1))
			goto bad;
	}
	v = cJSON_GetObjectItemCaseSensitive(body, "status");
	if (v != NULL &&
	    (!cJSON_IsNumber(v) || v->valuedouble < 400 ||
	        v->valuedouble > 599))
		goto bad;
	if ((v = cJSON_GetObjectItemCaseSensitive(body, "healthy")) != NULL)
		a->a_healthy = cJSON_IsTrue(v);
	for (i = 0; i < 3; i++)
		if ((v = cJSON_GetObjectItemCaseSensitive(body, rates[i])) !=
		    NULL)
			*dst[i] = v->valuedouble;
	if ((v = cJSON_GetObjectItemCaseSensitive(body, "status")) != NULL)
		a->a_fail_status = (int)v->valuedouble;
	cJSON_Delete(body);
	log_info("%s: healthy %d fail %.3f hang %.3f close %.3f status %d",
	    __func__, a->a_healthy, a->a_fail_rate, a->a_hang_rate,
	    a->a_close_rate, a->a_fail_status);
	api_reply_json(a, conn, req, 200, api_control_state(a));
	return;
bad:
	cJSON_Delete(body);
	api_error(a, conn, req, 400,
	    "expected {\"healthy\":bool, \"fail_rate\"|\"hang_rate\"|"
	    "\"close_rate\":0..1, \"status\":400..599}");
}

static void
api_sim_stats(struct api *a, struct srv_conn *conn,
    const struct srv_request *req)
{
	struct engine_stats es;
	cJSON *o, *dp, *by;
	uint32_t r;

	engine_get_stats(a->a_engine, &es);
	o = cJSON_CreateObject();
	stats_to_json(a->a_stats, o);
	pdsim_stats_json(a->a_pd, o);
	cJSON_AddNumberToObject(o, "running", es.es_running);
	cJSON_AddNumberToObject(o, "waiting", es.es_waiting);
	cJSON_AddNumberToObject(o, "used_tokens", (double)es.es_used_tokens);
	cJSON_AddNumberToObject(o, "output_tokens",
	    (double)es.es_output_tokens);
	cJSON_AddNumberToObject(o, "time_scale", a->a_cfg.ac_time_scale);
	cJSON_AddStringToObject(o, "worker", a->a_cfg.ac_worker_id);
	dp = cJSON_AddObjectToObject(o, "dp");
	if (a->a_dp_last >= 0)
		cJSON_AddNumberToObject(dp, "last_rank", (double)a->a_dp_last);
	else
		cJSON_AddNullToObject(dp, "last_rank");
	by = cJSON_AddArrayToObject(dp, "by_rank");
	for (r = 0; r < a->a_cfg.ac_dp_size; r++)
		cJSON_AddItemToArray(by,
		    cJSON_CreateNumber((double)a->a_dp_by_rank[r]));
	cJSON_AddNumberToObject(dp, "without_rank", (double)a->a_dp_without);
	dp = cJSON_AddObjectToObject(o, "probes");
	cJSON_AddNumberToObject(dp, "health", (double)a->a_probe_health);
	cJSON_AddNumberToObject(dp, "loads", (double)a->a_probe_loads);
	api_reply_json(a, conn, req, 200, o);
}
