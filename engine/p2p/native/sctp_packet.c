/* SCTP packet building for the compiled send path (see sctp_packet.h); byte for byte aiortc's. */
#include "sctp_packet.h"

#include <string.h>

static uint32_t table[256];

static uint32_t crc_table(uint32_t c, const unsigned char *p, size_t n) {
    while (n--) c = table[(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_HW_CRC 1
/* SSE 4.2's crc32 instruction is CRC32c itself: 8 bytes an instruction instead of a table step a byte. */
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const unsigned char *p, size_t n) {
    uint64_t c64 = c;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c64 = __builtin_ia32_crc32di(c64, v);
        p += 8;
        n -= 8;
    }
    c = (uint32_t)c64;
    while (n--) c = __builtin_ia32_crc32qi(c, *p++);
    return c;
}
static int hw;
#endif

void sctp_crc32c_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
        table[i] = c;
    }
#ifdef HAVE_HW_CRC
    hw = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t crc_update(uint32_t c, const unsigned char *p, size_t n) {
#ifdef HAVE_HW_CRC
    if (hw) return crc_hw(c, p, n);
#endif
    return crc_table(c, p, n);
}

uint32_t sctp_crc32c(const unsigned char *p, size_t n) { return ~crc_update(0xffffffffu, p, n); }

int sctp_checksum_ok(const unsigned char *pkt, size_t n) {
    static const unsigned char zero[4];
    uint32_t c = crc_update(0xffffffffu, pkt, 8);
    c = crc_update(c, zero, 4);
    c = ~crc_update(c, pkt + SCTP_COMMON_HEADER, n - SCTP_COMMON_HEADER);
    uint32_t stored = (uint32_t)pkt[8] | (uint32_t)pkt[9] << 8 | (uint32_t)pkt[10] << 16 | (uint32_t)pkt[11] << 24;
    return c == stored;
}

static void be16(unsigned char *p, unsigned v) {
    p[0] = (unsigned char)(v >> 8);
    p[1] = (unsigned char)v;
}

static void be32(unsigned char *p, uint32_t v) {
    be16(p, v >> 16);
    be16(p + 2, v & 0xffff);
}

/* The common header in front of `len` bytes of packet, checksum last (computed over a zero field). */
static size_t finish(unsigned char *pkt, size_t len, unsigned src, unsigned dst, uint32_t vtag) {
    be16(pkt, src);
    be16(pkt + 2, dst);
    be32(pkt + 4, vtag);
    memset(pkt + 8, 0, 4);
    uint32_t c = sctp_crc32c(pkt, len);
    pkt[8] = (unsigned char)c;
    pkt[9] = (unsigned char)(c >> 8);
    pkt[10] = (unsigned char)(c >> 16);
    pkt[11] = (unsigned char)(c >> 24);
    return len;
}

size_t sctp_packet(unsigned char *pkt, unsigned src, unsigned dst, uint32_t vtag, const unsigned char *chunk,
                   size_t n) {
    memcpy(pkt + SCTP_COMMON_HEADER, chunk, n);
    return finish(pkt, SCTP_COMMON_HEADER + n, src, dst, vtag);
}

size_t sctp_data_packet(unsigned char *pkt, unsigned src, unsigned dst, uint32_t vtag, unsigned flags, uint32_t tsn,
                        unsigned sid, unsigned ssn, uint32_t ppid, const unsigned char *data, size_t n) {
    size_t length = SCTP_DATA_HEADER + n, padded = (length + 3) & ~(size_t)3;
    unsigned char *c = pkt + SCTP_COMMON_HEADER;
    c[0] = 0; /* DATA */
    c[1] = (unsigned char)flags;
    be16(c + 2, (unsigned)length);
    be32(c + 4, tsn);
    be16(c + 8, sid);
    be16(c + 10, ssn);
    be32(c + 12, ppid);
    memcpy(c + SCTP_DATA_HEADER, data, n);
    memset(c + length, 0, padded - length);
    return finish(pkt, SCTP_COMMON_HEADER + padded, src, dst, vtag);
}
