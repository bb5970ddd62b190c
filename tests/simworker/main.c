/*
 * main.c: smg-simworker, a simulated SGLang/vLLM engine for the gateway's
 * tests and benchmarks: command line, wiring of the modules, signals.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ev.h>

#include "shared/log.h"
#include "shared/xmalloc.h"
#include "tests/simworker/simworker.h"

enum main_flag_type {
	MAIN_FLAG_BOOL = 0,
	MAIN_FLAG_INT,
	MAIN_FLAG_DOUBLE,
	MAIN_FLAG_STR,
};

struct main_opts {
	const char *mo_host;
	long long mo_port;
	const char *mo_port_file;
	const char *mo_model;
	const char *mo_worker_id;
	const char *mo_engine;
	long long mo_max_running;
	long long mo_max_prefill_tokens;
	double mo_prefill_tps;
	double mo_decode_base_ms;
	double mo_decode_per_req_ms;
	long long mo_page_size;
	long long mo_kv_capacity;
	long long mo_context_length;
	double mo_time_scale;
	int mo_no_loads;
	long long mo_dp_size;
	int mo_strict_model;
	const char *mo_kv_endpoint;
	const char *mo_kv_format;
	const char *mo_kv_topic;
	double mo_fail_rate;
	double mo_hang_rate;
	double mo_close_rate;
	long long mo_fail_status;
	double mo_start_delay;
	long long mo_seed;
	const char *mo_role;
	long long mo_bootstrap_port;
	const char *mo_bootstrap_dir;
	double mo_bootstrap_timeout;
	const char *mo_log_level;
	long long mo_grpc_port;
	const char *mo_grpc_tls_cert;
	const char *mo_grpc_tls_key;
	const char *mo_grpc_fault;
	long long mo_grpc_kv_events;
	int mo_help;
};

static struct main_opts opts = {
	.mo_host = "127.0.0.1",
	.mo_port = 8000,
	.mo_model = "sim-model",
	.mo_engine = "sglang",
	.mo_max_running = 256,
	.mo_prefill_tps = 8000,
	.mo_decode_base_ms = 6,
	.mo_decode_per_req_ms = 0.35,
	.mo_page_size = 16,
	.mo_kv_capacity = 524288,
	.mo_context_length = 32768,
	.mo_time_scale = 1,
	.mo_kv_format = "array",
	.mo_kv_topic = "",
	.mo_fail_status = 500,
	.mo_seed = 1,
	.mo_role = "regular",
	.mo_bootstrap_port = -1,
	.mo_bootstrap_timeout = 30,
	.mo_log_level = "info",
	.mo_grpc_port = -1,
	.mo_grpc_fault = "",
	.mo_grpc_kv_events = 1,
	.mo_dp_size = 1,
};

/* Every flag: name, type, where it goes, bounds (numbers), help. */
static const struct main_flag {
	const char *mf_name;
	enum main_flag_type mf_type;
	void *mf_ptr;
	double mf_min;
	double mf_max;
	const char *mf_help;
} main_flags[] = {
	{ "host", MAIN_FLAG_STR, &opts.mo_host, 0, 0, "address to listen on" },
	{ "port", MAIN_FLAG_INT, &opts.mo_port, 0, 65535,
	    "port (0: any; see the first log line)" },
	{ "port-file", MAIN_FLAG_STR, &opts.mo_port_file, 0, 0,
	    "write the bound port there once serving" },
	{ "model", MAIN_FLAG_STR, &opts.mo_model, 0, 0, "served model id" },
	{ "worker-id", MAIN_FLAG_STR, &opts.mo_worker_id, 0, 0,
	    "x-sim-worker header value (default: the port)" },
	{ "engine", MAIN_FLAG_STR, &opts.mo_engine, 0, 0, "sglang or vllm" },
	{ "max-running", MAIN_FLAG_INT, &opts.mo_max_running, 1, 1000000,
	    "running batch limit" },
	{ "max-prefill-tokens", MAIN_FLAG_INT, &opts.mo_max_prefill_tokens, 0,
	    1e12,
	    "uncached prompt tokens admitted per step; the first request of a "
	    "step always is (0: no limit)" },
	{ "prefill-tps", MAIN_FLAG_DOUBLE, &opts.mo_prefill_tps, 1e-3, 1e12,
	    "prefill tokens per second" },
	{ "decode-base-ms", MAIN_FLAG_DOUBLE, &opts.mo_decode_base_ms, 0, 1e6,
	    "decode step time" },
	{ "decode-per-req-ms", MAIN_FLAG_DOUBLE, &opts.mo_decode_per_req_ms, 0,
	    1e6, "decode step time per running request" },
	{ "page-size", MAIN_FLAG_INT, &opts.mo_page_size, 1, 4096,
	    "KV page size in tokens" },
	{ "kv-capacity", MAIN_FLAG_INT, &opts.mo_kv_capacity, 1, 1e10,
	    "KV capacity in tokens" },
	{ "context-length", MAIN_FLAG_INT, &opts.mo_context_length, 2, 1e8,
	    "longest prompt + output" },
	{ "time-scale", MAIN_FLAG_DOUBLE, &opts.mo_time_scale, 0, 1e9,
	    "run this many times faster (0: no delays)" },
	{ "strict-model", MAIN_FLAG_BOOL, &opts.mo_strict_model, 0, 0,
	    "answer 404 to a request naming another model (as vLLM does)" },
	{ "no-loads", MAIN_FLAG_BOOL, &opts.mo_no_loads, 0, 0,
	    "answer 404 on /v1/loads" },
	{ "dp-size", MAIN_FLAG_INT, &opts.mo_dp_size, 1, SIM_DP_MAX,
	    "data-parallel ranks reported (server info dp_size, one "
	    "/v1/loads entry each); /sim/stats counts requests per "
	    "data_parallel_rank" },
	{ "kv-events-endpoint", MAIN_FLAG_STR, &opts.mo_kv_endpoint, 0, 0,
	    "ZMQ endpoint to bind a KV-event PUB socket at" },
	{ "kv-events-format", MAIN_FLAG_STR, &opts.mo_kv_format, 0, 0,
	    "array (SGLang) or map (vLLM)" },
	{ "kv-events-topic", MAIN_FLAG_STR, &opts.mo_kv_topic, 0, 0,
	    "KV-event topic frame" },
	{ "fail-rate", MAIN_FLAG_DOUBLE, &opts.mo_fail_rate, 0, 1,
	    "share of inference requests failed" },
	{ "hang-rate", MAIN_FLAG_DOUBLE, &opts.mo_hang_rate, 0, 1,
	    "share of inference requests never answered" },
	{ "close-rate", MAIN_FLAG_DOUBLE, &opts.mo_close_rate, 0, 1,
	    "share of responses cut by closing the connection" },
	{ "fail-status", MAIN_FLAG_INT, &opts.mo_fail_status, 400, 599,
	    "status of failed requests" },
	{ "start-delay", MAIN_FLAG_DOUBLE, &opts.mo_start_delay, 0, 86400,
	    "answer 503 for this many seconds (real time) after start" },
	{ "seed", MAIN_FLAG_INT, &opts.mo_seed, 0, 9e18,
	    "seed of the fault decisions" },
	{ "role", MAIN_FLAG_STR, &opts.mo_role, 0, 0,
	    "regular, prefill, decode or encode (PD/EPD)" },
	{ "bootstrap-port", MAIN_FLAG_INT, &opts.mo_bootstrap_port, -1, 65535,
	    "prefill/encode: bootstrap port it announces (-1: none)" },
	{ "bootstrap-dir", MAIN_FLAG_STR, &opts.mo_bootstrap_dir, 0, 0,
	    "directory where PD partners meet by bootstrap room" },
	{ "bootstrap-timeout", MAIN_FLAG_DOUBLE, &opts.mo_bootstrap_timeout, 0,
	    86400,
	    "decode: seconds to wait for the prefill's room before failing" },
	{ "log-level", MAIN_FLAG_STR, &opts.mo_log_level, 0, 0,
	    "debug, info, warn or error" },
	{ "grpc-port", MAIN_FLAG_INT, &opts.mo_grpc_port, -1, 65535,
	    "serve the engine's gRPC surface there (-1: off, 0: any)" },
	{ "grpc-tls-cert", MAIN_FLAG_STR, &opts.mo_grpc_tls_cert, 0, 0,
	    "gRPC over TLS (ALPN h2) with this PEM certificate" },
	{ "grpc-tls-key", MAIN_FLAG_STR, &opts.mo_grpc_tls_key, 0, 0,
	    "the PEM key of --grpc-tls-cert" },
	{ "grpc-fault", MAIN_FLAG_STR, &opts.mo_grpc_fault, 0, 0,
	    "unavailable, slow or reset: every gRPC call fails that way" },
	{ "grpc-kv-events", MAIN_FLAG_INT, &opts.mo_grpc_kv_events, 0, 1,
	    "0: SubscribeKvEvents answers UNIMPLEMENTED" },
	{ "help", MAIN_FLAG_BOOL, &opts.mo_help, 0, 0, "this text" },
};

#define MAIN_NFLAGS (sizeof(main_flags) / sizeof(main_flags[0]))

static enum sim_role main_role;

static void main_usage(void);
static void main_bad(const char *, const char *) __attribute__((noreturn));
static void main_parse(int, char **);
static void main_signal_cb(struct ev_loop *, ev_signal *, int);
static void main_step_hook(void *);
static void main_cache_event(void *, const struct kv_event *);

/* The listeners of the cache's events: ZMQ and gRPC publishers. */
static struct kvevents *main_kv;
static struct rpcsrv *main_rpc;
static int main_write_port(const char *, int);

static void
main_usage(void)
{
	size_t i;

	printf("usage: smg-simworker [--flag value ...]\n");
	for (i = 0; i < MAIN_NFLAGS; i++)
		printf("  --%-20s %s\n", main_flags[i].mf_name,
		    main_flags[i].mf_help);
}

static void
main_bad(const char *flag, const char *why)
{
	fprintf(stderr, "smg-simworker: --%s: %s\n", flag, why);
	exit(2);
}

static void
main_parse(int argc, char **argv)
{
	const struct main_flag *f;
	const char *arg, *val;
	char name[64], *end;
	size_t i, n;
	double d;
	int k;

	for (k = 1; k < argc; k++) {
		arg = argv[k];
		if (strncmp(arg, "--", 2) != 0) {
			fprintf(stderr,
			    "smg-simworker: unexpected argument "
			    "'%s'\n",
			    arg);
			exit(2);
		}
		arg += 2;
		val = strchr(arg, '=');
		n = val != NULL ? (size_t)(val - arg) : strlen(arg);
		if (n >= sizeof(name))
			n = sizeof(name) - 1;
		memcpy(name, arg, n);
		name[n] = '\0';
		for (f = NULL, i = 0; i < MAIN_NFLAGS; i++)
			if (strcmp(main_flags[i].mf_name, name) == 0)
				f = &main_flags[i];
		if (f == NULL)
			main_bad(name, "unknown flag");
		if (f->mf_type == MAIN_FLAG_BOOL) {
			if (val != NULL)
				main_bad(name, "takes no value");
			*(int *)f->mf_ptr = 1;
			continue;
		}
		if (val != NULL)
			val++;
		else if (k + 1 < argc)
			val = argv[++k];
		else
			main_bad(name, "needs a value");
		if (f->mf_type == MAIN_FLAG_STR) {
			*(const char **)f->mf_ptr = val;
			continue;
		}
		errno = 0;
		d = strtod(val, &end);
		if (errno != 0 || end == val || *end != '\0' || d != d ||
		    d < f->mf_min || d > f->mf_max)
			main_bad(name, "bad or out-of-range number");
		if (f->mf_type == MAIN_FLAG_INT) {
			if (d != (double)(long long)d)
				main_bad(name, "needs an integer");
			*(long long *)f->mf_ptr = (long long)d;
		} else {
			*(double *)f->mf_ptr = d;
		}
	}
	if (strcmp(opts.mo_engine, "sglang") != 0 &&
	    strcmp(opts.mo_engine, "vllm") != 0)
		main_bad("engine", "must be sglang or vllm");
	if (strcmp(opts.mo_kv_format, "array") != 0 &&
	    strcmp(opts.mo_kv_format, "map") != 0)
		main_bad("kv-events-format", "must be array or map");
	if (opts.mo_model[0] == '\0' || strlen(opts.mo_model) > 256 ||
	    strpbrk(opts.mo_model, "\"\\\n\r\t") != NULL)
		main_bad("model", "1-256 characters, no quotes or controls");
	if (opts.mo_worker_id != NULL &&
	    (opts.mo_worker_id[0] == '\0' || strlen(opts.mo_worker_id) > 128 ||
	        strpbrk(opts.mo_worker_id, "\r\n") != NULL))
		main_bad("worker-id", "1-128 characters on one line");
	if (opts.mo_kv_capacity < opts.mo_page_size ||
	    opts.mo_kv_capacity / opts.mo_page_size > (1LL << 26))
		main_bad("kv-capacity", "must hold 1 to 2^26 pages");
	if (opts.mo_kv_capacity < 2)
		main_bad("kv-capacity", "must be at least 2 tokens");
	if (pdsim_role_parse(opts.mo_role, &main_role) == -1)
		main_bad("role", "must be regular, prefill, decode or encode");
}

static void
main_signal_cb(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)revents;
	log_info("%s: signal %d, exiting", __func__, w->signum);
	ev_break(loop, EVBREAK_ALL);
}

/* arg is main's struct kvevents * variable, set once serving. */
static void
main_cache_event(void *arg, const struct kv_event *ev)
{
	(void)arg;
	if (main_kv != NULL)
		kvevents_add(main_kv, ev);
	if (main_rpc != NULL)
		rpcsrv_add_event(main_rpc, ev);
}

static void
main_step_hook(void *arg)
{
	struct kvevents **kv = arg;

	if (*kv != NULL)
		kvevents_flush(*kv);
}

/* Written to a temporary name and renamed, so readers never see half. */
static int
main_write_port(const char *path, int port)
{
	char *tmp;
	FILE *f;
	int rv = 0;

	tmp = xasprintf("%s.tmp", path);
	if ((f = fopen(tmp, "w")) == NULL) {
		log_warn("%s: %s", __func__, tmp);
		free(tmp);
		return -1;
	}
	if (fprintf(f, "%d\n", port) < 0)
		rv = -1;
	if (fclose(f) == EOF)
		rv = -1;
	if (rv == 0 && rename(tmp, path) == -1)
		rv = -1;
	if (rv == -1)
		log_warn("%s: %s", __func__, path);
	free(tmp);
	return rv;
}

int
main(int argc, char **argv)
{
	struct ev_loop *loop;
	struct engine_params ep;
	struct api_config ac;
	struct kvevents *kv = NULL;
	struct cache *cache;
	struct engine *engine;
	struct stats *stats;
	struct api *api;
	struct srv *srv;
	ev_signal sigterm, sigint;
	enum log_level level;
	char portstr[16];

	main_parse(argc, argv);
	if (opts.mo_help) {
		main_usage();
		return 0;
	}
	if (log_level_parse(opts.mo_log_level, &level) == -1)
		main_bad("log-level", "must be debug, info, warn or error");
	log_init("smg-simworker", level);
	signal(SIGPIPE, SIG_IGN);
	if ((loop = ev_default_loop(EVFLAG_AUTO)) == NULL)
		fatalx("%s: no libev loop", __func__);

	cache = cache_new((uint32_t)opts.mo_page_size,
	    (uint64_t)opts.mo_kv_capacity);
	stats = stats_new();
	memset(&ep, 0, sizeof(ep));
	ep.ep_max_running = (uint32_t)opts.mo_max_running;
	ep.ep_prefill_tps = opts.mo_prefill_tps;
	ep.ep_decode_base_ms = opts.mo_decode_base_ms;
	ep.ep_decode_per_req_ms = opts.mo_decode_per_req_ms;
	ep.ep_time_scale = opts.mo_time_scale;
	ep.ep_max_prefill_tokens = (uint64_t)opts.mo_max_prefill_tokens;

	/* The api reads the worker id (default: the port) per request. */
	portstr[0] = '\0';
	engine = engine_new(loop, &ep, cache, main_step_hook, &kv);
	memset(&ac, 0, sizeof(ac));
	ac.ac_model = opts.mo_model;
	ac.ac_worker_id = opts.mo_worker_id ? opts.mo_worker_id : portstr;
	ac.ac_engine = strcmp(opts.mo_engine, "vllm") == 0 ? SIM_ENGINE_VLLM
	                                                   : SIM_ENGINE_SGLANG;
	ac.ac_no_loads = opts.mo_no_loads;
	ac.ac_dp_size = (uint32_t)opts.mo_dp_size;
	ac.ac_strict_model = opts.mo_strict_model;
	ac.ac_context_length = (uint32_t)opts.mo_context_length;
	ac.ac_max_running = (uint32_t)opts.mo_max_running;
	ac.ac_page_size = (uint32_t)opts.mo_page_size;
	ac.ac_fail_rate = opts.mo_fail_rate;
	ac.ac_hang_rate = opts.mo_hang_rate;
	ac.ac_close_rate = opts.mo_close_rate;
	ac.ac_fail_status = (int)opts.mo_fail_status;
	ac.ac_ready_at = ev_now(loop) + opts.mo_start_delay;
	ac.ac_seed = (uint64_t)opts.mo_seed;
	ac.ac_time_scale = opts.mo_time_scale;
	ac.ac_role = main_role;
	ac.ac_host = opts.mo_host;
	ac.ac_bootstrap_port = (long)opts.mo_bootstrap_port;
	ac.ac_bootstrap_dir = opts.mo_bootstrap_dir;
	ac.ac_bootstrap_timeout = opts.mo_bootstrap_timeout;
	ac.ac_kv_endpoint = opts.mo_kv_endpoint;
	ac.ac_kv_topic = opts.mo_kv_topic;
	api = api_new(loop, &ac, engine, stats);

	srv = srv_new(loop, opts.mo_host, (int)opts.mo_port, api_request,
	    api_abort, api);
	if (srv == NULL)
		fatalx("%s: cannot listen on %s:%lld", __func__, opts.mo_host,
		    opts.mo_port);
	log_info("%s: listening on %s:%d", __func__, opts.mo_host,
	    srv_port(srv));
	snprintf(portstr, sizeof(portstr), "%d", srv_port(srv));
	if (opts.mo_kv_endpoint != NULL) {
		kv = kvevents_new(opts.mo_kv_endpoint, opts.mo_kv_topic,
		    strcmp(opts.mo_kv_format, "map") == 0 ? KVEV_FORMAT_MAP
		                                          : KVEV_FORMAT_ARRAY);
		if (kv == NULL)
			fatalx("%s: no KV-event publisher", __func__);
		main_kv = kv;
	}
	if (opts.mo_grpc_port >= 0) {
		struct rpcsrv_config rc;

		if (strcmp(opts.mo_grpc_fault, "") != 0 &&
		    strcmp(opts.mo_grpc_fault, "unavailable") != 0 &&
		    strcmp(opts.mo_grpc_fault, "slow") != 0 &&
		    strcmp(opts.mo_grpc_fault, "reset") != 0)
			main_bad("grpc-fault",
			    "must be unavailable, slow or reset");
		if ((opts.mo_grpc_tls_cert == NULL) !=
		    (opts.mo_grpc_tls_key == NULL))
			main_bad("grpc-tls-cert", "needs --grpc-tls-key");
		memset(&rc, 0, sizeof(rc));
		rc.rc_host = opts.mo_host;
		rc.rc_port = (int)opts.mo_grpc_port;
		rc.rc_tls_cert = opts.mo_grpc_tls_cert;
		rc.rc_tls_key = opts.mo_grpc_tls_key;
		rc.rc_fault = opts.mo_grpc_fault;
		rc.rc_kv_events = (int)opts.mo_grpc_kv_events;
		rc.rc_engine = engine;
		rc.rc_engine_kind = (int)ac.ac_engine;
		rc.rc_max_running = ac.ac_max_running;
		rc.rc_ready_at = ac.ac_ready_at;
		if ((main_rpc = rpcsrv_new(loop, &rc)) == NULL)
			fatalx("%s: cannot serve gRPC", __func__);
	}
	if (main_kv != NULL || main_rpc != NULL)
		cache_set_listener(cache, main_cache_event, NULL);
	if (opts.mo_port_file != NULL &&
	    main_write_port(opts.mo_port_file, srv_port(srv)) == -1)
		fatalx("%s: cannot write the port file", __func__);
	log_info("%s: engine %s, role %s, model %s, time scale %g%s", __func__,
	    opts.mo_engine, opts.mo_role, opts.mo_model, opts.mo_time_scale,
	    opts.mo_start_delay > 0 ? ", starting" : "");

	ev_signal_init(&sigterm, main_signal_cb, SIGTERM);
	ev_signal_start(loop, &sigterm);
	ev_signal_init(&sigint, main_signal_cb, SIGINT);
	ev_signal_start(loop, &sigint);
	ev_run(loop, 0);

	srv_free(srv);
	rpcsrv_free(main_rpc);
	api_free(api);
	engine_free(engine);
	cache_free(cache);
	kvevents_free(kv);
	stats_free(stats);
	ev_loop_destroy(loop);
	return 0;
}
