/*
 * arena.h: a region allocator with cleanup hooks, for memory that lives
 * exactly as long as one request. Everything allocated from an arena is
 * freed by one arena_reset; the hooks registered on it run first, newest
 * first, so a request's upstream handles, timers and outside allocations
 * are released whichever way the request ends.
 *
 * Not thread-safe: an arena belongs to one loop.
 */
#ifndef SHARED_ARENA_H
#define SHARED_ARENA_H

#include <stddef.h>

typedef void (*arena_cleanup_cb)(void *arg);

struct arena_block;
struct arena_cleanup;

/* Embedded in its owner; zero-initialised or arena_init'ed. */
struct arena {
	struct arena_block *ar_blocks; /* newest first */
	struct arena_cleanup *ar_cleanups; /* newest first */
	size_t ar_used; /* bytes handed out since the last reset */
};

void arena_init(struct arena *a);
/*
 * n zeroed bytes, aligned for any type, valid until the next arena_reset.
 * NULL when out of memory (or n == 0).
 */
void *arena_alloc(struct arena *a, size_t n);
/*
 * Registers fn(arg) to run at the next arena_reset, before the memory is
 * freed (so arg may point into the arena). Hooks run newest first, each
 * once. Returns 0, or -1 when out of memory (fn is not registered).
 */
int arena_cleanup_add(struct arena *a, arena_cleanup_cb fn, void *arg);
/*
 * Runs the hooks, then frees every allocation. A hook may not allocate
 * from or register on the arena being reset. The arena is reusable after.
 */
void arena_reset(struct arena *a);
/* Bytes allocated since the last reset (metric, limits). */
size_t arena_used(const struct arena *a);

#endif /* SHARED_ARENA_H */
