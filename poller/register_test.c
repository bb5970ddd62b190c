/*
 * register_test.c: parsing what workers answer at registration:
 * /v1/models in SGLang and vLLM shapes, missing or odd fields, and the
 * model_path of /model_info.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "poller/poller.h"

static int
parse(const char *body, struct register_models *rm)
{
	return register_parse_models(body, strlen(body), rm);
}

static void
test_sglang_shape(void **state)
{
	struct register_models rm;

	(void)state;
	assert_int_equal(parse("{\"object\":\"list\",\"data\":[{\"id\":"
	                       "\"meta-llama/Llama-3.1-8B-Instruct\","
	                       "\"object\":\"model\",\"created\":1700000000,"
	                       "\"owned_by\":\"sglang\",\"root\":"
	                       "\"/models/llama\",\"max_model_len\":131072}]}",
	                     &rm),
	    0);
	assert_string_equal(rm.rm_id, "meta-llama/Llama-3.1-8B-Instruct");
	assert_string_equal(rm.rm_runtime, "sglang");
	assert_string_equal(rm.rm_root, "/models/llama");
}

static void
test_vllm_shape(void **state)
{
	struct register_models rm;

	(void)state;
	assert_int_equal(
	    parse("{\"object\":\"list\",\"data\":[{\"id\":\"qwen\","
	          "\"object\":\"model\",\"owned_by\":\"vLLM\","
	          "\"root\":\"Qwen/Qwen2.5\",\"parent\":null,"
	          "\"permission\":[{\"id\":\"x\"}]},{\"id\":"
	          "\"lora-a\",\"owned_by\":\"vllm\"}]}",
	        &rm),
	    0);
	/* First entry only; owned_by is case-insensitive. */
	assert_string_equal(rm.rm_id, "qwen");
	assert_string_equal(rm.rm_runtime, "vllm");
}

static void
test_other_engines(void **state)
{
	struct register_models rm;

	(void)state;
	assert_int_equal(parse("{\"data\":[{\"id\":\"m\",\"owned_by\":"
	                       "\"nvidia\"}]}",
	                     &rm),
	    0);
	assert_string_equal(rm.rm_runtime, "trtllm");
	assert_int_equal(parse("{\"data\":[{\"id\":\"m\",\"owned_by\":"
	                       "\"openai\"}]}",
	                     &rm),
	    0);
	assert_string_equal(rm.rm_id, "m");
	assert_string_equal(rm.rm_runtime, "");
}

static void
test_missing_fields(void **state)
{
	struct register_models rm;

	(void)state;
	/* A live listing without entries or fields: parsed, nothing known. */
	assert_int_equal(parse("{\"object\":\"list\",\"data\":[]}", &rm), 0);
	assert_string_equal(rm.rm_id, "");
	assert_string_equal(rm.rm_runtime, "");
	assert_int_equal(parse("{}", &rm), 0);
	assert_string_equal(rm.rm_id, "");
	assert_int_equal(parse("{\"data\":[{\"object\":\"model\"}]}", &rm), 0);
	assert_string_equal(rm.rm_id, "");
	assert_string_equal(rm.rm_root, "");
	/* Wrong types are ignored, not trusted. */
	assert_int_equal(parse("{\"data\":[{\"id\":7,\"owned_by\":[1]}]}", &rm),
	    0);
	assert_string_equal(rm.rm_id, "");
	assert_string_equal(rm.rm_runtime, "");
	assert_int_equal(parse("{\"data\":{\"id\":\"m\"}}", &rm), 0);
	assert_string_equal(rm.rm_id, "");
	assert_int_equal(parse("{\"data\":[\"m\"]}", &rm), 0);
	assert_string_equal(rm.rm_id, "");
}

static void
test_not_json(void **state)
{
	struct register_models rm;

	(void)state;
	assert_int_equal(parse("", &rm), -1);
	assert_int_equal(parse("<html>404</html>", &rm), -1);
	assert_int_equal(parse("[{\"id\":\"m\"}]", &rm), -1);
	assert_int_equal(parse("{\"data\":[{\"id\":\"m\"", &rm), -1);
	/* Bytes after the given length are not read. */
	assert_int_equal(register_parse_models("{}garbage", 2, &rm), 0);
}

static void
test_long_values(void **state)
{
	struct register_models rm;
	char body[1024], id[400];

	(void)state;
	memset(id, 'a', sizeof(id) - 1);
	id[sizeof(id) - 1] = '\0';
	snprintf(body, sizeof(body),
	    "{\"data\":[{\"id\":\"%s\",\"owned_by\":\"%s\"}]}", id, id);
	assert_int_equal(parse(body, &rm), 0);
	assert_int_equal(strlen(rm.rm_id), SHM_MODEL_MAX - 1);
	assert_string_equal(rm.rm_runtime, "");
}

static void
test_model_info(void **state)
{
	char model[SHM_MODEL_MAX];
	const char *ok = "{\"model_path\":\"/models/llama\","
	                 "\"tokenizer_path\":\"/t\",\"is_generation\":true}";

	(void)state;
	assert_int_equal(
	    register_parse_model_info(ok, strlen(ok), model, sizeof(model)), 0);
	assert_string_equal(model, "/models/llama");
	assert_int_equal(register_parse_model_info("{\"model_path\":\"\"}", 18,
	                     model, sizeof(model)),
	    -1);
	assert_int_equal(register_parse_model_info("{\"model_path\":3}", 16,
	                     model, sizeof(model)),
	    -1);
	assert_int_equal(
	    register_parse_model_info("{}", 2, model, sizeof(model)), -1);
	assert_int_equal(
	    register_parse_model_info("nope", 4, model, sizeof(model)), -1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sglang_shape),
		cmocka_unit_test(test_vllm_shape),
		cmocka_unit_test(test_other_engines),
		cmocka_unit_test(test_missing_fields),
		cmocka_unit_test(test_not_json),
		cmocka_unit_test(test_long_values),
		cmocka_unit_test(test_model_info),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
