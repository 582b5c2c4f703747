"""batch-norm-training, batch-norm-inference, batch-norm-grad (the Operation Semantics formulas).

Statistics are taken over every dimension but `feature_index`; the 1-D per-feature operands
broadcast along it. Floats narrower than f32 are computed in f32 and rounded once at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from replicas.hlo.ir import Instruction
from replicas.ops.elementwise_util import quiet
from replicas.ops.registry import KernelContext, kernel
from replicas.shapes import Shape


def _work_dtype(dtype: np.dtype) -> np.dtype:
    return dtype if dtype == np.float64 else np.dtype(np.float32)


class _Layout:
    """Static facts shared by the three kernels: reduced axes, broadcast shape, dtypes."""

    def __init__(self, inst: Instruction, operand: Shape) -> None:
        feature_index = int(inst.attrs["feature_index"])
        features = operand.dimensions[feature_index]
        epsilon = inst.attrs.get("epsilon", 0.0)
        self.work = _work_dtype(operand.dtype)
        # XLA stores epsilon as an f32 attribute, also for f64 operands.
        self.epsilon = self.work.type(np.float32(epsilon))
        self.axes = tuple(d for d in range(operand.rank) if d != feature_index)
        self.bshape = tuple(features if d == feature_index else 1 for d in range(operand.rank))
        self.count = int(np.prod([operand.dimensions[d] for d in self.axes], dtype=np.int64))
        self.dtype = operand.dtype

    def column(self, v: np.ndarray) -> np.ndarray:
        return v.astype(self.work, copy=False).reshape(self.bshape)

    def out(self, v: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(v, dtype=self.dtype)


@kernel("batch-norm-training")
def make_batch_norm_training(inst: Instruction, ctx: KernelContext) -> Callable[..., Any]:
    lay = _Layout(inst, ctx.operand_shapes(inst)[0])

    def batch_norm_training(operand: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> tuple:
        with quiet():
            x = operand.astype(lay.work, copy=False)
            mean = x.mean(axis=lay.axes, keepdims=True) if lay.count else np.zeros(lay.bshape, lay.work)
            centered = x - mean
            var = np.mean(centered * centered, axis=lay.axes, keepdims=True) if lay.count \
                else np.zeros(lay.bshape, lay.work)
            y = centered / np.sqrt(var + lay.epsilon) * lay.column(scale) + lay.column(offset)
        return lay.out(y), lay.out(mean.reshape(-1)), lay.out(var.reshape(-1))

    return batch_norm_training


@kernel("batch-norm-inference")
def make_batch_norm_inference(inst: Instruction, ctx: KernelContext) -> Callable[..., np.ndarray]:
    lay = _Layout(inst, ctx.operand_shapes(inst)[0])

    def batch_norm_inference(operand: np.ndarray, scale: np.ndarray, offset: np.ndarray, mean: np.ndarray,
                             variance: np.ndarray) -> np.ndarray:
        with quiet():
            x = operand.astype(lay.work, copy=False)
            y = (x - lay.column(mean)) / np.sqrt(lay.column(variance) + lay.epsilon) * lay.column(scale) \
                + lay.column(offset)
        return lay.out(y)

    return batch_norm_inference


@kernel("batch-norm-grad")
def make_batch_norm_grad(inst: Instruction, ctx: KernelContext) -> Callable[..., tuple]:
    lay = _Layout(inst, ctx.operand_shapes(inst)[0])

    def batch_norm_grad(operand: np.ndarray, scale: np.ndarray, mean: np.ndarray, variance: np.ndarray,
                        grad_output: np.ndarray) -> tuple:
        with quiet():
            x = operand.astype(lay.work, copy=False)
            dy = grad_output.astype(lay.work, copy=False)
            centered = x - lay.column(mean)
            var_eps = lay.column(variance) + lay.epsilon
            inv_std = 1 / np.sqrt(var_eps)
            sum_dy = dy.sum(axis=lay.axes, keepdims=True)
            sum_dy_centered = (dy * centered).sum(axis=lay.axes, keepdims=True)
            n = max(lay.count, 1)
            c = sum_dy_centered / n / var_eps
            d = sum_dy / n
            grad_operand = lay.column(scale) * inv_std * (dy - d - c * centered)
            grad_scale = sum_dy_centered * inv_std
        return lay.out(grad_operand), lay.out(grad_scale.reshape(-1)), lay.out(sum_dy.reshape(-1))

    return batch_norm_grad
