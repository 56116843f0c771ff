/* A C ring feeding a kernel: ring_consume_persistent[_mirrored] of kernels/ring.ptx stays resident
 * and consumes the records that C threads reserve, write (sequence number and checksum inside the
 * payload, in the test format of kernels/ring.cu) and commit; some reservations are cancelled
 * (they become padding that keeps its number). Before the consumer starts, one thread pushes until
 * the ring reports VKGDR_RING_FULL; afterwards it pushes a few more. The kernel's result words
 * must count every record once, in order, with the producers' checksum sum and no error.
 * Padded ring (coherent and forced non-coherent) and mirrored ring.
 *
 * Usage: gpu_ring path/to/kernels/ring.ptx */
#define _POSIX_C_SOURCE 199309L /* nanosleep */
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "gpu_util.h"

#define PRODUCERS 4
#define CANCEL_EVERY 997

typedef struct {
    vkgdr_ring_t ring;
    unsigned long long records, max_body;
    unsigned long long data, sum, errors;
} producer;

static uint64_t term(uint64_t i, unsigned char b)
{
    uint64_t x = ((i << 8) | b) + 1;
    x *= 0x9E3779B97F4A7C15ull;
    return x ^ (x >> 29);
}

/* Fills a test payload of `len` bytes for record `seq`; returns its checksum. */
static uint64_t make_payload(unsigned char *p, size_t len, uint64_t seq)
{
    uint64_t sum = 0;
    size_t j;
    for (j = 16; j < len; j++) {
        p[j] = (unsigned char)(seq * 31u + j);
        sum += term(j - 16, p[j]);
    }
    memcpy(p, &seq, 8); /* little-endian, as the format says (x86-64) */
    memcpy(p + 8, &sum, 8);
    return sum;
}

static void *produce(void *arg)
{
    producer *w = arg;
    unsigned char *buf = malloc(16 + w->max_body);
    unsigned long long k;
    for (k = 0; k < w->records; k++) {
        size_t len = 16 + (size_t)((k * 7919u + (uintptr_t)w) % w->max_body);
        vkgdr_ring_reservation_t r = NULL;
        uint64_t seq, sum;
        if (vkgdr_ring_reserve(w->ring, len, 30000000000ll, &r) != VKGDR_SUCCESS) {
            w->errors++;
            break;
        }
        seq = vkgdr_ring_reservation_get_seq(r);
        if (seq % CANCEL_EVERY == 0) {
            vkgdr_ring_cancel(r);
            continue;
        }
        sum = make_payload(buf, len, seq);
        /* In two pieces, to exercise offsets. */
        w->errors += vkgdr_ring_reservation_write(r, 0, buf, 16) != VKGDR_SUCCESS;
        w->errors += vkgdr_ring_reservation_write(r, 16, buf + 16, len - 16) != VKGDR_SUCCESS;
        w->errors += vkgdr_ring_commit(r) != VKGDR_SUCCESS;
        w->data++;
        w->sum += sum;
    }
    free(buf);
    return NULL;
}

/* Waits up to `seconds` for the stream; returns whether it finished. */
static int wait_stream(CUstream s, int seconds)
{
    time_t start = time(NULL);
    CUresult r;
    while ((r = cuStreamQuery(s)) == CUDA_ERROR_NOT_READY && time(NULL) - start < seconds) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    return r == CUDA_SUCCESS;
}

static void run(CUmodule module, uint32_t open_flags, int mirrored, unsigned long long records,
                unsigned long long max_body, const char *what)
{
    vkgdr_t g = vkgdr_open(0, VKGDR_OPEN_CURRENT_CONTEXT_BIT | open_flags);
    vkgdr_ring_t ring = vkgdr_ring_create(g, mirrored ? 2u << 20 : 1u << 20,
                                          mirrored ? VKGDR_RING_MIRRORED_BIT : 0);
    vkgdr_ring_device_view v;
    CUfunction consume = NULL;
    CUstream stream;
    producer workers[PRODUCERS];
    pthread_t threads[PRODUCERS];
    unsigned char payload[200];
    unsigned long long data = 0, seqs = 0, sum = 0, errors = 0;
    uint64_t seq = 0, res[8] = {0};
    void *args[6];
    int i, r;

    CHECK(g != NULL && ring != NULL, "%s: open and create", what);
    if (ring == NULL) {
        vkgdr_close(g);
        return;
    }
    v.struct_size = sizeof v;
    CHECK(vkgdr_ring_get_device_view(ring, &v) == VKGDR_SUCCESS && v.mirrored == (uint32_t)mirrored,
          "%s: view", what);
    CU_OK(cuModuleGetFunction(&consume, module, mirrored ? "ring_consume_persistent_mirrored"
                                                         : "ring_consume_persistent"));

    /* No consumer yet: fill the ring from one thread (its numbers are predictable). */
    if (!mirrored) {
        for (;;) {
            uint64_t sum1 = make_payload(payload, sizeof payload, seqs);
            r = vkgdr_ring_push(ring, payload, sizeof payload, 0, &seq);
            if (r != VKGDR_SUCCESS) {
                break;
            }
            errors += seq != seqs;
            seqs++;
            data++;
            sum += sum1;
        }
        CHECK(r == VKGDR_RING_FULL && seqs > 1000, "%s: %d after %llu pushes", what, r, seqs);
    }

    CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    args[0] = &v.data;
    args[1] = &v.capacity;
    args[2] = &v.tail;
    args[3] = &v.stop;
    args[4] = &v.head;
    args[5] = &v.result;
    CU_OK(cuLaunchKernel(consume, 1, 1, 1, 256, 1, 1, 0, stream, args, NULL));

    for (i = 0; i < PRODUCERS; i++) {
        memset(&workers[i], 0, sizeof workers[i]);
        workers[i].ring = ring;
        workers[i].records = records / PRODUCERS;
        workers[i].max_body = max_body;
        pthread_create(&threads[i], NULL, produce, &workers[i]);
    }
    for (i = 0; i < PRODUCERS; i++) {
        pthread_join(threads[i], NULL);
        data += workers[i].data;
        sum += workers[i].sum;
        errors += workers[i].errors;
        seqs += workers[i].records;
    }
    /* After the threads: a few more pushes, numbered on from every reservation so far. */
    for (i = 0; i < 50; i++, seqs++) {
        sum += make_payload(payload, sizeof payload, seqs);
        errors += vkgdr_ring_push(ring, payload, sizeof payload, -1, &seq) != VKGDR_SUCCESS;
        errors += seq != seqs;
        data++;
    }
    CHECK(errors == 0, "%s: %llu producer errors", what, errors);

    CHECK(vkgdr_ring_stop(ring) == VKGDR_SUCCESS, "%s: stop", what);
    CHECK(wait_stream(stream, 60), "%s: the consumer did not finish", what);
    CHECK(vkgdr_ring_get_results(ring, res, 5) == VKGDR_SUCCESS, "%s: results", what);
    CHECK(res[2] == 0, "%s: the kernel found %llu bad records", what,
          (unsigned long long)res[2]);
    CHECK(res[0] == data, "%s: %llu records consumed, %llu produced", what,
          (unsigned long long)res[0], data);
    CHECK(res[3] == seqs, "%s: next seq %llu, expected %llu", what, (unsigned long long)res[3],
          seqs);
    CHECK(res[1] == sum, "%s: checksum sum differs", what);
    CHECK(vkgdr_ring_get_head(ring) == res[4], "%s: head %llu, position %llu", what,
          (unsigned long long)vkgdr_ring_get_head(ring), (unsigned long long)res[4]);
    printf("%s: %llu records (%llu cancelled) consumed by a persistent kernel\n", what, data,
           seqs - data);
    cuStreamDestroy(stream);
    vkgdr_ring_destroy(ring);
    vkgdr_close(g);
    CHECK(no_last_error(), "%s: teardown", what);
}

int main(int argc, char **argv)
{
    char *ptx = ptx_argument(argc, argv, "ring.ptx");
    CUdevice dev = enter_primary_context();
    CUmodule module;
    CU_OK(cuModuleLoadData(&module, ptx));
    run(module, 0, 0, 200000, 1000, "padded ring");
    run(module, VKGDR_OPEN_FORCE_NON_COHERENT_BIT, 0, 40000, 1000, "padded ring, non-coherent");
    run(module, 0, 1, 20000, 60000, "mirrored ring");
    cuModuleUnload(module);
    leave_primary_context(dev);
    free(ptx);
    return CHECK_SUMMARY("gpu_ring");
}
