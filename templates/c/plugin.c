// {{name}}: a baton plugin in C for the `pollable-plugin` world.
//
// While this host leads, it prints `tick term=T n=N` once a second (the
// setting `interval-ms` of its `config` table in baton.toml changes the
// period); it waits on the change pollable and the timer together, so it
// returns as soon as the term is over.
//
// `N` counts the ticks of every term: it is kept in the plugin's own
// key-value bucket (`default`), which outlives the instance, so the next
// leader, on this host or another, goes on from where this one stopped. The
// host refuses a write from a term that is over, and the task then ends
// with that error.
//
// With REPORT_URL set (see baton.toml: the variable and an `http` grant),
// each tick also sends `POST REPORT_URL` with a small JSON body over
// wasi:http and prints `report status=S term=T n=N` (or `report error E
// term=T n=N`). The host adds the lease and the term as Baton-Lease and
// Baton-Term headers, so the receiver can refuse a stale leader.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin.h"

static const char *role_name(baton_leader_types_role_t role) {
    switch (role) {
    case BATON_LEADER_TYPES_ROLE_PENDING: return "pending";
    case BATON_LEADER_TYPES_ROLE_LEADING: return "leading";
    default: return "following";
    }
}

static bool same_string(const plugin_string_t *a, const plugin_string_t *b) {
    return a->len == b->len && memcmp(a->ptr, b->ptr, a->len) == 0;
}

static bool same_status(const baton_leader_types_status_t *a, const baton_leader_types_status_t *b) {
    return a->role == b->role && a->term == b->term && same_string(&a->lease, &b->lease)
        && a->holder.is_some == b->holder.is_some
        && (!a->holder.is_some || same_string(&a->holder.val, &b->holder.val));
}

// Blocks until `p` or `change` is ready; returns whether `change` is.
static bool wait_or_change(wasi_io_poll_own_pollable_t p, wasi_io_poll_own_pollable_t change) {
    wasi_io_poll_borrow_pollable_t both[2] = {
        wasi_io_poll_borrow_pollable(p),
        wasi_io_poll_borrow_pollable(change),
    };
    wasi_io_poll_list_borrow_pollable_t in = {both, 2};
    plugin_list_u32_t ready;
    wasi_io_poll_poll(&in, &ready);
    bool changed = false;
    for (size_t i = 0; i < ready.len; i++) {
        if (ready.ptr[i] == 1) changed = true;
    }
    plugin_list_u32_free(&ready);
    return changed;
}

// Whether `change` fired before a timer of `ms` milliseconds did.
static bool wait_change_or(wasi_io_poll_own_pollable_t change, uint64_t ms) {
    wasi_io_poll_own_pollable_t timer =
        wasi_clocks_0_2_12_monotonic_clock_subscribe_duration(ms * 1000000ull);
    bool changed = wait_or_change(timer, change);
    wasi_io_poll_pollable_drop_own(timer);
    return changed;
}

static plugin_string_t str(const char *s, size_t len) {
    return (plugin_string_t){(uint8_t *)s, len};
}

// The setting `key` of the plugin's `config` table as a number, or
// `fallback` when it has none (or it cannot be read).
static uint64_t setting_u64(const char *key, uint64_t fallback) {
    plugin_string_t k = str(key, strlen(key));
    plugin_option_string_t value;
    wasi_config_store_error_t error;
    if (!wasi_config_store_get(&k, &value, &error)) {
        wasi_config_store_error_free(&error);
        return fallback;
    }
    uint64_t n = fallback;
    if (value.is_some) {
        char text[32];
        snprintf(text, sizeof text, "%.*s", (int)value.val.len, (const char *)value.val.ptr);
        char *end;
        unsigned long long parsed = strtoull(text, &end, 10);
        if (end != text && *end == 0) n = parsed;
    }
    plugin_option_string_free(&value);
    return n;
}

// Sets `err` (the `err` of `run`'s result) to "WHAT: WHY" and frees `e`.
static void kv_failed(plugin_string_t *err, const char *what, wasi_keyvalue_store_error_t *e) {
    char text[512];
    switch (e->tag) {
    case WASI_KEYVALUE_STORE_ERROR_NO_SUCH_STORE:
        snprintf(text, sizeof text, "%s: no-such-store", what);
        break;
    case WASI_KEYVALUE_STORE_ERROR_ACCESS_DENIED:
        snprintf(text, sizeof text, "%s: access-denied", what);
        break;
    default:
        snprintf(text, sizeof text, "%s: %.*s", what, (int)e->val.other.len,
                 (const char *)e->val.other.ptr);
    }
    wasi_keyvalue_store_error_free(e);
    // Heap-allocated: the generated code frees it after `run` returns.
    plugin_string_dup(err, text);
}

// POSTs `body` to `url` (http://HOST[:PORT]/PATH or https://...). Returns the
// response's status (> 0), 0 if `change` fired first (the request is dropped
// then), or -1 with `why` set when the request failed.
static int post(const char *url, const char *body, wasi_io_poll_own_pollable_t change,
                char *why, size_t why_len) {
    const char *rest = strstr(url, "://");
    if (!rest) {
        snprintf(why, why_len, "not an absolute URL: %s", url);
        return -1;
    }
    bool https = (size_t)(rest - url) == 5 && strncmp(url, "https", 5) == 0;
    rest += 3;
    const char *slash = strchr(rest, '/');
    size_t authority_len = slash ? (size_t)(slash - rest) : strlen(rest);
    const char *path = slash ? slash : "/";

    char length[24];
    snprintf(length, sizeof length, "%zu", strlen(body));
    wasi_http_types_tuple2_field_name_field_value_t entries[2] = {
        {str("content-type", 12), {(uint8_t *)"application/json", 16}},
        {str("content-length", 14), {(uint8_t *)length, strlen(length)}},
    };
    wasi_http_types_list_tuple2_field_name_field_value_t list = {entries, 2};
    wasi_http_types_own_fields_t headers;
    wasi_http_types_header_error_t header_error;
    if (!wasi_http_types_static_fields_from_list(&list, &headers, &header_error)) {
        snprintf(why, why_len, "header refused");
        return -1;
    }
    wasi_http_types_own_outgoing_request_t request = wasi_http_types_constructor_outgoing_request(headers);
    wasi_http_types_borrow_outgoing_request_t r = wasi_http_types_borrow_outgoing_request(request);
    wasi_http_types_method_t method = {.tag = WASI_HTTP_TYPES_METHOD_POST};
    wasi_http_types_scheme_t scheme = {.tag = https ? WASI_HTTP_TYPES_SCHEME_HTTPS : WASI_HTTP_TYPES_SCHEME_HTTP};
    plugin_string_t authority = str(rest, authority_len);
    plugin_string_t path_with_query = str(path, strlen(path));
    wasi_http_types_method_outgoing_request_set_method(r, &method);
    wasi_http_types_method_outgoing_request_set_scheme(r, &scheme);
    wasi_http_types_method_outgoing_request_set_authority(r, &authority);
    wasi_http_types_method_outgoing_request_set_path_with_query(r, &path_with_query);
    wasi_http_types_own_outgoing_body_t outgoing;
    wasi_http_types_method_outgoing_request_body(r, &outgoing);

    wasi_http_outgoing_handler_own_future_incoming_response_t pending;
    wasi_http_outgoing_handler_error_code_t error;
    if (!wasi_http_outgoing_handler_handle(request, NULL, &pending, &error)) {
        snprintf(why, why_len, "error-code %d", error.tag);
        wasi_http_outgoing_handler_error_code_free(&error);
        wasi_http_types_outgoing_body_drop_own(outgoing);
        return -1;
    }
    // The body: small, so one blocking write (at most 4096 bytes at once).
    wasi_http_types_own_output_stream_t stream;
    wasi_http_types_method_outgoing_body_write(wasi_http_types_borrow_outgoing_body(outgoing), &stream);
    plugin_list_u8_t bytes = {(uint8_t *)body, strlen(body)};
    wasi_io_streams_stream_error_t stream_error;
    if (!wasi_io_streams_method_output_stream_blocking_write_and_flush(
            wasi_io_streams_borrow_output_stream(stream), &bytes, &stream_error)) {
        wasi_io_streams_stream_error_free(&stream_error); // the response says why
    }
    wasi_io_streams_output_stream_drop_own(stream);
    wasi_http_types_error_code_t finish_error;
    if (!wasi_http_types_static_outgoing_body_finish(outgoing, NULL, &finish_error)) {
        wasi_http_types_error_code_free(&finish_error);
    }

    wasi_http_types_borrow_future_incoming_response_t f = wasi_http_types_borrow_future_incoming_response(pending);
    wasi_io_poll_own_pollable_t ready = wasi_http_types_method_future_incoming_response_subscribe(f);
    bool changed = wait_or_change(ready, change);
    wasi_io_poll_pollable_drop_own(ready);
    int status = 0;
    wasi_http_types_result_result_own_incoming_response_error_code_void_t got;
    if (changed) {
        status = 0;
    } else if (!wasi_http_types_method_future_incoming_response_get(f, &got) || got.is_err) {
        snprintf(why, why_len, "no response");
        status = -1;
    } else if (got.val.ok.is_err) {
        snprintf(why, why_len, "error-code %d", got.val.ok.val.err.tag);
        wasi_http_types_error_code_free(&got.val.ok.val.err);
        status = -1;
    } else {
        wasi_http_types_own_incoming_response_t response = got.val.ok.val.ok;
        wasi_http_types_borrow_incoming_response_t resp = wasi_http_types_borrow_incoming_response(response);
        status = wasi_http_types_method_incoming_response_status(resp);
        // Read and discard the body.
        wasi_http_types_own_incoming_body_t incoming;
        wasi_http_types_method_incoming_response_consume(resp, &incoming);
        wasi_http_types_own_input_stream_t in;
        wasi_http_types_method_incoming_body_stream(wasi_http_types_borrow_incoming_body(incoming), &in);
        for (;;) {
            plugin_list_u8_t chunk;
            if (!wasi_io_streams_method_input_stream_blocking_read(
                    wasi_io_streams_borrow_input_stream(in), 65536, &chunk, &stream_error)) {
                wasi_io_streams_stream_error_free(&stream_error);
                break; // closed: the whole body is in (or it failed)
            }
            plugin_list_u8_free(&chunk);
        }
        wasi_io_streams_input_stream_drop_own(in);
        wasi_http_types_future_trailers_drop_own(wasi_http_types_static_incoming_body_finish(incoming));
        wasi_http_types_incoming_response_drop_own(response);
    }
    wasi_http_types_future_incoming_response_drop_own(pending);
    return status;
}

bool exports_baton_leader_task_sync_run(exports_baton_leader_task_sync_status_t *status,
                                        plugin_string_t *err) {
    uint64_t term = status->term;
    bool ok = true;
    printf("start term=%llu\n", (unsigned long long)term);
    fflush(stdout);
    const char *report_url = getenv("REPORT_URL");
    // A setting, with a default when the `config` table has none.
    uint64_t interval_ms = setting_u64("interval-ms", 1000);
    // The plugin's own bucket: granted without configuration.
    plugin_string_t bucket_name = str("default", 7), key = str("ticks", 5);
    wasi_keyvalue_store_own_bucket_t bucket;
    wasi_keyvalue_store_error_t kv_error;
    if (!wasi_keyvalue_store_open(&bucket_name, &bucket, &kv_error)) {
        kv_failed(err, "open", &kv_error);
        exports_baton_leader_task_sync_status_free(status);
        return false;
    }

    // Watch first: if the status already differs from the one `run` got, the
    // term is over before it started; otherwise the pollable is ready on the
    // next change.
    baton_leader_status_pollable_tuple2_status_own_pollable_t now;
    baton_leader_status_pollable_current_status(&now);
    if (same_status(&now.f0, status)) {
        while (!wait_change_or(now.f1, interval_ms)) {
            // One atomic step in the store; fails once a newer term has
            // claimed the bucket.
            int64_t n;
            if (!wasi_keyvalue_atomics_increment(wasi_keyvalue_store_borrow_bucket(bucket), &key, 1,
                                                 &n, &kv_error)) {
                kv_failed(err, "increment", &kv_error);
                ok = false;
                break;
            }
            printf("tick term=%llu n=%lld\n", (unsigned long long)term, (long long)n);
            fflush(stdout);
            if (report_url && *report_url) {
                char body[256], why[128];
                snprintf(body, sizeof body, "{\"lease\":\"%.*s\",\"term\":%llu,\"tick\":%lld}",
                         (int)status->lease.len, (const char *)status->lease.ptr,
                         (unsigned long long)term, (long long)n);
                int code = post(report_url, body, now.f1, why, sizeof why);
                if (code == 0) break; // the status changed
                if (code > 0) {
                    printf("report status=%d term=%llu n=%lld\n", code, (unsigned long long)term,
                           (long long)n);
                } else {
                    printf("report error %s term=%llu n=%lld\n", why, (unsigned long long)term,
                           (long long)n);
                }
                fflush(stdout);
            }
        }
    }
    baton_leader_status_pollable_tuple2_status_own_pollable_free(&now);
    wasi_keyvalue_store_bucket_drop_own(bucket);

    if (ok) {
        baton_leader_status_pollable_current_status(&now);
        printf("stop term=%llu role=%s\n", (unsigned long long)term, role_name(now.f0.role));
        fflush(stdout);
        baton_leader_status_pollable_tuple2_status_own_pollable_free(&now);
    }
    exports_baton_leader_task_sync_status_free(status);
    return ok;
}
