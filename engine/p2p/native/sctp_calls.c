/* The SCTP side of the record layer's calls: a packet built (sctp_packet.c), sealed and sent in one call,
 * and a received record opened with its packet parsed when it is the common case (one DATA or one SACK
 * chunk). Why: each saves aiortc's Python packet codec on a per-packet path; see engine.p2p.native. */
#include "records.h"
#include "sctp_packet.h"

/* --- SCTP packets built here (sctp_packet.c), sealed and sent in the same call ------------------- */

static int sctp_header_ok(unsigned long long src, unsigned long long dst, unsigned long long vtag) {
    if (src <= 0xffff && dst <= 0xffff && vtag <= 0xffffffffull) return 1;
    PyErr_SetString(PyExc_ValueError, "SCTP ports are 16 bits and the verification tag 32");
    return 0;
}

/* (src, dst, vtag, flags, tsn, stream_id, stream_seq, ppid, user_data) -> a DATA packet in pkt. */
static Py_ssize_t data_packet_into(unsigned char *pkt, PyObject *args) {
    unsigned long long src, dst, vtag, flags, tsn, sid, ssn, ppid;
    Py_buffer d;
    if (!PyArg_ParseTuple(args, "KKKKKKKKy*", &src, &dst, &vtag, &flags, &tsn, &sid, &ssn, &ppid, &d)) return -1;
    Py_ssize_t n = -1;
    if (!sctp_header_ok(src, dst, vtag)) {
    } else if (flags > 0xff || tsn > 0xffffffffull || sid > 0xffff || ssn > 0xffff || ppid > 0xffffffffull) {
        PyErr_SetString(PyExc_ValueError, "DATA fields out of range (flags 8 bits, TSN 32, stream 16, SSN 16, PPID 32)");
    } else if (d.len > MAX_PLAIN - SCTP_COMMON_HEADER - SCTP_DATA_HEADER - 3) {
        PyErr_Format(PyExc_ValueError, "a DATA chunk here carries at most %d bytes",
                     MAX_PLAIN - SCTP_COMMON_HEADER - SCTP_DATA_HEADER - 3);
    } else {
        n = (Py_ssize_t)sctp_data_packet(pkt, (unsigned)src, (unsigned)dst, (uint32_t)vtag, (unsigned)flags,
                                         (uint32_t)tsn, (unsigned)sid, (unsigned)ssn, (uint32_t)ppid, d.buf,
                                         (size_t)d.len);
    }
    PyBuffer_Release(&d);
    return n;
}

/* (src, dst, vtag, chunk) -> a packet of that serialized chunk in pkt. */
static Py_ssize_t packet_into(unsigned char *pkt, PyObject *args) {
    unsigned long long src, dst, vtag;
    Py_buffer c;
    if (!PyArg_ParseTuple(args, "KKKy*", &src, &dst, &vtag, &c)) return -1;
    Py_ssize_t n = -1;
    if (!sctp_header_ok(src, dst, vtag)) {
    } else if (c.len > MAX_PLAIN - SCTP_COMMON_HEADER) {
        PyErr_Format(PyExc_ValueError, "an SCTP packet here carries at most %d bytes of chunk",
                     MAX_PLAIN - SCTP_COMMON_HEADER);
    } else {
        n = (Py_ssize_t)sctp_packet(pkt, (unsigned)src, (unsigned)dst, (uint32_t)vtag, c.buf, (size_t)c.len);
    }
    PyBuffer_Release(&c);
    return n;
}

static PyObject *send_built(RecordLayer *self, Py_ssize_t n) {
    if (n < 0) return NULL;
    n = rl_seal_into(self, self->pkt, n, APPLICATION_DATA);
    return n < 0 ? NULL : rl_send_record(self, n);
}

PyObject *rl_send_data_chunk(RecordLayer *self, PyObject *args) {
    if (!rl_ready(self) || rl_no_destination(self)) return NULL;
    return send_built(self, data_packet_into(self->pkt, args));
}

PyObject *rl_send_packet(RecordLayer *self, PyObject *args) {
    if (!rl_ready(self) || rl_no_destination(self)) return NULL;
    return send_built(self, packet_into(self->pkt, args));
}

/* The same packets, unsealed: what the tests hold against aiortc's serialize_packet. */
PyObject *rl_data_packet(PyObject *m, PyObject *args) {
    static unsigned char pkt[MAX_PLAIN];
    Py_ssize_t n = data_packet_into(pkt, args);
    return n < 0 ? NULL : PyBytes_FromStringAndSize((const char *)pkt, n);
}

PyObject *rl_packet(PyObject *m, PyObject *args) {
    static unsigned char pkt[MAX_PLAIN];
    Py_ssize_t n = packet_into(pkt, args);
    return n < 0 ? NULL : PyBytes_FromStringAndSize((const char *)pkt, n);
}


static Py_ssize_t sack_counts_fit(const unsigned char *c, Py_ssize_t length) {
    return 16 + 4 * ((c[12] << 8 | c[13]) + (c[14] << 8 | c[15])) == length;
}

/* A SACK chunk (RFC 9260 3.3.4) whose gap and duplicate counts fill its length exactly, as
 * (cumulative_tsn, a_rwnd, [(gap start, gap end)...], [duplicate TSNs]): aiortc's SackChunk fields. */
static PyObject *sack_fields(const unsigned char *c) {
    Py_ssize_t gaps = c[12] << 8 | c[13], dups = c[14] << 8 | c[15];
    PyObject *g = PyList_New(gaps), *d = PyList_New(dups);
    if (!g || !d) goto fail;
    const unsigned char *q = c + 16;
    for (Py_ssize_t i = 0; i < gaps; i++, q += 4) {
        PyObject *t = Py_BuildValue("(II)", (unsigned)(q[0] << 8 | q[1]), (unsigned)(q[2] << 8 | q[3]));
        if (!t) goto fail;
        PyList_SET_ITEM(g, i, t);
    }
    for (Py_ssize_t i = 0; i < dups; i++, q += 4) {
        PyObject *v = PyLong_FromUnsignedLong((unsigned long)rd32(q));
        if (!v) goto fail;
        PyList_SET_ITEM(d, i, v);
    }
    return Py_BuildValue("(kkNN)", (unsigned long)rd32(c + 4), (unsigned long)rd32(c + 8), g, d);
fail:
    Py_XDECREF(g);
    Py_XDECREF(d);
    return NULL;
}

/* open(), then the common cases found: a packet with our verification tag, a right CRC32c and exactly
 * one DATA chunk, or one SACK chunk whose counts fill it (the sender's common packet). A wrong CRC is
 * dropped (o->plain is b"", as aiortc's parse drops it). o->plain is a new reference (NULL on error). */
int rl_open_sctp(RecordLayer *self, PyObject *datagram, unsigned long long vtag, rl_opened *o) {
    o->kind = RL_OTHER;
    o->chunk = NULL;
    o->length = 0;
    Py_buffer d;
    if (PyObject_GetBuffer(datagram, &d, PyBUF_SIMPLE) < 0) return -1;
    o->plain = rl_ready(self) ? rl_open_buffer(self, d.buf, d.len) : NULL;
    PyBuffer_Release(&d);
    if (!o->plain) return -1;
    if (!PyBytes_Check(o->plain)) return 0;
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(o->plain);
    Py_ssize_t n = PyBytes_GET_SIZE(o->plain);
    if (n < SCTP_COMMON_HEADER) return 0;  /* b"" (dropped) or too short: aiortc's parser says so */
    if (!sctp_checksum_ok(p, (size_t)n)) {
        Py_DECREF(o->plain);
        o->plain = rl_dropped(&self->dropped_crc);
        return o->plain ? 0 : -1;
    }
    const unsigned char *c = p + SCTP_COMMON_HEADER;
    Py_ssize_t rest = n - SCTP_COMMON_HEADER, length = rest >= 4 ? (c[2] << 8 | c[3]) : 0;
    /* one chunk, exactly: the packet ends with it and its padding */
    if ((unsigned long long)rd32(p + 4) != vtag || length < 4 || length > rest || rest - length > 3) return 0;
    if (c[0] == 0 && length >= SCTP_DATA_HEADER) {
        o->kind = RL_DATA;
    } else if (c[0] == 3 && length >= 16 && sack_counts_fit(c, length)) {
        o->kind = RL_SACK;  /* any other SACK (counts that disagree) is aiortc's to judge */
    } else {
        return 0;
    }
    o->chunk = c;
    o->length = length;
    return 0;
}

/* A DATA chunk as (flags, tsn, stream_id, stream_seq, ppid, user_data), aiortc's DataChunk fields; a
 * SACK as sack_fields' 4-tuple; anything else as open() left it. Steals o->plain. */
PyObject *rl_opened_fields(rl_opened *o) {
    const unsigned char *c = o->chunk;
    PyObject *out = o->plain;
    if (o->kind == RL_DATA) {
        out = Py_BuildValue("(IkIIky#)", (unsigned)c[1], (unsigned long)rd32(c + 4), (unsigned)(c[8] << 8 | c[9]),
                            (unsigned)(c[10] << 8 | c[11]), (unsigned long)rd32(c + 12),
                            (const char *)c + SCTP_DATA_HEADER, (Py_ssize_t)(o->length - SCTP_DATA_HEADER));
    } else if (o->kind == RL_SACK) {
        out = sack_fields(c);
    }
    if (out != o->plain) Py_DECREF(o->plain);
    return out;
}

/* open(), with the common packets parsed: see the method's docstring in _records.c. */
PyObject *rl_open_data(RecordLayer *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "open_data(datagram, verification_tag)");
        return NULL;
    }
    unsigned long long vtag = PyLong_AsUnsignedLongLong(args[1]);
    if (vtag == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    rl_opened o;
    if (rl_open_sctp(self, args[0], vtag, &o) < 0) return NULL;
    return rl_opened_fields(&o);
}

