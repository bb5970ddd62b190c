/* otlp_test.c: unit tests of shared/otlp.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "otlp_trace_service.pb-c.h"

#include "shared/otlp.h"

static void
fill_span(struct otlp_span *sp, uint8_t seed)
{
	memset(sp, 0, sizeof(*sp));
	memset(sp->os_trace_id, 0xa0 + seed, sizeof(sp->os_trace_id));
	memset(sp->os_span_id, 0x10 + seed, sizeof(sp->os_span_id));
	sp->os_flags = 1;
	sp->os_kind = OTLP_KIND_CLIENT;
	sp->os_start_ns = 1700000000000000000ull + seed;
	sp->os_end_ns = sp->os_start_ns + 1234;
	strcpy(sp->os_name, "POST /v1/chat/completions");
}

/* What protobuf-c decodes of our bytes is what we put in. */
static void
test_encode_roundtrip(void **state)
{
	Opentelemetry__Proto__Collector__Trace__V1__ExportTraceServiceRequest
	    *req;
	Opentelemetry__Proto__Trace__V1__Span *s;
	Opentelemetry__Proto__Common__V1__KeyValue *kv;
	struct otlp_span a, b;
	const struct otlp_span *spans[2] = { &a, &b };
	char longv[200];
	uint8_t *buf;
	size_t len;

	(void)state;
	fill_span(&a, 0);
	fill_span(&b, 1);
	memset(a.os_parent_id, 0x77, sizeof(a.os_parent_id));
	a.os_remote_parent = true;
	a.os_kind = OTLP_KIND_SERVER;
	a.os_error = true;
	otlp_span_str(&a, "http.request.method", "POST");
	otlp_span_int(&a, "http.response.status_code", 503);
	otlp_span_bool(&a, "smg.fallback", true);
	memset(longv, 'x', sizeof(longv) - 1);
	longv[sizeof(longv) - 1] = '\0';
	otlp_span_str(&a, "url.path", longv);

	buf = otlp_encode(spans, 2, "smg", &len);
	assert_non_null(buf);
	req =
	    opentelemetry__proto__collector__trace__v1__export_trace_service_request__unpack(
	        NULL, len, buf);
	free(buf);
	assert_non_null(req);
	assert_int_equal(req->n_resource_spans, 1);
	assert_int_equal(req->resource_spans[0]->resource->n_attributes, 1);
	kv = req->resource_spans[0]->resource->attributes[0];
	assert_string_equal(kv->key, "service.name");
	assert_string_equal(kv->value->string_value, "smg");
	assert_int_equal(req->resource_spans[0]->n_scope_spans, 1);
	assert_string_equal(req->resource_spans[0]->scope_spans[0]->scope->name,
	    "smg-c");
	assert_int_equal(req->resource_spans[0]->scope_spans[0]->n_spans, 2);

	s = req->resource_spans[0]->scope_spans[0]->spans[0];
	assert_int_equal(s->trace_id.len, 16);
	assert_int_equal(s->trace_id.data[15], 0xa0);
	assert_int_equal(s->span_id.len, 8);
	assert_int_equal(s->span_id.data[0], 0x10);
	assert_int_equal(s->parent_span_id.len, 8);
	assert_int_equal(s->parent_span_id.data[3], 0x77);
	assert_string_equal(s->name, "POST /v1/chat/completions");
	assert_int_equal(s->kind,
	    OPENTELEMETRY__PROTO__TRACE__V1__SPAN__SPAN_KIND__SPAN_KIND_SERVER);
	assert_true(s->start_time_unix_nano == 1700000000000000000ull);
	assert_true(s->end_time_unix_nano == 1700000000000001234ull);
	assert_int_equal(s->flags, 0x301);
	assert_non_null(s->status);
	assert_int_equal(s->status->code,
	    OPENTELEMETRY__PROTO__TRACE__V1__STATUS__STATUS_CODE__STATUS_CODE_ERROR);
	assert_int_equal(s->n_attributes, 4);
	assert_string_equal(s->attributes[0]->key, "http.request.method");
	assert_string_equal(s->attributes[0]->value->string_value, "POST");
	assert_int_equal(s->attributes[1]->value->value_case,
	    OPENTELEMETRY__PROTO__COMMON__V1__ANY_VALUE__VALUE_INT_VALUE);
	assert_int_equal(s->attributes[1]->value->int_value, 503);
	assert_true(s->attributes[2]->value->bool_value);
	assert_int_equal(strlen(s->attributes[3]->value->string_value),
	    OTLP_STR_MAX - 1);

	/* A root span has no parent id; no error: no status. */
	s = req->resource_spans[0]->scope_spans[0]->spans[1];
	assert_int_equal(s->parent_span_id.len, 0);
	assert_int_equal(s->span_id.data[7], 0x11);
	assert_null(s->status);
	assert_int_equal(s->flags, 0x101);
	assert_int_equal(s->n_attributes, 0);
	opentelemetry__proto__collector__trace__v1__export_trace_service_request__free_unpacked(
	    req, NULL);
}

static void
test_attrs_bounded(void **state)
{
	struct otlp_span sp;
	unsigned i;

	(void)state;
	fill_span(&sp, 0);
	for (i = 0; i < OTLP_ATTRS_MAX + 5; i++)
		otlp_span_int(&sp, "k", i);
	assert_int_equal(sp.os_nattrs, OTLP_ATTRS_MAX);
	assert_int_equal(sp.os_attrs[OTLP_ATTRS_MAX - 1].oa_int,
	    OTLP_ATTRS_MAX - 1);
}

static void
test_endpoint(void **state)
{
	char base[128], path[128], err[128];

	(void)state;
	assert_int_equal(otlp_endpoint("localhost:4318", base, sizeof(base),
	                     path, sizeof(path), err, sizeof(err)),
	    0);
	assert_string_equal(base, "http://localhost:4318");
	assert_string_equal(path, "/v1/traces");
	assert_int_equal(otlp_endpoint("http://10.0.0.1:4318/", base,
	                     sizeof(base), path, sizeof(path), err,
	                     sizeof(err)),
	    0);
	assert_string_equal(base, "http://10.0.0.1:4318");
	assert_string_equal(path, "/v1/traces");
	assert_int_equal(otlp_endpoint("https://otel.example/custom/traces",
	                     base, sizeof(base), path, sizeof(path), err,
	                     sizeof(err)),
	    0);
	assert_string_equal(base, "https://otel.example");
	assert_string_equal(path, "/custom/traces");
	assert_int_equal(otlp_endpoint("grpc://h:4317", base, sizeof(base),
	                     path, sizeof(path), err, sizeof(err)),
	    -1);
	assert_int_equal(otlp_endpoint("", base, sizeof(base), path,
	                     sizeof(path), err, sizeof(err)),
	    -1);
	assert_int_equal(otlp_endpoint("http://u:p@h:1", base, sizeof(base),
	                     path, sizeof(path), err, sizeof(err)),
	    -1);
	assert_int_equal(otlp_endpoint("host with space:1", base, sizeof(base),
	                     path, sizeof(path), err, sizeof(err)),
	    -1);
}

static uint64_t counted[3];

static void
count_cb(void *arg, enum otlp_count what, uint64_t n)
{
	(void)arg;
	counted[what] += n;
}

/* A full queue drops and counts; the rest is kept for the next batch. */
static void
test_queue_full(void **state)
{
	struct otlp_exporter_config cfg = {
		.oc_endpoint = "127.0.0.1:9",
		.oc_service_name = "smg",
		.oc_queue_max = 3,
		.oc_batch_max = 10,
		.oc_interval_secs = 100,
		.oc_timeout_secs = 1,
		.oc_count = count_cb,
	};
	struct ev_loop *loop = ev_loop_new(0);
	struct otlp_exporter *ox;
	struct otlp_span sp;
	int i;

	(void)state;
	memset(counted, 0, sizeof(counted));
	fill_span(&sp, 0);
	assert_non_null(ox = otlp_exporter_new(loop, &cfg));
	for (i = 0; i < 5; i++)
		(void)otlp_exporter_add(ox, &sp);
	assert_int_equal(otlp_exporter_queued(ox), 3);
	assert_int_equal(counted[OTLP_DROPPED_FULL], 2);
	otlp_exporter_free(ox);
	cfg.oc_endpoint = "ftp://x";
	assert_null(otlp_exporter_new(loop, &cfg));
	ev_loop_destroy(loop);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_encode_roundtrip),
		cmocka_unit_test(test_attrs_bounded),
		cmocka_unit_test(test_endpoint),
		cmocka_unit_test(test_queue_full),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
