/*
 * broker_testutil.h: the fixture the broker's unit tests share: a temp
 * directory with run/ and state/ under it, a broker with three startup
 * workers built by server_new without sockets, and its teardown.
 */
#ifndef BROKER_BROKER_TESTUTIL_H
#define BROKER_BROKER_TESTUTIL_H

#include <stdint.h>

#include "broker/broker.h"

#define BTU_DIR_SIZE  64
#define BTU_PATH_SIZE 128

struct btu_fx {
	char fx_dir[BTU_DIR_SIZE];
	char fx_run[BTU_PATH_SIZE];
	char fx_state[BTU_PATH_SIZE];
	struct config fx_cf; /* what server_new reads; tests change it */
	struct config fx_cf_parsed; /* as parsed: what config_free frees */
	char *fx_urls[4]; /* --worker-urls of fx_cf */
	uint32_t fx_bounds[2];
	struct ev_loop *fx_loop;
	struct broker *fx_br;
	struct worker *fx_c[3]; /* br_order after btu_fx_start_order */
};

/*
 * Makes /tmp/smg-<tag>-test.XXXXXX into dir (BTU_DIR_SIZE) and writes
 * <dir>/run and <dir>/state into run and state (BTU_PATH_SIZE each).
 */
int btu_dir_make(char *dir, char *run, char *state, const char *tag);
/* Unlinks the shm segment of run and removes dir with all it holds. */
void btu_dir_remove(const char *dir, const char *run);

/*
 * A fixture in a fresh temp dir: the command line's defaults with policy,
 * workers http://a:1, http://b:2, http://c:3 (cf_worker_urls_n 3),
 * breaker success threshold 1 and timeout 60s, health and breaker failure
 * thresholds 0, health checks off, reports that never age, no drain
 * delay, the default loop. No broker yet. NULL on failure.
 */
struct btu_fx *btu_fx_new(const char *tag, const char *policy);
/*
 * btu_fx_new plus what the policy tests share: breaker failure threshold
 * 5, reports that never age and the policy flags at fixed values.
 */
struct btu_fx *btu_fx_flags_new(const char *tag, const char *policy);
/* server_new on fx_cf; asserts it succeeds. */
struct broker *btu_fx_start(struct btu_fx *f);
/* btu_fx_start, asserts three workers and records them in fx_c. */
void btu_fx_start_order(struct btu_fx *f);
/* Frees the broker (if any), the shm segment, the temp dir and f. */
void btu_fx_free(struct btu_fx *f);
/* Counts n requests in flight on fx_c[i] in shm. */
void btu_load(struct btu_fx *f, unsigned i, unsigned n);
/* Value of family{branch="b"} in the metrics text, 0 when absent. */
long btu_branch(struct btu_fx *f, const char *family, const char *b);

#endif
