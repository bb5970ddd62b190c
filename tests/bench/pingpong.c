/*
 * pingpong.c: measures the round trip of a message over a Unix socketpair
 * between two processes, the floor under any IPC decision round trip.
 *
 * The parent writes a message, a forked child reads it whole and writes it
 * back, the parent reads it whole; each round trip is timed with
 * CLOCK_MONOTONIC. Both sides block in read(2), so every round trip pays two
 * wake-ups, as a request/reply between two event loops does.
 *
 * usage: bench-pingpong [--size BYTES] [--count N] [--warmup N]
 * Prints one JSON object on stdout:
 *   {"size":256,"count":20000,"p50_us":..,"p99_us":..,"mean_us":..,
 *    "round_trips_per_s":..}
 */
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shared/log.h"
#include "shared/xmalloc.h"

#define PINGPONG_MAX_SIZE (1024 * 1024)

static uint64_t
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Reads exactly len bytes; 0 on success, -1 on error or end of file. */
static int
read_full(int fd, char *buf, size_t len)
{
	size_t got = 0;
	ssize_t n;

	while (got < len) {
		n = read(fd, buf + got, len - got);
		if (n == -1 && errno == EINTR)
			continue;
		if (n == -1) {
			log_warn("%s: read", __func__);
			return -1;
		}
		if (n == 0)
			return -1;
		got += (size_t)n;
	}
	return 0;
}

/* Writes exactly len bytes; 0 on success, -1 on error. */
static int
write_full(int fd, const char *buf, size_t len)
{
	size_t put = 0;
	ssize_t n;

	while (put < len) {
		n = write(fd, buf + put, len - put);
		if (n == -1 && errno == EINTR)
			continue;
		if (n == -1) {
			log_warn("%s: write", __func__);
			return -1;
		}
		put += (size_t)n;
	}
	return 0;
}

/* The child: echoes messages of size bytes until the parent closes. */
static void
echo_loop(int fd, size_t size)
{
	char *buf = xmalloc(size);

	while (read_full(fd, buf, size) == 0) {
		if (write_full(fd, buf, size) == -1)
			break;
	}
	free(buf);
}

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* The nearest-rank quantile q (0..1) of sorted v[0..n-1], n > 0. */
static uint64_t
quantile(const uint64_t *v, size_t n, double q)
{
	size_t rank = (size_t)(q * (double)n + 0.999999);

	if (rank < 1)
		rank = 1;
	if (rank > n)
		rank = n;
	return v[rank - 1];
}

static long
parse_count(const char *flag, const char *s, long lo, long hi)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
		fatalx("%s: %s: expected an integer in [%ld, %ld]", __func__,
		    flag, lo, hi);
	return v;
}

static void
usage(void)
{
	fprintf(stderr,
	    "usage: bench-pingpong [--size BYTES] [--count N] "
	    "[--warmup N]\n");
	exit(2);
}

int
main(int argc, char **argv)
{
	size_t size = 256, count = 20000, warmup = 1000, i;
	uint64_t *rtt, t0, t1, total = 0, start, elapsed;
	int sv[2], status, rc = 0;
	char *buf;
	pid_t pid;

	log_init("bench-pingpong", LOG_LEVEL_INFO);
	/* Flag and value pairs. */
	for (i = 1; i < (size_t)argc; i += 2) {
		if (i + 1 >= (size_t)argc)
			usage();
		if (strcmp(argv[i], "--size") == 0)
			size = (size_t)parse_count(argv[i], argv[i + 1], 1,
			    PINGPONG_MAX_SIZE);
		else if (strcmp(argv[i], "--count") == 0)
			count = (size_t)parse_count(argv[i], argv[i + 1], 1,
			    10000000);
		else if (strcmp(argv[i], "--warmup") == 0)
			warmup = (size_t)parse_count(argv[i], argv[i + 1], 0,
			    10000000);
		else
			usage();
	}

	signal(SIGPIPE, SIG_IGN);
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == -1)
		fatal("%s: socketpair", __func__);
	if ((pid = fork()) == -1)
		fatal("%s: fork", __func__);
	if (pid == 0) {
		close(sv[0]);
		echo_loop(sv[1], size);
		close(sv[1]);
		_exit(0);
	}
	close(sv[1]);

	buf = xmalloc(size);
	memset(buf, 'p', size);
	rtt = xcalloc(count, sizeof(*rtt));
	for (i = 0; i < warmup; i++) {
		if (write_full(sv[0], buf, size) == -1 ||
		    read_full(sv[0], buf, size) == -1)
			fatalx("%s: warm-up round trip %zu failed", __func__,
			    i);
	}
	start = now_ns();
	for (i = 0; i < count; i++) {
		t0 = now_ns();
		if (write_full(sv[0], buf, size) == -1 ||
		    read_full(sv[0], buf, size) == -1) {
			log_warnx("%s: round trip %zu failed", __func__, i);
			rc = 1;
			break;
		}
		t1 = now_ns();
		rtt[i] = t1 - t0;
		total += rtt[i];
	}
	elapsed = now_ns() - start;
	close(sv[0]);
	while (waitpid(pid, &status, 0) == -1 && errno == EINTR)
		;

	if (rc == 0) {
		qsort(rtt, count, sizeof(*rtt), cmp_u64);
		printf("{\"size\":%zu,\"count\":%zu,\"p50_us\":%.1f,"
		       "\"p99_us\":%.1f,\"mean_us\":%.1f,"
		       "\"round_trips_per_s\":%.0f}\n",
		    size, count, (double)quantile(rtt, count, 0.50) / 1e3,
		    (double)quantile(rtt, count, 0.99) / 1e3,
		    (double)total / (double)count / 1e3,
		    (double)count * 1e9 / (double)elapsed);
	}
	free(rtt);
	free(buf);
	return rc;
}
