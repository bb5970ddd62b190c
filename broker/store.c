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
#include <stdlib.h>
#include <string.h>

#include <lmdb.h>

#include "shared/log.h"
#include "shared/shm.h"
#include "shared/xmalloc.h"

#include "broker.h"

/* Address space only: the file grows with what is written. */
#define STORE_MAPSIZE   ((size_t)16 * 1024 * 1024 * 1024)
#define STORE_SCHEMA    "1"
#define STORE_ENV_FLAGS MDB_NOMETASYNC

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
static int store_mkdir(const char *dir);

static int
store_mkdir(const char *dir)
{
	char *p, *s;

	s = xstrdup(dir);
	for (p = s + 1; *p != '\0'; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(s, 0700) == -1 && errno != EEXIST) {
			log_warn("%s: mkdir %s", __func__, s);
			free(s);
			return -1;
		}
		*p = '/';
	}
	free(s);
	if (mkdir(dir, 0700) == -1 && errno != EEXIST) {
		log_warn("%s: mkdir %s", __func__, dir);
		return -1;
	}
	return 0;
}

struct store *
store_open(const char *dir)
{
	struct store *st;
	MDB_txn *txn;
	MDB_val k, v;
	int rv, i;

	if (store_mkdir(dir) == -1)
		return NULL;
	st = xcalloc(1, sizeof(*st));
	if ((rv = mdb_env_create(&st->st_env)) != 0)
		goto fail;
	if ((rv = mdb_env_set_maxdbs(st->st_env, STORE_DB_COUNT + 1)) != 0 ||
	    (rv = mdb_env_set_mapsize(st->st_env, STORE_MAPSIZE)) != 0 ||
	    (rv = mdb_env_open(st->st_env, dir, STORE_ENV_FLAGS, 0600)) != 0)
		goto fail_env;
	if ((rv = mdb_txn_begin(st->st_env, NULL, 0, &txn)) != 0)
		goto fail_env;
	for (i = 0; i < STORE_DB_COUNT; i++) {
		if ((rv = mdb_dbi_open(txn, store_db_names[i], MDB_CREATE,
		         &st->st_dbi[i])) != 0) {
			mdb_txn_abort(txn);
			goto fail_env;
		}
	}
	if ((rv = mdb_dbi_open(txn, "meta", MDB_CREATE, &st->st_meta)) != 0) {
		mdb_txn_abort(txn);
		goto fail_env;
	}
	k.mv_data = "schema";
	k.mv_size = strlen("schema");
	if (mdb_get(txn, st->st_meta, &k, &v) == MDB_NOTFOUND) {
		v.mv_data = STORE_SCHEMA;
		v.mv_size = strlen(STORE_SCHEMA);
		if ((rv = mdb_put(txn, st->st_meta, &k, &v, 0)) != 0) {
			mdb_txn_abort(txn);
			goto fail_env;
		}
	} else if (v.mv_size != strlen(STORE_SCHEMA) ||
	    memcmp(v.mv_data, STORE_SCHEMA, v.mv_size) != 0) {
		log_warnx("%s: %s: unknown schema %.*s", __func__, dir,
		    (int)v.mv_size, (const char *)v.mv_data);
		mdb_txn_abort(txn);
		mdb_env_close(st->st_env);
		free(st);
		return NULL;
	}
	if ((rv = mdb_txn_commit(txn)) != 0)
		goto fail_env;
	return st;
fail_env:
	mdb_env_close(st->st_env);
fail:
	log_warnx("%s: %s: %s", __func__, dir, mdb_strerror(rv));
	free(st);
	return NULL;
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

	if (st->st_nops == 0)
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
	return st->st_txns;
}

struct store_reader *
store_reader_begin(struct store *st)
{
	struct store_reader *r = xcalloc(1, sizeof(*r));
	int rv;

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
