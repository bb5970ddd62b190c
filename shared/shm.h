/*
 * shm.h: the shared-memory segment RUN/smg.shm that every process maps.
 *
 * It carries what must be read on the request path without a round trip:
 *   - the worker table (written by the broker only, read by all under a
 *     per-slot seqlock);
 *   - one row per frontend slot with its live load per worker (requests in
 *     flight, prompt tokens still waiting for a first response byte) and a
 *     heartbeat (written by that frontend only);
 *   - metric series (see metrics.h), one value column per process row.
 * The segment is versioned: a process that finds a segment with another
 * magic, version or size refuses to use it (shm_open_segment returns -1).
 *
 * Lifetime: the first process to start creates the file (O_CREAT|O_EXCL
 * race is handled: losers map the winner's file); nobody but the launcher
 * (and tests) unlinks it, so a broker or frontend restart re-attaches and
 * keeps every counter. Frontends claim a row with shm_frontend_claim; the
 * broker calls shm_reclaim_dead every 250 ms, which zeroes the live-load
 * counters (in flight and pending tokens) of a row whose process died (pid
 * gone, or heartbeat older than SHM_HEARTBEAT_STALE_MS) and frees the row.
 */
#ifndef SHARED_SHM_H
#define SHARED_SHM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SHM_MAGIC              0x53474d43u /* "SMGC" */
#define SHM_VERSION            6u
#define SHM_FILENAME           "smg.shm"
#define SHM_MAX_WORKERS        512
#define SHM_MAX_FRONTENDS      64
#define SHM_MAX_SERIES         4096
#define SHM_URL_MAX            256
#define SHM_MODEL_MAX          128
#define SHM_ID_MAX             48
#define SHM_KEY_MAX            256
#define SHM_SERIES_NAME_MAX    256
#define SHM_HEARTBEAT_STALE_MS 3000
#define SHM_MAX_TENANTS        1024

/* Process rows: frontends 0..SHM_MAX_FRONTENDS-1, then these. */
#define SHM_ROW_BROKER   (SHM_MAX_FRONTENDS + 0)
#define SHM_ROW_POLLER   (SHM_MAX_FRONTENDS + 1)
#define SHM_ROW_LAUNCHER (SHM_MAX_FRONTENDS + 2)
#define SHM_ROWS         (SHM_MAX_FRONTENDS + 3)

/* Values match proto/ipc.proto WorkerType / ConnectionMode. */
enum shm_worker_status {
	SHM_WORKER_PENDING = 0,
	SHM_WORKER_READY,
	SHM_WORKER_NOT_READY,
	SHM_WORKER_FAILED,
	SHM_WORKER_DRAINING,
};

enum shm_breaker_state {
	SHM_BREAKER_CLOSED = 0,
	SHM_BREAKER_OPEN,
	SHM_BREAKER_HALF_OPEN,
};

/*
 * One worker. The broker writes a slot with shm_worker_write (seqlock:
 * sw_seq is odd while it writes); readers copy with shm_worker_read.
 * A slot that is reused for another worker gets a new sw_generation, so a
 * frontend holding (slot, generation) from a decision can tell.
 */
struct shm_worker {
	uint32_t sw_in_use; /* 0: free slot */
	uint32_t sw_generation;
	uint32_t sw_order; /* registration order, for candidate order */
	uint32_t sw_type; /* enum WorkerType of ipc.proto */
	uint32_t sw_mode; /* enum ConnectionMode */
	uint32_t sw_status; /* enum shm_worker_status */
	uint32_t sw_breaker; /* enum shm_breaker_state */
	uint32_t sw_overloaded; /* overload guard veto (gateway.md §8) */
	int32_t sw_bootstrap_port; /* -1: none */
	uint32_t sw_pad;
	char sw_id[SHM_ID_MAX];
	char sw_url[SHM_URL_MAX]; /* as registered, no trailing '/' */
	char sw_model[SHM_MODEL_MAX]; /* "unknown" until discovered */
	char sw_api_key[SHM_KEY_MAX]; /* "" none; segment is mode 0600 */
	/* label kv_events_endpoint (KV-event stream), "" none */
	char sw_kv_endpoint[SHM_URL_MAX];
	/* label grpc_endpoint (gRPC side channel of an HTTP worker), "" none */
	char sw_grpc_endpoint[SHM_URL_MAX];
	uint32_t sw_load_interval_secs; /* spec load_monitor_interval_secs */
	uint32_t sw_overload_on; /* overload veto thresholds apply */
};

struct shm_worker_slot {
	_Atomic uint32_t ws_seq;
	uint32_t ws_pad;
	struct shm_worker ws_w;
};

struct shm_row {
	_Atomic int32_t row_pid; /* 0: free */
	_Atomic uint32_t row_pad;
	_Atomic uint64_t row_heartbeat_ms; /* CLOCK_MONOTONIC ms */
	_Atomic uint32_t row_inflight[SHM_MAX_WORKERS];
	/*
	 * Prompt tokens (token ids, else estimated) of this row's requests
	 * sent to each worker that still wait for their first response body
	 * byte. Never below zero (shm_pending_add clamps).
	 */
	_Atomic int64_t row_pending_tokens[SHM_MAX_WORKERS];
	/* This row's share of sh_admission (enum shm_admission). */
	_Atomic uint32_t row_admission[2];
};

struct shm_series {
	_Atomic uint32_t
	    se_state; /* 0 free, 1 being written, 2 ready, 3 retired */
	uint32_t se_kind; /* enum metrics_kind */
	char se_name[SHM_SERIES_NAME_MAX]; /* family{labels} */
};

struct shm_segment {
	uint32_t sh_magic;
	uint32_t sh_version;
	uint64_t sh_size;
	_Atomic uint64_t sh_workers_generation; /* bumps on any slot write */
	_Atomic uint32_t sh_series_count;
	/* Nonzero once the broker runs a policy that reads the routing text
	 * for some model (shm_text_wanted_set); never cleared. */
	_Atomic uint32_t sh_text_wanted;
	/*
	 * Gateway-wide admission (--max-concurrent-requests): requests
	 * admitted and requests queued, summed over every row, and the rate
	 * limiter's theoretical arrival time (GCRA, CLOCK_MONOTONIC us).
	 */
	_Atomic uint32_t sh_admission[2];
	_Atomic int64_t sh_rate_tat_us;
	struct shm_worker_slot sh_workers[SHM_MAX_WORKERS];
	/* Prefill rate the broker expects of each slot's worker, tokens/s
	 * (learned, else its prior; 0 unknown). Written by the broker. */
	_Atomic uint32_t sh_prefill_rate[SHM_MAX_WORKERS];
	struct shm_row sh_rows[SHM_ROWS];
	struct shm_series sh_series[SHM_MAX_SERIES];
	/*
	 * Per-tenant rate limiters: a tenant key's hash (0: free) and its
	 * GCRA arrival time; claimed once, never freed (shm_tenant_slot).
	 */
	_Atomic uint64_t sh_tenant_key[SHM_MAX_TENANTS];
	_Atomic int64_t sh_tenant_tat_us[SHM_MAX_TENANTS];
	/* Bumped by a frontend that met a JWT with an unknown key id; the
	 * process fetching the JWKS refreshes it when this changes. */
	_Atomic uint32_t sh_jwks_wanted;
	uint32_t sh_pad2;
	/* Values: [row][series]; counters add, gauges are summed too. */
	_Atomic int64_t sh_values[SHM_ROWS][SHM_MAX_SERIES];
};

struct shm;

/*
 * Maps RUN/smg.shm, creating and initialising it when absent. Returns NULL
 * (logged) when the file cannot be made or belongs to another version.
 */
struct shm *shm_open_segment(const char *run_dir);
/* Unmaps; shm_close(NULL) is a no-op. Does not unlink. */
void shm_close(struct shm *shm);
/* Removes RUN/smg.shm (launcher shutdown, tests). */
int shm_unlink_segment(const char *run_dir);
struct shm_segment *shm_segment(struct shm *shm);

/* Monotonic milliseconds, the clock of row_heartbeat_ms. */
uint64_t shm_now_ms(void);

/*
 * Worker table. shm_worker_read copies slot `slot` consistently; returns 0
 * when the slot is in use, -1 when free or out of range. Broker only:
 * shm_worker_write publishes a whole slot (sw_in_use forced to 1) and bumps
 * sh_workers_generation; shm owns sw_generation: the caller's value is
 * ignored, a write to a free slot bumps it, a rewrite of an in-use slot
 * keeps it; the published generation is returned. shm_worker_clear frees
 * the slot (generation kept, so reuse bumps it).
 */
int shm_worker_read(struct shm *shm, unsigned slot, struct shm_worker *out);
uint32_t shm_worker_write(struct shm *shm, unsigned slot,
    const struct shm_worker *w);
void shm_worker_clear(struct shm *shm, unsigned slot);
/*
 * A frontend host without a broker of its own (--broker tcp://): its one
 * mirroring process publishes the broker's slot as given, generation
 * included, so decisions naming (slot, generation) match. Same seqlock.
 */
uint32_t shm_worker_mirror(struct shm *shm, unsigned slot,
    const struct shm_worker *w);
uint64_t shm_workers_generation(struct shm *shm);

/*
 * Whether some model's policy reads the routing text (policies.md §1.6):
 * the broker sets it when it gives a model such a policy of its own (a
 * worker's "policy" label), so frontends whose --policy needs no text know
 * to extract it anyway. Sticky until the segment is made again.
 */
void shm_text_wanted_set(struct shm *shm);
bool shm_text_wanted(struct shm *shm);

/*
 * Rows. shm_frontend_claim takes a free (or dead) frontend row for the
 * calling process, preferring `wanted` (-1: any); returns the row or -1
 * when all are taken. shm_row_claim takes a fixed row (broker, poller) if
 * it is free, dead or already the caller's: 0, or -1 (logged) when a live
 * process holds it. shm_heartbeat stamps the caller's row; call it at
 * least every 500 ms. shm_row_release frees the caller's row at clean
 * exit, zeroing its in-flight and pending tokens (metric values are kept).
 * A row's row_pid is 0 when free, the owner's pid, or minus the pid of a
 * process reclaiming it. A dead process must have been reaped (a zombie
 * still answers kill(pid, 0)) or have a stale heartbeat.
 */
int shm_frontend_claim(struct shm *shm, int wanted);
int shm_row_claim(struct shm *shm, int row);
void shm_heartbeat(struct shm *shm, int row);
void shm_row_release(struct shm *shm, int row);
/*
 * Whether a live process holds row: a pid that exists and, for another
 * process, a heartbeat younger than SHM_HEARTBEAT_STALE_MS. Read-only.
 */
bool shm_row_alive(struct shm *shm, int row);
/*
 * Zeroes the in-flight counts and pending tokens of dead rows and frees
 * them; returns how many rows were reclaimed. Any process may call it (the
 * broker does).
 */
int shm_reclaim_dead(struct shm *shm);

/* In-flight: the caller's row only; reads sum every row. */
void shm_inflight_inc(struct shm *shm, int row, unsigned slot);
void shm_inflight_dec(struct shm *shm, int row, unsigned slot);
uint32_t shm_inflight_total(struct shm *shm, unsigned slot);
/*
 * Zeroes every row's in-flight count and pending tokens for a slot
 * (broker, when a slot is reused).
 */
void shm_inflight_reset_slot(struct shm *shm, unsigned slot);

/*
 * Pending prompt tokens (live prefill load). shm_pending_add adds delta
 * (negative to release) to the caller's row for slot; the row never goes
 * below zero, since a reset may have zeroed it while the request was out.
 * A frontend adds the request's prompt tokens when it dispatches and
 * subtracts the same amount exactly once: at the first response body
 * byte, or when the attempt ends without one. Out-of-range row or slot:
 * ignored. shm_pending_total sums every row (reading 67 atomics); a
 * negative sum reads as 0.
 */
void shm_pending_add(struct shm *shm, int row, unsigned slot, int64_t delta);
uint64_t shm_pending_total(struct shm *shm, unsigned slot);
/* The broker's expected prefill rate of a slot's worker (tokens/s, 0:
 * unknown); set by the broker, read by the frontends. */
void shm_prefill_rate_set(struct shm *shm, unsigned slot, uint32_t tps);
uint32_t shm_prefill_rate(struct shm *shm, unsigned slot);

/*
 * Admission across every frontend (gateway.md §2.6, §5). Each counter is
 * gateway-wide, with each row's share kept so that a dead row's share is
 * given back when it is reclaimed (shm_reclaim_dead, shm_row_release).
 * shm_admission_take adds one for the caller's row if the total stays at
 * or below cap and returns true; shm_admission_put gives one back (never
 * below zero). A process that dies between the two updates of a take
 * leaks one unit until the segment is recreated (a window of two atomic
 * operations).
 */
enum shm_admission {
	SHM_ADMISSION_RUNNING = 0,
	SHM_ADMISSION_QUEUED,
};
bool shm_admission_take(struct shm *shm, int row, enum shm_admission which,
    uint32_t cap);
void shm_admission_put(struct shm *shm, int row, enum shm_admission which);
uint32_t shm_admission_total(struct shm *shm, enum shm_admission which);
/*
 * The gateway-wide token bucket, as GCRA on one atomic: rate tokens per
 * second, up to burst tokens banked. Takes one token at now_us (monotonic
 * microseconds) and returns true, or returns false and leaves the bucket
 * as it was; *wait_us then tells when one will be there.
 */
bool shm_rate_take(struct shm *shm, double rate, double burst, uint64_t now_us,
    uint64_t *wait_us);
/*
 * The slot of tenant key_hash (non-zero) among SHM_MAX_TENANTS, claiming a
 * free one the first time; when every slot is taken, the tenants left out
 * share the last slot. Any process.
 */
unsigned shm_tenant_slot(struct shm *shm, uint64_t key_hash);
/* shm_rate_take on the bucket of a tenant slot. */
bool shm_tenant_rate_take(struct shm *shm, unsigned slot, double rate,
    double burst, uint64_t now_us, uint64_t *wait_us);
/*
 * A tenant slot's bucket taken by cost units at once (tokens of a
 * prompt): rate units per second, up to burst banked. false (bucket
 * unchanged, *wait_us until cost units are there) when they are not;
 * a cost over burst never fits (*wait_us then UINT64_MAX).
 */
bool shm_tenant_take_cost(struct shm *shm, unsigned slot, double rate,
    double burst, double cost, uint64_t now_us, uint64_t *wait_us);
/* Gives back cost units taken from a slot's bucket (rate as taken): a
 * request refused by a later limit does not keep what it took. */
void shm_tenant_give(struct shm *shm, unsigned slot, double rate, double cost);
/* The JWKS refresh wish: frontends bump it, its fetcher watches it. */
void shm_jwks_want(struct shm *shm);
uint32_t shm_jwks_wanted(struct shm *shm);

#endif /* SHARED_SHM_H */
