/* The receiver's most common packet handled where it is opened: one DATA chunk, next in TSN order, that
 * does not end a message. Why: each such packet still cost five Python calls after the C parse
 * (receive_one_chunk, _receive_data_chunk, _mark_received, the stream's add_chunk and pop_messages, and
 * _send_sack's count) for what is a few field updates. Here they are made in C on aiortc's own objects,
 * with the effect those calls have on this path, so the Python receiver (engine.p2p.patches.sctp_receiver)
 * and this one share one state and either may take the next packet. Anything else (a gap, a duplicate,
 * a last fragment, a new stream, a deferred stream reset, a closing association, a full receive window:
 * no bytes or fragment room left, where Python decides what to drop) is left to Python,
 * which also remains the oracle: tests feed the same packets to both and compare every field. */
#include "records.h"
#include "sctp_packet.h"

#define LAST_FRAGMENT 0x01
#define I_BIT 0x08

/* receiver_types(): aiortc's DataChunk, the patched InboundStream class, State.ESTABLISHED, object.__new__ */
static PyObject *chunk_type, *stream_type, *established, *object_new;

static PyObject *a_reconfig, *a_state, *a_misordered, *a_duplicates, *a_last_tsn, *a_streams, *a_settled,
    *a_reassembly, *a_sack_needed, *a_sack_urgent, *a_rwnd, *a_packets, *a_every, *a_reported_gaps, *a_due_at,
    *a_timer, *a_vtag, *a_room, *f_flags, *f_tsn, *f_stream_id, *f_stream_seq, *f_protocol, *f_user_data;

int rl_receive_init(void) {
    struct { PyObject **slot; const char *name; } names[] = {
        {&a_reconfig, "_reconfig_deferred"}, {&a_state, "_association_state"},
        {&a_misordered, "_sack_misordered"}, {&a_duplicates, "_sack_duplicates"},
        {&a_last_tsn, "_last_received_tsn"}, {&a_streams, "_inbound_streams"}, {&a_settled, "_settled"},
        {&a_reassembly, "reassembly"}, {&a_sack_needed, "_sack_needed"}, {&a_sack_urgent, "_sack_urgent"},
        {&a_rwnd, "_advertised_rwnd"}, {&a_packets, "_sack_packets"}, {&a_every, "_lah_sack_every"},
        {&a_reported_gaps, "_sack_reported_gaps"}, {&a_due_at, "_sack_due_at"}, {&a_timer, "_sack_timer"},
        {&a_vtag, "_local_verification_tag"}, {&a_room, "_lah_fragment_room"}, {&f_flags, "flags"}, {&f_tsn, "tsn"},
        {&f_stream_id, "stream_id"}, {&f_stream_seq, "stream_seq"}, {&f_protocol, "protocol"},
        {&f_user_data, "user_data"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(*names[i].slot = PyUnicode_InternFromString(names[i].name))) return -1;
    return 0;
}

PyObject *rl_receiver_types(PyObject *m, PyObject *args) {
    PyObject *c, *s, *e, *n;
    if (!PyArg_ParseTuple(args, "O!O!OO", &PyType_Type, &c, &PyType_Type, &s, &e, &n)) return NULL;
    Py_XSETREF(chunk_type, Py_NewRef(c));
    Py_XSETREF(stream_type, Py_NewRef(s));
    Py_XSETREF(established, Py_NewRef(e));
    Py_XSETREF(object_new, Py_NewRef(n));
    Py_RETURN_NONE;
}

/* 1 and *out (a new reference) when o has the attribute; 0 when it has not (not an error: the object is
 * not the one this path knows, so Python takes the packet); -1 on any other error. */
static int get(PyObject *o, PyObject *name, PyObject **out) {
    *out = PyObject_GetAttr(o, name);
    if (*out) return 1;
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
    PyErr_Clear();
    return 0;
}

/* aiortc.utils.uint32_gt */
static int gt32(uint32_t a, uint32_t b) {
    return (a < b && b - a > 0x80000000u) || (a > b && a - b < 0x80000000u);
}

static int set_int(PyObject *o, PyObject *name, long long v) {
    PyObject *x = PyLong_FromLongLong(v);
    int r = x ? PyObject_SetAttr(o, name, x) : -1;
    Py_XDECREF(x);
    return r;
}

/* An int attribute as a C value; 0 when missing or not an int (then Python takes the packet). */
static int get_ll(PyObject *o, PyObject *name, long long *v) {
    PyObject *x;
    int r = get(o, name, &x);
    if (r <= 0) return r;
    if (!PyLong_CheckExact(x)) {
        Py_DECREF(x);
        return 0;
    }
    *v = PyLong_AsLongLong(x);
    Py_DECREF(x);
    return *v == -1 && PyErr_Occurred() ? -1 : 1;
}

/* Whether every condition of the fast path holds; *stream, *r borrowed-then-owned (new references). */
static int eligible(PyObject *t, uint32_t tsn, unsigned sid, PyObject **stream, PyObject **r) {
    PyObject *v;
    int k;
    *stream = *r = NULL;
    if ((k = get(t, a_reconfig, &v)) <= 0) return k;
    Py_DECREF(v);
    if (v != Py_None) return 0;
    if ((k = get(t, a_state, &v)) <= 0) return k;
    Py_DECREF(v);
    if (v != established) return 0;
    PyObject *names[] = {a_misordered, a_duplicates};
    for (int i = 0; i < 2; i++) {  /* nothing out of order or duplicated waits to be reported */
        if ((k = get(t, names[i], &v)) <= 0) return k;
        Py_ssize_t n = PyObject_Length(v);
        Py_DECREF(v);
        if (n != 0) return n < 0 ? -1 : 0;
    }
    long long last;
    if ((k = get_ll(t, a_last_tsn, &last)) <= 0) return k;
    if (((uint32_t)last + 1u) != tsn) return 0;
    if ((k = get(t, a_streams, &v)) <= 0) return k;
    if (!PyDict_CheckExact(v)) {
        Py_DECREF(v);
        return 0;
    }
    PyObject *key = PyLong_FromUnsignedLong(sid);
    PyObject *s = key ? PyDict_GetItemWithError(v, key) : NULL;
    Py_XDECREF(key);
    Py_DECREF(v);
    if (!s) return PyErr_Occurred() ? -1 : 0;  /* a new stream: Python makes it */
    if ((PyObject *)Py_TYPE(s) != stream_type) return 0;
    Py_INCREF(s);
    *stream = s;
    if ((k = get(s, a_settled, &v)) <= 0) return k;
    Py_DECREF(v);
    if (v != Py_True) return 0;  /* a scan was cut short: Python's pop_messages scans again */
    if ((k = get(s, a_reassembly, r)) <= 0) return k;
    if (!PyList_CheckExact(*r)) return 0;
    Py_ssize_t n = PyList_GET_SIZE(*r);
    if (n) {  /* appended after every buffered fragment, as add_chunk's fast branch does */
        long long top;
        if ((k = get_ll(PyList_GET_ITEM(*r, n - 1), f_tsn, &top)) <= 0) return k;
        if (!gt32(tsn, (uint32_t)top)) return 0;
    }
    return 1;
}

static PyObject *new_chunk(const unsigned char *c, Py_ssize_t length) {
    PyObject *chunk = PyObject_CallOneArg(object_new, chunk_type);
    if (!chunk) return NULL;
    struct { PyObject *name; PyObject *value; } fields[] = {
        {f_flags, PyLong_FromUnsignedLong(c[1])},
        {f_tsn, PyLong_FromUnsignedLong(rd32(c + 4))},
        {f_stream_id, PyLong_FromUnsignedLong((unsigned long)(c[8] << 8 | c[9]))},
        {f_stream_seq, PyLong_FromUnsignedLong((unsigned long)(c[10] << 8 | c[11]))},
        {f_protocol, PyLong_FromUnsignedLong(rd32(c + 12))},
        {f_user_data, PyBytes_FromStringAndSize((const char *)c + SCTP_DATA_HEADER, length - SCTP_DATA_HEADER)},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        bad = bad || !fields[i].value || PyObject_SetAttr(chunk, fields[i].name, fields[i].value) < 0;
        Py_XDECREF(fields[i].value);
    }
    if (bad) Py_CLEAR(chunk);
    return chunk;
}

/* The chunk taken: 1 and *code (0 nothing more, 1 SACK now, 2 arm the SACK timer); 0 not taken; -1 error. */
static int take(PyObject *t, const unsigned char *c, Py_ssize_t length, int *code) {
    unsigned flags = c[1];
    if (flags & LAST_FRAGMENT || !chunk_type) return 0;  /* a message may complete: Python delivers it */
    uint32_t tsn = rd32(c + 4);
    PyObject *stream, *r;
    int k = eligible(t, tsn, (unsigned)(c[8] << 8 | c[9]), &stream, &r);
    long long rwnd = 0, room = 0, packets = 0, every = 0;
    if (k > 0) k = get_ll(t, a_rwnd, &rwnd);
    if (k > 0) k = get_ll(t, a_room, &room);
    if (k > 0 && (rwnd <= 0 || room <= 0)) k = 0;  /* the window is full: Python drops the chunk */
    if (k > 0) k = get_ll(t, a_packets, &packets);
    if (k > 0) k = get_ll(t, a_every, &every);
    if (k <= 0) {
        Py_XDECREF(stream);
        Py_XDECREF(r);
        return k;
    }
    /* From here on state changes, as _receive_data_chunk's and _send_sack's Python would change it. */
    PyObject *chunk = new_chunk(c, length);
    int rc = -1;
    if (!chunk || PyList_Append(r, chunk) < 0) goto out;
    if (PyObject_SetAttr(t, a_sack_needed, Py_True) < 0) goto out;
    if (flags & I_BIT && PyObject_SetAttr(t, a_sack_urgent, Py_True) < 0) goto out;
    if (set_int(t, a_last_tsn, tsn) < 0 || set_int(t, a_rwnd, rwnd - (length - SCTP_DATA_HEADER)) < 0) goto out;
    if (set_int(t, a_room, room - 1) < 0) goto out;
    if (set_int(t, a_packets, ++packets) < 0) goto out;
    PyObject *gaps, *urgent, *due, *timer;
    if (get(t, a_reported_gaps, &gaps) <= 0) goto out;
    if (get(t, a_sack_urgent, &urgent) <= 0) {
        Py_DECREF(gaps);
        goto out;
    }
    int now = packets >= every || PyObject_IsTrue(gaps) || PyObject_IsTrue(urgent);
    Py_DECREF(gaps);
    Py_DECREF(urgent);
    *code = now ? 1 : 0;
    if (!now) {
        if (get(t, a_due_at, &due) <= 0) goto out;
        if (get(t, a_timer, &timer) <= 0) {
            Py_DECREF(due);
            goto out;
        }
        *code = due == Py_None || timer == Py_None ? 2 : 0;
        Py_DECREF(due);
        Py_DECREF(timer);
    }
    rc = 1;
out:
    if (rc < 0 && !PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "SCTP receiver state changed under us");
    Py_XDECREF(chunk);
    Py_DECREF(stream);
    Py_DECREF(r);
    return rc;
}

PyObject *rl_open_receive(RecordLayer *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "open_receive(datagram, sctp_transport)");
        return NULL;
    }
    PyObject *t = args[1], *tag;
    if (get(t, a_vtag, &tag) <= 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "open_receive: not an SCTP transport");
        return NULL;
    }
    unsigned long long vtag = PyLong_AsUnsignedLongLong(tag);
    Py_DECREF(tag);
    if (vtag == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    rl_opened o;
    if (rl_open_sctp(self, args[0], vtag, &o) < 0) return NULL;
    if (o.kind == RL_DATA) {
        int code = 0, k = take(t, o.chunk, o.length, &code);
        if (k != 0) {
            Py_DECREF(o.plain);
            return k < 0 ? NULL : PyLong_FromLong(code);
        }
    }
    return rl_opened_fields(&o);
}
