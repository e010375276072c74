/* DTLS 1.2 application-data records (RFC 6347 4.1) in C: sealed under AES-GCM or ChaCha20-Poly1305,
 * opened behind the replay window, and sent with one sendto to the destination set once. The record
 * layer's own methods (seal, seal_send, open, set_destination) are here too, beside the calls they make,
 * so the per-packet path stays in one unit. Calls nothing of the extension but OpenSSL; the SCTP files
 * above it call its rl_* (records.h draws the layers). Why in C: engine.p2p.native._records' __doc__. */
#include "records.h"

static void put48(unsigned char *p, uint64_t v) {
    for (int i = 5; i >= 0; i--) { p[i] = (unsigned char)(v & 0xff); v >>= 8; }
}

static uint64_t get48(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 6; i++) v = (v << 8) | p[i];
    return v;
}

/* An object made by __new__ alone has no cipher contexts; OpenSSL would crash on them. */
int rl_ready(const RecordLayer *self) {
    if (self->enc && self->dec) return 1;
    PyErr_SetString(PyExc_RuntimeError, "RecordLayer.__init__ was not called");
    return 0;
}

/* The 12-byte AEAD nonce of a record: RFC 5288 (salt || explicit nonce, which is epoch || seq here and
 * in the record itself) or RFC 7905 (iv XOR (0^4 || epoch || seq)). */
static void nonce(int gcm, const unsigned char *iv, const unsigned char *explicit_or_epoch_seq,
                  unsigned char out[12]) {
    if (gcm) {
        memcpy(out, iv, 4);
        memcpy(out + 4, explicit_or_epoch_seq, 8);
    } else {
        memcpy(out, iv, 12);
        for (int i = 0; i < 8; i++) out[4 + i] ^= explicit_or_epoch_seq[i];
    }
}

/* RFC 6347 6.2.3.3's additional data: epoch || seq || type || version || plaintext length. */
static void aad(unsigned char out[13], const unsigned char *epoch_seq, int type, Py_ssize_t len) {
    memcpy(out, epoch_seq, 8);
    out[8] = (unsigned char)type;
    out[9] = 0xfe;
    out[10] = 0xfd;
    out[11] = (unsigned char)(len >> 8);
    out[12] = (unsigned char)len;
}

/* Seal payload into out (room for len + RECORD_OVERHEAD); the record's length, or -1 with a Python error. */
Py_ssize_t rl_seal_to(RecordLayer *self, unsigned char *out_record, const unsigned char *payload, Py_ssize_t len,
                      int type) {
    if (len > MAX_PLAIN) {
        PyErr_Format(PyExc_ValueError, "a DTLS record holds at most %d bytes, got %zd", MAX_PLAIN, len);
        return -1;
    }
    if (self->write_seq > SEQ_MAX) {  /* never wrap: a repeated (key, nonce) breaks the AEAD */
        PyErr_SetString(PyExc_OverflowError, "the sequence numbers of this epoch are used up (2**48)");
        return -1;
    }
    unsigned char *h = out_record, ad[13], iv[12];
    Py_ssize_t body = (self->gcm ? EXPLICIT : 0) + len + TAG;
    h[0] = (unsigned char)type;
    h[1] = 0xfe;
    h[2] = 0xfd;
    h[3] = (unsigned char)(self->epoch >> 8);
    h[4] = (unsigned char)self->epoch;
    put48(h + 5, self->write_seq);
    h[11] = (unsigned char)(body >> 8);
    h[12] = (unsigned char)body;
    aad(ad, h + 3, type, len);
    nonce(self->gcm, self->write_iv, h + 3, iv);
    unsigned char *out = h + HEADER;
    if (self->gcm) {
        memcpy(out, h + 3, EXPLICIT);
        out += EXPLICIT;
    }
    int n = 0, m = 0;
    if (EVP_EncryptInit_ex(self->enc, NULL, NULL, NULL, iv) != 1 ||
        EVP_EncryptUpdate(self->enc, NULL, &n, ad, sizeof ad) != 1 ||
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

Py_ssize_t rl_seal_into(RecordLayer *self, const unsigned char *payload, Py_ssize_t len, int type) {
    return rl_seal_to(self, self->buf, payload, len, type);
}

/* seal's and seal_send's (payload, content_type=23), parsed by hand: they run once per packet, and
 * the generic parser (an argument tuple, a format string) is a visible share of a ~1 us call. */
static int payload_args(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                        Py_buffer *payload, int *type) {
    PyObject *p = nargs > 0 ? args[0] : NULL, *t = nargs > 1 ? args[1] : NULL;
    if (nargs > 2) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most 2 arguments (%zd given)", fname, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0, nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0; i < nkw; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i), **slot = NULL;
        if (PyUnicode_CompareWithASCIIString(k, "payload") == 0) slot = &p;
        else if (PyUnicode_CompareWithASCIIString(k, "content_type") == 0) slot = &t;
        if (!slot || *slot) {
            PyErr_Format(PyExc_TypeError, "%s(): unexpected or repeated argument %R", fname, k);
            return -1;
        }
        *slot = args[nargs + i];
    }
    if (!p) {
        PyErr_Format(PyExc_TypeError, "%s(): missing argument 'payload'", fname);
        return -1;
    }
    *type = APPLICATION_DATA;
    if (t) {
        long v = PyLong_AsLong(t);
        if (v == -1 && PyErr_Occurred()) return -1;
        if (v < 0 || v > 255) {
            PyErr_Format(PyExc_ValueError, "%s(): content_type must be 0..255, got %ld", fname, v);
            return -1;
        }
        *type = (int)v;
    }
    return PyObject_GetBuffer(p, payload, PyBUF_SIMPLE);
}

PyObject *rl_seal(RecordLayer *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    Py_buffer p;
    int type;
    if (!rl_ready(self) || payload_args("seal", args, nargs, kwnames, &p, &type) < 0) return NULL;
    Py_ssize_t n = rl_seal_into(self, p.buf, p.len, type);
    PyBuffer_Release(&p);
    return n < 0 ? NULL : PyBytes_FromStringAndSize((const char *)self->buf, n);
}

int rl_no_destination(RecordLayer *self) {
    if (self->dest_len) return 0;
    PyErr_SetString(PyExc_RuntimeError, "no destination: call set_destination first");
    return 1;
}

/* Send the record in buf. From here its sequence number is spent whatever sendto says: it must never be
 * sealed twice. None when sent; the record as bytes when the socket's buffer is full. */
PyObject *rl_send_record(RecordLayer *self, Py_ssize_t n) {
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

PyObject *rl_seal_send(RecordLayer *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    Py_buffer p;
    int type;
    if (!rl_ready(self) || payload_args("seal_send", args, nargs, kwnames, &p, &type) < 0) return NULL;
    if (rl_no_destination(self)) {
        PyBuffer_Release(&p);
        return NULL;
    }
    Py_ssize_t n = rl_seal_into(self, p.buf, p.len, type);
    PyBuffer_Release(&p);
    return n < 0 ? NULL : rl_send_record(self, n);
}

/* RFC 6347 4.1.2.6: 1 when seq was seen or is older than the window, 0 when it may be new. */
static int replayed(const RecordLayer *self, uint64_t seq) {
    if (self->read_top < 0 || seq > (uint64_t)self->read_top) return 0;
    uint64_t back = (uint64_t)self->read_top - seq;
    return back >= WINDOW ? 1 : (int)((self->window >> back) & 1);
}

/* Called only after authentication, so a forged sequence number cannot slide the window. */
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

/* RFC 6347 4.1.2.1: invalid records are dropped silently; b"" tells the caller "mine, nothing to deliver". */
PyObject *rl_dropped(unsigned long long *counter) {
    (*counter)++;
    return PyBytes_FromStringAndSize(NULL, 0);
}

/* A new reference: None (OpenSSL's record), b"" (ours, dropped) or the plaintext. Reads only h[0..len). */
PyObject *rl_open_buffer(RecordLayer *self, const unsigned char *h, Py_ssize_t len) {
    if (len < HEADER || h[0] != APPLICATION_DATA || h[1] != 0xfe || h[2] != 0xfd ||
        (((unsigned)h[3] << 8) | h[4]) != self->epoch || (((Py_ssize_t)h[11] << 8) | h[12]) != len - HEADER)
        Py_RETURN_NONE;
    Py_ssize_t explicit_len = self->gcm ? EXPLICIT : 0, plain_len = len - HEADER - explicit_len - TAG;
    if (plain_len < 0) return rl_dropped(&self->dropped_short);
    /* Longer than any conforming peer seals (RFC 5246 6.2.3, record_overflow): a forgery. */
    if (plain_len > MAX_PLAIN) return rl_dropped(&self->dropped_auth);
    uint64_t seq = get48(h + 5);
    if (replayed(self, seq)) return rl_dropped(&self->dropped_replay);  /* before decrypting: costs no AEAD */
    const unsigned char *ct = h + HEADER + explicit_len;
    unsigned char ad[13], iv[12];
    aad(ad, h + 3, APPLICATION_DATA, plain_len);
    /* AES-GCM: the sender's explicit nonce, whatever it chose (RFC 5288 3); ChaCha: epoch || seq. */
    nonce(self->gcm, self->read_iv, self->gcm ? h + HEADER : h + 3, iv);
    PyObject *out = PyBytes_FromStringAndSize(NULL, plain_len);  /* decrypted in place: no copy */
    if (!out) return NULL;
    unsigned char *plain = (unsigned char *)PyBytes_AS_STRING(out);
    int n = 0, m = 0;
    if (EVP_DecryptInit_ex(self->dec, NULL, NULL, NULL, iv) != 1 ||
        EVP_DecryptUpdate(self->dec, NULL, &n, ad, sizeof ad) != 1 ||
        EVP_DecryptUpdate(self->dec, plain, &n, ct, (int)plain_len) != 1 ||
        EVP_CIPHER_CTX_ctrl(self->dec, EVP_CTRL_AEAD_SET_TAG, TAG, (void *)(ct + plain_len)) != 1 ||
        EVP_DecryptFinal_ex(self->dec, plain + n, &m) != 1) {
        Py_DECREF(out);
        return rl_dropped(&self->dropped_auth);
    }
    mark(self, seq);
    self->opened++;
    return out;
}

PyObject *rl_open(RecordLayer *self, PyObject *arg) {
    Py_buffer d;
    if (!rl_ready(self) || PyObject_GetBuffer(arg, &d, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = rl_open_buffer(self, d.buf, d.len);
    PyBuffer_Release(&d);
    return result;
}

/* "%3" (numeric, as Windows writes it) or "%eth0". An unknown name is an error rather than no scope:
 * then the caller sends through its transport, which resolves the name itself. */
static int scope_id(const char *s, uint32_t *out) {
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (s[0] >= '0' && s[0] <= '9' && *end == 0 && v <= UINT32_MAX) {
        *out = (uint32_t)v;
        return 0;
    }
#ifndef _WIN32
    *out = (uint32_t)if_nametoindex(s);
    return *out ? 0 : -1;
#else
    return -1;
#endif
}

PyObject *rl_set_destination(RecordLayer *self, PyObject *args) {
    int fd, port;
    const char *host;
    if (!PyArg_ParseTuple(args, "isi:set_destination", &fd, &host, &port)) return NULL;
    if (fd < 0 || port < 1 || port > 65535) {
        PyErr_Format(PyExc_ValueError, "bad socket or port: fd %d, port %d", fd, port);
        return NULL;
    }
    char name[INET6_ADDRSTRLEN];
    const char *pct = strchr(host, '%');
    size_t n = pct ? (size_t)(pct - host) : strlen(host);
    struct sockaddr_storage dest;
    struct sockaddr_in *v4 = (struct sockaddr_in *)&dest;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&dest;
    socklen_t dest_len = 0;
    memset(&dest, 0, sizeof dest);
    if (n < sizeof name) {
        memcpy(name, host, n);
        name[n] = 0;
        if (!pct && inet_pton(AF_INET, name, &v4->sin_addr) == 1) {
            v4->sin_family = AF_INET;
            v4->sin_port = htons((unsigned short)port);
            dest_len = sizeof *v4;
        } else if (inet_pton(AF_INET6, name, &v6->sin6_addr) == 1) {
            v6->sin6_family = AF_INET6;
            v6->sin6_port = htons((unsigned short)port);
            uint32_t scope = 0;  /* a local: Windows' sin6_scope_id is a ULONG */
            if (!pct || scope_id(pct + 1, &scope) == 0) dest_len = sizeof *v6;
            v6->sin6_scope_id = scope;
        }
    }
    if (dest_len == 0) {  /* the previous destination, if any, stays */
        PyErr_Format(PyExc_ValueError, "not an IPv4 or IPv6 address literal (with a known %%scope): %R", PyTuple_GET_ITEM(args, 1));
        return NULL;
    }
    memcpy(&self->dest, &dest, sizeof dest);
    self->dest_len = dest_len;
    self->fd = fd;
    Py_RETURN_NONE;
}
