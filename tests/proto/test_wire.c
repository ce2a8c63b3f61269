/* Tests of proto/wire: varints (round trips, the 10-byte limit, overflow, truncation), field keys, a
 * cursor over messages split into pieces at every byte boundary, sub-cursors over nested fields, unknown
 * fields, fields in any order, and malformed input, which must be refused without reading outside the
 * pieces (each piece is its own heap block, so that a build with -DZT_SANITIZE=address catches any stray
 * read). The bytes are checked against protobuf-c's own packing of a ParamChunk. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/status.h"
#include "proto/wire.h"
#include "ztrain/v1/state.pb-c.h"

/* ---- pieces ---- */

#define MAX_PIECES 8

/* A message split into pieces, each copied into its own allocation of exactly its size. */
struct pieces {
    struct zt_rpc_part part[MAX_PIECES];
    size_t n;
};

/* Splits msg[0..len) at the ncuts ascending offsets in cuts (equal offsets give empty pieces). */
static void split(struct pieces *p, const uint8_t *msg, size_t len, const size_t *cuts, size_t ncuts)
{
    assert_true(ncuts + 1 <= MAX_PIECES);
    size_t at = 0;
    p->n = 0;
    for (size_t k = 0; k <= ncuts; k++) {
        size_t end = k < ncuts ? cuts[k] : len;
        assert_true(end >= at && end <= len);
        uint8_t *b = malloc(end - at > 0 ? end - at : 1);
        assert_non_null(b);
        memcpy(b, msg + at, end - at);
        p->part[p->n].data = b;
        p->part[p->n].len = end - at;
        p->n++;
        at = end;
    }
}

static void pieces_free(struct pieces *p)
{
    for (size_t k = 0; k < p->n; k++)
        free((void *)p->part[k].data);
    p->n = 0;
}

/* ---- a test message: a = 1 (varint), data = 2 (bytes), f64 = 3 (fixed64), f32 = 4 (fixed32) ---- */

struct msg {
    uint64_t a;
    uint64_t f64;
    uint32_t f32;
    uint8_t data[512];
    size_t data_len;
    int seen; /* bit k set when field k+1 was present */
};

static uint64_t read_le(struct zt_wire_cursor *c, int bytes)
{
    uint64_t v = 0;
    for (int k = 0; k < bytes; k++) {
        uint8_t b;
        assert_int_equal(zt_wire_read_byte(c, &b), 0);
        v |= (uint64_t)b << (8 * k);
    }
    return v;
}

/* Parses a test message the way server/service.c and worker/state/client.c parse theirs. Returns 0 or
 * ZT_EFORMAT. */
static int parse_msg(const struct pieces *p, size_t len, struct msg *m)
{
    memset(m, 0, sizeof(*m));
    struct zt_wire_cursor c;
    if (zt_wire_cursor_init(&c, p->part, p->n, len) != 0)
        return ZT_EFORMAT;
    while (c.left > 0) {
        uint32_t field;
        enum zt_wire_type wt;
        if (zt_wire_read_key(&c, &field, &wt) != 0)
            return ZT_EFORMAT;
        if (field == 1 && wt == ZT_WIRE_VARINT) {
            if (zt_wire_read_varint(&c, &m->a) != 0)
                return ZT_EFORMAT;
        } else if (field == 2 && wt == ZT_WIRE_LEN) {
            struct zt_wire_cursor d;
            if (zt_wire_read_sub(&c, &d) != 0 || d.left > sizeof(m->data))
                return ZT_EFORMAT;
            m->data_len = d.left;
            zt_wire_copy(d, m->data);
        } else if (field == 3 && wt == ZT_WIRE_I64) {
            if (c.left < 8)
                return ZT_EFORMAT;
            m->f64 = read_le(&c, 8);
        } else if (field == 4 && wt == ZT_WIRE_I32) {
            if (c.left < 4)
                return ZT_EFORMAT;
            m->f32 = (uint32_t)read_le(&c, 4);
        } else if (field <= 4) {
            return ZT_EFORMAT;
        } else if (zt_wire_skip_value(&c, wt) != 0) {
            return ZT_EFORMAT;
        }
        if (field <= 4)
            m->seen |= 1 << (field - 1);
    }
    return 0;
}

static size_t put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int k = 0; k < bytes; k++)
        p[k] = (uint8_t)(v >> (8 * k));
    return (size_t)bytes;
}

/* Field writers for building messages in tests. */
static size_t put_a(uint8_t *p, uint64_t a)
{
    size_t n = zt_wire_put_key(p, 1, ZT_WIRE_VARINT);
    return n + zt_wire_put_varint(p + n, a);
}

static size_t put_data(uint8_t *p, const uint8_t *data, size_t len)
{
    size_t n = zt_wire_put_key(p, 2, ZT_WIRE_LEN);
    n += zt_wire_put_varint(p + n, len);
    memcpy(p + n, data, len);
    return n + len;
}

static size_t put_f64(uint8_t *p, uint64_t v)
{
    size_t n = zt_wire_put_key(p, 3, ZT_WIRE_I64);
    return n + put_le(p + n, v, 8);
}

static size_t put_f32(uint8_t *p, uint32_t v)
{
    size_t n = zt_wire_put_key(p, 4, ZT_WIRE_I32);
    return n + put_le(p + n, v, 4);
}

/* One unknown field of every wire type, with field numbers of 1 to 5 key bytes. */
static size_t put_unknowns(uint8_t *p)
{
    size_t n = 0;
    n += zt_wire_put_key(p + n, 5, ZT_WIRE_VARINT);
    n += zt_wire_put_varint(p + n, UINT64_MAX);
    n += zt_wire_put_key(p + n, 16, ZT_WIRE_I64);
    n += put_le(p + n, 0x0102030405060708ull, 8);
    n += zt_wire_put_key(p + n, 2048, ZT_WIRE_LEN);
    n += zt_wire_put_varint(p + n, 3);
    memcpy(p + n, "xyz", 3);
    n += 3;
    n += zt_wire_put_key(p + n, ZT_WIRE_FIELD_MAX, ZT_WIRE_I32);
    n += put_le(p + n, 0xdeadbeef, 4);
    n += zt_wire_put_key(p + n, 7, ZT_WIRE_LEN);
    n += zt_wire_put_varint(p + n, 0);
    return n;
}

static void fill_data(uint8_t *d, size_t len)
{
    for (size_t k = 0; k < len; k++)
        d[k] = (uint8_t)(k * 7 + 3);
}

static void expect_msg(const struct msg *m, uint64_t a, const uint8_t *data, size_t len, uint64_t f64, uint32_t f32)
{
    assert_int_equal(m->seen, 0xf);
    assert_true(m->a == a);
    assert_int_equal(m->data_len, len);
    assert_memory_equal(m->data, data, len);
    assert_true(m->f64 == f64);
    assert_int_equal(m->f32, f32);
}

/* ---- varints ---- */

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static int decode_one(const uint8_t *b, size_t len, uint64_t *v, size_t *used)
{
    struct pieces p;
    split(&p, b, len, NULL, 0);
    struct zt_wire_cursor c;
    assert_int_equal(zt_wire_cursor_init(&c, p.part, p.n, len), 0);
    int rc = zt_wire_read_varint(&c, v);
    *used = len - c.left;
    pieces_free(&p);
    return rc;
}

static void test_varint_round_trip(void **state)
{
    (void)state;
    uint64_t values[200];
    size_t nv = 0;
    for (int bit = 0; bit < 64; bit++) {
        uint64_t x = (uint64_t)1 << bit;
        values[nv++] = x;
        values[nv++] = x - 1;
        values[nv++] = x + 1;
    }
    values[nv++] = UINT64_MAX;
    values[nv++] = UINT64_MAX - 1;
    values[nv++] = (uint64_t)(int64_t)-1; /* a negative int32 is sent sign-extended, as 10 bytes */
    values[nv++] = (uint64_t)(int64_t)INT32_MIN;
    for (size_t k = 0; k < nv; k++) {
        uint8_t b[ZT_WIRE_VARINT_MAX + 1];
        memset(b, 0xaa, sizeof(b));
        size_t n = zt_wire_put_varint(b, values[k]);
        assert_int_equal(n, varint_len(values[k]));
        assert_true(n >= 1 && n <= ZT_WIRE_VARINT_MAX);
        assert_int_equal(b[n], 0xaa); /* nothing written past the returned length */
        assert_int_equal(b[n - 1] & 0x80, 0);
        uint64_t v;
        size_t used;
        assert_int_equal(decode_one(b, n, &v, &used), 0);
        assert_true(v == values[k]);
        assert_int_equal(used, n);
    }
    /* Known encodings. */
    uint8_t b[ZT_WIRE_VARINT_MAX];
    assert_int_equal(zt_wire_put_varint(b, 0), 1);
    assert_int_equal(b[0], 0);
    assert_int_equal(zt_wire_put_varint(b, 300), 2);
    assert_int_equal(b[0], 0xac);
    assert_int_equal(b[1], 0x02);
    assert_int_equal(zt_wire_put_varint(b, UINT64_MAX), ZT_WIRE_VARINT_MAX);
    assert_int_equal(b[9], 0x01);
}

static void test_varint_limits(void **state)
{
    (void)state;
    uint64_t v;
    size_t used;
    /* 10 bytes: the last may hold bit 63 only. */
    uint8_t max[10] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    assert_int_equal(decode_one(max, 10, &v, &used), 0);
    assert_true(v == UINT64_MAX);
    uint8_t top[10] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01};
    assert_int_equal(decode_one(top, 10, &v, &used), 0);
    assert_true(v == (uint64_t)1 << 63);
    /* Overflow: a 10th byte of 2 or more would need bit 64. */
    for (int last = 2; last < 0x80; last++) {
        uint8_t over[10] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, (uint8_t)last};
        assert_int_equal(decode_one(over, 10, &v, &used), ZT_EFORMAT);
    }
    /* 11 bytes, even of a small value, are too long. */
    uint8_t eleven[11] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00};
    assert_int_equal(decode_one(eleven, 11, &v, &used), ZT_EFORMAT);
    uint8_t ten_cont[12];
    memset(ten_cont, 0xff, sizeof(ten_cont));
    assert_int_equal(decode_one(ten_cont, sizeof(ten_cont), &v, &used), ZT_EFORMAT);
    /* A longer-than-needed encoding of a small value is valid protobuf. */
    uint8_t padded[3] = {0x81, 0x80, 0x00};
    assert_int_equal(decode_one(padded, 3, &v, &used), 0);
    assert_true(v == 1);
    assert_int_equal(used, 3);
    /* Truncated: every proper prefix of every multi-byte varint, and nothing at all. */
    assert_int_equal(decode_one(max, 0, &v, &used), ZT_EFORMAT);
    for (size_t n = 1; n < 10; n++)
        assert_int_equal(decode_one(max, n, &v, &used), ZT_EFORMAT);
    uint8_t two[2] = {0xac, 0x02};
    assert_int_equal(decode_one(two, 1, &v, &used), ZT_EFORMAT);
}

/* ---- field keys ---- */

static int read_key_of(uint64_t key, uint32_t *field, enum zt_wire_type *wt)
{
    uint8_t b[ZT_WIRE_VARINT_MAX];
    size_t n = zt_wire_put_varint(b, key);
    struct pieces p;
    split(&p, b, n, NULL, 0);
    struct zt_wire_cursor c;
    assert_int_equal(zt_wire_cursor_init(&c, p.part, p.n, n), 0);
    int rc = zt_wire_read_key(&c, field, wt);
    if (rc == 0)
        assert_int_equal(c.left, 0);
    pieces_free(&p);
    return rc;
}

static void test_keys(void **state)
{
    (void)state;
    const uint32_t fields[] = {1, 2, 5, 15, 16, 2047, 2048, 262143, 262144, ZT_WIRE_FIELD_MAX};
    const enum zt_wire_type types[] = {ZT_WIRE_VARINT, ZT_WIRE_I64, ZT_WIRE_LEN, ZT_WIRE_I32};
    for (size_t f = 0; f < sizeof(fields) / sizeof(fields[0]); f++) {
        for (size_t t = 0; t < 4; t++) {
            uint8_t b[ZT_WIRE_KEY_MAX + 1];
            memset(b, 0xaa, sizeof(b));
            size_t n = zt_wire_put_key(b, fields[f], types[t]);
            assert_true(n >= 1 && n <= ZT_WIRE_KEY_MAX);
            assert_int_equal(b[n], 0xaa);
            uint32_t field;
            enum zt_wire_type wt;
            assert_int_equal(read_key_of((uint64_t)fields[f] << 3 | types[t], &field, &wt), 0);
            assert_int_equal(field, fields[f]);
            assert_int_equal(wt, types[t]);
        }
    }
    uint8_t b[ZT_WIRE_KEY_MAX];
    assert_int_equal(zt_wire_put_key(b, 2, ZT_WIRE_LEN), 1);
    assert_int_equal(b[0], 0x12);
    assert_int_equal(zt_wire_put_key(b, 16, ZT_WIRE_VARINT), 2);
    assert_int_equal(b[0], 0x80);
    assert_int_equal(b[1], 0x01);

    uint32_t field;
    enum zt_wire_type wt;
    /* Field number 0, groups (3, 4) and the unused wire types 6 and 7. */
    for (unsigned t = 0; t < 8; t++)
        assert_int_equal(read_key_of(t, &field, &wt), ZT_EFORMAT);
    for (unsigned t = 3; t < 8; t++) {
        if (t == 5)
            continue;
        assert_int_equal(read_key_of(1u << 3 | t, &field, &wt), ZT_EFORMAT);
    }
    /* Keys above 32 bits: field numbers above 2^29 - 1, which must not be truncated to a known field. */
    assert_int_equal(read_key_of((uint64_t)1 << 32 | 2 << 3 | 2, &field, &wt), ZT_EFORMAT);
    assert_int_equal(read_key_of((uint64_t)(ZT_WIRE_FIELD_MAX + 1ull) << 3, &field, &wt), ZT_EFORMAT);
    assert_int_equal(read_key_of(UINT64_MAX, &field, &wt), ZT_EFORMAT);
}

/* ---- messages in pieces ---- */

/* A message: a, unknowns, data (len bytes), f64, f32. */
static size_t build_msg(uint8_t *out, const uint8_t *data, size_t len)
{
    size_t n = 0;
    n += put_a(out + n, 0x123456789ull);
    n += put_unknowns(out + n);
    n += put_data(out + n, data, len);
    n += put_f64(out + n, 0x1122334455667788ull);
    n += put_f32(out + n, 0x99aabbcc);
    return n;
}

static void test_split_every_boundary(void **state)
{
    (void)state;
    uint8_t data[300];
    fill_data(data, sizeof(data));
    uint8_t msg[512];
    size_t len = build_msg(msg, data, sizeof(data));
    struct msg m;
    /* One cut anywhere, including at both ends (an empty first or last piece). */
    for (size_t cut = 0; cut <= len; cut++) {
        struct pieces p;
        split(&p, msg, len, &cut, 1);
        assert_int_equal(parse_msg(&p, len, &m), 0);
        expect_msg(&m, 0x123456789ull, data, sizeof(data), 0x1122334455667788ull, 0x99aabbcc);
        pieces_free(&p);
    }
    /* Two cuts anywhere in a shorter message (equal cuts give an empty piece in the middle). */
    uint8_t small[16];
    fill_data(small, sizeof(small));
    len = build_msg(msg, small, sizeof(small));
    for (size_t c1 = 0; c1 <= len; c1++) {
        for (size_t c2 = c1; c2 <= len; c2++) {
            size_t cuts[2] = {c1, c2};
            struct pieces p;
            split(&p, msg, len, cuts, 2);
            assert_int_equal(parse_msg(&p, len, &m), 0);
            expect_msg(&m, 0x123456789ull, small, sizeof(small), 0x1122334455667788ull, 0x99aabbcc);
            pieces_free(&p);
        }
    }
    /* Every byte its own piece. */
    size_t cuts[MAX_PIECES];
    uint8_t tiny[3] = {1, 2, 3};
    size_t n = put_data(msg, tiny, 3) + put_a(msg + 5, 1);
    assert_int_equal(n, MAX_PIECES - 1);
    for (size_t k = 0; k + 1 < n; k++)
        cuts[k] = k + 1;
    struct pieces p;
    split(&p, msg, n, cuts, n - 1);
    assert_int_equal(parse_msg(&p, n, &m), 0);
    assert_int_equal(m.data_len, 3);
    assert_memory_equal(m.data, tiny, 3);
    assert_true(m.a == 1);
    pieces_free(&p);
}

/* A field's data walked span by span returns exactly its bytes, one span per piece it touches. */
static void test_next_span(void **state)
{
    (void)state;
    uint8_t data[64];
    fill_data(data, sizeof(data));
    uint8_t msg[128];
    size_t len = put_data(msg, data, sizeof(data)) + put_a(msg + 66, 7);
    size_t cuts[3] = {10, 10, 40}; /* inside the data, with an empty piece */
    struct pieces p;
    split(&p, msg, len, cuts, 3);
    struct zt_wire_cursor c;
    assert_int_equal(zt_wire_cursor_init(&c, p.part, p.n, len), 0);
    uint32_t field;
    enum zt_wire_type wt;
    size_t n;
    assert_int_equal(zt_wire_read_key(&c, &field, &wt), 0);
    assert_int_equal(zt_wire_read_len(&c, &n), 0);
    assert_int_equal(n, sizeof(data));
    struct zt_wire_cursor d = c;
    d.left = n;
    uint8_t got[64];
    size_t at = 0, spans = 0, k;
    const uint8_t *s;
    while ((k = zt_wire_next_span(&d, &s)) > 0) {
        assert_true(at + k <= sizeof(got));
        memcpy(got + at, s, k);
        at += k;
        spans++;
    }
    assert_int_equal(at, sizeof(data));
    assert_memory_equal(got, data, sizeof(data));
    assert_int_equal(spans, 3); /* bytes 2..10, 10..40, 40..66 */
    assert_int_equal(zt_wire_next_span(&d, &s), 0);
    /* The cursor after the data reads the next field. */
    assert_int_equal(zt_wire_skip(&c, n), 0);
    uint64_t v;
    assert_int_equal(zt_wire_read_key(&c, &field, &wt), 0);
    assert_int_equal(zt_wire_read_varint(&c, &v), 0);
    assert_true(field == 1 && v == 7);
    assert_int_equal(c.left, 0);
    pieces_free(&p);
}

static void test_any_order_and_unknown_fields(void **state)
{
    (void)state;
    uint8_t data[5] = {9, 8, 7, 6, 5};
    /* The four fields in all 24 orders, with the unknown fields before, between and after. */
    int order[4] = {0, 1, 2, 3};
    for (int perm = 0; perm < 24; perm++) {
        int rest[4] = {0, 1, 2, 3}, left = 4, x = perm;
        for (int k = 0; k < 4; k++) {
            int f = x % left;
            x /= left;
            order[k] = rest[f];
            for (int j = f; j + 1 < left; j++)
                rest[j] = rest[j + 1];
            left--;
        }
        uint8_t msg[512];
        size_t n = put_unknowns(msg);
        for (int k = 0; k < 4; k++) {
            if (order[k] == 0)
                n += put_a(msg + n, 42);
            else if (order[k] == 1)
                n += put_data(msg + n, data, sizeof(data));
            else if (order[k] == 2)
                n += put_f64(msg + n, 64);
            else
                n += put_f32(msg + n, 32);
            n += put_unknowns(msg + n);
        }
        size_t cut = n / 2;
        struct pieces p;
        split(&p, msg, n, &cut, 1);
        struct msg m;
        assert_int_equal(parse_msg(&p, n, &m), 0);
        expect_msg(&m, 42, data, sizeof(data), 64, 32);
        pieces_free(&p);
    }
    /* Only unknown fields, and an empty message. */
    uint8_t msg[128];
    size_t n = put_unknowns(msg);
    struct pieces p;
    split(&p, msg, n, NULL, 0);
    struct msg m;
    assert_int_equal(parse_msg(&p, n, &m), 0);
    assert_int_equal(m.seen, 0);
    pieces_free(&p);
    split(&p, msg, 0, NULL, 0);
    assert_int_equal(parse_msg(&p, 0, &m), 0);
    assert_int_equal(m.seen, 0);
    pieces_free(&p);
}

/* ---- malformed input ---- */

static int parse_bytes(const uint8_t *b, size_t len, size_t cut)
{
    struct pieces p;
    if (cut > len)
        cut = len;
    split(&p, b, len, &cut, 1);
    struct msg m;
    int rc = parse_msg(&p, len, &m);
    pieces_free(&p);
    return rc;
}

static void test_malformed(void **state)
{
    (void)state;
    uint8_t data[40];
    fill_data(data, sizeof(data));
    uint8_t msg[256];
    size_t len = build_msg(msg, data, sizeof(data));
    /* Every truncation inside the data field (its key, its length, or its bytes) is refused, wherever
     * the message is cut into pieces. */
    uint8_t scratch[256];
    size_t data_at = put_a(scratch, 0x123456789ull);
    data_at += put_unknowns(scratch + data_at);
    for (size_t end = data_at + 1; end < data_at + 2 + sizeof(data); end++)
        for (size_t cut = 0; cut <= end; cut += 7)
            assert_int_equal(parse_bytes(msg, end, cut), ZT_EFORMAT);
    /* Any prefix and any single corrupted byte: an answer either way, never a read outside the pieces
     * (checked by the sanitizer builds). */
    for (size_t end = 0; end <= len; end++)
        (void)parse_bytes(msg, end, end / 2);
    const uint8_t bad[] = {0x00, 0x01, 0x07, 0x0f, 0x7f, 0x80, 0xff};
    for (size_t at = 0; at < len; at++) {
        for (size_t k = 0; k < sizeof(bad); k++) {
            uint8_t copy[256];
            memcpy(copy, msg, len);
            copy[at] = bad[k];
            (void)parse_bytes(copy, len, at);
        }
    }
    /* A length beyond the message; a length of 2^64 - 1. */
    uint8_t over[4] = {0x12, 0x03, 'a', 'b'};
    assert_int_equal(parse_bytes(over, 4, 2), ZT_EFORMAT);
    uint8_t huge[12] = {0x3a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00};
    assert_int_equal(parse_bytes(huge, 12, 3), ZT_EFORMAT);
    /* Fixed-width unknown fields cut short. */
    uint8_t i64[5] = {0x29, 1, 2, 3, 4};
    assert_int_equal(parse_bytes(i64, 5, 1), ZT_EFORMAT);
    uint8_t i32[3] = {0x2d, 1, 2};
    assert_int_equal(parse_bytes(i32, 3, 2), ZT_EFORMAT);
    /* A known field with the wrong wire type; a group; a key left unfinished. */
    uint8_t wrong[2] = {0x08 | 2, 0x00};
    assert_int_equal(parse_bytes(wrong, 2, 1), ZT_EFORMAT);
    uint8_t group[2] = {0x2b, 0x2c};
    assert_int_equal(parse_bytes(group, 2, 1), ZT_EFORMAT);
    uint8_t key[1] = {0x80};
    assert_int_equal(parse_bytes(key, 1, 1), ZT_EFORMAT);
}

/* A cursor refuses a message longer than its pieces, and the cursor operations stop at its end. */
static void test_cursor_bounds(void **state)
{
    (void)state;
    uint8_t bytes[6] = {1, 2, 3, 4, 5, 6};
    size_t cuts[2] = {2, 2};
    struct pieces p;
    split(&p, bytes, 6, cuts, 2);
    struct zt_wire_cursor c;
    assert_int_equal(zt_wire_cursor_init(&c, p.part, p.n, 7), ZT_EFORMAT);
    assert_int_equal(c.left, 0);
    uint8_t b;
    assert_int_equal(zt_wire_read_byte(&c, &b), ZT_EFORMAT);
    assert_int_equal(zt_wire_cursor_init(&c, NULL, 0, 1), ZT_EFORMAT);
    assert_int_equal(zt_wire_cursor_init(&c, NULL, 0, 0), 0);
    const uint8_t *s;
    assert_int_equal(zt_wire_next_span(&c, &s), 0);

    /* A message shorter than its pieces ends where it says. */
    assert_int_equal(zt_wire_cursor_init(&c, p.part, p.n, 4), 0);
    assert_int_equal(zt_wire_skip(&c, 5), ZT_EFORMAT);
    assert_int_equal(c.left, 4); /* a refused skip leaves the position */
    assert_int_equal(zt_wire_skip(&c, 3), 0);
    assert_int_equal(zt_wire_read_byte(&c, &b), 0);
    assert_int_equal(b, 4);
    assert_int_equal(zt_wire_read_byte(&c, &b), ZT_EFORMAT);
    assert_int_equal(zt_wire_skip(&c, 1), ZT_EFORMAT);
    assert_int_equal(zt_wire_skip(&c, 0), 0);

    /* Copy leaves the cursor where it was. */
    assert_int_equal(zt_wire_cursor_init(&c, p.part, p.n, 6), 0);
    assert_int_equal(zt_wire_skip(&c, 1), 0);
    uint8_t out[5];
    zt_wire_copy(c, out);
    assert_memory_equal(out, bytes + 1, 5);
    assert_int_equal(c.left, 5);
    assert_int_equal(zt_wire_read_byte(&c, &b), 0);
    assert_int_equal(b, 2);
    pieces_free(&p);
}

/* Parses the message of build_nested: field 6 holding a test message (through zt_wire_read_sub), then a
 * = 1 of the outer message. Returns 0 or ZT_EFORMAT. */
static int parse_nested(const struct pieces *p, size_t len, struct msg *inner, uint64_t *outer_a)
{
    memset(inner, 0, sizeof(*inner));
    struct zt_wire_cursor c, sub;
    if (zt_wire_cursor_init(&c, p->part, p->n, len) != 0)
        return ZT_EFORMAT;
    uint32_t field;
    enum zt_wire_type wt;
    if (zt_wire_read_key(&c, &field, &wt) != 0 || field != 6 || wt != ZT_WIRE_LEN)
        return ZT_EFORMAT;
    size_t before = c.left;
    if (zt_wire_read_sub(&c, &sub) != 0)
        return ZT_EFORMAT;
    /* c is past the sub-message: its bytes and length prefix are gone from c.left */
    assert_int_equal(before - c.left - varint_len(sub.left), sub.left);
    while (sub.left > 0) {
        if (zt_wire_read_key(&sub, &field, &wt) != 0)
            return ZT_EFORMAT;
        if (field == 1 && wt == ZT_WIRE_VARINT) {
            if (zt_wire_read_varint(&sub, &inner->a) != 0)
                return ZT_EFORMAT;
        } else if (field == 2 && wt == ZT_WIRE_LEN) {
            struct zt_wire_cursor d;
            if (zt_wire_read_sub(&sub, &d) != 0 || d.left > sizeof(inner->data))
                return ZT_EFORMAT;
            inner->data_len = d.left;
            zt_wire_copy(d, inner->data);
        } else {
            return ZT_EFORMAT;
        }
    }
    if (zt_wire_read_key(&c, &field, &wt) != 0 || field != 1 || wt != ZT_WIRE_VARINT)
        return ZT_EFORMAT;
    if (zt_wire_read_varint(&c, outer_a) != 0 || c.left != 0)
        return ZT_EFORMAT;
    return 0;
}

/* Field 6 = {a = 5, data = data[0..dlen)}, then a = 9. Returns the message's length. */
static size_t build_nested(uint8_t *out, const uint8_t *data, size_t dlen)
{
    uint8_t inner[256];
    size_t k = put_a(inner, 5);
    k += put_data(inner + k, data, dlen);
    size_t n = zt_wire_put_key(out, 6, ZT_WIRE_LEN);
    n += zt_wire_put_varint(out + n, k);
    memcpy(out + n, inner, k);
    n += k;
    return n + put_a(out + n, 9);
}

/* zt_wire_read_sub gives a cursor over exactly a field's bytes, wherever the pieces are cut, moves the
 * outer cursor past them, and refuses a length that runs past the end of the message or of the
 * sub-message it is read from. */
static void test_read_sub(void **state)
{
    (void)state;
    uint8_t data[20];
    fill_data(data, sizeof(data));
    uint8_t msg[128];
    size_t len = build_nested(msg, data, sizeof(data));
    struct msg inner;
    uint64_t a;
    for (size_t c1 = 0; c1 <= len; c1++) {
        for (size_t c2 = c1; c2 <= len; c2++) {
            size_t cuts[2] = {c1, c2};
            struct pieces p;
            split(&p, msg, len, cuts, 2);
            assert_int_equal(parse_nested(&p, len, &inner, &a), 0);
            assert_true(inner.a == 5 && a == 9);
            assert_int_equal(inner.data_len, sizeof(data));
            assert_memory_equal(inner.data, data, sizeof(data));
            pieces_free(&p);
        }
    }

    /* A length past the end of the message. */
    uint8_t bad[8];
    size_t n = zt_wire_put_varint(bad, 4);
    bad[n++] = 1;
    bad[n++] = 2;
    struct pieces p;
    split(&p, bad, n, NULL, 0);
    struct zt_wire_cursor c, sub;
    assert_int_equal(zt_wire_cursor_init(&c, p.part, p.n, n), 0);
    assert_int_equal(zt_wire_read_sub(&c, &sub), ZT_EFORMAT);
    pieces_free(&p);

    /* An inner length that fits the message but not the sub-message it lies in. */
    len = build_nested(msg, data, sizeof(data));
    msg[1] -= 1; /* the sub-message loses its last data byte (to the outer message) */
    split(&p, msg, len, NULL, 0);
    assert_int_equal(parse_nested(&p, len, &inner, &a), ZT_EFORMAT);
    pieces_free(&p);
}

/* ---- against protobuf-c ---- */

static void test_matches_protobuf_c(void **state)
{
    (void)state;
    uint8_t data[200];
    fill_data(data, sizeof(data));
    Ztrain__V1__ParamChunk pc = ZTRAIN__V1__PARAM_CHUNK__INIT;
    pc.block = -3; /* int32: sent sign-extended, as 10 bytes */
    pc.shard = 70000;
    pc.offset = (uint64_t)1 << 40;
    pc.dtype = ZTRAIN__V1__DTYPE__DTYPE_BF16;
    pc.data.data = data;
    pc.data.len = sizeof(data);
    size_t len = ztrain__v1__param_chunk__get_packed_size(&pc);
    uint8_t *packed = malloc(len);
    assert_non_null(packed);
    ztrain__v1__param_chunk__pack(&pc, packed);

    /* Written by hand, byte for byte as protobuf-c packs it. */
    uint8_t mine[512];
    size_t n = 0;
    n += zt_wire_put_key(mine + n, 1, ZT_WIRE_VARINT);
    n += zt_wire_put_varint(mine + n, (uint64_t)(int64_t)pc.block);
    n += zt_wire_put_key(mine + n, 2, ZT_WIRE_VARINT);
    n += zt_wire_put_varint(mine + n, (uint64_t)pc.shard);
    n += zt_wire_put_key(mine + n, 3, ZT_WIRE_VARINT);
    n += zt_wire_put_varint(mine + n, pc.offset);
    n += zt_wire_put_key(mine + n, 4, ZT_WIRE_VARINT);
    n += zt_wire_put_varint(mine + n, (uint64_t)pc.dtype);
    n += zt_wire_put_key(mine + n, 5, ZT_WIRE_LEN);
    n += zt_wire_put_varint(mine + n, sizeof(data));
    memcpy(mine + n, data, sizeof(data));
    n += sizeof(data);
    assert_int_equal(n, len);
    assert_memory_equal(mine, packed, len);

    /* Read back by hand from pieces. */
    size_t cuts[2] = {7, 100};
    struct pieces p;
    split(&p, packed, len, cuts, 2);
    struct zt_wire_cursor c;
    assert_int_equal(zt_wire_cursor_init(&c, p.part, p.n, len), 0);
    uint64_t got[5] = {0};
    uint8_t out[200];
    while (c.left > 0) {
        uint32_t field;
        enum zt_wire_type wt;
        assert_int_equal(zt_wire_read_key(&c, &field, &wt), 0);
        assert_true(field >= 1 && field <= 5);
        if (field == 5) {
            assert_int_equal(wt, ZT_WIRE_LEN);
            size_t dlen;
            assert_int_equal(zt_wire_read_len(&c, &dlen), 0);
            assert_int_equal(dlen, sizeof(data));
            struct zt_wire_cursor d = c;
            d.left = dlen;
            zt_wire_copy(d, out);
            assert_int_equal(zt_wire_skip(&c, dlen), 0);
            got[4] = 1;
        } else {
            assert_int_equal(wt, ZT_WIRE_VARINT);
            assert_int_equal(zt_wire_read_varint(&c, &got[field - 1]), 0);
        }
    }
    assert_int_equal((int32_t)(uint32_t)got[0], -3);
    assert_int_equal(got[1], 70000);
    assert_true(got[2] == (uint64_t)1 << 40);
    assert_int_equal(got[3], ZTRAIN__V1__DTYPE__DTYPE_BF16);
    assert_memory_equal(out, data, sizeof(data));
    pieces_free(&p);
    free(packed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_varint_round_trip),
        cmocka_unit_test(test_varint_limits),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_split_every_boundary),
        cmocka_unit_test(test_next_span),
        cmocka_unit_test(test_any_order_and_unknown_fields),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_cursor_bounds),
        cmocka_unit_test(test_read_sub),
        cmocka_unit_test(test_matches_protobuf_c),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
