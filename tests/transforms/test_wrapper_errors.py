"""Which error a lifted transformation's wrapper raises first when both its policy and an
option that JAX checks are bad: each keeps the order it has always had (``Wrapper.__init__``,
``jax_checks_first``). vmap, grad and value_and_grad make their JAX transformation first, so
JAX's error comes first; checkpoint and shard_map check the policy first (their JAX
transformation checks nothing as it is made, so a stand-in that raises shows the order)."""

from __future__ import annotations

import re

import jax
import pytest
import treeclone as tc

BAD_POLICY = {"nope": "alias"}  # names no parameter of f
POLICY_ERROR = "policy names 'nope'"


def f(x, y):
    return x


def jax_error(make):
    with pytest.raises(TypeError) as caught:
        make()
    return re.escape(str(caught.value))


def test_vmap_reports_jax_s_error_first():
    expected = jax_error(lambda: jax.vmap(f, in_axes=1.5))
    with pytest.raises(TypeError, match=expected):
        tc.vmap(f, in_axes=1.5, policy=BAD_POLICY)
    with pytest.raises(ValueError, match=POLICY_ERROR):
        tc.vmap(f, policy=BAD_POLICY)


@pytest.mark.parametrize("name", ["grad", "value_and_grad"])
def test_grad_reports_jax_s_error_first(name):
    expected = jax_error(lambda: getattr(jax, name)(f, argnums=1.5))
    with pytest.raises(TypeError, match=expected):
        getattr(tc, name)(f, argnums=1.5, policy=BAD_POLICY)
    with pytest.raises(ValueError, match=POLICY_ERROR):
        getattr(tc, name)(f, policy=BAD_POLICY)


class JaxOptionError(Exception):
    pass


def refuse(*args, **kwargs):
    raise JaxOptionError("a bad option")


def test_checkpoint_reports_the_policy_s_error_first(monkeypatch):
    monkeypatch.setattr(jax, "checkpoint", refuse)
    with pytest.raises(ValueError, match=POLICY_ERROR):
        tc.checkpoint(f, policy=BAD_POLICY)
    with pytest.raises(JaxOptionError):
        tc.checkpoint(f, policy="alias")


def test_shard_map_reports_the_policy_s_error_first(monkeypatch):
    from jax.sharding import PartitionSpec as P

    monkeypatch.setattr(jax, "shard_map", refuse)
    with pytest.raises(ValueError, match=POLICY_ERROR):
        tc.shard_map(f, in_specs=(P(), P()), out_specs=P(), policy=BAD_POLICY)
    with pytest.raises(JaxOptionError):
        tc.shard_map(f, in_specs=(P(), P()), out_specs=P(), policy="alias")
