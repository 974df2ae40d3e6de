"""The errors thunderfn raises. Each is also a subclass of the builtin a torch user
would catch for the same failure, so `except TypeError` keeps working."""


class ThunderFnError(Exception):
    """Base class of every error thunderfn raises on its own account."""


class ConcretizationError(ThunderFnError, TypeError):
    """A traced value was needed as a concrete Python value (``bool(t)``, ``t.item()``,
    an ``if`` on a tensor). Shapes are concrete while tracing; tensor values are not."""


class UnsupportedOpError(ThunderFnError, NotImplementedError):
    """A torch function has no thunderfn symbol and cannot fall back."""
