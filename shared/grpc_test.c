/*
 * grpc_test.c: gRPC framing (prefix, reassembly across arbitrary splits,
 * the size limit, compressed messages), grpc-timeout and grpc-message
 * encodings, status names, and the channel's contract on a dead server:
 * UNAVAILABLE from the loop, never inside grpc_call_start, and fail-fast
 * while it backs off.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "shared/grpc.h"

struct collected {
	size_t n;
	size_t lens[8];
	uint8_t bytes[8][64];
};

static void
collect(void *arg, const uint8_t *msg, size_t len)
{
	struct collected *c = arg;

	assert_true(c->n < 8);
	assert_true(len <= 64);
	c->lens[c->n] = len;
	memcpy(c->bytes[c->n], msg, len);
	c->n++;
}

/* Three messages (one empty) framed back to back. */
static size_t
stream3(uint8_t *buf)
{
	size_t off = 0;

	grpc_frame_prefix(buf + off, 3);
	memcpy(buf + off + 5, "abc", 3);
	off += 8;
	grpc_frame_prefix(buf + off, 0);
	off += 5;
	grpc_frame_prefix(buf + off, 2);
	memcpy(buf + off + 5, "\x08\x01", 2);
	off += 7;
	return off;
}

static void
test_prefix(void **state)
{
	uint8_t p[5];

	(void)state;
	grpc_frame_prefix(p, 0x01020304);
	assert_memory_equal(p, "\x00\x01\x02\x03\x04", 5);
}

static void
test_reader_splits(void **state)
{
	uint8_t buf[64];
	size_t len = stream3(buf), cut, i;

	(void)state;
	/* Whole, then every two-piece split, then byte by byte. */
	for (cut = 0; cut <= len; cut++) {
		struct grpc_reader r;
		struct collected c = { 0 };

		grpc_reader_init(&r, 16);
		assert_int_equal(grpc_reader_feed(&r, buf, cut, collect, &c),
		    GRPC_OK);
		assert_int_equal(
		    grpc_reader_feed(&r, buf + cut, len - cut, collect, &c),
		    GRPC_OK);
		assert_int_equal(c.n, 3);
		assert_int_equal(c.lens[0], 3);
		assert_memory_equal(c.bytes[0], "abc", 3);
		assert_int_equal(c.lens[1], 0);
		assert_int_equal(c.lens[2], 2);
		assert_false(grpc_reader_partial(&r));
		grpc_reader_clear(&r);
	}
	{
		struct grpc_reader r;
		struct collected c = { 0 };

		grpc_reader_init(&r, 16);
		for (i = 0; i < len; i++) {
			assert_int_equal(
			    grpc_reader_feed(&r, buf + i, 1, collect, &c),
			    GRPC_OK);
			if (i == 2)
				assert_true(grpc_reader_partial(&r));
		}
		assert_int_equal(c.n, 3);
		grpc_reader_clear(&r);
	}
}

static void
test_reader_limits(void **state)
{
	struct grpc_reader r;
	struct collected c = { 0 };
	uint8_t buf[16];

	(void)state;
	grpc_reader_init(&r, 4);
	grpc_frame_prefix(buf, 5);
	assert_int_equal(grpc_reader_feed(&r, buf, 5, collect, &c),
	    GRPC_RESOURCE_EXHAUSTED);
	grpc_reader_clear(&r);

	grpc_reader_init(&r, 4);
	grpc_frame_prefix(buf, 4);
	assert_int_equal(grpc_reader_feed(&r, buf, 9, collect, &c), GRPC_OK);
	assert_int_equal(c.n, 1);
	grpc_reader_clear(&r);

	/* The compressed flag: nothing was negotiated. */
	grpc_reader_init(&r, 4);
	grpc_frame_prefix(buf, 1);
	buf[0] = 1;
	assert_int_equal(grpc_reader_feed(&r, buf, 6, collect, &c),
	    GRPC_INTERNAL);
	grpc_reader_clear(&r);
	/* A huge declared length fails before any allocation. */
	grpc_reader_init(&r, GRPC_DEFAULT_MAX_MESSAGE);
	memcpy(buf, "\x00\xff\xff\xff\xff", 5);
	assert_int_equal(grpc_reader_feed(&r, buf, 5, collect, &c),
	    GRPC_RESOURCE_EXHAUSTED);
	grpc_reader_clear(&r);
}

static void
test_timeout(void **state)
{
	char b[24];
	double s;

	(void)state;
	grpc_timeout_format(5.0, b, sizeof(b));
	assert_string_equal(b, "5000m");
	grpc_timeout_format(0.0001, b, sizeof(b));
	assert_string_equal(b, "1m");
	grpc_timeout_format(200000.0, b, sizeof(b));
	assert_string_equal(b, "200000S");
	assert_int_equal(grpc_timeout_parse("5000m", &s), 0);
	assert_true(s > 4.999 && s < 5.001);
	assert_int_equal(grpc_timeout_parse("2H", &s), 0);
	assert_true(s == 7200);
	assert_int_equal(grpc_timeout_parse("100u", &s), 0);
	assert_int_equal(grpc_timeout_parse("m", &s), -1);
	assert_int_equal(grpc_timeout_parse("12x", &s), -1);
	assert_int_equal(grpc_timeout_parse("123456789m", &s), -1);
	assert_int_equal(grpc_timeout_parse("-5S", &s), -1);
}

static void
test_message_text(void **state)
{
	char enc[64], dec[64];

	(void)state;
	grpc_message_encode("50% done\n\xc3\xa9", enc, sizeof(enc));
	assert_string_equal(enc, "50%25 done%0A%C3%A9");
	grpc_message_decode(enc, strlen(enc), dec, sizeof(dec));
	assert_string_equal(dec, "50% done\n\xc3\xa9");
	/* Bad escapes pass through; output is truncated, not overrun. */
	grpc_message_decode("%zz%4", 5, dec, sizeof(dec));
	assert_string_equal(dec, "%zz%4");
	grpc_message_decode("abcdef", 6, dec, 4);
	assert_string_equal(dec, "abc");
	grpc_message_encode("\n\n\n", enc, 5);
	assert_string_equal(enc, "%0A");
}

static void
test_codes(void **state)
{
	(void)state;
	assert_string_equal(grpc_code_name(GRPC_UNIMPLEMENTED),
	    "UNIMPLEMENTED");
	assert_string_equal(grpc_code_name(16), "UNAUTHENTICATED");
	assert_string_equal(grpc_code_name(17), "UNKNOWN_CODE");
	assert_string_equal(grpc_code_name(-1), "UNKNOWN_CODE");
	assert_int_equal(grpc_code_from_http(404), GRPC_UNIMPLEMENTED);
	assert_int_equal(grpc_code_from_http(503), GRPC_UNAVAILABLE);
	assert_int_equal(grpc_code_from_http(401), GRPC_UNAUTHENTICATED);
	assert_int_equal(grpc_code_from_http(500), GRPC_UNKNOWN);
}

struct outcome {
	int calls;
	int code;
	char msg[GRPC_MESSAGE_MAX];
	bool started; /* grpc_call_start has returned */
};

static void
on_close(void *arg, const struct grpc_status *st)
{
	struct outcome *o = arg;

	assert_true(o->started);
	o->calls++;
	o->code = st->gs_code;
	snprintf(o->msg, sizeof(o->msg), "%s", st->gs_message);
}

static struct grpc_channel *free_from_cb;

static void
on_close_free(void *arg, const struct grpc_status *st)
{
	on_close(arg, st);
	grpc_channel_free(free_from_cb);
	free_from_cb = NULL;
}

/* A port with nobody listening: bind, read the port, close. */
static int
dead_port(void)
{
	struct sockaddr_in sa;
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	close(fd);
	return ntohs(sa.sin_port);
}

static void
test_channel_dead_server(void **state)
{
	struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
	struct grpc_channel *ch;
	struct grpc_call *c;
	struct outcome a = { 0 }, b = { 0 }, d = { 0 };
	char url[64];

	(void)state;
	assert_null(grpc_channel_new(loop, "http://x:1", NULL, 0));
	assert_null(grpc_channel_new(loop, "grpc://nohost", NULL, 0));
	assert_null(grpc_channel_new(loop, "grpc://h:99999", NULL, 0));
	assert_null(grpc_channel_new(loop, "grpc://[::1:5", NULL, 0));
	snprintf(url, sizeof(url), "grpc://127.0.0.1:%d", dead_port());
	ch = grpc_channel_new(loop, url, NULL, 0);
	assert_non_null(ch);
	assert_string_equal(grpc_channel_url(ch), url);

	c = grpc_call_start(ch, "/p.S/M", "", "x", 1, 2.0, NULL, on_close, &a);
	assert_non_null(c);
	a.started = true;
	while (a.calls == 0)
		ev_run(loop, EVRUN_ONCE);
	assert_int_equal(a.calls, 1);
	assert_int_equal(a.code, GRPC_UNAVAILABLE);
	assert_non_null(strstr(a.msg, "connect"));

	/* Backing off: the next call fails fast, after start returns. */
	c = grpc_call_start(ch, "/p.S/M", "", NULL, 0, 2.0, NULL, on_close, &b);
	b.started = true;
	ev_run(loop, EVRUN_NOWAIT);
	assert_int_equal(b.calls, 1);
	assert_int_equal(b.code, GRPC_UNAVAILABLE);

	/* A cancelled call never calls back; free ends the rest quietly. */
	c = grpc_call_start(ch, "/p.S/M", "", NULL, 0, 2.0, NULL, on_close, &d);
	d.started = true;
	grpc_call_cancel(c);
	c = grpc_call_start(ch, "/p.S/M", "", NULL, 0, 2.0, NULL, on_close, &d);
	grpc_channel_free(ch);
	ev_run(loop, 0);
	assert_int_equal(d.calls, 0);

	/* The channel may be freed from a call's own callback. */
	ch = grpc_channel_new(loop, url, NULL, 0);
	free_from_cb = ch;
	c = grpc_call_start(ch, "/p.S/M", "", NULL, 0, 2.0, NULL, on_close_free,
	    &d);
	d.started = true;
	assert_non_null(grpc_call_start(ch, "/p.S/M", "", NULL, 0, 2.0, NULL,
	    on_close, &a));
	ev_run(loop, 0);
	assert_int_equal(d.calls, 1);
	assert_null(free_from_cb);
	ev_loop_destroy(loop);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_prefix),
		cmocka_unit_test(test_reader_splits),
		cmocka_unit_test(test_reader_limits),
		cmocka_unit_test(test_timeout),
		cmocka_unit_test(test_message_text),
		cmocka_unit_test(test_codes),
		cmocka_unit_test(test_channel_dead_server),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
