"""The models every workload trains: parameter initialisation and the forward math.

Parameters are built once with numpy from a fixed seed, so every contender starts from the
very same numbers. The forward passes are plain functions of a parameter dict; the flax.nnx
versions (built lazily, only when flax is importable) call the same functions on their
variables' values, so every contender computes the same math.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# --------------------------------------------------------------------------- initialisation


def _normal(rng: np.random.Generator, *shape: int, scale: float) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def dense_init(rng: np.random.Generator, n_in: int, n_out: int) -> dict[str, np.ndarray]:
    return {
        "w": _normal(rng, n_in, n_out, scale=1.0 / math.sqrt(n_in)),
        "b": _normal(rng, n_out, scale=0.01),
    }


def layer_norm_init(d: int) -> dict[str, np.ndarray]:
    return {"scale": np.ones(d, np.float32), "bias": np.zeros(d, np.float32)}


def mlp_init(seed: int, sizes: tuple[int, ...]) -> dict[str, Any]:
    """``{'layer0': {'w', 'b'}, ...}`` for the layer sizes ``sizes`` (input first)."""
    rng = np.random.default_rng(seed)
    return {
        f"layer{i}": dense_init(rng, a, b)
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True))
    }


def transformer_init(seed: int, n_layers: int, d: int, vocab: int, seq: int) -> dict[str, Any]:
    """``{'embed': {'token', 'position'}, 'layers': [...], 'final_ln': {...}}``.

    Each layer: attention q/k/v/o (w, b), ``ln1``, an MLP (w1, b1, w2, b2) and ``ln2``:
    16 leaves per layer, 4 more outside, so 196 leaves for 12 layers (589 with Adam's state).
    """
    rng = np.random.default_rng(seed)
    layers = []
    for _ in range(n_layers):
        w1 = dense_init(rng, d, 4 * d)
        w2 = dense_init(rng, 4 * d, d)
        layers.append(
            {
                "attention": {name: dense_init(rng, d, d) for name in ("q", "k", "v", "o")},
                "ln1": layer_norm_init(d),
                "mlp": {"w1": w1["w"], "b1": w1["b"], "w2": w2["w"], "b2": w2["b"]},
                "ln2": layer_norm_init(d),
            }
        )
    return {
        "embed": {
            "token": _normal(rng, vocab, d, scale=0.5),
            "position": _normal(rng, seq, d, scale=0.1),
        },
        "layers": layers,
        "final_ln": layer_norm_init(d),
    }


def tied_init(seed: int, vocab: int, d: int) -> dict[str, Any]:
    """``{'embed': E, 'hidden': {'w', 'b'}, 'unembed': E}`` with the *same* array object E."""
    rng = np.random.default_rng(seed)
    embed = _normal(rng, vocab, d, scale=0.5)
    return {"embed": embed, "hidden": dense_init(rng, d, d), "unembed": embed}


# --------------------------------------------------------------------------- forward math


def dense(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    return x @ w + b


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale + bias


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


def mlp_apply(params: dict[str, Any], x: jax.Array) -> jax.Array:
    n = len(params)
    for i in range(n):
        layer = params[f"layer{i}"]
        x = dense(x, layer["w"], layer["b"])
        if i < n - 1:
            x = jax.nn.relu(x)
    return x


def mlp_loss(params: dict[str, Any], x: jax.Array, y: jax.Array) -> jax.Array:
    return cross_entropy(mlp_apply(params, x), y)


def attention(h: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array, n_heads: int) -> jax.Array:
    """Causal multi-head self-attention on projected ``q``, ``k``, ``v`` (B, T, D)."""
    b, t, d = h.shape
    hd = d // n_heads
    q = q.reshape(b, t, n_heads, hd)
    k = k.reshape(b, t, n_heads, hd)
    v = v.reshape(b, t, n_heads, hd)
    scores = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)
    mask = jnp.tril(jnp.ones((t, t), dtype=bool))
    scores = jnp.where(mask, scores, -1e9)
    weights = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhts,bshd->bthd", weights, v).reshape(b, t, d)


def block_apply(layer: dict[str, Any], h: jax.Array, n_heads: int) -> jax.Array:
    att = layer["attention"]
    x = layer_norm(h, layer["ln1"]["scale"], layer["ln1"]["bias"])
    q, k, v = (dense(x, att[n]["w"], att[n]["b"]) for n in ("q", "k", "v"))
    h = h + dense(attention(x, q, k, v, n_heads), att["o"]["w"], att["o"]["b"])
    x = layer_norm(h, layer["ln2"]["scale"], layer["ln2"]["bias"])
    mlp = layer["mlp"]
    return h + dense(jax.nn.gelu(dense(x, mlp["w1"], mlp["b1"])), mlp["w2"], mlp["b2"])


def transformer_apply(params: dict[str, Any], tokens: jax.Array, n_heads: int) -> jax.Array:
    embed = params["embed"]
    h = embed["token"][tokens] + embed["position"][None, : tokens.shape[1]]
    for layer in params["layers"]:
        h = block_apply(layer, h, n_heads)
    h = layer_norm(h, params["final_ln"]["scale"], params["final_ln"]["bias"])
    return h @ embed["token"].T


def transformer_loss(
    params: dict[str, Any], tokens: jax.Array, labels: jax.Array, n_heads: int
) -> jax.Array:
    return cross_entropy(transformer_apply(params, tokens, n_heads), labels)


def tied_apply(params: dict[str, Any], tokens: jax.Array) -> jax.Array:
    h = params["embed"][tokens]
    h = jnp.tanh(dense(h, params["hidden"]["w"], params["hidden"]["b"]))
    return h @ params["unembed"].T


def tied_loss(params: dict[str, Any], tokens: jax.Array, labels: jax.Array) -> jax.Array:
    return cross_entropy(tied_apply(params, tokens), labels)


# --------------------------------------------------------------------------- flax.nnx versions


def nnx_classes() -> dict[str, Any]:
    """The nnx.Module versions of the models (imports flax; call only when it is installed)."""
    layers = _nnx_layers()
    mlp, tied = _nnx_small_models(layers)
    transformer = _nnx_transformer(layers)
    return {"MLP": mlp, "Transformer": transformer, "Tied": tied, "Frozen": layers["Frozen"]}


def _nnx_layers() -> dict[str, Any]:
    """The nnx layers the models are made of (``Dense``, ``LayerNorm``) and ``Frozen``."""
    from flax import nnx

    class Frozen(nnx.Variable):
        """A parameter that fine-tuning leaves alone (not an ``nnx.Param``, so not trained)."""

    class Layer(nnx.Module):
        """A layer of the parameters ``names`` (each a ``kind`` of Variable), applied to ``x``
        as ``apply(x, *parameters)``: the functional model's layer, made a Module."""

        names: tuple[str, ...] = ()

        def __init__(self, p: dict[str, Any], kind: type = nnx.Param):
            for name in self.names:
                setattr(self, name, kind(jnp.asarray(p[name])))

        def __call__(self, x):
            return type(self).apply(x, *(getattr(self, name)[...] for name in self.names))

        def params(self):
            return {name: getattr(self, name)[...] for name in self.names}

    class Dense(Layer):
        names, apply = ("w", "b"), staticmethod(dense)

    class LayerNorm(Layer):
        names, apply = ("scale", "bias"), staticmethod(layer_norm)

    return {"Frozen": Frozen, "Dense": Dense, "LayerNorm": LayerNorm}


def _nnx_small_models(layers: dict[str, Any]) -> tuple[type, type]:
    """The nnx MLP and tied-embeddings model, made of ``layers`` (``_nnx_layers``)."""
    from flax import nnx

    Dense = layers["Dense"]

    class MLP(nnx.Module):
        def __init__(self, p: dict[str, Any]):
            self.layers = nnx.List([Dense(p[f"layer{i}"]) for i in range(len(p))])

        def __call__(self, x):
            for i, layer in enumerate(self.layers):
                x = layer(x)
                if i < len(self.layers) - 1:
                    x = jax.nn.relu(x)
            return x

        def params(self):
            return {f"layer{i}": layer.params() for i, layer in enumerate(self.layers)}

    class Tied(nnx.Module):
        """``unembed`` is the very same ``nnx.Param`` as ``embed`` (nnx keeps the share)."""

        def __init__(self, p: dict[str, Any]):
            self.embed = nnx.Param(jnp.asarray(p["embed"]))
            self.hidden = Dense(p["hidden"])
            self.unembed = self.embed

        def __call__(self, tokens):
            h = jnp.tanh(self.hidden(self.embed[...][tokens]))
            return h @ self.unembed[...].T

        def params(self):
            return {
                "embed": self.embed[...],
                "hidden": self.hidden.params(),
                "unembed": self.unembed[...],
            }

    return MLP, Tied


def _nnx_transformer(layers: dict[str, Any]) -> type:
    """The nnx transformer, made of ``layers`` (``_nnx_layers``)."""
    from flax import nnx

    Frozen, Dense, LayerNorm = layers["Frozen"], layers["Dense"], layers["LayerNorm"]

    class Block(nnx.Module):
        def __init__(self, p: dict[str, Any], n_heads: int, kind: type = nnx.Param):
            self.n_heads = n_heads
            att = p["attention"]
            self.q, self.k, self.v, self.o = (Dense(att[n], kind) for n in ("q", "k", "v", "o"))
            self.ln1 = LayerNorm(p["ln1"], kind)
            mlp = p["mlp"]
            self.mlp_in = Dense({"w": mlp["w1"], "b": mlp["b1"]}, kind)
            self.mlp_out = Dense({"w": mlp["w2"], "b": mlp["b2"]}, kind)
            self.ln2 = LayerNorm(p["ln2"], kind)

        def __call__(self, h):
            x = self.ln1(h)
            h = h + self.o(attention(x, self.q(x), self.k(x), self.v(x), self.n_heads))
            return h + self.mlp_out(jax.nn.gelu(self.mlp_in(self.ln2(h))))

        def params(self):
            w1, w2 = self.mlp_in.params(), self.mlp_out.params()
            return {
                "attention": {n: getattr(self, n).params() for n in ("q", "k", "v", "o")},
                "ln1": self.ln1.params(),
                "mlp": {"w1": w1["w"], "b1": w1["b"], "w2": w2["w"], "b2": w2["b"]},
                "ln2": self.ln2.params(),
            }

    class Transformer(nnx.Module):
        """``n_frozen`` leading layers and the embeddings are ``Frozen`` (0: all trainable)."""

        def __init__(self, p: dict[str, Any], n_heads: int, n_frozen: int = 0):
            emb_kind = Frozen if n_frozen else nnx.Param
            self.token = emb_kind(jnp.asarray(p["embed"]["token"]))
            self.position = emb_kind(jnp.asarray(p["embed"]["position"]))
            self.layers = nnx.List(
                [
                    Block(layer, n_heads, Frozen if i < n_frozen else nnx.Param)
                    for i, layer in enumerate(p["layers"])
                ]
            )
            self.final_ln = LayerNorm(p["final_ln"])

        def __call__(self, tokens):
            token = self.token[...]
            h = token[tokens] + self.position[...][None, : tokens.shape[1]]
            for layer in self.layers:
                h = layer(h)
            return self.final_ln(h) @ token.T

        def params(self):
            return {
                "embed": {"token": self.token[...], "position": self.position[...]},
                "layers": [layer.params() for layer in self.layers],
                "final_ln": self.final_ln.params(),
            }

    return Transformer


# --------------------------------------------------------------------------- equinox version


@functools.cache
def eqx_mlp_class() -> type:
    """An equinox Module version of the MLP of ``mlp_apply`` (imports equinox; call only when
    it is installed): the layers' arrays and the activation function as a field, a leaf that
    is not an array, so ``jax.jit`` cannot take the model whole (``eqx.partition`` or
    ``traced="arrays"`` can)."""
    import equinox as eqx

    class EqxMLP(eqx.Module):
        layers: tuple[dict[str, jax.Array], ...]
        activation: Any

        def __call__(self, x: jax.Array) -> jax.Array:
            for i, layer in enumerate(self.layers):
                x = dense(x, layer["w"], layer["b"])
                if i < len(self.layers) - 1:
                    x = self.activation(x)
            return x

    return EqxMLP
