// An example baton plugin in C for the `pollable-plugin` world that keeps
// its state across hand-overs in the plugin's key-value bucket, built with
// `wit-bindgen c`, clang and wasi-libc (see docs/guests/c.md).
//
// While this host leads, it adds one to the counter `ticks` of its
// `default` bucket once a second (`wasi:keyvalue/atomics.increment`) and
// prints `tick term=T total=N`. Each term runs in a fresh instance; the
// bucket outlives it, so a new leader's first tick prints the next total,
// never 1 again. A failed write (one from a term that is over is refused)
// ends the task with an error.
//
// Build: scripts/build-polyglot-guests.sh (c_kv_counter.wasm), which runs
// `wit-bindgen c WIT --world example:c-kv-counter/counter` on this folder's
// wit/ plus baton's wit/ as deps, clang-19 and `jco new --wasi-reactor`.
// Run: see examples/kv-counter.toml and docs/state.md.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "counter.h"

static const char *role_name(baton_leader_types_role_t role) {
    switch (role) {
    case BATON_LEADER_TYPES_ROLE_PENDING: return "pending";
    case BATON_LEADER_TYPES_ROLE_LEADING: return "leading";
    default: return "following";
    }
}

static bool same_string(const counter_string_t *a, const counter_string_t *b) {
    return a->len == b->len && memcmp(a->ptr, b->ptr, a->len) == 0;
}

static bool same_status(const baton_leader_types_status_t *a, const baton_leader_types_status_t *b) {
    return a->role == b->role && a->term == b->term && same_string(&a->lease, &b->lease)
        && a->holder.is_some == b->holder.is_some
        && (!a->holder.is_some || same_string(&a->holder.val, &b->holder.val));
}

// Whether `change` fired before a one-second timer did.
static bool wait_change_or_second(wasi_io_poll_own_pollable_t change) {
    wasi_io_poll_own_pollable_t timer =
        wasi_clocks_0_2_12_monotonic_clock_subscribe_duration(1000000000ull);
    wasi_io_poll_borrow_pollable_t both[2] = {
        wasi_io_poll_borrow_pollable(change),
        wasi_io_poll_borrow_pollable(timer),
    };
    wasi_io_poll_list_borrow_pollable_t in = {both, 2};
    counter_list_u32_t ready;
    wasi_io_poll_poll(&in, &ready);
    bool changed = false;
    for (size_t i = 0; i < ready.len; i++) {
        if (ready.ptr[i] == 0) changed = true;
    }
    counter_list_u32_free(&ready);
    wasi_io_poll_pollable_drop_own(timer);
    return changed;
}

// Sets `err` (the `err` of `run`'s result) to "WHAT: WHY" and frees `e`.
static void fail(counter_string_t *err, const char *what, wasi_keyvalue_store_error_t *e) {
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
    counter_string_dup(err, text);
}

bool exports_baton_leader_task_sync_run(exports_baton_leader_task_sync_status_t *status,
                                        counter_string_t *err) {
    uint64_t term = status->term;
    bool ok = true;
    printf("start term=%llu\n", (unsigned long long)term);
    fflush(stdout);

    // The plugin's own bucket: granted without configuration.
    counter_string_t name, key;
    counter_string_set(&name, "default");
    counter_string_set(&key, "ticks");
    wasi_keyvalue_store_own_bucket_t bucket;
    wasi_keyvalue_store_error_t e;
    if (!wasi_keyvalue_store_open(&name, &bucket, &e)) {
        fail(err, "open", &e);
        exports_baton_leader_task_sync_status_free(status);
        return false;
    }

    baton_leader_status_pollable_tuple2_status_own_pollable_t now;
    baton_leader_status_pollable_current_status(&now);
    if (same_status(&now.f0, status)) {
        while (!wait_change_or_second(now.f1)) {
            int64_t total;
            if (!wasi_keyvalue_atomics_increment(wasi_keyvalue_store_borrow_bucket(bucket), &key, 1,
                                                 &total, &e)) {
                fail(err, "increment", &e);
                ok = false;
                break;
            }
            printf("tick term=%llu total=%lld\n", (unsigned long long)term, (long long)total);
            fflush(stdout);
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
