// Helper threads for the CPU linear layers, shared out chunk by chunk.
//
// Why not OpenMP's team (at::parallel_for): the engine runs OpenMP with passive waiting
// (device/cpu.py: spinning teams turn any oversubscription into 100x slowdowns), so every
// parallel region first wakes a sleeping thread. On a 2-core Xeon (2026-11-25) that wake-up cost
// 70-80 us per call, more than a decode-sized product takes on one thread (qkv 50 us, o 27 us),
// so products below 6M multiply-adds ran on one thread and a batch-1 step read its weights at
// one core's bandwidth. Letting OpenMP spin (GOMP_SPINCOUNT) made those products 1.6-1.9x faster
// on a quiet machine but 2-3x slower as soon as another process held a core: a static split
// waits at its barrier for the half whose thread is not running.
//
// Here the helpers spin only briefly after a call (spin_us, then they sleep), yield while they
// spin, and work is claimed one chunk at a time from a shared counter: the calling thread takes
// chunks too and waits only for chunks a helper has already started, never for a helper that is
// asleep or not scheduled. Which thread computes a chunk never changes its arithmetic, so the
// linear kernel stays row invariant (bit-identical results for any thread count).
#include "cpu_work_pool.h"

#include <immintrin.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace specdec {
namespace {

using Clock = std::chrono::steady_clock;

struct Pool {
  // generation << 32 | next unclaimed chunk. One word, so a claim (compare-exchange) fails if a
  // newer call was published since the claimer read it.
  std::atomic<uint64_t> word{0};
  std::atomic<int64_t> done{0};
  // The published call; rewritten only once every chunk of the previous one is done.
  // Atomics (relaxed) only because a helper may read them while the next call is published;
  // the compare-exchange on `word` is what makes a claim valid.
  std::atomic<void (*)(void*, int64_t)> fn{nullptr};
  std::atomic<void*> ctx{nullptr};
  std::atomic<int64_t> n{0};

  std::atomic<int> active{0};       // helpers that take part (index < active)
  // How long a helper spins for the next call before it sleeps: longer than the gaps between a
  // decode step's linear layers (norm, rotary, attention: 10-150 us at batch 1), far shorter
  // than what a spinning thread could cost a busy neighbour.
  std::atomic<int64_t> spin_us{100};
  int started = 0;                  // helper threads started so far (never stopped)
  pid_t owner = 0;                  // a forked child has none of the helpers: it runs serially

  std::mutex call_mutex;            // one call at a time; a second caller runs serially
  std::mutex sleep_mutex;
  std::condition_variable wake;
  std::atomic<int> sleepers{0};
  uint32_t generation = 0;
};

// Never destroyed: helper threads are detached and may still be waiting at exit.
Pool& pool() {
  static Pool* p = new Pool();
  return *p;
}

inline uint32_t gen_of(uint64_t w) { return static_cast<uint32_t>(w >> 32); }
inline int64_t index_of(uint64_t w) { return static_cast<int64_t>(w & 0xFFFFFFFFu); }

// Claim and run chunks of generation `gen` until none is left.
void drain(Pool& p, uint32_t gen) {
  for (;;) {
    uint64_t w = p.word.load(std::memory_order_acquire);
    if (gen_of(w) != gen || index_of(w) >= p.n.load(std::memory_order_relaxed)) return;
    if (p.word.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel)) {
      // fn, ctx and n are this generation's: the call is not done while this chunk is not.
      p.fn.load(std::memory_order_relaxed)(p.ctx.load(std::memory_order_relaxed), index_of(w));
      p.done.fetch_add(1, std::memory_order_release);
    }
  }
}

void helper_main(int index) {
  Pool& p = pool();
  uint32_t seen = gen_of(p.word.load(std::memory_order_acquire));
  for (;;) {
    const auto spin_until = Clock::now() + std::chrono::microseconds(p.spin_us.load());
    uint64_t w = p.word.load(std::memory_order_acquire);
    int spins = 0;
    while (gen_of(w) == seen) {
      _mm_pause();
      if (++spins % 64 == 0) {
        if (Clock::now() > spin_until) break;
        std::this_thread::yield();  // another process wanting this core gets it
      }
      w = p.word.load(std::memory_order_acquire);
    }
    if (gen_of(w) == seen || index >= p.active.load()) {
      std::unique_lock<std::mutex> lock(p.sleep_mutex);
      p.sleepers.fetch_add(1);
      p.wake.wait(lock, [&] {
        return gen_of(p.word.load()) != seen && index < p.active.load();
      });
      p.sleepers.fetch_sub(1);
      w = p.word.load(std::memory_order_acquire);
    }
    seen = gen_of(w);
    drain(p, seen);
  }
}

}  // namespace

void pool_configure(int64_t threads, int64_t spin_us) {
  Pool& p = pool();
  std::lock_guard<std::mutex> call(p.call_mutex);
  p.spin_us.store(spin_us < 0 ? 0 : spin_us);
  const int helpers = threads > 1 ? static_cast<int>(threads - 1) : 0;
  if (p.owner != getpid()) {  // first use, or a forked child: its helpers are gone
    p.owner = getpid();
    p.started = 0;
  }
  for (; p.started < helpers; ++p.started) std::thread(helper_main, p.started).detach();
  p.active.store(helpers);
  std::lock_guard<std::mutex> lock(p.sleep_mutex);
  p.wake.notify_all();
}

bool pool_configured() { return pool().owner == getpid(); }

int64_t pool_threads() { return pool().active.load() + 1; }
int64_t pool_spin_us() { return pool().spin_us.load(); }

void pool_run(int64_t n, void (*fn)(void* ctx, int64_t chunk), void* ctx) {
  Pool& p = pool();
  const bool parallel = n > 1 && n < (int64_t(1) << 31) && p.active.load() > 0 &&
                        p.owner == getpid() && p.call_mutex.try_lock();
  if (!parallel) {
    for (int64_t i = 0; i < n; ++i) fn(ctx, i);
    return;
  }
  p.fn.store(fn, std::memory_order_relaxed);
  p.ctx.store(ctx, std::memory_order_relaxed);
  p.n.store(n, std::memory_order_relaxed);
  p.done.store(0, std::memory_order_relaxed);
  const uint32_t gen = ++p.generation;
  p.word.store(static_cast<uint64_t>(gen) << 32);  // seq_cst: ordered before the sleepers read
  if (p.sleepers.load() > 0) {
    std::lock_guard<std::mutex> lock(p.sleep_mutex);
    p.wake.notify_all();
  }
  drain(p, gen);
  // Only chunks a helper is running now are left.
  for (int spins = 0; p.done.load(std::memory_order_acquire) < n; ++spins) {
    _mm_pause();
    if (spins % 256 == 255) std::this_thread::yield();
  }
  p.call_mutex.unlock();
}

}  // namespace specdec
