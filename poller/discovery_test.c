/*
 * discovery_test.c: pod objects to workers (selector, readiness, address,
 * bootstrap port, model id), watch event lines and the line splitter,
 * with hostile input: wrong types, bad addresses, oversized lines.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "poller/poller.h"

static const char *const sel_app[] = { "app=sglang", "tier=gpu" };

static struct discovery_rule
rule(int type, const char *model_from)
{
	struct discovery_rule r = {
		.dr_selector = sel_app,
		.dr_nselector = 2,
		.dr_type = type,
		.dr_port = 8000,
		.dr_model_from = model_from,
	};
	return r;
}

/* A pod as the API serves it; fields left NULL are omitted. */
static int
parse(const char *json, const struct discovery_rule *r,
    struct discovery_pod *out)
{
	cJSON *o = cJSON_Parse(json);
	int rv;

	assert_non_null(o);
	rv = discovery_pod_parse(o, r, out);
	cJSON_Delete(o);
	return rv;
}

#define POD(labels, ann, phase, ip, ready)                                     \
	"{\"metadata\":{\"name\":\"p1\",\"namespace\":\"llm\","                \
	"\"labels\":" labels ",\"annotations\":" ann                           \
	"},\"status\":{\"phase\":\"" phase "\",\"podIP\":\"" ip                \
	"\",\"conditions\":[{\"type\":\"Initialized\","                        \
	"\"status\":\"True\"},{\"type\":\"Ready\",\"status\":\"" ready         \
	"\"}]}}"

#define LABELS "{\"app\":\"sglang\",\"tier\":\"gpu\",\"model\":\"m-7b\"}"

static void
test_ready_pod(void **state)
{
	struct discovery_rule r =
	    rule(SMG__WORKER_TYPE__WORKER_TYPE_REGULAR, NULL);
	struct discovery_pod p;

	(void)state;
	assert_int_equal(
	    parse(POD(LABELS, "{}", "Running", "10.1.2.3", "True"), &r, &p), 1);
	assert_true(p.dp_ready);
	assert_string_equal(p.dp_key, "llm/p1");
	assert_string_equal(p.dp_url, "http://10.1.2.3:8000");
	assert_int_equal(p.dp_type, SMG__WORKER_TYPE__WORKER_TYPE_REGULAR);
	assert_int_equal(p.dp_bootstrap_port, -1);
	assert_string_equal(p.dp_model, "");

	assert_int_equal(
	    parse(POD(LABELS, "{}", "Running", "fd00::7", "True"), &r, &p), 1);
	assert_string_equal(p.dp_url, "http://[fd00::7]:8000");
}

static void
test_not_ready(void **state)
{
	struct discovery_rule r =
	    rule(SMG__WORKER_TYPE__WORKER_TYPE_REGULAR, NULL);
	struct discovery_pod p;

	(void)state;
	assert_int_equal(
	    parse(POD(LABELS, "{}", "Running", "10.1.2.3", "False"), &r, &p),
	    1);
	assert_false(p.dp_ready);
	assert_int_equal(
	    parse(POD(LABELS, "{}", "Pending", "10.1.2.3", "True"), &r, &p), 1);
	assert_false(p.dp_ready);
	/* being deleted */
	assert_int_equal(
	    parse("{\"metadata\":{\"name\":\"p1\",\"labels\":" LABELS
	          ",\"deletionTimestamp\":\"2026-01-01T00:00:00Z\"},"
	          "\"status\":{\"phase\":\"Running\",\"podIP\":"
	          "\"10.0.0.1\",\"conditions\":[{\"type\":"
	          "\"Ready\",\"status\":\"True\"}]}}",
	        &r, &p),
	    1);
	assert_false(p.dp_ready);
	assert_string_equal(p.dp_key, "/p1");
	/* no conditions, no status at all */
	assert_int_equal(
	    parse("{\"metadata\":{\"name\":\"p1\",\"labels\":" LABELS
	          "},\"status\":{\"phase\":\"Running\",\"podIP\":"
	          "\"10.0.0.1\"}}",
	        &r, &p),
	    1);
	assert_false(p.dp_ready);
	assert_int_equal(
	    parse("{\"metadata\":{\"name\":\"p1\",\"labels\":" LABELS "}}", &r,
	        &p),
	    1);
	assert_false(p.dp_ready);
}

static void
test_selector(void **state)
{
	struct discovery_rule r =
	    rule(SMG__WORKER_TYPE__WORKER_TYPE_REGULAR, NULL);
	struct discovery_pod p;

	(void)state;
	/* one label of two, a wrong value, a non-string value, no labels */
	assert_int_equal(parse(POD("{\"app\":\"sglang\"}", "{}", "Running",
	                           "10.0.0.1", "True"),
	                     &r, &p),
	    0);
	assert_string_equal(p.dp_key, "llm/p1");
	assert_int_equal(parse(POD("{\"app\":\"sglang\",\"tier\":\"cpu\"}",
	                           "{}", "Running", "10.0.0.1", "True"),
	                     &r, &p),
	    0);
	assert_int_equal(parse(POD("{\"app\":\"sglang\",\"tier\":7}", "{}",
	                           "Running", "10.0.0.1", "True"),
	                     &r, &p),
	    0);
	assert_int_equal(
	    parse(POD("null", "{}", "Running", "10.0.0.1", "True"), &r, &p), 0);
	/* an empty selector selects nothing (SMG) */
	r.dr_nselector = 0;
	assert_int_equal(
	    parse(POD(LABELS, "{}", "Running", "10.0.0.1", "True"), &r, &p), 0);
}

static void
test_hostile(void **state)
{
	struct discovery_rule r =
	    rule(SMG__WORKER_TYPE__WORKER_TYPE_REGULAR, NULL);
	struct discovery_pod p;
	char big[600], *json;
	size_t len;

	(void)state;
	/* not an object, no metadata, no name, a name of the wrong type */
	assert_int_equal(parse("[]", &r, &p), -1);
	assert_int_equal(parse("{}", &r, &p), -1);
	assert_int_equal(parse("{\"metadata\":{}}", &r, &p), -1);
	assert_int_equal(parse("{\"metadata\":{\"name\":5}}", &r, &p), -1);
	assert_int_equal(parse("{\"metadata\":{\"name\":\"\"}}", &r, &p), -1);
	/* addresses that would inject into the URL */
	assert_int_equal(
	    parse(POD(LABELS, "{}", "Running", "10.0.0.1/evil?x=", "True"), &r,
	        &p),
	    1);
	assert_false(p.dp_ready);
	assert_int_equal(
	    parse(POD(LABELS, "{}", "Running", "user@10.0.0.1", "True"), &r,
	        &p),
	    1);
	assert_false(p.dp_ready);
	assert_int_equal(
	    parse(POD(LABELS, "{}", "Running", "", "True"), &r, &p), 1);
	assert_false(p.dp_ready);
	/* conditions of the wrong shape */
	assert_int_equal(
	    parse("{\"metadata\":{\"name\":\"p\",\"labels\":" LABELS
	          "},\"status\":{\"phase\":\"Running\",\"podIP\":"
	          "\"10.0.0.1\",\"conditions\":{\"type\":"
	          "\"Ready\",\"status\":\"True\"}}}",
	        &r, &p),
	    1);
	assert_false(p.dp_ready);
	/* a name too long for the key */
	memset(big, 'n', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	len = strlen(big) + 64;
	json = malloc(len);
	assert_non_null(json);
	snprintf(json, len, "{\"metadata\":{\"name\":\"%s\"}}", big);
	assert_int_equal(parse(json, &r, &p), -1);
	free(json);
}

static void
test_prefill_bootstrap(void **state)
{
	struct discovery_rule r =
	    rule(SMG__WORKER_TYPE__WORKER_TYPE_PREFILL, NULL);
	struct discovery_pod p;

	(void)state;
	assert_int_equal(
	    parse(POD(LABELS, "{\"sglang.ai/bootstrap-port\":\"8998\"}",
	              "Running", "10.0.0.1", "True"),
	        &r, &p),
	    1);
	assert_int_equal(p.dp_type, SMG__WORKER_TYPE__WORKER_TYPE_PREFILL);
	assert_int_equal(p.dp_bootstrap_port, 8998);
	/* out of range, not a number, signed, a number type */
	assert_int_equal(
	    parse(POD(LABELS, "{\"sglang.ai/bootstrap-port\":\"70000\"}",
	              "Running", "10.0.0.1", "True"),
	        &r, &p),
	    1);
	assert_int_equal(p.dp_bootstrap_port, -1);
	assert_int_equal(
	    parse(POD(LABELS, "{\"sglang.ai/bootstrap-port\":\"89x\"}",
	              "Running", "10.0.0.1", "True"),
	        &r, &p),
	    1);
	assert_int_equal(p.dp_bootstrap_port, -1);
	assert_int_equal(
	    parse(POD(LABELS, "{\"sglang.ai/bootstrap-port\":\"-1\"}",
	              "Running", "10.0.0.1", "True"),
	        &r, &p),
	    1);
	assert_int_equal(p.dp_bootstrap_port, -1);
	assert_int_equal(
	    parse(POD(LABELS, "{\"sglang.ai/bootstrap-port\":8998}", "Running",
	              "10.0.0.1", "True"),
	        &r, &p),
	    1);
	assert_int_equal(p.dp_bootstrap_port, -1);
	/* decode pods carry none */
	r.dr_type = SMG__WORKER_TYPE__WORKER_TYPE_DECODE;
	assert_int_equal(
	    parse(POD(LABELS, "{\"sglang.ai/bootstrap-port\":\"8998\"}",
	              "Running", "10.0.0.1", "True"),
	        &r, &p),
	    1);
	assert_int_equal(p.dp_bootstrap_port, -1);
}

static void
test_model_from(void **state)
{
	struct discovery_rule r;
	struct discovery_pod p;

	(void)state;
	r = rule(SMG__WORKER_TYPE__WORKER_TYPE_REGULAR, "label:model");
	assert_int_equal(
	    parse(POD(LABELS, "{}", "Running", "10.0.0.1", "True"), &r, &p), 1);
	assert_string_equal(p.dp_model, "m-7b");
	r = rule(SMG__WORKER_TYPE__WORKER_TYPE_REGULAR, "namespace");
	assert_int_equal(
	    parse(POD(LABELS, "{}", "Running", "10.0.0.1", "True"), &r, &p), 1);
	assert_string_equal(p.dp_model, "llm");
	r = rule(SMG__WORKER_TYPE__WORKER_TYPE_REGULAR, "annotation:m");
	assert_int_equal(parse(POD(LABELS, "{\"m\":\"org/x\"}", "Running",
	                           "10.0.0.1", "True"),
	                     &r, &p),
	    1);
	assert_string_equal(p.dp_model, "org/x");
	assert_int_equal(
	    parse(POD(LABELS, "{\"m\":3}", "Running", "10.0.0.1", "True"), &r,
	        &p),
	    1);
	assert_string_equal(p.dp_model, "");
}

static void
test_events(void **state)
{
	const cJSON *obj;
	cJSON *doc;
	int code;

	(void)state;
#define EV(s) discovery_event_parse(s, strlen(s), &doc, &obj, &code)
	assert_int_equal(
	    EV("{\"type\":\"ADDED\",\"object\":{\"metadata\":{}}}"),
	    DISCOVERY_EV_ADDED);
	assert_non_null(obj);
	cJSON_Delete(doc);
	assert_int_equal(EV("{\"type\":\"MODIFIED\",\"object\":{}}"),
	    DISCOVERY_EV_MODIFIED);
	cJSON_Delete(doc);
	assert_int_equal(EV("{\"type\":\"DELETED\",\"object\":{}}"),
	    DISCOVERY_EV_DELETED);
	cJSON_Delete(doc);
	assert_int_equal(EV("{\"type\":\"BOOKMARK\",\"object\":{\"metadata\":"
	                    "{\"resourceVersion\":\"12\"}}}"),
	    DISCOVERY_EV_BOOKMARK);
	cJSON_Delete(doc);
	assert_int_equal(EV("{\"type\":\"ERROR\",\"object\":{\"kind\":"
	                    "\"Status\",\"code\":410,\"reason\":\"Expired\"}}"),
	    DISCOVERY_EV_ERROR);
	assert_int_equal(code, 410);
	cJSON_Delete(doc);
	assert_int_equal(EV("{\"type\":\"ERROR\",\"object\":{\"code\":1e300}}"),
	    DISCOVERY_EV_ERROR);
	assert_int_equal(code, 0);
	cJSON_Delete(doc);
	/* hostile */
	assert_int_equal(EV("not json"), DISCOVERY_EV_BAD);
	assert_null(doc);
	assert_int_equal(EV("{\"type\":\"ADDED\"}"), DISCOVERY_EV_BAD);
	cJSON_Delete(doc);
	assert_int_equal(EV("{\"type\":\"ADDED\",\"object\":[]}"),
	    DISCOVERY_EV_BAD);
	cJSON_Delete(doc);
	assert_int_equal(EV("{\"type\":7,\"object\":{}}"), DISCOVERY_EV_BAD);
	cJSON_Delete(doc);
	assert_int_equal(EV("{\"type\":\"EXPLODED\",\"object\":{}}"),
	    DISCOVERY_EV_BAD);
	cJSON_Delete(doc);
	assert_int_equal(EV("[1,2]"), DISCOVERY_EV_BAD);
	cJSON_Delete(doc);
#undef EV
}

struct seen {
	char lines[8][64];
	int n;
	int stop_at; /* return -1 on this line, -1 never */
};

static int
on_line(void *arg, const char *line, size_t len)
{
	struct seen *s = arg;

	assert_int_equal(strlen(line), len);
	if (s->n < 8)
		snprintf(s->lines[s->n], sizeof(s->lines[0]), "%s", line);
	if (s->n++ == s->stop_at)
		return -1;
	return 0;
}

static void
test_lines(void **state)
{
	struct discovery_lines l = { .dl_max = 16 };
	struct seen s = { .stop_at = -1 };
	char big[40];

	(void)state;
	/* split across feeds, CRLF, empty lines skipped */
	assert_int_equal(discovery_lines_feed(&l, "ab", 2, on_line, &s), 0);
	assert_int_equal(s.n, 0);
	assert_int_equal(
	    discovery_lines_feed(&l, "c\r\n\n\nde", 7, on_line, &s), 0);
	assert_int_equal(s.n, 1);
	assert_string_equal(s.lines[0], "abc");
	assert_int_equal(discovery_lines_feed(&l, "f\n", 2, on_line, &s), 0);
	assert_int_equal(s.n, 2);
	assert_string_equal(s.lines[1], "def");
	/* a line of exactly dl_max bytes passes; one more fails */
	assert_int_equal(
	    discovery_lines_feed(&l, "0123456789abcdef\n", 17, on_line, &s), 0);
	assert_int_equal(s.n, 3);
	memset(big, 'x', sizeof(big));
	assert_int_equal(discovery_lines_feed(&l, big, 10, on_line, &s), 0);
	assert_int_equal(discovery_lines_feed(&l, big, 10, on_line, &s), -1);
	assert_int_equal(s.n, 3);
	/* after the failure the splitter starts clean */
	assert_int_equal(discovery_lines_feed(&l, "ok\n", 3, on_line, &s), 0);
	assert_string_equal(s.lines[3], "ok");
	/* the callback stops the feed */
	s.stop_at = 4;
	assert_int_equal(discovery_lines_feed(&l, "a\nb\n", 4, on_line, &s),
	    -1);
	assert_int_equal(s.n, 5);
	discovery_lines_reset(&l);
	discovery_lines_reset(&l);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ready_pod),
		cmocka_unit_test(test_not_ready),
		cmocka_unit_test(test_selector),
		cmocka_unit_test(test_hostile),
		cmocka_unit_test(test_prefill_bootstrap),
		cmocka_unit_test(test_model_from),
		cmocka_unit_test(test_events),
		cmocka_unit_test(test_lines),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
