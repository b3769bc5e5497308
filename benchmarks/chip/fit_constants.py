"""Derives the performance model's measured constants from the chip's microbenchmarks.

Reads ``benchmarks/results_tpu/calibration.<chip>.json`` (``calibrate_on_chip.py``'s
output; only its ``micro`` group: the held-out kernels and sweeps are never used here)
and writes ``packages/interpret/src/palladium/interpret/perf/measured/<chip>.json``:
every constant with its value, the microbenchmarks it comes from and how::

    python benchmarks/chip/fit_constants.py [--chip v5e]

Each constant is a slope between two sizes of the same microbenchmark (so the fixed
costs of the launch and its copies cancel) or, for latencies, what is left of a
serial time once the bytes' share is taken off.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VREG = 8 * 128  # 32-bit elements of one vreg


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chip", default="v5e")
    ap.add_argument("--out", default=None, help="where to write (default: the package's table)")
    a = ap.parse_args()
    src = ROOT / "benchmarks" / "results_tpu" / f"calibration.{a.chip}.json"
    data = json.loads(src.read_text())
    k = {n: r for n, r in data["kernels"].items() if r.get("group") == "micro"}
    for later in ("calibration2", "calibration3", "calibration5", "calibration6", "calibration8",
                  "calibration9", "calibration10", "calibration13", "calibration15",
                  "calibration19", "calibration20", "calibration23", "calibration25",
                  "calibration27", "calibration28"):
        # the second round's microbenchmarks (reductions, latencies ...) and the third's
        # (dependent and independent dots, a flash step, a page gather), the fourth's
        # (block copies: how many, how big, beside which compute)
        path = src.with_name(f"{later}.{a.chip}.json")
        if path.exists():
            more = json.loads(path.read_text())["kernels"]
            k.update({n: r for n, r in more.items() if r.get("meta", {}).get("kind") != "held"
                      and (r.get("group") == "micro")})
    t = {n: r["seconds"] for n, r in k.items() if r.get("seconds")}
    out: dict[str, dict] = {}

    def put(name: str, value: float, used: list[str], how: str) -> None:
        out[name] = {"value": value, "from": used, "how": how}

    def slope(a_: str, b_: str, da: float) -> float:
        return (t[b_] - t[a_]) / da

    # --- vector unit: seconds per f32 vreg and jaxpr equation -------------------------
    vregs = 512 * 1024 // VREG
    per: dict[str, float] = {}
    for op, eqns in (("add", 1), ("mul", 1), ("max", 3), ("select", 3),
                     ("int_xor_shift", 3)):
        dt = "int32" if op.startswith("int") else "float32"
        n16, n64 = f"vpu/{op}/{dt}/n16", f"vpu/{op}/{dt}/n64"
        per[op] = slope(n16, n64, 48) / vregs / eqns
    put("valu_vreg_seconds", statistics.median(per.values()),
        [f"vpu/{o}/*/n16..n64" for o in per],
        "median over add, mul, max, select and int chains of the slope per op, per (8,128) "
        f"vreg; per chain: { {o: round(v * 1e12, 1) for o, v in per.items()} } ps")
    bf = [slope(f"vpu/{o}/bfloat16/n16", f"vpu/{o}/bfloat16/n64", 48)
          / slope(f"vpu/{o}/float32/n16", f"vpu/{o}/float32/n64", 48) for o in ("add", "mul")]
    put("narrow_valu_factor", statistics.mean(bf),
        ["vpu/add/bfloat16/n16..n64", "vpu/mul/bfloat16/n16..n64"],
        "cost of a bf16 element op relative to the same op on f32 elements (no bf16 VALU: "
        "unpack, op, pack)")

    # transcendentals: slope of the chain minus its VALU ops (add/mul measured above)
    add, mul = per["add"], per["mul"]
    valu_in_chain = {"exp": mul, "tanh": 0.0, "log": add, "sin": 0.0, "logistic": 0.0,
                     "rsqrt": mul + add, "div": add, "sqrt": mul + add}
    ops = {"add": add, "mul": mul}
    for op, rest in valu_in_chain.items():
        if op == "sin":
            # sin: its first two over the copy alone (n0). A chain of sins on sins grows
            # steeper than that (8 take 27.4 ns a vreg, the slope from 2 to 8 28.2; the
            # first two 25.1): a kernel applies one, as in the first two
            ops[op] = slope("vpu/add/float32/n0", "vpu/sin/float32/n2", 2) / vregs
            continue
        s = slope(f"vpu/{op}/float32/n4", f"vpu/{op}/float32/n16", 12) / vregs - rest
        ops[op] = s
    # round 2: reductions (with their broadcast back) and transposes, less their add/mul
    for op, prim, rest, nv in (("lane_max", "reduce_max", mul + add, vregs),
                               ("lane_sum", "reduce_sum", mul + add, vregs),
                               ("transpose", "transpose", mul + add, 512 * 512 // VREG)):
        if f"vpu2/{op}/n4" in t:
            ops[prim] = slope(f"vpu2/{op}/n4", f"vpu2/{op}/n16", 12) / nv - rest
    put("vector_op_vreg_seconds", ops, [f"vpu/{o}/float32/*" for o in ops
                                        if o not in ("reduce_max", "reduce_sum", "transpose")]
        + ["vpu/add/float32/n0"]
        + ["vpu2/lane_max/*", "vpu2/lane_sum/*", "vpu2/transpose/*"],
        "per primitive, seconds per f32 vreg: the chain's slope less its add/mul "
        "(reductions per input vreg, with the broadcast of their result; sin: its first "
        "two sins over the copy alone, n2 less add's n0: a chain of sins grows steeper)")
    ebf = []
    for op, rest_bf in (("tanh", 0.0), ("exp", None)):
        s_bf = slope(f"vpu/{op}/bfloat16/n4", f"vpu/{op}/bfloat16/n16", 12)
        if rest_bf is None:
            s_bf -= slope("vpu/mul/bfloat16/n16", "vpu/mul/bfloat16/n64", 48)
        ebf.append(s_bf / (ops[op] * vregs))
    put("narrow_transcendental_factor", statistics.mean(ebf),
        ["vpu/tanh/bfloat16/n4..n16", "vpu/exp/bfloat16/n4..n16"],
        "cost of a bf16 element's transcendental relative to an f32 element's")
    # round 25: every transcendental in bf16, each its own factor (its chain's slope
    # less the chain's own adds and muls at bf16's measured cost, over its f32 cost;
    # sin as its f32 cost is taken: its first two over the copy alone)
    mul_bf = slope("vpu/mul/bfloat16/n16", "vpu/mul/bfloat16/n64", 48)
    add_bf = slope("vpu/add/bfloat16/n16", "vpu/add/bfloat16/n64", 48)
    around = {"exp": mul_bf, "tanh": 0.0, "log": add_bf, "logistic": 0.0, "div": add_bf,
              "rsqrt": mul_bf + add_bf, "sqrt": mul_bf + add_bf}
    per_op = {}
    for op, rest_bf in around.items():
        pre = "vpu" if op in ("exp", "tanh") else "r25/vpu"
        s_bf = slope(f"{pre}/{op}/bfloat16/n4", f"{pre}/{op}/bfloat16/n16", 12)
        per_op[op] = (s_bf - rest_bf) / (ops[op] * vregs)
    per_op["sin"] = ((t["r25/vpu/sin/bfloat16/n2"] - t["vpu/add/bfloat16/n0"]) / 2
                     / (ops["sin"] * vregs))
    put("narrow_transcendental_factors", per_op,
        ["vpu/{tanh,exp}/bfloat16/n4..n16", "r25/vpu/{log,logistic,div,rsqrt,sqrt}/bfloat16/"
         "n4..n16", "r25/vpu/sin/bfloat16/n2", "vpu/{add,mul}/bfloat16/n16..n64"],
        "per transcendental, the cost of a bf16 element relative to an f32 element's: its "
        "chain's slope less the chain's adds and muls at their bf16 cost (sin: its first "
        "two over the copy alone, as its f32 cost)")

    # --- dependent chains in a loop: per-op latency and per-iteration overhead ---------
    its = {}
    for kk in (1, 4, 16):
        its[kk] = slope(f"loop/k{kk}/steps512/reg", f"loop/k{kk}/steps4096/reg", 3584)
    xs, ys = [2 * kk for kk in its], list(its.values())
    b = _ls_slope(xs, ys)
    a0 = statistics.mean(ys) - b * statistics.mean(xs)
    put("dependent_op_seconds", b, [f"loop/k{kk}/steps512..4096/reg" for kk in its],
        "latency of one dependent vector op: slope of the iteration time over the 2k "
        f"dependent ops of k (mul, add) pairs; iteration times {[round(y * 1e9, 2) for y in ys]} ns")
    put("loop_iteration_seconds", max(a0, 0.0), [f"loop/k{kk}/steps512..4096/reg" for kk in its],
        "the same fit's intercept: a loop iteration's own cost")
    lat = {}
    loop_it = max(a0, 0.0)
    for op, rest in (("exp", b), ("logistic", 0.0), ("div", b), ("tanh", 0.0)):
        if f"loop2/{op}/steps512" in t:
            it = slope(f"loop2/{op}/steps512", f"loop2/{op}/steps4096", 3584)
            lat[op] = it - loop_it - rest
    if lat:
        put("vector_op_latency_seconds", lat, [f"loop2/{o}/steps512..4096" for o in lat],
            "a transcendental's latency: the iteration time of h = f(h) on one vreg less "
            "the loop's own cost and the chain's other op")
    # cross-lane ops on the chain: a column spread over the lanes (h * 0.5 + h[:, :1]),
    # checked by a lane reduction and its broadcast back (h - max(h, -1) * 0.5), and a
    # reduction over sublanes (h - sum(h, 0) * c)
    def per_it(name: str) -> float:
        return slope(f"r3/latency/{name}/steps512", f"r3/latency/{name}/steps4096", 3584)
    xlu = per_it("lane_bcast") - loop_it - b
    put("xlu_latency_seconds", xlu, ["r3/latency/lane_bcast/steps512..4096"],
        "a cross-lane op's latency: the iteration of h = h * 0.5 + h[:, :1] less the loop "
        f"and the add; a lane max and its broadcast back take {per_it('lane_max') * 1e9:.1f} "
        f"ns an iteration, a lane sum {per_it('lane_sum') * 1e9:.1f} (one cross-lane op: "
        "the reduction leaves its result in every lane)")
    put("sublane_reduce_latency_seconds", per_it("sublane_sum") - loop_it - 2 * b,
        ["r3/latency/sublane_sum/steps512..4096"],
        "a reduction over sublanes on the chain: the iteration of h - sum(h, 0) * c less "
        "the loop and its two other ops")
    rows = slope("loop/k1/steps512/rows", "loop/k1/steps4096/rows", 3584) - its[1]
    put("load_use_seconds", rows / 2, ["loop/k1/steps512..4096/rows", "loop/k1/.../reg"],
        "a (8,128) row load and store on the dependent chain, each: half the extra "
        "iteration time of the rows variant")

    # --- VMEM loads / stores --------------------------------------------------------
    full = slope("vmem/full/n16", "vmem/full/n64", 48) / vregs
    put("vmem_vreg_seconds", full / 3, ["vmem/full/n16..n64"],
        "o += x per vreg is 2 loads and 1 store (and an add, in parallel): a third of the "
        "slope per vreg")

    # --- MXU -------------------------------------------------------------------------
    pts = []
    for n, r in k.items():
        m = r["meta"]
        if m.get("kind") != "mxu" or m["dtype"] != "bfloat16" or m["m"] < 128:
            continue
        if m["reps"] != min(r2["meta"]["reps"] for r2 in k.values()
                            if r2["meta"].get("kind") == "mxu"
                            and r2["meta"]["m"] == m["m"] and r2["meta"]["k"] == m["k"]
                            and r2["meta"]["n"] == m["n"]):
            continue
        hi = n.replace(f"/r{m['reps']}", f"/r{4 * m['reps']}")
        per_dot = (t[hi] - t[n]) / (3 * m["reps"])
        pts.append((2 * m["m"] * m["k"] * m["n"], per_dot, n))
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    inv_rate = _ls_slope(xs, ys)
    over = statistics.mean(ys) - inv_rate * statistics.mean(xs)
    put("mxu_bf16_flops", 1 / inv_rate, [p[2] for p in pts],
        "1 / slope of the time per dot over its flops (bf16, M >= 128)")
    # a dot's latency and a weight tile's load, from two dots' iterations: four
    # dependent 128^3 dots (r3/dots/dep: each waits for the last one's result) and an
    # M=8 dot bound by its 16 weight tiles; each iteration also loads, adds, stores
    # and loops (the chain's other costs, fitted above)
    extras = (2 * out["load_use_seconds"]["value"] + out["dependent_op_seconds"]["value"]
              + out["loop_iteration_seconds"]["value"])
    dep = slope("r3/dots/dep/n4/128x128/r64", "r3/dots/dep/n4/128x128/r256", 192)
    small = "mxu/8x512x512/bfloat16/r953"
    per_small = (t[small.replace("r953", "r3812")] - t[small]) / (3 * 953)
    a_ = per_small - extras - 2 * 8 * 512 * 512 * inv_rate  # latency + 16 tiles
    b_ = (dep - extras) / 4 - 2 * 128 ** 3 * inv_rate  # latency + 1 tile
    tile = max((a_ - b_) / 15, 0.0)
    put("mxu_dot_seconds", b_ - tile, ["r3/dots/dep/n4/128x128/r64..r256", small],
        "a dot's latency (fill and drain; the MXU meanwhile takes independent dots): a "
        "dependent 128^3 dot's time less its flops and weight tile, from four in a chain; "
        f"iteration {dep * 1e9:.1f} ns")
    put("mxu_weight_tile_seconds", tile, [small, "r3/dots/dep/n4/128x128/r64..r256"],
        "an M=8 dot is bound by loading its 16 (128,128) weight tiles: its time less its "
        "latency and flops, over the 15 tiles more than a 128^3 dot's")
    hi_r = []
    for shape in ("256x256x256", "512x512x512", "512x128x512"):
        mm, kk_, nn = (int(v) for v in shape.split("x"))
        reps = next(r["meta"]["reps"] for n, r in k.items()
                    if n.startswith(f"mxu/{shape}/float32/highest/"))
        per_dot = (t[f"mxu/{shape}/float32/highest/r{4 * reps}"]
                   - t[f"mxu/{shape}/float32/highest/r{reps}"]) / (3 * reps)
        hi_r.append((per_dot - over) / (2 * mm * kk_ * nn * inv_rate))
    put("f32_highest_passes", statistics.mean(hi_r),
        ["mxu/{256x256x256,512x512x512,512x128x512}/float32/highest"],
        f"time of a precision=HIGHEST f32 dot over the bf16 rate's: {[round(r, 2) for r in hi_r]}")
    # a transposed right operand (q @ k.T): per dot, over the same untransposed, from
    # independent (256, 128) ones (mxu2) and chains of (128, 128) ones (round 14); the
    # chains on (64, 128) blocks show none
    nn = slope("mxu2/256x128x256/f32/nn/r119", "mxu2/256x128x256/f32/nn/r476", 357)
    nt = slope("mxu2/256x128x256/f32/nt/r119", "mxu2/256x128x256/f32/nt/r476", 357)
    per_dot = [nt - nn] + [(t[f"r14/dot-chain/nt/q{q}/k128"]
                            - t[f"r14/dot-chain/nn/q{q}/k128"]) / 256 for q in (1, 8)]
    put("mxu_transposed_rhs_seconds", statistics.mean(per_dot),
        ["mxu2/256x128x256/f32/{nn,nt}", "r14/dot-chain/{nt,nn}/q{1,8}/k{64,128}"],
        "a dot contracting its right operand's last dimension (q @ k.T) over the same dot "
        "untransposed, per dot (the model: per 256 rows begun, from 128 rows on): "
        f"{[round(d * 1e9, 1) for d in per_dot]} ns for (256, 128), "
        "and (128, 128) twice; (64, 128) operands: "
        f"{round((t['r14/dot-chain/nt/q1/k64'] - t['r14/dot-chain/nn/q1/k64']) / 256 * 1e9, 1)} ns")
    i8 = (t["mxu/1024x1024x1024/int8/r16"] - t["mxu/1024x1024x1024/int8/r4"]) / 12
    put("mxu_int8_ops", 2 * 1024 ** 3 / (i8 - over), ["mxu/1024x1024x1024/int8/r4..r16"],
        "int8 x int8 -> int32 rate: 1024^3 dots less the fixed cost")

    # --- HBM and DMAs ----------------------------------------------------------------
    def rate(name: str) -> float:
        m = k[name]["meta"]
        return m["bytes"] * m["chunks"] / t[name]

    reads = [n for n in t if n.startswith("dma/in/") and k[n]["meta"]["bytes"] >= 1 << 20
             and k[n]["meta"]["in_flight"] >= 2]
    put("hbm_read_bytes_per_second", statistics.median(rate(n) for n in reads), reads,
        "HBM -> VMEM DMAs of >= 1 MiB, >= 2 in flight: bytes / time")
    writes = [n for n in t if n.startswith("dma/out/") and k[n]["meta"]["bytes"] >= 1 << 18
              and k[n]["meta"]["in_flight"] >= 4]
    put("hbm_write_bytes_per_second", statistics.median(rate(n) for n in writes), writes,
        "VMEM -> HBM DMAs of >= 256 KiB, 4 in flight")
    copies = [n for n in t if n.startswith("dma/hbm/") and k[n]["meta"]["bytes"] >= 1 << 20
              and k[n]["meta"]["in_flight"] >= 4]
    put("hbm_copy_bytes_per_second", statistics.median(rate(n) for n in copies), copies,
        "HBM -> HBM DMAs of >= 1 MiB, 4 in flight: bytes moved / time")
    bw = {"in": out["hbm_read_bytes_per_second"]["value"],
          "out": out["hbm_write_bytes_per_second"]["value"],
          "hbm": out["hbm_copy_bytes_per_second"]["value"]}
    for d in ("in", "out", "hbm"):
        names = [f"dma/{d}/4096B/k1", f"dma/{d}/16384B/k1"]
        lat = [t[n] / k[n]["meta"]["chunks"] - k[n]["meta"]["bytes"] / bw[d] for n in names]
        put(f"dma_latency_{d}_seconds", statistics.mean(lat), names,
            "one started-then-waited DMA's time less its bytes' share (4 and 16 KiB)")
    # a conditional: two pl.when a grid step (round 9), their bodies run one step in 16
    when = [(t[f"r9/step-forms/grid1d/when/{w}"] - t[f"r9/step-forms/grid1d/plain/{w}"])
            / 4096 / 2 for w in ("add", "dot")]
    put("branch_seconds", statistics.mean(when),
        ["r9/step-forms/grid1d/{when,plain}/{add,dot}"],
        "a conditional's cost on the chain: a grid step with two pl.when (zero the "
        "accumulator at the first of 16 steps, store it at the last) over the same step "
        f"without, per pl.when ({', '.join(f'{w * 1e9:.1f}' for w in when)} ns beside one "
        "vector add and beside a (128, 128) dot)")
    # rounds 18-19: a pl.when around n page DMAs, never taken, in a loop of dependent
    # vector ops (64 iterations a grid step, 64 steps), per iteration over the same loop
    # without it: up to 4 DMAs (20 equations) the compiler predicates the branch, and
    # the core pays its DMA starts' issue untaken, a line in n; 8 DMAs (40 equations) or
    # more are a branch again
    extra = {n: (t[f"r19/cond-dma/notaken/n{n}"] - t["r19/cond-dma/notaken/n0"]) / 4096
             for n in (1, 2, 4, 8)}
    fit = statistics.linear_regression([1, 2, 4], [extra[n] for n in (1, 2, 4)])
    put("predicated_dma_seconds", fit.slope, ["r19/cond-dma/notaken/n0..n4"],
        "a DMA start in a predicated conditional: the slope of a never-taken pl.when "
        "around 1, 2 and 4 page DMAs in a loop, per iteration "
        f"({', '.join(f'{extra[n] * 1e9:.1f}' for n in (1, 2, 4))} ns more than without)")
    put("predicated_seconds", fit.intercept, ["r19/cond-dma/notaken/n0..n4"],
        "a predicated conditional's fixed cost: that line at no DMA")
    first = (t["r18/paged-control/base/pb4"] - t["r18/paged-control/base-first-outside/pb4"]) / 1024
    put("predicated_branch_equations", 36,
        ["r19/cond-dma/notaken/n4,n8", "r18/paged-control/{base,base-first-outside}/pb4"],
        "the most equations a branch that starts DMAs may have and be predicated: between "
        "33 (round 18's paged-attention loop at 4 pages a block, its first block's fetch under "
        f"a pl.when in the loop as jax has it: {first * 1e9:.0f} ns a block more than before "
        "the loop, as a predicated 8 DMAs would cost: "
        f"{(fit.intercept + 8 * fit.slope) * 1e9:.0f}) "
        f"and 40 (round 19's 8 DMAs: {extra[8] * 1e9:.1f} ns, a branch)")
    # a pipeline's copies of blocks that are pieces of their arrays (round 8): two blocks
    # a step, (rows, 128) tiles of 2048-wide arrays against contiguous ones, per copy
    strided = [(t[f"r8/copy-forms/grid1d-strided/b{r}"] - t[f"r8/copy-forms/grid1d-contig/b{r}"])
               / 4096 / 2 for r in (128, 256)]
    put("strided_copy_seconds", statistics.mean(strided),
        ["r8/copy-forms/grid1d-{strided,contig}/b128,b256"],
        "a strided block copy's DMA-engine time more than a contiguous one's: two f32 "
        "blocks a step, (128, 128) and (256, 128) pieces of 2048-wide arrays against "
        f"whole rows of 128-wide ones, per copy ({', '.join(f'{x * 1e9:.1f}' for x in strided)} ns)")
    # DMAs between on-core memories (VMEM -> VMEM, round 7): the rate from the two
    # biggest, one in flight (1 and 4 MiB), the latency from the smallest (16 KiB)
    big = ["r7/dma-local/1048576B/k1", "r7/dma-local/4194304B/k1"]
    per_chunk = {n: t[n] / k[n]["meta"]["chunks"] for n in t if n.startswith("r7/dma-local/")}
    local_bw = ((k[big[1]]["meta"]["bytes"] - k[big[0]]["meta"]["bytes"])
                / (per_chunk[big[1]] - per_chunk[big[0]]))
    put("local_dma_bytes_per_second", local_bw, big,
        "VMEM -> VMEM DMAs, one in flight: bytes over time between 1 and 4 MiB")
    small = "r7/dma-local/16384B/k1"
    put("dma_latency_local_seconds", per_chunk[small] - 16384 / local_bw, [small],
        "one started-then-waited 16 KiB VMEM -> VMEM DMA less its bytes' share "
        f"({ {n.split('/')[2] + '/' + n.split('/')[3]: round(v * 1e9, 1) for n, v in sorted(per_chunk.items())} } ns "
        "a copy; 64 KiB copies are slower than 256 KiB ones on the chip)")
    # (the body, a load, an add and a store on one vreg, is a chain the model counts
    # apart: taken off)
    body = (2 * out["load_use_seconds"]["value"] + out["dependent_op_seconds"]["value"])
    # each blocked operand costs a grid step its index map and block check: the step
    # time over 1, 3 and 6 revisited inputs (least squares), less each input's load and
    # add in the body (the adds one dependent chain: an add's latency each)
    counts = (1, 3, 6)
    per_step = [slope(f"r3/grid-operands/in{n}/s256", f"r3/grid-operands/in{n}/s4096", 3840)
                for n in counts]
    operand = (_ls_slope(list(counts), per_step) - out["vmem_vreg_seconds"]["value"]
               - out["dependent_op_seconds"]["value"])
    put("operand_step_seconds", operand, ["r3/grid-operands/in{1,3,6}/s256..s4096"],
        "per grid step and blocked operand: the step time's slope over 1, 3 and 6 "
        f"revisited (8, 128) inputs ({', '.join(f'{x * 1e9:.1f}' for x in per_step)} ns a "
        "step), less an input's load and its add's latency in the body (one chain)")
    # ... and an index map that computes its block index (from the grid) costs more: the
    # block index compared with the last step's (round 12: two inputs whose maps come to
    # block 0 through a min, against three constant ones, r3/grid-operands/in3)
    dynamic = (slope("r12/index-map/ops0/s256", "r12/index-map/ops0/s4096", 3840)
               - slope("r3/grid-operands/in3/s256", "r3/grid-operands/in3/s4096", 3840)
               + operand) / 2
    put("dynamic_operand_step_seconds", dynamic,
        ["r12/index-map/ops0/s256..s4096", "r3/grid-operands/in3/s256..s4096"],
        "per grid step, an operand whose index map computes its block index: two such "
        "inputs (min(i, 0): the same block every step) against three constant ones and "
        "one operand fewer, per operand (r12's maps of 9 and 33 ops took 31 and 71 ns a "
        "step against 41 for 1 op: the compiler's doing, not a per-op cost)")
    step = slope("grid/revisit/s256", "grid/revisit/s4096", 3840) - body - 2 * operand
    put("step_overhead_seconds", step, ["grid/revisit/s256..s4096"],
        "per grid step, no block copied (the same block every step), less its body's chain "
        "(a load, an add, a store) and its two operands' share (operand_step_seconds)")
    # a grid pipeline's block copies are DMAs with the latencies above, two in flight an
    # operand (the next step's are fetched before this step's are waited for), each
    # issued by the core: per (128, 128) bf16 block more in a step, less half its bytes
    # (two steps' copies share a latency; their bytes flow one step's after the other's)
    per_copy = (t["r4/copies/bfloat16/in4/s1024"] - t["r4/copies/bfloat16/in1/s1024"]) / (3 * 1024)
    put("block_copy_issue_seconds",
        max(per_copy - 128 * 128 * 2 / bw["in"] / 2 - operand - dynamic, 0.0),
        ["r4/copies/bfloat16/in1..in4/s1024"],
        "the core's time to issue one block copy: the step time per (128, 128) bf16 block "
        f"more ({per_copy * 1e9:.1f} ns), less half its bytes (two steps' copies in flight) "
        "and its operand's share of the step (operand_step_seconds, "
        "dynamic_operand_step_seconds: its index map is (i, 0))")

    # a kernel's own DMAs started one by one in a loop (paged attention's page gather):
    # per page beyond the same loop with 4 pages, its bytes flowing meanwhile
    # a kernel's own DMAs started one after the other (paged attention's page gather,
    # as jax writes it: the starts and the waits unrolled): the time per page over 4 to
    # 16 pages a step, for 8 KiB (f32) and 4 KiB (bf16) pages
    per_page = {dt: statistics.mean((t[f"r3/page-gather-unrolled/{dt}/p16/s{st}"]
                                     - t[f"r3/page-gather-unrolled/{dt}/p4/s{st}"]) / (12 * st)
                                    for st in (64, 256)) for dt in ("float32", "bfloat16")}
    put("dma_min_seconds", statistics.mean(per_page.values()),
        ["r3/page-gather-unrolled/{float32,bfloat16}/p4..p16/s64,s256"],
        "the least time a kernel's own DMA holds the DMA engine: the time per page of a "
        "page gather (one DMA per page, its index read from SMEM, starts and waits "
        "unrolled as jax's paged attention has them), "
        f"{ {d: round(v * 1e9, 1) for d, v in per_page.items()} } ns for 8 and 4 KiB pages "
        "whose bytes alone take 11 and 5.5 ns (a 64 KiB DMA's bytes hide it: dma/in/65536B/k8 "
        "runs at the read rate)")

    # round 26: bursts of 32 and 64 page DMAs: from the 16th DMA of a burst on, each
    # holds the engine less (p32 -> p64 per page, 8 KiB f32 pages whose bytes take 11 ns)
    deep = statistics.mean((t[f"r26/page-gather-unrolled/float32/p64/s{st}"]
                            - t[f"r26/page-gather-unrolled/float32/p32/s{st}"]) / (32 * st)
                           for st in (64, 256))
    put("dma_min_deep_seconds", deep, ["r26/page-gather-unrolled/float32/p32..p64/s64,s256"],
        "the least time a kernel's DMA holds the DMA engine from the 16th of a burst on (the "
        "DMAs the core started together): the time per page of a page gather from 32 to 64 "
        "pages a step (up to 16 pages: dma_min_seconds)")
    put("dma_burst_depth", 16, ["r3/page-gather-unrolled/float32/p4..p16/s64,s256",
                                "r26/page-gather-unrolled/float32/p32..p64/s64,s256",
                                "r26/page-gather-two/float32/p8..p64/s256"],
        "chosen: the DMAs of a burst that hold the engine dma_min_seconds each; per page "
        "24 ns from 4 to 16 pages, 14.7 from 16 to 32 and 13.7 from 32 to 64 (one array or "
        "two alike)")

    n = "grid/copy/s512/b256x1024"
    blk = 256 * 1024 * 4
    alone = 512 * blk * (1 / bw["in"] + 1 / bw["out"])
    put("hbm_mixed_factor", t[n] / alone, [n, *reads, *writes],
        "a pipeline of 1 MiB blocks in and out (HBM-bound): its time over the same bytes "
        "read and written one after the other at the measured rates")

    # round 5: a step's input and output block copies, alone and together. Up to the
    # largest size whose pair overlaps (takes under 0.85 of the two apart) they mix;
    # above it an input copy waits for the output copy issued before it
    sizes = (8, 32, 64, 128)
    pair = {kb: t[f"r5/in-out/in1out1/{kb}k/s1024"]
            / (t[f"r5/in-out/in1out0/{kb}k/s1024"] + t[f"r5/in-out/in0out1/{kb}k/s1024"])
            for kb in sizes}
    first = next(kb for kb in sizes if pair[kb] >= 0.85)
    put("mixed_copy_limit_bytes", max(kb for kb in sizes if kb < first) * 1024,
        [f"r5/in-out/in{i}out{o}/{{8,32,64,128}}k/s1024" for i, o in ((1, 0), (0, 1), (1, 1))],
        "the largest block size whose input and output copies in one step overlap: the "
        "pair's time over the two apart, "
        f"{ {f'{kb} KiB': round(v, 2) for kb, v in pair.items()} }")

    # round 24: k and v mapped through a scalar-prefetch table (splash's data_next[h, i,
    # j]) against from the grid indices, the same blocks every step: per step and operand
    table = (t["r24/kv-maps/table-same"] - t["r24/kv-maps/grid-same"]) / 512 / 2
    put("table_operand_step_seconds", table, ["r24/kv-maps/{table,grid}-same"],
        "an operand whose index map reads a scalar-prefetch table (SMEM) for its block, "
        "more than one that computes it from the grid: two such operands over a (2, 16, "
        "16) grid, the same blocks every step, per step and operand")

    # round 3: a flash step's p @ v over its softmax alone, per step: at 128-blocks p is
    # (128, 128) f32, 16 vregs, and the dot streams its rows as the softmax makes them;
    # at 256-blocks p is 64 vregs and the dot follows the softmax whole
    pv = {b: (t[f"r3/flash-step/full/b{b}/s1024"] - t[f"r3/flash-step/softmax/b{b}/s1024"])
          / 1024 for b in (128, 256)}
    put("spill_vregs", 64,
        ["r3/flash-step/{softmax,full}/b128,b256/s1024", "r3/dots/dep/n4/256x256/r256",
         "r4/overlap-mxu/{n16,n32}/{s16,s64}"],
        "the size from which a value vector ops made is kept in VMEM whole, so that a dot "
        "taking it as its left operand waits for all of it: a flash step's p @ v costs "
        f"{pv[128] * 1e9:.0f} ns beside the softmax at 128-blocks (p: 16 vregs, streamed) "
        f"and {pv[256] * 1e9:.0f} ns at 256-blocks (64 vregs); a dot's 64-vreg result feeding "
        "the next dot streams (r3/dots, r4/overlap-mxu: with the rule on it, +8% -> +37% and "
        "-2% -> +30%). 32 predicts every held-out kernel as 64 does")

    # the fixed part of a pipeline whose blocks move: round 22's copy pipelines over 2 to
    # 16 steps take the model's per-step time within 2.5% and 0.3-0.6 us more. The
    # model's prologue and epilogue lie outside the pipeline (before its first copy,
    # after its last), so they add exactly twice the constant: the model without them
    # is the installed table's prediction less twice its constant. (The other constants
    # are the installed table's too: after one of them changes, run this twice.)
    excess = _launch_excess({n: r.get("kernel_seconds") or r["seconds"] for n, r in k.items()
                             if r.get("seconds")}, a.chip)
    put("launch_overhead_seconds", round(statistics.median(excess.values()) / 2, 12),
        ["r22/copy/{float32,bfloat16}/steps2..steps16"],
        "half the median of what a pipelined copy of (128, 1024) blocks over 2 to 16 steps "
        "takes on the chip beyond the model's prediction without it (prologue and "
        "epilogue, before the first block copy and after the last): "
        f"{ {n.split('/', 2)[2]: round(v * 1e6, 2) for n, v in excess.items()} } us")

    doc = {"chip": data["chip"], "jax": data["jax"], "libtpu": data["libtpu"],
           "measured": data["date"], "script": data["script"],
           "fitted_by": "benchmarks/chip/fit_constants.py", "constants": out}
    dst = (ROOT / "packages" / "interpret" / "src" / "palladium" / "interpret" / "perf"
           / "measured" / f"{a.chip}.json")
    if a.out:
        dst = Path(a.out)
    dst.parent.mkdir(exist_ok=True)
    dst.write_text(json.dumps(doc, indent=1) + "\n")
    for name, c in out.items():
        v = c["value"]
        print(f"{name:32s} {v if isinstance(v, dict) else f'{v:.4g}'}")
    print(f"written to {dst}")


def _launch_excess(t: dict[str, float], chip: str) -> dict[str, float]:
    """Per round-22 copy pipeline: the chip's time (the kernel's own, as model_check.py
    compares) less the model's without a launch constant (the installed table's
    prediction less twice its constant)."""
    import sys
    import warnings

    sys.path.insert(0, str(ROOT / "benchmarks" / "chip"))
    import calibration_kernels as ck  # (jax and palladium: only this constant needs them)

    import palladium.interpret as pi
    from palladium.interpret.perf import chip_model

    launch = chip_model(chip).launch_overhead_s
    excess = {}
    for dt in ("float32", "bfloat16"):
        for steps in (2, 4, 8, 16):
            name = f"r22/copy/{dt}/steps{steps}"
            fn, args = ck.ENTRIES[name].make()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                p = pi.predict(fn, *args, chip=chip, compile_check="off")
            excess[name] = t[name] - (p.predicted_seconds - 2 * launch)
    return excess


def _ls_slope(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.mean(xs), statistics.mean(ys)
    return (sum((x - mx) * (y - my) for x, y in zip(xs, ys))
            / sum((x - mx) ** 2 for x in xs))


if __name__ == "__main__":
    main()
