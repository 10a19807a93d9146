import gc, statistics, time, torch, cProfile, pstats
from bench.model import DecodeModel, MixerShape
from bench.target import flashinfer_target
from runner_hooks import ForwardHooks, ForwardInfo, SRSeedPrefetcher
from runner_hooks.prefetch import SeedBatch
dev = torch.device("cuda", 0)
t = flashinfer_target()
m = DecodeModel(MixerShape(), num_layers=40, batch_size=1, gemms=False, device=dev, ssu=t.ssu)
base = torch.zeros(1, dtype=torch.int64, device=dev)
hooks = ForwardHooks()
p = hooks.register(SRSeedPrefetcher(40, dev, sync_plan="current_stream", drawer="kernel"))
pf = p.prefetch
info = ForwardInfo(runs_ssu=True)
cap = torch.cuda.is_current_stream_capturing
raw = torch._C._cuda_getCurrentRawStream
views = pf._eager_buffer.seeds
stream = torch.cuda.current_stream()
def floor(): m.forward(lambda: base)
def floor_cap(): m.forward(lambda: (cap(), base)[1])
def floor_raw(): m.forward(lambda: (raw(0), base)[1])
def ours():
    with hooks.forward(info):
        m.forward(p.next_seed)
def begin_only():
    with hooks.forward(info):
        it = iter(views); m.forward(lambda: next(it))
        p._batch.consumed = 40
def takes_only():
    b = SeedBatch("x", pf._eager_buffer, stream, False)
    m.forward(b.take)
def draw_only():
    pf.drawer.draw(pf._eager_buffer.whole)
    m.forward(lambda: base)
variants = dict(floor=floor, floor_cap=floor_cap, floor_raw=floor_raw, ours=ours, begin_only=begin_only, takes_only=takes_only, draw_only=draw_only)
samples = {k: [] for k in variants}
gc.disable()
for f in variants.values():
    for _ in range(5): f()
torch.cuda.synchronize()
for r in range(300):
    for name, f in variants.items():
        torch.cuda.synchronize()
        t0 = time.perf_counter(); f(); t1 = time.perf_counter()
        samples[name].append((t1 - t0) * 1e6)
for name, xs in samples.items():
    print(f"{name:10s} host us/step median {statistics.median(xs):8.1f}  p10 {sorted(xs)[30]:8.1f}")
for name in ("floor", "ours"):
    pr = cProfile.Profile(); pr.enable()
    for _ in range(200):
        variants[name](); torch.cuda.synchronize()
    pr.disable()
    print("=====", name)
    pstats.Stats(pr).sort_stats("tottime").print_stats(12)
