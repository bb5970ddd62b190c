/*
 * route_bench.c: the broker's own cost of a cache_aware decision, through
 * route.c as a frontend's RouteRequest reaches it (availability filter,
 * policy, tree match and insert, write-behind journal, metrics), without
 * IPC. For 1, 16 and 64 KB prompts and 8 and 256 workers: p50/p99 µs per
 * decision and decisions/s. Traffic: 64 conversations, each request its
 * conversation's prefix plus a fresh suffix, as in a chat workload.
 * Write-behind flushes run between batches of 64 decisions, as the
 * broker's loop does, and are timed separately. Run by hand:
 *
 *     build-rel/route-bench [decisions per case]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shared/log.h"
#include "shared/shm.h"

#include "broker/broker.h"

#define BENCH_CONVS 64
#define BENCH_BATCH 64

static uint64_t bench_ns(void);
static int bench_cmp(const void *a, const void *b);
static void bench_case(unsigned nworkers, size_t prompt, unsigned n);

static uint64_t
bench_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static int
bench_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

static void
bench_case(unsigned nworkers, size_t prompt, unsigned n)
{
	static char *argv[] = { "route-bench", NULL };
	struct config cf, parsed;
	char **urls, err[256];
	struct broker *br;
	struct ev_loop *loop = ev_default_loop(0);
	char dir[64], run[128], state[128], cmd[160], msg[192];
	char **prefix, *text;
	uint64_t *lat, t0, t, flush_ns = 0, total = 0;
	unsigned i, flushes = 0;
	size_t k;

	snprintf(dir, sizeof(dir), "/tmp/smg-route-bench.XXXXXX");
	if (mkdtemp(dir) == NULL)
		fatal("mkdtemp");
	snprintf(run, sizeof(run), "%s/run", dir);
	snprintf(state, sizeof(state), "%s/state", dir);
	urls = calloc(nworkers, sizeof(*urls));
	for (i = 0; i < nworkers; i++) {
		urls[i] = malloc(64);
		snprintf(urls[i], 64, "http://10.0.%u.%u:8000", i / 250,
		    i % 250 + 1);
	}
	/* The command line's defaults, reports that never age. */
	if (config_parse(&parsed, 1, argv, err, sizeof(err)) != CONFIG_OK)
		fatalx("config_parse: %s", err);
	cf = parsed;
	cf.cf_state_dir = state;
	cf.cf_run_dir = run;
	cf.cf_policy = POLICY_CACHE_AWARE;
	cf.cf_cb_failure_threshold = 5;
	cf.cf_cb_success_threshold = 1;
	cf.cf_cb_timeout_duration_secs = 60;
	cf.cf_disable_health_check = true;
	cf.cf_load_monitor_interval = 0;
	cf.cf_port = 0;
	cf.cf_worker_urls = urls;
	cf.cf_worker_urls_n = nworkers;
	if ((br = server_new(loop, &cf, false)) == NULL)
		fatalx("server_new");

	prefix = calloc(BENCH_CONVS, sizeof(*prefix));
	for (i = 0; i < BENCH_CONVS; i++) {
		prefix[i] = malloc(prompt + 1);
		for (k = 0; k < prompt; k++)
			prefix[i][k] =
			    (char)('a' + (i * 7 + k * 13 + k / 5) % 26);
		prefix[i][0] = (char)('A' + i % 26);
		prefix[i][1] = (char)('A' + i / 26);
		prefix[i][prompt] = '\0';
	}
	text = malloc(prompt + 1);
	lat = calloc(n, sizeof(*lat));
	for (i = 0; i < n; i++) {
		Smg__RouteRequest rq = SMG__ROUTE_REQUEST__INIT;
		Smg__Decision d = SMG__DECISION__INIT;

		/* 7/8 of the prompt is the conversation, the rest new. */
		memcpy(text, prefix[i % BENCH_CONVS], prompt);
		snprintf(text + prompt - prompt / 8, prompt / 8 + 1, "%0*u",
		    (int)(prompt / 8), i);
		rq.id = i;
		rq.model = (char *)"";
		rq.text = text;
		rq.has_text = true;
		t0 = bench_ns();
		route_one(br, &rq, &d, msg, sizeof(msg));
		t = bench_ns();
		if (d.status != SMG__DECISION_STATUS__DECISION_OK)
			fatalx("decision failed: %s", d.error_message);
		lat[i] = t - t0;
		total += lat[i];
		if (i % BENCH_BATCH == BENCH_BATCH - 1 &&
		    store_pending(br->br_store)) {
			t0 = bench_ns();
			(void)store_flush(br->br_store);
			flush_ns += bench_ns() - t0;
			flushes++;
		}
	}
	qsort(lat, n, sizeof(*lat), bench_cmp);
	printf("%4u workers %3zu KB: p50 %7.2f us  p99 %7.2f us  "
	       "%8.0f decisions/s  flush %6.2f ms per %u decisions "
	       "(%u flushes)\n",
	    nworkers, prompt / 1024, lat[n / 2] / 1000.0,
	    lat[(size_t)n * 99 / 100] / 1000.0, n / (total / 1e9),
	    flushes ? flush_ns / 1e6 / flushes : 0.0, BENCH_BATCH, flushes);
	server_free(br);
	shm_unlink_segment(run);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		log_warnx("cannot remove %s", dir);
	for (i = 0; i < BENCH_CONVS; i++)
		free(prefix[i]);
	free(prefix);
	free(text);
	free(lat);
	for (i = 0; i < nworkers; i++)
		free(urls[i]);
	free(urls);
	config_free(&parsed);
}

int
main(int argc, char *argv[])
{
	static const size_t sizes[] = { 1024, 16384, 65536 };
	static const unsigned workers[] = { 8, 256 };
	unsigned n = argc > 1 ? (unsigned)atoi(argv[1]) : 20000, i, j;

	log_init("route-bench", LOG_LEVEL_WARN);
	if (n < 100)
		n = 100;
	for (i = 0; i < 2; i++)
		for (j = 0; j < 3; j++)
			bench_case(workers[i], sizes[j], n);
	return 0;
}
