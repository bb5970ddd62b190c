/* metrics_test.c: series registration, sums over rows, rendering. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "shared/log.h"
#include "shared/metrics.h"
#include "shared/shm.h"

#define TEST_NAMES 300

struct fixture {
	char fx_dir[64];
	struct shm *fx_shm;
};

static int
setup(void **state)
{
	struct fixture *fx;

	fx = calloc(1, sizeof(*fx));
	assert_non_null(fx);
	snprintf(fx->fx_dir, sizeof(fx->fx_dir), "/tmp/metrics_test.XXXXXX");
	assert_non_null(mkdtemp(fx->fx_dir));
	fx->fx_shm = shm_open_segment(fx->fx_dir);
	assert_non_null(fx->fx_shm);
	*state = fx;
	return 0;
}

static int
teardown(void **state)
{
	struct fixture *fx = *state;

	shm_close(fx->fx_shm);
	shm_unlink_segment(fx->fx_dir);
	rmdir(fx->fx_dir);
	free(fx);
	return 0;
}

static char *
render(struct shm *shm)
{
	char *out;
	size_t len;

	assert_int_equal(metrics_render(shm, &out, &len), 0);
	assert_non_null(out);
	assert_int_equal(strlen(out), len);
	return out;
}

/* A retired series leaves the output; registering it again revives it. */
static void
test_retire(void **state)
{
	struct fixture *fx = *state;
	char *out;
	int g, h;

	g = metrics_series(fx->fx_shm, METRICS_GAUGE, "smg_g", "model=\"u\"");
	h = metrics_series(fx->fx_shm, METRICS_GAUGE, "smg_g", "model=\"m\"");
	assert_true(g >= 0 && h >= 0);
	metrics_set(fx->fx_shm, 0, g, 7);
	metrics_set(fx->fx_shm, 1, g, 5);
	metrics_set(fx->fx_shm, 0, h, 3);
	metrics_retire(fx->fx_shm, g);
	out = render(fx->fx_shm);
	assert_null(strstr(out, "model=\"u\""));
	assert_non_null(strstr(out, "smg_g{model=\"m\"} 3"));
	free(out);
	/* Same name again: same index, starting from zero. */
	assert_int_equal(
	    metrics_series(fx->fx_shm, METRICS_GAUGE, "smg_g", "model=\"u\""),
	    g);
	out = render(fx->fx_shm);
	assert_non_null(strstr(out, "smg_g{model=\"u\"} 0"));
	free(out);
	metrics_retire(fx->fx_shm, -1);
	metrics_retire(fx->fx_shm, 1 << 20);
}

static void
test_counters_summed(void **state)
{
	struct fixture *fx = *state;
	char labels[128], *out;
	int a, b, g;

	assert_int_equal(metrics_labels(labels, sizeof(labels), "worker",
	                     "http://w1:8000", "status", "200", NULL),
	    0);
	assert_string_equal(labels, "worker=\"http://w1:8000\",status=\"200\"");
	a = metrics_series(fx->fx_shm, METRICS_COUNTER, "smg_x_total", labels);
	assert_true(a >= 0);
	assert_int_equal(
	    metrics_series(fx->fx_shm, METRICS_COUNTER, "smg_x_total", labels),
	    a);
	b = metrics_series(fx->fx_shm, METRICS_COUNTER, "smg_x_total",
	    "worker=\"http://w0:8000\",status=\"200\"");
	assert_true(b >= 0 && b != a);
	g = metrics_series(fx->fx_shm, METRICS_GAUGE, "smg_a_gauge", NULL);
	assert_true(g >= 0);
	/* Same name, another kind: refused. */
	assert_int_equal(
	    metrics_series(fx->fx_shm, METRICS_GAUGE, "smg_x_total", labels),
	    -1);

	metrics_add(fx->fx_shm, 0, a, 3);
	metrics_add(fx->fx_shm, 5, a, 4);
	metrics_add(fx->fx_shm, SHM_ROW_BROKER, b, 1);
	metrics_set(fx->fx_shm, SHM_ROW_BROKER, g, 7);
	metrics_set(fx->fx_shm, SHM_ROW_BROKER, g, 6);
	metrics_set(fx->fx_shm, 2, g, -2);
	/* Out of range: ignored. */
	metrics_add(fx->fx_shm, SHM_ROWS, a, 100);
	metrics_add(fx->fx_shm, 0, -1, 100);
	metrics_add(fx->fx_shm, 0, SHM_MAX_SERIES, 100);

	out = render(fx->fx_shm);
	assert_string_equal(out,
	    "# HELP smg_a_gauge smg-c: a gauge\n"
	    "# TYPE smg_a_gauge gauge\n"
	    "smg_a_gauge 4\n"
	    "# HELP smg_x_total smg-c: x total\n"
	    "# TYPE smg_x_total counter\n"
	    "smg_x_total{worker=\"http://w0:8000\",status=\"200\"} 1\n"
	    "smg_x_total{worker=\"http://w1:8000\",status=\"200\"} 7\n");
	free(out);
}

static void
test_float_gauge(void **state)
{
	struct fixture *fx = *state;
	char *out;
	int g;

	g = metrics_series(fx->fx_shm, METRICS_GAUGE_FLOAT, "smg_ratio", NULL);
	assert_true(g >= 0);
	metrics_set_float(fx->fx_shm, SHM_ROW_POLLER, g, 0.123456);
	out = render(fx->fx_shm);
	assert_string_equal(out,
	    "# HELP smg_ratio smg-c: ratio\n"
	    "# TYPE smg_ratio gauge\nsmg_ratio 0.123456\n");
	free(out);
}

static void
test_names_validated(void **state)
{
	struct fixture *fx = *state;
	char big[400];

	assert_int_equal(
	    metrics_series(fx->fx_shm, METRICS_COUNTER, "9bad", NULL), -1);
	assert_int_equal(
	    metrics_series(fx->fx_shm, METRICS_COUNTER, "bad-name", NULL), -1);
	assert_int_equal(metrics_series(fx->fx_shm, METRICS_COUNTER, "", NULL),
	    -1);
	assert_int_equal(
	    metrics_series(fx->fx_shm, METRICS_COUNTER, NULL, NULL), -1);
	assert_true(
	    metrics_series(fx->fx_shm, METRICS_COUNTER, "ok:name_1", "") >= 0);
	/* Labels: unescaped quote, missing quotes, bad name, raw newline. */
	assert_int_equal(
	    metrics_series(fx->fx_shm, METRICS_COUNTER, "m", "a=\"x\"y\""), -1);
	assert_int_equal(
	    metrics_series(fx->fx_shm, METRICS_COUNTER, "m", "a=x"), -1);
	assert_int_equal(
	    metrics_series(fx->fx_shm, METRICS_COUNTER, "m", "1a=\"x\""), -1);
	assert_int_equal(
	    metrics_series(fx->fx_shm, METRICS_COUNTER, "m", "a=\"x\ny\""), -1);
	assert_int_equal(
	    metrics_series(fx->fx_shm, METRICS_COUNTER, "m", "a=\"x\","), -1);
	assert_int_equal(
	    metrics_series(fx->fx_shm, METRICS_COUNTER, "m", "a=\"x\\q\""), -1);
	assert_true(metrics_series(fx->fx_shm, METRICS_COUNTER, "m",
	                "a=\"x\\\"y\",b=\"\"") >= 0);
	assert_int_equal(
	    metrics_series(fx->fx_shm, (enum metrics_kind)7, "m", NULL), -1);
	/* Too long for a series name. */
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	assert_int_equal(metrics_series(fx->fx_shm, METRICS_COUNTER, big, NULL),
	    -1);
}

static void
test_escaping(void **state)
{
	struct fixture *fx = *state;
	char labels[64], small[12], *out;
	int s;

	assert_int_equal(metrics_labels(labels, sizeof(labels), "model",
	                     "a\"b\\c\nd", "empty", NULL, NULL),
	    0);
	assert_string_equal(labels, "model=\"a\\\"b\\\\c\\nd\",empty=\"\"");
	s = metrics_series(fx->fx_shm, METRICS_COUNTER, "smg_e_total", labels);
	assert_true(s >= 0);
	metrics_add(fx->fx_shm, 1, s, 2);
	out = render(fx->fx_shm);
	assert_string_equal(out,
	    "# HELP smg_e_total smg-c: e total\n"
	    "# TYPE smg_e_total counter\n"
	    "smg_e_total{model=\"a\\\"b\\\\c\\nd\",empty=\"\"} 2\n");
	free(out);

	assert_int_equal(metrics_labels(labels, sizeof(labels), NULL), 0);
	assert_string_equal(labels, "");
	assert_int_equal(
	    metrics_labels(labels, sizeof(labels), "bad-key", "v", NULL), -1);
	assert_int_equal(
	    metrics_labels(small, sizeof(small), "k", "0123456789", NULL), -1);
	assert_string_equal(small, "");
	assert_int_equal(
	    metrics_labels(small, sizeof(small), "k", "0123456", NULL), 0);
	assert_string_equal(small, "k=\"0123456\"");
}

static void
test_histogram(void **state)
{
	struct fixture *fx = *state;
	struct metrics_histogram h, h2, hd;
	const double bounds[] = { 0.1, 0.5, 2.5 };
	const double bad[] = { 0.5, 0.1 };
	char *out;

	assert_int_equal(metrics_histogram_init(fx->fx_shm, &h,
	                     "smg_lat_seconds", "endpoint=\"chat\"", bounds, 3),
	    0);
	assert_int_equal(h.mh_nbuckets, 3);
	/* Same histogram again (another process): same series. */
	assert_int_equal(metrics_histogram_init(fx->fx_shm, &h2,
	                     "smg_lat_seconds", "endpoint=\"chat\"", bounds, 3),
	    0);
	assert_int_equal(h2.mh_buckets[1], h.mh_buckets[1]);
	assert_int_equal(h2.mh_sum, h.mh_sum);
	assert_int_equal(h2.mh_count, h.mh_count);

	metrics_observe(fx->fx_shm, 0, &h, 0.05); /* le 0.1 */
	metrics_observe(fx->fx_shm, 1, &h, 0.1); /* le 0.1 (bound incl.) */
	metrics_observe(fx->fx_shm, 1, &h, 0.3); /* le 0.5 */
	metrics_observe(fx->fx_shm, 2, &h2, 100); /* only +Inf */
	metrics_observe(fx->fx_shm, 2, &h2, -1); /* counts as 0 */

	out = render(fx->fx_shm);
	assert_string_equal(out,
	    "# HELP smg_lat_seconds smg-c: lat seconds\n"
	    "# TYPE smg_lat_seconds histogram\n"
	    "smg_lat_seconds_bucket{endpoint=\"chat\",le=\"0.1\"} 3\n"
	    "smg_lat_seconds_bucket{endpoint=\"chat\",le=\"0.5\"} 4\n"
	    "smg_lat_seconds_bucket{endpoint=\"chat\",le=\"2.5\"} 4\n"
	    "smg_lat_seconds_bucket{endpoint=\"chat\",le=\"+Inf\"} 5\n"
	    "smg_lat_seconds_sum{endpoint=\"chat\"} 100.450000\n"
	    "smg_lat_seconds_count{endpoint=\"chat\"} 5\n");
	free(out);

	/* Defaults: 16 bounds, 0.001 .. 300, sorted numerically on render. */
	assert_int_equal(metrics_histogram_init(fx->fx_shm, &hd,
	                     "smg_d_seconds", NULL, NULL, 0),
	    0);
	assert_int_equal(hd.mh_nbuckets, 16);
	assert_true(hd.mh_bounds[0] == 0.001);
	assert_true(hd.mh_bounds[15] == 300);
	metrics_observe(fx->fx_shm, 3, &hd, 0.0123);
	out = render(fx->fx_shm);
	assert_non_null(strstr(out,
	    "# HELP smg_d_seconds smg-c: d seconds\n"
	    "# TYPE smg_d_seconds histogram\n"
	    "smg_d_seconds_bucket{le=\"0.001\"} 0\n"
	    "smg_d_seconds_bucket{le=\"0.005\"} 0\n"
	    "smg_d_seconds_bucket{le=\"0.01\"} 0\n"
	    "smg_d_seconds_bucket{le=\"0.025\"} 1\n"
	    "smg_d_seconds_bucket{le=\"0.05\"} 1\n"));
	assert_non_null(strstr(out,
	    "smg_d_seconds_bucket{le=\"120\"} 1\n"
	    "smg_d_seconds_bucket{le=\"300\"} 1\n"
	    "smg_d_seconds_bucket{le=\"+Inf\"} 1\n"
	    "smg_d_seconds_sum 0.012300\n"
	    "smg_d_seconds_count 1\n"));
	/* Families in name order: smg_d_ before smg_lat_. */
	assert_true(
	    strstr(out, "smg_d_seconds") < strstr(out, "smg_lat_seconds"));
	free(out);

	assert_int_equal(metrics_histogram_init(fx->fx_shm, &hd,
	                     "smg_b_seconds", NULL, bad, 2),
	    -1);
	assert_int_equal(metrics_histogram_init(fx->fx_shm, &hd,
	                     "smg_b_seconds", NULL, bounds,
	                     METRICS_MAX_BUCKETS + 1),
	    -1);
	/* A failed init leaves a histogram that observes nothing. */
	metrics_observe(fx->fx_shm, 0, &hd, 1.0);
}

/* Two processes register the same names at once: one index per name. */
static void
test_same_series_two_processes(void **state)
{
	struct fixture *fx = *state;
	int mine[TEST_NAMES], theirs[TEST_NAMES];
	int fds[2], gate[2], i, j, status;
	char fam[32];
	size_t got;
	ssize_t r;
	pid_t pid;
	char go;

	assert_int_equal(pipe(fds), 0);
	assert_int_equal(pipe(gate), 0);
	pid = fork();
	assert_true(pid != -1);
	if (pid == 0) {
		struct shm *shm;

		close(fds[0]);
		close(gate[1]);
		if ((shm = shm_open_segment(fx->fx_dir)) == NULL)
			_exit(1);
		if (read(gate[0], &go, 1) != 0)
			_exit(2);
		/* Reverse order from the parent. */
		for (i = TEST_NAMES - 1; i >= 0; i--) {
			snprintf(fam, sizeof(fam), "smg_n%d_total", i);
			theirs[i] =
			    metrics_series(shm, METRICS_COUNTER, fam, NULL);
			metrics_add(shm, 1, theirs[i], 1);
		}
		if (write(fds[1], theirs, sizeof(theirs)) !=
		    (ssize_t)sizeof(theirs))
			_exit(3);
		_exit(0);
	}
	close(fds[1]);
	close(gate[0]);
	close(gate[1]);
	for (i = 0; i < TEST_NAMES; i++) {
		snprintf(fam, sizeof(fam), "smg_n%d_total", i);
		mine[i] =
		    metrics_series(fx->fx_shm, METRICS_COUNTER, fam, NULL);
		assert_true(mine[i] >= 0);
		metrics_add(fx->fx_shm, 0, mine[i], 1);
	}
	for (got = 0; got < sizeof(theirs); got += (size_t)r) {
		r = read(fds[0], (char *)theirs + got, sizeof(theirs) - got);
		assert_true(r > 0);
	}
	close(fds[0]);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	for (i = 0; i < TEST_NAMES; i++) {
		assert_int_equal(theirs[i], mine[i]);
		for (j = i + 1; j < TEST_NAMES; j++)
			assert_int_not_equal(mine[i], mine[j]);
	}
	assert_int_equal(atomic_load(&shm_segment(fx->fx_shm)->sh_series_count),
	    TEST_NAMES);
	/* Each series: 1 from each process. */
	for (i = 0; i < TEST_NAMES; i++)
		assert_int_equal(
		    atomic_load(
		        &shm_segment(fx->fx_shm)->sh_values[0][mine[i]]) +
		        atomic_load(
		            &shm_segment(fx->fx_shm)->sh_values[1][mine[i]]),
		    2);
}

/* A counter survives the restart of the process that incremented it. */
static void
test_survives_reattach(void **state)
{
	struct fixture *fx = *state;
	struct shm *again;
	char *out;
	int s;

	s = metrics_series(fx->fx_shm, METRICS_COUNTER, "smg_r_total", NULL);
	metrics_add(fx->fx_shm, 0, s, 5);
	again = shm_open_segment(fx->fx_dir);
	assert_non_null(again);
	assert_int_equal(
	    metrics_series(again, METRICS_COUNTER, "smg_r_total", NULL), s);
	metrics_add(again, 0, s, 1);
	out = render(again);
	assert_string_equal(out,
	    "# HELP smg_r_total smg-c: r total\n"
	    "# TYPE smg_r_total counter\nsmg_r_total 6\n");
	free(out);
	shm_close(again);
}

static void
test_table_full(void **state)
{
	struct fixture *fx = *state;
	char fam[32], *out;
	int i, s, first = -1;

	for (i = 0; i < SHM_MAX_SERIES; i++) {
		snprintf(fam, sizeof(fam), "smg_f%d", i);
		s = metrics_series(fx->fx_shm, METRICS_GAUGE, fam, NULL);
		assert_true(s >= 0);
		if (i == 0)
			first = s;
	}
	assert_int_equal(
	    metrics_series(fx->fx_shm, METRICS_GAUGE, "smg_more", NULL), -1);
	/* Known names still resolve when full. */
	assert_int_equal(
	    metrics_series(fx->fx_shm, METRICS_GAUGE, "smg_f0", NULL), first);
	out = render(fx->fx_shm);
	assert_non_null(strstr(out, "smg_f4095 0\n"));
	free(out);
}

static void
test_empty_render(void **state)
{
	struct fixture *fx = *state;
	char *out;

	out = render(fx->fx_shm);
	assert_string_equal(out, "");
	free(out);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_empty_render, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_counters_summed, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_retire, setup, teardown),
		cmocka_unit_test_setup_teardown(test_float_gauge, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_names_validated, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_escaping, setup, teardown),
		cmocka_unit_test_setup_teardown(test_histogram, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_same_series_two_processes,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(test_survives_reattach, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_table_full, setup,
		    teardown),
	};

	log_init("metrics_test", LOG_LEVEL_ERROR);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
