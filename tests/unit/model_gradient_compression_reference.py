"""PyTorch's own powerSGD_hook (torch.distributed.algorithms.ddp_comm_hooks), the reference for
model::GradientCompressor's PowerSGD (tests/unit/model_gradient_compression_test.cc): two gloo
processes feed the hook each rank's gradient bucket, step by step, starting from the same Q as the
compressor (given before orthogonalisation), and write what the hook computes.

Usage: model_gradient_compression_reference.py DIR RANK STEPS ROWS COLS [ROWS COLS ...]
(COLS 0: a vector of ROWS elements). Reads DIR/torch_in_<rank>_<step>.bin and
DIR/torch_initial_q.bin (float32); writes DIR/torch_out_, torch_q_ and torch_error_<rank>_<step>.bin:
the hook's output (the average over ranks), its Q memory and its error after each step.
"""
import math
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ph


class Bucket:
    """What powerSGD_hook reads of a dist.GradBucket, which Python cannot construct."""

    def __init__(self, buffer, shapes):
        self._buffer = buffer
        self._gradients = []
        at = 0
        for shape in shapes:
            n = math.prod(shape)
            self._gradients.append(buffer[at:at + n].view(shape))
            at += n
        assert at == buffer.numel(), (at, buffer.numel())

    def buffer(self):
        return self._buffer

    def gradients(self):
        return self._gradients

    def index(self):
        return 0

    def is_last(self):
        return True


def write(path, tensor):
    tensor.detach().contiguous().numpy().astype(np.float32).tofile(path)


def run(rank, directory, approximation_rank, steps, shapes):
    dist.init_process_group("gloo", init_method="file://" + directory + "/torch_store",
                            rank=rank, world_size=2)
    state = ph.PowerSGDState(process_group=None, matrix_approximation_rank=approximation_rank,
                             start_powerSGD_iter=2, min_compression_rate=2,
                             use_error_feedback=True, warm_start=True,
                             orthogonalization_epsilon=0)
    # Compress from the first call (the hook counts iterations to defer compression).
    state.iter = state.start_powerSGD_iter
    # With P and Q memory present, the hook treats Q as warm: it orthogonalises it and goes on,
    # exactly what the compressor does with the Q it draws from its seed.
    total_p = 0
    for shape in shapes:
        rows, cols = shape[0], math.prod(shape[1:]) if len(shape) > 1 else 1
        r = min(rows, cols, approximation_rank)
        if ph._should_compress(rows, cols, r, state.min_compression_rate)[0]:
            total_p += rows * r
    initial_q = np.fromfile(directory + "/torch_initial_q.bin", dtype=np.float32)
    state.q_memory_dict[0] = torch.from_numpy(initial_q.copy())
    state.p_memory_dict[0] = torch.empty(total_p)
    for step in range(steps):
        name = "%s_%d_%d.bin" % ("%s", rank, step)
        grad = np.fromfile(directory + "/" + name % "torch_in", dtype=np.float32)
        out = ph.powerSGD_hook(state, Bucket(torch.from_numpy(grad.copy()), shapes)).wait()
        write(directory + "/" + name % "torch_out", out)
        write(directory + "/" + name % "torch_q", state.q_memory_dict[0])
        write(directory + "/" + name % "torch_error", state.error_dict[0])
    # Neither rank tears gloo down while the other may still be in a collective: that aborts
    # ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


def main():
    directory, approximation_rank, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    dims = [int(v) for v in sys.argv[4:]]
    shapes = [(rows,) if cols == 0 else (rows, cols) for rows, cols in zip(dims[::2], dims[1::2])]
    mp.spawn(run, args=(directory, approximation_rank, steps, shapes), nprocs=2, join=True)


if __name__ == "__main__":
    main()
