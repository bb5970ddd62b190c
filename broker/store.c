/*
 * store.c: the broker's LMDB environment in --state-dir, written behind.
 *
 * Callers queue puts and deletes; store_flush writes the whole queue in
 * one write transaction. The broker flushes from an ev_prepare watcher,
 * i.e. once per loop turn that changed something, so a record is on disk
 * before the loop next sleeps (well under the 100 ms bound DESIGN.md sets)
 * and decisions never wait for a transaction.
 */
#include <sys/stat.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <lmdb.h>

#include "shared/log.h"
#include "shared/xmalloc.h"

#include "broker.h"

#define STORE_MAPSIZE (64UL * 1024 * 1024)
#define STORE_SCHEMA  "1"

struct store_op {
	char *so_key;
	char *so_value; /* NULL: delete */
};

struct store {
	MDB_env *st_env;
	MDB_dbi st_workers;
	MDB_dbi st_meta;
	struct store_op *st_ops;
	size_t st_nops;
	size_t st_cap;
	uint64_t st_txns;
};

static void store_queue(struct store *st, const char *key, const char *value);
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
	int rv;

	if (store_mkdir(dir) == -1)
		return NULL;
	st = xcalloc(1, sizeof(*st));
	if ((rv = mdb_env_create(&st->st_env)) != 0)
		goto fail;
	if ((rv = mdb_env_set_maxdbs(st->st_env, 4)) != 0 ||
	    (rv = mdb_env_set_mapsize(st->st_env, STORE_MAPSIZE)) != 0 ||
	    (rv = mdb_env_open(st->st_env, dir, 0, 0600)) != 0)
		goto fail_env;
	if ((rv = mdb_txn_begin(st->st_env, NULL, 0, &txn)) != 0)
		goto fail_env;
	if ((rv = mdb_dbi_open(txn, "workers", MDB_CREATE, &st->st_workers)) !=
	        0 ||
	    (rv = mdb_dbi_open(txn, "meta", MDB_CREATE, &st->st_meta)) != 0) {
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
store_queue(struct store *st, const char *key, const char *value)
{
	if (st->st_nops == st->st_cap) {
		st->st_cap = st->st_cap ? st->st_cap * 2 : 16;
		st->st_ops =
		    xreallocarray(st->st_ops, st->st_cap, sizeof(*st->st_ops));
	}
	st->st_ops[st->st_nops].so_key = xstrdup(key);
	st->st_ops[st->st_nops].so_value = value ? xstrdup(value) : NULL;
	st->st_nops++;
}

void
store_put(struct store *st, const char *key, const char *value)
{
	if (st != NULL)
		store_queue(st, key, value);
}

void
store_del(struct store *st, const char *key)
{
	if (st != NULL)
		store_queue(st, key, NULL);
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
		k.mv_data = st->st_ops[i].so_key;
		k.mv_size = strlen(st->st_ops[i].so_key);
		if (st->st_ops[i].so_value == NULL) {
			rv = mdb_del(txn, st->st_workers, &k, NULL);
			if (rv == MDB_NOTFOUND)
				rv = 0;
		} else {
			v.mv_data = st->st_ops[i].so_value;
			v.mv_size = strlen(st->st_ops[i].so_value);
			rv = mdb_put(txn, st->st_workers, &k, &v, 0);
		}
		if (rv != 0) {
			log_warnx("%s: %s: %s", __func__, st->st_ops[i].so_key,
			    mdb_strerror(rv));
			mdb_txn_abort(txn);
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
	if ((rv = mdb_cursor_open(txn, st->st_workers, &cur)) != 0) {
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

uint64_t
store_txn_count(const struct store *st)
{
	return st->st_txns;
}
