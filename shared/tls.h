/*
 * tls.h: TLS over non-blocking sockets with mbedTLS, for the frontend's
 * listener (server side) and its connections to https:// workers (client
 * side, certificate verification always required).
 *
 * A context holds the configuration shared by many connections: the
 * certificates, the CA chain, and one entropy source and random generator
 * seeded once when the context is made. A context is used by one thread
 * only (the process's loop) and must outlive every connection made from it.
 *
 * A connection wraps a socket fd that the caller has made non-blocking and
 * still owns: tls_conn_free never closes it. The calls below never block.
 * They return a byte count (>= 0) or one of the negative enum tls_result
 * values: TLS_WANT_READ / TLS_WANT_WRITE mean "wait until the fd is
 * readable / writable, then call the same function again"; TLS_CLOSED means
 * the peer ended the session (close_notify or EOF); TLS_ERROR is fatal for
 * the connection (it has been logged).
 *
 * mbedTLS may hold decrypted bytes, and a connection received bytes, that
 * the fd no longer signals: after a read, call tls_conn_read again while
 * tls_conn_pending is non-zero before waiting on the fd.
 */
#ifndef SHARED_TLS_H
#define SHARED_TLS_H

#include <stddef.h>
#include <sys/types.h>

struct tls_ctx;
struct tls_conn;

enum tls_result {
	TLS_OK = 0,
	TLS_WANT_READ = -1,
	TLS_WANT_WRITE = -2,
	TLS_CLOSED = -3,
	TLS_ERROR = -4,
};

/* System CA bundle used by client contexts that name no CA file. */
#define TLS_SYSTEM_CA_PATH "/etc/ssl/certs/ca-certificates.crt"

/*
 * Server context from a PEM certificate (chain) and its PEM private key
 * (--tls-cert-path, --tls-key-path). Returns NULL after logging the
 * mbedtls_strerror text when a file cannot be loaded or the key does not
 * match the certificate. Free with tls_ctx_free.
 */
struct tls_ctx *tls_ctx_new_server(const char *cert_path, const char *key_path);
/*
 * A server context that requires every client to present a certificate
 * chained to the PEM CA file ca_path (mutual TLS: the broker's remote
 * listeners). NULL (logged) when a file cannot be loaded.
 */
struct tls_ctx *tls_ctx_new_server_mutual(const char *cert_path,
    const char *key_path, const char *ca_path);

/*
 * Client context for connections to workers. ca_paths is a NULL-terminated
 * list of PEM CA files (--ca-cert-paths); NULL or an empty list means the
 * system store TLS_SYSTEM_CA_PATH. cert_path and key_path (both or
 * neither, may be NULL) are the client certificate presented for mTLS.
 * Peer verification is required: the chain must lead to a listed CA and
 * the certificate must match the hostname given to tls_conn_new_client.
 * Returns NULL after logging on a load error.
 */
struct tls_ctx *tls_ctx_new_client(const char *const *ca_paths,
    const char *cert_path, const char *key_path);

/*
 * Sets the ALPN protocols offered (client) or accepted (server), most
 * preferred first, e.g. { "h2", NULL } for gRPC. protos must outlive the
 * context (mbedTLS keeps the pointer). Call before any connection is made.
 * Returns 0, or -1 (logged).
 */
int tls_ctx_set_alpn(struct tls_ctx *ctx, const char **protos);

/* Frees the context; every connection made from it must be freed first.
 * NULL is a no-op. */
void tls_ctx_free(struct tls_ctx *ctx);

/*
 * New connection on a connected non-blocking fd (the fd stays the
 * caller's). A client connection sends hostname as SNI and checks the
 * server certificate against it. Returns NULL on allocation or setup
 * failure (logged). Drive the handshake with tls_conn_handshake.
 */
struct tls_conn *tls_conn_new_server(struct tls_ctx *ctx, int fd);
struct tls_conn *tls_conn_new_client(struct tls_ctx *ctx, int fd,
    const char *hostname);

/*
 * Advances the handshake: TLS_OK when it is complete (calling again is
 * harmless), TLS_WANT_READ / TLS_WANT_WRITE, TLS_CLOSED when the peer
 * hung up during it, or TLS_ERROR (verification failure included; logged
 * at warn on client connections, at debug on server ones, since a
 * client's bad handshake is not the gateway's fault).
 */
int tls_conn_handshake(struct tls_conn *c);

/*
 * Reads up to len decrypted bytes into buf. Returns the count (> 0), or
 * TLS_WANT_READ / TLS_WANT_WRITE, TLS_CLOSED (close_notify or EOF; stop
 * using the connection for reading), TLS_ERROR. Completes the handshake
 * first if it is not done. len 0 returns 0.
 */
ssize_t tls_conn_read(struct tls_conn *c, void *buf, size_t len);

/*
 * Encrypts and sends up to len bytes of buf. Returns the count accepted
 * (> 0, may be less than len: call again for the rest), or TLS_WANT_READ /
 * TLS_WANT_WRITE, TLS_CLOSED, TLS_ERROR. After TLS_WANT_*, the next call
 * must pass the same buf and len (mbedTLS holds the record half sent).
 * len 0 returns 0.
 */
ssize_t tls_conn_write(struct tls_conn *c, const void *buf, size_t len);

/*
 * The cipher suite agreed on, by its IANA name as mbedTLS spells it
 * (e.g. "TLS-ECDHE-ECDSA-WITH-AES-128-CCM"); NULL before the handshake is
 * complete. Contexts prefer AES-CCM, then ChaCha20-Poly1305, then AES-GCM
 * when the CPU has AES instructions, and ChaCha20-Poly1305 otherwise (the
 * fastest record ciphers of mbedTLS 2.28 on each: docs/decisions.md).
 */
const char *tls_conn_suite(const struct tls_conn *c);

/* The protocol ALPN agreed on after the handshake, NULL when none. */
const char *tls_conn_alpn(const struct tls_conn *c);

/*
 * Bytes held without the fd: decrypted ones inside mbedTLS, plus received
 * ones not yet decrypted (read ahead of mbedTLS, at most a few KiB; only
 * once the handshake is done). Non-zero: tls_conn_read has more to give,
 * or returns TLS_WANT_READ once when the bytes are not a whole record
 * (after which this is 0 until the fd has been read again).
 */
size_t tls_conn_pending(const struct tls_conn *c);

/*
 * Sends close_notify: TLS_OK when sent, TLS_WANT_WRITE to retry when the
 * fd is writable, TLS_ERROR otherwise. Optional before tls_conn_free.
 */
int tls_conn_close_notify(struct tls_conn *c);

/* Frees the connection state; the fd is not closed. NULL is a no-op. */
void tls_conn_free(struct tls_conn *c);

#endif /* SHARED_TLS_H */
