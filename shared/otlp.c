/*
 * otlp.c: span records, their OTLP/HTTP protobuf encoding (protobuf-c,
 * proto/otlp_*.proto) and the bounded, never-blocking exporter (see
 * otlp.h). The exporter posts through the process's HTTP client
 * (upstream.c) on an instance of its own, whose short timeouts and
 * single pooled connection belong to the collector alone.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "otlp_trace_service.pb-c.h"

#include "shared/log.h"
#include "shared/otlp.h"
#include "shared/upstream.h"
#include "shared/url.h"

#define OTLP_URL_MAX      512
#define OTLP_WARN_EVERY   10.0 /* seconds between two failure lines */
#define OTLP_CONNECT_SECS 1.0
#define OTLP_IDLE_SECS    30.0

struct otlp_exporter {
	struct ev_loop *ox_loop;
	struct upstream *ox_up;
	char ox_base[OTLP_URL_MAX];
	char ox_path[OTLP_URL_MAX];
	char *ox_service;
	struct otlp_span *ox_ring;
	size_t ox_cap;
	size_t ox_head; /* oldest queued span */
	size_t ox_len;
	size_t ox_batch_max;
	double ox_interval;
	otlp_count_cb ox_count;
	void *ox_arg;
	ev_timer ox_timer; /* the interval */
	ev_timer ox_kick; /* a full batch, sent from the loop */
	struct upstream_req *ox_req; /* the export in flight */
	size_t ox_req_n; /* its spans */
	int ox_req_status;
	ev_tstamp ox_warned; /* last failure line */
	uint64_t ox_unwarned; /* failed batches since */
};

static void otlp_attr_add(struct otlp_span *, const char *, enum otlp_attr_type,
    int64_t, const char *);
static void otlp_timer_cb(struct ev_loop *, ev_timer *, int);
static void otlp_send(struct otlp_exporter *);
static void otlp_on_head(void *, int, const struct upstream_header *, size_t);
static void otlp_on_body(void *, const char *, size_t);
static void otlp_on_done(void *, enum upstream_error);
static void otlp_counted(struct otlp_exporter *, enum otlp_count, uint64_t);

static const struct upstream_cbs otlp_cbs = {
	.on_head = otlp_on_head,
	.on_body = otlp_on_body,
	.on_done = otlp_on_done,
};

static void
otlp_attr_add(struct otlp_span *sp, const char *key, enum otlp_attr_type type,
    int64_t v, const char *s)
{
	struct otlp_attr *a;

	if (sp->os_nattrs >= OTLP_ATTRS_MAX)
		return;
	a = &sp->os_attrs[sp->os_nattrs++];
	a->oa_key = key;
	a->oa_type = type;
	a->oa_int = v;
	if (s != NULL)
		snprintf(a->oa_str, sizeof(a->oa_str), "%s", s);
	else
		a->oa_str[0] = '\0';
}

void
otlp_span_str(struct otlp_span *sp, const char *key, const char *value)
{
	otlp_attr_add(sp, key, OTLP_ATTR_STRING, 0, value);
}

void
otlp_span_int(struct otlp_span *sp, const char *key, int64_t value)
{
	otlp_attr_add(sp, key, OTLP_ATTR_INT, value, NULL);
}

void
otlp_span_bool(struct otlp_span *sp, const char *key, bool value)
{
	otlp_attr_add(sp, key, OTLP_ATTR_BOOL, value ? 1 : 0, NULL);
}

uint64_t
otlp_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A KeyValue of a (its strings borrowed) into kv and its value av. */
static void
otlp_kv(const struct otlp_attr *a,
    Opentelemetry__Proto__Common__V1__KeyValue *kv,
    Opentelemetry__Proto__Common__V1__AnyValue *av)
{
	opentelemetry__proto__common__v1__key_value__init(kv);
	opentelemetry__proto__common__v1__any_value__init(av);
	kv->key = (char *)a->oa_key;
	kv->value = av;
	switch (a->oa_type) {
	case OTLP_ATTR_INT:
		av->value_case =
		    OPENTELEMETRY__PROTO__COMMON__V1__ANY_VALUE__VALUE_INT_VALUE;
		av->int_value = a->oa_int;
		break;
	case OTLP_ATTR_BOOL:
		av->value_case =
		    OPENTELEMETRY__PROTO__COMMON__V1__ANY_VALUE__VALUE_BOOL_VALUE;
		av->bool_value = a->oa_int != 0;
		break;
	default:
		av->value_case =
		    OPENTELEMETRY__PROTO__COMMON__V1__ANY_VALUE__VALUE_STRING_VALUE;
		av->string_value = (char *)a->oa_str;
		break;
	}
}

uint8_t *
otlp_encode(const struct otlp_span *const *spans, size_t n,
    const char *service_name, size_t *len)
{
	Opentelemetry__Proto__Collector__Trace__V1__ExportTraceServiceRequest req =
	    OPENTELEMETRY__PROTO__COLLECTOR__TRACE__V1__EXPORT_TRACE_SERVICE_REQUEST__INIT;
	Opentelemetry__Proto__Trace__V1__ResourceSpans
	    rs = OPENTELEMETRY__PROTO__TRACE__V1__RESOURCE_SPANS__INIT,
	    *rsp = &rs;
	Opentelemetry__Proto__Resource__V1__Resource res =
	    OPENTELEMETRY__PROTO__RESOURCE__V1__RESOURCE__INIT;
	Opentelemetry__Proto__Trace__V1__ScopeSpans
	    ss = OPENTELEMETRY__PROTO__TRACE__V1__SCOPE_SPANS__INIT,
	    *ssp = &ss;
	Opentelemetry__Proto__Common__V1__InstrumentationScope scope =
	    OPENTELEMETRY__PROTO__COMMON__V1__INSTRUMENTATION_SCOPE__INIT;
	Opentelemetry__Proto__Common__V1__KeyValue svc_kv, *svc_kvp = &svc_kv;
	Opentelemetry__Proto__Common__V1__AnyValue svc_av;
	Opentelemetry__Proto__Trace__V1__Span *sp = NULL, **spp = NULL;
	Opentelemetry__Proto__Trace__V1__Status *st = NULL;
	Opentelemetry__Proto__Common__V1__KeyValue *kv = NULL, **kvp = NULL;
	Opentelemetry__Proto__Common__V1__AnyValue *av = NULL;
	struct otlp_attr svc;
	const struct otlp_span *o;
	size_t i, j, na = 0, k = 0;
	uint8_t *out = NULL;

	for (i = 0; i < n; i++)
		na += spans[i]->os_nattrs;
	if ((n > 0 &&
	        ((sp = calloc(n, sizeof(*sp))) == NULL ||
	            (spp = calloc(n, sizeof(*spp))) == NULL ||
	            (st = calloc(n, sizeof(*st))) == NULL)) ||
	    (na > 0 &&
	        ((kv = calloc(na, sizeof(*kv))) == NULL ||
	            (kvp = calloc(na, sizeof(*kvp))) == NULL ||
	            (av = calloc(na, sizeof(*av))) == NULL)))
		goto out;

	memset(&svc, 0, sizeof(svc));
	svc.oa_key = "service.name";
	svc.oa_type = OTLP_ATTR_STRING;
	snprintf(svc.oa_str, sizeof(svc.oa_str), "%s", service_name);
	otlp_kv(&svc, &svc_kv, &svc_av);
	res.n_attributes = 1;
	res.attributes = &svc_kvp;
	scope.name = "smg-c";
	scope.version = "";
	ss.scope = &scope;
	ss.n_spans = n;
	ss.spans = spp;
	rs.resource = &res;
	rs.n_scope_spans = 1;
	rs.scope_spans = &ssp;
	req.n_resource_spans = 1;
	req.resource_spans = &rsp;

	for (i = 0; i < n; i++) {
		o = spans[i];
		opentelemetry__proto__trace__v1__span__init(&sp[i]);
		opentelemetry__proto__trace__v1__status__init(&st[i]);
		spp[i] = &sp[i];
		sp[i].trace_id.data = (uint8_t *)o->os_trace_id;
		sp[i].trace_id.len = sizeof(o->os_trace_id);
		sp[i].span_id.data = (uint8_t *)o->os_span_id;
		sp[i].span_id.len = sizeof(o->os_span_id);
		for (j = 0; j < sizeof(o->os_parent_id); j++)
			if (o->os_parent_id[j] != 0)
				break;
		if (j < sizeof(o->os_parent_id)) {
			sp[i].parent_span_id.data = (uint8_t *)o->os_parent_id;
			sp[i].parent_span_id.len = sizeof(o->os_parent_id);
		}
		sp[i].name = (char *)o->os_name;
		sp[i].kind =
		    (Opentelemetry__Proto__Trace__V1__Span__SpanKind)o->os_kind;
		sp[i].start_time_unix_nano = o->os_start_ns;
		sp[i].end_time_unix_nano = o->os_end_ns;
		/* SpanFlags: the trace flags, and whether the parent is
		 * remote (bit 8: known, bit 9: remote). */
		sp[i].flags = (uint32_t)o->os_flags | 0x100u |
		    (o->os_remote_parent ? 0x200u : 0);
		sp[i].n_attributes = o->os_nattrs;
		sp[i].attributes = kvp != NULL ? &kvp[k] : NULL;
		for (j = 0; j < o->os_nattrs; j++, k++) {
			otlp_kv(&o->os_attrs[j], &kv[k], &av[k]);
			kvp[k] = &kv[k];
		}
		if (o->os_error) {
			st[i].code =
			    OPENTELEMETRY__PROTO__TRACE__V1__STATUS__STATUS_CODE__STATUS_CODE_ERROR;
			sp[i].status = &st[i];
		}
	}
	*len =
	    opentelemetry__proto__collector__trace__v1__export_trace_service_request__get_packed_size(
	        &req);
	if ((out = malloc(*len > 0 ? *len : 1)) == NULL)
		goto out;
	opentelemetry__proto__collector__trace__v1__export_trace_service_request__pack(
	    &req, out);
out:
	free(sp);
	free(spp);
	free(st);
	free(kv);
	free(kvp);
	free(av);
	return out;
}

int
otlp_endpoint(const char *endpoint, char *base, size_t baselen, char *path,
    size_t pathlen, char *err, size_t errlen)
{
	char full[OTLP_URL_MAX];
	struct url u;
	size_t olen;
	int n;

	if (endpoint == NULL || endpoint[0] == '\0') {
		snprintf(err, errlen, "empty endpoint");
		return -1;
	}
	n = snprintf(full, sizeof(full), "%s%s",
	    strstr(endpoint, "://") != NULL ? "" : "http://", endpoint);
	if (n < 0 || (size_t)n >= sizeof(full)) {
		snprintf(err, errlen, "endpoint too long");
		return -1;
	}
	if (url_parse(full, &u) == -1 || u.u_userinfo || u.u_rank != -1 ||
	    u.u_fragment ||
	    (!url_scheme_is(&u, "http") && !url_scheme_is(&u, "https"))) {
		snprintf(err, errlen, "'%s' is no http(s) URL or host:port",
		    endpoint);
		return -1;
	}
	olen = url_origin_len(&u, full);
	if (olen >= baselen) {
		snprintf(err, errlen, "endpoint too long");
		return -1;
	}
	memcpy(base, full, olen);
	base[olen] = '\0';
	if (u.u_path_len <= 1 && u.u_query_len == 0)
		n = snprintf(path, pathlen, "/v1/traces");
	else
		n = snprintf(path, pathlen, "%.*s%s%.*s",
		    u.u_path_len > 0 ? (int)u.u_path_len : 1,
		    u.u_path_len > 0 ? u.u_path : "/",
		    u.u_query_len > 0 ? "?" : "", (int)u.u_query_len,
		    u.u_query);
	if (n < 0 || (size_t)n >= pathlen) {
		snprintf(err, errlen, "endpoint too long");
		return -1;
	}
	return 0;
}

struct otlp_exporter *
otlp_exporter_new(struct ev_loop *loop, const struct otlp_exporter_config *cfg)
{
	struct upstream_config uc;
	struct otlp_exporter *ox;
	char err[160];

	if ((ox = calloc(1, sizeof(*ox))) == NULL) {
		log_warnx("%s: out of memory", __func__);
		return NULL;
	}
	if (otlp_endpoint(cfg->oc_endpoint, ox->ox_base, sizeof(ox->ox_base),
	        ox->ox_path, sizeof(ox->ox_path), err, sizeof(err)) == -1) {
		log_warnx("%s: --otlp-traces-endpoint: %s", __func__, err);
		free(ox);
		return NULL;
	}
	ox->ox_loop = loop;
	ox->ox_cap = cfg->oc_queue_max > 0 ? cfg->oc_queue_max : 1;
	ox->ox_batch_max = cfg->oc_batch_max > 0 ? cfg->oc_batch_max : 1;
	if (ox->ox_batch_max > ox->ox_cap)
		ox->ox_batch_max = ox->ox_cap;
	ox->ox_interval = cfg->oc_interval_secs > 0 ? cfg->oc_interval_secs : 1;
	ox->ox_count = cfg->oc_count;
	ox->ox_arg = cfg->oc_arg;
	memset(&uc, 0, sizeof(uc));
	uc.uc_idle_timeout_secs = OTLP_IDLE_SECS;
	uc.uc_connect_timeout_secs = OTLP_CONNECT_SECS < cfg->oc_timeout_secs
	    ? OTLP_CONNECT_SECS
	    : cfg->oc_timeout_secs;
	uc.uc_request_timeout_secs = cfg->oc_timeout_secs;
	uc.uc_max_idle_per_worker = 1;
	if ((ox->ox_service = strdup(cfg->oc_service_name)) == NULL ||
	    (ox->ox_ring = calloc(ox->ox_cap, sizeof(*ox->ox_ring))) == NULL ||
	    (ox->ox_up = upstream_new(loop, &uc)) == NULL) {
		log_warnx("%s: out of memory", __func__);
		free(ox->ox_service);
		free(ox->ox_ring);
		free(ox);
		return NULL;
	}
	ev_timer_init(&ox->ox_timer, otlp_timer_cb, ox->ox_interval,
	    ox->ox_interval);
	ox->ox_timer.data = ox;
	ev_timer_start(loop, &ox->ox_timer);
	/* The interval timer must not keep a draining loop alive. */
	ev_unref(loop);
	ev_timer_init(&ox->ox_kick, otlp_timer_cb, 0., 0.);
	ox->ox_kick.data = ox;
	return ox;
}

void
otlp_exporter_free(struct otlp_exporter *ox)
{
	if (ox == NULL)
		return;
	ev_ref(ox->ox_loop);
	ev_timer_stop(ox->ox_loop, &ox->ox_timer);
	ev_timer_stop(ox->ox_loop, &ox->ox_kick);
	if (ox->ox_req != NULL)
		upstream_cancel(ox->ox_req);
	upstream_free(ox->ox_up);
	free(ox->ox_ring);
	free(ox->ox_service);
	free(ox);
}

size_t
otlp_exporter_queued(const struct otlp_exporter *ox)
{
	return ox->ox_len;
}

static void
otlp_counted(struct otlp_exporter *ox, enum otlp_count what, uint64_t n)
{
	if (ox->ox_count != NULL && n > 0)
		ox->ox_count(ox->ox_arg, what, n);
}

int
otlp_exporter_add(struct otlp_exporter *ox, const struct otlp_span *sp)
{
	if (ox->ox_len >= ox->ox_cap) {
		otlp_counted(ox, OTLP_DROPPED_FULL, 1);
		return -1;
	}
	ox->ox_ring[(ox->ox_head + ox->ox_len) % ox->ox_cap] = *sp;
	ox->ox_len++;
	/* A full batch leaves on the next loop turn, not from the caller's
	 * request path. */
	if (ox->ox_len >= ox->ox_batch_max && ox->ox_req == NULL &&
	    !ev_is_active(&ox->ox_kick))
		ev_timer_start(ox->ox_loop, &ox->ox_kick);
	return 0;
}

static void
otlp_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)loop;
	(void)revents;
	otlp_send(w->data);
}

/* Sends the oldest batch when none is in flight. */
static void
otlp_send(struct otlp_exporter *ox)
{
	const struct otlp_span **batch;
	struct upstream_header h;
	uint8_t *body;
	size_t i, n, len;

	if (ox->ox_req != NULL || ox->ox_len == 0)
		return;
	n = ox->ox_len < ox->ox_batch_max ? ox->ox_len : ox->ox_batch_max;
	if ((batch = calloc(n, sizeof(*batch))) == NULL)
		return; /* tried again on the next tick */
	for (i = 0; i < n; i++)
		batch[i] = &ox->ox_ring[(ox->ox_head + i) % ox->ox_cap];
	body = otlp_encode(batch, n, ox->ox_service, &len);
	free(batch);
	if (body == NULL)
		return;
	ox->ox_head = (ox->ox_head + n) % ox->ox_cap;
	ox->ox_len -= n;
	h.uh_name = "content-type";
	h.uh_name_len = strlen(h.uh_name);
	h.uh_value = "application/x-protobuf";
	h.uh_value_len = strlen(h.uh_value);
	ox->ox_req_status = 0;
	ox->ox_req_n = n;
	ox->ox_req = upstream_request(ox->ox_up, ox->ox_base, "POST",
	    ox->ox_path, &h, 1, (const char *)body, len, &otlp_cbs, ox);
	free(body);
	if (ox->ox_req == NULL)
		otlp_counted(ox, OTLP_DROPPED_FAILED, n);
}

static void
otlp_on_head(void *arg, int status, const struct upstream_header *h, size_t n)
{
	struct otlp_exporter *ox = arg;

	(void)h;
	(void)n;
	ox->ox_req_status = status;
}

static void
otlp_on_body(void *arg, const char *data, size_t len)
{
	(void)arg;
	(void)data;
	(void)len;
}

static void
otlp_on_done(void *arg, enum upstream_error err)
{
	struct otlp_exporter *ox = arg;
	ev_tstamp now = ev_now(ox->ox_loop);
	size_t n = ox->ox_req_n;

	ox->ox_req = NULL;
	ox->ox_req_n = 0;
	if (err == UPSTREAM_OK && ox->ox_req_status >= 200 &&
	    ox->ox_req_status < 300) {
		otlp_counted(ox, OTLP_EXPORTED, n);
	} else {
		otlp_counted(ox, OTLP_DROPPED_FAILED, n);
		ox->ox_unwarned++;
		if (now - ox->ox_warned >= OTLP_WARN_EVERY) {
			log_warnx("%s: export to %s%s failed (%s, status "
			          "%d); %llu batches dropped since the last "
			          "report",
			    __func__, ox->ox_base, ox->ox_path,
			    upstream_strerror(err), ox->ox_req_status,
			    (unsigned long long)ox->ox_unwarned);
			ox->ox_warned = now;
			ox->ox_unwarned = 0;
		}
	}
	/* More than a batch waiting: the next goes now. */
	if (ox->ox_len >= ox->ox_batch_max && !ev_is_active(&ox->ox_kick))
		ev_timer_start(ox->ox_loop, &ox->ox_kick);
}
