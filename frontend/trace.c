/*
 * trace.c: W3C trace context (traceparent, tracestate) and, with
 * --enable-trace, the gateway's spans. A request keeps its client's trace
 * id; the gateway takes a span id of its own for the request. Without
 * --enable-trace that id is the parent the workers see, and a request
 * without a valid traceparent starts a trace not sampled (flags 00).
 *
 * With --enable-trace a sampled request (the client's sampled flag, as a
 * parent-based sampler does; a trace started here is sampled) records a
 * server span for the request (parent: the client's span), an internal
 * span per routing decision and a client span per upstream attempt (one
 * per PD leg), both children of the request's span (exchange.c). Each
 * attempt's span id is the parent in the traceparent its worker gets, so
 * the worker's spans hang under that attempt. Every frontend exports its
 * own spans (shared/otlp.c): a bounded queue, a batch per second or per
 * TRACE_BATCH spans, dropped and counted when the collector is away.
 */
#include <sys/random.h>

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "frontend/frontend.h"
#include "shared/log.h"

#define TRACE_QUEUE    2048 /* spans held per frontend */
#define TRACE_BATCH    512 /* spans per export */
#define TRACE_INTERVAL 1.0 /* a partial batch waits at most */
#define TRACE_TIMEOUT  2.0 /* one export, connect included */
#define TRACE_SERVICE  "smg" /* SMG's service.name */

static bool trace_hex(const char *, size_t);
static bool trace_zero(const char *, size_t);
static uint64_t trace_random(void);
static void trace_bin(const char *, uint8_t *, size_t);
static void trace_counted(void *, enum otlp_count, uint64_t);
static void trace_request_end(void *);

static uint64_t trace_state;
static struct otlp_exporter *trace_exporter;

/* Lowercase hex only, as W3C requires. */
static bool
trace_hex(const char *s, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		if (!((s[i] >= '0' && s[i] <= '9') ||
		        (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	}
	return true;
}

static bool
trace_zero(const char *s, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		if (s[i] != '0')
			return false;
	}
	return true;
}

/* splitmix64, seeded once from the kernel: ids need only be unique. */
static uint64_t
trace_random(void)
{
	uint64_t z;

	if (trace_state == 0 &&
	    getrandom(&trace_state, sizeof(trace_state), 0) !=
	        (ssize_t)sizeof(trace_state))
		trace_state = (uint64_t)time(NULL) ^ (uint64_t)getpid() << 32;
	z = (trace_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* n bytes from 2n lowercase hex digits (already checked). */
static void
trace_bin(const char *hex, uint8_t *out, size_t n)
{
	size_t i;
	int hi, lo;

	for (i = 0; i < n; i++) {
		hi = hex[2 * i] <= '9' ? hex[2 * i] - '0'
		                       : hex[2 * i] - 'a' + 10;
		lo = hex[2 * i + 1] <= '9' ? hex[2 * i + 1] - '0'
		                           : hex[2 * i + 1] - 'a' + 10;
		out[i] = (uint8_t)(hi << 4 | lo);
	}
}

static void
trace_counted(void *arg, enum otlp_count what, uint64_t n)
{
	(void)arg;
	switch (what) {
	case OTLP_EXPORTED:
		stats_add("smg_trace_spans_exported_total", "", (int64_t)n);
		break;
	case OTLP_DROPPED_FULL:
		stats_add("smg_trace_spans_dropped_total",
		    "reason=\"queue_full\"", (int64_t)n);
		break;
	case OTLP_DROPPED_FAILED:
		stats_add("smg_trace_spans_dropped_total",
		    "reason=\"export_failed\"", (int64_t)n);
		break;
	}
}

void
trace_init(void)
{
	const struct config *cf = fe->fe_cf;
	struct otlp_exporter_config oc = {
		.oc_endpoint = cf->cf_otlp_traces_endpoint,
		.oc_service_name = TRACE_SERVICE,
		.oc_queue_max = TRACE_QUEUE,
		.oc_batch_max = TRACE_BATCH,
		.oc_interval_secs = TRACE_INTERVAL,
		.oc_timeout_secs = TRACE_TIMEOUT,
		.oc_count = trace_counted,
	};

	if (!cf->cf_enable_trace)
		return;
	/* The configuration was checked: only memory can fail here. */
	if ((trace_exporter = otlp_exporter_new(fe->fe_loop, &oc)) == NULL)
		fatalx("%s: cannot start the span exporter", __func__);
	log_info("%s: spans exported to %s (OTLP/HTTP)", __func__,
	    cf->cf_otlp_traces_endpoint);
}

void
trace_shutdown(void)
{
	otlp_exporter_free(trace_exporter);
	trace_exporter = NULL;
}

bool
trace_recording(const struct reqctx *rx)
{
	return rx != NULL && rx->rc_recording && trace_exporter != NULL;
}

void
trace_child(const struct reqctx *rx, uint8_t span_id[8], char *traceparent)
{
	uint64_t id;
	int i;

	do
		id = trace_random();
	while (id == 0);
	for (i = 0; i < 8; i++)
		span_id[i] = (uint8_t)(id >> (56 - 8 * i));
	snprintf(traceparent, REQCTX_TRACE_MAX, "00-%s-%016llx-%02x",
	    rx->rc_trace_id, (unsigned long long)id, rx->rc_flags);
}

void
trace_span_begin(const struct reqctx *rx, struct otlp_span *sp,
    const uint8_t *span_id, const char *name, enum otlp_kind kind,
    uint64_t start_ns)
{
	char tp[REQCTX_TRACE_MAX];

	sp->os_nattrs = 0;
	memcpy(sp->os_trace_id, rx->rc_trace_bin, sizeof(sp->os_trace_id));
	if (span_id != NULL)
		memcpy(sp->os_span_id, span_id, sizeof(sp->os_span_id));
	else
		trace_child(rx, sp->os_span_id, tp);
	memcpy(sp->os_parent_id, rx->rc_span_bin, sizeof(sp->os_parent_id));
	sp->os_remote_parent = false;
	sp->os_flags = rx->rc_flags;
	sp->os_kind = kind;
	sp->os_error = false;
	sp->os_start_ns = start_ns;
	sp->os_end_ns = 0;
	snprintf(sp->os_name, sizeof(sp->os_name), "%s", name);
}

void
trace_span_end(struct otlp_span *sp, bool error)
{
	sp->os_end_ns = otlp_now_ns();
	if (sp->os_end_ns < sp->os_start_ns)
		sp->os_end_ns = sp->os_start_ns;
	sp->os_error = error;
	if (trace_exporter != NULL)
		(void)otlp_exporter_add(trace_exporter, sp);
}

/* The request's end hook: its server span, with the status answered. */
static void
trace_request_end(void *arg)
{
	struct reqctx *rx = arg;
	const struct http_request *hr = rx->rc_hr;
	struct otlp_span sp;
	char name[OTLP_NAME_MAX];
	int status = conn_status(rx->rc_conn);

	snprintf(name, sizeof(name), "%s %s", stats_method_label(hr),
	    stats_path_label(hr->hr_path));
	trace_span_begin(rx, &sp, rx->rc_span_bin, name, OTLP_KIND_SERVER,
	    rx->rc_start_ns);
	memcpy(sp.os_parent_id, rx->rc_parent_bin, sizeof(sp.os_parent_id));
	sp.os_remote_parent = memcmp(rx->rc_parent_bin, "\0\0\0\0\0\0\0\0",
	                          sizeof(rx->rc_parent_bin)) != 0;
	otlp_span_str(&sp, "http.request.method", stats_method_label(hr));
	otlp_span_str(&sp, "url.path", hr->hr_path);
	if (status != 0)
		otlp_span_int(&sp, "http.response.status_code", status);
	else
		otlp_span_str(&sp, "error.type", "aborted"); /* client gone */
	if (rx->rc_model[0] != '\0')
		otlp_span_str(&sp, "gen_ai.request.model", rx->rc_model);
	if (rx->rc_tenant[0] != '\0')
		otlp_span_str(&sp, "smg.tenant", tenant_label(rx->rc_tenant));
	otlp_span_str(&sp, "smg.request_id", rx->rc_request_id);
	trace_span_end(&sp, status == 0 || status >= 500);
}

void
trace_start(struct conn *c, const struct http_request *hr, struct reqctx *rx,
    const char *request_id)
{
	const struct http_header *tp, *ts;
	const char *v;
	char flags[3] = "00";
	uint64_t span;
	bool given = false;

	tp = http_request_header(hr, "traceparent");
	/* version-traceid-parentid-flags; a later version may add fields. */
	if (tp != NULL && tp->hh_value_len >= 55 &&
	    (tp->hh_value_len == 55 || tp->hh_value[55] == '-') &&
	    (v = tp->hh_value, trace_hex(v, 2)) && strncmp(v, "ff", 2) != 0 &&
	    (tp->hh_value_len == 55 || strncmp(v, "00", 2) != 0) &&
	    v[2] == '-' && trace_hex(v + 3, 32) && !trace_zero(v + 3, 32) &&
	    v[35] == '-' && trace_hex(v + 36, 16) && !trace_zero(v + 36, 16) &&
	    v[52] == '-' && trace_hex(v + 53, 2)) {
		memcpy(rx->rc_trace_id, v + 3, 32);
		rx->rc_trace_id[32] = '\0';
		flags[0] = v[53];
		flags[1] = v[54];
		trace_bin(v + 36, rx->rc_parent_bin, sizeof(rx->rc_parent_bin));
		given = true;
		ts = http_request_header(hr, "tracestate");
		if (ts != NULL && ts->hh_value_len < sizeof(rx->rc_tracestate))
			snprintf(rx->rc_tracestate, sizeof(rx->rc_tracestate),
			    "%.*s", (int)ts->hh_value_len, ts->hh_value);
	} else {
		snprintf(rx->rc_trace_id, sizeof(rx->rc_trace_id),
		    "%016llx%016llx", (unsigned long long)trace_random(),
		    (unsigned long long)trace_random());
		/* A trace started by a gateway that records it is sampled. */
		if (trace_exporter != NULL)
			flags[1] = '1';
	}
	do
		span = trace_random();
	while (span == 0);
	snprintf(rx->rc_traceparent, sizeof(rx->rc_traceparent),
	    "00-%s-%016llx-%s", rx->rc_trace_id, (unsigned long long)span,
	    flags);
	trace_bin(rx->rc_trace_id, rx->rc_trace_bin, sizeof(rx->rc_trace_bin));
	trace_bin(rx->rc_traceparent + 36, rx->rc_span_bin,
	    sizeof(rx->rc_span_bin));
	trace_bin(flags, &rx->rc_flags, 1);
	if (!given)
		memset(rx->rc_parent_bin, 0, sizeof(rx->rc_parent_bin));
	rx->rc_recording = trace_exporter != NULL && (rx->rc_flags & 1) != 0 &&
	    conn_on_end(c, trace_request_end, rx) == 0;
	if (rx->rc_recording) {
		rx->rc_start_ns = otlp_now_ns();
		snprintf(rx->rc_request_id, sizeof(rx->rc_request_id), "%s",
		    request_id);
	}
}
