/*
 * store.c: the broker's LMDB environment in --state-dir, written behind.
 *
 * Callers queue puts and deletes; store_flush writes the whole queue in
 * one write transaction. Registry records are urgent: the broker flushes
 * them from an ev_prepare watcher, before the loop next sleeps. Routing
 * state (tree journal, manual and sticky assignments) is batched: it is
 * flushed once the oldest queued operation is STORE_BEHIND_MS old (a 50 ms
 * timer guarantees the wake-up), so a burst of decisions costs one
 * transaction and a kill -9 loses at most the last STORE_BEHIND_MS plus
 * one commit of routing state. Decisions never wait for a transaction.
 */
#include <sys/stat.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <lmdb.h>

#include "shared/log.h"
#include "shared/shm.h"
#include "shared/xmalloc.h"

#include "broker.h"

/* Address space only: the file grows with what is written. */
#define STORE_MAPSIZE   ((size_t)16 * 1024 * 1024 * 1024)
#define STORE_SCHEMA    "1"
#define STORE_ENV_FLAGS MDB_NOMETASYNC
/* LMDB 0.9's on-disk format (mdb.c MDB_MAGIC, MDB_DATA_VERSION). */
#define STORE_LMDB_MAGIC   0xBEEFC0DEU
#define STORE_LMDB_VERSION 1U
#define STORE_META_READ    152 /* page header + MDB_meta */

struct store_op {
	int so_db; /* enum store_db */
	char *so_key;
	size_t so_klen;
	char *so_value; /* NULL: delete */
	size_t so_vlen;
};

struct store {
	MDB_env *st_env;
	MDB_dbi st_dbi[STORE_DB_COUNT];
	MDB_dbi st_meta;
	struct store_op *st_ops;
	size_t st_nops;
	size_t st_cap;
	uint64_t st_txns;
	bool st_urgent; /* a registry record is queued */
	uint64_t st_first_ms; /* when the oldest queued op was queued */
	uint64_t st_queued_bytes;
};

static const char *const store_db_names[STORE_DB_COUNT] = {
	"workers",
	"assign",
	"journal",
	"chunks",
};

struct store_reader {
	struct store *sr_st;
	MDB_txn *sr_txn;
};

static void store_queue(struct store *st, int db, const void *key, size_t klen,
    const void *value, size_t vlen);
static void store_clear_ops(struct store *st);
static int store_mkdir(const char *dir, char *why, size_t whylen);
static int store_meta_parse(const unsigned char *pg, uint32_t *psize,
    uint64_t *last_pg, uint64_t *txnid);
static int store_walk(MDB_txn *txn, MDB_dbi dbi, const char *lo, const char *hi,
    const char *name, char *why, size_t whylen);
static int store_verify(struct store *st, const char *dir, char *why,
    size_t whylen);
static struct store *store_try(const char *dir, char *why, size_t whylen);
static const char *store_map_base(const void *p);
static void store_aside_name(const char *from, long now, char *to, size_t len);
static int store_quarantine(const char *dir, long now, char *moved,
    size_t movedlen);

static int
store_mkdir(const char *dir, char *why, size_t whylen)
{
	char *p, *s;

	s = xstrdup(dir);
	for (p = s + 1; *p != '\0'; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(s, 0700) == -1 && errno != EEXIST) {
			snprintf(why, whylen, "mkdir %s: %s", s,
			    strerror(errno));
			free(s);
			return -1;
		}
		*p = '/';
	}
	free(s);
	if (mkdir(dir, 0700) == -1 && errno != EEXIST) {
		snprintf(why, whylen, "mkdir: %s", strerror(errno));
		return -1;
	}
	return 0;
}

/*
 * One LMDB meta page as 64-bit LMDB 0.9 lays it out (mdb.c MDB_meta after
 * the 16-byte page header): magic, version, address, mapsize, two MDB_db
 * of 48 bytes (the first one's md_pad is the page size), last page,
 * txnid. Returns 0 and fills the out values when the magic and version
 * are LMDB's.
 */
static int
store_meta_parse(const unsigned char *pg, uint32_t *psize, uint64_t *last_pg,
    uint64_t *txnid)
{
	uint32_t magic, version;

	memcpy(&magic, pg + 16, 4);
	memcpy(&version, pg + 20, 4);
	if (magic != STORE_LMDB_MAGIC || version != STORE_LMDB_VERSION)
		return -1;
	memcpy(psize, pg + 40, 4);
	memcpy(last_pg, pg + 136, 8);
	memcpy(txnid, pg + 144, 8);
	return 0;
}

int
store_check_files(const char *dir, char *why, size_t whylen)
{
	unsigned char m0[STORE_META_READ], m1[STORE_META_READ];
	uint32_t ps0 = 0, ps1 = 0, psize;
	uint64_t last0 = 0, last1 = 0, tx0 = 0, tx1 = 0, last;
	bool ok0, ok1;
	struct stat sb;
	char path[PATH_MAX];
	int fd;

	if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
		snprintf(why, whylen, "not a directory");
		return -1;
	}
	snprintf(path, sizeof(path), "%s/data.mdb", dir);
	if (stat(path, &sb) == -1) {
		if (errno == ENOENT)
			return 0;
		snprintf(why, whylen, "data.mdb: %s", strerror(errno));
		return -1;
	}
	if (!S_ISREG(sb.st_mode)) {
		snprintf(why, whylen, "data.mdb is not a regular file");
		return -1;
	}
	if (sb.st_size == 0)
		return 0; /* LMDB initialises an empty file */
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) == -1) {
		snprintf(why, whylen, "data.mdb: %s", strerror(errno));
		return -1;
	}
	ok0 = pread(fd, m0, sizeof(m0), 0) == (ssize_t)sizeof(m0) &&
	    store_meta_parse(m0, &ps0, &last0, &tx0) == 0 && ps0 >= 512 &&
	    ps0 <= 65536 && (ps0 & (ps0 - 1)) == 0;
	ok1 = ok0 &&
	    pread(fd, m1, sizeof(m1), (off_t)ps0) == (ssize_t)sizeof(m1) &&
	    store_meta_parse(m1, &ps1, &last1, &tx1) == 0 && ps1 == ps0;
	close(fd);
	if (!ok0 || !ok1) {
		snprintf(why, whylen, "data.mdb: no valid LMDB meta pages");
		return -1;
	}
	/* LMDB opens the newer meta page; every page it names must be in
	 * the file, or reading it through the map raises SIGBUS. */
	psize = ps0;
	last = tx1 > tx0 ? last1 : last0;
	if (last > (uint64_t)sb.st_size / psize ||
	    (last + 1) * psize > (uint64_t)sb.st_size) {
		snprintf(why, whylen,
		    "data.mdb: %lld bytes, the meta page names %llu pages of "
		    "%u",
		    (long long)sb.st_size, (unsigned long long)last + 1, psize);
		return -1;
	}
	return 0;
}

/*
 * Reads every record of db through a cursor and checks that each key and
 * value lies inside the file's part of the map: what LMDB returns from a
 * damaged page is never dereferenced later.
 */
static int
store_walk(MDB_txn *txn, MDB_dbi dbi, const char *lo, const char *hi,
    const char *name, char *why, size_t whylen)
{
	MDB_cursor *cur;
	MDB_val k, v;
	int rv;

	if ((rv = mdb_cursor_open(txn, dbi, &cur)) != 0) {
		snprintf(why, whylen, "%s: %s", name, mdb_strerror(rv));
		return -1;
	}
	while ((rv = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) == 0) {
		if ((const char *)k.mv_data < lo ||
		    (const char *)k.mv_data + k.mv_size > hi ||
		    (const char *)v.mv_data < lo ||
		    v.mv_size > (size_t)(hi - (const char *)v.mv_data)) {
			rv = MDB_CORRUPTED;
			break;
		}
	}
	mdb_cursor_close(cur);
	if (rv != MDB_NOTFOUND) {
		snprintf(why, whylen, "%s: %s", name, mdb_strerror(rv));
		return -1;
	}
	return 0;
}

/*
 * The address data.mdb's first byte is mapped at: the /proc/self/maps
 * line holding p, a pointer LMDB returned into the map, less its file
 * offset. (mdb_env_info's me_mapaddr is the MDB_FIXEDMAP address only.)
 */
static const char *
store_map_base(const void *p)
{
	FILE *f;
	char line[PATH_MAX + 128];
	unsigned long lo, hi, off;
	const char *base = NULL;

	if ((f = fopen("/proc/self/maps", "r")) == NULL)
		return NULL;
	while (fgets(line, sizeof(line), f) != NULL) {
		if (sscanf(line, "%lx-%lx %*s %lx", &lo, &hi, &off) != 3)
			continue;
		if ((uintptr_t)p >= lo && (uintptr_t)p < hi) {
			base = (const char *)(uintptr_t)(lo - off);
			break;
		}
	}
	fclose(f);
	return base;
}

/* Walks each named database; opening them read the main one. */
static int
store_verify(struct store *st, const char *dir, char *why, size_t whylen)
{
	MDB_txn *txn;
	MDB_val k, v;
	struct stat sb;
	char path[PATH_MAX];
	const char *lo, *hi;
	int rv, i, ret = -1;

	snprintf(path, sizeof(path), "%s/data.mdb", dir);
	if (stat(path, &sb) == -1) {
		snprintf(why, whylen, "data.mdb: %s", strerror(errno));
		return -1;
	}
	if ((rv = mdb_txn_begin(st->st_env, NULL, MDB_RDONLY, &txn)) != 0) {
		snprintf(why, whylen, "read txn: %s", mdb_strerror(rv));
		return -1;
	}
	k.mv_data = "schema";
	k.mv_size = strlen("schema");
	if ((rv = mdb_get(txn, st->st_meta, &k, &v)) != 0) {
		snprintf(why, whylen, "meta: %s", mdb_strerror(rv));
		goto out;
	}
	if ((lo = store_map_base(v.mv_data)) == NULL) {
		snprintf(why, whylen, "cannot find the map");
		goto out;
	}
	hi = lo + sb.st_size;
	if (store_walk(txn, st->st_meta, lo, hi, "meta", why, whylen) == -1)
		goto out;
	for (i = 0; i < STORE_DB_COUNT; i++)
		if (store_walk(txn, st->st_dbi[i], lo, hi, store_db_names[i],
		        why, whylen) == -1)
			goto out;
	ret = 0;
out:
	mdb_txn_abort(txn);
	return ret;
}

/* Opens and checks the environment; NULL with the reason in why. */
static struct store *
store_try(const char *dir, char *why, size_t whylen)
{
	struct store *st;
	MDB_txn *txn = NULL;
	MDB_val k, v;
	int rv, i;

	if (store_mkdir(dir, why, whylen) == -1 ||
	    store_check_files(dir, why, whylen) == -1)
		return NULL;
	st = xcalloc(1, sizeof(*st));
	if ((rv = mdb_env_create(&st->st_env)) != 0) {
		free(st);
		snprintf(why, whylen, "%s", mdb_strerror(rv));
		return NULL;
	}
	if ((rv = mdb_env_set_maxdbs(st->st_env, STORE_DB_COUNT + 1)) != 0 ||
	    (rv = mdb_env_set_mapsize(st->st_env, STORE_MAPSIZE)) != 0 ||
	    (rv = mdb_env_open(st->st_env, dir, STORE_ENV_FLAGS, 0600)) != 0 ||
	    (rv = mdb_txn_begin(st->st_env, NULL, 0, &txn)) != 0)
		goto fail;
	for (i = 0; i < STORE_DB_COUNT; i++) {
		if ((rv = mdb_dbi_open(txn, store_db_names[i], MDB_CREATE,
		         &st->st_dbi[i])) != 0)
			goto fail;
	}
	if ((rv = mdb_dbi_open(txn, "meta", MDB_CREATE, &st->st_meta)) != 0)
		goto fail;
	k.mv_data = "schema";
	k.mv_size = strlen("schema");
	if ((rv = mdb_get(txn, st->st_meta, &k, &v)) == MDB_NOTFOUND) {
		v.mv_data = STORE_SCHEMA;
		v.mv_size = strlen(STORE_SCHEMA);
		if ((rv = mdb_put(txn, st->st_meta, &k, &v, 0)) != 0)
			goto fail;
	} else if (rv != 0) {
		goto fail;
	} else if (v.mv_size != strlen(STORE_SCHEMA) ||
	    memcmp(v.mv_data, STORE_SCHEMA, v.mv_size) != 0) {
		snprintf(why, whylen, "unknown schema");
		mdb_txn_abort(txn);
		mdb_env_close(st->st_env);
		free(st);
		return NULL;
	}
	rv = mdb_txn_commit(txn);
	txn = NULL;
	if (rv != 0)
		goto fail;
	if (store_verify(st, dir, why, whylen) == -1) {
		mdb_env_close(st->st_env);
		free(st);
		return NULL;
	}
	return st;
fail:
	snprintf(why, whylen, "%s", mdb_strerror(rv));
	if (txn != NULL)
		mdb_txn_abort(txn);
	mdb_env_close(st->st_env);
	free(st);
	return NULL;
}

/* "<from>.corrupt-<now>", or with ".<n>" added when that exists. */
static void
store_aside_name(const char *from, long now, char *to, size_t len)
{
	struct stat sb;
	int n;

	snprintf(to, len, "%s.corrupt-%ld", from, now);
	for (n = 1; n < 100 && lstat(to, &sb) == 0; n++)
		snprintf(to, len, "%s.corrupt-%ld.%d", from, now, n);
}

/*
 * Moves the state aside under a ".corrupt-<unixtime>" suffix: the LMDB
 * files, or the whole path when it is not a directory or its files cannot
 * be moved. The name moved is written to moved.
 */
static int
store_quarantine(const char *dir, long now, char *moved, size_t movedlen)
{
	static const char *const files[] = { "data.mdb", "lock.mdb" };
	char from[PATH_MAX], to[PATH_MAX + 32];
	struct stat sb;
	size_t i;
	int n = 0;

	if (stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)) {
		for (i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
			snprintf(from, sizeof(from), "%s/%s", dir, files[i]);
			store_aside_name(from, now, to, sizeof(to));
			if (rename(from, to) == 0) {
				if (n++ == 0)
					snprintf(moved, movedlen, "%s", to);
			} else if (errno != ENOENT)
				break;
		}
		if (i == sizeof(files) / sizeof(files[0])) {
			return n > 0 ? 0 : -1;
		}
	}
	store_aside_name(dir, now, to, sizeof(to));
	if (rename(dir, to) == -1)
		return -1;
	snprintf(moved, movedlen, "%s", to);
	return 0;
}

struct store *
store_open(const char *dir)
{
	struct store *st;
	char why[256], why2[256], moved[PATH_MAX + 32];
	long now = (long)time(NULL);

	why[0] = '\0';
	if ((st = store_try(dir, why, sizeof(why))) != NULL)
		return st;
	if (store_quarantine(dir, now, moved, sizeof(moved)) == -1) {
		log_error("%s: %s: unusable state (%s), cannot move it aside: "
		          "%s; running without persistence",
		    __func__, dir, why, strerror(errno));
		return NULL;
	}
	why2[0] = '\0';
	if ((st = store_try(dir, why2, sizeof(why2))) == NULL) {
		log_error("%s: %s: unusable state (%s), moved to %s; a new "
		          "one failed too (%s); running without persistence",
		    __func__, dir, why, moved, why2);
		return NULL;
	}
	log_error("%s: %s: unusable state (%s), moved to %s; starting from "
	          "empty state",
	    __func__, dir, why, moved);
	return st;
}

static void
store_clear_ops(struct store *st)
{
	size_t i;

	for (i = 0; i < st->st_nops; i++) {
		free(st->st_ops[i].so_key);
		free(st->st_ops[i].so_value);
	}
	st->st_nops = 0;
	st->st_urgent = false;
	st->st_queued_bytes = 0;
}

void
store_close(struct store *st)
{
	if (st == NULL)
		return;
	if (store_pending(st))
		(void)store_flush(st);
	store_clear_ops(st);
	free(st->st_ops);
	mdb_env_close(st->st_env);
	free(st);
}

static void
store_queue(struct store *st, int db, const void *key, size_t klen,
    const void *value, size_t vlen)
{
	struct store_op *op;

	if (st->st_nops == st->st_cap) {
		st->st_cap = st->st_cap ? st->st_cap * 2 : 16;
		st->st_ops =
		    xreallocarray(st->st_ops, st->st_cap, sizeof(*st->st_ops));
	}
	if (st->st_nops == 0)
		st->st_first_ms = shm_now_ms();
	op = &st->st_ops[st->st_nops++];
	op->so_db = db;
	op->so_key = xmalloc(klen ? klen : 1);
	memcpy(op->so_key, key, klen);
	op->so_klen = klen;
	op->so_value = NULL;
	op->so_vlen = vlen;
	if (value != NULL) {
		op->so_value = xmalloc(vlen ? vlen : 1);
		memcpy(op->so_value, value, vlen);
	}
	st->st_queued_bytes += klen + vlen;
	if (db == STORE_DB_WORKERS)
		st->st_urgent = true;
}

void
store_put(struct store *st, const char *key, const char *value)
{
	if (st != NULL)
		store_queue(st, STORE_DB_WORKERS, key, strlen(key), value,
		    strlen(value));
}

void
store_del(struct store *st, const char *key)
{
	if (st != NULL)
		store_queue(st, STORE_DB_WORKERS, key, strlen(key), NULL, 0);
}

void
store_put_db(struct store *st, enum store_db db, const void *key, size_t klen,
    const void *value, size_t vlen)
{
	if (st != NULL && klen > 0 && klen <= STORE_KEY_MAX)
		store_queue(st, db, key, klen, value, vlen);
}

void
store_del_db(struct store *st, enum store_db db, const void *key, size_t klen)
{
	if (st != NULL && klen > 0 && klen <= STORE_KEY_MAX)
		store_queue(st, db, key, klen, NULL, 0);
}

bool
store_flush_due(const struct store *st, uint64_t now_ms)
{
	if (st == NULL || st->st_nops == 0)
		return false;
	return st->st_urgent ||
	    (now_ms >= st->st_first_ms &&
	        now_ms - st->st_first_ms >= STORE_BEHIND_MS) ||
	    st->st_queued_bytes >= STORE_BATCH_BYTES;
}

bool
store_pending(const struct store *st)
{
	return st != NULL && st->st_nops > 0;
}

int
store_flush(struct store *st)
{
	MDB_txn *txn;
	MDB_val k, v;
	size_t i;
	int rv;

	if (st == NULL || st->st_nops == 0)
		return 0;
	if ((rv = mdb_txn_begin(st->st_env, NULL, 0, &txn)) != 0) {
		log_warnx("%s: begin: %s", __func__, mdb_strerror(rv));
		return -1;
	}
	for (i = 0; i < st->st_nops; i++) {
		const struct store_op *op = &st->st_ops[i];
		MDB_dbi dbi = st->st_dbi[op->so_db];

		k.mv_data = op->so_key;
		k.mv_size = op->so_klen;
		if (op->so_value == NULL) {
			rv = mdb_del(txn, dbi, &k, NULL);
			if (rv == MDB_NOTFOUND)
				rv = 0;
		} else {
			v.mv_data = op->so_value;
			v.mv_size = op->so_vlen;
			rv = mdb_put(txn, dbi, &k, &v, 0);
		}
		if (rv != 0) {
			log_warnx("%s: %s record: %s", __func__,
			    store_db_names[op->so_db], mdb_strerror(rv));
			mdb_txn_abort(txn);
			if (rv == MDB_MAP_FULL || rv == MDB_BAD_VALSIZE) {
				/* Not retryable: drop the batch, keep going. */
				store_clear_ops(st);
			}
			return -1;
		}
	}
	if ((rv = mdb_txn_commit(txn)) != 0) {
		log_warnx("%s: commit: %s", __func__, mdb_strerror(rv));
		return -1;
	}
	st->st_txns++;
	store_clear_ops(st);
	return 0;
}

int
store_each(struct store *st, store_each_cb cb, void *arg)
{
	MDB_txn *txn;
	MDB_cursor *cur;
	MDB_val k, v;
	char *key, *val;
	int rv;

	if (st == NULL)
		return 0;
	if ((rv = mdb_txn_begin(st->st_env, NULL, MDB_RDONLY, &txn)) != 0) {
		log_warnx("%s: begin: %s", __func__, mdb_strerror(rv));
		return -1;
	}
	if ((rv = mdb_cursor_open(txn, st->st_dbi[STORE_DB_WORKERS], &cur)) !=
	    0) {
		log_warnx("%s: cursor: %s", __func__, mdb_strerror(rv));
		mdb_txn_abort(txn);
		return -1;
	}
	while ((rv = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) == 0) {
		key = xstrndup(k.mv_data, k.mv_size);
		val = xstrndup(v.mv_data, v.mv_size);
		cb(arg, key, val);
		free(key);
		free(val);
	}
	mdb_cursor_close(cur);
	mdb_txn_abort(txn);
	if (rv != MDB_NOTFOUND) {
		log_warnx("%s: %s", __func__, mdb_strerror(rv));
		return -1;
	}
	return 0;
}

int
store_each_db(struct store *st, enum store_db db, store_each_bin_cb cb,
    void *arg)
{
	MDB_txn *txn;
	MDB_cursor *cur;
	MDB_val k, v;
	int rv;

	if (st == NULL)
		return 0;
	if ((rv = mdb_txn_begin(st->st_env, NULL, MDB_RDONLY, &txn)) != 0) {
		log_warnx("%s: begin: %s", __func__, mdb_strerror(rv));
		return -1;
	}
	if ((rv = mdb_cursor_open(txn, st->st_dbi[db], &cur)) != 0) {
		log_warnx("%s: cursor: %s", __func__, mdb_strerror(rv));
		mdb_txn_abort(txn);
		return -1;
	}
	/* The values stay valid until the read transaction ends. */
	while ((rv = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) == 0) {
		if (cb(arg, k.mv_data, k.mv_size, v.mv_data, v.mv_size) != 0) {
			rv = MDB_NOTFOUND;
			break;
		}
	}
	mdb_cursor_close(cur);
	mdb_txn_abort(txn);
	if (rv != MDB_NOTFOUND) {
		log_warnx("%s: %s", __func__, mdb_strerror(rv));
		return -1;
	}
	return 0;
}

uint64_t
store_txn_count(const struct store *st)
{
	return st != NULL ? st->st_txns : 0;
}

struct store_reader *
store_reader_begin(struct store *st)
{
	struct store_reader *r;
	int rv;

	if (st == NULL)
		return NULL;
	r = xcalloc(1, sizeof(*r));
	r->sr_st = st;
	if ((rv = mdb_txn_begin(st->st_env, NULL, MDB_RDONLY, &r->sr_txn)) !=
	    0) {
		log_warnx("%s: begin: %s", __func__, mdb_strerror(rv));
		free(r);
		return NULL;
	}
	return r;
}

int
store_reader_each(struct store_reader *r, enum store_db db,
    store_each_bin_cb cb, void *arg)
{
	MDB_cursor *cur;
	MDB_val k, v;
	int rv;

	if ((rv = mdb_cursor_open(r->sr_txn, r->sr_st->st_dbi[db], &cur)) !=
	    0) {
		log_warnx("%s: cursor: %s", __func__, mdb_strerror(rv));
		return -1;
	}
	while ((rv = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) == 0) {
		if (cb(arg, k.mv_data, k.mv_size, v.mv_data, v.mv_size) != 0) {
			rv = MDB_NOTFOUND;
			break;
		}
	}
	mdb_cursor_close(cur);
	if (rv != MDB_NOTFOUND) {
		log_warnx("%s: %s", __func__, mdb_strerror(rv));
		return -1;
	}
	return 0;
}

int
store_reader_get(struct store_reader *r, enum store_db db, const void *key,
    size_t klen, const void **val, size_t *vlen)
{
	MDB_val k, v;

	k.mv_data = (void *)key;
	k.mv_size = klen;
	if (mdb_get(r->sr_txn, r->sr_st->st_dbi[db], &k, &v) != 0)
		return -1;
	*val = v.mv_data;
	*vlen = v.mv_size;
	return 0;
}

void
store_reader_end(struct store_reader *r)
{
	if (r == NULL)
		return;
	mdb_txn_abort(r->sr_txn);
	free(r);
}
