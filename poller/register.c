/*
 * register.c: registration discovery of Pending workers (gateway.md §10,
 * workers.md §2.1).
 *
 * For each Pending worker: GET /health (2xx = reachable), then identify the
 * engine and the model: /v1/models (first entry's id and owned_by), and
 * only for what is still unknown /version (vLLM), /server_info (SGLang),
 * /model_info or /get_model_info (model_path). The finding goes to the
 * broker as WorkerDiscovery. An unreachable worker is tried again every
 * second, then every --worker-startup-check-interval once it has been
 * waited for 30 s, until --worker-startup-timeout-secs: then ok=false.
 */
#include "poller/poller.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "shared/config.h"
#include "shared/log.h"

#define REGISTER_FAST_RETRY_MS 1000
#define REGISTER_FAST_PHASE_MS 30000
/* A worker still Pending this long after a report is discovered again
 * (the report may have been lost while the broker restarted). */
#define REGISTER_RECHECK_MS 5000

static void reg_attempt(struct pworker *, uint64_t);
static void reg_get(struct pworker *, enum register_step, const char *);
static void reg_next(struct pworker *);
static void reg_done_cb(void *, const struct upstream_result *);
static void reg_failed(struct pworker *, const char *);
static void reg_report(struct pworker *, bool);
static bool reg_2xx(const struct upstream_result *);
static void reg_describe(const struct upstream_result *, char *, size_t);
static void reg_grpc_cb(struct pworker *, bool, const char *);

static const struct {
	const char *name;
	const char *runtime;
} reg_engines[] = {
	{ "sglang", "sglang" },
	{ "vllm", "vllm" },
	{ "trtllm", "trtllm" },
	{ "tensorrt_llm", "trtllm" },
	{ "nvidia", "trtllm" },
	{ "tokenspeed", "tokenspeed" },
	{ "mlx", "mlx" },
};

static void
reg_copy(char *dst, size_t len, const char *src)
{
	snprintf(dst, len, "%s", src);
}

int
register_parse_models(const char *body, size_t len, struct register_models *out)
{
	cJSON *root, *data, *first, *id, *owned, *rootpath;
	char owner[32];
	size_t i;

	memset(out, 0, sizeof(*out));
	if ((root = cJSON_ParseWithLength(body, len)) == NULL)
		return -1;
	if (!cJSON_IsObject(root)) {
		cJSON_Delete(root);
		return -1;
	}
	data = cJSON_GetObjectItemCaseSensitive(root, "data");
	first = cJSON_IsArray(data) ? cJSON_GetArrayItem(data, 0) : NULL;
	if (cJSON_IsObject(first)) {
		id = cJSON_GetObjectItemCaseSensitive(first, "id");
		if (cJSON_IsString(id) && id->valuestring[0] != '\0')
			reg_copy(out->rm_id, sizeof(out->rm_id),
			    id->valuestring);
		rootpath = cJSON_GetObjectItemCaseSensitive(first, "root");
		if (cJSON_IsString(rootpath))
			reg_copy(out->rm_root, sizeof(out->rm_root),
			    rootpath->valuestring);
		owned = cJSON_GetObjectItemCaseSensitive(first, "owned_by");
		if (cJSON_IsString(owned) &&
		    strlen(owned->valuestring) < sizeof(owner)) {
			for (i = 0; owned->valuestring[i] != '\0'; i++)
				owner[i] = (char)tolower(
				    (unsigned char)owned->valuestring[i]);
			owner[i] = '\0';
			for (i = 0;
			     i < sizeof(reg_engines) / sizeof(reg_engines[0]);
			     i++)
				if (strcmp(owner, reg_engines[i].name) == 0) {
					reg_copy(out->rm_runtime,
					    sizeof(out->rm_runtime),
					    reg_engines[i].runtime);
					break;
				}
		}
	}
	cJSON_Delete(root);
	return 0;
}

uint32_t
register_parse_dp_size(const char *body, size_t len)
{
	static const char *const names[] = { "dp_size", "data_parallel_size" };
	cJSON *root, *v;
	uint32_t n = 0;
	size_t i;

	if ((root = cJSON_ParseWithLength(body, len)) == NULL)
		return 0;
	for (i = 0; i < 2 && n == 0 && cJSON_IsObject(root); i++) {
		v = cJSON_GetObjectItemCaseSensitive(root, names[i]);
		if (cJSON_IsNumber(v) && v->valuedouble >= 1 &&
		    v->valuedouble <= INT32_MAX &&
		    v->valuedouble == (double)(int64_t)v->valuedouble)
			n = (uint32_t)v->valuedouble;
	}
	cJSON_Delete(root);
	return n;
}

int
register_parse_model_info(const char *body, size_t len, char *model,
    size_t model_len)
{
	cJSON *root, *path;
	int rv = -1;

	if ((root = cJSON_ParseWithLength(body, len)) == NULL)
		return -1;
	path = cJSON_GetObjectItemCaseSensitive(root, "model_path");
	if (cJSON_IsObject(root) && cJSON_IsString(path) &&
	    path->valuestring[0] != '\0') {
		reg_copy(model, model_len, path->valuestring);
		rv = 0;
	}
	cJSON_Delete(root);
	return rv;
}

void
register_tick(struct pworker *pw, uint64_t now)
{
	const struct config *cf = pw->pw_poller->p_cf;
	struct register_state *rs = &pw->pw_reg;
	bool pending, unnamed;

	pending = pw->pw_status == SHM_WORKER_PENDING;
	/* Without health checks workers start Ready: still learn the model. */
	unnamed = cf->cf_disable_health_check &&
	    pw->pw_status == SHM_WORKER_READY &&
	    strcmp(pw->pw_model, "unknown") == 0;
	if (!pending && !unnamed) {
		if (rs->rs_step != REGISTER_IDLE)
			register_stop(pw);
		return;
	}
	switch (rs->rs_step) {
	case REGISTER_IDLE:
		rs->rs_first_ms = now;
		rs->rs_attempts = 0;
		rs->rs_next_ms =
		    now + (uint64_t)cf->cf_worker_startup_delay * 1000;
		rs->rs_step = REGISTER_WAIT;
		if (now >= rs->rs_next_ms)
			reg_attempt(pw, now);
		break;
	case REGISTER_WAIT:
		if (now >= rs->rs_next_ms)
			reg_attempt(pw, now);
		break;
	case REGISTER_DONE:
		if (pending && now >= rs->rs_next_ms) {
			log_debug("%s: %s still pending, discovering again",
			    __func__, pw->pw_url);
			reg_attempt(pw, now);
		}
		break;
	default:
		break; /* a request is in flight */
	}
}

void
register_stop(struct pworker *pw)
{
	if (pw->pw_reg.rs_step == REGISTER_GRPC)
		rpc_detect_cancel(pw);
	upstream_fetch_cancel(pw->pw_reg.rs_req);
	memset(&pw->pw_reg, 0, sizeof(pw->pw_reg));
}

static void
reg_attempt(struct pworker *pw, uint64_t now)
{
	struct register_state *rs = &pw->pw_reg;

	(void)now;
	rs->rs_models_live = false;
	rs->rs_model[0] = '\0';
	rs->rs_runtime[0] = '\0';
	rs->rs_dp_size = 0;
	rs->rs_attempts++;
	if (rpc_is_grpc_url(pw->pw_url)) {
		/* gRPC only: the engine's own HealthCheck identifies it. */
		rs->rs_step = REGISTER_GRPC;
		if (rpc_detect(pw, reg_grpc_cb) == -1)
			reg_failed(pw, "cannot start gRPC HealthCheck");
		return;
	}
	reg_get(pw, REGISTER_HEALTH, "/health");
}

static void
reg_grpc_cb(struct pworker *pw, bool ok, const char *detail)
{
	struct register_state *rs = &pw->pw_reg;
	char msg[REGISTER_ERROR_MAX];

	if (!ok) {
		snprintf(msg, sizeof(msg), "gRPC: %s", detail);
		reg_failed(pw, msg);
		return;
	}
	/* The model stays what the worker was registered with. */
	rs->rs_model[0] = '\0';
	reg_copy(rs->rs_runtime, sizeof(rs->rs_runtime), rpc_runtime(pw));
	log_info("%s: %s serves %s", __func__, pw->pw_url, detail);
	reg_report(pw, true);
}

static void
reg_get(struct pworker *pw, enum register_step step, const char *path)
{
	struct poller *p = pw->pw_poller;
	struct register_state *rs = &pw->pw_reg;

	rs->rs_step = step;
	rs->rs_req = fetch_get(p, pw->pw_base, path, pw->pw_api_key,
	    (double)p->p_cf->cf_health_check_timeout_secs, POLLER_BODY_MAX,
	    reg_done_cb, pw);
	if (rs->rs_req == NULL)
		reg_failed(pw, "out of memory");
}

static bool
reg_2xx(const struct upstream_result *res)
{
	return res->ur_error == UPSTREAM_OK && res->ur_status >= 200 &&
	    res->ur_status < 300;
}

static void
reg_describe(const struct upstream_result *res, char *buf, size_t len)
{
	if (res->ur_error != UPSTREAM_OK)
		snprintf(buf, len, "%s", res->ur_reason);
	else
		snprintf(buf, len, "status %d", res->ur_status);
}

static void
reg_done_cb(void *arg, const struct upstream_result *res)
{
	struct pworker *pw = arg;
	struct register_state *rs = &pw->pw_reg;
	struct register_models rm;
	char why[64], msg[REGISTER_ERROR_MAX];

	rs->rs_req = NULL;
	switch (rs->rs_step) {
	case REGISTER_HEALTH:
		if (!reg_2xx(res)) {
			reg_describe(res, why, sizeof(why));
			snprintf(msg, sizeof(msg), "GET /health: %s", why);
			reg_failed(pw, msg);
			return;
		}
		reg_get(pw, REGISTER_MODELS, "/v1/models");
		return;
	case REGISTER_MODELS:
		if (reg_2xx(res) && !res->ur_truncated &&
		    register_parse_models(res->ur_body, res->ur_body_len,
		        &rm) == 0) {
			rs->rs_models_live = true;
			reg_copy(rs->rs_model, sizeof(rs->rs_model), rm.rm_id);
			reg_copy(rs->rs_runtime, sizeof(rs->rs_runtime),
			    rm.rm_runtime);
		}
		break;
	case REGISTER_VERSION:
		if (reg_2xx(res))
			reg_copy(rs->rs_runtime, sizeof(rs->rs_runtime),
			    "vllm");
		break;
	case REGISTER_SERVER_INFO:
		if (reg_2xx(res))
			reg_copy(rs->rs_runtime, sizeof(rs->rs_runtime),
			    "sglang");
		break;
	case REGISTER_MODEL_INFO:
	case REGISTER_GET_MODEL_INFO:
		if (reg_2xx(res) && !res->ur_truncated &&
		    register_parse_model_info(res->ur_body, res->ur_body_len,
		        rs->rs_model, sizeof(rs->rs_model)) == 0)
			break;
		if (rs->rs_step == REGISTER_MODEL_INFO &&
		    res->ur_error == UPSTREAM_OK && res->ur_status == 404) {
			reg_get(pw, REGISTER_GET_MODEL_INFO, "/get_model_info");
			return;
		}
		break;
	case REGISTER_DP_INFO:
	case REGISTER_DP_INFO_GET:
		if (reg_2xx(res) && !res->ur_truncated)
			rs->rs_dp_size = register_parse_dp_size(res->ur_body,
			    res->ur_body_len);
		else if (rs->rs_step == REGISTER_DP_INFO &&
		    res->ur_error == UPSTREAM_OK && res->ur_status == 404) {
			reg_get(pw, REGISTER_DP_INFO_GET, "/get_server_info");
			return;
		}
		if (rs->rs_dp_size == 0 && pw->pw_rank < 0)
			log_info("%s: %s reports no dp_size: one worker, "
			         "without data-parallel rank",
			    __func__, pw->pw_url);
		reg_report(pw, true);
		return;
	default:
		log_warnx("%s: %s: unexpected step %d", __func__, pw->pw_url,
		    (int)rs->rs_step);
		return;
	}
	reg_next(pw);
}

/* Issues the next identification request still needed, or concludes. */
static void
reg_next(struct pworker *pw)
{
	struct register_state *rs = &pw->pw_reg;
	enum register_step s = rs->rs_step;

	if (rs->rs_runtime[0] == '\0' && s < REGISTER_VERSION) {
		reg_get(pw, REGISTER_VERSION, "/version");
		return;
	}
	if (rs->rs_runtime[0] == '\0' && s < REGISTER_SERVER_INFO) {
		reg_get(pw, REGISTER_SERVER_INFO, "/server_info");
		return;
	}
	if (rs->rs_model[0] == '\0' && s < REGISTER_MODEL_INFO) {
		reg_get(pw, REGISTER_MODEL_INFO, "/model_info");
		return;
	}
	if (rs->rs_runtime[0] == '\0') {
		/* model_info is SGLang's; a bare /v1/models is generic. */
		if (rs->rs_model[0] != '\0' && !rs->rs_models_live)
			reg_copy(rs->rs_runtime, sizeof(rs->rs_runtime),
			    "sglang");
		else if (rs->rs_models_live)
			reg_copy(rs->rs_runtime, sizeof(rs->rs_runtime),
			    "generic");
		else {
			reg_failed(pw,
			    "engine not identified (no /v1/models, /version, "
			    "/server_info or model_info)");
			return;
		}
	}
	/* --dp-aware: how many data-parallel ranks the engine runs
	 * (gateway.md §1, workers.md §2.1); a URL naming its rank is not
	 * expanded but shows its engine's size. */
	if (pw->pw_poller->p_cf->cf_dp_aware) {
		reg_get(pw, REGISTER_DP_INFO, "/server_info");
		return;
	}
	reg_report(pw, true);
}

static void
reg_failed(struct pworker *pw, const char *why)
{
	const struct config *cf = pw->pw_poller->p_cf;
	struct register_state *rs = &pw->pw_reg;
	uint64_t now = shm_now_ms(), waited = now - rs->rs_first_ms;

	reg_copy(rs->rs_error, sizeof(rs->rs_error), why);
	if (waited >= (uint64_t)cf->cf_worker_startup_timeout_secs * 1000) {
		log_warnx("%s: %s: gave up after %llu s: %s", __func__,
		    pw->pw_url, (unsigned long long)(waited / 1000), why);
		reg_report(pw, false);
		return;
	}
	if (rs->rs_attempts == 1)
		log_info("%s: waiting for %s: %s", __func__, pw->pw_url, why);
	else
		log_debug("%s: %s attempt %u: %s", __func__, pw->pw_url,
		    rs->rs_attempts, why);
	rs->rs_step = REGISTER_WAIT;
	rs->rs_next_ms = now +
	    (waited < REGISTER_FAST_PHASE_MS
	            ? REGISTER_FAST_RETRY_MS
	            : (uint64_t)cf->cf_worker_startup_check_interval * 1000);
}

static void
reg_report(struct pworker *pw, bool ok)
{
	struct register_state *rs = &pw->pw_reg;
	Smg__PollerMsg m = SMG__POLLER_MSG__INIT;
	Smg__WorkerDiscovery d = SMG__WORKER_DISCOVERY__INIT;

	d.worker_slot = pw->pw_slot;
	d.worker_generation = pw->pw_generation;
	d.worker_url = pw->pw_url;
	d.ok = ok;
	d.model_id = ok ? rs->rs_model : "";
	d.runtime = ok ? rs->rs_runtime : "";
	d.error = ok ? "" : rs->rs_error;
	d.dp_size = ok ? rs->rs_dp_size : 0;
	m.body_case = SMG__POLLER_MSG__BODY_DISCOVERY;
	m.discovery = &d;
	/* Kept past registration: the load fallback depends on it. */
	if (ok)
		memcpy(pw->pw_runtime, rs->rs_runtime, sizeof(pw->pw_runtime));
	if (ok && rs->rs_dp_size > 0)
		log_info("%s: %s: model %s, runtime %s, dp_size %u", __func__,
		    pw->pw_url,
		    rs->rs_model[0] != '\0' ? rs->rs_model : "(none)",
		    rs->rs_runtime, (unsigned)rs->rs_dp_size);
	else if (ok)
		log_info("%s: %s: model %s, runtime %s", __func__, pw->pw_url,
		    rs->rs_model[0] != '\0' ? rs->rs_model : "(none)",
		    rs->rs_runtime);
	(void)report_send(pw->pw_poller, &m);
	rs->rs_step = REGISTER_DONE;
	rs->rs_next_ms = shm_now_ms() + REGISTER_RECHECK_MS;
}
