/*
 * discovery.c: Kubernetes service discovery (--service-discovery, see
 * poller.h): list + watch of pods through the API server, and the set of
 * ready pods sent to the broker as workers.
 */
#include "poller/poller.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "shared/config.h"
#include "shared/log.h"
#include "shared/metrics.h"
#include "shared/url.h"
#include "shared/xmalloc.h"

#define DISCOVERY_SA_DIR        "/var/run/secrets/kubernetes.io/serviceaccount"
#define DISCOVERY_BOOTSTRAP_ANN "sglang.ai/bootstrap-port"
#define DISCOVERY_LIST_MAX      (64 * 1024 * 1024)
#define DISCOVERY_LIST_TIMEOUT  30.0
#define DISCOVERY_WATCH_SECS    300 /* the server ends a watch after this */
#define DISCOVERY_BACKOFF_MIN   0.25
#define DISCOVERY_BACKOFF_MAX   30.0
#define DISCOVERY_TOKEN_MAX     (64 * 1024)
#define DISCOVERY_RESEND_MS     1000 /* a listed url missing: send again */
#define DISCOVERY_REFRESH_MS    30000 /* and every so often regardless */
#define DISCOVERY_PATH_MAX      2048

enum dwatch_state {
	DW_IDLE = 0,
	DW_LISTING,
	DW_WATCHING,
	DW_WAITING, /* backoff before the next list or watch */
};

/* One label selector's list + watch (two in PD mode). */
struct dwatch {
	struct discovery *dw_d;
	struct discovery_rule dw_rule;
	char dw_query[DISCOVERY_PATH_MAX]; /* "labelSelector=..." encoded */
	enum dwatch_state dw_state;
	struct upstream_fetch *dw_list;
	struct upstream_req *dw_watch;
	int dw_watch_status;
	bool dw_relist; /* the watch must not resume: list again */
	bool dw_gone; /* 410: relist at once, no backoff */
	bool dw_listed; /* a list succeeded once */
	char dw_rv[DISCOVERY_RV_MAX];
	struct discovery_lines dw_lines;
	struct discovery_pod *dw_pods;
	size_t dw_npods;
	size_t dw_cap;
	ev_timer dw_timer; /* backoff, or the watch's deadline */
	double dw_backoff;
	ev_tstamp dw_started;
	/* Series: pods ready / not ready, API failures, in sync. */
	int dw_m_ready, dw_m_unready, dw_m_errors, dw_m_synced;
};

struct discovery {
	struct poller *d_p;
	struct upstream *d_up;
	char d_base[512];
	char d_token_path[512];
	char d_path[512]; /* /api/v1/[namespaces/NS/]pods */
	struct dwatch d_w[3]; /* regular, or prefill, decode and encode */
	unsigned d_nw;
	bool d_dirty; /* the set changed since it was sent */
	bool d_sent; /* a set was sent once */
	uint64_t d_sent_ms;
};

static void discovery_list(struct dwatch *);
static void discovery_list_done(void *, const struct upstream_result *);
static void discovery_watch(struct dwatch *);
static void discovery_watch_head(void *, int, const struct upstream_header *,
    size_t);
static void discovery_watch_body(void *, const char *, size_t);
static void discovery_watch_done(void *, enum upstream_error);
static int discovery_watch_line(void *, const char *, size_t);
static void discovery_timer_cb(struct ev_loop *, ev_timer *, int);
static void discovery_retry(struct dwatch *, const char *);
static void discovery_wait(struct dwatch *, double, bool);
static void discovery_upsert(struct dwatch *, const struct discovery_pod *);
static void discovery_forget(struct dwatch *, const char *);
static void discovery_flush(struct discovery *, uint64_t);
static bool discovery_missing(struct discovery *);
static size_t discovery_headers(struct discovery *, struct upstream_header *,
    char *, size_t);
static const char *discovery_str(const cJSON *, const char *);
static bool discovery_selected(const cJSON *, const struct discovery_rule *);
static int discovery_encode(const char *, char *, size_t);
static bool discovery_http_ok(const char *);
static const char *discovery_role(int);
static void discovery_metrics_init(struct dwatch *, struct shm *);
static void discovery_metrics(struct discovery *);

static const char *
discovery_role(int type)
{
	switch (type) {
	case SMG__WORKER_TYPE__WORKER_TYPE_PREFILL:
		return "prefill";
	case SMG__WORKER_TYPE__WORKER_TYPE_DECODE:
		return "decode";
	case SMG__WORKER_TYPE__WORKER_TYPE_ENCODE:
		return "encode";
	default:
		return "regular";
	}
}

/*
 * What an operator needs to see that discovery works: pods per role and
 * readiness, failed API calls, and whether each watch is in sync (listed
 * and watching, not waiting out a backoff).
 */
static void
discovery_metrics_init(struct dwatch *dw, struct shm *shm)
{
	const char *role = discovery_role(dw->dw_rule.dr_type);
	char l[SHM_SERIES_NAME_MAX];

	dw->dw_m_ready = dw->dw_m_unready = dw->dw_m_errors = dw->dw_m_synced =
	    -1;
	if (metrics_labels(l, sizeof(l), "role", role, "ready", "true", NULL) ==
	    0)
		dw->dw_m_ready =
		    metrics_series(shm, METRICS_GAUGE, "smg_discovery_pods", l);
	if (metrics_labels(l, sizeof(l), "role", role, "ready", "false",
	        NULL) == 0)
		dw->dw_m_unready =
		    metrics_series(shm, METRICS_GAUGE, "smg_discovery_pods", l);
	if (metrics_labels(l, sizeof(l), "role", role, NULL) == 0) {
		dw->dw_m_errors = metrics_series(shm, METRICS_COUNTER,
		    "smg_discovery_api_errors_total", l);
		dw->dw_m_synced = metrics_series(shm, METRICS_GAUGE,
		    "smg_discovery_synced", l);
	}
}

static void
discovery_metrics(struct discovery *d)
{
	struct shm *shm = d->d_p->p_shm;
	const struct dwatch *dw;
	size_t j, ready;
	unsigned i;

	for (i = 0; i < d->d_nw; i++) {
		dw = &d->d_w[i];
		for (j = 0, ready = 0; j < dw->dw_npods; j++)
			ready += dw->dw_pods[j].dp_ready;
		if (dw->dw_m_ready >= 0)
			metrics_set(shm, SHM_ROW_POLLER, dw->dw_m_ready,
			    (int64_t)ready);
		if (dw->dw_m_unready >= 0)
			metrics_set(shm, SHM_ROW_POLLER, dw->dw_m_unready,
			    (int64_t)(dw->dw_npods - ready));
		if (dw->dw_m_synced >= 0)
			metrics_set(shm, SHM_ROW_POLLER, dw->dw_m_synced,
			    dw->dw_listed && dw->dw_state == DW_WATCHING);
	}
}

/* ------------------------------------------------------------ parsing */

static const char *
discovery_str(const cJSON *o, const char *key)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);

	return cJSON_IsString(it) ? it->valuestring : NULL;
}

/* Every key=value of the rule is a label of the pod; none: no match. */
static bool
discovery_selected(const cJSON *labels, const struct discovery_rule *r)
{
	const char *eq, *v;
	char key[DISCOVERY_KEY_MAX];
	size_t i, kl;

	if (r->dr_nselector == 0 || !cJSON_IsObject(labels))
		return false;
	for (i = 0; i < r->dr_nselector; i++) {
		if ((eq = strchr(r->dr_selector[i], '=')) == NULL)
			return false;
		kl = (size_t)(eq - r->dr_selector[i]);
		if (kl >= sizeof(key))
			return false;
		memcpy(key, r->dr_selector[i], kl);
		key[kl] = '\0';
		if ((v = discovery_str(labels, key)) == NULL ||
		    strcmp(v, eq + 1) != 0)
			return false;
	}
	return true;
}

int
discovery_pod_parse(const cJSON *pod, const struct discovery_rule *r,
    struct discovery_pod *out)
{
	const cJSON *meta, *status, *conds, *c, *labels, *ann;
	const char *name, *ns, *phase, *ip, *bp, *src, *model = NULL;
	char *end;
	long port;
	bool ready = false;
	int n;

	memset(out, 0, sizeof(*out));
	out->dp_bootstrap_port = -1;
	meta = cJSON_GetObjectItemCaseSensitive(pod, "metadata");
	if (!cJSON_IsObject(meta) ||
	    (name = discovery_str(meta, "name")) == NULL || *name == '\0')
		return -1;
	ns = discovery_str(meta, "namespace");
	n = snprintf(out->dp_key, sizeof(out->dp_key), "%s/%s",
	    ns != NULL ? ns : "", name);
	if (n < 0 || (size_t)n >= sizeof(out->dp_key))
		return -1;
	labels = cJSON_GetObjectItemCaseSensitive(meta, "labels");
	if (!discovery_selected(labels, r))
		return 0;
	out->dp_type = r->dr_type;

	/* Serving: Running, condition Ready True, not being deleted, an
	 * address (SMG's rule, plus the deletion mark it removes on). */
	status = cJSON_GetObjectItemCaseSensitive(pod, "status");
	phase = discovery_str(status, "phase");
	ip = discovery_str(status, "podIP");
	conds = cJSON_GetObjectItemCaseSensitive(status, "conditions");
	if (!cJSON_IsArray(conds))
		conds = NULL;
	cJSON_ArrayForEach(c, conds)
	{
		const char *t = discovery_str(c, "type");
		const char *cs = discovery_str(c, "status");

		if (t != NULL && cs != NULL && strcmp(t, "Ready") == 0)
			ready = strcmp(cs, "True") == 0;
	}
	if (cJSON_GetObjectItemCaseSensitive(meta, "deletionTimestamp") !=
	        NULL &&
	    !cJSON_IsNull(
	        cJSON_GetObjectItemCaseSensitive(meta, "deletionTimestamp")))
		ready = false;
	if (phase == NULL || strcmp(phase, "Running") != 0)
		ready = false;
	/* An address is digits, hex, dots and colons, nothing else: it
	 * becomes a URL. */
	if (ip == NULL || *ip == '\0' || strlen(ip) > 45 ||
	    strspn(ip, "0123456789abcdefABCDEF.:") != strlen(ip))
		ready = false;
	if (ready) {
		n = snprintf(out->dp_url, sizeof(out->dp_url),
		    strchr(ip, ':') != NULL ? "http://[%s]:%ld"
		                            : "http://%s:%ld",
		    ip, r->dr_port);
		if (n < 0 || (size_t)n >= sizeof(out->dp_url))
			ready = false;
	}
	out->dp_ready = ready;

	ann = cJSON_GetObjectItemCaseSensitive(meta, "annotations");
	if ((r->dr_type == SMG__WORKER_TYPE__WORKER_TYPE_PREFILL ||
	        r->dr_type == SMG__WORKER_TYPE__WORKER_TYPE_ENCODE) &&
	    (bp = discovery_str(ann, DISCOVERY_BOOTSTRAP_ANN)) != NULL &&
	    *bp >= '0' && *bp <= '9') {
		errno = 0;
		port = strtol(bp, &end, 10);
		if (errno == 0 && *end == '\0' && port >= 0 && port <= 65535)
			out->dp_bootstrap_port = (int32_t)port;
	}
	if ((src = r->dr_model_from) != NULL) {
		if (strcasecmp(src, "namespace") == 0)
			model = ns;
		else if (strncmp(src, "label:", 6) == 0)
			model = discovery_str(labels, src + 6);
		else if (strncmp(src, "annotation:", 11) == 0)
			model = discovery_str(ann, src + 11);
		if (model != NULL && strlen(model) < sizeof(out->dp_model))
			memcpy(out->dp_model, model, strlen(model) + 1);
	}
	return 1;
}

enum discovery_event
discovery_event_parse(const char *line, size_t len, cJSON **doc,
    const cJSON **object, int *code)
{
	const char *type;
	const cJSON *obj, *c;

	*object = NULL;
	*code = 0;
	if ((*doc = cJSON_ParseWithLength(line, len)) == NULL)
		return DISCOVERY_EV_BAD;
	obj = cJSON_GetObjectItemCaseSensitive(*doc, "object");
	if ((type = discovery_str(*doc, "type")) == NULL ||
	    !cJSON_IsObject(obj))
		return DISCOVERY_EV_BAD;
	*object = obj;
	if (strcmp(type, "ADDED") == 0)
		return DISCOVERY_EV_ADDED;
	if (strcmp(type, "MODIFIED") == 0)
		return DISCOVERY_EV_MODIFIED;
	if (strcmp(type, "DELETED") == 0)
		return DISCOVERY_EV_DELETED;
	if (strcmp(type, "BOOKMARK") == 0)
		return DISCOVERY_EV_BOOKMARK;
	if (strcmp(type, "ERROR") == 0) {
		/* A metav1.Status; 410 Gone: the resourceVersion is too old. */
		c = cJSON_GetObjectItemCaseSensitive(obj, "code");
		if (cJSON_IsNumber(c) && c->valuedouble >= 0 &&
		    c->valuedouble < 1000)
			*code = (int)c->valuedouble;
		return DISCOVERY_EV_ERROR;
	}
	return DISCOVERY_EV_BAD;
}

int
discovery_lines_feed(struct discovery_lines *l, const char *data, size_t len,
    discovery_line_cb cb, void *arg)
{
	const char *nl;
	size_t take, cap, n;
	char *nb;

	while (len > 0) {
		nl = memchr(data, '\n', len);
		take = nl != NULL ? (size_t)(nl - data) : len;
		if (l->dl_len + take > l->dl_max) {
			l->dl_len = 0;
			return -1;
		}
		if (l->dl_len + take + 1 > l->dl_cap) {
			cap = l->dl_cap == 0 ? 4096 : l->dl_cap;
			while (cap < l->dl_len + take + 1)
				cap *= 2;
			if ((nb = realloc(l->dl_buf, cap)) == NULL) {
				log_warn("%s: realloc", __func__);
				l->dl_len = 0;
				return -1;
			}
			l->dl_buf = nb;
			l->dl_cap = cap;
		}
		memcpy(l->dl_buf + l->dl_len, data, take);
		l->dl_len += take;
		data += take;
		len -= take;
		if (nl == NULL)
			break;
		data++;
		len--;
		n = l->dl_len;
		l->dl_len = 0;
		if (n > 0 && l->dl_buf[n - 1] == '\r')
			n--;
		if (n == 0)
			continue;
		l->dl_buf[n] = '\0';
		if (cb(arg, l->dl_buf, n) == -1)
			return -1;
	}
	return 0;
}

void
discovery_lines_reset(struct discovery_lines *l)
{
	free(l->dl_buf);
	l->dl_buf = NULL;
	l->dl_len = l->dl_cap = 0;
}

/* Query-string encoding of s (RFC 3986 unreserved kept). */
static int
discovery_encode(const char *s, char *out, size_t len)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t o = 0;

	for (; *s != '\0'; s++) {
		unsigned char ch = (unsigned char)*s;

		if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		    (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' ||
		    ch == '.' || ch == '~') {
			if (o + 2 > len)
				return -1;
			out[o++] = (char)ch;
		} else {
			if (o + 4 > len)
				return -1;
			out[o++] = '%';
			out[o++] = hex[ch >> 4];
			out[o++] = hex[ch & 15];
		}
	}
	if (o + 1 > len)
		return -1;
	out[o] = '\0';
	return 0;
}

/* Plain http:// only for an API on loopback (tests, kubectl proxy). */
static bool
discovery_http_ok(const char *base)
{
	struct url u;

	if (url_parse(base, &u) == -1 || u.u_userinfo || u.u_rank >= 0)
		return false;
	if (url_scheme_is(&u, "https"))
		return true;
	if (!url_scheme_is(&u, "http"))
		return false;
	return strncmp(u.u_host, "127.", 4) == 0 ||
	    strcasecmp(u.u_host, "localhost") == 0 ||
	    strcmp(u.u_host, "::1") == 0;
}

/* ------------------------------------------------------------ process */

struct discovery *
discovery_new(struct poller *p)
{
	const struct config *cf = p->p_cf;
	struct upstream_config uc;
	struct discovery *d;
	const char *api, *host, *port, *ca, *tok;
	char sel[DISCOVERY_PATH_MAX], enc[DISCOVERY_PATH_MAX];
	unsigned i;
	size_t j, o;

	if (!cf->cf_service_discovery)
		return NULL;
	d = xcalloc(1, sizeof(*d));
	d->d_p = p;
	if ((api = getenv("SMG_K8S_API")) != NULL) {
		snprintf(d->d_base, sizeof(d->d_base), "%s", api);
		while (strlen(d->d_base) > 0 &&
		    d->d_base[strlen(d->d_base) - 1] == '/')
			d->d_base[strlen(d->d_base) - 1] = '\0';
	} else {
		host = getenv("KUBERNETES_SERVICE_HOST");
		port = getenv("KUBERNETES_SERVICE_PORT");
		if (host == NULL)
			fatalx("%s: KUBERNETES_SERVICE_HOST is not set",
			    __func__);
		/* The name every API server certificate carries: mbedTLS
		 * 2.28 matches DNS names only, not the IP SAN of
		 * KUBERNETES_SERVICE_HOST. */
		snprintf(d->d_base, sizeof(d->d_base),
		    "https://kubernetes.default.svc:%s",
		    port != NULL ? port : "443");
	}
	if (!discovery_http_ok(d->d_base))
		fatalx("%s: Kubernetes API %s: https:// URL required (http:// "
		       "only on loopback)",
		    __func__, d->d_base);
	tok = getenv("SMG_K8S_TOKEN_FILE");
	snprintf(d->d_token_path, sizeof(d->d_token_path), "%s",
	    tok != NULL ? tok : DISCOVERY_SA_DIR "/token");
	ca = getenv("SMG_K8S_CA_FILE");
	if (ca == NULL)
		ca = DISCOVERY_SA_DIR "/ca.crt";

	memset(&uc, 0, sizeof(uc));
	uc.uc_connect_timeout_secs = 10;
	if (access(ca, R_OK) == 0)
		uc.uc_ca_paths[0] = ca;
	else if (strncasecmp(d->d_base, "https://", 8) == 0)
		log_warnx("%s: no CA file %s: the system store verifies the "
		          "API server",
		    __func__, ca);
	if ((d->d_up = upstream_new(p->p_loop, &uc)) == NULL)
		fatalx("%s: cannot load the CA file %s", __func__, ca);

	if (cf->cf_service_discovery_namespace != NULL)
		snprintf(d->d_path, sizeof(d->d_path),
		    "/api/v1/namespaces/%s/pods",
		    cf->cf_service_discovery_namespace);
	else
		snprintf(d->d_path, sizeof(d->d_path), "/api/v1/pods");

	/* PD: prefill first, so a pod both selectors match is a prefill
	 * worker (SMG's order); EPD adds encode pods last. */
	if (cf->cf_pd_disaggregation || cf->cf_epd_disaggregation) {
		if (cf->cf_prefill_selector_n > 0) {
			d->d_w[d->d_nw].dw_rule.dr_selector =
			    (const char *const *)cf->cf_prefill_selector;
			d->d_w[d->d_nw].dw_rule.dr_nselector =
			    cf->cf_prefill_selector_n;
			d->d_w[d->d_nw++].dw_rule.dr_type =
			    SMG__WORKER_TYPE__WORKER_TYPE_PREFILL;
		}
		if (cf->cf_decode_selector_n > 0) {
			d->d_w[d->d_nw].dw_rule.dr_selector =
			    (const char *const *)cf->cf_decode_selector;
			d->d_w[d->d_nw].dw_rule.dr_nselector =
			    cf->cf_decode_selector_n;
			d->d_w[d->d_nw++].dw_rule.dr_type =
			    SMG__WORKER_TYPE__WORKER_TYPE_DECODE;
		}
		if (cf->cf_epd_disaggregation && cf->cf_encode_selector_n > 0) {
			d->d_w[d->d_nw].dw_rule.dr_selector =
			    (const char *const *)cf->cf_encode_selector;
			d->d_w[d->d_nw].dw_rule.dr_nselector =
			    cf->cf_encode_selector_n;
			d->d_w[d->d_nw++].dw_rule.dr_type =
			    SMG__WORKER_TYPE__WORKER_TYPE_ENCODE;
		}
	} else {
		d->d_w[0].dw_rule.dr_selector =
		    (const char *const *)cf->cf_selector;
		d->d_w[0].dw_rule.dr_nselector = cf->cf_selector_n;
		d->d_w[0].dw_rule.dr_type =
		    SMG__WORKER_TYPE__WORKER_TYPE_REGULAR;
		d->d_nw = 1;
	}
	for (i = 0; i < d->d_nw; i++) {
		struct dwatch *dw = &d->d_w[i];

		dw->dw_d = d;
		dw->dw_rule.dr_port = cf->cf_service_discovery_port;
		dw->dw_rule.dr_model_from = cf->cf_model_id_from;
		dw->dw_lines.dl_max = DISCOVERY_LINE_MAX;
		dw->dw_backoff = DISCOVERY_BACKOFF_MIN;
		for (j = 0, o = 0; j < dw->dw_rule.dr_nselector; j++) {
			if (o + strlen(dw->dw_rule.dr_selector[j]) + 2 >
			    sizeof(sel))
				fatalx("%s: selector too long", __func__);
			o += (size_t)snprintf(sel + o, sizeof(sel) - o, "%s%s",
			    j > 0 ? "," : "", dw->dw_rule.dr_selector[j]);
		}
		if (discovery_encode(sel, enc, sizeof(enc)) == -1 ||
		    snprintf(dw->dw_query, sizeof(dw->dw_query),
		        "labelSelector=%s", enc) >= (int)sizeof(dw->dw_query))
			fatalx("%s: selector too long", __func__);
		ev_init(&dw->dw_timer, discovery_timer_cb);
		dw->dw_timer.data = dw;
		discovery_metrics_init(dw, p->p_shm);
		log_info("%s: watching %s pods of %s%s with %s on %s", __func__,
		    discovery_role(dw->dw_rule.dr_type),
		    cf->cf_service_discovery_namespace != NULL
		        ? "namespace "
		        : "every namespace",
		    cf->cf_service_discovery_namespace != NULL
		        ? cf->cf_service_discovery_namespace
		        : "",
		    sel, d->d_base);
		discovery_list(dw);
	}
	return d;
}

void
discovery_free(struct discovery *d)
{
	unsigned i;

	if (d == NULL)
		return;
	for (i = 0; i < d->d_nw; i++) {
		struct dwatch *dw = &d->d_w[i];

		upstream_fetch_cancel(dw->dw_list);
		if (dw->dw_watch != NULL)
			upstream_cancel(dw->dw_watch);
		ev_timer_stop(d->d_p->p_loop, &dw->dw_timer);
		discovery_lines_reset(&dw->dw_lines);
		free(dw->dw_pods);
	}
	upstream_free(d->d_up);
	free(d);
}

/* Authorization (the token file is read again each time: the kubelet
 * rotates it), accept, user-agent. Returns the header count. */
static size_t
discovery_headers(struct discovery *d, struct upstream_header *h, char *auth,
    size_t authlen)
{
	ssize_t r;
	size_t n = 2, len;
	int fd;

	h[0] = (struct upstream_header) { "user-agent", 10, "smg-poller", 10 };
	h[1] = (struct upstream_header) { "accept", 6, "application/json", 16 };
	if ((fd = open(d->d_token_path, O_RDONLY | O_CLOEXEC)) == -1) {
		log_debug("%s: %s: %s", __func__, d->d_token_path,
		    strerror(errno));
		return n;
	}
	memcpy(auth, "Bearer ", 7);
	r = read(fd, auth + 7, authlen - 8);
	close(fd);
	if (r <= 0)
		return n;
	len = 7 + (size_t)r;
	while (len > 7 &&
	    (auth[len - 1] == '\n' || auth[len - 1] == '\r' ||
	        auth[len - 1] == ' '))
		len--;
	auth[len] = '\0';
	h[n++] = (struct upstream_header) { "authorization", 13, auth, len };
	return n;
}

static void
discovery_list(struct dwatch *dw)
{
	struct discovery *d = dw->dw_d;
	struct upstream_header h[3];
	char path[DISCOVERY_PATH_MAX * 2];
	char *auth = xmalloc(DISCOVERY_TOKEN_MAX);
	size_t n;

	n = discovery_headers(d, h, auth, DISCOVERY_TOKEN_MAX);
	snprintf(path, sizeof(path), "%s?%s", d->d_path, dw->dw_query);
	dw->dw_state = DW_LISTING;
	dw->dw_list = upstream_fetch(d->d_up, d->d_base, path, h, n,
	    DISCOVERY_LIST_TIMEOUT, DISCOVERY_LIST_MAX, discovery_list_done,
	    dw);
	free(auth);
	if (dw->dw_list == NULL)
		discovery_retry(dw, "out of memory");
}

static void
discovery_list_done(void *arg, const struct upstream_result *res)
{
	struct dwatch *dw = arg;
	struct discovery *d = dw->dw_d;
	const cJSON *items, *it, *meta;
	struct discovery_pod *pods = NULL, pod;
	size_t npods = 0, i, k;
	const char *rv;
	char why[160];
	cJSON *doc;
	bool changed;

	dw->dw_list = NULL;
	if (res->ur_error != UPSTREAM_OK || res->ur_status != 200 ||
	    res->ur_truncated) {
		if (res->ur_error != UPSTREAM_OK)
			snprintf(why, sizeof(why), "list: %s", res->ur_reason);
		else if (res->ur_truncated)
			snprintf(why, sizeof(why), "list larger than %d bytes",
			    DISCOVERY_LIST_MAX);
		else
			snprintf(why, sizeof(why), "list: status %d%s",
			    res->ur_status,
			    res->ur_status == 401 || res->ur_status == 403
			        ? " (the service account may not list pods)"
			        : "");
		discovery_retry(dw, why);
		return;
	}
	doc = cJSON_ParseWithLength(res->ur_body, res->ur_body_len);
	items = cJSON_GetObjectItemCaseSensitive(doc, "items");
	meta = cJSON_GetObjectItemCaseSensitive(doc, "metadata");
	rv = discovery_str(meta, "resourceVersion");
	if (!cJSON_IsArray(items) || rv == NULL || *rv == '\0' ||
	    strlen(rv) >= sizeof(dw->dw_rv)) {
		cJSON_Delete(doc);
		discovery_retry(dw, "list: not a pod list");
		return;
	}
	snprintf(dw->dw_rv, sizeof(dw->dw_rv), "%s", rv);
	/* The list replaces what the watch knew: pods deleted while no
	 * watch ran are forgotten here. */
	cJSON_ArrayForEach(it, items)
	{
		if (discovery_pod_parse(it, &dw->dw_rule, &pod) != 1)
			continue;
		pods = xreallocarray(pods, npods + 1, sizeof(*pods));
		pods[npods++] = pod;
	}
	cJSON_Delete(doc);
	changed = npods != dw->dw_npods;
	for (i = 0; !changed && i < npods; i++) {
		for (k = 0; k < dw->dw_npods; k++)
			if (memcmp(&pods[i], &dw->dw_pods[k],
			        sizeof(pods[i])) == 0)
				break;
		changed = k == dw->dw_npods;
	}
	free(dw->dw_pods);
	dw->dw_pods = pods;
	dw->dw_npods = dw->dw_cap = npods;
	for (i = 0, k = 0; i < npods; i++)
		k += pods[i].dp_ready;
	if (!dw->dw_listed || changed)
		log_info("%s: %zu %s pods listed, %zu ready (version %s)",
		    __func__, npods, discovery_role(dw->dw_rule.dr_type), k,
		    dw->dw_rv);
	dw->dw_listed = true;
	dw->dw_backoff = DISCOVERY_BACKOFF_MIN;
	d->d_dirty = d->d_dirty || changed || !d->d_sent;
	discovery_flush(d, shm_now_ms());
	discovery_watch(dw);
}

static void
discovery_watch(struct dwatch *dw)
{
	static const struct upstream_cbs cbs = {
		.on_head = discovery_watch_head,
		.on_body = discovery_watch_body,
		.on_done = discovery_watch_done,
	};
	struct discovery *d = dw->dw_d;
	struct upstream_header h[3];
	char path[DISCOVERY_PATH_MAX * 2], rv[DISCOVERY_RV_MAX * 3];
	char *auth = xmalloc(DISCOVERY_TOKEN_MAX);
	size_t n;

	n = discovery_headers(d, h, auth, DISCOVERY_TOKEN_MAX);
	if (discovery_encode(dw->dw_rv, rv, sizeof(rv)) == -1)
		rv[0] = '\0';
	snprintf(path, sizeof(path),
	    "%s?%s&watch=1&resourceVersion=%s&allowWatchBookmarks=true"
	    "&timeoutSeconds=%d",
	    d->d_path, dw->dw_query, rv, DISCOVERY_WATCH_SECS);
	dw->dw_state = DW_WATCHING;
	dw->dw_watch_status = 0;
	dw->dw_relist = false;
	dw->dw_gone = false;
	dw->dw_lines.dl_len = 0;
	dw->dw_started = ev_now(d->d_p->p_loop);
	dw->dw_watch = upstream_request(d->d_up, d->d_base, "GET", path, h, n,
	    NULL, 0, &cbs, dw);
	free(auth);
	if (dw->dw_watch == NULL) {
		discovery_retry(dw, "watch: cannot start");
		return;
	}
	/* The server ends the watch after timeoutSeconds; a silent one is
	 * given up a little later. */
	ev_timer_stop(d->d_p->p_loop, &dw->dw_timer);
	ev_timer_set(&dw->dw_timer, DISCOVERY_WATCH_SECS + 30, 0.);
	ev_timer_start(d->d_p->p_loop, &dw->dw_timer);
}

static void
discovery_watch_head(void *arg, int status, const struct upstream_header *h,
    size_t nh)
{
	struct dwatch *dw = arg;

	(void)h;
	(void)nh;
	dw->dw_watch_status = status;
	if (status == 410)
		dw->dw_gone = true;
	if (status != 200)
		dw->dw_relist = true;
}

static void
discovery_watch_body(void *arg, const char *data, size_t len)
{
	struct dwatch *dw = arg;
	struct discovery *d = dw->dw_d;

	if (dw->dw_watch_status != 200 || dw->dw_relist)
		return;
	if (discovery_lines_feed(&dw->dw_lines, data, len, discovery_watch_line,
	        dw) == -1) {
		if (!dw->dw_relist)
			log_warnx("%s: watch event longer than %d bytes or "
			          "out of memory: listing again",
			    __func__, DISCOVERY_LINE_MAX);
		dw->dw_relist = true;
	}
	discovery_flush(d, shm_now_ms());
	if (dw->dw_relist) {
		upstream_cancel(dw->dw_watch);
		dw->dw_watch = NULL;
		discovery_lines_reset(&dw->dw_lines);
		if (dw->dw_gone)
			discovery_wait(dw, 0., true);
		else
			discovery_retry(dw, "watch ended with an error");
	}
}

/* One event line. Returns -1 to end the watch (dw_relist set). */
static int
discovery_watch_line(void *arg, const char *line, size_t len)
{
	struct dwatch *dw = arg;
	struct discovery_pod pod;
	const cJSON *obj;
	const char *rv;
	cJSON *doc;
	int code, r;
	enum discovery_event ev;

	ev = discovery_event_parse(line, len, &doc, &obj, &code);
	switch (ev) {
	case DISCOVERY_EV_ADDED:
	case DISCOVERY_EV_MODIFIED:
	case DISCOVERY_EV_DELETED:
		r = discovery_pod_parse(obj, &dw->dw_rule, &pod);
		if (r == -1)
			break;
		if (ev == DISCOVERY_EV_DELETED || r == 0)
			discovery_forget(dw, pod.dp_key);
		else
			discovery_upsert(dw, &pod);
		/* FALLTHROUGH */
	case DISCOVERY_EV_BOOKMARK:
		rv = discovery_str(
		    cJSON_GetObjectItemCaseSensitive(obj, "metadata"),
		    "resourceVersion");
		if (rv != NULL && *rv != '\0' && strlen(rv) < sizeof(dw->dw_rv))
			memcpy(dw->dw_rv, rv, strlen(rv) + 1);
		break;
	case DISCOVERY_EV_ERROR:
		log_info("%s: watch error %d: listing again", __func__, code);
		dw->dw_gone = code == 410;
		dw->dw_relist = true;
		cJSON_Delete(doc);
		return -1;
	case DISCOVERY_EV_BAD:
		log_warnx("%s: unreadable watch event (%zu bytes) skipped",
		    __func__, len);
		break;
	}
	cJSON_Delete(doc);
	return 0;
}

static void
discovery_watch_done(void *arg, enum upstream_error err)
{
	struct dwatch *dw = arg;
	struct discovery *d = dw->dw_d;
	char why[96];

	dw->dw_watch = NULL;
	discovery_lines_reset(&dw->dw_lines);
	discovery_flush(d, shm_now_ms());
	if (dw->dw_gone) {
		log_info("%s: resource version %s expired: listing again",
		    __func__, dw->dw_rv);
		discovery_wait(dw, 0., true);
		return;
	}
	if (err == UPSTREAM_OK && !dw->dw_relist) {
		/* The server's timeoutSeconds: resume from where it was. */
		if (ev_now(d->d_p->p_loop) - dw->dw_started >= 1.0) {
			dw->dw_backoff = DISCOVERY_BACKOFF_MIN;
			discovery_watch(dw);
		} else {
			discovery_wait(dw, dw->dw_backoff, false);
			dw->dw_backoff *= 2;
			if (dw->dw_backoff > DISCOVERY_BACKOFF_MAX)
				dw->dw_backoff = DISCOVERY_BACKOFF_MAX;
		}
		return;
	}
	if (dw->dw_watch_status != 0 && dw->dw_watch_status != 200)
		snprintf(why, sizeof(why), "watch: status %d",
		    dw->dw_watch_status);
	else
		snprintf(why, sizeof(why), "watch: %s", upstream_strerror(err));
	discovery_retry(dw, why);
}

/* A failed list or watch: list again after the backoff. */
static void
discovery_retry(struct dwatch *dw, const char *why)
{
	log_warnx("%s: Kubernetes API %s: %s; listing again in %.2g s",
	    __func__, dw->dw_d->d_base, why, dw->dw_backoff);
	if (dw->dw_m_errors >= 0)
		metrics_add(dw->dw_d->d_p->p_shm, SHM_ROW_POLLER,
		    dw->dw_m_errors, 1);
	discovery_wait(dw, dw->dw_backoff, true);
	dw->dw_backoff *= 2;
	if (dw->dw_backoff > DISCOVERY_BACKOFF_MAX)
		dw->dw_backoff = DISCOVERY_BACKOFF_MAX;
}

/* After secs: a new list (relist), or the watch resumed from dw_rv. */
static void
discovery_wait(struct dwatch *dw, double secs, bool relist)
{
	struct ev_loop *loop = dw->dw_d->d_p->p_loop;

	dw->dw_state = relist ? DW_IDLE : DW_WAITING;
	ev_timer_stop(loop, &dw->dw_timer);
	ev_timer_set(&dw->dw_timer, secs, 0.);
	ev_timer_start(loop, &dw->dw_timer);
}

static void
discovery_timer_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct dwatch *dw = t->data;

	(void)loop;
	(void)revents;
	switch (dw->dw_state) {
	case DW_WATCHING:
		/* Nothing, not even the server's end, for too long. */
		if (dw->dw_watch != NULL)
			upstream_cancel(dw->dw_watch);
		dw->dw_watch = NULL;
		discovery_lines_reset(&dw->dw_lines);
		discovery_retry(dw, "watch: silent past its timeout");
		break;
	case DW_WAITING:
		discovery_watch(dw);
		break;
	case DW_IDLE:
		discovery_list(dw);
		break;
	case DW_LISTING:
		break;
	}
}

static void
discovery_upsert(struct dwatch *dw, const struct discovery_pod *pod)
{
	size_t i;

	for (i = 0; i < dw->dw_npods; i++) {
		if (strcmp(dw->dw_pods[i].dp_key, pod->dp_key) == 0) {
			if (memcmp(&dw->dw_pods[i], pod, sizeof(*pod)) != 0) {
				dw->dw_pods[i] = *pod;
				dw->dw_d->d_dirty = true;
			}
			return;
		}
	}
	if (dw->dw_npods == dw->dw_cap) {
		dw->dw_cap = dw->dw_cap == 0 ? 16 : dw->dw_cap * 2;
		dw->dw_pods = xreallocarray(dw->dw_pods, dw->dw_cap,
		    sizeof(*dw->dw_pods));
	}
	dw->dw_pods[dw->dw_npods++] = *pod;
	dw->dw_d->d_dirty = true;
}

static void
discovery_forget(struct dwatch *dw, const char *key)
{
	size_t i;

	for (i = 0; i < dw->dw_npods; i++) {
		if (strcmp(dw->dw_pods[i].dp_key, key) == 0) {
			dw->dw_pods[i] = dw->dw_pods[--dw->dw_npods];
			dw->dw_d->d_dirty = true;
			return;
		}
	}
}

/* Whether a ready pod's url is not in the worker table (the broker
 * restarted, or could not add it yet). */
static bool
discovery_missing(struct discovery *d)
{
	const struct poller *p = d->d_p;
	unsigned i, k;
	size_t j;

	for (i = 0; i < d->d_nw; i++) {
		for (j = 0; j < d->d_w[i].dw_npods; j++) {
			const struct discovery_pod *pod = &d->d_w[i].dw_pods[j];

			if (!pod->dp_ready)
				continue;
			for (k = 0; k < SHM_MAX_WORKERS; k++)
				if (p->p_workers[k].pw_in_use &&
				    strcmp(p->p_workers[k].pw_url,
				        pod->dp_url) == 0)
					break;
			if (k == SHM_MAX_WORKERS)
				return true;
		}
	}
	return false;
}

/*
 * Sends the set of ready pods once every watch has listed (before that,
 * a partial set would remove the other role's workers), when it changed,
 * and again while one of its urls is missing from the table.
 */
static void
discovery_flush(struct discovery *d, uint64_t now_ms)
{
	Smg__PollerMsg m = SMG__POLLER_MSG__INIT;
	Smg__DiscoveredSet set = SMG__DISCOVERED_SET__INIT;
	Smg__DiscoveredWorker *ws, **wp;
	size_t n = 0, total = 0, over = 0, j, k;
	unsigned i;

	for (i = 0; i < d->d_nw; i++) {
		if (!d->d_w[i].dw_listed)
			return;
		total += d->d_w[i].dw_npods;
	}
	if (!d->d_dirty &&
	    !(now_ms - d->d_sent_ms >= DISCOVERY_RESEND_MS &&
	        discovery_missing(d)) &&
	    now_ms - d->d_sent_ms < DISCOVERY_REFRESH_MS)
		return;
	ws = xcalloc(total + 1, sizeof(*ws));
	wp = xcalloc(total + 1, sizeof(*wp));
	for (i = 0; i < d->d_nw; i++) {
		for (j = 0; j < d->d_w[i].dw_npods; j++) {
			struct discovery_pod *pod = &d->d_w[i].dw_pods[j];

			if (!pod->dp_ready)
				continue;
			/* The worker table holds no more. */
			if (n == SHM_MAX_WORKERS) {
				over++;
				continue;
			}
			/* One worker per url: the first role wins. */
			for (k = 0; k < n; k++)
				if (strcmp(ws[k].url, pod->dp_url) == 0)
					break;
			if (k < n)
				continue;
			smg__discovered_worker__init(&ws[n]);
			ws[n].url = pod->dp_url;
			ws[n].worker_type = (Smg__WorkerType)pod->dp_type;
			ws[n].has_bootstrap_port = pod->dp_bootstrap_port >= 0;
			ws[n].bootstrap_port = pod->dp_bootstrap_port >= 0
			    ? (uint32_t)pod->dp_bootstrap_port
			    : 0;
			ws[n].model_id = pod->dp_model;
			ws[n].pod = pod->dp_key;
			wp[n] = &ws[n];
			n++;
		}
	}
	set.n_workers = n;
	set.workers = wp;
	m.body_case = SMG__POLLER_MSG__BODY_DISCOVERED;
	m.discovered = &set;
	if (report_send(d->d_p, &m) == 0) {
		if (d->d_dirty)
			log_info("%s: %zu ready pods sent to the broker%s",
			    __func__, n,
			    over > 0 ? " (more than the worker table holds)"
			             : "");
		d->d_dirty = false;
		d->d_sent = true;
	}
	d->d_sent_ms = now_ms;
	free(ws);
	free(wp);
}

void
discovery_tick(struct discovery *d, uint64_t now_ms)
{
	if (d == NULL)
		return;
	discovery_flush(d, now_ms);
	discovery_metrics(d);
}
