/*
 * portlock.h: one gateway per host:port.
 *
 * Frontends bind their port with SO_REUSEPORT, so the kernel would let a
 * second gateway of the same user share it and take part of the traffic.
 * The claim on host:port is an abstract unix socket named after them
 * ("smg-c/port/<port>/<host>"): abstract names live in the network
 * namespace, as ports do, and vanish with the process that holds them, so
 * a crash never leaves a stale claim. The holder (the launcher, or the
 * broker when a supervisor runs the processes) answers each connection
 * with one line, "<pid> <run dir>\n", which tells a process starting later
 * whether the port belongs to its own gateway (same --run-dir) or to
 * another one.
 */
#ifndef SHARED_PORTLOCK_H
#define SHARED_PORTLOCK_H

#include <limits.h>

#include <ev.h>

enum portlock_state {
	PORTLOCK_TAKEN = 0, /* this process holds the claim now */
	PORTLOCK_FREE, /* nobody holds it (portlock_query only) */
	PORTLOCK_SAME, /* held by a process of this gateway (same run dir) */
	PORTLOCK_OTHER, /* held by another gateway: see the owner */
	PORTLOCK_ERROR, /* the claim could not be checked; errno is set */
};

struct portlock_owner {
	long po_pid;
	char po_run_dir[PATH_MAX];
};

/*
 * Claims host:port for the gateway whose run dir is run_dir. On
 * PORTLOCK_TAKEN a watcher on loop (which does not keep ev_run going)
 * answers later queries until portlock_release or exit; the socket is
 * close-on-exec, so children do not inherit the claim. PORTLOCK_SAME and
 * PORTLOCK_OTHER fill owner. One claim per process.
 */
enum portlock_state portlock_take(struct ev_loop *loop, const char *host,
    long port, const char *run_dir, struct portlock_owner *owner);

/*
 * Who holds host:port, without claiming it: PORTLOCK_FREE, _SAME or
 * _OTHER (owner filled for the last two). Waits at most 1 s for the
 * holder's answer.
 */
enum portlock_state portlock_query(const char *host, long port,
    const char *run_dir, struct portlock_owner *owner);

/* Gives up this process's claim, if it holds one. */
void portlock_release(struct ev_loop *loop);
/*
 * portlock_take for a process that must hold the port to start: returns
 * when this gateway (run_dir) holds it; a port held by another gateway
 * ends the process with exit 2 and one line naming the holder; an error
 * is fatal. Startup only.
 */
void portlock_claim(struct ev_loop *loop, const char *host, long port,
    const char *run_dir);

#endif /* SHARED_PORTLOCK_H */
