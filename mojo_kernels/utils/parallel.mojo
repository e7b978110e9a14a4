# How the CPU kernels spread their work over threads. A kernel describes its work as a ChunkTask (independent
# items 0..n-1: rows, tokens, chunks); a Runner chooses the threads that run the items.
#   MojoThreads: Mojo's runtime, what a MAX graph uses; its workers are awake during a graph.
#   OpenMP: the OpenMP runtime of the calling process (torch's, for bindings/eager_cpu.mojo): its workers spin
#     for a while after each parallel region, so calls from torch do not wait for sleeping threads to wake up
#     (hundreds of µs on a VM), and torch's ops and ours share one pool instead of competing for the cores.
from max.runtime.asyncrt import parallelism_level
from std.runtime._asyncrt import TaskGroup
from std.atomic import Atomic, Ordering
from std.utils.numerics import FlushDenormals
from max.gpu.host import DeviceContext
from max.gpu.host.device_context import DeviceContextBase
from std.sys import CompilationTarget

comptime _VoidPtr = OpaquePointer[MutAnyOrigin]
comptime _OmpBody = def(_VoidPtr) abi("C") thin -> None
comptime _GompParallel = def(_OmpBody, _VoidPtr, UInt32, UInt32) abi("C") thin -> None
"""libgomp's `GOMP_parallel(fn, data, num_threads, flags)`, the entry point of `#pragma omp parallel` (LLVM's
and Intel's OpenMP runtimes export it too). num_threads 0: the calling thread's OpenMP default, which
torch.set_num_threads sets."""
comptime _OmpInt = def() abi("C") thin -> Int32
"""omp_get_thread_num / omp_get_num_threads."""


trait ChunkTask(ImplicitlyCopyable, Movable, Deinitable):
    def run(self, item: Int):
        ...


trait Runner:
    def run[T: ChunkTask](self, task: T, items: Int, serial: Bool):
        """Runs task.run(i) for every i in [0, items): on this thread alone when `serial`."""
        ...


def _on_this_thread[T: ChunkTask](task: T, items: Int):
    for i in range(items):
        task.run(i)


comptime STEAL_GRAIN = 4
"""Items a worker takes from its own range at a time: the granularity of stealing."""
comptime CpuContext = DeviceContextBase[CompilationTarget()]
"""A graph op's DeviceContext on the CPU."""


@always_inline
def _range_at(base: Int, w: Int) -> Pointer[Atomic[Int64], MutAnyOrigin]:
    """Worker w's range of items, front << 32 | back, on a cache line of its own."""
    return Pointer[Atomic[Int64], MutAnyOrigin](unsafe_from_address=base + 64 * w)


def claim_next(counter: Int) -> Int:
    """The next of items 0, 1, 2, ... that workers take in turn from a shared counter: the address of a zeroed Int64
    on a cache line of its own (a closure's capture of a List would copy it)."""
    return Int(_range_at(counter, 0)[].fetch_add(1))


def _items_left(state: Int64) -> Int:
    return Int(state & 0xFFFFFFFF) - Int(state >> 32)


def fork_join[F: def(Int) -> None](body: F, workers: Int):
    """Runs body(0) .. body(workers - 1) at once and returns when all are done: body(0) on this thread, the others
    as tasks of Mojo's runtime (TaskGroup, what `parallelize` was built on). `parallelize(..., ctx)` goes through
    the op's DeviceContext queue: there every body, the caller's too, started ~16 µs late (p90 65 µs), and a
    one-row decode step runs ~140 such ops."""

    @always_inline
    def flushed(w: Int) {imm body}:
        with FlushDenormals():  # as `parallelize` runs its tasks
            body(w)

    @always_inline
    __async def task(w: Int) {imm flushed}:
        flushed(w)

    var others = TaskGroup()
    for w in range(1, workers):
        others.create_task(task(w))
    flushed(0)
    others.wait()


struct MojoThreads(Runner):
    var ctx: Optional[CpuContext]
    """The op's context, which tells how many workers its runtime has."""

    def __init__(out self):
        self.ctx = None

    def __init__(out self, ctx: DeviceContext):
        self.ctx = rebind[CpuContext](ctx)

    def run[T: ChunkTask](self, task: T, items: Int, serial: Bool):
        """Worker w owns the w-th contiguous range of the items and runs it in order, STEAL_GRAIN items per claim:
        one stream through memory per worker, as in one op over all the bytes. A worker done with its range takes
        the back half of the range with the most items left, so one slowed down (by the previous op, or another
        process) ends up with fewer. Chunks handed out in turn made every worker start a new stream per chunk and
        wait for the last one: the model's bfloat16 batch-1 forward took 1.07x the time."""
        if serial or items == 1:
            _on_this_thread(task, items)
            return
        var workers = min(parallelism_level(self.ctx), items)
        var ranges = List[Int64](length=8 * workers, fill=0)
        for w in range(workers):
            ranges[8 * w] = (Int64(w * items // workers) << 32) | Int64((w + 1) * items // workers)
        var base = Int(ranges.unsafe_ptr())

        def worker(w: Int) {var task, var base, var workers}:
            var mine = _range_at(base, w)
            while True:
                var state = mine[].load[ordering=Ordering.ACQUIRE]()
                var front = Int(state >> 32)
                if _items_left(state) > 0:
                    var take = min(STEAL_GRAIN, _items_left(state))
                    if mine[].compare_exchange(state, state + (Int64(take) << 32)):
                        for i in range(front, front + take):
                            task.run(i)
                    continue
                var victim, most = -1, 0
                for v in range(workers):
                    var left = _items_left(_range_at(base, v)[].load[ordering=Ordering.ACQUIRE]())
                    if left > most:
                        victim, most = v, left
                if victim < 0:
                    return
                var theirs = _range_at(base, victim)
                var seen = theirs[].load[ordering=Ordering.ACQUIRE]()
                var back = Int(seen & 0xFFFFFFFF)
                var half = (_items_left(seen) + 1) // 2
                if half > 0 and theirs[].compare_exchange(seen, seen - Int64(half)):
                    # nobody steals from an empty range, so this store races with no one
                    mine[].store[ordering=Ordering.RELEASE]((Int64(back - half) << 32) | Int64(back))

        fork_join(worker, workers)
        _ = ranges^


struct OnThisThread(Runner):
    """Every item on the calling thread: a kernel run inside another kernel's item."""

    def __init__(out self):
        pass

    def run[T: ChunkTask](self, task: T, items: Int, serial: Bool):
        _on_this_thread(task, items)


struct OpenMPEntryPoints:
    """The OpenMP runtime's functions the runner calls: three addresses in a row in memory
    (bindings/library.py openmp_entry_points)."""

    var gomp_parallel: _GompParallel
    var thread_num: _OmpInt
    var num_threads: _OmpInt


struct _OmpJob[T: ChunkTask]:
    var task: Self.T
    var items: Int
    var openmp: Pointer[OpenMPEntryPoints, MutUntrackedOrigin]

    def __init__(out self, task: Self.T, items: Int, openmp: Pointer[OpenMPEntryPoints, MutUntrackedOrigin]):
        self.task = task
        self.items = items
        self.openmp = openmp


def _omp_body[T: ChunkTask](data: _VoidPtr) abi("C"):
    """Thread t of the team's T runs the t-th of T contiguous ranges of items, as torch's at::parallel_for
    does: one stream through memory per thread (handing out 16K-element chunks in turn was 10% slower)."""
    var job = data.unsafe_bitcast[_OmpJob[T]]()
    var t = Int(job[].openmp[].thread_num())
    var threads = Int(job[].openmp[].num_threads())
    var items = job[].items
    for i in range(t * items // threads, (t + 1) * items // threads):
        job[].task.run(i)


struct OpenMP(Runner):
    var entry_points: Int
    """The address of the process's OpenMPEntryPoints (bindings/library.py finds them); 0: none, use MojoThreads."""

    def __init__(out self, entry_points: Int):
        self.entry_points = entry_points

    def run[T: ChunkTask](self, task: T, items: Int, serial: Bool):
        if self.entry_points == 0:
            MojoThreads().run(task, items, serial)
        elif serial or items == 1:
            _on_this_thread(task, items)
        else:
            var openmp = Pointer[OpenMPEntryPoints, MutUntrackedOrigin](unsafe_from_address=self.entry_points)
            var job = _OmpJob[T](task, items, openmp)
            var body: _OmpBody = _omp_body[T]
            openmp[].gomp_parallel(body, Pointer(to=job).unsafe_bitcast[NoneType]().unsafe_origin_cast[MutAnyOrigin](), 0, 0)
            _ = job^  # GOMP_parallel returns when every thread is done with it
