import os, sys, json
sys.path.insert(0, "benchmarks")
import numpy as np, jax
import pipeline_on_tpu as b
x = np.random.default_rng(0).standard_normal((8192, 1024), np.float32)
res = {}
for impl_name, impl in [("palladium", b.OURS), ("jax", b.JAX)]:
    for outer, inner in [(1024, 256), (64, 16)]:
        key = f"{impl_name}_{outer}_{inner}"
        try:
            t, out = b.timed(f"nested_{key}", b.nested(x.shape, outer, inner, impl), x)
            res[key] = {"us": t * 1e6, "ok": bool(np.array_equal(out, x + 1))}
        except Exception as e:
            res[key] = f"{type(e).__name__}: {str(e)[:300]}"
        print(key, res[key], flush=True)
json.dump(res, open(os.path.join(os.environ["OUT"], "nested.json"), "w"), indent=1)
