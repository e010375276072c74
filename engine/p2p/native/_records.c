/* The module engine.p2p.native._records: the RecordLayer type (its constructor, its end, its tables) and
 * the module's own table, listing what the files below it export (records.h draws those layers). Why,
 * and what stays in OpenSSL: module_doc below (it is also the module's __doc__). */
#include "records.h"
#include "sctp_packet.h"

static const char module_doc[] =
    "DTLS 1.2 application-data records sealed, opened and sent in C.\n\n"
    "After the handshake every ~1.2 kB SCTP packet of a data channel cost ~17 us of Python in\n"
    "pyOpenSSL's record calls (bio_write, SSL_read, bio_read, buffers, error checks) against well\n"
    "under 1 us of AEAD work; here sealing or opening a record is one call of about 1 us, and\n"
    "seal_send also does the sendto. The handshake, the keys (derived in Python from the session,\n"
    "engine.p2p.native.keys) and every record that is not application data of the current epoch stay\n"
    "in OpenSSL: open() answers None for those so the caller hands them over. Records are byte-exact\n"
    "RFC 6347 DTLS 1.2 with RFC 5288 AES-GCM (explicit nonce = epoch || seq, as OpenSSL writes it)\n"
    "or RFC 7905 ChaCha20-Poly1305, so browsers and stock OpenSSL open them, and the reverse.";

/* An int argument in lo..hi, else ValueError (OverflowError too: the brief's contract is ValueError). */
static int int_in(PyObject *o, long long lo, long long hi, const char *what, long long *out) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow || v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "%s must be in %lld..%lld, got %R", what, lo, hi, o);
        return -1;
    }
    *out = v;
    return 0;
}

static int init(RecordLayer *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"cipher", "write_key", "write_iv", "read_key", "read_iv",
                            "epoch", "write_seq", "read_seq_top", NULL};
    const char *cipher;
    Py_buffer wk, wi, rk, ri;
    PyObject *epoch_o, *write_o, *top_o;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sy*y*y*y*OOO:RecordLayer", names, &cipher, &wk, &wi, &rk, &ri,
                                     &epoch_o, &write_o, &top_o))
        return -1;
    int rc = -1, gcm = 1;
    const EVP_CIPHER *evp;
    Py_ssize_t key_len, iv_len = 4;
    long long epoch, write_seq, read_top;
    EVP_CIPHER_CTX *enc = NULL, *dec = NULL;
    PyObject *name = NULL;
    if (strcmp(cipher, "AES128-GCM") == 0) {
        evp = EVP_aes_128_gcm(); key_len = 16;
    } else if (strcmp(cipher, "AES256-GCM") == 0) {
        evp = EVP_aes_256_gcm(); key_len = 32;
    } else if (strcmp(cipher, "CHACHA20-POLY1305") == 0) {
        evp = EVP_chacha20_poly1305(); key_len = 32; iv_len = 12; gcm = 0;
    } else {
        PyErr_Format(PyExc_ValueError, "unsupported cipher %s (AES128-GCM, AES256-GCM, CHACHA20-POLY1305)", cipher);
        goto out;
    }
    if (wk.len != key_len || rk.len != key_len || wi.len != iv_len || ri.len != iv_len) {
        PyErr_Format(PyExc_ValueError, "%s takes %zd-byte keys and %zd-byte IVs, got keys of %zd and %zd, IVs of %zd and %zd",
                     cipher, key_len, iv_len, wk.len, rk.len, wi.len, ri.len);
        goto out;
    }
    if (int_in(epoch_o, 0, 65535, "epoch", &epoch) < 0 ||
        int_in(write_o, 0, (long long)SEQ_MAX, "write_seq", &write_seq) < 0 ||
        int_in(top_o, -1, (long long)SEQ_MAX, "read_seq_top", &read_top) < 0)
        goto out;
    enc = EVP_CIPHER_CTX_new();
    dec = EVP_CIPHER_CTX_new();
    if (!enc || !dec || EVP_EncryptInit_ex(enc, evp, NULL, NULL, NULL) != 1 ||
        EVP_CIPHER_CTX_ctrl(enc, EVP_CTRL_AEAD_SET_IVLEN, 12, NULL) != 1 ||
        EVP_EncryptInit_ex(enc, NULL, NULL, wk.buf, NULL) != 1 ||
        EVP_DecryptInit_ex(dec, evp, NULL, NULL, NULL) != 1 ||
        EVP_CIPHER_CTX_ctrl(dec, EVP_CTRL_AEAD_SET_IVLEN, 12, NULL) != 1 ||
        EVP_DecryptInit_ex(dec, NULL, NULL, rk.buf, NULL) != 1) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL refused the cipher or key");
        goto out;
    }
    if (!(name = PyUnicode_FromString(cipher))) goto out;
    /* Everything checked: only now replace the state (a failed second __init__ leaves the old one). */
    EVP_CIPHER_CTX_free(self->enc);
    EVP_CIPHER_CTX_free(self->dec);
    self->enc = enc;
    self->dec = dec;
    enc = dec = NULL;
    Py_XSETREF(self->cipher, name);
    self->gcm = gcm;
    memcpy(self->write_iv, wi.buf, (size_t)iv_len);
    memcpy(self->read_iv, ri.buf, (size_t)iv_len);
    self->epoch = (uint16_t)epoch;
    self->write_seq = (uint64_t)write_seq;
    self->read_top = read_top;
    self->window = read_top < 0 ? 0 : ~(uint64_t)0;  /* OpenSSL processed everything up to the top */
    self->dest_len = 0;
    self->fd = -1;
    self->gso = 1;
    self->sealed = self->opened = self->dropped_auth = self->dropped_replay = self->dropped_short = 0;
    self->dropped_crc = 0;
    rc = 0;
out:
    EVP_CIPHER_CTX_free(enc);
    EVP_CIPHER_CTX_free(dec);
    PyBuffer_Release(&wk);
    PyBuffer_Release(&wi);
    PyBuffer_Release(&rk);
    PyBuffer_Release(&ri);
    return rc;
}

static void dealloc(RecordLayer *self) {
    EVP_CIPHER_CTX_free(self->enc);  /* cleanses the key schedules */
    EVP_CIPHER_CTX_free(self->dec);
    OPENSSL_cleanse(self->write_iv, sizeof self->write_iv);
    OPENSSL_cleanse(self->read_iv, sizeof self->read_iv);
    OPENSSL_cleanse(self->buf, sizeof self->buf);
    rl_burst_free(self);
    Py_XDECREF(self->cipher);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *get_write_seq(RecordLayer *self, void *c) { return PyLong_FromUnsignedLongLong(self->write_seq); }
static PyObject *get_read_top(RecordLayer *self, void *c) { return PyLong_FromLongLong(self->read_top); }

static PyMethodDef methods[] = {
    {"seal", (PyCFunction)(void (*)(void))rl_seal, METH_FASTCALL | METH_KEYWORDS,
     "seal(payload, content_type=23) -> bytes\n\n"
     "One record under the next sequence number, for a caller that sends it itself (a relayed\n"
     "candidate pair, or a close_notify alert: OpenSSL's own sequence numbers are stale by then)."},
    {"seal_send", (PyCFunction)(void (*)(void))rl_seal_send, METH_FASTCALL | METH_KEYWORDS,
     "seal_send(payload, content_type=23) -> bytes | None\n\n"
     "Seal and sendto in one call, with no bytes object on the way: the per-packet send path.\n"
     "None when sent; the record when the socket's buffer is full (EAGAIN, ENOBUFS), for the caller\n"
     "to queue on its transport. Other errors raise OSError; the sequence number stays spent."},
    {"open_data", (PyCFunction)(void (*)(void))rl_open_data, METH_FASTCALL,
     "open_data(datagram, verification_tag) -> tuple | bytes | None\n\n"
     "open(), and for the receiver's common case (our tag, a right CRC32c, one DATA chunk) the chunk's\n"
     "(flags, tsn, stream_id, stream_seq, ppid, user_data) instead of the packet: aiortc's parse_packet\n"
     "skipped. b'' also for a wrong CRC32c (dropped, counted); any other packet comes back as bytes."},
    {"open_receive", (PyCFunction)(void (*)(void))rl_open_receive, METH_FASTCALL,
     "open_receive(datagram, sctp_transport) -> int | tuple | bytes | None\n\n"
     "open_data() with the transport's own verification tag, and the receiver's most common packet\n"
     "taken here: one DATA chunk, next in TSN order, not a message's last fragment, on a stream the\n"
     "patched receiver already has, nothing to report and no stream reset waiting. Such a chunk is\n"
     "appended to its stream and the transport's fields are updated as aiortc's receiver and the\n"
     "project's SACK policy would update them; the answer is then an int: 0 nothing more to do, 1\n"
     "send the SACK now, 2 arm the SACK timer. Every other packet answers as open_data does. Needs\n"
     "receiver_types() first; before, no packet is taken."},
    {"open", (PyCFunction)rl_open, METH_O,
     "open(datagram) -> bytes | None\n\n"
     "None: not exactly one application-data record of this epoch, so OpenSSL's to handle (alerts,\n"
     "handshake, a new epoch). b'': this layer's record but a replay, too short or forged, dropped and\n"
     "counted (RFC 6347 says drop silently). Else the plaintext. Never raises on any bytes."},
    {"send_data_chunk", (PyCFunction)rl_send_data_chunk, METH_VARARGS,
     "send_data_chunk(src_port, dst_port, vtag, flags, tsn, stream_id, stream_seq, ppid, user_data)\n"
     "-> bytes | None\n\n"
     "The SCTP packet of one DATA chunk, the bytes aiortc's serialize_packet writes (CRC32c included),\n"
     "built, sealed and sent in one call: SCTP's per-packet send without a Python step. Returns as\n"
     "seal_send does."},
    {"send_data_chunks", (PyCFunction)rl_send_data_chunks, METH_VARARGS,
     "send_data_chunks(src_port, dst_port, vtag, chunks) -> (packets, packet_bytes, unsent)\n\n"
     "send_data_chunk for each DATA chunk of a list (objects with aiortc's DataChunk fields: flags,\n"
     "tsn, stream_id, stream_seq, protocol, user_data), in order, sent with one sendmmsg per up to\n"
     "64 packets where the platform has it: the burst one SACK releases, without a Python step per\n"
     "packet. unsent: None, or the records from the first one the socket refused on (EAGAIN,\n"
     "ENOBUFS), in order, for the caller to queue; a record another error refused counts as lost on\n"
     "the wire (SCTP resends it), as a lost datagram would."},
    {"send_packet", (PyCFunction)rl_send_packet, METH_VARARGS,
     "send_packet(src_port, dst_port, vtag, chunk) -> bytes | None\n\n"
     "The same for a chunk already serialized (a SACK, a HEARTBEAT...)."},
    {"set_destination", (PyCFunction)rl_set_destination, METH_VARARGS,
     "set_destination(fd, host, port) -> None\n\n"
     "Where seal_send sends: the UDP socket the ICE pair already uses (not owned, never closed) and\n"
     "the peer's address literal, parsed once here rather than on every packet."},
    {NULL}};

static PyMemberDef members[] = {
    {"cipher", T_OBJECT_EX, offsetof(RecordLayer, cipher), READONLY, "the AEAD suite's name"},
    {"sealed", T_ULONGLONG, offsetof(RecordLayer, sealed), READONLY, "records sealed"},
    {"opened", T_ULONGLONG, offsetof(RecordLayer, opened), READONLY, "records opened and authenticated"},
    {"dropped_auth", T_ULONGLONG, offsetof(RecordLayer, dropped_auth), READONLY, "forged, corrupt or overlong"},
    {"dropped_replay", T_ULONGLONG, offsetof(RecordLayer, dropped_replay), READONLY, "seen or older than the window"},
    {"dropped_short", T_ULONGLONG, offsetof(RecordLayer, dropped_short), READONLY, "shorter than nonce + tag"},
    {"gso", T_BOOL, offsetof(RecordLayer, gso), 0,
     "send_data_chunks sends runs of equal-sized records as one UDP GSO message (Linux); the layer turns\n"
     "it off when the kernel refuses, and tests turn it off to compare"},
    {"dropped_crc", T_ULONGLONG, offsetof(RecordLayer, dropped_crc), READONLY,
     "authentic records whose SCTP packet had a wrong CRC32c (open_data)"},
    {NULL}};

static PyGetSetDef getset[] = {
    {"write_seq", (getter)get_write_seq, NULL, "the next sequence number to seal with", NULL},
    {"read_seq_top", (getter)get_read_top, NULL, "the highest sequence number authenticated (-1: none)", NULL},
    {NULL}};

static PyTypeObject RecordLayerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "engine.p2p.native._records.RecordLayer",
    .tp_basicsize = sizeof(RecordLayer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RecordLayer(cipher, write_key, write_iv, read_key, read_iv, epoch, write_seq, read_seq_top)\n\n"
              "The application-data records of one established DTLS 1.2 session, taken over from OpenSSL\n"
              "mid-epoch: write_seq goes on from the last record OpenSSL sealed (a sequence number must\n"
              "never repeat under one key), and every number up to read_seq_top counts as already\n"
              "received, since OpenSSL opened those.",
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
    {"openssl_version", openssl_version, METH_NOARGS,
     "openssl_version() -> str\n\nThe libcrypto this runs on, for About, --self-test and logs."},
    {"data_packet", rl_data_packet, METH_VARARGS,
     "data_packet(src_port, dst_port, vtag, flags, tsn, stream_id, stream_seq, ppid, user_data) -> bytes\n\n"
     "The unsealed packet send_data_chunk sends (tests hold it against aiortc's serialize_packet)."},
    {"receiver_types", rl_receiver_types, METH_VARARGS,
     "receiver_types(DataChunk, InboundStream, established, object_new) -> None\n\n"
     "The classes open_receive builds and accepts (aiortc's DataChunk, the project's InboundStream\n"
     "subclass), the association state it requires, and object.__new__ to make chunks with."},
    {"take_new_chunks", rl_take_new_chunks, METH_VARARGS,
     "take_new_chunks(transport, budget, now, burst) -> (budget, blocked, flush)\n\n"
     "The project's SCTP sender's loop over new chunks (sctp_sender._transmit), on the transport's own\n"
     "objects: chunks the window, the peer's window and the budget allow move from the outbound to the\n"
     "sent queue with _first_send's fields and, where agreed, the I bit, and are appended to burst for\n"
     "the caller to send. Stops where Python's loop would flush the next messages (flush True)."},
    {"ack_cumulative", rl_ack_cumulative, METH_VARARGS,
     "ack_cumulative(transport, cumulative_tsn) -> (newly_acked, newest)\n\n"
     "The sender's loop over the chunks a SACK's cumulative TSN covers (sctp_sack.receive_sack_chunk):\n"
     "popped, counted delivered, out of the flight; newest is the latest sent of those newly acked."},
    {"packet", rl_packet, METH_VARARGS,
     "packet(src_port, dst_port, vtag, chunk) -> bytes\n\nThe unsealed packet send_packet sends."},
    {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "engine.p2p.native._records", module_doc, -1,
                                    module_methods};

PyMODINIT_FUNC PyInit__records(void) {
    sctp_crc32c_init();
    if (rl_burst_init() < 0 || rl_receive_init() < 0 || rl_send_init() < 0) return NULL;
    if (PyType_Ready(&RecordLayerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&RecordLayerType);
    if (PyModule_AddObject(m, "RecordLayer", (PyObject *)&RecordLayerType) < 0) {
        Py_DECREF(&RecordLayerType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddStringConstant(m, "__version__", "1") < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
