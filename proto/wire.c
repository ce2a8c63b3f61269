/* proto/wire.c: the protobuf wire format by hand (varints, field keys, a cursor over a message in pieces)
 * for the state service's bulk push and pull paths. See wire.h. */
#include "proto/wire.h"

#include <string.h>

#include "common/status.h"

size_t zt_wire_put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

size_t zt_wire_put_key(uint8_t *p, uint32_t field, enum zt_wire_type wt)
{
    return zt_wire_put_varint(p, (uint64_t)field << 3 | (uint64_t)wt);
}

int zt_wire_cursor_init(struct zt_wire_cursor *c, const struct zt_rpc_part *parts, size_t nparts, size_t len)
{
    memset(c, 0, sizeof(*c));
    c->parts = parts;
    c->nparts = nparts;
    size_t have = 0;
    for (size_t i = 0; i < nparts && have < len; i++)
        have += parts[i].len < len - have ? parts[i].len : len - have;
    if (have < len)
        return ZT_EFORMAT;
    c->left = len;
    return 0;
}

/* Moves past exhausted pieces so that the position names a readable byte; returns 0, or ZT_EFORMAT when
 * no piece is left (only when the cursor was not set up by zt_wire_cursor_init). */
static int settle(struct zt_wire_cursor *c)
{
    while (c->i < c->nparts && c->off == c->parts[c->i].len) {
        c->i++;
        c->off = 0;
    }
    return c->i < c->nparts ? 0 : ZT_EFORMAT;
}

int zt_wire_read_byte(struct zt_wire_cursor *c, uint8_t *b)
{
    if (c->left == 0 || settle(c) != 0)
        return ZT_EFORMAT;
    *b = ((const uint8_t *)c->parts[c->i].data)[c->off++];
    c->left--;
    return 0;
}

int zt_wire_skip(struct zt_wire_cursor *c, uint64_t n)
{
    if (n > c->left)
        return ZT_EFORMAT;
    c->left -= (size_t)n;
    while (n > 0) {
        if (settle(c) != 0)
            return ZT_EFORMAT;
        size_t here = c->parts[c->i].len - c->off;
        size_t step = n < here ? (size_t)n : here;
        c->off += step;
        n -= step;
    }
    return 0;
}

int zt_wire_read_varint(struct zt_wire_cursor *c, uint64_t *v)
{
    *v = 0;
    for (int k = 0; k < ZT_WIRE_VARINT_MAX; k++) {
        uint8_t b;
        if (zt_wire_read_byte(c, &b) != 0)
            return ZT_EFORMAT;
        if (k == ZT_WIRE_VARINT_MAX - 1 && b > 1)
            return ZT_EFORMAT; /* the 10th byte holds bit 63 only: more would overflow 64 bits */
        *v |= (uint64_t)(b & 0x7f) << (7 * k);
        if (!(b & 0x80))
            return 0;
    }
    return ZT_EFORMAT;
}

int zt_wire_read_key(struct zt_wire_cursor *c, uint32_t *field, enum zt_wire_type *wt)
{
    uint64_t key;
    if (zt_wire_read_varint(c, &key) != 0 || key > UINT32_MAX)
        return ZT_EFORMAT;
    unsigned t = (unsigned)(key & 7);
    if (key >> 3 == 0 || (t != ZT_WIRE_VARINT && t != ZT_WIRE_I64 && t != ZT_WIRE_LEN && t != ZT_WIRE_I32))
        return ZT_EFORMAT;
    *field = (uint32_t)(key >> 3);
    *wt = (enum zt_wire_type)t;
    return 0;
}

int zt_wire_read_len(struct zt_wire_cursor *c, size_t *len)
{
    uint64_t n;
    if (zt_wire_read_varint(c, &n) != 0 || n > c->left)
        return ZT_EFORMAT;
    *len = (size_t)n;
    return 0;
}

int zt_wire_read_sub(struct zt_wire_cursor *c, struct zt_wire_cursor *sub)
{
    size_t n;
    if (zt_wire_read_len(c, &n) != 0)
        return ZT_EFORMAT;
    *sub = *c; /* the same pieces and position, limited to the field's bytes */
    sub->left = n;
    return zt_wire_skip(c, n);
}

int zt_wire_skip_value(struct zt_wire_cursor *c, enum zt_wire_type wt)
{
    uint64_t v;
    size_t n;
    switch (wt) {
    case ZT_WIRE_VARINT:
        return zt_wire_read_varint(c, &v);
    case ZT_WIRE_I64:
        return zt_wire_skip(c, 8);
    case ZT_WIRE_LEN:
        return zt_wire_read_len(c, &n) == 0 ? zt_wire_skip(c, n) : ZT_EFORMAT;
    case ZT_WIRE_I32:
        return zt_wire_skip(c, 4);
    }
    return ZT_EFORMAT;
}

size_t zt_wire_next_span(struct zt_wire_cursor *c, const uint8_t **p)
{
    if (c->left == 0 || settle(c) != 0)
        return 0;
    size_t here = c->parts[c->i].len - c->off;
    if (here > c->left)
        here = c->left;
    *p = (const uint8_t *)c->parts[c->i].data + c->off;
    c->off += here;
    c->left -= here;
    return here;
}

void zt_wire_copy(struct zt_wire_cursor c, uint8_t *out)
{
    const uint8_t *p;
    size_t n;
    while ((n = zt_wire_next_span(&c, &p)) > 0) {
        memcpy(out, p, n);
        out += n;
    }
}
