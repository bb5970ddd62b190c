/*
 * uuid.h: the worker API's identifiers (RFC 9562). Workers get version 7
 * UUIDs (a millisecond timestamp, then random bits), written in the
 * canonical lowercase hyphenated form.
 */
#ifndef SHARED_UUID_H
#define SHARED_UUID_H

#include <stdbool.h>
#include <stddef.h>

#define UUID_STR_LEN 37 /* 36 characters and the NUL */

/*
 * Writes a new version 7 UUID into out. Random bits come from
 * getrandom(2); should it fail, from the clock and a counter (ids need be
 * unique, not secret). Any context; not thread-safe.
 */
void uuid_v7(char out[UUID_STR_LEN]);
/*
 * Whether s is a UUID in one of the text forms clients send: hyphenated
 * (8-4-4-4-12), simple (32 hex digits), braced ({hyphenated}) or URN
 * (urn:uuid:hyphenated); hex digits of either case.
 */
bool uuid_valid(const char *s);
/* Whether s is in the canonical form uuid_v7 writes. */
bool uuid_canonical(const char *s);

#endif /* SHARED_UUID_H */
