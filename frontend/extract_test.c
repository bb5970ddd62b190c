/*
 * extract_test.c: unit tests of frontend/extract.c: routes, the routing
 * text of every route (policies.md §1.6), token ids, routing headers and
 * their caps, lineage stripping (§8.2), body errors and request ids.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "frontend/extract.h"

static const char *const default_keys[] = { "x-smg-routing-key" };

static struct http_reader *reader;

/* A request carrying the given header lines ("Name: value\r\n"...). */
static const struct http_request *
request_with(const char *headers)
{
	char buf[16384];
	size_t n, off = 0;
	enum http_read_status st;
	int len;

	http_reader_free(reader);
	assert_non_null(reader = http_reader_new(NULL));
	len = snprintf(buf, sizeof(buf),
	    "POST /x HTTP/1.1\r\nHost: x\r\n%s\r\n", headers);
	assert_true(len > 0 && (size_t)len < sizeof(buf));
	do {
		st = http_reader_feed(reader, buf + off, (size_t)len - off, &n);
		off += n;
	} while (st == HTTP_READ_HEADERS);
	assert_int_equal(st, HTTP_READ_DONE);
	return http_reader_request(reader);
}

/* Extracts body with the given headers; asserts success. */
static void
extract_ok(enum extract_endpoint ep, const char *body, const char *headers,
    bool override, struct extract_inputs *in)
{
	const struct http_request *req = request_with(headers);
	const char *code = NULL;
	char msg[128];
	int status = 0;

	if (extract_inputs(ep, body, strlen(body), req, default_keys, 1,
	        override, in, &status, &code, msg, sizeof(msg)) != 0)
		fail_msg("extract failed: %d %s %s", status, code, msg);
	assert_non_null(in->ei_json);
	assert_int_equal(in->ei_endpoint, ep);
}

/* The routing text of body on ep. */
static void
expect_text(enum extract_endpoint ep, const char *body, const char *text)
{
	struct extract_inputs in;

	extract_ok(ep, body, "", false, &in);
	if (text == NULL) {
		assert_false(in.ei_has_text);
		assert_null(in.ei_text);
	} else {
		assert_true(in.ei_has_text);
		assert_string_equal(in.ei_text, text);
		assert_int_equal(in.ei_text_len, strlen(text));
		assert_int_equal(in.ei_size,
		    extract_utf8_chars(text, strlen(text)));
	}
	extract_inputs_free(&in);
}

static void
expect_fail(const char *body, int status, const char *code)
{
	struct extract_inputs in;
	const char *c = NULL;
	char msg[128] = "";
	int st = 0;

	assert_int_equal(extract_inputs(EXTRACT_EP_CHAT, body, strlen(body),
	                     NULL, NULL, 0, false, &in, &st, &c, msg,
	                     sizeof(msg)),
	    -1);
	assert_int_equal(st, status);
	assert_string_equal(c, code);
	assert_true(msg[0] != '\0');
	assert_null(in.ei_json);
	assert_null(in.ei_model);
}

static void
test_routes(void **state)
{
	enum extract_endpoint ep;

	(void)state;
	assert_int_equal(extract_route("/generate", &ep), 0);
	assert_int_equal(ep, EXTRACT_EP_GENERATE);
	assert_int_equal(extract_route("/v1/chat/completions", &ep), 0);
	assert_int_equal(ep, EXTRACT_EP_CHAT);
	assert_int_equal(extract_route("/v1/completions", &ep), 0);
	assert_int_equal(ep, EXTRACT_EP_COMPLETIONS);
	assert_int_equal(extract_route("/v1/embeddings", &ep), 0);
	assert_int_equal(ep, EXTRACT_EP_EMBEDDINGS);
	assert_int_equal(extract_route("/v1/rerank", &ep), 0);
	assert_int_equal(ep, EXTRACT_EP_RERANK);
	assert_int_equal(extract_route("/rerank", &ep), 0);
	assert_int_equal(ep, EXTRACT_EP_RERANK);
	assert_int_equal(extract_route("/v1/classify", &ep), 0);
	assert_int_equal(ep, EXTRACT_EP_CLASSIFY);
	assert_int_equal(extract_route("/v1/messages", &ep), 0);
	assert_int_equal(ep, EXTRACT_EP_MESSAGES);
	assert_int_equal(extract_route("/v1/responses", &ep), 0);
	assert_int_equal(ep, EXTRACT_EP_RESPONSES);
	assert_int_equal(extract_route("/v1/audio/transcriptions", &ep), 0);
	assert_int_equal(ep, EXTRACT_EP_TRANSCRIPTIONS);
	assert_string_equal(extract_endpoint_name(ep), "transcriptions");
	/* IGW /generate needs a model. */
	assert_true(extract_model_missing(NULL));
	assert_true(extract_model_missing(""));
	assert_true(extract_model_missing(" \t"));
	assert_true(extract_model_missing("unknown"));
	assert_false(extract_model_missing("m"));
	assert_false(extract_model_missing(" m "));
	assert_int_equal(extract_route("/v1/models", &ep), -1);
	assert_int_equal(extract_route("/generate/", &ep), -1);
	assert_int_equal(extract_route("/V1/chat/completions", &ep), -1);
	assert_int_equal(extract_route("", &ep), -1);
	assert_string_equal(extract_endpoint_name(EXTRACT_EP_CHAT), "chat");
	assert_string_equal(extract_endpoint_name(EXTRACT_EP_OTHER), "other");
}

static void
test_chat_text(void **state)
{
	(void)state;
	expect_text(EXTRACT_EP_CHAT,
	    "{\"model\":\"m\",\"messages\":["
	    "{\"role\":\"system\",\"content\":\"sys\"},"
	    "{\"role\":\"developer\",\"content\":\"dev\"},"
	    "{\"role\":\"user\",\"content\":["
	    "{\"type\":\"text\",\"text\":\"hello\"},"
	    "{\"type\":\"image_url\",\"image_url\":{\"url\":\"u\"}},"
	    "{\"type\":\"text\",\"text\":\"\"},"
	    "{\"type\":\"text\",\"text\":\"world\"}]},"
	    "{\"role\":\"assistant\",\"content\":\"\","
	    "\"reasoning_content\":\"think\"},"
	    "{\"role\":\"assistant\",\"content\":\"ans\","
	    "\"reasoning_content\":\"why\"},"
	    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[]},"
	    "{\"role\":\"tool\",\"content\":\"out\"},"
	    "{\"role\":\"function\",\"content\":\"fn\"}]}",
	    "sys dev hello world think ans why out fn");
	/* Nothing to route on: no text at all (not an empty one). */
	expect_text(EXTRACT_EP_CHAT, "{\"messages\":[]}", NULL);
	expect_text(EXTRACT_EP_CHAT, "{\"model\":\"m\"}", NULL);
	expect_text(EXTRACT_EP_CHAT,
	    "{\"messages\":[{\"role\":\"user\",\"content\":\"\"}]}", NULL);
	/* Non-ASCII text: size counts Unicode scalar values. */
	{
		struct extract_inputs in;

		extract_ok(EXTRACT_EP_CHAT,
		    "{\"messages\":[{\"role\":\"user\",\"content\":"
		    "\"h\\u00e9llo \xf0\x9f\x98\x80\"}]}",
		    "", false, &in);
		assert_string_equal(in.ei_text,
		    "h\xc3\xa9llo \xf0\x9f\x98\x80");
		assert_int_equal(in.ei_size, 7);
		extract_inputs_free(&in);
	}
}

static void
test_completions_text(void **state)
{
	struct extract_inputs in;

	(void)state;
	expect_text(EXTRACT_EP_COMPLETIONS, "{\"prompt\":\"once upon\"}",
	    "once upon");
	expect_text(EXTRACT_EP_COMPLETIONS,
	    "{\"prompt\":[\"a\",\"b c\",\"d\"]}", "a b c d");
	expect_text(EXTRACT_EP_COMPLETIONS, "{\"prompt\":[\"a\",\"\",\"b\"]}",
	    "a  b");
	expect_text(EXTRACT_EP_COMPLETIONS, "{\"prompt\":\"\"}", "");
	expect_text(EXTRACT_EP_COMPLETIONS, "{\"prompt\":[1,2,3]}", NULL);

	extract_ok(EXTRACT_EP_COMPLETIONS, "{\"prompt\":[\"a\",\"b\",\"c\"]}",
	    "", false, &in);
	assert_int_equal(in.ei_batch_n, 3);
	assert_true(in.ei_is_batch);
	extract_inputs_free(&in);
	extract_ok(EXTRACT_EP_COMPLETIONS, "{\"prompt\":\"x\"}", "", false,
	    &in);
	assert_int_equal(in.ei_batch_n, 1);
	assert_false(in.ei_is_batch);
	extract_inputs_free(&in);
}

static void
test_embeddings_classify_rerank_text(void **state)
{
	(void)state;
	expect_text(EXTRACT_EP_EMBEDDINGS, "{\"input\":\"embed me\"}",
	    "embed me");
	expect_text(EXTRACT_EP_EMBEDDINGS,
	    "{\"input\":[\"x\",1,{\"a\":1},\"y\"]}", "x y");
	expect_text(EXTRACT_EP_CLASSIFY, "{\"input\":\"classify\"}",
	    "classify");
	expect_text(EXTRACT_EP_CLASSIFY, "{\"input\":[\"p\",\"q\"]}", "p q");
	expect_text(EXTRACT_EP_RERANK,
	    "{\"query\":\"what\",\"documents\":[\"d1\",\"d2\"]}", "what");
	expect_text(EXTRACT_EP_RERANK, "{\"documents\":[\"d1\"]}", NULL);
}

static void
test_messages_text(void **state)
{
	(void)state;
	expect_text(EXTRACT_EP_MESSAGES,
	    "{\"model\":\"claude\",\"system\":\"be brief\",\"messages\":["
	    "{\"role\":\"user\",\"content\":\"hi\"},"
	    "{\"role\":\"assistant\",\"content\":["
	    "{\"type\":\"text\",\"text\":\"hello\"},"
	    "{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"n\",\"input\":{}},"
	    "{\"type\":\"text\",\"text\":\"there\"}]}]}",
	    "be brief hi hello there");
	expect_text(EXTRACT_EP_MESSAGES,
	    "{\"system\":[{\"type\":\"text\",\"text\":\"s1\"},"
	    "{\"type\":\"text\",\"text\":\"s2\"}],"
	    "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
	    "\"image\",\"source\":{}},{\"type\":\"text\",\"text\":\"u\"}]}]}",
	    "s1 s2 u");
	expect_text(EXTRACT_EP_MESSAGES,
	    "{\"messages\":[{\"role\":\"user\",\"content\":\"only\"}]}",
	    "only");
}

static void
test_responses_text(void **state)
{
	(void)state;
	expect_text(EXTRACT_EP_RESPONSES, "{\"input\":\"tell me\"}", "tell me");
	expect_text(EXTRACT_EP_RESPONSES,
	    "{\"input\":["
	    "{\"type\":\"message\",\"role\":\"user\",\"content\":["
	    "{\"type\":\"input_text\",\"text\":\"first\"},"
	    "{\"type\":\"input_image\",\"image_url\":\"u\"}]},"
	    "{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"{}\"},"
	    "{\"type\":\"function_call_output\",\"output\":\"skip\"},"
	    "{\"type\":\"message\",\"role\":\"assistant\",\"content\":["
	    "{\"type\":\"output_text\",\"text\":\"second\"}]},"
	    "{\"role\":\"user\",\"content\":\"third\"}]}",
	    "first second third");
	expect_text(EXTRACT_EP_RESPONSES, "{\"input\":[]}", NULL);
}

static void
test_generate(void **state)
{
	struct extract_inputs in;

	(void)state;
	expect_text(EXTRACT_EP_GENERATE,
	    "{\"text\":\"The capital\",\"sampling_params\":{}}", "The capital");
	/* model is optional on /generate. */
	extract_ok(EXTRACT_EP_GENERATE, "{\"text\":\"t\"}", "", false, &in);
	assert_null(in.ei_model);
	assert_int_equal(in.ei_batch_n, 1);
	extract_inputs_free(&in);

	extract_ok(EXTRACT_EP_GENERATE, "{\"input_ids\":[1,2,3]}", "", false,
	    &in);
	assert_true(in.ei_has_tokens);
	assert_false(in.ei_tokens_from_header);
	assert_false(in.ei_has_text);
	assert_int_equal(in.ei_ntokens, 3);
	assert_int_equal(in.ei_tokens[0], 1);
	assert_int_equal(in.ei_tokens[2], 3);
	assert_int_equal(in.ei_size, 3);
	extract_inputs_free(&in);

	/* Batch: the first sequence routes; n = number of sequences. */
	extract_ok(EXTRACT_EP_GENERATE,
	    "{\"input_ids\":[[4,5],[6],[4294967295]]}", "", false, &in);
	assert_int_equal(in.ei_ntokens, 2);
	assert_int_equal(in.ei_tokens[0], 4);
	assert_int_equal(in.ei_tokens[1], 5);
	assert_int_equal(in.ei_batch_n, 3);
	assert_true(in.ei_is_batch);
	extract_inputs_free(&in);

	/* First sequence empty: the ids rendered in decimal are the text. */
	expect_text(EXTRACT_EP_GENERATE, "{\"input_ids\":[[],[7,8],[9]]}",
	    "7 8 9");
	/* Ids that are not u32 give no routing input at all. */
	expect_text(EXTRACT_EP_GENERATE, "{\"input_ids\":[1,-2]}", NULL);
	expect_text(EXTRACT_EP_GENERATE, "{\"input_ids\":[1.5]}", NULL);
	expect_text(EXTRACT_EP_GENERATE, "{\"input_ids\":[4294967296]}", NULL);
	expect_text(EXTRACT_EP_GENERATE, "{\"input_ids\":[]}", NULL);

	/* Text batch. */
	extract_ok(EXTRACT_EP_GENERATE, "{\"text\":[\"a\",\"b\"]}", "", false,
	    &in);
	assert_string_equal(in.ei_text, "a b");
	assert_int_equal(in.ei_batch_n, 2);
	extract_inputs_free(&in);
}

static void
test_chat_batch_and_stream(void **state)
{
	struct extract_inputs in;

	(void)state;
	extract_ok(EXTRACT_EP_CHAT,
	    "{\"model\":\"llama\",\"stream\":true,\"n\":4,\"messages\":[]}", "",
	    false, &in);
	assert_string_equal(in.ei_model, "llama");
	assert_true(in.ei_stream);
	assert_int_equal(in.ei_batch_n, 4);
	assert_true(in.ei_is_batch);
	extract_inputs_free(&in);

	extract_ok(EXTRACT_EP_CHAT,
	    "{\"model\":null,\"stream\":false,\"n\":1,\"messages\":[]}", "",
	    false, &in);
	assert_null(in.ei_model);
	assert_false(in.ei_stream);
	assert_int_equal(in.ei_batch_n, 1);
	extract_inputs_free(&in);
}

static void
test_routing_tokens_header(void **state)
{
	char big[8192];
	uint32_t *ids;
	size_t i, off;
	struct extract_inputs in;

	(void)state;
	assert_int_equal(extract_routing_tokens("1,2,3", 5, &ids), 3);
	assert_int_equal(ids[0], 1);
	assert_int_equal(ids[2], 3);
	free(ids);
	assert_int_equal(extract_routing_tokens("4294967295", 10, &ids), 1);
	assert_int_equal(ids[0], 4294967295u);
	free(ids);
	assert_int_equal(extract_routing_tokens("4294967296", 10, &ids), 0);
	assert_null(ids);
	assert_int_equal(extract_routing_tokens("", 0, &ids), 0);
	assert_int_equal(extract_routing_tokens("1,,2", 4, &ids), 0);
	assert_int_equal(extract_routing_tokens("1,2,", 4, &ids), 0);
	assert_int_equal(extract_routing_tokens(",1", 2, &ids), 0);
	assert_int_equal(extract_routing_tokens("1, 2", 4, &ids), 0);
	assert_int_equal(extract_routing_tokens("-1", 2, &ids), 0);
	assert_int_equal(extract_routing_tokens("+1", 2, &ids), 0);
	assert_int_equal(extract_routing_tokens("0x1", 3, &ids), 0);
	assert_int_equal(
	    extract_routing_tokens("99999999999999999999", 20, &ids), 0);

	/* 512 ids fit, 513 do not. */
	for (i = 0, off = 0; i < 513; i++)
		off += (size_t)snprintf(big + off, sizeof(big) - off, "%s%zu",
		    i ? "," : "", i % 10);
	assert_int_equal(extract_routing_tokens(big, off - 2, &ids), 512);
	assert_int_equal(ids[511], 1);
	free(ids);
	assert_int_equal(extract_routing_tokens(big, off, &ids), 0);
	/* 4096 bytes fit, 4097 do not (few ids, long zero padding). */
	memset(big, '0', 4097);
	assert_int_equal(extract_routing_tokens(big, 4096, &ids), 1);
	assert_int_equal(ids[0], 0);
	free(ids);
	assert_int_equal(extract_routing_tokens(big, 4097, &ids), 0);

	/* The header wins over body ids and over text. */
	extract_ok(EXTRACT_EP_GENERATE, "{\"input_ids\":[1,2,3]}",
	    "X-SMG-Routing-Tokens: 10,20\r\n", false, &in);
	assert_true(in.ei_tokens_from_header);
	assert_int_equal(in.ei_ntokens, 2);
	assert_int_equal(in.ei_tokens[0], 10);
	assert_int_equal(in.ei_size, 2);
	extract_inputs_free(&in);
	extract_ok(EXTRACT_EP_CHAT,
	    "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
	    "x-smg-routing-tokens: 5\r\n", false, &in);
	assert_true(in.ei_has_tokens);
	assert_false(in.ei_has_text);
	assert_null(in.ei_text);
	extract_inputs_free(&in);
	/* An invalid header is ignored entirely: body inputs are used. */
	extract_ok(EXTRACT_EP_GENERATE, "{\"input_ids\":[1,2,3]}",
	    "x-smg-routing-tokens: 10,,20\r\n", false, &in);
	assert_false(in.ei_tokens_from_header);
	assert_int_equal(in.ei_ntokens, 3);
	extract_inputs_free(&in);
	extract_ok(EXTRACT_EP_CHAT,
	    "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
	    "x-smg-routing-tokens: abc\r\n", false, &in);
	assert_false(in.ei_has_tokens);
	assert_string_equal(in.ei_text, "hi");
	extract_inputs_free(&in);
}

static void
test_lineage(void **state)
{
	static const struct {
		const char *in, *out;
	} cases[] = {
		{ "conv123_t2_r1", "conv123" },
		{ "conv123_r1", "conv123" },
		{ "conv123_t7", "conv123" },
		{ "conv_tx", "conv_tx" },
		{ "_t1", "_t1" },
		{ "_r1", "_r1" },
		{ "_t1_r2", "_t1_r2" },
		{ "a_r", "a_r" },
		{ "a_t", "a_t" },
		{ "a_r1_r2", "a_r1" },
		{ "a_r1_t2", "a_r1" },
		{ "a_t1_t2", "a_t1" },
		{ "ar1", "ar1" },
		{ "a__r12", "a_" },
		{ "plain", "plain" },
		{ "", "" },
	};
	size_t i, n;

	(void)state;
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		n = extract_strip_lineage(cases[i].in, strlen(cases[i].in));
		if (n != strlen(cases[i].out) ||
		    strncmp(cases[i].in, cases[i].out, n) != 0)
			fail_msg("strip %s: kept %zu", cases[i].in, n);
	}
}

static void
test_rid(void **state)
{
	struct extract_inputs in;
	char body[512], rid[200];

	(void)state;
	extract_ok(EXTRACT_EP_GENERATE,
	    "{\"text\":\"t\",\"rid\":\"conv123_t2_r1\"}", "", true, &in);
	assert_string_equal(in.ei_rid, "conv123_t2_r1");
	assert_string_equal(in.ei_rid_key, "conv123");
	extract_inputs_free(&in);
	/* Without the override there is no rid key. */
	extract_ok(EXTRACT_EP_GENERATE,
	    "{\"text\":\"t\",\"rid\":\"conv123_t2_r1\"}", "", false, &in);
	assert_string_equal(in.ei_rid, "conv123_t2_r1");
	assert_null(in.ei_rid_key);
	extract_inputs_free(&in);
	/* A batch: the first rid. */
	extract_ok(EXTRACT_EP_GENERATE,
	    "{\"text\":[\"a\",\"b\"],\"rid\":[\"s_r3\",\"x\"]}", "", true, &in);
	assert_string_equal(in.ei_rid_key, "s");
	extract_inputs_free(&in);
	/* Empty rid, over-cap rid: no key. */
	extract_ok(EXTRACT_EP_GENERATE, "{\"rid\":\"\"}", "", true, &in);
	assert_null(in.ei_rid_key);
	extract_inputs_free(&in);
	memset(rid, 'k', 129);
	rid[129] = '\0';
	snprintf(body, sizeof(body), "{\"rid\":\"%s\"}", rid);
	extract_ok(EXTRACT_EP_GENERATE, body, "", true, &in);
	assert_null(in.ei_rid_key);
	extract_inputs_free(&in);
	/* Over the cap before stripping, within it after: kept. */
	strcpy(rid + 126, "_r1");
	snprintf(body, sizeof(body), "{\"rid\":\"%s\"}", rid);
	extract_ok(EXTRACT_EP_GENERATE, body, "", true, &in);
	assert_non_null(in.ei_rid_key);
	assert_int_equal(strlen(in.ei_rid_key), 126);
	extract_inputs_free(&in);
	rid[128] = '\0';
	memset(rid, 'k', 128);
	snprintf(body, sizeof(body), "{\"rid\":\"%s\"}", rid);
	extract_ok(EXTRACT_EP_GENERATE, body, "", true, &in);
	assert_int_equal(strlen(in.ei_rid_key), 128);
	extract_inputs_free(&in);
}

static void
test_routing_key(void **state)
{
	static const char *const keys[] = { "X-A", "x-smg-routing-key" };
	const struct http_request *req;
	struct extract_inputs in;
	char hdr[400], longv[200];

	(void)state;
	extract_ok(EXTRACT_EP_CHAT, "{}", "X-SMG-Routing-Key: user-42_r1\r\n",
	    false, &in);
	/* Raw: stripping is for whoever applies the sticky overlay. */
	assert_string_equal(in.ei_routing_key, "user-42_r1");
	extract_inputs_free(&in);

	/* First configured header with a valid value wins. */
	req = request_with("x-smg-routing-key: second\r\nX-A: first\r\n");
	assert_int_equal(
	    extract_inputs_headers(EXTRACT_EP_CHAT, req, keys, 2, &in), 0);
	assert_string_equal(in.ei_routing_key, "first");
	extract_inputs_free(&in);
	/* Empty, over 128 bytes, or not UTF-8: skipped. */
	req = request_with("X-A:\r\nx-smg-routing-key: second\r\n");
	extract_inputs_headers(EXTRACT_EP_CHAT, req, keys, 2, &in);
	assert_string_equal(in.ei_routing_key, "second");
	extract_inputs_free(&in);
	memset(longv, 'v', 129);
	longv[129] = '\0';
	snprintf(hdr, sizeof(hdr), "X-A: %s\r\nx-smg-routing-key: ok\r\n",
	    longv);
	req = request_with(hdr);
	extract_inputs_headers(EXTRACT_EP_CHAT, req, keys, 2, &in);
	assert_string_equal(in.ei_routing_key, "ok");
	extract_inputs_free(&in);
	longv[128] = '\0';
	snprintf(hdr, sizeof(hdr), "X-A: %s\r\n", longv);
	req = request_with(hdr);
	extract_inputs_headers(EXTRACT_EP_CHAT, req, keys, 2, &in);
	assert_string_equal(in.ei_routing_key, longv);
	extract_inputs_free(&in);
	req = request_with("X-A: \xff\xfe\r\n");
	extract_inputs_headers(EXTRACT_EP_CHAT, req, keys, 2, &in);
	assert_null(in.ei_routing_key);
	extract_inputs_free(&in);
	req = request_with("X-A: caf\xc3\xa9\r\n");
	extract_inputs_headers(EXTRACT_EP_CHAT, req, keys, 2, &in);
	assert_string_equal(in.ei_routing_key, "caf\xc3\xa9");
	extract_inputs_free(&in);
	/* Not configured: not read. */
	req = request_with("X-B: b\r\n");
	extract_inputs_headers(EXTRACT_EP_CHAT, req, keys, 2, &in);
	assert_null(in.ei_routing_key);
	assert_null(in.ei_model);
	assert_false(in.ei_has_text);
	assert_int_equal(in.ei_batch_n, 1);
	extract_inputs_free(&in);

	assert_true(extract_utf8_valid("abc", 3));
	assert_false(extract_utf8_valid("\xc0\x80", 2));
	assert_false(extract_utf8_valid("\xed\xa0\x80", 3));
	assert_false(extract_utf8_valid("\xf4\x90\x80\x80", 4));
	assert_false(extract_utf8_valid("\xe2\x82", 2));
	assert_true(extract_utf8_valid("\xf0\x9f\x98\x80", 4));
}

static void
test_target_and_implicit(void **state)
{
	const struct http_request *req;
	struct extract_inputs in;

	(void)state;
	req = request_with("X-SMG-Target-Worker: 2\r\n"
	                   "Cookie: c=1\r\n"
	                   "Authorization: Bearer abc\r\n");
	extract_inputs_headers(EXTRACT_EP_CHAT, req, NULL, 0, &in);
	assert_true(in.ei_has_target_worker);
	assert_string_equal(in.ei_target_worker, "2");
	/* Lookup order authorization, x-forwarded-for, cookie. */
	assert_true(in.ei_has_implicit_key);
	assert_string_equal(in.ei_implicit_key, "Bearer abc");
	extract_inputs_free(&in);

	req = request_with("Cookie: c=1; d=2\r\nX-Forwarded-For: 10.0.0.1\r\n");
	extract_inputs_headers(EXTRACT_EP_CHAT, req, NULL, 0, &in);
	assert_string_equal(in.ei_implicit_key, "10.0.0.1");
	assert_false(in.ei_has_target_worker);
	extract_inputs_free(&in);

	req = request_with("Cookie: c=1; d=2\r\n");
	extract_inputs_headers(EXTRACT_EP_CHAT, req, NULL, 0, &in);
	assert_string_equal(in.ei_implicit_key, "c=1; d=2");
	extract_inputs_free(&in);

	/* The first present one is empty or not visible ASCII: none, even
	 * though a later one is fine. */
	req = request_with("Authorization:\r\nCookie: c=1\r\n");
	extract_inputs_headers(EXTRACT_EP_CHAT, req, NULL, 0, &in);
	assert_false(in.ei_has_implicit_key);
	assert_null(in.ei_implicit_key);
	extract_inputs_free(&in);
	req = request_with("X-Forwarded-For: caf\xc3\xa9\r\nCookie: c=1\r\n");
	extract_inputs_headers(EXTRACT_EP_CHAT, req, NULL, 0, &in);
	assert_false(in.ei_has_implicit_key);
	extract_inputs_free(&in);

	/* Target worker: empty or non-ASCII is absent. */
	req = request_with("X-SMG-Target-Worker:\r\n");
	extract_inputs_headers(EXTRACT_EP_CHAT, req, NULL, 0, &in);
	assert_false(in.ei_has_target_worker);
	extract_inputs_free(&in);
	req = request_with("X-SMG-Target-Worker: \xc3\xa9\r\n");
	extract_inputs_headers(EXTRACT_EP_CHAT, req, NULL, 0, &in);
	assert_false(in.ei_has_target_worker);
	extract_inputs_free(&in);
	/* Unparsable but visible: passed on (the policy answers 503). */
	req = request_with("X-SMG-Target-Worker: abc\r\n");
	extract_inputs_headers(EXTRACT_EP_CHAT, req, NULL, 0, &in);
	assert_string_equal(in.ei_target_worker, "abc");
	extract_inputs_free(&in);
}

static void
test_body_errors(void **state)
{
	(void)state;
	expect_fail("{\"model\":", 400, "json_parse_error");
	expect_fail("", 400, "json_parse_error");
	expect_fail("{} x", 400, "json_parse_error");
	expect_fail("[1,2]", 400, "invalid_request");
	expect_fail("\"str\"", 400, "invalid_request");
	expect_fail("{\"model\":5}", 422, "invalid_request");
	expect_fail("{\"stream\":\"yes\"}", 422, "invalid_request");
	expect_fail("{\"rid\":7}", 422, "invalid_request");
	expect_fail("{\"rid\":[7]}", 422, "invalid_request");
	{
		/* Trailing whitespace is fine; a length without the NUL too. */
		struct extract_inputs in;
		const char *code;
		char msg[64];
		int st;

		assert_int_equal(extract_inputs(EXTRACT_EP_CHAT,
		                     "{\"model\":\"m\"} \r\n\tGARBAGE", 16,
		                     NULL, NULL, 0, false, &in, &st, &code, msg,
		                     sizeof(msg)),
		    0);
		assert_string_equal(in.ei_model, "m");
		extract_inputs_free(&in);
	}
}

static void
test_request_id(void **state)
{
	static const char *const ids[] = { "x-request-id", "x-correlation-id",
		"x-trace-id", "request-id" };
	const struct http_request *req;
	char out[64];
	size_t i;

	(void)state;
	req =
	    request_with("X-Trace-Id: trace-1\r\nX-Correlation-Id: corr-1\r\n");
	extract_request_id(req, ids, 4, "/v1/chat/completions", out,
	    sizeof(out));
	assert_string_equal(out, "corr-1");

	req = request_with("X-Request-Id:\r\nRequest-Id: r9\r\n");
	extract_request_id(req, ids, 4, "/generate", out, sizeof(out));
	assert_string_equal(out, "r9");

	req = request_with("");
	extract_request_id(req, ids, 4, "/v1/chat/completions", out,
	    sizeof(out));
	assert_int_equal(strncmp(out, "chatcmpl-", 9), 0);
	assert_int_equal(strlen(out), 9 + 24);
	for (i = 9; i < strlen(out); i++)
		assert_non_null(strchr("0123456789abcdefghijklmnopqrstuvwxyz"
		                       "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
		    out[i]));
	extract_request_id(NULL, ids, 4, "/v1/completions", out, sizeof(out));
	assert_int_equal(strncmp(out, "cmpl-", 5), 0);
	assert_int_equal(strlen(out), 5 + 24);
	extract_request_id(NULL, NULL, 0, "/generate", out, sizeof(out));
	assert_int_equal(strncmp(out, "gnt-", 4), 0);
	extract_request_id(NULL, NULL, 0, "/v1/responses", out, sizeof(out));
	assert_int_equal(strncmp(out, "resp-", 5), 0);
	extract_request_id(NULL, NULL, 0, "/v1/messages", out, sizeof(out));
	assert_int_equal(strncmp(out, "msg_", 4), 0);
	extract_request_id(NULL, NULL, 0, "/v1/embeddings", out, sizeof(out));
	assert_int_equal(strncmp(out, "req-", 4), 0);
	/* A tiny buffer still gets a terminated string. */
	extract_request_id(NULL, NULL, 0, "/v1/messages", out, 3);
	assert_string_equal(out, "ms");
}

/* ------------------------------------------------- lean vs full path */

struct result {
	int rv, status;
	const char *code;
	struct extract_inputs in;
};

static void
run_one(bool lean, enum extract_endpoint ep, const char *body, size_t len,
    const struct http_request *req, bool override, struct result *r)
{
	char msg[128];

	memset(r, 0, sizeof(*r));
	extract_set_lean(lean, NULL);
	r->rv = extract_inputs(ep, body, len, req, default_keys, 1, override,
	    &r->in, &r->status, &r->code, msg, sizeof(msg));
	extract_set_lean(false, NULL);
}

static void
same_str(const char *a, const char *b, const char *what, const char *body)
{
	if ((a == NULL) != (b == NULL) || (a != NULL && strcmp(a, b) != 0))
		fail_msg("%s differs (full '%s', lean '%s') for %s", what,
		    a ? a : "(null)", b ? b : "(null)", body);
}

/*
 * Both paths on one body: the same answer, field by field. Returns whether
 * the lean path took the body itself (no parse tree).
 */
static bool
same_inputs(enum extract_endpoint ep, const char *body, size_t len,
    const struct http_request *req, bool override)
{
	struct result f, l;
	bool took;

	run_one(false, ep, body, len, req, override, &f);
	run_one(true, ep, body, len, req, override, &l);
	if (f.rv != l.rv || f.status != l.status ||
	    (f.rv != 0 && strcmp(f.code, l.code) != 0))
		fail_msg("outcome differs (full %d %d, lean %d %d) for %.*s",
		    f.rv, f.status, l.rv, l.status, (int)len, body);
	took = l.rv == 0 && l.in.ei_json == NULL;
	if (f.rv == 0) {
		same_str(f.in.ei_model, l.in.ei_model, "model", body);
		same_str(f.in.ei_rid, l.in.ei_rid, "rid", body);
		same_str(f.in.ei_rid_key, l.in.ei_rid_key, "rid key", body);
		same_str(f.in.ei_routing_key, l.in.ei_routing_key,
		    "routing key", body);
		if (f.in.ei_stream != l.in.ei_stream ||
		    f.in.ei_has_text != l.in.ei_has_text ||
		    f.in.ei_size != l.in.ei_size ||
		    f.in.ei_has_tokens != l.in.ei_has_tokens ||
		    f.in.ei_ntokens != l.in.ei_ntokens)
			fail_msg("stream/text/size/tokens differ (full %d %d "
			         "%llu %d, lean %d %d %llu %d) for %.*s",
			    f.in.ei_stream, f.in.ei_has_text,
			    (unsigned long long)f.in.ei_size,
			    f.in.ei_has_tokens, l.in.ei_stream,
			    l.in.ei_has_text, (unsigned long long)l.in.ei_size,
			    l.in.ei_has_tokens, (int)len, body);
		if (!took) {
			same_str(f.in.ei_text, l.in.ei_text, "text", body);
			assert_int_equal(f.in.ei_batch_n, l.in.ei_batch_n);
		} else {
			assert_null(l.in.ei_text);
		}
	}
	extract_inputs_free(&f.in);
	extract_inputs_free(&l.in);
	return took;
}

static const struct {
	enum extract_endpoint ep;
	const char *body;
	bool lean; /* the lean path answers it itself */
} lean_cases[] = {
	{ EXTRACT_EP_COMPLETIONS,
	    "{\"model\":\"m\",\"prompt\":\"hello "
	    "w\\u00f6rld\",\"max_tokens\":8}",
	    true },
	{ EXTRACT_EP_COMPLETIONS,
	    " {\"prompt\":[\"a\",\"\",3,\"b\\ud83d\\ude00\"],\"stream\":true,"
	    "\"x\":[1.5e-3,-0,{\"y\":null},[true,false]]}\r\n",
	    true },
	{ EXTRACT_EP_COMPLETIONS,
	    "{\"prompt\":\"a\",\"prompt\":\"bbbb\",\"model\":null,\"model\":1}",
	    true },
	{ EXTRACT_EP_COMPLETIONS, "{\"prompt\":{\"a\":\"b\"}}", true },
	{ EXTRACT_EP_COMPLETIONS, "{}", true },
	{ EXTRACT_EP_COMPLETIONS, "{\"model\":\"m\\/\\\"q\\\"\\n\"}", true },
	{ EXTRACT_EP_COMPLETIONS, "{\"rid\":\"conv_t2_r1\"}", true },
	{ EXTRACT_EP_COMPLETIONS, "{\"rid\":[\"abc_r3\",\"x\"]}", true },
	{ EXTRACT_EP_COMPLETIONS, "{\"rid\":[]}", true },
	{ EXTRACT_EP_COMPLETIONS, "{\"rid\":[null]}", true },
	{ EXTRACT_EP_COMPLETIONS, "{\"rid\":[1]}", false },
	{ EXTRACT_EP_COMPLETIONS, "{\"rid\":5}", false },
	{ EXTRACT_EP_COMPLETIONS, "{\"model\":5}", false },
	{ EXTRACT_EP_COMPLETIONS, "{\"stream\":\"yes\"}", false },
	{ EXTRACT_EP_COMPLETIONS, "{\"stream\":null,\"stream\":true}", true },
	{ EXTRACT_EP_COMPLETIONS, "{\"prompt\":\"a\\u0000b\"}", false },
	{ EXTRACT_EP_COMPLETIONS, "{\"prompt\":\"a\\ud800\"}", false },
	{ EXTRACT_EP_COMPLETIONS, "{\"prompt\":\"a\\q\"}", false },
	{ EXTRACT_EP_COMPLETIONS, "{\"prompt\":\"a\tb\"}", false },
	{ EXTRACT_EP_COMPLETIONS, "{\"pro\\u006dpt\":\"a\"}", false },
	{ EXTRACT_EP_COMPLETIONS, "\xef\xbb\xbf{\"prompt\":\"a\"}", false },
	{ EXTRACT_EP_COMPLETIONS, "{\"a\":01}", false },
	{ EXTRACT_EP_COMPLETIONS, "{\"a\":1.}", false },
	{ EXTRACT_EP_COMPLETIONS, "{\"a\":[1,]}", false },
	{ EXTRACT_EP_COMPLETIONS, "{\"a\":1,}", false },
	{ EXTRACT_EP_COMPLETIONS, "{\"a\":1} x", false },
	{ EXTRACT_EP_COMPLETIONS, "[1,2]", false },
	{ EXTRACT_EP_COMPLETIONS, "", false },
	{ EXTRACT_EP_COMPLETIONS, "{\"a\":tru}", false },
	{ EXTRACT_EP_COMPLETIONS,
	    "{\"a\":1234567890123456789012345678901234567890123456789012345678"
	    "901234}",
	    false },
	{ EXTRACT_EP_CHAT,
	    "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":"
	    "\"be nice\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
	    "\"text\":\"hi\"},{\"type\":\"image_url\",\"image_url\":{}},"
	    "{\"text\":\"no type\"},{\"type\":\"text\",\"text\":\"\"},"
	    "{\"type\":\"text\",\"text\":\"there\",\"text\":\"x\"}]},"
	    "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":"
	    "\"think\"},3,{\"content\":null}],\"n\":2}",
	    true },
	{ EXTRACT_EP_CHAT,
	    "{\"messages\":[{\"content\":[{\"type\":5,\"type\":\"text\","
	    "\"text\":\"a\"},{\"type\":\"text\",\"text\":7}]}]}",
	    true },
	{ EXTRACT_EP_CHAT, "{\"messages\":[{\"content\":{\"a\":\"b\"}}]}",
	    false },
	{ EXTRACT_EP_CHAT, "{\"messages\":{\"content\":\"x\"}}", true },
	{ EXTRACT_EP_GENERATE, "{\"text\":\"abc\",\"input_ids\":[1,2]}", true },
	{ EXTRACT_EP_GENERATE, "{\"text\":[\"a\",\"b\"]}", true },
	{ EXTRACT_EP_GENERATE, "{\"input_ids\":[1,2,3]}", false },
	{ EXTRACT_EP_GENERATE, "{\"text\":null,\"sampling_params\":{}}", true },
	{ EXTRACT_EP_EMBEDDINGS, "{\"input\":[\"x\",[1],\"yy\"]}", true },
	{ EXTRACT_EP_CLASSIFY, "{\"input\":\"abc\"}", true },
	{ EXTRACT_EP_RERANK, "{\"query\":\"q\",\"documents\":[\"a\"]}", true },
	{ EXTRACT_EP_RERANK, "{\"query\":[\"q\"]}", true },
	{ EXTRACT_EP_MESSAGES, "{\"messages\":[]}", false },
	{ EXTRACT_EP_RESPONSES, "{\"input\":\"x\"}", false },
};

static void
test_lean_same_as_full(void **state)
{
	const struct http_request *req;
	size_t i;
	bool took;

	(void)state;
	req = request_with("");
	for (i = 0; i < sizeof(lean_cases) / sizeof(lean_cases[0]); i++) {
		took = same_inputs(lean_cases[i].ep, lean_cases[i].body,
		    strlen(lean_cases[i].body), req, true);
		if (took != lean_cases[i].lean)
			fail_msg("case %zu: lean path %s it: %s", i,
			    took ? "took" : "did not take", lean_cases[i].body);
	}
	/* Header tokens win over text on both paths. */
	req = request_with("X-SMG-Routing-Tokens: 1,2,3\r\n"
	                   "X-SMG-Routing-Key: k\r\n");
	assert_true(same_inputs(EXTRACT_EP_COMPLETIONS,
	    "{\"prompt\":\"abcdef\"}", 19, req, false));
	assert_true(
	    same_inputs(EXTRACT_EP_GENERATE,
	        "{\"input_ids\":null,\"text\":null}", 30, req, false) == false);
}

/* Mutated bodies (bytes replaced, cut short): never a different answer. */
static void
test_lean_mutations(void **state)
{
	static const char *const seeds[] = {
		"{\"model\":\"m\",\"prompt\":\"h\\u00e9llo \\ud83d\\ude00\","
		"\"stream\":true,\"rid\":[\"r_t1_r2\"],\"n\":-1.5e+3}",
		"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
		"\"text\",\"text\":\"a b\"}]},{\"content\":\"x\","
		"\"reasoning_content\":\"y\"}],\"model\":\"q\"}",
		"{\"text\":[\"a\",\"\"],\"input_ids\":[[1],[2]],\"rid\":null}",
		/* Long strings: the eight-byte scan, with special bytes
		 * landing anywhere in a word. */
		"{\"prompt\":\"The quick brown fox \xe2\x80\x94 jumps \xc3\xbc"
		"ber the lazy dog, then \\\"quoted\\\" text and a tab\\t "
		"here; more plain words to fill a few words of the scan\","
		"\"model\":\"some-model-name\"}",
	};
	static const enum extract_endpoint eps[] = { EXTRACT_EP_COMPLETIONS,
		EXTRACT_EP_CHAT, EXTRACT_EP_GENERATE, EXTRACT_EP_COMPLETIONS };
	static const char alphabet[] = "{}[]\":,\\u0aT \t\x01\x80\xc3\xa9-.e";
	const struct http_request *req;
	char body[512];
	uint64_t x = 42;
	size_t i, k, len, n, took = 0;

	(void)state;
	req = request_with("");
	for (i = 0; i < 40000; i++) {
		k = i % 4;
		len = strlen(seeds[k]);
		memcpy(body, seeds[k], len);
		for (n = 0; n < 1 + i % 3; n++) {
			x = x * 6364136223846793005ull + 1442695040888963407ull;
			body[(x >> 33) % len] =
			    alphabet[(x >> 17) % (sizeof(alphabet) - 1)];
		}
		if (i % 7 == 0)
			len = (size_t)((x >> 40) % len);
		if (same_inputs(eps[k], body, len, req, i % 2 == 0))
			took++;
	}
	/* Both paths were exercised. */
	assert_true(took > 4000 && took < 36000);
	print_message("lean path took %zu of 40000 mutated bodies\n", took);
}

static int
teardown(void **state)
{
	(void)state;
	http_reader_free(reader);
	reader = NULL;
	return 0;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_routes),
		cmocka_unit_test(test_chat_text),
		cmocka_unit_test(test_completions_text),
		cmocka_unit_test(test_embeddings_classify_rerank_text),
		cmocka_unit_test(test_messages_text),
		cmocka_unit_test(test_responses_text),
		cmocka_unit_test(test_generate),
		cmocka_unit_test(test_chat_batch_and_stream),
		cmocka_unit_test(test_routing_tokens_header),
		cmocka_unit_test(test_lineage),
		cmocka_unit_test(test_rid),
		cmocka_unit_test(test_routing_key),
		cmocka_unit_test(test_target_and_implicit),
		cmocka_unit_test(test_body_errors),
		cmocka_unit_test(test_request_id),
		cmocka_unit_test(test_lean_same_as_full),
		cmocka_unit_test(test_lean_mutations),
	};

	return cmocka_run_group_tests(tests, NULL, teardown);
}
