"""The core layer: what every other layer builds on. Traces and their printing
(trace.py, printing.py, statements.py, passes.py), proxies (proxies.py), symbols and
bound symbols (symbol.py), pytrees (pytree.py), how torch calls are intercepted while
tracing (interception.py), what a compiled function checks when called (call_time.py,
guards.py), the lowering rule types (lowering.py), dtypes and the tracing context.

May import: only core itself (and errors.py). Upper layers hand down what core calls at
run time through the hooks named in docs/architecture.md.
"""
