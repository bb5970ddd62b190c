/*
 * url_test.c: the URL grammar on the shapes the gateway meets: worker
 * URLs with and without port, prefix or rank, IPv6 literals, user
 * information, and what must be refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "shared/url.h"

static void
assert_span(const char *p, size_t len, const char *want)
{
	assert_int_equal(len, strlen(want));
	assert_memory_equal(p, want, len);
}

static void
test_worker_urls(void **state)
{
	const char *s;
	struct url u;

	(void)state;
	s = "http://10.0.0.1:8000";
	assert_int_equal(url_parse(s, &u), 0);
	assert_string_equal(u.u_scheme, "http");
	assert_string_equal(u.u_host, "10.0.0.1");
	assert_true(u.u_port_set);
	assert_int_equal(u.u_port, 8000);
	assert_false(u.u_ipv6);
	assert_false(u.u_userinfo);
	assert_int_equal(u.u_rank, -1);
	assert_span(u.u_authority, u.u_authority_len, "10.0.0.1:8000");
	assert_span(u.u_path, u.u_path_len, "");
	assert_int_equal(url_origin_len(&u, s), strlen(s));

	s = "HTTPS://Worker.example/v1/prefix/?a=1&b=2#frag";
	assert_int_equal(url_parse(s, &u), 0);
	assert_true(url_scheme_is(&u, "https"));
	assert_string_equal(u.u_host, "Worker.example");
	assert_false(u.u_port_set);
	assert_int_equal(u.u_port, 443);
	assert_span(u.u_authority, u.u_authority_len, "Worker.example");
	assert_span(u.u_path, u.u_path_len, "/v1/prefix/");
	assert_span(u.u_query, u.u_query_len, "a=1&b=2");
	assert_true(u.u_fragment);
	assert_int_equal(url_origin_len(&u, s),
	    strlen("HTTPS://Worker.example"));

	assert_int_equal(url_parse("grpc://h:50051/", &u), 0);
	assert_int_equal(u.u_port, 50051);
	assert_int_equal(url_parse("grpcs://h", &u), 0);
	assert_false(u.u_port_set);
	assert_int_equal(u.u_port, 443);
	assert_int_equal(url_parse("grpc://h", &u), 0);
	assert_int_equal(u.u_port, 80);
	assert_int_equal(url_parse("tcp://h:5557", &u), 0);
	assert_int_equal(u.u_port, 5557);
	assert_int_equal(url_parse("tcp://h", &u), 0);
	assert_int_equal(u.u_port, 0);
}

static void
test_ipv6(void **state)
{
	struct url u;

	(void)state;
	assert_int_equal(url_parse("http://[::1]:8000/x", &u), 0);
	assert_string_equal(u.u_host, "::1");
	assert_true(u.u_ipv6);
	assert_int_equal(u.u_port, 8000);
	assert_span(u.u_authority, u.u_authority_len, "[::1]:8000");
	assert_int_equal(url_parse("http://[2001:db8::2]", &u), 0);
	assert_string_equal(u.u_host, "2001:db8::2");
	assert_int_equal(u.u_port, 80);
	assert_int_equal(url_parse("http://[::1:8000", &u), -1);
}

static void
test_rank_and_userinfo(void **state)
{
	struct url u;

	(void)state;
	assert_int_equal(url_parse("http://10.0.0.1:8000@3", &u), 0);
	assert_string_equal(u.u_host, "10.0.0.1");
	assert_int_equal(u.u_port, 8000);
	assert_int_equal(u.u_rank, 3);
	assert_false(u.u_userinfo);
	assert_span(u.u_authority, u.u_authority_len, "10.0.0.1:8000");
	assert_int_equal(url_parse("grpc://h@2", &u), 0);
	assert_string_equal(u.u_host, "h");
	assert_int_equal(u.u_rank, 2);
	assert_false(u.u_userinfo);
	assert_int_equal(url_parse("http://h:1/a@2", &u), 0);
	assert_int_equal(u.u_rank, -1);
	assert_span(u.u_path, u.u_path_len, "/a@2");
	assert_int_equal(url_parse("http://[::1]@0", &u), 0);
	assert_int_equal(u.u_rank, 0);
	assert_string_equal(u.u_host, "::1");

	assert_int_equal(url_parse("http://user:pw@host:81/p", &u), 0);
	assert_true(u.u_userinfo);
	assert_string_equal(u.u_host, "host");
	assert_int_equal(u.u_port, 81);
	assert_int_equal(u.u_rank, -1);
	assert_int_equal(url_parse("http://user@host", &u), 0);
	assert_true(u.u_userinfo);
	assert_string_equal(u.u_host, "host");
}

static void
test_rank_suffix(void **state)
{
	char b[32];

	(void)state;
	assert_int_equal(url_rank("http://h:8000@3"), 3);
	assert_int_equal(url_rank("http://h@0"), 0);
	assert_int_equal(url_rank("grpc://[::1]:9@2147483647"), 2147483647);
	assert_int_equal(url_rank("http://h:8000"), -1);
	assert_int_equal(url_rank("http://h:8000@"), -1);
	assert_int_equal(url_rank("http://h:8000@-1"), -1);
	assert_int_equal(url_rank("http://h:8000@+1"), -1);
	assert_int_equal(url_rank("http://h:8000@x"), -1);
	assert_int_equal(url_rank("http://h:8000@1x"), -1);
	assert_int_equal(url_rank("http://h:8000@07"), -1);
	assert_int_equal(url_rank("http://h:8000@2147483648"), -1);
	assert_int_equal(url_rank("http://h:8000@99999999999"), -1);
	assert_int_equal(url_rank("http://h:8000@99999999999999999999999"), -1);
	assert_int_equal(url_rank("http://h/p@2"), -1);
	assert_int_equal(url_rank("h@2"), -1);
	assert_int_equal(url_rank("@"), -1);
	assert_int_equal(url_rank(""), -1);
	assert_int_equal(url_rank_base("http://h:8000@12", b, sizeof(b)), 0);
	assert_string_equal(b, "http://h:8000");
	assert_int_equal(url_rank_base("http://h:8000", b, sizeof(b)), 0);
	assert_string_equal(b, "http://h:8000");
	assert_int_equal(url_rank_base("http://h:8000@x", b, sizeof(b)), 0);
	assert_string_equal(b, "http://h:8000@x");
	assert_int_equal(url_rank_base("http://h:8000@1", b, 8), -1);
	assert_int_equal(url_rank_base("http://h:8000@1", b, 14), 0);
	assert_string_equal(b, "http://h:8000");
}

static void
test_refused(void **state)
{
	static const char *const bad[] = {
		"",
		"not a url",
		"/relative/path",
		"http://",
		"http:///path",
		"http://h:65536",
		"http://h:port",
		"http://h 1:80",
		"http://h:80\r\nX: y",
		"mailto:someone@example.com",
	};
	char longhost[400];
	struct url u;
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		if (url_parse(bad[i], &u) != -1)
			fail_msg("accepted \"%s\"", bad[i]);
	}
	memcpy(longhost, "http://", 7);
	memset(longhost + 7, 'a', 300);
	longhost[307] = '\0';
	assert_int_equal(url_parse(longhost, &u), -1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_worker_urls),
		cmocka_unit_test(test_ipv6),
		cmocka_unit_test(test_rank_and_userinfo),
		cmocka_unit_test(test_rank_suffix),
		cmocka_unit_test(test_refused),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
