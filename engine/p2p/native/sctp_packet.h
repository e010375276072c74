/* SCTP packets as aiortc's serialize_packet writes them (RFC 9260 3): the common header with its
 * CRC32c (appendix B, stored little-endian as aiortc stores it) and one chunk. Pure C, no Python. */
#ifndef LAH_SCTP_PACKET_H
#define LAH_SCTP_PACKET_H

#include <stddef.h>
#include <stdint.h>

#define SCTP_COMMON_HEADER 12
#define SCTP_DATA_HEADER 16

/* Chooses the CRC32c implementation (SSE 4.2 where the CPU has it); call once at module load. */
void sctp_crc32c_init(void);
uint32_t sctp_crc32c(const unsigned char *p, size_t n);

/* A packet of one chunk already serialized (`n` bytes at `chunk`) into `pkt` (room for
 * SCTP_COMMON_HEADER + n); returns its length. */
size_t sctp_packet(unsigned char *pkt, unsigned src, unsigned dst, uint32_t vtag, const unsigned char *chunk,
                   size_t n);

/* A packet of one DATA chunk (RFC 9260 3.3.1) carrying `n` bytes, padded to 4 as DataChunk.__bytes__
 * pads it, into `pkt` (room for SCTP_COMMON_HEADER + SCTP_DATA_HEADER + n + 3); returns its length. */
size_t sctp_data_packet(unsigned char *pkt, unsigned src, unsigned dst, uint32_t vtag, unsigned flags, uint32_t tsn,
                        unsigned sid, unsigned ssn, uint32_t ppid, const unsigned char *data, size_t n);

/* Whether a received packet's CRC32c (bytes 8..11, little-endian) is right, computed as over a zeroed
 * field without copying the packet; `n` >= SCTP_COMMON_HEADER. */
int sctp_checksum_ok(const unsigned char *pkt, size_t n);

#endif
