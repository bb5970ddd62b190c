/*
 * driver.c: the mutation loop every standalone fuzz driver shares (see
 * driver.h). An xorshift generator keeps runs reproducible from a seed.
 */
#include "tests/fuzz/driver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DRIVER_BUF 16384

static uint64_t driver_rng;

static uint32_t
driver_next(void)
{
	driver_rng ^= driver_rng << 13;
	driver_rng ^= driver_rng >> 7;
	driver_rng ^= driver_rng << 17;
	return (uint32_t)(driver_rng >> 11);
}

static size_t
driver_mutate(const struct fuzz_target *t, uint8_t *buf, size_t len)
{
	size_t pos = 1 + driver_next() % len, tl;

	switch (driver_next() % 5) {
	case 0: /* flip a byte */
		if (pos < len)
			buf[pos] = (uint8_t)driver_next();
		return len;
	case 1: /* delete a run */
		tl = driver_next() % (t->ft_delete_max + 1);
		if (pos + tl <= len) {
			memmove(buf + pos, buf + pos + tl, len - pos - tl);
			len -= tl;
		}
		return len;
	case 2: /* the target's own insertion */
		return t->ft_insert == NULL
		    ? len
		    : t->ft_insert(buf, len, DRIVER_BUF, pos, driver_next());
	case 3: /* duplicate a run */
		tl = driver_next() % 64;
		if (pos + tl <= len && len + tl <= DRIVER_BUF) {
			memmove(buf + pos + tl, buf + pos, len - pos);
			len += tl;
		}
		return len;
	default: /* truncate */
		return pos;
	}
}

int
fuzz_driver_main(int argc, char **argv, const struct fuzz_target *t)
{
	static uint8_t buf[DRIVER_BUF];
	unsigned long iters = t->ft_iters, it;
	size_t len, k, nmut;

	if (argc > 1)
		iters = strtoul(argv[1], NULL, 10);
	driver_rng =
	    argc > 2 ? strtoull(argv[2], NULL, 10) : 0x9e3779b97f4a7c15ULL;
	if (driver_rng == 0)
		driver_rng = 1;
	for (it = 0; it < iters; it++) {
		buf[0] = (uint8_t)driver_next();
		len = 1 + t->ft_seed(buf + 1, DRIVER_BUF - 1, driver_next());
		nmut = driver_next() % 6;
		for (k = 0; k < nmut; k++)
			len = driver_mutate(t, buf, len);
		LLVMFuzzerTestOneInput(buf, len);
	}
	printf("%s: %lu inputs\n", t->ft_name, iters);
	return 0;
}
