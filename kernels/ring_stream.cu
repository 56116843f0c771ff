// The kernel of examples/ring_stream.rs: a persistent consumer on the device API
// (include/vkgdr/ring.cuh) that processes every record and reports back.
//
// Each record is a sample batch: u32 sensor id, u32 count, then `count` u32 values. The kernel
// sums each record's values (one thread per record, in parallel for a whole group) and adds, per
// lane, the number of records and the sum of all values to the lane's result words (pinned host
// memory): result[0] += records, result[1] += sum, result[2] += malformed records.
//
// Launch view.lanes blocks of 256 threads. Build: nvcc -ptx -arch=compute_75 -O3.

#include "../include/vkgdr/ring.cuh"

#define STREAM_THREADS 256u

extern "C" __global__ void ring_stream_consumer(vkgdr_ring_view view)
{
    __shared__ vkgdr::ReaderShared<STREAM_THREADS> smem;
    __shared__ unsigned long long scratch[STREAM_THREADS / 32];
    if (blockIdx.x >= view.lanes || blockDim.x != STREAM_THREADS) {
        return;
    }
    const vkgdr::RingLane lane = vkgdr::ring_lane(view, blockIdx.x);
    vkgdr::BlockReader<STREAM_THREADS> reader(lane, smem);
    unsigned long long records = 0ull, sum = 0ull, bad = 0ull;
    while (reader.wait()) {
        vkgdr::Record rec;
        const unsigned int n = reader.next(rec);
        if (threadIdx.x < n && rec.kind == VKGDR_RING_KIND_DATA) {
            const unsigned int* words = (const unsigned int*)rec.payload;
            const unsigned int count = rec.len >= 8u ? __ldcg(words + 1) : 0u;
            if (rec.len < 8u || rec.len != 8u + 4u * count) {
                bad += 1ull;
            } else {
                records += 1ull;
                for (unsigned int i = 0; i < count; ++i) {
                    sum += __ldcg(words + 2 + i);
                }
            }
        }
        if (reader.error() != VKGDR_RING_OK) {
            bad += threadIdx.x == 0 ? 1ull : 0ull;
            reader.skip_to_tail();
        }
        reader.release();
    }
    records = vkgdr::block_sum<STREAM_THREADS>(records, scratch);
    sum = vkgdr::block_sum<STREAM_THREADS>(sum, scratch);
    bad = vkgdr::block_sum<STREAM_THREADS>(bad, scratch);
    if (threadIdx.x == 0) {
        lane.result[0] += records;
        lane.result[1] += sum;
        lane.result[2] += bad + (reader.error() != VKGDR_RING_OK ? 1ull : 0ull);
    }
}
