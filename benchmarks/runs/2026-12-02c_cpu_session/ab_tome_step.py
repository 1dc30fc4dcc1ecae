import time, torch, statistics, sys
from amvim_mm.analysis import benchmark as B
from amvim_mm.models.reduction.reducers import ToMe
torch.set_num_threads(2); torch.manual_seed(0)
x = torch.randn(int(sys.argv[2]) if len(sys.argv) > 2 else 1, 3, 224, 224)
full = B.build('vim-t', 224, head=True, device='cpu').eval()
tome = B.build('vim-t', 224, head=True, token_reduction=dict(type='ToMe', ratio=0.46), device='cpu').eval()
fits = ToMe._cpu_step_fits
def old(self, *a): return False
cases = {'full': (full, fits), 'tome_new': (tome, fits), 'tome_old': (tome, old)}
res = {k: [] for k in cases}
with torch.no_grad():
    for rep in range(int(sys.argv[1]) if len(sys.argv) > 1 else 15):
        for k, (m, f) in cases.items():
            ToMe._cpu_step_fits = f
            m(x)
            t = time.perf_counter()
            for _ in range(3): m(x)
            res[k].append((time.perf_counter() - t) / 3)
med = {k: statistics.median(v) * 1e3 for k, v in res.items()}
print({k: round(v, 2) for k, v in med.items()}, 'ratio new', round(med['full'] / med['tome_new'] / 1.833, 3), 'old', round(med['full'] / med['tome_old'] / 1.833, 3))
