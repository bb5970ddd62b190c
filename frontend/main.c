/*
 * main.c: smg-frontend, one of the N stateless proxy processes. Parses the
 * command line, maps the shared segment and claims its row, opens the
 * listeners, the upstream pools and the broker client, and runs the loop
 * until SIGTERM/SIGINT, after which it drains in-flight requests up to
 * --shutdown-grace-period-secs and exits 0.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ev.h>

#include "frontend/frontend.h"
#include "shared/config.h"
#include "shared/fdlimit.h"
#include "shared/ipc.h"
#include "shared/log.h"
#include "shared/policy_info.h"
#include "shared/logsetup.h"
#include "shared/portlock.h"
#include "shared/sighup.h"
#include "shared/tls.h"

#define FE_CONNECT_TIMEOUT 10.0
#define FE_IDLE_PER_WORKER 256
#define FE_BROKER_INFLIGHT 1024
#define FE_DRAIN_CHECK     0.05

static struct frontend fe_state;
struct frontend *fe = &fe_state;

static ev_signal sig_term, sig_int;
static ev_timer heartbeat_timer, drain_timer;
static ev_tstamp drain_deadline, drain_started;

static void frontend_sig_cb(struct ev_loop *, ev_signal *, int);
static void frontend_heartbeat_cb(struct ev_loop *, ev_timer *, int);
static void frontend_drain_cb(struct ev_loop *, ev_timer *, int);

static void
frontend_heartbeat_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	static unsigned long resent;
	unsigned long n;

	(void)loop;
	(void)w;
	(void)revents;
	shm_heartbeat(fe->fe_shm, fe->fe_row);
	stats_gauge_set("smg_http_connections_active", "",
	    (int64_t)fe->fe_nconns);
	/* The upstream client re-sends on stale pooled connections by
	 * itself (gateway.md §4 step 7); its count becomes the series. */
	n = upstream_send_retries(fe->fe_up);
	if (n != resent) {
		stats_add("smg_router_upstream_send_retries_total",
		    "router_type=\"http\"", (int64_t)(n - resent));
		resent = n;
	}
}

static void
frontend_drain_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)w;
	(void)revents;
	/* Idle keep-alive connections get FE_DRAIN_IDLE_SECS to send a last
	 * request (answered with Connection: close) before the exit. */
	if (fe->fe_nbusy == 0 &&
	    (fe->fe_nconns == 0 ||
	        ev_now(loop) >= drain_started + FE_DRAIN_IDLE_SECS)) {
		log_info("%s: drained", __func__);
		ev_break(loop, EVBREAK_ALL);
	} else if (ev_now(loop) >= drain_deadline) {
		log_warnx("%s: grace period over, %u requests cut", __func__,
		    fe->fe_nbusy);
		ev_break(loop, EVBREAK_ALL);
	}
}

static void
frontend_sig_cb(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)revents;
	if (fe->fe_draining) {
		log_info("%s: signal %d again, stopping now", __func__,
		    w->signum);
		ev_break(loop, EVBREAK_ALL);
		return;
	}
	log_info("%s: signal %d, draining %u requests", __func__, w->signum,
	    fe->fe_nbusy);
	fe->fe_draining = true;
	listener_close_all();
	conn_drain_all();
	drain_started = ev_now(loop);
	drain_deadline =
	    drain_started + (double)fe->fe_cf->cf_shutdown_grace_period_secs;
	ev_timer_init(&drain_timer, frontend_drain_cb, 0., FE_DRAIN_CHECK);
	ev_timer_start(loop, &drain_timer);
}

int
main(int argc, char *argv[])
{
	static struct config cf;
	struct upstream_config uc;
	struct portlock_owner owner;
	struct ev_loop *loop;
	size_t i;

	config_load_or_exit(&cf, argc, argv);
	log_init("smg-frontend", cf.cf_log_level);
	(void)fdlimit_raise();
	signal(SIGPIPE, SIG_IGN);
	srandom((unsigned)time(NULL) ^ (unsigned)getpid());

	loop = ev_default_loop(0);
	logsetup_apply(loop, &cf);
	fe->fe_loop = loop;
	fe->fe_cf = &cf;
	fe->fe_limits.hl_max_body_bytes = cf.cf_max_payload_size;

	if ((fe->fe_shm = shm_open_segment(cf.cf_run_dir)) == NULL)
		fatalx("%s: cannot map the shared segment in %s", __func__,
		    cf.cf_run_dir);
	if ((fe->fe_row = shm_frontend_claim(fe->fe_shm,
	         (int)cf.cf_frontend_slot)) == -1)
		fatalx("%s: no free frontend row", __func__);
	if (cf.cf_frontend_slot >= 0 && fe->fe_row != cf.cf_frontend_slot) {
		/* A live duplicate (an orphan of a killed supervisor): two
		 * processes of one slot would both listen. */
		log_error("%s: frontend slot %ld is held by live pid %d; not "
		          "starting",
		    __func__, cf.cf_frontend_slot,
		    (int)atomic_load(&shm_segment(fe->fe_shm)
		                          ->sh_rows[cf.cf_frontend_slot]
		                          .row_pid));
		shm_row_release(fe->fe_shm, fe->fe_row);
		exit(2);
	}
	shm_heartbeat(fe->fe_shm, fe->fe_row);
	stats_init();
	hdr_init(&cf);
	auth_init();
	tenant_init();
	trace_init();
	/* Routing text and parse tree only for who reads them. */
	extract_set_lean(!policy_info_of(cf.cf_policy)->pi_needs_text &&
	        cf.cf_policy != POLICY_PREFIX_HASH &&
	        cf.cf_model_alias_n == 0 && !cf.cf_pd_disaggregation &&
	        !cf.cf_epd_disaggregation,
	    fe->fe_shm);

	if (cf.cf_tls_cert_path != NULL &&
	    (fe->fe_tls = tls_ctx_new_server(cf.cf_tls_cert_path,
	         cf.cf_tls_key_path)) == NULL)
		fatalx("%s: cannot load the TLS certificate", __func__);

	memset(&uc, 0, sizeof(uc));
	uc.uc_idle_timeout_secs = (double)cf.cf_upstream_pool_idle_timeout_secs;
	uc.uc_request_timeout_secs = (double)cf.cf_request_timeout_secs;
	uc.uc_connect_timeout_secs =
	    uc.uc_request_timeout_secs < FE_CONNECT_TIMEOUT
	    ? uc.uc_request_timeout_secs
	    : FE_CONNECT_TIMEOUT;
	for (i = 0; i < cf.cf_ca_cert_paths_n && i < 7; i++)
		uc.uc_ca_paths[i] = cf.cf_ca_cert_paths[i];
	uc.uc_client_cert_path = cf.cf_client_cert_path;
	uc.uc_client_key_path = cf.cf_client_key_path;
	uc.uc_max_idle_per_worker = FE_IDLE_PER_WORKER;
	if ((fe->fe_up = upstream_new(loop, &uc)) == NULL)
		fatalx("%s: cannot set up the upstream pools", __func__);

	if (cf.cf_broker != NULL)
		(void)snprintf(fe->fe_broker_url, sizeof(fe->fe_broker_url),
		    "%s", cf.cf_broker);
	else if (ipc_url(fe->fe_broker_url, sizeof(fe->fe_broker_url),
	             cf.cf_run_dir, IPC_BROKER_SOCK) == -1)
		fatalx("%s: run dir path too long", __func__);
	if (strncmp(fe->fe_broker_url, "tls+", 4) == 0) {
		const char *cas[2] = { cf.cf_broker_tls_ca, NULL };

		if ((fe->fe_broker_tls = tls_ctx_new_client(cas,
		         cf.cf_broker_tls_cert, cf.cf_broker_tls_key)) == NULL)
			fatalx("%s: cannot load the broker TLS files",
			    __func__);
		fe->fe_broker = ipc_client_new_tls(loop, fe->fe_broker_url,
		    fe->fe_broker_tls, FE_BROKER_INFLIGHT);
	} else
		fe->fe_broker = ipc_client_new(loop, fe->fe_broker_url,
		    IPC_CLIENT_REQ, FE_BROKER_INFLIGHT);
	if (fe->fe_broker == NULL)
		fatalx("%s: cannot create the broker client", __func__);
	decide_init();
	hostsync_init();

	conn_set_routes(&router_routes);
	/* One gateway per port (shared/portlock.h): never join another's. */
	if (portlock_query(cf.cf_host, cf.cf_port, cf.cf_run_dir, &owner) ==
	    PORTLOCK_OTHER) {
		log_error("%s: %s:%ld is already served by the smg-c gateway "
		          "of pid %ld (run dir %s); not starting",
		    __func__, cf.cf_host, cf.cf_port, owner.po_pid,
		    owner.po_run_dir);
		exit(2);
	}
	if (listener_open(cf.cf_host, cf.cf_port, LISTENER_MAIN) == -1)
		fatalx("%s: cannot listen on %s:%ld", __func__, cf.cf_host,
		    cf.cf_port);
	if (listener_open(cf.cf_prometheus_host, cf.cf_prometheus_port,
	        LISTENER_METRICS) == -1)
		fatalx("%s: cannot listen on %s:%ld", __func__,
		    cf.cf_prometheus_host, cf.cf_prometheus_port);
	if (cf.cf_health_check_port_set &&
	    listener_open(cf.cf_host, cf.cf_health_check_port,
	        LISTENER_HEALTH) == -1)
		fatalx("%s: cannot listen on %s:%ld", __func__, cf.cf_host,
		    cf.cf_health_check_port);

	ev_signal_init(&sig_term, frontend_sig_cb, SIGTERM);
	ev_signal_start(loop, &sig_term);
	ev_signal_init(&sig_int, frontend_sig_cb, SIGINT);
	ev_signal_start(loop, &sig_int);
	sighup_ignore(loop);
	ev_timer_init(&heartbeat_timer, frontend_heartbeat_cb, FE_HEARTBEAT,
	    FE_HEARTBEAT);
	ev_timer_start(loop, &heartbeat_timer);

	log_info("smg-frontend: serving %s://%s:%ld (slot %d), metrics on %ld, "
	         "broker %s",
	    fe->fe_tls != NULL ? "https" : "http", cf.cf_host, cf.cf_port,
	    fe->fe_row, cf.cf_prometheus_port, fe->fe_broker_url);
	if (fe->fe_row == 0 &&
	    (cf.cf_api_key == NULL || cf.cf_api_key[0] == '\0') &&
	    cf.cf_control_plane_api_keys_n == 0 &&
	    (cf.cf_jwt_issuer == NULL || cf.cf_jwt_issuer[0] == '\0'))
		log_warnx("smg-frontend: no --api-key, control-plane keys or "
		          "JWT: the control plane answers only on loopback");
	ev_run(loop, 0);

	ev_timer_stop(loop, &heartbeat_timer);
	ev_timer_stop(loop, &drain_timer);
	listener_close_all();
	admission_shutdown();
	auth_shutdown();
	hostsync_shutdown();
	decide_shutdown();
	trace_shutdown();
	ipc_client_free(fe->fe_broker);
	tls_ctx_free(fe->fe_broker_tls);
	upstream_free(fe->fe_up);
	shm_row_release(fe->fe_shm, fe->fe_row);
	shm_close(fe->fe_shm);
	tls_ctx_free(fe->fe_tls);
	log_info("%s: exiting", __func__);
	config_free(&cf);
	return 0;
}
