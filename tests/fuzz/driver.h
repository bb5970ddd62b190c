/*
 * driver.h: the standalone driver of the fuzz targets, for builds without
 * libFuzzer (the ctest entries http_fuzz, sp_fuzz, rpc_fuzz).
 *
 * Each iteration takes one of the target's seed inputs, applies up to five
 * random mutations (flip a byte, delete a run, the target's own insertion,
 * duplicate a run, truncate) and hands the result to
 * LLVMFuzzerTestOneInput. Byte 0 of every input is random and never
 * mutated away: the targets read it to pick piece sizes. Runs are
 * reproducible: `prog [iterations] [seed]`.
 */
#ifndef TESTS_FUZZ_DRIVER_H
#define TESTS_FUZZ_DRIVER_H

#include <stddef.h>
#include <stdint.h>

struct fuzz_target {
	const char *ft_name; /* printed with the count at the end */
	unsigned long ft_iters; /* default iterations */
	size_t ft_delete_max; /* longest run a deletion removes, minus 1 */
	/* Writes seed number `pick` (any value; the target reduces it) into
	 * buf, at most cap bytes; returns its length. */
	size_t (*ft_seed)(uint8_t *buf, size_t cap, uint32_t pick);
	/* Optional: inserts the target's own bytes at pos (pick is random);
	 * returns the new length, or len when they do not fit in cap. */
	size_t (*ft_insert)(uint8_t *buf, size_t len, size_t cap, size_t pos,
	    uint32_t pick);
};

int LLVMFuzzerTestOneInput(const uint8_t *, size_t);

/* Runs the target as argv asks; returns main's exit status. */
int fuzz_driver_main(int argc, char **argv, const struct fuzz_target *);

#endif /* TESTS_FUZZ_DRIVER_H */
