/* shm_test.c: segment creation, seqlock, rows, reclaim of dead processes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "shared/log.h"
#include "shared/shm.h"

struct fixture {
	char fx_base[64];
	char fx_run[96];
};

static int
setup(void **state)
{
	struct fixture *fx;

	fx = calloc(1, sizeof(*fx));
	assert_non_null(fx);
	snprintf(fx->fx_base, sizeof(fx->fx_base), "/tmp/shm_test.XXXXXX");
	assert_non_null(mkdtemp(fx->fx_base));
	/* Two levels that do not exist yet: shm makes them. */
	snprintf(fx->fx_run, sizeof(fx->fx_run), "%s/a/run", fx->fx_base);
	*state = fx;
	return 0;
}

static int
teardown(void **state)
{
	struct fixture *fx = *state;
	char path[128];

	shm_unlink_segment(fx->fx_run);
	rmdir(fx->fx_run);
	snprintf(path, sizeof(path), "%s/a", fx->fx_base);
	rmdir(path);
	rmdir(fx->fx_base);
	free(fx);
	return 0;
}

static void
wait_child_ok(pid_t pid)
{
	int status;

	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

static void
test_create_attach(void **state)
{
	struct fixture *fx = *state;
	struct shm *a, *b;
	struct shm_segment *sa, *sb;
	struct stat st;
	char path[160];

	a = shm_open_segment(fx->fx_run);
	assert_non_null(a);
	b = shm_open_segment(fx->fx_run);
	assert_non_null(b);
	sa = shm_segment(a);
	sb = shm_segment(b);
	assert_ptr_not_equal(sa, sb);
	assert_int_equal(sb->sh_magic, SHM_MAGIC);
	assert_int_equal(sb->sh_version, SHM_VERSION);
	assert_int_equal(sb->sh_size, sizeof(struct shm_segment));
	atomic_store(&sa->sh_values[3][7], 12345);
	assert_int_equal(atomic_load(&sb->sh_values[3][7]), 12345);

	assert_int_equal(stat(fx->fx_run, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0700);
	snprintf(path, sizeof(path), "%s/%s", fx->fx_run, SHM_FILENAME);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	assert_int_equal((size_t)st.st_size, sizeof(struct shm_segment));
	shm_close(a);
	shm_close(b);
	shm_close(NULL);
	assert_int_equal(shm_unlink_segment(fx->fx_run), 0);
	assert_int_equal(stat(path, &st), -1);
	assert_int_equal(shm_unlink_segment(fx->fx_run), 0);
}

/* Several processes race to create; all end up on one valid segment. */
static void
test_create_race(void **state)
{
	struct fixture *fx = *state;
	struct shm *shm;
	pid_t pids[6];
	int gate[2], i, total;
	char go;

	assert_int_equal(pipe(gate), 0);
	for (i = 0; i < 6; i++) {
		pids[i] = fork();
		assert_true(pids[i] != -1);
		if (pids[i] == 0) {
			close(gate[1]);
			if (read(gate[0], &go, 1) != 0)
				_exit(3);
			shm = shm_open_segment(fx->fx_run);
			if (shm == NULL)
				_exit(1);
			atomic_fetch_add(&shm_segment(shm)->sh_values[i][0],
			    i + 1);
			shm_close(shm);
			_exit(0);
		}
	}
	close(gate[0]);
	close(gate[1]); /* everyone starts now */
	for (i = 0; i < 6; i++)
		wait_child_ok(pids[i]);
	shm = shm_open_segment(fx->fx_run);
	assert_non_null(shm);
	for (i = 0, total = 0; i < 6; i++)
		total += (int)atomic_load(&shm_segment(shm)->sh_values[i][0]);
	assert_int_equal(total, 1 + 2 + 3 + 4 + 5 + 6);
	shm_close(shm);
}

static void
test_mismatch_rejected(void **state)
{
	struct fixture *fx = *state;
	struct shm *shm;
	char path[160];

	shm = shm_open_segment(fx->fx_run);
	assert_non_null(shm);
	shm_segment(shm)->sh_version = SHM_VERSION + 1;
	shm_close(shm);
	assert_null(shm_open_segment(fx->fx_run));

	shm = NULL;
	assert_int_equal(shm_unlink_segment(fx->fx_run), 0);
	shm = shm_open_segment(fx->fx_run);
	assert_non_null(shm);
	shm_segment(shm)->sh_magic = 0x12345678u;
	shm_close(shm);
	assert_null(shm_open_segment(fx->fx_run));

	/* A segment of another size (another build) is refused too. */
	assert_int_equal(shm_unlink_segment(fx->fx_run), 0);
	shm = shm_open_segment(fx->fx_run);
	assert_non_null(shm);
	shm_close(shm);
	snprintf(path, sizeof(path), "%s/%s", fx->fx_run, SHM_FILENAME);
	assert_int_equal(truncate(path, 4096), 0);
	assert_null(shm_open_segment(fx->fx_run));
}

static void
fill_worker(struct shm_worker *w, unsigned n)
{
	memset(w, 0, sizeof(*w));
	w->sw_order = n;
	w->sw_bootstrap_port = (int32_t)n;
	w->sw_status = SHM_WORKER_READY;
	snprintf(w->sw_url, sizeof(w->sw_url), "http://w%u:8000", n);
	snprintf(w->sw_model, sizeof(w->sw_model), "model-%u", n);
	snprintf(w->sw_id, sizeof(w->sw_id), "id-%u", n);
	/* A long tail so a torn copy would show. */
	memset(w->sw_api_key, 'a' + (int)(n % 26), sizeof(w->sw_api_key) - 1);
}

static void
test_worker_table(void **state)
{
	struct fixture *fx = *state;
	struct shm *shm;
	struct shm_worker w, out;
	uint64_t gen0;
	uint32_t g1, g2, g3;

	shm = shm_open_segment(fx->fx_run);
	assert_non_null(shm);
	assert_int_equal(shm_worker_read(shm, 5, &out), -1);
	assert_int_equal(shm_worker_read(shm, SHM_MAX_WORKERS, &out), -1);
	gen0 = shm_workers_generation(shm);

	fill_worker(&w, 7);
	w.sw_generation = 999; /* ignored: shm owns it */
	g1 = shm_worker_write(shm, 5, &w);
	assert_int_equal(g1, 1);
	assert_int_equal(shm_worker_read(shm, 5, &out), 0);
	assert_int_equal(out.sw_in_use, 1);
	assert_int_equal(out.sw_generation, 1);
	assert_string_equal(out.sw_url, "http://w7:8000");
	assert_string_equal(out.sw_model, "model-7");
	assert_true(shm_workers_generation(shm) > gen0);

	/* Rewrite of the same worker keeps the generation. */
	w.sw_status = SHM_WORKER_NOT_READY;
	g2 = shm_worker_write(shm, 5, &w);
	assert_int_equal(g2, g1);
	assert_int_equal(shm_worker_read(shm, 5, &out), 0);
	assert_int_equal(out.sw_status, SHM_WORKER_NOT_READY);

	shm_worker_clear(shm, 5);
	assert_int_equal(shm_worker_read(shm, 5, &out), -1);
	fill_worker(&w, 8);
	g3 = shm_worker_write(shm, 5, &w);
	assert_int_equal(g3, g1 + 1);
	assert_int_equal(shm_worker_read(shm, 5, &out), 0);
	assert_string_equal(out.sw_url, "http://w8:8000");
	shm_close(shm);
}

/* A writer process rewrites a slot while this one reads: never torn. */
static void
test_seqlock_concurrent(void **state)
{
	struct fixture *fx = *state;
	struct shm *shm;
	struct shm_worker w, out, want;
	char key[SHM_KEY_MAX];
	unsigned n, reads = 0;
	pid_t pid;
	uint64_t end;

	shm = shm_open_segment(fx->fx_run);
	assert_non_null(shm);
	fill_worker(&w, 0);
	shm_worker_write(shm, 0, &w);
	pid = fork();
	assert_true(pid != -1);
	if (pid == 0) {
		end = shm_now_ms() + 300;
		for (n = 1; shm_now_ms() < end; n++) {
			fill_worker(&w, n);
			shm_worker_write(shm, 0, &w);
		}
		_exit(0);
	}
	end = shm_now_ms() + 300;
	while (shm_now_ms() < end) {
		assert_int_equal(shm_worker_read(shm, 0, &out), 0);
		fill_worker(&want, out.sw_order);
		assert_int_equal(out.sw_bootstrap_port, (int32_t)out.sw_order);
		assert_string_equal(out.sw_url, want.sw_url);
		assert_string_equal(out.sw_model, want.sw_model);
		memcpy(key, want.sw_api_key, sizeof(key));
		assert_memory_equal(out.sw_api_key, key, sizeof(key));
		reads++;
	}
	wait_child_ok(pid);
	assert_true(reads > 100);
	shm_close(shm);
}

static void
test_inflight(void **state)
{
	struct fixture *fx = *state;
	struct shm *shm;

	shm = shm_open_segment(fx->fx_run);
	assert_non_null(shm);
	shm_inflight_inc(shm, 0, 3);
	shm_inflight_inc(shm, 0, 3);
	shm_inflight_inc(shm, 7, 3);
	shm_inflight_inc(shm, SHM_ROW_BROKER, 3);
	shm_inflight_inc(shm, 1, 4);
	assert_int_equal(shm_inflight_total(shm, 3), 4);
	assert_int_equal(shm_inflight_total(shm, 4), 1);
	shm_inflight_dec(shm, 0, 3);
	assert_int_equal(shm_inflight_total(shm, 3), 3);
	/* Below zero is clamped, not wrapped. */
	shm_inflight_dec(shm, 2, 3);
	assert_int_equal(shm_inflight_total(shm, 3), 3);
	/* Out of range is ignored. */
	shm_inflight_inc(shm, SHM_ROWS, 3);
	shm_inflight_inc(shm, 0, SHM_MAX_WORKERS);
	assert_int_equal(shm_inflight_total(shm, SHM_MAX_WORKERS), 0);
	shm_inflight_reset_slot(shm, 3);
	assert_int_equal(shm_inflight_total(shm, 3), 0);
	assert_int_equal(shm_inflight_total(shm, 4), 1);
	shm_close(shm);
}

/* Token buckets: cost at once, nothing over the burst, refunds. */
static void
test_tenant_cost(void **state)
{
	struct fixture *fx = *state;
	uint64_t wait = 0, now = 1000000000ull;
	struct shm *shm;
	unsigned slot;

	shm = shm_open_segment(fx->fx_run);
	assert_non_null(shm);
	slot = shm_tenant_slot(shm, 42);
	/* 100 units per second, 1000 banked. */
	assert_true(
	    shm_tenant_take_cost(shm, slot, 100, 1000, 600, now, &wait));
	assert_true(
	    shm_tenant_take_cost(shm, slot, 100, 1000, 400, now, &wait));
	assert_false(
	    shm_tenant_take_cost(shm, slot, 100, 1000, 50, now, &wait));
	assert_int_equal(wait, 500000); /* 50 units at 100/s */
	/* Half a second later 50 are back. */
	assert_true(shm_tenant_take_cost(shm, slot, 100, 1000, 50, now + 500000,
	    &wait));
	assert_false(
	    shm_tenant_take_cost(shm, slot, 100, 1000, 1, now + 500000, &wait));
	shm_tenant_give(shm, slot, 100, 50);
	assert_true(shm_tenant_take_cost(shm, slot, 100, 1000, 50, now + 500000,
	    &wait));
	assert_false(shm_tenant_take_cost(shm, slot, 100, 1000, 1001,
	    now + 100000000, &wait));
	assert_true(wait == UINT64_MAX);
	/* Zero cost is always admitted. */
	assert_true(shm_tenant_take_cost(shm, slot, 100, 1000, 0, now, NULL));
	shm_close(shm);
}

static void
test_pending(void **state)
{
	struct fixture *fx = *state;
	struct shm *shm;

	shm = shm_open_segment(fx->fx_run);
	assert_non_null(shm);
	assert_int_equal(shm_pending_total(shm, 3), 0);
	shm_pending_add(shm, 0, 3, 1000);
	shm_pending_add(shm, 0, 3, 500);
	shm_pending_add(shm, 5, 3, 250);
	shm_pending_add(shm, 1, 4, 7);
	assert_int_equal(shm_pending_total(shm, 3), 1750);
	assert_int_equal(shm_pending_total(shm, 4), 7);
	/* Releases are per row. */
	shm_pending_add(shm, 0, 3, -1000);
	assert_int_equal(shm_pending_total(shm, 3), 750);
	/* A row never goes below zero, so it cannot eat another's tokens. */
	shm_pending_add(shm, 5, 3, -900);
	assert_int_equal(shm_pending_total(shm, 3), 500);
	assert_int_equal(
	    atomic_load(&shm_segment(shm)->sh_rows[5].row_pending_tokens[3]),
	    0);
	shm_pending_add(shm, 0, 3, INT64_MIN);
	assert_int_equal(shm_pending_total(shm, 3), 0);
	/* Out of range is ignored. */
	shm_pending_add(shm, SHM_ROWS, 3, 10);
	shm_pending_add(shm, -1, 3, 10);
	shm_pending_add(shm, 0, SHM_MAX_WORKERS, 10);
	assert_int_equal(shm_pending_total(shm, 3), 0);
	assert_int_equal(shm_pending_total(shm, SHM_MAX_WORKERS), 0);
	/* A reused slot starts from zero in every row, in-flight too. */
	shm_pending_add(shm, 0, 3, 100);
	shm_pending_add(shm, 9, 3, 100);
	shm_inflight_inc(shm, 9, 3);
	shm_inflight_reset_slot(shm, 3);
	assert_int_equal(shm_pending_total(shm, 3), 0);
	assert_int_equal(shm_inflight_total(shm, 3), 0);
	assert_int_equal(shm_pending_total(shm, 4), 7);
	/* The late release of a request sent before the reset is harmless. */
	shm_pending_add(shm, 0, 3, -100);
	shm_pending_add(shm, 0, 3, 40);
	assert_int_equal(shm_pending_total(shm, 3), 40);
	/* A clean exit releases the row's pending tokens. */
	assert_int_equal(shm_frontend_claim(shm, 6), 6);
	shm_pending_add(shm, 6, 4, 33);
	assert_int_equal(shm_pending_total(shm, 4), 40);
	shm_row_release(shm, 6);
	assert_int_equal(shm_pending_total(shm, 4), 7);
	shm_close(shm);
}

/* A frontend that dies: its in-flight goes, its metric values stay. */
static void
test_dead_frontend_reclaimed(void **state)
{
	struct fixture *fx = *state;
	struct shm *shm, *cshm;
	struct shm_segment *seg;
	int row_pipe[2], row = -1, status;
	pid_t pid;

	shm = shm_open_segment(fx->fx_run);
	assert_non_null(shm);
	seg = shm_segment(shm);
	assert_int_equal(pipe(row_pipe), 0);
	pid = fork();
	assert_true(pid != -1);
	if (pid == 0) {
		cshm = shm_open_segment(fx->fx_run);
		if (cshm == NULL)
			_exit(1);
		row = shm_frontend_claim(cshm, 2);
		if (row == -1)
			_exit(2);
		shm_heartbeat(cshm, row);
		shm_inflight_inc(cshm, row, 9);
		shm_inflight_inc(cshm, row, 9);
		shm_inflight_inc(cshm, row, 10);
		shm_pending_add(cshm, row, 9, 12000);
		shm_pending_add(cshm, row, 10, 3000);
		atomic_fetch_add(&shm_segment(cshm)->sh_values[row][1], 77);
		if (write(row_pipe[1], &row, sizeof(row)) != sizeof(row))
			_exit(3);
		_exit(0); /* dies holding the row */
	}
	close(row_pipe[1]);
	assert_int_equal(read(row_pipe[0], &row, sizeof(row)), sizeof(row));
	close(row_pipe[0]);
	assert_int_equal(row, 2);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_int_equal(atomic_load(&seg->sh_rows[2].row_pid), (int32_t)pid);
	assert_int_equal(shm_inflight_total(shm, 9), 2);
	shm_pending_add(shm, 0, 9, 5);
	assert_int_equal(shm_pending_total(shm, 9), 12005);

	assert_int_equal(shm_reclaim_dead(shm), 1);
	assert_int_equal(shm_inflight_total(shm, 9), 0);
	/* Only the dead row's tokens go. */
	assert_int_equal(shm_pending_total(shm, 9), 5);
	assert_int_equal(shm_pending_total(shm, 10), 0);
	shm_pending_add(shm, 0, 9, -5);
	assert_int_equal(shm_inflight_total(shm, 10), 0);
	assert_int_equal(atomic_load(&seg->sh_rows[2].row_pid), 0);
	assert_int_equal(atomic_load(&seg->sh_values[2][1]), 77);
	assert_int_equal(shm_reclaim_dead(shm), 0);

	/* The next frontend takes the row over and keeps adding. */
	assert_int_equal(shm_frontend_claim(shm, 2), 2);
	assert_int_equal(atomic_load(&seg->sh_rows[2].row_pid),
	    (int32_t)getpid());
	shm_row_release(shm, 2);
	assert_int_equal(atomic_load(&seg->sh_rows[2].row_pid), 0);
	shm_close(shm);
}

/* A live pid with a stale heartbeat counts as dead. */
static void
test_stale_heartbeat(void **state)
{
	struct fixture *fx = *state;
	struct shm *shm;
	struct shm_segment *seg;

	shm = shm_open_segment(fx->fx_run);
	assert_non_null(shm);
	seg = shm_segment(shm);
	atomic_store(&seg->sh_rows[4].row_pid, (int32_t)getppid());
	atomic_store(&seg->sh_rows[4].row_heartbeat_ms, shm_now_ms());
	atomic_store(&seg->sh_rows[4].row_inflight[1], 5);
	assert_int_equal(shm_reclaim_dead(shm), 0);
	assert_int_equal(shm_inflight_total(shm, 1), 5);
	atomic_store(&seg->sh_rows[4].row_heartbeat_ms,
	    shm_now_ms() - SHM_HEARTBEAT_STALE_MS - 1000);
	assert_int_equal(shm_reclaim_dead(shm), 1);
	assert_int_equal(shm_inflight_total(shm, 1), 0);
	assert_int_equal(atomic_load(&seg->sh_rows[4].row_pid), 0);
	shm_close(shm);
}

static void
test_claim_preference(void **state)
{
	struct fixture *fx = *state;
	struct shm *shm;
	struct shm_segment *seg;
	int row;

	shm = shm_open_segment(fx->fx_run);
	assert_non_null(shm);
	seg = shm_segment(shm);
	/* Row 3 is held by a live process: another row is given. */
	atomic_store(&seg->sh_rows[3].row_pid, (int32_t)getppid());
	atomic_store(&seg->sh_rows[3].row_heartbeat_ms, shm_now_ms());
	row = shm_frontend_claim(shm, 3);
	assert_int_equal(row, 0);
	/* Claiming again returns a row this process owns already. */
	assert_int_equal(shm_frontend_claim(shm, 0), 0);
	assert_int_equal(shm_frontend_claim(shm, -1), 0);
	shm_row_release(shm, 0);

	/* Every row held by someone alive: -1. */
	for (row = 0; row < SHM_MAX_FRONTENDS; row++) {
		atomic_store(&seg->sh_rows[row].row_pid, (int32_t)getppid());
		atomic_store(&seg->sh_rows[row].row_heartbeat_ms, shm_now_ms());
	}
	assert_int_equal(shm_frontend_claim(shm, 5), -1);

	/* Fixed rows: free or ours succeed, a live holder fails. */
	assert_int_equal(shm_row_claim(shm, SHM_ROW_BROKER), 0);
	assert_int_equal(shm_row_claim(shm, SHM_ROW_BROKER), 0);
	atomic_store(&seg->sh_rows[SHM_ROW_POLLER].row_pid, (int32_t)getppid());
	atomic_store(&seg->sh_rows[SHM_ROW_POLLER].row_heartbeat_ms,
	    shm_now_ms());
	assert_int_equal(shm_row_claim(shm, SHM_ROW_POLLER), -1);
	assert_int_equal(shm_row_claim(shm, SHM_ROWS), -1);
	for (row = 0; row < SHM_ROWS; row++)
		atomic_store(&seg->sh_rows[row].row_pid, 0);
	shm_close(shm);
}

/* A broker restart re-attaches and finds the frontends' counters. */
static void
test_broker_restart(void **state)
{
	struct fixture *fx = *state;
	struct shm *fe, *broker;
	int row;

	fe = shm_open_segment(fx->fx_run);
	assert_non_null(fe);
	broker = shm_open_segment(fx->fx_run);
	assert_non_null(broker);
	assert_int_equal(shm_row_claim(broker, SHM_ROW_BROKER), 0);
	row = shm_frontend_claim(fe, 1);
	assert_int_equal(row, 1);
	shm_inflight_inc(fe, row, 2);
	atomic_fetch_add(&shm_segment(fe)->sh_values[row][4], 9);

	shm_close(broker);
	broker = shm_open_segment(fx->fx_run);
	assert_non_null(broker);
	assert_int_equal(shm_row_claim(broker, SHM_ROW_BROKER), 0);
	assert_int_equal(shm_inflight_total(broker, 2), 1);
	assert_int_equal(atomic_load(&shm_segment(broker)->sh_values[1][4]), 9);
	assert_int_equal(shm_reclaim_dead(broker), 0);
	shm_row_release(fe, row);
	shm_row_release(broker, SHM_ROW_BROKER);
	shm_close(broker);
	shm_close(fe);
}

/* The gateway-wide admission counters: a cap, and a dead row's share. */
static void
test_admission(void **state)
{
	struct fixture *fx = *state;
	struct shm *shm;
	struct shm_segment *seg;

	shm = shm_open_segment(fx->fx_run);
	assert_non_null(shm);
	seg = shm_segment(shm);
	assert_true(shm_admission_take(shm, 0, SHM_ADMISSION_RUNNING, 3));
	assert_true(shm_admission_take(shm, 1, SHM_ADMISSION_RUNNING, 3));
	assert_true(shm_admission_take(shm, 1, SHM_ADMISSION_RUNNING, 3));
	assert_false(shm_admission_take(shm, 0, SHM_ADMISSION_RUNNING, 3));
	assert_int_equal(shm_admission_total(shm, SHM_ADMISSION_RUNNING), 3);
	assert_true(shm_admission_take(shm, 0, SHM_ADMISSION_QUEUED, 1));
	assert_false(shm_admission_take(shm, 1, SHM_ADMISSION_QUEUED, 1));
	shm_admission_put(shm, 0, SHM_ADMISSION_RUNNING);
	assert_true(shm_admission_take(shm, 0, SHM_ADMISSION_RUNNING, 3));
	/* A put beyond what a row holds changes nothing. */
	shm_admission_put(shm, 2, SHM_ADMISSION_RUNNING);
	assert_int_equal(shm_admission_total(shm, SHM_ADMISSION_RUNNING), 3);

	/* Row 1 dies holding two: they are given back. */
	atomic_store(&seg->sh_rows[1].row_pid, 999999);
	atomic_store(&seg->sh_rows[1].row_heartbeat_ms,
	    shm_now_ms() - SHM_HEARTBEAT_STALE_MS - 1000);
	assert_int_equal(shm_reclaim_dead(shm), 1);
	assert_int_equal(shm_admission_total(shm, SHM_ADMISSION_RUNNING), 1);
	assert_int_equal(shm_admission_total(shm, SHM_ADMISSION_QUEUED), 1);
	shm_admission_put(shm, 0, SHM_ADMISSION_RUNNING);
	shm_admission_put(shm, 0, SHM_ADMISSION_QUEUED);
	assert_int_equal(shm_admission_total(shm, SHM_ADMISSION_RUNNING), 0);
	assert_int_equal(shm_admission_total(shm, SHM_ADMISSION_QUEUED), 0);
	shm_close(shm);
}

/* GCRA: a burst, then one token per 1/rate seconds. */
static void
test_rate(void **state)
{
	struct fixture *fx = *state;
	struct shm *shm;
	uint64_t t = 1000000000, wait = 0;

	shm = shm_open_segment(fx->fx_run);
	assert_non_null(shm);
	assert_true(shm_rate_take(shm, 10, 2, t, &wait));
	assert_true(shm_rate_take(shm, 10, 2, t, &wait));
	assert_false(shm_rate_take(shm, 10, 2, t, &wait));
	assert_int_equal(wait, 100000);
	assert_false(shm_rate_take(shm, 10, 2, t + 99999, &wait));
	assert_true(shm_rate_take(shm, 10, 2, t + 100000, &wait));
	assert_false(shm_rate_take(shm, 10, 2, t + 100000, &wait));
	/* Idle time banks at most the burst. */
	t += 10000000;
	assert_true(shm_rate_take(shm, 10, 2, t, &wait));
	assert_true(shm_rate_take(shm, 10, 2, t, &wait));
	assert_false(shm_rate_take(shm, 10, 2, t, &wait));
	shm_close(shm);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_create_attach, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_create_race, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_mismatch_rejected, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_worker_table, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_seqlock_concurrent, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_inflight, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pending, setup, teardown),
		cmocka_unit_test_setup_teardown(test_dead_frontend_reclaimed,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(test_stale_heartbeat, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_claim_preference, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_broker_restart, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_admission, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_rate, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tenant_cost, setup,
		    teardown),
	};

	log_init("shm_test", LOG_LEVEL_WARN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
