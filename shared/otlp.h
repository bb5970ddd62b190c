/*
 * otlp.h: OpenTelemetry span export over OTLP/HTTP (protobuf body, POST
 * <endpoint>/v1/traces), for a process that records spans on its libev
 * loop.
 *
 * A span is a fixed-size record (struct otlp_span) filled by the caller
 * and copied into the exporter's bounded queue. The queue never grows
 * and never blocks: when it is full the span is dropped and counted.
 * Batches leave from the loop, every interval or as soon as a batch is
 * full, at most one export in flight, each bounded by a short timeout;
 * a batch that fails (collector down, slow, or answering an error) is
 * dropped and counted, never retried, so a dead collector costs the
 * process nothing but the counted drops and a rate-limited warning.
 */
#ifndef SHARED_OTLP_H
#define SHARED_OTLP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ev.h>

#define OTLP_ATTRS_MAX 12
#define OTLP_STR_MAX   96 /* attribute value, NUL included; cut beyond */
#define OTLP_NAME_MAX  64

/* Span kinds, numbered as opentelemetry.proto.trace.v1.Span.SpanKind. */
enum otlp_kind {
	OTLP_KIND_UNSPECIFIED = 0,
	OTLP_KIND_INTERNAL = 1,
	OTLP_KIND_SERVER = 2,
	OTLP_KIND_CLIENT = 3,
};

enum otlp_attr_type {
	OTLP_ATTR_STRING = 0,
	OTLP_ATTR_INT,
	OTLP_ATTR_BOOL,
};

struct otlp_attr {
	const char *oa_key; /* static string */
	enum otlp_attr_type oa_type;
	int64_t oa_int; /* OTLP_ATTR_INT, OTLP_ATTR_BOOL (0/1) */
	char oa_str[OTLP_STR_MAX]; /* OTLP_ATTR_STRING */
};

struct otlp_span {
	uint8_t os_trace_id[16];
	uint8_t os_span_id[8];
	uint8_t os_parent_id[8]; /* all zero: a root span */
	bool os_remote_parent; /* the parent is another process's span */
	uint8_t os_flags; /* W3C trace flags (01: sampled) */
	enum otlp_kind os_kind;
	bool os_error; /* status ERROR, else UNSET */
	uint64_t os_start_ns; /* Unix time, nanoseconds */
	uint64_t os_end_ns;
	char os_name[OTLP_NAME_MAX];
	unsigned os_nattrs;
	struct otlp_attr os_attrs[OTLP_ATTRS_MAX];
};

/*
 * Attributes, in the order added; beyond OTLP_ATTRS_MAX they are left
 * out, and a string value longer than OTLP_STR_MAX - 1 is cut. key must
 * be a static string (it is not copied).
 */
void otlp_span_str(struct otlp_span *sp, const char *key, const char *value);
void otlp_span_int(struct otlp_span *sp, const char *key, int64_t value);
void otlp_span_bool(struct otlp_span *sp, const char *key, bool value);
/* Unix time now, in nanoseconds (CLOCK_REALTIME). */
uint64_t otlp_now_ns(void);

/*
 * The ExportTraceServiceRequest of spans[0..n) under one resource whose
 * service.name is service_name and one instrumentation scope "smg-c":
 * a malloc'd buffer (free() it), its size in *len; NULL when out of
 * memory.
 */
uint8_t *otlp_encode(const struct otlp_span *const *spans, size_t n,
    const char *service_name, size_t *len);

/*
 * The URL where spans are posted for endpoint, as SMG users write it
 * ("host:port", "http://host:port", or a full URL with a path): a
 * missing scheme means http://, a missing or "/" path means /v1/traces.
 * base gets "scheme://authority", path the path (with its query). Returns
 * 0, or -1 (why in err) when endpoint is no http(s) URL or does not fit.
 */
int otlp_endpoint(const char *endpoint, char *base, size_t baselen, char *path,
    size_t pathlen, char *err, size_t errlen);

/* What the exporter counts (otlp_count_cb). */
enum otlp_count {
	OTLP_EXPORTED = 0, /* accepted by the collector (2xx) */
	OTLP_DROPPED_FULL, /* the queue was full */
	OTLP_DROPPED_FAILED, /* in a batch that failed */
};

/* Runs on the loop (never inside otlp_exporter_add for EXPORTED or
 * DROPPED_FAILED; inside it for DROPPED_FULL). */
typedef void (*otlp_count_cb)(void *arg, enum otlp_count what, uint64_t n);

struct otlp_exporter_config {
	const char *oc_endpoint; /* as for otlp_endpoint */
	const char *oc_service_name;
	size_t oc_queue_max; /* spans held at most */
	size_t oc_batch_max; /* spans per export */
	double oc_interval_secs; /* a partial batch waits at most this */
	double oc_timeout_secs; /* one export, connect included */
	otlp_count_cb oc_count; /* may be NULL */
	void *oc_arg;
};

struct otlp_exporter;

/* NULL (logged) when the endpoint is invalid or out of memory. The
 * config's strings are copied. */
struct otlp_exporter *otlp_exporter_new(struct ev_loop *loop,
    const struct otlp_exporter_config *cfg);
/* Drops the export in flight and every queued span. NULL: no-op. */
void otlp_exporter_free(struct otlp_exporter *ox);
/* Copies sp into the queue; -1 (counted OTLP_DROPPED_FULL) when full. */
int otlp_exporter_add(struct otlp_exporter *ox, const struct otlp_span *sp);
/* Spans waiting in the queue (tests). */
size_t otlp_exporter_queued(const struct otlp_exporter *ox);

#endif /* SHARED_OTLP_H */
