/* Tiny check helpers shared by the C API's test programs (CPU and GPU). Every CHECK counts; the
 * program ends with CHECK_SUMMARY(), which prints "name: N passed, N failed" and returns the exit
 * status (0 only if nothing failed). */
#ifndef VKGDR_TEST_CHECK_H
#define VKGDR_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vkgdr.h"

static int check_passed, check_failed;

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (cond) {                                                                        \
            check_passed++;                                                                \
        } else {                                                                           \
            check_failed++;                                                                \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
        }                                                                                  \
    } while (0)

/* Whether the last error exists and contains `needle`; prints it when it does not. */
static inline int last_error_contains(const char *needle)
{
    char *msg = vkgdr_last_error();
    int ok = msg != NULL && strstr(msg, needle) != NULL;
    if (!ok) {
        fprintf(stderr, "  last error %s%s%s does not contain \"%s\"\n", msg ? "\"" : "",
                msg ? msg : "NULL", msg ? "\"" : "", needle);
    }
    free(msg);
    return ok;
}

/* Whether the thread has no last error: nothing failed since its last vkgdr_open,
 * vkgdr_open_vulkan or vkgdr_memory_alloc began (they clear it first), or since it started. */
static inline int no_last_error(void)
{
    char *msg = vkgdr_last_error();
    if (msg != NULL) {
        fprintf(stderr, "  unexpected last error \"%s\"\n", msg);
    }
    free(msg);
    return msg == NULL;
}

/* The error mark_last_error() leaves behind. */
#define MARK_ERROR "vkgdr_memory_get_size: the vkgdr_memory_t handle is NULL"

/* Puts a known error in place (vkgdr_memory_get_size of NULL). A successful call leaves the last
 * error alone (as in vkgdr 0.1; only vkgdr_open, vkgdr_open_vulkan and vkgdr_memory_alloc clear
 * it), so for calls that report failure only through vkgdr_last_error() (destructors, flushes),
 * "nothing failed" reads "the mark is still there": see still_marked(). */
static inline void mark_last_error(void)
{
    (void)vkgdr_memory_get_size(NULL);
}

/* Whether the last error is still the mark: no call since mark_last_error() failed. */
static inline int still_marked(void)
{
    return last_error_contains(MARK_ERROR);
}

#define CHECK_SUMMARY(name)                                                                \
    (printf("%s: %d passed, %d failed\n", (name), check_passed, check_failed),            \
     check_failed == 0 && check_passed > 0 ? 0 : 1)

#endif
