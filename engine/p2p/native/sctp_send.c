/* The sender's per-chunk bookkeeping, in C on aiortc's own objects: the two loops of the project's SCTP
 * sender (engine.p2p.patches.sctp_sender) that run once per DATA chunk. take_new_chunks is _transmit's
 * loop over new chunks (window, peer's window, PRR quota and pacing tokens spent, _first_send's fields,
 * the I bit); ack_cumulative is _receive_sack_chunk's loop over the chunks a cumulative ack covers. Why:
 * with SACKs every 16 packets and records, packets and their sendmmsg in C, these loops were the
 * sender's largest Python cost per packet. The Python loops stay beside them, used where this module
 * is not loaded, and they are the oracle: tests run whole associations both ways and compare. */
#include "records.h"

#define I_BIT 0x08

static PyObject *s_outbound, *s_sent, *s_peer_rwnd, *s_flight, *s_in_recovery, *s_prr_out, *s_prr_quota, *s_cc,
    *s_cwnd, *s_pacing_rate, *s_pace_tokens, *s_delivered, *s_delivered_time, *s_first_sent_time,
    *s_app_limited_until, *s_mark_waits, *s_dc_queue, *s_flushing, *s_stats, *s_rwnd_limited, *s_last_progress,
    *s_book_size, *s_in_flight, *s_sent_count, *s_sent_time, *s_del, *s_del_t, *s_first_t, *s_app_limited,
    *s_flags, *s_tsn, *s_acked, *s_abandoned, *s_popleft, *s_append;

int rl_send_init(void) {
    struct { PyObject **slot; const char *name; } names[] = {
        {&s_outbound, "_outbound_queue"}, {&s_sent, "_sent_queue"}, {&s_peer_rwnd, "_peer_rwnd"},
        {&s_flight, "_flight_size"}, {&s_in_recovery, "_in_recovery"}, {&s_prr_out, "_prr_out"},
        {&s_prr_quota, "_prr_quota"}, {&s_cc, "_cc"}, {&s_cwnd, "cwnd"}, {&s_pacing_rate, "pacing_rate"},
        {&s_pace_tokens, "_pace_tokens"}, {&s_delivered, "_delivered"}, {&s_delivered_time, "_delivered_time"},
        {&s_first_sent_time, "_first_sent_time"}, {&s_app_limited_until, "_app_limited_until"},
        {&s_mark_waits, "_lah_mark_waits"}, {&s_dc_queue, "_data_channel_queue"}, {&s_flushing, "_flushing"},
        {&s_stats, "_lah_stats"}, {&s_rwnd_limited, "rwnd_limited"}, {&s_last_progress, "_last_progress"},
        {&s_book_size, "_book_size"}, {&s_in_flight, "_in_flight"}, {&s_sent_count, "_sent_count"},
        {&s_sent_time, "_sent_time"}, {&s_del, "_del"}, {&s_del_t, "_del_t"}, {&s_first_t, "_first_t"},
        {&s_app_limited, "_app_limited"}, {&s_flags, "flags"}, {&s_tsn, "tsn"}, {&s_acked, "_acked"},
        {&s_abandoned, "_abandoned"}, {&s_popleft, "popleft"}, {&s_append, "append"},

    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(*names[i].slot = PyUnicode_InternFromString(names[i].name))) return -1;
    return 0;
}

/* An attribute as a C integer or double; -1 with an error set when missing or of another type. */
static int ll_attr(PyObject *o, PyObject *name, long long *v) {
    PyObject *x = PyObject_GetAttr(o, name);
    if (!x) return -1;
    *v = PyLong_AsLongLong(x);
    Py_DECREF(x);
    return *v == -1 && PyErr_Occurred() ? -1 : 0;
}

static int d_attr(PyObject *o, PyObject *name, double *v) {
    PyObject *x = PyObject_GetAttr(o, name);
    if (!x) return -1;
    *v = PyFloat_AsDouble(x);
    Py_DECREF(x);
    return *v == -1.0 && PyErr_Occurred() ? -1 : 0;
}

static int truth_attr(PyObject *o, PyObject *name) {
    PyObject *x = PyObject_GetAttr(o, name);
    if (!x) return -1;
    int t = PyObject_IsTrue(x);
    Py_DECREF(x);
    return t;
}

static int set_ll(PyObject *o, PyObject *name, long long v) {
    PyObject *x = PyLong_FromLongLong(v);
    int r = x ? PyObject_SetAttr(o, name, x) : -1;
    Py_XDECREF(x);
    return r;
}

/* The first chunk of a queue (a new reference in *c): 1, or 0 when the queue is empty, -1 on an error. */
static int front(PyObject *queue, PyObject **c) {
    Py_ssize_t n = PyObject_Length(queue);
    if (n <= 0) return n < 0 ? -1 : 0;
    *c = PySequence_GetItem(queue, 0);
    return *c ? 1 : -1;
}

/* Two int fields written back after a loop, also when it failed: the error it raised stays the one the
 * caller sees. -1 when the loop or a write failed. */
static int write_back(PyObject *t, PyObject *a, long long va, PyObject *b, long long vb, int failed) {
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    if (failed) PyErr_Fetch(&type, &value, &tb);
    failed = set_ll(t, a, va) < 0 || set_ll(t, b, vb) < 0 || failed;
    if (type) PyErr_Restore(type, value, tb);
    return failed ? -1 : 0;
}

/* take_new_chunks(transport, budget, now, burst) -> (budget, blocked, flush)
 * _transmit's loop over new chunks: see the module comment and sctp_sender._transmit, whose loop this
 * is, line for line, up to the point where the nested flush would run (then flush is True and Python
 * goes on from there). The chunks taken are appended to burst, in order, for the caller to send. */
PyObject *rl_take_new_chunks(PyObject *m, PyObject *args) {
    PyObject *t, *now, *burst;
    double budget;
    if (!PyArg_ParseTuple(args, "OdO!O!", &t, &budget, &PyFloat_Type, &now, &PyList_Type, &burst)) return NULL;
    PyObject *outbound = NULL, *q = NULL, *cc = NULL, *dcq = NULL, *pacing = NULL, *delivered = NULL;
    PyObject *del_t = NULL, *first_t = NULL, *app_limited = NULL, *stats = NULL, *result = NULL;
    long long peer_rwnd, flight, prr_out = 0, prr_quota = 0, cwnd, delivered_v, app_until, rwnd_limited = 0;
    double tokens = 0;
    int in_recovery, mark_waits, flushing, paced, blocked = 0, flush = 0, progressed = 0, failed = 0;
    if (!(outbound = PyObject_GetAttr(t, s_outbound)) || !(q = PyObject_GetAttr(t, s_sent)) ||
        !(cc = PyObject_GetAttr(t, s_cc)) || !(dcq = PyObject_GetAttr(t, s_dc_queue)) ||
        !(pacing = PyObject_GetAttr(cc, s_pacing_rate)) || !(delivered = PyObject_GetAttr(t, s_delivered)) ||
        !(del_t = PyObject_GetAttr(t, s_delivered_time)) || !(first_t = PyObject_GetAttr(t, s_first_sent_time)) ||
        !(stats = PyObject_GetAttr(t, s_stats)))
        goto out;
    if (ll_attr(t, s_peer_rwnd, &peer_rwnd) < 0 || ll_attr(t, s_flight, &flight) < 0 ||
        ll_attr(cc, s_cwnd, &cwnd) < 0 || ll_attr(t, s_app_limited_until, &app_until) < 0)
        goto out;
    delivered_v = PyLong_AsLongLong(delivered);
    if (delivered_v == -1 && PyErr_Occurred()) goto out;
    if ((in_recovery = truth_attr(t, s_in_recovery)) < 0 || (mark_waits = truth_attr(t, s_mark_waits)) < 0 ||
        (flushing = truth_attr(t, s_flushing)) < 0 || (paced = PyObject_IsTrue(pacing)) < 0)
        goto out;
    if (in_recovery && (ll_attr(t, s_prr_out, &prr_out) < 0 || ll_attr(t, s_prr_quota, &prr_quota) < 0)) goto out;
    if (paced && d_attr(t, s_pace_tokens, &tokens) < 0) goto out;

    app_limited = PyBool_FromLong(delivered_v < app_until);
    /* From here chunks move: on an error the loop stops and what it did is still written back. */
    for (;;) {
        PyObject *c;
        int k = front(outbound, &c);
        if (k <= 0) {
            failed = k < 0;
            break;
        }
        long long size, count;
        int bad = ll_attr(c, s_book_size, &size) < 0;
        if (!bad && budget < (double)size) {
            blocked = 1;
        } else if (!bad && peer_rwnd < size && flight > 0) {
            rwnd_limited++;
        } else if (!bad) {
            PyObject *r = PyObject_CallMethodNoArgs(outbound, s_popleft);
            bad = !r;
            Py_XDECREF(r);
            r = bad ? NULL : PyObject_CallMethodOneArg(q, s_append, c);
            bad = !r;
            Py_XDECREF(r);
            if (!bad) {
                budget -= (double)size;
                if (in_recovery) {
                    prr_out += size;
                    prr_quota -= size;
                }
                if (paced) tokens -= (double)size;
                peer_rwnd = peer_rwnd - size > 0 ? peer_rwnd - size : 0;
                /* _first_send */
                if (PyObject_Length(q) == 1) progressed = 1;
                int in_flight = truth_attr(c, s_in_flight);
                bad = in_flight < 0;
                if (!bad && !in_flight) {
                    bad = PyObject_SetAttr(c, s_in_flight, Py_True) < 0;
                    flight += size;
                }
                bad = bad || ll_attr(c, s_sent_count, &count) < 0 || set_ll(c, s_sent_count, count + 1) < 0 ||
                      PyObject_SetAttr(c, s_sent_time, now) < 0 || PyObject_SetAttr(c, s_del, delivered) < 0 ||
                      PyObject_SetAttr(c, s_del_t, del_t) < 0 || PyObject_SetAttr(c, s_first_t, first_t) < 0 ||
                      PyObject_SetAttr(c, s_app_limited, app_limited) < 0;
            }
            Py_ssize_t more = bad ? 0 : PyObject_Length(outbound), dc = bad ? 0 : PyObject_Length(dcq);
            bad = bad || more < 0 || dc < 0;
            if (!bad && mark_waits) {  /* waits_after: the last chunk before a SACK asks for it at once */
                int waits = 0;
                if (more == 0) {
                    waits = dc == 0;
                } else {
                    PyObject *next = PySequence_GetItem(outbound, 0);
                    long long next_size;
                    bad = !next || ll_attr(next, s_book_size, &next_size) < 0;
                    Py_XDECREF(next);
                    long long room = in_recovery ? prr_quota : cwnd - flight;
                    waits = !bad && (room < next_size || peer_rwnd < next_size);
                }
                long long flags;
                if (!bad && waits) bad = ll_attr(c, s_flags, &flags) < 0 || set_ll(c, s_flags, flags | I_BIT) < 0;
            }
            bad = bad || PyList_Append(burst, c) < 0;
            if (!bad && more == 0 && dc > 0 && !flushing) flush = 1;
            if (!bad && !flush) {
                Py_DECREF(c);
                continue;
            }
        }
        Py_DECREF(c);
        failed = bad;
        break;
    }
    /* Write back what the loop kept in C. */
    if (write_back(t, s_peer_rwnd, peer_rwnd, s_flight, flight, failed) < 0) goto out;
    if (in_recovery && (set_ll(t, s_prr_out, prr_out) < 0 || set_ll(t, s_prr_quota, prr_quota) < 0)) goto out;
    if (paced) {
        PyObject *x = PyFloat_FromDouble(tokens);
        int r = x ? PyObject_SetAttr(t, s_pace_tokens, x) : -1;
        Py_XDECREF(x);
        if (r < 0) goto out;
    }
    if (progressed && PyObject_SetAttr(t, s_last_progress, now) < 0) goto out;
    if (rwnd_limited) {
        long long n;
        if (ll_attr(stats, s_rwnd_limited, &n) < 0 || set_ll(stats, s_rwnd_limited, n + rwnd_limited) < 0) goto out;
    }
    result = Py_BuildValue("(dOO)", budget, blocked ? Py_True : Py_False, flush ? Py_True : Py_False);
out:
    Py_XDECREF(outbound);
    Py_XDECREF(q);
    Py_XDECREF(cc);
    Py_XDECREF(dcq);
    Py_XDECREF(pacing);
    Py_XDECREF(delivered);
    Py_XDECREF(del_t);
    Py_XDECREF(first_t);
    Py_XDECREF(app_limited);
    Py_XDECREF(stats);
    return result;
}

/* aiortc.utils.uint32_gte */
static int gte32(uint32_t a, uint32_t b) {
    return a == b || (a < b && b - a > 0x80000000u) || (a > b && a - b < 0x80000000u);
}

/* ack_cumulative(transport, cum) -> (newly_acked, newest)
 * _receive_sack_chunk's loop over the chunks the cumulative TSN covers: popped from the sent queue,
 * each not yet acked or abandoned counted delivered (newest: the latest sent of them, or None), and
 * every one out of the flight. _delivered and _flight_size are written back. */
PyObject *rl_ack_cumulative(PyObject *m, PyObject *args) {
    PyObject *t;
    unsigned long cum;
    if (!PyArg_ParseTuple(args, "Ok", &t, &cum)) return NULL;
    if (cum > 0xffffffffUL) {
        PyErr_SetString(PyExc_ValueError, "a TSN is 32 bits");
        return NULL;
    }
    PyObject *q = PyObject_GetAttr(t, s_sent), *newest = NULL, *result = NULL;
    long long delivered, flight, n_new = 0;
    double newest_time = 0;
    int failed = 0;
    if (!q || ll_attr(t, s_delivered, &delivered) < 0 || ll_attr(t, s_flight, &flight) < 0) goto out;
    for (;;) {
        PyObject *c;
        long long tsn, size;
        int k = front(q, &c);
        if (k <= 0 || ll_attr(c, s_tsn, &tsn) < 0) {
            if (k > 0) Py_DECREF(c);
            failed = k != 0;
            break;
        }
        if (!gte32((uint32_t)cum, (uint32_t)tsn)) {
            Py_DECREF(c);
            break;
        }
        PyObject *r = PyObject_CallMethodNoArgs(q, s_popleft);
        int acked = r ? truth_attr(c, s_acked) : -1, abandoned = acked < 0 ? -1 : truth_attr(c, s_abandoned);
        Py_XDECREF(r);
        int in_flight = abandoned < 0 ? -1 : truth_attr(c, s_in_flight);
        int bad = in_flight < 0 || ll_attr(c, s_book_size, &size) < 0;
        if (!bad && !acked && !abandoned) {
            double sent;
            bad = d_attr(c, s_sent_time, &sent) < 0;
            delivered += size;
            n_new++;
            if (!bad && (!newest || sent >= newest_time)) {
                Py_XSETREF(newest, Py_NewRef(c));
                newest_time = sent;
            }
        }
        if (!bad && in_flight) {
            bad = PyObject_SetAttr(c, s_in_flight, Py_False) < 0;
            flight -= size;
        }
        Py_DECREF(c);
        if (bad) {
            failed = 1;
            break;
        }
    }
    if (write_back(t, s_delivered, delivered, s_flight, flight, failed) < 0) goto out;
    result = Py_BuildValue("(LO)", n_new, newest ? newest : Py_None);
out:
    Py_XDECREF(q);
    Py_XDECREF(newest);
    return result;
}
