/* Preloaded into kafka-lock by the CLI tests (tests/it/cli.rs, `slow_start`): holds back its
 * start of the supervisor (the posix_spawnp of `kafka-lock __supervise ...`) by SLOW_SPAWN_MS
 * milliseconds, before the spawn, or after it with SLOW_SPAWN_AFTER (the supervisor then runs
 * while kafka-lock's start of it is not over), and fails it with ENOENT after the wait with
 * SLOW_SPAWN_FAIL. Only that one spawn: the supervisor, which inherits this too, starts the
 * command unhindered. The wait is on the calling thread only, as a slow fork and exec's is. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*spawnp_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                         const posix_spawnattr_t *, char *const[], char *const[]);

static void hold_back(void) {
    const char *ms = getenv("SLOW_SPAWN_MS");
    if (ms == NULL) {
        return;
    }
    long n = atol(ms);
    struct timespec left = {n / 1000, (n % 1000) * 1000000L};
    while (nanosleep(&left, &left) == -1 && errno == EINTR) {
    }
}

int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *actions,
                 const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    spawnp_fn real = (spawnp_fn)dlsym(RTLD_NEXT, "posix_spawnp");
    if (real == NULL) {
        return ENOSYS;
    }
    int supervisor = argv != NULL && argv[0] != NULL && argv[1] != NULL &&
                     strcmp(argv[1], "__supervise") == 0;
    if (!supervisor) {
        return real(pid, file, actions, attr, argv, envp);
    }
    if (getenv("SLOW_SPAWN_AFTER") != NULL) {
        int started = real(pid, file, actions, attr, argv, envp);
        hold_back();
        return started;
    }
    hold_back();
    if (getenv("SLOW_SPAWN_FAIL") != NULL) {
        return ENOENT;
    }
    return real(pid, file, actions, attr, argv, envp);
}
