/* Tests of common/json: syntax errors with line and column, typed getters with their messages, and
 * unknown-key reporting with spelling suggestions. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/json.h"

static void expect_parse_error(const char *text, const char *message)
{
    cJSON *obj = (cJSON *)0x1;
    zt_err err = {{0}};
    assert_int_equal(zt_json_parse_object(text, "config.json", &obj, &err), ZT_EFORMAT);
    assert_ptr_equal(obj, (cJSON *)0x1);
    if (strcmp(err.msg, message) != 0)
        fail_msg("parse of '%s': message '%s', want '%s'", text, err.msg, message);
}

static void test_parse(void **state)
{
    (void)state;
    cJSON *obj = NULL;
    zt_err err = {{0}};
    assert_int_equal(zt_json_parse_object(" {\"a\": 1, \"b\": [1, 2]}\n", "config.json", &obj, &err), 0);
    assert_non_null(obj);
    cJSON_Delete(obj);

    expect_parse_error("{\n  \"a\": 1,\n  \"b\": ]\n}", "config.json: JSON syntax error at line 3, column 8, near ']'");
    expect_parse_error("{\"a\": 1 \"b\": 2}", "config.json: JSON syntax error at line 1, column 9, near '\"b\": 2}'");
    expect_parse_error("{\"a\": 1}\n}", "config.json: JSON syntax error at line 2, column 1, near '}'");
    expect_parse_error("{\"a\": ", "config.json: JSON syntax error at line 1, column 7: unexpected end of input");
    expect_parse_error("", "config.json: JSON syntax error at line 1, column 1: unexpected end of input");
    expect_parse_error("[1, 2]", "config.json: expected a JSON object ({...}) at the top level, got an array");
    expect_parse_error("\"text\"", "config.json: expected a JSON object ({...}) at the top level, got a string");
}

/* Parses text and sets up a reader on it; the caller deletes *obj. */
static void reader_on(zt_json_reader *r, cJSON **obj, const char *text)
{
    zt_err err = {{0}};
    int rc = zt_json_parse_object(text, "config.json", obj, &err);
    if (rc != 0)
        fail_msg("%s", err.msg);
    zt_json_reader_init(r, *obj, "config.json");
}

static void test_getters(void **state)
{
    (void)state;
    cJSON *obj;
    zt_json_reader r;
    reader_on(&r, &obj,
              "{\"n_layer\": 12, \"big\": -9007199254740992, \"lr\": 3e-4, \"tied\": true, \"name\": \"gpt2\", "
              "\"whole\": 2.0}");
    zt_err err = {{0}};
    int64_t n = -1, big = 0, missing = 77, whole = 0;
    double lr = 0, dmissing = 1.5;
    bool tied = false, bmissing = true;
    char name[8] = "x", smissing[8] = "keep";
    assert_int_equal(zt_json_get_int(&r, "n_layer", 1, 1000, &n, &err), 0);
    assert_int_equal(n, 12);
    assert_int_equal(zt_json_get_int(&r, "big", INT64_MIN, INT64_MAX, &big, &err), 0);
    assert_true(big == -9007199254740992LL);
    assert_int_equal(zt_json_get_int(&r, "whole", 0, 10, &whole, &err), 0);
    assert_int_equal(whole, 2);
    assert_int_equal(zt_json_get_double(&r, "lr", 0, 1, &lr, &err), 0);
    assert_true(lr == 3e-4);
    assert_int_equal(zt_json_get_bool(&r, "tied", &tied, &err), 0);
    assert_true(tied);
    assert_int_equal(zt_json_get_string(&r, "name", name, sizeof(name), &err), 0);
    assert_string_equal(name, "gpt2");
    /* Absent keys leave the defaults alone. */
    assert_int_equal(zt_json_get_int(&r, "n_head", 1, 10, &missing, &err), 0);
    assert_int_equal(missing, 77);
    assert_int_equal(zt_json_get_double(&r, "eps", 0, 1, &dmissing, &err), 0);
    assert_true(dmissing == 1.5);
    assert_int_equal(zt_json_get_bool(&r, "bias", &bmissing, &err), 0);
    assert_true(bmissing);
    assert_int_equal(zt_json_get_string(&r, "act", smissing, sizeof(smissing), &err), 0);
    assert_string_equal(smissing, "keep");
    assert_int_equal(zt_json_reader_finish(&r, &err), 0);
    cJSON_Delete(obj);
}

static void expect_getter_error(int rc, const zt_err *err, const char *message)
{
    assert_int_equal(rc, ZT_EINVAL_CONFIG);
    if (strcmp(err->msg, message) != 0)
        fail_msg("message '%s', want '%s'", err->msg, message);
}

static void test_getter_errors(void **state)
{
    (void)state;
    cJSON *obj;
    zt_json_reader r;
    reader_on(&r, &obj,
              "{\"n_layer\": \"4\", \"half\": 2.5, \"neg\": -3, \"huge\": 1e300, \"arr\": [1], \"lr\": 5, "
              "\"flag\": 1, \"s\": 3, \"long\": \"abcdefgh\", \"nul\": null, \"obj\": {}}");
    zt_err err = {{0}};
    int64_t i = 5;
    double d = 0.5;
    bool b = false;
    char s[8] = "";
    expect_getter_error(zt_json_get_int(&r, "n_layer", 1, 100, &i, &err), &err,
                        "config.json: n_layer must be a whole number, got a string");
    expect_getter_error(zt_json_get_int(&r, "half", 1, 100, &i, &err), &err,
                        "config.json: half must be a whole number, got 2.5");
    expect_getter_error(zt_json_get_int(&r, "neg", 1, 100, &i, &err), &err,
                        "config.json: neg must be from 1 to 100, got -3");
    expect_getter_error(zt_json_get_int(&r, "huge", INT64_MIN, INT64_MAX, &i, &err), &err,
                        "config.json: huge must be from -9223372036854775808 to 9223372036854775807, got 1.0000000000000001e+300");
    expect_getter_error(zt_json_get_int(&r, "arr", 1, 100, &i, &err), &err,
                        "config.json: arr must be a whole number, got an array");
    expect_getter_error(zt_json_get_int(&r, "nul", 1, 100, &i, &err), &err,
                        "config.json: nul must be a whole number, got null");
    assert_int_equal(i, 5);
    expect_getter_error(zt_json_get_double(&r, "lr", 0, 1, &d, &err), &err, "config.json: lr must be from 0 to 1, got 5");
    expect_getter_error(zt_json_get_double(&r, "obj", 0, 1, &d, &err), &err,
                        "config.json: obj must be a number, got an object");
    assert_true(d == 0.5);
    expect_getter_error(zt_json_get_bool(&r, "flag", &b, &err), &err,
                        "config.json: flag must be true or false, got a number");
    expect_getter_error(zt_json_get_string(&r, "s", s, sizeof(s), &err), &err,
                        "config.json: s must be a string, got a number");
    expect_getter_error(zt_json_get_string(&r, "long", s, sizeof(s), &err), &err,
                        "config.json: long is too long (8 characters, at most 7)");
    assert_string_equal(s, "");
    cJSON_Delete(obj);
}

static void test_keys_are_case_sensitive(void **state)
{
    (void)state;
    cJSON *obj;
    zt_json_reader r;
    reader_on(&r, &obj, "{\"N_LAYER\": 3}");
    zt_err err = {{0}};
    int64_t n = 1;
    assert_int_equal(zt_json_get_int(&r, "n_layer", 1, 10, &n, &err), 0);
    assert_int_equal(n, 1);
    expect_getter_error(zt_json_reader_finish(&r, &err), &err,
                        "unknown field 'N_LAYER' in config.json (remove it or check its spelling)");
    cJSON_Delete(obj);
}

static void test_finish_unknown_keys(void **state)
{
    (void)state;
    cJSON *obj;
    zt_json_reader r;
    zt_err err = {{0}};
    int64_t v = 0;

    reader_on(&r, &obj, "{\"n_layer\": 2, \"n_layers\": 4}");
    zt_json_get_int(&r, "n_layer", 1, 10, &v, &err);
    zt_json_get_int(&r, "n_embd", 1, 10, &v, &err);
    expect_getter_error(zt_json_reader_finish(&r, &err), &err,
                        "unknown field 'n_layers' in config.json (did you mean 'n_layer'?)");
    cJSON_Delete(obj);

    /* Two edits away still gets a suggestion; three does not. */
    reader_on(&r, &obj, "{\"vocab_sz\": 2}");
    zt_json_get_int(&r, "vocab_size", 1, 10, &v, &err);
    expect_getter_error(zt_json_reader_finish(&r, &err), &err,
                        "unknown field 'vocab_sz' in config.json (did you mean 'vocab_size'?)");
    cJSON_Delete(obj);
    reader_on(&r, &obj, "{\"vocab\": 2}");
    zt_json_get_int(&r, "vocab_size", 1, 10, &v, &err);
    expect_getter_error(zt_json_reader_finish(&r, &err), &err,
                        "unknown field 'vocab' in config.json (remove it or check its spelling)");
    cJSON_Delete(obj);

    /* Accepted keys and ignored prefixes pass. */
    reader_on(&r, &obj, "{\"architectures\": [\"GPT2\"], \"_name_or_path\": \"x\", \"_comment\": 1}");
    r.ignore_prefix = "_";
    zt_json_accept(&r, "architectures");
    assert_int_equal(zt_json_reader_finish(&r, &err), 0);
    cJSON_Delete(obj);

    /* A key given twice. */
    reader_on(&r, &obj, "{\"n_layer\": 2, \"n_layer\": 3}");
    zt_json_get_int(&r, "n_layer", 1, 10, &v, &err);
    expect_getter_error(zt_json_reader_finish(&r, &err), &err, "field 'n_layer' appears twice in config.json (keep one)");
    cJSON_Delete(obj);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_getters),
        cmocka_unit_test(test_getter_errors),
        cmocka_unit_test(test_keys_are_case_sensitive),
        cmocka_unit_test(test_finish_unknown_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
