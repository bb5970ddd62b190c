/*
 * secret.h: comparing a presented credential with a configured one
 * without leaking, through timing, how much of it matched or how long the
 * configured one is.
 */
#ifndef SHARED_SECRET_H
#define SHARED_SECRET_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Whether got[0..got_len) equals the NUL-terminated want. Both are hashed
 * with SHA-256 and the digests compared in constant time, so the time
 * taken depends on neither the position of the first difference nor the
 * length of want. want NULL never matches. Any context.
 */
bool secret_equal(const char *want, const void *got, size_t got_len);

#endif /* SHARED_SECRET_H */
