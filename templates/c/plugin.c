// {{name}}: a baton plugin in C for the `pollable-plugin` world.
//
// While this host leads, it prints `tick term=T n=N` once a second; it waits
// on the change pollable and the timer together, so it returns as soon as the
// term is over.

#include <stdio.h>
#include <string.h>

#include "pollable_plugin.h"

static const char *role_name(baton_leader_types_role_t role) {
    switch (role) {
    case BATON_LEADER_TYPES_ROLE_PENDING: return "pending";
    case BATON_LEADER_TYPES_ROLE_LEADING: return "leading";
    default: return "following";
    }
}

static bool same_string(const pollable_plugin_string_t *a, const pollable_plugin_string_t *b) {
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
    pollable_plugin_list_u32_t ready;
    wasi_io_poll_poll(&in, &ready);
    bool changed = false;
    for (size_t i = 0; i < ready.len; i++) {
        if (ready.ptr[i] == 0) changed = true;
    }
    pollable_plugin_list_u32_free(&ready);
    wasi_io_poll_pollable_drop_own(timer);
    return changed;
}

bool exports_baton_leader_task_sync_run(exports_baton_leader_task_sync_status_t *status,
                                        pollable_plugin_string_t *err) {
    (void)err;
    uint64_t term = status->term;
    printf("start term=%llu\n", (unsigned long long)term);
    fflush(stdout);

    // Watch first: if the status already differs from the one `run` got, the
    // term is over before it started; otherwise the pollable is ready on the
    // next change.
    baton_leader_status_pollable_tuple2_status_own_pollable_t now;
    baton_leader_status_pollable_current_status(&now);
    if (same_status(&now.f0, status)) {
        for (unsigned long n = 1; !wait_change_or_second(now.f1); n++) {
            printf("tick term=%llu n=%lu\n", (unsigned long long)term, n);
            fflush(stdout);
        }
    }
    baton_leader_status_pollable_tuple2_status_own_pollable_free(&now);

    baton_leader_status_pollable_current_status(&now);
    printf("stop term=%llu role=%s\n", (unsigned long long)term, role_name(now.f0.role));
    fflush(stdout);
    baton_leader_status_pollable_tuple2_status_own_pollable_free(&now);
    exports_baton_leader_task_sync_status_free(status);
    return true;
}
