/*
 * extract.h: the routing inputs of one inference request (policies.md §1.3,
 * §1.6, §5.1, §8.2; gateway.md §3, §6): which route it is, the model, the
 * routing text or token ids, the routing keys and hints, and the request id.
 *
 * Nothing here is an error for a bad hint: invalid routing headers are
 * ignored. Only the body can fail a request (invalid JSON, not an object,
 * wrong type of a field the gateway reads).
 */
#ifndef FRONTEND_EXTRACT_H
#define FRONTEND_EXTRACT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "shared/http.h"

/* Same values as ipc.proto's Endpoint. */
enum extract_endpoint {
	EXTRACT_EP_OTHER = 0,
	EXTRACT_EP_GENERATE = 1,
	EXTRACT_EP_CHAT = 2,
	EXTRACT_EP_COMPLETIONS = 3,
	EXTRACT_EP_EMBEDDINGS = 4,
	EXTRACT_EP_RERANK = 5,
	EXTRACT_EP_CLASSIFY = 6,
	EXTRACT_EP_MESSAGES = 7,
	EXTRACT_EP_RESPONSES = 8,
	EXTRACT_EP_TRANSCRIPTIONS = 9, /* multipart: never parsed */
};

/* Caps of gateway.md §6.1 and policies.md §1.3. */
#define EXTRACT_KEY_MAX              128 /* routing key, rid key (bytes) */
#define EXTRACT_ROUTING_TOKENS_MAX   512 /* ids in x-smg-routing-tokens */
#define EXTRACT_ROUTING_TOKENS_BYTES 4096 /* bytes of that header */
/* Longest request id kept from a client header; longer ones are skipped. */
#define EXTRACT_REQUEST_ID_MAX 256

/*
 * Which routed POST path of gateway.md §3.1 path is (exact match, query
 * already split off): 0 with *out set, or -1 when it is none of them.
 * /generate, /v1/chat/completions, /v1/completions, /v1/embeddings,
 * /v1/rerank, /rerank, /v1/classify, /v1/messages, /v1/responses,
 * /v1/audio/transcriptions.
 */
int extract_route(const char *path, enum extract_endpoint *out);

/* Metric label of an endpoint ("generate", "chat", ...; "other"). */
const char *extract_endpoint_name(enum extract_endpoint ep);

/* Routing inputs; every pointer is owned, released by extract_inputs_free. */
struct extract_inputs {
	enum extract_endpoint ei_endpoint;
	char *ei_model; /* body "model", NULL when absent (model-less) */
	bool ei_stream; /* body "stream": true */
	/* Routing text (§1.6); only when there are no tokens. */
	char *ei_text;
	size_t ei_text_len;
	bool ei_has_text;
	/* Valid x-smg-routing-tokens header (wins), else /generate input_ids
	 * (first sequence of a batch). */
	uint32_t *ei_tokens;
	size_t ei_ntokens;
	bool ei_has_tokens;
	bool ei_tokens_from_header;
	char *ei_rid; /* body rid as sent (first of a batch), or NULL */
	char *ei_rid_key; /* lineage-stripped rid, only when the override is
	                     on and it is non-empty and <= 128 bytes */
	/* First configured routing-key header with a valid value (non-empty,
	 * UTF-8, <= 128 bytes), raw (not lineage-stripped), or NULL. */
	char *ei_routing_key;
	/* X-SMG-Target-Worker when non-empty visible ASCII (raw value). */
	char *ei_target_worker;
	bool ei_has_target_worker;
	/* policies.md §5.1 rule 4: the value of the first present of
	 * authorization, x-forwarded-for, cookie, when that one is non-empty
	 * visible ASCII (SP allowed inside); else none. */
	char *ei_implicit_key;
	bool ei_has_implicit_key;
	uint64_t ei_size; /* Unicode scalar values of the text, or tokens */
	unsigned ei_batch_n; /* PD batch size (gateway.md §11.2); 1 if none */
	bool ei_is_batch; /* the body is a batch (arrays of n entries) */
	cJSON *ei_json; /* the parsed body object */
};

/*
 * Parses the body (JSON object) and reads the routing headers of req.
 * routing_key_headers: the --routing-key-headers names (any case), nkeys of
 * them. routing_key_override: --routing-key-override (rid key wanted).
 * Returns 0 with *out filled (free with extract_inputs_free), or -1 with
 * *out zeroed, *status the HTTP status, *code the error code (static) and
 * msg (msglen bytes, NUL-terminated) the text for http_out_error():
 *   400 json_parse_error  body is not valid JSON
 *   400 invalid_request   body is not a JSON object
 *   422 invalid_request   "model" not a string, "stream" not a boolean,
 *                         "rid" not a string or array of strings
 *   503 out_of_memory     allocation failed
 * The body need not be NUL-terminated.
 */
int extract_inputs(enum extract_endpoint ep, const char *body, size_t len,
    const struct http_request *req, const char *const *routing_key_headers,
    size_t nkeys, bool routing_key_override, struct extract_inputs *out,
    int *status, const char **code, char *msg, size_t msglen);

struct shm;

/*
 * Lean extraction, for a frontend whose policy reads no routing text
 * (policies.md §1.6: only cache_aware, bucket and prefix_hash do) and that
 * rewrites no body (no --model-alias, no PD): with on, extract_inputs reads
 * a plain JSON body (RFC 8259, no NUL, nesting at most 64) with a scanner,
 * not cJSON, and fills *out as it would otherwise, except ei_json and
 * ei_text, which stay NULL (ei_has_text and ei_size are as ever), and
 * ei_batch_n/ei_is_batch (1, false). Any other body, and /v1/messages and
 * /v1/responses, take the full path, so errors are the same. While shm
 * says some model's policy wants the text (shm_text_wanted), every body
 * takes the full path. Off by default; call before serving.
 */
void extract_set_lean(bool on, struct shm *shm);

/* Header-only inputs for a body streamed unparsed (gateway.md §6.4): tokens
 * from the header, routing key, target worker, implicit key; no model, text
 * or rid. Returns 0, or -1 when out of memory (*out zeroed). */
int extract_inputs_headers(enum extract_endpoint ep,
    const struct http_request *req, const char *const *routing_key_headers,
    size_t nkeys, struct extract_inputs *out);

/*
 * Whether model names no model: NULL, blank, or "unknown" (with
 * --enable-igw, /generate then answers 400 missing_model, as SMG does).
 */
bool extract_model_missing(const char *model);
#define EXTRACT_MISSING_MODEL_MSG                                              \
	"/generate requests must include a model when IGW routing is enabled"

/* Frees everything in; in may be zeroed. Leaves it zeroed. */
void extract_inputs_free(struct extract_inputs *in);

/*
 * Lineage stripping of policies.md §8.2 on key[0..len): drops one trailing
 * "_r<digits>", then one trailing "_t<digits>"; when nothing would remain,
 * the key is kept whole. Returns the kept length.
 * "conv123_t2_r1" -> 7, "conv_tx" -> 7, "_t1" -> 3.
 */
size_t extract_strip_lineage(const char *key, size_t len);

/*
 * Parses an x-smg-routing-tokens value: comma-separated decimal u32, at
 * most 512 ids and 4096 bytes, digits only, no empty items. Returns the
 * count (>= 1) with *out malloc'ed (caller frees), 0 when the value is
 * invalid (nothing allocated), -1 when out of memory.
 */
long extract_routing_tokens(const char *value, size_t len, uint32_t **out);

/* True when s[0..len) is valid UTF-8 (no overlongs, no surrogates). */
bool extract_utf8_valid(const char *s, size_t len);
/* Unicode scalar values in valid UTF-8 s[0..len). */
size_t extract_utf8_chars(const char *s, size_t len);

/*
 * x-request-id of gateway.md §3.4 into out (outlen >= 64 recommended,
 * NUL-terminated): the value of the first of id_headers (names, any case)
 * present on req with a non-empty visible-ASCII value of at most
 * EXTRACT_REQUEST_ID_MAX bytes that fits out; else "<prefix><24 random
 * alphanumerics>" with the prefix chosen by path: chatcmpl- (.../chat/
 * completions), cmpl- (.../completions), gnt- (.../generate), resp-
 * (.../responses), msg_ (.../messages), req- otherwise. req may be NULL.
 */
void extract_request_id(const struct http_request *req,
    const char *const *id_headers, size_t nids, const char *path, char *out,
    size_t outlen);

#endif /* FRONTEND_EXTRACT_H */
