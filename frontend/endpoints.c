/*
 * endpoints.c: the routes the gateway answers itself (gateway.md §3.2):
 * readiness, the model list, the relays to the first Ready worker
 * (/get_model_info, /get_server_info, /health_generate) and /metrics.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "frontend/frontend.h"
#include "shared/log.h"

void
endpoint_readiness(struct conn *c, const char *id)
{
	struct shm_worker w;
	unsigned slot, total = 0, healthy = 0, ready_type[4] = { 0 };
	bool ready;
	cJSON *j = cJSON_CreateObject();

	for (slot = 0; slot < SHM_MAX_WORKERS; slot++) {
		if (shm_worker_read(fe->fe_shm, slot, &w) == -1)
			continue;
		total++;
		/* Routable: Ready and its circuit breaker not open. */
		if (w.sw_status == SHM_WORKER_READY &&
		    w.sw_breaker != SHM_BREAKER_OPEN) {
			healthy++;
			if (w.sw_type < 4)
				ready_type[w.sw_type]++;
		}
	}
	if (fe->fe_cf->cf_epd_disaggregation)
		ready =
		    ready_type[1] > 0 && ready_type[2] > 0 && ready_type[3] > 0;
	else if (fe->fe_cf->cf_pd_disaggregation)
		ready = ready_type[1] > 0 && ready_type[2] > 0;
	else
		ready = healthy > 0;
	if (fe->fe_draining) {
		cJSON_AddStringToObject(j, "status", "not ready");
		cJSON_AddStringToObject(j, "reason", "draining");
		conn_json(c, 503, j, id);
	} else if (!ready) {
		cJSON_AddStringToObject(j, "status", "not ready");
		cJSON_AddStringToObject(j, "reason",
		    "insufficient healthy workers");
		conn_json(c, 503, j, id);
	} else if (!decide_broker_ready()) {
		cJSON_AddStringToObject(j, "status", "not ready");
		cJSON_AddStringToObject(j, "reason", "broker unreachable");
		conn_json(c, 503, j, id);
	} else {
		cJSON_AddStringToObject(j, "status", "ready");
		cJSON_AddNumberToObject(j, "healthy_workers", healthy);
		cJSON_AddNumberToObject(j, "total_workers", total);
		conn_json(c, 200, j, id);
	}
}

void
endpoint_models(struct conn *c, const char *id)
{
	static struct shm_worker ws[SHM_MAX_WORKERS];
	unsigned slot, n = 0, i, k;
	cJSON *j, *data, *m;

	for (slot = 0; slot < SHM_MAX_WORKERS; slot++)
		if (shm_worker_read(fe->fe_shm, slot, &ws[n]) == 0)
			n++;
	/* Registration order, so the list is stable. */
	for (i = 1; i < n; i++)
		for (k = i; k > 0 && ws[k - 1].sw_order > ws[k].sw_order; k--) {
			struct shm_worker t = ws[k];

			ws[k] = ws[k - 1];
			ws[k - 1] = t;
		}
	j = cJSON_CreateObject();
	cJSON_AddStringToObject(j, "object", "list");
	data = cJSON_AddArrayToObject(j, "data");
	for (i = 0; i < n; i++) {
		bool seen = false;

		for (k = 0; k < i && !seen; k++)
			seen = strcmp(ws[k].sw_model, ws[i].sw_model) == 0;
		if (seen)
			continue;
		m = cJSON_CreateObject();
		cJSON_AddStringToObject(m, "id", ws[i].sw_model);
		cJSON_AddStringToObject(m, "object", "model");
		cJSON_AddNumberToObject(m, "created", 0);
		cJSON_AddStringToObject(m, "owned_by", "self_hosted");
		cJSON_AddItemToArray(data, m);
	}
	if (cJSON_GetArraySize(data) == 0) {
		cJSON_Delete(j);
		conn_respond(c, 503, "text/plain; charset=utf-8",
		    "No models available", strlen("No models available"), id);
		return;
	}
	conn_json(c, 200, j, id);
}

/* The first Ready HTTP worker of a type (registration order); -1 none. */
static int
endpoint_first_of_type(uint32_t type, struct shm_worker *out, unsigned *slot)
{
	struct shm_worker w;
	unsigned s;
	bool found = false;

	for (s = 0; s < SHM_MAX_WORKERS; s++) {
		if (shm_worker_read(fe->fe_shm, s, &w) == -1)
			continue;
		if (w.sw_status != SHM_WORKER_READY || w.sw_mode != 0 ||
		    w.sw_type != type)
			continue;
		if (!found || w.sw_order < out->sw_order) {
			*out = w;
			*slot = s;
			found = true;
		}
	}
	return found ? 0 : -1;
}

/*
 * GET /get_model_info, /get_server_info and (regular mode)
 * /health_generate: the first Ready worker's answer. PD/EPD has no
 * regular workers: the first Ready prefill worker answers, else the first
 * Ready decode worker.
 */
void
endpoint_first_ready(struct conn *c, const struct http_request *hr,
    const char *id)
{
	struct shm_worker w;
	unsigned slot;
	int rv;

	if (pd_enabled()) {
		rv = endpoint_first_of_type(
		    SMG__WORKER_TYPE__WORKER_TYPE_PREFILL, &w, &slot);
		if (rv == -1)
			rv = endpoint_first_of_type(
			    SMG__WORKER_TYPE__WORKER_TYPE_DECODE, &w, &slot);
	} else
		rv = fallback_first_ready(fe->fe_shm, &w, &slot);
	if (rv == -1) {
		conn_error(c, 503, "no_workers", "No healthy workers", id, 0);
		return;
	}
	proxy_fixed(c, hr, &w, slot, id);
}

/*
 * Liveness of the gateway's processes, read at scrape time (a dead process
 * cannot report its own death): smg_process_up{role} is 1 while the
 * broker and the poller hold their shm rows with a fresh heartbeat, and
 * smg_frontends_up counts the live frontend rows. A frontend of a remote
 * group reports the broker it talks to over the network, and no poller
 * (the brain's host runs it).
 */
static void
metrics_processes(struct http_out *o)
{
	char line[256];
	unsigned i, frontends = 0;
	bool remote = fe->fe_cf->cf_broker != NULL;
	int n;

	for (i = 0; i < SHM_MAX_FRONTENDS; i++)
		frontends += shm_row_alive(fe->fe_shm, (int)i);
	n = snprintf(line, sizeof(line),
	    "# HELP smg_process_up Whether the gateway process of this role "
	    "is alive\n# TYPE smg_process_up gauge\n"
	    "smg_process_up{role=\"broker\"} %d\n",
	    hostsync_broker_alive());
	http_out_append(o, line, (size_t)n);
	if (!remote) {
		n = snprintf(line, sizeof(line),
		    "smg_process_up{role=\"poller\"} %d\n",
		    shm_row_alive(fe->fe_shm, SHM_ROW_POLLER));
		http_out_append(o, line, (size_t)n);
	}
	n = snprintf(line, sizeof(line),
	    "# HELP smg_frontends_up Live frontend processes of this host\n"
	    "# TYPE smg_frontends_up gauge\nsmg_frontends_up %u\n",
	    frontends);
	http_out_append(o, line, (size_t)n);
}

void
endpoint_metrics(struct conn *c)
{
	struct shm_worker w;
	struct http_out o;
	char *text = NULL;
	size_t len = 0;
	unsigned slot;
	bool first = true;

	http_out_init(&o);
	if (metrics_render(fe->fe_shm, &text, &len) == -1) {
		conn_error(c, 503, "out_of_memory", "Out of memory", NULL, 0);
		return;
	}
	http_out_append(&o, text, len);
	/* In-flight is summed over the frontend rows at render time. */
	if (strstr(text, "\nsmg_worker_requests_active{") == NULL &&
	    strncmp(text, "smg_worker_requests_active{", 27) != 0) {
		for (slot = 0; slot < SHM_MAX_WORKERS; slot++) {
			if (shm_worker_read(fe->fe_shm, slot, &w) == -1)
				continue;
			if (first) {
				static const char t[] =
				    "# TYPE smg_worker_requests_active gauge\n";
				http_out_append(&o, t, sizeof(t) - 1);
				first = false;
			}
			char line[SHM_URL_MAX + 96];
			int n = snprintf(line, sizeof(line),
			    "smg_worker_requests_active{worker=\"%s\"} %u\n",
			    w.sw_url, shm_inflight_total(fe->fe_shm, slot));
			if (n > 0 && (size_t)n < sizeof(line))
				http_out_append(&o, line, (size_t)n);
		}
	}
	free(text);
	metrics_processes(&o);
	if (o.ho_failed) {
		http_out_free(&o);
		conn_error(c, 503, "out_of_memory", "Out of memory", NULL, 0);
		return;
	}
	conn_respond(c, 200, "text/plain; version=0.0.4", o.ho_buf, o.ho_len,
	    NULL);
	http_out_free(&o);
}
