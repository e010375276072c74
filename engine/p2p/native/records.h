/* The one header of the extension engine.p2p.native._records: the RecordLayer object every file works
 * on, and what each file exports, in layers. A file calls only the layers below it, never one above
 * or beside it, so the calls run one way (no file calls back into _records.c):
 *
 *   _records.c      the module: RecordLayer's constructor, end and tables, the module's table; lists
 *                   the methods of every file below and calls their *_init once at load
 *   sctp_receive.c  the receiver's in-order DATA chunk taken on aiortc's objects   -> sctp_calls.c
 *   sctp_calls.c    SCTP packets built, sealed and sent; received ones opened and parsed
 *                                                              -> dtls_record.c, sctp_packet.c
 *   sctp_burst.c    a sender's burst in one sendmmsg or GSO message  -> dtls_record.c, sctp_packet.c
 *   sctp_send.c     the sender's per-chunk loops on aiortc's objects   -> Python's C API alone
 *   dtls_record.c   DTLS records sealed, opened (replay window) and sent  -> OpenSSL alone
 *   sctp_packet.c   SCTP packets and their CRC32c, pure C: exports in sctp_packet.h, no Python
 *
 * Nothing here leaves the built library (-fvisibility=hidden): Python sees only PyInit__records. */
#ifndef LAH_RECORDS_H
#define LAH_RECORDS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _WIN32
#include <winsock2.h>
#include <ws2tcpip.h>
#else
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#endif

#include <openssl/crypto.h>
#include <openssl/evp.h>


#define HEADER 13     /* type(1) version(2) epoch(2) seq(6) length(2) */
#define TAG 16
#define EXPLICIT 8    /* AES-GCM's explicit nonce in each record */
#define MAX_PLAIN 16384
#define MAX_RECORD (HEADER + EXPLICIT + MAX_PLAIN + TAG)
#define SEQ_MAX ((((uint64_t)1) << 48) - 1)
#define WINDOW 64
#define APPLICATION_DATA 23

struct rl_burst;

typedef struct {
    PyObject_HEAD
    EVP_CIPHER_CTX *enc;      /* keyed once in __init__; each record sets only its nonce */
    EVP_CIPHER_CTX *dec;
    int gcm;                  /* 1: AES-GCM (explicit nonce in the record), 0: ChaCha20-Poly1305 */
    unsigned char write_iv[12];
    unsigned char read_iv[12];
    uint16_t epoch;
    uint64_t write_seq;       /* the next to use; SEQ_MAX + 1 once used up */
    int64_t read_top;         /* highest authenticated (or given at start); -1: none */
    uint64_t window;          /* bit i: read_top - i seen */
    PyObject *cipher;
    int fd;                   /* not owned: the caller's UDP socket */
    struct sockaddr_storage dest;
    socklen_t dest_len;       /* 0: no destination */
    unsigned long long sealed, opened, dropped_auth, dropped_replay, dropped_short, dropped_crc;
    unsigned char buf[MAX_RECORD];  /* seal's output: seal_send sends from here without a bytes object */
    unsigned char pkt[MAX_PLAIN];   /* an SCTP packet built by send_data_chunk/send_packet, then sealed */
    struct rl_burst *burst;         /* send_data_chunks' records and message headers (sctp_burst.c); lazy */
    char gso;                       /* send_data_chunks may use UDP GSO (Linux); cleared when refused */
} RecordLayer;

#define RECORD_OVERHEAD (HEADER + EXPLICIT + TAG)  /* the most a record adds to its payload */

/* A big-endian 32-bit field, as SCTP writes them (sctp_calls.c, sctp_receive.c). */
static inline uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* What each file exports, from the bottom layer up. dtls_record.c: the record layer (a failure sets a
 * Python error and returns NULL or -1, or as noted). */
int rl_ready(const RecordLayer *self);  /* 0 (RuntimeError) on an object __init__ never keyed */
int rl_no_destination(RecordLayer *self);  /* 1 (RuntimeError) before set_destination */
Py_ssize_t rl_seal_into(RecordLayer *self, const unsigned char *payload, Py_ssize_t len, int type);
Py_ssize_t rl_seal_to(RecordLayer *self, unsigned char *out_record, const unsigned char *payload, Py_ssize_t len,
                      int type);
PyObject *rl_send_record(RecordLayer *self, Py_ssize_t n);
PyObject *rl_open_buffer(RecordLayer *self, const unsigned char *h, Py_ssize_t len);
PyObject *rl_dropped(unsigned long long *counter);
/* ... and its methods, as RecordLayer's table lists them. */
PyObject *rl_seal(RecordLayer *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *rl_seal_send(RecordLayer *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *rl_open(RecordLayer *self, PyObject *arg);
PyObject *rl_set_destination(RecordLayer *self, PyObject *args);

/* sctp_send.c */
int rl_send_init(void);
PyObject *rl_take_new_chunks(PyObject *m, PyObject *args);
PyObject *rl_ack_cumulative(PyObject *m, PyObject *args);

/* sctp_burst.c (RecordLayer.burst is its state; _records.c frees it with the object) */
int rl_burst_init(void);
void rl_burst_free(RecordLayer *self);
PyObject *rl_send_data_chunks(RecordLayer *self, PyObject *args);

/* sctp_calls.c: methods and module functions for the tables in _records.c ... */
PyObject *rl_send_data_chunk(RecordLayer *self, PyObject *args);
PyObject *rl_send_packet(RecordLayer *self, PyObject *args);
PyObject *rl_open_data(RecordLayer *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *rl_data_packet(PyObject *m, PyObject *args);
PyObject *rl_packet(PyObject *m, PyObject *args);
/* ... and, for sctp_receive.c, a received record opened and the packet inside looked at. */
enum { RL_OTHER, RL_DATA, RL_SACK };
typedef struct {
    PyObject *plain;                /* what open() answers: None, b"" or the packet */
    const unsigned char *chunk;     /* RL_DATA, RL_SACK: the one chunk, inside plain */
    Py_ssize_t length;              /* its length field */
    int kind;
} rl_opened;
int rl_open_sctp(RecordLayer *self, PyObject *datagram, unsigned long long vtag, rl_opened *o);
PyObject *rl_opened_fields(rl_opened *o);

/* sctp_receive.c */
int rl_receive_init(void);
PyObject *rl_receiver_types(PyObject *m, PyObject *args);
PyObject *rl_open_receive(RecordLayer *self, PyObject *const *args, Py_ssize_t nargs);

#endif
