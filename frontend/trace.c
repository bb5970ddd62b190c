/*
 * trace.c: W3C trace context (traceparent, tracestate). A request keeps
 * its client's trace id; the gateway takes a span id of its own, which
 * becomes the parent id the workers see, so their spans hang under the
 * gateway's. A request without a valid traceparent starts a trace (not
 * sampled: the gateway records no spans of its own yet).
 */
#include <sys/random.h>

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "frontend/frontend.h"

static bool trace_hex(const char *, size_t);
static bool trace_zero(const char *, size_t);
static uint64_t trace_random(void);

static uint64_t trace_state;

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

void
trace_start(const struct http_request *hr, struct reqctx *rx)
{
	const struct http_header *tp, *ts;
	const char *v;
	char flags[3] = "00";

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
		ts = http_request_header(hr, "tracestate");
		if (ts != NULL && ts->hh_value_len < sizeof(rx->rc_tracestate))
			snprintf(rx->rc_tracestate, sizeof(rx->rc_tracestate),
			    "%.*s", (int)ts->hh_value_len, ts->hh_value);
	} else {
		snprintf(rx->rc_trace_id, sizeof(rx->rc_trace_id),
		    "%016llx%016llx", (unsigned long long)trace_random(),
		    (unsigned long long)trace_random());
	}
	snprintf(rx->rc_traceparent, sizeof(rx->rc_traceparent),
	    "00-%s-%016llx-%s", rx->rc_trace_id,
	    (unsigned long long)trace_random(), flags);
}
