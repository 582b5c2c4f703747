"""XlaBuilder batch-norm-training, -inference and -grad."""

from __future__ import annotations

from replicas.hlo.builder.core import BuilderCore, XlaOp


class BatchNormOps(BuilderCore):
    def batch_norm_training(self, operand: XlaOp, scale: XlaOp, offset: XlaOp, epsilon: float,
                            feature_index: int) -> XlaOp:
        return self._emit("batch-norm-training", [self._op(x) for x in (operand, scale, offset)],
                          {"epsilon": float(epsilon), "feature_index": int(feature_index)})

    def batch_norm_inference(self, operand: XlaOp, scale: XlaOp, offset: XlaOp, mean: XlaOp, variance: XlaOp,
                             epsilon: float, feature_index: int) -> XlaOp:
        return self._emit("batch-norm-inference", [self._op(x) for x in (operand, scale, offset, mean, variance)],
                          {"epsilon": float(epsilon), "feature_index": int(feature_index)})

    def batch_norm_grad(self, operand: XlaOp, scale: XlaOp, batch_mean: XlaOp, batch_var: XlaOp,
                        grad_output: XlaOp, epsilon: float, feature_index: int) -> XlaOp:
        ops = [self._op(x) for x in (operand, scale, batch_mean, batch_var, grad_output)]
        return self._emit("batch-norm-grad", ops, {"epsilon": float(epsilon), "feature_index": int(feature_index)})
