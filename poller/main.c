/*
 * main.c: smg-poller, the process that talks to workers for the broker.
 *
 * One libev loop. Every 200 ms it stamps its shm heartbeat and scans the
 * worker table; each slot's registration (register.c), health (health.c)
 * and load (load.c) schedules and its KV-event subscription (kvevents.c)
 * run from that scan, as does the resend of discovered pods (discovery.c); HTTP
 * requests, gRPC calls (rpc.c) and ZMQ messages complete on the loop. Findings
 * reach the broker through report.c. SIGTERM/SIGINT stop the loop: in-flight
 * probes are dropped and the process exits 0.
 */
#include "poller/poller.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shared/config.h"
#include "shared/fdlimit.h"
#include "shared/ipc.h"
#include "shared/log.h"
#include "shared/logsetup.h"
#include "shared/sighup.h"
#include "shared/tls.h"
#include "shared/url.h"
#include "shared/xmalloc.h"

#define POLLER_SCAN_SECS 0.2

static void poller_scan_cb(struct ev_loop *, ev_timer *, int);
static void poller_signal_cb(struct ev_loop *, ev_signal *, int);
static void poller_scan_slot(struct poller *, unsigned, uint64_t);
static struct tls_ctx *poller_grpc_tls_new(const struct config *);
static void poller_stop_slot(struct pworker *);
static void poller_group_intervals(struct poller *);

int
main(int argc, char *argv[])
{
	struct config cf;
	struct poller *p;
	struct ev_loop *loop;
	ev_timer scan;
	ev_signal sigterm, sigint;
	char url[512];
	unsigned i;

	log_init("smg-poller", LOG_LEVEL_INFO);
	config_load_or_exit(&cf, argc, argv);
	(void)fdlimit_raise();
	log_setlevel(cf.cf_log_level);
	signal(SIGPIPE, SIG_IGN);

	if ((loop = ev_default_loop(EVFLAG_AUTO)) == NULL)
		fatalx("%s: cannot make the event loop", __func__);
	logsetup_apply(loop, &cf);

	p = xcalloc(1, sizeof(*p));
	p->p_loop = loop;
	p->p_cf = &cf;
	for (i = 0; i < SHM_MAX_WORKERS; i++) {
		p->p_workers[i].pw_poller = p;
		p->p_workers[i].pw_slot = i;
	}
	if ((p->p_shm = shm_open_segment(cf.cf_run_dir)) == NULL)
		fatalx("%s: cannot map the shared segment in %s", __func__,
		    cf.cf_run_dir);
	if (shm_row_claim(p->p_shm, SHM_ROW_POLLER) == -1)
		fatalx("%s: another poller runs on %s", __func__,
		    cf.cf_run_dir);
	shm_heartbeat(p->p_shm, SHM_ROW_POLLER);
	if (ipc_url(url, sizeof(url), cf.cf_run_dir, IPC_REPORTS_SOCK) == -1)
		fatalx("%s: run dir path too long", __func__);
	if ((p->p_reports = ipc_client_new(loop, url, IPC_CLIENT_PUSH, 0)) ==
	    NULL)
		fatalx("%s: cannot dial %s", __func__, url);
	p->p_up = fetch_client_new(loop, &cf);
	p->p_grpc_tls = poller_grpc_tls_new(&cf);
	p->p_load_on = load_wanted(&cf);
	p->p_load_interval_ms = (uint64_t)cf.cf_load_monitor_interval * 1000;
	p->p_jwks = jwks_new(p);
	p->p_discovery = discovery_new(p);

	ev_timer_init(&scan, poller_scan_cb, 0., POLLER_SCAN_SECS);
	scan.data = p;
	ev_timer_start(loop, &scan);
	ev_signal_init(&sigterm, poller_signal_cb, SIGTERM);
	ev_signal_start(loop, &sigterm);
	ev_signal_init(&sigint, poller_signal_cb, SIGINT);
	ev_signal_start(loop, &sigint);
	sighup_ignore(loop);

	if (cf.cf_disable_health_check)
		log_info("%s: reporting to %s; health checks disabled",
		    __func__, url);
	else
		log_info("%s: reporting to %s; health %s every %ld s "
		         "(timeout %ld s)",
		    __func__, url, cf.cf_health_check_endpoint,
		    cf.cf_health_check_interval_secs,
		    cf.cf_health_check_timeout_secs);
	if (p->p_load_on)
		log_info("%s: load monitoring every %ld s", __func__,
		    cf.cf_load_monitor_interval);
	else
		log_info("%s: load monitoring off (nothing consumes loads)",
		    __func__);
	ev_run(loop, 0);

	for (i = 0; i < SHM_MAX_WORKERS; i++)
		poller_stop_slot(&p->p_workers[i]);
	kvevents_shutdown(p);
	jwks_free(p->p_jwks);
	discovery_free(p->p_discovery);
	ipc_client_free(p->p_reports);
	upstream_free(p->p_up);
	tls_ctx_free(p->p_grpc_tls);
	shm_row_release(p->p_shm, SHM_ROW_POLLER);
	shm_close(p->p_shm);
	free(p);
	log_info("%s: stopped", __func__);
	config_free(&cf);
	ev_loop_destroy(loop);
	return 0;
}

/*
 * The client context for grpcs:// workers, offering ALPN "h2" only.
 * Without one (no CA store, bad files) those workers are probed as
 * failed, which the log explains.
 */
static struct tls_ctx *
poller_grpc_tls_new(const struct config *cf)
{
	static const char *alpn_h2[] = { "h2", NULL };
	const char **cas;
	struct tls_ctx *ctx;
	size_t i;

	cas = xcalloc(cf->cf_ca_cert_paths_n + 1, sizeof(*cas));
	for (i = 0; i < cf->cf_ca_cert_paths_n; i++)
		cas[i] = cf->cf_ca_cert_paths[i];
	ctx = tls_ctx_new_client(cas, cf->cf_client_cert_path,
	    cf->cf_client_key_path);
	free(cas);
	if (ctx != NULL && tls_ctx_set_alpn(ctx, alpn_h2) == -1) {
		tls_ctx_free(ctx);
		ctx = NULL;
	}
	if (ctx == NULL)
		log_warnx("%s: no TLS client context; grpcs:// workers will "
		          "fail their probes",
		    __func__);
	return ctx;
}

/* Ends everything of a slot; the channel last, after its calls. */
static void
poller_stop_slot(struct pworker *pw)
{
	register_stop(pw);
	health_stop(pw);
	load_stop(pw);
	kvevents_stop(pw);
	rpc_stop(pw);
}

static void
poller_signal_cb(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)revents;
	log_info("%s: signal %d, stopping", __func__, w->signum);
	ev_break(loop, EVBREAK_ALL);
}

static void
poller_scan_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct poller *p = w->data;
	uint64_t now;
	unsigned i;

	(void)loop;
	(void)revents;
	shm_heartbeat(p->p_shm, SHM_ROW_POLLER);
	now = shm_now_ms();
	poller_group_intervals(p);
	for (i = 0; i < SHM_MAX_WORKERS; i++)
		poller_scan_slot(p, i, now);
	jwks_tick(p->p_jwks, now);
	discovery_tick(p->p_discovery, now);
}

/*
 * gateway.md §9.1: a worker spec's load_monitor_interval_secs lowers the
 * period of its group (model, worker type, connection mode): the group
 * polls at the minimum of the global interval and its members' own.
 * Uses the previous scan's view of the slots, a tick late at worst.
 */
static void
poller_group_intervals(struct poller *p)
{
	static unsigned own[SHM_MAX_WORKERS];
	unsigned i, j, n = 0;
	uint64_t ms;

	for (i = 0; i < SHM_MAX_WORKERS; i++) {
		struct pworker *pw = &p->p_workers[i];

		pw->pw_load_interval_ms = p->p_load_interval_ms;
		if (pw->pw_in_use && pw->pw_own_interval_secs > 0)
			own[n++] = i;
	}
	for (j = 0; j < n; j++) {
		const struct pworker *o = &p->p_workers[own[j]];

		ms = (uint64_t)o->pw_own_interval_secs * 1000;
		for (i = 0; i < SHM_MAX_WORKERS; i++) {
			struct pworker *pw = &p->p_workers[i];

			if (pw->pw_in_use && pw->pw_type == o->pw_type &&
			    pw->pw_mode == o->pw_mode &&
			    ms < pw->pw_load_interval_ms &&
			    strcmp(pw->pw_model, o->pw_model) == 0)
				pw->pw_load_interval_ms = ms;
		}
	}
}

/* Syncs the poller's view of one slot, then runs its schedules. */
static void
poller_scan_slot(struct poller *p, unsigned slot, uint64_t now)
{
	struct pworker *pw = &p->p_workers[slot];
	struct shm_worker w;

	if (shm_worker_read(p->p_shm, slot, &w) == -1) {
		if (pw->pw_in_use) {
			poller_stop_slot(pw);
			pw->pw_in_use = false;
		}
		return;
	}
	w.sw_url[sizeof(w.sw_url) - 1] = '\0';
	w.sw_api_key[sizeof(w.sw_api_key) - 1] = '\0';
	w.sw_model[sizeof(w.sw_model) - 1] = '\0';
	w.sw_kv_endpoint[sizeof(w.sw_kv_endpoint) - 1] = '\0';
	w.sw_grpc_endpoint[sizeof(w.sw_grpc_endpoint) - 1] = '\0';
	if (!pw->pw_in_use || pw->pw_generation != w.sw_generation ||
	    strcmp(pw->pw_url, w.sw_url) != 0) {
		/* A new worker in this slot: start from scratch. */
		poller_stop_slot(pw);
		pw->pw_load.ls_absent = false;
		pw->pw_load.ls_grpc_absent = false;
		pw->pw_runtime[0] = '\0';
		pw->pw_in_use = true;
		pw->pw_generation = w.sw_generation;
		memcpy(pw->pw_url, w.sw_url, sizeof(pw->pw_url));
		pw->pw_rank = url_rank(pw->pw_url);
		if (url_rank_base(pw->pw_url, pw->pw_base,
		        sizeof(pw->pw_base)) == -1)
			memcpy(pw->pw_base, pw->pw_url, sizeof(pw->pw_base));
	}
	pw->pw_status = w.sw_status;
	memcpy(pw->pw_api_key, w.sw_api_key, sizeof(pw->pw_api_key));
	memcpy(pw->pw_model, w.sw_model, sizeof(pw->pw_model));
	memcpy(pw->pw_kv_label, w.sw_kv_endpoint, sizeof(pw->pw_kv_label));
	pw->pw_type = w.sw_type;
	pw->pw_mode = w.sw_mode;
	pw->pw_own_interval_secs = w.sw_load_interval_secs;
	pw->pw_overload_on = w.sw_overload_on != 0;
	if (strcmp(pw->pw_grpc_label, w.sw_grpc_endpoint) != 0) {
		/* A new side channel: its calls and engine start over. */
		load_stop(pw);
		kvevents_stop(pw);
		if (!rpc_is_grpc_url(pw->pw_url)) {
			rpc_stop(pw);
			pw->pw_load.ls_grpc_absent = false;
		}
		memcpy(pw->pw_grpc_label, w.sw_grpc_endpoint,
		    sizeof(pw->pw_grpc_label));
	}
	register_tick(pw, now);
	health_tick(pw, now);
	load_tick(pw, now);
	kvevents_tick(pw, now);
}
