/*
 * broker_testutil.c: the fixture the broker's unit tests share (temp
 * dirs, the command line's struct config, a broker without sockets and
 * its teardown).
 */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shared/metrics.h"
#include "shared/shm.h"

#include "broker/broker_testutil.h"

static int rm_cb(const char *path, const struct stat *sb, int flag,
    struct FTW *ftw);

static int
rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path);
}

int
btu_dir_make(char *dir, char *run, char *state, const char *tag)
{
	snprintf(dir, BTU_DIR_SIZE, "/tmp/smg-%s-test.XXXXXX", tag);
	if (mkdtemp(dir) == NULL)
		return -1;
	snprintf(run, BTU_PATH_SIZE, "%s/run", dir);
	snprintf(state, BTU_PATH_SIZE, "%s/state", dir);
	return 0;
}

void
btu_dir_remove(const char *dir, const char *run)
{
	shm_unlink_segment(run);
	nftw(dir, rm_cb, 8, FTW_DEPTH | FTW_PHYS);
}

struct btu_fx *
btu_fx_new(const char *tag, const char *policy)
{
	static char *argv[] = { "broker_test", NULL };
	struct btu_fx *f = calloc(1, sizeof(*f));
	char err[256];

	if (f == NULL)
		return NULL;
	if (btu_dir_make(f->fx_dir, f->fx_run, f->fx_state, tag) == -1) {
		free(f);
		return NULL;
	}
	/* The command line's defaults, then what the tests change. */
	if (config_parse(&f->fx_cf_parsed, 1, argv, err, sizeof(err)) !=
	    CONFIG_OK)
		fail_msg("config_parse: %s", err);
	f->fx_cf = f->fx_cf_parsed;
	f->fx_cf.cf_state_dir = f->fx_state;
	f->fx_cf.cf_run_dir = f->fx_run;
	if (policy_info_parse(policy, &f->fx_cf.cf_policy) == -1)
		fail_msg("unknown policy %s", policy);
	f->fx_cf.cf_cb_failure_threshold = 0;
	f->fx_cf.cf_cb_success_threshold = 1;
	f->fx_cf.cf_cb_timeout_duration_secs = 60;
	f->fx_cf.cf_health_failure_threshold = 0;
	f->fx_cf.cf_health_success_threshold = 0;
	f->fx_cf.cf_disable_health_check = true; /* workers start Ready */
	f->fx_cf.cf_drain_settle_secs = 0;
	f->fx_cf.cf_load_monitor_interval = 0;
	f->fx_cf.cf_port = 0; /* no self check of worker URLs */
	f->fx_urls[0] = "http://a:1";
	f->fx_urls[1] = "http://b:2";
	f->fx_urls[2] = "http://c:3";
	f->fx_cf.cf_worker_urls = f->fx_urls;
	f->fx_cf.cf_worker_urls_n = 3;
	f->fx_loop = ev_default_loop(0);
	return f;
}

struct btu_fx *
btu_fx_flags_new(const char *tag, const char *policy)
{
	struct btu_fx *f = btu_fx_new(tag, policy);

	assert_non_null(f);
	f->fx_cf.cf_cb_failure_threshold = 5;
	f->fx_cf.cf_load_monitor_interval = 0; /* reports never age */
	f->fx_cf.cf_cache_threshold = 0.5;
	f->fx_cf.cf_balance_abs_threshold = 2;
	f->fx_cf.cf_balance_rel_threshold = 1.5;
	f->fx_cf.cf_balance_token_usage_threshold = 1.0;
	f->fx_cf.cf_overload_token_usage_threshold = 1.0;
	f->fx_cf.cf_eviction_interval = 1;
	f->fx_cf.cf_max_tree_size = 1000;
	f->fx_cf.cf_block_size = 4;
	f->fx_cf.cf_cache_ttl_secs = 180;
	f->fx_cf.cf_max_idle_secs = 3600;
	f->fx_cf.cf_prefix_token_count = 256;
	f->fx_cf.cf_prefix_hash_load_factor = 1.25;
	f->fx_cf.cf_prefix_hash_balance_abs_threshold = 10;
	f->fx_bounds[0] = 4;
	f->fx_bounds[1] = 8;
	return f;
}

struct broker *
btu_fx_start(struct btu_fx *f)
{
	f->fx_br = server_new(f->fx_loop, &f->fx_cf, false);
	assert_non_null(f->fx_br);
	return f->fx_br;
}

void
btu_fx_start_order(struct btu_fx *f)
{
	unsigned i;

	btu_fx_start(f);
	assert_int_equal(f->fx_br->br_nworkers, 3);
	for (i = 0; i < 3; i++)
		f->fx_c[i] = f->fx_br->br_order[i];
}

void
btu_fx_free(struct btu_fx *f)
{
	server_free(f->fx_br);
	btu_dir_remove(f->fx_dir, f->fx_run);
	config_free(&f->fx_cf_parsed);
	free(f);
}

void
btu_load(struct btu_fx *f, unsigned i, unsigned n)
{
	while (n-- > 0)
		shm_inflight_inc(f->fx_br->br_shm, 0, f->fx_c[i]->wk_slot);
}

long
btu_branch(struct btu_fx *f, const char *family, const char *b)
{
	char *out = NULL, pat[160], *p;
	size_t len;
	long v = 0;

	assert_int_equal(metrics_render(f->fx_br->br_shm, &out, &len), 0);
	snprintf(pat, sizeof(pat), "%s{branch=\"%s\"} ", family, b);
	if ((p = strstr(out, pat)) != NULL)
		v = strtol(p + strlen(pat), NULL, 10);
	free(out);
	return v;
}
