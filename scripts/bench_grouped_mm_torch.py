#!/usr/bin/env python3
"""Peer benchmark for `CudaPerf.GroupedGemm` (src/kernels/cuda/moe_kernel_test.cc): the same
Qwen3-30B-A3B expert shapes (E 128, H 2048, I 768, k 8, uniform routing with exactly `tpe`
rows per expert) through torch._grouped_mm (bf16, the offsets-based 2D x 3D form of torch
2.8+), CUDA-event timed (median of repeats), printed as the same table.

usage: /opt/torch/.venv/bin/python scripts/bench_grouped_mm_torch.py [--tpe 1 4 16 64 512 2048]

Columns as in the C++ test: the GEMM's time, TFLOP/s, weight GB/s, and "roof", the time the
limits (788 TFLOP/s bf16, 4.28 TB/s HBM copy; src/kernels/cuda/notes/history.md, v2) allow for
its FLOPs or bytes over the measured time. Differences from our kernels: torch's gate_up writes
[rows, 2I] bf16 and the SiLU-mul is a separate op; its down writes f32 when out_dtype=float32 is
accepted, else bf16 (the line says which); its A rows are pre-gathered (our gate_up gathers x
through perm_token). "MoeExperts" is gather + gate_up + SiLU-mul + down + weighted combine
(index_add_) in torch ops.
"""
import argparse
import sys

PEAK_FLOPS, PEAK_BYTES = 788e12, 4.28e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tpe", type=int, nargs="+", default=[1, 4, 16, 64, 512, 2048])
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--topk", type=int, default=8)
    args = ap.parse_args()

    try:
        import torch
    except ImportError:
        print("torch grouped mm: torch is not installed in this interpreter "
              "(on the GPU machine: /opt/torch/.venv/bin/python)")
        return 2
    if not torch.cuda.is_available():
        print(f"torch grouped mm: torch {torch.__version__} sees no CUDA device")
        return 2
    grouped_mm = getattr(torch, "_grouped_mm", None)
    if grouped_mm is None:
        print(f"torch grouped mm: torch {torch.__version__} has no torch._grouped_mm "
              "(the offsets-based grouped GEMM arrived in torch 2.8); nothing to compare")
        return 2

    dev = torch.device("cuda")
    E, H, I, k = args.experts, args.hidden, args.inter, args.topk
    torch.manual_seed(0)
    w_gate_up = (torch.rand(E, 2 * I, H, device=dev) * 2 - 1).mul_(H ** -0.5).to(torch.bfloat16)
    w_down = (torch.rand(E, H, I, device=dev) * 2 - 1).mul_(I ** -0.5).to(torch.bfloat16)
    # torch._grouped_mm(a [M, K], b [G, K, N], offs) with b column-major: our [G, N, K] weights
    # transposed (a view, no copy).
    b_gate_up, b_down = w_gate_up.transpose(-2, -1), w_down.transpose(-2, -1)

    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def median_us(fn, reps):
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) * 1e3)
        times.sort()
        return times[len(times) // 2]

    def stats(us, flops, wbytes, nbytes):
        roof = max(flops / PEAK_FLOPS, nbytes / PEAK_BYTES) * 1e6 / us
        return f"{us:8.1f} {flops / us / 1e6:7.1f} {wbytes / us / 1e3:6.0f} {100 * roof:4.0f}%"

    print(f"torch grouped mm: torch {torch.__version__}, {torch.cuda.get_device_name()}; E {E} H {H} I {I} k {k}, "
          f"uniform routing; limits {PEAK_FLOPS / 1e12:.0f} TFLOP/s, {PEAK_BYTES / 1e12:.2f} TB/s")
    print(f"torch grouped mm: {'tpe':>5} {'tokens':>6} | {'gate_up us TFLOP/s wGB/s roof':<30} | "
          f"{'down us TFLOP/s wGB/s roof':<30}")
    down_dtype = None
    for tpe in args.tpe:
        rows, reps = E * tpe, 10 if tpe >= 512 else 30
        tokens = rows // k
        # Pair i = t k + s goes to expert i % E; the j-th row of expert e is pair j E + e.
        offs = torch.arange(1, E + 1, device=dev, dtype=torch.int32) * tpe
        j = torch.arange(tpe, device=dev).repeat(E)
        e = torch.arange(E, device=dev).repeat_interleave(tpe)
        perm_token = (j * E + e) // k
        x = torch.rand(tokens, H, device=dev).to(torch.bfloat16)
        a = x[perm_token]
        act = torch.rand(rows, I, device=dev).to(torch.bfloat16)
        weights = torch.full((rows,), 1.0 / k, device=dev)

        gu_flops, down_flops = 2.0 * rows * 2 * I * H, 2.0 * rows * H * I
        gu_wbytes, down_wbytes = 2.0 * E * 2 * I * H, 2.0 * E * H * I
        gu_bytes = gu_wbytes + 2.0 * rows * H + 2.0 * rows * 2 * I
        try:
            gu_us = median_us(lambda: grouped_mm(a, b_gate_up, offs=offs), reps)
            if down_dtype is None:  # f32 out as ours where this torch accepts it
                try:
                    grouped_mm(act, b_down, offs=offs, out_dtype=torch.float32)
                    down_dtype = torch.float32
                except (RuntimeError, TypeError):
                    down_dtype = torch.bfloat16
            down_us = median_us(lambda: grouped_mm(act, b_down, offs=offs, out_dtype=down_dtype), reps)
        except RuntimeError as err:
            print(f"torch grouped mm: {tpe:5d} {tokens:6d} | failed: {str(err).splitlines()[0]}")
            continue
        down_bytes = down_wbytes + 2.0 * rows * I + (4.0 if down_dtype == torch.float32 else 2.0) * rows * H
        print(f"torch grouped mm: {tpe:5d} {tokens:6d} | {stats(gu_us, gu_flops, gu_wbytes, gu_bytes)} | "
              f"{stats(down_us, down_flops, down_wbytes, down_bytes)}  (down out {str(down_dtype).split('.')[-1]})")

        def moe():
            h = grouped_mm(x[perm_token], b_gate_up, offs=offs)
            g, u = h[:, :I], h[:, I:]
            y = grouped_mm(torch.nn.functional.silu(g) * u, b_down, offs=offs, out_dtype=down_dtype)
            out = torch.zeros(tokens, H, device=dev, dtype=torch.float32)
            out.index_add_(0, perm_token, y.float() * weights[:, None])
            return out.to(torch.bfloat16)

        us = median_us(moe, reps)
        op_wbytes = gu_wbytes + down_wbytes
        print(f"torch grouped mm: {tpe:5d} {tokens:6d} MoeExperts {'torch ops':<16} {us:9.1f} us "
              f"{(gu_flops + down_flops) / us / 1e6:7.1f} TFLOP/s {op_wbytes / us / 1e3:6.0f} weight GB/s "
              f"({100 * op_wbytes * 1e6 / us / PEAK_BYTES:.0f}% of {PEAK_BYTES / 1e12:.2f} TB/s)")
        del x, a, act, weights, perm_token
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
