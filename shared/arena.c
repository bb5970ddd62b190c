/*
 * arena.c: see arena.h. Small allocations are carved from 4 KiB blocks;
 * a large one gets a block of its own, so the waste stays bounded.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shared/arena.h"

#define ARENA_BLOCK 4096
#define ARENA_ALIGN 16

struct arena_block {
	struct arena_block *ab_next;
	size_t ab_size; /* usable bytes after the header */
	size_t ab_off;
	_Alignas(ARENA_ALIGN) unsigned char ab_data[];
};

struct arena_cleanup {
	struct arena_cleanup *ac_next;
	arena_cleanup_cb ac_fn;
	void *ac_arg;
};

void
arena_init(struct arena *a)
{
	a->ar_blocks = NULL;
	a->ar_cleanups = NULL;
	a->ar_used = 0;
}

static struct arena_block *
arena_block_new(struct arena *a, size_t size)
{
	struct arena_block *b;

	if ((b = malloc(sizeof(*b) + size)) == NULL)
		return NULL;
	b->ab_size = size;
	b->ab_off = 0;
	b->ab_next = a->ar_blocks;
	a->ar_blocks = b;
	return b;
}

void *
arena_alloc(struct arena *a, size_t n)
{
	struct arena_block *b = a->ar_blocks;
	size_t need;
	void *p;

	if (n == 0 || n > SIZE_MAX - 2 * ARENA_ALIGN - ARENA_BLOCK)
		return NULL;
	need = (n + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
	if (need > ARENA_BLOCK / 4) {
		/* Its own block, behind the current one so that the
		 * current block's free space stays usable. */
		struct arena_block *big = malloc(sizeof(*big) + need);

		if (big == NULL)
			return NULL;
		big->ab_size = big->ab_off = need;
		if (b != NULL) {
			big->ab_next = b->ab_next;
			b->ab_next = big;
		} else {
			big->ab_next = NULL;
			a->ar_blocks = big;
		}
		a->ar_used += need;
		memset(big->ab_data, 0, n);
		return big->ab_data;
	}
	if (b == NULL || b->ab_size - b->ab_off < need) {
		if ((b = arena_block_new(a, ARENA_BLOCK)) == NULL)
			return NULL;
	}
	p = b->ab_data + b->ab_off;
	b->ab_off += need;
	a->ar_used += need;
	memset(p, 0, n);
	return p;
}

int
arena_cleanup_add(struct arena *a, arena_cleanup_cb fn, void *arg)
{
	struct arena_cleanup *c;

	if ((c = malloc(sizeof(*c))) == NULL)
		return -1;
	c->ac_fn = fn;
	c->ac_arg = arg;
	c->ac_next = a->ar_cleanups;
	a->ar_cleanups = c;
	return 0;
}

void
arena_reset(struct arena *a)
{
	struct arena_cleanup *c;
	struct arena_block *b;

	/* Unlinked before it runs: a hook never runs twice. */
	while ((c = a->ar_cleanups) != NULL) {
		a->ar_cleanups = c->ac_next;
		c->ac_fn(c->ac_arg);
		free(c);
	}
	while ((b = a->ar_blocks) != NULL) {
		a->ar_blocks = b->ab_next;
		free(b);
	}
	a->ar_used = 0;
}

size_t
arena_used(const struct arena *a)
{
	return a->ar_used;
}
