/* proto/wire.h: the protobuf wire format written and read by hand, for the bulk paths of the state service
 * (PushMessage chunks and ParamChunks) that skip protobuf-c to avoid copying megabytes of data: varints,
 * field keys, and a read cursor over a message that arrived in several pieces (struct zt_rpc_part, as
 * zt_rpc_call_read_parts and zt_rpc_stream_recv_parts hand them out). Only bytes: no gRPC, no allocation.
 *
 * Reading functions return 0, or ZT_EFORMAT when the bytes are not valid protobuf (truncated, a varint
 * longer than 10 bytes or above 64 bits, a field number of 0 or above 2^29 - 1, a wire type this module
 * does not know). They never read outside the pieces, whatever the bytes say. After an error the
 * cursor's position is unspecified: stop parsing that message. */
#ifndef ZT_PROTO_WIRE_H
#define ZT_PROTO_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "proto/rpc.h" /* struct zt_rpc_part */

/* The longest varint: 10 bytes carry 64 bits. */
#define ZT_WIRE_VARINT_MAX 10
/* The longest field key of a field number up to ZT_WIRE_FIELD_MAX. */
#define ZT_WIRE_KEY_MAX 5
/* The largest field number protobuf allows (2^29 - 1). */
#define ZT_WIRE_FIELD_MAX 536870911u

/* Wire types (groups, 3 and 4, are not supported and read as malformed). */
enum zt_wire_type {
    ZT_WIRE_VARINT = 0, /* int32, int64, uint64, bool, enum */
    ZT_WIRE_I64 = 1,    /* fixed64, double */
    ZT_WIRE_LEN = 2,    /* bytes, string, embedded messages */
    ZT_WIRE_I32 = 5,    /* fixed32, float */
};

/* A read position in a message split into pieces. Fill it with zt_wire_cursor_init; copying the struct
 * copies the position (a sub-view of a length-delimited field is a copy with a smaller `left`). */
struct zt_wire_cursor {
    const struct zt_rpc_part *parts;
    size_t nparts;
    size_t i;    /* current piece */
    size_t off;  /* byte of the current piece */
    size_t left; /* bytes of the message after the position */
};

/* Writes v as a varint at p (room for ZT_WIRE_VARINT_MAX bytes) and returns the bytes written (1 to 10). */
size_t zt_wire_put_varint(uint8_t *p, uint64_t v);

/* Writes the key of field `field` (1 to ZT_WIRE_FIELD_MAX) with wire type wt at p (room for ZT_WIRE_KEY_MAX
 * bytes) and returns the bytes written. */
size_t zt_wire_put_key(uint8_t *p, uint32_t field, enum zt_wire_type wt);

/* Places c at the start of a message of len bytes held by parts[0..nparts) (pieces may be empty). Returns
 * 0, or ZT_EFORMAT with c positioned on no bytes when the pieces hold fewer than len bytes. */
int zt_wire_cursor_init(struct zt_wire_cursor *c, const struct zt_rpc_part *parts, size_t nparts, size_t len);

/* Reads one byte into *b and advances. Returns 0 or ZT_EFORMAT at the end of the message. */
int zt_wire_read_byte(struct zt_wire_cursor *c, uint8_t *b);

/* Advances n bytes. Returns 0, or ZT_EFORMAT (position unchanged) when fewer than n bytes are left. */
int zt_wire_skip(struct zt_wire_cursor *c, uint64_t n);

/* Reads a varint into *v and advances. Returns 0 or ZT_EFORMAT (truncated, longer than 10 bytes, or a
 * value above 64 bits). */
int zt_wire_read_varint(struct zt_wire_cursor *c, uint64_t *v);

/* Reads a field key into *field and *wt and advances. Returns 0 or ZT_EFORMAT (a bad varint, a key above
 * 32 bits, field number 0, or a wire type other than 0, 1, 2 or 5). */
int zt_wire_read_key(struct zt_wire_cursor *c, uint32_t *field, enum zt_wire_type *wt);

/* Reads the length of a length-delimited field and advances to its first byte. Returns 0 with *len set, or
 * ZT_EFORMAT when the length is not a valid varint or runs past the end of the message. */
int zt_wire_read_len(struct zt_wire_cursor *c, size_t *len);

/* Reads the length of a length-delimited field, sets *sub to a cursor over its len bytes (which may span
 * pieces, like c) and advances c past them. Returns 0, or ZT_EFORMAT when the length is not a valid
 * varint or runs past the end of the message (then *sub is unspecified). sub and c must differ. */
int zt_wire_read_sub(struct zt_wire_cursor *c, struct zt_wire_cursor *sub);

/* Skips the value of a field of wire type wt (whose key was just read). Returns 0 or ZT_EFORMAT. */
int zt_wire_skip_value(struct zt_wire_cursor *c, enum zt_wire_type wt);

/* Returns the bytes at the position that lie in one piece (at most c->left of them) in *p, and advances
 * past them; returns 0 at the end of the message. Walks a field's data piece by piece without a copy. */
size_t zt_wire_next_span(struct zt_wire_cursor *c, const uint8_t **p);

/* Copies all c->left bytes after the position to out, leaving c itself where it was. */
void zt_wire_copy(struct zt_wire_cursor c, uint8_t *out);

#endif
