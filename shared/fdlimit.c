/* fdlimit.c: raises the soft RLIMIT_NOFILE to the hard limit. */
#include <sys/resource.h>

#include <stdio.h>

#include "shared/fdlimit.h"
#include "shared/log.h"

static rlim_t fdlimit_nr_open(void);

/* The kernel refuses a soft limit above fs.nr_open, even with an
 * infinite hard limit. */
static rlim_t
fdlimit_nr_open(void)
{
	FILE *f;
	unsigned long v = 0;

	if ((f = fopen("/proc/sys/fs/nr_open", "r")) == NULL)
		return 1048576; /* the kernel's default */
	if (fscanf(f, "%lu", &v) != 1 || v == 0)
		v = 1048576;
	fclose(f);
	return (rlim_t)v;
}

long
fdlimit_raise(void)
{
	struct rlimit rl;
	rlim_t want;

	if (getrlimit(RLIMIT_NOFILE, &rl) == -1) {
		log_warn("%s: getrlimit", __func__);
		return -1;
	}
	want = rl.rlim_max;
	if (want == RLIM_INFINITY || want > fdlimit_nr_open())
		want = fdlimit_nr_open();
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur >= want)
		return (long)rl.rlim_cur;
	rl.rlim_cur = want;
	if (setrlimit(RLIMIT_NOFILE, &rl) == -1) {
		log_warn("%s: setrlimit %lu", __func__, (unsigned long)want);
		return -1;
	}
	return (long)want;
}
