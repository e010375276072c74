/* A sender's burst in one call: every DATA chunk one _transmit releases, each built into its SCTP packet
 * (sctp_packet.c), sealed, and all of them sent with one sendmmsg per BURST_MAX packets where the
 * platform has it (Linux), else one sendto each. Why: with the peer SACKing every 8 packets a burst is
 * 8 packets and more, and each paid a Python coroutine, a field tuple and a sendto of its own (engine.p2p.patches
 * .compiled_sctp.data_chunk_sender says where the per-chunk path still runs).
 *
 * On Linux, records of one size in a row (full DATA chunks, and the shorter last one after them) also go
 * as one UDP GSO message (UDP_SEGMENT, Linux 4.18): the kernel builds the UDP/IP packets once for the run
 * and cuts them at the device or the receiving socket, so the datagrams on the wire are the same, one per
 * record. A kernel or route that refuses GSO turns it off for the layer (the records go by sendmmsg). */
#include "records.h"
#include "sctp_packet.h"

#if defined(__linux__)
#define HAVE_SENDMMSG 1
#include <netinet/udp.h>
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#define GSO_MAX_SEGMENTS 64
#define GSO_MAX_BYTES 60000  /* a GSO message stays under IP's 64 KiB */
#endif

#define BURST_MAX 64
#define BURST_BYTES (64 * 1024)

struct rl_burst {
    size_t used;                /* bytes of data holding the records gathered since the last flush */
    int count;                  /* records gathered */
    Py_ssize_t off[BURST_MAX];
    Py_ssize_t len[BURST_MAX];
    unsigned char data[BURST_BYTES];
#ifdef HAVE_SENDMMSG
    struct mmsghdr msgs[BURST_MAX];
    int first[BURST_MAX];       /* the first record of each message */
    struct iovec iov[BURST_MAX];
    union {
        char buf[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } control[BURST_MAX];
#endif
};

static PyObject *s_flags, *s_tsn, *s_stream_id, *s_stream_seq, *s_protocol, *s_user_data;

int rl_burst_init(void) {
    s_flags = PyUnicode_InternFromString("flags");
    s_tsn = PyUnicode_InternFromString("tsn");
    s_stream_id = PyUnicode_InternFromString("stream_id");
    s_stream_seq = PyUnicode_InternFromString("stream_seq");
    s_protocol = PyUnicode_InternFromString("protocol");
    s_user_data = PyUnicode_InternFromString("user_data");
    return s_flags && s_tsn && s_stream_id && s_stream_seq && s_protocol && s_user_data ? 0 : -1;
}

void rl_burst_free(RecordLayer *self) {
    if (self->burst) {
        OPENSSL_cleanse(self->burst->data, sizeof self->burst->data);
        PyMem_Free(self->burst);
        self->burst = NULL;
    }
}

/* An int attribute of the chunk within [0, max]; -1 with an error set otherwise. */
static long long field(PyObject *chunk, PyObject *name, unsigned long long max) {
    PyObject *v = PyObject_GetAttr(chunk, name);
    if (!v) return -1;
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    if (x > max) {
        PyErr_Format(PyExc_ValueError, "DATA chunk field %U out of range: %llu > %llu", name, x, max);
        return -1;
    }
    return (long long)x;
}

/* The records from i on, as bytes, appended to *unsent (made on first use): what the socket refused. */
static int hand_back(struct rl_burst *b, int i, PyObject **unsent) {
    if (!*unsent && !(*unsent = PyList_New(0))) return -1;
    for (; i < b->count; i++) {
        PyObject *r = PyBytes_FromStringAndSize((const char *)b->data + b->off[i], b->len[i]);
        if (!r || PyList_Append(*unsent, r) < 0) {
            Py_XDECREF(r);
            return -1;
        }
        Py_DECREF(r);
    }
    return 0;
}

static int would_block(int err) {
#ifdef _WIN32
    return err == WSAEWOULDBLOCK || err == WSAENOBUFS;
#else
    return err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS;
#endif
}

#ifdef HAVE_SENDMMSG
/* The records from `from` on as messages: one per record, or (GSO) one per run of equal-sized records
 * with at most one shorter record closing it. Returns the number of messages. */
static int messages(RecordLayer *self, struct rl_burst *b, int from) {
    int m = 0;
    for (int k = from; k < b->count; m++) {
        int n = 1;
        if (self->gso) {
            Py_ssize_t size = b->len[k], total = size;
            while (k + n < b->count && n < GSO_MAX_SEGMENTS && total + b->len[k + n] <= GSO_MAX_BYTES &&
                   b->len[k + n] <= size) {
                total += b->len[k + n];
                n++;
                if (b->len[k + n - 1] < size) break;  /* only the last segment may be shorter */
            }
        }
        struct msghdr *h = &b->msgs[m].msg_hdr;
        memset(h, 0, sizeof *h);
        h->msg_name = &self->dest;
        h->msg_namelen = self->dest_len;
        h->msg_iov = &b->iov[k];
        h->msg_iovlen = (size_t)n;
        for (int j = k; j < k + n; j++) {
            b->iov[j].iov_base = b->data + b->off[j];
            b->iov[j].iov_len = (size_t)b->len[j];
        }
        if (n > 1) {
            h->msg_control = b->control[m].buf;
            h->msg_controllen = sizeof b->control[m].buf;
            struct cmsghdr *cm = CMSG_FIRSTHDR(h);
            cm->cmsg_level = SOL_UDP;
            cm->cmsg_type = UDP_SEGMENT;
            cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            uint16_t seg = (uint16_t)b->len[k];
            memcpy(CMSG_DATA(cm), &seg, sizeof seg);
        }
        b->first[m] = k;
        k += n;
    }
    return m;
}

static int gso_refused(int err) { return err == EINVAL || err == EIO || err == ENOPROTOOPT || err == EOPNOTSUPP; }
#endif

/* Send what is gathered. Once the socket refused one record (full), that one and every later record of
 * this call go back to the caller in order, so nothing overtakes what its transport queues. */
static int flush(RecordLayer *self, struct rl_burst *b, PyObject **unsent) {
    int i = 0;
    if (*unsent) return hand_back(b, 0, unsent);
#ifdef HAVE_SENDMMSG
    int count = messages(self, b, 0);
    while (i < count) {
        int r = sendmmsg(self->fd, b->msgs + i, (unsigned)(count - i), 0);
        if (r > 0) {
            i += r;
        } else if (r < 0 && errno == EINTR) {
            continue;
        } else if (r < 0 && would_block(errno)) {
            return hand_back(b, b->first[i], unsent);
        } else if (r < 0 && self->gso && b->msgs[i].msg_hdr.msg_iovlen > 1 && gso_refused(errno)) {
            self->gso = 0;  /* no UDP GSO here: this message and the rest again, a record each */
            int from = b->first[i];
            count = messages(self, b, from);
            i = 0;
        } else {
            i++;  /* refused for another reason (an ICMP error reported late): lost, as on the wire */
        }
    }
#else
    for (; i < b->count; i++) {
#ifdef _WIN32
        int sent = sendto((SOCKET)self->fd, (const char *)b->data + b->off[i], (int)b->len[i], 0,
                          (struct sockaddr *)&self->dest, self->dest_len);
        int err = sent < 0 ? WSAGetLastError() : 0;
#else
        ssize_t sent;
        do {
            sent = sendto(self->fd, b->data + b->off[i], (size_t)b->len[i], 0, (struct sockaddr *)&self->dest,
                          self->dest_len);
        } while (sent < 0 && errno == EINTR);
        int err = sent < 0 ? errno : 0;
#endif
        if (sent < 0 && would_block(err)) return hand_back(b, i, unsent);
    }
#endif
    return 0;
}

PyObject *rl_send_data_chunks(RecordLayer *self, PyObject *args) {
    unsigned long long src, dst, vtag;
    PyObject *chunks;
    if (!PyArg_ParseTuple(args, "KKKO!", &src, &dst, &vtag, &PyList_Type, &chunks)) return NULL;
    if (!rl_ready(self) || rl_no_destination(self)) return NULL;
    if (src > 0xffff || dst > 0xffff || vtag > 0xffffffffull) {
        PyErr_SetString(PyExc_ValueError, "SCTP ports are 16 bits and the verification tag 32");
        return NULL;
    }
    if (!self->burst && !(self->burst = PyMem_Malloc(sizeof *self->burst))) return PyErr_NoMemory();
    struct rl_burst *b = self->burst;
    b->used = 0;
    b->count = 0;
    PyObject *unsent = NULL;
    unsigned long long packets = 0, packet_bytes = 0;
    const Py_ssize_t most = MAX_PLAIN - SCTP_COMMON_HEADER - SCTP_DATA_HEADER - 3;
    /* The list is the caller's and stays alive; an item is read before anything that could run Python. */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(chunks); i++) {
        PyObject *c = PyList_GET_ITEM(chunks, i);
        Py_INCREF(c);
        long long flags = field(c, s_flags, 0xff), tsn = flags < 0 ? -1 : field(c, s_tsn, 0xffffffffull);
        long long sid = tsn < 0 ? -1 : field(c, s_stream_id, 0xffff);
        long long ssn = sid < 0 ? -1 : field(c, s_stream_seq, 0xffff);
        long long ppid = ssn < 0 ? -1 : field(c, s_protocol, 0xffffffffull);
        PyObject *data = ppid < 0 ? NULL : PyObject_GetAttr(c, s_user_data);
        Py_DECREF(c);
        Py_buffer d;
        if (!data || PyObject_GetBuffer(data, &d, PyBUF_SIMPLE) < 0) {
            Py_XDECREF(data);
            goto fail;
        }
        Py_DECREF(data);  /* the buffer view keeps the bytes alive */
        if (d.len > most) {
            PyErr_Format(PyExc_ValueError, "a DATA chunk here carries at most %zd bytes", most);
            PyBuffer_Release(&d);
            goto fail;
        }
        size_t need = (size_t)(SCTP_COMMON_HEADER + SCTP_DATA_HEADER + d.len + 3 + RECORD_OVERHEAD);
        if (b->count == BURST_MAX || b->used + need > BURST_BYTES) {
            if (flush(self, b, &unsent) < 0) {
                PyBuffer_Release(&d);
                goto fail;
            }
            b->used = 0;
            b->count = 0;
        }
        size_t n = sctp_data_packet(self->pkt, (unsigned)src, (unsigned)dst, (uint32_t)vtag, (unsigned)flags,
                                    (uint32_t)tsn, (unsigned)sid, (unsigned)ssn, (uint32_t)ppid, d.buf,
                                    (size_t)d.len);
        PyBuffer_Release(&d);
        Py_ssize_t rec = rl_seal_to(self, b->data + b->used, self->pkt, (Py_ssize_t)n, APPLICATION_DATA);
        if (rec < 0) goto fail;
        b->off[b->count] = (Py_ssize_t)b->used;
        b->len[b->count] = rec;
        b->count++;
        b->used += (size_t)rec;
        packets++;
        packet_bytes += n;
    }
    if (flush(self, b, &unsent) < 0) goto fail;
    return Py_BuildValue("(KKN)", packets, packet_bytes, unsent ? unsent : Py_NewRef(Py_None));
fail:
    /* Only a chunk with impossible fields or no memory gets here: the chunks before it still go (their
     * records are sealed, their sequence numbers spent), then the error is raised. */
    if (b->count) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (flush(self, b, &unsent) < 0) PyErr_Clear();
        PyErr_Restore(type, value, tb);
    }
    Py_XDECREF(unsent);
    return NULL;
}
