"""The programs of bench/small_programs.py: (name, function, arguments, replicas, (in_specs, out_specs)).

Small on purpose (tens to thousands of elements): what they measure is what every instruction
costs besides its arithmetic.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

rng = np.random.default_rng(0)


def r(*shape: int) -> np.ndarray:
    return rng.normal(size=shape).astype(np.float32)


def pos(*shape: int) -> np.ndarray:
    return (np.abs(r(*shape)) + 0.5).astype(np.float32)


KEY = np.asarray(jax.random.key_data(jax.random.PRNGKey(0)))
W, G, M, V = r(256), r(256), r(256), pos(256)
A32, B32, X32 = r(32, 32), r(32, 32), r(32)
SPD = (A32 @ A32.T + 32 * np.eye(32)).astype(np.float32)
Q, K, V3 = r(16, 32), r(16, 32), r(16, 32)


def _mlp(p: Any, x: Any) -> Any:
    return jnp.tanh(x @ p[0] + p[1]) @ p[2]


MLP_P = (r(16, 32) * 0.3, r(32), r(32, 4) * 0.3)
MLP_X, MLP_Y = r(8, 16), r(8, 4)


def mlp_loss(p: Any, x: Any, y: Any) -> Any:
    return jnp.mean((_mlp(p, x) - y) ** 2)


def attention(q: Any, k: Any, v: Any) -> Any:
    return jax.nn.softmax(q @ k.T / np.sqrt(q.shape[-1]), -1) @ v


def mha(x: Any, wq: Any, wk: Any, wv: Any) -> Any:
    t, d = x.shape
    q, k, v = ((x @ w).reshape(t, 4, d // 4).transpose(1, 0, 2) for w in (wq, wk, wv))
    att = jax.nn.softmax(jnp.einsum("htd,hsd->hts", q, k) / np.sqrt(d // 4), -1)
    return jnp.einsum("hts,hsd->htd", att, v).transpose(1, 0, 2).reshape(t, d)


def causal(q: Any, k: Any, v: Any) -> Any:
    t = q.shape[0]
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), q @ k.T, -1e9)
    return jax.nn.softmax(s, -1) @ v


def rope(x: Any) -> Any:
    t, d = x.shape
    freqs = 1.0 / (10000 ** (jnp.arange(0, d, 2) / d))
    ang = jnp.arange(t)[:, None] * freqs[None]
    x1, x2 = x[:, ::2], x[:, 1::2]
    return jnp.concatenate([x1 * jnp.cos(ang) - x2 * jnp.sin(ang), x1 * jnp.sin(ang) + x2 * jnp.cos(ang)], -1)


def adam(w: Any, g: Any, m: Any, v: Any) -> Any:
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    return w - 1e-3 * (m / 0.1) / (jnp.sqrt(v / 0.001) + 1e-8), m, v


def adamw(w: Any, g: Any, m: Any, v: Any) -> Any:
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    return w - 1e-3 * (m / (jnp.sqrt(v) + 1e-8) + 0.01 * w), m, v


def lion(w: Any, g: Any, m: Any) -> Any:
    u = jnp.sign(0.9 * m + 0.1 * g)
    return w - 1e-4 * (u + 0.1 * w), 0.99 * m + 0.01 * g


def clip_by_norm(*gs: Any) -> Any:
    norm = jnp.sqrt(sum(jnp.sum(g * g) for g in gs))
    scale = jnp.minimum(1.0, 1.0 / (norm + 1e-6))
    return tuple(g * scale for g in gs)


def lstm_scan(wx: Any, wh: Any, xs: Any) -> Any:
    def cell(carry: Any, x: Any) -> Any:
        h, c = carry
        i, f, o, g = jnp.split(x @ wx + h @ wh, 4, -1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    z = jnp.zeros((4, 16))
    return jax.lax.scan(cell, (z, z), xs)[1]


def rnn_scan(w: Any, xs: Any) -> Any:
    return jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + x), h.sum()), jnp.zeros(32), xs)


def ema_scan(xs: Any) -> Any:
    return jax.lax.scan(lambda m, x: (0.9 * m + 0.1 * x, m), jnp.zeros(xs.shape[1]), xs)[1]


def power_iteration(a: Any) -> Any:
    def body(_: Any, v: Any) -> Any:
        v = a @ v
        return v / jnp.linalg.norm(v)

    return jax.lax.fori_loop(0, 20, body, jnp.ones(a.shape[0]))


def newton_sqrt(x: Any) -> Any:
    def cond(s: Any) -> Any:
        return jnp.max(jnp.abs(s[0] * s[0] - x)) > 1e-4

    def body(s: Any) -> Any:
        return (0.5 * (s[0] + x / s[0]), s[1] + 1)

    return jax.lax.while_loop(cond, body, (x, 0))


def kmeans_step(x: Any, c: Any) -> Any:
    d = jnp.sum((x[:, None] - c[None]) ** 2, -1)
    a = jnp.argmin(d, -1)
    onehot = jax.nn.one_hot(a, c.shape[0])
    return (onehot.T @ x) / (onehot.sum(0)[:, None] + 1e-6)


def dropout(key: Any, x: Any) -> Any:
    keep = jax.random.bernoulli(jax.random.wrap_key_data(key), 0.9, x.shape)
    return jnp.where(keep, x / 0.9, 0)


def rand_normal(key: Any) -> Any:
    return jax.random.normal(jax.random.wrap_key_data(key), (256,))


def rand_split_uniform(key: Any) -> Any:
    k1, k2 = jax.random.split(jax.random.wrap_key_data(key))
    return jax.random.uniform(k1, (64,)) + jax.random.uniform(k2, (64,))


def rand_categorical(key: Any, logits: Any) -> Any:
    return jax.random.categorical(jax.random.wrap_key_data(key), logits, shape=(32,))


def rand_permutation(key: Any) -> Any:
    return jax.random.permutation(jax.random.wrap_key_data(key), 128)


def conv1d(x: Any, w: Any) -> Any:
    return jax.lax.conv_general_dilated(x, w, (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC"))


def conv2d(x: Any, w: Any) -> Any:
    return jax.nn.relu(jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                                    dimension_numbers=("NHWC", "HWIO", "NHWC")))


def maxpool(x: Any) -> Any:
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def segment_sum(x: Any, ids: Any) -> Any:
    return jax.ops.segment_sum(x, ids, num_segments=8)


def horner(x: Any) -> Any:
    y = jnp.zeros_like(x)
    for c in (0.1, -0.2, 0.3, 0.5, -1.0, 2.0, 0.7):
        y = y * x + c
    return y


def pairwise(x: Any) -> Any:
    return jnp.sqrt(jnp.maximum(jnp.sum((x[:, None] - x[None]) ** 2, -1), 1e-12))


def layernorm(x: Any, g: Any, b: Any) -> Any:
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(v + 1e-5) * g + b


def rmsnorm(x: Any, g: Any) -> Any:
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g


def xent(logits: Any, labels: Any) -> Any:
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], -1))


def linreg_grad(w: Any, x: Any, y: Any) -> Any:
    return jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)


def logreg_grad(w: Any, x: Any, y: Any) -> Any:
    return jax.grad(lambda w: jnp.mean(jax.nn.softplus(-(x @ w) * y)))(w)


def mlp_step(p: Any, x: Any, y: Any) -> Any:
    loss, g = jax.value_and_grad(mlp_loss)(p, x, y)
    return loss, jax.tree_util.tree_map(lambda a, b: a - 0.05 * b, p, g)


def dp_step(w: Any, x: Any, y: Any) -> Any:
    loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
    return jax.lax.pmean(loss, "x"), w - 0.1 * jax.lax.pmean(g, "x")


def dp_mlp_step(p: Any, x: Any, y: Any) -> Any:
    loss, g = jax.value_and_grad(mlp_loss)(p, x, y)
    g = jax.lax.pmean(g, "x")
    return jax.lax.pmean(loss, "x"), jax.tree_util.tree_map(lambda a, b: a - 0.05 * b, p, g)


def tp_matmul(x: Any, w1: Any, w2: Any) -> Any:
    return jax.lax.psum(jax.nn.relu(x @ w1) @ w2, "x")


def ring(x: Any) -> Any:
    return jax.lax.ppermute(x, "x", [(i, (i + 1) % 4) for i in range(4)]) + x


def langevin(key: Any, x: Any) -> Any:
    """1,500 steps of unadjusted Langevin on a 2-d banana density: threefry noise every step."""
    def grad_u(x: Any) -> Any:
        a, b = x[0], x[1]
        return jnp.stack([a + 4.0 * a * (b - a * a) * -1.0 + 0.0, (b - a * a)])

    def step(i: Any, s: Any) -> Any:
        x, k = s
        k, sub = jax.random.split(k)
        noise = jax.random.normal(sub, x.shape)
        return x - 0.01 * grad_u(x) + jnp.sqrt(0.02) * noise, k

    return jax.lax.fori_loop(0, 1500, step, (x, jax.random.wrap_key_data(key)))[0]


ONE: Any = None
S2 = (P("x"), P("x"))
PROGRAMS: list[tuple[str, Any, list[Any], int, Any]] = [
    ("sgd", lambda w, g: w - 0.01 * g, [W, G], 1, ONE),
    ("momentum", lambda w, g, m: (w - 0.01 * (0.9 * m + g), 0.9 * m + g), [W, G, M], 1, ONE),
    ("adam", adam, [W, G, M, V], 1, ONE),
    ("adamw", adamw, [W, G, M, V], 1, ONE),
    ("rmsprop", lambda w, g, v: (w - 0.01 * g / (jnp.sqrt(0.9 * v + 0.1 * g * g) + 1e-8), 0.9 * v + 0.1 * g * g),
     [W, G, V], 1, ONE),
    ("adagrad", lambda w, g, v: (w - 0.1 * g / jnp.sqrt(v + g * g + 1e-10), v + g * g), [W, G, V], 1, ONE),
    ("lion", lion, [W, G, M], 1, ONE),
    ("clip_by_norm", clip_by_norm, [W, G, r(64, 8)], 1, ONE),
    ("linreg_grad", linreg_grad, [r(8), r(64, 8), r(64)], 1, ONE),
    ("logreg_grad", logreg_grad, [r(8), r(64, 8), np.sign(r(64))], 1, ONE),
    ("mlp_forward", _mlp, [MLP_P, MLP_X], 1, ONE),
    ("mlp_step", mlp_step, [MLP_P, MLP_X, MLP_Y], 1, ONE),
    ("softmax", lambda x: jax.nn.softmax(x, -1), [r(16, 64)], 1, ONE),
    ("xent", xent, [r(16, 10), rng.integers(0, 10, 16).astype(np.int32)], 1, ONE),
    ("logsumexp", lambda x: jax.nn.logsumexp(x, -1), [r(16, 64)], 1, ONE),
    ("layernorm", layernorm, [r(16, 64), pos(64), r(64)], 1, ONE),
    ("rmsnorm", rmsnorm, [r(16, 64), pos(64)], 1, ONE),
    ("gelu", jax.nn.gelu, [r(1024)], 1, ONE),
    ("silu_glu", lambda x, w1, w2: (jax.nn.silu(x @ w1) * (x @ w2)), [r(8, 32), r(32, 64), r(32, 64)], 1, ONE),
    ("attention", attention, [Q, K, V3], 1, ONE),
    ("mha", mha, [r(16, 32), r(32, 32), r(32, 32), r(32, 32)], 1, ONE),
    ("causal_attention", causal, [Q, K, V3], 1, ONE),
    ("rope", rope, [r(16, 32)], 1, ONE),
    ("cumsum", lambda x: jnp.cumsum(x, 0), [r(64, 8)], 1, ONE),
    ("cummax", lambda x: jax.lax.cummax(x, 0), [r(64, 8)], 1, ONE),
    ("lstm_scan", lstm_scan, [r(8, 64) * 0.3, r(16, 64) * 0.3, r(16, 4, 8)], 1, ONE),
    ("rnn_scan", rnn_scan, [r(32, 32) * 0.2, r(24, 32)], 1, ONE),
    ("ema_scan", ema_scan, [r(32, 16)], 1, ONE),
    ("power_iteration", power_iteration, [SPD], 1, ONE),
    ("newton_sqrt", newton_sqrt, [pos(64)], 1, ONE),
    ("matmul_chain", lambda a, b, x: jnp.tanh(a @ (b @ (a @ x))), [A32, B32, X32], 1, ONE),
    ("batched_einsum", lambda a, b: jnp.einsum("bij,bjk->bik", a, b), [r(4, 16, 16), r(4, 16, 16)], 1, ONE),
    ("solve", lambda a, b: jnp.linalg.solve(a, b), [SPD, X32], 1, ONE),
    ("cholesky", jnp.linalg.cholesky, [SPD], 1, ONE),
    ("triangular_solve", lambda a, b: jax.scipy.linalg.solve_triangular(jnp.tril(a) + 32 * jnp.eye(32), b,
                                                                          lower=True), [A32, X32], 1, ONE),
    ("inverse", jnp.linalg.inv, [SPD], 1, ONE),
    ("qr", lambda a: jnp.linalg.qr(a)[1], [A32], 1, ONE),
    ("eigh", lambda a: jnp.linalg.eigh(a)[0], [SPD], 1, ONE),
    ("rand_normal", rand_normal, [KEY], 1, ONE),
    ("rand_split_uniform", rand_split_uniform, [KEY], 1, ONE),
    ("dropout", dropout, [KEY, r(256)], 1, ONE),
    ("rand_categorical", rand_categorical, [KEY, r(10)], 1, ONE),
    ("rand_permutation", rand_permutation, [KEY], 1, ONE),
    ("top_k", lambda x: jax.lax.top_k(x, 5), [r(8, 64)], 1, ONE),
    ("argsort", jnp.argsort, [r(256)], 1, ONE),
    ("sort2d", lambda x: jnp.sort(x, -1), [r(16, 32)], 1, ONE),
    ("embedding", lambda e, i: e[i], [r(100, 16), rng.integers(0, 100, 32).astype(np.int32)], 1, ONE),
    ("segment_sum", segment_sum, [r(64, 4), rng.integers(0, 8, 64).astype(np.int32)], 1, ONE),
    ("one_hot", lambda i: jax.nn.one_hot(i, 16), [rng.integers(0, 16, 32).astype(np.int32)], 1, ONE),
    ("clip_where", lambda x: jnp.where(x > 0, jnp.clip(x, 0, 1), 0.1 * x), [r(512)], 1, ONE),
    ("horner", horner, [r(512)], 1, ONE),
    ("pairwise", pairwise, [r(32, 3)], 1, ONE),
    ("kmeans_step", kmeans_step, [r(64, 2), r(4, 2)], 1, ONE),
    ("conv1d", conv1d, [r(2, 32, 4), r(3, 4, 8)], 1, ONE),
    ("conv2d", conv2d, [r(2, 8, 8, 3), r(3, 3, 3, 8)], 1, ONE),
    ("maxpool", maxpool, [r(2, 8, 8, 4)], 1, ONE),
    ("fft", lambda x: jnp.abs(jnp.fft.rfft(x)), [r(128)], 1, ONE),
    ("vmap_norms", jax.vmap(lambda v: jnp.linalg.norm(v) * v), [r(16, 8)], 1, ONE),
    # SPMD steps: shard_map over 2 or 4 replicas.
    ("psum", lambda x: jax.lax.psum(x, "x"), [r(4 * 64)], 4, (P("x"), P())),
    ("all_gather", lambda x: jax.lax.all_gather(x, "x", tiled=True), [r(4 * 16)], 4, S2),
    ("psum_scatter", lambda x: jax.lax.psum_scatter(x, "x", tiled=True), [r(4 * 64)], 4, S2),
    ("all_to_all", lambda x: jax.lax.all_to_all(x, "x", 0, 0, tiled=True), [r(4 * 16, 4)], 4, S2),
    ("ppermute_ring", ring, [r(4 * 32)], 4, S2),
    ("dp_linreg_step", dp_step, [r(8), r(4 * 16, 8), r(4 * 16)], 4, ((P(), P("x"), P("x")), (P(), P()))),
    ("dp_mlp_step", dp_mlp_step, [MLP_P, r(4 * 8, 16), r(4 * 8, 4)], 4, ((P(), P("x"), P("x")), (P(), P()))),
    ("tp_mlp", tp_matmul, [r(8, 16), r(16, 4 * 16), r(4 * 16, 8)], 4, ((P(), P(None, "x"), P("x")), P())),
    ("dp_adam_2", lambda w, g, m, v: adam(w, jax.lax.pmean(g, "x"), m, v), [W, G, M, V], 2,
     ((P(), P(), P(), P()), (P(), P(), P()))),
    ("softmax_sharded_2", lambda x: jnp.exp(x) / jax.lax.psum(jnp.exp(x).sum(), "x"), [r(2 * 64)], 2, S2),
]

LANGEVIN = ("langevin_1500", langevin, [KEY, np.zeros(2, np.float32)], 1, ONE)
# The same sampler as independent chains, one a replica (each its own key): data-parallel sampling.
CHAINS = ("langevin_chains_2", lambda k, x: langevin(k[0], x[0])[None],
          [np.stack([KEY, KEY ^ np.uint32(0x9E3779B9)]), np.zeros((2, 2), np.float32)], 2, S2)
