"""The errors thunderfn raises. Each is also a subclass of the builtin a torch user
would catch for the same failure, so `except TypeError` keeps working."""


class ThunderFnError(Exception):
    """Base class of every error thunderfn raises on its own account."""


class ConcretizationError(ThunderFnError, TypeError):
    """A traced value was needed as a concrete Python value (``bool(t)``, ``t.item()``,
    an ``if`` on a tensor). Shapes are concrete while tracing; tensor values are not."""


class UnsupportedOpError(ThunderFnError, NotImplementedError):
    """A torch function has no thunderfn symbol and cannot fall back."""


class BatchingError(ThunderFnError, RuntimeError):
    """vmap cannot batch an operation (no batching rule, no decomposition, no torch function to
    batch with torch.func.vmap), or the batched program would differ from the per-example one
    (a random op under randomness="error", an in-place write of batched values into an
    unbatched tensor). The message names the operation and what to do."""


class EscapedProxyError(ThunderFnError, TypeError):
    """A traced tensor would leave the trace inside an object thunderfn cannot look into
    (an output container that is not a registered pytree). The caller would receive a
    placeholder instead of a tensor; the message names the type and how to register it."""


class DistributedError(ThunderFnError, RuntimeError):
    """A distributed setup thunderfn cannot train with: no process group, ranks whose
    models differ. The message says what to fix."""


class UserGradientError(ThunderFnError, RuntimeError):
    """A user-defined gradient (a torch.autograd.Function, a torch.library custom op with
    register_autograd) cannot be used as asked: differentiated twice through @once_differentiable,
    forward mode without a jvp staticmethod, an input modified in place in its forward, a backward
    that returns the wrong number or shape of gradients. The message names it and says what to do."""


class TransformArgumentError(ThunderFnError, RuntimeError, TypeError):
    """A transform was called with arguments it cannot differentiate as asked: argnums naming a
    positional argument the call does not have (argnums=-3 for two arguments), a complex input
    to jacrev/jacfwd/hessian. RuntimeError as torch.func raises both, TypeError as a bad call is."""


class SavedTensorModifiedError(ThunderFnError, RuntimeError):
    """A value a vjp_fn needs (an input, an output, a captured tensor) was modified in place
    after tf.vjp ran, so the pullback would differentiate at a point the forward never saw;
    torch.autograd's version check raises for the same reason."""


class ForwardModeError(ThunderFnError, TypeError):
    """Forward mode (tf.jvp, tf.jacfwd, tf.hessian) reached a tf.custom_vjp function, whose
    rule is a reverse-mode rule only; JAX raises a TypeError too. Use tf.custom_jvp (which
    both modes use) for a function that forward mode must see through its own rule."""


class CotangentError(ThunderFnError, RuntimeError, TypeError):
    """A vjp_fn was given cotangents that do not match the function's output: another structure,
    or a leaf of another shape. RuntimeError as torch.autograd's shape check, TypeError as a
    structure mismatch was before."""
