"""``treeclone.grad`` and ``treeclone.value_and_grad``: the grad transformation, all of it.

The map:

- ``gradients.py``: :func:`grad` and :func:`value_and_grad`, their wrapper and the runner the
  JAX transformation differentiates (the face);
- ``wrt.py``: what ``wrt=`` differentiates (equinox's ``"arrays"``, an nnx filter or a
  predicate), the leaves kept out of the computation and the gradient in each library's form.

The lift (``treeclone._lift``) is what grad shares with every other transformation; nothing here
is used by another transformation.
"""

from treeclone.grad.gradients import grad, value_and_grad

__all__ = ["grad", "value_and_grad"]
