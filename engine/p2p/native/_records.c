/* DTLS 1.2 application-data records sealed, opened and sent in C.
 *
 * Why: after the handshake every ~1.2 kB SCTP packet of a data channel costs ~17 us of Python in
 * pyOpenSSL's record calls (bio_write, SSL_read, bio_read, buffers, error checks) against well under
 * 1 us of AES-GCM. Here one call seals a record (and sends it with one sendto) or opens one.
 *
 * What stays in OpenSSL: the handshake, the keys' derivation (done in Python from the session, see
 * keys.py), every record that is not application data of this epoch (alerts, handshake), every suite
 * that is not AEAD. The wire format is RFC 6347's DTLS 1.2 record with RFC 5288's AES-GCM (explicit
 * nonce = epoch || sequence number, as OpenSSL writes it) or RFC 7905's ChaCha20-Poly1305, so any
 * DTLS 1.2 stack (a browser, stock aiortc) opens what this seals and the reverse.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <stdint.h>
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

#define HEADER 13
#define TAG 16
#define EXPLICIT 8
#define MAX_PLAIN 16384
#define MAX_RECORD (HEADER + EXPLICIT + MAX_PLAIN + TAG)
#define SEQ_MAX ((((uint64_t)1) << 48) - 1)
#define WINDOW 64

typedef struct {
    PyObject_HEAD
    EVP_CIPHER_CTX *enc;
    EVP_CIPHER_CTX *dec;
    int gcm;                  /* 1: AES-GCM (explicit nonce in the record), 0: ChaCha20-Poly1305 */
    unsigned char write_iv[12];
    unsigned char read_iv[12];
    uint16_t epoch;
    uint64_t write_seq;       /* the next to use */
    int64_t read_top;         /* highest authenticated (or given at start); -1: none */
    uint64_t window;          /* bit i: read_top - i seen */
    PyObject *cipher;
    int fd;
    struct sockaddr_storage dest;
    socklen_t dest_len;
    unsigned long long sealed, opened, dropped_auth, dropped_replay, dropped_short;
    unsigned char buf[MAX_RECORD];
} RecordLayer;

static void put48(unsigned char *p, uint64_t v) {
    for (int i = 5; i >= 0; i--) { p[i] = (unsigned char)(v & 0xff); v >>= 8; }
}

static uint64_t get48(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 6; i++) v = (v << 8) | p[i];
    return v;
}

/* The 12-byte AEAD nonce of record (epoch, seq): RFC 5288 (salt || explicit) or RFC 7905 (iv XOR). */
static void nonce(const RecordLayer *self, const unsigned char *iv, const unsigned char *epoch_seq,
                  unsigned char out[12]) {
    if (self->gcm) {
        memcpy(out, iv, 4);
        memcpy(out + 4, epoch_seq, 8);
    } else {
        memcpy(out, iv, 12);
        for (int i = 0; i < 8; i++) out[4 + i] ^= epoch_seq[i];
    }
}

/* Seal payload into self->buf; returns the record's length, or -1 with a Python error set. */
static Py_ssize_t seal_into(RecordLayer *self, const unsigned char *payload, Py_ssize_t len, int type) {
    if (len > MAX_PLAIN) {
        PyErr_Format(PyExc_ValueError, "a DTLS record holds at most %d bytes, got %zd", MAX_PLAIN, len);
        return -1;
    }
    if (self->write_seq > SEQ_MAX) {
        PyErr_SetString(PyExc_OverflowError, "DTLS sequence numbers of this epoch are used up");
        return -1;
    }
    unsigned char *h = self->buf;
    Py_ssize_t body = (self->gcm ? EXPLICIT : 0) + len + TAG;
    h[0] = (unsigned char)type;
    h[1] = 0xfe;
    h[2] = 0xfd;
    h[3] = (unsigned char)(self->epoch >> 8);
    h[4] = (unsigned char)self->epoch;
    put48(h + 5, self->write_seq);
    h[11] = (unsigned char)(body >> 8);
    h[12] = (unsigned char)body;
    unsigned char aad[13], iv[12];
    memcpy(aad, h + 3, 8);
    aad[8] = h[0];
    aad[9] = 0xfe;
    aad[10] = 0xfd;
    aad[11] = (unsigned char)(len >> 8);
    aad[12] = (unsigned char)len;
    nonce(self, self->write_iv, h + 3, iv);
    unsigned char *out = h + HEADER;
    if (self->gcm) {
        memcpy(out, h + 3, EXPLICIT);
        out += EXPLICIT;
    }
    int n = 0, m = 0;
    if (EVP_EncryptInit_ex(self->enc, NULL, NULL, NULL, iv) != 1 ||
        EVP_EncryptUpdate(self->enc, NULL, &n, aad, sizeof aad) != 1 ||
        EVP_EncryptUpdate(self->enc, out, &n, payload, (int)len) != 1 ||
        EVP_EncryptFinal_ex(self->enc, out + n, &m) != 1 ||
        EVP_CIPHER_CTX_ctrl(self->enc, EVP_CTRL_AEAD_GET_TAG, TAG, out + len) != 1) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL failed to seal a record");
        return -1;
    }
    self->write_seq++;
    self->sealed++;
    return HEADER + body;
}

static PyObject *seal(RecordLayer *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"payload", "content_type", NULL};
    Py_buffer p;
    int type = 23;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|i", names, &p, &type)) return NULL;
    Py_ssize_t n = seal_into(self, p.buf, p.len, type & 0xff);
    PyBuffer_Release(&p);
    return n < 0 ? NULL : PyBytes_FromStringAndSize((const char *)self->buf, n);
}

static PyObject *seal_send(RecordLayer *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"payload", "content_type", NULL};
    Py_buffer p;
    int type = 23;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|i", names, &p, &type)) return NULL;
    if (self->dest_len == 0) {
        PyBuffer_Release(&p);
        PyErr_SetString(PyExc_RuntimeError, "no destination: call set_destination first");
        return NULL;
    }
    Py_ssize_t n = seal_into(self, p.buf, p.len, type & 0xff);
    PyBuffer_Release(&p);
    if (n < 0) return NULL;
#ifdef _WIN32
    int sent = sendto((SOCKET)self->fd, (const char *)self->buf, (int)n, 0, (struct sockaddr *)&self->dest,
                      self->dest_len);
    if (sent < 0) {
        int err = WSAGetLastError();
        if (err == WSAEWOULDBLOCK || err == WSAENOBUFS)
            return PyBytes_FromStringAndSize((const char *)self->buf, n);
        return PyErr_SetFromWindowsErr(err);
    }
#else
    ssize_t sent;
    do {
        sent = sendto(self->fd, self->buf, (size_t)n, 0, (struct sockaddr *)&self->dest, self->dest_len);
    } while (sent < 0 && errno == EINTR);
    if (sent < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)
            return PyBytes_FromStringAndSize((const char *)self->buf, n);  /* the caller queues it */
        return PyErr_SetFromErrno(PyExc_OSError);
    }
#endif
    Py_RETURN_NONE;
}

/* RFC 6347 4.1.2.6: 0 when seq is new and inside or ahead of the window, 1 when seen or too old. */
static int replayed(const RecordLayer *self, uint64_t seq) {
    if (self->read_top < 0 || seq > (uint64_t)self->read_top) return 0;
    uint64_t back = (uint64_t)self->read_top - seq;
    if (back >= WINDOW) return 1;
    return (int)((self->window >> back) & 1);
}

static void mark(RecordLayer *self, uint64_t seq) {
    if (self->read_top < 0) {
        self->read_top = (int64_t)seq;
        self->window = 1;
    } else if (seq > (uint64_t)self->read_top) {
        uint64_t shift = seq - (uint64_t)self->read_top;
        self->window = shift >= WINDOW ? 1 : (self->window << shift) | 1;
        self->read_top = (int64_t)seq;
    } else {
        self->window |= ((uint64_t)1) << ((uint64_t)self->read_top - seq);
    }
}

static PyObject *open_record(RecordLayer *self, PyObject *arg) {
    Py_buffer d;
    if (PyObject_GetBuffer(arg, &d, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *h = d.buf;
    Py_ssize_t len = d.len;
    PyObject *result = NULL;
    /* Not ours (None): anything but exactly one application-data record of this epoch. */
    if (len < HEADER || h[0] != 23 || h[1] != 0xfe || h[2] != 0xfd ||
        (((unsigned)h[3] << 8) | h[4]) != self->epoch || (((Py_ssize_t)h[11] << 8) | h[12]) != len - HEADER) {
        PyBuffer_Release(&d);
        Py_RETURN_NONE;
    }
    Py_ssize_t body = len - HEADER;
    Py_ssize_t explicit_len = self->gcm ? EXPLICIT : 0;
    if (body < explicit_len + TAG) {
        self->dropped_short++;
        goto dropped;
    }
    uint64_t seq = get48(h + 5);
    if (replayed(self, seq)) {
        self->dropped_replay++;
        goto dropped;
    }
    Py_ssize_t plain_len = body - explicit_len - TAG;
    const unsigned char *ct = h + HEADER + explicit_len;
    unsigned char aad[13], iv[12];
    memcpy(aad, h + 3, 8);
    aad[8] = 23;
    aad[9] = 0xfe;
    aad[10] = 0xfd;
    aad[11] = (unsigned char)(plain_len >> 8);
    aad[12] = (unsigned char)plain_len;
    if (self->gcm) {  /* the sender's explicit nonce, whatever it chose (RFC 5288 3) */
        memcpy(iv, self->read_iv, 4);
        memcpy(iv + 4, h + HEADER, EXPLICIT);
    } else {
        nonce(self, self->read_iv, h + 3, iv);
    }
    int n = 0, m = 0;
    if (EVP_DecryptInit_ex(self->dec, NULL, NULL, NULL, iv) != 1 ||
        EVP_DecryptUpdate(self->dec, NULL, &n, aad, sizeof aad) != 1 ||
        EVP_DecryptUpdate(self->dec, self->buf, &n, ct, (int)plain_len) != 1 ||
        EVP_CIPHER_CTX_ctrl(self->dec, EVP_CTRL_AEAD_SET_TAG, TAG, (void *)(ct + plain_len)) != 1 ||
        EVP_DecryptFinal_ex(self->dec, self->buf + n, &m) != 1) {
        self->dropped_auth++;
        goto dropped;
    }
    mark(self, seq);
    self->opened++;
    result = PyBytes_FromStringAndSize((const char *)self->buf, plain_len);
    PyBuffer_Release(&d);
    return result;
dropped:
    PyBuffer_Release(&d);
    return PyBytes_FromStringAndSize(NULL, 0);
}

static PyObject *set_destination(RecordLayer *self, PyObject *args) {
    int fd, port;
    const char *host;
    if (!PyArg_ParseTuple(args, "isi", &fd, &host, &port)) return NULL;
    if (fd < 0 || port < 0 || port > 65535) {
        PyErr_Format(PyExc_ValueError, "bad socket or port: fd %d, port %d", fd, port);
        return NULL;
    }
    char name[INET6_ADDRSTRLEN + 1];
    const char *scope = strchr(host, '%');
    size_t n = scope ? (size_t)(scope - host) : strlen(host);
    if (n >= sizeof name) {
        PyErr_Format(PyExc_ValueError, "not an IP address: %s", host);
        return NULL;
    }
    memcpy(name, host, n);
    name[n] = 0;
    memset(&self->dest, 0, sizeof self->dest);
    struct sockaddr_in *v4 = (struct sockaddr_in *)&self->dest;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&self->dest;
    if (!scope && inet_pton(AF_INET, name, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((unsigned short)port);
        self->dest_len = sizeof *v4;
    } else if (inet_pton(AF_INET6, name, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((unsigned short)port);
        if (scope) {
            unsigned long id = strtoul(scope + 1, NULL, 10);
#ifndef _WIN32
            if (id == 0) id = if_nametoindex(scope + 1);
#endif
            v6->sin6_scope_id = (uint32_t)id;
        }
        self->dest_len = sizeof *v6;
    } else {
        self->dest_len = 0;
        PyErr_Format(PyExc_ValueError, "not an IP address: %s", host);
        return NULL;
    }
    self->fd = fd;
    Py_RETURN_NONE;
}

static int init(RecordLayer *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"cipher", "write_key", "write_iv", "read_key", "read_iv",
                            "epoch", "write_seq", "read_seq_top", NULL};
    const char *cipher;
    Py_buffer wk, wi, rk, ri;
    long long epoch, write_seq, read_top;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sy*y*y*y*LLL", names, &cipher, &wk, &wi, &rk, &ri, &epoch,
                                     &write_seq, &read_top))
        return -1;
    int rc = -1;
    const EVP_CIPHER *evp = NULL;
    Py_ssize_t key_len = 0, iv_len = 0;
    int gcm = 1;
    if (strcmp(cipher, "AES128-GCM") == 0) {
        evp = EVP_aes_128_gcm(); key_len = 16; iv_len = 4;
    } else if (strcmp(cipher, "AES256-GCM") == 0) {
        evp = EVP_aes_256_gcm(); key_len = 32; iv_len = 4;
    } else if (strcmp(cipher, "CHACHA20-POLY1305") == 0) {
        evp = EVP_chacha20_poly1305(); key_len = 32; iv_len = 12; gcm = 0;
    } else {
        PyErr_Format(PyExc_ValueError, "unsupported cipher %s (AES128-GCM, AES256-GCM, CHACHA20-POLY1305)", cipher);
        goto out;
    }
    if (wk.len != key_len || rk.len != key_len || wi.len != iv_len || ri.len != iv_len) {
        PyErr_Format(PyExc_ValueError, "%s takes %zd-byte keys and %zd-byte IVs", cipher, key_len, iv_len);
        goto out;
    }
    if (epoch < 0 || epoch > 65535 || write_seq < 0 || (uint64_t)write_seq > SEQ_MAX || read_top < -1 ||
        read_top > (long long)SEQ_MAX) {
        PyErr_SetString(PyExc_ValueError, "epoch must be 0..65535, sequence numbers 0..2**48-1 (read top -1..)");
        goto out;
    }
    EVP_CIPHER_CTX_free(self->enc);
    EVP_CIPHER_CTX_free(self->dec);
    self->enc = EVP_CIPHER_CTX_new();
    self->dec = EVP_CIPHER_CTX_new();
    /* The key is set once; each record only sets its nonce. */
    if (!self->enc || !self->dec || EVP_EncryptInit_ex(self->enc, evp, NULL, NULL, NULL) != 1 ||
        EVP_CIPHER_CTX_ctrl(self->enc, EVP_CTRL_AEAD_SET_IVLEN, 12, NULL) != 1 ||
        EVP_EncryptInit_ex(self->enc, NULL, NULL, wk.buf, NULL) != 1 ||
        EVP_DecryptInit_ex(self->dec, evp, NULL, NULL, NULL) != 1 ||
        EVP_CIPHER_CTX_ctrl(self->dec, EVP_CTRL_AEAD_SET_IVLEN, 12, NULL) != 1 ||
        EVP_DecryptInit_ex(self->dec, NULL, NULL, rk.buf, NULL) != 1) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL refused the cipher");
        goto out;
    }
    self->gcm = gcm;
    memcpy(self->write_iv, wi.buf, (size_t)iv_len);
    memcpy(self->read_iv, ri.buf, (size_t)iv_len);
    self->epoch = (uint16_t)epoch;
    self->write_seq = (uint64_t)write_seq;
    self->read_top = read_top;
    self->window = read_top < 0 ? 0 : ~(uint64_t)0;  /* everything up to the top counts as seen */
    self->dest_len = 0;
    self->fd = -1;
    Py_XSETREF(self->cipher, PyUnicode_FromString(cipher));
    rc = self->cipher ? 0 : -1;
out:
    PyBuffer_Release(&wk);
    PyBuffer_Release(&wi);
    PyBuffer_Release(&rk);
    PyBuffer_Release(&ri);
    return rc;
}

static void dealloc(RecordLayer *self) {
    EVP_CIPHER_CTX_free(self->enc);
    EVP_CIPHER_CTX_free(self->dec);
    OPENSSL_cleanse(self->write_iv, sizeof self->write_iv);
    OPENSSL_cleanse(self->read_iv, sizeof self->read_iv);
    Py_XDECREF(self->cipher);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *get_write_seq(RecordLayer *self, void *c) { return PyLong_FromUnsignedLongLong(self->write_seq); }
static PyObject *get_read_top(RecordLayer *self, void *c) { return PyLong_FromLongLong(self->read_top); }

static PyMethodDef methods[] = {
    {"seal", (PyCFunction)(void (*)(void))seal, METH_VARARGS | METH_KEYWORDS,
     "seal(payload, content_type=23) -> bytes: one record with the next sequence number."},
    {"seal_send", (PyCFunction)(void (*)(void))seal_send, METH_VARARGS | METH_KEYWORDS,
     "seal_send(payload, content_type=23) -> bytes | None: seal, then one sendto to the destination.\n"
     "None when sent; the record when the socket's buffer is full (the caller queues it)."},
    {"open", (PyCFunction)open_record, METH_O,
     "open(datagram) -> bytes | None: the plaintext; b'' when the record is this layer's but a replay,\n"
     "too short or forged (dropped, counted); None when it is not exactly one application-data record\n"
     "of this epoch (OpenSSL's to handle)."},
    {"set_destination", (PyCFunction)set_destination, METH_VARARGS,
     "set_destination(fd, host, port): where seal_send sends (the socket is not owned)."},
    {NULL}};

static PyMemberDef members[] = {
    {"cipher", T_OBJECT_EX, offsetof(RecordLayer, cipher), READONLY, "the AEAD cipher"},
    {"sealed", T_ULONGLONG, offsetof(RecordLayer, sealed), READONLY, "records sealed"},
    {"opened", T_ULONGLONG, offsetof(RecordLayer, opened), READONLY, "records opened"},
    {"dropped_auth", T_ULONGLONG, offsetof(RecordLayer, dropped_auth), READONLY, "forged or corrupt"},
    {"dropped_replay", T_ULONGLONG, offsetof(RecordLayer, dropped_replay), READONLY, "seen or too old"},
    {"dropped_short", T_ULONGLONG, offsetof(RecordLayer, dropped_short), READONLY, "shorter than nonce + tag"},
    {NULL}};

static PyGetSetDef getset[] = {
    {"write_seq", (getter)get_write_seq, NULL, "the next sequence number to seal with", NULL},
    {"read_seq_top", (getter)get_read_top, NULL, "the highest sequence number opened (-1: none)", NULL},
    {NULL}};

static PyTypeObject RecordLayerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "engine.p2p.native._records.RecordLayer",
    .tp_basicsize = sizeof(RecordLayer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RecordLayer(cipher, write_key, write_iv, read_key, read_iv, epoch, write_seq, read_seq_top)\n\n"
              "One direction pair of an established DTLS 1.2 session's application-data records.\n"
              "write_seq goes on from the last record OpenSSL sent; every sequence number up to\n"
              "read_seq_top counts as already received (OpenSSL opened those).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)init,
    .tp_dealloc = (destructor)dealloc,
    .tp_methods = methods,
    .tp_members = members,
    .tp_getset = getset,
};

static PyObject *openssl_version(PyObject *m, PyObject *unused) {
    return PyUnicode_FromString(OpenSSL_version(OPENSSL_VERSION));
}

static PyMethodDef module_methods[] = {
    {"openssl_version", openssl_version, METH_NOARGS, "The libcrypto this module runs on."},
    {NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "engine.p2p.native._records",
    "DTLS 1.2 application-data records sealed, opened and sent in C (see engine.p2p.native).", -1,
    module_methods};

PyMODINIT_FUNC PyInit__records(void) {
    if (PyType_Ready(&RecordLayerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&RecordLayerType);
    if (PyModule_AddObject(m, "RecordLayer", (PyObject *)&RecordLayerType) < 0 ||
        PyModule_AddStringConstant(m, "__version__", "1") < 0) {
        Py_DECREF(&RecordLayerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
