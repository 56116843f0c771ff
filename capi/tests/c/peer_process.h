/* The peer process of the sharing tests (share_vulkan.c on CI, gpu/share.c on the GPU machine),
 * and the memory patterns the owner and the peer write for each other to check. The peer: fork,
 * then exec this very program with other arguments, in an environment where
 * VKGDR_CUDA_LIBRARY names a library that does not exist, so the peer shows that attaching and
 * writing need no CUDA. The child calls nothing but execve and _exit between fork and exec
 * (the parent has threads: its share server's), and its environment is made before the fork.
 * Needs _POSIX_C_SOURCE 200809L, defined before any include. */
#ifndef VKGDR_TEST_PEER_PROCESS_H
#define VKGDR_TEST_PEER_PROCESS_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* The CUDA library the peer is pointed at: it does not exist. */
#define PEER_NO_CUDA "/nonexistent/libcuda.so.1"

/* Starts this program (/proc/self/exe) with `args` (NULL-terminated; args[0] is its name) and
 * this process's environment with VKGDR_CUDA_LIBRARY=PEER_NO_CUDA; returns the child's pid,
 * or -1 if it could not be started. */
static inline pid_t spawn_peer(char *const args[])
{
    static const char setting[] = "VKGDR_CUDA_LIBRARY=" PEER_NO_CUDA;
    size_t n = 0, i, k = 0;
    char **env;
    pid_t pid;
    while (environ[n] != NULL) {
        n++;
    }
    env = malloc((n + 2) * sizeof *env);
    if (env == NULL) {
        return -1;
    }
    for (i = 0; i < n; i++) {
        if (strncmp(environ[i], "VKGDR_CUDA_LIBRARY=", 19) != 0) {
            env[k++] = environ[i];
        }
    }
    env[k++] = (char *)setting;
    env[k] = NULL;
    fflush(NULL); /* nothing buffered is written twice */
    pid = fork();
    if (pid == 0) {
        execve("/proc/self/exe", args, env);
        _exit(127);
    }
    free(env);
    return pid;
}

/* Waits up to `seconds` for the child, killing it if it hangs; returns its exit status, or -1
 * when it was killed or died of a signal. */
static inline int finish_peer(pid_t pid, int seconds)
{
    time_t start = time(NULL);
    struct timespec pause = {0, 10000000};
    int status = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        }
        if (r < 0) {
            return -1;
        }
        if (time(NULL) - start > seconds) {
            fprintf(stderr, "the peer process hung for %d s: killed\n", seconds);
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        nanosleep(&pause, NULL);
    }
}

/* Sleeps `ms` milliseconds. */
static inline void sleep_ms(long ms)
{
    struct timespec t;
    t.tv_sec = ms / 1000;
    t.tv_nsec = (ms % 1000) * 1000000;
    nanosleep(&t, NULL);
}

/* Word i of the memory pattern `seed`. */
static inline uint32_t pattern_word(size_t i, uint32_t seed)
{
    return (uint32_t)(i * 2654435761u) ^ seed;
}

/* Writes the pattern `seed` into the whole words of `p[0..n)`. */
static inline void fill(unsigned char *p, size_t n, uint32_t seed)
{
    size_t i;
    for (i = 0; i + 4 <= n; i += 4) {
        uint32_t w = pattern_word(i / 4, seed);
        memcpy(p + i, &w, 4);
    }
}

/* Whether the whole words of `p[0..n)` hold the pattern `seed`; names the first that does not. */
static inline int matches(const unsigned char *p, size_t n, uint32_t seed)
{
    size_t i;
    for (i = 0; i + 4 <= n; i += 4) {
        uint32_t w;
        memcpy(&w, p + i, 4);
        if (w != pattern_word(i / 4, seed)) {
            fprintf(stderr, "  word %zu is %08x, expected %08x\n", i / 4, w,
                    pattern_word(i / 4, seed));
            return 0;
        }
    }
    return 1;
}

#endif
