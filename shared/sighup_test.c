/* sighup_test.c: a SIGHUP neither stops the process nor the loop early. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include <cmocka.h>

#include "shared/log.h"
#include "shared/sighup.h"

static int ticks;

static void
tick_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	(void)revents;
	/* Several SIGHUPs while the loop runs; it must still be running. */
	if (++ticks <= 3) {
		assert_int_equal(kill(getpid(), SIGHUP), 0);
		return;
	}
	ev_timer_stop(loop, w);
	ev_break(loop, EVBREAK_ALL);
}

static void
test_sighup_is_a_noop(void **state)
{
	struct ev_loop *loop;
	ev_timer t;

	(void)state;
	loop = ev_default_loop(0);
	assert_non_null(loop);
	sighup_ignore(loop);
	ev_timer_init(&t, tick_cb, 0.01, 0.01);
	ev_timer_start(loop, &t);
	ev_run(loop, 0);
	assert_int_equal(ticks, 4);
	/* Only the ignored watcher is left, and it does not hold the loop. */
	ev_run(loop, 0);
	assert_int_equal(kill(getpid(), SIGHUP), 0);
	ev_run(loop, EVRUN_NOWAIT);
	ev_loop_destroy(loop);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sighup_is_a_noop),
	};

	log_init("sighup_test", LOG_LEVEL_INFO);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
