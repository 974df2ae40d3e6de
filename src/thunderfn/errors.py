"""The errors thunderfn raises. Each is also a subclass of the builtin a torch user
would catch for the same failure, so `except TypeError` keeps working."""


class ThunderFnError(Exception):
    """Base class of every error thunderfn raises on its own account."""


class ConcretizationError(ThunderFnError, TypeError):
    """A traced value was needed as a concrete Python value (``bool(t)``, ``t.item()``,
    an ``if`` on a tensor). Shapes are concrete while tracing; tensor values are not."""


class BatchedValueError(ConcretizationError, RuntimeError):
    """A tensor's value was asked inside a function tf.vmap traces (``.item()``, an ``if`` on a tensor): the
    ConcretizationError, and the RuntimeError torch.func's vmap raises, with its sentence."""


class SignatureMismatchError(ThunderFnError, TypeError):
    """A function compiled ahead of time (tf.jit(f).lower(...).compile()) was called with another signature
    than the one it was lowered for (JAX's TypeError for the same mistake)."""


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


# -- bad input: one kind, with the builtin a torch (or Python) user would catch for the same mistake ---
class InvalidArgumentError(ThunderFnError):
    """thunderfn's own checks refused an argument: an option of a transform or of jit (argnums,
    in_axes, executors, ...), a registration, a tangent or cotangent, or an operand of a torch
    operation while tracing (a shape, dtype or dimension; the message then mirrors torch's).
    Catch this to catch them all; each is raised as one of the classes below, which adds the
    builtin a PyTorch user would catch for the same mistake."""


class ArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of the wrong type (or a call with the wrong arguments), as Python's TypeError."""


class ArgumentValueError(InvalidArgumentError, ValueError):
    """An argument of the right type and a wrong value, as Python's ValueError."""


class ArgumentIndexError(InvalidArgumentError, IndexError):
    """A dimension or index out of range, as torch's IndexError."""


class ArgumentRuntimeError(InvalidArgumentError, RuntimeError):
    """Operands torch refuses with a RuntimeError (sizes that do not broadcast, a cotangent whose
    shape is not its output's), with torch's wording where torch has one."""


class ArgumentNotImplementedError(InvalidArgumentError, NotImplementedError):
    """A dtype torch does not implement the operation for ('"sin" not implemented for 'Long'')."""


_INVALID_ARGUMENT = {TypeError: ArgumentTypeError, ValueError: ArgumentValueError, IndexError: ArgumentIndexError,
                     RuntimeError: ArgumentRuntimeError, NotImplementedError: ArgumentNotImplementedError}


def invalid_argument(builtin: type) -> type:
    """The InvalidArgumentError class that is also `builtin` (a meta function raises the builtin
    torch raises for the same operands: prims.check). A class that is a ThunderFnError already is itself."""
    if issubclass(builtin, ThunderFnError):
        return builtin
    if builtin not in _INVALID_ARGUMENT:  # a rarer builtin torch raises (ZeroDivisionError, AssertionError)
        _INVALID_ARGUMENT[builtin] = type(f"Argument{builtin.__name__}", (InvalidArgumentError, builtin),
                                          {"__module__": __name__,
                                           "__doc__": f"An InvalidArgumentError that is a {builtin.__name__}."})
    return _INVALID_ARGUMENT[builtin]


class OutputError(ThunderFnError, RuntimeError):
    """A transformed function returned what its transform cannot use: a non-scalar output under
    grad, a single value with has_aux=True (it must return (output, aux)). RuntimeError, as
    torch.func raises for the same."""


class ExecutorError(ThunderFnError, RuntimeError):
    """No executor can run a symbol, a requested executor cannot run on this machine, or an
    executor's checker or lowering failed. The message names the executor and the symbol."""


class NoTraceError(ThunderFnError, RuntimeError):
    """tf.last_traces / tf.last_backward_traces asked for traces a function does not have (it
    was not called yet, or its last compile has no backward)."""


class ProxyOutsideTraceError(EscapedProxyError, RuntimeError):
    """A traced tensor (a proxy) was used after its trace was built: kept in a global, a closure
    or an attribute while tracing and used later. Only real tensors live outside a trace."""


class InternalError(ThunderFnError, RuntimeError):
    """A check of thunderfn's own consistency failed: a bug in thunderfn, never a wrong answer.
    Please report it with the message."""


class UserGradientError(ThunderFnError, RuntimeError):
    """A user-defined gradient (a torch.autograd.Function, a torch.library custom op with
    register_autograd) cannot be used as asked: differentiated twice through @once_differentiable,
    forward mode without a jvp staticmethod, an input modified in place in its forward, a backward
    that returns the wrong number or shape of gradients. The message names it and says what to do."""


class TransformArgumentError(InvalidArgumentError, RuntimeError, TypeError):
    """A transform was called with arguments it cannot differentiate as asked: argnums naming a
    positional argument the call does not have (argnums=-3 for two arguments), empty, repeated or
    not ints; an integer tensor differentiated, a complex input to jacrev/jacfwd/hessian; jvp's
    primals not a tuple, or tangents of another structure. RuntimeError as torch.func raises
    each, TypeError as a bad call is."""


class TransformInputError(InvalidArgumentError, ValueError, TypeError):
    """A transform was handed, where it takes tensors, what it cannot take as one: a string or a
    Python int to differentiate (torch.func's "Thing passed to transform API must be Tensor"), an
    integer tensor as a primal of forward mode, a chunk_size that is not an int. ValueError, as
    torch.func raises each; TypeError, as JAX raises for an input it cannot differentiate."""


class SavedTensorModifiedError(ThunderFnError, RuntimeError):
    """A value a backward needs (an input, an output, a captured tensor) was modified in place
    after the forward saved it (after tf.vjp ran; before loss.backward() of a jitted function), so
    the gradient would be taken at a point the forward never saw; torch.autograd's version check
    raises for the same reason."""


class ForwardModeError(ThunderFnError, TypeError):
    """Forward mode (tf.jvp, tf.jacfwd, tf.hessian) reached a tf.custom_vjp function, whose
    rule is a reverse-mode rule only; JAX raises a TypeError too. Use tf.custom_jvp (which
    both modes use) for a function that forward mode must see through its own rule."""


class CotangentError(InvalidArgumentError, RuntimeError, TypeError):
    """A vjp_fn was given cotangents that do not match the function's output: another structure,
    or a leaf of another shape. RuntimeError as torch.autograd's shape check, TypeError as a
    structure mismatch was before."""
