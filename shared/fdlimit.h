/*
 * fdlimit.h: the process's file-descriptor budget. Every process raises
 * its soft RLIMIT_NOFILE to the hard limit at startup, so the limit the
 * operator granted (ulimit -Hn, LimitNOFILE=) is the one that applies and
 * a few hundred idle clients do not exhaust a default soft limit of 1024.
 */
#ifndef SHARED_FDLIMIT_H
#define SHARED_FDLIMIT_H

/*
 * Sets the soft RLIMIT_NOFILE to the hard limit (capped at the kernel's
 * nr_open when the hard limit is infinite). Call once from main, before
 * opening sockets. Returns the soft limit now in force, or -1 when it
 * cannot be read or raised (logged with log_warn; the process goes on
 * with its old limit).
 */
long fdlimit_raise(void);

#endif /* SHARED_FDLIMIT_H */
