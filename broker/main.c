/*
 * main.c: smg-broker's entry point. Parses the shared command line, which
 * the broker reads as is (struct config), runs the loop until
 * SIGTERM/SIGINT and exits 0 after the store is flushed.
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

#include "broker.h"
#include "kvindex.h"

int
main(int argc, char *argv[])
{
	struct config cf;
	struct ev_loop *loop;
	struct broker *br;

	log_init("smg-broker", LOG_LEVEL_INFO);
	config_load_or_exit(&cf, argc, argv);
	(void)fdlimit_raise();
	log_setlevel(cf.cf_log_level);
	signal(SIGPIPE, SIG_IGN);
	if ((loop = ev_default_loop(EVFLAG_AUTO)) == NULL)
		fatalx("cannot initialise the event loop");
	/* One gateway per --host:--port (shared/portlock.h): under a
	 * supervisor the broker holds the claim; under the launcher the
	 * launcher does and the broker finds its own run dir there. */
	portlock_claim(loop, cf.cf_host, cf.cf_port, cf.cf_run_dir);
	logsetup_apply(loop, &cf);
	if ((br = server_new(loop, &cf, true)) == NULL)
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
	config_free(&cf);
	ev_loop_destroy(loop);
	return 0;
}
