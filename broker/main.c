/*
 * main.c: smg-broker's entry point. Parses the shared command line, turns
 * it into broker settings, runs the loop until SIGTERM/SIGINT and exits 0
 * after the store is flushed.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include <ev.h>

#include "shared/config.h"
#include "shared/fdlimit.h"
#include "shared/log.h"
#include "shared/logsetup.h"
#include "shared/portlock.h"
#include "shared/sighup.h"
#include "shared/urlallow.h"
#include "shared/xmalloc.h"

#include "broker.h"
#include "kvindex.h"

static int broker_mode_of_urls(const struct config *cf);
static void broker_settings_fill(struct broker_settings *bs,
    const struct config *cf, struct broker_startup_worker **ws);

/* gateway.md §1: the first ipc:// or grpc:// worker URL sets the mode. */
static int
broker_mode_of_urls(const struct config *cf)
{
	size_t i;

	for (i = 0; i < cf->cf_worker_urls_n; i++) {
		if (strncmp(cf->cf_worker_urls[i], "grpc", 4) == 0)
			return SMG__CONNECTION_MODE__CONNECTION_MODE_GRPC;
		if (strncmp(cf->cf_worker_urls[i], "ipc://", 6) == 0)
			return SMG__CONNECTION_MODE__CONNECTION_MODE_ZMQ;
	}
	return SMG__CONNECTION_MODE__CONNECTION_MODE_HTTP;
}

static void
broker_settings_fill(struct broker_settings *bs, const struct config *cf,
    struct broker_startup_worker **wsp)
{
	struct broker_startup_worker *ws;
	struct urlallow_cidr *allow;
	size_t i, n = 0, total;

	memset(bs, 0, sizeof(*bs));
	bs->bs_state_dir = cf->cf_state_dir;
	bs->bs_run_dir = cf->cf_run_dir;
	bs->bs_listen = cf->cf_broker_listen;
	bs->bs_nlisten = cf->cf_broker_listen_n;
	bs->bs_tls_cert = cf->cf_broker_tls_cert;
	bs->bs_tls_key = cf->cf_broker_tls_key;
	bs->bs_tls_ca = cf->cf_broker_tls_ca;
	bs->bs_policy = policy_kind_name(cf->cf_policy);
	bs->bs_pd = cf->cf_pd_disaggregation || cf->cf_epd_disaggregation;
	if (bs->bs_pd) {
		bs->bs_prefill_policy = policy_kind_name(cf->cf_prefill_policy);
		bs->bs_decode_policy = policy_kind_name(cf->cf_decode_policy);
	}
	if (cf->cf_epd_disaggregation)
		bs->bs_encode_policy = policy_kind_name(cf->cf_encode_policy);
	bs->bs_mode = broker_mode_of_urls(cf);
	bs->bs_cb_failure_threshold = (uint32_t)cf->cf_cb_failure_threshold;
	bs->bs_cb_success_threshold = (uint32_t)cf->cf_cb_success_threshold;
	bs->bs_cb_timeout_secs = (uint32_t)cf->cf_cb_timeout_duration_secs;
	bs->bs_disable_circuit_breaker = cf->cf_disable_circuit_breaker;
	bs->bs_health_failure_threshold =
	    (uint32_t)cf->cf_health_failure_threshold;
	bs->bs_health_success_threshold =
	    (uint32_t)cf->cf_health_success_threshold;
	bs->bs_disable_health_check = cf->cf_disable_health_check;
	bs->bs_remove_unhealthy = cf->cf_remove_unhealthy_workers;
	bs->bs_drain_settle_secs = (double)cf->cf_drain_settle_secs;
	bs->bs_load_monitor_interval = (uint32_t)cf->cf_load_monitor_interval;
	if (cf->cf_worker_overload_waiting_requests_set)
		bs->bs_overload_waiting =
		    cf->cf_worker_overload_waiting_requests;
	if (cf->cf_worker_overload_token_usage_set)
		bs->bs_overload_token_usage =
		    cf->cf_worker_overload_token_usage;
	else if (cf->cf_worker_overload_protection)
		bs->bs_overload_token_usage = 0.9;
	bs->bs_api_key = cf->cf_api_key;
	bs->bs_self_host = cf->cf_host;
	bs->bs_self_port = cf->cf_port;
	if (cf->cf_worker_allow_cidr_n > 0) {
		allow = xcalloc(cf->cf_worker_allow_cidr_n, sizeof(*allow));
		for (i = 0; i < cf->cf_worker_allow_cidr_n; i++)
			if (urlallow_cidr_parse(cf->cf_worker_allow_cidr[i],
			        &allow[i]) == -1)
				fatalx("bad --worker-allow-cidr %s",
				    cf->cf_worker_allow_cidr[i]);
		bs->bs_allow = allow;
		bs->bs_nallow = cf->cf_worker_allow_cidr_n;
	}
	bs->bs_ll_kv_pressure_weight = cf->cf_least_load_kv_pressure_weight;
	bs->bs_ll_default_throughput = cf->cf_least_load_default_throughput;
	bs->bs_ll_mean_prefill_tokens =
	    (uint32_t)cf->cf_least_load_mean_prefill_tokens;
	bs->bs_ll_max_waiting_requests =
	    (uint32_t)cf->cf_least_load_max_waiting_requests;
	bs->bs_policy_flags = true;
	bs->bs_cache_threshold = cf->cf_cache_threshold;
	bs->bs_balance_abs_threshold = (uint32_t)cf->cf_balance_abs_threshold;
	bs->bs_balance_rel_threshold = cf->cf_balance_rel_threshold;
	bs->bs_balance_token_usage_threshold =
	    cf->cf_balance_token_usage_threshold;
	bs->bs_overload_token_usage_threshold =
	    cf->cf_overload_token_usage_threshold;
	bs->bs_overlap_decay = cf->cf_overlap_decay;
	bs->bs_selection_temperature = cf->cf_selection_temperature;
	bs->bs_eviction_interval = (uint32_t)cf->cf_eviction_interval;
	bs->bs_max_tree_size = cf->cf_max_tree_size;
	bs->bs_block_size = (uint32_t)cf->cf_block_size;
	bs->bs_cache_boundaries = cf->cf_cache_boundaries;
	bs->bs_cache_boundaries_n = cf->cf_cache_boundaries_n;
	bs->bs_cache_index_hash = cf->cf_cache_index == CACHE_INDEX_HASH;
	bs->bs_cache_ttl_secs = (uint32_t)cf->cf_cache_ttl_secs;
	bs->bs_max_idle_secs = (uint32_t)cf->cf_max_idle_secs;
	bs->bs_assignment_mode = (int)cf->cf_assignment_mode;
	bs->bs_assignment_mode_set = cf->cf_assignment_mode_set;
	bs->bs_prefix_token_count = (uint32_t)cf->cf_prefix_token_count;
	bs->bs_prefix_hash_load_factor = cf->cf_prefix_hash_load_factor;
	bs->bs_prefix_hash_abs_threshold =
	    (uint32_t)cf->cf_prefix_hash_balance_abs_threshold;
	bs->bs_routing_key_override = cf->cf_routing_key_override;

	total = cf->cf_worker_urls_n + cf->cf_prefill_n + cf->cf_decode_n +
	    cf->cf_encode_n;
	ws = xcalloc(total ? total : 1, sizeof(*ws));
	for (i = 0; i < cf->cf_worker_urls_n && !bs->bs_pd; i++, n++) {
		ws[n].sw_url = cf->cf_worker_urls[i];
		ws[n].sw_type = SMG__WORKER_TYPE__WORKER_TYPE_REGULAR;
		ws[n].sw_bootstrap_port = -1;
	}
	for (i = 0; i < cf->cf_prefill_n; i++, n++) {
		ws[n].sw_url = cf->cf_prefill[i].ce_url;
		ws[n].sw_type = SMG__WORKER_TYPE__WORKER_TYPE_PREFILL;
		ws[n].sw_bootstrap_port = cf->cf_prefill[i].ce_bootstrap_port;
	}
	for (i = 0; i < cf->cf_decode_n; i++, n++) {
		ws[n].sw_url = cf->cf_decode[i];
		ws[n].sw_type = SMG__WORKER_TYPE__WORKER_TYPE_DECODE;
		ws[n].sw_bootstrap_port = -1;
	}
	for (i = 0; i < cf->cf_encode_n; i++, n++) {
		ws[n].sw_url = cf->cf_encode[i].ce_url;
		ws[n].sw_type = SMG__WORKER_TYPE__WORKER_TYPE_ENCODE;
		ws[n].sw_bootstrap_port = cf->cf_encode[i].ce_bootstrap_port;
	}
	bs->bs_workers = ws;
	bs->bs_nworkers = n;
	*wsp = ws;
}

/*
 * One gateway per --host:--port (shared/portlock.h). Under a supervisor
 * the broker holds the claim; under the launcher the launcher does and
 * the broker finds it held by its own run dir.
 */
static void
broker_claim_port(struct ev_loop *loop, const struct config *cf)
{
	struct portlock_owner o;

	switch (
	    portlock_take(loop, cf->cf_host, cf->cf_port, cf->cf_run_dir, &o)) {
	case PORTLOCK_TAKEN:
	case PORTLOCK_SAME:
	case PORTLOCK_FREE:
		return;
	case PORTLOCK_OTHER:
		log_error(
		    "%s: %s:%ld is already served by the smg-c gateway of "
		    "pid %ld (run dir %s); not starting",
		    __func__, cf->cf_host, cf->cf_port, o.po_pid, o.po_run_dir);
		exit(2);
	case PORTLOCK_ERROR:
		break;
	}
	fatal("%s: cannot claim %s:%ld", __func__, cf->cf_host, cf->cf_port);
}

int
main(int argc, char *argv[])
{
	struct broker_startup_worker *ws = NULL;
	struct broker_settings bs;
	struct config cf;
	struct ev_loop *loop;
	struct broker *br;

	log_init("smg-broker", LOG_LEVEL_INFO);
	config_load_or_exit(&cf, argc, argv);
	(void)fdlimit_raise();
	log_setlevel(cf.cf_log_level);
	signal(SIGPIPE, SIG_IGN);
	broker_settings_fill(&bs, &cf, &ws);
	if ((loop = ev_default_loop(EVFLAG_AUTO)) == NULL)
		fatalx("cannot initialise the event loop");
	broker_claim_port(loop, &cf);
	logsetup_apply(loop, &cf);
	if ((br = server_new(loop, &bs, true)) == NULL)
		fatalx("startup failed");
	sighup_ignore(loop);
	kvindex_broker_bounds(br,
	    cf.cf_kv_indexer_ttl_secs_set ? (uint64_t)cf.cf_kv_indexer_ttl_secs
	                                  : 0,
	    cf.cf_kv_indexer_max_entries_set
	        ? (uint64_t)cf.cf_kv_indexer_max_entries
	        : 0);
	ev_run(loop, 0);
	server_free(br);
	portlock_release(loop);
	log_info("smg-broker: stopped");
	free(ws);
	free((void *)bs.bs_allow);
	config_free(&cf);
	ev_loop_destroy(loop);
	return 0;
}
