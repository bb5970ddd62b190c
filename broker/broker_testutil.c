/*
 * broker_testutil.c: the fixture the broker's unit tests share (temp
 * dirs, broker settings, a broker without sockets and its teardown).
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
	struct btu_fx *f = calloc(1, sizeof(*f));

	if (f == NULL)
		return NULL;
	if (btu_dir_make(f->fx_dir, f->fx_run, f->fx_state, tag) == -1) {
		free(f);
		return NULL;
	}
	f->fx_bs.bs_state_dir = f->fx_state;
	f->fx_bs.bs_run_dir = f->fx_run;
	f->fx_bs.bs_policy = policy;
	f->fx_bs.bs_cb_success_threshold = 1;
	f->fx_bs.bs_cb_timeout_secs = 60;
	f->fx_bs.bs_disable_health_check = true; /* workers start Ready */
	f->fx_sw[0] = (struct broker_startup_worker) { "http://a:1", 0, -1 };
	f->fx_sw[1] = (struct broker_startup_worker) { "http://b:2", 0, -1 };
	f->fx_sw[2] = (struct broker_startup_worker) { "http://c:3", 0, -1 };
	f->fx_bs.bs_workers = f->fx_sw;
	f->fx_bs.bs_nworkers = 3;
	f->fx_loop = ev_default_loop(0);
	return f;
}

struct btu_fx *
btu_fx_flags_new(const char *tag, const char *policy)
{
	struct btu_fx *f = btu_fx_new(tag, policy);

	assert_non_null(f);
	f->fx_bs.bs_cb_failure_threshold = 5;
	f->fx_bs.bs_load_monitor_interval = 0; /* reports never age */
	f->fx_bs.bs_policy_flags = true;
	f->fx_bs.bs_cache_threshold = 0.5;
	f->fx_bs.bs_balance_abs_threshold = 2;
	f->fx_bs.bs_balance_rel_threshold = 1.5;
	f->fx_bs.bs_balance_token_usage_threshold = 1.0;
	f->fx_bs.bs_overload_token_usage_threshold = 1.0;
	f->fx_bs.bs_eviction_interval = 1;
	f->fx_bs.bs_max_tree_size = 1000;
	f->fx_bs.bs_block_size = 4;
	f->fx_bs.bs_cache_ttl_secs = 180;
	f->fx_bs.bs_max_idle_secs = 3600;
	f->fx_bs.bs_prefix_token_count = 256;
	f->fx_bs.bs_prefix_hash_load_factor = 1.25;
	f->fx_bs.bs_prefix_hash_abs_threshold = 10;
	f->fx_bounds[0] = 4;
	f->fx_bounds[1] = 8;
	return f;
}

struct broker *
btu_fx_start(struct btu_fx *f)
{
	f->fx_br = server_new(f->fx_loop, &f->fx_bs, false);
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
