"""Real JAX models through `rp.run` against the same programs jitted by JAX (XLA:CPU), same run.

Models (our own, small enough for a 2-core machine, big enough that kernels matter):
- gpt: a 2-layer GPT training step (embedding, causal attention, MLP, cross-entropy, SGD update);
- gpt_dp: its data-parallel form on 4 partitions (`shard_map`, gradients all-reduced by `pmean`);
- cnn: a convolutional classifier's training step (2 convolutions, pooling, dense, softmax loss);
- lstm: an LSTM over 32 steps (`lax.scan`, a While loop of small matrix products);
- moe: a top-2 mixture-of-experts layer (router, gather of tokens per expert, expert MLPs).

Each model runs warm (second and later calls) on the chosen backend (`--backend`, default threads),
as a JAX user calls it: `--call jit` (the default) through `rp.jax.jit(f)` (compiled once, its job
kept between calls, outputs left on the replicas as `rp.Array`s as JAX leaves them on its devices,
numpy arguments shipped every call as JAX's are); `--call run` through `rp.run` of the compiled HLO
text JAX gives (`jit(f).lower(...).compile().as_text()`: a whole job per call). The anchor is
`jax.jit(f)` on the same arguments, called alternately with it. Reported: median seconds of each and the median of the
per-round ratios, with their spread (min-max), and for gpt_dp the same step with the BLAS pools
left alone (REPLICAS_BLAS_THREADS=off) to show what sharing the cores does. Goals: median ratio
<= 5, none over 20, gpt_dp <= 3.

    python bench/models.py [--repeat 5] [--models gpt,cnn] [--ray] [--backend ray] [--call jit|run]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from common import load_average  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import replicas as rp  # noqa: E402

try:
    from jax import shard_map
except ImportError:  # older jax
    from jax.experimental.shard_map import shard_map

# -- models ----------------------------------------------------------------------------------------

VOCAB, D, LAYERS, SEQ, HEADS, BATCH = 256, 128, 2, 64, 4, 16


def gpt_params(key: Any) -> dict:
    ks = jax.random.split(key, 2 + 4 * LAYERS)
    layers = []
    for i in range(LAYERS):
        k = ks[2 + 4 * i: 6 + 4 * i]
        layers.append({"qkv": jax.random.normal(k[0], (D, 3 * D)) * 0.02,
                       "o": jax.random.normal(k[1], (D, D)) * 0.02,
                       "w1": jax.random.normal(k[2], (D, 4 * D)) * 0.02,
                       "w2": jax.random.normal(k[3], (4 * D, D)) * 0.02,
                       "g1": jnp.ones(D), "g2": jnp.ones(D)})
    return {"emb": jax.random.normal(ks[0], (VOCAB, D)) * 0.02, "pos": jax.random.normal(ks[1], (SEQ, D)) * 0.02,
            "layers": layers}


def _norm(x: Any, g: Any) -> Any:
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(v + 1e-5) * g


def gpt_loss(p: dict, tok: Any) -> Any:
    x = p["emb"][tok[:, :-1]] + p["pos"][None]
    b, t, d = x.shape
    mask = jnp.tril(jnp.ones((t, t), bool))
    for layer in p["layers"]:
        q, k, v = jnp.split(_norm(x, layer["g1"]) @ layer["qkv"], 3, -1)
        q, k, v = (a.reshape(b, t, HEADS, d // HEADS) for a in (q, k, v))
        att = jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(d // HEADS)
        att = jax.nn.softmax(jnp.where(mask, att, -1e9), -1)
        x = x + jnp.einsum("bhts,bshd->bthd", att, v).reshape(b, t, d) @ layer["o"]
        x = x + jax.nn.gelu(_norm(x, layer["g2"]) @ layer["w1"]) @ layer["w2"]
    logits = x @ p["emb"].T
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tok[:, 1:, None], -1))


def sgd(p: Any, g: Any) -> Any:
    return jax.tree_util.tree_map(lambda a, b: a - 0.01 * b, p, g)


def gpt_step(p: dict, tok: Any) -> Any:
    loss, g = jax.value_and_grad(gpt_loss)(p, tok)
    return loss, sgd(p, g)


def gpt_dp_step(p: dict, tok: Any) -> Any:
    loss, g = jax.value_and_grad(gpt_loss)(p, tok)
    g = jax.lax.pmean(g, "x")
    return jax.lax.pmean(loss, "x"), sgd(p, g)


def cnn_params(key: Any) -> dict:
    k = jax.random.split(key, 3)
    return {"c1": jax.random.normal(k[0], (3, 3, 3, 16)) * 0.1, "c2": jax.random.normal(k[1], (3, 3, 16, 32)) * 0.1,
            "w": jax.random.normal(k[2], (8 * 8 * 32, 10)) * 0.01}


def cnn_loss(p: dict, x: Any, y: Any) -> Any:
    dn = ("NHWC", "HWIO", "NHWC")
    h = jax.nn.relu(jax.lax.conv_general_dilated(x, p["c1"], (1, 1), "SAME", dimension_numbers=dn))
    h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    h = jax.nn.relu(jax.lax.conv_general_dilated(h, p["c2"], (1, 1), "SAME", dimension_numbers=dn))
    h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    logits = h.reshape(h.shape[0], -1) @ p["w"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], -1))


def cnn_step(p: dict, x: Any, y: Any) -> Any:
    loss, g = jax.value_and_grad(cnn_loss)(p, x, y)
    return loss, sgd(p, g)


def lstm(p: dict, xs: Any) -> Any:
    def cell(carry: Any, x: Any) -> Any:
        h, c = carry
        z = x @ p["wx"] + h @ p["wh"] + p["b"]
        i, f, o, g = jnp.split(z, 4, -1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    b, hidden = xs.shape[1], p["wh"].shape[0]
    zeros = jnp.zeros((b, hidden))
    _, hs = jax.lax.scan(cell, (zeros, zeros), xs)
    return hs.mean()


def moe(p: dict, x: Any) -> Any:
    gates = jax.nn.softmax(x @ p["router"], -1)
    weight, expert = jax.lax.top_k(gates, 2)
    out = jnp.zeros_like(x)
    for e in range(p["w1"].shape[0]):
        chosen = (expert == e).astype(x.dtype) * weight
        h = jax.nn.gelu(x @ p["w1"][e]) @ p["w2"][e]
        out = out + chosen.sum(-1, keepdims=True) * h
    return out


# -- the benchmark ---------------------------------------------------------------------------------


def flat(tree: Any) -> list[np.ndarray]:
    return [np.asarray(a) for a in jax.tree_util.tree_leaves(tree)]


def build() -> dict[str, tuple[Callable[..., Any], list[np.ndarray], int, list[list[np.ndarray]] | None]]:
    """name -> (jitted function of flat arrays, flat arguments, replicas, per-replica arguments)."""
    rng = np.random.default_rng(0)
    key = jax.random.PRNGKey(0)
    models: dict[str, Any] = {}

    gp = gpt_params(key)
    tree = jax.tree_util.tree_structure(gp)
    n_gp = len(jax.tree_util.tree_leaves(gp))
    tok = rng.integers(0, VOCAB, (BATCH, SEQ + 1)).astype(np.int32)

    def gpt_flat(*a: Any) -> Any:
        return gpt_step(jax.tree_util.tree_unflatten(tree, a[:n_gp]), a[n_gp])

    models["gpt"] = (jax.jit(gpt_flat), flat(gp) + [tok], 1, None)

    devices = jax.devices()
    if len(devices) >= 4:
        mesh = Mesh(np.array(devices[:4]), ("x",))

        def gpt_dp_flat(*a: Any) -> Any:
            return gpt_dp_step(jax.tree_util.tree_unflatten(tree, a[:n_gp]), a[n_gp])

        specs = tuple([P()] * n_gp + [P("x")])
        kwargs = {"check_vma": False} if "check_vma" in shard_map.__code__.co_varnames else {}
        f = shard_map(gpt_dp_flat, mesh=mesh, in_specs=specs, out_specs=P(), **kwargs)
        args = flat(gp) + [tok]
        per_replica = [flat(gp) + [shard] for shard in np.split(tok, 4)]
        models["gpt_dp"] = (jax.jit(f), args, 4, per_replica)

    cp = cnn_params(key)
    ctree = jax.tree_util.tree_structure(cp)
    x = rng.normal(size=(32, 32, 32, 3)).astype(np.float32)
    y = rng.integers(0, 10, 32).astype(np.int32)

    def cnn_flat(*a: Any) -> Any:
        return cnn_step(jax.tree_util.tree_unflatten(ctree, a[:3]), a[3], a[4])

    models["cnn"] = (jax.jit(cnn_flat), flat(cp) + [x, y], 1, None)

    hidden, feat = 128, 64
    lp = {"wx": rng.normal(size=(feat, 4 * hidden)).astype(np.float32) * 0.1,
          "wh": rng.normal(size=(hidden, 4 * hidden)).astype(np.float32) * 0.1,
          "b": np.zeros(4 * hidden, np.float32)}
    xs = rng.normal(size=(32, 16, feat)).astype(np.float32)
    models["lstm"] = (jax.jit(lambda wx, wh, b, xs: jax.value_and_grad(lstm)({"wx": wx, "wh": wh, "b": b}, xs)),
                      [lp["wx"], lp["wh"], lp["b"], xs], 1, None)

    experts, dm = 4, 128
    mp = {"router": rng.normal(size=(dm, experts)).astype(np.float32),
          "w1": rng.normal(size=(experts, dm, 2 * dm)).astype(np.float32) * 0.05,
          "w2": rng.normal(size=(experts, 2 * dm, dm)).astype(np.float32) * 0.05}
    xm = rng.normal(size=(512, dm)).astype(np.float32)
    models["moe"] = (jax.jit(lambda r, w1, w2, x: moe({"router": r, "w1": w1, "w2": w2}, x)),
                     [mp["router"], mp["w1"], mp["w2"], xm], 1, None)
    return models


def timed(fn: Callable[[], Any], repeat: int) -> list[float]:
    fn()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def interleaved(a: Callable[[], Any], b: Callable[[], Any], repeat: int) -> tuple[list[float], list[float]]:
    """Seconds of `a` and of `b`, alternating call by call (load changes hit both alike)."""
    a()
    b()
    ta, tb = [], []
    for _ in range(repeat):
        for fn, out in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return ta, tb


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--models", default="")
    p.add_argument("--ray", action="store_true", help="also run gpt_dp on the Ray backend")
    p.add_argument("--backend", default="threads", choices=("threads", "ray"), help="the backend of every model")
    p.add_argument("--call", default="jit", choices=("jit", "run"),
                   help="jit: rp.jax.jit(f) (a persistent job); run: rp.run of the compiled text (a job per call)")
    ns = p.parse_args()
    models = build()
    wanted = [m for m in ns.models.split(",") if m] or list(models)
    print(f"load average before: {load_average()}; backend {ns.backend}, call {ns.call}")
    print(f"{'model':8} {'replicas':>8} {'jax (ms)':>10} {'rp (ms)':>12} {'ratio':>7} {'spread':>13}")
    ratios = {}
    jitted = []
    for name in wanted:
        f, args, n, per_replica = models[name]
        module = rp.parse_hlo(f.lower(*args).compile().as_text())
        run_args = per_replica if per_replica is not None else args
        if ns.call == "jit":
            step = rp.jax.jit(f, num_replicas=n, backend=ns.backend)
            jitted.append(step)
            ours = lambda: step(*args)  # noqa: B023, E731
        else:
            ours = lambda: rp.run(module, run_args, num_replicas=n, backend=ns.backend)  # noqa: B023, E731
        jax_times, rp_times = interleaved(
            lambda: jax.block_until_ready(f(*args)),  # noqa: B023
            ours,
            ns.repeat)
        per_round = [r / j for r, j in zip(rp_times, jax_times)]
        ratio = float(np.median(per_round))
        ratios[name] = ratio
        print(f"{name:8} {n:>8} {np.median(jax_times) * 1e3:10.1f} {np.median(rp_times) * 1e3:12.1f} "
              f"{ratio:6.1f}x  ({min(per_round):.1f}-{max(per_round):.1f})")
        if name == "gpt_dp":
            os.environ["REPLICAS_BLAS_THREADS"] = "off"
            try:
                off = timed(lambda: rp.run(module, run_args, num_replicas=n, backend="threads"),  # noqa: B023
                            ns.repeat)
            finally:
                del os.environ["REPLICAS_BLAS_THREADS"]
            print(f"{'  pools off':17} {'':>10} {np.median(off) * 1e3:12.1f} "
                  f"{np.median(off) / np.median(jax_times):6.1f}x  ({min(off) * 1e3:.0f}-{max(off) * 1e3:.0f} ms)")
            if ns.ray:
                ray_times = timed(lambda: rp.run(module, run_args, num_replicas=n), ns.repeat)  # noqa: B023
                print(f"{'  on Ray':17} {'':>10} {np.median(ray_times) * 1e3:12.1f} "
                      f"{np.median(ray_times) / np.median(jax_times):6.1f}x")
    values = list(ratios.values())
    print(f"median ratio {np.median(values):.1f}x, worst {max(values):.1f}x ({max(ratios, key=ratios.get)}); "
          f"load average after: {load_average()}")
    for step in jitted:
        step.close()
    if ns.ray or ns.backend == "ray":
        import ray

        ray.shutdown()


if __name__ == "__main__":
    main()
