/* shm.c: creates, attaches and maintains the shared segment RUN/smg.shm. */
#include "shared/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "shared/log.h"
#include "shared/xmalloc.h"

#define SHM_ATTACH_WAIT_MS 2000 /* losers wait this long for the winner */
#define SHM_ATTACH_POLL_MS 5
#define SHM_SEQ_SPINS      100000 /* a writer that died mid-write */

struct shm {
	struct shm_segment *sm_seg;
};

static int shm_path(char *, size_t, const char *);
static int shm_mkdirs(const char *);
static void shm_sleep_ms(unsigned);
static int shm_check_header(const struct shm_segment *, const char *);
static int shm_pid_gone(int32_t);
static int shm_row_dead(struct shm_row *, int32_t, uint64_t);
static int shm_row_reclaim(struct shm *, struct shm_row *, int32_t);
static void shm_admission_return(struct shm *, struct shm_row *);
static int shm_row_take(struct shm *, int);
static void shm_row_zero(struct shm_row *);
static bool shm_gcra_take(_Atomic int64_t *, double, double, uint64_t,
    uint64_t *);

static int
shm_path(char *buf, size_t len, const char *run_dir)
{
	int n;

	n = snprintf(buf, len, "%s/%s", run_dir, SHM_FILENAME);
	if (n < 0 || (size_t)n >= len) {
		log_warnx("%s: run dir %s too long", __func__, run_dir);
		return -1;
	}
	return 0;
}

/* mkdir -p with mode 0700 for every component created. */
static int
shm_mkdirs(const char *dir)
{
	char path[PATH_MAX];
	size_t i, len;

	len = strlen(dir);
	if (len == 0 || len >= sizeof(path)) {
		log_warnx("%s: bad run dir \"%s\"", __func__, dir);
		return -1;
	}
	memcpy(path, dir, len + 1);
	for (i = 1; i <= len; i++) {
		if (path[i] != '/' && path[i] != '\0')
			continue;
		path[i] = '\0';
		if (mkdir(path, 0700) == -1 && errno != EEXIST) {
			log_warn("%s: mkdir %s", __func__, path);
			return -1;
		}
		if (i < len)
			path[i] = '/';
	}
	return 0;
}

static void
shm_sleep_ms(unsigned ms)
{
	struct timespec ts;

	ts.tv_sec = ms / 1000;
	ts.tv_nsec = (long)(ms % 1000) * 1000000L;
	while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
		;
}

uint64_t
shm_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int
shm_check_header(const struct shm_segment *seg, const char *path)
{
	uint32_t magic;

	magic = __atomic_load_n(&seg->sh_magic, __ATOMIC_ACQUIRE);
	if (magic != SHM_MAGIC) {
		log_warnx("%s: %s: bad magic 0x%08x (want 0x%08x); remove it "
		          "if no smg-c process runs",
		    __func__, path, magic, SHM_MAGIC);
		return -1;
	}
	if (seg->sh_version != SHM_VERSION) {
		log_warnx("%s: %s: layout version %u, this build uses %u; "
		          "stop every smg-c process and remove it",
		    __func__, path, seg->sh_version, SHM_VERSION);
		return -1;
	}
	if (seg->sh_size != sizeof(struct shm_segment)) {
		log_warnx("%s: %s: size %llu, this build uses %zu", __func__,
		    path, (unsigned long long)seg->sh_size,
		    sizeof(struct shm_segment));
		return -1;
	}
	return 0;
}

struct shm *
shm_open_segment(const char *run_dir)
{
	struct shm *shm;
	struct shm_segment *seg;
	struct stat st;
	char path[PATH_MAX];
	size_t size = sizeof(struct shm_segment);
	unsigned waited;
	int fd, creator = 0;
	void *p;

	if (shm_path(path, sizeof(path), run_dir) == -1 ||
	    shm_mkdirs(run_dir) == -1)
		return NULL;

	if ((fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600)) !=
	    -1) {
		creator = 1;
		if (ftruncate(fd, (off_t)size) == -1) {
			log_warn("%s: ftruncate %s", __func__, path);
			close(fd);
			unlink(path);
			return NULL;
		}
	} else if (errno == EEXIST) {
		if ((fd = open(path, O_RDWR | O_CLOEXEC)) == -1) {
			log_warn("%s: open %s", __func__, path);
			return NULL;
		}
		/* The creator may not have sized it yet. */
		for (waited = 0;; waited += SHM_ATTACH_POLL_MS) {
			if (fstat(fd, &st) == -1) {
				log_warn("%s: fstat %s", __func__, path);
				close(fd);
				return NULL;
			}
			if (st.st_size != 0)
				break;
			if (waited >= SHM_ATTACH_WAIT_MS) {
				log_warnx("%s: %s stays empty", __func__, path);
				close(fd);
				return NULL;
			}
			shm_sleep_ms(SHM_ATTACH_POLL_MS);
		}
		if ((uint64_t)st.st_size != size) {
			log_warnx("%s: %s: size %lld, this build uses %zu; "
			          "stop every smg-c process and remove it",
			    __func__, path, (long long)st.st_size, size);
			close(fd);
			return NULL;
		}
	} else {
		log_warn("%s: create %s", __func__, path);
		return NULL;
	}

	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		log_warn("%s: mmap %s", __func__, path);
		if (creator)
			unlink(path);
		return NULL;
	}
	seg = p;

	if (creator) {
		/* The file is zeroed; the header goes last, magic very last. */
		seg->sh_version = SHM_VERSION;
		seg->sh_size = size;
		__atomic_store_n(&seg->sh_magic, SHM_MAGIC, __ATOMIC_RELEASE);
	} else {
		for (waited = 0;
		     __atomic_load_n(&seg->sh_magic, __ATOMIC_ACQUIRE) == 0;
		     waited += SHM_ATTACH_POLL_MS) {
			if (waited >= SHM_ATTACH_WAIT_MS) {
				log_warnx("%s: %s was never initialised",
				    __func__, path);
				munmap(p, size);
				return NULL;
			}
			shm_sleep_ms(SHM_ATTACH_POLL_MS);
		}
		if (shm_check_header(seg, path) == -1) {
			munmap(p, size);
			return NULL;
		}
	}

	shm = xcalloc(1, sizeof(*shm));
	shm->sm_seg = seg;
	return shm;
}

void
shm_close(struct shm *shm)
{
	if (shm == NULL)
		return;
	if (munmap(shm->sm_seg, sizeof(struct shm_segment)) == -1)
		log_warn("%s: munmap", __func__);
	free(shm);
}

int
shm_unlink_segment(const char *run_dir)
{
	char path[PATH_MAX];

	if (shm_path(path, sizeof(path), run_dir) == -1)
		return -1;
	if (unlink(path) == -1 && errno != ENOENT) {
		log_warn("%s: unlink %s", __func__, path);
		return -1;
	}
	return 0;
}

struct shm_segment *
shm_segment(struct shm *shm)
{
	return shm->sm_seg;
}

/* ---------------------------------------------------------------- workers */

int
shm_worker_read(struct shm *shm, unsigned slot, struct shm_worker *out)
{
	struct shm_worker_slot *ws;
	uint32_t s1, s2;
	unsigned spins;

	if (slot >= SHM_MAX_WORKERS)
		return -1;
	ws = &shm->sm_seg->sh_workers[slot];
	for (spins = 0; spins < SHM_SEQ_SPINS; spins++) {
		s1 = atomic_load_explicit(&ws->ws_seq, memory_order_acquire);
		if (s1 & 1u) {
			if (spins > 64)
				sched_yield();
			continue;
		}
		memcpy(out, &ws->ws_w, sizeof(*out));
		atomic_thread_fence(memory_order_acquire);
		s2 = atomic_load_explicit(&ws->ws_seq, memory_order_relaxed);
		if (s1 == s2)
			return out->sw_in_use ? 0 : -1;
	}
	log_warnx("%s: slot %u stays mid-write", __func__, slot);
	return -1;
}

/* Single writer (the broker): seq odd, copy, seq even. */
static void
shm_worker_publish(struct shm *shm, unsigned slot, const struct shm_worker *w)
{
	struct shm_worker_slot *ws = &shm->sm_seg->sh_workers[slot];
	uint32_t seq;

	seq = atomic_load_explicit(&ws->ws_seq, memory_order_relaxed);
	/* A broker that died mid-write left it odd: close that write. */
	if (seq & 1u)
		seq++;
	atomic_store_explicit(&ws->ws_seq, seq + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
	memcpy(&ws->ws_w, w, sizeof(*w));
	atomic_store_explicit(&ws->ws_seq, seq + 2, memory_order_release);
	atomic_fetch_add_explicit(&shm->sm_seg->sh_workers_generation, 1,
	    memory_order_release);
}

uint32_t
shm_worker_write(struct shm *shm, unsigned slot, const struct shm_worker *w)
{
	struct shm_worker cur, next;

	if (slot >= SHM_MAX_WORKERS) {
		log_warnx("%s: slot %u out of range", __func__, slot);
		return 0;
	}
	/* The writer owns the slot, so this read cannot race. */
	cur = shm->sm_seg->sh_workers[slot].ws_w;
	next = *w;
	next.sw_in_use = 1;
	next.sw_generation =
	    cur.sw_in_use ? cur.sw_generation : cur.sw_generation + 1;
	shm_worker_publish(shm, slot, &next);
	return next.sw_generation;
}

uint32_t
shm_worker_mirror(struct shm *shm, unsigned slot, const struct shm_worker *w)
{
	struct shm_worker next;

	if (slot >= SHM_MAX_WORKERS) {
		log_warnx("%s: slot %u out of range", __func__, slot);
		return 0;
	}
	next = *w;
	next.sw_in_use = 1;
	shm_worker_publish(shm, slot, &next);
	return next.sw_generation;
}

void
shm_worker_clear(struct shm *shm, unsigned slot)
{
	struct shm_worker next;

	if (slot >= SHM_MAX_WORKERS)
		return;
	memset(&next, 0, sizeof(next));
	next.sw_generation = shm->sm_seg->sh_workers[slot].ws_w.sw_generation;
	shm_worker_publish(shm, slot, &next);
}

uint64_t
shm_workers_generation(struct shm *shm)
{
	return atomic_load_explicit(&shm->sm_seg->sh_workers_generation,
	    memory_order_acquire);
}

void
shm_text_wanted_set(struct shm *shm)
{
	atomic_store_explicit(&shm->sm_seg->sh_text_wanted, 1,
	    memory_order_release);
}

bool
shm_text_wanted(struct shm *shm)
{
	return atomic_load_explicit(&shm->sm_seg->sh_text_wanted,
	           memory_order_acquire) != 0;
}

/* ---------------------------------------------------------------- rows */

/*
 * row_pid: 0 free, > 0 the owner's pid, < 0 being reclaimed by the process
 * -row_pid (if that one dies mid-reclaim, the next reclaimer takes over).
 */
static int
shm_pid_gone(int32_t pid)
{
	if (pid < 0)
		pid = -pid;
	return kill((pid_t)pid, 0) == -1 && errno == ESRCH;
}

static int
shm_row_dead(struct shm_row *r, int32_t pid, uint64_t now)
{
	uint64_t hb;

	if (pid == 0)
		return 0;
	if (shm_pid_gone(pid))
		return 1;
	if (pid < 0 || pid == (int32_t)getpid())
		return 0;
	hb = atomic_load_explicit(&r->row_heartbeat_ms, memory_order_acquire);
	return hb < now && now - hb > SHM_HEARTBEAT_STALE_MS;
}

static void
shm_row_zero(struct shm_row *r)
{
	unsigned i;

	for (i = 0; i < SHM_MAX_WORKERS; i++) {
		atomic_store_explicit(&r->row_inflight[i], 0,
		    memory_order_relaxed);
		atomic_store_explicit(&r->row_pending_tokens[i], 0,
		    memory_order_relaxed);
	}
}

/*
 * Frees row r that `seen` owned. Only the CAS winner zeroes, so a row
 * another process claims right after is never zeroed under it.
 */
static int
shm_row_reclaim(struct shm *shm, struct shm_row *r, int32_t seen)
{
	int32_t mark = -(int32_t)getpid();

	if (!atomic_compare_exchange_strong_explicit(&r->row_pid, &seen, mark,
	        memory_order_acq_rel, memory_order_relaxed))
		return 0;
	shm_row_zero(r);
	shm_admission_return(shm, r);
	atomic_store_explicit(&r->row_heartbeat_ms, shm_now_ms(),
	    memory_order_relaxed);
	atomic_store_explicit(&r->row_pid, 0, memory_order_release);
	return 1;
}

/* Takes row for this process if free or dead; 0 or -1. */
static int
shm_row_take(struct shm *shm, int row)
{
	struct shm_row *r = &shm->sm_seg->sh_rows[row];
	int32_t me = (int32_t)getpid(), cur, zero;
	int tries;

	for (tries = 0; tries < 4; tries++) {
		cur = atomic_load_explicit(&r->row_pid, memory_order_acquire);
		if (cur == me)
			return 0;
		if (cur == 0) {
			/* Fresh heartbeat first: the row never looks stale. */
			atomic_store_explicit(&r->row_heartbeat_ms,
			    shm_now_ms(), memory_order_relaxed);
			zero = 0;
			if (atomic_compare_exchange_strong_explicit(&r->row_pid,
			        &zero, me, memory_order_acq_rel,
			        memory_order_relaxed))
				return 0;
			continue;
		}
		if (!shm_row_dead(r, cur, shm_now_ms()))
			return -1;
		if (shm_row_reclaim(shm, r, cur))
			log_info("%s: row %d of dead pid %d reclaimed",
			    __func__, row, cur < 0 ? -cur : cur);
	}
	return -1;
}

bool
shm_row_alive(struct shm *shm, int row)
{
	struct shm_row *r;
	int32_t pid;

	if (row < 0 || row >= SHM_ROWS)
		return false;
	r = &shm->sm_seg->sh_rows[row];
	pid = atomic_load_explicit(&r->row_pid, memory_order_acquire);
	return pid > 0 && !shm_row_dead(r, pid, shm_now_ms());
}

int
shm_frontend_claim(struct shm *shm, int wanted)
{
	int row;

	if (wanted >= 0 && wanted < SHM_MAX_FRONTENDS &&
	    shm_row_take(shm, wanted) == 0)
		return wanted;
	for (row = 0; row < SHM_MAX_FRONTENDS; row++)
		if (row != wanted && shm_row_take(shm, row) == 0)
			return row;
	log_warnx("%s: all %d frontend rows are taken", __func__,
	    SHM_MAX_FRONTENDS);
	return -1;
}

int
shm_row_claim(struct shm *shm, int row)
{
	int32_t pid;

	if (row < 0 || row >= SHM_ROWS) {
		log_warnx("%s: row %d out of range", __func__, row);
		return -1;
	}
	if (shm_row_take(shm, row) == -1) {
		pid = atomic_load_explicit(&shm->sm_seg->sh_rows[row].row_pid,
		    memory_order_relaxed);
		log_warnx("%s: row %d is held by live pid %d", __func__, row,
		    pid);
		return -1;
	}
	return 0;
}

void
shm_heartbeat(struct shm *shm, int row)
{
	if (row < 0 || row >= SHM_ROWS)
		return;
	atomic_store_explicit(&shm->sm_seg->sh_rows[row].row_heartbeat_ms,
	    shm_now_ms(), memory_order_release);
}

void
shm_row_release(struct shm *shm, int row)
{
	struct shm_row *r;

	if (row < 0 || row >= SHM_ROWS)
		return;
	r = &shm->sm_seg->sh_rows[row];
	if (atomic_load_explicit(&r->row_pid, memory_order_acquire) !=
	    (int32_t)getpid())
		return;
	shm_row_reclaim(shm, r, (int32_t)getpid());
}

int
shm_reclaim_dead(struct shm *shm)
{
	struct shm_row *r;
	uint64_t now = shm_now_ms();
	int32_t pid;
	int row, n = 0;

	for (row = 0; row < SHM_ROWS; row++) {
		r = &shm->sm_seg->sh_rows[row];
		pid = atomic_load_explicit(&r->row_pid, memory_order_acquire);
		if (pid == 0 || !shm_row_dead(r, pid, now))
			continue;
		if (shm_row_reclaim(shm, r, pid)) {
			log_info("%s: row %d of dead pid %d reclaimed",
			    __func__, row, pid < 0 ? -pid : pid);
			n++;
		}
	}
	return n;
}

/* ---------------------------------------------------------------- in-flight */

void
shm_inflight_inc(struct shm *shm, int row, unsigned slot)
{
	if (row < 0 || row >= SHM_ROWS || slot >= SHM_MAX_WORKERS)
		return;
	atomic_fetch_add_explicit(&shm->sm_seg->sh_rows[row].row_inflight[slot],
	    1, memory_order_relaxed);
}

void
shm_inflight_dec(struct shm *shm, int row, unsigned slot)
{
	_Atomic uint32_t *p;
	uint32_t v;

	if (row < 0 || row >= SHM_ROWS || slot >= SHM_MAX_WORKERS)
		return;
	p = &shm->sm_seg->sh_rows[row].row_inflight[slot];
	/* Never below zero: the slot may have been reset meanwhile. */
	v = atomic_load_explicit(p, memory_order_relaxed);
	while (v > 0 &&
	    !atomic_compare_exchange_weak_explicit(p, &v, v - 1,
	        memory_order_relaxed, memory_order_relaxed))
		;
}

uint32_t
shm_inflight_total(struct shm *shm, unsigned slot)
{
	uint32_t total = 0;
	int row;

	if (slot >= SHM_MAX_WORKERS)
		return 0;
	for (row = 0; row < SHM_ROWS; row++)
		total += atomic_load_explicit(
		    &shm->sm_seg->sh_rows[row].row_inflight[slot],
		    memory_order_relaxed);
	return total;
}

void
shm_inflight_reset_slot(struct shm *shm, unsigned slot)
{
	int row;

	if (slot >= SHM_MAX_WORKERS)
		return;
	for (row = 0; row < SHM_ROWS; row++) {
		atomic_store_explicit(
		    &shm->sm_seg->sh_rows[row].row_inflight[slot], 0,
		    memory_order_relaxed);
		atomic_store_explicit(
		    &shm->sm_seg->sh_rows[row].row_pending_tokens[slot], 0,
		    memory_order_relaxed);
	}
}

/* ---------------------------------------------------------------- pending */

void
shm_pending_add(struct shm *shm, int row, unsigned slot, int64_t delta)
{
	_Atomic int64_t *p;
	int64_t v, next;

	if (row < 0 || row >= SHM_ROWS || slot >= SHM_MAX_WORKERS || delta == 0)
		return;
	p = &shm->sm_seg->sh_rows[row].row_pending_tokens[slot];
	if (delta < -INT64_MAX)
		delta = -INT64_MAX;
	if (delta > 0) {
		atomic_fetch_add_explicit(p, delta, memory_order_relaxed);
		return;
	}
	/* Never below zero: the slot or row may have been reset meanwhile. */
	v = atomic_load_explicit(p, memory_order_relaxed);
	do {
		next = v > -delta ? v + delta : 0;
	} while (v != next &&
	    !atomic_compare_exchange_weak_explicit(p, &v, next,
	        memory_order_relaxed, memory_order_relaxed));
}

void
shm_prefill_rate_set(struct shm *shm, unsigned slot, uint32_t tps)
{
	if (slot < SHM_MAX_WORKERS)
		atomic_store_explicit(&shm->sm_seg->sh_prefill_rate[slot], tps,
		    memory_order_relaxed);
}

uint32_t
shm_prefill_rate(struct shm *shm, unsigned slot)
{
	if (slot >= SHM_MAX_WORKERS)
		return 0;
	return atomic_load_explicit(&shm->sm_seg->sh_prefill_rate[slot],
	    memory_order_relaxed);
}

uint64_t
shm_pending_total(struct shm *shm, unsigned slot)
{
	int64_t total = 0;
	int row;

	if (slot >= SHM_MAX_WORKERS)
		return 0;
	for (row = 0; row < SHM_ROWS; row++)
		total += atomic_load_explicit(
		    &shm->sm_seg->sh_rows[row].row_pending_tokens[slot],
		    memory_order_relaxed);
	return total > 0 ? (uint64_t)total : 0;
}

/* ---------------------------------------------------------------- admission */

/* Decrements *p unless it is zero; returns whether it did. */
static bool
shm_dec_floor(_Atomic uint32_t *p, uint32_t by)
{
	uint32_t v = atomic_load_explicit(p, memory_order_relaxed);

	while (v > 0 &&
	    !atomic_compare_exchange_weak_explicit(p, &v, v > by ? v - by : 0,
	        memory_order_acq_rel, memory_order_relaxed))
		;
	return v > 0;
}

/* A reclaimed row's admitted and queued requests leave the totals. */
static void
shm_admission_return(struct shm *shm, struct shm_row *r)
{
	uint32_t n;
	int i;

	for (i = 0; i < 2; i++) {
		n = atomic_exchange_explicit(&r->row_admission[i], 0,
		    memory_order_acq_rel);
		if (n > 0)
			shm_dec_floor(&shm->sm_seg->sh_admission[i], n);
	}
}

bool
shm_admission_take(struct shm *shm, int row, enum shm_admission which,
    uint32_t cap)
{
	_Atomic uint32_t *p;
	uint32_t v;

	if (row < 0 || row >= SHM_ROWS || (unsigned)which > 1)
		return false;
	p = &shm->sm_seg->sh_admission[which];
	v = atomic_load_explicit(p, memory_order_relaxed);
	do {
		if (v >= cap)
			return false;
	} while (!atomic_compare_exchange_weak_explicit(p, &v, v + 1,
	    memory_order_acq_rel, memory_order_relaxed));
	atomic_fetch_add_explicit(
	    &shm->sm_seg->sh_rows[row].row_admission[which], 1,
	    memory_order_relaxed);
	return true;
}

void
shm_admission_put(struct shm *shm, int row, enum shm_admission which)
{
	if (row < 0 || row >= SHM_ROWS || (unsigned)which > 1)
		return;
	/* Only what this row still holds: a reclaim may have taken it. */
	if (shm_dec_floor(&shm->sm_seg->sh_rows[row].row_admission[which], 1))
		shm_dec_floor(&shm->sm_seg->sh_admission[which], 1);
}

uint32_t
shm_admission_total(struct shm *shm, enum shm_admission which)
{
	if ((unsigned)which > 1)
		return 0;
	return atomic_load_explicit(&shm->sm_seg->sh_admission[which],
	    memory_order_relaxed);
}

/* GCRA on one arrival time (see shm_rate_take). */
static bool
shm_gcra_take(_Atomic int64_t *p, double rate, double burst, uint64_t now_us,
    uint64_t *wait_us)
{
	int64_t tat, next, now = (int64_t)now_us, step, slack;

	if (rate <= 0)
		return true;
	step = (int64_t)(1e6 / rate);
	if (step < 1)
		step = 1;
	slack = (int64_t)((burst > 1 ? burst - 1 : 0) * (double)step);
	tat = atomic_load_explicit(p, memory_order_relaxed);
	for (;;) {
		next = (tat > now ? tat : now) + step;
		if (next - now > step + slack) {
			if (wait_us != NULL)
				*wait_us =
				    (uint64_t)(next - now - step - slack);
			return false;
		}
		if (atomic_compare_exchange_weak_explicit(p, &tat, next,
		        memory_order_acq_rel, memory_order_relaxed))
			return true;
	}
}

bool
shm_rate_take(struct shm *shm, double rate, double burst, uint64_t now_us,
    uint64_t *wait_us)
{
	return shm_gcra_take(&shm->sm_seg->sh_rate_tat_us, rate, burst, now_us,
	    wait_us);
}

bool
shm_tenant_take_cost(struct shm *shm, unsigned slot, double rate, double burst,
    double cost, uint64_t now_us, uint64_t *wait_us)
{
	_Atomic int64_t *p;
	int64_t tat, next, now = (int64_t)now_us, inc, room;

	if (rate <= 0 || cost <= 0)
		return true;
	if (cost > burst) {
		if (wait_us != NULL)
			*wait_us = UINT64_MAX;
		return false;
	}
	if (slot >= SHM_MAX_TENANTS)
		slot = SHM_MAX_TENANTS - 1;
	p = &shm->sm_seg->sh_tenant_tat_us[slot];
	/* GCRA in time units: cost units push the arrival time by
	 * cost / rate seconds; at most burst / rate seconds ahead. */
	inc = (int64_t)(cost * 1e6 / rate);
	room = (int64_t)(burst * 1e6 / rate);
	tat = atomic_load_explicit(p, memory_order_relaxed);
	for (;;) {
		next = (tat > now ? tat : now) + inc;
		if (next - now > room) {
			if (wait_us != NULL)
				*wait_us = (uint64_t)(next - now - room);
			return false;
		}
		if (atomic_compare_exchange_weak_explicit(p, &tat, next,
		        memory_order_acq_rel, memory_order_relaxed))
			return true;
	}
}

void
shm_tenant_give(struct shm *shm, unsigned slot, double rate, double cost)
{
	if (rate <= 0 || cost <= 0)
		return;
	if (slot >= SHM_MAX_TENANTS)
		slot = SHM_MAX_TENANTS - 1;
	atomic_fetch_sub_explicit(&shm->sm_seg->sh_tenant_tat_us[slot],
	    (int64_t)(cost * 1e6 / rate), memory_order_acq_rel);
}

unsigned
shm_tenant_slot(struct shm *shm, uint64_t key_hash)
{
	struct shm_segment *seg = shm->sm_seg;
	uint64_t cur;
	unsigned i, at;

	if (key_hash == 0)
		key_hash = 1;
	for (i = 0; i < SHM_MAX_TENANTS; i++) {
		at = (unsigned)((key_hash + i) % SHM_MAX_TENANTS);
		cur = atomic_load_explicit(&seg->sh_tenant_key[at],
		    memory_order_acquire);
		if (cur == key_hash)
			return at;
		if (cur == 0 &&
		    atomic_compare_exchange_strong_explicit(
		        &seg->sh_tenant_key[at], &cur, key_hash,
		        memory_order_acq_rel, memory_order_acquire))
			return at;
		if (cur == key_hash)
			return at;
	}
	return SHM_MAX_TENANTS - 1;
}

bool
shm_tenant_rate_take(struct shm *shm, unsigned slot, double rate, double burst,
    uint64_t now_us, uint64_t *wait_us)
{
	if (slot >= SHM_MAX_TENANTS)
		slot = SHM_MAX_TENANTS - 1;
	return shm_gcra_take(&shm->sm_seg->sh_tenant_tat_us[slot], rate, burst,
	    now_us, wait_us);
}

void
shm_jwks_want(struct shm *shm)
{
	atomic_fetch_add_explicit(&shm->sm_seg->sh_jwks_wanted, 1,
	    memory_order_relaxed);
}

uint32_t
shm_jwks_wanted(struct shm *shm)
{
	return atomic_load_explicit(&shm->sm_seg->sh_jwks_wanted,
	    memory_order_relaxed);
}
